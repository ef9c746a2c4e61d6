"""Every fastlayers layer against the real Keras layer of the same name (Keras 3, torch backend).

Each comparison builds the Keras layer, calls it on a seeded float32 input, randomizes its
weights, then builds the fastlayers layer with the same constructor arguments, copies the Keras
weights in with ``set_weights`` and compares the outputs, under both CPU backends ("reference"
and "cpu", through the ``backend`` fixture). Torch cross-checks close the file for the ops torch
defines itself (gelu, log_softmax, layer norm).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as fl

from ..conftest import assert_close

ACTIVATIONS = [
    "linear",
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "gelu",
    "sigmoid",
    "hard_sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "softplus",
    "softsign",
    "swish",
    "silu",
    "exponential",
]
#: Keras 3's newer activations (reference numpy path on every CPU backend).
KERAS3_ACTIVATIONS = [
    "celu",
    "glu",
    "hard_silu",
    "hard_swish",
    "hard_tanh",
    "hard_shrink",
    "soft_shrink",
    "tanh_shrink",
    "log_sigmoid",
    "mish",
    "sparse_plus",
    "sparse_sigmoid",
    "squareplus",
    "sparsemax",
]
#: Each function's kinks and the values either side (±0.5 shrink thresholds, ±1 sparse_plus,
#: sparse_sigmoid and hard_tanh, ±3 hard_silu), zeros, and saturating values.
BREAK_POINTS = np.array(
    [
        -60.0,
        -20.0,
        -3.001,
        -3.0,
        -2.999,
        -1.001,
        -1.0,
        -0.999,
        -0.501,
        -0.5,
        -0.499,
        -1e-7,
        -0.0,
        0.0,
        1e-7,
        0.499,
        0.5,
        0.501,
        0.999,
        1.0,
        1.001,
        2.999,
        3.0,
        3.001,
        20.0,
        60.0,
    ],
    np.float32,
)
CENTER_SCALE = [(True, True), (False, True), (True, False), (False, False)]


# ------------------------------------------------------------------------------------ helpers
def to_numpy(keras, y):
    return np.asarray(keras.ops.convert_to_numpy(y))


def randomize_weights(layer, rng):
    """Standard-normal weights (positive moving_variance), so no weight is left at its default."""
    new = []
    for var in layer.weights:
        w = rng.standard_normal(tuple(var.shape)).astype("float32")
        if "moving_variance" in var.name:
            w = np.abs(w) + np.float32(0.1)
        new.append(w)
    layer.set_weights(new)


def keras_layer_output(keras, name, kwargs, x, rng, call_kwargs=None):
    """Build keras.layers.<name>(**kwargs) on x, randomize its weights; return (layer, output)."""
    layer = getattr(keras.layers, name)(**kwargs)
    call_kwargs = call_kwargs or {}
    layer(x, **call_kwargs)
    if layer.weights:
        randomize_weights(layer, rng)
    return layer, to_numpy(keras, layer(x, **call_kwargs))


def compare_layer(keras, rng, name, kwargs, x, *, call_kwargs=None):
    """keras.layers.<name> vs fastlayers.layers.<name>, same arguments and weights, on x."""
    k_layer, expected = keras_layer_output(keras, name, kwargs, x, rng, call_kwargs)
    f_layer = getattr(fl, name)(**kwargs)
    f_layer(x)
    f_layer.set_weights(k_layer.get_weights())
    assert [w.shape for w in f_layer.get_weights()] == [w.shape for w in k_layer.get_weights()]
    actual = f_layer(x)
    assert isinstance(actual, np.ndarray) and actual.dtype == np.float32
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    # the exact gelu is x/2 (1 + erf(x / sqrt 2)) in both engines: where erf is near -1 each
    # is off by a few float32 steps of 1 times |x|/2 (torch up to 1.1e-6 from float64 on
    # [-8, 8], fastlayers' rational erf up to 8.5e-7), so their difference may pass 1e-6
    atol = 2e-6 if kwargs.get("activation") == "gelu" else 1e-6
    # a sum's float32 rounding follows its terms' scale, not its own: an output near zero of a
    # 3x3x6 convolution whose outputs reach 28 was 2.2e-6 from the float64 sum here and 4.2e-6
    # in keras, so outputs near zero get 4 float32 steps of the largest magnitude
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    atol = max(atol, 4 * float(np.finfo(np.float32).eps) * scale)
    assert_close(actual, expected, atol=atol, what=f"{name}({kwargs})")
    return actual


def randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -------------------------------------------------------------------------------------- Dense
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("activation", [None, *ACTIVATIONS, "gelu_tanh"])
@pytest.mark.parametrize("shape", [(4, 7), (1, 1), (2, 3, 5)], ids=["2d", "batch1-width1", "3d"])
def test_dense(keras, backend, rng, shape, activation, use_bias):
    units = 1 if shape == (1, 1) else 6
    x = randn(rng, shape)
    if activation == "gelu_tanh":  # Keras has no such name: its Dense gets the same function
        k_act = lambda t: keras.activations.gelu(t, approximate=True)  # noqa: E731
    else:
        k_act = activation
    k_layer = keras.layers.Dense(units, activation=k_act, use_bias=use_bias)
    k_layer(x)
    randomize_weights(k_layer, rng)
    expected = to_numpy(keras, k_layer(x))
    f_layer = fl.Dense(units, activation=activation, use_bias=use_bias)
    f_layer(x)
    assert [w.shape for w in f_layer.get_weights()] == [w.shape for w in k_layer.get_weights()]
    f_layer.set_weights(k_layer.get_weights())
    actual = f_layer(x)
    assert actual.shape == expected.shape == (*shape[:-1], units)
    assert_close(actual, expected, what=f"Dense {activation}")


def test_dense_on_weights_the_cpu_backend_holds_packed(backend, rng):
    """Weights the cpu backend holds packed alone (``dense_weights``, as a loaded ONNX model
    keeps them) multiply as their array does on every backend: a model loaded on the cpu
    backend may be run on another."""
    ops = fastlayers.backends.get_ops()
    w = randn(rng, (256, 300))
    held = fastlayers.backends.get_ops("cpu").dense_weights(w)
    assert not isinstance(held, np.ndarray)
    x, b = randn(rng, (3, 256)), randn(rng, (300,))
    got = ops.to_host(ops.dense(ops.to_device(x), held, b, "relu"))
    assert_close(got, ops.to_host(ops.dense(ops.to_device(x), w, b, "relu")), what="dense on held weights")


# --------------------------------------------------------------------------------- Activation
@pytest.mark.parametrize("scale", [1.0, 10.0])
@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (2, 3, 5)], ids=["2d", "1x1", "3d"])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(keras, backend, rng, name, shape, scale):
    x = randn(rng, shape, scale)
    if name == "exponential":
        x = np.minimum(x, np.float32(80))  # stay finite in float32
    compare_layer(keras, rng, "Activation", {"activation": name}, x)


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_activation_gelu_tanh(keras, backend, rng, scale):
    x = randn(rng, (5, 9), scale)
    expected = to_numpy(keras, keras.activations.gelu(x, approximate=True))
    assert_close(fl.Activation("gelu_tanh")(x), expected)
    assert_close(fl.Activation("gelu_approximate")(x), expected)


def test_activation_special_values(keras, backend):
    """Zeros, exact kinks and values large enough to saturate each function."""
    x = np.array([[0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 6.0, 50.0, -50.0, 87.0, -87.0, 1e-30]], np.float32)
    for name in ACTIVATIONS:
        expected = to_numpy(keras, keras.layers.Activation(name)(x))
        assert_close(fl.Activation(name)(x), expected, what=name)


@pytest.mark.parametrize("name", [n for n in KERAS3_ACTIVATIONS if n != "sparsemax"])
def test_keras3_activation_around_break_points(keras, backend, rng, name):
    """As an Activation layer on the break points (rows of 2 and 26 values: glu halves the last
    axis) and as Dense's ``activation=``. Sparsemax: test_sparsemax_is_the_simplex_projection."""
    compare_layer(keras, rng, "Activation", {"activation": name}, BREAK_POINTS.reshape(13, 2))
    compare_layer(keras, rng, "Activation", {"activation": name}, BREAK_POINTS.reshape(1, 26))
    compare_layer(keras, rng, "Activation", {"activation": name}, randn(rng, (2, 3, 8), 2.0))
    x = randn(rng, (4, 5))
    k_layer = keras.layers.Dense(6, activation=name)
    k_layer(x)
    randomize_weights(k_layer, rng)
    f_layer = fl.Dense(6, activation=name)
    f_layer(x)
    f_layer.set_weights(k_layer.get_weights())
    assert_close(f_layer(x), to_numpy(keras, k_layer(x)), what=f"Dense {name}")


