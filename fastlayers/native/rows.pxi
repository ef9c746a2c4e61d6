# Row kernels (rows.h).

cdef extern from "rows.h" nogil:
    enum:
        FL_SOFTMAX
        FL_LOG_SOFTMAX

cdef extern from "dispatch.h" nogil:
    int fl_bias_act(int64_t m, int64_t n, const float *x, int64_t ldx, const float *bias,
                    int code, float alpha, float *out, int64_t ldo)
    int fl_layer_norm(int64_t m, int64_t n, const float *x, const float *gamma,
                      const float *beta, float eps, int rms, float *out)
    int fl_scale_shift(int64_t m, int64_t n, const float *x, const float *scale,
                       const float *shift, float *out)
    int fl_scale_shift_planes(int64_t planes, int64_t channels, int64_t plane, const float *x,
                              const float *scale, const float *shift, float *out)
    int fl_add_act(int64_t n, const float *a, const float *b, int code, float alpha, float *out)
    int fl_outer_add_act(int64_t ni, int64_t nj, int64_t n, const float *a, const float *b, int code,
                         float alpha, float *out)

#: Activation names in the order of their codes (rows.h).
ACTIVATIONS = ("linear", "relu", "relu6", "leaky_relu", "hard_sigmoid", "softsign", "sigmoid",
               "silu", "gelu", "gelu_tanh", "exponential", "softmax", "log_softmax", "tanh",
               "hard_silu", "onnx_sigmoid", "onnx_silu", "onnx_tanh")


def bias_act(cnp.ndarray x, object bias, int code, float alpha, cnp.ndarray out):
    """out = f(x + bias) over the rows of 2-D ``x`` and ``out`` (out may be x; rows any
    stride), f the activation ``code``; softmax codes normalize each row."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "bias_act x")
    cdef float *op = fptr(out, "bias_act out")
    cdef float *bp = optf(bias, "bias_act bias")
    cdef int64_t ldx = ld(x), ldo = ld(out)
    cdef int st
    with nogil:
        st = fl_bias_act(m, n, xp, ldx, bp, code, alpha, op, ldo)
    check(st, "bias_act")
    return out


def layer_norm(cnp.ndarray x, object gamma, object beta, float eps, bint rms, cnp.ndarray out):
    """out[i] = gamma (x[i] - mean) / sqrt(var + eps) + beta (rms: gamma x[i] / rms(x[i]))
    over C-contiguous rows (out may be x)."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "layer_norm x")
    cdef float *op = fptr(out, "layer_norm out")
    cdef float *gp = optf(gamma, "layer_norm gamma")
    cdef float *bp = optf(beta, "layer_norm beta")
    cdef int st
    with nogil:
        st = fl_layer_norm(m, n, xp, gp, bp, eps, rms, op)
    check(st, "layer_norm")
    return out


def scale_shift(cnp.ndarray x, cnp.ndarray scale, cnp.ndarray shift, cnp.ndarray out):
    """out[i, c] = x[i, c] scale[c] + shift[c] over C-contiguous rows."""
    cdef int64_t m = x.shape[0], n = x.shape[1]
    cdef float *xp = fptr(x, "scale_shift x")
    cdef float *op = fptr(out, "scale_shift out")
    cdef float *sp = fptr(scale, "scale_shift scale")
    cdef float *hp = fptr(shift, "scale_shift shift")
    cdef int st
    with nogil:
        st = fl_scale_shift(m, n, xp, sp, hp, op)
    check(st, "scale_shift")
    return out


