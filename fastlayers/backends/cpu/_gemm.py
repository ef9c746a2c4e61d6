"""Matrix products shared among fastlayers' threads, each share one single-threaded sgemm.

fastlayers owns its threads: BLAS runs one thread (``_jit.pin_blas``) and products are split
here, by rows when there are enough of them, else by blocks of output columns (a batch-1 Dense
layer), on Numba's threads like every other kernel (``_split.shares``): a multi-threaded BLAS
keeps its idle workers spinning after each call, and on a machine with as many threads as cores
they took the cores from the next kernel's threads (a ResNet-18 ran slower on 2 threads than on
1; docs/design.md). The shares call numpy's CBLAS through ``_blas.SGEMM``; without it (a numpy
not built on OpenBLAS) products run unsplit through ``np.matmul``. Products on weights whose
packed form ``packed_weights`` gives (fastlayers' own sgemm, ``_blas.PACKED``) run on it instead,
by row shares.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import overload

from .._jit import FASTMATH, njit
from ...native import _core
from ..derived import derived
from . import _blas, _elementwise
from ._blas import SGEMM, TILE_ROWS, packed, sgemm
from ._split import shares, thread_count

#: Fewest multiply-adds (x2) in one thread's share of a product.
MIN_SHARE_FLOPS = 1 << 21
#: Fewest rows for splitting a product by rows: with fewer, each share would pack all of b
#: (sgemm copies its operands into panels), so the output columns are split instead.
ROW_SPLIT_MIN = 64
#: Column shares are multiples of this many columns: whole SIMD vectors and sgemm panels (the
#: packed sgemm's panels are this wide, so a share of them starts at a panel).
COLUMN_STEP = 32
#: Fewest rows for the packed sgemm: one row reads the weights once either way and OpenBLAS's
#: gemv is as fast; from 2 rows the packed tiles (exactly the rows there are) were 2.8-4.4x
#: faster than OpenBLAS on session 13's host (4 x 256 x 1024: 14.8 against 56.5 us;
#: docs/design.md, "Own sgemm"). The earlier host had OpenBLAS as fast below 8 rows.
PACKED_MIN_ROWS = 2
#: Fewest multiply-adds for the packed sgemm: below, looking up the packed weights costs more
#: than the faster kernel saves (small models ran 10-50 % slower per call).
PACKED_MIN_MADDS = 1 << 18
#: Output floats per chunk of the packed product (256 KiB): its bias and activation run while
#: the chunk is in L2 (a separate pass over a 13 MB output took about 1 ms).
PACKED_CHUNK_FLOATS = 1 << 16
_EMPTY = np.zeros(0, np.float32)


def packed_weights(w_kn):
    """``w_kn`` (k, n) packed for ``_blas.PACKED``, computed once per weight array (a view is
    keyed by the array it views, its offset, shape and strides), or None without it."""
    if _blas.PACKED is None or w_kn.dtype != np.float32 or w_kn.ndim != 2:
        return None
    if w_kn.base is None:
        return derived(w_kn, "packed-sgemm", _blas.pack)
    root = w_kn
    while isinstance(root.base, np.ndarray):
        root = root.base
    offset = w_kn.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    kind = f"packed-sgemm:{offset}:{w_kn.shape}:{w_kn.strides}"
    return derived(root, kind, lambda _: _blas.pack(w_kn))


def _rows_product(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha):
    """out = f(a @ b + bias): fastlayers' sgemm on ``pb`` (b packed) when ``pfn`` is
    ``_blas.PACKED``, in row chunks whose epilogue runs while they are in cache; else one sgemm
    ``fn`` on b (Numba's ``np.dot`` when ``fn`` is None too: contiguous operands) and the
    epilogue (compiled only: the overload below)."""
    raise NotImplementedError("_rows_product runs only inside compiled kernels")


@overload(_rows_product, jit_options={"fastmath": FASTMATH, "nogil": True})
def _rows_product_impl(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha):
    if isinstance(pfn, types.NoneType) and isinstance(fn, types.NoneType):
        def product(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha):
            np.dot(a_mk, b_kn, out_mn)      # no CBLAS from numpy: scipy's BLAS (contiguous)
            if code != 0 or bias.shape[0] > 0:
                _elementwise.bias_act_rows(out_mn, bias, out_mn, code, alpha)
    elif isinstance(pfn, types.NoneType):
        def product(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha):
            sgemm(fn, a_mk, b_kn, out_mn, False, 0.0)
            if code != 0 or bias.shape[0] > 0:
                _elementwise.bias_act_rows(out_mn, bias, out_mn, code, alpha)
    else:
        def product(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha):
            m, n = out_mn.shape
            chunk = max(PACKED_CHUNK_FLOATS // max(n, 1) // TILE_ROWS, 1) * TILE_ROWS
            for r0 in range(0, m, chunk):
                rows = out_mn[r0:r0 + chunk]
                packed(pfn, a_mk[r0:r0 + chunk], pb, rows, 0.0)
                if code != 0 or bias.shape[0] > 0:
                    _elementwise.bias_act_rows(rows, bias, rows, code, alpha)
    return product


def _columns_product(fn, pfn, a_mk, b_kn, pb, out_mn, c0, c1):
    """out[:, c0:c1] = a @ b[:, c0:c1], c0 a multiple of COLUMN_STEP: on ``pb``
    (b packed, whose panels of these columns start at ``c0 k``) when ``pfn`` is
    ``_blas.PACKED``, else one sgemm ``fn`` on b (compiled only: the overload below)."""
    raise NotImplementedError("_columns_product runs only inside compiled kernels")


@overload(_columns_product, jit_options={"fastmath": FASTMATH, "nogil": True})
def _columns_product_impl(fn, pfn, a_mk, b_kn, pb, out_mn, c0, c1):
    if isinstance(pfn, types.NoneType):
        def product(fn, pfn, a_mk, b_kn, pb, out_mn, c0, c1):
            sgemm(fn, a_mk, b_kn[:, c0:c1], out_mn[:, c0:c1], False, 0.0)
    else:
        def product(fn, pfn, a_mk, b_kn, pb, out_mn, c0, c1):
            packed(pfn, a_mk, pb[c0 * a_mk.shape[1]:], out_mn[:, c0:c1], 0.0)
    return product


@njit()
def _packed_serial(pfn, a_mk, pb, out_mn, bias, code, alpha):
    """out = f(a @ b + bias) in the calling thread, b packed."""
    _rows_product(None, pfn, a_mk, a_mk, pb, out_mn, bias, code, alpha)


@njit(parallel=True)
def _matmul_shares(fn, pfn, a_mk, b_kn, pb, out_mn, bias, code, alpha, parts, by_rows):
    """out = a @ b in ``parts`` shares: row blocks, each with its bias + activation epilogue, or,
    when not ``by_rows``, blocks of COLUMN_STEP-aligned output columns (the caller runs the
    epilogue); on ``pb`` (b packed) when ``pfn`` is ``_blas.PACKED``, else sgemm ``fn`` on b."""
    m, n = out_mn.shape
    steps = (n + COLUMN_STEP - 1) // COLUMN_STEP
    for p in prange(parts):
        if by_rows:
            r0, r1 = m * p // parts, m * (p + 1) // parts
            _rows_product(fn, pfn, a_mk[r0:r1], b_kn, pb, out_mn[r0:r1], bias, code, alpha)
        else:
            c0 = min(n, COLUMN_STEP * (steps * p // parts))
            c1 = min(n, COLUMN_STEP * (steps * (p + 1) // parts))
            if c1 > c0:
                _columns_product(fn, pfn, a_mk, b_kn, pb, out_mn, c0, c1)


def native_packed(w_kn):
    """``w_kn`` (k, n) packed for the native sgemm (``fastlayers.native``, gemm.h's panel layout),
    computed once per weight array (a view is keyed by the array it views, its offset, shape and
    strides)."""
    if w_kn.base is None:
        return derived(w_kn, "packed-native", _core.pack)
    root = w_kn
    while isinstance(root.base, np.ndarray):
        root = root.base
    offset = w_kn.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    kind = f"packed-native:{offset}:{w_kn.shape}:{w_kn.strides}"
    return derived(root, kind, lambda _: _core.pack(w_kn))


def matmul(a_mk, b_kn, out_mn, bias=None, code=_elementwise.LINEAR, alpha=0.0, weights=False):
    """out = f(a @ b + bias) for 2-D float32 arrays (``out`` with contiguous rows, the others
    with a contiguous last axis) on the native core's threads; ``code`` is an activation code
    (``fastlayers.native.CODES``), applied with the bias while the rows are hot. ``weights``: b
    is a weight array (or a view of one), packed once (``native_packed``) when the product is
    large enough for the packing to pay."""
    m, k = a_mk.shape
    n = b_kn.shape[1]
    pb = (native_packed(b_kn) if weights and m >= PACKED_MIN_ROWS
          and m * n * k >= PACKED_MIN_MADDS else None)
    if b_kn.strides[-1] != 4 and b_kn.shape[1] > 1:
        b_kn = np.ascontiguousarray(b_kn)
    return _core.matmul(a_mk, b_kn, out_mn, pb, bias, code, alpha)
