"""The native recurrent loops (``native/recurrent.c`` through ``backends/cpu/recurrent.py``)
against ReferenceOps on every ISA path this CPU runs (conftest's ``isa``): every loop kind and option, float inputs
and ids, the units split among threads (meeting every step), the batch split among threads, one
thread; batch 1, length 1, odd unit counts (vector tails), more shares than threads (a share
taken over by a thread that is there), a busy pool, a busy machine, strided inputs and weight
views."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fastlayers
from fastlayers.backends import _num_threads
from fastlayers.backends.cpu import recurrent as R
from fastlayers.backends.reference import recurrent as REF
from fastlayers.native import _core

from ..conftest import assert_close

T, I, U, P = 7, 5, 130, 64  # 130 units: shares of 64 and 66 (vector tails)


@pytest.fixture
def threads():
    """``set_num_threads`` for the test (restored after, in the pool too)."""
    before, pool = _num_threads[0], _core.get_num_threads()
    yield fastlayers.set_num_threads
    _num_threads[0] = before
    _core.set_num_threads(pool)


@pytest.fixture
def two_threads(threads):
    threads(2)


@pytest.fixture
def loops(monkeypatch):
    """The (kind, batch shares, unit shares) of every native loop run."""
    runs = []

    def recorded(kind, *args, _f=_core.rnn_loop):
        runs.append((kind, args[11], len(args[9]) - 1))
        return _f(kind, *args)

    monkeypatch.setattr(_core, "rnn_loop", recorded)
    return runs


def weights(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def cases(rng, batch, units=U):
    """(name, function name, positional args after x, keyword args) for every loop kind."""
    h0 = rng.standard_normal((batch, units)).astype(np.float32)
    wl = (weights(rng, I, 4 * units), weights(rng, units, 4 * units), weights(rng, 4 * units))
    wg = (weights(rng, I, 3 * units), weights(rng, units, 3 * units), weights(rng, 3 * units))
    wr = (weights(rng, I, units), weights(rng, units, units), weights(rng, units))
    return [
        ("lstm", "lstm_sequence", (*wl, h0, h0), {}),
        (
            "lstm_proj",
            "lstm_sequence",
            (wl[0], weights(rng, P, 4 * units), wl[2], h0[:, :P].copy(), h0),
            {"w_hp": weights(rng, units, P)},
        ),
        (
            "lstm_hard_sigmoid",
            "lstm_sequence",
            (*wl, h0, h0),
            {"activation": "softsign", "recurrent_activation": "hard_sigmoid"},
        ),
        ("gru", "gru_sequence", (*wg, weights(rng, 3 * units), h0), {}),
        ("gru_no_recurrent_bias", "gru_sequence", (*wg, None, h0), {}),
        ("gru_reset_before", "gru_sequence", (*wg, None, h0), {"reset_after": False}),
        ("rnn", "rnn_sequence", (*wr, h0), {}),
        ("rnn_relu", "rnn_sequence", (*wr, h0), {"activation": "relu"}),
        ("rnn_no_bias", "rnn_sequence", (*wr[:2], None, h0), {}),
    ]


OPTIONS = [
    {},
    {"reverse": True, "return_sequences": False},
    {"mask": True, "zero_masked": True},
    {"mask": True, "reverse": True},
    {"mask": True, "return_sequences": False, "zero_masked": True, "y0": True},
]


def check(rng, fn, args, kw, options, batch, steps=T, ids=False, x=None):
    """The loop against the reference; with ``ids`` the inputs are rows of the input weights
    (an embedding folded into the layer), read in place by the loop."""
    if x is None:
        x = rng.integers(0, I, (batch, steps)) if ids else rng.standard_normal((batch, steps, I)).astype(np.float32)
    opts = dict(options)
    if opts.pop("mask", False):
        mask = rng.random((batch, steps)) > 0.3
        mask[0] = False  # a sample without any valid step
        opts["mask_bt"] = mask
    if opts.pop("y0", False):
        opts["y0"] = rng.standard_normal((batch, args[-2 if fn == "lstm_sequence" else -1].shape[1])).astype(np.float32)
    actual = getattr(R, fn)(x, *args, **kw, **opts)
    expected = getattr(REF, fn)(x, *args, **kw, **opts)
    assert actual is not None and len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == np.float32
        # the ReLU RNN grows to ~2e3 in 7 steps: float32 keeps about 1e-4 absolute there, and
        # sums taken in another order (fastlayers' sgemm vs numpy's) differ by that much
        assert_close(a, e, rtol=1e-5, atol=5e-5 * max(1.0, float(np.abs(e).max())))


SPLITS = {"one thread": (1, 1), "units": (1, 2), "rows": (2, 1)}


@pytest.mark.parametrize("inputs", ["floats", "ids"])
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "reverse-last", "mask-zero", "mask-reverse", "mask-last-y0"])
@pytest.mark.parametrize(
    "split,batch", [("one thread", 1), ("one thread", 8), ("units", 1), ("units", 3), ("units", 8), ("rows", 8)]
)
def test_loops_match_reference(isa, two_threads, monkeypatch, loops, rng, options, split, batch, inputs):
    """Every loop kind and option, each way to share a loop (forced), float inputs and ids."""
    monkeypatch.setattr(R, "_shares", lambda *a: SPLITS[split])
    for name, fn, args, kw in cases(rng, batch):
        check(rng, fn, args, kw, options, batch, ids=inputs == "ids")
    assert {(rows, parts) for _, rows, parts in loops} == {SPLITS[split]}


@pytest.mark.parametrize("split", ["one thread", "units", "rows"])
def test_inputs_projected_step_by_step(isa, two_threads, monkeypatch, rng, split):
    """Batch shares of 8 rows and more whose projection of every step would exceed 2 MiB
    project each step's float inputs into its gates (recurrent.c step_x): 17 rows (shares of
    8 and 9), LSTMs over 128 steps and a SimpleRNN over 480, with a mask, in reverse order."""
    monkeypatch.setattr(R, "_shares", lambda *a: SPLITS[split])
    for name, fn, args, kw in cases(rng, 17):
        if name not in ("lstm", "lstm_proj", "rnn"):
            continue
        # recurrent weights scaled down: over 100+ steps the default ones amplify the rounding
        # of either side's sums past the tolerance
        args = (args[0], args[1] * np.float32(0.2), *args[2:])
        check(rng, fn, args, kw, {"mask": True, "reverse": True}, 17, steps=480 if name == "rnn" else 128)


@pytest.mark.parametrize("split", ["one thread", "units", "rows"])
def test_one_step(isa, two_threads, monkeypatch, rng, split):
    """Sequences of length 1 (a streaming step), batch 1 and 8."""
    monkeypatch.setattr(R, "_shares", lambda *a: SPLITS[split])
    for batch in (1, 8) if split != "rows" else (8,):
        for name, fn, args, kw in cases(rng, batch):
            for options in OPTIONS:
                check(rng, fn, args, kw, options, batch, steps=1)


def test_default_shares(two_threads, loops, monkeypatch, rng):
    """The default split: batch 1 shares the units of a large layer, batch 8 the rows; a small
    layer runs on one thread, and so does a single step of a large one, in the unit shares of
    its longer calls (its weights packed once for both)."""
    from fastlayers import native

    call_threads = []

    def recorded(*args, _f=_core.rnn_loop):
        previous = native.set_call_threads(0)
        native.set_call_threads(previous)
        call_threads.append(previous)
        return _f(*args)

    monkeypatch.setattr(_core, "rnn_loop", recorded)
    w = weights(rng, 4, 1024), weights(rng, 256, 1024), None
    for batch, steps in [(1, 10), (8, 3), (1, 1)]:
        h0 = np.zeros((batch, 256), np.float32)
        R.lstm_sequence(rng.standard_normal((batch, steps, 4)).astype(np.float32), *w, h0, h0)
    h0 = np.zeros((1, 32), np.float32)
    R.lstm_sequence(
        rng.standard_normal((1, 50, 4)).astype(np.float32), weights(rng, 4, 128), weights(rng, 32, 128), None, h0, h0
    )
    assert [run[1:] for run in loops] == [(1, 2), (2, 1), (1, 2), (1, 1)]
    assert call_threads == [0, 0, 1, 0]  # 1: the calling thread alone


def test_serial_calls(monkeypatch):
    """Under MIN_CALL_MADDS a call stays on the calling thread where its recurrent weights stay
    in one core's L2 (OWN_THREAD_L2_SHARE of it) or it runs one step (a stream's); beyond, its
    steps are shared, each thread's share then held in its L2 (GRU 256 units, 10 steps,
    batch 1: 1.97M multiply-adds, 768 KiB of weights)."""
    monkeypatch.setattr(R, "l2_cache_bytes", lambda: 1 << 20)
    gru256 = 256 * 3 * 256
    assert 10 * gru256 < 2 * R.MIN_CALL_MADDS
    assert not R._serial(1, 10, gru256)
    assert not R._serial(1, 2, gru256)
    assert R._serial(1, 1, gru256)  # one step
    assert R._serial(1, 10, 128 * 4 * 128)  # 256 KiB: within half the L2
    assert not R._serial(1, 40, 128 * 4 * 128)  # over MIN_CALL_MADDS twice
    monkeypatch.setattr(R, "l2_cache_bytes", lambda: 2 << 20)
    assert R._serial(1, 10, gru256)  # within half a 2 MiB L2


@pytest.mark.parametrize(
    "batch,threads,parts", [(8, 2, 2), (12, 3, 3), (12, 2, 2), (9, 2, 2), (8, 4, 2), (6, 2, 1), (4, 2, 1)]
)
def test_batch_shares_are_big_enough(batch, threads, parts):
    """Shares of the batch: at least MIN_SHARE_ROWS rows each (else units are shared)."""
    assert R._row_parts(batch, 128 * 512, threads) == parts
    assert R._row_parts(batch, R.ROW_SHARE_MAX_BYTES // 4 + 1, threads) == 1


def test_share_bounds_cover_units_in_whole_vectors():
    assert R._bounds(256, 2).tolist() == [0, 128, 256]
    assert R._bounds(130, 2).tolist() == [0, 64, 130]
    assert R._bounds(20, 2).tolist() == [0, 10, 20]  # fewer than 16 per share: any width
    assert R._bounds(1, 2).tolist() == [0, 0, 1]  # an empty share


def test_share_packing():
    """Share p's columns of each chosen gate block, side by side, packed (gemm.h)."""
    w = np.arange(3 * 12, dtype=np.float32).reshape(3, 12)  # 3 blocks of 4 units
    packed = R._pack_shares(w, (0, 2), 3, np.array([0, 1, 4]))
    share0 = _core.pack(np.ascontiguousarray(w[:, [0, 8]]))
    share1 = _core.pack(np.ascontiguousarray(w[:, [1, 2, 3, 9, 10, 11]]))
    np.testing.assert_array_equal(packed, np.concatenate([share0, share1]))


