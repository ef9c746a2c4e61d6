"""A restricted unpickler for the pickles inside PyTorch files, without torch.

``pickle`` runs code named by the file: every ``GLOBAL`` opcode imports a module attribute and
``REDUCE`` calls it. This unpickler never imports anything from a file. ``find_class`` answers
from a fixed table of our own stand-ins:

- tensor rebuild functions (``torch._utils._rebuild_tensor_v2`` ...) -> functions here that build
  numpy arrays from storages;
- storage types (``torch.FloatStorage`` ...) and dtypes (``torch.float32`` ...) -> inert records;
- ``collections.OrderedDict``, ``builtins.set``/``frozenset``, ``torch.Size`` -> the builtins;
- ``torch.nn.modules.<file>.<Class>`` -> an inert record class (``TorchModuleRecord``) that keeps
  the pickled ``__dict__`` (parameters, buffers, children, constructor attributes), for
  ``fastlayers.load`` to rebuild ``fastlayers.nn`` modules from; ``torch.nn.functional.<name>``
  and ``torch._C._nn.<name>`` -> an inert ``TorchFunctionRef`` (TransformerEncoderLayer pickles
  its activation function).

Records and refs cannot be called: the metaclass refuses, so a file can only instantiate them
through ``NEWOBJ`` (inert ``__new__``) and fill them through ``BUILD`` (our ``__setstate__``,
which stores the state as data). Any other global raises ``ModelFileError`` naming it, or, when
reading a whole module (``unknown_globals="record"``), becomes an ``UnknownGlobal`` record
class that is refused when called and reported afterwards (a custom ``nn.Module`` subclass is an
``UnsupportedError``). No code from a file ever runs.
"""

from __future__ import annotations

import _compat_pickle
import pickle
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ..errors import ModelFileError

# --------------------------------------------------------------------------------- dtypes
#: torch storage class name -> (numpy dtype of the stored elements, torch dtype name).
#: bfloat16 is stored as uint16 and widened to float32 after slicing (numpy has no bfloat16).
STORAGE_TYPES: dict[str, tuple[np.dtype, str]] = {
    "FloatStorage": (np.dtype(np.float32), "float32"),
    "DoubleStorage": (np.dtype(np.float64), "float64"),
    "HalfStorage": (np.dtype(np.float16), "float16"),
    "BFloat16Storage": (np.dtype(np.uint16), "bfloat16"),
    "LongStorage": (np.dtype(np.int64), "int64"),
    "IntStorage": (np.dtype(np.int32), "int32"),
    "ShortStorage": (np.dtype(np.int16), "int16"),
    "CharStorage": (np.dtype(np.int8), "int8"),
    "ByteStorage": (np.dtype(np.uint8), "uint8"),
    "BoolStorage": (np.dtype(np.bool_), "bool"),
    "ComplexFloatStorage": (np.dtype(np.complex64), "complex64"),
    "ComplexDoubleStorage": (np.dtype(np.complex128), "complex128"),
    "UntypedStorage": (np.dtype(np.uint8), "uint8"),
}

#: torch dtype attribute name -> (numpy storage dtype, canonical torch dtype name).
TORCH_DTYPES: dict[str, tuple[np.dtype, str]] = {}
def _float8_table(exp_bits: int, bias: int, ieee: bool) -> np.ndarray:
    """float32 value of each of the 256 float8 codes (1 sign bit, ``exp_bits``, the rest
    mantissa). ``ieee``: all-ones exponent is inf/NaN (e5m2); otherwise only S.1111.111 is NaN
    (e4m3fn, no infinities)."""
    man_bits = 7 - exp_bits
    out = np.empty(256, np.float32)
    for code in range(256):
        sign = -1.0 if code >> 7 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if ieee and e == (1 << exp_bits) - 1:
            value = sign * np.inf if m == 0 else np.nan
        elif not ieee and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            value = np.nan
        elif e == 0:
            value = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            value = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out[code] = value
    return out


