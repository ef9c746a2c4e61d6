"""ONNX import: the onnx package's backend node tests, torch exports against onnxruntime, errors."""

import warnings

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import FastlayersError, ModelFileError, UnsupportedError

from ..conftest import assert_close, oracle

# Element types fastlayers runs (float32, float64, float16, ints, bool); the node tests also
# cover float8/bfloat16/strings/sequences/optionals, which fastlayers does not take.
SUPPORTED_ELEM_TYPES = {1, 2, 3, 5, 6, 7, 9, 10, 11}
# Node tests of options fastlayers refuses with UnsupportedError (3-D convolution and pooling,
# cubic and antialiased Resize, MaxPool's Indices output, Attention's nonpad_kv_seqlen and
# sliding windows) or computes differently (deviations left open):
# averagepool_2d_ceil_last_window_starts_on_pad divides the window that starts in the padding
# by a count of its own (torch and fastlayers drop that window);
# attention_24_qk_matmul_output_mode3_softmax_precision computes the softmax at another precision;
# resize_downsample_scales_linear_align_corners takes the unrounded in_size * scale as the output
# length, where onnxruntime (and fastlayers after it: tests/onnx/test_resize.py) takes the
# output's integer length.
UNSUPPORTED_CASES = (
    "pool_3d",
    "convtranspose_3d",
    "cubic",
    "antialias",
    "with_argmax",
    "nonpad",
    "window",
    "padded_kv",
    "averagepool_2d_ceil_last_window_starts_on_pad",
    "softmax_precision",
    "resize_downsample_scales_linear_align_corners",
)


