/* conv_transpose2d and conv_transpose2d_nchw (conv.h). conv_transpose2d: one sgemm per group
 * (x rows times w (ci', kh kw co)), then each output pixel gathers its taps from those columns
 * (col2im without scattered writes) and the row runs its epilogue. conv_transpose2d_nchw: the
 * sgemm w^T (co kh kw, ci') @ x (ci', rows W) on NCHW planes in chunks of input rows, each
 * product row added into output rows kept split in column phases, each row interleaved into y
 * with its epilogue once its taps are in. Compiled once per ISA (kernels.inc). */

#include "conv_internal.h"
#include "gemm_internal.h"
#include "pool_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

/* ---------------------------------------------------------------- transposed convolution */

typedef struct {
    const float *cols, *bias;
    float *y;
    int64_t h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups, kk;
    int code, tiled;   /* tiled: kernel = stride, no crop or dilation, one group */
    float alpha;
    int status;
} conv_t_ctx;

/* o[0:n] += s[0:n] (the tail as one partial vector: rows of a small plane are shorter than
 * a vector) */
FL_INLINE void conv_add(float *o, const float *s, int64_t n) {
    int64_t j = 0;
    for (; j + FL_VW <= n; j += FL_VW) fl_store(o + j, fl_load(o + j) + fl_load(s + j));
    if (j < n) fl_store_n(o + j, fl_load_n(o + j, n - j) + fl_load_n(s + j, n - j), n - j);
}

/* Each task's bias repeated over an output row (few channels: the row's epilogue runs as one
 * row of Wo cout values rather than Wo rows of cout). */
static __thread fl_buf conv_t_bias_buf;
/* Fewest output channels whose pixels take the epilogue one by one. */
#define CONV_T_WIDE_PIXEL 64

/* yrow = f(yrow + bias) for one output row of wo pixels of cout channels; bias_row: the bias
 * repeated for every pixel (or NULL where there is no bias), for rows of few channels. */
static void conv_t_epilogue(const conv_t_ctx *p, float *yrow, int64_t cout,
                            const float *bias_row) {
    if (!p->bias && p->code == FL_LINEAR) return;
    if (cout >= CONV_T_WIDE_PIXEL)
        FL_FN(rows_bias_act_range)(0, p->wo, cout, yrow, cout, p->bias, p->code, p->alpha, yrow,
                                   cout);
    else
        FL_FN(rows_bias_act_range)(0, 1, p->wo * cout, yrow, 0, bias_row, p->code, p->alpha,
                                   yrow, 0);
}

/* Output rows t = n Ho + oh in [t0, t1): each pixel gathers the columns of its taps, then the
 * row's epilogue. cols: (N H W, groups kk), group g's taps (i, j) at g kk + (i kw + j) co. */
static void conv_t_task(void *arg, int64_t t0, int64_t t1) {
    conv_t_ctx *p = (conv_t_ctx *)arg;
    int64_t co = p->cout_g, cout = co * p->groups, ld = p->kk * p->groups;
    int64_t tap_i[p->kh], tap_ih[p->kh];
    float *bias_row = 0;
    if (p->bias && cout < CONV_T_WIDE_PIXEL) {
        bias_row = fl_buf_floats(&conv_t_bias_buf, (size_t)(p->wo * cout));
        if (!bias_row) {
            p->status = -1;
            return;
        }
        for (int64_t ow = 0; ow < p->wo; ++ow)
            memcpy(bias_row + ow * cout, p->bias, (size_t)cout * sizeof(float));
    }
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, oh = t % p->ho, taps = 0;
        for (int64_t i = 0; i < p->kh; ++i) {
            int64_t num = oh + p->ct - i * p->dh;
            if (num < 0 || num % p->sh || num / p->sh >= p->h) continue;
            tap_i[taps] = i;
            tap_ih[taps++] = num / p->sh;
        }
        float *yrow = p->y + t * p->wo * cout;
        if (p->tiled) {
            /* each output pixel has one tap: the row is input row oh / sh's columns of tap row
             * i = oh % sh, kw co floats per input pixel, laid side by side */
            int64_t run = p->kw * co;
            const float *src = p->cols + (n * p->h + oh / p->sh) * p->w * ld + oh % p->sh * run;
            for (int64_t iw = 0; iw < p->w; ++iw) {
                const float *s = src + iw * ld;
                float *o = yrow + iw * run;
                int64_t j = 0;
                for (; j + FL_VW <= run; j += FL_VW) fl_store(o + j, fl_load(s + j));
                for (; j < run; ++j) o[j] = s[j];
            }
            conv_t_epilogue(p, yrow, cout, bias_row);
            continue;
        }
        memset(yrow, 0, (size_t)(p->wo * cout) * sizeof(float));
        for (int64_t ow = 0; ow < p->wo; ++ow) {
            float *o = yrow + ow * cout;
            for (int64_t j = 0; j < p->kw; ++j) {
                int64_t num = ow + p->cl - j * p->dw;
                if (num < 0 || num % p->sw || num / p->sw >= p->w) continue;
                int64_t iw = num / p->sw;
                for (int64_t q = 0; q < taps; ++q) {
                    const float *src = p->cols + ((n * p->h + tap_ih[q]) * p->w + iw) * ld +
                                       (tap_i[q] * p->kw + j) * co;
                    for (int64_t g = 0; g < p->groups; ++g)
                        conv_add(o + g * co, src + g * p->kk, co);
                }
            }
        }
        conv_t_epilogue(p, yrow, cout, bias_row);
    }
}

