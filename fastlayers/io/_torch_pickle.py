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
import contextvars
import io
import mmap
import os
import pickle
import pickletools
import reprlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import settings
from ..errors import ModelFileError

#: A tensor's rank may be at most this.
MAX_TENSOR_RANK = 64

#: Strided (non-contiguous) tensors are copied out of their storage; all those of a file may
#: copy at most twice its storages' bytes plus this (a zero stride would otherwise let a tiny
#: storage expand into any size).
COPY_SLACK_BYTES = 16 << 20
_COPY_BUDGET: contextvars.ContextVar = contextvars.ContextVar("torch_copy_budget", default=None)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 80, 80
_REPR.maxtuple = _REPR.maxlist = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 6


def brepr(value) -> str:
    """A bounded repr of a value from a file, for error messages: a few levels and items, cut
    strings (a pickle's shared references can make a full repr astronomically long)."""
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a repr of a record may fail; the type still tells
        return f"<{type(value).__name__}>"

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
            raise KeyError(f"{self.torch_class} record has no attribute {brepr(name)}") from None

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
    def children(self) -> OrderedDict[str, Any]:
        return OrderedDict((k, v) for k, v in self._table("_modules").items() if v is not None)

    def has_param(self, name: str) -> bool:
        return self.parameters.get(name) is not None

    def child(self, name: str):
        return self.children[name]

    def state_dict(self, prefix: str = "") -> OrderedDict[str, np.ndarray]:
        """The module's state dict as torch computes it: parameters, persistent buffers, children
        (the tree checked first: ``check_module_tree``)."""
        if not self.__dict__.get("_checked"):
            check_module_tree(self)
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


def check_module_tree(root) -> int:
    """Check a module record tree before anything walks it recursively: each module's
    ``_parameters`` and ``_buffers`` dicts of name -> tensor (or None), ``_modules`` a dict of
    name -> module (or None), ``_non_persistent_buffers_set`` a set of names; no module its own
    ancestor; at most ``torch_max_modules`` modules (a module reached along several paths counts
    once per path) and ``torch_max_module_depth`` levels (``settings.current()``); the tensors of the tree, counted once per path
    (as a state dict lists them), at most twice their distinct bytes + ``COPY_SLACK_BYTES``.
    Returns the module count; raises ``ModelFileError`` naming the module path and the field."""
    options = settings.current()
    max_modules, max_depth = options.torch_max_modules, options.torch_max_module_depth
    count = expanded = 0
    distinct: dict = {}
    on_path: set = set()
    todo: list = [(root, "", 0)]
    while todo:
        rec, path, depth = todo.pop()
        if rec is None:   # leaving a module
            on_path.discard(path)
            continue
        where = f"module {brepr(path) if path else '<root>'}"
        count += 1
        if count > max_modules:
            raise ModelFileError(f"{where}: the module tree holds more than {max_modules} modules "
                                 "(modules shared by several parents count once per parent; the "
                                 "environment variable FASTLAYERS_TORCH_MAX_MODULES raises the limit)")
        if depth > max_depth:
            raise ModelFileError(f"{where}: modules nested more than {max_depth} deep (the "
                                 "environment variable FASTLAYERS_TORCH_MAX_MODULE_DEPTH raises the limit)")
        state = rec.state
        if not isinstance(state, dict):
            raise ModelFileError(f"{where}: its state is a {type(state).__name__}, not a dict")
        for field in ("_parameters", "_buffers", "_modules"):
            table = state.get(field)
            if table is None:
                continue
            if not isinstance(table, dict):
                raise ModelFileError(f"{where}: {field} is a {type(table).__name__}, not a dict")
            for name, value in table.items():
                if not isinstance(name, str):
                    raise ModelFileError(f"{where}: {field} has a key {brepr(name)} that is not a name")
                if value is None:
                    continue
                if field != "_modules" and not isinstance(value, np.ndarray):
                    raise ModelFileError(f"{where}: {field}[{brepr(name)}] is a {type(value).__name__}, "
                                         "not a tensor")
                if field != "_modules":
                    expanded += value.nbytes
                    distinct[id(value)] = value.nbytes
                if field == "_modules" and not is_module_like(value):
                    raise ModelFileError(f"{where}: child {brepr(name)} is a {type(value).__name__}, "
                                         "not a module")
        names = state.get("_non_persistent_buffers_set")
        if names is not None and (not isinstance(names, (set, frozenset, list, tuple))
                                  or not all(isinstance(n, str) for n in names)):
            raise ModelFileError(f"{where}: _non_persistent_buffers_set is not a set of names")
        key = id(rec)
        if key in on_path:
            raise ModelFileError(f"{where}: the module is its own ancestor (a cycle)")
        on_path.add(key)
        todo.append((None, key, depth))
        children = state.get("_modules") or {}
        for name, child in reversed(list(children.items())):
            if child is not None:
                if id(child) in on_path:
                    raise ModelFileError(f"module {brepr(f'{path}.{name}' if path else name)}: the "
                                         "module is its own ancestor (a cycle)")
                todo.append((child, f"{path}.{name}" if path else name, depth + 1))
        if expanded > 2 * sum(distinct.values()) + COPY_SLACK_BYTES:
            raise ModelFileError(
                f"{where}: modules shared by several parents list {expanded} bytes of tensors in the "
                f"state dict, for {sum(distinct.values())} distinct ones (at most twice plus "
                f"{COPY_SLACK_BYTES})")
    object.__setattr__(root, "_checked", True)   # records are never changed after reading
    return count


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
                raise ModelFileError(f"child module {brepr(prefix + name)} is not a module")
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
        raise ModelFileError(f"tensor {what} must be a tuple of ints, got {brepr(value)}")
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
    if len(size) > MAX_TENSOR_RANK:
        raise ModelFileError(f"tensor of rank {len(size)} (at most {MAX_TENSOR_RANK})")
    if not isinstance(offset, int) or offset < 0:
        raise ModelFileError(f"tensor storage offset must be a non-negative int, got {brepr(offset)}")
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
        budget = _COPY_BUDGET.get()
        if budget is not None:
            budget[0] -= n * item
            if budget[0] < 0:
                raise ModelFileError(
                    f"tensor (size {size}, stride {stride}) copies {n * item} bytes out of storage "
                    f"{storage.key} of {data.size * item}: the strided tensors of a file may copy "
                    f"at most twice its storages' bytes + {COPY_SLACK_BYTES}")
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
        raise ModelFileError(f"_rebuild_tensor_v3: dtype must be a torch dtype, got {brepr(dtype)}")
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


