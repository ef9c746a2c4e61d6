"""Fused bias + activation kernels over rows: out[i, j] = f(x[i, j] + b[j]), f elementwise or
softmax / log-softmax over the row.

Only the activations where a compiled loop beats numpy's SIMD ufuncs are here (see
docs/design.md); exp-based ones use the vectorized ``exp_inplace``.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import njit
from ._vexp import exp_inplace

#: Activation name -> code passed to ``bias_act_rows``.
CODES = {name: code for code, name in enumerate((
    "linear", "relu", "relu6", "leaky_relu", "hard_sigmoid", "softsign", "sigmoid", "silu",
    "gelu", "gelu_tanh", "exponential", "softmax", "log_softmax"))}
(LINEAR, RELU, RELU6, LEAKY_RELU, HARD_SIGMOID, SOFTSIGN, SIGMOID, SILU, GELU, GELU_TANH,
 EXPONENTIAL, SOFTMAX, LOG_SOFTMAX) = range(len(CODES))

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_TWO = np.float32(2.0)
_HALF = np.float32(0.5)
_SIX = np.float32(6.0)
_THREE = np.float32(3.0)
_INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))
_TWO_SQRT_2_PI = np.float32(2.0 * math.sqrt(2.0 / math.pi))
_GELU_C = np.float32(0.044715)
# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0 (Numerical Recipes, rel. error < 1.2e-7)
_E = tuple(np.float32(c) for c in (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
    1.48851587, -0.82215223, 0.17087277))


@njit(inline=True)
def _erfc_t(z):
    """t = 1 / (1 + z/2) for z = |u| in the Numerical Recipes erfc fit."""
    return _ONE / (_ONE + _HALF * z)


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


@njit(inline=True)
def _activate_row(row, code, alpha, bits, scratch):
    """row[j] = f(row[j]) in place for the activation ``code``; NaN propagates.

    ``bits`` (int32) and ``scratch`` (float32) are work rows at least as long as ``row``.
    """
    n = row.shape[0]
    if code == RELU:
        for j in range(n):
            v = row[j]
            row[j] = _ZERO if v < _ZERO else v
    elif code == RELU6:
        for j in range(n):
            v = row[j]
            row[j] = _ZERO if v < _ZERO else (_SIX if v > _SIX else v)
    elif code == LEAKY_RELU:
        for j in range(n):
            v = row[j]
            row[j] = alpha * v if v < _ZERO else v
    elif code == HARD_SIGMOID:
        for j in range(n):
            v = row[j] + _THREE
            row[j] = (_ZERO if v < _ZERO else (_SIX if v > _SIX else v)) / _SIX
    elif code == SOFTSIGN:
        for j in range(n):
            v = row[j]
            row[j] = v / (_ONE + abs(v))
    elif code == EXPONENTIAL:
        exp_inplace(row, bits)
    elif code == SIGMOID or code == SILU or code == GELU_TANH:
        # sigmoid(s) = 1 / (1 + exp(-s)); silu: x sigmoid(x); gelu_tanh: x sigmoid(2u)
        x = row.copy()
        for j in range(n):
            v = x[j]
            if code == GELU_TANH:
                row[j] = -_TWO_SQRT_2_PI * (v + _GELU_C * v * v * v)
            else:
                row[j] = -v
        exp_inplace(row, bits)
        for j in range(n):
            s = _ONE / (_ONE + row[j])
            row[j] = s if code == SIGMOID else x[j] * s
    elif code == SOFTMAX or code == LOG_SOFTMAX:
        m = _row_max(row)
        for j in range(n):
            row[j] -= m
        scratch[:n] = row
        exp_inplace(scratch, bits)
        s = _ZERO
        for j in range(n):
            s += scratch[j]
        if code == SOFTMAX:
            inv = _ONE / s
            for j in range(n):
                row[j] = scratch[j] * inv
        else:
            # (x - max) is stored before log-sum is subtracted: fastmath reassociation could
            # otherwise form x - (max + log-sum), losing small results to rounding at large max
            log_s = np.float32(math.log(s))
            for j in range(n):
                row[j] -= log_s
    elif code == GELU:
        # gelu(x) = x/2 erfc(-x / sqrt 2)
        x = row.copy()
        for j in range(n):
            z = abs(x[j] * _INV_SQRT2)
            t = _erfc_t(z)
            p = _E[0] + t * (_E[1] + t * (_E[2] + t * (_E[3] + t * (_E[4] + t * (
                _E[5] + t * (_E[6] + t * (_E[7] + t * (_E[8] + t * _E[9]))))))))
            row[j] = p - z * z
        exp_inplace(row, bits)
        for j in range(n):
            v = x[j]
            r = _erfc_t(abs(v * _INV_SQRT2)) * row[j]     # erfc(|v| / sqrt 2)
            row[j] = _HALF * v * (r if v < _ZERO else _TWO - r)


#: Elementwise activations run over the flat output in chunks of this many values.
_CHUNK = 4096


@njit(signatures=("void(float32[:, ::1], float32[::1], float32[:, ::1], int64, float32)",))
def bias_act_rows(x, b, out, code, alpha):
    """out[i, j] = f(x[i, j] + b[j]); ``b`` empty means no bias; ``out`` may be ``x``."""
    n, d = x.shape
    has_bias = b.shape[0] == d
    if x.ctypes.data == out.ctypes.data:
        # its own loop: LLVM's runtime overlap test between x and out fails when they are the
        # same array and sends a two-array loop to its scalar version (2.5x slower)
        if has_bias:
            for i in range(n):
                orow = out[i]
                for j in range(d):
                    orow[j] += b[j]
    else:
        for i in range(n):
            xr = x[i]
            orow = out[i]
            if has_bias:
                for j in range(d):
                    orow[j] = xr[j] + b[j]
            else:
                for j in range(d):
                    orow[j] = xr[j]
    if code == LINEAR or n * d == 0:
        return
    if code == SOFTMAX or code == LOG_SOFTMAX:
        bits = np.empty(d, dtype=np.int32)
        scratch = np.empty(d, dtype=np.float32)
        for i in range(n):
            _activate_row(out[i], code, alpha, bits, scratch)
        return
    flat = out.reshape(-1)        # elementwise: one pass over the whole output, in chunks
    size = flat.shape[0]
    bits = np.empty(min(size, _CHUNK), dtype=np.int32)
    for s in range(0, size, _CHUNK):
        _activate_row(flat[s: s + _CHUNK], code, alpha, bits, flat[:0])
