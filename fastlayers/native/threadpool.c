/* fastlayers' thread pool: see threadpool.h.
 *
 * A job is published by bumping `job_gen`. Its chunks are cut into one span of consecutive
 * chunks per thread taking part, the caller's first, then worker i's (span i + 1): each thread
 * runs its own span from the front, then takes what is left of the others' from the back. The
 * same share of every call's units thus falls to the same thread, and so the rows a kernel
 * writes stay in the cache of the core whose next kernel reads them (a depthwise convolution
 * after a pointwise one ran at its 1-thread time at 2 threads when the chunks went to whoever
 * claimed next: half its input came from the other core's cache); a late thread's chunks still
 * go to the threads that are there. A span is claimed by compare-and-swap on its word,
 * (generation << 40) | (front << 20) | back, so a worker that wakes late for a finished job can
 * never claim a chunk of the next one. A worker counts itself in `active` before claiming and
 * out after its last chunk; the caller returns once every chunk is claimed and `active` is 0,
 * so the job's fields stay valid while any worker reads them.
 */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define FL_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define FL_PAUSE() __asm__ __volatile__("yield")
#else
#define FL_PAUSE() ((void)0)
#endif

/* How long an idle worker polls for the next job before it sleeps, by default (a fraction of a
 * millisecond): back-to-back kernel calls find it awake, and an idle process leaves the cores
 * alone. fl_pool_set_spin_ns changes it; the clock is read once per FL_SPIN_CHECK polls. */
#define FL_SPIN_NS_DEFAULT INT64_C(200000)
#define FL_SPIN_NS_MAX INT64_C(1000000000)
#define FL_SPIN_CHECK 64
/* Polls of the caller waiting for workers before it yields its core to them. */
#define FL_WAIT_POLLS 2000
#define FL_MAX_THREADS 256
/* A call whose caller waited longer than this, and longer than it worked itself, for a worker
 * to finish a chunk (a worker descheduled by another process on the machine) makes the next
 * calls run serially for a back-off time, doubled at each such call up to the maximum and reset
 * by a call that shares its work without such a wait: beside a busy process a 2-thread call
 * then costs about what a 1-thread call does, instead of waiting out the scheduler. */
#define FL_STALL_NS INT64_C(200000)
#define FL_BACKOFF_MIN_NS INT64_C(20000000)
#define FL_BACKOFF_MAX_NS INT64_C(640000000)
#define FL_GEN_SHIFT 40
#define FL_GEN_MASK ((UINT64_C(1) << 24) - 1)
#define FL_SPAN_BITS 20
#define FL_SPAN_MASK ((UINT64_C(1) << FL_SPAN_BITS) - 1)

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;      /* held by the call using the pool */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_t workers[FL_MAX_THREADS];
static int n_workers = 0;
static int wanted_threads = 0;                                /* 0: the CPUs this process may use */
static int widest_call = 0;            /* most threads a call asked for since fl_pool_set_threads */
static int generation = 0;
static int64_t serial_until_ns = 0;                           /* both read and written holding busy */
static int64_t backoff_ns = FL_BACKOFF_MIN_NS;
/* Thousandths of a wake the small jobs of the current burst have run without one, and when the
 * last was published (fl_parallel_part; both read and written holding busy). */
static int64_t burst_owed = 0, burst_last_ns = 0;
static _Atomic int64_t spin_ns = FL_SPIN_NS_DEFAULT;

static _Atomic uint64_t job_gen = 0;
static _Atomic uint64_t spans[FL_MAX_THREADS];                /* the job's spans of chunks */
static _Atomic int job_parts = 0;                            /* ... how many */
static _Atomic int active = 0;
static _Atomic int sleepers = 0;
static _Atomic int stop_workers = 0;
static _Atomic int job_slots = 0;                             /* workers the job may still take */
static _Atomic int job_cpu = -1;                              /* the CPU its caller published it on */
/* Per worker: its kernel thread id, and whether it sleeps on `wake` (set and cleared holding
 * sleep_lock). A caller waking sleepers first takes its own CPU out of their affinity
 * (`pinned`), and each restores `pool_cpus` once it runs (see keep_off_cpu). */
