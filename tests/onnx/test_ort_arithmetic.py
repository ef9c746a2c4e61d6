"""ONNX operators computed in onnxruntime's own float arithmetic, bit for bit: a quantized graph
rounds each DynamicQuantizeLinear input to 8 bits, so one ulp apart before it can be one
quantization step apart after it (ddddocr's captcha model moved by 8e-3 of its output range
from Sigmoid alone)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import fastlayers
from fastlayers.backends.activations import _activation

from ..conftest import oracle


def _inputs():
    rng = np.random.default_rng(0)
    edges = np.float32(
        [
            0.0,
            -0.0,
            1e-8,
            -1e-8,
            17.99,
            18.0,
            18.01,
            -18.0,
            -18.01,
            -30.0,
            30.0,
            88.0,
            -88.0,
            1e30,
            -1e30,
            np.inf,
            -np.inf,
        ]
    )
    return np.concatenate(
        [rng.standard_normal(8192).astype(np.float32) * 8, edges, rng.uniform(-20, 20, 4093).astype(np.float32)]
    ).astype(np.float32)


def _graph(nodes):
    n = _inputs().size
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


CASES = {
    "Sigmoid": [helper.make_node("Sigmoid", ["x"], ["y"])],
    "x * Sigmoid(x)": [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
    "Tanh": [helper.make_node("Tanh", ["x"], ["y"])],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime_bit_for_bit(case):
    ort = oracle("onnxruntime")
    from fastlayers import native

    if native.isa() == "generic":
        pytest.skip("the portable path has no fused multiply-add (onnxruntime uses one on x86-64 with FMA)")
    proto = _graph(CASES[case])
    x = _inputs()[None]
    want = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = fastlayers.load(proto).run(None, {"x": x})[0]
    mismatch = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not mismatch.any(), f"{mismatch.sum()} of {x.size} differ, e.g. x={x[mismatch][:4]}"


def test_reference_and_native_paths_agree(isa):
    """The numpy oracle of onnx_sigmoid / onnx_silu / onnx_tanh against the native kernels on every ISA path:
    the same bits where the path has fused multiply-adds, within a few ulp on the portable one."""
    from fastlayers import native

    x = _inputs()
    cpu = fastlayers.get_ops("cpu")
    for name in ("onnx_sigmoid", "onnx_silu", "onnx_tanh"):
        want = _activation(x, name, 0.0)
        got = cpu.activation(x, name)
        if native.isa() == "generic":
            # a * b + c rounded twice: up to about 1e-7 apart in sigmoid, times |x| in silu
            ok = np.isfinite(want)
            assert np.array_equal(got[~ok], want[~ok], equal_nan=True)
            err = np.abs(got[ok].astype(np.float64) - want[ok])
            assert np.all(err <= 3e-7 * np.maximum(1, np.abs(x[ok]))), err.max()
        else:
            np.testing.assert_array_equal(got, want)


def test_close_to_the_exact_sigmoid():
    """Within 1.5e-7 (2.5 ulp of 1) of sigmoid in absolute terms over [-18, 18] (float64
    reference), and sigmoid(-18) below."""
    x = _inputs()
    x = x[np.abs(x) < 100]
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    got = fastlayers.get_ops("cpu").activation(x, "onnx_sigmoid").astype(np.float64)
    inside = np.abs(x) <= 18
    assert np.abs(got - exact)[inside].max() < 1.5e-7
    assert np.all(got[x < -18] == got[x == -18][0])
