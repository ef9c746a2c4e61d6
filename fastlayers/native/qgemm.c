/* Integer matrix products (qgemm.h): c = (a - za) @ (b - zb) exactly in int32, on tiles of up
 * to QGEMM_MR rows x QGEMM_NP 16-column panels of packed b. Compiled once per ISA
 * (kernels.inc): where the path runs VNNI (fl_vnni, dispatch.h) vpdpbusd multiplies u8 x s8
 * quads, on zmm registers on the AVX-512 path and on ymm on the AVX2 path (AVX-VNNI's VEX
 * encoding, or AVX512-VL VNNI's EVEX one on a CPU with AVX-512 VNNI only); without VNNI the
 * AVX2 (ymm, b's quads widened per panel quarter) and AVX-512 (zmm, per half panel) paths widen
 * to int16 and multiply pairs with vpmaddwd; the portable path in C. A is prepared once per call: rows of 4 ceil(k / 4) values a_u (uint8 for vpdpbusd, else
 * int16), their sums and zero points; a convolution gathers its windows into those rows
 * (qconv). */

#include "qgemm_internal.h"
#include "threadpool.h"

#define QGEMM_NP 4                  /* panels of one tile and of one unit of parallel work */
#define QGEMM_ROWS_PER_UNIT 24      /* rows of one unit of parallel work */
#define QGEMM_MIN_SHARE_MACS (1 << 17)
#define QGEMM_MR_MAX 12
#define QGEMM_AMX_ROWS_PER_UNIT 32  /* rows of one unit of parallel work on AMX tiles */
/* Quads of a packed panel (64 bytes each) the int16 tiles prefetch ahead: each tile reads its
 * panel once, from L2 or L3 (2 KiB ahead, as the float tile) */
#define QGEMM_PF_QUADS 32

static __thread fl_buf qgemm_buf;   /* a prepared (calls serial on this thread) */

/* Rows a tile takes on this path. */
FL_INLINE int qgemm_mr(int vnni) {
#if defined(FL_ISA_AVX512)
    return vnni ? 6 : 12;
#elif defined(FL_ISA_AVX2)
    return vnni ? 6 : 3;
#else
    (void)vnni;
    return 4;
#endif
}

/* The 8-bit value at p[i] (int8 when is_signed, else uint8) as int32. */
FL_INLINE int32_t qgemm_at(const void *p, int is_signed, int64_t i) {
    return is_signed ? (int32_t)((const int8_t *)p)[i] : (int32_t)((const uint8_t *)p)[i];
}

int FL_FN(qpack)(const void *b, int b_signed, int64_t ldb, int64_t k, int64_t n,
                 const int32_t *zb, int8_t *pb) {
    int64_t kq = (k + 3) / 4, width = fl_qpacked_width(n);
    int32_t *bz = (int32_t *)(pb + fl_qpacked_quads(k, n)), *cb = bz + width;
    memset(pb, 0, (size_t)fl_qpacked_count(k, n));
    int32_t shift = b_signed ? 0 : 128;
    for (int64_t col = 0; col < n; ++col) {
        int8_t *panel = pb + col / FL_QPANEL * FL_QPANEL * 4 * kq;
        int64_t j = col % FL_QPANEL, sum = 0;
        for (int64_t row = 0; row < k; ++row) {
            int32_t v = qgemm_at((const uint8_t *)b + row * ldb, b_signed, col) - shift;
            panel[(row / 4 * FL_QPANEL + j) * 4 + row % 4] = (int8_t)v;
            sum += v;
        }
        bz[col] = zb[col] - shift;
        /* cb = sum_k b_s - k B, modulo 2^32 like every sum of the product */
        cb[col] = (int32_t)(uint32_t)((uint64_t)sum - (uint64_t)k * (uint64_t)(int64_t)bz[col]);
    }
    return 0;
}

/* ---------------------------------------------------------------------------- tile sums */
#if defined(FL_ISA_AVX512)
/* acc += the quad products of a (uint8) and b (int8): vpdpbusd in place. The intrinsic returns
 * a new value, and GCC then copied each accumulator to another register and back around every
 * instruction (and spilled the 6 x 4 tile's to the stack): twice the instructions. */
__attribute__((target("avx512vnni"), always_inline)) static inline __m512i
qgemm_dpbusd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* out[i][p * 16 + j] = sum_k a_u[i, k] b_s[k, j0 + 16 p + j], R rows x P panels, vpdpbusd.
 * With 1 or 2 rows, R x P accumulators are too few chains to cover vpdpbusd's latency: odd
 * quads go to a second set, added at the end (int32 sums wrap the same in any order). */
__attribute__((target("avx512vnni"), always_inline)) static inline void
qgemm_sums_vnni_rp(const int R, const int P, const uint8_t *au, int64_t lda, int64_t kq, const int8_t *bp,
                   int64_t pstride, int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL]) {
    __m512i acc[QGEMM_MR_MAX][QGEMM_NP], odd[2][QGEMM_NP];
    const int pairs = R <= 2;
    for (int i = 0; i < R; ++i)
        for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_si512();
    int64_t q = 0;
    if (pairs) {
        for (int i = 0; i < R; ++i)
            for (int p = 0; p < P; ++p) odd[i][p] = _mm512_setzero_si512();
        for (; q + 2 <= kq; q += 2) {
            __m512i b0[QGEMM_NP], b1[QGEMM_NP];
            for (int p = 0; p < P; ++p) {
                b0[p] = _mm512_loadu_si512((const void *)(bp + p * pstride + q * 64));
                b1[p] = _mm512_loadu_si512((const void *)(bp + p * pstride + q * 64 + 64));
            }
            for (int i = 0; i < R; ++i) {
                int32_t quads[2];
                memcpy(quads, au + i * lda + 4 * q, sizeof quads);
                __m512i a0 = _mm512_set1_epi32(quads[0]), a1 = _mm512_set1_epi32(quads[1]);
                for (int p = 0; p < P; ++p) {
                    acc[i][p] = qgemm_dpbusd(acc[i][p], a0, b0[p]);
                    odd[i][p] = qgemm_dpbusd(odd[i][p], a1, b1[p]);
                }
            }
        }
    }
    for (; q < kq; ++q) {
        __m512i bv[QGEMM_NP];
        for (int p = 0; p < P; ++p) bv[p] = _mm512_loadu_si512((const void *)(bp + p * pstride + q * 64));
        for (int i = 0; i < R; ++i) {
            int32_t quad;
            memcpy(&quad, au + i * lda + 4 * q, sizeof quad);
            __m512i av = _mm512_set1_epi32(quad);
            for (int p = 0; p < P; ++p) acc[i][p] = qgemm_dpbusd(acc[i][p], av, bv[p]);
        }
    }
    if (pairs)
        for (int i = 0; i < R; ++i)
            for (int p = 0; p < P; ++p) acc[i][p] = _mm512_add_epi32(acc[i][p], odd[i][p]);
    for (int i = 0; i < R; ++i)
        for (int p = 0; p < P; ++p) _mm512_storeu_si512((void *)(out[i] + p * FL_QPANEL), acc[i][p]);
}