def test_sparsemax_is_the_simplex_projection(keras, backend, rng):
    """y = max(x - tau, 0) summing to 1 along the last axis (Martins & Astudillo, 2016): checked
    by its definition, and against Keras where Keras is right (one value in the support; its
    threshold is wrong for larger supports, keras-team/keras#23425)."""
    for x in (BREAK_POINTS.reshape(13, 2), BREAK_POINTS.reshape(2, 13), randn(rng, (3, 2, 8), 0.3)):
        y = fl.Activation("sparsemax")(x)
        assert np.all(y >= 0)
        assert_close(y.sum(axis=-1), np.ones(x.shape[:-1]), rtol=1e-6, atol=1e-6)
        tau = np.where(y > 0, x - y, np.nan)  # the same tau over the support, at most x elsewhere
        assert_close(np.nanmax(tau, -1), np.nanmin(tau, -1), atol=2e-6)
        assert np.all((y > 0) | (x <= np.nanmin(tau, -1, keepdims=True) + 1e-6))
    one_hot = np.array([[0.0, 2.0, -1.0, 0.5], [3.0, 1.0, 1.5, -2.0]], np.float32)
    assert_close(fl.Activation("sparsemax")(one_hot), to_numpy(keras, keras.activations.sparsemax(one_hot)))
    x = randn(rng, (4, 5))
    k_layer = keras.layers.Dense(6, activation="sparsemax")
    k_layer(x)
    f_layer = fl.Dense(6, activation="sparsemax")
    f_layer(x)
    f_layer.set_weights(k_layer.get_weights())
    linear = fl.Dense(6)
    linear(x)
    linear.set_weights(k_layer.get_weights())
    assert_close(f_layer(x), fl.Activation("sparsemax")(linear(x)))


