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
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["h"]),
             helper.make_node(activation, ["h"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["y"])]
    model = make_graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                        numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape")])
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
    assert model._quiet        # no numpy error state is entered around its nodes on the cpu backend
    x = rng.standard_normal((5, 6)).astype(np.float32)
    x[0, 0], x[1, 2], x[2] = np.nan, np.inf, 3e38     # NaN, inf and an overflowing row
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
    onnx.save(make_graph(nodes, info, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]),
              tmp_path / "div.onnx")
    model = fastlayers.load(tmp_path / "div.onnx")
    assert not model._quiet
    x, z = np.array([1, 0, -1], np.float32), np.zeros(3, np.float32)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        y = model(x, z)
    np.testing.assert_array_equal(y, [np.inf, np.nan, -np.inf])


@pytest.mark.parametrize("dims, good, bad", [
    (["n", 6], (3, 6), [(3, 5), (6,), (1, 3, 6)]),           # free leading dimension
    ([2, 6], (2, 6), [(3, 6), (2, 6, 1)]),                    # every dimension fixed
    ([2, "n", 3], (2, 4, 3), [(3, 4, 3), (2, 4, 2), (2, 3)]), # a free dimension in the middle
    (None, (1, 2, 6), []),                                    # no declared shape
])
def test_input_check_fast_path_accepts_and_refuses_as_the_full_check(tmp_path, rng, dims, good, bad):
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    onnx.save(make_graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), tmp_path / "r.onnx")
    model = fastlayers.load(tmp_path / "r.onnx")
    x = rng.standard_normal(good).astype(np.float32)
    for given in (x, x.astype(np.float64), x.tolist(), x[..., ::-1].copy()[..., ::-1]):
        assert_close(model(given), np.maximum(x, 0))
    for shape in bad:
        with pytest.raises(ShapeError, match=r"input 'x': expected shape"):
            model(np.zeros(shape, np.float32))
    with pytest.raises(ShapeError, match=r"expects inputs \['x'\], got 2"):
        model(x, x)
