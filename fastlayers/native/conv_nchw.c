/* conv2d_nchw_in (conv.h): a convolution of few input channels read straight from NCHW planes
 * (a network's first layer on an image), written NHWC for the layers after it: no transpose of
 * the input to NHWC and no padded copy of it, which for 3 channels cost about as much as the
 * convolution. Vectorized over output channels: each pass holds the sums of up to
 * CONV_NCHW_COLS output columns by up to CONV_NCHW_V channel vectors and adds every tap's
 * weight vectors times each column's input value, the taps in the HWIO order of conv2d's sums.
 * Also conv1x1_nchw (NCHW planes into NCHW planes through a 1x1 window) and conv2d_planes (NCHW
 * planes into NCHW planes: for few output channels vectorized over output columns, else these
 * passes with each output row transposed into the planes). Compiled once per ISA
 * (kernels.inc). */

#include <string.h>

#include "conv_internal.h"
#include "gemm_internal.h"
#include "layout_internal.h"
#include "threadpool.h"

/* Most channel vectors a pass holds sums for: 4 (64 channels) on AVX-512, 2 (16) on AVX2. */
#define CONV_NCHW_V (FL_VW >= 16 ? 4 : 2)
/* Output columns of a pass of V channel vectors: as many as fill 24-28 of AVX-512's 32 registers
 * with sums (the weight vectors and a broadcast input value need the rest), 12 of AVX2's 16;
 * more columns a pass load each weight vector for more multiply-adds. */
#define CONV_NCHW_COLS(V) \
    (FL_VW >= 16 ? ((V) == 1 ? 24 : (V) == 2 ? 14 : (V) == 3 ? 9 : 6) : ((V) == 1 ? 12 : 6))
/* Widest pass (columns) of any V. */
#define CONV_NCHW_P CONV_NCHW_COLS(1)
/* Most taps (i, j, ci) of a window for the passes (their offsets lie on the stack); more run
 * pixel by pixel (the library sends at most 4 channels through windows of at most 25 taps, or
 * 3 through 49: 147 taps). */
#define CONV_NCHW_TAPS 512

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t c, h, w_in, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout;
    int code, planes, status; /* planes: y NCHW planes (N, C_out, Ho, Wo), each row moved there */
    float alpha;
} conv_nchw_ctx;

/* s + b where there is a bias (none: s itself, -0 kept), then ReLU: the first steps of the
 * row epilogue (rows_bias_act_range), the same values, done on a pass's sums in registers;
 * other activations run over the row after its passes (conv_nchw_task). */
FL_INLINE fl_vf conv_nchw_epi(fl_vf s, const float *bias, fl_vf b, int code) {
    if (bias) s += b;
    return code == FL_RELU ? rows_vact(s, FL_RELU, 0.0f) : s;
}

/* The sums of y row (n, oh), columns [ow0, ow0 + P), channels [o0, o0 + (V - 1) FL_VW + nc) (V
 * vectors, the last nc <= FL_VW wide; the bias and ReLU added before the stores, another
 * activation the row's, after its passes), window rows [i0, i1) read from xb: window row i0's
 * channel 0 at xb, window rows rs floats apart (x itself, or the zero-padded copy of an edge's
 * windows), tap t = (i kw + j) c + ci at off[t] - i0 rs from xb (conv_nchw_offsets), column u's
 * at u sw more (sw = S where S > 0: a constant offset from the tap's address, not a register
 * each); each input value loaded once for the V vectors, the taps of all window rows one loop
 * (the loops over a window row's kw c taps, 9-21 of them for 3 channels, cost a pass about 5 %
 * more in their entries and exits). */
FL_INLINE void conv_nchw_pass(const int P, const int V, const int S, const conv_nchw_ctx *p, const float *xb,
                              int64_t rs, const int64_t *off, int64_t i0, int64_t i1, int64_t ow0,
                              int64_t o0, int64_t nc, float *yrow) {
    int64_t cout = p->cout, taps = p->kw * p->c;
    const int64_t sw = S > 0 ? S : p->sw;
    fl_vf s[CONV_NCHW_P][CONV_NCHW_V];
    _Pragma("GCC unroll 24") for (int u = 0; u < P; ++u) {
        _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) s[u][v] = fl_set1(0.0f);
    }
    /* taps (i, j, ci) of window rows [i0, i1) in one loop: their weights cout floats apart */
    const float *wt = p->w + i0 * taps * cout + o0;
    const int64_t shift = i0 * rs;
    for (int64_t t = i0 * taps, te = i1 * taps; t < te; ++t, wt += cout) {
        const float *xc = xb + (off[t] - shift);
        fl_vf wv[CONV_NCHW_V];
        _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) wv[v] =
            v < V - 1 ? fl_load(wt + v * FL_VW) : pool_ld(wt + v * FL_VW, nc);
        _Pragma("GCC unroll 24") for (int u = 0; u < P; ++u) {
            fl_vf xv = fl_set1(xc[u * sw]);
            _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) s[u][v] += xv * wv[v];
        }
    }
    /* the bias and ReLU on the registers (conv_nchw_epi; other activations after the row) */
    const float *bias = p->bias ? p->bias + o0 : 0;
    fl_vf bv[CONV_NCHW_V];
    _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) bv[v] =
        !bias ? fl_set1(0.0f) : v < V - 1 ? fl_load(bias + v * FL_VW) : pool_ld(bias + v * FL_VW, nc);
    _Pragma("GCC unroll 24") for (int u = 0; u < P; ++u) {
        float *o = yrow + (ow0 + u) * cout + o0;
        _Pragma("GCC unroll 4") for (int v = 0; v < V - 1; ++v)
            fl_store(o + v * FL_VW, conv_nchw_epi(s[u][v], bias, bv[v], p->code));
        pool_st(o + (V - 1) * FL_VW, conv_nchw_epi(s[u][V - 1], bias, bv[V - 1], p->code), nc);
    }
}

