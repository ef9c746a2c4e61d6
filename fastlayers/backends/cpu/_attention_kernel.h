/* Scaled dot-product attention of one (batch, head) pair, AVX-512:
 *     s = softmax(scale q k^T + bias, masked past the causal cut),   out = s v,
 * q (tq, d), k (tk, d), v (tk, dv), s (tq, tk) and out (tq, dv) row major with any row stride.
 * k^T and v are packed into the caller's buffer (k^T by a transposing pack) and both products
 * run on the packed sgemm (_sgemm_kernel.h): OpenBLAS, which packs its operands on every call
 * too, ran these 128 x 128 x 64 products at 72-79 GFLOP/s against 105 for the packed kernel
 * (one thread). The softmax runs one row at a time while s is in cache: scale, bias and max in
 * one pass, exp (fl_vexp, _vexp_kernel.h) and sum in a second, the normalization in a third;
 * it took about half the time per element of the Numba row kernel.
 *
 * Masks: bias rows (ldbias floats apart, 0 to read one row for every query; NULL for none) are
 * added to the scaled scores, -inf masking a key. With causal set, keys past the query's index
 * are masked and their weights written 0. A row whose every key is masked becomes NaN, 0 or
 * 1/tk for empty 0, 1 or 2. Weights below 2^-126 flush to 0 (the masked ones: exactly 0), a NaN
 * score makes its row NaN.
 */
#ifndef FL_ATTENTION_KERNEL_H
#define FL_ATTENTION_KERNEL_H
#include <math.h>
#include <stdint.h>

#include "_vexp_kernel.h"
#include "_sgemm_kernel.h"

#if FL_HAVE_KERNEL && FL_VEXP

/* b (k, n) = bt^T packed as fl_pack_all packs b, for bt (n, k) with row stride ldbt:
 * pb[panel][p][j] = bt[panel * NR + j, p], zero past row n of bt; one float at a time. */
static void fl_pack_t_scalar(const float *bt, int64_t ldbt, int64_t k, int64_t n, float *pb) {
    for (int64_t jr = 0; jr < n; jr += FL_NR) {
        int64_t nr = n - jr < FL_NR ? n - jr : FL_NR;
        float *dst = pb + jr * k;
        if (nr < FL_NR) memset(dst, 0, (size_t)(k * FL_NR) * sizeof(float));
        for (int64_t j = 0; j < nr; ++j) {
            const float *src = bt + (jr + j) * ldbt;
            for (int64_t p = 0; p < k; ++p) dst[p * FL_NR + j] = src[p];
        }
    }
}

/* The weight of a row whose keys are all masked. */
static float fl_empty_weight(int64_t empty, int64_t tk) {
    return empty == 0 ? NAN : (empty == 1 ? 0.0f : 1.0f / (float)tk);
}

/* The 16 x 16 block at src (rows lds floats apart) transposed into dst (rows ldd apart):
 * unpacks of 32- and 64-bit pairs, then two rounds of 128-bit lane shuffles. */
FL_VEXP_TARGET static inline void fl_transpose16(const float *src, int64_t lds, float *dst,
                                                  int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#define FL_PD(x) _mm512_castps_pd(x)
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(FL_PD(t[i]), FL_PD(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(FL_PD(t[i]), FL_PD(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(FL_PD(t[i + 1]), FL_PD(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(FL_PD(t[i + 1]), FL_PD(t[i + 3])));
    }
#undef FL_PD
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; ++i) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; ++i) {
        _mm512_storeu_ps(dst + i * ldd, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
        _mm512_storeu_ps(dst + (i + 8) * ldd, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd));
    }
}

/* fl_pack_t_scalar with the whole 16 x 16 blocks transposed in registers (the scalar pack
 * took about a tenth of the pair's time). */
FL_VEXP_TARGET static void fl_pack_t(const float *bt, int64_t ldbt, int64_t k, int64_t n,
                                      float *pb) {
    int64_t n16 = n / 16 * 16, k16 = k / 16 * 16;
    if (n16 == 0 || k16 == 0) {
        fl_pack_t_scalar(bt, ldbt, k, n, pb);
        return;
    }
    for (int64_t j = 0; j < n16; j += 16) {
        float *dst = pb + (j / FL_NR) * FL_NR * k + j % FL_NR;
        for (int64_t p = 0; p < k16; p += 16)
            fl_transpose16(bt + j * ldbt + p, ldbt, dst + p * FL_NR, FL_NR);
        for (int64_t p = k16; p < k; ++p)
            for (int64_t i = 0; i < 16; ++i) dst[p * FL_NR + i] = bt[(j + i) * ldbt + p];
    }
    if (n16 < n || n % FL_NR) {       /* the last panel's rows past n16, zero past n */
        int64_t jr = n16 / FL_NR * FL_NR;
        float *dst = pb + jr * k;
        for (int64_t p = 0; p < k; ++p)
            for (int64_t j = n16; j < jr + FL_NR; ++j)
                dst[p * FL_NR + j - jr] = j < n ? bt[j * ldbt + p] : 0.0f;
    }
}

/* row[0:n] = softmax(scale row + brow) over its first n entries (brow NULL: no bias), row[n:tk]
 * = 0; the whole row the empty weight when every entry is -inf. */
FL_VEXP_TARGET static void fl_softmax_row(float *row, int64_t tk, int64_t n, float scale,
                                           const float *brow, int64_t empty) {
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), vs);
        if (brow) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, brow + j));
        _mm512_mask_storeu_ps(row + j, m, x);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, x);   /* NaN: the exp pass */
    }
    for (int64_t j = n; j < tk; ++j) row[j] = 0.0f;
    float mx = _mm512_reduce_max_ps(vmax);
    if (mx == -INFINITY) {
        float fill = fl_empty_weight(empty, tk);
        for (int64_t j = 0; j < tk; ++j) row[j] = fill;
        return;
    }
    const __m512 vm = _mm512_set1_ps(mx), lo = _mm512_set1_ps(-87.3365478515625f);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vm);
        __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), fl_vexp(x));
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
        _mm512_mask_storeu_ps(row + j, m, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    }
}

