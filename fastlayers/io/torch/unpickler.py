"""A restricted unpickler for the pickles inside PyTorch files, without torch.

``pickle`` runs code named by the file: every ``GLOBAL`` opcode imports a module attribute and
``REDUCE`` calls it. This unpickler never imports anything from a file. ``find_class`` answers
from a fixed table of our own stand-ins:

- tensor rebuild functions (``torch._utils._rebuild_tensor_v2`` ...) -> functions that build
  numpy arrays from storages (``tensors.py``);
- storage types (``torch.FloatStorage`` ...) and dtypes (``torch.float32`` ...) -> inert records
  (``records.py``);
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
``UnsupportedError``), except the custom module classes a creator is registered for
(``module_classes``), which become inert ``TorchModuleRecord`` classes too. No code from a file
ever runs.
"""

from __future__ import annotations

import _compat_pickle
import io
import mmap
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Collection

from ...errors import ModelFileError
from .records import (
    COPY_SLACK_BYTES,
    Record,
    StorageType,
    TorchFunctionRef,
    TorchModuleRecord,
    UnknownGlobal,
    brepr,
    record_class,
)
from .scan import scan_pickle
from .tensors import (
    COPY_BUDGET,
    STORAGE_TYPES,
    TORCH_DTYPES,
    Storage,
    rebuild_parameter,
    rebuild_tensor,
    rebuild_tensor_v2,
    rebuild_tensor_v3,
)


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


_FUNCTIONS: dict[tuple[str, str], _Admitted] = {
    key: _Admitted(".".join(key), fn)
    for key, fn in {
        ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): rebuild_tensor,
        ("torch._utils", "_rebuild_tensor_v3"): rebuild_tensor_v3,
        ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("torch", "Size"): _size,
        ("torch", "device"): _device,
    }.items()
}

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
    or ``"record"`` (inert ``UnknownGlobal`` classes, refused when called). With ``"record"``,
    the globals named in ``module_classes`` (``"module.Class"``) are module records.
    """

    def __init__(
        self,
        file,
        source: str,
        load_storage: Callable | None = None,
        unknown_globals: str = "refuse",
        module_classes: Collection[str] = (),
    ):
        super().__init__(file)
        self.source = source
        self.load_storage = load_storage
        self.unknown_globals = unknown_globals
        self.module_classes = frozenset(module_classes)
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
        token = COPY_BUDGET.set(self._budget)
        try:
            return super().load()
        finally:
            COPY_BUDGET.reset(token)

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
            return record_class(StorageType, module, name, np_dtype=np_dtype, torch_dtype=torch_dtype)
        if module == "torch" and name in TORCH_DTYPES:
            np_dtype, torch_dtype = TORCH_DTYPES[name]
            return record_class(StorageType, module, name, np_dtype=np_dtype, torch_dtype=torch_dtype)
        if module.startswith("torch.nn.modules.") and _is_identifier_path(module, name) and name[:1].isupper():
            return record_class(TorchModuleRecord, module, name, torch_class=f"{module}.{name}")
        if module in ("torch.nn.functional", "torch._C._nn") and name.isidentifier() and not name.startswith("_"):
            return record_class(TorchFunctionRef, module, name, function_name=name)
        if self.unknown_globals == "record" and _is_identifier_path(module, name):
            if f"{module}.{name}" in self.module_classes:  # a custom class a creator is registered for
                return record_class(TorchModuleRecord, module, name, torch_class=f"{module}.{name}")
            return record_class(UnknownGlobal, module, name)
        raise ModelFileError(
            f"{self.source}: refused global {module}.{name}: a state-dict pickle may "
            "only reference tensor rebuild functions, storage types, dtypes, "
            "OrderedDict and torch.nn classes; fastlayers never runs code from a file"
        )

    def persistent_load(self, pid):
        if self.load_storage is None:
            raise ModelFileError(f"{self.source}: unexpected persistent id in a plain pickle")
        if not isinstance(pid, tuple) or not pid:
            raise ModelFileError(f"{self.source}: malformed persistent id {brepr(pid)}")
        if pid[0] == "module" and len(pid) >= 2 and isinstance(pid[1], type) and issubclass(pid[1], Record):
            return pid[1]  # legacy format: ('module', class, source file, source)
        if pid[0] != "storage" or len(pid) < 5:
            raise ModelFileError(f"{self.source}: unsupported persistent id {brepr(pid)}")
        storage_type, key, _location, numel = pid[1:5]
        view = pid[5] if len(pid) > 5 else None
        if not (isinstance(storage_type, type) and issubclass(storage_type, StorageType)):
            raise ModelFileError(
                f"{self.source}: storage type must be a torch storage class, got {brepr(storage_type)}"
            )
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ModelFileError(f"{self.source}: malformed storage reference {brepr(pid)}")
        storage = self._storages.get(key)
        if storage is None or storage.array.dtype != storage_type.np_dtype:
            array = self.load_storage(storage_type, key, numel)
            storage = Storage(key, array, storage_type.torch_dtype)
            self._storages[key] = storage
            self._budget[0] += 2 * array.size * array.itemsize
        if view is not None:  # legacy: (view key, element offset, view size) into the root storage
            ok = (
                isinstance(view, tuple)
                and len(view) == 3
                and isinstance(view[1], int)
                and isinstance(view[2], int)
                and view[1] >= 0
                and view[2] >= 0
            )
            if not ok or view[1] + view[2] > storage.array.size:
                raise ModelFileError(f"{self.source}: malformed storage view {brepr(view)}")
            _vkey, off, n = view
            return Storage(f"{key}[{off}:{off + n}]", storage.array[off : off + n], storage.torch_dtype)
        return storage