/* The sums of one output pixel (n, oh, ow), channels [o0, o0 + nc), window rows [i0, i1): the
 * taps whose column lies inside x (output rows too narrow for a pass of 3 columns, windows too
 * large for an edge copy). */
static void conv_nchw_pixel(const conv_nchw_ctx *p, int64_t n, int64_t oh, int64_t i0, int64_t i1,
                            int64_t ow, int64_t o0, int64_t nc, float *yrow) {
    int64_t c = p->c, hw = p->h * p->w_in, cout = p->cout, iw0 = ow * p->sw - p->pl, j0, j1;
    pool_taps(iw0, p->dw, p->kw, 0, p->w_in, &j0, &j1);
    fl_vf s = fl_set1(0.0f);
    for (int64_t i = i0; i < i1; ++i) {
        const float *xr = p->x + (n * c * p->h + oh * p->sh - p->pt + i * p->dh) * p->w_in + iw0;
        for (int64_t j = j0; j < j1; ++j)
            for (int64_t ci = 0; ci < c; ++ci)
                s += fl_set1(xr[ci * hw + j * p->dw]) * pool_ld(p->w + ((i * p->kw + j) * c + ci) * cout + o0, nc);
    }
    const float *bias = p->bias ? p->bias + o0 : 0;
    pool_st(yrow + ow * cout + o0, conv_nchw_epi(s, bias, bias ? pool_ld(bias, nc) : s, p->code), nc);
}

/* The sums of output columns [ow0, ow1) of row (n, oh), channels [o0, o0 + cn), pixel by
 * pixel. */
static void conv_nchw_pixels(const conv_nchw_ctx *p, int64_t n, int64_t oh, int64_t i0, int64_t i1, int64_t ow0,
                             int64_t ow1, int64_t o0, int64_t cn, float *yrow) {
    for (int64_t ow = ow0; ow < ow1; ++ow)
        for (int64_t o = o0; o < o0 + cn; o += FL_VW)
            conv_nchw_pixel(p, n, oh, i0, i1, ow, o, FL_MIN(FL_VW, o0 + cn - o), yrow);
}

/* Most floats of an edge pass's zero-padded window copy (16 KiB on the stack, rows of the widest
 * pass's span in whole vectors: conv_nchw_edge_ld); larger windows run their edge columns pixel
 * by pixel. */
#define CONV_NCHW_EDGE_FLOATS 4096

/* The passes of V channel vectors (the last nc <= FL_VW wide) at column stride 1, 2
 * (constants) or another. */
