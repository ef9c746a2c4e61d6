"""Quantized ONNX models: operator domains, the QDQ form, the integer and contrib operators,
onnxruntime-quantized torch exports, and the errors of malformed quantization parameters."""

import warnings

import numpy as np
import pytest

from fastlayers.errors import FastlayersError, InputError, ModelFileError, ShapeError, UnsupportedError

from ..conftest import oracle

# Quantized types numpy holds; the node tests of float8, int4/uint4, int2/uint2 and float4
# tensors are left out (numpy has no such types and fastlayers does not read them).
QUANT_NODE_OPS = {
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "QLinearMatMul",
    "QLinearConv",
}
QUANT_ELEM_TYPES = {1, 2, 3, 4, 5, 6, 10}


def _quant_cases():
    """The node test cases of QUANT_NODE_OPS, from their modules alone (collecting all the
    node tests takes seconds)."""
    import importlib

    oracle("onnx")
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in QUANT_NODE_OPS:  # importing a case module records its cases
            importlib.import_module(f"onnx.backend.test.case.node.{name.lower()}")
    return [
        c
        for c in node._NodeTestCases
        if {n.op_type for n in c.model.graph.node} & QUANT_NODE_OPS
        and all(
            v.type.tensor_type.elem_type in QUANT_ELEM_TYPES
            for v in list(c.model.graph.input) + list(c.model.graph.output)
        )
    ]


def test_onnx_backend_node_tests_quantized(backend):
    """The onnx package's node tests of the quantization operators, exact types and values
    (uint16 inputs included, which tests/onnx/test_import.py leaves out)."""
    from onnx import TensorProto, numpy_helper

    from fastlayers.io.onnx import from_proto

    cases = _quant_cases()
    for case in cases:
        model = from_proto(case.model, case.name)
        for inputs, outputs in case.data_sets:
            got = model(*inputs)
            for g, e in zip(got if isinstance(got, list) else [got], outputs):
                e = numpy_helper.to_array(e) if isinstance(e, TensorProto) else np.asarray(e)
                assert g.dtype == e.dtype and g.shape == e.shape, case.name
                if e.dtype.kind == "f":
                    np.testing.assert_allclose(g, e, rtol=1e-6, err_msg=case.name)
                else:
                    np.testing.assert_array_equal(g, e, err_msg=case.name)
    assert len(cases) >= 29


# ------------------------------------------------------------------------------- helpers
def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 21),)):
    from onnx import helper

    graph = helper.make_graph(nodes, "q", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _tensor(name, elem, shape):
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, shape)


def _load(proto):
    from fastlayers.io.onnx import from_proto

    return from_proto(proto, "q.onnx")


# ------------------------------------------------------------------------------- domains
def test_domains_are_part_of_the_operator(rng):
    oracle("onnx")
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    x, y = _tensor("x", f, [2, 3]), _tensor("y", f, [2, 3])
    # a default-domain op type that only exists as a contrib operator
    proto = _model([helper.make_node("DynamicQuantizeMatMul", ["x", "x"], ["y"])], [x], [y])
    with pytest.raises(UnsupportedError, match="DynamicQuantizeMatMul"):
        _load(proto)
    # a default operator's name in an unknown domain, and a contrib operator not implemented
    for domain, op in (("my.domain", "Relu"), ("com.microsoft", "FusedMatMulActivation")):
        proto = _model([helper.make_node(op, ["x"], ["y"], domain=domain)], [x], [y], opsets=(("", 17), (domain, 1)))
        with pytest.raises(UnsupportedError, match=f"{domain}::{op}"):
            _load(proto)
    # an op type spelling a qualified name in the default domain cannot reach a contrib operator
    proto = _model([helper.make_node("com.microsoft::DequantizeLinear", ["x", "x"], ["y"])], [x], [y])
    with pytest.raises(UnsupportedError, match="com.microsoft::DequantizeLinear"):
        _load(proto)
    # a contrib node without its domain's opset import, or with another version
    node = helper.make_node("DequantizeLinear", ["q", "s"], ["y"], domain="com.microsoft")
    args = ([node], [_tensor("q", TensorProto.INT8, [2, 3]), _tensor("s", f, [])], [y])
    with pytest.raises(ModelFileError, match="no opset import"):
        _load(_model(*args))
    with pytest.raises(UnsupportedError, match="opset 2 of domain com.microsoft"):
        _load(_model(*args, opsets=(("", 17), ("com.microsoft", 1 + 1))))
    q = rng.integers(-128, 128, (2, 3)).astype(np.int8)
    got = _load(_model(*args, opsets=(("", 17), ("com.microsoft", 1))))(q, np.float32(0.5))
    np.testing.assert_array_equal(got, q.astype(np.float32) * 0.5)


