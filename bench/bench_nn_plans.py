"""torch ``nn.Sequential`` files loaded by fastlayers: the compiled ONNX plan of the stack
(``nn/plans.py``), the same modules run one by one, the stack's ONNX export loaded by
fastlayers, and onnxruntime on that export; interleaved in one process
(``interleaved.interleave``), same thread count, outputs checked equal first.

Workloads: ``mlp`` (Linear 32 -> 64 -> 64 -> 10 with ReLU and Tanh, batch 1) and ``cnn``
(two 3x3 convolutions with BatchNorm, ReLU, a max pool, a global average pool and a Linear
head on (1, 3, 32, 32)).

Run: python bench/bench_nn_plans.py [--threads 1] [--calls 500 --rounds 7]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def workloads(torch):
    return {
        "mlp": (
            torch.nn.Sequential(
                torch.nn.Linear(32, 64),
                torch.nn.ReLU(),
                torch.nn.Linear(64, 64),
                torch.nn.Tanh(),
                torch.nn.Linear(64, 10),
            ),
            (1, 32),
        ),
        "cnn": (
            torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(8, 16, 3, padding=1),
                torch.nn.BatchNorm2d(16),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(16, 10),
            ),
            (1, 3, 32, 32),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    import fastlayers
    from bench.interleaved import interleave

    torch.manual_seed(0)
    fastlayers.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    for name, (module, shape) in workloads(torch).items():
        module.eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.pt"
            torch.save(module, path)
            stack = fastlayers.load(path)
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, torch.randn(*shape), buffer, dynamo=False, input_names=["x"])
        exported = fastlayers.load(buffer.getvalue())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        session = ort.InferenceSession(buffer.getvalue(), opts, providers=["CPUExecutionProvider"])
        x = rng.standard_normal(shape).astype(np.float32)

        def by_modules(x=x, stack=stack):
            for m in stack:
                x = m(x)
            return x

        engines = {
            "fastlayers-nn": lambda: stack(x),
            "fastlayers-modules": by_modules,
            "fastlayers-onnx": lambda: exported(x),
            "onnxruntime": lambda: session.run(None, {"x": x}),
        }
        want = session.run(None, {"x": x})[0]
        for engine, fn in engines.items():
            for _ in range(3):
                got = fn()
            got = got[0] if isinstance(got, list) else got
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name}: {engine}")
        interleave(engines, args.calls, args.rounds, name)


if __name__ == "__main__":
    main()
