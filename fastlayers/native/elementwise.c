/* Elementwise programs (elementwise.h): a chain of elementwise operations run block by block,
 * so that its values between operations stay in the L1 cache and memory is read and written
 * once. Compiled once per ISA (kernels.inc).
 *
 * out[n, j] = program(operands at n, j): the positions of each sample split into blocks of a
 * whole number of channel periods, each instruction a vector loop over the block into a
 * register (a block of floats) or, for the last, into out. A channel operand is tiled over the
 * block once per sample and block size, so lane i of every block reads channel i % c; a
 * position operand is spread over the block's positions once per block (lane i reads the value
 * of position i / c). */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elementwise.h"
#include "rows_internal.h"
#include "threadpool.h"

/* Floats per block, about: a block of each register and tile stays in L1. */
#define EW_BLOCK 1024
/* Fewest floats a thread's share takes. */
#define EW_MIN_SHARE 16384

typedef struct {
    int64_t samples, inner, c, block, blocks;  /* blocks per sample */
    int n_operands, n_insns, n_regs;
    const fl_ew_operand *operands;
    const fl_ew_insn *insns;
    float *out;
    int failed;
} ew_ctx;

FL_INLINE fl_vf ew_op(int op, fl_vf x, fl_vf y) {
    switch (op) {
    case FL_EW_ADD: return x + y;
    case FL_EW_SUB: return x - y;
    case FL_EW_MUL: return x * y;
    default: return x / y;
    }
}

/* dst[0:n] = a op b over one block, op, and whether a and b are arrays (else the splat
 * values sa / sb), constants in each caller: one loop per case, no test per vector. */
FL_INLINE void ew_binary_loop(const int op, const int va, const int vb, const float *a, fl_vf sa,
                              const float *b, fl_vf sb, float *dst, int64_t n) {
    int64_t j = 0;
    for (; j + FL_VW <= n; j += FL_VW)
        fl_store(dst + j, ew_op(op, va ? fl_load(a + j) : sa, vb ? fl_load(b + j) : sb));
    if (j < n)
        fl_store_n(dst + j, ew_op(op, va ? fl_load_n(a + j, n - j) : sa, vb ? fl_load_n(b + j, n - j) : sb), n - j);
}

/* dst[0:n] = a op b over one block (a or b NULL: the splat value av / bv). */
static void ew_binary(int op, const float *a, float av, const float *b, float bv, float *dst, int64_t n) {
    fl_vf sa = fl_set1(av), sb = fl_set1(bv);
    switch (op * 4 + (a != 0) * 2 + (b != 0)) {
#define EW_CASES(o)                                                                            \
    case o * 4 + 0: ew_binary_loop(o, 0, 0, a, sa, b, sb, dst, n); break;                      \
    case o * 4 + 1: ew_binary_loop(o, 0, 1, a, sa, b, sb, dst, n); break;                      \
    case o * 4 + 2: ew_binary_loop(o, 1, 0, a, sa, b, sb, dst, n); break;                      \
    case o * 4 + 3: ew_binary_loop(o, 1, 1, a, sa, b, sb, dst, n); break;
        EW_CASES(FL_EW_ADD) EW_CASES(FL_EW_SUB) EW_CASES(FL_EW_MUL) EW_CASES(FL_EW_DIV)
#undef EW_CASES
    default: break;
    }
}

/* dst[0:n] = sqrt, -, |.| or clip(lo, hi) of src[0:n] (NaN kept by clip). */
static void ew_unary(int op, const float *src, float *dst, int64_t n, float lo, float hi) {
    switch (op) {
    case FL_EW_SQRT: for (int64_t j = 0; j < n; ++j) dst[j] = sqrtf(src[j]); break;
    case FL_EW_NEG: for (int64_t j = 0; j < n; ++j) dst[j] = -src[j]; break;
    case FL_EW_ABS: for (int64_t j = 0; j < n; ++j) dst[j] = fabsf(src[j]); break;
    default:
        for (int64_t j = 0; j < n; ++j) {  /* min(max(v, lo), hi), NaN kept */
            float t = src[j] < lo ? lo : src[j];
            dst[j] = t > hi ? hi : t;
        }
        break;
    }
}

/* tile[i] = v[i / c] for i < len (len a multiple of c): each position's value over its c
 * channels. */
