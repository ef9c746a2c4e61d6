# Native plans (plan.h): the steps of a model lowered for one set of input shapes, run in one
# native call with the GIL released (onnx/lowering.py builds them).

from cpython.mem cimport PyMem_Realloc
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset

cdef extern from "plan.h" nogil:
    ctypedef int (*fl_step_fn)(void *ctx) noexcept nogil
    ctypedef struct fl_plan_step:
        fl_step_fn fn
        void *ctx
    enum: FL_GATHER_AXES
    ctypedef struct fl_gather_args:
        int naxes, inner_run
        int64_t dims[FL_GATHER_AXES]
        int64_t dst_strides[FL_GATHER_AXES]
        const int64_t *maps[FL_GATHER_AXES]
        int64_t firsts[FL_GATHER_AXES]
        int64_t steps[FL_GATHER_AXES]
        const void *src
        void *dst
        int elem
        unsigned char fill[8]
    ctypedef struct fl_transpose_args:
        int64_t batch, rows, cols, src_batch, src_row, dst_batch, dst_row
        const float *src
        float *dst
    ctypedef struct fl_conv2d_args:
        int64_t n, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, ldw
        const float *x
        const float *pw
        const float *bias
        const float *res
        const float *pu
        int code, res_code, tile, nchw_in, nchw_out
        float alpha, res_alpha
        float *y
    ctypedef struct fl_pool_args:
        int64_t n, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, ho, wo
        int is_max, count_include_pad
        const float *x
        float *y
    ctypedef struct fl_scale_shift_args:
        int64_t m, n
        const float *x
        const float *scale
        const float *shift
        float *out
    ctypedef struct fl_batched_matmul_args:
        int64_t batch, m, n, k, sa, sb
        const float *a
        const float *b
        float *c
    ctypedef struct fl_dense_args:
        int64_t m, n, k, ldw
        const float *x
        const float *w
        const float *pw
        const float *bias
        int code
        float alpha
        float *y
    ctypedef struct fl_depthwise_args:
        int64_t n, h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo
        const float *x
        const float *wk
        const float *bias
        int code
        float alpha
        float *y
    ctypedef struct fl_conv_transpose_args:
        int64_t n, h, w, cin, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo
        const float *x
        const float *wt
        const float *bias
        int code, nchw
        float alpha
        float *y
    ctypedef struct fl_rnn_step_args:
        fl_rnn_args a
        int serial
    ctypedef struct fl_elementwise_args:
        int64_t samples, inner, c
        int n_insns, n_regs, n_operands
        const fl_ew_insn *insns
        float *out
        fl_ew_operand operands[1]
    ctypedef struct fl_attention_step_args:
        int64_t nb, nh, tq, tk, d, dv
        int64_t q_st[3]
        int64_t k_st[3]
        int64_t v_st[3]
        int64_t bias_st[3]
        int64_t out_st[3]
        const float *q
        const float *k
        const float *v
        const float *bias
        float scale
        int causal, empty
        float *out
    ctypedef struct fl_layer_norm_args:
        int64_t m, n
        const float *x
        const float *gamma
        const float *beta
        float eps
        int rms
        float *out
    ctypedef struct fl_add_act_args:
        int64_t n
        const float *a
        const float *b
        int code
        float alpha
        float *out
    ctypedef struct fl_activation_args:
        int64_t size, row
        int code
        float alpha
        const float *x
        float *y
    enum: FL_PLAN_BAD_INDEX
    enum: FL_PLAN_NOT_FINITE
    enum: FL_PLAN_LOOP_LIMIT
    enum: FL_PLAN_OTHER_SHAPES
    ctypedef struct fl_loop_copy:
        const char *src
        char *dst
        int64_t nbytes, src_step, dst_step
    ctypedef struct fl_loop_args:
        const fl_plan_step *body
        int64_t nbody
        const int64_t *trips
        const unsigned char *cond
        const unsigned char *cond_out
        int64_t *counter
        int64_t most, expect
        const fl_loop_copy *init
        const fl_loop_copy *before
        const fl_loop_copy *after
        int64_t ninit, nbefore, nafter
    int fl_loop_step(void *a) noexcept nogil
    enum: FL_REDUCE_SUM, FL_REDUCE_MEAN, FL_REDUCE_MAX, FL_REDUCE_MIN, FL_REDUCE_L1, FL_REDUCE_L2, FL_REDUCE_SUM_SQUARE
    enum: FL_REDUCE_ARGMAX, FL_REDUCE_ARGMIN
    ctypedef struct fl_take_args:
        int64_t outer, n, count, run, elem
        const void *idx
        int idx32
        const char *src
        char *dst
    ctypedef struct fl_reduce_args:
        int64_t outer, r, inner
        int op, last
        const float *x
        float *y
        int64_t *index
    int fl_gather(void *a) noexcept nogil
    int fl_take_step(void *a) noexcept nogil
    enum: FL_MAP_F32, FL_MAP_F64, FL_MAP_I64, FL_MAP_I32, FL_MAP_BOOL, FL_MAP_I8, FL_MAP_U8, FL_MAP_I16, FL_MAP_U16
    enum: FL_MAP_EQ, FL_MAP_LT, FL_MAP_LE, FL_MAP_GT, FL_MAP_GE, FL_MAP_WHERE, FL_MAP_CAST, FL_MAP_NOT, FL_MAP_AND
    enum: FL_MAP_OR, FL_MAP_XOR, FL_MAP_ISNAN, FL_MAP_ADD, FL_MAP_SUB, FL_MAP_MUL, FL_MAP_DIV, FL_MAP_MIN, FL_MAP_MAX
    enum: FL_MAP_CLIP, FL_MAP_SQRT, FL_MAP_NEG, FL_MAP_ABS, FL_MAP_RECIPROCAL, FL_MAP_DEQUANTIZE
    ctypedef struct fl_map_args:
        int op, naxes, n_in, out_type
        int types[3]
        int64_t dims[FL_GATHER_AXES]
        int64_t strides[3][FL_GATHER_AXES]
        const void *in_ "in"[3]
        void *out
    int fl_map_step(void *a) noexcept nogil
    int fl_reduce_step(void *a) noexcept nogil
    int fl_transpose_step(void *a) noexcept nogil
    int fl_conv2d_step(void *a) noexcept nogil
    int fl_depthwise_step(void *a) noexcept nogil
    int fl_conv_transpose_step(void *a) noexcept nogil
    int fl_dense_step(void *a) noexcept nogil
    int fl_batched_matmul_step(void *a) noexcept nogil
    int fl_pool_step(void *a) noexcept nogil
    int fl_scale_shift_step(void *a) noexcept nogil
    int fl_rnn_step(void *a) noexcept nogil
    ctypedef struct fl_rnn_loops_step_args:
        int64_t n
        fl_rnn_args a[FL_RNN_MAX_LOOPS]
    int fl_rnn_loops_step(void *a) noexcept nogil
    int fl_activation_step(void *a) noexcept nogil
    int fl_add_act_step(void *a) noexcept nogil
    int fl_elementwise_step(void *a) noexcept nogil
    int fl_layer_norm_step(void *a) noexcept nogil
    int fl_attention_step(void *a) noexcept nogil
    int fl_plan_run(const fl_plan_step *steps, int64_t n, int64_t *failed, int64_t *ns)

