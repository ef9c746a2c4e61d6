/* Recurrent time loops (recurrent.h). Compiled once per ISA (kernels.inc).
 *
 * A unit share's step: one product of the state with its packed recurrent weights (a kernel
 * of its own up to 3 rows, else the packed sgemm), then one pass over its gates in vectors of
 * FL_VW: the input projection and biases added, the activations (rows.c), the cell update,
 * masking and the outputs. The input projection x @ w_ig of all steps comes first, per share
 * (its own gate columns, into a time-major buffer), as part of the share's first step; with
 * ids the loop reads the table's rows in place instead; a SimpleRNN or LSTM with
 * RNN_STEP_X_ROWS rows or more and a large projection projects step by step, into the gates
 * (step_x).
 *
 * Unit shares run inside one fl_parallel call and meet after every step (and mid-step where
 * the next product needs all of a vector: the LSTM projection's input, the GRU's r h). Work is
 * cut into units, unit u = share p's step u / phases, phase u % phases; a thread claims a unit
 * by compare-and-swap on the share's counter before running it and keeps the shares it started
 * with (their weights stay in its core's cache). At a meeting a thread takes over the late
 * shares (rnn_meet): a share nobody started at once (a worker asleep or descheduled when the
 * call began, or none: the pool busy with another call runs the task once, on the caller),
 * a share nobody claimed the step of, or whose step still runs, after waiting as long as its
 * own part of the step took; it runs an unclaimed unit itself, or claims the next unit of a
 * running share, whose owner then finds its claim taken. An owner back soon after (within
 * RNN_HANDBACK_NS: a vCPU the host held up, an interrupt) asks for its share and gets it back
 * at the holder's next step; one back later (a time slice lost to another process, which would
 * recur) leaves. So a short absence costs a step or two, a long one delays a call once (the
 * rest of the call runs on the threads that are there), and nothing waits for a thread that
 * is not inside the call. (One fl_parallel call per step measured as fast on an idle machine;
 * on a busy one it waits again each time a thread is descheduled holding a chunk.) Batch
 * shares (row_parts > 1) run the whole sequence each, one chunk of fl_parallel apiece, without
 * meeting.
 */
#include "gemm_internal.h"
#include "recurrent_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define RNN_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RNN_PAUSE() __asm__ __volatile__("yield")
#else
#define RNN_PAUSE() ((void)0)
#endif

/* A thread waits at a meeting as long as its own units of the step took, and at least this
 * many nanoseconds, before it takes over a late share: running it itself then costs at most
 * about twice what waiting for it would have. */
#define RNN_TAKEOVER_MIN_NS 10000
/* A SimpleRNN or LSTM projects its inputs step by step, into the step's gates before the
 * recurrent product adds to them (step_x), rather than for every step first, with this many
 * rows per batch share or more and a projection of all steps, (T, rows, G) floats, of more
 * than RNN_STEP_X_BYTES: such a buffer falls out of the L2 cache and the gate pass waited on
 * it. Fewer rows run the per-step products below the sgemm's rate; with a smaller buffer the
 * one large product of the projection is the faster (docs/design.md, "Figures behind the
 * code's constants"). */
#define RNN_STEP_X_ROWS 8
#define RNN_STEP_X_BYTES (2 << 20)
/* Nanoseconds after which a waiting thread also yields its core (to a descheduled owner). */
#define RNN_YIELD_NS 200000
/* A thread back within this many nanoseconds of the take-over of its share asks for it back
 * (rnn_shares_task): a short absence (a vCPU held up by the host, an interrupt) costs a step or
 * two, not the rest of the call at one thread; an absence of a scheduler time slice (another
 * process busy on the core) would recur, and the share stays with the thread that took it. */
#define RNN_HANDBACK_NS 200000

typedef struct {
    _Alignas(64) _Atomic int64_t v;
} rnn_counter;

/* A share's hand-back (rnn_shares_task): when another thread last took it over, and whether
 * the thread it was taken from is back and asks for it. */
typedef struct {
    _Alignas(64) _Atomic int64_t taken_ns;
    _Atomic int want;
} rnn_back;

typedef struct {
    int64_t u0, n, q0, nq;                 /* units u0:u0+n, projection outputs q0:q0+nq */
    const float *pw_ig, *pw_hg, *pw_hn, *pw_hp;
    float *gates;                          /* (rows, gw): the step's recurrent product */
    float *aux;                            /* (rows, aw): GRU candidate / LSTM projection */
    float *xw;                             /* (T, rows, wx) input projection, or NULL (ids) */
    int64_t gw, aw, wx;
} rnn_share;

typedef struct {
    const fl_rnn_args *a;
    int64_t b0, rows, parts, phases, blocks, ldh, ldu;
    float *hbuf;                           /* (2, rows, ldh): the state of even / odd steps */
    float *c, *hfull, *rh, *last;          /* (rows, ldu) x 3, (rows, ldh) */
    const float *bx, *bh;                  /* input and GRU recurrent biases (zeros if none) */
    const float *zeros;                    /* (blocks * units) zeros */
    int step_x;                            /* input projection per step, into the gates */
    rnn_share *sh;
    rnn_counter *claim, *done;             /* per share: units claimed; units done */
    rnn_back *back;                        /* per share */
    _Atomic int status;
} rnn_job;

FL_INLINE int64_t rnn_lines(int64_t n) { return (n + 15) & ~(int64_t)15; }

#define RNN_PV (FL_PANEL / FL_VW)                /* vectors per packed row */
/* Most rows of a product the small kernel takes (rnn_small): 12 accumulators at 3 rows and
 * 4 vectors per row; the portable path's 8 vectors per row fit 16 registers at one row. */
#define RNN_SMALL_M (RNN_PV <= 4 ? 3 : 1)

