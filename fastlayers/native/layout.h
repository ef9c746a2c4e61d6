/* Layout kernels (layout.c): moving float32 data between memory orders, threaded.
 *
 * transpose(batch, rows, cols, src, src_batch, src_row, dst, dst_batch, dst_row):
 *   dst[b dst_batch + c dst_row + r] = src[b src_batch + r src_row + c] for b < batch, r < rows,
 *   c < cols (strides in floats): NCHW <-> NHWC is (N, C, HW) <-> (N, HW, C); OIHW -> HWIO is,
 *   for each input channel, (O, kh kw) -> (kh kw, O).
 * concat_rows(rows, parts, src, width, dst, dst_row): row r of dst (dst_row bytes) is row r of
 *   each part p in turn (src[p], rows of width[p] bytes, contiguous): a concatenation along an
 *   axis of C-ordered arrays is one of rows (the axes before it) of the parts' trailing
 *   blocks, e.g. channels of NHWC memory. */
#ifndef FL_LAYOUT_H
#define FL_LAYOUT_H
#include <stdint.h>

#define FL_LAYOUT_KERNELS(X)                                                                  \
    X(int, transpose, (int64_t batch, int64_t rows, int64_t cols, const float *src,            \
                       int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,      \
                       int64_t dst_row),                                                       \
      (batch, rows, cols, src, src_batch, src_row, dst, dst_batch, dst_row))                 \
    X(int, concat_rows, (int64_t rows, int64_t parts, const char *const *src,                  \
                         const int64_t *width, char *dst, int64_t dst_row),                    \
      (rows, parts, src, width, dst, dst_row))
#endif