FL_INLINE void conv_nchw_strided(const int P, const int V, const conv_nchw_ctx *p, const float *xb, int64_t rs,
                                 const int64_t *off, int64_t i0, int64_t i1, int64_t ow0, int64_t o0, int64_t nc,
                                 float *yrow) {
    if (p->sw == 1) conv_nchw_pass(P, V, 1, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
    else if (p->sw == 2) conv_nchw_pass(P, V, 2, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
    else conv_nchw_pass(P, V, 0, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
}

/* A pass of P columns: the widest pass of V vectors (CONV_NCHW_COLS), half of it or 3. */
FL_INLINE void conv_nchw_width(const int V, int P, const conv_nchw_ctx *p, const float *xb, int64_t rs,
                               const int64_t *off, int64_t i0, int64_t i1, int64_t ow0, int64_t o0, int64_t nc,
                               float *yrow) {
    const int pm = CONV_NCHW_COLS(V), ph = (pm + 1) / 2;
    if (P == pm) conv_nchw_strided(pm, V, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
    else if (ph > 3 && P == ph) conv_nchw_strided(ph, V, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
    else conv_nchw_strided(3, V, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow);
}

/* off[t] = i rs + j dw + ci cs for the taps t = (i kw + j) c + ci of the window (kh kw c of
 * them): the offset of each tap's input from the window's start, window rows rs floats apart
 * and channels cs. */
static void conv_nchw_offsets(const conv_nchw_ctx *p, int64_t rs, int64_t cs, int64_t *off) {
    for (int64_t i = 0, t = 0; i < p->kh; ++i)
        for (int64_t j = 0; j < p->kw; ++j)
            for (int64_t ci = 0; ci < p->c; ++ci, ++t) off[t] = i * rs + j * p->dw + ci * cs;
}

/* Floats of each row of an edge pass's window copy: the span of the widest pass, rounded up to
 * whole vectors. */
static int64_t conv_nchw_edge_ld(const conv_nchw_ctx *p) {
    int64_t span = (CONV_NCHW_P - 1) * p->sw + (p->kw - 1) * p->dw + 1;
    return (span + FL_VW - 1) / FL_VW * FL_VW;
}

/* Columns per pass of V vectors for the last `left` columns of a row of wo: the widest pass
 * while it fits the row, else the narrowest of its half and 3 that covers them (ending at
 * the row's end, recomputing columns before it to the same sums), else the widest that fits. */
static int conv_nchw_cols(int V, int64_t left, int64_t wo) {
    int pm = CONV_NCHW_COLS(V), ph = (pm + 1) / 2;
    if (left >= pm || (left > ph && wo >= pm)) return pm;
    if (ph > 3 && (left >= ph || (left > 3 && wo >= ph))) return ph;
    return 3;
}

/* The sums of columns [ow0, ow0 + P) of output row (n, oh), window rows [i0, i1): read from x
 * where every tap column lies inside it, else from a copy of the windows with zeros where they
 * leave x (edges: as many multiply-adds as inside, not one dependent chain of them a pixel). */
static void conv_nchw_segment(int P, int V, const conv_nchw_ctx *p, const int64_t *off, const int64_t *off_edge,
                              int64_t n, int64_t oh, int64_t i0, int64_t i1, int64_t ow0, int64_t ow_lo,
                              int64_t ow_hi, int64_t o0, int64_t nc, float *buf, float *yrow) {
    int64_t c = p->c, hw = p->h * p->w_in, iw0 = ow0 * p->sw - p->pl;
    const float *x0 = p->x + (n * c * p->h + oh * p->sh - p->pt + i0 * p->dh) * p->w_in + iw0;
    const float *xb = x0;
    int64_t rs = p->dh * p->w_in;
    if (ow0 < ow_lo || ow0 + P > ow_hi) {
        int64_t span = (P - 1) * p->sw + (p->kw - 1) * p->dw + 1, ld = conv_nchw_edge_ld(p);
        if (!off_edge) {
            conv_nchw_pixels(p, n, oh, i0, i1, ow0, ow0 + P, o0, (V - 1) * FL_VW + nc, yrow);
            return;
        }
        /* buf row (i - i0) c + ci: x[n, ci, oh sh - pt + i dh, iw0:iw0 + span], zeros outside x */
        int64_t lo = FL_MIN(FL_MAX(-iw0, 0), span), hi = FL_MAX(FL_MIN(p->w_in - iw0, span), lo);
        /* a vector column k at a time over all the copy's rows, its lanes' bounds once: lanes
         * outside [lo, hi) zeros and not read, whole vectors stored (the rows' stride ld a
         * whole number of vectors; a few dozen floats a row, where calls of memset and memcpy
         * cost more than the copy, and bounds worked out per row and vector cost the stem
         * passes 3-5 %) */
        for (int64_t k = 0; k < span; k += FL_VW) {
            int64_t a = FL_MIN(FL_MAX(lo - k, 0), FL_VW), e = FL_MAX(FL_MIN(hi - k, FL_VW), a);
            float *b = buf + k;
            for (int64_t i = i0; i < i1; ++i) {
                const float *xr = x0 + (i - i0) * rs + k;
                for (int64_t ci = 0; ci < c; ++ci, b += ld) fl_store(b, fl_load_lanes(xr + ci * hw, a, e));
            }
        }
        xb = buf, rs = c * ld, off = off_edge;
    }
    switch (V) {
    case 1: conv_nchw_width(1, P, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow); break;
    case 2: conv_nchw_width(2, P, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow); break;
#if CONV_NCHW_V > 2
    case 3: conv_nchw_width(3, P, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow); break;
    default: conv_nchw_width(4, P, p, xb, rs, off, i0, i1, ow0, o0, nc, yrow); break;
#endif
    }
}

/* Output rows t = n Ho + oh in [t0, t1), all columns and channels: each row's sums, then its
 * bias and activation while it is in cache; for NCHW planes out, the row in a per-thread
 * buffer first, then transposed into them. */
static void conv_nchw_task(void *arg, int64_t t0, int64_t t1) {
    conv_nchw_ctx *p = (conv_nchw_ctx *)arg;
    /* interior columns [ow_lo, ow_hi): every tap column inside x */
    int64_t num = p->w_in - 1 - (p->kw - 1) * p->dw + p->pl;
    int64_t ow_lo = FL_MIN((p->pl + p->sw - 1) / p->sw, p->wo);
    int64_t ow_hi = FL_MAX(FL_MIN(num < 0 ? 0 : num / p->sw + 1, p->wo), ow_lo);
    const int64_t wo = p->wo;
    float *row = 0; /* planes: the row's sums (wo, cout) before their move */
    if (p->planes && !(row = fl_buf_floats(&FL_FN(conv_task_buf), (size_t)(wo * p->cout)))) {
        p->status = -1;
        return;
    }
    /* the taps' offsets in x and in an edge pass's copy (conv_nchw_offsets; no copy where
     * the window's rows do not fit the copy: its columns pixel by pixel) */
    int64_t off[CONV_NCHW_TAPS], off_edge[CONV_NCHW_TAPS], ld = conv_nchw_edge_ld(p);
    float buf[CONV_NCHW_EDGE_FLOATS] __attribute__((aligned(64))); /* an edge pass's window copy */
    int passes = wo >= 3 && p->kh * p->kw * p->c <= CONV_NCHW_TAPS;
    int edge = passes && p->kh * p->c * ld <= CONV_NCHW_EDGE_FLOATS;
    if (passes) conv_nchw_offsets(p, p->dh * p->w_in, p->h * p->w_in, off);
    if (edge) conv_nchw_offsets(p, p->c * ld, ld, off_edge);
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, oh = t % p->ho, i0, i1;
        pool_taps(oh * p->sh - p->pt, p->dh, p->kh, 0, p->h, &i0, &i1);
        float *yrow = row ? row : p->y + t * wo * p->cout;
        if (!passes) {
            conv_nchw_pixels(p, n, oh, i0, i1, 0, wo, 0, p->cout, yrow);
        } else {
            /* blocks of up to CONV_NCHW_V channel vectors (the last partial), each in passes
             * along the row (conv_nchw_cols) */
            for (int64_t o0 = 0; o0 < p->cout;) {
                int64_t left = p->cout - o0;
                int V = (int)FL_MIN((left + FL_VW - 1) / FL_VW, CONV_NCHW_V);
                int64_t nc = FL_MIN(left - (V - 1) * FL_VW, FL_VW);
                for (int64_t ow = 0; ow < wo;) {
                    int P = conv_nchw_cols(V, wo - ow, wo);
                    int64_t ow0 = FL_MIN(ow, wo - P);
                    conv_nchw_segment(P, V, p, off, edge ? off_edge : 0, n, oh, i0, i1, ow0, ow_lo, ow_hi, o0, nc,
                                      buf, yrow);
                    ow = ow0 + P;
                }
                o0 += (V - 1) * FL_VW + nc;
            }
        }
        if (p->code != FL_LINEAR && p->code != FL_RELU) /* the bias is on the sums already */
            FL_FN(rows_bias_act_range)(0, wo, p->cout, yrow, p->cout, 0, p->code, p->alpha, yrow, p->cout);
        if (row) /* y[n, o, oh, ow] = row[ow, o] */
            layout_small(row, p->cout, p->y + (n * p->cout * p->ho + oh) * wo, p->ho * wo, wo, p->cout);
    }
}

/* conv2d_nchw_in into NHWC rows (planes 0) or NCHW planes (planes 1). */
static int conv_nchw_run(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh, int64_t kw,
                         int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                         int64_t wo, int64_t cout, const float *wk, const float *bias, int code, float alpha,
                         int planes, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || c < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 ||
        pl < 0)
        return -2;
    conv_nchw_ctx p = {x, wk, bias, y, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, code, planes, 0, alpha};
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * cout * kh * kw * c)), conv_nchw_task, &p);
    return p.status;
}