/* c (m, n) = a (m, k) @ b, b (k, n) packed (gemm.h), for m (1 to RNN_SMALL_M, a constant at
 * each call) rows: per panel, ku rows of b at a time into accumulators of their own, so that
 * m ku vectors-per-row FMA chains (8 or more) run at once (one row's chain alone is
 * latency-bound, and the sgemm's tiles hold 2 vectors per row). */
FL_INLINE void rnn_small(const int m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *pb, float *c, int64_t ldc) {
    const int ku = m * RNN_PV >= 8 ? 1 : 8 / (m * RNN_PV);
    for (int64_t jr = 0; jr < n; jr += FL_PANEL) {
        const float *p = pb + jr * k;
        fl_vf acc[RNN_SMALL_M][8][RNN_PV];
#pragma GCC unroll 8
        for (int r = 0; r < m; ++r)
#pragma GCC unroll 8
            for (int u = 0; u < ku; ++u)
#pragma GCC unroll 8
                for (int v = 0; v < RNN_PV; ++v) acc[r][u][v] = fl_set1(0.0f);
        int64_t kk = 0;
        for (; kk + ku <= k; kk += ku, p += ku * FL_PANEL) {
#pragma GCC unroll 8
            for (int u = 0; u < ku; ++u)
#pragma GCC unroll 8
                for (int v = 0; v < RNN_PV; ++v) {
                    fl_vf bv = fl_load(p + u * FL_PANEL + v * FL_VW);
#pragma GCC unroll 8
                    for (int r = 0; r < m; ++r) acc[r][u][v] += fl_set1(a[r * lda + kk + u]) * bv;
                }
        }
        for (; kk < k; ++kk, p += FL_PANEL)
#pragma GCC unroll 8
            for (int v = 0; v < RNN_PV; ++v) {
                fl_vf bv = fl_load(p + v * FL_VW);
#pragma GCC unroll 8
                for (int r = 0; r < m; ++r) acc[r][0][v] += fl_set1(a[r * lda + kk]) * bv;
            }
        int64_t nr = FL_MIN(n - jr, FL_PANEL);
#pragma GCC unroll 8
        for (int r = 0; r < m; ++r) {
            float t[FL_PANEL];
#pragma GCC unroll 8
            for (int v = 0; v < RNN_PV; ++v) {
                fl_vf s = acc[r][0][v];
#pragma GCC unroll 8
                for (int u = 1; u < ku; ++u) s += acc[r][u][v];
                fl_store(t + v * FL_VW, s);
            }
            memcpy(c + r * ldc + jr, t, (size_t)nr * sizeof(float));
        }
    }
}

/* c (m, n) = a (m, k) @ b, b packed: rnn_small up to RNN_SMALL_M rows, else the packed sgemm. */
static int rnn_product(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *pb, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return 0;
    switch (m) {
    case 1: rnn_small(1, n, k, a, lda, pb, c, ldc); return 0;
#if RNN_SMALL_M >= 3
    case 2: rnn_small(2, n, k, a, lda, pb, c, ldc); return 0;
    case 3: rnn_small(3, n, k, a, lda, pb, c, ldc); return 0;
#endif
    default: return FL_FN(sgemm_packed)(m, n, k, a, lda, pb, 0, c, ldc);
    }
}

/* xw (T, rows, wx) = x[b0:b0+rows] (rows, T, I) @ the share's input weights: one product per
 * sample (T rows) or, for a batch larger than the sequence, per step (rows of x T I apart). */
static int rnn_project(const rnn_job *j, const rnn_share *sh) {
    const fl_rnn_args *a = j->a;
    int64_t t_len = a->steps, in = a->inputs, rows = j->rows, wx = sh->wx;
    const float *x = a->x + j->b0 * t_len * in;
    int st = 0;
    if (t_len >= rows) {
        for (int64_t b = 0; b < rows && !st; ++b)
            st = rnn_product(t_len, wx, in, x + b * t_len * in, in, sh->pw_ig, sh->xw + b * wx,
                             rows * wx);
    } else {
        for (int64_t t = 0; t < t_len && !st; ++t)
            st = rnn_product(rows, wx, in, x + t * in, t_len * in, sh->pw_ig,
                             sh->xw + t * rows * wx, wx);
    }
    return st;
}

/* Step ts's input projection of row b in the share's columns (blocks rnn_xstride apart). */
FL_INLINE const float *rnn_xrow(const rnn_job *j, const rnn_share *sh, int64_t ts, int64_t b) {
    const fl_rnn_args *a = j->a;
    if (j->step_x) return j->zeros;                 /* in the gates already */
    if (a->ids)
        return a->table + a->ids[(j->b0 + b) * a->steps + ts] * j->blocks * a->units + sh->u0;
    return sh->xw + (ts * j->rows + b) * sh->wx;
}

FL_INLINE int64_t rnn_xstride(const rnn_job *j, const rnn_share *sh) {
    return j->step_x ? 0 : j->a->ids ? j->a->units : sh->n;
}

/* The share's gates (cols columns) of step ts: cur (rows, ldh) @ its recurrent weights, plus,
 * with step_x, x[:, ts] @ its input weights (a product of the same rows, read in place). */
static int rnn_gate_product(const rnn_job *j, const rnn_share *sh, int64_t ts, int64_t cols,
                            const float *cur) {
    const fl_rnn_args *a = j->a;
    if (!j->step_x)
        return rnn_product(j->rows, cols, a->out, cur, j->ldh, sh->pw_hg, sh->gates, sh->gw);
    int st = FL_FN(sgemm_packed)(j->rows, cols, a->inputs, a->x + (j->b0 * a->steps + ts) *
                                 a->inputs, a->steps * a->inputs, sh->pw_ig, 0, sh->gates, sh->gw);
    return st ? st : FL_FN(sgemm_packed)(j->rows, cols, a->out, cur, j->ldh, sh->pw_hg, 1,
                                         sh->gates, sh->gw);
}

