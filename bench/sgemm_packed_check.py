"""numpy's OpenBLAS sgemm (one call, and in 64-column blocks as the recurrent steps called it)
vs fastlayers' sgemm on packed weights, each called from a Numba loop (no Python per call), one
thread; see docs/design.md ("Cython: fastlayers' own sgemm").

Run: python bench/sgemm_packed_check.py [MxKxN ...]
"""
import sys
import time

import numpy as np

from fastlayers.backends import get_ops
from fastlayers.backends._jit import njit
from fastlayers.backends.cpu import _blas
from fastlayers.backends.cpu._blas import packed, sgemm

get_ops("cpu")                                   # pins BLAS to one thread


@njit()
def openblas_loop(fn, a, b, c, reps, step):
    n = b.shape[1]
    for _ in range(reps):
        for c0 in range(0, n, step):
            sgemm(fn, a, b[:, c0:c0 + step], c[:, c0:c0 + step], False, 0.0)


@njit()
def packed_loop(fn, a, pb, c, reps):
    for _ in range(reps):
        packed(fn, a, pb, c, 0.0)


SHAPES = ["49x4608x512", "3200x128x1024", "1024x256x1024", "1024x256x768", "196x2304x256",
          "32x256x1024", "8x128x512", "1x256x1024", "12544x147x64"]
rng = np.random.default_rng(0)
for shape in sys.argv[1:] or SHAPES:
    m, k, n = map(int, shape.split("x"))
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    pb, c = _blas.pack(b), np.empty((m, n), np.float32)
    reps = max(3, int(1e8 / (2 * m * n * k)))
    runs = {"openblas": lambda: openblas_loop(_blas.SGEMM, a, b, c, reps, n),
            "openblas 64-col": lambda: openblas_loop(_blas.SGEMM, a, b, c, reps, 64),
            "packed": lambda: packed_loop(_blas.PACKED, a, pb, c, reps)}
    best = {}
    for _ in range(5):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            best[name] = min(best.get(name, 1e9), (time.perf_counter() - t) / reps)
    print(shape, "  ".join(f"{name} {2 * m * n * k / s / 1e9:6.1f}" for name, s in best.items()),
          "GFLOP/s")