# ------------------------------------------------------------------------- the pre-scan
# Actions of the scan, by opcode (a table of 256 entries, built from pickletools' opcode list):
(_BAD, _SCALAR, _SCALAR_LEN, _SCALAR_LINES, _PUT, _GET, _MEMOIZE, _MARK, _FROM_MARK,
 _INTO_BELOW_MARK, _INTO, _POP, _POP_MARK, _DUP, _GENERIC, _STOP, _NOTHING) = range(17)


def _opcode_tables():
    """(action, fixed argument bytes, length-prefix width (negative: signed), lines, objects
    popped, objects pushed, name) per opcode byte, for ``scan_pickle``."""
    action, fixed, width, lines, popped, pushed = ([_BAD] * 256, [0] * 256, [0] * 256, [0] * 256,
                                                    [0] * 256, [0] * 256)
    names = ["?"] * 256
    special = {"BINPUT": _PUT, "LONG_BINPUT": _PUT, "PUT": _PUT, "BINGET": _GET,
               "LONG_BINGET": _GET, "GET": _GET, "MEMOIZE": _MEMOIZE, "MARK": _MARK,
               "TUPLE": _FROM_MARK, "LIST": _FROM_MARK, "DICT": _FROM_MARK,
               "FROZENSET": _FROM_MARK, "INST": _FROM_MARK, "OBJ": _FROM_MARK,
               "APPENDS": _INTO_BELOW_MARK, "SETITEMS": _INTO_BELOW_MARK,
               "ADDITEMS": _INTO_BELOW_MARK, "APPEND": _INTO, "BUILD": _INTO, "SETITEM": _INTO,
               "POP": _POP, "POP_MARK": _POP_MARK, "DUP": _DUP, "STOP": _STOP,
               "PROTO": _NOTHING, "FRAME": _NOTHING}
    for op in pickletools.opcodes:
        code = op.code.encode("latin-1")[0]
        names[code] = op.name
        arg = op.arg
        if arg is not None and arg.n >= 0:
            fixed[code] = arg.n
        elif arg is not None and arg.n == pickletools.UP_TO_NEWLINE:
            lines[code] = 2 if arg.name == "stringnl_noescape_pair" else 1
        elif arg is not None:
            w = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: -4,
                 pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}[arg.n]
            width[code] = w
        popped[code] = len(op.stack_before)
        pushed[code] = len(op.stack_after)
        if op.name in special:
            action[code] = special[op.name]
        elif (not op.stack_before and len(op.stack_after) == 1
              and op.name not in ("GLOBAL", "EXT1", "EXT2", "EXT4", "PERSID", "EMPTY_LIST",
                                  "EMPTY_DICT", "EMPTY_SET")):
            action[code] = _SCALAR_LEN if width[code] else _SCALAR_LINES if lines[code] else _SCALAR
        else:
            action[code] = _GENERIC
    return action, fixed, width, lines, popped, pushed, names


