"""ONNX load-time rewrites (``fastlayers/onnx/rewrite.py``, activations in ``onnx.model.fuse_dense``
/ ``fuse_conv``): each pattern gone from the optimised graph, results as onnxruntime's."""

import numpy as np
import pytest

import fastlayers

from ..conftest import assert_close, in_threads, oracle
from .test_import import export, make_graph


def _session(path):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _matches_ort(ours, path, feeds, rtol=1e-5, atol=1e-5):
    got = ours(feeds)
    got = got if isinstance(got, list) else [got]
    want = _session(path).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, rtol=rtol, atol=atol)


def test_noop_nodes_dropped_outputs_keep_their_names(tmp_path, rng):
    """Identity, Dropout, a Cast to the input's type, an identity Transpose, Add 0, Mul / Div by 1,
    Unsqueeze -> Squeeze and a Flatten -> Reshape chain leave Relu, one Reshape and Tanh; the
    graph output made by an Identity keeps its name."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "zero": np.array(0, np.float32),
        "one": np.array(1, np.float32),
        "ax": np.array([1], np.int64),
        "shape": np.array([-1, 4, 3], np.int64),
    }
    nodes = [
        helper.make_node("Identity", ["x"], ["a"]),
        helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
        helper.make_node("Dropout", ["b"], ["c"]),
        helper.make_node("Transpose", ["c"], ["d"], perm=[0, 1, 2]),
        helper.make_node("Add", ["d", "zero"], ["e"]),
        helper.make_node("Mul", ["one", "e"], ["f"]),
        helper.make_node("Div", ["f", "one"], ["g"]),
        helper.make_node("Relu", ["g"], ["h"]),
        helper.make_node("Unsqueeze", ["h", "ax"], ["i"]),
        helper.make_node("Squeeze", ["i", "ax"], ["j"]),
        helper.make_node("Flatten", ["j"], ["k"], axis=1),
        helper.make_node("Reshape", ["k", "shape"], ["m"]),
        helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("Identity", ["t"], ["y"]),
        helper.make_node("Identity", ["t"], ["y2"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    onnx.save(model, tmp_path / "noop.onnx")
    ours = fastlayers.load(tmp_path / "noop.onnx")
    # Tanh makes y; y2, another output, is an Identity of it
    assert ours.op_types == ["Relu", "Reshape", "Tanh", "Identity"]
    assert [o.name for o in ours.get_outputs()] == ["y", "y2"]
    _matches_ort(ours, tmp_path / "noop.onnx", {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


def test_casts_to_the_type_a_value_has_dropped_in_branches_too(tmp_path, rng):
    """A Cast to float32 after Pad, Abs, Sqrt and an LSTM's final state, a Cast to bool after
    a comparison, and Casts in an If's branches to the float32 type of the outer value they
    read are dropped; the Cast of bool to float32 stays. Results as onnxruntime's."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f32 = TensorProto.FLOAT

    def branch(name, op):
        return helper.make_graph(
            [
                helper.make_node("Cast", ["y"], [f"{name}_c"], to=f32),
                helper.make_node(op, [f"{name}_c"], [f"{name}_out"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", f32, None)],
        )

    h = 3
    consts = {
        "pads": np.array([0, 1, 0, 1], np.int64),
        "one": np.array(1, np.float32),
        "W": rng.standard_normal((1, 4 * h, 7)).astype(np.float32),
        "R": rng.standard_normal((1, 4 * h, h)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Cast", ["p"], ["pc"], to=f32),
        helper.make_node("Abs", ["pc"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Cast", ["s"], ["sc"], to=f32),
        helper.make_node("Less", ["sc", "one"], ["lt"]),
        helper.make_node("Cast", ["lt"], ["ltc"], to=TensorProto.BOOL),
        helper.make_node("Not", ["ltc"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=f32),
        helper.make_node("Add", ["sc", "nf"], ["t"]),
        helper.make_node("Unsqueeze", ["t", "zero"], ["seq"]),
        helper.make_node("LSTM", ["seq", "W", "R"], ["", "yh"], hidden_size=h),
        helper.make_node("Cast", ["yh"], ["y"], to=f32),
        helper.make_node("If", ["cond"], ["out"], then_branch=branch("then", "Neg"), else_branch=branch("else", "Abs")),
    ]
    consts["zero"] = np.array([0], np.int64)
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", f32, [2, 5]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", f32, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    onnx.save(model, tmp_path / "casts.onnx")
    ours = fastlayers.load(tmp_path / "casts.onnx")
    assert ours.op_types.count("Cast") == 1
    branches = next(n.attrs for n in ours._nodes if n.op_type == "If")
    # each branch's one node a one-node elementwise program
    assert [branches[k].model.op_types for k in ("then_branch", "else_branch")] == [["FusedElementwise"]] * 2
    assert [branches[k].model._nodes[0].attrs["_ops"] for k in ("then_branch", "else_branch")] == ["Neg", "Abs"]
    for cond in (True, False):
        _matches_ort(
            ours, tmp_path / "casts.onnx", {"x": rng.standard_normal((2, 5)).astype(np.float32), "cond": np.array(cond)}
        )


def test_noops_kept_where_they_change_something(tmp_path, rng):
    """A Cast to another type, Add of a vector 0 (it may broadcast), a Dropout whose mask is read,
    an Identity of a graph input that is the output, and a Cast to double after a Relu on
    doubles (which computes float32 here) stay."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Cast", ["x"], ["a"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["b", "zeros"], ["c"]),
        helper.make_node("Dropout", ["c"], ["y", "mask"]),
        helper.make_node("Identity", ["x"], ["z"]),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("Cast", ["r"], ["w"], to=TensorProto.DOUBLE),
    ]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("xd", TensorProto.DOUBLE, [2]),
        ],
        [
            helper.make_tensor_value_info(n, t, None)
            for n, t in (
                ("y", TensorProto.FLOAT),
                ("mask", TensorProto.BOOL),
                ("z", TensorProto.FLOAT),
                ("w", TensorProto.DOUBLE),
            )
        ],
        [numpy_helper.from_array(np.zeros((2, 1, 3), np.float32), "zeros")],
    )
    onnx.save(model, tmp_path / "kept.onnx")
    ours = fastlayers.load(tmp_path / "kept.onnx")
    assert ours.op_types == ["Cast", "Cast", "Add", "Dropout", "Identity", "Relu", "Cast"]
    feeds = {"x": rng.standard_normal((2, 3)).astype(np.float32), "xd": rng.standard_normal(2)}
    assert ours(feeds)[-1].dtype == np.float64
    _matches_ort(ours, tmp_path / "kept.onnx", feeds)


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_reshapes_to_their_own_shape_dropped(tmp_path, rng, rank):
    """Reshape(u, Shape(u)) and Reshape(Mul(u, c), Shape(u)) with a (1,)-shaped c (the scaled
    queries of PaddlePaddle's SVTR exports) are dropped, the Mul taking c with no axes: on a
    0-d u the result keeps u's shape, as the Reshape made it. Kept where the Shape is partial
    or the arithmetic reads a second input. Results as onnxruntime's."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Relu", ["x"], ["u"]),
        helper.make_node("Shape", ["u"], ["su"]),
        helper.make_node("Identity", ["u"], ["u2"]),  # read through, as Paddle's exports write it
        helper.make_node("Mul", ["u2", "c"], ["m"]),
        helper.make_node("Reshape", ["m", "su"], ["r"]),
        helper.make_node("Reshape", ["r", "su"], ["r2"]),
        helper.make_node("Neg", ["r2"], ["y"]),
        # kept: a Shape from axis 0 to -1 on a rank-3 value (partial), and a Mul by an input
        helper.make_node("Shape", ["u"], ["partial"], start=0, end=-1),
        helper.make_node("Concat", ["partial", "minus_one"], ["shape2"], axis=0),
        helper.make_node("Mul", ["u", "x"], ["ux"]),
        helper.make_node("Reshape", ["ux", "su"], ["z"]),
    ]
    outputs = ["y", "z"]
    if rank != 3:  # the partial Shape and its Reshape for rank 3 only
        nodes = nodes[:7] + nodes[9:]
    else:
        nodes.append(helper.make_node("Reshape", ["u", "shape2"], ["w"]))
        outputs.append("w")
    shape = [2, 3, 4][:rank]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [
            numpy_helper.from_array(np.array([0.25], np.float32), "c"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    onnx.save(model, tmp_path / "own.onnx")
    ours = fastlayers.load(tmp_path / "own.onnx")
    kept = [n for n in ours._nodes if n.op_type == "Reshape"]
    assert [n.outputs[0] for n in kept] == ["z", "w"][: 1 + (rank == 3)]
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    _matches_ort(ours, tmp_path / "own.onnx", feeds)
    assert ours(feeds)[0].shape == tuple(shape)


def test_output_renamed_for_every_reader(tmp_path, rng):
    """Relu's output is read through one Identity by Neg and is, through another, the output y:
    Relu then makes y, and Neg reads y."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Identity", ["a"], ["b"]),
        helper.make_node("Identity", ["a"], ["y"]),
        helper.make_node("Neg", ["b"], ["z"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
    )
    onnx.save(model, tmp_path / "rename.onnx")
    ours = fastlayers.load(tmp_path / "rename.onnx")
    assert ours.op_types == ["Relu", "FusedElementwise"]  # the Neg a one-node program
    assert [(n.inputs, n.outputs) for n in ours._nodes] == [(["x"], ["y"]), (["y"], ["z"])]
    _matches_ort(ours, tmp_path / "rename.onnx", {"x": rng.standard_normal(3).astype(np.float32)})


class _ConvStack:
    """Conv -> * per-channel scale -> + per-channel shift -> activation, three times, then a
    dense head with a per-column scale and shift and SiLU (x * sigmoid(x))."""

    @staticmethod
    def build(torch):
        class Stack(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList(
                    [
                        torch.nn.Conv2d(3, 6, 3, padding=1),
                        torch.nn.Conv2d(6, 6, 3, padding=1, bias=False),
                        torch.nn.Conv2d(6, 4, 1),
                    ]
                )
                self.acts = torch.nn.ModuleList([torch.nn.ReLU6(), torch.nn.Hardsigmoid(), torch.nn.SiLU()])
                self.scale = torch.nn.Parameter(torch.rand(3, 1, 6, 1, 1) + 0.5)
                self.shift = torch.nn.Parameter(torch.randn(3, 6, 1, 1))
                self.fc = torch.nn.Linear(4 * 5 * 5, 7)
                self.col_scale = torch.nn.Parameter(torch.rand(7) + 0.5)
                self.col_shift = torch.nn.Parameter(torch.randn(7))

            def forward(self, x):
                for k, (conv, act) in enumerate(zip(self.convs, self.acts)):
                    c = conv.out_channels
                    x = act(conv(x) * self.scale[k, :, :c] + self.shift[k, :c])
                h = self.fc(x.flatten(1)) * self.col_scale + self.col_shift
                return h * torch.sigmoid(h)

        return Stack()


@pytest.mark.parametrize("opset", [13, 17])
def test_conv_and_dense_absorb_affine_and_activations(torch, tmp_path, rng, opset):
    """Per-channel Mul / Add after a Conv and per-column ones after a Linear fold into the
    weights and bias; ReLU6 (Clip 0..6), Hardsigmoid (alpha 1/6) and SiLU become the fused
    nodes' activations: three FusedConv and one FusedDense are left (and the Flatten)."""
    torch.manual_seed(0)
    path = tmp_path / "stack.onnx"
    export(
        torch,
        _ConvStack.build(torch),
        (torch.randn(2, 3, 5, 5),),
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}},
        opset_version=opset,
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedConv"] * 3 + ["Flatten", "FusedDense"]
    assert [n.attrs.get("activation") for n in ours._nodes] == ["relu6", "hard_sigmoid", "onnx_silu", None, "onnx_silu"]
    _matches_ort(ours, path, {"x": rng.standard_normal((3, 3, 5, 5)).astype(np.float32)}, rtol=1e-4)


class _AffineAfterActivation:
    """PP-LCNetV3's "learnable affine" blocks: Conv -> activation -> * scale -> + shift, the
    scale and shift one value each (its blocks), one per channel, a Mul alone and an Add alone;
    1-D and 2-D convolutions, a depthwise one among them."""

    @staticmethod
    def build(torch, one_d):
        conv = torch.nn.Conv1d if one_d else torch.nn.Conv2d
        view = (-1, 1) if one_d else (-1, 1, 1)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = conv(3, 8, 3, padding=1)
                self.b = conv(8, 8, 3, padding=1, groups=8)
                self.c = conv(8, 8, 1)
                self.d = conv(8, 5, 1)
                self.s = torch.nn.Parameter(torch.tensor([1.3]))
                self.t = torch.nn.Parameter(torch.tensor([-0.2]))
                self.sc = torch.nn.Parameter(torch.rand(8) + 0.5)
                self.tc = torch.nn.Parameter(torch.randn(8))

            def forward(self, x):
                x = torch.nn.functional.hardswish(self.a(x)) * self.s + self.t
                x = torch.relu(self.b(x)) * self.sc.view(view) + self.tc.view(view)
                x = torch.relu(self.c(x)) * self.s
                return torch.sigmoid(self.d(x)) + self.t

        return Net()


@pytest.mark.parametrize("one_d", [False, True], ids=["2d", "1d"])
@pytest.mark.parametrize("threads", [1, 2])
def test_affine_after_a_convolutions_activation_joins_it(torch, tmp_path, rng, one_d, threads):
    """A Mul and / or an Add by one value or one per channel after a convolution's activation
    become the FusedConv's ``_post_affine`` (y scale + shift per channel in place on the result,
    the profile saying "affine"): no Mul or Add node left, onnxruntime's results."""
    torch.manual_seed(1)
    path = tmp_path / "affine.onnx"
    shape = (2, 3, 11) if one_d else (2, 3, 7, 9)
    export(
        torch,
        _AffineAfterActivation.build(torch, one_d),
        (torch.randn(*shape),),
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "n"}},
        opset_version=17,
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedConv"] * 4
    assert sum(n.attrs.get("_post_affine") is not None for n in ours._nodes) == 4
    x = rng.standard_normal(shape).astype(np.float32)
    with fastlayers.using_threads(threads):
        _matches_ort(ours, path, {"x": x}, rtol=1e-5, atol=1e-6)
    assert [s.fused for s in ours.profile({"x": x}, repeats=1).steps].count("hard_silu+affine") == 1


def test_affine_constants_that_would_change_the_shape_stay_nodes(tmp_path, rng):
    """A Mul by a constant of more dimensions than the convolution's output (it broadcasts the
    result to a higher rank), or one along another axis, stays a node."""
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    for name, c in (
        ("rank", np.full((1, 1, 1, 1, 1), 2.0, np.float32)),
        ("axis", np.full((1, 1, 1, 5), 2.0, np.float32)),
    ):
        graph = helper.make_graph(
            [
                helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["c"], ["r"]),
                helper.make_node("Mul", ["r", "k"], ["y"]),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "k")],
        )
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
        ours = fastlayers.load(path)
        assert ours.op_types == ["FusedConv", "Mul"], name
        _matches_ort(ours, path, {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)})


def test_unfusable_bounds_and_shared_outputs_stay(tmp_path, rng):
    """Clip to [0, 3] and HardSigmoid with ONNX's default alpha 0.2 have no fused epilogue:
    they stay after the fused nodes, each a one-node elementwise program (HardSwish is the dense node's hard_silu); a Conv output that other nodes also read keeps
    its Mul, and its x * Sigmoid(x) is one Swish node on the convolution's NHWC memory."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((6, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Clip", ["xw", "lo", "hi"], ["a"]),
        helper.make_node("MatMul", ["x", "w"], ["xw2"]),
        helper.make_node("HardSigmoid", ["xw2"], ["b"]),
        helper.make_node("MatMul", ["x", "w"], ["xw3"]),
        helper.make_node("HardSwish", ["xw3"], ["c"]),
        helper.make_node("Conv", ["img", "k"], ["conv"]),
        helper.make_node("Mul", ["conv", "s"], ["d"]),
        helper.make_node("Relu", ["conv"], ["e"]),
        helper.make_node("Sigmoid", ["conv"], ["sig"]),
        helper.make_node("Mul", ["sig", "conv"], ["f"]),
    ]
    consts = {
        "w": w,
        "k": k,
        "lo": np.array(0, np.float32),
        "hi": np.array(3, np.float32),
        "s": np.array([2, 3], np.float32).reshape(2, 1, 1),
    }
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 2, 2]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcdef"],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    onnx.save(model, tmp_path / "unfused.onnx")
    ours = fastlayers.load(tmp_path / "unfused.onnx")
    assert ours.op_types == [
        "FusedDense",
        "FusedElementwise",
        "FusedDense",
        "FusedElementwise",
        "FusedDense",
        "FusedConv",
        "Mul",
        "Relu",
        "Swish",
    ]
    _matches_ort(
        ours,
        tmp_path / "unfused.onnx",
        {
            "x": rng.standard_normal((2, 6)).astype(np.float32) * 3,
            "img": rng.standard_normal((1, 3, 2, 2)).astype(np.float32),
        },
    )


def test_layer_norm_and_rms_norm_decompositions_fuse(torch, tmp_path, rng, backend):
    """torch's opset-13 LayerNorm (ReduceMean / Sub / Pow / ReduceMean / Add / Sqrt / Div / Mul /
    Add), one without affine parameters, and RMSNorm as x * rsqrt(mean(x^2) + eps) * w and as
    x / sqrt(mean(x x) + eps) each become one LayerNormalization node."""
    torch.manual_seed(0)

    class Norms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.plain = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8, elementwise_affine=False)
            self.w = torch.nn.Parameter(torch.randn(8))
            with torch.no_grad():
                self.ln.weight.normal_(), self.ln.bias.normal_()

        def forward(self, x):
            rsqrt = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
            return self.ln(x), self.plain(x), rsqrt, x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)

    path = tmp_path / "norms.onnx"
    export(
        torch,
        Norms(),
        (torch.randn(2, 3, 8),),
        path,
        input_names=["x"],
        opset_version=13,
        dynamic_axes={"x": {0: "n", 1: "t"}},
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["LayerNormalization"] * 4
    assert sorted(n.attrs["_rms"] for n in ours._nodes) == [False, False, True, True]
    _matches_ort(ours, path, {"x": rng.standard_normal((3, 5, 8)).astype(np.float32)})


@pytest.mark.parametrize("case", ["centred value read", "float64"])
def test_layer_norm_decompositions_left_alone(tmp_path, rng, case):
    """A decomposed LayerNorm whose centred value is also a graph output, or on float64 values
    (the fused node computes float32), stays as it is."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem, dtype = (TensorProto.DOUBLE, np.float64) if case == "float64" else (TensorProto.FLOAT, np.float32)

    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    outputs = ("y", "d") if case == "centred value read" else ("y",)
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", elem, [2, 4])],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        [numpy_helper.from_array(np.array(1e-5, dtype), "eps")],
        opset=13,
    )
    onnx.save(model, tmp_path / "ln.onnx")
    ours = fastlayers.load(tmp_path / "ln.onnx")
    programs = [n.attrs["_ops"] for n in ours._nodes if n.op_type == "FusedElementwise"]
    assert "LayerNormalization" not in ours.op_types and ("Div" in ours.op_types or any("Div" in o for o in programs))
    got = ours(rng.standard_normal((2, 4)).astype(dtype))
    assert (got[0] if isinstance(got, list) else got).dtype == dtype
    _matches_ort(ours, tmp_path / "ln.onnx", {"x": rng.standard_normal((2, 4)).astype(dtype)})


@pytest.mark.parametrize("opset", [13, 17])
def test_conv1d_exported_as_2d_runs_as_1d(torch, tmp_path, rng, opset):
    """unsqueeze -> Conv2d with a (k, 1) or (1, k) kernel -> squeeze (a 1-D convolution written
    as 2-D) -> one 1-D FusedConv with the ReLU after it; also a stack of such convolutions with
    a BatchNorm, a per-channel shift and a residual Add between one unsqueeze and squeeze."""
    torch.manual_seed(0)

    class Conv1dAs2d(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tall = torch.nn.Conv2d(4, 6, (3, 1), padding=(1, 0), stride=(2, 1))
            self.wide = torch.nn.Conv2d(6, 5, (1, 3), padding=(0, 2), dilation=(1, 2))
            self.stack = torch.nn.ModuleList(torch.nn.Conv2d(5, 5, (3, 1), padding=(1, 0)) for _ in range(2))
            self.bn, self.shift = torch.nn.BatchNorm2d(5).eval(), torch.nn.Parameter(torch.randn(5, 1, 1))

        def forward(self, x_ncl):
            h = torch.relu(self.tall(x_ncl.unsqueeze(-1)).squeeze(-1))
            h = torch.relu(self.wide(h.unsqueeze(2)).squeeze(2)).unsqueeze(-1)
            g = torch.relu(self.bn(self.stack[0](h)) + self.shift)
            return (torch.sigmoid(self.stack[1](g)) + h).squeeze(-1)

    path = tmp_path / "conv1d.onnx"
    export(
        torch,
        Conv1dAs2d(),
        (torch.randn(2, 4, 9),),
        path,
        input_names=["x"],
        opset_version=opset,
        dynamic_axes={"x": {0: "n", 2: "len"}},
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedConv"] * 4  # the residual Add taken into the last
    assert ours._nodes[3].attrs["_residual"] == ("linear", 0.0)
    assert all(n.attrs["_w_hwio"].shape[0] == 1 for n in ours._nodes[:4])
    assert [n.attrs["activation"] for n in ours._nodes[:4]] == ["relu", "relu", "relu", "onnx_sigmoid"]
    _matches_ort(ours, path, {"x": rng.standard_normal((3, 4, 11)).astype(np.float32)})


def test_opset14_encoder_layer_becomes_one_node(torch, tmp_path, rng):
    """Before opset 17 torch writes LayerNorm as ReduceMean / Sub / Pow ...: once those are one
    LayerNormalization node each, the whole encoder layer matches ``fuse_encoder_layers``."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    layer = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    path = tmp_path / "enc.onnx"
    export(
        torch, layer, (torch.randn(1, 5, 16),), path, input_names=["x"], opset_version=14, dynamic_axes={"x": {0: "n"}}
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedEncoderLayer"]
    _matches_ort(ours, path, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)}, rtol=1e-4)


def test_dense_affine_forms(tmp_path, rng):
    """A MatMul on 3-D input followed by Div by a per-column vector, then Add (constant first)
    and Sub of vectors, and a Gemm (transB, with a bias) followed by Mul by a scalar each fold
    into one FusedDense; Sub with the constant first (c - x) stays."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "w": rng.standard_normal((6, 4)),
        "d": rng.uniform(0.5, 2, 4),
        "t": rng.standard_normal(4),
        "u": rng.standard_normal(4),
        "wt": rng.standard_normal((5, 6)),
        "gb": rng.standard_normal(5),
        "s": np.array(1.5),
        "c": rng.standard_normal(5),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a1"]),
        helper.make_node("Div", ["a1", "d"], ["a2"]),
        helper.make_node("Add", ["t", "a2"], ["a3"]),
        helper.make_node("Sub", ["a3", "u"], ["y"]),
        helper.make_node("Gemm", ["x2", "wt", "gb"], ["g1"], transB=1),
        helper.make_node("Mul", ["g1", "s"], ["g2"]),
        helper.make_node("Sub", ["c", "g2"], ["z"]),
    ]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 6]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in consts.items()],
    )
    onnx.save(model, tmp_path / "dense.onnx")
    ours = fastlayers.load(tmp_path / "dense.onnx")
    assert ours.op_types == ["FusedDense", "FusedDense", "Sub"]
    _matches_ort(
        ours,
        tmp_path / "dense.onnx",
        {"x": rng.standard_normal((2, 3, 6)).astype(np.float32), "x2": rng.standard_normal((2, 6)).astype(np.float32)},
    )