def scale_shift_planes(cnp.ndarray x, cnp.ndarray scale, cnp.ndarray shift, cnp.ndarray out,
                       int64_t channels, int64_t plane):
    """out = x scale[c] + shift[c] over planes of ``plane`` values, plane p of channel p %
    ``channels`` (x and out C-contiguous of the same size, out may be x; scale and shift of
    ``channels`` values)."""
    if not (cnp.PyArray_IS_C_CONTIGUOUS(x) and cnp.PyArray_IS_C_CONTIGUOUS(out)) or out.size != x.size:
        raise ValueError("scale_shift_planes: x and out must be C-contiguous of one size")
    if channels <= 0 or plane <= 0 or x.size % (channels * plane) or scale.size != channels or shift.size != channels:
        raise ValueError("scale_shift_planes: the planes do not divide x, or scale / shift not one per channel")
    cdef int64_t planes = x.size // plane
    cdef float *xp = fptr(x, "scale_shift_planes x")
    cdef float *op = fptr(out, "scale_shift_planes out")
    cdef float *sp = fptr(scale, "scale_shift_planes scale")
    cdef float *hp = fptr(shift, "scale_shift_planes shift")
    cdef int st
    with nogil:
        st = fl_scale_shift_planes(planes, channels, plane, xp, sp, hp, op)
    check(st, "scale_shift_planes")
    return out


# The row operations of whole layers: one native call that checks, allocates and runs, for
# the per-call cost of small models. Each returns None when its arguments are not in its terms
# (the caller then takes its general path).

cdef inline bint c_float32(object x):
    """Whether ``x`` is an aligned C-contiguous float32 ndarray of rank >= 1 with elements."""
    if type(x) is not np.ndarray:
        return False
    cdef cnp.ndarray a = <cnp.ndarray>x
    return (a.ndim >= 1 and a.size > 0 and cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32
            and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISALIGNED(a))


cdef inline bint vector_of(object v, int64_t n, float **p):
    """Whether ``v`` is None (``*p`` NULL) or a contiguous float32 vector of ``n`` (``*p`` its data)."""
    if v is None:
        p[0] = NULL
        return True
    if not c_float32(v) or (<cnp.ndarray>v).ndim != 1 or (<cnp.ndarray>v).shape[0] != n:
        return False
    p[0] = <float *>cnp.PyArray_DATA(<cnp.ndarray>v)
    return True


# Values per row of apply_activation's elementwise pass (16 KiB: enough rows to share).
cdef enum:
    ACT_ROW = 4096


def apply_activation(object x, int code, float alpha):
    """f(x) over the last axis of C-contiguous float32 ``x`` (a new array; softmax codes
    normalize each row), or None. An elementwise code runs over the memory as rows of
    ``ACT_ROW`` values (and one shorter row), whatever the last axis: a narrow last axis
    would cost a row's setup per few values."""
    if not c_float32(x):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int64_t size = cnp.PyArray_SIZE(xa), n = xa.shape[xa.ndim - 1] if xa.ndim else 1
    cdef int64_t m = size // n if n else 0, done = 0
    out = cnp.PyArray_EMPTY(xa.ndim, xa.shape, cnp.NPY_FLOAT32, 0)
    if size == 0:
        return out
    cdef float *xp = <float *>cnp.PyArray_DATA(xa)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st = 0
    with nogil:
        if code == FL_SOFTMAX or code == FL_LOG_SOFTMAX:
            st = fl_bias_act(m, n, xp, n, NULL, code, alpha, op, n)
        else:
            n = min(size, <int64_t>ACT_ROW)
            m = size // n
            st = fl_bias_act(m, n, xp, n, NULL, code, alpha, op, n)
            done = m * n
            if st == 0 and done < size:
                st = fl_bias_act(1, size - done, xp + done, size - done, NULL, code, alpha,
                                 op + done, size - done)
    check(st, "activation")
    return out


def apply_layer_norm(object x, object gamma, object beta, float eps, bint rms):
    """``layer_norm`` over the last axis of C-contiguous float32 ``x`` (a new array; gamma and
    beta vectors of its width or None), or None."""
    if not c_float32(x):
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int64_t n = xa.shape[xa.ndim - 1], m = xa.size // n
    cdef float *gp = NULL
    cdef float *bp = NULL
    if not (vector_of(gamma, n, &gp) and vector_of(beta, n, &bp)):
        return None
    out = cnp.PyArray_EMPTY(xa.ndim, xa.shape, cnp.NPY_FLOAT32, 0)
    cdef float *xp = <float *>cnp.PyArray_DATA(xa)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = fl_layer_norm(m, n, xp, gp, bp, eps, rms, op)
    check(st, "layer_norm")
    return out


