"""Keras model files without Keras or TensorFlow: ``.keras`` (Keras 3 zip or its unzipped
directory), legacy full-model ``.h5`` (Keras 3 and tf.keras 2.x) and weight files
(``.weights.h5``, legacy ``.h5`` weights). Needs h5py (``pip install fastlayers[keras]``).

The architecture (JSON) is rebuilt with fastlayers layers through ``LAYER_BUILDERS``; weights are
read by position in Keras's own order. Nothing in a file is executed: ``Lambda`` layers (Python
bytecode) and custom objects are refused with ``UnsupportedError`` at load time.
"""

from __future__ import annotations

import inspect
import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np

from ..errors import FastlayersError, ModelFileError, UnsupportedError
from ..layers.base import weights_loaded_later

#: Config keys that only matter for training or for Keras internals: ignored.
_IGNORED = re.compile(r"^(name|trainable|dtype|build_config|registered_name|module|seed|"
                      r"activity_regularizer|noise_shape|autocast|quantization_config|"
                      r"input_length|synchronized|optional|sparse|ragged|momentum|renorm_momentum)$"
                      r"|_(initializer|regularizer|constraint)$")
#: dtype policies computed in float32 (weights are cast on load).
_FLOAT_POLICIES = {"float32", "float16", "bfloat16", "float64", "mixed_float16", "mixed_bfloat16"}
_MODEL_CLASSES = {"Functional", "Model", "Sequential"}
#: Arguments every fastlayers layer takes (Keras's legacy input-shape arguments).
_BASE_PARAMS = {"input_shape", "batch_size", "batch_input_shape", "input_dim"}


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise UnsupportedError("reading Keras files needs h5py: pip install fastlayers[keras]") from e
    return h5py


# ------------------------------------------------------------------------------ config -> layers
def _policy_name(dtype) -> str | None:
    if isinstance(dtype, dict):
        return dtype.get("config", {}).get("name")
    return dtype


def _activation(value, where):
    """A Keras activation config (a name, or a serialized function) as a name."""
    if isinstance(value, dict):
        if value.get("class_name") in ("function", "builtins.function") or value.get("module", "").startswith("keras"):
            value = value.get("config")
        if isinstance(value, dict):
            raise UnsupportedError(f"{where}: activation {value!r} is a custom object; not supported")
    return value


def _layer_classes():
    from .. import layers
    from ..graph import InputLayer

    table = {name: getattr(layers, name) for name in layers.__all__
             if isinstance(getattr(layers, name), type) and issubclass(getattr(layers, name), layers.Layer)}
    table.pop("Layer", None)
    table["InputLayer"] = InputLayer
    return table


def build_layer(class_name: str, config: dict, where: str):
    """A fastlayers layer for the Keras layer ``class_name`` with ``config``, or UnsupportedError
    naming the layer and the option that fastlayers cannot honour."""
    name = config.get("name", "?")
    here = f"{where}: layer {name!r} ({class_name})"
    if class_name == "Lambda":
        raise UnsupportedError(f"{here}: Lambda layers carry Python code, which fastlayers never "
                               "executes from a file; rebuild the model without Lambda layers")
    cls = _layer_classes().get(class_name)
    if cls is None:
        raise UnsupportedError(f"{here}: layer class {class_name!r} is not supported")
    policy = _policy_name(config.get("dtype"))
    if policy is not None and policy not in _FLOAT_POLICIES and class_name != "InputLayer":
        raise UnsupportedError(f"{here}: dtype policy {policy!r} is not supported (float policies "
                               "are computed in float32)")
    if config.get("stateful"):
        raise UnsupportedError(f"{here}: option stateful=True is not supported; use the streaming API")
    if config.get("unroll"):
        raise UnsupportedError(f"{here}: option unroll=True is not supported")
    params = set(inspect.signature(cls.__init__).parameters) | _BASE_PARAMS
    kwargs = {"name": name}
    for key, value in config.items():
        if key == "dtype" or (_IGNORED.search(key) and key not in params):
            continue
        if key not in params:
            if value is None or value is False:  # a feature left off
                continue
            raise UnsupportedError(f"{here}: option {key}={value!r} is not supported")
        if key == "activation":
            value = _activation(value, here)
        kwargs[key] = value
    if class_name == "InputLayer":
        kwargs["dtype"] = config.get("dtype") if isinstance(config.get("dtype"), str) else None
        if "batch_shape" not in kwargs and "batch_input_shape" in kwargs:
            kwargs["batch_shape"] = kwargs.pop("batch_input_shape")
    try:
        return cls(**kwargs)
    except FastlayersError as e:
        raise type(e)(f"{here}: {e}") from e
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{here}: invalid config ({e})") from e


