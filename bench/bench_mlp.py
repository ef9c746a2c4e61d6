"""Dense stacks: fastlayers (cpu, reference) vs onnxruntime (spinning on/off) vs torch.

Workloads: the bundled digits MLP (64-64-10) and a wider MLP (256-512-512-10, gelu), at batch 1
and 8. Every engine gets the same weights and inputs; outputs are compared before timing.
"""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

from .conftest import check_same, oracle, ort_session, torch_module
from .onnx_export import to_onnx

WORKLOADS = {
    "digits_mlp": (64, [(64, "relu"), (10, "softmax")]),
    "wide_mlp": (256, [(512, "gelu"), (512, "gelu"), (10, "softmax")]),
}
ENGINES = ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "onnxruntime-nospin", "torch"]


def build_fastlayers(d_in, spec, rng):
    x = Input((d_in,))
    h = x
    for units, act in spec:
        h = L.Dense(units, activation=act)(h)
    model = Model(x, h)
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model


def build_torch(model, spec):
    torch = torch_module()
    mods = []
    weights = model.get_weights()
    for i, (units, act) in enumerate(spec):
        lin = torch.nn.Linear(*weights[2 * i].shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(weights[2 * i].T.copy()))
            lin.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
        mods += [lin, {"relu": torch.nn.ReLU(), "gelu": torch.nn.GELU(), "softmax": torch.nn.Softmax(-1)}[act]]
    return torch.nn.Sequential(*mods).eval()


@pytest.fixture(scope="module", params=list(WORKLOADS))
def engines(request):
    rng = np.random.default_rng(0)
    d_in, spec = WORKLOADS[request.param]
    model = build_fastlayers(d_in, spec, rng)
    oracle("onnx")
    proto = to_onnx(model)
    sess, sess_nospin = ort_session(proto), ort_session(proto, spinning=False)
    torch = torch_module()
    tmodel = build_torch(model, spec)

    def run_torch(x):
        with torch.inference_mode():
            return tmodel(torch.from_numpy(x)).numpy()

    def run_ref(x):
        with fastlayers.use_ops("reference"):
            return model(x)

    return (
        request.param,
        d_in,
        {
            "fastlayers-cpu": model,
            "fastlayers-reference": run_ref,
            "onnxruntime": lambda x: sess.run(None, {"x": x})[0],
            "onnxruntime-nospin": lambda x: sess_nospin.run(None, {"x": x})[0],
            "torch": run_torch,
        },
    )


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("engine", ENGINES)
def bench_mlp(benchmark, engines, engine, batch):
    name, d_in, fns = engines
    x = np.random.default_rng(1).standard_normal((batch, d_in)).astype(np.float32)
    check_same({e: f(x) for e, f in fns.items()})
    benchmark.group = f"{name} batch {batch}"
    dims = [d_in] + [units for units, _ in WORKLOADS[name][1]]
    flops = 2 * batch * sum(a * b for a, b in zip(dims, dims[1:]))
    benchmark.extra_info.update(workload=name, batch=batch, engine=engine, flops=flops)
    benchmark(fns[engine], x)
