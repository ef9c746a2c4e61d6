/* The C library heap's retention of freed memory (heap.h).
 *
 * Every operator allocates its output anew. glibc serves blocks over its mmap threshold (128 KiB
 * until a larger block is freed) with one mmap each and trims its heap's free top beyond twice
 * that, so the next call gets fresh pages and takes a page fault per 4 KiB on first touch: in a
 * VM about 1 ms per MiB, as long as the copy itself for a reshape of 1 MiB. Raising both
 * thresholds keeps those pages mapped and reused (what an arena allocator does). */
#include "heap.h"

#if defined(__GLIBC__)
#include <malloc.h>

int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold) {
    if (mmap_threshold < 0 || trim_threshold < 0 || mmap_threshold > INT32_MAX ||
        trim_threshold > INT32_MAX)
        return 0;
    return mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold) == 1 &&
           mallopt(M_TRIM_THRESHOLD, (int)trim_threshold) == 1;
}
#else
int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold) {
    (void)mmap_threshold;
    (void)trim_threshold;
    return 0;
}
#endif
