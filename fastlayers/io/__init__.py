"""Model file readers: ``load`` picks one by the file's content (then its suffix).

Every reader checks a file before it allocates or runs anything from it (``fastlayers.limits``: sizes,
nesting, zip members, config ranges) and answers a malformed or hostile file with a
``ModelFileError`` or ``UnsupportedError`` naming it.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import FastlayersError, ModelFileError
from ..settings import LoadOptions

_TORCH_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".pkl"}
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
__all__ = ["load", "load_state_dict", "register_keras_layer", "register_torch_module"]


def __getattr__(name):
    if name == "load_state_dict":  # imported at first use, as each reader is
        from .torch import load_state_dict

        return load_state_dict
    if name == "register_torch_module":
        from .torch import register_torch_module

        return register_torch_module
    if name == "register_keras_layer":
        from .keras import register_keras_layer

        return register_keras_layer
    raise AttributeError(f"module 'fastlayers.io' has no attribute {name!r}")


def load(path, warm_up: bool | None = None, options: LoadOptions | None = None):
    """Load a model file and return a ready model.

    Parameters
    ----------
    path : str, os.PathLike, bytes or binary file object
        A model written by ``Model.save`` (fastlayers native format), a Keras 3 ``.keras``
        archive (or its unzipped directory), or a full-model Keras ``.h5`` file: returns a
        ``fastlayers.Model``. Or a whole pickled ``torch.nn`` module (``torch.save(model)``,
        ``.pt``/``.pth``/``.bin``, zip or legacy) made of standard torch.nn classes: returns the
        ``fastlayers.nn`` equivalent, rebuilt without torch and without running code from the
        file. Files holding only weights (state dicts, safetensors) are refused with a pointer to
        ``fastlayers.load_state_dict``. Or an ONNX graph: returns an ``OnnxModel`` that runs on
        fastlayers primitives. The format is told from the content (the suffix only names
        the format a file that matches none claims to be). The file's bytes (``bytes``,
        ``bytearray``, ``memoryview``) or an open binary file (read from its current position to
        its end) are read as a file would be; a torch pickle given that way is written to a
        temporary file first.
    warm_up : bool, optional
        Run the model once on zeros of its declared input shapes before returning it
        (``Model.warm_up``, ``OnnxModel.warm_up``; batch 1), so that the first real call finds
        its weights packed and its threads started; by default ``options.warm_up`` (True).
        torch modules declare no input shape and are not warmed up, and neither is a model
        whose warm-up is out of proportion to its weights (``fastlayers.model.warmup.in_proportion``:
        its largest activation at batch 1, for ONNX its inputs, over both 65,536 elements and
        its weights' element count).
    options : fastlayers.LoadOptions, optional
        The limits the file is read within, whether to warm the model up, and the threads its
        calls use (``model.num_threads``); an ONNX model also keeps the limits its calls check.
        By default the process's (``fastlayers.settings``: environment variables).

    Raises
    ------
    ModelFileError
        The file is missing, truncated, corrupt, over a limit of ``fastlayers.limits``, or
        not a model.
    UnsupportedError
        The format or a layer in it is not supported (a custom torch class: export to ONNX).
    SettingError
        ``options`` is not a ``LoadOptions``.

    Examples
    --------
    >>> model = fastlayers.load("model.onnx", options=fastlayers.LoadOptions(threads=1))
    >>> (y,) = model.run(None, {"input": x})
    """
    with settings.applied(options) as options:
        model = _load(path)
        from ..native import trim_heap  # imported by the load already (not at fastlayers' import)

        trim_heap()  # what the import freed, before the warm-up packs weights beside it
        if options.threads is not None:
            model.num_threads = options.threads
        if hasattr(model, "native_plans"):  # a layer graph keeps the choice for its calls
            model.native_plans = options.native_plans
        if options.warm_up if warm_up is None else warm_up:
            if hasattr(model, "warm_up"):
                with np.errstate(all="ignore"):  # weights from a file may overflow on zeros
                    _warm_up(model, path)
    return model


def _warm_up(model, source) -> None:
    """``model.warm_up()``; for a fastlayers Model, a failure on zeros that is not a fastlayers
    error (a config its layers accepted but cannot run: numpy refusing to broadcast a Rescaling
    scale of the wrong length) is the file's: ModelFileError naming it. A fastlayers error
    (zeros the model refuses) only skips the warm-up, as before."""
    from ..model.warmup import warm_up

    if not _is_graph_model(model) or not model.built:
        model.warm_up()
        return
    from ..model.graph import warm_up_in_proportion

    if not warm_up_in_proportion(model):
        return
    failures = []

    def run(arrays):
        try:
            return model(arrays if len(arrays) > 1 else arrays[0])
        except FastlayersError:
            raise
        except Exception as e:  # recorded, then raised below
            failures.append(e)
            raise

    warm_up(run, model.input_specs())
    if failures:
        e = failures[0]
        where = _describe(source)
        raise ModelFileError(
            f"{where}: the model fails on zeros of its declared input shapes ({type(e).__name__}: {str(e)[:200]})"
        ) from e


def _is_graph_model(model) -> bool:
    """Whether ``model`` is a fastlayers ``Model`` (without importing the graph module, which
    an ONNX or torch load never needs: no Model exists unless it was imported)."""
    graph = sys.modules.get("fastlayers.model.graph")
    return graph is not None and isinstance(model, graph.Model)


class _Named(io.BytesIO):
    """In-memory file bytes that the readers name (``str()``) as ``description``."""

    def __init__(self, data, description: str):
        super().__init__(data)
        self.description = description

    def __str__(self) -> str:
        return self.description


def _describe(source) -> str:
    """How errors name a source: its path, ``<N bytes>``, or a file object's name."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source):,} bytes>"
    name = getattr(source, "name", None)
    return str(name) if isinstance(name, (str, os.PathLike)) else "<file object>"


def _load(source):
    from ..backends import get_ops

    get_ops()  # the active backend loads now (its kernels), not inside the model's first call
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _load_bytes(bytes(source), _describe(source))
    if not isinstance(source, (str, os.PathLike)) and hasattr(source, "read"):
        where = _describe(source)
        try:
            data = source.read()
        except (OSError, ValueError) as e:
            raise ModelFileError(f"{where}: cannot read the file object ({e})") from None
        if not isinstance(data, (bytes, bytearray)):
            raise ModelFileError(
                f"{where}: the file object gives {type(data).__name__}, not bytes: open the file in binary mode ('rb')"
            )
        return _load_bytes(bytes(data), where)
    if not isinstance(source, (str, os.PathLike)):
        raise ModelFileError(
            f"{source!r}: expected a path, the file's bytes or a binary file object, got {type(source).__name__}"
        )
    p = Path(source)
    if p.is_dir():
        if (p / "config.json").is_file():  # an unzipped .keras archive
            from .keras import load_keras

            return load_keras(p)
        raise ModelFileError(
            f"{source}: is a directory, not a model file (a directory is read "
            "only as an unzipped .keras archive: config.json and "
            "model.weights.h5)"
        )
    if not p.exists():
        raise ModelFileError(f"{source}: no such file")
    if not p.is_file():
        raise ModelFileError(f"{source}: not a regular file")
    try:
        with open(p, "rb") as f:
            head = f.read(64)
            kind = _sniff(head, f, str(source), p.stat().st_size)
    except OSError as e:
        raise ModelFileError(f"{source}: cannot read the file ({e.strerror or e})") from None
    return _dispatch(kind, p, p.suffix.lower(), str(source))


def _load_bytes(data: bytes, where: str):
    source = _Named(data, where)
    kind = _sniff(data[:64], source, where, len(data))
    suffix = Path(where).suffix.lower() if not where.startswith("<") else ""
    if kind == "torch" or (kind is None and suffix in _TORCH_SUFFIXES):
        with tempfile.TemporaryDirectory(prefix="fastlayers-") as tmp:
            path = Path(tmp) / f"model{suffix or '.pt'}"
            path.write_bytes(data)
            try:
                return _dispatch(kind, path, suffix, where)
            except FastlayersError as e:  # name the caller's source, not the temporary file
                raise type(e)(str(e).replace(str(path), where)) from None
    if kind == "onnx" or (kind is None and suffix == ".onnx"):
        from .onnx import from_bytes

        return from_bytes(bytearray(data), where)
    return _dispatch(kind, source, suffix, where)


def _sniff(head: bytes, f, where: str, size: int) -> str | None:
    """The format of a file from its first bytes (``head``) and, for zips, its member names:
    "native", "keras", "torch", "zip" (another zip), "hdf5", "safetensors", "onnx", or None."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        from ..limits import open_zip

        f.seek(0)
        with open_zip(f, where) as z:
            names = set(z.NameToInfo)
        f.seek(0)
        from .native import HEADER_KEY

        if f"{HEADER_KEY}.npy" in names:
            return "native"
        if "config.json" in names and "model.weights.h5" in names:
            return "keras"
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "torch"
        return "zip"
    if head[:8] == _HDF5_MAGIC:
        return "hdf5"
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if head[:2] == b"\x80\x02" and head[2:3] == b"\x8a":  # a legacy torch pickle's magic
        return "torch"
    if _looks_like_onnx(head):
        return "onnx"
    return None


#: Field keys (number << 3 | wire type) of onnx.ModelProto: ir_version (1, varint),
#: producer_name (2), producer_version (3), domain (4), model_version (5, varint), doc_string
#: (6), graph (7), opset_import (8), metadata_props (14), training_info (20), functions (25),
#: configuration (26).
_ONNX_KEYS = {0x08, 0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA, 0xD2}


def _looks_like_onnx(head: bytes) -> bool:
    """An ONNX ModelProto as every exporter writes it: ir_version (field 1, a varint from 1 to
    32) first, then another ModelProto field."""
    if len(head) < 4 or head[0] != 0x08 or not 1 <= head[1] <= 32:
        return False
    return head[2] in _ONNX_KEYS


def _dispatch(kind, source, suffix: str, where: str):
    """Read ``source`` (a path, or a ``_Named`` buffer) as the format ``kind`` (``_sniff``),
    falling back on the suffix for content that matches no format."""
    if kind == "native":
        from .native import load_native

        return load_native(source)
    if kind == "keras" or (kind in ("zip", None) and suffix == ".keras"):
        from .keras import load_keras

        return load_keras(source)
    if kind == "hdf5" or (kind is None and suffix in (".h5", ".hdf5")):
        from .keras import load_keras_h5

        return load_keras_h5(source)
    if kind == "onnx" or (kind is None and suffix == ".onnx"):
        from .onnx import load_onnx

        return load_onnx(source)
    if kind == "safetensors" or (kind is None and suffix == ".safetensors"):
        raise ModelFileError(
            f"{where}: a safetensors file holds weights only, not a model: build "
            "the model with fastlayers.nn and load the weights with "
            "model.load_state_dict(fastlayers.load_state_dict(path))"
        )
    if kind == "torch" or (kind in ("zip", None) and suffix in _TORCH_SUFFIXES):
        from .torch import load_torch_module

        return load_torch_module(source)
    if kind == "zip":
        raise ModelFileError(
            f"{where}: a zip archive that is not a model file (no fastlayers "
            "header, Keras config.json and model.weights.h5, or torch data.pkl)"
        )
    raise ModelFileError(
        f"{where}: not a fastlayers model file (unknown format: not a fastlayers, Keras, ONNX or PyTorch file)"
    )
