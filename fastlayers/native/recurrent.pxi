# Recurrent time loops (recurrent.h).

cdef extern from "recurrent.h":
    ctypedef struct fl_rnn_args:
        int kind, reset_after, act, ract, reverse, zero_masked
        int64_t batch, steps, inputs, units, out, parts, row_parts
        const int64_t *ubounds
        const int64_t *qbounds
        const float *x
        const int64_t *ids
        const float *table
        int64_t table_rows
        const float *pw_ig
        const float *b_g
        const float *pw_hg
        const float *pw_hn
        const float *pw_hp
        const float *b_hg
        const unsigned char *mask
        float *h
        float *c
        float *y
        float *last
    int64_t fl_rnn_share_floats(int64_t k, int64_t cols)
    int FL_RNN_MAX_PARTS
    enum: FL_RNN_MAX_LOOPS

cdef extern from "dispatch.h" nogil:
    int fl_rnn_loop(const fl_rnn_args *a)
    int fl_rnn_loops(const fl_rnn_args *a, int64_t n)

#: Loop kinds of ``rnn_loop``.
RNN_SIMPLE, RNN_LSTM, RNN_GRU = 0, 1, 2
#: Most unit shares of one loop.
RNN_MAX_PARTS = FL_RNN_MAX_PARTS
#: Most loops of one ``rnn_loops`` call.
RNN_MAX_LOOPS = FL_RNN_MAX_LOOPS


_DTYPE_NAMES = {cnp.NPY_FLOAT32: "float32", cnp.NPY_INT64: "int64", cnp.NPY_UINT8: "uint8"}


cdef inline void _arr(object a, int typenum, int ndim, str what) except *:
    if not isinstance(a, cnp.ndarray) or cnp.PyArray_TYPE(a) != typenum or \
            (<cnp.ndarray>a).ndim != ndim or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise TypeError(f"rnn_loop: {what} must be a C-contiguous {ndim}-D array of "
                        f"{_DTYPE_NAMES[typenum]}")


cdef inline void _dims(cnp.ndarray a, int64_t d0, int64_t d1, str what) except *:
    if a.shape[0] != d0 or a.shape[1] != d1:
        raise ValueError(f"rnn_loop: {what} has shape ({a.shape[0]}, {a.shape[1]}), "
                         f"expected ({d0}, {d1})")


cdef inline float *_fdata(object a, int64_t size, str what) except? NULL:
    """The data of an optional C-contiguous 1-D float32 array of at least ``size`` values."""
    if a is None:
        return NULL
    _arr(a, cnp.NPY_FLOAT32, 1, what)
    if (<cnp.ndarray>a).shape[0] < size:
        raise ValueError(f"rnn_loop: {what} holds {(<cnp.ndarray>a).shape[0]} floats, "
                         f"expected {size}")
    return <float *>cnp.PyArray_DATA(a)


cdef int64_t _packed_floats(int64_t k, const int64_t *bounds, int64_t parts, int64_t blocks):
    cdef int64_t total = 0, p
    for p in range(parts):
        total += fl_rnn_share_floats(k, blocks * (bounds[p + 1] - bounds[p]))
    return total


