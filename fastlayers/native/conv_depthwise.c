/* depthwise_conv2d and depthwise_conv2d_nchw (conv.h): a direct loop vectorized over channels,
 * four outputs per pass (3x3: the nine weights in registers; stride 1: the passes share their
 * loads); window rows outside x read a row of zeros. On NCHW planes, through pool.c's
 * phase-split buffer, as flat planes at stride 1, or straight from the rows at column stride 2
 * on AVX-512 (below). Compiled once per ISA (kernels.inc). */

#include <string.h>

#include "conv_internal.h"
#include "pool_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

/* --------------------------------------------------------------------------- depthwise */

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    int64_t h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo;
    int code, status;
    float alpha;
} conv_dw_ctx;

/* The window rows [i0, i1) that lie inside x (the others read zeros). */
typedef struct {
    int64_t i0, i1;
} conv_dw_rows;

/* out[c0:c0 + nc] = f(b + sum over i in [i0, i1), j in [j0, j1) of rows[i][(iw0 + j dw) c +
 * c0:] wk[i, j, c0:]) (multiplier 1). */
FL_INLINE void conv_dw_chunk(const conv_dw_ctx *p, const float *const *rows, conv_dw_rows ir,
                             int64_t iw0, int64_t j0, int64_t j1, int64_t c0, int64_t nc,
                             float *out) {
    int64_t c = p->c;
    fl_vf acc = fl_set1(0.0f);
    for (int64_t i = ir.i0; i < ir.i1; ++i) {
        const float *r = rows[i] + c0, *wr = p->wk + i * p->kw * c + c0;
        for (int64_t j = j0; j < j1; ++j)
            acc += pool_ld(r + (iw0 + j * p->dw) * c, nc) * pool_ld(wr + j * c, nc);
    }
    pool_st(out + c0, conv_epi(acc, p->bias ? p->bias + c0 : 0, nc, p->code, p->alpha), nc);
}

/* One output pixel (channels [cf, c)) of a window starting at column iw0, taps j in [j0, j1)
 * of rows [i0, i1). */
static void conv_dw_pixel(const conv_dw_ctx *p, const float *const *rows, conv_dw_rows ir,
                          int64_t iw0, int64_t j0, int64_t j1, int64_t cf, float *out) {
    int64_t c0 = cf;
    for (; c0 + FL_VW <= p->c; c0 += FL_VW) conv_dw_chunk(p, rows, ir, iw0, j0, j1, c0, FL_VW, out);
    if (c0 < p->c) conv_dw_chunk(p, rows, ir, iw0, j0, j1, c0, p->c - c0, out);
}

/* One output pixel of a depth multiplier m > 1: out[ci m + q] = f(b + sum x[ci] w[ci m + q]). */
static void conv_dw_pixel_mult(const conv_dw_ctx *p, const float *const *rows, int64_t iw0,
                               int64_t j0, int64_t j1, float *out) {
    int64_t c = p->c, m = p->m, k = c * m;
    memset(out, 0, (size_t)k * sizeof(float));
    for (int64_t i = 0; i < p->kh; ++i)
        for (int64_t j = j0; j < j1; ++j) {
            const float *xr = rows[i] + (iw0 + j * p->dw) * c;
            const float *wr = p->wk + (i * p->kw + j) * k;
            for (int64_t ci = 0; ci < c; ++ci)
                for (int64_t q = 0; q < m; ++q) out[ci * m + q] += xr[ci] * wr[ci * m + q];
        }
    if (p->bias || p->code != FL_LINEAR)
        FL_FN(rows_bias_act_range)(0, 1, k, out, k, p->bias, p->code, p->alpha, out, k);
}

/* The channels past the last whole vector (c % FL_VW of them) of output columns [ow0, ow1)
 * whose windows lie inside x's columns (multiplier 1), window rows [i0, i1): four columns per
 * pass through masked loads, four independent sums (pixel by pixel, one chain of kh kw taps
 * each, they took a fifth of a 120-channel 5x5 convolution on AVX-512). */
static void conv_dw_tail(const conv_dw_ctx *p, const float *const *rows, conv_dw_rows ir,
                         int64_t ow0, int64_t ow1, float *yrow) {
    int64_t c = p->c, c0 = c / FL_VW * FL_VW, nc = c - c0;
    int64_t cs = p->sw * c, dc = p->dw * c, left = p->pl * c, ow = ow0;
    const float *bc = p->bias ? p->bias + c0 : 0;
    for (; ow + 4 <= ow1; ow += 4) {
        fl_vf s0 = fl_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t i = ir.i0; i < ir.i1; ++i) {
            const float *r = rows[i] + ow * cs - left + c0;
            const float *wr = p->wk + i * p->kw * c + c0;
            for (int64_t j = 0; j < p->kw; ++j) {
                fl_vf wv = fl_load_n(wr + j * c, nc);
                const float *rj = r + j * dc;
                s0 += fl_load_n(rj, nc) * wv;
                s1 += fl_load_n(rj + cs, nc) * wv;
                s2 += fl_load_n(rj + 2 * cs, nc) * wv;
                s3 += fl_load_n(rj + 3 * cs, nc) * wv;
            }
        }
        float *o = yrow + ow * c + c0;
        fl_store_n(o, conv_epi(s0, bc, nc, p->code, p->alpha), nc);
        fl_store_n(o + c, conv_epi(s1, bc, nc, p->code, p->alpha), nc);
        fl_store_n(o + 2 * c, conv_epi(s2, bc, nc, p->code, p->alpha), nc);
        fl_store_n(o + 3 * c, conv_epi(s3, bc, nc, p->code, p->alpha), nc);
    }
    for (; ow < ow1; ++ow)
        conv_dw_pixel(p, rows, ir, ow * p->sw - p->pl, 0, p->kw, c0, yrow + ow * c);
}

/* Output columns [ow0, ow1) of a 3x3 window inside x (multiplier 1): stride 1 four outputs per
 * pass, all channels of those four before the next four (their rows stay in L1; looping over
 * the columns inside each channel vector re-read the three input rows from L2 per vector). */
