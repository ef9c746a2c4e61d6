"""torch.nn.functional's convolution, pooling and resizing functions over NCHW numpy arrays
(re-exported by ``fastlayers.nn.functional``), plus ``roi_pool`` (torchvision.ops.roi_pool).

Inputs are (N, C, L) / (N, C, H, W) as in torch (unbatched (C, L) / (C, H, W) too); they are
moved to the NHWC layout of the kernels and back. Weights use torch's layouts: conv (C_out,
C_in / groups, kh, kw), transposed conv (C_in, C_out / groups, kh, kw).
"""

from __future__ import annotations

import math

import numpy as np

from ..arrays import as_float32
from ..backends import get_ops
from ..errors import InputError, ShapeError, UnsupportedError
from ..geometry import padded_span, same_pads_stride1, transposed_out, window_out


def _tuple(v, n, what):
    t = (int(v),) * n if isinstance(v, (int, np.integer)) else tuple(int(a) for a in v)
    if len(t) != n:
        raise InputError(f"{what}: expected an int or {n} ints, got {v!r}")
    return t


def _batched(x, rank, what):
    """(x as float32 with a batch axis, whether one was added); checks (N, C, *spatial) rank."""
    x = as_float32(x, f"nn.functional.{what}")
    if x.ndim == rank + 1:
        return x[None], True
    if x.ndim != rank + 2:
        raise ShapeError(
            f"{what}: expected a {rank + 1}-D (unbatched) or {rank + 2}-D (batched) input, got shape {x.shape}"
        )
    return x, False


def _to_nhwc(x_ncs, rank):
    """(N, C, L) -> (N, 1, L, C); (N, C, H, W) -> (N, H, W, C)."""
    x = np.moveaxis(x_ncs, 1, -1)
    if rank == 1:
        x = x[:, None]
    return np.ascontiguousarray(x)


def _from_nhwc(y, rank, unbatched):
    if rank == 1:
        y = y[:, 0]
    y = np.ascontiguousarray(np.moveaxis(y, -1, 1))
    return y[0] if unbatched else y


def _hw(t, rank, one):
    return (one, *t) if rank == 1 else tuple(t)


