/* Native plans (plan.c): a model's steps run one after the other in one native call, each a
 * kernel whose arguments (pointers into the plan's arena and its weights, sizes, codes) were
 * bound when the plan was built for one set of input shapes (onnx/lowering.py). A step is a
 * function and its context; a step with no native form calls back into Python (plan.pxi).
 *
 * gather(a): dst[sum_k i_k dst_strides[k]] = src[sum_k maps[k][i_k]] for every index (i_0, ..,
 *   i_{naxes-1}) < dims, or `fill` where some maps[k][i_k] < 0 (a padded position): every
 *   data-movement operator (Slice, Transpose, Pad, Concat, Gather on constant indices,
 *   Expand, Tile) as per-axis tables of source offsets (in values of `elem` bytes: floats,
 *   integers, bools, quantized bytes, moved as bits); where maps[k] is NULL the
 *   axis is evenly spaced, maps[k][i] = firsts[k] + i steps[k] >= 0 (no table held: a long
 *   run of whole rows); inner_run: the last axis' offsets are its first + i and
 *   dst_strides[naxes-1] = 1, copied as one run per row; the pool's threads take chunks of
 *   axis 0 where the gather is large.
 * transpose_step(a): layout.h's transpose on the bound arguments: dst[b dst_batch + c dst_row + r] =
 *   src[b src_batch + r src_row + c] (a gather whose source and destination are strided
 *   blocks, one's rows the other's columns: a layout move, in cache tiles and threaded).
 * conv2d_step(a): conv.h's conv2d on the bound arguments (res: the residual, NULL for none);
 *   where `tile` is 2 or 4, conv3x3_winograd on `pu` first, the direct conv2d where it finds
 *   a non-finite value (the cpu backend's choice, backends/cpu/conv.py), or FL_PLAN_NOT_FINITE
 *   where pw is NULL (no packed weights held for that rare case); where `nchw_in`, x is
 *   NCHW planes (N, C, H, W) and pw the unpacked HWIO weights: conv2d_nchw_in; where
 *   `nchw_out` (a 1x1 convolution), x and y are NCHW planes and pw the (C_out, C) weights,
 *   rows ldw floats apart: conv1x1_nchw; where both, x and y are NCHW planes and pw the
 *   unpacked HWIO weights: conv2d_planes.
 * depthwise_step(a): conv.h's depthwise_conv2d on the bound arguments.
 * conv_transpose_step(a): conv.h's conv_transpose2d on the bound arguments (x (N, H, W, C_in),
 *   wt packed), or where `nchw` its conv_transpose2d_nchw (x (N, C_in, H, W) planes, wt as
 *   each group's (cout_g kh kw, C_in / groups) rows).
 * pool_step(a): pool.h's pool2d on the bound arguments.
 * scale_shift_step(a): rows.h's scale_shift: out[i, j] = x[i, j] scale[j] + shift[j] over m
 *   rows of n floats (out may be x).
 * batched_matmul_step(a): c[i] = a[i] @ b[i] for i < batch (gemm.h's matmul_batch), a stride
 *   of 0 sharing an operand across the batch.
 * dense_step(a): y (m, n) = f(x (m, k) @ w + bias), gemm.h's matmul on the packed weights pw,
 *   or on w (k, n) read in place (rows ldw apart) where pw is NULL.
 * rnn_step(a): recurrent.h's rnn_loop, on the calling thread alone where `serial`; a loop
 *   reading ids of its table's rows first checks them (FL_PLAN_BAD_INDEX where one is outside
 *   [0, table_rows): the plan's ids arrive per call).
 * rnn_loops_step(a): recurrent.h's rnn_loops on the n loops (independent: a bidirectional
 *   layer's directions), one thread each; ids checked as rnn_step's.
 * activation_step(a): y = f(x) over `size` floats (rows.h's bias_act, code and alpha); where
 *   `row` > 0, over rows of `row` floats (the softmax codes normalize each).
 * add_act_step(a): out[k] = f(a[k] + b[k]) for k < n (rows.h's add_act; out may be a): a
 *   residual added after a convolution whose kernel does not add it in its epilogue.
 * elementwise_step(a): elementwise.h's elementwise on the bound operands and program.
 * attention_step(a): attention.h's attention on the bound arguments (the weights not kept):
 *   q, k, v, out strided by (batch, head, row), rows contiguous; bias (B|1, H|1, Tq|1, Tk) or
 *   NULL.
 * layer_norm_step(a): rows.h's layer_norm over m rows of n floats.
 * take_step(a): dst[o, i, r] = src[o, j, r] with j = idx[i] (+ n where negative) for o < outer,
 *   i < count, r < run, values of `elem` bytes: a Gather on computed indices (int64, or int32
 *   where `idx32`) of any table (float32, or the 8-bit values of a quantized embedding), an
 *   embedding lookup where outer is 1; FL_PLAN_BAD_INDEX, before anything is written, where an
 *   index lies outside [-n, n).
 * reduce_step(a): y[o, j] = op over i < r of x[o, i, j] for o < outer, j < inner: sums (SUM,
 *   MEAN, L1, L2, SUM_SQUARE) accumulated in double and rounded once, MEAN divided by r, L2 the
 *   square root of the sum of squares; MAX and MIN as numpy's (a NaN wins); ARGMAX and ARGMIN
 *   index[o, j] = the i of that value instead (int64: the first of equal values, or with
 *   `last` the last; the first NaN, or the last, wins), numpy's argmax / argmin.
 * map_step(a): out[i] = op(x0[i0], x1[i1], x2[i2]) for every index i < dims (out C-ordered),
 *   operand j read at sum_k i_k strides[j][k] elements of its own type (stride 0 along an axis
 *   it broadcasts): comparisons EQ LT LE GT GE into bool; WHERE (x0 picks x1, else x2); CAST
 *   (x0 converted as numpy's astype: floats truncated toward zero into integers, nonzero into
 *   true); NOT AND OR XOR of truth values; ISNAN; float ADD SUB MUL DIV, MIN MAX (a NaN wins),
 *   CLIP (MIN of the MAX with x1, with x2), SQRT NEG ABS RECIPROCAL, and DEQUANTIZE ((x0 - x2)
 *   x1: 8- or 16-bit values, their scale and zero point). The operands are read as int64
 *   where all are integers or bools (the result types: float32, float64, int64, int32, bool),
 *   else as double (exact for float32, int32 and smaller integers), and each result is
 *   rounded once into out's type: float32 arithmetic gives numpy's bits.
 * loop_step(a): an ONNX Loop or Scan whose body is the steps `body`: the `init` copies once, then
 *   for t = 0, 1, ... while t < *trips (where `trips` is not NULL) and the condition holds
 *   (`cond` once at the start, `cond_out` after each iteration; NULL: true): *counter = t (where
 *   not NULL), the `before` copies, the body's steps, the `after` copies. Copy k moves `nbytes`
 *   bytes from src + t src_step to dst + t dst_step (steps in bytes, of either sign: the slices
 *   of scanned inputs in, the carried values back to the body's inputs, the per-iteration
 *   outputs into their stacks). FL_PLAN_LOOP_LIMIT before iteration `most` (where >= 0: the
 *   limit a file's own trip count runs under); FL_PLAN_OTHER_SHAPES where the loop would run
 *   other than `expect` iterations (where >= 0: the plan's stacked outputs hold that many).
 * plan_run(steps, n, failed, ns): the steps in order; 0, or the first failing step's status
 *   with its index in *failed; where ns is not NULL, ns[i] = the nanoseconds step i took (a
 *   profile). */
