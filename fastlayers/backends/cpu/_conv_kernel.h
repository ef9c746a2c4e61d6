/* Implicit-GEMM convolution on weights packed by fl_pack_all (fastlayers' own sgemm's layout),
 * NHWC, one group, no dilation along the width.
 *
 * Output row (n, oh), output column ow and the window row i read kw * C consecutive floats of
 * the zero-padded input: xp[n, oh sh + i dh, ow sw:ow sw + kw, :]. So 14 consecutive output
 * columns are 14 rows of A, sw * C floats apart, and the register tile of the sgemm runs over
 * them in place, window row by window row: no im2col matrix is written (it cost a third of the
 * ResNet stem's time, 1.1 of 3.3 ms) and nothing is packed per call.
 */
#ifndef FL_CONV_KERNEL_H
#define FL_CONV_KERNEL_H
#include "_sgemm_kernel.h"

#if FL_HAVE_KERNEL
FL_TARGET static void fl_conv_tile14(const float *a, int64_t ars, int64_t ari, int64_t kh,
                                     int64_t kwc, const float *pb, float *c, int64_t ldc, int mr,
                                     int nr) {
    fl_tile(14, kh, ari, kwc, a, ars, 1, pb, c, ldc, mr, nr, 0);
}

FL_TARGET static void fl_conv_tile8(const float *a, int64_t ars, int64_t ari, int64_t kh,
                                    int64_t kwc, const float *pb, float *c, int64_t ldc, int mr,
                                    int nr) {
    fl_tile(8, kh, ari, kwc, a, ars, 1, pb, c, ldc, mr, nr, 0);
}

FL_TARGET static void fl_conv_tile4(const float *a, int64_t ars, int64_t ari, int64_t kh,
                                    int64_t kwc, const float *pb, float *c, int64_t ldc, int mr,
                                    int nr) {
    fl_tile(4, kh, ari, kwc, a, ars, 1, pb, c, ldc, mr, nr, 0);
}
#endif

/* y[t Wo + ow, j0:j1] = sum_{i, q} xp[n, oh sh + i dh, ow sw C + q] w[i kw C + q, j0:j1] for the
 * output rows t = n Ho + oh in [t0, t1), ow < Wo, q < kw C. xp: the padded input (N, Hp, Wp, C),
 * C-contiguous, with at least 14 sw C readable floats past its end (tiles of 14 output columns
 * read past the last one; those results are not stored). pb: w (kh kw C, cout) packed by
 * fl_pack_all; j0 a multiple of FL_NR; y: rows of ldy floats. */
static void fl_conv_packed(const float *xp, int64_t hp, int64_t wp, int64_t c, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t ho, int64_t wo,
                           const float *pb, int64_t j0, int64_t j1, float *y, int64_t ldy,
                           int64_t t0, int64_t t1) {
    int64_t kwc = kw * c, k = kh * kwc, ars = sw * c, ari = dh * wp * c;
#if FL_HAVE_KERNEL
    /* Column panel by panel: the panel's k x 32 weights stay in L2 while every output row of
     * the call reads them (1.0-1.02x faster than all panels per output row). */
    for (int64_t jr = j0; jr < j1; jr += FL_NR) {
        int nr = (int)(j1 - jr < FL_NR ? j1 - jr : FL_NR);
        const float *b = pb + jr * k;
        for (int64_t t = t0; t < t1; ++t) {
            const float *a = xp + (((t / ho) * hp + (t % ho) * sh) * wp) * c;
            float *yt = y + t * wo * ldy + jr;
            for (int64_t ow = 0; ow < wo; ow += FL_MR) {
                int mr = (int)(wo - ow < FL_MR ? wo - ow : FL_MR);
                const float *ar = a + ow * ars;
                if (mr > 8) fl_conv_tile14(ar, ars, ari, kh, kwc, b, yt + ow * ldy, ldy, mr, nr);
                else if (mr > 4) fl_conv_tile8(ar, ars, ari, kh, kwc, b, yt + ow * ldy, ldy, mr, nr);
                else fl_conv_tile4(ar, ars, ari, kh, kwc, b, yt + ow * ldy, ldy, mr, nr);
            }
        }
    }
#else
    for (int64_t t = t0; t < t1; ++t) {
        const float *a = xp + (((t / ho) * hp + (t % ho) * sh) * wp) * c;
        float *yt = y + t * wo * ldy;
        for (int64_t ow = 0; ow < wo; ++ow) {
            float *row = yt + ow * ldy;
            for (int64_t j = j0; j < j1; ++j) row[j] = 0.0f;
            for (int64_t i = 0; i < kh; ++i) {
                for (int64_t q = 0; q < kwc; ++q) {
                    float v = a[ow * ars + i * ari + q];
                    int64_t p = i * kwc + q;
                    for (int64_t j = j0; j < j1; ++j)
                        row[j] += v * pb[(j / FL_NR) * k * FL_NR + p * FL_NR + j % FL_NR];
                }
            }
        }
    }
#endif
}
#endif
