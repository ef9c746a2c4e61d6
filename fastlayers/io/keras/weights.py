"""Keras weights read from HDF5 (h5py): the Keras 3 layout (``layers/<class>/vars/<i>``) and the
legacy one (``weight_names`` attributes), each dataset checked, then read by position in
Keras's variable order straight into the layer's array."""

from __future__ import annotations

import io

import numpy as np

from ... import limits
from ...errors import ModelFileError, UnsupportedError
from .creators import keras_class_of, keras_layers

#: What h5py raises on a corrupt or hostile file (soft-link loops, bad addresses, bad heaps).
H5_ERRORS = (
    KeyError,
    OSError,
    RuntimeError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    OverflowError,
    UnicodeError,
)


def import_h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise UnsupportedError("reading Keras files needs h5py: pip install fastlayers[keras]") from e
    return h5py


def _keras_weights_of(layer) -> list:
    """(fastlayers attribute) names in Keras's variable order for ``layer``."""
    return layer.weight_names


class RawFile:
    """Where the HDF5 image lives: an open binary file (a path's, or an in-memory buffer) and
    the image's offset and size in it (non-zero offset: an uncompressed member of a .keras zip).
    Contiguous datasets are read at their offset, inside ``size`` bytes, straight into the
    layer's array: as fast as reading the bytes, one copy in memory."""

    def __init__(self, fobj, offset: int = 0, size: int | None = None):
        self.fobj, self.offset = fobj, offset
        if size is None:
            fobj.seek(0, io.SEEK_END)
            size = fobj.tell() - offset
        self.size = size

    def read_into(self, out: np.ndarray, offset: int, where: str, what: str) -> None:
        nbytes = out.nbytes
        if offset < 0 or offset + nbytes > self.size:
            raise ModelFileError(
                f"{where}: {what} claims bytes [{offset:,}, {offset + nbytes:,}) "
                f"of a {self.size:,}-byte HDF5 image: outside the file"
            )
        self.fobj.seek(self.offset + offset)
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        done = 0
        while done < nbytes:
            n = self.fobj.readinto(view[done : done + limits.CHUNK_BYTES])
            if not n:
                raise ModelFileError(f"{where}: {what} is truncated")
            done += n


def _assign(layer, datasets, where, raw=None):
    """Set ``layer``'s weights from h5py datasets in Keras order (``raw``: see ``RawFile``)."""
    names = _keras_weights_of(layer)
    if len(datasets) != len(names):
        raise ModelFileError(
            f"{where}: layer {layer.name!r} ({type(layer).__name__}) expects "
            f"{len(names)} weights {names}, the file has {len(datasets)}"
        )
    values = []
    for wname, dataset in zip(names, datasets):
        current = getattr(layer, wname)
        if dataset.shape != current.shape:
            raise ModelFileError(
                f"{where}: weight {wname!r} of layer {layer.name!r} expects shape "
                f"{current.shape}, the file has {dataset.shape}"
            )
        values.append(_read_dataset(dataset, raw, where, current))
    for wname, value in zip(names, values):
        setattr(layer, wname, value)
    with np.errstate(all="ignore"):  # weights from a file may hold inf or NaN
        layer._weights_changed()


def _check_dataset(h5py, dataset, where) -> None:
    """A weight dataset must be numeric and hold its bytes in this file: no external raw data
    files, no virtual datasets (mappings to other files), chunks no larger than the data."""
    if dataset.dtype.kind not in "fiu" and str(dataset.dtype) != "bfloat16":
        raise ModelFileError(f"{where}: dataset {dataset.name} has dtype {dataset.dtype}, expected floats")
    plist = dataset.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count():
        raise ModelFileError(
            f"{where}: dataset {dataset.name} keeps its data outside the file (external or virtual storage); refused"
        )
    chunks = dataset.chunks
    if chunks is not None:
        chunk_bytes = int(np.prod(chunks, dtype=np.float64)) * dataset.dtype.itemsize
        if chunk_bytes > max(dataset.size * dataset.dtype.itemsize, 1 << 20):
            raise ModelFileError(
                f"{where}: dataset {dataset.name} declares {chunks} chunks, larger than its shape {dataset.shape}"
            )