static void conv_dw3x3_run(const conv_dw_ctx *p, const float *const *rows, int64_t ow0,
                           int64_t ow1, float *yrow) {
    int64_t c = p->c, cs = p->sw * c, dc = p->dw * c, left = p->pl * c;
    int64_t cv = c / FL_VW * FL_VW;
    const float *bias = p->bias;
    int64_t ow = ow0;
    if (cs == c && dc == c) {
        for (; ow + 4 <= ow1; ow += 4)
            for (int64_t c0 = 0; c0 < cv; c0 += FL_VW) {
                const float *bc = bias ? bias + c0 : 0;
                fl_vf s0 = fl_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
                for (int i = 0; i < 3; ++i) {
                    const float *r = rows[i] + ow * c - left + c0, *wr = p->wk + 3 * i * c + c0;
                    fl_vf x0 = fl_load(r), x1 = fl_load(r + c), x2 = fl_load(r + 2 * c);
                    fl_vf x3 = fl_load(r + 3 * c), x4 = fl_load(r + 4 * c), x5 = fl_load(r + 5 * c);
                    fl_vf wa = fl_load(wr), wb = fl_load(wr + c), wc = fl_load(wr + 2 * c);
                    s0 += x0 * wa + x1 * wb + x2 * wc;
                    s1 += x1 * wa + x2 * wb + x3 * wc;
                    s2 += x2 * wa + x3 * wb + x4 * wc;
                    s3 += x3 * wa + x4 * wb + x5 * wc;
                }
                float *o = yrow + ow * c + c0;
                fl_store(o, conv_epi(s0, bc, FL_VW, p->code, p->alpha));
                fl_store(o + c, conv_epi(s1, bc, FL_VW, p->code, p->alpha));
                fl_store(o + 2 * c, conv_epi(s2, bc, FL_VW, p->code, p->alpha));
                fl_store(o + 3 * c, conv_epi(s3, bc, FL_VW, p->code, p->alpha));
            }
    }
    for (; ow < ow1; ++ow)
        for (int64_t c0 = 0; c0 < cv; c0 += FL_VW) {
            fl_vf s = fl_set1(0.0f);
            for (int i = 0; i < 3; ++i) {
                const float *r = rows[i] + ow * cs - left + c0, *wr = p->wk + 3 * i * c + c0;
                s += fl_load(r) * fl_load(wr) + fl_load(r + dc) * fl_load(wr + c) +
                     fl_load(r + 2 * dc) * fl_load(wr + 2 * c);
            }
            fl_store(yrow + ow * c + c0,
                     conv_epi(s, bias ? bias + c0 : 0, FL_VW, p->code, p->alpha));
        }
    if (cv < c) conv_dw_tail(p, rows, (conv_dw_rows){0, 3}, ow0, ow1, yrow);
}

/* Output columns [ow0, ow1) at stride 1 and dilation 1 whose windows, KW wide, lie inside x's
 * columns (multiplier 1), window rows [i0, i1): P outputs per pass (8 on AVX-512's 32
 * registers, else 4) whose taps share their loads, each window row's P + KW - 1 input vectors
 * loaded once for its P x KW products, P independent sums (four sums of 25 taps waited on
 * the FMA latency, and five loads per four products on the load ports). The sums add the
 * taps in conv_dw_chunk's order. Returns the first column not done. */
FL_INLINE int64_t conv_dw_run_s1(const int KW, const conv_dw_ctx *p, const float *const *rows,
                                 conv_dw_rows ir, int64_t ow0, int64_t ow1, float *yrow) {
    enum { P = FL_VW >= 16 ? 8 : 4 };
    int64_t c = p->c, left = p->pl * c, ow_end = ow0 + (ow1 - ow0) / P * P;
    for (int64_t c0 = 0; c0 + FL_VW <= c; c0 += FL_VW) {
        const float *bc = p->bias ? p->bias + c0 : 0;
        for (int64_t ow = ow0; ow < ow_end; ow += P) {
            fl_vf s[P];
            _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) s[u] = fl_set1(0.0f);
            for (int64_t i = ir.i0; i < ir.i1; ++i) {
                const float *r = rows[i] + ow * c - left + c0, *wr = p->wk + i * KW * c + c0;
                fl_vf xv[P + KW - 1];
                _Pragma("GCC unroll 16") for (int u = 0; u < P + KW - 1; ++u) xv[u] = fl_load(r + u * c);
                _Pragma("GCC unroll 8") for (int j = 0; j < KW; ++j) {
                    fl_vf wv = fl_load(wr + j * c);
                    _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) s[u] += xv[u + j] * wv;
                }
            }
            float *o = yrow + ow * c + c0;
            _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u)
                fl_store(o + u * c, conv_epi(s[u], bc, FL_VW, p->code, p->alpha));
        }
    }
    if (c % FL_VW) conv_dw_tail(p, rows, ir, ow0, ow_end, yrow); /* past the last whole vector */
    return ow_end;
}

/* Output columns [ow0, ow1) of a window inside x (multiplier 1, any kernel), window rows
 * [i0, i1): vector by vector of channels, four outputs per pass (each tap's weights loaded
 * once for the four); at stride 1, 5- and 7-wide windows take conv_dw_run_s1. */
static void conv_dw_run(const conv_dw_ctx *p, const float *const *rows, conv_dw_rows ir,
                        int64_t ow0, int64_t ow1, float *yrow) {
    if (p->sw == 1 && p->dw == 1 && (p->kw == 5 || p->kw == 7)) {
        ow0 = p->kw == 5 ? conv_dw_run_s1(5, p, rows, ir, ow0, ow1, yrow)
                         : conv_dw_run_s1(7, p, rows, ir, ow0, ow1, yrow);
        if (ow0 >= ow1) return;
    }
    int64_t c = p->c, cs = p->sw * c, dc = p->dw * c, left = p->pl * c;
    int64_t c0 = 0;
    for (; c0 + FL_VW <= c; c0 += FL_VW) {
        const float *bc = p->bias ? p->bias + c0 : 0;
        for (int64_t ow = ow0; ow + 4 <= ow1; ow += 4) {
            fl_vf s0 = fl_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t i = ir.i0; i < ir.i1; ++i) {
                const float *r = rows[i] + ow * cs - left + c0;
                const float *wr = p->wk + i * p->kw * c + c0;
                for (int64_t j = 0; j < p->kw; ++j) {
                    fl_vf wv = fl_load(wr + j * c);
                    const float *rj = r + j * dc;
                    s0 += fl_load(rj) * wv;
                    s1 += fl_load(rj + cs) * wv;
                    s2 += fl_load(rj + 2 * cs) * wv;
                    s3 += fl_load(rj + 3 * cs) * wv;
                }
            }
            float *o = yrow + ow * c + c0;
            fl_store(o, conv_epi(s0, bc, FL_VW, p->code, p->alpha));
            fl_store(o + c, conv_epi(s1, bc, FL_VW, p->code, p->alpha));
            fl_store(o + 2 * c, conv_epi(s2, bc, FL_VW, p->code, p->alpha));
            fl_store(o + 3 * c, conv_epi(s3, bc, FL_VW, p->code, p->alpha));
        }
    }
    int64_t ow = ow0 + (ow1 - ow0) / 4 * 4;
    if (c0 < c) conv_dw_tail(p, rows, ir, ow0, ow, yrow);
    for (int64_t q = ow; q < ow1; ++q)                  /* the last columns, pixel by pixel */
        conv_dw_pixel(p, rows, ir, q * p->sw - p->pl, 0, p->kw, 0, yrow + q * c);
}

