/* What qgemm.c shares with the other kernel files of its ISA (the quantized LSTM): the prepared
 * operand a, how its rows are laid out and filled, which tiles take it, and the threaded
 * product (defined once in qgemm.c). */
#ifndef FL_QGEMM_INTERNAL_H
#define FL_QGEMM_INTERNAL_H
#include "dispatch.h"
#include "fl.h"
#include "qgemm.h"

#define QGEMM_AMX_MIN_ROWS 8       /* rows from which a product takes AMX tiles */

/* The operand a prepared for the tiles. */
typedef struct {
    const void *rows;   /* row i at rows + i * lda values (4 kq of them read): uint8 where vnni,
                         * else int16 */
    int64_t lda;
    const int32_t *ra;  /* sum_k a_u[i, k] */
    const int32_t *za;  /* A[i]: the zero point of a_u */
    int64_t kq;         /* quads of k */
    int vnni;
    int amx;            /* the tiles are AMX's (qgemm_amx): the rows are 64-byte multiples long,
                         * zero past k, and a multiple of 16 of them are readable */
} qgemm_a;

/* Whether a product of m rows (prepared for vpdpbusd where vnni) takes AMX tiles: on the
 * avx512 path where fl_amx (dispatch.h) and from QGEMM_AMX_MIN_ROWS rows. */
FL_INLINE int qgemm_amx(int64_t m, int vnni) {
#if defined(FL_ISA_AVX512)
    return vnni && fl_amx && m >= QGEMM_AMX_MIN_ROWS;
#else
    (void)m, (void)vnni;
    return 0;
#endif
}

/* Values in one prepared row of k values: whole quads, whole 64-byte tile rows on AMX. */
FL_INLINE int64_t qgemm_row_width(int64_t k, int amx) {
    return amx ? (k + 63) / 64 * 64 : (k + 3) / 4 * 4;
}

/* Prepared rows for m rows: on AMX a multiple of the tiles' 16 (the rows past m zero). */
FL_INLINE int64_t qgemm_row_count(int64_t m, int amx) {
    return amx ? (m + 15) / 16 * 16 : m;
}

/* The prepared rows' value (a_u) at index idx: uint8 where vnni, else int16. */
FL_INLINE void qgemm_put(void *rows, int vnni, int64_t idx, int32_t v) {
    if (vnni) ((uint8_t *)rows)[idx] = (uint8_t)v;
    else ((int16_t *)rows)[idx] = (int16_t)v;
}

/* Bytes of the prepared rows of m rows of k values (64-byte multiple). */
FL_INLINE size_t qgemm_rows_bytes(int64_t m, int64_t k, int vnni, int amx) {
    size_t bytes = (size_t)(qgemm_row_count(m, amx) * qgemm_row_width(k, amx)) * (vnni ? 1 : 2);
    return (bytes + 63) / 64 * 64;
}

/* Whether this path's tiles run vpdpbusd now. */
FL_INLINE int qgemm_vnni(void) {
#if defined(FL_ISA_AVX512) || defined(FL_ISA_AVX2)
    return fl_vnni;
#else
    return 0;
#endif
}

/* Puts count copies of v at index idx of the prepared rows. */
FL_INLINE void qgemm_put_fill(void *rows, int vnni, int64_t idx, int32_t v, int64_t count) {
    if (vnni) memset((uint8_t *)rows + idx, v, (size_t)count);
    else
        for (int64_t p = 0; p < count; ++p) ((int16_t *)rows)[idx + p] = (int16_t)v;
}

/* Configure (on) or release (off) the calling thread's AMX tiles for products of a (nothing
 * where a is not on AMX tiles): around a run of qgemm_panels calls. */
void FL_FN(qgemm_tiles)(const qgemm_a *a, int on);
/* Columns of panels p0:p1 (FL_QPANEL columns each) of the product of prepared a (m rows) and
 * packed b, on the calling thread, its tiles configured (qgemm_tiles): a share of a product
 * the caller splits itself. */
void FL_FN(qgemm_panels)(const qgemm_a *a, int64_t m, int64_t n, int64_t k, const int8_t *pb,
                         int64_t p0, int64_t p1, const fl_qout *o, void *c, int64_t ldc);
/* The product of prepared a (m rows) and packed b on the pool's threads. */
void FL_FN(qgemm_run)(const qgemm_a *a, int64_t m, int64_t n, int64_t k, const int8_t *pb,
                      const fl_qout *o, void *c, int64_t ldc);
#endif
