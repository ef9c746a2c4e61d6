"""Keras's model attributes on fastlayers models (input_shape, output_shape, inputs, outputs,
output_names, predict_on_batch, to_json with fastlayers.model_from_json), compared with Keras's
own answers on the same architectures: built with Keras, saved as .keras, read back by Keras
(the oracle) and by ``fastlayers.load``."""

import copy
import json
import random

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, Sequential
from fastlayers import layers as L
from fastlayers.errors import FastlayersError, ModelFileError, UnsupportedError

from ..conftest import assert_close


def keras_architectures(keras):
    K = keras.layers
    models = {}
    models["sequential"] = keras.Sequential(
        [
            keras.Input((6,), name="pixels"),
            K.Dense(5, activation="relu"),
            K.Dense(3, activation="softmax", name="probs"),
        ],
        name="seq",
    )
    models["sequential_fixed_batch"] = keras.Sequential(
        [  # unnamed input, batch size given
            keras.Input(batch_shape=(2, 6)),
            K.Dense(4, activation="tanh"),
        ]
    )
    x = keras.Input(batch_shape=(3, 4), name="x")
    models["functional_1_1_fixed_batch"] = keras.Model(x, K.Dense(2, name="y")(x))
    a, b = keras.Input((4,), name="a"), keras.Input((3, 2), name="b")
    h = K.Concatenate(name="cat")([K.Dense(3, name="da")(a), K.Flatten(name="flat")(b)])
    o1, o2 = K.Dense(2, name="o1")(h), K.Dense(3, activation="sigmoid", name="o2")(h)
    models["functional_2_2"] = keras.Model([a, b], [o1, o2])
    models["functional_2_1"] = keras.Model([a, b], o1)
    models["functional_1_2"] = keras.Model(a, [K.Dense(2, name="p")(a), K.Dense(5, name="q")(a)])
    models["functional_list_of_one"] = keras.Model([a], [K.Dense(2, name="only")(a)])
    s = keras.Input((3, 2), name="steps")
    seq, _, c = K.LSTM(4, return_state=True, name="lstm")(s)
    models["functional_multi_output_layer"] = keras.Model(s, [seq, c])
    return models


NAMES = [
    "sequential",
    "sequential_fixed_batch",
    "functional_1_1_fixed_batch",
    "functional_2_2",
    "functional_2_1",
    "functional_1_2",
    "functional_list_of_one",
    "functional_multi_output_layer",
]


def batch_for(model, rng):
    xs = [rng.standard_normal([2 if d is None else d for d in t.shape]).astype(np.float32) for t in model.inputs]
    return xs if len(xs) > 1 else xs[0]


@pytest.fixture(scope="module")
def pairs(keras, tmp_path_factory):
    """name -> (Keras's model read back from its .keras file, fastlayers' model of that file)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("keras_attributes")
    result = {}
    for name, model in keras_architectures(keras).items():
        model.set_weights([rng.uniform(-0.5, 0.5, np.shape(w)).astype(np.float32) for w in model.get_weights()])
        model.save(root / f"{name}.keras")
        result[name] = (keras.saving.load_model(root / f"{name}.keras"), fastlayers.load(root / f"{name}.keras"))
    return result


def structure(value):
    """The value with each tuple/list marked, so that a tuple never equals a list."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [structure(v) for v in value])
    return value


# ---------------------------------------------------------------------------- against Keras
@pytest.mark.parametrize("name", NAMES)
def test_shapes_match_keras(pairs, name):
    k, f = pairs[name]
    assert structure(f.input_shape) == structure(k.input_shape)
    assert structure(f.output_shape) == structure(k.output_shape)


@pytest.mark.parametrize("name", NAMES)
def test_input_and_output_tensors_match_keras(pairs, name):
    k, f = pairs[name]
    assert type(f.inputs) is list and type(f.outputs) is list
    assert [t.name for t in f.inputs] == [t.name for t in k.inputs]  # the InputLayer names
    assert [structure(t.shape) for t in f.inputs] == [structure(t.shape) for t in k.inputs]
    assert [structure(t.shape) for t in f.outputs] == [structure(t.shape) for t in k.outputs]
    assert f.input_names == [t.name for t in k.inputs]
    # Keras names output tensors keras_tensor_<process-wide counter>; fastlayers after their layer
    if name == "functional_multi_output_layer":
        assert [t.name for t in f.outputs] == ["lstm:0", "lstm:2"]
    else:
        assert [t.name for t in f.outputs] == f.output_names


@pytest.mark.parametrize("name", NAMES)
def test_output_names_match_keras(pairs, name):
    k, f = pairs[name]
    if hasattr(k, "output_names"):
        assert list(f.output_names) == list(k.output_names)
    else:  # Keras 3's Sequential has none; fastlayers gives its last layer's name
        assert f.output_names == [f.layers[-1].name]


