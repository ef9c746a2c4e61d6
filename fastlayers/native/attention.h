/* Attention (attention.c): the masked, scaled softmax of attention scores in place, scaled
 * dot-product attention per (batch, head) pair on the packed sgemm, and a whole Transformer
 * encoder layer in one call.
 *
 * Strides are in floats. A bias is read through (batch, head, query) strides, 0 broadcasting
 * that axis, its keys contiguous; NULL for none. A query row whose keys are all masked (-inf)
 * gets the weight NaN, 0 or 1/tk for empty 0, 1 or 2 (ReferenceOps.attention_softmax).
 *
 * attention_softmax(nb, nh, tq, tk, s, scale, bias, bias_st, causal, empty): s (nb, nh, tq, tk)
 *   C-contiguous = softmax(scale s + bias (+ -inf past the diagonal when causal)) over keys,
 *   in place;
 * attention(nb, nh, tq, tk, d, dv, q, q_st, k, k_st, v, v_st, scale, bias, bias_st, causal,
 *   empty, s, out, out_st): per (b, h), s = softmax(scale q k^T + bias) (as above) and
 *   out = s v; q (nb, nh, tq, d), k (nb, nh, tk, d), v (nb, nh, tk, dv) and out
 *   (nb, nh, tq, dv) with (batch, head, row) strides *_st, rows contiguous; s (nb, nh, tq, tk)
 *   C-contiguous, or NULL: the weights are not kept (no (tq, tk) array is made);
 * encoder_layer(n, len, e, heads, f, x, pw, vec, eps1, eps2, code, norm_first, bias, bias_st,
 *   empty, s, out): ReferenceOps.encoder_layer on x (n len, e) C-contiguous into out (n len, e):
 *   pw[0:4] the packed (gemm.h) w_qkv (e, 3e), w_o (e, e), w_1 (e, f), w_2 (f, e);
 *   vec[0:8] b_qkv, b_o, b_1, b_2, gamma1, beta1, gamma2, beta2 (each NULL for none); the
 *   feed-forward activation `code` (rows.h); s (n, heads, len, len) or NULL as above.
 *   f = 0 (norm_first 0): the attention block alone, ReferenceOps.self_attention: out =
 *   att w_o + b_o, no residual, norms or feed-forward; pw[2:4] and vec[2:8] are not read. */
#ifndef FL_ATTENTION_H
#define FL_ATTENTION_H
#include <stdint.h>

#define FL_ATTENTION_KERNELS(X)                                                               \
    X(int, attention_softmax, (int64_t nb, int64_t nh, int64_t tq, int64_t tk, float *s,      \
                               float scale, const float *bias, const int64_t *bias_st,        \
                               int causal, int empty),                                         \
      (nb, nh, tq, tk, s, scale, bias, bias_st, causal, empty))                                \
    X(int, attention, (int64_t nb, int64_t nh, int64_t tq, int64_t tk, int64_t d, int64_t dv, \
                       const float *q, const int64_t *q_st, const float *k,                   \
                       const int64_t *k_st, const float *v, const int64_t *v_st, float scale, \
                       const float *bias, const int64_t *bias_st, int causal, int empty,      \
                       float *s, float *out, const int64_t *out_st),                          \
      (nb, nh, tq, tk, d, dv, q, q_st, k, k_st, v, v_st, scale, bias, bias_st, causal, empty, \
       s, out, out_st))                                                                        \
    X(int, encoder_layer, (int64_t n, int64_t len, int64_t e, int64_t heads, int64_t f,       \
                           const float *x, const float *const *pw, const float *const *vec,   \
                           float eps1, float eps2, int code, int norm_first,                  \
                           const float *bias, const int64_t *bias_st, int empty, float *s,    \
                           float *out),                                                        \
      (n, len, e, heads, f, x, pw, vec, eps1, eps2, code, norm_first, bias, bias_st, empty,   \
       s, out))
#endif
