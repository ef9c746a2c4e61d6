/* Pooling, resizing, local response normalization and the NHWC zero pad (pool.h). Compiled once
 * per ISA (kernels.inc).
 *
 * Every kernel works on NHWC rows and runs FL_VW channels at a time (the last, partial vector
 * through a zero-padded copy), each output pixel's window taps in a loop whose bounds are
 * clipped to the input once per row and column, never tested per channel. The 3x3 windows of
 * the common layers take the same code with constant bounds, so it is unrolled. Work is shared
 * by output rows (n, oh) on the pool's threads. */

#include "layout_internal.h" /* the channel blocks' buffer */
#include "pool_internal.h"

/* Fewest tap-values (output values x window taps) in a thread's share: a hand-off costs a few
 * microseconds. */
#define POOL_MIN_SHARE (INT64_C(1) << 17)

/* pool_zeros' buffer (pool_internal.h): zeros, grown on demand. */
static __thread fl_buf pool_zero_buf;

const float *FL_FN(pool_zeros)(size_t floats) {
    size_t had = pool_zero_buf.bytes;
    float *z = fl_buf_floats(&pool_zero_buf, floats);
    if (z && pool_zero_buf.bytes != had) memset(z, 0, pool_zero_buf.bytes);
    return z;
}

/* Taps a window sum adds in float32 lanes before it adds them into float64: the rounding error
 * of a mean stays near float32's own whatever the window's size (a global or 1x1 adaptive bin
 * over a whole image added 3e-6 relative over 9,600 taps in float32 alone). */
#define POOL_RUN 64

/* sum of p[i rs + j cs + 0:nc] over i < ni, j < nj: runs of POOL_RUN taps in float32, the runs
 * in float64. */
static fl_vf pool_wide_sum(const float *p, int64_t rs, int64_t cs, int64_t ni, int64_t nj,
                           int64_t nc) {
    double total[FL_VW] = {0};
    fl_vf run = fl_set1(0.0f);
    int taps = 0;
    for (int64_t i = 0; i < ni; ++i)
        for (int64_t j = 0; j < nj; ++j) {
            run += pool_ld(p + i * rs + j * cs, nc);
            if (++taps == POOL_RUN) {
                for (int l = 0; l < FL_VW; ++l) total[l] += (double)run[l];
                run = fl_set1(0.0f);
                taps = 0;
            }
        }
    fl_vf sum;
    for (int l = 0; l < FL_VW; ++l) sum[l] = (float)(total[l] + (double)run[l]);
    return sum;
}

/* max (NaN wins; -inf when empty) or sum of p[i rs + j cs + 0:nc] over i < ni, j < nj. */
FL_INLINE fl_vf pool_window(const float *p, int64_t rs, int64_t cs, int64_t ni, int64_t nj,
                            int is_max, int64_t nc) {
    if (!is_max && ni * nj > POOL_RUN) return pool_wide_sum(p, rs, cs, ni, nj, nc);
    fl_vf acc = fl_set1(is_max ? -__builtin_inff() : 0.0f);
    fl_nan nan = fl_nan_none();
    for (int64_t i = 0; i < ni; ++i)
        for (int64_t j = 0; j < nj; ++j) {
            fl_vf v = pool_ld(p + i * rs + j * cs, nc);
            if (is_max) {
                acc = fl_vmax(acc, v);
                nan = fl_nan_add(nan, v);
            } else {
                acc += v;
            }
        }
    return is_max ? fl_nan_apply(nan, acc) : acc;
}

/* out[0:c] = the window of p (ni x nj taps, rows rs and columns cs floats apart): its max, or
 * its sum / count. */
FL_INLINE void pool_pixel(const float *p, int64_t rs, int64_t cs, int64_t ni, int64_t nj,
                          int is_max, float count, int64_t c, float *out) {
    int64_t c0 = 0;
    for (; c0 + FL_VW <= c; c0 += FL_VW) {
        fl_vf v = pool_window(p + c0, rs, cs, ni, nj, is_max, FL_VW);
        fl_store(out + c0, is_max ? v : v / count);
    }
    if (c0 < c) {
        fl_vf v = pool_window(p + c0, rs, cs, ni, nj, is_max, c - c0);
        pool_st(out + c0, is_max ? v : v / count, c - c0);
    }
}

typedef struct {
    const float *x;
    float *y;
    int64_t h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, ho, wo;
    int is_max, cip;
} pool_ctx;

/* Output pixel ow of a row: its window's columns clipped to x once, or (interior) the whole
 * window. ni 2 and 3 with nj of the same are unrolled. */
FL_INLINE void pool_one(const pool_ctx *p, const float *src, int64_t rs, int64_t cs, int64_t ni,
                        int64_t nj, float count, float *out) {
    int64_t c = p->c;
    if (ni == 3 && nj == 3) {
        if (p->is_max) pool_pixel(src, rs, cs, 3, 3, 1, count, c, out);
        else pool_pixel(src, rs, cs, 3, 3, 0, count, c, out);
    } else if (ni == 2 && nj == 2) {
        if (p->is_max) pool_pixel(src, rs, cs, 2, 2, 1, count, c, out);
        else pool_pixel(src, rs, cs, 2, 2, 0, count, c, out);
    } else if (p->is_max) {
        pool_pixel(src, rs, cs, ni, nj, 1, count, c, out);
    } else {
        pool_pixel(src, rs, cs, ni, nj, 0, count, c, out);
    }
}

/* Output rows t = n Ho + oh in [t0, t1) of pool2d. The columns whose windows lie inside x
 * ([in0, in1)) take no clipping (per pixel of a 16-channel row it cost more than the taps). */
static void pool_task(void *arg, int64_t t0, int64_t t1) {
    const pool_ctx *p = (const pool_ctx *)arg;
    int64_t c = p->c, rs = p->dh * p->w * c, cs = p->dw * c, span = (p->kw - 1) * p->dw;
    /* iw0 = ow sw - pl >= 0 and iw0 + span < w */
    int64_t in0 = FL_MIN((p->pl + p->sw - 1) / p->sw, p->wo);
    int64_t in1 = p->w - span + p->pl <= 0 ? 0 : FL_MIN((p->w - span + p->pl - 1) / p->sw + 1, p->wo);
    in1 = FL_MAX(in1, in0);
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, oh = t % p->ho, ih0 = oh * p->sh - p->pt;
        int64_t i0, i1, ci0 = 0, ci1 = 0;
        pool_taps(ih0, p->dh, p->kh, 0, p->h, &i0, &i1);
        if (p->cip) pool_taps(ih0, p->dh, p->kh, -p->pt, p->h_end, &ci0, &ci1);
        int64_t ni = i1 - i0;
        const float *xn = p->x + n * p->h * p->w * c;
        const float *row = xn + (ih0 + i0 * p->dh) * p->w * c;
        float *y = p->y + t * p->wo * c;
        for (int64_t ow = 0; ow < p->wo; ++ow) {
            if (ow == in0 && ni > 0) {  /* the interior run */
                float count = (float)(p->cip ? (ci1 - ci0) * p->kw : ni * p->kw);
                for (; ow < in1; ++ow)
                    pool_one(p, row + (ow * p->sw - p->pl) * c, rs, cs, ni, p->kw, count, y + ow * c);
                if (ow == p->wo) break;
            }
            int64_t iw0 = ow * p->sw - p->pl, j0, j1, cj0 = 0, cj1 = 0;
            pool_taps(iw0, p->dw, p->kw, 0, p->w, &j0, &j1);
            if (p->cip) pool_taps(iw0, p->dw, p->kw, -p->pl, p->w_end, &cj0, &cj1);
            int64_t nj = j1 - j0;
            float count = (float)(p->cip ? (ci1 - ci0) * (cj1 - cj0) : ni * nj);
            const float *src = ni > 0 && nj > 0 ? row + (iw0 + j0 * p->dw) * c : xn;
            pool_one(p, src, rs, cs, ni, nj, count, y + ow * c);
        }
    }
}

/* Global pooling (one window over a whole image): y[n, c] = max or mean over s < steps of
 * x[n, s, c], read image row after image row, vectors of channels summing side by side (one
 * window per vector of channels walked the image once per vector, each a chain of dependent
 * adds: 0.54 ms on a 160x160 image of 96 channels). Threads take blocks of POOL_GLOBAL_VECS
 * vectors of an image's channels. */
#define POOL_GLOBAL_VECS 4

typedef struct {
    const float *x;
    float *y;
    int64_t steps, c, blocks;
    int is_max;
} pool_global_ctx;

