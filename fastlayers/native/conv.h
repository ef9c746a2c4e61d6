/* Convolutions (conv_*.c), NHWC activations (N, H, W, C) and HWIO kernels, C-contiguous; the bias
 * + activation epilogue runs on each block of output rows while it is in cache. Activation
 * codes: rows.h, the elementwise ones only (softmax over channels is a pass of its own).
 *
 * conv2d(n, h, w, c, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, pw, bias, code,
 *   alpha, res, res_code, res_alpha, method, y): y[n, oh, ow, g co + o] = f(b + sum_{i, j, ci}
 *   x[n, oh sh - pt + i dh, ow sw - pl + j dw, g ci' + ci] w[i, j, ci, g co + o]) (zeros
 *   outside x; ci' = c / groups, co = cout / groups), then where res (N, Ho, Wo, Cout) is not
 *   NULL y = g(y + res), g the elementwise code res_code (a residual Add and its activation,
 *   on each block of output rows while it is in cache); pw: each group's w (kh kw ci', co)
 *   packed (gemm.h), group g at pw + g fl_packed_floats(kh kw ci', co); method 0 picks, 1 the
 *   implicit GEMM (groups 1), 2 im2col + sgemm, 3 dot products along the window rows (groups
 *   1, dw 1, cout <= 4, or 6 on AVX-512; else -2);
 * winograd_pack(tile, cin, cout, w, pu): Winograd F(tile x tile, 3x3), tile 2 or 4, na = tile
 *   + 2: pu[e] = U[e] (cin, cout) packed, e = na a + b < na^2, U[e] = (G w G^T)[a, b] of the
 *   3x3 kernel w (3, 3, cin, cout), pu[e] at pu + e fl_packed_floats(cin, cout);
 * conv3x3_winograd(tile, n, h, w, cin, x, pt, pl, ho, wo, cout, pu, bias, code, alpha, y):
 *   conv2d of the 3x3 kernel whose U (same tile) is pu, stride 1, no dilation, one group:
 *   Winograd F(tile x tile, 3x3); returns 1 (y written) when an output before the activation
 *   is NaN or inf, for the caller to convolve directly;
 * depthwise_conv2d(n, h, w, c, x, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code,
 *   alpha, y): y[n, oh, ow, ci m + q] = f(b + sum_{i, j} x[n, oh sh - pt + i dh, ow sw - pl +
 *   j dw, ci] wk[i, j, ci m + q]) (wk (kh, kw, c m));
 * conv_transpose2d(n, h, w, cin, x, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo, pw,
 *   bias, code, alpha, y): y[n, oh, ow, g co + o] = f(b + sum of x[n, ih, iw, g ci' + ci]
 *   w[i, j, g ci' + ci, o] over ih sh + i dh = oh + ct, iw sw + j dw = ow + cl) (w (kh, kw, cin,
 *   co), co = cout_g); pw: each group's w as (ci', kh kw co) packed, group g at pw +
 *   g fl_packed_floats(ci', kh kw co);
 * conv_transpose2d_nchw(n, cin, h, w, x, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo,
 *   wt, bias, code, alpha, y): conv_transpose2d on NCHW planes: x (N, cin, H, W), y (N, groups
 *   cout_g, Ho, Wo); wt: each group's w as (cout_g kh kw, cin / groups) (row (o, i, j), column
 *   ci: w[i, j, g ci' + ci, o]), group g at wt + g cout_g kh kw ci';
 * depthwise_conv2d_nchw(n, c, h, w, x, m, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code,
 *   alpha, y): y[n, ci m + q, oh, ow] = f(b + sum_{i, j} x[n, ci, oh sh - pt + i dh, ow sw - pl +
 *   j dw] wk[ci m + q, i, j]) on NCHW planes: x (N, C, H, W), wk (C m, kh, kw), y (N, C m, Ho,
 *   Wo);
 * conv2d_nchw_in(n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code, alpha,
 *   y): y[n, oh, ow, o] = f(b + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl + j dw]
 *   wk[i, j, ci, o]) from NCHW planes x (N, C, H, W) to NHWC y (N, Ho, Wo, cout), wk (kh, kw,
 *   C, cout) as it is (one group; meant for few input channels);
 * conv2d_planes(n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code,
 *   alpha, y): y[n, o, oh, ow] = f(b + sum_{i, j, ci} x[n, ci, oh sh - pt + i dh, ow sw - pl +
 *   j dw] wk[i, j, ci, o]) from NCHW planes x (N, C, H, W) to NCHW planes y (N, cout, Ho, Wo),
 *   wk (kh, kw, C, cout) as it is (one group): for at most 8 output channels at column stride
 *   1 a direct loop vectorized over output columns, else conv2d_nchw_in's (meant for few input
 *   channels) with each output row transposed into the planes;
 * conv1x1_nchw(n, cin, hw, cout, x, wk, ldw, bias, code, alpha, y): y[n, o, p] = f(b[o] +
 *   sum_ci wk[o, ci] x[n, ci, p]), a 1x1 convolution (stride 1, no padding, one group) from
 *   NCHW planes x (N, cin, hw) to NCHW planes y (N, cout, hw), wk (cout, cin) with rows ldw >=
 *   cin floats apart: per image the product wk @ x[n] on the pool's threads, no layout move. */
