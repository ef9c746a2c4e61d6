"""ONNX models run as native plans (``fastlayers.onnx.lowering``): the values of onnxruntime
and of the Python plan, the nodes lowered natively, Ifs on shapes and small integer inputs
resolved per plan, nodes in Python inside the plan, shapes that depend on values, errors named
as the Python plan names them, threads, and the plans kept per key."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlayers
from fastlayers.backends import get_ops
from fastlayers.errors import FastlayersError
from fastlayers.native import _core
from fastlayers.onnx import lowering

from ..conftest import assert_close, in_threads, oracle

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

H = 16  # the LSTM's units


def _vad_model():
    """A streaming model shaped like Silero VAD: a reflect Pad, 1-D convolutions with ReLU,
    Slices and a magnitude (Python), a mean, an LSTM step on a carried state, Concat, Sigmoid,
    and an If on an integer input (a sample rate) whose branch reads the float values."""
    rng = np.random.default_rng(1)
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(np.array([0, 4, 0, 4], np.int64), "pads"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([6], np.int64), "six"),
        numpy_helper.from_array(np.array([12], np.int64), "twelve"),
        numpy_helper.from_array(np.array(0, np.int64), "first"),
        numpy_helper.from_array(np.array(1, np.int64), "second"),
        numpy_helper.from_array(np.array(16000, np.int64), "rate"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        numpy_helper.from_array(f(12, 1, 8), "w1"),
        numpy_helper.from_array(f(12), "b1"),
        numpy_helper.from_array(f(8, 6, 3), "w2"),
        numpy_helper.from_array(f(8), "b2"),
        numpy_helper.from_array(f(1, 4 * H, 8), "W"),
        numpy_helper.from_array(f(1, 4 * H, H), "R"),
        numpy_helper.from_array(f(1, 8 * H), "B"),
    ]
    then = helper.make_graph(
        [helper.make_node("Mul", ["p", "two"], ["scaled"])],
        "then",
        [],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["p"], ["kept"])],
        "else",
        [],
        [helper.make_tensor_value_info("kept", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Unsqueeze", ["padded", "one"], ["x3"]),
        helper.make_node("Conv", ["x3", "w1", "b1"], ["c1"], strides=[4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Slice", ["r1", "zero", "six", "one"], ["re"]),
        helper.make_node("Slice", ["r1", "six", "twelve", "one"], ["im"]),
        helper.make_node("Mul", ["re", "re"], ["re2"]),
        helper.make_node("Mul", ["im", "im"], ["im2"]),
        helper.make_node("Add", ["re2", "im2"], ["mag2"]),
        helper.make_node("Sqrt", ["mag2"], ["mag"]),
        helper.make_node("Conv", ["mag", "w2", "b2"], ["c2"], pads=[1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("ReduceMean", ["r2"], ["feat"], axes=[2], keepdims=0),
        helper.make_node("Unsqueeze", ["feat", "zero"], ["seq"]),
        helper.make_node("Gather", ["state", "first"], ["h0"], axis=0),
        helper.make_node("Gather", ["state", "second"], ["c0"], axis=0),
        helper.make_node("Unsqueeze", ["h0", "zero"], ["h03"]),
        helper.make_node("Unsqueeze", ["c0", "zero"], ["c03"]),
        helper.make_node("LSTM", ["seq", "W", "R", "B", "", "h03", "c03"], ["Y", "Yh", "Yc"], hidden_size=H),
        helper.make_node("Concat", ["Yh", "Yc"], ["new_state"], axis=0),
        helper.make_node("Squeeze", ["Yh", "zero"], ["h"]),
        helper.make_node("Sigmoid", ["h"], ["p"]),
        helper.make_node("Equal", ["sr", "rate"], ["is_rate"]),
        helper.make_node("If", ["is_rate"], ["prob"], then_branch=then, else_branch=other),
    ]
    graph = helper.make_graph(
        nodes,
        "vad",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, H]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("new_state", TensorProto.FLOAT, None),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _feed(rng, sr=16000):
    return {
        "x": rng.standard_normal((1, 64)).astype(np.float32),
        "state": (0.5 * rng.standard_normal((2, 1, H))).astype(np.float32),
        "sr": np.array(sr, np.int64),
    }


def _serving(model, feed):
    """The native plan that serves ``model``'s calls on ``feed`` (asserted to exist): the
    warm-up at load may have built one for its own zeros too."""
    plan = model._native.plan_for([np.asarray(feed[i.name]) for i in model.get_inputs()])
    assert plan is not None
    return plan


def _steps_per_op(plan):
    """{op type: the native steps of each of its nodes in ``plan``} (0: a view of its input)."""
    steps = np.bincount(plan.owner, minlength=len(plan.nodes))
    found: dict = {}
    for k, (model, index, *_) in enumerate(plan.nodes):
        found.setdefault(model._nodes[index].op_type, []).append(int(steps[k]))
    return found


def _exactly_onnxruntime(data, rng, shape):
    """The model of ``data`` loaded, its outputs on 4 random inputs ``x`` of ``shape`` the same
    bits as onnxruntime's: (model, the last input)."""
    ort = oracle("onnxruntime")
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(4):
        x = rng.standard_normal(shape).astype(np.float32)
        for g, w in zip(ours.run(None, {"x": x}), session.run(None, {"x": x})):
            np.testing.assert_array_equal(g, w)
    return ours, x


def _plans(model):
    if not model._native:
        return []
    return [p for p in model._native.plans.values() if isinstance(p, lowering.Plan)]


def test_a_streaming_model_runs_as_a_native_plan(rng):
    ort = oracle("onnxruntime")
    data = _vad_model()
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for sr in (16000, 16000, 8000, 16000, 8000, 8000, 16000):
        feed = _feed(rng, sr)
        got = ours.run(None, feed)
        for g, w, p in zip(got, session.run(None, feed), python.run(None, feed)):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)  # the convolutions may sum in another order
    plans = _plans(ours)
    assert len(plans) == 2  # one per sample rate: the If resolved in each
    for plan in plans:
        native, fallbacks, _ = plan.summary
        assert {"FusedConv", "LSTM", "Pad", "Slice", "Gather", "Concat", "Unsqueeze", "Squeeze", "Sigmoid"} <= set(
            native
        )
        assert "If" not in fallbacks and "Equal" not in fallbacks


def test_results_are_fresh_arrays(rng):
    """A plan's results are copies: later calls leave them as they were."""
    ours = fastlayers.load(_vad_model())
    feeds = [_feed(rng) for _ in range(6)]
    results = [ours.run(None, feed) for feed in feeds]
    kept = [[a.copy() for a in r] for r in results]
    for feed in feeds:
        ours(feed)
    for result, copy in zip(results, kept):
        for a, b in zip(result, copy):
            np.testing.assert_array_equal(a, b)
    assert _plans(ours)


