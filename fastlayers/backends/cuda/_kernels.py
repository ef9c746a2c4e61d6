"""numba.cuda kernels of the CUDA backend (float32, C-contiguous device arrays).

Imported only by ``CudaOps`` (never by ``import fastlayers``). Kernels are compiled lazily on
first launch for the argument types they get. They take preallocated outputs and neither
allocate nor validate (``ops.py`` does). NaN propagates as in the numpy reference. Every float
constant is a module-level float32 so no float64 arithmetic enters the kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda, float32

#: Tile edge of the shared-memory matrix product (TILE x TILE threads per block): 16 on a GPU;
#: 8 in the simulator, which runs every thread of a block as a Python thread (4x fewer per block,
#: same code path: the tests' inner sizes span several tiles either way).
TILE = 8 if config.ENABLE_CUDASIM else 16

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
_NEG_INF = np.float32(-np.inf)
_NAN = np.float32(np.nan)
_INV_SQRT2 = np.float32(1.0 / np.sqrt(2.0))
_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))
_GELU_C = np.float32(0.044715)
_SELU_ALPHA = np.float32(1.6732632423543772)
_SELU_SCALE = np.float32(1.0507009873554805)

# Activation codes of the fused epilogues (softmax / log_softmax run as row kernels).
LINEAR, RELU, RELU6, LEAKY_RELU, ELU, SELU, GELU, GELU_TANH, SIGMOID, HARD_SIGMOID, TANH, \
    SOFTPLUS, SOFTSIGN, SILU, EXPONENTIAL = range(15)
CODES = {
    "linear": LINEAR, "relu": RELU, "relu6": RELU6, "leaky_relu": LEAKY_RELU, "elu": ELU,
    "selu": SELU, "gelu": GELU, "gelu_tanh": GELU_TANH, "sigmoid": SIGMOID,
    "hard_sigmoid": HARD_SIGMOID, "tanh": TANH, "softplus": SOFTPLUS, "softsign": SOFTSIGN,
    "silu": SILU, "exponential": EXPONENTIAL,
}


@cuda.jit(device=True, inline=True)
def _sigmoid(v):
    """1 / (1 + exp(-v)), stable for large |v|."""
    e = math.exp(-abs(v))
    return _ONE / (_ONE + e) if v >= _ZERO else e / (_ONE + e)


@cuda.jit(device=True)
def act(v, code, alpha):
    """f(v) for activation ``code`` (``CODES``); NaN in, NaN out."""
    if code == LINEAR:
        return v
    if code == RELU:
        return _ZERO if v < _ZERO else v
    if code == RELU6:
        return _ZERO if v < _ZERO else (_SIX if v > _SIX else v)
    if code == LEAKY_RELU:
        return v if v >= _ZERO else alpha * v
    if code == ELU:
        return v if v > _ZERO else alpha * math.expm1(v)
    if code == SELU:
        return _SELU_SCALE * (v if v > _ZERO else _SELU_ALPHA * math.expm1(v))
    if code == GELU:
        return _HALF * v * math.erfc(-v * _INV_SQRT2)
    if code == GELU_TANH:
        return _HALF * v * (_ONE + math.tanh(_SQRT_2_OVER_PI * (v + _GELU_C * v * v * v)))
    if code == SIGMOID:
        return _sigmoid(v)
    if code == HARD_SIGMOID:
        u = v + _THREE
        return (_ZERO if u < _ZERO else (_SIX if u > _SIX else u)) / _SIX
    if code == TANH:
        return math.tanh(v)
    if code == SOFTPLUS:
        return math.log1p(math.exp(-abs(v))) + (v if v > _ZERO else _ZERO)
    if code == SOFTSIGN:
        return v / (_ONE + abs(v))
    if code == SILU:
        return v * _sigmoid(v)
    return math.exp(v)  # EXPONENTIAL


# ------------------------------------------------------------------------- matrix products
@cuda.jit
def bmm_tiled(a_zmk, b_zkn, c_zmn, trans_b):
    """c[z] = a[z] b[z] (b[z]^T when trans_b, b then (Z, N, K)); a size-1 z axis broadcasts.

    One TILE x TILE block per output tile; both operands pass through shared memory tile by tile.
    """
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    z = cuda.blockIdx.z
    za = z if a_zmk.shape[0] > 1 else 0
    zb = z if b_zkn.shape[0] > 1 else 0
    m = a_zmk.shape[1]
    k = a_zmk.shape[2]
    n = c_zmn.shape[2]
    acc = _ZERO
    for k0 in range(0, k, TILE):
        ka = k0 + tx
        if row < m and ka < k:
            sa[ty, tx] = a_zmk[za, row, ka]
        else:
            sa[ty, tx] = _ZERO
        kb = k0 + ty
        if col < n and kb < k:
            if trans_b:
                sb[ty, tx] = b_zkn[zb, col, kb]
            else:
                sb[ty, tx] = b_zkn[zb, kb, col]
        else:
            sb[ty, tx] = _ZERO
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c_zmn[z, row, col] = acc


@cuda.jit
def bias_act_rows(y_rc, b_c, has_bias, code, alpha):
    """y[r, c] = f(y[r, c] + b[c]) in place."""
    c, r = cuda.grid(2)
    if r < y_rc.shape[0] and c < y_rc.shape[1]:
        v = y_rc[r, c]
        if has_bias:
            v += b_c[c]
        y_rc[r, c] = act(v, code, alpha)


@cuda.jit
def act_rows(x_rc, y_rc, code, alpha):
    """y[r, c] = f(x[r, c])."""
    c, r = cuda.grid(2)
    if r < y_rc.shape[0] and c < y_rc.shape[1]:
        y_rc[r, c] = act(x_rc[r, c], code, alpha)


@cuda.jit
def softmax_rows(y_rc, log):
    """y[r] = softmax(y[r]) (log: log_softmax) in place, one thread per row."""
    r = cuda.grid(1)
    if r >= y_rc.shape[0]:
        return
    n = y_rc.shape[1]
    m = _NEG_INF
    for j in range(n):
        v = y_rc[r, j]
        if v > m or v != v:
            m = v
    total = _ZERO
    for j in range(n):
        total += math.exp(y_rc[r, j] - m)
    if log:
        lse = math.log(total)
        for j in range(n):
            y_rc[r, j] = y_rc[r, j] - m - lse
    else:
        for j in range(n):
            y_rc[r, j] = math.exp(y_rc[r, j] - m) / total


# ------------------------------------------------------------------- convolution and pooling
@cuda.jit
def conv2d_nhwc(x_nhwc, w_hwio, b_o, has_bias, y_nhwc, sh, sw, dh, dw, pt, pl, groups, code,
                alpha):
    """y[n, oh, ow, o] = f(b[o] + sum_{i, j, c} x[n, s oh - p + d i, s ow - p + d j, g Cg + c] w[i, j, c, o]).

    One thread per output value (channels on the fast grid axis); groups == C is depthwise.
    """
    o, r = cuda.grid(2)
    h = x_nhwc.shape[1]
    w = x_nhwc.shape[2]
    kh = w_hwio.shape[0]
    kw = w_hwio.shape[1]
    cin_g = w_hwio.shape[2]
    cout = w_hwio.shape[3]
    ho = y_nhwc.shape[1]
    wo = y_nhwc.shape[2]
    if o >= cout or r >= y_nhwc.shape[0] * ho * wo:
        return
    n = r // (ho * wo)
    oh = (r // wo) % ho
    ow = r % wo
    c0 = (o // (cout // groups)) * cin_g
    acc = _ZERO
    for i in range(kh):
        ih = oh * sh - pt + i * dh
        if ih >= 0 and ih < h:
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                if iw >= 0 and iw < w:
                    for c in range(cin_g):
                        acc += x_nhwc[n, ih, iw, c0 + c] * w_hwio[i, j, c, o]
    if has_bias:
        acc += b_o[o]
    y_nhwc[n, oh, ow, o] = act(acc, code, alpha)


@cuda.jit
def pool2d_nhwc(x_nhwc, y_nhwc, is_max, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, include_pad):
    """y[n, oh, ow, c] = max or mean of x[n, s oh - top + d i, s ow - left + d j, c] over the window.

    Cells outside the input are skipped; the mean divides by the cells inside the input, or with
    ``include_pad`` inside the padded input ``[-top, H + bottom) x [-left, W + right)``.
    """
    c, r = cuda.grid(2)
    h = x_nhwc.shape[1]
    w = x_nhwc.shape[2]
    ho = y_nhwc.shape[1]
    wo = y_nhwc.shape[2]
    if c >= x_nhwc.shape[3] or r >= y_nhwc.shape[0] * ho * wo:
        return
    n = r // (ho * wo)
    oh = (r // wo) % ho
    ow = r % wo
    m = _NEG_INF
    total = _ZERO
    count = 0
    for i in range(kh):
        ih = oh * sh - pt + i * dh
        for j in range(kw):
            iw = ow * sw - pl + j * dw
            inside = ih >= 0 and ih < h and iw >= 0 and iw < w
            if inside:
                v = x_nhwc[n, ih, iw, c]
                if v > m or v != v:
                    if m == m:  # once NaN, stays NaN
                        m = v
                total += v
            if include_pad:
                if ih < h + pb and iw < w + pr:
                    count += 1
            elif inside:
                count += 1
    if is_max:
        y_nhwc[n, oh, ow, c] = m
    elif count == 0:
        y_nhwc[n, oh, ow, c] = _NAN
    else:
        y_nhwc[n, oh, ow, c] = total / float32(count)


# ----------------------------------------------------------------------------- attention
@cuda.jit
def attention_softmax_bhqk(s_bhqk, bias, has_bias, scale, causal, fill):
    """s[b, h, q] = softmax(scale s + bias (+ -inf at k > q if causal)) in place, one thread per row.

    ``bias`` is 4-D with axes of size 1 broadcasting (its last axis is Tk); a fully masked row
    (max = -inf) becomes ``fill``.
    """
    r = cuda.grid(1)
    nb = s_bhqk.shape[0]
    nh = s_bhqk.shape[1]
    tq = s_bhqk.shape[2]
    tk = s_bhqk.shape[3]
    if r >= nb * nh * tq:
        return
    bi = r // (nh * tq)
    hi = (r // tq) % nh
    qi = r % tq
    bb = bi if bias.shape[0] > 1 else 0
    bh = hi if bias.shape[1] > 1 else 0
    bq = qi if bias.shape[2] > 1 else 0
    m = _NEG_INF
    for k in range(tk):
        v = s_bhqk[bi, hi, qi, k] * scale
        if has_bias:
            v += bias[bb, bh, bq, k]
        if causal and k > qi:
            v = _NEG_INF
        s_bhqk[bi, hi, qi, k] = v
        if v > m or v != v:
            if m == m:
                m = v
    if m == _NEG_INF:
        for k in range(tk):
            s_bhqk[bi, hi, qi, k] = fill
        return
    total = _ZERO
    for k in range(tk):
        e = math.exp(s_bhqk[bi, hi, qi, k] - m)
        s_bhqk[bi, hi, qi, k] = e
        total += e
    for k in range(tk):
        s_bhqk[bi, hi, qi, k] = s_bhqk[bi, hi, qi, k] / total


# ------------------------------------------------------------------------------ recurrent
@cuda.jit
def lstm_gates(xw_btg, t, rec_bg, c_bu, h_bu, mask_bt, has_mask, act_code, ract_code):
    """[i f g o] = xw[:, t] + rec; c' = ract(f) c + ract(i) act(g); h = ract(o) act(c').

    c is updated in place where the step is valid; h gets the (unprojected) new output.
    """
    u, b = cuda.grid(2)
    units = c_bu.shape[1]
    if u >= units or b >= c_bu.shape[0]:
        return
    zi = xw_btg[b, t, u] + rec_bg[b, u]
    zf = xw_btg[b, t, units + u] + rec_bg[b, units + u]
    zg = xw_btg[b, t, 2 * units + u] + rec_bg[b, 2 * units + u]
    zo = xw_btg[b, t, 3 * units + u] + rec_bg[b, 3 * units + u]
    c_new = act(zf, ract_code, _ZERO) * c_bu[b, u] + act(zi, ract_code, _ZERO) * act(zg, act_code, _ZERO)
    h_bu[b, u] = act(zo, ract_code, _ZERO) * act(c_new, act_code, _ZERO)
    if not has_mask or mask_bt[b, t] != 0:
        c_bu[b, u] = c_new


@cuda.jit
def gru_gates_after(xw_btg, t, rec_bg, bh_g, has_bh, h_bu, hn_bu, act_code, ract_code):
    """reset_after: z, r = ract(x w + h u + b_h); cand = act(x w_h + r (h u_h + b_hh));
    h' = z h + (1 - z) cand."""
    u, b = cuda.grid(2)
    units = h_bu.shape[1]
    if u >= units or b >= h_bu.shape[0]:
        return
    rz = rec_bg[b, u]
    rr = rec_bg[b, units + u]
    rh = rec_bg[b, 2 * units + u]
    if has_bh:
        rz += bh_g[u]
        rr += bh_g[units + u]
        rh += bh_g[2 * units + u]
    z = act(xw_btg[b, t, u] + rz, ract_code, _ZERO)
    r = act(xw_btg[b, t, units + u] + rr, ract_code, _ZERO)
    cand = act(xw_btg[b, t, 2 * units + u] + r * rh, act_code, _ZERO)
    hn_bu[b, u] = z * h_bu[b, u] + (_ONE - z) * cand


