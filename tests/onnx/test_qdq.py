"""QDQ node units (DequantizeLinear -> operator -> QuantizeLinear) run as the integer operators
onnxruntime replaces them with: the same node units fused, the same values bit for bit.

Weights are 7-bit (|w| <= 63), as ``quantize_static(reduce_range=True)`` writes them: onnxruntime's
AVX2 u8 x s8 kernel sums int16 pairs with saturation, fastlayers sums exactly; with 7-bit
weights both are exact on every x86 path."""

import numpy as np
import pytest

import fastlayers

from ..conftest import oracle

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F, U8, I8, I32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


class Graph:
    """A small QDQ graph under construction: nodes, initializers, one float input."""

    def __init__(self, rng, shape):
        self.rng, self.nodes, self.inits, self.shape, self.n = rng, [], [], shape, 0

    def const(self, value, name=None):
        self.n += 1
        name = name or f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op, inputs, **attrs):
        self.n += 1
        out = f"v{self.n}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def q(self, x, scale, zp):
        return self.node("QuantizeLinear", [x, self.const(np.float32(scale)), self.const(zp)])

    def dq(self, q, scale, zp, **attrs):
        args = [q, self.const(np.float32(scale) if np.ndim(scale) == 0 else np.asarray(scale, np.float32))]
        if zp is not None:
            args.append(self.const(zp))
        return self.node("DequantizeLinear", args, **attrs)

    def qdq(self, x, scale, zp):
        return self.dq(self.q(x, scale, zp), scale, zp)

    def weights(self, shape, axis=0, per_channel=True):
        """DQ of random 7-bit int8 weights, per output channel (``axis``) or per tensor; their
        scale is kept for ``bias``."""
        w = self.rng.integers(-63, 64, shape).astype(np.int8)
        if per_channel:
            self.w_scale = (0.002 + 0.01 * self.rng.random(shape[axis])).astype(np.float32)
            return self.dq(self.const(w), self.w_scale, np.zeros(shape[axis], np.int8), axis=axis)
        self.w_scale = np.float32(0.005)
        return self.dq(self.const(w), self.w_scale, np.int8(0))

    def bias(self, n, x_scale, off=1.0):
        """DQ of a random int32 bias of scale x_scale * (the last weights' scale) * ``off``."""
        scale = (np.float32(x_scale) * self.w_scale * np.float32(off)).astype(np.float32)
        return self.dq(self.const(self.rng.integers(-2000, 2000, n).astype(np.int32)), scale, None, axis=0)

    def model(self, outputs, opset=17):
        graph = helper.make_graph(
            self.nodes,
            "qdq",
            [helper.make_tensor_value_info("x", F, self.shape)],
            [helper.make_tensor_value_info(o, F, None) for o in outputs],
            self.inits,
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8
        ).SerializeToString()


