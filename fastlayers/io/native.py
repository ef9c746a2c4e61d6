"""The native model file: one uncompressed ``.npz`` (zip) holding ``__fastlayers__`` (the JSON
architecture, as uint8 bytes) and one array per weight, keyed ``<layer path>/<weight name>``.

Reading needs numpy only and never numpy's pickle or header evaluator: each ``.npy`` header is
parsed as a literal and checked against its member's size, only float32 weights (uint8 for the
header) are read, no code from the file is ever executed, and layer classes are looked up in a
fixed registry. The checks and limits shared with the other readers are in ``fastlayers.limits``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import struct
import uuid
import zipfile
from pathlib import Path

import numpy as np

from .. import limits, settings
from ..errors import FastlayersError, ModelFileError, UnsupportedError
from ..version import __version__

FORMAT = "fastlayers-model"
VERSION = 1
HEADER_KEY = "__fastlayers__"


def _registry() -> dict:
    """Class name -> class of what a native file may hold: the layers, and nested models."""
    from ..layers import LAYER_CLASSES
    from ..model.graph import Model, Sequential

    return {**LAYER_CLASSES, "Model": Model, "Sequential": Sequential}


# ------------------------------------------------------------------------------------ writing
def _layer_entry(layer) -> dict:
    from ..model.graph import Model

    if isinstance(layer, Model):
        return model_config(layer)
    return {"class_name": type(layer).__name__, "config": layer.get_config()}


def model_config(model) -> dict:
    """The JSON-compatible architecture of ``model`` (nested models included)."""
    from ..model.graph import Sequential

    spec = model.graph_spec
    if isinstance(model, Sequential):
        return {
            "class_name": "Sequential",
            "config": {
                "name": model.name,
                "batch_shape": list(spec.input_layer.batch_shape),
                "input_name": spec.input_layer.name,
                "layers": [_layer_entry(layer) for layer in model.layers],
            },
        }
    node_ids = {id(node): i for i, node in enumerate(spec.nodes)}

    def ref(args):
        if args is None:
            return None
        if isinstance(args, list):
            return [ref(a) for a in args]
        return [node_ids[id(args.node)], args.index]

    nodes = [
        {"layer": node.layer.name, "args": ref(node.args), "extra_args": list(node.extra_args), "kwargs": node.kwargs}
        for node in spec.nodes
    ]
    return {
        "class_name": "Model",
        "config": {
            "name": model.name,
            "layers": [_layer_entry(layer) for layer in model.layers],
            "nodes": nodes,
            "inputs": [ref(t) for t in model.inputs],
            "outputs": [ref(t) for t in model.outputs],
            "single_input": spec.single_input,
            "single_output": spec.single_output,
        },
    }


def weight_items(model, prefix: str = ""):
    """(key, layer, weight name) for every weight of ``model``, nested models flattened by path."""
    from ..model.graph import Model

    for layer in model.layers:
        if isinstance(layer, Model):
            yield from weight_items(layer, f"{prefix}{layer.name}/")
        else:
            for wname in layer.weight_names:
                yield f"{prefix}{layer.name}/{wname}", layer, wname


def _json_numpy(value):
    """numpy scalars and arrays in layer configs become plain JSON numbers and lists."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _check_representable(model, what: str) -> None:
    """Refuse (UnsupportedError) a model the architecture config cannot rebuild: an unbuilt
    Sequential, or a layer or model class outside ``fastlayers.layers`` (a subclass included)."""
    from ..model.graph import Model, Sequential

    if isinstance(model, Sequential) and not model.built:
        raise UnsupportedError(
            f"Sequential {model.name!r} cannot be {what} before its input shape "
            "is known: start it with fastlayers.Input(shape) or call it once"
        )
    registry = _registry()
    pending = [model]
    while pending:
        current = pending.pop()
        for layer in [current, *current.layers]:
            if registry.get(type(layer).__name__) is not type(layer):
                raise UnsupportedError(
                    f"model {model.name!r} cannot be {what}: layer "
                    f"{layer.name!r} is a {type(layer).__qualname__}, not a "
                    "fastlayers.layers class the format can rebuild"
                )
            if isinstance(layer, Model) and layer is not current:
                pending.append(layer)


