/* Common definitions of the native core: the ISA a kernel file is compiled for, its vector
 * type and the few vector helpers every kernel file uses.
 *
 * Kernel files (gemm.c, rows.c, ...) are compiled once per ISA by isa_avx512.c, isa_avx2.c and
 * isa_generic.c, which define FL_ISA_AVX512 / FL_ISA_AVX2 / nothing before including them
 * (setup.py gives each its compiler flags). FL_FN(name) names a kernel of the ISA being built
 * (name_avx512, name_avx2, name_generic); dispatch.c gathers them into one table per ISA.
 *
 * Each kernel file includes the headers it uses and compiles on its own. What it uses of
 * another kernel file is in that file's internal header (<subject>_internal.h): small helpers
 * as inline functions, larger functions and shared per-thread buffers declared there under
 * their ISA's name, FL_FN(name), and defined once in the file.
 *
 * Vectors are GCC/clang vector extensions of FL_VW floats: 16 for AVX-512F, 8 for AVX2+FMA and
 * 4 for the portable path (SSE2 on x86-64, NEON on aarch64, scalar code elsewhere).
 */
#ifndef FL_H
#define FL_H
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "heap.h"

#if defined(FL_ISA_AVX512)
#define FL_VW 16
#define FL_FN(name) name##_avx512
#define FL_ISA_NAME "avx512"
#elif defined(FL_ISA_AVX2)
#define FL_VW 8
#define FL_FN(name) name##_avx2
#define FL_ISA_NAME "avx2"
#else
#define FL_VW 4
#define FL_FN(name) name##_generic
#define FL_ISA_NAME "generic"
#endif

#define FL_INLINE static inline __attribute__((always_inline))
/* Declares this ISA's kernel of one entry X(ret, name, params, args) of a subject's X-macro
 * list (kernels.h), for kernel files calling another subject's kernels directly:
 * FL_GEMM_KERNELS(FL_DECLARE) declares FL_FN(pack), FL_FN(sgemm_packed), ... */
#define FL_DECLARE(ret, name, params, args) ret FL_FN(name) params;
#define FL_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FL_MAX(a, b) ((a) > (b) ? (a) : (b))
/* Floats in one 64-byte cache line: the step of a loop prefetching a run of floats. */
#define FL_LINE_FLOATS 16

/* A work buffer owned by one thread (declare it `static __thread`), grown on demand; the
 * memory is freed when its thread exits (heap.h). */
typedef fl_thread_buf fl_buf;

/* b's buffer of at least `bytes` bytes, 64-byte aligned (contents undefined), or NULL. */
static inline void *fl_buf_grow(fl_buf *b, size_t bytes) {
    if (b->bytes < bytes) {
        free(b->p);
        b->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        b->bytes = b->p ? bytes : 0;
        if (b->p && !b->tracked) fl_thread_buf_track(b);
    }
    return b->p;
}

/* b's buffer of at least `floats` floats, or NULL. */
static inline float *fl_buf_floats(fl_buf *b, size_t floats) {
    return (float *)fl_buf_grow(b, floats * sizeof(float));
}

/* A vector of FL_VW floats, the same of int32, and their unaligned forms for loads/stores. */
typedef float fl_vf __attribute__((vector_size(FL_VW * 4)));
typedef int32_t fl_vi __attribute__((vector_size(FL_VW * 4)));
typedef float fl_vf_u __attribute__((vector_size(FL_VW * 4), aligned(4), may_alias));
typedef int32_t fl_vi_u __attribute__((vector_size(FL_VW * 4), aligned(4), may_alias));

FL_INLINE fl_vf fl_load(const float *p) { return *(const fl_vf_u *)p; }
FL_INLINE void fl_store(float *p, fl_vf v) { *(fl_vf_u *)p = v; }
/* a - (+0) is a exactly (also for -0), so the compiler emits a bare broadcast */
FL_INLINE fl_vf fl_set1(float a) { return a - (fl_vf){0}; }
/* mask ? a : b lane by lane (mask lanes all ones or zero, as vector comparisons give), and
 * min / max lane by lane that return a where a is NaN (b < a is false for NaN): one blend or
 * min/max instruction where the ISA has it (the bitwise form took four). */
