"""The table of torch module creators and the rebuild of a module record tree through it.

One creator per torch module class (``TORCH_MODULE_CREATORS``, filled by ``creators.py`` and
``register_torch_module``): its ``check`` validates the pickled record, then its ``build``
returns the ``fastlayers.nn`` module. The weights are loaded afterwards, strictly, from the
record tree's state dict (``modules.py``), so a builder that makes the wrong structure fails
with the missing or unexpected keys.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import FastlayersError, InputError, ModelFileError, UnsupportedError
from .checks import RecordCheck
from .records import ONNX_HINT, TorchModuleRecord, UnknownGlobal, brepr


@dataclass(frozen=True)
class TorchModuleCreator:
    """How one torch module class becomes a ``fastlayers.nn`` module.

    ``check(RecordCheck(record, path))`` reads the pickled record's attributes and tensors and
    refuses what the module could not hold (None: no check); then ``build(record)`` returns the
    module, its weights not loaded yet: it passes constructor arguments read from the pickled
    attributes (``record["in_features"]``, ``record.get("eps", 1e-5)``,
    ``record.has_param("bias")``); containers also rebuild their children (``rebuild_module``).
    """

    build: Callable[[TorchModuleRecord], Any]
    check: Callable[[RecordCheck], object] | None = None

    def create(self, record: TorchModuleRecord, path: str):
        """The module for ``record``: checked, then built."""
        if self.check is not None:
            self.check(RecordCheck(record, path))
        return self.build(record)


#: Torch module class -> its creator: a torch.nn class by its name (``"Linear"``), a custom class
#: by its module and name as pickled (``"mypackage.blocks.Scale"``). Adding a torch.nn class is
#: one entry, e.g. ``"Conv2d": TorchModuleCreator(from_attrs("Conv2d", "in_channels", ...,
#: bias=has_param("bias")), checks.conv(2, False))`` (``creators.py``); users add theirs with
#: ``register_torch_module``.
TORCH_MODULE_CREATORS: dict[str, TorchModuleCreator] = {}


def register_torch_module(torch_name: str, builder: Callable, check: Callable | None = None) -> None:
    """Register how ``fastlayers.load`` rebuilds a torch module class from a pickled module.

    ``fastlayers.load`` reads a ``torch.save(model)`` file without running its code: each module
    in it is a record of its class name and pickled attributes, rebuilt as a ``fastlayers.nn``
    module by the creator registered for its class, then the weights are loaded strictly from
    the file's state dict. fastlayers registers the standard torch.nn classes it rebuilds;
    register a custom ``nn.Module`` subclass (or another torch.nn class) with the
    ``fastlayers.nn`` module that computes the same: a custom class is refused until it is
    registered. A later registration of the same name replaces the earlier one.

    Parameters
    ----------
    torch_name : str
        A torch.nn class name (``"Hardswish"``), or a custom class's module and name as the
        pickle names it (``"mypackage.blocks.Scale"``; ``"__main__.Scale"`` for a class defined
        in the script that saved the model): the name fastlayers' error for an unregistered
        class gives.
    builder : callable
        ``builder(record)`` returns the ``fastlayers.nn.Module``, its weights not loaded yet.
        ``record`` holds the pickled instance: ``record["features"]`` (an attribute set in the
        torch module's ``__init__``; a missing one fails the load with a ``ModelFileError``
        naming the module), ``record.get(name, default)``, ``record.argument(name)`` (the attribute, refused unless it is None, a
        bool, number, short string or a short tuple of those), ``record.has_param(name)``,
        ``record.children`` (the child records; ``fastlayers.io.torch.registry.rebuild_module``
        rebuilds one). The module's state dict must have the torch module's keys and shapes.
    check : callable, optional
        ``check(c)``, called before ``builder`` with a ``fastlayers.io.torch.RecordCheck``:
        reads attributes with their types and ranges (``c.int("features", 1)``) and the
        record's own tensors (``c.tensors({"scale": (n,)})``), and raises ``ModelFileError``
        naming the module and the attribute for a file that does not fit. Without one the
        builder gets the record unchecked.

    Raises
    ------
    InputError
        ``torch_name`` is not a class name or a dotted module path and class name (a torch.nn
        class given with its module path included), or ``builder`` or ``check`` is not a
        function of one argument.

    Examples
    --------
    A custom torch module, ``mypackage.blocks.Scale`` (its ``__init__(self, features)`` sets
    ``self.features = features`` and ``self.weight = torch.nn.Parameter(torch.ones(features))``;
    its ``forward`` returns ``x * self.weight``), and the same computation in fastlayers.nn:

    >>> import numpy as np
    >>> import fastlayers
    >>> import fastlayers.nn as nn
    >>> class Scale(nn.Module):
    ...     def __init__(self, features):
    ...         super().__init__()
    ...         self.weight = np.ones(features, np.float32)
    ...
    ...     def forward(self, x):
    ...         return x * self.weight
    >>> fastlayers.register_torch_module(
    ...     "mypackage.blocks.Scale", lambda record: Scale(record["features"]),
    ...     check=lambda c: c.tensors({"weight": (c.int("features", 1),)}))

    ``fastlayers.load("model.pt")`` then rebuilds a saved ``torch.nn.Sequential`` holding
    ``Scale`` modules, with their weights.
    """
    parts = torch_name.split(".") if isinstance(torch_name, str) else [""]
    if not all(part.isidentifier() for part in parts):
        raise InputError(
            f"register_torch_module: {brepr(torch_name)} is neither a torch.nn class name "
            "('Hardswish') nor a custom class's module and name ('mypackage.blocks.Scale')"
        )
    if parts[0] == "torch":
        raise InputError(
            f"register_torch_module: {torch_name} is a torch class: register it by its class name, {parts[-1]!r}"
        )
    _takes_one_argument(torch_name, "builder", builder)
    if check is not None:
        _takes_one_argument(torch_name, "check", check)
    TORCH_MODULE_CREATORS[torch_name] = TorchModuleCreator(builder, check)


def _takes_one_argument(torch_name: str, role: str, function) -> None:
    """Refuse a builder or check that cannot be called with one argument, naming the class."""
    if not callable(function):
        raise InputError(f"register_torch_module({torch_name!r}): the {role} {brepr(function)} is not callable")
    try:
        inspect.signature(function).bind(None)
    except TypeError:
        raise InputError(
            f"register_torch_module({torch_name!r}): the {role} {brepr(function)} does not take one argument"
        ) from None
    except ValueError:  # no signature to read (some builtins): the call will tell
        pass


def custom_module_classes() -> frozenset[str]:
    """The custom classes a creator is registered for (``"module.Class"``): the unpickler makes
    module records of them."""
    return frozenset(name for name in TORCH_MODULE_CREATORS if "." in name)


#: Modules rebuilt so far in this load, by record (a record several parents share is rebuilt
#: once, and its module shared, as torch shares it): id -> (record, module).
_REBUILT: contextvars.ContextVar = contextvars.ContextVar("torch_rebuilt", default=None)


def rebuild_tree(root):
    """The fastlayers.nn module for a whole ``TorchModuleRecord`` tree, weights not loaded yet:
    ``rebuild_module`` with one memo for the tree."""
    token = _REBUILT.set({})
    try:
        return rebuild_module(root)
    finally:
        _REBUILT.reset(token)


def rebuild_module(record, path: str = ""):
    """The fastlayers.nn module for a ``TorchModuleRecord`` tree, weights not loaded yet."""
    if isinstance(record, UnknownGlobal):
        raise UnsupportedError(
            f"module {path or '<root>'} is an instance of {record.global_name}, not a standard "
            f"torch.nn class; fastlayers rebuilds a custom class from a pickle, without running "
            f"its code, once a creator is registered for it (fastlayers.register_torch_module("
            f"{record.global_name!r}, builder)); or {ONNX_HINT}"
        )
    if not isinstance(record, TorchModuleRecord):
        raise ModelFileError(f"module {path or '<root>'} is a {type(record).__name__}, not a module")
    torch_nn = record.torch_class.startswith("torch.nn.modules.")
    name = record.class_name if torch_nn else record.torch_class
    creator = TORCH_MODULE_CREATORS.get(name)
    if creator is None:
        raise UnsupportedError(
            f"module {path or '<root>'}: {record.torch_class} is not supported by "
            f"fastlayers.load yet (fastlayers.register_torch_module({name!r}, "
            f"builder) adds it); {ONNX_HINT}"
        )
    memo = _REBUILT.get()
    if memo is not None and id(record) in memo:  # a module shared by several parents, as torch
        return memo[id(record)][1]
    record.set_path(path)
    try:
        module = creator.create(record, path)
        from ... import nn

        if not isinstance(module, nn.Module):
            raise InputError(
                f"module {path or '<root>'}: the builder registered for {name!r} returned "
                f"a {type(module).__name__}, not a fastlayers.nn.Module"
            )
        module = _without_initial_weights(module)
        if memo is not None:
            memo[id(record)] = (record, module)
        return module
    except FastlayersError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, MemoryError, OverflowError) as e:
        raise ModelFileError(
            f"module {path or '<root>'} ({record.torch_class}): cannot rebuild from "
            f"the pickled attributes ({type(e).__name__}: {str(e)[:200]})"
        ) from e


def _without_initial_weights(module):
    """``module`` with the weights its constructor drew replaced by empty stand-ins of the
    same shape and dtype (``load_state_dict`` copies the file's over them): a module being
    rebuilt never holds its random initial weights beside the file's and their copies."""
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, value in table.items():
                if isinstance(value, np.ndarray) and value.strides != (0,) * value.ndim:
                    table[name] = np.broadcast_to(np.zeros((), value.dtype), value.shape)
    return module