def test_tf2onnx_conv1d_on_nwc_values_runs_as_1d(tmp_path, rng):
    """tf2onnx's Conv1D: Unsqueeze([1]) -> Transpose([0, 3, 1, 2]) -> Conv (1, k) -> Relu ->
    Transpose([0, 2, 3, 1]) -> Squeeze([1]), twice: one transpose in, two 1-D FusedConvs, one
    transpose out (the two between the layers cancel)."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "ax": np.array([1], np.int64),
        "k1": rng.standard_normal((6, 4, 1, 3)).astype(np.float32),
        "b1": rng.standard_normal(6).astype(np.float32),
        "k2": rng.standard_normal((5, 6, 1, 3)).astype(np.float32),
    }
    nodes = []
    for i, (x, k) in enumerate((("x", "k1"), ("h1", "k2")), 1):
        nodes += [
            helper.make_node("Unsqueeze", [x, "ax"], [f"u{i}"]),
            helper.make_node("Transpose", [f"u{i}"], [f"t{i}"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", [f"t{i}", k] + (["b1"] if i == 1 else []), [f"c{i}"], pads=[0, 1, 0, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
            helper.make_node("Transpose", [f"r{i}"], [f"o{i}"], perm=[0, 2, 3, 1]),
            helper.make_node("Squeeze", [f"o{i}", "ax"], ["y" if i == 2 else f"h{i}"]),
        ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "w", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
        opset=13,
    )
    onnx.save(model, tmp_path / "tf_conv1d.onnx")
    ours = fastlayers.load(tmp_path / "tf_conv1d.onnx")
    assert ours.op_types == ["Transpose", "FusedConv", "FusedConv", "Transpose"]
    assert all(n.attrs["_w_hwio"].shape[0] == 1 for n in ours._nodes[1:3])
    _matches_ort(ours, tmp_path / "tf_conv1d.onnx", {"x": rng.standard_normal((2, 7, 4)).astype(np.float32)})


@pytest.mark.parametrize("op", ["LayerNormalization", "BatchNormalization"])
def test_norm_parameters_of_another_width_are_refused(tmp_path, rng, backend, op):
    """A LayerNormalization (the node that decompositions are fused into) or a BatchNormalization
    on (N, C) values whose parameters do not match the normalized width raises InputError naming
    the node: the native kernels, which read them as rows of that width, are not called."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    params = ["s"] if op == "LayerNormalization" else ["s", "s", "s", "s"]
    nodes = [helper.make_node(op, ["x"] + params, ["y"])]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(5, np.float32), "s")],
    )
    onnx.save(model, tmp_path / "norm5.onnx")
    with pytest.raises(fastlayers.errors.InputError, match=op):
        fastlayers.load(tmp_path / "norm5.onnx")(rng.standard_normal((2, 8)).astype(np.float32))


