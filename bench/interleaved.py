"""Interleaved A/B timing of one benchmark workload: fastlayers and onnxruntime (and, for the
Transformer encoder layers, fastlayers without its whole-layer primitive) on the same weights,
in one process, round after round, sleeping 0.1 s after each round (the other engines' threads keep
spinning briefly). On a noisy shared host this compares engines under the same load where
separate benchmark runs disagree by up to 2x (docs/benchmarks.md).

Workloads: mha, encoder_layer, bert_tiny (bench_attention; "fastlayers-blocks" runs the encoder
layers block by block, without ``ops.encoder_layer``); onnx_resnet18, onnx_lstm_classifier,
onnx_transformer_encoder (bench_onnx_models' exports, fastlayers.load against onnxruntime on the
same file; for the Transformer "fastlayers-blocks" loads it without the FusedEncoderLayer
fusion); lstm_b1, lstm_b32, gru_b1, text (bench_rnn).

Run: python bench/interleaved.py bert_tiny --calls 100 --rounds 20 [--threads 2]
Prints min and median milliseconds per call over the rounds for each engine, and the median over
the rounds of each engine's time divided by onnxruntime's in the same round (the paired ratio,
which the host's slow drifts affect least).
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
    parser.add_argument(
        "workload",
        choices=[
            "mha",
            "encoder_layer",
            "bert_tiny",
            "onnx_resnet18",
            "onnx_lstm_classifier",
            "onnx_transformer_encoder",
            "lstm_b1",
            "lstm_b32",
            "gru_b1",
            "text",
        ],
    )
    parser.add_argument("--calls", type=int, default=30, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    os.environ["FASTLAYERS_BENCH_THREADS"] = str(args.threads)  # read by bench.conftest's sessions
    import fastlayers

    fastlayers.set_num_threads(args.threads)
    setup = (
        onnx_engines
        if args.workload.startswith("onnx_")
        else rnn_engines
        if args.workload in ("lstm_b1", "lstm_b32", "gru_b1", "text")
        else nn_engines
    )
    engines, restore = setup(args.workload)
    want = engines["onnxruntime"]()
    for name in engines:
        if name != "onnxruntime":
            print(f"{name} max |difference| from onnxruntime: {np.abs(engines[name]() - want).max():.2e}")
    interleave(engines, args.calls, args.rounds, args.workload)
    restore()


def interleave(engines, calls, rounds, label) -> None:
    """Time each engine (a no-argument callable) for ``calls`` calls per round, round after
    round, sleeping 0.1 s after each engine's round (onnxruntime's, OpenVINO's and tract's threads
    spin on after a call) so that no round starts beside another engine's spinning threads; print
    each engine's min and median ms per call and the median of its per-round ratio to onnxruntime;
    return {engine: [ms per call of each round]}."""
    times = {name: [] for name in engines}
    for _ in range(rounds):
        for name, fn in engines.items():
            for _ in range(3):
                fn()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e3)
            time.sleep(0.1)  # the threads of onnxruntime, OpenVINO (TBB) and tract spin on
    base = times.get("onnxruntime")
    for name, ms in times.items():
        paired = (
            ""
            if base is None or name == "onnxruntime"
            else f", x onnxruntime per round: median {np.median(np.divide(ms, base)):.2f}"
        )
        print(f"{label} {name:18s} min {min(ms):.3f} median {np.median(ms):.3f} ms{paired}")
    return times


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

    return {
        "fastlayers": shipped,
        "fastlayers-blocks": blocks,
        "onnxruntime": lambda: session.run(None, {"x": x})[0],
    }, restore


def onnx_engines(workload):
    """(engines, restore) for a bench_onnx_models export: the file as fastlayers loads it and
    onnxruntime on the same file (for the Transformer also loaded without the encoder-layer
    fusion)."""
    import tempfile

    import onnx
    import torch

    import fastlayers
    from bench.bench_onnx_models import exported
    from bench.conftest import ort_session
    from fastlayers.onnx import fusion as fonnx

    name = workload[len("onnx_") :]
    _, x, path = exported(torch, name, tempfile.mkdtemp(), full=True)
    shipped = fastlayers.load(path)
    session = ort_session(onnx.load(str(path)))
    engines = {"fastlayers": lambda: shipped(x)}
    if name == "transformer_encoder":
        fuse = fonnx.fuse_encoder_layers
        fonnx.fuse_encoder_layers = lambda nodes, *_: nodes
        blocks = fastlayers.load(path)
        fonnx.fuse_encoder_layers = fuse
        engines["fastlayers-blocks"] = lambda: blocks(x)
    engines["onnxruntime"] = lambda: session.run(None, {"x": x})[0]
    return engines, lambda: None


def rnn_engines(workload):
    """(engines, restore) for a bench_rnn workload: the fastlayers model and onnxruntime on
    the same weights."""
    from bench import bench_rnn

    if workload == "text":
        x, fns = bench_rnn.text_setup()
    else:
        _, _, _, x, fns = bench_rnn.recurrent_setup(workload)
    return {"fastlayers": lambda: fns["fastlayers-cpu"](x), "onnxruntime": lambda: fns["onnxruntime"](x)}, lambda: None


if __name__ == "__main__":
    main()
