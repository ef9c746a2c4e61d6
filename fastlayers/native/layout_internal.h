/* What layout.c shares with the other kernel files of its ISA (the convolutions that write
 * NCHW planes, the depthwise convolutions and pools of small planes in blocks of channels):
 * the register transposes of FL_VW x FL_VW blocks and of their ragged edges, a whole (rows,
 * cols) transpose out of a cache-resident buffer built on them, and the channel blocks'
 * bordered buffer. */
#ifndef FL_LAYOUT_INTERNAL_H
#define FL_LAYOUT_INTERNAL_H
#include "fl.h"

/* Stage S of the register transpose: rows i and i + S (i & S == 0) trade the lanes j whose bit S
 * differs from the row's, so that after the stages for every bit, lane j of row i holds what was
 * lane i of row j. LO / HI: the two-source permutes giving the new rows i and i + S. */
#if FL_VW == 16
#define LAYOUT_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define LAYOUT_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define LAYOUT_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define LAYOUT_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define LAYOUT_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define LAYOUT_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define LAYOUT_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define LAYOUT_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LAYOUT_STAGES(r) \
    LAYOUT_STAGE(r, 1, LAYOUT_LO1, LAYOUT_HI1); \
    LAYOUT_STAGE(r, 2, LAYOUT_LO2, LAYOUT_HI2); \
    LAYOUT_STAGE(r, 4, LAYOUT_LO4, LAYOUT_HI4); \
    LAYOUT_STAGE(r, 8, LAYOUT_LO8, LAYOUT_HI8);
#elif FL_VW == 8
#define LAYOUT_LO1 0, 8, 2, 10, 4, 12, 6, 14
#define LAYOUT_HI1 1, 9, 3, 11, 5, 13, 7, 15
#define LAYOUT_LO2 0, 1, 8, 9, 4, 5, 12, 13
#define LAYOUT_HI2 2, 3, 10, 11, 6, 7, 14, 15
#define LAYOUT_LO4 0, 1, 2, 3, 8, 9, 10, 11
#define LAYOUT_HI4 4, 5, 6, 7, 12, 13, 14, 15
#define LAYOUT_STAGES(r) \
    LAYOUT_STAGE(r, 1, LAYOUT_LO1, LAYOUT_HI1); \
    LAYOUT_STAGE(r, 2, LAYOUT_LO2, LAYOUT_HI2); \
    LAYOUT_STAGE(r, 4, LAYOUT_LO4, LAYOUT_HI4);
#else
#define LAYOUT_LO1 0, 4, 2, 6
#define LAYOUT_HI1 1, 5, 3, 7
#define LAYOUT_LO2 0, 1, 4, 5
#define LAYOUT_HI2 2, 3, 6, 7
#define LAYOUT_STAGES(r) \
    LAYOUT_STAGE(r, 1, LAYOUT_LO1, LAYOUT_HI1); \
    LAYOUT_STAGE(r, 2, LAYOUT_LO2, LAYOUT_HI2);
#endif
#define LAYOUT_STAGE(r, S, LO, HI)                                                            \
    for (int i = 0; i < FL_VW; ++i)                                                          \
        if (!(i & (S))) {                                                                    \
            fl_vf a = r[i], b = r[i + (S)];                                                  \
            r[i] = FL_SHUF(a, b, LO);                                                        \
            r[i + (S)] = FL_SHUF(a, b, HI);                                                  \
        }

#if FL_VW == 16 && defined(__AVX512F__)
/* In-lane shuffles of a 4 x 4 transpose in each 128-bit lane: unpcklps / unpckhps interleave the
 * low / high pairs of floats of two vectors, unpcklpd / unpckhpd their low / high pairs of
 * pairs. */
#define LAYOUT_UNPACK_LO 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29
#define LAYOUT_UNPACK_HI 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31

/* The vector whose 128-bit lane b holds p[b stride : b stride + 4], b < 4: four 4-float loads,
 * the last three inserted into the vector as part of their load. */
FL_INLINE fl_vf layout_lanes(const float *p, int64_t stride) {
    __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p));
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p + stride), 1);
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 2 * stride), 2);
    return (fl_vf)_mm512_insertf32x4(v, _mm_loadu_ps(p + 3 * stride), 3);
}

/* d[j dld + i] = s[i sld + j] for i < 16, j < 4 groups, four destination rows at a time:
 * vector r of group a holds in lane b source row 4b + r's floats 4a .. 4a + 3, and the 4 x 4
 * transposes in each lane (8 in-lane shuffles) turn the group's four vectors into destination
 * rows 4a .. 4a + 3. A whole block takes 32 in-lane shuffles where the permute stages
 * (LAYOUT_STAGES) take 64 two-source ones, and moves in three quarters of the time on Zen 4
 * (docs/design.md, "The numpy steps between convolutions"). */
FL_INLINE void layout_groups(const float *s, int64_t sld, float *d, int64_t dld, int groups) {
    for (int a = 0; a < groups; ++a) {
        fl_vf t[4];
        for (int r = 0; r < 4; ++r) t[r] = layout_lanes(s + r * sld + 4 * a, 4 * sld);
        fl_vf u0 = FL_SHUF(t[0], t[1], LAYOUT_UNPACK_LO), u1 = FL_SHUF(t[0], t[1], LAYOUT_UNPACK_HI);
        fl_vf u2 = FL_SHUF(t[2], t[3], LAYOUT_UNPACK_LO), u3 = FL_SHUF(t[2], t[3], LAYOUT_UNPACK_HI);
        fl_store(d + (4 * a) * dld, FL_SHUF(u0, u2, LAYOUT_LO2));
        fl_store(d + (4 * a + 1) * dld, FL_SHUF(u0, u2, LAYOUT_HI2));
        fl_store(d + (4 * a + 2) * dld, FL_SHUF(u1, u3, LAYOUT_LO2));
        fl_store(d + (4 * a + 3) * dld, FL_SHUF(u1, u3, LAYOUT_HI2));
    }
}