@pytest.mark.parametrize("affine", [True, False])
def test_tf2onnx_moments_layer_norm_fuses(tmp_path, rng, affine):
    """tf2onnx's Keras LayerNormalization (tf.nn.moments + tf.nn.batch_normalization): inv =
    Reciprocal(Sqrt(var + eps)) [* gamma]; x * inv + (beta - mean * inv), or x * inv - mean *
    inv without an offset -> one LayerNormalization node."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "eps": np.array(1e-3, np.float32),
        "gamma": rng.standard_normal(6).astype(np.float32),
        "beta": rng.standard_normal(6).astype(np.float32),
    }
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
    ]
    inv = "r"
    if affine:
        nodes.append(helper.make_node("Mul", ["r", "gamma"], ["inv"]))
        inv = "inv"
    nodes += [helper.make_node("Mul", ["x", inv], ["xi"]), helper.make_node("Mul", [inv, "m"], ["mi"])]
    if affine:
        nodes += [helper.make_node("Sub", ["beta", "mi"], ["o"]), helper.make_node("Add", ["xi", "o"], ["y"])]
    else:
        nodes.append(helper.make_node("Sub", ["xi", "mi"], ["y"]))
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
        opset=13,
    )
    onnx.save(model, tmp_path / "tf_ln.onnx")
    ours = fastlayers.load(tmp_path / "tf_ln.onnx")
    assert ours.op_types == ["LayerNormalization"]
    _matches_ort(ours, tmp_path / "tf_ln.onnx", {"x": rng.standard_normal((2, 3, 6)).astype(np.float32)})


@pytest.mark.parametrize("opset", [11, 17])
def test_dense_absorbs_a_softmax_over_its_last_axis(tmp_path, rng, opset):
    """Gemm -> Softmax (axis 1, -1 or the default), MatMul -> LogSoftmax(axis -1) and a 3-D
    MatMul -> Softmax(axis 2) become one FusedDense each, the softmax its epilogue; a 3-D
    MatMul's Softmax over axis 1 joins it too and runs after the product as its node would (at
    opset 11, over the flattened axes 1 and 2); one whose input is also read elsewhere stays."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {"w": rng.standard_normal((6, 4)), "wt": rng.standard_normal((5, 6)), "gb": rng.standard_normal(5)}
    nodes = [
        helper.make_node("Gemm", ["x2", "wt", "gb"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y1"]),
        helper.make_node("Gemm", ["x2", "wt"], ["h"], transB=1),
        helper.make_node("Softmax", ["h"], ["y2"], axis=1),
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("LogSoftmax", ["a"], ["y3"], axis=-1),
        helper.make_node("MatMul", ["x", "w"], ["b"]),
        helper.make_node("Softmax", ["b"], ["y4"], axis=1),
        helper.make_node("Gemm", ["x2", "wt"], ["c"], transB=1),
        helper.make_node("Softmax", ["c"], ["y5"], axis=-1),
        helper.make_node("Relu", ["c"], ["y6"]),
        helper.make_node("MatMul", ["x", "w"], ["d"]),
        helper.make_node("Softmax", ["d"], ["y7"], axis=2),
    ]
    outs = ("y1", "y2", "y3", "y4", "y5", "y6", "y7")
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 6]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in consts.items()],
        opset=opset,
    )
    onnx.save(model, tmp_path / "softmax.onnx")
    ours = fastlayers.load(tmp_path / "softmax.onnx")
    assert ours.op_types == ["FusedDense"] * 5 + ["Softmax", "Relu", "FusedDense"]
    assert [n.attrs.get("activation") for n in ours._nodes if n.op_type == "FusedDense"] == [
        "softmax",
        "softmax",
        "log_softmax",
        "softmax",
        None,
        "softmax",
    ]
    _matches_ort(
        ours,
        tmp_path / "softmax.onnx",
        {
            "x": rng.standard_normal((2, 3, 6)).astype(np.float32) * 4,
            "x2": rng.standard_normal((2, 6)).astype(np.float32) * 4,
        },
    )


def test_residual_add_and_activation_become_one_pass(tmp_path, rng):
    """Add of two convolutions' outputs (NHWC memory behind NCHW views) followed by Relu is
    taken into the second convolution (``fuse_conv_residual``); one followed by Sigmoid and one
    with a broadcast operand (numpy's sum inside the node) run as FusedAdd nodes, the last two
    as an elementwise program; an Add that another node reads too ends a program. Every output
    equals onnxruntime's."""
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    k1, k2 = (rng.standard_normal((4, 3, 3, 3)).astype(np.float32) for _ in range(2))
    nodes = [
        helper.make_node("Conv", ["img", "k1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["img", "k2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "c2"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["a"]),
        helper.make_node("Add", ["a", "img4"], ["s2"]),
        helper.make_node("Sigmoid", ["s2"], ["b"]),
        helper.make_node("Add", ["b", "row"], ["s3"]),  # broadcast
        helper.make_node("Relu", ["s3"], ["c"]),
        helper.make_node("Add", ["c", "c"], ["s4"]),  # also an output: ends a program
        helper.make_node("Relu", ["s4"], ["d"]),
    ]
    consts = {"k1": k1, "k2": k2}
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [2, 3, 5, 7]),
            helper.make_tensor_value_info("img4", TensorProto.FLOAT, [2, 4, 5, 7]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [7]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("b", "d", "s4")],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    path = tmp_path / "residual.onnx"
    path.write_bytes(model.SerializeToString())
    ours = fastlayers.load(path)
    # the third FusedAdd and the Add reading its value twice (its only reader) join one program
    assert ours.op_types == ["FusedConv", "FusedConv", "FusedAdd", "FusedElementwise", "Relu"]
    assert ours._nodes[1].attrs["_residual"] == ("relu", 0.0)
    assert ours._nodes[3].attrs["_ops"] == "FusedAdd+Add"
    feed = {
        "img": rng.standard_normal((2, 3, 5, 7)).astype(np.float32),
        "img4": rng.standard_normal((2, 4, 5, 7)).astype(np.float32),
        "row": rng.standard_normal(7).astype(np.float32),
    }
    _matches_ort(ours, path, feed, rtol=1e-5)


