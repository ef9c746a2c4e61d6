/* Row kernels: bias + activation, softmax / log-softmax over rows, layer / RMS normalization
 * and per-channel scale + shift (rows.h). Compiled once per ISA (kernels.inc).
 *
 * Elementwise activations run FL_VW floats at a time; a row's tail goes through the same
 * vector code on a partial vector (fl_load_n), so every value takes one formula. */

#include "rows_internal.h"
#include "threadpool.h"

/* x[0:n] = f(x[0:n]) in place for an elementwise code. */
/* Whether o lies less than 256 bytes after x modulo 4 KiB (o not x): a forward loop's loads of
 * x would then falsely wait for its earlier stores to o (4K aliasing: 1.1x the time of a
 * 64 x 1024 sigmoid; a memmove of the row followed by an in-place pass had taken 2.5x), so
 * such rows run from their end. */
FL_INLINE int rows_aliased(const float *x, const float *o) {
    return o != x && (((uintptr_t)o - (uintptr_t)x) & 4095) < 256;
}

/* o[j] = f(x[j] + b[j % period]) for one constant code (b NULL: no bias; period 0: n, else a
 * multiple of FL_VW; o may be x): one pass, vector by vector, from the end where
 * rows_aliased. */
FL_INLINE void rows_act_code(const float *x, const float *b, int64_t period, float *o, int64_t n,
                             const int code, float alpha) {
    int64_t nv = n / FL_VW * FL_VW;
    if (nv < n) {                                /* the tail, its missing lanes zeros */
        fl_vf v = fl_load_n(x + nv, n - nv);
        if (b) v += fl_load_n(b + (period ? nv % period : nv), n - nv);
        fl_store_n(o + nv, rows_vact(v, code, alpha), n - nv);
    }
    if (rows_aliased(x, o)) {
        for (int64_t j = nv - FL_VW; j >= 0; j -= FL_VW) {
            fl_vf v = fl_load(x + j);
            if (b) v += fl_load(b + (period ? j % period : j));
            fl_store(o + j, rows_vact(v, code, alpha));
        }
        return;
    }
    for (int64_t j = 0, jb = 0; j < nv; j += FL_VW) {
        fl_vf v = fl_load(x + j);
        if (b) {
            v += fl_load(b + jb);
            jb += FL_VW;
            if (jb == period) jb = 0;
        }
        fl_store(o + j, rows_vact(v, code, alpha));
    }
}

/* o[0:n] = f(x[0:n] + b[j % period]) for an elementwise code (linear included; period as
 * rows_act_code's): one loop per code, so the code's branch is taken once per row rather than
 * per vector. */
static void rows_act_period(const float *x, const float *b, int64_t period, float *o, int64_t n,
                            int code, float alpha) {
    switch (code) {
#define ROWS_CASE(c) case c: rows_act_code(x, b, period, o, n, c, alpha); break;
        ROWS_CASE(FL_LINEAR) ROWS_CASE(FL_RELU) ROWS_CASE(FL_RELU6) ROWS_CASE(FL_LEAKY_RELU)
        ROWS_CASE(FL_HARD_SIGMOID) ROWS_CASE(FL_SOFTSIGN) ROWS_CASE(FL_SIGMOID) ROWS_CASE(FL_SILU)
        ROWS_CASE(FL_GELU) ROWS_CASE(FL_GELU_TANH) ROWS_CASE(FL_EXPONENTIAL) ROWS_CASE(FL_TANH)
        ROWS_CASE(FL_HARD_SILU) ROWS_CASE(FL_ONNX_SIGMOID) ROWS_CASE(FL_ONNX_SILU)
        ROWS_CASE(FL_ONNX_TANH)
#undef ROWS_CASE
    default: break;
    }
}

/* o[0:n] = f(x[0:n] + b) for an elementwise code (linear included). */
static void rows_act_row(const float *x, const float *b, float *o, int64_t n, int code,
                         float alpha) {
    rows_act_period(x, b, 0, o, n, code, alpha);
}

void FL_FN(rows_add_act_row)(const float *x, const float *b, float *o, int64_t n, int code,
                             float alpha) {
    rows_act_row(x, b, o, n, code, alpha);
}

