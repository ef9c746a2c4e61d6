/* What rows.c shares with the other kernel files of its ISA: the vector activations
 * (rows_vact and the functions it calls), inline in every caller, and the row epilogue and
 * layer-norm row, defined once in rows.c. */
#ifndef FL_ROWS_INTERNAL_H
#define FL_ROWS_INTERNAL_H
#include "fl.h"
#include "rows.h"

/* Cephes tanhf below |x| 0.625: x + x z P(z), z = x^2. */
FL_INLINE fl_vf rows_vtanh(fl_vf x) {
    fl_vf ax = fl_select(x < 0.0f, -x, x);
    fl_vf z = x * x;
    fl_vf p = fl_set1(-5.70498872745e-3f);
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    fl_vf small = x + x * z * p;
    /* 1 - 2 / (exp(2|x|) + 1), signed */
    fl_vf big = 1.0f - 2.0f / (fl_vexp(ax + ax) + 1.0f);
    big = fl_select(x < 0.0f, -big, big);
    fl_vf y = fl_select(ax < 0.625f, small, big);
    return fl_select(x != x, x, y);
}

FL_INLINE fl_vf rows_vsigmoid(fl_vf x) { return 1.0f / (1.0f + fl_vexp(-x)); }

/* tanh(x) and sigmoid(x) as onnxruntime computes the ONNX Tanh and Sigmoid and its recurrent
 * gates (MLAS, after Eigen): v = clamp(x, -9, 9), v P(v^2) / Q(v^2) (P of degree 6, Q of degree 3
 * in v^2); and v = clamp(x, -18, 18), 0.5 + v P(v^2) / Q(v^2) (degrees 4 and 5) clamped to [0,
 * 1]. Horner's rule with fused multiply-adds (the compiler contracts a * b + c on the FMA paths,
 * as MLAS's FMA3 kernels do): the same bits on the AVX2 and AVX-512 paths. Up to 1.4e-7 from
 * sigmoid(x) in absolute terms (less precise than rows_vsigmoid where sigmoid(x) is small), and
 * sigmoid(-18) below -18; a quantized graph's DynamicQuantizeLinear after them then rounds as
 * onnxruntime's does. NaN stays NaN. */
FL_INLINE fl_vf rows_vtanh_onnx(fl_vf x) {
    fl_vf v = fl_vmin(fl_vmax(x, fl_set1(-9.0f)), fl_set1(9.0f));
    fl_vf v2 = v * v;
    fl_vf p = v2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * v2 + -8.60467152213735e-11f;
    p = p * v2 + 5.12229709037114e-08f;
    p = p * v2 + 1.48572235717979e-05f;
    p = p * v2 + 6.37261928875436e-04f;
    p = p * v2 + 4.89352455891786e-03f;
    p = p * v;
    fl_vf q = v2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * v2 + 2.26843463243900e-03f;
    q = q * v2 + 4.89352518554385e-03f;
    return p / q;
}

FL_INLINE fl_vf rows_vsigmoid_onnx(fl_vf x) {
    fl_vf v = fl_vmin(fl_vmax(x, fl_set1(-18.0f)), fl_set1(18.0f));
    fl_vf v2 = v * v;
    fl_vf p = v2 * 4.37031012579801e-11f + 1.15627324459942e-07f;
    p = p * v2 + 6.08574864600143e-05f;
    p = p * v2 + 8.51377133304701e-03f;
    p = p * v2 + 2.48287947061529e-01f;
    p = p * v;
    fl_vf q = v2 * 6.10247389755681e-13f + 5.76102136993427e-09f;
    q = q * v2 + 6.29106785017040e-06f;
    q = q * v2 + 1.70198817374094e-03f;
    q = q * v2 + 1.16817656904453e-01f;
    q = q * v2 + 9.93151921023180e-01f;
    return fl_vmin(fl_vmax(p / q + 0.5f, fl_set1(0.0f)), fl_set1(1.0f));
}