def _read_dataset(dataset, raw: RawFile | None, where, current=None) -> np.ndarray:
    """A dataset as a new C-contiguous float32 array (float16/bfloat16/float64 policies cast):
    ``current`` (the layer's uninitialized array) itself when the bytes are float32."""
    h5py = import_h5py()
    _check_dataset(h5py, dataset, where)
    shape = dataset.shape
    usable = (
        current is not None
        and current.dtype == np.float32
        and current.flags.c_contiguous
        and current.flags.writeable
        and current.base is None
        and current.shape == shape
    )
    if not dataset.size:
        return np.zeros(shape, np.float32)
    offset = dataset.id.get_offset() if raw is not None and dataset.chunks is None else None
    what = f"dataset {dataset.name}"
    if offset is not None:
        dtype = dataset.dtype
        if dtype == np.float32 and usable:
            raw.read_into(current, offset, where, what)
            return current
        if str(dtype) == "bfloat16":
            offset = None  # h5py's own conversion
        else:
            buf = np.empty(shape, dtype)
            raw.read_into(buf, offset, where, what)
            with np.errstate(all="ignore"):
                return np.array(buf, dtype=np.float32, order="C", copy=None)
    try:
        if dataset.dtype == np.float32:
            value = current if usable else np.empty(shape, np.float32)
            dataset.read_direct(value)
            return value
        with np.errstate(all="ignore"):
            return np.asarray(dataset[()], dtype=np.float32)
    except H5_ERRORS as e:
        raise ModelFileError(f"{where}: cannot read {what} ({type(e).__name__}: {str(e)[:200]})") from e


def get_object(group, path: str, where: str, kind: str):
    """The object at ``path`` below ``group`` (a Group or Dataset by ``kind``), following hard
    links only (a soft link can loop, an external link opens another file): None where a
    component is missing, ModelFileError where the path is not what the layout says."""
    h5py = import_h5py()
    node = group
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ModelFileError(f"{where}: empty object path {path!r} in {group.name}")
    for part in parts:
        if not isinstance(node, h5py.Group):
            raise ModelFileError(f"{where}: {node.name} is a {type(node).__name__}, expected a group")
        name = part.encode("utf-8", "surrogateescape")
        links = node.id.links
        if not links.exists(name):
            return None
        link_type = links.get_info(name).type
        if link_type != h5py.h5l.TYPE_HARD:
            kind_name = {h5py.h5l.TYPE_SOFT: "SoftLink", h5py.h5l.TYPE_EXTERNAL: "ExternalLink"}.get(
                link_type, f"link of type {link_type}"
            )
            raise ModelFileError(f"{where}: {node.name}/{part} is a {kind_name}; Keras files use hard links only")
        node = node[part]
    expected = h5py.Dataset if kind == "dataset" else h5py.Group
    if not isinstance(node, expected):
        raise ModelFileError(f"{where}: {node.name} is a {type(node).__name__}, expected a {kind}")
    return node


def _names_attr(obj, key: str, where: str) -> list[str]:
    """A list-of-names attribute (``weight_names``, ``layer_names``) checked before it is read:
    a string array of rank 0 or 1 (an empty numeric array counts as no names) and at most
    ``limits.KERAS_MAX_NAMES`` entries; each name valid UTF-8."""
    h5py = import_h5py()
    if key not in obj.attrs:
        return []
    attr = h5py.h5a.open(obj.id, key.encode())
    shape, dtype = attr.shape, attr.dtype
    size = int(np.prod(shape)) if shape else (0 if shape is None else 1)
    if shape is None or size == 0:
        return []
    if len(shape) > 1 or size > limits.KERAS_MAX_NAMES:
        raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} has shape {shape}; expected a list of names")
    if dtype.kind not in "SO" or (dtype.kind == "O" and h5py.check_string_dtype(dtype) is None):
        raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} has dtype {dtype}; expected strings")
    value = obj.attrs[key]
    names = []
    for item in np.atleast_1d(value).tolist():
        try:
            names.append(
                item.decode("utf-8")
                if isinstance(item, bytes)
                else item.encode("utf-8", "surrogateescape").decode("utf-8")
            )
        except UnicodeError:
            raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} holds a name that is not UTF-8") from None
    return names


def text_attr(obj, key: str, where: str) -> str:
    """A string attribute (the model config) checked before it is read: one string value."""
    h5py = import_h5py()
    attr = h5py.h5a.open(obj.id, key.encode())
    shape, dtype = attr.shape, attr.dtype
    if (
        shape is None
        or (shape and int(np.prod(shape)) != 1)
        or dtype.kind not in "SO"
        or (dtype.kind == "O" and h5py.check_string_dtype(dtype) is None)
    ):
        raise ModelFileError(f"{where}: attribute {key!r} has shape {shape} and dtype {dtype}; expected one string")
    value = obj.attrs[key]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape")


def _count_error(layer_name: str, class_name: str, expected: int, found: int, where: str):
    return ModelFileError(
        f"{where}: layer {layer_name!r} ({class_name}) expects {expected} weights, the file has {found}"
    )


