/* Integer matrix products (qgemm.h): c = (a - za) @ (b - zb) exactly in int32, on tiles of
 * QGEMM_MR rows x one 16-column panel of packed b. Compiled once per ISA (kernels.inc): the
 * AVX2 and AVX-512 paths multiply int16 pairs with vpmaddwd (exact), the portable path in C.
 * A is widened to int16 less its zero point once per call (rows of 2 * ceil(k / 2) values). */

#define QGEMM_MR 5   /* 10 accumulators, the b pair, a broadcast and a product: no spill in 16 ymm */
#define QGEMM_ROWS_PER_UNIT 20      /* rows of one unit of parallel work */
#define QGEMM_MIN_SHARE_MACS (1 << 17)

static __thread fl_buf qgemm_buf;   /* a widened (calls serial on this thread) */

/* The 8-bit value at p[i] (int8 when is_signed, else uint8) as int32. */
FL_INLINE int32_t qgemm_at(const void *p, int is_signed, int64_t i) {
    return is_signed ? (int32_t)((const int8_t *)p)[i] : (int32_t)((const uint8_t *)p)[i];
}

int FL_FN(qpack)(const void *b, int b_signed, int64_t ldb, int64_t k, int64_t n,
                 const int32_t *zb, int16_t *pb) {
    int64_t kp = (k + 1) / 2;
    for (int64_t j0 = 0; j0 < n; j0 += FL_QPANEL) {
        int16_t *panel = pb + j0 * 2 * kp;
        for (int64_t p = 0; p < kp; ++p)
            for (int64_t j = 0; j < FL_QPANEL; ++j)
                for (int t = 0; t < 2; ++t) {
                    int64_t row = 2 * p + t, col = j0 + j;
                    panel[(p * FL_QPANEL + j) * 2 + t] =
                        row < k && col < n
                            ? (int16_t)(qgemm_at((const uint8_t *)b + row * ldb, b_signed, col) - zb[col])
                            : 0;
                }
    }
    return 0;
}

/* c[i, j] for i < rows, j < cols (<= 16) of the tile whose widened rows start at aw (row
 * stride 2 kp) and whose panel is bp: int32 sums, or float(sum) * scale[j] (+ bias[j]) where
 * scale (the tile's columns) is not NULL. */
FL_INLINE void qgemm_tile(const int rows, int64_t kp, const int16_t *aw, const int16_t *bp,
                          const float *scale, const float *bias, void *c, int64_t ldc,
                          int64_t cols) {
    int32_t out[QGEMM_MR][FL_QPANEL];
#if defined(__AVX2__)
    __m256i acc[QGEMM_MR][2];
    for (int i = 0; i < rows; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    for (int64_t p = 0; p < kp; ++p) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(bp + p * 2 * FL_QPANEL));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bp + p * 2 * FL_QPANEL + 16));
        for (int i = 0; i < rows; ++i) {
            int32_t pair;
            memcpy(&pair, aw + i * 2 * kp + 2 * p, sizeof pair);
            __m256i av = _mm256_set1_epi32(pair);
            acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(av, b0));
            acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(av, b1));
        }
    }
    for (int i = 0; i < rows; ++i) {
        _mm256_storeu_si256((__m256i *)out[i], acc[i][0]);
        _mm256_storeu_si256((__m256i *)(out[i] + 8), acc[i][1]);
    }
#else
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < FL_QPANEL; ++j) out[i][j] = 0;
    for (int64_t p = 0; p < kp; ++p) {
        const int16_t *bq = bp + p * 2 * FL_QPANEL;
        for (int i = 0; i < rows; ++i) {
            int32_t a0 = aw[i * 2 * kp + 2 * p], a1 = aw[i * 2 * kp + 2 * p + 1];
            for (int j = 0; j < FL_QPANEL; ++j) out[i][j] += a0 * bq[2 * j] + a1 * bq[2 * j + 1];
        }
    }
