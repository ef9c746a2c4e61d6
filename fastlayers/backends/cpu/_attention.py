"""Attention kernels: the fused scale + mask + numerically stable softmax over the last axis of
batched (B, H, Tq, Tk) scores, in place (``attention_softmax_bhqk``), and the whole
softmax(scale q k^T + bias) v with the (batch, head) pairs shared among Numba's threads: each
pair in C on fastlayers' packed sgemm (``attention_pairs``/``attention_pairs_par``, calling
``_blas.ATTENTION``), or, where that is not built (no AVX-512F), both products per pair
through OpenBLAS and the softmax in Numba (``attention_par``).

Masks arrive as one additive float32 bias (0 where attended, -inf where masked, any finite
value for torch's float masks) broadcast over batch, head and query rows, plus an optional
causal (top-left aligned lower-triangular) mask that is never materialized.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import njit, warm_call
from . import _blas
from ._blas import sgemm
from ._elementwise import _row_max
from ._vexp import exp_inplace

#: What a row whose keys are all masked becomes (``empty`` argument).
EMPTY_NAN, EMPTY_ZERO, EMPTY_UNIFORM = 0, 1, 2

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
_NAN = np.float32(np.nan)


@njit(signatures=("void(float32[:, :, :, ::1], float32, float32[:, :, :, ::1], boolean, int64)",))
def attention_softmax_bhqk(s_bhqk, scale, bias, causal, empty):
    """s[b,h,i,:] = softmax(scale s[b,h,i,:] + bias[b,h,i,:] (+ -inf for j > i if causal)).

    ``bias`` is (B or 1, H or 1, Tq or 1, Tk), or empty (no bias). A row with every key masked
    (max = -inf) becomes NaN, 0 or 1/Tk for ``empty`` = 0, 1, 2.
    """
    nb, nh, tq, tk = s_bhqk.shape
    bits = np.empty(tk, dtype=np.int32)
    for bhi in range(nb * nh):
        _softmax_bh(s_bhqk, bhi // nh, bhi % nh, scale, bias, causal, empty, bits)


@njit(inline=True)
def _softmax_bh(s_bhqk, b, h, scale, bias, causal, empty, bits):
    """The fused scale + mask + softmax of ``attention_softmax_bhqk`` on the rows of s[b, h]."""
    tq, tk = s_bhqk.shape[2], s_bhqk.shape[3]
    has_bias = bias.shape[0] > 0
    bb = bias.shape[0] > 1
    bh = bias.shape[1] > 1
    bq = bias.shape[2] > 1
    for i in range(tq):
        row = s_bhqk[b, h, i]
        if has_bias:
            brow = bias[b if bb else 0, h if bh else 0, i if bq else 0]
            for j in range(tk):
                row[j] = row[j] * scale + brow[j]
        else:
            for j in range(tk):
                row[j] = row[j] * scale
        n = tk
        if causal and i + 1 < tk:
            n = i + 1
            for j in range(n, tk):
                row[j] = _ZERO
        valid = row[:n]
        m = _row_max(valid)
        if m == _NEG_INF:
            fill = _NAN if empty == 0 else (_ZERO if empty == 1 else _ONE / np.float32(tk))
            for j in range(tk):
                row[j] = fill
            continue
        for j in range(n):
            valid[j] -= m
        exp_inplace(valid, bits)
        total = _ZERO
        for j in range(n):
            total += valid[j]
        inv = _ONE / total
        for j in range(n):
            valid[j] *= inv


@njit(parallel=True)
def attention_par(fn, q_bhqd, k_bhkd, v_bhkv, scale, bias, causal, empty, s_bhqk, out_bhqv, parts):
    """out[b, h] = softmax(scale q[b, h] k[b, h]^T + bias) v[b, h] for every (b, h), the pairs in
    ``parts`` shares on Numba's threads; each pair's scores stay in cache between its two
    products (sgemm ``fn``, ``_blas.sgemm``) and the fused softmax, written to ``s_bhqk``."""
    nb, nh, tk = s_bhqk.shape[0], s_bhqk.shape[1], s_bhqk.shape[3]
    pairs = nb * nh
    for p in prange(parts):
        bits = np.empty(tk, dtype=np.int32)
        for bhi in range(pairs * p // parts, pairs * (p + 1) // parts):
            b, h = bhi // nh, bhi % nh
            sgemm(fn, q_bhqd[b, h], k_bhkd[b, h], s_bhqk[b, h], True, 0.0)
            _softmax_bh(s_bhqk, b, h, scale, bias, causal, empty, bits)
            sgemm(fn, s_bhqk[b, h], v_bhkv[b, h], out_bhqv[b, h], False, 0.0)


@njit()
def attention_pairs(afn, q_bhqd, k_bhkd, v_bhkv, scale, bias, causal, empty, s_bhqk, out_bhqv,
                    buffer_floats, p0, p1):
    """out[b, h] = softmax(scale q[b, h] k[b, h]^T + bias) v[b, h], the weights written to
    s[b, h] (an empty ``s_bhqk``: not kept), for the pairs b H + h in p0:p1, each one call of
    ``afn`` (``_blas.ATTENTION``, packing into a buffer of ``buffer_floats``)."""
    nh = out_bhqv.shape[1]
    keep = s_bhqk.shape[0] > 0
    pb = np.empty(buffer_floats, np.float32)
    for bhi in range(p0, p1):
        b, h = bhi // nh, bhi % nh
        s_at, lds = np.uintp(0), 0
        if keep:
            s_at, lds = np.uintp(s_bhqk[b, h].ctypes.data), s_bhqk.strides[2] // 4
        attention_pair(afn, q_bhqd[b, h], k_bhkd[b, h], v_bhkv[b, h], scale, bias, b, h, causal,
                       empty, s_at, lds, out_bhqv[b, h], pb)


@njit(inline=True)
def attention_pair(afn, q, k, v, scale, bias, b, h, causal, empty, s_at, lds, out, pb):
    """out = softmax(scale q k^T + bias[b, h]) v and the weights at address ``s_at`` (rows
    ``lds`` floats apart; 0: not kept), for the matrices of one (batch, head) pair (rows read
    in place), as one call of ``afn`` packing into ``pb``."""
    bias_at = np.uintp(0)
    if bias.shape[0] > 0:
        bias_at = bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0].ctypes.data
    afn(q.shape[0], k.shape[0], q.shape[1], v.shape[1], q.ctypes.data, q.strides[0] // 4,
        k.ctypes.data, k.strides[0] // 4, v.ctypes.data, v.strides[0] // 4, scale, bias_at,
        k.shape[0] if bias.shape[2] > 1 else 0, causal, empty, s_at, lds, out.ctypes.data,
        out.strides[0] // 4, pb.ctypes.data)


@njit(parallel=True)
def attention_pairs_par(afn, q_bhqd, k_bhkd, v_bhkv, scale, bias, causal, empty, s_bhqk,
                        out_bhqv, buffer_floats, parts):
    """``attention_pairs`` over every pair, in ``parts`` shares on Numba's threads."""
    pairs = out_bhqv.shape[0] * out_bhqv.shape[1]
    for p in prange(parts):
        attention_pairs(afn, q_bhqd, k_bhkd, v_bhkv, scale, bias, causal, empty, s_bhqk,
                        out_bhqv, buffer_floats, pairs * p // parts, pairs * (p + 1) // parts)


@warm_call
def warm_attention():
    """Compile the pair drivers (``warmup``) by running them on tiny heads split off a fused
    projection, as attention layers pass them: their ctypes argument has no signature string."""
    qkv = np.ones((1, 2, 3, 2, 4), np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    s = np.empty((1, 2, 2, 2), np.float32)
    out = np.empty((1, 2, 2, 4), np.float32).transpose(0, 2, 1, 3)
    no_bias, scale = np.zeros((0, 0, 0, 0), np.float32), np.float32(1.0)
    if _blas.ATTENTION is not None:
        floats = _blas.attention_buffer_floats(2, 2, 4, 4)
        attention_pairs(_blas.ATTENTION, q, k, v, scale, no_bias, 0, 0, s, out, floats, 0, 2)
        attention_pairs_par(_blas.ATTENTION, q, k, v, scale, no_bias, 0, 0, s, out, floats, 2)
    elif _blas.SGEMM is not None:
        attention_par(_blas.SGEMM, q, k, v, scale, no_bias, False, 0, s, out, 2)
