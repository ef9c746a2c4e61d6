"""Shape operators bound at load on their constant inputs (``fastlayers.onnx.bound``): the same
outputs as onnxruntime call after call as input shapes change and repeat, the general form's
errors on a shape that does not fit, and the general form where an input is computed."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import FastlayersError
from fastlayers.onnx import bound, ops

from ..conftest import assert_close, oracle

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(opset):
    """x -> Unsqueeze(axes) -> Slice(constant starts/ends/axes/steps) -> Squeeze(axes) -> y,
    and Squeeze with no axes -> z; axes as inputs from opset 13, attributes before."""
    inits = [
        numpy_helper.from_array(np.array([1, -1], np.int64), "starts"),
        numpy_helper.from_array(np.array([100, -5], np.int64), "ends"),
        numpy_helper.from_array(np.array([0, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array([1, -2], np.int64), "steps"),
    ]
    if opset >= 13:
        inits += [
            numpy_helper.from_array(np.array([1, 3], np.int64), "un_axes"),
            numpy_helper.from_array(np.array([1], np.int64), "sq_axes"),
        ]
        un = helper.make_node("Unsqueeze", ["x", "un_axes"], ["u"])
        sq = helper.make_node("Squeeze", ["s", "sq_axes"], ["y"])
    else:
        un = helper.make_node("Unsqueeze", ["x"], ["u"], axes=[1, 3])
        sq = helper.make_node("Squeeze", ["s"], ["y"], axes=[1])
    nodes = [
        un,
        helper.make_node("Slice", ["u", "starts", "ends", "axes", "steps"], ["s"]),
        sq,
        helper.make_node("Squeeze", ["u"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bound",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


def _matches_onnxruntime(data, shapes, rng, tol):
    """The model ``data`` (one input x) loaded by fastlayers gives onnxruntime's outputs on
    float32 inputs of each of ``shapes`` in turn (shapes repeat: bound nodes reuse their
    geometry); returns the fastlayers model."""
    ort = oracle("onnxruntime")
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        for got, want in zip(ours.run(None, {"x": x}), session.run(None, {"x": x})):
            assert got.shape == want.shape
            assert_close(got, want, rtol=tol, atol=tol)
    return ours


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_bound_shape_ops_match_onnxruntime(rng, opset):
    _matches_onnxruntime(_model(opset), [(4, 9), (4, 9), (3, 12), (4, 9), (2, 20)], rng, 0)


def test_a_shape_the_node_refuses_raises_the_general_error(rng):
    ours = fastlayers.load(_model(17))
    ours.run(None, {"x": rng.standard_normal((4, 9)).astype(np.float32)})
    with pytest.raises(FastlayersError, match="Unsqueeze"):  # axis 3 of a rank-2 output
        ours.run(None, {"x": np.float32(1.0).reshape(())})


def test_computed_parameters_keep_the_general_form():
    axes = np.array([0], np.int64)
    assert ops.bind("Unsqueeze", ["x", axes], {}, 17) is not None
    assert ops.bind("Unsqueeze", ["x", "axes"], {}, 17) is None
    assert ops.bind("Slice", ["x", axes, "ends"], {}, 17) is None
    assert ops.bind("Slice", ["x", axes, axes, "axes"], {}, 17) is None
    assert ops.bind("Slice", ["x", axes, axes], {}, 9) is None
    assert ops.bind("Relu", ["x"], {}, 17) is None


def test_bound_nodes_keep_a_bounded_number_of_shapes(rng, monkeypatch):
    monkeypatch.setattr(bound, "MAX_SHAPES", 2)
    run = ops.bind("Unsqueeze", ["x", np.array([0], np.int64)], {}, 17)
    for n in range(1, 6):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        for _ in range(2):
            assert run([x, np.array([0], np.int64)], {}, 17)[0].shape == (1, n, 3)


def _pad_reduce_model(mode, pads, reduce_op, axes, keepdims, noop=0):
    """x -> Pad(mode, constant pads, value 1.5) -> p, and x -> <reduce_op>(constant axes) -> r
    (opset 18: pads and axes as inputs)."""
    inits = [
        numpy_helper.from_array(np.array(pads, np.int64), "pads"),
        numpy_helper.from_array(np.array(1.5, np.float32), "value"),
    ]
    ins = ["x"]
    if axes is not None:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        ins.append("axes")
    nodes = [
        helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode=mode),
        helper.make_node(reduce_op, ins, ["r"], keepdims=keepdims, noop_with_empty_axes=noop),
    ]
    graph = helper.make_graph(
        nodes,
        "bound",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "pr"],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 2, 0, 3], [1, 2, 1, 0], [0, -1, 1, 2]])
@pytest.mark.parametrize(
    "reduce_op, axes, keepdims, noop",
    [
        ("ReduceMean", [1], 1, 0),
        ("ReduceMean", [-1, 0], 0, 0),
        ("ReduceMean", None, 1, 0),
        ("ReduceSum", [1], 0, 0),
        ("ReduceMax", [0], 1, 0),
        ("ReduceL2", [1], 1, 0),
        ("ReduceSum", None, 1, 1),
    ],
)
def test_bound_pad_and_reductions_match_onnxruntime(rng, mode, pads, reduce_op, axes, keepdims, noop):
    _matches_onnxruntime(
        _pad_reduce_model(mode, pads, reduce_op, axes, keepdims, noop),
        [(4, 9), (4, 9), (3, 12), (4, 9), (2, 5)],
        rng,
        1e-6,
    )


@pytest.mark.parametrize(
    "reduce_op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceSumSquare"]
)
@pytest.mark.parametrize("axes, keepdims", [([1], 0), ([1], 1), ([-1, 0], 0), ([0, 1], 1)])
def test_bound_reductions_over_axes_of_length_one_match_onnxruntime(rng, reduce_op, axes, keepdims):
    # (1, 1) reduces to itself for the first five (a reshape), to a value computed for the others
    ours = _matches_onnxruntime(
        _pad_reduce_model("constant", [0, 0, 0, 0], reduce_op, axes, keepdims),
        [(1, 1), (1, 1), (3, 1), (3, 1), (1, 4), (1, 1)],
        rng,
        1e-6,
    )
    got = ours.run(None, {"x": np.full((1, 1), np.nan, np.float32)})[1]
    assert np.isnan(got).all()


def test_bound_pad_checks_the_size_limit_on_every_call():
    ours = fastlayers.load(_pad_reduce_model("reflect", [0, 2, 0, 3], "ReduceMean", [1], 1))
    x = np.ones((4, 9), np.float32)
    ours.run(None, {"x": x})
    ours.run(None, {"x": x})  # the bound plan
    with fastlayers.settings.applied(fastlayers.LoadOptions(onnx_max_created_bytes=64)):
        with pytest.raises(FastlayersError, match="Pad"):
            ours.run(None, {"x": x})


def test_bound_pad_and_reductions_on_computed_parameters_keep_the_general_form():
    pads, axes = np.array([0, 1, 0, 1], np.int64), np.array([1], np.int64)
    assert ops.bind("Pad", ["x", pads], {}, 18) is not None
    assert ops.bind("Pad", ["x", "pads"], {}, 18) is None
    assert ops.bind("Pad", ["x", pads, "value"], {}, 18) is None
    assert ops.bind("ReduceMean", ["x", axes], {}, 18) is not None
    assert ops.bind("ReduceMean", ["x", "axes"], {}, 18) is None
    assert ops.bind("ReduceMean", ["x"], {"axes": [1]}, 13) is not None


@pytest.mark.parametrize(
    "index",
    [
        np.array(1),
        np.array(-1),
        np.array([1]),
        np.array([0, 1, 2]),
        np.array([-2, -1]),
        np.array([2, 0]),
        np.array([[0], [1]]),
        np.array([1], np.int32),
    ],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_bound_gather_matches_onnxruntime(rng, index, axis):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(index, "i")],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    ours = _matches_onnxruntime(data, [(3, 4), (3, 4), (4, 3, 5), (3, 4)], rng, 0)
    with pytest.raises(FastlayersError, match="Gather"):  # out of bounds on a new shape
        ours.run(None, {"x": np.ones((0, 1) if axis == 0 else (1, 0), np.float32)})


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 8, 1, 0, 8, 2], [3, 0, 0, 1, 1, 7], [1, 1, 1, 1, 1, 1], [0, 0, 5, 0, 0, 5]])
def test_pad_modes_whole_axes_match_numpy(rng, mode, pads):
    """Pad's reflect, edge and wrap modes up to whole axes (reflect: all but the edge) on three
    axes, as numpy's pad of the same names: each end copied as a slice, or one value broadcast."""
    from fastlayers.onnx.ops.shape import pad_plan

    x = rng.standard_normal((4, 9, 8)).astype(np.float32)
    width = list(zip(pads[:3], pads[3:]))
    got = pad_plan(x.shape, x.dtype, [x, np.array(pads, np.int64)], {"mode": mode}, 18)(x)
    np.testing.assert_array_equal(got, np.pad(x, width, mode={"edge": "edge", "wrap": "wrap"}.get(mode, "reflect")))