/* y[0:nv FL_VW] (the last vector `last` lanes) of the block of channels at x, rows c apart. */
FL_INLINE void pool_global_vecs(const float *x, int64_t steps, int64_t c, int nv, int64_t last,
                                int is_max, float *y) {
    fl_vf acc[POOL_GLOBAL_VECS];
    fl_nan nan[POOL_GLOBAL_VECS];
    double total[POOL_GLOBAL_VECS][FL_VW];
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        acc[u] = fl_set1(is_max ? -__builtin_inff() : 0.0f);
        nan[u] = fl_nan_none();
        for (int l = 0; l < FL_VW; ++l) total[u][l] = 0.0;
    }
    for (int64_t s0 = 0; s0 < steps; s0 += POOL_RUN) {  /* runs of POOL_RUN rows in float32 */
        int64_t s1 = FL_MIN(s0 + POOL_RUN, steps);
        for (int64_t s = s0; s < s1; ++s) {
            _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
                fl_vf v = pool_ld(x + s * c + u * FL_VW, u == nv - 1 ? last : FL_VW);
                if (is_max) {
                    acc[u] = fl_vmax(acc[u], v);
                    nan[u] = fl_nan_add(nan[u], v);
                } else {
                    acc[u] += v;
                }
            }
        }
        if (!is_max) {
            _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
                for (int l = 0; l < FL_VW; ++l) total[u][l] += (double)acc[u][l];
                acc[u] = fl_set1(0.0f);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        fl_vf r;
        if (is_max) {
            r = fl_nan_apply(nan[u], acc[u]);
        } else {
            for (int l = 0; l < FL_VW; ++l) r[l] = (float)(total[u][l] / (double)steps);
        }
        pool_st(y + u * FL_VW, r, u == nv - 1 ? last : FL_VW);
    }
}

static void pool_global_task(void *arg, int64_t u0, int64_t u1) {
    const pool_global_ctx *p = (const pool_global_ctx *)arg;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t n = u / p->blocks, c0 = u % p->blocks * POOL_GLOBAL_VECS * FL_VW;
        int64_t nc = FL_MIN(POOL_GLOBAL_VECS * FL_VW, p->c - c0);
        int nv = (int)((nc + FL_VW - 1) / FL_VW);
        int64_t last = nc - (nv - 1) * FL_VW;
        const float *x = p->x + n * p->steps * p->c + c0;
        float *y = p->y + n * p->c + c0;
        if (p->is_max) {
            if (nv == 4) pool_global_vecs(x, p->steps, p->c, 4, last, 1, y);
            else if (nv == 3) pool_global_vecs(x, p->steps, p->c, 3, last, 1, y);
            else if (nv == 2) pool_global_vecs(x, p->steps, p->c, 2, last, 1, y);
            else pool_global_vecs(x, p->steps, p->c, 1, last, 1, y);
        } else {
            if (nv == 4) pool_global_vecs(x, p->steps, p->c, 4, last, 0, y);
            else if (nv == 3) pool_global_vecs(x, p->steps, p->c, 3, last, 0, y);
            else if (nv == 2) pool_global_vecs(x, p->steps, p->c, 2, last, 0, y);
            else pool_global_vecs(x, p->steps, p->c, 1, last, 0, y);
        }
    }
}

/* y[n, oh, ow, c] = max or mean over the window of x: x (N, H, W, C), y (N, Ho, Wo, C). */
int FL_FN(pool2d)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int is_max,
                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                  int64_t pt, int64_t pl, int64_t h_end, int64_t w_end, int count_include_pad,
                  int64_t ho, int64_t wo, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || c <= 0) return 0;
    if (ho == 1 && wo == 1 && kh == h && kw == w && dh == 1 && dw == 1 && pt == 0 && pl == 0 &&
        h_end == h && w_end == w) {  /* one window over each whole image */
        int64_t blocks = (c + POOL_GLOBAL_VECS * FL_VW - 1) / (POOL_GLOBAL_VECS * FL_VW);
        pool_global_ctx g = {x, y, h * w, c, blocks, is_max};
        int64_t per_unit = FL_MAX(1, h * w * FL_MIN(c, POOL_GLOBAL_VECS * FL_VW));
        fl_parallel(n * blocks, FL_MAX(1, POOL_MIN_SHARE / per_unit), pool_global_task, &g);
        return 0;
    }
    pool_ctx p = {x, y, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, ho, wo, is_max,
                  count_include_pad};
    fl_parallel(n * ho, FL_MAX(1, POOL_MIN_SHARE / (wo * c * kh * kw)), pool_task, &p);
    return 0;
}

typedef struct {
    const float *x;
    const int64_t *batch, *h0, *h1, *w0, *w1;
    float *y;
    int64_t ph, pw, h, w, c;
    int shared, is_max;
} pool_bin_ctx;

/* Rows t = k P + p in [t0, t1) of bin_pool. */
static void pool_bin_task(void *arg, int64_t t0, int64_t t1) {
    const pool_bin_ctx *p = (const pool_bin_ctx *)arg;
    int64_t c = p->c;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t k = t / p->ph, hb_at = p->shared ? t % p->ph : t;
        int64_t ha = p->h0[hb_at], hb = p->h1[hb_at];
        const float *xn = p->x + (p->batch ? p->batch[k] : k) * p->h * p->w * c;
        const int64_t *w0 = p->w0 + (p->shared ? 0 : k * p->pw);
        const int64_t *w1 = p->w1 + (p->shared ? 0 : k * p->pw);
        for (int64_t q = 0; q < p->pw; ++q) {
            int64_t wa = w0[q], wb = w1[q];
            float *out = p->y + (t * p->pw + q) * c;
            if (hb <= ha || wb <= wa) {
                memset(out, 0, (size_t)c * sizeof(float));
                continue;
            }
            const float *src = xn + (ha * p->w + wa) * c;
            float count = (float)((hb - ha) * (wb - wa));
            if (p->is_max) pool_pixel(src, p->w * c, c, hb - ha, wb - wa, 1, count, c, out);
            else pool_pixel(src, p->w * c, c, hb - ha, wb - wa, 0, count, c, out);
        }
    }
}

/* y[k, p, q, c] = max or mean of x over bin (p, q) of region k: x (N, H, W, C), y (K, P, Q, C). */
int FL_FN(bin_pool)(int64_t k, int64_t ph, int64_t pw, int64_t h, int64_t w, int64_t c,
                    const float *x, const int64_t *batch, const int64_t *h0, const int64_t *h1,
                    const int64_t *w0, const int64_t *w1, int shared, int is_max, float *y) {
    if (k <= 0 || ph <= 0 || pw <= 0 || c <= 0) return 0;
    pool_bin_ctx p = {x, batch, h0, h1, w0, w1, y, ph, pw, h, w, c, shared, is_max};
    /* bins hold about h w / (ph pw) cells each */
    int64_t taps = FL_MAX(1, (h / ph + 1) * (w / pw + 1));
    fl_parallel(k * ph, FL_MAX(1, POOL_MIN_SHARE / (pw * c * taps)), pool_bin_task, &p);
    return 0;
}

typedef struct {
    const float *x, *fy, *fx;
    const int64_t *y0, *y1, *x0, *x1;
    float *y;
    int64_t h, w, c, ho, wo;
    int bilinear;
} pool_resize_ctx;

/* o = (1 - wy) ((1 - wx) a + wx b) + wy ((1 - wx) d + wx e) for channels c0 + [0, nc). */
FL_INLINE void pool_lerp(const float *a, const float *b, const float *d, const float *e,
                         float wx, float wy, int64_t c0, int64_t nc, float *o) {
    fl_vf up = pool_ld(a + c0, nc) * (1.0f - wx) + pool_ld(b + c0, nc) * wx;
    fl_vf down = pool_ld(d + c0, nc) * (1.0f - wx) + pool_ld(e + c0, nc) * wx;
    pool_st(o + c0, up * (1.0f - wy) + down * wy, nc);
}

/* Output rows t = n Ho + i in [t0, t1) of resize. */
static void pool_resize_task(void *arg, int64_t t0, int64_t t1) {
    const pool_resize_ctx *p = (const pool_resize_ctx *)arg;
    int64_t c = p->c;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, i = t % p->ho;
        const float *top = p->x + (n * p->h + p->y0[i]) * p->w * c;
        float *out = p->y + t * p->wo * c;
        if (!p->bilinear) {
            for (int64_t j = 0; j < p->wo; ++j)
                memcpy(out + j * c, top + p->x0[j] * c, (size_t)c * sizeof(float));
            continue;
        }
        const float *bottom = p->x + (n * p->h + p->y1[i]) * p->w * c;
        float wy = p->fy[i];
        for (int64_t j = 0; j < p->wo; ++j) {
            const float *a = top + p->x0[j] * c, *b = top + p->x1[j] * c;
            const float *d = bottom + p->x0[j] * c, *e = bottom + p->x1[j] * c;
            float *o = out + j * c, wx = p->fx[j];
            int64_t c0 = 0;
            for (; c0 + FL_VW <= c; c0 += FL_VW) pool_lerp(a, b, d, e, wx, wy, c0, FL_VW, o);
            if (c0 < c) pool_lerp(a, b, d, e, wx, wy, c0, c - c0, o);
        }
    }
}

