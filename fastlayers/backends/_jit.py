"""The one Numba policy of fastlayers: every CPU kernel is compiled through ``njit`` below.

- ``cache=True``: compiled code is written next to the module (or to NUMBA_CACHE_DIR) and reused
  by later processes; ``fastlayers warmup`` fills the cache ahead of time.
- No signatures at decoration, so nothing is compiled at import; ``warmup`` compiles the exact
  signatures the backend calls with (each kernel registers them with ``signatures=``).
- ``nogil=True``: concurrent calls from Python threads run in parallel.
- fastmath without ``nnan``/``ninf``: NaN and inf propagate as in numpy.
- The threading layer must be thread-safe (OpenMP or TBB) because services call kernels from
  many threads at once; Numba's default ``workqueue`` layer aborts on concurrent launches.
"""

from __future__ import annotations

import numba

from . import _num_threads

FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
numba.config.THREADING_LAYER = "threadsafe"

#: Every compiled kernel with the signatures the backend calls it with, for ``warmup``.
KERNELS: list[tuple[numba.core.registry.CPUDispatcher, tuple[str, ...]]] = []
#: Functions that compile kernels by running them on tiny inputs, for ``warmup``: kernels whose
#: argument types have no signature string (a ctypes function, a tuple of arrays).
WARM_CALLS: list = []


def warm_call(fn):
    """Register ``fn()`` (compiles kernels by calling them) with ``warmup``."""
    WARM_CALLS.append(fn)
    return fn


def njit(*, signatures: tuple[str, ...] = (), parallel: bool = False, inline: bool = False):
    """Decorate a kernel with the project's policy; ``signatures`` are compiled by ``warmup``."""

    def wrap(fn):
        dispatcher = numba.njit(cache=not inline, nogil=True, fastmath=FASTMATH,
                                error_model="numpy", parallel=parallel,
                                inline="always" if inline else "never")(fn)
        if signatures:
            KERNELS.append((dispatcher, signatures))
        return dispatcher

    return wrap


def apply_num_threads() -> None:
    """Apply ``set_num_threads`` to Numba in the calling thread (Numba's mask is thread-local)."""
    n = _num_threads[0]
    if n is not None:
        n = min(n, numba.config.NUMBA_NUM_THREADS)
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)


def pin_blas() -> None:
    """Run the BLAS libraries on one thread: fastlayers splits its products among its own threads
    (``cpu/_gemm.py``), each share one BLAS call, including the sgemm calls compiled kernels make
    through Numba's ``np.dot`` (scipy's BLAS)."""
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library Numba's np.dot calls)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def warmup(progress=None) -> int:
    """Compile every registered kernel for its signatures, then run the ``WARM_CALLS`` (filling
    the cache); return the count of signatures and calls."""
    done = 0
    for dispatcher, signatures in KERNELS:
        for sig in signatures:
            dispatcher.compile(sig)
            done += 1
            if progress is not None:
                progress(done, dispatcher.__name__)
    for fn in WARM_CALLS:
        fn()
        done += 1
        if progress is not None:
            progress(done, fn.__name__)
    return done
