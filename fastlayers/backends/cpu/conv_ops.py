"""CpuOps primitives of the convolution and pooling family (bound as CpuOps methods).

- conv2d: 3x3 stride 1 with enough tiles and channels: Winograd F(2x2, 3x3) (``_winograd``);
  1x1 / stride 1 / unpadded: one product over the NHWC rows (``_gemm.matmul``); one group, no
  width dilation, from 256 K multiply-adds: the implicit GEMM on the padded input
  (``_blas.CONV``, ``_conv.conv_implicit_rows``); otherwise im2col + sgemm + epilogue in L2-sized
  row chunks (``_conv.conv_gemm_rows``), or, for grouped convolutions and those with few output
  rows, im2col + a product split over output channels.
- depthwise_conv2d: a direct Numba loop vectorized over channels (3x3: all taps in registers).
- conv_transpose2d: one sgemm per group (x rows times w (C_in/g, kh kw C_out/g)) + a gathering col2im.
- pool2d: a direct Numba loop vectorized over channels.
- bias + activation: ``_elementwise.bias_act_rows`` over the output rows, in place (epilogue).
- The Numba kernels are serial over a row range; ``_split.run_parallel`` / ``shares`` run large
  calls as their ``prange`` drivers over ``set_num_threads`` threads (_split.py, docs/design.md).

Workspaces (the im2col, column and padded-input buffers) are per thread (``threading.local``) and grow to the
largest size seen, so repeated calls do not allocate them and concurrent calls never share one.
"""

from __future__ import annotations

import threading

import numpy as np

from ..reference import ReferenceOps
from ..reference_conv import adaptive_bins, conv_out_size, roi_bins, source_coords
from ..derived import derived
from .._jit import warm_call
from . import _blas, _conv, _elementwise, _gemm, _winograd
from ._split import run_parallel, shares

_EMPTY = np.zeros(0, dtype=np.float32)
#: Largest im2col chunk, in floats (16 MiB): bounds the workspace, keeps sgemm panels large.
_COLS_BUDGET = 1 << 22
#: im2col chunk of the threaded path, in floats (1 MiB): the chunk stays in L2 for its sgemm.
_COLS_CHUNK = 1 << 18
#: Tiles per Winograd block: its V and M panels (16 x tiles x channels each) stay in L2.
_WINOGRAD_BLOCK_TILES = 64
#: Fewest multiply-adds (x2) in a thread's share of a GEMM-bound kernel.
_MIN_SHARE_FLOPS = 1 << 21
#: Fewest output rows for the threaded im2col path; below, the product is split over the output
#: channels (numpy's sgemm is also faster than scipy's on such short, wide products: docs/design.md).
_SPLIT_MIN_ROWS = 256
#: Fewest output rows (n, oh) for sharing the implicit-GEMM convolution by rows; below, by
#: output columns (ResNet's 7x7 layers: 7 rows).
_IMPLICIT_MIN_ROWS = 8
_tls = threading.local()
#: Fewest output values per thread share of the direct kernels (depthwise, pooling): below this
#: a thread hand-off (tens of microseconds) costs more than it saves.
_MIN_OUT_VALUES = 1 << 15


def _min_out_rows(values_per_row: int) -> int:
    return max(1, _MIN_OUT_VALUES // max(values_per_row, 1))


def workspace(size: int) -> np.ndarray:
    """A float32 scratch vector of ``size`` owned by the calling thread (reused across calls)."""
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), np.float32)
        _tls.buf = buf
    return buf[:size]