#: float8 dtypes (stored as uint8 codes, widened to float32 through a 256-entry table).
FLOAT8_TABLES = {"float8_e4m3fn": _float8_table(4, 7, ieee=False),
                 "float8_e5m2": _float8_table(5, 15, ieee=True)}

for _names, _np, _canon in [
    (("float32", "float"), np.float32, "float32"), (("float64", "double"), np.float64, "float64"),
    (("float16", "half"), np.float16, "float16"), (("bfloat16",), np.uint16, "bfloat16"),
    (("int64", "long"), np.int64, "int64"), (("int32", "int"), np.int32, "int32"),
    (("int16", "short"), np.int16, "int16"), (("int8",), np.int8, "int8"),
    (("uint8",), np.uint8, "uint8"), (("uint16",), np.uint16, "uint16"),
    (("uint32",), np.uint32, "uint32"), (("uint64",), np.uint64, "uint64"),
    (("bool",), np.bool_, "bool"), (("complex64", "cfloat"), np.complex64, "complex64"),
    (("complex128", "cdouble"), np.complex128, "complex128"),
    (("float8_e4m3fn",), np.uint8, "float8_e4m3fn"), (("float8_e5m2",), np.uint8, "float8_e5m2"),
]:
    for _n in _names:
        TORCH_DTYPES[_n] = (np.dtype(_np), _canon)


class _NotCallable(type):
    """Metaclass of every record class: calling one (``REDUCE``, ``OBJ``, ``INST``) is refused,
    and so is setting its attributes (``BUILD`` with slot state on the class itself)."""

    def __call__(cls, *args, **kwargs):
        raise ModelFileError(f"refused to call {cls.global_name} while reading a pickle: fastlayers "
                             "never runs code from a model file")

    def __setattr__(cls, name, value):
        raise ModelFileError(f"refused to set {name!r} on {cls.global_name} while reading a pickle")


class _Record(metaclass=_NotCallable):
    """Inert object: ``NEWOBJ`` creates it without running anything, ``BUILD`` stores the state."""

    global_name = "?"

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        object.__setattr__(self, "new_args", args)
        object.__setattr__(self, "state", {})
        return self

    def __setstate__(self, state):
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        merged = dict(state) if isinstance(state, dict) else {"__state__": state}
        if isinstance(slots, dict):
            merged.update(slots)
        object.__setattr__(self, "state", merged)

    def __setattr__(self, name, value):  # nothing from a file writes attributes
        raise AttributeError("records are read-only")

    def __reduce_ex__(self, protocol):
        raise TypeError("records cannot be pickled")


class StorageType(_Record):
    """A torch storage class or dtype: numpy element dtype plus the torch dtype name."""

    np_dtype: np.dtype = np.dtype(np.uint8)
    torch_dtype: str = "uint8"


def _record_class(base: type, module: str, name: str, **attrs) -> type:
    return _NotCallable(name, (base,), {"global_name": f"{module}.{name}", "__module__": __name__,
                                        **attrs})


class TorchModuleRecord(_Record):
    """A pickled ``torch.nn`` module: ``torch_class`` and its ``__dict__`` (``state``)."""

    torch_class = "?"

    # ------------------------------------------------------------ what builders read
    @property
    def class_name(self) -> str:
        return self.torch_class.rsplit(".", 1)[-1]

    @property
    def attrs(self) -> dict:
        """The pickled instance attributes (constructor arguments such as ``in_features``)."""
        return self.state

    def __getitem__(self, name: str):
        try:
            return self.state[name]
        except KeyError:
            raise KeyError(f"{self.torch_class} record has no attribute {name!r}") from None

    def get(self, name: str, default=None):
        return self.state.get(name, default)

    def _table(self, name: str) -> dict:
        t = self.state.get(name)
        return t if isinstance(t, dict) else {}

    @property
    def parameters(self) -> dict:
        return self._table("_parameters")

    @property
    def buffers(self) -> dict:
        return self._table("_buffers")

    @property
    def children(self) -> "OrderedDict[str, Any]":
        return OrderedDict((k, v) for k, v in self._table("_modules").items() if v is not None)

    def has_param(self, name: str) -> bool:
        return self.parameters.get(name) is not None

    def child(self, name: str):
        return self.children[name]

    def state_dict(self, prefix: str = "") -> "OrderedDict[str, np.ndarray]":
        """The module's state dict as torch computes it: parameters, persistent buffers, children."""
        out: OrderedDict = OrderedDict()
        _flatten_module(self, prefix, out)
        return out


