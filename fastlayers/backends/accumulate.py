"""Sums and means of float arrays that are accurate whatever the memory layout.

numpy's pairwise summation applies only along the contiguous run of the reduced axes, so a
float32 sum over any other axes (a spatial mean of an NCHW view of NHWC memory, a multi-axis
norm) adds sequentially and its error grows with the length: 3.3e-6 relative for a mean over
80 x 120 positions of a (1, 80, 120, 64) NHWC array read as NCHW. Those sums are accumulated in
float64 and rounded once (6e-8), for 1.7x the time of the float32 sum (docs/design.md,
"Accumulation in reductions and normalizations"); sums over the trailing axes of C-contiguous memory stay
pairwise in float32 (1.3e-7 over 9,600 values, half the time of float64).
"""

from __future__ import annotations

import numpy as np

#: Float types whose mean is computed as sum / count below this count (counts exact in the type).
_EXACT_COUNT = {np.dtype(np.float32): 1 << 24, np.dtype(np.float64): 1 << 53}


def _pairwise(x: np.ndarray, axis) -> bool:
    """Whether numpy sums ``x`` over ``axis`` pairwise: ``x`` is C-contiguous and the axes are
    its trailing ones (or all of them)."""
    if not x.flags.c_contiguous or axis is None:
        return x.flags.c_contiguous
    axes = sorted(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    return axes == list(range(x.ndim - len(axes), x.ndim))


#: Longest axis that ``wide_sum`` adds as slices, in numpy's order over contiguous memory
#: (sequential below 8 terms): numpy's reduction over a short axis pays its per-row setup for a
#: few additions, and over one not contiguous in memory it would accumulate in float64.
SHORT_AXIS = 7


def _short_axis_sum(x: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    """sum over ``axis`` of ``x`` (2 to ``SHORT_AXIS`` long, any memory layout) as numpy's
    reduction of contiguous memory computes it, ((x0 + x1) + ...) + x(n - 1), by elementwise
    additions of strided slices (docs/design.md, "Accumulation in reductions and
    normalizations")."""
    part = [slice(None)] * x.ndim
    part[axis] = 0
    first = x[tuple(part)]
    part[axis] = 1
    y = np.add(first, x[tuple(part)])
    for k in range(2, x.shape[axis]):
        part[axis] = k
        y += x[tuple(part)]
    return np.expand_dims(y, axis) if keepdims else y


def wide_sum(x: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    """sum(x) over ``axis``, float inputs accumulated pairwise or in float64, in x's dtype."""
    if x.dtype in _EXACT_COUNT and axis is not None and x.ndim >= 2:  # float32, float64 (float16 adds in float32)
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        if len(axes) == 1 and 2 <= x.shape[axes[0]] <= SHORT_AXIS:
            return _short_axis_sum(x, axes[0] % x.ndim, keepdims)
    if x.dtype.kind != "f" or _pairwise(x, axis):
        return np.sum(x, axis=axis, keepdims=keepdims)
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=np.float64).astype(x.dtype)


def wide_mean(x: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    """mean(x) over ``axis``, float inputs accumulated pairwise or in float64, in x's dtype."""
    if x.dtype.kind != "f" or _pairwise(x, axis):
        if x.dtype in _EXACT_COUNT and x.size:
            # np.mean's result without its Python layers: the sum divided by the count, one
            # correctly rounded quotient either way (float32 sums are divided in float64 by
            # np.mean, and a quotient rounded to 53 bits then to 24 is the quotient rounded to 24)
            total = np.add.reduce(x, axis=axis, keepdims=keepdims)
            count = x.size // max(np.size(total), 1)
            if count < _EXACT_COUNT[x.dtype]:
                return np.divide(total, count, dtype=x.dtype)
        return np.mean(x, axis=axis, keepdims=keepdims)
    return np.mean(x, axis=axis, keepdims=keepdims, dtype=np.float64).astype(x.dtype)
