/* Depthwise convolutions (multiplier 1) of small planes in blocks of FL_VW channels, for
 * depthwise_conv2d (NHWC) and depthwise_conv2d_nchw (conv_depthwise.c; which shapes:
 * conv_blocks_fit). Each block's pixels are moved into one zero-bordered buffer (the padding),
 * each pixel's FL_VW channels a vector (NHWC: one load per pixel; NCHW: a transpose of the
 * block's planes in registers, then its rows copied between the borders), its windows summed
 * CONV_BLOCKS_P outputs of a row per pass with each tap's weight vector, and the outputs moved
 * back (NCHW: transposed into their planes); a block's buffers stay in L1 / L2. No window needs
 * clipping and every output is a full vector of channels: the plane kernels ran vectors of 16
 * columns over rows of 7 or 14 and set up every row, and the NHWC kernel summed the pixels
 * whose windows cross an edge one at a time (docs/design.md, "Depthwise convolutions on small
 * planes"). Compiled once per ISA (kernels.inc). */

#include <string.h>

#include "conv_internal.h"
#include "layout_internal.h"
#include "pool_internal.h"
#include "threadpool.h"

/* Most outputs of a row summed per pass (their sums, a weight vector and, at stride 1, the
 * window row's inputs in registers), and the widest window whose inputs a pass keeps. */
#define CONV_BLOCKS_P (FL_VW >= 16 ? 8 : 4)
#define CONV_BLOCKS_KW 5

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    int nhwc; /* x and y (N, H, W, C), wk (kh, kw, C); else x and y NCHW planes, wk (C, kh, kw) */
    int64_t c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo;
    int64_t hp, wp, p; /* the padded block's rows and columns, outputs per pass */
    int code, status;
    float alpha;
} conv_blocks_ctx;

/* ob[((oh + r) wo + ow + u) FL_VW + 0:FL_VW] = f(bias + sum over taps (i, j) of xb[(((oh + r) sh
 * + i dh) wp + (ow + u) sw + j dw) FL_VW + 0:FL_VW] wt[(i kw + j) FL_VW + 0:FL_VW]) for r < R, u <
 * P: P pixels' sums of R rows (2 R P independent chains), each tap's weight vector loaded once
 * for a row's P of them. Where KW > 0 (the window's width; S the column stride, dilation 1)
 * each window row's (P - 1) S + KW input vectors are loaded once for its P KW products. */
FL_INLINE void conv_blocks_pass(const int P, const int R, const int KW, const int S, const conv_blocks_ctx *p,
                                const float *xb, const float *wt, const float *bias, int64_t nc, int64_t oh,
                                int64_t ow, float *ob) {
    fl_vf s[2][CONV_BLOCKS_P];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {
        _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) s[r][u] = fl_set1(0.0f);
    }
    int64_t step = p->sw * FL_VW, dj = p->dw * FL_VW;
    for (int64_t i = 0; i < p->kh; ++i) {
        const float *wr = wt + i * p->kw * FL_VW;
        _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {
            const float *x = xb + (((oh + r) * p->sh + i * p->dh) * p->wp + ow * p->sw) * FL_VW;
            if (KW > 0) {
                fl_vf xv[(CONV_BLOCKS_P - 1) * 2 + CONV_BLOCKS_KW];
                _Pragma("GCC unroll 20") for (int u = 0; u < (P - 1) * S + KW; ++u) xv[u] = fl_load(x + u * FL_VW);
                _Pragma("GCC unroll 8") for (int j = 0; j < KW; ++j) {
                    fl_vf wv = fl_load(wr + j * FL_VW);
                    _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) s[r][u] += xv[u * S + j] * wv;
                }
                continue;
            }
            for (int64_t j = 0; j < p->kw; ++j) {
                fl_vf wv = fl_load(wr + j * FL_VW);
                _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) s[r][u] += fl_load(x + j * dj + u * step) * wv;
            }
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; ++r) {
        float *o = ob + ((oh + r) * p->wo + ow) * FL_VW;
        _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u)
            fl_store(o + u * FL_VW, conv_epi(s[r][u], bias, nc, p->code, p->alpha));
    }
}

/* The block's output rows, two at a time where both rows' sums and one row's inputs fit the
 * registers, in passes of P pixels, the last pass of a row ending at its last pixel (it sums
 * some of the pass before's again). Rows narrower than P: one at a time, in order, a pass past
 * a row's end writing the next row's first pixels, which that row's passes write again. */
FL_INLINE void conv_blocks_rows(const int P, const int KW, const int S, const conv_blocks_ctx *p,
                                const float *xb, const float *wt, const float *bias, int64_t nc, float *ob) {
    const int two = 2 * P + (KW > 0 ? (P - 1) * S + KW : 1) + 1 <= (FL_VW >= 16 ? 31 : 15);
    int64_t ho = p->ho, wo = p->wo, oh = 0;
    if (wo < P || !two) {
        for (; oh < ho; ++oh)
            for (int64_t ow = 0; ow < wo; ow += P) conv_blocks_pass(P, 1, KW, S, p, xb, wt, bias, nc, oh, ow, ob);
        return;
    }
    for (; oh + 2 <= ho; oh += 2)
        for (int64_t ow = 0; ow < wo; ow += P)
            conv_blocks_pass(P, 2, KW, S, p, xb, wt, bias, nc, oh, FL_MIN(ow, wo - P), ob);
    if (oh < ho)
        for (int64_t ow = 0; ow < wo; ow += P)
            conv_blocks_pass(P, 1, KW, S, p, xb, wt, bias, nc, oh, FL_MIN(ow, wo - P), ob);
}

/* conv_blocks_rows at the context's pass width (CONV_BLOCKS_P or one less, whichever wastes
 * fewer pixels past a row's end) and window. */
