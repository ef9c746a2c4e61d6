/* What recurrent.c shares with the other kernel files of its ISA (the quantized LSTM and the
 * elementwise quantization): loads and stores of a partial vector through a copy. */
#ifndef FL_RECURRENT_INTERNAL_H
#define FL_RECURRENT_INTERNAL_H
#include "fl.h"
#include "recurrent.h"

/* cnt (<= FL_VW) floats at p as a vector (zeros after). */
FL_INLINE fl_vf rnn_load(const float *p, int64_t cnt) {
    if (cnt >= FL_VW) return fl_load(p);
    float t[FL_VW] = {0};
    memcpy(t, p, (size_t)cnt * sizeof(float));
    return fl_load(t);
}

FL_INLINE void rnn_store(float *p, fl_vf v, int64_t cnt) {
    if (cnt >= FL_VW) {
        fl_store(p, v);
        return;
    }
    float t[FL_VW];
    fl_store(t, v);
    memcpy(p, t, (size_t)cnt * sizeof(float));
}
#endif
