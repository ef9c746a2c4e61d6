"""Custom Keras layers read through ``register_keras_layer``: a Keras model with a layer class of
its own (registered with ``keras.saving.register_keras_serializable``), saved by Keras, loaded
after registering a fastlayers class for it and compared with Keras's predictions; and the errors
for an unregistered class and for bad registrations."""

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L
from fastlayers.errors import InputError, UnsupportedError
from fastlayers.io.keras import keras_layers, register_keras_layer

from ..conftest import assert_close


class Scale(L.Layer):
    """``x * w * factor + b`` over the last axis: the fastlayers twin of the Keras ``MyScale``
    below, named differently so that the weights are found under the Keras class's name."""

    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = float(factor)

    def build(self, input_shape):
        self.add_weight("w", (input_shape[-1],), "ones")
        self.add_weight("b", (input_shape[-1],), "zeros")

    def call(self, x):
        return self.ops.merge(self.ops.merge(x, self.w, "multiply", beta=self.factor), self.b, "add")


class RenamedScale(Scale):
    """The same layer with the factor under another constructor argument (for ``adapt``)."""

    def __init__(self, multiplier=1.0, **kwargs):
        super().__init__(factor=multiplier, **kwargs)


@pytest.fixture(scope="module")
def saved(keras, tmp_path_factory):
    """A Keras model with a MyScale layer between two Dense layers, saved as .keras and .h5, an
    input and Keras's output on it."""

    @keras.saving.register_keras_serializable(package="fastlayers_tests")
    class MyScale(keras.layers.Layer):
        def __init__(self, factor=1.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def build(self, input_shape):
            self.w = self.add_weight(name="w", shape=(input_shape[-1],), initializer="ones")
            self.b = self.add_weight(name="b", shape=(input_shape[-1],), initializer="zeros")

        def call(self, x):
            return x * self.w * self.factor + self.b

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    rng = np.random.default_rng(3)
    K = keras.layers
    x = keras.Input((5,))
    y = K.Dense(3)(MyScale(factor=0.5, name="scale")(K.Dense(4, activation="tanh")(x)))
    model = keras.Model(x, y)
    model.set_weights([rng.uniform(-1.5, 1.5, np.shape(w)).astype(np.float32) for w in model.get_weights()])
    root = tmp_path_factory.mktemp("keras_custom")
    files = {"keras": root / "custom.keras", "h5": root / "custom.h5"}
    model.save(files["keras"])
    model.save(files["h5"])
    data = rng.standard_normal((4, 5)).astype(np.float32)
    return files, data, np.asarray(model.predict(data, verbose=0))


@pytest.fixture
def registered():
    """Registrations made by a test, removed after it (the table is the process's)."""
    names = []

    def register(keras_class, layer_class, **parts):
        register_keras_layer(keras_class, layer_class, **parts)
        names.append(keras_class)

    yield register
    for name in names:
        keras_layers().pop(name, None)


@pytest.mark.parametrize("kind", ["keras", "h5"])
def test_registered_custom_layer_matches_keras(saved, registered, kind):
    files, data, expected = saved
    registered("MyScale", Scale)
    model = fastlayers.load(files[kind])
    layer = model.get_layer("scale")
    assert type(layer) is Scale and layer.factor == 0.5
    assert_close(model(data), expected, rtol=1e-5, atol=1e-6, what=f"MyScale from .{kind}")


def test_adapt_renames_a_config_key(saved, registered):
    files, data, expected = saved

    def factor_as_multiplier(kwargs, config, build):
        kwargs["multiplier"] = kwargs.pop("factor", 1.0)
        return kwargs

    registered("MyScale", RenamedScale, options=("factor",), adapt=factor_as_multiplier)
    model = fastlayers.load(files["keras"])
    assert type(model.get_layer("scale")) is RenamedScale
    assert_close(model(data), expected, rtol=1e-5, atol=1e-6, what="MyScale through adapt")


def test_unregistered_custom_layer_is_refused_by_name(saved, monkeypatch):
    files, _, _ = saved
    monkeypatch.delitem(keras_layers(), "MyScale", raising=False)
    for kind in ("keras", "h5"):
        # a legacy .h5 names the class by its registered name
        with pytest.raises(
            UnsupportedError,
            match=r"layer class '(fastlayers_tests>)?MyScale' is "
            r"not supported.*register_keras_layer",
        ):
            fastlayers.load(files[kind])


def test_a_config_key_the_registration_does_not_read_is_refused(saved, registered):
    files, _, _ = saved
    registered("MyScale", Scale, options=())
    with pytest.raises(
        UnsupportedError,
        match=r"'scale' \(MyScale\): option factor=0.5 is not "
        "supported",
    ):
        fastlayers.load(files["keras"])


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("MyScale", int), {}, "expected a subclass of fastlayers.layers.Layer, got <class 'int'>"),
        (("MyScale", L.Layer), {}, "expected a subclass of fastlayers.layers.Layer"),
        (
            ("MyScale", Scale),
            {"options": ("factor", "units")},
            r"options \['units'\] are not arguments of Scale's constructor",
        ),
        (("MyScale", Scale), {"options": (1,)}, "options must be config keys"),
        (("MyScale", Scale), {"adapt": "rename"}, "adapt must be callable"),
        (("MyScale", Scale), {"weight_groups": ()}, "weight_groups must be group paths"),
        (("MyScale", Scale), {"weight_groups": ("vars", "")}, "weight_groups must be group paths"),
        (("Lambda", Scale), {}, "Lambda layers carry Python code"),
        (("Sequential", Scale), {}, "Sequential is a model class"),
        (("my-scale", Scale), {}, "must be a class name"),
        ((None, Scale), {}, "must be a class name"),
    ],
)
def test_bad_registrations_name_the_class(args, kwargs, message):
    before = dict(keras_layers())
    with pytest.raises(InputError, match=message) as info:
        register_keras_layer(*args, **kwargs)
    assert str(info.value).startswith(f"register_keras_layer({args[0]!r}): ")
    assert keras_layers() == before


def test_registration_is_public_where_the_loaders_are():
    assert fastlayers.register_keras_layer is register_keras_layer
    assert fastlayers.io.register_keras_layer is register_keras_layer
    assert "register_keras_layer" in fastlayers.__all__
    assert "register_keras_layer" in fastlayers.io.__all__