#if FL_VW == 16 && defined(__AVX512F__)
#include <immintrin.h>
FL_INLINE fl_vf fl_select(fl_vi mask, fl_vf a, fl_vf b) {
    __mmask16 k = _mm512_movepi32_mask((__m512i)mask);
    return (fl_vf)_mm512_mask_blend_ps(k, (__m512)b, (__m512)a);
}
FL_INLINE fl_vf fl_vmin(fl_vf a, fl_vf b) { return (fl_vf)_mm512_min_ps((__m512)b, (__m512)a); }
FL_INLINE fl_vf fl_vmax(fl_vf a, fl_vf b) { return (fl_vf)_mm512_max_ps((__m512)b, (__m512)a); }
#elif FL_VW == 8 && defined(__AVX__)
#include <immintrin.h>
FL_INLINE fl_vf fl_select(fl_vi mask, fl_vf a, fl_vf b) {
    return (fl_vf)_mm256_blendv_ps((__m256)b, (__m256)a, (__m256)mask);
}
FL_INLINE fl_vf fl_vmin(fl_vf a, fl_vf b) { return (fl_vf)_mm256_min_ps((__m256)b, (__m256)a); }
FL_INLINE fl_vf fl_vmax(fl_vf a, fl_vf b) { return (fl_vf)_mm256_max_ps((__m256)b, (__m256)a); }
#else
FL_INLINE fl_vf fl_select(fl_vi mask, fl_vf a, fl_vf b) {
    return (fl_vf)(((fl_vi)a & mask) | ((fl_vi)b & ~mask));
}
FL_INLINE fl_vf fl_vmin(fl_vf a, fl_vf b) { return fl_select(b < a, b, a); }
FL_INLINE fl_vf fl_vmax(fl_vf a, fl_vf b) { return fl_select(b > a, b, a); }
#endif
/* The lanes that met a NaN in a running max (fl_vmax keeps a NaN already in its first operand,
 * not one in its second): fl_nan_none(), m = fl_nan_add(m, v) per value, fl_nan_apply(m, acc)
 * NaN in those lanes; fl_nan_any(m) whether there is one. A mask register on AVX-512: the
 * vector form there went through a general register and back per value, most of a 3x3 max
 * pool's time. */
#if FL_VW == 16 && defined(__AVX512F__)
typedef __mmask16 fl_nan;
FL_INLINE fl_nan fl_nan_none(void) { return 0; }
FL_INLINE fl_nan fl_nan_add(fl_nan m, fl_vf v) {
    return (fl_nan)(m | _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q));
}
/* fl_nan_add(fl_nan_add(m, a), b) in one comparison. */
FL_INLINE fl_nan fl_nan_add2(fl_nan m, fl_vf a, fl_vf b) {
    return (fl_nan)(m | _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_UNORD_Q));
}
FL_INLINE fl_vf fl_nan_apply(fl_nan m, fl_vf acc) {
    return (fl_vf)_mm512_mask_blend_ps(m, (__m512)acc, _mm512_set1_ps(__builtin_nanf("")));
}
FL_INLINE int fl_nan_any(fl_nan m) { return m != 0; }
#else
typedef fl_vi fl_nan;
FL_INLINE fl_nan fl_nan_none(void) { return (fl_vi){0}; }
FL_INLINE fl_nan fl_nan_add(fl_nan m, fl_vf v) { return m | (v != v); }
FL_INLINE fl_nan fl_nan_add2(fl_nan m, fl_vf a, fl_vf b) { return m | (a != a) | (b != b); }
FL_INLINE fl_vf fl_nan_apply(fl_nan m, fl_vf acc) { return fl_select(m, fl_set1(__builtin_nanf("")), acc); }
FL_INLINE int fl_nan_any(fl_nan m) {
    int any = 0;
    for (int l = 0; l < FL_VW; ++l) any |= m[l] != 0;
    return any;
}
#endif
/* The first n lanes (0 <= n <= FL_VW) of p, zeros in the others, and a store of v's first n
 * lanes to p: a vector's worth of channels at a row's end. One masked load or store where the
 * ISA has them (lanes past n are neither read nor written, so p + n may be the end of an
 * allocation); the lane-by-lane loop they replace took several times the arithmetic of a
 * Winograd tile of 24 channels. fl_load_lanes(p, a, e): lanes [a, e) of p (0 <= a <= e <=
 * FL_VW), zeros in the others, which are not read (p + a may be an allocation's start: the
 * edge of a row under padding). */