/* Output rows t = n Ho + oh in [t0, t1): window rows outside x read a row of zeros. */
static void conv_dw_task(void *arg, int64_t t0, int64_t t1) {
    conv_dw_ctx *p = (conv_dw_ctx *)arg;
    int64_t c = p->c, k = c * p->m, wo = p->wo;
    const float *zero = FL_FN(pool_zeros)((size_t)(p->w * c));
    if (!zero) {
        p->status = -1;
        return;
    }
    /* interior columns [ow_lo, ow_hi): every tap inside x */
    int64_t num = p->w - 1 - (p->kw - 1) * p->dw + p->pl;
    int64_t ow_lo = FL_MIN((p->pl + p->sw - 1) / p->sw, wo);
    int64_t ow_hi = FL_MAX(FL_MIN(num < 0 ? 0 : num / p->sw + 1, wo), ow_lo);
    const float *rows[p->kh];
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, ih0 = (t % p->ho) * p->sh - p->pt;
        for (int64_t i = 0; i < p->kh; ++i) {
            int64_t ih = ih0 + i * p->dh;
            rows[i] = ih >= 0 && ih < p->h ? p->x + (n * p->h + ih) * p->w * c : zero;
        }
        conv_dw_rows ir;   /* the window rows inside x: the others add nothing */
        pool_taps(ih0, p->dh, p->kh, 0, p->h, &ir.i0, &ir.i1);
        float *yrow = p->y + t * wo * k;
        for (int64_t ow = 0; ow < wo; ++ow) {
            if (ow == ow_lo && p->m == 1 && ow_hi > ow_lo) {
                if (p->kh == 3 && p->kw == 3) conv_dw3x3_run(p, rows, ow_lo, ow_hi, yrow);
                else conv_dw_run(p, rows, ir, ow_lo, ow_hi, yrow);
                ow = ow_hi - 1;
                continue;
            }
            int64_t iw0 = ow * p->sw - p->pl, j0, j1;
            pool_taps(iw0, p->dw, p->kw, 0, p->w, &j0, &j1);
            if (p->m == 1) conv_dw_pixel(p, rows, ir, iw0, j0, j1, 0, yrow + ow * k);
            else conv_dw_pixel_mult(p, rows, iw0, j0, j1, yrow + ow * k);
        }
    }
}

/* y[.., c m + q] = f(b + sum_{i, j} x[.., c] wk[i, j, c m + q]): x (N, H, W, C), wk (kh, kw,
 * C m), bias (C m,), y (N, Ho, Wo, C m). */
int FL_FN(depthwise_conv2d)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x,
                            int64_t kh, int64_t kw, int64_t m, int64_t sh, int64_t sw,
                            int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                            int64_t wo, const float *wk, const float *bias, int code,
                            float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || c <= 0 || m <= 0) return 0;
    if (!conv_code_ok(code) || kh < 1 || kw < 1) return -2;
    if (conv_blocks_fit(1, c, h, w, kh, kw, sw, m))
        return FL_FN(depthwise_blocks)(1, n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code, alpha, y);
    conv_dw_ctx p = {x, wk, bias, y, h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo, code, 0,
                     alpha};
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * c * m * kh * kw)), conv_dw_task,
                &p);
    return p.status;
}

/* ------------------------------------------------------------------- depthwise, NCHW planes */
/* Output plane (n, co) reads input plane (n, co / m) through pool.c's phase-split buffer
 * (pool_plane_gather, zero fill): each tap of FL_VW output columns is one vector load times the
 * tap's weight, four vectors per pass, then bias and activation in registers. */

/* out[0:nv FL_VW] (the last vector cut to `last` lanes) = f(bias + sum over taps t < nt of
 * b[off[t] + 0:nv FL_VW] wt[t]). Even and odd taps add into separate sums: 2 nv independent
 * FMA chains (one chain of nt FMAs per vector left the FMA units idle on their latency). */
FL_INLINE void conv_plane_vecs(const float *b, const int64_t *off, const float *wt, int64_t nt,
                               int nv, float bias, int code, float alpha, float *out,
                               int64_t last) {
    fl_vf acc[4], odd[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        acc[u] = fl_set1(bias);
        odd[u] = fl_set1(0.0f);
    }
    int64_t t = 0;
    for (; t + 1 < nt; t += 2) {
        const float *p0 = b + off[t], *p1 = b + off[t + 1];
        fl_vf w0 = fl_set1(wt[t]), w1 = fl_set1(wt[t + 1]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
            acc[u] += fl_load(p0 + u * FL_VW) * w0;
            odd[u] += fl_load(p1 + u * FL_VW) * w1;
        }
    }
    if (t < nt) {
        const float *p0 = b + off[t];
        fl_vf w0 = fl_set1(wt[t]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) acc[u] += fl_load(p0 + u * FL_VW) * w0;
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        fl_vf r = acc[u] + odd[u];
        pool_st(out + u * FL_VW, code == FL_LINEAR ? r : rows_vact(r, code, alpha),
                u == nv - 1 ? last : FL_VW);
    }
}

/* One output row out[0:wo] whose windows start at b (buffer row of window row 0): four vectors
 * per pass, the last 1-4 vectors in one pass. */
FL_INLINE void conv_plane_row(const float *b, const int64_t *off, const float *wt, int64_t nt,
                              int64_t wo, float bias, int code, float alpha, float *out) {
    int64_t ow = 0;
    for (; wo - ow > 4 * FL_VW; ow += 4 * FL_VW)
        conv_plane_vecs(b + ow, off, wt, nt, 4, bias, code, alpha, out + ow, FL_VW);
    int64_t rest = wo - ow, nv = (rest + FL_VW - 1) / FL_VW, last = rest - (nv - 1) * FL_VW;
    if (nv == 4) conv_plane_vecs(b + ow, off, wt, nt, 4, bias, code, alpha, out + ow, last);
    else if (nv == 3) conv_plane_vecs(b + ow, off, wt, nt, 3, bias, code, alpha, out + ow, last);
    else if (nv == 2) conv_plane_vecs(b + ow, off, wt, nt, 2, bias, code, alpha, out + ow, last);
    else conv_plane_vecs(b + ow, off, wt, nt, 1, bias, code, alpha, out + ow, last);
}

#if FL_VW == 16 && defined(__AVX512F__)
/* The floats lo[j:] then hi[:j] (j <= 4, a constant once unrolled: the bands' windows are 3
 * or 5 columns wide): the window column j of the vector lo, from the two whole vectors it
 * spans (one valignd). */