# ------------------------------------------------------------------------------- QDQ form
def test_dequantize_of_constant_weight_is_folded(rng):
    ort = oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    w_q = rng.integers(-127, 128, (4, 5)).astype(np.int8)
    w_s = rng.uniform(0.01, 0.02, 5).astype(np.float32)
    inits = [
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(w_s, "w_s"),
        numpy_helper.from_array(np.zeros(5, np.int8), "w_z"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    proto = _model(
        nodes, [_tensor("x", TensorProto.FLOAT, [None, 4])], [_tensor("y", TensorProto.FLOAT, [None, 5])], inits
    )
    ours = _load(proto)
    assert ours.op_types == ["FusedDense"]
    x = rng.standard_normal((3, 4)).astype(np.float32)
    # onnxruntime's graph optimizations run DequantizeLinear -> MatMul as a dynamically
    # quantized integer product (about 1e-2 away here); unoptimized it computes the spec's floats
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(proto.SerializeToString(), options).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours(x), want, rtol=1e-5, atol=1e-6)


def test_quantize_rounds_half_to_even_and_saturates():
    oracle("onnx")
    from onnx import TensorProto, helper

    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 126.5], np.float32)
    for elem, dtype in ((TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8)):
        proto = _model(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
            [_tensor("x", TensorProto.FLOAT, [8]), _tensor("s", TensorProto.FLOAT, []), _tensor("z", elem, [])],
            [_tensor("y", elem, [8])],
        )
        zp = dtype(1)
        got = _load(proto)(x, np.float32(1.0), zp)
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        np.testing.assert_array_equal(got, np.array([0, 2, 2, 0, -2, 300, -300, 126]).clip(lo - 1, hi - 1) + 1)


# --------------------------------------------------------------------------- integer operators
def _session(ort, proto, threads=1):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_integer_products_are_exact_where_int16_pairs_would_saturate(rng, backend):
    """u8 x s8 products summed in int32 without the int16 pair saturation of onnxruntime's
    AVX2 kernel (vpmaddubsw: 255 * 127 * 2 > 32767), against an int64 reference."""
    oracle("onnx")
    from onnx import TensorProto, helper

    for a_type, b_type in ((np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)):
        elem = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
        proto = _model(
            [helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])],
            [
                _tensor("a", elem[a_type], [None, None]),
                _tensor("b", elem[b_type], [None, None]),
                _tensor("za", elem[a_type], []),
                _tensor("zb", elem[b_type], [None]),
            ],
            [_tensor("y", TensorProto.INT32, None)],
        )
        ours = _load(proto)
        lo_a, hi_a = np.iinfo(a_type).min, np.iinfo(a_type).max
        lo_b, hi_b = np.iinfo(b_type).min, np.iinfo(b_type).max
        a = np.full((3, 33), hi_a, a_type)
        a[1] = rng.integers(lo_a, hi_a + 1, 33)
        b = np.full((33, 7), lo_b, b_type)
        b[:, 1:] = rng.integers(lo_b, hi_b + 1, (33, 6))
        za, zb = a_type(3), rng.integers(lo_b, hi_b + 1, 7).astype(b_type)
        want = (a.astype(np.int64) - int(za)) @ (b.astype(np.int64) - zb.astype(np.int64))
        np.testing.assert_array_equal(ours(a, b, za, zb), want)