def _residual_graph(tmp_path, rng, tail, shape=(2, 8, 9, 11), extra_output=False):
    """x -> Conv c0 (NHWC memory) -> Conv c1 (+ ``tail``: nodes reading "c1" and "c0", writing
    "y"); a 1x1 and a 3x3 convolution of 8 channels."""
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    c = shape[1]
    consts = {
        "k0": (rng.standard_normal((c, c, 1, 1)) * 0.3).astype(np.float32),
        "k1": (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32),
        "b1": rng.standard_normal(c).astype(np.float32),
        "r": rng.standard_normal((1, c, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "k0"], ["c0"]),
        helper.make_node("Conv", ["c0", "k1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        *tail,
    ]
    outputs = ["y", "c1"] if extra_output else ["y"]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, list(shape)),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    path = tmp_path / "conv_residual.onnx"
    path.write_bytes(model.SerializeToString())
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name in ("x", "z")}
    return path, feed


RESIDUAL_TAILS = {
    # ResNet's block end: Add of the convolution and the block's input, then Relu
    "add-relu": (["Add:c1,c0:s", "Relu:s:y"], "relu"),
    # the Add with the convolution second, no activation after
    "add": (["Add:c0,c1:y"], "linear"),
    # YOLOX's bottleneck: the convolution's SiLU (Sigmoid and Mul), then the shortcut
    "silu-add": (["Sigmoid:c1:g", "Mul:c1,g:a", "Add:a,c0:y"], "linear"),
    # the residual a graph input (NCHW memory): added after the kernel
    "input": (["Add:c1,z:s", "Relu:s:y"], "relu"),
    # an operand that broadcasts (c0's mean per channel, (N, C, 1, 1)): added after the kernel
    "broadcast": (["GlobalAveragePool:c0:m", "Add:c1,m:s", "Sigmoid:s:y"], "onnx_sigmoid"),
    # an operand that is c0 times per-channel constants (still NHWC memory)
    "scaled": (["Mul:c0,r:m", "Add:m,c1:s", "Sigmoid:s:y"], "onnx_sigmoid"),
}


def _tail_nodes(spec):
    from onnx import helper

    nodes = []
    for item in spec:
        op_type, ins, out = item.split(":")
        nodes.append(helper.make_node(op_type, ins.split(","), [out]))
    return nodes


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("tail", sorted(RESIDUAL_TAILS))
def test_residual_add_of_a_convolution_joins_it(tmp_path, rng, tail, backend, threads):
    """An Add of a convolution (its only reader) and another computed value, with the Relu or
    Sigmoid after it, is taken into the convolution (``fuse_conv_residual``), whose kernel adds
    it to each block of output rows (or, for an operand in another layout or shape, the node
    adds it after); outputs as onnxruntime's on both backends and thread counts."""
    spec, act = RESIDUAL_TAILS[tail]
    path, feed = _residual_graph(tmp_path, rng, _tail_nodes(spec))
    with fastlayers.use_ops(backend), fastlayers.using_threads(threads):
        ours = fastlayers.load(path)
        fused = [n for n in ours._nodes if n.op_type == "FusedConv" and "_residual" in n.attrs]
        assert len(fused) == 1 and fused[0].attrs["_residual"][0] == act
        assert not {"Add", "FusedAdd", "Relu"} & set(ours.op_types)
        for _ in range(2):  # the plan made on the first call, then reused
            _matches_ort(ours, path, feed, rtol=1e-5)


def test_residual_add_stays_where_the_convolution_is_read_elsewhere(tmp_path, rng):
    """A convolution whose output is also a graph output (or read by another node) keeps its
    Add, as one with a scale and shift after it would."""
    path, feed = _residual_graph(tmp_path, rng, _tail_nodes(["Add:c1,c0:s", "Relu:s:y"]), extra_output=True)
    ours = fastlayers.load(path)
    assert not any("_residual" in n.attrs for n in ours._nodes)
    assert "FusedAdd" in ours.op_types
    _matches_ort(ours, path, feed, rtol=1e-5)