FL_INLINE fl_vf conv_band_shift(fl_vf lo, fl_vf hi, int j) {
    __m512i l = _mm512_castps_si512((__m512)lo), h = _mm512_castps_si512((__m512)hi);
    switch (j) {
    case 0: return lo;
    case 1: return (fl_vf)_mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 1));
    case 2: return (fl_vf)_mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 2));
    case 3: return (fl_vf)_mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 3));
    default: return (fl_vf)_mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 4));
    }
}
/* Whole vectors of each buffer row, the window columns shifted out of them: a load at a column
 * off a 64-byte line spans two lines, and such loads ran at one a cycle, half the rate of
 * aligned ones, which made them, not the FMAs, the band's bound (docs/design.md). */
#define CONV_BAND_SHIFTS 1
#else
#define CONV_BAND_SHIFTS 0
#endif

#if FL_VW >= 8
/* Stride 1, undilated, on a unit's buffer (rows len floats apart, zero-padded): CONV_BAND_ROWS
 * output rows at a time, so that each input vector is loaded once for every output row whose
 * window reads it (3x3: 18 loads for 4 rows of a vector instead of 36), the taps' weights
 * broadcast from memory inside the FMAs, the accumulators' FMA chains independent across rows
 * and vectors. */
#define CONV_BAND_ROWS 4

/* out[r wo + u FL_VW + 0:FL_VW] for r < rows, u < nv (the last vector cut to `last` lanes) =
 * f(bias + sum over i < kh, j < kw of b[(r + i) len + j + u FL_VW + 0:FL_VW] wv[i kw + j]).
 * With CONV_BAND_SHIFTS, b's rows are read as nv + 1 whole vectors each: b + q len on a
 * vector's boundary, and the vector past the group inside the row (depthwise_conv2d_nchw's
 * buffer rows). */
FL_INLINE void conv_band_vecs(const float *b, int64_t len, int kh, int kw, int rows, int nv,
                              const float *wv, float bias, int code, float alpha, float *out,
                              int64_t wo, int64_t last) {
    fl_vf acc[CONV_BAND_ROWS][2];
    _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r)
        _Pragma("GCC unroll 2") for (int u = 0; u < nv; ++u) acc[r][u] = fl_set1(bias);
    _Pragma("GCC unroll 12") for (int q = 0; q < rows + kh - 1; ++q) {
#if CONV_BAND_SHIFTS
        fl_vf whole[3];
        _Pragma("GCC unroll 3") for (int u = 0; u <= nv; ++u) whole[u] = fl_load(b + q * len + u * FL_VW);
#endif
        _Pragma("GCC unroll 5") for (int j = 0; j < kw; ++j) {
            fl_vf v[2];
#if CONV_BAND_SHIFTS
            _Pragma("GCC unroll 2") for (int u = 0; u < nv; ++u) v[u] = conv_band_shift(whole[u], whole[u + 1], j);
#else
            _Pragma("GCC unroll 2") for (int u = 0; u < nv; ++u) v[u] = fl_load(b + q * len + j + u * FL_VW);
#endif
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; ++r) {
                int i = q - r;
                if (i < 0 || i >= kh) continue;
                _Pragma("GCC unroll 2") for (int u = 0; u < nv; ++u) acc[r][u] += v[u] * fl_set1(wv[i * kw + j]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < rows; ++r)
        _Pragma("GCC unroll 2") for (int u = 0; u < nv; ++u) {
            fl_vf z = code == FL_LINEAR ? acc[r][u] : rows_vact(acc[r][u], code, alpha);
            pool_st(out + r * wo + u * FL_VW, z, u == nv - 1 ? last : FL_VW);
        }
}

/* Output rows [0, rows) (rows <= CONV_BAND_ROWS) of width wo: groups of NV vectors (NV FL_VW
 * columns), the last group one or two vectors, cut at wo. */
FL_INLINE void conv_band_rows(const float *b, int64_t len, int kh, int kw, int rows, int nv,
                              const float *wv, float bias, int code, float alpha, float *out,
                              int64_t wo) {
    int64_t ow = 0;
    for (; wo - ow > nv * FL_VW; ow += nv * FL_VW)
        conv_band_vecs(b + ow, len, kh, kw, rows, nv, wv, bias, code, alpha, out + ow, wo, FL_VW);
    int64_t rest = wo - ow, last = rest - (rest - 1) / FL_VW * FL_VW;
    if (rest > FL_VW)
        conv_band_vecs(b + ow, len, kh, kw, rows, 2, wv, bias, code, alpha, out + ow, wo, last);
    else
        conv_band_vecs(b + ow, len, kh, kw, rows, 1, wv, bias, code, alpha, out + ow, wo, last);
}

/* Output rows [0, n_rows) of one plane's unit by conv_band_rows, bands of CONV_BAND_ROWS rows:
 * window kh x kw (3x3 two vectors per group, 5x5 one: accumulators and weights within the 32
 * registers). */
FL_INLINE void conv_band_plane(const float *b, int64_t len, int kh, int kw, int64_t n_rows,
                               const float *wt, float bias, int code, float alpha, float *out,
                               int64_t wo) {
    const int nv = kh * kw > 9 ? 1 : 2;
    int64_t r0 = 0;
    for (; r0 + CONV_BAND_ROWS <= n_rows; r0 += CONV_BAND_ROWS)
        conv_band_rows(b + r0 * len, len, kh, kw, CONV_BAND_ROWS, nv, wt, bias, code, alpha,
                       out + r0 * wo, wo);
    if (n_rows - r0 >= 2) {
        conv_band_rows(b + r0 * len, len, kh, kw, 2, nv, wt, bias, code, alpha, out + r0 * wo, wo);
        r0 += 2;
    }
    if (n_rows > r0)
        conv_band_rows(b + r0 * len, len, kh, kw, 1, nv, wt, bias, code, alpha, out + r0 * wo, wo);
}

#endif

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    const int64_t *off;
    pool_plane_plan q;
    int64_t c, h, w, m, kh, kw, sh, sw, dh, pt, pl, ho, wo;
    int code, status;
    float alpha;
    int band; /* 3 or 5: a square window of that size at stride 1, undilated (conv_band_plane) */
} conv_plane_ctx;