/* o[0:n] = softmax(x[0:n]) or log_softmax (o may be x): the maximum over four running
 * vectors (one chain waits on each max's latency; the same maximum), then exp(x - max) with
 * the polynomial of fl_vexp on arguments known not to overflow (fl_vexp_bounded: the same
 * values) into o, summed in one running vector (the order that gives onnxruntime's sums: two
 * made int8 models whose softmax feeds a dynamic quantization differ from onnxruntime's
 * outputs), then the scaling in place. */
static void rows_softmax(const float *x, float *o, int64_t n, int log) {
    fl_vf m0 = fl_set1(-__builtin_inff()), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 4 * FL_VW <= n; j += 4 * FL_VW) {
        m0 = fl_vmax(fl_load(x + j), m0);
        m1 = fl_vmax(fl_load(x + j + FL_VW), m1);
        m2 = fl_vmax(fl_load(x + j + 2 * FL_VW), m2);
        m3 = fl_vmax(fl_load(x + j + 3 * FL_VW), m3);
    }
    for (; j + FL_VW <= n; j += FL_VW) m0 = fl_vmax(fl_load(x + j), m0);
    float m = fl_hmax(fl_vmax(fl_vmax(m0, m1), fl_vmax(m2, m3)));
    for (; j < n; ++j) m = x[j] > m ? x[j] : m;
    /* a NaN the maximum skipped still reaches every output through the sum */
    fl_vf s0 = fl_set1(0.0f);
    float s = 0.0f;
    fl_vf vm = fl_set1(m);
    j = 0;
    if (log) {
        for (; j + FL_VW <= n; j += FL_VW) {
            fl_vf v = fl_load(x + j) - vm;
            fl_store(o + j, v);
            s0 += fl_vexp_bounded(v);
        }
        for (; j < n; ++j) {
            o[j] = x[j] - m;
            s += fl_exp1(o[j]);
        }
        s += fl_hsum(s0);
        fl_vf ls = fl_set1(logf(s));
        for (j = 0; j + FL_VW <= n; j += FL_VW) fl_store(o + j, fl_load(o + j) - ls);
        for (; j < n; ++j) o[j] -= ls[0];
        return;
    }
    for (; j + FL_VW <= n; j += FL_VW) {
        fl_vf e = fl_vexp_bounded(fl_load(x + j) - vm);
        fl_store(o + j, e);
        s0 += e;
    }
    for (; j < n; ++j) {
        o[j] = fl_exp1(x[j] - m);
        s += o[j];
    }
    s += fl_hsum(s0);
    fl_vf inv = fl_set1(1.0f / s);
    for (j = 0; j + FL_VW <= n; j += FL_VW) fl_store(o + j, fl_load(o + j) * inv);
    for (; j < n; ++j) o[j] *= inv[0];
}

/* Longest rows that rows_bias_act_range runs as one flat pass (longer ones spend little on
 * their tails), and the most rows in the period of their bias (whole vectors of FL_VW floats:
 * at most FL_VW rows), which lies in a buffer on the stack (16 KiB on the AVX-512 path). */
#define ROWS_FLAT_MAX_N 256
#define ROWS_FLAT_PERIOD_ROWS FL_VW

/* out[i, :] = f(x[i, :] + bias) for rows [r0, r1) of an (m, n) block. Short contiguous rows
 * (ldx = ldo = n <= ROWS_FLAT_MAX_N) run as one flat pass, the bias repeating with a period of
 * the fewest whole rows that fill whole vectors (one row where n is a multiple of FL_VW),
 * rather than row by row, where each short row paid its call, its code's branch and its tail
 * (a convolution's 24 channels: 2560 rows spent 3x the flat pass's time; for rows of whole
 * vectors, docs/design.md, "Algorithms", few input channels from NCHW). Each value takes the
 * same formula either way. */
