"""OnnxModel's onnxruntime InferenceSession surface (run, get_inputs, get_outputs), checked
against onnxruntime's own answers on the same files."""

import dataclasses

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError, ShapeError, UnsupportedError
from fastlayers.onnx.model import ORT_TYPES, NodeArg

from ..conftest import assert_close, oracle
from .test_import import export, make_graph


def session(path):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def described(args):
    return [(a.name, a.shape, a.type) for a in args]


def assert_same_run(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            assert_close(g, w, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.fixture
def multi(tmp_path):
    """Four inputs (float32 with a dim_param, int64 with a dimension that has neither value nor
    name, fixed float16, double of unknown length), an initializer also listed as a graph input,
    four outputs; the file's path."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    vi = helper.make_tensor_value_info
    w = numpy_helper.from_array((np.arange(12, dtype=np.float32).reshape(3, 4) - 5) / 7, "w")
    b = numpy_helper.from_array(np.linspace(-1, 1, 4).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
        helper.make_node("Add", ["ids", "ids"], ["n"]),
        helper.make_node("Mul", ["h", "h"], ["hh"]),
        helper.make_node("Neg", ["d"], ["dd"]),
    ]
    model = make_graph(
        nodes,
        [
            vi("x", T.FLOAT, ["batch", 3]),
            vi("w", T.FLOAT, [3, 4]),
            vi("ids", T.INT64, ["batch", None]),
            vi("h", T.FLOAT16, [2, 3]),
            vi("d", T.DOUBLE, [None]),
        ],
        [
            vi("y", T.FLOAT, ["batch", 4]),
            vi("n", T.INT64, ["batch", None]),
            vi("hh", T.FLOAT16, [2, 3]),
            vi("dd", T.DOUBLE, [None]),
        ],
        [w, b],
    )
    onnx.save(model, tmp_path / "multi.onnx")
    return tmp_path / "multi.onnx"


def multi_feed(rng, batch=5):
    return {
        "x": rng.standard_normal((batch, 3)).astype(np.float32),
        "ids": rng.integers(0, 9, (batch, 2)),
        "h": rng.standard_normal((2, 3)).astype(np.float16),
        "d": rng.standard_normal(7),
    }


def test_inputs_and_outputs_match_onnxruntime(multi):
    ours, theirs = fastlayers.load(multi), session(multi)
    assert described(ours.get_inputs()) == described(theirs.get_inputs())
    assert described(ours.get_outputs()) == described(theirs.get_outputs())
    # the initializer listed as a graph input is not an input to feed, as in onnxruntime
    assert [a.name for a in ours.get_inputs()] == ours.input_names == ["x", "ids", "h", "d"]
    assert ours.get_inputs()[1] == NodeArg("ids", ["batch", None], "tensor(int64)")


def test_run_matches_onnxruntime(multi, rng):
    ours, theirs = fastlayers.load(multi), session(multi)
    for batch in (5, 1):
        feed = multi_feed(rng, batch)
        assert_same_run(ours.run(None, feed), theirs.run(None, feed))
        assert_same_run(ours.run([], feed), theirs.run([], feed))
        for name in ours.output_names:
            assert_same_run(ours.run([name], feed), theirs.run([name], feed))
        assert_same_run(ours.run(["dd", "y", "dd"], feed), theirs.run(["dd", "y", "dd"], feed))
        assert_same_run(ours.run(None, feed, None), theirs.run(None, feed))


def test_run_computes_once(multi, rng, monkeypatch):
    ours = fastlayers.load(multi)
    calls = []
    evaluate = ours._evaluate
    monkeypatch.setattr(ours, "_evaluate", lambda arrays: calls.append(1) or evaluate(arrays))
    ours.run(["y", "n", "hh"], multi_feed(rng))
    assert len(calls) == 1


def test_shape_edge_cases_match_onnxruntime(tmp_path):
    """A dim_param, a fixed dim, a dimension with neither, an empty dim_param, a scalar, and an
    input declared without a shape."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    x = helper.make_tensor_value_info("x", T.FLOAT, ["N", 2, None])
    x.type.tensor_type.shape.dim.add().dim_param = ""
    s = helper.make_tensor_value_info("s", T.INT32, [])
    u = helper.make_tensor_value_info("u", T.UINT8, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Identity", ["s"], ["t"]),
        helper.make_node("Identity", ["u"], ["v"]),
    ]
    outs = [
        helper.make_tensor_value_info("y", T.FLOAT, ["N", 2, None, None]),
        helper.make_tensor_value_info("t", T.INT32, []),
    ]
    onnx.save(
        make_graph(nodes, [x, s, u], outs + [helper.make_tensor_value_info("v", T.UINT8, None)]), tmp_path / "dims.onnx"
    )
    ours, theirs = fastlayers.load(tmp_path / "dims.onnx"), session(tmp_path / "dims.onnx")
    assert (
        described(ours.get_inputs())
        == described(theirs.get_inputs())
        == [("x", ["N", 2, None, None], "tensor(float)"), ("s", [], "tensor(int32)"), ("u", [], "tensor(uint8)")]
    )
    assert described(ours.get_outputs()[:2]) == described(theirs.get_outputs()[:2])
    # an output declared without a shape: the file's [] (onnxruntime fills in its inferred shape)
    assert ours.get_outputs()[2] == NodeArg("v", [], "tensor(uint8)")
    feed = {
        "x": np.linspace(-1, 1, 30, dtype=np.float32).reshape(3, 2, 5, 1),
        "s": np.array(7, np.int32),
        "u": np.arange(6, dtype=np.uint8).reshape(2, 3),
    }
    assert_same_run(ours.run(None, feed), theirs.run(None, feed))


@pytest.mark.parametrize("elem_type", sorted(fastlayers.onnx.tensors.DTYPES))
def test_every_input_type_matches_onnxruntime(tmp_path, elem_type):
    oracle("onnx")
    import onnx
    from onnx import helper

    vi = helper.make_tensor_value_info
    onnx.save(
        make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], [vi("x", elem_type, ["n"])], [vi("y", elem_type, ["n"])]
        ),
        tmp_path / "id.onnx",
    )
    ours, theirs = fastlayers.load(tmp_path / "id.onnx"), session(tmp_path / "id.onnx")
    assert described(ours.get_inputs()) == described(theirs.get_inputs())
    assert described(ours.get_outputs()) == described(theirs.get_outputs())
    feed = {"x": np.arange(4).astype(fastlayers.onnx.tensors.DTYPES[elem_type])}
    got = ours.run(None, feed)
    assert_same_run(got, theirs.run(None, feed))
    assert got[0] is not feed["x"]  # a fresh array, as onnxruntime returns


