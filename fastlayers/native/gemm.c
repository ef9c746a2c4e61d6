/* Matrix products (gemm.h): c (m, n) = a (m, k) @ b (k, n) on a register tile of MR rows x
 * two vectors of columns, per KC-row block of b. Compiled once per ISA (kernels.inc).
 *
 * A is read in place, rows lda floats apart (packing it was a pass of its own and A meets few
 * column panels in convolutions); b is read from its packed form (gemm.h), packed once for
 * weights or block by block per call into a per-thread buffer. Up to GEMM_FEW_ROWS rows of A
 * (products of small images, batches of a few rows) the blocks of b are deeper and narrower
 * (GEMM_FEW_KC x GEMM_FEW_NC): a row tile's slice of A stays in L1 while the block's panels
 * pass, the block in L2 for the next row tile. Tiles: AVX-512 14 x 32
 * (28 zmm accumulators), AVX2 6 x 16 (12 ymm), portable 6 x 8 (12 xmm / NEON q registers):
 * each is a 32-column panel's 1, 2 or 4 slices. */

#include "gemm_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

#define GEMM_KC 256                  /* rows of b per block: a tile's b slice stays in L1 */
#define GEMM_NC 256                  /* columns per block: KC x NC of b (256 KiB) stays in L2 */
#define GEMM_FEW_ROWS 64             /* up to this many rows: blocks of GEMM_FEW_KC x GEMM_FEW_NC */
#define GEMM_FEW_KC 384              /* their most rows of b (near-equal blocks; 14 rows of A in L1) */
/* ... but up to this many rows of b in one block, not two (AVX-512's 14 x 32 tile; the AVX2
 * tile gained nothing from it) */
#if FL_VW == 16
#define GEMM_FEW_KC_ONE 512
#else
#define GEMM_FEW_KC_ONE GEMM_FEW_KC
#endif
#define GEMM_FEW_NC 128              /* their columns (a 192 KiB block of b in L2) */
#define GEMM_MC 336                  /* rows of A copied per block when lda aliases in L1 */
#define GEMM_PF_ROWS 16              /* rows of b the register and thin tiles prefetch ahead */

static __thread fl_buf gemm_buf;        /* A rows copied, or b packed per call */

/* Four floats, for the 4 x 4 transposes of the transposing pack (every ISA has 128-bit
 * vectors: SSE, NEON, or the compiler's scalar lowering). */
typedef float gemm_v4 __attribute__((vector_size(16)));
typedef float gemm_v4u __attribute__((vector_size(16), aligned(4), may_alias));
typedef int32_t gemm_v4i __attribute__((vector_size(16)));
#if defined(__clang__)
#define GEMM_SHUF4(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
#define GEMM_SHUF4(a, b, i, j, k, l) __builtin_shuffle(a, b, (gemm_v4i){i, j, k, l})
#endif

/* dst[p 32 + j] = bt[j ldbt + p] for p < k, j < nr (<= 32), 0 for nr <= j < 32: one panel of
 * bt^T, bt (nr, k), by 4 x 4 blocks transposed in registers (a float at a time is several
 * times slower). */
static void gemm_pack_t_panel(const float *bt, int64_t ldbt, int64_t k, int64_t nr, float *dst) {
    int64_t j = 0, k4 = k / 4 * 4;
    for (; j + 4 <= nr; j += 4) {
        const float *s = bt + j * ldbt;
        for (int64_t p = 0; p < k4; p += 4) {
            gemm_v4 r0 = *(const gemm_v4u *)(s + p), r1 = *(const gemm_v4u *)(s + ldbt + p);
            gemm_v4 r2 = *(const gemm_v4u *)(s + 2 * ldbt + p);
            gemm_v4 r3 = *(const gemm_v4u *)(s + 3 * ldbt + p);
            gemm_v4 t0 = GEMM_SHUF4(r0, r1, 0, 4, 1, 5), t1 = GEMM_SHUF4(r0, r1, 2, 6, 3, 7);
            gemm_v4 t2 = GEMM_SHUF4(r2, r3, 0, 4, 1, 5), t3 = GEMM_SHUF4(r2, r3, 2, 6, 3, 7);
            float *d = dst + p * FL_PANEL + j;
            *(gemm_v4u *)d = GEMM_SHUF4(t0, t2, 0, 1, 4, 5);
            *(gemm_v4u *)(d + FL_PANEL) = GEMM_SHUF4(t0, t2, 2, 3, 6, 7);
            *(gemm_v4u *)(d + 2 * FL_PANEL) = GEMM_SHUF4(t1, t3, 0, 1, 4, 5);
            *(gemm_v4u *)(d + 3 * FL_PANEL) = GEMM_SHUF4(t1, t3, 2, 3, 6, 7);
        }
        for (int64_t p = k4; p < k; ++p)
            for (int i = 0; i < 4; ++i) dst[p * FL_PANEL + j + i] = s[i * ldbt + p];
    }
    for (; j < nr; ++j)
        for (int64_t p = 0; p < k; ++p) dst[p * FL_PANEL + j] = bt[j * ldbt + p];
    if (nr < FL_PANEL)
        for (int64_t p = 0; p < k; ++p)
            memset(dst + p * FL_PANEL + nr, 0, (size_t)(FL_PANEL - nr) * sizeof(float));
}