/* y[n, oh, ow, o] = f(b[o] + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
 * w[i, j, ci, o]) (zeros outside x): x (N, C, H, W), w (kh, kw, C, cout), y (N, Ho, Wo, cout). */
int FL_FN(conv2d_nchw_in)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                          int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                          int64_t pl, int64_t ho, int64_t wo, int64_t cout, const float *wk,
                          const float *bias, int code, float alpha, float *y) {
    return conv_nchw_run(n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code, alpha, 0, y);
}

/* Most columns of one image per sgemm call of conv1x1_nchw (one of sgemm's blocks of b); the
 * columns split into near-equal blocks of whole panels. */
#define CONV_PW_COLS (8 * FL_PANEL)

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t cin, ldw, hw, cout, blocks, panels, chunks, rows; /* panels: an image's, the last partial */
    int code, status;
    float alpha;
} conv_pw_ctx;

/* row[0:len] = f(row[0:len] + b), f the elementwise activation `code`. */
FL_INLINE void conv_pw_row(float *row, int64_t len, float b, const int code, float alpha) {
    fl_vf bv = fl_set1(b);
    int64_t j = 0;
    for (; j + FL_VW <= len; j += FL_VW) fl_store(row + j, rows_vact(fl_load(row + j) + bv, code, alpha));
    if (j < len) pool_st(row + j, rows_vact(pool_ld(row + j, len - j) + bv, code, alpha), len - j);
}

/* y[o, 0:len] = f(y[o, 0:len] + bias[o]) for the rows o < rows, ld floats apart. */
static void conv_pw_epilogue(float *y, int64_t ld, int64_t rows, int64_t len, const float *bias, int code,
                             float alpha) {
    switch (code) { /* the code's branch once per block */
#define CONV_PW_CASE(cd)                                                                                               \
    case cd:                                                                                                           \
        for (int64_t o = 0; o < rows; ++o) conv_pw_row(y + o * ld, len, bias ? bias[o] : 0.0f, cd, alpha);          \
        break;
        CONV_PW_CASE(FL_LINEAR) CONV_PW_CASE(FL_RELU) CONV_PW_CASE(FL_RELU6) CONV_PW_CASE(FL_LEAKY_RELU)
        CONV_PW_CASE(FL_HARD_SIGMOID) CONV_PW_CASE(FL_SOFTSIGN) CONV_PW_CASE(FL_SIGMOID) CONV_PW_CASE(FL_SILU)
        CONV_PW_CASE(FL_GELU) CONV_PW_CASE(FL_GELU_TANH) CONV_PW_CASE(FL_EXPONENTIAL) CONV_PW_CASE(FL_TANH)
        CONV_PW_CASE(FL_HARD_SILU) CONV_PW_CASE(FL_ONNX_SIGMOID) CONV_PW_CASE(FL_ONNX_SILU) CONV_PW_CASE(FL_ONNX_TANH)
#undef CONV_PW_CASE
    default: break;
    }
}

/* Most columns past the last whole panel that conv_pw_dot takes: where the narrow tile's
 * vector would be at most half full (a multiply-add a tile row per step of k for them, where
 * the wide tile's two give a whole panel). */
#define CONV_PW_DOT_COLS (FL_VW / 2)

/* y[o, j] = sum over k < cin of w[o, k] xt[j, k] for o < R (rows ldw apart), j < Q (xt's rows
 * ldt apart), y's rows ldy apart: R Q sums of FL_VW lanes along k (each vector of w and of xt
 * loaded once for the block), then each sum's lanes added in order. */
FL_INLINE void conv_pw_dot_block(const int R, const int Q, int64_t cin, const float *w, int64_t ldw,
                                 const float *xt, int64_t ldt, float *y, int64_t ldy) {
    fl_vf s[4][4];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q)
        s[r][q] = fl_set1(0.0f);
    for (int64_t k = 0; k < cin; k += FL_VW) {
        int64_t nk = FL_MIN(FL_VW, cin - k);
        fl_vf xv[4];
        _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q) xv[q] = pool_ld(xt + q * ldt + k, nk);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
            fl_vf wv = pool_ld(w + r * ldw + k, nk);
            _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q) s[r][q] += wv * xv[q];
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) _Pragma("GCC unroll 4") for (int q = 0; q < Q; ++q)
        y[r * ldy + q] = fl_hsum(s[r][q]);
}