@pytest.mark.parametrize("name", NAMES)
def test_predict_on_batch_matches_keras(pairs, name):
    k, f = pairs[name]
    x = batch_for(k, np.random.default_rng(1))
    expected, got = k.predict_on_batch(x), f.predict_on_batch(x)
    assert type(got) is type(expected)
    expected, got = (expected, got) if isinstance(got, list) else ([expected], [got])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is np.ndarray and g.shape == e.shape
        assert_close(g, e, rtol=1e-5, what=name)


@pytest.mark.parametrize("name", NAMES)
def test_json_round_trip(pairs, name):
    _, f = pairs[name]
    text = f.to_json()
    clone = fastlayers.model_from_json(text)
    assert type(clone) is type(f) and clone.name == f.name
    assert [(type(a), a.name) for a in clone.layers] == [(type(a), a.name) for a in f.layers]
    assert structure(clone.input_shape) == structure(f.input_shape)
    assert structure(clone.output_shape) == structure(f.output_shape)
    assert [t.name for t in clone.inputs + clone.outputs] == [t.name for t in f.inputs + f.outputs]
    assert [w.shape for w in clone.get_weights()] == [w.shape for w in f.get_weights()]
    assert clone.to_json() == text
    clone.set_weights(f.get_weights())
    x = batch_for(f, np.random.default_rng(2))
    got, expected = clone.predict_on_batch(x), f.predict_on_batch(x)
    assert type(got) is type(expected)
    for g, e in zip(got if isinstance(got, list) else [got], expected if isinstance(expected, list) else [expected]):
        np.testing.assert_array_equal(g, e)


def test_keras_json_is_refused_with_a_pointer(pairs):
    k, _ = pairs["functional_2_2"]
    with pytest.raises(ModelFileError, match="Keras's own to_json output.*fastlayers.load"):
        fastlayers.model_from_json(k.to_json())


# ------------------------------------------------------------------------ fastlayers alone
def test_to_json_is_the_native_header_and_takes_json_options(tmp_path):
    model = Sequential([Input((3,), name="features"), L.Dense(2, name="d")], name="tiny")
    model.save(tmp_path / "tiny.flm")
    with np.load(tmp_path / "tiny.flm", allow_pickle=False) as data:
        header = json.loads(bytes(data["__fastlayers__"]).decode())
    assert json.loads(model.to_json()) == header
    pretty = model.to_json(indent=2, sort_keys=True)
    assert "\n" in pretty and json.loads(pretty) == header
    assert type(fastlayers.model_from_json(pretty.encode())) is Sequential  # bytes are read too


def test_attributes_of_models_built_with_fastlayers():
    x = Input((4,), name="x")
    assert x.name == "x"
    shared = L.Dense(4, name="shared")
    y = L.Add(name="add")([shared(x), shared(x)])
    model = Model(x, [shared(y), y])
    assert [t.name for t in model.outputs] == ["shared/call_2", "add"]
    assert model.output_names == ["shared", "add"] and model.output_shape == [(None, 4), (None, 4)]
    one = Model(x, [L.Dense(2)(x)])  # outputs given as a list of one: a tuple, as Keras
    assert one.output_shape == (None, 2)
    assert type(one.predict_on_batch(np.ones((3, 4)))) is np.ndarray
    unbuilt = Sequential([L.Dense(2)])
    for attribute in ("input_shape", "output_shape", "output_names"):
        assert not hasattr(unbuilt, attribute)
    with pytest.raises(AttributeError, match="no defined input shape yet"):
        unbuilt.input_shape
    assert unbuilt.predict_on_batch(np.ones((2, 5))).shape == (2, 2)  # builds, as Keras
    assert unbuilt.input_shape == (None, 5) and unbuilt.output_shape == (None, 2)


def test_to_json_refuses_what_the_format_cannot_rebuild():
    with pytest.raises(UnsupportedError, match="before its input shape is known"):
        Sequential([L.Dense(2)]).to_json()

    class Scaled(L.Dense):
        pass

    with pytest.raises(UnsupportedError, match="layer 'scaled' is a .*Scaled, not a fastlayers"):
        Sequential([Input((3,)), Scaled(2, name="scaled")]).to_json()

    class Wrapper(Model):
        pass

    x = Input((3,))
    with pytest.raises(UnsupportedError, match="is a .*Wrapper"):
        Wrapper(x, L.Dense(2)(x)).to_json()
    rescale = L.Rescaling(2.0, name="rescale")
    model = Sequential([Input((3,)), rescale])
    rescale.scale = object()  # an option JSON cannot hold
    with pytest.raises(UnsupportedError, match="cannot be written as JSON: a layer option"):
        model.to_json()