#define QGEMM_VNNI_P(R)                                                                      \
    switch (np) {                                                                             \
    case 4: qgemm_sums_vnni_rp(R, 4, au, lda, kq, bp, pstride, out); return;                      \
    case 3: qgemm_sums_vnni_rp(R, 3, au, lda, kq, bp, pstride, out); return;                      \
    case 2: qgemm_sums_vnni_rp(R, 2, au, lda, kq, bp, pstride, out); return;                      \
    default: qgemm_sums_vnni_rp(R, 1, au, lda, kq, bp, pstride, out); return;                     \
    }

__attribute__((target("avx512vnni"))) static void
qgemm_sums_vnni(int rows, int np, const uint8_t *au, int64_t lda, int64_t kq, const int8_t *bp, int64_t pstride,
                int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL]) {
    switch (rows) {   /* constant shapes: unrolled tiles */
    case 6: QGEMM_VNNI_P(6)
    case 5: QGEMM_VNNI_P(5)
    case 4: QGEMM_VNNI_P(4)
    case 3: QGEMM_VNNI_P(3)
    case 2: QGEMM_VNNI_P(2)
    default: QGEMM_VNNI_P(1)
    }
}
#undef QGEMM_VNNI_P
#endif

#if defined(FL_ISA_AVX2)
/* acc += the quad products of a (uint8) and b (int8) on ymm registers: vpdpbusd, VEX-encoded
 * (AVX-VNNI) where vex, else EVEX (AVX512-VL + VNNI); the same instruction and result, one
 * encoding per CPU family. Inline assembly, so the file keeps its AVX2 compiler flags. */
__attribute__((always_inline)) static inline __m256i qgemm_dpbusd_ymm(__m256i acc, __m256i a, __m256i b,
                                                                      const int vex) {
    if (vex) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    else __asm__("vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    return acc;
}

/* out[i][p * 16 + j] = sum_k a_u[i, k] b_s[k, j0 + 16 p + j], R rows x panel p, vpdpbusd on
 * the panel's two ymm halves. */
__attribute__((always_inline)) static inline void
qgemm_sums_vnni256_r(const int R, const int vex, const uint8_t *au, int64_t lda, int64_t kq, const int8_t *bp,
                     int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL], int p) {
    __m256i acc[QGEMM_MR_MAX][2];
    for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int64_t q = 0; q < kq; ++q) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(bp + q * 64));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + q * 64 + 32));
        for (int i = 0; i < R; ++i) {
            int32_t quad;
            memcpy(&quad, au + i * lda + 4 * q, sizeof quad);
            __m256i av = _mm256_set1_epi32(quad);
            acc[i][0] = qgemm_dpbusd_ymm(acc[i][0], av, b0, vex);
            acc[i][1] = qgemm_dpbusd_ymm(acc[i][1], av, b1, vex);
        }
    }
    for (int i = 0; i < R; ++i) {
        _mm256_storeu_si256((__m256i *)(out[i] + p * FL_QPANEL), acc[i][0]);
        _mm256_storeu_si256((__m256i *)(out[i] + p * FL_QPANEL + 8), acc[i][1]);
    }
}

#define QGEMM_VNNI256_R(VEX)                                                                \
    switch (rows) {                                                                         \
    case 6: qgemm_sums_vnni256_r(6, VEX, au, lda, kq, panel, out, p); break;                \
    case 5: qgemm_sums_vnni256_r(5, VEX, au, lda, kq, panel, out, p); break;                \
    case 4: qgemm_sums_vnni256_r(4, VEX, au, lda, kq, panel, out, p); break;                \
    case 3: qgemm_sums_vnni256_r(3, VEX, au, lda, kq, panel, out, p); break;                \
    case 2: qgemm_sums_vnni256_r(2, VEX, au, lda, kq, panel, out, p); break;                \
    default: qgemm_sums_vnni256_r(1, VEX, au, lda, kq, panel, out, p); break;               \
    }

static void qgemm_sums_vnni256(int rows, int np, const uint8_t *au, int64_t lda, int64_t kq, const int8_t *bp,
                               int64_t pstride, int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL]) {
    for (int p = 0; p < np; ++p) {
        const int8_t *panel = bp + p * pstride;
        if (fl_vnni_vex) QGEMM_VNNI256_R(1)
        else QGEMM_VNNI256_R(0)
    }
}
#undef QGEMM_VNNI256_R
#endif

#if defined(__AVX2__) && !defined(FL_ISA_AVX512)
/* acc + vpmaddwd(a, b) with acc updated in place (inline assembly: with the intrinsics GCC kept
 * the tile's accumulators in memory, a load and a store each per step). */
__attribute__((always_inline)) static inline __m256i qgemm_madd_add_ymm(__m256i acc, __m256i a, __m256i b) {
    __m256i t;
    __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(t) : "x"(a), "x"(b));
    return acc;
}

/* The same sums on int16 rows aw, one panel: b's quads widened to int16 a quarter panel at a
 * time (4 columns x 4 values per ymm), vpmaddwd against (a[4q], .., a[4q + 3]) gives each
 * column's two pair sums. 4 R accumulators (R = 3: 12 of the 16 ymm registers). */
FL_INLINE void qgemm_sums_avx2_r(const int R, const int16_t *aw, int64_t lda, int64_t kq, const int8_t *bp,
                                 int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL], int p) {
    __m256i acc[3][4];
    for (int i = 0; i < R; ++i)
        for (int t = 0; t < 4; ++t) acc[i][t] = _mm256_setzero_si256();
    for (int64_t q = 0; q < kq; ++q) {
        __builtin_prefetch(bp + (q + QGEMM_PF_QUADS) * 64, 0, 3);
        for (int t = 0; t < 4; ++t) {
            __m256i bt = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bp + q * 64 + 16 * t)));
            for (int i = 0; i < R; ++i) {
                int64_t quad;
                memcpy(&quad, aw + i * lda + 4 * q, sizeof quad);
                acc[i][t] = qgemm_madd_add_ymm(acc[i][t], _mm256_set1_epi64x(quad), bt);
            }
        }
    }
    for (int i = 0; i < R; ++i)
        for (int t = 0; t < 4; ++t) {
            int32_t pairs[8];
            _mm256_storeu_si256((__m256i *)pairs, acc[i][t]);
            for (int j = 0; j < 4; ++j)
                out[i][p * FL_QPANEL + 4 * t + j] = (int32_t)((uint32_t)pairs[2 * j] + (uint32_t)pairs[2 * j + 1]);
        }
}
#endif