/* y[o, j] = sum over k < cin of w[o, k] x[k, j] for o < rows, j < cols (<= CONV_PW_DOT_COLS):
 * the columns past the block's last whole panel, vectorized along k (x's columns copied to
 * rows of xt first), whole lanes where the narrow tile would fill at most half of its vector.
 * Returns -1 where the copy's memory is not there. */
static int conv_pw_dot(int64_t rows, int64_t cols, int64_t cin, const float *w, int64_t ldw, const float *x,
                       int64_t ldx, float *y, int64_t ldy) {
    int64_t ldt = (cin + FL_LINE_FLOATS - 1) / FL_LINE_FLOATS * FL_LINE_FLOATS;
    float *xt = fl_buf_floats(&FL_FN(conv_task_buf), (size_t)(cols * ldt));
    if (!xt) return -1;
    for (int64_t k = 0; k < cin; ++k)
        for (int64_t j = 0; j < cols; ++j) xt[j * ldt + k] = x[k * ldx + j];
    for (int64_t j = 0; j < cols;) {
        int64_t q = cols - j >= 4 ? 4 : cols - j >= 2 ? 2 : 1;
        const float *xq = xt + j * ldt;
        int64_t o = 0;
#define CONV_PW_DOT_Q(Q)                                                                                               \
    for (; o + 4 <= rows; o += 4)                                                                                      \
        conv_pw_dot_block(4, Q, cin, w + o * ldw, ldw, xq, ldt, y + o * ldy + j, ldy);                                 \
    for (; o < rows; ++o)                                                                                              \
        conv_pw_dot_block(1, Q, cin, w + o * ldw, ldw, xq, ldt, y + o * ldy + j, ldy);
        if (q == 4) {
            CONV_PW_DOT_Q(4)
        } else if (q == 2) {
            CONV_PW_DOT_Q(2)
        } else {
            CONV_PW_DOT_Q(1)
        }
#undef CONV_PW_DOT_Q
        j += q;
    }
    return 0;
}

/* Units u in [u0, u1), u = (image i, column block, chunk of output rows): one sgemm of the
 * chunk's rows of w (rows, cin) by the block's columns of the image's planes (cin, hw), its
 * last columns past a whole panel by conv_pw_dot where they are few, then the block's
 * epilogue while it is in L2. */
static void conv_pw_task(void *arg, int64_t u0, int64_t u1) {
    conv_pw_ctx *p = (conv_pw_ctx *)arg;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t r0 = u % p->chunks * p->rows, rows = FL_MIN(p->rows, p->cout - r0), v = u / p->chunks;
        /* block b: panels [b P / B, (b + 1) P / B) of the image's P, the last to its end */
        int64_t i = v / p->blocks, b = v % p->blocks, c0 = b * p->panels / p->blocks * FL_PANEL;
        int64_t len = (b == p->blocks - 1 ? p->hw : (b + 1) * p->panels / p->blocks * FL_PANEL) - c0;
        float *yb = p->y + (i * p->cout + r0) * p->hw + c0;
        const float *xb = p->x + i * p->cin * p->hw + c0, *wb = p->w + r0 * p->ldw;
        int64_t tail = len % FL_PANEL;
        if (tail > CONV_PW_DOT_COLS || tail == len) tail = 0;
        int st = FL_FN(sgemm)(rows, len - tail, p->cin, wb, p->ldw, xb, p->hw, 0, 0, yb, p->hw);
        if (!st && tail)
            st = conv_pw_dot(rows, tail, p->cin, wb, p->ldw, xb + len - tail, p->hw, yb + len - tail, p->hw);
        if (st) {
            p->status = st;
            return;
        }
        if (p->bias || p->code != FL_LINEAR)
            conv_pw_epilogue(yb, p->hw, rows, len, p->bias ? p->bias + r0 : 0, p->code, p->alpha);
    }
}

/* y[n, o] = f(b[o] + sum_ci w[o, ci] x[n, ci]) over the planes of hw values: a 1x1 convolution
 * from NCHW planes x (N, cin, hw) to NCHW planes y (N, cout, hw), w (cout, cin) with rows ldw
 * floats apart: per image the product w @ x[n], no layout move on either side. */
