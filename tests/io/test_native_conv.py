"""Native save/load round trips of the convolution, pooling and block layers."""

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, Sequential
from fastlayers import layers as L


def randomize(model, rng):
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])


@pytest.mark.parametrize(
    "shape,layers",
    [
        (
            (12, 11, 3),
            [
                L.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
                L.DepthwiseConv2D((2, 3), depth_multiplier=2, padding=((1, 0), (2, 1))),
                L.SeparableConv2D(5, 3, padding="same", dilation_rate=2),
                L.Conv2DTranspose(3, 3, strides=2, output_padding=1),
                L.MaxPooling2D(3, 2, padding="same"),
                L.AveragePooling2D(2),
                L.UpSampling2D((2, 1), interpolation="bilinear"),
                L.LocalResponseNormalization(2, 1.0, 1e-3, 0.75),
                L.InceptionBlock(2, 2, 3, 1, 2, 2),
                L.NiNBlock(4, 3, mlp_filters=[3, 5]),
            ],
        ),
        (
            (3, 12, 11),
            [
                L.Conv2D(4, (3, 2), groups=1, data_format="channels_first"),
                L.MaxPooling2D(data_format="channels_first"),
                L.GlobalMaxPooling2D(data_format="channels_first", keepdims=True),
            ],
        ),
        (
            (13, 4),
            [
                L.Conv1D(6, 3, padding="causal", dilation_rate=2, groups=2),
                L.MaxPooling1D(),
                L.Conv1D(3, 2, padding=(1, 2)),
                L.AveragePooling1D(2, padding="same"),
                L.GlobalAveragePooling1D(),
            ],
        ),
    ],
)
def test_sequential_round_trip(tmp_path, rng, shape, layers):
    model = Sequential([Input(shape), *layers], name="convs")
    randomize(model, rng)
    x = rng.standard_normal((2, *shape)).astype(np.float32)
    model.save(tmp_path / "m.flm")
    loaded = fastlayers.load(tmp_path / "m.flm")
    np.testing.assert_array_equal(loaded(x), model(x))
    assert [layer.get_config() for layer in loaded.layers] == [layer.get_config() for layer in model.layers]


def test_roi_pooling_round_trip(tmp_path, rng):
    feats, rois = Input((8, 8, 3)), Input((5,))
    h = L.Conv2D(4, 3, padding="same")(feats)
    model = Model([feats, rois], L.RoIPooling2D((2, 2), spatial_scale=0.5, name="roi")([h, rois]))
    randomize(model, rng)
    x = [
        rng.standard_normal((2, 8, 8, 3)).astype(np.float32),
        np.array([[0, 0, 0, 10, 10], [1, 4, 2, 15, 9]], np.float32),
    ]
    model.save(tmp_path / "r.flm")
    np.testing.assert_array_equal(fastlayers.load(tmp_path / "r.flm")(x), model(x))