/* y = f(col2im(x @ w) + b): x (N, H, W, cin), pw each group's w (cin/g, kh kw cout_g) packed,
 * bias (groups cout_g,), y (N, Ho, Wo, groups cout_g). */
int FL_FN(conv_transpose2d)(int64_t n, int64_t h, int64_t w, int64_t cin, const float *x,
                            int64_t kh, int64_t kw, int64_t cout_g, int64_t groups, int64_t sh,
                            int64_t sw, int64_t dh, int64_t dw, int64_t ct, int64_t cl,
                            int64_t ho, int64_t wo, const float *pw, const float *bias,
                            int code, float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout_g <= 0) return 0;
    if (!conv_code_ok(code) || groups < 1 || cin % groups || kh < 1 || kw < 1) return -2;
    int64_t cin_g = cin / groups, kk = kh * kw * cout_g, rows = n * h * w;
    float *cols = fl_buf_floats(&FL_FN(conv_call_buf), (size_t)(rows * kk * groups));
    if (!cols) return -1;
    int64_t pf = fl_packed_floats(cin_g, kk);
    for (int64_t g = 0; g < groups; ++g) {
        int st = FL_FN(matmul)(rows, kk, cin_g, x + g * cin_g, cin, 0, 0, 0, pw + g * pf, 0,
                               FL_LINEAR, 0.0f, cols + g * kk, kk * groups);
        if (st) return st;
    }
    int tiled = kh == sh && kw == sw && (kh == 1 || dh == 1) && (kw == 1 || dw == 1) && ct == 0 &&
                cl == 0 && ho == h * sh && wo == w * sw && groups == 1;
    conv_t_ctx p = {cols, bias, y, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups,
                    kk, code, tiled, alpha, 0};
    int64_t taps = FL_MAX(1, kh * kw / (sh * sw));
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * cout_g * groups * taps)),
                conv_t_task, &p);
    return p.status;
}

/* ------------------------------------------------------- transposed convolution, NCHW planes */
/* A unit is (image n, group g, block of output channels, band of output rows). Per chunk of
 * input rows: cols (co kh kw, rows W) = wt (co kh kw, ci') @ x[n, g ci':, rows] (the sgemm
 * on the NCHW planes as they are, no layout change), then each cols row (co, i, j) of input
 * row ih adds to output row oh = ih sh - ct + i dh held split in its sw column phases
 * (ow = sw t + q), where tap j lands on consecutive t: every add is a contiguous vector add.
 * An output row whose input rows are all done is interleaved into y with bias and
 * activation; the rows in between live in a ring (per channel, the rows one chunk reaches,
 * at most the band's). */

/* Input rows per chunk: about this many sgemm columns (one packed block of b, gemm.c). */
#define CONV_TP_COLUMNS 256
/* A block's cols (co kh kw x chunk columns, 128 KiB) stay in L2 beside its ring rows. */
#define CONV_TP_COLS_FLOATS (INT64_C(1) << 15)

#if FL_VW == 16
#define CONV_ZIP_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define CONV_ZIP_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#elif FL_VW == 8
#define CONV_ZIP_LO 0, 8, 1, 9, 2, 10, 3, 11
#define CONV_ZIP_HI 4, 12, 5, 13, 6, 14, 7, 15
#else
#define CONV_ZIP_LO 0, 4, 1, 5
#define CONV_ZIP_HI 2, 6, 3, 7
#endif

typedef struct {
    const float *x, *wt, *bias;
    float *y;
    int64_t cin, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups;
    int64_t co_blk, co_blocks;  /* output channels per block, blocks per group */
    int64_t bands, band_rows;   /* bands of output rows per (n, g, block), rows per band */
    int64_t chunk;              /* input rows per sgemm */
    int64_t ring, tlen;         /* ring rows per channel; floats per column phase of a row */
    int code, status;
    float alpha;
} conv_tp_ctx;

