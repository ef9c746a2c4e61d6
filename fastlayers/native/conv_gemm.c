/* conv2d (conv.h) on gemm.c's packed sgemm and its register tile, one of two ways:
 * - implicit GEMM: output row (n, oh), output column ow and window row i read kw C consecutive
 *   floats of the zero-padded input xp[n, oh sh + i dh, ow sw:ow sw + kw, :], so a tile's rows
 *   are consecutive output columns, sw C floats apart, read in place (x itself where the
 *   windows lie inside it, a per-thread copy of the window rows with their padding at the
 *   edges): no im2col matrix is written (a width dilation makes each tap a run of C floats:
 *   one pass per window row, accumulating). One group, output rows long enough to fill the
 *   tiles; shared by output rows and blocks of columns whose packed weights stay in L2, each
 *   tile's epilogue run as soon as its sums are final (or each output row's, for columns
 *   narrower than whole vectors);
 * - im2col + sgemm: grouped convolutions and short output rows. From CONV_ROW_SPLIT_MIN output
 *   rows, blocks of rows gathered into a per-thread (rows, kh kw C / groups) matrix, the packed
 *   sgemm group by group, then the block's epilogue; fewer rows share one matrix whose product
 *   gemm.c's matmul splits by output columns. A 1x1 stride-1 unpadded convolution is that
 *   product on x itself.
 * Compiled once per ISA (kernels.inc). */

#include "conv_internal.h"
#include "dispatch.h"
#include "gemm_internal.h"
#include "pool_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

/* im2col block: its rows x k floats (1 MiB) stay in L2 while the sgemm reads them. */
#define CONV_COLS_FLOATS (INT64_C(1) << 18)
/* A column block's packed weights (k x columns floats, 256 KiB) stay in L2 while the implicit
 * GEMM's output rows read them; weights that fit in three quarters of the core's L2 whole are
 * one block (fl_l2_bytes: the input is then read once, and a row's padded window copies made
 * once, not once per block; docs/design.md, "Implicit-GEMM convolution"). */
#define CONV_PANEL_FLOATS (INT64_C(1) << 16)
/* Fewest output rows for im2col by row tiles on per-thread blocks; fewer share one im2col
 * matrix whose product is split by output columns (each thread reads part of the weights). */
#define CONV_ROW_SPLIT_MIN 256
/* The implicit GEMM runs its tiles within an output row: it needs rows that fill at least this
 * share of the tiles (docs/design.md, "Figures behind the code's constants"). */
#define CONV_IMPLICIT_FILL 0.8
/* ... or window rows of at most this many floats (kw C): im2col's short copies cost more than
 * the empty tile rows (same section). */
#define CONV_IMPLICIT_RUN 64
/* Most floats of a padded input the implicit GEMM copies whole before it runs (1 MiB: the
 * copy stays in cache); a larger one is read in place and only the windows that leave it are
 * copied, per output row (docs/design.md, "Implicit-GEMM convolution"). */
#define CONV_PAD_COPY_FLOATS (INT64_C(1) << 18)
/* Fewest floats in a window row (kw C) for the dot method where it may run (conv_dot.c):
 * shorter runs leave most of its lanes empty in turn (docs/design.md, "Convolutions into a
 * few channels"). */
#define CONV_DOT_MIN_RUN (FL_VW / 2)
/* ... and for more than CONV_DOT_NARROW_COUT output channels (AVX-512's 5 and 6), runs of at
 * least CONV_DOT_WIDE_RUN floats: the implicit GEMM's vectors are fuller there, and shorter
 * runs leave each output's reduction across lanes a larger share (same section). */
#define CONV_DOT_NARROW_COUT 4
#define CONV_DOT_WIDE_RUN 64

/* ------------------------------------------------------------------------------ conv2d */