@pytest.mark.parametrize("kind", ["lstm", "gru_reset_before", "lstm_proj"])
def test_more_shares_than_threads(isa, two_threads, monkeypatch, rng, kind):
    """Three unit shares on two threads: the share no thread started is run by a thread that
    waited for it (taken over), with the same result, in bounded time."""
    monkeypatch.setattr(R, "_shares", lambda *a: (1, 3))
    name, fn, args, kw = next(c for c in cases(rng, 2) if c[0] == kind)
    start = time.perf_counter()
    for options in OPTIONS:
        check(rng, fn, args, kw, options, 2)
    assert time.perf_counter() - start < 10


def test_shares_on_one_thread(threads, monkeypatch, rng):
    """Unit shares with a pool of one thread: the caller runs them all, share after share."""
    threads(1)
    monkeypatch.setattr(R, "_shares", lambda *a: (1, 2))
    for name, fn, args, kw in cases(rng, 3):
        check(rng, fn, args, kw, {"mask": True}, 3)
    monkeypatch.setattr(R, "_shares", lambda *a: (2, 1))
    for name, fn, args, kw in cases(rng, 8):
        check(rng, fn, args, kw, {"reverse": True}, 8)


@pytest.mark.parametrize("shares", [2, 3])
def test_beside_a_busy_process(two_threads, monkeypatch, rng, shares):
    """Unit shares while another process spins on a core: a worker descheduled mid-call has its
    share taken over and, when back soon, handed back (native/recurrent.c); every call gives,
    bit for bit, what a call on the quiet machine gave, and none waits out the scheduler."""
    monkeypatch.setattr(R, "_shares", lambda *a: (1, shares))
    name, fn, args, kw = cases(rng, 1, units=256)[0]
    x = rng.standard_normal((1, 60, I)).astype(np.float32)
    quiet = R.lstm_sequence(x, *args, **kw)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        start, same = time.perf_counter(), []
        for _ in range(150):
            got = R.lstm_sequence(x, *args, **kw)
            same.extend(np.array_equal(g, e) for g, e in zip(got, quiet))
        elapsed = time.perf_counter() - start
    finally:
        busy.kill()
        busy.wait()
    assert len(same) == 150 * len(quiet) and all(same)
    assert elapsed < 10