def _f32c(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _epilogue(self, y_rows, b, activation, alpha):
    """y = f(y + b) in place over (rows, C); activations without a fused kernel use the reference."""
    code = _elementwise.CODES.get(activation)
    _epilogue_rows(y_rows, b, code, alpha)
    return y_rows if code is not None else ReferenceOps.activation(self, y_rows, activation, alpha)


def conv2d(self, x_nhwc, w_hwio, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1),
           groups=1, activation="linear", alpha=0.0):
    n, h, w, c = x_nhwc.shape
    kh, kw, cin_g, cout = w_hwio.shape
    (sh, sw), (dh, dw) = strides, dilation
    (pt, pb), (pl, pr) = pads
    ho = conv_out_size(h, kh, sh, pt + pb, dh)
    wo = conv_out_size(w, kw, sw, pl + pr, dw)
    if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout == 0:
        return ReferenceOps.conv2d(self, x_nhwc, w_hwio, b, strides, pads, dilation, groups,
                                   activation, alpha)
    if groups > 1 and cin_g == 1 and groups == c:
        # one input channel per group: a depthwise convolution (multiplier cout / c), direct loop
        return depthwise_conv2d(self, x_nhwc, w_hwio.reshape(kh, kw, c, cout // c), b, strides,
                                pads, dilation, activation, alpha)
    x = _f32c(x_nhwc)
    wk = _f32c(w_hwio)
    code = _elementwise.CODES.get(activation)
    if kh == kw == 3 and sh == sw == dh == dw == 1 and groups == 1 and _winograd_pays(n, ho, wo, c, cout):
        y = _conv3x3_winograd(x, wk, b, pt, pl, ho, wo, code, alpha)
    elif kh == kw == 1 and sh == sw == 1 and pt == pb == pl == pr == 0 and groups == 1:
        y = np.empty((n * h * w, cout), np.float32)                     # 1x1: one sgemm
        _gemm.matmul(x.reshape(n * h * w, c), wk.reshape(c, cout), y,
                     None if b is None else _f32c(b), _act_code(code), alpha, weights=True)
    elif (groups == 1 and dw == 1 and kh * kw > 1 and _blas.CONV is not None
          and n * ho * wo * kh * kw * c * cout >= _gemm.PACKED_MIN_MADDS):
        y = _conv_implicit(x, wk, b, (sh, sw), dh, pt, pl, ho, wo, code, alpha)
    elif groups == 1 and n * ho * wo >= _SPLIT_MIN_ROWS:
        y = _conv_im2col(x, wk, b, (sh, sw), (dh, dw), pt, pl, ho, wo, code, alpha)
    else:
        y = _conv_grouped(x, wk, (sh, sw), (dh, dw), pt, pl, ho, wo, groups)
        _epilogue_rows(y, b, code, alpha)
    y = y.reshape(n, ho, wo, cout)
    return y if code is not None else ReferenceOps.activation(self, y, activation, alpha)


def _act_code(code):
    """The fused activation code, LINEAR for an activation without one (applied afterwards)."""
    return _elementwise.LINEAR if code is None else code


def _epilogue_rows(y_rows, b, code, alpha):
    """y = f(y + b) in place over (rows, C) with the fused activation ``code`` (None: bias only)."""
    if b is not None or (code is not None and code != _elementwise.LINEAR):
        _elementwise.bias_act_rows(y_rows, _EMPTY if b is None else _f32c(b), y_rows,
                                   _act_code(code), np.float32(alpha))


def _min_rows_for(flops_per_row: int) -> int:
    """Fewest rows per thread share of a GEMM-bound kernel (a share of at least ~2 MFLOP)."""
    return max(1, _MIN_SHARE_FLOPS // max(flops_per_row, 1))


def _winograd_pays(n, ho, wo, cin, cout) -> bool:
    """Winograd F(2x2, 3x3) beats im2col + sgemm from about 36 tiles and 16 channels each way
    (measured on this project's machine, docs/design.md); few tiles leave its 16 sgemms too thin."""
    return n * ((ho + 1) // 2) * ((wo + 1) // 2) >= 36 and min(cin, cout) >= 16


def _conv3x3_winograd(x, wk, b, pt, pl, ho, wo, code, alpha):
    n, cin, cout = x.shape[0], x.shape[3], wk.shape[3]
    u, pu = derived(wk, "winograd_f23", _winograd_weights)
    pfn = None if pu.shape[1] == 0 else _blas.PACKED
    out = np.empty((n, ho, wo, cout), np.float32)
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    block_rows = max(1, _WINOGRAD_BLOCK_TILES // tw)
    bias = _EMPTY if b is None else _f32c(b)
    act = _act_code(code)

    tiles = n * th * tw
    if tiles <= 2 * _WINOGRAD_BLOCK_TILES:
        # few tiles: the 16 products shared by e, so that each thread reads only its part of U
        # (by tile rows, every thread streamed all of U for a thin product: ResNet-18's 14x14x256
        # layer took 1.58 ms inside the model, 1.14 ms shared by e)
        with shares(16, 8) as parts:
            if parts > 1:
                ws = workspace(16 * tiles * (cin + cout) + parts * 16 * max(cin, cout))
                v = ws[: 16 * tiles * cin].reshape(16, tiles, cin)
                m = ws[16 * tiles * cin: 16 * tiles * (cin + cout)].reshape(16, tiles, cout)
                patch = ws[16 * tiles * (cin + cout):].reshape(parts, 16, max(cin, cout))
                _winograd.input_f23_par(x, v, patch, pt, pl, ho, wo, parts)
                _winograd.products_f23_par(v, u, pfn, pu, m, parts)
                _winograd.output_f23_par(m, bias, out, act, np.float32(alpha), patch, parts)
                return out.reshape(-1, cout)
    with shares(n * th, _min_rows_for(2 * 16 * tw * cin * cout)) as parts:
        _winograd_blocks(x, u, pfn, pu, bias, out, act, alpha, pt, pl, block_rows, parts)
    return out.reshape(-1, cout)


def _winograd_blocks(x, u, pfn, pu, bias, out, act, alpha, pt, pl, block_rows, parts):
    """``_conv3x3_winograd`` by blocks of tile rows in ``parts`` shares (1: in the calling
    thread)."""
    cin, cout = x.shape[3], out.shape[3]
    rows_all, tw = out.shape[0] * ((out.shape[1] + 1) // 2), (out.shape[2] + 1) // 2
    rows = min(block_rows, -(-rows_all // parts))
    v_size, m_size = 16 * rows * tw * cin, 16 * rows * tw * cout
    ws = workspace(parts * (v_size + m_size + 16 * max(cin, cout)))
    v = ws[: parts * v_size].reshape(parts, 16, rows * tw, cin)
    m = ws[parts * v_size: parts * (v_size + m_size)].reshape(parts, 16, rows * tw, cout)
    patch = ws[parts * (v_size + m_size):].reshape(parts, 16, max(cin, cout))
    args = (x, u, pfn, pu, bias, out, act, np.float32(alpha), pt, pl)
    if parts == 1:
        _winograd.conv3x3_f23(*args, v[0], m[0], patch[0], rows, 0, rows_all)
    else:
        _winograd.conv3x3_f23_par(*args, v, m, patch, rows, parts)


def _winograd_weights(wk):
    """(U (16, C_in, C_out), U[e] packed for ``_blas.PACKED`` (16, floats), or (16, 0) without
    it)."""
    u = np.empty((16, wk.shape[2], wk.shape[3]), np.float32)
    _winograd.weights_f23(wk, u)
    if _blas.PACKED is None:
        return u, np.zeros((16, 0), np.float32)
    return u, np.stack([_blas.pack(u[e]) for e in range(16)])


@warm_call
def warm_winograd():
    """Compile the Winograd kernels that call the sgemm (``warmup``) by running them on a tiny
    input, serially and in two shares of tile rows and of products: their arguments (a ctypes
    sgemm) have no signature string."""
    x = np.ones((1, 4, 4, 2), np.float32)
    u, pu = _winograd_weights(np.ones((3, 3, 2, 3), np.float32))
    pfn = None if pu.shape[1] == 0 else _blas.PACKED
    out = np.empty((1, 4, 4, 3), np.float32)
    for parts in (1, 2):
        _winograd_blocks(x, u, pfn, pu, _EMPTY, out, _elementwise.LINEAR, 0.0, 1, 1, 1, parts)
    v, m = np.ones((16, 4, 2), np.float32), np.empty((16, 4, 3), np.float32)
    _winograd.products_f23_par(v, u, pfn, pu, m, 2)


def _conv_implicit(x, wk, b, strides, dh, pt, pl, ho, wo, code, alpha):
    """Implicit-GEMM convolution (``_blas.CONV``) on the zero-padded input: by output rows
    shared among threads, or by output columns when there are few rows."""
    n, h, w, c = x.shape
    kh, kw, cout = wk.shape[0], wk.shape[1], wk.shape[3]
    sh, sw = strides
    k = kh * kw * c
    pw = derived(wk, "packed-sgemm-hwio", lambda w: _blas.pack(w.reshape(k, cout)))
    hp = max(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (wo - 1) * sw + kw)
    size = n * hp * wp * c
    buf = workspace(size + _blas.TILE_ROWS * sw * c)    # tiles read up to 14 columns past a row
    buf[size:] = 0.0
    xp = buf[:size].reshape(n, hp, wp, c)
    _conv.pad_nhwc(x, xp, pt, pl)
    y = np.empty((n * ho * wo, cout), np.float32)
    bias = _EMPTY if b is None else _f32c(b)
    act, alpha = _act_code(code), np.float32(alpha)
    rows, flops = n * ho, 2 * n * ho * wo * k * cout
    chunk = max(1, _gemm.PACKED_CHUNK_FLOATS // (wo * cout))
    by_rows = rows >= _IMPLICIT_MIN_ROWS
    units = rows if by_rows else -(-cout // _gemm.COLUMN_STEP)
    with shares(units, max(1, units * _MIN_SHARE_FLOPS // flops)) as parts:
        if parts == 1:
            _conv.conv_implicit_rows(_blas.CONV, xp, pw, bias, y, act, alpha, kh, kw, sh, sw, dh,
                                     ho, wo, chunk, 0, rows)
            return y
        _conv.conv_implicit_par(_blas.CONV, xp, pw, bias, y, act, alpha, kh, kw, sh, sw, dh, ho,
                                wo, chunk, parts, by_rows)
    if not by_rows:
        _epilogue_rows(y, b, code, alpha)
    return y


def _conv_im2col(x, wk, b, strides, dilation, pt, pl, ho, wo, code, alpha):
    """im2col + sgemm + epilogue in cache-sized row chunks, the rows shared among threads."""
    k = wk.shape[0] * wk.shape[1] * wk.shape[2]
    with shares(x.shape[0] * ho * wo, _min_rows_for(2 * k * wk.shape[3])) as parts:
        return _im2col_shares(x, wk, b, strides, dilation, pt, pl, ho, wo, code, alpha, parts)


def _im2col_shares(x, wk, b, strides, dilation, pt, pl, ho, wo, code, alpha, parts):
    """``_conv_im2col`` in ``parts`` shares (1: in the calling thread)."""
    n, kh, kw, cout = x.shape[0], wk.shape[0], wk.shape[1], wk.shape[3]
    k = kh * kw * wk.shape[2]
    w_kc = wk.reshape(k, cout)
    rows = n * ho * wo
    y = np.empty((rows, cout), np.float32)
    pw = _gemm.packed_weights(w_kc)
    tile = _blas.TILE_ROWS
    chunk = max(tile, min(rows, _COLS_CHUNK // k) // tile * tile)
    m = min(chunk, -(-rows // (parts * tile)) * tile)
    cols = workspace(parts * m * k).reshape(parts, m, k)
    args = (x, w_kc, _blas.SGEMM, None if pw is None else _blas.PACKED,
            _EMPTY if pw is None else pw, _EMPTY if b is None else _f32c(b), y, _act_code(code),
            np.float32(alpha), kh, kw, strides[0], strides[1], dilation[0], dilation[1], pt, pl,
            ho, wo)
    if parts == 1:
        _conv.conv_gemm_rows(*args, cols[0], 0, rows)
    else:
        _conv.conv_gemm_rows_par(*args, cols, parts)
    return y


@warm_call
def warm_conv():
    """Compile the im2col convolution's serial and parallel kernels (``warmup``) by running them
    on a tiny input: their arguments (ctypes sgemm functions) have no signature string."""
    x = np.ones((1, 24, 24, 2), np.float32)
    w = np.ones((3, 3, 2, 4), np.float32)
    for parts in (1, 2):
        _im2col_shares(x, w, None, (2, 2), (1, 1), 1, 1, 12, 12, _elementwise.RELU, 0.0, parts)


def _conv_grouped(x, wk, strides, dilation, pt, pl, ho, wo, groups):
    """Per group and row chunk, im2col of the group's channels (in the calling thread) + a
    product shared among threads (``_gemm.matmul``): grouped convolutions, and those with too
    few output rows to share by rows (their product is split over the output channels)."""
    n, kh, kw, cin_g, cout = x.shape[0], wk.shape[0], wk.shape[1], wk.shape[2], wk.shape[3]
    rows, k, cout_g = n * ho * wo, kh * kw * cin_g, cout // groups
    y = np.empty((rows, cout), np.float32)
    chunk = max(1, min(rows, _COLS_BUDGET // max(k, 1)))
    w2 = wk.reshape(k, cout)
    for g in range(groups):
        wg = w2[:, g * cout_g: (g + 1) * cout_g]
        for r0 in range(0, rows, chunk):
            m = min(chunk, rows - r0)
            cols = workspace(m * k).reshape(m, k)
            _conv.im2col_nhwc(x, cols, kh, kw, strides[0], strides[1], dilation[0], dilation[1],
                              pt, pl, ho, wo, g * cin_g, r0, 0, m)
            if groups == 1:
                _gemm.matmul(cols, wg, y[r0: r0 + m], weights=True)
            else:
                y[r0: r0 + m, g * cout_g: (g + 1) * cout_g] = cols @ wg
    return y


def depthwise_conv2d(self, x_nhwc, w_hwcm, b, strides=(1, 1), pads=((0, 0), (0, 0)),
                     dilation=(1, 1), activation="linear", alpha=0.0):
    n, h, w, c = x_nhwc.shape
    kh, kw, _, m = w_hwcm.shape
    (sh, sw), (dh, dw) = strides, dilation
    (pt, pb), (pl, pr) = pads
    ho = conv_out_size(h, kh, sh, pt + pb, dh)
    wo = conv_out_size(w, kw, sw, pl + pr, dw)
    if x_nhwc.size == 0 or ho <= 0 or wo <= 0:
        return ReferenceOps.depthwise_conv2d(self, x_nhwc, w_hwcm, b, strides, pads, dilation,
                                             activation, alpha)
    out = np.empty((n, ho, wo, c * m), np.float32)
    code = _elementwise.CODES.get(activation)
    args = (_f32c(x_nhwc), _f32c(w_hwcm).reshape(kh, kw, c * m), _EMPTY if b is None else _f32c(b),
            out, _act_code(code), np.float32(alpha), sh, sw, dh, dw, pt, pl, m)
    run_parallel(_conv.depthwise_nhwc, _conv.depthwise_nhwc_par, args, n * ho,
                 _min_out_rows(wo * c * m))
    return out if code is not None else ReferenceOps.activation(self, out, activation, alpha)


def conv_transpose2d(self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation=(1, 1), groups=1,
                     activation="linear", alpha=0.0):
    n, h, w, cin = x_nhwc.shape
    kh, kw, _, cout_g = w_hwio.shape
    (sh, sw), (dh, dw), (ct, cl), (ho, wo) = strides, dilation, crop, out_hw
    if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout_g == 0:
        return ReferenceOps.conv_transpose2d(self, x_nhwc, w_hwio, b, strides, crop, out_hw,
                                             dilation, groups, activation, alpha)
    cin_g = cin // groups
    x_rows = _f32c(x_nhwc).reshape(n * h * w, cin)
    # w (kh, kw, C_in, C_out/g) -> per group (C_in/g, kh kw C_out/g)
    w_ck = np.ascontiguousarray(np.moveaxis(_f32c(w_hwio), 2, 0)).reshape(cin, kh * kw * cout_g)
    out = np.empty((n, ho, wo, groups * cout_g), np.float32)
    k = kh * kw * cout_g
    for g in range(groups):
        cols = workspace(n * h * w * k).reshape(n * h * w, k)
        xg = x_rows if groups == 1 else x_rows[:, g * cin_g: (g + 1) * cin_g]
        _gemm.matmul(xg, w_ck[g * cin_g: (g + 1) * cin_g], cols)
        _conv.col2im_nhwc(cols, out, h, w, kh, kw, sh, sw, dh, dw, ct, cl, g * cout_g, cout_g, 0, n * ho)
    return _epilogue(self, out.reshape(-1, out.shape[-1]), b, activation, alpha).reshape(out.shape)


def pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1),
           count_include_pad=False):
    n, h, w, c = x_nhwc.shape
    (ho, wo), (pt, pb), (pl, pr) = out_hw, pads[0], pads[1]
    if x_nhwc.size == 0 or ho <= 0 or wo <= 0:
        return ReferenceOps.pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation,
                                   count_include_pad)
    out = np.empty((n, ho, wo, c), np.float32)
    args = (_f32c(x_nhwc), out, int(kind == "max"), pool[0], pool[1], strides[0], strides[1],
            dilation[0], dilation[1], pt, pl, h + pb, w + pr, bool(count_include_pad))
    run_parallel(_conv.pool_nhwc, _conv.pool_nhwc_par, args, n * ho, _min_out_rows(wo * c))
    return out


def _bin_pool(x, batch, h0, h1, w0, w1, kind, out):
    args = (_f32c(x), batch, h0, h1, w0, w1, int(kind == "max"), out)
    run_parallel(_conv.bin_pool_nhwc, _conv.bin_pool_nhwc_par, args, out.shape[0] * out.shape[1],
                 _min_out_rows(out.shape[2] * out.shape[3]))
    return out


def adaptive_pool2d(self, x_nhwc, kind, out_hw):
    n, h, w, c = x_nhwc.shape
    if x_nhwc.size == 0:
        return ReferenceOps.adaptive_pool2d(self, x_nhwc, kind, out_hw)
    hb = np.array(adaptive_bins(h, out_hw[0]), np.int64)
    wb = np.array(adaptive_bins(w, out_hw[1]), np.int64)
    h0, h1 = (np.ascontiguousarray(np.broadcast_to(hb[:, i], (n, out_hw[0]))) for i in (0, 1))
    w0, w1 = (np.ascontiguousarray(np.broadcast_to(wb[:, i], (n, out_hw[1]))) for i in (0, 1))
    out = np.empty((n, out_hw[0], out_hw[1], c), np.float32)
    return _bin_pool(x_nhwc, np.arange(n, dtype=np.int64), h0, h1, w0, w1, kind, out)


def roi_pool(self, x_nhwc, rois, output_size, spatial_scale=1.0):
    n, h, w, c = x_nhwc.shape
    if x_nhwc.size == 0 or len(rois) == 0:
        return ReferenceOps.roi_pool(self, x_nhwc, rois, output_size, spatial_scale)
    batch, h0, h1, w0, w1 = roi_bins(rois, output_size, spatial_scale, h, w)
    out = np.empty((batch.shape[0], output_size[0], output_size[1], c), np.float32)
    return _bin_pool(x_nhwc, batch, h0, h1, w0, w1, "max", out)


def upsample2d(self, x_nhwc, out_hw, mode="nearest", align_corners=False, scales=(None, None)):
    n, h, w, c = x_nhwc.shape
    if x_nhwc.size == 0 or min(out_hw) <= 0:
        return ReferenceOps.upsample2d(self, x_nhwc, out_hw, mode, align_corners, scales)
    sy = source_coords(out_hw[0], h, mode, align_corners, scales[0])
    sx = source_coords(out_hw[1], w, mode, align_corners, scales[1])
    if mode == "nearest":
        y0, x0 = sy.astype(np.int64), sx.astype(np.int64)
        y1, x1 = y0, x0
        fy, fx = np.zeros(len(y0), np.float32), np.zeros(len(x0), np.float32)
    else:
        y0 = np.minimum(np.floor(sy).astype(np.int64), h - 1)
        x0 = np.minimum(np.floor(sx).astype(np.int64), w - 1)
        y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
        fy, fx = (sy - y0).astype(np.float32), (sx - x0).astype(np.float32)
    out = np.empty((n, out_hw[0], out_hw[1], c), np.float32)
    args = (_f32c(x_nhwc), y0, y1, fy, x0, x1, fx, mode != "nearest", out)
    run_parallel(_conv.resize_nhwc, _conv.resize_nhwc_par, args, n * out_hw[0],
                 _min_out_rows(out_hw[1] * c))
    return out


def local_response_norm(self, x, size, alpha=1e-4, beta=0.75, k=1.0):
    if x.size == 0 or x.ndim == 0:
        return ReferenceOps.local_response_norm(self, x, size, alpha, beta, k)
    xr = _f32c(x).reshape(-1, x.shape[-1])
    out = np.empty_like(xr)
    args = (xr, int(size), np.float32(alpha), np.float32(beta), np.float32(k), out)
    run_parallel(_conv.lrn_rows, _conv.lrn_rows_par, args, xr.shape[0], _min_out_rows(xr.shape[1]))
    return out.reshape(x.shape)
