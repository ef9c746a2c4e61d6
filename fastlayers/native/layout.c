/* Layout kernels (layout.h). Included by kernels.inc once per ISA. */

/* Tile edge: a TILE x TILE block of floats read by rows and written by columns stays in L1. */
#define LAYOUT_TILE 32
/* Floats a thread's share moves at least (below it the pool's hand-off costs more). */
#define LAYOUT_MIN_SHARE (1 << 15)

typedef struct {
    int64_t rows, cols, src_batch, src_row, dst_batch, dst_row, row_tiles, col_tiles;
    const float *src;
    float *dst;
} layout_transpose_ctx;

/* Tiles [t0, t1) of the (batch, row tile, column tile) grid: dst tile = src tile transposed. */
static void layout_transpose_task(void *p, int64_t t0, int64_t t1) {
    const layout_transpose_ctx *c = (const layout_transpose_ctx *)p;
    int64_t per_batch = c->row_tiles * c->col_tiles;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / per_batch, rt = (t % per_batch) / c->col_tiles, ct = t % c->col_tiles;
        int64_t r0 = rt * LAYOUT_TILE, c0 = ct * LAYOUT_TILE;
        int64_t r1 = FL_MIN(c->rows, r0 + LAYOUT_TILE), c1 = FL_MIN(c->cols, c0 + LAYOUT_TILE);
        const float *s = c->src + b * c->src_batch;
        float *d = c->dst + b * c->dst_batch;
        for (int64_t j = c0; j < c1; ++j) {
            float *restrict dj = d + j * c->dst_row;
            const float *restrict sj = s + j;
            for (int64_t i = r0; i < r1; ++i) dj[i] = sj[i * c->src_row];
        }
    }
}

int FL_FN(transpose)(int64_t batch, int64_t rows, int64_t cols, const float *src,
                     int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,
                     int64_t dst_row) {
    if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
    int64_t row_tiles = (rows + LAYOUT_TILE - 1) / LAYOUT_TILE;
    int64_t col_tiles = (cols + LAYOUT_TILE - 1) / LAYOUT_TILE;
    layout_transpose_ctx c = {rows, cols, src_batch, src_row, dst_batch, dst_row,
                              row_tiles, col_tiles, src, dst};
    int64_t tile_floats = FL_MIN(rows, LAYOUT_TILE) * FL_MIN(cols, LAYOUT_TILE);
    fl_parallel(batch * row_tiles * col_tiles, FL_MAX(1, LAYOUT_MIN_SHARE / tile_floats),
                layout_transpose_task, &c);
    return 0;
}