/* pb = b (k, n) packed (gemm.h); trans_b: b given as (n, k). */
int FL_FN(pack)(const float *b, int64_t ldb, int trans_b, int64_t k, int64_t n, float *pb) {
    for (int64_t jr = 0; jr < n; jr += FL_PANEL) {
        int64_t nr = FL_MIN(n - jr, FL_PANEL);
        float *dst = pb + jr * k;
        if (trans_b) {
            gemm_pack_t_panel(b + jr * ldb, ldb, k, nr, dst);
            continue;
        }
        for (int64_t p = 0; p < k; ++p) {
            float *row = dst + p * FL_PANEL;
            const float *src = b + p * ldb + jr;
            if (nr == FL_PANEL) {           /* vector copies: memcpy's call cost a row */
                for (int j = 0; j < FL_PANEL; j += FL_VW) fl_store(row + j, fl_load(src + j));
                continue;
            }
            memcpy(row, src, (size_t)nr * sizeof(float));
            memset(row + nr, 0, (size_t)(FL_PANEL - nr) * sizeof(float));
        }
    }
    return 0;
}

#include "gemm_tile_asm.h"

/* c[0:rows, 0:nr] (+)= sum over i < kh, p < kc of a[r ars + i ari + p] pb[(i kc + p) 32 + 0:nr]:
 * one register tile (whole panels on AVX-512 in assembly: gemm_tile_asm.h). rows is a
 * constant in each caller (gemm_tile_rows); kh > 1 sums the window rows of an implicit
 * convolution (ari apart), kh 1 is the plain product. One line of pf per step of k into L2
 * until none is left. */
FL_INLINE void gemm_tile(const int rows, int64_t kh, int64_t ari, int64_t kc, const float *a,
                         int64_t ars, const float *pb, float *c, int64_t ldc, int nr,
                         int accumulate, gemm_prefetch pf, const gemm_epi *epi) {
#ifdef GEMM_ASM_TILE
    if (nr == GEMM_TN && kc > 0 && kh > 0) {
        /* a bias and ReLU on the sums in registers, other activations on the stored tile */
        int fused = !epi || epi->code == FL_LINEAR || epi->code == FL_RELU;
        gemm_asm_args g = {a, ars * 4, ari * 4, pb, kc, kh, c, ldc * 4, pf.line, pf.lines,
                           fused && epi ? epi->bias : 0,
                           (accumulate ? GEMM_ASM_ACCUMULATE : 0) |
                               (fused && epi && epi->code == FL_RELU ? GEMM_ASM_RELU : 0)};
        gemm_tile_asm[rows](&g);
        if (!fused) FL_FN(gemm_tile_epi)(rows, c, ldc, nr, epi);
        return;
    }
#endif
    fl_vf c0[GEMM_MR], c1[GEMM_MR];
#pragma GCC unroll 14
    for (int r = 0; r < rows; ++r) c0[r] = c1[r] = fl_set1(0.0f);
    const char *next = pf.line;
    int64_t next_lines = pf.lines;
    for (int64_t i = 0; i < kh; ++i) {
        const float *ap = a + i * ari;
        for (int64_t p = 0; p < kc; ++p) {
            fl_vf b0 = fl_load(pb), b1 = fl_load(pb + FL_VW);
            /* b's panel is read once per tile from L2: its lines asked for GEMM_PF_ROWS ahead */
            for (int j = 0; j < GEMM_TN; j += FL_LINE_FLOATS)
                __builtin_prefetch(pb + GEMM_PF_ROWS * FL_PANEL + j, 0, 3);
            if (next_lines > 0) {
                __builtin_prefetch(next, 0, 2);
                next += 64;
                --next_lines;
            }
#pragma GCC unroll 14
            for (int r = 0; r < rows; ++r) {
                /* row r at a base every third row, + 0, 1 or 2 row strides (AVX2, portable,
                 * AVX-512's ragged panels; its whole panels: gemm_tile_asm.h) */
                const float *base = ap + (r / 3) * 3 * ars;
                fl_vf ar = fl_set1(base[(r % 3) * ars + p]);
                c0[r] += ar * b0;
                c1[r] += ar * b1;
            }
            pb += FL_PANEL;
        }
    }
    if (nr == GEMM_TN) {
        /* a bias and ReLU on the sums in registers: the operations gemm_tile_epi applies to
         * them once stored, in the same order (the same bits), without reading them back */
        int fused = epi && (epi->code == FL_LINEAR || epi->code == FL_RELU);
        fl_vf bias0 = fl_set1(0.0f), bias1 = bias0;
        if (fused && epi->bias) {
            bias0 = fl_load(epi->bias);
            bias1 = fl_load(epi->bias + FL_VW);
        }
#pragma GCC unroll 14
        for (int r = 0; r < rows; ++r) {
            float *row = c + r * ldc;
            if (accumulate) {
                c0[r] += fl_load(row);
                c1[r] += fl_load(row + FL_VW);
            }
            if (fused) {
                if (epi->bias) {
                    c0[r] += bias0;
                    c1[r] += bias1;
                }
                if (epi->code == FL_RELU) {
                    c0[r] = rows_vact(c0[r], FL_RELU, 0.0f);
                    c1[r] = rows_vact(c1[r], FL_RELU, 0.0f);
                }
            }
            fl_store(row, c0[r]);
            fl_store(row + FL_VW, c1[r]);
        }
        if (epi && !fused) FL_FN(gemm_tile_epi)(rows, c, ldc, nr, epi);
        return;
    }
    /* nr - FL_VW lanes of the second vector, masked; every row a constant index, so that the
     * accumulators stay in registers (a loop over r by a variable kept them on the stack: 28
     * more stores and loads per tile, a third of a 16-step tile's time) */
    const int64_t tail = nr - FL_VW;
#pragma GCC unroll 14
    for (int r = 0; r < rows; ++r) {
        float *row = c + r * ldc;
        if (accumulate) {
            c0[r] += fl_load(row);
            c1[r] += fl_load_n(row + FL_VW, tail);
        }
        fl_store(row, c0[r]);
        fl_store_n(row + FL_VW, c1[r], tail);
    }
    if (epi) FL_FN(gemm_tile_epi)(rows, c, ldc, nr, epi);
}