@pytest.mark.parametrize("split", ["units", "rows"])
def test_concurrent_calls(two_threads, monkeypatch, rng, split):
    """Calls from several Python threads at once: one holds the pool, the others run their
    shares on their own thread; every result is the one a call alone gives."""
    monkeypatch.setattr(R, "_shares", lambda *a: SPLITS[split])
    name, fn, args, kw = cases(rng, 8, units=256)[0]
    x = rng.standard_normal((8, 12, I)).astype(np.float32)
    check(rng, fn, args, kw, {}, 8, x=x)
    alone = R.lstm_sequence(x, *args, **kw)
    same = []

    def run():
        for _ in range(5):
            got = R.lstm_sequence(x, *args, **kw)
            same.extend(np.array_equal(g, e) for g, e in zip(got, alone))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(same) == 45 and all(same)


@pytest.mark.parametrize("batch", [1, 2, 3, 17, 31])
@pytest.mark.parametrize(
    "activations", [("tanh", "sigmoid"), ("relu", "hard_sigmoid"), ("softsign", "sigmoid"), ("silu", "hard_sigmoid")]
)
def test_lstm_gate_pass_with_other_activations(isa, rng, batch, activations):
    """The LSTM gate pass for the default and other activation pairs, with a mask, at batch
    sizes whose step products take each kernel (1-3 rows: the loops' own; 17 and 31: the
    packed sgemm's tiles and a remainder), 37 units (vector tails)."""
    t, i, u = 6, 5, 37
    x = rng.standard_normal((batch, t, i)).astype(np.float32)
    w = [weights(rng, *s) for s in [(i, 4 * u), (u, 4 * u), (4 * u,)]]
    h0, c0 = (rng.standard_normal((batch, u)).astype(np.float32) for _ in range(2))
    kw = {"activation": activations[0], "recurrent_activation": activations[1], "mask_bt": rng.random((batch, t)) > 0.3}
    for got, want in zip(R.lstm_sequence(x, *w, h0, c0, **kw), REF.lstm_sequence(x, *w, h0, c0, **kw)):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_activations_fall_back(rng):
    """Activations the loops do not cover (softmax over a row) leave the call to the
    reference."""
    name, fn, args, kw = cases(rng, 2)[6]
    x = rng.standard_normal((2, 3, I)).astype(np.float32)
    assert R.rnn_sequence(x, *args, activation="softmax") is None
    assert R.rnn_sequence(np.zeros((2, 0, I), np.float32), *args) is None


