"""Loop and Scan bodies lowered into native plans (``onnx/plan_control.py``): against
onnxruntime and the Python plan, with the cases that send a call back to the Python plan."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError
from fastlayers.onnx import lowering

from ..conftest import assert_close, in_threads, oracle

pytest.importorskip("onnx")
from onnx import TensorProto, helper

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
B, I, H, T = 2, 5, 7, 9


def _model(graph) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _const(name, a):
    a = np.asarray(a)
    kind = {np.dtype(np.float32): F32, np.dtype(np.int64): I64, np.dtype(np.bool_): BOOL}[a.dtype]
    return helper.make_tensor(name, kind, a.shape, a.ravel().tolist())


def _engines(data):
    ort = oracle("onnxruntime")
    return (
        fastlayers.load(data),
        fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False)),
        ort.InferenceSession(data, providers=["CPUExecutionProvider"]),
    )


def _check(data, feeds, plans=True):
    """Every feed run by fastlayers, its Python plan and onnxruntime; the native plans that
    served the calls, asserted to exist unless ``plans`` is False."""
    ours, python, session = _engines(data)
    for feed in feeds:
        got, want, same = ours.run(None, feed), session.run(None, feed), python.run(None, feed)
        for g, w, p in zip(got, want, same):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert_close(g, w, rtol=1e-5, atol=1e-6)
            assert_close(g, p, rtol=1e-6, atol=1e-7)  # the same kernels, in a plan
    found = [p for p in ours._native.plans.values() if isinstance(p, lowering.Plan)] if ours._native else []
    if plans:
        assert found
    return ours, found


def _rnn_scan(rng, rev_in, rev_out, axis=0):
    """A tanh RNN as a Scan over ``axis`` of x ((T, B, I) or (B, T, I)), its outputs stacked
    on that axis: its weights are the body's own constants and outer initializers, and it
    reads a value computed from an input."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["xt", "w"], ["p"]),
            helper.make_node("MatMul", ["s", "u"], ["q"]),
            helper.make_node("Add", ["p", "q"], ["r"]),
            helper.make_node("Add", ["r", "bias"], ["r2"]),
            helper.make_node("Tanh", ["r2"], ["s2"]),
            helper.make_node("Mul", ["s2", "scale"], ["o"]),
        ],
        "body",
        [helper.make_tensor_value_info("s", F32, [B, H]), helper.make_tensor_value_info("xt", F32, [B, I])],
        [
            helper.make_tensor_value_info("s2", F32, [B, H]),
            helper.make_tensor_value_info("o", F32, [B, H]),
            helper.make_tensor_value_info("p", F32, [B, H]),
        ],
        initializer=[_const("bias", rng.standard_normal(H).astype(np.float32))],
    )
    scan = helper.make_node(
        "Scan",
        ["s0", "x"],
        ["s_end", "ys", "ps"],
        body=body,
        num_scan_inputs=1,
        scan_input_directions=[rev_in],
        scan_output_directions=[rev_out, rev_out],
        scan_input_axes=[axis],
        scan_output_axes=[axis, axis],
    )
    graph = helper.make_graph(
        [helper.make_node("Mul", ["k", "two"], ["scale"]), scan],
        "scan",
        [
            helper.make_tensor_value_info("s0", F32, [B, H]),
            helper.make_tensor_value_info("x", F32, [B, T, I] if axis else [T, B, I]),
            helper.make_tensor_value_info("k", F32, [1]),
        ],
        [
            helper.make_tensor_value_info("s_end", F32, None),
            helper.make_tensor_value_info("ys", F32, None),
            helper.make_tensor_value_info("ps", F32, None),
        ],
        initializer=[
            _const("w", (0.4 * rng.standard_normal((I, H))).astype(np.float32)),
            _const("u", (0.4 * rng.standard_normal((H, H))).astype(np.float32)),
            _const("two", np.array([2.0], np.float32)),
        ],
    )
    return _model(graph)