#if defined(FL_ISA_AVX512)
/* acc + vpmaddwd(a, b) with acc updated in place (inline assembly, as qgemm_dpbusd: with the
 * intrinsics GCC kept the accumulators in memory and loaded and stored each one every step). */
__attribute__((always_inline)) static inline __m512i qgemm_madd_add(__m512i acc, __m512i a, __m512i b) {
    __m512i t;
    __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+v"(acc), "=&v"(t) : "v"(a), "v"(b));
    return acc;
}

/* out[i][p * 16 + j] = sum_k a_w[i, k] b_s[k, j0 + 16 p + j], R rows of one panel p on int16
 * rows aw without VNNI: each half panel's quads (8 columns x 4 values, 32 bytes) widened to
 * int16 in a zmm, vpmaddwd against (a[4q], .., a[4q + 3]) broadcast gives each column's two
 * pair sums (u8 x s8 pairs fit int32: exact, unlike vpmaddubsw's int16 pairs); the pairs are
 * added once, after the k loop. 2 R accumulators, each row's broadcast used at once: R = 12
 * takes 24 + 2 + 2 of the 32 zmm registers (a tile of several panels, or the broadcasts loaded
 * first, spilled the accumulators to the stack every step). */
FL_INLINE void qgemm_sums_bw_r(const int R, const int16_t *aw, int64_t lda, int64_t kq, const int8_t *bp,
                               int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL], int p) {
    __m512i lo[QGEMM_MR_MAX], hi[QGEMM_MR_MAX];
    _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm512_setzero_si512();
    for (int64_t q = 0; q < kq; ++q) {
        const __m512i b0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(bp + q * 64)));
        const __m512i b1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(bp + q * 64 + 32)));
        __builtin_prefetch(bp + (q + QGEMM_PF_QUADS) * 64, 0, 3);
        _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
            int64_t quad;
            memcpy(&quad, aw + i * lda + 4 * q, sizeof quad);
            const __m512i av = _mm512_set1_epi64(quad);
            lo[i] = qgemm_madd_add(lo[i], av, b0);
            hi[i] = qgemm_madd_add(hi[i], av, b1);
        }
    }
    /* lanes (2 j, 2 j + 1) of half h hold column 8 h + j's two pair sums */
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {
        __m512i sums = _mm512_add_epi32(_mm512_permutex2var_epi32(lo[i], even, hi[i]),
                                        _mm512_permutex2var_epi32(lo[i], odd, hi[i]));
        _mm512_storeu_si512((void *)(out[i] + p * FL_QPANEL), sums);
    }
}

#define QGEMM_BW_R(R) case R: qgemm_sums_bw_r(R, aw, lda, kq, panel, out, p); break;

/* The R-row tiles of qgemm_sums_bw_r, unrolled (R <= 12), panel by panel. */
static void qgemm_sums_bw(int rows, int np, const int16_t *aw, int64_t lda, int64_t kq, const int8_t *bp,
                          int64_t pstride, int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL]) {
    for (int p = 0; p < np; ++p) {
        const int8_t *panel = bp + p * pstride;
        switch (rows) {   /* constant shapes: unrolled tiles */
        QGEMM_BW_R(12) QGEMM_BW_R(11) QGEMM_BW_R(10) QGEMM_BW_R(9) QGEMM_BW_R(8) QGEMM_BW_R(7)
        QGEMM_BW_R(6) QGEMM_BW_R(5) QGEMM_BW_R(4) QGEMM_BW_R(3) QGEMM_BW_R(2)
        default: qgemm_sums_bw_r(1, aw, lda, kq, panel, out, p); break;
        }
    }
}
#undef QGEMM_BW_R
#endif

/* out (rows x 16 np) = the sums of a's rows i0 .. i0 + rows and np panels from bp. */
static void qgemm_sums(const qgemm_a *a, int64_t i0, int rows, const int8_t *bp, int np,
                       int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL]) {
    int64_t kq = a->kq, pstride = kq * 4 * FL_QPANEL;
#if defined(FL_ISA_AVX512)
    if (a->vnni) {
        qgemm_sums_vnni(rows, np, (const uint8_t *)a->rows + i0 * a->lda, a->lda, kq, bp, pstride, out);
        return;
    }
#elif defined(FL_ISA_AVX2)
    if (a->vnni) {
        qgemm_sums_vnni256(rows, np, (const uint8_t *)a->rows + i0 * a->lda, a->lda, kq, bp, pstride, out);
        return;
    }
#endif
    const int16_t *aw = (const int16_t *)a->rows + i0 * a->lda;
    int64_t lda = a->lda;
#if defined(FL_ISA_AVX512)
    qgemm_sums_bw(rows, np, aw, lda, kq, bp, pstride, out);
#elif defined(__AVX2__)
    for (int p = 0; p < np; ++p) {
        const int8_t *panel = bp + p * pstride;
        switch (rows) {
        case 3: qgemm_sums_avx2_r(3, aw, lda, kq, panel, out, p); break;
        case 2: qgemm_sums_avx2_r(2, aw, lda, kq, panel, out, p); break;
        default: qgemm_sums_avx2_r(1, aw, lda, kq, panel, out, p); break;
        }
    }
#else
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < np * FL_QPANEL; ++j) out[i][j] = 0;
    for (int p = 0; p < np; ++p)
        for (int64_t q = 0; q < kq; ++q) {
            const int8_t *bq = bp + p * pstride + q * 64;
            for (int i = 0; i < rows; ++i) {
                const int16_t *ai = aw + i * lda + 4 * q;
                int32_t *oi = out[i] + p * FL_QPANEL;
                for (int j = 0; j < FL_QPANEL; ++j)
                    oi[j] += ai[0] * bq[4 * j] + ai[1] * bq[4 * j + 1] + ai[2] * bq[4 * j + 2] +
                             ai[3] * bq[4 * j + 3];
            }
        }
#endif
}

/* A tile sum less its zero-point corrections (ra: a's row sum times b's zero point, za: a's
 * zero point times b's column sum), wrapping as int32 does in onnxruntime. */
FL_INLINE uint32_t qgemm_corrected(int32_t sum, uint32_t ra, int32_t bz, uint32_t za, int32_t cb) {
    return (uint32_t)sum - ra * (uint32_t)bz - za * (uint32_t)cb;
}