#ifndef FL_PLAN_H
#define FL_PLAN_H
#include <stdint.h>
#include "elementwise.h"
#include "recurrent.h"

#define FL_GATHER_AXES 8

/* Status of a step that read an index outside its axis (take_step). */
#define FL_PLAN_BAD_INDEX (-9)
/* Status of a Winograd step that met a non-finite value without the direct sums' weights
 * (conv2d_step): the call is the Python plan's. */
#define FL_PLAN_NOT_FINITE (-10)

/* Status of a loop step that would pass the iteration limit a file's own trip count runs
 * under (loop_step): the call is the Python plan's, which raises the limit's error. */
#define FL_PLAN_LOOP_LIMIT (-11)
/* Status of a loop step that ran another number of iterations than its stacked outputs hold
 * (loop_step): the plan's shapes do not fit the call, which is the Python plan's. */
#define FL_PLAN_OTHER_SHAPES (-12)

enum { FL_MAP_F32, FL_MAP_F64, FL_MAP_I64, FL_MAP_I32, FL_MAP_BOOL, FL_MAP_I8, FL_MAP_U8, FL_MAP_I16, FL_MAP_U16 };
enum {
    FL_MAP_EQ, FL_MAP_LT, FL_MAP_LE, FL_MAP_GT, FL_MAP_GE, FL_MAP_WHERE, FL_MAP_CAST, FL_MAP_NOT, FL_MAP_AND,
    FL_MAP_OR, FL_MAP_XOR, FL_MAP_ISNAN, FL_MAP_ADD, FL_MAP_SUB, FL_MAP_MUL, FL_MAP_DIV, FL_MAP_MIN, FL_MAP_MAX,
    FL_MAP_CLIP, FL_MAP_SQRT, FL_MAP_NEG, FL_MAP_ABS, FL_MAP_RECIPROCAL, FL_MAP_DEQUANTIZE
};

enum {
    FL_REDUCE_SUM,
    FL_REDUCE_MEAN,
    FL_REDUCE_MAX,
    FL_REDUCE_MIN,
    FL_REDUCE_L1,
    FL_REDUCE_L2,
    FL_REDUCE_SUM_SQUARE,
    FL_REDUCE_ARGMAX,
    FL_REDUCE_ARGMIN
};

typedef int (*fl_step_fn)(void *ctx);

typedef struct {
    fl_step_fn fn;
    void *ctx;
} fl_plan_step;