/* y[n, i, j] = x[n, y0[i], x0[j]] or its bilinear blend: x (N, H, W, C), y (N, Ho, Wo, C). */
int FL_FN(resize)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t ho,
                  int64_t wo, const int64_t *y0, const int64_t *y1, const float *fy,
                  const int64_t *x0, const int64_t *x1, const float *fx, int bilinear,
                  float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || c <= 0) return 0;
    pool_resize_ctx p = {x, fy, fx, y0, y1, x0, x1, y, h, w, c, ho, wo, bilinear};
    fl_parallel(n * ho, FL_MAX(1, POOL_MIN_SHARE / (wo * c * (bilinear ? 4 : 1))),
                pool_resize_task, &p);
    return 0;
}

typedef struct {
    const float *x;
    float *y;
    int64_t c, size;
    float alpha, beta, k;
    int status;
} pool_lrn_ctx;

static __thread fl_buf pool_lrn_buf;

/* Rows [r0, r1) of lrn. */
static void pool_lrn_task(void *arg, int64_t r0, int64_t r1) {
    pool_lrn_ctx *p = (pool_lrn_ctx *)arg;
    int64_t c = p->c, size = p->size, lo = size / 2;
    float *sq = fl_buf_floats(&pool_lrn_buf, (size_t)(c + size));
    if (!sq) {
        p->status = -1;
        return;
    }
    float scale = p->alpha / (float)size, k = p->k, beta = p->beta;
    memset(sq, 0, (size_t)(c + size) * sizeof(float));
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = p->x + r * c;
        float *o = p->y + r * c;
        for (int64_t j = 0; j < c; ++j) sq[lo + j] = xr[j] * xr[j];
        /* o = k + scale * (sum of the window's squares): sq[j:j + size] */
        for (int64_t c0 = 0; c0 < c; c0 += FL_VW) {
            int64_t nc = FL_MIN(FL_VW, c - c0);
            fl_vf s = fl_set1(0.0f);
            for (int64_t t = 0; t < size; ++t) s += pool_ld(sq + c0 + t, nc);
            pool_st(o + c0, k + scale * s, nc);
        }
        if (beta == 0.75f) {
            for (int64_t j = 0; j < c; ++j) o[j] = xr[j] / (sqrtf(o[j]) * sqrtf(sqrtf(o[j])));
        } else if (beta == 0.5f) {
            for (int64_t j = 0; j < c; ++j) o[j] = xr[j] / sqrtf(o[j]);
        } else if (beta == 1.0f) {
            for (int64_t j = 0; j < c; ++j) o[j] = xr[j] / o[j];
        } else {
            for (int64_t j = 0; j < c; ++j) o[j] = xr[j] / powf(o[j], beta);
        }
    }
}

/* y = x / (k + alpha / size sum of the window's x^2)^beta over channels: x, y (M, C). */
int FL_FN(lrn)(int64_t m, int64_t c, const float *x, int64_t size, float alpha, float beta,
               float k, float *y) {
    if (m <= 0 || c <= 0) return 0;
    pool_lrn_ctx p = {x, y, c, FL_MAX(size, 1), alpha, beta, k, 0};
    fl_parallel(m, FL_MAX(1, POOL_MIN_SHARE / (c * (p.size + 8))), pool_lrn_task, &p);
    return p.status;
}

typedef struct {
    const float *x;
    float *y;
    int64_t h, w, c, pt, pl, hp, wp;
} pool_pad_ctx;

/* Rows r = n Hp + i in [r0, r1) of the padded y. */
static void pool_pad_task(void *arg, int64_t r0, int64_t r1) {
    const pool_pad_ctx *p = (const pool_pad_ctx *)arg;
    int64_t c = p->c, row = p->wp * c;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t n = r / p->hp, ih = r % p->hp - p->pt;
        float *dst = p->y + r * row;
        if (ih < 0 || ih >= p->h) {
            memset(dst, 0, (size_t)row * sizeof(float));
            continue;
        }
        int64_t body = FL_MIN(p->w, p->wp - p->pl) * c;
        memset(dst, 0, (size_t)(p->pl * c) * sizeof(float));
        memcpy(dst + p->pl * c, p->x + (n * p->h + ih) * p->w * c, (size_t)body * sizeof(float));
        memset(dst + p->pl * c + body, 0, (size_t)(row - p->pl * c - body) * sizeof(float));
    }
}

/* y[n, pt + i, pl + j] = x[n, i, j], zeros elsewhere: x (N, H, W, C), y (N, Hp, Wp, C). */
int FL_FN(pad_nhwc)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t pt,
                    int64_t pl, int64_t hp, int64_t wp, float *y) {
    if (n <= 0 || hp <= 0 || wp <= 0 || c <= 0) return 0;
    pool_pad_ctx p = {x, y, h, w, c, pt, pl, hp, wp};
    fl_parallel(n * hp, FL_MAX(1, POOL_MIN_SHARE / (wp * c)), pool_pad_task, &p);
    return 0;
}

/* ------------------------------------------------------------------------ NCHW planes */
/* The NCHW kernels (pool2d_nchw here, depthwise_conv2d_nchw in conv_depthwise.c) run on
 * planes (H, W): a unit of work is a block of output rows of one plane. Its input rows are
 * first copied into a per-thread buffer, padded with the window's fill (-inf for max, 0 for
 * sums) and split into sw column phases, so that each tap of FL_VW consecutive output columns
 * is one contiguous vector load at any stride: padded column ow sw + j dw is phase (j dw) %
 * sw, index ow + (j dw) / sw. Outputs run FL_VW columns at a time, four vectors per pass
 * (four independent chains of max or add). */

/* Their per-thread buffer (pool_internal.h). */
__thread fl_buf FL_FN(pool_plane_buf);

/* Lane indices as floats (lane < n: the lanes of a vector's first n values). */
static const float pool_lanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Stride 2: d0[k] = s[2 k - pl], d1[k] = s[2 k + 1 - pl] for k < len (fill outside [0, w)),
 * both phases from the same loads. */
static void pool_plane_split2(const float *s, int64_t w, int64_t pl, int64_t len, float fill,
                              float *d0, float *d1) {
    int64_t k = 0;
    for (; k < len && 2 * k - pl < 0; ++k) {            /* the left padding */
        d0[k] = fill;
        d1[k] = 2 * k + 1 - pl == 0 && w > 0 ? s[0] : fill;
    }
    for (; k + FL_VW <= len && 2 * k - pl + 2 * FL_VW <= w; k += FL_VW) {
        fl_vf a = fl_load(s + 2 * k - pl), b = fl_load(s + 2 * k - pl + FL_VW);
        fl_store(d0 + k, FL_SHUF(a, b, POOL_EVENS));
        fl_store(d1 + k, FL_SHUF(a, b, POOL_ODDS));
    }
    fl_vf f = fl_set1(fill), lane = fl_load(pool_lanes);
    for (; k < len && 2 * k - pl < w; k += FL_VW) {     /* the row's last columns: masked loads */
        int64_t rest = w - (2 * k - pl);
        fl_vf a = fl_select(lane < (float)rest, pool_ld(s + 2 * k - pl, rest), f);
        fl_vf b = rest > FL_VW ? fl_select(lane < (float)(rest - FL_VW),
                                           pool_ld(s + 2 * k - pl + FL_VW, rest - FL_VW), f)
                               : f;
        pool_st(d0 + k, FL_SHUF(a, b, POOL_EVENS), len - k);
        pool_st(d1 + k, FL_SHUF(a, b, POOL_ODDS), len - k);
    }
    for (; k + FL_VW <= len; k += FL_VW) {              /* the right padding and slack */
        fl_store(d0 + k, f);
        fl_store(d1 + k, f);
    }
    for (; k < len; ++k) d0[k] = d1[k] = fill;
}

/* d[0:n] = fill */
static void pool_plane_fill(float *d, int64_t n, float fill) {
    int64_t k = 0;
    for (; k + FL_VW <= n; k += FL_VW) fl_store(d + k, fl_set1(fill));
    for (; k < n; ++k) d[k] = fill;
}