/* With ids: prefetch (into L2) the table rows that step ts reads in the share's columns, before
 * its product: rows picked by id defeat the hardware prefetcher, and the step would stall on
 * each (a folded 5000-word table is 10 MiB). */
static void rnn_prefetch_rows(const rnn_job *j, const rnn_share *sh, int64_t ts) {
    const fl_rnn_args *a = j->a;
    if (!a->ids) return;
    for (int64_t b = 0; b < j->rows; ++b) {
        const float *xr = rnn_xrow(j, sh, ts, b);
        for (int64_t k = 0; k < j->blocks; ++k) {
            const float *blk = xr + k * a->units;
            for (int64_t c = 0; c < sh->n; c += FL_LINE_FLOATS) __builtin_prefetch(blk + c, 0, 2);
            __builtin_prefetch(blk + sh->n - 1, 0, 2);            /* a row off the lines */
        }
    }
}

FL_INLINE int rnn_valid(const rnn_job *j, int64_t b, int64_t ts) {
    const fl_rnn_args *a = j->a;
    return !a->mask || a->mask[(j->b0 + b) * a->steps + ts];
}

/* Row b's outputs at step ts in columns c0:c0+n, h its new state there: the carried output
 * (updated on a valid step) and y[b, ts] (the carried output, or zeros on a masked step with
 * zero_masked). */
static void rnn_emit(const rnn_job *j, int64_t b, int64_t ts, int valid, const float *h,
                     int64_t c0, int64_t n) {
    const fl_rnn_args *a = j->a;
    float *last = j->last + b * j->ldh + c0;
    if (valid) memcpy(last, h, (size_t)n * sizeof(float));
    if (!a->y) return;
    float *yr = a->y + ((j->b0 + b) * a->steps + ts) * a->out + c0;
    if (valid || !a->zero_masked)
        memcpy(yr, last, (size_t)n * sizeof(float));
    else
        memset(yr, 0, (size_t)n * sizeof(float));
}

/* A masked step keeps row b's state in columns c0:c0+n, and outputs as rnn_emit. */
static void rnn_carry(const rnn_job *j, int64_t b, int64_t ts, const float *cur, float *nxt,
                      int64_t c0, int64_t n) {
    memcpy(nxt + b * j->ldh + c0, cur + b * j->ldh + c0, (size_t)n * sizeof(float));
    rnn_emit(j, b, ts, 0, nxt + b * j->ldh + c0, c0, n);
}

/* The gate passes' tanh: the rational fit of Eigen and MLAS, x p(x^2) / q(x^2) on x clamped to
 * [-9, 9] (relative error below 4e-7; NaN stays NaN): one division and 12 multiply-adds where
 * rows_vtanh takes an exp, a division and a polynomial. With rnn_vsigmoid the LSTM gate pass
 * (2 tanh and 3 sigmoids per unit) takes a third less time than with rows_vtanh
 * (docs/design.md, "Figures behind the code's constants"). */
FL_INLINE fl_vf rnn_vtanh(fl_vf x) {
    fl_vf v = fl_vmin(fl_vmax(x, fl_set1(-9.0f)), fl_set1(9.0f)), z = v * v;
    fl_vf p = fl_set1(-2.76076847742355e-16f);
    p = p * z + 2.00018790482477e-13f;
    p = p * z - 8.60467152213735e-11f;
    p = p * z + 5.12229709037114e-08f;
    p = p * z + 1.48572235717979e-05f;
    p = p * z + 6.37261928875436e-04f;
    p = p * z + 4.89352455891786e-03f;
    fl_vf q = fl_set1(1.19825839466702e-06f);
    q = q * z + 1.18534705686654e-04f;
    q = q * z + 2.26843463243900e-03f;
    q = q * z + 4.89352518554385e-03f;
    return v * p / q;
}

/* The gate passes' sigmoid, 1 / (1 + exp(-x)) with exp's argument clamped to [FL_EXP_LO, ln
 * FLT_MAX] (fl_vexp_reduced scaled by 2^n in one factor: n = 128, only at the top, gives inf's
 * bits and the sigmoid 0; no range checks, the clamps keep NaN). */
FL_INLINE fl_vf rnn_vsigmoid(fl_vf x) {
    fl_vi n;
    fl_vf p = fl_vexp_reduced(fl_vmin(fl_vmax(-x, fl_set1(FL_EXP_LO)),
                                      fl_set1(88.72283935546875f)), &n);
    return 1.0f / (1.0f + p * (fl_vf)((n + 127) << 23));
}

/* f(x) for the loops' activation `code` (a constant at each call): rnn_vtanh, rnn_vsigmoid,
 * else rows_vact. */
FL_INLINE fl_vf rnn_vact(fl_vf x, int code) {
    if (code == FL_TANH) return rnn_vtanh(x);
    if (code == FL_SIGMOID) return rnn_vsigmoid(x);
    return rows_vact(x, code, 0.0f);
}

/* SimpleRNN, h = act(xw + b + h w_hh): gates g (n), input xr, bias bx. */
FL_INLINE void rnn_simple_row(int64_t n, const float *g, const float *xr, const float *bx,
                              float *h, int act) {
    for (int64_t j = 0; j < n; j += FL_VW) {
        int64_t m = FL_MIN(FL_VW, n - j);
        fl_vf v = fl_load(g + j) + rnn_load(xr + j, m) + rnn_load(bx + j, m);
        rnn_store(h + j, rnn_vact(v, act), m);
    }
}

/* LSTM, [i f g o] = gates + xw + b (gate blocks n, xs and U apart); c = ract(f) c + ract(i)
 * act(g); h = ract(o) act(c). */
