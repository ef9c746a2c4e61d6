"""fastlayers: CPU-first inference for the classic deep-learning layers.

Load models exported from Keras, PyTorch and ONNX (``fastlayers.load``), or build them with
Keras-style layers (``fastlayers.layers``) and torch-style modules (``fastlayers.nn``), and run
them on numpy arrays through compiled kernels, without TensorFlow, PyTorch or onnxruntime.
"""

from . import errors
from .version import __version__


def _check_built() -> None:
    """A source tree whose extension was never built fails here, at once, not at its first call
    (a file check: importing the extension itself waits for the first call that needs it)."""
    import os
    from importlib.machinery import EXTENSION_SUFFIXES

    here = os.path.dirname(__file__)
    if not any(os.path.exists(os.path.join(here, "native", "_core" + suffix)) for suffix in EXTENSION_SUFFIXES):
        raise ImportError(errors.native_core_missing(here))


_check_built()
# isort: off
from .backends import (  # noqa: E402
    get_idle_spin,
    get_num_threads,
    get_ops,
    set_idle_spin,
    set_num_threads,
    use_ops,
    using_threads,
)
from .io import load  # noqa: E402
from .settings import LoadOptions  # noqa: E402
# isort: on

#: The public API: what ``dir(fastlayers)`` lists.
__all__ = [
    "DEMO_DIR",
    "Input",
    "LoadOptions",
    "Model",
    "OnnxModel",
    "Sequential",
    "errors",
    "get_idle_spin",
    "get_num_threads",
    "get_ops",
    "layers",
    "load",
    "load_state_dict",
    "model_from_json",
    "nn",
    "register_keras_layer",
    "register_torch_module",
    "set_idle_spin",
    "set_num_threads",
    "settings",
    "use_ops",
    "using_threads",
    "__version__",
]

# Imported at first use, so that a process loading an ONNX file does not pay for importing every
# layer (docs/design.md, "Figures behind the code's constants"): name -> (modules to import in
# order, attribute of the last; None: the module).
_GRAPH = ("fastlayers.model.graph",)
_LAZY = {
    "layers": (("fastlayers.layers",), None),
    "nn": (("fastlayers.nn",), None),
    "Input": (_GRAPH, "Input"),
    "Model": (_GRAPH, "Model"),
    "Sequential": (_GRAPH, "Sequential"),
    "model_from_json": (_GRAPH, "model_from_json"),
    "load_state_dict": (("fastlayers.io",), "load_state_dict"),
    "register_torch_module": (("fastlayers.io",), "register_torch_module"),
    "register_keras_layer": (("fastlayers.io",), "register_keras_layer"),
    "OnnxModel": (("fastlayers.onnx",), "OnnxModel"),
    "settings": (("fastlayers.settings",), None),
    # the folder of the bundled demo models (digits_*.flm) and their samples
    "DEMO_DIR": (("fastlayers.cli",), "DATA"),
}


def __getattr__(name):
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'fastlayers' has no attribute {name!r}")
    modules, attribute = _LAZY[name]
    for module in modules:
        value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
