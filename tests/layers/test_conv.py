"""Convolution and pooling layers against Keras 3 (torch backend): same arguments, same weights.

Shapes are small and odd on purpose (7x9 images, batch 1, height or width 1, stride larger than
the kernel, dilation with stride); both data formats; both CPU backends.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as fl
from fastlayers.errors import InputError, ShapeError, UnsupportedError

from ..conftest import assert_close
from .test_keras import compare_layer, randn

FORMATS = ["channels_last", "channels_first"]


def image(rng, shape_nhwc, data_format):
    x = randn(rng, shape_nhwc)
    return np.ascontiguousarray(np.moveaxis(x, -1, 1)) if data_format == "channels_first" else x


# ------------------------------------------------------------------------------- convolution
CONV2D = [
    dict(filters=4, kernel_size=3),
    dict(filters=4, kernel_size=3, padding="same"),
    dict(filters=3, kernel_size=(3, 2), strides=2, padding="same", activation="relu"),
    dict(filters=5, kernel_size=2, strides=(2, 3), padding="same"),  # asymmetric same
    dict(filters=4, kernel_size=1, strides=4),  # stride > kernel
    dict(filters=4, kernel_size=1, use_bias=False),  # 1x1 as GEMM
    dict(filters=6, kernel_size=3, dilation_rate=2, padding="same", activation="gelu"),
    dict(filters=6, kernel_size=3, groups=3, activation="sigmoid"),
    dict(filters=4, kernel_size=(1, 3), groups=2, padding="same", activation="tanh"),
]


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("kwargs", CONV2D, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_conv2d(keras, backend, rng, kwargs, data_format):
    compare_layer(keras, rng, "Conv2D", {**kwargs, "data_format": data_format}, image(rng, (2, 7, 9, 6), data_format))


def test_conv2d_on_weights_the_cpu_backend_holds_packed(backend, rng):
    """Weights the cpu backend holds packed alone (``conv_weights``, as a loaded ONNX model
    keeps them) convolve as their array does on every backend: a model loaded on the cpu
    backend may be run on another."""
    ops = fastlayers.backends.get_ops()
    w = randn(rng, (3, 3, 6, 5))
    held = fastlayers.backends.get_ops("cpu").conv_weights(w)
    assert not isinstance(held, np.ndarray)
    x, b = randn(rng, (2, 7, 6, 6)), randn(rng, (5,))
    args = (b, (1, 2), ((1, 1), (0, 1)), (1, 1), 1, "relu")
    got = ops.to_host(ops.conv2d(ops.to_device(x), held, *args))
    assert_close(got, ops.to_host(ops.conv2d(ops.to_device(x), w, *args)), what="conv2d on held weights")


@pytest.mark.parametrize("shape", [(1, 1, 9, 6), (1, 7, 1, 6), (1, 3, 3, 6)], ids=["h1", "w1", "3x3"])
def test_conv2d_edges(keras, backend, rng, shape):
    kernel = (1, 3) if shape[1] == 1 else (3, 1) if shape[2] == 1 else 3
    compare_layer(
        keras, rng, "Conv2D", dict(filters=2, kernel_size=kernel, padding="same", strides=2), randn(rng, shape)
    )


CONV1D = [
    dict(filters=4, kernel_size=3),
    dict(filters=4, kernel_size=3, padding="same", strides=2),
    dict(filters=4, kernel_size=3, padding="causal", dilation_rate=2, activation="relu"),
    dict(filters=4, kernel_size=2, strides=3, use_bias=False),
    dict(filters=6, kernel_size=3, groups=2, padding="same"),
]


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("kwargs", CONV1D, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_conv1d(keras, backend, rng, kwargs, data_format):
    x = randn(rng, (2, 11, 4))
    if kwargs.get("padding") == "causal" and data_format == "channels_first":
        # Keras refuses causal padding with channels_first: compare with our channels_last layer
        last = fl.Conv1D(**kwargs)
        last(x)
        first = fl.Conv1D(**kwargs, data_format=data_format)
        xf = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        first(xf)
        first.set_weights(last.get_weights())
        assert_close(first(xf), np.moveaxis(last(x), -1, 1))
        return
    if data_format == "channels_first":
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    compare_layer(keras, rng, "Conv1D", {**kwargs, "data_format": data_format}, x)


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kernel_size=3),
        dict(kernel_size=3, padding="same", strides=2, activation="relu6"),
        dict(kernel_size=(2, 3), depth_multiplier=3, padding="same"),
        dict(kernel_size=3, dilation_rate=2, use_bias=False),
    ],
    ids=str,
)
def test_depthwise_conv2d(keras, backend, rng, kwargs, data_format):
    compare_layer(
        keras, rng, "DepthwiseConv2D", {**kwargs, "data_format": data_format}, image(rng, (2, 7, 9, 5), data_format)
    )


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(filters=4, kernel_size=3),
        dict(filters=3, kernel_size=3, strides=2, padding="same", depth_multiplier=2, activation="relu"),
        dict(filters=4, kernel_size=2, use_bias=False, dilation_rate=2),
    ],
    ids=str,
)
def test_separable_conv2d(keras, backend, rng, kwargs, data_format):
    compare_layer(
        keras, rng, "SeparableConv2D", {**kwargs, "data_format": data_format}, image(rng, (2, 7, 9, 5), data_format)
    )


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(filters=3, kernel_size=3),
        dict(filters=3, kernel_size=3, strides=2),
        dict(filters=3, kernel_size=3, strides=2, padding="same"),
        dict(filters=3, kernel_size=2, strides=2, padding="same"),
        dict(filters=3, kernel_size=(3, 2), strides=(2, 3), padding="valid", activation="relu"),
        dict(filters=2, kernel_size=3, strides=2, output_padding=1),
        dict(filters=2, kernel_size=3, strides=3, padding="same", output_padding=(2, 1)),
        dict(filters=2, kernel_size=1, strides=3),
        dict(filters=2, kernel_size=3, dilation_rate=2, use_bias=False),
        dict(filters=2, kernel_size=3, dilation_rate=2, padding="same"),
    ],
    ids=str,
)
def test_conv2d_transpose(keras, backend, rng, kwargs, data_format):
    compare_layer(
        keras, rng, "Conv2DTranspose", {**kwargs, "data_format": data_format}, image(rng, (2, 5, 4, 3), data_format)
    )


# ----------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("name", ["MaxPooling2D", "AveragePooling2D"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(pool_size=2),
        dict(pool_size=3, strides=2),
        dict(pool_size=3, strides=2, padding="same"),
        dict(pool_size=(2, 3), strides=(3, 1), padding="same"),
        dict(pool_size=1, strides=3),
    ],
    ids=str,
)
def test_pooling2d(keras, backend, rng, name, kwargs, data_format):
    x = image(rng, (2, 7, 9, 4), data_format)
    if name == "AveragePooling2D" and kwargs.get("padding") == "same":
        # Keras's torch backend pads asymmetric "same" average pooling by replicating edges
        # (counting them); TensorFlow and JAX Keras, and fastlayers, average the cells inside
        # the input only. Check against a brute-force TF-semantics average.
        layer = getattr(fl, name)(**kwargs, data_format=data_format)
        xl = np.moveaxis(x, 1, -1) if data_format == "channels_first" else x
        expected = brute_avg_pool_same(xl, layer.pool_size, layer.strides)
        y = layer(x)
        assert_close(np.moveaxis(y, 1, -1) if data_format == "channels_first" else y, expected)
        return
    compare_layer(keras, rng, name, {**kwargs, "data_format": data_format}, x)


def brute_avg_pool_same(x_nhwc, pool, strides):
    """TensorFlow's SAME average pooling, one window at a time: the mean of the cells inside x."""
    n, h, w, c = x_nhwc.shape
    ho, wo = -(-h // strides[0]), -(-w // strides[1])
    top = max((ho - 1) * strides[0] + pool[0] - h, 0) // 2
    left = max((wo - 1) * strides[1] + pool[1] - w, 0) // 2
    y = np.zeros((n, ho, wo, c), np.float64)
    for i in range(ho):
        for j in range(wo):
            r0, c0 = i * strides[0] - top, j * strides[1] - left
            win = x_nhwc[:, max(r0, 0) : r0 + pool[0], max(c0, 0) : c0 + pool[1]]
            y[:, i, j] = win.mean(axis=(1, 2))
    return y


@pytest.mark.parametrize("name", ["MaxPooling1D", "AveragePooling1D"])
@pytest.mark.parametrize(
    "kwargs", [dict(pool_size=2), dict(pool_size=3, strides=2, padding="same"), dict(pool_size=2, strides=3)], ids=str
)
def test_pooling1d(keras, backend, rng, name, kwargs):
    compare_layer(keras, rng, name, kwargs, randn(rng, (2, 11, 3)))
    compare_layer(keras, rng, name, {**kwargs, "data_format": "channels_first"}, randn(rng, (1, 3, 11)))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize(
    "name", ["GlobalMaxPooling1D", "GlobalAveragePooling1D", "GlobalMaxPooling2D", "GlobalAveragePooling2D"]
)
def test_global_pooling(keras, backend, rng, name, data_format, keepdims):
    shape = (2, 5, 3) if name.endswith("1D") else (2, 5, 4, 3)
    compare_layer(keras, rng, name, dict(data_format=data_format, keepdims=keepdims), randn(rng, shape))


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(size=(3, 2)), dict(interpolation="bilinear"), dict(size=(2, 3), interpolation="bilinear")],
    ids=str,
)
def test_upsampling2d(keras, backend, rng, kwargs, data_format):
    compare_layer(
        keras, rng, "UpSampling2D", {**kwargs, "data_format": data_format}, image(rng, (2, 3, 5, 2), data_format)
    )


