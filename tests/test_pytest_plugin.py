"""The pytest plugin (fastlayers.pytest_plugin) as a project's test suite meets it, each run in a
pytest subprocess: budgets that pass and fail, the ratio against onnxruntime (and its refusal
when the outputs differ), the threads restored, extra_info in --benchmark-json,
--benchmark-disable (one run, budgets not checked, said), pytest without pytest-benchmark
(skipped, said), and the example of examples/speed_check as written."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import oracle
from .tiny_onnx import dense_model

pytest_plugins = ["pytester"]

# Imported before pytester snapshots sys.modules: pytester drops the modules a test imported
# when it ends, and onnx's extension, imported a second time in one process, aborts it.
for _module in ("onnx", "onnxruntime"):
    try:
        importlib.import_module(_module)
    except ImportError:  # the tests that need it are skipped by oracle()
        pass

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "speed_check" / "test_speed.py"
#: The plugin by module name, whether or not the installed package's entry point (named
#: ``fastlayers``) also loads it: blocked by that name, then loaded by this one.
PLUGIN = ("-p", "no:fastlayers", "-p", "fastlayers.pytest_plugin", "-p", "no:cacheprovider")
#: pytest-benchmark's rounds kept short.
QUICK = ("--benchmark-max-time=0.02", "--benchmark-min-rounds=3")

CHECKS = """
import fastlayers
import pytest
from fastlayers import benchmark, native


def test_within_budget(fastlayers_bench):
    r = fastlayers_bench("tiny.onnx", max_ms=1000.0)
    assert r.outputs[0].shape == (1, 8) and r.batch == 1
    assert r.checked == (r.median_ms is not None)
    assert r.median_ms is None or 0 < r.median_ms < 1000


def test_over_budget(fastlayers_bench):
    fastlayers_bench("tiny.onnx", max_ms=1e-9, rounds=3)


def test_ratio(fastlayers_bench):
    r = fastlayers_bench("tiny.onnx", batch=4, max_ratio=1000.0, rounds=3, ratio_seconds=0.02)
    assert r.max_abs_diff < 1e-4
    assert (r.ratio is None) if not r.checked else (
        r.ratio == pytest.approx(r.fastlayers_p50_ms / r.onnxruntime_p50_ms))


def test_ratio_over(fastlayers_bench):
    fastlayers_bench("tiny.onnx", max_ratio=1e-6, rounds=3, ratio_seconds=0.02)


def test_outputs_differ(fastlayers_bench, monkeypatch):
    plain = benchmark.runner
    monkeypatch.setattr(benchmark, "runner",
                        lambda model, arrays: (lambda run: lambda: [y + 1 for y in run()])(
                            plain(model, arrays)))
    fastlayers_bench("tiny.onnx", max_ratio=1000.0, rounds=3, ratio_seconds=0.02)


def test_threads_restored(fastlayers_bench):
    fastlayers.set_num_threads(2)
    r = fastlayers_bench("tiny.onnx", threads=1, rounds=2, profile=False)
    assert r.threads == 1 and r.profile is None
    assert native.get_num_threads() == 2 and fastlayers.get_num_threads() == 2


def test_loaded_once_and_inputs_given(fastlayers_bench, fastlayers_models):
    import numpy as np

    model = fastlayers_models.get("tiny.onnx")
    assert fastlayers_models.get("./tiny.onnx") is model
    r = fastlayers_bench(model, inputs={"x": np.ones((3, 16))}, rounds=2)
    assert r.batch == 3 and r.model == "dense"
"""

#: Python that makes pytest_benchmark unimportable, as where it is not installed.
BLOCK_PYTEST_BENCHMARK = """
import sys
import pytest


class _NoPytestBenchmark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "pytest_benchmark":
            raise ImportError(f"No module named {name!r}")


