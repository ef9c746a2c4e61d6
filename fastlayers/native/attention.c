/* Attention (attention.h): s = softmax(scale q k^T + bias), out = s v per (batch, head) pair,
 * and the Transformer encoder layer built on it, on gemm.c's packed sgemm and rows.c's
 * epilogue and layer-norm row. Compiled once per ISA (kernels.inc).
 *
 * A pair packs k^T and v into its thread's buffer (gemm.h layout) and runs both products on
 * the packed sgemm, query rows in blocks whose scores fit 256 KiB: each block goes through
 * q k^T, the softmax and s v while it is in cache. Without the weights the block's scores live
 * in the thread's buffer, so long keys make no (tq, tk) array. Pairs are shared among the
 * pool's threads; with fewer pairs than threads each pair's query rows are split too.
 *
 * The softmax row: the max of scale s + bias in a pass that only reads, exp and sum in a second;
 * kept weights are normalized in a third, otherwise each row of s v is scaled by 1 / sum (dv
 * floats rather than tk). Weights below 2^-126 flush to 0 (masked keys: exactly 0); a NaN score
 * makes its row NaN. */

#include "attention.h"
#include "gemm_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

/* Scores per block of query rows: 64 Ki floats (256 KiB, a quarter of L2). */
#define ATTN_BLOCK_FLOATS 65536
/* Fewest multiply-adds (x2) in one thread's share of attention or of an encoder phase: a
 * quarter of the products' GEMM_MIN_SHARE_FLOPS, as a small pair costs several times its
 * multiply-adds (packing k^T and v, the softmax's exponentials; docs/design.md, "Attention"). */
#define ATTN_MIN_SHARE_FLOPS (INT64_C(1) << 19)
/* Fewest query rows per part when a pair's rows are split among threads (each part packs
 * k^T and v again). */
#define ATTN_MIN_SPLIT_ROWS 64
/* Floats of one thread's post-attention rows through the encoder's output projection, norm
 * and feed-forward: the hidden rows of a block (512 KiB, half of L2) stay in L2. */
#define ATTN_HIDDEN_BLOCK_FLOATS (1 << 17)
/* Output floats per block of the encoder's q/k/v projection whose bias pass runs while the
 * block is in L2 (256 KiB). */
#define ATTN_QKV_BLOCK_FLOATS (1 << 16)

/* Each thread's buffer for one task (a pair's packed k^T / v / scores, an encoder block's
 * rows) and the calling thread's buffer of an encoder layer's q|k|v and attention rows. */
static __thread fl_buf attn_task_buf, attn_layer_buf;

/* The weight of a row whose keys are all masked. */
static float attn_empty_weight(int empty, int64_t tk) {
    return empty == 0 ? NAN : (empty == 1 ? 0.0f : 1.0f / (float)tk);
}

/* x[j] = scale row[j] (+ brow[j]): FL_VW scores from j. */
FL_INLINE fl_vf attn_vscore(const float *row, const float *brow, int64_t j, float scale,
                            const int has_bias) {
    fl_vf x = fl_load(row + j) * scale;
    return has_bias ? x + fl_load(brow + j) : x;
}

