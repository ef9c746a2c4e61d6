"""What a plan step costs beyond its arithmetic: a chain of tiny MatMul + Relu pairs.

An ONNX graph of ``--pairs`` MatMul (16 x 16 weights) + Relu pairs on a (1, 16) input, so small
that a call is nearly all per-step work: fastlayers and onnxruntime in one process, on the same
file, outputs checked equal first, interleaved round after round on ``--threads`` threads.
fastlayers runs the chain as one FusedDenseChain (one native call); ``fastlayers-steps`` loads it
with that pass turned off, one FusedDense step per pair as the compiled plan runs any graph.

Run: python bench/bench_step_overhead.py [--pairs 100] [--threads 1] [--calls 3000] [--rounds 5]
Prints the median microseconds per call and per pair of each engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_real_models import time_rounds

WIDTH = 16


def chain_model(pairs: int, seed: int = 0):
    """The ONNX ModelProto of ``pairs`` MatMul + Relu pairs on an input (1, WIDTH)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, prev = [], [], "x"
    for i in range(pairs):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, WIDTH])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def engines(path: Path, threads: int) -> dict:
    """name -> a no-argument call of each engine on the chain's input."""
    import onnxruntime

    import fastlayers
    from fastlayers.onnx import fusion

    fastlayers.set_num_threads(threads)
    x = {"x": np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)}
    chained = fastlayers.load(path)
    original = fusion.fuse_dense_chains
    fusion.fuse_dense_chains = lambda nodes, constants, outputs: nodes
    try:
        steps = fastlayers.load(path)
    finally:
        fusion.fuse_dense_chains = original
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    want = session.run(None, x)[0]
    for model in (chained, steps):
        np.testing.assert_allclose(model.run(None, x)[0], want, rtol=1e-4, atol=1e-5)
    return {
        "fastlayers": lambda: chained.run(None, x),
        "fastlayers-steps": lambda: steps.run(None, x),
        "onnxruntime": lambda: session.run(None, x),
    }


def measure(pairs: int, threads: int, calls: int, rounds: int) -> dict:
    """Engine -> median microseconds per call over the rounds (each round: every engine once
    untimed, then ``calls`` timed calls, 0.1 s of sleep after each engine)."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.onnx"
        onnx.save(chain_model(pairs), str(path))
        times = time_rounds(engines(path, threads), calls, rounds)  # ms per call, per round
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.pairs, args.threads, args.calls, args.rounds)
    for name, us in result.items():
        print(f"{name:17s} {us:9.1f} µs a call, {us / args.pairs:6.3f} µs a pair")


def test_step_overhead_runs():
    """The benchmark runs on a short chain and times every engine."""
    import pytest

    pytest.importorskip("onnxruntime")
    result = measure(pairs=3, threads=1, calls=2, rounds=1)
    assert set(result) == {"fastlayers", "fastlayers-steps", "onnxruntime"}
    assert all(us > 0 for us in result.values())


if __name__ == "__main__":
    main()
