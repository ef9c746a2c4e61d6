/* Convolutions (conv.h), on gemm.c's packed sgemm and tile, rows.c's epilogue and pool.c's
 * vector helpers and plane buffer. Compiled once per ISA (kernels.inc).
 *
 * conv2d runs on the packed sgemm's register tile (gemm.c), one of two ways:
 * - implicit GEMM: output row (n, oh), output column ow and window row i read kw C consecutive
 *   floats of the zero-padded input xp[n, oh sh + i dh, ow sw:ow sw + kw, :], so a tile's rows
 *   are consecutive output columns, sw C floats apart, read in place: no im2col matrix is
 *   written (a width dilation makes each tap a run of C floats: one pass per window row,
 *   accumulating). One group, output rows long enough to fill the tiles; shared by output
 *   rows and blocks of columns whose packed weights stay in L2, each output row's epilogue
 *   run as soon as it is done;
 * - im2col + sgemm: grouped convolutions and short output rows. From CONV_ROW_SPLIT_MIN output
 *   rows, blocks of rows gathered into a per-thread (rows, kh kw C / groups) matrix, the packed
 *   sgemm group by group, then the block's epilogue; fewer rows share one matrix whose product
 *   gemm.c's matmul splits by output columns. A 1x1 stride-1 unpadded convolution is that
 *   product on x itself.
 * conv3x3_winograd: Winograd F(2x2, 3x3) (Lavin & Gray 2016): per 2x2 output tile, V = B^T d B
 * of its 4x4 input patch, M[e] = V[e] U[e] as 16 packed sgemms over a block of tiles, y =
 * A^T M A with the epilogue in registers: 2.25x fewer multiplies than the direct sum; the
 * transforms only add, subtract and halve. F(4x4, 3x3) the same way on 6x6 patches (36
 * sgemms, 4x fewer multiplies), at about 5x F(2x2)'s rounding error. Shared by blocks of
 * tiles, or, with few blocks, in three steps whose products are shared by e.
 * depthwise_conv2d: a direct loop vectorized over channels, four outputs per pass (3x3: the
 * nine weights in registers; stride 1: the passes share their loads); window rows outside x
 * read a row of zeros.
 * conv_transpose2d: one sgemm per group (x rows times w (ci', kh kw co)), then each output pixel
 * gathers its taps from those columns (col2im without scattered writes) and the row runs its
 * epilogue. conv_transpose2d_nchw: the sgemm w^T (co kh kw, ci') @ x (ci', rows W) on NCHW
 * planes in chunks of input rows, each product row added into output rows kept split in
 * column phases, each row interleaved into y with its epilogue once its taps are in. */

#include "conv.h"
#include "gemm_internal.h"
#include "pool_internal.h"
#include "rows_internal.h"
#include "threadpool.h"

/* im2col block: its rows x k floats (1 MiB) stay in L2 while the sgemm reads them. */
#define CONV_COLS_FLOATS (INT64_C(1) << 18)
/* A column block's packed weights (k x columns floats, 256 KiB) stay in L2 while the implicit
 * GEMM's output rows read them. */
#define CONV_PANEL_FLOATS (INT64_C(1) << 16)
/* Winograd tiles per block: about this many floats of V and M (512 KiB) stay in L2, but at
 * least CONV_WINO_MIN_TILES, so that each block's 16 products read U (16 C_in C_out floats,
 * out of L2 for wide layers) for enough rows (small blocks re-read U from memory). */
#define CONV_WINO_FLOATS (INT64_C(1) << 17)
#define CONV_WINO_MIN_TILES 96
/* Fewest output rows for im2col by row tiles on per-thread blocks; fewer share one im2col
 * matrix whose product is split by output columns (each thread reads part of the weights). */
#define CONV_ROW_SPLIT_MIN 256
/* The implicit GEMM runs its tiles within an output row: it needs rows that fill at least this
 * share of the tiles (docs/design.md, "Figures behind the code's constants"). */
#define CONV_IMPLICIT_FILL 0.8
/* ... or window rows of at most this many floats (kw C): im2col's short copies cost more than
 * the empty tile rows (same section). */
#define CONV_IMPLICIT_RUN 64
/* Fewest output values (x window taps) in a thread's share of the direct kernels. */
#define CONV_MIN_SHARE_TAPS (INT64_C(1) << 17)

static __thread fl_buf conv_call_buf;   /* the calling thread's: padded input, V and M, cols */
static __thread fl_buf conv_task_buf;   /* each task's: im2col block, Winograd block */

/* An elementwise activation code (the epilogues apply it per vector). */
FL_INLINE int conv_code_ok(int code) {
    return code >= 0 && code < FL_N_ACTIVATIONS && code != FL_SOFTMAX && code != FL_LOG_SOFTMAX;
}

/* f(s + bias[0:nc]) for one vector of outputs (bias NULL: none). */
FL_INLINE fl_vf conv_epi(fl_vf s, const float *bias, int64_t nc, int code, float alpha) {
    if (bias) s += pool_ld(bias, nc);
    return code == FL_LINEAR ? s : rows_vact(s, code, alpha);
}

/* ------------------------------------------------------------------------------ conv2d */

typedef struct {
    const float *x;      /* implicit: the padded input (n, h, w, c); im2col: x */
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
} conv_ctx;

/* Units u = cb row_units + t: output row t = n Ho + oh, columns of block cb (implicit GEMM). */
static void conv_implicit_task(void *arg, int64_t u0, int64_t u1) {
    const conv_ctx *p = (const conv_ctx *)arg;
    int64_t c = p->c, k = p->k, cout = p->cout, wo = p->wo, wp = p->w;
    int64_t ars = p->sw * c, ari = p->dh * wp * c;
    for (int64_t u = u0; u < u1; ++u) {
        int64_t cb = u / p->row_units, t = u % p->row_units;
        int64_t j0 = cb * p->block_cols, j1 = FL_MIN(cout, j0 + p->block_cols);
        int64_t n = t / p->ho, oh = t % p->ho;
        const float *a = p->x + (n * p->h + oh * p->sh) * wp * c;
        float *yt = p->y + t * wo * cout;
        for (int64_t ow = 0, rows; ow < wo; ow += rows) {
            rows = gemm_next_rows_over(wo - ow, j1 - j0);
            const float *ar = a + ow * ars;
            float *yr = yt + ow * cout;
            for (int64_t j = j0; j < j1; j += GEMM_TN) {
                int nr = (int)FL_MIN(j1 - j, GEMM_TN);
                const float *pb = p->pw + (j / FL_PANEL) * FL_PANEL * k + j % FL_PANEL;
                if (p->dw == 1) {
                    FL_FN(gemm_tile_rows)((int)rows, p->kh, ari, p->kw * c, ar, ars, pb, yr + j,
                                          cout, nr, 0);
                    continue;
                }
                for (int64_t i = 0; i < p->kh; ++i)
                    FL_FN(gemm_tile_rows)((int)rows, p->kw, p->dw * c, c, ar + i * ari, ars,
                                          pb + i * p->kw * c * FL_PANEL, yr + j, cout, nr,
                                          i > 0);
            }
        }
        if (p->bias || p->code != FL_LINEAR)
            FL_FN(rows_bias_act_range)(0, wo, j1 - j0, yt + j0, cout,
                                       p->bias ? p->bias + j0 : 0, p->code, p->alpha, yt + j0,
                                       cout);
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
    float *cols = fl_buf_floats(&conv_task_buf, (size_t)(p->chunk * k));
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
    p->cols = fl_buf_floats(&conv_call_buf, (size_t)(p->rows * k));
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

/* y = f(conv(x, w) + b), conv.h: x (N, H, W, C), pw each group's w (kh kw C/g, Cout/g) packed,
 * bias (Cout,), y (N, Ho, Wo, Cout). */
int FL_FN(conv2d)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x, int64_t kh,
                  int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                  int64_t pl, int64_t ho, int64_t wo, int64_t groups, int64_t cout,
                  const float *pw, const float *bias, int code, float alpha, int method,
                  float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code) || groups < 1 || c % groups || cout % groups) return -2;
    int64_t k = kh * kw * (c / groups);
    if (k <= 0) {                                     /* no input channels: y = f(b) */
        memset(y, 0, (size_t)(n * ho * wo * cout) * sizeof(float));
        FL_FN(rows_bias_act_range)(0, n * ho * wo, cout, y, cout, bias, code, alpha, y,
                                   cout);
        return 0;
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
                  k, n * ho * wo, 0, 0, 0, 0, 0, code, 0, alpha};
    int64_t flops = 2 * p.rows * k * cout, units;
    if (method == 1) {
        int64_t hp = FL_MAX(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1);
        int64_t wp = FL_MAX(w + pl, (wo - 1) * sw + (kw - 1) * dw + 1);
        if (pt || pl || hp != h || wp != w) {
            float *xp = fl_buf_floats(&conv_call_buf, (size_t)(n * hp * wp * c));
            if (!xp) return -1;
            FL_FN(pad_nhwc)(n, h, w, c, x, pt, pl, hp, wp, xp);
            p.x = xp;
            p.h = hp;
            p.w = wp;
        }
        p.row_units = n * ho;
        units = p.row_units * conv_column_blocks(&p, FL_MAX(1, CONV_PANEL_FLOATS / (k * FL_PANEL)));
        fl_parallel(units, FL_MAX(1, units * GEMM_MIN_SHARE_FLOPS / flops), conv_implicit_task,
                    &p);
        return p.status;
    }
    if (identity)                                    /* x is the im2col matrix */
        return FL_FN(matmul)(p.rows, cout, c, x, c, 0, 0, 0, pw, bias, code, alpha, y, cout);
    if (p.rows < CONV_ROW_SPLIT_MIN) return conv_im2col_whole(&p);
    units = (p.rows + GEMM_MR - 1) / GEMM_MR;
    int64_t chunk = FL_MIN(CONV_COLS_FLOATS / k, 4 * GEMM_CHUNK_FLOATS / cout) / GEMM_MR;
    p.chunk = FL_MIN(FL_MAX(chunk, 1), units) * GEMM_MR;
    fl_parallel(units, FL_MAX(1, units * GEMM_MIN_SHARE_FLOPS / flops), conv_im2col_task, &p);
    return p.status;
}

