/* Layout kernels (layout.h). Included by kernels.inc once per ISA. */

/* A tile of source rows (LAYOUT_TILE floats, 16 KiB, at most LAYOUT_TILE_C of each row) is read
 * whole into L1, then written out transposed: narrow rows (NHWC -> NCHW, few channels) give
 * tiles of many rows, and so long runs of output. */
#define LAYOUT_TILE 4096
#define LAYOUT_TILE_C 128
/* Floats a thread's share moves at least (below it the pool's hand-off costs more). */
#define LAYOUT_MIN_SHARE (1 << 15)

typedef struct {
    int64_t rows, cols, src_batch, src_row, dst_batch, dst_row, tile_r, tile_c, row_tiles, col_tiles;
    const float *src;
    float *dst;
} layout_transpose_ctx;

/* Tiles [t0, t1) of the (batch, row tile, column tile) grid: dst[b, j, i] = src[b, i, j]. */
static void layout_transpose_task(void *p, int64_t t0, int64_t t1) {
    const layout_transpose_ctx *c = (const layout_transpose_ctx *)p;
    int64_t per_batch = c->row_tiles * c->col_tiles;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / per_batch, rt = (t % per_batch) / c->col_tiles, ct = t % c->col_tiles;
        int64_t r0 = rt * c->tile_r, c0 = ct * c->tile_c;
        int64_t r1 = FL_MIN(c->rows, r0 + c->tile_r), c1 = FL_MIN(c->cols, c0 + c->tile_c);
        const float *s = c->src + b * c->src_batch;
        float *d = c->dst + b * c->dst_batch;
        /* the tile's source rows are read whole into L1 first: read column by column, rows a
         * multiple of 4 KiB apart (an NCHW plane of 64 x 64 and up) all fall in one cache set */
        int64_t width = c1 - c0;
        if (c->src_row <= LAYOUT_TILE_C) {   /* the tile's rows lie together: read it in place */
            for (int64_t j = c0; j < c1; ++j) {
                float *restrict dj = d + j * c->dst_row;
                const float *restrict sj = s + j;
                for (int64_t i = r0; i < r1; ++i) dj[i] = sj[i * c->src_row];
            }
            continue;
        }
        float tile[LAYOUT_TILE];
        for (int64_t i = r0; i < r1; ++i)
            memcpy(tile + (i - r0) * width, s + i * c->src_row + c0, (size_t)width * sizeof(float));
        for (int64_t j = 0; j < width; ++j) {
            float *restrict dj = d + (c0 + j) * c->dst_row + r0;
            const float *restrict tj = tile + j;
            for (int64_t i = 0; i < r1 - r0; ++i) dj[i] = tj[i * width];
        }
    }
}

int FL_FN(transpose)(int64_t batch, int64_t rows, int64_t cols, const float *src,
                     int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,
                     int64_t dst_row) {
    if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
    int64_t tile_c = FL_MIN(cols, LAYOUT_TILE_C), tile_r = FL_MIN(rows, LAYOUT_TILE / tile_c);
    int64_t row_tiles = (rows + tile_r - 1) / tile_r, col_tiles = (cols + tile_c - 1) / tile_c;
    layout_transpose_ctx c = {rows, cols, src_batch, src_row, dst_batch, dst_row, tile_r, tile_c,
                              row_tiles, col_tiles, src, dst};
    int64_t tile_floats = tile_r * tile_c;
    fl_parallel(batch * row_tiles * col_tiles, FL_MAX(1, LAYOUT_MIN_SHARE / tile_floats),
                layout_transpose_task, &c);
    return 0;
}