/* d[0:n] = s[0:n], a row of the buffer: on AVX-512 in vectors, the last one masked (the
 * inlined copy took 0.9x the time of a memcpy call per row in a 3x3 depthwise band on 56
 * columns); elsewhere by memcpy (AVX2's masked stores are slow on AMD cores: pools on this
 * buffer lost 10-16 % with them, docs/design.md). */
FL_INLINE void pool_plane_copy(float *d, const float *s, int64_t n) {
#if FL_VW == 16 && defined(__AVX512F__)
    int64_t k = 0;
    for (; k + FL_VW <= n; k += FL_VW) fl_store(d + k, fl_load(s + k));
    if (k < n) fl_store_n(d + k, fl_load_n(s + k, n - k), n - k);
#else
    memcpy(d, s, (size_t)n * sizeof(float));
#endif
}

/* A unit's input rows into its buffer, split in sw column phases (pool_internal.h). */
void FL_FN(pool_plane_gather)(const float *x, int64_t h, int64_t w, int64_t r0, int64_t nr,
                              int64_t pl, int64_t sw, int64_t len, float fill, float *buf) {
    if (sw == 2) {
        for (int64_t r = 0; r < nr; ++r) {
            int64_t ih = r0 + r;
            float *d = buf + 2 * r * len;
            if (ih >= 0 && ih < h) {
                pool_plane_split2(x + ih * w, w, pl, len, fill, d, d + len);
                continue;
            }
            pool_plane_fill(d, 2 * len, fill);
        }
        return;
    }
    for (int64_t q = 0; q < sw; ++q) {
        /* k sw + q - pl in [0, w): k in [lo, hi) (divisions once per phase, not per row) */
        int64_t lo = pl - q <= 0 ? 0 : (pl - q + sw - 1) / sw;
        int64_t hi = w + pl - q <= 0 ? 0 : (w + pl - q + sw - 1) / sw;
        lo = FL_MIN(lo, len);
        hi = FL_MAX(FL_MIN(hi, len), lo);
        for (int64_t r = 0; r < nr; ++r) {
            int64_t ih = r0 + r;
            float *d = buf + (r * sw + q) * len;
            if (ih < 0 || ih >= h) {
                pool_plane_fill(d, len, fill);
                continue;
            }
            const float *s = x + ih * w;
            pool_plane_fill(d, lo, fill);
            if (sw == 1) pool_plane_copy(d + lo, s + lo - pl, hi - lo);
            else
                for (int64_t k = lo; k < hi; ++k) d[k] = s[k * sw + q - pl];
            pool_plane_fill(d + hi, len - hi, fill);
        }
    }
}

/* How a horizontal pass reduces its taps (its is_max argument): their sum, their max with NaN
 * winning, or their max where the vertical pass met no NaN, so that none can reach the taps
 * (no NaN bookkeeping per tap: a compare and a mask or per tap were a fifth of a 3x3/1 max
 * pool's horizontal pass). */
enum { POOL_SUM, POOL_MAX, POOL_MAX_NO_NAN };

/* out[0:nv FL_VW] (the last vector cut to `last` lanes) = max over taps t < nt of b[off[t] +
 * 0:nv FL_VW] (NaN wins; is_max a POOL_ value), or their sum divided by div[0:nv FL_VW]. */
FL_INLINE void pool_plane_vecs(const float *b, const int64_t *off, int64_t nt, int is_max,
                               int nv, const float *div, float *out, int64_t last) {
    fl_vf acc[4];
    fl_nan nan[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        acc[u] = fl_set1(is_max ? -__builtin_inff() : 0.0f);
        nan[u] = fl_nan_none();
    }
    for (int64_t t = 0; t < nt; ++t) {
        const float *p = b + off[t];
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
            fl_vf v = fl_load(p + u * FL_VW);
            if (is_max) {
                acc[u] = fl_vmax(acc[u], v);
                if (is_max == POOL_MAX) nan[u] = fl_nan_add(nan[u], v);
            } else {
                acc[u] += v;
            }
        }
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        fl_vf r = is_max ? fl_nan_apply(nan[u], acc[u])
                         : acc[u] / fl_load(div + u * FL_VW);
        pool_st(out + u * FL_VW, r, u == nv - 1 ? last : FL_VW);
    }
}

/* The same sum in runs of POOL_RUN taps in float32 added in float64 (windows over POOL_RUN
 * taps), one vector. */
static void pool_plane_wide(const float *b, const int64_t *off, int64_t nt, const float *div,
                            float *out, int64_t last) {
    double total[FL_VW] = {0};
    fl_vf run = fl_set1(0.0f);
    for (int64_t t = 0; t < nt; ++t) {
        run += fl_load(b + off[t]);
        if ((t + 1) % POOL_RUN == 0 || t + 1 == nt) {
            for (int l = 0; l < FL_VW; ++l) total[l] += (double)run[l];
            run = fl_set1(0.0f);
        }
    }
    fl_vf sum;
    for (int l = 0; l < FL_VW; ++l) sum[l] = (float)total[l];
    pool_st(out, sum / fl_load(div), last);
}

/* One output row out[0:wo] whose windows start at b (buffer row of window row 0). */
FL_INLINE void pool_plane_row(const float *b, const int64_t *off, int64_t nt, int is_max,
                              int64_t wo, const float *div, float *out) {
    int64_t ow = 0;
    if (!is_max && nt > POOL_RUN) {
        for (; ow < wo; ow += FL_VW)
            pool_plane_wide(b + ow, off, nt, div + ow, out + ow, FL_MIN(FL_VW, wo - ow));
        return;
    }
    for (; ow + 4 * FL_VW <= wo; ow += 4 * FL_VW)
        pool_plane_vecs(b + ow, off, nt, is_max, 4, div ? div + ow : 0, out + ow, FL_VW);
    for (; ow < wo; ow += FL_VW)
        pool_plane_vecs(b + ow, off, nt, is_max, 1, div ? div + ow : 0, out + ow,
                        FL_MIN(FL_VW, wo - ow));
}

typedef struct {
    const float *x;
    float *y;
    const int64_t *off;
    const float *cols;   /* mean: cells counted per output column (wo + FL_VW floats) */
    pool_plane_plan q;
    int64_t h, w, kh, kw, sh, sw, dh, pt, pl, h_end, ho, wo;
    int is_max, cip, sep, status;
} pool_plane_ctx;

/* row[k] = max (NaN wins) or sum over i < n (n >= 1) of s[i step + k], for k < count; returns
 * whether a max met a NaN. */
FL_INLINE int pool_rows_reduce(const float *s, int64_t n, int64_t step, int64_t count,
                               int is_max, float *row) {
    fl_nan met = fl_nan_none();
    for (int64_t k = 0; k < count; k += 4 * FL_VW) { /* four independent chains; the last cut */
        int nv = (int)FL_MIN(4, (count - k + FL_VW - 1) / FL_VW);
        int64_t last = count - k - (nv - 1) * FL_VW;
        fl_vf acc[4];
        fl_nan nan[4];
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; ++u) {
            if (u >= nv) break;
            int64_t nc = u == nv - 1 ? last : FL_VW;
            acc[u] = pool_ld(s + k + u * FL_VW, nc);
            nan[u] = fl_nan_add(fl_nan_none(), acc[u]);
        }
        for (int64_t i = 1; i < n; ++i) {
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; ++u) {
                if (u >= nv) break;
                fl_vf v = pool_ld(s + i * step + k + u * FL_VW, u == nv - 1 ? last : FL_VW);
                if (is_max) {
                    acc[u] = fl_vmax(acc[u], v);
                    nan[u] = fl_nan_add(nan[u], v);
                } else {
                    acc[u] += v;
                }
            }
        }
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; ++u) {
            if (u >= nv) break;
            fl_vf r = acc[u];
            if (is_max) {
                r = fl_nan_apply(nan[u], r);
                met = met | nan[u];
            }
            pool_st(row + k + u * FL_VW, r, u == nv - 1 ? last : FL_VW);
        }
    }
    return is_max && fl_nan_any(met);
}

/* row[0:w] = max (NaN wins; -inf where no window row lies in the plane x (H, W)) or sum (0
 * where none) over the window rows i < kh, r0 + i dh in [0, h), of x[r0 + i dh, 0:w]; returns
 * whether a max met a NaN. */
