"""Numba kernels of the convolution and pooling family, NHWC activations.

Kernels are serial and work on a range of output rows; each has a ``prange`` driver
(``kernel_par``, at the end) that ``_split.run_parallel`` uses to share the rows among Numba's
threads (docs/design.md, "Threads"). Innermost loops run over contiguous channels of sliced views
(indices from 0), so LLVM vectorizes them; bounds are checked per window row and column, never
per channel. The primitives in ``conv_ops.py`` allocate, validate and call
``apply_num_threads`` before launching.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import KERNELS, njit
from ._blas import TILE_ROWS
from ._elementwise import bias_act_rows
from ._gemm import COLUMN_STEP, _rows_product

_ZERO = np.float32(0.0)
_U = np.uint64
_NEG_INF = np.float32(-np.inf)


@njit(inline=True)
def _pool_in(acc, xrow, is_max):
    """acc[c] = max(acc[c], xrow[c]) (NaN wins) or acc[c] + xrow[c], over the channels."""
    if is_max:
        for c in range(acc.shape[0]):
            v = xrow[c]
            o = acc[c]
            acc[c] = v if (v > o or v != v) else o
    else:
        for c in range(acc.shape[0]):
            acc[c] += xrow[c]


@njit(inline=True)
def _scale_row(acc, inv):
    """acc[c] *= inv (the average of an accumulated window)."""
    for c in range(acc.shape[0]):
        acc[c] *= inv

_I = "int64"


def _driver_signatures(kernel) -> tuple[str, ...]:
    """A kernel's signatures with (begin, end) replaced by one int64 (the share count)."""
    sigs = next(sigs for disp, sigs in KERNELS if disp is kernel)
    return tuple(sig[: sig.rindex(",")].rstrip() + ")" if sig.endswith("int64, int64)") else sig
                 for sig in sigs)
_X4 = "float32[:, :, :, ::1]"
_M2 = "float32[:, ::1]"


@njit(signatures=(f"void({_X4}, {_M2}, " + ", ".join([_I] * 14) + ")",))
def im2col_nhwc(x_nhwc, cols, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, c0, row0, r_begin, r_end):
    """cols[r, (i kw + j) cg + c] = x[n, s oh - pt + d i, s ow - pl + d j, c0 + c] (0 outside),
    for global row r + row0 = (n Ho + oh) Wo + ow, r in [r_begin, r_end); cg = cols.shape[1] / (kh kw)."""
    k = cols.shape[1]
    cg = k // (kh * kw)
    h, w, c_all = x_nhwc.shape[1], x_nhwc.shape[2], x_nhwc.shape[3]
    x_flat = x_nhwc.reshape(-1)
    for r in range(r_begin, r_end):
        g = r + row0
        ow = g % wo
        t = g // wo
        oh = t % ho
        n = t // ho
        for i in range(kh):
            ih = oh * sh - pt + i * dh
            iw0 = ow * sw - pl
            if dw == 1 and cg == c_all and 0 <= ih < h and iw0 >= 0 and iw0 + kw <= w:
                # the window row is one contiguous run of kw * C input floats (NHWC)
                dst = cols[r, i * kw * cg: (i + 1) * kw * cg]
                src = x_flat[((n * h + ih) * w + iw0) * cg: ((n * h + ih) * w + iw0 + kw) * cg]
                for c in range(kw * cg):
                    dst[c] = src[c]
                continue
            for j in range(kw):
                iw = ow * sw - pl + j * dw
                base = (i * kw + j) * cg
                # sliced views, so the copy loop indexes from 0 (no wraparound test per element:
                # this vectorizes; 2.3x faster than indexing cols[r, base + c], see design.md)
                dst = cols[r, base: base + cg]
                if 0 <= ih < h and 0 <= iw < w:
                    src = x_nhwc[n, ih, iw, c0: c0 + cg]
                    for c in range(cg):
                        dst[c] = src[c]
                else:
                    for c in range(cg):
                        dst[c] = _ZERO


