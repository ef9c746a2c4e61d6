"""The native model file: one uncompressed ``.npz`` (zip) holding ``__fastlayers__`` (the JSON
architecture, as uint8 bytes) and one array per weight, keyed ``<layer path>/<weight name>``.

Reading needs numpy only and runs ``np.load(..., allow_pickle=False)``: no object arrays, no
pickle, no code from the file is ever executed. Layer classes are looked up in a fixed registry.
"""

from __future__ import annotations

import json
import os
import uuid
import zipfile
from pathlib import Path

import numpy as np

from ..errors import FastlayersError, ModelFileError, UnsupportedError
from ..layers.base import weights_loaded_later

FORMAT = "fastlayers-model"
VERSION = 1
HEADER_KEY = "__fastlayers__"


def _registry() -> dict:
    from .. import layers
    from ..graph import InputLayer, Model, Sequential

    table = {name: getattr(layers, name) for name in layers.__all__
             if isinstance(getattr(layers, name), type) and issubclass(getattr(layers, name), layers.Layer)}
    table.update(InputLayer=InputLayer, Model=Model, Sequential=Sequential)
    table.pop("Layer")
    return table


# ------------------------------------------------------------------------------------ writing
def _layer_entry(layer) -> dict:
    from ..graph import Model

    if isinstance(layer, Model):
        return model_config(layer)
    return {"class_name": type(layer).__name__, "config": layer.get_config()}


def model_config(model) -> dict:
    """The JSON-compatible architecture of ``model`` (nested models included)."""
    from ..graph import Sequential

    if isinstance(model, Sequential):
        model._require_built("saving")
        return {"class_name": "Sequential", "config": {
            "name": model.name, "batch_shape": list(model._input_layer.batch_shape),
            "input_name": model._input_layer.name,
            "layers": [_layer_entry(layer) for layer in model.layers]}}
    node_ids = {id(node): i for i, node in enumerate(model._nodes)}

    def ref(args):
        if args is None:
            return None
        if isinstance(args, list):
            return [ref(a) for a in args]
        return [node_ids[id(args.node)], args.index]

    nodes = [{"layer": node.layer.name, "args": ref(node.args), "extra_args": list(node.extra_args),
              "kwargs": node.kwargs} for node in model._nodes]
    return {"class_name": "Model", "config": {
        "name": model.name, "layers": [_layer_entry(layer) for layer in model.layers],
        "nodes": nodes, "inputs": [ref(t) for t in model.inputs],
        "outputs": [ref(t) for t in model.outputs],
        "single_input": model._single_input, "single_output": model._single_output}}


def weight_items(model, prefix: str = ""):
    """(key, layer, weight name) for every weight of ``model``, nested models flattened by path."""
    from ..graph import Model

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
    from ..graph import Model, Sequential

    if isinstance(model, Sequential) and not model.built:
        raise UnsupportedError(f"Sequential {model.name!r} cannot be {what} before its input shape "
                               "is known: start it with fastlayers.Input(shape) or call it once")
    registry = _registry()
    pending = [model]
    while pending:
        current = pending.pop()
        for layer in [current, *current.layers]:
            if registry.get(type(layer).__name__) is not type(layer):
                raise UnsupportedError(f"model {model.name!r} cannot be {what}: layer "
                                       f"{layer.name!r} is a {type(layer).__qualname__}, not a "
                                       "fastlayers.layers class the format can rebuild")
            if isinstance(layer, Model) and layer is not current:
                pending.append(layer)


def model_header(model, what: str = "saved", **dumps_options) -> str:
    """The JSON header of ``model`` (format, version and ``model_config``) that a native file
    stores and ``Model.to_json`` returns; ``what`` names the action in errors and
    ``dumps_options`` go to ``json.dumps``. UnsupportedError where the format cannot hold it."""
    from .. import __version__

    _check_representable(model, what)
    header = {"format": FORMAT, "version": VERSION, "fastlayers_version": __version__,
              "model": model_config(model)}
    dumps_options.setdefault("default", _json_numpy)
    try:
        return json.dumps(header, **dumps_options)
    except (TypeError, ValueError) as e:
        raise UnsupportedError(f"model {model.name!r} cannot be {what}: a layer option is not "
                               f"serializable ({e})") from e


def save_model(model, path) -> None:
    """Write ``model`` to ``path`` atomically (a temporary file renamed into place)."""
    header = model_header(model)
    arrays = {HEADER_KEY: np.frombuffer(header.encode(), dtype=np.uint8)}
    for key, layer, wname in weight_items(model):
        arrays[key] = getattr(layer, wname)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------ reading
