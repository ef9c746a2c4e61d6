/* conv2d_nchw_in (conv.h): a convolution of few input channels read straight from NCHW planes
 * (a network's first layer on an image), written NHWC for the layers after it: no transpose of
 * the input to NHWC and no padded copy of it, which for 3 channels cost about as much as the
 * convolution. Vectorized over output channels: each pass holds a few output columns' sums of
 * one to four channel vectors and adds every tap's weight vectors times each column's input
 * value, the taps in the HWIO order of conv2d's sums. Compiled once per ISA
 * (kernels.inc). */

#include "conv_internal.h"
#include "gemm_internal.h"
#include "threadpool.h"

/* Channel vectors per pass (V) and output columns per pass of V vectors: a pass holds P V sums,
 * the P columns' input values (broadcast) and one weight vector in registers, P V + P + 1 of
 * AVX-512's 32 (V <= 4) or of AVX2's and the portable path's 16 (V <= 2). Fewer broadcasts per
 * multiply-add reach the FMA rate: on Zen 4, 6 x 4 and 7 x 3 blocks run at its peak, 10 x 2 at
 * 94-97 % of it, 15 x 1 at half (docs/design.md). */
#define CONV_NCHW_REGS (FL_VW >= 16 ? 32 : 16)
#define CONV_NCHW_VMAX (FL_VW >= 16 ? 4 : 2)
#define CONV_NCHW_COLS(V) ((CONV_NCHW_REGS - 1) / ((V) + 1))
#define CONV_NCHW_PMAX CONV_NCHW_COLS(1)

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t c, h, w_in, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout;
    int code;
    float alpha;
} conv_nchw_ctx;

/* Where a pass reads its input: window row i, channel ci, tap column j of output column u at
 * x[off + i rs + ci cs + j dw + u sw] (dw, sw the context's). */
typedef struct {
    const float *x;
    int64_t off, rs, cs;
} conv_nchw_src;

/* Output columns [0, pc) (pc <= P) of a pass at yo (column stride cout), channels [o0, o0 + (V -
 * 1) FL_VW + nc) (V vectors, the last nc <= FL_VW wide): every tap of window rows [i0, i1) read
 * from src (inside x, or a padded copy of the columns it needs). Per tap, the P columns' input
 * values are broadcast once, then each weight vector is loaded and multiplied with all of them.
 * SW: the column stride as a constant (0: the context's). */
FL_INLINE void conv_nchw_pass(const int P, const int V, const int SW, const conv_nchw_ctx *p, conv_nchw_src src,
                              int64_t i0, int64_t i1, int64_t o0, int64_t nc, int64_t pc, float *yo) {
    int64_t c = p->c, cout = p->cout, kw = p->kw, dw = p->dw, cs = src.cs, sw = SW ? SW : p->sw;
    fl_vf s[CONV_NCHW_PMAX][CONV_NCHW_VMAX];
    _Pragma("GCC unroll 16") for (int u = 0; u < P; ++u) {
        _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) s[u][v] = fl_set1(0.0f);
    }
    /* the taps in HWIO order: the weights' rows one after another */
    const float *wt = p->w + i0 * kw * c * cout + o0;
    for (int64_t i = i0; i < i1; ++i) {
        const float *xj = src.x + (src.off + i * src.rs);
        for (int64_t j = 0; j < kw; ++j, xj += dw) {
            const float *xc = xj;
            for (int64_t ci = 0; ci < c; ++ci, xc += cs, wt += cout) {
                fl_vf xv[CONV_NCHW_PMAX];
                _Pragma("GCC unroll 16") for (int u = 0; u < P; ++u) xv[u] = fl_set1(xc[u * sw]);
                _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) {
                    fl_vf wv = v + 1 < V ? fl_load(wt + v * FL_VW) : pool_ld(wt + v * FL_VW, nc);
                    _Pragma("GCC unroll 16") for (int u = 0; u < P; ++u) s[u][v] += xv[u] * wv;
                }
            }
        }
    }
    const float *bias = p->bias ? p->bias + o0 : 0;
    _Pragma("GCC unroll 16") for (int u = 0; u < P; ++u) {
        if (u >= pc) break;
        float *o = yo + u * cout;
        _Pragma("GCC unroll 4") for (int v = 0; v < V; ++v) {
            int64_t w = v + 1 < V ? FL_VW : nc;
            pool_st(o + v * FL_VW, conv_epi(s[u][v], bias ? bias + v * FL_VW : 0, w, p->code, p->alpha), w);
        }
    }
}