@njit()
def conv_gemm_rows(x_nhwc, w_kc, fn, pfn, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, dw, pt,
                   pl, ho, wo, cols, r_begin, r_end):
    """y[r] = f(im2col(x)[r] @ w + b) for output rows r in [r_begin, r_end), in chunks of
    ``cols.shape[0]`` rows: im2col into ``cols``, then the product and the bias + activation
    ``code`` while hot (``_gemm._rows_product``: on ``pw``, w packed, when ``pfn`` is
    ``_blas.PACKED``, else sgemm ``fn`` or, when None, Numba's ``np.dot``)."""
    chunk = cols.shape[0]
    for r0 in range(r_begin, r_end, chunk):
        m = min(chunk, r_end - r0)
        c = cols[:m]
        im2col_nhwc(x_nhwc, c, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, 0, r0, 0, m)
        _rows_product(fn, pfn, c, w_kc, pw, y_rows[r0: r0 + m], b, code, alpha)


@njit(signatures=(f"void({_X4}, {_X4}, int64, int64)",))
def pad_nhwc(x_nhwc, xp_nhwc, pt, pl):
    """xp[n, pt + i, pl + j] = x[n, i, j], zeros elsewhere (xp at least as large)."""
    n_, h, w, c = x_nhwc.shape
    hp, wp = xp_nhwc.shape[1], xp_nhwc.shape[2]
    for n in range(n_):
        for i in range(hp):
            row = xp_nhwc[n, i].reshape(-1)
            if i < pt or i >= pt + h:
                for q in range(wp * c):
                    row[q] = _ZERO
                continue
            src = x_nhwc[n, i - pt].reshape(-1)
            head = row[:pl * c]
            for q in range(pl * c):
                head[q] = _ZERO
            body = row[pl * c: (pl + w) * c]
            for q in range(w * c):
                body[q] = src[q]
            tail = row[(pl + w) * c:]
            for q in range(tail.shape[0]):
                tail[q] = _ZERO


@njit()
def conv_implicit_rows(cfn, xp_nhwc, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, ho, wo,
                       chunk, t_begin, t_end):
    """y[t Wo + ow] = f(conv(xp, w)[n, oh, ow] + b) for output rows t = n Ho + oh in [t_begin,
    t_end): the implicit-GEMM kernel ``cfn`` (``_blas.CONV``, w packed in ``pw``) on ``chunk``
    output rows at a time, then their bias + activation ``code`` while hot."""
    hp, wp, c = xp_nhwc.shape[1], xp_nhwc.shape[2], xp_nhwc.shape[3]
    cout = y_rows.shape[1]
    for t0 in range(t_begin, t_end, chunk):
        t1 = min(t0 + chunk, t_end)
        cfn(xp_nhwc.ctypes.data, hp, wp, c, kh, kw, sh, sw, dh, ho, wo, pw.ctypes.data, 0, cout,
            y_rows.ctypes.data, cout, t0, t1)
        if code != 0 or b.shape[0] > 0:
            rows = y_rows[t0 * wo: t1 * wo]
            bias_act_rows(rows, b, rows, code, alpha)


@njit(inline=True)
def _depthwise3x3_cell(xf, wf, of, xb, ob, row, col, k):
    """of[ob + c] = sum_{i, j < 3} xf[xb + i row + j col + c] wf[(3 i + j) k + c], c < k.

    Flat arrays with unsigned offsets: no wraparound test per element, two base pointers for
    LLVM's alias checks, so the channel loop vectorizes with all nine taps in registers."""
    k2, k3, k4, k5, k6, k7, k8 = _U(2) * k, _U(3) * k, _U(4) * k, _U(5) * k, _U(6) * k, _U(7) * k, _U(8) * k
    r2, c2 = _U(2) * row, _U(2) * col
    for cc in range(k):
        c = _U(cc)
        a = xb + c
        s = xf[a] * wf[c] + xf[a + col] * wf[k + c] + xf[a + c2] * wf[k2 + c]
        s += xf[a + row] * wf[k3 + c] + xf[a + row + col] * wf[k4 + c] + xf[a + row + c2] * wf[k5 + c]
        s += xf[a + r2] * wf[k6 + c] + xf[a + r2 + col] * wf[k7 + c] + xf[a + r2 + c2] * wf[k8 + c]
        of[ob + c] = s


