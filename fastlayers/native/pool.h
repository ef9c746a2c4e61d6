/* Pooling, resizing, local response normalization and the NHWC zero pad (pool.c), NHWC
 * activations (N, H, W, C), C-contiguous; every kernel threaded over output rows (n, oh).
 *
 * pool2d(n, h, w, c, x, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end,
 *   count_include_pad, ho, wo, y): y[n, oh, ow, c] = max or mean of x[n, oh sh - pt + i dh,
 *   ow sw - pl + j dw, c] over i < kh, j < kw: max skips cells outside x (NaN wins; an empty
 *   window gives -inf), mean divides by the cells inside x or, with count_include_pad, inside
 *   [-pt, h_end) x [-pl, w_end) (h_end = h + bottom pad);
 * bin_pool(k, ph, pw, h, w, c, x, batch, h0, h1, w0, w1, shared, is_max, y): y[k, p, q, c] =
 *   max or mean of x[batch[k], h0[k, p]:h1[k, p], w0[k, q]:w1[k, q], c] (an empty bin gives 0;
 *   NaN wins the max): RoI pooling (k = region; h0, h1 (k, ph), w0, w1 (k, pw) int64) and,
 *   with `shared` bins h0, h1 (ph,), w0, w1 (pw,) for every k and batch NULL (batch[k] = k),
 *   adaptive pooling;
 * resize(n, h, w, c, x, ho, wo, y0, y1, fy, x0, x1, fx, bilinear, y): nearest y[n, i, j] =
 *   x[n, y0[i], x0[j]]; bilinear y = (1 - fy) top + fy bottom, top = (1 - fx) x[n, y0, x0] +
 *   fx x[n, y0, x1], bottom the same on row y1; y0, y1 (ho,), x0, x1 (wo,) int64;
 * lrn(m, c, x, size, alpha, beta, k, y): y[r, c] = x[r, c] / (k + alpha / size sum of
 *   x[r, c']^2 over c' in [c - size / 2, c + (size - 1) / 2])^beta over rows (m, c);
 * pad_nhwc(n, h, w, c, x, pt, pl, hp, wp, y): y (n, hp, wp, c) = x at [pt:pt + h, pl:pl + w],
 *   zeros elsewhere;
 * pool2d_nchw(n, c, h, w, x, ...): pool2d on NCHW planes, x (N, C, H, W), y (N, C, Ho, Wo), the
 *   same parameters and semantics, threaded over blocks of output rows of each plane. */
#ifndef FL_POOL_H
#define FL_POOL_H
#include <stdint.h>

#define FL_POOL_KERNELS(X)                                                                    \
    X(int, pool2d, (int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int is_max,    \
                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,    \
                    int64_t pt, int64_t pl, int64_t h_end, int64_t w_end,                      \
                    int count_include_pad, int64_t ho, int64_t wo, float *y),                  \
      (n, h, w, c, x, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, count_include_pad, \
       ho, wo, y))                                                                             \
    X(int, bin_pool, (int64_t k, int64_t ph, int64_t pw, int64_t h, int64_t w, int64_t c,      \
                      const float *x, const int64_t *batch, const int64_t *h0,                 \
                      const int64_t *h1, const int64_t *w0, const int64_t *w1, int shared,     \
                      int is_max, float *y),                                                   \
      (k, ph, pw, h, w, c, x, batch, h0, h1, w0, w1, shared, is_max, y))                       \
    X(int, resize, (int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t ho,    \
                    int64_t wo, const int64_t *y0, const int64_t *y1, const float *fy,         \
                    const int64_t *x0, const int64_t *x1, const float *fx, int bilinear,       \
                    float *y),                                                                 \
      (n, h, w, c, x, ho, wo, y0, y1, fy, x0, x1, fx, bilinear, y))                            \
    X(int, lrn, (int64_t m, int64_t c, const float *x, int64_t size, float alpha, float beta,  \
                 float k, float *y),                                                           \
      (m, c, x, size, alpha, beta, k, y))                                                      \
    X(int, pad_nhwc, (int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t pt,  \
                      int64_t pl, int64_t hp, int64_t wp, float *y),                           \
      (n, h, w, c, x, pt, pl, hp, wp, y))                                                      \
    X(int, pool2d_nchw, (int64_t n, int64_t c, int64_t h, int64_t w, const float *x,           \
                         int is_max, int64_t kh, int64_t kw, int64_t sh, int64_t sw,           \
                         int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t h_end,        \
                         int64_t w_end, int count_include_pad, int64_t ho, int64_t wo,         \
                         float *y),                                                            \
      (n, c, h, w, x, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, count_include_pad, \
       ho, wo, y))
#endif
