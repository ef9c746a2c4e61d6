/* What the convolution files (conv_gemm.c, conv_winograd.c, conv_depthwise.c,
 * conv_transpose.c, conv_nchw.c) share: the threading grain of the direct kernels, the activation codes
 * their epilogues take, the epilogue of one vector, and their per-thread work buffers
 * (defined in conv.c). */
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
