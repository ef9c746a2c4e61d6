# The quantized LSTM time loop (qlstm.h).

from libc.string cimport memset

cdef extern from "dispatch.h" nogil:
    int fl_qlstm(int64_t steps, int64_t batch, int64_t hidden, const float *x_proj, int reverse,
                 const int8_t *r_packed, const float *r_scale, const float *bias, const float *peep,
                 float clip, int input_forget, float *h, float *c, float *y, int64_t y_step)
    ctypedef struct fl_qlstm_run:
        int64_t steps, batch, hidden
        const float *x_proj
        int reverse
        const int8_t *r_packed
        const float *r_scale
        const float *bias
        const float *peep
        float clip
        int input_forget
        float *h
        float *c
        float *y
        int64_t y_step
    int fl_qlstm_runs(int64_t n, const fl_qlstm_run *runs)

#: Most runs one ``qlstm_runs`` call takes.
MAX_QLSTM_RUNS = 8


cdef int _qlstm_run(fl_qlstm_run *r, cnp.ndarray x_proj, bint reverse, cnp.ndarray r_packed,
                    cnp.ndarray r_scale, object bias, object peep, float clip, bint input_forget,
                    cnp.ndarray h, cnp.ndarray c, object y) except -1:
    """r = the checked arguments of one qlstm run (``qlstm``'s)."""
    if x_proj.ndim != 3 or h.ndim != 2:
        raise ValueError("qlstm: x_proj must be (steps, batch, 4 hidden) and h (batch, hidden)")
    cdef int64_t steps = x_proj.shape[0], batch = x_proj.shape[1], hidden = h.shape[1]
    r.steps, r.batch, r.hidden, r.reverse, r.clip, r.input_forget = steps, batch, hidden, reverse, clip, input_forget
    r.x_proj = _f32_block(x_proj, (steps, batch, 4 * hidden), "x_proj")
    r.h = _f32_block(h, (batch, hidden), "h")
    r.c = _f32_block(c, (batch, hidden), "c")
    r.r_scale = _f32_block(r_scale, (4 * hidden,), "r_scale")
    r.bias = _f32_block(bias, (4 * hidden,), "bias")
    r.peep = _f32_block(peep, (3 * hidden,), "peep")
    _check_packed(r_packed, hidden, 4 * hidden, "qlstm: r_packed")
    r.r_packed = <const int8_t *>cnp.PyArray_DATA(r_packed)
    r.y, r.y_step = NULL, 0
    cdef cnp.ndarray ya
    if y is not None:
        ya = <cnp.ndarray>y
        if cnp.PyArray_TYPE(ya) != cnp.NPY_FLOAT32 or ya.ndim < 3 or ya.shape[0] != steps \
                or (<object>ya).shape[ya.ndim - 2:] != (batch, hidden) or (ya.size and (
                    ya.strides[ya.ndim - 1] != 4 or ya.strides[ya.ndim - 2] != 4 * hidden or ya.strides[0] % 4)):
            raise ValueError(f"qlstm: y must be float32 (steps, ..., {batch}, {hidden}) with contiguous rows")
        if ya.size:  # numpy gives an empty array zero strides
            r.y = <float *>cnp.PyArray_DATA(ya)
            r.y_step = ya.strides[0] // 4
    return 0


def qlstm(cnp.ndarray x_proj, bint reverse, cnp.ndarray r_packed, cnp.ndarray r_scale, object bias,
          object peep, float clip, bint input_forget, cnp.ndarray h, cnp.ndarray c, object y):
    """One direction of a quantized LSTM over a sequence (qlstm.h): ``x_proj`` (steps, batch,
    4 hidden), ``r_packed`` R packed by ``qpack``, ``r_scale`` (4 hidden,), ``bias`` (4 hidden,)
    or None, ``peep`` (3 hidden,) or None, ``clip`` > 0 or 0, ``h`` and ``c`` (batch, hidden)
    updated in place, ``y`` None or a float32 array (steps, ..., batch, hidden) whose last two
    axes are contiguous and that receives each step's h."""
    cdef fl_qlstm_run r
    _qlstm_run(&r, x_proj, reverse, r_packed, r_scale, bias, peep, clip, input_forget, h, c, y)
    cdef int st
    with nogil:
        st = fl_qlstm_runs(1, &r)
    check(st, "qlstm")


def qlstm_runs(list runs):
    """Independent ``qlstm`` runs (a bidirectional layer's directions), each a tuple of
    ``qlstm``'s arguments, on the pool's threads (one run per thread where a step's product is
    small, qlstm.h); at most MAX_QLSTM_RUNS. Their arrays must not overlap."""
    cdef fl_qlstm_run rs[8]
    cdef int64_t n = len(runs), i
    if n > MAX_QLSTM_RUNS:
        raise ValueError(f"qlstm_runs: {n} runs, at most {MAX_QLSTM_RUNS}")
    for i in range(n):
        if len(runs[i]) != 11:
            raise ValueError(f"qlstm_runs: run {i} has {len(runs[i])} arguments, expected qlstm's 11")
        a = runs[i]
        _qlstm_run(&rs[i], a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10])
    cdef int st
    with nogil:
        st = fl_qlstm_runs(n, rs)
    check(st, "qlstm_runs")


def dynamic_qlstm(cnp.ndarray x, cnp.ndarray w_packed, cnp.ndarray w_scale, bint reverse, cnp.ndarray r_packed,
                  cnp.ndarray r_scale, object bias, object peep, float clip, bint input_forget, cnp.ndarray h,
                  cnp.ndarray c, object y):
    """One direction of a quantized LSTM from its float input: ``x`` (steps, batch, input)
    C-contiguous float32 quantized as DynamicQuantizeLinear (all of it at once) and multiplied
    by W (input, 4 hidden) packed by ``qpack`` with ``w_scale`` (4 hidden,) its float32 column
    scales (``dynamic_qgemm``), then ``qlstm``'s loop over those projections (the other
    arguments are ``qlstm``'s): both in one call, the same bits as the two apart."""
    cdef const float *xp = _f32_contiguous(x, "dynamic_qlstm x")
    if x.ndim != 3 or h.ndim != 2:
        raise ValueError("dynamic_qlstm: x must be (steps, batch, input) and h (batch, hidden)")
    cdef int64_t steps = x.shape[0], batch = x.shape[1], k = x.shape[2], g = 4 * h.shape[1]
    cdef const float *columns = _f32_block(w_scale, (g,), "dynamic_qlstm w_scale")
    _check_packed(w_packed, k, g, "dynamic_qlstm: w_packed")
    x_proj = np.empty((steps, batch, g), np.float32)
    cdef fl_qlstm_run r
    _qlstm_run(&r, x_proj, reverse, r_packed, r_scale, bias, peep, clip, input_forget, h, c, y)
    cdef const int8_t *wp = <const int8_t *>cnp.PyArray_DATA(w_packed)
    cdef float *proj = <float *>r.x_proj
    cdef int st = 0
    if steps * batch == 0:
        return
    with nogil:
        if k > 0:
            st = _dynamic_product(xp, steps * batch, k, wp, columns, NULL, g, proj)
        else:
            memset(proj, 0, <size_t>(steps * batch * g) * sizeof(float))
        if st == 0:
            st = fl_qlstm_runs(1, &r)
    check(st, "dynamic_qlstm")
