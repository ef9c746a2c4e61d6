# cython: language_level=3
"""fastlayers' own single-threaded sgemm on weights packed once (``_sgemm_kernel.h``) and the
implicit-GEMM convolution on the same packed weights (``_conv_kernel.h``): their addresses, for
compiled kernels to call through ctypes prototypes (``_blas.PACKED``, ``_blas.CONV``), and the
packing of weights."""

import numpy as np

from libc.stdint cimport int64_t, uintptr_t


cdef extern from "_conv_kernel.h":
    void fl_conv_packed(const float *xp, int64_t hp, int64_t wp, int64_t c, int64_t kh,
                        int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t ho, int64_t wo,
                        const float *pb, int64_t j0, int64_t j1, float *y, int64_t ldy,
                        int64_t t0, int64_t t1)


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


def conv_address():
    """The address of ``fl_conv_packed(xp, hp, wp, c, kh, kw, sh, sw, dh, ho, wo, packed_w, j0,
    j1, y, ldy, t0, t1)``: the implicit-GEMM convolution of output rows t0:t1 and columns j0:j1
    on a zero-padded NHWC input with 14 sw c readable floats past its end (``_conv_kernel.h``)."""
    return <uintptr_t>&fl_conv_packed


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