FL_INLINE void rnn_lstm_row(int64_t n, int64_t units, const float *g, const float *xr,
                            int64_t xs, const float *bx, float *c, float *h, int act,
                            int ract) {
    for (int64_t j = 0; j < n; j += FL_VW) {
        int64_t m = FL_MIN(FL_VW, n - j);
        fl_vf i = fl_load(g + j) + rnn_load(xr + j, m) + rnn_load(bx + j, m);
        fl_vf f = fl_load(g + n + j) + rnn_load(xr + xs + j, m) + rnn_load(bx + units + j, m);
        fl_vf gg = fl_load(g + 2 * n + j) + rnn_load(xr + 2 * xs + j, m) +
                   rnn_load(bx + 2 * units + j, m);
        fl_vf o = fl_load(g + 3 * n + j) + rnn_load(xr + 3 * xs + j, m) +
                  rnn_load(bx + 3 * units + j, m);
        fl_vf cn = rnn_vact(f, ract) * rnn_load(c + j, m) +
                   rnn_vact(i, ract) * rnn_vact(gg, act);
        rnn_store(c + j, cn, m);
        rnn_store(h + j, rnn_vact(o, ract) * rnn_vact(cn, act), m);
    }
}

/* GRU with the reset gate after the product: z, r = ract(gates + xw + b_i + b_h); cand =
 * act(xw_h + b_ih + r (gates_h + b_hh)); h = z hc + (1 - z) cand. */
FL_INLINE void rnn_gru_after_row(int64_t n, int64_t units, const float *g, const float *xr,
                                 int64_t xs, const float *bx, const float *bh, const float *hc,
                                 float *h, int act, int ract) {
    for (int64_t j = 0; j < n; j += FL_VW) {
        int64_t m = FL_MIN(FL_VW, n - j);
        fl_vf z = fl_load(g + j) + rnn_load(xr + j, m) + rnn_load(bx + j, m) +
                  rnn_load(bh + j, m);
        fl_vf r = fl_load(g + n + j) + rnn_load(xr + xs + j, m) + rnn_load(bx + units + j, m) +
                  rnn_load(bh + units + j, m);
        fl_vf hh = fl_load(g + 2 * n + j) + rnn_load(bh + 2 * units + j, m);
        z = rnn_vact(z, ract);
        fl_vf cand = rnn_vact(rnn_load(xr + 2 * xs + j, m) + rnn_load(bx + 2 * units + j, m) +
                                  rnn_vact(r, ract) * hh, act);
        rnn_store(h + j, z * rnn_load(hc + j, m) + (1.0f - z) * cand, m);
    }
}

/* GRU with the reset gate before the product, first phase: z, r = ract(gates + xw + b); z kept
 * in the gates' first block, rh = r hc. */
FL_INLINE void rnn_gru_gates_row(int64_t n, int64_t units, float *g, const float *xr,
                                 int64_t xs, const float *bx, const float *hc, float *rh,
                                 int ract) {
    for (int64_t j = 0; j < n; j += FL_VW) {
        int64_t m = FL_MIN(FL_VW, n - j);
        fl_vf z = fl_load(g + j) + rnn_load(xr + j, m) + rnn_load(bx + j, m);
        fl_vf r = fl_load(g + n + j) + rnn_load(xr + xs + j, m) + rnn_load(bx + units + j, m);
        rnn_store(g + j, rnn_vact(z, ract), m);
        rnn_store(rh + j, rnn_vact(r, ract) * rnn_load(hc + j, m), m);
    }
}

/* Second phase: cand = act(cp + xw_h + b_h), cp = (r h) w_h; h = z hc + (1 - z) cand. */
FL_INLINE void rnn_gru_cand_row(int64_t n, const float *z_, const float *cp, const float *xh,
                                const float *bxh, const float *hc, float *h, int act) {
    for (int64_t j = 0; j < n; j += FL_VW) {
        int64_t m = FL_MIN(FL_VW, n - j);
        fl_vf z = fl_load(z_ + j);
        fl_vf cand = rnn_vact(fl_load(cp + j) + rnn_load(xh + j, m) + rnn_load(bxh + j, m), act);
        rnn_store(h + j, z * rnn_load(hc + j, m) + (1.0f - z) * cand, m);
    }
}

/* One unit of a SimpleRNN share: step ts from state cur into nxt. */
FL_INLINE int rnn_simple_unit(const rnn_job *j, const rnn_share *sh, int64_t ts,
                              const float *cur, float *nxt, int act) {
    int64_t n = sh->n, u0 = sh->u0;
    int st = rnn_gate_product(j, sh, ts, n, cur);
    for (int64_t b = 0; b < j->rows; ++b) {
        if (!rnn_valid(j, b, ts)) {
            rnn_carry(j, b, ts, cur, nxt, u0, n);
            continue;
        }
        float *h = nxt + b * j->ldh + u0;
        rnn_simple_row(n, sh->gates + b * sh->gw, rnn_xrow(j, sh, ts, b), j->bx + u0, h, act);
        rnn_emit(j, b, ts, 1, h, u0, n);
    }
    return st;
}

/* One unit of an LSTM share: phase 0 the gates and cell (into hfull with a projection, else
 * the new state), phase 1 the share's outputs of the projection. */