/* Scores per block of query rows (64 Ki floats: 256 KiB, a quarter of L2): each block's rows
 * go through q k^T, the softmax and s v while they are in cache; whole 14-row tiles, at least
 * one, and no more than the tq rows there are. At the length (128 keys) every query
 * row is in one block. */
static int64_t fl_attention_block_rows(int64_t tq, int64_t tk) {
    int64_t rows = 65536 / (tk > 0 ? tk : 1) / FL_MR * FL_MR;
    int64_t all = (tq + FL_MR - 1) / FL_MR * FL_MR;
    rows = rows < FL_MR ? FL_MR : rows;
    return rows < all ? rows : all;
}

/* Floats of the buffer fl_attention_pair needs: k^T (d, tk) and v (tk, dv) packed, and where
 * the weights are not kept (s NULL) one block of scores. */
static int64_t fl_attention_buffer_floats(int64_t tq, int64_t tk, int64_t d, int64_t dv,
                                          int64_t keep_weights) {
    return fl_packed_floats(d, tk) + fl_packed_floats(tk, dv) +
           (keep_weights ? 0 : fl_attention_block_rows(tq, tk) * tk);
}

/* One pair (see the file comment), k^T and v packed into pb (fl_attention_buffer_floats). With
 * s NULL the weights are not kept: each block's scores live in pb, so long keys need no
 * (tq, tk) matrix. */
static void fl_attention_pair(int64_t tq, int64_t tk, int64_t d, int64_t dv, const float *q,
                              int64_t ldq, const float *k, int64_t ldk, const float *v,
                              int64_t ldv, float scale, const float *bias, int64_t ldbias,
                              int64_t causal, int64_t empty, float *s, int64_t lds, float *out,
                              int64_t ldo, float *pb) {
    float *pv = pb + fl_packed_floats(d, tk);
    int64_t block = fl_attention_block_rows(tq, tk);
    float *scratch = s ? 0 : pv + fl_packed_floats(tk, dv);
    if (!s) lds = tk;
    fl_pack_t(k, ldk, d, tk, pb);
    fl_pack_all(v, ldv, tk, dv, pv);
    for (int64_t i0 = 0; i0 < tq; i0 += block) {
        int64_t rows = tq - i0 < block ? tq - i0 : block;
        float *sb = scratch ? scratch : s + i0 * lds;
        fl_sgemm_packed(rows, tk, d, q + i0 * ldq, ldq, pb, 0.0f, sb, lds);
        for (int64_t i = i0; i < i0 + rows; ++i) {
            int64_t n = causal && i + 1 < tk ? i + 1 : tk;
            fl_softmax_row(sb + (i - i0) * lds, tk, n, scale, bias ? bias + i * ldbias : 0,
                           empty);
        }
        fl_sgemm_packed(rows, dv, tk, sb, lds, pv, 0.0f, out + i0 * ldo, ldo);
    }
}

static int fl_attention_supported(void) { return fl_supported(); }

#else
/* Without the AVX-512 kernels callers keep the OpenBLAS and Numba path. */
static int fl_attention_supported(void) { return 0; }
static int64_t fl_attention_buffer_floats(int64_t tq, int64_t tk, int64_t d, int64_t dv,
                                          int64_t keep_weights) {
    (void)tq; (void)tk; (void)d; (void)dv; (void)keep_weights;
    return 0;
}
static void fl_attention_pair(int64_t tq, int64_t tk, int64_t d, int64_t dv, const float *q,
                              int64_t ldq, const float *k, int64_t ldk, const float *v,
                              int64_t ldv, float scale, const float *bias, int64_t ldbias,
                              int64_t causal, int64_t empty, float *s, int64_t lds, float *out,
                              int64_t ldo, float *pb) {
    (void)tq; (void)tk; (void)d; (void)dv; (void)q; (void)ldq; (void)k; (void)ldk; (void)v;
    (void)ldv; (void)scale; (void)bias; (void)ldbias; (void)causal; (void)empty; (void)s;
    (void)lds; (void)out; (void)ldo; (void)pb;
}
#endif
#endif