def test_strided_inputs_and_weight_views(isa, monkeypatch, rng):
    """Inputs that are strided views, weights that are views of wider arrays (made anew per
    call, as ``layer.bias[1]`` is): the same results, and each view packed once."""
    packs = []
    monkeypatch.setattr(R, "_pack_shares", lambda *a, _f=R._pack_shares, **k: packs.append(1) or _f(*a, **k))
    big = weights(rng, U, 8 * U)
    x = rng.standard_normal((3, 2 * T, I)).astype(np.float32)[:, ::2]
    w_ig, b_g = weights(rng, I, 4 * U), weights(rng, 4 * U)
    h0 = rng.standard_normal((3, U)).astype(np.float32)
    for _ in range(2):
        w_hg = big[:, 2 * U : 6 * U]
        check(rng, "lstm_sequence", (w_ig, w_hg, b_g, h0, h0), {}, {}, 3, x=x)
    assert len(packs) == 2  # input and recurrent weights, once each


def test_ids_out_of_range(rng):
    name, fn, args, kw = cases(rng, 2)[0]
    with pytest.raises(IndexError):
        R.lstm_sequence(np.array([[0, I]]), *args[:3], args[3][:1], args[4][:1])


def test_read_only_table(rng):
    """A folded table given read-only is read in place."""
    name, fn, args, kw = cases(rng, 2)[0]
    table = args[0].copy()
    table.flags.writeable = False
    check(rng, fn, (table, *args[1:]), kw, {}, 2, ids=True)