int FL_FN(conv1x1_nchw)(int64_t n, int64_t cin, int64_t hw, int64_t cout, const float *x, const float *wk,
                        int64_t ldw, const float *bias, int code, float alpha, float *y) {
    if (n <= 0 || hw <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || cin < 1 || ldw < cin) return -2;
    int64_t panels = (hw + FL_PANEL - 1) / FL_PANEL, blocks = (hw + CONV_PW_COLS - 1) / CONV_PW_COLS;
    int64_t chunks = 1, threads = fl_pool_get_threads();
    /* fewer blocks than threads (one image of few positions): blocks of whole panels, one a
     * thread, where each holds at least two and a share of multiply-adds worth a hand-off, the
     * last block taking the columns past them (each thread packs only its own columns of x,
     * where splitting the output rows had each pack all of them; docs/design.md "1x1
     * convolutions on NCHW planes") */
    if (n * blocks < threads && n == 1) {
        int64_t per = hw / FL_PANEL / threads;
        if (per >= 2 && per * FL_PANEL * cout * cin >= CONV_MIN_SHARE_TAPS) blocks = threads;
    } else if (threads > 1) {
        /* blocks that fall evenly to the threads where a few more (of at least 4 panels) do: 13
         * blocks of 56 x 56 split 7 : 6 between two threads, 14 split 7 : 7 */
        for (int64_t more = blocks; more < blocks + threads && 4 * more <= panels; ++more)
            if (n * more % threads == 0) {
                blocks = more;
                break;
            }
    }
    int64_t taps = (panels * FL_PANEL / blocks) * cout * cin;
    /* still fewer blocks than threads: the output rows split too, in whole register tiles,
     * each chunk worth a hand-off (each packs the block's columns of x again: one load and
     * store of a value per `rows` multiply-adds with it) */
    if (n * blocks < threads && cout >= 2 * GEMM_MR) {
        chunks = FL_MIN((threads + n * blocks - 1) / (n * blocks), cout / GEMM_MR);
        chunks = FL_MAX(1, FL_MIN(chunks, taps / CONV_MIN_SHARE_TAPS));
    }
    int64_t rows = ((cout + chunks - 1) / chunks + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    chunks = (cout + rows - 1) / rows;
    conv_pw_ctx p = {x, wk, bias, y, cin, ldw, hw, cout, blocks, panels, chunks, rows, code, 0, alpha};
    fl_parallel(n * blocks * chunks, FL_MAX(1, CONV_MIN_SHARE_TAPS * chunks / taps), conv_pw_task, &p);
    return p.status;
}

/* ------------------------------------------------------------------------- conv2d_planes */

/* conv2d_planes (conv.h): a convolution of NCHW planes into NCHW planes for few output channels
 * (CONV_PLANES_MAX_COUT), vectorized over output columns. The implicit GEMM vectorizes over
 * output channels: with 8 of them a vector of 16 lanes is half empty, with one 15 of 16 lanes
 * are (basic-pitch's 8 -> 8 3x39 and its convolutions into one channel). Here a pass holds O
 * output channels of V vectors of consecutive output columns and adds each tap's weight
 * (broadcast) times the V vectors of input it reads, the taps in the HWIO order (i, j, ci) of
 * the implicit GEMM's sums. Each output row reads a per-thread copy of its window rows with
 * the zeros of the padding, so that every vector load lies inside a row. At column stride 1 the
 * copy is the padded row; at stride 2 its even and odd columns, one row each, so that a tap's
 * input vector is contiguous at either stride (a stem of 3 -> 32 or 64 channels at stride 2
 * writes its planes with no transpose of its sums). */

/* Most output channels at column stride 1: a pass of 8 channels by 3 vectors fills 24 of
 * AVX-512's registers (beyond, conv2d_nchw_in's passes, whose sums are moved into the planes). */
#define CONV_PLANES_MAX_COUT 8
/* Whether column stride 2 takes these passes for any number of output channels: on AVX-512
 * (3x3 stems 21-29 % faster than conv2d_nchw_in's passes and their move, 7x7 9 %, 5x5 6 %), not
 * on AVX2, whose passes of 8 channels by one vector are bound by their loads (the stems 11-22 %
 * slower; docs/design.md "Few output channels from NCHW planes"). */
#define CONV_PLANES_S2 (FL_VW >= 16)
/* Sums a pass holds: 24 of AVX-512's 32 registers, 8 of AVX2's 16 (the input vectors and a
 * broadcast weight need the rest; 8 independent chains keep two FMA units busy). */
#define CONV_PLANES_SUMS (FL_VW >= 16 ? 24 : 8)

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout;
    int64_t bw; /* floats of a window row's copy (of each phase of it at stride 2): whole
                 * vectors past wo, the window's reach */
    int code, status;
    float alpha;
} conv_planes_ctx;

/* y[n, o0 + o, oh, ow0 + 16 v + l] = sum over window rows [i0, i1), j, ci of w[i, j, ci, o0 + o]
 * x[n, ci, oh sh - pt + i dh, (ow0 + 16 v + l) sw - pl + j dw] for o < O, v < V (lane l; FL_VW
 * for 16), the input from buf (window row 0's channel 0 there, even where that row lies outside
 * x: phase q = j dw % sw of row i dh c + ci of conv_planes_copy's, at ow0 + 16 v + l + j dw /
 * sw), the columns from wo on not stored: O channels by V vectors of sums, each tap's input
 * vectors loaded once for the O channels. */
FL_INLINE void conv_planes_pass(const int O, const int V, const conv_planes_ctx *p, const float *buf,
                                const int64_t *off, int64_t i0, int64_t i1, int64_t o0, int64_t ow0, float *yrow) {
    int64_t cout = p->cout, plane = p->ho * p->wo, taps = p->kw * p->c;
    fl_vf s[8][12];
    _Pragma("GCC unroll 8") for (int o = 0; o < O; ++o) {
        _Pragma("GCC unroll 12") for (int v = 0; v < V; ++v) s[o][v] = fl_set1(0.0f);
    }
    /* taps (i, j, ci) of window rows [i0, i1) in one loop (conv_planes_offsets): their weights
     * cout floats apart */
    const float *wt = p->w + i0 * taps * cout + o0, *xb = buf + ow0;
    for (int64_t t = i0 * taps, te = i1 * taps; t < te; ++t, wt += cout) {
        const float *xr = xb + off[t];
        fl_vf xv[12];
        _Pragma("GCC unroll 12") for (int v = 0; v < V; ++v) xv[v] = fl_load(xr + v * FL_VW);
        _Pragma("GCC unroll 8") for (int o = 0; o < O; ++o) {
            fl_vf wv = fl_set1(wt[o]);
            _Pragma("GCC unroll 12") for (int v = 0; v < V; ++v) s[o][v] += wv * xv[v];
        }
    }
    /* the bias and ReLU on the registers (conv_nchw_epi; other activations after the row) */
    _Pragma("GCC unroll 8") for (int o = 0; o < O; ++o) {
        float *yo = yrow + (o0 + o) * plane;
        const float *bias = p->bias ? p->bias + o0 + o : 0;
        fl_vf bv = fl_set1(bias ? *bias : 0.0f);
        _Pragma("GCC unroll 12") for (int v = 0; v < V; ++v) {
            int64_t col = ow0 + v * FL_VW, left = p->wo - col;
            fl_vf r = conv_nchw_epi(s[o][v], bias, bv, p->code);
            if (left >= FL_VW) fl_store(yo + col, r);
            else if (left > 0) fl_store_n(yo + col, r, left);
        }
    }
}

