"""Pickling by value: a model's pickle is data (its architecture and weights), never code.

``pickle.dumps(model)`` stores one call, ``<reconstructor>(payload)``, whose argument is a
``bytes`` object: an uncompressed ``.npz`` (a zip, each member CRC-checked) read back without
numpy's pickle (``np.load(..., allow_pickle=False)``, or the native model reader). The only
global a pickle names is that reconstructor, a function of this module:

- ``Model`` / ``Sequential`` (built here or loaded from Keras): the native model file
  (``Model.save``'s bytes), read back by ``io.native.load_native``, the reader of
  ``fastlayers.load``;
- ``fastlayers.nn`` module trees (built here or loaded from torch files): a JSON tree of class
  names from ``fastlayers.nn`` and their constructor arguments, and the state dict; rebuilt by
  calling those constructors, then ``load_state_dict(strict=True)``;
- ``OnnxModel``: the ONNX file's bytes, imported again by ``io.onnx`` (parsed, checked and
  optimised as ``fastlayers.load`` does).

Derived forms (packed weights, Winograd transforms, folded tables) are never pickled: they are
keyed by weight arrays, and a rebuilt model has fresh ones, so the receiving process computes
them at its first call. Nothing is warmed up while unpickling.

A payload that is not what its reconstructor expects raises ``ModelFileError`` (a class that
fastlayers does not know, ``UnsupportedError``), as a model file would. A subclass of a
fastlayers class is code: pickling one raises ``UnsupportedError`` naming it.
"""

from __future__ import annotations

import inspect
import io
import json
import zipfile
from collections import OrderedDict

import numpy as np

from .errors import FastlayersError, ModelFileError, ShapeError, StateDictError, UnsupportedError
from .version import __version__

_ZIP_MAGIC = b"PK\x03\x04"


class _Payload(io.BytesIO):
    """A payload as the file object the native reader opens; readers name their source with
    ``str()``, which gives this description instead of an object address."""

    def __init__(self, data: bytes, description: str):
        super().__init__(data)
        self.description = description

    def __str__(self) -> str:
        return self.description


def _npz_bytes(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _checked_payload(data, what: str) -> None:
    """Refuse anything but the bytes of a zip archive before a reader opens it."""
    if type(data) is not bytes:
        raise ModelFileError(f"{what}: expected the payload as bytes, got {type(data).__name__}")
    if not data.startswith(_ZIP_MAGIC):
        raise ModelFileError(f"{what}: the payload is not a fastlayers archive")


def _header(archive, key: str, fmt: str, version: int, what: str) -> dict:
    """The JSON header stored under ``key``, its format and version checked."""
    if key not in archive.files:
        raise ModelFileError(f"{what}: the payload has no {key!r} header")
    header = json.loads(bytes(archive[key]).decode())
    if not isinstance(header, dict) or header.get("format") != fmt:
        raise ModelFileError(f"{what}: the payload is not a {fmt!r} archive")
    found = header.get("version")
    if type(found) is not int:
        raise ModelFileError(f"{what}: malformed format version {found!r}")
    if found > version:
        raise UnsupportedError(
            f"{what}: written by a newer fastlayers (format version {found}, this version reads {version})"
        )
    return header


# ------------------------------------------------------------------------ Model, Sequential
MODEL_WHAT = "pickled fastlayers model"


def reduce_model(model) -> tuple:
    """``Model.__reduce__``: ``(_model_from_bytes, (native file bytes,))``.

    Raises
    ------
    UnsupportedError
        The native format cannot hold the model (a layer class of its own, a ``Sequential``
        not built yet), as ``Model.save`` would refuse it.
    """
    from .io.native import write_model

    buffer = io.BytesIO()
    write_model(model, buffer, "pickled")
    return _model_from_bytes, (buffer.getvalue(),)


def _model_from_bytes(data: bytes):
    """Rebuild a pickled ``Model`` from its native file bytes, as ``fastlayers.load`` reads a
    ``.flm`` file (not warmed up)."""
    from .io.native import load_native

    _checked_payload(data, MODEL_WHAT)
    return load_native(_Payload(data, MODEL_WHAT))


# ------------------------------------------------------------------------------- OnnxModel
ONNX_FORMAT, ONNX_VERSION, ONNX_KEY = "fastlayers-onnx-pickle", 1, "__fastlayers_onnx__"
ONNX_WHAT = "pickled ONNX model"


def reduce_onnx(model) -> tuple:
    """``OnnxModel.__reduce__``: ``(_onnx_from_bytes, (archive of the ONNX file's bytes,))``.

    Raises
    ------
    UnsupportedError
        The model has no self-contained ONNX bytes: its weights lie in external data files.
    ModelFileError
        The model was loaded from a file that is gone or changed since.
    """
    from .io.onnx import FileSource

    source = model.source
    if source is None:
        raise UnsupportedError(
            f"ONNX model {model.name!r} cannot be pickled by value: its file keeps weights in "
            "external data files, which the pickle would not carry; save it as one file "
            "(onnx.save_model(proto, path, save_as_external_data=False), under 2 GB) and load that"
        )
    if isinstance(source, FileSource):
        source = source.read()
    header = json.dumps({"format": ONNX_FORMAT, "version": ONNX_VERSION, "where": model.where})
    arrays = {ONNX_KEY: np.frombuffer(header.encode(), np.uint8), "model": np.frombuffer(source, np.uint8)}
    return _onnx_from_bytes, (_npz_bytes(arrays),)


def _onnx_from_bytes(data: bytes):
    """Import a pickled ``OnnxModel`` again from its ONNX bytes (parsed, checked and optimised
    as ``fastlayers.load`` does; not warmed up). The model keeps those bytes, for its pickles."""
    from .io.onnx import from_bytes

    _checked_payload(data, ONNX_WHAT)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            header = _header(archive, ONNX_KEY, ONNX_FORMAT, ONNX_VERSION, ONNX_WHAT)
            where = header.get("where")
            if not isinstance(where, str) or set(archive.files) != {ONNX_KEY, "model"}:
                raise ModelFileError(f"{ONNX_WHAT}: malformed payload")
            source = archive["model"]  # a fresh, aligned, writeable buffer the weights may view
        if source.dtype != np.uint8 or source.ndim != 1:
            raise ModelFileError(f"{ONNX_WHAT}: malformed payload (model bytes {source.dtype} {source.shape})")
        return from_bytes(source, where)  # the original's name and messages
    except ModelFileError as e:
        msg = str(e)
        raise ModelFileError(msg if msg.startswith(ONNX_WHAT) else f"{ONNX_WHAT}: {msg}") from e
    except FastlayersError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, RecursionError) as e:
        raise ModelFileError(f"{ONNX_WHAT}: unreadable payload ({type(e).__name__}: {e})") from e


