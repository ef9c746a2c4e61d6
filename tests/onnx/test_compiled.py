"""An ONNX model's plan compiled into one function (``fastlayers.onnx.compiled``): the same
values as the plan interpreter and onnxruntime, shape-only steps cached per input shapes, the
failing node named, value names from the file never turned into code, and the interpreter for
plans over the size limit."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError
from fastlayers.onnx import compiled

from ..conftest import assert_close, oracle

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(names=("x", "w", "s", "r", "cat", "y", "split_a", "split_b", "shape", "z")):
    """A graph with a shape-only chain (Shape -> Concat -> Reshape's target), a node with two
    outputs of which one is unread, a graph output that is an input, one that is a constant."""
    x, w, s, r, cat, y, sa, sb, shape, z = names
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), w),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([3, 3], np.int64), "halves"),
             numpy_helper.from_array(np.array([2.5], np.float32), "const_out")]
    nodes = [helper.make_node("MatMul", [x, w], [s]),
             helper.make_node("Relu", [s], [r]),
             helper.make_node("Split", [r, "halves"], [sa, sb], axis=1),
             helper.make_node("Shape", [x], [shape]),
             helper.make_node("Concat", ["minus1", shape], [cat], axis=0),
             helper.make_node("Slice", [cat, "zero", "two"], ["target"]),
             helper.make_node("Reshape", [sa, "target"], [y]),
             helper.make_node("Tanh", [y], [z])]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([1], np.int64), "two")]
    graph = helper.make_graph(
        nodes, "compiled", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (z, x, "const_out")],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def test_compiled_calls_match_the_interpreter_and_onnxruntime(rng):
    ort = oracle("onnxruntime")
    data = _model()
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (1, 4, 4, 7, 1):                    # shapes seen before take the cache
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        got = ours.run(None, {"x": x})
        for g, w in zip(got, session.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
        every = ours._evaluate([x], every_value=True)   # the interpreter, every value kept
        np.testing.assert_array_equal(got[0], every["z"])
        assert "split_a" in every                     # an intermediate the call dropped
    assert callable(ours._compiled) and len(ours._compiled_shapes) == 3


def test_value_names_stay_data(rng):
    """Names that would be code if pasted into the function are only string literals."""
    names = ("x", "w'] + __import__('os').system('exit 3') + ['", "s\nimport os", 'r"""',
             "cat\\", "y)", "a{}", "b%s", "shape'", "z' : 1, '")
    data = _model(names)
    ours = fastlayers.load(data)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    outs = ours.run(None, {"x": x})
    assert ours.output_names[0] == names[-1] and outs[0].shape == (6,)
    ort = oracle("onnxruntime")
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert_close(outs[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_failing_step_names_its_node(rng):
    ours = fastlayers.load(_model())

    def boom(inputs, attrs, opset):
        raise ValueError("boom")

    k = ours.op_types.index("Tanh")
    fn, ins, outs, attrs, shape_only = ours._plan[k]
    ours._plan[k] = (boom, ins, outs, attrs, shape_only)
    ours._compiled = None                            # compiled anew (load ran a warm-up call)
    with pytest.raises(InputError, match=r"node 'z' \(Tanh\) failed on these inputs: boom"):
        ours.run(None, {"x": rng.standard_normal((3, 6)).astype(np.float32)})
    assert callable(ours._compiled)


def test_long_plans_run_on_the_interpreter(rng, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_STEPS", 3)
    ours = fastlayers.load(_model())
    x = rng.standard_normal((2, 6)).astype(np.float32)
    first = ours.run(None, {"x": x})
    assert ours._compiled is False
    monkeypatch.setattr(compiled, "MAX_STEPS", 20000)
    again = fastlayers.load(_model()).run(None, {"x": x})
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_the_shape_cache_is_bounded(rng, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_SHAPE_KEYS", 2)
    ours = fastlayers.load(_model())
    for batch in range(1, 6):
        ours.run(None, {"x": rng.standard_normal((batch, 6)).astype(np.float32)})
        assert len(ours._compiled_shapes) <= 2