@pytest.mark.parametrize("name", ["relu", "onnx_sigmoid", "leaky_relu", "linear"])
@pytest.mark.parametrize("n", [1, 7, 16385, 40000])
def test_add_act_matches_the_reference(isa, name, n, rng):
    """The native add_act (f(a + b) in blocks shared by the pool, the tail on the caller) against
    numpy, on every ISA path, at sizes around its block of 16384 floats."""
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    from fastlayers import native

    got = fastlayers.get_ops("cpu").add_act(a, b, name, 0.1)
    want = fastlayers.get_ops("reference").add_act(a, b, name, 0.1)
    if name.startswith("onnx_") and native.isa() == "generic":  # no fused multiply-add there
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["onnx_tanh", "relu", "linear"])
@pytest.mark.parametrize("ni, nj, n", [(1, 1, 1), (3, 5, 7), (9, 2, 17), (40, 33, 512)])
def test_outer_add_act_matches_the_reference(isa, name, ni, nj, n, rng):
    """The native outer_add_act (f(a[i] + b[j]) row by row, rows shared by the pool) against
    numpy's broadcast sum, on every ISA path, around the vector width and the pool's share."""
    from fastlayers import native

    a, b = rng.standard_normal((ni, n)).astype(np.float32), rng.standard_normal((nj, n)).astype(np.float32)
    got = fastlayers.get_ops("cpu").outer_add_act(a, b, name)
    want = fastlayers.get_ops("reference").outer_add_act(a, b, name)
    assert got.shape == (ni, nj, n)
    if name.startswith("onnx_") and native.isa() == "generic":  # no fused multiply-add there
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-7)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "q_shape, k_shape, outer",
    [
        ((1, 6, 1, 8), (1, 1, 5, 8), True),
        ((1, 1, 5, 8), (1, 6, 1, 8), True),
        ((6, 1, 8), (1, 5, 8), True),
        ((2, 6, 1, 8), (1, 1, 5, 8), True),
        ((2, 6, 1, 8), (2, 1, 5, 8), False),
        ((1, 6, 1, 8), (1, 6, 5, 8), False),
    ],
)
def test_additive_attention_sum_runs_as_one_outer_pass(tmp_path, rng, q_shape, k_shape, outer):
    """Tanh(q + k) with q and k broadcast against each other (additive attention's scores, as
    text2tashkeel's taggers export it) is one FusedAdd whose sum is formed row by row, never as
    numpy's broadcast array, with either operand first; a batch axis both operands span, or an
    operand of the sum's whole shape, takes numpy's sum. Outputs equal onnxruntime's."""
    oracle("onnx")
    from onnx import TensorProto, helper

    from fastlayers.onnx.ops.elementwise import outer_operands

    nodes = [helper.make_node("Add", ["q", "k"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, list(q_shape)),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, list(k_shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [],
    )
    path = tmp_path / "additive.onnx"
    path.write_bytes(model.SerializeToString())
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedAdd"]
    feed = {"q": rng.standard_normal(q_shape).astype(np.float32), "k": rng.standard_normal(k_shape).astype(np.float32)}
    assert (outer_operands(feed["q"], feed["k"]) is not None) == outer
    _matches_ort(ours, path, feed, rtol=1e-6, atol=1e-6)


def lstm_cells_export(torch, path, opset):
    """Two torch LSTMCells (5 -> 7, 7 -> 7) in a chain, the second reading the first's h as its
    input and state, exported node by node to ``path`` (inputs x, h, c; outputs h2, c2; the
    batch dynamic)."""
    from .test_import import export

    class Cells(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.LSTMCell(5, 7), torch.nn.LSTMCell(7, 7)

        def forward(self, x, h, c):
            h1, c1 = self.a(x, (h, c))
            h2, c2 = self.b(h1, (h1, c1))
            return h2, c2

    args = (torch.randn(2, 5), torch.randn(2, 7), torch.randn(2, 7))
    export(
        torch,
        Cells(),
        args,
        path,
        input_names=["x", "h", "c"],
        output_names=["h2", "c2"],
        dynamic_axes={n: {0: "batch"} for n in ("x", "h", "c", "h2", "c2")},
        opset_version=opset,
    )
    return path


@pytest.mark.parametrize("opset", [13, 17])
def test_torch_lstm_cell_export_becomes_one_step(torch, tmp_path, rng, backend, opset):
    """torch's LSTMCell, exported node by node (two products, Split, three Sigmoids, Tanh and
    the cell arithmetic), runs as one FusedLSTMCell node per step: here two cells in a chain,
    the second reading the first's h and c, both states returned; batch 1 and 3 (dynamic),
    outputs as onnxruntime's."""
    path = lstm_cells_export(torch, tmp_path / "cells.onnx", opset)
    ours = fastlayers.load(path)
    assert ours.op_types.count("FusedLSTMCell") == 2
    assert not {"Sigmoid", "Tanh", "Split", "Mul"} & set(ours.op_types)
    for batch in (1, 3, 1, 3):  # the step is bound per batch: later calls reuse it, new states
        feed = {
            "x": rng.standard_normal((batch, 5)).astype(np.float32),
            "h": rng.standard_normal((batch, 7)).astype(np.float32),
            "c": rng.standard_normal((batch, 7)).astype(np.float32),
        }
        held = {k: v.copy() for k, v in feed.items()}
        _matches_ort(ours, path, feed, rtol=1e-5, atol=1e-6)
        assert all(np.array_equal(feed[k], held[k]) for k in feed)  # states read, not written


def test_lstm_cell_node_on_other_shapes_matches_the_step(rng):
    """A FusedLSTMCell node whose values carry a leading axis (shapes the recurrent kernel does
    not take) computes the same step with numpy's broadcasting arithmetic."""
    from fastlayers.onnx.cells import _fused_lstm_cell

    x, h, c = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    w_x, w_h = (rng.standard_normal((4, 16)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(16).astype(np.float32)
    want = _fused_lstm_cell([x, h, c, w_x, w_h, b], {}, 17)
    got = _fused_lstm_cell([x[None], h[None], c[None], w_x, w_h, b], {}, 17)
    for g, w in zip(got, want):
        assert g.shape == (1,) + w.shape
        assert_close(g[0], w, rtol=1e-5, atol=1e-6)


def _gelu_tanh_nodes(spelling, x, y):
    """The tanh GELU of ``x`` into ``y`` as an exporter spells it, with the constant names it
    reads (c3 0.044715, c2 sqrt(2/pi), one 1, half 0.5, three 3)."""
    from onnx import helper

    def n(op, a, b, out):
        return helper.make_node(op, [a, b], [out])

    if spelling == "jax2tf":  # x (0.5 (1 + tanh(c2 (x + x (x (c3 x))))))
        return [
            n("Mul", "c3", x, "t1"),
            n("Mul", x, "t1", "t2"),
            n("Mul", x, "t2", "t3"),
            n("Add", x, "t3", "t4"),
            n("Mul", "c2", "t4", "t5"),
            helper.make_node("Tanh", ["t5"], ["t6"]),
            n("Add", "one", "t6", "t7"),
            n("Mul", "half", "t7", "t8"),
            n("Mul", x, "t8", y),
        ]
    if spelling == "torch":  # (0.5 x) (1 + tanh(c2 (x + c3 x^3)))
        return [
            n("Pow", x, "three", "t1"),
            n("Mul", "t1", "c3", "t2"),
            n("Add", x, "t2", "t3"),
            n("Mul", "t3", "c2", "t4"),
            helper.make_node("Tanh", ["t4"], ["t5"]),
            n("Add", "t5", "one", "t6"),
            n("Mul", x, "half", "t7"),
            n("Mul", "t7", "t6", y),
        ]
    # ((x (1 + tanh(...))) / 2): the x before the halving, a division
    return [
        n("Mul", x, x, "t1"),
        n("Mul", "t1", x, "t2"),
        n("Mul", "t2", "c3", "t3"),
        n("Add", "t3", x, "t4"),
        n("Div", "t4", "inv_c2", "t5"),
        helper.make_node("Tanh", ["t5"], ["t6"]),
        n("Add", "one", "t6", "t7"),
        n("Mul", "t7", x, "t8"),
        n("Div", "t8", "two", y),
    ]


@pytest.mark.parametrize("spelling", ["jax2tf", "torch", "divided"])
def test_tanh_gelu_spellings_become_one_activation(tmp_path, rng, spelling):
    """The tanh GELU spelled out in arithmetic around one Tanh (jax2tf's x * (c x) * x, torch's
    Pow(x, 3), the 0.5 before or after the x, divisions) after a dense MatMul + Add and after a
    Conv: one Gelu each, absorbed by the dense and convolution nodes; a one-element constant of
    rank 3 (jax2tf's) is taken where x is known to have at least that rank (a bias of rank 4
    added to it)."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "w": rng.standard_normal((6, 5)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
        "k": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "kb": rng.standard_normal((1, 4, 1, 1)).astype(np.float32),
        "c3": np.array(0.044715, np.float32),
        "c2": np.array(np.sqrt(2 / np.pi), np.float32),
        "inv_c2": np.array(1 / np.sqrt(2 / np.pi), np.float32),
        "one": np.array(1, np.float32),
        "one3": np.ones((1, 1, 1), np.float32),
        "half": np.array(0.5, np.float32),
        "three": np.array(3, np.float32),
        "two": np.array(2, np.float32),
    }
    dense = _gelu_tanh_nodes(spelling, "h", "y")
    conv = _gelu_tanh_nodes(spelling, "cb", "z")
    for node in conv:  # the second chain's own value names
        node.input[:] = ["one3" if i == "one" else i if i in consts or i == "cb" else "c_" + i for i in node.input]
        node.output[:] = [o if o == "z" else "c_" + o for o in node.output]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        *dense,
        helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "kb"], ["cb"]),
        *conv,
    ]
    model = make_graph(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6]),
            helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 5, 5]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    onnx.save(model, tmp_path / "gelu_tanh.onnx")
    ours = fastlayers.load(tmp_path / "gelu_tanh.onnx")
    assert ours.op_types == ["FusedDense", "FusedConv"]
    assert all(n.attrs["activation"] == "gelu_tanh" for n in ours._nodes)
    _matches_ort(
        ours,
        tmp_path / "gelu_tanh.onnx",
        {
            "x": rng.standard_normal((2, 3, 6)).astype(np.float32) * 2,
            "img": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
        },
    )


@pytest.mark.parametrize("case", ["other constant", "value read elsewhere", "adds axes"])
def test_tanh_gelu_lookalikes_left_alone(tmp_path, rng, case):
    """Not a tanh GELU, or not one that can become a node of x's shape: a coefficient off
    (0.05 for 0.044715), an inner value also a graph output, a rank-3 constant on a rank-2
    input (the chain's result has three axes). Each keeps its Tanh and matches onnxruntime."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "c3": np.array(0.05 if case == "other constant" else 0.044715, np.float32),
        "c2": np.array(np.sqrt(2 / np.pi), np.float32),
        "half": np.array(0.5, np.float32),
        "one": np.ones((1, 1, 1) if case == "adds axes" else (), np.float32),
    }
    nodes = _gelu_tanh_nodes("jax2tf", "x", "y")
    outputs = ["y", "t4"] if case == "value read elsewhere" else ["y"]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    onnx.save(model, tmp_path / "lookalike.onnx")
    ours = fastlayers.load(tmp_path / "lookalike.onnx")
    kept = [
        t
        for n in ours._nodes
        for t in (n.attrs.get("_ops", "").split("+") if n.op_type == "FusedElementwise" else [n.op_type])
    ]
    assert "Tanh" in kept and "Gelu" not in kept  # (as a node, or in an elementwise program)
    _matches_ort(ours, tmp_path / "lookalike.onnx", {"x": rng.standard_normal((3, 4)).astype(np.float32) * 2})


@pytest.mark.parametrize("opset", [13, 17])
def test_torch_tanh_gelu_export_is_the_dense_activation(torch, tmp_path, rng, opset):
    """torch's GELU(approximate="tanh") exported below opset 20 (nine arithmetic nodes around a
    Tanh) is the dense node's gelu_tanh, as torch computes it."""
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(8, 4))
    x = rng.standard_normal((3, 6)).astype(np.float32) * 2
    export(torch, module, (torch.from_numpy(x),), tmp_path / "gelu_tanh.onnx", opset_version=opset)
    ours = fastlayers.load(tmp_path / "gelu_tanh.onnx")
    assert ours.op_types == ["FusedDenseChain"]  # the two dense nodes, in one chain
    assert ours._nodes[0].attrs["layers"][0] == ("gelu_tanh", 0.0)
    with torch.no_grad():
        assert_close(ours(x), module(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)


def test_paddle_hard_swish_spelling_is_the_convolution_activation(tmp_path, rng):
    """x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (PaddlePaddle's HardSwish, the Conv's
    output read twice) is one HardSwish the Conv takes as its activation; with ONNX's default
    alpha 0.2 it is another function and stays two operations (one elementwise program). Both as
    onnxruntime computes them."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["g", "c"], ["y"]),
        helper.make_node("Conv", ["img", "k"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c2"], ["g2"]),
        helper.make_node("Mul", ["c2", "g2"], ["z"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 6, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "yz"],
        [numpy_helper.from_array(k, "k")],
    )
    onnx.save(model, tmp_path / "hard_swish.onnx")
    ours = fastlayers.load(tmp_path / "hard_swish.onnx")
    assert ours.op_types == ["FusedConv", "FusedConv", "FusedElementwise"]
    assert ours._nodes[0].attrs["activation"] == "hard_silu"
    assert ours._nodes[2].attrs["_ops"] == "HardSigmoid+Mul"  # the two nodes, in one program
    _matches_ort(ours, tmp_path / "hard_swish.onnx", {"img": rng.standard_normal((1, 3, 6, 5)).astype(np.float32) * 4})


@pytest.mark.parametrize("opset", [9, 13])
def test_slices_of_every_element_dropped_others_kept(tmp_path, rng, opset):
    """torch's ``x[..., 0:]`` (start 0, end the largest int64, step 1) keeps every element on
    any shape and is dropped; a slice ending at a finite end, starting later or stepping by 2
    stays, and every result is onnxruntime's."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    big = np.iinfo(np.int64).max

    def sl(x, y, starts, ends, axes, steps=None):
        if opset < 10:
            return helper.make_node("Slice", [x], [y], starts=starts, ends=ends, axes=axes)
        names = [f"{y}_{k}" for k in ("s", "e", "a", "p")]
        consts.extend(
            numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in zip(names, (starts, ends, axes, steps or [1] * len(axes)))
        )
        return helper.make_node("Slice", [x, *names], [y])

    consts: list = []
    nodes = [
        sl("x", "a", [0], [big], [1]),
        sl("a", "b", [0, 0], [big, big], [0, 2]),
        helper.make_node("Relu", ["b"], ["r"]),
        sl("r", "c", [0], [3], [2]),  # a finite end: kept
        sl("r", "d", [1], [big], [1]),  # a later start: kept
    ]
    outputs = ["c", "d"]
    if opset >= 10:
        nodes.append(sl("r", "e", [0], [big], [2], [2]))  # every other element: kept
        outputs.append("e")
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, None, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        consts,
        opset=opset,
    )
    onnx.save(model, tmp_path / "slices.onnx")
    ours = fastlayers.load(tmp_path / "slices.onnx")
    assert ours.op_types == ["Relu"] + ["Slice"] * (len(outputs))
    for length in (1, 4):
        _matches_ort(
            ours, tmp_path / "slices.onnx", {"x": rng.standard_normal((2, length, 5)).astype(np.float32)}, 0, 0
        )


def _one_hot_graph(tmp_path, w, ids_type, act="Relu", extra_reader=False):
    """ids (2, 5, free) -> Equal(ids, arange(V) as (1, 1, V)) -> Cast float -> MatMul w (V, E)
    -> Add b (1, 1, E) -> act, as jax2tf writes jax.nn.one_hot before a Dense (magika)."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    v, e = w.shape
    dtype = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}[ids_type]
    nodes = [
        helper.make_node("Equal", ["ids", "classes"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["hot"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["hot", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node(act, ["h"], ["y"], **({"approximate": "tanh"} if act == "Gelu" else {})),
    ]
    outs = ["y"] + (["hot"] if extra_reader else [])
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("ids", ids_type, [2, 5, None])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        [
            numpy_helper.from_array(np.arange(v, dtype=dtype).reshape(1, 1, v), "classes"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.linspace(-1, 1, e, dtype=np.float32).reshape(1, 1, e), "b"),
        ],
        opset=20,
    )
    path = tmp_path / "one_hot.onnx"
    onnx.save(model, str(path))
    return path, dtype


@pytest.mark.parametrize("act", ["Relu", "Gelu"])
@pytest.mark.parametrize("ids_type", [6, 7])  # int32, int64
def test_one_hot_times_weights_becomes_a_gather(tmp_path, rng, act, ids_type):
    """Equal(ids, arange(V)) -> Cast -> MatMul -> Add bias -> activation is one OneHotDense
    node gathering rows of act(w + b): the graph's bits, ids outside [0, V) included (their
    one-hot row is zeros: act(b)); ids whose last axis is not 1 take the graph's arithmetic."""
    w = rng.standard_normal((7, 6)).astype(np.float32)
    path, dtype = _one_hot_graph(tmp_path, w, ids_type, act)
    ours = fastlayers.load(path)
    assert ours.op_types == ["OneHotDense"]
    ids = np.array([0, 6, 3, -1, 7, 100, 2, 2, 5, 1], dtype).reshape(2, 5, 1)
    _matches_ort(ours, path, {"ids": ids}, rtol=1e-6, atol=1e-6)
    with fastlayers.use_ops("reference"):
        _matches_ort(ours, path, {"ids": ids}, rtol=1e-6, atol=1e-6)
    wide = rng.integers(-1, 8, (2, 5, 7)).astype(dtype)  # compared elementwise with the classes
    _matches_ort(ours, path, {"ids": wide}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tail", ["affine", "max-reciprocal"])
def test_arithmetic_after_a_one_hot_product_makes_a_program(tmp_path, rng, tail):
    """A OneHotDense node's result is float32 (its weights' type) as load sees it, and so are
    Max and Reciprocal of float32 values: the arithmetic after them is one FusedElementwise
    program (magika's layer norm after its one-hot embedding), with onnxruntime's values."""
    oracle("onnx")
    import onnx
    from onnx import helper, numpy_helper

    w = rng.standard_normal((7, 6)).astype(np.float32)
    path, dtype = _one_hot_graph(tmp_path, w, 6)
    model = onnx.load(str(path))
    graph = model.graph
    graph.output[0].name = "y2"
    consts = {f"c{k}": rng.standard_normal((1, 1, 6)).astype(np.float32) for k in range(3)}
    consts["half"] = np.array(0.5, np.float32)
    if tail == "affine":
        nodes = [
            helper.make_node("Sub", ["y", "c0"], ["t0"]),
            helper.make_node("Mul", ["t0", "c1"], ["t1"]),
            helper.make_node("Add", ["t1", "c2"], ["y2"]),
        ]
        want = ["OneHotDense", "FusedElementwise"]
    else:
        nodes = [
            helper.make_node("Max", ["half", "y"], ["t0"]),
            helper.make_node("Reciprocal", ["t0"], ["t1"]),
            helper.make_node("Mul", ["t1", "c1"], ["t2"]),
            helper.make_node("Add", ["t2", "c2"], ["y2"]),
        ]
        want = ["OneHotDense", "Max", "Reciprocal", "FusedElementwise"]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in consts.items())
    onnx.save(model, str(path))
    ours = fastlayers.load(path)
    assert ours.op_types == want
    ids = np.array([0, 6, 3, -1, 7, 100, 2, 2, 5, 1], dtype).reshape(2, 5, 1)
    _matches_ort(ours, path, {"ids": ids}, rtol=1e-5, atol=1e-5)


def test_one_hot_products_kept_where_a_gather_would_differ(tmp_path, rng):
    """Weights holding an inf (0 x inf is NaN in the product) or a one-hot value read elsewhere
    keep the graph's nodes."""
    w = rng.standard_normal((4, 3)).astype(np.float32)
    w[2, 1] = np.inf
    path, _ = _one_hot_graph(tmp_path, w, 7)
    assert "OneHotDense" not in fastlayers.load(path).op_types
    path, dtype = _one_hot_graph(tmp_path, np.ones((4, 3), np.float32), 7, extra_reader=True)
    ours = fastlayers.load(path)
    assert "OneHotDense" not in ours.op_types
    _matches_ort(ours, path, {"ids": np.arange(10, dtype=dtype).reshape(2, 5, 1)})


def _pad_graph(tmp_path, rng, reader, pads, opset=17, value=None, mode=None, relu=False, reader_attrs=None, axes=None):
    """x (1, 3, 9, 11) [-> Relu] -> Pad(pads[, value][, axes]) -> ``reader`` -> y, saved."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes, src = [], [], "x"
    if relu:
        nodes.append(helper.make_node("Relu", ["x"], ["r"]))
        src = "r"
    pad_inputs, pad_attrs = [src], {}
    if opset >= 11:
        inits.append(numpy_helper.from_array(np.asarray(pads, np.int64), "pads"))
        pad_inputs.append("pads")
        if value is not None or axes is not None:
            inits.append(numpy_helper.from_array(np.asarray(0.0 if value is None else value, np.float32), "value"))
            pad_inputs.append("value")
        if axes is not None:
            inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
            pad_inputs.append("axes")
    else:
        pad_attrs["pads"] = pads
        if value is not None:
            pad_attrs["value"] = value
    if mode:
        pad_attrs["mode"] = mode
    nodes.append(helper.make_node("Pad", pad_inputs, ["p"], **pad_attrs))
    attrs = dict(reader_attrs or {})
    if reader == "Conv":
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["p", "w"], ["y"], **attrs))
    else:
        nodes.append(helper.make_node(reader, ["p"], ["y"], kernel_shape=[3, 3], **attrs))
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
        opset=opset,
    )
    path = tmp_path / f"pad_{reader}_{opset}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    "reader, relu, reader_attrs, opset",
    [
        ("Conv", False, {"pads": [1, 0, 0, 2], "strides": [2, 2]}, 17),
        ("Conv", False, {"dilations": [2, 1]}, 10),
        ("AveragePool", False, {"count_include_pad": 1, "strides": [2, 2]}, 17),
        ("MaxPool", True, {"strides": [2, 2], "pads": [1, 0, 0, 0]}, 17),
        ("MaxPool", True, {}, 18),
    ],
)
def test_zero_pads_fold_into_the_convolution_or_pool(tmp_path, rng, reader, relu, reader_attrs, opset):
    """A Pad of zeros on H and W before a Conv, an AveragePool counting its padding or a
    MaxPool after a Relu becomes the reader's own pads; the outputs are onnxruntime's."""
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    path = _pad_graph(tmp_path, rng, reader, pads, opset=opset, relu=relu, reader_attrs=reader_attrs)
    ours = fastlayers.load(path)
    assert "Pad" not in ours.op_types
    _matches_ort(ours, path, {"x": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)})


@pytest.mark.parametrize(
    "case",
    ["value", "reflect", "channel pads", "negative", "not counted", "max of any sign", "max all padding", "same"],
)
def test_pads_kept_where_the_reader_would_differ(tmp_path, rng, case):
    """A Pad stays where folding it would change the result: another value or mode, pads on the
    channels, negative pads (a crop), an AveragePool not counting its padding, a MaxPool whose
    input may be negative or whose window could lie in the padding alone, auto_pad."""
    pads, reader, kw, attrs = [0, 0, 1, 1, 0, 0, 1, 1], "Conv", {}, {}
    if case == "value":
        kw["value"] = 1.0
    elif case == "reflect":
        kw["mode"] = "reflect"
    elif case == "channel pads":
        pads = [0, 1, 1, 1, 0, 0, 1, 1]
    elif case == "negative":
        pads = [0, 0, -1, 1, 0, 0, 1, 1]
    elif case == "not counted":
        reader = "AveragePool"
    elif case == "max of any sign":
        reader = "MaxPool"
    elif case == "max all padding":
        reader, kw["relu"], pads = "MaxPool", True, [0, 0, 3, 0, 0, 0, 0, 0]
    else:
        attrs["auto_pad"] = "SAME_UPPER"
    if case == "channel pads":  # (a pool: a Conv's weight would not take the added channel)
        reader, attrs["count_include_pad"] = "AveragePool", 1
    path = _pad_graph(tmp_path, rng, reader, pads, reader_attrs=attrs, **kw)
    ours = fastlayers.load(path)
    assert "Pad" in ours.op_types
    _matches_ort(ours, path, {"x": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)})


def test_pads_with_axes_fold(tmp_path, rng):
    """Opset 18's axes input: pads on axes (-2, -1) fold as the pads on H and W."""
    path = _pad_graph(tmp_path, rng, "Conv", [1, 2, 0, 1], opset=18, axes=[-2, -1])
    ours = fastlayers.load(path)
    assert "Pad" not in ours.op_types
    _matches_ort(ours, path, {"x": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)})


def _elementwise_graph(tmp_path, rng, nodes, inputs, outputs, consts=(), opset=17):
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = make_graph(
        nodes,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in consts],
        opset=opset,
    )
    path = tmp_path / "elementwise.onnx"
    onnx.save(model, path)
    return path


def test_squeeze_excite_gate_and_residual_become_one_program(tmp_path, rng, backend):
    """Conv -> GlobalAveragePool -> HardSigmoid (ONNX's default slope) -> Mul by the conv's
    output -> Add of it (PP-OCR's residual squeeze and excite) -> Relu: one FusedElementwise
    holding HardSigmoid, Mul, Add and Relu; onnxruntime's values."""
    from onnx import helper

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("HardSigmoid", ["p"], ["g"]),
        helper.make_node("Mul", ["c", "g"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    path = _elementwise_graph(
        tmp_path, rng, nodes, [("x", [2, 3, 12, 10])], ["y"], [("w", rng.standard_normal((16, 3, 3, 3)))]
    )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedConv", "GlobalAveragePool", "FusedElementwise"]
    assert ours._nodes[-1].attrs["_ops"] == "HardSigmoid+Mul+FusedAdd"  # Add + Relu: one FusedAdd first
    _matches_ort(ours, path, {"x": rng.standard_normal((2, 3, 12, 10)).astype(np.float32)})


@pytest.mark.parametrize("opset", [10, 13])
def test_elementwise_chains_of_every_form(tmp_path, rng, opset):
    """sqrt(a^2 + b^2) (silero's spectrum), Clip (bounds as attributes below opset 11, inputs
    from it), LeakyRelu, Neg, Abs, Sub, Div by a constant: one program; onnxruntime's values."""
    from onnx import helper

    clip = (
        helper.make_node("Clip", ["s"], ["k"], min=-0.5, max=2.0)
        if opset < 11
        else helper.make_node("Clip", ["s", "lo", "hi"], ["k"])
    )
    nodes = [
        helper.make_node("Pow", ["a", "two"], ["a2"]),
        helper.make_node("Pow", ["b", "two"], ["b2"]),
        helper.make_node("Add", ["a2", "b2"], ["sum"]),
        helper.make_node("Sqrt", ["sum"], ["r"]),
        helper.make_node("Sub", ["r", "b"], ["s"]),
        clip,
        helper.make_node("LeakyRelu", ["k"], ["l"], alpha=0.3),
        helper.make_node("Neg", ["l"], ["n"]),
        helper.make_node("Abs", ["n"], ["v"]),
        helper.make_node("Div", ["v", "three"], ["y"]),
    ]
    consts = (
        [("two", 2.0), ("three", 3.0), ("lo", -0.5), ("hi", 2.0)] if opset >= 11 else [("two", 2.0), ("three", 3.0)]
    )
    path = _elementwise_graph(tmp_path, rng, nodes, [("a", [1, 129, 4]), ("b", [1, 129, 4])], ["y"], consts, opset)
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedElementwise"]
    feeds = {
        "a": rng.standard_normal((1, 129, 4)).astype(np.float32),
        "b": rng.standard_normal((1, 129, 4)).astype(np.float32),
    }
    _matches_ort(ours, path, feeds)


def test_squares_reductions_and_lone_numpy_nodes_make_programs(tmp_path, rng, backend):
    """A node reading a value twice (x * x) is its only reader: the square joins the program
    before it; a reduction's output is float32 where its input is, so the gate after a
    ReduceMean joins its Mul; a Clip, Sqrt or HardSigmoid of another slope alone, which would run
    in numpy, is a program of its own. onnxruntime's values."""
    from onnx import helper

    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["m"]),
        helper.make_node("Mul", ["m", "m"], ["sq"]),  # m read twice by one node
        helper.make_node("ReduceSum", ["sq", "last"], ["r"], keepdims=1),
        helper.make_node("Sqrt", ["r"], ["mag"]),  # alone: a reduction and a Mul read it
        helper.make_node("ReduceMean", ["mag"], ["p"], axes=[2, 3], keepdims=1),
        helper.make_node("HardSigmoid", ["p"], ["g"], alpha=0.1666667, beta=0.5),
        helper.make_node("Mul", ["mag", "g"], ["gated"]),
        helper.make_node("ReduceMax", ["gated"], ["top"], axes=[-1], keepdims=1),
        helper.make_node("Clip", ["top", "lo", "hi"], ["y"]),
    ]
    consts = [("scale", rng.standard_normal((6, 1, 1))), ("lo", -0.5), ("hi", 2.0)]
    path = _elementwise_graph(tmp_path, rng, nodes, [("x", [2, 6, 5, 2])], ["y"], consts, 13)
    import onnx

    model = onnx.load(path)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "last"))
    onnx.save(model, path)
    ours = fastlayers.load(path)
    programs = [n.attrs["_ops"] for n in ours._nodes if n.op_type == "FusedElementwise"]
    assert programs == ["Mul+Mul", "Sqrt", "HardSigmoid+Mul", "Clip"]
    _matches_ort(ours, path, {"x": rng.standard_normal((2, 6, 5, 2)).astype(np.float32)})


