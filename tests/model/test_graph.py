"""Model graphs: functional DAGs, Sequential, shared and nested models, weights, summary, errors."""

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, Sequential
from fastlayers import layers as L
from fastlayers.errors import FastlayersError, InputError, ShapeError, UnsupportedError

from ..conftest import assert_close


def dense_ref(x, layer):
    return x @ layer.kernel + layer.bias


def test_multi_input_multi_output_graph(rng, backend):
    a, b = Input((4,), name="a"), Input((3,), name="b")
    shared = L.Dense(5, name="shared")
    ha, hb = shared(L.Dense(4, name="pa")(a)), shared(L.Dense(4, name="pb")(b))
    merged = L.Concatenate(name="cat")([ha, hb])
    out1 = L.Dense(2, name="head1")(merged)
    out2 = L.Add(name="sum")([ha, hb])
    model = Model([a, b], [out1, out2], name="two_heads")
    xa, xb = rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    y1, y2 = model([xa, xb])
    pa, pb = model.get_layer("pa"), model.get_layer("pb")
    h_a = dense_ref(dense_ref(xa.astype(np.float32), pa), shared)
    h_b = dense_ref(dense_ref(xb.astype(np.float32), pb), shared)
    assert_close(y1, dense_ref(np.concatenate([h_a, h_b], 1), model.get_layer("head1")))
    assert_close(y2, h_a + h_b)
    # positional, list and dict inputs agree
    for args in [(xa, xb), ({"a": xa, "b": xb},)]:
        z1, z2 = model(*args)
        np.testing.assert_array_equal(z1, y1)
    # Keras's order (by depth, then first visit), as keras.Model.layers gives for this graph
    assert [layer.name for layer in model.layers] == ["a", "b", "pa", "pb", "shared", "cat", "head1", "sum"]
    assert model.count_params() == (4 * 4 + 4) + (3 * 4 + 4) + (4 * 5 + 5) + (10 * 2 + 2)


def test_layer_order_follows_keras_depth_rule():
    a = Input((4,), name="a")
    x1 = L.Dense(3, name="z1")(a)
    x3 = L.Dense(3, name="m3")(L.Dense(3, name="a2")(a))
    model = Model(a, L.Add(name="add")([x3, x1]))
    assert [layer.name for layer in model.layers] == ["a", "a2", "m3", "z1", "add"]


def test_nested_model_as_layer(rng):
    inner_in = Input((3,))
    inner = Model(inner_in, L.Dense(2, activation="tanh")(inner_in), name="inner")
    x = Input((3,))
    model = Model(x, L.Dense(1)(inner(x)), name="outer")
    v = rng.standard_normal((5, 3)).astype(np.float32)
    assert_close(model(v), model.layers[-1](inner(v)))
    assert len(model.get_weights()) == 4


def test_sequential_builds_lazily_and_eagerly(rng):
    x = rng.standard_normal((2, 6)).astype(np.float32)
    lazy = Sequential([L.Dense(4, activation="relu"), L.Dense(3)])
    assert not lazy.built
    with pytest.raises(ValueError, match="not built"):
        lazy.summary()
    y = lazy(x)
    assert lazy.built and y.shape == (2, 3)
    eager = Sequential([Input((6,)), L.Dense(4, activation="relu"), L.Dense(3)])
    eager.set_weights(lazy.get_weights())
    assert_close(eager(x), y)
    legacy = Sequential([L.Dense(4, activation="relu", input_shape=(6,)), L.Dense(3)])
    legacy.set_weights(lazy.get_weights())
    assert_close(legacy(x), y)
    assert [type(layer).__name__ for layer in eager.layers] == ["Dense", "Dense"]


def test_sequential_add():
    model = Sequential()
    model.add(Input((5,)))
    model.add(L.Dense(2))
    assert model.built and model(np.zeros((1, 5))).shape == (1, 2)