@cuda.jit
def gru_zr_before(xw_btg, t, rec_b2u, h_bu, z_bu, rh_bu, ract_code):
    """reset before: z = ract(x w_z + h u_z), r = ract(x w_r + h u_r); rh = r h."""
    u, b = cuda.grid(2)
    units = h_bu.shape[1]
    if u >= units or b >= h_bu.shape[0]:
        return
    z_bu[b, u] = act(xw_btg[b, t, u] + rec_b2u[b, u], ract_code, _ZERO)
    r = act(xw_btg[b, t, units + u] + rec_b2u[b, units + u], ract_code, _ZERO)
    rh_bu[b, u] = r * h_bu[b, u]


@cuda.jit
def gru_cand_before(xw_btg, t, rec_bu, z_bu, h_bu, hn_bu, act_code):
    """cand = act(x w_h + (r h) u_h); h' = z h + (1 - z) cand."""
    u, b = cuda.grid(2)
    units = h_bu.shape[1]
    if u >= units or b >= h_bu.shape[0]:
        return
    cand = act(xw_btg[b, t, 2 * units + u] + rec_bu[b, u], act_code, _ZERO)
    z = z_bu[b, u]
    hn_bu[b, u] = z * h_bu[b, u] + (_ONE - z) * cand


@cuda.jit
def commit_step(hn_bp, h_bp, carried_bp, ys_btp, t, ti, mask_bt, has_mask, zero_masked):
    """Keras masking: a valid step takes the new output and state; a masked one keeps the state and
    stores the previous output (or 0 with zero_masked). ys[:, ti] = the stored output."""
    j, b = cuda.grid(2)
    if j >= h_bp.shape[1] or b >= h_bp.shape[0]:
        return
    if not has_mask or mask_bt[b, t] != 0:
        v = hn_bp[b, j]
        h_bp[b, j] = v
        carried_bp[b, j] = v
        ys_btp[b, ti, j] = v
    elif zero_masked:
        ys_btp[b, ti, j] = _ZERO
    else:
        ys_btp[b, ti, j] = carried_bp[b, j]