typedef struct {
    const float *x;      /* the input (n, h, w, c) */
    const float *pw, *bias;
    float *y;
    int64_t h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout;
    int64_t k;           /* rows of a group's weights: kh kw c / groups */
    int64_t rows;        /* output rows n Ho Wo */
    int64_t row_units;   /* implicit GEMM: output rows (n, oh), the units of a column block */
    int64_t block_cols;  /* implicit GEMM: columns of a block (a multiple of FL_PANEL) */
    int64_t chunk;       /* im2col: rows per block (a multiple of GEMM_MR) */
    int64_t group;       /* few rows: the group whose im2col matrix `cols` holds */
    float *cols;
    int code, status;
    float alpha;
    const float *res;    /* the residual (n, Ho, Wo, cout), or NULL */
    int res_code;
    float res_alpha;
} conv_ctx;

/* y[r, 0:n] = g(y[r, 0:n] + res[r, 0:n]) for r < rows, rows ld floats apart in both: the
 * residual Add and its activation on a block of output rows just written, while it is in
 * cache. */
static void conv_residual_rows(int64_t rows, int64_t n, float *y, const float *res, int64_t ld,
                               int code, float alpha) {
    if (n == ld) {
        FL_FN(rows_add_act_row)(y, res, y, rows * n, code, alpha);
        return;
    }
    for (int64_t r = 0; r < rows; ++r)
        FL_FN(rows_add_act_row)(y + r * ld, res + r * ld, y + r * ld, n, code, alpha);
}

/* Output columns [s0, s1) of output row yt (columns j0:j1 of the block), their windows read at
 * a (the window of column s0: row i at a + i ari, column ow at a + (ow - s0) ars): the tiles,
 * each with its epilogue where `epi`, bringing pf's lines into L2 meanwhile (shared among the
 * tiles; without a width dilation). */
static void conv_implicit_span(const conv_ctx *p, const float *a, int64_t ars, int64_t ari,
                               float *yt, int64_t s0, int64_t s1, int64_t j0, int64_t j1,
                               int epi, gemm_prefetch pf) {
    int64_t c = p->c, k = p->k, cout = p->cout;
    int64_t mr = j1 - j0 <= FL_VW ? GEMM_NARROW_MR : GEMM_MR, q = 0;
    int64_t tiles = (s1 - s0 + mr - 1) / mr * ((j1 - j0 + GEMM_TN - 1) / GEMM_TN);
    for (int64_t ow = s0, rows; ow < s1; ow += rows) {
        rows = gemm_next_rows_over(s1 - ow, j1 - j0);
        const float *ar = a + (ow - s0) * ars;
        float *yr = yt + ow * cout;
        for (int64_t j = j0; j < j1; j += GEMM_TN, ++q) {
            int nr = (int)FL_MIN(j1 - j, GEMM_TN);
            const float *pb = p->pw + (j / FL_PANEL) * FL_PANEL * k + j % FL_PANEL;
            gemm_epi at = {p->bias ? p->bias + j : 0, p->code, p->alpha};
            if (p->dw == 1) {
                gemm_prefetch share = GEMM_NO_PREFETCH;
                if (pf.lines > 0) {  /* tile q's share of pf */
                    int64_t l0 = pf.lines * q / tiles;
                    share = (gemm_prefetch){pf.line + l0 * 64, pf.lines * (q + 1) / tiles - l0};
                }
                FL_FN(gemm_tile_rows)((int)rows, p->kh, ari, p->kw * c, ar, ars, pb, yr + j, cout,
                                      nr, 0, share, epi ? &at : 0);
            } else {
                for (int64_t i = 0; i < p->kh; ++i)
                    FL_FN(gemm_tile_rows)((int)rows, p->kw, p->dw * c, c, ar + i * ari, ars,
                                          pb + i * p->kw * c * FL_PANEL, yr + j, cout, nr, i > 0,
                                          GEMM_NO_PREFETCH, epi && i + 1 == p->kh ? &at : 0);
            }
        }
    }
}

/* buf (kh, width, c) = the window rows of output row (n, oh) over input columns
 * s0 sw - pl .. s0 sw - pl + width - 1, zeros outside x: the padding of the columns [s0, s1)
 * whose windows leave x. Returns width. */
