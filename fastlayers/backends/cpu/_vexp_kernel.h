/* A float32 exp in AVX-512 for the C kernels (the attention pair's softmax,
 * _attention_kernel.h):
 *
 * exp(x) = 2^n e^r, n = round(x log2 e), r = x - n ln 2 in two parts (Cody-Waite), e^r from the
 * Cephes expf polynomial, 2^n applied by vscalefps; within 2e-7 relative of float64. Without
 * AVX-512F support in the compiler FL_VEXP is 0 and the kernels that need it are not built.
 */
#ifndef FL_VEXP_KERNEL_H
#define FL_VEXP_KERNEL_H

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define FL_VEXP 1
#define FL_VEXP_TARGET __attribute__((target("avx512f,fma")))
#define FL_VINLINE FL_VEXP_TARGET static inline __attribute__((always_inline))

/* exp(x), x clamped to [-87.34, 88.38] (results stay normal and finite). */
FL_VINLINE __m512 fl_vexp(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)),
                      _mm512_set1_ps(-87.3365478515625f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

#else
#define FL_VEXP 0
#endif
#endif
