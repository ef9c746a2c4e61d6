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
    model = fastlayers.load(_graph(tmp_path, rng))
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