#: Most axes of a gather step.
GATHER_AXES = FL_GATHER_AXES
#: Status of a step that called back into Python and raised (the callable holds the error).
PYTHON_STEP_FAILED = -3
#: Status of a take step that read an index outside its axis (nothing written).
BAD_INDEX = FL_PLAN_BAD_INDEX
#: Status of a Winograd convolution step that met a non-finite value and holds no weights for
#: the direct sums (nothing else written that the call keeps: the Python plan takes it).
NOT_FINITE = FL_PLAN_NOT_FINITE
#: Status of a loop step that would pass the iteration limit of a loop whose length the file
#: sets (nothing the call keeps written: the Python plan takes it and raises the limit's error).
LOOP_LIMIT = FL_PLAN_LOOP_LIMIT
#: Status of a loop step that ran another number of iterations than its stacked outputs hold:
#: the plan's shapes do not fit such calls.
OTHER_SHAPES = FL_PLAN_OTHER_SHAPES
#: Entries of a gather map from which an evenly spaced one is held as its first entry and
#: spacing rather than as a table.
GATHER_TABLE_MAX = 16
#: Operations of a map step, by name: the number of operands each takes.
MAP_OPS = {
    "equal": (FL_MAP_EQ, 2),
    "less": (FL_MAP_LT, 2),
    "less_equal": (FL_MAP_LE, 2),
    "greater": (FL_MAP_GT, 2),
    "greater_equal": (FL_MAP_GE, 2),
    "where": (FL_MAP_WHERE, 3),
    "cast": (FL_MAP_CAST, 1),
    "not": (FL_MAP_NOT, 1),
    "and": (FL_MAP_AND, 2),
    "or": (FL_MAP_OR, 2),
    "xor": (FL_MAP_XOR, 2),
    "isnan": (FL_MAP_ISNAN, 1),
    "add": (FL_MAP_ADD, 2),
    "sub": (FL_MAP_SUB, 2),
    "mul": (FL_MAP_MUL, 2),
    "div": (FL_MAP_DIV, 2),
    "min": (FL_MAP_MIN, 2),
    "max": (FL_MAP_MAX, 2),
    "clip": (FL_MAP_CLIP, 3),
    "sqrt": (FL_MAP_SQRT, 1),
    "neg": (FL_MAP_NEG, 1),
    "abs": (FL_MAP_ABS, 1),
    "reciprocal": (FL_MAP_RECIPROCAL, 1),
    "dequantize": (FL_MAP_DEQUANTIZE, 3),
}
#: The element types a map step writes (bool as one byte, 0 or 1)...
MAP_TYPES = {
    np.dtype(np.float32): FL_MAP_F32,
    np.dtype(np.float64): FL_MAP_F64,
    np.dtype(np.int64): FL_MAP_I64,
    np.dtype(np.int32): FL_MAP_I32,
    np.dtype(np.bool_): FL_MAP_BOOL,
}
#: ...and those it reads: also 8- and 16-bit integers (quantized values).
MAP_READ_TYPES = {
    **MAP_TYPES,
    np.dtype(np.int8): FL_MAP_I8,
    np.dtype(np.uint8): FL_MAP_U8,
    np.dtype(np.int16): FL_MAP_I16,
    np.dtype(np.uint16): FL_MAP_U16,
}
#: Reductions of a reduce step, by name.
REDUCTIONS = {
    "sum": FL_REDUCE_SUM,
    "mean": FL_REDUCE_MEAN,
    "max": FL_REDUCE_MAX,
    "min": FL_REDUCE_MIN,
    "l1": FL_REDUCE_L1,
    "l2": FL_REDUCE_L2,
    "sum_square": FL_REDUCE_SUM_SQUARE,
    "argmax": FL_REDUCE_ARGMAX,
    "argmin": FL_REDUCE_ARGMIN,
}


class PlanStepFailed(NativeError):
    """A step of a native plan failed: ``step`` its index, ``status`` the kernel's status."""

    def __init__(self, step, status):
        super().__init__(f"native plan step {step} failed with status {status}")
        self.step, self.status = step, status


cdef int _python_step(void *ctx) noexcept nogil:
    """A step with no native form: ``ctx`` a callable returning 0, or nonzero on failure."""
    with gil:
        try:
            return <int>(<object>ctx)()
        except BaseException:  # the callable keeps its own errors; anything else fails the step
            return PYTHON_STEP_FAILED


ctypedef struct _dynamic_qgemm_args:
    const float *x
    int64_t m, k, n
    const int8_t *pb
    const float *columns
    const float *bias
    float *y


cdef int _dynamic_qgemm_step(void *ctx) noexcept nogil:
    """quantize.pxi's ``dynamic_qgemm`` on the bound arguments."""
    cdef _dynamic_qgemm_args *a = <_dynamic_qgemm_args *>ctx
    return _dynamic_product(a.x, a.m, a.k, a.pb, a.columns, a.bias, a.n, a.y)


#: Most directions of one dynamic_qlstm step (a bidirectional layer's two).
DYNAMIC_QLSTM_DIRECTIONS = 2

ctypedef struct _dynamic_qlstm_args:
    int64_t n
    _dynamic_qgemm_args product[2]
    fl_qlstm_run run[2]


cdef int _dynamic_qlstm_step(void *ctx) noexcept nogil:
    """qlstm.pxi's ``dynamic_qlstm`` on the bound arguments of each direction: its input
    product, then the loops, side by side on the pool's threads (``qlstm_runs``)."""
    cdef _dynamic_qlstm_args *a = <_dynamic_qlstm_args *>ctx
    cdef int st = 0
    cdef int64_t d
    if a.product[0].m == 0:
        return 0
    for d in range(a.n):
        if a.product[d].k > 0:
            st = _dynamic_qgemm_step(&a.product[d])
        else:
            memset(a.product[d].y, 0, <size_t>(a.product[d].m * a.product[d].n) * sizeof(float))
        if st:
            return st
    return fl_qlstm_runs(a.n, a.run)


cdef inline float *_view(object a, str what) except NULL:
    """The data of a C-contiguous float32 array (a view of a plan's arena, or a weight)."""
    if not isinstance(a, cnp.ndarray) or cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 \
            or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        raise TypeError(f"native plan: {what} must be a C-contiguous float32 array")
    return <float *>cnp.PyArray_DATA(a)


def _even_spacing(table):
    """(first, step) where the int64 ``table`` of gather offsets is first + i step, each >= 0;
    else None."""
    first, step = int(table[0]), int(table[1]) - int(table[0])
    if first < 0 or first + (table.shape[0] - 1) * step < 0:
        return None
    if not np.array_equal(table, first + step * np.arange(table.shape[0], dtype=np.int64)):
        return None
    return first, step


cdef void _point(tuple move, uintptr_t base):
    """Rewrite the context words ``move`` (addresses, offsets) to point ``offsets`` bytes
    into the memory at ``base``."""
    cdef cnp.ndarray addresses = move[0], offsets = move[1]
    cdef uintptr_t *at = <uintptr_t *>cnp.PyArray_DATA(addresses)
    cdef uintptr_t *by = <uintptr_t *>cnp.PyArray_DATA(offsets)
    cdef int64_t i
    for i in range(addresses.shape[0]):
        (<uintptr_t *>at[i])[0] = base + by[i]


