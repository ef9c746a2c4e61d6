# Integer matrix products (qgemm.h).

from libc.stdint cimport int8_t, int32_t, uintptr_t

cdef extern from "dispatch.h" nogil:
    int64_t fl_qpacked_count(int64_t k, int64_t n)
    int fl_qpack(const void *b, int b_signed, int64_t ldb, int64_t k, int64_t n, const int32_t *zb,
                 int8_t *pb)
    ctypedef struct fl_qout:
        int kind
        const float *scale
        const float *bias
        const int32_t *ibias
        int32_t zero_point
    int fl_qgemm(int64_t m, int64_t n, int64_t k, const void *a, int a_signed, int64_t lda,
                 const int32_t *za, const int8_t *pb, const fl_qout *out, void *c, int64_t ldc)
    ctypedef struct fl_qconv_geom:
        int64_t n, h, w
        int64_t xs[4]
        int64_t c0, cin, kh, kw, sh, sw, dh, dw, top, left, oh, ow
    int fl_qconv(const fl_qconv_geom *g, const void *x, int x_signed, int32_t x_zp, int64_t n,
                 const int8_t *pb, const fl_qout *out, void *c, int64_t ldc)


cdef int _int8_operand(cnp.ndarray x, str what) except -1:
    """1 for an int8 ``x``, 0 for uint8: 2-D with a contiguous last axis (any row stride)."""
    if cnp.PyArray_TYPE(x) != cnp.NPY_INT8 and cnp.PyArray_TYPE(x) != cnp.NPY_UINT8:
        raise TypeError(f"{what}: expected uint8 or int8, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array, got {x.ndim}-D")
    if x.shape[1] > 1 and x.strides[1] != 1:
        raise ValueError(f"{what}: the last axis must be contiguous")
    return cnp.PyArray_TYPE(x) == cnp.NPY_INT8


cdef int32_t *_int32_vector(cnp.ndarray v, int64_t size, str what) except NULL:
    if cnp.PyArray_TYPE(v) != cnp.NPY_INT32 or v.ndim != 1 or v.shape[0] != size \
            or not cnp.PyArray_IS_C_CONTIGUOUS(v):
        raise ValueError(f"{what}: expected a contiguous int32 vector of {size} values")
    return <int32_t *>cnp.PyArray_DATA(v)


cdef float *_f32_block(object a, tuple shape, str what) except? NULL:
    """The data of a C-contiguous float32 array of ``shape`` (None gives NULL)."""
    if a is None:
        return NULL
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) \
            or (<object>arr).shape != shape:
        raise ValueError(f"{what}: expected a C-contiguous float32 array of shape {shape}, got "
                         f"{arr.dtype} {(<object>arr).shape}")
    return <float *>cnp.PyArray_DATA(arr)


cdef int _check_packed(cnp.ndarray pb, int64_t k, int64_t n, str what) except -1:
    """ValueError unless ``pb`` is a (k, n) operand packed by ``qpack``: int8, C-contiguous, of
    the packed size, its data 4-byte aligned (it ends with int32 columns)."""
    if cnp.PyArray_TYPE(pb) != cnp.NPY_INT8 or pb.ndim != 1 or pb.shape[0] != fl_qpacked_count(k, n) \
            or not cnp.PyArray_IS_C_CONTIGUOUS(pb) or <uintptr_t>cnp.PyArray_DATA(pb) % 4:
        raise ValueError(f"{what} is not a ({k}, {n}) operand packed by qpack")
    return 0