FL_INLINE int pool_plane_vreduce(const float *x, int64_t h, int64_t w, int64_t r0, int64_t kh,
                                 int64_t dh, int is_max, float *row) {
    int64_t i0, i1;
    pool_taps(r0, dh, kh, 0, h, &i0, &i1);
    if (i0 == i1) {
        pool_plane_fill(row, w, is_max ? -__builtin_inff() : 0.0f);
        return 0;
    }
    return pool_rows_reduce(x + (r0 + i0 * dh) * w, i1 - i0, dh * w, w, is_max, row);
}

/* Max pooling, and means over at most POOL_RUN taps at column step 1, are separable: per output
 * row, the max or sum over its window rows of every input column (pool_plane_vreduce, straight
 * from the plane), then over the kw taps of that one row: kh + kw taps per output instead of
 * kh kw. A unit reduces all its rows before it reads any back at the horizontal taps' shifted
 * offsets: a load straddling a store still in flight waits for it (on Zen 5 that doubled the
 * time of a 3x3 max pool on 28x28 planes). At column step 1 a row is reduced into its padded
 * place in the buffer; at other steps it is split in column phases (pool_plane_gather). p->off
 * holds the kw horizontal offsets. */
static void pool_plane_sep_task(pool_plane_ctx *p, int64_t u0, int64_t u1) {
    int64_t w = p->w, len = p->q.len, sw = p->sw, kw = p->kw, pl = p->pl, wo = p->wo;
    int64_t rb = p->q.rb, stride = sw * len, rows_at = rb * stride, rw = w + FL_VW;
    int is_max = p->is_max;
    float fill = is_max ? -__builtin_inff() : 0.0f;
    size_t floats = (size_t)(rows_at + FL_VW + (sw == 1 ? 0 : rb * rw) + wo + FL_VW);
    float *buf = fl_buf_floats(&FL_FN(pool_plane_buf), floats);
    if (!buf) {
        p->status = -1;
        return;
    }
    float *rows = buf + rows_at + FL_VW, *div = rows + (sw == 1 ? 0 : rb * rw);
    for (int64_t u = u0; u < u1; ++u) {
        int64_t plane = u / p->q.blocks, oh0 = u % p->q.blocks * p->q.rb;
        int64_t oh1 = FL_MIN(oh0 + p->q.rb, p->ho);
        const float *x = p->x + plane * p->h * w;
        int met_nan = 0;
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            float *b = buf + (oh - oh0) * stride;
            float *dst = sw == 1 ? b + pl : rows + (oh - oh0) * rw;
            if (is_max) met_nan |= pool_plane_vreduce(x, p->h, w, oh * p->sh - p->pt, p->kh, p->dh, 1, dst);
            else pool_plane_vreduce(x, p->h, w, oh * p->sh - p->pt, p->kh, p->dh, 0, dst);
            if (sw == 1) {
                pool_plane_fill(b, pl, fill);
                if (pl + w < len) pool_plane_fill(b + pl + w, len - pl - w, fill);
            }
        }
        if (sw != 1)
            for (int64_t oh = oh0; oh < oh1; ++oh)
                FL_FN(pool_plane_gather)(rows + (oh - oh0) * rw, 1, w, 0, 1, pl, sw, len, fill,
                                         buf + (oh - oh0) * stride);
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            const float *b = buf + (oh - oh0) * stride;
            float *out = p->y + (plane * p->ho + oh) * wo;
            if (is_max) {
                if (met_nan) pool_plane_row(b, p->off, kw, POOL_MAX, wo, 0, out);
                else if (kw == 3) pool_plane_row(b, p->off, 3, POOL_MAX_NO_NAN, wo, 0, out);
                else pool_plane_row(b, p->off, kw, POOL_MAX_NO_NAN, wo, 0, out);
                continue;
            }
            int64_t ih0 = oh * p->sh - p->pt, i0, i1;
            if (p->cip) pool_taps(ih0, p->dh, p->kh, -p->pt, p->h_end, &i0, &i1);
            else pool_taps(ih0, p->dh, p->kh, 0, p->h, &i0, &i1);
            fl_vf n = fl_set1((float)(i1 - i0));
            for (int64_t ow = 0; ow < wo; ow += FL_VW) fl_store(div + ow, n * fl_load(p->cols + ow));
            if (kw == 3) pool_plane_row(b, p->off, 3, 0, wo, div, out);
            else pool_plane_row(b, p->off, kw, 0, wo, div, out);
        }
    }
}

/* Separable windows on planes that fit the flat path (pool_flat_fits: stride 1, the output as
 * wide as the input, wo == w: pl + pr = (kw - 1) dw) take each plane as one flat array: the
 * vertical pass runs each run of output rows whose windows keep the same rows of the plane as
 * one flat reduction (v[e] over those rows of x[e + (i dh - pt) w]), and the horizontal pass
 * all of v at once, each tap masked to the lanes whose column stays in its row (column + j dw
 * - pl in [0, w): the fill elsewhere). No per-row setup and one partial vector per plane
 * instead of one per row (a 28 x 28 plane: 49 vectors, against 56 rows' worth of loop setup,
 * masked tails and padding fills). The same operations in the same order as
 * pool_plane_sep_task: the same bits. */
/* Most horizontal taps the flat path takes. */
#define POOL_FLAT_TAPS 16

typedef struct {
    const float *x;
    float *y;
    const float *colf; /* e % w as a float, e < ho w + FL_VW */
    const float *div;  /* mean: the divisor of output e (its rows times its columns counted) */
    int64_t h, w, kh, kw, dh, dw, pt, pl, ho;
    int is_max, status;
} pool_flat_ctx;

/* y[e] for e < total = max (NaN wins) or sum over taps j < kw of v[e + off[j]] where column
 * colf[e] + off[j] stays in its row (lo[j] <= colf[e] < hi[j]; the fill elsewhere), the sum
 * divided by div[e]; mode a POOL_ value. */
FL_INLINE void pool_flat_row(const float *v, const float *colf, const float *div, int64_t total,
                             int64_t kw, const int64_t *off, const fl_vf *lo, const fl_vf *hi,
                             int mode, int centred, float *y) {
    int is_max = mode != POOL_SUM;
    fl_vf fv = fl_set1(is_max ? -__builtin_inff() : 0.0f);
    for (int64_t e = 0; e < total; e += FL_VW) {
        fl_vf col = fl_load(colf + e), acc = fv;
        fl_nan nan = fl_nan_none();
        for (int64_t j = 0; j < kw; ++j) {
            /* centred (3 taps at -d, 0, d): the first can only leave its row on the left, the
             * second never, the third only on the right */
            fl_vi in = centred ? (j == 0 ? col >= lo[0] : col < hi[j]) : (col >= lo[j]) & (col < hi[j]);
            fl_vf t = centred && j == 1 ? fl_load(v + e) : fl_select(in, fl_load(v + e + off[j]), fv);
            if (is_max) {
                acc = fl_vmax(acc, t);
                if (mode == POOL_MAX) nan = fl_nan_add(nan, t);
            } else {
                acc += t;
            }
        }
        pool_st(y + e, is_max ? fl_nan_apply(nan, acc) : acc / fl_load(div + e), total - e);
    }
}

/* Planes [u0, u1) of pool2d_nchw's flat path. */
static void pool_flat_task(void *arg, int64_t u0, int64_t u1) {
    pool_flat_ctx *p = (pool_flat_ctx *)arg;
    int64_t w = p->w, ho = p->ho, total = ho * w, guard = (p->kw - 1) * p->dw + FL_VW;
    int is_max = p->is_max;
    float fill = is_max ? -__builtin_inff() : 0.0f;
    float *v = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)(total + 2 * guard));
    if (!v) {
        p->status = -1;
        return;
    }
    pool_plane_fill(v, guard, fill);
    pool_plane_fill(v + guard + total, guard, fill);
    v += guard;
    int64_t off[POOL_FLAT_TAPS];
    fl_vf lo[POOL_FLAT_TAPS], hi[POOL_FLAT_TAPS];
    for (int64_t j = 0; j < p->kw; ++j) { /* tap j of column c reads c + off[j]: in its row */
        off[j] = j * p->dw - p->pl;       /* where -off[j] <= c < w - off[j] */
        lo[j] = fl_set1((float)-off[j]);
        hi[j] = fl_set1((float)(w - off[j]));
    }
    for (int64_t u = u0; u < u1; ++u) {
        const float *x = p->x + u * p->h * w;
        int met_nan = 0;
        for (int64_t oh = 0; oh < ho;) { /* runs of rows whose windows keep the same rows */
            int64_t i0, i1, j0, j1, end = oh + 1;
            pool_taps(oh - p->pt, p->dh, p->kh, 0, p->h, &i0, &i1);
            for (; end < ho; ++end) {
                pool_taps(end - p->pt, p->dh, p->kh, 0, p->h, &j0, &j1);
                if (j0 != i0 || j1 != i1) break;
            }
            if (i0 == i1) pool_plane_fill(v + oh * w, (end - oh) * w, fill);
            else if (is_max)
                met_nan |= pool_rows_reduce(x + (oh - p->pt + i0 * p->dh) * w, i1 - i0, p->dh * w,
                                            (end - oh) * w, 1, v + oh * w);
            else
                pool_rows_reduce(x + (oh - p->pt + i0 * p->dh) * w, i1 - i0, p->dh * w,
                                 (end - oh) * w, 0, v + oh * w);
            oh = end;
        }
        float *y = p->y + u * total;
        int centred = p->kw == 3 && p->pl == p->dw;
#define POOL_FLAT_ROW(mode)                                                                    \
    do {                                                                                       \
        if (centred) pool_flat_row(v, p->colf, p->div, total, 3, off, lo, hi, mode, 1, y);     \
        else if (p->kw == 3) pool_flat_row(v, p->colf, p->div, total, 3, off, lo, hi, mode, 0, y); \
        else pool_flat_row(v, p->colf, p->div, total, p->kw, off, lo, hi, mode, 0, y);         \
    } while (0)
        if (!is_max) POOL_FLAT_ROW(POOL_SUM);
        else if (met_nan) POOL_FLAT_ROW(POOL_MAX);
        else POOL_FLAT_ROW(POOL_MAX_NO_NAN);
#undef POOL_FLAT_ROW
    }
}