/* c[0:rows, 0:nr] (+)= the same sums as gemm_tile for nr <= W columns (one vector of W floats
 * per row of the tile): outputs narrower than a vector pair (convolutions with 8 or 16 output
 * channels), where the wide tile spent half or more of its multiply-adds on zero columns.
 * Each output is the same chain of multiply-adds as in gemm_tile (the same sums). */
#define GEMM_NARROW_TILE(name, W)                                                             \
    FL_INLINE void name(const int rows, int64_t kh, int64_t ari, int64_t kc, const float *a,   \
                        int64_t ars, const float *pb, float *c, int64_t ldc, int nr,           \
                        int accumulate) {                                                      \
        typedef float vt __attribute__((vector_size(W * 4)));                                  \
        typedef float vt_u __attribute__((vector_size(W * 4), aligned(4), may_alias));         \
        vt acc[GEMM_NARROW_MR];                                                                \
        _Pragma("GCC unroll 14") for (int r = 0; r < rows; ++r) acc[r] = (vt){0};              \
        for (int64_t i = 0; i < kh; ++i) {                                                     \
            const float *ap = a + i * ari, *pp = pb + i * kc * FL_PANEL;                       \
            for (int64_t p = 0; p < kc; ++p) {                                                 \
                vt b = *(const vt_u *)(pp + p * FL_PANEL);                                     \
                _Pragma("GCC unroll 14") for (int r = 0; r < rows; ++r) acc[r] +=              \
                    ap[r * ars + p] * b;                                                       \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 14") for (int r = 0; r < rows; ++r) {                              \
            float *row = c + r * ldc;                                                          \
            if (nr == W) {                                                                     \
                *(vt_u *)row = accumulate ? (vt)(*(const vt_u *)row) + acc[r] : acc[r];        \
            } else { /* through a copy: lanes of acc[r] by a variable index would keep the  \
                      * accumulators on the stack */                                           \
                float t[W];                                                                    \
                *(vt_u *)t = acc[r];                                                           \
                for (int j = 0; j < nr; ++j) row[j] = accumulate ? row[j] + t[j] : t[j];       \
            }                                                                                  \
        }                                                                                      \
    }
GEMM_NARROW_TILE(gemm_tile_narrow, FL_VW)
#if FL_VW == 16
GEMM_NARROW_TILE(gemm_tile_half, 8)   /* up to 8 columns: AVX-512VL's 256-bit registers */
#endif
#undef GEMM_NARROW_TILE

/* The narrow tile of exactly `rows` (1 to GEMM_NARROW_MR) rows over nr <= FL_VW columns. */
static void gemm_tile_narrow_rows(int rows, int64_t kh, int64_t ari, int64_t kc, const float *a,
                                  int64_t ars, const float *pb, float *c, int64_t ldc, int nr,
                                  int accumulate) {
#if FL_VW == 16
#define GEMM_ROWS(r)                                                                           \
    case r:                                                                                    \
        if (nr <= 8) gemm_tile_half(r, kh, ari, kc, a, ars, pb, c, ldc, nr, accumulate);       \
        else gemm_tile_narrow(r, kh, ari, kc, a, ars, pb, c, ldc, nr, accumulate);             \
        break;
#else
#define GEMM_ROWS(r) \
    case r: gemm_tile_narrow(r, kh, ari, kc, a, ars, pb, c, ldc, nr, accumulate); break;
#endif
    switch (rows) {
#if GEMM_NARROW_MR == 14
        GEMM_ROWS(14) GEMM_ROWS(13)
#elif GEMM_NARROW_MR != 12
#error "the narrow tile's row cases below cover 12 or 14 rows"
#endif
        GEMM_ROWS(12) GEMM_ROWS(11) GEMM_ROWS(10) GEMM_ROWS(9) GEMM_ROWS(8) GEMM_ROWS(7)
        GEMM_ROWS(6) GEMM_ROWS(5) GEMM_ROWS(4) GEMM_ROWS(3) GEMM_ROWS(2) GEMM_ROWS(1)
    }
#undef GEMM_ROWS
}

/* The tile of exactly `rows` rows over nr columns: the wide tile (rows <= GEMM_MR), or for
 * nr <= FL_VW the narrow one (rows <= GEMM_NARROW_MR). */
void FL_FN(gemm_tile_rows)(int rows, int64_t kh, int64_t ari, int64_t kc, const float *a,
                           int64_t ars, const float *pb, float *c, int64_t ldc, int nr,
                           int accumulate, gemm_prefetch pf, const gemm_epi *epi) {
    if (nr <= FL_VW) {
        /* pf's lines asked for at once (the narrow tile's loop has no room for them) */
        for (int64_t l = 0; l < pf.lines; ++l) __builtin_prefetch(pf.line + l * 64, 0, 2);
        gemm_tile_narrow_rows(rows, kh, ari, kc, a, ars, pb, c, ldc, nr, accumulate);
        if (epi) FL_FN(gemm_tile_epi)(rows, c, ldc, nr, epi);
        return;
    }
#define GEMM_ROWS(r) \
    case r: gemm_tile(r, kh, ari, kc, a, ars, pb, c, ldc, nr, accumulate, pf, epi); break;
    switch (rows) {
#if GEMM_MR > 6
        GEMM_ROWS(14) GEMM_ROWS(13) GEMM_ROWS(12) GEMM_ROWS(11) GEMM_ROWS(10) GEMM_ROWS(9)
        GEMM_ROWS(8) GEMM_ROWS(7)
#endif
        GEMM_ROWS(6) GEMM_ROWS(5) GEMM_ROWS(4) GEMM_ROWS(3) GEMM_ROWS(2) GEMM_ROWS(1)
    }
#undef GEMM_ROWS
}

/* One row of gemm_tile_epi for the activation `code` (a constant in each case below). */
FL_INLINE void gemm_epi_row(float *row, int nr, const float *bias, const int code, float alpha) {
    for (int j = 0; j < nr; j += FL_VW) {
        fl_vf v = fl_load(row + j);
        if (bias) v += fl_load(bias + j);
        fl_store(row + j, rows_vact(v, code, alpha));
    }
}

void FL_FN(gemm_tile_epi)(int64_t rows, float *c, int64_t ldc, int nr, const gemm_epi *epi) {
    const float *bias = epi->bias;
    float alpha = epi->alpha;
    switch (epi->code) {                          /* the code's branch once per tile */
#define GEMM_EPI_CASE(cd)                                                                      \
    case cd:                                                                                   \
        for (int64_t r = 0; r < rows; ++r) gemm_epi_row(c + r * ldc, nr, bias, cd, alpha);     \
        break;
        GEMM_EPI_CASE(FL_LINEAR) GEMM_EPI_CASE(FL_RELU) GEMM_EPI_CASE(FL_RELU6)
        GEMM_EPI_CASE(FL_LEAKY_RELU) GEMM_EPI_CASE(FL_HARD_SIGMOID) GEMM_EPI_CASE(FL_SOFTSIGN)
        GEMM_EPI_CASE(FL_SIGMOID) GEMM_EPI_CASE(FL_SILU) GEMM_EPI_CASE(FL_GELU)
        GEMM_EPI_CASE(FL_GELU_TANH) GEMM_EPI_CASE(FL_EXPONENTIAL) GEMM_EPI_CASE(FL_TANH)
        GEMM_EPI_CASE(FL_HARD_SILU) GEMM_EPI_CASE(FL_ONNX_SIGMOID) GEMM_EPI_CASE(FL_ONNX_SILU)
        GEMM_EPI_CASE(FL_ONNX_TANH)
#undef GEMM_EPI_CASE
    default: break;
    }
}

/* The tile epilogue a product applies to its tiles: NULL where it has none to apply (no bias,
 * linear) or applies it per row (the softmax codes need whole rows). */
FL_INLINE const gemm_epi *gemm_tile_epi_of(const gemm_epi *epi) {
    if (!epi || epi->code == FL_SOFTMAX || epi->code == FL_LOG_SOFTMAX) return 0;
    return epi->bias || epi->code != FL_LINEAR ? epi : 0;
}

/* The block of packed b after the current one: `panels` panels of `rows` rows (32 floats each),
 * panel j at pb + j pstride. */
typedef struct {
    const float *pb;
    int64_t pstride, panels, rows;
} gemm_block_next;

/* c[:m, j0:j1] (+)= a[:m, :kc] (rows lda apart) @ the packed block pbk (panel j of this block
 * at pbk + j * pstride, rows 32 floats apart), for columns j0:j1 of c (j0 a multiple of 32
 * relative to the block); while its tiles run, the wide ones bring `next` (NULL: none) into L2,
 * its panel j shared among the tiles over panel j: the first tiles over a block then read it
 * from L2, not from L3 or memory (docs/design.md, "The next block of weights, into L2"). */
static void gemm_block(int64_t m, int64_t ncols, int64_t kc, const float *a, int64_t lda,
                       const float *pbk, int64_t pstride, float *c, int64_t ldc, int acc,
                       const gemm_epi *epi, const gemm_block_next *next) {
    int64_t tiles = (m + GEMM_MR - 1) / GEMM_MR, t = 0;
    for (int64_t ir = 0, rows; ir < m; ir += rows, ++t) {
        rows = gemm_next_rows_over(m - ir, ncols);
        for (int64_t j = 0; j < ncols; j += GEMM_TN) {
            int nr = (int)FL_MIN(ncols - j, GEMM_TN);
            const float *pbj = pbk + (j / FL_PANEL) * pstride + j % FL_PANEL;
            float *cij = c + ir * ldc + j;
            gemm_prefetch pf = {0, 0};
            if (next && j / FL_PANEL < next->panels) {
                /* row tile t of this panel: its share of the next block's same panel */
                int64_t lines = next->rows * FL_PANEL * 4 / 64, l0 = lines * t / tiles;
                pf.line = (const char *)(next->pb + (j / FL_PANEL) * next->pstride) + l0 * 64;
                pf.lines = lines * (t + 1) / tiles - l0;
            }
            gemm_epi at = {0, FL_LINEAR, 0.0f};
            if (epi) at = (gemm_epi){epi->bias ? epi->bias + j : 0, epi->code, epi->alpha};
            int whole = nr % FL_VW == 0; /* a ragged last panel: the row epilogue on its columns */
            FL_FN(gemm_tile_rows)((int)rows, 1, 0, kc, a + ir * lda, lda, pbj, cij, ldc, nr, acc, pf,
                                  epi && whole ? &at : 0);
            if (epi && !whole)
                FL_FN(rows_bias_act_range)(0, rows, nr, cij, ldc, at.bias, at.code, at.alpha, cij, ldc);
        }
    }
}

/* Rows of A up to which products take the thin path (gemm_thin): tiles of up to GEMM_THIN_ROWS
 * rows over whole panels (narrower tiles straddling panels ran slower), b read as it
 * is (no per-call packing) or packed; above, the packed tiles of gemm_tile. */
#define GEMM_THIN_M 8
/* Most rows of a thin tile (GEMM_THIN_VECS vectors of columns each): 12 accumulators of 16
 * vector registers, 24 of 32 (AVX-512); 4 rows of 3 vectors were no faster at 4 rows and
 * slower at 5 to 8. */
#if FL_VW == 16
#define GEMM_THIN_ROWS 6
#else
#define GEMM_THIN_ROWS 3
#endif
/* Vectors of columns of a thin tile, of a one-row tile: 8 independent accumulation chains or
 * more keep both FMA pipes busy (a chain waits 4 cycles for its last multiply-add). */
#define GEMM_THIN_VECS 4
#define GEMM_THIN_VECS1 8

/* p[0:FL_VW] where mask is set, 0 elsewhere, reading only the lanes of the mask. */
FL_INLINE fl_vf gemm_load_masked(const float *p, fl_vi mask) {
#if FL_VW == 16 && defined(__AVX512F__)
    return (fl_vf)_mm512_maskz_loadu_ps(_mm512_movepi32_mask((__m512i)mask), p);
#elif FL_VW == 8 && defined(__AVX2__)
    return (fl_vf)_mm256_maskload_ps(p, (__m256i)mask);
#else
    fl_vf v = fl_set1(0.0f);
    for (int i = 0; i < FL_VW; ++i)
        if (mask[i]) v[i] = p[i];
    return v;
#endif
}

/* c[0:rows, 0:nr] (+)= a[0:rows, 0:k] @ b[0:k, 0:nr] on vecs vectors of columns (the last one
 * read under a mask of its nr - (vecs - 1) FL_VW first lanes when `masked`): column j of row p
 * of b at b + p ldb + (j / 32) pstride + j % 32 (b as it is: ldb its row stride, pstride 32;
 * packed: ldb 32, pstride 32 k). Each output is one chain of multiply-adds from 0 over
 * p = 0 .. k-1, added to c at the end: the same sums whatever the tile's shape. */
FL_INLINE void gemm_thin_tile(const int rows, const int vecs, const int masked, int64_t k,
                              const float *a, int64_t lda, const float *b, int64_t ldb,
                              int64_t pstride, float *c, int64_t ldc, int nr, int accumulate) {
    fl_vf acc[GEMM_THIN_ROWS][GEMM_THIN_VECS1];
    const float *bv[GEMM_THIN_VECS1];
    fl_vi mask = fl_set1(0.0f) < fl_set1(0.0f);
    if (masked) {
        fl_vi lane;
        for (int i = 0; i < FL_VW; ++i) lane[i] = i;
        mask = lane < nr - (vecs - 1) * FL_VW;
    }
#pragma GCC unroll 8
    for (int v = 0; v < vecs; ++v) bv[v] = b + (v * FL_VW / FL_PANEL) * pstride + v * FL_VW % FL_PANEL;
#pragma GCC unroll 8
    for (int r = 0; r < rows; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < vecs; ++v) acc[r][v] = fl_set1(0.0f);
    for (int64_t p = 0; p < k; ++p) {
        fl_vf bp[GEMM_THIN_VECS1];
        int64_t off = p * ldb;
#pragma GCC unroll 8
        for (int v = 0; v < vecs; ++v)
            bp[v] = masked && v == vecs - 1 ? gemm_load_masked(bv[v] + off, mask)
                                            : fl_load(bv[v] + off);
        /* each 64-byte line of b's row GEMM_PF_ROWS ahead (b packed or read as it is) */
#pragma GCC unroll 8
        for (int v = 0; v < vecs; ++v)
            if (v * FL_VW % FL_LINE_FLOATS == 0)
                __builtin_prefetch(bv[v] + off + GEMM_PF_ROWS * ldb, 0, 3);
#pragma GCC unroll 8
        for (int r = 0; r < rows; ++r) {
            fl_vf ar = fl_set1(a[r * lda + p]);
#pragma GCC unroll 8
            for (int v = 0; v < vecs; ++v) acc[r][v] += ar * bp[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; ++r) {
        float *row = c + r * ldc;
#pragma GCC unroll 8
        for (int v = 0; v < vecs - masked; ++v) {
            fl_vf s = accumulate ? fl_load(row + v * FL_VW) + acc[r][v] : acc[r][v];
            fl_store(row + v * FL_VW, s);
        }
        if (masked) {
            float t[FL_VW];
            fl_store(t, acc[r][vecs - 1]);
            float *tail = row + (vecs - 1) * FL_VW;
            for (int j = 0; j < nr - (vecs - 1) * FL_VW; ++j)
                tail[j] = accumulate ? tail[j] + t[j] : t[j];
        }
    }
}

/* The thin tile of `rows` rows over nr columns: whole vectors, the last one masked when nr is
 * not a multiple of FL_VW (nr at most GEMM_THIN_VECS1 vectors for one row, GEMM_THIN_VECS for
 * more). */
static void gemm_thin_rows(int rows, int nr, int64_t k, const float *a, int64_t lda,
                           const float *b, int64_t ldb, int64_t pstride, float *c, int64_t ldc,
                           int accumulate) {
    int vecs = (nr + FL_VW - 1) / FL_VW, masked = nr % FL_VW != 0;
#define GEMM_THIN(r, v)                                                                         \
    case (r) * 32 + (v) * 2:                                                                   \
        gemm_thin_tile(r, v, 0, k, a, lda, b, ldb, pstride, c, ldc, nr, accumulate);           \
        break;                                                                                 \
    case (r) * 32 + (v) * 2 + 1:                                                               \
        gemm_thin_tile(r, v, 1, k, a, lda, b, ldb, pstride, c, ldc, nr, accumulate);           \
        break;
#define GEMM_THIN_4(r) GEMM_THIN(r, 1) GEMM_THIN(r, 2) GEMM_THIN(r, 3) GEMM_THIN(r, 4)
    switch (rows * 32 + vecs * 2 + masked) {
        GEMM_THIN_4(1) GEMM_THIN(1, 5) GEMM_THIN(1, 6) GEMM_THIN(1, 7) GEMM_THIN(1, 8)
        GEMM_THIN_4(2) GEMM_THIN_4(3)
#if GEMM_THIN_ROWS > 3
        GEMM_THIN_4(4) GEMM_THIN_4(5) GEMM_THIN_4(6)
#endif
    }
#undef GEMM_THIN_4
#undef GEMM_THIN
}

/* c (m, n) (+)= a (m, k) @ b for m <= GEMM_THIN_M, b addressed as in gemm_thin_tile: column
 * tiles of GEMM_THIN_VECS1 vectors for one row, GEMM_THIN_VECS for more, each over row tiles
 * of near-equal sizes up to GEMM_THIN_ROWS (the tile's slice of b is read once per row tile,
 * from L1 or L2 after the first). */
static void gemm_thin(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *b, int64_t ldb, int64_t pstride, int accumulate, float *c,
                      int64_t ldc) {
    int64_t tiles = (m + GEMM_THIN_ROWS - 1) / GEMM_THIN_ROWS;
    int64_t cols = (m == 1 ? GEMM_THIN_VECS1 : GEMM_THIN_VECS) * FL_VW;
    for (int64_t j = 0; j < n; j += cols) {
        int nr = (int)FL_MIN(n - j, cols);
        const float *bj = b + (j / FL_PANEL) * pstride + j % FL_PANEL;
        for (int64_t t = 0, i = 0; t < tiles; ++t) {
            int rows = (int)((m - i + tiles - t - 1) / (tiles - t));
            gemm_thin_rows(rows, nr, k, a + i * lda, lda, bj, ldb, pstride, c + i * ldc + j, ldc,
                           accumulate);
            i += rows;
        }
    }
}

/* sgemm_packed with the tile epilogue `epi` (NULL: none; see gemm_tile_epi_of): 1 where the
 * epilogue was applied, 0 where the caller still has to (the thin path, k <= 0), -1 where a
 * buffer could not be had. */
static int gemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *pb, int accumulate, float *c, int64_t ldc,
                       const gemm_epi *epi) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
        return 0;
    }
    if (m <= GEMM_THIN_M) {
        gemm_thin(m, n, k, a, lda, pb, FL_PANEL, FL_PANEL * k, accumulate, c, ldc);
        return 0;
    }
    /* rows of A a multiple of 4 KiB apart fall into one L1 set: with more tile rows than the
     * L1's ways they evict each other, so such rows of A are copied first (all of them for few
     * rows, block by block for more) */
    int aliased = GEMM_MR > 8 && lda % 1024 == 0;
    int64_t kc_most = GEMM_KC, nc = GEMM_NC;
    if (m <= GEMM_FEW_ROWS) {
        if (aliased) {                              /* all rows at once */
            float *copy = fl_buf_floats(&gemm_buf, (size_t)(m * (k + 16)));
            if (!copy) return -1;
            for (int64_t i = 0; i < m; ++i)
                memcpy(copy + i * (k + 16), a + i * lda, (size_t)k * sizeof(float));
            a = copy;
            lda = k + 16;
            aliased = 0;
        }
        /* near-equal blocks of k; k up to GEMM_FEW_KC_ONE in one, so that each tile's sums are
         * stored once, not stored and read back (docs/design.md, "Few rows") */
        int64_t blocks = k <= GEMM_FEW_KC_ONE ? 1 : (k + GEMM_FEW_KC - 1) / GEMM_FEW_KC;
        kc_most = (k + blocks - 1) / blocks;
        nc = GEMM_FEW_NC;
    }
    const int64_t ldbuf = kc_most + 16;
    float *buf = 0;
    if (aliased) {
        buf = fl_buf_floats(&gemm_buf, (size_t)(FL_MIN(m, GEMM_MC) * ldbuf));
        if (!buf) return -1;
    }
    for (int64_t pc = 0; pc < k; pc += kc_most) {
        int64_t kc = FL_MIN(k - pc, kc_most);
        int acc = accumulate || pc > 0;
        for (int64_t jc = 0; jc < n; jc += nc) {
            int64_t ncols = FL_MIN(n - jc, nc);
            const float *pbk = pb + jc * k + pc * FL_PANEL;
            /* the block after this one: the next columns, else the first of the next rows of b */
            int64_t njc = jc + nc < n ? jc + nc : 0, npc = jc + nc < n ? pc : pc + kc;
            gemm_block_next nb = {pb + njc * k + npc * FL_PANEL, k * FL_PANEL,
                                  (FL_MIN(n - njc, nc) + FL_PANEL - 1) / FL_PANEL, FL_MIN(k - npc, kc_most)};
            const gemm_block_next *next = npc < k ? &nb : 0;
            /* the epilogue on the tiles of the last block of k, their sums final */
            gemm_epi at = {0, FL_LINEAR, 0.0f}, *last = 0;
            if (epi && pc + kc >= k) {
                at = (gemm_epi){epi->bias ? epi->bias + jc : 0, epi->code, epi->alpha};
                last = &at;
            }
            if (!buf) {
                gemm_block(m, ncols, kc, a + pc, lda, pbk, k * FL_PANEL, c + jc, ldc, acc, last, next);
                continue;
            }
            for (int64_t ic = 0; ic < m; ic += GEMM_MC) {
                int64_t mc = FL_MIN(m - ic, GEMM_MC);
                for (int64_t i = 0; i < mc; ++i)
                    memcpy(buf + i * ldbuf, a + (ic + i) * lda + pc, (size_t)kc * sizeof(float));
                gemm_block(mc, ncols, kc, buf, ldbuf, pbk, k * FL_PANEL, c + ic * ldc + jc, ldc,
                           acc, last, ic + mc >= m ? next : 0);
            }
        }
    }
    return epi != 0;
}

int FL_FN(sgemm_packed)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *pb, int accumulate, float *c, int64_t ldc) {
    return gemm_packed(m, n, k, a, lda, pb, accumulate, c, ldc, 0) < 0 ? -1 : 0;
}

/* Rows of A up to which sgemm reads a transposed b as it is instead of packing it. */
#define GEMM_SMALL_M 4

/* c[i, j] (+)= dot(a[i, :], b[j, :]) for b given as (n, k) and m <= GEMM_SMALL_M rows. */
static void gemm_small_t(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const float *b, int64_t ldb, int accumulate, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        const float *ai = a + i * lda;
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n; ++j) {
            const float *bj = b + j * ldb;
            fl_vf acc0 = fl_set1(0.0f), acc1 = fl_set1(0.0f);
            int64_t p = 0;
            for (; p + 2 * FL_VW <= k; p += 2 * FL_VW) {
                acc0 += fl_load(ai + p) * fl_load(bj + p);
                acc1 += fl_load(ai + p + FL_VW) * fl_load(bj + p + FL_VW);
            }
            float s = fl_hsum(acc0 + acc1);
            for (; p < k; ++p) s += ai[p] * bj[p];
            ci[j] = accumulate ? ci[j] + s : s;
        }
    }
}

