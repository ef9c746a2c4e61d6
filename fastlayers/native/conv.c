/* What the convolution files share, defined once per ISA: their per-thread work buffers
 * (conv_internal.h), one of each per thread whichever algorithm runs. The algorithms:
 * conv_gemm.c (conv2d: implicit GEMM, im2col + sgemm), conv_winograd.c, conv_depthwise.c,
 * conv_transpose.c. Compiled once per ISA (kernels.inc). */

#include "conv_internal.h"

__thread fl_buf FL_FN(conv_call_buf);
__thread fl_buf FL_FN(conv_task_buf);
