/* Elementwise programs (elementwise.c): a chain of elementwise operations over tensors of one
 * shape, per-channel vectors and scalars, run in one pass over memory. */
#ifndef FL_ELEMENTWISE_H
#define FL_ELEMENTWISE_H
#include <stdint.h>

/* Operand kinds: a tensor of the output's shape and memory order, each sample's inner values
 * contiguous (FULL: p[n * stride + j]), a vector over the channels, the memory's last axis
 * (CHANNEL: p[n * stride + j % c]; stride 0 for one vector for every sample), one value
 * (SCALAR: p[0]), one value per position spread over its c channels (POSITION:
 * p[n * stride + j / c]; a statistic over the channels of NHWC memory, as a decomposed norm
 * computes it). */
enum { FL_EW_FULL, FL_EW_CHANNEL, FL_EW_SCALAR, FL_EW_POSITION };

typedef struct {
    int kind;
    const float *p;
    int64_t stride;
} fl_ew_operand;

/* Instructions: dst = a op b (ADD, SUB, MUL, DIV), dst = f(a) (ACT: an elementwise activation
 * code of rows.h with alpha), dst = sqrt(a), -a, |a|, dst = clip(a, lo, hi) (CLIP: min(max(a,
 * lo), hi) as numpy's maximum then minimum, NaN kept; lo and hi the instruction's x and y). Operand references: >= 0
 * an operand, < 0 the register -1 - r. Each is one IEEE operation per value (an activation the
 * formula of rows.c's), so a program gives the bits of the same operations run one by one. */
enum { FL_EW_ADD, FL_EW_SUB, FL_EW_MUL, FL_EW_DIV, FL_EW_ACT, FL_EW_SQRT, FL_EW_NEG, FL_EW_ABS, FL_EW_CLIP };

typedef struct {
    int op, dst, a, b, code;
    float alpha, x, y;
} fl_ew_insn;

/* elementwise(samples, inner, c, n_operands, operands, n_insns, insns, n_regs, out): out[n *
 *   inner + j] = the last instruction's value for every sample n and position j < inner (inner
 *   a multiple of c), the instructions run in order on blocks of values that stay in cache,
 *   threaded over blocks; the last instruction's dst is ignored. */
#define FL_ELEMENTWISE_KERNELS(X)                                                             \
    X(int, elementwise, (int64_t samples, int64_t inner, int64_t c, int n_operands,           \
                         const fl_ew_operand *operands, int n_insns, const fl_ew_insn *insns, \
                         int n_regs, float *out),                                              \
      (samples, inner, c, n_operands, operands, n_insns, insns, n_regs, out))
#endif