def test_activation_threshold_and_odd_glu_are_refused(rng):
    from fastlayers.errors import ShapeError, UnsupportedError

    with pytest.raises(UnsupportedError, match="threshold"):
        fl.Activation("threshold")
    with pytest.raises(ShapeError, match="glu.*even size.*\\(2, 5\\)"):
        fl.Activation("glu")(randn(rng, (2, 5)))
    assert fl.Activation("glu").compute_output_shape((None, 3, 8)) == (None, 3, 4)


# --------------------------------------------------------------- parametrized activation layers
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"max_value": 6.0},
        {"max_value": 2.5},
        {"negative_slope": 0.1},
        {"threshold": 0.5},
        {"negative_slope": 0.2, "threshold": 0.5},
        {"max_value": 1.5, "negative_slope": 0.3},
        {"max_value": 1.0, "negative_slope": 0.1, "threshold": 0.25},
        {"max_value": 0.0},
    ],
    ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "default",
)
def test_relu(keras, backend, rng, kwargs):
    x = randn(rng, (4, 9), 2.0)
    compare_layer(keras, rng, "ReLU", kwargs, x)
    # values exactly at the threshold, the max and zero: Keras keeps x only where x > threshold
    edges = np.array([[0.0, 0.25, 0.5, 1.0, 1.5, 2.5, 6.0, -0.25]], np.float32)
    compare_layer(keras, rng, "ReLU", kwargs, edges)


@pytest.mark.parametrize("kwargs", [{}, {"negative_slope": 0.01}, {"negative_slope": 1.5}])
def test_leaky_relu(keras, backend, rng, kwargs):
    compare_layer(keras, rng, "LeakyReLU", kwargs, randn(rng, (3, 2, 5), 3.0))


@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.5}, {"alpha": 2.0}])
def test_elu(keras, backend, rng, kwargs):
    compare_layer(keras, rng, "ELU", kwargs, randn(rng, (3, 11), 3.0))


