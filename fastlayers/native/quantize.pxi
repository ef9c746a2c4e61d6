# Elementwise quantization (quantize.h).

cdef extern from "dispatch.h" nogil:
    int fl_quantize(int64_t count, const float *x, float scale, float zero_point, float lo, float hi,
                    void *q, int q_signed)
    int fl_fake_quantize(int64_t count, const float *x, float scale, float zero_point, float lo,
                         float hi, float *y)
    int fl_min_max(int64_t count, const float *x, float *out)


cdef const float *_f32_contiguous(cnp.ndarray x, str what) except NULL:
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(x):
        raise ValueError(f"{what}: expected a C-contiguous float32 array, got {x.dtype}")
    return <const float *>cnp.PyArray_DATA(x)


def quantize(cnp.ndarray x, float scale, float zero_point, object dtype):
    """clamp(round_half_even(x / scale) + zero_point) as a new uint8 or int8 (``dtype``) array
    of x's shape, ``x`` C-contiguous float32."""
    cdef const float *xp = _f32_contiguous(x, "quantize")
    out = np.empty((<object>x).shape, dtype)
    cdef cnp.ndarray o = <cnp.ndarray>out
    cdef int q_signed
    if cnp.PyArray_TYPE(o) == cnp.NPY_INT8:
        q_signed = 1
    elif cnp.PyArray_TYPE(o) == cnp.NPY_UINT8:
        q_signed = 0
    else:
        raise TypeError(f"quantize: dtype must be uint8 or int8, got {out.dtype}")
    cdef float lo = -128.0 if q_signed else 0.0, hi = 127.0 if q_signed else 255.0
    cdef int64_t count = x.size
    cdef void *op = cnp.PyArray_DATA(o)
    with nogil:
        fl_quantize(count, xp, scale, zero_point, lo, hi, op, q_signed)
    return out


def fake_quantize(cnp.ndarray x, float scale, float zero_point, float lo, float hi):
    """(clamp(round_half_even(x / scale) + zero_point, lo, hi) - zero_point) * scale as a new
    float32 array of x's shape, ``x`` C-contiguous float32."""
    cdef const float *xp = _f32_contiguous(x, "fake_quantize")
    out = np.empty((<object>x).shape, np.float32)
    cdef float *yp = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef int64_t count = x.size
    with nogil:
        fl_fake_quantize(count, xp, scale, zero_point, lo, hi, yp)
    return out


cdef extern from "math.h" nogil:
    float nearbyintf(float v)


cdef float _dynamic_range(int64_t count, const float *xp, float *zero_point) noexcept nogil:
    """DynamicQuantizeLinear's scale of count values at xp (returned) and zero point
    (``*zero_point``), in float32 as onnxruntime computes them: the range [min(x, 0), max(x, 0)]
    mapped onto [0, 255], scale (max - min) / 255 (1 where the range is empty), zero point
    round_half_even(clamp(0 - min / scale, 0, 255)) (0 for a NaN range)."""
    cdef float mm[2]
    mm[0] = 0
    mm[1] = 0
    if count:
        fl_min_max(count, xp, mm)
    cdef float scale = <float>1.0 if mm[1] == mm[0] else (mm[1] - mm[0]) / <float>255.0
    cdef float v = <float>0.0 - mm[0] / scale
    if not v >= 0:
        v = 0
    elif v > 255:
        v = 255
    zero_point[0] = nearbyintf(v)
    return scale


def dynamic_quantize(cnp.ndarray x):
    """DynamicQuantizeLinear of a C-contiguous float32 array, as onnxruntime computes it:
    (x as uint8 of x's shape, scale, zero point), the range [min(x, 0), max(x, 0)] mapped onto
    [0, 255] (``_dynamic_range``)."""
    cdef const float *xp = _f32_contiguous(x, "dynamic_quantize")
    cdef float scale, v
    cdef int64_t count = x.size
    out = np.empty((<object>x).shape, np.uint8)
    cdef void *op = cnp.PyArray_DATA(<cnp.ndarray>out)
    with nogil:
        scale = _dynamic_range(count, xp, &v)
        fl_quantize(count, xp, scale, v, 0, 255, op, 0)
    return out, np.float32(scale), np.uint8(<int>v)


