"""Keras-style recurrent layers against Keras 3 (torch backend): SimpleRNN, LSTM, GRU, their
cells and Bidirectional, with every option, masks, initial states, stacking, streaming and the
native format. Shapes are small (batch 3, time 5) except where a case names its own."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, Sequential, settings
from fastlayers import layers as fl
from fastlayers.errors import ShapeError, UnsupportedError

from ..conftest import assert_close

B, T, I, U = 3, 5, 4, 6


def to_numpy(keras, y):
    if isinstance(y, (list, tuple)):
        return [to_numpy(keras, v) for v in y]
    return np.asarray(keras.ops.convert_to_numpy(y))


def random_weights(layer, rng, scale=0.5):
    layer.set_weights([(rng.standard_normal(tuple(w.shape)) * scale).astype(np.float32) for w in layer.get_weights()])


def keras_and_ours(keras, rng, name, kwargs, x, wrap=None, call_kwargs=None):
    """Build keras.layers.<name>(**kwargs) (optionally wrapped), randomize it, build ours with the
    same weights; return (keras output, our output)."""
    call_kwargs = call_kwargs or {}
    k_layer = getattr(keras.layers, name)(**kwargs)
    ours = getattr(fl, name)(**kwargs)
    if wrap is not None:
        k_layer = keras.layers.Bidirectional(k_layer, **wrap)
        ours = fl.Bidirectional(ours, **wrap)
    k_layer(x, **call_kwargs)
    random_weights(k_layer, rng)
    expected = to_numpy(keras, k_layer(x, **call_kwargs))
    ours(x, **call_kwargs)
    assert [w.shape for w in ours.get_weights()] == [tuple(w.shape) for w in k_layer.get_weights()]
    ours.set_weights(k_layer.get_weights())
    return expected, ours(x, **call_kwargs)


def assert_outputs(actual, expected, rtol=1e-5, atol=2e-6):
    if isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=rtol, atol=atol)
    else:
        assert not isinstance(actual, list)
        assert_close(actual, expected, rtol=rtol, atol=atol)


OPTIONS = [
    {},
    {"return_sequences": True},
    {"return_state": True},
    {"return_sequences": True, "return_state": True, "go_backwards": True},
    {"go_backwards": True},
    {"use_bias": False, "return_sequences": True},
]
LAYERS = [
    ("SimpleRNN", {}),
    ("SimpleRNN", {"activation": "relu"}),
    ("LSTM", {}),
    ("LSTM", {"activation": "relu", "recurrent_activation": "hard_sigmoid"}),
    ("GRU", {}),
    ("GRU", {"reset_after": False}),
]


@pytest.mark.parametrize("name,extra", LAYERS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o) or "default")
def test_layer_matches_keras(keras, rng, backend, name, extra, options):
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    expected, actual = keras_and_ours(keras, rng, name, {"units": U, **extra, **options}, x)
    assert_outputs(actual, expected)


@pytest.mark.parametrize(
    "name,extra",
    [("SimpleRNN", {"activation": "elu"}), ("GRU", {"activation": "celu"}), ("LSTM", {"activation": "leaky_relu"})],
)
def test_parametrized_activation_takes_keras_default(keras, rng, backend, name, extra):
    """An activation with a parameter (elu's and celu's alpha = 1, leaky_relu's slope 0.2)
    inside a recurrent cell."""
    x = rng.standard_normal((B, T, I)).astype(np.float32) * 3
    expected, actual = keras_and_ours(keras, rng, name, {"units": U, **extra, "return_sequences": True}, x)
    assert_outputs(actual, expected)


def lengths_mask(lengths, steps, left=False):
    m = np.arange(steps)[None, :] < np.asarray(lengths)[:, None]
    return m[:, ::-1].copy() if left else m


MASKS = {
    "right_padded": lengths_mask([5, 4, 3, 2, 1, 0], 5),  # every length 0..T
    "left_padded": lengths_mask([2, 5, 4, 0], 5, left=True),
    "holes": np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]], bool),
}


@pytest.mark.parametrize("name,extra", [("SimpleRNN", {}), ("LSTM", {}), ("GRU", {}), ("GRU", {"reset_after": False})])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize(
    "options",
    [
        {"return_sequences": True, "return_state": True},
        {"go_backwards": True, "return_sequences": True},
        {"zero_output_for_mask": True, "return_sequences": True},
        {},
    ],
)
def test_masks_match_keras(keras, rng, backend, name, extra, mask_name, options):
    mask = MASKS[mask_name]
    x = rng.standard_normal((mask.shape[0], T, I)).astype(np.float32)
    expected, actual = keras_and_ours(keras, rng, name, {"units": U, **extra, **options}, x, call_kwargs={"mask": mask})
    assert_outputs(actual, expected)


@pytest.mark.parametrize("name", ["SimpleRNN", "LSTM", "GRU"])
def test_initial_state_matches_keras(keras, rng, backend, name):
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    n = 2 if name == "LSTM" else 1
    states = [rng.standard_normal((B, U)).astype(np.float32) for _ in range(n)]
    expected, actual = keras_and_ours(
        keras, rng, name, {"units": U, "return_state": True}, x, call_kwargs={"initial_state": states}
    )
    assert_outputs(actual, expected)


@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
@pytest.mark.parametrize(
    "name,options",
    [
        ("LSTM", {"return_sequences": True}),
        ("GRU", {}),
        ("SimpleRNN", {"return_state": True}),
        ("LSTM", {"return_state": True, "return_sequences": True}),
    ],
)
def test_bidirectional_matches_keras(keras, rng, backend, merge_mode, name, options):
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    expected, actual = keras_and_ours(keras, rng, name, {"units": U, **options}, x, wrap={"merge_mode": merge_mode})
    assert_outputs(actual, expected)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_bidirectional_with_mask_matches_keras(keras, rng, backend, name):
    mask = MASKS["right_padded"]
    x = rng.standard_normal((mask.shape[0], T, I)).astype(np.float32)
    expected, actual = keras_and_ours(
        keras,
        rng,
        name,
        {"units": U, "return_sequences": True},
        x,
        wrap={"merge_mode": "concat"},
        call_kwargs={"mask": mask},
    )
    assert_outputs(actual, expected)


@pytest.mark.parametrize(
    "name,extra", [("SimpleRNNCell", {}), ("LSTMCell", {}), ("GRUCell", {}), ("GRUCell", {"reset_after": False})]
)
def test_cells_match_keras(keras, rng, backend, name, extra):
    x = rng.standard_normal((B, I)).astype(np.float32)
    k_cell = getattr(keras.layers, name)(U, **extra)
    n = 2 if name == "LSTMCell" else 1
    states = [rng.standard_normal((B, U)).astype(np.float32) for _ in range(n)]
    k_cell(x, states)
    random_weights(k_cell, rng)
    k_out, k_states = k_cell(x, states)
    ours = getattr(fl, name)(U, **extra)
    ours(x, states)
    ours.set_weights(k_cell.get_weights())
    out, new_states = ours(x, states)
    assert_close(out, to_numpy(keras, k_out))
    k_states = k_states if isinstance(k_states, (list, tuple)) else [k_states]
    for a, e in zip(new_states, k_states):
        assert_close(a, to_numpy(keras, e))


def test_stacked_sequential_matches_keras(keras, rng, backend):
    x = rng.standard_normal((2, 7, I)).astype(np.float32)
    k_model = keras.Sequential(
        [
            keras.Input((7, I)),
            keras.layers.LSTM(5, return_sequences=True),
            keras.layers.GRU(4, return_sequences=True),
            keras.layers.Bidirectional(keras.layers.SimpleRNN(3)),
            keras.layers.Dense(2),
        ]
    )
    random_weights(k_model, rng)
    ours = Sequential(
        [
            Input((7, I)),
            fl.LSTM(5, return_sequences=True),
            fl.GRU(4, return_sequences=True),
            fl.Bidirectional(fl.SimpleRNN(3)),
            fl.Dense(2),
        ]
    )
    ours.set_weights(k_model.get_weights())
    assert_close(ours(x), to_numpy(keras, k_model(x)), rtol=1e-4, atol=1e-5)


def test_functional_return_state_and_initial_state_graph(keras, rng, backend):
    """Encoder-decoder: states of one LSTM feed the next as initial_state inside a graph."""
    xe, xd = rng.standard_normal((2, 6, I)).astype(np.float32), rng.standard_normal((2, 3, I)).astype(np.float32)

    def build(lib, layers):
        a, b = lib.Input((6, I)), lib.Input((3, I))
        _, h, c = layers.LSTM(U, return_state=True)(a)
        y = layers.LSTM(U, return_sequences=True)(b, initial_state=[h, c])
        return lib.Model([a, b], y)

    k_model = build(keras, keras.layers)
    random_weights(k_model, rng)
    ours = build(fastlayers, fl)
    ours.set_weights(k_model.get_weights())
    assert_close(ours([xe, xd]), to_numpy(keras, k_model([xe, xd])), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_long_sequence_matches_keras_and_stays_finite(keras, rng, name):
    """T = 1000: both backends finite and equal to Keras (Keras runs once per layer type)."""
    x = rng.standard_normal((1, 1000, I)).astype(np.float32)
    k_layer = getattr(keras.layers, name)(8, return_sequences=True)
    k_layer(x)
    random_weights(k_layer, rng)
    expected = to_numpy(keras, k_layer(x))
    ours = getattr(fl, name)(8, return_sequences=True)
    ours(x)
    ours.set_weights(k_layer.get_weights())
    for backend in ("reference", "cpu"):
        with fastlayers.use_ops(backend):
            actual = ours(x)
        assert np.isfinite(actual).all()
        assert_close(actual, expected, rtol=1e-4, atol=1e-5, what=backend)


@pytest.mark.parametrize("batch,steps", [(1, 1), (64, 1), (1, 9), (64, 3)])
def test_batch_and_length_edges_match_keras(keras, rng, backend, batch, steps):
    x = rng.standard_normal((batch, steps, I)).astype(np.float32)
    expected, actual = keras_and_ours(keras, rng, "LSTM", {"units": U, "return_sequences": True}, x)
    assert_outputs(actual, expected)
    expected, actual = keras_and_ours(keras, rng, "GRU", {"units": 3}, x)
    assert_outputs(actual, expected)


# -------------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("name", ["SimpleRNN", "LSTM", "GRU"])
def test_stream_chunks_equal_full_sequence(rng, backend, name):
    x = rng.standard_normal((2, 11, I)).astype(np.float32)
    mask = np.ones((2, 11), bool)
    mask[0, 3:5] = False
    mask[1, :2] = False
    layer = getattr(fl, name)(U, return_sequences=True)
    layer(x)
    random_weights(layer, rng)
    full = layer(x, mask=mask)
    state = layer.get_stream_state(2)
    parts = [
        layer.stream(x[:, :4], state, mask=mask[:, :4]),
        layer.stream(x[:, 4], state, mask=mask[:, 4])[:, None],
        layer.stream(x[:, 5:], state, mask=mask[:, 5:]),
    ]
    assert state.steps == 11
    assert_close(np.concatenate(parts, axis=1), full, rtol=1e-6, atol=1e-6)  # float32 chunk sums
    # copy forks a stream; reset starts over; states are per client
    fork = state.copy()
    more = rng.standard_normal((2, 3, I)).astype(np.float32)
    a = layer.stream(more, state)
    b = layer.stream(more, fork)
    np.testing.assert_array_equal(a, b)
    state.reset()
    assert state.steps == 0
    np.testing.assert_array_equal(layer.stream(x[:, :4], state, mask=mask[:, :4]), full[:, :4])


def test_stream_refuses_backwards_and_wrong_batch(rng):
    layer = fl.LSTM(3, go_backwards=True)
    layer(np.zeros((1, 2, I), np.float32))
    with pytest.raises(UnsupportedError, match="go_backwards"):
        layer.get_stream_state(1)
    fwd = fl.GRU(3)
    fwd(np.zeros((1, 2, I), np.float32))
    state = fwd.get_stream_state(2)
    with pytest.raises(ShapeError, match="batch 2"):
        fwd.stream(np.zeros((3, 1, I), np.float32), state)


# --------------------------------------------------------------------------- errors and io
def test_errors_name_the_layer():
    layer = fl.LSTM(3, name="enc")
    layer(np.zeros((2, 4, I), np.float32))
    with pytest.raises(ShapeError, match="'enc'.*rank 3"):
        layer(np.zeros((2, I), np.float32))
    with pytest.raises(ShapeError, match="'enc'.*axis -1 of size 4"):
        layer(np.zeros((2, 4, I + 1), np.float32))
    with pytest.raises(ShapeError, match="initial state 'c'"):
        layer(np.zeros((2, 4, I), np.float32), initial_state=[np.zeros((2, 3)), np.zeros((2, 2))])
    with pytest.raises(ShapeError, match="mask of shape"):
        layer(np.zeros((2, 4, I), np.float32), mask=np.ones((2, 3), bool))
    with pytest.raises(ShapeError, match="no timesteps"):
        layer(np.zeros((2, 0, I), np.float32))
    with pytest.raises(UnsupportedError, match="stateful"):
        fl.GRU(3, stateful=True)
    with pytest.raises(UnsupportedError, match="activation"):
        fl.LSTM(3, activation="nope")


def test_unlisted_activation_falls_back_to_reference(rng):
    layer = fl.LSTM(4, activation="softsign", return_sequences=True)
    x = rng.standard_normal((2, 3, I)).astype(np.float32)
    layer(x)
    random_weights(layer, rng)
    with fastlayers.use_ops("reference"):
        expected = layer(x)
    assert_close(layer(x), expected, rtol=1e-6, atol=1e-7)


def test_native_round_trip(tmp_path, rng):
    a = Input((5, I))
    seq, h, c = fl.LSTM(U, return_sequences=True, return_state=True, name="enc")(a)
    y = fl.Bidirectional(fl.GRU(3, return_sequences=True, reset_after=False), merge_mode="sum")(seq)
    y = fl.SimpleRNN(2, go_backwards=True)(y, initial_state=[fl.Dense(2)(h)])
    model = Model(a, [y, c])
    random_weights(model, rng)
    path = tmp_path / "rnn.flm"
    model.save(path)
    loaded = fastlayers.load(path)
    x = rng.standard_normal((2, 5, I)).astype(np.float32)
    for got, want in zip(loaded(x), model(x)):
        np.testing.assert_array_equal(got, want)


def test_embedding_mask_zero_propagates_in_graphs(keras, rng, backend, tmp_path):
    """Keras propagates Embedding(mask_zero=True) masks to recurrent layers in a graph; so do we."""
    ids = rng.integers(1, 20, (4, 7))
    ids[0, 4:] = 0
    ids[1, :3] = 0  # left padding
    ids[2, 2] = 0  # a hole
    ids[3, :] = 0  # nothing valid

    def build(lib, layers):
        inp = lib.Input((7,), dtype="int32")
        h = layers.Embedding(20, I, mask_zero=True)(inp)
        h = layers.Dropout(0.1)(h)
        h = layers.LSTM(U, return_sequences=True)(h)
        h = layers.Bidirectional(layers.GRU(3, return_sequences=True))(h)
        h = layers.SimpleRNN(2)(h)
        return lib.Model(inp, h)

    k_model = build(keras, keras.layers)
    random_weights(k_model, rng)
    ours = build(fastlayers, fl)
    ours.set_weights(k_model.get_weights())
    expected = to_numpy(keras, k_model(ids))
    assert_close(ours(ids), expected, rtol=1e-4, atol=1e-5)
    unmasked = Sequential([Input((7, I)), fl.LSTM(U, return_sequences=True)])
    assert not isinstance(unmasked.layers[0], fl.PaddingMask)
    path = tmp_path / "masked.flm"
    ours.save(path)
    assert_close(fastlayers.load(path)(ids), expected, rtol=1e-4, atol=1e-5)


def test_concurrent_calls_share_one_model(rng):
    """Per-thread workspaces: many threads calling one recurrent model get their own results."""
    from concurrent.futures import ThreadPoolExecutor

    model = Sequential([Input((6, I)), fl.LSTM(8, return_sequences=True), fl.GRU(5)])
    random_weights(model, rng)
    inputs = [rng.standard_normal((b, 6, I)).astype(np.float32) for b in (1, 2, 3, 5) * 6]
    expected = [model(x) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(model, inputs))
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_bidirectional_with_backward_layer_matches_keras(keras, rng, backend, tmp_path):
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    k_layer = keras.layers.Bidirectional(
        keras.layers.LSTM(U, return_sequences=True),
        backward_layer=keras.layers.LSTM(U, return_sequences=True, go_backwards=True, activation="relu"),
    )
    k_layer(x)
    random_weights(k_layer, rng)
    ours = fl.Bidirectional(
        fl.LSTM(U, return_sequences=True),
        backward_layer=fl.LSTM(U, return_sequences=True, go_backwards=True, activation="relu"),
    )
    ours(x)
    ours.set_weights(k_layer.get_weights())
    assert_close(ours(x), to_numpy(keras, k_layer(x)))
    model = Sequential([Input((T, I)), ours])
    model.save(tmp_path / "bi.flm")
    np.testing.assert_array_equal(fastlayers.load(tmp_path / "bi.flm")(x), model(x))


def test_cells_refuse_symbolic_inputs():
    with pytest.raises(UnsupportedError, match="cells run on arrays"):
        fl.LSTMCell(3)(Input((4,)), [np.zeros((1, 3))] * 2)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_keras_files_with_recurrent_layers_load(keras, rng, tmp_path, suffix):
    """Keras-saved models with a mask_zero Embedding, LSTM, GRU, SimpleRNN and Bidirectional
    load through fastlayers.load and give Keras's outputs (Keras 3 records the mask as a
    NotEqual op node; the reader drops it and the recurrent layers recompute the mask)."""
    inp = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(20, I, mask_zero=True)(inp)
    h = keras.layers.LSTM(U, return_sequences=True)(h)
    h = keras.layers.Bidirectional(keras.layers.GRU(3, return_sequences=True, reset_after=False), merge_mode="ave")(h)
    seq, state = keras.layers.SimpleRNN(4, return_sequences=True, return_state=True, go_backwards=True)(h)
    k_model = keras.Model(inp, [keras.layers.Dense(2)(seq), state])
    random_weights(k_model, rng)
    path = tmp_path / f"rnn{suffix}"
    k_model.save(path)
    ids = rng.integers(0, 20, (3, 7))
    ids[0, 5:] = 0
    ours = fastlayers.load(path)
    for got, want in zip(ours(ids), to_numpy(keras, k_model(ids))):
        assert_close(got, want, rtol=1e-4, atol=1e-5)


def _loads_as_keras_runs(keras, k_model, path, x):
    """The Keras model saved at ``path``, loaded by fastlayers, gives Keras's outputs on ``x``
    compiled (from its second call on) and layer by layer."""
    want = to_numpy(keras, k_model(x))
    ours = fastlayers.load(path)
    for _ in range(3):
        for got, w in zip(ours(x), want):
            assert_close(got, w, rtol=1e-4, atol=1e-5)
    with settings.applied(settings.LoadOptions(native_plans=False)):
        for got, w in zip(ours(x), want):
            assert_close(got, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_keras_files_with_a_mask_input_load(keras, rng, tmp_path, suffix):
    """A mask the caller gave (``layer(x, mask=m)``, m a model input) is kept from the file's
    call (the masks Keras 3 records from an Embedding's NotEqual are dropped and recomputed):
    Keras's outputs, compiled and layer by layer."""
    x, m = keras.Input((None, I)), keras.Input((None,), dtype="bool")
    y = keras.layers.LSTM(U, return_sequences=True)(x, mask=m)
    b = keras.layers.Bidirectional(keras.layers.GRU(3))(keras.layers.Dense(4)(x), mask=m)
    k_model = keras.Model([x, m], [y, b])
    random_weights(k_model, rng)
    path = tmp_path / f"masked{suffix}"
    k_model.save(path)
    xs = [
        rng.standard_normal((3, 6, I)).astype(np.float32),
        np.array([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1] * 6], bool),
    ]
    _loads_as_keras_runs(keras, k_model, path, xs)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_keras_files_with_initial_states_load(keras, rng, tmp_path, suffix):
    """A Keras-saved seq2seq under a mask_zero Embedding: the encoder takes the mask, the
    decoder given ``initial_state=`` does not (Keras 3 fills a layer's mask only for a call
    with one tensor argument), as fastlayers.load runs it, compiled or layer by layer."""
    inp = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(20, I, mask_zero=True)(inp)
    _, state_h, state_c = keras.layers.LSTM(U, return_state=True)(h)
    d = keras.layers.Dense(5, activation="tanh")(h)
    y = keras.layers.LSTM(U, return_sequences=True)(d, initial_state=[state_h, state_c])
    b, *states = keras.layers.Bidirectional(keras.layers.GRU(U, return_state=True))(d, initial_state=[state_h] * 2)
    k_model = keras.Model(inp, [y, b, *states])
    random_weights(k_model, rng)
    path = tmp_path / f"seq2seq{suffix}"
    k_model.save(path)
    ids = rng.integers(1, 20, (3, 7))
    ids[0, 4:] = 0
    ids[1, :2] = 0
    _loads_as_keras_runs(keras, k_model, path, ids)