@pytest.mark.parametrize("axis", [0, 1, -2])
@pytest.mark.parametrize("rev_in, rev_out", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_scan_bodies_run_natively(rng, rev_in, rev_out, axis):
    feeds = [
        {
            "s0": rng.standard_normal((B, H)).astype(np.float32),
            "x": rng.standard_normal((B, T, I) if axis else (T, B, I)).astype(np.float32),
            "k": rng.standard_normal(1).astype(np.float32),
        }
        for _ in range(5)
    ]
    _, plans = _check(_rnn_scan(rng, rev_in, rev_out, axis), feeds)
    native, fallbacks, _ = plans[0].summary
    assert "Scan" in native and "FusedDense" in native and not fallbacks


def _counter_loop(rng, trips_input=False, value_cond=False, stacked=True, trips=11):
    """A Loop carrying h through h = tanh(h w + i b) (i the iteration number), stacking each
    iteration's h before the update (an output that is the carried input itself); its
    condition i < 1000, or with ``value_cond`` sum(h) < 0 (the iterations then depend on the
    values)."""
    nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=F32),
        helper.make_node("MatMul", ["h_in", "w"], ["p"]),
        helper.make_node("Mul", ["i_f", "b"], ["ib"]),
        helper.make_node("Add", ["p", "ib"], ["q"]),
        helper.make_node("Tanh", ["q"], ["h_out"]),
        helper.make_node("Identity", ["h_in"], ["h_prev"]),
    ]
    if value_cond:
        nodes += [
            helper.make_node("ReduceSum", ["h_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "zero"], ["c_out"]),
        ]
    else:
        nodes.append(helper.make_node("Less", ["i", "lim"], ["c_out"]))
    outs = [helper.make_tensor_value_info("c_out", BOOL, []), helper.make_tensor_value_info("h_out", F32, [1, H])]
    if stacked:
        outs.append(helper.make_tensor_value_info("h_prev", F32, [1, H]))
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", BOOL, []),
            helper.make_tensor_value_info("h_in", F32, [1, H]),
        ],
        outs,
        initializer=[_const("zero", np.array(0.0, np.float32)), _const("lim", np.array(1000, np.int64))],
    )
    loop = helper.make_node("Loop", ["m", "go", "h0"], ["h_end"] + (["hs"] if stacked else []), body=body)
    inputs = [helper.make_tensor_value_info("h0", F32, [1, H])]
    inits = [
        _const("w", (0.5 * rng.standard_normal((H, H))).astype(np.float32)),
        _const("b", (0.1 * rng.standard_normal(H)).astype(np.float32)),
        _const("go", np.array(True)),
    ]
    if trips_input:
        inputs.append(helper.make_tensor_value_info("m", I64, []))
    else:
        inits.append(_const("m", np.array(trips, np.int64)))
    outputs = [helper.make_tensor_value_info("h_end", F32, None)]
    if stacked:
        outputs.append(helper.make_tensor_value_info("hs", F32, None))
    return _model(helper.make_graph([loop], "loop", inputs, outputs, initializer=inits))


@pytest.mark.parametrize("trips_input", [False, True])
def test_loop_bodies_run_natively(rng, trips_input):
    feeds = []
    for trips in (11, 11, 11, 4, 4, 4, 11):
        feed = {"h0": rng.standard_normal((1, H)).astype(np.float32)}
        if trips_input:
            feed["m"] = np.array(trips, np.int64)
        feeds.append(feed)
    _, plans = _check(_counter_loop(rng, trips_input=trips_input), feeds)
    assert len(plans) == (2 if trips_input else 1)  # a small integer input is part of the key
    for plan in plans:
        native, fallbacks, _ = plan.summary
        assert {"Loop", "Cast", "Less"} <= set(native) and not fallbacks