typedef struct {
    int naxes, inner_run;
    int64_t dims[FL_GATHER_AXES];
    int64_t dst_strides[FL_GATHER_AXES];
    const int64_t *maps[FL_GATHER_AXES];
    int64_t firsts[FL_GATHER_AXES], steps[FL_GATHER_AXES];
    const void *src;
    void *dst;
    int elem;                      /* bytes per value: 1, 2, 4 or 8 */
    unsigned char fill[8];         /* the fill value's bytes (its first `elem`) */
} fl_gather_args;

typedef struct {
    int64_t batch, rows, cols, src_batch, src_row, dst_batch, dst_row;
    const float *src;
    float *dst;
} fl_transpose_args;

typedef struct {
    int64_t n, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, ldw;
    const float *x, *pw, *bias, *res, *pu;
    int code, res_code, tile, nchw_in, nchw_out;
    float alpha, res_alpha;
    float *y;
} fl_conv2d_args;

typedef struct {
    int64_t n, h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo;
    const float *x, *wk, *bias;
    int code;
    float alpha;
    float *y;
} fl_depthwise_args;

typedef struct {
    int64_t n, h, w, cin, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo;
    const float *x, *wt, *bias;
    int code, nchw;
    float alpha;
    float *y;
} fl_conv_transpose_args;

typedef struct {
    fl_rnn_args a;
    int serial;
} fl_rnn_step_args;

typedef struct {
    int64_t n;
    fl_rnn_args a[FL_RNN_MAX_LOOPS];
} fl_rnn_loops_step_args;

typedef struct {
    int64_t n, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, ho, wo;
    int is_max, count_include_pad;
    const float *x;
    float *y;
} fl_pool_args;

typedef struct {
    int64_t m, n;
    const float *x, *scale, *shift;
    float *out;
} fl_scale_shift_args;

typedef struct {
    int64_t batch, m, n, k, sa, sb;
    const float *a, *b;
    float *c;
} fl_batched_matmul_args;

typedef struct {
    int64_t m, n, k, ldw;
    const float *x, *w, *pw, *bias;
    int code;
    float alpha;
    float *y;
} fl_dense_args;

typedef struct {
    int64_t size, row;
    int code;
    float alpha;
    const float *x;
    float *y;
} fl_activation_args;

typedef struct {
    int64_t n;
    const float *a, *b;
    int code;
    float alpha;
    float *out;
} fl_add_act_args;

typedef struct {
    int64_t samples, inner, c;
    int n_insns, n_regs, n_operands;
    const fl_ew_insn *insns;
    float *out;
    fl_ew_operand operands[]; /* n_operands */
} fl_elementwise_args;

typedef struct {
    int64_t nb, nh, tq, tk, d, dv;
    int64_t q_st[3], k_st[3], v_st[3], bias_st[3], out_st[3];
    const float *q, *k, *v, *bias;
    float scale;
    int causal, empty;
    float *out;
} fl_attention_step_args;

typedef struct {
    int64_t m, n;
    const float *x, *gamma, *beta;
    float eps;
    int rms;
    float *out;
} fl_layer_norm_args;

typedef struct {
    int64_t outer, n, count, run, elem;
    const void *idx;
    int idx32;
    const char *src;
    char *dst;
} fl_take_args;

typedef struct {
    int64_t outer, r, inner;
    int op, last;                  /* last: ARGMAX / ARGMIN take the last of equal values */
    const float *x;
    float *y;                      /* the values; for ARGMAX / ARGMIN NULL, and ... */
    int64_t *index;                /* ... their indices here */
} fl_reduce_args;

typedef struct {
    int op, naxes, n_in, out_type;
    int types[3];
    int64_t dims[FL_GATHER_AXES];
    int64_t strides[3][FL_GATHER_AXES];
    const void *in[3];
    void *out;
} fl_map_args;

int fl_gather(void *a);
int fl_map_step(void *a);
int fl_take_step(void *a);
int fl_reduce_step(void *a);
int fl_transpose_step(void *a);
int fl_layer_norm_step(void *a);
int fl_attention_step(void *a);
int fl_elementwise_step(void *a);
int fl_conv2d_step(void *a);
int fl_depthwise_step(void *a);
int fl_conv_transpose_step(void *a);
int fl_dense_step(void *a);
int fl_batched_matmul_step(void *a);
int fl_pool_step(void *a);
int fl_scale_shift_step(void *a);
int fl_rnn_step(void *a);
int fl_rnn_loops_step(void *a);
int fl_activation_step(void *a);
int fl_add_act_step(void *a);
typedef struct {
    const char *src;
    char *dst;
    int64_t nbytes, src_step, dst_step;
} fl_loop_copy;

typedef struct {
    const fl_plan_step *body;
    int64_t nbody;
    const int64_t *trips;       /* the trip count M, or NULL: none */
    const unsigned char *cond;  /* the first condition, or NULL: true */
    const unsigned char *cond_out;
    int64_t *counter;
    int64_t most, expect;       /* -1: none */
    const fl_loop_copy *init, *before, *after;
    int64_t ninit, nbefore, nafter;
} fl_loop_args;

int fl_loop_step(void *a);
int fl_plan_run(const fl_plan_step *steps, int64_t n, int64_t *failed, int64_t *ns);
#endif
