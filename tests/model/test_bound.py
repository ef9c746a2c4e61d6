"""Bound steps (``Layer.bind``, ``Model._run_bound``): a model binds its layers to an input
layout on its first call with it and runs the bound functions after; they give what the
layers' ``call`` gives, follow replaced weights and ``clear_derived``, and stay per layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastlayers
from fastlayers import layers, settings
from fastlayers.backends import derived, use_ops
from fastlayers.model import graph

from ..conftest import in_threads

DATA = Path(fastlayers.__file__).parent / "data"


def _models():
    """(name, model, input shape without the batch) for the layers that bind."""
    inp2, inp1 = fastlayers.Input((9, 7, 3)), fastlayers.Input((11, 4))
    yield (
        "conv2d",
        fastlayers.Model(
            inp2,
            layers.MaxPooling2D(2, padding="same")(
                layers.Conv2D(6, 3, strides=(2, 1), padding="same", activation="relu")(layers.Rescaling(0.5, 1.0)(inp2))
            ),
        ),
        (9, 7, 3),
    )
    yield (
        "conv2d_softmax_groups",
        fastlayers.Sequential(
            [
                fastlayers.Input((6, 6, 4)),
                layers.Conv2D(4, 3, groups=2, activation="softmax"),
                layers.AveragePooling2D(2),
                layers.GlobalAveragePooling2D(keepdims=True),
            ]
        ),
        (6, 6, 4),
    )
    yield (
        "winograd",
        fastlayers.Sequential(
            [fastlayers.Input((8, 8, 16)), layers.Conv2D(16, 3, padding="same"), layers.GlobalMaxPooling2D()]
        ),
        (8, 8, 16),
    )
    yield (
        "channels_first",
        fastlayers.Sequential(
            [
                fastlayers.Input((3, 8, 6)),
                layers.Conv2D(5, 3, data_format="channels_first"),
                layers.MaxPooling2D(2, data_format="channels_first"),
                layers.GlobalAveragePooling2D(data_format="channels_first"),
            ]
        ),
        (3, 8, 6),
    )
    h = layers.Conv1D(5, 3, padding="causal", dilation_rate=2)(inp1)
    h = layers.Add()([layers.Conv1D(5, 1)(inp1), h])
    h = layers.MaxPooling1D(2)(layers.Rescaling([1.0, 2.0, 0.5, -1.0, 3.0])(h))
    yield "conv1d_dag", fastlayers.Model(inp1, layers.GlobalAveragePooling1D()(h)), (11, 4)
    for name, shape in (("digits_cnn", (8, 8, 1)), ("digits_transformer", (8, 8)), ("digits_lstm", (8, 8))):
        yield name, fastlayers.load(DATA / f"{name}.flm", options=LAYER_PATH), shape


#: These tests are of the layer path: a graph holding a convolution, a recurrent layer or
#: attention otherwise runs compiled (model/plans.py, tests/model/test_plans.py); a loaded
#: model keeps its load options' choice for its calls.
LAYER_PATH = settings.LoadOptions(native_plans=False)
MODELS = list(_models())


@pytest.fixture(autouse=True)
def layer_path():
    with settings.applied(LAYER_PATH):
        yield


@pytest.mark.parametrize("name, model, shape", MODELS, ids=[m[0] for m in MODELS])
def test_bound_steps_match_the_layers_calls(name, model, shape, rng):
    """For several batch sizes and a strided input: the bound run equals the plain plan and
    the reference backend."""
    for batch in (1, 3, 1):
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        for xi in (x, np.flip(x, -1)):
            y = model(xi)
            np.testing.assert_array_equal(y, model._run_plan(xi))
            with use_ops("reference"):
                want = model(xi)
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert 1 <= len(model._bound) <= graph._MAX_BOUND


def test_convolutions_and_pooling_run_bound_functions(rng):
    model = fastlayers.Sequential(
        [
            fastlayers.Input((5, 5, 2)),
            layers.Rescaling(2.0),
            layers.Conv2D(3, 3),
            layers.MaxPooling2D(),
            layers.Flatten(),
        ]
    )
    model(rng.standard_normal((2, 5, 5, 2)).astype(np.float32))
    ((_, _, chain, _),) = model._bound.values()
    # a layer with nothing to bind (Flatten) runs its call
    assert [getattr(step, "__func__", None) for step in chain] == [None, None, None, layers.Flatten.call]


def test_replaced_weights_are_followed(rng):
    model = fastlayers.Sequential([fastlayers.Input((5, 5, 2)), layers.Conv2D(3, 3), layers.Rescaling(2.0)])
    conv = model.layers[0]
    x = rng.standard_normal((1, 5, 5, 2)).astype(np.float32)
    model(x)
    conv.set_weights([w * 2 for w in conv.get_weights()])
    np.testing.assert_array_equal(model(x), model._run_plan(x))
    conv.kernel = -conv.kernel  # assignment
    np.testing.assert_array_equal(model(x), model._run_plan(x))
    model.layers[1]._scale = np.float32(3.0)
    y = model(x)
    np.testing.assert_allclose(y, model._run_plan(x), rtol=1e-6)
    with use_ops("reference"):
        np.testing.assert_allclose(y, model(x), rtol=1e-4, atol=1e-5)


def test_in_place_edit_followed_after_clear_derived(rng):
    model = fastlayers.Sequential([fastlayers.Input((6, 6, 16)), layers.Conv2D(16, 3)])
    x = rng.standard_normal((1, 6, 6, 16)).astype(np.float32)
    before = model(x)
    model.layers[0].kernel[...] *= 2  # in place: needs clear_derived
    derived.clear_derived()
    np.testing.assert_allclose(model(x), 2 * before - model.layers[0].bias * 1, rtol=1e-4, atol=1e-4)


def test_layouts_beyond_the_limit_rebind(rng):
    model = fastlayers.Sequential([fastlayers.Input((None, 3)), layers.Conv1D(2, 2)])
    for steps in range(2, 4 + 2 * graph._MAX_BOUND):
        x = rng.standard_normal((1, steps, 3)).astype(np.float32)
        np.testing.assert_array_equal(model(x), model._run_plan(x))
    assert len(model._bound) <= graph._MAX_BOUND


def test_threads_with_different_layouts_share_a_model(rng):
    name, model, shape = MODELS[4]
    inputs = [rng.standard_normal((b, *shape)).astype(np.float32) for b in (1, 2, 3, 4)]
    want = [model._run_plan(x) for x in inputs]

    def work(i):
        with settings.applied(LAYER_PATH):
            for _ in range(30):
                np.testing.assert_array_equal(model(inputs[i]), want[i])

    in_threads(work, 4)
