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


def pin_kernel_blas() -> None:
    """Run the BLAS library behind Numba's ``np.dot`` (scipy's) on one thread.

    Kernels call sgemm from several threads at once, each on its own share of the rows; a
    multi-threaded BLAS there would put 2 x n threads on n cores. numpy's own BLAS, when it is a
    different library (as in the wheels), keeps the count of ``set_num_threads``.
    """
    import os

    import numpy as np
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library Numba's np.dot calls)
    from threadpoolctl import ThreadpoolController

    numpy_dir = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    numpy_libs = {os.path.join(numpy_dir, d) for d in ("numpy.libs", "numpy", ".dylibs")}
    for lib in ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and not any(lib.filepath.startswith(d) for d in numpy_libs):
            lib.set_num_threads(1)


def warmup(progress=None) -> int:
    """Compile every registered kernel for its signatures (filling the cache); return the count."""
    done = 0
    for dispatcher, signatures in KERNELS:
        for sig in signatures:
            dispatcher.compile(sig)
            done += 1
            if progress is not None:
                progress(done, dispatcher.__name__)
    return done