static int64_t conv_padded_rows(const conv_ctx *p, int64_t n, int64_t oh, int64_t s0, int64_t s1,
                                float *buf) {
    int64_t c = p->c, width = (s1 - 1 - s0) * p->sw + (p->kw - 1) * p->dw + 1;
    int64_t iw0 = s0 * p->sw - p->pl, lo = FL_MAX(0, -iw0), hi = FL_MIN(width, p->w - iw0);
    for (int64_t i = 0; i < p->kh; ++i) {
        int64_t ih = oh * p->sh - p->pt + i * p->dh;
        float *row = buf + i * width * c;
        if (ih < 0 || ih >= p->h || hi <= lo) {
            memset(row, 0, (size_t)(width * c) * sizeof(float));
            continue;
        }
        memset(row, 0, (size_t)(lo * c) * sizeof(float));
        memcpy(row + lo * c, p->x + ((n * p->h + ih) * p->w + iw0 + lo) * c,
               (size_t)((hi - lo) * c) * sizeof(float));
        memset(row + hi * c, 0, (size_t)((width - hi) * c) * sizeof(float));
    }
    return width;
}

/* Units u = cb row_units + t: output row t = n Ho + oh, columns of block cb (implicit GEMM).
 * The input is read in place where a window lies inside it (the output columns [lo, hi) of a
 * row whose window rows all do); the rest (a few columns at each end, the rows along the
 * top and bottom edges) reads a per-thread copy of its window rows with the zero padding. */