def _all_nodes(graph):
    """The nodes of an onnx GraphProto and of its subgraphs (If, Loop, Scan bodies)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == 5:  # GRAPH
                yield from _all_nodes(a.g)


def _tensor_typed(graph):
    """Whether every input and output of the graph's subgraphs is a tensor or left untyped (not
    a sequence or an optional, which fastlayers does not take)."""
    return all(
        v.type.WhichOneof("value") in (None, "tensor_type")
        for n in _all_nodes(graph)
        for a in n.attribute
        if a.type == 5
        for v in list(a.g.input) + list(a.g.output)
    )


def _node_cases():
    oracle("onnx")
    from onnx.backend.test.case import node

    from fastlayers.onnx.importer import MIN_OPSET
    from fastlayers.onnx.ops import OPS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    chosen = []
    for case in cases:
        g = case.model.graph
        opset = next((o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if (
            opset < MIN_OPSET
            or "training" in case.name
            or any(u in case.name for u in UNSUPPORTED_CASES)
            or any(n.op_type not in OPS or n.domain not in ("", "ai.onnx") for n in _all_nodes(g))
            or any(a.type == 10 for n in _all_nodes(g) for a in n.attribute)
            or not _tensor_typed(g)
            or any(v.type.tensor_type.elem_type not in SUPPORTED_ELEM_TYPES for v in list(g.input) + list(g.output))
            or any(np.asarray(a).dtype == object for inputs, _ in case.data_sets for a in inputs)
        ):
            continue
        chosen.append(case)
    return chosen


def test_onnx_backend_node_tests():
    """Every node test of the onnx package whose operators and types fastlayers supports."""
    from onnx import TensorProto, numpy_helper

    from fastlayers.io.onnx import from_proto

    cases = _node_cases()
    failures = []
    for case in cases:
        try:
            model = from_proto(case.model, case.name)
            for inputs, outputs in case.data_sets:
                got = model(*inputs)
                got = got if isinstance(got, list) else [got]
                for g, e in zip(got, outputs):
                    # (test_quantizelinear_blocked_symmetric stores its output as a TensorProto)
                    e = numpy_helper.to_array(e) if isinstance(e, TensorProto) else np.asarray(e)
                    g = np.asarray(g)
                    assert g.shape == e.shape, f"shape {g.shape} != {e.shape}"
                    if e.dtype.kind == "f":
                        half = e.dtype == np.float16
                        np.testing.assert_allclose(
                            g.astype(np.float64),
                            e.astype(np.float64),
                            rtol=1e-2 if half else 1e-4,
                            atol=1e-3 if half else 1e-5,
                        )
                    else:
                        np.testing.assert_array_equal(g, e)
        except Exception as exc:  # noqa: BLE001 - collected and reported together
            failures.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:200]}")
    assert not failures, f"{len(failures)} of {len(cases)} node tests failed:\n" + "\n".join(failures)
    assert len(cases) >= 1170  # the coverage this suite is meant to keep (1174 with onnx 1.23)


def export(torch, module, args, path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), dynamo=False, **kwargs)


ACTIVATIONS = [
    "ReLU",
    "GELU",
    "Tanh",
    "Sigmoid",
    "LeakyReLU",
    "ELU",
    "SELU",
    "Softplus",
    "Softsign",
    "Hardsigmoid",
    "Hardswish",
    "SiLU",
]


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_torch_mlp_export_matches_onnxruntime(torch, tmp_path, rng, backend, opset):
    ort = oracle("onnxruntime")
    layers = [torch.nn.Linear(6, 12)]
    for i, act in enumerate(ACTIVATIONS):
        layers += [getattr(torch.nn, act)(), torch.nn.Linear(12, 12)]
    layers += [torch.nn.Dropout(0.2), torch.nn.Linear(12, 5), torch.nn.LogSoftmax(-1)]
    model = torch.nn.Sequential(*layers)
    path = tmp_path / "mlp.onnx"
    export(
        torch,
        model,
        (torch.randn(2, 6),),
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}},
        opset_version=opset,
    )
    ours = fastlayers.load(path)
    assert "MatMul" not in ours.op_types and "Gemm" not in ours.op_types  # fused into dense nodes
    # the exported exact GELU became one Gelu node, then the activation of its dense node
    assert "Erf" not in ours.op_types and "Gelu" not in ours.op_types
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 7):
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        assert_close(ours(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_torch_transformer_encoder_export_matches_onnxruntime(torch, tmp_path, rng, backend):
    """With a key-padding mask the layers run node by node (tests/onnx/test_encoder.py has the
    mask-less layers, fused whole): their attention is one node each, their shape arithmetic is
    cached per input shape."""
    ort = oracle("onnxruntime")

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = torch.nn.LayerNorm(32)

        def forward(self, x, mask):
            return self.norm(self.enc(x, src_key_padding_mask=mask))

    path = tmp_path / "enc.onnx"
    export(
        torch,
        Encoder(),
        (torch.randn(2, 6, 32), torch.zeros(2, 6, dtype=torch.bool)),
        path,
        input_names=["x", "mask"],
        dynamic_axes={"x": {0: "batch"}, "mask": {0: "batch"}},
        opset_version=17,
    )
    ours = fastlayers.load(path)
    assert sum(step[4] for step in ours._plan) > 10  # shape computations, cached per input shape
    # q k^T, the two shape-derived sqrt scales, the mask, the softmax and the product by v: one
    # node per layer
    assert ours.op_types.count("FusedAttention") == 2
    assert not {"Softmax", "MatMul", "FusedEncoderLayer"} & set(ours.op_types)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 1, 3, 2):  # alternating shapes: the cache is keyed by them
        x = rng.standard_normal((batch, 6, 32)).astype(np.float32)
        mask = rng.random((batch, 6)) < 0.3
        mask[:, 0] = False
        assert_close(ours(x, mask), session.run(None, {"x": x, "mask": mask})[0], rtol=1e-4, atol=1e-5)


def make_graph(nodes, inputs, outputs, initializers=(), opset=17):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_unsupported_operators_listed_in_one_error(tmp_path):
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Det", ["a"], ["b"]),
        helper.make_node("Custom", ["b"], ["c"], domain="com.example"),
        helper.make_node("Det", ["c"], ["y"]),
    ]
    onnx.save(make_graph(nodes, [x], [y]), tmp_path / "u.onnx")
    with pytest.raises(UnsupportedError, match=r"u.onnx: unsupported ONNX operator\(s\): Det, com.example::Custom"):
        fastlayers.load(tmp_path / "u.onnx")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_nodes_fuse_into_dense_and_conv(tmp_path, rng, approximate):
    """An opset-20 Gelu after MatMul + Add or after Conv becomes the node's fused activation, in
    its exact or tanh form, with onnxruntime's result."""
    ort = oracle("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w, b = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Gelu", ["h"], ["y"], approximate=approximate),
        helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Gelu", ["c"], ["z"], approximate=approximate),
    ]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 5, 5]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(k, "k")],
        opset=20,
    )
    onnx.save(model, tmp_path / "gelu.onnx")
    ours = fastlayers.load(tmp_path / "gelu.onnx")
    assert sorted(ours.op_types) == ["FusedConv", "FusedDense"]
    feeds = {
        "x": rng.standard_normal((2, 8)).astype(np.float32),
        "img": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
    }
    session = ort.InferenceSession(str(tmp_path / "gelu.onnx"), providers=["CPUExecutionProvider"])
    for got, want in zip(ours(feeds), session.run(None, feeds)):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_constant_folding_dead_nodes_and_external_data(tmp_path, rng):
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["wT"], ["w"], perm=[1, 0]),  # folded at load
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),  # fused with MatMul
        helper.make_node("Relu", ["h"], ["y"]),  # fused activation
        helper.make_node("Sigmoid", ["x"], ["unused"]),  # dead: removed
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "wT"), numpy_helper.from_array(b, "b")],
    )
    onnx.save(
        model,
        tmp_path / "ext.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=16,
    )
    assert (tmp_path / "ext.data").exists()
    ours = fastlayers.load(tmp_path / "ext.onnx")
    assert ours.op_types == ["FusedDense"]
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert_close(ours(x), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    with pytest.raises(fastlayers.errors.ShapeError, match=r"input 'x': expected shape \(\?, 64\), got \(3, 63\)"):
        ours(x[:, :63])


def test_corrupt_and_missing_external_data(tmp_path):
    oracle("onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(ModelFileError, match="junk.onnx"):
        fastlayers.load(tmp_path / "junk.onnx")


def test_many_threads_one_onnx_model(torch, tmp_path, rng):
    from concurrent.futures import ThreadPoolExecutor

    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4), torch.nn.Softmax(-1)
    )
    export(
        torch,
        model,
        (torch.randn(2, 8),),
        tmp_path / "t.onnx",
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
        opset_version=17,
    )
    ours = fastlayers.load(tmp_path / "t.onnx")
    xs = [rng.standard_normal((1 + i % 4, 8)).astype(np.float32) for i in range(400)]
    serial = [ours(x) for x in xs]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(ours, xs))
    for a, b in zip(parallel, serial):
        np.testing.assert_array_equal(a, b)