def test_values_read_elsewhere_end_an_elementwise_program(tmp_path, rng):
    """A value that is a graph output, or that two nodes read, is computed as it is: the
    programs end there; Pow by another exponent stays a node."""
    from onnx import helper

    nodes = [
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),  # r: a graph output
        helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("Tanh", ["s"], ["t"]),
        helper.make_node("Add", ["t", "s"], ["u"]),  # s read twice
        helper.make_node("Pow", ["u", "three"], ["y"]),
    ]
    path = _elementwise_graph(tmp_path, rng, nodes, [("a", [3, 5]), ("b", [3, 5])], ["y", "r"], [("three", 3.0)])
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedElementwise", "Sigmoid", "FusedElementwise", "Pow"]
    feeds = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    _matches_ort(ours, path, feeds)


def test_elementwise_program_from_many_threads(tmp_path, rng):
    """One model's FusedElementwise called from four threads at once: each call's values are
    its own (the plan's layouts are shared, the registers and the result per call)."""
    from onnx import helper

    nodes = [
        helper.make_node("Mul", ["x", "g"], ["m"]),
        helper.make_node("Add", ["m", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    path = _elementwise_graph(tmp_path, rng, nodes, [("x", [2, 16, 9, 9]), ("g", [2, 16, 1, 1])], ["y"])
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedElementwise"]
    feeds = [
        {
            "x": rng.standard_normal((2, 16, 9, 9)).astype(np.float32),
            "g": rng.standard_normal((2, 16, 1, 1)).astype(np.float32),
        }
        for _ in range(4)
    ]
    wants = [np.maximum(f["x"] * f["g"] + f["x"], 0) for f in feeds]
    failures = []

    def calls(k):
        for _ in range(50):
            if not np.array_equal(ours(feeds[k]["x"], feeds[k]["g"]), wants[k]):
                failures.append(k)

    in_threads(calls, 4)
    assert failures == []


def test_dense_weights_held_once_packed(tmp_path, rng):
    """A Gemm (transB) weight every product packs is held by the loaded model in its packed form
    alone (the file's array and its transposed copy freed): results as onnxruntime's, under the
    reference backend too, after a pickle, and through a second dense node sharing the weight;
    count_params and the profile see the (k, n) weights. A weight another operator reads stays
    an array."""
    oracle("onnx")
    import pickle

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.onnx import importer, proto

    k, n = 256, 384
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    v = rng.standard_normal((k, k)).astype(np.float32)
    xs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)
        for name, dims in (("x", [None, k]), ("t", [k, None]))
    ]
    ys = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z", "s")]
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("MatMul", ["x", "v"], ["z"]),
        helper.make_node("MatMul", ["v", "t"], ["s"]),  # v also read as a MatMul's A: an array
    ]
    inits = [numpy_helper.from_array(a, name) for a, name in ((w, "w"), (b, "b"), (v, "v"))]
    path = tmp_path / "gemm.onnx"
    onnx.save(make_graph(nodes, xs, ys, inits), path)
    model = fastlayers.load(path)
    held = [c for c in model._constants.values() if not isinstance(c, np.ndarray)]
    assert [c.shape for c in held] == [(k, n)]
    assert not any(c.shape in ((n, k), (k, n)) for c in model._constants.values() if isinstance(c, np.ndarray))
    assert any(isinstance(c, np.ndarray) and c.shape == (k, k) for c in model._constants.values())
    assert model.count_params() == k * n + n + k * k
    feeds = {"x": rng.standard_normal((5, k)).astype(np.float32), "t": rng.standard_normal((k, 5)).astype(np.float32)}
    _matches_ort(lambda f: model.run(None, f), path, feeds, rtol=1e-5, atol=1e-4)
    with fastlayers.use_ops("reference"):
        _matches_ort(lambda f: model.run(None, f), path, feeds, rtol=1e-5, atol=1e-4)
    again = pickle.loads(pickle.dumps(model))
    assert all(np.array_equal(a, c) for a, c in zip(again.run(None, feeds), model.run(None, feeds)))
    dense = [s for s in model.profile(feeds, repeats=1).steps if s.op_type == "FusedDense"]
    assert dense[0].input_shapes[1] == (k, n)
    parsed = proto.parse_model(path.read_bytes(), "m")
    importer.from_model(parsed, "m", own=True)
    assert parsed.graph.initializers == {}
    parsed = proto.parse_model(path.read_bytes(), "m")
    importer.from_model(parsed, "m")
    assert sorted(parsed.graph.initializers) == ["b", "v", "w"]


