"""The geometry of ONNX window operators (convolutions and pooling): spatial attributes, pads
from ``pads`` or ``auto_pad``, output sizes checked against the input and the size limit.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..geometry import dilated_size, padded_span, same_pads, window_out
from .tensors import created


def spatial(attrs, key, n, default):
    """The values of attribute ``key`` (``default`` for each of ``n`` spatial axes where it is
    absent), for two axes: a 1-D operator's get a leading ``default`` (1 for ``kernel_shape``)."""
    v = attrs.get(key)
    v = [default] * n if v is None or len(v) == 0 else list(v)
    if len(v) != n:
        raise ShapeError(f"attribute {key!r} has {len(v)} values for an input with {n} spatial axes")
    return v if n == 2 else [default if key != "kernel_shape" else 1] + v


def conv_pads(attrs, in_hw, kernel, strides, dilations):
    """((top, bottom), (left, right)) from ``pads`` or ``auto_pad`` (SAME_UPPER puts the extra
    cell at the end, SAME_LOWER at the start)."""
    auto = attrs.get("auto_pad", "NOTSET")
    n = len(in_hw)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return tuple(
            same_pads(size, k, s, d, lower=auto == "SAME_LOWER")
            for size, k, s, d in zip(in_hw, kernel, strides, dilations)
        )
    if auto == "VALID":
        return ((0, 0),) * n
    p = list(attrs.get("pads") or [0] * (2 * n))
    if len(p) != 2 * n:
        raise ShapeError(f"attribute 'pads' has {len(p)} values for an input with {n} spatial axes")
    return tuple((p[i], p[i + n]) for i in range(n))


def pads_2d(attrs, x_shape, kernel, strides, dilations, one_d):
    """``conv_pads`` for an input of ``x_shape``, as ((top, bottom), (left, right)): a 1-D
    operator's with (0, 0) over its height of 1."""
    pads = conv_pads(
        attrs, x_shape[2:], kernel[-len(x_shape[2:]) :], strides[-len(x_shape[2:]) :], dilations[-len(x_shape[2:]) :]
    )
    return ((0, 0),) + pads if one_d else pads


def _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil=False):
    """The output (height, width) of a window op, checked positive, and whether the padding is
    wider than the dilated window (only then may the graph's values, not the input, make the
    output large)."""
    out_hw = []
    for size, k, s, d, (a, z) in zip(in_hw, kernel, strides, dilations, pads):
        if padded_span(size, k, d, (a, z)) < 0:
            raise ShapeError(
                f"{what}: input of spatial size {tuple(in_hw)} (padded by {tuple(pads)}) "
                f"is smaller than the dilated window {tuple(kernel)} (dilations "
                f"{tuple(dilations)})"
            )
        out_hw.append(window_out(size, k, s, d, (a, z), ceil))
    return out_hw, any(max(a, z) >= dilated_size(k, d) for k, d, (a, z) in zip(kernel, dilations, pads))


def padded_output(what, n_c, in_hw, kernel, strides, dilations, pads, ceil=False):
    """The output (height, width) of a window op (``_output_hw``), within ``onnx_max_created_bytes``
    (as float32, with ``n_c`` = batch x channels) where the padding is wider than the window."""
    out_hw, wide = _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil)
    if wide:
        created([n_c, *out_hw], np.float32, what)
    return out_hw


def window(what, attrs, x_shape, kernel, one_d, ceil=False):
    """(strides, pads, dilations, out_hw, wide) of a 2-D window op (``kernel``: (kh, kw); 1-D
    ops as 2-D with height 1) over an NCHW / NCL input of ``x_shape``; see ``_output_hw``."""
    cache = attrs.get("_windows")
    hit = None if cache is None else cache.get((x_shape, kernel))
    if hit is not None:
        return hit
    n = len(x_shape) - 2
    strides, dilations = spatial(attrs, "strides", n, 1), spatial(attrs, "dilations", n, 1)
    pads = pads_2d(attrs, x_shape, kernel, strides, dilations, one_d)
    in_hw = (1, x_shape[2]) if one_d else x_shape[2:]
    out_hw, wide = _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil)
    geometry = (tuple(strides), pads, tuple(dilations), tuple(out_hw), wide)
    if cache is not None:
        if len(cache) >= 64:  # bound the memory of many distinct shapes
            cache.clear()
        cache[x_shape, kernel] = geometry
    return geometry