class UnknownGlobal(_Record):
    """A global outside the table, kept as an inert record when reading whole modules."""


class TorchFunctionRef(_Record):
    """A reference to ``torch.nn.functional.<name>`` (never called)."""

    function_name = "?"


def is_module_like(obj) -> bool:
    """A torch module record, or an unknown class instance with a module's ``__dict__``."""
    return isinstance(obj, TorchModuleRecord) or (
        isinstance(obj, UnknownGlobal) and "_parameters" in obj.state and "_modules" in obj.state)


def _flatten_module(rec, prefix: str, out: dict) -> None:
    state = rec.state
    params = state.get("_parameters") or {}
    buffers = state.get("_buffers") or {}
    non_persistent = state.get("_non_persistent_buffers_set") or set()
    for name, p in params.items():
        if p is not None:
            out[prefix + name] = p
    for name, b in buffers.items():
        if b is not None and name not in non_persistent:
            out[prefix + name] = b
    for name, child in (state.get("_modules") or {}).items():
        if child is not None:
            if not is_module_like(child):
                raise ModelFileError(f"child module {prefix + name!r} is not a module")
            _flatten_module(child, f"{prefix}{name}.", out)


# --------------------------------------------------------------------------------- storages
class Storage:
    """A storage's elements as a 1-D numpy array (``array``), with the torch dtype name."""

    __slots__ = ("key", "array", "torch_dtype")

    def __init__(self, key: str, array: np.ndarray, torch_dtype: str):
        for name, value in (("key", key), ("array", array), ("torch_dtype", torch_dtype)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):  # a pickle's BUILD cannot swap the array under a view
        raise AttributeError("storages are read-only")