#endif
    if (!scale) {
        for (int i = 0; i < rows; ++i)
            memcpy((int32_t *)c + i * ldc, out[i], (size_t)cols * sizeof(int32_t));
        return;
    }
    /* the product rounded before the bias is added (two loops: no fused multiply-add), as
     * onnxruntime's output processor and numpy */
    for (int i = 0; i < rows; ++i) {
        float *ci = (float *)c + i * ldc;
        for (int64_t j = 0; j < cols; ++j) ci[j] = (float)out[i][j] * scale[j];
        if (bias)
            for (int64_t j = 0; j < cols; ++j) ci[j] += bias[j];
    }
}

typedef struct {
    int64_t m, n, kp, ldc, row_units;
    const int16_t *aw, *pb;
    const float *scale, *bias;
    void *c;
} qgemm_ctx;

/* Units: (block of QGEMM_ROWS_PER_UNIT rows) x (16-column panel), panel-major. */
static void qgemm_task(void *p, int64_t u0, int64_t u1) {
    qgemm_ctx *x = (qgemm_ctx *)p;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t j0 = u / x->row_units * FL_QPANEL, r0 = u % x->row_units * QGEMM_ROWS_PER_UNIT;
        int64_t r1 = FL_MIN(r0 + QGEMM_ROWS_PER_UNIT, x->m), cols = FL_MIN(FL_QPANEL, x->n - j0);
        const int16_t *bp = x->pb + j0 * 2 * x->kp;
        const float *scale = x->scale ? x->scale + j0 : 0, *bias = x->bias ? x->bias + j0 : 0;
        for (int64_t i = r0; i < r1; i += QGEMM_MR) {
            const int16_t *aw = x->aw + i * 2 * x->kp;
            void *c = x->scale ? (void *)((float *)x->c + i * x->ldc + j0)
                               : (void *)((int32_t *)x->c + i * x->ldc + j0);
            switch (FL_MIN(QGEMM_MR, r1 - i)) {   /* constant row counts: unrolled tiles */
            case 5: qgemm_tile(5, x->kp, aw, bp, scale, bias, c, x->ldc, cols); break;
            case 4: qgemm_tile(4, x->kp, aw, bp, scale, bias, c, x->ldc, cols); break;
            case 3: qgemm_tile(3, x->kp, aw, bp, scale, bias, c, x->ldc, cols); break;
            case 2: qgemm_tile(2, x->kp, aw, bp, scale, bias, c, x->ldc, cols); break;
            default: qgemm_tile(1, x->kp, aw, bp, scale, bias, c, x->ldc, cols); break;
            }
        }
    }
}

int FL_FN(qgemm)(int64_t m, int64_t n, int64_t k, const void *a, int a_signed, int64_t lda,
                 const int32_t *za, const int16_t *pb, const float *scale, const float *bias,
                 void *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return 0;
    int64_t kp = (k + 1) / 2;
    int16_t *aw = (int16_t *)fl_buf_grow(&qgemm_buf, (size_t)FL_MAX(m * 2 * kp, 1) * sizeof(int16_t));
    if (!aw) return -1;
    for (int64_t i = 0; i < m; ++i) {
        const uint8_t *row = (const uint8_t *)a + i * lda;
        int16_t *dst = aw + i * 2 * kp;
        for (int64_t p = 0; p < k; ++p) dst[p] = (int16_t)(qgemm_at(row, a_signed, p) - za[i]);
        if (k % 2) dst[k] = 0;
    }
    int64_t row_units = (m + QGEMM_ROWS_PER_UNIT - 1) / QGEMM_ROWS_PER_UNIT;
    int64_t units = row_units * ((n + FL_QPANEL - 1) / FL_QPANEL);
    int64_t unit_macs = FL_MIN(m, QGEMM_ROWS_PER_UNIT) * FL_QPANEL * FL_MAX(k, 1);
    qgemm_ctx x = {m, n, kp, ldc, row_units, aw, pb, scale, bias, c};
    fl_parallel(units, FL_MAX(1, QGEMM_MIN_SHARE_MACS / unit_macs), qgemm_task, &x);
    return 0;
}
