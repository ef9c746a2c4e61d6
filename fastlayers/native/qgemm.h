/* Integer matrix products (qgemm.c): c (m, n) int32 = (a - za) @ (b - zb) for 8-bit a and b
 * (each uint8 or int8), summed exactly in int32 as
 *
 *     c[i, j] = sum_k a_u[i, k] b_s[k, j] - ra[i] B[j] - A[i] cb[j]
 *
 * with a_u = a as uint8 (int8 a plus 128), A = za (plus 128 for int8 a), ra[i] = sum_k a_u[i, k],
 * b_s = b as int8 (uint8 b less 128), B = zb (less 128 for uint8 b) and
 * cb[j] = sum_k b_s[k, j] - k B[j]: the products u8 x s8 are those of AVX-512 VNNI's vpdpbusd
 * (its four products summed into int32 without saturation); the AVX2 path widens both to
 * int16 and multiplies pairs with vpmaddwd (exact: no u8 x s8 pair saturates int16, unlike
 * vpmaddubsw), the portable path in C. The corrections wrap modulo 2^32 like the sums, so the
 * result is exact wherever the true sum fits int32.
 *
 * Packed b (every ISA the same, one byte array): ceil(n / 16) panels of 16 columns, each
 * ceil(k / 4) quads of 16 columns x 4 int8 (b_s[4q .. 4q + 3, j]), zero past row k and column
 * n (the panel of columns j0:j0+16 starts at byte j0 * 4 ceil(k / 4)); then B and cb, int32,
 * one per column of the padded width.
 */
#ifndef FL_QGEMM_H
#define FL_QGEMM_H
#include <stdint.h>

#define FL_QPANEL 16

/* Columns of the packed width: n rounded up to whole panels. */
static inline int64_t fl_qpacked_width(int64_t n) { return (n + FL_QPANEL - 1) / FL_QPANEL * FL_QPANEL; }

/* Bytes of the packed quads of b (k, n): the offset of B, then cb. */
static inline int64_t fl_qpacked_quads(int64_t k, int64_t n) { return (k + 3) / 4 * 4 * fl_qpacked_width(n); }

/* Bytes of b (k, n) packed (at least 1). */
static inline int64_t fl_qpacked_count(int64_t k, int64_t n) {
    int64_t c = fl_qpacked_quads(k, n) + 2 * 4 * fl_qpacked_width(n);
    return c > 0 ? c : 1;
}

/* What an integer product stores for its exact int32 sums acc (kind):
 * FL_QOUT_INT32: acc;
 * FL_QOUT_FLOAT: float(acc + ibias[j]) * scale[j] (+ bias[j] where bias is not NULL), ibias
 *   (int32, added with wrap-around) where not NULL, the product rounded before the bias is
 *   added (ibias: a quantized bias added to the sums, as onnxruntime's dynamically quantized
 *   ConvInteger graphs do before their Cast and Mul);
 * FL_QOUT_UINT8 / FL_QOUT_INT8: rint(clamp(float(acc + ibias[j]) * scale[j], min - zero_point,
 *   max - zero_point)) + zero_point (NaN to the low end), ibias (int32, added with wrap-around)
 *   where not NULL: onnxruntime's requantization (MlasRequantizeOutput) of QLinearConv /
 *   QLinearMatMul.
 * scale, bias and ibias hold n values (one per column of c). */
enum { FL_QOUT_INT32 = 0, FL_QOUT_FLOAT = 1, FL_QOUT_UINT8 = 2, FL_QOUT_INT8 = 3 };
typedef struct {
    int kind;
    const float *scale, *bias;
    const int32_t *ibias;
    int32_t zero_point;
} fl_qout;

/* The windows of an integer convolution (qconv) over x (n, h, w, c) indexed channels last
 * with element strides xs (any layout: NHWC, or an NCHW array's NHWC view): the group's cin
 * channels from c0, a kh x kw kernel at strides (sh, sw) and dilations (dh, dw), top / left
 * padding (reads as x's zero point), output oh x ow. */
typedef struct {
    int64_t n, h, w, xs[4];
    int64_t c0, cin;
    int64_t kh, kw, sh, sw, dh, dw, top, left, oh, ow;
} fl_qconv_geom;

/* Every entry returns 0, or -1 when a work buffer could not be allocated. Arguments:
 * qpack(b, b_signed, ldb, k, n, zb, pb): pb = b (k, n, rows ldb bytes apart; int8 when
 *   b_signed, else uint8) less zb (n int32 values, one per column) packed;
 * qgemm(m, n, k, a, a_signed, lda, za, pb, out, c, ldc): c (m, n) = (a - za) @ b on the
 *   pool's threads, a (m, k) rows lda bytes apart (int8 when a_signed, else uint8), za m int32
 *   values (one per row), b packed by qpack, stored as ``out`` says (fl_qout; NULL: int32),
 *   c's rows ldc elements apart;
 * qconv(g, x, x_signed, x_zp, n, pb, out, c, ldc): the convolution as that product, a's row
 *   (b, oy, ox) the window of output pixel (oy, ox) of image b (fl_qconv_geom; taps (ki, kj)
 *   in order, cin channels each), za x_zp for every row, b (kh kw cin, n) packed by qpack,
 *   c (n_img oh ow, n) stored as ``out`` says. */
#define FL_QGEMM_KERNELS(X)                                                                   \
    X(int, qpack, (const void *b, int b_signed, int64_t ldb, int64_t k, int64_t n,            \
                   const int32_t *zb, int8_t *pb),                                            \
      (b, b_signed, ldb, k, n, zb, pb))                                                       \
    X(int, qgemm, (int64_t m, int64_t n, int64_t k, const void *a, int a_signed, int64_t lda, \
                   const int32_t *za, const int8_t *pb, const fl_qout *out, void *c,          \
                   int64_t ldc),                                                              \
      (m, n, k, a, a_signed, lda, za, pb, out, c, ldc))                                      \
    X(int, qconv, (const fl_qconv_geom *g, const void *x, int x_signed, int32_t x_zp, int64_t n, \
                   const int8_t *pb, const fl_qout *out, void *c, int64_t ldc),                \
      (g, x, x_signed, x_zp, n, pb, out, c, ldc))
#endif
