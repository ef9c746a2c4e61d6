"""Bound recurrent steps (``RecurrentLayer.bind``, ``Bidirectional.bind``, ``ops.sequence_plan``):
in a model, the plain calls of SimpleRNN, LSTM, GRU and Bidirectional run bound functions
that give what the layers' ``call`` gives and what Keras (torch backend) gives, at 1 and 2
threads, for odd batch sizes and strided inputs; they follow replaced weights,
``clear_derived`` and a changed thread count."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as fl
from fastlayers import settings
from fastlayers.backends import derived, use_ops
from fastlayers.backends.cpu import recurrent as cpu_recurrent
from fastlayers.native import _core

from ..conftest import in_threads

T, I, U = 6, 4, 5


@pytest.fixture(autouse=True)
def layer_path():
    """These tests are of the layer path: a graph holding a recurrent layer otherwise runs
    compiled (model/plans.py, tests/model/test_plans.py)."""
    with settings.applied(settings.LoadOptions(native_plans=False)):
        yield


CASES = [
    ("LSTM", {}, False),
    ("LSTM", {"return_sequences": True, "go_backwards": True}, False),
    ("GRU", {"return_sequences": True}, False),
    ("GRU", {"reset_after": False, "go_backwards": True}, False),
    ("SimpleRNN", {"return_state": True}, False),
    ("LSTM", {"return_sequences": True}, "concat"),
    ("GRU", {}, "ave"),
    ("SimpleRNN", {"return_sequences": True}, None),
]


def _case_id(case):
    name, options, merge_mode = case
    wrap = "" if merge_mode is False else f"bidirectional-{merge_mode}-"
    return wrap + "-".join([name, *options])


def _pair(keras, rng, name, options, merge_mode=False, steps=T, units=U):
    """(keras model, our model with its weights): the recurrent layer (wrapped in
    Bidirectional unless ``merge_mode`` is False) on a (steps, I) input."""

    def build(lib, inp):
        layer = getattr(lib.layers if lib is keras else fl, name)(units, **options)
        if merge_mode is not False:
            wrapper = lib.layers.Bidirectional if lib is keras else fl.Bidirectional
            layer = wrapper(layer, merge_mode=merge_mode)
        return (keras.Model if lib is keras else fastlayers.Model)(inp, layer(inp))

    k_model = build(keras, keras.Input((steps, I)))
    k_model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in k_model.get_weights()])
    model = build(fastlayers, fastlayers.Input((steps, I)))
    model.set_weights(k_model.get_weights())
    return k_model, model


def _listed(y):
    return [np.asarray(v) for v in _listed_raw(y)]


def _keras_outputs(keras, k_model, x):
    return [keras.ops.convert_to_numpy(v) for v in _listed_raw(k_model(np.ascontiguousarray(x)))]


def _listed_raw(y):
    return list(y) if isinstance(y, (list, tuple)) else [y]


def _assert_equal(actual, expected):
    for a, e in zip(_listed(actual), _listed(expected), strict=True):
        np.testing.assert_array_equal(a, e)


def _bound_functions(model, x):
    """The functions the model runs for inputs laid out as ``x``."""
    return [fn for fn, _, _ in model._bound[fastlayers.model.graph._layout_key(x)][3]]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("name, options, merge_mode", CASES, ids=[_case_id(c) for c in CASES])
def test_bound_steps_match_call_and_keras(keras, rng, threads, name, options, merge_mode):
    k_model, model = _pair(keras, rng, name, options, merge_mode)
    layer = model.layers[-1]
    for batch in (1, 3, 5):
        x = rng.standard_normal((batch, T, I)).astype(np.float32)
        for xi in (x, x[:, ::-1]):  # a strided layout binds on its own
            y = model(xi)
            assert not any(getattr(fn, "__self__", None) is layer for fn in _bound_functions(model, xi))
            _assert_equal(model(xi), y)
            _assert_equal(y, model._run_plan(xi))
            for a, e in zip(_listed(y), _keras_outputs(keras, k_model, xi), strict=True):
                np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.fixture
def loops_at_once(monkeypatch):
    """The loop count of every ``rnn_loops`` call (directions run at once); the thread count
    restored after the test."""
    before = _core.get_num_threads()
    runs = []
    real = _core.rnn_loops
    monkeypatch.setattr(_core, "rnn_loops", lambda calls: runs.append(len(calls)) or real(calls))
    yield runs
    fastlayers.set_num_threads(before)


def _bidirectional_lstm(keras, rng):
    """(keras model, our model, input): a Bidirectional LSTM with enough work per direction
    for a thread of its own."""
    k_model, model = _pair(keras, rng, "LSTM", {"return_sequences": True}, "concat", steps=64, units=32)
    return k_model, model, rng.standard_normal((4, 64, I)).astype(np.float32)


def test_bidirectional_runs_its_directions_at_once(keras, rng, loops_at_once):
    """At 2 threads, with enough work per direction, both the bound and the plain call run
    the two directions in one ``rnn_loops`` call."""
    fastlayers.set_num_threads(2)
    k_model, model, x = _bidirectional_lstm(keras, rng)
    y = model(x)
    _assert_equal(model(x), y)
    _assert_equal(model.layers[-1](x), y)
    assert loops_at_once == [2, 2, 2]
    np.testing.assert_allclose(y, _keras_outputs(keras, k_model, x)[0], rtol=1e-4, atol=1e-5)


def test_thread_count_changed_after_binding(rng, monkeypatch):
    """A bound step builds no loop arguments per call; under a thread count other than the one
    it was bound at it builds the loop for that count once (here a batch of 8 that 2 threads
    split in two) and keeps it, so switching back and forth builds nothing more."""
    before = _core.get_num_threads()
    built = []
    real = cpu_recurrent._LOOPS["lstm_sequence"]
    monkeypatch.setitem(
        cpu_recurrent._LOOPS, "lstm_sequence", lambda *a, **k: built.append(k.get("shares")) or real(*a, **k)
    )
    model = fastlayers.Sequential([fastlayers.Input((20, I)), fl.LSTM(64, return_sequences=True)])
    x = rng.standard_normal((8, 20, I)).astype(np.float32)
    try:
        fastlayers.set_num_threads(1)
        y = model(x)
        assert len(built) == 1  # the binding
        _assert_equal(model(x), y)
        assert len(built) == 1
        fastlayers.set_num_threads(2)
        y2 = model(x)
        np.testing.assert_allclose(y2, y, rtol=1e-5, atol=1e-6)
        assert len(built) == 2  # the loop for 2 threads
        _assert_equal(model(x), y2)
        fastlayers.set_num_threads(1)
        _assert_equal(model(x), y)
        fastlayers.set_num_threads(2)
        _assert_equal(model(x), y2)
        assert len(built) == 2
        assert cpu_recurrent._shares(8, 20, 64, 64, 4, 64 * 256) == (2, 1)
    finally:
        fastlayers.set_num_threads(before)


def test_bidirectional_bound_at_one_thread_runs_at_once_at_two(keras, rng, loops_at_once):
    """A Bidirectional bound at 1 thread (its directions one after the other) runs them in one
    ``rnn_loops`` call once the thread count is 2, and one after the other again at 1."""
    fastlayers.set_num_threads(1)
    k_model, model, x = _bidirectional_lstm(keras, rng)
    y = model(x)
    assert loops_at_once == []
    fastlayers.set_num_threads(2)
    np.testing.assert_allclose(model(x), y, rtol=1e-5, atol=1e-6)
    assert loops_at_once == [2]
    fastlayers.set_num_threads(1)
    _assert_equal(model(x), y)
    assert loops_at_once == [2]
    np.testing.assert_allclose(y, _keras_outputs(keras, k_model, x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("merge_mode", [False, "concat"], ids=["lstm", "bidirectional"])
def test_replaced_and_edited_weights_are_followed(keras, rng, merge_mode):
    _, model = _pair(keras, rng, "LSTM", {"return_sequences": True}, merge_mode)
    layer = model.layers[-1]
    x = rng.standard_normal((2, T, I)).astype(np.float32)
    before = model(x)
    layer.set_weights([w * 0.5 for w in layer.get_weights()])
    y = model(x)
    assert not np.allclose(y, before)
    _assert_equal(y, model._run_plan(x))
    for w in layer.weights:
        w[...] *= 2  # in place: needs clear_derived
    derived.clear_derived()
    y = model(x)
    _assert_equal(y, model._run_plan(x))
    np.testing.assert_allclose(y, before, rtol=1e-5, atol=1e-6)
    with use_ops("reference"):
        np.testing.assert_allclose(model(x), y, rtol=1e-4, atol=1e-5)


def test_calls_with_states_or_masks_stay_unbound(rng):
    inp, h0, c0 = fastlayers.Input((T, I)), fastlayers.Input((U,)), fastlayers.Input((U,))
    lstm = fl.LSTM(U)
    model = fastlayers.Model([inp, h0, c0], lstm(inp, initial_state=[h0, c0]))
    arrays = [rng.standard_normal((3, *s)).astype(np.float32) for s in ((T, I), (U,), (U,))]
    y = model(arrays)
    np.testing.assert_allclose(y, lstm(arrays[0], initial_state=arrays[1:]), rtol=1e-6)
    assert lstm.call not in _bound_functions(model, arrays)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_python_threads_share_a_bound_model(rng, threads):
    model = fastlayers.Sequential(
        [
            fastlayers.Input((T, I)),
            fl.Bidirectional(fl.LSTM(U, return_sequences=True)),
            fl.GRU(U, return_sequences=True),
            fl.SimpleRNN(3),
        ]
    )
    inputs = [rng.standard_normal((b, T, I)).astype(np.float32) for b in (1, 2, 3, 5)]
    want = [model._run_plan(x) for x in inputs]

    def work(i):
        for _ in range(20):
            np.testing.assert_array_equal(model(inputs[i]), want[i])

    in_threads(work, len(inputs))
