"""Run a serial, GIL-releasing kernel over a range of rows on several Python threads.

Why not ``numba.njit(parallel=True)``: Numba's OpenMP workers spin after each parallel kernel
and, on a machine with as many threads as cores, starve the OpenBLAS threads of the sgemm that
follows (a depthwise + pointwise stack ran 5-10x slower; docs/design.md). Python threads wait on
a lock instead of spinning, and the calling thread does its own share.

The pool holds ``threads - 1`` workers for the count given to ``fastlayers.set_num_threads``
(default: Numba's default thread count). Work is only split when each share has at least
``min_rows`` rows, so small calls stay serial.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import _num_threads

_lock = threading.Lock()
_pool: list = [None, 0]   # [executor, workers]


def _forget_pool_in_child() -> None:
    """A forked child has none of the parent's worker threads: start a new pool on demand."""
    global _lock
    _lock = threading.Lock()
    _pool[0], _pool[1] = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def thread_count() -> int:
    """Threads a split kernel may use (``set_num_threads``, else Numba's default)."""
    n = _num_threads[0]
    if n is None:
        import numba

        n = numba.config.NUMBA_NUM_THREADS
    return max(1, int(n))


def _executor(workers: int) -> ThreadPoolExecutor:
    with _lock:
        if _pool[0] is None or _pool[1] < workers:
            _pool[0] = ThreadPoolExecutor(workers, thread_name_prefix="fastlayers")
            _pool[1] = workers
        return _pool[0]


def run_rows(kernel, args: tuple, rows: int, min_rows: int = 8) -> None:
    """``kernel(*args, begin, end)`` over [0, rows), split into equal shares among threads."""
    parts = min(thread_count(), rows // max(min_rows, 1))
    if parts <= 1:
        kernel(*args, 0, rows)
        return
    bounds = [rows * i // parts for i in range(parts + 1)]
    pool = _pool[0]
    if pool is None or _pool[1] < parts - 1:
        pool = _executor(parts - 1)
    futures = [pool.submit(kernel, *args, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    kernel(*args, bounds[0], bounds[1])
    for f in futures:
        f.result()
