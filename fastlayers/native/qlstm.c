/* The quantized LSTM time loop (qlstm.h): each step's recurrent product on qgemm.c's tiles,
 * where it is large enough shared among the pool's threads by units of the hidden state, each
 * share computing its units' gates too. Compiled once per ISA (kernels.inc). */

#include "qgemm_internal.h"
#include "qlstm.h"
#include "quantize.h"
#include "recurrent_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

static __thread fl_buf qlstm_buf;

/* Fewest multiply-adds of one share of a step's recurrent product (qgemm.c's share). */
#define QLSTM_MIN_SHARE_MACS (1 << 17)
/* Fewest gate units (batch x hidden) of a step whose gates are shared with its product: with
 * fewer the gates take a few microseconds and four column blocks per share cost more than
 * they save (docs/design.md, "Integer products and quantized models"). */
#define QLSTM_SHARED_GATES_MIN 4096

FL_QUANTIZE_KERNELS(FL_DECLARE)

/* a's rows (batch, hidden) = the uint8 quantization a_u of h (batch, hidden), as
 * DynamicQuantizeLinear over the whole batch (float32 arithmetic, round half to even: the
 * vector kernels of quantize.c), their sums and zero point (qgemm.c's prepared operand; without
 * VNNI its int16 rows widened from the bytes at `bytes`); returns the scale. */
static float qlstm_quantize(const float *h, int64_t batch, int64_t hidden, void *rows, int vnni,
                            int amx, int32_t *ra, int32_t *za, uint8_t *bytes) {
    float mm[2] = {0.0f, 0.0f};
    FL_FN(min_max)(batch * hidden, h, mm);
    float lo = mm[0], hi = mm[1];
    float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float zp = nearbyintf(FL_MIN(FL_MAX(0.0f - lo / scale, 0.0f), 255.0f));
    int64_t width = qgemm_row_width(hidden, amx);
    for (int64_t r = 0; r < batch; ++r) {
        uint8_t *q = vnni ? (uint8_t *)rows + r * width : bytes;
        FL_FN(quantize)(hidden, h + r * hidden, scale, zp, 0.0f, 255.0f, q, 0);
        int32_t sum = 0;
        for (int64_t j = 0; j < hidden; ++j) sum += q[j];
        if (!vnni)
            for (int64_t j = 0; j < hidden; ++j) qgemm_put(rows, vnni, r * width + j, q[j]);
        qgemm_put_fill(rows, vnni, r * width + hidden, 0, width - hidden);
        ra[r] = sum;
        za[r] = (int32_t)zp;
    }
    return scale;
}

/* float(acc[0:cnt]) as a vector (zeros after). */
FL_INLINE fl_vf qlstm_sums(const int32_t *acc, int64_t cnt) {
    if (cnt >= FL_VW) return __builtin_convertvector(*(const fl_vi_u *)acc, fl_vf);
    int32_t t[FL_VW] = {0};
    memcpy(t, acc, (size_t)cnt * sizeof(int32_t));
    return __builtin_convertvector(*(const fl_vi_u *)t, fl_vf);
}

/* One row's gate inputs at columns col:col+cnt: x W + float(acc) (h_scale r_scale), the
 * product rounded before the sum. */
FL_INLINE fl_vf qlstm_z(const float *xp, const int32_t *ar, float h_scale, const float *r_scale,
                        int64_t col, int64_t cnt) {
    fl_vf s = fl_set1(h_scale) * rnn_load(r_scale + col, cnt);
    return rnn_load(xp + col, cnt) + fl_rounded(qlstm_sums(ar + col, cnt) * s);
}

/* Units j0:j1 of one row's step (xp its input projections, ar its sums, hr and cr its states),
 * FL_VW units at a time, the tail on zero-padded copies, in onnxruntime's order and
 * arithmetic: z (+ P c) + b, its sigmoid and tanh (rows.c), products rounded before their
 * sums. */