/* attn_softmax_row with or without a bias (has_bias a constant: one copy each). */
FL_INLINE float attn_softmax_row_as(float *row, int64_t tk, int64_t n, float scale,
                                    const float *brow, int empty, int normalize,
                                    const int has_bias) {
    int64_t j = 0, nv = n / FL_VW * FL_VW;
    /* four maxima: a chain of comparisons and selects per vector otherwise */
    fl_vf m0 = fl_set1(-__builtin_inff()), m1 = m0, m2 = m0, m3 = m0;
    for (; j + 4 * FL_VW <= n; j += 4 * FL_VW) {
        m0 = fl_vmax(attn_vscore(row, brow, j, scale, has_bias), m0);
        m1 = fl_vmax(attn_vscore(row, brow, j + FL_VW, scale, has_bias), m1);
        m2 = fl_vmax(attn_vscore(row, brow, j + 2 * FL_VW, scale, has_bias), m2);
        m3 = fl_vmax(attn_vscore(row, brow, j + 3 * FL_VW, scale, has_bias), m3);
    }
    for (; j < nv; j += FL_VW) m0 = fl_vmax(attn_vscore(row, brow, j, scale, has_bias), m0);
    /* a NaN the maxima skipped reaches every weight through the sum */
    float m = fl_hmax(fl_vmax(fl_vmax(m0, m1), fl_vmax(m2, m3)));
    for (; j < n; ++j) m = FL_MAX(row[j] * scale + (has_bias ? brow[j] : 0.0f), m);
    for (j = n; j < tk; ++j) row[j] = 0.0f;
    if (m == -__builtin_inff()) {
        float fill = attn_empty_weight(empty, tk);
        for (j = 0; j < n; ++j) {
            float x = row[j] * scale + (has_bias ? brow[j] : 0.0f);
            if (x != x) fill = NAN;
        }
        for (j = 0; j < tk; ++j) row[j] = fill;
        return 1.0f;
    }
    fl_vf vs = fl_set1(0.0f);
    for (j = 0; j < nv; j += FL_VW) {
        fl_vf e = fl_vexp_bounded(attn_vscore(row, brow, j, scale, has_bias) - m);
        fl_store(row + j, e);
        vs += e;
    }
    float sum = fl_hsum(vs);
    for (; j < n; ++j) {
        row[j] = fl_vexp_bounded(fl_set1(row[j] * scale + (has_bias ? brow[j] : 0.0f) - m))[0];
        sum += row[j];
    }
    float inv = 1.0f / sum;
    if (!normalize) return inv;
    for (j = 0; j < nv; j += FL_VW) fl_store(row + j, fl_load(row + j) * inv);
    for (; j < n; ++j) row[j] *= inv;
    return 1.0f;
}

/* row[0:n] = softmax(scale row[0:n] + brow[0:n]) (brow NULL: no bias), row[n:tk] = 0; the
 * whole row the empty weight when the first n are all -inf (NaN when one is NaN). With
 * `normalize` 0 the row is left as exp(x - max x) and 1 / its sum returned (the caller scales
 * the product s v instead: dv floats a row rather than tk); else, and for an empty row, 1. */
static float attn_softmax_row(float *row, int64_t tk, int64_t n, float scale, const float *brow,
                              int empty, int normalize) {
    return brow ? attn_softmax_row_as(row, tk, n, scale, brow, empty, normalize, 1)
                : attn_softmax_row_as(row, tk, n, scale, brow, empty, normalize, 0);
}

/* row[0:n] *= a. */
static void attn_scale_row(float *row, int64_t n, float a) {
    int64_t j = 0;
    for (; j + FL_VW <= n; j += FL_VW) fl_store(row + j, fl_load(row + j) * a);
    for (; j < n; ++j) row[j] *= a;
}

/* Query rows per block: whole register tiles whose scores fit ATTN_BLOCK_FLOATS, at least one
 * tile, no more than the rows there are. */
static int64_t attn_block_rows(int64_t rows, int64_t tk) {
    int64_t block = ATTN_BLOCK_FLOATS / FL_MAX(tk, 1) / GEMM_MR * GEMM_MR;
    return FL_MIN(FL_MAX(block, GEMM_MR), rows);
}

/* One (batch, head) pair, query rows i0:i1: s = softmax(scale q k^T + bias) and out = s v.
 * q (tq, d), k (tk, d), v (tk, dv), out (tq, dv) rows ldq / ldk / ldv / ldo apart; bias rows
 * ldb apart (0: one row for every query), NULL for none; s (tq, tk) rows tk apart, or NULL
 * (not kept). k^T and v are packed into the thread's buffer. */
