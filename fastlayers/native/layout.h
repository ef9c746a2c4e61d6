/* Layout kernels (layout.c): moving float32 data between memory orders, threaded.
 *
 * transpose(batch, rows, cols, src, src_batch, src_row, dst, dst_batch, dst_row):
 *   dst[b dst_batch + c dst_row + r] = src[b src_batch + r src_row + c] for b < batch, r < rows,
 *   c < cols (strides in floats): NCHW <-> NHWC is (N, C, HW) <-> (N, HW, C); OIHW -> HWIO is,
 *   for each input channel, (O, kh kw) -> (kh kw, O). */
#ifndef FL_LAYOUT_H
#define FL_LAYOUT_H
#include <stdint.h>

#define FL_LAYOUT_KERNELS(X)                                                                  \
    X(int, transpose, (int64_t batch, int64_t rows, int64_t cols, const float *src,            \
                       int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,      \
                       int64_t dst_row),                                                       \
      (batch, rows, cols, src, src_batch, src_row, dst, dst_batch, dst_row))
#endif
