/* fastlayers' thread pool (pthreads): one call's work split into chunks that any thread takes.
 *
 * fl_parallel(n, grain, fn, ctx) runs fn(ctx, begin, end) over [0, n) in chunks of at least
 * `grain` units. Each thread of the call first runs its own span of consecutive chunks (the
 * caller the first, worker i the (i + 2)-th), so that the same share of consecutive calls'
 * units falls to the same core; then it takes the others' leftover chunks from the back. The
 * calling thread takes chunks too, so a descheduled worker delays only the chunk it holds. Workers are created at the first parallel call (and again in a forked child:
 * pthread_atfork), poll for the next job for a set time after a call (fl_pool_set_spin_ns),
 * then sleep on a condition variable.
 * One call uses the pool at a time: a call made while another holds it (another Python thread)
 * or from inside a worker runs serially on its own thread, so the cores are never
 * oversubscribed; a serial call takes the same chunks one after another, so its result has the
 * same bits as a shared one. A call that had to wait for a descheduled worker (another process busy on the
 * machine) makes the next calls run serially for a back-off time (threadpool.c).
 */
#ifndef FL_THREADPOOL_H
#define FL_THREADPOOL_H
#include <stdint.h>

typedef void (*fl_task_fn)(void *ctx, int64_t begin, int64_t end);

/* Threads a parallel call of the calling thread may use (the caller included); at least 1:
 * the calling thread's own count where one is set (fl_pool_set_call_threads), else the
 * process's. */
int fl_pool_get_threads(void);
/* Use n threads (n >= 1) in the process; takes effect at the next parallel call. */
void fl_pool_set_threads(int n);
/* Use n threads in the calling thread's parallel calls (0: the process's count), whatever the
 * process's count; returns the previous value. The pool holds the most threads any call asked
 * for since the last fl_pool_set_threads, and a job asking for fewer leaves the others idle. */
int fl_pool_set_call_threads(int n);
/* fn(ctx, begin, end) over [0, n) in chunks of at least `grain` units, on the pool's threads. */
void fl_parallel(int64_t n, int64_t grain, fl_task_fn fn, void *ctx);
/* fl_parallel for a job worth `permille` thousandths of what waking a sleeping worker costs
 * the caller (a system call, the worker's affinity moved off the caller's CPU: 20 us on a
 * 2-vCPU KVM guest, where a 512 x 214 product at batch 1 takes 9 us); from 1000 it is
 * fl_parallel. A smaller job wakes sleeping workers only once what the small jobs of the
 * current burst (each less than the workers' spin time after the one before) lost by running
 * without them adds up to a wake's worth (ski rental: at 2 threads, two wakes' worth of
 * work); until then the caller and the workers still polling take every chunk (the same
 * chunks, so the same bits). A tiny model called back to back keeps its worker awake; a call
 * after a pause does not pay for a wake its few small jobs cannot repay. */
void fl_parallel_part(int64_t n, int64_t grain, int64_t permille, fl_task_fn fn, void *ctx);
/* Values an elementwise pass (each value read and written about once) must hold to be worth
 * a wake by itself: about the caller's 20 us of it (docs/design.md, "Small jobs wake
 * sleeping workers only in bursts"). */
#define FL_WAKE_VALUES (INT64_C(1) << 18)
/* fl_parallel_part for a pass over `values` values. */
static inline void fl_parallel_values(int64_t n, int64_t grain, int64_t values, fl_task_fn fn,
                                      void *ctx) {
    fl_parallel_part(n, grain, values * 1000 / FL_WAKE_VALUES, fn, ctx);
}
/* Chunks fl_parallel(n, grain) would cut (1: the call runs serially on the caller). */
int64_t fl_parallel_chunks(int64_t n, int64_t grain);
/* Which thread runs this: 0 outside the pool (a caller), i + 1 on worker i (the tests' view of
 * which thread took a chunk). */
int fl_pool_thread_index(void);
/* Times the pool was created in this process (1 after the first parallel call; again 1 in a
 * forked child after its first parallel call): for the fork tests. */
int fl_pool_generation(void);
/* Workers alive now. */
int fl_pool_workers(void);
/* End a back-off now (the next call shares its work, and a later stall backs off for the
 * shortest time again): for the tests of waking and sharing, which a busy machine's earlier
 * stalls would otherwise turn into serial calls. */
void fl_pool_clear_backoff(void);
/* How long (ns) an idle worker polls for the next job before it sleeps; set clamps to [0, 1 s].
 * Longer keeps the workers' cores running between spaced calls (faster calls after a pause,
 * at the cost of that much CPU per worker after each call). */
int64_t fl_pool_get_spin_ns(void);
void fl_pool_set_spin_ns(int64_t ns);
#endif
