"""Matrix products shared among fastlayers' threads, each share one single-threaded BLAS call.

fastlayers owns its threads: the BLAS libraries run one thread (``_jit.pin_blas``) and products
are split here, by rows when there are enough of them, else by output columns (a batch-1 Dense
layer). An idle multi-threaded BLAS keeps its workers spinning for a while after each call, and
on a machine with as many threads as cores they took the cores from the next kernel's threads:
a ResNet-18 ran slower on 2 threads than on 1 (docs/design.md).
"""

from __future__ import annotations

import numpy as np

from . import _elementwise
from ._split import run_rows, thread_count

#: Fewest multiply-adds (x2) in one thread's share of a product.
MIN_SHARE_FLOPS = 1 << 21
#: Column shares are multiples of this many columns (whole SIMD vectors, sgemm panels).
_COLUMN_STEP = 16
_EMPTY = np.zeros(0, np.float32)


def matmul(a_mk, b_kn, out_mn, bias=None, code=_elementwise.LINEAR, alpha=0.0):
    """out = f(a @ b + bias) for 2-D float32 arrays (``out`` C-contiguous); ``code`` is an
    ``_elementwise`` activation code, applied with the bias while the rows are hot."""
    m, k = a_mk.shape
    n = b_kn.shape[1]
    parts = min(thread_count(), (2 * m * n * k) // MIN_SHARE_FLOPS)
    b = _EMPTY if bias is None else bias
    epilogue = code != _elementwise.LINEAR or bias is not None
    if parts >= 2 and m >= 2 * parts:
        def rows(begin, end):
            np.matmul(a_mk[begin:end], b_kn, out=out_mn[begin:end])
            if epilogue:
                _elementwise.bias_act_rows(out_mn[begin:end], b, out_mn[begin:end], code,
                                           np.float32(alpha))
        run_rows(rows, (), m, 1)
        return out_mn
    if parts >= 2 and n >= 2 * _COLUMN_STEP:
        def columns(begin, end):
            c0, c1 = begin * _COLUMN_STEP, min(end * _COLUMN_STEP, n)
            np.matmul(a_mk, b_kn[:, c0:c1], out=out_mn[:, c0:c1])
        run_rows(columns, (), -(-n // _COLUMN_STEP), 1)
    else:
        np.matmul(a_mk, b_kn, out=out_mn)
    if epilogue:
        _elementwise.bias_act_rows(out_mn, b, out_mn, code, np.float32(alpha))
    return out_mn
