/* Matrix products (gemm.c): fastlayers' sgemm on weights packed once, the same kernel on
 * operands packed per call, and the threaded product with its bias + activation epilogue.
 *
 * Packed layout (every ISA the same, so a weight packed once serves them all): b (k, n) as
 * ceil(n / 32) panels of 32 columns, each panel its k rows of 32 floats (zero past column n);
 * the panels of columns j0:j1 (j0 a multiple of 32) start at pb + j0 * k.
 */
#ifndef FL_GEMM_H
#define FL_GEMM_H
#include <stdint.h>

#define FL_PANEL 32

/* Floats of b (k, n) packed: k rows of n rounded up to FL_PANEL (at least 1). */
static inline int64_t fl_packed_floats(int64_t k, int64_t n) {
    int64_t f = k * ((n + FL_PANEL - 1) / FL_PANEL) * FL_PANEL;
    return f > 0 ? f : 1;
}

/* Every entry returns 0, or -1 when a work buffer could not be allocated. Arguments:
 * pack(b, ldb, trans_b, k, n, pb): pb = b (k, n) packed (trans_b: b is given as (n, k), row
 *   stride ldb);
 * sgemm_packed(m, n, k, a, lda, pb, accumulate, c, ldc): c (m, n) (+)= a (m, k) @ b, b packed,
 *   on the calling thread;
 * sgemm(m, n, k, a, lda, b, ldb, trans_b, accumulate, c, ldc): the same on b (k, n) (or (n, k)
 *   with trans_b) as it is, packed block by block into a per-thread buffer;
 * matmul(m, n, k, a, lda, b, ldb, trans_b, pb, bias, code, alpha, c, ldc): c = f(a @ b + bias)
 *   on the pool's threads, on pb when it is not NULL (b then unused), bias NULL or n floats,
 *   f the activation `code` (rows.h) with its alpha;
 * matmul_batch(batch, m, n, k, a, sa, lda, b, sb, ldb, trans_b, c, sc, ldc): c[i] = a[i] @ b[i]
 *   for i < batch on the pool's threads, operand i at a + i sa, b + i sb, c + i sc (a stride 0
 *   shares an operand across the batch). */
#define FL_GEMM_KERNELS(X)                                                                    \
    X(int, pack, (const float *b, int64_t ldb, int trans_b, int64_t k, int64_t n, float *pb),  \
      (b, ldb, trans_b, k, n, pb))                                                             \
    X(int, sgemm_packed, (int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,       \
                          const float *pb, int accumulate, float *c, int64_t ldc),             \
      (m, n, k, a, lda, pb, accumulate, c, ldc))                                               \
    X(int, sgemm, (int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,              \
                   const float *b, int64_t ldb, int trans_b, int accumulate, float *c,         \
                   int64_t ldc),                                                               \
      (m, n, k, a, lda, b, ldb, trans_b, accumulate, c, ldc))                                  \
    X(int, matmul, (int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,             \
                    const float *b, int64_t ldb, int trans_b, const float *pb,                 \
                    const float *bias, int code, float alpha, float *c, int64_t ldc),          \
      (m, n, k, a, lda, b, ldb, trans_b, pb, bias, code, alpha, c, ldc))                      \
    X(int, matmul_batch, (int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,      \
                          int64_t sa, int64_t lda, const float *b, int64_t sb, int64_t ldb,    \
                          int trans_b, float *c, int64_t sc, int64_t ldc),                     \
      (batch, m, n, k, a, sa, lda, b, sb, ldb, trans_b, c, sc, ldc))
#endif
