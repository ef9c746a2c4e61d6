"""Keras files (.keras, unzipped .keras, legacy .h5, .weights.h5) read without Keras, compared with
Keras's own predictions on models built and saved by Keras inside the tests."""

import json
import zipfile

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L
from fastlayers.errors import ModelFileError, UnsupportedError

from ..conftest import assert_close


def randomize(model, rng):
    weights = []
    for w in model.get_weights():
        w = np.asarray(w)
        weights.append(rng.uniform(0.5, 1.5, w.shape).astype(np.float32))
    model.set_weights(weights)


def keras_models(keras):
    K = keras.layers
    models = {}
    models["sequential_mlp"] = (
        keras.Sequential(
            [
                keras.Input((6,)),
                K.Rescaling(0.5, offset=-1.0),
                K.Dense(8, activation="relu"),
                K.BatchNormalization(),
                K.Dropout(0.3),
                K.Dense(5, activation="gelu"),
                K.LayerNormalization(),
                K.Dense(3, activation="softmax"),
            ]
        ),
        [(2, 6)],
    )
    models["legacy_input_shape"] = (
        keras.Sequential([K.Dense(4, activation="tanh", input_shape=(5,)), K.Dense(2, use_bias=False)]),
        [(3, 5)],
    )
    a, b = keras.Input((4,), name="a"), keras.Input((3, 2), name="b")
    shared = K.Dense(5, activation="swish", name="shared")
    h = K.Concatenate()(
        [
            shared(a),
            shared(
                K.Flatten()(K.Permute((2, 1))(b))[:, :4] if False else K.Dense(4)(K.Flatten()(K.Permute((2, 1))(b)))
            ),
        ]
    )
    inner = keras.Sequential([keras.Input((10,)), K.Dense(6, activation="elu"), K.LayerNormalization()], name="inner")
    out1 = K.Dense(2, activation="sigmoid")(inner(h))
    out2 = K.Add()([K.Dense(3)(h), K.Dense(3)(h)])
    models["functional_shared_nested"] = (keras.Model([a, b], [out1, out2]), [(2, 4), (2, 3, 2)])
    ids = keras.Input((5,), dtype="int32")
    e = K.Embedding(20, 4)(ids)
    e = K.ZeroPadding1D((1, 2))(e)
    e = K.Cropping1D((0, 1))(e)
    e = K.Reshape((7, 2, 2))(e)
    e = K.ZeroPadding2D(((1, 0), (0, 1)))(e)
    e = K.Cropping2D(((0, 1), (1, 0)))(e)
    e = K.Flatten()(K.SpatialDropout2D(0.2)(e))
    models["embedding_padding"] = (keras.Model(ids, K.Dense(2)(K.RepeatVector(2)(e))), [("ids", 20, (2, 5))])
    x = keras.Input((6,))
    y = K.Subtract()([K.Dense(4)(x), K.Dense(4)(x)])
    y = K.Multiply()([y, K.Dense(4, activation="hard_sigmoid")(x)])
    y = K.Maximum()([y, K.Minimum()([y, K.Average()([y, y])])])
    y = K.Activation("log_softmax")(K.LeakyReLU(0.1)(K.ReLU(max_value=2.0)(K.ELU(0.5)(y))))
    models["merges_activations"] = (keras.Model(x, K.Softmax()(y)), [(3, 6)])
    return models


def inputs_for(specs, rng):
    out = []
    for spec in specs:
        if spec[0] == "ids":
            out.append(rng.integers(0, spec[1], spec[2]).astype(np.int32))
        else:
            out.append(rng.standard_normal(spec).astype(np.float32))
    return out


