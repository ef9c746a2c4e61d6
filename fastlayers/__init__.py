"""fastlayers: CPU-first inference for the classic deep-learning layers.

Build models with Keras-style layers (``fastlayers.layers``), run them on numpy arrays through
compiled kernels, save and load them without TensorFlow or PyTorch.
"""

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES

from . import errors
from .version import __version__

# A source tree whose extension was never built fails here, at once, not at its first call
# (a file check: importing the extension itself waits for the first call that needs it).
if not any(os.path.exists(os.path.join(os.path.dirname(__file__), "native", "_core" + suffix))
           for suffix in EXTENSION_SUFFIXES):
    raise ImportError(errors.native_core_missing(os.path.dirname(__file__)))
from .backends import get_num_threads, get_ops, set_num_threads, use_ops
from .io import load
# io.native, io.keras and pickling fill the slots of services.py that Model, nn.Module and
# OnnxModel call (save, load_weights, pickling): imported here, so every slot is filled.
from . import pickling as _pickling  # noqa: E402, F401
from .io import keras as _keras_io, native as _native_io  # noqa: E402, F401

__all__ = [
    "DEMO_DIR", "Input", "Model", "Sequential", "errors", "get_num_threads", "get_ops", "layers",
    "load", "load_state_dict", "model_from_json", "set_num_threads", "use_ops", "__version__",
]

# Imported at first use, so that a process loading an ONNX file does not import every layer
# (about 8 ms): name -> (modules to import in order, attribute of the last; None: the module).
_GRAPH = ("fastlayers.graph",)
_LAZY = {"layers": (("fastlayers.layers",), None), "graph": (_GRAPH, None),
         "nn": (("fastlayers.nn",), None), "Input": (_GRAPH, "Input"), "Model": (_GRAPH, "Model"),
         "Sequential": (_GRAPH, "Sequential"), "model_from_json": (_GRAPH, "model_from_json"),
         "load_state_dict": (("fastlayers.io",), "load_state_dict"),
         # the folder of the bundled demo models (digits_*.flm) and their samples
         "DEMO_DIR": (("fastlayers.cli",), "DATA")}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'fastlayers' has no attribute {name!r}")
    modules, attribute = _LAZY[name]
    for module in modules:
        value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