static void conv_blocks_run(const conv_blocks_ctx *p, const float *xb, const float *wt, const float *bias,
                            int64_t nc, float *ob) {
    int kept = p->dw == 1 && (p->sw == 1 || p->sw == 2) && (p->kw == 3 || p->kw == 5);
    int kw = kept ? (int)p->kw : 0, s2 = p->sw == 2;
#define CONV_BLOCKS_RUN(P)                                                              \
    do {                                                                                \
        if (kw == 3 && !s2) conv_blocks_rows(P, 3, 1, p, xb, wt, bias, nc, ob);         \
        else if (kw == 5 && !s2) conv_blocks_rows(P, 5, 1, p, xb, wt, bias, nc, ob);    \
        else if (kw == 3) conv_blocks_rows(P, 3, 2, p, xb, wt, bias, nc, ob);           \
        else if (kw == 5) conv_blocks_rows(P, 5, 2, p, xb, wt, bias, nc, ob);           \
        else conv_blocks_rows(P, 0, 0, p, xb, wt, bias, nc, ob);                        \
    } while (0)
    if (p->p == CONV_BLOCKS_P) CONV_BLOCKS_RUN(CONV_BLOCKS_P);
    else CONV_BLOCKS_RUN(CONV_BLOCKS_P - 1);
#undef CONV_BLOCKS_RUN
}

/* Units [u0, u1) = (image, block of FL_VW channels). */
static void conv_blocks_task(void *arg, int64_t u0, int64_t u1) {
    conv_blocks_ctx *p = (conv_blocks_ctx *)arg;
    int64_t c = p->c, h = p->h, w = p->w, hw = h * w, howo = p->ho * p->wo, nt = p->kh * p->kw;
    int64_t groups = (c + FL_VW - 1) / FL_VW, wp = p->wp;
    int64_t in_floats = p->hp * wp * FL_VW;
    /* the moved planes and then the outputs (a pass's last pixels run up to P - 1 past the
     * plane's end), and the block's weights */
    int64_t out_floats = (FL_MAX(hw, howo) + p->p) * FL_VW;
    float *xb = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)(in_floats + out_floats + nt * FL_VW));
    if (!xb) {
        p->status = -1;
        return;
    }
    float *ob = xb + in_floats, *wt = ob + out_floats;
    layout_borders(xb, p->hp, wp, p->pt, p->pl, h, w, 0.0f); /* the block's pixels overwrite the rest */
    int64_t row0 = p->pt * wp + p->pl; /* x's first pixel in the buffer */
    for (int64_t u = u0; u < u1; ++u) {
        int64_t n = u / groups, c0 = (u % groups) * FL_VW, nc = FL_MIN(FL_VW, c - c0);
        const float *bias = p->bias ? p->bias + c0 : 0;
        if (p->nhwc) { /* each pixel's channels [c0, c0 + nc) one (masked) load, zeros past c */
            const float *xn = p->x + n * hw * c + c0;
            for (int64_t ih = 0; ih < h; ++ih)
                for (int64_t iw = 0; iw < w; ++iw)
                    fl_store(xb + (row0 + ih * wp + iw) * FL_VW, pool_ld(xn + (ih * w + iw) * c, nc));
            for (int64_t t = 0; t < nt; ++t) fl_store(wt + t * FL_VW, pool_ld(p->wk + t * c + c0, nc));
            conv_blocks_run(p, xb, wt, bias, nc, ob);
            float *yn = p->y + n * howo * c + c0;
            for (int64_t q = 0; q < howo; ++q) pool_st(yn + q * c, fl_load(ob + q * FL_VW), nc);
            continue;
        }
        if (nc < FL_VW) { /* a last block's lanes past c: zeros, not what a buffer held */
            memset(ob, 0, (size_t)(hw * FL_VW) * sizeof(float));
            memset(wt, 0, (size_t)(nt * FL_VW) * sizeof(float));
        }
        layout_planes_in(p->x + (n * c + c0) * hw, hw, nc, h, w, ob, xb + row0 * FL_VW, wp);
        layout_small(p->wk + c0 * nt, nt, wt, FL_VW, nc, nt); /* wt[t FL_VW + k] = wk[c0 + k, t] */
        conv_blocks_run(p, xb, wt, bias, nc, ob);
        layout_small(ob, FL_VW, p->y + (n * c + c0) * howo, howo, howo, nc); /* y[n, c0 + k] */
    }
}

/* depthwise_blocks (conv_internal.h): conv_blocks_task over the (image, block) units. */
int FL_FN(depthwise_blocks)(int nhwc, int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                            int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                            int64_t ho, int64_t wo, const float *wk, const float *bias, int code, float alpha,
                            float *y) {
    /* every window of the passes inside the buffer: ho rows, wo columns rounded up to whole
     * passes, besides x's own rows and columns */
    int64_t per = CONV_BLOCKS_P, less = CONV_BLOCKS_P - 1;
    if ((wo + less - 1) / less * less < (wo + per - 1) / per * per) per = less; /* 7, 14, 28 */
    int64_t wo_passes = (wo + per - 1) / per * per;
    int64_t hp = FL_MAX(pt + h, (ho - 1) * sh + (kh - 1) * dh + 1);
    int64_t wp = FL_MAX(pl + w, (wo_passes - 1) * sw + (kw - 1) * dw + 1);
    conv_blocks_ctx p = {x, wk, bias, y, nhwc, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, hp, wp, per, code, 0, alpha};
    int64_t units = n * ((c + FL_VW - 1) / FL_VW), per_unit = FL_MAX(1, ho * wo * kh * kw * FL_VW);
    fl_parallel(units, FL_MAX(1, CONV_MIN_SHARE_TAPS / per_unit), conv_blocks_task, &p);
    return p.status;
}
