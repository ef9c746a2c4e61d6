"""Numpy reference of the convolution and pooling primitives (NHWC activations, HWIO kernels).

Readable, not fast: each op is a loop over kernel offsets of strided slices (or over output bins),
so the compiled kernels have an oracle to be tested against. Spatial conventions shared by all:

- ``pads`` is ``((top, bottom), (left, right))``: explicit, possibly asymmetric, zero padding.
- A 1-D op is the 2-D op on ``H = 1`` (kernel height 1, no vertical padding).
- Output size of a window op: ``(H + top + bottom - dilation (k - 1) - 1) // stride + 1``
  (``geometry.window_out``).
"""

from __future__ import annotations

import numpy as np

from ...geometry import transposed_out, window_out
from ..accumulate import wide_mean

_NEG_INF = np.float32(-np.inf)


def _window(xp, i, j, strides, dilation, out_hw):
    """xp[:, i dh + s oh, j dw + s ow, :] for every output position (oh, ow)."""
    (sh, sw), (dh, dw), (ho, wo) = strides, dilation, out_hw
    return xp[:, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw, :]


def conv2d(x_nhwc, w_hwio, strides, pads, dilation, groups):
    """y[n, oh, ow, g co + o] = sum_{i, j, c} xpad[n, s oh + d i, s ow + d j, g ci + c] w[i, j, c, g co + o]
    (``w_hwio`` an array or what a backend's ``conv_weights`` gave, read through ``np.asarray``)."""
    w_hwio = np.asarray(w_hwio)
    n, h, w, c = x_nhwc.shape
    kh, kw, cin_g, cout = w_hwio.shape
    (pt, pb), (pl, pr) = pads
    ho = window_out(h, kh, strides[0], dilation[0], (pt, pb))
    wo = window_out(w, kw, strides[1], dilation[1], (pl, pr))
    xp = np.pad(x_nhwc, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    cout_g = cout // groups
    y = np.zeros((n, ho, wo, groups, cout_g), np.float32)
    for i in range(kh):
        for j in range(kw):
            patch = _window(xp, i, j, strides, dilation, (ho, wo)).reshape(n, ho, wo, groups, cin_g)
            wg = w_hwio[i, j].reshape(cin_g, groups, cout_g)
            y += np.einsum("nhwgc,cgo->nhwgo", patch, wg)
    return y.reshape(n, ho, wo, cout)


def conv_transpose2d(x_nhwc, w_hwio, strides, crop, out_hw, dilation, groups):
    """The adjoint of conv2d: full[n, s ih + d i, s iw + d j, g co + o] += x[n, ih, iw, g ci + c] w[i, j, g ci + c, o],
    then y = full[:, top: top + Ho, left: left + Wo].

    ``w_hwio`` is (kh, kw, C_in, C_out / groups); ``crop`` is (top, left); ``out_hw`` the output size.
    """
    n, h, w, cin = x_nhwc.shape
    kh, kw, _, cout_g = w_hwio.shape
    (sh, sw), (dh, dw) = strides, dilation
    (ct, cl), (ho, wo) = crop, out_hw
    cin_g = cin // groups
    full_h = max(transposed_out(h, kh, sh, dh), ct + ho)
    full_w = max(transposed_out(w, kw, sw, dw), cl + wo)
    full = np.zeros((n, full_h, full_w, groups, cout_g), np.float32)
    xg = x_nhwc.reshape(n, h, w, groups, cin_g)
    for i in range(kh):
        for j in range(kw):
            wg = w_hwio[i, j].reshape(groups, cin_g, cout_g)
            full[:, i * dh : i * dh + sh * (h - 1) + 1 : sh, j * dw : j * dw + sw * (w - 1) + 1 : sw] += np.einsum(
                "nhwgc,gco->nhwgo", xg, wg
            )
    return np.ascontiguousarray(full[:, ct : ct + ho, cl : cl + wo].reshape(n, ho, wo, groups * cout_g))


def pool2d(x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1), count_include_pad=False):
    """Max or average over windows x[n, s oh - top + d i, s ow - left + d j, c], i < kh, j < kw.

    Cells outside the input are ignored by max. Average divides by the number of cells inside the
    input, or (``count_include_pad``) inside the padded input ``[-top, H + bottom)`` (cells past
    the padding, reachable in ceil mode, never count).
    """
    n, h, w, c = x_nhwc.shape
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = pool, strides, dilation, out_hw
    (pt, pb), (pl, pr) = pads
    need_h = max(transposed_out(ho, kh, sh, dh), pt + h + pb)  # the cells ho windows span
    need_w = max(transposed_out(wo, kw, sw, dw), pl + w + pr)
    if kind == "max":
        xp = np.full((n, need_h, need_w, c), _NEG_INF, np.float32)
        xp[:, pt : pt + h, pl : pl + w] = x_nhwc
        y = np.full((n, ho, wo, c), _NEG_INF, np.float32)
        for i in range(kh):
            for j in range(kw):
                win = _window(xp, i, j, (sh, sw), (dh, dw), (ho, wo))
                # np.fmax would drop NaN; keep numpy's max semantics (NaN wins)
                y = np.where(np.isnan(win) | (win > y), win, y)
        return y
    xp = np.zeros((n, need_h, need_w, c), np.float32)
    xp[:, pt : pt + h, pl : pl + w] = x_nhwc
    mask = np.zeros((1, need_h, need_w, 1), np.float32)
    if count_include_pad:
        mask[:, : pt + h + pb, : pl + w + pr] = 1
    else:
        mask[:, pt : pt + h, pl : pl + w] = 1
    total = np.zeros((n, ho, wo, c), np.float32)
    count = np.zeros((1, ho, wo, 1), np.float32)
    for i in range(kh):
        for j in range(kw):
            total += _window(xp, i, j, (sh, sw), (dh, dw), (ho, wo))
            count += _window(mask, i, j, (sh, sw), (dh, dw), (ho, wo))
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count