/* The pass widths of V vectors: full passes of CONV_NCHW_COLS(V) columns and, for what a row's
 * full passes leave, passes of about a half and a quarter of that (a pixel's taps are one
 * dependent chain of multiply-adds, a pass's columns independent ones). */
#define CONV_NCHW_HALF(V) ((CONV_NCHW_COLS(V) + 1) / 2)
#define CONV_NCHW_QUARTER(V) ((CONV_NCHW_COLS(V) + 3) / 4)

/* A full pass of v vectors from the planes, the column strides 1 and 2 as constants. */
static void conv_nchw_full(int64_t v, const conv_nchw_ctx *p, conv_nchw_src src, int64_t i0, int64_t i1, int64_t o0,
                           int64_t nc, float *yo) {
#define CONV_NCHW_FULL(V)                                                                                              \
    do {                                                                                                               \
        const int P = CONV_NCHW_COLS(V);                                                                               \
        if (p->sw == 1) conv_nchw_pass(P, V, 1, p, src, i0, i1, o0, nc, P, yo);                                        \
        else if (p->sw == 2) conv_nchw_pass(P, V, 2, p, src, i0, i1, o0, nc, P, yo);                                   \
        else conv_nchw_pass(P, V, 0, p, src, i0, i1, o0, nc, P, yo);                                                   \
    } while (0)
    switch (v) {
    case 1: CONV_NCHW_FULL(1); break;
    case 2: CONV_NCHW_FULL(2); break;
#if CONV_NCHW_VMAX >= 4
    case 3: CONV_NCHW_FULL(3); break;
    case 4: CONV_NCHW_FULL(4); break;
#endif
    default: break;
    }
#undef CONV_NCHW_FULL
}

/* A pass of v vectors, P of the widths above (pc columns stored), from a padded copy. */
static void conv_nchw_part(int64_t v, int P, const conv_nchw_ctx *p, conv_nchw_src src, int64_t i0, int64_t i1,
                           int64_t o0, int64_t nc, int64_t pc, float *yo) {
#define CONV_NCHW_PART(V)                                                                                              \
    do {                                                                                                               \
        if (P == CONV_NCHW_COLS(V)) conv_nchw_pass(CONV_NCHW_COLS(V), V, 0, p, src, i0, i1, o0, nc, pc, yo);           \
        else if (P == CONV_NCHW_HALF(V)) conv_nchw_pass(CONV_NCHW_HALF(V), V, 0, p, src, i0, i1, o0, nc, pc, yo);      \
        else conv_nchw_pass(CONV_NCHW_QUARTER(V), V, 0, p, src, i0, i1, o0, nc, pc, yo);                               \
    } while (0)
    switch (v) {
    case 1: CONV_NCHW_PART(1); break;
    case 2: CONV_NCHW_PART(2); break;
#if CONV_NCHW_VMAX >= 4
    case 3: CONV_NCHW_PART(3); break;
    case 4: CONV_NCHW_PART(4); break;
#endif
    default: break;
    }
#undef CONV_NCHW_PART
}

/* Floats of the padded copy a part pass reads: kh window rows of C channels' runs of (P - 1) sw +
 * (kw - 1) dw + 1 columns. Where a copy would not fit, a pixel at a time. */
#define CONV_NCHW_EDGE_FLOATS 2048

/* One output pixel (n, oh, ow), channels [o0, o0 + nc), window rows [i0, i1): the taps whose
 * column lies inside x. */
