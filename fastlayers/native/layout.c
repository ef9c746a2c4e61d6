/* Layout kernels (layout.h). Included by kernels.inc once per ISA. */

#include "fl.h"
#include "layout.h"
#include "layout_internal.h"
#include "threadpool.h"

/* Tiles of at most LAYOUT_TILE floats (64 KiB, at most LAYOUT_TILE_C of each source row),
 * moved in blocks of FL_VW x FL_VW floats transposed in registers, a tile's ragged edge in
 * partial blocks (masked loads and stores). */
#define LAYOUT_TILE 16384
#define LAYOUT_TILE_C 128
/* Floats a thread's share moves at least (below it the pool's hand-off costs more). */
#define LAYOUT_MIN_SHARE (1 << 15)

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
        /* source rows a multiple of 1 KiB apart (256, 512, 1024 channels; planes of 16 x 16,
         * 32 x 32, 80 x 80): a block's FL_VW rows share few L1 sets, and blocks along the rows
         * (each row's lines in order) moved them in 0.65-0.87 (avx512) and 0.3-0.5 (avx2) of
         * the time that blocks down the columns did; other strides lost that way
         * (docs/design.md) */
        if ((sr * 4) % 1024 == 0) {
            if (r0 < ra)
                for (int64_t j = c0; j < c1; j += FL_VW)
                    layout_edge(s + r0 * sr + j, sr, d + j * dr + r0, dr, ra - r0, FL_MIN(FL_VW, c1 - j));
            int64_t i = ra;
            for (; i < rv; i += FL_VW)
                for (int64_t j = c0; j < c1; j += FL_VW) {
                    int64_t nc = FL_MIN(FL_VW, c1 - j);
                    if (nc == FL_VW) layout_block(s + i * sr + j, sr, d + j * dr + i, dr);
                    else layout_edge(s + i * sr + j, sr, d + j * dr + i, dr, FL_VW, nc);
                }
            if (i < r1)
                for (int64_t j = c0; j < c1; j += FL_VW)
                    layout_edge(s + i * sr + j, sr, d + j * dr + i, dr, r1 - i, FL_MIN(FL_VW, c1 - j));
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
