"""numba.cuda kernels of the CUDA backend (float32 values, int64 indices, uint8 masks;
C-contiguous device arrays).

Imported only by ``CudaOps`` (never by ``import fastlayers``). Kernels are compiled lazily on
first launch for the argument types they get. They take preallocated outputs and neither
allocate nor validate shapes (``ops.py`` does); the few value checks the layers need (an index
in range) set a one-element ``bad`` flag instead of raising. NaN propagates as in the numpy
reference. Every float constant is a module-level float32 so no float64 arithmetic enters the
kernels.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda, float32, int64

#: Tile edge of the shared-memory matrix product (TILE x TILE threads per block): 16 on a GPU;
#: 8 in the simulator, which runs every thread of a block as a Python thread (4x fewer per block,
#: same code path: the tests' inner sizes span several tiles either way).
TILE = 8 if config.ENABLE_CUDASIM else 16

ZERO = np.float32(0.0)
ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
NEG_INF = np.float32(-np.inf)
NAN = np.float32(np.nan)
POS_INF = np.float32(np.inf)
_INV_SQRT2 = np.float32(1.0 / np.sqrt(2.0))
_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))
_GELU_C = np.float32(0.044715)
_SELU_ALPHA = np.float32(1.6732632423543772)
_SELU_SCALE = np.float32(1.0507009873554805)

# Activation codes of the fused epilogues (softmax / log_softmax run as row kernels).
(
    LINEAR,
    RELU,
    RELU6,
    LEAKY_RELU,
    ELU,
    SELU,
    GELU,
    GELU_TANH,
    SIGMOID,
    HARD_SIGMOID,
    TANH,
    SOFTPLUS,
    SOFTSIGN,
    SILU,
    EXPONENTIAL,
) = range(15)
CODES = {
    "linear": LINEAR,
    "relu": RELU,
    "relu6": RELU6,
    "leaky_relu": LEAKY_RELU,
    "elu": ELU,
    "selu": SELU,
    "gelu": GELU,
    "gelu_tanh": GELU_TANH,
    "sigmoid": SIGMOID,
    "hard_sigmoid": HARD_SIGMOID,
    "tanh": TANH,
    "softplus": SOFTPLUS,
    "softsign": SOFTSIGN,
    "silu": SILU,
    "exponential": EXPONENTIAL,
}


@cuda.jit(device=True, inline=True)
def _sigmoid(v):
    """1 / (1 + exp(-v)), stable for large |v|."""
    e = math.exp(-abs(v))
    return ONE / (ONE + e) if v >= ZERO else e / (ONE + e)


@cuda.jit(device=True)
def act(v, code, alpha):
    """f(v) for activation ``code`` (``CODES``); NaN in, NaN out."""
    if code == LINEAR:
        return v
    if code == RELU:
        return ZERO if v < ZERO else v
    if code == RELU6:
        return ZERO if v < ZERO else (_SIX if v > _SIX else v)
    if code == LEAKY_RELU:
        return v if v >= ZERO else alpha * v
    if code == ELU:
        return v if v > ZERO else alpha * math.expm1(v)
    if code == SELU:
        return _SELU_SCALE * (v if v > ZERO else _SELU_ALPHA * math.expm1(v))
    if code == GELU:
        return _HALF * v * math.erfc(-v * _INV_SQRT2)
    if code == GELU_TANH:
        return _HALF * v * (ONE + math.tanh(_SQRT_2_OVER_PI * (v + _GELU_C * v * v * v)))
    if code == SIGMOID:
        return _sigmoid(v)
    if code == HARD_SIGMOID:
        u = v + _THREE
        return (ZERO if u < ZERO else (_SIX if u > _SIX else u)) / _SIX
    if code == TANH:
        return math.tanh(v)
    if code == SOFTPLUS:
        return math.log1p(math.exp(-abs(v))) + (v if v > ZERO else ZERO)
    if code == SOFTSIGN:
        return v / (ONE + abs(v))
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
    acc = ZERO
    for k0 in range(0, k, TILE):
        ka = k0 + tx
        if row < m and ka < k:
            sa[ty, tx] = a_zmk[za, row, ka]
        else:
            sa[ty, tx] = ZERO
        kb = k0 + ty
        if col < n and kb < k:
            if trans_b:
                sb[ty, tx] = b_zkn[zb, col, kb]
            else:
                sb[ty, tx] = b_zkn[zb, kb, col]
        else:
            sb[ty, tx] = ZERO
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < m and col < n:
        c_zmn[z, row, col] = acc


@cuda.jit
def mm_bias_act(a_mk, b_kn, bias_n, has_bias, code, alpha, c_mn):
    """c = f(a b + bias) for 2-D operands: ``bmm_tiled``'s tiles with the bias and activation
    ``code`` applied as each output leaves its registers (one launch for a Dense layer)."""
    sa = cuda.shared.array((TILE, TILE), float32)
    sb = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    m = a_mk.shape[0]
    k = a_mk.shape[1]
    n = c_mn.shape[1]
    acc = ZERO
    for k0 in range(0, k, TILE):
        ka = k0 + tx
        if row < m and ka < k:
            sa[ty, tx] = a_mk[row, ka]
        else:
            sa[ty, tx] = ZERO
        kb = k0 + ty
        if col < n and kb < k:
            sb[ty, tx] = b_kn[kb, col]
        else:
            sb[ty, tx] = ZERO
        cuda.syncthreads()
        for kk in range(TILE):
            acc += sa[ty, kk] * sb[kk, tx]
        cuda.syncthreads()
    if row < m and col < n:
        if has_bias:
            acc += bias_n[col]
        c_mn[row, col] = act(acc, code, alpha)


@cuda.jit
def softmax_rows(y_rc, log):
    """y[r, :] = softmax(y[r, :]) (log: log_softmax) in place, one thread per row."""
    r = cuda.grid(1)
    if r >= y_rc.shape[0]:
        return
    n = y_rc.shape[1]
    m = NEG_INF
    for j in range(n):
        v = y_rc[r, j]
        if v > m or v != v:
            m = v
    total = ZERO
    for j in range(n):
        total += math.exp(y_rc[r, j] - m)
    if log:
        lse = math.log(total)
        for j in range(n):
            y_rc[r, j] = y_rc[r, j] - m - lse
    else:
        for j in range(n):
            y_rc[r, j] = math.exp(y_rc[r, j] - m) / total


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
def softmax_oni(y_oni, log):
    """y[o, :, i] = softmax(y[o, :, i]) (log: log_softmax) in place, one thread per (o, i)."""
    r = cuda.grid(1)
    inner = y_oni.shape[2]
    if r >= y_oni.shape[0] * inner:
        return
    o = r // inner
    i = r % inner
    n = y_oni.shape[1]
    m = NEG_INF
    for j in range(n):
        v = y_oni[o, j, i]
        if v > m or v != v:
            m = v
    total = ZERO
    for j in range(n):
        total += math.exp(y_oni[o, j, i] - m)
    if log:
        lse = math.log(total)
        for j in range(n):
            y_oni[o, j, i] = y_oni[o, j, i] - m - lse
    else:
        for j in range(n):
            y_oni[o, j, i] = math.exp(y_oni[o, j, i] - m) / total


@cuda.jit
def relu_flat(x, y, threshold, slope, max_value, has_max):
    """y = x if x > t else slope (x - t), then min(y, max_value) with has_max (Keras ReLU)."""
    i = cuda.grid(1)
    if i >= y.shape[0]:
        return
    v = x[i]
    if not v > threshold:
        v = slope * (v - threshold)
    if has_max and not (v < max_value or v != v):
        v = max_value
    y[i] = v


# ------------------------------------------------------------------- convolution and pooling
@cuda.jit
def conv2d_nhwc(x_nhwc, w_hwio, b_o, has_bias, y_nhwc, sh, sw, dh, dw, pt, pl, groups, code, alpha):
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
    acc = ZERO
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
    m = NEG_INF
    total = ZERO
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
        y_nhwc[n, oh, ow, c] = NAN
    else:
        y_nhwc[n, oh, ow, c] = total / float32(count)


@cuda.jit
def conv_transpose2d_nhwc(x_nhwc, w_hwio, b_o, has_bias, y_nhwc, sh, sw, dh, dw, ct, cl, groups, code, alpha):
    """y[n, oh, ow, g Cog + o] = f(b + sum x[n, ih, iw, g Cig + c] w[i, j, g Cig + c, o]) over
    s ih + d i = oh + ct, s iw + d j = ow + cl: the adjoint of conv2d, cropped at (ct, cl).

    One thread per output value (gathering the inputs that reach it); w is
    (kh, kw, C_in, C_out / groups).
    """
    o_all, r = cuda.grid(2)
    h = x_nhwc.shape[1]
    w = x_nhwc.shape[2]
    kh = w_hwio.shape[0]
    kw = w_hwio.shape[1]
    cout_g = w_hwio.shape[3]
    cin_g = x_nhwc.shape[3] // groups
    ho = y_nhwc.shape[1]
    wo = y_nhwc.shape[2]
    if o_all >= y_nhwc.shape[3] or r >= y_nhwc.shape[0] * ho * wo:
        return
    n = r // (ho * wo)
    oh = (r // wo) % ho
    ow = r % wo
    c0 = (o_all // cout_g) * cin_g
    o = o_all % cout_g
    acc = ZERO
    for i in range(kh):
        th = oh + ct - i * dh
        if th >= 0 and th % sh == 0 and th // sh < h:
            ih = th // sh
            for j in range(kw):
                tw = ow + cl - j * dw
                if tw >= 0 and tw % sw == 0 and tw // sw < w:
                    iw = tw // sw
                    for c in range(cin_g):
                        acc += x_nhwc[n, ih, iw, c0 + c] * w_hwio[i, j, c0 + c, o]
    if has_bias:
        acc += b_o[o_all]
    y_nhwc[n, oh, ow, o_all] = act(acc, code, alpha)


@cuda.jit(device=True, inline=True)
def _source(dst, ratio, bilinear, align_corners):
    """Source coordinate of output index ``dst`` in a resize (torch's rules, float32)."""
    d = float32(dst)
    if not bilinear or align_corners:
        return d * ratio
    s = (d + _HALF) * ratio - _HALF
    return s if s > ZERO else ZERO


@cuda.jit
def upsample2d_nhwc(x_nhwc, y_nhwc, bilinear, align_corners, ratio_h, ratio_w):
    """y[n, oh, ow, c] = x at source (oh ratio_h, ow ratio_w): nearest (floor) or bilinear between
    the 4 neighbours (half-pixel centres unless align_corners), as ``reference.conv.upsample2d``."""
    c, r = cuda.grid(2)
    h = x_nhwc.shape[1]
    w = x_nhwc.shape[2]
    ho = y_nhwc.shape[1]
    wo = y_nhwc.shape[2]
    if c >= y_nhwc.shape[3] or r >= y_nhwc.shape[0] * ho * wo:
        return
    n = r // (ho * wo)
    oh = (r // wo) % ho
    ow = r % wo
    sy = _source(oh, ratio_h, bilinear, align_corners)
    sx = _source(ow, ratio_w, bilinear, align_corners)
    y0 = min(int64(math.floor(sy)), h - 1)
    x0 = min(int64(math.floor(sx)), w - 1)
    if not bilinear:
        y_nhwc[n, oh, ow, c] = x_nhwc[n, y0, x0, c]
        return
    y1 = min(y0 + 1, h - 1)
    x1 = min(x0 + 1, w - 1)
    fy = sy - float32(y0)
    fx = sx - float32(x0)
    top = x_nhwc[n, y0, x0, c] * (ONE - fx) + x_nhwc[n, y0, x1, c] * fx
    bottom = x_nhwc[n, y1, x0, c] * (ONE - fx) + x_nhwc[n, y1, x1, c] * fx
    y_nhwc[n, oh, ow, c] = top * (ONE - fy) + bottom * fy


@cuda.jit
def lrn_rows(x_rc, y_rc, size, alpha_over_size, beta, k):
    """y[r, c] = x[r, c] / (k + alpha / size sum_{c'} x[r, c']^2)^beta over the channels
    c' in [c - size // 2, c + (size - 1) // 2]."""
    c, r = cuda.grid(2)
    nc = x_rc.shape[1]
    if r >= x_rc.shape[0] or c >= nc:
        return
    total = ZERO
    for j in range(max(c - size // 2, 0), min(c + (size - 1) // 2 + 1, nc)):
        total += x_rc[r, j] * x_rc[r, j]
    y_rc[r, c] = x_rc[r, c] / math.pow(k + alpha_over_size * total, beta)


@cuda.jit(device=True, inline=True)
def _round_half_away(v):
    """round(v) with halves away from zero, as int64 (sign(v) floor(|v| + 0.5))."""
    f = int64(math.floor(abs(v) + _HALF))
    return -f if v < ZERO else f


@cuda.jit
def roi_pool_nhwc(x_nhwc, rois_k5, spatial_scale, y_kpqc, bad):
    """y[k, i, j, c] = max of x[batch_k, bin (i, j) of region k, c] (torchvision roi_pool: corners
    scaled and rounded half away from zero, bins [floor(i bh), ceil((i + 1) bh)) clipped, an empty
    bin 0, float32 as ``reference.conv.roi_bins``); a batch index that is not a whole number in
    [0, N) gives 0 and sets bad[0] = 1."""
    c, r = cuda.grid(2)
    h = x_nhwc.shape[1]
    w = x_nhwc.shape[2]
    ph = y_kpqc.shape[1]
    pw = y_kpqc.shape[2]
    if c >= y_kpqc.shape[3] or r >= y_kpqc.shape[0] * ph * pw:
        return
    k = r // (ph * pw)
    i = (r // pw) % ph
    j = r % pw
    bf = rois_k5[k, 0]
    if not (bf >= ZERO and bf < float32(x_nhwc.shape[0]) and float32(int64(bf)) == bf):
        y_kpqc[k, i, j, c] = ZERO
        bad[0] = ONE
        return
    x1 = _round_half_away(rois_k5[k, 1] * spatial_scale)
    y1 = _round_half_away(rois_k5[k, 2] * spatial_scale)
    x2 = _round_half_away(rois_k5[k, 3] * spatial_scale)
    y2 = _round_half_away(rois_k5[k, 4] * spatial_scale)
    bh = float32(max(y2 - y1 + 1, 1)) / float32(ph)
    bw = float32(max(x2 - x1 + 1, 1)) / float32(pw)
    h0 = min(max(int64(math.floor(float32(i) * bh)) + y1, 0), h)
    h1 = min(max(int64(math.ceil(float32(i + 1) * bh)) + y1, 0), h)
    w0 = min(max(int64(math.floor(float32(j) * bw)) + x1, 0), w)
    w1 = min(max(int64(math.ceil(float32(j + 1) * bw)) + x1, 0), w)
    if h1 <= h0 or w1 <= w0:
        y_kpqc[k, i, j, c] = ZERO
        return
    n = int64(bf)
    m = NEG_INF
    for ih in range(h0, h1):
        for iw in range(w0, w1):
            v = x_nhwc[n, ih, iw, c]
            if v > m or v != v:
                if m == m:
                    m = v
    y_kpqc[k, i, j, c] = m


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
    m = NEG_INF
    for k in range(tk):
        v = s_bhqk[bi, hi, qi, k] * scale
        if has_bias:
            v += bias[bb, bh, bq, k]
        if causal and k > qi:
            v = NEG_INF
        s_bhqk[bi, hi, qi, k] = v
        if v > m or v != v:
            if m == m:
                m = v
    if m == NEG_INF:
        for k in range(tk):
            s_bhqk[bi, hi, qi, k] = fill
        return
    total = ZERO
    for k in range(tk):
        e = math.exp(s_bhqk[bi, hi, qi, k] - m)
        s_bhqk[bi, hi, qi, k] = e
        total += e
    for k in range(tk):
        s_bhqk[bi, hi, qi, k] = s_bhqk[bi, hi, qi, k] / total


@cuda.jit
def tanh_scores(q_pqd, k_pkd, w_d, has_w, inner, outer, s_pqk):
    """s[p, i, j] = outer sum_d w[d] tanh(inner (q[p, i, d] + k[p, j, d])) (w = 1 without has_w):
    Bahdanau (AdditiveAttention) and Keras Attention's "concat" scores."""
    j, r = cuda.grid(2)
    tq = q_pqd.shape[1]
    if j >= k_pkd.shape[1] or r >= q_pqd.shape[0] * tq:
        return
    p = r // tq
    i = r % tq
    acc = ZERO
    for d in range(q_pqd.shape[2]):
        t = math.tanh(inner * (q_pqd[p, i, d] + k_pkd[p, j, d]))
        acc += w_d[d] * t if has_w else t
    s_pqk[p, i, j] = outer * acc


@cuda.jit
def hard_attention_rows(s_pqk, causal, w_pqk):
    """w[p, q] = one-hot of the first argmax over k of s[p, q, k] (k <= q if causal; NaN wins, as
    np.argmax); zeros where every key scores -inf. One thread per row."""
    r = cuda.grid(1)
    tq = s_pqk.shape[1]
    tk = s_pqk.shape[2]
    if r >= s_pqk.shape[0] * tq:
        return
    p = r // tq
    q = r % tq
    best = -1
    m = NEG_INF
    for k in range(tk):
        v = NEG_INF if (causal and k > q) else s_pqk[p, q, k]
        if v != v:
            best = k
            break
        if v > m:
            m = v
            best = k
    for k in range(tk):
        w_pqk[p, q, k] = ONE if k == best else ZERO


# ------------------------------------------------------------------------------ recurrent
@cuda.jit
def rnn_gates(xw_btg, t, rec_bu, h_bu, act_code):
    """h[b, u] = act(xw[b, t, u] + rec[b, u]) (SimpleRNN step, rec = h_prev w_hh)."""
    u, b = cuda.grid(2)
    if u < h_bu.shape[1] and b < h_bu.shape[0]:
        h_bu[b, u] = act(xw_btg[b, t, u] + rec_bu[b, u], act_code, ZERO)


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
    c_new = act(zf, ract_code, ZERO) * c_bu[b, u] + act(zi, ract_code, ZERO) * act(zg, act_code, ZERO)
    h_bu[b, u] = act(zo, ract_code, ZERO) * act(c_new, act_code, ZERO)
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
    z = act(xw_btg[b, t, u] + rz, ract_code, ZERO)
    r = act(xw_btg[b, t, units + u] + rr, ract_code, ZERO)
    cand = act(xw_btg[b, t, 2 * units + u] + r * rh, act_code, ZERO)
    hn_bu[b, u] = z * h_bu[b, u] + (ONE - z) * cand


@cuda.jit
def gru_zr_before(xw_btg, t, rec_b2u, h_bu, z_bu, rh_bu, ract_code):
    """reset before: z = ract(x w_z + h u_z), r = ract(x w_r + h u_r); rh = r h."""
    u, b = cuda.grid(2)
    units = h_bu.shape[1]
    if u >= units or b >= h_bu.shape[0]:
        return
    z_bu[b, u] = act(xw_btg[b, t, u] + rec_b2u[b, u], ract_code, ZERO)
    r = act(xw_btg[b, t, units + u] + rec_b2u[b, units + u], ract_code, ZERO)
    rh_bu[b, u] = r * h_bu[b, u]


@cuda.jit
def gru_cand_before(xw_btg, t, rec_bu, z_bu, h_bu, hn_bu, act_code):
    """cand = act(x w_h + (r h) u_h); h' = z h + (1 - z) cand."""
    u, b = cuda.grid(2)
    units = h_bu.shape[1]
    if u >= units or b >= h_bu.shape[0]:
        return
    cand = act(xw_btg[b, t, 2 * units + u] + rec_bu[b, u], act_code, ZERO)
    z = z_bu[b, u]
    hn_bu[b, u] = z * h_bu[b, u] + (ONE - z) * cand


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
        ys_btp[b, ti, j] = ZERO
    else:
        ys_btp[b, ti, j] = carried_bp[b, j]


# ------------------------------------------------------------------ normalization and merges
@cuda.jit
def scale_shift_oci(x_oci, scale_c, shift_c, y_oci):
    """y[o, c, i] = x[o, c, i] scale[c] + shift[c] (inference batch norm, folded, on axis c)."""
    i, r = cuda.grid(2)
    nc = y_oci.shape[1]
    if r < y_oci.shape[0] * nc and i < y_oci.shape[2]:
        o = r // nc
        c = r % nc
        y_oci[o, c, i] = x_oci[o, c, i] * scale_c[c] + shift_c[c]


@cuda.jit
def layer_norm_rows(x_rc, gamma_c, has_gamma, beta_c, has_beta, epsilon, rms, y_rc):
    """y[r] = gamma (x[r] - mean) / sqrt(var + eps) + beta (rms: gamma x[r] / sqrt(mean x^2 + eps)),
    one thread per row, two passes (mean, then the variance of x - mean)."""
    r = cuda.grid(1)
    if r >= x_rc.shape[0]:
        return
    n = x_rc.shape[1]
    inv_n = ONE / float32(n)
    mean = ZERO
    if not rms:
        for j in range(n):
            mean += x_rc[r, j]
        mean *= inv_n
    var = ZERO
    for j in range(n):
        d = x_rc[r, j] - mean
        var += d * d
    inv = ONE / math.sqrt(var * inv_n + epsilon)
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
    m = NEG_INF
    total = ZERO
    for j in range(x_nlc.shape[1]):
        v = x_nlc[n, j, c]
        if v > m or v != v:
            if m == m:
                m = v
        total += v
    y_nc[n, c] = m if is_max else total / float32(x_nlc.shape[1])
