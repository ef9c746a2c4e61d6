/* The block arena behind the arrays fastlayers allocates during a call (arena.h).
 *
 * Blocks of FL_ARENA_MIN bytes and more are carved out of regions mapped for the arena (at
 * least ARENA_REGION bytes each): best fit over the free blocks, split when the rest is worth
 * keeping, merged with free neighbours when freed (boundary tags: each block records its own
 * size and its predecessor's). A region whose blocks are all free is unmapped only while more
 * than the limit is free, so the pages a call touched stay mapped for the next one: after the
 * first call a model's allocations find their memory resident, at a footprint near the call's
 * peak. Smaller blocks come from malloc with the same header (size 0).
 */
#include "arena.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#define ARENA_MAPS 1
#else
#define ARENA_MAPS 0
#endif

/* Smallest region mapped (larger requests get a region of their own size). */
#define ARENA_REGION ((size_t)64 << 20)
/* Regions are multiples of this (the huge page size on x86-64 Linux). */
#define ARENA_REGION_ALIGN ((size_t)2 << 20)
/* A block is split when the rest would be at least this many bytes. */
#define ARENA_SPLIT_MIN ((size_t)64 << 10)

typedef struct arena_region arena_region;

/* The header before every pointer handed out (FL_ARENA_HEADER bytes). */
typedef struct arena_block {
    size_t size;                        /* bytes of the block, header included; 0: malloc'ed */
    size_t prev_size;                   /* the size of the block before it (0: region start) */
    arena_region *region;
    struct arena_block *next_free, *prev_free;
    size_t user;                        /* bytes asked for */
    size_t is_free;
    size_t pad;
} arena_block;

_Static_assert(sizeof(arena_block) == FL_ARENA_HEADER, "the header keeps 64-byte alignment");

struct arena_region {
    size_t bytes;                       /* mapped, the region's own header included */
    arena_region *next, *prev;
    char pad[FL_ARENA_HEADER - 3 * sizeof(void *)];
};

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t arena_fork_once = PTHREAD_ONCE_INIT;
static arena_region *arena_regions = 0;
static arena_block *arena_free_list = 0;
static int64_t arena_mapped = 0, arena_in_use = 0, arena_free_blocks = 0;
static int64_t arena_hits = 0, arena_misses = 0;
static int64_t arena_max = FL_ARENA_LIMIT;

static void arena_child(void) { pthread_mutex_init(&arena_lock, 0); }
static void arena_prepare(void) { pthread_mutex_lock(&arena_lock); }
static void arena_parent(void) { pthread_mutex_unlock(&arena_lock); }
static void arena_at_fork(void) { pthread_atfork(arena_prepare, arena_parent, arena_child); }

static void arena_acquire(void) {
    pthread_once(&arena_fork_once, arena_at_fork);
    pthread_mutex_lock(&arena_lock);
}

static void *arena_map(size_t bytes) {
#if ARENA_MAPS
    void *p = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : p;
#else
    return aligned_alloc(64, bytes);
#endif
}

static void arena_unmap(void *p, size_t bytes) {
#if ARENA_MAPS
    munmap(p, bytes);
#else
    (void)bytes;
    free(p);
#endif
}

static char *region_end(arena_region *r) { return (char *)r + r->bytes; }

static arena_block *block_next(arena_block *b) {
    char *n = (char *)b + b->size;
    return n < region_end(b->region) ? (arena_block *)n : 0;
}

static void free_push(arena_block *b) {
    b->is_free = 1;
    b->prev_free = 0;
    b->next_free = arena_free_list;
    if (arena_free_list) arena_free_list->prev_free = b;
    arena_free_list = b;
    ++arena_free_blocks;
}

static void free_remove(arena_block *b) {
    if (b->prev_free) b->prev_free->next_free = b->next_free;
    else arena_free_list = b->next_free;
    if (b->next_free) b->next_free->prev_free = b->prev_free;
    b->is_free = 0;
    b->next_free = b->prev_free = 0;
    --arena_free_blocks;
}

/* A new region with room for a block of `need` bytes, as one free block (lock held). */
static arena_block *region_new(size_t need) {
    size_t bytes = need + sizeof(arena_region) > ARENA_REGION ? need + sizeof(arena_region)
                                                              : ARENA_REGION;
    bytes = (bytes + ARENA_REGION_ALIGN - 1) / ARENA_REGION_ALIGN * ARENA_REGION_ALIGN;
    arena_region *r = (arena_region *)arena_map(bytes);
    if (!r) return 0;
    r->bytes = bytes;
    r->prev = 0;
    r->next = arena_regions;
    if (arena_regions) arena_regions->prev = r;
    arena_regions = r;
    arena_mapped += (int64_t)bytes;
    arena_block *b = (arena_block *)(r + 1);
    b->size = bytes - sizeof(arena_region);
    b->prev_size = 0;
    b->region = r;
    free_push(b);
    return b;
}

/* Unmap region r, whose blocks are all free: one free block b (lock held). */
static void region_drop(arena_region *r, arena_block *b) {
    free_remove(b);
    if (r->prev) r->prev->next = r->next;
    else arena_regions = r->next;
    if (r->next) r->next->prev = r->prev;
    arena_mapped -= (int64_t)r->bytes;
}

static int region_whole(arena_block *b) {
    return b->prev_size == 0 && (char *)b + b->size == region_end(b->region);
}

/* Unmap wholly free regions while more than the limit is free; returns the bytes (lock held;
 * the regions are unmapped after the lock is released, listed in `out`). */
static int arena_shed(arena_region **out, int most, int64_t limit) {
    int n = 0;
    for (arena_block *b = arena_free_list, *next; b && n < most; b = next) {
        next = b->next_free;
        if (arena_mapped - arena_in_use <= limit) break;
        if (!region_whole(b)) continue;
        arena_region *r = b->region;
        region_drop(r, b);
        out[n++] = r;
    }
    return n;
}