/* c[i0 + i, j0 + j] for i < rows, j < cols (<= 16 QGEMM_NP): the sums less the zero-point
 * corrections, stored as ``o`` says (fl_qout; its vectors start at column j0; c points at
 * row i0 column j0). */
static void qgemm_store(const qgemm_a *a, int64_t i0, int rows, const int32_t *bz, const int32_t *cb,
                        int64_t cols, int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL],
                        const fl_qout *o, int64_t j0, void *c, int64_t ldc) {
    for (int i = 0; i < rows; ++i) {
        uint32_t ra = (uint32_t)a->ra[i0 + i], za = (uint32_t)a->za[i0 + i];
        int32_t *oi = out[i];
        if (o->kind == FL_QOUT_INT32) {   /* the sums straight into c (no copy of a run-time length) */
            int32_t *ci = (int32_t *)c + i * ldc;
            for (int64_t j = 0; j < cols; ++j)
                ci[j] = (int32_t)qgemm_corrected(oi[j], ra, bz[j], za, cb[j]);
            continue;
        }
        const float *scale = o->scale + j0;
        /* int32, with wrap-around: onnxruntime's Add of a quantized bias */
        const int32_t *ibias = o->ibias ? o->ibias + j0 : 0;
        if (o->kind == FL_QOUT_FLOAT) {
            /* the corrected sums converted in the same pass; the product rounded before the
             * bias is added (two loops: no fused multiply-add), as onnxruntime's output
             * processor and numpy */
            float *ci = (float *)c + i * ldc;
            for (int64_t j = 0; j < cols; ++j) {
                uint32_t acc = qgemm_corrected(oi[j], ra, bz[j], za, cb[j]);
                ci[j] = (float)(int32_t)(ibias ? acc + (uint32_t)ibias[j] : acc) * scale[j];
            }
            if (o->bias)
                for (int64_t j = 0; j < cols; ++j) ci[j] += o->bias[j0 + j];
            continue;
        }
        for (int64_t j = 0; j < cols; ++j) oi[j] = (int32_t)qgemm_corrected(oi[j], ra, bz[j], za, cb[j]);
        if (ibias)
            for (int64_t j = 0; j < cols; ++j) oi[j] = (int32_t)((uint32_t)oi[j] + (uint32_t)ibias[j]);
        /* requantized as MlasRequantizeOutput: float(acc + ibias) * scale clamped to
         * [lo - zero point, hi - zero point] (NaN to the low end: fmaxf returns the number),
         * rounded half to even, plus the zero point */
        float zp = (float)o->zero_point;
        float lo = (o->kind == FL_QOUT_UINT8 ? 0.0f : -128.0f) - zp, hi = (o->kind == FL_QOUT_UINT8 ? 255.0f : 127.0f) - zp;
        int8_t *ci = (int8_t *)c + i * ldc;
        for (int64_t j = 0; j < cols; ++j) {   /* comparisons, not fmaxf/fminf: they vectorize */
            float v = (float)oi[j] * scale[j];
            v = v > lo ? v : lo;               /* NaN compares false: the low end */
            v = v < hi ? v : hi;
            ci[j] = (int8_t)(int32_t)(rintf(v) + zp);
        }
    }
}

/* Bytes of one stored element of c. */
FL_INLINE int64_t qgemm_out_bytes(const fl_qout *o) {
    return o->kind == FL_QOUT_UINT8 || o->kind == FL_QOUT_INT8 ? 1 : 4;
}

#if defined(FL_ISA_AVX512)
/* ------------------------------------------------------------------------------- AMX tiles */
/* The tile configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes (C: 16 x 16 int32;
 * A: 16 rows of 64 u8; B: 16 quads of 16 columns x 4 s8, a panel's layout). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} qgemm_tile_config;

__attribute__((target("amx-tile"))) static void qgemm_amx_begin(void) {
    qgemm_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    /* ldtilecfg with the whole configuration as its operand: _tile_loadconfig names 8 bytes
     * of it, and GCC then drops the stores of the rest */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

__attribute__((target("amx-tile"))) static void qgemm_amx_end(void) { _tile_release(); }

/* out (2 x 16 rows, 32 columns from col) = a's rows i0 .. i0 + 32 (16 where one) times the
 * panels at bp and bp + pstride: tdpbusd sums u8 x s8 quads of 16 rows x 64 values (A) and
 * 16 quads x 16 columns (B, a panel's next 16 quads) into 16 x 16 int32 (C); a's rows are
 * zero past k, so the tail's quads past a panel's end add nothing: they are the next panel's,
 * read in place, except where they would pass b_end (the packed buffer's end), from a zeroed
 * copy. */
__attribute__((target("amx-tile,amx-int8"))) static void
qgemm_amx_pair(const qgemm_a *a, int64_t i0, int two_rows, const int8_t *bp, int64_t pstride, int two_panels,
               const int8_t *b_end, int32_t out[2 * 16][QGEMM_NP * FL_QPANEL], int col) {
    const uint8_t *a0 = (const uint8_t *)a->rows + i0 * a->lda, *a1 = a0 + 16 * a->lda;
    int64_t kq = a->kq, full = kq / 16, tail = kq % 16;
    const int8_t *b1 = bp + (two_panels ? pstride : 0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t <= full; ++t) {
        const int8_t *t0 = bp + t * 16 * 64, *t1 = b1 + t * 16 * 64;
        int8_t z0[16 * 64], z1[16 * 64];
        if (t == full) {              /* the tail: tail quads, then what a's zeros cancel */
            if (!tail) break;
            if (t0 + 16 * 64 > b_end) {
                memset(z0, 0, sizeof z0);
                memcpy(z0, t0, (size_t)tail * 64);
                t0 = z0;
            }
            if (two_panels && t1 + 16 * 64 > b_end) {
                memset(z1, 0, sizeof z1);
                memcpy(z1, t1, (size_t)tail * 64);
                t1 = z1;
            }
        }
        _tile_loadd(4, a0 + t * 64, a->lda);
        _tile_loadd(6, t0, 64);
        _tile_dpbusd(0, 4, 6);
        if (two_panels) {
            _tile_loadd(7, t1, 64);
            _tile_dpbusd(1, 4, 7);
        }
        if (two_rows) {
            _tile_loadd(5, a1 + t * 64, a->lda);
            _tile_dpbusd(2, 5, 6);
            if (two_panels) _tile_dpbusd(3, 5, 7);
        }
    }
    const int64_t stride = QGEMM_NP * FL_QPANEL * sizeof(int32_t);
    _tile_stored(0, &out[0][col], stride);
    if (two_panels) _tile_stored(1, &out[0][col + 16], stride);
    if (two_rows) {
        _tile_stored(2, &out[16][col], stride);
        if (two_panels) _tile_stored(3, &out[16][col + 16], stride);
    }
}