static _Atomic int worker_tid[FL_MAX_THREADS];
static int worker_asleep[FL_MAX_THREADS];
static _Atomic int worker_pinned[FL_MAX_THREADS];
#ifdef __linux__
static cpu_set_t pool_cpus;                                   /* written holding sleep_lock */
#endif
static fl_task_fn job_fn;
static void *job_ctx;
static int64_t job_n, job_chunk, job_chunks;

static __thread int in_pool = 0;
static __thread int worker_index = 0;                         /* fl_pool_thread_index */
static __thread int call_threads = 0;                         /* 0: the process-wide count */

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* How long a thread's count of the CPUs it may run on is reused: every kernel asks for the
 * thread count, and the sched_getaffinity system call behind it cost more than a small
 * product itself (a 3-layer batch-1 dense chain took 3x its time). An affinity change
 * (taskset, os.sched_setaffinity) is seen within this time. */
#define FL_AFFINITY_REUSE_NS (INT64_C(50) * 1000000)
static __thread int affinity_cpus = 0;
static __thread int64_t affinity_read_ns = 0;

static int cpus_available(void) {
    int64_t t = now_ns();
    if (affinity_cpus > 0 && t - affinity_read_ns < FL_AFFINITY_REUSE_NS) return affinity_cpus;
    int n = 0;
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
    if (n <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int)online : 1;
    }
    affinity_cpus = n;
    affinity_read_ns = t;
    return n;
}

static int clamp_threads(int n) { return n < 1 ? 1 : (n > FL_MAX_THREADS ? FL_MAX_THREADS : n); }

static int process_threads(void) {
    return clamp_threads(wanted_threads > 0 ? wanted_threads : cpus_available());
}

int fl_pool_get_threads(void) { return call_threads > 0 ? clamp_threads(call_threads) : process_threads(); }

void fl_pool_set_threads(int n) {
    wanted_threads = n < 1 ? 1 : n;
    widest_call = 0;
}

int fl_pool_set_call_threads(int n) {
    int previous = call_threads;
    call_threads = n < 0 ? 0 : n;
    return previous;
}
int fl_pool_generation(void) { return generation; }
int fl_pool_workers(void) { return n_workers; }
int fl_pool_thread_index(void) { return worker_index; }
void fl_pool_clear_backoff(void) {
    pthread_mutex_lock(&busy);
    serial_until_ns = 0;
    backoff_ns = FL_BACKOFF_MIN_NS;
    pthread_mutex_unlock(&busy);
}

static uint64_t span_word(uint64_t gen, int64_t front, int64_t back) {
    return ((gen & FL_GEN_MASK) << FL_GEN_SHIFT) | ((uint64_t)front << FL_SPAN_BITS) | (uint64_t)back;
}

/* One chunk of span s of job `gen`: its first (the span's own thread) or its last (another
 * thread); -1 where none is left or the job is over. */
static int64_t claim(int s, uint64_t gen, int from_back) {
    uint64_t t = atomic_load_explicit(&spans[s], memory_order_acquire);
    for (;;) {
        if ((t >> FL_GEN_SHIFT) != (gen & FL_GEN_MASK)) return -1;
        int64_t front = (int64_t)((t >> FL_SPAN_BITS) & FL_SPAN_MASK), back = (int64_t)(t & FL_SPAN_MASK);
        if (front >= back) return -1;
        uint64_t next = from_back ? t - 1 : t + (UINT64_C(1) << FL_SPAN_BITS);
        if (atomic_compare_exchange_weak_explicit(&spans[s], &t, next, memory_order_acq_rel, memory_order_acquire))
            return from_back ? back - 1 : front;
    }
}

static void run_chunk(int64_t c) {
    int64_t begin = c * job_chunk, end = begin + job_chunk;
    job_fn(job_ctx, begin, end < job_n ? end : job_n);
}

/* Run chunks of job `gen` until none is left: span `home`'s from its front (none: -1), then
 * the other spans' from their backs. */
static void run_chunks(uint64_t gen, int home) {
    int parts = atomic_load_explicit(&job_parts, memory_order_acquire);
    int64_t c;
    if (home >= parts) home = -1;
    if (home >= 0)
        while ((c = claim(home, gen, 0)) >= 0) run_chunk(c);
    for (int k = 1; k <= parts; ++k) {
        int s = ((home < 0 ? 0 : home) + k) % parts;
        while ((c = claim(s, gen, 1)) >= 0) run_chunk(c);
    }
}

int64_t fl_pool_get_spin_ns(void) { return atomic_load(&spin_ns); }

