# Pooling, resizing, local response normalization and the NHWC pad (pool.h).

cdef extern from "dispatch.h" nogil:
    int fl_pool2d(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int is_max,
                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                  int64_t pt, int64_t pl, int64_t h_end, int64_t w_end, int count_include_pad,
                  int64_t ho, int64_t wo, float *y)
    int fl_bin_pool(int64_t k, int64_t ph, int64_t pw, int64_t h, int64_t w, int64_t c,
                    const float *x, const int64_t *batch, const int64_t *h0, const int64_t *h1,
                    const int64_t *w0, const int64_t *w1, int shared, int is_max, float *y)
    int fl_resize(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t ho,
                  int64_t wo, const int64_t *y0, const int64_t *y1, const float *fy,
                  const int64_t *x0, const int64_t *x1, const float *fx, int bilinear, float *y)
    int fl_lrn(int64_t m, int64_t c, const float *x, int64_t size, float alpha, float beta,
               float k, float *y)
    int fl_pad_nhwc(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t pt,
                    int64_t pl, int64_t hp, int64_t wp, float *y)
    int fl_pool2d_nchw(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int is_max,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                       int64_t pt, int64_t pl, int64_t h_end, int64_t w_end,
                       int count_include_pad, int64_t ho, int64_t wo, float *y)


cdef inline float *cptr(cnp.ndarray a, int ndim, str what) except NULL:
    """The data of ``a``: a C-contiguous, aligned float32 array of ``ndim`` axes."""
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or a.ndim != ndim or \
            not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISALIGNED(a):
        raise ValueError(f"{what}: expected a C-contiguous, aligned float32 array of {ndim} axes, "
                         f"got {a.dtype} {(<object>a).shape}")
    return <float *>cnp.PyArray_DATA(a)


cdef inline int64_t *iptr(cnp.ndarray a, int64_t size, str what) except NULL:
    """The data of ``a``: a C-contiguous int64 array of ``size`` values."""
    if cnp.PyArray_TYPE(a) != cnp.NPY_INT64 or not cnp.PyArray_IS_C_CONTIGUOUS(a) or \
            a.size != size:
        raise ValueError(f"{what}: expected {size} C-contiguous int64 values, got {a.dtype} "
                         f"{(<object>a).shape}")
    return <int64_t *>cnp.PyArray_DATA(a)


cdef inline float *vptr(object a, int64_t size, str what) except? NULL:
    """The data of ``a`` (None gives NULL): ``size`` C-contiguous float32 values."""
    if a is None:
        return NULL
    cdef cnp.ndarray arr = a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or \
            arr.size != size:
        raise ValueError(f"{what}: expected {size} C-contiguous float32 values, got "
                         f"{arr.dtype} {(<object>arr).shape}")
    return <float *>cnp.PyArray_DATA(arr)


def pool2d(cnp.ndarray x, cnp.ndarray y, bint is_max, int64_t kh, int64_t kw, int64_t sh,
           int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t h_end,
           int64_t w_end, bint count_include_pad):
    """y[n, oh, ow, c] = max or mean of x[n, oh sh - pt + i dh, ow sw - pl + j dw, c] over
    i < kh, j < kw: max skips cells outside x (NaN wins), mean divides by the cells inside x or,
    with ``count_include_pad``, inside [-pt, h_end) x [-pl, w_end). x (N, H, W, C), y
    (N, Ho, Wo, C)."""
    cdef float *xp = cptr(x, 4, "pool2d x")
    cdef float *yp = cptr(y, 4, "pool2d y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef int64_t ho = y.shape[1], wo = y.shape[2]
    if y.shape[0] != n or y.shape[3] != c or min(kh, kw, sh, sw, dh, dw) < 1:
        raise ValueError("pool2d: y must be (N, Ho, Wo, C) of x, window and steps positive")
    cdef int st
    with nogil:
        st = fl_pool2d(n, h, w, c, xp, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end,
                       count_include_pad, ho, wo, yp)
    check(st, "pool2d")
    return y


def pool2d_nchw(cnp.ndarray x, cnp.ndarray y, bint is_max, int64_t kh, int64_t kw, int64_t sh,
                int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t h_end,
                int64_t w_end, bint count_include_pad):
    """``pool2d`` on NCHW planes: y[n, c, oh, ow] = max or mean of x[n, c, oh sh - pt + i dh,
    ow sw - pl + j dw] over i < kh, j < kw, x (N, C, H, W), y (N, C, Ho, Wo)."""
    cdef float *xp = cptr(x, 4, "pool2d_nchw x")
    cdef float *yp = cptr(y, 4, "pool2d_nchw y")
    cdef int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3]
    cdef int64_t ho = y.shape[2], wo = y.shape[3]
    if y.shape[0] != n or y.shape[1] != c or min(kh, kw, sh, sw, dh, dw) < 1 or pt < 0 or pl < 0:
        raise ValueError("pool2d_nchw: y must be (N, C, Ho, Wo) of x, window and steps positive")
    cdef int st
    with nogil:
        st = fl_pool2d_nchw(n, c, h, w, xp, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end,
                            count_include_pad, ho, wo, yp)
    check(st, "pool2d_nchw")
    return y


