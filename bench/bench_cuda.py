"""CUDA backend vs torch on the GPU (and fastlayers cpu as the baseline), host arrays in and out.

Workloads: a wide MLP (256-512-512-10, gelu) at batch 64 and 1024; a small CNN
(conv 3x3 32 relu, depthwise 3x3, max pool, conv 3x3 64 relu, avg pool, flatten, dense 10) on
32x32x3 images at batch 16; batched masked attention softmax + products (B 8, H 8, T 128, d 64);
torch-style modules loaded from torch's state dicts at batch 1 and 32: a 2-layer LSTM (64 -> 256,
50 steps) and a Transformer encoder layer (d 256, 4 heads, feed-forward 1024, 64 tokens).
Outputs are compared before timing. Each timed call includes the one host-to-device copy of the
input and the one device-to-host copy of the output (torch: ``.cuda()`` / ``.cpu()`` likewise).

Needs a GPU: run with ``CUDA_VISIBLE_DEVICES=0`` set explicitly (tests/conftest.py hides the GPU
by default) and without ``NUMBA_ENABLE_CUDASIM``::

    CUDA_VISIBLE_DEVICES=0 python -m pytest bench/bench_cuda.py --benchmark-enable

Without a usable GPU every benchmark here skips (the only skip of this kind in the project: it is
not an oracle skip, and FASTLAYERS_REQUIRE_ORACLES does not turn it into a failure).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

from .conftest import check_same, torch_module


def _cuda_ops_or_skip():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("no GPU benchmark under the CUDA simulator")
    try:
        return fastlayers.get_ops("cuda")
    except fastlayers.errors.UnsupportedError as e:
        pytest.skip(f"no GPU: {e}")


def _torch_cuda():
    """torch with CUDA, or None; TF32 off, so that its products and convolutions are float32
    like fastlayers' (cuDNN's default TF32 convolutions differed by 0.8 % on the small CNN)."""
    torch = torch_module()
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _randomize(model, rng):
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model


def build_mlp(rng):
    x = Input((256,))
    h = L.Dense(512, activation="gelu")(x)
    h = L.Dense(512, activation="gelu")(h)
    return _randomize(Model(x, L.Dense(10, activation="softmax")(h)), rng)


def torch_mlp(model, torch):
    mods = []
    for layer in model.layers[1:]:
        lin = torch.nn.Linear(*layer.kernel.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(layer.kernel.T.copy()))
            lin.bias.copy_(torch.from_numpy(layer.bias))
        mods += [lin, torch.nn.GELU() if layer.activation == "gelu" else torch.nn.Softmax(-1)]
    return torch.nn.Sequential(*mods).eval()


def build_cnn(rng):
    return _randomize(
        fastlayers.Sequential(
            [
                Input((32, 32, 3)),
                L.Conv2D(32, 3, padding="same", activation="relu"),
                L.DepthwiseConv2D(3, padding="same"),
                L.MaxPooling2D(2),
                L.Conv2D(64, 3, padding="same", activation="relu"),
                L.AveragePooling2D(2),
                L.Flatten(),
                L.Dense(10),
            ]
        ),
        rng,
    )


def torch_cnn(model, torch):
    c1, dw, _, c2, _, _, dense = model.layers
    nn = torch.nn

    def conv(layer, groups=1):
        k = layer.kernel  # HWIO (depthwise: HWCM)
        w = k.transpose(3, 2, 0, 1) if groups == 1 else k.transpose(2, 3, 0, 1).reshape(-1, 1, 3, 3)
        m = nn.Conv2d(w.shape[1] * groups, w.shape[0], 3, padding=1, groups=groups)
        with torch.no_grad():
            m.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
            m.bias.copy_(torch.from_numpy(layer.bias))
        return m

    lin = nn.Linear(*dense.kernel.shape)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(dense.kernel.T.copy()))
        lin.bias.copy_(torch.from_numpy(dense.bias))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.dw, self.c2, self.lin = conv(c1), conv(dw, 32), conv(c2), lin

        def forward(self, x_nhwc):
            x = x_nhwc.permute(0, 3, 1, 2)
            x = torch.relu(self.c1(x))
            x = nn.functional.max_pool2d(self.dw(x), 2)
            x = nn.functional.avg_pool2d(torch.relu(self.c2(x)), 2)
            return self.lin(x.permute(0, 2, 3, 1).flatten(1))  # flatten in NHWC order

    return Net().eval()


WORKLOADS = {"wide_mlp": (build_mlp, torch_mlp, (256,)), "small_cnn": (build_cnn, torch_cnn, (32, 32, 3))}


@pytest.mark.parametrize("workload,batch", [("wide_mlp", 64), ("wide_mlp", 1024), ("small_cnn", 16)])
@pytest.mark.parametrize("engine", ["fastlayers-cuda", "torch-cuda", "fastlayers-cpu"])
def bench_cuda_model(benchmark, workload, batch, engine):
    _cuda_ops_or_skip()
    build, build_torch, shape = WORKLOADS[workload]
    rng = np.random.default_rng(0)
    model = build(rng)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    gpu = model.to("cuda")
    fns = {"fastlayers-cpu": model, "fastlayers-cuda": gpu}
    torch = _torch_cuda()
    if torch is not None:
        tmodel = build_torch(model, torch).cuda()

        def run_torch(a):
            with torch.inference_mode():
                out = tmodel(torch.from_numpy(a).cuda()).cpu().numpy()
            return out

        fns["torch-cuda"] = run_torch
    elif engine == "torch-cuda":
        pytest.skip("torch has no CUDA here")
    check_same({e: f(x) for e, f in fns.items()}, rtol=1e-3, atol=1e-4)
    benchmark.group = f"cuda {workload} batch {batch}"
    benchmark.extra_info.update(workload=workload, batch=batch, engine=engine)
    benchmark(fns[engine], x)


#: torch-style modules: (fastlayers.nn module, torch module) from the same constructor
#: arguments, fastlayers' loading torch's state dict; input shape without the batch.
NN_WORKLOADS = {
    "lstm_2x256": (lambda nn: nn.LSTM(64, 256, num_layers=2, batch_first=True), (50, 64)),
    "encoder_layer_256": (lambda nn: nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), (64, 256)),
}


@pytest.mark.parametrize("workload", list(NN_WORKLOADS))
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("engine", ["fastlayers-cuda", "torch-cuda", "fastlayers-cpu"])
def bench_cuda_nn(benchmark, workload, batch, engine):
    _cuda_ops_or_skip()
    make, shape = NN_WORKLOADS[workload]
    torch = torch_module()
    torch.manual_seed(0)
    tmodel = make(torch.nn).eval()
    model = make(fastlayers.nn)
    model.load_state_dict(tmodel.state_dict())
    x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731 - LSTM: output
    gpu = model.to("cuda")
    fns = {"fastlayers-cpu": lambda a: first(model(a)), "fastlayers-cuda": lambda a: first(gpu(a))}
    if _torch_cuda() is not None:
        tmodel = tmodel.cuda()

        def run_torch(a):
            with torch.inference_mode():
                return first(tmodel(torch.from_numpy(a).cuda())).cpu().numpy()

        fns["torch-cuda"] = run_torch
    elif engine == "torch-cuda":
        pytest.skip("torch has no CUDA here")
    check_same({e: f(x) for e, f in fns.items()}, rtol=1e-3, atol=1e-4)
    benchmark.group = f"cuda {workload} batch {batch}"
    benchmark.extra_info.update(workload=workload, batch=batch, engine=engine)
    benchmark(fns[engine], x)


@pytest.mark.parametrize("engine", ["fastlayers-cuda", "torch-cuda", "fastlayers-cpu"])
def bench_cuda_attention(benchmark, engine):
    ops = _cuda_ops_or_skip()
    rng = np.random.default_rng(0)
    b, h, t, d = 8, 8, 128, 64
    q, k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3))
    mask = np.where(rng.random((b, 1, 1, t)) < 0.1, -np.inf, 0).astype(np.float32)
    cpu = fastlayers.get_ops("cpu")
    fns = {
        "fastlayers-cuda": lambda: ops.attention(q, k, v, d**-0.5, mask)[0],
        "fastlayers-cpu": lambda: cpu.attention(q, k, v, d**-0.5, mask)[0],
    }
    torch = _torch_cuda()
    if torch is not None:
        tq, tk, tv, tm = (torch.from_numpy(a) for a in (q, k, v, mask))

        def run_torch():
            with torch.inference_mode():
                out = torch.nn.functional.scaled_dot_product_attention(
                    tq.cuda(), tk.cuda(), tv.cuda(), attn_mask=tm.cuda()
                )
            return out.cpu().numpy()

        fns["torch-cuda"] = run_torch
    elif engine == "torch-cuda":
        pytest.skip("torch has no CUDA here")
    check_same({e: f() for e, f in fns.items()}, rtol=1e-3, atol=1e-4)
    benchmark.group = "cuda attention B8 H8 T128 d64"
    benchmark.extra_info.update(workload="attention", batch=b, engine=engine)
    benchmark(fns[engine])
