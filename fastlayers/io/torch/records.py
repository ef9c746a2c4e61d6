"""The inert records a torch pickle becomes, and the checks of a module record tree.

The restricted unpickler (``unpickler.py``) answers a pickle's globals with record classes
defined here: storage types and dtypes (``StorageType``), ``torch.nn`` modules
(``TorchModuleRecord``, which keeps the pickled ``__dict__``), function references
(``TorchFunctionRef``) and other globals (``UnknownGlobal``). Records cannot be called (their
metaclass refuses), so a file can only instantiate them through ``NEWOBJ`` (inert ``__new__``)
and fill them through ``BUILD`` (``__setstate__``, which stores the state as data).
"""

from __future__ import annotations

import reprlib
from collections import OrderedDict
from typing import Any

import numpy as np

from ... import settings
from ...errors import ModelFileError

#: Strided (non-contiguous) tensors are copied out of their storage; all those of a file may
#: copy at most twice its storages' bytes plus this (a zero stride would otherwise let a tiny
#: storage expand into any size).
COPY_SLACK_BYTES = 16 << 20

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


#: What to do with a model fastlayers does not read from a pickle (the end of those errors).
ONNX_HINT = (
    "export the model to ONNX (torch.onnx.export) and load that, or port the class to "
    "fastlayers.nn (change the imports) and load its weights with "
    "fastlayers.load_state_dict"
)


class _NotCallable(type):
    """Metaclass of every record class: calling one (``REDUCE``, ``OBJ``, ``INST``) is refused,
    and so is setting its attributes (``BUILD`` with slot state on the class itself)."""

    def __call__(cls, *args, **kwargs):
        raise ModelFileError(
            f"refused to call {cls.global_name} while reading a pickle: fastlayers never runs code from a model file"
        )

    def __setattr__(cls, name, value):
        raise ModelFileError(f"refused to set {name!r} on {cls.global_name} while reading a pickle")


class Record(metaclass=_NotCallable):
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


class StorageType(Record):
    """A torch storage class or dtype: numpy element dtype plus the torch dtype name."""

    np_dtype: np.dtype = np.dtype(np.uint8)
    torch_dtype: str = "uint8"


def record_class(base: type, module: str, name: str, **attrs) -> type:
    """The record class standing for the global ``module.name``: a subclass of ``base`` with
    ``attrs`` as class attributes."""
    return _NotCallable(name, (base,), {"global_name": f"{module}.{name}", "__module__": __name__, **attrs})


class TorchModuleRecord(Record):
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

    @property
    def path(self) -> str:
        """Where the module sits in the tree being rebuilt (``"0.fc"``; ``""`` for the root)."""
        return self.__dict__.get("_path", "")

    def set_path(self, path: str) -> None:
        """Note where the module sits in the tree being rebuilt (``rebuild_module``)."""
        object.__setattr__(self, "_path", path)

    def argument(self, name: str):
        """The attribute ``name`` when it is what a constructor argument may be: None, a bool,
        number or short string, or a tuple or list of at most 8 of those; else
        ``ModelFileError`` naming the module and the attribute."""
        value = self[name]
        scalar = (type(None), bool, int, float, str)
        ok = isinstance(value, scalar) or (
            isinstance(value, (tuple, list)) and len(value) <= 8 and all(isinstance(v, scalar) for v in value)
        )
        if ok and isinstance(value, str) and len(value) > 64:
            ok = False
        if not ok:
            path = self.path
            raise ModelFileError(
                f"module {brepr(path) if path else '<root>'} ({self.torch_class}): "
                f"attribute {brepr(name)} is {brepr(value)}, not a constructor argument"
            )
        return value

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


class UnknownGlobal(Record):
    """A global outside the table, kept as an inert record when reading whole modules."""


class TorchFunctionRef(Record):
    """A reference to ``torch.nn.functional.<name>`` (never called)."""

    function_name = "?"


def is_module_like(obj) -> bool:
    """A torch module record, or an unknown class instance with a module's ``__dict__``."""
    return isinstance(obj, TorchModuleRecord) or (
        isinstance(obj, UnknownGlobal) and "_parameters" in obj.state and "_modules" in obj.state
    )


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
        if rec is None:  # leaving a module
            on_path.discard(path)
            continue
        where = f"module {brepr(path) if path else '<root>'}"
        count += 1
        if count > max_modules:
            raise ModelFileError(
                f"{where}: the module tree holds more than {max_modules} modules "
                "(modules shared by several parents count once per parent; the "
                "environment variable FASTLAYERS_TORCH_MAX_MODULES raises the limit)"
            )
        if depth > max_depth:
            raise ModelFileError(
                f"{where}: modules nested more than {max_depth} deep (the "
                "environment variable FASTLAYERS_TORCH_MAX_MODULE_DEPTH raises the limit)"
            )
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
                    raise ModelFileError(f"{where}: {field}[{brepr(name)}] is a {type(value).__name__}, not a tensor")
                if field != "_modules":
                    expanded += value.nbytes
                    distinct[id(value)] = value.nbytes
                if field == "_modules" and not is_module_like(value):
                    raise ModelFileError(f"{where}: child {brepr(name)} is a {type(value).__name__}, not a module")
        names = state.get("_non_persistent_buffers_set")
        if names is not None and (
            not isinstance(names, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in names)
        ):
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
                    raise ModelFileError(
                        f"module {brepr(f'{path}.{name}' if path else name)}: the module is its own ancestor (a cycle)"
                    )
                todo.append((child, f"{path}.{name}" if path else name, depth + 1))
        if expanded > 2 * sum(distinct.values()) + COPY_SLACK_BYTES:
            raise ModelFileError(
                f"{where}: modules shared by several parents list {expanded} bytes of tensors in the "
                f"state dict, for {sum(distinct.values())} distinct ones (at most twice plus "
                f"{COPY_SLACK_BYTES})"
            )
    object.__setattr__(root, "_checked", True)  # records are never changed after reading
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
