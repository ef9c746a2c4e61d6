"""ONNX Resize and Upsample: nearest and linear, separable, in onnxruntime's coordinate arithmetic."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...errors import ShapeError, UnsupportedError
from ..layout import channels_last_memory
from ..records import AXES, BOOL, FLOATS, FLT, STRING, A, Family, fail
from ..tensors import created, ints

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("resize")
op = FAMILY.op


def _source_coords(out_size, in_size, scale, mode, roi=(0.0, 1.0)):
    """The input coordinate of each output index for a coordinate_transformation_mode, in
    float32 arithmetic and with the integer output length, as onnxruntime computes them (a
    float64 coordinate such as 3 / 0.6 = 4.9999... floors to another row than its 5.0)."""
    f = np.float32
    i = np.arange(out_size, dtype=f)
    scale, length, original = f(scale), f(out_size), f(in_size)
    if mode == "half_pixel":
        return (i + f(0.5)) / scale - f(0.5)
    if mode == "pytorch_half_pixel":
        return (i + f(0.5)) / scale - f(0.5) if out_size > 1 else np.zeros(out_size, f)
    if mode == "align_corners":
        return i * (original - f(1)) / (length - f(1)) if out_size > 1 else np.zeros(out_size, f)
    if mode == "asymmetric":
        return i / scale
    if mode == "half_pixel_symmetric":
        adjustment = length / (scale * original)
        offset = original / f(2) * (f(1) - adjustment)
        # onnxruntime adds the half pixels in double precision here
        return (np.float64(offset) + (i.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(f)
    if mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_size > 1:
            return start * (original - f(1)) + i * (end - start) * (original - f(1)) / (length - f(1))
        return np.full(out_size, f(0.5) * (start + end) * (original - f(1)), f)
    raise UnsupportedError(f"Resize coordinate_transformation_mode {mode!r} is not supported")


def _resize(x, out_shape, scales, attrs, roi):
    """Nearest or linear resize of every axis whose size changes (numpy, separable)."""
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise UnsupportedError(f"Resize mode {mode!r} is not supported (nearest and linear are)")
    if attrs.get("antialias", 0):
        raise UnsupportedError("Resize with antialias=1 is not supported")
    if len(out_shape) != x.ndim:
        raise ShapeError(f"Resize: output shape {tuple(out_shape)[:8]} for an input of rank {x.ndim}")
    created(out_shape, np.float64 if x.dtype.kind == "f" else x.dtype, "Resize")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    changed = [a for a, (i, o) in enumerate(zip(x.shape, out_shape)) if i != o or scales[a] != 1.0]
    if x.dtype == np.float32 and x.ndim == 4 and coord != "tf_crop_and_resize" and set(changed) <= {2, 3}:
        return _resize_spatial(x, out_shape, scales, mode, coord, nearest)
    y = x.astype(np.float64) if x.dtype.kind == "f" else x
    for axis, (size_in, size_out) in enumerate(zip(x.shape, out_shape)):
        if size_in == size_out and scales[axis] == 1.0 and coord != "tf_crop_and_resize":
            continue
        src = _source_coords(
            size_out, size_in, scales[axis], coord, (roi[axis], roi[axis + x.ndim]) if roi is not None else (0.0, 1.0)
        )
        if mode == "nearest":
            idx = _nearest(src, nearest)
            outside = (idx < 0) | (idx > size_in - 1)
            y = np.take(y, np.clip(idx, 0, size_in - 1).astype(np.int64), axis=axis)
        else:
            outside = (src < 0) | (src > size_in - 1)
            lo, hi, frac = _linear_taps(src, size_in)
            frac = frac.reshape([-1 if a == axis else 1 for a in range(x.ndim)])
            y = np.take(y, lo, axis=axis) * (1 - frac) + np.take(y, hi, axis=axis) * frac
        if coord == "tf_crop_and_resize" and np.any(outside):
            mask = outside.reshape([-1 if a == axis else 1 for a in range(x.ndim)])
            y = np.where(mask, attrs.get("extrapolation_value", 0.0), y)
    return y.astype(x.dtype, copy=False)


def _nearest(src, nearest_mode):
    """The input index (float, unclipped) nearest each source coordinate, ties as the mode says."""
    if nearest_mode == "round_prefer_floor":
        return np.where(src - np.floor(src) == 0.5, np.floor(src), np.round(src))
    if nearest_mode == "round_prefer_ceil":
        return np.where(src - np.floor(src) == 0.5, np.ceil(src), np.round(src))
    return np.floor(src) if nearest_mode == "floor" else np.ceil(src)


def _linear_taps(src, size_in):
    """(lower index, upper index, weight of the upper) of each source coordinate, clamped to
    the input."""
    src_c = np.clip(src, 0, size_in - 1)
    lo = np.floor(src_c).astype(np.int64)
    return lo, np.minimum(lo + 1, size_in - 1), src_c - lo


def _resize_spatial(x, out_shape, scales, mode, coord, nearest):
    """A float32 NCHW resize of H and W only, on channels-last memory: each output pixel's
    source rows and columns found once per axis, the pixels gathered (linear: blended in
    float32) by the backend's ``resize2d_taps``; the result is an NCHW view of NHWC memory as
    the convolutions return, so the next convolution moves nothing."""
    held = channels_last_memory(x)
    y = held if held is not None else x.transpose(0, 2, 3, 1)
    taps = []
    for axis in (1, 2):  # H, W of the NHWC array
        size_in, size_out = y.shape[axis], out_shape[axis + 1]
        if size_in == size_out and scales[axis + 1] == 1.0:
            same = np.arange(size_in, dtype=np.int64)
            taps.append((same, same, np.zeros(size_in, np.float32)))
            continue
        src = _source_coords(size_out, size_in, scales[axis + 1], coord)
        if mode == "nearest":
            index = np.clip(_nearest(src, nearest), 0, size_in - 1).astype(np.int64)
            taps.append((index, index, np.zeros(size_out, np.float32)))
            continue
        lo, hi, frac = _linear_taps(src, size_in)
        taps.append((lo, hi, frac.astype(np.float32)))
    return get_ops().resize2d_taps(y, taps[0], taps[1], mode != "nearest").transpose(0, 3, 1, 2)


def _resize_check(node, attrs, ctx):
    if attrs.get("mode") == "cubic":
        fail(ctx, node, "Resize mode 'cubic' is not supported (nearest and linear are)", unsupported=True)
    if attrs.get("antialias"):
        fail(ctx, node, "Resize with antialias=1 is not supported", unsupported=True)
    if ctx.opset < 11:
        if len(node.inputs) < 2 or not node.inputs[1]:
            fail(ctx, node, "needs input 'scales' (opset 10)")
    elif not any(node.inputs[2:4]):
        fail(ctx, node, "needs input 'scales' or 'sizes'")


@op(
    "Resize",
    inputs=(1, 4),
    check=_resize_check,
    attrs={
        "antialias": BOOL,
        "axes": AXES,
        "cubic_coeff_a": FLT,
        "exclude_outside": BOOL,
        "extrapolation_value": FLT,
        "mode": A(STRING, choices=("nearest", "linear", "cubic")),
        "coordinate_transformation_mode": A(
            STRING,
            choices=(
                "half_pixel",
                "pytorch_half_pixel",
                "align_corners",
                "asymmetric",
                "half_pixel_symmetric",
                "tf_crop_and_resize",
            ),
        ),
        "keep_aspect_ratio_policy": A(STRING, choices=("stretch", "not_larger", "not_smaller")),
        "nearest_mode": A(STRING, choices=("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")),
    },
)
def _resize_op(inputs, attrs, opset):
    x = inputs[0]
    roi = inputs[1] if len(inputs) > 1 and inputs[1] is not None and inputs[1].size else None
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else None
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None and inputs[3].size else None
    if opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
        scales, roi = inputs[1], None
        attrs = {
            **attrs,
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": attrs.get("nearest_mode", "floor")
            if attrs.get("mode", "nearest") == "nearest"
            else "floor",
        }
    axes = attrs.get("axes")
    n = x.ndim
    full_scales = [1.0] * n
    out = list(x.shape)
    if axes is not None:
        axes = [a % n for a in axes]
    else:
        axes = list(range(n))
    _check_factors("Resize", sizes, scales, len(axes), x.shape)
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) < n:
        r = [0.0] * n + [1.0] * n
        for k, a in enumerate(axes):
            r[a], r[a + n] = roi[k], roi[k + len(axes)]
        roi = r
    if sizes is not None:
        sizes = ints(sizes)
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [sizes[k] / x.shape[a] for k, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(round(r * x.shape[a])) for a in axes]
            for a in axes:
                full_scales[a] = r
        for k, a in enumerate(axes):
            out[a] = sizes[k]
            if policy == "stretch":
                full_scales[a] = sizes[k] / x.shape[a]
    else:
        scales = [float(s) for s in np.asarray(scales).reshape(-1)]
        for k, a in enumerate(axes):
            full_scales[a] = scales[k]
            out[a] = int(np.floor(x.shape[a] * scales[k]))
    return [_resize(x, out, full_scales, attrs, roi)]


def _check_factors(what, sizes, scales, count, shape):
    """Raises ``ShapeError`` unless ``sizes`` (where given) or else ``scales`` hold one value
    per resized axis (``count`` of an input of ``shape``), the scales positive."""
    name = "sizes" if sizes is not None else "scales"
    values = sizes if sizes is not None else scales
    if values is None:
        raise ShapeError(f"{what}: neither 'scales' nor 'sizes' has values (input of shape {tuple(shape)})")
    values = np.asarray(values).reshape(-1)
    if values.size != count:
        raise ShapeError(f"{what}: '{name}' has {values.size} values for {count} axes (input of shape {tuple(shape)})")
    if name == "scales" and not np.all(values > 0):
        raise ShapeError(f"{what}: 'scales' {values.tolist()} must be positive")


def _upsample_check(node, attrs, ctx):
    if "scales" not in attrs and not (len(node.inputs) > 1 and node.inputs[1]):
        fail(ctx, node, "needs its scales (input 2 or attribute 'scales')")


@op(
    "Upsample",
    inputs=(1, 2),
    check=_upsample_check,
    attrs={"mode": A(STRING, choices=("nearest", "linear")), "scales": A(FLOATS, 0.0)},
)
def _upsample(inputs, attrs, opset):
    x = inputs[0]
    scales = [float(s) for s in (np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else attrs["scales"])]
    _check_factors("Upsample", None, scales, x.ndim, x.shape)
    out = [int(np.floor(d * s)) for d, s in zip(x.shape, scales)]
    mode = attrs.get("mode", "nearest")
    return [
        _resize(
            x,
            out,
            scales,
            {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
            None,
        )
    ]