/* d[j dld + i] = s[i sld + j] for i, j < 16. */
FL_INLINE void layout_block(const float *s, int64_t sld, float *d, int64_t dld) {
    layout_groups(s, sld, d, dld, 4);
}
#else
/* d[j dld + i] = s[i sld + j] for i, j < FL_VW: FL_VW loads, log2(FL_VW) stages of FL_VW
 * permutes, FL_VW stores. */
FL_INLINE void layout_block(const float *s, int64_t sld, float *d, int64_t dld) {
    fl_vf r[FL_VW];
    for (int i = 0; i < FL_VW; ++i) r[i] = fl_load(s + i * sld);
    LAYOUT_STAGES(r)
    for (int i = 0; i < FL_VW; ++i) fl_store(d + i * dld, r[i]);
}
#endif

/* The same for i < nr, j < nc (a tile's ragged edge, nr, nc <= FL_VW): masked loads and
 * stores around the same permutes. Float by float, the edge of a transpose whose rows are few
 * (24 channels: 16 in blocks, 8 left) took most of the time of an NHWC -> NCHW move; an edge of
 * at most 2 FL_VW floats (a row or column or two) goes float by float. */
FL_INLINE void layout_edge(const float *s, int64_t sld, float *d, int64_t dld, int64_t nr,
                           int64_t nc) {
    if (nr * nc <= 2 * FL_VW) { /* a thin edge (a row or two): fewer moves than the permutes */
        for (int64_t i = 0; i < nr; ++i)
            for (int64_t j = 0; j < nc; ++j) d[j * dld + i] = s[i * sld + j];
        return;
    }
    fl_vf r[FL_VW];
    for (int i = 0; i < FL_VW; ++i)
        r[i] = i < nr ? (nc == FL_VW ? fl_load(s + i * sld) : fl_load_n(s + i * sld, nc))
                      : fl_set1(0.0f);
    LAYOUT_STAGES(r)
    for (int j = 0; j < nc; ++j) {
        if (nr == FL_VW) fl_store(d + j * dld, r[j]);
        else fl_store_n(d + j * dld, r[j], nr);
    }
}

/* d[j dld + i] = s[i sld + j] for i < FL_VW, j < nc <= FL_VW / 2: half a block. */
FL_INLINE void layout_half(const float *s, int64_t sld, float *d, int64_t dld, int64_t nc) {
#if FL_VW == 16 && defined(__AVX512F__)
    if (nc == FL_VW / 2) {
        layout_groups(s, sld, d, dld, 2);
        return;
    }
#endif
    layout_edge(s, sld, d, dld, FL_VW, nc);
}

/* d[j dld + i] = s[i sld + j] for i < rows, j < cols, one thread: FL_VW x FL_VW blocks, the
 * ragged edges in partial blocks (for a source in cache: no tiling, no care for the
 * destination rows' alignment or L1 sets, as transpose's tiles take). */
FL_INLINE void layout_small(const float *s, int64_t sld, float *d, int64_t dld, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i += FL_VW) {
        int64_t nr = FL_MIN(FL_VW, rows - i);
        for (int64_t j = 0; j < cols; j += FL_VW) {
            int64_t nc = FL_MIN(FL_VW, cols - j);
            if (nr == FL_VW && nc == FL_VW) layout_block(s + i * sld + j, sld, d + j * dld + i, dld);
            else layout_edge(s + i * sld + j, sld, d + j * dld + i, dld, nr, nc);
        }
    }
}

/* A block of nc <= FL_VW NCHW planes of h x w (plane floats apart from x) as pixels of FL_VW
 * channels in a buffer with borders, rows wp pixels apart: xb[(ih wp + iw) FL_VW + k] = x[k
 * plane + ih w + iw] (xb: x's first pixel in the buffer), through tmp (h w FL_VW floats): the
 * block transposed whole, then its rows copied (a row of 7 or 14 pixels transposed alone was a
 * ragged block each; memcpy's call cost more than the copy). Lanes past nc: what tmp held. */
FL_INLINE void layout_planes_in(const float *x, int64_t plane, int64_t nc, int64_t h, int64_t w, float *tmp,
                                float *xb, int64_t wp) {
    layout_small(x, plane, tmp, FL_VW, nc, h * w);
    for (int64_t ih = 0; ih < h; ++ih) {
        float *d = xb + ih * wp * FL_VW;
        const float *s = tmp + ih * w * FL_VW;
        for (int64_t k = 0; k < w * FL_VW; k += FL_VW) fl_store(d + k, fl_load(s + k));
    }
}

/* The borders of a buffer of hp x wp pixels of FL_VW floats around an image of h x w whose first
 * pixel is at row pt, column pl: every float outside the image set to fill. */
FL_INLINE void layout_borders(float *xb, int64_t hp, int64_t wp, int64_t pt, int64_t pl, int64_t h, int64_t w,
                              float fill) {
    fl_vf v = fl_set1(fill);
    for (int64_t r = 0; r < hp; ++r) {
        float *row = xb + r * wp * FL_VW;
        int inside = r >= pt && r < pt + h;
        for (int64_t q = 0; q < wp; ++q)
            if (!inside || q < pl || q >= pl + w) fl_store(row + q * FL_VW, v);
    }
}

#endif
