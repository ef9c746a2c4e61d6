"""torch-style recurrent modules against torch.nn: RNN (tanh, relu), LSTM (num_layers,
bidirectional, batch_first, proj_size, bias), GRU and the cells, loaded from torch state dicts;
plus the compiled loops against ReferenceOps (hypothesis) and torch-side streaming."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlayers
import fastlayers.nn as nn
from fastlayers.backends import get_ops
from fastlayers.errors import ShapeError, UnsupportedError

from ..conftest import assert_close

L, N, H_IN, H = 5, 3, 4, 6


def pair(torch, name, *args, **kwargs):
    """torch.nn.<name> with random weights and our module loaded from its state dict."""
    ref = getattr(torch.nn, name)(*args, **kwargs).eval()
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert all(ours.state_dict()[k].shape == tuple(v.shape) for k, v in ref.state_dict().items())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    return ref, ours


def run_torch(torch, ref, x, hx=None):
    with torch.no_grad():
        tx = torch.from_numpy(x)
        if hx is None:
            return ref(tx)
        thx = tuple(torch.from_numpy(h) for h in hx) if isinstance(hx, tuple) else torch.from_numpy(hx)
        return ref(tx, thx)


def flat(out):
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in flat(o)]
    return [out.numpy() if hasattr(out, "numpy") else np.asarray(out)]


def compare(actual, expected, rtol=1e-5, atol=2e-6):
    a, e = flat(actual), flat(expected)
    assert len(a) == len(e)
    for u, v in zip(a, e):
        assert u.shape == v.shape
        assert_close(u, v, rtol=rtol, atol=atol)


CASES = [
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2}),
    ("RNN", {"bidirectional": True, "batch_first": True}),
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"batch_first": True, "bias": False}),
    ("LSTM", {"proj_size": 3}),
    ("LSTM", {"proj_size": 2, "num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {"bias": False}),
]


@pytest.mark.parametrize("name,kwargs", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("with_hx", [False, True])
def test_module_matches_torch(torch, rng, backend, name, kwargs, with_hx):
    ref, ours = pair(torch, name, H_IN, H, **kwargs)
    shape = (N, L, H_IN) if kwargs.get("batch_first") else (L, N, H_IN)
    x = rng.standard_normal(shape).astype(np.float32)
    hx = None
    if with_hx:
        d = (2 if kwargs.get("bidirectional") else 1) * kwargs.get("num_layers", 1)
        h = rng.standard_normal((d, N, kwargs.get("proj_size") or H)).astype(np.float32)
        hx = (h, rng.standard_normal((d, N, H)).astype(np.float32)) if name == "LSTM" else h
    compare(ours(x, hx), run_torch(torch, ref, x, hx))


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU"])
def test_unbatched_input_matches_torch(torch, rng, backend, name):
    ref, ours = pair(torch, name, H_IN, H, num_layers=2)
    x = rng.standard_normal((L, H_IN)).astype(np.float32)
    compare(ours(x), run_torch(torch, ref, x))


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_long_sequence_matches_torch(torch, rng, name):
    """T = 1000 at batch 1 and 64: finite and equal to torch under both backends."""
    ref, ours = pair(torch, name, H_IN, 16, batch_first=True)
    for batch in (1, 64):
        x = rng.standard_normal((batch, 1000, H_IN)).astype(np.float32)
        expected = run_torch(torch, ref, x)
        for backend in ("reference", "cpu"):
            if backend == "reference" and batch == 64:
                continue  # the numpy loop is the slow oracle; batch 1 covers it
            with fastlayers.use_ops(backend):
                out = ours(x)
            assert np.isfinite(out[0]).all()
            compare(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("RNNCell", {}),
        ("RNNCell", {"nonlinearity": "relu"}),
        ("LSTMCell", {}),
        ("GRUCell", {}),
        ("GRUCell", {"bias": False}),
    ],
)
@pytest.mark.parametrize("batched", [True, False])
def test_cells_match_torch(torch, rng, backend, name, kwargs, batched):
    ref, ours = pair(torch, name, H_IN, H, **kwargs)
    x = rng.standard_normal((N, H_IN) if batched else (H_IN,)).astype(np.float32)
    hshape = (N, H) if batched else (H,)
    h = rng.standard_normal(hshape).astype(np.float32)
    hx = (h, rng.standard_normal(hshape).astype(np.float32)) if name == "LSTMCell" else h
    compare(ours(x, hx), run_torch(torch, ref, x, hx))
    compare(ours(x), run_torch(torch, ref, x))


def test_weights_reloaded_after_load_state_dict(torch, rng):
    ref, ours = pair(torch, "LSTM", H_IN, H)
    x = rng.standard_normal((L, N, H_IN)).astype(np.float32)
    ours(x)  # fills the canonical-weight cache
    ref2 = torch.nn.LSTM(H_IN, H).eval()
    ours.load_state_dict(ref2.state_dict())
    compare(ours(x), run_torch(torch, ref2, x))


def test_errors():
    m = nn.LSTM(H_IN, H, num_layers=2)
    with pytest.raises(ShapeError, match="feature size 4"):
        m(np.zeros((L, N, 5), np.float32))
    with pytest.raises(ShapeError, match="h_0"):
        m(np.zeros((L, N, H_IN), np.float32), (np.zeros((1, N, H)), np.zeros((2, N, H))))
    with pytest.raises(ValueError, match="proj_size"):
        nn.LSTM(H_IN, H, proj_size=H)
    with pytest.raises(UnsupportedError, match="bidirectional"):
        nn.GRU(H_IN, H, bidirectional=True).get_stream_state(1)


@pytest.mark.parametrize(
    "name,kwargs", [("LSTM", {"num_layers": 2, "proj_size": 3}), ("GRU", {"batch_first": True}), ("RNN", {})]
)
def test_stream_chunks_equal_full_sequence(rng, backend, name, kwargs):
    m = getattr(nn, name)(H_IN, H, **kwargs)
    bf = kwargs.get("batch_first", False)
    x = rng.standard_normal((2, 9, H_IN) if bf else (9, 2, H_IN)).astype(np.float32)
    full, _ = m(x)
    state = m.get_stream_state(2)
    cut = (lambda a, b: x[:, a:b]) if bf else (lambda a, b: x[a:b])
    parts = [m.stream(cut(0, 4), state), m.stream(cut(4, 5), state), m.stream(cut(5, 9), state)]
    assert state.steps == 9
    # the chunks' input products take other GEMM paths than the whole sequence's (a few
    # rows against many): the project's per-op tolerance, not bits
    assert_close(np.concatenate(parts, axis=1 if bf else 0), full, rtol=1e-5, atol=1e-6)
    other = state.copy()
    state.reset()
    assert np.all(state["h"] == 0) and not np.all(other["h"] == 0)


# ----------------------------------------------------------------- compiled loops vs numpy
@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 5),
    steps=st.integers(1, 6),
    units=st.integers(1, 9),
    kind=st.sampled_from(["lstm", "lstm_proj", "gru", "gru_before", "rnn", "rnn_relu"]),
    reverse=st.booleans(),
    sequences=st.booleans(),
    zero_masked=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpu_loops_match_reference(batch, steps, units, kind, reverse, sequences, zero_masked, masked, seed):
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x = r(batch, steps, 3)
    kw = dict(
        reverse=reverse,
        return_sequences=sequences,
        zero_masked=zero_masked,
        mask_bt=(rng.random((batch, steps)) > 0.4) if masked else None,
    )
    if kind.startswith("lstm"):
        p = 2 if kind == "lstm_proj" else units
        args = (x, r(3, 4 * units), r(p, 4 * units), r(4 * units), r(batch, p), r(batch, units))
        extra = {"w_hp": r(units, p)} if kind == "lstm_proj" else {}
        fn = "lstm_sequence"
    elif kind.startswith("gru"):
        args = (x, r(3, 3 * units), r(units, 3 * units), r(3 * units), r(3 * units), r(batch, units))
        extra, fn = {"reset_after": kind == "gru"}, "gru_sequence"
    else:
        args = (x, r(3, units), r(units, units), r(units), r(batch, units))
        extra, fn = {"activation": "relu" if kind == "rnn_relu" else "tanh"}, "rnn_sequence"
    expected = getattr(get_ops("reference"), fn)(*args, **extra, **kw)
    actual = getattr(get_ops("cpu"), fn)(*args, **extra, **kw)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        # a relu RNN's state grows by |w_hh| per step (to ~1e3 in 6 steps): float32 rounding of
        # its large terms is an absolute error, relative to the largest value, not to each one,
        # and a small value summed from terms larger than every output carries theirs (1.9e-6
        # on 0.0274 beside a largest value of 1.19, three reversed relu steps of 8 units): the
        # per-op tolerance, 1e-5 of the outputs' scale
        assert_close(a, e, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(e).max(initial=0.0))))


def test_cpu_loops_propagate_nan():
    """NaN inputs reach every output and the state (the activations' accuracy against float64:
    test_recurrent_shares.py)."""
    y, h = get_ops("cpu").rnn_sequence(
        np.full((1, 2, 1), np.nan, np.float32),
        np.ones((1, 1), np.float32),
        np.ones((1, 1), np.float32),
        None,
        np.zeros((1, 1), np.float32),
    )
    assert np.isnan(y).all() and np.isnan(h).all()


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("LSTM", {"num_layers": 2, "bidirectional": True, "batch_first": True, "proj_size": 3}),
        ("GRU", {}),
        ("RNN", {"nonlinearity": "relu"}),
    ],
)
def test_torch_saved_modules_load(torch, rng, tmp_path, name, kwargs):
    """torch.save(module) files load through fastlayers.load (the torch reader's table)."""
    ref = getattr(torch.nn, name)(H_IN, H, **kwargs).eval()
    path = tmp_path / "m.pt"
    torch.save(ref, path)
    ours = fastlayers.load(path)
    assert type(ours) is getattr(nn, name)
    x = rng.standard_normal((2, L, H_IN)).astype(np.float32)
    compare(ours(x), run_torch(torch, ref, x))