/* qgemm_block on AMX tiles: rows r0:r1 (at most 32, r0 a multiple of 16) by panels p0:p1. */
static void qgemm_block_amx(const qgemm_a *a, const int8_t *pb, int64_t k, int64_t n, int64_t r0, int64_t r1,
                            int64_t p0, int64_t p1, const fl_qout *o, void *c, int64_t ldc) {
    int32_t out[2 * 16][QGEMM_NP * FL_QPANEL];
    int64_t width = fl_qpacked_width(n), pstride = a->kq * 4 * FL_QPANEL, esize = qgemm_out_bytes(o);
    const int32_t *bz = (const int32_t *)(pb + fl_qpacked_quads(k, n)), *cb = bz + width;
    const int8_t *b_end = (const int8_t *)(cb + width);
    for (int64_t i = r0; i < r1; i += 32) {
        int rows = (int)FL_MIN(32, r1 - i);
        for (int64_t p = p0; p < p1; p += QGEMM_NP) {
            int np = (int)FL_MIN(QGEMM_NP, p1 - p);
            int64_t j0 = p * FL_QPANEL, cols = FL_MIN(np * FL_QPANEL, n - j0);
            for (int q = 0; q < np; q += 2)
                qgemm_amx_pair(a, i, rows > 16, pb + (p + q) * pstride, pstride, q + 1 < np, b_end,
                               out, q * FL_QPANEL);
            for (int r = 0; r < rows; r += QGEMM_MR_MAX)
                qgemm_store(a, i + r, (int)FL_MIN(QGEMM_MR_MAX, rows - r), bz + j0, cb + j0, cols,
                            (int32_t(*)[QGEMM_NP * FL_QPANEL])out[r], o, j0,
                            (char *)c + ((i + r) * ldc + j0) * esize, ldc);
        }
    }
}
#endif

/* c[r0:r1, panels p0:p1] of the product, tile by tile (c's rows ldc elements apart, c
 * pointing at row 0 column 0). */
static void qgemm_block(const qgemm_a *a, const int8_t *pb, int64_t k, int64_t n, int64_t r0, int64_t r1,
                        int64_t p0, int64_t p1, const fl_qout *o, void *c, int64_t ldc) {
#if defined(FL_ISA_AVX512)
    if (a->amx) {
        qgemm_block_amx(a, pb, k, n, r0, r1, p0, p1, o, c, ldc);
        return;
    }
#endif
    int32_t out[QGEMM_MR_MAX][QGEMM_NP * FL_QPANEL];
    int64_t width = fl_qpacked_width(n), pstride = a->kq * 4 * FL_QPANEL, esize = qgemm_out_bytes(o);
    const int32_t *bz = (const int32_t *)(pb + fl_qpacked_quads(k, n)), *cb = bz + width;
    int mr = qgemm_mr(a->vnni);
    for (int64_t p = p0; p < p1; p += QGEMM_NP) {
        int np = (int)FL_MIN(QGEMM_NP, p1 - p);
        int64_t j0 = p * FL_QPANEL, cols = FL_MIN(np * FL_QPANEL, n - j0);
        for (int64_t i = r0; i < r1; i += mr) {
            int rows = (int)FL_MIN(mr, r1 - i);
            qgemm_sums(a, i, rows, pb + p * pstride, np, out);
            qgemm_store(a, i, rows, bz + j0, cb + j0, cols, out, o, j0, (char *)c + (i * ldc + j0) * esize, ldc);
        }
    }
}

typedef struct {
    const qgemm_a *a;
    const int8_t *pb;
    int64_t k, n, m, ldc, row_units, groups, unit_rows;
    const fl_qout *o;
    void *c;
} qgemm_ctx;

/* Units: blocks of row_units x QGEMM_ROWS_PER_UNIT rows (their prepared rows stay in L2), and
 * in each block (QGEMM_NP panels) x (QGEMM_ROWS_PER_UNIT rows), panel-major (a tile's slice of
 * b stays in cache while the block's rows pass over it); units past the last row are empty. */
static void qgemm_task(void *p, int64_t u0, int64_t u1) {
    qgemm_ctx *x = (qgemm_ctx *)p;
    int64_t panels = (x->n + FL_QPANEL - 1) / FL_QPANEL, block_units = x->row_units * x->groups;
    FL_FN(qgemm_tiles)(x->a, 1);          /* this thread's tiles, released after its units */
    for (int64_t u = u0; u < u1; ++u) {
        int64_t b = u / block_units, w = u % block_units;
        int64_t p0 = w / x->row_units * QGEMM_NP;
        int64_t r0 = (b * x->row_units + w % x->row_units) * x->unit_rows;
        if (r0 >= x->m) continue;
        qgemm_block(x->a, x->pb, x->k, x->n, r0, FL_MIN(r0 + x->unit_rows, x->m), p0,
                    FL_MIN(p0 + QGEMM_NP, panels), x->o, x->c, x->ldc);
    }
    FL_FN(qgemm_tiles)(x->a, 0);
}

/* The calling thread's tiles for a (qgemm_internal.h). */
void FL_FN(qgemm_tiles)(const qgemm_a *a, int on) {
#if defined(FL_ISA_AVX512)
    if (a->amx && on) qgemm_amx_begin();
    else if (a->amx) qgemm_amx_end();
#else
    (void)a, (void)on;
#endif
}

/* c[:m, panels p0:p1] on the calling thread (qgemm_internal.h). */
void FL_FN(qgemm_panels)(const qgemm_a *a, int64_t m, int64_t n, int64_t k, const int8_t *pb,
                         int64_t p0, int64_t p1, const fl_qout *o, void *c, int64_t ldc) {
    qgemm_block(a, pb, k, n, 0, m, p0, p1, o, c, ldc);
}

/* Bytes of prepared rows of a per block of units (qgemm_task): half of a 1 MiB L2 cache,
 * the rest for b's slices and the output rows. */
#define QGEMM_BLOCK_BYTES (INT64_C(1) << 19)