/* pool2d_nchw on its flat path (see pool_flat_task); cols: the mean's columns counted per
 * output column (wo + FL_VW), or NULL for max. */
static int pool_flat(int64_t planes, int64_t h, int64_t w, const float *x, int is_max,
                     int64_t kh, int64_t kw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                     int64_t h_end, int count_include_pad, int64_t ho, const float *cols,
                     float *y) {
    int64_t total = ho * w;
    float *colf = (float *)malloc((size_t)(2 * (total + FL_VW)) * sizeof(float));
    if (!colf) return -1;
    float *div = colf + total + FL_VW;
    for (int64_t e = 0, c = 0; e < total + FL_VW; ++e) {
        colf[e] = (float)c;
        c = c + 1 == w ? 0 : c + 1;
    }
    if (!is_max) {
        for (int64_t oh = 0; oh < ho; ++oh) {
            int64_t i0, i1;
            if (count_include_pad) pool_taps(oh - pt, dh, kh, -pt, h_end, &i0, &i1);
            else pool_taps(oh - pt, dh, kh, 0, h, &i0, &i1);
            float rows = (float)(i1 - i0);
            for (int64_t c = 0; c < w; ++c) div[oh * w + c] = rows * cols[c];
        }
        for (int64_t e = total; e < total + FL_VW; ++e) div[e] = 1.0f;
    }
    pool_flat_ctx p = {x, y, colf, div, h, w, kh, kw, dh, dw, pt, pl, ho, is_max, 0};
    fl_parallel(planes, FL_MAX(1, POOL_MIN_SHARE / FL_MAX(1, total * (kh + kw))), pool_flat_task, &p);
    free(colf);
    return p.status;
}

/* Units u = plane * blocks + block in [u0, u1) of pool2d_nchw (separable windows:
 * pool_plane_sep_task). */
static void pool_plane_task(void *arg, int64_t u0, int64_t u1) {
    pool_plane_ctx *p = (pool_plane_ctx *)arg;
    if (p->sep) {
        pool_plane_sep_task(p, u0, u1);
        return;
    }
    int64_t wo = p->wo, nt = p->kh * p->kw, len = p->q.len, sw = p->sw;
    float *buf = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)(p->q.floats + wo + FL_VW));
    if (!buf) {
        p->status = -1;
        return;
    }
    float *div = buf + p->q.floats;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t plane = u / p->q.blocks, oh0 = u % p->q.blocks * p->q.rb;
        int64_t oh1 = FL_MIN(oh0 + p->q.rb, p->ho);
        int64_t nr = (oh1 - 1 - oh0) * p->sh + (p->kh - 1) * p->dh + 1;
        FL_FN(pool_plane_gather)(p->x + plane * p->h * p->w, p->h, p->w, oh0 * p->sh - p->pt,
                                 nr, p->pl, sw, len, 0.0f, buf);
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            int64_t ih0 = oh * p->sh - p->pt, i0, i1;
            if (p->cip) pool_taps(ih0, p->dh, p->kh, -p->pt, p->h_end, &i0, &i1);
            else pool_taps(ih0, p->dh, p->kh, 0, p->h, &i0, &i1);
            fl_vf rows = fl_set1((float)(i1 - i0));
            for (int64_t ow = 0; ow < wo; ow += FL_VW)
                fl_store(div + ow, rows * fl_load(p->cols + ow));
            const float *b = buf + (oh - oh0) * p->sh * sw * len;
            float *out = p->y + (plane * p->ho + oh) * wo;
            if (nt == 9) pool_plane_row(b, p->off, 9, 0, wo, div, out);
            else pool_plane_row(b, p->off, nt, 0, wo, div, out);
        }
    }
}

/* 2x2 windows at stride 2 that lie inside their planes (no padding; the common layer that
 * halves an image) in one pass from the input rows, without the phase-split buffer: for FL_VW
 * output columns, the two input rows' 2 FL_VW columns are reduced in pairs (vertical), then
 * their even and odd columns (one shuffle each) against each other. Its memory traffic is the
 * input read once and the output written once, where the buffered path's row copies and
 * offset loads cost as much again. A NaN in a window gives NaN. */
typedef struct {
    const float *x;
    float *y;
    int64_t h, w, ho, wo;
    int is_max;
} pool_2x2_ctx;

/* NaN in the lanes where a or b is NaN, else m. */
FL_INLINE fl_vf pool_2x2_nan(fl_vf m, fl_vf a, fl_vf b) {
    return fl_nan_apply(fl_nan_add2(fl_nan_none(), a, b), m);
}

/* out[0:nc] = max or mean of the 2x2 windows of output columns [k0, k0 + nc) of rows r0, r1. */
FL_INLINE void pool_2x2_vec(const float *r0, const float *r1, int64_t k0, int64_t nc,
                            int is_max, float *out) {
    int64_t c0 = FL_MIN(2 * nc, FL_VW), c1 = 2 * nc - c0;
    const float *s0 = r0 + 2 * k0, *s1 = r1 + 2 * k0;
    fl_vf a0 = pool_ld(s0, c0), b0 = pool_ld(s1, c0);
    fl_vf a1 = c1 > 0 ? pool_ld(s0 + FL_VW, c1) : a0, b1 = c1 > 0 ? pool_ld(s1 + FL_VW, c1) : b0;
    fl_vf r;
    if (is_max) {
        fl_vf v0 = pool_2x2_nan(fl_vmax(a0, b0), a0, b0), v1 = pool_2x2_nan(fl_vmax(a1, b1), a1, b1);
        fl_vf e = FL_SHUF(v0, v1, POOL_EVENS), o = FL_SHUF(v0, v1, POOL_ODDS);
        r = pool_2x2_nan(fl_vmax(e, o), e, o);
    } else {
        fl_vf v0 = a0 + b0, v1 = a1 + b1;
        r = (FL_SHUF(v0, v1, POOL_EVENS) + FL_SHUF(v0, v1, POOL_ODDS)) * fl_set1(0.25f);
    }
    pool_st(out + k0, r, nc);
}

/* Output rows t = plane Ho + oh in [t0, t1) of the 2x2 stride-2 path. */
static void pool_2x2_task(void *arg, int64_t t0, int64_t t1) {
    const pool_2x2_ctx *p = (const pool_2x2_ctx *)arg;
    int64_t wo = p->wo, w = p->w;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t plane = t / p->ho, oh = t % p->ho;
        const float *r0 = p->x + (plane * p->h + 2 * oh) * w, *r1 = r0 + w;
        float *out = p->y + t * wo;
        int64_t k0 = 0;
        if (p->is_max) {
            for (; k0 + FL_VW <= wo; k0 += FL_VW) pool_2x2_vec(r0, r1, k0, FL_VW, 1, out);
            if (k0 < wo) pool_2x2_vec(r0, r1, k0, wo - k0, 1, out);
        } else {
            for (; k0 + FL_VW <= wo; k0 += FL_VW) pool_2x2_vec(r0, r1, k0, FL_VW, 0, out);
            if (k0 < wo) pool_2x2_vec(r0, r1, k0, wo - k0, 0, out);
        }
    }
}

