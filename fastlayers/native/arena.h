/* The block arena behind the arrays fastlayers allocates during a call (arena.c).
 *
 * Each operator's output is a fresh numpy array. Through the C library, a large block freed at
 * the end of one call goes back to the system when anything in the process trims the heap (or
 * was a mapping of its own), and the next call takes a page fault per 4 KiB to get it again.
 * While a model runs, numpy allocates from this arena instead (its allocator handler,
 * installed for the running thread only): blocks of FL_ARENA_MIN bytes and more are carved
 * out of regions the arena maps and keeps, so calls after the first reuse mapped (and warm)
 * pages whatever the rest of the process does, at a footprint near one call's peak. Smaller
 * blocks come from malloc. Every block carries a header of FL_ARENA_HEADER bytes before the
 * pointer it gives out (64-byte aligned for the arena's blocks).
 *
 * Thread safe (one mutex, held for a scan of the free blocks and a few list operations); a
 * forked child starts with the parent's regions and a fresh lock.
 */
#ifndef FL_ARENA_H
#define FL_ARENA_H
#include <stddef.h>
#include <stdint.h>

#define FL_ARENA_MIN ((size_t)256 << 10)
#define FL_ARENA_HEADER 64

/* numpy's PyDataMemAllocator functions (ctx unused). */
void *fl_arena_malloc(void *ctx, size_t bytes);
void *fl_arena_calloc(void *ctx, size_t count, size_t size);
void *fl_arena_realloc(void *ctx, void *p, size_t bytes);
void fl_arena_free(void *ctx, void *p, size_t bytes);

/* Most free bytes kept mapped (default FL_ARENA_LIMIT): a region whose blocks are all free is
 * unmapped while more is free; a lower limit unmaps such regions at once. */
#define FL_ARENA_LIMIT ((int64_t)256 << 20)
void fl_arena_set_limit(int64_t bytes);
int64_t fl_arena_limit(void);
/* Unmap every region whose blocks are all free; the bytes released. */
int64_t fl_arena_release(void);
/* stats[0..5]: free bytes, free blocks, hits, misses (a region mapped anew), bytes in use,
 * bytes mapped. */
void fl_arena_stats(int64_t stats[6]);
#endif