def _read_vars(group, layer_name: str, class_name: str, where: str, expected: int) -> list:
    """The datasets of a layer's variables, in Keras's order (its creator's ``weight_groups``);
    their count is checked against ``expected`` before any is opened."""
    creator = keras_layers().get(class_name)
    paths = creator.weight_groups if creator is not None else ("vars",)
    groups = [g for g in (get_object(group, path, where, "group") for path in paths) if g is not None]
    total = sum(len(g) for g in groups)
    if total != expected:
        raise _count_error(layer_name, class_name, expected, total, where)
    datasets = []
    for vars_ in groups:
        for i in range(len(vars_)):
            ds = get_object(vars_, str(i), where, "dataset")
            if ds is None:
                raise ModelFileError(f"{where}: {vars_.name} has no dataset {str(i)!r}")
            datasets.append(ds)
    return datasets


def assign_keras3(model, group, where, visited, raw=None) -> None:
    """Weights of the Keras 3 layout: ``layers/<snake_case class>[_n]/vars/<i>``, nested models
    under their own ``layers`` group (keras.src.saving.saving_lib container naming)."""
    from ...layers.base import snake_case
    from ...model.graph import InputLayer, Model

    used: dict[str, int] = {}
    layers_group = get_object(group, "layers", where, "group")
    for layer in model.layers:
        base = (
            snake_case(keras_class_of(layer))
            if not isinstance(layer, Model)
            else ("sequential" if type(layer).__name__ == "Sequential" else "functional")
        )
        n = used.get(base)
        used[base] = 0 if n is None else n + 1
        key = base if n is None else f"{base}_{n + 1}"
        if id(layer) in visited or isinstance(layer, InputLayer):
            continue
        visited.add(id(layer))
        sub = get_object(layers_group, key, where, "group") if layers_group is not None else None
        if sub is None:
            if layer.weight_names or isinstance(layer, Model):
                raise ModelFileError(f"{where}: no weights group 'layers/{key}' for layer {layer.name!r}")
            continue
        if isinstance(layer, Model):
            assign_keras3(layer, sub, where, visited, raw)
        elif layer.weight_names:
            _assign(
                layer, _read_vars(sub, layer.name, keras_class_of(layer), where, len(layer.weight_names)), where, raw
            )


def _datasets(group, names, where) -> list:
    out = []
    for n in names:
        ds = get_object(group, n, where, "dataset")
        if ds is None:
            raise ModelFileError(f"{where}: {group.name} has no dataset {n!r} (listed in its weight_names)")
        out.append(ds)
    return out


def assign_legacy(model, group, where, visited, raw=None) -> None:
    """Weights of the legacy HDF5 layout: ``<layer name>`` groups with a ``weight_names`` attribute."""
    from ...model.graph import Model

    for layer in model.layers:
        if id(layer) in visited:
            continue
        visited.add(id(layer))
        if isinstance(layer, Model):
            sub = get_object(group, layer.name, where, "group")
            if sub is None:
                raise ModelFileError(f"{where}: no weights for nested model {layer.name!r}")
            _assign_legacy_nested(layer, sub, where, visited, raw)
            continue
        if not layer.weight_names:
            continue
        sub = get_object(group, layer.name, where, "group")
        if sub is None:
            raise ModelFileError(f"{where}: no weights group for layer {layer.name!r}")
        names = _names_attr(sub, "weight_names", where)
        if len(names) != len(layer.weight_names):
            raise _count_error(layer.name, type(layer).__name__, len(layer.weight_names), len(names), where)
        _assign(layer, _datasets(sub, names, where), where, raw)


def _assign_legacy_nested(model, group, where, visited, raw=None) -> None:
    """A nested model's weights in the legacy layout: paths ``<model>/<layer>/<weight>``."""
    names = _names_attr(group, "weight_names", where)
    by_layer: dict[str, list] = {}
    for n in names:
        parts = [p for p in n.split("/") if p]
        if len(parts) < 2:
            raise ModelFileError(
                f"{where}: weight name {n!r} of nested model {model.name!r} is not a <layer>/<weight> path"
            )
        by_layer.setdefault(parts[-2], []).append(n)
    for layer in model.layers:
        if id(layer) in visited or not layer.weight_names:
            continue
        visited.add(id(layer))
        listed = by_layer.get(layer.name, [])
        if len(listed) != len(layer.weight_names):
            raise _count_error(layer.name, type(layer).__name__, len(layer.weight_names), len(listed), where)
        _assign(layer, _datasets(group, listed, where), where, raw)


def check_weights_fit(model, where: str, available: int) -> None:
    """Refuse, before reading, a model whose weights need more elements than ``available`` (the
    HDF5 image's bytes, times the compression ratio limit for chunked datasets)."""
    from ...model.graph import weight_elements

    needed = weight_elements(model)
    if needed > available:
        raise ModelFileError(
            f"{where}: the architecture needs {needed:,} weight elements, more than the {available:,} the file can hold"
        )
