/* Integer matrix products (qgemm.c): c (m, n) int32 = (a - za) @ (b - zb) for 8-bit a and b
 * (each uint8 or int8), summed exactly: both operands are widened to int16 less their zero
 * points (|value| <= 255) and multiplied in int16 pairs summed to int32 (AVX2 vpmaddwd: two
 * products of at most 255 * 255 cannot saturate, unlike the u8 x s8 pairs of vpmaddubsw).
 *
 * Packed b (every ISA the same): b - zb (k, n) as ceil(n / 16) panels of 16 columns, each
 * panel ceil(k / 2) row pairs of 16 columns x 2 int16 (b[2p, j], b[2p + 1, j]), zero past row
 * k and column n; the panel of columns j0:j0+16 starts at pb + j0 * 2 * ceil(k / 2).
 */
#ifndef FL_QGEMM_H
#define FL_QGEMM_H
#include <stdint.h>

#define FL_QPANEL 16

/* int16 values of b (k, n) packed (at least 1). */
static inline int64_t fl_qpacked_count(int64_t k, int64_t n) {
    int64_t c = (k + 1) / 2 * 2 * ((n + FL_QPANEL - 1) / FL_QPANEL) * FL_QPANEL;
    return c > 0 ? c : 1;
}

/* Every entry returns 0, or -1 when a work buffer could not be allocated. Arguments:
 * qpack(b, b_signed, ldb, k, n, zb, pb): pb = b (k, n, rows ldb bytes apart; int8 when
 *   b_signed, else uint8) less zb (n int32 values, one per column) packed;
 * qgemm(m, n, k, a, a_signed, lda, za, pb, scale, bias, c, ldc): c (m, n) = (a - za) @ b on
 *   the pool's threads, a (m, k) rows lda bytes apart (int8 when a_signed, else uint8), za m
 *   int32 values (one per row), b packed by qpack; c int32, or, where scale (n floats) is not
 *   NULL, float: float(acc) * scale[j] (+ bias[j] where bias is not NULL). */
#define FL_QGEMM_KERNELS(X)                                                                   \
    X(int, qpack, (const void *b, int b_signed, int64_t ldb, int64_t k, int64_t n,            \
                   const int32_t *zb, int16_t *pb),                                           \
      (b, b_signed, ldb, k, n, zb, pb))                                                       \
    X(int, qgemm, (int64_t m, int64_t n, int64_t k, const void *a, int a_signed, int64_t lda, \
                   const int32_t *za, const int16_t *pb, const float *scale, const float *bias, \
                   void *c, int64_t ldc),                                                     \
      (m, n, k, a, a_signed, lda, za, pb, scale, bias, c, ldc))
#endif
