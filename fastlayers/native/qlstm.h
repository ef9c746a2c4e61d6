/* The time loop of a dynamically quantized LSTM (qlstm.c), com.microsoft DynamicQuantizeLSTM:
 * one direction over a whole sequence, its recurrent product on 8-bit weights summed exactly
 * (qgemm.c), the hidden state quantized to uint8 at each step as DynamicQuantizeLinear (over
 * the whole batch).
 *
 * qlstm(steps, batch, hidden, x_proj, reverse, r_packed, r_scale, bias, peep, clip,
 *   input_forget, h, c, y, y_step): x_proj (steps, batch, 4 hidden) the input projections
 *   (gates i, o, f, c), r_packed R (hidden, 4 hidden) less its zero points packed by qpack,
 *   r_scale its 4 hidden scales, bias 4 hidden (Wb + Rb) or NULL, peep 3 hidden (i, o, f) or
 *   NULL, clip > 0 to clip the gates' inputs, h and c (batch, hidden) the states, read and
 *   updated; step t's h is written to y + t * y_step when y is not NULL (steps in reverse order
 *   when reverse). Per step: z = x_proj[t] + float(acc) * (h_scale * r_scale) + bias,
 *   i = sigmoid(z_i + p_i c), f = sigmoid(z_f + p_f c) (1 - i with input_forget),
 *   c = f c + i tanh(z_c), h = sigmoid(z_o + p_o c) tanh(c). Returns 0, or -1 when a work
 *   buffer could not be allocated.
 * qlstm_runs(n, runs): n independent qlstm runs (a bidirectional layer's two directions), one
 *   per thread at a time where each step's product is too small to share among the threads,
 *   else one after another; the same bits either way. */
#ifndef FL_QLSTM_H
#define FL_QLSTM_H
#include <stdint.h>
/* The arguments of one qlstm run (one direction), for qlstm_runs. */
typedef struct {
    int64_t steps, batch, hidden;
    const float *x_proj;
    int reverse;
    const int8_t *r_packed;
    const float *r_scale, *bias, *peep;
    float clip;
    int input_forget;
    float *h, *c, *y;
    int64_t y_step;
} fl_qlstm_run;
#define FL_QLSTM_KERNELS(X)                                                                   \
    X(int, qlstm, (int64_t steps, int64_t batch, int64_t hidden, const float *x_proj,         \
                   int reverse, const int8_t *r_packed, const float *r_scale,                \
                   const float *bias, const float *peep, float clip, int input_forget,        \
                   float *h, float *c, float *y, int64_t y_step),                             \
      (steps, batch, hidden, x_proj, reverse, r_packed, r_scale, bias, peep, clip,            \
       input_forget, h, c, y, y_step))                                                        \
    X(int, qlstm_runs, (int64_t n, const fl_qlstm_run *runs), (n, runs))
#endif