int FL_FN(sgemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                 int64_t ldb, int trans_b, int accumulate, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0) return FL_FN(sgemm_packed)(m, n, 0, a, lda, b, accumulate, c, ldc);
    if (m <= GEMM_THIN_M && !trans_b) {
        gemm_thin(m, n, k, a, lda, b, ldb, FL_PANEL, accumulate, c, ldc);
        return 0;
    }
    if (m <= GEMM_SMALL_M && trans_b) {
        gemm_small_t(m, n, k, a, lda, b, ldb, accumulate, c, ldc);
        return 0;
    }
    float *pbk = fl_buf_floats(&gemm_buf, (size_t)GEMM_KC * GEMM_NC);
    if (!pbk) return -1;
    for (int64_t jc = 0; jc < n; jc += GEMM_NC) {
        int64_t nc = FL_MIN(n - jc, GEMM_NC);
        for (int64_t pc = 0; pc < k; pc += GEMM_KC) {
            int64_t kc = FL_MIN(k - pc, GEMM_KC);
            const float *bk = trans_b ? b + jc * ldb + pc : b + pc * ldb + jc;
            FL_FN(pack)(bk, ldb, trans_b, kc, nc, pbk);
            gemm_block(m, nc, kc, a + pc, lda, pbk, kc * FL_PANEL, c + jc, ldc,
                       accumulate || pc > 0, 0, 0);
        }
    }
    return 0;
}

