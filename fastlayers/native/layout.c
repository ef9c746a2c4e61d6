/* Layout kernels (layout.h). Included by kernels.inc once per ISA. */

#include "fl.h"
#include "layout.h"
#include "threadpool.h"

/* Tiles of at most LAYOUT_TILE floats (64 KiB, at most LAYOUT_TILE_C of each source row),
 * moved in blocks of FL_VW x FL_VW floats transposed in registers, a tile's ragged edge in
 * partial blocks (masked loads and stores). */
#define LAYOUT_TILE 16384
#define LAYOUT_TILE_C 128
/* Floats a thread's share moves at least (below it the pool's hand-off costs more). */
#define LAYOUT_MIN_SHARE (1 << 15)

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
 * (24 channels: 16 in blocks, 8 left) took most of the time of an NHWC -> NCHW move. */
FL_INLINE void layout_edge(const float *s, int64_t sld, float *d, int64_t dld, int64_t nr,
                           int64_t nc) {
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

typedef struct {
    int64_t rows, cols, src_batch, src_row, dst_batch, dst_row, tile_r, tile_c, row_tiles, col_tiles;
    int64_t head; /* rows before the first whose destination lies on a whole vector's boundary */
    const float *src;
    float *dst;
} layout_transpose_ctx;

/* Tiles [t0, t1) of the (batch, row tile, column tile) grid: dst[b, j, i] = src[b, i, j]. Row
 * tile rt covers rows [rt tile_r - s, (rt + 1) tile_r - s) (s = FL_VW - head where head > 0):
 * blocks of FL_VW rows store whole aligned vectors of the destination, and only the first
 * tile's first rows and the last tile's last are partial blocks (a destination 16 bytes off
 * a line, as numpy allocates, split every store in two and took 1.4x the time). */
static void layout_transpose_task(void *p, int64_t t0, int64_t t1) {
    const layout_transpose_ctx *c = (const layout_transpose_ctx *)p;
    int64_t per_batch = c->row_tiles * c->col_tiles, sr = c->src_row, dr = c->dst_row;
    int64_t shift = c->head ? FL_VW - c->head : 0;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / per_batch, rt = (t % per_batch) / c->col_tiles, ct = t % c->col_tiles;
        int64_t r0 = FL_MAX(rt * c->tile_r - shift, 0), c0 = ct * c->tile_c;
        int64_t r1 = FL_MIN(c->rows, (rt + 1) * c->tile_r - shift), c1 = FL_MIN(c->cols, c0 + c->tile_c);
        const float *restrict s = c->src + b * c->src_batch;
        float *restrict d = c->dst + b * c->dst_batch;
        /* the rows before the first aligned block (the first tile's), as a partial block */
        int64_t ra = rt == 0 ? FL_MIN(c->head, r1) : r0;
        /* a block of FL_VW destination rows at a time, along the tile's rows: FL_VW stores
         * streams, not one per destination row (rows a multiple of 4 KiB apart share an L1 set:
         * 48 streams made an NHWC -> NCHW move of 48 channels 12x slower than one of 16). With
         * destination rows a multiple of 4 KiB apart, half a block of them at a time: FL_VW
         * lines in flight in one set outnumber its ways. Source rows that far apart are read a
         * whole block at a time still: half blocks made their partial stores the cost
         * (docs/design.md, "The numpy steps between convolutions"). */
        int64_t rv = ra + (r1 - ra) / FL_VW * FL_VW;
        if (FL_VW >= 16 && (dr * 4) % 4096 == 0) {
            for (int64_t j = c0; j < c1; j += FL_VW / 2) {
                int64_t nc = FL_MIN(FL_VW / 2, c1 - j), i = ra;
                if (r0 < ra) layout_edge(s + r0 * sr + j, sr, d + j * dr + r0, dr, ra - r0, nc);
                for (; i < rv; i += FL_VW) layout_half(s + i * sr + j, sr, d + j * dr + i, dr, nc);
                if (i < r1) layout_edge(s + i * sr + j, sr, d + j * dr + i, dr, r1 - i, nc);
            }
            continue;
        }
        for (int64_t j = c0; j < c1; j += FL_VW) {
            int64_t nc = FL_MIN(FL_VW, c1 - j), i = ra;
            if (r0 < ra) layout_edge(s + r0 * sr + j, sr, d + j * dr + r0, dr, ra - r0, nc);
            if (nc == FL_VW)
                for (; i < rv; i += FL_VW) layout_block(s + i * sr + j, sr, d + j * dr + i, dr);
            else
                for (; i < rv; i += FL_VW) layout_edge(s + i * sr + j, sr, d + j * dr + i, dr, FL_VW, nc);
            if (i < r1) layout_edge(s + i * sr + j, sr, d + j * dr + i, dr, r1 - i, nc);
        }
    }
}

