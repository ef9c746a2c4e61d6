"""This machine's sgemm throughput (numpy matmul, float32, its BLAS on the run's thread count),
the yardstick for GEMM-bound rows: bench/tools/report.py gives their GFLOP/s as a share of the best
figure here. fastlayers' own products do not use BLAS; numpy's pool is set to
FASTLAYERS_BENCH_THREADS for this benchmark only."""

from __future__ import annotations

import os

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from .conftest import THREADS

SIZES = [1024, 2048] if os.environ.get("FASTLAYERS_BENCH_FULL") else [256]


@pytest.mark.parametrize("n", SIZES)
def bench_sgemm(benchmark, n):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    benchmark.group = "sgemm"
    benchmark.extra_info.update(workload=f"sgemm {n}x{n}x{n}", batch=1, engine="numpy", flops=2 * n**3)
    with threadpool_limits(limits=THREADS, user_api="blas"):
        benchmark(np.matmul, a, b, out=out)