/* Fewest rows for splitting by rows; with fewer, blocks of output columns are shared. */
#define GEMM_ROW_SPLIT_MIN 64
/* Fewest multiply-adds (x2) in one thread's share of a thin product (m <= GEMM_THIN_M), the
 * stream of b counted as GEMM_THIN_B_ROWS more rows (a row of A costs about a quarter of
 * reading b): several times what handing a share to a spinning worker costs. */
#define GEMM_MIN_THIN_SHARE_FLOPS (INT64_C(1) << 17)
#define GEMM_THIN_B_ROWS 4
/* Floats of b beyond which it no longer stays in L2 between chunks: each chunk of rows then
 * streams all of b from memory again, so chunks get at least GEMM_REREAD_ROWS rows (b read
 * once per that many rows of multiply-adds; a late epilogue costs far less than that). */
#define GEMM_B_CACHED_FLOATS (1 << 17)
#define GEMM_REREAD_ROWS 256
/* Floats of A beyond which a share of columns no longer finds it in L2 (each share streams all
 * of A from L3 again): such products get one share of columns per thread. */
#define GEMM_A_CACHED_FLOATS (1 << 18)

typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    const float *a, *b, *pb, *bias;
    int trans_b, code, by_rows, status;
    float alpha;
    float *c;
} gemm_matmul_ctx;

