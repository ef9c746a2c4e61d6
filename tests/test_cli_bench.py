"""``fastlayers bench`` and ``fastlayers.benchmark``: the table, the JSON figures, the thread and
batch loops, the comparison with onnxruntime (agreement checked first, refusal on a mismatch)
and the errors, each one line with exit status 2. Tiny ONNX models made with onnx.helper,
timed for a few hundredths of a second."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from fastlayers import benchmark, native
from fastlayers.backends import get_num_threads
from fastlayers.cli import DATA
from fastlayers.errors import MismatchError

from .conftest import oracle
from .test_cli_errors import cli, one_line_error  # noqa: F401 - the fixture and check shared
from .tiny_onnx import dense_model

SECONDS = "0.02"


def rows(out, engine="fastlayers"):
    """The table's rows of ``engine``, split into columns."""
    return [
        parts
        for parts in map(str.split, out.splitlines())
        if len(parts) > 3 and parts[0].isdigit() and parts[2] == engine
    ]


@pytest.fixture
def tiny(tmp_path):
    """A dense layer whose batch is free: x (N, 16) -> y (N, 8)."""
    return dense_model(tmp_path / "tiny.onnx", ["N", 16])


def test_table_is_printed(cli, tiny):
    status, out, err = cli("bench", tiny, "--seconds", SECONDS, "--threads", "1")
    assert status == 0, err
    assert "tiny.onnx (OnnxModel; inputs: x float32 [N, 16])" in out
    assert f"fastlayers {native.isa()} path" in out
    header = next(line for line in out.splitlines() if "p50 ms" in line)
    for column in ("threads", "batch", "engine", "calls", "mean ms", "p90 ms", "p99 ms", "items/s"):
        assert column in header
    found = rows(out)
    assert len(found) == 1 and found[0][:3] == ["1", "1", "fastlayers"] and int(found[0][3]) >= 3
    assert "onnxruntime" not in out