int FL_FN(transpose)(int64_t batch, int64_t rows, int64_t cols, const float *src,
                     int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,
                     int64_t dst_row) {
    if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
    int64_t tile_c = FL_MIN(cols, LAYOUT_TILE_C), tile_r = FL_MIN(rows, LAYOUT_TILE / tile_c);
    /* where every destination row (of every batch) starts at the same offset within a vector,
     * the rows before the first one on a vector's boundary (tile_r a multiple of FL_VW then) */
    int64_t head = 0, align = FL_VW * (int64_t)sizeof(float), mis = (int64_t)((uintptr_t)dst % (uintptr_t)align);
    if (mis && mis % (int64_t)sizeof(float) == 0 && (dst_row * 4) % align == 0 && (dst_batch * 4) % align == 0 &&
        tile_r % FL_VW == 0 && rows > FL_VW)
        head = (align - mis) / (int64_t)sizeof(float);
    int64_t shift = head ? FL_VW - head : 0;
    int64_t row_tiles = (rows + shift + tile_r - 1) / tile_r, col_tiles = (cols + tile_c - 1) / tile_c;
    layout_transpose_ctx c = {rows, cols, src_batch, src_row, dst_batch, dst_row, tile_r, tile_c,
                              row_tiles, col_tiles, head, src, dst};
    int64_t tile_floats = tile_r * tile_c;
    fl_parallel(batch * row_tiles * col_tiles, FL_MAX(1, LAYOUT_MIN_SHARE / tile_floats),
                layout_transpose_task, &c);
    return 0;
}

/* ------------------------------------------------------------------------- concatenation */

typedef struct {
    int64_t parts, dst_row;
    const char *const *src;
    const int64_t *width;
    char *dst;
} layout_concat_ctx;

/* d[0:n] = s[0:n] (bytes): whole vectors, then the rest byte by byte. */
FL_INLINE void layout_copy_bytes(char *restrict d, const char *restrict s, int64_t n) {
    int64_t j = 0;
    for (; j + 2 * FL_VW * 4 <= n; j += 2 * FL_VW * 4) {
        fl_vf a = fl_load((const float *)(s + j)), b = fl_load((const float *)(s + j + FL_VW * 4));
        fl_store((float *)(d + j), a);
        fl_store((float *)(d + j + FL_VW * 4), b);
    }
    for (; j + FL_VW * 4 <= n; j += FL_VW * 4)
        fl_store((float *)(d + j), fl_load((const float *)(s + j)));
    for (; j < n; ++j) d[j] = s[j];
}

/* Rows [r0, r1): dst[r] = part 0's row r, part 1's row r, ... */
static void layout_concat_task(void *p, int64_t r0, int64_t r1) {
    const layout_concat_ctx *c = (const layout_concat_ctx *)p;
    for (int64_t r = r0; r < r1; ++r) {
        char *d = c->dst + r * c->dst_row;
        for (int64_t k = 0; k < c->parts; ++k) {
            layout_copy_bytes(d, c->src[k] + r * c->width[k], c->width[k]);
            d += c->width[k];
        }
    }
}

int FL_FN(concat_rows)(int64_t rows, int64_t parts, const char *const *src, const int64_t *width,
                       char *dst, int64_t dst_row) {
    if (rows <= 0 || parts <= 0) return 0;
    int64_t total = 0;
    for (int64_t k = 0; k < parts; ++k) {
        if (width[k] < 0) return -2;
        total += width[k];
    }
    if (total > dst_row) return -2;
    layout_concat_ctx c = {parts, dst_row, src, width, dst};
    fl_parallel(rows, FL_MAX(1, LAYOUT_MIN_SHARE * 4 / FL_MAX(total, 1)), layout_concat_task, &c);
    return 0;
}