def model_header(model, what: str = "saved", **dumps_options) -> str:
    """The JSON header of ``model`` (format, version and ``model_config``) that a native file
    stores and ``Model.to_json`` returns; ``what`` names the action in errors and
    ``dumps_options`` go to ``json.dumps``. UnsupportedError where the format cannot hold it."""

    _check_representable(model, what)
    header = {"format": FORMAT, "version": VERSION, "fastlayers_version": __version__, "model": model_config(model)}
    dumps_options.setdefault("default", _json_numpy)
    try:
        return json.dumps(header, **dumps_options)
    except (TypeError, ValueError) as e:
        raise UnsupportedError(
            f"model {model.name!r} cannot be {what}: a layer option is not serializable ({e})"
        ) from e


def write_model(model, f, what: str = "saved") -> None:
    """Write ``model``'s native file (header and weights, an uncompressed npz) to the binary
    file object ``f``; ``what`` names the action in UnsupportedError's message."""
    arrays = {HEADER_KEY: np.frombuffer(model_header(model, what).encode(), dtype=np.uint8)}
    for key, layer, wname in weight_items(model):
        arrays[key] = getattr(layer, wname)
    # mypy fears a key named allow_pickle among the arrays; every key holds a "/" or is HEADER_KEY
    np.savez(f, **arrays)  # type: ignore[arg-type]


def save_model(model, path) -> None:
    """Write ``model`` to ``path`` atomically (a temporary file renamed into place)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            write_model(model, f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------ reading
_NPY_MAGIC = b"\x93NUMPY"
#: Longest .npy header read (numpy writes about 120 bytes; its own reader allows 10,000).
_NPY_MAX_HEADER = 1 << 16
#: The dtype strings an .npy header may give: one numeric type (bool, integers, floats).
_NPY_DESCR = re.compile(r"^[<>|=]?(b1|u1|i1|[iuf][248])$")
#: dtypes of the header member (bytes) and of the weights.
_HEADER_DTYPES = ("|u1", "<u1", ">u1")
_WEIGHT_DTYPES = ("<f4", ">f4")


def is_native(source) -> bool:
    """Whether ``source`` (a path or a seekable binary file object) is a zip holding the
    fastlayers header."""
    try:
        with zipfile.ZipFile(source) as z:
            return f"{HEADER_KEY}.npy" in z.NameToInfo
    except limits.ZIP_ERRORS:
        return False
    finally:
        if hasattr(source, "seek"):
            try:
                source.seek(0)
            except (OSError, ValueError):
                pass


def _npy_header(member, info, where: str, what: str) -> tuple[str, bool, tuple]:
    """(descr, fortran_order, shape) of the .npy stream ``member`` (a zip member of
    ``info.file_size`` bytes), read and checked without numpy's header parser: the magic, a
    bounded header length, a literal dict of exactly the three keys, and a data size that
    matches the member's size. The stream is left at the first data byte."""
    head = member.read(8)
    if len(head) != 8 or head[:6] != _NPY_MAGIC:
        raise ModelFileError(f"{where}: {what} is not an .npy array (no NUMPY magic)")
    major, minor = head[6], head[7]
    if major not in (1, 2, 3):
        raise ModelFileError(f"{where}: {what} has .npy format version {major}.{minor}; expected 1.0, 2.0 or 3.0")
    fmt = "<H" if major == 1 else "<I"
    size = member.read(struct.calcsize(fmt))
    if len(size) != struct.calcsize(fmt):
        raise ModelFileError(f"{where}: {what} is truncated in its .npy header")
    (length,) = struct.unpack(fmt, size)
    if length > _NPY_MAX_HEADER:
        raise ModelFileError(
            f"{where}: {what} has a {length:,}-byte .npy header, over the {_NPY_MAX_HEADER:,}-byte limit"
        )
    text = member.read(length)
    if len(text) != length:
        raise ModelFileError(f"{where}: {what} is truncated in its .npy header")
    try:
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeError) as e:
        raise ModelFileError(
            f"{where}: {what} has a malformed .npy header ({type(e).__name__}: {str(e)[:100]})"
        ) from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ModelFileError(
            f"{where}: {what} has a malformed .npy header: expected a dict of "
            f"'descr', 'fortran_order' and 'shape', found {limits.describe(header)}"
        )
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if (
        not isinstance(descr, str)
        or type(fortran) is not bool
        or not isinstance(shape, tuple)
        or any(type(d) is not int or d < 0 for d in shape)
    ):
        raise ModelFileError(f"{where}: {what} has a malformed .npy header {limits.describe(header)}")
    if not _NPY_DESCR.match(descr):  # numpy parses other dtype strings with literal_eval
        raise ModelFileError(
            f"{where}: {what} has dtype {limits.short_repr(descr)}; expected a plain numeric dtype such as '<f4'"
        )
    itemsize = np.dtype(descr).itemsize
    count = 1
    for d in shape:
        count *= d
    data_bytes = info.file_size - (8 + len(size) + length)
    if count * itemsize != data_bytes:
        raise ModelFileError(
            f"{where}: {what} declares {descr} {shape} ({count * itemsize:,} "
            f"bytes) but holds {max(data_bytes, 0):,} bytes of data"
        )
    return descr, fortran, shape


