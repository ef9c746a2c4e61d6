"""Step-by-step profiles of imported ONNX models (``OnnxModel.profile``, ``fastlayers profile``)."""

import subprocess
import sys
import time

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError

from ..conftest import oracle
from .test_import import make_graph

#: Where a test profiles the Python plan's steps (bound forms, backend kernels): calls that
#: would otherwise run as a native plan (test_native_plans.py profiles those).
PYTHON_PLAN = fastlayers.LoadOptions(native_plans=False)


def _graph(tmp_path, rng):
    """Conv -> HardSwish (fused into the convolution) -> Resize -> ReduceMean (both native on
    the NHWC memory) -> Cos (numpy)."""
    onnx = oracle("onnx")
    h = onnx.helper
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        h.make_node("HardSwish", ["c"], ["a"], name="act"),
        h.make_node("Resize", ["a", "", "scales"], ["r"], mode="nearest", name="up"),
        h.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0, name="mean"),
        h.make_node("Cos", ["m"], ["y"], name="cos"),
    ]
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", 1, None)],
        [h.make_tensor("w", 1, w.shape, w.ravel()), h.make_tensor("scales", 1, [4], [1, 1, 2, 2])],
    )
    path = tmp_path / "small.onnx"
    onnx.save(model, str(path))
    return path


def test_profile_names_each_step_its_kernel_layout_and_shapes(tmp_path, rng):
    """The Python plan's steps: each names the kernel the backend runs for it."""
    model = fastlayers.load(_graph(tmp_path, rng), options=PYTHON_PLAN)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    profile = model.profile(x, repeats=3)
    assert [s.op_type for s in profile.steps] == model.op_types == ["FusedConv", "Resize", "ReduceMean", "Cos"]
    conv, resize, mean, cos = profile.steps
    assert conv.fused == "hard_silu" and "cpu.conv2d" in conv.kernel and conv.layout == "nhwc"
    assert conv.input_shapes[0] == (1, 3, 8, 8) and conv.output_shapes == [(1, 4, 8, 8)]
    assert resize.kernel == "cpu.resize2d_taps" and resize.output_shapes == [(1, 4, 16, 16)]
    assert resize.layout == "nhwc" and mean.kernel == "cpu.global_pool"
    assert mean.output_shapes == [(1, 4)] and mean.layout == "-"
    assert cos.kernel == "numpy"  # a fallback step is named as one
    assert all(s.ms > 0 for s in profile.steps) and profile.total_ms > 0
    assert sum(s.share for s in profile.steps) <= 1.05
    by_op = profile.by_op()
    assert {op for op, *_ in by_op} == {"FusedConv", "Resize", "ReduceMean", "Cos"}
    assert by_op == sorted(by_op, key=lambda r: -r[2])
    text = profile.table(top=2)
    slowest = max(profile.steps, key=lambda s: s.ms)
    assert text.count("\n") == 4 and slowest.op_type in text.splitlines()[2]
    assert "by operator: " in text and str(profile) == profile.table()
    np.testing.assert_array_equal(model(x), model(x))  # profiling left the model as it was


def test_profile_on_the_reference_backend_names_its_methods(tmp_path, rng):
    model = fastlayers.load(_graph(tmp_path, rng))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    with fastlayers.use_ops("reference"):
        profile = model.profile(x, repeats=1)
    assert profile.steps[0].kernel.startswith("reference.")


@pytest.mark.parametrize("repeats", [0, -1, 1.5, True])
def test_profile_refuses_a_bad_repeat_count(tmp_path, rng, repeats):
    model = fastlayers.load(_graph(tmp_path, rng))
    with pytest.raises(InputError, match="repeats"):
        model.profile(np.zeros((1, 3, 8, 8), np.float32), repeats=repeats)


def test_profile_with_a_pause_sleeps_before_each_timed_call(tmp_path, rng):
    model = fastlayers.load(_graph(tmp_path, rng))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    start = time.perf_counter()
    profile = model.profile(x, repeats=3, pause=0.02)
    assert time.perf_counter() - start >= 0.06
    assert profile.pause == 0.02 and profile.as_dict()["pause"] == 0.02
    assert "each after a 20 ms pause" in profile.table().splitlines()[0]
    assert "pause" not in model.profile(x, repeats=1).table().splitlines()[0]