static void conv_nchw_pixel(const conv_nchw_ctx *p, int64_t n, int64_t oh, int64_t i0, int64_t i1,
                            int64_t ow, int64_t o0, int64_t nc, float *yrow) {
    int64_t c = p->c, hw = p->h * p->w_in, cout = p->cout, iw0 = ow * p->sw - p->pl, j0, j1;
    pool_taps(iw0, p->dw, p->kw, 0, p->w_in, &j0, &j1);
    fl_vf s = fl_set1(0.0f);
    for (int64_t i = i0; i < i1; ++i) {
        int64_t xr = (n * c * p->h + oh * p->sh - p->pt + i * p->dh) * p->w_in + iw0;
        for (int64_t j = j0; j < j1; ++j)
            for (int64_t ci = 0; ci < c; ++ci)
                s += fl_set1(p->x[xr + ci * hw + j * p->dw]) *
                     pool_ld(p->w + ((i * p->kw + j) * c + ci) * cout + o0, nc);
    }
    pool_st(yrow + ow * cout + o0, conv_epi(s, p->bias ? p->bias + o0 : 0, nc, p->code, p->alpha), nc);
}

/* Columns [ow, ow_end) of y row (n, oh), channels [o0, o0 + (v - 1) FL_VW + nc), any of whose
 * windows may reach outside x: passes of the fewest columns of the widths above that cover
 * what is left, each over a copy of its window rows [i0, i1) with zeros outside x. */
static void conv_nchw_edges(const conv_nchw_ctx *p, int64_t n, int64_t oh, int64_t i0, int64_t i1, int64_t ow,
                            int64_t ow_end, int64_t v, int64_t o0, int64_t nc, float *buf, float *yrow) {
    int full = CONV_NCHW_COLS(v), half = CONV_NCHW_HALF(v), quarter = CONV_NCHW_QUARTER(v);
    int64_t c = p->c;
    while (ow < ow_end) {
        int64_t left = ow_end - ow;
        int P = left > half ? full : left > quarter ? half : quarter;
        int64_t span = (P - 1) * p->sw + (p->kw - 1) * p->dw + 1, iw0 = ow * p->sw - p->pl;
        if (p->kh * c * span > CONV_NCHW_EDGE_FLOATS) {
            for (; ow < ow_end; ++ow)
                for (int64_t q = 0; q < v; ++q)
                    conv_nchw_pixel(p, n, oh, i0, i1, ow, o0 + q * FL_VW, q + 1 < v ? FL_VW : nc, yrow);
            return;
        }
        int64_t lo = FL_MIN(FL_MAX(-iw0, 0), span), hi = FL_MAX(FL_MIN(p->w_in - iw0, span), lo);
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t ci = 0; ci < c; ++ci) {
                float *d = buf + (i * c + ci) * span;
                int64_t at = ((n * c + ci) * p->h + oh * p->sh - p->pt + i * p->dh) * p->w_in + iw0;
                for (int64_t k = 0; k < lo; ++k) d[k] = 0.0f;
                for (int64_t k = lo; k < hi; ++k) d[k] = p->x[at + k];
                for (int64_t k = hi; k < span; ++k) d[k] = 0.0f;
            }
        conv_nchw_src src = {buf, 0, c * span, span};
        int64_t pc = FL_MIN(left, P);
        conv_nchw_part(v, P, p, src, i0, i1, o0, nc, pc, yrow + ow * p->cout + o0);
        ow += pc;
    }
}

/* Output rows t = n Ho + oh in [t0, t1), all columns and channels: per block of channel vectors,
 * the left edge's pass (taking interior columns up to a full pass), the interior's full passes
 * from the planes, then what is left of the row. */
static void conv_nchw_task(void *arg, int64_t t0, int64_t t1) {
    const conv_nchw_ctx *p = (const conv_nchw_ctx *)arg;
    float buf[CONV_NCHW_EDGE_FLOATS];
    /* interior columns [ow_lo, ow_hi): every tap column inside x */
    int64_t num = p->w_in - 1 - (p->kw - 1) * p->dw + p->pl;
    int64_t ow_lo = FL_MIN((p->pl + p->sw - 1) / p->sw, p->wo);
    int64_t ow_hi = FL_MAX(FL_MIN(num < 0 ? 0 : num / p->sw + 1, p->wo), ow_lo);
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, oh = t % p->ho, i0, i1;
        pool_taps(oh * p->sh - p->pt, p->dh, p->kh, 0, p->h, &i0, &i1);
        float *yrow = p->y + t * p->wo * p->cout;
        int64_t row = (n * p->c * p->h + oh * p->sh - p->pt) * p->w_in - p->pl;
        for (int64_t o0 = 0; o0 < p->cout;) {
            int64_t left = p->cout - o0, v = FL_MIN((left + FL_VW - 1) / FL_VW, CONV_NCHW_VMAX);
            int64_t nc = FL_MIN(FL_VW, left - (v - 1) * FL_VW), P = CONV_NCHW_COLS(v);
            int64_t ow = ow_lo ? FL_MIN(FL_MAX(ow_lo, P), p->wo) : 0;
            conv_nchw_edges(p, n, oh, i0, i1, 0, ow, v, o0, nc, buf, yrow);
            for (; ow + P <= ow_hi; ow += P) {
                conv_nchw_src src = {p->x, row + ow * p->sw, p->dh * p->w_in, p->h * p->w_in};
                conv_nchw_full(v, p, src, i0, i1, o0, nc, yrow + ow * p->cout + o0);
            }
            conv_nchw_edges(p, n, oh, i0, i1, ow, p->wo, v, o0, nc, buf, yrow);
            o0 += (v - 1) * FL_VW + nc;
        }
    }
}

