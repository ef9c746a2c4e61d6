# Attention and the Transformer encoder layer (attention.h).

cdef extern from "dispatch.h" nogil:
    int fl_attention_softmax(int64_t nb, int64_t nh, int64_t tq, int64_t tk, float *s,
                             float scale, const float *bias, const int64_t *bias_st, int causal,
                             int empty)
    int fl_attention(int64_t nb, int64_t nh, int64_t tq, int64_t tk, int64_t d, int64_t dv,
                     const float *q, const int64_t *q_st, const float *k, const int64_t *k_st,
                     const float *v, const int64_t *v_st, float scale, const float *bias,
                     const int64_t *bias_st, int causal, int empty, float *s, float *out,
                     const int64_t *out_st)
    int fl_encoder_layer(int64_t n, int64_t len, int64_t e, int64_t heads, int64_t f,
                         const float *x, const float *const *pw, const float *const *vec,
                         float eps1, float eps2, int code, int norm_first, const float *bias,
                         const int64_t *bias_st, int empty, float *s, float *out)


cdef int strides3(cnp.ndarray a, int64_t *st, str what) except -1:
    """st = the (batch, head, row) strides of 4-D ``a`` in floats."""
    if a.ndim != 4:
        raise ValueError(f"{what}: expected a 4-D array, got {a.ndim}-D")
    for i in range(3):
        if a.strides[i] % 4:
            raise ValueError(f"{what}: strides must be whole floats")
        st[i] = a.strides[i] // 4
    return 0


cdef float *bias4(object bias, int64_t nb, int64_t nh, int64_t tq, int64_t tk,
                  int64_t *st) except? NULL:
    """The data of a (nb|1, nh|1, tq|1, tk) float32 bias and its (batch, head, query) strides
    in ``st``, 0 along an axis of one entry; NULL for None."""
    if bias is None:
        return NULL
    cdef cnp.ndarray b = bias
    cdef float *p = fptr(b, "attention bias")
    strides3(b, st, "attention bias")
    cdef int64_t want[3]
    want[0], want[1], want[2] = nb, nh, tq
    for i in range(3):
        if b.shape[i] == 1:
            st[i] = 0
        elif b.shape[i] != want[i]:
            raise ValueError(f"attention bias {bias.shape} does not broadcast to the scores")
    if b.shape[3] != tk:
        raise ValueError(f"attention bias {bias.shape} does not broadcast to the scores")
    return p


def attention_softmax(cnp.ndarray s, float scale, object bias, bint causal, int empty):
    """s = softmax(scale s + bias (+ -inf past the diagonal when ``causal``)) over the last axis
    of C-contiguous (B, H, Tq, Tk) ``s``, in place; ``bias`` (B|1, H|1, Tq|1, Tk) or None; a
    row with every key masked becomes NaN, 0 or 1/Tk for ``empty`` 0, 1, 2. Returns ``s``."""
    cdef float *sp = fptr(s, "attention_softmax s")
    if s.ndim != 4 or not cnp.PyArray_IS_C_CONTIGUOUS(s):
        raise ValueError("attention_softmax: s must be a C-contiguous 4-D array")
    cdef int64_t nb = s.shape[0], nh = s.shape[1], tq = s.shape[2], tk = s.shape[3]
    cdef int64_t bst[3]
    cdef float *bp = bias4(bias, nb, nh, tq, tk, bst)
    cdef int st
    with nogil:
        st = fl_attention_softmax(nb, nh, tq, tk, sp, scale, bp, bst, causal, empty)
    check(st, "attention_softmax")
    return s


def attention(cnp.ndarray q, cnp.ndarray k, cnp.ndarray v, float scale, object bias,
              bint causal, int empty, object s, cnp.ndarray out):
    """out[b, h] = softmax(scale q k^T + bias) v per (batch, head) pair, the weights written to
    ``s`` (C-contiguous (B, H, Tq, Tk); None: not kept). q (B, H, Tq, D), k (B, H, Tk, D),
    v (B, H, Tk, Dv), out (B, H, Tq, Dv): any whole-float strides, rows contiguous (views
    are read in place); ``bias``, ``empty`` as in ``attention_softmax``. Returns ``out``."""
    cdef int64_t qst[3]
    cdef int64_t kst[3]
    cdef int64_t vst[3]
    cdef int64_t ost[3]
    cdef int64_t bst[3]
    cdef float *qp = fptr(q, "attention q")
    cdef float *kp = fptr(k, "attention k")
    cdef float *vp = fptr(v, "attention v")
    cdef float *op = fptr(out, "attention out")
    strides3(q, qst, "attention q")
    strides3(k, kst, "attention k")
    strides3(v, vst, "attention v")
    strides3(out, ost, "attention out")
    cdef int64_t nb = q.shape[0], nh = q.shape[1], tq = q.shape[2], d = q.shape[3]
    cdef int64_t tk = k.shape[2], dv = v.shape[3]
    if (k.shape[0] != nb or v.shape[0] != nb or out.shape[0] != nb or k.shape[1] != nh
            or v.shape[1] != nh or out.shape[1] != nh or k.shape[3] != d or v.shape[2] != tk
            or out.shape[2] != tq or out.shape[3] != dv):
        raise ValueError("attention: q, k, v and out shapes do not match")
    cdef float *sp = NULL
    cdef cnp.ndarray sa
    if s is not None:
        sa = s
        sp = fptr(sa, "attention weights")
        if (sa.ndim != 4 or not cnp.PyArray_IS_C_CONTIGUOUS(sa) or sa.shape[0] != nb
                or sa.shape[1] != nh or sa.shape[2] != tq or sa.shape[3] != tk):
            raise ValueError("attention: weights must be a C-contiguous (B, H, Tq, Tk) array")
    cdef float *bp = bias4(bias, nb, nh, tq, tk, bst)
    cdef int st
    with nogil:
        st = fl_attention(nb, nh, tq, tk, d, dv, qp, qst, kp, kst, vp, vst, scale, bp, bst,
                          causal, empty, sp, op, ost)
    check(st, "attention")
    return out