@pytest.mark.parametrize(
    "axis,shape",
    [
        (-1, (3, 7)),
        (1, (3, 7)),
        (-1, (2, 4, 5)),
        (1, (2, 4, 5)),
        ([1, 2], (2, 4, 5)),
        (-1, (1, 1)),
        (1, (2, 1, 5)),
        (-1, (2, 19)),
        (1, (2, 19, 3)),  # 19: the 8-wide max loop
    ],
    ids=str,
)
@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_softmax(keras, backend, rng, axis, shape, scale):
    compare_layer(keras, rng, "Softmax", {"axis": axis}, randn(rng, shape, scale))


# ------------------------------------------------------------------------------- reshaping
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1, 2, 1), (3, 5)], ids=str)
def test_flatten(keras, backend, rng, shape, data_format):
    compare_layer(keras, rng, "Flatten", {"data_format": data_format}, randn(rng, shape))


@pytest.mark.parametrize(
    "target,shape",
    [
        ((-1,), (2, 3, 4)),
        ((4, 3), (2, 3, 4)),
        ((-1, 4), (2, 3, 4)),
        ((2, -1, 3), (1, 3, 4)),
        ((1, -1), (3, 5)),
    ],
    ids=str,
)
def test_reshape(keras, backend, rng, target, shape):
    compare_layer(keras, rng, "Reshape", {"target_shape": target}, randn(rng, shape))


@pytest.mark.parametrize(
    "dims,shape",
    [
        ((2, 1), (2, 3, 4)),
        ((1, 2), (2, 3, 4)),
        ((3, 1, 2), (2, 3, 4, 5)),
        ((2, 3, 1), (1, 1, 4, 1)),
    ],
    ids=str,
)
def test_permute(keras, backend, rng, dims, shape):
    compare_layer(keras, rng, "Permute", {"dims": dims}, randn(rng, shape))


@pytest.mark.parametrize("n,shape", [(3, (2, 5)), (1, (1, 1)), (4, (1, 3))], ids=str)
def test_repeat_vector(keras, backend, rng, n, shape):
    compare_layer(keras, rng, "RepeatVector", {"n": n}, randn(rng, shape))


@pytest.mark.parametrize(
    "name,kwargs,shape",
    [
        ("Dropout", {"rate": 0.5}, (3, 7)),
        ("Dropout", {"rate": 0.0}, (2, 3, 4)),
        ("SpatialDropout1D", {"rate": 0.3}, (2, 5, 3)),
        ("SpatialDropout2D", {"rate": 0.3}, (2, 4, 5, 3)),
        ("SpatialDropout2D", {"rate": 0.3, "data_format": "channels_first"}, (1, 3, 4, 5)),
    ],
    ids=str,
)
def test_dropout_identity(keras, backend, rng, name, kwargs, shape):
    x = randn(rng, shape)
    actual = compare_layer(keras, rng, name, kwargs, x, call_kwargs={"training": False})
    np.testing.assert_array_equal(actual, x)


# --------------------------------------------------------------------------------- merging
@pytest.mark.parametrize("shape", [(3, 5), (1, 1), (2, 3, 4)], ids=str)
@pytest.mark.parametrize(
    "name,n_inputs",
    [
        (name, n)
        for name in ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum")
        for n in ((2,) if name == "Subtract" else (2, 3))  # Subtract takes exactly two inputs
    ],
)
def test_merge(keras, backend, rng, name, n_inputs, shape):
    xs = [randn(rng, shape) for _ in range(n_inputs)]
    compare_layer(keras, rng, name, {}, xs)


@pytest.mark.parametrize(
    "axis,shapes",
    [
        (-1, [(2, 3), (2, 5)]),
        (-1, [(2, 3, 1), (2, 3, 4), (2, 3, 2)]),
        (1, [(2, 3, 4), (2, 1, 4)]),
        (1, [(1, 2), (1, 1)]),
    ],
    ids=str,
)
def test_concatenate(keras, backend, rng, axis, shapes):
    compare_layer(keras, rng, "Concatenate", {"axis": axis}, [randn(rng, s) for s in shapes])