def conv_pads(padding, rank, kernel, stride, dilation, what):
    """torch's ``padding`` (int, tuple, 'valid', 'same') as ((before, after),) per axis."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * rank
        if padding == "same":
            if any(s != 1 for s in stride):
                raise InputError(f"{what}: padding='same' is not supported for strided convolutions (as in torch)")
            return tuple(same_pads_stride1(k, d) for k, d in zip(kernel, dilation))
        raise InputError(f"{what}: invalid padding string {padding!r}, expected 'valid' or 'same'")
    p = _tuple(padding, rank, f"{what} padding")
    if any(v < 0 for v in p):
        raise InputError(f"{what}: padding must be >= 0, got {padding!r}")
    return tuple((v, v) for v in p)


def _conv(rank, input, weight, bias, stride, padding, dilation, groups, what):
    x, unbatched = _batched(input, rank, what)
    weight = as_float32(weight, f"{what} weight")
    if weight.ndim != rank + 2:
        raise ShapeError(
            f"{what}: expected a weight of rank {rank + 2} (C_out, C_in / groups, kernel...), got shape {weight.shape}"
        )
    groups = int(groups)
    c_out, cin_g = weight.shape[:2]
    if groups <= 0 or x.shape[1] % groups or c_out % groups:
        raise ShapeError(
            f"{what}: groups={groups} must divide both the {x.shape[1]} input channels and the {c_out} output channels"
        )
    if x.shape[1] // groups != cin_g:
        raise ShapeError(
            f"{what}: weight of shape {weight.shape} with groups={groups} expects "
            f"{cin_g * groups} input channels, got input of shape {tuple(x.shape)}"
        )
    kernel = weight.shape[2:]
    stride = _tuple(stride, rank, f"{what} stride")
    dilation = _tuple(dilation, rank, f"{what} dilation")
    pads = conv_pads(padding, rank, kernel, stride, dilation, what)
    for n, k, d, (a, b) in zip(x.shape[2:], kernel, dilation, pads):
        if padded_span(n, k, d, (a, b)) < 0:
            raise ShapeError(
                f"{what}: input of spatial size {tuple(x.shape[2:])} (padded by "
                f"{pads}) is smaller than the dilated kernel {tuple(kernel)}"
            )
    w_hwio = np.moveaxis(weight, (0, 1), (-1, -2))  # (..., C_in/g, C_out)
    if rank == 1:
        w_hwio = w_hwio[None]
    y = get_ops().conv2d(
        _to_nhwc(x, rank),
        np.ascontiguousarray(w_hwio),
        None if bias is None else as_float32(bias, f"{what} bias"),
        _hw(stride, rank, 1),
        _hw(pads, rank, (0, 0)),
        _hw(dilation, rank, 1),
        groups,
    )
    return _from_nhwc(y, rank, unbatched)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution of (N, C_in, L) with weight (C_out, C_in / groups, k) -> (N, C_out, L_out)."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution of (N, C_in, H, W) with weight (C_out, C_in / groups, kh, kw) -> (N, C_out, H_out, W_out)."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups, "conv2d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 2-D convolution, weight (C_in, C_out / groups, kh, kw);
    H_out = (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1."""
    what = "conv_transpose2d"
    x, unbatched = _batched(input, 2, what)
    weight = as_float32(weight, f"{what} weight")
    groups = int(groups)
    if weight.ndim != 4 or groups <= 0 or x.shape[1] % groups or weight.shape[0] != x.shape[1]:
        raise ShapeError(
            f"{what}: weight of shape {weight.shape} with groups={groups} does not fit "
            f"input of shape {tuple(x.shape)} (expected weight (C_in, C_out / groups, kh, kw) "
            "with groups dividing C_in)"
        )
    stride, dilation = _tuple(stride, 2, f"{what} stride"), _tuple(dilation, 2, f"{what} dilation")
    pad, op = _tuple(padding, 2, f"{what} padding"), _tuple(output_padding, 2, f"{what} output_padding")
    kernel = weight.shape[2:]
    if any(o >= s and o >= d for o, s, d in zip(op, stride, dilation)):
        raise InputError(
            f"{what}: output_padding {op} must be smaller than either stride {stride} or dilation {dilation}"
        )
    out_hw = tuple(
        transposed_out(n, k, s, d, (p, p), o)
        for n, s, p, d, k, o in zip(x.shape[2:], stride, pad, dilation, kernel, op)
    )
    if min(out_hw) <= 0:
        raise ShapeError(f"{what}: padding {pad} leaves an empty output for input {tuple(x.shape)}")
    w_hwio = np.ascontiguousarray(weight.transpose(2, 3, 0, 1))
    y = get_ops().conv_transpose2d(
        _to_nhwc(x, 2),
        w_hwio,
        None if bias is None else as_float32(bias, f"{what} bias"),
        stride,
        pad,
        out_hw,
        dilation,
        groups,
    )
    return _from_nhwc(y, 2, unbatched)


def pool_geometry(sizes, kernel, stride, padding, dilation, ceil_mode, what):
    """torch's pooled sizes (ceil_mode: the last window must start inside the input or left padding)."""
    out = []
    for n, k, s, p, d in zip(sizes, kernel, stride, padding, dilation):
        if p > k // 2:
            raise InputError(f"{what}: padding {padding} must be at most half the kernel {kernel}")
        if padded_span(n, k, d, (p, p)) < 0:
            raise ShapeError(
                f"{what}: input of spatial size {tuple(sizes)} is smaller than the kernel {kernel} (padding {padding})"
            )
        out.append(window_out(n, k, s, d, (p, p), ceil_mode))
    return tuple(out)