/* Rows [r0, r1) of c = f(a @ b + bias), in chunks whose epilogue runs while they are hot. */
static int gemm_rows_share(gemm_matmul_ctx *x, int64_t r0, int64_t r1) {
    /* on each tile while it is in L1 (gemm_packed; the per-call packed and thin paths: per
     * chunk) */
    gemm_epi ask = {x->bias, x->code, x->alpha};
    const gemm_epi *epi = gemm_tile_epi_of(&ask);
    int64_t most = FL_MAX(GEMM_CHUNK_FLOATS / FL_MAX(x->n, 1), GEMM_MR);
    if (x->k * x->n > GEMM_B_CACHED_FLOATS) most = FL_MAX(most, GEMM_REREAD_ROWS);
    /* near-equal chunks of whole tiles: no short last chunk on the thin path */
    int64_t chunks = (r1 - r0 + most - 1) / most;
    int64_t chunk = ((r1 - r0 + chunks - 1) / chunks + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    for (int64_t i = r0; i < r1; i += chunk) {
        int64_t rows = FL_MIN(chunk, r1 - i);
        const float *ai = x->a + i * x->lda;
        float *ci = x->c + i * x->ldc;
        int st = x->pb ? gemm_packed(rows, x->n, x->k, ai, x->lda, x->pb, 0, ci, x->ldc, epi)
                       : FL_FN(sgemm)(rows, x->n, x->k, ai, x->lda, x->b, x->ldb, x->trans_b, 0,
                                      ci, x->ldc);
        if (st < 0) return st;
        if (st == 0 && (x->code != FL_LINEAR || x->bias))
            FL_FN(rows_bias_act_range)(0, rows, x->n, ci, x->ldc, x->bias, x->code, x->alpha,
                                       ci, x->ldc);
    }
    return 0;
}

static void gemm_matmul_task(void *p, int64_t u0, int64_t u1) {
    gemm_matmul_ctx *x = (gemm_matmul_ctx *)p;
    int st;
    if (x->by_rows) {
        st = gemm_rows_share(x, u0, u1);
    } else {                                  /* units: 32-column panels */
        int64_t c0 = u0 * FL_PANEL, c1 = FL_MIN(u1 * FL_PANEL, x->n);
        gemm_epi ask = {x->bias ? x->bias + c0 : 0, x->code, x->alpha};
        st = x->pb ? gemm_packed(x->m, c1 - c0, x->k, x->a, x->lda, x->pb + c0 * x->k, 0,
                                 x->c + c0, x->ldc, gemm_tile_epi_of(&ask))
                   : FL_FN(sgemm)(x->m, c1 - c0, x->k, x->a, x->lda,
                                  x->trans_b ? x->b + c0 * x->ldb : x->b + c0, x->ldb,
                                  x->trans_b, 0, x->c + c0, x->ldc);
        if (st > 0) st = 0;                   /* the epilogue applied on the tiles */
        else if (!st && x->code != FL_SOFTMAX && x->code != FL_LOG_SOFTMAX &&
                 (x->code != FL_LINEAR || x->bias))
            FL_FN(rows_bias_act_range)(0, x->m, c1 - c0, x->c + c0, x->ldc,
                                       x->bias ? x->bias + c0 : 0, x->code, x->alpha,
                                       x->c + c0, x->ldc);
    }
    if (st) x->status = st;
}

int FL_FN(matmul)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                  int64_t ldb, int trans_b, const float *pb, const float *bias, int code,
                  float alpha, float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return 0;
    gemm_matmul_ctx x = {m, n, k, lda, ldb, ldc, a, b, pb, bias, trans_b, code, 1, 0, alpha, c};
    int64_t flops = 2 * m * n * FL_MAX(k, 1);
    /* a share of rows reads all of b, a share of columns all of a */
    x.by_rows = m >= FL_MAX(GEMM_ROW_SPLIT_MIN, n);
    int64_t units = x.by_rows ? m : (n + FL_PANEL - 1) / FL_PANEL;
    int64_t grain = FL_MAX(1, units * GEMM_MIN_SHARE_FLOPS / flops), work = flops;
    if (x.by_rows) grain = ((grain + GEMM_MR - 1) / GEMM_MR) * GEMM_MR;
    if (m <= GEMM_THIN_M) {
        /* column shares of whole thin tiles, one per thread, each worth its hand-off */
        int64_t tile = FL_MAX(1, (m == 1 ? GEMM_THIN_VECS1 : GEMM_THIN_VECS) * FL_VW / FL_PANEL);
        work = 2 * n * FL_MAX(k, 1) * (m + GEMM_THIN_B_ROWS);
        int64_t threads = fl_pool_get_threads();
        grain = FL_MAX(units * GEMM_MIN_THIN_SHARE_FLOPS / work, (units + threads - 1) / threads);
        grain = (grain + tile - 1) / tile * tile;
    } else if (!x.by_rows && m * k > GEMM_A_CACHED_FLOATS) {
        int64_t threads = fl_pool_get_threads();
        grain = FL_MAX(grain, (units + threads - 1) / threads);
    }
    if (fl_parallel_chunks(units, grain) <= 1) {
        x.by_rows = 1;
        return gemm_rows_share(&x, 0, m);
    }
    fl_parallel_part(units, grain, gemm_wake_permille(work), gemm_matmul_task, &x);
    if (!x.status && !x.by_rows && (code == FL_SOFTMAX || code == FL_LOG_SOFTMAX))
        FL_FN(rows_bias_act_range)(0, m, n, c, ldc, bias, code, alpha, c, ldc);
    return x.status;
}