void FL_FN(rows_bias_act_range)(int64_t r0, int64_t r1, int64_t n, const float *x, int64_t ldx,
                                const float *bias, int code, float alpha, float *out,
                                int64_t ldo) {
    if (code != FL_SOFTMAX && code != FL_LOG_SOFTMAX && (bias || out != x || code != FL_LINEAR) &&
        n <= ROWS_FLAT_MAX_N && ldx == n && ldo == n && r1 - r0 > 1) {
        int64_t per = 1;                               /* rows per whole number of vectors */
        while (per * n % FL_VW) ++per;
        float tiled[ROWS_FLAT_PERIOD_ROWS * ROWS_FLAT_MAX_N];
        if (bias && per > 1)
            for (int64_t r = 0; r < per; ++r) memcpy(tiled + r * n, bias, (size_t)n * sizeof(float));
        rows_act_period(x + r0 * ldx, per > 1 ? (bias ? tiled : 0) : bias, per * n, out + r0 * ldo,
                        (r1 - r0) * n, code, alpha);
        return;
    }
    for (int64_t i = r0; i < r1; ++i) {
        const float *xr = x + i * ldx;
        float *o = out + i * ldo;
        if (code == FL_SOFTMAX || code == FL_LOG_SOFTMAX) {
            if (bias) rows_act_row(xr, bias, o, n, FL_LINEAR, 0.0f);
            rows_softmax(bias ? o : xr, o, n, code == FL_LOG_SOFTMAX);
        } else if (bias || o != xr || code != FL_LINEAR) {
            rows_act_row(xr, bias, o, n, code, alpha);
        }
    }
}

typedef struct {
    int64_t n, ldx, ldo;
    const float *x, *bias;
    float *out;
    int code;
    float alpha;
} rows_bias_act_ctx;

static void rows_bias_act_task(void *p, int64_t r0, int64_t r1) {
    rows_bias_act_ctx *c = (rows_bias_act_ctx *)p;
    FL_FN(rows_bias_act_range)(r0, r1, c->n, c->x, c->ldx, c->bias, c->code, c->alpha, c->out,
                               c->ldo);
}

/* Fewest values per thread's share of a row kernel: a hand-off costs a few microseconds. */
#define ROWS_MIN_SHARE 16384

int FL_FN(bias_act)(int64_t m, int64_t n, const float *x, int64_t ldx, const float *bias,
                    int code, float alpha, float *out, int64_t ldo) {
    if (m <= 0 || n <= 0) return 0;
    if (code < 0 || code >= FL_N_ACTIVATIONS) return -2;
    rows_bias_act_ctx c = {n, ldx, ldo, x, bias, out, code, alpha};
    int heavy = code != FL_LINEAR && code != FL_RELU && code != FL_RELU6 && code != FL_LEAKY_RELU;
    int64_t grain = FL_MAX(1, ROWS_MIN_SHARE / (heavy ? 4 : 1) / n);
    fl_parallel_values(m, grain, m * n * (heavy ? 4 : 1), rows_bias_act_task, &c);
    return 0;
}

typedef struct {
    const float *a, *b;
    float *out;
    int code;
    float alpha;
} rows_add_act_ctx;

/* Blocks [k0, k1) of ROWS_MIN_SHARE floats of out = f(a + b). */
static void rows_add_act_task(void *p, int64_t k0, int64_t k1) {
    rows_add_act_ctx *c = (rows_add_act_ctx *)p;
    int64_t begin = k0 * ROWS_MIN_SHARE, end = k1 * ROWS_MIN_SHARE;
    rows_act_row(c->a + begin, c->b + begin, c->out + begin, end - begin, c->code, c->alpha);
}

/* out = f(a + b), elementwise (a residual add and its activation in one pass). */
int FL_FN(add_act)(int64_t n, const float *a, const float *b, int code, float alpha,
                   float *out) {
    if (n <= 0) return 0;
    if (code < 0 || code >= FL_N_ACTIVATIONS || code == FL_SOFTMAX || code == FL_LOG_SOFTMAX)
        return -2;
    rows_add_act_ctx c = {a, b, out, code, alpha};
    int64_t blocks = n / ROWS_MIN_SHARE;
    fl_parallel_values(blocks, 1, n, rows_add_act_task, &c);
    int64_t done = blocks * ROWS_MIN_SHARE;
    if (done < n) rows_act_row(a + done, b + done, out + done, n - done, code, alpha);
    return 0;
}