void fl_pool_set_spin_ns(int64_t ns) {
    atomic_store(&spin_ns, ns < 0 ? 0 : (ns > FL_SPIN_NS_MAX ? FL_SPIN_NS_MAX : ns));
}

/* A worker woken from its sleep on the CPU its caller runs on moves to another of the
 * process's CPUs: its affinity without that CPU, which migrates it at once, then the whole set
 * again. The fallback of keep_off_cpu (below), where the caller could not set the worker's
 * affinity before waking it: such a worker first waits for the caller's time slice to end. */
static void move_off_cpu(int cpu) {
#ifdef __linux__
    cpu_set_t all, others;
    if (cpu < 0 || sched_getcpu() != cpu || sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2 ||
        !CPU_ISSET(cpu, &all))
        return;
    others = all;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(0, sizeof(others), &others) == 0) sched_setaffinity(0, sizeof(all), &all);
#else
    (void)cpu;
#endif
}

/* Take the caller's CPU `cpu` out of the affinity of each sleeping worker before it is woken,
 * so that the kernel wakes it on another CPU of the process. Linux wakes a thread beside its
 * waker when the other CPUs idle (after a pause between calls, in which a VM's vCPUs halt), and
 * a worker woken there cannot run, let alone move itself, before the caller's time slice ends:
 * a call ran serially for its first milliseconds. Woken elsewhere, it starts in tens of
 * microseconds. Called holding sleep_lock; each worker restores `pool_cpus` once it runs, so
 * that a caller that moves later does not keep its worker off the free CPU. */
static void keep_off_cpu(int cpu) {
#ifdef __linux__
    cpu_set_t all, others;
    if (cpu < 0 || sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2 || !CPU_ISSET(cpu, &all))
        return;
    others = all;
    CPU_CLR(cpu, &others);
    pool_cpus = all;
    for (int i = 0; i < n_workers; ++i) {
        int tid = atomic_load(&worker_tid[i]);
        if (worker_asleep[i] && tid > 0 && sched_setaffinity(tid, sizeof(others), &others) == 0)
            atomic_store(&worker_pinned[i], 1);
    }
#else
    (void)cpu;
#endif
}

static void *worker_main(void *arg) {
    int me = (int)(intptr_t)arg;
    in_pool = 1;
    worker_index = me + 1;
#ifdef __linux__
    pthread_setname_np(pthread_self(), "fastlayers");  /* as top -H, py-spy and /proc show it */
    worker_tid[me] = (int)syscall(SYS_gettid);
#endif
    uint64_t seen = atomic_load(&job_gen);
    int slept = 0;                    /* woken from the condition variable for this job */
    int pinned_off = 0;               /* ... on a CPU other than its waker's (keep_off_cpu) */
    for (;;) {
        uint64_t gen;
        int polls = 0;
        int64_t idle_since = 0;       /* read at the first clock check after the last job */
        while ((gen = atomic_load_explicit(&job_gen, memory_order_acquire)) == seen) {
            if (atomic_load(&stop_workers)) return 0;
            if (++polls % FL_SPIN_CHECK) {
                FL_PAUSE();
                continue;
            }
            int64_t t = now_ns();
            if (!idle_since) idle_since = t;
            if (t - idle_since < atomic_load_explicit(&spin_ns, memory_order_relaxed)) {
                FL_PAUSE();
                continue;
            }
            pthread_mutex_lock(&sleep_lock);
            atomic_fetch_add(&sleepers, 1);
            worker_asleep[me] = 1;
            while (atomic_load(&job_gen) == seen && !atomic_load(&stop_workers))
                pthread_cond_wait(&wake, &sleep_lock);
            worker_asleep[me] = 0;
            atomic_fetch_sub(&sleepers, 1);
#ifdef __linux__
            cpu_set_t cpus = pool_cpus;
#endif
            pthread_mutex_unlock(&sleep_lock);
            pinned_off = atomic_exchange(&worker_pinned[me], 0);
#ifdef __linux__
            if (pinned_off) sched_setaffinity(0, sizeof(cpus), &cpus);
#endif
            polls = 0;
            idle_since = 0;
            slept = 1;
        }
        seen = gen;
        /* a job asking for fewer threads than the pool holds leaves the other workers idle */
        if (atomic_fetch_sub_explicit(&job_slots, 1, memory_order_acq_rel) <= 0) continue;
        if (slept && !pinned_off) move_off_cpu(atomic_load_explicit(&job_cpu, memory_order_relaxed));
        slept = pinned_off = 0;
        atomic_fetch_add_explicit(&active, 1, memory_order_acq_rel);
        run_chunks(gen, me + 1);
        atomic_fetch_sub_explicit(&active, 1, memory_order_release);
    }
}