/* 3x3 max windows at stride 2 with at most one row and one column of padding before the
 * plane (ResNet's stem pool), in one pass from the input rows: for FL_VW output columns, the
 * maximum over the window's rows of the 2 FL_VW input columns from column 2 k0 (the lanes
 * past the row -inf), split into even and odd columns e, o (one shuffle each); output k then
 * takes e[k], o[k] and its third column, o[k - 1] with a column of padding (the previous
 * block's odd columns moved in by one lane) or e[k + 1] without (the next block's even
 * ones). A NaN in a window gives NaN. */
typedef struct {
    const float *x;
    float *y;
    int64_t h, w, ho, wo, pt, pl;
} pool_3x3_ctx;

/* The maximum over rows r[0:nr] (1 to 3) of columns [c0, c0 + FL_VW), NaN where one is NaN,
 * -inf past the row's w columns. */
FL_INLINE fl_vf pool_3x3_rows(const float *const *r, int nr, int64_t c0, int64_t w) {
    fl_vf ninf = fl_set1(-__builtin_inff());
    int64_t rest = w - c0;
    if (rest <= 0) return ninf;
    fl_vf v[3] = {ninf, ninf, ninf};
    for (int i = 0; i < nr; ++i)
        v[i] = rest >= FL_VW ? fl_load(r[i] + c0)
                             : fl_select(fl_load(pool_lanes) < (float)rest, fl_load_n(r[i] + c0, rest), ninf);
    if (nr == 1) return v[0];
    fl_nan nan = fl_nan_add2(fl_nan_none(), v[0], v[1]);
    fl_vf m = fl_vmax(v[0], v[1]);
    if (nr == 3) {
        nan = fl_nan_add2(nan, v[2], v[2]);
        m = fl_vmax(m, v[2]);
    }
    return fl_nan_apply(nan, m);
}

/* max(a, b, c), NaN where one is NaN. */
FL_INLINE fl_vf pool_3x3_max3(fl_vf a, fl_vf b, fl_vf c) {
    fl_nan nan = fl_nan_add2(fl_nan_add2(fl_nan_none(), a, b), c, c);
    return fl_nan_apply(nan, fl_vmax(fl_vmax(a, b), c));
}

/* Output rows t = plane Ho + oh in [t0, t1) of the 3x3 stride-2 max path. */
static void pool_3x3_task(void *arg, int64_t t0, int64_t t1) {
    const pool_3x3_ctx *p = (const pool_3x3_ctx *)arg;
    int64_t w = p->w, wo = p->wo;
    fl_vf ninf = fl_set1(-__builtin_inff());
    for (int64_t t = t0; t < t1; ++t) {
        int64_t plane = t / p->ho, oh = t % p->ho;
        const float *r[3];
        int nr = 0;
        for (int64_t ih = 2 * oh - p->pt; ih < 2 * oh - p->pt + 3; ++ih)
            if (ih >= 0 && ih < p->h) r[nr++] = p->x + (plane * p->h + ih) * w;
        float *out = p->y + t * wo;
        fl_vf a = pool_3x3_rows(r, nr, 0, w), b = pool_3x3_rows(r, nr, FL_VW, w);
        fl_vf e = FL_SHUF(a, b, POOL_EVENS), o = FL_SHUF(a, b, POOL_ODDS), o_prev = ninf;
        for (int64_t k0 = 0; k0 < wo; k0 += FL_VW) {
            fl_vf third, e_next = ninf, o_next = ninf;
            if (p->pl == 0 || k0 + FL_VW < wo) {
                a = pool_3x3_rows(r, nr, 2 * (k0 + FL_VW), w);
                b = pool_3x3_rows(r, nr, 2 * (k0 + FL_VW) + FL_VW, w);
                e_next = FL_SHUF(a, b, POOL_EVENS);
                o_next = FL_SHUF(a, b, POOL_ODDS);
            }
            if (p->pl) third = FL_SHUF(o_prev, o, POOL_PREV); /* o[k - 1] */
            else third = FL_SHUF(e, e_next, POOL_NEXT);        /* e[k + 1] */
            pool_st(out + k0, pool_3x3_max3(e, o, third), wo - k0);
            o_prev = o;
            e = e_next;
            o = o_next;
        }
    }
}

/* ------------------------------------------------------ NCHW pools of small planes in blocks */
/* Planes of at most 8 x 8, and on AVX-512 of at most 16 x 16 with 64 channels or more (8
 * channels or more, windows of at most POOL_RUN taps; not the 2x2 windows at stride 2 inside
 * the plane, which pool_2x2_task moves faster), in blocks of FL_VW channels as
 * conv_depthwise_blocks.c runs depthwise convolutions: the block's planes moved into a buffer
 * of pixels of FL_VW channels (layout_planes_in) with borders of -inf (max) or 0 (mean), every
 * window then whole inside it, POOL_BLOCKS_P outputs of a row per pass, and the outputs moved
 * back into their planes. The plane kernels ran vectors of FL_VW columns over rows of 7 or 14
 * and set up every row (docs/design.md, "Depthwise convolutions on small planes"). */
#define POOL_BLOCKS_P (FL_VW >= 16 ? 8 : 4)

FL_INLINE int pool_blocks_fit(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw) {
    if (FL_VW < 8 || c < 8 || kh * kw > POOL_RUN) return 0;
    return h * w <= 8 * 8 || (FL_VW >= 16 && c >= 4 * FL_VW && h * w <= 16 * 16);
}

typedef struct {
    const float *x;
    float *y;
    const float *inv; /* inv[oh wo + ow]: 1 / the taps a mean adds (1 past the plane) */
    int64_t c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, hp, wp;
    int is_max, status;
} pool_blocks_ctx;

/* ob[(oh wo + ow + u) FL_VW + 0:FL_VW] for u < P = the max (MAX 2: NaN wins; 1: the block holds
 * no NaN) or the sum times inv of xb[((oh sh + i dh) wp + (ow + u) sw + j dw) FL_VW + 0:FL_VW]
 * over the taps (i, j). */
FL_INLINE void pool_blocks_pass(const int P, const int MAX, const pool_blocks_ctx *p, const float *xb, int64_t oh,
                                int64_t ow, float *ob) {
    fl_vf acc[POOL_BLOCKS_P];
    fl_nan nan[POOL_BLOCKS_P];
    _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) {
        acc[u] = fl_set1(MAX ? -__builtin_inff() : 0.0f);
        nan[u] = fl_nan_none();
    }
    int64_t step = p->sw * FL_VW;
    for (int64_t i = 0; i < p->kh; ++i) {
        const float *r = xb + ((oh * p->sh + i * p->dh) * p->wp + ow * p->sw) * FL_VW;
        for (int64_t j = 0; j < p->kw; ++j, r += p->dw * FL_VW) {
            _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u) {
                fl_vf v = fl_load(r + u * step);
                if (MAX) {
                    acc[u] = fl_vmax(acc[u], v);
                    if (MAX == 2) nan[u] = fl_nan_add(nan[u], v);
                } else {
                    acc[u] += v;
                }
            }
        }
    }
    float *o = ob + (oh * p->wo + ow) * FL_VW;
    const float *inv = p->inv + oh * p->wo + ow;
    _Pragma("GCC unroll 8") for (int u = 0; u < P; ++u)
        fl_store(o + u * FL_VW, MAX == 2 ? fl_nan_apply(nan[u], acc[u]) : MAX ? acc[u] : acc[u] * inv[u]);
}

/* ob[(oh wo + ow) FL_VW + 0:FL_VW] = the max over a 3x3 window at stride 1 of xb (a block
 * without NaN), separably: the max of three columns of each buffer row into hm (the two before
 * kept in registers), then of three rows of hm; 4 max a pixel instead of 8. */
static void pool_blocks_max3(const pool_blocks_ctx *p, const float *xb, float *hm, float *ob) {
    int64_t wo = p->wo, row = wo * FL_VW;
    for (int64_t r = 0; r < p->ho + 2; ++r) {
        const float *s = xb + r * p->wp * FL_VW;
        float *d = hm + r * row;
        fl_vf a = fl_load(s), b = fl_load(s + FL_VW);
        for (int64_t q = 0; q < wo; ++q) {
            fl_vf c = fl_load(s + (q + 2) * FL_VW);
            fl_store(d + q * FL_VW, fl_vmax(fl_vmax(a, b), c));
            a = b;
            b = c;
        }
    }
    for (int64_t oh = 0; oh < p->ho; ++oh) {
        const float *h0 = hm + oh * row;
        float *d = ob + oh * row;
        for (int64_t q = 0; q < row; q += FL_VW)
            fl_store(d + q, fl_vmax(fl_vmax(fl_load(h0 + q), fl_load(h0 + row + q)), fl_load(h0 + 2 * row + q)));
    }
}