/* Output columns [ow0, wo) of channels [o0, o0 + O): passes of VMAX vectors, then of fewer
 * (VMAX / 2, VMAX / 4, one: the last vector partial); with VMAX 3, a last 4 vectors as two
 * passes of 2 and a last 2 as one (a pass of 8 channels by one vector is bound by its loads:
 * 9 for 8 multiply-adds). */
FL_INLINE void conv_planes_columns(const int O, const int VMAX, const conv_planes_ctx *p, const float *buf,
                                   const int64_t *off, int64_t i0, int64_t i1, int64_t o0, float *yrow) {
    int64_t vectors = (p->wo + FL_VW - 1) / FL_VW, v0 = 0;
    for (; v0 + VMAX <= vectors && (VMAX != 3 || vectors - v0 != 4); v0 += VMAX)
        conv_planes_pass(O, VMAX, p, buf, off, i0, i1, o0, v0 * FL_VW, yrow);
    if (VMAX == 3)
        for (; v0 + 2 <= vectors; v0 += 2) conv_planes_pass(O, 2, p, buf, off, i0, i1, o0, v0 * FL_VW, yrow);
    if (VMAX >= 4 && v0 + VMAX / 2 <= vectors) {
        conv_planes_pass(O, VMAX / 2, p, buf, off, i0, i1, o0, v0 * FL_VW, yrow);
        v0 += VMAX / 2;
    }
    if (VMAX >= 8 && v0 + VMAX / 4 <= vectors) {
        conv_planes_pass(O, VMAX / 4, p, buf, off, i0, i1, o0, v0 * FL_VW, yrow);
        v0 += VMAX / 4;
    }
    for (; v0 < vectors; ++v0) conv_planes_pass(O, 1, p, buf, off, i0, i1, o0, v0 * FL_VW, yrow);
}

/* Most floats of a band's copy of input rows (128 KiB a thread; more where one output row's
 * window rows need more). */
#define CONV_PLANES_BAND_FLOATS 32768

/* buf rows ((ih - r0) c + ci) sw + q for the input rows ih in [r0, r1) of image n, q < sw: float
 * k of row q is x[n, ci, ih, q + sw k - pl], zeros outside x (sw 1 or 2): each input row copied
 * once for the band of output rows that read it (per output row, its 5x5 stem's 15 window rows
 * were split 2.5 times each and took 12 % of the convolution). */
static void conv_planes_copy(const conv_planes_ctx *p, int64_t n, int64_t r0, int64_t r1, float *buf) {
    int64_t c = p->c, bw = p->bw;
    const float *x0 = p->x + (n * c * p->h + r0) * p->wd;
    if (p->sw == 1) {
        int64_t lo = FL_MIN(p->pl, bw), hi = FL_MAX(FL_MIN(p->pl + p->wd, bw), lo);
        for (int64_t r = 0; r < r1 - r0; ++r)
            for (int64_t ci = 0; ci < c; ++ci) {
                float *b = buf + (r * c + ci) * bw;
                const float *xr = x0 + (ci * p->h + r) * p->wd;
                memset(b, 0, (size_t)lo * sizeof(float));
                memcpy(b + lo, xr, (size_t)(hi - lo) * sizeof(float));
                memset(b + hi, 0, (size_t)(bw - hi) * sizeof(float));
            }
        return;
    }
    /* two vectors of the padded row at a time (x columns [u, u + 2 FL_VW)), split into their
     * even and odd floats; each vector column's lane bounds once for all the rows (bw is whole
     * vectors) */
    for (int64_t k = 0; k < bw; k += FL_VW) {
        int64_t u = 2 * k - p->pl, v = u + FL_VW;
        int64_t a0 = FL_MIN(FL_MAX(-u, 0), FL_VW), e0 = FL_MAX(FL_MIN(p->wd - u, FL_VW), a0);
        int64_t a1 = FL_MIN(FL_MAX(-v, 0), FL_VW), e1 = FL_MAX(FL_MIN(p->wd - v, FL_VW), a1);
        for (int64_t r = 0; r < r1 - r0; ++r)
            for (int64_t ci = 0; ci < c; ++ci) {
                const float *xr = x0 + (ci * p->h + r) * p->wd;
                float *b = buf + (r * c + ci) * 2 * bw + k;
                fl_vf lo = fl_load_lanes(xr + u, a0, e0), hi = fl_load_lanes(xr + v, a1, e1);
                fl_store(b, FL_SHUF(lo, hi, POOL_EVENS));
                fl_store(b + bw, FL_SHUF(lo, hi, POOL_ODDS));
            }
    }
}

/* off[t] = (i dh c + ci) sw bw + (j dw % sw) bw + j dw / sw for the taps t = (i kw + j) c + ci:
 * where conv_planes_copy puts the first input float of the tap's window row, phase and column,
 * from window row 0's. */
