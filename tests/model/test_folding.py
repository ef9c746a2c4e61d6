"""Embedding folded into the recurrent layer after it (``fastlayers/folding.py``): the folded
model equals the same layers run one after the other, and is folded only where that is exact."""

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L
from fastlayers.backends.derived import clear_derived
from fastlayers.errors import InputError, ShapeError
from fastlayers.model import folding

from ..conftest import assert_close

VOCAB, EMBED, UNITS, T = 40, 6, 5, 7

RECURRENT = {
    "lstm": lambda: L.LSTM(UNITS, return_sequences=True),
    "gru": lambda: L.GRU(UNITS, return_sequences=True),
    "gru_reset_before": lambda: L.GRU(UNITS, reset_after=False),
    "simple_rnn": lambda: L.SimpleRNN(UNITS, go_backwards=True),
    "lstm_no_bias": lambda: L.LSTM(UNITS, use_bias=False),
}


def randomize(model, rng):
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.get_weights()])


def folded_steps(model):
    return sum(fn is folding._pass_ids for fn, _, _ in model._host_plan)


def text_model(rng, kind, mask_zero=False, head=True):
    ids = Input((T,), dtype="int64")
    emb = L.Embedding(VOCAB, EMBED, mask_zero=mask_zero, name="emb")
    rnn = RECURRENT[kind]()
    h = rnn(emb(ids))
    model = Model(ids, L.Dense(3)(h) if head else h)
    randomize(model, rng)
    return model, emb, rnn


def unfolded(model, emb, rnn, ids, mask=None):
    """The same layers called on arrays, one after the other (no fold)."""
    h = rnn(emb(ids), mask=mask)
    return model.layers[-1](h) if model.layers[-1] is not rnn else h


@pytest.mark.parametrize("kind", sorted(RECURRENT))
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_folded_model_equals_layers_run_apart(rng, backend, kind, batch):
    model, emb, rnn = text_model(rng, kind)
    assert folded_steps(model) == 1
    ids = rng.integers(0, VOCAB, (batch, T))
    assert_close(model(ids), unfolded(model, emb, rnn, ids), rtol=1e-5, atol=1e-5)


def test_folded_layer_keeps_the_padding_mask(rng, backend):
    model, emb, rnn = text_model(rng, "lstm", mask_zero=True)
    ids = rng.integers(1, VOCAB, (4, T))
    ids[0, 3:] = 0
    ids[1, :] = 0  # no valid step at all
    assert folded_steps(model) == 1
    assert_close(model(ids), unfolded(model, emb, rnn, ids, mask=ids != 0), atol=1e-5)


def test_folded_layer_takes_initial_states_and_float_ids(rng):
    ids_in, h0_in, c0_in = Input((T,), dtype="int64"), Input((UNITS,)), Input((UNITS,))
    emb, rnn = L.Embedding(VOCAB, EMBED), L.LSTM(UNITS, return_state=True)
    outs = rnn(emb(ids_in), initial_state=[h0_in, c0_in])
    model = Model([ids_in, h0_in, c0_in], outs)
    randomize(model, rng)
    assert folded_steps(model) == 1
    ids = rng.integers(0, VOCAB, (2, T))
    h0, c0 = rng.standard_normal((2, 2, UNITS)).astype(np.float32)
    expected = rnn(emb(ids), initial_state=[h0, c0])
    for got, want in zip(model([ids.astype(np.float64), h0, c0]), expected):
        assert_close(got, want, atol=1e-5)


def test_folded_model_checks_ids_as_the_embedding_does(rng):
    model, _, _ = text_model(rng, "gru")
    with pytest.raises(InputError, match=r"Embedding 'emb'.*\[0, 40\)"):
        model(np.full((2, T), VOCAB))
    with pytest.raises(InputError, match="Embedding 'emb'"):
        model(np.full((2, T), 0.5))
    with pytest.raises(ShapeError):
        model(np.zeros((2, T + 1), np.int64))