def _inbound_refs(node) -> list:
    """Keras 3 node {"args": [...], "kwargs": {...}} or tf.keras 2 [[name, node, tensor, kw], ...]
    as (structure of (layer name, node index, tensor index), kwargs)."""
    if isinstance(node, dict):
        def conv(obj):
            if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
                return tuple(obj["config"]["keras_history"])
            if isinstance(obj, (list, tuple)):
                return [conv(o) for o in obj]
            return obj
        args = [conv(a) for a in node.get("args", [])]
        kwargs = {k: v for k, v in node.get("kwargs", {}).items() if v is not None}
        first = args[0] if args else None
        return first, args[1:], kwargs
    refs = [tuple(entry[:3]) for entry in node]
    kwargs = node[0][3] if node and len(node[0]) > 3 and node[0][3] else {}
    return (refs[0] if len(refs) == 1 else refs), [], kwargs


def build_model(entry: dict, where: str):
    """Rebuild a Keras ``Functional``/``Sequential`` config as a fastlayers model."""
    from ..graph import Input, InputLayer, Model, Sequential

    class_name, cfg = entry["class_name"], entry["config"]
    if class_name == "Sequential":
        layers = []
        for e in cfg["layers"]:
            if e["class_name"] in _MODEL_CLASSES:
                layers.append(build_model(e, where))
            else:
                layers.append(build_layer(e["class_name"], e["config"], where))
        if not isinstance(layers[0] if layers else None, InputLayer):
            shape = cfg.get("build_input_shape") or layers[0]._batch_input_shape if layers else None
            first_cfg = cfg["layers"][0]["config"] if cfg["layers"] else {}
            shape = shape or first_cfg.get("batch_input_shape") or first_cfg.get("batch_shape")
            if shape is None:
                raise ModelFileError(f"{where}: Sequential {cfg.get('name')!r} has no input shape")
            layers.insert(0, Input(batch_shape=shape).node.layer)
        return Sequential(layers, name=cfg.get("name"))
    if class_name not in ("Functional", "Model"):
        raise UnsupportedError(f"{where}: model class {class_name!r} is not supported")
    layers, entries = {}, {}
    for e in cfg["layers"]:
        if e["class_name"] == "NotEqual":
            # Keras 3 records Embedding(mask_zero=True)'s mask as a NotEqual op feeding `mask=`
            # kwargs (dropped below); recurrent layers recompute that mask (PaddingMask). A
            # NotEqual used as an ordinary input leaves its consumers unresolved: a clear error.
            continue
        lname = e.get("name") or e["config"]["name"]
        layers[lname] = build_model(e, where) if e["class_name"] in _MODEL_CLASSES \
            else build_layer(e["class_name"], e["config"], where)
        entries[lname] = e
    outputs: dict[tuple, object] = {}  # (layer, node index, tensor index) -> symbolic tensor

    def resolve(ref):
        if isinstance(ref, list):
            return [resolve(r) for r in ref]
        if isinstance(ref, tuple):
            if ref not in outputs:
                raise KeyError(ref)
            return outputs[ref]
        return ref

    pending = [(lname, i, node) for lname, e in entries.items()
               for i, node in enumerate(e.get("inbound_nodes", []))]
    for lname, layer in layers.items():
        if isinstance(layer, InputLayer):
            outputs[(lname, 0, 0)] = layer.output
    while pending:  # replay calls whose inputs exist, until all are done
        progressed = False
        for item in list(pending):
            lname, index, node = item
            first, extra, kwargs = _inbound_refs(node)
            try:
                args = resolve(first)
                extra_args = [resolve(a) for a in extra]
            except KeyError:
                continue
            kwargs.pop("mask", None)
            kwargs.pop("training", None)
            out = layers[lname](args, *extra_args, **kwargs)
            for t, tensor in enumerate(out if isinstance(out, list) else [out]):
                outputs[(lname, index, t)] = tensor
            pending.remove(item)
            progressed = True
        if not progressed:
            raise ModelFileError(f"{where}: the graph of {cfg.get('name')!r} cannot be rebuilt "
                                 f"(unresolved inputs for {[p[0] for p in pending][:5]})")

    def refs(spec):
        """A single [name, node, tensor] (or a one-element list of them, which Keras unwraps)
        gives one tensor; several give a list."""
        if spec and isinstance(spec[0], str):
            return outputs[tuple(spec[:3])]
        tensors = [outputs[tuple(s[:3])] for s in spec]
        return tensors[0] if len(tensors) == 1 else tensors

    return Model(refs(cfg["input_layers"]), refs(cfg["output_layers"]), name=cfg.get("name"))