static void arena_unmap_all(arena_region **rs, int n) {
    for (int i = 0; i < n; ++i) arena_unmap(rs[i], rs[i]->bytes);
}

static void *arena_take(size_t user, int zero) {
    size_t need = (user + FL_ARENA_HEADER + 63) / 64 * 64;
    arena_acquire();
    arena_block *best = 0;
    for (arena_block *b = arena_free_list; b; b = b->next_free)
        if (b->size >= need && (!best || b->size < best->size)) {
            best = b;
            if (b->size == need) break;
        }
    int fresh = 0;
    if (best) {
        ++arena_hits;
    } else {
        ++arena_misses;
        best = region_new(need);
        fresh = ARENA_MAPS;          /* fresh mappings read as zeros */
        if (!best) {
            pthread_mutex_unlock(&arena_lock);
            return 0;
        }
    }
    free_remove(best);
    if (best->size - need >= ARENA_SPLIT_MIN) {
        arena_block *rest = (arena_block *)((char *)best + need);
        rest->size = best->size - need;
        rest->prev_size = need;
        rest->region = best->region;
        arena_block *after = block_next(best);
        if (after) after->prev_size = rest->size;
        best->size = need;
        free_push(rest);
    }
    best->user = user;
    arena_in_use += (int64_t)best->size;
    pthread_mutex_unlock(&arena_lock);
    char *p = (char *)(best + 1);
    if (zero && !fresh) memset(p, 0, user);
    return p;
}

static void arena_give(arena_block *b) {
    arena_region *drop[8];
    arena_acquire();
    arena_in_use -= (int64_t)b->size;
    arena_block *next = block_next(b);
    if (next && next->is_free) {
        free_remove(next);
        b->size += next->size;
    }
    if (b->prev_size) {
        arena_block *prev = (arena_block *)((char *)b - b->prev_size);
        if (prev->is_free) {
            free_remove(prev);
            prev->size += b->size;
            b = prev;
        }
    }
    arena_block *after = block_next(b);
    if (after) after->prev_size = b->size;
    free_push(b);
    int n = region_whole(b) ? arena_shed(drop, 8, arena_max) : 0;
    pthread_mutex_unlock(&arena_lock);
    arena_unmap_all(drop, n);
}

static void *arena_alloc(size_t bytes, int zero) {
    if (bytes > SIZE_MAX / 2) return 0;
    if (bytes + FL_ARENA_HEADER >= FL_ARENA_MIN) return arena_take(bytes, zero);
    size_t total = bytes + FL_ARENA_HEADER;
    arena_block *b = zero ? (arena_block *)calloc(1, total) : (arena_block *)malloc(total);
    if (!b) return 0;
    b->size = 0;
    b->user = bytes;
    return b + 1;
}

void *fl_arena_malloc(void *ctx, size_t bytes) {
    (void)ctx;
    return arena_alloc(bytes, 0);
}

void *fl_arena_calloc(void *ctx, size_t count, size_t size) {
    (void)ctx;
    if (size && count > SIZE_MAX / size) return 0;
    return arena_alloc(count * size, 1);
}

void fl_arena_free(void *ctx, void *p, size_t bytes) {
    (void)ctx;
    (void)bytes;
    if (!p) return;
    arena_block *b = (arena_block *)p - 1;
    if (b->size) arena_give(b);
    else free(b);
}

void *fl_arena_realloc(void *ctx, void *p, size_t bytes) {
    if (!p) return fl_arena_malloc(ctx, bytes);
    arena_block *b = (arena_block *)p - 1;
    if (!b->size && bytes + FL_ARENA_HEADER < FL_ARENA_MIN) {
        arena_block *nb = (arena_block *)realloc(b, bytes + FL_ARENA_HEADER);
        if (!nb) return 0;
        nb->user = bytes;
        return nb + 1;
    }
    if (b->size && bytes + FL_ARENA_HEADER <= b->size) {
        b->user = bytes;
        return p;
    }
    void *q = fl_arena_malloc(ctx, bytes);
    if (q) {
        memcpy(q, p, b->user < bytes ? b->user : bytes);
        fl_arena_free(ctx, p, b->user);
    }
    return q;
}

void fl_arena_set_limit(int64_t bytes) {
    arena_region *drop[64];
    int n;
    arena_acquire();
    arena_max = bytes < 0 ? 0 : bytes;
    do {
        n = arena_shed(drop, 64, arena_max);
        pthread_mutex_unlock(&arena_lock);
        arena_unmap_all(drop, n);
        arena_acquire();
    } while (n == 64);
    pthread_mutex_unlock(&arena_lock);
}

int64_t fl_arena_limit(void) {
    arena_acquire();
    int64_t v = arena_max;
    pthread_mutex_unlock(&arena_lock);
    return v;
}

int64_t fl_arena_release(void) {
    arena_region *drop[64];
    int64_t released = 0;
    int n;
    do {
        arena_acquire();
        n = arena_shed(drop, 64, -1);
        pthread_mutex_unlock(&arena_lock);
        for (int i = 0; i < n; ++i) released += (int64_t)drop[i]->bytes;
        arena_unmap_all(drop, n);
    } while (n == 64);
    return released;
}

void fl_arena_stats(int64_t stats[6]) {
    arena_acquire();
    stats[0] = arena_mapped - arena_in_use;
    stats[1] = arena_free_blocks;
    stats[2] = arena_hits;
    stats[3] = arena_misses;
    stats[4] = arena_in_use;
    stats[5] = arena_mapped;
    pthread_mutex_unlock(&arena_lock);
}
