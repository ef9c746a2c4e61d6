"""sgemm for compiled kernels: numpy's own BLAS, called from Numba through its CBLAS entry point.

Numba's ``np.dot`` calls scipy's BLAS and only on contiguous arrays. Kernels that split a product
among threads need strided operands (a block of output columns) and transposes, and numpy's
OpenBLAS was also the faster of the two here (a 49x4608 by 4608x512 product: 3.0 ms against
4.5 ms, docs/design.md). ``SGEMM`` is that library's ``cblas_sgemm`` (64-bit integers) as a
ctypes function; kernels take it as an argument (``fn``), which keeps them cacheable.
``SGEMM`` is None when numpy's BLAS is not an OpenBLAS with such a symbol; callers then use
numpy's ``matmul``.

``PACKED`` is fastlayers' own sgemm on weights packed once (``pack``, the Cython extension
``_sgemm``: an AVX-512 micro-kernel), ``packed(fn, a, pb, c, beta)``; it is None on CPUs without
AVX-512F, without the extension, without ``SGEMM`` or with ``FASTLAYERS_SGEMM=openblas``. Thin
products on constant weights ran up to 1.4x faster on it than through OpenBLAS, which packs the
weights again on every call (49x4608x512: 98 vs 72 GFLOP/s; docs/design.md, "Cython: fastlayers'
own sgemm").
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from .._jit import njit

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SYMBOLS = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")


def _numpy_cblas_sgemm():
    from threadpoolctl import threadpool_info

    numpy_root = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    for info in threadpool_info():
        path = info.get("filepath", "")
        if info.get("user_api") != "blas" or not path.startswith(numpy_root):
            continue
        if os.path.basename(os.path.dirname(path)) not in ("numpy.libs", ".dylibs", "numpy"):
            continue
        lib = ctypes.CDLL(path)
        for name in _SYMBOLS:
            fn = getattr(lib, name, None)
            if fn is not None:
                i32, i64, f32, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
                proto = ctypes.CFUNCTYPE(None, i32, i32, i32, i64, i64, i64, f32, ptr, i64, ptr,
                                         i64, f32, ptr, i64)
                return proto(ctypes.cast(fn, ctypes.c_void_p).value)
    return None


SGEMM = _numpy_cblas_sgemm()


def _own_packed_sgemm():
    """(``PACKED``, the register tile's rows), or (None, 1)."""
    if SGEMM is None or os.environ.get("FASTLAYERS_SGEMM", "").lower() == "openblas":
        return None, 1
    try:
        from . import _sgemm
    except ImportError:          # the package was installed without building its extension
        return None, 1
    if not _sgemm.supported():
        return None, 1
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    proto = ctypes.CFUNCTYPE(None, i64, i64, i64, ptr, i64, ptr, f32, ptr, i64)
    return proto(_sgemm.packed_address()), _sgemm.TILE_ROWS


#: ``TILE_ROWS``: products in row chunks are best cut at multiples of it.
PACKED, TILE_ROWS = _own_packed_sgemm()


def pack(b_kn):
    """``b_kn`` (k, n) packed for ``packed`` (a new 1-D float32 array); needs ``PACKED``."""
    from . import _sgemm

    return _sgemm.pack(np.ascontiguousarray(b_kn, dtype=np.float32))


@njit(inline=True)
def sgemm(fn, a_mk, b_kn, c_mn, trans_b, beta):
    """c = a @ b (or a @ b^T when ``trans_b``, b then (n, k)) + beta c, for 2-D float32 arrays
    whose last axis is contiguous (any row stride): one single-threaded CBLAS call."""
    m, k = a_mk.shape
    n = c_mn.shape[1]
    fn(_ROW_MAJOR, _NO_TRANS, _TRANS if trans_b else _NO_TRANS, m, n, k, np.float32(1.0),
       a_mk.ctypes.data, a_mk.strides[0] // 4, b_kn.ctypes.data, b_kn.strides[0] // 4,
       np.float32(beta), c_mn.ctypes.data, c_mn.strides[0] // 4)


@njit(inline=True)
def packed(fn, a_mk, pb, c_mn, beta):
    """c = a @ b + beta c (beta 0 or 1) for b packed by ``pack`` and 2-D float32 ``a``/``c``
    with a contiguous last axis: one single-threaded call of ``PACKED`` (``fn``)."""
    m, k = a_mk.shape
    fn(m, c_mn.shape[1], k, a_mk.ctypes.data, a_mk.strides[0] // 4, pb.ctypes.data,
       np.float32(beta), c_mn.ctypes.data, c_mn.strides[0] // 4)