# ------------------------------------------------------------------------------------ weights
def _keras_weights_of(layer) -> list:
    """(fastlayers attribute) names in Keras's variable order for ``layer``."""
    return layer.weight_names


def _assign(layer, datasets, where, raw=None):
    """Set ``layer``'s weights from h5py datasets in Keras order (``raw``: see ``_RawFile``)."""
    names = _keras_weights_of(layer)
    if len(datasets) != len(names):
        raise ModelFileError(f"{where}: layer {layer.name!r} ({type(layer).__name__}) expects "
                             f"{len(names)} weights {names}, the file has {len(datasets)}")
    values = []
    for wname, dataset in zip(names, datasets):
        current = getattr(layer, wname)
        if dataset.shape != current.shape:
            raise ModelFileError(f"{where}: weight {wname!r} of layer {layer.name!r} expects shape "
                                 f"{current.shape}, the file has {dataset.shape}")
        values.append(_read_dataset(dataset, raw, where))
    for wname, value in zip(names, values):
        setattr(layer, wname, value)
    layer._weights_changed()


class _RawFile:
    """Where the HDF5 bytes live on disk: a path and the offset of the HDF5 image in it (non-zero
    for an uncompressed member of a .keras zip). Contiguous datasets are read with one
    ``np.fromfile`` at their offset: as fast as reading the bytes, one copy in memory."""

    def __init__(self, path, offset: int = 0):
        self.path, self.offset = str(path), offset


def _read_dataset(dataset, raw: _RawFile | None, where) -> np.ndarray:
    """A dataset as a new C-contiguous float32 array (float16/bfloat16/float64 policies cast)."""
    if dataset.dtype.kind not in "fiu" and str(dataset.dtype) != "bfloat16":
        raise ModelFileError(f"{where}: dataset {dataset.name} has dtype {dataset.dtype}, expected floats")
    if not dataset.size:
        return np.zeros(dataset.shape, np.float32)
    offset = dataset.id.get_offset() if raw is not None and dataset.chunks is None else None
    try:
        if offset is not None:
            flat = np.fromfile(raw.path, dtype=dataset.dtype, count=dataset.size, offset=raw.offset + offset)
            if flat.size != dataset.size:
                raise ModelFileError(f"{where}: dataset {dataset.name} is truncated")
            return np.array(flat.reshape(dataset.shape), dtype=np.float32, order="C", copy=None)
        if dataset.dtype == np.float32:
            value = np.empty(dataset.shape, np.float32)
            dataset.read_direct(value)
            return value
        return np.asarray(dataset[()], dtype=np.float32)
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{where}: cannot read dataset {dataset.name} ({e})") from e


