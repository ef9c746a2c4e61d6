"""numba.cuda kernels of the CUDA backend over strided and indexed data: strided copies and
binary ops, fills and masks, id checks, row gathers and the hierarchical softmax's paths (the
conventions of ``kernels.py``: preallocated outputs, float32 constants, a ``bad`` flag for a
value check).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int64

from . import kernels as K

# ------------------------------------------------------------------- strided copies and binary ops
#: Binary op codes of ``binary_strided``: a + b, a - b, a b, max, min (NaN wins), the two
#: halves of Keras's Normalization: a / max(sqrt(b), 1e-7) and a max(sqrt(b), 1e-7), and a / b.
OP_ADD, OP_SUB, OP_MUL, OP_MAX, OP_MIN, OP_DIV_STD, OP_MUL_STD, OP_DIV = range(8)
_STD_FLOOR = np.float32(1e-7)


@cuda.jit(device=True, inline=True)
def _offset(i, shape, strides, base):
    """base + sum_k i_k strides[k] for the 6-D index (i_0 .. i_5) of flat position i in shape."""
    off = base
    for k in range(5, -1, -1):
        off += (i % shape[k]) * strides[k]
        i //= shape[k]
    return off


@cuda.jit
def copy_strided(src, s_off, s_str, dst, d_off, d_str, shape):
    """dst[d_off + i . d_str] = src[s_off + i . s_str] for every 6-D index i < shape (flat arrays).

    With element strides and offsets of numpy views this is any transpose, flip, basic slice,
    broadcast (stride 0) or placement into a larger array (padding, concatenation).
    """
    i = cuda.grid(1)
    if i < shape[0] * shape[1] * shape[2] * shape[3] * shape[4] * shape[5]:
        dst[_offset(i, shape, d_str, d_off)] = src[_offset(i, shape, s_str, s_off)]


@cuda.jit(device=True, inline=True)
def _std(v):
    """max(sqrt(v), 1e-7), NaN propagating (Keras Normalization's divisor)."""
    s = math.sqrt(v)
    return s if (s > _STD_FLOOR or s != s) else _STD_FLOOR


@cuda.jit
def binary_strided(a, a_off, a_str, b, b_off, b_str, out, shape, op, alpha, beta):
    """out[i] = (alpha a[a_off + i . a_str]) op (beta b[b_off + i . b_str]) for every 6-D index i
    (out C-ordered and flat; stride 0 broadcasts): op in OP_ADD .. OP_DIV."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    x = alpha * a[_offset(i, shape, a_str, a_off)]
    y = beta * b[_offset(i, shape, b_str, b_off)]
    if op == OP_ADD:
        v = x + y
    elif op == OP_SUB:
        v = x - y
    elif op == OP_MUL:
        v = x * y
    elif op == OP_MAX:
        v = x if (x > y or x != x) else y
    elif op == OP_MIN:
        v = x if (x < y or x != x) else y
    elif op == OP_DIV_STD:
        v = x / _std(y)
    elif op == OP_MUL_STD:
        v = x * _std(y)
    elif y == y and y != K.ZERO:
        v = x / y
    else:  # IEEE division by 0 or NaN (numba's float division raises on 0)
        v = K.NAN if (y != y or x != x or x == K.ZERO) else (K.POS_INF if x > K.ZERO else K.NEG_INF)
    out[i] = v


@cuda.jit
def fill_flat(out, value):
    """out[i] = value."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = value


@cuda.jit
def keep_f32(x, thr, y):
    """y[i] = 1 where x[i] > thr (a Keras mask: True, or > 0.5 for floats) else 0, as float32."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = K.ONE if x[i] > thr else K.ZERO


@cuda.jit
def check_range(ids, size, bad):
    """bad[0] = 1 where an index ids[i] lies outside [0, size)."""
    i = cuda.grid(1)
    if i < ids.shape[0] and (ids[i] < 0 or ids[i] >= size):
        bad[0] = K.ONE


@cuda.jit
def nonzero_u8(x, zero, y):
    """y[i] = 1 where x[i] != 0 else 0 (a mask as uint8; ``zero`` has x's type)."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = 1 if x[i] != zero else 0


@cuda.jit
def keep_bias_strided(m, m_off, m_str, thr, out, shape):
    """out[i] = 0 where m[m_off + i . m_str] > thr (attend) else -inf: a Keras mask as an additive
    attention bias, broadcast through strides (``thr`` has m's type: 0.5 for floats, 0 for ints)."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = K.ZERO if m[_offset(i, shape, m_str, m_off)] > thr else K.NEG_INF


# ------------------------------------------------------------------------- gathers and checks
_INT64_LIMIT = np.float32(2.0**62)


@cuda.jit
def whole_floats_to_int64(x, y, bad):
    """y[i] = x[i] as int64 when it is a finite whole number, else -1 and bad[0] = 1."""
    i = cuda.grid(1)
    if i >= y.shape[0]:
        return
    v = x[i]
    if abs(v) < _INT64_LIMIT and float32(int64(v)) == v:
        y[i] = int64(v)
    else:
        y[i] = -1
        bad[0] = K.ONE


@cuda.jit
def gather_rows(ids_n, table_vd, y_nd, bad):
    """y[n] = table[ids[n]]; an id outside [0, V) gives a zero row and sets bad[0] = 1."""
    d, n = cuda.grid(2)
    if n >= y_nd.shape[0] or d >= y_nd.shape[1]:
        return
    k = ids_n[n]
    if k >= 0 and k < table_vd.shape[0]:
        y_nd[n, d] = table_vd[k, d]
    else:
        y_nd[n, d] = K.ZERO
        bad[0] = K.ONE


@cuda.jit(device=True, inline=True)
def _log_sigmoid(z):
    """log sigmoid(z) = -(log1p(exp(-|z|)) + max(-z, 0)), stable for large |z|."""
    return -(math.log1p(math.exp(-abs(z))) + (-z if z < K.ZERO else K.ZERO))


@cuda.jit(device=True, inline=True)
def _path_log_prob(z_bn, b, nodes_cd, signs_cd, c):
    """sum_d log sigmoid(sign[c, d] z[b, node[c, d]]) over the steps of class c with sign != 0."""
    acc = K.ZERO
    for d in range(nodes_cd.shape[1]):
        sign = signs_cd[c, d]
        if sign != K.ZERO:
            acc += _log_sigmoid(sign * z_bn[b, nodes_cd[c, d]])
    return acc


@cuda.jit
def hsoftmax_rows(z_bn, nodes_cd, signs_cd, y_bc):
    """y[b, c] = log p(c | x[b]) of a hierarchical softmax (``_path_log_prob``; z = x w + b)."""
    c, b = cuda.grid(2)
    if b < y_bc.shape[0] and c < y_bc.shape[1]:
        y_bc[b, c] = _path_log_prob(z_bn, b, nodes_cd, signs_cd, c)


@cuda.jit
def hsoftmax_class_rows(z_bn, nodes_cd, signs_cd, classes_b, y_b, bad):
    """y[b] = log p(classes[b] | x[b]); a class outside [0, C) gives 0 and sets bad[0] = 1."""
    b = cuda.grid(1)
    if b >= y_b.shape[0]:
        return
    c = classes_b[b]
    if c >= 0 and c < nodes_cd.shape[0]:
        y_b[b] = _path_log_prob(z_bn, b, nodes_cd, signs_cd, c)
    else:
        y_b[b] = K.ZERO
        bad[0] = K.ONE
