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


#: Longest last axis that ``wide_sum`` adds as slices (numpy's own order there): numpy's
#: reduction over a short contiguous axis pays its per-row setup for a few additions.
SHORT_AXIS = 7


def _short_last_axis_sum(x: np.ndarray, keepdims: bool) -> np.ndarray:
    """sum over the last axis of C-contiguous ``x`` (2 to ``SHORT_AXIS`` long) as numpy's
    reduction computes it, ((x[..., 0] + x[..., 1]) + ...) + x[..., n - 1], by elementwise
    additions of strided slices (docs/design.md, "Accumulation in reductions and
    normalizations")."""
    y = np.add(x[..., 0], x[..., 1])
    for k in range(2, x.shape[-1]):
        y += x[..., k]
    return y[..., None] if keepdims else y


def wide_sum(x: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    """sum(x) over ``axis``, float inputs accumulated pairwise or in float64, in x's dtype."""
    if (
        x.dtype in _EXACT_COUNT  # float32 and float64 (numpy adds float16 in float32)
        and x.flags.c_contiguous
        and x.ndim >= 2
        and 2 <= x.shape[-1] <= SHORT_AXIS
        and axis is not None
        and [a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)] == [x.ndim - 1]
    ):
        return _short_last_axis_sum(x, keepdims)
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
