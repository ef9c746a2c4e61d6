/* What pool.c shares with the other kernel files of its ISA (the convolutions): vector loads
 * and stores of a partial vector, window taps, a thread's row of zeros, and the phase-split
 * buffer of the NCHW plane kernels (pool.c's "NCHW planes"). */
#ifndef FL_POOL_INTERNAL_H
#define FL_POOL_INTERNAL_H
#include "fl.h"
#include "pool.h"
#include "threadpool.h"

/* v[0:nc] (nc < FL_VW: zero lanes after), and its store (fl_load_n / fl_store_n for a
 * vector's tail). */
FL_INLINE fl_vf pool_ld(const float *p, int64_t nc) {
    return nc >= FL_VW ? fl_load(p) : fl_load_n(p, nc);
}

FL_INLINE void pool_st(float *p, fl_vf v, int64_t nc) {
    if (nc >= FL_VW)
        fl_store(p, v);
    else
        fl_store_n(p, v, nc);
}

/* The even and the odd lanes of the 2 FL_VW floats a, b (a first): stride-2 columns, one
 * shuffle each. */
#if FL_VW == 16
#define POOL_EVENS 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define POOL_ODDS 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#elif FL_VW == 8
#define POOL_EVENS 0, 2, 4, 6, 8, 10, 12, 14
#define POOL_ODDS 1, 3, 5, 7, 9, 11, 13, 15
#else
#define POOL_EVENS 0, 2, 4, 6
#define POOL_ODDS 1, 3, 5, 7
#endif
/* Lanes of (a, b) one lane further on (b's first last) and one lane back (a's last first). */
#if FL_VW == 16
#define POOL_NEXT 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
#define POOL_PREV 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30
#elif FL_VW == 8
#define POOL_NEXT 1, 2, 3, 4, 5, 6, 7, 8
#define POOL_PREV 7, 8, 9, 10, 11, 12, 13, 14
#else
#define POOL_NEXT 1, 2, 3, 4
#define POOL_PREV 3, 4, 5, 6
#endif

/* Taps i < k of a window starting at a, step d, that land in [lo, hi): i in [*first, *end). */
FL_INLINE void pool_taps(int64_t a, int64_t d, int64_t k, int64_t lo, int64_t hi,
                         int64_t *first, int64_t *end) {
    int64_t f, e;
    if (d == 1) {  /* undilated windows without a division (per output pixel of an NHWC pool) */
        f = a >= lo ? 0 : lo - a;
        e = a >= hi ? 0 : hi - a;
    } else {
        f = a >= lo ? 0 : (lo - a + d - 1) / d;
        e = a >= hi ? 0 : (hi - a + d - 1) / d;
    }
    f = FL_MIN(f, k);
    e = FL_MIN(e, k);
    *first = f;
    *end = FL_MAX(e, f);
}

/* The NCHW plane kernels take a whole plane as one flat array (pool.c's pool_flat_task,
 * conv_depthwise.c's conv_flat_task) at stride 1 where the output is as wide as the input and
 * rows are at most POOL_FLAT_MAX_W columns (two AVX-512 vectors), planes at most
 * POOL_FLAT_FLOATS outputs, and vectors of at least 8 lanes: there a row's setup and its partial
 * vector weigh most. Wider rows keep the row kernels, whose taps need no lane masks (56-column
 * planes were up to 20 % slower flat, and the 4-lane portable path slower at any width, on the
 * AMD EPYC Zen 5 host). */
#define POOL_FLAT_MAX_W 32
#define POOL_FLAT_FLOATS (1 << 14)
FL_INLINE int pool_flat_fits(int64_t sh, int64_t sw, int64_t w, int64_t wo, int64_t ho) {
    return FL_VW >= 8 && sh == 1 && sw == 1 && wo == w && w <= POOL_FLAT_MAX_W &&
           ho * w <= POOL_FLAT_FLOATS;
}

/* At least `floats` zeros owned by this thread (read only), or NULL. */
const float *FL_FN(pool_zeros)(size_t floats);

/* The NCHW plane kernels' per-thread buffer: a unit's input rows split in column phases. */
extern __thread fl_buf FL_FN(pool_plane_buf);

/* A unit's geometry: output rows per block `rb`, blocks per plane, phase row length `len`
 * (floats, with a vector of slack), floats of a unit's buffer. */
typedef struct {
    int64_t rb, blocks, len, floats;
} pool_plane_plan;

static inline pool_plane_plan pool_plane_plan_of(int64_t planes, int64_t kh, int64_t kw,
                                                 int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                                                 int64_t ho, int64_t wo) {
    pool_plane_plan q;
    int64_t need_w = (wo - 1) * sw + (kw - 1) * dw + 1;
    q.len = (need_w + sw - 1) / sw + FL_VW;
    /* a unit's buffer within 64K floats (L2), and enough units for every thread */
    int64_t rb = FL_MAX(1, ((INT64_C(1) << 16) / (q.len * sw) - (kh - 1) * dh) / sh);
    int64_t want = 4 * (int64_t)fl_pool_get_threads();
    if (planes < want) rb = FL_MIN(rb, FL_MAX(1, ho * planes / want));
    q.rb = FL_MIN(rb, ho);
    q.blocks = (ho + q.rb - 1) / q.rb;
    q.floats = ((q.rb - 1) * sh + (kh - 1) * dh + 1) * sw * q.len;
    return q;
}

/* buf[(r sw + q) len + k] = x[r0 + r, k sw + q - pl] for r < nr, q < sw, k < len (fill where
 * that lies outside the plane x (H, W)). */
void FL_FN(pool_plane_gather)(const float *x, int64_t h, int64_t w, int64_t r0, int64_t nr,
                              int64_t pl, int64_t sw, int64_t len, float fill, float *buf);

/* off[i kw + j] = (i dh sw + (j dw) % sw) len + (j dw) / sw: tap (i, j)'s offset in a unit's
 * buffer from its output column's window. */
static inline void pool_plane_offsets(int64_t kh, int64_t kw, int64_t dh, int64_t dw,
                                      int64_t sw, int64_t len, int64_t *off) {
    for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j)
            off[i * kw + j] = (i * dh * sw + (j * dw) % sw) * len + (j * dw) / sw;
}

FL_POOL_KERNELS(FL_DECLARE)
#endif