/* The product of prepared a and packed b on the pool's threads (qgemm_internal.h). */
void FL_FN(qgemm_run)(const qgemm_a *a, int64_t m, int64_t n, int64_t k, const int8_t *pb,
                      const fl_qout *o, void *c, int64_t ldc) {
    int64_t unit_rows = a->amx ? QGEMM_AMX_ROWS_PER_UNIT : QGEMM_ROWS_PER_UNIT;
    int64_t row_units = (m + unit_rows - 1) / unit_rows;
    int64_t row_bytes = 4 * a->kq * (a->vnni ? 1 : 2);
    int64_t most = FL_MAX(1, QGEMM_BLOCK_BYTES / (row_bytes * unit_rows));
    int64_t blocks = (row_units + most - 1) / most;
    int64_t block_rows = (row_units + blocks - 1) / blocks;       /* near-equal blocks */
    int64_t groups = (n + QGEMM_NP * FL_QPANEL - 1) / (QGEMM_NP * FL_QPANEL);
    int64_t units = blocks * block_rows * groups;
    int64_t unit_macs = FL_MIN(m, unit_rows) * QGEMM_NP * FL_QPANEL * FL_MAX(k, 1);
    qgemm_ctx x = {a, pb, k, n, m, ldc, block_rows, groups, unit_rows, o, c};
    fl_parallel(units, FL_MAX(1, QGEMM_MIN_SHARE_MACS / unit_macs), qgemm_task, &x);
}

/* The prepared rows' buffer for m rows of k values and their sums and zero points (ra, za_u
 * after the rows); NULL when it cannot be allocated. */
static char *qgemm_prepared_buffer(int64_t m, size_t rows_bytes, int32_t **ra, int32_t **za_u) {
    char *buf = (char *)fl_buf_grow(&qgemm_buf, rows_bytes + (size_t)(2 * m) * sizeof(int32_t));
    if (buf) {
        *ra = (int32_t *)(buf + rows_bytes);
        *za_u = *ra + m;
    }
    return buf;
}

/* dst[p] = a_u = src[p] (uint8), or src[p] + 128 (int8 when is_signed: the byte with its top bit
 * flipped), as int16 for p < count; returns their sum. 32 bytes at a time on AVX-512 (the tail
 * under a mask), 16 on AVX2, the sums by psadbw on the bytes: the loop GCC made widened each
 * 64-value block to int32 for the sum and ran the tail (a 3x3 window's 72 values of 8 channels:
 * 8 of them) a value at a time. */
FL_INLINE int32_t qgemm_widen_run(int16_t *dst, const uint8_t *src, int64_t count, int is_signed) {
    int64_t p = 0;
    uint64_t sum = 0;
#if defined(FL_ISA_AVX512)
    const __m256i flip = _mm256_set1_epi8(is_signed ? (char)0x80 : 0), zero = _mm256_setzero_si256();
    __m256i acc = zero;
    for (; p + 32 <= count; p += 32) {
        __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(src + p)), flip);
        acc = _mm256_add_epi64(acc, _mm256_sad_epu8(u, zero));
        _mm512_storeu_si512((void *)(dst + p), _mm512_cvtepu8_epi16(u));
    }
    if (p < count) {   /* 1 to 31 values: masked, the bytes past them neither read nor summed */
        __mmask32 mask = (__mmask32)((UINT64_C(1) << (count - p)) - 1);
        __m256i u = _mm256_maskz_mov_epi8(mask, _mm256_xor_si256(_mm256_maskz_loadu_epi8(mask, src + p), flip));
        acc = _mm256_add_epi64(acc, _mm256_sad_epu8(u, zero));
        _mm512_mask_storeu_epi16((void *)(dst + p), mask, _mm512_cvtepu8_epi16(u));
        p = count;
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, acc);
    sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#elif defined(__AVX2__)
    const __m128i flip = _mm_set1_epi8(is_signed ? (char)0x80 : 0), zero = _mm_setzero_si128();
    __m128i acc = zero;
    for (; p + 16 <= count; p += 16) {
        __m128i u = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + p)), flip);
        acc = _mm_add_epi64(acc, _mm_sad_epu8(u, zero));
        _mm256_storeu_si256((__m256i *)(dst + p), _mm256_cvtepu8_epi16(u));
    }
    sum = (uint64_t)_mm_cvtsi128_si64(acc) + (uint64_t)_mm_extract_epi64(acc, 1);
#endif
    uint8_t top = is_signed ? 0x80 : 0;
    for (; p < count; ++p) {
        uint8_t v = src[p] ^ top;
        dst[p] = (int16_t)v;
        sum += v;
    }
    return (int32_t)sum;
}

#if defined(__SSE2__) && defined(__x86_64__)
#include <emmintrin.h>
#endif
/* sum_j (src[j] ^ flip) over count 8-bit values (psadbw where x86-64 has it): a prepared
 * row's sum taken from its source, not from the row just written (loads of a row's bytes right
 * after their stores of other sizes wait for the stores to reach the cache). */
FL_INLINE int32_t qgemm_run_sum(const uint8_t *src, int64_t count, uint8_t flip) {
    uint64_t s = 0;
    int64_t j = 0;
#if defined(__SSE2__) && defined(__x86_64__)
    const __m128i f = _mm_set1_epi8((char)flip), f_low = _mm_move_epi64(f), zero = _mm_setzero_si128();
    __m128i acc = zero;
    for (; j + 16 <= count; j += 16)
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + j)), f), zero));
    for (; j + 8 <= count; j += 8)   /* 8 bytes, the upper half zero (not flipped) */
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_xor_si128(_mm_loadl_epi64((const __m128i *)(src + j)), f_low), zero));
    s = (uint64_t)_mm_cvtsi128_si64(acc) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc));
#endif
    for (; j < count; ++j) s += (uint8_t)(src[j] ^ flip);
    return (int32_t)s;
}

/* Puts count values of src (8-bit, int8 when is_signed, else uint8; stride elements apart) as
 * a_u (plus shift) at index idx of the prepared rows; returns their sum. */
FL_INLINE int32_t qgemm_put_run(void *rows, int vnni, int64_t idx, const uint8_t *src, int64_t stride,
                                int is_signed, int32_t shift, int64_t count) {
    int32_t sum = 0;
    if (vnni && !is_signed) {   /* uint8 copied as it is (a loop: the runs are short) */
        uint8_t *dst = (uint8_t *)rows + idx;
        if (stride == 1)
            for (int64_t p = 0; p < count; ++p) sum += dst[p] = src[p];
        else
            for (int64_t p = 0; p < count; ++p) sum += dst[p] = src[p * stride];
        return sum;
    }
    if (!vnni) {   /* widened to int16: loops of one type each (vectorized where stride is 1) */
        int16_t *dst = (int16_t *)rows + idx;
        const int8_t *s8 = (const int8_t *)src;
        if (stride == 1) return qgemm_widen_run(dst, src, count, is_signed);
        if (is_signed)
            for (int64_t p = 0; p < count; ++p) sum += dst[p] = (int16_t)(s8[p * stride] + 128);
        else
            for (int64_t p = 0; p < count; ++p) sum += dst[p] = (int16_t)src[p * stride];
        return sum;
    }
    for (int64_t p = 0; p < count; ++p) {   /* int8 to uint8 a_u */
        int32_t v = qgemm_at(src, is_signed, p * stride) + shift;
        qgemm_put(rows, vnni, idx + p, v);
        sum += v;
    }
    return sum;
}

