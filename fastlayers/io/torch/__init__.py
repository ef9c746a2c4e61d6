"""PyTorch files without torch: state dicts (``load_state_dict``) and whole ``nn.Sequential``
pickles (``load_torch_module``, used by ``fastlayers.load``).

Pickles are read by a restricted unpickler: nothing from the file is imported or run, and torch
is never imported. The modules, by subject:

- ``archive``: ``torch.save`` zip archives and legacy pickles -> the object they hold;
- ``unpickler``: the restricted unpickler and the globals it admits; ``scan``: the pre-scan that
  bounds what a pickle builds; ``records``: the inert records globals become, and the checks of
  a module record tree; ``tensors``: storages and tensor views as numpy arrays;
- ``state_dict``: ``load_state_dict`` (torch files, sharded checkpoints, safetensors);
- ``registry``: one creator per torch module class (``TORCH_MODULE_CREATORS``) and the rebuild
  of a record tree through them; ``checks``: the record checks; ``creators``: the creators of
  the torch.nn classes; ``modules``: ``load_torch_module``.
"""

from .archive import is_torch_file, read_torch_pickle
from .checks import RecordCheck
from .creators import from_attrs, has_param
from .modules import load_torch_module
from .registry import TORCH_MODULE_CREATORS, TorchModuleCreator, register_torch_module
from .state_dict import load_state_dict

__all__ = [
    "TORCH_MODULE_CREATORS",
    "RecordCheck",
    "TorchModuleCreator",
    "from_attrs",
    "has_param",
    "is_torch_file",
    "load_state_dict",
    "load_torch_module",
    "read_torch_pickle",
    "register_torch_module",
]