@pytest.fixture(scope="module")
def saved(keras, tmp_path_factory):
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("keras_files")
    result = {}
    for name, (model, specs) in keras_models(keras).items():
        randomize(model, rng)
        xs = inputs_for(specs, rng)
        expected = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
        expected = [np.asarray(e) for e in expected] if isinstance(expected, list) else [np.asarray(expected)]
        files = {"keras": root / f"{name}.keras", "h5": root / f"{name}.h5", "weights": root / f"{name}.weights.h5"}
        model.save(files["keras"])
        model.save(files["h5"])
        model.save_weights(files["weights"])
        unzipped = root / f"{name}_dir"
        with zipfile.ZipFile(files["keras"]) as z:
            z.extractall(unzipped)
        files["dir"] = unzipped
        result[name] = (files, xs, expected)
    return result


MODELS = ["sequential_mlp", "legacy_input_shape", "functional_shared_nested", "embedding_padding", "merges_activations"]


@pytest.mark.parametrize("kind", ["keras", "h5", "dir"])
@pytest.mark.parametrize("name", MODELS)
def test_load_matches_keras_predict(saved, name, kind, backend):
    files, xs, expected = saved[name]
    model = fastlayers.load(files[kind])
    got = model(xs if len(xs) > 1 else xs[0])
    got = got if isinstance(got, list) else [got]
    for g, e in zip(got, expected):
        assert_close(g, e, rtol=1e-4, atol=1e-5, what=f"{name} from {kind}")


@pytest.mark.parametrize("name", MODELS)
def test_load_weights_into_rebuilt_model(saved, name):
    files, xs, expected = saved[name]
    model = fastlayers.load(files["keras"])
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(files["weights"])
    got = model(xs if len(xs) > 1 else xs[0])
    assert_close(got if not isinstance(got, list) else got[0], expected[0], rtol=1e-4, atol=1e-5)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(files["h5"])  # a legacy full-model file carries weights too
    got = model(xs if len(xs) > 1 else xs[0])
    assert_close(got if not isinstance(got, list) else got[0], expected[0], rtol=1e-4, atol=1e-5)


def test_load_weights_into_model_built_with_fastlayers(saved):
    files, xs, expected = saved["sequential_mlp"]
    model = fastlayers.Sequential(
        [
            fastlayers.Input((6,)),
            L.Rescaling(0.5, offset=-1.0),
            L.Dense(8, activation="relu"),
            L.BatchNormalization(),
            L.Dropout(0.3),
            L.Dense(5, activation="gelu"),
            L.LayerNormalization(),
            L.Dense(3, activation="softmax"),
        ]
    )
    model.load_weights(files["weights"])
    assert_close(model(xs[0]), expected[0], rtol=1e-4, atol=1e-5)


def test_lambda_is_refused_and_never_runs(keras, tmp_path):
    marker = tmp_path / "ran"
    x = keras.Input((2,))
    model = keras.Model(x, keras.layers.Lambda(lambda t: t * 2)(x))
    model.save(tmp_path / "lam.keras")
    with pytest.raises(UnsupportedError, match=r"Lambda layers carry Python code"):
        fastlayers.load(tmp_path / "lam.keras")
    assert not marker.exists()


