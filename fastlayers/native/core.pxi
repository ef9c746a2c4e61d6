# The ISA dispatch, the thread pool and the array helpers every kernel binding uses.

cdef extern from "dispatch.h":
    const char *fl_best_isa()
    int fl_set_isa(const char *name)
    int fl_isa_runs(const char *name)
    int fl_vnni
    int fl_vnni_runs()
    int fl_set_vnni(int on)
    int fl_amx
    int fl_amx_runs()
    int fl_set_amx(int on)
    const char *fl_isa_names[]
    ctypedef struct fl_kernels:
        const char *isa
    const fl_kernels *fl_k

cdef extern from "heap.h":
    int fl_heap_retain(int64_t mmap_threshold, int64_t trim_threshold)
    int fl_heap_trim()
    int64_t fl_thread_buf_bytes()
    int64_t fl_thread_buf_released()

cdef extern from "arena.h":
    void fl_arena_set_limit(int64_t bytes)
    int64_t fl_arena_limit()
    int64_t fl_arena_release()
    void fl_arena_stats(int64_t stats[6])

cdef extern from "arena_numpy.h":
    void *fl_arena_handler_address()

cdef extern from "numpy/arrayobject.h":
    object PyDataMem_SetHandler(object handler)
    object PyDataMem_GetHandler()

from cpython.pycapsule cimport PyCapsule_New

cdef extern from "threadpool.h":
    int fl_pool_get_threads()
    void fl_pool_set_threads(int n)
    int fl_pool_set_call_threads(int n)
    int fl_pool_generation()
    int fl_pool_workers()
    void fl_pool_clear_backoff()
    int64_t fl_pool_get_spin_ns()
    void fl_pool_set_spin_ns(int64_t ns)
    int64_t fl_parallel_chunks(int64_t n, int64_t grain)
    int fl_pool_thread_index() nogil
    ctypedef void (*fl_task_fn)(void *ctx, int64_t begin, int64_t end) noexcept nogil
    void fl_parallel_part(int64_t n, int64_t grain, int64_t permille, fl_task_fn fn, void *ctx) nogil


class NativeError(RuntimeError):
    """A native kernel failed (a work buffer could not be allocated)."""


cdef inline void check(int status, str what) except *:
    if status == -1:
        raise MemoryError(f"{what}: a native work buffer could not be allocated")
    if status != 0:
        raise NativeError(f"{what}: native kernel failed with status {status}")


cdef inline float *fptr(cnp.ndarray a, str what) except NULL:
    """The data of ``a``: float32 with a contiguous last axis and whole-float row strides."""
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32:
        raise TypeError(f"{what}: expected a float32 array, got {a.dtype}")
    if a.ndim and a.shape[a.ndim - 1] > 1 and a.strides[a.ndim - 1] != 4 and a.size:
        raise ValueError(f"{what}: the last axis must be contiguous")
    if not cnp.PyArray_ISALIGNED(a):
        raise ValueError(f"{what}: the data is not aligned to whole floats")
    return <float *>cnp.PyArray_DATA(a)


cdef inline float *optf(object a, str what) except? NULL:
    """``fptr`` of an optional array (None gives NULL)."""
    if a is None:
        return NULL
    return fptr(a, what)