def test_a_loop_whose_iterations_follow_the_values(rng):
    """Without stacked outputs a plan runs the loop as long as the values say; with them, a
    call that runs another number of iterations than the plan's trace goes back to the
    Python plan, for good."""
    feeds = [{"h0": rng.standard_normal((1, H)).astype(np.float32)} for _ in range(12)]
    _, plans = _check(_counter_loop(rng, value_cond=True, stacked=False, trips=30), feeds)
    assert "Loop" in plans[0].summary[0]
    ours, _ = _check(_counter_loop(rng, value_cond=True, stacked=True, trips=30), feeds, plans=False)
    assert False in ours._native.plans.values()


def _counting_loop(limit):
    """A Loop with no trip count adding 1 to v while v < limit (a float input)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
            helper.make_node("Less", ["v_out", "limit"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", BOOL, []),
            helper.make_tensor_value_info("v_in", F32, [1]),
        ],
        [helper.make_tensor_value_info("c_out", BOOL, []), helper.make_tensor_value_info("v_out", F32, [1])],
    )
    loop = helper.make_node("Loop", ["", "go", "v0"], ["v"], name="counter", body=body)
    return _model(
        helper.make_graph(
            [loop],
            "loop",
            [helper.make_tensor_value_info("v0", F32, [1]), helper.make_tensor_value_info("limit", F32, [1])],
            [helper.make_tensor_value_info("v", F32, [1])],
            initializer=[_const("one", np.array([1.0], np.float32)), _const("go", np.array(True))],
        )
    )


def test_the_iteration_limit_holds_inside_a_plan():
    options = fastlayers.LoadOptions(onnx_max_loop_iterations=50)
    model = fastlayers.load(_counting_loop(50), options=options)
    zero = np.zeros(1, np.float32)
    for limit in (3.0, 7.0, 20.0, 49.0):
        assert model(zero, np.array([limit], np.float32))[0] == limit
    assert any(isinstance(p, lowering.Plan) for p in model._native.plans.values())
    with pytest.raises(InputError, match=r"'counter' \(Loop\).*ran 50 iterations"):
        model(zero, np.array([1e9], np.float32))
    assert model(zero, np.array([5.0], np.float32))[0] == 5.0  # the plan still serves


def test_ifs_on_the_iteration_and_swapped_carried_values(rng):
    """A body with an If on its iteration number (both branches bound, one run per iteration)
    and carried outputs that are other carried inputs (copied through buffers of their own)."""
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["a_in", "b_in"], ["r"])], "then", [], [helper.make_tensor_value_info("r", F32, [3])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Sub", ["a_in", "b_in"], ["r"])], "else", [], [helper.make_tensor_value_info("r", F32, [3])]
    )
    body = helper.make_graph(
        [
            helper.make_node("Less", ["i", "two"], ["early"]),
            helper.make_node("If", ["early"], ["picked"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Mul", ["picked", "half"], ["a_out"]),
            helper.make_node("Identity", ["a_in"], ["b_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", BOOL, []),
            helper.make_tensor_value_info("a_in", F32, [3]),
            helper.make_tensor_value_info("b_in", F32, [3]),
        ],
        [
            helper.make_tensor_value_info("c_out", BOOL, []),
            helper.make_tensor_value_info("a_out", F32, [3]),
            helper.make_tensor_value_info("b_out", F32, [3]),
        ],
        initializer=[_const("two", np.array(2, np.int64)), _const("half", np.array(0.5, np.float32))],
    )
    swap = helper.make_graph(
        [helper.make_node("Identity", ["b_in"], ["a_out"]), helper.make_node("Identity", ["a_in"], ["b_out"])]
        + [helper.make_node("Identity", ["c_in"], ["c_out"])],
        "swap",
        body.input,
        body.output,
    )
    for loop_body in (body, swap):
        loop = helper.make_node("Loop", ["m", "go", "a0", "b0"], ["a", "b"], body=loop_body)
        graph = helper.make_graph(
            [helper.make_node("Neg", ["x"], ["a0"]), helper.make_node("Abs", ["x"], ["b0"]), loop],
            "loop",
            [helper.make_tensor_value_info("x", F32, [3])],
            [helper.make_tensor_value_info("a", F32, None), helper.make_tensor_value_info("b", F32, None)],
            initializer=[_const("m", np.array(5, np.int64)), _const("go", np.array(True))],
        )
        feeds = [{"x": rng.standard_normal(3).astype(np.float32)} for _ in range(5)]
        _, plans = _check(_model(graph), feeds)
        native, fallbacks, _ = plans[0].summary
        assert "Loop" in native and not fallbacks
        assert ("If" in native) == (loop_body is body)


def _data_if(rng, else_nodes, else_shape):
    """If(sum(x) > 0): then relu(x w) (x (3, 4), w (4, 4)), else the graph ``else_nodes``
    giving "r" of ``else_shape`` from x."""
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["r"])],
        "then",
        [],
        [helper.make_tensor_value_info("r", F32, [3, 4])],
    )
    else_branch = helper.make_graph(
        else_nodes, "else", [], [helper.make_tensor_value_info("r", F32, else_shape)], initializer=[]
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["positive"]),
            helper.make_node("If", ["positive"], ["y"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Sigmoid", ["y"], ["z"]),
        ],
        "data_if",
        [helper.make_tensor_value_info("x", F32, [3, 4])],
        [helper.make_tensor_value_info("z", F32, None)],
        initializer=[
            _const("w", rng.standard_normal((4, 4)).astype(np.float32)),
            _const("zero", np.array(0.0, np.float32)),
            _const("shape", np.array([2, 6], np.int64)),
            _const("bad_shape", np.array([5, 5], np.int64)),
        ],
    )
    return _model(graph)


def _signed_feeds(rng, signs):
    return [{"x": (np.abs(rng.standard_normal((3, 4))) * s).astype(np.float32)} for s in signs]


def test_an_if_on_a_computed_condition_runs_either_branch_natively(rng):
    data = _data_if(rng, [helper.make_node("Neg", ["x"], ["r"])], [3, 4])
    _, plans = _check(data, _signed_feeds(rng, [1, 1, -1, 1, -1, -1, 1]))
    native, fallbacks, _ = plans[0].summary
    assert {"If", "FusedDense", "FusedElementwise", "Sigmoid"} <= set(native) and not fallbacks


@pytest.mark.parametrize("case", ["other_shape", "fails_on_the_trace"])
def test_an_if_whose_branches_differ_runs_in_python(rng, monkeypatch, case):
    """Branches of other output shapes, or an untaken branch that fails on the trace's values:
    the If runs in Python inside the plan (which the cost model is told to keep); a call whose
    branch gives another shape than the plan holds goes back to the Python plan for good."""
    monkeypatch.setattr(lowering, "STEP_US", 1e6)
    if case == "other_shape":  # (the warm-up at load takes the else branch: zeros sum to 0)
        data = _data_if(rng, [helper.make_node("Reshape", ["x", "shape"], ["r"])], [2, 6])
        ours, _ = _check(data, _signed_feeds(rng, [1, 1, 1, -1, 1, -1]), plans=False)
        assert list(ours._native.plans.values()) == [False]
    else:
        data = _data_if(rng, [helper.make_node("Reshape", ["x", "bad_shape"], ["r"])], [5, 5])
        _, plans = _check(data, _signed_feeds(rng, [1, 1, 1, 1]))
        assert "If" in plans[0].summary[1]


def test_loop_plans_keep_memory_flat(rng):
    """Calls through a plan with a Scan and a Loop allocate nothing that stays, from one
    thread or several."""
    scan = fastlayers.load(_rnn_scan(rng, 1, 0))
    loop = fastlayers.load(_counter_loop(rng))
    feed = {
        "s0": rng.standard_normal((B, H)).astype(np.float32),
        "x": rng.standard_normal((T, B, I)).astype(np.float32),
        "k": rng.standard_normal(1).astype(np.float32),
    }
    h0 = {"h0": rng.standard_normal((1, H)).astype(np.float32)}

    def calls(count):
        for _ in range(count):
            scan.run(None, feed)
            loop.run(None, h0)

    calls(50)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    calls(300)
    in_threads(lambda i: calls(50), 4)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
