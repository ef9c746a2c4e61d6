/* conv2d's dot method (conv.h, CONV_DOT) for convolutions into at most CONV_DOT_MAX_COUT
 * output channels: each output is the dot product of its window with the weights, vectorized
 * along the window's rows. Without a width dilation a window row of NHWC x is kw C consecutive
 * floats (its run), so the run is loaded a vector at a time and multiplied with the same run of
 * each output channel's weights; the sums are reduced across lanes once per output. The
 * implicit GEMM's tiles, vectorized over output channels, leave all but cout lanes of each
 * vector empty there (15 of 16 for one output channel on AVX-512). Compiled once per ISA
 * (kernels.inc). */

#include "conv_internal.h"
#include "dispatch.h"
#include "gemm.h"
#include "threadpool.h"

/* Output columns a pass takes for `co` output channels: P x co sums, P runs and one weight
 * vector in registers (32 on AVX-512, 16 on AVX2). */
#if FL_VW == 16
#define CONV_DOT_COLS(co) ((co) == 1 ? 8 : (co) == 2 ? 6 : (co) <= 4 ? 4 : 2)
#else
#define CONV_DOT_COLS(co) ((co) == 1 ? 6 : (co) == 2 ? 4 : (co) == 3 ? 3 : 2)
#endif
#define CONV_DOT_SUMS 16 /* the most sums of a pass, CONV_DOT_COLS(co) co */
/* Units a thread is given at least where output rows are few, and the fewest output columns of
 * a unit then. */
#define CONV_DOT_UNITS_PER_THREAD 4
#define CONV_DOT_MIN_SPAN 64

typedef struct {
    const float *x;      /* (n, h, w, c) */
    const float *wr;     /* (cout, kh, kv): each channel's window rows, zero past run */
    const float *bias;
    float *y;            /* (n, ho, wo, cout) */
    int64_t h, w, c, kh, sh, sw, dh, pt, pl, ho, wo, cout;
    int64_t run, kv;     /* floats of a window row (kw c), rounded up to whole vectors */
    int64_t span, spans; /* output columns of a unit, units of an output row */
    int code, status;
    float alpha;
} conv_dot_ctx;

/* sum of v's lanes, as a tree (a serial sum's chain of FL_VW adds cost more than the
 * products of a short window) */
FL_INLINE float conv_dot_hsum(fl_vf v) {
#if FL_VW == 16 && defined(__AVX512F__)
    return _mm512_reduce_add_ps((__m512)v);
#elif FL_VW == 8 && defined(__AVX__)
    __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
#else
    return fl_hsum(v);
#endif
}

/* sums[p co + o] = sum_i rows[i][p cs : p cs + run] . wr[o, i, 0 : run] for p < P, o < CO:
 * P output columns whose window rows start at rows[i] + p cs (NULL: a window row outside x,
 * which adds nothing); `whole`: rows[i] hold kv floats (a padded copy), else the last vector
 * is read only up to the run's end. */
FL_INLINE void conv_dot_pass(const int P, const int CO, const conv_dot_ctx *q,
                             const float *const *rows, int64_t cs, int whole, float *sums) {
    fl_vf acc[CONV_DOT_SUMS];
#pragma GCC unroll 16
    for (int k = 0; k < CONV_DOT_SUMS; ++k) acc[k] = fl_set1(0.0f);
    int64_t kv = q->kv, full = whole ? kv : q->run / FL_VW * FL_VW, tail = q->run - full;
    for (int64_t i = 0; i < q->kh; ++i) {
        const float *xr = rows[i], *wi = q->wr + i * kv;
        if (!xr) continue;
        for (int64_t v = 0; v < full; v += FL_VW) {
            fl_vf xv[CONV_DOT_SUMS];
#pragma GCC unroll 16
            for (int p = 0; p < P; ++p) xv[p] = fl_load(xr + p * cs + v);
#pragma GCC unroll 8
            for (int o = 0; o < CO; ++o) {
                fl_vf wv = fl_load(wi + o * q->kh * kv + v);
#pragma GCC unroll 16
                for (int p = 0; p < P; ++p) acc[p * CO + o] += xv[p] * wv;
            }
        }
        if (tail > 0) {
            fl_vf xv[CONV_DOT_SUMS];
#pragma GCC unroll 16
            for (int p = 0; p < P; ++p) xv[p] = fl_load_n(xr + p * cs + full, tail);
#pragma GCC unroll 8
            for (int o = 0; o < CO; ++o) {
                fl_vf wv = fl_load(wi + o * q->kh * kv + full);
#pragma GCC unroll 16
                for (int p = 0; p < P; ++p) acc[p * CO + o] += xv[p] * wv;
            }
        }
    }
#pragma GCC unroll 16
    for (int k = 0; k < P * CO; ++k) sums[k] = conv_dot_hsum(acc[k]);
}

