"""The layer registry and the Keras loader's creator table agree with the layer classes."""

from __future__ import annotations

import inspect

import fastlayers.layers as layers
from fastlayers.io.keras import keras_layers
from fastlayers.layers import LAYER_CLASSES


def test_registry_holds_every_public_layer_class():
    public = {
        name
        for name in layers.__all__
        if isinstance(getattr(layers, name), type)
        and issubclass(getattr(layers, name), layers.Layer)
        and name != "Layer"
    }
    assert set(LAYER_CLASSES) == public
    assert all(cls.__name__ == name for name, cls in LAYER_CLASSES.items())


def test_every_layer_class_has_the_keras_creator_of_its_name():
    """A layer class exported without its line in the creator table would not load from Keras
    files; each built-in creator builds the class of its name."""
    table = keras_layers()
    for name, cls in LAYER_CLASSES.items():
        assert name in table, f"{name} has no creator in io/keras/creators.py"
        assert table[name].layer_class is cls, name


def test_keras_creators_read_constructor_arguments():
    table = keras_layers()
    for name, cls in LAYER_CLASSES.items():
        params = inspect.signature(cls.__init__).parameters
        assert table[name].options <= set(params), (name, table[name].options - set(params))
        assert "dtype" not in table[name].options, name