/* Units [u0, u1) = (image, block of FL_VW channels); rows in order, a pass past a row's end
 * writing the next row's first pixels, which that row's passes write again. */
static void pool_blocks_task(void *arg, int64_t u0, int64_t u1) {
    pool_blocks_ctx *p = (pool_blocks_ctx *)arg;
    int64_t c = p->c, h = p->h, w = p->w, hw = h * w, howo = p->ho * p->wo, wp = p->wp;
    int64_t groups = (c + FL_VW - 1) / FL_VW, in_floats = p->hp * wp * FL_VW;
    int64_t out_floats = (FL_MAX(hw, howo) + POOL_BLOCKS_P) * FL_VW;
    int max3 = p->is_max && p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 && p->dh == 1 && p->dw == 1;
    float *xb = fl_buf_floats(&FL_FN(pool_plane_buf),
                              (size_t)(in_floats + out_floats + (max3 ? (p->ho + 2) * p->wo * FL_VW : 0)));
    if (!xb) {
        p->status = -1;
        return;
    }
    float *ob = xb + in_floats, *hm = ob + out_floats;
    layout_borders(xb, p->hp, wp, p->pt, p->pl, h, w, p->is_max ? -__builtin_inff() : 0.0f);
    for (int64_t u = u0; u < u1; ++u) {
        int64_t n = u / groups, c0 = (u % groups) * FL_VW, nc = FL_MIN(FL_VW, c - c0);
        if (nc < FL_VW) memset(ob, 0, (size_t)(hw * FL_VW) * sizeof(float)); /* lanes past c: zeros */
        layout_planes_in(p->x + (n * c + c0) * hw, hw, nc, h, w, ob, xb + (p->pt * wp + p->pl) * FL_VW, wp);
        int mode = 0; /* the max tracks NaN only in a block that holds one (one test a pixel) */
        if (p->is_max) {
            fl_nan any = fl_nan_none();
            for (int64_t q = 0; q < hw; ++q) any = fl_nan_add(any, fl_load(ob + q * FL_VW));
            mode = fl_nan_any(any) ? 2 : 1;
        }
        if (mode == 1 && max3) {
            pool_blocks_max3(p, xb, hm, ob);
            layout_small(ob, FL_VW, p->y + (n * c + c0) * howo, howo, howo, nc);
            continue;
        }
        for (int64_t oh = 0; oh < p->ho; ++oh)
            for (int64_t ow = 0; ow < p->wo; ow += POOL_BLOCKS_P) {
                if (mode == 2) pool_blocks_pass(POOL_BLOCKS_P, 2, p, xb, oh, ow, ob);
                else if (mode == 1) pool_blocks_pass(POOL_BLOCKS_P, 1, p, xb, oh, ow, ob);
                else pool_blocks_pass(POOL_BLOCKS_P, 0, p, xb, oh, ow, ob);
            }
        layout_small(ob, FL_VW, p->y + (n * c + c0) * howo, howo, howo, nc); /* y[n, c0 + k] */
    }
}

/* pool2d_nchw in channel blocks (pool_blocks_task). */
static int pool_blocks(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int is_max, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                       int64_t h_end, int64_t w_end, int count_include_pad, int64_t ho, int64_t wo, float *y) {
    /* every window of the passes inside the buffer: ho rows, wo columns rounded up to whole
     * passes, besides x's own rows and columns */
    int64_t wo_passes = (wo + POOL_BLOCKS_P - 1) / POOL_BLOCKS_P * POOL_BLOCKS_P;
    int64_t hp = FL_MAX(pt + h, (ho - 1) * sh + (kh - 1) * dh + 1);
    int64_t wp = FL_MAX(pl + w, (wo_passes - 1) * sw + (kw - 1) * dw + 1);
    float *inv = (float *)malloc((size_t)(ho * wo + POOL_BLOCKS_P) * sizeof(float));
    if (!inv) return -1;
    for (int64_t oh = 0; oh < ho; ++oh) {
        int64_t i0, i1;
        if (count_include_pad) pool_taps(oh * sh - pt, dh, kh, -pt, h_end, &i0, &i1);
        else pool_taps(oh * sh - pt, dh, kh, 0, h, &i0, &i1);
        for (int64_t ow = 0; ow < wo; ++ow) {
            int64_t j0, j1;
            if (count_include_pad) pool_taps(ow * sw - pl, dw, kw, -pl, w_end, &j0, &j1);
            else pool_taps(ow * sw - pl, dw, kw, 0, w, &j0, &j1);
            inv[oh * wo + ow] = 1.0f / (float)((i1 - i0) * (j1 - j0));
        }
    }
    for (int64_t q = ho * wo; q < ho * wo + POOL_BLOCKS_P; ++q) inv[q] = 1.0f;
    pool_blocks_ctx p = {x, y, inv, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, hp, wp, is_max, 0};
    int64_t units = n * ((c + FL_VW - 1) / FL_VW), per_unit = FL_MAX(1, ho * wo * kh * kw * FL_VW);
    fl_parallel(units, FL_MAX(1, POOL_MIN_SHARE / per_unit), pool_blocks_task, &p);
    free(inv);
    return p.status;
}

/* y[n, c, oh, ow] = max or mean over the window of x: x (N, C, H, W), y (N, C, Ho, Wo). */
int FL_FN(pool2d_nchw)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int is_max,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                       int64_t pt, int64_t pl, int64_t h_end, int64_t w_end,
                       int count_include_pad, int64_t ho, int64_t wo, float *y) {
    if (n <= 0 || c <= 0 || ho <= 0 || wo <= 0) return 0;
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) return -2;
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && dh == 1 && dw == 1 && pt == 0 && pl == 0 &&
        2 * ho <= h && 2 * wo <= w) {
        pool_2x2_ctx p = {x, y, h, w, ho, wo, is_max};
        fl_parallel(n * c * ho, FL_MAX(1, POOL_MIN_SHARE / (4 * wo)), pool_2x2_task, &p);
        return 0;
    }
    if (pool_blocks_fit(c, h, w, kh, kw))
        return pool_blocks(n, c, h, w, x, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, count_include_pad,
                           ho, wo, y);
    if (is_max && kh == 3 && kw == 3 && sh == 2 && sw == 2 && dh == 1 && dw == 1 && pt <= 1 &&
        pl <= 1 && 2 * (ho - 1) - pt < h && 2 * (wo - 1) - pl < w) {
        pool_3x3_ctx p = {x, y, h, w, ho, wo, pt, pl};
        fl_parallel(n * c * ho, FL_MAX(1, POOL_MIN_SHARE / (9 * wo)), pool_3x3_task, &p);
        return 0;
    }
    pool_plane_plan q = pool_plane_plan_of(n * c, kh, kw, sh, sw, dh, dw, ho, wo);
    int64_t *off = (int64_t *)malloc((size_t)(kh * kw) * sizeof(int64_t));
    float *cols = is_max ? 0 : (float *)malloc((size_t)(wo + FL_VW) * sizeof(float));
    if (!off || (!is_max && !cols)) {
        free(off);
        free(cols);
        return -1;
    }
    int sep = is_max || (sw == 1 && kh * kw <= POOL_RUN);
    pool_plane_offsets(sep ? 1 : kh, kw, dh, dw, sw, q.len, off);
    if (cols) {
        for (int64_t ow = 0; ow < wo + FL_VW; ++ow) {
            int64_t iw0 = FL_MIN(ow, wo - 1) * sw - pl, j0, j1;
            if (count_include_pad) pool_taps(iw0, dw, kw, -pl, w_end, &j0, &j1);
            else pool_taps(iw0, dw, kw, 0, w, &j0, &j1);
            cols[ow] = (float)(j1 - j0);
        }
    }
    if (sep && pool_flat_fits(sh, sw, w, wo, ho) && kw <= POOL_FLAT_TAPS) {
        int st = pool_flat(n * c, h, w, x, is_max, kh, kw, dh, dw, pt, pl, h_end,
                           count_include_pad, ho, cols, y);
        free(off);
        free(cols);
        return st;
    }
    pool_plane_ctx p = {x, y, off, cols, q, h, w, kh, kw, sh, sw, dh, pt, pl, h_end, ho, wo,
                        is_max, count_include_pad, sep, 0};
    int64_t per_unit = FL_MAX(1, q.rb * wo * kh * kw);
    fl_parallel(n * c * q.blocks, FL_MAX(1, POOL_MIN_SHARE / per_unit), pool_plane_task, &p);
    free(off);
    free(cols);
    return p.status;
}