def _pool(
    rank, kind, input, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad, what, divisor_override=None
):
    x, unbatched = _batched(input, rank, what)
    kernel = _tuple(kernel_size, rank, f"{what} kernel_size")
    stride = kernel if stride is None or stride == [] or stride == () else _tuple(stride, rank, f"{what} stride")
    padding = _tuple(padding, rank, f"{what} padding")
    dilation = _tuple(dilation, rank, f"{what} dilation")
    out = pool_geometry(x.shape[2:], kernel, stride, padding, dilation, ceil_mode, what)
    pads = tuple((p, p) for p in padding)
    y = get_ops().pool2d(
        _to_nhwc(x, rank),
        kind,
        _hw(kernel, rank, 1),
        _hw(stride, rank, 1),
        _hw(pads, rank, (0, 0)),
        _hw(out, rank, 1),
        _hw(dilation, rank, 1),
        count_include_pad,
    )
    if divisor_override:
        counts = _window_counts(x.shape[2:], kernel, stride, padding, out, count_include_pad)
        y = y * _hw_counts(counts, rank) / np.float32(divisor_override)
    return _from_nhwc(y.astype(np.float32, copy=False), rank, unbatched)


def _window_counts(sizes, kernel, stride, padding, out, count_include_pad):
    """Per axis, the number of cells each average window divides by (torch's rule)."""
    counts = []
    for n, k, s, p, o in zip(sizes, kernel, stride, padding, out):
        starts = np.arange(o) * s - p
        if count_include_pad:
            counts.append(np.minimum(starts + k, n + p) - starts)
        else:
            counts.append(np.minimum(starts + k, n) - np.maximum(starts, 0))
    return counts


def _hw_counts(counts, rank):
    """Separable per-axis counts as an NHWC-broadcastable array."""
    if rank == 1:
        return counts[0].astype(np.float32)[None, None, :, None]
    return (counts[0][:, None] * counts[1][None, :]).astype(np.float32)[None, :, :, None]


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, L)."""
    if return_indices:
        raise UnsupportedError("max_pool1d(return_indices=True) is not supported")
    return _pool(1, "max", input, kernel_size, stride, padding, dilation, ceil_mode, False, "max_pool1d")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over windows of (N, C, H, W)."""
    if return_indices:
        raise UnsupportedError("max_pool2d(return_indices=True) is not supported")
    return _pool(2, "max", input, kernel_size, stride, padding, dilation, ceil_mode, False, "max_pool2d")


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Mean over windows of (N, C, L) (``count_include_pad``: zero padding counts in the divisor)."""
    return _pool(1, "avg", input, kernel_size, stride, padding, 1, ceil_mode, count_include_pad, "avg_pool1d")


def avg_pool2d(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """Mean over windows of (N, C, H, W); ``divisor_override`` replaces the divisor."""
    return _pool(
        2, "avg", input, kernel_size, stride, padding, 1, ceil_mode, count_include_pad, "avg_pool2d", divisor_override
    )


def _adaptive(rank, kind, input, output_size, what):
    x, unbatched = _batched(input, rank, what)
    if rank == 1:
        out = _tuple(output_size, 1, f"{what} output_size")
    else:
        sizes = (output_size, output_size) if isinstance(output_size, (int, np.integer)) else tuple(output_size)
        if len(sizes) != 2:
            raise InputError(f"{what}: output_size must be an int or 2 values, got {output_size!r}")
        out = tuple(int(n) if s is None else int(s) for s, n in zip(sizes, x.shape[2:]))
    if any(o <= 0 for o in out):
        raise InputError(f"{what}: output_size must be positive, got {output_size!r}")
    y = get_ops().adaptive_pool2d(_to_nhwc(x, rank), kind, _hw(out, rank, 1))
    return _from_nhwc(y, rank, unbatched)


def adaptive_avg_pool1d(input, output_size):
    """Mean over torch's adaptive bins of L."""
    return _adaptive(1, "avg", input, output_size, "adaptive_avg_pool1d")


def adaptive_avg_pool2d(input, output_size):
    """Mean over torch's adaptive bins of H, W (None keeps a size)."""
    return _adaptive(2, "avg", input, output_size, "adaptive_avg_pool2d")


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """Max over torch's adaptive bins of L."""
    if return_indices:
        raise UnsupportedError("adaptive_max_pool1d(return_indices=True) is not supported")
    return _adaptive(1, "max", input, output_size, "adaptive_max_pool1d")


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Max over torch's adaptive bins of H, W (None keeps a size)."""
    if return_indices:
        raise UnsupportedError("adaptive_max_pool2d(return_indices=True) is not supported")
    return _adaptive(2, "max", input, output_size, "adaptive_max_pool2d")