_ACTION, _FIXED, _WIDTH, _LINES, _POPPED, _PUSHED, _NAMES = _opcode_tables()
_ONE = (1, 1)   # the cell of every number, string and constant (nothing is added to those)


def _memo_index(text: bytes, fail) -> int:
    """The memo index of a protocol-0 PUT or GET (decimal text)."""
    try:
        return int(text)
    except ValueError:
        fail(f"memo index {text[:20]!r} is not a number")


def scan_pickle(data, pos: int, source: str, max_nodes: int | None = None,
                max_depth: int | None = None) -> int:
    """Check the pickle starting at ``data[pos]`` (bytes or an mmap) before it is unpickled:
    every opcode known and whole, every length inside the data, memo indices no larger than the
    position they are stored at (the unpickler's memo is an array that long), and the objects it
    builds within ``torch_max_pickle_nodes`` nodes counted as their expansion (each use of a
    shared object counts its whole size again) and ``torch_max_pickle_depth`` levels of nesting
    (``settings.current()``, unless given). This is what
    makes hashing, comparing and printing what the unpickler builds bounded work. Returns the
    position after the pickle's STOP; raises ``ModelFileError`` naming ``source``."""
    options = settings.current()
    max_nodes = options.torch_max_pickle_nodes if max_nodes is None else max_nodes
    max_depth = options.torch_max_pickle_depth if max_depth is None else max_depth
    action, fixed, width, lines, popped, pushed = _ACTION, _FIXED, _WIDTH, _LINES, _POPPED, _PUSHED
    end = len(data)
    stack: list = []        # one cell [size, depth] per object (the same cell for shared ones)
    append = stack.append
    marks: list = []
    memo: dict = {}
    total = 0

    def fail(what):
        raise ModelFileError(f"{source}: corrupt or hostile pickle: {what}")

    def too_big():
        fail(f"it builds objects of more than {max_nodes} nodes or nested more than {max_depth} "
             "deep once its shared references are expanded (the environment variables "
             "FASTLAYERS_TORCH_MAX_PICKLE_NODES and FASTLAYERS_TORCH_MAX_PICKLE_DEPTH raise the "
             "limits)")

    def collect(items):
        size, depth = 1, 0
        for item in items:
            size += item[0]
            if item[1] > depth:
                depth = item[1]
        return size, depth + 1

    def grow(cell, items):
        if type(cell) is not list:
            fail("an item is added to something that is not a container")
        size, depth = collect(items)
        cell[0] += size - 1
        if depth > cell[1]:
            cell[1] = depth
        if cell[0] > max_nodes or cell[1] > max_depth:
            too_big()

    try:
        while True:
            code = data[pos]
            pos += 1
            # the opcodes torch's pickles are made of, first (protocol 2); the rest by the table
            if code == 0x72 or code == 0x71:          # LONG_BINPUT, BINPUT
                if code == 0x71:
                    key = data[pos]
                    pos += 1
                else:
                    key = int.from_bytes(data[pos:pos + 4], "little")
                    pos += 4
                if not stack or key > pos:
                    fail(f"memo store of index {key} at byte {pos} (a pickler numbers its "
                         "objects in order, on a non-empty stack)")
                memo[key] = stack[-1]
                continue
            if code == 0x68 or code == 0x6A:          # BINGET, LONG_BINGET
                if code == 0x68:
                    key = data[pos]
                    pos += 1
                else:
                    key = int.from_bytes(data[pos:pos + 4], "little")
                    pos += 4
                cell = memo.get(key)
                if cell is None:
                    fail("a memo entry read before it is stored")
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
                continue
            if code == 0x4B or code == 0x29 or code == 0x89 or code == 0x88 or code == 0x4E:
                pos += code == 0x4B                   # BININT1; EMPTY_TUPLE, NEWFALSE/TRUE, NONE
                append(_ONE)
                total += 1
                continue
            if code == 0x58:                          # BINUNICODE
                pos += 4 + int.from_bytes(data[pos:pos + 4], "little")
                if pos > end:
                    fail("BINUNICODE runs past the end of the data")
                append(_ONE)
                total += 1
                continue
            if code == 0x28:                          # MARK
                marks.append(len(stack))
                continue
            if code == 0x7D or code == 0x5D:          # EMPTY_DICT, EMPTY_LIST (grown later)
                append([1, 1])
                total += 1
                continue
            if code == 0x74 or code == 0x75:          # TUPLE, SETITEMS: the items above the mark
                if not marks:
                    fail(f"{_NAMES[code]} without a mark")
                k = marks.pop()
                size, depth = 1, 0
                for item in stack[k:]:
                    size += item[0]
                    if item[1] > depth:
                        depth = item[1]
                del stack[k:]
                depth += 1
                if code == 0x74:
                    cell = [size, depth]
                    append(cell)
                    total += size
                else:
                    if not stack or type(stack[-1]) is not list:
                        fail("SETITEMS without a dict")
                    cell = stack[-1]
                    cell[0] += size - 1
                    if depth > cell[1]:
                        cell[1] = depth
                if cell[1] > max_depth or cell[0] > max_nodes or total > max_nodes:
                    too_big()
                continue
            if code == 0x52 or code == 0x85:          # REDUCE (callable, args), TUPLE1
                k = 2 if code == 0x52 else 1
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                if k == 2:
                    a, b = stack[-2], stack[-1]
                    del stack[-2:]
                    cell = [1 + a[0] + b[0], 1 + (a[1] if a[1] > b[1] else b[1])]
                else:
                    a = stack.pop()
                    cell = [1 + a[0], 1 + a[1]]
                if cell[1] > max_depth:
                    too_big()
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
                continue
            act = action[code]
            if act == _PUT:
                if not stack:
                    fail("a memo store on an empty stack")
                n = fixed[code]
                if n == 1:
                    key = data[pos]
                elif n:
                    key = int.from_bytes(data[pos:pos + n], "little")
                else:
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    key = _memo_index(bytes(data[pos:nl]), fail)
                    n = nl + 1 - pos
                pos += n
                if key > pos:   # the unpickler's memo is an array as long as the largest index
                    fail(f"memo index {key} at byte {pos}: a pickler numbers its objects in order")
                memo[key] = stack[-1]
            elif act == _SCALAR:
                pos += fixed[code]
                append(_ONE)
                total += 1
            elif act == _SCALAR_LEN:
                w = width[code]
                if w == 1:
                    n = data[pos]
                    pos += 1
                else:
                    n = int.from_bytes(data[pos:pos + abs(w)], "little", signed=w < 0)
                    pos += abs(w)
                    if n < 0:
                        fail(f"a negative length ({_NAMES[code]})")
                pos += n
                if pos > end:
                    fail(f"{_NAMES[code]} claims {n} bytes past the end of the data")
                append(_ONE)
                total += 1
            elif act == _GET:
                n = fixed[code]
                if n == 1:
                    key = data[pos]
                elif n:
                    key = int.from_bytes(data[pos:pos + n], "little")
                else:
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    key = _memo_index(bytes(data[pos:nl]), fail)
                    n = nl + 1 - pos
                pos += n
                cell = memo.get(key)
                if cell is None:
                    fail("a memo entry read before it is stored")
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
            elif act == _MARK:
                marks.append(len(stack))
            elif act == _FROM_MARK or act == _INTO_BELOW_MARK:
                if not marks:
                    fail(f"{_NAMES[code]} without a mark")
                k = marks.pop()
                items = stack[k:]
                del stack[k:]
                if act == _FROM_MARK:
                    for _ in range(lines[code]):
                        nl = data.find(b"\n", pos)
                        if nl < 0:
                            fail("a text argument without an end of line")
                        pos = nl + 1
                    size, depth = collect(items)
                    if depth > max_depth:
                        too_big()
                    append([size, depth])
                    total += size
                    if total > max_nodes:
                        too_big()
                else:
                    if not stack:
                        fail(f"{_NAMES[code]} without a container")
                    grow(stack[-1], items)
            elif act == _INTO:
                k = popped[code]
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                items = stack[-(k - 1):]
                del stack[-(k - 1):]
                grow(stack[-1], items)
            elif act == _GENERIC:
                k = popped[code]
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                pos += fixed[code]
                for _ in range(lines[code]):
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    pos = nl + 1
                if k:
                    items = stack[-k:]
                    del stack[-k:]
                else:
                    items = ()
                if pushed[code]:
                    size, depth = collect(items)
                    if depth > max_depth:
                        too_big()
                    append([size, depth])
                    total += size
                    if total > max_nodes:
                        too_big()
            elif act == _SCALAR_LINES:
                for _ in range(lines[code]):
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    pos = nl + 1
                append(_ONE)
                total += 1
            elif act == _MEMOIZE:
                if not stack:
                    fail("a memo store on an empty stack")
                if len(memo) > pos:
                    fail("more memo entries than bytes")
                memo[len(memo)] = stack[-1]
            elif act == _STOP:
                if pos > end:
                    break
                return pos
            elif act == _NOTHING:
                pos += fixed[code]
            elif act == _POP:
                if marks and marks[-1] == len(stack):
                    marks.pop()
                elif stack:
                    stack.pop()
                else:
                    fail("POP on an empty stack")
            elif act == _POP_MARK:
                if not marks:
                    fail("POP_MARK without a mark")
                del stack[marks.pop():]
            elif act == _DUP:
                if not stack:
                    fail("DUP on an empty stack")
                append(stack[-1])
                total += stack[-1][0]
                if total > max_nodes:
                    too_big()
            else:
                fail(f"unknown opcode {code:#04x} at byte {pos - 1}")
            if pos > end:
                break
    except IndexError:
        pass
    fail("it ends before its STOP opcode (truncated file?)")


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
        self._file = file
        self._storages: dict[str, Storage] = {}
        self._classes: dict[tuple[str, str], type] = {}
        self._budget = [COPY_SLACK_BYTES]

    def load(self):
        """The object of the pickle at the file's position, after ``scan_pickle`` has checked
        it (an in-memory ``io.BytesIO`` or a real file, read through an mmap)."""
        f = self._file
        if isinstance(f, io.BytesIO):
            scan_pickle(f.getvalue(), f.tell(), self.source)
        else:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ModelFileError(f"{self.source}: an empty file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                scan_pickle(view, f.tell(), self.source)
        token = _COPY_BUDGET.set(self._budget)
        try:
            return super().load()
        finally:
            _COPY_BUDGET.reset(token)

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
            raise ModelFileError(f"{self.source}: malformed persistent id {brepr(pid)}")
        if pid[0] == "module" and len(pid) >= 2 and isinstance(pid[1], type) and issubclass(pid[1], _Record):
            return pid[1]  # legacy format: ('module', class, source file, source)
        if pid[0] != "storage" or len(pid) < 5:
            raise ModelFileError(f"{self.source}: unsupported persistent id {brepr(pid)}")
        storage_type, key, _location, numel = pid[1:5]
        view = pid[5] if len(pid) > 5 else None
        if not (isinstance(storage_type, type) and issubclass(storage_type, StorageType)):
            raise ModelFileError(f"{self.source}: storage type must be a torch storage class, got "
                                 f"{brepr(storage_type)}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ModelFileError(f"{self.source}: malformed storage reference {brepr(pid)}")
        storage = self._storages.get(key)
        if storage is None or storage.array.dtype != storage_type.np_dtype:
            array = self.load_storage(storage_type, key, numel)
            storage = Storage(key, array, storage_type.torch_dtype)
            self._storages[key] = storage
            self._budget[0] += 2 * array.size * array.itemsize
        if view is not None:  # legacy: (view key, element offset, view size) into the root storage
            ok = (isinstance(view, tuple) and len(view) == 3 and isinstance(view[1], int)
                  and isinstance(view[2], int) and view[1] >= 0 and view[2] >= 0)
            if not ok or view[1] + view[2] > storage.array.size:
                raise ModelFileError(f"{self.source}: malformed storage view {brepr(view)}")
            _vkey, off, n = view
            return Storage(f"{key}[{off}:{off + n}]", storage.array[off:off + n], storage.torch_dtype)
        return storage