static void conv_implicit_task(void *arg, int64_t u0, int64_t u1) {
    conv_ctx *p = (conv_ctx *)arg;
    int64_t c = p->c, cout = p->cout, wo = p->wo, w = p->w;
    int64_t ars = p->sw * c;
    int epilogue = p->bias || p->code != FL_LINEAR;
    /* an input larger than L2: each output row brings the next one's new input rows into L2 */
    int prefetch_rows = p->dw == 1 && p->h * w * c * (int64_t)sizeof(float) > fl_l2_bytes();
    /* output columns whose windows lie inside x's columns */
    int64_t lo = FL_MIN((p->pl + p->sw - 1) / p->sw, wo);
    int64_t last = w - 1 - (p->kw - 1) * p->dw + p->pl;  /* ow sw <= last */
    int64_t hi = FL_MAX(lo, FL_MIN(wo, last < 0 ? 0 : last / p->sw + 1));
    float *buf = 0;
    int bottom = (p->ho - 1) * p->sh + (p->kh - 1) * p->dh >= p->h + p->pt;  /* rows below x */
    if (p->pt || lo > 0 || hi < wo || bottom) {                  /* windows that leave x */
        int64_t width = (wo - 1) * p->sw + (p->kw - 1) * p->dw + 1;
        buf = fl_buf_floats(&FL_FN(conv_task_buf), (size_t)(p->kh * width * c));
        if (!buf) {
            p->status = -1;
            return;
        }
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t cb = u / p->row_units, t = u % p->row_units;
        int64_t j0 = cb * p->block_cols, j1 = FL_MIN(cout, j0 + p->block_cols);
        /* on each tile while it is in L1 where its rows are whole vectors, else per output row
         * (whose flat path runs narrow rows as one array) */
        int epi = epilogue && (j1 - j0) % FL_VW == 0;
        int64_t n = t / p->ho, oh = t % p->ho;
        int64_t ih0 = oh * p->sh - p->pt, ih1 = ih0 + (p->kh - 1) * p->dh;
        float *yt = p->y + t * wo * cout;
        /* output row t's share of the next column block's packed weights, into L2: its first
         * output rows then read them from L2, not from L3 or memory */
        gemm_prefetch pf = GEMM_NO_PREFETCH;
        if (j1 < cout) {
            int64_t nj1 = FL_MIN(cout, j1 + p->block_cols);
            int64_t lines = ((nj1 + FL_PANEL - 1) / FL_PANEL - j1 / FL_PANEL) * FL_PANEL * p->k * 4 / 64;
            int64_t l0 = lines * t / p->row_units;
            pf = (gemm_prefetch){(const char *)(p->pw + j1 * p->k) + l0 * 64, lines * (t + 1) / p->row_units - l0};
        } else if (prefetch_rows && oh + 1 < p->ho) {
            /* else the input rows the next output row reads and this one does not (below its
             * last window row), into L2: an input larger than L2 comes from L3 or memory,
             * which the tiles' reads in place (rows sw C floats apart) wait on */
            int64_t r0 = FL_MAX(ih1 + 1, 0), r1 = FL_MIN(ih1 + p->sh, p->h - 1);
            if (r1 >= r0) {
                const char *first = (const char *)(p->x + (n * p->h + r0) * w * c);
                pf = (gemm_prefetch){first, ((r1 - r0 + 1) * w * c * 4 + 63) / 64 + 1};
            }
        }
        /* the spans at the ends a whole tile each where they are copied (a tile of one row
         * costs about what a full one does) */
        int64_t mr = j1 - j0 <= FL_VW ? GEMM_NARROW_MR : GEMM_MR;
        int64_t left = lo > 0 ? FL_MIN(wo, FL_MAX(lo, mr)) : 0;
        int64_t right = hi < wo ? FL_MAX(left, FL_MIN(hi, wo - mr)) : wo;
        if (ih0 >= 0 && ih1 < p->h && right > left) {
            const float *a = p->x + ((n * p->h + ih0) * w + left * p->sw - p->pl) * c;
            conv_implicit_span(p, a, ars, p->dh * w * c, yt, left, right, j0, j1, epi, pf);
            if (left > 0) {
                int64_t width = conv_padded_rows(p, n, oh, 0, left, buf);
                conv_implicit_span(p, buf, ars, width * c, yt, 0, left, j0, j1, epi, GEMM_NO_PREFETCH);
            }
            if (right < wo) {
                int64_t width = conv_padded_rows(p, n, oh, right, wo, buf);
                conv_implicit_span(p, buf, ars, width * c, yt, right, wo, j0, j1, epi, GEMM_NO_PREFETCH);
            }
        } else {
            int64_t width = conv_padded_rows(p, n, oh, 0, wo, buf);
            conv_implicit_span(p, buf, ars, width * c, yt, 0, wo, j0, j1, epi, pf);
        }
        if (epilogue && !epi)
            FL_FN(rows_bias_act_range)(0, wo, j1 - j0, yt + j0, cout,
                                       p->bias ? p->bias + j0 : 0, p->code, p->alpha, yt + j0,
                                       cout);
        if (p->res)
            conv_residual_rows(wo, j1 - j0, yt + j0, p->res + t * wo * cout + j0, cout,
                               p->res_code, p->res_alpha);
    }
}

/* cols (m, k) = the windows of output rows r0 + [0, m) (r = (n Ho + oh) Wo + ow) over the
 * channels of group g; zeros outside x. */
static void conv_im2col(const conv_ctx *p, int64_t r0, int64_t m, int64_t g, float *cols) {
    int64_t c = p->c, cg = c / p->groups, k = p->k, kw = p->kw;
    for (int64_t r = 0; r < m; ++r) {
        int64_t gr = r0 + r, ow = gr % p->wo, t = gr / p->wo, oh = t % p->ho, n = t / p->ho;
        int64_t iw0 = ow * p->sw - p->pl;
        float *dst = cols + r * k;
        for (int64_t i = 0; i < p->kh; ++i) {
            int64_t ih = oh * p->sh - p->pt + i * p->dh;
            float *d = dst + i * kw * cg;
            if (ih < 0 || ih >= p->h) {
                memset(d, 0, (size_t)(kw * cg) * sizeof(float));
                continue;
            }
            const float *xrow = p->x + (n * p->h + ih) * p->w * c + g * cg;
            if (p->dw == 1 && cg == c && iw0 >= 0 && iw0 + kw <= p->w) {
                memcpy(d, xrow + iw0 * c, (size_t)(kw * c) * sizeof(float));
                continue;
            }
            for (int64_t j = 0; j < kw; ++j) {
                int64_t iw = iw0 + j * p->dw;
                if (iw < 0 || iw >= p->w) memset(d + j * cg, 0, (size_t)cg * sizeof(float));
                else memcpy(d + j * cg, xrow + iw * c, (size_t)cg * sizeof(float));
            }
        }
    }
}