/* Units u = (n C m + co) blocks + block in [u0, u1) of depthwise_conv2d_nchw. */
static void conv_plane_task(void *arg, int64_t u0, int64_t u1) {
    conv_plane_ctx *p = (conv_plane_ctx *)arg;
    int64_t nt = p->kh * p->kw, cm = p->c * p->m;
    float *buf = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)p->q.floats);
    if (!buf) {
        p->status = -1;
        return;
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t plane = u / p->q.blocks, oh0 = u % p->q.blocks * p->q.rb;
        int64_t oh1 = FL_MIN(oh0 + p->q.rb, p->ho);
        int64_t n = plane / cm, co = plane % cm;
        int64_t nr = (oh1 - 1 - oh0) * p->sh + (p->kh - 1) * p->dh + 1;
        FL_FN(pool_plane_gather)(p->x + (n * p->c + co / p->m) * p->h * p->w, p->h, p->w,
                                 oh0 * p->sh - p->pt, nr, p->pl, p->sw, p->q.len, 0.0f, buf);
        const float *wt = p->wk + co * nt;
        float bias = p->bias ? p->bias[co] : 0.0f;
#if FL_VW >= 8 /* (the portable path's 4-lane vectors keep the rows: its 5x5 bands were 1.6x slower) */
        float *y0 = p->y + (plane * p->ho + oh0) * p->wo;
        if (p->band == 3) {
            conv_band_plane(buf, p->q.len, 3, 3, oh1 - oh0, wt, bias, p->code, p->alpha, y0, p->wo);
            continue;
        }
        if (p->band == 5) {
            conv_band_plane(buf, p->q.len, 5, 5, oh1 - oh0, wt, bias, p->code, p->alpha, y0, p->wo);
            continue;
        }
#endif
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            const float *b = buf + (oh - oh0) * p->sh * p->sw * p->q.len;
            float *out = p->y + (plane * p->ho + oh) * p->wo;
            if (nt == 9) conv_plane_row(b, p->off, wt, 9, p->wo, bias, p->code, p->alpha, out);
            else conv_plane_row(b, p->off, wt, nt, p->wo, bias, p->code, p->alpha, out);
        }
    }
}

/* Planes that fit the flat path (pool_flat_fits: stride 1, the output as wide as the input,
 * wo == w: pl + pr = (kw - 1) dw) are each one flat array: the input plane is copied between
 * rows of zeros (the vertical padding), and each vector of FL_VW consecutive outputs adds its
 * taps as loads at fixed offsets, each masked to the lanes whose column stays in its row
 * (column + j dw - pl in [0, w): 0 elsewhere). Vectors go in blocks of CONV_FLAT_ROWS one row
 * apart, which read the same input rows shifted by one: each input vector is loaded once for
 * the block (5x5: 40 loads for 4 output vectors instead of 100). No per-row setup, and at most
 * a vector per row of partial lanes. */
/* Most window columns and rows the flat path takes. */
#define CONV_FLAT_COLS 16
#define CONV_FLAT_KH 16

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    const float *colf; /* e % w as a float, e < ho w + FL_VW */
    int64_t c, h, w, m, kh, kw, dh, dw, pt, pl, ho, top, below;
    int code, status;
    float alpha;
} conv_flat_ctx;

/* Output rows that share their input loads on the flat path. */
#define CONV_FLAT_ROWS 4

/* acc[r] += sum over window rows i of b[e + (r + i dh) w + off[j] + 0:FL_VW] wt[i kw + j] for
 * r < rows: tap column j of conv_flat_block, the loads masked to the lanes with lo[j] <=
 * col < hi[j] (0 elsewhere; the same lanes on every row, as e + r w has e's column), each
 * input row's vector loaded once for every output row that reads it, the column's kh weights
 * in registers. */
FL_INLINE void conv_flat_column(const float *b, int64_t e, int64_t w, fl_vf col, int rows,
                                int64_t kh, int64_t dh, int64_t kw, int64_t j, const int64_t *off,
                                const fl_vf *lo, const fl_vf *hi, const float *wt, fl_vf *acc) {
    fl_vi in = (col >= lo[j]) & (col < hi[j]);
    fl_vf zero = fl_set1(0.0f), wv[CONV_FLAT_KH];
    for (int64_t i = 0; i < kh; ++i) wv[i] = fl_set1(wt[i * kw + j]);
    const float *s = b + e + off[j];
    for (int64_t q = 0; q < rows + (kh - 1) * dh; ++q) {
        fl_vf v = fl_select(in, fl_load(s + q * w), zero);
        _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r) {
            int64_t d = q - r;
            if (d >= 0 && d % dh == 0 && d / dh < kh) acc[r] += v * wv[d / dh];
        }
    }
}

/* y[e + r w + 0:FL_VW] for r < rows (cut at total) = f(bias + sum over taps (i, j) of b[e +
 * (r + i dh) w + off[j] + 0:FL_VW] wt[i kw + j]): tap column by tap column
 * (conv_flat_column), even and odd columns in two chains per row. */
FL_INLINE void conv_flat_block(const float *b, int64_t e, int64_t w, const float *colf,
                               int64_t total, int rows, int64_t kh, int64_t kw, int64_t dh,
                               const int64_t *off, const fl_vf *lo, const fl_vf *hi,
                               const float *wt, float bias, int code, float alpha, float *y) {
    fl_vf col = fl_load(colf + e), even[CONV_FLAT_ROWS], odd[CONV_FLAT_ROWS];
    _Pragma("GCC unroll 4") for (int r = 0; r < CONV_FLAT_ROWS; ++r) {
        even[r] = fl_set1(bias);
        odd[r] = fl_set1(0.0f);
    }
    int64_t j = 0;
    for (; j + 1 < kw; j += 2) {
        conv_flat_column(b, e, w, col, rows, kh, dh, kw, j, off, lo, hi, wt, even);
        conv_flat_column(b, e, w, col, rows, kh, dh, kw, j + 1, off, lo, hi, wt, odd);
    }
    if (j < kw) conv_flat_column(b, e, w, col, rows, kh, dh, kw, j, off, lo, hi, wt, even);
    _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r) {
        int64_t at = e + r * w;
        if (at >= total) break;
        fl_vf sum = even[r] + odd[r];
        pool_st(y + at, code == FL_LINEAR ? sum : rows_vact(sum, code, alpha), total - at);
    }
}

/* One output plane y[0:ho w] of conv_flat_block: bands of CONV_FLAT_ROWS rows, each row's
 * columns in vectors (the last one running into the next row: those lanes are written again,
 * the same values, by the next band). */
FL_INLINE void conv_flat_plane(const float *b, int64_t w, int64_t ho, const float *colf,
                               int64_t kh, int64_t kw, int64_t dh, const int64_t *off,
                               const fl_vf *lo, const fl_vf *hi, const float *wt, float bias,
                               int code, float alpha, float *y) {
    int64_t total = ho * w;
    for (int64_t r0 = 0; r0 < ho; r0 += CONV_FLAT_ROWS) {
        int rows = (int)FL_MIN(CONV_FLAT_ROWS, ho - r0);
        for (int64_t c = 0; c < w; c += FL_VW) {
            if (rows == CONV_FLAT_ROWS)
                conv_flat_block(b, r0 * w + c, w, colf, total, CONV_FLAT_ROWS, kh, kw, dh, off, lo,
                                hi, wt, bias, code, alpha, y);
            else
                conv_flat_block(b, r0 * w + c, w, colf, total, rows, kh, kw, dh, off, lo, hi, wt,
                                bias, code, alpha, y);
        }
    }
}