static int attn_pair(int64_t i0, int64_t i1, int64_t tk, int64_t d, int64_t dv, const float *q,
                     int64_t ldq, const float *k, int64_t ldk, const float *v, int64_t ldv,
                     float scale, const float *bias, int64_t ldb, int causal, int empty,
                     float *s, float *out, int64_t ldo) {
    int64_t fk = fl_packed_floats(d, tk), fv = fl_packed_floats(tk, dv);
    int64_t block = attn_block_rows(i1 - i0, tk);
    float *pk = fl_buf_floats(&attn_task_buf, (size_t)(fk + fv + (s ? 0 : block * (tk + 1))));
    if (!pk) return -1;
    /* without the weights: a block of scores and each row's 1 / sum */
    float *pv = pk + fk, *scratch = s ? 0 : pv + fv, *inv = s ? 0 : scratch + block * tk;
    FL_FN(pack)(k, ldk, 1, d, tk, pk);
    FL_FN(pack)(v, ldv, 0, tk, dv, pv);
    for (int64_t i = i0; i < i1; i += block) {
        int64_t rows = FL_MIN(block, i1 - i);
        float *sb = s ? s + i * tk : scratch;
        if (FL_FN(sgemm_packed)(rows, tk, d, q + i * ldq, ldq, pk, 0, sb, tk)) return -1;
        for (int64_t r = 0; r < rows; ++r) {
            float a = attn_softmax_row(sb + r * tk, tk, causal ? FL_MIN(i + r + 1, tk) : tk,
                                       scale, bias ? bias + (i + r) * ldb : 0, empty, !inv);
            if (inv) inv[r] = a;
        }
        if (FL_FN(sgemm_packed)(rows, dv, tk, sb, tk, pv, 0, out + i * ldo, ldo)) return -1;
        if (inv)
            for (int64_t r = 0; r < rows; ++r) attn_scale_row(out + (i + r) * ldo, dv, inv[r]);
    }
    return 0;
}

/* Parts each pair's query rows are cut into: the fewest that give every thread an equal count
 * of parts or at least four parts per thread, parts of at least ATTN_MIN_SPLIT_ROWS rows. */
static int64_t attn_row_parts(int64_t pairs, int64_t tq) {
    int64_t threads = fl_pool_get_threads();
    int64_t most = FL_MAX(1, tq / ATTN_MIN_SPLIT_ROWS), parts = 1;
    if (threads <= 1) return 1;
    while (parts < most && (pairs * parts) % threads && pairs * parts < 4 * threads) ++parts;
    return parts;
}

typedef struct {
    int64_t nh, tq, tk, d, dv, parts;
    const float *q, *k, *v, *bias;
    const int64_t *q_st, *k_st, *v_st, *bias_st, *out_st;
    float scale;
    int causal, empty, status;
    float *s, *out;
} attn_ctx;

/* Units u0:u1, unit u the part u % parts of pair u / parts; consecutive parts of one pair run
 * as one call (k^T and v packed once). */
static void attn_task(void *p, int64_t u0, int64_t u1) {
    attn_ctx *x = (attn_ctx *)p;
    for (int64_t u = u0; u < u1;) {
        int64_t pair = u / x->parts, b = pair / x->nh, h = pair % x->nh;
        int64_t last = FL_MIN(u1, (pair + 1) * x->parts);
        int64_t i0 = x->tq * (u - pair * x->parts) / x->parts;
        int64_t i1 = x->tq * (last - pair * x->parts) / x->parts;
        const float *bias = x->bias ? x->bias + b * x->bias_st[0] + h * x->bias_st[1] : 0;
        int st = attn_pair(i0, i1, x->tk, x->d, x->dv,
                           x->q + b * x->q_st[0] + h * x->q_st[1], x->q_st[2],
                           x->k + b * x->k_st[0] + h * x->k_st[1], x->k_st[2],
                           x->v + b * x->v_st[0] + h * x->v_st[1], x->v_st[2], x->scale, bias,
                           x->bias ? x->bias_st[2] : 0, x->causal, x->empty,
                           x->s ? x->s + pair * x->tq * x->tk : 0,
                           x->out + b * x->out_st[0] + h * x->out_st[1], x->out_st[2]);
        if (st) x->status = st;
        u = last;
    }
}