/* Row tiles [u0, u1) (GEMM_MR output rows each) of im2col + sgemm, in blocks of p->chunk rows
 * gathered into this thread's buffer, each block's epilogue while it is in L2. */
static void conv_im2col_task(void *arg, int64_t u0, int64_t u1) {
    conv_ctx *p = (conv_ctx *)arg;
    int64_t k = p->k, cout = p->cout, co = cout / p->groups, pfg = fl_packed_floats(k, co);
    float *cols = fl_buf_floats(&FL_FN(conv_task_buf), (size_t)(p->chunk * k));
    if (!cols) {
        p->status = -1;
        return;
    }
    int64_t r_end = FL_MIN(u1 * GEMM_MR, p->rows);
    for (int64_t r0 = u0 * GEMM_MR; r0 < r_end; r0 += p->chunk) {
        int64_t m = FL_MIN(p->chunk, r_end - r0);
        float *yr = p->y + r0 * cout;
        for (int64_t g = 0; g < p->groups; ++g) {
            conv_im2col(p, r0, m, g, cols);
            int st = FL_FN(sgemm_packed)(m, co, k, cols, k, p->pw + g * pfg, 0, yr + g * co,
                                         cout);
            if (st) {
                p->status = st;
                return;
            }
        }
        if (p->bias || p->code != FL_LINEAR)
            FL_FN(rows_bias_act_range)(0, m, cout, yr, cout, p->bias, p->code, p->alpha, yr,
                                       cout);
        if (p->res)
            conv_residual_rows(m, cout, yr, p->res + r0 * cout, cout, p->res_code, p->res_alpha);
    }
}

/* Output rows [r0, r1) of group p->group's im2col into the shared p->cols. */
static void conv_im2col_rows_task(void *arg, int64_t r0, int64_t r1) {
    conv_ctx *p = (conv_ctx *)arg;
    conv_im2col(p, r0, r1 - r0, p->group, p->cols + r0 * p->k);
}

/* im2col + sgemm on few output rows: each group's whole im2col matrix, then the threaded
 * product (gemm.c's matmul, which shares so few rows by output columns: each thread then reads
 * only its part of the weights) with its epilogue. */
static int conv_im2col_whole(conv_ctx *p) {
    int64_t k = p->k, co = p->cout / p->groups, pfg = fl_packed_floats(k, co);
    p->cols = fl_buf_floats(&FL_FN(conv_call_buf), (size_t)(p->rows * k));
    if (!p->cols) return -1;
    for (int64_t g = 0; g < p->groups; ++g) {
        p->group = g;
        fl_parallel(p->rows, FL_MAX(1, CONV_MIN_SHARE_TAPS / k), conv_im2col_rows_task, p);
        int st = FL_FN(matmul)(p->rows, co, k, p->cols, k, 0, 0, 0, p->pw + g * pfg,
                               p->bias ? p->bias + g * co : 0, p->code, p->alpha, p->y + g * co,
                               p->cout);
        if (st) return st;
    }
    return 0;
}

/* Share of the register tile's rows that the tiles of one output row of wo columns fill
 * (narrow tiles for cout <= FL_VW). */
static double conv_row_fill(int64_t wo, int64_t cout) {
    int64_t tiles = 0;
    for (int64_t left = wo; left > 0; left -= gemm_next_rows_over(left, cout)) ++tiles;
    return (double)wo /
           (double)(FL_MAX(tiles, 1) * (cout <= FL_VW ? GEMM_NARROW_MR : GEMM_MR));
}

