# Matrix products (gemm.h).

from cpython.mem cimport PyMem_Free, PyMem_Malloc

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
    int fl_matmul_batch(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
                        int64_t sa, int64_t lda, const float *b, int64_t sb, int64_t ldb,
                        int trans_b, float *c, int64_t sc, int64_t ldc)

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
    with contiguous rows (any row stride), ``pb`` b packed (then ``b`` is not read: any float32
    array), ``bias`` (n,) or None, f the activation ``code`` with ``alpha``."""
    cdef int64_t m = a.shape[0], k = a.shape[1], n = c.shape[1]
    cdef float *ap = fptr(a, "matmul a")
    cdef float *pp = optf(pb, "matmul packed b")
    cdef float *bp = pp if pp != NULL else fptr(b, "matmul b")
    cdef float *cp = fptr(c, "matmul c")
    cdef float *biasp = optf(bias, "matmul bias")
    cdef int64_t lda = ld(a), ldb = ld(b) if pp == NULL else 0, ldc = ld(c)
    cdef int st
    with nogil:
        st = fl_matmul(m, n, k, ap, lda, bp, ldb, trans_b, pp, biasp, code, alpha, cp, ldc)
    check(st, "matmul")
    return c


cdef int64_t _batch_stride(cnp.ndarray x, int64_t batch, str what) except -1:
    """x's stride in floats over its first axis (0 where a batch of one is shared)."""
    if x.shape[0] == 1 and batch > 1:
        return 0
    if x.strides[0] % 4:
        raise ValueError(f"{what}: the batch stride is not a whole number of floats")
    return x.strides[0] // 4