/* Every pair of ctx (nh, tq, tk, d, dv set) on the pool's threads. */
static int attn_run(attn_ctx *x, int64_t pairs) {
    x->parts = attn_row_parts(pairs, x->tq);
    int64_t unit_flops = FL_MAX(1, 2 * x->tq * x->tk * (x->d + x->dv) / x->parts);
    x->status = 0;
    fl_parallel(pairs * x->parts, FL_MAX(1, ATTN_MIN_SHARE_FLOPS / unit_flops), attn_task, x);
    return x->status;
}

/* out[b, h] = softmax(scale q[b, h] k[b, h]^T + bias[b, h]) v[b, h] (attention.h).
 * q (nb, nh, tq, d), k (nb, nh, tk, d), v (nb, nh, tk, dv), out (nb, nh, tq, dv) through their
 * (batch, head, row) strides; s (nb, nh, tq, tk) C-contiguous or NULL. */
int FL_FN(attention)(int64_t nb, int64_t nh, int64_t tq, int64_t tk, int64_t d, int64_t dv,
                     const float *q, const int64_t *q_st, const float *k, const int64_t *k_st,
                     const float *v, const int64_t *v_st, float scale, const float *bias,
                     const int64_t *bias_st, int causal, int empty, float *s, float *out,
                     const int64_t *out_st) {
    if (nb <= 0 || nh <= 0 || tq <= 0 || dv <= 0) return 0;
    if (tk <= 0) return -2;
    attn_ctx x = {nh, tq, tk, d, dv, 1, q, k, v, bias, q_st, k_st, v_st, bias_st, out_st,
                  scale, causal, empty, 0, s, out};
    return attn_run(&x, nb * nh);
}

typedef struct {
    int64_t nh, tq, tk;
    float *s;
    float scale;
    const float *bias;
    const int64_t *bias_st;
    int causal, empty;
} attn_softmax_ctx;

static void attn_softmax_task(void *p, int64_t r0, int64_t r1) {
    attn_softmax_ctx *x = (attn_softmax_ctx *)p;
    for (int64_t r = r0; r < r1; ++r) {
        int64_t i = r % x->tq, pair = r / x->tq, b = pair / x->nh, h = pair % x->nh;
        const float *brow = x->bias ? x->bias + b * x->bias_st[0] + h * x->bias_st[1] +
                                          i * x->bias_st[2]
                                    : 0;
        attn_softmax_row(x->s + r * x->tk, x->tk, x->causal ? FL_MIN(i + 1, x->tk) : x->tk,
                         x->scale, brow, x->empty, 1);
    }
}

/* s[b, h, i] = softmax(scale s[b, h, i] + bias[b, h, i]) over keys (attention.h), in place.
 * s (nb, nh, tq, tk) C-contiguous; the rows shared among the pool's threads. */
int FL_FN(attention_softmax)(int64_t nb, int64_t nh, int64_t tq, int64_t tk, float *s,
                             float scale, const float *bias, const int64_t *bias_st,
                             int causal, int empty) {
    if (nb <= 0 || nh <= 0 || tq <= 0 || tk <= 0) return 0;
    attn_softmax_ctx x = {nh, tq, tk, s, scale, bias, bias_st, causal, empty};
    fl_parallel(nb * nh * tq, FL_MAX(1, 4096 / tk), attn_softmax_task, &x);
    return 0;
}

/* ------------------------------------------------------------------------------ encoder */

typedef struct {
    int64_t m, e, f, block;
    const float *x, *const *pw, *const *vec;
    float eps1, eps2;
    int code, norm_first, status;
    float *qkv, *att, *out;
} attn_enc_ctx;

/* c[i] = layer_norm(c[i] + bias + r[i]) for rows 0:rows of n floats (c rows ldc apart, r
 * rows ldr apart), gamma / beta NULL for none; norm 0: no norm. */
static void attn_residual_norm(int64_t rows, int64_t n, float *c, int64_t ldc, const float *bias,
                               const float *r, int64_t ldr, int norm, const float *gamma,
                               const float *beta, float eps) {
    for (int64_t i = 0; i < rows; ++i) {
        float *ci = c + i * ldc;
        const float *ri = r + i * ldr;
        if (bias)
            for (int64_t j = 0; j < n; ++j) ci[j] += bias[j] + ri[j];
        else
            for (int64_t j = 0; j < n; ++j) ci[j] += ri[j];
        if (norm) FL_FN(rows_layer_norm_row)(n, ci, gamma, beta, eps, 0, ci);
    }
}