sys.modules.pop("pytest_benchmark", None)
sys.meta_path.insert(0, _NoPytestBenchmark())
"""

ENABLED = {"passed": 4, "failed": 3}
DISABLED = {"passed": 6, "failed": 1}


@pytest.fixture
def suite(pytester):
    """A project with the tiny model and CHECKS."""
    oracle("onnxruntime")
    dense_model(pytester.path / "tiny.onnx", ["N", 16])
    pytester.makepyfile(test_checks=CHECKS)
    return pytester


def _failure(result, test):
    """The report of ``test``'s failure: its section of the FAILURES part of the output."""
    text = result.stdout.str()
    start = text.index(f" {test} _")
    ends = [text.find(mark, start + 1) for mark in ("\n___", "\n===")]
    return text[start : min(e for e in ends if e > 0)]


def test_budgets_ratio_and_extra_info(suite):
    result = suite.runpytest_subprocess(*PLUGIN, *QUICK, "-rf", "--benchmark-json=b.json")
    result.assert_outcomes(**ENABLED)
    assert "fastlayers_bench: tiny.onnx: median " in _failure(result, "test_over_budget")
    assert "exceeds max_ms=1e-09 (threads 1, batch 1)" in _failure(result, "test_over_budget")
    assert "x onnxruntime exceeds max_ratio=1e-06 (p50 " in _failure(result, "test_ratio_over")
    differ = _failure(result, "test_outputs_differ")
    assert "fastlayers_bench: output 'y': fastlayers and onnxruntime differ" in differ
    assert "max |difference| 1" in differ and "not timed" in differ
    assert "Traceback" not in differ and "During handling" not in differ
    data = json.loads((suite.path / "b.json").read_text())
    info = {b["name"]: b["extra_info"] for b in data["benchmarks"]}
    ratio = info["test_ratio"]
    assert ratio["model"] == "tiny.onnx" and ratio["threads"] == 1 and ratio["batch"] == 4
    assert ratio["inputs"] == {"x": [4, 16]} and ratio["budget"] == "passed"
    assert ratio["max_ratio"] == 1000.0 and ratio["median_ms"] > 0
    assert set(ratio["onnxruntime"]) == {"max_abs_diff", "fastlayers_p50_ms", "onnxruntime_p50_ms", "ratio", "calls"}
    profile = ratio["profile"]
    assert profile["threads"] == 1 and profile["total_ms"] > 0 and profile["by_op"]
    assert profile["steps"] and {"op_type", "kernel", "ms", "share", "input_shapes"} <= set(profile["steps"][0])
    assert profile["steps"][0]["input_shapes"][0] == [4, 16]
    assert "profile" not in info["test_threads_restored"]


def test_benchmark_disable_runs_once_without_budgets(suite):
    result = suite.runpytest_subprocess(*PLUGIN, "--benchmark-disable", "-rf")
    result.assert_outcomes(**DISABLED, warnings=7)  # and pytest-benchmark's "not used"
    out = result.stdout.str()
    assert out.count("FastlayersBenchWarning: ") == 6
    assert "FastlayersBenchWarning" in out and "benchmarks are disabled (--benchmark-disable)" in out
    assert "max_ms=1e-09 not checked" in out and "max_ratio=1e-06 not checked" in out
    assert "differ" in _failure(result, "test_outputs_differ")  # still checked for correctness


def test_without_pytest_benchmark(pytester):
    """pytest_benchmark cannot even be imported: pytest runs, the fixture's test is skipped."""
    pytester.makepyfile(
        test_one=BLOCK_PYTEST_BENCHMARK
        + "\n"
        + (
            "def test_one(fastlayers_bench):\n    fastlayers_bench('m.onnx')\n\n"
            "def test_other():\n    with pytest.raises(ImportError):\n"
            "        import pytest_benchmark  # noqa: F401\n"
        )
    )
    code = BLOCK_PYTEST_BENCHMARK + "\nsys.exit(pytest.main(sys.argv[1:]))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, "-p", "no:benchmark", *PLUGIN, "-rs", "test_one.py"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout
    assert "fastlayers_bench needs pytest-benchmark" in proc.stdout


def test_the_example_runs_as_written(pytester):
    oracle("onnx")
    oracle("onnxruntime")
    pytester.makepyfile(test_speed=EXAMPLE.read_text())
    result = pytester.runpytest_subprocess(*PLUGIN, *QUICK)
    result.assert_outcomes(passed=3)