@njit(inline=True)
def _depthwise3x3_run4(xf, wf, of, xb, ob, row, k):
    """Four horizontally adjacent outputs of a stride-1, undilated 3x3 depthwise convolution:
    of[ob + p k + c] = sum_{i, j < 3} xf[xb + i row + (p + j) k + c] wf[(3 i + j) k + c], p < 4.

    The six input columns and nine weights are loaded once for the four outputs."""
    k2, k3, k4, k5 = _U(2) * k, _U(3) * k, _U(4) * k, _U(5) * k
    k6, k7, k8 = _U(6) * k, _U(7) * k, _U(8) * k
    r2 = _U(2) * row
    for cc in range(k):
        c = _U(cc)
        s0 = s1 = s2 = s3 = _ZERO
        for r, wb in ((_U(0), _U(0)), (row, k3), (r2, k6)):
            a = xb + r + c
            wa, wb_, wc = wf[wb + c], wf[wb + k + c], wf[wb + k2 + c]
            x0, x1, x2 = xf[a], xf[a + k], xf[a + k2]
            x3, x4, x5 = xf[a + k3], xf[a + k4], xf[a + k5]
            s0 += x0 * wa + x1 * wb_ + x2 * wc
            s1 += x1 * wa + x2 * wb_ + x3 * wc
            s2 += x2 * wa + x3 * wb_ + x4 * wc
            s3 += x3 * wa + x4 * wb_ + x5 * wc
        of[ob + c] = s0
        of[ob + k + c] = s1
        of[ob + k2 + c] = s2
        of[ob + k3 + c] = s3


@njit(signatures=(f"void({_X4}, float32[:, :, ::1], float32[::1], {_X4}, int64, float32, "
                  + ", ".join([_I] * 9) + ")",))
