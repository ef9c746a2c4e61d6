/* Native plans: the step kinds with a native form and the loop that runs a plan (plan.h). */
#include "plan.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
#include "threadpool.h"

/* Values a gather moves per chunk of its threads at least (a memory-bound copy: 128 KiB). */
#define FL_GATHER_GRAIN 32768

/* Values per row of an activation step: the row length rows.pxi's apply_activation uses. */
#define FL_ACT_ROW 4096

/* dst[0..n) = src[0..n): short runs (a few channels) without a call. */
static inline void copy_run(float *dst, const float *src, int64_t n) {
    if (n > 32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

/* dst[i..] over axes k.. of a gather, the source offset of the axes before k being `base`
 * (< 0: a padded position, every value `fill`). */
static void gather_axes(const fl_gather_args *a, int k, int64_t base, float *dst) {
    const int64_t *map = a->maps[k];
    int64_t n = a->dims[k], stride = a->dst_strides[k];
    if (k == a->naxes - 2 && a->inner_run && base >= 0) { /* rows of one run each, inline */
        int64_t run = a->dims[k + 1], first = a->maps[k + 1][0];
        for (int64_t i = 0; i < n; i++) {
            float *row = dst + i * stride;
            if (map[i] < 0)
                for (int64_t j = 0; j < run; j++) row[j] = a->fill;
            else
                copy_run(row, a->src + base + map[i] + first, run);
        }
        return;
    }
    if (k == a->naxes - 1) {
        if (base < 0) {
            for (int64_t i = 0; i < n; i++) dst[i * stride] = a->fill;
        } else if (a->inner_run) {
            memcpy(dst, a->src + base + map[0], (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++) dst[i * stride] = map[i] < 0 ? a->fill : a->src[base + map[i]];
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) gather_axes(a, k + 1, base < 0 || map[i] < 0 ? -1 : base + map[i], dst + i * stride);
}

/* The gather of rows [begin, end) of axis 0. */
static void gather_rows(void *ctx, int64_t begin, int64_t end) {
    const fl_gather_args *a = ctx;
    fl_gather_args part = *a;
    part.dims[0] = end - begin;
    part.maps[0] = a->maps[0] + begin;
    gather_axes(&part, 0, 0, a->dst + begin * a->dst_strides[0]);
}

int fl_gather(void *ctx) {
    const fl_gather_args *a = ctx;
    int64_t row = 1; /* values per index of axis 0 */
    for (int k = 0; k < a->naxes; k++) {
        if (a->dims[k] == 0) return 0;
        if (k > 0) row *= a->dims[k];
    }
    fl_parallel(a->dims[0], row >= FL_GATHER_GRAIN ? 1 : FL_GATHER_GRAIN / row, gather_rows, (void *)a);
    return 0;
}

/* dst rows [begin, end) of a take, row q = o count + i: the run of src row idx[i] of block o. */
static void take_rows(void *ctx, int64_t begin, int64_t end) {
    const fl_take_args *a = ctx;
    for (int64_t q = begin; q < end; q++) {
        int64_t o = q / a->count, i = q % a->count;
        int64_t j = a->idx32 ? ((const int32_t *)a->idx)[i] : ((const int64_t *)a->idx)[i];
        if (j < 0) j += a->n;
        copy_run(a->dst + q * a->run, a->src + (o * a->n + j) * a->run, a->run);
    }
}

int fl_take_step(void *ctx) {
    const fl_take_args *a = ctx;
    for (int64_t i = 0; i < a->count; i++) { /* every index checked before a value is written */
        int64_t j = a->idx32 ? ((const int32_t *)a->idx)[i] : ((const int64_t *)a->idx)[i];
        if (j < -a->n || j >= a->n) return FL_PLAN_BAD_INDEX;
    }
    int64_t rows = a->outer * a->count;
    if (rows == 0 || a->run == 0) return 0;
    fl_parallel(rows, a->run >= FL_GATHER_GRAIN ? 1 : FL_GATHER_GRAIN / a->run, take_rows, (void *)a);
    return 0;
}

/* Values of inner positions a reduction accumulates at once (doubles on the stack). */
#define FL_REDUCE_BLOCK 256

/* y[o, j] for blocks o in [begin, end) of a reduction (plan.h's reduce_step). */
static void reduce_blocks(void *ctx, int64_t begin, int64_t end) {
    const fl_reduce_args *a = ctx;
    int64_t r = a->r, inner = a->inner;
    int op = a->op;
    double acc[FL_REDUCE_BLOCK];
    for (int64_t o = begin; o < end; o++) {
        const float *x = a->x + o * r * inner;
        float *y = a->y + o * inner;
        for (int64_t j0 = 0; j0 < inner; j0 += FL_REDUCE_BLOCK) {
            int64_t nj = inner - j0 < FL_REDUCE_BLOCK ? inner - j0 : FL_REDUCE_BLOCK;
            if (op == FL_REDUCE_MAX || op == FL_REDUCE_MIN) {
                for (int64_t j = 0; j < nj; j++) y[j0 + j] = x[j0 + j];
                for (int64_t i = 1; i < r; i++) {
                    const float *row = x + i * inner + j0;
                    for (int64_t j = 0; j < nj; j++) {
                        float v = row[j], m = y[j0 + j];
                        if (v != v || (op == FL_REDUCE_MAX ? v > m : v < m)) y[j0 + j] = m != m ? m : v;
                    }
                }
                continue;
            }
            for (int64_t j = 0; j < nj; j++) acc[j] = 0.0;
            for (int64_t i = 0; i < r; i++) {
                const float *row = x + i * inner + j0;
                if (op == FL_REDUCE_SUM || op == FL_REDUCE_MEAN)
                    for (int64_t j = 0; j < nj; j++) acc[j] += row[j];
                else if (op == FL_REDUCE_L1)
                    for (int64_t j = 0; j < nj; j++) acc[j] += fabs((double)row[j]);
                else
                    for (int64_t j = 0; j < nj; j++) acc[j] += (double)row[j] * row[j];
            }
            for (int64_t j = 0; j < nj; j++) {
                double v = acc[j];
                if (op == FL_REDUCE_MEAN) v /= (double)r;
                if (op == FL_REDUCE_L2) v = sqrt(v);
                y[j0 + j] = (float)v;
            }
        }
    }
}

int fl_reduce_step(void *ctx) {
    const fl_reduce_args *a = ctx;
    int64_t block = a->r * a->inner;
    if (a->outer == 0 || a->inner == 0 || a->r < 1) return 0;
    fl_parallel(a->outer, block >= FL_GATHER_GRAIN ? 1 : FL_GATHER_GRAIN / block, reduce_blocks, (void *)a);
    return 0;
}

int fl_transpose_step(void *ctx) {
    const fl_transpose_args *a = ctx;
    return fl_transpose(a->batch, a->rows, a->cols, a->src, a->src_batch, a->src_row, a->dst, a->dst_batch,
                        a->dst_row);
}

int fl_conv2d_step(void *ctx) {
    const fl_conv2d_args *a = ctx;
    if (a->nchw_in)
        return fl_conv2d_nchw_in(a->n, a->c, a->h, a->w, a->x, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                                 a->ho, a->wo, a->cout, a->pw, a->bias, a->code, a->alpha, a->y);
    if (a->tile) {
        int st = fl_conv3x3_winograd(a->tile, a->n, a->h, a->w, a->c, a->x, a->pt, a->pl, a->ho, a->wo, a->cout, a->pu,
                                     a->bias, a->code, a->alpha, a->y);
        if (st != 1) return st; /* 1: a non-finite value, the exact sums below */
    }
    return fl_conv2d(a->n, a->h, a->w, a->c, a->x, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl, a->ho,
                     a->wo, a->groups, a->cout, a->pw, a->bias, a->code, a->alpha, a->res, a->res_code, a->res_alpha,
                     0, a->y);
}

int fl_depthwise_step(void *ctx) {
    const fl_depthwise_args *a = ctx;
    return fl_depthwise_conv2d(a->n, a->h, a->w, a->c, a->x, a->kh, a->kw, a->m, a->sh, a->sw, a->dh, a->dw, a->pt,
                               a->pl, a->ho, a->wo, a->wk, a->bias, a->code, a->alpha, a->y);
}

int fl_conv_transpose_step(void *ctx) {
    const fl_conv_transpose_args *a = ctx;
    if (a->nchw)
        return fl_conv_transpose2d_nchw(a->n, a->cin, a->h, a->w, a->x, a->kh, a->kw, a->cout_g, a->groups, a->sh,
                                        a->sw, a->dh, a->dw, a->ct, a->cl, a->ho, a->wo, a->wt, a->bias, a->code,
                                        a->alpha, a->y);
    return fl_conv_transpose2d(a->n, a->h, a->w, a->cin, a->x, a->kh, a->kw, a->cout_g, a->groups, a->sh, a->sw, a->dh,
                               a->dw, a->ct, a->cl, a->ho, a->wo, a->wt, a->bias, a->code, a->alpha, a->y);
}

int fl_dense_step(void *ctx) {
    const fl_dense_args *a = ctx;
    return fl_matmul(a->m, a->n, a->k, a->x, a->k, a->w, a->ldw, 0, a->pw, a->bias, a->code, a->alpha, a->y, a->n);
}

int fl_pool_step(void *ctx) {
    const fl_pool_args *a = ctx;
    return fl_pool2d(a->n, a->h, a->w, a->c, a->x, a->is_max, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                     a->h_end, a->w_end, a->count_include_pad, a->ho, a->wo, a->y);
}

int fl_scale_shift_step(void *ctx) {
    const fl_scale_shift_args *a = ctx;
    return fl_scale_shift(a->m, a->n, a->x, a->scale, a->shift, a->out);
}

int fl_batched_matmul_step(void *ctx) {
    const fl_batched_matmul_args *a = ctx;
    return fl_matmul_batch(a->batch, a->m, a->n, a->k, a->a, a->sa, a->k, a->b, a->sb, a->n, 0, a->c, a->m * a->n,
                           a->n);
}

int fl_rnn_step(void *ctx) {
    const fl_rnn_step_args *a = ctx;
    if (!a->serial) return fl_rnn_loop(&a->a);
    int previous = fl_pool_set_call_threads(1);
    int st = fl_rnn_loop(&a->a);
    fl_pool_set_call_threads(previous);
    return st;
}

int fl_activation_step(void *ctx) {
    const fl_activation_args *a = ctx;
    if (a->row > 0) return fl_bias_act(a->size / a->row, a->row, a->x, a->row, NULL, a->code, a->alpha, a->y, a->row);
    int64_t row = a->size < FL_ACT_ROW ? a->size : FL_ACT_ROW, done = 0;
    if (row == 0) return 0;
    int st = fl_bias_act(a->size / row, row, a->x, row, NULL, a->code, a->alpha, a->y, row);
    done = a->size / row * row;
    if (st == 0 && done < a->size)
        st = fl_bias_act(1, a->size - done, a->x + done, a->size - done, NULL, a->code, a->alpha, a->y + done,
                         a->size - done);
    return st;
}

int fl_add_act_step(void *ctx) {
    const fl_add_act_args *a = ctx;
    return fl_add_act(a->n, a->a, a->b, a->code, a->alpha, a->out);
}

int fl_elementwise_step(void *ctx) {
    const fl_elementwise_args *a = ctx;
    return fl_elementwise(a->samples, a->inner, a->c, a->n_operands, a->operands, a->n_insns, a->insns, a->n_regs,
                          a->out);
}

int fl_layer_norm_step(void *ctx) {
    const fl_layer_norm_args *a = ctx;
    return fl_layer_norm(a->m, a->n, a->x, a->gamma, a->beta, a->eps, a->rms, a->out);
}

int fl_attention_step(void *ctx) {
    const fl_attention_step_args *a = ctx;
    return fl_attention(a->nb, a->nh, a->tq, a->tk, a->d, a->dv, a->q, a->q_st, a->k, a->k_st, a->v, a->v_st,
                        a->scale, a->bias, a->bias ? a->bias_st : NULL, a->causal, a->empty, NULL, a->out,
                        a->out_st);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int fl_plan_run(const fl_plan_step *steps, int64_t n, int64_t *failed, int64_t *ns) {
    for (int64_t i = 0; i < n; i++) {
        int64_t t0 = ns ? now_ns() : 0;
        int st = steps[i].fn(steps[i].ctx);
        if (ns) ns[i] = now_ns() - t0;
        if (st) {
            *failed = i;
            return st;
        }
    }
    return 0;
}
