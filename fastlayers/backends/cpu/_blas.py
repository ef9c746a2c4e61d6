"""sgemm for compiled kernels: numpy's own BLAS, called from Numba through its CBLAS entry point.

Numba's ``np.dot`` calls scipy's BLAS and only on contiguous arrays. Kernels that split a product
among threads need strided operands (a block of output columns) and transposes, and numpy's
OpenBLAS was also the faster of the two here (a 49x4608 by 4608x512 product: 3.0 ms against
4.5 ms, docs/design.md). ``SGEMM`` is that library's ``cblas_sgemm`` (64-bit integers) as a
ctypes function; kernels take it as an argument (``fn``), which keeps them cacheable.
``SGEMM`` is None when numpy's BLAS is not an OpenBLAS with such a symbol; callers then use
numpy's ``matmul``.
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


@njit(inline=True)
def sgemm(fn, a_mk, b_kn, c_mn, trans_b, beta):
    """c = a @ b (or a @ b^T when ``trans_b``, b then (n, k)) + beta c, for 2-D float32 arrays
    whose last axis is contiguous (any row stride): one single-threaded CBLAS call."""
    m, k = a_mk.shape
    n = c_mn.shape[1]
    fn(_ROW_MAJOR, _NO_TRANS, _TRANS if trans_b else _NO_TRANS, m, n, k, np.float32(1.0),
       a_mk.ctypes.data, a_mk.strides[0] // 4, b_kn.ctypes.data, b_kn.strides[0] // 4,
       np.float32(beta), c_mn.ctypes.data, c_mn.strides[0] // 4)