def test_activations_accuracy_and_nan(isa):
    """The loops' tanh and sigmoid against float64 numpy (a one-unit RNN whose step is
    y = f(x): input weight 1, recurrent weight 0); inf saturates, NaN propagates."""
    x = np.concatenate(
        [
            np.linspace(-20, 20, 20001),
            np.geomspace(1e-30, 1, 2000),
            -np.geomspace(1e-30, 1, 2000),
            [np.inf, -np.inf, 0.0, np.nan],
        ]
    )
    x = x.astype(np.float32)
    one, zero, h0 = (np.full(s, v, np.float32) for s, v in [((1, 1), 1), ((1, 1), 0), ((1, 1), 0)])
    with np.errstate(over="ignore", invalid="ignore"):
        x64 = x.astype(np.float64)
        refs = {"tanh": np.tanh(x64), "sigmoid": 1 / (1 + np.exp(-x64))}
    for name, want in refs.items():
        y, h = R.rnn_sequence(x.reshape(1, -1, 1), one, zero, None, h0, activation=name)
        assert np.isnan(y[0, -1, 0]) and np.isnan(h[0, 0])
        assert_close(y.reshape(-1)[:-1], want[:-1], rtol=3e-7, atol=1e-45, what=name)


@pytest.mark.parametrize("batch", [1, 3, 9])
def test_sequences_at_once(isa, two_threads, monkeypatch, rng, batch):
    """Independent calls (a bidirectional layer's directions) run at once, one thread each
    (``rnn_loops``), give the reference's results: every loop kind, both directions, masks,
    batch 1 to 9, 130 units (vector tails)."""
    monkeypatch.setattr(R, "MIN_CALL_MADDS", 0)
    runs = []
    monkeypatch.setattr(_core, "rnn_loops", lambda calls, _f=_core.rnn_loops: runs.append(len(calls)) or _f(calls))
    for name, fn, args, kw in cases(rng, batch):
        x = rng.standard_normal((batch, T, I)).astype(np.float32)
        mask = rng.random((batch, T)) > 0.3
        calls = [(fn, (x, *args), dict(kw)), (fn, (x, *args), dict(kw, reverse=True, mask_bt=mask, zero_masked=True))]
        got = R.sequences(calls)
        assert got is not None
        for (_, a, k), results in zip(calls, got):
            for actual, expected in zip(results, getattr(REF, fn)(*a, **k)):
                assert_close(actual, expected, rtol=1e-5, atol=5e-5 * max(1.0, float(np.abs(expected).max())))
    assert runs == [2] * len(cases(rng, batch))