/* ---------------------------------------------------------------------------- Winograd */

/* u (tile + 2) = G g: F(2x2, 3x3): G = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]];
 * F(4x4, 3x3) on the points 0, 1, -1, 1/2, -2, infinity (half the rounding error of 0, +-1,
 * +-2 in float32, ResNet shapes), rows scaled to make B^T integral: G = [[1/2, 0, 0], [1/6,
 * 1/6, 1/6], [-1/6, 1/6, -1/6], [-16/15, -8/15, -4/15], [1/30, -1/15, 2/15], [0, 0, 1/2]]. */
static void conv_wino_g(int tile, const double *g, double *u) {
    if (tile == 2) {
        u[0] = g[0];
        u[1] = 0.5 * (g[0] + g[1] + g[2]);
        u[2] = 0.5 * (g[0] - g[1] + g[2]);
        u[3] = g[2];
        return;
    }
    u[0] = g[0] / 2;
    u[1] = (g[0] + g[1] + g[2]) / 6;
    u[2] = (g[1] - g[0] - g[2]) / 6;
    u[3] = -(16 * g[0] + 8 * g[1] + 4 * g[2]) / 15;
    u[4] = (g[0] - 2 * g[1] + 4 * g[2]) / 30;
    u[5] = g[2] / 2;
}

/* pu[e] = U[e] packed, U[n a + b][i, o] = (G w[:, :, i, o] G^T)[a, b] (n = tile + 2, G above):
 * w (3, 3, cin, cout), pu n^2 packed (cin, cout). */
int FL_FN(winograd_pack)(int tile, int64_t cin, int64_t cout, const float *w, float *pu) {
    if (tile != 2 && tile != 4) return -2;
    int na = tile + 2, ne = na * na;
    float *u = (float *)malloc((size_t)(ne * cin * cout) * sizeof(float));
    if (!u) return -1;
    for (int64_t i = 0; i < cin; ++i)
        for (int64_t o = 0; o < cout; ++o) {
            double g[3][3], t[6][3], gs[3], ts[6];   /* in double: U rounded once */
            for (int r = 0; r < 3; ++r)
                for (int s = 0; s < 3; ++s) g[r][s] = w[((r * 3 + s) * cin + i) * cout + o];
            for (int s = 0; s < 3; ++s) {                    /* t = G g */
                for (int r = 0; r < 3; ++r) gs[r] = g[r][s];
                conv_wino_g(tile, gs, ts);
                for (int a = 0; a < na; ++a) t[a][s] = ts[a];
            }
            for (int a = 0; a < na; ++a) {                   /* u = t G^T */
                conv_wino_g(tile, t[a], ts);
                for (int b = 0; b < na; ++b)
                    u[((na * a + b) * cin + i) * cout + o] = (float)ts[b];
            }
        }
    int64_t pf = fl_packed_floats(cin, cout);
    for (int e = 0; e < ne; ++e) FL_FN(pack)(u + e * cin * cout, cout, 0, cin, cout, pu + e * pf);
    free(u);
    return 0;
}

typedef struct {
    const float *x, *pu, *bias;
    float *y, *v, *m;    /* v (ne, tiles, cin), m (ne, tiles, cout): the phases' shared V, M */
    int64_t h, w, cin, cout, pt, pl, ho, wo, th, tw, tiles, block, puf;
    int tile, na, ne;    /* outputs per tile side, its input patch's side tile + 2, na^2 */
    int code, status;
    float alpha;
    int nonfinite;       /* set when a stored output (before f) is NaN or inf */
} conv_wino_ctx;

/* Whether lanes [0, nc) of y, before the epilogue, hold a NaN or an inf (y - y is NaN there). */
FL_INLINE int conv_wino_nonfinite(fl_vf y, int64_t nc) {
    fl_vi bad = (y - y) != (y - y);
    for (int64_t i = 0; i < nc; ++i)
        if (bad[i]) return 1;
    return 0;
}

/* v[4 a + b] (rows es floats apart) = (B^T d B)[a, b] for channels c0 + [0, nc) of the patch
 * d[4 a + b] = src[4 a + b], B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]. */
FL_INLINE void conv_wino_bt(const float *const *src, int64_t c0, int64_t nc, float *v,
                            int64_t es) {
    fl_vf d[16];
    for (int i = 0; i < 16; ++i) d[i] = pool_ld(src[i] + c0, nc);
    for (int b = 0; b < 4; ++b) {                                /* B^T d, column b */
        fl_vf d0 = d[b], d1 = d[4 + b], d2 = d[8 + b], d3 = d[12 + b];
        d[b] = d0 - d2;
        d[4 + b] = d1 + d2;
        d[8 + b] = d2 - d1;
        d[12 + b] = d1 - d3;
    }
    for (int a = 0; a < 4; ++a) {                                /* (B^T d) B, row a */
        fl_vf d0 = d[4 * a], d1 = d[4 * a + 1], d2 = d[4 * a + 2], d3 = d[4 * a + 3];
        pool_st(v + (4 * a) * es + c0, d0 - d2, nc);
        pool_st(v + (4 * a + 1) * es + c0, d1 + d2, nc);
        pool_st(v + (4 * a + 2) * es + c0, d2 - d1, nc);
        pool_st(v + (4 * a + 3) * es + c0, d1 - d3, nc);
    }
}

/* r[0:6] = B^T d[0:6] of F(4x4, 3x3) (d at stride ds, r at stride rs), B^T = [[2, -3, -4, 3,
 * 2, 0], [0, -2, 1, 5, 2, 0], [0, 2, -5, 1, 2, 0], [0, -2, -1, 2, 1, 0], [0, 1, -2, -1, 2, 0],
 * [0, 2, -3, -4, 3, 2]]. */
FL_INLINE void conv_wino4_bt1(const fl_vf *d, int ds, fl_vf *r, int rs) {
    fl_vf d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds], d5 = d[5 * ds];
    fl_vf two = fl_set1(2.0f), three = fl_set1(3.0f), four = fl_set1(4.0f), five = fl_set1(5.0f);
    r[0] = two * (d0 + d4) + three * (d3 - d1) - four * d2;
    r[rs] = two * (d4 - d1) + d2 + five * d3;
    r[2 * rs] = two * (d1 + d4) - five * d2 + d3;
    r[3 * rs] = two * (d3 - d1) + d4 - d2;
    r[4 * rs] = two * (d4 - d2) + d1 - d3;
    r[5 * rs] = two * (d1 + d5) + three * (d4 - d2) - four * d3;
}