def test_torch_cnn_export_fuses_and_matches_onnxruntime(torch, tmp_path, rng, backend):
    ort = oracle("onnxruntime")
    tnn = torch.nn

    class CNN(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = tnn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), tnn.BatchNorm2d(8)
            self.c2, self.b2 = tnn.Conv2d(8, 8, 3, padding=1, groups=8), tnn.BatchNorm2d(8)
            self.pool, self.avg = tnn.MaxPool2d(3, 2, 1, ceil_mode=True), tnn.AvgPool2d(2, count_include_pad=False)
            self.up = tnn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
            self.t = tnn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
            self.c1d, self.fc = tnn.Conv1d(4, 4, 3, padding=1), tnn.Linear(4, 5)

        def forward(self, x):
            h = torch.relu(self.b1(self.c1(x)))
            h = tnn.functional.leaky_relu(self.b2(self.c2(h)), 0.1)
            h = self.t(self.up(self.avg(self.pool(h))))
            return torch.softmax(self.fc(self.c1d(h.flatten(2)).mean(-1)), -1)

    model = CNN().eval()
    with torch.no_grad():
        for bn in (model.b1, model.b2):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    path = tmp_path / "cnn.onnx"
    export(
        torch,
        model,
        (torch.randn(2, 3, 32, 32),),
        path,
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
        opset_version=17,
    )
    ours = fastlayers.load(path)
    assert ours.op_types[:2] == ["FusedConv", "FusedConv"]  # BatchNormalization and activation folded
    assert "BatchNormalization" not in ours.op_types and "Relu" not in ours.op_types
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        assert_close(ours(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_nchw_pooling_and_depthwise_on_graph_inputs_match_onnxruntime(torch, tmp_path, rng, backend):
    """Pooling and depthwise convolutions of NCHW graph inputs (2-D and 1-D) run on the NCHW
    kernels: ceil mode, padding counted or not, strides 1 and 2, a channel multiplier, a fused
    activation."""
    ort = oracle("onnxruntime")
    tnn = torch.nn

    class Planes(tnn.Module):
        def __init__(self):
            super().__init__()
            self.dw = tnn.Conv2d(4, 8, 3, stride=2, padding=1, groups=4)
            self.dw1 = tnn.Conv2d(4, 4, (3, 5), padding=(1, 2), groups=4)
            self.dw1d = tnn.Conv1d(4, 4, 3, padding=1, groups=4)

        def forward(self, x, s):
            f = tnn.functional
            return (
                f.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                f.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True),
                f.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
                torch.relu(self.dw(x)),
                self.dw1(x),
                f.max_pool1d(s, 3, 2),
                f.avg_pool1d(s, 2, 2),
                self.dw1d(s),
            )

    path = tmp_path / "planes.onnx"
    export(
        torch,
        Planes().eval(),
        (torch.randn(1, 4, 13, 21), torch.randn(1, 4, 19)),
        path,
        input_names=["x", "s"],
        opset_version=17,
    )
    ours = fastlayers.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 4, 13, 21)).astype(np.float32)
    s = rng.standard_normal((1, 4, 19)).astype(np.float32)
    got = ours(x, s)
    for a, b in zip(got, session.run(None, {"x": x, "s": s})):
        assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_conv_transpose_exports_match_onnxruntime_and_torch(torch, tmp_path, rng, backend):
    """ConvTranspose on NCHW graph inputs (the NCHW kernel: strides 1-3, dilation,
    output_padding, pads, groups, 1-D, a 1x1 input) and on a convolution's NHWC output (the
    NHWC kernel), batch 1 and 3, against onnxruntime and torch."""
    ort = oracle("onnxruntime")
    tnn = torch.nn

    class Up(tnn.Module):
        def __init__(self):
            super().__init__()
            self.s2 = tnn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1)
            self.s1 = tnn.ConvTranspose2d(6, 5, (2, 3), padding=(0, 1), dilation=(2, 1))
            self.s3 = tnn.ConvTranspose2d(
                6, 4, 3, stride=(3, 2), padding=(2, 0), groups=2, output_padding=(2, 1), bias=False
            )
            self.conv = tnn.Conv2d(6, 6, 3, padding=1)
            self.after = tnn.ConvTranspose2d(6, 3, 4, stride=2, padding=1)
            self.one_d = tnn.ConvTranspose1d(3, 2, 3, stride=2, padding=1, output_padding=1)
            self.tiny = tnn.ConvTranspose2d(6, 2, 3, stride=2)

        def forward(self, x, s, p):
            return (
                self.s2(x),
                self.s1(x),
                torch.relu(self.s3(x)),
                self.after(torch.relu(self.conv(x))),
                self.one_d(s),
                self.tiny(p),
            )

    path, module = tmp_path / "up.onnx", Up().eval()
    export(
        torch,
        module,
        (torch.randn(1, 6, 7, 9), torch.randn(1, 3, 11), torch.randn(1, 6, 1, 1)),
        path,
        input_names=["x", "s", "p"],
        dynamic_axes={"x": {0: "n"}, "s": {0: "n"}, "p": {0: "n"}},
        opset_version=17,
    )
    ours = fastlayers.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        feeds = {
            "x": rng.standard_normal((batch, 6, 7, 9)).astype(np.float32),
            "s": rng.standard_normal((batch, 3, 11)).astype(np.float32),
            "p": rng.standard_normal((batch, 6, 1, 1)).astype(np.float32),
        }
        got = ours(feeds["x"], feeds["s"], feeds["p"])
        with torch.no_grad():
            by_torch = module(*(torch.from_numpy(feeds[k]) for k in ("x", "s", "p")))
        for g, w, t in zip(got, session.run(None, feeds), by_torch):
            assert g.shape == w.shape
            assert_close(g, w, rtol=1e-5, atol=1e-5)
            assert_close(g, t.numpy(), rtol=1e-5, atol=1e-5)


def test_nhwc_views_between_ops_match_onnxruntime(torch, tmp_path, rng, backend):
    """Convolution and pooling outputs travel as NCHW views of NHWC memory: every kind of op
    that may receive one (residual Add, Relu, Concat and Slice on channels, a per-channel Mul,
    Transpose, Reshape, global pooling, a 1-D convolution chain) gives onnxruntime's result, and
    the model's outputs come back C-contiguous."""
    ort = oracle("onnxruntime")
    tnn = torch.nn

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = tnn.Conv2d(3, 6, 3, padding=1), tnn.Conv2d(6, 6, 3, padding=1)
            self.c, self.d = tnn.Conv2d(12, 5, 1), tnn.Conv1d(5, 4, 3, padding=1)
            self.e = tnn.Conv1d(4, 3, 1)
            self.scale = tnn.Parameter(torch.randn(1, 5, 1, 1))

        def forward(self, x):
            h = torch.relu(self.a(x))
            h = torch.relu(self.b(h) + h)  # residual Add, Relu
            h = torch.cat([h, tnn.functional.max_pool2d(h, 3, 1, 1)], 1)
            h = self.c(h)[:, :, 1:, :] * self.scale  # Slice, per-channel Mul
            seq = self.e(torch.relu(self.d(h.flatten(2))))  # 1-D chain on a Reshape
            return seq.transpose(1, 2), h.mean((2, 3)), h.permute(0, 2, 3, 1)

    path = tmp_path / "views.onnx"
    export(torch, Net().eval(), (torch.randn(2, 3, 9, 7),), path, input_names=["x"], opset_version=17)
    ours = fastlayers.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    got, want = ours(x), session.run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.flags.c_contiguous
        assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_nhwc_results_returned_as_nchw_copies(torch, tmp_path, rng):
    """Graph outputs that are NCHW / NCL views of NHWC memory (a depthwise convolution, a
    pooling, a 1-D convolution) come back C-contiguous and equal to onnxruntime's, through
    ``__call__`` and ``run``, as new arrays on each call."""
    ort = oracle("onnxruntime")
    tnn = torch.nn

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.dw, self.c1 = tnn.Conv2d(8, 8, 3, padding=1, groups=8), tnn.Conv1d(8, 5, 3)

        def forward(self, x):
            h = self.dw(x)
            return h, tnn.functional.max_pool2d(h, 3, 2, 1), self.c1(h.flatten(2))

    path = tmp_path / "nchw_out.onnx"
    export(torch, Net().eval(), (torch.randn(2, 8, 6, 5),), path, input_names=["x"], opset_version=17)
    ours = fastlayers.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    want = session.run(None, {"x": x})
    first = ours.run(None, {"x": x})
    for got in (ours(x), first, ours.run(None, {"x": x})):
        for g, w in zip(got, want):
            assert g.flags.c_contiguous and g.flags.owndata
            assert_close(g, w, rtol=1e-4, atol=1e-5)
    again = ours.run(None, {"x": x})
    assert not any(np.shares_memory(a, b) for a, b in zip(first, again))


