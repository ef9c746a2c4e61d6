/* Memory the native core keeps between calls (heap.h).
 *
 * Every operator allocates its output anew. glibc serves blocks over its mmap threshold (128 KiB
 * until a larger block is freed) with one mmap each and trims its heap's free top beyond twice
 * that, so the next call gets fresh pages and takes a page fault per 4 KiB on first touch (in a
 * VM as long as the copy itself for a reshape). Raising both
 * thresholds keeps those pages mapped and reused (what an arena allocator does).
 *
 * The kernels' per-thread work buffers (padded inputs, im2col and Winograd blocks, packed
 * panels) are `__thread` variables. The C runtime frees a thread's TLS block, not what its
 * pointers point to, so each buffer is put on a per-thread list at its first allocation and a
 * pthread key's destructor frees the list when the thread exits. The memory goes back to the
 * thread's malloc arena, which glibc hands to the next new thread: a thread-per-request server
 * reuses the same pages instead of growing by a dead thread's buffers per request.
 */
#include "heap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__GLIBC__)
#include <malloc.h>

int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold) {
    if (mmap_threshold < 0 || trim_threshold < 0 || mmap_threshold > INT32_MAX ||
        trim_threshold > INT32_MAX)
        return 0;
    return mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold) == 1 &&
           mallopt(M_TRIM_THRESHOLD, (int)trim_threshold) == 1;
}

int fl_heap_trim(void) { return malloc_trim(0); }
#else
int fl_heap_trim(void) { return 0; }

int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold) {
    (void)mmap_threshold;
    (void)trim_threshold;
    return 0;
}
#endif

static __thread fl_thread_buf *thread_bufs = 0;   /* this thread's tracked buffers */
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
static int exit_key_ok = 0;
static _Atomic int64_t released = 0;

/* At a thread's exit (its TLS block is still there): free every buffer on its list. */
static void free_thread_bufs(void *unused) {
    (void)unused;
    int any = thread_bufs != 0;
    while (thread_bufs) {
        fl_thread_buf *b = thread_bufs;
        thread_bufs = b->next;
        free(b->p);
        b->p = 0;
        b->bytes = 0;
        b->tracked = 0;
        b->next = 0;
    }
    if (any) atomic_fetch_add(&released, 1);
}

static void make_exit_key(void) { exit_key_ok = pthread_key_create(&exit_key, free_thread_bufs) == 0; }

void fl_thread_buf_track(fl_thread_buf *b) {
    pthread_once(&exit_key_once, make_exit_key);
    if (!exit_key_ok) return;
    /* a non-NULL value makes the destructor run at this thread's exit */
    if (!thread_bufs && pthread_setspecific(exit_key, (void *)&thread_bufs) != 0) return;
    b->tracked = 1;
    b->next = thread_bufs;
    thread_bufs = b;
}

int64_t fl_thread_buf_bytes(void) {
    int64_t n = 0;
    for (fl_thread_buf *b = thread_bufs; b; b = b->next) n += (int64_t)b->bytes;
    return n;
}

int64_t fl_thread_buf_released(void) { return atomic_load(&released); }