def rnn_loop(int kind, object x, object ids, object table, object pw_ig, object b_g,
             object pw_hg, object pw_hn, object pw_hp, object b_hg, object ubounds,
             object qbounds, int64_t row_parts, object mask, object h, object c, object y,
             object last, int act, int ract, bint reverse, bint zero_masked,
             bint reset_after):
    """Run a recurrent layer over a sequence (recurrent.h): SimpleRNN, LSTM or GRU (``kind``).

    Inputs: ``x`` (B, T, I) float32 with ``pw_ig`` (the input weights packed per unit share)
    and bias ``b_g`` (G,) or None; or ``ids`` (B, T) int64 of rows of ``table`` (V, G) (their
    projection, bias included). ``pw_hg``/``pw_hn``/``pw_hp``: recurrent weights packed per
    share (``pw_hn`` the GRU's candidate block without ``reset_after``, ``pw_hp`` the LSTM
    projection, else None); ``b_hg`` the GRU's recurrent bias with ``reset_after`` or None.
    ``ubounds`` (parts + 1) int64 unit shares, ``qbounds`` the projection's output shares (or
    None); ``row_parts`` batch shares (then one unit share). ``mask`` (B, T) uint8 or None.
    ``h`` (B, O) and ``c`` (B, U) hold the initial states and receive the final ones, ``last``
    (B, O) the carried output (in: y0 or zeros); ``y`` (B, T, O) every step's output, or None.
    Every array C-contiguous. Activation codes ``act``/``ract`` (rows.h)."""
    cdef fl_rnn_args a
    _rnn_args(&a, (kind, x, ids, table, pw_ig, b_g, pw_hg, pw_hn, pw_hp, b_hg, ubounds, qbounds,
                   row_parts, mask, h, c, y, last, act, ract, reverse, zero_masked, reset_after))
    cdef int st
    with nogil:
        st = fl_rnn_loop(&a)
    _rnn_status(st)


def rnn_loops(list calls):
    """Run independent loops at once (recurrent.h ``rnn_loops``), one thread each: ``calls``
    holds each loop's arguments as ``rnn_loop`` takes them (a tuple), at most
    ``RNN_MAX_LOOPS``; no two may write the same arrays."""
    cdef fl_rnn_args a[FL_RNN_MAX_LOOPS]
    cdef int64_t n = len(calls), i
    if n < 1 or n > FL_RNN_MAX_LOOPS:
        raise ValueError(f"rnn_loops: {n} loops, expected 1 to {FL_RNN_MAX_LOOPS}")
    for i in range(n):
        _rnn_args(&a[i], calls[i])
    cdef int st
    with nogil:
        st = fl_rnn_loops(a, n)
    _rnn_status(st)


cdef void _rnn_status(int st) except *:
    if st == -2:
        raise ValueError("rnn_loop: inconsistent shares, shapes or row_parts")
    check(st, "rnn_loop")


