/* fastlayers' own single-threaded float32 GEMM on a weight matrix packed once, with an
 * AVX-512 micro-kernel.
 *
 * c (m, n) = a (m, k) @ b (k, n) + beta c, row major. fl_pack_all lays b out once (weights)
 * in FL_NR-column panels of all k rows. fl_sgemm_packed then runs, per FL_KC-row block of b, a
 * 14 x 32 register tile (28 zmm accumulators) over 14 rows of A read in place and each column
 * panel (rows of A whose stride makes them evict each other in L1 are first copied to a
 * per-thread buffer reused by later calls; see fl_packed_tiles). OpenBLAS packs b again on
 * every call, which cost about a quarter of the time of a deep convolution layer's product
 * (49 x 4608 x 512). Without the kernel (another compiler or CPU) or its buffer, a scalar loop
 * computes the same product.
 */
#ifndef FL_SGEMM_KERNEL_H
#define FL_SGEMM_KERNEL_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FL_MR 14
#define FL_NR 32
#define FL_KC 256
#define FL_MC 336

static __thread float *fl_buf = 0;
static __thread size_t fl_buf_floats = 0;

/* This thread's copy buffer of at least `floats` floats (64-byte aligned), or NULL. */
static float *fl_workspace(size_t floats) {
    if (fl_buf_floats < floats) {
        free(fl_buf);
        fl_buf = (float *)aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        fl_buf_floats = fl_buf ? floats : 0;
    }
    return fl_buf;
}

/* pb[panel][p][j] = b[p, panel * NR + j] for all k rows of b (k, n), zero past column n:
 * each NR-column panel holds its k rows contiguously, so the panels of columns j0:j1 (j0 a
 * multiple of NR) are the packed matrix from pb + j0 * k on (a share of the columns). */
static void fl_pack_all(const float *b, int64_t ldb, int64_t k, int64_t n, float *pb) {
    for (int64_t jr = 0; jr < n; jr += FL_NR) {
        int64_t nr = n - jr < FL_NR ? n - jr : FL_NR;
        float *dst = pb + jr * k;
        for (int64_t p = 0; p < k; ++p) {
            float *row = dst + p * FL_NR;
            memcpy(row, b + p * ldb + jr, (size_t)nr * sizeof(float));
            if (nr < FL_NR) memset(row + nr, 0, (size_t)(FL_NR - nr) * sizeof(float));
        }
    }
}

/* Floats of the whole of b (k, n) packed by fl_pack_all: k rows of n rounded up to NR. */
static int64_t fl_packed_floats(int64_t k, int64_t n) {
    return k * ((n + FL_NR - 1) / FL_NR) * FL_NR;
}

/* c (m, n) (+)= a (m, k) @ b with b packed by fl_pack_all, one multiply-add at a time: where
 * the micro-kernel is not compiled or its buffer cannot be allocated. */
static void fl_packed_scalar(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                             const float *pb, int accumulate, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) {
        float *row = c + i * ldc;
        if (!accumulate) memset(row, 0, (size_t)n * sizeof(float));
        for (int64_t p = 0; p < k; ++p) {
            float ap = a[i * lda + p];
            for (int64_t j = 0; j < n; ++j)
                row[j] += ap * pb[(j / FL_NR) * k * FL_NR + p * FL_NR + j % FL_NR];
        }
    }
}

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FL_HAVE_KERNEL 1
#include <immintrin.h>

#define FL_TARGET __attribute__((target("avx512f,fma")))

static int fl_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

/* c[0:mr, 0:nr] (+)= the accumulators (c0[i], c1[i]) of a rows x 32 register tile: masked
 * stores of its first mr rows and nr columns (shared by the sgemm and convolution tiles). */
FL_TARGET static inline __attribute__((always_inline)) void
fl_store_tile(const int rows, const __m512 *c0, const __m512 *c1, float *c, int64_t ldc, int mr,
              int nr, int accumulate) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF
                 : nr > 16  ? (__mmask16)((1u << (nr - 16)) - 1u) : (__mmask16)0;
#pragma GCC unroll 14
    for (int i = 0; i < rows; ++i) {
        if (i < mr) {
            float *row = c + i * ldc;
            __m512 v0 = c0[i], v1 = c1[i];
            if (accumulate) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row + 16));
            }
            _mm512_mask_storeu_ps(row, m0, v0);
            _mm512_mask_storeu_ps(row + 16, m1, v1);
        }
    }
}

/* c[0:mr, 0:nr] (+)= sum over i < kh and p < kc of a[r * ars + i * ari + p * aps]
 * pb[i * kc + p][0:nr] for r < rows, with a rows x 32 register tile. rows, kh and the A strides
 * are constants in each caller: the sgemm's (kh 1, ars lda, aps 1) for rows read in place;
 * kh > 1 sums window rows ari apart (an implicit convolution). */
FL_TARGET static inline __attribute__((always_inline)) void
fl_tile(const int rows, int64_t kh, int64_t ari, int64_t kc, const float *a, int64_t ars,
        int64_t aps, const float *pb, float *c, int64_t ldc, int mr, int nr, int accumulate) {
    __m512 c0[FL_MR], c1[FL_MR];
#pragma GCC unroll 14
    for (int r = 0; r < rows; ++r) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < kh; ++i) {
        const float *ap = a + i * ari;
        for (int64_t p = 0; p < kc; ++p) {
            __m512 b0 = _mm512_loadu_ps(pb);
            __m512 b1 = _mm512_loadu_ps(pb + 16);
#pragma GCC unroll 14
            for (int r = 0; r < rows; ++r) {
                __m512 ar = _mm512_set1_ps(ap[r * ars]);
                c0[r] = _mm512_fmadd_ps(ar, b0, c0[r]);
                c1[r] = _mm512_fmadd_ps(ar, b1, c1[r]);
            }
            ap += aps;
            pb += FL_NR;
        }
    }
    fl_store_tile(rows, c0, c1, c, ldc, mr, nr, accumulate);
}

