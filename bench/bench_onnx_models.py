"""Whole ONNX models: fastlayers' ONNX import against onnxruntime on the same .onnx file, and
torch on the module it was exported from.

Models (torch.onnx.export, TorchScript exporter, opset 17):
- resnet18: a ResNet-18-like CNN (4 stages of 2 basic blocks, BN folded at load), 224x224 in full;
- lstm_classifier: Embedding 5000x128 -> 2-layer LSTM 128 -> Linear, T = 64;
- transformer_encoder: 2 TransformerEncoderLayers, d = 128, 2 heads, T = 128 (BERT-tiny-like).
Small shapes unless FASTLAYERS_BENCH_FULL=1.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastlayers

from .conftest import check_same, oracle, ort_session, torch_module

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
WORKLOADS = [("resnet18", 1), ("lstm_classifier", 8), ("transformer_encoder", 1)]


def build(torch, name, full=FULL):
    """(torch module, input shape, input dtype) of a workload, full size or small."""
    tnn = torch.nn
    if name == "resnet18":
        width, hw = (64, 224) if full else (8, 32)

        class Block(tnn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.c1, self.b1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False), tnn.BatchNorm2d(cout)
                self.c2, self.b2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False), tnn.BatchNorm2d(cout)
                self.down = (
                    None
                    if stride == 1 and cin == cout
                    else tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))
                )

            def forward(self, x):
                y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
                return torch.relu(y + (x if self.down is None else self.down(x)))

        layers = [tnn.Conv2d(3, width, 7, 2, 3, bias=False), tnn.BatchNorm2d(width), tnn.ReLU(), tnn.MaxPool2d(3, 2, 1)]
        cin = width
        for stage, mult in enumerate((1, 2, 4, 8)):
            for block in range(2):
                layers.append(Block(cin, width * mult, 2 if stage and not block else 1))
                cin = width * mult
        layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, 1000 if full else 10)]
        return tnn.Sequential(*layers), (1, 3, hw, hw), np.float32
    if name == "lstm_classifier":
        vocab, emb, hidden, steps = (5000, 128, 128, 64) if full else (500, 16, 16, 12)

        class Classifier(tnn.Module):
            def __init__(self):
                super().__init__()
                self.emb = tnn.Embedding(vocab, emb)
                self.lstm = tnn.LSTM(emb, hidden, num_layers=2, batch_first=True)
                self.fc = tnn.Linear(hidden, 2)

            def forward(self, ids):
                return self.fc(self.lstm(self.emb(ids))[0][:, -1])

        return Classifier(), (8, steps), np.int64
    d, heads, ff, steps = (128, 2, 512, 128) if full else (32, 2, 64, 16)

    class Encoder(tnn.Module):
        def __init__(self):
            super().__init__()
            layer = tnn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, activation="gelu")
            self.enc = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x):
            return self.enc(x)

    return Encoder(), (1, steps, d), np.float32


def exported(torch, name, directory, full=FULL):
    """(torch module in eval mode, input, path of its TorchScript export at opset 17 with a
    dynamic batch axis) of a workload, with seeded weights and BatchNorm statistics."""
    torch.manual_seed(0)
    module, shape, dtype = build(torch, name, full)
    module = module.eval()
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, shape) if dtype == np.int64 else rng.standard_normal(shape).astype(np.float32)
    path = Path(directory) / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.from_numpy(x),),
            str(path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )
    return module, x, path


@pytest.fixture(scope="module", params=WORKLOADS, ids=[w for w, _ in WORKLOADS])
def engines(request, tmp_path_factory):
    torch = torch_module()
    oracle("onnx")
    name, _ = request.param
    module, x, path = exported(torch, name, tmp_path_factory.mktemp("onnx"))
    import onnx

    ours = fastlayers.load(path)
    sess, sess_nospin = ort_session(onnx.load(str(path))), ort_session(onnx.load(str(path)), spinning=False)

    def run_torch(a):
        with torch.inference_mode():
            return module(torch.from_numpy(a)).numpy()

    def run_ref(a):
        with fastlayers.use_ops("reference"):
            return ours(a)

    return (
        name,
        x,
        {
            "fastlayers-cpu": ours,
            "fastlayers-reference": run_ref,
            "onnxruntime": lambda a: sess.run(None, {"x": a})[0],
            "onnxruntime-nospin": lambda a: sess_nospin.run(None, {"x": a})[0],
            "torch": run_torch,
        },
    )


@pytest.mark.parametrize(
    "engine", ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "onnxruntime-nospin", "torch"]
)
def bench_onnx_model(benchmark, engines, engine):
    name, x, fns = engines
    check_same({e: f(x) for e, f in fns.items()}, rtol=1e-4, atol=1e-4)
    benchmark.group = f"onnx model {name}"
    benchmark.extra_info.update(workload=f"onnx {name}", batch=x.shape[0], engine=engine)
    benchmark(fns[engine], x)