cdef void _rnn_args(fl_rnn_args *a, tuple call, bint ids_per_call=False) except *:
    """``a`` from ``rnn_loop``'s arguments, checked; with ``ids_per_call`` the ids array is a
    buffer a native plan fills before each run of the loop (its values are checked then, by the
    plan's rnn steps), else its ids are checked now."""
    cdef int kind, act, ract
    cdef int64_t row_parts
    cdef bint reverse, zero_masked, reset_after
    (kind, x, ids, table, pw_ig, b_g, pw_hg, pw_hn, pw_hp, b_hg, ubounds, qbounds, row_parts,
     mask, h, c, y, last, act, ract, reverse, zero_masked, reset_after) = call
    cdef int64_t parts, b, t, blocks = 4 if kind == RNN_LSTM else (3 if kind == RNN_GRU else 1)
    cdef int64_t nrows, g, bad
    cdef const int64_t *ip
    cdef bint gru_before = kind == RNN_GRU and not reset_after
    _arr(h, cnp.NPY_FLOAT32, 2, "h")
    _arr(ubounds, cnp.NPY_INT64, 1, "ubounds")
    parts = (<cnp.ndarray>ubounds).shape[0] - 1
    if kind < RNN_SIMPLE or kind > RNN_GRU or parts < 1 or parts > FL_RNN_MAX_PARTS:
        raise ValueError(f"rnn_loop: kind {kind} with {parts} shares")
    a.kind, a.reset_after, a.act, a.ract = kind, reset_after, act, ract
    a.reverse, a.zero_masked = reverse, zero_masked
    a.batch, a.out, a.parts, a.row_parts = h.shape[0], h.shape[1], parts, row_parts
    a.ubounds = <const int64_t *>cnp.PyArray_DATA(ubounds)
    a.units = a.ubounds[parts]
    g = blocks * a.units
    a.x = a.ids = a.table = a.pw_ig = NULL
    a.table_rows = 0
    if x is not None:
        _arr(x, cnp.NPY_FLOAT32, 3, "x")
        if x.shape[0] != a.batch:
            raise ValueError(f"rnn_loop: x holds {x.shape[0]} rows for a batch of {a.batch}")
        a.steps, a.inputs = x.shape[1], x.shape[2]
        a.x = <const float *>cnp.PyArray_DATA(x)
        a.pw_ig = _fdata(pw_ig, _packed_floats(a.inputs, a.ubounds, parts, blocks), "pw_ig")
    else:
        _arr(ids, cnp.NPY_INT64, 2, "ids")
        _arr(table, cnp.NPY_FLOAT32, 2, "table")
        if ids.shape[0] != a.batch or table.shape[1] != g:
            raise ValueError(f"rnn_loop: ids {ids.shape} / table {table.shape} for a batch of "
                             f"{a.batch} and {g} gate columns")
        a.steps, a.inputs = ids.shape[1], 1
        a.ids = ip = <const int64_t *>cnp.PyArray_DATA(ids)
        a.table = <const float *>cnp.PyArray_DATA(table)
        nrows, bad = table.shape[0], -1
        a.table_rows = nrows
        with nogil:
            for b in range(0 if ids_per_call else a.batch * a.steps):
                if ip[b] < 0 or ip[b] >= nrows:
                    bad = b
                    break
        if bad >= 0:
            raise IndexError(f"rnn_loop: id {ip[bad]} out of range for a table of {nrows} rows")
    a.b_g = _fdata(b_g, g, "b_g")
    a.b_hg = _fdata(b_hg, g, "b_hg")
    a.pw_hg = _fdata(pw_hg, _packed_floats(a.out, a.ubounds, parts, 2 if gru_before else blocks),
                     "pw_hg")
    a.pw_hn = _fdata(pw_hn, _packed_floats(a.units, a.ubounds, parts, 1), "pw_hn") \
        if gru_before else NULL
    a.qbounds, a.pw_hp = NULL, NULL
    if kind == RNN_LSTM and pw_hp is not None:
        _arr(qbounds, cnp.NPY_INT64, 1, "qbounds")
        if qbounds.shape[0] != parts + 1:
            raise ValueError("rnn_loop: qbounds and ubounds must have the same length")
        a.qbounds = <const int64_t *>cnp.PyArray_DATA(qbounds)
        a.pw_hp = _fdata(pw_hp, _packed_floats(a.units, a.qbounds, parts, 1), "pw_hp")
    elif a.out != a.units:
        raise ValueError(f"rnn_loop: a state of {a.out} for {a.units} units needs a projection")
    if a.pw_hg == NULL or (gru_before and a.pw_hn == NULL):
        raise ValueError("rnn_loop: recurrent weights missing")
    a.mask = NULL
    if mask is not None:
        _arr(mask, cnp.NPY_UINT8, 2, "mask")
        _dims(mask, a.batch, a.steps, "mask")
        a.mask = <const unsigned char *>cnp.PyArray_DATA(mask)
    a.h = <float *>cnp.PyArray_DATA(h)
    _arr(last, cnp.NPY_FLOAT32, 2, "last")
    _dims(last, a.batch, a.out, "last")
    a.last = <float *>cnp.PyArray_DATA(last)
    a.c = NULL
    if kind == RNN_LSTM:
        _arr(c, cnp.NPY_FLOAT32, 2, "c")
        _dims(c, a.batch, a.units, "c")
        a.c = <float *>cnp.PyArray_DATA(c)
    a.y = NULL
    if y is not None:
        _arr(y, cnp.NPY_FLOAT32, 3, "y")
        if y.shape[0] != a.batch or y.shape[1] != a.steps or y.shape[2] != a.out:
            raise ValueError(f"rnn_loop: y has shape {y.shape}")
        a.y = <float *>cnp.PyArray_DATA(y)