/* Start or stop workers so that n - 1 run beside the caller; called holding `busy`. */
static void resize_pool(int n) {
    if (n_workers == n - 1) return;
    if (n_workers > 0) {
        atomic_store(&stop_workers, 1);
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
        for (int i = 0; i < n_workers; ++i) pthread_join(workers[i], 0);
        n_workers = 0;
        atomic_store(&stop_workers, 0);
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);
    for (int i = 0; i < n - 1; ++i) {
        atomic_store(&worker_tid[n_workers], 0);
        atomic_store(&worker_pinned[n_workers], 0);
        worker_asleep[n_workers] = 0;
        if (pthread_create(&workers[n_workers], &attr, worker_main, (void *)(intptr_t)n_workers) != 0) break;
        ++n_workers;
    }
    pthread_attr_destroy(&attr);
    if (n_workers > 0) ++generation;
}

/* Units per chunk of n units cut into at most `most` chunks of at least `grain` units (most
 * <= n / grain), for `threads` threads taking chunks in turn: the size whose rounds (chunks
 * per thread, rounded up) times size is least, the smallest such size among equals (more
 * chunks: a late thread holds less). Cutting n into `most` near-equal chunks instead could
 * leave rounds uneven: 10 units at 2 threads in 5 chunks of 2 ran 3 chunks on one thread and
 * 2 on the other (1.25x the time of 2 chunks of 5). */
static int64_t chunk_units(int64_t n, int64_t grain, int64_t most, int threads) {
    int64_t best = (n + most - 1) / most, best_cost = INT64_MAX;
    for (int64_t c = most; c >= 1 && c >= (most < threads ? most : threads); --c) {
        int64_t size = (n + c - 1) / c;
        if (size < grain) continue;
        int64_t rounds = ((n + size - 1) / size + threads - 1) / threads;
        if (rounds * size < best_cost) {
            best_cost = rounds * size;
            best = size;
        }
    }
    return best;
}

int64_t fl_parallel_chunks(int64_t n, int64_t grain) {
    if (grain < 1) grain = 1;
    int threads = fl_pool_get_threads();
    int64_t chunks = (n + grain - 1) / grain;
    int64_t most = (int64_t)threads * 4;        /* a few chunks per thread balance the load */
    if (threads <= 1 || in_pool) return n > 0 ? 1 : 0;
    if (chunks > most) chunks = most;
    if (chunks <= 1) return chunks;
    int64_t size = chunk_units(n, grain, chunks, threads);
    return (n + size - 1) / size;
}

/* The chunks of a call run one after another on the caller: the same (begin, end) ranges as
 * the workers would take, since a task's arithmetic may depend on its range (a kernel's rows
 * in blocks, a product's thin or packed path): a call that runs serially because the pool is
 * busy or backing off gives the same bits as one that shares its chunks. */
static void run_serially(int64_t n, int64_t chunk, fl_task_fn fn, void *ctx) {
    for (int64_t begin = 0; begin < n; begin += chunk)
        fn(ctx, begin, begin + chunk < n ? begin + chunk : n);
}

/* Whether a job worth `permille` thousandths of a wake, published at `now` for `threads`
 * threads, wakes the sleeping workers (fl_parallel_part); called holding busy. As in ski
 * rental: the burst's small jobs run without the workers until what they lost by it (their
 * work times (threads - 1) / threads) reaches the wake's price, then the workers are woken;
 * a burst never costs more than twice what knowing its length ahead would have. */
static int wake_pays(int64_t permille, int64_t now, int threads) {
    if (permille < 1000) {
        if (now - burst_last_ns > atomic_load_explicit(&spin_ns, memory_order_relaxed))
            burst_owed = 0;                                   /* a new burst */
        burst_last_ns = now;
        burst_owed += permille;
        if (burst_owed * (threads - 1) < INT64_C(1000) * threads) return 0;
    }
    burst_owed = 0;
    return 1;
}