/* Planes [u0, u1) of depthwise_conv2d_nchw's flat path. */
static void conv_flat_task(void *arg, int64_t u0, int64_t u1) {
    conv_flat_ctx *p = (conv_flat_ctx *)arg;
    int64_t w = p->w, total = p->ho * w, plane = p->h * w, cm = p->c * p->m, nt = p->kh * p->kw;
    /* loads reach pl columns before a row and (kw - 1) dw - pl after it, a vector's slack past
     * the last output */
    int64_t before = p->top * w + p->pl + FL_VW;
    int64_t after = p->below * w + (p->kw - 1) * p->dw - p->pl + FL_VW;
    float *buf = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)(before + plane + after));
    if (!buf) {
        p->status = -1;
        return;
    }
    memset(buf, 0, (size_t)before * sizeof(float));
    memset(buf + before + plane, 0, (size_t)after * sizeof(float));
    int64_t off[CONV_FLAT_COLS];
    fl_vf lo[CONV_FLAT_COLS], hi[CONV_FLAT_COLS];
    for (int64_t j = 0; j < p->kw; ++j) { /* tap column j of output column c reads c + off[j] */
        off[j] = j * p->dw - p->pl;        /* of the row: -off[j] <= c < w - off[j] */
        lo[j] = fl_set1((float)-off[j]);
        hi[j] = fl_set1((float)(w - off[j]));
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t n = u / cm, co = u % cm;
        memcpy(buf + before, p->x + (n * p->c + co / p->m) * plane, (size_t)plane * sizeof(float));
        /* output e's window row 0 starts pt rows above its row */
        const float *b = buf + before - p->pt * w;
        const float *wt = p->wk + co * nt;
        float bias = p->bias ? p->bias[co] : 0.0f;
        float *y = p->y + u * total;
        if (nt == 9 && p->kw == 3 && p->dh == 1)
            conv_flat_plane(b, w, p->ho, p->colf, 3, 3, 1, off, lo, hi, wt, bias, p->code,
                            p->alpha, y);
        else if (nt == 25 && p->kw == 5 && p->dh == 1)
            conv_flat_plane(b, w, p->ho, p->colf, 5, 5, 1, off, lo, hi, wt, bias, p->code,
                            p->alpha, y);
        else
            conv_flat_plane(b, w, p->ho, p->colf, p->kh, p->kw, p->dh, off, lo, hi, wt, bias,
                            p->code, p->alpha, y);
    }
}

/* depthwise_conv2d_nchw on its flat path (conv_flat_task). */
static int conv_flat(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t m,
                     int64_t kh, int64_t kw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                     int64_t ho, const float *wk, const float *bias, int code, float alpha,
                     float *y) {
    int64_t total = ho * w;
    float *colf = (float *)malloc((size_t)(total + FL_VW) * sizeof(float));
    if (!colf) return -1;
    for (int64_t e = 0, col = 0; e < total + FL_VW; ++e) {
        colf[e] = (float)col;
        col = col + 1 == w ? 0 : col + 1;
    }
    /* rows of zeros above the plane (its top padding) and below it (the last window's rows
     * past the plane) */
    int64_t top = pt, below = FL_MAX(0, ho - 1 - pt + (kh - 1) * dh - (h - 1));
    conv_flat_ctx p = {x, wk, bias, y, colf, c, h, w, m, kh, kw, dh, dw, pt, pl, ho, top, below,
                       code, 0, alpha};
    fl_parallel(n * c * m, FL_MAX(1, CONV_MIN_SHARE_TAPS / FL_MAX(1, total * kh * kw)),
                conv_flat_task, &p);
    free(colf);
    return p.status;
}

/* Planes at column stride 2 (undilated columns) on AVX-512, read straight from x: for FL_VW
 * output columns k0 + k, tap columns j and j + 1 read x[2 (k0 + k) + j - pl] and the next
 * float, the even and the odd lanes of the same two loads (one in-lane shuffle each, the sums
 * kept in that shuffle's order until the store; no phase-split buffer, whose stores cost more
 * than the taps). A row's columns go in groups of
 * up to four vectors; a group that reads past either end of its rows loads through masks
 * (zeros outside the row; masked lanes are not read) computed once per task: where only its
 * first vector's first loads and its last vector's second loads leave the row (a plane's first
 * and last groups, as a rule), those alone, held in registers (conv_s2_edges). The window rows
 * inside x are found once per output row. On AVX2 a two-source shuffle is several
 * instructions and the phase-split buffer is faster. */
#if FL_VW == 16 && defined(__AVX512F__)
#define CONV_S2 1
/* Most window columns the stride-2 path takes, and their pairs. */
#define CONV_S2_COLS 8
#define CONV_S2_PAIRS (CONV_S2_COLS / 2)
/* The even and the odd floats of two vectors a, b within each 128-bit lane (vshufps, where
 * the in-order two-source permute costs several times as much): position 4 l + q holds the
 * pair's even (odd) float 2 l + q for q < 2, 8 + 2 l + q - 2 else; every tap's sums carry
 * that order, put right once per output vector (CONV_S2_ORDER). */
#define CONV_S2_EVENS 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30
#define CONV_S2_ODDS 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31
#define CONV_S2_ORDER 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    int64_t c, h, w, m, kh, kw, sh, dh, pt, pl, ho, wo, rb, blocks;
    int code;
    float alpha;
} conv_s2_ctx;

/* The load masks of a group of vectors: [u][pair][0 or 1], the two loads of tap columns
 * (2 pair, 2 pair + 1) for vector u. */
typedef __mmask16 conv_s2_masks[4][CONV_S2_PAIRS][2];

/* The masks of a group whose loads leave its rows only in its first vector's first loads and its
 * last vector's second loads (conv_s2_edges_of): first[pair], last[pair]. Passed by value, so
 * that they stay in registers: the whole table of a group's masks lives on the stack, a mask
 * loaded from it per masked load. */
typedef struct {
    __mmask16 first[CONV_S2_PAIRS], last[CONV_S2_PAIRS];
} conv_s2_edges;