def qpack(cnp.ndarray b, cnp.ndarray zb):
    """``b`` (k, n) uint8 or int8 less ``zb`` (n,) int32 (its zero point per column), packed for
    ``qgemm`` (a new 1-D int8 array, see qgemm.h)."""
    cdef int b_signed = _int8_operand(b, "qpack b")
    cdef int64_t k = b.shape[0], n = b.shape[1]
    cdef int64_t ldb = b.strides[0] if k > 1 else n
    cdef const int32_t *zp = _int32_vector(zb, n, "qpack zb")
    out = np.empty(fl_qpacked_count(k, n), np.int8)
    cdef int8_t *pb = <int8_t *>cnp.PyArray_DATA(out)
    cdef const void *bp = cnp.PyArray_DATA(b)
    if k > 0 and n > 0:
        with nogil:
            fl_qpack(bp, b_signed, ldb, k, n, zp, pb)
    return out


cdef int64_t _qout_of(cnp.ndarray c, int64_t m, object scale, object bias, object ibias, int zero_point,
                      fl_qout *out, str what) except -1:
    """Fills ``out`` with what an integer product of m rows stores into ``c`` (see ``qgemm``);
    returns c's row stride in elements."""
    cdef int ctype = cnp.PyArray_TYPE(c)
    out.kind = 0 if ctype == cnp.NPY_INT32 else 1 if ctype == cnp.NPY_FLOAT32 else \
        2 if ctype == cnp.NPY_UINT8 else 3 if ctype == cnp.NPY_INT8 else -1
    if out.kind < 0 or (out.kind == 0) != (scale is None):
        raise ValueError(f"{what}: c must be int32 without a scale, float32, uint8 or int8 with one "
                         f"(got {c.dtype}, scale {'given' if scale is not None else 'None'})")
    cdef int64_t esize = c.itemsize
    if c.ndim != 2 or c.shape[0] != m or (c.shape[1] > 1 and c.strides[1] != esize) \
            or (m > 1 and (c.strides[0] % esize or c.strides[0] < c.shape[1] * esize)) \
            or not cnp.PyArray_ISWRITEABLE(c):
        raise ValueError(f"{what}: c must be a writeable {c.dtype} array of {m} rows with contiguous rows")
    cdef int64_t n = c.shape[1]
    if bias is not None and out.kind != 1:
        raise ValueError(f"{what}: a bias needs a scale and a float32 c")
    if ibias is not None and out.kind == 0:
        raise ValueError(f"{what}: an int32 bias needs a scale (a float32, uint8 or int8 c)")
    if out.kind >= 2 and not (-128 <= zero_point <= 255):
        raise ValueError(f"{what}: zero point {zero_point} out of the 8-bit range")
    out.scale = _f32_block(scale, (n,), "scale")
    out.bias = _f32_block(bias, (n,), "bias")
    out.ibias = NULL if ibias is None else _int32_vector(ibias, n, f"{what} ibias")
    out.zero_point = zero_point
    return c.strides[0] // esize if m > 1 else n


def qgemm(cnp.ndarray a, cnp.ndarray za, cnp.ndarray pb, cnp.ndarray c, object scale=None,
          object bias=None, object ibias=None, int zero_point=0):
    """c (m, n) = (a - za) @ (b - zb) summed exactly, on the pool's threads: ``a`` (m, k) uint8 or
    int8 with a contiguous last axis, ``za`` (m,) int32 its zero point per row, ``pb`` b (k, n)
    less its zero points packed by ``qpack``; ``c`` 2-D with contiguous rows (any row stride):
    int32 (the sums); float32 with ``scale`` (n,) float32: float(sum + ``ibias``) * scale (+
    ``bias`` (n,) float32); uint8 or int8 with ``scale``: saturate(rint(float(sum + ``ibias``) *
    scale) + ``zero_point``) (onnxruntime's requantization); ``ibias`` (n,) int32 or None, added
    with wrap-around. Returns ``c``."""
    cdef int a_signed = _int8_operand(a, "qgemm a")
    cdef int64_t m = a.shape[0], k = a.shape[1]
    cdef fl_qout out
    cdef int64_t ldc = _qout_of(c, m, scale, bias, ibias, zero_point, &out, "qgemm")
    cdef int64_t n = c.shape[1]
    _check_packed(pb, k, n, "qgemm: pb")
    cdef const int32_t *zp = _int32_vector(za, m, "qgemm za")
    cdef int64_t lda = a.strides[0] if m > 1 else k
    cdef const void *ap = cnp.PyArray_DATA(a)
    cdef const int8_t *pp = <const int8_t *>cnp.PyArray_DATA(pb)
    cdef void *cp = cnp.PyArray_DATA(c)
    cdef int st
    with nogil:
        st = fl_qgemm(m, n, k, ap, a_signed, lda, zp, pp, &out, cp, ldc)
    check(st, "qgemm")
    return c


