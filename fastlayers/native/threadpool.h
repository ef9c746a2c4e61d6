/* fastlayers' thread pool (pthreads): one call's work split into chunks that any thread takes.
 *
 * fl_parallel(n, grain, fn, ctx) runs fn(ctx, begin, end) over [0, n) in chunks of at least
 * `grain` units. The calling thread takes chunks too, so a descheduled worker delays only the
 * chunk it holds. Workers are created at the first parallel call (and again in a forked child:
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
/* fl_parallel without waking a worker that sleeps: the caller and the workers still polling
 * take every chunk (the same chunks, so the same bits). For jobs smaller than what waking a
 * worker costs the caller (a system call, the worker's affinity moved off the caller's CPU:
 * 20 us on a 2-vCPU KVM guest, where a 512 x 214 product at batch 1 takes 9 us). */
void fl_parallel_awake(int64_t n, int64_t grain, fl_task_fn fn, void *ctx);
/* Values an elementwise pass (each value read and written about once) must hold to be worth
 * waking a sleeping worker: about the caller's 20 us of the wake (docs/design.md, "Small jobs
 * leave sleeping workers asleep"). */
#define FL_WAKE_VALUES (INT64_C(1) << 18)
/* fl_parallel for a pass over `values` values: fl_parallel_awake below FL_WAKE_VALUES. */
static inline void fl_parallel_values(int64_t n, int64_t grain, int64_t values, fl_task_fn fn,
                                      void *ctx) {
    if (values < FL_WAKE_VALUES) fl_parallel_awake(n, grain, fn, ctx);
    else fl_parallel(n, grain, fn, ctx);
}
/* Chunks fl_parallel(n, grain) would cut (1: the call runs serially on the caller). */
int64_t fl_parallel_chunks(int64_t n, int64_t grain);
/* Times the pool was created in this process (1 after the first parallel call; again 1 in a
 * forked child after its first parallel call): for the fork tests. */
int fl_pool_generation(void);
/* Workers alive now. */
int fl_pool_workers(void);
/* How long (ns) an idle worker polls for the next job before it sleeps; set clamps to [0, 1 s].
 * Longer keeps the workers' cores running between spaced calls (faster calls after a pause,
 * at the cost of that much CPU per worker after each call). */
int64_t fl_pool_get_spin_ns(void);
void fl_pool_set_spin_ns(int64_t ns);
#endif