#ifndef FL_CONV_H
#define FL_CONV_H
#include <stdint.h>

#define FL_CONV_KERNELS(X)                                                                    \
    X(int, conv2d, (int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,    \
                    int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,    \
                    int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,          \
                    const float *pw, const float *bias, int code, float alpha,                \
                    const float *res, int res_code, float res_alpha, int method, float *y),    \
      (n, h, w, c, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, pw, bias, code,    \
       alpha, res, res_code, res_alpha, method, y))                                            \
    X(int, winograd_pack, (int tile, int64_t cin, int64_t cout, const float *w, float *pu),    \
      (tile, cin, cout, w, pu))                                                                \
    X(int, conv3x3_winograd, (int tile, int64_t n, int64_t h, int64_t w, int64_t cin,          \
                              const float *x, int64_t pt, int64_t pl, int64_t ho, int64_t wo,  \
                              int64_t cout, const float *pu, const float *bias, int code,      \
                              float alpha, float *y),                                          \
      (tile, n, h, w, cin, x, pt, pl, ho, wo, cout, pu, bias, code, alpha, y))                 \
    X(int, depthwise_conv2d, (int64_t n, int64_t h, int64_t w, int64_t c, const float *x,      \
                              int64_t kh, int64_t kw, int64_t m, int64_t sh, int64_t sw,       \
                              int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,      \
                              int64_t wo, const float *wk, const float *bias, int code,        \
                              float alpha, float *y),                                          \
      (n, h, w, c, x, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code, alpha, y))     \
    X(int, conv_transpose2d, (int64_t n, int64_t h, int64_t w, int64_t cin, const float *x,    \
                              int64_t kh, int64_t kw, int64_t cout_g, int64_t groups,          \
                              int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ct,      \
                              int64_t cl, int64_t ho, int64_t wo, const float *pw,             \
                              const float *bias, int code, float alpha, float *y),             \
      (n, h, w, cin, x, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo, pw, bias, code, \
       alpha, y))                                                                              \
    X(int, conv_transpose2d_nchw, (int64_t n, int64_t cin, int64_t h, int64_t w,             \
                                   const float *x, int64_t kh, int64_t kw, int64_t cout_g,     \
                                   int64_t groups, int64_t sh, int64_t sw, int64_t dh,         \
                                   int64_t dw, int64_t ct, int64_t cl, int64_t ho, int64_t wo, \
                                   const float *wt, const float *bias, int code, float alpha,  \
                                   float *y),                                                  \
      (n, cin, h, w, x, kh, kw, cout_g, groups, sh, sw, dh, dw, ct, cl, ho, wo, wt, bias, code, \
       alpha, y))                                                                              \
    X(int, depthwise_conv2d_nchw, (int64_t n, int64_t c, int64_t h, int64_t w, const float *x, \
                                   int64_t m, int64_t kh, int64_t kw, int64_t sh, int64_t sw,  \
                                   int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho, \
                                   int64_t wo, const float *wk, const float *bias, int code,   \
                                   float alpha, float *y),                                     \
      (n, c, h, w, x, m, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, wk, bias, code, alpha, y))     \
    X(int, conv2d_nchw_in, (int64_t n, int64_t c, int64_t h, int64_t w, const float *x,        \
                            int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,        \
                            int64_t dw, int64_t pt, int64_t pl, int64_t ho, int64_t wo,        \
                            int64_t cout, const float *wk, const float *bias, int code,        \
                            float alpha, float *y),                                            \
      (n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code, alpha, y))   \
    X(int, conv2d_planes, (int64_t n, int64_t c, int64_t h, int64_t w, const float *x,         \
                           int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, \
                           int64_t pt, int64_t pl, int64_t ho, int64_t wo, int64_t cout,          \
                           const float *wk, const float *bias, int code, float alpha, float *y),  \
      (n, c, h, w, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, cout, wk, bias, code, alpha, y))     \
    X(int, conv1x1_nchw, (int64_t n, int64_t cin, int64_t hw, int64_t cout, const float *x,     \
                          const float *wk, int64_t ldw, const float *bias, int code,           \
                          float alpha, float *y),                                              \
      (n, cin, hw, cout, x, wk, ldw, bias, code, alpha, y))
#endif
