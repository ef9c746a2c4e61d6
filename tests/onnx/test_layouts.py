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

    nodes = [
        h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        h.make_node("Conv", ["x", "w2"], ["b"]),
        h.make_node("Concat", ["a", "b"], ["cat"], axis=1),
        h.make_node("GlobalAveragePool", ["cat"], ["pooled"]),
        h.make_node("Sigmoid", ["pooled"], ["gate"]),
        h.make_node("Mul", ["cat", "gate"], ["excited"]),
        h.make_node("Add", ["excited", "shift"], ["shifted"]),
        h.make_node("Mul", ["scale", "shifted"], ["scaled"]),
        h.make_node("Resize", ["scaled", "", "scales"], ["up"], mode=resize_mode),
        h.make_node("Conv", ["up", "w3"], ["y"], pads=[1, 1, 1, 1]),
    ]
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", 1, [2, 4, 9, 7])],
        [h.make_tensor_value_info(n, 1, None) for n in ("y", "cat", "scaled", "up")],
        [
            t("w1", [5, 4, 3, 3]),
            t("w2", [3, 4, 1, 1]),
            t("w3", [6, 8, 3, 3]),
            t("shift", [1, 8, 1, 1]),
            t("scale", [8, 1, 1]),
            h.make_tensor("scales", 1, [4], [1, 1, 2, 1.5]),
        ],
    )
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
    if backend == "cpu":  # each step hands the next one NHWC memory
        # (the gate's Sigmoid, Mul, Add and Mul: one elementwise program giving "scaled")
        assert "excited" not in values and "shifted" not in values
        for name in ("cat", "scaled", "up"):
            held = values[name].transpose(0, 2, 3, 1)
            assert held.flags.c_contiguous, name
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, expected in zip(model(x), want):
        assert_close(got, expected, rtol=1e-4, atol=1e-4)  # per model; the last output sums 72 products


@pytest.mark.parametrize("batch", [1, 3])
def test_gate_per_sample_keeps_nhwc_memory(tmp_path, rng, backend, batch):
    """Squeeze and excite over a batch: a convolution's output times a gate of one value per
    sample and channel (N, C, 1, 1), large enough for the native pass, stays NHWC memory; the
    values are onnxruntime's (a product each: the same bits)."""
    ort = oracle("onnxruntime")
    onnx = oracle("onnx")
    h = onnx.helper
    nodes = [
        h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("GlobalAveragePool", ["c"], ["pooled"]),
        h.make_node("HardSigmoid", ["pooled"], ["gate"]),
        h.make_node("Mul", ["c", "gate"], ["y"]),
    ]
    w = rng.standard_normal((16, 4, 3, 3)).astype(np.float32)
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", 1, [batch, 4, 20, 21])],
        [h.make_tensor_value_info("y", 1, None), h.make_tensor_value_info("c", 1, None)],
        [h.make_tensor("w", 1, list(w.shape), w.reshape(-1))],
    )
    path = tmp_path / "gate.onnx"
    onnx.save(model, str(path))
    ours = fastlayers.load(path)
    x = rng.standard_normal((batch, 4, 20, 21)).astype(np.float32)
    y, c = ours(x)
    if backend == "cpu":  # the product hands on NHWC memory
        assert ours._evaluate([x], every_value=True)["y"].transpose(0, 2, 3, 1).flags.c_contiguous
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert_close(c, want[1], rtol=1e-5, atol=1e-5)
    gate = np.clip(
        c.mean(axis=(2, 3), keepdims=True, dtype=np.float64).astype(np.float32) * np.float32(0.2) + np.float32(0.5),
        0,
        1,
    )
    assert_close(y, c * gate, rtol=1e-6, atol=1e-6)
    assert_close(y, want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [1, 2, 3, -1, -3])
@pytest.mark.parametrize("mixed", [False, True], ids=["both-nhwc", "one-nchw"])
def test_concat_of_nhwc_memory_on_any_axis(tmp_path, rng, backend, axis, mixed):
    """Concat of convolution outputs (NCHW views of NHWC memory) on the channel or a spatial
    axis, and of one such view with a plain NCHW input, against onnxruntime."""
    ort, onnx = oracle("onnxruntime"), oracle("onnx")
    h = onnx.helper
    w = h.make_tensor("w", 1, [5, 3, 1, 1], rng.standard_normal(15).astype(np.float32))
    nodes = [
        h.make_node("Conv", ["x", "w"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]),
        h.make_node("Conv", ["x", "w"], ["b"], pads=[0, 0, 0, 0]),
        h.make_node("Concat", ["a", "x5" if mixed else "b"], ["y"], axis=axis),
    ]
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


