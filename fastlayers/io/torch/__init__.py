"""PyTorch files without torch: state dicts (``load_state_dict``) and whole ``nn.Sequential``
pickles (``load_torch_module``, used by ``fastlayers.load``).

Pickles are read by a restricted unpickler: nothing from the file is imported or run, and torch
is never imported. The modules, by subject:

- ``archive``: ``torch.save`` zip archives and legacy pickles -> the object they hold;
- ``unpickler``: the restricted unpickler and the globals it admits; ``scan``: the pre-scan that
  bounds what a pickle builds; ``records``: the inert records globals become, and the checks of
  a module record tree; ``tensors``: storages and tensor views as numpy arrays;
- ``state_dict``: ``load_state_dict`` (torch files, sharded checkpoints, safetensors);
- ``modules``: whole modules rebuilt as ``fastlayers.nn`` (``TORCH_MODULE_BUILDERS``).
"""

from .archive import is_torch_file, read_torch_pickle
from .modules import TORCH_MODULE_BUILDERS, from_attrs, has_param, load_torch_module, register_torch_module
from .state_dict import load_state_dict

__all__ = ["TORCH_MODULE_BUILDERS", "from_attrs", "has_param", "is_torch_file", "load_state_dict",
           "load_torch_module", "read_torch_pickle", "register_torch_module"]