/* What qgemm_prepare_rows reads and writes. */
typedef struct {
    const uint8_t *a;
    int64_t lda, k, width;
    int a_signed, vnni, in_place;
    const int32_t *za;
    char *buf;
    int32_t *ra, *za_u;
} qgemm_prep;

/* Rows i0:i1 of a prepared for the tiles: their a_u (in place: a itself), sums and zero
 * points. */
static void qgemm_prepare_rows(void *p, int64_t i0, int64_t i1) {
    const qgemm_prep *x = (const qgemm_prep *)p;
    int32_t shift = x->a_signed ? 128 : 0;
    for (int64_t i = i0; i < i1; ++i) {
        const uint8_t *row = x->a + i * x->lda;
        if (x->in_place) {
            x->ra[i] = qgemm_run_sum(row, x->k, 0);
        } else {      /* zeros after k */
            x->ra[i] = qgemm_put_run(x->buf, x->vnni, i * x->width, row, 1, x->a_signed, shift, x->k);
            qgemm_put_fill(x->buf, x->vnni, i * x->width + x->k, 0, x->width - x->k);
        }
        x->za_u[i] = (int32_t)((uint32_t)x->za[i] + (uint32_t)shift);
    }
}

/* Bytes of a's rows below which their preparation stays on one thread. */
#define QGEMM_PREP_SHARE_BYTES (1 << 15)

int FL_FN(qgemm)(int64_t m, int64_t n, int64_t k, const void *a, int a_signed, int64_t lda,
                 const int32_t *za, const int8_t *pb, const fl_qout *out, void *c, int64_t ldc) {
    static const fl_qout sums = {FL_QOUT_INT32, 0, 0, 0, 0};
    if (m <= 0 || n <= 0) return 0;
    int vnni = qgemm_vnni(), amx = qgemm_amx(m, vnni);
    int64_t kq = (k + 3) / 4, width = qgemm_row_width(k, amx);
    /* uint8 rows as vpdpbusd (AMX: whole tiles of them) reads them */
    int in_place = vnni && !a_signed && k == width && m == qgemm_row_count(m, amx);
    size_t rows_bytes = in_place ? 0 : qgemm_rows_bytes(m, k, vnni, amx);
    int32_t *ra, *za_u;
    char *buf = qgemm_prepared_buffer(m, rows_bytes, &ra, &za_u);
    if (!buf) return -1;
    qgemm_prep prep = {(const uint8_t *)a, lda, k, width, a_signed, vnni, in_place, za, buf, ra, za_u};
    fl_parallel_values(m, FL_MAX(1, QGEMM_PREP_SHARE_BYTES / FL_MAX(k, 1)), m * k, qgemm_prepare_rows, &prep);
    if (!in_place)    /* AMX's rows past m, read by the last tile */
        qgemm_put_fill(buf, vnni, m * width, 0, (qgemm_row_count(m, amx) - m) * width);
    qgemm_a prepared = {in_place ? a : (const void *)buf, in_place ? lda : width, ra, za_u, kq, vnni, amx};
    FL_FN(qgemm_run)(&prepared, m, n, k, pb, out ? out : &sums, c, ldc);
    return 0;
}

/* ------------------------------------------------------------------- integer convolution */
#define QCONV_PREP_ROWS 32                 /* rows of one unit of the gather */
#define QCONV_MIN_SHARE_BYTES (1 << 15)    /* gathered bytes below which it stays on one thread */

typedef struct {
    const fl_qconv_geom *g;
    const uint8_t *x;
    int x_signed, vnni;
    int32_t shift, pad_u;        /* the shift to a_u, x's zero point as a_u (padding reads as it) */
    int rows_run;                /* a kernel row's taps are kw cin consecutive values of x */
    const uint8_t *x_end;        /* x's last value + 1 where its strides are positive, else NULL */
    int64_t width;               /* values of a prepared row (qgemm_row_width) */
    void *rows;
    int32_t *ra;
} qconv_prep;

/* Rows r0:r1 of the gather: row (b, oy, ox) holds the window's taps (ki, kj), each the group's
 * cin channels of x[b, oy sh - top + ki dh, ox sw - left + kj dw] (the zero point outside x). */
/* dst[0:count] = src[0:count] ^ flip (flip 0x80: int8 to a_u), 16 bytes at a time while dst
 * (its row) and src have room; bytes past count up to the room may be written (the row's
 * later runs and its zero tail overwrite them). */
FL_INLINE void qconv_copy(uint8_t *dst, const uint8_t *src, int64_t count, uint8_t flip, const uint8_t *dst_end,
                          const uint8_t *src_end) {
    int64_t p = 0;
    for (; p < count && dst + p + 16 <= dst_end && src + p + 16 <= src_end; p += 16) {
        uint8_t t[16];
        memcpy(t, src + p, 16);
        for (int j = 0; j < 16; ++j) t[j] ^= flip;
        memcpy(dst + p, t, 16);
    }
    for (; p < count; ++p) dst[p] = src[p] ^ flip;
}

/* One tap run of the gather: count values of x from src, stride apart, at index idx of row i
 * (whose values start at row); adds their a_u sum to *sum. */
FL_INLINE void qconv_put(const qconv_prep *q, void *row, int64_t idx, const uint8_t *src, int64_t stride,
                         int64_t count, int32_t *sum) {
    if (!q->vnni) {
        *sum += qgemm_put_run(q->rows, 0, idx, src, stride, q->x_signed, q->shift, count);
        return;
    }
    uint8_t *dst = (uint8_t *)q->rows + idx, flip = q->x_signed ? 0x80 : 0;
    if (stride == 1) {
        qconv_copy(dst, src, count, flip, (uint8_t *)row + q->width, q->x_end);
        *sum += qgemm_run_sum(src, count, flip);
        return;
    }
    int32_t s = 0;
    for (int64_t p = 0; p < count; ++p) s += dst[p] = src[p * stride] ^ flip;
    *sum += s;
}

/* Rows u0 QCONV_PREP_ROWS .. u1 QCONV_PREP_ROWS of the gather: row (b, oy, ox) holds the
 * window's taps (ki, kj), each the group's cin channels of
 * x[b, oy sh - top + ki dh, ox sw - left + kj dw] (the zero point outside x). */