/* y[n, oh, ow, o] = f(b[o] + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
 * w[i, j, ci, o]) (zeros outside x): x (N, C, H, W), w (kh, kw, C, cout), y (N, Ho, Wo, cout). */
int FL_FN(conv2d_nchw_in)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                          int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                          int64_t pl, int64_t ho, int64_t wo, int64_t cout, const float *wk,
                          const float *bias, int code, float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || c < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 ||
        pl < 0)
        return -2;
    conv_nchw_ctx p = {x, wk, bias, y, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, code, alpha};
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * cout * kh * kw * c)), conv_nchw_task, &p);
    return 0;
}

/* Most columns of one image per sgemm call of conv1x1_nchw (one of sgemm's blocks of b); the
 * columns split into near-equal blocks of whole panels. */
#define CONV_PW_COLS (8 * FL_PANEL)

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t cin, ldw, hw, cout, blocks, cols, chunks, rows;
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

/* Units u in [u0, u1), u = (image i, column block, chunk of output rows): one sgemm of the
 * chunk's rows of w (rows, cin) by the block's columns of the image's planes (cin, hw), then
 * the block's epilogue while it is in L2. */
static void conv_pw_task(void *arg, int64_t u0, int64_t u1) {
    conv_pw_ctx *p = (conv_pw_ctx *)arg;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t r0 = u % p->chunks * p->rows, rows = FL_MIN(p->rows, p->cout - r0), v = u / p->chunks;
        int64_t i = v / p->blocks, c0 = v % p->blocks * p->cols, len = FL_MIN(p->cols, p->hw - c0);
        float *yb = p->y + (i * p->cout + r0) * p->hw + c0;
        int st = FL_FN(sgemm)(rows, len, p->cin, p->w + r0 * p->ldw, p->ldw, p->x + i * p->cin * p->hw + c0, p->hw, 0,
                              0, yb, p->hw);
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
    int64_t blocks = (hw + CONV_PW_COLS - 1) / CONV_PW_COLS;
    int64_t cols = ((hw + blocks - 1) / blocks + FL_PANEL - 1) / FL_PANEL * FL_PANEL;
    blocks = (hw + cols - 1) / cols;
    /* fewer blocks than threads (one image of few positions): the output rows split too, in
     * whole register tiles, each chunk worth a hand-off (each packs the block's columns of x
     * again: one load and store of a value per `rows` multiply-adds with it) */
    int64_t chunks = 1, threads = fl_pool_get_threads(), taps = cols * cout * cin;
    if (n * blocks < threads && cout >= 2 * GEMM_MR) {
        chunks = FL_MIN((threads + n * blocks - 1) / (n * blocks), cout / GEMM_MR);
        chunks = FL_MAX(1, FL_MIN(chunks, taps / CONV_MIN_SHARE_TAPS));
    }
    int64_t rows = ((cout + chunks - 1) / chunks + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    chunks = (cout + rows - 1) / rows;
    conv_pw_ctx p = {x, wk, bias, y, cin, ldw, hw, cout, blocks, cols, chunks, rows, code, 0, alpha};
    fl_parallel(n * blocks * chunks, FL_MAX(1, CONV_MIN_SHARE_TAPS * chunks / taps), conv_pw_task, &p);
    return p.status;
}
