/* The block cache behind the arrays fastlayers allocates during a call (arena.c).
 *
 * Each operator's output is a fresh numpy array. Through the C library, a large block freed at
 * the end of one call goes back to the system when anything in the process trims the heap (or
 * was its own mapping), and the next call takes a page fault per 4 KiB to get it again. While
 * a model runs, numpy allocates from this cache instead (its allocator handler, installed for
 * the running thread only): blocks of FL_ARENA_MIN bytes and more are mappings of their own,
 * kept on free up to a limit and handed back for requests of their size, so calls after the
 * first reuse mapped (and warm) pages whatever the rest of the process does. Smaller blocks
 * come from malloc. Every block carries a header of FL_ARENA_HEADER bytes before the pointer
 * it gives out (64-byte aligned for mapped blocks).
 *
 * Thread safe (one mutex, held for a few list operations); a forked child starts with the
 * parent's cached blocks and a fresh lock.
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

/* Most bytes of free blocks kept (default FL_ARENA_LIMIT); a lower limit unmaps the excess. */
#define FL_ARENA_LIMIT ((int64_t)256 << 20)
void fl_arena_set_limit(int64_t bytes);
int64_t fl_arena_limit(void);
/* Unmap every cached block; the bytes released. */
int64_t fl_arena_release(void);
/* stats[0..4]: cached bytes, cached blocks, hits, misses (mapped anew), mapped bytes in use. */
void fl_arena_stats(int64_t stats[5]);
#endif
