"""Matrix products shared among fastlayers' threads, each share one single-threaded sgemm.

fastlayers owns its threads: BLAS runs one thread (``_jit.pin_blas``) and products are split
here, by rows when there are enough of them, else by blocks of output columns (a batch-1 Dense
layer), on Numba's threads like every other kernel (``_split.shares``): a multi-threaded BLAS
keeps its idle workers spinning after each call, and on a machine with as many threads as cores
they took the cores from the next kernel's threads (a ResNet-18 ran slower on 2 threads than on
1; docs/design.md). The shares call numpy's CBLAS through ``_blas.SGEMM``; without it (a numpy
not built on OpenBLAS) products run unsplit through ``np.matmul``.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import njit
from . import _elementwise
from ._blas import SGEMM, sgemm
from ._split import shares, thread_count

#: Fewest multiply-adds (x2) in one thread's share of a product.
MIN_SHARE_FLOPS = 1 << 21
#: Fewest rows for splitting a product by rows: with fewer, each share would pack all of b
#: (sgemm copies its operands into panels), so the output columns are split instead.
ROW_SPLIT_MIN = 64
#: Column shares are multiples of this many columns (whole SIMD vectors, sgemm panels).
COLUMN_STEP = 16
_EMPTY = np.zeros(0, np.float32)


@njit(parallel=True)
def _matmul_shares(fn, a_mk, b_kn, out_mn, bias, code, alpha, parts, by_rows):
    """out = a @ b in ``parts`` shares: row blocks (each with its bias + activation epilogue)
    or, when not ``by_rows``, blocks of COLUMN_STEP-aligned output columns."""
    m, n = out_mn.shape
    steps = (n + COLUMN_STEP - 1) // COLUMN_STEP
    for p in prange(parts):
        if by_rows:
            r0, r1 = m * p // parts, m * (p + 1) // parts
            rows = out_mn[r0:r1]
            sgemm(fn, a_mk[r0:r1], b_kn, rows, False, 0.0)
            if code != 0 or bias.shape[0] > 0:
                _elementwise.bias_act_rows(rows, bias, rows, code, alpha)
        else:
            c0 = min(n, COLUMN_STEP * (steps * p // parts))
            c1 = min(n, COLUMN_STEP * (steps * (p + 1) // parts))
            if c1 > c0:
                sgemm(fn, a_mk, b_kn[:, c0:c1], out_mn[:, c0:c1], False, 0.0)


def matmul(a_mk, b_kn, out_mn, bias=None, code=_elementwise.LINEAR, alpha=0.0):
    """out = f(a @ b + bias) for 2-D float32 arrays (``out`` C-contiguous, the others with a
    contiguous last axis); ``code`` is an ``_elementwise`` activation code, applied with the bias
    while the rows are hot."""
    m, k = a_mk.shape
    n = b_kn.shape[1]
    b = _EMPTY if bias is None else bias
    flops = 2 * m * n * k
    if SGEMM is None or flops < 2 * MIN_SHARE_FLOPS or thread_count() == 1:
        np.matmul(a_mk, b_kn, out=out_mn)            # too small to share: no slot to take
        if code != _elementwise.LINEAR or bias is not None:
            _elementwise.bias_act_rows(out_mn, b, out_mn, code, np.float32(alpha))
        return out_mn
    by_rows = m >= ROW_SPLIT_MIN
    units = m if by_rows else -(-n // COLUMN_STEP)
    with shares(units, max(1, units * MIN_SHARE_FLOPS // flops)) as parts:
        if parts > 1:
            _matmul_shares(SGEMM, a_mk, b_kn, out_mn, b, code, np.float32(alpha), parts, by_rows)
            if by_rows:
                return out_mn
        else:
            np.matmul(a_mk, b_kn, out=out_mn)
    if code != _elementwise.LINEAR or bias is not None:
        _elementwise.bias_act_rows(out_mn, b, out_mn, code, np.float32(alpha))
    return out_mn