@pytest.mark.parametrize("pause", [-0.1, 11, float("nan"), "1", True])
def test_profile_refuses_a_bad_pause(tmp_path, rng, pause):
    model = fastlayers.load(_graph(tmp_path, rng))
    with pytest.raises(InputError, match="pause"):
        model.profile(np.zeros((1, 3, 8, 8), np.float32), pause=pause)


def test_profile_command_prints_the_slowest_steps(tmp_path, rng):
    path = _graph(tmp_path, rng)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "fastlayers.cli", "--threads", "1", "profile", str(path), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    made_up = cli("--repeats", "2")
    assert made_up.returncode == 0, made_up.stderr
    assert "4 steps" in made_up.stdout and "FusedConv" in made_up.stdout and "1 thread" in made_up.stdout
    np.save(tmp_path / "x.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    given = cli("--input", str(tmp_path / "x.npy"), "--top", "1")
    assert given.returncode == 0, given.stderr
    assert len(given.stdout.strip().splitlines()) == 4  # title, header, one step, per operator
    np.save(tmp_path / "bad.npy", np.zeros((1, 2, 8, 8), np.float32))
    bad = cli("--input", str(tmp_path / "bad.npy"))
    assert bad.returncode == 2 and "expected shape" in bad.stderr
    spaced = cli("--repeats", "2", "--pause", "5")
    assert spaced.returncode == 0, spaced.stderr
    assert "each after a 5 ms pause" in spaced.stdout
    negative = cli("--pause", "-1")
    assert negative.returncode == 2 and "milliseconds" in negative.stderr


def _branching(tmp_path):
    """y = If(sum(x) > 0: Relu(Tanh(x)) with a nested If(c: Neg(x), else: Identity(x)) added;
    else Sigmoid(x)), the branches reading x and c from the graph."""
    onnx = oracle("onnx")
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    inner = h.make_node(
        "If",
        ["c"],
        ["n"],
        then_branch=h.make_graph(
            [h.make_node("Neg", ["x"], ["neg"])], "in_then", [], [h.make_tensor_value_info("neg", f, None)]
        ),
        else_branch=h.make_graph(
            [h.make_node("Identity", ["x"], ["same"])], "in_else", [], [h.make_tensor_value_info("same", f, None)]
        ),
    )
    then = h.make_graph(
        [
            h.make_node("Tanh", ["x"], ["t"]),
            h.make_node("Softmax", ["t"], ["r"]),  # (not elementwise: the steps stay apart)
            inner,
            h.make_node("Add", ["r", "n"], ["a"]),
        ],
        "then",
        [],
        [h.make_tensor_value_info("a", f, None)],
    )
    other = h.make_graph([h.make_node("Sigmoid", ["x"], ["s"])], "else", [], [h.make_tensor_value_info("s", f, None)])
    nodes = [
        h.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        h.make_node("Greater", ["total", "zero"], ["positive"]),
        h.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=other, name="choose"),
    ]
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", f, [2, 3]), h.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [h.make_tensor_value_info("y", f, None)],
        [h.make_tensor("zero", f, [], [0.0])],
    )
    path = tmp_path / "branching.onnx"
    onnx.save(model, str(path))
    return path


