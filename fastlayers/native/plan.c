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

/* The source offset of index i of axis k of a gather: its table's, or its even spacing's. */
#define GATHER_AT(map, first, step, i) ((map) ? (map)[i] : (first) + (i) * (step))

#define GATHER_T uint8_t
#define GATHER_NAME(x) gather_##x##_1
#include "plan_gather.inc"
#undef GATHER_T
#undef GATHER_NAME
#define GATHER_T uint16_t
#define GATHER_NAME(x) gather_##x##_2
#include "plan_gather.inc"
#undef GATHER_T
#undef GATHER_NAME
#define GATHER_T uint32_t
#define GATHER_NAME(x) gather_##x##_4
#include "plan_gather.inc"
#undef GATHER_T
#undef GATHER_NAME
#define GATHER_T uint64_t
#define GATHER_NAME(x) gather_##x##_8
#include "plan_gather.inc"
#undef GATHER_T
#undef GATHER_NAME

int fl_gather(void *ctx) {
    const fl_gather_args *a = ctx;
    int64_t row = 1; /* values per index of axis 0 */
    for (int k = 0; k < a->naxes; k++) {
        if (a->dims[k] == 0) return 0;
        if (k > 0) row *= a->dims[k];
    }
    fl_task_fn rows = a->elem == 1 ? gather_rows_1 : a->elem == 2 ? gather_rows_2 : a->elem == 8 ? gather_rows_8 : gather_rows_4;
    fl_parallel(a->dims[0], row >= FL_GATHER_GRAIN ? 1 : FL_GATHER_GRAIN / row, rows, (void *)a);
    return 0;
}

