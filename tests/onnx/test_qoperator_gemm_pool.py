"""onnxruntime's QOperator contrib operators QGemm, QLinearGlobalAveragePool and
QLinearAveragePool against onnxruntime on one thread, bit for bit on each backend: integer
outputs and QGemm's float outputs equal. The u8 x s8 products take 7-bit B values: onnxruntime's
AVX2 u8 x s8 kernel (vpmaddubsw, on CPUs without VNNI) saturates int16 pair sums where
fastlayers sums exactly."""

import warnings

import numpy as np
import pytest

from fastlayers.errors import InputError, ModelFileError, ShapeError, UnsupportedError

from ..conftest import oracle

MS = "com.microsoft"
TYPES = {"u8": np.uint8, "s8": np.int8}


def _elem(dtype):
    from onnx import TensorProto

    return {
        np.dtype(np.uint8): TensorProto.UINT8,
        np.dtype(np.int8): TensorProto.INT8,
        np.dtype(np.float32): TensorProto.FLOAT,
        np.dtype(np.int32): TensorProto.INT32,
        np.dtype(np.float16): TensorProto.FLOAT16,
    }[np.dtype(dtype)]


def _one_node(op, inputs, out_dtype, constants=(), **attrs):
    """(the bytes of a model of one com.microsoft ``op`` node named "n_<op>", its feed): the
    node reads ``inputs`` in order (None: omitted), graph inputs but for the positions in
    ``constants`` (initializers)."""
    from onnx import helper, numpy_helper

    names, infos, inits, feed = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        name, value = f"in{i}", np.asarray(value)
        names.append(name)
        if i in constants:
            inits.append(numpy_helper.from_array(value, name))
        else:
            infos.append(helper.make_tensor_value_info(name, _elem(value.dtype), list(value.shape)))
            feed[name] = value
    node = helper.make_node(op, names, ["y"], name=f"n_{op}", domain=MS, **attrs)
    graph = helper.make_graph([node], "g", infos, [helper.make_tensor_value_info("y", _elem(out_dtype), None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return model.SerializeToString(), feed


def _session(data):
    ort = oracle("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _assert_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def _matches(data, feed):
    """fastlayers' output of model ``data`` on ``feed`` is onnxruntime's, bit for bit; returns it."""
    import fastlayers

    want = _session(data).run(None, feed)[0]
    got = fastlayers.load(data).run(None, feed)[0]
    _assert_equal(got, want)
    return got


def _values(rng, dtype, shape, seven_bit=False):
    lo, hi = (-64, 64) if seven_bit else (np.iinfo(dtype).min, np.iinfo(dtype).max + 1)
    return rng.integers(lo, hi, shape).astype(dtype)


# ------------------------------------------------------------------------------------ QGemm
C_SHAPES = {
    "scalar": lambda m, n: (),
    "1": lambda m, n: (1,),
    "11": lambda m, n: (1, 1),
    "n": lambda m, n: (n,),
    "1n": lambda m, n: (1, n),
    "m1": lambda m, n: (m, 1),
    "mn": lambda m, n: (m, n),
}
QGEMM_CASES = [
    # A, B, transA, transB, alpha, C, output, B scale / zero point, (M, K, N)
    ("u8", "s8", 0, 0, 1.0, None, "quantized", "tensor", (7, 33, 1)),
    ("u8", "s8", 1, 1, 0.5, "n", "quantized", "column", (33, 257, 7)),
    ("u8", "s8", 0, 1, 2.0, "1", "scaled", "column", (7, 257, 33)),
    ("u8", "s8", 1, 0, 1.0, "mn", "float", "one", (1, 7, 257)),
    ("u8", "u8", 0, 1, 1.7, "mn", "float", "column", (1, 7, 33)),
    ("u8", "u8", 1, 0, 1.0, "m1", "quantized", "tensor", (257, 7, 33)),
    ("u8", "u8", 0, 0, 0.25, "11", "quantized", "column", (33, 1, 7)),
    ("s8", "s8", 0, 1, 0.3, "1n", "quantized", "column", (33, 33, 257)),
    ("s8", "s8", 1, 0, 1.0, "scalar", "float", "tensor", (7, 1, 7)),
    ("s8", "s8", 1, 1, -1.5, None, "scaled", "one", (1, 1, 1)),
    ("u8", "s8", 1, 0, 3.0, "n", "zero point", "column", (7, 33, 7)),
    ("s8", "s8", 0, 1, 1.0, None, "zero point", "tensor", (33, 7, 1)),
]


@pytest.mark.parametrize("case", QGEMM_CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_qgemm_matches_onnxruntime(rng, backend, case):
    """transA / transB, alpha, C of each shape onnxruntime broadcasts, quantized (u8, s8), float,
    y_scale-only (float, divided by y_scale) and y_zero_point-only (quantized, y_scale 1)
    outputs, B's scale and zero point per tensor, as
    one value or per column, u8 A with s8 and u8 B, s8 with s8; B a graph input and a constant
    (packed once, run on two inputs)."""
    a_t, b_t, trans_a, trans_b, alpha, c_kind, output, per, (m, k, n) = case
    a_t, b_t = TYPES[a_t], TYPES[b_t]
    b = _values(rng, b_t, (n, k) if trans_b else (k, n), seven_bit=b_t == np.int8)
    b_shape = {"tensor": (), "one": (1,), "column": (n,)}[per]
    b_scale = rng.uniform(0.002, 0.05, b_shape).astype(np.float32)
    b_zp = _values(rng, b_t, b_shape, seven_bit=True)
    c = None if c_kind is None else rng.integers(-20000, 20000, C_SHAPES[c_kind](m, n)).astype(np.int32)
    y_scale = None if output in ("float", "zero point") else np.float32(rng.uniform(0.05, 0.5))
    y_zp = _values(rng, a_t, ()) if output in ("quantized", "zero point") else None
    out = np.float32 if y_zp is None else a_t
    for constants in ((), (3, 4, 5, 6)):
        a = [_values(rng, a_t, (k, m) if trans_a else (m, k)) for _ in range(2)]
        inputs = [a[0], np.float32(0.02), _values(rng, a_t, ()), b, b_scale, b_zp, c, y_scale, y_zp]
        while inputs[-1] is None:
            inputs.pop()
        data, feed = _one_node("QGemm", inputs, out, constants, alpha=alpha, transA=trans_a, transB=trans_b)
        _matches(data, feed)
        _matches(data, dict(feed, in0=a[1]))


def test_qgemm_rounds_saturates_and_wraps_as_onnxruntime(rng, backend):
    """Requantization ties (acc * 0.5 on odd sums: half to even), saturation at both ends, an
    infinite or NaN multiplier (NaN to the type's low end, as MLAS's clamp), a C that makes the
    int32 sum wrap."""
    a = rng.integers(0, 256, (9, 5)).astype(np.uint8)
    b = rng.integers(-64, 64, (5, 7)).astype(np.int8)
    one, half = np.float32(1), np.float32(0.5)
    for a_scale, y_scale, alpha in (
        (one, np.float32(2), 1.0),
        (one, np.float32(2), -1.0),
        (one, np.float32(1e-3), 1.0),
        (np.float32(np.inf), one, 1.0),
        (np.float32(np.nan), one, 1.0),
    ):
        for a_t, y_zp in ((np.uint8, np.uint8(3)), (np.int8, np.int8(-7))):
            inputs = [a.astype(a_t), a_scale, a_t(0), b, one, np.int8(0), None, y_scale, y_zp]
            if a_t == np.int8:
                inputs[0] = (a // 2).astype(np.int8)
            data, feed = _one_node("QGemm", inputs, a_t, alpha=alpha)
            _matches(data, feed)
    c = np.full(7, 2**31 - 50, np.int32)
    data, feed = _one_node("QGemm", [a, one, np.uint8(0), b, half, np.int8(0), c], np.float32)
    got = _matches(data, feed)
    assert (got < 0).any()  # the int32 sum wrapped, as onnxruntime's


# ------------------------------------------------------------------------ QLinearGlobalAveragePool
@pytest.mark.parametrize("spatial", [(1,), (7,), (9, 7), (1, 1), (3, 5, 2), (17, 33)])
def test_qlinear_global_average_pool_matches_onnxruntime(rng, backend, spatial):
    """u8 and s8, channels first and last, batch 1 and 3, 1 to 3 spatial axes of odd sizes,
    random zero points; a y_scale small enough to saturate."""
    for dtype in (np.uint8, np.int8):
        for last in (0, 1):
            for batch, channels in ((1, 5), (3, 17)):
                shape = (batch,) + spatial + (channels,) if last else (batch, channels) + spatial
                x = _values(rng, dtype, shape)
                size = int(np.prod(spatial))
                for y_scale in (np.float32(0.07), np.float32(0.05 / (200 * size))):
                    inputs = [x, np.float32(0.05), _values(rng, dtype, ()), y_scale, _values(rng, dtype, ())]
                    data, feed = _one_node("QLinearGlobalAveragePool", inputs, dtype, channels_last=last)
                    _matches(data, feed)


def test_qlinear_global_average_pool_refuses_what_onnxruntime_refuses(rng):
    """MLAS computes x_scale / (y_scale * size) only within [2**-32, 256): outside, onnxruntime
    and fastlayers both refuse (InputError naming the node)."""
    import fastlayers

    x = _values(rng, np.uint8, (1, 3, 4, 4))
    for x_scale in (np.float32(256 * 16), np.float32(1e-12)):
        data, feed = _one_node(
            "QLinearGlobalAveragePool", [x, x_scale, np.uint8(1), np.float32(1), np.uint8(2)], np.uint8
        )
        with pytest.raises(Exception, match="out of computation range"):
            _session(data).run(None, feed)
        with pytest.raises(InputError, match=r"n_QLinearGlobalAveragePool.*\[2\*\*-32, 256\)"):
            fastlayers.load(data).run(None, feed)


# ------------------------------------------------------------------------------ QLinearAveragePool
POOL_CASES = [
    # spatial size, attributes
    ((9,), dict(kernel_shape=[3])),
    ((9,), dict(kernel_shape=[2], strides=[2], pads=[1, 1], count_include_pad=1)),
    ((8,), dict(kernel_shape=[3], strides=[2], pads=[1, 0], ceil_mode=1)),
    ((7, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((7, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ((7, 9), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[0, 1, 2, 0], ceil_mode=1)),
    ((7, 9), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[0, 1, 2, 0], ceil_mode=1, count_include_pad=1)),
    # ceil_mode: the last window would start past the input, onnxruntime drops it
    ((6, 8), dict(kernel_shape=[2, 3], strides=[3, 3], ceil_mode=1, count_include_pad=1)),
    ((7, 5), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((7, 5), dict(kernel_shape=[4, 2], auto_pad="SAME_LOWER", count_include_pad=1)),
    ((7, 5), dict(kernel_shape=[3, 2], strides=[1, 2], auto_pad="VALID", ceil_mode=1)),
    # strides wider than the window: onnxruntime's SAME padding is negative (windows shift)
    ((4, 9), dict(kernel_shape=[1, 2], strides=[4, 5], auto_pad="SAME_LOWER")),
    ((4, 9), dict(kernel_shape=[1, 2], strides=[4, 5], auto_pad="SAME_UPPER")),
    # the window is the whole image: onnxruntime's integer global average
    ((7, 9), dict(kernel_shape=[7, 9])),
    ((5,), dict(kernel_shape=[5], strides=[2], auto_pad="VALID")),
    ((3, 5, 4), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 2, 1])),
]


@pytest.mark.parametrize("spatial,attrs", POOL_CASES, ids=lambda v: str(v))
def test_qlinear_average_pool_matches_onnxruntime(rng, backend, spatial, attrs):
    """kernel, strides, pads, auto_pad, ceil_mode, count_include_pad; 1-D, 2-D (and a 3-D)
    odd sizes; u8 and s8, channels first and last, batch 1 and 3; a y_scale that saturates."""
    for dtype in (np.uint8, np.int8):
        for last in (0, 1):
            for batch, channels in ((1, 3), (3, 2)):
                shape = (batch,) + spatial + (channels,) if last else (batch, channels) + spatial
                x = _values(rng, dtype, shape)
                for y_scale in (np.float32(0.03), np.float32(0.002)):
                    inputs = [x, np.float32(0.05), _values(rng, dtype, ()), y_scale, _values(rng, dtype, ())]
                    data, feed = _one_node("QLinearAveragePool", inputs, dtype, channels_last=last, **attrs)
                    _matches(data, feed)
    # omitted zero points are 0 (onnxruntime's kernel; its type inference refuses the file)
    import fastlayers

    x = _values(rng, np.uint8, (1, 2) + spatial)
    zeros, zeros_feed = _one_node(
        "QLinearAveragePool", [x, np.float32(0.05), np.uint8(0), np.float32(0.03), np.uint8(0)], np.uint8, **attrs
    )
    omitted, feed = _one_node("QLinearAveragePool", [x, np.float32(0.05), None, np.float32(0.03)], np.uint8, **attrs)
    _assert_equal(fastlayers.load(omitted).run(None, feed)[0], _session(zeros).run(None, zeros_feed)[0])


def test_qlinear_average_pool_rounds_and_converts_as_onnxruntime(backend):
    """onnxruntime's quantize_value: nearbyintf(y / y_scale + y_zero_point), the zero point
    added before rounding (200 + 0.50000095 is 200.5 in float32, which rounds to 200, where
    rounding first gives 201), and a value beyond int32 converted to INT32_MIN, then clamped:
    a huge positive average gives the type's minimum."""
    x = np.array([[[[11, 12, 13, 14]]]], np.uint8)  # x - 10: 1, 2, 3, 4
    y_scale = np.float32(1) / np.float32(0.5 + 2.0**-20)
    data, feed = _one_node(
        "QLinearAveragePool", [x, np.float32(1), np.uint8(10), y_scale, np.uint8(200)], np.uint8, kernel_shape=[1, 1]
    )
    assert _matches(data, feed)[0, 0, 0, 0] == 200
    for dtype in (np.uint8, np.int8):
        data, feed = _one_node(
            "QLinearAveragePool",
            [x.astype(dtype), np.float32(1e6), dtype(0), np.float32(1e-6), dtype(0)],
            dtype,
            kernel_shape=[1, 2],
        )
        assert (_matches(data, feed) == np.iinfo(dtype).min).all()
    for x_scale, y_scale in ((np.float32(np.nan), np.float32(1)), (np.float32(1), np.float32(0))):
        data, feed = _one_node(
            "QLinearAveragePool",
            [x, x_scale, np.uint8(10), y_scale, np.uint8(7)],
            np.uint8,
            kernel_shape=[1, 2],
            pads=[0, 1, 0, 0],
        )
        _matches(data, feed)


# ---------------------------------------------------------------------- torch, quantized by onnxruntime
def test_onnxruntime_optimized_static_model_runs_its_qoperators(torch, tmp_path, rng):
    """A torch model (Conv, AvgPool2d, AdaptiveAvgPool2d(1), Linear) exported to ONNX, quantized
    statically by onnxruntime (QDQ, 7-bit weights) and optimized by onnxruntime, which writes
    QLinearAveragePool, QLinearGlobalAveragePool and QGemm: fastlayers loads that file and
    gives onnxruntime's outputs on it, bit for bit."""
    import onnx

    import fastlayers

    from .quantizing import quantize_static_on

    ort = oracle("onnxruntime")
    nn = torch.nn
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(torch.flatten(self.gap(self.pool(torch.relu(self.conv(x)))), 1))

    shape = (2, 3, 9, 9)
    float_path, q_path, opt_path = tmp_path / "f.onnx", tmp_path / "q.onnx", tmp_path / "opt.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Net().eval(),
            (torch.randn(*shape),),
            str(float_path),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )

    r = np.random.default_rng(5)
    quantize_static_on(
        float_path, q_path, [{"x": r.standard_normal(shape).astype(np.float32)} for _ in range(3)], reduce_range=True
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(opt_path)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ort.InferenceSession(str(q_path), options, providers=["CPUExecutionProvider"])
    written = {(n.domain, n.op_type) for n in onnx.load(str(opt_path)).graph.node}
    assert {(MS, "QGemm"), (MS, "QLinearAveragePool"), (MS, "QLinearGlobalAveragePool")} <= written
    ours = fastlayers.load(opt_path)
    assert {f"{MS}::QGemm", f"{MS}::QLinearAveragePool", f"{MS}::QLinearGlobalAveragePool"} <= set(ours.op_types)
    theirs = _session(opt_path.read_bytes())
    for batch in (1, 2, 3):
        x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
        _assert_equal(ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])


# ------------------------------------------------------------------------------------ errors
def test_malformed_qoperators_raise_naming_the_node_and_what_was_expected(rng):
    import fastlayers

    u8, s8 = np.uint8, np.int8
    a, b, one = _values(rng, u8, (4, 3)), _values(rng, s8, (3, 5), seven_bit=True), np.float32(0.1)

    def gemm(*inputs, out=np.float32, **attrs):
        data, feed = _one_node("QGemm", list(inputs), out, **attrs)
        return lambda: fastlayers.load(data).run(None, feed)

    with pytest.raises(ModelFileError, match=r"n_QGemm.*has 5 inputs, expected 6 to 9"):
        gemm(a, one, u8(0), b, one)()
    with pytest.raises(ShapeError, match=r"n_QGemm.*a_scale of shape \(2,\), expected a scalar"):
        gemm(a, np.ones(2, np.float32), u8(0), b, one, s8(0))()
    with pytest.raises(InputError, match=r"n_QGemm.*a_zero_point of type int8, expected uint8"):
        gemm(a, one, s8(0), b, one, s8(0))()
    with pytest.raises(InputError, match=r"n_QGemm.*b_zero_point of type uint8, expected int8"):
        gemm(a, one, u8(0), b, one, u8(0))()
    with pytest.raises(ShapeError, match=r"n_QGemm.*b_scale of shape \(5,\) and b_zero_point of shape \(\)"):
        gemm(a, one, u8(0), b, np.ones(5, np.float32), s8(0))()
    with pytest.raises(ShapeError, match=r"n_QGemm.*has K=3 but B of shape \(4, 5\).*has K=4"):
        gemm(a, one, u8(0), _values(rng, s8, (4, 5)), one, s8(0))()
    with pytest.raises(ShapeError, match=r"n_QGemm.*C of shape \(4,\) for an output of shape \(4, 5\); expected"):
        gemm(a, one, u8(0), b, one, s8(0), np.zeros(4, np.int32))()
    with pytest.raises(InputError, match=r"n_QGemm.*C of type float32, expected int32"):
        gemm(a, one, u8(0), b, one, s8(0), np.zeros(5, np.float32))()
    with pytest.raises(UnsupportedError, match=r"n_QGemm.*y_zero_point of type int8 for A of type uint8"):
        gemm(a, one, u8(0), b, one, s8(0), None, one, s8(0), out=s8)()
    with pytest.raises(ShapeError, match=r"n_QGemm.*rank 2"):
        gemm(a[None], one, u8(0), b, one, s8(0))()

    x = _values(rng, u8, (1, 2, 5, 5))

    def pool(op, *inputs, **attrs):
        data, feed = _one_node(op, list(inputs), u8, **attrs)
        return lambda: fastlayers.load(data).run(None, feed)

    with pytest.raises(ModelFileError, match=r"n_QLinearGlobalAveragePool.*has 4 inputs, expected 5"):
        pool("QLinearGlobalAveragePool", x, one, u8(0), one)()
    with pytest.raises(ShapeError, match=r"n_QLinearGlobalAveragePool.*x_scale of shape \(1, 1\), expected a scalar"):
        pool("QLinearGlobalAveragePool", x, np.ones((1, 1), np.float32), u8(0), one, u8(0))()
    with pytest.raises(InputError, match=r"n_QLinearAveragePool.*y_zero_point of type int8, expected uint8"):
        pool("QLinearAveragePool", x, one, u8(0), one, s8(0), kernel_shape=[2, 2])()
    with pytest.raises(InputError, match=r"n_QLinearAveragePool.*x_scale of type float16, expected float32"):
        pool("QLinearAveragePool", x, np.float16(1), u8(0), one, u8(0), kernel_shape=[2, 2])()
    with pytest.raises(ModelFileError, match=r"n_QLinearAveragePool.*pads \[2, 0, 0, 0\] for kernel_shape \[2, 2\]"):
        pool("QLinearAveragePool", x, one, u8(0), one, u8(0), kernel_shape=[2, 2], pads=[2, 0, 0, 0])()
    with pytest.raises(ModelFileError, match=r"n_QLinearAveragePool.*'dilations'"):
        pool("QLinearAveragePool", x, one, u8(0), one, u8(0), kernel_shape=[2, 2], dilations=[1, 1])()
    with pytest.raises(ModelFileError, match=r"n_QLinearAveragePool.*required attribute 'kernel_shape'"):
        pool("QLinearAveragePool", x, one, u8(0), one, u8(0))()
    with pytest.raises(ShapeError, match=r"n_QLinearAveragePool.*X of shape \(1, 2, 5, 5\) for a kernel_shape of 1"):
        pool("QLinearAveragePool", x, one, u8(0), one, u8(0), kernel_shape=[2])()
    with pytest.raises(UnsupportedError, match=r"n_QLinearAveragePool.*kernel_shape of 4 axes"):
        pool("QLinearAveragePool", x, one, u8(0), one, u8(0), kernel_shape=[1, 1, 1, 1])()
