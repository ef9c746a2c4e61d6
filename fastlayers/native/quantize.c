/* Elementwise quantization (quantize.h), FL_VW floats at a time: the division and the
 * rounding (to nearest even, as nearbyintf) are IEEE float32 operations, so every path gives
 * the numpy formula's values. Compiled once per ISA (kernels.inc). */

#define QUANTIZE_GRAIN 65536

FL_INLINE fl_vf quantize_round(fl_vf v) {
#if FL_VW == 16 && defined(__AVX512F__)
    return (fl_vf)_mm512_roundscale_ps((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif FL_VW == 8 && defined(__AVX__)
    return (fl_vf)_mm256_round_ps((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    fl_vf r;
    for (int i = 0; i < FL_VW; ++i) r[i] = nearbyintf(v[i]);
    return r;
#endif
}

/* clamp(round(x / scale) + zero_point, lo, hi) of FL_VW floats. */
FL_INLINE fl_vf quantize_v(fl_vf x, float scale, float zero_point, float lo, float hi) {
    fl_vf q = quantize_round(x / scale) + zero_point;
    return fl_vmin(fl_vmax(q, fl_set1(lo)), fl_set1(hi));
}

typedef struct {
    const float *x;
    float scale, zero_point, lo, hi;
    void *q;
    float *y;
    int q_signed;
} quantize_ctx;

static void quantize_task(void *p, int64_t i0, int64_t i1) {
    quantize_ctx *c = (quantize_ctx *)p;
    float t[FL_VW];
    for (int64_t i = i0; i < i1; i += FL_VW) {
        int64_t cnt = FL_MIN(FL_VW, i1 - i);
        fl_vf q = quantize_v(rnn_load(c->x + i, cnt), c->scale, c->zero_point, c->lo, c->hi);
        if (c->y) {
            rnn_store(c->y + i, (q - c->zero_point) * c->scale, cnt);
            continue;
        }
        fl_store(t, q);
        for (int64_t k = 0; k < cnt; ++k) {
            if (c->q_signed) ((int8_t *)c->q)[i + k] = (int8_t)t[k];
            else ((uint8_t *)c->q)[i + k] = (uint8_t)t[k];
        }
    }
}

/* Chunks of at least QUANTIZE_GRAIN floats on the pool's threads. */
static void quantize_run(int64_t count, quantize_ctx *c) {
    if (count <= QUANTIZE_GRAIN) quantize_task(c, 0, count);
    else fl_parallel(count, QUANTIZE_GRAIN, quantize_task, c);
}

int FL_FN(quantize)(int64_t count, const float *x, float scale, float zero_point, float lo,
                    float hi, void *q, int q_signed) {
    quantize_ctx c = {x, scale, zero_point, lo, hi, q, 0, q_signed};
    quantize_run(count, &c);
    return 0;
}

int FL_FN(fake_quantize)(int64_t count, const float *x, float scale, float zero_point, float lo,
                         float hi, float *y) {
    quantize_ctx c = {x, scale, zero_point, lo, hi, 0, y, 0};
    quantize_run(count, &c);
    return 0;
}

int FL_FN(min_max)(int64_t count, const float *x, float *out) {
    fl_vf lo = fl_set1(0.0f), hi = fl_set1(0.0f);
    int64_t i = 0;
    for (; i + FL_VW <= count; i += FL_VW) {
        fl_vf v = fl_load(x + i);
        lo = fl_select(v < lo, v, lo);
        hi = fl_select(v > hi, v, hi);
    }
    float l = 0.0f, h = 0.0f, tl[FL_VW], th[FL_VW];
    fl_store(tl, lo);
    fl_store(th, hi);
    for (int k = 0; k < FL_VW; ++k) {
        l = tl[k] < l ? tl[k] : l;
        h = th[k] > h ? th[k] : h;
    }
    for (; i < count; ++i) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    out[0] = l;
    out[1] = h;
    return 0;
}