def is_native(path) -> bool:
    """Whether ``path`` is a zip holding the fastlayers header."""
    try:
        with zipfile.ZipFile(path) as z:
            return f"{HEADER_KEY}.npy" in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def _layer_from_entry(entry, registry, where):
    if not isinstance(entry, dict) or "class_name" not in entry or "config" not in entry:
        raise ModelFileError(f"{where}: malformed layer entry {str(entry)[:200]}")
    cls_name, config = entry["class_name"], entry["config"]
    if cls_name in ("Model", "Sequential"):
        return model_from_config(entry, where)
    cls = registry.get(cls_name)
    if cls is None:
        raise UnsupportedError(f"{where}: layer {config.get('name')!r} has unknown class {cls_name!r}")
    try:
        return cls.from_config(dict(config))
    except FastlayersError:
        raise
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{where}: layer {config.get('name')!r} ({cls_name}) has an invalid "
                             f"config: {e}") from e


def model_from_config(entry: dict, where: str = "model config"):
    """Rebuild a model (weights initialized, not loaded) from ``model_config`` output."""
    from ..graph import InputLayer, Model, Sequential

    registry = _registry()
    cfg = entry["config"]
    if entry["class_name"] == "Sequential":
        layers = [_layer_from_entry(e, registry, where) for e in cfg["layers"]]
        first = InputLayer(batch_shape=cfg["batch_shape"], name=cfg.get("input_name"))
        return Sequential([first, *layers], name=cfg["name"])
    layers = {}
    for e in cfg["layers"]:
        layer = _layer_from_entry(e, registry, where)
        layers[layer.name] = layer
    outputs: list[list] = []

    def resolve(ref):
        if ref is None:
            return None
        if ref and isinstance(ref[0], list):
            return [resolve(r) for r in ref]
        return outputs[ref[0]][ref[1]]

    for node in cfg["nodes"]:
        layer = layers[node["layer"]]
        if isinstance(layer, InputLayer):
            outputs.append([layer.output])
            continue
        out = layer(resolve(node["args"]), *node.get("extra_args", []), **node.get("kwargs", {}))
        outputs.append(out if isinstance(out, list) else [out])
    inputs = [resolve(r) for r in cfg["inputs"]]
    outs = [resolve(r) for r in cfg["outputs"]]
    return Model(inputs[0] if cfg.get("single_input") else inputs,
                 outs[0] if cfg.get("single_output") else outs, name=cfg["name"])


def model_from_header(header, where: str):
    """The model a native header (``model_config`` under ``format``/``version``: a ``.flm``
    file's ``__fastlayers__`` member, ``Model.to_json``) describes, weights as built. The format
    and version are checked and a malformed architecture is a ModelFileError naming ``where``:
    the header is data from anywhere."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        hint = ""
        if isinstance(header, dict) and "class_name" in header and "config" in header:
            hint = ("; this looks like Keras's own to_json output, which fastlayers does not "
                    "read: save the Keras model as .keras and open it with fastlayers.load")
        raise ModelFileError(f"{where}: not a fastlayers architecture (format {found!r}){hint}")
    version = header.get("version", 0)
    if type(version) is not int:
        raise ModelFileError(f"{where}: malformed format version {version!r}")
    if version > VERSION:
        raise UnsupportedError(f"{where}: written by a newer fastlayers (format version {version}, "
                               f"this version reads {VERSION})")
    try:
        return model_from_config(header["model"], where)
    except FastlayersError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, MemoryError,
            OverflowError, RecursionError) as e:
        raise ModelFileError(f"{where}: malformed architecture ({type(e).__name__}: {e})") from e


def load_native(path):
    """Read a model written by ``Model.save``."""
    where = str(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data[HEADER_KEY]).decode())
            with weights_loaded_later():
                model = model_from_header(header, where)
            expected = {key: (layer, wname) for key, layer, wname in weight_items(model)}
            stored = set(data.files) - {HEADER_KEY}
            missing, unexpected = sorted(set(expected) - stored), sorted(stored - set(expected))
            if missing or unexpected:
                raise ModelFileError(f"{where}: weights do not match the architecture; missing "
                                     f"{missing[:10]}, unexpected {unexpected[:10]}")
            for key, (layer, wname) in expected.items():
                value = data[key]
                current = getattr(layer, wname)
                if value.shape != current.shape or value.dtype != np.float32:
                    raise ModelFileError(f"{where}: weight {key!r} expects float32 {current.shape}, "
                                         f"found {value.dtype} {value.shape}")
                setattr(layer, wname, value)
            for layer in {id(layer): layer for layer, _ in expected.values()}.values():
                layer._weights_changed()
    except FastlayersError:
        raise
    except FileNotFoundError as e:
        raise ModelFileError(f"{where}: no such file") from e
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError,
            RecursionError) as e:
        raise ModelFileError(f"{where}: not a readable fastlayers model file "
                             f"({type(e).__name__}: {e})") from e
    return model