/* Rows per block when `rows` rows go through in blocks of at most `most` rows (a multiple of
 * GEMM_MR): the fewest blocks, of near-equal whole tiles (no short last block). */
static int64_t attn_even_block(int64_t rows, int64_t most) {
    int64_t blocks = (rows + most - 1) / most, tiles = (rows + GEMM_MR - 1) / GEMM_MR;
    return FL_MIN((tiles + blocks - 1) / blocks * GEMM_MR, rows);
}

/* Tiles t0:t1 (GEMM_MR rows each) of q|k|v = norm1(x) @ w_qkv + b_qkv (pre-norm) or
 * x @ w_qkv + b_qkv, in blocks whose bias pass finds them in L2. */
static void attn_enc_qkv_task(void *p, int64_t t0, int64_t t1) {
    attn_enc_ctx *c = (attn_enc_ctx *)p;
    int64_t e = c->e, r1 = FL_MIN(t1 * GEMM_MR, c->m);
    int64_t block = attn_even_block(
        r1 - t0 * GEMM_MR, FL_MAX(ATTN_QKV_BLOCK_FLOATS / (3 * e) / GEMM_MR, 1) * GEMM_MR);
    float *xn = 0;
    if (c->norm_first && !(xn = fl_buf_floats(&attn_task_buf, (size_t)(block * e)))) {
        c->status = -1;
        return;
    }
    for (int64_t i = t0 * GEMM_MR; i < r1; i += block) {
        int64_t rows = FL_MIN(block, r1 - i);
        const float *src = c->x + i * e;
        float *y = c->qkv + i * 3 * e;
        if (xn) {
            for (int64_t r = 0; r < rows; ++r)
                FL_FN(rows_layer_norm_row)(e, src + r * e, c->vec[4], c->vec[5], c->eps1, 0,
                                           xn + r * e);
            src = xn;
        }
        if (FL_FN(sgemm_packed)(rows, 3 * e, e, src, e, c->pw[0], 0, y, 3 * e)) {
            c->status = -1;
            return;
        }
        if (c->vec[0])
            FL_FN(rows_bias_act_range)(0, rows, 3 * e, y, 3 * e, c->vec[0], FL_LINEAR, 0.0f, y,
                                       3 * e);
    }
}

/* Tiles t0:t1 of the rows after attention, in blocks of at most c->block rows through the
 * thread's buffer: y = att w_o + b_o + x; post-norm: y = norm1(y), out = norm2(y + ff(y));
 * pre-norm: out = y + ff(norm2(y)); ff(z) = f(z w_1 + b_1) w_2 + b_2. With f = 0 (the
 * attention block alone) out = att w_o + b_o, straight into out. */
