"""Calls from short-lived threads (a server answering each request on a new thread): the
process's memory stays flat and every call gives the main thread's result, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .graphs import conv_relu

ROOT = Path(__file__).resolve().parents[2]
CALLS = 300
#: RSS growth allowed over CALLS thread-per-call requests (the kernels' buffers of one call are
#: 3-4 MiB on the largest of these models, so a per-thread leak shows as hundreds of MiB)
GROWTH_MIB = 16


def _int8_graph(tmp_path):
    """A 256 -> 512 -> 256 MLP quantized by onnxruntime's quantize_dynamic (DynamicQuantizeLinear
    and MatMulInteger nodes), batch 32."""
    from onnx import TensorProto, helper, numpy_helper, save
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.1, 0.1, s).astype(np.float32), n)
        for n, s in [("w1", (256, 512)), ("b1", (512,)), ("w2", (512, 256)), ("b2", (256,))]
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 256])],
        inits,
    )
    float_path, path = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(float_path))
    quantize_dynamic(str(float_path), str(path), weight_type=QuantType.QInt8)
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")
def test_thread_per_call_memory_is_flat_and_results_bit_identical(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    onnx_path = conv_relu(tmp_path / "conv.onnx", batch=1, matmul=True)
    int8_path = _int8_graph(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "tests.services.thread_calls", str(CALLS), str(onnx_path), str(int8_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert set(report) == {"dense", "conv", "lstm", "attention", "onnx", "int8"}
    for kind, r in report.items():
        assert r["differ"] == 0, f"{kind}: {r['differ']} of {CALLS} calls differ from the main thread's result"
        assert r["growth_mib"] < GROWTH_MIB, f"{kind}: RSS grew {r['growth_mib']:.1f} MiB over {CALLS} new threads"
        # every thread that allocated kernel buffers had them freed at its exit
        assert r["released"] >= CALLS, f"{kind}: {r['released']} of {CALLS} threads' buffers freed"
