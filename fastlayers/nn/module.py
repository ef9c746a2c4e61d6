"""Module: torch.nn.Module semantics over numpy arrays (parameters, buffers, state dicts)."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ..backends import using_threads
from ..errors import ShapeError, StateDictError
from ..model.placement import on_device

#: Counts the changes of any module's attributes, parameters, buffers or children
#: (``state_version``): what is compiled from modules (``nn/plans.py``) is rebuilt after one.
_STATE_VERSION = [0]
#: The number of ``forward`` traces running in any thread (``nn/tracing.py``), and the tracer
#: that calls of modules of one's own go through (``attach_tracer``).
TRACES = [0]
_TRACER: list = []


def attach_tracer(tracer) -> None:
    """Called by ``nn/tracing.py`` when it is imported (``nn/modules.py`` imports it): the
    object whose ``traced_args(args)``, ``module_call(m, args, kwargs)`` and
    ``compiled_call(m, args, kwargs)`` module calls go through while a trace runs and for
    classes of one's own (``Module.traceable``)."""
    _TRACER[:] = [tracer]


def state_version() -> int:
    """A number that changes whenever any module's attributes, parameters, buffers or children
    are set, deleted or loaded (writing into a parameter's array in place is not seen: call
    ``fastlayers.clear_derived()`` after such an edit, as for the kernels' derived weights)."""
    return _STATE_VERSION[0]


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` returns, as torch does."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def to_array(value: Any, like: np.ndarray | None = None) -> np.ndarray:
    """A state-dict value (numpy array, or anything with ``.numpy()``) as a numpy array,
    cast to the dtype of ``like`` when given."""
    if hasattr(value, "detach"):  # a torch tensor passed by a user who has torch
        value = value.detach().cpu().numpy()
    a = np.asarray(value)
    return a.astype(like.dtype, copy=False) if like is not None else a


class Module:
    """Base class of ``fastlayers.nn`` modules, with torch.nn.Module's API.

    numpy arrays assigned as attributes are parameters (float32), modules assigned as attributes
    are children, ``register_buffer`` adds buffers (running statistics); ``state_dict`` keys are
    the dotted attribute paths, exactly as torch names them, so torch checkpoints load key for key.
    Subclass it and write ``forward`` as in torch; calling the module calls ``forward``.
    Modules are always in inference mode: ``train()``/``eval()`` are accepted and change nothing.
    """

    #: Threads each call of this module uses (None: the process's count,
    #: ``fastlayers.set_num_threads``); ``fastlayers.LoadOptions(threads=...)`` sets it at load.
    num_threads: int | None = None
    #: Whether calls trace this class's ``forward`` into a compiled model (``nn/tracing.py``):
    #: the classes of one's own (unless one sets ``traceable = False`` in its body), not
    #: fastlayers' (whose forms are ``nn/plans.py``'s).
    traceable = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "traceable" not in cls.__dict__:
            cls.traceable = not cls.__module__.startswith("fastlayers.")

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", False)

    # ------------------------------------------------------------------------- attributes
    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        _STATE_VERSION[0] += 1
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            self.__dict__.pop(name, None)
            modules[name] = value
        elif name in buffers:
            buffers[name] = None if value is None else np.asarray(value)
        elif isinstance(value, np.ndarray):
            modules.pop(name, None)
            self.__dict__.pop(name, None)
            params[name] = value.astype(np.float32) if value.dtype.kind == "f" else value
        elif value is None and (name in params or name in modules):
            (params if name in params else modules)[name] = None
        else:
            params.pop(name, None)
            modules.pop(name, None)
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        for table in ("_parameters", "_buffers", "_modules"):
            d = self.__dict__.get(table)
            if d is not None and name in d:
                return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        _STATE_VERSION[0] += 1
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, value, persistent: bool = True) -> None:
        """Add a buffer (state that is not a parameter, e.g. running statistics)."""
        _STATE_VERSION[0] += 1
        self._parameters.pop(name, None)
        self.__dict__.pop(name, None)
        self._buffers[name] = None if value is None else np.asarray(value)
        if not persistent:
            self._non_persistent.add(name)

    def register_parameter(self, name: str, value) -> None:
        _STATE_VERSION[0] += 1
        self._buffers.pop(name, None)
        self.__dict__.pop(name, None)
        self._parameters[name] = None if value is None else np.asarray(value, np.float32)

    def add_module(self, name: str, module: Module | None) -> None:
        _STATE_VERSION[0] += 1
        self._modules[name] = module

    register_module = add_module

    # ------------------------------------------------------------------------- traversal
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for mod_prefix, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if p is not None:
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), p

    def parameters(self) -> Iterator[np.ndarray]:
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for mod_prefix, m in self.named_modules(prefix):
            for name, b in m._buffers.items():
                if b is not None:
                    yield (f"{mod_prefix}.{name}" if mod_prefix else name), b

    # ------------------------------------------------------------------------- state dicts
    def state_dict(self, prefix: str = "") -> OrderedDict:
        """Parameters and persistent buffers keyed as torch keys them (copies)."""
        out: OrderedDict = OrderedDict()
        self._collect_state(out, prefix)
        return out

    def _collect_state(self, out: OrderedDict, prefix: str) -> None:
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p.copy()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                out[prefix + name] = b.copy()
        for name, m in self.named_children():
            m._collect_state(out, f"{prefix}{name}.")

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False) -> IncompatibleKeys:
        """Copy parameters and buffers from ``state_dict`` (numpy arrays or torch tensors).

        As torch: with ``strict`` missing and unexpected keys raise ``StateDictError`` (a
        RuntimeError) listing them; a shape mismatch always raises ``ShapeError`` naming the key.
        Values are cast to each parameter's dtype (float32 for parameters).
        """
        slots = {}
        for mod_prefix, m in self.named_modules():
            base = f"{mod_prefix}." if mod_prefix else ""
            for table in (m._parameters, m._buffers):
                for name, cur in table.items():
                    if cur is not None and not (table is m._buffers and name in m._non_persistent):
                        slots[base + name] = (m, table, name, cur)
        missing = [k for k in slots if k not in state_dict]
        unexpected = [k for k in state_dict if k not in slots]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
            if unexpected:
                parts.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected))
            raise StateDictError(f"Error(s) in loading state_dict for {type(self).__name__}: " + ". ".join(parts) + ".")
        staged = []
        for key, (m, table, name, cur) in slots.items():
            if key not in state_dict:
                continue
            value = to_array(state_dict[key], cur)
            if value.shape != cur.shape:
                raise ShapeError(
                    f"size mismatch for {key}: copying a param with shape {value.shape} "
                    f"from checkpoint, the shape in current model is {cur.shape}"
                )
            staged.append((m, table, name, np.array(value, order="C", copy=True)))
        _STATE_VERSION[0] += 1
        for m, table, name, value in staged:  # all or nothing
            table[name] = value
        for m in {id(m): m for m, *_ in staged}.values():
            m._state_changed()
        return IncompatibleKeys(missing, unexpected)

    def _state_changed(self) -> None:
        """Hook for modules that derive constants from their parameters."""

    # ------------------------------------------------------------------------- copying
    def __reduce__(self):
        """Pickle by value: class names from ``fastlayers.nn``, their constructor arguments and
        the state dict (``fastlayers.pickling``); a subclass of its own (code) is refused."""
        from ..pickling import reduce_module  # deferred: pickling sits above the model classes

        return reduce_module(self)

    def __deepcopy__(self, memo):
        # the object graph, as Python copies any object (subclasses of one's own included):
        # only pickles go by value
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone

    def __copy__(self):
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    # ------------------------------------------------------------------------- running
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        if self.num_threads is not None:
            with using_threads(self.num_threads):
                return self._call(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args, kwargs):
        if (TRACES[0] or self.traceable) and _TRACER:
            tracer = _TRACER[0]
            if TRACES[0] and tracer.traced_args(args):  # inside a traced forward
                return tracer.module_call(self, args, kwargs)
            if self.traceable:
                out = tracer.compiled_call(self, args, kwargs)
                if out is not None:
                    return out
        return self.forward(*args, **kwargs)

    def eval(self) -> Module:
        return self

    def train(self, mode: bool = True) -> Module:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        return self

    def to(self, *args, **kwargs) -> Module:
        """Accepted for porting (``.to("cpu")``, ``.to(torch.float32)``): the module itself.

        ``.to("cuda")`` (or ``"cuda:0"``, ``torch.device("cuda")``, ``device="cuda"``) returns a
        wrapper whose calls run under ``use_ops("cuda")`` and return host numpy arrays.
        """
        device = kwargs.get("device", args[0] if args else None)
        return on_device(self, device, strict=False)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if not children:
            return lines[0] + ")"
        for name, m in children:
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"