def test_contrib_matmul_operators_match_onnxruntime(rng, backend):
    """DynamicQuantizeMatMul and MatMulIntegerToFloat (per-column scales and zero points, bias)
    against onnxruntime; the weights are 7-bit so that its AVX2 u8 x s8 kernel does not saturate."""
    ort = oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    b = rng.integers(-64, 64, (12, 6)).astype(np.int8)
    b_scale = rng.uniform(0.005, 0.02, 6).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    inits = [
        numpy_helper.from_array(v, n)
        for n, v in (
            ("b", b),
            ("bs", b_scale),
            ("bz", np.zeros(6, np.int8)),
            ("bias", bias),
            ("b_u", (b.astype(np.int16) + 100).astype(np.uint8)),
            ("bz_u", np.full(6, 100, np.uint8)),
        )
    ]
    ms = (("", 17), ("com.microsoft", 1))
    dqmm = _model(
        [helper.make_node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft")],
        [_tensor("a", f, [None, 12])],
        [_tensor("y", f, None)],
        inits,
        ms,
    )
    ours, theirs = _load(dqmm), _session(ort, dqmm)
    for rows in (5, 5, 2, 5):  # the compiled plan's bound node: each shape checked once
        a = rng.standard_normal((rows, 12)).astype(np.float32)
        np.testing.assert_allclose(ours(a), theirs.run(None, {"a": a})[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(FastlayersError, match="DynamicQuantizeMatMul|expected shape"):
        ours(rng.standard_normal((5, 11)).astype(np.float32))
    mmf = _model(
        [
            helper.make_node(
                "MatMulIntegerToFloat", ["a", "b_u", "as", "bs", "az", "bz_u", "bias"], ["y"], domain="com.microsoft"
            )
        ],
        [_tensor("a", TensorProto.UINT8, [None, 12]), _tensor("as", f, []), _tensor("az", TensorProto.UINT8, [])],
        [_tensor("y", f, None)],
        inits,
        ms,
    )
    a_q = rng.integers(0, 256, (5, 12)).astype(np.uint8)
    feed = {"a": a_q, "as": np.array(0.03, np.float32), "az": np.array(120, np.uint8)}
    np.testing.assert_allclose(_load(mmf)(feed), _session(ort, mmf).run(None, feed)[0], rtol=1e-5, atol=1e-6)


def _lstm_constants(rng, n_dir, n_in, hidden):
    """A DynamicQuantizeLSTM's constants: 7-bit int8 W and R, biases, peepholes, W scales per
    column and R scales per direction, zero zero points."""
    return {
        "w": rng.integers(-64, 64, (n_dir, n_in, 4 * hidden)).astype(np.int8),
        "r": rng.integers(-64, 64, (n_dir, hidden, 4 * hidden)).astype(np.int8),
        "bias": rng.standard_normal((n_dir, 8 * hidden)).astype(np.float32),
        "p": rng.standard_normal((n_dir, 3 * hidden)).astype(np.float32),
        "ws": rng.uniform(0.01, 0.03, (n_dir, 4 * hidden)).astype(np.float32),
        "wz": np.zeros((n_dir, 4 * hidden), np.int8),
        "rs": rng.uniform(0.01, 0.03, n_dir).astype(np.float32),
        "rz": np.zeros(n_dir, np.int8),
    }


def test_dynamic_quantize_lstm_matches_onnxruntime(rng, backend):
    """Bidirectional, with biases, initial states and peepholes, per-column weight scales: the
    same bits as onnxruntime (its gates' sigmoid and tanh, its order of roundings), on every
    backend and at every batch size. onnxruntime runs on one thread: on several it quantizes the hidden state of each thread's
    share of the batch on its own, so that its result depends on its thread count."""
    ort = oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    f, hidden, n_in = TensorProto.FLOAT, 5, 3
    consts = _lstm_constants(rng, 2, n_in, hidden)
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "w", "r", "bias", "", "h0", "c0", "p", "ws", "wz", "rs", "rz"],
        ["y", "yh", "yc"],
        domain="com.microsoft",
        hidden_size=hidden,
        direction="bidirectional",
    )
    proto = _model(
        [node],
        [_tensor("x", f, [None, None, n_in]), _tensor("h0", f, [2, None, hidden]), _tensor("c0", f, [2, None, hidden])],
        [_tensor(n, f, None) for n in ("y", "yh", "yc")],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
        (("", 17), ("com.microsoft", 1)),
    )
    ours, theirs = _load(proto), _session(ort, proto)
    assert "_packed" in ours._plan[0][3]  # W and R packed once at load for the native loop
    for steps, batch in ((4, 3), (1, 1), (4, 3), (1, 1)):  # shapes checked once, then run straight
        feed = {
            "x": rng.standard_normal((steps, batch, n_in)).astype(np.float32),
            "h0": rng.standard_normal((2, batch, hidden)).astype(np.float32),
            "c0": rng.standard_normal((2, batch, hidden)).astype(np.float32),
        }
        for g, w in zip(ours.run(None, feed), theirs.run(None, feed)):
            np.testing.assert_array_equal(g, w)  # onnxruntime's arithmetic, bit for bit
    with pytest.raises(FastlayersError, match="initial_h"):  # a new shape is checked
        ours.run(None, dict(feed, h0=np.zeros((2, 2, hidden), np.float32)))


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("states", [True, False])
@pytest.mark.parametrize("peepholes", [True, False])
def test_one_direction_quantized_lstm_bound_matches_onnxruntime(rng, backend, direction, states, peepholes):
    """A forward or reverse DynamicQuantizeLSTM runs bound in the compiled plan (the input's
    quantization, its product with W and the time loop in one native call on the cpu backend):
    bit for bit onnxruntime's outputs, with and without initial states and peepholes, for
    streaming single steps and sequences alternating, each shape checked once; a state of a
    new, wrong shape still raises after the bound calls."""
    ort = oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.onnx.qlstm import bind_dynamic_quantize_lstm

    f, hidden, n_in = TensorProto.FLOAT, 19, 7
    consts = _lstm_constants(rng, 1, n_in, hidden)
    if not peepholes:
        del consts["p"]
    names = ["x", "w", "r", "bias", "", "h0" if states else "", "c0" if states else "", "p" if peepholes else ""]
    node = helper.make_node(
        "DynamicQuantizeLSTM",
        names + ["ws", "wz", "rs", "rz"],
        ["y", "yh", "yc"],
        domain="com.microsoft",
        hidden_size=hidden,
        direction=direction,
    )
    inputs = [_tensor("x", f, [None, None, n_in])]
    if states:
        inputs += [_tensor("h0", f, [1, None, hidden]), _tensor("c0", f, [1, None, hidden])]
    proto = _model(
        [node],
        inputs,
        [_tensor(n, f, None) for n in ("y", "yh", "yc")],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
        (("", 17), ("com.microsoft", 1)),
    )
    ours, theirs = _load(proto), _session(ort, proto)
    (fn, ins, _, attrs, _), general = ours._bound_plan()[0], ours._plan[0][0]
    assert fn is not general and bind_dynamic_quantize_lstm(ins, attrs, ours.opset) is not None
    for steps, batch in ((1, 1), (5, 3), (1, 1), (5, 3), (1, 1)):
        feed = {"x": rng.standard_normal((steps, batch, n_in)).astype(np.float32)}
        if states:
            feed["h0"] = rng.standard_normal((1, batch, hidden)).astype(np.float32)
            feed["c0"] = rng.standard_normal((1, batch, hidden)).astype(np.float32)
        for g, w in zip(ours.run(None, feed), theirs.run(None, feed), strict=True):
            np.testing.assert_array_equal(g, w)
    if states:  # a new shape is checked by the general form
        with pytest.raises(FastlayersError, match="initial_h"):
            ours.run(None, dict(feed, h0=np.zeros((1, batch + 1, hidden), np.float32)))


def test_quantized_lstm_binds_only_what_it_can(rng):
    """The bound form declines a bidirectional node and a P computed by the graph (the general
    form runs them)."""
    from fastlayers.onnx.qlstm import bind_dynamic_quantize_lstm

    hidden = 3
    derived = {
        "_packed": ((np.zeros(1, np.int8), np.zeros(1, np.int8)),),
        "_params": ((0, 0, np.ones(12, np.float32), np.ones(12, np.float32), np.zeros(12, np.float32)),),
    }
    x = rng.standard_normal((1, 1, 2)).astype(np.float32)
    constant_p = np.zeros((1, 3 * hidden), np.float32)
    assert bind_dynamic_quantize_lstm([x] + [None] * 6 + [constant_p], derived, 17) is not None
    assert bind_dynamic_quantize_lstm([x] + [None] * 6 + ["p"], derived, 17) is None
    both = {"_packed": derived["_packed"] * 2, "_params": derived["_params"] * 2}
    assert bind_dynamic_quantize_lstm([x], both, 17) is None
    assert bind_dynamic_quantize_lstm([x], {}, 17) is None


# ------------------------------------------------------------- torch exports quantized by onnxruntime
def _torch_model(torch, kind):
    """A small torch module of ``kind`` and an example input (batch 2)."""
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (2, 16)
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 3 * 3, 5),
        ), (2, 3, 8, 8)
    if kind == "lstm":
        return nn.LSTM(8, 16, batch_first=True), (2, 5, 8)

    class Encoder(nn.Module):  # exported through a module of its own: one input, no mask
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

        def forward(self, x):
            return self.layer(x)

    return Encoder(), (2, 6, 32)