def rewrite_config(src, dst, edit):
    with zipfile.ZipFile(src) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    config = json.loads(entries["config.json"])
    edit(config)
    entries["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)


def test_unknown_class_and_unsupported_option_name_the_layer(saved, tmp_path):
    src = saved["sequential_mlp"][0]["keras"]

    def custom(config):
        config["config"]["layers"][2]["class_name"] = "MyCustomDense"

    rewrite_config(src, tmp_path / "custom.keras", custom)
    with pytest.raises(UnsupportedError, match=r"layer 'dense(_\d+)?' \(MyCustomDense\): layer class 'MyCustomDense'"):
        fastlayers.load(tmp_path / "custom.keras")

    def option(config):
        config["config"]["layers"][2]["config"]["lora_rank"] = 4

    rewrite_config(src, tmp_path / "lora.keras", option)
    with pytest.raises(UnsupportedError, match=r"option lora_rank=4 is not supported"):
        fastlayers.load(tmp_path / "lora.keras")

    def policy(config):
        config["config"]["layers"][2]["config"]["dtype"] = {"class_name": "DTypePolicy", "config": {"name": "int8"}}

    rewrite_config(src, tmp_path / "int8.keras", policy)
    with pytest.raises(UnsupportedError, match=r"dtype policy 'int8'"):
        fastlayers.load(tmp_path / "int8.keras")

    def mixed(config):
        config["config"]["layers"][2]["config"]["dtype"] = {
            "class_name": "DTypePolicy",
            "config": {"name": "mixed_float16"},
        }

    rewrite_config(src, tmp_path / "mixed.keras", mixed)
    fastlayers.load(tmp_path / "mixed.keras")  # float policies compute in float32


def test_corrupt_and_truncated_files(saved, tmp_path):
    for kind in ("keras", "h5"):
        data = saved["sequential_mlp"][0][kind].read_bytes()
        for i, blob in enumerate([data[: len(data) // 3], data[:64]]):
            bad = tmp_path / f"bad{i}.{kind}"
            bad.write_bytes(blob)
            with pytest.raises((ModelFileError, UnsupportedError), match=f"bad{i}"):
                fastlayers.load(bad)


def test_tf_keras_2_style_h5(tmp_path, rng):
    """A legacy file as tf.keras 2.x writes it: old node format, batch_input_shape, ':0' names."""
    h5py = pytest.importorskip("h5py")
    w1, b1 = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w2, b2 = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    config = {
        "class_name": "Functional",
        "config": {
            "name": "model",
            "layers": [
                {
                    "class_name": "InputLayer",
                    "name": "input_1",
                    "inbound_nodes": [],
                    "config": {
                        "batch_input_shape": [None, 3],
                        "dtype": "float32",
                        "sparse": False,
                        "ragged": False,
                        "name": "input_1",
                    },
                },
                {
                    "class_name": "Dense",
                    "name": "dense",
                    "inbound_nodes": [[["input_1", 0, 0, {}]]],
                    "config": {
                        "name": "dense",
                        "trainable": True,
                        "dtype": "float32",
                        "units": 4,
                        "activation": "relu",
                        "use_bias": True,
                        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
                    },
                },
                {
                    "class_name": "Dense",
                    "name": "dense_1",
                    "inbound_nodes": [[["dense", 0, 0, {}]]],
                    "config": {
                        "name": "dense_1",
                        "trainable": True,
                        "dtype": "float32",
                        "units": 2,
                        "activation": "linear",
                        "use_bias": True,
                    },
                },
            ],
            "input_layers": [["input_1", 0, 0]],
            "output_layers": [["dense_1", 0, 0]],
        },
    }
    path = tmp_path / "tfk2.h5"
    with h5py.File(path, "w") as f:
        f.attrs["model_config"] = json.dumps(config)
        f.attrs["keras_version"] = "2.15.0"
        f.attrs["backend"] = "tensorflow"
        mw = f.create_group("model_weights")
        mw.attrs["layer_names"] = [b"input_1", b"dense", b"dense_1"]
        mw.create_group("input_1").attrs["weight_names"] = []
        for lname, (w, b) in {"dense": (w1, b1), "dense_1": (w2, b2)}.items():
            g = mw.create_group(lname)
            g.attrs["weight_names"] = [f"{lname}/kernel:0".encode(), f"{lname}/bias:0".encode()]
            g.create_dataset(f"{lname}/kernel:0", data=w)
            g.create_dataset(f"{lname}/bias:0", data=b)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    assert_close(fastlayers.load(path)(x), np.maximum(x @ w1 + b1, 0) @ w2 + b2, rtol=1e-5)


def test_recurrent_attention_and_conv_layers_from_keras_files(keras, tmp_path, rng):
    """Layers whose variables Keras saves in sublayer groups (RNN cells, Bidirectional's two
    layers, MultiHeadAttention's projections) load in Keras's order."""
    K = keras.layers
    x = keras.Input((5, 4))
    h = K.LSTM(3, return_sequences=True)(x)
    h = K.Bidirectional(K.GRU(2, return_sequences=True, reset_after=False))(h)
    h = K.SimpleRNN(2, return_sequences=True)(h)
    h = K.MultiHeadAttention(2, 3)(h, h)
    h = K.Attention(use_scale=True)([h, h])
    h = K.AdditiveAttention()([h, h])
    model = keras.Model(x, K.GlobalAveragePooling1D()(K.Conv1D(2, 3)(h)))
    randomize(model, rng)
    xs = rng.standard_normal((2, 5, 4)).astype(np.float32)
    expected = model.predict(xs, verbose=0)
    for ext in ("keras", "h5"):
        model.save(tmp_path / f"mixed.{ext}")
        assert_close(fastlayers.load(tmp_path / f"mixed.{ext}")(xs), expected, rtol=1e-4, atol=1e-5)


def test_keras3_activations_from_keras_files(keras, tmp_path, rng):
    """Keras 3's newer activations by name, as ``activation=`` of Dense and Conv2D and as
    Activation layers, from .keras and .h5. Sparsemax sees inputs with one value in its support
    (where Keras 3.15 is right, keras-team/keras#23425)."""
    from ..layers.test_keras import KERAS3_ACTIVATIONS

    K = keras.layers
    x, image, peaked = keras.Input((8,)), keras.Input((5, 5, 2)), keras.Input((4,))
    outputs = [K.Activation("sparsemax")(peaked)]
    for name in KERAS3_ACTIVATIONS:
        if name != "sparsemax":
            outputs += [K.Dense(8, activation=name)(x), K.Activation(name)(K.Dense(6)(x))]
    outputs += [K.Conv2D(4, 3, activation=name)(image) for name in ("hard_swish", "mish", "celu")]
    model = keras.Model([x, image, peaked], outputs)
    randomize(model, rng)
    xs = [
        rng.standard_normal((2, 8)).astype(np.float32) * 2,
        rng.standard_normal((2, 5, 5, 2)).astype(np.float32),
        np.array([[0.0, 2.0, -1.0, 0.5], [3.0, 1.0, 1.5, -2.0]], np.float32),
    ]
    xs[0][0, :] = [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 20.0]  # break points before the Dense
    expected = model.predict(xs, verbose=0)
    for ext in ("keras", "h5"):
        model.save(tmp_path / f"activations.{ext}")
        got = fastlayers.load(tmp_path / f"activations.{ext}")(xs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_close(g, e, rtol=1e-4, atol=1e-5, what=f"from .{ext}")


def test_keras3_operation_nodes_from_keras_files(keras, tmp_path, rng):
    """Arithmetic on symbolic tensors (Keras 3 saves operation nodes, as MobileNetV3's hard
    sigmoid and ConvNeXt's residual sums): constants on either side, two tensors; other
    operations are refused by name."""
    x = keras.Input((6,))
    h = keras.layers.Dense(6)(x)
    y = (3.0 - h) * (1.0 / 6.0) + x / 2 - (h + 1.5)  # an int constant too
    model = keras.Model(x, y)
    randomize(model, rng)
    xs = rng.standard_normal((2, 6)).astype(np.float32)
    expected = model.predict(xs, verbose=0)
    for ext in ("keras", "h5"):
        model.save(tmp_path / f"ops.{ext}")
        assert_close(fastlayers.load(tmp_path / f"ops.{ext}")(xs), expected, rtol=1e-5, atol=1e-6)
    keras.Model(x, keras.ops.exp(h)).save(tmp_path / "exp.keras")
    with pytest.raises(UnsupportedError, match=r"operation 'exp' \(keras.src.ops.numpy.Exp\)"):
        fastlayers.load(tmp_path / "exp.keras")