/* Lanes lo <= k < hi of a vector (clamped to it). */
FL_INLINE __mmask16 conv_s2_lanes(int64_t lo, int64_t hi) {
    lo = FL_MIN(FL_MAX(lo, 0), 16);
    hi = FL_MIN(FL_MAX(hi, lo), 16);
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* Whether the group of nv vectors at output column k0 reads only inside its rows [0, w). */
FL_INLINE int conv_s2_inside(int64_t w, int64_t k0, int64_t nv, int64_t pl, int64_t kw) {
    int64_t s0_last = 2 * (k0 + (nv - 1) * FL_VW) + ((kw - 1) & ~INT64_C(1)) - pl;
    return 2 * k0 - pl >= 0 && s0_last + 2 * FL_VW <= w;
}

/* mk: the masks of the group of nv vectors at output column k0. */
static void conv_s2_masks_of(int64_t w, int64_t k0, int64_t nv, int64_t pl, int64_t kw,
                             conv_s2_masks mk) {
    for (int64_t u = 0; u < nv; ++u)
        for (int64_t j = 0; j < kw; j += 2) {
            int64_t s0 = 2 * (k0 + u * FL_VW) + j - pl;
            mk[u][j / 2][0] = conv_s2_lanes(-s0, w - s0);
            mk[u][j / 2][1] = conv_s2_lanes(-s0 - FL_VW, w - s0 - FL_VW);
        }
}

/* Whether the group of nv vectors with masks mk needs masks only where conv_s2_edges has them,
 * and those masks in ed. */
static int conv_s2_edges_of(const conv_s2_masks mk, int64_t nv, int64_t kw, conv_s2_edges *ed) {
    for (int64_t u = 0; u < nv; ++u)
        for (int64_t q = 0; q < (kw + 1) / 2; ++q) {
            if (u > 0 && mk[u][q][0] != 0xFFFF) return 0;
            if (u < nv - 1 && mk[u][q][1] != 0xFFFF) return 0;
        }
    for (int64_t q = 0; q < CONV_S2_PAIRS; ++q) {
        ed->first[q] = q < (kw + 1) / 2 ? mk[0][q][0] : 0;
        ed->last[q] = q < (kw + 1) / 2 ? mk[nv - 1][q][1] : 0;
    }
    return 1;
}

/* even[u] += sum over even j < kw of v_j[u] wr[j], odd[u] likewise over odd j, for u < nv:
 * v_j[u][k] = row[2 (k0 + u FL_VW + k) + j - pl] for one input row, through the masks mk
 * where given (zero outside row[0:w]), else through ed's where use_ed, else plain loads. */
FL_INLINE void conv_s2_row(const float *row, int64_t k0, int64_t pl, int64_t kw,
                           const float *wr, int nv, const conv_s2_masks *mk, conv_s2_edges ed,
                           int use_ed, fl_vf *even, fl_vf *odd) {
    for (int64_t j = 0; j < kw; j += 2) {
        fl_vf we = fl_set1(wr[j]), wo = fl_set1(j + 1 < kw ? wr[j + 1] : 0.0f);
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
            const float *s = row + 2 * (k0 + u * FL_VW) + j - pl;
            fl_vf a = mk                     ? (fl_vf)_mm512_maskz_loadu_ps((*mk)[u][j / 2][0], s)
                      : use_ed && u == 0      ? (fl_vf)_mm512_maskz_loadu_ps(ed.first[j / 2], s)
                                              : fl_load(s);
            fl_vf b = mk                     ? (fl_vf)_mm512_maskz_loadu_ps((*mk)[u][j / 2][1], s + FL_VW)
                      : use_ed && u == nv - 1 ? (fl_vf)_mm512_maskz_loadu_ps(ed.last[j / 2], s + FL_VW)
                                              : fl_load(s + FL_VW);
            even[u] += FL_SHUF(a, b, CONV_S2_EVENS) * we;
            if (j + 1 < kw) odd[u] += FL_SHUF(a, b, CONV_S2_ODDS) * wo;
        }
    }
}

/* out[k0:k0 + nv FL_VW] (the last vector cut to `last` lanes) = f(bias + sum over window rows
 * i inside x and columns j of x[ih0 + i dh, 2 k + j - pl] wt[i kw + j]) of one output row. */
FL_INLINE void conv_s2_vecs(const conv_s2_ctx *p, const float *xp, int64_t ih0, const float *wt,
                            int64_t kw, int64_t k0, int nv, const conv_s2_masks *mk,
                            conv_s2_edges ed, int use_ed, float bias, float *out, int64_t last) {
    fl_vf even[4], odd[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        even[u] = fl_set1(bias);
        odd[u] = fl_set1(0.0f);
    }
    int64_t i0, i1, step = p->dh * p->w; /* the window rows inside x */
    pool_taps(ih0, p->dh, p->kh, 0, p->h, &i0, &i1);
    const float *row = xp + (ih0 + i0 * p->dh) * p->w, *wr = wt + i0 * kw;
    for (int64_t i = i0; i < i1; ++i, row += step, wr += kw)
        conv_s2_row(row, k0, p->pl, kw, wr, nv, mk, ed, use_ed, even, odd);
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        fl_vf r = even[u] + odd[u];
        r = FL_SHUF(r, r, CONV_S2_ORDER);
        pool_st(out + k0 + u * FL_VW, p->code == FL_LINEAR ? r : rows_vact(r, p->code, p->alpha),
                u == nv - 1 ? last : FL_VW);
    }
}

/* conv_s2_vecs for a group of nv (1 to 4) vectors: plain loads where it reads inside its rows,
 * else through ed where use_ed, else through mk; 3 and 5 window columns as constants (the pairs
 * unrolled). */
FL_INLINE void conv_s2_group(const conv_s2_ctx *p, const float *xp, int64_t ih0, const float *wt,
                             int64_t k0, int64_t nv, int inside, const conv_s2_masks *mk,
                             conv_s2_edges ed, int use_ed, float bias, float *out, int64_t last) {
#define CONV_S2_KW(n, kw)                                                                  \
    do {                                                                                   \
        if (inside) conv_s2_vecs(p, xp, ih0, wt, kw, k0, n, NULL, ed, 0, bias, out, last); \
        else if (use_ed) conv_s2_vecs(p, xp, ih0, wt, kw, k0, n, NULL, ed, 1, bias, out, last); \
        else conv_s2_vecs(p, xp, ih0, wt, kw, k0, n, mk, ed, 0, bias, out, last);          \
    } while (0)
#define CONV_S2_NV(n)                                                                      \
    do {                                                                                   \
        if (p->kw == 3) CONV_S2_KW(n, 3);                                                  \
        else if (p->kw == 5) CONV_S2_KW(n, 5);                                             \
        else CONV_S2_KW(n, p->kw);                                                         \
    } while (0)
    if (nv == 4) CONV_S2_NV(4);
    else if (nv == 3) CONV_S2_NV(3);
    else if (nv == 2) CONV_S2_NV(2);
    else CONV_S2_NV(1);
#undef CONV_S2_NV
#undef CONV_S2_KW
}

