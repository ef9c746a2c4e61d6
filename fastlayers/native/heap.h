/* Memory the native core keeps between calls (heap.c).
 *
 * heap_retain(mmap_threshold, trim_threshold): with glibc, blocks under mmap_threshold bytes
 *   come from the heap (not one mmap each, unmapped when freed) and up to trim_threshold bytes
 *   free at its top stay mapped; returns 1, or 0 where the C library has no such settings.
 *
 * heap_trim(): with glibc, hands every free page of the heap back to the system (malloc_trim),
 *   whatever trim_threshold keeps; returns 1 where memory was released, else 0.
 *
 * fl_thread_buf: a work buffer owned by one thread (a `static __thread` variable of a kernel
 *   file, grown by fl_buf_grow in fl.h). Its first allocation registers it with
 *   fl_thread_buf_track, and its memory is freed when the thread exits (a pthread key's
 *   destructor), so a process that calls the core from many short-lived threads (a server
 *   answering each request on a new thread) does not keep every dead thread's buffers.
 */
#ifndef FL_HEAP_H
#define FL_HEAP_H
#include <stddef.h>
#include <stdint.h>

int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold);
int fl_heap_trim(void);

typedef struct fl_thread_buf {
    void *p;
    size_t bytes;
    int tracked;                   /* on its thread's list of buffers to free at exit */
    struct fl_thread_buf *next;
} fl_thread_buf;

/* Put b (a `__thread` variable of the calling thread) on the list freed at the thread's exit. */
void fl_thread_buf_track(fl_thread_buf *b);
/* Bytes held now by the calling thread's work buffers (for the tests). */
int64_t fl_thread_buf_bytes(void);
/* Threads whose work buffers were freed at exit since the process started (for the tests). */
int64_t fl_thread_buf_released(void);
#endif