def _open_member(z, info, where: str, what: str):
    try:
        return z.open(info)
    except limits.ZIP_ERRORS as e:
        raise ModelFileError(f"{where}: cannot read {what} ({type(e).__name__}: {str(e)[:200]})") from None


def _read_header(z, where: str):
    info = z.NameToInfo.get(f"{HEADER_KEY}.npy")
    if info is None:
        raise ModelFileError(f"{where}: not a fastlayers model file (no {HEADER_KEY!r} member)")
    what = f"the architecture header ({HEADER_KEY}.npy)"
    with _open_member(z, info, where, what) as member, limits.zip_errors(where, what):
        descr, _, shape = _npy_header(member, info, where, what)
        if descr not in _HEADER_DTYPES or len(shape) != 1:
            raise ModelFileError(f"{where}: {what} must be a 1-D uint8 array, found {descr} {shape}")
        if shape[0] > settings.current().max_config_bytes:
            raise ModelFileError(
                f"{where}: {what} is {shape[0]:,} bytes, over the "
                f"{settings.current().max_config_bytes:,}-byte limit "
                "(FASTLAYERS_MAX_CONFIG_BYTES)"
            )
        raw = bytearray(shape[0])
        limits.read_member_into(member, raw, where, what)
    return limits.parse_json(bytes(raw), where, what)


def _read_weight(z, info, key: str, current: np.ndarray, where: str) -> np.ndarray:
    """The weight ``key`` read from its member into a float32 array of ``current``'s shape
    (``current`` itself, the uninitialized placeholder the layer built, when it can be)."""
    what = f"weight {key!r}"
    with _open_member(z, info, where, what) as member, limits.zip_errors(where, what):
        descr, fortran, shape = _npy_header(member, info, where, what)
        if descr not in _WEIGHT_DTYPES or shape != current.shape:
            found = np.dtype(descr).name if descr in _WEIGHT_DTYPES else descr
            raise ModelFileError(f"{where}: weight {key!r} expects float32 {current.shape}, found {found} {shape}")
        usable = (
            current.dtype == np.float32
            and current.flags.c_contiguous
            and current.flags.writeable
            and current.base is None
        )
        if fortran:
            value = np.empty(shape[::-1], np.float32)
        else:
            value = current if usable else np.empty(shape, np.float32)
        limits.read_member_into(member, value, where, what)
    if descr[0] == ">" and np.little_endian or descr[0] == "<" and not np.little_endian:
        value.byteswap(inplace=True)
    if fortran:
        value = np.ascontiguousarray(value.T)
    return value


class _Sized:
    """The member size ``_npy_header`` checks against, for a plain file."""

    def __init__(self, file_size: int):
        self.file_size = file_size