# ------------------------------------------------------------------------------------ errors
def test_groups_must_divide_channels():
    layer = fl.Conv2D(4, 3, groups=4)
    with pytest.raises(ShapeError, match="groups=4 does not divide the 6 input channels"):
        layer(np.zeros((1, 5, 5, 6), np.float32))
    with pytest.raises(InputError, match="multiple of groups"):
        fl.Conv2D(5, 3, groups=2)


def test_bad_options_and_shapes():
    with pytest.raises(InputError, match="padding"):
        fl.Conv2D(2, 3, padding="causal")
    with pytest.raises(UnsupportedError, match="interpolation"):
        fl.UpSampling2D(interpolation="bicubic")
    with pytest.raises(ShapeError, match="expected an input of rank 4"):
        fl.Conv2D(2, 3)(np.zeros((1, 5, 5), np.float32))
    with pytest.raises(ShapeError, match="smaller than the"):
        fl.Conv2D(2, 5)(np.zeros((1, 3, 3, 1), np.float32))
    with pytest.raises(ShapeError, match="smaller than the pool"):
        fl.MaxPooling2D(4)(np.zeros((1, 3, 3, 1), np.float32))


def test_explicit_asymmetric_padding_matches_zero_padding(backend, rng):
    x = randn(rng, (2, 6, 7, 3))
    conv = fl.Conv2D(4, 3, strides=2, padding=((1, 2), (0, 3)), activation="relu")
    y = conv(x)
    ref = fl.Conv2D(4, 3, strides=2, activation="relu")
    ref(np.pad(x, ((0, 0), (1, 2), (0, 3), (0, 0))))
    ref.set_weights(conv.get_weights())
    assert_close(y, ref(np.pad(x, ((0, 0), (1, 2), (0, 3), (0, 0)))))