/* erf(x / sqrt 2) = x P(x^2) / Q(x^2), P and Q of degree 5 (Q(0) = 1): a weighted
 * least-squares minimax fit on |x| <= 5.2 (1e-8 in float64, 4e-7 as float32 evaluates it),
 * and +-1 outside it (erf(5.2 / sqrt 2) is 1 - 2e-7). Twelve fused multiply-adds and one
 * division: no exp, no branch. */
FL_INLINE fl_vf rows_verf_gelu(fl_vf x) {
    fl_vf v = fl_vmin(fl_vmax(x, fl_set1(-5.2f)), fl_set1(5.2f));
    fl_vf z = v * v;
    fl_vf p = z * 5.0232039e-08f + 1.2797504e-05f;
    p = p * z + 3.0673065e-04f;
    p = p * z + 9.1757886e-03f;
    p = p * z + 6.4374857e-02f;
    p = p * z + 7.9788458e-01f;
    fl_vf q = z * 1.2693495e-06f + 6.9448171e-05f;
    q = q * z + 1.7974875e-03f;
    q = q * z + 2.7725162e-02f;
    q = q * z + 2.4734849e-01f;
    q = q * z + 1.0f;
    fl_vf e = v * p / q;
    return fl_select(v == x, e, fl_select(x < 0.0f, fl_set1(-1.0f), fl_set1(1.0f)));
}

/* f(x) for the elementwise activation `code` (not the softmax codes); NaN propagates. */
FL_INLINE fl_vf rows_vact(fl_vf x, int code, float alpha) {
    switch (code) {
    case FL_RELU: return fl_vmax(x, fl_set1(0.0f));
    case FL_RELU6: return fl_vmin(fl_vmax(x, fl_set1(0.0f)), fl_set1(6.0f));
    case FL_LEAKY_RELU: return fl_select(x < 0.0f, x * alpha, x);
    case FL_HARD_SIGMOID:
        return fl_vmin(fl_vmax(x + 3.0f, fl_set1(0.0f)), fl_set1(6.0f)) * (1.0f / 6.0f);
    case FL_HARD_SILU:                                /* x relu6(x + 3) / 6 */
        return x * (fl_vmin(fl_vmax(x + 3.0f, fl_set1(0.0f)), fl_set1(6.0f)) * (1.0f / 6.0f));
    case FL_SOFTSIGN: return x / (1.0f + fl_select(x < 0.0f, -x, x));
    case FL_SIGMOID: return rows_vsigmoid(x);
    case FL_SILU: return x * rows_vsigmoid(x);
    case FL_ONNX_SIGMOID: return rows_vsigmoid_onnx(x);
    case FL_ONNX_SILU: return x * rows_vsigmoid_onnx(x);
    case FL_ONNX_TANH: return rows_vtanh_onnx(x);
    case FL_GELU: return 0.5f * x * (1.0f + rows_verf_gelu(x));    /* x/2 (1 + erf(x / sqrt 2)) */
    case FL_GELU_TANH: {                              /* x sigmoid(2 sqrt(2/pi) (x + c x^3)) */
        fl_vf u = 1.5957691216057308f * (x + 0.044715f * x * x * x);
        return x * rows_vsigmoid(u);
    }
    case FL_EXPONENTIAL: return fl_vexp(x);
    case FL_TANH: return rows_vtanh(x);
    default: return x;
    }
}

/* out[i, :] = f(x[i, :] + bias) for rows [r0, r1) of an (m, n) block (rows ldx / ldo floats
 * apart, out may be x, bias NULL for none; any code, the softmax codes included). */
void FL_FN(rows_bias_act_range)(int64_t r0, int64_t r1, int64_t n, const float *x, int64_t ldx,
                                const float *bias, int code, float alpha, float *out,
                                int64_t ldo);
/* o[0:n] = f(x[0:n] + b[0:n]) (o may be x), an elementwise code: a residual Add and its
 * activation over one run of values. */
void FL_FN(rows_add_act_row)(const float *x, const float *b, float *o, int64_t n, int code,
                             float alpha);
/* o[0:n] = the layer norm of xr[0:n] (layer_norm in rows.h, one row; o may be xr). */
void FL_FN(rows_layer_norm_row)(int64_t n, const float *xr, const float *gamma,
                                const float *beta, float eps, int rms, float *o);
#endif