FL_INLINE int rnn_lstm_unit(const rnn_job *j, const rnn_share *sh, int64_t ts, int ph,
                            const float *cur, float *nxt, int act, int ract) {
    const fl_rnn_args *a = j->a;
    int64_t n = sh->n, u0 = sh->u0, xs = rnn_xstride(j, sh);
    int st;
    if (ph == 1) {                                        /* the projection */
        int64_t q0 = sh->q0, nq = sh->nq;
        st = rnn_product(j->rows, nq, a->units, j->hfull, j->ldu, sh->pw_hp, sh->aux, sh->aw);
        for (int64_t b = 0; b < j->rows; ++b) {
            if (!rnn_valid(j, b, ts)) {
                rnn_carry(j, b, ts, cur, nxt, q0, nq);
                continue;
            }
            float *h = nxt + b * j->ldh + q0;
            memcpy(h, sh->aux + b * sh->aw, (size_t)nq * sizeof(float));
            rnn_emit(j, b, ts, 1, h, q0, nq);
        }
        return st;
    }
    int proj = a->pw_hp != 0;
    st = rnn_gate_product(j, sh, ts, 4 * n, cur);
    for (int64_t b = 0; b < j->rows; ++b) {
        if (!rnn_valid(j, b, ts)) {
            if (!proj) rnn_carry(j, b, ts, cur, nxt, u0, n);
            continue;
        }
        float *h = proj ? j->hfull + b * j->ldu + u0 : nxt + b * j->ldh + u0;
        rnn_lstm_row(n, a->units, sh->gates + b * sh->gw, rnn_xrow(j, sh, ts, b), xs,
                     j->bx + u0, j->c + b * j->ldu + u0, h, act, ract);
        if (!proj) rnn_emit(j, b, ts, 1, h, u0, n);
    }
    return st;
}

/* One unit of a GRU share: reset after, one phase; reset before, phase 0 z and r h, phase 1
 * the candidate from (r h) w_h and the new state. */
FL_INLINE int rnn_gru_unit(const rnn_job *j, const rnn_share *sh, int64_t ts, int ph,
                           const float *cur, float *nxt, int act, int ract) {
    const fl_rnn_args *a = j->a;
    int64_t n = sh->n, u0 = sh->u0, units = a->units, xs = rnn_xstride(j, sh);
    int st;
    if (a->reset_after) {
        st = rnn_product(j->rows, 3 * n, units, cur, j->ldh, sh->pw_hg, sh->gates, sh->gw);
        for (int64_t b = 0; b < j->rows; ++b) {
            if (!rnn_valid(j, b, ts)) {
                rnn_carry(j, b, ts, cur, nxt, u0, n);
                continue;
            }
            float *h = nxt + b * j->ldh + u0;
            rnn_gru_after_row(n, units, sh->gates + b * sh->gw, rnn_xrow(j, sh, ts, b), xs,
                              j->bx + u0, j->bh + u0, cur + b * j->ldh + u0, h, act, ract);
            rnn_emit(j, b, ts, 1, h, u0, n);
        }
        return st;
    }
    if (ph == 0) {
        st = rnn_product(j->rows, 2 * n, units, cur, j->ldh, sh->pw_hg, sh->gates, sh->gw);
        for (int64_t b = 0; b < j->rows; ++b)
            if (rnn_valid(j, b, ts))
                rnn_gru_gates_row(n, units, sh->gates + b * sh->gw, rnn_xrow(j, sh, ts, b),
                                  xs, j->bx + u0, cur + b * j->ldh + u0, j->rh + b * j->ldu + u0,
                                  ract);
        return st;
    }
    st = rnn_product(j->rows, n, units, j->rh, j->ldu, sh->pw_hn, sh->aux, sh->aw);
    for (int64_t b = 0; b < j->rows; ++b) {
        if (!rnn_valid(j, b, ts)) {
            rnn_carry(j, b, ts, cur, nxt, u0, n);
            continue;
        }
        float *h = nxt + b * j->ldh + u0;
        const float *xr = rnn_xrow(j, sh, ts, b);
        rnn_gru_cand_row(n, sh->gates + b * sh->gw, sh->aux + b * sh->aw, xr + 2 * xs,
                         j->bx + 2 * units + u0, cur + b * j->ldh + u0, h, act);
        rnn_emit(j, b, ts, 1, h, u0, n);
    }
    return st;
}

/* Unit u of share p: step u / phases, phase u % phases (the share's input projection first). */
static void rnn_unit(rnn_job *j, int64_t p, int64_t u) {
    const fl_rnn_args *a = j->a;
    const rnn_share *sh = j->sh + p;
    int64_t s = u / j->phases, ts = a->reverse ? a->steps - 1 - s : s;
    int ph = (int)(u % j->phases);
    int64_t half = j->rows * j->ldh;
    const float *cur = j->hbuf + (s & 1) * half;
    float *nxt = j->hbuf + ((s + 1) & 1) * half;
    int st = u == 0 && sh->xw ? rnn_project(j, sh) : 0;
    if (ph == 0) rnn_prefetch_rows(j, sh, ts);
    int dflt = a->act == FL_TANH && a->ract == FL_SIGMOID;   /* constants: no switch per vector */
    switch (a->kind) {
    case FL_RNN_SIMPLE:
        st |= a->act == FL_TANH ? rnn_simple_unit(j, sh, ts, cur, nxt, FL_TANH)
                                : rnn_simple_unit(j, sh, ts, cur, nxt, a->act);
        break;
    case FL_RNN_LSTM:
        st |= dflt ? rnn_lstm_unit(j, sh, ts, ph, cur, nxt, FL_TANH, FL_SIGMOID)
                   : rnn_lstm_unit(j, sh, ts, ph, cur, nxt, a->act, a->ract);
        break;
    default:
        st |= dflt ? rnn_gru_unit(j, sh, ts, ph, cur, nxt, FL_TANH, FL_SIGMOID)
                   : rnn_gru_unit(j, sh, ts, ph, cur, nxt, a->act, a->ract);
    }
    if (st) atomic_store(&j->status, st);
}

