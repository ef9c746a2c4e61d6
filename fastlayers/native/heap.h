/* The C library heap (heap.c): how much freed memory it keeps for the next allocations.
 *
 * heap_retain(mmap_threshold, trim_threshold): with glibc, blocks under mmap_threshold bytes
 *   come from the heap (not one mmap each, unmapped when freed) and up to trim_threshold bytes
 *   free at its top stay mapped; returns 1, or 0 where the C library has no such settings. */
#ifndef FL_HEAP_H
#define FL_HEAP_H
#include <stdint.h>

int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold);
#endif