#: Where a layer's variables live in the Keras 3 weights file, in Keras's ``get_weights`` order:
#: layers with sublayers save them in child groups named after the attribute.
_VAR_GROUPS = {
    "SimpleRNN": ("vars", "cell/vars"), "LSTM": ("vars", "cell/vars"), "GRU": ("vars", "cell/vars"),
    "Bidirectional": ("vars", "forward_layer/vars", "forward_layer/cell/vars",
                      "backward_layer/vars", "backward_layer/cell/vars"),
    "MultiHeadAttention": ("vars", "query_dense/vars", "key_dense/vars", "value_dense/vars",
                           "output_dense/vars"),
}


def _read_vars(group, class_name: str = "") -> list:
    """The datasets of a layer's variables, in Keras's order (see ``_VAR_GROUPS``)."""
    datasets = []
    for path in _VAR_GROUPS.get(class_name, ("vars",)):
        vars_ = group.get(path)
        if vars_ is not None:
            datasets += [vars_[str(i)] for i in range(len(vars_))]
    return datasets


def _assign_keras3(model, group, where, visited, raw=None) -> None:
    """Weights of the Keras 3 layout: ``layers/<snake_case class>[_n]/vars/<i>``, nested models
    under their own ``layers`` group (keras.src.saving.saving_lib container naming)."""
    from ..graph import InputLayer, Model
    from ..layers.base import snake_case

    used: dict[str, int] = {}
    layers_group = group.get("layers")
    for layer in model.layers:
        base = snake_case(type(layer).__name__) if not isinstance(layer, Model) else (
            "sequential" if type(layer).__name__ == "Sequential" else "functional")
        n = used.get(base)
        used[base] = 0 if n is None else n + 1
        key = base if n is None else f"{base}_{n + 1}"
        if id(layer) in visited or isinstance(layer, InputLayer):
            continue
        visited.add(id(layer))
        sub = layers_group.get(key) if layers_group is not None else None
        if sub is None:
            if layer.weight_names or isinstance(layer, Model):
                raise ModelFileError(f"{where}: no weights group 'layers/{key}' for layer {layer.name!r}")
            continue
        if isinstance(layer, Model):
            _assign_keras3(layer, sub, where, visited, raw)
        elif layer.weight_names:
            _assign(layer, _read_vars(sub, type(layer).__name__), where, raw)


def _assign_legacy(model, group, where, visited, raw=None) -> None:
    """Weights of the legacy HDF5 layout: ``<layer name>`` groups with a ``weight_names`` attribute."""
    from ..graph import Model

    for layer in model.layers:
        if id(layer) in visited:
            continue
        visited.add(id(layer))
        if isinstance(layer, Model):
            sub = group.get(layer.name)
            if sub is None:
                raise ModelFileError(f"{where}: no weights for nested model {layer.name!r}")
            _assign_legacy_nested(layer, sub, where, visited, raw)
            continue
        if not layer.weight_names:
            continue
        sub = group.get(layer.name)
        if sub is None:
            raise ModelFileError(f"{where}: no weights group for layer {layer.name!r}")
        _assign(layer, [sub[_decode(n)] for n in sub.attrs.get("weight_names", [])], where, raw)


def _assign_legacy_nested(model, group, where, visited, raw=None) -> None:
    """A nested model's weights in the legacy layout: paths ``<model>/<layer>/<weight>``."""
    names = [_decode(n) for n in group.attrs.get("weight_names", [])]
    by_layer: dict[str, list] = {}
    for n in names:
        parts = n.split("/")
        by_layer.setdefault(parts[-2], []).append(group[n])
    for layer in model.layers:
        if id(layer) in visited or not layer.weight_names:
            continue
        visited.add(id(layer))
        _assign(layer, by_layer.get(layer.name, []), where, raw)


