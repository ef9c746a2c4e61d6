"""Quantized average pooling of onnxruntime's QOperator graphs: the com.microsoft contrib
operators QLinearGlobalAveragePool and QLinearAveragePool (uint8 or int8, NC... or, with
``channels_last``, N...C), with onnxruntime's arithmetic, bit for bit.

QLinearGlobalAveragePool (``ComputeQLinearGlobalAvgPool`` -> ``MlasQLinearGlobalAveragePoolNchw``
/ ``...Nhwc``, qlgavgpool.cpp): per channel the int32 sum of the image less x_zero_point * size
(int32 arithmetic, wrapping), requantized by ``MlasRequantizeOutput`` (``qlinear.requantize``)
with the float32 multiplier x_scale / (y_scale * float32(size)). Like MLAS
(``CheckQLinearGlobalAveragePoolScaleAndSize``) it refuses an image of 2**24 values or more and a
multiplier outside [2**-32, 256).

QLinearAveragePool (qlinear_pool.cc): the window geometry of ``PoolAttributes`` (explicit pads
or auto_pad, ``ceil_mode`` with the last window starting inside the input or its leading
padding: ``geometry.window_out``; SAME_UPPER / SAME_LOWER pads split as ``geometry.same_pads``,
with onnxruntime's truncating division where a stride wider than the window makes the padding
negative). Where the kernel covers the whole unpadded image it runs QLinearGlobalAveragePool's
integer arithmetic (onnxruntime falls back to it). Otherwise each value is dequantized to
float32 (x_scale * float32(x - x_zero_point), ``dequantize_value``), each window summed in
float32 in row-major order (``AveragePool::Process``: the positions outside the input skipped,
here added as 0.0, which leaves a float32 sum unchanged), divided by float32(count)
(``AveragePool::Finalize``: the kernel's size with ``count_include_pad``, else the positions
inside the input) and quantized by ``quantize_value``: nearbyintf(y / y_scale + y_zero_point)
(the zero point added before rounding, in float32), converted to int32 (a value beyond int32,
infinity or NaN becoming INT32_MIN, as x86's conversion does) and clamped to the type's range.
1-D, 2-D and 3-D windows (onnxruntime's range); sums and windows are numpy reductions and
strided slices, one slice per kernel offset.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..errors import InputError, ShapeError
from ..geometry import same_pads, window_out
from .qlinear import _quantized, one_value, requantize
from .quant import MS, QUANT_RANGES
from .records import AUTO_PAD, BOOL, NONNEG, POSS, Family, fail, spatial_lengths

#: This family's operator records (``ops.RECORDS`` gathers the families): the QLinear average pools.
FAMILY = Family("quantized pooling")

#: The largest image MLAS's global average pool takes (``CheckQLinearGlobalAveragePoolScaleAndSize``).
MAX_IMAGE = 1 << 24


def _params(inputs, x, what):
    """(x_scale, x_zero_point, y_scale, y_zero_point) as 0-d arrays (float32, x's type), each
    checked to be one value; an omitted zero point is 0."""
    x_zp = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros((), x.dtype)
    if len(inputs) < 4 or inputs[3] is None:
        raise InputError(f"{what}: y_scale is required")
    y_zp = inputs[4] if len(inputs) > 4 and inputs[4] is not None else np.zeros((), x.dtype)
    return (
        one_value(inputs[1], what, "x_scale"),
        one_value(x_zp, what, "x_zero_point", x.dtype),
        one_value(inputs[3], what, "y_scale"),
        one_value(y_zp, what, "y_zero_point", x.dtype),
    )


def _global_average(x, axes, x_scale, x_zp, y_scale, y_zp, what):
    """MLAS's quantized global average over ``axes`` of ``x`` (kept as 1s)."""
    size = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if size >= MAX_IMAGE:
        raise InputError(
            f"{what}: an image of {size} values; onnxruntime's global average pool takes fewer than {MAX_IMAGE}"
        )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = np.float32(x_scale / np.float32(y_scale * np.float32(size)))
    if scale < np.float32(2.0**-32) or scale >= np.float32(256):
        raise InputError(
            f"{what}: x_scale / (y_scale * {size} values) is {float(scale)!r}; onnxruntime "
            "computes it only within [2**-32, 256) (its parameters out of computation range)"
        )
    sums = x.sum(axis=axes, keepdims=True, dtype=np.int64)
    acc = (sums - int(x_zp) * size).astype(np.int32)  # the int32 sums of MLAS, wrapping alike
    return requantize(acc, scale, y_zp)


def _global_average_pool(inputs, attrs, opset):
    what = "QLinearGlobalAveragePool"
    x = _quantized(inputs[0], what, "X")
    if x.ndim < 3:
        raise ShapeError(f"{what}: X of shape {x.shape}; expected rank 3 or more (N, C, spatial...)")
    x_scale, x_zp, y_scale, y_zp = _params(inputs, x, what)
    axes = tuple(range(1, x.ndim - 1)) if attrs.get("channels_last", 0) else tuple(range(2, x.ndim))
    return [_global_average(x, axes, x_scale, x_zp, y_scale, y_zp, what)]


def _trunc_half(v: int) -> int:
    """v / 2 rounded toward zero (C's integer division)."""
    return v // 2 if v >= 0 else -((-v) // 2)


def _axis(size, k, s, pads, auto, ceil, what):
    """(head, tail, out) along one axis: the padding before and after (as onnxruntime computes
    it, so possibly negative with SAME_*) and the number of windows."""
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        need = (-(-size // s) - 1) * s + k - size
        lower = auto == "SAME_LOWER"
        if need >= 0:
            head, tail = same_pads(size, k, s, 1, lower)
        else:  # onnxruntime's (need + 1) / 2 and need / 2 truncate toward zero
            head = _trunc_half(need + 1) if lower else _trunc_half(need)
            tail = need - head
    elif auto == "VALID":
        head, tail = 0, 0
    else:
        head, tail = pads
    out = window_out(size, k, s, 1, (head, tail), ceil)
    if out <= 0:
        raise ShapeError(f"{what}: a window of {k} does not fit an axis of {size} padded by {(head, tail)}")
    return head, tail, out


def _average_pool(inputs, attrs, opset):
    what = "QLinearAveragePool"
    x = _quantized(inputs[0], what, "X")
    kernel = [int(k) for k in attrs["kernel_shape"]]
    n = len(kernel)
    if x.ndim != n + 2:
        raise ShapeError(f"{what}: X of shape {x.shape} for a kernel_shape of {n} axes (expected rank {n + 2})")
    x_scale, x_zp, y_scale, y_zp = _params(inputs, x, what)
    last = bool(attrs.get("channels_last", 0))
    first = 1 if last else 2  # the first spatial axis
    sizes = x.shape[first : first + n]
    strides = list(attrs.get("strides") or [1] * n)
    pads = list(attrs.get("pads") or [0] * (2 * n))
    auto, ceil = attrs.get("auto_pad", "NOTSET"), bool(attrs.get("ceil_mode", 0))
    axes = [_axis(sizes[d], kernel[d], strides[d], (pads[d], pads[d + n]), auto, ceil, what) for d in range(n)]
    if list(sizes) == kernel and all(h == 0 and t == 0 for h, t, _ in axes):
        # onnxruntime's fallback to the global average pool (integer sums)
        return [_global_average(x, tuple(range(first, first + n)), x_scale, x_zp, y_scale, y_zp, what)]
    heads, outs = [a[0] for a in axes], [a[2] for a in axes]

    def spatial(parts):  # an index of x's layout from one entry per spatial axis
        return (slice(None),) * first + tuple(parts) + (slice(None),) * (x.ndim - first - n)

    # dequantize_value: x_scale * float32(x - x_zero_point), in x's own layout
    xf = (x.astype(np.int32) - int(x_zp)).astype(np.float32)
    xf *= x_scale
    before = [max(h, 0) for h in heads]
    after = [max(0, (o - 1) * s - h + k - size) for o, s, h, k, size in zip(outs, strides, heads, kernel, sizes)]
    if any(before) or any(after):
        shape = list(x.shape)
        shape[first : first + n] = [b + size + a for b, size, a in zip(before, sizes, after)]
        padded = np.zeros(shape, np.float32)
        padded[spatial(slice(b, b + size) for b, size in zip(before, sizes))] = xf
    else:
        padded = xf
    shape = list(x.shape)
    shape[first : first + n] = outs
    acc = np.zeros(shape, np.float32)
    starts = [b - h for b, h in zip(before, heads)]  # the first window's start in ``padded``
    for offsets in itertools.product(*(range(k) for k in kernel)):  # row-major, as onnxruntime sums
        acc += padded[
            spatial(slice(f + j, f + j + (o - 1) * s + 1, s) for f, j, o, s in zip(starts, offsets, outs, strides))
        ]
    if attrs.get("count_include_pad", 0):
        count = np.float32(np.prod(kernel))
    else:  # the positions of each window inside the input
        count = np.ones((), np.float32)
        for o, s, h, k, size in zip(outs, strides, heads, kernel, sizes):
            start = np.arange(o) * s - h
            along = (np.minimum(start + k, size) - np.maximum(start, 0)).astype(np.float32)
            count = np.multiply.outer(count, along)
        if last:
            count = count[..., None]
    lo, hi = QUANT_RANGES[y_zp.dtype]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        acc /= count
        acc /= y_scale  # quantize_value: y / y_scale + y_zp,
        acc += np.float32(int(y_zp))  # float32, then nearbyintf
        np.rint(acc, out=acc)
        acc[~(np.abs(acc) < np.float32(2.0**31))] = lo  # int32 conversion: INT32_MIN
    np.clip(acc, lo, hi, out=acc)
    return [acc.astype(y_zp.dtype)]


def _pool_check(node, attrs, ctx):
    """QLinearAveragePool's attributes: 1 to 3 spatial axes, lengths matching kernel_shape, each
    pad smaller than the kernel (``PoolAttributes``), no dilations (its schema has none)."""
    n = len(attrs["kernel_shape"])
    if not 1 <= n <= 3:
        fail(
            ctx,
            node,
            f"kernel_shape of {n} axes; onnxruntime's QLinearAveragePool pools 1 to 3 axes",
            unsupported=n > 3,
        )
    spatial_lengths(node, attrs, ctx, n, names=("strides", "kernel_shape"))
    if "dilations" in node.attrs:
        fail(ctx, node, "attribute 'dilations': QLinearAveragePool has none")
    pads = attrs.get("pads") or []
    for d, k in enumerate(attrs["kernel_shape"]):
        if pads and (pads[d] >= k or pads[d + n] >= k):
            fail(
                ctx,
                node,
                f"pads {list(pads)} for kernel_shape {list(attrs['kernel_shape'])}; each pad "
                "must be smaller than the kernel along its axis",
            )


FAMILY.add("QLinearGlobalAveragePool", _global_average_pool, inputs=(5, 5), attrs={"channels_last": BOOL}, domain=MS)
FAMILY.add(
    "QLinearAveragePool",
    _average_pool,
    inputs=(4, 5),
    optional=2,
    required=("kernel_shape",),
    check=_pool_check,
    attrs={
        "auto_pad": AUTO_PAD,
        "ceil_mode": BOOL,
        "channels_last": BOOL,
        "count_include_pad": BOOL,
        "kernel_shape": POSS,
        "pads": NONNEG,
        "strides": POSS,
    },
    domain=MS,
)