static void attn_enc_rows_task(void *p, int64_t t0, int64_t t1) {
    attn_enc_ctx *c = (attn_enc_ctx *)p;
    int64_t e = c->e, f = c->f, r1 = FL_MIN(t1 * GEMM_MR, c->m);
    int64_t block = attn_even_block(r1 - t0 * GEMM_MR, c->block);
    const float *const *pw = c->pw, *const *vec = c->vec;
    if (f == 0) {   /* attention block only: out = att w_o + b_o */
        for (int64_t i = t0 * GEMM_MR; i < r1; i += block) {
            int64_t rows = FL_MIN(block, r1 - i);
            float *out = c->out + i * e;
            if (FL_FN(sgemm_packed)(rows, e, e, c->att + i * e, e, pw[1], 0, out, e)) {
                c->status = -1;
                return;
            }
            if (vec[1])
                FL_FN(rows_bias_act_range)(0, rows, e, out, e, vec[1], FL_LINEAR, 0.0f, out, e);
        }
        return;
    }
    float *y = fl_buf_floats(&attn_task_buf, (size_t)(block * (2 * e + f)));
    if (!y) {
        c->status = -1;
        return;
    }
    float *yn = y + block * e, *hid = yn + block * e;
    for (int64_t i = t0 * GEMM_MR; i < r1; i += block) {
        int64_t rows = FL_MIN(block, r1 - i);
        float *out = c->out + i * e;
        int st = FL_FN(sgemm_packed)(rows, e, e, c->att + i * e, e, pw[1], 0, y, e);
        attn_residual_norm(rows, e, y, e, vec[1], c->x + i * e, e, !c->norm_first, vec[4],
                           vec[5], c->eps1);
        const float *src = y;
        if (c->norm_first) {
            for (int64_t r = 0; r < rows; ++r)
                FL_FN(rows_layer_norm_row)(e, y + r * e, vec[6], vec[7], c->eps2, 0, yn + r * e);
            src = yn;
        }
        st |= FL_FN(sgemm_packed)(rows, f, e, src, e, pw[2], 0, hid, f);
        if (vec[2] || c->code != FL_LINEAR)
            FL_FN(rows_bias_act_range)(0, rows, f, hid, f, vec[2], c->code, 0.0f, hid, f);
        st |= FL_FN(sgemm_packed)(rows, e, f, hid, f, pw[3], 0, out, e);
        attn_residual_norm(rows, e, out, e, vec[3], y, e, !c->norm_first, vec[6], vec[7],
                           c->eps2);
        if (st) {
            c->status = -1;
            return;
        }
    }
}

/* out = ReferenceOps.encoder_layer(x) (attention.h), or with f = 0 ReferenceOps.self_attention,
 * in three phases on the pool's threads: the q|k|v projection by rows, attention by
 * (sequence, head) pairs, the rest by rows.
 * x, out (n len, e); q|k|v (n len, 3e) and attention output (n len, e) in the calling
 * thread's buffer; s (n, heads, len, len) or NULL. */
int FL_FN(encoder_layer)(int64_t n, int64_t len, int64_t e, int64_t heads, int64_t f,
                         const float *x, const float *const *pw, const float *const *vec,
                         float eps1, float eps2, int code, int norm_first, const float *bias,
                         const int64_t *bias_st, int empty, float *s, float *out) {
    int64_t m = n * len, hd = e / FL_MAX(heads, 1);
    if (m <= 0 || e <= 0) return 0;
    if (heads <= 0 || hd * heads != e || f < 0 || (f == 0 && norm_first) || code < 0 ||
        code >= FL_N_ACTIVATIONS)
        return -2;
    float *qkv = fl_buf_floats(&attn_layer_buf, (size_t)(4 * m * e));
    if (!qkv) return -1;
    int64_t tiles = (m + GEMM_MR - 1) / GEMM_MR;
    attn_enc_ctx c = {m, e, f, 0, x, pw, vec, eps1, eps2, code, norm_first, 0, qkv,
                      qkv + 3 * m * e, out};
    c.block = FL_MAX(ATTN_HIDDEN_BLOCK_FLOATS / (f ? f : e) / GEMM_MR, 1) * GEMM_MR;
    int64_t tile_flops = 2 * GEMM_MR * 3 * e * e;
    fl_parallel(tiles, FL_MAX(1, ATTN_MIN_SHARE_FLOPS / tile_flops), attn_enc_qkv_task, &c);
    if (c.status) return c.status;
    /* q, k, v of pair (b, h): columns h hd, e + h hd, 2 e + h hd of sequence b's rows */
    const int64_t q_st[3] = {len * 3 * e, hd, 3 * e}, o_st[3] = {len * e, hd, e};
    attn_ctx a = {heads, len, len, hd, hd, 1, qkv, qkv + e, qkv + 2 * e, bias, q_st, q_st,
                  q_st, bias_st, o_st, (float)(1.0 / sqrt((double)hd)), 0, empty, 0, s,
                  c.att};
    int st = attn_run(&a, n * heads);
    if (st) return st;
    tile_flops = 2 * GEMM_MR * e * (e + 2 * f);
    fl_parallel(tiles, FL_MAX(1, ATTN_MIN_SHARE_FLOPS / tile_flops), attn_enc_rows_task, &c);
    return c.status;
}
