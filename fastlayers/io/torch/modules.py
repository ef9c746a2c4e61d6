"""Whole pickled ``torch.nn`` modules (``torch.save(model)``) rebuilt as ``fastlayers.nn``
(``load_torch_module``, used by ``fastlayers.load``): the pickle read with its module classes as
records, the record tree checked, each record rebuilt by its class's creator
(``TORCH_MODULE_CREATORS``), then the weights loaded strictly from the tree's state dict.
"""

from __future__ import annotations

from ...errors import ModelFileError, ShapeError, StateDictError, UnsupportedError
from . import creators  # noqa: F401 - fills TORCH_MODULE_CREATORS with the torch.nn classes
from .archive import read_torch_pickle
from .records import TorchModuleRecord, UnknownGlobal, check_module_tree, is_module_like
from .registry import custom_module_classes, rebuild_tree


def load_torch_module(path):
    """Rebuild a whole pickled ``torch.nn`` module (``torch.save(model)``) as fastlayers.nn.

    Only the classes in ``TORCH_MODULE_CREATORS`` are rebuilt (the standard torch.nn classes
    fastlayers knows, and those registered with ``register_torch_module``), from their class
    references and pickled attributes; no code from the file runs and torch is not imported.

    Raises
    ------
    ModelFileError
        Unreadable, corrupt or refused file, or a file holding a state dict (weights only).
    UnsupportedError
        A class no creator is registered for (suggests registering one, or ONNX export).
    """
    where = str(path)
    obj = read_torch_pickle(path, unknown_globals="record", module_classes=custom_module_classes())
    if not is_module_like(obj):
        _reject_unknown(obj, where)
        if isinstance(obj, dict) and any(is_module_like(v) for v in obj.values()):
            names = [k for k, v in obj.items() if is_module_like(v)]
            raise ModelFileError(
                f"{where}: holds a dict whose entries {names[:5]} are modules; fastlayers.load reads "
                "a file holding one module (torch.save(model)); re-save that module alone, or port "
                "it to fastlayers.nn and use fastlayers.load_state_dict"
            )
        if isinstance(obj, dict):
            raise ModelFileError(
                f"{where}: holds a state dict (weights only), not a model: build the model with "
                "fastlayers.nn and load the weights with model.load_state_dict("
                "fastlayers.load_state_dict(path))"
            )
        raise ModelFileError(f"{where}: holds a {type(obj).__name__}, not a torch.nn module")
    try:
        check_module_tree(obj)
        _reject_unknown_attrs(obj, "")
        module = rebuild_tree(obj)
        module.load_state_dict(obj.state_dict(), strict=True)
    except (ModelFileError, UnsupportedError) as e:
        raise type(e)(f"{where}: {e}") from None
    except (StateDictError, ShapeError) as e:
        raise ModelFileError(f"{where}: the rebuilt module does not match the pickled weights: {str(e)[:1000]}") from e
    return module


def _reject_unknown(obj, where):
    """Refuse leftover unknown globals that are not custom modules (their value would be garbage)."""
    if isinstance(obj, type) and issubclass(obj, UnknownGlobal):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")
    if isinstance(obj, UnknownGlobal) and not is_module_like(obj):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")


def _reject_unknown_attrs(record, path):
    if isinstance(record, TorchModuleRecord):
        for name, value in record.attrs.items():
            if name in ("_modules",):
                continue
            _reject_unknown(value, f"module {path or '<root>'} attribute {name!r}")
        for name, child in record.children.items():
            _reject_unknown_attrs(child, f"{path}.{name}" if path else name)