def _export_batch_dynamic(torch, module, shape, path):
    """``module`` exported to ``path`` by the TorchScript exporter at opset 17, input "x" of
    ``shape`` with a free batch, output "y"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            (torch.randn(*shape),),
            str(path),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )


def _quantized_export(torch, tmp_path, kind, mode):
    """The path of a torch export of ``kind`` quantized by onnxruntime.quantization (``mode``
    "dynamic" or "static", QDQ, calibrated on a few random batches), and its input shape.
    reduce_range=True: 7-bit weights, so that onnxruntime's AVX2 u8 x s8 kernel (int16 pair sums,
    vpmaddubsw) does not saturate and computes the exact sums fastlayers computes."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .quantizing import quantize_static_on

    module, shape = _torch_model(torch, kind)
    float_path, path = tmp_path / f"{kind}.onnx", tmp_path / f"{kind}_{mode}.onnx"
    _export_batch_dynamic(torch, module, shape, float_path)
    if mode == "dynamic":
        import logging

        logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process the model first
        quantize_dynamic(float_path, path, weight_type=QuantType.QInt8, reduce_range=True)
    else:
        rng = np.random.default_rng(5)
        quantize_static_on(
            float_path,
            path,
            [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(3)],
            reduce_range=True,
        )
    return path, shape