/* Output row t = n Ho + oh, columns [ow0, ow1): passes of CONV_DOT_COLS(CO) columns whose
 * windows lie inside x's columns, read in place; the others one column at a time from a
 * zero-padded copy of their window rows (buf, kh kv floats). Sums into yt (wo, CO). ptrs: 3 kh
 * pointers of the task's (its window rows, their copies, a pass's starts), off the stack: a
 * window of many rows is the model's to choose. */
FL_INLINE void conv_dot_row(const int CO, const conv_dot_ctx *q, int64_t t, int64_t ow0,
                            int64_t ow1, float *buf, const float **ptrs, float *yt) {
    const int P = CONV_DOT_COLS(CO);
    int64_t n = t / q->ho, oh = t % q->ho, c = q->c, cs = q->sw * c;
    const float **rows = ptrs, **pads = ptrs + q->kh, **at = ptrs + 2 * q->kh;
    for (int64_t i = 0; i < q->kh; ++i) {
        int64_t ih = oh * q->sh - q->pt + i * q->dh;
        rows[i] = ih >= 0 && ih < q->h ? q->x + (n * q->h + ih) * q->w * c : 0;
        pads[i] = rows[i] ? buf + i * q->kv : 0;
    }
    /* columns [lo, hi) have windows inside x's columns */
    int64_t lo = FL_MIN((q->pl + q->sw - 1) / q->sw, q->wo);
    int64_t last = q->w * c - q->run + q->pl * c;  /* ow sw c <= last */
    int64_t hi = FL_MAX(lo, FL_MIN(q->wo, last < 0 ? 0 : last / cs + 1));
    float sums[CONV_DOT_SUMS];
    for (int64_t ow = ow0; ow < ow1;) {
        if (ow >= lo && ow + P <= FL_MIN(hi, ow1)) {
            for (int64_t i = 0; i < q->kh; ++i)
                at[i] = rows[i] ? rows[i] + ow * cs - q->pl * c : 0;
            conv_dot_pass(P, CO, q, at, cs, 0, sums);
            for (int k = 0; k < P * CO; ++k) yt[ow * CO + k] = sums[k];
            ow += P;
            continue;
        }
        int64_t s0 = ow * cs - q->pl * c;  /* the window row's first float in x's row */
        if (ow >= lo && ow < hi) {
            for (int64_t i = 0; i < q->kh; ++i) at[i] = rows[i] ? rows[i] + s0 : 0;
            conv_dot_pass(1, CO, q, at, cs, 0, sums);
        } else {
            int64_t a = FL_MAX(0, -s0), b = FL_MIN(q->run, q->w * c - s0);
            for (int64_t i = 0; i < q->kh; ++i) {
                if (!rows[i]) continue;
                float *d = (float *)pads[i];
                memset(d, 0, (size_t)q->kv * sizeof(float));
                if (b > a) memcpy(d + a, rows[i] + s0 + a, (size_t)(b - a) * sizeof(float));
            }
            conv_dot_pass(1, CO, q, pads, cs, 1, sums);
        }
        for (int o = 0; o < CO; ++o) yt[ow * CO + o] = sums[o];
        ++ow;
    }
}

