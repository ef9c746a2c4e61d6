"""Attention and Transformer layers: fastlayers (cpu, reference) vs onnxruntime vs torch.

Workloads, float32, batch first, ``FASTLAYERS_BENCH_THREADS`` (2) threads:

- ``mha``: MultiheadAttention d=256, 4 heads, T=128, batch 8 (self-attention, no weights out);
- ``encoder_layer``: TransformerEncoderLayer d=256, ff=1024, relu, post-norm, same input;
- ``bert_tiny``: a 2-layer encoder, d=128, 2 heads, ff=512, gelu, T=128, batch 1.

The shapes are cut (T=32, batch <= 2) unless FASTLAYERS_BENCH_FULL is set. torch.onnx.export
(TorchScript) fails on MultiheadAttention here, so the ONNX graphs are built with onnx.helper
from the same weights (MatMul, Softmax, LayerNormalization, ...). Every engine's output is
checked against torch's before timing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastlayers
import fastlayers.nn as fnn

from .conftest import check_same, oracle, ort_session, torch_module

FULL = bool(os.environ.get("FASTLAYERS_BENCH_FULL"))
# name: (d_model, heads, ff, activation, layers, batch, T); layers 0 = attention only
WORKLOADS = {
    "mha": (256, 4, 0, None, 0, 8, 128),
    "encoder_layer": (256, 4, 1024, "relu", 1, 8, 128),
    "bert_tiny": (128, 2, 512, "gelu", 2, 1, 128),
}
ENGINES = ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "torch"]


def shapes(name):
    d, h, ff, act, n, batch, T = WORKLOADS[name]
    if not FULL:
        batch, T = min(batch, 2), 32
    return d, h, ff, act, n, batch, T


def build_torch(name, rng):
    torch = torch_module()
    d, h, ff, act, n, _, _ = shapes(name)
    if n == 0:
        m = torch.nn.MultiheadAttention(d, h, batch_first=True)
    else:
        layer = torch.nn.TransformerEncoderLayer(d, h, ff, 0.0, act, batch_first=True)
        m = (
            layer
            if n == 1 and name == "encoder_layer"
            else torch.nn.TransformerEncoder(layer, n, enable_nested_tensor=False)
        )
    m.eval()
    with torch.no_grad():
        for p in m.state_dict().values():
            p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.1).astype(np.float32)))
            if p.ndim == 1 and p.shape[0] == d:  # layer norm weights near 1
                p.add_(1.0)
    return m


def build_fastlayers(name, tmodel):
    d, h, ff, act, n, _, _ = shapes(name)
    if n == 0:
        m = fnn.MultiheadAttention(d, h, batch_first=True)
    else:
        layer = fnn.TransformerEncoderLayer(d, h, ff, 0.0, act, batch_first=True)
        m = layer if n == 1 and name == "encoder_layer" else fnn.TransformerEncoder(layer, n)
    m.load_state_dict({k: v.numpy() for k, v in tmodel.state_dict().items()})
    if n == 0:
        return lambda x: m(x, x, x, need_weights=False)[0]
    return m


# ------------------------------------------------------------------------------------- ONNX
class _Graph:
    def __init__(self):
        oracle("onnx")
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, value, dtype=np.float32):
        name = f"c{len(self.inits)}"
        self.inits.append(self.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type, *inputs, **attrs):
        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def linear(self, x, w_oi, b_o):
        y = self.op("MatMul", x, self.const(np.ascontiguousarray(w_oi.T)))
        return self.op("Add", y, self.const(b_o)) if b_o is not None else y

    def mha(self, x, sd, prefix, d, h):
        hd = d // h
        qkv = self.linear(x, sd[prefix + "in_proj_weight"], sd[prefix + "in_proj_bias"])
        qkv = self.op("Reshape", qkv, self.const([0, 0, 3, h, hd], np.int64))
        qkv = self.op("Transpose", qkv, perm=[2, 0, 3, 1, 4])  # (3, B, H, T, hd)
        q, k, v = (self.op("Gather", qkv, self.const(i, np.int64), axis=0) for i in range(3))
        scores = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]))
        scores = self.op("Mul", scores, self.const(1.0 / np.sqrt(hd)))
        w = self.op("Softmax", scores, axis=-1)
        ctx = self.op("Transpose", self.op("MatMul", w, v), perm=[0, 2, 1, 3])
        ctx = self.op("Reshape", ctx, self.const([0, 0, d], np.int64))
        return self.linear(ctx, sd[prefix + "out_proj.weight"], sd[prefix + "out_proj.bias"])

    def layer_norm(self, x, sd, prefix):
        return self.op(
            "LayerNormalization",
            x,
            self.const(sd[prefix + "weight"]),
            self.const(sd[prefix + "bias"]),
            axis=-1,
            epsilon=1e-5,
        )

    def encoder_layer(self, x, sd, prefix, d, h, act):
        y = self.layer_norm(self.op("Add", x, self.mha(x, sd, prefix + "self_attn.", d, h)), sd, prefix + "norm1.")
        f = self.linear(y, sd[prefix + "linear1.weight"], sd[prefix + "linear1.bias"])
        f = self.op("Relu" if act == "relu" else "Gelu", f)
        f = self.linear(f, sd[prefix + "linear2.weight"], sd[prefix + "linear2.bias"])
        return self.layer_norm(self.op("Add", y, f), sd, prefix + "norm2.")

    def model(self, out):
        from onnx import TensorProto

        helper = self.helper
        self.nodes[-1].output[0] = "y"
        graph = helper.make_graph(
            self.nodes,
            "attention",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def build_onnx(name, tmodel):
    d, h, ff, act, n, _, _ = shapes(name)
    sd = {k: v.numpy() for k, v in tmodel.state_dict().items()}
    g = _Graph()
    if n == 0:
        out = g.mha("x", sd, "", d, h)
    elif name == "encoder_layer":
        out = g.encoder_layer("x", sd, "", d, h, act)
    else:
        out = "x"
        for i in range(n):
            out = g.encoder_layer(out, sd, f"layers.{i}.", d, h, act)
    return g.model(out)


@pytest.fixture(scope="module", params=list(WORKLOADS))
def engines(request):
    name = request.param
    rng = np.random.default_rng(0)
    tmodel = build_torch(name, rng)
    torch = torch_module()
    model = build_fastlayers(name, tmodel)
    sess = ort_session(build_onnx(name, tmodel))
    is_mha = WORKLOADS[name][4] == 0

    def run_torch(x):
        with torch.inference_mode():
            xt = torch.from_numpy(x)
            return (tmodel(xt, xt, xt, need_weights=False)[0] if is_mha else tmodel(xt)).numpy()

    def run_ref(x):
        with fastlayers.use_ops("reference"):
            return model(x)

    return name, {
        "torch": run_torch,
        "fastlayers-cpu": model,
        "fastlayers-reference": run_ref,
        "onnxruntime": lambda x: sess.run(None, {"x": x})[0],
    }


@pytest.mark.parametrize("engine", ENGINES)
def bench_attention(benchmark, engines, engine):
    name, fns = engines
    d, _, _, _, _, batch, T = shapes(name)
    x = np.random.default_rng(1).standard_normal((batch, T, d)).astype(np.float32)
    check_same({e: f(x) for e, f in fns.items()}, rtol=1e-4, atol=1e-4)
    benchmark.group = f"{name} batch {batch} T {T}"
    benchmark.extra_info.update(workload=name, batch=batch, seq_len=T, engine=engine)
    benchmark(fns[engine], x)


# ------------------------------------------------------------------------------ long keys
#: ``sdpa_long``: scaled_dot_product_attention on (batch 1, 2 heads, T, 64) q, k, v with T =
#: 2048 (256 when cut): no weights kept, so fastlayers' pair kernel runs its query rows in
#: blocks whose scores stay in cache (docs/design.md, "Long keys").
LONG = (1, 2, 2048 if FULL else 256, 64)


def _long_keys_onnx():
    from onnx import TensorProto, helper

    b, h, t, d = LONG
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, t, d]) for n in "qkv"]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [1.0 / np.sqrt(d)])
    graph = helper.make_graph(
        nodes, "sdpa", spec, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, t, d])], [scale]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture(scope="module")
def long_keys_engines():
    torch = torch_module()
    sess = ort_session(_long_keys_onnx())

    def run_torch(qkv):
        with torch.inference_mode():
            q, k, v = (torch.from_numpy(a) for a in qkv)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v).numpy()

    def run_ref(qkv):
        with fastlayers.use_ops("reference"):
            return fnn.functional.scaled_dot_product_attention(*qkv)

    return {
        "torch": run_torch,
        "fastlayers-cpu": lambda qkv: fnn.functional.scaled_dot_product_attention(*qkv),
        "fastlayers-reference": run_ref,
        "onnxruntime": lambda qkv: sess.run(None, dict(zip("qkv", qkv)))[0],
    }


@pytest.mark.parametrize("engine", ENGINES)
def bench_long_keys(benchmark, long_keys_engines, engine):
    b, h, t, d = LONG
    qkv = tuple(np.random.default_rng(1).standard_normal((3, b, h, t, d)).astype(np.float32))
    check_same({e: f(qkv) for e, f in long_keys_engines.items()}, rtol=1e-4, atol=1e-5)
    benchmark.group = f"sdpa_long batch {b} heads {h} T {t}"
    benchmark.extra_info.update(workload="sdpa_long", batch=b, seq_len=t, engine=engine, flops=4 * b * h * t * t * d)
    benchmark(long_keys_engines[engine], qkv)
