/* conv3x3_winograd and winograd_pack (conv.h): Winograd F(2x2, 3x3) (Lavin & Gray 2016): per
 * 2x2 output tile, V = B^T d B of its 4x4 input patch, M[e] = V[e] U[e] as 16 packed sgemms
 * (gemm.c) over a block of tiles, y = A^T M A with the epilogue in registers: 2.25x fewer
 * multiplies than the direct sum; the transforms only add, subtract and halve. F(4x4, 3x3)
 * the same way on 6x6 patches (36 sgemms, 4x fewer multiplies), at about 5x F(2x2)'s rounding
 * error. Shared by blocks of tiles, or, with few tiles, in three steps whose products are
 * shared by e. Compiled once per ISA (kernels.inc). */

#include "conv_internal.h"
#include "gemm_internal.h"
#include "pool_internal.h"
#include "threadpool.h"

/* Winograd tiles per block: about this many floats of V and M (512 KiB) stay in L2, but at
 * least CONV_WINO_MIN_TILES, so that each block's 16 products read U (16 C_in C_out floats,
 * out of L2 for wide layers) for enough rows (small blocks re-read U from memory). */
#define CONV_WINO_FLOATS (INT64_C(1) << 17)
#define CONV_WINO_MIN_TILES 96
/* The two transforms' cost per element of V and M, in flops of the products' sgemm: a call's
 * threads are shared by the work of all three steps (the transforms are about half of a call
 * at 16-32 channels; docs/design.md). */
#define CONV_WINO_TRANSFORM_FLOPS 16

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
    float *v = fl_buf_floats(&FL_FN(conv_task_buf),
                             (size_t)(p->ne * p->block * (p->cin + p->cout)));
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
    int64_t work = 2 * ne * tiles * cin * cout +
                   CONV_WINO_TRANSFORM_FLOPS * ne * tiles * (cin + cout);
    int64_t shares = FL_MIN(fl_pool_get_threads(), FL_MAX(1, work / GEMM_MIN_SHARE_FLOPS));
    /* blocks whose V and M stay in L2; a U out of L2 read for enough rows per block */
    int64_t block = FL_MAX(GEMM_MR, CONV_WINO_FLOATS / (ne * (cin + cout)));
    if (ne * cin * cout > CONV_WINO_FLOATS / 2) block = FL_MAX(block, CONV_WINO_MIN_TILES);
    int64_t blocks = (tiles + block - 1) / block;
    conv_wino_ctx p = {x, pu, bias, y, 0, 0, h, w, cin, cout, pt, pl, ho, wo, th, tw, tiles,
                       0, fl_packed_floats(cin, cout), tile, na, ne, code, 0, alpha};
    if (shares > 1 && blocks < 2 * shares && tiles < 2 * GEMM_MR * shares) {
        /* few tiles (under two blocks of GEMM_MR rows a thread): the three steps shared in
         * turn, the ne products by e (each thread then reads only its part of U) */
        float *buf = fl_buf_floats(&FL_FN(conv_call_buf),
                                   (size_t)(ne * tiles * (cin + cout)));
        if (!buf) return -1;
        p.v = buf;
        p.m = buf + ne * tiles * cin;
        int64_t grain = FL_MAX(1, FL_MIN((tiles + shares - 1) / shares,
                                         CONV_MIN_SHARE_TAPS / (ne * (cin + cout))));
        fl_parallel(tiles, grain, conv_wino_input_task, &p);
        if (!p.status) fl_parallel(ne, 1, conv_wino_products_task, &p);
        if (!p.status) fl_parallel(tiles, grain, conv_wino_output_task, &p);
        return p.status ? p.status : p.nonfinite;
    }
    /* shared by blocks, each thread's V and M in its own buffer (the three steps would pass
     * them between cores): a multiple of the pool's chunks, so that each takes as many */
    if (shares > 1) blocks = (blocks + 4 * shares - 1) / (4 * shares) * (4 * shares);
    p.block = FL_MIN(tiles, ((tiles + blocks - 1) / blocks + GEMM_MR - 1) / GEMM_MR * GEMM_MR);
    blocks = (tiles + p.block - 1) / p.block;
    fl_parallel(blocks, shares > 1 ? 1 : blocks, conv_wino_block_task, &p);
    return p.status ? p.status : p.nonfinite;
}