# ------------------------------------------------------------------ normalization and merges
@cuda.jit
def scale_shift_rows(x_rc, scale_c, shift_c, y_rc):
    """y[r, c] = x[r, c] scale[c] + shift[c] (inference batch norm, folded)."""
    c, r = cuda.grid(2)
    if r < y_rc.shape[0] and c < y_rc.shape[1]:
        y_rc[r, c] = x_rc[r, c] * scale_c[c] + shift_c[c]


@cuda.jit
def layer_norm_rows(x_rc, gamma_c, has_gamma, beta_c, has_beta, epsilon, rms, y_rc):
    """y[r] = gamma (x[r] - mean) / sqrt(var + eps) + beta (rms: gamma x[r] / sqrt(mean x^2 + eps)),
    one thread per row, two passes (mean, then the variance of x - mean)."""
    r = cuda.grid(1)
    if r >= x_rc.shape[0]:
        return
    n = x_rc.shape[1]
    inv_n = _ONE / float32(n)
    mean = _ZERO
    if not rms:
        for j in range(n):
            mean += x_rc[r, j]
        mean *= inv_n
    var = _ZERO
    for j in range(n):
        d = x_rc[r, j] - mean
        var += d * d
    inv = _ONE / math.sqrt(var * inv_n + epsilon)
    for j in range(n):
        v = (x_rc[r, j] - mean) * inv
        if has_gamma:
            v *= gamma_c[j]
        if has_beta:
            v += beta_c[j]
        y_rc[r, j] = v