/* The job's states from the arguments (h, c, the carried output: rows b0:b0+rows). */
static void rnn_job_start(rnn_job *j) {
    const fl_rnn_args *a = j->a;
    for (int64_t b = 0; b < j->rows; ++b) {
        memcpy(j->hbuf + b * j->ldh, a->h + (j->b0 + b) * a->out, (size_t)a->out * sizeof(float));
        memcpy(j->last + b * j->ldh, a->last + (j->b0 + b) * a->out,
               (size_t)a->out * sizeof(float));
        if (a->kind == FL_RNN_LSTM)
            memcpy(j->c + b * j->ldu, a->c + (j->b0 + b) * a->units,
                   (size_t)a->units * sizeof(float));
    }
    /* rows a masked step skips still enter the products: keep them finite */
    if (j->hfull) memset(j->hfull, 0, (size_t)(j->rows * j->ldu) * sizeof(float));
    if (j->rh) memset(j->rh, 0, (size_t)(j->rows * j->ldu) * sizeof(float));
}

/* The final states and carried output back into the arguments. */
static void rnn_job_finish(rnn_job *j) {
    const fl_rnn_args *a = j->a;
    const float *h = j->hbuf + (a->steps & 1) * j->rows * j->ldh;
    for (int64_t b = 0; b < j->rows; ++b) {
        memcpy(a->h + (j->b0 + b) * a->out, h + b * j->ldh, (size_t)a->out * sizeof(float));
        memcpy(a->last + (j->b0 + b) * a->out, j->last + b * j->ldh,
               (size_t)a->out * sizeof(float));
        if (a->kind == FL_RNN_LSTM)
            memcpy(a->c + (j->b0 + b) * a->units, j->c + b * j->ldu,
                   (size_t)a->units * sizeof(float));
    }
}

/* Every unit of the job, share after share each step, on the calling thread. */
static void rnn_job_serial(rnn_job *j) {
    int64_t units = j->a->steps * j->phases;
    for (int64_t u = 0; u < units; ++u)
        for (int64_t p = 0; p < j->parts; ++p) rnn_unit(j, p, u);
}

/* Batch shares [r0, r1), each a job of its own (one unit share). */
static void rnn_rows_task(void *ctx, int64_t r0, int64_t r1) {
    rnn_job *jobs = (rnn_job *)ctx;
    for (int64_t r = r0; r < r1; ++r) {
        rnn_job_start(jobs + r);
        rnn_job_serial(jobs + r);
        rnn_job_finish(jobs + r);
    }
}

static int64_t rnn_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

FL_INLINE int rnn_claim(rnn_counter *c, int64_t from) {
    int64_t expected = from;
    return atomic_compare_exchange_strong_explicit(&c->v, &expected, from + 1,
                                                   memory_order_acq_rel, memory_order_acquire);
}

/* Wait until every share finished unit u; this thread's own units of it took busy_ns. own[q]:
 * 0 not this thread's share, 1 its next unit still to claim, 2 claimed already. With `take`
 * (the thread owns a share), a share whose unit u nobody claimed becomes this thread's at once
 * for u 0 (a thread that ran would have claimed it while this one ran its own), else after the
 * patience (busy_ns, at least RNN_TAKEOVER_MIN_NS); so does, after the patience, a share whose
 * unit u still runs: this thread claims its next unit. A share taken over is stamped with the
 * time, for its former owner's hand-back. */
static void rnn_meet(rnn_job *j, uint8_t *own, int64_t *owned, int64_t u, int64_t units,
                     int64_t busy_ns, int take) {
    int64_t target = (u + 1) * j->parts;
    if (atomic_load_explicit(&j->done->v, memory_order_acquire) >= target) return;
    int64_t start = rnn_now_ns(), patience = FL_MAX(busy_ns, RNN_TAKEOVER_MIN_NS);
    for (int64_t polls = 0; atomic_load_explicit(&j->done->v, memory_order_acquire) < target;
         ++polls) {
        if (polls % 32) {
            RNN_PAUSE();
            continue;
        }
        int64_t waited = rnn_now_ns() - start;
        for (int64_t q = 0; q < j->parts && take; ++q) {
            if (own[q]) continue;
            int64_t claimed = atomic_load_explicit(&j->claim[q].v, memory_order_acquire);
            int run = claimed == u && (u == 0 || waited >= patience) && rnn_claim(j->claim + q, u);
            if (!run && !(claimed == u + 1 && waited >= patience && u + 1 < units &&
                          rnn_claim(j->claim + q, u + 1)))
                continue;
            own[q] = run ? 1 : 2;
            ++*owned;
            atomic_store_explicit(&j->back[q].want, 0, memory_order_relaxed);
            atomic_store_explicit(&j->back[q].taken_ns, rnn_now_ns(), memory_order_release);
            if (run) {
                rnn_unit(j, q, u);
                atomic_fetch_add_explicit(&j->done->v, 1, memory_order_acq_rel);
            }
        }
        if (waited > RNN_YIELD_NS) sched_yield();
    }
}

static __thread const rnn_job *rnn_caller_job = 0;

/* A thread's part of the unit shares: [begin, end) is the pool's chunk; the whole range means
 * this thread runs alone (the pool was busy or has one thread) and takes every share. The
 * shares it starts with are its home shares (home[p]). One taken over from it (rnn_meet) comes
 * back when it returns within RNN_HANDBACK_NS of the take-over: it asks (want), the thread
 * holding the share lets it go at its next step, and it claims the share's next unit itself;
 * a thread back later leaves the share where it is (it was away long: the machine is busy). A
 * worker that found every share taken at the start asks for its first share the same way. */
