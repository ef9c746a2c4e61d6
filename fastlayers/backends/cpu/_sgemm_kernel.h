/* Single-threaded float32 GEMM with an AVX-512 micro-kernel (fastlayers' own sgemm).
 *
 * c (m, n) = a (m, k) @ b (k, n) [b given as (n, k) when transposed] + beta c, row major, in the
 * BLIS loop order: B blocks of FL_KC x FL_NC packed into FL_NR-column panels (L3), A blocks of
 * FL_MC x FL_KC packed into FL_MR-row panels (L2), and a 14 x 32 micro-kernel (28 zmm
 * accumulators) over each pair of panels. fl_sgemm takes the arguments of cblas_sgemm (64-bit
 * integers) so that compiled kernels can call either; calls it does not cover (column major, a
 * transposed, alpha != 1, beta other than 0 or 1, a CPU without AVX-512F) go to the fallback
 * (numpy's OpenBLAS), set once by fl_set_fallback. Packing buffers are per thread and reused.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*fl_cblas_sgemm_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                                 int64_t, const float *, int64_t, float, float *, int64_t);

static fl_cblas_sgemm_t fl_fallback = 0;

static void fl_set_fallback(uintptr_t address) { fl_fallback = (fl_cblas_sgemm_t)address; }

#define FL_MR 14
#define FL_NR 32
#define FL_KC 256
#define FL_MC 336
#define FL_NC 2048

static __thread float *fl_buf = 0;
static __thread size_t fl_buf_floats = 0;

/* This thread's packing buffer of at least `floats` floats (64-byte aligned), or NULL. */
static float *fl_workspace(size_t floats) {
    if (fl_buf_floats < floats) {
        free(fl_buf);
        fl_buf = (float *)aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        fl_buf_floats = fl_buf ? floats : 0;
    }
    return fl_buf;
}

/* pb[panel][p][j] = b[k0 + p, j0 + panel * NR + j], zero past column nc (b (k, n) or, when
 * trans_b, (n, k)). */
static void fl_pack_b(const float *b, int64_t ldb, int trans_b, int64_t k0, int64_t kc,
                      int64_t j0, int64_t nc, float *pb) {
    for (int64_t jr = 0; jr < nc; jr += FL_NR) {
        int64_t nr = nc - jr < FL_NR ? nc - jr : FL_NR;
        float *dst = pb + jr * kc;
        if (!trans_b) {
            for (int64_t p = 0; p < kc; ++p) {
                const float *src = b + (k0 + p) * ldb + j0 + jr;
                float *row = dst + p * FL_NR;
                memcpy(row, src, (size_t)nr * sizeof(float));
                if (nr < FL_NR) memset(row + nr, 0, (size_t)(FL_NR - nr) * sizeof(float));
            }
        } else {
            if (nr < FL_NR) memset(dst, 0, (size_t)(kc * FL_NR) * sizeof(float));
            for (int64_t j = 0; j < nr; ++j) {
                const float *src = b + (j0 + jr + j) * ldb + k0;
                for (int64_t p = 0; p < kc; ++p) dst[p * FL_NR + j] = src[p];
            }
        }
    }
}

/* pa[panel][p][i] = a[i0 + panel * MR + i, k0 + p], zero past row mc. */
static void fl_pack_a(const float *a, int64_t lda, int64_t i0, int64_t mc, int64_t k0,
                      int64_t kc, float *pa) {
    for (int64_t ir = 0; ir < mc; ir += FL_MR) {
        int64_t mr = mc - ir < FL_MR ? mc - ir : FL_MR;
        float *dst = pa + ir * kc;
        if (mr < FL_MR) memset(dst, 0, (size_t)(kc * FL_MR) * sizeof(float));
        for (int64_t i = 0; i < mr; ++i) {
            const float *src = a + (i0 + ir + i) * lda + k0;
            for (int64_t p = 0; p < kc; ++p) dst[p * FL_MR + i] = src[p];
        }
    }
}

/* Floats of the whole of b (k, n) packed for fl_sgemm_packed: KC-row blocks of NR-column
 * panels, block pc starting at pc * (n rounded up to NR). */