def test_thread_and_batch_loops_and_json(cli, tiny, tmp_path):
    native.set_num_threads(2)
    before = get_num_threads()
    status, out, err = cli(
        "bench",
        tiny,
        "--threads",
        "1",
        "2",
        "--batch-size",
        "1",
        "4",
        "--seconds",
        SECONDS,
        "--json",
        str(tmp_path / "b.json"),
    )
    assert status == 0, err
    assert native.get_num_threads() == 2 and get_num_threads() == before  # restored
    data = json.loads((tmp_path / "b.json").read_text())
    assert set(data) == {"schema", "model", "settings", "results", "notes", "host", "versions"}
    assert data["schema"] == benchmark.SCHEMA
    assert data["model"]["inputs"] == [{"name": "x", "shape": ["N", 16], "dtype": "float32"}]
    assert data["settings"]["threads"] == [1, 2] and data["settings"]["batch_sizes"] == [1, 4]
    assert data["settings"]["input_shapes"] == {"1": {"x": [1, 16]}, "4": {"x": [4, 16]}}
    assert data["settings"]["against"] is None and data["settings"]["seconds"] == 0.02
    assert [(r["threads"], r["batch"]) for r in data["results"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    for r in data["results"]:
        assert r["engine"] == "fastlayers" and r["calls"] >= benchmark.MIN_CALLS
        assert 0 < r["min_ms"] <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["items_per_s"] == pytest.approx(r["batch"] / r["mean_ms"] * 1e3)
    host = data["host"]
    assert host["isa"] == native.isa() and host["cpu_count"] >= 1 and host["machine"]
    assert "cpu" in host
    assert data["versions"]["fastlayers"] == __import__("fastlayers").__version__
    assert "b.json" in err
    assert len(rows(out)) == 4


def test_against_onnxruntime_agrees_and_interleaves(cli, tiny, tmp_path):
    ort = oracle("onnxruntime")
    status, out, err = cli(
        "bench",
        tiny,
        "--against",
        "onnxruntime",
        "--threads",
        "1",
        "--batch-size",
        "2",
        "--seconds",
        SECONDS,
        "--json",
        str(tmp_path / "b.json"),
    )
    assert status == 0, err
    assert "vs onnxruntime" in out and "outputs checked against onnxruntime's" in out
    data = json.loads((tmp_path / "b.json").read_text())
    ours, theirs = data["results"]
    assert (ours["engine"], theirs["engine"]) == ("fastlayers", "onnxruntime")
    assert ours["calls"] == theirs["calls"]  # call by call, in turn
    assert ours["ratio"] == pytest.approx(ours["p50_ms"] / theirs["p50_ms"])
    assert ours["max_abs_diff"] < 1e-4 and theirs["ratio"] is None
    assert data["versions"]["onnxruntime"] == ort.__version__
    assert data["settings"]["against"] == "onnxruntime" and data["settings"]["rtol"] == 1e-4


def test_against_onnxruntime_refuses_to_time_different_outputs(cli, tiny, monkeypatch):
    oracle("onnxruntime")
    plain = benchmark.runner

    def off_by_a_bit(model, arrays):
        run = plain(model, arrays)
        return lambda: [y + 0.01 for y in run()]

    monkeypatch.setattr(benchmark.run, "runner", off_by_a_bit)  # where run_benchmark finds it
    status, out, err = cli("bench", tiny, "--against", "onnxruntime", "--seconds", SECONDS)
    line = one_line_error((status, out, err), "output 'y'", "max |difference| 0.01", "not timed", "batch 1")
    assert out == "", out
    assert "rtol 0.0001" in line
    # a looser tolerance accepts it
    status, out, _ = cli("bench", tiny, "--against", "onnxruntime", "--seconds", SECONDS, "--rtol", "0.1")
    assert status == 0 and "vs onnxruntime" in out


def test_against_needs_onnxruntime_and_an_onnx_model(cli, tiny, monkeypatch):
    one_line_error(
        cli("bench", str(DATA / "digits_mlp.flm"), "--against", "onnxruntime", "--seconds", SECONDS),
        "needs an ONNX model",
        "loads as",
    )
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    one_line_error(
        cli("bench", tiny, "--against", "onnxruntime", "--seconds", SECONDS),
        "needs the onnxruntime package",
        "pip install onnxruntime",
    )
    one_line_error(cli("bench", tiny, "--against", "tensorflow"), "--against", "onnxruntime")


def test_keras_style_model(cli):
    status, out, err = cli(
        "bench", str(DATA / "digits_mlp.flm"), "--seconds", SECONDS, "--batch-size", "1", "3", "--threads", "1"
    )
    assert status == 0, err
    assert "(Sequential" in out or "(Model" in out
    assert "batch 3: input shapes" in out


def test_fixed_batch_is_said(cli, tmp_path):
    path = dense_model(tmp_path / "fixed.onnx", [1, 16])
    status, out, err = cli("bench", path, "--batch-size", "1", "8", "--seconds", SECONDS, "--threads", "1")
    assert status == 0, err
    assert "note: input 'x' fixes its leading dimension at 1: timed at that batch only" in out
    assert len(rows(out)) == 1


def test_free_inner_dimension_needs_a_shape(cli, tmp_path):
    path = dense_model(tmp_path / "seq.onnx", ["N", "T", 16])
    one_line_error(cli("bench", path, "--seconds", SECONDS), "input 'x'", "dimension 1 ('T')", "--shape x=1,<T>,16")
    status, out, err = cli("bench", path, "--shape", "x=2,5,16", "--seconds", SECONDS, "--threads", "1")
    assert status == 0 and "batch 2: input shapes x (2, 5, 16)" in out, err
    status, out, err = cli(
        "bench", path, "--shape", "x=2,5,16", "--batch-size", "3", "--seconds", SECONDS, "--threads", "1"
    )
    assert status == 0 and "batch 3: input shapes x (3, 5, 16)" in out, err
    one_line_error(cli("bench", path, "--shape", "x=2,5"), "the shape given, (2, 5)", "the model declares 3")
    one_line_error(cli("bench", path, "--shape", "x=2,5,15"), "dimension 2 is fixed at 16")
    one_line_error(cli("bench", path, "--shape", "y=2,5,16"), "no input named 'y'", "['x']")
    one_line_error(cli("bench", path, "--shape", "x=1,2,16", "--shape", "x=1,3,16"), "given twice")


def test_input_files(cli, tiny, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(1).standard_normal((5, 16)))  # float64: cast
    x = str(tmp_path / "x.npy")
    status, out, err = cli("bench", tiny, "--input", x, "--seconds", SECONDS, "--threads", "1")
    assert status == 0 and "batch 5: input shapes x (5, 16)" in out, err
    status, out, err = cli("bench", tiny, "--input", x, "--batch-size", "2", "--seconds", SECONDS, "--threads", "1")
    assert status == 0 and "batch 2: input shapes x (2, 16)" in out, err
    one_line_error(cli("bench", tiny, "--input", x, "--batch-size", "8"), "hold 5 samples", "[8]")
    one_line_error(cli("bench", tiny, "--input", x, "--shape", "x=1,16"), "--shape and --input")
    one_line_error(cli("bench", tiny, "--input", x, "--input", x), "takes 1 input(s)", "2 given")
    one_line_error(cli("bench", tiny, "--input", str(tmp_path / "none.npy")), "none.npy")


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["--seconds", "0"], ["--seconds", "positive number"]),
        (["--seconds", "-1"], ["--seconds"]),
        (["--seconds", "soon"], ["--seconds", "'soon'"]),
        (["--seconds", "inf"], ["--seconds"]),
        (["--threads", "0"], ["--threads"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--batch-size", "1.5"], ["--batch-size"]),
        (["--shape", "x"], ["--shape", "NAME=D1,D2"]),
        (["--shape", "x=1,a"], ["--shape", "positive integers"]),
        (["--shape", "x=1,0"], ["--shape", "positive integers"]),
        (["--rtol", "0"], ["--rtol"]),
    ],
)
def test_bad_arguments(cli, tiny, argv, fragments):
    one_line_error(cli("bench", tiny, *argv), *fragments)


def test_bad_model_and_json_paths(cli, tiny, tmp_path):
    one_line_error(cli("bench", str(tmp_path / "missing.onnx")), "missing.onnx")
    one_line_error(cli("bench"), "model")
    one_line_error(cli("bench", tiny, "--json", str(tmp_path / "no" / "b.json")), "does not exist")
    one_line_error(cli("bench", tiny, "--json", str(tmp_path)), "is a directory")


def test_help(cli):
    status, out, _ = cli("bench", "--help")
    assert status == 0 and "usage: fastlayers bench" in out and "--against" in out
    assert "``" not in out and "**" not in out


# ---------------------------------------------------------------------- the module itself
def test_compare_outputs():
    want = [np.array([1.0, 2.0, np.nan, np.inf], np.float32), np.array([3, 4])]
    assert benchmark.compare_outputs(want, [w.copy() for w in want], ["a", "b"]) == 0.0
    near = [np.array([1.00001, 2.0, np.nan, np.inf], np.float32), np.array([3, 4])]
    assert benchmark.compare_outputs(want, near, ["a", "b"]) < 1e-4
    with pytest.raises(MismatchError, match=r"output 'b'.*1 of 2 values"):
        benchmark.compare_outputs(want, [want[0], np.array([3, 5])], ["a", "b"])
    with pytest.raises(MismatchError, match=r"output 'a'.*-inf against inf"):
        benchmark.compare_outputs(want, [np.array([1, 2, np.nan, -np.inf], np.float32), want[1]], ["a", "b"])
    with pytest.raises(MismatchError, match=r"shape \(3,\)"):
        benchmark.compare_outputs(want, [want[0][:3], want[1]], ["a", "b"])
    with pytest.raises(MismatchError, match="1 outputs and onnxruntime 2"):
        benchmark.compare_outputs(want, want[:1])


def test_time_calls_interleaves_and_keeps_a_minimum():
    order = []
    times = benchmark.time_calls(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, seconds=1e-4, warmup_s=0
    )
    assert len(times["a"]) == len(times["b"]) >= benchmark.MIN_CALLS
    assert order[:6] == ["a", "b"] * 3
    row = benchmark.Latency.from_times("a", 1, 4, [0.001, 0.002, 0.003])
    assert (row.p50_ms, row.min_ms, row.calls) == (2.0, 1.0, 3)
    assert row.items_per_s == pytest.approx(2000.0)


def test_make_inputs_types_and_seed():
    specs = [
        benchmark.InputSpec("ids", ("N", 7), np.dtype(np.int64)),
        benchmark.InputSpec("mask", (None, 7), np.dtype(bool)),
        benchmark.InputSpec("scale", (), np.dtype(np.float32)),
    ]
    a = benchmark.make_inputs(specs, batch=3)
    assert [x.shape for x in a] == [(3, 7), (3, 7), ()]
    assert [x.dtype for x in a] == [np.int64, np.bool_, np.float32]
    assert a[0].min() >= 0 and a[0].max() < benchmark.INT_HIGH
    assert all(np.array_equal(x, y) for x, y in zip(a, benchmark.make_inputs(specs, batch=3)))
    assert benchmark.batchable(specs)
    assert not benchmark.batchable([benchmark.InputSpec("x", (1, 7), np.dtype(np.float32))])