static void rnn_shares_task(void *ctx, int64_t begin, int64_t end) {
    rnn_job *j = (rnn_job *)ctx;
    int64_t parts = j->parts, units = j->a->steps * j->phases, owned = 0, lost = 0, u0 = 0;
    int64_t last_busy = 0;
    uint8_t own[FL_RNN_MAX_PARTS], home[FL_RNN_MAX_PARTS];
    memset(own, 0, (size_t)parts);
    memset(home, 0, (size_t)parts);
    int alone = end - begin >= parts;
    int64_t first = rnn_caller_job == j ? 0 : FL_MAX(begin, 1) % parts;
    for (int64_t i = 0; i < parts; ++i) {
        int64_t p = (first + i) % parts;
        if (rnn_claim(j->claim + p, 0)) {
            own[p] = 2;
            home[p] = 1;
            ++owned;
            if (!alone) break;
        }
    }
    if (!owned) {               /* late: join at the step under way, asking for the first share */
        home[first] = 1;
        lost = 1;
        u0 = atomic_load_explicit(&j->done->v, memory_order_acquire) / parts;
    }
    for (int64_t u = u0; u < units && (owned || lost); ++u) {
        int64_t did = 0, start = rnn_now_ns();
        for (int64_t p = 0; p < parts; ++p) {
            if (own[p] == 1 && !home[p] &&
                atomic_load_explicit(&j->back[p].want, memory_order_acquire)) {
                own[p] = 0;                                         /* handed back */
                --owned;
                continue;
            }
            if (own[p] == 2 || (own[p] == 1 && rnn_claim(j->claim + p, u))) {
                own[p] = 1;
            } else if (own[p] == 1 || home[p]) {
                if (own[p] == 1) {                                  /* taken over */
                    own[p] = 0;
                    --owned;
                    lost += home[p];
                }
                if (!home[p]) continue;
                if (rnn_claim(j->claim + p, u)) {                   /* back home */
                    own[p] = 1;
                    ++owned;
                    --lost;
                    atomic_store_explicit(&j->back[p].want, 0, memory_order_relaxed);
                } else {
                    int64_t taken = atomic_load_explicit(&j->back[p].taken_ns,
                                                         memory_order_acquire);
                    if (rnn_now_ns() - taken <= RNN_HANDBACK_NS) {
                        atomic_store_explicit(&j->back[p].want, 1, memory_order_release);
                    } else {                                        /* away too long */
                        home[p] = 0;
                        --lost;
                        atomic_store_explicit(&j->back[p].want, 0, memory_order_relaxed);
                    }
                    continue;
                }
            } else {
                continue;
            }
            rnn_unit(j, p, u);
            ++did;
        }
        if (did) {
            atomic_fetch_add_explicit(&j->done->v, did, memory_order_acq_rel);
            last_busy = rnn_now_ns() - start;
        }
        if (owned || lost) rnn_meet(j, own, &owned, u, units, last_busy, owned > 0);
    }
}

static __thread fl_buf rnn_buf;

/* Bytes of n objects of `size`, rounded up to cache lines. */
FL_INLINE size_t rnn_span(int64_t n, size_t size) { return ((size_t)n * size + 63) / 64 * 64; }