static int64_t fl_packed_floats(int64_t k, int64_t n) {
    return k * ((n + FL_NR - 1) / FL_NR) * FL_NR;
}

static void fl_pack_all(const float *b, int64_t ldb, int trans_b, int64_t k, int64_t n,
                        float *pb) {
    int64_t npad = ((n + FL_NR - 1) / FL_NR) * FL_NR;
    for (int64_t pc = 0; pc < k; pc += FL_KC) {
        int64_t kc = k - pc < FL_KC ? k - pc : FL_KC;
        fl_pack_b(b, ldb, trans_b, pc, kc, 0, n, pb + pc * npad);
    }
}

/* c (m, n) (+)= a (m, k) @ b with b packed by fl_pack_all, one multiply-add at a time: where
 * the micro-kernel is not compiled or its buffer cannot be allocated. */
static void fl_packed_scalar(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                             const float *pb, int accumulate, float *c, int64_t ldc) {
    int64_t npad = ((n + FL_NR - 1) / FL_NR) * FL_NR;
    for (int64_t i = 0; i < m; ++i) {
        float *row = c + i * ldc;
        if (!accumulate) memset(row, 0, (size_t)n * sizeof(float));
        for (int64_t pc = 0; pc < k; pc += FL_KC) {
            int64_t kc = k - pc < FL_KC ? k - pc : FL_KC;
            const float *block = pb + pc * npad;
            for (int64_t p = 0; p < kc; ++p) {
                float ap = a[i * lda + pc + p];
                for (int64_t j = 0; j < n; ++j)
                    row[j] += ap * block[(j / FL_NR) * kc * FL_NR + p * FL_NR + j % FL_NR];
            }
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

/* c[0:mr, 0:nr] (+)= sum_p pa[p][0:mr] outer pb[p][0:nr] with a rows x 32 register tile (A
 * panels keep their FL_MR stride; rows is a constant in each caller below). */
FL_TARGET static inline __attribute__((always_inline)) void
fl_tile(const int rows, int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc,
        int mr, int nr, int accumulate) {
    __m512 c0[FL_MR], c1[FL_MR];
#pragma GCC unroll 14
    for (int i = 0; i < rows; ++i) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kc; ++p) {
        __m512 b0 = _mm512_loadu_ps(pb);
        __m512 b1 = _mm512_loadu_ps(pb + 16);
#pragma GCC unroll 14
        for (int i = 0; i < rows; ++i) {
            __m512 ai = _mm512_set1_ps(pa[i]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
        pa += FL_MR;
        pb += FL_NR;
    }
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

FL_TARGET static void fl_tile14(int64_t kc, const float *pa, const float *pb, float *c,
                                int64_t ldc, int mr, int nr, int accumulate) {
    fl_tile(14, kc, pa, pb, c, ldc, mr, nr, accumulate);
}

FL_TARGET static void fl_tile8(int64_t kc, const float *pa, const float *pb, float *c,
                               int64_t ldc, int mr, int nr, int accumulate) {
    fl_tile(8, kc, pa, pb, c, ldc, mr, nr, accumulate);
}

FL_TARGET static void fl_tile4(int64_t kc, const float *pa, const float *pb, float *c,
                               int64_t ldc, int mr, int nr, int accumulate) {
    fl_tile(4, kc, pa, pb, c, ldc, mr, nr, accumulate);
}

/* c[ic:ic + mc, :n] (+)= packed A block (mc x kc) @ packed B block (kc x n, panels kc x NR):
 * the smallest tile that covers each row panel. */
FL_TARGET static void fl_block(int64_t mc, int64_t n, int64_t kc, const float *pa,
                               const float *pb, float *c, int64_t ldc, int accumulate) {
    for (int64_t jr = 0; jr < n; jr += FL_NR) {
        int nr = (int)(n - jr < FL_NR ? n - jr : FL_NR);
        for (int64_t ir = 0; ir < mc; ir += FL_MR) {
            int mr = (int)(mc - ir < FL_MR ? mc - ir : FL_MR);
            const float *a = pa + ir * kc, *b = pb + jr * kc;
            float *cc = c + ir * ldc + jr;
            if (mr > 8) fl_tile14(kc, a, b, cc, ldc, mr, nr, accumulate);
            else if (mr > 4) fl_tile8(kc, a, b, cc, ldc, mr, nr, accumulate);
            else fl_tile4(kc, a, b, cc, ldc, mr, nr, accumulate);
        }
    }
}

/* fl_packed_product with the micro-kernel; -1 when the A buffer cannot be allocated. */
FL_TARGET static int fl_packed_tiles(int64_t m, int64_t n, int64_t k, const float *a,
                                     int64_t lda, const float *pb, int accumulate, float *c,
                                     int64_t ldc) {
    int64_t npad = ((n + FL_NR - 1) / FL_NR) * FL_NR;
    int64_t mc_max = m < FL_MC ? m : FL_MC;
    int64_t kc_max = k < FL_KC ? k : FL_KC;
    float *pa = fl_workspace((size_t)(kc_max * ((mc_max + FL_MR - 1) / FL_MR) * FL_MR));
    if (!pa) return -1;
    for (int64_t pc = 0; pc < k; pc += FL_KC) {
        int64_t kc = k - pc < FL_KC ? k - pc : FL_KC;
        int acc = accumulate || pc > 0;
        for (int64_t ic = 0; ic < m; ic += FL_MC) {
            int64_t mc = m - ic < FL_MC ? m - ic : FL_MC;
            fl_pack_a(a, lda, ic, mc, pc, kc, pa);
            fl_block(mc, n, kc, pa, pb + pc * npad, c + ic * ldc, ldc, acc);
        }
    }
    return 0;
}

/* The blocked product, or -1 when the packing buffer cannot be allocated. */
FL_TARGET static int fl_blocked(int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
                                int64_t lda, const float *b, int64_t ldb, int accumulate,
                                float *c, int64_t ldc) {
    int64_t nc_max = n < FL_NC ? n : FL_NC;
    int64_t mc_max = m < FL_MC ? m : FL_MC;
    int64_t kc_max = k < FL_KC ? k : FL_KC;
    size_t b_floats = (size_t)(kc_max * ((nc_max + FL_NR - 1) / FL_NR) * FL_NR);
    size_t a_floats = (size_t)(kc_max * ((mc_max + FL_MR - 1) / FL_MR) * FL_MR);
    float *pb = fl_workspace(b_floats + a_floats);
    if (!pb) return -1;
    float *pa = pb + b_floats;
    for (int64_t jc = 0; jc < n; jc += FL_NC) {
        int64_t nc = n - jc < FL_NC ? n - jc : FL_NC;
        for (int64_t pc = 0; pc < k; pc += FL_KC) {
            int64_t kc = k - pc < FL_KC ? k - pc : FL_KC;
            int acc = accumulate || pc > 0;
            fl_pack_b(b, ldb, trans_b, pc, kc, jc, nc, pb);
            for (int64_t ic = 0; ic < m; ic += FL_MC) {
                int64_t mc = m - ic < FL_MC ? m - ic : FL_MC;
                fl_pack_a(a, lda, ic, mc, pc, kc, pa);
                fl_block(mc, nc, kc, pa, pb, c + ic * ldc + jc, ldc, acc);
            }
        }
    }
    return 0;
}
#else
#define FL_HAVE_KERNEL 0
static int fl_supported(void) { return 0; }
#endif

static void fl_sgemm(int layout, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float beta, float *c, int64_t ldc) {
#if FL_HAVE_KERNEL
    if (layout == 101 && trans_a == 111 && alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) {
        if (m <= 0 || n <= 0) return;
        if (k <= 0) {
            if (beta == 0.0f)
                for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
            return;
        }
        if (fl_blocked(trans_b == 112, m, n, k, a, lda, b, ldb, beta == 1.0f, c, ldc) == 0)
            return;
    }
#endif
    fl_fallback(layout, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

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
