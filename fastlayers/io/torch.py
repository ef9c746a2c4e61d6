"""PyTorch files without torch: state dicts (``load_state_dict``) and whole ``nn.Sequential``
pickles (``load_torch_module``, used by ``fastlayers.load``).

Formats read (layouts in docs/formats.md):

- ``torch.save`` zip archives (the default since torch 1.6): ``<prefix>/data.pkl`` (the pickle),
  ``<prefix>/data/<key>`` (one raw little-endian storage per key), ``<prefix>/byteorder``;
  any record prefix. ``pytorch_model.bin`` files are the same archives (or legacy pickles).
- legacy pickles (``_use_new_zipfile_serialization=False``): five concatenated pickles/blobs:
  magic number, protocol version, sys info, the object, the storage keys, then per storage an
  int64 element count and the raw elements.
- ``.safetensors`` files go through ``fastlayers.io.safetensors``.

Pickles are read by ``_torch_pickle.RestrictedUnpickler``: nothing from the file is imported or
run, and torch is never imported.
"""

from __future__ import annotations

import contextvars
import io
import math
import os
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import (
    FastlayersError,
    InputError,
    ModelFileError,
    ShapeError,
    StateDictError,
    UnsupportedError,
)
from ._torch_pickle import (
    RestrictedUnpickler,
    StorageType,
    TorchFunctionRef,
    TorchModuleRecord,
    UnknownGlobal,
    brepr,
    check_module_tree,
    is_module_like,
)

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
#: A sharded checkpoint's index (``*.index.json``) may take at most ``torch_max_index_bytes``
#: and name at most ``torch_max_shards`` shards (``settings.current()``); its shards are torch or
#: safetensors files, never other indexes.
#: Modules rebuilt from a pickle: strides, dilations, pooling windows, adaptive and resize output
#: sizes at most ``torch_max_geometry`` (``_geometry()``), resize scale factors at most
#: MAX_SCALE; a convolution's padding at most its dilated kernel (dilation x kernel_size), a
#: transposed convolution's stride too. Every size that a module's tensors have must be
#: theirs (``_VALIDATORS``), so that a module allocates no more than the file holds.
MAX_SCALE = 64.0


def _geometry() -> int:
    """The largest size a pickled module's geometry may hold (``torch_max_geometry``)."""
    return settings.current().torch_max_geometry


_ONNX_HINT = ("export the model to ONNX (torch.onnx.export) and load that, or port the class to "
              "fastlayers.nn (change the imports) and load its weights with "
              "fastlayers.load_state_dict")