def depthwise_nhwc(x_nhwc, w_hwk, b, out_nhwk, code, alpha, sh, sw, dh, dw, pt, pl, m, t_begin, t_end):
    """out[n, oh, ow, c m' + q] = f(b[c m' + q] + sum_{i, j} x[n, s oh - pt + d i, s ow - pl + d j, c] w[i, j, c m' + q])
    for output rows t = n Ho + oh in [t_begin, t_end) (m' = depth multiplier ``m``; cells outside
    x count 0; ``b`` empty: no bias; f the activation ``code``)."""
    n_, ho, wo, k = out_nhwk.shape
    h, w = x_nhwc.shape[1], x_nhwc.shape[2]
    kh, kw = w_hwk.shape[0], w_hwk.shape[1]
    fast = m == 1 and kh == 3 and kw == 3
    run4 = fast and sw == 1 and dw == 1
    xf, wf, of = x_nhwc.reshape(-1), w_hwk.reshape(-1), out_nhwk.reshape(-1)
    col, row, ku = _U(dw * k), _U(dh * w * k), _U(k)
    for t in range(t_begin, t_end):
        n = t // ho
        oh = t % ho
        ih0 = oh * sh - pt
        rows_in = ih0 >= 0 and ih0 + 2 * dh < h
        ow = 0
        while ow < wo:
            iw0 = ow * sw - pl
            if fast and rows_in and iw0 >= 0 and iw0 + 2 * dw < w:
                xb, ob = _U(((n * h + ih0) * w + iw0) * k), _U(((n * ho + oh) * wo + ow) * k)
                if run4 and ow + 4 <= wo and iw0 + 5 < w:
                    _depthwise3x3_run4(xf, wf, of, xb, ob, row, ku)
                    ow += 4
                else:
                    _depthwise3x3_cell(xf, wf, of, xb, ob, row, col, ku)
                    ow += 1
                continue
            acc = out_nhwk[n, oh, ow]
            for c in range(k):
                acc[c] = _ZERO
            for i in range(kh):
                ih = ih0 + i * dh
                if ih < 0 or ih >= h:
                    continue
                for j in range(kw):
                    iw = iw0 + j * dw
                    if iw < 0 or iw >= w:
                        continue
                    xrow = x_nhwc[n, ih, iw]
                    wrow = w_hwk[i, j]
                    if m == 1:
                        for c in range(k):
                            acc[c] += xrow[c] * wrow[c]
                    else:
                        for c in range(k):
                            acc[c] += xrow[c // m] * wrow[c]
            ow += 1
    if code != 0 or b.shape[0] > 0:
        rows = out_nhwk.reshape(n_ * ho * wo, k)[t_begin * wo: t_end * wo]
        bias_act_rows(rows, b, rows, code, alpha)


@njit(inline=True)
def _pool3x3_cell(xf, of, xb, ob, row, col, k, is_max, inv):
    """of[ob + c] = max or inv * sum of xf[xb + i row + j col + c], i, j < 3, c < k: a window
    inside x, all nine taps in one vectorized channel loop (flat arrays, unsigned offsets).
    The max is the plain one (NaN order-dependent); returns whether any tap was NaN, so that
    the caller recomputes the cell with NaN winning (an or-reduction costs nothing here, exact
    NaN selects at every tap cost 1.7x)."""
    r2, c2 = _U(2) * row, _U(2) * col
    nan = False
    for cc in range(k):
        a = xb + _U(cc)
        v0, v1, v2 = xf[a], xf[a + col], xf[a + c2]
        v3, v4, v5 = xf[a + row], xf[a + row + col], xf[a + row + c2]
        v6, v7, v8 = xf[a + r2], xf[a + r2 + col], xf[a + r2 + c2]
        if is_max:
            m = max(max(max(v0, v1), max(v2, v3)), max(max(v4, v5), max(v6, v7)))
            of[ob + _U(cc)] = max(m, v8)
            nan |= ((v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3) | (v4 != v4)
                    | (v5 != v5) | (v6 != v6) | (v7 != v7) | (v8 != v8))
        else:
            of[ob + _U(cc)] = inv * (v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7 + v8)
    return nan


@njit(signatures=(f"void({_X4}, {_X4}, " + ", ".join([_I] * 11) + ", boolean, int64, int64)",))
def pool_nhwc(x_nhwc, out_nhwc, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_pad_end, w_pad_end,
              count_include_pad, t_begin, t_end):
    """out[n, oh, ow, c] = max or mean of x[n, s oh - pt + d i, s ow - pl + d j, c] over the window,
    for output rows t = n Ho + oh in [t_begin, t_end);
    max skips cells outside x (NaN wins), mean divides by the cells inside x, or inside
    [-pt, h_pad_end) x [-pl, w_pad_end) when ``count_include_pad``."""
    n_, ho, wo, c_ = out_nhwc.shape
    h, w = x_nhwc.shape[1], x_nhwc.shape[2]
    fast = kh == 3 and kw == 3
    xf, of = x_nhwc.reshape(-1), out_nhwc.reshape(-1)
    col, row, ku = _U(dw * c_), _U(dh * w * c_), _U(c_)
    inv9 = np.float32(1.0) / np.float32(9.0)
    for t in range(t_begin, t_end):
        n = t // ho
        oh = t % ho
        ih0 = oh * sh - pt
        rows_in = ih0 >= 0 and ih0 + 2 * dh < h
        for ow in range(wo):
            iw0 = ow * sw - pl
            if fast and rows_in and iw0 >= 0 and iw0 + 2 * dw < w:
                # inside x, so both average modes count the nine cells
                if not _pool3x3_cell(xf, of, _U(((n * h + ih0) * w + iw0) * c_),
                                     _U(((n * ho + oh) * wo + ow) * c_), row, col, ku, is_max,
                                     inv9):
                    continue
            acc = out_nhwc[n, oh, ow]
            fill = _NEG_INF if is_max else _ZERO
            for c in range(c_):
                acc[c] = fill
            count = 0
            for i in range(kh):
                ih = oh * sh - pt + i * dh
                for j in range(kw):
                    iw = ow * sw - pl + j * dw
                    if count_include_pad:
                        if ih < h_pad_end and iw < w_pad_end:
                            count += 1
                    if ih < 0 or ih >= h or iw < 0 or iw >= w:
                        continue
                    if not count_include_pad:
                        count += 1
                    _pool_in(acc, x_nhwc[n, ih, iw], is_max)
            if not is_max:
                _scale_row(acc, np.float32(1.0) / np.float32(count))


@njit(signatures=(f"void({_M2}, {_X4}, " + ", ".join([_I] * 14) + ")",))
def col2im_nhwc(cols, out_nhwc, h, w, kh, kw, sh, sw, dh, dw, ct, cl, c0, cg, t_begin, t_end):
    """out[n, oh, ow, c0 + c] = sum over (ih, iw, i, j) with s ih + d i = oh + ct, s iw + d j = ow + cl
    of cols[(n h + ih) w + iw, (i kw + j) cg + c], for output rows t = n Ho + oh in [t_begin, t_end)
    (transposed convolution, gathered per output)."""
    n_, ho, wo = out_nhwc.shape[0], out_nhwc.shape[1], out_nhwc.shape[2]
    for t in range(t_begin, t_end):
        n = t // ho
        oh = t % ho
        for ow in range(wo):
            acc = out_nhwc[n, oh, ow, c0: c0 + cg]
            for c in range(cg):
                acc[c] = _ZERO
            for i in range(kh):
                num_h = oh + ct - i * dh
                if num_h < 0 or num_h % sh != 0:
                    continue
                ih = num_h // sh
                if ih >= h:
                    continue
                for j in range(kw):
                    num_w = ow + cl - j * dw
                    if num_w < 0 or num_w % sw != 0:
                        continue
                    iw = num_w // sw
                    if iw >= w:
                        continue
                    base = (i * kw + j) * cg
                    crow = cols[(n * h + ih) * w + iw, base: base + cg]
                    for c in range(cg):
                        acc[c] += crow[c]


@njit(signatures=(f"void({_X4}, int64[::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], "
                  f"int64[:, ::1], int64, {_X4}, int64, int64)",))
def bin_pool_nhwc(x_nhwc, batch_k, h0_kp, h1_kp, w0_kq, w1_kq, is_max, out_kpqc, t_begin, t_end):
    """out[k, p, q, c] = max or mean of x[batch[k], h0[k, p]:h1[k, p], w0[k, q]:w1[k, q], c]
    (an empty bin gives 0; max lets NaN win), for rows t = k P + p in [t_begin, t_end).
    Adaptive pooling (k = image) and RoI pooling (k = region) are both this."""
    ph, pw, c_ = out_kpqc.shape[1], out_kpqc.shape[2], out_kpqc.shape[3]
    for t in range(t_begin, t_end):
        k = t // ph
        p = t % ph
        n = batch_k[k]
        for q in range(pw):
            acc = out_kpqc[k, p, q]
            ha, hb, wa, wb = h0_kp[k, p], h1_kp[k, p], w0_kq[k, q], w1_kq[k, q]
            if hb <= ha or wb <= wa:
                for c in range(c_):
                    acc[c] = _ZERO
                continue
            fill = _NEG_INF if is_max else _ZERO
            for c in range(c_):
                acc[c] = fill
            for ih in range(ha, hb):
                for iw in range(wa, wb):
                    _pool_in(acc, x_nhwc[n, ih, iw], is_max)
            if not is_max:
                _scale_row(acc, np.float32(1.0) / np.float32((hb - ha) * (wb - wa)))


@njit(signatures=(f"void({_X4}, int64[::1], int64[::1], float32[::1], int64[::1], int64[::1], "
                  f"float32[::1], boolean, {_X4}, int64, int64)",))
def resize_nhwc(x_nhwc, y0, y1, fy, x0, x1, fx, bilinear, out_nhwc, t_begin, t_end):
    """Nearest: out[n, i, j] = x[n, y0[i], x0[j]]; bilinear: out = (1 - fy) top + fy bottom with
    top = (1 - fx) x[n, y0, x0] + fx x[n, y0, x1] and bottom likewise on row y1; rows
    t = n Ho + i in [t_begin, t_end)."""
    ho, wo, c_ = out_nhwc.shape[1], out_nhwc.shape[2], out_nhwc.shape[3]
    one = np.float32(1.0)
    for t in range(t_begin, t_end):
        n = t // ho
        i = t % ho
        for j in range(wo):
            o = out_nhwc[n, i, j]
            a = x_nhwc[n, y0[i], x0[j]]
            if not bilinear:
                for c in range(c_):
                    o[c] = a[c]
                continue
            b = x_nhwc[n, y0[i], x1[j]]
            d = x_nhwc[n, y1[i], x0[j]]
            e = x_nhwc[n, y1[i], x1[j]]
            wy, wx = fy[i], fx[j]
            for c in range(c_):
                top = a[c] * (one - wx) + b[c] * wx
                bottom = d[c] * (one - wx) + e[c] * wx
                o[c] = top * (one - wy) + bottom * wy


@njit(signatures=("void(float32[:, ::1], int64, float32, float32, float32, float32[:, ::1], "
                  "int64, int64)",))
def lrn_rows(x_rc, size, alpha, beta, k, out_rc, t_begin, t_end):
    """out[r, c] = x[r, c] / (k + alpha / size sum_{c' = c - size//2}^{c + (size-1)//2} x[r, c']^2)^beta,
    rows r in [t_begin, t_end); beta 0.5, 0.75 and 1 use square roots and a division (vectorized),
    other betas a power."""
    c_ = x_rc.shape[1]
    lo_off, hi_off = size // 2, (size - 1) // 2
    scale = alpha / np.float32(size)
    one = np.float32(1.0)
    sq = np.empty(c_, np.float32)
    for r in range(t_begin, t_end):
        xr = x_rc[r]
        o = out_rc[r]
        for c in range(c_):
            sq[c] = xr[c] * xr[c]
        for c in range(c_):
            s = np.float32(0.0)
            for cc in range(max(c - lo_off, 0), min(c + hi_off + 1, c_)):
                s += sq[cc]
            o[c] = k + scale * s
        if beta == np.float32(0.75):
            for c in range(c_):
                b = o[c]
                o[c] = xr[c] / (np.sqrt(b) * np.sqrt(np.sqrt(b)))
        elif beta == np.float32(0.5):
            for c in range(c_):
                o[c] = xr[c] / np.sqrt(o[c])
        elif beta == one:
            for c in range(c_):
                o[c] = xr[c] / o[c]
        else:
            for c in range(c_):
                o[c] = xr[c] / o[c] ** beta



# ---------------------------------------------------------------------------- parallel drivers
# ``kernel_par(..., parts)`` runs ``kernel(..., begin, end)`` on ``parts`` equal shares of the
# rows in a prange over Numba's threads (``_split.run_parallel`` picks them; see _split.py).


@njit(parallel=True, signatures=_driver_signatures(depthwise_nhwc))
def depthwise_nhwc_par(x_nhwc, w_hwk, b, out_nhwk, code, alpha, sh, sw, dh, dw, pt, pl, m, parts):
    """``depthwise_nhwc`` over all rows, in ``parts`` shares on Numba's threads."""
    rows = out_nhwk.shape[0] * out_nhwk.shape[1]
    for p in prange(parts):
        depthwise_nhwc(x_nhwc, w_hwk, b, out_nhwk, code, alpha, sh, sw, dh, dw, pt, pl, m, rows * p // parts, rows * (p + 1) // parts)


@njit(parallel=True, signatures=_driver_signatures(pool_nhwc))
def pool_nhwc_par(x_nhwc, out_nhwc, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_pad_end, w_pad_end, count_include_pad, parts):
    """``pool_nhwc`` over all rows, in ``parts`` shares on Numba's threads."""
    rows = out_nhwc.shape[0] * out_nhwc.shape[1]
    for p in prange(parts):
        pool_nhwc(x_nhwc, out_nhwc, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_pad_end, w_pad_end, count_include_pad, rows * p // parts, rows * (p + 1) // parts)


@njit(parallel=True, signatures=_driver_signatures(bin_pool_nhwc))
def bin_pool_nhwc_par(x_nhwc, batch_k, h0_kp, h1_kp, w0_kq, w1_kq, is_max, out_kpqc, parts):
    """``bin_pool_nhwc`` over all rows, in ``parts`` shares on Numba's threads."""
    rows = out_kpqc.shape[0] * out_kpqc.shape[1]
    for p in prange(parts):
        bin_pool_nhwc(x_nhwc, batch_k, h0_kp, h1_kp, w0_kq, w1_kq, is_max, out_kpqc, rows * p // parts, rows * (p + 1) // parts)


@njit(parallel=True, signatures=_driver_signatures(resize_nhwc))
def resize_nhwc_par(x_nhwc, y0, y1, fy, x0, x1, fx, bilinear, out_nhwc, parts):
    """``resize_nhwc`` over all rows, in ``parts`` shares on Numba's threads."""
    rows = out_nhwc.shape[0] * out_nhwc.shape[1]
    for p in prange(parts):
        resize_nhwc(x_nhwc, y0, y1, fy, x0, x1, fx, bilinear, out_nhwc, rows * p // parts, rows * (p + 1) // parts)


@njit(parallel=True, signatures=_driver_signatures(lrn_rows))
def lrn_rows_par(x_rc, size, alpha, beta, k, out_rc, parts):
    """``lrn_rows`` over all rows, in ``parts`` shares on Numba's threads."""
    rows = out_rc.shape[0]
    for p in prange(parts):
        lrn_rows(x_rc, size, alpha, beta, k, out_rc, rows * p // parts, rows * (p + 1) // parts)


@njit(parallel=True)
def conv_gemm_rows_par(x_nhwc, w_kc, fn, pfn, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, dw,
                       pt, pl, ho, wo, cols_p, parts):
    """``conv_gemm_rows`` over all output rows in ``parts`` shares, share p with ``cols_p[p]``
    (shares are multiples of ``_blas.TILE_ROWS`` rows, the packed sgemm's tile)."""
    rows = y_rows.shape[0]
    tiles = (rows + TILE_ROWS - 1) // TILE_ROWS
    for p in prange(parts):
        r0 = min(rows, TILE_ROWS * (tiles * p // parts))
        r1 = min(rows, TILE_ROWS * (tiles * (p + 1) // parts))
        conv_gemm_rows(x_nhwc, w_kc, fn, pfn, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, dw,
                       pt, pl, ho, wo, cols_p[p], r0, r1)


@njit(parallel=True)
def conv_implicit_par(cfn, xp_nhwc, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, ho, wo, chunk,
                      parts, by_rows):
    """``conv_implicit_rows`` over all output rows in ``parts`` shares of rows or, when not
    ``by_rows`` (few rows), of COLUMN_STEP-aligned output columns (the caller then runs the
    epilogue)."""
    rows = y_rows.shape[0] // wo
    hp, wp, c = xp_nhwc.shape[1], xp_nhwc.shape[2], xp_nhwc.shape[3]
    cout = y_rows.shape[1]
    steps = (cout + COLUMN_STEP - 1) // COLUMN_STEP
    for p in prange(parts):
        if by_rows:
            conv_implicit_rows(cfn, xp_nhwc, pw, b, y_rows, code, alpha, kh, kw, sh, sw, dh, ho,
                               wo, chunk, rows * p // parts, rows * (p + 1) // parts)
        else:
            j0 = min(cout, COLUMN_STEP * (steps * p // parts))
            j1 = min(cout, COLUMN_STEP * (steps * (p + 1) // parts))
            if j1 > j0:
                cfn(xp_nhwc.ctypes.data, hp, wp, c, kh, kw, sh, sw, dh, ho, wo, pw.ctypes.data,
                    j0, j1, y_rows.ctypes.data, cout, 0, rows)