def test_window_geometry_kept_per_input_shape(torch, tmp_path, rng):
    """Conv and pooling nodes keep the geometry they derive per input shape: calls on shapes
    that alternate (batch, height, width, 1-D lengths) each give onnxruntime's result."""
    ort = oracle("onnxruntime")
    tnn = torch.nn
    net = tnn.Sequential(
        tnn.Conv2d(3, 4, 3, stride=2, padding=1),
        tnn.MaxPool2d(2, 2, ceil_mode=True),
        tnn.AvgPool2d(3, 1, padding=1),
        tnn.Flatten(2),
        tnn.Conv1d(4, 2, 3, padding=2),
    )
    path = tmp_path / "shapes.onnx"
    export(
        torch,
        net,
        (torch.randn(1, 3, 9, 7),),
        path,
        input_names=["x"],
        opset_version=17,
        dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}},
    )
    ours = fastlayers.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 9, 7), (2, 3, 5, 11), (1, 3, 9, 7), (2, 3, 5, 11), (1, 3, 4, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        assert_close(ours(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_fast_path_equals_reference_recurrence(kind, gates, direction, layout, rng, backend):
    """The compiled time loops (gate blocks reordered) give the spec's recurrence."""
    from fastlayers.onnx.ops.recurrent import recurrent_fast, recurrent_reference

    nd, T, B, I, H = (2 if direction == "bidirectional" else 1), 5, 3, 4, 6
    extras = (
        [{}]
        + ([{"linear_before_reset": 1}] if kind == "GRU" else [])
        + ([{"activations": ["Relu"] * nd}] if kind == "RNN" else [])
    )
    for extra in extras:
        x = rng.standard_normal((B, T, I) if layout else (T, B, I)).astype(np.float32)
        ins = [
            x,
            (rng.standard_normal((nd, gates * H, I)) * 0.5).astype(np.float32),
            (rng.standard_normal((nd, gates * H, H)) * 0.5).astype(np.float32),
            (rng.standard_normal((nd, 2 * gates * H)) * 0.5).astype(np.float32),
            None,
            rng.standard_normal((B, nd, H) if layout else (nd, B, H)).astype(np.float32),
        ]
        if kind == "LSTM":
            ins.append(rng.standard_normal(ins[-1].shape).astype(np.float32))
        attrs = {"direction": direction, "layout": layout, "hidden_size": H, **extra}
        fast = recurrent_fast(kind, ins, attrs)
        assert fast is not None
        for got, want in zip(fast, recurrent_reference(kind, ins, attrs)):
            assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3)])