def read_npy(path, what: str | None = None) -> np.ndarray:
    """The array of an ``.npy`` file of a bool, integer or float dtype, read with the checks of
    the weight reader (magic, bounded header parsed as a literal, data size equal to the file's)
    and never numpy's pickle: ``fastlayers run``'s inputs. ModelFileError naming ``path``."""
    where = str(path)
    what = what or "the file"
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise ModelFileError(f"{where}: no such file") from None
    except OSError as e:
        raise ModelFileError(f"{where}: cannot open the file ({e.strerror or e})") from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if f.read(4) == b"PK\x03\x04":
                raise ModelFileError(f"{where}: a .npz archive, not an .npy array: save each array with numpy.save")
            f.seek(0)
            descr, fortran, shape = _npy_header(f, _Sized(size), where, what)
            dtype = np.dtype(descr)
            if dtype.kind not in "biuf" or dtype.subdtype is not None:
                raise ModelFileError(f"{where}: {what} holds dtype {descr!r}; expected bool, integer or float numbers")
            out = np.empty(shape[::-1] if fortran else shape, dtype)
            if out.size:
                limits.read_member_into(f, out, where, what)
        except OSError as e:
            if isinstance(e, FastlayersError):
                raise
            raise ModelFileError(f"{where}: cannot read the file ({e.strerror or e})") from None
    return out.T if fortran else out


def load_native(source):
    """Read a model written by ``Model.save`` from a path or a seekable binary file object.

    Every member is checked before it is used (zip flags, method and sizes; .npy headers
    parsed without numpy's evaluator; sizes against the member's real size; the architecture
    against ``fastlayers.limits``), the weights are read through zipfile, which verifies each
    member's CRC-32, straight into the arrays the layers built, and nothing from the file is
    executed. ModelFileError or UnsupportedError naming ``source`` otherwise."""
    where = str(source)
    opened = limits.open_file(source, where)
    try:
        with limits.open_zip(opened or source, where) as z:
            return _read_model(z, where)
    finally:
        if opened is not None:
            opened.close()


def _read_model(z, where: str):
    from ..layers.base import weights_loaded_later  # the layers are imported at the first load

    header = _read_header(z, where)
    members = {}
    for info in z.infolist():
        if info.filename == f"{HEADER_KEY}.npy":
            continue
        if not info.filename.endswith(".npy"):
            raise ModelFileError(f"{where}: unexpected member {info.filename!r} (every weight is an .npy member)")
        members[info.filename[:-4]] = info
    budget = sum(info.file_size for info in members.values()) // 4
    with weights_loaded_later(), np.errstate(all="ignore"):
        model = model_from_header(header, where, weight_elements=budget)
    expected = {key: (layer, wname) for key, layer, wname in weight_items(model)}
    missing, unexpected = sorted(set(expected) - set(members)), sorted(set(members) - set(expected))
    if missing or unexpected:
        raise ModelFileError(
            f"{where}: weights do not match the architecture; missing {missing[:10]}, unexpected {unexpected[:10]}"
        )
    for key, (layer, wname) in expected.items():
        setattr(layer, wname, _read_weight(z, members[key], key, getattr(layer, wname), where))
    with np.errstate(all="ignore"):  # weights from a file may hold inf or NaN
        for layer in {id(layer): layer for layer, _ in expected.values()}.values():
            layer._weights_changed()
    return model


# --------------------------------------------------------------------- architecture checks
def _expect(condition: bool, where: str, field: str, expected: str, found) -> None:
    if not condition:
        raise ModelFileError(f"{where}: {field}: expected {expected}, found {limits.describe(found)}")


def _is_ref(ref) -> bool:
    return isinstance(ref, list) and len(ref) == 2 and all(type(v) is int and v >= 0 for v in ref)


def _check_refs(refs, where: str, field: str, depth: int = 0) -> None:
    """A node argument: None, a [node index, output index] ref, or (nested) lists of them."""
    if refs is None or _is_ref(refs):
        return
    _expect(
        isinstance(refs, list) and depth < 8,
        where,
        field,
        "null, a [node, output] pair of non-negative integers or a list of them",
        refs,
    )
    for i, r in enumerate(refs):
        _check_refs(r, where, f"{field}[{i}]", depth + 1)