def adaptive_bins(size: int, out: int):
    """torch's adaptive bins: [floor(i size / out), ceil((i + 1) size / out)) for i < out."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def adaptive_pool2d(x_nhwc, kind, out_hw):
    """y[n, i, j, c] = max or mean of x over the adaptive bin (i, j) (see ``adaptive_bins``)."""
    n, h, w, c = x_nhwc.shape
    reduce = np.max if kind == "max" else wide_mean
    y = np.empty((n, out_hw[0], out_hw[1], c), np.float32)
    for i, (h0, h1) in enumerate(adaptive_bins(h, out_hw[0])):
        for j, (w0, w1) in enumerate(adaptive_bins(w, out_hw[1])):
            y[:, i, j] = reduce(x_nhwc[:, h0:h1, w0:w1], axis=(1, 2))
    return y


def roi_bins(rois, output_size, spatial_scale, h, w):
    """torchvision's RoI bins: (batch (K,), h0, h1 (K, ph), w0, w1 (K, pw)) as int64.

    A region's corners are scaled by ``spatial_scale`` and rounded half away from zero; its size
    is at least 1; bin i spans [floor(i bh), ceil((i + 1) bh)) shifted by the region's start and
    clipped to [0, size] (float32 arithmetic, as torchvision's kernel).
    """
    rois = np.asarray(rois, np.float32).reshape(-1, 5)
    ph, pw = output_size
    scaled = rois[:, 1:] * np.float32(spatial_scale)
    corners = (np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))).astype(np.int64)
    x1, y1, x2, y2 = corners.T
    rh = np.maximum(y2 - y1 + 1, 1).astype(np.float32)
    rw = np.maximum(x2 - x1 + 1, 1).astype(np.float32)
    bh, bw = rh / np.float32(ph), rw / np.float32(pw)
    i, j = np.arange(ph, dtype=np.float32), np.arange(pw, dtype=np.float32)

    def edges(start, step, idx, size):
        lo = np.floor(idx[None, :] * step[:, None]).astype(np.int64) + start[:, None]
        hi = np.ceil((idx[None, :] + 1) * step[:, None]).astype(np.int64) + start[:, None]
        return np.clip(lo, 0, size), np.clip(hi, 0, size)

    h0, h1 = edges(y1, bh, i, h)
    w0, w1 = edges(x1, bw, j, w)
    return rois[:, 0].astype(np.int64), h0, h1, w0, w1


def roi_pool(x_nhwc, rois, output_size, spatial_scale):
    """torchvision.ops.roi_pool on NHWC: max over each of ph x pw bins of every region.

    ``rois`` is (K, 5) rows ``(batch index, x1, y1, x2, y2)`` in input coordinates (bins as in
    ``roi_bins``); an empty bin gives 0. Returns (K, ph, pw, C).
    """
    n, h, w, c = x_nhwc.shape
    batch, h0, h1, w0, w1 = roi_bins(rois, output_size, spatial_scale, h, w)
    y = np.zeros((batch.shape[0], output_size[0], output_size[1], c), np.float32)
    for k in range(batch.shape[0]):
        for i in range(output_size[0]):
            for j in range(output_size[1]):
                if h1[k, i] > h0[k, i] and w1[k, j] > w0[k, j]:
                    y[k, i, j] = x_nhwc[batch[k], h0[k, i] : h1[k, i], w0[k, j] : w1[k, j]].max(axis=(0, 1))
    return y


def source_coords(out: int, size: int, mode: str, align_corners: bool, scale=None):
    """Source coordinate of each output index for resizing ``size`` -> ``out`` (torch's rules).

    ``scale`` is the ratio used by torch when a scale factor was given (source = dst / factor);
    by default size / out.
    """
    ratio = resize_ratio(out, size, mode, align_corners, scale)
    dst = np.arange(out, dtype=np.float32)
    if mode == "nearest":
        return np.minimum(np.floor(dst * ratio).astype(np.int64), size - 1)
    if align_corners:
        return dst * ratio
    return np.maximum((dst + np.float32(0.5)) * ratio - np.float32(0.5), np.float32(0))


def resize_ratio(out: int, size: int, mode: str, align_corners: bool, scale=None) -> np.float32:
    """The float32 factor of ``source_coords``: source = dst ratio (bilinear without
    align_corners: (dst + 0.5) ratio - 0.5)."""
    if mode != "nearest" and align_corners:
        return np.float32((size - 1) / (out - 1)) if out > 1 else np.float32(0)
    return np.float32(size / out if scale is None else 1.0 / scale)


def upsample2d(x_nhwc, out_hw, mode, align_corners=False, scales=(None, None)):
    """Nearest or bilinear resize of the H, W axes to ``out_hw`` (torch.nn.functional.interpolate)."""
    n, h, w, c = x_nhwc.shape
    if mode == "nearest":
        rows = source_coords(out_hw[0], h, mode, False, scales[0])
        cols = source_coords(out_hw[1], w, mode, False, scales[1])
        return np.ascontiguousarray(x_nhwc[:, rows][:, :, cols])
    sy = source_coords(out_hw[0], h, mode, align_corners, scales[0])
    sx = source_coords(out_hw[1], w, mode, align_corners, scales[1])
    y0 = np.minimum(np.floor(sy).astype(np.int64), h - 1)
    x0 = np.minimum(np.floor(sx).astype(np.int64), w - 1)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy = (sy - y0).astype(np.float32)[None, :, None, None]
    fx = (sx - x0).astype(np.float32)[None, None, :, None]
    top = x_nhwc[:, y0][:, :, x0] * (1 - fx) + x_nhwc[:, y0][:, :, x1] * fx
    bottom = x_nhwc[:, y1][:, :, x0] * (1 - fx) + x_nhwc[:, y1][:, :, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


def local_response_norm(x_c_last, size, alpha, beta, k):
    """y[..., c] = x[..., c] / (k + alpha / size sum_{c' = c - size//2}^{c + (size-1)//2} x[..., c']^2)^beta."""
    c = x_c_last.shape[-1]
    sq = np.square(x_c_last.astype(np.float64))
    pad = [(0, 0)] * (x_c_last.ndim - 1) + [(size // 2, (size - 1) // 2)]
    sqp = np.pad(sq, pad)
    s = np.zeros_like(sq)
    for t in range(size):
        s += sqp[..., t : t + c]
    return (x_c_last / (k + alpha / size * s) ** beta).astype(np.float32)