def _movement_model():
    """Data movement only: Transpose, Slices with negative steps, Pads of every mode, Gathers
    on constant indices, Expand, Tile, a Concat with a constant, Split, DepthToSpace."""
    inits = [
        numpy_helper.from_array(np.array([0, 1, 0, 2, 1, 0, 1, 0], np.int64), "pads"),
        numpy_helper.from_array(np.array(1.5, np.float32), "value"),
        numpy_helper.from_array(np.array([3, -1], np.int64), "starts"),
        numpy_helper.from_array(np.array([0, -100], np.int64), "ends"),
        numpy_helper.from_array(np.array([3, 1], np.int64), "axes"),
        numpy_helper.from_array(np.array([-2, -1], np.int64), "steps"),
        numpy_helper.from_array(np.array([2, 0, 3], np.int64), "rows"),
        numpy_helper.from_array(np.array(1, np.int64), "one_index"),
        numpy_helper.from_array(np.array([2, 2, 4, 3, 5], np.int64), "wide"),
        numpy_helper.from_array(np.array([1, 2, 1, 3], np.int64), "reps"),
        numpy_helper.from_array(np.arange(2 * 2 * 3 * 5, dtype=np.float32).reshape(2, 2, 3, 5), "const"),
        numpy_helper.from_array(np.array([1, 3], np.int64), "parts"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Pad", ["x", "pads", "value"], ["pc"], mode="constant"),
        helper.make_node("Pad", ["x", "pads"], ["pe"], mode="edge"),
        helper.make_node("Pad", ["x", "pads"], ["pr"], mode="reflect"),
        helper.make_node("Gather", ["x", "rows"], ["g"], axis=1),
        helper.make_node("Gather", ["x", "one_index"], ["g1"], axis=3),
        helper.make_node("Expand", ["x", "wide"], ["e"]),
        helper.make_node("Tile", ["x", "reps"], ["tl"]),
        helper.make_node("Concat", ["x", "const"], ["cc"], axis=1),
        helper.make_node("Split", ["x", "parts"], ["sa", "sb"], axis=1),
        helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2),
    ]
    outs = ["t", "s", "pc", "pe", "pr", "g", "g1", "e", "tl", "cc", "sa", "sb", "d"]
    graph = helper.make_graph(
        nodes,
        "movement",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def test_data_movement_lowers_to_gathers(rng):
    ours, x = _exactly_onnxruntime(_movement_model(), rng, (2, 4, 3, 5))
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert sorted(set(native)) == sorted(
        {"Transpose", "Slice", "Pad", "Gather", "Expand", "Tile", "Concat", "Split", "DepthToSpace"}
    )


def _views_model():
    """Movements whose result is a run of their input's memory as it lies: a Slice of the first
    sample, a Transpose that moves an axis of length 1, a Split into leading rows."""
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "start"),
        numpy_helper.from_array(np.array([2], np.int64), "end"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array([2, 2], np.int64), "halves"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Slice", ["r", "start", "end", "axis0"], ["s"]),
        helper.make_node("Unsqueeze", ["s", "axis2"], ["u"]),
        helper.make_node("Transpose", ["u"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Split", ["t", "halves"], ["p0", "p1"], axis=2),
        helper.make_node("Add", ["p0", "p1"], ["y"]),
        helper.make_node("Mul", ["p1", "two"], ["y2"]),
    ]
    graph = helper.make_graph(
        nodes,
        "views",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y2")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def test_movements_that_keep_memory_are_views(rng, monkeypatch):
    """A Slice of the second sample, a Transpose of an axis of length 1 and a Split into leading
    rows read the memory of their input as it lies: views of it in the plan (no step, nothing
    moved), the values of onnxruntime."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours, x = _exactly_onnxruntime(_views_model(), rng, (2, 4, 3, 5))
    plan = _serving(ours, {"x": x})
    native, fallbacks, moved = plan.summary
    assert fallbacks == ()
    assert {"Slice", "Transpose", "Split"} <= set(native)
    steps = _steps_per_op(plan)
    assert steps["Slice"] == steps["Transpose"] == steps["Split"] == [0]
    assert moved == 2 * 2 * (2 * 3 * 5) * 4  # two results of 30 floats copied out of the plan (read, written)


def test_a_squeeze_keeps_a_channels_last_value_as_it_is_held(rng, monkeypatch):
    """A Squeeze of the width of one 2-D convolution's output over (H, 1) (tf2onnx's 1-D
    convolutions) stays channels-last: a view, no copy to C order, and the global pool after it
    runs natively on it; onnxruntime's values."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    f = lambda *s: (0.3 * np.random.default_rng(5).standard_normal(s)).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[5, 1]),
        helper.make_node("Squeeze", ["c", "width"], ["s"]),
        helper.make_node("GlobalMaxPool", ["s"], ["p"]),
        helper.make_node("Squeeze", ["p", "length"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(f(24, 8, 5, 1), "w"),
        numpy_helper.from_array(np.array([3], np.int64), "width"),
        numpy_helper.from_array(np.array([2], np.int64), "length"),
    ]
    graph = helper.make_graph(
        nodes,
        "squeezed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 30, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(4):
        x = rng.standard_normal((2, 8, 30, 1)).astype(np.float32)
        assert_close(ours.run(None, {"x": x})[0], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert {"FusedConv", "Squeeze", "GlobalMaxPool"} <= set(native)
    assert _steps_per_op(plan)["Squeeze"] == [0, 0]


def test_the_layout_of_a_view_without_axes_of_length_one():
    """``perm_without_ones``: the axes of a channels-last value after a Squeeze / Unsqueeze /
    Reshape that only drops or adds axes of length 1, checked against numpy's views."""
    from fastlayers.onnx.plan_movement import perm_without_ones

    for shape, perm, out_shape in [
        ((1, 512, 508, 1), (0, 3, 1, 2), (1, 512, 508)),
        ((2, 6, 5, 1), (0, 3, 1, 2), (2, 6, 5)),
        ((2, 6, 5), (0, 2, 1), (2, 6, 1, 5)),
        ((2, 6, 5), (0, 2, 1), (1, 2, 6, 5, 1)),
        ((2, 1, 5, 7), (0, 3, 1, 2), (2, 5, 7)),
    ]:
        memory = np.arange(np.prod(shape)).reshape([shape[a] for a in np.argsort(perm)])
        found = perm_without_ones(shape, perm, out_shape)
        want = memory.transpose(perm).reshape(out_shape)  # numpy's values of the view
        held = memory.reshape([out_shape[a] for a in np.argsort(found)]) if found is not None else memory
        got = held.transpose(found) if found is not None else held.reshape(out_shape)
        np.testing.assert_array_equal(got, want)
    assert perm_without_ones((2, 6, 5), (0, 2, 1), (2, 30)) is False  # merges axes: no such view


def _nonzero_model():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("where", TensorProto.INT64, None),
        ],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_shape_that_depends_on_values_goes_back_to_the_python_plan(monkeypatch):
    monkeypatch.setattr(lowering, "STEP_US", 1e6)  # a plan for this small graph
    ours = fastlayers.load(_nonzero_model())
    calls = [
        np.array([1, -1, 2, -2, 3, -3], np.float32),
        np.array([1, -1, 2, -2, 3, -4], np.float32),  # same count: the plan
        np.array([1, 1, 2, -2, 3, -3], np.float32),  # another count: back to Python
        np.array([-1, -1, -2, -2, -3, -3], np.float32),
    ]
    for x in calls:
        r, where = ours.run(None, {"x": x})
        np.testing.assert_array_equal(r, np.maximum(x, 0))
        np.testing.assert_array_equal(where, np.array(np.nonzero(x > 0)))
    assert list(ours._native.plans.values()) == [False]  # dropped at the mismatch


def _gather_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "i"], ["y"], axis=0)]
    graph = helper.make_graph(
        nodes,
        "gather",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [20]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_failing_node_is_named_as_the_python_plan_names_it(rng, monkeypatch):
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _gather_model()
    errors = []
    for native in (True, False):
        ours = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=native))
        x = rng.standard_normal((5, 3)).astype(np.float32)
        good = np.arange(20, dtype=np.int64) % 5
        for _ in range(3):
            np.testing.assert_array_equal(ours.run(None, {"x": x, "i": good})[0], np.maximum(x, 0)[good])
        with pytest.raises(FastlayersError) as info:
            ours.run(None, {"x": x, "i": np.full(20, 9, np.int64)})
        errors.append((type(info.value), str(info.value)))
        assert bool(_plans(ours)) == native
    assert errors[0] == errors[1]
    assert "Gather" in errors[0][1]


def test_threads_share_a_model(rng):
    ort = oracle("onnxruntime")
    data = _vad_model()
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = [_feed(np.random.default_rng(k), 16000 if k % 2 else 8000) for k in range(8)]
    wants = [session.run(None, feed) for feed in feeds]
    failures = []

    def work(k):
        for _ in range(25):
            j = (k * 3 + _) % len(feeds)
            for g, w in zip(ours.run(None, feeds[j]), wants[j]):
                if not np.allclose(g, w, rtol=1e-5, atol=1e-6):
                    failures.append((k, j))

    in_threads(work, 4)
    assert not failures
    assert _plans(ours)


def test_plans_are_kept_per_key_and_memory_stays_flat(rng):
    ours = fastlayers.load(_vad_model())
    feed = _feed(rng)
    for threads in (1, 2, 1):
        with fastlayers.using_threads(threads):
            for _ in range(3):
                ours.run(None, feed)
    assert len(_plans(ours)) == 2  # one per thread count
    for _ in range(50):
        ours.run(None, feed)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(500):
        ours.run(None, feed)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
    assert len(_plans(ours)) == 2