/* dst rows [begin, end) of a take, row q = o count + i: the run of src row idx[i] of block o. */
static void take_rows(void *ctx, int64_t begin, int64_t end) {
    const fl_take_args *a = ctx;
    for (int64_t q = begin; q < end; q++) {
        int64_t o = q / a->count, i = q % a->count;
        int64_t j = a->idx32 ? ((const int32_t *)a->idx)[i] : ((const int64_t *)a->idx)[i];
        if (j < 0) j += a->n;
        char *dst = a->dst + q * a->run * a->elem;
        const char *src = a->src + (o * a->n + j) * a->run * a->elem;
        if (a->elem == 4) gather_copy_run_4((uint32_t *)dst, (const uint32_t *)src, a->run);
        else memcpy(dst, src, (size_t)(a->run * a->elem));
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
    int64_t floats = (a->run * a->elem + 3) / 4; /* a row's size in floats, for the grain */
    fl_parallel(rows, floats >= FL_GATHER_GRAIN ? 1 : FL_GATHER_GRAIN / floats, take_rows, (void *)a);
    return 0;
}

/* Values of inner positions a reduction accumulates at once (doubles on the stack). */
#define FL_REDUCE_BLOCK 256

/* Partial sums a reduction of a contiguous run keeps (independent chains of double adds;
 * reduce_run adds eight pairwise). */
#define FL_REDUCE_LANES 8
_Static_assert(FL_REDUCE_LANES == 8, "reduce_run adds its partial sums as eight");

/* The sum of f(x[i]) for i < r over a contiguous run, f the identity, |.| or the square
 * (op): FL_REDUCE_LANES partial sums in double, lane l over i = l mod FL_REDUCE_LANES, added
 * pairwise at the end (one chain of r dependent adds took 4 cycles a value). */
static double reduce_run(const float *x, int64_t r, int op) {
    double s[FL_REDUCE_LANES] = {0.0};
    int64_t i = 0;
    for (; i + FL_REDUCE_LANES <= r; i += FL_REDUCE_LANES)
        for (int l = 0; l < FL_REDUCE_LANES; l++) {
            double v = x[i + l];
            s[l] += op == FL_REDUCE_L1 ? fabs(v) : op == FL_REDUCE_SUM_SQUARE || op == FL_REDUCE_L2 ? v * v : v;
        }
    for (int l = 0; i < r; i++, l++) {
        double v = x[i];
        s[l] += op == FL_REDUCE_L1 ? fabs(v) : op == FL_REDUCE_SUM_SQUARE || op == FL_REDUCE_L2 ? v * v : v;
    }
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* y[o, j] for blocks o in [begin, end) of a reduction (plan.h's reduce_step). */
static void reduce_blocks(void *ctx, int64_t begin, int64_t end) {
    const fl_reduce_args *a = ctx;
    int64_t r = a->r, inner = a->inner;
    int op = a->op;
    double acc[FL_REDUCE_BLOCK];
    if (inner == 1 && (op == FL_REDUCE_SUM || op == FL_REDUCE_MEAN || op == FL_REDUCE_L1 || op == FL_REDUCE_L2 ||
                       op == FL_REDUCE_SUM_SQUARE)) {
        for (int64_t o = begin; o < end; o++) { /* a contiguous run per output */
            double v = reduce_run(a->x + o * r, r, op);
            if (op == FL_REDUCE_MEAN) v /= (double)r;
            if (op == FL_REDUCE_L2) v = sqrt(v);
            a->y[o] = (float)v;
        }
        return;
    }
    for (int64_t o = begin; o < end; o++) {
        const float *x = a->x + o * r * inner;
        float *y = a->y ? a->y + o * inner : NULL;
        for (int64_t j0 = 0; j0 < inner; j0 += FL_REDUCE_BLOCK) {
            int64_t nj = inner - j0 < FL_REDUCE_BLOCK ? inner - j0 : FL_REDUCE_BLOCK;
            if (op == FL_REDUCE_ARGMAX || op == FL_REDUCE_ARGMIN) {
                float best[FL_REDUCE_BLOCK];
                int64_t *at = a->index + o * inner + j0;
                for (int64_t j = 0; j < nj; j++) best[j] = x[j0 + j], at[j] = 0;
                for (int64_t i = 1; i < r; i++) {
                    const float *row = x + i * inner + j0;
                    for (int64_t j = 0; j < nj; j++) {
                        float v = row[j], m = best[j];
                        int take = v != v   ? m == m || a->last   /* a NaN wins: the first, or the last */
                                   : m != m ? 0
                                            : (op == FL_REDUCE_ARGMAX ? v > m : v < m) || (a->last && v == m);
                        if (take) best[j] = v, at[j] = i;
                    }
                }
                continue;
            }
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

/* Values of a map step's innermost run converted at once (each operand's block, the results). */
#define FL_MAP_BLOCK 256

/* The cases of a load's switch for the integer and bool types: dst[i] = p[i stride]. */
#define MAP_LOAD_INTEGERS(dst, p, stride, n)                                                            \
    case FL_MAP_I32: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const int32_t *)(p))[i * (stride)]; break; \
    case FL_MAP_I8: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const int8_t *)(p))[i * (stride)]; break;   \
    case FL_MAP_U8: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const uint8_t *)(p))[i * (stride)]; break;  \
    case FL_MAP_I16: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const int16_t *)(p))[i * (stride)]; break; \
    case FL_MAP_U16: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const uint16_t *)(p))[i * (stride)]; break; \
    default: for (int64_t i = 0; i < (n); i++) (dst)[i] = ((const uint8_t *)(p))[i * (stride)] != 0; break;

/* p[0, n) of operand type `type`, `stride` elements apart, as doubles. */
static void map_load_f(double *dst, const void *p, int type, int64_t stride, int64_t n) {
    switch (type) {
    case FL_MAP_F32: for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)p)[i * stride]; break;
    case FL_MAP_F64: for (int64_t i = 0; i < n; i++) dst[i] = ((const double *)p)[i * stride]; break;
    case FL_MAP_I64: for (int64_t i = 0; i < n; i++) dst[i] = (double)((const int64_t *)p)[i * stride]; break;
    MAP_LOAD_INTEGERS(dst, p, stride, n)
    }
}

