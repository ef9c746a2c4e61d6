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
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), w),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        numpy_helper.from_array(np.array([3, 3], np.int64), "halves"),
        numpy_helper.from_array(np.array([2.5], np.float32), "const_out"),
    ]
    nodes = [
        helper.make_node("MatMul", [x, w], [s]),
        helper.make_node("Relu", [s], [r]),
        helper.make_node("Split", [r, "halves"], [sa, sb], axis=1),
        helper.make_node("Shape", [x], [shape]),
        helper.make_node("Concat", ["minus1", shape], [cat], axis=0),
        helper.make_node("Slice", [cat, "zero", "two"], ["target"]),
        helper.make_node("Reshape", [sa, "target"], [y]),
        helper.make_node("Tanh", [y], [z]),
    ]
    inits += [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "compiled",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (z, x, "const_out")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_compiled_calls_match_the_interpreter_and_onnxruntime(rng):
    ort = oracle("onnxruntime")
    data = _model()
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (1, 4, 4, 7, 1):  # shapes seen before take the cache
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        got = ours.run(None, {"x": x})
        for g, w in zip(got, session.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
        every = ours._evaluate([x], every_value=True)  # the interpreter, every value kept
        np.testing.assert_array_equal(got[0], every["z"])
        assert "split_a" in every  # an intermediate the call dropped
    assert callable(ours._compiled) and len(ours._compiled_shapes) == 3


def test_value_names_stay_data(rng):
    """Names that would be code if pasted into the function are only string literals."""
    names = (
        "x",
        "w'] + __import__('os').system('exit 3') + ['",
        "s\nimport os",
        'r"""',
        "cat\\",
        "y)",
        "a{}",
        "b%s",
        "shape'",
        "z' : 1, '",
    )
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
    ours._compiled = ours._bound = ours._timed = None  # compiled anew (load ran a warm-up call)
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


def _if_model(names=("x", "c", "w", "t", "s", "y", "q", "r", "o", "p")):
    """An If on an input whose then-branch reads the input's shape (a shape-only chain), holds
    a nested If on a value the call computes, and returns a constant of its own; its
    else-branch passes an outer value on and negates another."""
    x, c, w, t, s, y, q, r, o, p = names
    h = helper
    rng = np.random.default_rng(1)
    inner_then = h.make_graph(
        [h.make_node("Neg", [t], ["inner_o"])],
        "inner_then",
        [],
        [h.make_tensor_value_info("inner_o", TensorProto.FLOAT, None)],
    )
    inner_else = h.make_graph(
        [h.make_node("MatMul", [t, w], ["inner_e"])],
        "inner_else",
        [],
        [h.make_tensor_value_info("inner_e", TensorProto.FLOAT, None)],
    )
    then = h.make_graph(
        [
            h.make_node("Shape", [x], [s]),
            h.make_node("Gather", [s, "zero"], ["rows"], axis=0),
            h.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
            h.make_node("Mul", [t, "rows_f"], [q]),
            h.make_node("ReduceSum", [q], ["total"], keepdims=0),
            h.make_node("Greater", ["total", "zero_f"], ["positive"]),
            h.make_node("If", ["positive"], [r], then_branch=inner_then, else_branch=inner_else),
        ],
        "then",
        [],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (r, "own_const")],
        [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
            numpy_helper.from_array(np.full((1, 3), 7.0, np.float32), "own_const"),
        ],
    )
    other = h.make_graph(
        [h.make_node("Neg", [t], [o]), h.make_node("Identity", [x], [p])],
        "else",
        [],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (o, p)],
    )
    nodes = [
        h.make_node("Tanh", [x], [t]),
        h.make_node("If", [c], [y, "second"], then_branch=then, else_branch=other),
        h.make_node("Add", [y, "second"], ["z"]),
    ]
    graph = h.make_graph(
        nodes,
        "branches",
        [h.make_tensor_value_info(x, TensorProto.FLOAT, [None, 3]), h.make_tensor_value_info(c, TensorProto.BOOL, [])],
        [h.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((3, 3)).astype(np.float32), w)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize(
    "names", [None, ("x", "c'] + [", "w\nimport os", 't"""', "s\\", "y)", "q{}", "r%s", "o' : 1, '", "p = 3")]
)
def test_if_branches_compiled_in_match_onnxruntime(rng, names, monkeypatch):
    """Both branches, the nested If's too, in the compiled function (no call runs a branch
    as a model of its own): each call takes the arm its condition picks, at several shapes
    (each branch's shape-only values cached per input shapes), with the interpreter's and
    onnxruntime's values; value names stay data."""
    from fastlayers.onnx import control

    ort = oracle("onnxruntime")
    data = _if_model(*(() if names is None else (names,)))
    # the Python plan's compiled function (a native plan runs the inner If, whose condition
    # the data sets, through its branch's own model)
    ours = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    interpreted = control.Body.run
    monkeypatch.setattr(control.Body, "run", lambda *a: pytest.fail("a branch ran as a model"))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x_name, c_name = ("x", "c") if names is None else names[:2]
    for batch, flag, sign in (
        (2, True, 1),
        (2, True, -1),
        (5, False, 1),
        (2, False, -1),
        (5, True, -1),
        (5, True, 1),
        (1, True, 1),
    ):
        x = (sign * np.abs(rng.standard_normal((batch, 3)))).astype(np.float32)
        feed = {x_name: x, c_name: np.array(flag)}
        got = ours.run(None, feed)
        assert_close(got[0], session.run(None, feed)[0], rtol=1e-5, atol=1e-6)
        with monkeypatch.context() as m:
            m.setattr(control.Body, "run", interpreted)
            every = ours._evaluate([x, np.array(flag)], every_value=True)  # the interpreter
        np.testing.assert_array_equal(got[0], every["z"])
    assert callable(ours._compiled)


def test_a_failing_step_in_a_branch_names_it_and_the_if(rng):
    ours = fastlayers.load(_if_model())

    def boom(inputs, attrs, opset):
        raise ValueError("boom")

    branch = next(n.attrs for n in ours._nodes if n.op_type == "If")["then_branch"].model
    k = branch.op_types.index("Mul")
    fn, ins, outs, attrs, shape_only = branch._plan[k]
    branch._plan[k] = (boom, ins, outs, attrs, shape_only)
    ours._compiled = branch._bound = None
    x = rng.standard_normal((3, 3)).astype(np.float32)
    assert_close(ours.run(None, {"x": x, "c": np.array(False)})[0], x - np.tanh(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match=r"node 'y' \(If\).*node 'q' \(Mul\) failed on these inputs: boom"):
        ours.run(None, {"x": x, "c": np.array(True)})
    assert callable(ours._compiled)