/* v[6 a + b] (rows es floats apart) = (B^T d B)[a, b] of F(4x4, 3x3) for channels c0 + [0, nc)
 * of the patch d[6 a + b] = src[6 a + b]. */
FL_INLINE void conv_wino4_bt(const float *const *src, int64_t c0, int64_t nc, float *v,
                             int64_t es) {
    fl_vf d[36], t[36], r[6];
    for (int i = 0; i < 36; ++i) d[i] = pool_ld(src[i] + c0, nc);
    for (int b = 0; b < 6; ++b) conv_wino4_bt1(d + b, 6, t + b, 6);   /* B^T d, column b */
    for (int a = 0; a < 6; ++a) {                                     /* (B^T d) B, row a */
        conv_wino4_bt1(t + 6 * a, 1, r, 1);
        for (int b = 0; b < 6; ++b) pool_st(v + (6 * a + b) * es + c0, r[b], nc);
    }
}

/* V of tiles [t0, t1): tile t's row t - t0 of v[e] = v + e es. */
static int conv_wino_input(const conv_wino_ctx *p, int64_t t0, int64_t t1, float *v,
                           int64_t es) {
    int64_t cin = p->cin, per_image = p->th * p->tw;
    int na = p->na;
    const float *zero = FL_FN(pool_zeros)((size_t)cin);
    if (!zero) return -1;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / per_image, r = t % per_image;
        int64_t ih0 = p->tile * (r / p->tw) - p->pt, iw0 = p->tile * (r % p->tw) - p->pl;
        const float *src[36];
        for (int a = 0; a < na; ++a)
            for (int b = 0; b < na; ++b) {
                int64_t ih = ih0 + a, iw = iw0 + b;
                src[na * a + b] = ih >= 0 && ih < p->h && iw >= 0 && iw < p->w
                                      ? p->x + ((n * p->h + ih) * p->w + iw) * cin
                                      : zero;
            }
        float *vt = v + (t - t0) * cin;
        int64_t c0 = 0;
        if (p->tile == 2) {
            for (; c0 + FL_VW <= cin; c0 += FL_VW) conv_wino_bt(src, c0, FL_VW, vt, es);
            if (c0 < cin) conv_wino_bt(src, c0, cin - c0, vt, es);
        } else {
            for (; c0 + FL_VW <= cin; c0 += FL_VW) conv_wino4_bt(src, c0, FL_VW, vt, es);
            if (c0 < cin) conv_wino4_bt(src, c0, cin - c0, vt, es);
        }
    }
    return 0;
}

/* out[2 a + b] (NULL: past the output's edge) = f((A^T M A)[a, b] + bias) for channels c0 +
 * [0, nc) of m[e] = m + e es, A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]. */
FL_INLINE void conv_wino_at(const float *m, int64_t es, int64_t c0, int64_t nc,
                            float *const *out, conv_wino_ctx *p) {
    fl_vf s0[4], s1[4];
    for (int b = 0; b < 4; ++b) {                                /* A^T M, column b */
        fl_vf m0 = pool_ld(m + b * es + c0, nc), m1 = pool_ld(m + (4 + b) * es + c0, nc);
        fl_vf m2 = pool_ld(m + (8 + b) * es + c0, nc), m3 = pool_ld(m + (12 + b) * es + c0, nc);
        s0[b] = m0 + m1 + m2;
        s1[b] = m1 - m2 - m3;
    }
    const float *bias = p->bias ? p->bias + c0 : 0;
    fl_vf y[4] = {s0[0] + s0[1] + s0[2], s0[1] - s0[2] - s0[3], s1[0] + s1[1] + s1[2],
                  s1[1] - s1[2] - s1[3]};
    fl_vf seen = fl_set1(0.0f);
    for (int q = 0; q < 4; ++q)
        if (out[q]) {
            seen += y[q] - y[q];
            pool_st(out[q] + c0, conv_epi(y[q], bias, nc, p->code, p->alpha), nc);
        }
    if (conv_wino_nonfinite(seen, nc)) p->nonfinite = 1;
}

/* y[0:4] = A^T m[0:6] of F(4x4, 3x3) (m at stride ms, y at stride ys), A^T = [[1, 1, 1, 1, 1,
 * 0], [0, 1, -1, 1/2, -2, 0], [0, 1, 1, 1/4, 4, 0], [0, 1, -1, 1/8, -8, 1]]. */
FL_INLINE void conv_wino4_at1(const fl_vf *m, int ms, fl_vf *y, int ys) {
    fl_vf a = m[ms] + m[2 * ms], b = m[ms] - m[2 * ms], m3 = m[3 * ms], m4 = m[4 * ms];
    y[0] = m[0] + a + m3 + m4;
    y[ys] = b + fl_set1(0.5f) * m3 - fl_set1(2.0f) * m4;
    y[2 * ys] = a + fl_set1(0.25f) * m3 + fl_set1(4.0f) * m4;
    y[3 * ys] = b + fl_set1(0.125f) * m3 - fl_set1(8.0f) * m4 + m[5 * ms];
}

/* out[4 a + b] (NULL: past the output's edge) = f((A^T M A)[a, b] + bias) of F(4x4, 3x3) for
 * channels c0 + [0, nc) of m[e] = m + e es. */
FL_INLINE void conv_wino4_at(const float *m, int64_t es, int64_t c0, int64_t nc,
                             float *const *out, conv_wino_ctx *p) {
    fl_vf d[36], t[24], y[16];
    for (int i = 0; i < 36; ++i) d[i] = pool_ld(m + i * es + c0, nc);
    for (int b = 0; b < 6; ++b) conv_wino4_at1(d + b, 6, t + b, 6);   /* A^T M, column b */
    for (int a = 0; a < 4; ++a) conv_wino4_at1(t + 6 * a, 1, y + 4 * a, 1);   /* (A^T M) A */
    const float *bias = p->bias ? p->bias + c0 : 0;
    fl_vf seen = fl_set1(0.0f);
    for (int q = 0; q < 16; ++q)
        if (out[q]) {
            seen += y[q] - y[q];
            pool_st(out[q] + c0, conv_epi(y[q], bias, nc, p->code, p->alpha), nc);
        }
    if (conv_wino_nonfinite(seen, nc)) p->nonfinite = 1;
}

/* y of tiles [t0, t1) from M: tile t's row t - t0 of m[e] = m + e es. */
static void conv_wino_output(conv_wino_ctx *p, int64_t t0, int64_t t1, const float *m,
                             int64_t es) {
    int64_t cout = p->cout, per_image = p->th * p->tw;
    int tile = p->tile;
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / per_image, r = t % per_image;
        int64_t oh = tile * (r / p->tw), ow = tile * (r % p->tw);
        float *out[16];
        for (int a = 0; a < tile; ++a)
            for (int b = 0; b < tile; ++b)
                out[tile * a + b] = oh + a < p->ho && ow + b < p->wo
                                        ? p->y + ((n * p->ho + oh + a) * p->wo + ow + b) * cout
                                        : 0;
        const float *mt = m + (t - t0) * cout;
        int64_t c0 = 0;
        if (tile == 2) {
            for (; c0 + FL_VW <= cout; c0 += FL_VW) conv_wino_at(mt, es, c0, FL_VW, out, p);
            if (c0 < cout) conv_wino_at(mt, es, c0, cout - c0, out, p);
        } else {
            for (; c0 + FL_VW <= cout; c0 += FL_VW) conv_wino4_at(mt, es, c0, FL_VW, out, p);
            if (c0 < cout) conv_wino4_at(mt, es, c0, cout - c0, out, p);
        }
    }
}

/* M[e] = V[e] U[e] for e in [e0, e1), nt tiles. */
static int conv_wino_products(const conv_wino_ctx *p, int64_t nt, int64_t e0, int64_t e1,
                              const float *v, int64_t ves, float *m, int64_t mes) {
    for (int64_t e = e0; e < e1; ++e) {
        int st = FL_FN(sgemm_packed)(nt, p->cout, p->cin, v + e * ves, p->cin, p->pu + e * p->puf,
                                     0, m + e * mes, p->cout);
        if (st) return st;
    }
    return 0;
}