def _decode(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


# --------------------------------------------------------------------------------- entry points
def _open_h5(source, where):
    h5py = _h5py()
    try:
        return h5py.File(source, "r")
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{where}: not a readable HDF5 file ({e})") from e


def load_keras(path):
    """Load a Keras 3 ``.keras`` archive (or its unzipped directory) as a fastlayers model."""
    path = Path(path)
    where = str(path)
    try:
        if path.is_dir():
            entry = json.loads((path / "config.json").read_text())
            weights = path / "model.weights.h5"
            with _open_h5(str(weights), where) as f:
                return _model_with_weights(entry, f, where, _RawFile(weights))
        with zipfile.ZipFile(path) as z:
            entry = json.loads(z.read("config.json").decode())
            info = z.getinfo("model.weights.h5")
            # h5py reads the metadata through the member; the weight bytes of a stored
            # (uncompressed) member are read straight from the archive at their offset
            if info.compress_type != zipfile.ZIP_STORED:
                with z.open(info) as member, _open_h5(io.BytesIO(member.read()), where) as f:
                    return _model_with_weights(entry, f, where, None)
            start = _member_data_offset(path, info)
            with open(path, "rb") as fobj:
                member = _Region(fobj, start, info.file_size)
                with _open_h5(member, where) as f:
                    return _model_with_weights(entry, f, where, _RawFile(path, start))
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError) as e:
        if isinstance(e, FastlayersError):
            raise
        raise ModelFileError(f"{where}: not a readable .keras archive ({type(e).__name__}: {e})") from e


class _Region(io.RawIOBase):
    """A read-only, seekable window ``[start, start + size)`` of an open binary file (a stored zip
    member), so h5py reads the member in place; zipfile's own member objects re-read and
    checksum everything before each forward seek."""

    def __init__(self, fobj, start: int, size: int):
        super().__init__()
        self._f, self._start, self._size, self._pos = fobj, start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer):
        n = max(0, min(len(buffer), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buffer)[:n])
        self._pos += got
        return got


def _member_data_offset(path, info) -> int:
    """Offset of a zip member's data: after its local header (30 bytes, name and extra field)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ModelFileError(f"{path}: corrupt zip member header for {info.filename}")
    name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len


def _model_with_weights(entry, h5file, where, raw):
    try:
        with weights_loaded_later():
            model = build_model(entry, where)
    except (KeyError, IndexError, TypeError) as e:
        raise ModelFileError(f"{where}: malformed model config ({type(e).__name__}: {e})") from e
    _assign_keras3(model, h5file, where, set(), raw)
    return model


def load_keras_h5(path):
    """Load a legacy full-model HDF5 file (Keras 3 or tf.keras 2.x ``model.save("x.h5")``)."""
    where = str(path)
    with _open_h5(path, where) as f:
        if "model_config" not in f.attrs:
            raise ModelFileError(f"{where}: HDF5 file without a model_config attribute (a weights "
                                 "file? use model.load_weights)")
        config = f.attrs["model_config"]
        try:
            entry = json.loads(config.decode() if isinstance(config, bytes) else config)
            with weights_loaded_later():
                model = build_model(entry, where)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            if isinstance(e, FastlayersError):
                raise
            raise ModelFileError(f"{where}: malformed model_config ({type(e).__name__}: {e})") from e
        _assign_legacy(model, f["model_weights"], where, set(), _RawFile(path))
    return model


def load_weights(model, path) -> None:
    """Load Keras weights (``.weights.h5`` Keras 3 layout, or a legacy ``.h5``) into ``model``."""
    where = str(path)
    with _open_h5(path, where) as f:
        raw = _RawFile(path)
        if "layers" in f or "vars" in f:
            _assign_keras3(model, f, where, set(), raw)
        elif "model_weights" in f:
            _assign_legacy(model, f["model_weights"], where, set(), raw)
        elif "layer_names" in f.attrs:
            _assign_legacy(model, f, where, set(), raw)
        else:
            raise ModelFileError(f"{where}: no Keras weights found (expected a 'layers' group or "
                                 "'layer_names' attribute)")
