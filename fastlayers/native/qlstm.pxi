# The quantized LSTM time loop (qlstm.h).

cdef extern from "dispatch.h" nogil:
    int fl_qlstm(int64_t steps, int64_t batch, int64_t hidden, const float *x_proj, int reverse,
                 const int8_t *r_packed, const float *r_scale, const float *bias, const float *peep,
                 float clip, int input_forget, float *h, float *c, float *y, int64_t y_step)


def qlstm(cnp.ndarray x_proj, bint reverse, cnp.ndarray r_packed, cnp.ndarray r_scale, object bias,
          object peep, float clip, bint input_forget, cnp.ndarray h, cnp.ndarray c, object y):
    """One direction of a quantized LSTM over a sequence (qlstm.h): ``x_proj`` (steps, batch,
    4 hidden), ``r_packed`` R packed by ``qpack``, ``r_scale`` (4 hidden,), ``bias`` (4 hidden,)
    or None, ``peep`` (3 hidden,) or None, ``clip`` > 0 or 0, ``h`` and ``c`` (batch, hidden)
    updated in place, ``y`` None or a float32 array (steps, ..., batch, hidden) whose last two
    axes are contiguous and that receives each step's h."""
    if x_proj.ndim != 3 or h.ndim != 2:
        raise ValueError("qlstm: x_proj must be (steps, batch, 4 hidden) and h (batch, hidden)")
    cdef int64_t steps = x_proj.shape[0], batch = x_proj.shape[1], hidden = h.shape[1]
    cdef const float *xp = _f32_block(x_proj, (steps, batch, 4 * hidden), "x_proj")
    cdef float *hp = _f32_block(h, (batch, hidden), "h")
    cdef float *cp = _f32_block(c, (batch, hidden), "c")
    cdef const float *sp = _f32_block(r_scale, (4 * hidden,), "r_scale")
    cdef const float *bp = _f32_block(bias, (4 * hidden,), "bias")
    cdef const float *pp = _f32_block(peep, (3 * hidden,), "peep")
    _check_packed(r_packed, hidden, 4 * hidden, "qlstm: r_packed")
    cdef const int8_t *rp = <const int8_t *>cnp.PyArray_DATA(r_packed)
    cdef float *yp = NULL
    cdef int64_t y_step = 0
    cdef cnp.ndarray ya
    if y is not None:
        ya = <cnp.ndarray>y
        if cnp.PyArray_TYPE(ya) != cnp.NPY_FLOAT32 or ya.ndim < 3 or ya.shape[0] != steps \
                or (<object>ya).shape[ya.ndim - 2:] != (batch, hidden) \
                or ya.strides[ya.ndim - 1] != 4 or ya.strides[ya.ndim - 2] != 4 * hidden or ya.strides[0] % 4:
            raise ValueError(f"qlstm: y must be float32 (steps, ..., {batch}, {hidden}) with contiguous rows")
        yp = <float *>cnp.PyArray_DATA(ya)
        y_step = ya.strides[0] // 4
    cdef int st
    with nogil:
        st = fl_qlstm(steps, batch, hidden, xp, reverse, rp, sp, bp, pp, clip, input_forget, hp, cp, yp, y_step)
    check(st, "qlstm")
