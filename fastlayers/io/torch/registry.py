"""The table of torch module creators and the rebuild of a module record tree through it.

One creator per torch.nn class (``TORCH_MODULE_CREATORS``, filled by ``creators.py`` and
``register_torch_module``): its ``check`` validates the pickled record, then its ``build``
returns the ``fastlayers.nn`` module. The weights are loaded afterwards, strictly, from the
record tree's state dict (``modules.py``), so a builder that makes the wrong structure fails
with the missing or unexpected keys.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import FastlayersError, ModelFileError, UnsupportedError
from .checks import RecordCheck
from .records import ONNX_HINT, TorchModuleRecord, UnknownGlobal


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


#: torch.nn class name -> its creator. Adding a class is one entry, e.g. ``"Conv2d":
#: TorchModuleCreator(from_attrs("Conv2d", "in_channels", ..., bias=has_param("bias")),
#: checks.conv(2, False))`` (``creators.py``); see ``register_torch_module``.
TORCH_MODULE_CREATORS: dict[str, TorchModuleCreator] = {}


def register_torch_module(torch_name: str, builder: Callable, check: Callable | None = None) -> None:
    """Map the torch.nn class ``torch_name`` (e.g. ``"Conv2d"``) to ``builder(record)``, after
    ``check(RecordCheck(record, path))`` where one is given."""
    TORCH_MODULE_CREATORS[torch_name] = TorchModuleCreator(builder, check)


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
            f"torch.nn class; fastlayers rebuilds only torch.nn classes from a pickle without "
            f"running its code: {ONNX_HINT}")
    if not isinstance(record, TorchModuleRecord):
        raise ModelFileError(f"module {path or '<root>'} is a {type(record).__name__}, not a module")
    creator = TORCH_MODULE_CREATORS.get(record.class_name)
    if creator is None or not record.torch_class.startswith("torch.nn.modules."):
        raise UnsupportedError(f"module {path or '<root>'}: {record.torch_class} is not supported by "
                               f"fastlayers.load yet; {ONNX_HINT}")
    memo = _REBUILT.get()
    if memo is not None and id(record) in memo:   # a module shared by several parents, as torch
        return memo[id(record)][1]
    record.set_path(path)
    try:
        module = _without_initial_weights(creator.create(record, path))
        if memo is not None:
            memo[id(record)] = (record, module)
        return module
    except FastlayersError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, MemoryError, OverflowError) as e:
        raise ModelFileError(f"module {path or '<root>'} ({record.torch_class}): cannot rebuild from "
                             f"the pickled attributes ({type(e).__name__}: {str(e)[:200]})") from e


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