def test_conv_weights_held_once_packed(tmp_path, rng):
    """A convolution's weights (transposed at load, a BatchNormalization folded in) are held by
    the loaded model in the backend's packed form alone, once where two convolutions share an
    initializer; a stem of 3 input channels and a depthwise convolution keep their arrays.
    Results as onnxruntime's on the Python plan, the native plan (1 and 2 threads), under the
    reference backend and after a pickle; count_params and the profile see the weights."""
    oracle("onnx")
    import pickle

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.backends.cpu.conv import PackedConvWeights
    from fastlayers.onnx import lowering

    c = 24
    consts = {
        "w0": rng.standard_normal((c, 3, 3, 3)).astype(np.float32) / 5,
        "w1": rng.standard_normal((c, c, 3, 3)).astype(np.float32) / 15,
        "wd": rng.standard_normal((c, 1, 3, 3)).astype(np.float32) / 3,
        "w2": rng.standard_normal((c, c, 1, 1)).astype(np.float32) / 5,
        "gamma": rng.uniform(0.5, 1.5, c).astype(np.float32),
        "beta": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32) / 10,
        "var": rng.uniform(0.5, 1.5, c).astype(np.float32),
    }
    pad = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=pad),
        helper.make_node("Relu", ["a"], ["a1"]),
        helper.make_node("Conv", ["a1", "w1"], ["b"], pads=pad),
        helper.make_node("BatchNormalization", ["b", "gamma", "beta", "mean", "var"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["b2"]),
        helper.make_node("Conv", ["b2", "wd"], ["d"], pads=pad, group=c, strides=[2, 2]),
        helper.make_node("Conv", ["d", "w2"], ["e"]),
        helper.make_node("Conv", ["e", "w2"], ["y"]),  # the same 1x1 weights again
    ]
    graph = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 20, 22])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    path = tmp_path / "convs.onnx"
    onnx.save(graph, path)
    feeds = {"x": rng.standard_normal((2, 3, 20, 22)).astype(np.float32)}
    for threads in (1, 2):
        with fastlayers.using_threads(threads):
            model = fastlayers.load(path)
            assert model.op_types == ["FusedConv"] * 5
            weights = [n.attrs["_w_hwio"] for n in model._nodes]
            assert [type(w) is PackedConvWeights for w in weights] == [False, True, False, True, True]
            assert weights[3] is weights[4]
            assert np.array_equal(np.asarray(weights[4]), consts["w2"][:, :, 0, 0].T[None, None])
            for _ in range(4):  # the Python plan, then the native plan built for this shape
                _matches_ort(lambda f: model.run(None, f), path, feeds, rtol=1e-5, atol=1e-4)
            plans = [p for p in model._native.plans.values() if isinstance(p, lowering.Plan)]
            assert plans and plans[0].summary[0].count("FusedConv") == 5 and not plans[0].summary[1]
    assert model.count_params() == sum(v.size for v in consts.values()) - 4 * c + c  # BN folded into a bias
    with fastlayers.use_ops("reference"):
        _matches_ort(lambda f: model.run(None, f), path, feeds, rtol=1e-5, atol=1e-4)
    again = pickle.loads(pickle.dumps(model))
    assert all(np.array_equal(a, b) for a, b in zip(again.run(None, feeds), model.run(None, feeds)))
    convs = [s for s in model.profile(feeds, repeats=1).steps if s.op_type == "FusedConv"]
    assert len(convs) == 5


# (kind, gates, node attributes, whether W and R are held as the loops' kernels)
RECURRENT_HOLDS = [
    ("LSTM", 4, {"direction": "bidirectional"}, True),
    ("GRU", 3, {"linear_before_reset": 1, "direction": "reverse"}, True),
    ("RNN", 1, {}, True),
    ("LSTM", 4, {"clip": 3.0}, False),  # the reference computes it: the file's arrays
]


