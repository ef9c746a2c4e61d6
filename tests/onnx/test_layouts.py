"""Convolution-heavy regions stay in NHWC memory: Concat, per-channel Add and Mul (squeeze and
excite), nearest and linear Resize between convolutions give NCHW views of NHWC memory, and the
values match onnxruntime."""

import numpy as np
import pytest

import fastlayers

from ..conftest import assert_close, oracle
from .test_import import make_graph


def _graph(tmp_path, rng, resize_mode):
    onnx = oracle("onnx")
    h = onnx.helper

    def t(name, shape):
        return h.make_tensor(name, 1, shape, rng.standard_normal(int(np.prod(shape))).astype(np.float32))

    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["x", "w2"], ["b"]),
             h.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             h.make_node("GlobalAveragePool", ["cat"], ["pooled"]),
             h.make_node("Sigmoid", ["pooled"], ["gate"]),
             h.make_node("Mul", ["cat", "gate"], ["excited"]),
             h.make_node("Add", ["excited", "shift"], ["shifted"]),
             h.make_node("Mul", ["scale", "shifted"], ["scaled"]),
             h.make_node("Resize", ["scaled", "", "scales"], ["up"], mode=resize_mode),
             h.make_node("Conv", ["up", "w3"], ["y"], pads=[1, 1, 1, 1])]
    model = make_graph(nodes, [h.make_tensor_value_info("x", 1, [2, 4, 9, 7])],
                       [h.make_tensor_value_info(n, 1, None) for n in ("y", "cat", "scaled", "up")],
                       [t("w1", [5, 4, 3, 3]), t("w2", [3, 4, 1, 1]), t("w3", [6, 8, 3, 3]),
                        t("shift", [1, 8, 1, 1]), t("scale", [8, 1, 1]),
                        h.make_tensor("scales", 1, [4], [1, 1, 2, 1.5])])
    path = tmp_path / "layouts.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("resize_mode", ["nearest", "linear"])
def test_nhwc_memory_flows_through_concat_channel_arithmetic_and_resize(tmp_path, rng, backend, resize_mode):
    ort = oracle("onnxruntime")
    path = _graph(tmp_path, rng, resize_mode)
    model = fastlayers.load(path)
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    values = model._evaluate([x], every_value=True)
    if backend == "cpu":   # each step hands the next one NHWC memory
        for name in ("cat", "excited", "shifted", "scaled", "up"):
            held = values[name].transpose(0, 2, 3, 1)
            assert held.flags.c_contiguous, name
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, expected in zip(model(x), want):
        assert_close(got, expected, rtol=1e-4, atol=1e-4)   # per model; the last output sums 72 products


@pytest.mark.parametrize("axis", [1, 2, 3, -1, -3])
@pytest.mark.parametrize("mixed", [False, True], ids=["both-nhwc", "one-nchw"])
def test_concat_of_nhwc_memory_on_any_axis(tmp_path, rng, backend, axis, mixed):
    """Concat of convolution outputs (NCHW views of NHWC memory) on the channel or a spatial
    axis, and of one such view with a plain NCHW input, against onnxruntime."""
    ort, onnx = oracle("onnxruntime"), oracle("onnx")
    h = onnx.helper
    w = h.make_tensor("w", 1, [5, 3, 1, 1], rng.standard_normal(15).astype(np.float32))
    nodes = [h.make_node("Conv", ["x", "w"], ["a"]), h.make_node("Relu", ["a"], ["r"]),
             h.make_node("Conv", ["x", "w"], ["b"], pads=[0, 0, 0, 0]),
             h.make_node("Concat", ["a", "x5" if mixed else "b"], ["y"], axis=axis)]
    inputs = [h.make_tensor_value_info("x", 1, [2, 3, 6, 7])]
    if mixed:
        inputs.append(h.make_tensor_value_info("x5", 1, [2, 5, 6, 7]))
    model = make_graph(nodes, inputs, [h.make_tensor_value_info("y", 1, None)], [w])
    path = tmp_path / "concat.onnx"
    onnx.save(model, str(path))
    feed = {"x": rng.standard_normal((2, 3, 6, 7)).astype(np.float32)}
    if mixed:
        feed["x5"] = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = fastlayers.load(path).run(None, feed)[0]
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-6)