/* The same as int64 (integer and bool operands only). */
static void map_load_i(int64_t *dst, const void *p, int type, int64_t stride, int64_t n) {
    switch (type) {
    case FL_MAP_I64: for (int64_t i = 0; i < n; i++) dst[i] = ((const int64_t *)p)[i * stride]; break;
    MAP_LOAD_INTEGERS(dst, p, stride, n)
    }
}

/* The cases of a map's switch that read the same in either domain: r = op(u, v, w). */
#define MAP_SHARED_CASES(u, v, w, r)                      \
    case FL_MAP_EQ: r = (u) == (v); break;                \
    case FL_MAP_LT: r = (u) < (v); break;                 \
    case FL_MAP_LE: r = (u) <= (v); break;                \
    case FL_MAP_GT: r = (u) > (v); break;                 \
    case FL_MAP_GE: r = (u) >= (v); break;                \
    case FL_MAP_WHERE: r = (u) != 0 ? (v) : (w); break;   \
    case FL_MAP_NOT: r = (u) == 0; break;                 \
    case FL_MAP_AND: r = (u) != 0 && (v) != 0; break;     \
    case FL_MAP_OR: r = (u) != 0 || (v) != 0; break;      \
    case FL_MAP_XOR: r = ((u) != 0) != ((v) != 0); break;

/* out[0, n) of type `type` = r[0, n) converted as numpy's astype (C's conversions: floats
 * truncated toward zero into integers, nonzero into true). */
#define MAP_STORE(type, r, n, out)                                                                  \
    switch (type) {                                                                                 \
    case FL_MAP_F32: for (int64_t i = 0; i < (n); i++) ((float *)(out))[i] = (float)(r)[i]; break;  \
    case FL_MAP_F64: for (int64_t i = 0; i < (n); i++) ((double *)(out))[i] = (double)(r)[i]; break; \
    case FL_MAP_I64: for (int64_t i = 0; i < (n); i++) ((int64_t *)(out))[i] = (int64_t)(r)[i]; break; \
    case FL_MAP_I32:                                                                                \
        for (int64_t i = 0; i < (n); i++) ((int32_t *)(out))[i] = (int32_t)(int64_t)(r)[i];         \
        break;                                                                                      \
    default: for (int64_t i = 0; i < (n); i++) ((uint8_t *)(out))[i] = (r)[i] != 0; break;          \
    }