static void qconv_gather(void *p, int64_t u0, int64_t u1) {
    const qconv_prep *q = (const qconv_prep *)p;
    const fl_qconv_geom *g = q->g;
    int64_t m = g->n * g->oh * g->ow, width = q->width, k = g->kh * g->kw * g->cin;
    int64_t i = u0 * QCONV_PREP_ROWS, end = FL_MIN(u1 * QCONV_PREP_ROWS, m);
    int64_t b = i / (g->oh * g->ow), oy = i / g->ow % g->oh, ox = i % g->ow;
    for (; i < end; ++i) {
        int64_t idx = i * width;
        int32_t sum = 0;
        void *row = (char *)q->rows + idx * (q->vnni ? 1 : 2);
        const uint8_t *image = q->x + b * g->xs[0] + g->c0 * g->xs[3];
        for (int64_t ki = 0; ki < g->kh; ++ki) {
            int64_t y = oy * g->sh - g->top + ki * g->dh, x0 = ox * g->sw - g->left;
            if (q->rows_run && y >= 0 && y < g->h && x0 >= 0 && x0 + g->kw <= g->w) {
                /* the kernel row's taps lie side by side in x: one run */
                qconv_put(q, row, idx, image + y * g->xs[1] + x0 * g->xs[2], 1, g->kw * g->cin, &sum);
                idx += g->kw * g->cin;
                continue;
            }
            for (int64_t kj = 0; kj < g->kw; ++kj, idx += g->cin) {
                int64_t xw = x0 + kj * g->dw;
                if (y < 0 || y >= g->h || xw < 0 || xw >= g->w) {
                    qgemm_put_fill(q->rows, q->vnni, idx, q->pad_u, g->cin);
                    sum += q->pad_u * (int32_t)g->cin;
                    continue;
                }
                qconv_put(q, row, idx, image + y * g->xs[1] + xw * g->xs[2], g->xs[3], g->cin, &sum);
            }
        }
        qgemm_put_fill(q->rows, q->vnni, i * width + k, 0, width - k);   /* zeros after k */
        q->ra[i] = sum;
        if (++ox == g->ow) {   /* the next output pixel */
            ox = 0;
            if (++oy == g->oh) oy = 0, ++b;
        }
    }
}

static __thread fl_buf qconv_buf;   /* x channels last (calls serial on this thread) */

typedef struct {
    const fl_qconv_geom *g;
    const uint8_t *x;
    uint8_t *dst;
} qconv_nhwc;

/* Pixels u0:u1 (n h w of them) of the group's channels of x copied channels last. */
static void qconv_to_nhwc(void *p, int64_t u0, int64_t u1) {
    const qconv_nhwc *t = (const qconv_nhwc *)p;
    const fl_qconv_geom *g = t->g;
    int64_t b = u0 / (g->h * g->w), y = u0 / g->w % g->h, x = u0 % g->w;   /* divisions once */
    for (int64_t u = u0; u < u1; ++u) {
        const uint8_t *src = t->x + b * g->xs[0] + y * g->xs[1] + x * g->xs[2] + g->c0 * g->xs[3];
        uint8_t *dst = t->dst + u * g->cin;
        for (int64_t ch = 0; ch < g->cin; ++ch) dst[ch] = src[ch * g->xs[3]];
        if (++x == g->w) {
            x = 0;
            if (++y == g->h) y = 0, ++b;
        }
    }
}

int FL_FN(qconv)(const fl_qconv_geom *g, const void *x, int x_signed, int32_t x_zp, int64_t n,
                 const int8_t *pb, const fl_qout *out, void *c, int64_t ldc) {
    static const fl_qout sums = {FL_QOUT_INT32, 0, 0, 0, 0};
    int64_t m = g->n * g->oh * g->ow, k = g->kh * g->kw * g->cin;
    if (m <= 0 || n <= 0) return 0;
    int vnni = qgemm_vnni(), amx = qgemm_amx(m, vnni);
    int64_t kq = (k + 3) / 4, width = qgemm_row_width(k, amx);
    size_t rows_bytes = qgemm_rows_bytes(m, k, vnni, amx);
    int32_t *ra, *za_u;
    char *buf = qgemm_prepared_buffer(m, rows_bytes, &ra, &za_u);
    if (!buf) return -1;
    int32_t shift = x_signed ? 128 : 0, zp_u = (int32_t)((uint32_t)x_zp + (uint32_t)shift);
    for (int64_t i = 0; i < m; ++i) za_u[i] = zp_u;
    fl_qconv_geom nhwc = *g;
    if (g->cin == 1 && g->c0 == 0) nhwc.xs[3] = 1;   /* one channel: its stride is never used */
    if (nhwc.xs[3] != 1 && g->kh * g->kw > 1) {
        /* channels apart (an NCHW array): each value is read by several windows, so x is
         * copied channels last first and the windows gather runs of it */
        uint8_t *xc = (uint8_t *)fl_buf_grow(&qconv_buf, (size_t)(g->n * g->h * g->w * g->cin));
        if (!xc) return -1;
        qconv_nhwc t = {g, (const uint8_t *)x, xc};
        fl_parallel(g->n * g->h * g->w, FL_MAX(1, QCONV_MIN_SHARE_BYTES / g->cin), qconv_to_nhwc, &t);
        nhwc.xs[3] = 1, nhwc.xs[2] = g->cin, nhwc.xs[1] = g->w * g->cin, nhwc.xs[0] = g->h * g->w * g->cin;
        nhwc.c0 = 0;
        x = xc;
    }
    int rows_run = nhwc.xs[3] == 1 && nhwc.xs[2] == nhwc.cin && (nhwc.dw == 1 || nhwc.kw == 1);
    const uint8_t *x_end = (const uint8_t *)x + 1;
    for (int d = 0; d < 4; ++d) {
        int64_t extent = d == 0 ? nhwc.n : d == 1 ? nhwc.h : d == 2 ? nhwc.w : nhwc.c0 + nhwc.cin;
        if (nhwc.xs[d] < 0) x_end = 0;
        if (x_end) x_end += (extent - 1) * nhwc.xs[d];
    }
    qconv_prep q = {&nhwc, (const uint8_t *)x, x_signed, vnni, shift, zp_u, rows_run, x_end, width, buf, ra};
    int64_t units = (m + QCONV_PREP_ROWS - 1) / QCONV_PREP_ROWS;
    fl_parallel(units, FL_MAX(1, QCONV_MIN_SHARE_BYTES / (QCONV_PREP_ROWS * width)), qconv_gather, &q);
    /* AMX's rows past m, read by the last tile */
    qgemm_put_fill(buf, vnni, m * width, 0, (qgemm_row_count(m, amx) - m) * width);
    qgemm_a prepared = {buf, width, ra, za_u, kq, vnni, amx};
    FL_FN(qgemm_run)(&prepared, m, n, k, pb, out ? out : &sums, c, ldc);
    return 0;
}