# --------------------------------------------------------------------------- normalization
@pytest.mark.parametrize("center,scale", CENTER_SCALE)
@pytest.mark.parametrize(
    "axis,shape,epsilon",
    [
        (-1, (4, 6), 1e-3),
        (-1, (2, 3, 4, 5), 1e-5),
        (1, (2, 3, 4, 5), 1e-3),
        (1, (1, 3, 1, 1), 0.1),
        (-1, (1, 1), 1e-3),
        (2, (2, 3, 4), 1e-3),
    ],
    ids=str,
)
def test_batch_normalization(keras, backend, rng, axis, shape, epsilon, center, scale):
    kwargs = {"axis": axis, "epsilon": epsilon, "center": center, "scale": scale}
    x = randn(rng, shape, 2.0)
    compare_layer(keras, rng, "BatchNormalization", kwargs, x, call_kwargs={"training": False})


@pytest.mark.parametrize("center,scale", CENTER_SCALE)
@pytest.mark.parametrize(
    "axis,shape,epsilon",
    [
        (-1, (4, 6), 1e-3),
        (-1, (2, 3, 8), 1e-5),
        ([1, 2], (2, 3, 8), 1e-3),
        (2, (2, 3, 8), 1e-3),
        (-1, (3, 1), 1e-3),
        ([-1], (1, 2, 5), 0.1),
    ],
    ids=str,
)
def test_layer_normalization(keras, backend, rng, axis, shape, epsilon, center, scale):
    kwargs = {"axis": axis, "epsilon": epsilon, "center": center, "scale": scale}
    x = randn(rng, shape, 3.0) + np.float32(1.5)  # a non-zero mean, so centering matters
    compare_layer(keras, rng, "LayerNormalization", kwargs, x)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("LayerNormalization", {"epsilon": 1e-3}),
        ("LayerNormalization", {"epsilon": 1e-3, "center": False, "scale": False}),
        ("RMSNormalization", {"epsilon": 1e-6}),
    ],
    ids=str,
)
def test_normalization_inner_axis(keras, backend, rng, name, kwargs):
    """axis=1 of a rank-3 input, checked against Keras's axis=-1 on the transposed input.

    Keras 3 on torch cannot run LayerNormalization/RMSNormalization(axis=1) on rank 3 itself: it
    hands the axis to torch.nn.functional.layer_norm/rms_norm, which only normalize trailing
    axes ("Given normalized_shape=[3], expected input with shape [*, 3]").
    """
    if not hasattr(keras.layers, name):
        pytest.skip(f"keras {keras.__version__} has no {name}")
    x = randn(rng, (2, 3, 8), 3.0) + np.float32(1.5)
    xt = np.ascontiguousarray(np.swapaxes(x, 1, 2))
    k_layer, expected_t = keras_layer_output(keras, name, {"axis": -1, **kwargs}, xt, rng)
    f_layer = getattr(fl, name)(axis=1, **kwargs)
    f_layer(x)
    f_layer.set_weights(k_layer.get_weights())
    assert_close(f_layer(x), np.swapaxes(expected_t, 1, 2))


@pytest.mark.parametrize(
    "axis,shape,epsilon",
    [
        (-1, (4, 6), 1e-6),
        (-1, (2, 3, 8), 1e-3),
        ([1, 2], (2, 3, 8), 1e-6),
        (2, (2, 3, 8), 1e-6),
        (-1, (1, 1), 1e-6),
    ],
    ids=str,
)
def test_rms_normalization(keras, backend, rng, axis, shape, epsilon):
    if not hasattr(keras.layers, "RMSNormalization"):
        pytest.skip(f"keras {keras.__version__} has no RMSNormalization")
    kwargs = {"axis": axis, "epsilon": epsilon}
    compare_layer(keras, rng, "RMSNormalization", kwargs, randn(rng, shape, 3.0))


