"""fastlayers with and without the ONNX load-time rewrites (``fastlayers/onnx/rewrite.py`` and
the Clip / HardSigmoid / Swish activations fused into dense and convolution nodes), and
onnxruntime, on small TorchScript exports (opset 14) of the patterns they target, interleaved
in one process (``bench/interleaved.py``).

Workloads: conv_stack (an OCR-like Conv -> per-channel scale and shift -> ReLU6 / Hardsigmoid /
SiLU stack on a 1x3x32x128 image), mlp_silu (Linear + SiLU x3, batch 8, width 256),
encoder_ln (2 TransformerEncoderLayers, d 64, T 32, LayerNorm decomposed before opset 17),
conv1d (three Conv2d with (5, 1) kernels + ReLU, each between an unsqueeze and a squeeze, as
tf2onnx writes Conv1D, on 1x64x256), conv1d_region (the same convolutions between one unsqueeze
and one squeeze),
noops (an MLP of width 64 with Identity, Dropout, flatten / view chains, x * 1 and x + 0).

Run: python bench/bench_onnx_rewrites.py conv_stack --calls 50 --rounds 10 [--threads 2]
[--without-onnxruntime]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PASSES = ("drop_noops", "fuse_silu", "fuse_layer_norm", "conv_1d", "fold_affine")


def build(torch, workload):
    """(torch module, example input) of a workload."""
    nn = torch.nn
    torch.manual_seed(0)
    if workload == "conv_stack":

        class ConvStack(nn.Module):
            def __init__(self):
                super().__init__()
                widths = [3, 16, 32, 32, 64]
                self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(widths, widths[1:]))
                self.scales = nn.ParameterList(nn.Parameter(torch.rand(b, 1, 1) + 0.5) for b in widths[1:])
                self.shifts = nn.ParameterList(nn.Parameter(torch.randn(b, 1, 1)) for b in widths[1:])
                self.acts = nn.ModuleList([nn.ReLU6(), nn.Hardsigmoid(), nn.SiLU(), nn.ReLU6()])

            def forward(self, x):
                for conv, s, t, act in zip(self.convs, self.scales, self.shifts, self.acts):
                    x = act(conv(x) * s + t)
                return x

        return ConvStack(), torch.randn(1, 3, 32, 128)
    if workload == "mlp_silu":
        return nn.Sequential(
            nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU()
        ), torch.randn(8, 256)
    if workload == "encoder_ln":
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(1, 32, 64)
    if workload in ("conv1d", "conv1d_region"):

        class Conv1dAs2d(nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = nn.ModuleList(nn.Conv2d(64, 64, (5, 1), padding=(2, 0)) for _ in range(3))

            def forward(self, x):
                if workload == "conv1d_region":
                    return self.region(x)
                for conv in self.convs:
                    x = torch.relu(conv(x.unsqueeze(-1)).squeeze(-1))
                return x

            def region(self, x):
                x = x.unsqueeze(-1)
                for conv in self.convs:
                    x = torch.relu(conv(x))
                return x.squeeze(-1)

        return Conv1dAs2d(), torch.randn(1, 64, 256)
    if workload == "noops":

        class Noops(nn.Module):
            def __init__(self):
                super().__init__()
                self.fcs = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))
                self.drop, self.same = nn.Dropout(0.1), nn.Identity()

            def forward(self, x):
                for fc in self.fcs:
                    x = self.drop(torch.relu(fc(self.same(x))))
                    x = x.flatten(1).view(-1, 8, 8).reshape(-1, 64) * 1.0 + 0.0
                return x

        return Noops(), torch.randn(4, 64)
    raise ValueError(workload)


def load_without_rewrites(path):
    """``fastlayers.load`` with the rewrites switched off (the graph as before them)."""
    import fastlayers
    from fastlayers.onnx import fusion as fonnx
    from fastlayers.onnx import rewrite as onnx_rewrite

    saved = {name: getattr(onnx_rewrite, name) for name in PASSES}
    activation = fonnx._fused_activation
    for name in PASSES:
        setattr(onnx_rewrite, name, lambda nodes, *_: nodes)
    fonnx._fused_activation = lambda node, constants: (
        activation(node, constants) if node.op_type in fonnx._FUSABLE_ACTIVATIONS else None
    )
    try:
        return fastlayers.load(path)
    finally:
        for name, fn in saved.items():
            setattr(onnx_rewrite, name, fn)
        fonnx._fused_activation = activation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "workload", choices=["conv_stack", "mlp_silu", "encoder_ln", "conv1d", "conv1d_region", "noops"]
    )
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--without-onnxruntime",
        action="store_true",
        help="time fastlayers alone (onnxruntime's spinning threads disturb small workloads)",
    )
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    import fastlayers
    from bench.interleaved import interleave

    fastlayers.set_num_threads(args.threads)
    module, example = build(torch, args.workload)
    path = Path(tempfile.mkdtemp()) / f"{args.workload}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (example,), str(path), dynamo=False, opset_version=14, input_names=["x"])
    after, before = fastlayers.load(path), load_without_rewrites(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = example.numpy()
    print(f"{args.workload}: {len(before.op_types)} nodes before, {len(after.op_types)} after: {after.op_types}")
    want = session.run(None, {"x": x})[0]
    for name, model in (("rewritten", after), ("not rewritten", before)):
        print(f"{name} max |difference| from onnxruntime: {np.abs(model(x) - want).max():.2e}")
    engines = {"fastlayers": lambda: after(x), "fastlayers-before": lambda: before(x)}
    if not args.without_onnxruntime:
        engines["onnxruntime"] = lambda: session.run(None, {"x": x})
    interleave(engines, args.calls, args.rounds, args.workload)


if __name__ == "__main__":
    main()
