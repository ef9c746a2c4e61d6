/* What gemm.c shares with the other kernel files of its ISA (convolutions and attention run on
 * its register tile): the tile's shape, the threading constants, the tile itself (defined
 * once in gemm.c) and this ISA's gemm kernels. */
#ifndef FL_GEMM_INTERNAL_H
#define FL_GEMM_INTERNAL_H
#include "fl.h"
#include "gemm.h"

/* Rows of the register tile (wide tiles: two vectors of columns). */
#if FL_VW == 16
#define GEMM_MR 14
#else
#define GEMM_MR 6
#endif
#define GEMM_TN (2 * FL_VW)          /* columns of a tile */

/* Most rows of a narrow tile (one vector of accumulators per row). AVX2: twice the wide tile's,
 * so that its accumulators fill the registers as the wide tile's two do. AVX-512: as many as the
 * wide tile's; each row's offset in A takes a general register, and with 28 rows GCC reloaded
 * 15 of them from the stack at every step (44 loads per 28 multiply-adds: the load ports, not
 * the FMA units, set the rate). */
#if FL_VW == 16
#define GEMM_NARROW_MR GEMM_MR
#else
#define GEMM_NARROW_MR (2 * GEMM_MR)
#endif

/* Fewest multiply-adds (x2) in one thread's share of a product. */
#define GEMM_MIN_SHARE_FLOPS (INT64_C(1) << 21)
/* Work (2 flops per multiply-add; a thin product's stream of b counted as rows) worth waking a
 * sleeping worker for by itself (fl_parallel_part: a smaller job counts its share of it):
 * waking one cost the caller 20 us on a 2-vCPU KVM guest (Intel Xeon family 6 model 167),
 * about what 2^22 flops of a product take at one thread; from 2^23 the second thread saves
 * more than that. */
#define GEMM_WAKE_FLOPS (INT64_C(1) << 23)
/* A product's or convolution's worth in thousandths of a wake (fl_parallel_part). */
FL_INLINE int64_t gemm_wake_permille(int64_t flops) {
    return flops >= GEMM_WAKE_FLOPS ? 1000 : flops * 1000 / GEMM_WAKE_FLOPS;
}
/* Output floats per chunk whose epilogue runs while the chunk is in L2 (256 KiB). */
#define GEMM_CHUNK_FLOATS (1 << 16)

/* Rows of the next tile over ncols columns when `left` rows remain: the fewest tiles that hold
 * them (of at most MR rows, the narrow tile's for ncols <= FL_VW), near-equal. A short last tile
 * reads the same panel of b for few rows: 32 rows as 14 + 14 + 4 ran 1-7 % slower than as
 * 11 + 11 + 10 (docs/design.md, "Tiles of near-equal rows"). */
FL_INLINE int64_t gemm_next_rows_over(int64_t left, int64_t ncols) {
    int64_t mr = ncols <= FL_VW ? GEMM_NARROW_MR : GEMM_MR;
    int64_t tiles = (left + mr - 1) / mr;
    return (left + tiles - 1) / tiles;
}

/* Lines of memory a tile asks L2 for while it runs, one per step of k (the next block of a
 * product's packed b, gemm.c's gemm_block): `lines` lines of 64 bytes from `line`. */
typedef struct {
    const char *line;
    int64_t lines;
} gemm_prefetch;
#define GEMM_NO_PREFETCH ((gemm_prefetch){0, 0})

/* The bias and activation a product's caller asks of its tiles (gemm_tile_epi): bias NULL for
 * none, code an elementwise activation (not the softmax codes). */
typedef struct {
    const float *bias;
    int code;
    float alpha;
} gemm_epi;

/* c[0:rows, 0:nr] (+)= sum over i < kh, p < kc of a[r ars + i ari + p] pb[(i kc + p) 32 + 0:nr]
 * (pb packed, gemm.h): the tile of exactly `rows` rows over nr <= GEMM_TN columns, the wide
 * tile (rows <= GEMM_MR) or for nr <= FL_VW the narrow one (rows <= GEMM_NARROW_MR); kh > 1
 * sums the window rows of an implicit convolution (ari apart), kh 1 is the plain product; the
 * wide tile brings pf's lines into L2 meanwhile (GEMM_NO_PREFETCH: none). Then, where epi is
 * not NULL (its sums final, nr a multiple of FL_VW), the tile's epilogue (gemm_tile_epi's
 * bits): the wide tile adds a bias and applies ReLU to its sums before it stores them. */
void FL_FN(gemm_tile_rows)(int rows, int64_t kh, int64_t ari, int64_t kc, const float *a,
                           int64_t ars, const float *pb, float *c, int64_t ldc, int nr,
                           int accumulate, gemm_prefetch pf, const gemm_epi *epi);

/* c[r, 0:nr] = f(c[r, 0:nr] + bias[0:nr]) for r < rows (rows ldc floats apart, nr <= GEMM_TN
 * a multiple of FL_VW): a tile's epilogue once its sums are final, while it is in L1; the same
 * bits as the row epilogue (rows_bias_act_range) gives. Narrower rows keep the row epilogue,
 * whose flat path runs them as one array (a masked vector per row cost more than the pass it
 * saved: docs/design.md, "GEMM"). */
void FL_FN(gemm_tile_epi)(int64_t rows, float *c, int64_t ldc, int nr, const gemm_epi *epi);

FL_GEMM_KERNELS(FL_DECLARE)
#endif