def check_architecture(
    entry, where: str, weight_elements: int | None = None, _count: list | None = None, _path: str = "model"
) -> None:
    """The structure, types and ranges of a native architecture (``model_config`` output) before
    anything is built: ModelFileError naming ``where`` and the field otherwise."""
    count = [0] if _count is None else _count
    _expect(
        isinstance(entry, dict) and isinstance(entry.get("class_name"), str) and isinstance(entry.get("config"), dict),
        where,
        _path,
        "an object with a string 'class_name' and an object 'config'",
        entry,
    )
    cls, cfg = entry["class_name"], entry["config"]
    if cls not in ("Model", "Sequential"):
        name = cfg.get("name")
        _expect(name is None or isinstance(name, str), where, f"{_path}.config.name", "a string", name)
        limits.count_layers(count, where)
        limits.check_layer_config(cfg, where, f"layer {name!r} ({cls})", weight_elements)
        return
    here = f"{_path}.config"
    _expect(
        cfg.get("name") is None or isinstance(cfg.get("name"), str), where, f"{here}.name", "a string", cfg.get("name")
    )
    layers = cfg.get("layers")
    _expect(isinstance(layers, list), where, f"{here}.layers", "a list of layers", layers)
    for i, layer in enumerate(layers):
        check_architecture(layer, where, weight_elements, count, f"{here}.layers[{i}]")
    if cls == "Sequential":
        shape = cfg.get("batch_shape")
        _expect(
            isinstance(shape, list)
            and 1 <= len(shape) <= 16
            and all(d is None or (type(d) is int and 0 <= d <= limits.MAX_CONFIG_INT) for d in shape),
            where,
            f"{here}.batch_shape",
            "a list of 1 to 16 sizes (null or non-negative integers)",
            shape,
        )
        _expect(
            cfg.get("input_name") is None or isinstance(cfg.get("input_name"), str),
            where,
            f"{here}.input_name",
            "a string",
            cfg.get("input_name"),
        )
        return
    nodes = cfg.get("nodes")
    _expect(isinstance(nodes, list), where, f"{here}.nodes", "a list of layer calls", nodes)
    limits.count_layers(count, where, len(nodes))
    for i, node in enumerate(nodes):
        field = f"{here}.nodes[{i}]"
        _expect(
            isinstance(node, dict) and isinstance(node.get("layer"), str),
            where,
            field,
            "an object with a string 'layer'",
            node,
        )
        _check_refs(node.get("args"), where, f"{field}.args")
        _expect(
            isinstance(node.get("extra_args", []), list), where, f"{field}.extra_args", "a list", node.get("extra_args")
        )
        _expect(isinstance(node.get("kwargs", {}), dict), where, f"{field}.kwargs", "an object", node.get("kwargs"))
    for key in ("inputs", "outputs"):
        refs = cfg.get(key)
        _expect(
            isinstance(refs, list) and bool(refs) and all(_is_ref(r) for r in refs),
            where,
            f"{here}.{key}",
            "a non-empty list of [node, output] pairs",
            refs,
        )
    for key in ("single_input", "single_output"):
        _expect(isinstance(cfg.get(key, False), bool), where, f"{here}.{key}", "a boolean", cfg.get(key))


# ------------------------------------------------------------------------------- rebuilding
def _build_error(where: str, here: str, e: BaseException) -> FastlayersError:
    """The error of a layer the architecture cannot build: the layer's own ModelFileError or
    UnsupportedError as it is, anything else (a ShapeError between layers, a TypeError from a
    constructor, a MemoryError from weights the config sizes absurdly) as a ModelFileError."""
    if isinstance(e, (ModelFileError, UnsupportedError)):
        return e if where in str(e) else type(e)(f"{where}: {here}: {e}")
    text = str(e)[:300]
    if isinstance(e, MemoryError):
        text = f"its weights cannot be allocated ({text or 'MemoryError'})"
    elif not isinstance(e, FastlayersError):
        text = f"{type(e).__name__}: {text}"
    return ModelFileError(f"{where}: {here} cannot be built: {text}")


def _layer_from_entry(entry, registry, where):
    cls_name, config = entry["class_name"], entry["config"]
    if cls_name in ("Model", "Sequential"):
        return model_from_config(entry, where)
    here = f"layer {config.get('name')!r} ({cls_name})"
    cls = registry.get(cls_name)
    if cls is None:
        raise UnsupportedError(f"{where}: layer {config.get('name')!r} has unknown class {cls_name!r}")
    try:
        return cls.from_config(dict(config))
    except FastlayersError as e:
        if isinstance(e, (ModelFileError, UnsupportedError)):
            raise _build_error(where, here, e) from e
        raise ModelFileError(f"{where}: {here} has an invalid config: {e}") from e
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{where}: {here} has an invalid config: {e}") from e
    except Exception as e:  # a config from a file: any failure is the file's
        raise _build_error(where, here, e) from e


