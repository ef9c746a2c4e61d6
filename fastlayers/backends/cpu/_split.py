"""How fastlayers shares one call's work among ``set_num_threads`` threads.

fastlayers owns its threads: BLAS runs one thread (``_jit.pin_blas``) and the work is split
here, two ways:

- ``shares``: compiled kernels over a range of rows run as ``prange`` drivers on Numba's
  OpenMP threads, whose hand-off takes a few microseconds because idle workers spin briefly
  (a 100 us depthwise convolution gains 1.8x from a second core; Python threads gained 1.3x:
  waking a thread, then handing it the GIL, costs 20-40 us on this project's VM).
- ``run_rows``: Python callables that release the GIL (numpy's sgemm on a share of a product)
  on a small pool of Python threads, which poll for the next share in compiled code for a
  short while before they sleep.

GNU OpenMP cannot run in a forked child of a process that used it (Numba terminates such a
child), so after a fork every ``shares`` call runs serially; ``run_rows`` keeps its threads.
One call at a time uses the parallel slot; a call that finds it taken (another service thread)
runs serially, so concurrent callers do not oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading

import numpy as np

from .. import _num_threads
from .._jit import njit

#: Polls (each a sched_yield, about 0.5 us here) a helper makes for the next share before it sleeps.
SPIN_POLLS = 5000
#: Polls the caller makes for the helpers' shares before it sleeps on a condition.
WAIT_POLLS = 20000


def _yield_function():
    """``sched_yield`` from the C library as a ctypes function (a no-op stand-in elsewhere)."""
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name) if libc_name else None
        fn = libc.sched_yield if libc is not None else None
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        @ctypes.CFUNCTYPE(ctypes.c_int)
        def fn():
            return 0
        return fn
    return ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(fn, ctypes.c_void_p).value)


_SCHED_YIELD = _yield_function()


@njit()
def _poll(flags, index, value, polls, pause):
    """Until flags[index] != value, at most ``polls`` times, calling ``pause()`` between reads
    (an opaque call, so every read comes from memory); True when the value changed."""
    for _ in range(polls):
        if flags[index] != value:
            return True
        pause()
    return flags[index] != value


class _Pool:
    """``workers`` helper threads fed through a shared sequence number (see the module doc)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.seq = np.zeros(1, np.int64)            # job number, bumped per posted job
        self.done = np.zeros(workers, np.int64)     # last job number each helper finished
        self.jobs: list = [None] * workers
        self.errors: list = [None] * workers
        self.cond = threading.Condition()
        self.busy = threading.Lock()
        for i in range(workers):
            threading.Thread(target=self._work, args=(i,), daemon=True,
                             name=f"fastlayers-{i + 1}").start()

    def _work(self, i: int) -> None:
        seen = 0
        while True:
            if not _poll(self.seq, 0, seen, SPIN_POLLS, _SCHED_YIELD):
                with self.cond:
                    while self.seq[0] == seen:
                        self.cond.wait()
            seen = int(self.seq[0])
            job = self.jobs[i]
            if job is not None:
                kernel, args, begin, end = job
                try:
                    kernel(*args, begin, end)
                except BaseException as exc:     # re-raised in the calling thread
                    self.errors[i] = exc
            self.done[i] = seen
            with self.cond:
                self.cond.notify_all()

    def run(self, kernel, args, bounds) -> None:
        shares = len(bounds) - 1
        for i in range(self.workers):
            self.jobs[i] = (kernel, args, bounds[i + 1], bounds[i + 2]) if i + 1 < shares else None
            self.errors[i] = None
        with self.cond:
            self.seq[0] += 1
            self.cond.notify_all()
        seq = int(self.seq[0])
        try:
            kernel(*args, bounds[0], bounds[1])
        finally:
            for i in range(self.workers):
                if not _poll(self.done, i, seq - 1, WAIT_POLLS, _SCHED_YIELD) or self.done[i] != seq:
                    with self.cond:
                        while self.done[i] != seq:
                            self.cond.wait()
        for exc in self.errors:
            if exc is not None:
                raise exc


_lock = threading.Lock()
_pool: list = [None]
_parallel_slot = threading.Lock()
_forked = [False]


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's helper threads: start a new pool on demand, and
    never launch an OpenMP region (see the module doc)."""
    global _lock, _parallel_slot
    _lock = threading.Lock()
    _parallel_slot = threading.Lock()
    _pool[0] = None
    _forked[0] = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def thread_count() -> int:
    """Threads a split kernel may use (``set_num_threads``, else Numba's default)."""
    n = _num_threads[0]
    if n is None:
        import numba

        n = numba.config.NUMBA_NUM_THREADS
    return max(1, int(n))


def _get_pool(workers: int) -> _Pool:
    pool = _pool[0]
    if pool is None or pool.workers < workers:
        with _lock:
            pool = _pool[0]
            if pool is None or pool.workers < workers:
                pool = _pool[0] = _Pool(workers)   # an outgrown pool's helpers just sleep
    return pool


def run_rows(kernel, args: tuple, rows: int, min_rows: int = 8) -> None:
    """``kernel(*args, begin, end)`` over [0, rows), split into equal shares among threads
    when each share gets at least ``min_rows`` rows."""
    parts = min(thread_count(), rows // max(min_rows, 1))
    if parts <= 1:
        kernel(*args, 0, rows)
        return
    pool = _get_pool(parts - 1)
    if not pool.busy.acquire(blocking=False):
        kernel(*args, 0, rows)          # another call holds the pool: run alone
        return
    try:
        pool.run(kernel, args, [rows * i // parts for i in range(parts + 1)])
    finally:
        pool.busy.release()


@contextlib.contextmanager
def shares(rows: int, min_rows: int = 8):
    """The number of ``prange`` shares to give a kernel over ``rows`` rows: 1 (run it serially)
    when a share would get fewer than ``min_rows`` rows, after a fork, or while another call
    holds the parallel slot; else up to ``set_num_threads``, holding the slot meanwhile."""
    parts = min(thread_count(), rows // max(min_rows, 1))
    if parts <= 1 or _forked[0] or not _parallel_slot.acquire(blocking=False):
        yield 1
        return
    try:
        yield parts
    finally:
        _parallel_slot.release()


def run_parallel(kernel, driver, args: tuple, rows: int, min_rows: int = 8) -> None:
    """``kernel(*args, begin, end)`` over [0, rows), or ``driver(*args, parts)``, its ``prange``
    over ``parts`` equal shares, when ``shares`` gives more than one."""
    if min(thread_count(), rows // max(min_rows, 1)) <= 1:
        kernel(*args, 0, rows)          # the common small call: no slot, no context manager
        return
    with shares(rows, min_rows) as parts:
        if parts == 1:
            kernel(*args, 0, rows)
        else:
            driver(*args, parts)
