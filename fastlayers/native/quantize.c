/* Elementwise quantization (quantize.h), FL_VW floats at a time: the division and the
 * rounding (to nearest even, as nearbyintf) are IEEE float32 operations, so every path gives
 * the numpy formula's values. Compiled once per ISA (kernels.inc). */

#include "fl.h"
#include "quantize.h"
#include "recurrent_internal.h"
#include "threadpool.h"

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

/* FL_VW bytes: the quantized values' low bytes. */
typedef int8_t quantize_bytes __attribute__((vector_size(FL_VW)));

typedef struct {
    const float *x;
    float scale, zero_point, lo, hi;
    void *q;
    float *y;
} quantize_ctx;

static void quantize_task(void *p, int64_t i0, int64_t i1) {
    quantize_ctx *c = (quantize_ctx *)p;
    for (int64_t i = i0; i < i1; i += FL_VW) {
        int64_t cnt = FL_MIN(FL_VW, i1 - i);
        fl_vf q = quantize_v(rnn_load(c->x + i, cnt), c->scale, c->zero_point, c->lo, c->hi);
        if (c->y) {
            rnn_store(c->y + i, (q - c->zero_point) * c->scale, cnt);
            continue;
        }
        /* q holds whole numbers within the 8-bit range: converted exactly, then each lane's
         * low byte (the uint8 or int8 value) */
        quantize_bytes bytes = __builtin_convertvector(__builtin_convertvector(q, fl_vi), quantize_bytes);
        if (cnt == FL_VW) memcpy((int8_t *)c->q + i, &bytes, sizeof bytes);   /* one store, not a call */
        else memcpy((int8_t *)c->q + i, &bytes, (size_t)cnt);
    }
}

/* Chunks of at least QUANTIZE_GRAIN floats on the pool's threads. */
static void quantize_run(int64_t count, quantize_ctx *c) {
    if (count <= QUANTIZE_GRAIN) quantize_task(c, 0, count);
    else fl_parallel(count, QUANTIZE_GRAIN, quantize_task, c);
}

int FL_FN(quantize)(int64_t count, const float *x, float scale, float zero_point, float lo,
                    float hi, void *q, int q_signed) {
    (void)q_signed;   /* the low byte of the value: the same for uint8 and int8 */
    quantize_ctx c = {x, scale, zero_point, lo, hi, q, 0};
    quantize_run(count, &c);
    return 0;
}

int FL_FN(fake_quantize)(int64_t count, const float *x, float scale, float zero_point, float lo,
                         float hi, float *y) {
    quantize_ctx c = {x, scale, zero_point, lo, hi, 0, y};
    quantize_run(count, &c);
    return 0;
}

/* [min(x, 0), max(x, 0)] of x[i0:i1] into out[0], out[1]. */
static void min_max_range(const float *x, int64_t i0, int64_t i1, float *out) {
    fl_vf lo = fl_set1(0.0f), hi = fl_set1(0.0f);
    int64_t i = i0;
    for (; i + FL_VW <= i1; i += FL_VW) {
        fl_vf v = fl_load(x + i);
        lo = fl_vmin(lo, v);   /* v < lo ? v : lo (a NaN v is passed over), one instruction */
        hi = fl_vmax(hi, v);
    }
    float l = 0.0f, h = 0.0f, tl[FL_VW], th[FL_VW];
    fl_store(tl, lo);
    fl_store(th, hi);
    for (int k = 0; k < FL_VW; ++k) {
        l = tl[k] < l ? tl[k] : l;
        h = th[k] > h ? th[k] : h;
    }
    for (; i < i1; ++i) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
    }
    out[0] = l;
    out[1] = h;
}

typedef struct {
    const float *x;
    int64_t count;
    float *blocks;      /* (min, max) of each QUANTIZE_GRAIN floats */
} min_max_ctx;

static void min_max_task(void *p, int64_t b0, int64_t b1) {
    min_max_ctx *c = (min_max_ctx *)p;
    for (int64_t b = b0; b < b1; ++b)
        min_max_range(c->x, b * QUANTIZE_GRAIN, FL_MIN((b + 1) * QUANTIZE_GRAIN, c->count), c->blocks + 2 * b);
}

static __thread fl_buf min_max_buf;

int FL_FN(min_max)(int64_t count, const float *x, float *out) {
    int64_t blocks = (count + QUANTIZE_GRAIN - 1) / QUANTIZE_GRAIN;
    float *per_block = blocks > 1 ? fl_buf_floats(&min_max_buf, (size_t)(2 * blocks)) : 0;
    if (!per_block) {
        min_max_range(x, 0, count, out);
        return 0;
    }
    min_max_ctx c = {x, count, per_block};
    fl_parallel(blocks, 1, min_max_task, &c);
    out[0] = out[1] = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {   /* min and max are exact: any order gives them */
        out[0] = per_block[2 * b] < out[0] ? per_block[2 * b] : out[0];
        out[1] = per_block[2 * b + 1] > out[1] ? per_block[2 * b + 1] : out[1];
    }
    return 0;
}