def _output_scale(path):
    """The scale of the DequantizeLinear giving the graph's (first) output."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    node = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    assert node.op_type == "DequantizeLinear"
    return float(numpy_helper.to_array(inits[node.input[1]]))


@pytest.mark.parametrize("scale_read", [False, True])
def test_a_shared_dynamic_quantization_feeds_integer_to_float_products(rng, scale_read):
    """quantize_dynamic's chain (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by the
    scales' product -> Add) on one quantized input read by two products (two heads): each
    chain becomes a DynamicQuantizeMatMul quantizing the input again, or, where something else
    reads the DynamicQuantizeLinear (its scale an output of the graph), a MatMulIntegerToFloat
    reading it; bit for bit onnxruntime's result."""
    from onnx import TensorProto, helper, numpy_helper

    import fastlayers

    ort = oracle("onnxruntime")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])]
    inits = []
    for k in (1, 2):
        w = rng.integers(0, 256, (12, 7 + k)).astype(np.uint8)
        inits += [
            numpy_helper.from_array(w, f"w{k}"),
            numpy_helper.from_array(np.array(128 - k, np.uint8), f"wz{k}"),
            numpy_helper.from_array(np.array(0.01 * k, np.float32), f"ws{k}"),
            numpy_helper.from_array(rng.standard_normal(7 + k).astype(np.float32), f"b{k}"),
        ]
        nodes += [
            helper.make_node("MatMulInteger", ["q", f"w{k}", "z", f"wz{k}"], [f"i{k}"]),
            helper.make_node("Cast", [f"i{k}"], [f"f{k}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["s", f"ws{k}"], [f"m{k}"]),
            helper.make_node("Mul", [f"f{k}", f"m{k}"], [f"p{k}"]),
            helper.make_node("Add", [f"p{k}", f"b{k}"], [f"y{k}"]),
        ]
    graph = helper.make_graph(
        nodes,
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 12])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("y1", "y2", "s")[: 3 if scale_read else 2]
        ],
        inits,
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    ours = fastlayers.load(data)
    kind = "MatMulIntegerToFloat" if scale_read else "DynamicQuantizeMatMul"
    assert ours.op_types.count(f"com.microsoft::{kind}") == 2
    assert ("DynamicQuantizeLinear" in ours.op_types) == scale_read
    x = rng.standard_normal((3, 12)).astype(np.float32)
    for got, want in zip(
        ours.run(None, {"x": x}), ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ):
        np.testing.assert_array_equal(got, want)