/* Blocks [b0, b1) of p->block tiles, each in three steps in this thread's buffer. */
static void conv_wino_block_task(void *arg, int64_t b0, int64_t b1) {
    conv_wino_ctx *p = (conv_wino_ctx *)arg;
    float *v = fl_buf_floats(&conv_task_buf, (size_t)(p->ne * p->block * (p->cin + p->cout)));
    if (!v) {
        p->status = -1;
        return;
    }
    float *m = v + p->ne * p->block * p->cin;
    for (int64_t b = b0; b < b1; ++b) {
        int64_t t0 = b * p->block, t1 = FL_MIN(p->tiles, t0 + p->block), nt = t1 - t0;
        int st = conv_wino_input(p, t0, t1, v, nt * p->cin);
        if (!st) st = conv_wino_products(p, nt, 0, p->ne, v, nt * p->cin, m, nt * p->cout);
        if (st) {
            p->status = st;
            return;
        }
        conv_wino_output(p, t0, t1, m, nt * p->cout);
    }
}

static void conv_wino_input_task(void *arg, int64_t t0, int64_t t1) {
    conv_wino_ctx *p = (conv_wino_ctx *)arg;
    if (conv_wino_input(p, t0, t1, p->v + t0 * p->cin, p->tiles * p->cin)) p->status = -1;
}

static void conv_wino_products_task(void *arg, int64_t e0, int64_t e1) {
    conv_wino_ctx *p = (conv_wino_ctx *)arg;
    int st = conv_wino_products(p, p->tiles, e0, e1, p->v, p->tiles * p->cin, p->m,
                                p->tiles * p->cout);
    if (st) p->status = st;
}

static void conv_wino_output_task(void *arg, int64_t t0, int64_t t1) {
    conv_wino_ctx *p = (conv_wino_ctx *)arg;
    conv_wino_output(p, t0, t1, p->m + t0 * p->cout, p->tiles * p->cout);
}

/* y = f(conv3x3(x, w) + b) = f(A^T [U . (B^T d B)] A + b) per tile x tile outputs (2 or 4):
 * x (N, H, W, cin), pu from winograd_pack of the same tile, bias (cout,), y (N, Ho, Wo, cout).
 * Returns 1 when an output before f is NaN or inf: the transforms add and subtract across a
 * tile's patch, so a non-finite input reaches every output of its tiles and values near
 * float32's limit can overflow where the direct sum does not (the caller then convolves
 * directly). */
int FL_FN(conv3x3_winograd)(int tile, int64_t n, int64_t h, int64_t w, int64_t cin,
                            const float *x, int64_t pt, int64_t pl, int64_t ho, int64_t wo,
                            int64_t cout, const float *pu, const float *bias, int code,
                            float alpha, float *y) {
    if (tile != 2 && tile != 4) return -2;
    if (n <= 0 || ho <= 0 || wo <= 0 || cout <= 0) return 0;
    if (!conv_code_ok(code)) return -2;
    int na = tile + 2, ne = na * na;
    int64_t th = (ho + tile - 1) / tile, tw = (wo + tile - 1) / tile, tiles = n * th * tw;
    int64_t flops = 2 * ne * tiles * cin * cout;
    int64_t shares = FL_MIN(fl_pool_get_threads(), FL_MAX(1, flops / GEMM_MIN_SHARE_FLOPS));
    /* blocks whose V and M stay in L2; a U out of L2 read for enough rows per block */
    int64_t block = FL_MAX(GEMM_MR, CONV_WINO_FLOATS / (ne * (cin + cout)));
    if (ne * cin * cout > CONV_WINO_FLOATS / 2) block = FL_MAX(block, CONV_WINO_MIN_TILES);
    int64_t blocks = (tiles + block - 1) / block;
    conv_wino_ctx p = {x, pu, bias, y, 0, 0, h, w, cin, cout, pt, pl, ho, wo, th, tw, tiles,
                       0, fl_packed_floats(cin, cout), tile, na, ne, code, 0, alpha};
    if (shares > 1 && blocks < 2 * shares) {
        /* few blocks: the three steps shared in turn, the ne products by e (each thread then
         * reads only its part of U) */
        float *buf = fl_buf_floats(&conv_call_buf, (size_t)(ne * tiles * (cin + cout)));
        if (!buf) return -1;
        p.v = buf;
        p.m = buf + ne * tiles * cin;
        int64_t grain = FL_MAX(1, CONV_MIN_SHARE_TAPS / (ne * (cin + cout)));
        fl_parallel(tiles, grain, conv_wino_input_task, &p);
        if (!p.status) fl_parallel(ne, 1, conv_wino_products_task, &p);
        if (!p.status) fl_parallel(tiles, grain, conv_wino_output_task, &p);
        return p.status ? p.status : p.nonfinite;
    }
    /* shared by blocks: a multiple of the pool's chunks, so that each takes as many */
    if (shares > 1) blocks = (blocks + 4 * shares - 1) / (4 * shares) * (4 * shares);
    p.block = FL_MIN(tiles, ((tiles + blocks - 1) / blocks + GEMM_MR - 1) / GEMM_MR * GEMM_MR);
    blocks = (tiles + p.block - 1) / p.block;
    fl_parallel(blocks, shares > 1 ? 1 : blocks, conv_wino_block_task, &p);
    return p.status ? p.status : p.nonfinite;
}

/* --------------------------------------------------------------------------- depthwise */

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    int64_t h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo;
    int code, status;
    float alpha;
} conv_dw_ctx;

/* out[c0:c0 + nc] = f(b + sum over i < kh, j in [j0, j1) of rows[i][(iw0 + j dw) c + c0:]
 * wk[i, j, c0:]) (multiplier 1). */
FL_INLINE void conv_dw_chunk(const conv_dw_ctx *p, const float *const *rows, int64_t iw0,
                             int64_t j0, int64_t j1, int64_t c0, int64_t nc, float *out) {
    int64_t c = p->c;
    fl_vf acc = fl_set1(0.0f);
    for (int64_t i = 0; i < p->kh; ++i) {
        const float *r = rows[i] + c0, *wr = p->wk + i * p->kw * c + c0;
        for (int64_t j = j0; j < j1; ++j)
            acc += pool_ld(r + (iw0 + j * p->dw) * c, nc) * pool_ld(wr + j * c, nc);
    }
    pool_st(out + c0, conv_epi(acc, p->bias ? p->bias + c0 : 0, nc, p->code, p->alpha), nc);
}

/* One output pixel (channels [cf, c)) of a window starting at column iw0, taps j in [j0, j1). */
static void conv_dw_pixel(const conv_dw_ctx *p, const float *const *rows, int64_t iw0,
                          int64_t j0, int64_t j1, int64_t cf, float *out) {
    int64_t c0 = cf;
    for (; c0 + FL_VW <= p->c; c0 += FL_VW) conv_dw_chunk(p, rows, iw0, j0, j1, c0, FL_VW, out);
    if (c0 < p->c) conv_dw_chunk(p, rows, iw0, j0, j1, c0, p->c - c0, out);
}

/* One output pixel of a depth multiplier m > 1: out[ci m + q] = f(b + sum x[ci] w[ci m + q]). */
static void conv_dw_pixel_mult(const conv_dw_ctx *p, const float *const *rows, int64_t iw0,
                               int64_t j0, int64_t j1, float *out) {
    int64_t c = p->c, m = p->m, k = c * m;
    memset(out, 0, (size_t)k * sizeof(float));
    for (int64_t i = 0; i < p->kh; ++i)
        for (int64_t j = j0; j < j1; ++j) {
            const float *xr = rows[i] + (iw0 + j * p->dw) * c;
            const float *wr = p->wk + (i * p->kw + j) * k;
            for (int64_t ci = 0; ci < c; ++ci)
                for (int64_t q = 0; q < m; ++q) out[ci * m + q] += xr[ci] * wr[ci * m + q];
        }
    if (p->bias || p->code != FL_LINEAR)
        FL_FN(rows_bias_act_range)(0, 1, k, out, k, p->bias, p->code, p->alpha, out, k);
}