/* Column blocks of `panels` 32-column panels: at most `most_panels` panels each (an L2-sized
 * share of the weights), and enough blocks that row_units x blocks give every thread a few
 * units. Sets p->block_cols; returns the number of blocks. */
static int64_t conv_column_blocks(conv_ctx *p, int64_t most_panels) {
    int64_t panels = (p->cout + FL_PANEL - 1) / FL_PANEL;
    int64_t threads = fl_pool_get_threads();
    int64_t blocks = (panels + most_panels - 1) / most_panels;
    if (p->row_units * blocks < 2 * threads)
        blocks = FL_MIN(panels, (2 * threads + p->row_units - 1) / p->row_units);
    int64_t per = (panels + blocks - 1) / blocks;
    p->block_cols = per * FL_PANEL;
    return (panels + per - 1) / per;
}

/* Output rows of one share of the residual pass after a product over all rows. */
#define CONV_RES_ROWS 256

typedef struct {
    int64_t rows, cout;
    float *y;
    const float *res;
    int code;
    float alpha;
} conv_res_ctx;

/* Blocks [b0, b1) of CONV_RES_ROWS output rows of y = g(y + res). */
static void conv_residual_task(void *arg, int64_t b0, int64_t b1) {
    conv_res_ctx *p = (conv_res_ctx *)arg;
    int64_t r0 = b0 * CONV_RES_ROWS, r1 = FL_MIN(p->rows, b1 * CONV_RES_ROWS);
    conv_residual_rows(r1 - r0, p->cout, p->y + r0 * p->cout, p->res + r0 * p->cout, p->cout,
                       p->code, p->alpha);
}

/* The conv2d of one algorithm; where it returns 1 the caller still adds the residual. */
static int conv2d_run(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                      int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,
                      const float *pw, const float *bias, int code, float alpha,
                      const float *res, int res_code, float res_alpha, int method, float *y);

/* y = f(conv(x, w) + b) (then y = g(y + res) where res), conv.h: x (N, H, W, C), pw each
 * group's w (kh kw C/g, Cout/g) packed, bias (Cout,), res and y (N, Ho, Wo, Cout). */
int FL_FN(conv2d)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                  int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,
                  const float *pw, const float *bias, int code, float alpha, const float *res,
                  int res_code, float res_alpha, int method, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || (res && !conv_code_ok(res_code)) || groups < 1 || c % groups ||
        cout % groups)
        return -2;
    if (w == 1 && kw == 1 && wo == 1 && pl == 0 && ho > 1 && (method != 3 || dh == 1)) {
        /* a window over the height of a width-1 input (TensorFlow's 1-D convolutions over (L,
         * 1)): the same memory, packed weights (rows (i, ci)) and output seen along the width,
         * where one output row of Ho columns fills the implicit GEMM's tiles (rows of one
         * column each had gone through im2col); the dot method takes no width dilation, so
         * where it is asked for a height dilation stays along the height */
        w = h, h = 1, kw = kh, kh = 1, sw = sh, sh = 1, dw = dh, dh = 1, pl = pt, pt = 0, wo = ho, ho = 1;
    }
    int st = conv2d_run(n, h, w, c, x, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout, pw,
                        bias, code, alpha, res, res_code, res_alpha, method, y);
    if (st != 1) return st;
    /* a product over all rows: the residual in one pass after it */
    conv_res_ctx r = {n * ho * wo, cout, y, res, res_code, res_alpha};
    fl_parallel((r.rows + CONV_RES_ROWS - 1) / CONV_RES_ROWS, 1, conv_residual_task, &r);
    return 0;
}