typedef struct {
    int64_t m, n, k, sa, lda, sb, ldb, sc, ldc;
    const float *a, *b;
    int trans_b, status;
    float *c;
} gemm_batch_ctx;

/* Products [i0, i1) of the batch, each whole on this thread. */
static void gemm_batch_task(void *p, int64_t i0, int64_t i1) {
    gemm_batch_ctx *x = (gemm_batch_ctx *)p;
    for (int64_t i = i0; i < i1; ++i) {
        int st = FL_FN(sgemm)(x->m, x->n, x->k, x->a + i * x->sa, x->lda, x->b + i * x->sb,
                              x->ldb, x->trans_b, 0, x->c + i * x->sc, x->ldc);
        if (st) x->status = st;
    }
}

/* c[i] = a[i] @ b[i] (b[i]^T with trans_b) for i < batch: one product per thread at a time
 * where the batch splits evenly over the threads or is several times their count, else each
 * product on every thread in turn. */
int FL_FN(matmul_batch)(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
                        int64_t sa, int64_t lda, const float *b, int64_t sb, int64_t ldb,
                        int trans_b, float *c, int64_t sc, int64_t ldc) {
    if (batch <= 0 || m <= 0 || n <= 0) return 0;
    int64_t threads = fl_pool_get_threads();
    int64_t flops = 2 * m * n * FL_MAX(k, 1);
    if (batch > 1 && (batch % threads == 0 || batch >= 4 * threads ||
                      flops < GEMM_MIN_SHARE_FLOPS)) {
        gemm_batch_ctx x = {m, n, k, sa, lda, sb, ldb, sc, ldc, a, b, trans_b, 0, c};
        fl_parallel_part(batch, FL_MAX(1, GEMM_MIN_SHARE_FLOPS / flops),
                         gemm_wake_permille(batch * flops), gemm_batch_task, &x);
        return x.status;
    }
    for (int64_t i = 0; i < batch; ++i) {
        int st = FL_FN(matmul)(m, n, k, a + i * sa, lda, b + i * sb, ldb, trans_b, 0, 0,
                               FL_LINEAR, 0.0f, c + i * sc, ldc);
        if (st) return st;
    }
    return 0;
}