cdef inline int64_t ld(cnp.ndarray a):
    """Row stride in floats of a 2-D array (its width when it has one row)."""
    if a.ndim < 2:
        return a.shape[0] if a.ndim else 1
    if a.shape[0] <= 1:
        return max(a.strides[0] // 4, a.shape[1])
    return a.strides[0] // 4


def isas():
    """The ISA paths compiled in, best first (``avx512``, ``avx2``, ``generic``)."""
    out = []
    cdef int i = 0
    while fl_isa_names[i] != NULL:
        out.append(fl_isa_names[i].decode())
        i += 1
    return out


def isa_runs(str name):
    """Whether this CPU can run the ISA path ``name``."""
    return bool(fl_isa_runs(name.encode()))


def best_isa():
    """The best ISA path this CPU runs."""
    return fl_best_isa().decode()


def isa():
    """The ISA path the kernels run now."""
    return fl_k.isa.decode()


def set_isa(str name):
    """Run the kernels on the ISA path ``name``; ValueError when this CPU cannot."""
    if fl_set_isa(name.encode()) != 0:
        raise ValueError(f"ISA path {name!r} is not available on this CPU; "
                         f"available: {[n for n in isas() if isa_runs(n)]}")


def vnni():
    """Whether the 8-bit integer products run VNNI's vpdpbusd now: on the avx512 path where the
    CPU has AVX-512 VNNI, on the avx2 path where it has AVX-VNNI (or AVX-512 VNNI with VL),
    unless turned off with ``set_vnni(False)``."""
    return bool(fl_vnni)


def vnni_runs():
    """Whether the ISA path in use can run VNNI integer products on this CPU (see ``vnni``)."""
    return bool(fl_vnni_runs())


def set_vnni(bint on):
    """Run the integer products with VNNI (``True``) or without; ValueError when the
    ISA path in use or the CPU has none. ``set_isa`` resets it to what the path can run."""
    if fl_set_vnni(on) != 0:
        raise ValueError(f"VNNI products are not available on the {isa()!r} path of this CPU")


def amx():
    """Whether 8-bit integer products of 8 rows or more run on AMX tiles now: on the avx512
    path of a CPU with AMX-INT8 whose kernel lets the process use it, with VNNI on, unless
    turned off with ``set_amx(False)``."""
    return bool(fl_amx and fl_vnni)


def amx_runs():
    """Whether the ISA path in use can run integer products on AMX tiles on this CPU."""
    return bool(fl_amx_runs())


def set_amx(bint on):
    """Run the integer products of enough rows on AMX tiles (``True``) or not; ValueError
    where the ISA path in use, the CPU or the kernel has none. ``set_isa`` resets it to what
    the path can run."""
    if fl_set_amx(on) != 0:
        raise ValueError(f"AMX products are not available on the {isa()!r} path of this CPU")


def get_num_threads():
    """Threads a parallel kernel uses (the caller's included)."""
    return fl_pool_get_threads()


def set_num_threads(int n):
    """Use ``n`` threads in the kernels (created at the next parallel call)."""
    if n < 1:
        raise ValueError(f"set_num_threads expects a positive integer, got {n}")
    fl_pool_set_threads(n)


def set_call_threads(int n):
    """Use ``n`` threads in the calling thread's kernels (0: the process's count, as set by
    ``set_num_threads``); returns the previous value, to restore."""
    if n < 0:
        raise ValueError(f"set_call_threads expects a count >= 0, got {n}")
    return fl_pool_set_call_threads(n)


def get_spin_ns():
    """How long (ns) an idle pool worker polls for the next job before it sleeps."""
    return fl_pool_get_spin_ns()


def set_spin_ns(int64_t ns):
    """Let idle pool workers poll for the next job ``ns`` nanoseconds (clamped to [0, 1 s])
    before they sleep; takes effect when each worker next goes idle."""
    fl_pool_set_spin_ns(ns)


def pool_generation():
    """1 once this process created its workers (a forked child starts again at 0)."""
    return fl_pool_generation()


def parallel_chunks(int64_t n, int64_t grain):
    """Chunks a parallel call of n units with at least ``grain`` units per chunk is cut into
    on the calling thread's thread count (1: it runs serially)."""
    return fl_parallel_chunks(n, grain)


from libc.stdint cimport int32_t
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double now_seconds() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


ctypedef struct owners_ctx:
    int32_t *owner
    double seconds


cdef void record_owners(void *ctx, int64_t begin, int64_t end) noexcept nogil:
    cdef owners_ctx *p = <owners_ctx *>ctx
    cdef int64_t u
    cdef double until
    for u in range(begin, end):
        until = now_seconds() + p.seconds
        while now_seconds() < until:
            pass
        p.owner[u] = fl_pool_thread_index()


def parallel_owners(int64_t n, int64_t grain, double seconds=0.0, int64_t permille=1000):
    """Which thread ran each of n units of a parallel call (0: the calling thread, i + 1:
    worker i), each unit busy for ``seconds``; the call is worth ``permille`` thousandths of a
    sleeping worker's wake (``fl_parallel_part``). For the tests of the pool's chunk spans."""
    if n < 0 or grain < 1 or seconds < 0:
        raise ValueError("parallel_owners: n >= 0, grain >= 1 and seconds >= 0")
    owner = np.full(n, -1, np.int32)
    cdef int32_t[::1] view = owner
    cdef owners_ctx ctx
    ctx.owner = &view[0] if n else NULL
    ctx.seconds = seconds
    with nogil:
        fl_parallel_part(n, grain, permille, record_owners, &ctx)
    return owner


def pool_workers():
    """Worker threads alive now (beside the calling thread)."""
    return fl_pool_workers()


def pool_clear_backoff():
    """End the pool's back-off now: the next parallel call shares its work even if an earlier
    one waited for a descheduled worker (for the tests of waking and sharing)."""
    fl_pool_clear_backoff()


def heap_retain(int64_t mmap_threshold, int64_t trim_threshold):
    """Have the C library serve blocks under ``mmap_threshold`` bytes from its heap and keep up
    to ``trim_threshold`` free bytes mapped (glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD,
    process-wide); whether it applied (False on other C libraries, or values out of range)."""
    return bool(fl_heap_retain(mmap_threshold, trim_threshold))


def heap_trim():
    """Hand every free page of the C library's heap back to the system (glibc's malloc_trim,
    beyond what ``heap_retain``'s trim threshold keeps); whether any was released (False on
    other C libraries)."""
    return bool(fl_heap_trim())


#: numpy's allocator handler on the native block arena (arena.h).
_ARENA_HANDLER = PyCapsule_New(fl_arena_handler_address(), "mem_handler", NULL)


def arena_enter():
    """Have numpy allocate from the native block arena in the calling context (thread or task)
    until ``arena_exit``; returns the handler to pass to it. Arrays keep the allocator that
    made them, so those handed out are freed back into the arena whenever they are dropped."""
    return PyDataMem_SetHandler(_ARENA_HANDLER)


#: numpy's own allocator handler (the C library's heap), as the module is imported outside any
#: model's call.
_DEFAULT_HANDLER = PyDataMem_GetHandler()


def arena_leave():
    """Have numpy allocate with its own allocator (the C library's heap) in the calling
    context until ``arena_exit``; returns what to pass to it."""
    return PyDataMem_SetHandler(_DEFAULT_HANDLER)


def arena_exit(previous):
    """Restore the numpy allocator handler ``arena_enter`` returned."""
    PyDataMem_SetHandler(previous)


def arena_limit(limit=None):
    """The most free bytes the block arena keeps mapped; with ``limit`` (bytes, >= 0), set it
    first (regions whose blocks are all free are unmapped down to the new limit)."""
    if limit is not None:
        if int(limit) < 0:
            raise ValueError(f"arena_limit expects a byte count >= 0, got {limit}")
        fl_arena_set_limit(int(limit))
    return fl_arena_limit()


def arena_release():
    """Unmap every region of the block arena whose blocks are all free; returns the bytes
    released."""
    return fl_arena_release()


def arena_stats():
    """The block arena's counters: a dict of ``free_bytes`` and ``free_blocks`` (mapped, kept
    for later), ``hits`` and ``misses`` (allocations served from mapped regions / that mapped
    a new one), ``in_use_bytes`` (held by arrays) and ``mapped_bytes``."""
    cdef int64_t s[6]
    fl_arena_stats(s)
    return {"free_bytes": s[0], "free_blocks": s[1], "hits": s[2], "misses": s[3],
            "in_use_bytes": s[4], "mapped_bytes": s[5]}


def thread_buffer_bytes():
    """Bytes the calling thread's kernel work buffers hold now (freed when the thread exits)."""
    return fl_thread_buf_bytes()


def threads_released():
    """Threads whose kernel work buffers were freed at their exit since the process started."""
    return fl_thread_buf_released()


def data_address(cnp.ndarray a):
    """The address of ``a``'s first element (numpy's ``__array_interface__["data"][0]``
    without the dict it builds: a weight's view is keyed by its offset on every call)."""
    return <Py_ssize_t>cnp.PyArray_DATA(a)
