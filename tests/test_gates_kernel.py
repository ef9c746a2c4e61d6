"""The C gate pass of the LSTM loops (``_gates_kernel.h``, ``_blas.LSTM_GATES``) against float64
numpy, and the loops with it and with their Numba gate pass against ReferenceOps."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends import recurrent_reference as REF
from fastlayers.backends.cpu import _blas
from fastlayers.backends.cpu import recurrent as R

from .conftest import assert_close

needs_gates = pytest.mark.skipif(_blas.LSTM_GATES is None,
                                 reason="the C gate pass needs AVX-512F and the built extension")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gates(n, g, xw, xstride, c):
    h = np.full(n, np.nan, np.float32)
    c = c.copy()
    _blas.LSTM_GATES(n, g.ctypes.data, xw.ctypes.data, xstride, c.ctypes.data, h.ctypes.data)
    return c, h


@needs_gates
@pytest.mark.parametrize("n", [1, 5, 16, 17, 33, 130])
def test_lstm_gate_pass_matches_float64(rng, n):
    """Every lane count (masked tail), gate blocks of the input projection ``xstride`` apart."""
    xstride = n + 3
    g = (rng.standard_normal(4 * n) * 4).astype(np.float32)
    xw = (rng.standard_normal(4 * xstride) * 2).astype(np.float32)
    c0 = (rng.standard_normal(n) * 2).astype(np.float32)
    c, h = _gates(n, g, xw, xstride, c0)
    pre = [g[k * n:(k + 1) * n].astype(np.float64) + xw[k * xstride:k * xstride + n]
           for k in range(4)]
    c_want = _sigmoid(pre[1]) * c0 + _sigmoid(pre[0]) * np.tanh(pre[2])
    h_want = _sigmoid(pre[3]) * np.tanh(c_want)
    assert_close(c, c_want, rtol=1e-6, atol=1e-7)
    assert_close(h, h_want, rtol=1e-6, atol=1e-7)


@needs_gates
def test_sigmoid_and_tanh_of_the_gate_pass_hold_float32_precision():
    """sigmoid through i (f = 0, g~ = tanh 1-ish constant, c0 = 0 -> c = sigmoid(i) tanh(g)),
    tanh through g~ (i saturated to 1): relative error below 4e-7 on [-20, 20] and for huge
    inputs; small arguments keep relative precision (tanh's series)."""
    x = np.concatenate([np.linspace(-20, 20, 4001), [-1e30, -100, -1e-6, -1e-30, 0.0, 1e-30,
                                                     1e-6, 100, 1e30]]).astype(np.float32)
    n = x.size
    big = np.full(n, 60.0, np.float32)                # sigmoid(60) == 1 in float32
    zero = np.zeros(n, np.float32)
    xw = np.zeros(4 * n, np.float32)
    # c = sigmoid(0) * 0 + 1 * tanh(x)
    c, _ = _gates(n, np.concatenate([big, zero, x, zero]), xw, n, zero)
    want = np.tanh(x.astype(np.float64))
    assert np.all(np.abs(c - want) <= 4e-7 * np.abs(want) + 1e-45)
    # c = sigmoid(0) * 0 + sigmoid(x) * tanh(60) = sigmoid(x); below x = -88.38 (e^-x clamped
    # short of inf) the result stays sigmoid(-88.38), about 4e-39 (subnormal: absolute 1e-43)
    c, _ = _gates(n, np.concatenate([x, zero, big, zero]), xw, n, zero)
    want = _sigmoid(np.clip(x.astype(np.float64), -88.3762626647949, None))
    assert np.all(np.abs(c - want) <= 4e-7 * want + 1e-43)
    assert np.all(np.isfinite(c))


@pytest.mark.parametrize("gates", ["C", "numba"])
@pytest.mark.parametrize("activations", [("tanh", "sigmoid"), ("relu", "hard_sigmoid")])
def test_lstm_loop_with_either_gate_pass_matches_reference(monkeypatch, rng, gates, activations):
    """The loop takes the C pass for tanh/sigmoid and the Numba pass otherwise or without it."""
    if gates == "numba":
        monkeypatch.setattr(_blas, "LSTM_GATES", None)
    elif _blas.LSTM_GATES is None:
        pytest.skip("the C gate pass needs AVX-512F and the built extension")
    b, t, i, u = 3, 6, 5, 37
    x = rng.standard_normal((b, t, i)).astype(np.float32)
    w = [(rng.standard_normal(s) * 0.4).astype(np.float32) for s in [(i, 4 * u), (u, 4 * u), (4 * u,)]]
    h0, c0 = (rng.standard_normal((b, u)).astype(np.float32) for _ in range(2))
    kw = {"activation": activations[0], "recurrent_activation": activations[1]}
    for got, want in zip(R.lstm_sequence(x, *w, h0, c0, **kw), REF.lstm_sequence(x, *w, h0, c0, **kw)):
        assert_close(got, want, rtol=1e-5, atol=1e-5)