def model_from_config(entry: dict, where: str = "model config"):
    """Rebuild a model (weights initialized, not loaded) from ``model_config`` output, which
    ``check_architecture`` has checked."""
    from ..model.graph import InputLayer, Model, Sequential

    registry = _registry()
    cfg = entry["config"]
    if entry["class_name"] == "Sequential":
        layers = [_layer_from_entry(e, registry, where) for e in cfg["layers"]]
        try:
            first = InputLayer(batch_shape=cfg["batch_shape"], name=cfg.get("input_name"))
            return Sequential([first, *layers], name=cfg.get("name"))
        except Exception as e:
            raise _build_error(where, f"Sequential {cfg.get('name')!r}", e) from e
    by_name = {}
    for layer_entry in cfg["layers"]:
        layer = _layer_from_entry(layer_entry, registry, where)
        if layer.name in by_name:
            raise ModelFileError(f"{where}: model {cfg.get('name')!r} has two layers named {layer.name!r}")
        by_name[layer.name] = layer
    outputs: list[list] = []

    def resolve(ref, field):
        if ref is None:
            return None
        if ref and isinstance(ref[0], list):
            return [resolve(r, f"{field}[{i}]") for i, r in enumerate(ref)]
        node, index = ref
        if node >= len(outputs) or index >= len(outputs[node]):
            raise ModelFileError(f"{where}: {field}: {ref} points at no earlier node output")
        return outputs[node][index]

    for i, node in enumerate(cfg["nodes"]):
        field = f"model {cfg.get('name')!r} node {i}"
        layer = by_name.get(node["layer"])
        if layer is None:
            raise ModelFileError(f"{where}: {field} calls unknown layer {node['layer']!r}")
        if isinstance(layer, InputLayer):
            outputs.append([layer.output])
            continue
        args = resolve(node.get("args"), f"{field} args")
        try:
            out = layer(args, *node.get("extra_args", []), **node.get("kwargs", {}))
        except Exception as e:  # a graph from a file: any failure is the file's
            raise _build_error(where, f"{field} (layer {layer.name!r}, {type(layer).__name__})", e) from e
        outputs.append(out if isinstance(out, list) else [out])
    inputs = [resolve(r, f"model {cfg.get('name')!r} inputs") for r in cfg["inputs"]]
    outs = [resolve(r, f"model {cfg.get('name')!r} outputs") for r in cfg["outputs"]]
    try:
        return Model(
            inputs[0] if cfg.get("single_input") else inputs,
            outs[0] if cfg.get("single_output") else outs,
            name=cfg.get("name"),
        )
    except Exception as e:
        raise _build_error(where, f"model {cfg.get('name')!r}", e) from e


def model_from_header(header, where: str, weight_elements: int | None = None):
    """The model a native header (``model_config`` under ``format``/``version``: a ``.flm``
    file's ``__fastlayers__`` member, ``Model.to_json``) describes, weights as built. The format
    and version are checked, then the architecture (``check_architecture``: structure, types,
    ranges; weight sizes against ``weight_elements``, the weight elements the file can hold,
    when known); anything malformed is a ModelFileError naming ``where``: the header is data
    from anywhere."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        hint = ""
        if isinstance(header, dict) and "class_name" in header and "config" in header:
            hint = (
                "; this looks like Keras's own to_json output, which fastlayers does not "
                "read: save the Keras model as .keras and open it with fastlayers.load"
            )
        raise ModelFileError(f"{where}: not a fastlayers architecture (format {limits.describe(found)}){hint}")
    version = header.get("version", 0)
    if type(version) is not int:
        raise ModelFileError(f"{where}: malformed format version {limits.describe(version)}")
    if version > VERSION:
        raise UnsupportedError(
            f"{where}: written by a newer fastlayers (format version {version}, this version reads {VERSION})"
        )
    limits.check_depth(header, where, "the architecture")
    check_architecture(header.get("model"), where, weight_elements)
    try:
        model = model_from_config(header["model"], where)
    except FastlayersError:
        raise
    except Exception as e:  # a backstop: the checks above should leave none
        raise ModelFileError(f"{where}: malformed architecture ({type(e).__name__}: {e})") from e
    from ..model.graph import all_graph_nodes

    limits.check_graph(all_graph_nodes(model), where)
    return model
