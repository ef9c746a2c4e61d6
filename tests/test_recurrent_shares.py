"""The recurrent loops split over threads (units per share with a barrier per step, or rows of
the batch per share) against ReferenceOps: every layer kind and option, odd unit counts, the
fallback when a share cannot run at once, and the loops without sgemm."""

from __future__ import annotations

import contextlib
import time

import numba
import numpy as np
import pytest

from fastlayers.backends import recurrent_reference as REF
from fastlayers.backends.cpu import _recurrent as K
from fastlayers.backends.cpu import _blas, _split, _sync
from fastlayers.backends.cpu import recurrent as R

from .conftest import assert_close

B, T, I, U, P = 8, 7, 5, 130, 64          # enough work per step for two shares


def weights(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def cases(rng):
    """(name, compiled function, reference function, positional args) for every loop kind."""
    h0 = rng.standard_normal((B, U)).astype(np.float32)
    wl = (weights(rng, I, 4 * U), weights(rng, U, 4 * U), weights(rng, 4 * U))
    wp = weights(rng, U, P)
    wg = (weights(rng, I, 3 * U), weights(rng, U, 3 * U), weights(rng, 3 * U))
    wr = (weights(rng, I, U), weights(rng, U, U), weights(rng, U))
    return [
        ("lstm", "lstm_sequence", (*wl, h0, h0), {}),
        ("lstm_proj", "lstm_sequence", (wl[0], wl[1][:P], wl[2], h0[:, :P].copy(), h0),
         {"w_hp": wp}),
        ("gru", "gru_sequence", (*wg, weights(rng, 3 * U), h0), {}),
        ("gru_reset_before", "gru_sequence", (*wg, None, h0), {"reset_after": False}),
        ("rnn", "rnn_sequence", (*wr, h0), {}),
        ("rnn_relu", "rnn_sequence", (*wr, h0), {"activation": "relu"}),
        ("rnn_no_bias", "rnn_sequence", (*wr[:2], None, h0), {}),
    ]


OPTIONS = [{}, {"reverse": True, "return_sequences": False},
           {"mask": True, "zero_masked": True}, {"mask": True, "reverse": True}]


def check(rng, name, fn, args, kw, options, ids=False):
    """With ``ids``, the inputs are one-hot rows of the input weights (an embedding folded into
    the layer), read in place by the loops; the bias then comes with them."""
    x = rng.integers(0, I, (B, T)) if ids else rng.standard_normal((B, T, I)).astype(np.float32)
    opts = dict(options)
    if opts.pop("mask", False):
        mask = rng.random((B, T)) > 0.3
        mask[0] = False                       # a sample without any valid step
        opts["mask_bt"] = mask
    actual = getattr(R, fn)(x, *args, **kw, **opts)
    expected = getattr(REF, fn)(x, *args, **kw, **opts)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        # the ReLU RNN grows to ~2e3 in 7 steps: float32 keeps about 1e-4 absolute there, and
        # sums taken in another order (fastlayers' sgemm vs numpy's) differ by that much; a
        # tanh RNN's 7 steps reached 2.2e-5 on values below 1 (a model's tolerance: 1e-4)
        assert_close(a, e, rtol=1e-5, atol=5e-5 * max(1.0, float(np.abs(e).max())))


@pytest.fixture
def count_regions(monkeypatch):
    """Count the parallel regions the loops start."""
    counts = {}
    for driver in ("lstm_all", "gru_all", "rnn_all", "lstm_rows_all", "gru_rows_all",
                   "rnn_rows_all", "lstm_rows_one", "gru_rows_one", "rnn_rows_one"):
        def counted(*a, _f=getattr(K, driver), _name=driver):
            counts[_name] = counts.get(_name, 0) + 1
            return _f(*a)
        monkeypatch.setattr(K, driver, counted)
    return counts


@pytest.mark.parametrize("inputs", ["floats", "ids"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("product", ["own sgemm", "openblas"])
@pytest.mark.parametrize("split", ["units", "rows"])
def test_shared_loops_match_reference(monkeypatch, count_regions, rng, options, product, split,
                                      inputs):
    """Both product routes: fastlayers' sgemm on packed weights (where the CPU has AVX-512F)
    and numpy's CBLAS sgemm; both ways to share a loop (the weight-size limit set to force
    each); float inputs and ids of the input weights' rows. On the packed sgemm, batch shares
    project their own rows (no separate projection); ids are never projected."""
    projections = []
    monkeypatch.setattr(R, "_input_projection",
                        lambda *a, _f=R._input_projection: projections.append(1) or _f(*a))
    if product == "openblas":
        monkeypatch.setattr(_blas, "PACKED", None)
    elif _blas.PACKED is None:
        pytest.skip("fastlayers' sgemm needs AVX-512F and the built extension")
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    monkeypatch.setattr(R, "ROW_SHARE_MAX_BYTES", 0 if split == "units" else 1 << 30)
    for name, fn, args, kw in cases(rng):
        check(rng, name, fn, args, kw, options, ids=inputs == "ids")
    own_rows = split == "rows" and product == "own sgemm"
    assert len(projections) == (0 if own_rows or inputs == "ids" else 7)
    if split == "rows":
        assert count_regions == {"lstm_rows_all": 2, "gru_rows_all": 2, "rnn_rows_all": 3}
    else:
        assert sum(count_regions.values()) == (7 if _sync.barrier_safe() else 0)
        assert all(not k.startswith(("lstm_rows", "gru_rows", "rnn_rows")) for k in count_regions)


@pytest.mark.parametrize("batch,threads,parts", [(8, 2, 2), (12, 3, 3), (12, 2, 2), (9, 2, 1),
                                                 (8, 4, 2), (6, 2, 1), (4, 2, 1)])
def test_batch_shares_are_equal_and_big_enough(monkeypatch, batch, threads, parts):
    """Shares of the batch: equal, at least MIN_SHARE_ROWS rows each (else units are shared)."""
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    assert R._row_parts(batch, 128 * 512) == parts
    assert R._row_parts(batch, R.ROW_SHARE_MAX_BYTES // 4 + 1) == 1


def test_batch_shares_run_serially_when_the_slot_is_taken(monkeypatch, count_regions, rng):
    """Another call holds the parallel slot: the batch shares run one after the other."""
    monkeypatch.setattr(_split, "thread_count", lambda: 2)

    @contextlib.contextmanager
    def slot_taken(rows, min_rows):
        yield 1

    monkeypatch.setattr(R, "shares", slot_taken)
    name, fn, args, kw = cases(rng)[0]
    check(rng, name, fn, args, kw, {"mask": True, "zero_masked": True})
    assert count_regions == {"lstm_rows_one": 1}


def test_small_loops_stay_serial(monkeypatch, count_regions, rng):
    """Too little work per step for a second thread: one share, no parallel region."""
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    x = rng.standard_normal((1, 4, 3)).astype(np.float32)
    h0 = np.zeros((1, 32), np.float32)
    R.lstm_sequence(x, weights(rng, 3, 128), weights(rng, 32, 128), None, h0, h0)
    assert count_regions == {}


def test_share_bounds_cover_units_in_whole_vectors():
    assert R._bounds(256, 2).tolist() == [0, 128, 256]
    assert R._bounds(130, 2).tolist() == [0, 64, 130]
    assert R._bounds(20, 2).tolist() == [0, 10, 20]      # fewer than 16 per share: any width
    packed = R._pack(np.arange(2 * 12, dtype=np.float32).reshape(2, 12), (0, 2), 3,
                     np.array([0, 1, 4]))
    assert packed.shape == (2, 2, 6)
    np.testing.assert_array_equal(packed[0, 0], [0, 8, 0, 0, 0, 0])
    np.testing.assert_array_equal(packed[1, 1], [13, 14, 15, 21, 22, 23])


def test_shares_that_cannot_meet_fall_back_to_serial(monkeypatch, rng):
    """More shares than running threads: the waiting share gives up (SPIN_LIMIT), every share
    returns and the loop runs again serially with the same result."""
    if not _sync.barrier_safe():
        pytest.skip("the barrier is used only with the OpenMP threading layer")
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)

    @contextlib.contextmanager
    def three_shares(units, min_units):
        yield 3

    monkeypatch.setattr(R, "shares", three_shares)
    monkeypatch.setattr(R, "ROW_SHARE_MAX_BYTES", 0)           # share the units
    gave_up = []
    monkeypatch.setattr(R, "aborted", lambda sync: gave_up.append(_sync.aborted(sync)) or gave_up[-1])
    name, fn, args, kw = cases(rng)[0]
    monkeypatch.setattr(numba, "get_num_threads", lambda: 3)
    numba.set_num_threads(2)                 # Numba's team: 2 threads for 3 shares
    start = time.perf_counter()
    check(rng, name, fn, args, kw, {})
    assert gave_up == [True]
    assert time.perf_counter() - start < 30


def test_loops_without_sgemm_match_reference(rng):
    """Numba-only products (a numpy without OpenBLAS's CBLAS: ``SGEMM`` None)."""
    x = rng.standard_normal((3, T, I)).astype(np.float32)
    w_ig, w_hh = weights(rng, I, U), weights(rng, U, U)
    h0 = rng.standard_normal((3, U)).astype(np.float32)
    xw = np.ascontiguousarray(np.swapaxes(x, 0, 1) @ w_ig).reshape(T * 3, U)   # row t B + b
    bounds = np.array([0, U])
    hbuf = np.zeros((2, 3, U), np.float32)
    hbuf[0] = h0
    y = np.empty((3, T, U), np.float32)
    K.rnn_one(None, (xw, R._step_rows(1, T, 3)[0], w_hh[None], np.zeros((1, 0), np.float32), hbuf,
                     np.zeros((0, 0), np.uint8), False, False, K.TANH, y,
                     np.zeros((3, U), np.float32), np.empty((1, 3, U), np.float32),
                     np.empty((1, U), np.float32), np.empty((1, U), np.int32), bounds,
                     np.zeros(2, np.int64)))
    expected, h = REF.rnn_sequence(x, w_ig, w_hh, None, h0)
    assert_close(y, expected, rtol=1e-5, atol=2e-5)
    assert_close(hbuf[T % 2], h, rtol=1e-5, atol=2e-5)


def test_step_rows_and_ids_are_writable_int64():
    """The loops' row index, for projected inputs and for ids, is a writable C-contiguous int64
    array whatever the shares (Numba compiles every loop again for a read-only one), and so is a
    table given read-only."""
    table = np.ones((5, 8), np.float32)
    table.flags.writeable = False
    for parts in (1, 2):
        rows = R._step_rows(parts, 3, 2)
        assert rows.flags.writeable and rows.flags.c_contiguous and rows.dtype == np.int64
        assert rows[-1].tolist() == [[0, 1], [2, 3], [4, 5]]
        source, ids = R._table_rows(np.arange(6).reshape(2, 3) % 5, table, None, parts)
        assert source.flags.writeable and ids.flags.writeable and ids.dtype == np.int64
        assert ids.shape == (parts, 3, 2 // parts)


@pytest.mark.parametrize("batch", [1, 17, 31])
@pytest.mark.parametrize("activations", [("tanh", "sigmoid"), ("relu", "hard_sigmoid")])
def test_lstm_gate_pass_with_either_activation_pair(rng, batch, activations):
    """The LSTM loop's gate pass (Numba, one pass per activation) for the default and other
    activation pairs, with a mask, at batch sizes whose step products take each register tile
    height of the packed sgemm (1: the gemv; 17 = 9 + 8; 31 = 14 + 9 + 8)."""
    t, i, u = 6, 5, 37
    x = rng.standard_normal((batch, t, i)).astype(np.float32)
    w = [weights(rng, *s) for s in [(i, 4 * u), (u, 4 * u), (4 * u,)]]
    h0, c0 = (rng.standard_normal((batch, u)).astype(np.float32) for _ in range(2))
    kw = {"activation": activations[0], "recurrent_activation": activations[1],
          "mask_bt": rng.random((batch, t)) > 0.3}
    for got, want in zip(R.lstm_sequence(x, *w, h0, c0, **kw),
                         REF.lstm_sequence(x, *w, h0, c0, **kw)):
        assert_close(got, want, rtol=1e-5, atol=1e-5)