def bin_pool(cnp.ndarray x, object batch, cnp.ndarray h0, cnp.ndarray h1, cnp.ndarray w0,
             cnp.ndarray w1, bint is_max, cnp.ndarray y):
    """y[k, p, q, c] = max or mean of x[batch[k], h0[k, p]:h1[k, p], w0[k, q]:w1[k, q], c] (an
    empty bin gives 0; NaN wins the max): x (N, H, W, C), y (K, P, Q, C), the bins int64 and
    C-contiguous inside x. ``batch`` None: image k and the same bins h0, h1 (P,), w0, w1 (Q,)
    for every k (adaptive pooling); else K image indices and the bins (K, P), (K, Q) of each
    region (RoI pooling)."""
    cdef float *xp = cptr(x, 4, "bin_pool x")
    cdef float *yp = cptr(y, 4, "bin_pool y")
    cdef int64_t k = y.shape[0], ph = y.shape[1], pw = y.shape[2], c = x.shape[3]
    cdef int64_t h = x.shape[1], w = x.shape[2]
    cdef bint shared = batch is None
    if y.shape[3] != c or (shared and k != x.shape[0]):
        raise ValueError("bin_pool: y must have x's channels (and images, without a batch)")
    cdef int64_t *bp = NULL if shared else iptr(batch, k, "bin_pool batch")
    cdef int64_t kb = 1 if shared else k
    cdef int64_t *h0p = iptr(h0, kb * ph, "bin_pool h0")
    cdef int64_t *h1p = iptr(h1, kb * ph, "bin_pool h1")
    cdef int64_t *w0p = iptr(w0, kb * pw, "bin_pool w0")
    cdef int64_t *w1p = iptr(w1, kb * pw, "bin_pool w1")
    cdef int64_t i
    if not shared:
        for i in range(k):
            if bp[i] < 0 or bp[i] >= x.shape[0]:
                raise IndexError(f"bin_pool: batch index {bp[i]} out of range for {x.shape[0]} "
                                 "images")
    for i in range(kb * ph):
        if h0p[i] < 0 or h1p[i] > h:
            raise IndexError("bin_pool: a bin's rows lie outside x")
    for i in range(kb * pw):
        if w0p[i] < 0 or w1p[i] > w:
            raise IndexError("bin_pool: a bin's columns lie outside x")
    cdef int st
    with nogil:
        st = fl_bin_pool(k, ph, pw, h, w, c, xp, bp, h0p, h1p, w0p, w1p, shared, is_max, yp)
    check(st, "bin_pool")
    return y


def resize(cnp.ndarray x, cnp.ndarray y0, cnp.ndarray y1, cnp.ndarray fy, cnp.ndarray x0,
           cnp.ndarray x1, cnp.ndarray fx, bint bilinear, cnp.ndarray y):
    """Nearest (y[n, i, j] = x[n, y0[i], x0[j]]) or bilinear (weights fy, fx of rows y1 and
    columns x1) resize of x (N, H, W, C) into y (N, Ho, Wo, C); indices int64 inside x."""
    cdef float *xp = cptr(x, 4, "resize x")
    cdef float *yp = cptr(y, 4, "resize y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef int64_t ho = y.shape[1], wo = y.shape[2]
    if y.shape[0] != n or y.shape[3] != c:
        raise ValueError("resize: y must be (N, Ho, Wo, C) of x")
    cdef int64_t *y0p = iptr(y0, ho, "resize y0")
    cdef int64_t *y1p = iptr(y1, ho, "resize y1")
    cdef int64_t *x0p = iptr(x0, wo, "resize x0")
    cdef int64_t *x1p = iptr(x1, wo, "resize x1")
    cdef float *fyp = vptr(fy, ho, "resize fy")
    cdef float *fxp = vptr(fx, wo, "resize fx")
    if bilinear and (fyp == NULL or fxp == NULL):
        raise ValueError("resize: bilinear needs the weights fy and fx")
    cdef int64_t i
    for i in range(ho):
        if y0p[i] < 0 or y0p[i] >= h or y1p[i] < 0 or y1p[i] >= h:
            raise IndexError("resize: a source row lies outside x")
    for i in range(wo):
        if x0p[i] < 0 or x0p[i] >= w or x1p[i] < 0 or x1p[i] >= w:
            raise IndexError("resize: a source column lies outside x")
    cdef int st
    with nogil:
        st = fl_resize(n, h, w, c, xp, ho, wo, y0p, y1p, fyp, x0p, x1p, fxp, bilinear, yp)
    check(st, "resize")
    return y


def lrn(cnp.ndarray x, int64_t size, float alpha, float beta, float k, cnp.ndarray y):
    """y[r, c] = x[r, c] / (k + alpha / size sum of x[r, c']^2 over c' in [c - size // 2,
    c + (size - 1) // 2])^beta over the rows of x and y (M, C)."""
    cdef float *xp = cptr(x, 2, "lrn x")
    cdef float *yp = cptr(y, 2, "lrn y")
    if y.shape[0] != x.shape[0] or y.shape[1] != x.shape[1] or size < 1:
        raise ValueError("lrn: y must have x's shape and size be positive")
    cdef int64_t m = x.shape[0], c = x.shape[1]
    cdef int st
    with nogil:
        st = fl_lrn(m, c, xp, size, alpha, beta, k, yp)
    check(st, "lrn")
    return y


def pad_nhwc(cnp.ndarray x, int64_t pt, int64_t pl, cnp.ndarray y):
    """y (N, Hp, Wp, C) = x (N, H, W, C) at [pt:pt + H, pl:pl + W] (cut to y), zeros
    elsewhere."""
    cdef float *xp = cptr(x, 4, "pad_nhwc x")
    cdef float *yp = cptr(y, 4, "pad_nhwc y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    if y.shape[0] != n or y.shape[3] != c or pt < 0 or pl < 0 or pl > y.shape[2]:
        raise ValueError("pad_nhwc: y must be (N, Hp, Wp, C) of x, pads non-negative")
    cdef int st
    with nogil:
        st = fl_pad_nhwc(n, h, w, c, xp, pt, pl, y.shape[1], y.shape[2], yp)
    check(st, "pad_nhwc")
    return y