# ------------------------------------------------------------------------------------ reading
def is_torch_file(path) -> bool:
    """Whether ``path`` looks like a torch.save file (zip with a data.pkl, or legacy pickle)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        if head[:2] == b"PK":
            with zipfile.ZipFile(path) as zf:
                return any(n == "data.pkl" or n.endswith("/data.pkl") for n in zf.namelist())
        return head[:2] == b"\x80\x02" and head[2:3] == b"\x8a"  # protocol 2 + LONG1 magic
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def read_torch_pickle(path, unknown_globals: str = "refuse"):
    """The object a torch.save file holds, with tensors as numpy arrays and modules as
    ``TorchModuleRecord`` trees. Raises ``ModelFileError`` for anything unreadable or refused."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{where}: cannot read ({e})") from e
    try:
        if head[:2] == b"PK":
            return _read_zip(path, where, unknown_globals)
        return _read_legacy(path, where, unknown_globals)
    except FastlayersError as e:
        msg = str(e)
        raise type(e)(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except MemoryError as e:
        raise ModelFileError(f"{where}: corrupt file (implausible sizes)") from e
    except RecursionError as e:
        raise ModelFileError(f"{where}: pickle nests too deeply") from e
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise ModelFileError(f"{where}: truncated or corrupt file ({type(e).__name__}: {e})") from e
    except Exception as e:  # the pickle machine's own errors on malformed input
        raise ModelFileError(f"{where}: corrupt pickle ({type(e).__name__}: {e})") from e


def _read_zip(path, where: str, unknown_globals: str):
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        pkls = sorted((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")),
                      key=lambda n: (n.count("/"), n))
        if not pkls:
            raise ModelFileError(f"{where}: a zip archive without data.pkl is not a torch.save file")
        prefix = pkls[0][: -len("data.pkl")]
        if f"{prefix}constants.pkl" in names or any(n.startswith(f"{prefix}code/") for n in names):
            raise UnsupportedError(f"{where}: a TorchScript archive (torch.jit.save) holds code, which "
                                   f"fastlayers does not run; {_ONNX_HINT}")
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            byteorder = zf.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise ModelFileError(f"{where}: unknown byteorder {byteorder!r}")

        def load_storage(storage_type: type[StorageType], key: str, numel: int) -> np.ndarray:
            name = f"{prefix}data/{key}"
            try:
                info = zf.getinfo(name)
            except KeyError:
                raise ModelFileError(f"{where}: storage {name!r} is missing from the archive") from None
            dtype = storage_type.np_dtype
            nbytes = numel * dtype.itemsize
            if info.file_size < nbytes:
                raise ModelFileError(f"{where}: storage {name!r} holds {info.file_size} bytes, the "
                                     f"pickle expects {numel} x {dtype.itemsize}")
            return _typed(_read_entry(zf, info, where)[:nbytes], dtype, byteorder)

        _check_entry_size(zf, zf.getinfo(pkls[0]), where)
        data = zf.read(pkls[0])
        return RestrictedUnpickler(io.BytesIO(data), where, load_storage, unknown_globals).load()


def _archive_size(zf: zipfile.ZipFile):
    """The bytes of the file behind ``zf`` (None where it has no file descriptor)."""
    size = getattr(zf, "_fastlayers_size", False)
    if size is False:
        try:
            size = os.fstat(zf.fp.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            size = None
        zf._fastlayers_size = size
    return size


def _check_entry_size(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> None:
    """Refuse a zip entry whose size its compressed bytes in this archive cannot hold."""
    archive = _archive_size(zf)
    stored = info.compress_type == zipfile.ZIP_STORED
    if (archive is not None and info.compress_size > archive) or (
            stored and info.file_size != info.compress_size) or (
            not stored and info.file_size > 1032 * info.compress_size + 64):
        raise ModelFileError(f"{where}: zip entry {brepr(info.filename)} claims {info.file_size} bytes "
                             f"({info.compress_size} compressed) in an archive of {archive} bytes")


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    """A zip entry's bytes in a fresh numpy buffer, CRC checked.

    torch stores entries uncompressed: those are read straight from the file into the buffer,
    skipping ``ZipFile.open``'s intermediate bytes (see docs/design.md for the measurement);
    compressed entries (a re-packed archive) go through ``ZipFile.open``. The size an entry
    claims is checked against the archive before anything is allocated: a stored entry holds its
    bytes in the archive, a deflated one at most 1032 bytes per compressed byte (deflate's limit).
    """
    _check_entry_size(zf, info, where)
    buf = np.empty(info.file_size, np.uint8)
    if info.compress_type == zipfile.ZIP_STORED:
        f = zf.fp
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise ModelFileError(f"{where}: corrupt zip entry {info.filename!r} (bad local header)")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        got = f.readinto(buf)
        if got != info.file_size:
            raise ModelFileError(f"{where}: zip entry {info.filename!r} is truncated")
        if zlib.crc32(buf) != info.CRC:
            raise ModelFileError(f"{where}: zip entry {info.filename!r} is corrupt (CRC mismatch)")
        return buf
    with zf.open(info) as fh:
        got = fh.readinto(buf)
        fh.read(1)  # reach EOF so the CRC is checked
    if got != info.file_size:
        raise ModelFileError(f"{where}: zip entry {info.filename!r} is truncated")
    return buf


def _typed(raw: np.ndarray, dtype: np.dtype, byteorder: str) -> np.ndarray:
    if byteorder == "big" and dtype.itemsize > 1:
        return raw.view(dtype.newbyteorder(">")).astype(dtype)
    return raw.view(dtype)


def _read_legacy(path, where: str, unknown_globals: str):
    with open(path, "rb") as f:
        def plain():
            return RestrictedUnpickler(f, where).load()

        magic = plain()
        if magic != LEGACY_MAGIC:
            raise ModelFileError(f"{where}: not a PyTorch file (no zip archive, no legacy magic "
                                 "number); tar archives from torch < 0.4 are not supported")
        plain()  # protocol version
        sys_info = plain()
        little = not (isinstance(sys_info, dict) and sys_info.get("little_endian") is False)
        # The storages' bytes follow the object's pickle, and their element sizes are only known
        # from it: a first pass unpickles against zero-stride stand-in storages (no memory) to
        # learn each key's type and size, then the data is read and the object unpickled again.
        start = f.tell()
        file_size = os.fstat(f.fileno()).st_size
        layout: dict[str, tuple[type[StorageType], int]] = {}

        def probe_storage(storage_type, key, numel):
            if numel * storage_type.np_dtype.itemsize > file_size:
                raise ModelFileError(f"{where}: storage {brepr(key)} claims {numel} elements, more "
                                     f"than the file's {file_size} bytes hold")
            layout[key] = (storage_type, numel)
            return np.lib.stride_tricks.as_strided(np.zeros(1, storage_type.np_dtype),
                                                   shape=(numel,), strides=(0,), writeable=False)

        RestrictedUnpickler(f, where, probe_storage, unknown_globals).load()
        keys = plain()
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ModelFileError(f"{where}: malformed storage key list")
        arrays: dict[str, np.ndarray] = {}
        for key in keys:
            if key not in layout:
                raise ModelFileError(f"{where}: storage {key!r} is listed but never used")
            storage_type, numel = layout[key]
            count = np.frombuffer(_read_exact(f, 8, where), "<i8" if little else ">i8")[0]
            if count != numel:
                raise ModelFileError(f"{where}: storage {key!r} holds {count} elements, the pickle "
                                     f"expects {numel}")
            raw = np.empty(numel * storage_type.np_dtype.itemsize, np.uint8)
            if f.readinto(raw) != raw.size:
                raise ModelFileError(f"{where}: truncated file (storage {key!r} ends early)")
            arrays[key] = _typed(raw, storage_type.np_dtype, "little" if little else "big")
        missing = sorted(set(layout) - set(arrays))
        if missing:
            raise ModelFileError(f"{where}: storage(s) {missing} have no data")

        def load_storage(storage_type, key, numel):
            return arrays[key]

        f.seek(start)
        return RestrictedUnpickler(f, where, load_storage, unknown_globals).load()


def _read_exact(f, n: int, where: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ModelFileError(f"{where}: truncated file (storage data ends early)")
    return data


# ------------------------------------------------------------------------------ state dicts
def _as_state_dict(obj, where: str) -> OrderedDict[str, np.ndarray]:
    if is_module_like(obj):
        if isinstance(obj, UnknownGlobal):
            raise UnsupportedError(f"{where}: holds an instance of {obj.global_name}")
        try:
            obj = obj.state_dict()
        except ModelFileError as e:
            raise ModelFileError(f"{where}: {e}") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{where}: holds a {type(obj).__name__}, not a state dict")
    out: OrderedDict = OrderedDict()
    bad = []
    for k, v in obj.items():
        if isinstance(k, str) and isinstance(v, np.ndarray):
            out[k] = v
        else:
            bad.append(k)
    if bad:
        nested = [k for k in bad if isinstance(obj[k], dict)
                  and any(isinstance(v, np.ndarray) for v in obj[k].values())]
        hint = (f"; the tensors are under the key(s) {brepr(nested)}: pass key={brepr(nested[0])}"
                if nested else "")
        raise ModelFileError(f"{where}: not a state dict: entries {brepr(bad[:5])} are not tensors{hint}")
    return out


def load_state_dict(path, key: str | None = None,
                    options: settings.LoadOptions | None = None) -> OrderedDict[str, np.ndarray]:
    """Read the tensors of a PyTorch or safetensors file as numpy arrays, without torch.

    Parameters
    ----------
    path : str or os.PathLike
        A ``torch.save`` file (zip archive or legacy pickle, e.g. ``model.pt``,
        ``pytorch_model.bin``) holding a state dict or a whole ``torch.nn`` module, a
        ``.safetensors`` file (needs the ``safetensors`` package: ``fastlayers[safetensors]``), or
        a sharded checkpoint's ``*.index.json`` (its shards are read from the same folder).
    key : str, optional
        For checkpoints that nest the state dict, e.g. ``{"model": state_dict, "epoch": 3}``:
        the entry to return.
    options : fastlayers.LoadOptions, optional
        The limits the file is read within (its ``max_*`` and ``torch_*`` fields); by default
        the process's (``fastlayers.settings``).

    Returns
    -------
    OrderedDict[str, numpy.ndarray]
        Keys as torch names them. dtypes are kept (float32, float16, float64, int64, bool, ...),
        except bfloat16, widened exactly to float32. A whole pickled module gives its
        ``state_dict()``. Contiguous views of one storage share memory, as in torch.

    Raises
    ------
    ModelFileError
        Missing, truncated or corrupt file; a pickle that references any global outside the
        admitted table (docs/formats.md), which is refused before anything runs.
    UnsupportedError
        TorchScript archives; safetensors without the package.

    Shape
    -----
    Each array has the tensor's shape (size), C-contiguous.
    """
    with settings.applied(options):
        return _load_state_dict(path, key)


def _load_state_dict(path, key):
    p = Path(path)
    where = str(path)
    if not p.is_file():
        raise ModelFileError(f"{where}: no such file")
    from .safetensors import is_safetensors, load_safetensors

    if p.name.lower().endswith(".index.json"):
        if key is not None:
            raise InputError(f"{where}: a sharded checkpoint index is flat; key={key!r} does not apply")
        return _load_sharded(p, where)
    if p.suffix.lower() == ".safetensors" or is_safetensors(p):
        sd = load_safetensors(p)
        if key is not None:
            raise InputError(f"{where}: a safetensors file is flat; key={key!r} does not apply")
        return sd
    obj = read_torch_pickle(p)
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise ModelFileError(f"{where}: has no entry {brepr(key)}"
                                 + (f" (entries: {brepr(list(obj)[:10])})" if isinstance(obj, dict) else ""))
        obj = obj[key]
    return _as_state_dict(obj, where)


def _load_sharded(p: Path, where: str) -> OrderedDict[str, np.ndarray]:
    """A Hugging Face sharded checkpoint: ``{"weight_map": {tensor name: shard file}}`` beside
    its shards (``pytorch_model.bin.index.json``, ``model.safetensors.index.json``)."""
    import json

    try:
        size, limit = p.stat().st_size, settings.current().torch_max_index_bytes
        if size > limit:
            raise ValueError(f"{size} bytes, over the limit of {limit} "
                             "(FASTLAYERS_TORCH_MAX_INDEX_BYTES)")
        index = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(index, dict):
            raise TypeError(f"the index is a JSON {type(index).__name__}, not an object")
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("weight_map must map tensor names to shard file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError,
            MemoryError) as e:
        raise ModelFileError(f"{where}: not a sharded checkpoint index ({type(e).__name__}: "
                             f"{str(e)[:200]})") from None
    names = list(dict.fromkeys(weight_map.values()))
    limit = settings.current().torch_max_shards
    if len(names) > limit:
        raise ModelFileError(f"{where}: names {len(names)} shards, over the limit of {limit} "
                             "(FASTLAYERS_TORCH_MAX_SHARDS)")
    for shard in names:
        if Path(shard).name != shard or shard.startswith("."):
            raise ModelFileError(f"{where}: shard {brepr(shard)} must be a file name beside the index")
        if shard.lower().endswith(".json"):
            raise ModelFileError(f"{where}: shard {brepr(shard)} is an index (a .json file): shards are "
                                 "torch or safetensors files, and an index never names another")
    shards: dict[str, OrderedDict] = {}
    for shard in names:
        try:
            shards[shard] = load_state_dict(p.parent / shard)
        except FastlayersError as e:
            raise type(e)(f"{where}: shard {brepr(shard)}: {e}") from None
    out: OrderedDict = OrderedDict()
    for name, shard in weight_map.items():
        if name not in shards[shard]:
            raise ModelFileError(f"{where}: tensor {brepr(name)} is not in its shard {brepr(shard)}")
        out[name] = shards[shard][name]
    return out


# ------------------------------------------------------------------------ whole modules
#: torch.nn class name -> builder(record) -> an unloaded fastlayers.nn module.
#: A builder only passes constructor arguments, read from the pickled attributes
#: (``record["in_features"]``, ``record.get("eps", 1e-5)``, ``record.has_param("bias")``);
#: containers also get their rebuilt children (``record`` is a ``TorchModuleRecord``).
#: The weights are loaded afterwards, strictly, from the record tree's state dict, so a builder
#: that makes the wrong structure fails with the missing/unexpected keys.
#: Adding a family is one entry, e.g. ``"Conv2d": from_attrs("Conv2d", "in_channels", ...,
#: bias=has_param("bias"))``; see ``register_torch_module``.
TORCH_MODULE_BUILDERS: dict[str, Callable] = {}


def register_torch_module(torch_name: str, builder: Callable) -> None:
    """Map the torch.nn class ``torch_name`` (e.g. ``"Conv2d"``) to ``builder(record)``."""
    TORCH_MODULE_BUILDERS[torch_name] = builder


def has_param(name: str) -> Callable:
    """Attribute getter for ``from_attrs``: whether the parameter ``name`` is present (not None)."""
    return lambda r: r.has_param(name)


class from_attrs:  # used like a function in the table
    """A builder calling ``fastlayers.nn.<cls_name>(**kwargs(record))``.

    Each name in ``names`` is a constructor keyword equal to the torch attribute of that name;
    attributes missing from an old pickle are left to the constructor's default. ``computed``
    maps keywords to functions of the record (``bias=has_param("bias")``). The class is looked up
    when a file is read, so an entry may name a module another part of fastlayers adds. The
    keywords are torch's own constructor arguments: ``kwargs(record)`` rebuilds the torch module
    too (``torch.nn.<cls_name>(**kwargs)``), which is how the tests check each entry.
    """

    def __init__(self, cls_name: str, *names: str, **computed: Callable):
        self.cls_name, self.names, self.computed = cls_name, names, computed

    def kwargs(self, r: TorchModuleRecord) -> dict:
        kwargs = {n: _plain(r, n, r[n]) for n in self.names if n in r.attrs}
        kwargs.update({k: f(r) for k, f in self.computed.items()})
        return kwargs

    def __call__(self, r: TorchModuleRecord):
        from .. import nn

        cls = getattr(nn, self.cls_name, None)
        if cls is None:
            raise UnsupportedError(f"torch.nn.{r.class_name}: fastlayers.nn has no {self.cls_name} yet")
        return cls(**self.kwargs(r))

    def __repr__(self):
        return f"from_attrs({self.cls_name!r}, {', '.join(map(repr, self.names))})"


def _plain(r: TorchModuleRecord, name: str, value):
    """``value`` when it is what a constructor argument may be: None, a bool, number or short
    string, or a tuple or list of at most 8 of those; else ``ModelFileError``."""
    scalar = (type(None), bool, int, float, str)
    ok = isinstance(value, scalar) or (isinstance(value, (tuple, list)) and len(value) <= 8
                                        and all(isinstance(v, scalar) for v in value))
    if ok and isinstance(value, str) and len(value) > 64:
        ok = False
    if not ok:
        path = getattr(r, "_path", "")
        raise ModelFileError(f"module {brepr(path) if path else '<root>'} ({r.torch_class}): "
                             f"attribute {brepr(name)} is {brepr(value)}, not a constructor argument")
    return value


def _children(r: TorchModuleRecord) -> OrderedDict:
    return OrderedDict((name, rebuild_module(child, f"{r._path}.{name}" if r._path else name))
                       for name, child in r.children.items())


def _sequential(r):
    from .. import nn

    return nn.Sequential(_children(r))


def _module_list(r):
    from .. import nn

    m = nn.ModuleList()
    for name, child in _children(r).items():
        m.add_module(name, child)
    return m


def _module_dict(r):
    from .. import nn

    return nn.ModuleDict(_children(r))


def _simple(cls_name: str, *names: str, **computed):
    register_torch_module(cls_name, from_attrs(cls_name, *names, **computed))


register_torch_module("Sequential", _sequential)
register_torch_module("ModuleList", _module_list)
register_torch_module("ModuleDict", _module_dict)
_simple("Identity")
_simple("Linear", "in_features", "out_features", bias=has_param("bias"))
register_torch_module("NonDynamicallyQuantizableLinear",  # MultiheadAttention.out_proj's class
                      from_attrs("Linear", "in_features", "out_features", bias=has_param("bias")))
for _name in ("ReLU", "ReLU6", "SELU", "Sigmoid", "Hardsigmoid", "Tanh", "Softsign", "SiLU"):
    _simple(_name)
_simple("LeakyReLU", "negative_slope")
_simple("ELU", "alpha")
_simple("GELU", "approximate")
_simple("Softplus", "beta", "threshold")
_simple("Softmax", "dim")
_simple("LogSoftmax", "dim")
_simple("Flatten", "start_dim", "end_dim")
for _name in ("Dropout", "Dropout1d", "Dropout2d"):
    _simple(_name, "p")
_simple("LayerNorm", "normalized_shape", "eps", "elementwise_affine",
        bias=lambda r: r.has_param("bias") or not r.get("elementwise_affine", True))
for _name in ("BatchNorm1d", "BatchNorm2d"):
    _simple(_name, "num_features", "eps", "momentum", "affine", "track_running_stats")
_simple("Embedding", "num_embeddings", "embedding_dim", "padding_idx", "max_norm")

# The families other modules of fastlayers.nn provide (conv/pool, recurrent, attention). The
# classes are resolved when a file is read; until fastlayers.nn has one, reading it raises
# UnsupportedError naming it. The keywords are torch's constructor arguments, which torch stores
# as attributes of the same name.
_CONV = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
         "padding_mode")
for _name in ("Conv1d", "Conv2d"):
    _simple(_name, *_CONV, bias=has_param("bias"))
_simple("ConvTranspose2d", *_CONV, "output_padding", bias=has_param("bias"))
for _name in ("MaxPool1d", "MaxPool2d"):
    _simple(_name, "kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
_simple("AvgPool1d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
_simple("AvgPool2d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
        "divisor_override")
for _name in ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d"):
    _simple(_name, "output_size")
for _name in ("AdaptiveMaxPool1d", "AdaptiveMaxPool2d"):
    _simple(_name, "output_size", "return_indices")
_simple("Upsample", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor")
_RNN = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
_simple("RNN", *_RNN, "nonlinearity")
_simple("LSTM", *_RNN, "proj_size")
_simple("GRU", *_RNN)
_simple("RNNCell", "input_size", "hidden_size", "bias", "nonlinearity")
_simple("LSTMCell", "input_size", "hidden_size", "bias")
_simple("GRUCell", "input_size", "hidden_size", "bias")
_simple("MultiheadAttention", "embed_dim", "num_heads", "dropout", "add_zero_attn", "kdim", "vdim",
        "batch_first", bias=has_param("in_proj_bias"), add_bias_kv=has_param("bias_k"))


def _activation_name(r: TorchModuleRecord) -> str:
    """TransformerEncoderLayer's activation: a function reference or a module, as a name."""
    act = r.get("activation", r.children.get("activation"))
    if isinstance(act, type) and issubclass(act, TorchFunctionRef):  # the function itself
        name = act.function_name
    elif isinstance(act, TorchModuleRecord):
        name = act.class_name.lower()
    else:
        what = getattr(act, "global_name", type(act).__name__)
        raise UnsupportedError(f"torch.nn.{r.class_name}: activation {what} is not relu or gelu")
    if name not in ("relu", "gelu"):
        raise UnsupportedError(f"torch.nn.{r.class_name}: activation {name!r} is not relu or gelu")
    return name


def _transformer_layer(cls_name: str) -> Callable:
    computed = {
        "d_model": lambda r: r.child("self_attn")["embed_dim"],
        "nhead": lambda r: r.child("self_attn")["num_heads"],
        "dim_feedforward": lambda r: r.child("linear1")["out_features"],
        "dropout": lambda r: r.child("dropout")["p"],
        "activation": _activation_name,
        "layer_norm_eps": lambda r: r.child("norm1")["eps"],
        "batch_first": lambda r: r.child("self_attn").get("batch_first", False),
        "norm_first": lambda r: r.get("norm_first", False),
        "bias": lambda r: r.child("linear1").has_param("bias"),
    }
    return from_attrs(cls_name, **computed)


register_torch_module("TransformerEncoderLayer", _transformer_layer("TransformerEncoderLayer"))
register_torch_module("TransformerDecoderLayer", _transformer_layer("TransformerDecoderLayer"))


def _transformer_stack(cls_name: str, layer_keyword: str) -> Callable:
    """TransformerEncoder/Decoder: the first layer rebuilt as the template, cloned num_layers times
    by the constructor (the loaded state dict then sets every clone's weights), optional norm."""
    def build(r: TorchModuleRecord):
        from .. import nn

        layers = r.child("layers")
        first = rebuild_module(layers.children["0"], f"{r._path}.layers.0" if r._path else "layers.0")
        norm = r.children.get("norm")
        return getattr(nn, cls_name)(**{layer_keyword: first, "num_layers": len(layers.children),
                                        "norm": None if norm is None else rebuild_module(norm, "norm")})
    return build


register_torch_module("TransformerEncoder", _transformer_stack("TransformerEncoder", "encoder_layer"))
register_torch_module("TransformerDecoder", _transformer_stack("TransformerDecoder", "decoder_layer"))


#: Modules rebuilt so far in this load, by record (a record several parents share is rebuilt
#: once, and its module shared, as torch shares it): id -> (record, module).
_REBUILT: contextvars.ContextVar = contextvars.ContextVar("torch_rebuilt", default=None)
#: The builders fastlayers registers itself: their records are validated (``_VALIDATORS``)
#: before they run; one registered over them (``register_torch_module``) validates its own.
_DEFAULT_BUILDERS = dict(TORCH_MODULE_BUILDERS)


def rebuild_module(record, path: str = ""):
    """The fastlayers.nn module for a ``TorchModuleRecord`` tree, weights not loaded yet."""
    if isinstance(record, UnknownGlobal):
        raise UnsupportedError(
            f"module {path or '<root>'} is an instance of {record.global_name}, not a standard "
            f"torch.nn class; fastlayers rebuilds only torch.nn classes from a pickle without "
            f"running its code: {_ONNX_HINT}")
    if not isinstance(record, TorchModuleRecord):
        raise ModelFileError(f"module {path or '<root>'} is a {type(record).__name__}, not a module")
    builder = TORCH_MODULE_BUILDERS.get(record.class_name)
    if builder is None or not record.torch_class.startswith("torch.nn.modules."):
        raise UnsupportedError(f"module {path or '<root>'}: {record.torch_class} is not supported by "
                               f"fastlayers.load yet; {_ONNX_HINT}")
    memo = _REBUILT.get()
    if memo is not None and id(record) in memo:   # a module shared by several parents, as torch
        return memo[id(record)][1]
    object.__setattr__(record, "_path", path)
    try:
        validate = _VALIDATORS.get(record.class_name)
        if validate is not None and builder is _DEFAULT_BUILDERS.get(record.class_name):
            validate(_Check(record, path))
        module = _without_initial_weights(builder(record))
        if memo is not None:
            memo[id(record)] = (record, module)
        return module
    except FastlayersError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, MemoryError, OverflowError) as e:
        raise ModelFileError(f"module {path or '<root>'} ({record.torch_class}): cannot rebuild from "
                             f"the pickled attributes ({type(e).__name__}: {str(e)[:200]})") from e


def _without_initial_weights(module):
    """``module`` with the weights its constructor drew replaced by empty stand-ins of the
    same shape and dtype (``load_state_dict`` copies the file's over them): a module being
    rebuilt never holds its random initial weights beside the file's and their copies."""
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, value in table.items():
                if isinstance(value, np.ndarray) and value.strides != (0,) * value.ndim:
                    table[name] = np.broadcast_to(np.zeros((), value.dtype), value.shape)
    return module


# ------------------------------------------------------------------- attribute validation
_MISSING = object()


class _Check:
    """The checks of one module record before its module is built: each attribute's type and
    range (``torch_max_geometry`` ...), and the shapes of its own parameters and buffers against the
    sizes its attributes declare (``tensors``), so that the module allocates what the file
    holds, no more. Errors are ``ModelFileError`` naming the module path and the attribute."""

    def __init__(self, r: TorchModuleRecord, path: str):
        self.r, self.path = r, path

    def fail(self, what: str):
        raise ModelFileError(f"module {brepr(self.path) if self.path else '<root>'} "
                             f"({self.r.torch_class}): {what}")

    def value(self, name, default=_MISSING):
        if name in self.r.attrs:
            return _plain(self.r, name, self.r.attrs[name])
        if default is _MISSING:
            self.fail(f"attribute {name!r} is missing")
        return default

    def int(self, name, lo=0, hi=None, default=_MISSING, none=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected an int in [{lo}, "
                      f"{'...' if hi is None else hi}]")
        return v

    def flag(self, name, default=False, none=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if v not in (True, False, 0, 1) or isinstance(v, float):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected True or False")
        return bool(v)

    def float(self, name, lo=None, hi=None, default=_MISSING, none=False, nonzero=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (lo is not None and v < lo) or (hi is not None and v > hi) or (nonzero and v == 0):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected a finite number"
                      + (" other than 0" if nonzero else "")
                      + (f" in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
                         if lo is not None or hi is not None else ""))
        return float(v)

    def choice(self, name, choices, default=_MISSING):
        v = self.value(name, default)
        if v not in choices:
            self.fail(f"attribute {name!r} is {brepr(v)}; expected one of {', '.join(map(repr, choices))}")
        return v

    def ints(self, name, n, lo, hi, default=_MISSING, none=False, none_items=False):
        """An int or n ints (a tuple or list) in [lo, hi], as a tuple (None items allowed with
        ``none_items``)."""
        v = self.value(name, default)
        if v is None and none:
            return None
        items = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else v
        ok = isinstance(items, (tuple, list)) and len(items) == n and all(
            (x is None and none_items) or (isinstance(x, int) and not isinstance(x, bool)
                                           and lo <= x <= hi) for x in items)
        if not ok:
            self.fail(f"attribute {name!r} is {brepr(v)}; expected an int or {n} ints in [{lo}, {hi}]")
        return tuple(items)

    def tensors(self, expected: dict):
        """The record's own parameters and persistent buffers must be ``expected`` (name ->
        shape), exactly."""
        r = self.r
        skip = r.state.get("_non_persistent_buffers_set") or ()
        have = {k: v for k, v in r.parameters.items() if v is not None}
        have.update({k: v for k, v in r.buffers.items() if v is not None and k not in skip})
        for name, shape in expected.items():
            if name not in have:
                self.fail(f"tensor {name!r} of shape {shape} is missing")
            if tuple(have[name].shape) != tuple(shape):
                self.fail(f"tensor {name!r} has shape {tuple(have[name].shape)}; its attributes "
                          f"declare {tuple(shape)}")
            kinds = "f" if name in r.parameters else "fiub"
            if have[name].dtype.kind not in kinds:
                self.fail(f"tensor {name!r} is {have[name].dtype}, not "
                          + ("floating point" if kinds == "f" else "real"))
        extra = [k for k in have if k not in expected]
        if extra:
            self.fail(f"tensor(s) {brepr(extra[:5])} are not those of a {r.class_name}")

    def child(self, name) -> _Check:
        c = self.r.children.get(name)
        if not isinstance(c, TorchModuleRecord):
            self.fail(f"child module {name!r} is missing")
        return _Check(c, f"{self.path}.{name}" if self.path else name)


def _no_tensors(c: _Check):
    c.tensors({})


def _linear(c: _Check):
    i, o = c.int("in_features"), c.int("out_features")
    c.tensors({"weight": (o, i), **({"bias": (o,)} if c.r.has_param("bias") else {})})
    return i, o


def _layer_norm(c: _Check):
    shape = c.value("normalized_shape")
    shape = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        c.fail(f"attribute 'normalized_shape' is {brepr(shape)}; expected up to 8 sizes")
    c.float("eps", 0.0, default=1e-5)
    affine = c.flag("elementwise_affine", True)
    expected = {"weight": tuple(shape)} if affine else {}
    if affine and c.r.has_param("bias"):
        expected["bias"] = tuple(shape)
    c.tensors(expected)
    return tuple(shape)


def _batch_norm(c: _Check):
    n = c.int("num_features")
    c.float("eps", 0.0, default=1e-5)
    c.float("momentum", none=True, default=0.1)
    affine, track = c.flag("affine", True), c.flag("track_running_stats", True)
    expected = {}
    if affine:
        expected.update(weight=(n,), **({"bias": (n,)} if c.r.has_param("bias") else {}))
    if track:
        expected.update(running_mean=(n,), running_var=(n,))
        if c.r.buffers.get("num_batches_tracked") is not None:
            expected["num_batches_tracked"] = ()
    c.tensors(expected)


def _embedding(c: _Check):
    n, d = c.int("num_embeddings"), c.int("embedding_dim")
    c.int("padding_idx", -n, max(n - 1, 0), default=None, none=True)
    c.tensors({"weight": (n, d)})


def _conv(rank, transposed):
    def check(c: _Check):
        cin, cout = c.int("in_channels", 1), c.int("out_channels", 1)
        groups = c.int("groups", 1, default=1)
        if cin % groups or cout % groups:
            c.fail(f"groups={groups} does not divide in_channels={cin} and out_channels={cout}")
        kernel = c.ints("kernel_size", rank, 1, 1 << 31)
        stride = c.ints("stride", rank, 1, _geometry(), default=1)
        dilation = c.ints("dilation", rank, 1, _geometry(), default=1)
        extent = [d * k for d, k in zip(dilation, kernel)]
        padding = c.value("padding", 0)
        if not (isinstance(padding, str) and padding in ("same", "valid") and not transposed):
            padding = c.ints("padding", rank, 0, _geometry(), default=0)
            if any(p > e for p, e in zip(padding, extent)):
                c.fail(f"padding {padding} is wider than the dilated kernel {tuple(extent)}")
        out_pad = c.ints("output_padding", rank, 0, _geometry(), default=0)
        if transposed:
            if any(s > e for s, e in zip(stride, extent)):
                c.fail(f"stride {stride} is longer than the dilated kernel {tuple(extent)}")
            if any(o >= s and o >= d for o, s, d in zip(out_pad, stride, dilation)):
                c.fail(f"output_padding {out_pad} is not smaller than stride {stride} or dilation "
                       f"{dilation}")
        c.value("padding_mode", "zeros")
        shape = (cin, cout // groups) if transposed else (cout, cin // groups)
        c.tensors({"weight": shape + kernel, **({"bias": (cout,)} if c.r.has_param("bias") else {})})
    return check


def _pool(rank, kind):
    def check(c: _Check):
        kernel = c.ints("kernel_size", rank, 1, _geometry())
        c.ints("stride", rank, 1, _geometry(), default=None, none=True)
        padding = c.ints("padding", rank, 0, _geometry(), default=0)
        if any(p > k // 2 for p, k in zip(padding, kernel)):
            c.fail(f"padding {padding} is more than half the kernel {kernel}")
        if kind == "max":
            c.ints("dilation", rank, 1, _geometry(), default=1)
            c.flag("return_indices")
        else:
            c.flag("count_include_pad", True)
            c.int("divisor_override", 1, default=None, none=True)
        c.flag("ceil_mode")
        c.tensors({})
    return check


def _adaptive(rank):
    def check(c: _Check):
        c.ints("output_size", rank, 1, _geometry(), none_items=rank == 2)
        c.flag("return_indices")
        c.tensors({})
    return check


def _upsample(c: _Check):
    size, scale = c.value("size", None), c.value("scale_factor", None)
    if size is not None:
        c.ints("size", 2, 1, _geometry())
    if scale is not None:
        items = scale if isinstance(scale, (tuple, list)) else (scale,)
        if not 1 <= len(items) <= 2 or not all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= MAX_SCALE
                for f in items):
            c.fail(f"attribute 'scale_factor' is {brepr(scale)}; expected factors in (0, {MAX_SCALE}]")
    c.value("mode", "nearest")
    c.flag("align_corners", none=True, default=None)
    c.flag("recompute_scale_factor", none=True, default=None)
    c.tensors({})


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4, "RNNCell": 1, "GRUCell": 3, "LSTMCell": 4}


def _recurrent(c: _Check):
    kind = c.r.class_name
    gates = _GATES[kind]
    i, h = c.int("input_size"), c.int("hidden_size", 1)
    layers = c.int("num_layers", 1, 1 << 12, default=1)
    bias, dirs = c.flag("bias", True), 2 if c.flag("bidirectional") else 1
    c.flag("batch_first")
    c.float("dropout", 0.0, 1.0, default=0.0)
    proj = c.int("proj_size", 0, max(h - 1, 0), default=0) if kind == "LSTM" else 0
    if kind == "RNN":
        c.choice("nonlinearity", ("tanh", "relu"), "tanh")
    out = proj or h
    expected = {}
    for layer in range(layers):
        for suffix in ("", "_reverse")[:dirs]:
            key = f"l{layer}{suffix}"
            expected[f"weight_ih_{key}"] = (gates * h, i if layer == 0 else out * dirs)
            expected[f"weight_hh_{key}"] = (gates * h, out)
            if bias:
                expected[f"bias_ih_{key}"] = expected[f"bias_hh_{key}"] = (gates * h,)
            if proj:
                expected[f"weight_hr_{key}"] = (proj, h)
    c.tensors(expected)


def _cell(c: _Check):
    gates = _GATES[c.r.class_name]
    i, h = c.int("input_size"), c.int("hidden_size", 1)
    bias = c.flag("bias", True)
    if c.r.class_name == "RNNCell":
        c.choice("nonlinearity", ("tanh", "relu"), "tanh")
    c.tensors({"weight_ih": (gates * h, i), "weight_hh": (gates * h, h),
               **({"bias_ih": (gates * h,), "bias_hh": (gates * h,)} if bias else {})})


def _attention(c: _Check) -> int:
    e, heads = c.int("embed_dim", 1), c.int("num_heads", 1)
    if e % heads:
        c.fail(f"num_heads={heads} does not divide embed_dim={e}")
    kdim, vdim = c.int("kdim", 1, default=e, none=True) or e, c.int("vdim", 1, default=e, none=True) or e
    c.float("dropout", 0.0, 1.0, default=0.0)
    c.flag("batch_first")
    c.flag("add_zero_attn")
    expected = ({"in_proj_weight": (3 * e, e)} if kdim == e and vdim == e else
                {"q_proj_weight": (e, e), "k_proj_weight": (e, kdim), "v_proj_weight": (e, vdim)})
    if c.r.has_param("in_proj_bias"):
        expected["in_proj_bias"] = (3 * e,)
    if c.r.has_param("bias_k"):
        expected.update(bias_k=(1, 1, e), bias_v=(1, 1, e))
    c.tensors(expected)
    out = c.child("out_proj")
    if _linear(out) != (e, e):
        out.fail(f"the out-projection is not ({e}, {e})")
    return e


def _check_transformer_layer(decoder):
    def check(c: _Check):
        e = _attention(c.child("self_attn"))
        if decoder and _attention(c.child("multihead_attn")) != e:
            c.fail("its two attention blocks differ in width")
        i1, ff = _linear(c.child("linear1"))
        ff2, o2 = _linear(c.child("linear2"))
        if (i1, o2, ff2) != (e, e, ff):
            c.fail(f"linear1 ({i1} -> {ff}) and linear2 ({ff2} -> {o2}) do not fit width {e}")
        for norm in ("norm1", "norm2", "norm3")[:3 if decoder else 2]:
            if _layer_norm(c.child(norm)) != (e,):
                c.fail(f"{norm} does not normalize width {e}")
        c.flag("norm_first")
        c.tensors({})
    return check


def _check_transformer_stack(c: _Check):
    layers = c.child("layers")
    items = list(layers.r.children.values())
    if not items:
        layers.fail("holds no layers")
    first = [(k, v.shape) for k, v in items[0].state_dict().items()]
    for k, item in enumerate(items[1:], 1):
        if not isinstance(item, TorchModuleRecord) or item.class_name != items[0].class_name or \
                [(n, v.shape) for n, v in item.state_dict().items()] != first:
            layers.fail(f"layer {k} differs from layer 0 (the layers are clones of one)")
    c.tensors({})


_VALIDATORS: dict[str, Callable] = {
    "Linear": _linear, "NonDynamicallyQuantizableLinear": _linear, "LayerNorm": _layer_norm,
    "BatchNorm1d": _batch_norm, "BatchNorm2d": _batch_norm, "Embedding": _embedding,
    "Conv1d": _conv(1, False), "Conv2d": _conv(2, False), "ConvTranspose2d": _conv(2, True),
    "MaxPool1d": _pool(1, "max"), "MaxPool2d": _pool(2, "max"), "AvgPool1d": _pool(1, "avg"),
    "AvgPool2d": _pool(2, "avg"), "AdaptiveAvgPool1d": _adaptive(1), "AdaptiveAvgPool2d": _adaptive(2),
    "AdaptiveMaxPool1d": _adaptive(1), "AdaptiveMaxPool2d": _adaptive(2), "Upsample": _upsample,
    "RNN": _recurrent, "LSTM": _recurrent, "GRU": _recurrent, "RNNCell": _cell,
    "LSTMCell": _cell, "GRUCell": _cell, "MultiheadAttention": _attention,
    "TransformerEncoderLayer": _check_transformer_layer(False),
    "TransformerDecoderLayer": _check_transformer_layer(True),
    "TransformerEncoder": _check_transformer_stack, "TransformerDecoder": _check_transformer_stack,
    "LeakyReLU": lambda c: (c.float("negative_slope", default=0.01), c.tensors({})),
    "ELU": lambda c: (c.float("alpha", default=1.0), c.tensors({})),
    "GELU": lambda c: (c.choice("approximate", ("none", "tanh"), "none"), c.tensors({})),
    "Softplus": lambda c: (c.float("beta", default=1.0, nonzero=True), c.float("threshold", default=20.0),
                           c.tensors({})),
    "Softmax": lambda c: (c.int("dim", -64, 63, default=None, none=True), c.tensors({})),
    "LogSoftmax": lambda c: (c.int("dim", -64, 63, default=None, none=True), c.tensors({})),
    "Flatten": lambda c: (c.int("start_dim", -64, 63, default=1), c.int("end_dim", -64, 63, default=-1),
                          c.tensors({})),
    **{name: (lambda c: (c.float("p", 0.0, 1.0, default=0.5), c.tensors({})))
       for name in ("Dropout", "Dropout1d", "Dropout2d")},
    **{name: _no_tensors for name in ("Identity", "ReLU", "ReLU6", "SELU", "Sigmoid", "Hardsigmoid",
                                      "Tanh", "Softsign", "SiLU")},
}


def load_torch_module(path):
    """Rebuild a whole pickled ``torch.nn`` module (``torch.save(model)``) as fastlayers.nn.

    Only standard torch.nn classes in ``TORCH_MODULE_BUILDERS`` are rebuilt, from their class
    references and pickled attributes; no code from the file runs and torch is not imported.

    Raises
    ------
    ModelFileError
        Unreadable, corrupt or refused file, or a file holding a state dict (weights only).
    UnsupportedError
        A custom class or a torch.nn class fastlayers does not rebuild (suggests ONNX export).
    """
    where = str(path)
    obj = read_torch_pickle(path, unknown_globals="record")
    if not is_module_like(obj):
        _reject_unknown(obj, where)
        if isinstance(obj, dict) and any(is_module_like(v) for v in obj.values()):
            names = [k for k, v in obj.items() if is_module_like(v)]
            raise ModelFileError(
                f"{where}: holds a dict whose entries {names[:5]} are modules; fastlayers.load reads "
                "a file holding one module (torch.save(model)); re-save that module alone, or port "
                "it to fastlayers.nn and use fastlayers.load_state_dict")
        if isinstance(obj, dict):
            raise ModelFileError(
                f"{where}: holds a state dict (weights only), not a model: build the model with "
                "fastlayers.nn and load the weights with model.load_state_dict("
                "fastlayers.load_state_dict(path))")
        raise ModelFileError(f"{where}: holds a {type(obj).__name__}, not a torch.nn module")
    token = _REBUILT.set({})
    try:
        check_module_tree(obj)
        _reject_unknown_attrs(obj, "")
        module = rebuild_module(obj)
        module.load_state_dict(obj.state_dict(), strict=True)
    except (ModelFileError, UnsupportedError) as e:
        raise type(e)(f"{where}: {e}") from None
    except (StateDictError, ShapeError) as e:
        raise ModelFileError(f"{where}: the rebuilt module does not match the pickled weights: "
                             f"{str(e)[:1000]}") from e
    finally:
        _REBUILT.reset(token)
    return module


def _reject_unknown(obj, where):
    """Refuse leftover unknown globals that are not custom modules (their value would be garbage)."""
    if isinstance(obj, type) and issubclass(obj, UnknownGlobal):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")
    if isinstance(obj, UnknownGlobal) and not is_module_like(obj):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")


def _reject_unknown_attrs(record, path):
    if isinstance(record, TorchModuleRecord):
        for name, value in record.attrs.items():
            if name in ("_modules",):
                continue
            _reject_unknown(value, f"module {path or '<root>'} attribute {name!r}")
        for name, child in record.children.items():
            _reject_unknown_attrs(child, f"{path}.{name}" if path else name)


__all__ = ["TORCH_MODULE_BUILDERS", "from_attrs", "has_param", "is_torch_file", "load_state_dict",
           "load_torch_module", "read_torch_pickle", "register_torch_module"]