def test_run_returns_fresh_arrays(tmp_path):
    """Outputs that are an initializer, a view of an input or an input passed through are
    copies, as onnxruntime returns: writing to them changes neither the model nor the feed."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    vi = helper.make_tensor_value_info
    c = np.arange(6, dtype=np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Identity", ["x"], ["k"]),
        helper.make_node("Identity", ["c"], ["c2"]),
    ]
    onnx.save(
        make_graph(
            nodes,
            [vi("x", T.FLOAT, [2, 3])],
            [vi("c", T.FLOAT, [6]), vi("c2", T.FLOAT, [6]), vi("r", T.FLOAT, [3, 2]), vi("k", T.FLOAT, [2, 3])],
            [numpy_helper.from_array(c, "c"), numpy_helper.from_array(np.array([3, 2]), "shape")],
        ),
        tmp_path / "alias.onnx",
    )
    ours, theirs = fastlayers.load(tmp_path / "alias.onnx"), session(tmp_path / "alias.onnx")
    x = np.ones((2, 3), np.float32)
    got = ours.run(None, {"x": x})
    assert_same_run(got, theirs.run(None, {"x": x}))
    for g in got:
        g += 100
    assert_same_run(ours.run(None, {"x": x}), theirs.run(None, {"x": x}))
    np.testing.assert_array_equal(x, 1)


def test_type_strings_follow_onnxruntime_naming():
    """onnxruntime names tensor types tensor(<TensorProto.DataType name, lower case>) (checked on
    onnxruntime 1.32 for types 1-20; the others it cannot load as a graph input)."""
    oracle("onnx")
    from onnx import TensorProto

    expected = {v: f"tensor({k.lower()})" for k, v in TensorProto.DataType.items() if v}
    assert {k: ORT_TYPES[k] for k in expected} == expected


def test_torch_export_matches_onnxruntime(torch, tmp_path, rng):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.emb = torch.nn.Linear(4, 3), torch.nn.Embedding(10, 3)

        def forward(self, x, ids):
            return torch.relu(self.lin(x)), self.emb(ids).sum(1) * 2

    path = tmp_path / "net.onnx"
    export(
        torch,
        Net(),
        (torch.randn(2, 4), torch.randint(0, 10, (2, 5))),
        path,
        input_names=["x", "ids"],
        output_names=["y", "e"],
        dynamic_axes={"x": {0: "batch"}, "ids": {0: "batch", 1: "seq"}},
        opset_version=17,
    )
    ours, theirs = fastlayers.load(path), session(path)
    assert (
        described(ours.get_inputs())
        == described(theirs.get_inputs())
        == [("x", ["batch", 4], "tensor(float)"), ("ids", ["batch", "seq"], "tensor(int64)")]
    )
    assert described(ours.get_outputs()) == described(theirs.get_outputs())
    for batch, seq in ((3, 5), (1, 2)):
        feed = {"x": rng.standard_normal((batch, 4)).astype(np.float32), "ids": rng.integers(0, 10, (batch, seq))}
        assert_same_run(ours.run(None, feed), theirs.run(None, feed))
        assert_same_run(ours.run(["e"], feed), theirs.run(["e"], feed))


def test_errors(multi, rng):
    ours = fastlayers.load(multi)
    feed = multi_feed(rng)
    with pytest.raises(InputError, match=r"unknown output name\(s\) \['q'\]; its outputs are \['y', 'n', 'hh', 'dd'\]"):
        ours.run(["y", "q"], feed)
    with pytest.raises(InputError, match=r"output_names must be a list of names or None, got the string 'y'"):
        ours.run("y", feed)
    with pytest.raises(ShapeError, match=r"expects inputs \['x', 'ids', 'h', 'd'\], got 2; missing \['ids', 'h'\]"):
        ours.run(None, {"x": feed["x"], "d": feed["d"]})
    with pytest.raises(InputError, match=r"unknown input name\(s\) \['z'\]; its inputs are \['x', 'ids', 'h', 'd'\]$"):
        ours.run(None, dict(feed, z=feed["x"]))
    with pytest.raises(InputError, match=r"unknown input name\(s\) \['w'\].*'w': initializer\(s\)"):
        ours.run(None, dict(feed, w=np.zeros((3, 4), np.float32)))
    with pytest.raises(InputError, match="input_feed must be a dict"):
        ours.run(None, list(feed.values()))
    with pytest.raises(ShapeError, match=r"input 'h': expected shape \(2, 3\), got \(3, 3\)"):
        ours.run(None, dict(feed, h=np.zeros((3, 3), np.float16)))
    ort = oracle("onnxruntime")
    with pytest.raises(UnsupportedError, match=r"run options are not supported \(got RunOptions"):
        ours.run(None, feed, ort.RunOptions())
    # __call__ stays lenient about names it does not use
    assert_same_run(ours(dict(feed, z=1)), ours.run(None, feed))


def test_node_arg_is_frozen_and_readable(multi):
    arg = fastlayers.load(multi).get_inputs()[0]
    assert repr(arg) == "NodeArg(name='x', shape=['batch', 3], type='tensor(float)')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        arg.name = "z"
    assert hash(arg) == hash(NodeArg("x", ["batch", 3], "tensor(float)"))
    arg.shape.append(9)  # a fresh list each call: the model's record is unchanged
    assert fastlayers.load(multi).get_inputs()[0].shape == ["batch", 3]