# ------------------------------------------------------------------------ embedding, rescaling
@pytest.mark.parametrize("shape", [(3, 5), (1, 1), (4,), (2, 3, 2)], ids=str)
def test_embedding(keras, backend, rng, shape):
    ids = rng.integers(0, 11, size=shape).astype(np.int64)
    ids.flat[0] = 10  # the last row is used
    k_layer = keras.layers.Embedding(11, 4)
    k_layer(ids)
    randomize_weights(k_layer, rng)
    expected = to_numpy(keras, k_layer(ids))
    f_layer = fl.Embedding(11, 4)
    f_layer(ids)
    f_layer.set_weights(k_layer.get_weights())
    actual = f_layer(ids)
    assert actual.shape == expected.shape == (*shape, 4)
    np.testing.assert_array_equal(actual, expected)  # a lookup: bit-exact
    np.testing.assert_array_equal(f_layer(ids.astype(np.int32)), expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale": 1 / 255},
        {"scale": 2.0, "offset": -1.0},
        {"scale": 1 / 127.5, "offset": -1},
        {"scale": -0.5, "offset": 3.25},
    ],
    ids=str,
)
def test_rescaling(keras, backend, rng, kwargs):
    x = rng.uniform(0, 255, (2, 4, 4, 3)).astype(np.float32)
    compare_layer(keras, rng, "Rescaling", kwargs, x)


# ------------------------------------------------------------------------ padding, cropping
@pytest.mark.parametrize(
    "kwargs,shape",
    [
        ({}, (2, 5, 3)),
        ({"padding": 2}, (1, 1, 1)),
        ({"padding": (0, 3)}, (2, 4, 3)),
        ({"padding": (2, 1), "data_format": "channels_first"}, (2, 3, 5)),
    ],
    ids=str,
)
def test_zero_padding1d(keras, backend, rng, kwargs, shape):
    compare_layer(keras, rng, "ZeroPadding1D", kwargs, randn(rng, shape))


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        ({}, (2, 4, 5, 3)),
        ({"padding": 2}, (1, 1, 1, 1)),
        ({"padding": (1, 2)}, (2, 3, 4, 2)),
        ({"padding": ((0, 1), (2, 3))}, (2, 3, 4, 2)),
        ({"padding": ((1, 0), (0, 2)), "data_format": "channels_first"}, (2, 3, 4, 5)),
    ],
    ids=str,
)
def test_zero_padding2d(keras, backend, rng, kwargs, shape):
    compare_layer(keras, rng, "ZeroPadding2D", kwargs, randn(rng, shape))


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        ({}, (2, 5, 3)),
        ({"cropping": 2}, (1, 5, 1)),
        ({"cropping": (0, 3)}, (2, 4, 3)),
        ({"cropping": (2, 0)}, (2, 3, 2)),
    ],
    ids=str,
)
def test_cropping1d(keras, backend, rng, kwargs, shape):
    compare_layer(keras, rng, "Cropping1D", kwargs, randn(rng, shape))


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        ({}, (2, 4, 5, 3)),
        ({"cropping": 1}, (1, 3, 3, 1)),
        ({"cropping": (1, 2)}, (2, 4, 6, 2)),
        ({"cropping": ((0, 1), (2, 1))}, (2, 3, 4, 2)),
        ({"cropping": ((1, 0), (0, 2)), "data_format": "channels_first"}, (2, 3, 4, 5)),
    ],
    ids=str,
)
def test_cropping2d(keras, backend, rng, kwargs, shape):
    compare_layer(keras, rng, "Cropping2D", kwargs, randn(rng, shape))


# ---------------------------------------------------------------------------------- models
def _randomize_model(keras_model, rng):
    for layer in keras_model.layers:
        if layer.weights:
            randomize_weights(layer, rng)