@pytest.mark.parametrize(
    "kernel, strides, group, follow",
    [
        ((2, 2), (2, 2), 1, ["Add", "Relu"]),
        ((2, 2), (2, 2), 1, ["Mul", "Add", "Sigmoid"]),
        ((3, 3), (2, 2), 1, ["Add", "LeakyRelu"]),
        ((2, 2), (2, 2), 2, ["Add", "Relu"]),
        ((2, 2), (2, 2), 2, ["Mul", "Relu"]),
    ],
)
@pytest.mark.parametrize("planes", [False, True], ids=["nhwc", "nchw"])
def test_conv_transpose_takes_a_channel_affine_and_an_activation(
    tmp_path, rng, backend, kernel, strides, group, follow, planes
):
    """ConvTranspose + per-channel Mul / Add + activation (PP-OCR's upsampling heads) against
    onnxruntime, after a convolution (NHWC memory) or on the graph's NCHW input; a grouped one
    takes the Add into its bias but keeps its Mul."""
    ort, onnx = oracle("onnxruntime"), oracle("onnx")
    h = onnx.helper
    c_in, c_out = 4, 6

    def t(name, shape):
        return h.make_tensor(name, 1, shape, rng.standard_normal(int(np.prod(shape))).astype(np.float32))

    inits = [
        t("wc", [c_in, 3, 1, 1]),
        t("wt", [c_in, c_out // group, *kernel]),
        t("bias", [1, c_out, 1, 1]),
        t("scale", [c_out, 1, 1]),
    ]
    nodes = [] if planes else [h.make_node("Conv", ["x", "wc"], ["xc"])]
    value = "x" if planes else "xc"
    nodes.append(h.make_node("ConvTranspose", [value, "wt"], ["ct"], strides=list(strides), group=group))
    value = "ct"
    for k, op in enumerate(follow):
        extra = {"LeakyRelu": {"alpha": 0.1}}.get(op, {})
        operands = [value, {"Add": "bias", "Mul": "scale"}[op]] if op in ("Add", "Mul") else [value]
        nodes.append(h.make_node(op, operands, [f"f{k}"], **extra))
        value = f"f{k}"
    nodes[-1].output[0] = "y"
    shape = [2, c_in, 5, 7] if planes else [2, 3, 5, 7]
    model = make_graph(
        nodes, [h.make_tensor_value_info("x", 1, shape)], [h.make_tensor_value_info("y", 1, None)], inits
    )
    path = tmp_path / "ct.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    loaded = fastlayers.load(path)
    got = loaded.run(None, {"x": x})[0]
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    steps = loaded.profile({"x": x}, repeats=1).steps
    transposed = [s for s in steps if s.op_type == "ConvTranspose"]
    act = {"Relu": "relu", "Sigmoid": "onnx_sigmoid", "LeakyRelu": "leaky_relu"}[follow[-1]]
    kept_mul = group != 1 and "Mul" in follow  # then the activation reads the Mul
    assert len(transposed) == 1 and transposed[0].fused == ("" if kept_mul else act)
    kept = {s.op_type for s in steps}
    # a kept Mul and the activation after it run as one elementwise program
    programs = [s.fused for s in steps if s.op_type == "FusedElementwise"]
    assert programs == (["Mul+" + follow[-1]] if kept_mul else []) and not {"Mul", "Add"} & kept


@pytest.mark.parametrize("mixed", [False, True], ids=["both-nhwc", "one-nchw"])
def test_residual_add_of_nhwc_memory_stays_nhwc_and_exact(tmp_path, rng, backend, mixed):
    """A residual Add of two convolution outputs (NCHW views of NHWC memory) large enough for
    the native pass: the sum stays in NHWC memory on the cpu backend, with numpy's bits; one
    operand a graph input in NCHW order takes numpy's broadcasting sum."""
    onnx = oracle("onnx")
    h = onnx.helper
    # 4608 values: above NATIVE_ELEMENTWISE_MIN; rows of 12 columns, too short for the kernel
    # from NCHW planes into NCHW planes (PLANES_MIN_COLUMNS): the convolutions' results NHWC
    shape = [1, 8, 48, 12]

    def t(name, dims):
        return h.make_tensor(name, 1, dims, rng.standard_normal(int(np.prod(dims))).astype(np.float32))

    second = "x" if mixed else "b"
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        h.make_node("Conv", ["x", "w2"], ["b"], pads=[0, 1, 0, 1]),  # (a 1x1 one would stay NCHW)
        h.make_node("Add", ["a", second], ["y"]),
    ]
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", 1, shape)],
        [h.make_tensor_value_info(n, 1, None) for n in ("y", "a", "b")],
        [t("w1", [8, 8, 3, 3]), t("w2", [8, 8, 1, 3])],
    )
    path = tmp_path / "residual.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal(shape).astype(np.float32)
    values = fastlayers.load(path)._evaluate([x], every_value=True)
    y = values["y"]
    np.testing.assert_array_equal(y, values["a"] + (x if mixed else values["b"]))
    if backend == "cpu" and not mixed:
        assert y.transpose(0, 2, 3, 1).flags.c_contiguous


@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
@pytest.mark.parametrize("rank", [3, 4])
def test_global_pools_of_channels_last_memory(tmp_path, rng, backend, op, rank):
    """A convolution's result (an NCL / NCHW view of channels-last memory) pooled over every
    position, as magika's Conv1D -> GlobalMaxPool: onnxruntime's values."""
    onnx = oracle("onnx")
    h = onnx.helper
    spatial = [11] if rank == 3 else [6, 5]
    kernel = [3] if rank == 3 else [3, 3]
    w = rng.standard_normal([7, 4, *kernel]).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node(op, ["c"], ["y"])]
    model = make_graph(
        nodes,
        [h.make_tensor_value_info("x", 1, [2, 4, *spatial])],
        [h.make_tensor_value_info("y", 1, None)],
        [h.make_tensor("w", 1, w.shape, w.reshape(-1))],
    )
    onnx.save(model, tmp_path / "pool.onnx")
    x = rng.standard_normal((2, 4, *spatial)).astype(np.float32)
    want = oracle("onnxruntime").InferenceSession(str(tmp_path / "pool.onnx")).run(None, {"x": x})[0]
    got = fastlayers.load(tmp_path / "pool.onnx")(x)
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-5)