def encoder_layer(cnp.ndarray x, int64_t n, int64_t heads, int64_t f, tuple packed,
                  tuple vectors, float eps1, float eps2, int code, bint norm_first,
                  object bias, int empty, object s, cnp.ndarray out):
    """One Transformer encoder layer (ReferenceOps.encoder_layer) on C-contiguous ``x``
    (n L, E) into ``out`` (n L, E): ``packed`` the packed (``pack``) w_qkv (E, 3E), w_o (E, E),
    w_1 (E, f), w_2 (f, E); ``vectors`` b_qkv, b_o, b_1, b_2, gamma1, beta1, gamma2, beta2
    (float32, None for none); the feed-forward activation ``code``; ``bias``, ``empty`` as in
    ``attention``; the weights written to ``s`` (n, heads, L, L), or None. Returns ``out``.
    With ``f`` 0 the attention block alone (ReferenceOps.self_attention): ``packed`` and
    ``vectors`` need only their first two entries."""
    cdef int64_t m = x.shape[0], e = x.shape[1]
    if n <= 0 or m % n or x.ndim != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(x) or out.ndim != 2 \
            or not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.shape[0] != m or out.shape[1] != e:
        raise ValueError("encoder_layer: x and out must be C-contiguous (n L, E) arrays")
    cdef int64_t length = m // n
    cdef const float *pw[4]
    cdef const float *vec[8]
    cdef int64_t kn[4][2]
    kn[0] = [e, 3 * e]
    kn[1] = [e, e]
    kn[2] = [e, f]
    kn[3] = [f, e]
    cdef int64_t sizes[8]
    sizes[:] = [3 * e, e, f, e, e, e, e, e]
    cdef cnp.ndarray a
    if f < 0 or (f == 0 and norm_first) or len(packed) < (2 if f == 0 else 4) \
            or len(vectors) < (2 if f == 0 else 8):
        raise ValueError("encoder_layer: f < 0, or too few packed weights or vectors for f")
    for i in range(8):
        vec[i] = NULL
        if i < 4:
            pw[i] = NULL
    for i in range(2 if f == 0 else 4):
        a = packed[i]
        pw[i] = fptr(a, "encoder_layer weights")
        if a.size < fl_packed_floats(kn[i][0], kn[i][1]):
            raise ValueError("encoder_layer: a packed weight is smaller than its shape needs")
    for i in range(2 if f == 0 else 8):
        vec[i] = optf(vectors[i], "encoder_layer vectors")
        if vec[i] != NULL and (<cnp.ndarray>vectors[i]).size != sizes[i]:
            raise ValueError("encoder_layer: a bias or norm vector has the wrong size")
    cdef float *xp = fptr(x, "encoder_layer x")
    cdef float *op = fptr(out, "encoder_layer out")
    cdef float *sp = NULL
    cdef cnp.ndarray sa
    if s is not None:
        sa = s
        sp = fptr(sa, "encoder_layer weights")
        if (sa.ndim != 4 or not cnp.PyArray_IS_C_CONTIGUOUS(sa) or sa.shape[0] != n
                or sa.shape[1] != heads or sa.shape[2] != length or sa.shape[3] != length):
            raise ValueError("encoder_layer: weights must be a C-contiguous (n, H, L, L) array")
    cdef int64_t bst[3]
    cdef float *bp = bias4(bias, n, heads, length, length, bst)
    cdef int st
    with nogil:
        st = fl_encoder_layer(n, length, e, heads, f, xp, pw, vec, eps1, eps2, code,
                              norm_first, bp, bst, empty, sp, op)
    check(st, "encoder_layer")
    return out