/* Output columns [ow0, ow1) of a 3x3 window inside x (multiplier 1): stride 1 four outputs per
 * pass, all channels of those four before the next four (their rows stay in L1; looping over
 * the columns inside each channel vector re-read the three input rows from L2 per vector). */
static void conv_dw3x3_run(const conv_dw_ctx *p, const float *const *rows, int64_t ow0,
                           int64_t ow1, float *yrow) {
    int64_t c = p->c, cs = p->sw * c, dc = p->dw * c, left = p->pl * c;
    int64_t cv = c / FL_VW * FL_VW;
    const float *bias = p->bias;
    int64_t ow = ow0;
    if (cs == c && dc == c) {
        for (; ow + 4 <= ow1; ow += 4)
            for (int64_t c0 = 0; c0 < cv; c0 += FL_VW) {
                const float *bc = bias ? bias + c0 : 0;
                fl_vf s0 = fl_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
                for (int i = 0; i < 3; ++i) {
                    const float *r = rows[i] + ow * c - left + c0, *wr = p->wk + 3 * i * c + c0;
                    fl_vf x0 = fl_load(r), x1 = fl_load(r + c), x2 = fl_load(r + 2 * c);
                    fl_vf x3 = fl_load(r + 3 * c), x4 = fl_load(r + 4 * c), x5 = fl_load(r + 5 * c);
                    fl_vf wa = fl_load(wr), wb = fl_load(wr + c), wc = fl_load(wr + 2 * c);
                    s0 += x0 * wa + x1 * wb + x2 * wc;
                    s1 += x1 * wa + x2 * wb + x3 * wc;
                    s2 += x2 * wa + x3 * wb + x4 * wc;
                    s3 += x3 * wa + x4 * wb + x5 * wc;
                }
                float *o = yrow + ow * c + c0;
                fl_store(o, conv_epi(s0, bc, FL_VW, p->code, p->alpha));
                fl_store(o + c, conv_epi(s1, bc, FL_VW, p->code, p->alpha));
                fl_store(o + 2 * c, conv_epi(s2, bc, FL_VW, p->code, p->alpha));
                fl_store(o + 3 * c, conv_epi(s3, bc, FL_VW, p->code, p->alpha));
            }
    }
    for (; ow < ow1; ++ow)
        for (int64_t c0 = 0; c0 < cv; c0 += FL_VW) {
            fl_vf s = fl_set1(0.0f);
            for (int i = 0; i < 3; ++i) {
                const float *r = rows[i] + ow * cs - left + c0, *wr = p->wk + 3 * i * c + c0;
                s += fl_load(r) * fl_load(wr) + fl_load(r + dc) * fl_load(wr + c) +
                     fl_load(r + 2 * dc) * fl_load(wr + 2 * c);
            }
            fl_store(yrow + ow * c + c0,
                     conv_epi(s, bias ? bias + c0 : 0, FL_VW, p->code, p->alpha));
        }
    if (cv < c)
        for (ow = ow0; ow < ow1; ++ow)
            conv_dw_pixel(p, rows, ow * p->sw - p->pl, 0, 3, cv, yrow + ow * c);
}

/* Output columns [ow0, ow1) of a window inside x (multiplier 1, any kernel): vector by vector
 * of channels, four outputs per pass (each tap's weights loaded once for the four). */
static void conv_dw_run(const conv_dw_ctx *p, const float *const *rows, int64_t ow0,
                        int64_t ow1, float *yrow) {
    int64_t c = p->c, cs = p->sw * c, dc = p->dw * c, left = p->pl * c;
    int64_t c0 = 0;
    for (; c0 + FL_VW <= c; c0 += FL_VW) {
        const float *bc = p->bias ? p->bias + c0 : 0;
        for (int64_t ow = ow0; ow + 4 <= ow1; ow += 4) {
            fl_vf s0 = fl_set1(0.0f), s1 = s0, s2 = s0, s3 = s0;
            for (int64_t i = 0; i < p->kh; ++i) {
                const float *r = rows[i] + ow * cs - left + c0;
                const float *wr = p->wk + i * p->kw * c + c0;
                for (int64_t j = 0; j < p->kw; ++j) {
                    fl_vf wv = fl_load(wr + j * c);
                    const float *rj = r + j * dc;
                    s0 += fl_load(rj) * wv;
                    s1 += fl_load(rj + cs) * wv;
                    s2 += fl_load(rj + 2 * cs) * wv;
                    s3 += fl_load(rj + 3 * cs) * wv;
                }
            }
            float *o = yrow + ow * c + c0;
            fl_store(o, conv_epi(s0, bc, FL_VW, p->code, p->alpha));
            fl_store(o + c, conv_epi(s1, bc, FL_VW, p->code, p->alpha));
            fl_store(o + 2 * c, conv_epi(s2, bc, FL_VW, p->code, p->alpha));
            fl_store(o + 3 * c, conv_epi(s3, bc, FL_VW, p->code, p->alpha));
        }
    }
    int64_t ow = ow0 + (ow1 - ow0) / 4 * 4;             /* the last columns, pixel by pixel */
    for (int64_t q = ow0; q < ow1; ++q)
        conv_dw_pixel(p, rows, q * p->sw - p->pl, 0, p->kw, q < ow ? c0 : 0, yrow + q * c);
}

/* Output rows t = n Ho + oh in [t0, t1): window rows outside x read a row of zeros. */
static void conv_dw_task(void *arg, int64_t t0, int64_t t1) {
    conv_dw_ctx *p = (conv_dw_ctx *)arg;
    int64_t c = p->c, k = c * p->m, wo = p->wo;
    const float *zero = FL_FN(pool_zeros)((size_t)(p->w * c));
    if (!zero) {
        p->status = -1;
        return;
    }
    /* interior columns [ow_lo, ow_hi): every tap inside x */
    int64_t num = p->w - 1 - (p->kw - 1) * p->dw + p->pl;
    int64_t ow_lo = FL_MIN((p->pl + p->sw - 1) / p->sw, wo);
    int64_t ow_hi = FL_MAX(FL_MIN(num < 0 ? 0 : num / p->sw + 1, wo), ow_lo);
    const float *rows[p->kh];
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, ih0 = (t % p->ho) * p->sh - p->pt;
        for (int64_t i = 0; i < p->kh; ++i) {
            int64_t ih = ih0 + i * p->dh;
            rows[i] = ih >= 0 && ih < p->h ? p->x + (n * p->h + ih) * p->w * c : zero;
        }
        float *yrow = p->y + t * wo * k;
        for (int64_t ow = 0; ow < wo; ++ow) {
            if (ow == ow_lo && p->m == 1 && ow_hi > ow_lo) {
                if (p->kh == 3 && p->kw == 3) conv_dw3x3_run(p, rows, ow_lo, ow_hi, yrow);
                else conv_dw_run(p, rows, ow_lo, ow_hi, yrow);
                ow = ow_hi - 1;
                continue;
            }
            int64_t iw0 = ow * p->sw - p->pl, j0, j1;
            pool_taps(iw0, p->dw, p->kw, 0, p->w, &j0, &j1);
            if (p->m == 1) conv_dw_pixel(p, rows, iw0, j0, j1, 0, yrow + ow * k);
            else conv_dw_pixel_mult(p, rows, iw0, j0, j1, yrow + ow * k);
        }
    }
}

/* y[.., c m + q] = f(b + sum_{i, j} x[.., c] wk[i, j, c m + q]): x (N, H, W, C), wk (kh, kw,
 * C m), bias (C m,), y (N, Ho, Wo, C m). */
int FL_FN(depthwise_conv2d)(int64_t n, int64_t h, int64_t w, int64_t c, const float *x,
                            int64_t kh, int64_t kw, int64_t m, int64_t sh, int64_t sw,
                            int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                            int64_t wo, const float *wk, const float *bias, int code,
                            float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || c <= 0 || m <= 0) return 0;
    if (!conv_code_ok(code) || kh < 1 || kw < 1) return -2;
    conv_dw_ctx p = {x, wk, bias, y, h, w, c, kh, kw, m, sh, sw, dh, dw, pt, pl, ho, wo, code, 0,
                     alpha};
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * c * m * kh * kw)), conv_dw_task,
                &p);
    return p.status;
}

/* ---------------------------------------------------------------- transposed convolution */