def test_profile_times_the_steps_of_the_branch_an_if_takes(tmp_path, rng):
    """The Python plan's profile (a native plan runs an If on a computed condition as one step
    of its own, its branches' operators in its row: test_a_native_if_is_one_profile_row)."""
    model = fastlayers.load(_branching(tmp_path), options=fastlayers.LoadOptions(native_plans=False))
    x = np.abs(rng.standard_normal((2, 3))).astype(np.float32)
    profile = model.profile(x, np.array(True), repeats=2)
    rows = [(s.branch, s.index, s.op_type) for s in profile.steps]
    assert rows == [
        ("", 0, "ReduceSum"),
        ("", 1, "Greater"),
        ("", 2, "If"),
        ("2.then/", 0, "Tanh"),
        ("2.then/", 1, "Softmax"),
        ("2.then/", 2, "If"),
        ("2.then/2.then/", 0, "FusedElementwise"),  # a Neg
        ("2.then/", 3, "Add"),
    ]
    choose = profile.steps[2]
    assert choose.fused == "then" and choose.kernel == "control flow" and choose.output_shapes == [(2, 3)]
    tanh = profile.steps[3]
    assert tanh.input_shapes == [(2, 3)] and tanh.output_shapes == [(2, 3)] and tanh.ms > 0
    assert "2.then/2.then/0" in profile.table(sort=False)
    assert profile.as_dict()["steps"][6]["branch"] == "2.then/2.then/"
    assert sum(s.share for s in profile.steps) <= 1.05
    # the other branches: the If's own rows follow the branch each call took
    other = model.profile(-x, np.array(False), repeats=1)
    assert [(s.branch, s.op_type) for s in other.steps][2:] == [("", "If"), ("2.else/", "Sigmoid")]
    forwarded = model.profile(x, np.array(False), repeats=1)
    assert [s.op_type for s in forwarded.steps if s.branch == "2.then/2.else/"] == []  # Identity only: nothing runs
    t = np.exp(np.tanh(x))
    np.testing.assert_allclose(model(x, np.array(True)), t / t.sum(-1, keepdims=True) - x, rtol=1e-5, atol=1e-6)


