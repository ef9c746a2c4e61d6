/* The block cache behind the arrays fastlayers allocates during a call (arena.h). */
#include "arena.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define ARENA_MAPS 1
#else
#define ARENA_MAPS 0
#endif

/* Most free blocks kept (their sizes are scanned on each large allocation). */
#define ARENA_SLOTS 1024
/* A cached block serves a request of up to 1/ARENA_FIT_SLACK fewer bytes. */
#define ARENA_FIT_SLACK 8

#define FL_MIN_SIZE(a, b) ((a) < (b) ? (a) : (b))

/* Before each pointer handed out: the bytes of its mapping (0: from malloc) and the bytes
 * asked for. */
typedef struct {
    size_t mapped, size;
} arena_header;

typedef struct {
    size_t bytes;
    char *base;
} arena_slot;

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t arena_fork_once = PTHREAD_ONCE_INIT;
static arena_slot arena_slots[ARENA_SLOTS];   /* oldest first */
static int arena_count = 0;
static int64_t arena_cached = 0, arena_hits = 0, arena_misses = 0, arena_in_use = 0;
static int64_t arena_max = FL_ARENA_LIMIT;

static void arena_child(void) { pthread_mutex_init(&arena_lock, 0); }
static void arena_prepare(void) { pthread_mutex_lock(&arena_lock); }
static void arena_parent(void) { pthread_mutex_unlock(&arena_lock); }
static void arena_at_fork(void) { pthread_atfork(arena_prepare, arena_parent, arena_child); }

static void arena_lock_held(void) {
    pthread_once(&arena_fork_once, arena_at_fork);
    pthread_mutex_lock(&arena_lock);
}

static size_t arena_page(void) {
#if ARENA_MAPS
    static size_t page = 0;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
#else
    return 4096;
#endif
}

static char *arena_map(size_t bytes) {
#if ARENA_MAPS
    void *p = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : (char *)p;
#else
    return (char *)aligned_alloc(64, bytes);
#endif
}

static void arena_unmap(char *base, size_t bytes) {
#if ARENA_MAPS
    munmap(base, bytes);
#else
    (void)bytes;
    free(base);
#endif
}

/* Drop slot i (lock held). */
static void arena_remove(int i) {
    arena_cached -= (int64_t)arena_slots[i].bytes;
    memmove(arena_slots + i, arena_slots + i + 1, (size_t)(arena_count - i - 1) * sizeof(arena_slot));
    --arena_count;
}

/* A block of `bytes` mapped bytes (a multiple of the page) and whether it came from the cache. */
static char *arena_take(size_t bytes, int *cached) {
    arena_lock_held();
    int best = -1;
    for (int i = 0; i < arena_count; ++i) {
        size_t b = arena_slots[i].bytes;
        if (b >= bytes && b - bytes <= bytes / ARENA_FIT_SLACK &&
            (best < 0 || b < arena_slots[best].bytes))
            best = i;
    }
    char *base = 0;
    if (best >= 0) {
        base = arena_slots[best].base;
        bytes = arena_slots[best].bytes;
        arena_remove(best);
        ++arena_hits;
    } else {
        ++arena_misses;
    }
    arena_in_use += (int64_t)bytes;
    pthread_mutex_unlock(&arena_lock);
    *cached = base != 0;
    if (!base) {
        base = arena_map(bytes);
        if (!base) {
            arena_lock_held();
            arena_in_use -= (int64_t)bytes;
            pthread_mutex_unlock(&arena_lock);
            return 0;
        }
    }
    ((arena_header *)base)->mapped = bytes;
    return base;
}

