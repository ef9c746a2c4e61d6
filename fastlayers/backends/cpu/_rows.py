"""Row kernels over the last axis: softmax, log-softmax, layer normalization."""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from ._vexp import exp_inplace

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)

@njit(inline=True)
def _row_max(xr):
    """max_j xr[j] with eight independent accumulators, so LLVM vectorizes the reduction.

    A NaN in the row may be skipped here; it still reaches every output through the sum.
    """
    d = xr.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = xr[0]
    k = 0
    while k + 8 <= d:
        v = xr[k]
        a0 = v if v > a0 else a0
        v = xr[k + 1]
        a1 = v if v > a1 else a1
        v = xr[k + 2]
        a2 = v if v > a2 else a2
        v = xr[k + 3]
        a3 = v if v > a3 else a3
        v = xr[k + 4]
        a4 = v if v > a4 else a4
        v = xr[k + 5]
        a5 = v if v > a5 else a5
        v = xr[k + 6]
        a6 = v if v > a6 else a6
        v = xr[k + 7]
        a7 = v if v > a7 else a7
        k += 8
    m = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    for j in range(k, d):
        v = xr[j]
        m = v if v > m else m
    return m


_ROWS_SIG = ("void(float32[:, ::1], float32[:, ::1])",)


@njit(signatures=_ROWS_SIG)
def softmax_rows(x, out):
    """out[i, :] = exp(x[i] - max x[i]) / sum_j exp(x[i, j] - max x[i]); ``out`` may be ``x``."""
    n, d = x.shape
    bits = np.empty(d, dtype=np.int32)
    for i in range(n):
        xr = x[i]
        orow = out[i]
        m = _row_max(xr)
        for j in range(d):
            orow[j] = xr[j] - m
        exp_inplace(orow, bits)
        s = _ZERO
        for j in range(d):
            s += orow[j]
        inv = _ONE / s
        for j in range(d):
            orow[j] *= inv


@njit(signatures=_ROWS_SIG)
def log_softmax_rows(x, out):
    """out[i, :] = (x[i] - max x[i]) - log sum_j exp(x[i, j] - max x[i]); ``out`` must not be ``x``.

    The shifted row is stored before subtracting log-sum so fastmath reassociation cannot turn
    it into x - (max + log-sum), which loses the small results to rounding at large max.
    """
    n, d = x.shape
    bits = np.empty(d, dtype=np.int32)
    e = np.empty(d, dtype=np.float32)
    for i in range(n):
        xr = x[i]
        orow = out[i]
        m = _row_max(xr)
        for j in range(d):
            orow[j] = xr[j] - m
        e[:] = orow
        exp_inplace(e, bits)
        s = _ZERO
        for j in range(d):
            s += e[j]
        log_s = np.float32(math.log(s))
        for j in range(d):
            orow[j] -= log_s


@njit(signatures=("void(float32[:, ::1], float32[::1], float32[::1], float32, boolean, "
                  "float32[:, ::1])",))
def layer_norm_rows(x, gamma, beta, eps, rms, out):
    """out[i] = gamma (x[i] - mean) / sqrt(var + eps) + beta (rms: gamma x[i] / sqrt(mean x^2 + eps)).

    Empty ``gamma``/``beta`` mean no scale/offset. Statistics accumulate in float64.
    """
    n, d = x.shape
    has_gamma = gamma.shape[0] == d
    has_beta = beta.shape[0] == d
    for i in range(n):
        xr = x[i]
        orow = out[i]
        mean = 0.0
        if not rms:
            for j in range(d):
                mean += xr[j]
            mean /= d
        var = 0.0
        for j in range(d):
            c = xr[j] - mean
            var += c * c
        var /= d
        inv = np.float32(1.0 / math.sqrt(var + eps))
        m32 = np.float32(mean)
        for j in range(d):
            v = (xr[j] - m32) * inv
            if has_gamma:
                v *= gamma[j]
            if has_beta:
                v += beta[j]
            orow[j] = v


@njit(signatures=("void(float32[:, ::1], float32[::1], float32[::1], float32[:, ::1])",))
def scale_shift_rows(x, scale, shift, out):
    """out[i, c] = x[i, c] scale[c] + shift[c] (inference batch normalization, channels last)."""
    n, d = x.shape
    for i in range(n):
        xr = x[i]
        orow = out[i]
        for j in range(d):
            orow[j] = xr[j] * scale[j] + shift[j]