# ------------------------------------------------------------------------------------ blocks
def test_inception_block_equals_keras_graph(keras, backend, rng):
    x = randn(rng, (2, 7, 6, 5))
    kl = keras.layers
    inp = keras.Input((7, 6, 5))
    b1 = kl.Conv2D(3, 1, activation="relu")(inp)
    b2 = kl.Conv2D(4, 3, padding="same", activation="relu")(kl.Conv2D(2, 1, activation="relu")(inp))
    b3 = kl.Conv2D(3, 5, padding="same", activation="relu")(kl.Conv2D(2, 1, activation="relu")(inp))
    b4 = kl.Conv2D(2, 1, activation="relu")(kl.MaxPooling2D(3, 1, padding="same")(inp))
    km = keras.Model(inp, kl.Concatenate()([b1, b2, b3, b4]))
    convs = [layer for layer in km.layers if isinstance(layer, kl.Conv2D)]
    order = [b1, b2, b3, b4]
    weights = {}
    for layer in convs:
        layer.set_weights([randn(rng, tuple(w.shape), 0.5) for w in layer.weights])
        weights[layer.name] = layer.get_weights()
    by_output = {id(layer.output): layer for layer in convs}
    b2_conv, b3_conv = by_output[id(b2)], by_output[id(b3)]
    ordered = [
        by_output[id(b1)],
        b2_conv._inbound_nodes[0].parent_nodes[0].operation,
        b2_conv,
        b3_conv._inbound_nodes[0].parent_nodes[0].operation,
        b3_conv,
        by_output[id(b4)],
    ]
    del order
    block = fl.InceptionBlock(3, 2, 4, 2, 3, 2)
    block(x)
    block.set_weights([w for layer in ordered for w in layer.get_weights()])
    expected = np.asarray(keras.ops.convert_to_numpy(km(x)))
    assert_close(block(x), expected, rtol=1e-4, atol=1e-5)
    xf = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    first = fl.InceptionBlock(3, 2, 4, 2, 3, 2, data_format="channels_first")
    first(xf)
    first.set_weights(block.get_weights())
    assert_close(first(xf), np.moveaxis(expected, -1, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("global_pool", [True, False])
def test_nin_block_equals_keras_graph(keras, backend, rng, global_pool):
    x = randn(rng, (2, 9, 8, 3))
    kl = keras.layers
    layers = [
        kl.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
        kl.Conv2D(5, 1, activation="relu"),
        kl.Conv2D(6, 1, activation="relu"),
    ]
    if global_pool:
        layers.append(kl.GlobalAveragePooling2D())
    km = keras.Sequential([keras.Input((9, 8, 3)), *layers])
    for layer in layers[:3]:
        layer.set_weights([randn(rng, tuple(w.shape), 0.5) for w in layer.weights])
    block = fl.NiNBlock(4, 3, strides=2, padding="same", mlp_filters=[5, 6], global_pool=global_pool)
    block(x)
    block.set_weights([w for layer in layers[:3] for w in layer.get_weights()])
    assert_close(block(x), np.asarray(keras.ops.convert_to_numpy(km(x))), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- lrn and roi pooling
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("radius,bias,alpha,beta", [(2, 1.0, 1e-4, 0.75), (1, 2.0, 0.1, 0.5), (0, 1.0, 1.0, 1.0)])
def test_local_response_normalization_matches_torch(torch, backend, rng, data_format, radius, bias, alpha, beta):
    x = randn(rng, (2, 6, 3, 7), 2.0)  # NHWC with 7 channels
    size = 2 * radius + 1
    expected = torch.nn.functional.local_response_norm(
        torch.from_numpy(np.moveaxis(x, -1, 1).copy()), size, alpha * size, beta, bias
    ).numpy()
    layer = fl.LocalResponseNormalization(radius, bias, alpha, beta, data_format=data_format)
    if data_format == "channels_first":
        assert_close(layer(np.moveaxis(x, -1, 1).copy()), expected)
    else:
        assert_close(layer(x), np.moveaxis(expected, 1, -1))


def test_roi_pooling_layer(backend, rng):
    x = randn(rng, (2, 8, 10, 3))
    rois = np.array([[0, 0, 0, 9, 7], [1, 2.4, 1.6, 6.5, 5.5], [1, 4, 4, 4, 4]], np.float32)
    layer = fl.RoIPooling2D((2, 3), spatial_scale=1.0)
    y = layer([x, rois])
    assert y.shape == (3, 2, 3, 3)
    assert_close(y[0, 0, 0], x[0, 0:4, 0:4].max(axis=(0, 1)))  # rows [0, 4), cols [0, 4)
    assert_close(y[2, 1, 2], x[1, 4, 4])  # a 1x1 region fills every bin
    first = fl.RoIPooling2D((2, 3), data_format="channels_first")
    assert_close(first([np.moveaxis(x, -1, 1).copy(), rois]), np.moveaxis(y, -1, 1))
    with pytest.raises(InputError, match="batch indices"):
        layer([x, np.array([[2, 0, 0, 1, 1]], np.float32)])


def test_conv_model_runs_in_a_graph(rng):
    inp = fastlayers.Input((12, 12, 3))
    h = fl.Conv2D(8, 3, padding="same", activation="relu")(inp)
    h = fl.MaxPooling2D()(h)
    h = fl.DepthwiseConv2D(3, padding="same")(h)
    h = fl.GlobalAveragePooling2D()(h)
    model = fastlayers.Model(inp, h)
    assert model.outputs[0].shape == (None, 8)
    assert model(randn(rng, (2, 12, 12, 3))).shape == (2, 8)


def test_conv2d_transpose_explicit_padding_matches_torch(torch, backend, rng):
    x = randn(rng, (2, 5, 4, 3))
    layer = fl.Conv2DTranspose(4, (3, 2), strides=(2, 3), padding=((1, 1), (0, 0)), output_padding=(1, 2))
    layer(x)
    kernel, bias = randn(rng, (3, 2, 4, 3)), randn(rng, (4,))
    layer.set_weights([kernel, bias])
    w_torch = np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))  # (C_in, C_out, kh, kw)
    expected = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(np.moveaxis(x, -1, 1).copy()),
        torch.from_numpy(w_torch),
        torch.from_numpy(bias),
        stride=(2, 3),
        padding=(1, 0),
        output_padding=(1, 2),
    ).numpy()
    assert_close(layer(x), np.moveaxis(expected, 1, -1), atol=1e-5)