typedef struct {
    const float *a, *b;
    float *out;
    int64_t nj, n;
    int code;
    float alpha;
} rows_outer_ctx;

/* Output rows [r0, r1) of f(a[i] + b[j]), row r = i nj + j. */
static void rows_outer_task(void *p, int64_t r0, int64_t r1) {
    rows_outer_ctx *c = (rows_outer_ctx *)p;
    for (int64_t r = r0; r < r1; ++r)
        rows_act_row(c->a + r / c->nj * c->n, c->b + r % c->nj * c->n, c->out + r * c->n, c->n, c->code,
                     c->alpha);
}

int FL_FN(outer_add_act)(int64_t ni, int64_t nj, int64_t n, const float *a, const float *b, int code,
                         float alpha, float *out) {
    if (ni <= 0 || nj <= 0 || n <= 0) return 0;
    if (code < 0 || code >= FL_N_ACTIVATIONS || code == FL_SOFTMAX || code == FL_LOG_SOFTMAX)
        return -2;
    rows_outer_ctx c = {a, b, out, nj, n, code, alpha};
    fl_parallel_values(ni * nj, FL_MAX(1, ROWS_MIN_SHARE / n), ni * nj * n, rows_outer_task, &c);
    return 0;
}

/* FL_VW / 2 floats (unaligned) and the doubles they widen to: float64 statistics in vectors of
 * the register width (a vector of FL_VW doubles, twice that width, was kept on the stack by GCC
 * on AVX2). */
typedef float rows_vh __attribute__((vector_size(FL_VW * 2), aligned(4), may_alias));
typedef double fl_vd __attribute__((vector_size(FL_VW * 4)));
#define ROWS_VH (FL_VW / 2)

FL_INLINE fl_vd rows_load_vd(const float *p) {
    return __builtin_convertvector(*(const rows_vh *)p, fl_vd);
}

/* Row i of the layer norm: statistics in float64 lanes. */
void FL_FN(rows_layer_norm_row)(int64_t n, const float *xr, const float *gamma,
                                const float *beta, float eps, int rms, float *o) {
    double mean = 0.0;
    int64_t j;
    if (!rms) {
        fl_vd a[4] = {{0}};
        double s = 0.0;
        for (j = 0; j + 2 * FL_VW <= n; j += 2 * FL_VW)
            for (int u = 0; u < 4; ++u) a[u] += rows_load_vd(xr + j + u * ROWS_VH);
        for (; j + ROWS_VH <= n; j += ROWS_VH) a[0] += rows_load_vd(xr + j);
        for (; j < n; ++j) s += xr[j];
        a[0] += a[1] + a[2] + a[3];
        for (int l = 0; l < ROWS_VH; ++l) s += a[0][l];
        mean = s / (double)n;
    }
    /* squared deviations from the mean in float32 lanes, flushed into a double every 64 vectors
     * (a lane's float sum then holds at most 16 terms per flush at the widest vector: relative
     * error < 1e-6), the float64 sum across flushes */
    double var = 0.0;
    float m32 = (float)mean;
    j = 0;
    while (j + FL_VW <= n) {
        fl_vf q0 = fl_set1(0.0f), q1 = q0, q2 = q0, q3 = q0;
        int64_t stop = FL_MIN(n, j + 64 * FL_VW);
        for (; j + 4 * FL_VW <= stop; j += 4 * FL_VW) {
            fl_vf d0 = fl_load(xr + j) - m32, d1 = fl_load(xr + j + FL_VW) - m32;
            fl_vf d2 = fl_load(xr + j + 2 * FL_VW) - m32, d3 = fl_load(xr + j + 3 * FL_VW) - m32;
            q0 += d0 * d0;
            q1 += d1 * d1;
            q2 += d2 * d2;
            q3 += d3 * d3;
        }
        for (; j + FL_VW <= stop; j += FL_VW) {
            fl_vf d = fl_load(xr + j) - m32;
            q0 += d * d;
        }
        var += (double)fl_hsum((q0 + q1) + (q2 + q3));
    }
    for (; j < n; ++j) {
        double d = (double)(xr[j] - m32);
        var += d * d;
    }
    /* the float mean's offset from the exact one: sum (x - m32)^2 = sum (x - mean)^2 +
     * n (mean - m32)^2 */
    var -= (double)n * (mean - (double)m32) * (mean - (double)m32);
    if (var < 0.0) var = 0.0;
    var /= (double)n;
    float inv = (float)(1.0 / sqrt(var + (double)eps));
    int64_t nv = n / FL_VW * FL_VW;
    for (j = 0; j < nv; j += FL_VW) {
        fl_vf v = (fl_load(xr + j) - m32) * inv;
        if (gamma) v *= fl_load(gamma + j);
        if (beta) v += fl_load(beta + j);
        fl_store(o + j, v);
    }
    for (j = nv; j < n; ++j) {
        float v = (xr[j] - m32) * inv;
        if (gamma) v *= gamma[j];
        if (beta) v += beta[j];
        o[j] = v;
    }
}

