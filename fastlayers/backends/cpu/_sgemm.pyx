# cython: language_level=3
"""fastlayers' own single-threaded sgemm on weights packed once (``_sgemm_kernel.h``): its
address, for compiled kernels to call through a ctypes prototype (``_blas.PACKED``), and the
packing of weights."""

import numpy as np

from libc.stdint cimport int64_t, uintptr_t


cdef extern from "_sgemm_kernel.h":
    int FL_MR
    int FL_NR
    int fl_supported()
    int64_t fl_packed_floats(int64_t k, int64_t n)
    void fl_pack_all(const float *b, int64_t ldb, int64_t k, int64_t n, float *pb)
    void fl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *pb, float beta, float *c, int64_t ldc)


#: Rows of the micro-kernel's register tile (products in row chunks are best cut at multiples).
TILE_ROWS = FL_MR
#: Columns of a packed panel: the panels of columns j0:j1 (j0 a multiple) start at ``j0 * k``.
PANEL_COLS = FL_NR


def supported():
    """True when this CPU runs the AVX-512 micro-kernel (else callers keep numpy's BLAS)."""
    return bool(fl_supported())


def packed_address():
    """The address of ``fl_sgemm_packed(m, n, k, a, lda, packed_b, beta, c, ldc)``: c (m, n) =
    a (m, k) @ b + beta c (beta 0, or anything else to accumulate), b packed by ``pack``."""
    return <uintptr_t>&fl_sgemm_packed


def pack(b_kn):
    """``b_kn`` (k, n) float32, C-contiguous, packed for ``fl_sgemm_packed``: a new 1-D array of
    ``k * ceil(n / 32) * 32`` floats (at least one)."""
    cdef const float[:, ::1] b = b_kn
    cdef int64_t k = b.shape[0], n = b.shape[1]
    out = np.empty(max(fl_packed_floats(k, n), 1), np.float32)
    cdef float[::1] pb = out
    if k and n:
        fl_pack_all(&b[0, 0], b.strides[0] // 4, k, n, &pb[0])
    return out