typedef struct {
    const float *cols, *bias;
    float *y;
    int64_t h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups, kk;
    int code, tiled;   /* tiled: kernel = stride, no crop or dilation, one group */
    float alpha;
    int status;
} conv_t_ctx;

/* o[0:n] += s[0:n] */
FL_INLINE void conv_add(float *o, const float *s, int64_t n) {
    int64_t j = 0;
    for (; j + FL_VW <= n; j += FL_VW) fl_store(o + j, fl_load(o + j) + fl_load(s + j));
    for (; j < n; ++j) o[j] += s[j];
}

/* Each task's bias repeated over an output row (few channels: the row's epilogue runs as one
 * row of Wo cout values rather than Wo rows of cout). */
static __thread fl_buf conv_t_bias_buf;
/* Fewest output channels whose pixels take the epilogue one by one. */
#define CONV_T_WIDE_PIXEL 64

/* yrow = f(yrow + bias) for one output row of wo pixels of cout channels; bias_row: the bias
 * repeated for every pixel (or NULL where there is no bias), for rows of few channels. */
static void conv_t_epilogue(const conv_t_ctx *p, float *yrow, int64_t cout,
                            const float *bias_row) {
    if (!p->bias && p->code == FL_LINEAR) return;
    if (cout >= CONV_T_WIDE_PIXEL)
        FL_FN(rows_bias_act_range)(0, p->wo, cout, yrow, cout, p->bias, p->code, p->alpha, yrow,
                                   cout);
    else
        FL_FN(rows_bias_act_range)(0, 1, p->wo * cout, yrow, 0, bias_row, p->code, p->alpha,
                                   yrow, 0);
}

/* Output rows t = n Ho + oh in [t0, t1): each pixel gathers the columns of its taps, then the
 * row's epilogue. cols: (N H W, groups kk), group g's taps (i, j) at g kk + (i kw + j) co. */
static void conv_t_task(void *arg, int64_t t0, int64_t t1) {
    conv_t_ctx *p = (conv_t_ctx *)arg;
    int64_t co = p->cout_g, cout = co * p->groups, ld = p->kk * p->groups;
    int64_t tap_i[p->kh], tap_ih[p->kh];
    float *bias_row = 0;
    if (p->bias && cout < CONV_T_WIDE_PIXEL) {
        bias_row = fl_buf_floats(&conv_t_bias_buf, (size_t)(p->wo * cout));
        if (!bias_row) {
            p->status = -1;
            return;
        }
        for (int64_t ow = 0; ow < p->wo; ++ow)
            memcpy(bias_row + ow * cout, p->bias, (size_t)cout * sizeof(float));
    }
    for (int64_t t = t0; t < t1; ++t) {
        int64_t n = t / p->ho, oh = t % p->ho, taps = 0;
        for (int64_t i = 0; i < p->kh; ++i) {
            int64_t num = oh + p->ct - i * p->dh;
            if (num < 0 || num % p->sh || num / p->sh >= p->h) continue;
            tap_i[taps] = i;
            tap_ih[taps++] = num / p->sh;
        }
        float *yrow = p->y + t * p->wo * cout;
        if (p->tiled) {
            /* each output pixel has one tap: the row is input row oh / sh's columns of tap row
             * i = oh % sh, kw co floats per input pixel, laid side by side */
            int64_t run = p->kw * co;
            const float *src = p->cols + (n * p->h + oh / p->sh) * p->w * ld + oh % p->sh * run;
            for (int64_t iw = 0; iw < p->w; ++iw) {
                const float *s = src + iw * ld;
                float *o = yrow + iw * run;
                int64_t j = 0;
                for (; j + FL_VW <= run; j += FL_VW) fl_store(o + j, fl_load(s + j));
                for (; j < run; ++j) o[j] = s[j];
            }
            conv_t_epilogue(p, yrow, cout, bias_row);
            continue;
        }
        memset(yrow, 0, (size_t)(p->wo * cout) * sizeof(float));
        for (int64_t ow = 0; ow < p->wo; ++ow) {
            float *o = yrow + ow * cout;
            for (int64_t j = 0; j < p->kw; ++j) {
                int64_t num = ow + p->cl - j * p->dw;
                if (num < 0 || num % p->sw || num / p->sw >= p->w) continue;
                int64_t iw = num / p->sw;
                for (int64_t q = 0; q < taps; ++q) {
                    const float *src = p->cols + ((n * p->h + tap_ih[q]) * p->w + iw) * ld +
                                       (tap_i[q] * p->kw + j) * co;
                    for (int64_t g = 0; g < p->groups; ++g)
                        conv_add(o + g * co, src + g * p->kk, co);
                }
            }
        }
        conv_t_epilogue(p, yrow, cout, bias_row);
    }
}

/* y = f(col2im(x @ w) + b): x (N, H, W, cin), pw each group's w (cin/g, kh kw cout_g) packed,
 * bias (groups cout_g,), y (N, Ho, Wo, groups cout_g). */
int FL_FN(conv_transpose2d)(int64_t n, int64_t h, int64_t w, int64_t cin, const float *x,
                            int64_t kh, int64_t kw, int64_t cout_g, int64_t groups, int64_t sh,
                            int64_t sw, int64_t dh, int64_t dw, int64_t ct, int64_t cl,
                            int64_t ho, int64_t wo, const float *pw, const float *bias,
                            int code, float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout_g <= 0) return 0;
    if (!conv_code_ok(code) || groups < 1 || cin % groups || kh < 1 || kw < 1) return -2;
    int64_t cin_g = cin / groups, kk = kh * kw * cout_g, rows = n * h * w;
    float *cols = fl_buf_floats(&conv_call_buf, (size_t)(rows * kk * groups));
    if (!cols) return -1;
    int64_t pf = fl_packed_floats(cin_g, kk);
    for (int64_t g = 0; g < groups; ++g) {
        int st = FL_FN(matmul)(rows, kk, cin_g, x + g * cin_g, cin, 0, 0, 0, pw + g * pf, 0,
                               FL_LINEAR, 0.0f, cols + g * kk, kk * groups);
        if (st) return st;
    }
    int tiled = kh == sh && kw == sw && (kh == 1 || dh == 1) && (kw == 1 || dw == 1) && ct == 0 &&
                cl == 0 && ho == h * sh && wo == w * sw && groups == 1;
    conv_t_ctx p = {cols, bias, y, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups,
                    kk, code, tiled, alpha, 0};
    int64_t taps = FL_MAX(1, kh * kw / (sh * sw));
    fl_parallel(n * ho, FL_MAX(1, CONV_MIN_SHARE_TAPS / (wo * cout_g * groups * taps)),
                conv_t_task, &p);
    return p.status;
}

/* ------------------------------------------------------- transposed convolution, NCHW planes */
/* A unit is (image n, group g, block of output channels, band of output rows). Per chunk of
 * input rows: cols (co kh kw, rows W) = wt (co kh kw, ci') @ x[n, g ci':, rows] (the sgemm
 * on the NCHW planes as they are, no layout change), then each cols row (co, i, j) of input
 * row ih adds to output row oh = ih sh - ct + i dh held split in its sw column phases
 * (ow = sw t + q), where tap j lands on consecutive t: every add is a contiguous vector add.
 * An output row whose input rows are all done is interleaved into y with bias and
 * activation; the rows in between live in a ring (per channel, the rows one chunk reaches,
 * at most the band's). */

/* Input rows per chunk: about this many sgemm columns (one packed block of b, gemm.c). */
#define CONV_TP_COLUMNS 256
/* A block's cols (co kh kw x chunk columns, 128 KiB) stay in L2 beside its ring rows. */
#define CONV_TP_COLS_FLOATS (INT64_C(1) << 15)

#if FL_VW == 16
#define CONV_ZIP_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define CONV_ZIP_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#elif FL_VW == 8
#define CONV_ZIP_LO 0, 8, 1, 9, 2, 10, 3, 11
#define CONV_ZIP_HI 4, 12, 5, 13, 6, 14, 7, 15
#else
#define CONV_ZIP_LO 0, 4, 1, 5
#define CONV_ZIP_HI 2, 6, 3, 7
#endif