/* The tile of exactly `rows` (1-14) rows of A read in place (row stride lda). */
FL_TARGET static void fl_tile_rows(int rows, int64_t kc, const float *a, int64_t lda,
                                   const float *pb, float *c, int64_t ldc, int nr,
                                   int accumulate) {
#define FL_ROWS(r) \
    case r: fl_tile(r, 1, 0, kc, a, lda, 1, pb, c, ldc, r, nr, accumulate); break;
    switch (rows) {
        FL_ROWS(14) FL_ROWS(13) FL_ROWS(12) FL_ROWS(11) FL_ROWS(10) FL_ROWS(9) FL_ROWS(8)
        FL_ROWS(7) FL_ROWS(6) FL_ROWS(5) FL_ROWS(4) FL_ROWS(3) FL_ROWS(2) FL_ROWS(1)
    }
#undef FL_ROWS
}

/* c[:m, :n] (+)= a[:m, :kc] (rows lda floats apart, read in place) @ rows pc:pc + kc of packed
 * b (pb_k = pb + pc NR, panels k NR floats apart): 14-row tiles, then one tile of exactly the
 * rows left, or two of 7-9 rows for the last 15-17 (tiles of 1-3 rows run at half the rate per
 * row; a zero-padded 4-row tile had made products of 1-3 rows up to 4x slower). */
FL_TARGET static void fl_rows_tiles(int64_t m, int64_t n, int64_t k, int64_t kc, const float *a,
                                    int64_t lda, const float *pb_k, float *c, int64_t ldc,
                                    int accumulate) {
    for (int64_t ir = 0, rows; ir < m; ir += rows) {
        int64_t left = m - ir;
        rows = left >= FL_MR + 4 ? FL_MR : (left > FL_MR ? left - left / 2 : left);
        for (int64_t jr = 0; jr < n; jr += FL_NR) {
            int nr = (int)(n - jr < FL_NR ? n - jr : FL_NR);
            fl_tile_rows((int)rows, kc, a + ir * lda, lda, pb_k + jr * k, c + ir * ldc + jr, ldc,
                         nr, accumulate);
        }
    }
}

/* fl_sgemm_packed with the micro-kernel, per FL_KC-row block of b; -1 when the copy buffer
 * cannot be allocated.
 *
 * A is read in place (1.0-1.25x faster than packing it into panels: the pack was a pass of its
 * own, and A panels meet only few column panels in convolutions). Unless lda is a multiple of
 * 1024 floats: then the 14 rows of a tile fall into one L1 set and evict each other (0.8x), so
 * each FL_MC x FL_KC block of A is first copied, row by row, into a buffer whose rows are
 * FL_KC + 16 floats apart (session 13: 205 -> 228 GFLOP/s on 1024 x 1024 x 256, one thread,
 * against a transposing pack into 14-row panels). */
FL_TARGET static int fl_packed_tiles(int64_t m, int64_t n, int64_t k, const float *a,
                                     int64_t lda, const float *pb, int accumulate, float *c,
                                     int64_t ldc) {
    const int64_t ldbuf = FL_KC + 16;
    float *buf = 0;
    if (lda % 1024 == 0) {
        buf = fl_workspace((size_t)((m < FL_MC ? m : FL_MC) * ldbuf));
        if (!buf) return -1;
    }
    for (int64_t pc = 0; pc < k; pc += FL_KC) {
        int64_t kc = k - pc < FL_KC ? k - pc : FL_KC;
        int acc = accumulate || pc > 0;
        const float *pb_k = pb + pc * FL_NR;
        if (!buf) {
            fl_rows_tiles(m, n, k, kc, a + pc, lda, pb_k, c, ldc, acc);
            continue;
        }
        for (int64_t ic = 0; ic < m; ic += FL_MC) {
            int64_t mc = m - ic < FL_MC ? m - ic : FL_MC;
            for (int64_t i = 0; i < mc; ++i)
                memcpy(buf + i * ldbuf, a + (ic + i) * lda + pc, (size_t)kc * sizeof(float));
            fl_rows_tiles(mc, n, k, kc, buf, ldbuf, pb_k, c + ic * ldc, ldc, acc);
        }
    }
    return 0;
}

#else
#define FL_HAVE_KERNEL 0
static int fl_supported(void) { return 0; }
#endif

/* c (m, n) = a (m, k) @ b + beta c (beta 0: overwrite, else accumulate), b (k, n) packed once
 * by fl_pack_all (weights), a with a contiguous last axis (row stride lda). */
static void fl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            const float *pb, float beta, float *c, int64_t ldc) {
    int accumulate = beta != 0.0f;
    if (m <= 0 || n <= 0) return;
#if FL_HAVE_KERNEL
    if (k > 0 && fl_packed_tiles(m, n, k, a, lda, pb, accumulate, c, ldc) == 0) return;
#endif
    fl_packed_scalar(m, n, k, a, lda, pb, accumulate, c, ldc);
}
#endif
