"""ONNX control flow in a call: Loop and Scan bodies, fastlayers against onnxruntime on the
same file, interleaved in one process (``interleaved.interleave``), same thread count,
outputs checked equal first.

Workloads:
- ``scan_rnn``: a tanh RNN written as a Scan over 20 steps of (2, 8) -> 16 (two products, the
  bias, a scale read from outside the body), stacking every state;
- ``loop_stacked``: a Loop of 24 iterations carrying (1, 16) through a product, a Cast of the
  iteration number and a Tanh, stacking each iteration's input;
- ``torch_for_while``: a TorchScript export of a for loop over the time axis of (2, 12, 16)
  (a Linear per step) followed by a while loop on the values (both Loops carry tensors only).

Run: python bench/bench_onnx_loops.py [--threads 1] [--calls 300 --rounds 7]
prints per workload each engine's min and median ms per call and the median per-round ratio to
onnxruntime.
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

F32, I64, BOOL = 1, 7, 9


def _model(onnx, graph) -> bytes:
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _const(onnx, name, a):
    a = np.asarray(a)
    kind = {np.dtype(np.float32): F32, np.dtype(np.int64): I64, np.dtype(np.bool_): BOOL}[a.dtype]
    return onnx.helper.make_tensor(name, kind, a.shape, a.ravel().tolist())


def scan_rnn(onnx, rng, steps=20, batch=2, n_in=8, hidden=16):
    h = onnx.helper
    body = h.make_graph(
        [
            h.make_node("MatMul", ["xt", "w"], ["p"]),
            h.make_node("MatMul", ["s", "u"], ["q"]),
            h.make_node("Add", ["p", "q"], ["r"]),
            h.make_node("Add", ["r", "bias"], ["r2"]),
            h.make_node("Tanh", ["r2"], ["s2"]),
            h.make_node("Mul", ["s2", "scale"], ["o"]),
        ],
        "body",
        [h.make_tensor_value_info("s", F32, [batch, hidden]), h.make_tensor_value_info("xt", F32, [batch, n_in])],
        [h.make_tensor_value_info("s2", F32, [batch, hidden]), h.make_tensor_value_info("o", F32, [batch, hidden])],
    )
    graph = h.make_graph(
        [
            h.make_node("Mul", ["k", "two"], ["scale"]),
            h.make_node("Scan", ["s0", "x"], ["s_end", "ys"], body=body, num_scan_inputs=1),
        ],
        "scan",
        [
            h.make_tensor_value_info("s0", F32, [batch, hidden]),
            h.make_tensor_value_info("x", F32, [steps, batch, n_in]),
            h.make_tensor_value_info("k", F32, [1]),
        ],
        [h.make_tensor_value_info("s_end", F32, None), h.make_tensor_value_info("ys", F32, None)],
        initializer=[
            _const(onnx, "w", (0.3 * rng.standard_normal((n_in, hidden))).astype(np.float32)),
            _const(onnx, "u", (0.3 * rng.standard_normal((hidden, hidden))).astype(np.float32)),
            _const(onnx, "bias", rng.standard_normal(hidden).astype(np.float32)),
            _const(onnx, "two", np.array([2.0], np.float32)),
        ],
    )
    feed = {
        "s0": rng.standard_normal((batch, hidden)).astype(np.float32),
        "x": rng.standard_normal((steps, batch, n_in)).astype(np.float32),
        "k": np.array([0.5], np.float32),
    }
    return _model(onnx, graph), feed


def loop_stacked(onnx, rng, trips=24, hidden=16):
    h = onnx.helper
    body = h.make_graph(
        [
            h.make_node("Cast", ["i"], ["i_f"], to=F32),
            h.make_node("MatMul", ["h_in", "w"], ["p"]),
            h.make_node("Mul", ["i_f", "b"], ["ib"]),
            h.make_node("Add", ["p", "ib"], ["q"]),
            h.make_node("Tanh", ["q"], ["h_out"]),
            h.make_node("Identity", ["h_in"], ["h_prev"]),
            h.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", I64, []),
            h.make_tensor_value_info("c_in", BOOL, []),
            h.make_tensor_value_info("h_in", F32, [1, hidden]),
        ],
        [
            h.make_tensor_value_info("c_out", BOOL, []),
            h.make_tensor_value_info("h_out", F32, [1, hidden]),
            h.make_tensor_value_info("h_prev", F32, [1, hidden]),
        ],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["m", "go", "h0"], ["h_end", "hs"], body=body)],
        "loop",
        [h.make_tensor_value_info("h0", F32, [1, hidden])],
        [h.make_tensor_value_info("h_end", F32, None), h.make_tensor_value_info("hs", F32, None)],
        initializer=[
            _const(onnx, "w", (0.4 * rng.standard_normal((hidden, hidden))).astype(np.float32)),
            _const(onnx, "b", (0.1 * rng.standard_normal(hidden)).astype(np.float32)),
            _const(onnx, "go", np.array(True)),
            _const(onnx, "m", np.array(trips, np.int64)),
        ],
    )
    return _model(onnx, graph), {"h0": rng.standard_normal((1, hidden)).astype(np.float32)}


def torch_for_while(onnx, rng):
    import torch

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(16, 16)

        def forward(self, x):
            h = torch.zeros(x.shape[0], 16)
            for t in range(x.shape[1]):
                h = torch.tanh(self.w(x[:, t]) + h)
            k = 0
            while bool(h.sum() < 30.0) and k < 50:
                h = h + 0.5
                k += 1
            return h

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(Recurrent().eval()),
            (torch.randn(2, 12, 16),),
            buffer,
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "b", 1: "t"}},
        )
    return buffer.getvalue(), {"x": rng.standard_normal((2, 12, 16)).astype(np.float32)}


WORKLOADS = {"scan_rnn": scan_rnn, "loop_stacked": loop_stacked, "torch_for_while": torch_for_while}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS))
    args = parser.parse_args()

    import onnx
    import onnxruntime as ort

    import fastlayers
    from bench.interleaved import interleave
    from fastlayers.onnx import lowering

    fastlayers.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    for name in args.only or WORKLOADS:
        data, feed = WORKLOADS[name](onnx, rng)
        ours = fastlayers.load(data)
        python = fastlayers.load(data, options=fastlayers.LoadOptions(native_plans=False))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        for _ in range(3):  # the plan is built at the second call
            got, want, same = ours.run(None, feed), session.run(None, feed), python.run(None, feed)
        for g, w, p in zip(got, want, same):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name}: fastlayers vs onnxruntime")
            np.testing.assert_allclose(p, w, rtol=1e-4, atol=1e-5, err_msg=f"{name}: Python plan vs onnxruntime")
        plans = [p for p in ours._native.plans.values() if isinstance(p, lowering.Plan)] if ours._native else []
        print(f"{name}: native plan {plans[0].summary[:2] if plans else None}")
        interleave(
            {
                "fastlayers": lambda: ours.run(None, feed),
                "fastlayers-python": lambda: python.run(None, feed),
                "onnxruntime": lambda: session.run(None, feed),
            },
            args.calls,
            args.rounds,
            name,
        )


if __name__ == "__main__":
    main()
