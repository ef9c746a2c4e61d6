"""The bundled demo models (fastlayers/data/digits_*.flm) against onnxruntime and torch.

The demos were trained with Keras; the torch twins below are built from the same weights (the
layouts mapped by hand: HWIO -> OIHW kernels, Keras LSTM gates i,f,c,o = torch i,f,g,o, Keras
MultiHeadAttention projections -> torch's packed in_proj), exported to ONNX for onnxruntime, and
every engine's output is checked equal before timing.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import fastlayers

from .conftest import check_same, oracle, ort_session, torch_module

DATA = Path(fastlayers.__file__).parent / "data"
DEMOS = {"digits_mlp": (64,), "digits_cnn": (8, 8, 1), "digits_lstm": (8, 8), "digits_transformer": (8, 8)}


def _t(torch, a):
    return torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))


def torch_twin(torch, name, model):
    """A torch module computing the fastlayers demo ``model`` with its weights."""
    tnn = torch.nn
    L = {layer.name: layer for layer in model.layers}
    by_type = lambda cls: [layer for layer in model.layers if type(layer).__name__ == cls]  # noqa: E731
    scale = next(iter(by_type("Rescaling")))

    def linear(dense):
        lin = tnn.Linear(*dense.kernel.shape)
        lin.weight, lin.bias = _t(torch, dense.kernel.T), _t(torch, dense.bias)
        return lin

    dense = by_type("Dense")

    class Twin(tnn.Module):
        def __init__(self):
            super().__init__()
            self.scale, self.offset = float(scale._scale), float(scale._offset)
            if name == "digits_mlp":
                bn = by_type("BatchNormalization")[0]
                self.fc1, self.fc2 = linear(dense[0]), linear(dense[1])
                self.bn_scale, self.bn_shift = _t(torch, bn._scale), _t(torch, bn._shift)
            elif name == "digits_cnn":
                convs = by_type("Conv2D")
                self.c1, self.c2 = (tnn.Conv2d(c.kernel.shape[2], c.kernel.shape[3], 3, padding=1) for c in convs)
                for conv, c in zip((self.c1, self.c2), convs):
                    conv.weight, conv.bias = _t(torch, c.kernel.transpose(3, 2, 0, 1)), _t(torch, c.bias)
                self.fc = linear(dense[0])
            elif name == "digits_lstm":
                kernel, recurrent, bias = by_type("LSTM")[0].get_weights()
                self.lstm = tnn.LSTM(kernel.shape[0], recurrent.shape[0], batch_first=True)
                self.lstm.weight_ih_l0, self.lstm.weight_hh_l0 = _t(torch, kernel.T), _t(torch, recurrent.T)
                self.lstm.bias_ih_l0, self.lstm.bias_hh_l0 = _t(torch, bias), _t(torch, np.zeros_like(bias))
                self.fc = linear(dense[0])
            else:
                conv = by_type("Conv1D")[0]
                self.conv = tnn.Conv1d(conv.kernel.shape[1], conv.kernel.shape[2], 3, padding=1)
                self.conv.weight, self.conv.bias = _t(torch, conv.kernel.transpose(2, 1, 0)), _t(torch, conv.bias)
                mha = by_type("MultiHeadAttention")[0]
                wq, bq, wk, bk, wv, bv, wo, bo = mha.get_weights()
                d, heads, key_dim = wq.shape
                self.mha = tnn.MultiheadAttention(d, heads, batch_first=True)
                self.mha.in_proj_weight = _t(torch, np.concatenate([w.reshape(d, -1).T for w in (wq, wk, wv)]))
                self.mha.in_proj_bias = _t(torch, np.concatenate([b.reshape(-1) for b in (bq, bk, bv)]))
                self.mha.out_proj.weight, self.mha.out_proj.bias = _t(torch, wo.reshape(-1, d).T), _t(torch, bo)
                norms = by_type("LayerNormalization")
                self.n1, self.n2 = (tnn.LayerNorm(d, eps=n.epsilon) for n in norms)
                for tn, n in zip((self.n1, self.n2), norms):
                    tn.weight, tn.bias = _t(torch, n.gamma), _t(torch, n.beta)
                self.f1, self.f2, self.fc = linear(L["dense_2"]), linear(L["dense_1"]), linear(L["dense_3"])

        def forward(self, x):
            x = x * self.scale + self.offset
            if name == "digits_mlp":
                h = torch.relu(self.fc1(x)) * self.bn_scale + self.bn_shift
                return torch.softmax(self.fc2(h), -1)
            if name == "digits_cnn":
                h = torch.relu(self.c1(x.permute(0, 3, 1, 2)))
                h = torch.relu(self.c2(torch.nn.functional.max_pool2d(h, 2)))
                return torch.softmax(self.fc(h.mean((2, 3))), -1)
            if name == "digits_lstm":
                return torch.softmax(self.fc(self.lstm(x)[0][:, -1]), -1)
            h = self.conv(x.permute(0, 2, 1)).permute(0, 2, 1)
            h = self.n1(h + self.mha(h, h, h, need_weights=False)[0])
            h = self.n2(h + self.f2(torch.relu(self.f1(h))))
            return torch.softmax(self.fc(h.mean(1)), -1)

    return Twin().eval()


@pytest.fixture(scope="module", params=list(DEMOS))
def engines(request, tmp_path_factory):
    torch = torch_module()
    onnx = oracle("onnx")
    name = request.param
    model = fastlayers.load(DATA / f"{name}.flm")
    twin = torch_twin(torch, name, model)
    with np.load(DATA / "digits_samples.npz") as d:
        samples = d["x"].astype(np.float32).reshape(-1, *DEMOS[name])
    path = tmp_path_factory.mktemp("demo") / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            twin,
            (torch.from_numpy(samples[:2]),),
            str(path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )
    sess, nospin = ort_session(onnx.load(str(path))), ort_session(onnx.load(str(path)), spinning=False)

    def run_torch(x):
        with torch.inference_mode():
            return twin(torch.from_numpy(x)).numpy()

    def run_ref(x):
        with fastlayers.use_ops("reference"):
            return model(x)

    return (
        name,
        samples,
        {
            "fastlayers-cpu": model,
            "fastlayers-reference": run_ref,
            "onnxruntime": lambda x: sess.run(None, {"x": x})[0],
            "onnxruntime-nospin": lambda x: nospin.run(None, {"x": x})[0],
            "torch": run_torch,
        },
    )


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize(
    "engine", ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "onnxruntime-nospin", "torch"]
)
def bench_demo(benchmark, engines, engine, batch):
    name, samples, fns = engines
    x = samples[:batch]
    check_same({e: f(x) for e, f in fns.items()}, rtol=1e-4, atol=1e-5)
    benchmark.group = f"demo {name} batch {batch}"
    benchmark.extra_info.update(workload=f"demo {name}", batch=batch, engine=engine)
    benchmark(fns[engine], x)