def min_max(cnp.ndarray x):
    """(min(x, 0), max(x, 0)) of a C-contiguous float32 array, as float32 scalars."""
    cdef const float *xp = _f32_contiguous(x, "min_max")
    cdef float out[2]
    cdef int64_t count = x.size
    with nogil:
        fl_min_max(count, xp, out)
    return np.float32(out[0]), np.float32(out[1])


from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc


cdef int _dynamic_product(const float *xp, int64_t m, int64_t k, const int8_t *pp, const float *columns,
                          const float *bias, int64_t n, float *yp) noexcept nogil:
    """yp (m, n) = float((q(x) - zp) @ (b - zb)) * (columns * x_scale) (+ bias), q, x_scale and
    zp the DynamicQuantizeLinear of all m x k values at xp (``_dynamic_range``), b packed at pp;
    the quantized rows, zero points and column scales in memory of the call's own. Returns the
    product's status, or -1 where that memory cannot be had."""
    cdef int64_t count = m * k, i
    cdef float v
    # the rows' uint8 values, then their zero points (int32 each), then the column scales
    cdef char *scratch = <char *>malloc(<size_t>(count + 4 * m + 4 * n + 4))
    if scratch == NULL:
        return -1
    cdef uint8_t *q = <uint8_t *>scratch
    cdef int32_t *za = <int32_t *>(scratch + ((count + 3) // 4) * 4)
    cdef float *cs = <float *>(za + m)
    cdef float scale = _dynamic_range(count, xp, &v)
    fl_quantize(count, xp, scale, v, 0, 255, q, 0)
    for i in range(m):
        za[i] = <int32_t>v
    for i in range(n):
        cs[i] = columns[i] * scale
    cdef fl_qout out
    out.kind = 1
    out.scale = cs
    out.bias = bias
    out.ibias = NULL
    out.zero_point = 0
    cdef int st = fl_qgemm(m, n, k, q, 0, k, za, pp, &out, yp, n)
    free(scratch)
    return st


def dynamic_qgemm(cnp.ndarray x, cnp.ndarray pb, cnp.ndarray b_columns, object bias=None):
    """y (..., n) float32 = float((x_u - x_zp) @ (b - zb)) * (b_columns * x_scale) (+ ``bias``),
    x_u, x_scale and x_zp being the DynamicQuantizeLinear of all of ``x`` (..., k), C-contiguous
    float32 (``dynamic_quantize``'s arithmetic), ``pb`` b (k, n) packed by ``qpack``,
    ``b_columns`` (n,) float32 and ``bias`` (n,) float32 or None: ``dynamic_quantize`` and then
    ``qgemm`` with the column scales ``b_columns * x_scale`` in one call, the same bits, the
    quantized rows and scales in memory of the call's own."""
    cdef const float *xp = _f32_contiguous(x, "dynamic_qgemm x")
    if x.ndim < 1 or x.shape[x.ndim - 1] < 1:
        raise ValueError(f"dynamic_qgemm: x of shape {(<object>x).shape} has no last axis to reduce")
    cdef int64_t k = x.shape[x.ndim - 1], m = x.size // k
    cdef int64_t n = b_columns.shape[0] if b_columns.ndim == 1 else -1
    cdef const float *columns = _f32_block(b_columns, (n,), "dynamic_qgemm b_columns")
    _check_packed(pb, k, n, "dynamic_qgemm: pb")
    cdef const float *bp = _f32_block(bias, (n,), "dynamic_qgemm bias")
    y = np.empty((<object>x).shape[:-1] + (n,), np.float32)
    cdef float *yp = <float *>cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef const int8_t *pp = <const int8_t *>cnp.PyArray_DATA(pb)
    cdef int st = 0
    if m == 0 or n == 0:
        return y
    with nogil:
        st = _dynamic_product(xp, m, k, pp, columns, bp, n, yp)
    check(st, "dynamic_qgemm")
    return y