#if FL_VW == 16 && defined(__AVX512F__)
FL_INLINE fl_vf fl_load_n(const float *p, int64_t n) {
    return (fl_vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
FL_INLINE void fl_store_n(float *p, fl_vf v, int64_t n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v);
}
FL_INLINE fl_vf fl_load_lanes(const float *p, int64_t a, int64_t e) {
    return (fl_vf)_mm512_maskz_loadu_ps((__mmask16)(((1u << e) - 1) & ~((1u << a) - 1)), p);
}
#elif FL_VW == 8 && defined(__AVX2__)
FL_INLINE __m256i fl_lanes_below(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
FL_INLINE fl_vf fl_load_n(const float *p, int64_t n) { return (fl_vf)_mm256_maskload_ps(p, fl_lanes_below(n)); }
FL_INLINE void fl_store_n(float *p, fl_vf v, int64_t n) { _mm256_maskstore_ps(p, fl_lanes_below(n), (__m256)v); }
FL_INLINE fl_vf fl_load_lanes(const float *p, int64_t a, int64_t e) {
    return (fl_vf)_mm256_maskload_ps(p, _mm256_andnot_si256(fl_lanes_below(a), fl_lanes_below(e)));
}
#else
FL_INLINE fl_vf fl_load_n(const float *p, int64_t n) {
    fl_vf v = fl_set1(0.0f);
    for (int64_t i = 0; i < n; ++i) v[i] = p[i];
    return v;
}
FL_INLINE fl_vf fl_load_lanes(const float *p, int64_t a, int64_t e) {
    fl_vf v = fl_set1(0.0f);
    for (int64_t i = a; i < e; ++i) v[i] = p[i];
    return v;
}
FL_INLINE void fl_store_n(float *p, fl_vf v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = v[i];
}
#endif
/* Lanes of a and b picked by constant indices (0 .. FL_VW - 1 from a, FL_VW .. from b): one
 * permute instruction where the ISA has a two-source one. */
#if defined(__clang__)
#define FL_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FL_SHUF(a, b, ...) __builtin_shuffle(a, b, (fl_vi){__VA_ARGS__})
#endif
/* v itself, hidden from the optimizer: a product passed through it is rounded before the sum
 * that uses it (no fused multiply-add), for code that must round as another engine's scalar
 * loops do (qlstm.c, onnxruntime's LSTM gates). */
FL_INLINE fl_vf fl_rounded(fl_vf v) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+v"(v));
#elif defined(__aarch64__)
    __asm__("" : "+w"(v));
#else
    volatile fl_vf t = v;
    v = t;
#endif
    return v;
}

FL_INLINE float fl_hsum(fl_vf v) {
    float s = 0.0f;
    for (int i = 0; i < FL_VW; ++i) s += v[i];
    return s;
}
FL_INLINE float fl_hmax(fl_vf v) {
    float m = v[0];
    for (int i = 1; i < FL_VW; ++i) m = v[i] > m ? v[i] : m;
    return m;
}

/* The float just above ln FLT_MIN: exp of it and of anything above is a normal float, exp
 * of anything below is taken as 0. Where the clamp let a lane's 2^n p fall below the normal
 * range, that multiply produced a denormal, which x86 cores compute in a microcode assist,
 * about 100x slower, even where the lane is then set to 0: a GELU (tanh form) over a layer
 * whose values reach +-10 ran 6x slower than over unit values (docs/design.md). */
#define FL_EXP_LO (-87.33654022216797f)

/* e^r and n with x = n ln 2 + r, n = round(x log2 e), r by Cody-Waite, e^r from the Cephes expf
 * polynomial (within 2e-7 relative of float64), for x in [-87.34, 88.73]: the common part of
 * fl_vexp and the attention softmax's exp of shifted scores. */
FL_INLINE fl_vf fl_vexp_reduced(fl_vf x, fl_vi *n_out) {
    const fl_vf magic = fl_set1(12582912.0f);           /* 1.5 * 2^23: rounds to nearest */
    fl_vf n = (x * 1.44269504088896341f + magic) - magic;
    fl_vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    fl_vf p = fl_set1(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *n_out = __builtin_convertvector(n, fl_vi);
    return p * (r * r) + (r + 1.0f);
}

/* exp(x) lane by lane (fl_vexp_reduced), 2^n applied as two factors 2^(n/2) 2^(n - n/2) so
 * that n = 128 (x up to ln FLT_MAX) stays finite. exp(x) = 0 below FL_EXP_LO (where 2^n
 * would leave the normal range), inf above ln FLT_MAX, NaN stays NaN. */
FL_INLINE fl_vf fl_vexp(fl_vf x) {
    const fl_vf lo = fl_set1(FL_EXP_LO), hi = fl_set1(88.72283935546875f);
    fl_vi ni;
    fl_vf p = fl_vexp_reduced(fl_vmax(fl_vmin(x, hi), lo), &ni);
    fl_vi half = ni >> 1;
    fl_vf y = p * (fl_vf)((half + 127) << 23) * (fl_vf)((ni - half + 127) << 23);
    y = fl_select(x < lo, fl_set1(0.0f), y);
    y = fl_select(x > hi, fl_set1(__builtin_inff()), y);
    return fl_select(x != x, x, y);
}

/* exp(x) lane by lane for x <= 88 or NaN (fl_vexp_reduced, one range check: 0 below
 * FL_EXP_LO, where 2^n would leave the normal range; NaN stays NaN): for arguments known not
 * to overflow (shifted softmax scores), where fl_vexp's clamps cost a third of the time. */
FL_INLINE fl_vf fl_vexp_bounded(fl_vf x) {
    const fl_vf lo = fl_set1(FL_EXP_LO);
    fl_vi below = x < lo, ni;
    fl_vf p = fl_vexp_reduced(fl_select(below, lo, x), &ni);
    return fl_select(below, fl_set1(0.0f), p * (fl_vf)((ni + 127) << 23));
}

/* exp(x) of one float with the same polynomial (vector tails). */
FL_INLINE float fl_exp1(float x) {
    fl_vf v = fl_set1(x);
    return fl_vexp(v)[0];
}
#endif