def qconv(cnp.ndarray x, int x_zp, cnp.ndarray pb, cnp.ndarray c, tuple kernel, tuple strides,
          tuple dilations, tuple pads, tuple out_hw, int c0=0, object cin=None, object scale=None,
          object bias=None, object ibias=None, int zero_point=0):
    """The integer convolution of (x - x_zp) by b (kh kw cin, n) less its zero points, packed by
    ``qpack``, on the pool's threads, the windows gathered straight into the product's rows:
    ``x`` (n_img, h, w, channels) uint8 or int8 indexed channels last, any strides (an NCHW
    array's ``transpose(0, 2, 3, 1)``); the group's ``cin`` channels from ``c0`` (default all);
    ``kernel`` (kh, kw), ``strides``, ``dilations``, ``pads`` (top, left) (any window position
    outside x, padding, reads as ``x_zp``) and ``out_hw`` (oh, ow); ``c`` (n_img oh ow, n) and the other arguments as for
    ``qgemm``. Returns ``c``."""
    if cnp.PyArray_TYPE(x) != cnp.NPY_INT8 and cnp.PyArray_TYPE(x) != cnp.NPY_UINT8:
        raise TypeError(f"qconv x: expected uint8 or int8, got {x.dtype}")
    if x.ndim != 4:
        raise ValueError(f"qconv x: expected a 4-D array (n, h, w, c), got {x.ndim}-D")
    cdef int x_signed = cnp.PyArray_TYPE(x) == cnp.NPY_INT8
    if not (-128 <= x_zp <= 255):
        raise ValueError(f"qconv: x zero point {x_zp} out of the 8-bit range")
    cdef fl_qconv_geom g
    g.n, g.h, g.w = x.shape[0], x.shape[1], x.shape[2]
    for i in range(4):
        g.xs[i] = x.strides[i]
    g.c0 = c0
    g.cin = x.shape[3] - c0 if cin is None else cin
    if g.c0 < 0 or g.cin < 1 or g.c0 + g.cin > x.shape[3]:
        raise ValueError(f"qconv: channels {c0}:{c0}+{cin} of {x.shape[3]}")
    g.kh, g.kw = kernel
    g.sh, g.sw = strides
    g.dh, g.dw = dilations
    g.top, g.left = pads
    g.oh, g.ow = out_hw
    if min(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) < 1 or min(g.oh, g.ow) < 0:
        raise ValueError(f"qconv: kernel {kernel}, strides {strides} and dilations {dilations} must be "
                         f"positive and the output {out_hw} non-negative")
    cdef int64_t m = g.n * g.oh * g.ow, k = g.kh * g.kw * g.cin
    cdef fl_qout out
    cdef int64_t ldc = _qout_of(c, m, scale, bias, ibias, zero_point, &out, "qconv")
    cdef int64_t n = c.shape[1]
    _check_packed(pb, k, n, "qconv: pb")
    cdef const void *xp = cnp.PyArray_DATA(x)
    cdef const int8_t *pp = <const int8_t *>cnp.PyArray_DATA(pb)
    cdef void *cp = cnp.PyArray_DATA(c)
    cdef int st
    with nogil:
        st = fl_qconv(&g, xp, x_signed, x_zp, n, pp, &out, cp, ldc)
    check(st, "qconv")
    return c