def _both(data, rng, shape, **options):
    """fastlayers' model of ``data`` and onnxruntime's outputs beside fastlayers' for one input."""
    ort = oracle("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    theirs = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    ours = fastlayers.load(data, options=fastlayers.LoadOptions(**options)) if options else fastlayers.load(data)
    x = (2 * rng.standard_normal(shape)).astype(np.float32)
    return ours, ours.run(None, {"x": x}), theirs.run(None, {"x": x})


def _conv_graph(rng, shape=(2, 5, 9, 11), act="Relu", act_zp=np.uint8(0), zp=np.uint8(120), off=1.0, **conv):
    g = Graph(rng, shape)
    x = g.qdq("x", 0.03, zp)
    cout = 7
    w = g.weights((cout, shape[1], 3, 3))
    y = g.node("Conv", [x, w, g.bias(cout, 0.03, off)], **conv)
    if act == "Relu":
        y = g.node("Relu", [y])
    elif act == "Clip":
        y = g.node("Clip", [y, g.const(np.float32(0)), g.const(np.float32(6))])
    out_zp = act_zp if act else zp
    return g, g.dq(g.q(y, 0.05, out_zp), 0.05, out_zp)


@pytest.mark.parametrize(
    "conv", [{}, {"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 1, 0, 1]}, {"group": 1, "dilations": [2, 1]}]
)
def test_conv_unit_with_relu_runs_as_qlinear_conv_bit_for_bit(rng, backend, conv):
    g, y = _conv_graph(rng, **conv)
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert "QLinearConv" in ours.op_types and "Relu" not in ours.op_types
    np.testing.assert_array_equal(got[0], want[0])


def test_int8_activations_are_fused_as_onnxruntime_makes_them_uint8(rng):
    """On x86, onnxruntime turns int8 Q -> DQ pairs into uint8 ones (QDQS8ToU8Transformer) and
    then fuses the unit; the integers less their zero points are the same."""
    g, y = _conv_graph(rng, act="Relu", act_zp=np.int8(-128), zp=np.int8(-5))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert "QLinearConv" in ours.op_types
    np.testing.assert_array_equal(got[0], want[0])


def test_clip_holding_the_quantized_range_is_dropped(rng):
    g, y = _conv_graph(rng, act="Clip", act_zp=np.uint8(0))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    # 255 steps of 0.05 reach 12.75, past the Clip's 6: the Clip is not redundant, the unit stays float
    assert "QLinearConv" not in ours.op_types
    np.testing.assert_allclose(got[0], want[0], atol=0.05 * 1.001, rtol=0)


def test_relu_before_a_q_with_a_positive_zero_point_keeps_the_unit_in_float(rng):
    """Relu is redundant only where the Q's zero point is its type's minimum (onnxruntime's
    IsClipMadeRedundantByQ); otherwise neither engine fuses."""
    g, y = _conv_graph(rng, act="Relu", act_zp=np.uint8(3))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert "QLinearConv" not in ours.op_types
    np.testing.assert_allclose(got[0], want[0], atol=0.05 * 1.001, rtol=0)


@pytest.mark.parametrize("off", [0.995, 1.005, 0.95, 1.05])
def test_bias_scale_must_be_the_product_of_the_input_scales(rng, off):
    """onnxruntime takes the int32 bias into QLinearConv as it is, where its scale is within
    1e-6 + 1% of x_scale * w_scale; otherwise the unit stays in float, in both engines."""
    g, y = _conv_graph(rng, off=off)
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert ("QLinearConv" in ours.op_types) == (abs(off - 1) < 0.01)
    if abs(off - 1) < 0.01:
        np.testing.assert_array_equal(got[0], want[0])
    else:
        np.testing.assert_allclose(got[0], want[0], atol=0.05 * 1.001, rtol=0)


def test_conv_unit_whose_output_is_read_elsewhere_is_not_fused(rng):
    g, y = _conv_graph(rng, act=None)
    conv = g.nodes[-3].output[0]
    ours, got, want = _both(g.model([y, conv]), rng, g.shape)
    assert "QLinearConv" not in ours.op_types
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_matmul_unit_runs_as_qlinear_matmul_bit_for_bit(rng, backend):
    g = Graph(rng, (3, 4, 24))
    a = g.qdq("x", 0.02, np.uint8(128))
    y = g.node("MatMul", [a, g.weights((24, 17), axis=1)])
    y = g.dq(g.q(y, 0.04, np.uint8(100)), 0.04, np.uint8(100))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert "QLinearMatMul" in ours.op_types and "MatMul" not in ours.op_types
    np.testing.assert_array_equal(got[0], want[0])


def test_units_chain_through_their_quantized_values(rng, backend):
    """Two convolutions and a matmul, each Q read by the next unit's DQ: every unit fused, the
    integers passed from one to the next with no float round trip."""
    g = Graph(rng, (1, 3, 10, 10))
    x = g.qdq("x", 0.03, np.uint8(128))
    for cin, cout in ((3, 6), (6, 4)):
        w = g.weights((cout, cin, 3, 3))
        y = g.node("Relu", [g.node("Conv", [x, w, g.bias(cout, 0.03)], pads=[1, 1, 1, 1])])
        x = g.dq(g.q(y, 0.03, np.uint8(0)), 0.03, np.uint8(0))
    flat = g.qdq(g.node("Reshape", [x, g.const(np.array([1, -1], np.int64))]), 0.03, np.uint8(0))
    y = g.node("MatMul", [flat, g.weights((400, 5), axis=1)])
    y = g.dq(g.q(y, 0.1, np.uint8(128)), 0.1, np.uint8(128))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert ours.op_types == [
        "QuantizeLinear",
        "QLinearConv",
        "QLinearConv",
        "Reshape",
        "QLinearMatMul",
        "DequantizeLinear",
    ]
    np.testing.assert_array_equal(got[0], want[0])


def test_optimize_false_leaves_the_units_as_written(rng):
    g, y = _conv_graph(rng)
    ours, got, want = _both(g.model([y]), rng, g.shape, optimize=False)
    assert "QLinearConv" not in ours.op_types and "Conv" in ours.op_types
    np.testing.assert_allclose(got[0], want[0], atol=0.05 * 1.001, rtol=0)


@pytest.mark.parametrize("op,attrs", [("Transpose", {"perm": [0, 2, 3, 1]}), ("Flatten", {"axis": 2})])
@pytest.mark.parametrize("zp", [np.uint8(77), np.int8(-3)])
def test_data_movement_units_run_on_the_integers(rng, backend, op, attrs, zp):
    g = Graph(rng, (2, 3, 7, 9))
    x = g.qdq("x", 0.02, zp)
    y = g.dq(g.q(g.node(op, [x], **attrs), 0.02, zp), 0.02, zp)
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert ours.op_types == ["QuantizeLinear", op, "DequantizeLinear"]
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("Transpose", {"perm": [0, 2, 3, 1]}),
    ],
)
def test_units_left_in_float_give_the_same_values(rng, op, attrs):
    """MaxPool (fastlayers' pools compute in float), and a data movement unit whose Q has other
    parameters than its DQ, stay as written: the same values as onnxruntime's integer forms."""
    g = Graph(rng, (2, 3, 7, 9))
    x = g.qdq("x", 0.02, np.uint8(77))
    out_scale = 0.02 if op == "MaxPool" else 0.03
    y = g.dq(g.q(g.node(op, [x], **attrs), out_scale, np.uint8(77)), out_scale, np.uint8(77))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert ours.op_types == ["FusedQuantizeDequantize", op, "FusedQuantizeDequantize"]
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize(
    "opset,axis,shape",
    [(17, -1, (3, 4, 50)), (17, 1, (3, 4, 50)), (11, 1, (3, 4, 5)), (11, 2, (2, 3, 7)), (13, 0, (6, 9))],
)
@pytest.mark.parametrize(
    "zp,y_zp", [(np.uint8(131), np.uint8(0)), (np.int8(-7), np.int8(-128)), (np.int8(3), np.int8(-100))]
)
def test_softmax_unit_runs_as_qlinear_softmax_bit_for_bit(rng, backend, opset, axis, shape, zp, y_zp):
    """onnxruntime's QLinearSoftmax: table lookups of float32 exponentials, a float32 sum left to
    right, y = rint(e * floor(1 / y_scale) / sum) + y_zp capped at the type's maximum: the same
    integers."""
    g = Graph(rng, shape)
    x = g.qdq("x", 0.07, zp)
    y = g.dq(g.q(g.node("Softmax", [x], axis=axis), 1 / 256, y_zp), 1 / 256, y_zp)
    ours, got, want = _both(g.model([y], opset=opset), rng, g.shape)
    assert "com.microsoft::QLinearSoftmax" in ours.op_types
    np.testing.assert_array_equal(got[0], want[0])


def test_qlinear_softmax_errors_name_the_node(rng):
    from fastlayers.errors import InputError, ModelFileError

    def model(attrs, y_zp=np.uint8(0)):
        g = Graph(rng, (2, 5))
        x = g.q("x", 0.1, np.uint8(128))
        g.nodes.append(
            helper.make_node(
                "QLinearSoftmax",
                [x, g.const(np.float32(0.1)), g.const(np.uint8(128)), g.const(np.float32(1 / 256)), g.const(y_zp)],
                ["y"],
                domain="com.microsoft",
                name="sm",
                **attrs,
            )
        )
        graph = helper.make_graph(
            g.nodes,
            "qs",
            [helper.make_tensor_value_info("x", F, [2, 5])],
            [helper.make_tensor_value_info("y", U8, None)],
            g.inits,
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        ).SerializeToString()

    with pytest.raises(ModelFileError, match="'sm'.*opset"):
        fastlayers.load(model({"axis": -1}))
    with pytest.raises(InputError, match="QLinearSoftmax: y_zero_point of type int8"):
        fastlayers.load(model({"axis": -1, "opset": 13}, np.int8(0)))(np.zeros((2, 5), np.float32))


def test_units_with_uint8_input_and_int8_output_run_as_written(rng):
    """A LeakyRelu between a uint8 DQ and an int8 Q (as onnxruntime's optimized files hold
    after converting one side only): no integer operator takes two types, the unit stays float."""
    g = Graph(rng, (2, 3, 7, 9))
    x = g.qdq("x", 0.02, np.uint8(128))
    y = g.dq(g.q(g.node("LeakyRelu", [x], alpha=0.1), 0.02, np.int8(0)), 0.02, np.int8(0))
    ours, got, want = _both(g.model([y]), rng, g.shape)
    assert "LeakyRelu" in ours.op_types
    np.testing.assert_allclose(got[0], want[0], atol=0.02 * 1.001, rtol=0)