def test_sequences_one_by_one(threads, rng):
    """Calls that run one by one (None): one thread, too little work, or an activation the
    loops do not cover."""
    name, fn, args, kw = cases(rng, 2)[0]
    x = rng.standard_normal((2, T, I)).astype(np.float32)
    calls = [(fn, (x, *args), kw), (fn, (x, *args), dict(kw, reverse=True))]
    threads(1)
    assert R.sequences(calls) is None
    threads(2)
    assert R.sequences(calls) is None  # 2 x 7 steps of 130 units
    name, fn, args, kw = cases(rng, 2)[6]
    big = (fn, (rng.standard_normal((2, 1000, I)).astype(np.float32), *args), kw)
    assert R.sequences([big, (fn, big[1], dict(kw, activation="softmax"))]) is None


def test_directions_beyond_half_the_l2_split_their_units(two_threads, monkeypatch, loops, rng):
    """Directions whose recurrent weights exceed ``OWN_THREAD_L2_SHARE`` of a core's L2 cache
    run one after the other, each with its units split among the threads (each thread's share
    then stays in its L2 from step to step), and give what they give at once."""
    name, fn, args, kw = cases(rng, 1)[0]
    x = rng.standard_normal((1, 40, I)).astype(np.float32)
    calls = [(fn, (x, *args), kw), (fn, (x, *args), dict(kw, reverse=True))]
    weight_bytes = 4 * args[1].size
    monkeypatch.setattr(R, "MIN_CALL_MADDS", 0)
    monkeypatch.setattr(R, "l2_cache_bytes", lambda: int(2 * weight_bytes / R.OWN_THREAD_L2_SHARE))
    at_once = R.sequences(calls)
    assert at_once is not None
    monkeypatch.setattr(R, "l2_cache_bytes", lambda: int(weight_bytes / R.OWN_THREAD_L2_SHARE) - 4)
    assert R.sequences(calls) is None
    monkeypatch.setattr(R, "MIN_SHARE_MADDS", 1)
    split = [getattr(R, fn)(*a, **k) for _, a, k in calls]
    assert [run[1:] for run in loops[-2:]] == [(1, 2), (1, 2)]
    for a, b in zip(at_once, split):
        for actual, expected in zip(a, b):
            assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_sequences_plan_that_never_runs_at_once_packs_only_its_split(two_threads, monkeypatch, rng):
    """A bidirectional plan whose directions can never run at once (recurrent weights beyond
    ``OWN_THREAD_L2_SHARE`` of the L2 cache, at any thread count) packs its weights only for
    the one-by-one calls it makes (here units split in two), not also for one thread each,
    which would stay in memory beside them; its results are the calls' own."""
    from fastlayers.backends.types import Cell

    _, fn, args, kw = cases(rng, 1)[0]
    x = rng.standard_normal((1, 40, I)).astype(np.float32)
    weight_bytes = 4 * args[1].size
    monkeypatch.setattr(R, "MIN_CALL_MADDS", 0)
    monkeypatch.setattr(R, "MIN_SHARE_MADDS", 1)
    monkeypatch.setattr(R, "l2_cache_bytes", lambda: int(weight_bytes / R.OWN_THREAD_L2_SHARE) - 4)
    packed = []
    monkeypatch.setattr(
        R,
        "_pack_shares",
        lambda w, blocks, n_blocks, bounds, _f=R._pack_shares: (
            packed.append(len(bounds) - 1) or _f(w, blocks, n_blocks, bounds)
        ),
    )
    plan = R.sequences_plan(x, [(Cell.LSTM, args, kw), (Cell.LSTM, args, dict(kw, reverse=True))])
    got = plan(x)
    assert packed and set(packed) == {2}
    for results, k in zip(got, [kw, dict(kw, reverse=True)]):
        for actual, expected in zip(results, REF.lstm_sequence(x, *args, **k)):
            assert_close(actual, expected, rtol=1e-5, atol=5e-5 * max(1.0, float(np.abs(expected).max())))