/* floor(a / b) for b > 0 */
FL_INLINE int64_t conv_floor_div(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* out[0:wo] = f(bias + the row whose sw phases (tlen floats apart) are r: out[sw t + q] =
 * r[q tlen + t]). */
static void conv_tp_finish(const conv_tp_ctx *p, const float *r, float bias, float *out) {
    int64_t wo = p->wo, sw = p->sw, tl = p->tlen;
    fl_vf b = fl_set1(bias);
    int lin = p->code == FL_LINEAR;
    if (sw == 1) {               /* (the phase rows are tlen floats, a multiple of FL_VW) */
        for (int64_t ow = 0; ow < wo; ow += FL_VW) {
            fl_vf a = fl_load(r + ow) + b;
            pool_st(out + ow, lin ? a : rows_vact(a, p->code, p->alpha), wo - ow);
        }
        return;
    }
    if (sw == 2) {               /* the two phases zipped */
        for (int64_t t = 0, ow = 0; ow < wo; t += FL_VW, ow += 2 * FL_VW) {
            fl_vf a = fl_load(r + t) + b, c = fl_load(r + tl + t) + b;
            fl_vf lo = FL_SHUF(a, c, CONV_ZIP_LO), hi = FL_SHUF(a, c, CONV_ZIP_HI);
            pool_st(out + ow, lin ? lo : rows_vact(lo, p->code, p->alpha), wo - ow);
            if (ow + FL_VW < wo)
                pool_st(out + ow + FL_VW, lin ? hi : rows_vact(hi, p->code, p->alpha),
                        wo - ow - FL_VW);
        }
        return;
    }
    for (int64_t ow = 0; ow < wo; ++ow) out[ow] = r[ow % sw * tl + ow / sw] + bias;
    if (!lin)
        for (int64_t ow = 0; ow < wo; ow += FL_VW)
            pool_st(out + ow, rows_vact(pool_ld(out + ow, wo - ow), p->code, p->alpha), wo - ow);
}

/* Ring slot of output row oh zeroed in each of the nco channels. */
FL_INLINE void conv_tp_zero(float *ring, int64_t nco, int64_t L, int64_t row, int64_t oh) {
    for (int64_t co = 0; co < nco; ++co)
        memset(ring + (co * L + oh % L) * row, 0, (size_t)row * sizeof(float));
}

/* Units u = ((n groups + g) co_blocks + cb) bands + band in [u0, u1). */
static void conv_tp_task(void *arg, int64_t u0, int64_t u1) {
    conv_tp_ctx *p = (conv_tp_ctx *)arg;
    int64_t kh = p->kh, kw = p->kw, kk = kh * kw, w = p->w, sw = p->sw, tl = p->tlen;
    int64_t cin_g = p->cin / p->groups, row = sw * tl, L = p->ring;
    int64_t m_most = FL_MIN(p->co_blk, p->cout_g) * kk;
    float *cols = fl_buf_floats(&FL_FN(conv_task_buf),
                                (size_t)(m_most * p->chunk * w + m_most / kk * L * row));
    if (!cols) {
        p->status = -1;
        return;
    }
    float *ring = cols + m_most * p->chunk * w;
    /* tap j: phase q, first phase column f (t = iw + f), input columns [lo, hi) */
    int64_t tq[kw], tf[kw], tlo[kw], thi[kw];
    for (int64_t j = 0; j < kw; ++j) {
        int64_t e = j * p->dw - p->cl, q = e - conv_floor_div(e, sw) * sw;
        int64_t len = (p->wo - q + sw - 1) / sw;    /* columns of phase q */
        tq[j] = q;
        tf[j] = (e - q) / sw;
        tlo[j] = FL_MAX(0, -tf[j]);
        thi[j] = FL_MAX(tlo[j], FL_MIN(w, len - tf[j]));
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t band = u % p->bands, t = u / p->bands;
        int64_t cb = t % p->co_blocks, ng = t / p->co_blocks, g = ng % p->groups;
        int64_t n = ng / p->groups;
        int64_t co0 = cb * p->co_blk, nco = FL_MIN(p->co_blk, p->cout_g - co0), m = nco * kk;
        int64_t oh0 = band * p->band_rows, oh1 = FL_MIN(p->ho, oh0 + p->band_rows);
        if (oh0 >= oh1) continue;
        int64_t ch0 = g * p->cout_g + co0;              /* first output channel */
        const float *xg = p->x + (n * p->cin + g * cin_g) * p->h * w;
        const float *a = p->wt + ch0 * kk * cin_g;
        float *yb = p->y + (n * p->cout_g * p->groups + ch0) * p->ho * p->wo;
        /* input rows with a tap in [oh0, oh1) */
        int64_t ih0 = FL_MAX(0, -conv_floor_div(-(oh0 + p->ct - (kh - 1) * p->dh), p->sh));
        int64_t ih1 = FL_MIN(p->h, conv_floor_div(oh1 - 1 + p->ct, p->sh) + 1);
        int64_t zeroed = oh0, done = oh0;               /* ring rows [done, zeroed) are live */
        for (int64_t r0 = ih0; r0 < ih1 || done < oh1; r0 += p->chunk) {
            int64_t r1 = FL_MIN(r0 + p->chunk, ih1);
            /* rows this chunk adds to: [done, top) (fewer than L); rows under fin are done */
            int64_t top = r0 < ih1 ? FL_MIN(oh1, (r1 - 1) * p->sh - p->ct + (kh - 1) * p->dh + 1)
                                   : zeroed;
            int64_t fin = r1 >= ih1 ? oh1 : FL_MIN(oh1, r1 * p->sh - p->ct);
            for (; zeroed < top; ++zeroed) conv_tp_zero(ring, nco, L, row, zeroed);
            if (r0 < ih1) {
                int64_t nc = (r1 - r0) * w;
                int st = FL_FN(sgemm)(m, nc, cin_g, a, cin_g, xg + r0 * w, p->h * w, 0, 0, cols,
                                      nc);
                if (st) {
                    p->status = st;
                    return;
                }
                for (int64_t co = 0; co < nco; ++co)
                    for (int64_t i = 0; i < kh; ++i)
                        for (int64_t ih = r0; ih < r1; ++ih) {
                            int64_t oh = ih * p->sh - p->ct + i * p->dh;
                            if (oh < oh0 || oh >= oh1) continue;
                            float *o = ring + (co * L + oh % L) * row;
                            const float *c = cols + ((co * kh + i) * kw) * nc + (ih - r0) * w;
                            for (int64_t j = 0; j < kw; ++j, c += nc)
                                conv_add(o + tq[j] * tl + tf[j] + tlo[j], c + tlo[j],
                                         thi[j] - tlo[j]);
                        }
            }
            for (; done < fin; ++done) {
                if (done >= zeroed)                     /* no taps: nothing live in the ring */
                    conv_tp_zero(ring, nco, L, row, zeroed++);
                for (int64_t co = 0; co < nco; ++co)
                    conv_tp_finish(p, ring + (co * L + done % L) * row,
                                   p->bias ? p->bias[ch0 + co] : 0.0f,
                                   yb + (co * p->ho + done) * p->wo);
            }
        }
    }
}

/* y = f(col2im(w^T @ x) + b) on NCHW planes: x (N, cin, H, W), wt each group's w as
 * (cout_g kh kw, cin / groups), bias (groups cout_g,), y (N, groups cout_g, Ho, Wo). */
int FL_FN(conv_transpose2d_nchw)(int64_t n, int64_t cin, int64_t h, int64_t w, const float *x,
                                 int64_t kh, int64_t kw, int64_t cout_g, int64_t groups,
                                 int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ct,
                                 int64_t cl, int64_t ho, int64_t wo, const float *wt,
                                 const float *bias, int code, float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout_g <= 0) return 0;
    if (!conv_code_ok(code) || groups < 1 || cin % groups || kh < 1 || kw < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || ct < 0 || cl < 0 || h < 1 || w < 1)
        return -2;
    int64_t kk = kh * kw, chunk = FL_MAX(1, FL_MIN(h, CONV_TP_COLUMNS / w));
    int64_t co_blk = FL_MAX(1, FL_MIN(cout_g, CONV_TP_COLS_FLOATS / (kk * chunk * w)));
    int64_t co_blocks = (cout_g + co_blk - 1) / co_blk, base = n * groups * co_blocks;
    int64_t threads = fl_pool_get_threads(), bands = 1;
    /* row bands where the (image, group, channel block) units are too few for the threads, as
     * many as the work has shares of GEMM_MIN_SHARE_FLOPS: a band recomputes the rows its
     * neighbour's window overlaps, which a call too small to share would pay on one thread */
    int64_t shares = FL_MIN(4 * threads, 2 * n * cout_g * groups * kk * (cin / groups) * h * w /
                                             GEMM_MIN_SHARE_FLOPS);
    if (threads > 1 && base % threads && base < shares)
        bands = FL_MAX(1, FL_MIN((shares + base - 1) / base, ho / (2 * sh)));
    int64_t band_rows = (ho + bands - 1) / bands;
    conv_tp_ctx p = {x, wt, bias, y, cin, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g,
                     groups, co_blk, co_blocks, bands, band_rows, chunk,
                     FL_MIN(band_rows, chunk * sh + (kh - 1) * dh + 1),
                     ((wo + sw - 1) / sw + FL_VW - 1) / FL_VW * FL_VW, code, 0, alpha};
    int64_t flops = FL_MAX(1, 2 * co_blk * kk * (cin / groups) * h * w / bands);   /* a unit's */
    fl_parallel(base * bands, FL_MAX(1, GEMM_MIN_SHARE_FLOPS / flops), conv_tp_task, &p);
    return p.status;
}