def test_weights_roundtrip_and_errors():
    model = Sequential([Input((3,)), L.Dense(2), L.BatchNormalization()])
    weights = model.get_weights()
    assert [w.shape for w in weights] == [(3, 2), (2,), (2,), (2,), (2,), (2,)]
    new = [np.full(w.shape, i, np.float32) for i, w in enumerate(weights)]
    model.set_weights(new)
    for got, want in zip(model.get_weights(), new):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="expects 6 weight arrays, got 5"):
        model.set_weights(new[:5])
    with pytest.raises(ShapeError, match=r"'kernel' expects shape \(3, 2\), got \(2, 3\)"):
        model.layers[0].set_weights([np.zeros((2, 3)), np.zeros(2)])
    # get_weights returns copies: mutating them changes nothing
    model.get_weights()[0][:] = 99
    assert not np.any(model.get_weights()[0] == 99)


def test_summary_lists_layers_shapes_and_params(capsys):
    x = Input((8,), name="features")
    h = L.Dense(4, name="hidden")(x)
    model = Model(x, L.Dense(2, name="out")(h), name="tiny")
    model.summary()
    text = capsys.readouterr().out
    for piece in [
        'Model: "tiny"',
        "features (InputLayer)",
        "hidden (Dense)",
        "(None, 4)",
        "36",
        "out (Dense)",
        "(None, 2)",
        "10",
        "Total params: 46",
        "hidden[0]",
    ]:
        assert piece in text, piece


def test_graph_spec_lists_the_nodes_a_call_runs():
    a, b = Input((4,), name="a"), Input((4,), name="b")
    dense = L.Dense(3, name="d")
    model = Model([a, b], dense(L.Add(name="add")([a, b])))
    spec = model.graph_spec
    assert [n.layer.name for n in spec.nodes] == ["a", "b", "add", "d"]
    assert (spec.single_input, spec.single_output, spec.input_layer) == (False, True, None)
    seq = Sequential([Input((4,), name="x"), L.Dense(2, name="d")])
    spec = seq.graph_spec
    assert spec.input_layer.name == "x" and [n.layer.name for n in spec.nodes] == ["x", "d"]
    assert spec.single_input and spec.single_output
    with pytest.raises(ValueError, match="is not built"):
        Sequential([L.Dense(2)]).graph_spec


def test_get_layer_by_name_and_index():
    model = Sequential([Input((2,)), L.Dense(3, name="first"), L.Dense(1, name="second")])
    assert model.get_layer("second") is model.get_layer(index=1)
    with pytest.raises(ValueError, match="no layer 'third'"):
        model.get_layer("third")


def test_shape_errors_name_layer_expected_and_actual():
    model = Sequential([Input((4,), name="x"), L.Dense(3, name="d")])
    with pytest.raises(ShapeError, match=r"input 'x': expected shape \(None, 4\), got \(2, 5\)"):
        model(np.zeros((2, 5)))
    with pytest.raises(ShapeError, match=r"expected shape \(None, 4\), got \(4,\)"):
        model(np.zeros(4))
    layer = L.Dense(3, name="solo")
    layer(np.zeros((1, 4)))
    with pytest.raises(ShapeError, match=r"layer 'solo' \(Dense\): expected axis -1 of size 4"):
        layer(np.zeros((1, 5)))
    with pytest.raises(ShapeError, match="expects 2 input"):
        _two_input_model()(np.zeros((1, 1)))
    with pytest.raises(ShapeError, match="numeric"):
        model(np.array([["a", "b", "c", "d"]]))
    assert issubclass(ShapeError, FastlayersError) and issubclass(ShapeError, ValueError)


def _two_input_model():
    a, b = Input((1,)), Input((1,))
    return Model([a, b], L.Add()([a, b]))


def test_graph_construction_errors():
    a = Input((2,))
    with pytest.raises(ShapeError, match="cannot be combined"):
        L.Add()([a, Input((3,))])
    with pytest.raises(ValueError, match="not among the model's inputs"):
        Model(a, L.Add()([a, Input((2,))]))
    with pytest.raises(TypeError, match="unexpected keyword"):
        L.Dense(3, kernel_size=4)
    with pytest.raises(UnsupportedError, match="activation 'bogus'"):
        L.Dense(3, activation="bogus")
    with pytest.raises(UnsupportedError, match="float64"):
        L.Dense(3, dtype="float64")
    with pytest.raises(ValueError, match="unique"):
        x = Input((2,))
        Model(x, L.Dense(2, name="same")(L.Dense(2, name="same")(x)))


