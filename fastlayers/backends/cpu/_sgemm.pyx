# cython: language_level=3
"""fastlayers' own single-threaded sgemm (``_sgemm_kernel.h``): the addresses of its entry
points, for compiled kernels to call through ctypes prototypes (``_blas``), and the packing of
weights for ``fl_sgemm_packed``."""

import numpy as np

from libc.stdint cimport int64_t, uintptr_t


cdef extern from "_sgemm_kernel.h":
    int fl_supported()
    void fl_set_fallback(uintptr_t address)
    int64_t fl_packed_floats(int64_t k, int64_t n)
    void fl_pack_all(const float *b, int64_t ldb, int trans_b, int64_t k, int64_t n, float *pb)
    void fl_sgemm(int layout, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                  float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                  float beta, float *c, int64_t ldc)
    void fl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *pb, float beta, float *c, int64_t ldc)


def supported():
    """True when this CPU runs the AVX-512 micro-kernel (else callers keep numpy's BLAS)."""
    return bool(fl_supported())


def address(fallback):
    """The address of ``fl_sgemm`` (cblas_sgemm's arguments, 64-bit integers), after setting
    ``fallback`` (the address of such a cblas_sgemm) for the calls it does not cover."""
    if not fallback:
        raise ValueError("fastlayers sgemm: a fallback cblas_sgemm address is required")
    fl_set_fallback(<uintptr_t>fallback)
    return <uintptr_t>&fl_sgemm


def packed_address():
    """The address of ``fl_sgemm_packed(m, n, k, a, lda, packed_b, beta, c, ldc)``."""
    return <uintptr_t>&fl_sgemm_packed


def pack(b_kn):
    """``b_kn`` (k, n) float32 with a contiguous last axis, packed for ``fl_sgemm_packed``: a new
    1-D array of ``k * ceil(n / 32) * 32`` floats."""
    cdef const float[:, ::1] b = b_kn
    cdef int64_t k = b.shape[0], n = b.shape[1]
    out = np.empty(max(fl_packed_floats(k, n), 1), np.float32)
    cdef float[::1] pb = out
    if k and n:
        fl_pack_all(&b[0, 0], b.strides[0] // 4, 0, k, n, &pb[0])
    return out