/* Units u = (n C m + co) blocks + block in [u0, u1) of the stride-2 path. */
static void conv_s2_task(void *arg, int64_t u0, int64_t u1) {
    conv_s2_ctx *p = (conv_s2_ctx *)arg;
    int64_t cm = p->c * p->m, nt = p->kh * p->kw, wo = p->wo, w = p->w, pl = p->pl, kw = p->kw;
    /* every row's groups: full groups of four vectors at k0 < k_last, then the last one */
    int64_t k_last = (wo - 1) / (4 * FL_VW) * 4 * FL_VW, rest = wo - k_last;
    int64_t nv_last = (rest + FL_VW - 1) / FL_VW, last = rest - (nv_last - 1) * FL_VW;
    int in_first = conv_s2_inside(w, 0, 4, pl, kw);
    int in_last = conv_s2_inside(w, k_last, nv_last, pl, kw);
    conv_s2_masks mk_first, mk_last, mk_mid;
    conv_s2_edges ed_first = {{0}, {0}}, ed_last = {{0}, {0}}; /* read only where used */
    int use_first = 0, use_last = 0;
    if (!in_first) {
        conv_s2_masks_of(w, 0, 4, pl, kw, mk_first);
        use_first = conv_s2_edges_of(mk_first, 4, kw, &ed_first);
    }
    if (!in_last) {
        conv_s2_masks_of(w, k_last, nv_last, pl, kw, mk_last);
        use_last = conv_s2_edges_of(mk_last, nv_last, kw, &ed_last);
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t plane = u / p->blocks, oh0 = u % p->blocks * p->rb;
        int64_t oh1 = FL_MIN(oh0 + p->rb, p->ho);
        int64_t n = plane / cm, co = plane % cm;
        const float *xp = p->x + (n * p->c + co / p->m) * p->h * w, *wt = p->wk + co * nt;
        float bias = p->bias ? p->bias[co] : 0.0f;
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            float *out = p->y + (plane * p->ho + oh) * wo;
            int64_t ih0 = oh * p->sh - p->pt;
            for (int64_t k0 = 0; k0 < k_last; k0 += 4 * FL_VW) {
                int inside = k0 == 0 ? in_first : conv_s2_inside(w, k0, 4, pl, kw);
                const conv_s2_masks *mk = (const conv_s2_masks *)&mk_first;
                int use_ed = k0 == 0 && use_first;
                if (!inside && k0 > 0) { /* not met where 2 w >= wo + kw: the middle reads inside */
                    conv_s2_masks_of(w, k0, 4, pl, kw, mk_mid);
                    mk = (const conv_s2_masks *)&mk_mid;
                }
                conv_s2_group(p, xp, ih0, wt, k0, 4, inside, mk, ed_first, use_ed, bias, out, FL_VW);
            }
            conv_s2_group(p, xp, ih0, wt, k_last, nv_last, in_last, (const conv_s2_masks *)&mk_last,
                          ed_last, use_last, bias, out, last);
        }
    }
}

/* depthwise_conv2d_nchw at column stride 2 (conv_s2_task). */
static int conv_s2(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t m,
                   int64_t kh, int64_t kw, int64_t sh, int64_t dh, int64_t pt, int64_t pl,
                   int64_t ho, int64_t wo, const float *wk, const float *bias, int code,
                   float alpha, float *y) {
    int64_t planes = n * c * m, want = 4 * (int64_t)fl_pool_get_threads();
    /* whole planes, or row blocks where there are too few planes for every thread */
    int64_t rb = planes < want ? FL_MAX(1, ho * planes / want) : ho;
    rb = FL_MIN(rb, ho);
    int64_t blocks = (ho + rb - 1) / rb;
    conv_s2_ctx p = {x, wk, bias, y, c, h, w, m, kh, kw, sh, dh, pt, pl, ho, wo, rb, blocks,
                     code, alpha};
    int64_t per_unit = FL_MAX(1, rb * wo * kh * kw);
    fl_parallel(planes * blocks, FL_MAX(1, CONV_MIN_SHARE_TAPS / per_unit), conv_s2_task, &p);
    return 0;
}
#endif

/* y[n, c m + q] = f(b + sum_{i, j} x[n, c] window wk[c m + q, i, j]): x (N, C, H, W), wk
 * (C m, kh, kw), bias (C m,), y (N, C m, Ho, Wo). */
int FL_FN(depthwise_conv2d_nchw)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x,
                                 int64_t m, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                 int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                                 int64_t wo, const float *wk, const float *bias, int code,
                                 float alpha, float *y) {
    if (n <= 0 || c <= 0 || m <= 0 || ho <= 0 || wo <= 0) return 0;
    if (!conv_code_ok(code) || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 ||
        pt < 0 || pl < 0)
        return -2;
    if (conv_blocks_fit(0, c, h, w, kh, kw, sw, m))
        return FL_FN(depthwise_blocks)(0, n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code, alpha, y);
    if (pool_flat_fits(sh, sw, w, wo, ho) && kw <= CONV_FLAT_COLS && kh <= CONV_FLAT_KH)
        return conv_flat(n, c, h, w, x, m, kh, kw, dh, dw, pt, pl, ho, wk, bias, code, alpha, y);
#ifdef CONV_S2
    if (sw == 2 && dw == 1 && kw <= CONV_S2_COLS)
        return conv_s2(n, c, h, w, x, m, kh, kw, sh, dh, pt, pl, ho, wo, wk, bias, code, alpha, y);
#endif
    pool_plane_plan q = pool_plane_plan_of(n * c * m, kh, kw, sh, sw, dh, dw, ho, wo);
    int band = FL_VW >= 8 && sh == 1 && sw == 1 && dh == 1 && dw == 1 && kh == kw && (kh == 3 || kh == 5)
                   ? (int)kh
                   : 0;
    if (band && CONV_BAND_SHIFTS) {
        /* buffer rows on vectors' boundaries (the buffer is 64-byte aligned): at least
         * wo + kw - 1 + FL_VW columns, so the vector past a row's last group lies in the row */
        q.len = (q.len + FL_VW - 1) / FL_VW * FL_VW;
        q.floats = (q.rb + kh - 1) * q.len;
    }
    int64_t *off = (int64_t *)malloc((size_t)(kh * kw) * sizeof(int64_t));
    if (!off) return -1;
    pool_plane_offsets(kh, kw, dh, dw, sw, q.len, off);
    conv_plane_ctx p = {x, wk, bias, y, off, q, c, h, w, m, kh, kw, sh, sw, dh, pt, pl, ho, wo,
                        code, 0, alpha, band};
    int64_t per_unit = FL_MAX(1, q.rb * wo * kh * kw);
    fl_parallel(n * c * m * q.blocks, FL_MAX(1, CONV_MIN_SHARE_TAPS / per_unit), conv_plane_task,
                &p);
    free(off);
    return p.status;
}