static inline double nan_max(double a, double b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static inline double nan_min(double a, double b) { return a != a ? a : b != b ? b : a < b ? a : b; }

/* out[0, n) (C order) = the map's op on n values of each operand (float domain). */
static void map_run_f(const fl_map_args *a, const void *const *in, const int64_t *strides, int64_t n, void *out) {
    double x[3][FL_MAP_BLOCK], r[FL_MAP_BLOCK];
    int op = a->op;
    for (int j = 0; j < a->n_in; j++) map_load_f(x[j], in[j], a->types[j], strides[j], n);
    for (int64_t i = 0; i < n; i++) {
        double u = x[0][i], v = a->n_in > 1 ? x[1][i] : 0.0;
        switch (op) {
        MAP_SHARED_CASES(u, v, x[2][i], r[i])
        case FL_MAP_ISNAN: r[i] = u != u; break;
        case FL_MAP_ADD: r[i] = u + v; break;
        case FL_MAP_SUB: r[i] = u - v; break;
        case FL_MAP_MUL: r[i] = u * v; break;
        case FL_MAP_DIV: r[i] = u / v; break;
        case FL_MAP_MIN: r[i] = nan_min(u, v); break;
        case FL_MAP_MAX: r[i] = nan_max(u, v); break;
        case FL_MAP_CLIP: r[i] = nan_min(nan_max(u, v), x[2][i]); break;
        case FL_MAP_SQRT: r[i] = sqrt(u); break;
        case FL_MAP_NEG: r[i] = -u; break;
        case FL_MAP_ABS: r[i] = fabs(u); break;
        case FL_MAP_RECIPROCAL: r[i] = 1.0 / u; break;
        case FL_MAP_DEQUANTIZE: r[i] = (u - x[2][i]) * v; break;
        default: r[i] = u; break; /* CAST */
        }
    }
    MAP_STORE(a->out_type, r, n, out);
}

/* The same in the integer domain (comparisons, WHERE, CAST, logic and MIN / MAX of integers). */
static void map_run_i(const fl_map_args *a, const void *const *in, const int64_t *strides, int64_t n, void *out) {
    int64_t x[3][FL_MAP_BLOCK], r[FL_MAP_BLOCK];
    int op = a->op;
    for (int j = 0; j < a->n_in; j++) map_load_i(x[j], in[j], a->types[j], strides[j], n);
    for (int64_t i = 0; i < n; i++) {
        int64_t u = x[0][i], v = a->n_in > 1 ? x[1][i] : 0;
        switch (op) {
        MAP_SHARED_CASES(u, v, x[2][i], r[i])
        case FL_MAP_MIN: r[i] = u < v ? u : v; break;
        case FL_MAP_MAX: r[i] = u > v ? u : v; break;
        default: r[i] = u; break; /* CAST; ISNAN of an integer: the lowering gives none */
        }
    }
    MAP_STORE(a->out_type, r, n, out);
}

static size_t map_size(int type) {
    switch (type) {
    case FL_MAP_F64: case FL_MAP_I64: return 8;
    case FL_MAP_F32: case FL_MAP_I32: return 4;
    case FL_MAP_I16: case FL_MAP_U16: return 2;
    default: return 1;
    }
}

int fl_map_step(void *ctx) {
    const fl_map_args *a = ctx;
    int integer = 1, last = a->naxes - 1;
    for (int j = 0; j < a->n_in; j++) integer &= a->types[j] != FL_MAP_F32 && a->types[j] != FL_MAP_F64;
    int64_t index[FL_GATHER_AXES] = {0}, inner = a->dims[last], outer = 1, inner_strides[3];
    for (int k = 0; k < last; k++) outer *= a->dims[k];
    for (int j = 0; j < a->n_in; j++) inner_strides[j] = a->strides[j][last];
    size_t out_size = map_size(a->out_type);
    char *out = a->out;
    for (int64_t o = 0; o < outer; o++) { /* each run along the last axis, its operands' offsets from index */
        const void *in[3];
        for (int j = 0; j < a->n_in; j++) {
            int64_t off = 0;
            for (int k = 0; k < last; k++) off += index[k] * a->strides[j][k];
            in[j] = (const char *)a->in[j] + off * (int64_t)map_size(a->types[j]);
        }
        for (int64_t i0 = 0; i0 < inner; i0 += FL_MAP_BLOCK) {
            int64_t n = inner - i0 < FL_MAP_BLOCK ? inner - i0 : FL_MAP_BLOCK;
            const void *at[3];
            for (int j = 0; j < a->n_in; j++)
                at[j] = (const char *)in[j] + i0 * inner_strides[j] * (int64_t)map_size(a->types[j]);
            if (integer) map_run_i(a, at, inner_strides, n, out);
            else map_run_f(a, at, inner_strides, n, out);
            out += n * out_size;
        }
        for (int k = last - 1; k >= 0 && ++index[k] == a->dims[k]; k--) index[k] = 0;
    }
    return 0;
}

int fl_transpose_step(void *ctx) {
    const fl_transpose_args *a = ctx;
    return fl_transpose(a->batch, a->rows, a->cols, a->src, a->src_batch, a->src_row, a->dst, a->dst_batch,
                        a->dst_row);
}

int fl_conv2d_step(void *ctx) {
    const fl_conv2d_args *a = ctx;
    if (a->nchw_out && a->nchw_in)
        return fl_conv2d_planes(a->n, a->c, a->h, a->w, a->x, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                                a->ho, a->wo, a->cout, a->pw, a->bias, a->code, a->alpha, a->y);
    if (a->nchw_out)
        return fl_conv1x1_nchw(a->n, a->c, a->h * a->w, a->cout, a->x, a->pw, a->ldw, a->bias, a->code, a->alpha, a->y);
    if (a->nchw_in)
        return fl_conv2d_nchw_in(a->n, a->c, a->h, a->w, a->x, a->kh, a->kw, a->sh, a->sw, a->dh, a->dw, a->pt, a->pl,
                                 a->ho, a->wo, a->cout, a->pw, a->bias, a->code, a->alpha, a->y);
    if (a->tile) {
        int st = fl_conv3x3_winograd(a->tile, a->n, a->h, a->w, a->c, a->x, a->pt, a->pl, a->ho, a->wo, a->cout, a->pu,
                                     a->bias, a->code, a->alpha, a->y);
        if (st != 1) return st; /* 1: a non-finite value, the exact sums below */
        if (!a->pw) return FL_PLAN_NOT_FINITE;
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

/* Whether every id a loop reads names a row of its table (0 <= id < V); float loops pass. */
static int rnn_ids_in_table(const fl_rnn_args *a) {
    if (a->ids == NULL) return 1;
    int64_t bad = 0;
    for (int64_t i = 0; i < a->batch * a->steps; ++i) bad |= (uint64_t)a->ids[i] >= (uint64_t)a->table_rows;
    return !bad;
}

int fl_rnn_step(void *ctx) {
    const fl_rnn_step_args *a = ctx;
    if (!rnn_ids_in_table(&a->a)) return FL_PLAN_BAD_INDEX;
    if (!a->serial) return fl_rnn_loop(&a->a);
    int previous = fl_pool_set_call_threads(1);
    int st = fl_rnn_loop(&a->a);
    fl_pool_set_call_threads(previous);
    return st;
}

int fl_rnn_loops_step(void *ctx) {
    const fl_rnn_loops_step_args *a = ctx;
    for (int64_t i = 0; i < a->n; ++i)
        if (!rnn_ids_in_table(&a->a[i])) return FL_PLAN_BAD_INDEX;
    return fl_rnn_loops(a->a, a->n);
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

static void loop_copies(const fl_loop_copy *c, int64_t n, int64_t t) {
    for (int64_t k = 0; k < n; k++) {
        const char *src = c[k].src + t * c[k].src_step;
        char *dst = c[k].dst + t * c[k].dst_step;
        if (src != dst) memmove(dst, src, (size_t)c[k].nbytes);
    }
}

/* for t while t < M and cond: counter = t; before; body; cond = cond_out; after */
int fl_loop_step(void *ctx) {
    const fl_loop_args *a = ctx;
    int64_t failed = -1, t = 0;
    int go = a->cond == NULL || *a->cond != 0;
    loop_copies(a->init, a->ninit, 0);
    for (; go && (a->trips == NULL || t < *a->trips); t++) {
        if (a->most >= 0 && t >= a->most) return FL_PLAN_LOOP_LIMIT;
        if (a->expect >= 0 && t >= a->expect) return FL_PLAN_OTHER_SHAPES;
        if (a->counter) *a->counter = t;
        loop_copies(a->before, a->nbefore, t);
        int st = fl_plan_run(a->body, a->nbody, &failed, NULL);
        if (st) return st;
        go = a->cond_out == NULL || *a->cond_out != 0;
        loop_copies(a->after, a->nafter, t);
    }
    return a->expect >= 0 && t != a->expect ? FL_PLAN_OTHER_SHAPES : 0;
}