def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """Resize (N, C, H, W) with mode "nearest" or "bilinear" (torch's coordinate rules)."""
    what = "interpolate"
    if mode not in ("nearest", "bilinear"):
        raise UnsupportedError(f"{what}: mode {mode!r} is not supported; expected 'nearest' or 'bilinear'")
    if antialias:
        raise UnsupportedError(f"{what}: antialias=True is not supported")
    if mode == "nearest" and align_corners is not None:
        raise InputError(f"{what}: align_corners can only be set with mode 'bilinear'")
    x, unbatched = _batched(input, 2, what)
    if (size is None) == (scale_factor is None):
        raise InputError(f"{what}: give exactly one of size and scale_factor")
    h, w = x.shape[2:]
    if size is not None:
        out = _tuple(size, 2, f"{what} size")
        scales = (None, None)
    else:
        sf = (float(scale_factor),) * 2 if np.isscalar(scale_factor) else tuple(float(s) for s in scale_factor)
        out = (int(math.floor(h * sf[0])), int(math.floor(w * sf[1])))
        scales = (None, None) if recompute_scale_factor else sf
    if min(out) <= 0:
        raise InputError(f"{what}: output size {out} must be positive")
    y = get_ops().upsample2d(_to_nhwc(x, 2), out, mode, bool(align_corners), scales)
    return _from_nhwc(y, 2, unbatched)


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels (axis 1))^beta."""
    x = as_float32(input, "nn.functional.local_response_norm")
    if x.ndim < 3:
        raise ShapeError(f"local_response_norm: expected an input of rank >= 3 (N, C, ...), got shape {x.shape}")
    xl = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    y = get_ops().local_response_norm(xl, int(size), float(alpha), float(beta), float(k))
    return np.ascontiguousarray(np.moveaxis(y, -1, 1))


def roi_pool(input, boxes, output_size, spatial_scale=1.0):
    """torchvision.ops.roi_pool: RoI max pooling of (N, C, H, W) features.

    ``boxes`` is a (K, 5) array of ``(batch index, x1, y1, x2, y2)`` or a list of N (L_i, 4)
    arrays of ``(x1, y1, x2, y2)`` per image; coordinates are in input-image units, scaled by
    ``spatial_scale``. Returns (K, C, ph, pw).
    """
    what = "roi_pool"
    x = as_float32(input, f"nn.functional.{what}")
    if x.ndim != 4:
        raise ShapeError(f"{what}: expected features (N, C, H, W), got shape {x.shape}")
    if isinstance(boxes, (list, tuple)):
        parts = []
        for i, b in enumerate(boxes):
            b = as_float32(b, f"{what} boxes[{i}]")
            if b.ndim != 2 or b.shape[1] != 4:
                raise ShapeError(f"{what}: boxes[{i}] must be (L, 4), got shape {b.shape}")
            parts.append(np.concatenate([np.full((b.shape[0], 1), i, np.float32), b], axis=1))
        rois = np.concatenate(parts) if parts else np.zeros((0, 5), np.float32)
    else:
        rois = as_float32(boxes, f"{what} boxes")
        if rois.ndim != 2 or rois.shape[1] != 5:
            raise ShapeError(f"{what}: boxes must be (K, 5) or a list of (L, 4), got shape {rois.shape}")
    if rois.shape[0] and (rois[:, 0].min() < 0 or rois[:, 0].max() >= x.shape[0]):
        raise InputError(f"{what}: box batch indices must be in [0, {x.shape[0]})")
    out = _tuple(output_size, 2, f"{what} output_size")
    y = get_ops().roi_pool(_to_nhwc(x, 2), rois, out, spatial_scale)
    return np.ascontiguousarray(np.moveaxis(y, -1, 1))