static int conv2d_run(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                      int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,
                      const float *pw, const float *bias, int code, float alpha,
                      const float *res, int res_code, float res_alpha, int method, float *y) {
    int64_t k = kh * kw * (c / groups);
    int whole = res != 0;                             /* 1: the residual is the caller's */
    if (k <= 0) {                                     /* no input channels: y = f(b) */
        memset(y, 0, (size_t)(n * ho * wo * cout) * sizeof(float));
        FL_FN(rows_bias_act_range)(0, n * ho * wo, cout, y, cout, bias, code, alpha, y,
                                   cout);
        return whole;
    }
    int dot = groups == 1 && dw == 1 && cout <= CONV_DOT_MAX_COUT;
    int64_t run = kw * c;
    if (method == 3 || (method == 0 && dot && run >= CONV_DOT_MIN_RUN &&
                        (cout <= CONV_DOT_NARROW_COUT || run >= CONV_DOT_WIDE_RUN))) {
        if (!dot) return -2;
        int st = FL_FN(conv2d_dot)(n, h, w, c, x, kh, kw, sh, sw, dh, pt, pl, ho, wo, cout, pw,
                                   bias, code, alpha, y);
        return st ? st : whole;
    }
    int identity = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && ho == h &&
                   wo == w && groups == 1;
    if (method == 0)
        method = groups == 1 && !identity &&
                         (conv_row_fill(wo, cout) >= CONV_IMPLICIT_FILL || kw * c <= CONV_IMPLICIT_RUN)
                     ? 1
                     : 2;
    if (method == 1 && groups != 1) return -2;
    conv_ctx p = {x, pw, bias, y, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, groups, cout,
                  k, n * ho * wo, 0, 0, 0, 0, 0, code, 0, alpha, res, res_code, res_alpha};
    int64_t flops = 2 * p.rows * k * cout, units;
    if (method == 1) {
        int64_t hp = FL_MAX(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1);
        int64_t wp = FL_MAX(w + pl, (wo - 1) * sw + (kw - 1) * dw + 1);
        if ((pt || pl || hp != h || wp != w) && n * hp * wp * c <= CONV_PAD_COPY_FLOATS) {
            /* a small input padded whole, once: read in place everywhere */
            float *xp = fl_buf_floats(&FL_FN(conv_call_buf), (size_t)(n * hp * wp * c));
            if (!xp) return -1;
            FL_FN(pad_nhwc)(n, h, w, c, x, pt, pl, hp, wp, xp);
            p.x = xp;
            p.h = hp;
            p.w = wp;
            p.pt = p.pl = 0;
        }
        p.row_units = n * ho;
        int64_t panels = (cout + FL_PANEL - 1) / FL_PANEL;
        int64_t most = k * panels * FL_PANEL * (int64_t)sizeof(float) <= fl_l2_bytes() / 4 * 3
                           ? panels
                           : FL_MAX(1, CONV_PANEL_FLOATS / (k * FL_PANEL));
        units = p.row_units * conv_column_blocks(&p, most);
        fl_parallel_part(units, FL_MAX(1, units * GEMM_MIN_SHARE_FLOPS / flops),
                         gemm_wake_permille(flops), conv_implicit_task, &p);
        return p.status;
    }
    if (identity) {                                  /* x is the im2col matrix */
        int st = FL_FN(matmul)(p.rows, cout, c, x, c, 0, 0, 0, pw, bias, code, alpha, y, cout);
        return st ? st : whole;
    }
    if (p.rows < CONV_ROW_SPLIT_MIN) {
        int st = conv_im2col_whole(&p);
        return st ? st : whole;
    }
    units = (p.rows + GEMM_MR - 1) / GEMM_MR;
    int64_t chunk = FL_MIN(CONV_COLS_FLOATS / k, 4 * GEMM_CHUNK_FLOATS / cout) / GEMM_MR;
    p.chunk = FL_MIN(FL_MAX(chunk, 1), units) * GEMM_MR;
    fl_parallel_part(units, FL_MAX(1, units * GEMM_MIN_SHARE_FLOPS / flops),
                     gemm_wake_permille(flops), conv_im2col_task, &p);
    return p.status;
}