def test_recurrent_fast_path_prepares_weights_once(kind, gates, rng, monkeypatch):
    """The weights of an ONNX recurrent node are reordered and packed on the first call only (a
    transposed view made every call repack them: the LSTM classifier export ran 1.6x slower)."""
    from fastlayers.backends.cpu import recurrent
    from fastlayers.onnx.ops.recurrent import recurrent_fast

    packs = []
    pack = recurrent._pack_shares
    monkeypatch.setattr(recurrent, "_pack_shares", lambda w, **k: packs.append(w.shape) or pack(w, **k))
    T, B, I, H = 4, 8, 16, 32
    ins = [
        rng.standard_normal((T, B, I)).astype(np.float32),
        rng.standard_normal((1, gates * H, I)).astype(np.float32),
        rng.standard_normal((1, gates * H, H)).astype(np.float32),
    ]
    attrs = {"hidden_size": H}
    first = recurrent_fast(kind, ins, attrs)
    assert packs
    packs.clear()
    second = recurrent_fast(kind, ins, attrs)
    assert packs == []
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
@pytest.mark.parametrize("threads", [2], indirect=True)
def test_bidirectional_directions_at_once_match_onnxruntime(kind, gates, threads, rng, monkeypatch):
    """A bidirectional node's two directions run at once, one thread each (``rnn_loops``),
    and give onnxruntime's Y, Y_h (and Y_c): batch 1 and 9, 19 units (vector tails), initial
    states, one step and several."""
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.backends.cpu import recurrent
    from fastlayers.native import _core

    ort = oracle("onnxruntime")
    monkeypatch.setattr(recurrent, "MIN_CALL_MADDS", 0)
    runs = []
    monkeypatch.setattr(_core, "rnn_loops", lambda calls, _f=_core.rnn_loops: runs.append(len(calls)) or _f(calls))
    I, H = 5, 19
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
        for n, s in [("W", (2, gates * H, I)), ("R", (2, gates * H, H)), ("B", (2, 2 * gates * H))]
    ]
    states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
    outs = ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    node = helper.make_node(
        kind,
        ["x", "W", "R", "B", "", *states],
        outs,
        hidden_size=H,
        direction="bidirectional",
        **({"linear_before_reset": 1} if kind == "GRU" else {}),
    )
    graph = helper.make_graph(
        [node],
        "bi",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["x", *states]],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    ours = fastlayers.load(model.SerializeToString())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for steps, batch in [(6, 1), (1, 9), (6, 9)]:
        feeds = {"x": rng.standard_normal((steps, batch, I)).astype(np.float32)}
        feeds.update({n: rng.standard_normal((2, batch, H)).astype(np.float32) for n in states})
        for got, want in zip(ours(*feeds.values()), session.run(None, feeds)):
            assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert runs == [2, 2, 2]


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("read_y", [True, False])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_streamed_recurrent_calls_bind_once_and_match_onnxruntime(kind, gates, layout, direction, read_y, threads, rng):
    """Silero VAD's way: one step per call, the states fed back. The node binds its loops once
    per input shape (``_bound``) and each call runs them on its own input and states: every
    call gives onnxruntime's outputs; a new batch size binds again; no initial state (zeros);
    Y a graph output or not (then only the final states are outputs, as in Silero VAD).
    onnxruntime has no batch-major layout: layout 1 is checked against its layout-0 node on
    the transposed values."""
    from onnx import TensorProto, helper, numpy_helper

    ort = oracle("onnxruntime")
    n_dir, I, H = 2 if direction == "bidirectional" else 1, 6, 21
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
        for n, s in [("W", (n_dir, gates * H, I)), ("R", (n_dir, gates * H, H)), ("B", (n_dir, 2 * gates * H))]
    ]
    states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
    outs = ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    graph_outs = outs if read_y else outs[1:]

    def model(with_states, node_layout):
        ins = ["x", "W", "R", "B", "", *states] if with_states else ["x", "W", "R", "B"]
        node = helper.make_node(
            kind, ins, outs if read_y else ["", *outs[1:]], hidden_size=H, direction=direction, layout=node_layout
        )
        graph = helper.make_graph(
            [node],
            "stream",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["x", *states][: len(ins) - 3]],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in graph_outs],
            inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()

    def oracle_run(session, feeds):
        """onnxruntime's outputs on ``feeds`` laid out as ``layout``."""
        if not layout:
            return session.run(None, feeds)
        swapped = {n: np.swapaxes(a, 0, 1) for n, a in feeds.items()}
        if not read_y:
            return [np.swapaxes(a, 0, 1) for a in session.run(None, swapped)]
        y, *rest = session.run(None, swapped)
        return [y.transpose(2, 0, 1, 3)] + [np.swapaxes(a, 0, 1) for a in rest]

    for with_states in (True, False):
        ours = fastlayers.load(model(with_states, layout))
        session = ort.InferenceSession(model(with_states, 0), providers=["CPUExecutionProvider"])
        for batch in (2, 3):
            state_shape = (batch, n_dir, H) if layout else (n_dir, batch, H)
            carried = {n: rng.standard_normal(state_shape).astype(np.float32) for n in states}
            for _ in range(4):
                x = rng.standard_normal((batch, 1, I) if layout else (1, batch, I))
                feeds = {"x": x.astype(np.float32), **(carried if with_states else {})}
                got = ours.run(None, feeds)
                want = oracle_run(session, feeds)
                assert len(got) == len(want) == len(graph_outs)
                for g, w in zip(got, want):
                    assert_close(g, w, rtol=1e-4, atol=1e-5)
                carried = dict(zip(states, got[1:] if read_y else got))
        bound = ours._plan[0][3]["_bound"]
        assert len(bound) == 2  # one binding per batch size
        if not read_y and direction != "bidirectional":  # the states-only form
            assert all("_one_direction_states_only" in run.__qualname__ for run, _ in bound.values())


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3)])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_recurrent_node_matches_onnxruntime(kind, gates, threads, rng, monkeypatch):
    """One direction (forward and reverse) gives onnxruntime's Y, Y_h (and Y_c) at 1 and 2
    threads, the loops split however small the work (2 threads: units at batch 1, rows at batch
    9): 35 units (vector tails), initial states, one step and several, sequence_lens of every
    step (the compiled loops) and shorter ones (the reference recurrence); with Y a graph
    output and without (then nothing reads Y: the loops write no output per step)."""
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.backends.cpu import recurrent

    ort = oracle("onnxruntime")
    monkeypatch.setattr(recurrent, "MIN_CALL_MADDS", 0)
    monkeypatch.setattr(recurrent, "MIN_SHARE_MADDS", 0)
    splits = set()
    monkeypatch.setattr(recurrent, "_shares", lambda *a, _f=recurrent._shares: splits.add(_f(*a)) or _f(*a))
    written = set()
    monkeypatch.setattr(recurrent, "_outputs", lambda *a, _f=recurrent._outputs: written.add(a[3]) or _f(*a))
    I, H = 5, 35
    states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
    outs = ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    for direction, y_out in (("forward", True), ("reverse", True), ("forward", False)):
        inits = [
            numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
            for n, s in [("W", (1, gates * H, I)), ("R", (1, gates * H, H)), ("B", (1, 2 * gates * H))]
        ]
        node = helper.make_node(kind, ["x", "W", "R", "B", "lens", *states], outs, hidden_size=H, direction=direction)
        graph = helper.make_graph(
            [node],
            "one",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("lens", TensorProto.INT32, None),
                *[helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in states],
            ],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs[1 - y_out :]],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        ours = fastlayers.load(model.SerializeToString())
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for steps, batch, short in [(1, 1, False), (7, 1, False), (6, 9, False), (6, 9, True)]:
            lens = np.full(batch, steps, np.int32)
            if short:
                lens[::2] = rng.integers(1, steps, lens[::2].size)
            feeds = {"x": rng.standard_normal((steps, batch, I)).astype(np.float32), "lens": lens}
            feeds.update({n: rng.standard_normal((1, batch, H)).astype(np.float32) for n in states})
            for got, want in zip(ours.run(None, feeds), session.run(None, feeds), strict=True):
                assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert splits == ({(1, 1)} if threads == 1 else {(1, 2), (2, 1)})
    assert written == {True, False}


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_torch_recurrent_export_matches_onnxruntime(torch, tmp_path, rng, cell, bidirectional):
    """Embedding -> 2 recurrent layers: the first one reads the ids (the embedding folded into
    its input projection), the second the first one's output."""
    ort = oracle("onnxruntime")

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.rnn = getattr(torch.nn, cell)(8, 6, num_layers=2, batch_first=True, bidirectional=bidirectional)
            self.fc = torch.nn.Linear(6 * (2 if bidirectional else 1), 3)

        def forward(self, ids):
            out = self.rnn(self.emb(ids))[0]
            return torch.log_softmax(self.fc(out[:, -1]), -1)

    path = tmp_path / f"{cell}.onnx"
    export(
        torch,
        Classifier(),
        (torch.randint(0, 50, (2, 7)),),
        path,
        input_names=["ids"],
        dynamic_axes={"ids": {0: "batch", 1: "time"}},
        opset_version=17,
    )
    ours = fastlayers.load(path)
    assert cell in ours.op_types and f"Embedding{cell}" in ours.op_types
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, steps in [(1, 7), (3, 11), (8, 5)]:
        ids = rng.integers(0, 50, (batch, steps)).astype(np.int64)
        assert_close(ours(ids), session.run(None, {"ids": ids})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("through_transpose", [False, True])
@pytest.mark.parametrize("direction", ["bidirectional", "reverse"])
def test_embedding_gather_folds_into_recurrent_node(
    kind, gates, layout, through_transpose, direction, rng, monkeypatch
):
    """Gather(table, ids) -> [Transpose, whose shape is read too] -> RNN/GRU/LSTM with initial
    states, both directions or one (whose loop is bound at the first call and run with each
    call's ids and states after), negative ids: the folded node equals the same graph with the
    table as an input (unfolded) and onnxruntime, call after call; ids out of range fail as the
    Gather would; a shape's loop is bound (or found not to bind) once."""
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.io.onnx import from_proto
    from fastlayers.onnx.ops import recurrent as onnx_recurrent

    binds = []
    bind = onnx_recurrent._bind_recurrent
    monkeypatch.setattr(onnx_recurrent, "_bind_recurrent", lambda *a: binds.append(len(a)) or bind(*a))
    V, E, H, B, T, nd = 20, 5, 4, 3, 6, 2 if direction == "bidirectional" else 1
    ids_time_major = (layout == 0) != through_transpose
    ids_shape = [T, B] if ids_time_major else [B, T]
    table = rng.standard_normal((V, E)).astype(np.float32)
    weights = {
        "W": rng.standard_normal((nd, gates * H, E)),
        "R": rng.standard_normal((nd, gates * H, H)),
        "Bias": rng.standard_normal((nd, 2 * gates * H)),
        "h0": rng.standard_normal((B, nd, H) if layout else (nd, B, H)),
    }
    if kind == "LSTM":
        weights["c0"] = rng.standard_normal(weights["h0"].shape)
    inits = [numpy_helper.from_array((v * 0.5).astype(np.float32), k) for k, v in weights.items()]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("Shape", ["emb"], ["s"])]
    if through_transpose:  # (torch's exporter reads the batch size off the transposed values)
        nodes += [
            helper.make_node("Transpose", ["emb"], ["x"], perm=[1, 0, 2]),
            helper.make_node("Shape", ["x"], ["sx"]),
        ]
    states = ["h0"] + (["c0"] if kind == "LSTM" else [])
    nodes.append(
        helper.make_node(
            kind,
            ["x" if through_transpose else "emb", "W", "R", "Bias", "", *states],
            ["y", "yh"],
            hidden_size=H,
            direction=direction,
            layout=layout,
        )
    )
    outputs = (
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh")]
        + [helper.make_tensor_value_info("s", TensorProto.INT64, None)]
        + [  # the Shapes read the ids
            helper.make_tensor_value_info("sx", TensorProto.INT64, None)
        ]
        * through_transpose
    )
    ids_in = helper.make_tensor_value_info("ids", TensorProto.INT64, ids_shape)
    table_in = helper.make_tensor_value_info("table", TensorProto.FLOAT, [V, E])
    folded = from_proto(make_graph(nodes, [ids_in], outputs, inits + [numpy_helper.from_array(table, "table")]))
    plain = from_proto(make_graph(nodes, [ids_in, table_in], outputs, inits))
    assert f"Embedding{kind}" in folded.op_types and "Transpose" not in folded.op_types
    assert not [n for n in folded._nodes if n.op_type == "Gather" and n.inputs[0] == "table"]
    assert kind in plain.op_types
    for _ in range(3):  # the first call binds the one-direction loop, the others run it
        ids = rng.integers(-V, V, ids_shape)
        got, want = folded(ids), plain(ids, table)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert binds.count(5) == 1  # the folded node's (with its table): once
    if layout == 0:  # onnxruntime runs no batch-major (layout 1) recurrence
        ort = oracle("onnxruntime")
        session = ort.InferenceSession(
            make_graph(nodes, [ids_in], outputs, inits + [numpy_helper.from_array(table, "table")]).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
        for g, w in zip(got, session.run(None, {"ids": ids})):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(FastlayersError, match="out of bounds"):
        folded(np.full(ids_shape, V))


# (name, rank, k as K^T input, scale placement, mask): the spellings fuse_attention reads
ATTENTION_GRAPHS = [
    ("q and k^T scaled, K transposed", 4, False, "qk", False),
    ("scores scaled", 4, False, "scores", False),
    ("scores divided, mask", 4, False, "div", True),
    ("K^T given, no scale", 4, True, "", False),
    ("rank 3, q scaled, mask", 3, False, "q", True),
    ("rank 3, K^T given, scores scaled", 3, True, "scores", False),
]


def attention_graph(rng, rank, kt_input, scale, mask, softmax_axis=-1, scores_out=False, k_batch=None):
    """A hand-built attention graph: MatMul(Q', K'^T) [scale] [+ mask] -> Softmax -> MatMul V,
    with the scales as constants (and the q/k form as the TorchScript exporter writes it)."""
    from onnx import TensorProto, helper, numpy_helper

    lead = (2, 3) if rank == 4 else (6,)
    tq, tk, d, dv = 5, 7, 4, 3
    shapes = {"q": (*lead, tq, d), "k": (*(k_batch or lead), *((d, tk) if kt_input else (tk, d))), "v": (*lead, tk, dv)}
    inits, nodes = [], []
    root = np.float32((1 / np.sqrt(d)) ** 0.5)
    inits.append(numpy_helper.from_array(np.array([root], np.float32), "root"))
    inits.append(numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "sqrt_d"))
    inits.append(numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "inv_sqrt_d"))
    q, kt = "q", "k"
    if not kt_input:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=list(range(rank - 2)) + [rank - 1, rank - 2]))
        kt = "kt"
    if scale in ("qk", "q"):
        nodes.append(helper.make_node("Mul", ["q", "root"], ["qs"]))
        q = "qs"
    if scale == "qk":
        nodes.append(helper.make_node("Mul", ["root", kt], ["kts"]))  # scale first: either order
        kt = "kts"
    nodes.append(helper.make_node("MatMul", [q, kt], ["s"]))
    scores = "s"
    if scale == "scores":
        nodes.append(helper.make_node("Mul", ["s", "inv_sqrt_d"], ["ss"]))
        scores = "ss"
    elif scale == "div":
        nodes.append(helper.make_node("Div", ["s", "sqrt_d"], ["ss"]))
        scores = "ss"
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in ("q", "k", "v")]
    feeds = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in ("q", "k", "v")}
    if mask:
        m = np.where(rng.random((lead[0], *[1] * (rank - 3), 1, tk)) < 0.3, -np.inf, 0)
        m = (m + rng.standard_normal(m.shape) * 0.5).astype(np.float32)
        m[..., :2] = 0.0  # no row fully masked
        inits.append(numpy_helper.from_array(m, "mask"))
        nodes.append(helper.make_node("Add", ["mask", scores], ["sm_in"]))
        scores = "sm_in"
    nodes.append(helper.make_node("Softmax", [scores], ["w"], axis=softmax_axis))
    nodes.append(helper.make_node("MatMul", ["w", "v"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if scores_out:
        outputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, None))
    return make_graph(nodes, inputs, outputs, inits), feeds


@pytest.mark.parametrize("name,rank,kt_input,scale,mask", ATTENTION_GRAPHS, ids=[g[0] for g in ATTENTION_GRAPHS])
def test_attention_subgraph_fuses_and_matches_onnxruntime(rng, backend, name, rank, kt_input, scale, mask):
    """Each spelling of scaled dot-product attention becomes one FusedAttention node (nothing
    else left) with onnxruntime's result."""
    ort = oracle("onnxruntime")
    from fastlayers.io.onnx import from_proto

    model, feeds = attention_graph(rng, rank, kt_input, scale, mask)
    ours = from_proto(model)
    assert ours.op_types == ["FusedAttention"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(ours(feeds), session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["weights are an output", "softmax over another axis", "K broadcast over the batch"])
def test_attention_subgraph_left_or_run_as_written(rng, case):
    """Not fused where the weights are read elsewhere; fused but run with the graph's own
    broadcasting where K's leading axes differ from Q's, and with its own Softmax where that is
    not over the keys (a positive axis is the keys' only on scores of one rank)."""
    ort = oracle("onnxruntime")
    from fastlayers.io.onnx import from_proto

    kw = {
        "weights are an output": {"scores_out": True},
        "softmax over another axis": {"softmax_axis": 2},
        "K broadcast over the batch": {"k_batch": (1, 3)},
    }[case]
    model, feeds = attention_graph(rng, 4, False, "scores", True, **kw)
    ours = from_proto(model)
    assert ("FusedAttention" in ours.op_types) == (case != "weights are an output")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ours(feeds)
    for g, w in zip(got if isinstance(got, list) else [got], session.run(None, feeds)):
        assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("rank", [3, 4])
def test_attention_with_a_positive_softmax_axis_fuses(rng, opset, rank):
    """A Softmax over the scores' last axis given as a positive number (axis 3 on 4-D scores,
    2 on 3-D; before opset 13 the 2-D coercion at the last axis, the same thing) fuses: one
    FusedAttention node, onnxruntime's result."""
    ort = oracle("onnxruntime")
    from fastlayers.io.onnx import from_proto

    model, feeds = attention_graph(rng, rank, False, "scores", True, softmax_axis=rank - 1)
    model.opset_import[0].version = opset
    ours = from_proto(model)
    assert ours.op_types == ["FusedAttention"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(ours(feeds), session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def svtr_attention_graph(rng, batch=2, tokens=6, heads=3, head_dim=5, scale_shape=(1,)):
    """Self-attention as PaddlePaddle's exporter writes SVTR's blocks (PP-OCR recognisers):
    qkv (batch, tokens, 3 C) -> Reshape (0, -1, 3, H, D) -> Transpose (2, 0, 3, 1, 4) -> Slice +
    Squeeze per q, k, v; q * scale (a (1,) constant) reshaped to Shape(q) through Identity
    nodes; MatMul(q, Transpose(k, 0 1 3 2)) -> Softmax(axis=3) -> MatMul(., v) -> Transpose ->
    Reshape (0, -1, C). (model, feeds)."""
    from onnx import TensorProto, helper, numpy_helper

    c = heads * head_dim
    consts = {
        "split": np.array([0, -1, 3, heads, head_dim], np.int64),
        "scale": np.full(scale_shape, head_dim**-0.5, np.float32),
        "back": np.array([0, -1, c], np.int64),
        "axis0": np.array([0], np.int64),
        **{f"s{i}": np.array([i], np.int64) for i in range(4)},
    }
    nodes = [
        helper.make_node("Reshape", ["qkv", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
    ]
    for i, name in enumerate("qkv"):
        nodes += [
            helper.make_node("Slice", ["t", f"s{i}", f"s{i + 1}", "axis0", "s1"], [f"{name}_sl"]),
            helper.make_node("Squeeze", [f"{name}_sl", "axis0"], [name + "_"]),
        ]
    nodes += [
        helper.make_node("Identity", ["q_"], ["q_id"]),
        helper.make_node("Shape", ["q_"], ["q_shape"]),
        helper.make_node("Mul", ["q_id", "scale"], ["qs"]),
        helper.make_node("Reshape", ["qs", "q_shape"], ["qs_r"]),
        helper.make_node("Identity", ["qs_r"], ["q_scaled"]),
        helper.make_node("Transpose", ["k_"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_scaled", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["w"], axis=3),
        helper.make_node("Identity", ["w"], ["w_id"]),
        helper.make_node("MatMul", ["w_id", "v_"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "back"], ["y"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [batch, tokens, 3 * c])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    return model, {"qkv": rng.standard_normal((batch, tokens, 3 * c)).astype(np.float32)}


@pytest.mark.parametrize("scale_shape", [(1,), ()])
def test_svtr_attention_from_paddle_fuses(rng, scale_shape):
    """SVTR's attention as PaddlePaddle exports it (a positive Softmax axis, the scaled q
    reshaped to its own shape) becomes one FusedAttention node reading the q, k and v slices:
    no MatMul, Softmax or Mul left; onnxruntime's result."""
    ort = oracle("onnxruntime")
    from fastlayers.io.onnx import from_proto

    model, feeds = svtr_attention_graph(rng, scale_shape=scale_shape)
    ours = from_proto(model)
    assert ours.op_types.count("FusedAttention") == 1
    assert not {"MatMul", "Softmax", "Mul", "Shape"} & set(ours.op_types)
    assert [n.op_type for n in ours._nodes].count("Reshape") == 2  # the split and the merge of the heads
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert_close(ours(feeds), session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def _masked_recurrent_model(kind, gates, direction, rng, hidden=7, inputs=5, domain_import=True, states=False):
    """A graph of one ai.fastlayers Masked<kind> node and its standard twin reading
    sequence_lens (the same weights; with ``states``, both read the inputs initial_h (and
    initial_c) after it): (masked model bytes, twin model bytes, outputs)."""
    from onnx import TensorProto, helper, numpy_helper

    nd = 2 if direction == "bidirectional" else 1
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
        for n, s in [
            ("W", (nd, gates * hidden, inputs)),
            ("R", (nd, gates * hidden, hidden)),
            ("B", (nd, 2 * gates * hidden)),
        ]
    ]
    outs = ["Y", "Y_h", "Y_c"][: 3 if kind == "LSTM" else 2]
    attrs = {"hidden_size": hidden, "direction": direction, **({"linear_before_reset": 1} if kind == "GRU" else {})}
    initial = ["initial_h", "initial_c"][: 2 if kind == "LSTM" else 1] if states else []
    made = []
    for masked in (True, False):
        if masked:
            node = helper.make_node(
                f"Masked{kind}",
                ["x", "W", "R", "B", "mask", *initial],
                outs,
                domain="ai.fastlayers",
                zero_output_for_mask=1,
                **attrs,
            )
            extra = [helper.make_tensor_value_info("mask", TensorProto.BOOL, None)]
        else:
            node = helper.make_node(kind, ["x", "W", "R", "B", "lens", *initial], outs, **attrs)
            extra = [helper.make_tensor_value_info("lens", TensorProto.INT32, None)]
        graph = helper.make_graph(
            [node],
            "masked",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                *extra,
                *(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in initial),
            ],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
            inits,
        )
        opsets = [helper.make_opsetid("", 17)] + (
            [helper.make_opsetid("ai.fastlayers", 1)] if masked and domain_import else []
        )
        made.append(helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString())
    return made[0], made[1], outs


@pytest.mark.parametrize("states", [False, True])
@pytest.mark.parametrize("kind,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_masked_recurrence_matches_sequence_lens_on_onnxruntime(kind, gates, direction, states, rng):
    """ai.fastlayers Masked<kind> (what compiled Keras graphs write under an Embedding's mask)
    read from a file, with and without initial states: with post-padding masks and
    zero_output_for_mask, its outputs are those of ONNX's node with sequence_lens on
    onnxruntime (Y zero past each length), on the Python plan and the native plan's loops."""
    ort = oracle("onnxruntime")
    masked, twin, _ = _masked_recurrent_model(kind, gates, direction, rng, states=states)
    ours = fastlayers.load(masked)
    session = ort.InferenceSession(twin, providers=["CPUExecutionProvider"])
    nd = 2 if direction == "bidirectional" else 1
    initial = [rng.standard_normal((nd, 3, 7)).astype(np.float32) for _ in range(2 if kind == "LSTM" else 1)]
    initial = initial if states else []
    for lens in ([6, 2, 4], [1, 6, 3], [6, 6, 6]):
        x = rng.standard_normal((6, 3, 5)).astype(np.float32)
        mask = np.arange(6)[None, :] < np.array(lens)[:, None]
        named = dict(zip(["initial_h", "initial_c"], initial))
        want = session.run(None, {"x": x, "lens": np.array(lens, np.int32), **named})
        for _ in range(3):  # the Python plan, then the native plan built at the second call
            for got, w in zip(ours(x, mask, *initial), want):
                assert_close(got, w, rtol=1e-4, atol=1e-5)
    plan = ours._native.plan_for([x, mask, *initial])
    assert plan is not None and f"ai.fastlayers::Masked{kind}" in plan.summary[0]


def test_masked_recurrence_refuses_bad_masks_and_a_missing_domain(rng):
    from fastlayers.errors import ShapeError

    masked, _, _ = _masked_recurrent_model("LSTM", 4, "forward", rng)
    ours = fastlayers.load(masked)
    x = rng.standard_normal((6, 3, 5)).astype(np.float32)
    with pytest.raises(ShapeError, match=r"MaskedLSTM: mask of shape \(3, 5\) \(bool\), expected \(3, 6\) bool"):
        ours(x, np.ones((3, 5), bool))
    unimported, _, _ = _masked_recurrent_model("LSTM", 4, "forward", rng, domain_import=False)
    with pytest.raises(ModelFileError, match="no opset import for that domain"):
        fastlayers.load(unimported)
