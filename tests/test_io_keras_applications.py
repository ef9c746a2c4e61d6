"""Real architectures from keras.applications (weights=None, random BN statistics), saved by Keras
as .keras and .h5, loaded without Keras: outputs equal Keras's within 1e-4 relative."""

import gc

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L

from .conftest import assert_close

# (application, input size): small inputs keep the suite fast; the architecture is unchanged.
APPLICATIONS = [("MobileNetV2", 96), ("ResNet50", 64), ("DenseNet121", 64), ("EfficientNetB0", 64),
                ("InceptionV3", 75)]


@pytest.mark.parametrize("name,size", APPLICATIONS)
def test_keras_application_loads_and_matches(keras, tmp_path, name, size):
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            w = layer.get_weights()
            w[-2] = rng.uniform(-0.1, 0.1, w[-2].shape).astype("float32")
            w[-1] = rng.uniform(0.5, 1.5, w[-1].shape).astype("float32")
            layer.set_weights(w)
    x = rng.uniform(0, 255, (2, size, size, 3)).astype("float32")
    expected = model.predict(x, verbose=0)
    for ext in ("keras", "h5"):
        path = tmp_path / f"{name}.{ext}"
        model.save(path)
        ours = fastlayers.load(path)
        assert len(ours.get_weights()) == len(model.get_weights())
        assert_close(ours(x), expected, rtol=1e-4, atol=1e-6, what=f"{name} from .{ext}")
        del ours  # one loaded copy at a time (the suite's peak memory); a model is a cycle
        gc.collect()


@pytest.mark.parametrize("kwargs", [{}, {"axis": None}, {"mean": [1.0, 2.0, 3.0], "variance": [4.0, 0.0, 9.0]},
                                    {"mean": 2.0, "variance": 4.0}, {"invert": True}])
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