/* fl_parallel_part (fl_parallel: permille 1000). */
static void parallel(int64_t n, int64_t grain, fl_task_fn fn, void *ctx, int64_t permille) {
    if (n <= 0) return;
    int64_t chunks = fl_parallel_chunks(n, grain);
    if (chunks <= 1) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunk = (n + chunks - 1) / chunks;
    if (pthread_mutex_trylock(&busy) != 0) {
        run_serially(n, chunk, fn, ctx);
        return;
    }
    int64_t start = now_ns();
    if (start < serial_until_ns) {
        pthread_mutex_unlock(&busy);
        run_serially(n, chunk, fn, ctx);
        return;
    }
    /* the pool holds the most threads any call asked for (a model's own count beside the
     * process's), so that calls asking for different counts do not recreate it each time */
    int threads = fl_pool_get_threads();
    if (threads > widest_call) widest_call = threads;
    int size = process_threads();
    resize_pool(widest_call > size ? widest_call : size);
    if (n_workers == 0) {
        pthread_mutex_unlock(&busy);
        run_serially(n, chunk, fn, ctx);
        return;
    }
    job_fn = fn;
    job_ctx = ctx;
    job_n = n;
    job_chunk = chunk;
    job_chunks = (n + job_chunk - 1) / job_chunk;
    atomic_store_explicit(&job_slots, threads - 1, memory_order_release);
#ifdef __linux__
    atomic_store_explicit(&job_cpu, sched_getcpu(), memory_order_relaxed);
#endif
    uint64_t gen = atomic_load(&job_gen) + 1;
    int parts = threads < job_chunks ? threads : (int)job_chunks;
    for (int s = 0; s < parts; ++s)
        atomic_store_explicit(&spans[s], span_word(gen, job_chunks * s / parts, job_chunks * (s + 1) / parts),
                              memory_order_release);
    atomic_store_explicit(&job_parts, parts, memory_order_release);
    atomic_store_explicit(&job_gen, gen, memory_order_release);
    if (atomic_load(&sleepers) > 0 && wake_pays(permille, start, threads)) {
        pthread_mutex_lock(&sleep_lock);
        keep_off_cpu(atomic_load_explicit(&job_cpu, memory_order_relaxed));
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    in_pool = 1;
    run_chunks(gen, 0);
    in_pool = 0;
    int64_t mine = now_ns();
    for (int polls = 0; atomic_load_explicit(&active, memory_order_acquire) != 0; ++polls) {
        if (polls < FL_WAIT_POLLS) FL_PAUSE();
        else sched_yield();
    }
    int64_t end = now_ns(), waited = end - mine;
    if (waited > FL_STALL_NS && waited > mine - start) {
        serial_until_ns = end + backoff_ns;
        backoff_ns = backoff_ns * 2 < FL_BACKOFF_MAX_NS ? backoff_ns * 2 : FL_BACKOFF_MAX_NS;
    } else {
        backoff_ns = FL_BACKOFF_MIN_NS;
    }
    pthread_mutex_unlock(&busy);
}

void fl_parallel(int64_t n, int64_t grain, fl_task_fn fn, void *ctx) {
    parallel(n, grain, fn, ctx, 1000);
}

void fl_parallel_part(int64_t n, int64_t grain, int64_t permille, fl_task_fn fn, void *ctx) {
    parallel(n, grain, fn, ctx, permille);
}

/* In a forked child only the forking thread exists: forget the parent's workers (their
 * structures are copies of threads that do not run here) and reset every lock and counter;
 * the next parallel call creates new workers. */
static void after_fork_child(void) {
    pthread_mutex_init(&busy, 0);
    pthread_mutex_init(&sleep_lock, 0);
    pthread_cond_init(&wake, 0);
    n_workers = 0;
    generation = 0;
    serial_until_ns = 0;
    backoff_ns = FL_BACKOFF_MIN_NS;
    burst_owed = burst_last_ns = 0;
    atomic_store(&job_gen, 0);
    atomic_store(&job_parts, 0);
    atomic_store(&active, 0);
    atomic_store(&sleepers, 0);
    atomic_store(&stop_workers, 0);
    atomic_store(&job_slots, 0);
    widest_call = 0;
    in_pool = 0;
}

__attribute__((constructor)) static void register_fork_handler(void) {
    pthread_atfork(0, 0, after_fork_child);
}