@cuda.jit
def global_pool_nhwc(x_nlc, y_nc, is_max):
    """y[n, c] = max or mean over l of x[n, l, c] (l: the flattened spatial axes)."""
    c, n = cuda.grid(2)
    if n >= x_nlc.shape[0] or c >= x_nlc.shape[2]:
        return
    m = _NEG_INF
    total = _ZERO
    for j in range(x_nlc.shape[1]):
        v = x_nlc[n, j, c]
        if v > m or v != v:
            if m == m:
                m = v
        total += v
    y_nc[n, c] = m if is_max else total / float32(x_nlc.shape[1])


MERGE_ADD, MERGE_SUB, MERGE_MUL, MERGE_MAX, MERGE_MIN = range(5)


@cuda.jit
def merge_flat(a, b, out, op, scale):
    """out[i] = scale (a[i] op b[i]) for op in add, subtract, multiply, maximum, minimum."""
    i = cuda.grid(1)
    if i >= out.shape[0]:
        return
    x = a[i]
    y = b[i]
    if op == MERGE_ADD:
        v = x + y
    elif op == MERGE_SUB:
        v = x - y
    elif op == MERGE_MUL:
        v = x * y
    elif op == MERGE_MAX:
        v = x if (x > y or x != x) else y
    else:
        v = x if (x < y or x != x) else y
    out[i] = v * scale


@cuda.jit
def copy_cols(src_rc, dst_rk, col0):
    """dst[r, col0 + c] = src[r, c] (one input of a concatenation)."""
    c, r = cuda.grid(2)
    if r < src_rc.shape[0] and c < src_rc.shape[1]:
        dst_rk[r, col0 + c] = src_rc[r, c]