static void qlstm_gates(const float *xp, const int32_t *ar, float h_scale, const float *r_scale,
                        const float *bias, const float *peep, float clip, int input_forget,
                        int64_t hidden, int64_t j0, int64_t j1, float *hr, float *cr) {
    for (int64_t j = j0; j < j1; j += FL_VW) {
        int64_t cnt = FL_MIN(FL_VW, j1 - j);
        fl_vf zi = qlstm_z(xp, ar, h_scale, r_scale, j, cnt);
        fl_vf zo = qlstm_z(xp, ar, h_scale, r_scale, hidden + j, cnt);
        fl_vf zf = qlstm_z(xp, ar, h_scale, r_scale, 2 * hidden + j, cnt);
        fl_vf zc = qlstm_z(xp, ar, h_scale, r_scale, 3 * hidden + j, cnt);
        fl_vf c_prev = rnn_load(cr + j, cnt);
        if (peep) {
            zi += fl_rounded(rnn_load(peep + j, cnt) * c_prev);
            zf += fl_rounded(rnn_load(peep + 2 * hidden + j, cnt) * c_prev);
        }
        if (bias) {
            zi += rnn_load(bias + j, cnt);
            zf += rnn_load(bias + 2 * hidden + j, cnt);
            zc += rnn_load(bias + 3 * hidden + j, cnt);
        }
        if (clip > 0) {
            zi = fl_vmin(fl_vmax(zi, fl_set1(-clip)), fl_set1(clip));
            zf = fl_vmin(fl_vmax(zf, fl_set1(-clip)), fl_set1(clip));
            zc = fl_vmin(fl_vmax(zc, fl_set1(-clip)), fl_set1(clip));
        }
        fl_vf gi = rows_vsigmoid_onnx(zi);
        fl_vf gf = input_forget ? 1.0f - gi : rows_vsigmoid_onnx(zf);
        fl_vf c_new = fl_rounded(c_prev * gf) + fl_rounded(gi * rows_vtanh_onnx(zc));
        if (peep) zo += fl_rounded(rnn_load(peep + hidden + j, cnt) * c_new);
        if (bias) zo += rnn_load(bias + hidden + j, cnt);
        if (clip > 0) zo = fl_vmin(fl_vmax(zo, fl_set1(-clip)), fl_set1(clip));
        rnn_store(cr + j, c_new, cnt);
        rnn_store(hr + j, rows_vtanh_onnx(c_new) * rows_vsigmoid_onnx(zo), cnt);
    }
}

/* Units of hidden state per share of a step shared among the threads: four panels of each
 * gate block's columns, a whole tile of the product. */
#define QLSTM_SHARE_UNITS (4 * FL_QPANEL)

/* One step on the pool's threads (qlstm_step_task): each share of units computes its columns
 * of the four gate blocks' products and then its units' gates, so the gates are shared too.
 * A thread takes its shares first to last, or last to first where `backward` (every other
 * step): R read in the opposite order to the step before starts with the columns that step
 * read last, still in the core's L2 where R is larger than it. */
typedef struct {
    const qgemm_a *a;
    int64_t batch, hidden;
    int backward;
    const int8_t *r_packed;
    int32_t *acc;
    const float *xp, *r_scale, *bias, *peep;
    float h_scale, clip;
    int input_forget;
    float *h, *c;
} qlstm_step_ctx;

static void qlstm_step_task(void *p, int64_t u0, int64_t u1) {
    const qlstm_step_ctx *x = (const qlstm_step_ctx *)p;
    static const fl_qout sums = {FL_QOUT_INT32, 0, 0, 0, 0};
    int64_t hidden = x->hidden, g = 4 * hidden;
    FL_FN(qgemm_tiles)(x->a, 1);
    for (int64_t i = 0; i < u1 - u0; ++i) {
        int64_t u = x->backward ? u1 - 1 - i : u0 + i;
        int64_t j0 = u * QLSTM_SHARE_UNITS, j1 = FL_MIN(j0 + QLSTM_SHARE_UNITS, hidden);
        for (int64_t b = 0; b < 4; ++b)
            FL_FN(qgemm_panels)(x->a, x->batch, g, hidden, x->r_packed, (b * hidden + j0) / FL_QPANEL,
                                (b * hidden + j1) / FL_QPANEL, &sums, x->acc, g);
        for (int64_t r = 0; r < x->batch; ++r)   /* the share's gates, its sums still in L1 */
            qlstm_gates(x->xp + r * g, x->acc + r * g, x->h_scale, x->r_scale, x->bias, x->peep,
                        x->clip, x->input_forget, hidden, j0, j1, x->h + r * hidden,
                        x->c + r * hidden);
    }
    FL_FN(qgemm_tiles)(x->a, 0);
}