def test_a_build_keeps_no_trace_values_until_the_plan_is_bound(rng, monkeypatch):
    """Building a plan traces the model once: the trace's values and the stand-ins the
    lowering measures layouts on are let go as it goes (the steps bound later keep only
    constants), so the build's peak stays within a few calls' worth, not one value per node."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    n = 1 << 20
    nodes, last = [], "x"
    for i in range(4):  # Sin runs in Python inside the plan; Mul and Add are native
        nodes += [helper.make_node("Sin", [last], [f"s{i}"]), helper.make_node("Mul", [f"s{i}", "x"], [f"m{i}"])]
        nodes.append(helper.make_node("Add", [f"m{i}", last], [f"a{i}"]))
        last = f"a{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
    )
    ours = fastlayers.load(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString(),
        warm_up=False,  # no call before the two below
    )
    x = rng.standard_normal((1, n)).astype(np.float32)
    peaks = []
    tracemalloc.start()
    try:
        for _ in range(2):  # a Python call, then the call that builds the plan
            tracemalloc.reset_peak()
            start, _ = tracemalloc.get_traced_memory()
            ours.run(None, {"x": x})
            peaks.append(tracemalloc.get_traced_memory()[1] - start)
    finally:
        tracemalloc.stop()
    assert len(_plans(ours)) == 1 and _serving(ours, {"x": x}).summary[1] == ("Sin",) * 4
    assert peaks[1] < 5 * peaks[0]  # 10x when each node's trace values lived until the bind


def test_plans_can_be_turned_off_and_the_reference_backend_has_none(rng):
    data = _vad_model()
    off = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    feed = _feed(rng)
    for _ in range(3):
        off.run(None, feed)
    assert off._native is False
    ours = fastlayers.load(data)
    with fastlayers.use_ops("reference"):
        for _ in range(3):
            ours.run(None, feed)
    assert not _plans(ours)


def _one_node_model(op_type, x_shape, weight_shape, **attrs):
    """A graph of one node of ``op_type`` on x with a constant weight and bias."""
    rng = np.random.default_rng(0)
    outputs = weight_shape[1] if op_type == "ConvTranspose" else weight_shape[0]
    inits = [
        numpy_helper.from_array((rng.standard_normal(weight_shape) / 8).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(outputs).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x", "w", "b"], ["y"], **attrs)],
        "one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize(
    "op_type, x_shape, weight_shape, attrs, planned",
    [
        ("Conv", (1, 16, 14, 14), (16, 16, 3, 3), dict(pads=[1, 1, 1, 1]), True),
        ("Conv", (1, 16, 14, 14), (16, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=16), True),
        ("ConvTranspose", (1, 16, 14, 14), (16, 8, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),
        ("Gemm", (1, 64), (32, 64), dict(transB=1), False),
    ],
    ids=["conv", "depthwise", "conv_transpose", "gemm"],
)
def test_a_single_convolution_runs_as_a_plan(rng, op_type, x_shape, weight_shape, attrs, planned):
    """A one-node model pays for a plan where its node is a convolution (the Python plan moves
    its NCHW input to channels-last and its result back: ``EXTRA_STEP_US``), not where its
    Python plan is one native call already (a Gemm); results as onnxruntime's either way."""
    ort = oracle("onnxruntime")
    data = _one_node_model(op_type, x_shape, weight_shape, **attrs)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = fastlayers.load(data)
    for _ in range(4):
        x = rng.standard_normal(x_shape).astype(np.float32)
        assert_close(ours.run(None, {"x": x})[0], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert bool(_plans(ours)) == planned


def test_the_cost_model():
    assert lowering.pays(native=30, fallbacks=2, moved=40_000)
    assert not lowering.pays(native=20, fallbacks=60, moved=20_000_000)
    assert not lowering.pays(native=0, fallbacks=0, moved=0)
    # large results (buffers reused warm) pay for copies that few steps would not
    big = int(lowering.RESULT_BYTES_PER_US * lowering.PLAN_US * 4)
    assert not lowering.pays(native=2, fallbacks=0, moved=int(lowering.COPY_BYTES_PER_US * lowering.PLAN_US))
    assert lowering.pays(native=2, fallbacks=0, moved=int(lowering.COPY_BYTES_PER_US * lowering.PLAN_US), results=big)


def _qlstm_constants(rng, n_dir, n_in, hidden):
    """A DynamicQuantizeLSTM's W, R (7-bit: products onnxruntime sums exactly too), B, the
    per-column W scales, R's scale and zero points, for ``n_dir`` directions."""
    i8 = np.int8
    return {
        "w": rng.integers(-64, 64, (n_dir, n_in, 4 * hidden)).astype(i8),
        "r": rng.integers(-64, 64, (n_dir, hidden, 4 * hidden)).astype(i8),
        "bias": rng.standard_normal((n_dir, 8 * hidden)).astype(np.float32),
        "ws": rng.uniform(0.01, 0.03, (n_dir, 4 * hidden)).astype(np.float32),
        "wz": np.zeros((n_dir, 4 * hidden), i8),
        "rs": rng.uniform(0.01, 0.03, n_dir).astype(np.float32),
        "rz": np.zeros(n_dir, i8),
    }


def _quantized_model(rng, hidden=24, n_in=16):
    """A streaming int8 step as open-voicefilter-lite's mask model writes it: a
    DynamicQuantizeMatMul, Relu, a forward DynamicQuantizeLSTM on carried states (7-bit
    weights, per-column W scales: products onnxruntime sums exactly too), LayerNormalization
    of its new state."""
    f, i8 = TensorProto.FLOAT, np.int8
    consts = {
        "b": rng.integers(-64, 64, (n_in, n_in)).astype(i8),
        "bs": rng.uniform(0.01, 0.03, n_in).astype(np.float32),
        "bz": np.zeros(n_in, i8),
        "gamma": rng.uniform(0.5, 1.5, hidden).astype(np.float32),
        "beta": rng.standard_normal(hidden).astype(np.float32),
        **_qlstm_constants(rng, 1, n_in, hidden),
    }
    nodes = [
        helper.make_node("DynamicQuantizeMatMul", ["x", "b", "bs", "bz"], ["m"], domain="com.microsoft"),
        helper.make_node("Relu", ["m"], ["a"]),
        helper.make_node(
            "DynamicQuantizeLSTM",
            ["a", "w", "r", "bias", "", "h0", "c0", "", "ws", "wz", "rs", "rz"],
            ["y", "yh", "yc"],
            domain="com.microsoft",
            hidden_size=hidden,
        ),
        helper.make_node("LayerNormalization", ["yh", "gamma", "beta"], ["n"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "quantized",
        [
            helper.make_tensor_value_info("x", f, [1, 1, n_in]),
            helper.make_tensor_value_info("h0", f, [1, 1, hidden]),
            helper.make_tensor_value_info("c0", f, [1, 1, hidden]),
        ],
        [helper.make_tensor_value_info(n, f, None) for n in ("y", "yc", "n")],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def test_a_quantized_streaming_step_runs_natively(rng, monkeypatch):
    """The integer products and the quantized time loop bound in the plan: onnxruntime's bits
    (one thread: on several it quantizes each thread's rows apart; its layer norm within
    float32 rounding) and the Python plan's."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)  # a plan for this small graph
    ort = oracle("onnxruntime")
    data = _quantized_model(rng)
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    for _ in range(5):
        feed = {
            "x": rng.standard_normal((1, 1, 16)).astype(np.float32),
            "h0": rng.standard_normal((1, 1, 24)).astype(np.float32),
            "c0": rng.standard_normal((1, 1, 24)).astype(np.float32),
        }
        got, want, plain = ours.run(None, feed), session.run(None, feed), python.run(None, feed)
        for g, w, p in zip(got[:2], want[:2], plain[:2], strict=True):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, p)
        assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[2], plain[2])
    plan = _serving(ours, feed)
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert {"com.microsoft::DynamicQuantizeMatMul", "LayerNormalization", "com.microsoft::DynamicQuantizeLSTM"} <= set(
        native
    )


def test_the_profile_shows_the_plan_that_serves_the_calls(rng):
    ours = fastlayers.load(_vad_model())
    feed = _feed(rng)
    # no call yet: the profile builds the plan that calls from the second on would run
    first = ours.profile(feed, repeats=3)
    assert first.model.endswith("(native plan)")
    assert [s.op_type for s in first.steps] == [s.op_type for s in ours.profile(feed, repeats=3).steps]
    for _ in range(2):
        ours(feed)
    profile = ours.profile(feed, repeats=5)
    assert profile.model.endswith("(native plan)") and profile.total_ms > 0
    kinds = {s.op_type: s.kernel for s in profile.steps}
    assert kinds["FusedConv"] == kinds["LSTM"] == kinds["Pad"] == "native"
    assert kinds["Unsqueeze"] == "alias" and kinds["Mul"] == "native"
    assert "Equal" not in kinds and "If" not in kinds  # constants of the plan
    lstm = next(s for s in profile.steps if s.op_type == "LSTM")
    assert lstm.output_shapes == [(1, 1, H), (1, 1, H)] and lstm.ms > 0  # its Y is read by no node
    assert sum(s.ms for s in profile.steps) <= profile.total_ms * 1.5
    assert "LSTM" in str(profile)


def test_a_model_whose_plan_does_not_pay_stops_building(rng, monkeypatch):
    """One rejected build (each traces a call) turns the model's plans off; where the key held
    small integer inputs (constants of that trace, data at other keys: a sample rate, a flag
    of one axis) it turns off that key's only; a model whose nodes could not save a plan's own
    cost is not traced at all, and its calls look up no key from then on."""
    builds = []
    real = lowering.lower
    monkeypatch.setattr(lowering, "lower", lambda *a: builds.append(1) or real(*a))
    # the check before tracing (three positional arguments) passes, the plan traced does not pay
    monkeypatch.setattr(lowering, "pays", lambda *a, **kw: len(a) == 3)
    ours = fastlayers.load(_vad_model())
    for sr in (16000, 16000, 8000, 8000, 8000, 16000):
        ours.run(None, _feed(rng, sr))
    assert builds == [1, 1] and not ours._native.off and not _plans(ours)
    builds.clear()
    ours = fastlayers.load(_movement_model())  # (its warm-up at load may count a call)
    big = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    for _ in range(3):
        ours.run(None, {"x": big})
    assert builds == [1] and ours._native.off and not _plans(ours)
    monkeypatch.undo()
    monkeypatch.setattr(lowering, "lower", lambda *a: builds.append(1) or real(*a))
    monkeypatch.setattr(lowering, "PLAN_US", 1e9)  # more than all its nodes could save (the warm-up's calls too)
    ours = fastlayers.load(_movement_model())
    big = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    builds.clear()
    for _ in range(3):
        ours.run(None, {"x": big})
    assert builds == [] and ours._native.off and not ours._native.serving and ours._native.plan_for([big]) is None


def _conv_model(rng):
    """A small CNN as real exports have them: a 3-channel image into a convolution read from
    its NCHW planes, a 3x3 convolution of 16 channels each way (Winograd) with a residual Add,
    a strided depthwise one with HardSwish and a per-channel Mul / Add after it (a FusedConv's
    scale and shift), a depthwise one with a residual Add and Relu, a pointwise one with a
    residual Add and Relu, a squeeze-and-excite gate (GlobalAveragePool, two 1x1 convolutions,
    HardSigmoid, a product on the gate, Mul), max and average pools, a nearest Resize, a Slice
    and a Concat of channels, ReduceMean over the positions, Gemm and Softmax."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    c = 16
    inits = [
        numpy_helper.from_array(f(c, 3, 3, 3), "w_in"),
        numpy_helper.from_array(f(c), "b_in"),
        numpy_helper.from_array(f(c, c, 3, 3), "w_3x3"),
        numpy_helper.from_array(f(c, 1, 3, 3), "w_dw"),
        numpy_helper.from_array(f(c, 1, 3, 3), "w_dw1"),
        numpy_helper.from_array(f(1, c, 1, 1) + 1, "scale"),
        numpy_helper.from_array(f(1, c, 1, 1), "shift"),
        numpy_helper.from_array(f(c, c, 1, 1), "w_pw"),
        numpy_helper.from_array(f(4, c, 1, 1), "w_se1"),
        numpy_helper.from_array(f(c, 4, 1, 1), "w_se2"),
        numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "up"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([8], np.int64), "eight"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(f(c + 8, 10), "w_fc"),
        numpy_helper.from_array(f(10), "b_fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_in", "b_in"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w_3x3"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "r0"], ["s1"]),  # after Winograd, in a pass
        helper.make_node("Conv", ["s1", "w_dw"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], group=c),
        helper.make_node("HardSwish", ["c2"], ["h2"]),
        helper.make_node("Mul", ["h2", "scale"], ["m2"]),
        helper.make_node("Add", ["m2", "shift"], ["a2"]),
        helper.make_node("Conv", ["a2", "w_dw1"], ["d2"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Add", ["d2", "a2"], ["s2"]),  # after the depthwise kernel, in a pass
        helper.make_node("Relu", ["s2"], ["a2r"]),
        helper.make_node("Conv", ["a2r", "w_pw"], ["c3"]),
        helper.make_node("Add", ["c3", "a2r"], ["s3"]),
        helper.make_node("Relu", ["s3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g3"]),
        helper.make_node("Conv", ["g3", "w_se1"], ["e1"]),
        helper.make_node("Relu", ["e1"], ["e1r"]),
        helper.make_node("Conv", ["e1r", "w_se2"], ["e2"]),
        helper.make_node("HardSigmoid", ["e2"], ["gate"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["gate", "gate"], ["gate2"]),  # computed on the vector, per call
        helper.make_node("Mul", ["r3", "gate2"], ["se"]),
        helper.make_node("MaxPool", ["se"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["p2", "", "up"], ["u"], mode="nearest"),
        helper.make_node("Slice", ["u", "zero", "eight", "one"], ["half"]),
        helper.make_node("Concat", ["u", "half"], ["cat"], axis=1),
        helper.make_node("ReduceMean", ["cat"], ["mean"], axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["mean", "w_fc", "b_fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 20, 22])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "se")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("batch", [1, 3])
def test_a_convolutional_model_runs_natively_channels_last(rng, monkeypatch, batch):
    """Every node of a small CNN runs natively (its values held channels-last between the
    convolutions, as the Python plan holds them): the Python plan's values, onnxruntime's."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)  # whatever the cost model finds for so small a model
    ours, python, session = _engines(_conv_model(np.random.default_rng(7)), oracle("onnxruntime"))
    for _ in range(4):
        x = rng.standard_normal((batch, 3, 20, 22)).astype(np.float32)
        got = ours.run(None, {"x": x})
        for g, w, p in zip(got, session.run(None, {"x": x}), python.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(g, p)  # the Python plan's kernels (Winograd, ...): its bits
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert {"FusedConv", "FusedElementwise", "GlobalAveragePool", "MaxPool", "AveragePool", "Resize"} <= set(native)
    assert {"Slice", "Concat", "ReduceMean", "FusedDense"} <= set(native)


def _channel_norm_model(rng, channels=24):
    """A LayerNorm over the channels after a convolution, as exporters decompose it
    (ConvNeXt's LayerNorm2d): ReduceMean over axis 1, Sub, Mul, ReduceMean, Add, Sqrt, Div, a
    scale and shift per channel."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(channels, 5, 3, 3), "w"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(f(1, channels, 1, 1) + 1, "gamma"),
        numpy_helper.from_array(f(1, channels, 1, 1), "beta"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c", "axis"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["c", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2", "axis"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "channel_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("batch", [1, 2])
def test_a_norm_over_channels_runs_natively(rng, monkeypatch, batch):
    """The per-position mean and deviation of channels-last values, reduced over the channels in
    their memory and spread over the channels in the elementwise pass (position operands), not
    broadcast into tensors first: every node native, onnxruntime's values, the Python plan's
    within float32 rounding (its means are numpy's float32 sums, the plan's in double)."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours, python, session = _engines(_channel_norm_model(np.random.default_rng(3)), oracle("onnxruntime"))
    for _ in range(3):
        x = rng.standard_normal((batch, 5, 9, 11)).astype(np.float32)
        got = ours.run(None, {"x": x})[0]
        assert_close(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert_close(got, python.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    native, fallbacks, moved = _serving(ours, {"x": x}).summary
    assert fallbacks == ()
    assert {"FusedConv", "ReduceMean", "FusedElementwise"} <= set(native)
    # the result's copy out of the plan's memory (read and written) and nothing else: the mean
    # and the deviation are not broadcast into tensors of their own
    assert moved == 2 * got.nbytes
    # each ReduceMean one step over the channels-last memory as it is (no copy to C order first)
    assert _steps_per_op(_serving(ours, {"x": x}))["ReduceMean"] == [1, 1]


def _norm_of_all_then_exp_model():
    """x (1, 64) / |-sqrt(mean(x^2) + eps)|, then Exp, and the root an output too: a program
    over a value of one element (Add, Sqrt, Neg, Abs on the mean) and an Exp node."""
    eps = numpy_helper.from_array(np.array(1e-3, np.float32), "eps")
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[0, 1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["rms"]),
        helper.make_node("Neg", ["rms"], ["nrms"]),
        helper.make_node("Abs", ["nrms"], ["arms"]),
        helper.make_node("Div", ["x", "arms"], ["n"]),
        helper.make_node("Exp", ["n"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "norm_exp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("y", "arms")],
        [eps],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_square_roots_of_one_value_and_exp_run_natively(rng, monkeypatch):
    """A program over a value of one element that takes a square root, a negation and an
    absolute value (map steps, one per instruction) and an Exp node (the exponential
    activation): every node native, onnxruntime's values (before: both ran in Python inside
    the plan, as magika's LayerNorm and its last Exp did)."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours, python, session = _engines(_norm_of_all_then_exp_model(), oracle("onnxruntime"))
    for _ in range(3):
        x = rng.standard_normal((1, 64)).astype(np.float32)
        got, want = ours.run(None, {"x": x}), session.run(None, {"x": x})
        for g, w, p in zip(got, want, python.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)
    native, fallbacks, _ = _serving(ours, {"x": x}).summary
    assert fallbacks == ()
    assert "Exp" in native and "FusedElementwise" in native


@pytest.mark.parametrize("ids_type", [6, 7])  # int32, int64
def test_a_one_hot_product_runs_natively(tmp_path, rng, monkeypatch, ids_type):
    """OneHotDense on ids the plan reads per call (magika's byte embedding): the ids clipped to
    [-1, V], then a take of rows of the node's table, every id outside [0, V) the bias row
    (negative ones too, which the take would count from the end): the Python plan's bits,
    onnxruntime's values, no node run in Python."""
    from .test_fusion import _one_hot_graph

    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    w = rng.standard_normal((7, 6)).astype(np.float32)
    path, dtype = _one_hot_graph(tmp_path, w, ids_type, "Gelu")
    data = path.read_bytes()
    ours, python, session = _engines(data, oracle("onnxruntime"))
    for ids in (
        np.array([0, 6, 3, -1, 7, 100, 2, 2, 5, 1], dtype),
        np.array([-7, -8, -100, 6, 0, 8, 2**30, -(2**30), 3, 4], dtype),
        rng.integers(-3, 10, 10).astype(dtype),
    ):
        feed = {"ids": ids.reshape(2, 5, 1)}
        got = ours.run(None, feed)[0]
        np.testing.assert_array_equal(got, python.run(None, feed)[0])
        assert_close(got, session.run(None, feed)[0], rtol=1e-6, atol=1e-6)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == () and "OneHotDense" in native


def _few_output_channels_model(rng):
    """x (N, 8, 12, 40) -> Conv 8 -> 8 (3 x 9, padded) + Relu -> Conv 8 -> 1 (5 x 5, padded):
    basic-pitch's convolutions into few channels."""
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 8, 3, 9)) * 0.1).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((1, 8, 5, 5)) * 0.1).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(1).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 4, 1, 4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], pads=[2, 2, 2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "few_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 12, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("batch", [1, 2])
def test_convolutions_into_few_channels_run_on_planes(rng, monkeypatch, batch):
    """Convolutions of NCHW planes into at most 8 channels run into NCHW planes
    (``conv2d_planes``) in both plans: onnxruntime's values, the Python plan's within float32
    rounding, and no layout move in the native plan (before: the input moved to channels-last
    memory for the first)."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours, python, session = _engines(_few_output_channels_model(np.random.default_rng(5)), oracle("onnxruntime"))
    for _ in range(3):
        x = rng.standard_normal((batch, 8, 12, 40)).astype(np.float32)
        got = ours.run(None, {"x": x})[0]
        assert_close(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
        assert_close(got, python.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    native, fallbacks, _ = _serving(ours, {"x": x}).summary
    assert fallbacks == () and native.count("FusedConv") == 2
    # one step each: no move of the input to channels-last memory before the first
    assert _steps_per_op(_serving(ours, {"x": x}))["FusedConv"] == [1, 1]


def _stem_model(rng, reader):
    """x (N, 3, 40, 44) -> Conv 3 -> 32 (5 x 5, stride 2, padded) + Relu -> y, and with
    ``reader`` also a Sigmoid of it -> z: an image's first convolution, its result a graph's
    output alone or read by another node too."""
    inits = [
        numpy_helper.from_array((rng.standard_normal((32, 3, 5, 5)) * 0.2).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[2, 2, 2, 2], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if reader:
        nodes.append(helper.make_node("Sigmoid", ["y"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 40, 44])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("reader", [False, True])
def test_a_stem_whose_result_is_the_output_writes_planes(rng, monkeypatch, reader):
    """A convolution of an image's planes whose result only the graph's outputs read
    (``_planes_out``) writes NCHW planes (``conv2d_planes``) in both plans: no move of its
    result, C-contiguous NCHW out, onnxruntime's values, the same bits in both plans. Read by
    another node too, it stays channels-last for that node (``conv2d_nchw_in``)."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours, python, session = _engines(_stem_model(np.random.default_rng(9), reader), oracle("onnxruntime"))
    (conv,) = [n for n in python._nodes if n.op_type == "FusedConv"]
    assert conv.attrs.get("_planes_out", False) == (not reader)
    for batch in (1, 2, 1):
        x = rng.standard_normal((batch, 3, 40, 44)).astype(np.float32)
        got, want = ours.run(None, {"x": x}), session.run(None, {"x": x})
        for g, p, w in zip(got, python.run(None, {"x": x}), want):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(g, p)
        assert got[0].flags.c_contiguous or reader
    native, fallbacks, _ = _serving(ours, {"x": x}).summary
    assert fallbacks == () and "FusedConv" in native
    if not reader:  # one step: the kernel writes the planes, no move after it
        assert _steps_per_op(_serving(ours, {"x": x}))["FusedConv"] == [1]


def test_a_nan_that_winograd_meets_goes_to_the_python_plan(rng, monkeypatch):
    """The plan's Winograd step holds no weights for the direct sums: a NaN it meets sends the
    call to the Python plan (its bits: NaN where a window reads it), and the plan serves the
    finite calls after."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _conv_model(np.random.default_rng(7))
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    x = rng.standard_normal((1, 3, 20, 22)).astype(np.float32)
    for _ in range(3):
        ours.run(None, {"x": x})
    plan = _serving(ours, {"x": x})
    assert "FusedConv" in plan.summary[0]
    ops, refused = get_ops(), []
    real = ops.plan_refused_input
    monkeypatch.setattr(ops, "plan_refused_input", lambda e: refused.append(getattr(e, "status", e)) or real(e))
    x[0, 1, 7, 9] = np.nan
    for g, p in zip(ours.run(None, {"x": x}), python.run(None, {"x": x})):
        assert np.isnan(g).any()
        np.testing.assert_array_equal(g, p)
    assert refused == [_core.NOT_FINITE]
    x = rng.standard_normal((1, 3, 20, 22)).astype(np.float32)
    for g, p in zip(ours.run(None, {"x": x}), python.run(None, {"x": x})):
        np.testing.assert_array_equal(g, p)
    assert _serving(ours, {"x": x}) is plan


def test_inputs_are_read_in_place_unless_a_python_step_reads_them(rng, monkeypatch):
    """The steps read a call's input from the caller's array: the plan's own memory for it
    stays as it was. An input that a node run in Python reads is copied in as before."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ours = fastlayers.load(_conv_model(np.random.default_rng(7)))
    python = fastlayers.load(_conv_model(np.random.default_rng(7)), options=fastlayers.LoadOptions(native_plans=False))
    x = rng.standard_normal((2, 3, 20, 22)).astype(np.float32)
    for _ in range(3):
        ours.run(None, {"x": x})
    plan = _serving(ours, {"x": x})
    (home,) = plan.input_views
    home[...] = np.nan
    x = rng.standard_normal((2, 3, 20, 22)).astype(np.float32)
    kept = x.copy()
    for g, p in zip(ours.run(None, {"x": x}), python.run(None, {"x": x})):
        np.testing.assert_array_equal(g, p)
    assert np.isnan(home).all()
    np.testing.assert_array_equal(x, kept)
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["r"])]
    nodes += [helper.make_node("Add", ["s", "r"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "sin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    ours = fastlayers.load(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    )
    for _ in range(3):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        (y,) = ours.run(None, {"x": x})
        np.testing.assert_allclose(y, np.sin(x) + np.maximum(x, 0), rtol=1e-6)
    plan = _serving(ours, {"x": x})
    assert plan.summary[1] == ("Sin",)
    np.testing.assert_array_equal(plan.input_views[0], x)  # copied in for the Python step


def _conv1d_model(rng):
    """1-D convolutions (NCL) with a residual Add, a max pool and a mean over the steps."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(12, 5, 3), "w1"),
        numpy_helper.from_array(f(12), "b1"),
        numpy_helper.from_array(f(12, 12, 1), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "r1"], ["s2"]),
        helper.make_node("MaxPool", ["s2"], ["p2"], kernel_shape=[3], strides=[2], pads=[1, 1]),
        helper.make_node("ReduceMean", ["p2"], ["y"], axes=[2], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 31])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "p2")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_one_dimensional_convolutions_and_pools_run_natively(rng, monkeypatch):
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _conv1d_model(np.random.default_rng(3))
    ours = fastlayers.load(data)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = rng.standard_normal((2, 5, 31)).astype(np.float32)
        for g, w in zip(ours.run(None, {"x": x}), session.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert {"FusedConv", "MaxPool", "ReduceMean"} <= set(native)


def _pointwise_planes_model(rng, one_d):
    """An NCHW input into a 1x1 convolution with Relu (8 -> 24 channels), another 1x1 one on its
    NCHW planes (24 -> 12), then a 3x3 one (channels-last) with an Add of the second's output."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    k = (1,) if one_d else (1, 1)
    inits = [
        numpy_helper.from_array(f(24, 8, *k), "w1"),
        numpy_helper.from_array(f(24), "b1"),
        numpy_helper.from_array(f(12, 24, *k), "w2"),
        numpy_helper.from_array(f(12, 12, *(3,) * len(k)), "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[1, 1] * len(k)),
        helper.make_node("Add", ["c3", "c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pointwise_planes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, *((70,) if one_d else (9, 11))])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "c2")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("one_d", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_pointwise_convolutions_of_nchw_planes_run_natively(rng, monkeypatch, batch, one_d):
    """1x1 convolutions of an NCHW input and of their own NCHW output run on the planes
    (``conv1x1_nchw``) in the native plan as in the Python plan: their bits, onnxruntime's
    values; the 3x3 convolution after them reads a channels-last copy."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    bound = []
    cpu = type(fastlayers.get_ops("cpu"))
    real = cpu.plan_conv1x1_nchw
    monkeypatch.setattr(cpu, "plan_conv1x1_nchw", lambda self, *a: bound.append(real(self, *a)) or bound[-1])
    data = _pointwise_planes_model(np.random.default_rng(5), one_d)
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    shape = (batch, 8, *((70,) if one_d else (9, 11)))
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        got = ours.run(None, {"x": x})
        for g, w, p in zip(got, session.run(None, {"x": x}), python.run(None, {"x": x})):
            assert g.flags.c_contiguous
            assert_close(g, w, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(g, p)
    native, fallbacks, _ = _serving(ours, {"x": x}).summary
    assert fallbacks == () and "FusedConv" in native
    assert len(bound) >= 2 and all(b is not None and b["nchw_out"] for b in bound)
    kernels = [s.kernel for s in python.profile(x, repeats=1).steps]
    assert kernels.count("cpu.conv1x1_nchw_plan") == 2


def _upsampling_model(rng, one_d=False):
    """A segmentation head as text detectors export it: a ConvTranspose of the input's NCHW
    planes, a convolution, a strided ConvTranspose of its channels-last result with a fused
    Relu, BatchNormalization, Relu, a grouped ConvTranspose, and a ConvTranspose to one channel
    (padded, output_padding) with a Sigmoid; a Concat of a C-ordered and a channels-last
    value; 1-D with ``one_d``."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    k = (3,) if one_d else (3, 3)
    k2 = (2,) if one_d else (2, 2)
    s2 = [2] if one_d else [2, 2]
    inits = [
        numpy_helper.from_array(f(3, 6, *k2), "wt0"),
        numpy_helper.from_array(f(12, 6, *k), "w1"),
        numpy_helper.from_array(f(12), "b1"),
        numpy_helper.from_array(f(12, 8, *k2), "wt1"),
        numpy_helper.from_array(f(8), "bt1"),
        numpy_helper.from_array(f(8) + 1, "gamma"),
        numpy_helper.from_array(f(8), "beta"),
        numpy_helper.from_array(f(8), "mean"),
        numpy_helper.from_array(np.abs(f(8)) + 0.5, "var"),
        numpy_helper.from_array(f(8, 3, *k), "wt2"),
        numpy_helper.from_array(f(12, 1, *k), "wt3"),
        numpy_helper.from_array(f(1), "bt3"),
    ]
    pads = [1, 1] if one_d else [1, 1, 1, 1]
    nodes = [
        helper.make_node("ConvTranspose", ["x", "wt0"], ["t0"], strides=s2),
        helper.make_node("Conv", ["t0", "w1", "b1"], ["c1"], pads=pads),
        helper.make_node("ConvTranspose", ["c1", "wt1", "bt1"], ["t1"], strides=s2),
        helper.make_node("Relu", ["t1"], ["r1"]),
        helper.make_node("BatchNormalization", ["r1", "gamma", "beta", "mean", "var"], ["n1"], epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r2"]),
        helper.make_node("ConvTranspose", ["r2", "wt2"], ["t2"], group=4, pads=pads),
        helper.make_node(
            "ConvTranspose", ["t2", "wt3", "bt3"], ["t3"], strides=s2, pads=pads, output_padding=[1] * len(k)
        ),
        helper.make_node("Sigmoid", ["t3"], ["y"]),
        helper.make_node("Concat", ["t0", "c1"], ["cat"], axis=1),  # C order and channels-last
    ]
    shape = ["n", 3, 9] if one_d else ["n", 3, 5, 7]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "n1", "cat")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("one_d", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_transposed_convolutions_and_batch_norms_run_natively(rng, monkeypatch, batch, one_d):
    """ConvTranspose in each of the backend's forms (from NCHW planes, from channels-last
    memory, grouped, to one channel) and a lone BatchNormalization run natively: the Python
    plan's bits, onnxruntime's values."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _upsampling_model(np.random.default_rng(5), one_d)
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    shape = (batch, 3, 9) if one_d else (batch, 3, 5, 7)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        for g, w, p in zip(ours.run(None, {"x": x}), session.run(None, {"x": x}), python.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(g, p)
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert native.count("ConvTranspose") == 4 and "BatchNormalization" in native and "Concat" in native


def test_the_cost_model_counts_copies_and_gathers_apart():
    """Contiguous copies (inputs in, outputs out, a Python node's results) cost less per byte
    than gathers (layout moves)."""
    assert lowering.COPY_BYTES_PER_US > lowering.GATHER_BYTES_PER_US
    moved = int((lowering.STEP_US * 20 - lowering.PLAN_US) * lowering.COPY_BYTES_PER_US * 0.9)
    assert lowering.pays(native=20, fallbacks=0, moved=moved)
    assert not lowering.pays(native=20, fallbacks=0, moved=0, gathered=moved)


def test_a_model_of_one_native_call_keeps_the_python_plan(rng):
    """A plan's own cost per call (its key, the copies in and out) outweighs what one node
    saves: a dense chain that the Python plan runs in one native call stays there."""
    f = lambda *s: (0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(f(*s), n) for n, s in (("w1", (16, 32)), ("b1", (32,)), ("w2", (32, 4)), ("b2", (4,)))
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = fastlayers.load(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    )
    x = rng.standard_normal((8, 16)).astype(np.float32)
    for _ in range(4):
        model(x)
    assert [n.op_type for n in model._nodes] == ["FusedDenseChain"]
    assert _plans(model) == []


def _attention_model(rng, opset):
    """Self-attention as exporters write it: dense projections (a chain of two with a Relu
    between), a Transpose, products of two computed values, a Softmax over the keys (opset 13
    and later: its axis; before: the axes from it on) and a LogSoftmax head (taken into the
    last product's epilogue)."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    d = 8
    inits = [numpy_helper.from_array(f(d, d), name) for name in ("wq", "wk", "wv", "w1", "w2")]
    inits += [numpy_helper.from_array(f(d), name) for name in ("b1", "b2")]
    axis = {"axis": -1} if opset >= 13 else {"axis": 2}
    keys = {"axis": -1} if opset >= 13 else {"axis": 1}  # before 13: over each (query, key) block
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["weights"], **keys),
        helper.make_node("MatMul", ["weights", "v"], ["mixed"]),
        helper.make_node("MatMul", ["mixed", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h1b"]),
        helper.make_node("Relu", ["h1b"], ["h1r"]),
        helper.make_node("MatMul", ["h1r", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["h2b"]),
        helper.make_node("LogSoftmax", ["h2b"], ["y"], **axis),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, d])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "weights")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("opset", [11, 17])
def test_attention_products_and_softmaxes_run_natively(rng, monkeypatch, opset):
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _attention_model(np.random.default_rng(5), opset)
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = rng.standard_normal((2, 5, 8)).astype(np.float32)
        for g, w, p in zip(ours.run(None, {"x": x}), session.run(None, {"x": x}), python.run(None, {"x": x})):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)
    plan = _serving(ours, {"x": x})
    native, fallbacks, _ = plan.summary
    assert fallbacks == ()
    assert {"MatMul", "Softmax", "Transpose"} <= set(native)
    assert {"FusedDenseChain", "FusedDense"} & set(native)


def _fused_attention_model(rng, k_transposed, float_mask=False):
    """Multi-head self-attention as Hugging Face exports write it: heads split by Reshape and
    Transpose, k^T by a Transpose (or k's rows and a Transpose in the product's operand order),
    scores divided by sqrt(head size), an additive mask made from the 0/1 attention mask
    input (int64: a constant of each plan; float32: computed per call), Softmax, the product
    with v, heads merged back (fused at load into FusedAttention)."""
    f = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    d, h = 8, 2
    inits = [numpy_helper.from_array(f(d, d), name) for name in ("wq", "wk", "wv")]
    inits += [
        numpy_helper.from_array(np.array([0, 0, h, d // h], np.int64), "heads"),
        numpy_helper.from_array(np.array([0, 0, d], np.int64), "merged"),
        numpy_helper.from_array(np.array(np.sqrt(d // h), np.float32), "root"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "big"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("MatMul", ["x", "wk"], ["k0"]),
        helper.make_node("MatMul", ["x", "wv"], ["v0"]),
        helper.make_node("Reshape", ["q0", "heads"], ["q1"]),
        helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
        helper.make_node("Reshape", ["v0", "heads"], ["v1"]),
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT)
        if not float_mask
        else helper.make_node("Abs", ["m"], ["mf"]),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["neg"]),
        helper.make_node("Unsqueeze", ["neg", "axes"], ["bias"]),
    ]
    if k_transposed:
        nodes += [
            helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        ]
    else:
        nodes += [
            helper.make_node("Transpose", ["k1"], ["k"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        ]
    nodes += [
        helper.make_node("Div", ["s0", "root"], ["s1"]),
        helper.make_node("Add", ["s1", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "merged"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mha",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", d]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT if float_mask else TensorProto.INT64, ["b", "t"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("k_transposed, float_mask", [(True, False), (False, False), (True, True)])
def test_fused_attention_runs_natively(rng, monkeypatch, k_transposed, float_mask):
    """FusedAttention (heads, scale, additive mask from an input) as one native step: the
    Python plan's bits, onnxruntime's values."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _fused_attention_model(np.random.default_rng(3), k_transposed, float_mask)
    ours = fastlayers.load(data)
    assert "FusedAttention" in ours.op_types
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = rng.standard_normal((2, 5, 8)).astype(np.float32)
        m = np.ones((2, 5), np.float32 if float_mask else np.int64)
        m[1, 3:] = 0
        feed = {"x": x, "m": m}
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed)):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(g, p)
    plan = _serving(ours, feed)
    assert "FusedAttention" in plan.summary[0]


@pytest.mark.parametrize("softmax_axis", [3, 2])
def test_svtr_attention_runs_natively(rng, monkeypatch, softmax_axis):
    """PaddlePaddle's SVTR attention (``svtr_attention_graph``), fused at load, runs as one
    native attention step over its q, k and v slices with no fallback; with its Softmax over
    the queries' axis instead (axis 2) the fused node stays a Python step of the plan that
    runs the graph's own Softmax. The Python plan's values, onnxruntime's."""
    from fastlayers.io.onnx import from_proto

    from .test_import import svtr_attention_graph

    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    model, feed = svtr_attention_graph(rng)
    next(n for n in model.graph.node if n.op_type == "Softmax").attribute[0].i = softmax_axis
    data = model.SerializeToString()
    ours, python, session = _engines(data, ort)
    assert "FusedAttention" in from_proto(model).op_types
    for _ in range(3):
        feed = {"qkv": rng.standard_normal(feed["qkv"].shape).astype(np.float32)}
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert ("FusedAttention" in native, "FusedAttention" in fallbacks) == (softmax_axis == 3, softmax_axis == 2)


def _engines(data, ort):
    """The model ``data`` loaded with native plans and without, and onnxruntime's session."""
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    return ours, python, ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def test_lstm_cells_run_natively(torch, tmp_path, rng, monkeypatch):
    """torch's LSTMCells exported node by node (FusedLSTMCell nodes), the second reading the
    first's h as its input too, run as one-step recurrent loops in the plan: the Python plan's
    bits, onnxruntime's values, the caller's states not written."""
    from .test_fusion import lstm_cells_export

    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    path = lstm_cells_export(torch, tmp_path / "cells.onnx", 17)
    names = ("x", "h", "c")
    ours, python, session = _engines(path.read_bytes(), oracle("onnxruntime"))
    for batch in (1, 3):
        for _ in range(3):
            feed = {n: rng.standard_normal((batch, 5 if n == "x" else 7)).astype(np.float32) for n in names}
            held = {k: v.copy() for k, v in feed.items()}
            for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
                assert_close(g, w, rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(g, p)
            assert all(np.array_equal(feed[k], held[k]) for k in feed)
        native, fallbacks, _ = _serving(ours, feed).summary
        assert fallbacks == () and native.count("FusedLSTMCell") == 2


def test_argmax_and_argmin_run_natively(rng, monkeypatch):
    """ArgMax / ArgMin over the first, a middle and the last axis, keeping the axis or not, the
    first or the last of equal values: the reduce step's index form, onnxruntime's indices."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),  # many ties at 0
        helper.make_node("ArgMax", ["r"], ["a0"], axis=0),
        helper.make_node("ArgMax", ["r"], ["a1"], axis=1, keepdims=0, select_last_index=1),
        helper.make_node("ArgMin", ["r"], ["a2"], axis=-1, select_last_index=0),
        helper.make_node("ArgMin", ["x"], ["a3"], axis=1, keepdims=0, select_last_index=1),
    ]
    graph = helper.make_graph(
        nodes,
        "args",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 5])],
        [helper.make_tensor_value_info(f"a{k}", TensorProto.INT64, None) for k in range(4)],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    ours, python, session = _engines(data, oracle("onnxruntime"))
    for _ in range(3):
        feed = {"x": np.round(rng.standard_normal((3, 7, 5)), 1).astype(np.float32)}
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, p)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == () and {"ArgMax", "ArgMin"} <= set(native)


def _integer_movement_model():
    """Data movement on integer, quantized and bool values computed per call: int64 ids
    transposed, sliced, concatenated, padded with 7 and expanded; uint8 codes transposed and
    tiled into a DequantizeLinear; a bool mask (x < 0) transposed into a Where."""
    i64 = TensorProto.INT64
    consts = {
        "starts": np.array([1], np.int64),
        "ends": np.array([19], np.int64),
        "axes": np.array([0], np.int64),
        "pads": np.array([0, 2, 0, 1], np.int64),
        "seven": np.array(7, np.int64),
        "shape": np.array([3, 1, 1], np.int64),
        "reps": np.array([2, 1], np.int64),
        "scale": np.array(0.05, np.float32),
        "zero": np.array(128, np.uint8),
        "zeros": np.zeros((1,), np.float32),
    }
    nodes = [
        helper.make_node("Transpose", ["ids"], ["t"], perm=[1, 0]),
        helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Concat", ["s", "s"], ["c"], axis=1),
        helper.make_node("Pad", ["c", "pads", "seven"], ["p"]),
        helper.make_node("Expand", ["p", "shape"], ["e"]),
        helper.make_node("Transpose", ["codes"], ["ct"], perm=[1, 0]),
        helper.make_node("Tile", ["ct", "reps"], ["tiled"]),
        helper.make_node("DequantizeLinear", ["tiled", "scale", "zero"], ["dq"]),
        helper.make_node("Less", ["x", "zeros"], ["neg"]),
        helper.make_node("Transpose", ["neg"], ["nt"], perm=[1, 0]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        helper.make_node("Where", ["nt", "xt", "dq"], ["w"]),
    ]
    graph = helper.make_graph(
        nodes,
        "integers",
        [
            helper.make_tensor_value_info("ids", i64, [2, 20]),
            helper.make_tensor_value_info("codes", TensorProto.UINT8, [6, 15]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 30]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("w",)]
        + [helper.make_tensor_value_info("e", i64, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("threads", [1, 2])
def test_integer_and_bool_values_move_natively(rng, monkeypatch, threads):
    """Transpose, Slice, Concat, Pad, Expand and Tile of int64, uint8 and bool values that
    change per call run as gathers of their own sizes: onnxruntime's values exactly."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ort = oracle("onnxruntime")
    ours, python, session = _engines(_integer_movement_model(), ort)
    with fastlayers.using_threads(threads):
        for _ in range(3):
            feed = {
                "ids": rng.integers(-(10**12), 10**12, (2, 20)),
                "codes": rng.integers(0, 256, (6, 15)).astype(np.uint8),
                "x": rng.standard_normal((6, 30)).astype(np.float32),
            }
            for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
                np.testing.assert_array_equal(g, w)
                np.testing.assert_array_equal(g, p)
        native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == ()
    assert {"Transpose", "Slice", "Concat", "Pad", "Expand", "Tile"} <= set(native)


def _pooling_head_model(rng):
    """An embedding lookup of token ids (a Gather on computed indices), a mask-weighted mean
    over the tokens (a row broadcast against its row, ReduceSum over a middle axis), the
    L2 norm of each row, a min-max scaling by values the graph computes (ReduceMax / ReduceMin
    over every axis), an L1 / sum-of-squares pair and a Gather of the table's columns."""
    table = (0.5 * rng.standard_normal((50, 12))).astype(np.float32)
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([0, 1], np.int64), "zero_one"),
        numpy_helper.from_array((0.1 * rng.standard_normal((9, 1))).astype(np.float32), "bias_t"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),  # (2, 9, 12)
        helper.make_node("Unsqueeze", ["w", "last"], ["w3"]),  # (2, 9, 1)
        helper.make_node("Mul", ["emb", "w3"], ["weighted"]),
        helper.make_node("Sub", ["weighted", "bias_t"], ["shifted"]),  # a (9, 1) constant
        helper.make_node("ReduceSum", ["shifted", "one"], ["summed"], keepdims=0),  # (2, 12)
        helper.make_node("ReduceL2", ["summed", "one"], ["norm"], keepdims=1),  # (2, 1)
        helper.make_node("Div", ["summed", "norm"], ["unit"]),
        helper.make_node("ReduceMax", ["emb"], ["hi"], keepdims=1),  # over every axis
        helper.make_node("ReduceMin", ["emb"], ["lo"], keepdims=1),
        helper.make_node("Sub", ["emb", "lo"], ["from_lo"]),
        helper.make_node("Sub", ["hi", "lo"], ["span"]),
        helper.make_node("Div", ["from_lo", "span"], ["scaled"]),
        helper.make_node("ReduceMean", ["scaled", "one"], ["mean"], keepdims=0),
        helper.make_node("ReduceL1", ["emb", "two"], ["l1"], keepdims=0),
        helper.make_node("ReduceSumSquare", ["emb", "zero_one"], ["ss"], keepdims=0),
        helper.make_node("Gather", ["emb", "cols"], ["picked"], axis=2),
    ]
    graph = helper.make_graph(
        nodes,
        "pooling_head",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 9]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 9]),
            helper.make_tensor_value_info("cols", TensorProto.INT32, [17]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("unit", "mean", "l1", "ss", "picked")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def test_lookups_reductions_and_broadcasts_run_natively(rng, monkeypatch):
    """Gathers on computed indices, reductions over any neighbouring axes and elementwise
    operands broadcast along any axis are steps of the plan: onnxruntime's values, the Python
    plan's within float rounding (sums in double); an index out of range gets the Python plan's
    error, naming the node."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _pooling_head_model(np.random.default_rng(11))
    ours, python, session = _engines(data, ort)
    for _ in range(3):
        feed = {
            "ids": rng.integers(-50, 50, (2, 9)).astype(np.int64),
            "w": rng.uniform(0, 1, (2, 9)).astype(np.float32),
            "cols": rng.integers(-12, 12, 17).astype(np.int32),
        }
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed)):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == ()
    assert {"Gather", "ReduceSum", "ReduceL2", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1"} <= set(native)
    assert {"ReduceSumSquare", "FusedElementwise", "Div"} <= set(native)
    bad = dict(feed, ids=np.full((2, 9), 50, np.int64))
    with pytest.raises(FastlayersError, match="Gather") as info:
        ours.run(None, bad)
    with pytest.raises(FastlayersError) as plain:
        python.run(None, bad)
    assert str(info.value) == str(plain.value)
    np.testing.assert_array_equal(ours.run(None, feed)[0], python.run(None, feed)[0])  # the plan serves again


def _mask_arithmetic_model():
    """Hugging Face-style mask arithmetic and the guards around a division: a Cast of an int64
    mask to float, comparisons of data and of integers, Where on a computed condition, Not /
    And / Or, IsNaN, Min / Max of two, Clip with a computed bound and with one omitted, and an
    Add of one value each."""
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(1e-9, np.float32), "tiny"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "masked"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
    ]
    nodes = [
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),  # (2, 20)
        helper.make_node("Equal", ["mf", "zero"], ["off"]),
        helper.make_node("Where", ["off", "masked", "x"], ["scores"]),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Less", ["m", "two"], ["small"]),  # int64 against int64
        helper.make_node("And", ["pos", "small"], ["both"]),
        helper.make_node("Not", ["both"], ["neither"]),
        helper.make_node("Or", ["neither", "off"], ["either"]),
        helper.make_node("Cast", ["either"], ["ef"], to=TensorProto.FLOAT),
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "scores"], ["clean"]),
        helper.make_node("Max", ["clean", "ef"], ["hi"]),
        helper.make_node("Min", ["hi", "x"], ["lo"]),
        helper.make_node("ReduceMax", ["lo"], ["top"], keepdims=0),  # one value
        helper.make_node("Clip", ["x", "", "top"], ["clipped"]),
        helper.make_node("ReduceSum", ["clipped"], ["total"], keepdims=0),  # one value
        helper.make_node("Clip", ["total", "tiny"], ["guarded"]),
        helper.make_node("Add", ["guarded", "tiny"], ["denominator"]),
        helper.make_node("Div", ["clipped", "denominator"], ["y"]),
        helper.make_node("Cast", ["pos"], ["pos64"], to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "mask_arithmetic",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20]),
            helper.make_tensor_value_info("m", TensorProto.INT64, [2, 20]),
        ],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (("y", TensorProto.FLOAT), ("pos64", TensorProto.INT64))
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def test_comparisons_where_casts_and_clips_run_natively(rng, monkeypatch):
    """The map step: comparisons, Where, Cast, logic, IsNaN, Min / Max, Clip and arithmetic of
    one value, each bit for bit the Python plan's and equal to onnxruntime's."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _mask_arithmetic_model()
    ours, python, session = _engines(data, ort)
    for _ in range(3):
        x = rng.standard_normal((2, 20)).astype(np.float32)
        x[0, 3] = np.nan
        feed = {"x": x, "m": rng.integers(0, 3, (2, 20)).astype(np.int64)}
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed)):
            assert_close(g, w, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(g, p)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == ()
    ops = {"Cast", "Equal", "Where", "Greater", "Less", "And", "Not", "Or", "IsNaN", "Max", "Min", "Clip"}
    assert ops <= set(native)


def _broadcast_model(shapes, reduce_axes, keepdims):
    """Where(Greater(a, b), a * c, b - c) over three float inputs of ``shapes`` (broadcast to
    one shape), then a ReduceSum over ``reduce_axes`` of the result and a ReduceMax over every
    axis: the map step, broadcast operands and reductions on arbitrary shapes."""
    axes = numpy_helper.from_array(np.array(reduce_axes, np.int64), "axes")
    nodes = [
        helper.make_node("Greater", ["a", "b"], ["gt"]),
        helper.make_node("Mul", ["a", "c"], ["ac"]),
        helper.make_node("Sub", ["b", "c"], ["bc"]),
        helper.make_node("Where", ["gt", "ac", "bc"], ["w"]),
        helper.make_node("ReduceSum", ["w", "axes"], ["s"], keepdims=keepdims),
        helper.make_node("ReduceMax", ["w"], ["m"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "broadcasts",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip("abc", shapes)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("w", "s", "m")],
        [axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


@st.composite
def _broadcast_case(draw):
    ndim = draw(st.integers(1, 4))
    full = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    shapes = []
    for k in range(3):
        lead = draw(st.integers(0, ndim - 1)) if k else 0  # leading axes dropped, others kept or made 1
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in full[lead:]))
    start = draw(st.integers(0, ndim - 1))
    stop = draw(st.integers(start + 1, ndim))
    return shapes, list(range(start, stop)), draw(st.integers(0, 1))


@settings(max_examples=25, deadline=None)
@given(case=_broadcast_case())
def test_broadcasts_and_reductions_match_the_python_plan(case):
    """Random broadcast shapes and reduced axes: the plan's values are the Python plan's (the
    comparisons and Where exactly, the sums within float rounding)."""
    shapes, reduce_axes, keepdims = case
    data = _broadcast_model(shapes, reduce_axes, keepdims)
    ours = fastlayers.load(data)
    python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
    rng = np.random.default_rng(len(str(case)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lowering, "STEP_US", 1e6)  # a plan whatever the cost model finds
        for _ in range(3):
            feed = {n: rng.integers(-3, 4, s).astype(np.float32) for n, s in zip("abc", shapes)}
            for g, p in zip(ours.run(None, feed), python.run(None, feed)):
                assert g.shape == p.shape and g.dtype == p.dtype
                assert_close(g, p, rtol=1e-6, atol=1e-6)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == () and {"Greater", "Where", "ReduceSum", "ReduceMax"} <= set(native)


def _bidirectional_model(kind, hidden=24, n_in=10, states=True, y_read=True):
    """One bidirectional ``kind`` layer (layout 0) on x (T, B, n_in), its initial states inputs
    of the graph (or absent), followed by a Tanh of Y (or of Y_h where Y is not read)."""
    rng = np.random.default_rng(4)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    scale = 0.3 * np.sqrt(24 / hidden)  # a contracting recurrence: rounding does not grow over the steps
    f = lambda *s: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(2, gates * hidden, n_in), "W"),
        numpy_helper.from_array(f(2, gates * hidden, hidden), "R"),
        numpy_helper.from_array(f(2, 2 * gates * hidden), "B"),
    ]
    state_names = (["h0", "c0"] if kind == "LSTM" else ["h0"]) if states else []
    node_ins = ["x", "W", "R", "B", "", *state_names]
    outs = ["Y", "Yh", "Yc"] if kind == "LSTM" else ["Y", "Yh"]
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    nodes = [
        helper.make_node(kind, node_ins, outs, hidden_size=hidden, direction="bidirectional", **extra),
        helper.make_node("Tanh", ["Y" if y_read else "Yh"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "bidirectional",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "B", n_in])]
        + [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, "B", hidden]) for n in state_names],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["out", *outs[1:]]],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("states, y_read", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("hidden, steps", [(24, 40), (128, 100)])
def test_bidirectional_recurrent_layers_run_natively(rng, monkeypatch, kind, states, y_read, threads, hidden, steps):
    """A bidirectional layer's directions as plan steps (at 2 threads the larger layer's at
    once, one thread each, the smaller's one after the other, as the Python plan runs them):
    its values bit for bit, onnxruntime's."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _bidirectional_model(kind, hidden=hidden, states=states, y_read=y_read)
    with fastlayers.using_threads(threads):
        ours = fastlayers.load(data)
        python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        for batch in (1, 3, 3, 3):
            feed = {"x": rng.standard_normal((steps, batch, 10)).astype(np.float32)}
            if states:
                feed["h0"] = (0.5 * rng.standard_normal((2, batch, hidden))).astype(np.float32)
                if kind == "LSTM":
                    feed["c0"] = (0.5 * rng.standard_normal((2, batch, hidden))).astype(np.float32)
            for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed)):
                assert_close(g, w, rtol=1e-4, atol=1e-5)
                np.testing.assert_array_equal(g, p)
        native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == () and kind in native


def _bidirectional_quantized_model(rng, hidden=32, n_in=12, states=True):
    """A bidirectional DynamicQuantizeLSTM as the text2tashkeel taggers write it (7-bit
    weights, per-column W scales), its initial states inputs of the graph or absent."""
    f = TensorProto.FLOAT
    consts = _qlstm_constants(rng, 2, n_in, hidden)
    state_names = ["h0", "c0"] if states else ["", ""]
    nodes = [
        helper.make_node(
            "DynamicQuantizeLSTM",
            ["x", "w", "r", "bias", "", *state_names, "", "ws", "wz", "rs", "rz"],
            ["y", "yh", "yc"],
            domain="com.microsoft",
            hidden_size=hidden,
            direction="bidirectional",
        ),
    ]
    inputs = [helper.make_tensor_value_info("x", f, ["T", "B", n_in])]
    inputs += [helper.make_tensor_value_info(n, f, [2, "B", hidden]) for n in state_names if n]
    graph = helper.make_graph(
        nodes,
        "bidirectional_quantized",
        inputs,
        [helper.make_tensor_value_info(n, f, None) for n in ("y", "yh", "yc")],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


@pytest.mark.parametrize("states", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_bidirectional_quantized_lstm_runs_natively(rng, monkeypatch, states, threads):
    """Both directions' input products and time loops in one plan step (side by side at 2
    threads): onnxruntime's bits at one thread, the Python plan's."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    ort = oracle("onnxruntime")
    data = _bidirectional_quantized_model(np.random.default_rng(8), states=states)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    with fastlayers.using_threads(threads):
        ours = fastlayers.load(data)
        python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
        for batch in (1, 2, 2, 2):
            feed = {"x": rng.standard_normal((30, batch, 12)).astype(np.float32)}
            if states:
                feed.update({n: rng.standard_normal((2, batch, 32)).astype(np.float32) for n in ("h0", "c0")})
            for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
                np.testing.assert_array_equal(g, w)
                np.testing.assert_array_equal(g, p)
        native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == () and "com.microsoft::DynamicQuantizeLSTM" in native


def _quantized_embedding_model(rng):
    """text2tashkeel's front as its int8 files write it (a uint8 embedding table looked up by
    token ids, then DequantizeLinear), a Gelu of both forms, and a row's norm through Sqrt and
    Reciprocal of one value each."""
    consts = {
        "table": rng.integers(0, 256, (40, 16)).astype(np.uint8),
        "scale": np.array(0.021, np.float32),
        "zero": np.array(131, np.uint8),
        "axes": np.array([1, 2], np.int64),
    }
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["q"], axis=0),  # (1, 20, 16) uint8
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["e"]),
        helper.make_node("Gelu", ["e"], ["g"]),
        helper.make_node("Gelu", ["e"], ["gt"], approximate="tanh"),
        helper.make_node("Mul", ["g", "gt"], ["m"]),
        helper.make_node("ReduceSumSquare", ["m", "axes"], ["ss"], keepdims=1),  # (1, 1, 1)
        helper.make_node("Sqrt", ["ss"], ["norm"]),
        helper.make_node("Reciprocal", ["norm"], ["inv"]),
        helper.make_node("Mul", ["m", "inv"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "quantized_embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9).SerializeToString()


def test_a_quantized_embedding_and_gelus_run_natively(rng, monkeypatch):
    """A Gather of uint8 rows, DequantizeLinear (the Python plan's float32 bits), Gelu in both
    forms (the activation kernel), Sqrt and Reciprocal of one value: every node native."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    data = _quantized_embedding_model(np.random.default_rng(12))
    ours, python, session = _engines(data, ort)
    for _ in range(3):
        feed = {"ids": rng.integers(-40, 40, (1, 20)).astype(np.int64)}
        (got,), (want,), (plain,) = ours.run(None, feed), session.run(None, feed), python.run(None, feed)
        assert_close(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got, plain)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert fallbacks == ()
    assert {"Gather", "DequantizeLinear", "Gelu", "Sqrt", "Reciprocal"} <= set(native)


def test_the_new_steps_keep_memory_flat(rng, monkeypatch):
    """Plans of map, take, reduce, bidirectional int8 and embedding recurrence steps allocate nothing per call but
    their outputs: Python's heap flat over hundreds of calls, from the calling thread and from
    new threads."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    models = [
        (
            _mask_arithmetic_model(),
            lambda: {
                "x": rng.standard_normal((2, 20)).astype(np.float32),
                "m": rng.integers(0, 3, (2, 20)).astype(np.int64),
            },
        ),
        (
            _quantized_embedding_model(np.random.default_rng(12)),
            lambda: {"ids": rng.integers(-40, 40, (1, 20)).astype(np.int64)},
        ),
        (
            _bidirectional_quantized_model(np.random.default_rng(8), states=False),
            lambda: {"x": rng.standard_normal((30, 2, 12)).astype(np.float32)},
        ),
        (
            _embedding_recurrent_model(np.random.default_rng(9), "LSTM", "forward", False, TensorProto.INT64),
            lambda: {"ids": rng.integers(-30, 30, (4, 9)).astype(np.int64)},
        ),
    ]
    loaded = [(fastlayers.load(data), feed()) for data, feed in models]
    for model, feed in loaded:
        for _ in range(20):
            model.run(None, feed)
        assert _serving(model, feed) is not None
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(200):
        for model, feed in loaded:
            model.run(None, feed)
    in_threads(lambda i: [model.run(None, feed) for model, feed in loaded], 20)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10


@pytest.mark.parametrize("activation", ["Relu", "Tanh", "Sigmoid"])
def test_an_add_and_its_activation_run_as_one_native_step(rng, monkeypatch, activation):
    """Add of two computed values and the activation after it (FusedAdd): the add_act step,
    the Python plan's bits."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    w1, w2 = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"]),
            helper.make_node("Sin", ["x"], ["xs"]),  # no product: the Add reads two values
            helper.make_node("MatMul", ["xs", "w2"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node(activation, ["s"], ["y"]),
        ],
        "fused_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    ours, python, session = _engines(data, ort)
    assert "FusedAdd" in ours.op_types
    for _ in range(3):
        feed = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
        for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed)):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(g, p)
    native, fallbacks, _ = _serving(ours, feed).summary
    assert "FusedAdd" in native and "Sin" in fallbacks


def _embedding_recurrent_model(rng, kind, direction, time_major, ids_type, vocab=30, emb=6, hidden=8):
    """Gather(table, ids) -> [Transpose] -> ``kind`` (layout 0) -> Tanh of Y, and Y_h: the
    ids batch-major through a Transpose (as torch's batch_first exports) or time-major as
    given, which the import folds into one ``Embedding<kind>`` node."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    nd = 2 if direction == "bidirectional" else 1
    f = lambda *s: (0.4 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(vocab, emb), "table"),
        numpy_helper.from_array(f(nd, gates * hidden, emb), "W"),
        numpy_helper.from_array(f(nd, gates * hidden, hidden), "R"),
        numpy_helper.from_array(f(nd, 2 * gates * hidden), "B"),
    ]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"])]
    if not time_major:
        nodes.append(helper.make_node("Transpose", ["emb"], ["x"], perm=[1, 0, 2]))
    nodes += [
        helper.make_node(
            kind, ["emb" if time_major else "x", "W", "R", "B"], ["Y", "Yh"], hidden_size=hidden, direction=direction
        ),
        helper.make_node("Tanh", ["Y"], ["out"]),
    ]
    ids_shape = ["T", "N"] if time_major else ["N", "T"]
    graph = helper.make_graph(
        nodes,
        "embedding_recurrent",
        [helper.make_tensor_value_info("ids", ids_type, ids_shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "Yh")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("time_major, ids_type", [(False, TensorProto.INT64), (True, TensorProto.INT32)])
@pytest.mark.parametrize("threads", [1, 2])
def test_embedding_recurrences_run_natively(rng, monkeypatch, kind, direction, time_major, ids_type, threads):
    """An embedding folded into a recurrent layer (``Embedding<kind>``) as plan steps: the ids
    (int64 or int32, batch- or time-major, negatives counted from the end) checked and turned
    into rows of the folded table by a take step, then the time loop(s) reading those rows:
    the Python plan's bits, onnxruntime's values; an id outside the table raises the Gather's
    error, and the next call runs natively again."""
    ort = oracle("onnxruntime")
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    vocab, dtype = 30, np.int64 if ids_type == TensorProto.INT64 else np.int32
    data = _embedding_recurrent_model(np.random.default_rng(5), kind, direction, time_major, ids_type, vocab)
    with fastlayers.using_threads(threads):
        ours, python, session = _engines(data, ort)
        assert f"Embedding{kind}" in ours.op_types
        for batch, steps in [(1, 1), (3, 7), (3, 7), (3, 7)]:
            shape = (steps, batch) if time_major else (batch, steps)
            feed = {"ids": rng.integers(-vocab, vocab, shape).astype(dtype)}
            for g, w, p in zip(ours.run(None, feed), session.run(None, feed), python.run(None, feed), strict=True):
                assert_close(g, w, rtol=1e-4, atol=1e-5)
                np.testing.assert_array_equal(g, p)
        native, fallbacks, _ = _serving(ours, feed).summary
        assert fallbacks == () and f"Embedding{kind}" in native
        for bad in (vocab, -vocab - 1):
            wrong = feed["ids"].copy()
            wrong.flat[5] = bad
            with pytest.raises(FastlayersError, match="out of bounds"):
                ours.run(None, {"ids": wrong})
        for g, p in zip(ours.run(None, feed), python.run(None, feed), strict=True):
            np.testing.assert_array_equal(g, p)
