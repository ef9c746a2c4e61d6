/* Row kernels (rows.c): bias + activation, softmax and log-softmax over rows, layer / RMS
 * normalization and per-channel scale + shift, each threaded over rows. */
#ifndef FL_ROWS_H
#define FL_ROWS_H
#include <stdint.h>

/* Activation codes (fastlayers/native/__init__.py ACTIVATIONS lists the same names in order). */
enum {
    FL_LINEAR, FL_RELU, FL_RELU6, FL_LEAKY_RELU, FL_HARD_SIGMOID, FL_SOFTSIGN, FL_SIGMOID,
    FL_SILU, FL_GELU, FL_GELU_TANH, FL_EXPONENTIAL, FL_SOFTMAX, FL_LOG_SOFTMAX, FL_TANH,
    FL_HARD_SILU, FL_ONNX_SIGMOID, FL_ONNX_SILU, FL_ONNX_TANH, FL_N_ACTIVATIONS
};

/* bias_act(m, n, x, ldx, bias, code, alpha, out, ldo): out[i, j] = f(x[i, j] + bias[j]) for the
 *   (m, n) block, rows ldx / ldo floats apart (out may be x), bias NULL for none; softmax codes
 *   normalize each row of n;
 * layer_norm(m, n, x, gamma, beta, eps, rms, out): out[i] = gamma (x[i] - mean) / sqrt(var +
 *   eps) + beta (rms: gamma x[i] / sqrt(mean x^2 + eps)), C-contiguous rows, gamma / beta NULL
 *   for none, out may be x, statistics in float64;
 * scale_shift(m, n, x, scale, shift, out): out[i, j] = x[i, j] scale[j] + shift[j];
 * scale_shift_planes(planes, channels, plane, x, scale, shift, out): out[p, k] = x[p, k]
 *   scale[p % channels] + shift[p % channels] for planes of `plane` values (NCHW memory, the
 *   channel axis not last), out may be x;
 * add_act(n, a, b, code, alpha, out): out[k] = f(a[k] + b[k]) for k < n, an elementwise code
 *   (not the softmax codes), out may be a or b;
 * outer_add_act(ni, nj, n, a, b, code, alpha, out): out[i, j, k] = f(a[i, k] + b[j, k]), a (ni,
 *   n), b (nj, n) and out (ni, nj, n) C-contiguous, the same codes (the broadcast sum of
 *   additive attention, tanh(q_i + k_j), in one pass). */
#define FL_ROWS_KERNELS(X)                                                                    \
    X(int, bias_act, (int64_t m, int64_t n, const float *x, int64_t ldx, const float *bias,   \
                      int code, float alpha, float *out, int64_t ldo),                         \
      (m, n, x, ldx, bias, code, alpha, out, ldo))                                             \
    X(int, layer_norm, (int64_t m, int64_t n, const float *x, const float *gamma,             \
                        const float *beta, float eps, int rms, float *out),                    \
      (m, n, x, gamma, beta, eps, rms, out))                                                   \
    X(int, scale_shift, (int64_t m, int64_t n, const float *x, const float *scale,            \
                         const float *shift, float *out),                                      \
      (m, n, x, scale, shift, out))                                                            \
    X(int, scale_shift_planes, (int64_t planes, int64_t channels, int64_t plane,              \
                                const float *x, const float *scale, const float *shift,        \
                                float *out),                                                   \
      (planes, channels, plane, x, scale, shift, out))                                         \
    X(int, add_act, (int64_t n, const float *a, const float *b, int code, float alpha,        \
                     float *out),                                                              \
      (n, a, b, code, alpha, out))                                                             \
    X(int, outer_add_act, (int64_t ni, int64_t nj, int64_t n, const float *a, const float *b, \
                           int code, float alpha, float *out),                                 \
      (ni, nj, n, a, b, code, alpha, out))
#endif
