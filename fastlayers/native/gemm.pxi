# Matrix products (gemm.h).

cdef extern from "dispatch.h" nogil:
    int64_t fl_packed_floats(int64_t k, int64_t n)
    int fl_pack(const float *b, int64_t ldb, int trans_b, int64_t k, int64_t n, float *pb)
    int fl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *pb, int accumulate, float *c, int64_t ldc)
    int fl_sgemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                 int64_t ldb, int trans_b, int accumulate, float *c, int64_t ldc)
    int fl_matmul(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                  int64_t ldb, int trans_b, const float *pb, const float *bias, int code,
                  float alpha, float *c, int64_t ldc)

#: Columns of a packed panel (gemm.h).
PANEL = 32


def pack(cnp.ndarray b, bint trans_b=False):
    """``b`` (k, n) packed for the sgemm (a new 1-D float32 array); with ``trans_b``, ``b`` is
    given as (n, k)."""
    cdef float *bp = fptr(b, "pack")
    cdef int64_t k = b.shape[1] if trans_b else b.shape[0]
    cdef int64_t n = b.shape[0] if trans_b else b.shape[1]
    cdef int64_t ldb = ld(b)
    out = np.empty(fl_packed_floats(k, n), np.float32)
    cdef float *pb = <float *>cnp.PyArray_DATA(out)
    if k > 0 and n > 0:
        with nogil:
            fl_pack(bp, ldb, trans_b, k, n, pb)
    return out


def matmul(cnp.ndarray a, cnp.ndarray b, cnp.ndarray c, object pb=None, object bias=None,
           int code=0, float alpha=0.0, bint trans_b=False):
    """c = f(a @ b + bias) (``b`` (n, k) when ``trans_b``) on the pool's threads: a, b, c 2-D
    with contiguous rows (any row stride), ``pb`` b packed (then ``b`` only gives the shape),
    ``bias`` (n,) or None, f the activation ``code`` with ``alpha``."""
    cdef int64_t m = a.shape[0], k = a.shape[1], n = c.shape[1]
    cdef float *ap = fptr(a, "matmul a")
    cdef float *bp = fptr(b, "matmul b")
    cdef float *cp = fptr(c, "matmul c")
    cdef float *pp = optf(pb, "matmul packed b")
    cdef float *biasp = optf(bias, "matmul bias")
    cdef int64_t lda = ld(a), ldb = ld(b), ldc = ld(c)
    cdef int st
    with nogil:
        st = fl_matmul(m, n, k, ap, lda, bp, ldb, trans_b, pp, biasp, code, alpha, cp, ldc)
    check(st, "matmul")
    return c


def sgemm(cnp.ndarray a, cnp.ndarray b, cnp.ndarray c, bint trans_b=False,
          bint accumulate=False, object pb=None):
    """c (+)= a @ b (``b`` (n, k) when ``trans_b``; on ``pb`` when given) on the calling
    thread: the single-threaded kernel, for tests and benchmarks."""
    cdef int64_t m = a.shape[0], k = a.shape[1], n = c.shape[1]
    cdef float *ap = fptr(a, "sgemm a")
    cdef float *bp = fptr(b, "sgemm b")
    cdef float *cp = fptr(c, "sgemm c")
    cdef float *pp = optf(pb, "sgemm packed b")
    cdef int64_t lda = ld(a), ldb = ld(b), ldc = ld(c)
    cdef int st
    with nogil:
        if pp != NULL:
            st = fl_sgemm_packed(m, n, k, ap, lda, pp, accumulate, cp, ldc)
        else:
            st = fl_sgemm(m, n, k, ap, lda, bp, ldb, trans_b, accumulate, cp, ldc)
    check(st, "sgemm")
    return c