# --------------------------------------------------------------------------- nn.Module trees
NN_FORMAT, NN_VERSION, NN_KEY = "fastlayers-nn-module", 1, "__fastlayers_nn__"
NN_WHAT = "pickled fastlayers.nn module"
#: Containers: their children are the constructor's contents, in order.
_CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")
#: Constructor arguments never stored (device placement, torch's in-place flags).
_IGNORED_ARGS = {"self", "device", "dtype", "inplace"}


def _mha_args(m) -> dict:
    return {"bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None}


def _transformer_layer_args(m) -> dict:
    from .nn import Module
    from .nn import functional as F

    if isinstance(m.activation, Module):
        activation = m.activation
    elif m._act_name in ("relu", "gelu") and m.activation in (F.relu, F.gelu):
        activation = m._act_name
    else:
        raise UnsupportedError(
            f"activation {m.activation!r} is code (a callable of its own); "
            "only 'relu', 'gelu' or an nn.ReLU/nn.GELU module pickle by value"
        )
    return {
        "d_model": m.self_attn.embed_dim,
        "nhead": m.self_attn.num_heads,
        "dim_feedforward": m.linear1.out_features,
        "dropout": m.dropout.p,
        "activation": activation,
        "layer_norm_eps": m.norm1.eps,
        "batch_first": m.self_attn.batch_first,
        "norm_first": m.norm_first,
        "bias": m.linear1.bias is not None,
    }


def _stack_args(layer_keyword: str):
    def args(m) -> dict:
        return {layer_keyword: m.layers[0], "num_layers": len(m.layers)}

    return args


#: Classes whose constructor arguments are not all kept as attributes of the same name:
#: class name -> function of the module giving those arguments (modules allowed as values).
_ARGS_OF = {
    "MultiheadAttention": _mha_args,
    "TransformerEncoderLayer": _transformer_layer_args,
    "TransformerDecoderLayer": _transformer_layer_args,
    "TransformerEncoder": _stack_args("encoder_layer"),
    "TransformerDecoder": _stack_args("decoder_layer"),
}


def _constructor_args(m) -> dict:
    """The keyword arguments that rebuild ``m``'s configuration: each constructor argument the
    module keeps under its own name (a parameter's name gives whether it is present, a child's
    the child), then those ``_ARGS_OF`` computes. Arguments not found keep their defaults."""
    args = {}
    for name, p in inspect.signature(type(m).__init__).parameters.items():
        if name in _IGNORED_ARGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in m._parameters:
            args[name] = m._parameters[name] is not None
        elif name in m._modules:
            args[name] = m._modules[name]
        elif name in m.__dict__:
            args[name] = m.__dict__[name]
    special = _ARGS_OF.get(type(m).__name__)
    if special is not None:
        args.update(special(m))
    return args


def _plain(value, where: str):
    """``value`` as JSON data (tuples become lists, numpy scalars numbers), else UnsupportedError."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_plain(v, where) for v in value]
    raise UnsupportedError(
        f"{where} is a {type(value).__name__}, which pickling by value cannot "
        "hold (plain numbers, strings and tuples only)"
    )


def _module_tree(m, path: str, registry: dict) -> dict:
    """The JSON node of module ``m``: class name, plain arguments, module-valued arguments
    (for a container: its children)."""
    from .nn import Module

    name = type(m).__name__
    where = f"module {path or '<root>'}"
    if registry.get(name) is not type(m):
        raise UnsupportedError(
            f"{where} is a {type(m).__module__}.{type(m).__qualname__}, not a fastlayers.nn class: "
            "its code cannot be pickled by value (a pickled model is data). Pickle its "
            "state_dict() instead (numpy arrays) and rebuild it with its class and "
            "load_state_dict, or export the model to ONNX"
        )

    def child(key, module):
        return _module_tree(module, f"{path}.{key}" if path else key, registry)

    if name in _CONTAINERS:
        return {"class_name": name, "config": {}, "modules": {k: child(k, v) for k, v in m.named_children()}}
    try:
        args = _constructor_args(m)
    except UnsupportedError as e:
        raise UnsupportedError(f"{where} ({name}): {e}") from None
    modules = {k: child(k, v) for k, v in args.items() if isinstance(v, Module)}
    config = {k: _plain(v, f"{where} ({name}) argument {k!r}") for k, v in args.items() if k not in modules}
    return {"class_name": name, "config": config, "modules": modules}


def reduce_module(module) -> tuple:
    """``nn.Module.__reduce__``: ``(_module_from_bytes, (archive of the tree and state dict,))``.

    Raises
    ------
    UnsupportedError
        A module in the tree is not a ``fastlayers.nn`` class (a subclass of its own: code),
        or keeps an argument that is not plain data (a callable activation).
    """
    from .nn import MODULE_CLASSES

    tree = _module_tree(module, "", MODULE_CLASSES)
    header = json.dumps({"format": NN_FORMAT, "version": NN_VERSION, "fastlayers_version": __version__, "module": tree})
    arrays = {NN_KEY: np.frombuffer(header.encode(), np.uint8), **module.state_dict()}
    return _module_from_bytes, (_npz_bytes(arrays),)


def _tuples(value):
    """JSON lists back to the tuples torch-style constructors keep."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _build_module(node, path: str, registry: dict):
    where = f"module {path or '<root>'}"
    if (
        not isinstance(node, dict)
        or not isinstance(node.get("class_name"), str)
        or not isinstance(node.get("config"), dict)
        or not isinstance(node.get("modules"), dict)
    ):
        raise ModelFileError(f"{NN_WHAT}: {where}: malformed entry {str(node)[:200]}")
    name = node["class_name"]
    cls = registry.get(name)
    if cls is None:
        raise UnsupportedError(f"{NN_WHAT}: {where} has unknown class {name!r}")
    modules = OrderedDict(
        (k, None if v is None else _build_module(v, f"{path}.{k}" if path else k, registry))
        for k, v in node["modules"].items()
    )
    if name == "Sequential":
        return cls(modules)
    if name in _CONTAINERS:
        container = cls()
        for k, v in modules.items():
            container.add_module(k, v)
        return container
    config = {k: _tuples(v) for k, v in node["config"].items()}
    try:
        return cls(**config, **modules)
    except FastlayersError as e:
        raise ModelFileError(f"{NN_WHAT}: {where} ({name}): invalid arguments: {e}") from e
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, MemoryError) as e:
        raise ModelFileError(f"{NN_WHAT}: {where} ({name}): invalid arguments ({type(e).__name__}: {e})") from e


def _module_from_bytes(data: bytes):
    """Rebuild a pickled ``fastlayers.nn`` module tree: each module from its class in
    ``fastlayers.nn`` and its arguments, then the weights, strictly (every key, every shape)."""
    from .nn import MODULE_CLASSES

    _checked_payload(data, NN_WHAT)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            header = _header(archive, NN_KEY, NN_FORMAT, NN_VERSION, NN_WHAT)
            module = _build_module(header.get("module"), "", MODULE_CLASSES)
            state = {key: archive[key] for key in archive.files if key != NN_KEY}
        module.load_state_dict(state, strict=True)
    except FastlayersError as e:
        if isinstance(e, (StateDictError, ShapeError)):
            raise ModelFileError(f"{NN_WHAT}: the weights do not match the modules: {e}") from e
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, RecursionError) as e:
        raise ModelFileError(f"{NN_WHAT}: unreadable payload ({type(e).__name__}: {e})") from e
    return module
