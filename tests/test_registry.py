"""The layer registry and the Keras loader's option table agree with the layer classes."""

from __future__ import annotations

import inspect

import fastlayers.layers as layers
from fastlayers.io.keras import KERAS_OPTIONS
from fastlayers.layers import LAYER_CLASSES


def test_registry_holds_every_public_layer_class():
    public = {name for name in layers.__all__ if isinstance(getattr(layers, name), type)
              and issubclass(getattr(layers, name), layers.Layer) and name != "Layer"}
    assert set(LAYER_CLASSES) == public
    assert all(cls.__name__ == name for name, cls in LAYER_CLASSES.items())


def test_keras_options_are_constructor_arguments():
    assert set(KERAS_OPTIONS) <= set(LAYER_CLASSES)
    for name, options in KERAS_OPTIONS.items():
        params = inspect.signature(LAYER_CLASSES[name].__init__).parameters
        assert set(options) <= set(params), (name, set(options) - set(params))