def _dynamic_conv_export(torch, tmp_path, one_d=False):
    """A torch CNN (convolutions with and without bias, grouped, strided, padded, a residual
    Add, ReLU and SiLU) exported and quantized by ``quantize_dynamic``; its path and input shape."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    nn = torch.nn
    conv = nn.Conv1d if one_d else nn.Conv2d

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = conv(3, 8, 3, padding=1)
            self.b = conv(8, 8, 3, padding=1, groups=2, bias=False)
            self.c = conv(8, 12, 3, stride=2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            h = h + self.b(h)
            return nn.functional.silu(self.c(h))

    torch.manual_seed(3)
    shape = (2, 3, 17) if one_d else (2, 3, 9, 11)
    float_path, path = tmp_path / "conv.onnx", tmp_path / "conv_dynamic.onnx"
    _export_batch_dynamic(torch, Net(), shape, float_path)
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(float_path, path, weight_type=QuantType.QInt8, reduce_range=True)
    return path, shape


@pytest.mark.parametrize("one_d", [False, True], ids=["2d", "1d"])
@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_quantized_convolutions_fuse_bit_for_bit(torch, tmp_path, rng, isa, monkeypatch, one_d, threads):
    """quantize_dynamic's convolutions (DynamicQuantizeLinear -> ConvInteger -> Add of the bias
    quantized at run time by Div / Floor / Cast / Reshape -> Cast -> Mul by the scales' product;
    without a bias, no Add) each become one FusedConvInteger, the bias added and the scale applied
    in the native kernel's store: bit for bit the graph's own nodes on every ISA path, grouped
    and strided, 1-D and 2-D, at 1 and 2 threads, and onnxruntime's output bit for bit on the
    vector paths (the generic path's SiLU differs from onnxruntime's by an ulp here and there,
    fused or not)."""
    import fastlayers
    from fastlayers.onnx import qfusion

    ort = oracle("onnxruntime")
    path, shape = _dynamic_conv_export(torch, tmp_path, one_d)
    ours = fastlayers.load(path)
    assert ours.op_types.count("FusedConvInteger") == 3
    assert not {"ConvInteger", "Cast", "Floor", "Div"} & set(ours.op_types)
    monkeypatch.setattr(qfusion, "fuse_integer_conv", lambda nodes, constants, outputs: nodes)
    unfused = fastlayers.load(path)
    assert unfused.op_types.count("ConvInteger") == 3
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with fastlayers.using_threads(threads):
        for batch in (2, 1):
            x = rng.standard_normal((batch, *shape[1:])).astype(np.float32) * 3
            got = ours.run(None, {"x": x})[0]
            np.testing.assert_array_equal(got, unfused.run(None, {"x": x})[0])
            want = theirs.run(None, {"x": x})[0]
            if isa == "generic":
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
            else:
                np.testing.assert_array_equal(got, want)


def test_a_dynamic_quantized_convolution_whose_scales_are_read_elsewhere_stays_unfused(tmp_path, rng):
    """Where the scales' product is also a graph output, the chain keeps its nodes (and its
    result)."""
    from onnx import TensorProto, helper, numpy_helper

    import fastlayers

    ort = oracle("onnxruntime")
    w = rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
        helper.make_node("ConvInteger", ["q", "w", "z"], ["acc"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s", "ws"], ["m"]),
        helper.make_node("Mul", ["f", "m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "m")],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.02, np.float32), "ws")],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    ours = fastlayers.load(data)
    assert "FusedConvInteger" not in ours.op_types and "ConvInteger" in ours.op_types
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, expected in zip(ours.run(None, {"x": x}), want):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "kind,mode,ops",
    [
        # quantize_dynamic's MatMulInteger -> Cast -> Mul -> Add chains run as one MatMulIntegerToFloat,
        # with their DynamicQuantizeLinear as one DynamicQuantizeMatMul
        ("mlp", "dynamic", {"com.microsoft::DynamicQuantizeMatMul"}),
        # and its ConvInteger -> Add (bias quantized at run time) -> Cast -> Mul chains as FusedConvInteger
        ("cnn", "dynamic", {"FusedConvInteger", "com.microsoft::DynamicQuantizeMatMul"}),
        ("lstm", "dynamic", {"com.microsoft::DynamicQuantizeLSTM"}),
        ("encoder", "dynamic", {"com.microsoft::DynamicQuantizeMatMul"}),
        ("mlp", "static", {"com.microsoft::QGemm"}),
        ("cnn", "static", {"QLinearConv", "com.microsoft::QGemm"}),
        ("encoder", "static", {"FusedQuantizeDequantize"}),
    ],
)
def test_onnxruntime_quantized_torch_exports_match_onnxruntime(torch, tmp_path, rng, kind, mode, ops):
    """Dynamic quantization: integer products, float outputs, within 1e-4 relative of
    onnxruntime. Static (QDQ) quantization: the node units onnxruntime runs as integer
    operators run as the same operators (QLinearConv, QGemm: bit for bit); units left in float (each
    QuantizeLinear / DequantizeLinear pair one FusedQuantizeDequantize node) agree within a few
    steps of the output's scale (an intermediate value rounding to the neighbouring step moves
    the output by about one)."""
    import fastlayers

    ort = oracle("onnxruntime")
    path, shape = _quantized_export(torch, tmp_path, kind, mode)
    ours = fastlayers.load(path)
    assert ops <= set(ours.op_types)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # see test_dynamic_quantize_lstm_matches_onnxruntime
    theirs = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for batch in (2, 1, 3):
        x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
        got, want = ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0]
        if mode == "dynamic":
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        elif kind in ("mlp", "cnn"):
            np.testing.assert_array_equal(got, want)
        else:
            steps = 3 if kind == "encoder" else 1
            np.testing.assert_allclose(got, want, rtol=0, atol=steps * _output_scale(path) * 1.001)


def test_onnxruntime_optimized_dynamic_model_loads(torch, tmp_path, rng):
    """onnxruntime's own optimized form of a dynamically quantized MLP (its graph optimizations
    write com.microsoft DynamicQuantizeMatMul nodes) loads and matches it."""
    import fastlayers

    ort = oracle("onnxruntime")
    path, shape = _quantized_export(torch, tmp_path, "mlp", "dynamic")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    theirs = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ours = fastlayers.load(tmp_path / "optimized.onnx")
    assert ours.op_types.count("com.microsoft::DynamicQuantizeMatMul") == 2
    # their constant weights packed once at load for the native integer kernel
    assert sum("_b_packed" in attrs for _, _, _, attrs, _ in ours._plan) == 2
    x = rng.standard_normal((4,) + shape[1:]).astype(np.float32)
    want = theirs.run(None, {"x": x})[0]
    np.testing.assert_allclose(ours(x), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


# ------------------------------------------------------------------------------------ errors
def test_malformed_quantization_parameters_raise_naming_the_node(rng):
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    f, i8, u8 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8
    q = rng.integers(-128, 128, (4, 3)).astype(np.int8)

    def dq(scale, zp, **attrs):
        inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
        return _model(
            [
                helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], name="dq_w", **attrs),
                helper.make_node("MatMul", ["x", "w"], ["y"]),
            ],
            [_tensor("x", f, [None, 4])],
            [_tensor("y", f, None)],
            inits,
        )

    # constants: refused at load, naming the node
    with pytest.raises(ModelFileError, match="dq_w.*zero point of type uint8, expected int8"):
        _load(dq(np.float32(0.1), np.uint8(0)))
    with pytest.raises(ModelFileError, match=r"dq_w.*scale of shape \(4,\).*axis 1"):
        _load(dq(np.ones(4, np.float32), np.zeros(4, np.int8), axis=1))
    with pytest.raises(ModelFileError, match=r"dq_w.*zero point of shape \(2,\) for a scale of shape \(3,\)"):
        _load(dq(np.ones(3, np.float32), np.zeros(2, np.int8), axis=1))
    with pytest.raises(ModelFileError, match="dq_w.*scale of type int32"):
        _load(dq(np.int32(1), np.int8(0)))
    # inputs of a call: refused when the node runs, naming it
    proto = _model(
        [helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"], name="mmi")],
        [_tensor("a", u8, [2, 3]), _tensor("b", i8, [3, 2]), _tensor("za", i8, [])],
        [_tensor("y", TensorProto.INT32, None)],
    )
    model = _load(proto)
    a, b = np.zeros((2, 3), np.uint8), np.zeros((3, 2), np.int8)
    with pytest.raises(InputError, match="mmi.*A zero point of type int8, expected uint8"):
        model(a, b, np.int8(0))
    proto = _model(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi16")],
        [_tensor("a", TensorProto.INT16, [2, 3]), _tensor("b", i8, [3, 2])],
        [_tensor("y", TensorProto.INT32, None)],
    )
    with pytest.raises(UnsupportedError, match="mmi16.*int16"):
        _load(proto)(a.astype(np.int16), b)
    proto = _model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q32")],
        [_tensor("x", f, [3]), _tensor("s", f, []), _tensor("z", TensorProto.INT32, [])],
        [_tensor("y", TensorProto.INT32, None)],
    )
    with pytest.raises(UnsupportedError, match="q32.*quantized type int32"):
        _load(proto)(np.zeros(3, np.float32), np.float32(1), np.int32(0))
    proto = _model(
        [helper.make_node("QLinearConv", ["x", "s", "zx", "w", "s", "zw", "s", "zy"], ["y"], name="qc")],
        [
            _tensor("x", u8, [1, 2, 4, 4]),
            _tensor("s", f, []),
            _tensor("zx", u8, []),
            _tensor("w", i8, [3, 2, 3, 3]),
            _tensor("zw", i8, [2]),
            _tensor("zy", u8, []),
        ],
        [_tensor("y", u8, None)],
    )
    with pytest.raises(ShapeError, match=r"qc.*w zero point of shape \(2,\) for 3 output channels"):
        _load(proto)(
            np.zeros((1, 2, 4, 4), np.uint8),
            np.float32(1),
            np.uint8(0),
            np.zeros((3, 2, 3, 3), np.int8),
            np.zeros(2, np.int8),
            np.uint8(0),
        )


def test_quantize_dequantize_pairs_fuse_only_where_nothing_else_reads_the_integers(rng, backend):
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(-4), "z")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    x = (rng.standard_normal((2, 3, 4, 5)) * 5).astype(np.float32)
    q = np.clip(np.rint(x / np.float32(0.05)) - 4, -128, 127)
    want = (q + 4).astype(np.float32) * np.float32(0.05)
    fused = _load(_model(nodes, [_tensor("x", f, None)], [_tensor("y", f, None)], inits))
    assert fused.op_types == ["FusedQuantizeDequantize"]
    np.testing.assert_array_equal(fused(x), want)
    kept = _load(
        _model(nodes, [_tensor("x", f, None)], [_tensor("y", f, None), _tensor("q", TensorProto.INT8, None)], inits)
    )
    assert kept.op_types == ["QuantizeLinear", "DequantizeLinear"]
    y, q_out = kept(x)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(q_out, q.astype(np.int8))


def test_a_huge_block_size_allocates_nothing_of_its_size():
    oracle("onnx")
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    proto = _model(
        [helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=1 << 40)],
        [_tensor("q", TensorProto.INT8, [2, 3]), _tensor("s", f, [2, 1])],
        [_tensor("y", f, None)],
    )
    q = np.arange(6, dtype=np.int8).reshape(2, 3)
    s = np.array([[0.5], [2.0]], np.float32)
    np.testing.assert_array_equal(_load(proto)(q, s), q * s)


@pytest.mark.parametrize(
    "kind,mode",
    [
        ("mlp", "dynamic"),
        ("cnn", "dynamic"),
        ("lstm", "dynamic"),
        ("encoder", "dynamic"),
        ("cnn", "static"),
        ("mlp", "static"),
    ],
)
def test_quantized_exports_agree_with_onnxruntime_node_by_node(torch, tmp_path, rng, backend, kind, mode):
    """Every intermediate value of onnxruntime.quantization's files, graph as written, equals
    onnxruntime's (integers exactly, floats within 1e-6 of the value's range) at batch 1 and 3,
    on both backends: a divergence is reported at the node that makes it."""
    from .nodewise import first_divergence

    oracle("onnxruntime")
    path, shape = _quantized_export(torch, tmp_path, kind, mode)
    for batch in (1, 3):
        x = rng.standard_normal((batch,) + shape[1:]).astype(np.float32)
        divergence = first_divergence(path.read_bytes(), {"x": x})
        assert divergence is None, f"batch {batch}: {divergence}"


def test_node_by_node_comparison_names_the_first_divergent_node(rng, monkeypatch):
    """A product off by one (fastlayers' MatMulInteger patched) is reported at that node, not at
    the Cast after it that inherits the difference; values that agree report nothing."""
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.onnx import ops

    from .nodewise import _difference, first_divergence

    oracle("onnxruntime")
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
        helper.make_node("MatMulInteger", ["q", "w", "z"], ["i"], name="mmi"),
        helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT, name="cast"),
    ]
    w = numpy_helper.from_array(rng.integers(0, 256, (6, 5)).astype(np.uint8), "w")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    feed = {"x": rng.standard_normal((2, 6)).astype(np.float32)}
    assert first_divergence(data, feed) is None
    product = ops.OPS["MatMulInteger"]
    monkeypatch.setitem(ops.OPS, "MatMulInteger", lambda inputs, attrs, opset: [product(inputs, attrs, opset)[0] + 1])
    divergence = first_divergence(data, feed)
    assert (divergence.node, divergence.op_type, divergence.output) == ("mmi", "MatMulInteger", "i")
    assert str(divergence) == "node 'mmi' (MatMulInteger) output 'i': 10 of 10 values differ (integers must be equal)"
    assert "relative 0.5" in _difference(np.array([2.0], np.float32), np.array([3.0], np.float32), 1e-6)
    assert "int32" in _difference(np.array([1], np.int64), np.array([1], np.int32), 1e-6)
