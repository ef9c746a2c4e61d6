/* The list of every ISA-dispatched kernel, subject by subject: each subject's header gives an
 * X-macro list X(return type, name, (parameters), (argument names)); a new subject adds its
 * list here. Every kernel returns an int or int64_t status (0: done; negative: failed). */
#ifndef FL_KERNELS_H
#define FL_KERNELS_H
#include "gemm.h"
#include "rows.h"
#include "layout.h"
#include "attention.h"
#include "pool.h"
#include "conv.h"
#include "recurrent.h"
#include "qgemm.h"
#include "qlstm.h"
#include "quantize.h"
#include "elementwise.h"

#define FL_KERNELS(X)                                                                         \
    FL_ROWS_KERNELS(X) FL_LAYOUT_KERNELS(X) FL_GEMM_KERNELS(X) FL_ATTENTION_KERNELS(X) FL_POOL_KERNELS(X)          \
    FL_CONV_KERNELS(X) FL_RECURRENT_KERNELS(X) FL_QGEMM_KERNELS(X) FL_QLSTM_KERNELS(X) FL_QUANTIZE_KERNELS(X) \
    FL_ELEMENTWISE_KERNELS(X)
#endif
