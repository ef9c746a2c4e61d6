# Layout kernels (layout.h).

cdef extern from "dispatch.h" nogil:
    int fl_transpose(int64_t batch, int64_t rows, int64_t cols, const float *src,
                     int64_t src_batch, int64_t src_row, float *dst, int64_t dst_batch,
                     int64_t dst_row)
    int fl_concat_rows(int64_t rows, int64_t parts, const char *const *src,
                       const int64_t *width, char *dst, int64_t dst_row)

#: Most parts concat_rows joins in one call.
MAX_CONCAT_PARTS = 64


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


def concat_rows(list parts, cnp.ndarray out):
    """out[r] = the rows r of ``parts`` one after the other: ``parts`` C-contiguous 2-D arrays
    of one dtype with R rows each, ``out`` C-contiguous (R, sum of their
    widths) of that dtype, at most MAX_CONCAT_PARTS parts. A concatenation along axis k of
    C-ordered arrays is this with R the product of the sizes before k. Threaded. Returns
    ``out``."""
    cdef int64_t n = len(parts), rows = out.shape[0] if out.ndim else 0, k
    if not 0 < n <= MAX_CONCAT_PARTS:
        raise ValueError(f"concat_rows: 1 to {MAX_CONCAT_PARTS} parts, got {n}")
    if out.ndim != 2 or not out.flags.c_contiguous:
        raise ValueError("concat_rows: out must be a C-contiguous 2-D array")
    cdef const char *srcs[64]
    cdef int64_t widths[64]
    cdef int64_t total = 0
    cdef cnp.ndarray a
    for k in range(n):
        a = parts[k]
        if a.dtype != out.dtype or not a.flags.c_contiguous or a.ndim != 2 or a.shape[0] != rows:
            raise ValueError(f"concat_rows: part {k} must be C-contiguous {out.dtype} with "
                             f"{rows} rows, got {(<object>a).dtype} {(<object>a).shape}")
        srcs[k] = <const char *>cnp.PyArray_DATA(a)
        widths[k] = a.shape[1] * a.itemsize
        total += widths[k]
    if total != out.shape[1] * out.itemsize:
        raise ValueError(f"concat_rows: parts hold {total // out.itemsize} values per row, out "
                         f"{out.shape[1]}")
    cdef char *dp = <char *>cnp.PyArray_DATA(out)
    cdef int64_t dst_row = out.shape[1] * out.itemsize
    cdef int st
    with nogil:
        st = fl_concat_rows(rows, n, srcs, widths, dp, dst_row)
    check(st, "concat_rows")
    return out
