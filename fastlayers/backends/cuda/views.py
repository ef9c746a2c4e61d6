"""Launch sizes and views of the cuda backend's device arrays.

- ``grid1``, ``grid2``: the (blocks, threads) of a 1-D or 2-D kernel launch (smaller blocks
  under the simulator, where every thread is a Python thread).
- ``as_rows``, ``flat``: a contiguous device array viewed as (rows, last axis) or as 1-D.
- ``layout``, ``collapse6``: the shape, element strides and offset of a numpy-style view of a
  C-contiguous array, merged into the 6 axes that the strided kernels (``copy_strided``,
  ``binary_strided``, ``keep_bias_strided``) take.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError


def grid2(cols: int, rows: int, sim: bool):
    """(blocks, threads) of a 2-D launch over (cols, rows), cols on the fast axis."""
    tx = 1
    while tx < cols and tx < 32:
        tx *= 2
    ty = max(1, (32 if sim else 256) // tx)
    ty = min(ty, max(1, rows))
    return ((cols + tx - 1) // tx, (rows + ty - 1) // ty), (tx, ty)


def grid1(n: int, sim: bool):
    """(blocks, threads) of a 1-D launch over n elements."""
    t = min(32 if sim else 128, max(1, n))
    return ((n + t - 1) // t,), (t,)


def as_rows(a):
    """Device array ``a`` viewed as (rows, last axis)."""
    shape = tuple(a.shape)
    return a.reshape(math.prod(shape[:-1]), shape[-1])


def flat(a):
    """Contiguous device array ``a`` viewed as 1-D (a 0-d array as one element)."""
    return a.reshape(max(math.prod(a.shape), 1))


_LAYOUT_BASE = np.zeros(1, np.uint8)


def layout(shape, select=None):
    """(shape, element strides, element offset) of ``select(a)`` for a C-contiguous ``a`` of
    ``shape``: numpy's view rules (transpose, basic slicing, flip, broadcast) applied to an array
    of no data (one byte per element), as numba's device arrays do for their own views."""
    shape = tuple(int(n) for n in shape)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    a = np.lib.stride_tricks.as_strided(_LAYOUT_BASE, shape, tuple(reversed(strides)))
    v = a if select is None else select(a)
    offset = v.__array_interface__["data"][0] - _LAYOUT_BASE.__array_interface__["data"][0]
    return tuple(v.shape), tuple(v.strides), offset


def collapse6(shape, *strides):
    """``shape`` and each operand's ``strides`` with size-1 axes dropped and neighbours that are
    contiguous in every operand merged, padded in front to the 6 axes of the strided kernels."""
    dims = []
    for k, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[k] for s in strides]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    if len(dims) > 6:
        raise UnsupportedError(
            f"backend 'cuda': array layouts of more than 6 non-unit axes are not supported (shape {tuple(shape)})"
        )
    pad = 6 - len(dims)
    return (
        (1,) * pad + tuple(n for n, _ in dims),
        *((0,) * pad + tuple(st[i] for _, st in dims) for i in range(len(strides))),
    )
