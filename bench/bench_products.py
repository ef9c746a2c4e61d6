"""One matrix product node, fastlayers against onnxruntime: the kernels alone, through the same
path a model's MatMul takes (``fastlayers.load`` of a one-node ONNX graph).

A float32 ``MatMul`` (a (m, k) standard normal against a constant b) or, with ``--int8``, a
``MatMulInteger`` (uint8 a with zero point 3 against a constant int8 b, full-range values).
Each output is checked first: the float product against onnxruntime's, the integer product
against the exact int64 one for both engines (onnxruntime's u8 x s8 kernel saturates its int16
pair sums on a CPU without VNNI; then only fastlayers' is checked, and the run says so).
Interleaved in one process at one thread count (bench/interleaved.py):
    python bench/bench_products.py 1024x1024x1024 32x384x1536 [--int8] [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def product_engines(m: int, k: int, n: int, threads: int, int8: bool = False) -> dict:
    """{"fastlayers", "onnxruntime": no-argument callables} of one MatMul (float32) or
    MatMulInteger (``int8``) node of a (m, k) by a constant b (k, n), outputs checked."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import fastlayers

    rng = np.random.default_rng(0)
    if int8:
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["c"])
        types, consts = (TensorProto.UINT8, TensorProto.INT32), [np.array(3, np.uint8)]
    else:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["a", "b"], ["c"])
        types, consts = (TensorProto.FLOAT, TensorProto.FLOAT), []
    graph = helper.make_graph(
        [node],
        "product",
        [helper.make_tensor_value_info("a", types[0], [m, k])],
        [helper.make_tensor_value_info("c", types[1], [m, n])],
        [numpy_helper.from_array(b, "b")] + [numpy_helper.from_array(v, "a_zp") for v in consts],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    model = fastlayers.load(data)
    label, got, theirs = f"{m}x{k}x{n}", model(a), session.run(None, {"a": a})[0]
    if int8:
        want = (a.astype(np.int64) - 3) @ b.astype(np.int64)
        if not np.array_equal(got, want):
            raise SystemExit(f"{label}: fastlayers differs from the exact product by {np.abs(got - want).max()}")
        if not np.array_equal(theirs, want):
            print(f"{label}: onnxruntime's sums saturate on this CPU (its output not checked)")
    else:
        np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-4 * np.sqrt(k), err_msg=label)
    return {"fastlayers": lambda: model(a), "onnxruntime": lambda: session.run(None, {"a": a})}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+", metavar="MxKxN")
    parser.add_argument("--int8", action="store_true", help="MatMulInteger (u8 x s8) instead of a float32 MatMul")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=None, help="calls per round (default: about 2e8 multiply-adds)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    import fastlayers
    from bench.interleaved import interleave

    fastlayers.set_num_threads(args.threads)
    for shape in args.shapes:
        m, k, n = (int(v) for v in shape.lower().split("x"))
        calls = args.calls or max(5, int(2e8 // (m * k * n)))
        engines = product_engines(m, k, n, args.threads, args.int8)
        interleave(engines, calls, args.rounds, f"{shape}{' int8' if args.int8 else ''} ({args.threads} thread(s))")


if __name__ == "__main__":
    main()