def apply_scale_shift(object x, object scale, object shift):
    """x scale + shift per channel of the last axis of C-contiguous float32 ``x`` (a new
    array; scale and shift vectors of its width), or None."""
    if not c_float32(x) or scale is None or shift is None:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int64_t n = xa.shape[xa.ndim - 1], m = xa.size // n
    cdef float *sp = NULL
    cdef float *hp = NULL
    if not (vector_of(scale, n, &sp) and vector_of(shift, n, &hp)):
        return None
    out = cnp.PyArray_EMPTY(xa.ndim, xa.shape, cnp.NPY_FLOAT32, 0)
    cdef float *xp = <float *>cnp.PyArray_DATA(xa)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = fl_scale_shift(m, n, xp, sp, hp, op)
    check(st, "scale_shift")
    return out


def apply_add(object a, object b):
    """a + b for C-contiguous float32 ``a`` and ``b`` of the same shape, or ``b`` a vector of
    the width of a's last axis (added to each row): a new array, or None."""
    if not (c_float32(a) and c_float32(b)):
        return None
    cdef cnp.ndarray aa = <cnp.ndarray>a
    cdef cnp.ndarray ba = <cnp.ndarray>b
    cdef int64_t n, m
    if cnp.PyArray_SAMESHAPE(aa, ba):
        m, n = 1, aa.size
    elif ba.ndim == 1 and ba.shape[0] == aa.shape[aa.ndim - 1]:
        n = ba.shape[0]
        m = aa.size // n
    else:
        return None
    out = cnp.PyArray_EMPTY(aa.ndim, aa.shape, cnp.NPY_FLOAT32, 0)
    cdef float *ap = <float *>cnp.PyArray_DATA(aa)
    cdef float *bp = <float *>cnp.PyArray_DATA(ba)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = fl_bias_act(m, n, ap, n, bp, 0, 0.0, op, n)
    check(st, "add")
    return out


def outer_add_act(object a, object b, int code, float alpha):
    """f(a[i] + b[j]) (ni, nj, n) for C-contiguous float32 ``a`` (ni, n) and ``b`` (nj, n), f an
    elementwise activation ``code`` (a new array), or None for other operands."""
    if not c_float32(a) or not c_float32(b) or (<cnp.ndarray>a).ndim != 2 or (<cnp.ndarray>b).ndim != 2 \
            or (<object>a).shape[1] != (<object>b).shape[1]:
        return None
    cdef cnp.ndarray aa = <cnp.ndarray>a, ba = <cnp.ndarray>b
    cdef int64_t ni = aa.shape[0], nj = ba.shape[0], n = aa.shape[1]
    out = np.empty((ni, nj, n), np.float32)
    cdef const float *ap = <float *>cnp.PyArray_DATA(aa)
    cdef const float *bp = <float *>cnp.PyArray_DATA(ba)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int st
    with nogil:
        st = fl_outer_add_act(ni, nj, n, ap, bp, code, alpha, op)
    check(st, "outer_add_act")
    return out


def add_act(object a, object b, int code, float alpha):
    """f(a + b) for C-contiguous float32 ``a`` and ``b`` of one shape, f an elementwise
    activation ``code`` (a new array), or None for other operands."""
    if not c_float32(a) or not c_float32(b) or (<cnp.ndarray>a).ndim != (<cnp.ndarray>b).ndim \
            or (<object>a).shape != (<object>b).shape:
        return None
    cdef cnp.ndarray aa = <cnp.ndarray>a, ba = <cnp.ndarray>b
    out = cnp.PyArray_EMPTY(aa.ndim, aa.shape, cnp.NPY_FLOAT32, 0)
    cdef const float *ap = <float *>cnp.PyArray_DATA(aa)
    cdef const float *bp = <float *>cnp.PyArray_DATA(ba)
    cdef float *op = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int64_t n = aa.size
    cdef int st
    with nogil:
        st = fl_add_act(n, ap, bp, code, alpha, op)
    check(st, "add_act")
    return out
