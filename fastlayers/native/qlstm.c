/* The quantized LSTM time loop (qlstm.h), on qgemm.c's tiles, on the calling thread (one
 * step's product is small; the steps are sequential). Compiled once per ISA (kernels.inc). */

static __thread fl_buf qlstm_buf;

/* hw (rows, 2 kp) = uint8 quantization of h (rows, hidden) less its zero point, as
 * DynamicQuantizeLinear (float32 arithmetic, round half to even); returns the scale. */
static float qlstm_quantize(const float *h, int64_t count, int64_t rows, int64_t hidden,
                            int64_t kp, int16_t *hw) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < count; ++i) {
        lo = h[i] < lo ? h[i] : lo;
        hi = h[i] > hi ? h[i] : hi;
    }
    float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float zp = nearbyintf(FL_MIN(FL_MAX(0.0f - lo / scale, 0.0f), 255.0f));
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < hidden; ++j) {
            float q = nearbyintf(h[r * hidden + j] / scale) + zp;
            q = q < 0.0f ? 0.0f : q > 255.0f ? 255.0f : q;
            hw[r * 2 * kp + j] = (int16_t)(q - zp);
        }
        if (hidden % 2) hw[r * 2 * kp + hidden] = 0;
    }
    return scale;
}

int FL_FN(qlstm)(int64_t steps, int64_t batch, int64_t hidden, const float *x_proj, int reverse,
                 const int16_t *r_packed, const float *r_scale, const float *bias,
                 const float *peep, float clip, int input_forget, float *h, float *c, float *y,
                 int64_t y_step) {
    int64_t g = 4 * hidden, kp = (hidden + 1) / 2;
    size_t hw_bytes = (size_t)(batch * 2 * kp) * sizeof(int16_t);
    hw_bytes = (hw_bytes + 63) / 64 * 64;
    char *buf = (char *)fl_buf_grow(&qlstm_buf, hw_bytes + (size_t)(batch * g) * sizeof(int32_t) +
                                                  (size_t)g * sizeof(float));
    if (!buf) return -1;
    int16_t *hw = (int16_t *)buf;
    int32_t *acc = (int32_t *)(buf + hw_bytes);
    float *z = (float *)(acc + batch * g);      /* one row's gate inputs */
    for (int64_t s = 0; s < steps; ++s) {
        int64_t t = reverse ? steps - 1 - s : s;
        float h_scale = qlstm_quantize(h, batch * hidden, batch, hidden, kp, hw);
        for (int64_t j0 = 0; j0 < g; j0 += FL_QPANEL) {
            const int16_t *bp = r_packed + j0 * 2 * kp;
            int64_t cols = FL_MIN(FL_QPANEL, g - j0);
            for (int64_t i = 0; i < batch; i += QGEMM_MR) {
                const int16_t *aw = hw + i * 2 * kp;
                int32_t *ct = acc + i * g + j0;
                switch (FL_MIN(QGEMM_MR, batch - i)) {
                case 5: qgemm_tile(5, kp, aw, bp, 0, 0, ct, g, cols); break;
                case 4: qgemm_tile(4, kp, aw, bp, 0, 0, ct, g, cols); break;
                case 3: qgemm_tile(3, kp, aw, bp, 0, 0, ct, g, cols); break;
                case 2: qgemm_tile(2, kp, aw, bp, 0, 0, ct, g, cols); break;
                default: qgemm_tile(1, kp, aw, bp, 0, 0, ct, g, cols); break;
                }
            }
        }
        for (int64_t r = 0; r < batch; ++r) {
            const float *xp = x_proj + (t * batch + r) * g;
            const int32_t *ar = acc + r * g;
            float *hr = h + r * hidden, *cr = c + r * hidden, *zr = z;
            /* z = x W + float(acc) (h_scale r_scale), the product rounded before the sum */
            int64_t col = 0;
            for (; col + FL_VW <= g; col += FL_VW) {
                fl_vf s = fl_set1(h_scale) * fl_load(r_scale + col);
                fl_vf prod = fl_rounded(__builtin_convertvector(*(const fl_vi_u *)(ar + col), fl_vf) * s);
                fl_store(zr + col, fl_load(xp + col) + prod);
            }
            for (; col < g; ++col) {
                volatile float prod = (float)ar[col] * (h_scale * r_scale[col]);
                zr[col] = xp[col] + prod;
            }
            /* the gates FL_VW units at a time, the tail on zero-padded copies, in onnxruntime's
             * order and arithmetic: z (+ P c) + b, its sigmoid and tanh (rows.c), products
             * rounded before their sums */
            for (int64_t j = 0; j < hidden; j += FL_VW) {
                int64_t cnt = FL_MIN(FL_VW, hidden - j);
                fl_vf zi = rnn_load(zr + j, cnt), zo = rnn_load(zr + hidden + j, cnt);
                fl_vf zf = rnn_load(zr + 2 * hidden + j, cnt), zc = rnn_load(zr + 3 * hidden + j, cnt);
                fl_vf c_prev = rnn_load(cr + j, cnt);
                if (peep) {
                    zi += fl_rounded(rnn_load(peep + j, cnt) * c_prev);
                    zf += fl_rounded(rnn_load(peep + 2 * hidden + j, cnt) * c_prev);
                }
                if (bias) {
                    zi += rnn_load(bias + j, cnt);
                    zf += rnn_load(bias + 2 * hidden + j, cnt);
                    zc += rnn_load(bias + 3 * hidden + j, cnt);
                }
                if (clip > 0) {
                    zi = fl_vmin(fl_vmax(zi, fl_set1(-clip)), fl_set1(clip));
                    zf = fl_vmin(fl_vmax(zf, fl_set1(-clip)), fl_set1(clip));
                    zc = fl_vmin(fl_vmax(zc, fl_set1(-clip)), fl_set1(clip));
                }
                fl_vf gi = rows_vsigmoid_onnx(zi);
                fl_vf gf = input_forget ? 1.0f - gi : rows_vsigmoid_onnx(zf);
                fl_vf c_new = fl_rounded(c_prev * gf) + fl_rounded(gi * rows_vtanh_onnx(zc));
                if (peep) zo += fl_rounded(rnn_load(peep + hidden + j, cnt) * c_new);
                if (bias) zo += rnn_load(bias + hidden + j, cnt);
                if (clip > 0) zo = fl_vmin(fl_vmax(zo, fl_set1(-clip)), fl_set1(clip));
                rnn_store(cr + j, c_new, cnt);
                rnn_store(hr + j, rows_vtanh_onnx(c_new) * rows_vsigmoid_onnx(zo), cnt);
            }
        }
        if (y) memcpy(y + t * y_step, h, (size_t)(batch * hidden) * sizeof(float));
    }
    return 0;
}
