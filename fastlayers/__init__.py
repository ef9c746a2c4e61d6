"""fastlayers: CPU-first inference for the classic deep-learning layers.

Build models with Keras-style layers (``fastlayers.layers``), run them on numpy arrays through
compiled kernels, save and load them without TensorFlow or PyTorch.
"""

__version__ = "0.1.0"

from . import errors, layers
from .backends import get_num_threads, get_ops, set_num_threads, use_ops
from .graph import Input, Model, Sequential
from .io import load
from .io import load_state_dict

__all__ = [
    "Input", "Model", "Sequential", "errors", "get_num_threads", "get_ops", "layers", "load",
    "set_num_threads", "use_ops", "__version__",
]
__all__ += ["load_state_dict"]
