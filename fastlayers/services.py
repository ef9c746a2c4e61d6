"""Services that the model classes call and modules above them provide.

``graph.py`` (``Model.save``, ``load_weights``, ``get_config``, ``to_json``, ``model_from_json``,
pickling), ``nn/module.py`` and ``onnx/model.py`` (pickling) need functions of ``io/`` and
``pickling.py``, which sit above them and import them. Imports go one way, downward
(docs/architecture.md), so the dependency is inverted: each provider fills its slots here with
``@provides(name)`` when it is imported, and ``fastlayers/__init__`` imports every provider, so
all slots are filled once ``fastlayers`` is imported.
"""

from __future__ import annotations

from collections.abc import Callable

#: Slot name -> the module that fills it.
PROVIDERS = {
    "save_model": "fastlayers.io.native",
    "model_config": "fastlayers.io.native",
    "model_header": "fastlayers.io.native",
    "model_from_header": "fastlayers.io.native",
    "load_weights": "fastlayers.io.keras",
    "reduce_model": "fastlayers.pickling",
    "reduce_module": "fastlayers.pickling",
    "reduce_onnx": "fastlayers.pickling",
}

_provided: dict[str, Callable] = {}


def provides(name: str) -> Callable[[Callable], Callable]:
    """Decorator of a provider's function: it fills slot ``name``."""
    if name not in PROVIDERS:
        raise KeyError(f"no service slot {name!r}; the slots are {sorted(PROVIDERS)}")

    def fill(fn: Callable) -> Callable:
        _provided[name] = fn
        return fn

    return fill


def service(name: str) -> Callable:
    """The function in slot ``name``."""
    try:
        return _provided[name]
    except KeyError:
        raise RuntimeError(f"service {name!r} is provided by {PROVIDERS[name]}, which was not "
                           "imported (fastlayers/__init__ imports it)") from None
