"""This machine's sgemm throughput: numpy matmul of square float32 matrices (OpenBLAS), so
GEMM-bound convolutions can be reported as a share of it.

Run: python bench/sgemm_peak.py [threads]   (default FASTLAYERS_BENCH_THREADS or 2)
Prints GFLOP/s (2 n^3 / best time) for n = 512, 1024, 2048 and the best of them.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def sgemm_gflops(n: int, repeats: int = 7) -> float:
    """Best-of-``repeats`` GFLOP/s of an n x n x n float32 matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)  # warm up the BLAS threads
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    threads = int(argv[0]) if argv else int(os.environ.get("FASTLAYERS_BENCH_THREADS", "2"))
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        results = {n: sgemm_gflops(n) for n in (512, 1024, 2048)}
    for n, g in results.items():
        print(f"sgemm {n}x{n}x{n}, {threads} threads: {g:.1f} GFLOP/s")
    print(f"peak: {max(results.values()):.1f} GFLOP/s")
    return results


if __name__ == "__main__":
    main()