def test_conv2d_groups_equal_to_channels_runs_depthwise(keras, backend, rng):
    compare_layer(
        keras,
        rng,
        "Conv2D",
        dict(filters=10, kernel_size=3, groups=5, padding="same", activation="relu"),
        randn(rng, (2, 6, 7, 5)),
    )


@pytest.mark.parametrize("data_format", FORMATS)
def test_upsampling2d_bilinear_align_corners_matches_torch(torch, backend, rng, data_format):
    x = randn(rng, (2, 3, 5, 2))
    layer = fl.UpSampling2D((3, 2), data_format=data_format, interpolation="bilinear", align_corners=True)
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(np.moveaxis(x, -1, 1).copy()), scale_factor=(3, 2), mode="bilinear", align_corners=True
    ).numpy()
    if data_format == "channels_first":
        assert_close(layer(np.moveaxis(x, -1, 1).copy()), expected)
    else:
        assert_close(layer(x), np.moveaxis(expected, 1, -1))
    with pytest.raises(InputError, match="align_corners"):
        fl.UpSampling2D(align_corners=True)


def test_keras_file_with_conv_layers_loads(keras, backend, rng, tmp_path):
    kl = keras.layers
    inp = keras.Input((12, 12, 3))
    h = kl.Conv2D(6, 3, strides=2, padding="same", activation="relu")(inp)
    h = kl.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(h)
    h = kl.SeparableConv2D(5, 3, padding="same")(h)
    h = kl.MaxPooling2D()(h)
    h = kl.Conv2DTranspose(4, 3, strides=2, padding="same")(h)
    h = kl.AveragePooling2D(2)(h)
    h = kl.UpSampling2D(interpolation="bilinear")(h)
    h = kl.Conv1D(3, 2, padding="causal")(kl.Reshape((36, 4))(h))
    km = keras.Model(inp, kl.GlobalMaxPooling1D()(h))
    for w in km.weights:
        w.assign(randn(rng, tuple(w.shape), 0.3))
    km.save(tmp_path / "conv.keras")
    x = randn(rng, (2, 12, 12, 3))
    assert_close(fastlayers.load(tmp_path / "conv.keras")(x), keras.ops.convert_to_numpy(km(x)), rtol=1e-4, atol=1e-5)
