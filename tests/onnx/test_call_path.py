"""The per-call path of an ONNX graph: the input check's fast path and the numpy error state."""

import warnings

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import ShapeError

from ..conftest import assert_close, oracle
from .test_import import make_graph


def _dense_graph(tmp_path, rng, dims, activation="Relu"):
    """x (dims) -> MatMul -> Add -> activation -> Reshape to (-1, 2, 4): fused to FusedDense + Reshape."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node(activation, ["h"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["y"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape"),
        ],
    )
    onnx.save(model, tmp_path / "dense.onnx")
    return tmp_path / "dense.onnx"


def _ort(path, x):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh"])
def test_quiet_graph_propagates_nan_and_inf_under_any_error_state(tmp_path, rng, backend, activation):
    path = _dense_graph(tmp_path, rng, ["n", 6], activation)
    model = fastlayers.load(path)
    assert model.op_types == ["FusedDense", "Reshape"]
    assert model._quiet  # no numpy error state is entered around its nodes on the cpu backend
    x = rng.standard_normal((5, 6)).astype(np.float32)
    x[0, 0], x[1, 2], x[2] = np.nan, np.inf, 3e38  # NaN, inf and an overflowing row
    want = _ort(path, x)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        got = model(x)
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert np.isnan(got[0]).any() and np.array_equal(np.isnan(got), np.isnan(want))


def test_graph_with_numpy_arithmetic_still_ignores_float_errors(tmp_path, rng):
    """Div by zero and overflow run in numpy: inf and NaN come out, no error, no warning."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Div", ["x", "z"], ["y"])]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("x", "z")]
    onnx.save(
        make_graph(nodes, info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]), tmp_path / "div.onnx"
    )
    model = fastlayers.load(tmp_path / "div.onnx")
    assert not model._quiet
    x, z = np.array([1, 0, -1], np.float32), np.zeros(3, np.float32)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        y = model(x, z)
    np.testing.assert_array_equal(y, [np.inf, np.nan, -np.inf])


