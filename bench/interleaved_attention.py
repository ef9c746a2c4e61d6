"""Interleaved A/B timing of one bench_attention workload (or bench_onnx_models' Transformer
export, ``onnx_transformer``): fastlayers as shipped, fastlayers with the encoder layers run
block by block (no ``ops.encoder_layer``; for the ONNX file, no ``FusedEncoderLayer`` nodes), and
onnxruntime on the same weights (the same file), in one process, round after round, sleeping 0.1 s after onnxruntime's round (its
threads keep spinning briefly). On a noisy shared host this compares engines under the same
load where separate benchmark runs disagree by up to 2x (docs/benchmarks.md).

Run: python bench/interleaved_attention.py bert_tiny --calls 100 --rounds 20 [--threads 2]
     python bench/interleaved_attention.py onnx_transformer --calls 100 --rounds 12
Prints min and median milliseconds per call over the rounds for each engine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ["FASTLAYERS_BENCH_FULL"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=["mha", "encoder_layer", "bert_tiny", "onnx_transformer"])
    parser.add_argument("--calls", type=int, default=30, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    os.environ["FASTLAYERS_BENCH_THREADS"] = str(args.threads)  # read by bench.conftest's sessions
    import fastlayers

    fastlayers.set_num_threads(args.threads)
    engines, restore = (onnx_engines if args.workload == "onnx_transformer" else nn_engines)(args.workload)
    want = engines["onnxruntime"]()
    for name in ("fastlayers", "fastlayers-blocks"):
        print(f"{name} max |difference| from onnxruntime: {np.abs(engines[name]() - want).max():.2e}")
    times = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, fn in engines.items():
            for _ in range(3):
                fn()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
            if name == "onnxruntime":
                time.sleep(0.1)
    for name, ms in times.items():
        ms.sort()
        print(f"{args.workload} {name:18s} min {ms[0]:.3f} median {ms[len(ms) // 2]:.3f} ms")
    restore()


def nn_engines(workload):
    """(engines, restore) for a bench_attention workload: the nn model with and without the
    fused encoder layer, and onnxruntime on its export."""
    from bench import bench_attention as ba
    from bench.conftest import ort_session
    from fastlayers.nn import transformer

    tmodel = ba.build_torch(workload, np.random.default_rng(0))
    model = ba.build_fastlayers(workload, tmodel)
    session = ort_session(ba.build_onnx(workload, tmodel))
    d, _, _, _, _, batch, length = ba.shapes(workload)
    x = np.random.default_rng(1).standard_normal((batch, length, d)).astype(np.float32)
    layer = transformer.TransformerEncoderLayer
    whole = layer._fused_weights

    def shipped():
        layer._fused_weights = whole
        return model(x)

    def blocks():
        layer._fused_weights = lambda self: None
        return model(x)

    def restore():
        layer._fused_weights = whole

    return {"fastlayers": shipped, "fastlayers-blocks": blocks,
            "onnxruntime": lambda: session.run(None, {"x": x})[0]}, restore


def onnx_engines(workload):
    """(engines, restore) for bench_onnx_models' Transformer export: the file loaded as shipped
    and without the encoder-layer fusion, and onnxruntime on the same file."""
    import tempfile
    import warnings

    import onnx
    import torch

    import fastlayers
    from bench.bench_onnx_models import build
    from bench.conftest import ort_session
    from fastlayers.io import onnx as fonnx

    torch.manual_seed(0)
    module, shape, _ = build(torch, "transformer_encoder", full=True)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    path = Path(tempfile.mkdtemp()) / "transformer.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.from_numpy(x),), str(path), dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    shipped = fastlayers.load(path)
    fuse = fonnx.fuse_encoder_layers
    fonnx.fuse_encoder_layers = lambda nodes, *_: nodes
    blocks = fastlayers.load(path)
    fonnx.fuse_encoder_layers = fuse
    session = ort_session(onnx.load(str(path)))
    return {"fastlayers": lambda: shipped(x), "fastlayers-blocks": lambda: blocks(x),
            "onnxruntime": lambda: session.run(None, {"x": x})[0]}, lambda: None


if __name__ == "__main__":
    main()