/* Keep a mapped block for later, evicting the oldest ones over the limit, or unmap it. */
static void arena_give(char *base, size_t bytes) {
    arena_slot evicted[16];
    int n_evicted = 0, keep;
    arena_lock_held();
    arena_in_use -= (int64_t)bytes;
    keep = (int64_t)bytes <= arena_max;
    while (keep && arena_count > 0 && n_evicted < 16 &&
           (arena_cached + (int64_t)bytes > arena_max || arena_count == ARENA_SLOTS)) {
        evicted[n_evicted++] = arena_slots[0];
        arena_remove(0);
    }
    keep = keep && arena_cached + (int64_t)bytes <= arena_max && arena_count < ARENA_SLOTS;
    if (keep) {
        arena_slots[arena_count].bytes = bytes;
        arena_slots[arena_count].base = base;
        ++arena_count;
        arena_cached += (int64_t)bytes;
    }
    pthread_mutex_unlock(&arena_lock);
    for (int i = 0; i < n_evicted; ++i) arena_unmap(evicted[i].base, evicted[i].bytes);
    if (!keep) arena_unmap(base, bytes);
}

static void *arena_alloc(size_t bytes, int zero) {
    if (bytes > SIZE_MAX - FL_ARENA_HEADER - arena_page()) return 0;
    size_t total = bytes + FL_ARENA_HEADER;
    if (total < FL_ARENA_MIN) {
        char *base = zero ? (char *)calloc(1, total) : (char *)malloc(total);
        if (!base) return 0;
        ((arena_header *)base)->mapped = 0;
        ((arena_header *)base)->size = bytes;
        return base + FL_ARENA_HEADER;
    }
    size_t page = arena_page();
    int cached;
    char *base = arena_take((total + page - 1) / page * page, &cached);
    if (!base) return 0;
    ((arena_header *)base)->size = bytes;
    if (zero && cached) memset(base + FL_ARENA_HEADER, 0, bytes);
    return base + FL_ARENA_HEADER;
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
    char *base = (char *)p - FL_ARENA_HEADER;
    size_t mapped = ((arena_header *)base)->mapped;
    if (mapped) arena_give(base, mapped);
    else free(base);
}

void *fl_arena_realloc(void *ctx, void *p, size_t bytes) {
    if (!p) return fl_arena_malloc(ctx, bytes);
    char *base = (char *)p - FL_ARENA_HEADER;
    arena_header *h = (arena_header *)base;
    if (!h->mapped && bytes + FL_ARENA_HEADER < FL_ARENA_MIN) {
        char *nb = (char *)realloc(base, bytes + FL_ARENA_HEADER);
        if (!nb) return 0;
        ((arena_header *)nb)->size = bytes;
        return nb + FL_ARENA_HEADER;
    }
    if (h->mapped && bytes + FL_ARENA_HEADER <= h->mapped) {
        h->size = bytes;
        return p;
    }
    void *q = fl_arena_malloc(ctx, bytes);
    if (q) {
        memcpy(q, p, FL_MIN_SIZE(h->size, bytes));
        fl_arena_free(ctx, p, h->size);
    }
    return q;
}

void fl_arena_set_limit(int64_t bytes) {
    arena_slot evicted[ARENA_SLOTS];
    int n = 0;
    arena_lock_held();
    arena_max = bytes < 0 ? 0 : bytes;
    while (arena_count > 0 && arena_cached > arena_max) {
        evicted[n++] = arena_slots[0];
        arena_remove(0);
    }
    pthread_mutex_unlock(&arena_lock);
    for (int i = 0; i < n; ++i) arena_unmap(evicted[i].base, evicted[i].bytes);
}

int64_t fl_arena_limit(void) {
    arena_lock_held();
    int64_t v = arena_max;
    pthread_mutex_unlock(&arena_lock);
    return v;
}

int64_t fl_arena_release(void) {
    arena_slot evicted[ARENA_SLOTS];
    arena_lock_held();
    int n = arena_count;
    int64_t bytes = arena_cached;
    memcpy(evicted, arena_slots, (size_t)n * sizeof(arena_slot));
    arena_count = 0;
    arena_cached = 0;
    pthread_mutex_unlock(&arena_lock);
    for (int i = 0; i < n; ++i) arena_unmap(evicted[i].base, evicted[i].bytes);
    return bytes;
}

void fl_arena_stats(int64_t stats[5]) {
    arena_lock_held();
    stats[0] = arena_cached;
    stats[1] = arena_count;
    stats[2] = arena_hits;
    stats[3] = arena_misses;
    stats[4] = arena_in_use;
    pthread_mutex_unlock(&arena_lock);
}