static void ew_spread(const float *v, int64_t c, int64_t len, float *tile) {
    for (int64_t i = 0; i < len; i += c, ++v) {
        fl_vf s = fl_set1(*v);
        int64_t j = 0;
        for (; j + FL_VW <= c; j += FL_VW) fl_store(tile + i + j, s);
        if (j < c) fl_store_n(tile + i + j, s, c - j);
    }
}

static void ew_task(void *p, int64_t u0, int64_t u1) {
    ew_ctx *x = (ew_ctx *)p;
    int64_t b = x->block;
    /* registers, then one tile per channel or position operand */
    float *mem = (float *)malloc((size_t)(x->n_regs + x->n_operands) * (size_t)b * sizeof(float));
    if (!mem) {
        x->failed = 1;
        return;
    }
    float *regs = mem, *tiles = mem + x->n_regs * b;
    int64_t tiled_sample = -1;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t n = u / x->blocks, start = u % x->blocks * b;
        int64_t len = FL_MIN(b, x->inner - start);
        if (n != tiled_sample) {  /* each channel operand over a block, for this sample */
            for (int k = 0; k < x->n_operands; ++k) {
                const fl_ew_operand *o = &x->operands[k];
                if (o->kind != FL_EW_CHANNEL) continue;
                const float *v = o->p + n * o->stride;
                for (int64_t i = 0; i < b; i += x->c) memcpy(tiles + k * b + i, v, (size_t)x->c * sizeof(float));
            }
            tiled_sample = n;
        }
        for (int k = 0; k < x->n_operands; ++k) {  /* each position operand over this block */
            const fl_ew_operand *o = &x->operands[k];
            if (o->kind == FL_EW_POSITION) ew_spread(o->p + n * o->stride + start / x->c, x->c, len, tiles + k * b);
        }
        for (int i = 0; i < x->n_insns; ++i) {
            const fl_ew_insn *in = &x->insns[i];
            float *dst = i == x->n_insns - 1 ? x->out + n * x->inner + start : regs + in->dst * b;
            const float *src[2] = {0, 0};
            float splat[2] = {0.0f, 0.0f};
            int refs[2] = {in->a, in->b};
            for (int s = 0; s < 2; ++s) {
                int r = refs[s];
                if (r < 0) {
                    src[s] = regs + (-1 - r) * b;
                } else if (s == 0 || in->op <= FL_EW_DIV) {
                    const fl_ew_operand *o = &x->operands[r];
                    if (o->kind == FL_EW_FULL) src[s] = o->p + n * o->stride + start;
                    else if (o->kind == FL_EW_CHANNEL || o->kind == FL_EW_POSITION) src[s] = tiles + r * b;
                    else splat[s] = o->p[0];
                }
            }
            if (in->op <= FL_EW_DIV) {
                ew_binary(in->op, src[0], splat[0], src[1], splat[1], dst, len);
                continue;
            }
            if (!src[0]) {  /* a unary operation of one value: the value over the block first */
                for (int64_t j = 0; j < len; ++j) dst[j] = splat[0];
                src[0] = dst;
            }
            if (in->op == FL_EW_ACT)
                FL_FN(rows_bias_act_range)(0, 1, len, src[0], len, 0, in->code, in->alpha, dst, len);
            else
                ew_unary(in->op, src[0], dst, len, in->x, in->y);
        }
    }
    free(mem);
}

int FL_FN(elementwise)(int64_t samples, int64_t inner, int64_t c, int n_operands,
                       const fl_ew_operand *operands, int n_insns, const fl_ew_insn *insns,
                       int n_regs, float *out) {
    if (samples <= 0 || inner <= 0 || n_insns <= 0) return 0;
    if (c <= 0 || inner % c) return -2;
    int64_t block = FL_MAX(1, EW_BLOCK / c) * c;
    if (block > inner) block = inner;
    ew_ctx x = {samples, inner, c, block, (inner + block - 1) / block, n_operands, n_insns, n_regs,
                operands, insns, out, 0};
    int64_t units = samples * x.blocks;
    fl_parallel_values(units, FL_MAX(1, EW_MIN_SHARE / block),
                       samples * inner * FL_MAX(1, n_insns / 2), ew_task, &x);
    return x.failed ? -1 : 0;
}
