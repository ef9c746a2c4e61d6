# Convolutions (conv.h).

cdef extern from "dispatch.h" nogil:
    int fl_conv2d(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                  int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,
                  const float *pw, const float *bias, int code, float alpha, const float *res,
                  int res_code, float res_alpha, int method, float *y)
    int fl_winograd_pack(int tile, int64_t cin, int64_t cout, const float *w, float *pu)
    int fl_conv3x3_winograd(int tile, int64_t n, int64_t h, int64_t w, int64_t cin,
                            const float *x, int64_t pt, int64_t pl, int64_t ho, int64_t wo,
                            int64_t cout, const float *pu, const float *bias, int code,
                            float alpha, float *y)
    int fl_depthwise_conv2d(int64_t n, int64_t h, int64_t w, int64_t c, const float *x,
                            int64_t kh, int64_t kw, int64_t m, int64_t sh, int64_t sw,
                            int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                            int64_t wo, const float *wk, const float *bias, int code,
                            float alpha, float *y)
    int fl_conv_transpose2d(int64_t n, int64_t h, int64_t w, int64_t cin, const float *x,
                            int64_t kh, int64_t kw, int64_t cout_g, int64_t groups, int64_t sh,
                            int64_t sw, int64_t dh, int64_t dw, int64_t ct, int64_t cl,
                            int64_t ho, int64_t wo, const float *pw, const float *bias,
                            int code, float alpha, float *y)
    int fl_conv_transpose2d_nchw(int64_t n, int64_t cin, int64_t h, int64_t w, const float *x,
                                 int64_t kh, int64_t kw, int64_t cout_g, int64_t groups,
                                 int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ct,
                                 int64_t cl, int64_t ho, int64_t wo, const float *wt,
                                 const float *bias, int code, float alpha, float *y)
    int fl_depthwise_conv2d_nchw(int64_t n, int64_t c, int64_t h, int64_t w, const float *x,
                                 int64_t m, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                 int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                                 int64_t wo, const float *wk, const float *bias, int code,
                                 float alpha, float *y)
    int fl_conv2d_nchw_in(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                          int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                          int64_t pl, int64_t ho, int64_t wo, int64_t cout, const float *wk,
                          const float *bias, int code, float alpha, float *y)
    int fl_conv2d_planes(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                         int64_t pl, int64_t ho, int64_t wo, int64_t cout, const float *wk,
                         const float *bias, int code, float alpha, float *y)
    int fl_conv1x1_nchw(int64_t n, int64_t cin, int64_t hw, int64_t cout, const float *x,
                        const float *wk, int64_t ldw, const float *bias, int code, float alpha,
                        float *y)

#: conv2d's ways: chosen by the kernel, the implicit GEMM, im2col + sgemm, dot products along
#: the window rows (one group, no width dilation, at most 4 output channels, 6 on the avx512
#: path).
CONV_AUTO, CONV_IMPLICIT, CONV_IM2COL, CONV_DOT = 0, 1, 2, 3


cdef inline int check_code(int code) except -1:
    if code < 0 or code >= len(ACTIVATIONS) or ACTIVATIONS[code] in ("softmax", "log_softmax"):
        raise ValueError(f"convolution epilogues take elementwise activations, got code {code}")
    return 0


def conv_pack(cnp.ndarray w_hwio, int64_t groups):
    """Each group's weights of ``w_hwio`` (kh, kw, C / groups, C_out) packed for ``conv2d``:
    group g's (kh kw C / groups, C_out / groups) at ``g * packed_floats``."""
    cptr(w_hwio, 4, "conv_pack w")
    cdef int64_t k = w_hwio.shape[0] * w_hwio.shape[1] * w_hwio.shape[2]
    cdef int64_t cout = w_hwio.shape[3]
    if groups < 1 or cout % groups:
        raise ValueError(f"conv_pack: {cout} output channels in {groups} groups")
    cdef int64_t co = cout // groups
    w2 = w_hwio.reshape(k, cout)
    if groups == 1:
        return pack(w2)
    return np.concatenate([pack(w2[:, g * co:(g + 1) * co]) for g in range(groups)])


