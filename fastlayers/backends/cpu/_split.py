"""How fastlayers shares one call's work among ``set_num_threads`` threads.

fastlayers owns its threads: BLAS runs one thread (``_jit.pin_blas``) and every split kernel has
a ``prange`` driver (``kernel_par(..., parts)``) that runs the serial row-range kernel on
``parts`` shares over Numba's OpenMP threads; products are shared the same way (``_gemm``).
Idle OpenMP workers spin briefly, so a hand-off takes a few microseconds (a 100 us depthwise
convolution gains 1.8x from a second core; Python threads gained 1.3x: waking a thread and
handing it the GIL cost 20-40 us on this project's VM; docs/design.md, "Threads").

GNU OpenMP cannot run in a forked child of a process that used it (Numba terminates such a
child), so after a fork every call runs serially. One call at a time holds the parallel slot; a
call that finds it taken (another service thread) runs serially, so concurrent callers do not
oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
import os
import threading

from .. import _num_threads

_parallel_slot = threading.Lock()
_forked = [False]


def _serial_in_child() -> None:
    """A forked child must never launch an OpenMP region (see the module doc)."""
    global _parallel_slot
    _parallel_slot = threading.Lock()
    _forked[0] = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_serial_in_child)


def thread_count() -> int:
    """Threads a split kernel may use (``set_num_threads``, else Numba's default)."""
    n = _num_threads[0]
    if n is None:
        import numba

        n = numba.config.NUMBA_NUM_THREADS
    return max(1, int(n))


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