@pytest.mark.parametrize("kind,gates,attrs,held", RECURRENT_HOLDS, ids=[f"{c[0]}-{c[3]}" for c in RECURRENT_HOLDS])
def test_recurrent_weights_held_once_as_kernels(tmp_path, rng, kind, gates, attrs, held):
    """A recurrent node's W and R, where the backend's loops run it, are held as the loops'
    gate-reordered kernels alone (``RecurrentWeights``), not beside the file's arrays: they
    read back as the file's values, bit for bit; count_params sees them; results as
    onnxruntime's over repeated calls, on the reference backend and after a pickle. A second
    node sharing R with sequence_lens given keeps the arrays."""
    oracle("onnx")
    import pickle

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.onnx.ops.recurrent import RecurrentWeights

    nd, hidden, inputs = 2 if attrs.get("direction") == "bidirectional" else 1, 7, 5
    consts = {
        "W": (rng.standard_normal((nd, gates * hidden, inputs)) * 0.5).astype(np.float32),
        "R": (rng.standard_normal((nd, gates * hidden, hidden)) * 0.5).astype(np.float32),
        "B": (rng.standard_normal((nd, 2 * gates * hidden)) * 0.5).astype(np.float32),
    }
    outs = ["y", "yh"]
    nodes = [helper.make_node(kind, ["x", "W", "R", "B"], outs, hidden_size=hidden, **attrs)]
    graph = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, "b", inputs])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    path = tmp_path / "rnn.onnx"
    onnx.save(graph, path)
    model = fastlayers.load(path)
    forms = {k: model._constants[k] for k in ("W", "R")}
    assert all((type(f) is RecurrentWeights) == held for f in forms.values())
    for k, f in forms.items():
        np.testing.assert_array_equal(np.asarray(f), consts[k])
        assert f.shape == consts[k].shape and f.dtype == np.float32
    assert model.count_params() == sum(v.size for v in consts.values())
    for _ in range(3):  # the Python plan, then the native plan
        feeds = {"x": rng.standard_normal((6, 3, inputs)).astype(np.float32)}
        _matches_ort(model, path, feeds, rtol=1e-5, atol=1e-5)
    with fastlayers.use_ops("reference"):
        _matches_ort(model, path, feeds, rtol=1e-5, atol=1e-5)
    again = pickle.loads(pickle.dumps(model))
    assert all(np.array_equal(a, c) for a, c in zip(again(feeds), model(feeds)))

    # R also read by a node the reference runs (uneven sequence_lens): both keep the arrays
    nodes.append(helper.make_node(kind, ["x", "W2", "R", "B", "lens"], ["y2"], hidden_size=hidden, **attrs))
    graph.graph.node.append(nodes[-1])
    graph.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["b"]))
    graph.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    graph.graph.initializer.append(numpy_helper.from_array(consts["W"] + 1, "W2"))
    onnx.save(graph, path)
    model = fastlayers.load(path)
    assert (type(model._constants["W"]) is RecurrentWeights) == held
    assert all(type(model._constants[k]) is np.ndarray for k in ("R", "W2"))
    feeds["lens"] = np.array([6, 2, 4], np.int32)
    _matches_ort(model, path, feeds, rtol=1e-5, atol=1e-5)


def test_convolution_weights_too_small_to_matter_are_zero(tmp_path, rng):
    """A channel switched off in training (weights of 1e-38, folded BatchNormalization scale
    of 1e-37) has its weights zeroed in the FusedConv: products of them and activations would
    be subnormal floats, slow on x86. Results as onnxruntime's."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (0.3 * rng.standard_normal((4, 3, 3, 3))).astype(np.float32)
    w[1] = 1e-38
    w[2, 0] = 3e-36
    scale = np.array([1.0, 1.0, 1.0, 1e-37], np.float32)
    consts = {
        "w": w,
        "b": (0.1 * rng.standard_normal(4)).astype(np.float32),
        "scale": scale,
        "beta": np.zeros(4, np.float32),
        "mean": np.zeros(4, np.float32),
        "var": np.ones(4, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"]),
    ]
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    onnx.save(model, tmp_path / "tiny.onnx")
    ours = fastlayers.load(tmp_path / "tiny.onnx")
    assert ours.op_types == ["FusedConv"]
    w_hwio = np.asarray(ours._plan[0][3]["_w_hwio"])
    assert not w_hwio[..., 1].any() and not w_hwio[..., 3].any() and not w_hwio[:, :, 0, 2].any()
    assert np.count_nonzero(w_hwio) == w_hwio.size - 27 - 27 - 9
    _matches_ort(ours, tmp_path / "tiny.onnx", {"x": rng.standard_normal((2, 3, 6, 7)).astype(np.float32)})


def _views_after_conv_model(rng, views, tail, opset=13, channels=6):
    """x (N, 4, 10, 1) -> Conv (3, 1) -> ``views`` (node makers: (input, output) -> nodes) ->
    ``tail`` (the same) -> y, with the constants they name."""
    from onnx import TensorProto, helper, numpy_helper

    consts = {
        "w": rng.standard_normal((channels, 4, 3, 1)).astype(np.float32),
        "bias3": rng.standard_normal((1, channels, 1)).astype(np.float32),
        "scale3": rng.standard_normal((channels, 1)).astype(np.float32),
        "bias4": rng.standard_normal((channels, 1, 1)).astype(np.float32),
        "scale4": rng.standard_normal((1, channels, 1, 1)).astype(np.float32),
        "along": rng.standard_normal((1, 1, 8)).astype(np.float32),
        "starts": np.zeros(4, np.int64),
        "starts1": np.array([0, 1, 0, 0], np.int64),
        "big": np.full(4, 1_000_000_000, np.int64),
        "cut": np.array([2**31 - 1, 2**31 - 1, 5, 1], np.int64),
        "axes": np.array([0, 1, 2, 3], np.int64),
        "steps2": np.array([1, 1, 2, 1], np.int64),
        "ax3": np.array([3], np.int64),
        "zero1": np.zeros(1, np.int64),
        "big1": np.full(1, 2**62, np.int64),
        "last": np.array([-1], np.int64),
    }
    nodes, value = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 1])], "c"
    for k, make in enumerate(views + tail):
        made = make(value, f"v{k}")
        nodes += made
        value = made[-1].output[0]
    nodes.append(helper.make_node("Identity", [value], ["y"]))
    return make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 10, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
        opset=opset,
    )


def _node(op, *extra, **attrs):
    from onnx import helper

    return lambda x, y: [helper.make_node(op, [x, *extra], [y], **attrs)]


def _tanh_gelu(x, y):
    """x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2, as jax2tf spells it."""
    from onnx import helper, numpy_helper

    c = {
        k: numpy_helper.from_array(np.array(v, np.float32), f"{y}_{k}")
        for k, v in {"a": 0.044715, "s": 0.7978846, "one": 1.0, "half": 0.5}.items()
    }
    return [helper.make_node("Constant", [], [f"{y}_{k}"], value=t) for k, t in c.items()] + [
        helper.make_node("Mul", [f"{y}_a", x], [f"{y}_m0"]),
        helper.make_node("Mul", [x, f"{y}_m0"], [f"{y}_m1"]),
        helper.make_node("Mul", [x, f"{y}_m1"], [f"{y}_m2"]),
        helper.make_node("Add", [x, f"{y}_m2"], [f"{y}_in"]),
        helper.make_node("Mul", [f"{y}_s", f"{y}_in"], [f"{y}_u"]),
        helper.make_node("Tanh", [f"{y}_u"], [f"{y}_t"]),
        helper.make_node("Add", [f"{y}_t", f"{y}_one"], [f"{y}_p"]),
        helper.make_node("Mul", [x, f"{y}_half"], [f"{y}_h"]),
        helper.make_node("Mul", [f"{y}_h", f"{y}_p"], [y]),
    ]


_WHOLE_SLICE = _node("Slice", "starts", "big", "axes")
_CUT_SLICE = _node("Slice", "starts", "cut", "axes")
_SQUEEZE_W = _node("Squeeze", "ax3")
_LAST_AXIS_SLICE = _node("Slice", "zero1", "big1", "last")


@pytest.mark.parametrize(
    "views",
    [[_WHOLE_SLICE, _SQUEEZE_W], [_CUT_SLICE], [_CUT_SLICE, _SQUEEZE_W], [_SQUEEZE_W, _LAST_AXIS_SLICE]],
    ids=["whole-squeeze", "cut", "cut-squeeze", "squeeze-last"],
)
@pytest.mark.parametrize("tail", ["bias-gelu", "scale-bias-relu", "bias"])
def test_bias_and_activation_after_views_of_a_convolution_join_it(tmp_path, rng, backend, views, tail):
    """jax2tf's Conv1D (magika): Conv -> Slice -> Squeeze -> Add of a bias -> a tanh GELU in
    arithmetic; the Add (and a Mul before it) and the activation move before the views, into
    the convolution's bias and epilogue."""
    oracle("onnx")
    import onnx

    rank = 3 if any(v is _SQUEEZE_W for v in views) else 4  # (the constants broadcast per channel)
    bias, scale = _node("Add", f"bias{rank}"), _node("Mul", f"scale{rank}")
    tails = {"bias-gelu": [bias, _tanh_gelu], "scale-bias-relu": [scale, bias, _node("Relu")], "bias": [bias]}
    model = _views_after_conv_model(rng, views, tails[tail])
    onnx.save(model, tmp_path / "views.onnx")
    ours = fastlayers.load(tmp_path / "views.onnx")
    assert ours.op_types[0] == "FusedConv"
    assert not {"Add", "Mul", "Gelu", "Relu", "Tanh"} & set(ours.op_types), ours.op_types
    _matches_ort(ours, tmp_path / "views.onnx", {"x": rng.standard_normal((2, 4, 10, 1)).astype(np.float32)})


@pytest.mark.parametrize(
    "views, tail",
    [
        ([_node("Slice", "starts1", "big", "axes")], [_node("Relu")]),  # channels from the second
        ([_node("Slice", "starts", "big", "axes", "steps2")], [_node("Relu")]),  # every other row
        ([_node("Squeeze")], [_node("Relu")]),  # no axes: the channels' too where there is one
        ([_SQUEEZE_W], [_node("Add", "along")]),  # a constant along the length, not per channel
        ([_SQUEEZE_W], [_node("Sub", "bias3"), _node("Exp")]),  # no epilogue for Exp
    ],
    ids=["channel-start", "step", "squeeze-all", "along", "exp"],
)
def test_arithmetic_after_views_that_move_elements_stays(tmp_path, rng, views, tail):
    """Views that could move an element to another channel or position, constants that are not
    one per channel, activations no epilogue knows: the nodes stay where they were."""
    oracle("onnx")
    import onnx

    onnx.save(_views_after_conv_model(rng, views, tail), tmp_path / "views.onnx")
    ours = fastlayers.load(tmp_path / "views.onnx")
    assert ours.op_types[-1] not in ("Slice", "Squeeze"), ours.op_types
    _matches_ort(ours, tmp_path / "views.onnx", {"x": rng.standard_normal((2, 4, 10, 1)).astype(np.float32)})


def test_views_of_a_convolution_read_elsewhere_keep_their_arithmetic(tmp_path, rng):
    """The convolution's result is also a graph output: its bias Add stays after the views."""
    oracle("onnx")
    import onnx
    from onnx import TensorProto, helper

    model = _views_after_conv_model(rng, [_SQUEEZE_W], [_node("Add", "bias3")])
    model.graph.output.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, None))
    onnx.save(model, tmp_path / "views.onnx")
    ours = fastlayers.load(tmp_path / "views.onnx")
    assert "Add" in ours.op_types
    _matches_ort(ours, tmp_path / "views.onnx", {"x": rng.standard_normal((1, 4, 10, 1)).astype(np.float32)})