@pytest.mark.parametrize(
    "dims, good, bad",
    [
        (["n", 6], (3, 6), [(3, 5), (6,), (1, 3, 6)]),  # free leading dimension
        ([2, 6], (2, 6), [(3, 6), (2, 6, 1)]),  # every dimension fixed
        ([2, "n", 3], (2, 4, 3), [(3, 4, 3), (2, 4, 2), (2, 3)]),  # a free dimension in the middle
        (None, (1, 2, 6), []),  # no declared shape
    ],
)
def test_input_check_fast_path_accepts_and_refuses_as_the_full_check(tmp_path, rng, dims, good, bad):
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    onnx.save(
        make_graph(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        tmp_path / "r.onnx",
    )
    model = fastlayers.load(tmp_path / "r.onnx")
    x = rng.standard_normal(good).astype(np.float32)
    for given in (x, x.astype(np.float64), x.tolist(), x[..., ::-1].copy()[..., ::-1]):
        assert_close(model(given), np.maximum(x, 0))
        assert_close(model.run(None, {"x": given})[0], np.maximum(x, 0))
    for shape in bad:
        with pytest.raises(ShapeError, match=r"input 'x': expected shape"):
            model(np.zeros(shape, np.float32))
        with pytest.raises(ShapeError, match=r"input 'x': expected shape"):
            model.run(None, {"x": np.zeros(shape, np.float32)})
    with pytest.raises(ShapeError, match=r"expects inputs \['x'\], got 2"):
        model(x, x)


def test_warm_calls_pack_no_weights(tmp_path, rng, monkeypatch):
    """Weights are packed once (backends/derived.py): after the first calls, a graph of every
    packing convolution route (Winograd F(4x4), strided im2col, transposed, depthwise) and a
    Gemm calls no packing function of the native core, and gives the same result."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.native import _core

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),  # F(4x4)
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node(
            "ConvTranspose", ["c2", "w3"], ["c3"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]
        ),
        helper.make_node("Conv", ["c3", "w4"], ["c4"], pads=[1, 1, 1, 1], group=8),  # depthwise
        helper.make_node("Flatten", ["c4"], ["f"]),
        helper.make_node("Gemm", ["f", "w5", "b5"], ["y"]),
    ]
    inits = [
        weight("w1", 16, 16, 3, 3),
        weight("w2", 16, 16, 3, 3),
        weight("b2", 16),
        weight("w3", 16, 8, 3, 3),
        weight("w4", 8, 1, 3, 3),
        weight("w5", 8 * 28 * 28, 10),
        weight("b5", 10),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    onnx.save(model, tmp_path / "convs.onnx")
    ours = fastlayers.load(tmp_path / "convs.onnx")
    x = rng.standard_normal((1, 16, 28, 28)).astype(np.float32)
    first = ours(x)
    ours(x)
    packs = []
    for name in [n for n in dir(_core) if "pack" in n and callable(getattr(_core, n))]:
        real = getattr(_core, name)
        monkeypatch.setattr(_core, name, lambda *a, _real=real, _name=name, **k: packs.append(_name) or _real(*a, **k))
    for _ in range(3):
        np.testing.assert_array_equal(ours(x), first)
    assert packs == []
    fresh = fastlayers.load(tmp_path / "convs.onnx")  # its own weights: packed at first
    np.testing.assert_array_equal(fresh(x), first)
    assert {"winograd_pack", "conv_pack", "pack"} <= set(packs)
    assert_close(first, _ort(tmp_path / "convs.onnx", x), rtol=1e-4, atol=1e-4)


def test_convolution_plans_follow_each_input_shape_layout_and_backend(tmp_path, rng):
    """A FusedConv keeps one plan per input shape, memory layout and backend: a 1-D chain
    (one channel, one position, an NHWC view from the previous convolution) called on changing
    lengths, then on the reference backend, matches onnxruntime every time."""
    ort = oracle("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w1 = rng.standard_normal((4, 1, 3)).astype(np.float32)
    w2 = rng.standard_normal((3, 4, 1)).astype(np.float32)
    b2 = rng.standard_normal(3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")],
    )
    onnx.save(model, tmp_path / "conv1d.onnx")
    ours = fastlayers.load(tmp_path / "conv1d.onnx")
    assert ours.op_types == ["FusedConv", "FusedConv"]
    session = ort.InferenceSession(str(tmp_path / "conv1d.onnx"), providers=["CPUExecutionProvider"])
    for backend in ("cpu", "cpu", "reference"):
        for shape in ((2, 1, 7), (1, 1, 1), (2, 1, 7), (3, 1, 2)):
            x = rng.standard_normal(shape).astype(np.float32)
            with fastlayers.use_ops(backend):
                got = ours(x)
            assert_close(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_broadcast_shape_follows_numpy():
    import itertools

    from fastlayers.onnx.ops.shape import broadcast_shape

    shapes = [(), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (1, 0), (5,)]
    for a, b in itertools.product(shapes, repeat=2):
        try:
            want = np.broadcast_shapes(a, b)
        except ValueError:
            with pytest.raises(ShapeError, match="do not broadcast"):
                broadcast_shape(a, b, "Expand")
            continue
        assert broadcast_shape(a, b, "Expand") == want


@pytest.mark.parametrize("target", [[2, 3], [1, 3], [3], [1, 1, 1], [4, 2, 3], [2, 1]])
def test_expand_to_the_shape_it_has_passes_its_input_on(tmp_path, rng, target):
    """Expand to a shape its input already has repeats nothing and copies nothing (voicefilter's
    Expand of the speaker vector to its own shape); the results, and the outputs run() returns,
    are still onnxruntime's and never the caller's array."""
    onnx = oracle("onnx")
    ort = oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Expand", ["x", "shape"], ["e"]),
        helper.make_node("Relu", ["e"], ["y"]),
        helper.make_node("Expand", ["x", "shape"], ["z"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        [numpy_helper.from_array(np.array(target, np.int64), "shape")],
    )
    path = tmp_path / "expand.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = fastlayers.load(path).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, rtol=0, atol=0)
    assert not np.shares_memory(got[1], x)