SEQ = {
    "class_name": "Sequential",
    "config": {
        "name": "s",
        "batch_shape": [None, 3],
        "layers": [{"class_name": "Dense", "config": {"name": "d", "units": 2}}],
    },
}


def header(model=SEQ, **fields):
    return json.dumps({"format": "fastlayers-model", "version": 1, "model": model, **fields})


@pytest.mark.parametrize(
    "text, error, match",
    [
        ("", ModelFileError, "not valid JSON"),
        (header()[:-5], ModelFileError, "not valid JSON"),
        (b"\xff\xfe\x00", ModelFileError, "not valid JSON"),
        ("[" * 100_000, ModelFileError, "not valid JSON"),
        ("[1, 2]", ModelFileError, "not a fastlayers architecture"),
        (json.dumps({"format": "other", "model": SEQ}), ModelFileError, "format str 'other'"),
        (json.dumps(SEQ), ModelFileError, "Keras's own to_json"),
        (header(version="1"), ModelFileError, "malformed format version"),
        (header(version=99), UnsupportedError, "newer fastlayers"),
        (header(model=None), ModelFileError, "model: expected an object with a string 'class_name'"),
        (
            header(model={"class_name": "Sequential", "config": {}}),
            ModelFileError,
            "model.config.layers: expected a list of layers",
        ),
        (
            header(
                model={
                    "class_name": "Sequential",
                    "config": {
                        **SEQ["config"],
                        "layers": [{"class_name": "Lambda", "config": {"name": "evil", "function": "os.system"}}],
                    },
                }
            ),
            UnsupportedError,
            "'evil' has unknown class 'Lambda'",
        ),
        (
            header(
                model={
                    "class_name": "Sequential",
                    "config": {**SEQ["config"], "layers": [{"class_name": "Nope", "config": [1]}]},
                }
            ),
            ModelFileError,
            r"layers\[0\]: expected an object with a string 'class_name' and an object 'config'",
        ),
        (
            header(
                model={
                    "class_name": "Sequential",
                    "config": {
                        **SEQ["config"],
                        "layers": [{"class_name": "Dense", "config": {"name": "d", "units": "many"}}],
                    },
                }
            ),
            ModelFileError,
            r"'d' \(Dense\) has an invalid config",
        ),
        (
            header(
                model={
                    "class_name": "Model",
                    "config": {"name": "m", "layers": [], "nodes": [], "inputs": [[0, 0]], "outputs": [[5, 0]]},
                }
            ),
            ModelFileError,
            r"model 'm' inputs: \[0, 0\] points at no earlier node output",
        ),
    ],
)
def test_model_from_json_refuses_bad_json(text, error, match):
    with pytest.raises(error, match=match):
        fastlayers.model_from_json(text)


def test_model_from_json_takes_text_only():
    with pytest.raises(TypeError, match="expects the JSON string"):
        fastlayers.model_from_json(SEQ)


def test_model_from_json_mutated_architectures_raise_only_fastlayers_errors():
    x = Input((4,), name="a")
    h = L.Concatenate(name="cat")([L.Dense(3, name="d1")(x), x])
    inner = Sequential([Input((7,)), L.LayerNormalization(name="ln")], name="inner")
    seeds = [
        json.loads(Model(x, [L.Dense(2, name="o")(inner(h)), h], name="m").to_json()),
        json.loads(Sequential([Input((5,)), L.Dense(3), L.Dense(2)]).to_json()),
    ]
    odd = [None, 0, -1, 1.5, "x", [], {}, [0], [[0, 0]], True, 10**30, [None, 3], "Dense", "Model"]

    def paths(value, path=()):
        yield path
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            yield from paths(item, (*path, key))

    rnd = random.Random(0)
    for _ in range(300):
        doc = copy.deepcopy(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 3)):
            path = rnd.choice([p for p in paths(doc) if p])
            parent = doc
            try:
                for key in path[:-1]:
                    parent = parent[key]
                if isinstance(parent, dict) and rnd.random() < 0.2:
                    parent.pop(path[-1], None)
                else:
                    parent[path[-1]] = copy.deepcopy(rnd.choice(odd))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation replaced part of this path
        text = json.dumps(doc)
        try:
            fastlayers.model_from_json(text)
        except FastlayersError:
            pass


def test_model_from_json_is_exported():
    assert "model_from_json" in fastlayers.__all__ and "model_from_json" in dir(fastlayers)
    assert fastlayers.model_from_json is fastlayers.model.graph.model_from_json
