"""Real architectures from keras.applications (weights=None, random BN statistics, logits out),
saved by Keras as .keras and .h5, loaded without Keras: outputs equal Keras's within 1e-4
relative (and 1e-4 of the largest logit)."""

import gc

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L

from ..conftest import assert_close

# (application, smallest input size Keras allows with weights=None). The default run keeps one
# architecture per family; the full list runs with `pytest -m slow` (README). NASNetMobile is
# left out: Keras refuses to build it on the torch backend.
DEFAULT = [
    ("MobileNetV2", 32),
    ("MobileNetV3Small", 32),
    ("ResNet50", 32),
    ("DenseNet121", 32),
    ("EfficientNetB0", 32),
    ("InceptionV3", 75),
    ("ConvNeXtTiny", 32),
]
SLOW = [
    ("ConvNeXtSmall", 32),
    ("ConvNeXtBase", 32),
    ("ConvNeXtLarge", 32),
    ("ConvNeXtXLarge", 32),
    ("DenseNet169", 32),
    ("DenseNet201", 32),
    *((f"EfficientNetB{i}", 32) for i in range(1, 8)),
    *((f"EfficientNetV2{v}", 32) for v in ("B0", "B1", "B2", "B3", "S", "M", "L")),
    ("InceptionResNetV2", 75),
    ("MobileNet", 32),
    ("MobileNetV3Large", 32),
    ("NASNetLarge", 32),
    ("ResNet101", 32),
    ("ResNet152", 32),
    ("ResNet50V2", 32),
    ("ResNet101V2", 32),
    ("ResNet152V2", 32),
    ("VGG16", 32),
    ("VGG19", 32),
    ("Xception", 71),
]
#: Range of the random moving variances. EfficientNetV2M and V2L (700+ layers) draw theirs from
#: [1, 2]: with [0.5, 1.5] their logits reach ~800 and Keras's own move by 1% when the input
#: moves by one ulp, so no float32 implementation could agree with it to 1e-4.
VARIANCE = {"EfficientNetV2M": (1.0, 2.0), "EfficientNetV2L": (1.0, 2.0)}
LAYER_PATH = fastlayers.LoadOptions(native_plans=False)


@pytest.mark.parametrize("name,size", [*DEFAULT, *(pytest.param(*case, marks=pytest.mark.slow) for case in SLOW)])
def test_keras_application_loads_and_matches(keras, tmp_path, name, size):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(
        weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None
    )
    rng = np.random.default_rng(0)
    low, high = VARIANCE.get(name, (0.5, 1.5))
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            w = layer.get_weights()
            w[-2] = rng.uniform(-0.1, 0.1, w[-2].shape).astype("float32")
            w[-1] = rng.uniform(low, high, w[-1].shape).astype("float32")
            layer.set_weights(w)
    x = rng.uniform(0, 255, (2, size, size, 3)).astype("float32")
    expected = model.predict(x, verbose=0)
    count = len(model.get_weights())
    for ext in ("keras", "h5"):
        model.save(tmp_path / f"{name}.{ext}")
    del model  # one model in memory at a time (the suite's peak memory); a model is a cycle
    gc.collect()
    # the .keras file runs as the compiled graph (model/plans.py), the .h5 one layer by layer:
    # the readers give the same model, so each executor is checked once per architecture
    for ext, options in (("keras", None), ("h5", LAYER_PATH)):
        ours = fastlayers.load(tmp_path / f"{name}.{ext}", options=options)
        assert len(ours.get_weights()) == count
        assert_close(
            ours(x), expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()), what=f"{name} from .{ext}"
        )
        del ours
        gc.collect()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"axis": None},
        {"mean": [1.0, 2.0, 3.0], "variance": [4.0, 0.0, 9.0]},
        {"mean": 2.0, "variance": 4.0},
        {"invert": True},
    ],
)
def test_normalization_layer_matches_keras(keras, rng, kwargs):
    x = rng.standard_normal((4, 5, 3)).astype(np.float32) * 3 + 1
    ref = keras.layers.Normalization(**kwargs)
    if "mean" not in kwargs:
        ref.adapt(x)
    expected = np.asarray(keras.ops.convert_to_numpy(ref(x)))
    ours = L.Normalization(**kwargs)
    ours(x)
    if "mean" not in kwargs:
        ours.set_weights([np.asarray(w) for w in ref.get_weights()])
    assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)


def test_application_layers_load_and_match(keras, tmp_path, rng):
    """The layers keras.applications defines itself: ConvNeXt's LayerScale and StochasticDepth
    (the identity at inference), InceptionResNetV2's CustomScaleLayer; with an operation node,
    through fastlayers' own format too."""
    from keras.src.applications.convnext import LayerScale, StochasticDepth
    from keras.src.applications.inception_resnet_v2 import CustomScaleLayer

    x = keras.Input((3, 4))
    h = StochasticDepth(0.25)(LayerScale(1e-6, 4)(x))
    model = keras.Model(x, CustomScaleLayer(0.17)([x, h]) * 0.5)
    model.layers[1].set_weights([rng.standard_normal(4).astype(np.float32)])
    xs = rng.standard_normal((2, 3, 4)).astype(np.float32)
    expected = model.predict(xs, verbose=0)
    for ext in ("keras", "h5"):
        model.save(tmp_path / f"application_layers.{ext}")
        ours = fastlayers.load(tmp_path / f"application_layers.{ext}")
        assert_close(ours(xs), expected, what=f".{ext}")
    ours.save(tmp_path / "application_layers.flm")
    assert_close(fastlayers.load(tmp_path / "application_layers.flm")(xs), expected)
    fresh = L.LayerScale(0.5, 4)
    assert_close(fresh(xs), xs * np.float32(0.5))