typedef struct {
    int64_t n;
    const float *x, *gamma, *beta;
    float eps;
    int rms;
    float *out;
} rows_norm_ctx;

static void rows_norm_task(void *p, int64_t r0, int64_t r1) {
    rows_norm_ctx *c = (rows_norm_ctx *)p;
    for (int64_t i = r0; i < r1; ++i)
        FL_FN(rows_layer_norm_row)(c->n, c->x + i * c->n, c->gamma, c->beta, c->eps, c->rms,
                                   c->out + i * c->n);
}

int FL_FN(layer_norm)(int64_t m, int64_t n, const float *x, const float *gamma,
                      const float *beta, float eps, int rms, float *out) {
    if (m <= 0 || n <= 0) return 0;
    rows_norm_ctx c = {n, x, gamma, beta, eps, rms, out};
    fl_parallel_values(m, FL_MAX(1, ROWS_MIN_SHARE / 4 / n), 4 * m * n, rows_norm_task, &c);
    return 0;
}

typedef struct {
    int64_t n;
    const float *x, *scale, *shift;
    float *out;
} rows_scale_ctx;

static void rows_scale_task(void *p, int64_t r0, int64_t r1) {
    rows_scale_ctx *c = (rows_scale_ctx *)p;
    for (int64_t i = r0; i < r1; ++i) {
        const float *xr = c->x + i * c->n;
        float *o = c->out + i * c->n;
        for (int64_t j = 0; j < c->n; ++j) o[j] = xr[j] * c->scale[j] + c->shift[j];
    }
}

int FL_FN(scale_shift)(int64_t m, int64_t n, const float *x, const float *scale,
                       const float *shift, float *out) {
    if (m <= 0 || n <= 0) return 0;
    rows_scale_ctx c = {n, x, scale, shift, out};
    fl_parallel_values(m, FL_MAX(1, ROWS_MIN_SHARE / n), m * n, rows_scale_task, &c);
    return 0;
}

typedef struct {
    int64_t channels, plane;
    const float *x, *scale, *shift;
    float *out;
} planes_scale_ctx;

/* Planes [p0, p1): each one channel's scale and shift over its values. */
static void planes_scale_task(void *arg, int64_t p0, int64_t p1) {
    planes_scale_ctx *c = (planes_scale_ctx *)arg;
    for (int64_t p = p0; p < p1; ++p) {
        const float *xp = c->x + p * c->plane;
        float *o = c->out + p * c->plane;
        float s = c->scale[p % c->channels], t = c->shift[p % c->channels];
        for (int64_t k = 0; k < c->plane; ++k) o[k] = xp[k] * s + t;
    }
}

int FL_FN(scale_shift_planes)(int64_t planes, int64_t channels, int64_t plane, const float *x,
                              const float *scale, const float *shift, float *out) {
    if (planes <= 0 || plane <= 0) return 0;
    if (channels <= 0) return -2;
    planes_scale_ctx c = {channels, plane, x, scale, shift, out};
    fl_parallel_values(planes, FL_MAX(1, ROWS_MIN_SHARE / plane), planes * plane,
                       planes_scale_task, &c);
    return 0;
}