/* Units [u0, u1) (u = t spans + s: columns [s span, (s + 1) span) of output row t): their sums,
 * then bias + activation on them while they are in cache. */
static void conv_dot_task(void *arg, int64_t u0, int64_t u1) {
    conv_dot_ctx *q = (conv_dot_ctx *)arg;
    /* the padded copies (kh kv floats, whole vectors), then 3 kh pointers */
    size_t copies = (size_t)(q->kh * q->kv), per = sizeof(const float *) / sizeof(float);
    float *buf = fl_buf_floats(&FL_FN(conv_task_buf), copies + (size_t)(3 * q->kh) * per);
    if (!buf) {
        q->status = -1;
        return;
    }
    const float **ptrs = (const float **)(void *)(buf + copies);
    for (int64_t u = u0; u < u1; ++u) {
        int64_t t = u / q->spans, ow0 = u % q->spans * q->span, ow1 = FL_MIN(q->wo, ow0 + q->span);
        float *yt = q->y + t * q->wo * q->cout;
        switch (q->cout) {
        case 1: conv_dot_row(1, q, t, ow0, ow1, buf, ptrs, yt); break;
        case 2: conv_dot_row(2, q, t, ow0, ow1, buf, ptrs, yt); break;
        case 3: conv_dot_row(3, q, t, ow0, ow1, buf, ptrs, yt); break;
        case 4: conv_dot_row(4, q, t, ow0, ow1, buf, ptrs, yt); break;
#if CONV_DOT_MAX_COUT > 4
        case 5: conv_dot_row(5, q, t, ow0, ow1, buf, ptrs, yt); break;
        case 6: conv_dot_row(6, q, t, ow0, ow1, buf, ptrs, yt); break;
#endif
        default: break;
        }
        if (q->bias || q->code != FL_LINEAR)
            FL_FN(rows_bias_act_range)(ow0, ow1, q->cout, yt, q->cout, q->bias, q->code, q->alpha,
                                       yt, q->cout);
    }
}

int FL_FN(conv2d_dot)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t pt, int64_t pl,
                      int64_t ho, int64_t wo, int64_t cout, const float *pw, const float *bias,
                      int code, float alpha, float *y) {
    if (cout < 1 || cout > CONV_DOT_MAX_COUT || cout > FL_PANEL) return -2;
    int64_t run = kw * c, kv = (run + FL_VW - 1) / FL_VW * FL_VW;
    /* the packed weights (k, 32 columns: gemm.h) as each channel's window rows */
    float *wr = fl_buf_floats(&FL_FN(conv_call_buf), (size_t)(cout * kh * kv));
    if (!wr) return -1;
    for (int64_t o = 0; o < cout; ++o)
        for (int64_t i = 0; i < kh; ++i) {
            float *d = wr + (o * kh + i) * kv;
            for (int64_t r = 0; r < run; ++r) d[r] = pw[(i * run + r) * FL_PANEL + o];
            for (int64_t r = run; r < kv; ++r) d[r] = 0.0f;
        }
    /* whole output rows, or where they are fewer than CONV_DOT_UNITS_PER_THREAD a thread (a
     * 1-D filter is one row) spans of them of at least CONV_DOT_MIN_SPAN columns */
    int64_t rows = n * ho, want = CONV_DOT_UNITS_PER_THREAD * fl_pool_get_threads(), span = wo;
    if (rows < want)
        span = FL_MIN(wo, FL_MAX(CONV_DOT_MIN_SPAN, (wo * rows + want - 1) / want));
    int64_t spans = (wo + span - 1) / span;
    conv_dot_ctx q = {x, wr, bias, y, h, w, c, kh, sh, sw, dh, pt, pl, ho, wo, cout, run, kv,
                      span, spans, code, 0, alpha};
    int64_t unit_taps = FL_MAX(1, span * cout * kh * run);
    fl_parallel(rows * spans, FL_MAX(1, CONV_MIN_SHARE_TAPS / unit_taps), conv_dot_task, &q);
    return q.status;
}
