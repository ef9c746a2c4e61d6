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


def dynamic_quantize(cnp.ndarray x):
    """DynamicQuantizeLinear of a C-contiguous float32 array, as onnxruntime computes it:
    (x as uint8 of x's shape, scale, zero point), the range [min(x, 0), max(x, 0)] mapped onto
    [0, 255]: scale = (max - min) / 255 (1 where the range is empty) and zero point
    round_half_even(clamp(0 - min / scale, 0, 255)) (0 for a NaN range), in float32."""
    cdef const float *xp = _f32_contiguous(x, "dynamic_quantize")
    cdef float mm[2]
    cdef float scale, v
    cdef int64_t count = x.size
    out = np.empty((<object>x).shape, np.uint8)
    cdef void *op = cnp.PyArray_DATA(<cnp.ndarray>out)
    with nogil:
        mm[0] = 0
        mm[1] = 0
        if count:
            fl_min_max(count, xp, mm)
        scale = <float>1.0 if mm[1] == mm[0] else (mm[1] - mm[0]) / <float>255.0
        v = <float>0.0 - mm[0] / scale
        if not v >= 0:
            v = 0
        elif v > 255:
            v = 255
        v = nearbyintf(v)
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
