# Layout kernels (layout.h).

cdef extern from "dispatch.h" nogil:
    int fl_transpose(int64_t batch, int64_t rows, int64_t cols, const float *src,
                     int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,
                     int64_t dst_row)


def transpose(cnp.ndarray src, cnp.ndarray dst):
    """dst[b, c, r] = src[b, r, c] for float32 ``src`` (B, R, C) and ``dst`` (B, C, R), each
    with a contiguous last axis and any whole-float strides on the others (views such as
    ``w.transpose(1, 0, 2)`` included): the last two axes transposed in cache tiles, threaded.
    Returns ``dst``."""
    if src.ndim != 3 or dst.ndim != 3 or dst.shape[0] != src.shape[0] or \
            dst.shape[1] != src.shape[2] or dst.shape[2] != src.shape[1]:
        raise ValueError(f"transpose: expected src (B, R, C) and dst (B, C, R), got "
                         f"{(<object>src).shape} and {(<object>dst).shape}")
    cdef const float *sp = fptr(src, "transpose src")
    cdef float *dp = fptr(dst, "transpose dst")
    for a in (src, dst):
        if any(s % 4 for s in (<object>a).strides):
            raise ValueError("transpose: strides must be whole floats")
    cdef int64_t b = src.shape[0], r = src.shape[1], c = src.shape[2]
    cdef int64_t sb = src.strides[0] // 4, sr = src.strides[1] // 4
    cdef int64_t db = dst.strides[0] // 4, dr = dst.strides[1] // 4
    cdef int st
    with nogil:
        st = fl_transpose(b, r, c, sp, sb, sr, dp, db, dr)
    check(st, "transpose")
    return dst