int FL_FN(rnn_loop)(const fl_rnn_args *a) {
    int kind = a->kind;
    int64_t parts = a->parts, row_parts = a->row_parts, t_len = a->steps, units = a->units;
    if (kind < FL_RNN_SIMPLE || kind > FL_RNN_GRU || parts < 1 || parts > FL_RNN_MAX_PARTS ||
        row_parts < 1 || row_parts > a->batch || (row_parts > 1 && parts > 1) || t_len < 1 ||
        units < 1 || a->out < 1 || a->inputs < 1 || (!a->x && !(a->ids && a->table)))
        return -2;
    for (int64_t p = 0; p < parts; ++p)
        if (a->ubounds[p] > a->ubounds[p + 1] || (a->pw_hp && a->qbounds[p] > a->qbounds[p + 1]))
            return -2;
    if (a->ubounds[0] != 0 || a->ubounds[parts] != units ||
        (a->pw_hp && (a->qbounds[0] != 0 || a->qbounds[parts] != a->out)))
        return -2;
    int gru_before = kind == FL_RNN_GRU && !a->reset_after;
    int proj = kind == FL_RNN_LSTM && a->pw_hp;
    int64_t blocks = kind == FL_RNN_LSTM ? 4 : kind == FL_RNN_GRU ? 3 : 1;
    int64_t rec_blocks = gru_before ? 2 : blocks;
    int64_t phases = proj || gru_before ? 2 : 1;
    int64_t ldh = rnn_lines(a->out), ldu = rnn_lines(units), njobs = row_parts;
    int64_t max_rows = (a->batch + row_parts - 1) / row_parts;
    int step_x = kind != FL_RNN_GRU && a->x && a->batch / row_parts >= RNN_STEP_X_ROWS &&
                 (double)t_len * (double)max_rows * (double)(blocks * units) * 4.0 >
                     (double)RNN_STEP_X_BYTES;

    /* one buffer: jobs, shares, counters, zeros, then per job its states and per share its
     * scratch, each on cache lines of its own */
    size_t per_job = rnn_span(3 * max_rows * ldh, 4) +
                     rnn_span(max_rows * ldu, 4) * (size_t)(kind == FL_RNN_LSTM) +
                     rnn_span(max_rows * ldu, 4) * (size_t)(proj || gru_before);
    size_t per_share_max = 0;
    for (int64_t p = 0; p < parts; ++p) {
        int64_t n = a->ubounds[p + 1] - a->ubounds[p];
        int64_t nq = proj ? a->qbounds[p + 1] - a->qbounds[p] : 0;
        size_t bytes = rnn_span(max_rows * rnn_lines(rec_blocks * n + FL_VW), 4) +
                       rnn_span(max_rows * rnn_lines(FL_MAX(n, nq) + FL_VW), 4) +
                       (a->x && !step_x ? rnn_span(t_len * max_rows * blocks * n, 4) : 0);
        per_share_max = FL_MAX(per_share_max, bytes);
    }
    size_t head = rnn_span(njobs, sizeof(rnn_job)) + rnn_span(njobs * parts, sizeof(rnn_share)) +
                  rnn_span(parts + 1, sizeof(rnn_counter)) + rnn_span(parts, sizeof(rnn_back)) +
                  rnn_span(blocks * units, 4);
    char *buf = (char *)fl_buf_grow(&rnn_buf, head + (size_t)njobs * (per_job + (size_t)parts * per_share_max));
    if (!buf) return -1;
    rnn_job *jobs = (rnn_job *)buf;
    rnn_share *shares = (rnn_share *)(buf + rnn_span(njobs, sizeof(rnn_job)));
    rnn_counter *counters = (rnn_counter *)((char *)shares + rnn_span(njobs * parts,
                                                                      sizeof(rnn_share)));
    rnn_back *back = (rnn_back *)((char *)counters + rnn_span(parts + 1, sizeof(rnn_counter)));
    float *zeros = (float *)((char *)back + rnn_span(parts, sizeof(rnn_back)));
    memset(zeros, 0, (size_t)(blocks * units) * sizeof(float));
    char *next = (char *)zeros + rnn_span(blocks * units, 4);

    for (int64_t r = 0; r < njobs; ++r) {
        rnn_job *j = jobs + r;
        int64_t b0 = a->batch * r / njobs, rows = a->batch * (r + 1) / njobs - b0;
        j->a = a;
        j->b0 = b0;
        j->rows = rows;
        j->parts = parts;
        j->phases = phases;
        j->blocks = blocks;
        j->ldh = ldh;
        j->ldu = ldu;
        j->bx = a->b_g ? a->b_g : zeros;
        j->bh = a->b_hg ? a->b_hg : zeros;
        j->zeros = zeros;
        j->step_x = step_x;
        j->hbuf = (float *)next;
        j->last = j->hbuf + 2 * rows * ldh;
        char *more = next + rnn_span(3 * max_rows * ldh, 4);
        j->c = j->hfull = j->rh = 0;
        if (kind == FL_RNN_LSTM) {
            j->c = (float *)more;
            more += rnn_span(max_rows * ldu, 4);
        }
        if (proj || gru_before) {
            *(proj ? &j->hfull : &j->rh) = (float *)more;
        }
        next += per_job;
        j->sh = shares + r * parts;
        j->claim = counters;
        j->done = counters + parts;
        j->back = back;
        atomic_init(&j->status, 0);
        int64_t off_ig = 0, off_hg = 0, off_hn = 0, off_hp = 0;
        for (int64_t p = 0; p < parts; ++p) {
            rnn_share *sh = j->sh + p;
            int64_t n = a->ubounds[p + 1] - a->ubounds[p];
            sh->u0 = a->ubounds[p];
            sh->n = n;
            sh->q0 = proj ? a->qbounds[p] : 0;
            sh->nq = proj ? a->qbounds[p + 1] - a->qbounds[p] : 0;
            sh->pw_ig = a->pw_ig ? a->pw_ig + off_ig : 0;
            sh->pw_hg = a->pw_hg + off_hg;
            sh->pw_hn = gru_before ? a->pw_hn + off_hn : 0;
            sh->pw_hp = proj ? a->pw_hp + off_hp : 0;
            off_ig += fl_rnn_share_floats(a->inputs, blocks * n);
            off_hg += fl_rnn_share_floats(a->out, rec_blocks * n);
            off_hn += fl_rnn_share_floats(units, n);
            off_hp += fl_rnn_share_floats(units, sh->nq);
            sh->gw = rnn_lines(rec_blocks * n + FL_VW);
            sh->aw = rnn_lines(FL_MAX(n, sh->nq) + FL_VW);
            sh->wx = blocks * n;
            sh->gates = (float *)next;
            sh->aux = (float *)(next + rnn_span(max_rows * sh->gw, 4));
            sh->xw = a->x && !step_x ? (float *)((char *)sh->aux + rnn_span(max_rows * sh->aw, 4)) : 0;
            next += per_share_max;
        }
    }

    if (row_parts > 1) {
        fl_parallel(row_parts, 1, rnn_rows_task, jobs);
    } else {
        rnn_job *j = jobs;
        rnn_job_start(j);
        if (parts == 1 || fl_pool_get_threads() == 1) { /* shares one after the other, no meetings */
            rnn_job_serial(j);
        } else {
            for (int64_t p = 0; p <= parts; ++p) atomic_init(&counters[p].v, 0);
            for (int64_t p = 0; p < parts; ++p) {
                atomic_init(&back[p].taken_ns, 0);
                atomic_init(&back[p].want, 0);
            }
            rnn_caller_job = j;
            fl_parallel(parts, 1, rnn_shares_task, j);
            rnn_caller_job = 0;
        }
        rnn_job_finish(j);
    }
    int st = 0;
    for (int64_t r = 0; r < njobs && !st; ++r) st = atomic_load(&jobs[r].status);
    return st;
}

typedef struct {
    const fl_rnn_args *a;
    int *status;
} rnn_loops_ctx;

/* Loops [l0, l1) of rnn_loops, one after the other on this thread (a loop's shares, if any,
 * run here too: the pool is this call's). */
static void rnn_loops_task(void *ctx, int64_t l0, int64_t l1) {
    rnn_loops_ctx *c = (rnn_loops_ctx *)ctx;
    for (int64_t l = l0; l < l1; ++l) c->status[l] = FL_FN(rnn_loop)(c->a + l);
}

int FL_FN(rnn_loops)(const fl_rnn_args *a, int64_t n) {
    int status[FL_RNN_MAX_LOOPS];
    if (n < 1 || n > FL_RNN_MAX_LOOPS) return -2;
    rnn_loops_ctx c = {a, status};
    fl_parallel(n, 1, rnn_loops_task, &c);
    for (int64_t l = 0; l < n; ++l)
        if (status[l]) return status[l];
    return 0;
}