int FL_FN(qlstm)(int64_t steps, int64_t batch, int64_t hidden, const float *x_proj, int reverse,
                 const int8_t *r_packed, const float *r_scale, const float *bias,
                 const float *peep, float clip, int input_forget, float *h, float *c, float *y,
                 int64_t y_step) {
    int64_t g = 4 * hidden;
    int vnni = qgemm_vnni(), amx = qgemm_amx(batch, vnni);
    size_t rows_bytes = qgemm_rows_bytes(batch, hidden, vnni, amx);
    char *buf = (char *)fl_buf_grow(&qlstm_buf, rows_bytes + (size_t)(2 * batch) * sizeof(int32_t) +
                                                  (size_t)(batch * g) * sizeof(int32_t) +
                                                  (size_t)hidden);
    if (!buf) return -1;
    int32_t *ra = (int32_t *)(buf + rows_bytes), *za = ra + batch;
    int32_t *acc = za + batch;
    uint8_t *bytes = (uint8_t *)(acc + batch * g);   /* one row's bytes before they are widened */
    qgemm_a prepared = {buf, qgemm_row_width(hidden, amx), ra, za, (hidden + 3) / 4, vnni, amx};
    /* AMX's rows past the batch, read by the last tile */
    qgemm_put_fill(buf, vnni, batch * prepared.lda, 0, (qgemm_row_count(batch, amx) - batch) * prepared.lda);
    /* a step's product large enough to share: shares of units, each with its gates (the same
     * sums and bits as the product shared alone and the gates on this thread) */
    int64_t units = (hidden + QLSTM_SHARE_UNITS - 1) / QLSTM_SHARE_UNITS;
    int64_t grain = FL_MAX(1, QLSTM_MIN_SHARE_MACS / (batch * QLSTM_SHARE_UNITS * g));
    int fused = hidden % FL_QPANEL == 0, spread = fl_parallel_chunks(units, grain) > 1;
    int shared = fused && spread && batch * hidden >= QLSTM_SHARED_GATES_MIN;
    /* nothing to share (one thread, or inside another run's task): the same shares one after
     * another, each share's gates while its sums are still in L1 */
    int serial = fused && !spread;
    for (int64_t s = 0; s < steps; ++s) {
        int64_t t = reverse ? steps - 1 - s : s;
        float h_scale = qlstm_quantize(h, batch, hidden, buf, vnni, amx, ra, za, bytes);
        const float *xp = x_proj + t * batch * g;
        if (shared || serial) {
            qlstm_step_ctx x = {&prepared, batch, hidden, (int)(s & 1), r_packed, acc, xp, r_scale,
                                bias, peep, h_scale, clip, input_forget, h, c};
            if (shared) fl_parallel(units, grain, qlstm_step_task, &x);
            else qlstm_step_task(&x, 0, units);
        } else {
            static const fl_qout sums = {FL_QOUT_INT32, 0, 0, 0, 0};
            FL_FN(qgemm_run)(&prepared, batch, g, hidden, r_packed, &sums, acc, g);
            for (int64_t r = 0; r < batch; ++r)
                qlstm_gates(xp + r * g, acc + r * g, h_scale, r_scale, bias, peep, clip,
                            input_forget, hidden, 0, hidden, h + r * hidden, c + r * hidden);
        }
        if (y) memcpy(y + t * y_step, h, (size_t)(batch * hidden) * sizeof(float));
    }
    return 0;
}

/* Multiply-adds of one step's recurrent product (batch x hidden x 4 hidden) from which the
 * runs go one after another, each step's product shared among the threads: below, a step's
 * product is a few microseconds and handing it off at every step costs more than one run per
 * thread. */
#define QLSTM_SHARED_STEP_MACS (INT64_C(1) << 22)

typedef struct {
    const fl_qlstm_run *runs;
    int status;
} qlstm_runs_ctx;

static void qlstm_runs_task(void *p, int64_t r0, int64_t r1) {
    qlstm_runs_ctx *x = (qlstm_runs_ctx *)p;
    for (int64_t i = r0; i < r1; ++i) {
        const fl_qlstm_run *r = x->runs + i;
        int st = FL_FN(qlstm)(r->steps, r->batch, r->hidden, r->x_proj, r->reverse, r->r_packed,
                              r->r_scale, r->bias, r->peep, r->clip, r->input_forget, r->h, r->c,
                              r->y, r->y_step);
        if (st) x->status = st;
    }
}

int FL_FN(qlstm_runs)(int64_t n, const fl_qlstm_run *runs) {
    qlstm_runs_ctx x = {runs, 0};
    int64_t macs = 0;
    for (int64_t i = 0; i < n; ++i)
        macs = FL_MAX(macs, runs[i].batch * runs[i].hidden * 4 * runs[i].hidden);
    if (n > 1 && macs < QLSTM_SHARED_STEP_MACS) fl_parallel(n, 1, qlstm_runs_task, &x);
    else qlstm_runs_task(&x, 0, n);
    return x.status;
}