cdef class NativePlan:
    """Steps bound to an arena of ``arena_bytes`` bytes (64-byte aligned, ``arena``): each
    ``add_*`` binds one kernel to views of the arena and to weights (kept alive by the plan),
    ``run`` copies the inputs into their views, runs every step in one native call with the
    GIL released and returns copies of the output views. One call runs a plan at a time:
    ``run`` returns None while another call (another thread) runs it."""

    cdef fl_plan_step *steps
    cdef void **owned
    cdef size_t *sizes
    cdef int64_t n, cap
    cdef list keep
    cdef list moves  # per input: None, or (addresses, offsets) of the context words that point into it
    cdef list bases  # per input: the address those words point into now
    cdef readonly object arena
    cdef bint busy

    def __cinit__(self, int64_t arena_bytes):
        self.steps, self.owned, self.sizes, self.n, self.cap, self.busy = NULL, NULL, NULL, 0, 0, False
        self.keep, self.moves, self.bases = [], [], []
        if arena_bytes < 0:
            raise ValueError(f"native plan: arena of {arena_bytes} bytes")
        raw = np.empty(arena_bytes + 64, np.uint8)
        cdef int64_t pad = (64 - <int64_t>(<size_t>cnp.PyArray_DATA(raw) % 64)) % 64
        self.arena = raw[pad:pad + arena_bytes]

    def __dealloc__(self):
        cdef int64_t i
        if self.owned != NULL:
            for i in range(self.n):
                PyMem_Free(self.owned[i])
        PyMem_Free(self.owned)
        PyMem_Free(self.sizes)
        PyMem_Free(self.steps)

    def __len__(self):
        return self.n

    cdef void *_push(self, fl_step_fn fn, size_t ctx_bytes, object hold) except NULL:
        """A new step running ``fn`` on a zeroed context of ``ctx_bytes`` (its address)."""
        cdef int64_t cap
        if self.n == self.cap:
            cap = max(16, 2 * self.cap)
            steps = <fl_plan_step *>PyMem_Realloc(self.steps, cap * sizeof(fl_plan_step))
            if steps == NULL:
                raise MemoryError()
            self.steps = steps
            owned = <void **>PyMem_Realloc(self.owned, cap * sizeof(void *))
            if owned == NULL:
                raise MemoryError()
            self.owned = owned
            sizes = <size_t *>PyMem_Realloc(self.sizes, cap * sizeof(size_t))
            if sizes == NULL:
                raise MemoryError()
            self.sizes, self.cap = sizes, cap
        cdef void *ctx = PyMem_Malloc(max(ctx_bytes, 1))
        if ctx == NULL:
            raise MemoryError()
        memset(ctx, 0, ctx_bytes)
        self.steps[self.n].fn, self.steps[self.n].ctx, self.owned[self.n] = fn, ctx, ctx
        self.sizes[self.n] = ctx_bytes
        self.n += 1
        self.keep.append(hold)
        return ctx

    def add_gather(self, src, dst, dims, dst_strides, maps, fill=0.0):
        """dst[sum_k i_k dst_strides[k]] = src[sum_k maps[k][i_k]] for every index below
        ``dims``, ``fill`` (as the arrays' type) where some maps[k][i_k] < 0 (plan.h's
        gather): ``src``, ``dst`` C-contiguous arrays of one type of 1, 2, 4 or 8 bytes a
        value (float32, integers, bools: the bits moved as they are), ``maps`` one int64 array
        of ``dims[k]`` source offsets (in values) per axis."""
        cdef int naxes = len(dims), k
        if naxes < 1 or naxes > FL_GATHER_AXES or len(dst_strides) != naxes or len(maps) != naxes:
            raise ValueError(f"native plan gather: {naxes} axes (1 to {FL_GATHER_AXES}), "
                             f"{len(dst_strides)} strides and {len(maps)} maps")
        for arr, what in ((src, "source"), (dst, "destination")):
            if not isinstance(arr, cnp.ndarray) or not cnp.PyArray_IS_C_CONTIGUOUS(arr) \
                    or arr.dtype.itemsize not in (1, 2, 4, 8) or arr.dtype.kind not in "fiub":
                raise TypeError(f"native plan gather: the {what} must be a C-contiguous array of "
                                f"numbers of 1, 2, 4 or 8 bytes (got {getattr(arr, 'dtype', type(arr))})")
        if src.dtype != dst.dtype:
            raise TypeError(f"native plan gather: a {src.dtype} source into a {dst.dtype} destination")
        if not dst.flags.writeable:
            raise ValueError("native plan gather: the destination is read-only")
        fill_bytes = np.array(fill, dtype=dst.dtype).tobytes()
        cdef const void *sp = cnp.PyArray_DATA(src)
        cdef void *dp = cnp.PyArray_DATA(dst)
        tables = [np.ascontiguousarray(m, np.int64) for m in maps]
        cdef int64_t top_src = 0, top_dst = 0, d
        for k in range(naxes):
            d = dims[k]
            if d < 0 or tables[k].ndim != 1 or tables[k].shape[0] != d or dst_strides[k] < 0:
                raise ValueError(f"native plan gather: axis {k} of {d} with a map of "
                                 f"{tables[k].shape} and stride {dst_strides[k]}")
            if d == 0:
                top_src = top_dst = -1
                break
            top_src += max(int(tables[k].max()), 0)
            top_dst += (d - 1) * dst_strides[k]
        if top_src >= src.size or top_dst >= dst.size:
            raise ValueError("native plan gather: offsets past the end of the source or destination")
        last = tables[naxes - 1]
        inner_run = dims[naxes - 1] > 0 and dst_strides[naxes - 1] == 1 and last[0] >= 0 and bool(
            np.array_equal(last, np.arange(last[0], last[0] + dims[naxes - 1])))
        # evenly spaced maps of non-negative offsets as (first, step): long runs hold no table
        spacing = [_even_spacing(t) if t.shape[0] > GATHER_TABLE_MAX else None for t in tables]
        held = [t for t, e in zip(tables, spacing) if e is None]
        cdef fl_gather_args *a = <fl_gather_args *>self._push(fl_gather, sizeof(fl_gather_args), (src, dst, held))
        a.naxes, a.src, a.dst, a.elem, a.inner_run = naxes, sp, dp, dst.dtype.itemsize, inner_run
        for k in range(len(fill_bytes)):
            a.fill[k] = fill_bytes[k]
        for k in range(naxes):
            a.dims[k], a.dst_strides[k] = dims[k], dst_strides[k]
            if spacing[k] is None:
                a.maps[k], a.firsts[k], a.steps[k] = <const int64_t *>cnp.PyArray_DATA(tables[k]), 0, 0
            else:
                a.maps[k] = NULL
                a.firsts[k], a.steps[k] = spacing[k]

    def add_take(self, src, idx, dst, int64_t outer, int64_t n, int64_t run):
        """dst[o, i, r] = src[o, idx[i], r] (a negative index counted from the end) for ``src``
        (outer, n, run), ``idx`` int64 or int32 (count,) and ``dst`` (outer, count, run), each
        C-contiguous, ``src`` and ``dst`` of one type (plan.h's take_step): a Gather on computed
        indices. A call whose indices leave [-n, n) fails the step with ``BAD_INDEX`` before it
        writes anything."""
        for arr, what in ((src, "source"), (dst, "destination")):
            if not isinstance(arr, cnp.ndarray) or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or arr.dtype != src.dtype:
                raise TypeError(f"native plan take: the {what} must be a C-contiguous array of the source's type")
        if not isinstance(idx, cnp.ndarray) or idx.dtype not in (np.int64, np.int32) \
                or not cnp.PyArray_IS_C_CONTIGUOUS(idx):
            raise TypeError("native plan take: the indices must be a C-contiguous int64 or int32 array")
        cdef int64_t count = idx.size
        if outer < 0 or n < 1 or run < 0 or src.size != outer * n * run or dst.size != outer * count * run:
            raise ValueError(f"native plan take: {src.size} source and {dst.size} destination values for "
                             f"{outer} x {n} x {run} read at {count} indices")
        cdef fl_take_args *a = <fl_take_args *>self._push(fl_take_step, sizeof(fl_take_args), (src, idx, dst))
        a.outer, a.n, a.count, a.run, a.elem = outer, n, count, run, src.dtype.itemsize
        a.src, a.dst = <const char *>cnp.PyArray_DATA(src), <char *>cnp.PyArray_DATA(dst)
        a.idx, a.idx32 = <const void *>cnp.PyArray_DATA(idx), idx.dtype == np.int32

    def add_map(self, str op, out, operands, dims, strides):
        """out[i] = ``op``(operands[0][i0], ...) for every index i < ``dims`` (out C-ordered),
        operand j read at sum_k i_k strides[j][k] elements (plan.h's map_step; ``op`` a key of
        ``MAP_OPS``): C-contiguous arrays of the types of ``MAP_TYPES``, each holding every
        element its strides reach."""
        if op not in MAP_OPS:
            raise ValueError(f"native plan map: no operation {op!r}")
        code, n_in = MAP_OPS[op]
        cdef int naxes = len(dims), j, k
        if len(operands) != n_in or len(strides) != n_in or naxes < 1 or naxes > FL_GATHER_AXES:
            raise ValueError(f"native plan map: {op} takes {n_in} operands over 1 to {FL_GATHER_AXES} axes, "
                             f"got {len(operands)} over {naxes}")
        arrays = [out, *operands]
        for k, arr in enumerate(arrays):
            if not isinstance(arr, cnp.ndarray) or arr.dtype not in (MAP_READ_TYPES if k else MAP_TYPES) \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                raise TypeError("native plan map: the result must be a C-contiguous float32, float64, int64, int32 "
                                "or bool array, the operands those or 8- and 16-bit integers")
        cdef int64_t total = 1, top
        for k in range(naxes):
            if dims[k] < 1:
                raise ValueError(f"native plan map: axis {k} of {dims[k]}")
            total *= dims[k]
        if out.size != total:
            raise ValueError(f"native plan map: {out.size} results for {total} indices")
        for j in range(n_in):
            if len(strides[j]) != naxes or min(strides[j]) < 0:
                raise ValueError(f"native plan map: operand {j}'s strides {strides[j]}")
            top = sum((dims[k] - 1) * strides[j][k] for k in range(naxes))
            if top >= operands[j].size:
                raise ValueError(f"native plan map: operand {j} of {operands[j].size} values read at {top}")
        cdef fl_map_args *a = <fl_map_args *>self._push(fl_map_step, sizeof(fl_map_args), tuple(arrays))
        a.op, a.naxes, a.n_in, a.out_type, a.out = code, naxes, n_in, MAP_TYPES[out.dtype], cnp.PyArray_DATA(out)
        for j in range(n_in):
            a.types[j] = MAP_READ_TYPES[operands[j].dtype]
            a.in_[j] = cnp.PyArray_DATA(operands[j])
            for k in range(naxes):
                a.strides[j][k] = strides[j][k]
        for k in range(naxes):
            a.dims[k] = dims[k]

    def add_reduce(self, x, y, str op, int64_t outer, int64_t r, int64_t inner, bint last=False):
        """y[o, j] = ``op`` over i < r of x[o, i, j] for x (outer, r, inner) and y (outer,
        inner), C-contiguous, x float32 (plan.h's reduce_step; ``op`` a key of ``REDUCTIONS``):
        y float32, or int64 for "argmax" / "argmin" (the index i, of the last of equal values
        with ``last``)."""
        cdef float *xp = _view(x, "reduce x")
        if op not in REDUCTIONS:
            raise ValueError(f"native plan reduce: no reduction {op!r}")
        cdef bint arg = op in ("argmax", "argmin")
        if arg and not (isinstance(y, cnp.ndarray) and cnp.PyArray_TYPE(y) == cnp.NPY_INT64
                        and cnp.PyArray_IS_C_CONTIGUOUS(y)):
            raise TypeError(f"native plan reduce: {op} needs a C-contiguous int64 y")
        cdef float *yp = NULL if arg else _view(y, "reduce y")
        if outer < 0 or r < 1 or inner < 0 or x.size != outer * r * inner or y.size != outer * inner:
            raise ValueError(f"native plan reduce: {x.size} values into {y.size} for {outer} x {r} x {inner}")
        cdef fl_reduce_args *a = <fl_reduce_args *>self._push(fl_reduce_step, sizeof(fl_reduce_args), (x, y))
        a.outer, a.r, a.inner, a.op, a.x, a.y = outer, r, inner, REDUCTIONS[op], xp, yp
        a.last = last
        a.index = <int64_t *>cnp.PyArray_DATA(y) if arg else NULL

    def add_transpose(self, src, dst, int64_t offset, int64_t batch, int64_t rows, int64_t cols, int64_t src_batch,
                      int64_t src_row, int64_t dst_batch, int64_t dst_row):
        """dst[b dst_batch + c dst_row + r] = src[offset + b src_batch + r src_row + c] for b <
        batch, r < rows, c < cols (layout.h's transpose; strides in floats): ``src``, ``dst``
        C-contiguous float32 arrays that hold every value read and written."""
        cdef float *sp = _view(src, "transpose source")
        cdef float *dp = _view(dst, "transpose destination")
        if min(batch, rows, cols) < 1 or min(offset, src_batch, src_row, dst_batch, dst_row) < 0:
            raise ValueError(f"native plan transpose: {batch} x {rows} x {cols} values at {offset}")
        if (offset + (batch - 1) * src_batch + (rows - 1) * src_row + cols > src.size
                or (batch - 1) * dst_batch + (cols - 1) * dst_row + rows > dst.size):
            raise ValueError(f"native plan transpose: {batch} x {rows} x {cols} values outside "
                             f"{src.size} source or {dst.size} destination values")
        cdef fl_transpose_args *a = <fl_transpose_args *>self._push(fl_transpose_step, sizeof(fl_transpose_args),
                                                                    (src, dst))
        a.batch, a.rows, a.cols, a.src, a.dst = batch, rows, cols, sp + offset, dp
        a.src_batch, a.src_row, a.dst_batch, a.dst_row = src_batch, src_row, dst_batch, dst_row

    def add_conv2d(self, x, pw, bias, y, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                   int64_t dw, int64_t pt, int64_t pl, int64_t groups, int code, float alpha, res=None,
                   int res_code=0, float res_alpha=0.0, int tile=0, pu=None, bint nchw_in=False,
                   bint nchw_out=False):
        """conv.h's conv2d from x (N, H, W, C) to y (N, Ho, Wo, C_out), both C-contiguous
        float32 (views of the arena), weights packed by ``conv_pack``, as ``conv2d``; ``res``
        (N, Ho, Wo, C_out) added with its code ``res_code`` in the epilogue where given. With
        ``tile`` 2 or 4 (3x3 windows, stride 1, one group, no residual), Winograd on ``pu``
        (``winograd_pack``'s output of that tile) first, the direct sums on ``pw`` where it
        meets a non-finite value, or with ``pw`` None the step fails with ``NOT_FINITE``. With ``nchw_in`` (one group, no residual), x is NCHW planes (N, C, H,
        W) and ``pw`` the HWIO weights (kh, kw, C, C_out) as they are: ``conv2d_nchw_in``. With
        ``nchw_out`` (a 1x1 window, stride 1, no padding, one group, no residual), x (N, C, H, W)
        and y (N, C_out, H, W) are NCHW planes and ``pw`` the (C_out, C) weights, or (C_out, ldw)
        with the weights in its first C columns: ``conv1x1_nchw``. With both (one group, no
        residual), x and y (N, C_out, Ho, Wo) are NCHW planes and ``pw`` the HWIO weights:
        ``conv2d_planes``."""
        cdef float *xp = _view(x, "conv2d x")
        cdef float *yp = _view(y, "conv2d y")
        cdef float *wp = NULL if pw is None and tile else _view(pw, "conv2d weights (needed but with a Winograd tile)")
        cdef float *bp = NULL if bias is None else _view(bias, "conv2d bias")
        cdef float *rp = NULL if res is None else _view(res, "conv2d residual")
        cdef float *up = NULL if pu is None else _view(pu, "conv2d winograd weights")
        if x.ndim != 4 or y.ndim != 4 or y.shape[0] != x.shape[0]:
            raise ValueError(f"native plan conv2d: x {x.shape}, y {y.shape}")
        cdef int64_t c = x.shape[1] if nchw_in or nchw_out else x.shape[3]
        cdef int64_t cout = y.shape[1] if nchw_out else y.shape[3]
        if min(kh, kw, sh, sw, dh, dw, groups) < 1 or pt < 0 or pl < 0 or c % groups or cout % groups:
            raise ValueError("native plan conv2d: bad geometry")
        if nchw_out and nchw_in:
            if groups != 1 or res is not None or tile or pw.shape != (kh, kw, c, cout):
                raise ValueError("native plan conv2d: NCHW planes into NCHW planes with one group and HWIO "
                                 "weights only")
        elif nchw_out:
            if (max(kh, kw, sh, sw, groups) != 1 or pt or pl or res is not None or tile
                    or pw.ndim != 2 or pw.shape[0] != cout or pw.shape[1] < c or y.shape[2:] != x.shape[2:]):
                raise ValueError("native plan conv2d: NCHW output from a 1x1 window on NCHW planes only")
        elif nchw_in:
            if groups != 1 or res is not None or tile or pw.shape != (kh, kw, c, cout):
                raise ValueError("native plan conv2d: NCHW input with one group and HWIO weights only")
        elif pw is not None and pw.size < groups * fl_packed_floats(kh * kw * (c // groups), cout // groups):
            raise ValueError("native plan conv2d: packed weights too small")
        if bias is not None and bias.size != cout:
            raise ValueError(f"native plan conv2d: bias of {bias.size} for {cout} channels")
        if res is not None and res.shape != y.shape:
            raise ValueError(f"native plan conv2d: residual {res.shape} for an output {y.shape}")
        if tile:
            if (tile != 2 and tile != 4) or kh != 3 or kw != 3 or max(sh, sw, dh, dw, groups) != 1 or res is not None:
                raise ValueError(f"native plan conv2d: Winograd tile {tile} on this convolution")
            if pu is None or pu.size < (tile + 2) ** 2 * fl_packed_floats(c, cout):
                raise ValueError("native plan conv2d: Winograd weights too small")
        check_code(code)
        check_code(res_code)
        cdef fl_conv2d_args *a = <fl_conv2d_args *>self._push(fl_conv2d_step, sizeof(fl_conv2d_args),
                                                              (x, pw, bias, y, res, pu))
        a.n, a.c, a.x, a.kh, a.kw = x.shape[0], c, xp, kh, kw
        a.h, a.w = (x.shape[2], x.shape[3]) if nchw_in or nchw_out else (x.shape[1], x.shape[2])
        a.nchw_in, a.nchw_out = nchw_in, nchw_out
        a.ldw = pw.shape[1] if nchw_out and not nchw_in else 0
        a.sh, a.sw, a.dh, a.dw, a.pt, a.pl = sh, sw, dh, dw, pt, pl
        a.ho, a.wo = (y.shape[2], y.shape[3]) if nchw_out else (y.shape[1], y.shape[2])
        a.groups, a.cout, a.pw, a.bias = groups, cout, wp, bp
        a.code, a.alpha, a.y = code, alpha, yp
        a.res, a.res_code, a.res_alpha, a.tile, a.pu = rp, res_code, res_alpha, tile, up

    def add_depthwise(self, x, wk, bias, y, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                      int64_t pl, int code, float alpha):
        """conv.h's depthwise_conv2d from x (N, H, W, C) to y (N, Ho, Wo, C m), both C-contiguous
        float32 (views of the arena), ``wk`` (kh, kw, C, m), as ``depthwise_conv2d``."""
        cdef float *xp = _view(x, "depthwise x")
        cdef float *yp = _view(y, "depthwise y")
        cdef float *wp = _view(wk, "depthwise weights")
        cdef float *bp = NULL if bias is None else _view(bias, "depthwise bias")
        if x.ndim != 4 or y.ndim != 4 or wk.ndim != 4:
            raise ValueError(f"native plan depthwise: x {x.shape}, w {wk.shape}, y {y.shape}")
        cdef int64_t c = x.shape[3], m = wk.shape[3]
        if (y.shape[0] != x.shape[0] or wk.shape[2] != c or y.shape[3] != c * m
                or min(wk.shape[0], wk.shape[1], sh, sw, dh, dw) < 1 or pt < 0 or pl < 0):
            raise ValueError(f"native plan depthwise: x {x.shape}, w {wk.shape}, y {y.shape}")
        if bias is not None and bias.size != c * m:
            raise ValueError(f"native plan depthwise: bias of {bias.size} for {c * m} channels")
        check_code(code)
        cdef fl_depthwise_args *a = <fl_depthwise_args *>self._push(fl_depthwise_step, sizeof(fl_depthwise_args),
                                                                    (x, wk, bias, y))
        a.n, a.h, a.w, a.c, a.x, a.kh, a.kw, a.m = x.shape[0], x.shape[1], x.shape[2], c, xp, wk.shape[0], wk.shape[1], m
        a.sh, a.sw, a.dh, a.dw, a.pt, a.pl, a.ho, a.wo = sh, sw, dh, dw, pt, pl, y.shape[1], y.shape[2]
        a.wk, a.bias, a.code, a.alpha, a.y = wp, bp, code, alpha, yp

    def add_conv_transpose(self, x, wt, bias, y, int64_t kh, int64_t kw, int64_t groups, int64_t sh, int64_t sw,
                           int64_t dh, int64_t dw, int64_t ct, int64_t cl, int code, float alpha, bint nchw=False):
        """conv.h's conv_transpose2d from x (N, H, W, C_in) to y (N, Ho, Wo, C_out), both
        C-contiguous float32 (views of the arena), ``wt`` given by ``conv_transpose_pack``, as
        ``conv_transpose2d``; with ``nchw``, x (N, C_in, H, W) and y (N, C_out, Ho, Wo) planes and
        ``wt`` (groups, C_out / groups kh kw, C_in / groups), as ``conv_transpose2d_nchw``."""
        cdef float *xp = _view(x, "conv_transpose x")
        cdef float *yp = _view(y, "conv_transpose y")
        cdef float *wp = _view(wt, "conv_transpose weights")
        if x.ndim != 4 or y.ndim != 4 or y.shape[0] != x.shape[0]:
            raise ValueError(f"native plan conv_transpose: x {x.shape}, y {y.shape}")
        cdef int64_t cin = x.shape[1] if nchw else x.shape[3], cout = y.shape[1] if nchw else y.shape[3]
        if min(kh, kw, sh, sw, dh, dw, groups) < 1 or ct < 0 or cl < 0 or cin % groups or cout % groups:
            raise ValueError("native plan conv_transpose: bad geometry")
        cdef int64_t co = cout // groups
        if nchw:
            if wt.shape != (groups, co * kh * kw, cin // groups):
                raise ValueError(f"native plan conv_transpose: weights {wt.shape} for {groups} groups of "
                                 f"{cin // groups} -> {co} channels, kernel {kh}x{kw}")
        elif wt.size < groups * fl_packed_floats(cin // groups, kh * kw * co):
            raise ValueError("native plan conv_transpose: packed weights too small")
        cdef float *bp = NULL if bias is None else _view(bias, "conv_transpose bias")
        if bias is not None and bias.size != cout:
            raise ValueError(f"native plan conv_transpose: bias of {bias.size} for {cout} channels")
        check_code(code)
        cdef fl_conv_transpose_args *a = <fl_conv_transpose_args *>self._push(
            fl_conv_transpose_step, sizeof(fl_conv_transpose_args), (x, wt, bias, y))
        a.n, a.cin, a.x, a.wt, a.bias, a.y, a.nchw = x.shape[0], cin, xp, wp, bp, yp, nchw
        a.h, a.w = (x.shape[2], x.shape[3]) if nchw else (x.shape[1], x.shape[2])
        a.ho, a.wo = (y.shape[2], y.shape[3]) if nchw else (y.shape[1], y.shape[2])
        a.kh, a.kw, a.cout_g, a.groups, a.sh, a.sw, a.dh, a.dw, a.ct, a.cl = kh, kw, co, groups, sh, sw, dh, dw, ct, cl
        a.code, a.alpha = code, alpha

    def add_pool2d(self, x, y, bint is_max, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                   int64_t pt, int64_t pl, int64_t h_end, int64_t w_end, bint count_include_pad):
        """pool.h's pool2d from x (N, H, W, C) to y (N, Ho, Wo, C), both C-contiguous float32
        (views of the arena), as ``pool2d``: the window's rows [oh sh - pt, ..) clipped to
        [-pt, h_end), its columns to [-pl, w_end)."""
        cdef float *xp = _view(x, "pool x")
        cdef float *yp = _view(y, "pool y")
        if x.ndim != 4 or y.ndim != 4 or y.shape[0] != x.shape[0] or y.shape[3] != x.shape[3]:
            raise ValueError(f"native plan pool: x {x.shape}, y {y.shape}")
        if min(kh, kw, sh, sw, dh, dw) < 1 or pt < 0 or pl < 0 or h_end < x.shape[1] or w_end < x.shape[2]:
            raise ValueError("native plan pool: bad geometry")
        cdef fl_pool_args *a = <fl_pool_args *>self._push(fl_pool_step, sizeof(fl_pool_args), (x, y))
        a.n, a.h, a.w, a.c, a.x, a.y = x.shape[0], x.shape[1], x.shape[2], x.shape[3], xp, yp
        a.kh, a.kw, a.sh, a.sw, a.dh, a.dw, a.pt, a.pl = kh, kw, sh, sw, dh, dw, pt, pl
        a.h_end, a.w_end, a.ho, a.wo = h_end, w_end, y.shape[1], y.shape[2]
        a.is_max, a.count_include_pad = is_max, count_include_pad

    def add_scale_shift(self, x, scale, shift, out):
        """out[i, j] = x[i, j] scale[j] + shift[j] (rows.h's scale_shift) over the rows of two
        C-contiguous float32 arrays of one shape (out may be x), ``scale`` and ``shift`` one
        float per value of a row."""
        cdef float *xp = _view(x, "scale_shift x")
        cdef float *op = _view(out, "scale_shift out")
        cdef float *sp = _view(scale, "scale_shift scale")
        cdef float *hp = _view(shift, "scale_shift shift")
        if x.ndim < 1 or out.shape != x.shape or scale.size != x.shape[x.ndim - 1] or shift.size != scale.size:
            raise ValueError(f"native plan scale_shift: x {x.shape}, out {out.shape}, {scale.size} scales")
        cdef fl_scale_shift_args *a = <fl_scale_shift_args *>self._push(
            fl_scale_shift_step, sizeof(fl_scale_shift_args), (x, scale, shift, out))
        a.n = x.shape[x.ndim - 1]
        a.m, a.x, a.scale, a.shift, a.out = (x.size // a.n) if a.n else 0, xp, sp, hp, op

    def add_batched_matmul(self, a, b, c):
        """c[i] = a[i] @ b[i] (gemm.h's matmul_batch) for C-contiguous float32 a (Ba, m, k),
        b (Bb, k, n), c (B, m, n), each of Ba and Bb B or 1 (one operand shared)."""
        cdef float *ap = _view(a, "matmul a")
        cdef float *bp = _view(b, "matmul b")
        cdef float *cp = _view(c, "matmul c")
        if a.ndim != 3 or b.ndim != 3 or c.ndim != 3 or a.shape[2] != b.shape[1] or a.shape[1] != c.shape[1] \
                or b.shape[2] != c.shape[2] or a.shape[0] not in (1, c.shape[0]) or b.shape[0] not in (1, c.shape[0]):
            raise ValueError(f"native plan matmul: a {a.shape}, b {b.shape}, c {c.shape}")
        cdef fl_batched_matmul_args *s = <fl_batched_matmul_args *>self._push(
            fl_batched_matmul_step, sizeof(fl_batched_matmul_args), (a, b, c))
        s.batch, s.m, s.n, s.k = c.shape[0], c.shape[1], c.shape[2], a.shape[2]
        s.sa = 0 if a.shape[0] == 1 else a.shape[1] * a.shape[2]
        s.sb = 0 if b.shape[0] == 1 else b.shape[1] * b.shape[2]
        s.a, s.b, s.c = ap, bp, cp

    def add_dense(self, x, w, pw, bias, y, int code, float alpha):
        """y (..., n) = f(x (..., k) @ w + bias) (gemm.h's matmul), x and y C-contiguous
        float32 (views of the arena): on ``pw``, ``pack``'s output for the (k, n) weights, or
        where it is None on ``w`` (k, n) float32 with contiguous rows, read in place."""
        cdef float *xp = _view(x, "dense x")
        cdef float *yp = _view(y, "dense y")
        cdef float *bp = NULL if bias is None else _view(bias, "dense bias")
        cdef int64_t k = x.shape[x.ndim - 1] if x.ndim else 0, n = y.shape[y.ndim - 1] if y.ndim else 0
        if k < 1 or n < 1 or x.size // k != y.size // n:
            raise ValueError(f"native plan dense: x {x.shape}, y {y.shape}")
        cdef float *wp = NULL
        cdef float *pp = NULL
        cdef int64_t ldw = 0
        cdef cnp.ndarray wa
        if pw is not None:
            pp = _view(pw, "dense packed weights")
            if pw.size < fl_packed_floats(k, n):
                raise ValueError(f"native plan dense: {pw.size} packed floats for ({k}, {n}) weights")
        else:
            if not isinstance(w, cnp.ndarray):
                raise TypeError("native plan dense: weights must be an array where no packed form is given")
            wa = <cnp.ndarray>w
            if wa.ndim != 2 or wa.shape[0] != k or wa.shape[1] != n or cnp.PyArray_TYPE(wa) != cnp.NPY_FLOAT32 \
                    or wa.strides[1] != 4 or wa.strides[0] % 4 or wa.strides[0] < 4 * n \
                    or not cnp.PyArray_ISALIGNED(wa):
                raise ValueError(f"native plan dense: weights must be ({k}, {n}) float32 with contiguous rows")
            wp = <float *>cnp.PyArray_DATA(wa)
            ldw = wa.strides[0] // 4
        if bias is not None and bias.size != n:
            raise ValueError(f"native plan dense: bias of {bias.size} for {n} columns")
        if code < 0 or code >= len(ACTIVATIONS):  # the softmaxes too: over each row of y
            raise ValueError(f"native plan dense: no activation of code {code}")
        cdef fl_dense_args *a = <fl_dense_args *>self._push(fl_dense_step, sizeof(fl_dense_args), (x, w, pw, bias, y))
        a.m, a.n, a.k, a.ldw, a.x, a.w, a.pw, a.bias = x.size // k, n, k, ldw, xp, wp, pp, bp
        a.code, a.alpha, a.y = code, alpha, yp

    def add_rnn(self, tuple call, bint serial):
        """recurrent.h's rnn_loop on ``call`` (``rnn_loop``'s arguments: its states and
        outputs views of the arena, its ids too where it reads a table's rows), on the calling
        thread alone where ``serial``. Ids are read when the step runs: one outside the table
        fails the step with ``BAD_INDEX`` before the loop starts."""
        cdef fl_rnn_step_args *a = <fl_rnn_step_args *>self._push(fl_rnn_step, sizeof(fl_rnn_step_args), call)
        _rnn_args(&a.a, call, True)
        a.serial = serial

    def add_rnn_loops(self, list calls):
        """recurrent.h's rnn_loops on ``calls`` (each loop's ``rnn_loop`` arguments, their
        states and outputs views of the arena; independent loops, at most ``RNN_MAX_LOOPS``),
        one thread each; ids checked as ``add_rnn`` checks them."""
        cdef int64_t n = len(calls), i
        if n < 1 or n > FL_RNN_MAX_LOOPS:
            raise ValueError(f"native plan rnn_loops: {n} loops, expected 1 to {FL_RNN_MAX_LOOPS}")
        cdef fl_rnn_loops_step_args args
        memset(&args, 0, sizeof(args))
        for i in range(n):  # every loop checked before the step is added
            _rnn_args(&args.a[i], calls[i], True)
        args.n = n
        cdef fl_rnn_loops_step_args *a = <fl_rnn_loops_step_args *>self._push(
            fl_rnn_loops_step, sizeof(fl_rnn_loops_step_args), tuple(calls))
        memcpy(a, &args, sizeof(args))

    def add_activation(self, x, y, int code, float alpha, int64_t row=0):
        """y = f(x) elementwise (an activation code of rows.h but the softmaxes) over two
        C-contiguous float32 arrays of one size; with ``row`` > 0, over rows of that many
        values, the softmax codes too (each row normalized)."""
        cdef float *xp = _view(x, "activation x")
        cdef float *yp = _view(y, "activation y")
        if x.size != y.size:
            raise ValueError(f"native plan activation: {x.size} values into {y.size}")
        if row > 0:
            if x.size % row or code < 0 or code >= len(ACTIVATIONS):
                raise ValueError(f"native plan activation: rows of {row} over {x.size} values, code {code}")
        else:
            check_code(code)
        cdef fl_activation_args *a = <fl_activation_args *>self._push(
            fl_activation_step, sizeof(fl_activation_args), (x, y))
        a.size, a.row, a.code, a.alpha, a.x, a.y = x.size, row, code, alpha, xp, yp

    def add_add_act(self, a, b, out, int code, float alpha):
        """out = f(a + b) elementwise (rows.h's add_act, an elementwise activation code) over
        three C-contiguous float32 arrays of one size (out may be a or b)."""
        cdef float *ap = _view(a, "add_act a")
        cdef float *bp = _view(b, "add_act b")
        cdef float *op = _view(out, "add_act out")
        if a.size != b.size or a.size != out.size:
            raise ValueError(f"native plan add_act: {a.size} + {b.size} values into {out.size}")
        check_code(code)
        cdef fl_add_act_args *s = <fl_add_act_args *>self._push(fl_add_act_step, sizeof(fl_add_act_args), (a, b, out))
        s.n, s.a, s.b, s.code, s.alpha, s.out = a.size, ap, bp, code, alpha, op

    def add_elementwise(self, ElementwiseProgram program, int64_t samples, int64_t inner, int64_t c,
                        list operands, out):
        """``program`` over ``operands`` ((kind, float32 array, sample stride) each, as the
        program's call takes them) into C-contiguous float32 ``out`` of samples * inner
        values (elementwise.h)."""
        cdef float *op = _view(out, "elementwise out")
        if len(operands) != program.n_operands or out.size != samples * inner or samples < 0 or inner < 0 \
                or c < 1 or inner % c:
            raise ValueError(f"native plan elementwise: {len(operands)} operands for {program.n_operands}, "
                             f"{out.size} values for {samples} x {inner}")
        arrays = []
        for i, (kind, value, stride) in enumerate(operands):
            a = np.ascontiguousarray(value, np.float32)
            need = ew_operand_floats(kind, samples, inner, c, stride)
            if need < 0 or a.size < need or stride < 0 \
                    or (kind == EW_FULL and (a.size != need or a is not value)):
                raise ValueError(f"native plan elementwise: operand {i} of kind {kind} holds {a.size} "
                                 f"values, needs {need} (a tensor operand C-contiguous float32)")
            arrays.append(a)
        cdef int n = len(operands)
        cdef fl_elementwise_args *a_ = <fl_elementwise_args *>self._push(
            fl_elementwise_step, sizeof(fl_elementwise_args) + n * sizeof(fl_ew_operand),
            (program, arrays, out))
        a_.samples, a_.inner, a_.c, a_.out = samples, inner, c, op
        a_.n_insns, a_.n_regs, a_.n_operands, a_.insns = program.n_insns, program.n_regs, n, program.insns
        for i in range(n):
            a_.operands[i].kind = operands[i][0]
            a_.operands[i].p = <const float *>cnp.PyArray_DATA(arrays[i])
            a_.operands[i].stride = operands[i][2]

    def add_dynamic_qgemm(self, x, pb, b_columns, bias, y):
        """quantize.pxi's ``dynamic_qgemm`` from x (..., k) into y (..., n), both C-contiguous
        float32 (views of the arena): ``pb`` b packed by ``qpack``, ``b_columns`` its (n,)
        float32 column scales, ``bias`` (n,) float32 or None."""
        cdef const float *xp = _view(x, "dynamic_qgemm x")
        cdef float *yp = _view(y, "dynamic_qgemm y")
        if x.ndim < 1 or x.shape[x.ndim - 1] < 1 or y.ndim < 1:
            raise ValueError(f"native plan dynamic_qgemm: x of shape {x.shape}")
        cdef int64_t k = x.shape[x.ndim - 1], m = x.size // k, n = y.shape[y.ndim - 1]
        if y.size != m * n:
            raise ValueError(f"native plan dynamic_qgemm: y of shape {y.shape} for x of shape {x.shape}")
        cdef const float *columns = _f32_block(b_columns, (n,), "native plan dynamic_qgemm b_columns")
        _check_packed(pb, k, n, "native plan dynamic_qgemm: pb")
        cdef const float *bp = _f32_block(bias, (n,), "native plan dynamic_qgemm bias")
        cdef _dynamic_qgemm_args *a = <_dynamic_qgemm_args *>self._push(
            _dynamic_qgemm_step, sizeof(_dynamic_qgemm_args), (x, pb, b_columns, bias, y))
        a.x, a.m, a.k, a.n, a.pb, a.columns, a.bias, a.y = xp, m, k, n, <const int8_t *>cnp.PyArray_DATA(pb), \
            columns, bp, yp

    def add_dynamic_qlstm(self, x, w_packed, w_scale, bint reverse, r_packed, r_scale, bias, peep,
                          float clip, bint input_forget, h, c, y, x_proj):
        """qlstm.pxi's ``dynamic_qlstm`` on views of the arena: x (steps, batch, input), the
        states h and c (batch, hidden), y (steps, batch, hidden) or None, and ``x_proj``
        (steps, batch, 4 hidden) for the input product (``add_dynamic_qlstms`` of one
        direction)."""
        self.add_dynamic_qlstms(
            x, [(w_packed, w_scale, reverse, r_packed, r_scale, bias, peep, clip, input_forget, h, c, y, x_proj)])

    def add_dynamic_qlstms(self, x, list directions):
        """``add_dynamic_qlstm`` for the directions of one layer (at most
        ``DYNAMIC_QLSTM_DIRECTIONS``) in one step, each a tuple of its arguments after x: their
        input products, then their loops side by side (``qlstm_runs``); y (steps, ..., batch,
        hidden) with contiguous rows, a direction's part of the layer's output."""
        cdef int64_t n = len(directions), d
        if n < 1 or n > DYNAMIC_QLSTM_DIRECTIONS:
            raise ValueError(f"native plan dynamic_qlstm: {n} directions, expected 1 to {DYNAMIC_QLSTM_DIRECTIONS}")
        cdef const float *xp = _view(x, "dynamic_qlstm x")
        cdef _dynamic_qlstm_args args
        memset(&args, 0, sizeof(args))
        cdef int64_t steps, batch, k, g
        cdef const float *columns
        for d in range(n):  # every direction checked before the step is added
            w_packed, w_scale, reverse, r_packed, r_scale, bias, peep, clip, input_forget, h, c, y, x_proj = \
                directions[d]
            _view(x_proj, "dynamic_qlstm x_proj")
            if x.ndim != 3 or h.ndim != 2 or x_proj.shape != (x.shape[0], x.shape[1], 4 * h.shape[1]):
                raise ValueError("native plan dynamic_qlstm: x must be (steps, batch, input), h (batch, hidden) "
                                 "and x_proj (steps, batch, 4 hidden)")
            steps, batch, k, g = x.shape[0], x.shape[1], x.shape[2], 4 * h.shape[1]
            columns = _f32_block(w_scale, (g,), "native plan dynamic_qlstm w_scale")
            _check_packed(w_packed, k, g, "native plan dynamic_qlstm: w_packed")
            _qlstm_run(&args.run[d], x_proj, reverse, r_packed, r_scale, bias, peep, clip, input_forget, h, c, y)
            args.product[d].x, args.product[d].m, args.product[d].k, args.product[d].n = xp, steps * batch, k, g
            args.product[d].pb, args.product[d].columns = <const int8_t *>cnp.PyArray_DATA(w_packed), columns
            args.product[d].bias, args.product[d].y = NULL, <float *>args.run[d].x_proj
        args.n = n
        cdef _dynamic_qlstm_args *a = <_dynamic_qlstm_args *>self._push(
            _dynamic_qlstm_step, sizeof(_dynamic_qlstm_args), (x, tuple(directions)))
        memcpy(a, &args, sizeof(args))

    def add_layer_norm(self, x, gamma, beta, float eps, bint rms, out):
        """rows.h's layer_norm over the rows of x (..., n) into ``out`` of its shape, both
        C-contiguous float32; ``gamma``, ``beta``: (n,) C-contiguous float32 or None."""
        cdef float *xp = _view(x, "layer_norm x")
        cdef float *op = _view(out, "layer_norm out")
        if x.ndim < 1 or x.shape[x.ndim - 1] < 1 or out.size != x.size:
            raise ValueError(f"native plan layer_norm: x of shape {x.shape} into {out.size} values")
        cdef int64_t n = x.shape[x.ndim - 1]
        cdef const float *gp = _f32_block(gamma, (n,), "native plan layer_norm gamma")
        cdef const float *bp = _f32_block(beta, (n,), "native plan layer_norm beta")
        cdef fl_layer_norm_args *a = <fl_layer_norm_args *>self._push(
            fl_layer_norm_step, sizeof(fl_layer_norm_args), (x, gamma, beta, out))
        a.m, a.n, a.x, a.gamma, a.beta, a.eps, a.rms, a.out = x.size // n, n, xp, gp, bp, eps, rms, op

    def add_attention(self, q, k, v, out, float scale, bias=None, int empty=0):
        """attention.h's attention (the weights not kept): out[b, h] = softmax(scale q k^T +
        bias) v for float32 q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) and out (B, H,
        Tq, Dv), 4-D views with contiguous rows and whole-float strides (of the arena, or
        constants); ``bias`` (B|1, H|1, Tq|1, Tk) with contiguous keys, or None; ``empty`` as
        in ``attention``."""
        for arr, what in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            if not isinstance(arr, cnp.ndarray) or arr.dtype != np.float32 or arr.ndim != 4 or (
                    arr.shape[3] > 1 and arr.strides[3] != 4):
                raise ValueError(f"native plan attention: {what} must be a 4-D float32 view with contiguous rows")
        cdef int64_t nb = q.shape[0], nh = q.shape[1], tq = q.shape[2], d = q.shape[3]
        cdef int64_t tk = k.shape[2], dv = v.shape[3]
        if (k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2] or out.shape != (nb, nh, tq, dv)
                or k.shape[3] != d or v.shape[2] != tk or min(nb, nh, tq, tk, d, dv) < 1):
            raise ValueError(f"native plan attention: q {q.shape}, k {k.shape}, v {v.shape}, out {out.shape}")
        if bias is not None and (not isinstance(bias, cnp.ndarray) or bias.dtype != np.float32 or (
                tk > 1 and bias.strides[3] != 4)):
            raise ValueError("native plan attention: the bias must be a float32 view with contiguous keys")
        cdef fl_attention_step_args args
        memset(&args, 0, sizeof(args))
        strides3(q, args.q_st, "native plan attention q")
        strides3(k, args.k_st, "native plan attention k")
        strides3(v, args.v_st, "native plan attention v")
        strides3(out, args.out_st, "native plan attention out")
        args.bias = bias4(bias, nb, nh, tq, tk, args.bias_st)
        args.q, args.k, args.v = fptr(q, "attention q"), fptr(k, "attention k"), fptr(v, "attention v")
        args.out = fptr(out, "attention out")
        args.nb, args.nh, args.tq, args.tk, args.d, args.dv = nb, nh, tq, tk, d, dv
        args.scale, args.causal, args.empty = scale, 0, empty
        cdef fl_attention_step_args *a = <fl_attention_step_args *>self._push(
            fl_attention_step, sizeof(fl_attention_step_args), (q, k, v, out, bias))
        memcpy(a, &args, sizeof(args))

    def add_loop(self, NativePlan body, trips, cond, cond_out, counter, int64_t most, int64_t expect,
                 init, before, after):
        """A step running ``body``'s steps as an ONNX Loop or Scan does (plan.h's loop_step):
        ``trips`` an int64 array of one value (the trip count) or None, ``cond`` / ``cond_out``
        bool arrays of one value (the first condition, the body's condition output) or None
        (true), ``counter`` an int64 array of one value that receives each iteration's number
        or None, ``most`` / ``expect`` -1 or the iteration limit / the iterations the stacked
        outputs hold; ``init`` (once), ``before`` and ``after`` (each iteration t) lists of
        copies (src, dst, src_step, dst_step): dst's bytes, at t dst_step bytes on, from src's
        at t src_step, where src and dst are C-contiguous arrays of as many bytes and every
        iteration's bytes lie inside their owners (checked here). ``body`` is kept by this
        plan and must not grow after."""
        for arr, what, dtype in ((trips, "trip count", np.int64), (cond, "condition", np.bool_),
                                 (cond_out, "condition output", np.bool_), (counter, "counter", np.int64)):
            if arr is not None and (not isinstance(arr, cnp.ndarray) or arr.dtype != dtype or arr.size != 1):
                raise TypeError(f"native plan loop: the {what} must be a {np.dtype(dtype)} array of one value")
        if counter is not None and not counter.flags.writeable:
            raise ValueError("native plan loop: the counter is read-only")
        if most < -1 or expect < -1:
            raise ValueError(f"native plan loop: iteration limit {most} and expected iterations {expect}")
        lists = (init, before, after)
        cdef int64_t total = sum(len(c) for c in lists), k = 0, last
        copies_bytes = np.zeros(max(total, 1) * sizeof(fl_loop_copy), np.uint8)
        cdef fl_loop_copy *copies = <fl_loop_copy *>cnp.PyArray_DATA(copies_bytes)
        held = [body, copies_bytes, trips, cond, cond_out, counter]
        for group, copy_list in enumerate(lists):
            for src, dst, src_step, dst_step in copy_list:
                for arr, what in ((src, "source"), (dst, "destination")):
                    if not isinstance(arr, cnp.ndarray) or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
                        raise TypeError(f"native plan loop: a copy's {what} must be a C-contiguous array")
                if not dst.flags.writeable:
                    raise ValueError("native plan loop: a copy's destination is read-only")
                # every iteration's bytes inside src's and dst's owners: the first t of a group
                # before and after is 0, and its last is the stacked outputs' (expect - 1)
                last = 0 if group == 0 else max(expect - 1, 0)
                if (src_step or dst_step) and (group == 0 or expect < 0):
                    raise ValueError("native plan loop: a stepped copy needs the iterations it runs")
                for arr, step in ((src, src_step), (dst, dst_step)):
                    base = arr.base if isinstance(arr.base, cnp.ndarray) else arr
                    start, end = base.ctypes.data, base.ctypes.data + base.nbytes
                    for lo in (arr.ctypes.data, arr.ctypes.data + last * step):
                        if lo < start or lo + arr.nbytes > end:
                            raise ValueError("native plan loop: a copy reaches past its array's memory")
                if src.nbytes != dst.nbytes:
                    raise ValueError(f"native plan loop: a copy of {src.nbytes} bytes into {dst.nbytes}")
                copies[k].src, copies[k].dst = <const char *>cnp.PyArray_DATA(src), <char *>cnp.PyArray_DATA(dst)
                copies[k].nbytes, copies[k].src_step, copies[k].dst_step = dst.nbytes, src_step, dst_step
                held.append((src, dst))
                k += 1
        cdef fl_loop_args *a = <fl_loop_args *>self._push(fl_loop_step, sizeof(fl_loop_args), held)
        a.body, a.nbody, a.most, a.expect = body.steps, body.n, most, expect
        a.trips = NULL if trips is None else <const int64_t *>cnp.PyArray_DATA(trips)
        a.cond = NULL if cond is None else <const unsigned char *>cnp.PyArray_DATA(cond)
        a.cond_out = NULL if cond_out is None else <const unsigned char *>cnp.PyArray_DATA(cond_out)
        a.counter = NULL if counter is None else <int64_t *>cnp.PyArray_DATA(counter)
        a.ninit, a.nbefore, a.nafter = len(init), len(before), len(after)
        a.init = copies
        a.before = copies + a.ninit
        a.after = copies + a.ninit + a.nbefore

    def add_python(self, fn):
        """A step calling ``fn()`` with the GIL held: it returns 0, or nonzero on failure
        (keeping its error for the caller)."""
        if not callable(fn):
            raise TypeError("native plan: a Python step must be callable")
        self._push(_python_step, 0, fn)
        self.steps[self.n - 1].ctx = <void *>fn

    def read_in_place(self, list input_views, list movable):
        """Let the steps bound so far read each input ``k`` where ``movable[k]`` from the
        caller's array itself: ``run`` then points them at an array of the view's shape and
        type, C-contiguous and aligned, instead of copying it into ``input_views[k]`` (memory
        of that input alone, which no Python step reads and no output view shares). The
        steps' contexts hold the addresses of the views they were bound to, so the words of
        the contexts that point into an input's view are found once here and rewritten by
        ``run`` when the array's address changes."""
        if len(input_views) != len(movable):
            raise ValueError(f"native plan: {len(input_views)} input views, {len(movable)} flags")
        cdef int64_t i, w, nwords
        cdef uintptr_t start, end, word
        cdef uintptr_t *words
        self.moves, self.bases = [], []
        for view, move in zip(input_views, movable):
            if not move:
                self.moves.append(None)
                self.bases.append(0)
                continue
            if not isinstance(view, cnp.ndarray) or not cnp.PyArray_IS_C_CONTIGUOUS(view):
                raise TypeError("native plan: an input view must be a C-contiguous array")
            start = <uintptr_t>cnp.PyArray_DATA(view)
            end = start + <uintptr_t>cnp.PyArray_NBYTES(view)
            addresses, offsets = [], []
            for i in range(self.n):
                words = <uintptr_t *>self.owned[i]
                nwords = <int64_t>(self.sizes[i] // sizeof(uintptr_t))
                for w in range(nwords):
                    word = words[w]
                    if start <= word < end:
                        addresses.append(<uintptr_t>&words[w])
                        offsets.append(word - start)
            self.moves.append((np.array(addresses, np.uintp), np.array(offsets, np.uintp)))
            self.bases.append(start)

    def run(self, list inputs, list input_views, list output_views, object timings=None):
        """Copy each of ``inputs`` into its view (cast as numpy's copyto), or point the steps
        at it where ``read_in_place`` allows and it is a C-contiguous aligned array of the
        view's shape and type; run the steps, and return a copy of each output view; None
        where another call runs this plan now. ``timings``: None, or an int64 array of one
        value per step that receives the nanoseconds each took. Raises ``PlanStepFailed`` for
        a failing step."""
        cdef int64_t *ns = NULL
        if timings is not None:
            if not isinstance(timings, cnp.ndarray) or cnp.PyArray_TYPE(timings) != cnp.NPY_INT64 \
                    or not cnp.PyArray_IS_C_CONTIGUOUS(timings) or timings.size != self.n:
                raise ValueError(f"native plan: timings must be a C-contiguous int64 array of {self.n} values")
            ns = <int64_t *>cnp.PyArray_DATA(timings)
        if self.busy:
            return None
        self.busy = True
        cdef int st = 0
        cdef int64_t failed = -1
        cdef bint same
        cdef int64_t k = 0
        cdef uintptr_t base
        try:
            for a, v in zip(inputs, input_views, strict=True):
                move = self.moves[k] if k < len(self.moves) else None
                same = (type(a) is np.ndarray and cnp.PyArray_TYPE(a) == cnp.PyArray_TYPE(v)
                        and cnp.PyArray_IS_C_CONTIGUOUS(a) and a.shape == v.shape)
                if same and move is not None and cnp.PyArray_ISALIGNED(a):
                    base = <uintptr_t>cnp.PyArray_DATA(a)
                else:
                    if same:
                        memcpy(cnp.PyArray_DATA(v), cnp.PyArray_DATA(a), cnp.PyArray_NBYTES(a))
                    else:
                        np.copyto(v, a, casting="unsafe")
                    base = <uintptr_t>cnp.PyArray_DATA(v)
                if move is not None and base != <uintptr_t>self.bases[k]:
                    _point(move, base)
                    self.bases[k] = base
                k += 1
            with nogil:
                st = fl_plan_run(self.steps, self.n, &failed, ns)
            if st:
                raise PlanStepFailed(failed, st)
            return [v.copy() for v in output_views]
        finally:
            self.busy = False