def test_functional_model(keras, backend, rng):
    def build(lib, L):
        a = lib.Input(shape=(5,), name="a")
        b = lib.Input(shape=(3,), name="b")
        ha = L.Dense(8, activation="relu", name="dense_a")(a)
        hb = L.Dense(6, activation="tanh", name="dense_b")(b)
        h = L.Concatenate(name="concat")([ha, hb, b])
        h = L.BatchNormalization(name="bn")(h)
        out = L.Dense(4, activation="softmax", name="head")(h)
        return lib.Model([a, b], out)

    k_model = build(keras, keras.layers)
    _randomize_model(k_model, rng)
    xa, xb = randn(rng, (7, 5)), randn(rng, (7, 3))
    expected = to_numpy(keras, k_model([xa, xb], training=False))

    f_model = build(fastlayers, fl)
    k_weights = k_model.get_weights()
    assert [w.shape for w in f_model.get_weights()] == [w.shape for w in k_weights]
    f_model.set_weights(k_weights)
    for f_w, k_w in zip(f_model.get_weights(), k_weights):
        np.testing.assert_array_equal(f_w, k_w)
    # per model: a few chained ops, each within 1e-5
    assert_close(f_model([xa, xb]), expected, rtol=1e-4, atol=1e-6)
    assert_close(f_model.predict([xa, xb], batch_size=3), expected, rtol=1e-4, atol=1e-6)
    assert_close(f_model({"a": xa[:1], "b": xb[:1]}), expected[:1], rtol=1e-4, atol=1e-6)


def test_sequential_model(keras, backend, rng):
    def build(lib, L):
        return lib.Sequential(
            [
                lib.Input(shape=(4, 6)),
                L.Dense(8, activation="gelu"),
                L.LayerNormalization(),
                L.Flatten(),
                L.Dropout(0.5),
                L.Dense(10, activation="relu"),
                L.BatchNormalization(),
                L.Dense(3, activation="softmax"),
            ]
        )

    k_model = build(keras, keras.layers)
    _randomize_model(k_model, rng)
    x = randn(rng, (5, 4, 6))
    expected = to_numpy(keras, k_model(x, training=False))

    f_model = build(fastlayers, fl)
    k_weights = k_model.get_weights()
    assert [w.shape for w in f_model.get_weights()] == [w.shape for w in k_weights]
    f_model.set_weights(k_weights)
    # per model: a few chained ops, each within 1e-5
    assert_close(f_model(x), expected, rtol=1e-4, atol=1e-6)
    assert_close(f_model.predict(x, batch_size=2), expected, rtol=1e-4, atol=1e-6)
    assert_close(f_model(x[:1]), expected[:1], rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------- torch cross-checks
@pytest.mark.parametrize("scale", [1.0, 10.0])
@pytest.mark.parametrize("name,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_gelu_vs_torch(torch, backend, rng, name, approximate, scale):
    x = randn(rng, (6, 33), scale)
    expected = torch.nn.functional.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    assert_close(fl.Activation(name)(x), expected)
    dense = fl.Dense(33, activation=name)
    dense(x)
    eye = np.eye(33, dtype=np.float32)
    dense.set_weights([eye, np.zeros(33, np.float32)])  # the fused bias + activation path
    assert_close(dense(x), expected)


@pytest.mark.parametrize("scale", [1.0, 10.0, 100.0])
@pytest.mark.parametrize("shape", [(4, 9), (1, 1), (2, 3, 17)], ids=str)
def test_log_softmax_vs_torch(torch, backend, rng, shape, scale):
    x = randn(rng, shape, scale)
    expected = torch.log_softmax(torch.from_numpy(x), dim=-1).numpy()
    assert_close(fl.Activation("log_softmax")(x), expected)
    expected_sm = torch.softmax(torch.from_numpy(x), dim=-1).numpy()
    assert_close(fl.Softmax()(x), expected_sm)


@pytest.mark.parametrize("axis,shape", [(-1, (4, 16)), (-1, (2, 3, 7)), ([1, 2], (2, 3, 7)), (-1, (3, 1))], ids=str)
@pytest.mark.parametrize("epsilon", [1e-5, 1e-3])
def test_layer_norm_vs_torch(torch, backend, rng, axis, shape, epsilon):
    x = randn(rng, shape, 3.0) + np.float32(2.0)
    layer = fl.LayerNormalization(axis=axis, epsilon=epsilon)
    layer(x)
    norm_shape = shape[1:] if isinstance(axis, list) else shape[-1:]
    gamma, beta = randn(rng, norm_shape), randn(rng, norm_shape)
    layer.set_weights([gamma, beta])
    expected = torch.nn.functional.layer_norm(
        torch.from_numpy(x), norm_shape, torch.from_numpy(gamma), torch.from_numpy(beta), eps=epsilon
    ).numpy()
    assert_close(layer(x), expected)