def _ints(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ModelFileError(f"tensor {what} must be a tuple of ints, got {value!r:.100}")
    return tuple(value)


def _view(storage, offset, size, stride, dtype: np.dtype | None = None, torch_dtype: str | None = None):
    """The tensor ``storage[offset + sum(i_k * stride_k)]`` of shape ``size`` as a numpy array.

    Bounds are checked before any view is made (a hostile file cannot read outside the storage).
    A C-contiguous view shares the storage's memory, as torch tensors do; other views are copied.
    """
    if not isinstance(storage, Storage):
        raise ModelFileError(f"tensor storage must come from the file's storages, got "
                             f"{type(storage).__name__}")
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if not isinstance(offset, int) or offset < 0:
        raise ModelFileError(f"tensor storage offset must be a non-negative int, got {offset!r:.50}")
    if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise ModelFileError(f"invalid tensor size {size} / stride {stride}")
    data = storage.array
    torch_dtype = torch_dtype or storage.torch_dtype
    if dtype is not None and dtype != data.dtype:  # _rebuild_tensor_v3: typed view of raw bytes
        nbytes = data.size * data.itemsize
        if nbytes % dtype.itemsize:
            raise ModelFileError(f"storage {storage.key} of {nbytes} bytes does not hold whole "
                                 f"{torch_dtype} elements")
        if data.flags.c_contiguous:
            data = data.view(np.uint8).view(dtype)
        else:  # the zero-stride stand-in of a legacy file's first pass
            data = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=(nbytes // dtype.itemsize,),
                                                   strides=(0,), writeable=False)
    n = int(np.prod(size, dtype=np.int64)) if size else 1
    if n:
        last = offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= data.size:
            raise ModelFileError(f"tensor (offset {offset}, size {size}, stride {stride}) reaches "
                                 f"element {last} of storage {storage.key} holding {data.size}")
    contiguous = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * size[i + 1]
    if n == 0:
        out = np.zeros(size, data.dtype)
    elif all(st == c for s, st, c in zip(size, stride, contiguous) if s != 1):
        out = data[offset:offset + n].reshape(size)
    else:
        item = data.itemsize
        out = np.lib.stride_tricks.as_strided(data[offset:], shape=size,
                                              strides=[st * item for st in stride], writeable=False)
        out = np.array(out, order="C")  # a copy; 0-d stays 0-d
    if torch_dtype == "bfloat16":  # bits of the upper half of a float32
        out = (out.astype(np.uint32) << np.uint32(16)).view(np.float32)
    elif torch_dtype in FLOAT8_TABLES:
        out = FLOAT8_TABLES[torch_dtype][out]
    return out


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    return _view(storage, storage_offset, size, stride)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _view(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    if not (isinstance(dtype, type) and issubclass(dtype, StorageType)):
        raise ModelFileError(f"_rebuild_tensor_v3: dtype must be a torch dtype, got {dtype!r:.50}")
    return _view(storage, storage_offset, size, stride, dtype.np_dtype, dtype.torch_dtype)


def _rebuild_parameter(data, requires_grad=True, backward_hooks=None, state=None):
    if not isinstance(data, np.ndarray):
        raise ModelFileError(f"parameter data must be a tensor, got {type(data).__name__}")
    return data


def _size(*args):
    return tuple(args[0]) if args else ()


def _device(*args):
    return str(args[0]) if args else "cpu"


class _Admitted:
    """An admitted function as the pickle sees it: callable, but with no attributes a ``BUILD``
    could change (a plain function's ``__defaults__`` would be writable, process-wide)."""

    __slots__ = ("_fn", "_name")

    def __init__(self, name: str, fn: Callable):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __setattr__(self, name, value):
        raise ModelFileError(f"refused to set {name!r} on {self._name} while reading a pickle")

    def __setstate__(self, state):
        raise ModelFileError(f"refused to set the state of {self._name} while reading a pickle")

    def __reduce_ex__(self, protocol):
        raise TypeError("admitted functions cannot be pickled")


_FUNCTIONS: dict[tuple[str, str], _Admitted] = {key: _Admitted(".".join(key), fn) for key, fn in {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("torch", "Size"): _size,
    ("torch", "device"): _device,
}.items()}

#: The globals admitted in a state-dict pickle (documented in docs/formats.md).
ADMITTED_GLOBALS = sorted(f"{m}.{n}" for m, n in _FUNCTIONS) + [
    "torch.<X>Storage (" + ", ".join(sorted(STORAGE_TYPES)) + "), torch.storage.UntypedStorage",
    "torch.<dtype> (" + ", ".join(sorted(TORCH_DTYPES)) + ")",
    "torch.nn.modules.<file>.<Class> (inert records)",
    "torch.nn.functional.<name>, torch._C._nn.<name> (inert references)",
]


def _is_identifier_path(module: str, name: str) -> bool:
    return all(part.isidentifier() for part in module.split(".")) and name.isidentifier()


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickle a torch pickle with our stand-ins (see the module docstring).

    ``load_storage(storage_type, key, location, numel)`` returns the storage's 1-D numpy array
    of ``storage_type.np_dtype``; ``unknown_globals`` is ``"refuse"`` (ModelFileError at once)
    or ``"record"`` (inert ``UnknownGlobal`` classes, refused when called).
    """

    def __init__(self, file, source: str, load_storage: Callable | None = None,
                 unknown_globals: str = "refuse"):
        super().__init__(file)
        self.source = source
        self.load_storage = load_storage
        self.unknown_globals = unknown_globals
        self._storages: dict[str, Storage] = {}
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if not isinstance(module, str) or not isinstance(name, str):
            raise ModelFileError(f"{self.source}: malformed global reference")
        # Python 2 names, as pickle's own find_class maps them (protocol < 3 writes them)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        key = (module, name)
        if key in _FUNCTIONS:
            return _FUNCTIONS[key]
        if key in self._classes:
            return self._classes[key]
        cls = self._make_class(module, name)
        self._classes[key] = cls
        return cls

    def _make_class(self, module: str, name: str) -> type:
        if module == "torch.storage" and name == "UntypedStorage":
            module = "torch"
        if module == "torch" and name in STORAGE_TYPES:
            np_dtype, torch_dtype = STORAGE_TYPES[name]
            return _record_class(StorageType, module, name, np_dtype=np_dtype, torch_dtype=torch_dtype)
        if module == "torch" and name in TORCH_DTYPES:
            np_dtype, torch_dtype = TORCH_DTYPES[name]
            return _record_class(StorageType, module, name, np_dtype=np_dtype, torch_dtype=torch_dtype)
        if (module.startswith("torch.nn.modules.") and _is_identifier_path(module, name)
                and name[:1].isupper()):
            return _record_class(TorchModuleRecord, module, name, torch_class=f"{module}.{name}")
        if (module in ("torch.nn.functional", "torch._C._nn") and name.isidentifier()
                and not name.startswith("_")):
            return _record_class(TorchFunctionRef, module, name, function_name=name)
        if self.unknown_globals == "record" and _is_identifier_path(module, name):
            return _record_class(UnknownGlobal, module, name)
        raise ModelFileError(f"{self.source}: refused global {module}.{name}: a state-dict pickle may "
                             "only reference tensor rebuild functions, storage types, dtypes, "
                             "OrderedDict and torch.nn classes; fastlayers never runs code from a file")

    def persistent_load(self, pid):
        if self.load_storage is None:
            raise ModelFileError(f"{self.source}: unexpected persistent id in a plain pickle")
        if not isinstance(pid, tuple) or not pid:
            raise ModelFileError(f"{self.source}: malformed persistent id {pid!r:.100}")
        if pid[0] == "module" and len(pid) >= 2 and isinstance(pid[1], type) and issubclass(pid[1], _Record):
            return pid[1]  # legacy format: ('module', class, source file, source)
        if pid[0] != "storage" or len(pid) < 5:
            raise ModelFileError(f"{self.source}: unsupported persistent id {pid!r:.100}")
        storage_type, key, _location, numel = pid[1:5]
        view = pid[5] if len(pid) > 5 else None
        if not (isinstance(storage_type, type) and issubclass(storage_type, StorageType)):
            raise ModelFileError(f"{self.source}: storage type must be a torch storage class, got "
                                 f"{storage_type!r:.80}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ModelFileError(f"{self.source}: malformed storage reference {pid!r:.100}")
        storage = self._storages.get(key)
        if storage is None or storage.array.dtype != storage_type.np_dtype:
            array = self.load_storage(storage_type, key, numel)
            storage = Storage(key, array, storage_type.torch_dtype)
            self._storages[key] = storage
        if view is not None:  # legacy: (view key, element offset, view size) into the root storage
            ok = (isinstance(view, tuple) and len(view) == 3 and isinstance(view[1], int)
                  and isinstance(view[2], int) and view[1] >= 0 and view[2] >= 0)
            if not ok or view[1] + view[2] > storage.array.size:
                raise ModelFileError(f"{self.source}: malformed storage view {view!r:.100}")
            _vkey, off, n = view
            return Storage(f"{key}[{off}:{off + n}]", storage.array[off:off + n], storage.torch_dtype)
        return storage