def test_integer_and_float64_inputs_are_cast_to_float32(backend):
    model = Sequential([Input((3,)), L.Dense(2)])
    x64 = np.array([[1.0, 2.0, 3.0]])
    ints = np.array([[1, 2, 3]])
    expected = model(x64.astype(np.float32))
    for x in (x64, ints, ints.astype(np.uint8), [[1, 2, 3]], x64 > 0):
        y = model(x)
        assert y.dtype == np.float32
    np.testing.assert_array_equal(model(ints), expected)
    np.testing.assert_array_equal(model(x64), expected)


def test_nan_propagates_without_crashing(backend):
    model = Sequential(
        [Input((4,)), L.Dense(3, activation="relu"), L.LayerNormalization(), L.Dense(2, activation="softmax")]
    )
    x = np.ones((2, 4), np.float32)
    x[0, 1] = np.nan
    y = model(x)
    assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1]))


def test_predict_batches_equal_one_call(rng):
    model = Sequential([Input((5,)), L.Dense(4, activation="gelu"), L.Dense(3, activation="softmax")])
    x = rng.standard_normal((23, 5)).astype(np.float32)
    assert_close(model.predict(x, batch_size=4), model(x), rtol=1e-6)


def test_unique_automatic_names():
    a, b = L.Dense(1), L.Dense(1)
    assert a.name != b.name and a.name.startswith("dense")


def test_embedding_rejects_bad_indices():
    emb = L.Embedding(10, 4)
    assert emb(np.array([[1, 2, 9]])).shape == (1, 3, 4)
    assert emb(np.array([[1.0, 2.0]])).shape == (1, 2, 4)
    with pytest.raises(InputError, match=r"indices must be in \[0, 10\)"):
        emb(np.array([[10]]))
    with pytest.raises(InputError, match="integer"):
        emb(np.array([[1.5]]))
    with pytest.raises(ShapeError, match="dtype"):
        emb(np.array([["a"]]))
    assert L.Embedding(5, 2, mask_zero=True).compute_mask(np.array([[0, 3]])).tolist() == [[False, True]]


def test_integer_input_keeps_dtype_for_embedding():
    ids = Input((3,), dtype="int32")
    model = Model(ids, L.Embedding(100, 2)(ids))
    assert model(np.array([[1, 2, 99]])).shape == (1, 3, 2)


def test_use_ops_and_threads():
    assert fastlayers.get_ops().name == "cpu"
    with fastlayers.use_ops("reference") as ops:
        assert ops.name == "reference" and fastlayers.get_ops() is ops
    assert fastlayers.get_ops().name == "cpu"
    with pytest.raises(UnsupportedError, match="cuda"):
        with fastlayers.use_ops("cuda"):
            pass
    with pytest.raises(UnsupportedError, match="unknown backend"):
        fastlayers.get_ops("gpu")
    fastlayers.set_num_threads(1)
    assert fastlayers.get_num_threads() == 1
    with pytest.raises(ValueError):
        fastlayers.set_num_threads(0)
    from fastlayers import native

    assert native.get_num_threads() == 1


def test_dict_outputs_are_refused_clearly():
    x = Input((3,))
    with pytest.raises(UnsupportedError, match="outputs given as a dict"):
        Model(x, {"a": L.Dense(2)(x), "b": L.Dense(1)(x)})


def test_cuda_without_numba_cuda_says_how_to_install():
    """A machine without numba-cuda (the core install): use_ops("cuda") is an UnsupportedError
    naming the extra, never an ImportError from inside the backend."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['numba'] = sys.modules['numba_cuda'] = None  # as if not installed\n"
        "import fastlayers\n"
        "from fastlayers.errors import UnsupportedError\n"
        "try:\n"
        "    fastlayers.use_ops('cuda').__enter__()\n"
        "except UnsupportedError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'fastlayers[cuda]'" in proc.stdout


def test_ragged_and_out_of_range_inputs_to_a_call():
    """A ragged nested list is a ShapeError from the model, and float64 values beyond float32's
    range become inf without numpy's overflow warning."""
    import warnings

    model = Sequential([Input((2,)), L.Dense(1)])
    with pytest.raises(ShapeError, match="rectangular"):
        model([[1.0, 2.0], [3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not np.isfinite(model(np.array([[1e300, 0.0]]))).all()
