"""Benchmark helpers: the three engines on the same inputs and thread count.

Run: ``python -m pytest bench --benchmark-enable --benchmark-json=bench/results.json``; CI runs
the same files once with ``--benchmark-disable`` (each benchmark body executes once, unchecked
for time), so they stay correct.
"""

from __future__ import annotations

import importlib
import os
import time

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

THREADS = int(os.environ.get("FASTLAYERS_BENCH_THREADS", "2"))


def oracle(module: str):
    """Import another engine or a tool, or skip (fail under FASTLAYERS_REQUIRE_ORACLES=1, as CI sets)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("FASTLAYERS_REQUIRE_ORACLES") == "1":
            pytest.fail(f"{module!r} is required (FASTLAYERS_REQUIRE_ORACLES=1) but missing: {e}")
        pytest.skip(f"{module!r} not installed")


@pytest.fixture(scope="session", autouse=True)
def fixed_threads():
    import fastlayers

    fastlayers.set_num_threads(THREADS)
    yield THREADS


def ort_session(model_proto, spinning: bool = True):
    """An onnxruntime session on ``THREADS`` intra-op threads (spin-waiting on or off)."""
    ort = oracle("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(model_proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def torch_module():
    torch = oracle("torch")
    torch.set_num_threads(THREADS)
    return torch


def check_same(outputs: dict, rtol=1e-4, atol=1e-5):
    """Every engine's output equals the first one's (validated before timing)."""
    items = list(outputs.items())
    name0, ref = items[0]
    for name, out in items[1:]:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"{name} vs {name0}")
    # onnxruntime's and torch's pool threads keep spinning for a while after a call: the first
    # 40 calls (70 ms) of the ONNX LSTM classifier after one onnxruntime call ran 1.5-2x slower
    time.sleep(_PAUSE[0])


#: Seconds ``check_same`` waits before the timing: only when benchmarks are timed (CI runs each
#: bench once with timing disabled, where 0.2 s per bench would add about 30 s).
_PAUSE = [0.0]


def pytest_configure(config):
    timed = not (config.getoption("benchmark_disable", False) and not config.getoption("benchmark_enable", False))
    _PAUSE[0] = 0.2 if timed else 0.0


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Record library versions and the thread count in the JSON that bench/tools/report.py reads."""
    import importlib
    import importlib.metadata as md

    versions = {}
    for dist in ("fastlayers", "numpy", "numba", "onnxruntime", "torch", "scipy"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    try:
        np_config = importlib.import_module("numpy").show_config(mode="dicts")
        blas = np_config["Build Dependencies"]["blas"]
        versions["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - optional detail
        pass
    output_json["fastlayers_bench"] = {"threads": THREADS, "versions": versions}