typedef struct {
    const float *x, *wt, *bias;
    float *y;
    int64_t cin, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g, groups;
    int64_t co_blk, co_blocks;  /* output channels per block, blocks per group */
    int64_t bands, band_rows;   /* bands of output rows per (n, g, block), rows per band */
    int64_t chunk;              /* input rows per sgemm */
    int64_t ring, tlen;         /* ring rows per channel; floats per column phase of a row */
    int code, status;
    float alpha;
} conv_tp_ctx;

/* floor(a / b) for b > 0 */
FL_INLINE int64_t conv_floor_div(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* out[0:wo] = f(bias + the row whose sw phases (tlen floats apart) are r: out[sw t + q] =
 * r[q tlen + t]). */
static void conv_tp_finish(const conv_tp_ctx *p, const float *r, float bias, float *out) {
    int64_t wo = p->wo, sw = p->sw, tl = p->tlen;
    fl_vf b = fl_set1(bias);
    int lin = p->code == FL_LINEAR;
    if (sw == 1) {               /* (the phase rows are tlen floats, a multiple of FL_VW) */
        for (int64_t ow = 0; ow < wo; ow += FL_VW) {
            fl_vf a = fl_load(r + ow) + b;
            pool_st(out + ow, lin ? a : rows_vact(a, p->code, p->alpha), wo - ow);
        }
        return;
    }
    if (sw == 2) {               /* the two phases zipped */
        for (int64_t t = 0, ow = 0; ow < wo; t += FL_VW, ow += 2 * FL_VW) {
            fl_vf a = fl_load(r + t) + b, c = fl_load(r + tl + t) + b;
            fl_vf lo = FL_SHUF(a, c, CONV_ZIP_LO), hi = FL_SHUF(a, c, CONV_ZIP_HI);
            pool_st(out + ow, lin ? lo : rows_vact(lo, p->code, p->alpha), wo - ow);
            if (ow + FL_VW < wo)
                pool_st(out + ow + FL_VW, lin ? hi : rows_vact(hi, p->code, p->alpha),
                        wo - ow - FL_VW);
        }
        return;
    }
    for (int64_t ow = 0; ow < wo; ++ow) out[ow] = r[ow % sw * tl + ow / sw] + bias;
    if (!lin)
        for (int64_t ow = 0; ow < wo; ow += FL_VW)
            pool_st(out + ow, rows_vact(pool_ld(out + ow, wo - ow), p->code, p->alpha), wo - ow);
}

/* Ring slot of output row oh zeroed in each of the nco channels. */
FL_INLINE void conv_tp_zero(float *ring, int64_t nco, int64_t L, int64_t row, int64_t oh) {
    for (int64_t co = 0; co < nco; ++co)
        memset(ring + (co * L + oh % L) * row, 0, (size_t)row * sizeof(float));
}

/* Units u = ((n groups + g) co_blocks + cb) bands + band in [u0, u1). */
static void conv_tp_task(void *arg, int64_t u0, int64_t u1) {
    conv_tp_ctx *p = (conv_tp_ctx *)arg;
    int64_t kh = p->kh, kw = p->kw, kk = kh * kw, w = p->w, sw = p->sw, tl = p->tlen;
    int64_t cin_g = p->cin / p->groups, row = sw * tl, L = p->ring;
    int64_t m_most = FL_MIN(p->co_blk, p->cout_g) * kk;
    float *cols = fl_buf_floats(&conv_task_buf,
                                (size_t)(m_most * p->chunk * w + m_most / kk * L * row));
    if (!cols) {
        p->status = -1;
        return;
    }
    float *ring = cols + m_most * p->chunk * w;
    /* tap j: phase q, first phase column f (t = iw + f), input columns [lo, hi) */
    int64_t tq[kw], tf[kw], tlo[kw], thi[kw];
    for (int64_t j = 0; j < kw; ++j) {
        int64_t e = j * p->dw - p->cl, q = e - conv_floor_div(e, sw) * sw;
        int64_t len = (p->wo - q + sw - 1) / sw;    /* columns of phase q */
        tq[j] = q;
        tf[j] = (e - q) / sw;
        tlo[j] = FL_MAX(0, -tf[j]);
        thi[j] = FL_MAX(tlo[j], FL_MIN(w, len - tf[j]));
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t band = u % p->bands, t = u / p->bands;
        int64_t cb = t % p->co_blocks, ng = t / p->co_blocks, g = ng % p->groups;
        int64_t n = ng / p->groups;
        int64_t co0 = cb * p->co_blk, nco = FL_MIN(p->co_blk, p->cout_g - co0), m = nco * kk;
        int64_t oh0 = band * p->band_rows, oh1 = FL_MIN(p->ho, oh0 + p->band_rows);
        if (oh0 >= oh1) continue;
        int64_t ch0 = g * p->cout_g + co0;              /* first output channel */
        const float *xg = p->x + (n * p->cin + g * cin_g) * p->h * w;
        const float *a = p->wt + ch0 * kk * cin_g;
        float *yb = p->y + (n * p->cout_g * p->groups + ch0) * p->ho * p->wo;
        /* input rows with a tap in [oh0, oh1) */
        int64_t ih0 = FL_MAX(0, -conv_floor_div(-(oh0 + p->ct - (kh - 1) * p->dh), p->sh));
        int64_t ih1 = FL_MIN(p->h, conv_floor_div(oh1 - 1 + p->ct, p->sh) + 1);
        int64_t zeroed = oh0, done = oh0;               /* ring rows [done, zeroed) are live */
        for (int64_t r0 = ih0; r0 < ih1 || done < oh1; r0 += p->chunk) {
            int64_t r1 = FL_MIN(r0 + p->chunk, ih1);
            /* rows this chunk adds to: [done, top) (fewer than L); rows under fin are done */
            int64_t top = r0 < ih1 ? FL_MIN(oh1, (r1 - 1) * p->sh - p->ct + (kh - 1) * p->dh + 1)
                                   : zeroed;
            int64_t fin = r1 >= ih1 ? oh1 : FL_MIN(oh1, r1 * p->sh - p->ct);
            for (; zeroed < top; ++zeroed) conv_tp_zero(ring, nco, L, row, zeroed);
            if (r0 < ih1) {
                int64_t nc = (r1 - r0) * w;
                int st = FL_FN(sgemm)(m, nc, cin_g, a, cin_g, xg + r0 * w, p->h * w, 0, 0, cols,
                                      nc);
                if (st) {
                    p->status = st;
                    return;
                }
                for (int64_t co = 0; co < nco; ++co)
                    for (int64_t i = 0; i < kh; ++i)
                        for (int64_t ih = r0; ih < r1; ++ih) {
                            int64_t oh = ih * p->sh - p->ct + i * p->dh;
                            if (oh < oh0 || oh >= oh1) continue;
                            float *o = ring + (co * L + oh % L) * row;
                            const float *c = cols + ((co * kh + i) * kw) * nc + (ih - r0) * w;
                            for (int64_t j = 0; j < kw; ++j, c += nc)
                                conv_add(o + tq[j] * tl + tf[j] + tlo[j], c + tlo[j],
                                         thi[j] - tlo[j]);
                        }
            }
            for (; done < fin; ++done) {
                if (done >= zeroed)                     /* no taps: nothing live in the ring */
                    conv_tp_zero(ring, nco, L, row, zeroed++);
                for (int64_t co = 0; co < nco; ++co)
                    conv_tp_finish(p, ring + (co * L + done % L) * row,
                                   p->bias ? p->bias[ch0 + co] : 0.0f,
                                   yb + (co * p->ho + done) * p->wo);
            }
        }
    }
}

/* y = f(col2im(w^T @ x) + b) on NCHW planes: x (N, cin, H, W), wt each group's w as
 * (cout_g kh kw, cin / groups), bias (groups cout_g,), y (N, groups cout_g, Ho, Wo). */
int FL_FN(conv_transpose2d_nchw)(int64_t n, int64_t cin, int64_t h, int64_t w, const float *x,
                                 int64_t kh, int64_t kw, int64_t cout_g, int64_t groups,
                                 int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t ct,
                                 int64_t cl, int64_t ho, int64_t wo, const float *wt,
                                 const float *bias, int code, float alpha, float *y) {
    if (n <= 0 || ho <= 0 || wo <= 0 || cout_g <= 0) return 0;
    if (!conv_code_ok(code) || groups < 1 || cin % groups || kh < 1 || kw < 1 || sh < 1 ||
        sw < 1 || dh < 1 || dw < 1 || ct < 0 || cl < 0 || h < 1 || w < 1)
        return -2;
    int64_t kk = kh * kw, chunk = FL_MAX(1, FL_MIN(h, CONV_TP_COLUMNS / w));
    int64_t co_blk = FL_MAX(1, FL_MIN(cout_g, CONV_TP_COLS_FLOATS / (kk * chunk * w)));
    int64_t co_blocks = (cout_g + co_blk - 1) / co_blk, base = n * groups * co_blocks;
    int64_t threads = fl_pool_get_threads(), bands = 1;
    if (threads > 1 && base % threads && base < 4 * threads)
        bands = FL_MAX(1, FL_MIN((4 * threads + base - 1) / base, ho / (2 * sh)));
    int64_t band_rows = (ho + bands - 1) / bands;
    conv_tp_ctx p = {x, wt, bias, y, cin, h, w, kh, kw, sh, sw, dh, dw, ct, cl, ho, wo, cout_g,
                     groups, co_blk, co_blocks, bands, band_rows, chunk,
                     FL_MIN(band_rows, chunk * sh + (kh - 1) * dh + 1),
                     ((wo + sw - 1) / sw + FL_VW - 1) / FL_VW * FL_VW, code, 0, alpha};
    int64_t flops = FL_MAX(1, 2 * co_blk * kk * (cin / groups) * h * w / bands);   /* a unit's */
    fl_parallel(base * bands, FL_MAX(1, GEMM_MIN_SHARE_FLOPS / flops), conv_tp_task, &p);
    return p.status;
}

/* ------------------------------------------------------------------- depthwise, NCHW planes */
/* Output plane (n, co) reads input plane (n, co / m) through pool.c's phase-split buffer
 * (pool_plane_gather, zero fill): each tap of FL_VW output columns is one vector load times the
 * tap's weight, four vectors per pass, then bias and activation in registers. */

/* out[0:nv FL_VW] (the last vector cut to `last` lanes) = f(bias + sum over taps t < nt of
 * b[off[t] + 0:nv FL_VW] wt[t]). Even and odd taps add into separate sums: 2 nv independent
 * FMA chains (one chain of nt FMAs per vector left the FMA units idle on their latency). */
FL_INLINE void conv_plane_vecs(const float *b, const int64_t *off, const float *wt, int64_t nt,
                               int nv, float bias, int code, float alpha, float *out,
                               int64_t last) {
    fl_vf acc[4], odd[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        acc[u] = fl_set1(bias);
        odd[u] = fl_set1(0.0f);
    }
    int64_t t = 0;
    for (; t + 1 < nt; t += 2) {
        const float *p0 = b + off[t], *p1 = b + off[t + 1];
        fl_vf w0 = fl_set1(wt[t]), w1 = fl_set1(wt[t + 1]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
            acc[u] += fl_load(p0 + u * FL_VW) * w0;
            odd[u] += fl_load(p1 + u * FL_VW) * w1;
        }
    }
    if (t < nt) {
        const float *p0 = b + off[t];
        fl_vf w0 = fl_set1(wt[t]);
        _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) acc[u] += fl_load(p0 + u * FL_VW) * w0;
    }
    _Pragma("GCC unroll 4") for (int u = 0; u < nv; ++u) {
        fl_vf r = acc[u] + odd[u];
        pool_st(out + u * FL_VW, code == FL_LINEAR ? r : rows_vact(r, code, alpha),
                u == nv - 1 ? last : FL_VW);
    }
}

