"""Speed checks of a model in a project's own test suite, with fastlayers' pytest plugin.

Copy this file next to your tests and point ``MODEL`` at your model file (here a small ONNX MLP
is made in a fixture, so that the example runs as it is). The ``fastlayers_bench`` fixture comes
with fastlayers and needs pytest-benchmark (``pip install pytest-benchmark``).

    pytest test_speed.py                          # time, check the budgets
    pytest test_speed.py --benchmark-json=b.json  # and keep the figures, the profile included
    pytest test_speed.py --benchmark-disable      # run once for correctness, no budget checked

Budgets are host-specific: set them from figures taken on the machine that runs the checks
(``fastlayers bench MODEL --against onnxruntime`` prints them), with a margin for its noise.
"""

from __future__ import annotations

import numpy as np
import pytest

#: Your model file; None: the small MLP that the ``model_path`` fixture writes.
MODEL = None


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """``MODEL``, or an ONNX MLP (64 -> 128 ReLU -> 10, batch free) written once per session."""
    if MODEL is not None:
        return MODEL
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [weight("w1", 64, 128), weight("b1", 128), weight("w2", 128, 10), weight("b2", 10)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("speed_check") / "mlp.onnx"
    onnx.save(model, str(path))
    return str(path)


def test_latency_budget(fastlayers_bench, model_path):
    """One sample on one thread within a budget (median of pytest-benchmark's rounds)."""
    result = fastlayers_bench(model_path, batch=1, threads=1, max_ms=20.0)
    assert result.outputs[0].shape == (1, 10)


def test_batch_throughput(fastlayers_bench, model_path):
    """A batch of 32 on two threads; the profile per step lands in the benchmark's extra_info."""
    result = fastlayers_bench(model_path, batch=32, threads=2, max_ms=50.0)
    if result.median_ms is not None:  # None under --benchmark-disable
        print(f"{32 / result.median_ms * 1e3:,.0f} samples/s")


def test_not_slower_than_onnxruntime(fastlayers_bench, model_path):
    """fastlayers within 1.5x of onnxruntime on the same file (outputs checked equal first)."""
    pytest.importorskip("onnxruntime")
    fastlayers_bench(model_path, batch=8, threads=1, max_ratio=1.5, ratio_seconds=0.5)
