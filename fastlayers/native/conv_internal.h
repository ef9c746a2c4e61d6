/* What the convolution files (conv_gemm.c, conv_winograd.c, conv_depthwise.c,
 * conv_depthwise_blocks.c, conv_transpose.c, conv_nchw.c) share: the threading grain of the
 * direct kernels, the activation codes their epilogues take, the epilogue of one vector, the
 * depthwise channel blocks' entry and bounds, and their per-thread work buffers (defined in
 * conv.c). */
#ifndef FL_CONV_INTERNAL_H
#define FL_CONV_INTERNAL_H
#include "conv.h"
#include "fl.h"
#include "pool_internal.h"
#include "rows_internal.h"

/* Fewest output values (x window taps) in a thread's share of the direct kernels. */
#define CONV_MIN_SHARE_TAPS (INT64_C(1) << 17)

/* The calling thread's buffer (padded input, Winograd's V and M, im2col or transposed columns)
 * and each task's (im2col block, Winograd block, transposed ring). */
extern __thread fl_buf FL_FN(conv_call_buf);
extern __thread fl_buf FL_FN(conv_task_buf);

/* Most output channels of conv2d's dot method (conv_dot.c): above, the implicit GEMM's
 * vectors over output channels fill enough lanes (6 of AVX-512's 16, 4 of AVX2's 8). */
#if FL_VW == 16
#define CONV_DOT_MAX_COUT 6
#else
#define CONV_DOT_MAX_COUT 4
#endif

/* conv2d (conv.h) for one group, no width dilation and 1 <= cout <= CONV_DOT_MAX_COUT, each
 * output a dot product along its window rows (conv_dot.c); 0, -1 (no memory) or -2. */
int FL_FN(conv2d_dot)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t pt, int64_t pl,
                      int64_t ho, int64_t wo, int64_t cout, const float *pw, const float *bias,
                      int code, float alpha, float *y);

/* The fewest channels the depthwise channel blocks take. */
#define CONV_BLOCKS_MIN_C 8

/* Whether a depthwise convolution of c channels (multiplier m) on planes of h x w through a kh x
 * kw window at column stride sw runs in channel blocks (conv_depthwise_blocks.c), on NHWC
 * memory (nhwc) or NCHW planes. Where it beat the other kernels on the AMD EPYC Zen 5 host
 * (docs/design.md, "Depthwise convolutions on small planes"): NCHW planes up to 28 x 28 and
 * 7 x 7 windows up to 64 x 64 (the plane kernels' rows of 7 to 28 columns left their vectors
 * part empty and set up every row); on NHWC, planes up to 8 x 8, 7 x 7 windows up to 28 x 28,
 * 5 x 5 up to 16 x 16 and, on AVX-512, at stride 2 up to 28 x 28 (the NHWC kernel sums the
 * pixels whose windows cross an edge one at a time, in one chain each). */
FL_INLINE int conv_blocks_fit(int nhwc, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sw,
                              int64_t m) {
    if (FL_VW < 8 || m != 1 || c < CONV_BLOCKS_MIN_C) return 0;
    int64_t plane = h * w;
    if (!nhwc) return plane <= 28 * 28 || (kh * kw >= 49 && plane <= 64 * 64);
    if (plane <= 8 * 8) return 1;
    if (kw >= 7) return plane <= 28 * 28;
    return kw >= 5 && (plane <= 16 * 16 || (FL_VW >= 16 && sw == 2 && plane <= 28 * 28));
}

/* A depthwise convolution (multiplier 1) of x (N, C, H, W), weights wk (C, kh, kw), into y (N,
 * C, Ho, Wo); with nhwc x (N, H, W, C), wk (kh, kw, C), y (N, Ho, Wo, C): in channel blocks
 * (conv_depthwise_blocks.c); 0, or -1 (no memory). */
int FL_FN(depthwise_blocks)(int nhwc, int64_t n, int64_t c, int64_t h, int64_t w, const float *x, int64_t kh,
                            int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                            int64_t ho, int64_t wo, const float *wk, const float *bias, int code, float alpha,
                            float *y);

/* An elementwise activation code (the epilogues apply it per vector). */
FL_INLINE int conv_code_ok(int code) {
    return code >= 0 && code < FL_N_ACTIVATIONS && code != FL_SOFTMAX && code != FL_LOG_SOFTMAX;
}

/* f(s + bias[0:nc]) for one vector of outputs (bias NULL: none). */
FL_INLINE fl_vf conv_epi(fl_vf s, const float *bias, int64_t nc, int code, float alpha) {
    if (bias) s += pool_ld(bias, nc);
    return code == FL_LINEAR ? s : rows_vact(s, code, alpha);
}
#endif