/* One output row out[0:wo] whose windows start at b (buffer row of window row 0): four vectors
 * per pass, the last 1-4 vectors in one pass. */
FL_INLINE void conv_plane_row(const float *b, const int64_t *off, const float *wt, int64_t nt,
                              int64_t wo, float bias, int code, float alpha, float *out) {
    int64_t ow = 0;
    for (; wo - ow > 4 * FL_VW; ow += 4 * FL_VW)
        conv_plane_vecs(b + ow, off, wt, nt, 4, bias, code, alpha, out + ow, FL_VW);
    int64_t rest = wo - ow, nv = (rest + FL_VW - 1) / FL_VW, last = rest - (nv - 1) * FL_VW;
    if (nv == 4) conv_plane_vecs(b + ow, off, wt, nt, 4, bias, code, alpha, out + ow, last);
    else if (nv == 3) conv_plane_vecs(b + ow, off, wt, nt, 3, bias, code, alpha, out + ow, last);
    else if (nv == 2) conv_plane_vecs(b + ow, off, wt, nt, 2, bias, code, alpha, out + ow, last);
    else conv_plane_vecs(b + ow, off, wt, nt, 1, bias, code, alpha, out + ow, last);
}

typedef struct {
    const float *x, *wk, *bias;
    float *y;
    const int64_t *off;
    pool_plane_plan q;
    int64_t c, h, w, m, kh, kw, sh, sw, dh, pt, pl, ho, wo;
    int code, status;
    float alpha;
} conv_plane_ctx;

/* Units u = (n C m + co) blocks + block in [u0, u1) of depthwise_conv2d_nchw. */
static void conv_plane_task(void *arg, int64_t u0, int64_t u1) {
    conv_plane_ctx *p = (conv_plane_ctx *)arg;
    int64_t nt = p->kh * p->kw, cm = p->c * p->m;
    float *buf = fl_buf_floats(&FL_FN(pool_plane_buf), (size_t)p->q.floats);
    if (!buf) {
        p->status = -1;
        return;
    }
    for (int64_t u = u0; u < u1; ++u) {
        int64_t plane = u / p->q.blocks, oh0 = u % p->q.blocks * p->q.rb;
        int64_t oh1 = FL_MIN(oh0 + p->q.rb, p->ho);
        int64_t n = plane / cm, co = plane % cm;
        int64_t nr = (oh1 - 1 - oh0) * p->sh + (p->kh - 1) * p->dh + 1;
        FL_FN(pool_plane_gather)(p->x + (n * p->c + co / p->m) * p->h * p->w, p->h, p->w,
                                 oh0 * p->sh - p->pt, nr, p->pl, p->sw, p->q.len, 0.0f, buf);
        const float *wt = p->wk + co * nt;
        float bias = p->bias ? p->bias[co] : 0.0f;
        for (int64_t oh = oh0; oh < oh1; ++oh) {
            const float *b = buf + (oh - oh0) * p->sh * p->sw * p->q.len;
            float *out = p->y + (plane * p->ho + oh) * p->wo;
            if (nt == 9) conv_plane_row(b, p->off, wt, 9, p->wo, bias, p->code, p->alpha, out);
            else conv_plane_row(b, p->off, wt, nt, p->wo, bias, p->code, p->alpha, out);
        }
    }
}

/* y[n, c m + q] = f(b + sum_{i, j} x[n, c] window wk[c m + q, i, j]): x (N, C, H, W), wk
 * (C m, kh, kw), bias (C m,), y (N, C m, Ho, Wo). */
int FL_FN(depthwise_conv2d_nchw)(int64_t n, int64_t c, int64_t h, int64_t w, const float *x,
                                 int64_t m, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                 int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho,
                                 int64_t wo, const float *wk, const float *bias, int code,
                                 float alpha, float *y) {
    if (n <= 0 || c <= 0 || m <= 0 || ho <= 0 || wo <= 0) return 0;
    if (!conv_code_ok(code) || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 ||
        pt < 0 || pl < 0)
        return -2;
    pool_plane_plan q = pool_plane_plan_of(n * c * m, kh, kw, sh, sw, dh, dw, ho, wo);
    int64_t *off = (int64_t *)malloc((size_t)(kh * kw) * sizeof(int64_t));
    if (!off) return -1;
    pool_plane_offsets(kh, kw, dh, dw, sw, q.len, off);
    conv_plane_ctx p = {x, wk, bias, y, off, q, c, h, w, m, kh, kw, sh, sw, dh, pt, pl, ho, wo,
                        code, 0, alpha};
    int64_t per_unit = FL_MAX(1, q.rb * wo * kh * kw);
    fl_parallel(n * c * m * q.blocks, FL_MAX(1, CONV_MIN_SHARE_TAPS / per_unit), conv_plane_task,
                &p);
    free(off);
    return p.status;
}
