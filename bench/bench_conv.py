"""Convolution and pooling: fastlayers (cpu, reference) vs onnxruntime vs torch, float32.

Workloads: Conv2D 3x3 64->64 on 56x56 at batch 1 and 8; depthwise 3x3 on 128
channels 56x56; max pool 3x3 stride 2 (padding 1) on 64x112x112; a ResNet-18-like stack
(7x7/2 stem, 3x3/2 max pool, 4 stages of 2 basic blocks, 64-512 channels, global average pool,
dense 1000; batch norm folded into the convolutions' biases, as inference graphs have it) at
224x224 batch 1.

Every engine gets the same weights and input (fastlayers NHWC, onnxruntime and torch NCHW, each
in its native layout) and the outputs are compared before timing. ``extra_info["flops"]`` holds
2 x the multiply-adds of the convolution workloads, so bench/tools/report.py gives their GFLOP/s as a
share of this machine's sgemm (bench/bench_sgemm.py).

Shapes: the full shapes when FASTLAYERS_BENCH_FULL=1; otherwise small ones, so CI's
``--benchmark-disable`` pass stays cheap. The numpy reference is left out of the full ResNet
(seconds per call).

Run: FASTLAYERS_BENCH_FULL=1 python -m pytest bench/bench_conv.py --benchmark-enable
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

from .conftest import check_same, oracle, ort_session, torch_module

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
# name -> (batch, channels, size) for the single-op workloads
SHAPES = {
    "conv3x3": dict(c=64, hw=56) if FULL else dict(c=16, hw=14),
    "depthwise3x3": dict(c=128, hw=56) if FULL else dict(c=16, hw=14),
    "maxpool3x3s2": dict(c=64, hw=112) if FULL else dict(c=8, hw=28),
    "resnet18": dict(hw=224, width=64) if FULL else dict(hw=32, width=8),
}
ENGINES = ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "torch"]


def he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


# ---------------------------------------------------------------------------- graph spec
def conv_spec(rng, name, cin, cout, k, stride, pad, groups=1):
    """One convolution: torch-layout weight (cout, cin/g, k, k), bias, stride, symmetric pad."""
    return dict(
        name=name,
        w=he(rng, (cout, cin // groups, k, k), cin // groups * k * k),
        b=(rng.standard_normal(cout) * 0.1).astype(np.float32),
        stride=stride,
        pad=pad,
        groups=groups,
    )


def resnet_spec(rng, width):
    stem = conv_spec(rng, "stem", 3, width, 7, 2, 3)
    blocks, cin = [], width
    for stage in range(4):
        cout = width * 2**stage
        for i in range(2):
            stride = 2 if stage > 0 and i == 0 else 1
            block = dict(
                c1=conv_spec(rng, f"s{stage}b{i}c1", cin, cout, 3, stride, 1),
                c2=conv_spec(rng, f"s{stage}b{i}c2", cout, cout, 3, 1, 1),
                proj=conv_spec(rng, f"s{stage}b{i}p", cin, cout, 1, stride, 0) if stride != 1 or cin != cout else None,
            )
            blocks.append(block)
            cin = cout
    fc_w = he(rng, (1000, cin), cin)
    return dict(stem=stem, blocks=blocks, fc_w=fc_w, fc_b=np.zeros(1000, np.float32))


def resnet_flops(spec, hw):
    """2 x multiply-adds of every convolution and the dense layer."""
    total, size = 0, hw

    def conv(c, size):
        out = (size + 2 * c["pad"] - c["w"].shape[2]) // c["stride"] + 1
        return 2 * out * out * int(np.prod(c["w"].shape)), out

    f, size = conv(spec["stem"], size)
    total += f
    size = (size + 2 - 3) // 2 + 1
    for blk in spec["blocks"]:
        f1, s1 = conv(blk["c1"], size)
        f2, _ = conv(blk["c2"], s1)
        total += f1 + f2 + (conv(blk["proj"], size)[0] if blk["proj"] is not None else 0)
        size = s1
    return total + 2 * spec["fc_w"].size


# ------------------------------------------------------------------------ fastlayers
def fl_conv(c, activation=None, name=None):
    layer = L.Conv2D(
        c["w"].shape[0],
        c["w"].shape[2],
        strides=c["stride"],
        padding=((c["pad"], c["pad"]), (c["pad"], c["pad"])),
        groups=c["groups"],
        activation=activation,
        name=name or c["name"],
    )
    return layer


def fl_set(layer, c):
    layer.set_weights([np.ascontiguousarray(c["w"].transpose(2, 3, 1, 0)), c["b"]])


def build_fastlayers_resnet(spec, hw):
    inp = Input((hw, hw, 3))
    convs = []

    def conv(x, c, activation=None):
        layer = fl_conv(c, activation)
        convs.append((layer, c))
        return layer(x)

    h = conv(inp, spec["stem"], "relu")
    h = L.MaxPooling2D(3, 2, padding=((1, 1), (1, 1)))(h)
    for blk in spec["blocks"]:
        y = conv(h, blk["c1"], "relu")
        y = conv(y, blk["c2"])
        skip = conv(h, blk["proj"]) if blk["proj"] is not None else h
        h = L.Activation("relu")(L.Add()([y, skip]))
    h = L.GlobalAveragePooling2D()(h)
    dense = L.Dense(1000)
    out = dense(h)
    model = Model(inp, out)
    for layer, c in convs:
        fl_set(layer, c)
    dense.set_weights([np.ascontiguousarray(spec["fc_w"].T), spec["fc_b"]])
    return model


# --------------------------------------------------------------------------------- onnx
def onnx_model(nodes, inits, in_shape, out_name):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def onnx_conv(nodes, inits, x, c, out):
    from onnx import helper, numpy_helper

    inits += [numpy_helper.from_array(c["w"], c["name"] + "_w"), numpy_helper.from_array(c["b"], c["name"] + "_b")]
    k, p = c["w"].shape[2], c["pad"]
    nodes.append(
        helper.make_node(
            "Conv",
            [x, c["name"] + "_w", c["name"] + "_b"],
            [out],
            kernel_shape=[k, k],
            strides=[c["stride"]] * 2,
            pads=[p] * 4,
            group=c["groups"],
        )
    )
    return out


def build_onnx_resnet(spec, hw):
    oracle("onnx")
    from onnx import helper, numpy_helper

    nodes, inits = [], []
    h = onnx_conv(nodes, inits, "x", spec["stem"], "stem")
    nodes.append(helper.make_node("Relu", [h], ["stem_r"]))
    nodes.append(
        helper.make_node("MaxPool", ["stem_r"], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    )
    h = "pool"
    for i, blk in enumerate(spec["blocks"]):
        y = onnx_conv(nodes, inits, h, blk["c1"], f"b{i}c1")
        nodes.append(helper.make_node("Relu", [y], [f"b{i}r1"]))
        y = onnx_conv(nodes, inits, f"b{i}r1", blk["c2"], f"b{i}c2")
        skip = onnx_conv(nodes, inits, h, blk["proj"], f"b{i}p") if blk["proj"] is not None else h
        nodes.append(helper.make_node("Add", [y, skip], [f"b{i}add"]))
        nodes.append(helper.make_node("Relu", [f"b{i}add"], [f"b{i}out"]))
        h = f"b{i}out"
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits += [numpy_helper.from_array(spec["fc_w"], "fc_w"), numpy_helper.from_array(spec["fc_b"], "fc_b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
    return onnx_model(nodes, inits, [1, 3, hw, hw], "y")


# -------------------------------------------------------------------------------- torch
def torch_conv(torch, c):
    m = torch.nn.Conv2d(
        c["w"].shape[1] * c["groups"], c["w"].shape[0], c["w"].shape[2], c["stride"], c["pad"], groups=c["groups"]
    )
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(c["w"]))
        m.bias.copy_(torch.from_numpy(c["b"]))
    return m


def build_torch_resnet(spec):
    torch = torch_module()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, blk):
            super().__init__()
            self.c1, self.c2 = torch_conv(torch, blk["c1"]), torch_conv(torch, blk["c2"])
            self.proj = torch_conv(torch, blk["proj"]) if blk["proj"] is not None else None

        def forward(self, x):
            y = self.c2(torch.relu(self.c1(x)))
            return torch.relu(y + (self.proj(x) if self.proj is not None else x))

    fc = nn.Linear(spec["fc_w"].shape[1], 1000)
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy(spec["fc_w"]))
        fc.bias.copy_(torch.from_numpy(spec["fc_b"]))
    return nn.Sequential(
        torch_conv(torch, spec["stem"]),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        *[Block(b) for b in spec["blocks"]],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        fc,
    ).eval()


# ---------------------------------------------------------------------------- workloads
def single_op(kind, rng, batch):
    """(fastlayers model (NHWC), onnx proto (NCHW), torch module, NCHW input shape, flops)."""
    from onnx import helper

    s = SHAPES[kind]
    c, hw = s["c"], s["hw"]
    inp = Input((hw, hw, c))
    nodes, inits = [], []
    torch = torch_module()
    if kind == "conv3x3":
        spec = conv_spec(rng, "conv", c, c, 3, 1, 1)
        layer = fl_conv(spec)
        model = Model(inp, layer(inp))
        fl_set(layer, spec)
        onnx_conv(nodes, inits, "x", spec, "y")
        tmod = torch_conv(torch, spec)
        flops = 2 * batch * hw * hw * c * c * 9
    elif kind == "depthwise3x3":
        spec = conv_spec(rng, "dw", c, c, 3, 1, 1, groups=c)
        layer = L.DepthwiseConv2D(3, padding=((1, 1), (1, 1)))
        model = Model(inp, layer(inp))
        layer.set_weights([np.ascontiguousarray(spec["w"][:, 0].transpose(1, 2, 0))[..., None], spec["b"]])
        onnx_conv(nodes, inits, "x", spec, "y")
        tmod = torch_conv(torch, spec)
        flops = 2 * batch * hw * hw * c * 9
    else:  # maxpool3x3s2
        model = Model(inp, L.MaxPooling2D(3, 2, padding=((1, 1), (1, 1)))(inp))
        nodes.append(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        tmod = torch.nn.MaxPool2d(3, 2, 1)
        flops = 0
    return model, onnx_model(nodes, inits, [batch, c, hw, hw], "y"), tmod, (batch, c, hw, hw), flops


WORKLOADS = [("conv3x3", 1), ("conv3x3", 8), ("depthwise3x3", 1), ("maxpool3x3s2", 1), ("resnet18", 1)]


@pytest.fixture(scope="module", params=WORKLOADS, ids=[f"{w}-b{b}" for w, b in WORKLOADS])
def engines(request):
    kind, batch = request.param
    rng = np.random.default_rng(0)
    if kind == "resnet18":
        s = SHAPES[kind]
        spec = resnet_spec(rng, s["width"])
        model = build_fastlayers_resnet(spec, s["hw"])
        proto, tmod = build_onnx_resnet(spec, s["hw"]), build_torch_resnet(spec)
        shape, flops = (batch, 3, s["hw"], s["hw"]), resnet_flops(spec, s["hw"])
    else:
        model, proto, tmod, shape, flops = single_op(kind, rng, batch)
    sess = ort_session(proto)
    torch = torch_module()
    nchw_out = kind != "resnet18"

    def run_ref(x):
        with fastlayers.use_ops("reference"):
            return model(x)

    def run_torch(x):
        with torch.inference_mode():
            return tmod(torch.from_numpy(x)).numpy()

    fns = {
        # fastlayers runs NHWC, the others NCHW: each gets its native layout
        "fastlayers-cpu": ("nhwc", model),
        "onnxruntime": ("nchw", lambda x: sess.run(None, {"x": x})[0]),
        "torch": ("nchw", run_torch),
    }
    if not (FULL and kind == "resnet18"):
        fns["fastlayers-reference"] = ("nhwc", run_ref)
    return kind, batch, shape, flops, nchw_out, fns


@pytest.mark.parametrize("engine", ENGINES)
def bench_conv(benchmark, engines, engine):
    kind, batch, shape, flops, nchw_out, fns = engines
    if engine not in fns:
        pytest.skip(f"{engine} is left out of the full {kind} workload (seconds per call)")
    x_nchw = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x_nhwc = np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))
    inputs = {"nchw": x_nchw, "nhwc": x_nhwc}
    outs = {}
    for name, (layout, fn) in fns.items():
        y = fn(inputs[layout])
        if layout == "nhwc" and nchw_out:
            y = y.transpose(0, 3, 1, 2)
        outs[name] = y
    scale = float(np.max(np.abs(outs["onnxruntime"])))
    check_same(outs, rtol=1e-4, atol=1e-5 * max(scale, 1.0))
    layout, fn = fns[engine]
    benchmark.group = f"{kind} batch {batch}"
    benchmark.extra_info.update(workload=kind, batch=batch, engine=engine, shape=list(shape), full=FULL)
    if flops:
        benchmark.extra_info["flops"] = flops
    benchmark(fn, inputs[layout])
