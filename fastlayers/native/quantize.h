/* Elementwise quantization (quantize.c), per tensor, in float32 as the ONNX operators and
 * onnxruntime: q = clamp(round_half_even(x / scale) + zero_point, lo, hi).
 *
 * quantize(count, x, scale, zero_point, lo, hi, q, q_signed): q (int8 when q_signed, else
 *   uint8) of count floats x;
 * fake_quantize(count, x, scale, zero_point, lo, hi, y): y = (q - zero_point) * scale, the
 *   DequantizeLinear of the QuantizeLinear of x in one pass (y may be x);
 * min_max(count, x, out): out[0] = min(x, 0), out[1] = max(x, 0) (NaN ignored).
 * Each runs on the pool's threads over large counts and returns 0. */
#ifndef FL_QUANTIZE_H
#define FL_QUANTIZE_H
#include <stdint.h>

#define FL_QUANTIZE_KERNELS(X)                                                                \
    X(int, quantize, (int64_t count, const float *x, float scale, float zero_point, float lo,  \
                      float hi, void *q, int q_signed),                                       \
      (count, x, scale, zero_point, lo, hi, q, q_signed))                                     \
    X(int, fake_quantize, (int64_t count, const float *x, float scale, float zero_point,      \
                           float lo, float hi, float *y),                                     \
      (count, x, scale, zero_point, lo, hi, y))                                               \
    X(int, min_max, (int64_t count, const float *x, float *out), (count, x, out))
#endif