def conv2d(cnp.ndarray x, cnp.ndarray pw, object bias, cnp.ndarray y, int64_t kh, int64_t kw,
           int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
           int64_t groups, int code, float alpha, int method=CONV_AUTO, object res=None,
           int res_code=0, float res_alpha=0.0):
    """y = f(conv(x, w) + bias) on x (N, H, W, C) zero-padded by ``pt`` rows on top and ``pl``
    columns on the left (the bottom and right padding follow from y (N, Ho, Wo, C_out)), w
    given packed by ``conv_pack`` (kernel kh x kw, ``groups`` groups), strides ``sh``, ``sw``,
    dilations ``dh``, ``dw``; f the elementwise activation ``code``. ``method``: CONV_AUTO,
    CONV_IMPLICIT (one group), CONV_IM2COL or CONV_DOT (one group, ``dw`` 1, at most 4 output
    channels, 6 on the avx512 path). With ``res`` (C-contiguous float32 of y's shape,
    not y), then y = g(y + res), g the elementwise activation ``res_code`` (a residual Add and
    its activation, run on each block of output rows while it is in cache)."""
    cdef float *xp = cptr(x, 4, "conv2d x")
    cdef float *yp = cptr(y, 4, "conv2d y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef int64_t ho = y.shape[1], wo = y.shape[2], cout = y.shape[3]
    if (y.shape[0] != n or min(kh, kw, sh, sw, dh, dw, groups) < 1 or pt < 0 or pl < 0
            or c % groups or cout % groups):
        raise ValueError("conv2d: inconsistent shapes, strides or groups")
    if pw.size < groups * fl_packed_floats(kh * kw * (c // groups), cout // groups):
        raise ValueError("conv2d: the packed weights are too small for this kernel")
    cdef float *pp = cptr(pw, 1, "conv2d packed w")
    cdef float *bp = vptr(bias, cout, "conv2d bias")
    check_code(code)
    if res is not None and ((<object>res).shape != (<object>y).shape or res is y):
        raise ValueError(f"conv2d res: expected an array of y's shape {(<object>y).shape} other than y")
    cdef float *rp = vptr(res, y.size, "conv2d res")
    if res is not None:
        check_code(res_code)
    cdef int st
    with nogil:
        st = fl_conv2d(n, h, w, c, xp, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, pp,
                       bp, code, alpha, rp, res_code, res_alpha, method, yp)
    check(st, "conv2d")
    return y


def winograd_pack(cnp.ndarray w_hwio, int tile=2):
    """U[e] = (G w G^T)[a, b] (e = (tile + 2) a + b) of the 3x3 kernel ``w_hwio`` (3, 3, C,
    C_out) for Winograd F(tile x tile, 3x3), ``tile`` 2 or 4, each packed for
    ``conv3x3_winograd`` (a new 1-D array of (tile + 2)^2 blocks)."""
    cdef float *wp = cptr(w_hwio, 4, "winograd_pack w")
    if w_hwio.shape[0] != 3 or w_hwio.shape[1] != 3:
        raise ValueError("winograd_pack: expected a 3x3 kernel")
    if tile != 2 and tile != 4:
        raise ValueError(f"winograd_pack: tile must be 2 or 4, got {tile}")
    cdef int64_t cin = w_hwio.shape[2], cout = w_hwio.shape[3]
    out = np.empty((tile + 2) ** 2 * fl_packed_floats(cin, cout), np.float32)
    cdef float *pu = <float *>cnp.PyArray_DATA(out)
    cdef int st
    with nogil:
        st = fl_winograd_pack(tile, cin, cout, wp, pu)
    check(st, "winograd_pack")
    return out


def conv3x3_winograd(cnp.ndarray x, cnp.ndarray pu, object bias, cnp.ndarray y, int64_t pt,
                     int64_t pl, int code, float alpha, int tile=2):
    """y = f(conv3x3(x, w) + bias), stride 1, one group, x (N, H, W, C) zero-padded by ``pt``
    rows on top and ``pl`` columns on the left, y (N, Ho, Wo, C_out), w given by
    ``winograd_pack`` of the same ``tile``: Winograd F(tile x tile, 3x3). Returns whether every
    output before f is finite (False: a NaN or inf input, or an overflow in the transforms;
    convolve directly for the exact result)."""
    cdef float *xp = cptr(x, 4, "conv3x3_winograd x")
    cdef float *yp = cptr(y, 4, "conv3x3_winograd y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], cin = x.shape[3]
    cdef int64_t ho = y.shape[1], wo = y.shape[2], cout = y.shape[3]
    if y.shape[0] != n or pt < 0 or pl < 0:
        raise ValueError("conv3x3_winograd: inconsistent shapes")
    if tile != 2 and tile != 4:
        raise ValueError(f"conv3x3_winograd: tile must be 2 or 4, got {tile}")
    if pu.size < (tile + 2) ** 2 * fl_packed_floats(cin, cout):
        raise ValueError("conv3x3_winograd: the transformed weights are too small")
    cdef float *pp = cptr(pu, 1, "conv3x3_winograd U")
    cdef float *bp = vptr(bias, cout, "conv3x3_winograd bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_conv3x3_winograd(tile, n, h, w, cin, xp, pt, pl, ho, wo, cout, pp, bp, code,
                                 alpha, yp)
    if st == 1:
        return False
    check(st, "conv3x3_winograd")
    return True


def depthwise_conv2d(cnp.ndarray x, cnp.ndarray w_hwcm, object bias, cnp.ndarray y,
                     int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                     int code, float alpha):
    """y[n, oh, ow, c m + q] = f(bias + sum_{i, j} x[n, oh sh - pt + i dh, ow sw - pl + j dw, c]
    w[i, j, c, q]) (zeros outside x), x (N, H, W, C), ``w_hwcm`` (kh, kw, C, m), y (N, Ho, Wo,
    C m)."""
    cdef float *xp = cptr(x, 4, "depthwise_conv2d x")
    cdef float *wp = cptr(w_hwcm, 4, "depthwise_conv2d w")
    cdef float *yp = cptr(y, 4, "depthwise_conv2d y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef int64_t kh = w_hwcm.shape[0], kw = w_hwcm.shape[1], m = w_hwcm.shape[3]
    if (y.shape[0] != n or w_hwcm.shape[2] != c or y.shape[3] != c * m
            or min(kh, kw, sh, sw, dh, dw) < 1 or pt < 0 or pl < 0):
        raise ValueError("depthwise_conv2d: inconsistent shapes or steps")
    cdef float *bp = vptr(bias, c * m, "depthwise_conv2d bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_depthwise_conv2d(n, h, w, c, xp, kh, kw, m, sh, sw, dh, dw, pt, pl, y.shape[1],
                                 y.shape[2], wp, bp, code, alpha, yp)
    check(st, "depthwise_conv2d")
    return y


def depthwise_conv2d_nchw(cnp.ndarray x, cnp.ndarray w_ohw, object bias, cnp.ndarray y,
                          int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                          int code, float alpha):
    """y[n, c m + q, oh, ow] = f(bias + sum_{i, j} x[n, c, oh sh - pt + i dh, ow sw - pl + j dw]
    w[c m + q, i, j]) (zeros outside x), x (N, C, H, W), ``w_ohw`` (C m, kh, kw), y (N, C m, Ho,
    Wo)."""
    cdef float *xp = cptr(x, 4, "depthwise_conv2d_nchw x")
    cdef float *wp = cptr(w_ohw, 3, "depthwise_conv2d_nchw w")
    cdef float *yp = cptr(y, 4, "depthwise_conv2d_nchw y")
    cdef int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3]
    cdef int64_t cm = w_ohw.shape[0], kh = w_ohw.shape[1], kw = w_ohw.shape[2]
    if (c == 0 or cm % c or y.shape[0] != n or y.shape[1] != cm
            or min(kh, kw, sh, sw, dh, dw) < 1 or pt < 0 or pl < 0):
        raise ValueError("depthwise_conv2d_nchw: inconsistent shapes or steps")
    cdef float *bp = vptr(bias, cm, "depthwise_conv2d_nchw bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_depthwise_conv2d_nchw(n, c, h, w, xp, cm // c, kh, kw, sh, sw, dh, dw, pt, pl,
                                      y.shape[2], y.shape[3], wp, bp, code, alpha, yp)
    check(st, "depthwise_conv2d_nchw")
    return y


def conv2d_planes(cnp.ndarray x, cnp.ndarray w_hwio, object bias, cnp.ndarray y, int64_t sh,
                  int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int code, float alpha):
    """y[n, o, oh, ow] = f(bias + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
    w[i, j, ci, o]) (zeros outside x) from NCHW planes to NCHW planes: x (N, C, H, W),
    ``w_hwio`` (kh, kw, C, C_out) as it is (one group), y (N, C_out, Ho, Wo); for at most 8
    output channels at column stride 1, or any number at column stride 2 on AVX-512, a direct
    loop vectorized over output columns, else ``conv2d_nchw_in``'s loop (meant for few input
    channels) with each output row transposed into the planes. Returns y."""
    cdef float *xp = cptr(x, 4, "conv2d_planes x")
    cdef float *wp = cptr(w_hwio, 4, "conv2d_planes w")
    cdef float *yp = cptr(y, 4, "conv2d_planes y")
    cdef int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3]
    cdef int64_t kh = w_hwio.shape[0], kw = w_hwio.shape[1], cout = w_hwio.shape[3]
    if (w_hwio.shape[2] != c or y.shape[0] != n or y.shape[1] != cout
            or min(kh, kw, sh, sw, dh, dw, c) < 1 or pt < 0 or pl < 0):
        raise ValueError("conv2d_planes: inconsistent shapes or steps")
    cdef float *bp = vptr(bias, cout, "conv2d_planes bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_conv2d_planes(n, c, h, w, xp, kh, kw, sh, sw, dh, dw, pt, pl, y.shape[2], y.shape[3], cout,
                              wp, bp, code, alpha, yp)
    check(st, "conv2d_planes")
    return y


def conv2d_nchw_in(cnp.ndarray x, cnp.ndarray w_hwio, object bias, cnp.ndarray y, int64_t sh,
                   int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int code, float alpha):
    """y[n, oh, ow, o] = f(bias + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
    w[i, j, ci, o]) (zeros outside x) from NCHW planes to NHWC: x (N, C, H, W), ``w_hwio`` (kh,
    kw, C, C_out) as it is (one group), y (N, Ho, Wo, C_out); a direct loop meant for few input
    channels (no transpose or padded copy of x). Returns y."""
    cdef float *xp = cptr(x, 4, "conv2d_nchw_in x")
    cdef float *wp = cptr(w_hwio, 4, "conv2d_nchw_in w")
    cdef float *yp = cptr(y, 4, "conv2d_nchw_in y")
    cdef int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3]
    cdef int64_t kh = w_hwio.shape[0], kw = w_hwio.shape[1], cout = w_hwio.shape[3]
    if (w_hwio.shape[2] != c or y.shape[0] != n or y.shape[3] != cout
            or min(kh, kw, sh, sw, dh, dw, c) < 1 or pt < 0 or pl < 0):
        raise ValueError("conv2d_nchw_in: inconsistent shapes or steps")
    cdef float *bp = vptr(bias, cout, "conv2d_nchw_in bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_conv2d_nchw_in(n, c, h, w, xp, kh, kw, sh, sw, dh, dw, pt, pl, y.shape[1], y.shape[2],
                               cout, wp, bp, code, alpha, yp)
    check(st, "conv2d_nchw_in")
    return y


def conv_transpose_pack(cnp.ndarray w_hwio, int64_t groups):
    """The transposed convolution's weights ``w_hwio`` (kh, kw, C_in, C_out / groups) as each
    group's (C_in / groups, kh kw C_out / groups) packed for ``conv_transpose2d``."""
    cptr(w_hwio, 4, "conv_transpose_pack w")
    cdef int64_t cin = w_hwio.shape[2]
    if groups < 1 or cin % groups:
        raise ValueError(f"conv_transpose_pack: {cin} input channels in {groups} groups")
    w_ck = np.ascontiguousarray(np.moveaxis(w_hwio, 2, 0)).reshape(cin, -1)
    cdef int64_t cg = cin // groups
    return np.concatenate([pack(w_ck[g * cg:(g + 1) * cg]) for g in range(groups)])


def conv_transpose2d(cnp.ndarray x, cnp.ndarray pw, object bias, cnp.ndarray y, int64_t kh,
                     int64_t kw, int64_t groups, int64_t sh, int64_t sw, int64_t dh,
                     int64_t dw, int64_t ct, int64_t cl, int code, float alpha):
    """y[n, oh, ow, g co + o] = f(bias + sum of x[n, ih, iw, g ci + c] w[i, j, g ci + c, o] over
    ih sh + i dh = oh + ct, iw sw + j dw = ow + cl): x (N, H, W, C_in), y (N, Ho, Wo, C_out), w
    (kh, kw, C_in, C_out / groups) given by ``conv_transpose_pack``."""
    cdef float *xp = cptr(x, 4, "conv_transpose2d x")
    cdef float *yp = cptr(y, 4, "conv_transpose2d y")
    cdef int64_t n = x.shape[0], h = x.shape[1], w = x.shape[2], cin = x.shape[3]
    cdef int64_t cout = y.shape[3]
    if (y.shape[0] != n or min(kh, kw, sh, sw, dh, dw, groups) < 1 or ct < 0 or cl < 0
            or cin % groups or cout % groups):
        raise ValueError("conv_transpose2d: inconsistent shapes, steps or groups")
    cdef int64_t co = cout // groups
    if pw.size < groups * fl_packed_floats(cin // groups, kh * kw * co):
        raise ValueError("conv_transpose2d: the packed weights are too small for this kernel")
    cdef float *pp = cptr(pw, 1, "conv_transpose2d packed w")
    cdef float *bp = vptr(bias, cout, "conv_transpose2d bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_conv_transpose2d(n, h, w, cin, xp, kh, kw, co, groups, sh, sw, dh, dw, ct, cl,
                                 y.shape[1], y.shape[2], pp, bp, code, alpha, yp)
    check(st, "conv_transpose2d")
    return y


def conv_transpose2d_nchw(cnp.ndarray x, cnp.ndarray wt, object bias, cnp.ndarray y, int64_t kh,
                          int64_t kw, int64_t groups, int64_t sh, int64_t sw, int64_t dh,
                          int64_t dw, int64_t ct, int64_t cl, int code, float alpha):
    """y[n, g co + o, oh, ow] = f(bias + sum of x[n, g ci + c, ih, iw] w[g ci + c, o, i, j] over
    ih sh + i dh = oh + ct, iw sw + j dw = ow + cl) on NCHW planes: x (N, C_in, H, W), y (N,
    C_out, Ho, Wo), ``wt`` (groups, C_out / groups kh kw, C_in / groups): each group's
    (C_in / groups, C_out / groups, kh, kw) weights transposed (row (o, i, j), column c)."""
    cdef float *xp = cptr(x, 4, "conv_transpose2d_nchw x")
    cdef float *yp = cptr(y, 4, "conv_transpose2d_nchw y")
    cdef float *wp = cptr(wt, 3, "conv_transpose2d_nchw wt")
    cdef int64_t n = x.shape[0], cin = x.shape[1], cout = y.shape[1]
    if (y.shape[0] != n or min(kh, kw, sh, sw, dh, dw, groups) < 1 or ct < 0 or cl < 0
            or cin % groups or cout % groups):
        raise ValueError("conv_transpose2d_nchw: inconsistent shapes, steps or groups")
    cdef int64_t co = cout // groups
    if wt.shape[0] != groups or wt.shape[1] != co * kh * kw or wt.shape[2] != cin // groups:
        raise ValueError(f"conv_transpose2d_nchw: wt of shape {(<object>wt).shape} for {groups} groups of "
                         f"{cin // groups} -> {co} channels, kernel {kh}x{kw}")
    cdef float *bp = vptr(bias, cout, "conv_transpose2d_nchw bias")
    check_code(code)
    cdef int st
    with nogil:
        st = fl_conv_transpose2d_nchw(n, cin, x.shape[2], x.shape[3], xp, kh, kw, co, groups,
                                      sh, sw, dh, dw, ct, cl, y.shape[2], y.shape[3], wp, bp,
                                      code, alpha, yp)
    check(st, "conv_transpose2d_nchw")
    return y


def conv1x1_nchw(cnp.ndarray x, cnp.ndarray w_oi, object bias, cnp.ndarray y, int code, float alpha):
    """y[n, o] = f(bias[o] + sum_ci w[o, ci] x[n, ci]) over each plane: a 1x1 convolution
    (stride 1, no padding, one group) from NCHW planes x (N, C_in, H, W) to NCHW planes y (N,
    C_out, H, W), ``w_oi`` (C_out, C_in) with contiguous rows (any row stride: rows a multiple of
    4 KiB apart share L1 sets, ``backends/cpu/conv.py`` pads them); per image the product ``w_oi @
    x[n]``, no layout move. Returns y."""
    cdef float *xp = cptr(x, 4, "conv1x1_nchw x")
    cdef float *wp = fptr(w_oi, "conv1x1_nchw w")
    cdef float *yp = cptr(y, 4, "conv1x1_nchw y")
    cdef int64_t n = x.shape[0], cin = x.shape[1], cout = w_oi.shape[0], hw = x.shape[2] * x.shape[3]
    if (w_oi.shape[1] != cin or y.shape[0] != n or y.shape[1] != cout or y.shape[2] != x.shape[2]
            or y.shape[3] != x.shape[3] or cin < 1):
        raise ValueError(f"conv1x1_nchw: x {(<object>x).shape}, w {(<object>w_oi).shape}, y {(<object>y).shape}")
    cdef float *bp = vptr(bias, cout, "conv1x1_nchw bias")
    check_code(code)
    cdef int64_t ldw = ld(w_oi)
    cdef int st
    with nogil:
        st = fl_conv1x1_nchw(n, cin, hw, cout, xp, wp, ldw, bp, code, alpha, yp)
    check(st, "conv1x1_nchw")
    return y