def test_profile_runs_the_steps_a_call_runs(tmp_path, rng, monkeypatch):
    """The profile times the steps bound on their constant inputs (their records' ``bind``), as a plain
    call runs them, not the operators' general forms."""
    from fastlayers.onnx import ops

    ran = []
    general = ops.BINDERS["Slice"]

    def counting(inputs, attrs, opset):
        fn = general(inputs, attrs, opset)
        return None if fn is None else (lambda i, a, o: ran.append(1) or fn(i, a, o))

    monkeypatch.setitem(ops.BINDERS, "Slice", counting)
    onnx = oracle("onnx")
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    i64 = onnx.TensorProto.INT64
    model = make_graph(
        [h.make_node("Slice", ["x", "starts", "ends"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
        [h.make_tensor_value_info("x", f, [4, 6])],
        [h.make_tensor_value_info("y", f, None)],
        [h.make_tensor("starts", i64, [1], [1]), h.make_tensor("ends", i64, [1], [3])],
    )
    path = tmp_path / "slice.onnx"
    onnx.save(model, str(path))
    loaded = fastlayers.load(path, options=PYTHON_PLAN)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    ran.clear()
    profile = loaded.profile(x, repeats=3)
    assert len(ran) == 4  # the untimed call and three timed ones
    assert profile.steps[0].op_type == "Slice" and profile.steps[0].output_shapes == [(2, 6)]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_profile_names_the_kernels_of_steps_bound_before_it(tmp_path, rng, threads):
    """Steps bound at earlier calls (a recurrent step's loop, called on the native core
    directly) are named by the kernels they bind, not as numpy fallbacks, at any thread count."""
    onnx = oracle("onnx")
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    hidden, inputs = 8, 3
    w = (rng.standard_normal((1, 4 * hidden, inputs)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32)
    model = make_graph(
        [h.make_node("LSTM", ["x", "w", "r"], ["y", "h"], hidden_size=hidden), h.make_node("Tanh", ["h"], ["t"])],
        [h.make_tensor_value_info("x", f, [5, 1, inputs])],
        [h.make_tensor_value_info("t", f, None)],
        [h.make_tensor("w", f, w.shape, w.ravel()), h.make_tensor("r", f, r.shape, r.ravel())],
    )
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    loaded = fastlayers.load(path, options=PYTHON_PLAN)
    x = rng.standard_normal((5, 1, inputs)).astype(np.float32)
    want = loaded(x)  # binds the steps
    profile = loaded.profile(x, repeats=2)
    lstm, tanh = profile.steps
    assert lstm.op_type == "LSTM" and lstm.kernel == "cpu.sequence_plan"
    assert tanh.kernel != "cpu.sequence_plan"
    np.testing.assert_array_equal(loaded(x), want)


@pytest.mark.parametrize("backend_name", ["cpu", "reference"])
def test_profile_names_the_integer_kernels_a_step_runs(tmp_path, rng, backend_name):
    """A quantized step's native integer kernels (``Ops.integer``) name it on the cpu backend
    (``cpu.integer.<kernel>``), not a numpy fallback; the reference backend, which has none,
    names no integer kernel."""
    onnx = oracle("onnx")
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    b = rng.integers(-64, 64, (12, 6)).astype(np.int8)
    graph = h.make_graph(
        [h.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz"], ["y"], domain="com.microsoft")],
        "g",
        [h.make_tensor_value_info("a", f, [3, 12])],
        [h.make_tensor_value_info("y", f, None)],
        [
            h.make_tensor("b", onnx.TensorProto.INT8, b.shape, b.ravel()),
            h.make_tensor("bs", f, [6], np.full(6, 0.01, np.float32)),
            h.make_tensor("bz", onnx.TensorProto.INT8, [6], np.zeros(6, np.int8)),
        ],
    )
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=10
    )
    path = tmp_path / "dqmm.onnx"
    onnx.save(model, str(path))
    with fastlayers.use_ops(backend_name):
        loaded = fastlayers.load(path, options=PYTHON_PLAN)
        x = rng.standard_normal((3, 12)).astype(np.float32)
        loaded(x)
        (step,) = loaded.profile(x, repeats=2).steps
    if backend_name == "cpu":
        assert step.kernel.startswith("cpu.integer."), step.kernel
    else:
        assert "integer" not in step.kernel, step.kernel


def test_a_native_if_is_one_profile_row(tmp_path, rng):
    model = fastlayers.load(_branching(tmp_path))
    x = np.abs(rng.standard_normal((2, 3))).astype(np.float32)
    for _ in range(3):  # the plan is built at the second call with a key
        model(x, np.array(True))
    profile = model.profile(x, np.array(True), repeats=3)
    assert profile.model.endswith("(native plan)")
    (choose,) = [s for s in profile.steps if s.op_type == "If"]
    assert choose.kernel == "native" and choose.ms > 0
    assert choose.fused.startswith("then: Tanh+Softmax+If+Add | else: ")


def test_profile_counts_the_move_of_an_output_left_channels_last(tmp_path, rng):
    """A convolution's NCHW output is held as NHWC memory by its step and moved to a C-ordered
    array when the call hands it back: that move is part of the call's time, as
    ``outputs_ms``, shown in the table's first line and in ``as_dict``."""
    onnx = oracle("onnx")
    h = onnx.helper
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    model = make_graph(
        [h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")],
        [h.make_tensor_value_info("x", 1, [1, 16, 48, 48])],
        [h.make_tensor_value_info("y", 1, None)],
        [h.make_tensor("w", 1, w.shape, w.ravel())],
    )
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    model = fastlayers.load(path, options=PYTHON_PLAN)
    x = rng.standard_normal((1, 16, 48, 48)).astype(np.float32)
    profile = model.profile(x, repeats=5)
    (conv,) = profile.steps
    assert conv.layout == "nhwc" and conv.output_shapes == [(1, 32, 48, 48)]
    assert 0 < profile.outputs_ms < profile.total_ms
    assert conv.ms + profile.outputs_ms <= profile.total_ms * 1.05
    assert f"outputs {profile.outputs_ms:.3f} ms" in profile.table().splitlines()[0]
    assert profile.as_dict()["outputs_ms"] == profile.outputs_ms
    assert model(x).flags.c_contiguous


def test_profile_of_outputs_already_in_order_shows_no_move(tmp_path, rng):
    model = fastlayers.load(_graph(tmp_path, rng), options=PYTHON_PLAN)
    profile = model.profile(rng.standard_normal((1, 3, 8, 8)).astype(np.float32), repeats=3)
    assert 0 <= profile.outputs_ms < 0.1  # ms: a list of the arrays as they are