def test_new_weights_reach_the_folded_table(rng):
    model, emb, rnn = text_model(rng, "gru")
    ids = rng.integers(0, VOCAB, (3, T))
    before = model(ids)
    randomize(model, rng)  # new arrays for the table, kernel and bias
    after = model(ids)
    assert not np.allclose(before, after)
    assert_close(after, unfolded(model, emb, rnn, ids), atol=1e-5)
    emb.embeddings[...] = 0  # an edit in place needs clear_derived()
    clear_derived()
    assert_close(model(ids), unfolded(model, emb, rnn, ids), atol=1e-5)


def test_folds_only_an_embedding_read_by_the_recurrent_layer_alone(rng, monkeypatch):
    ids = Input((T,), dtype="int64")
    e = L.Embedding(VOCAB, EMBED)(ids)
    shared = Model(ids, [L.LSTM(UNITS)(e), L.GlobalAveragePooling1D()(e)])
    exposed = Model(ids, [L.LSTM(UNITS)(e), e])
    bidirectional = Model(ids, L.Bidirectional(L.LSTM(UNITS))(e))
    dense_first = Model(ids, L.LSTM(UNITS)(L.Dense(EMBED)(e)))
    for model in (shared, exposed, bidirectional, dense_first):
        randomize(model, rng)
        assert folded_steps(model) == 0
    monkeypatch.setattr(folding, "FOLD_MAX_BYTES", VOCAB * 4 * UNITS * 4 - 1)
    model, _, _ = text_model(rng, "lstm")
    assert folded_steps(model) == 0


def test_stacked_recurrent_model_folds_the_first_layer(rng):
    ids_in = Input((T,), dtype="int64")
    emb, first, second = L.Embedding(VOCAB, EMBED), L.LSTM(UNITS, return_sequences=True), L.LSTM(UNITS)
    model = Model(ids_in, second(first(emb(ids_in))))
    randomize(model, rng)
    assert folded_steps(model) == 1
    ids = rng.integers(0, VOCAB, (8, T))
    with fastlayers.use_ops("reference"):
        expected = second(first(emb(ids)))
    assert_close(model(ids), expected, rtol=1e-5, atol=1e-5)


def test_clearing_derived_weights_frees_entries_that_hold_other_sources():
    """An entry whose value holds the last reference to another entry's source: clearing the
    cache frees that source, whose weakref callback takes the cache's lock again (a deadlock
    with a non-reentrant lock)."""
    from fastlayers.backends import derived

    source, holder = np.zeros(5), np.ones(7)
    derived.derived(holder, "test-holder", lambda s: [source])  # noqa: F821 - deleted below, on purpose
    derived.derived(source, "test-held", lambda s: 1)
    del source
    derived.clear_derived()
    assert derived.derived(holder, "test-holder", lambda s: "again") == "again"


def test_derived_from_keeps_an_entry_per_set_of_other_sources():
    """Consumers that share their first source (an exporter's deduplicated initializer) but not
    the others each keep their entry: alternating calls compute each once; new other sources
    compute anew; at most DERIVED_FROM_ENTRIES entries per first source."""
    from fastlayers.backends import derived

    shared, made = np.zeros(4), []
    others = [np.full(3, float(i)) for i in range(derived.DERIVED_FROM_ENTRIES + 1)]

    def make(first, other):
        made.append(float(other[0]))
        return float(other[0])

    for _ in range(3):
        for other in others[:2]:
            assert derived.derived_from((shared, other), "test-shared", make) == other[0]
    assert made == [0.0, 1.0]
    for other in others:
        derived.derived_from((shared, other), "test-shared", make)
    assert made == [0.0, 1.0] + [float(i) for i in range(2, len(others))]
    box = derived.derived(shared, "test-shared", lambda _: None)
    assert len(box) == derived.DERIVED_FROM_ENTRIES and id(others[0]) not in {k[0] for k in box}