cdef int64_t _row_stride(cnp.ndarray x) except -1:
    """x's row stride in floats over its second axis (its width where it has one row)."""
    if x.shape[1] <= 1:
        return max(x.strides[1] // 4, x.shape[2])
    if x.strides[1] % 4:
        raise ValueError("matmul_batch: a row stride is not a whole number of floats")
    return x.strides[1] // 4


def matmul_batch(cnp.ndarray a, cnp.ndarray b, cnp.ndarray c, bint trans_b=False):
    """c[i] = a[i] @ b[i] (b[i]^T when ``trans_b``) on the pool's threads: ``a`` (B or 1, m, k),
    ``b`` (B or 1, k, n) ((B or 1, n, k) when ``trans_b``), ``c`` (B, m, n), float32, each with
    a contiguous last axis (any batch and row strides; an operand of batch 1 is shared).
    Returns ``c``."""
    if a.ndim != 3 or b.ndim != 3 or c.ndim != 3:
        raise ValueError(f"matmul_batch: expected 3-D operands, got {a.ndim}, {b.ndim} and {c.ndim} axes")
    cdef int64_t batch = c.shape[0], m = c.shape[1], n = c.shape[2], k = a.shape[2]
    cdef int64_t bk = b.shape[2] if trans_b else b.shape[1]
    cdef int64_t bn = b.shape[1] if trans_b else b.shape[2]
    if a.shape[0] not in (1, batch) or b.shape[0] not in (1, batch) or a.shape[1] != m \
            or bk != k or bn != n:
        raise ValueError(f"matmul_batch: a {(<object>a).shape} and b {(<object>b).shape}"
                         f"{' (transposed)' if trans_b else ''} do not give c {(<object>c).shape}")
    cdef float *ap = fptr(a, "matmul_batch a")
    cdef float *bp = fptr(b, "matmul_batch b")
    cdef float *cp = fptr(c, "matmul_batch c")
    cdef int64_t sa = _batch_stride(a, batch, "matmul_batch a")
    cdef int64_t sb = _batch_stride(b, batch, "matmul_batch b")
    cdef int64_t sc = _batch_stride(c, batch, "matmul_batch c")
    cdef int64_t lda = _row_stride(a), ldb = _row_stride(b), ldc = _row_stride(c)
    cdef int st
    with nogil:
        st = fl_matmul_batch(batch, m, n, k, ap, sa, lda, bp, sb, ldb, trans_b, cp, sc, ldc)
    check(st, "matmul_batch")
    return c


#: Fewest multiply-adds for the packed sgemm on weights, a product of fewer rows counted as
#: PACKED_ROWS_FLOOR rows: the packed weights are one stream where weights read in place are k
#: rows apart, which pays from about 128 KiB of weights at any row count (docs/design.md,
#: "GEMM"); below, looking up the packed weights costs more than the faster reads save.
PACKED_MIN_MADDS = 1 << 18
PACKED_ROWS_FLOOR = 8


cdef object _dense_input(object x, int64_t k):
    """``x`` as ``dense`` reads it (C-contiguous aligned float32, last axis k, not empty), else None."""
    if type(x) is not np.ndarray:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int nd = xa.ndim
    if (nd < 1 or nd > 32 or cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(xa)
            or not cnp.PyArray_ISALIGNED(xa) or xa.shape[nd - 1] != k or xa.size == 0):
        return None
    return xa


cdef int _dense_bias(object bias, int64_t n, float **biasp) except -1:
    """Points ``biasp`` at ``bias`` ((n,) contiguous aligned float32) or NULL for None; 0, or 1
    where ``bias`` is not in those terms."""
    biasp[0] = NULL
    if bias is None:
        return 0
    if type(bias) is not np.ndarray:
        return 1
    cdef cnp.ndarray ba = <cnp.ndarray>bias
    if (ba.ndim != 1 or ba.shape[0] != n or cnp.PyArray_TYPE(ba) != cnp.NPY_FLOAT32
            or not cnp.PyArray_IS_C_CONTIGUOUS(ba) or not cnp.PyArray_ISALIGNED(ba)):
        return 1
    biasp[0] = <float *>cnp.PyArray_DATA(ba)
    return 0


cdef object _dense_run(cnp.ndarray xa, int64_t k, int64_t n, const float *wp, int64_t ldw,
                       const float *pp, const float *biasp, int code, float alpha, str what):
    """y = f(x @ w + bias) as a new array (..., n): w read in place (``wp``, rows ``ldw``
    apart) or packed (``pp``)."""
    cdef int nd = xa.ndim
    cdef int64_t m = xa.size // k
    cdef cnp.npy_intp dims[32]
    cdef int i
    for i in range(nd - 1):
        dims[i] = xa.shape[i]
    dims[nd - 1] = n
    out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
    cdef float *xp = <float *>cnp.PyArray_DATA(xa)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = fl_matmul(m, n, k, xp, k, wp, ldw, 0, pp, biasp, code, alpha, op, n)
    check(st, what)
    return out


def dense(object x, object w, object bias, int code, float alpha, object packer):
    """y = f(x @ w + bias) over the last axis of ``x``, as a new array, on the pool's threads:
    the whole Dense layer in one call. ``x`` C-contiguous float32 of any rank, ``w`` (k, n)
    float32 weights with a contiguous last axis, ``bias`` (n,) contiguous float32 or None, f
    the activation ``code``; ``packer(w)`` gives the packed weights, asked for when the product
    is large enough for them to pay, and always for ``w`` a transposed view (an (n, k) array
    read as ``.T``: torch's Linear weight), never copied per call. None when the arguments do
    not fit these terms (the caller then takes its general path)."""
    if type(w) is not np.ndarray:
        return None
    cdef cnp.ndarray wa = <cnp.ndarray>w
    if wa.ndim != 2 or cnp.PyArray_TYPE(wa) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISALIGNED(wa):
        return None
    cdef int64_t k = wa.shape[0], n = wa.shape[1]
    xa = _dense_input(x, k)
    if xa is None or k == 0 or n == 0:
        return None
    cdef bint transposed = n > 1 and wa.strides[1] != 4
    if transposed:
        if k < 2 or wa.strides[0] != 4 or wa.strides[1] < 4 * k or wa.strides[1] % 4:
            return None
    elif k > 1 and (wa.strides[0] < 4 * n or wa.strides[0] % 4):
        return None
    cdef float *biasp
    if _dense_bias(bias, n, &biasp):
        return None
    cdef int64_t m = (<cnp.ndarray>xa).size // k
    cdef float *pp = NULL
    if transposed or max(m, PACKED_ROWS_FLOOR) * n * k >= PACKED_MIN_MADDS:
        pb = packer(w)
        pp = fptr(pb, "dense packed weights")
    return _dense_run(xa, k, n, <float *>cnp.PyArray_DATA(wa), ld(wa) if pp == NULL else 0, pp, biasp,
                      code, alpha, "dense")


def dense_held(object x, cnp.ndarray pb, int64_t k, int64_t n, object bias, int code, float alpha):
    """``dense`` on weights (k, n) held only packed (``pb``, ``pack``'s output for them): the
    same product and bits as ``dense`` gives when it packs them. None when ``x`` or ``bias``
    do not fit ``dense``'s terms."""
    if pb.ndim != 1 or pb.shape[0] < fl_packed_floats(k, n) or k <= 0 or n <= 0:
        raise ValueError(f"dense_held: {pb.shape[0]} packed floats do not hold ({k}, {n}) weights")
    xa = _dense_input(x, k)
    cdef float *biasp
    if xa is None or _dense_bias(bias, n, &biasp):
        return None
    cdef float *pp = fptr(pb, "dense packed weights")
    return _dense_run(xa, k, n, pp, 0, pp, biasp, code, alpha, "dense")


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



cdef class DenseChain:
    """Consecutive dense layers, each reading the output of the one before, run in one call
    with the GIL released: y = f_L(... f_1(x @ w_1 + b_1) ... @ w_L + b_L) over the last axis
    of ``x``, each product on the pool's threads as ``dense`` runs it, the values between layers
    in two buffers of the call's own.

    ``layers``: (w (k, n) float32, C-contiguous or the transpose of a C-contiguous (n, k) array
    (torch's Linear weight read as ``weight.T``), bias (n,) C-contiguous float32 or None,
    activation code, alpha) per layer, each k the n before it; ``packer(w)`` gives a layer's
    packed weights, asked for at each call where ``dense`` would use them, always for a
    transposed ``w`` (so that the packed cache, ``backends.derived``, stays their one holder,
    and the chain gives ``dense``'s bits). Calling it on ``x`` returns the new output array, or
    None where ``x`` is not a C-contiguous aligned float32 array of the first layer's width
    (the caller then takes its general path)."""

    cdef list weights, biases
    cdef object packer
    cdef int layers
    cdef int64_t k0, widest
    cdef int64_t *ks
    cdef int64_t *ns
    cdef int *codes
    cdef int *trans
    cdef float *alphas
    cdef float **wps
    cdef float **bps

    def __cinit__(self, list layers, object packer):
        cdef int count = len(layers)
        if count < 1:
            raise ValueError("DenseChain: no layers")
        self.ks = <int64_t *>PyMem_Malloc(count * sizeof(int64_t))
        self.ns = <int64_t *>PyMem_Malloc(count * sizeof(int64_t))
        self.codes = <int *>PyMem_Malloc(count * sizeof(int))
        self.trans = <int *>PyMem_Malloc(count * sizeof(int))
        self.alphas = <float *>PyMem_Malloc(count * sizeof(float))
        self.wps = <float **>PyMem_Malloc(count * sizeof(float *))
        self.bps = <float **>PyMem_Malloc(count * sizeof(float *))
        if not (self.ks and self.ns and self.codes and self.trans and self.alphas and self.wps and self.bps):
            raise MemoryError("DenseChain: its layer table could not be allocated")
        self.weights, self.biases, self.packer, self.layers, self.widest = [], [], packer, 0, 0
        cdef cnp.ndarray wa, ba
        for w, bias, code, alpha in layers:
            if (type(w) is not np.ndarray or (<cnp.ndarray>w).ndim != 2
                    or cnp.PyArray_TYPE(<cnp.ndarray>w) != cnp.NPY_FLOAT32
                    or not (cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>w)
                            or cnp.PyArray_IS_F_CONTIGUOUS(<cnp.ndarray>w))
                    or not cnp.PyArray_ISALIGNED(<cnp.ndarray>w) or (<cnp.ndarray>w).size == 0):
                raise ValueError(f"DenseChain: layer {self.layers}: weights must be a non-empty C-contiguous "
                                 "float32 matrix or the transpose of one")
            wa = <cnp.ndarray>w
            # (a matrix of one row or column is both: read as C-contiguous)
            self.trans[self.layers] = 0 if cnp.PyArray_IS_C_CONTIGUOUS(wa) else 1
            if self.trans[self.layers] and packer is None:
                raise ValueError(f"DenseChain: layer {self.layers}: transposed weights need a packer")
            if self.layers and wa.shape[0] != self.ns[self.layers - 1]:
                raise ValueError(f"DenseChain: layer {self.layers} takes {wa.shape[0]} values, the layer "
                                 f"before gives {self.ns[self.layers - 1]}")
            self.bps[self.layers] = NULL
            if bias is not None:
                if (type(bias) is not np.ndarray or (<cnp.ndarray>bias).ndim != 1
                        or (<cnp.ndarray>bias).shape[0] != wa.shape[1]
                        or cnp.PyArray_TYPE(<cnp.ndarray>bias) != cnp.NPY_FLOAT32
                        or not cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>bias)
                        or not cnp.PyArray_ISALIGNED(<cnp.ndarray>bias)):
                    raise ValueError(f"DenseChain: layer {self.layers}: bias must be a C-contiguous float32 "
                                     f"vector of {wa.shape[1]} values")
                ba = <cnp.ndarray>bias
                self.bps[self.layers] = <float *>cnp.PyArray_DATA(ba)
            self.ks[self.layers], self.ns[self.layers] = wa.shape[0], wa.shape[1]
            self.codes[self.layers], self.alphas[self.layers] = code, alpha
            self.wps[self.layers] = <float *>cnp.PyArray_DATA(wa)
            if self.layers < count - 1 and wa.shape[1] > self.widest:
                self.widest = wa.shape[1]
            self.weights.append(w)
            self.biases.append(bias)
            self.layers += 1
        self.k0 = self.ks[0]

    def __dealloc__(self):
        PyMem_Free(self.ks)
        PyMem_Free(self.ns)
        PyMem_Free(self.codes)
        PyMem_Free(self.trans)
        PyMem_Free(self.alphas)
        PyMem_Free(self.wps)
        PyMem_Free(self.bps)

    def __call__(self, x):
        if type(x) is not np.ndarray:
            return None
        cdef cnp.ndarray xa = <cnp.ndarray>x
        cdef int nd = xa.ndim
        if (nd < 1 or nd > 32 or cnp.PyArray_TYPE(xa) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(xa)
                or not cnp.PyArray_ISALIGNED(xa) or xa.shape[nd - 1] != self.k0 or xa.size == 0):
            return None
        cdef int64_t m = xa.size // self.k0
        cdef int i, st = 0, last = self.layers - 1
        cdef cnp.npy_intp dims[32]
        cdef float *buf = NULL
        cdef float *src = <float *>cnp.PyArray_DATA(xa)
        cdef float *dst
        cdef float *outp
        cdef float **pps = <float **>PyMem_Malloc(self.layers * sizeof(float *))
        if pps == NULL:
            raise MemoryError("DenseChain: a call's table could not be allocated")
        try:
            for i in range(self.layers):  # the packed weights where the product pays for them
                pps[i] = NULL
                if self.trans[i] or max(m, PACKED_ROWS_FLOOR) * self.ns[i] * self.ks[i] >= PACKED_MIN_MADDS:
                    pps[i] = fptr(self.packer(self.weights[i]), "dense chain packed weights")
            between = None
            if self.layers > 1:  # layer i < last writes half (i % 2) (one half for two layers)
                between = np.empty((2 if self.layers > 2 else 1) * m * self.widest, np.float32)
                buf = <float *>cnp.PyArray_DATA(<cnp.ndarray>between)
            for i in range(nd - 1):
                dims[i] = xa.shape[i]
            dims[nd - 1] = self.ns[last]
            out = cnp.PyArray_EMPTY(nd, dims, cnp.NPY_FLOAT32, 0)
            outp = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
            with nogil:
                for i in range(self.layers):
                    dst = outp if i == last else buf + (i % 2) * m * self.widest
                    st = fl_matmul(m, self.ns[i], self.ks[i], src, self.ks[i], self.wps[i],
                                   self.ns[i] if pps[i] == NULL else 0, 0, pps[i], self.bps[i],
                                   self.codes[i], self.alphas[i], dst, self.ns[i])
                    if st != 0:
                        break
                    src = dst
        finally:
            PyMem_Free(pps)
        check(st, "dense chain")
        return out