static void conv_planes_offsets(const conv_planes_ctx *p, int64_t *off) {
    int64_t rs = p->sw * p->bw;
    for (int64_t i = 0, t = 0; i < p->kh; ++i)
        for (int64_t j = 0; j < p->kw; ++j)
            for (int64_t ci = 0; ci < p->c; ++ci, ++t) {
                int64_t u = j * p->dw;
                off[t] = (i * p->dh * p->c + ci) * rs + (u % p->sw) * p->bw + u / p->sw;
            }
}

/* Output rows t = n Ho + oh in [t0, t1), in bands: the band's input rows copied with their
 * padding (conv_planes_copy), then for each output row the channels in blocks of 8, 4, 2 and 1
 * (sums: 8 x 3, 4 x 6, 2 x 12, 1 x 12 vectors on AVX-512; 8 x 1, 4 x 2, 2 x 4, 1 x 8 on AVX2;
 * the bias and ReLU on their registers), then another activation on each channel's row while it
 * is in cache. */
static void conv_planes_task(void *arg, int64_t t0, int64_t t1) {
    conv_planes_ctx *p = (conv_planes_ctx *)arg;
    /* bands of output rows whose input rows' copy fits CONV_PLANES_BAND_FLOATS (at least one) */
    int64_t c = p->c, rs = p->sw * p->bw, reach = (p->kh - 1) * p->dh + 1;
    int64_t band = FL_MAX(1, (CONV_PLANES_BAND_FLOATS / (c * rs) - reach) / p->sh + 1);
    int64_t rows = FL_MIN((band - 1) * p->sh + reach, p->h);
    /* the taps' offsets (conv_planes_offsets; 2 floats each) and then the band's copy */
    int64_t taps = p->kh * p->kw * c;
    float *mem = fl_buf_floats(&FL_FN(conv_task_buf), (size_t)(2 * taps + rows * c * rs));
    if (!mem) {
        p->status = -1;
        return;
    }
    int64_t *off = (int64_t *)mem;
    float *buf = mem + 2 * taps;
    conv_planes_offsets(p, off);
    for (int64_t tb = t0, te; tb < t1; tb = te) {
        /* output rows [tb, te) of one image: their input rows [r0, r1) copied */
        int64_t n = tb / p->ho;
        te = FL_MIN(FL_MIN(t1, tb + band), (n + 1) * p->ho);
        int64_t r0 = FL_MIN(FL_MAX((tb % p->ho) * p->sh - p->pt, 0), p->h);
        int64_t r1 = FL_MAX(FL_MIN(((te - 1) % p->ho) * p->sh - p->pt + reach, p->h), r0);
        conv_planes_copy(p, n, r0, r1, buf);
        for (int64_t t = tb; t < te; ++t) {
            int64_t oh = t % p->ho, i0, i1;
            pool_taps(oh * p->sh - p->pt, p->dh, p->kh, 0, p->h, &i0, &i1);
            const float *xw = buf + (oh * p->sh - p->pt - r0) * c * rs; /* window row 0 */
            float *yrow = p->y + (n * p->cout * p->ho + oh) * p->wo;
            int64_t o0 = 0;
            const int S = CONV_PLANES_SUMS;
            for (; o0 + 8 <= p->cout; o0 += 8) conv_planes_columns(8, S / 8, p, xw, off, i0, i1, o0, yrow);
            if (o0 + 4 <= p->cout) conv_planes_columns(4, S / 4, p, xw, off, i0, i1, o0, yrow), o0 += 4;
            if (o0 + 2 <= p->cout) conv_planes_columns(2, FL_MIN(S / 2, 12), p, xw, off, i0, i1, o0, yrow), o0 += 2;
            if (o0 < p->cout) conv_planes_columns(1, FL_MIN(S, 12), p, xw, off, i0, i1, o0, yrow);
            if (p->code != FL_LINEAR && p->code != FL_RELU) /* the bias is on the sums already */
                conv_pw_epilogue(yrow, p->ho * p->wo, p->cout, p->wo, 0, p->code, p->alpha);
        }
    }
}

/* y[n, o, oh, ow] = f(b[o] + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
 * w[i, j, ci, o]) (zeros outside x): x (N, C, H, W), w (kh, kw, C, cout) as it is, y (N, cout,
 * Ho, Wo): the passes above at column stride 2 (CONV_PLANES_S2), and at stride 1 for at most
 * CONV_PLANES_MAX_COUT output channels; else conv2d_nchw_in's (for few input channels), each
 * output row moved into the planes. */
int FL_FN(conv2d_planes)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh, int64_t kw,
                         int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                         int64_t wo, int64_t cout, const float *wk, const float *bias, int code, float alpha,
                         float *y) {
    if (sw == 1 ? cout > CONV_PLANES_MAX_COUT : sw > 2 || !CONV_PLANES_S2) /* conv2d_nchw_in's, rows moved */
        return conv_nchw_run(n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code, alpha, 1, y);
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || c < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 ||
        pl < 0)
        return -2;
    /* whole vectors past wo (each pass loads them whole) plus the window's reach in a phase,
     * whole vectors (conv_planes_copy's stores) */
    int64_t bw = ((wo + FL_VW - 1) / FL_VW) * FL_VW + (kw - 1) * dw / sw;
    bw = (bw + FL_VW - 1) / FL_VW * FL_VW;
    conv_planes_ctx p = {x, wk, bias, y, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, bw, code, 0, alpha};
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * cout * kh * kw * c)), conv_planes_task, &p);
    return p.status;
}
