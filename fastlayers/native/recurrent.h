/* Recurrent time loops (recurrent.c): SimpleRNN, LSTM (optionally projected) and GRU (reset
 * gate after or before the recurrent product) over a whole sequence in one call, with masks,
 * reverse order, initial states and the outputs of every step or of the last one.
 *
 * Layouts (backends/reference/recurrent.py): x (B, T, I) or ids (B, T) of rows of a table (V, G) (an
 * embedding folded into the layer, read in place); gate blocks of G = blocks * U columns
 * (LSTM i f g o, GRU z r h); recurrent weights (O, G), O = U, or P with an LSTM projection
 * w_hp (U, P).
 *
 * Shares. The units are split into `parts` unit shares (bounds ubounds, (parts + 1) values;
 * the LSTM projection's outputs likewise by qbounds) that meet after each step, or, with
 * row_parts > 1 (parts then 1), the batch into row_parts near-equal batch shares that run
 * the whole sequence each. Weights come packed per unit share: share p's columns of each of
 * the weight set's gate blocks side by side (blocks * n_p columns, n_p = ubounds[p + 1] -
 * ubounds[p]), packed as gemm.h lays out a (k, blocks * n_p) matrix, the shares one after the
 * other (share p at the sum over q < p of fl_rnn_share_floats(k, blocks n_q)). The sets and
 * their blocks: pw_ig (I rows) every block; pw_hg (O rows) RNN 0, LSTM 0-3, GRU 0-2 (reset
 * after) or 0-1 (reset before); pw_hn (U rows) GRU reset before: block 2; pw_hp (U rows) the
 * LSTM projection, one block over qbounds.
 */
#ifndef FL_RECURRENT_H
#define FL_RECURRENT_H
#include <stdint.h>

enum { FL_RNN_SIMPLE, FL_RNN_LSTM, FL_RNN_GRU };

/* Most unit shares of one loop. */
#define FL_RNN_MAX_PARTS 256
/* Most loops of one rnn_loops call. */
#define FL_RNN_MAX_LOOPS 8

typedef struct fl_rnn_args {
    int kind;                        /* FL_RNN_* */
    int reset_after;                 /* GRU: the reset gate multiplies h w_hh + b_hh */
    int act, ract;                   /* activation codes (rows.h): candidate/output, gates */
    int reverse, zero_masked;        /* run t = T-1 .. 0; masked steps output zeros */
    int64_t batch, steps, inputs, units, out;     /* B, T, I, U, O */
    int64_t parts, row_parts;        /* unit shares; batch shares */
    const int64_t *ubounds, *qbounds;             /* (parts + 1) each; qbounds: LSTM projection */
    const float *x;                  /* (B, T, I) C-contiguous, or NULL with ids */
    const int64_t *ids;              /* (B, T), or NULL */
    const float *table;              /* (V, G) with ids: rows of the projection, bias included */
    int64_t table_rows;              /* V with ids, else 0 */
    const float *pw_ig, *b_g;        /* input weights packed per share; bias (G,) or NULL */
    const float *pw_hg, *pw_hn, *pw_hp;           /* recurrent weights packed per share */
    const float *b_hg;               /* GRU reset after: recurrent bias (G,) or NULL */
    const uint8_t *mask;             /* (B, T), nonzero: a valid step; NULL: all valid */
    float *h;                        /* (B, O): the initial state in, the final state out */
    float *c;                        /* (B, U) LSTM cell: initial in, final out */
    float *y;                        /* (B, T, O) every step's output, or NULL */
    float *last;                     /* (B, O): the carried output (y0 or zeros) in, last out */
} fl_rnn_args;

/* Floats of one share's packed weights: k rows of `cols` columns (gemm.h's layout). */
static inline int64_t fl_rnn_share_floats(int64_t k, int64_t cols) {
    return k * ((cols + 31) / 32) * 32;
}

/* rnn_loop(a): the loop described by `a` (0; -1: a work buffer could not be allocated; -2:
 * bad arguments). rnn_loops(a, n): the n independent loops a[0:n] (the directions of a
 * bidirectional layer), at once on the pool's threads, one thread each (each loop's own
 * shares run on that thread); the first failing loop's status. */
#define FL_RECURRENT_KERNELS(X)                                                               \
    X(int, rnn_loop, (const fl_rnn_args *a), (a))                                             \
    X(int, rnn_loops, (const fl_rnn_args *a, int64_t n), (a, n))
#endif
