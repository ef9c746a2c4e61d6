"""torch ``nn.Sequential`` files loaded by fastlayers: the compiled ONNX plan of the stack
(``nn/plans.py``), the same modules run one by one, the stack's ONNX export loaded by
fastlayers, and onnxruntime on that export; interleaved in one process
(``interleaved.interleave``), same thread count, outputs checked equal first.

Workloads: ``mlp`` (Linear 32 -> 64 -> 64 -> 10 with ReLU and Tanh, batch 1) and ``cnn``
(two 3x3 convolutions with BatchNorm, ReLU, a max pool, a global average pool and a Linear
head on (1, 3, 32, 32)); and ``residual``, a module of one's own (``forward`` written in torch
and, the same code, in ``fastlayers.nn``: a stem convolution, two residual blocks of two 3x3
convolutions with BatchNorm, a max pool between them, a global average pool and a Linear head on
(1, 3, 32, 32)), whose weights load from torch's state dict and whose forward fastlayers traces
(``nn/tracing.py``).

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


def own_modules(torch):
    """name -> (torch module, the fastlayers twin written with the same code, input shape)."""
    import fastlayers.nn as nn
    import fastlayers.nn.functional as F

    def block(lib, relu):
        class Block(lib.Module):
            def __init__(self, c):
                super().__init__()
                self.c1, self.b1 = lib.Conv2d(c, c, 3, padding=1), lib.BatchNorm2d(c)
                self.c2, self.b2 = lib.Conv2d(c, c, 3, padding=1), lib.BatchNorm2d(c)

            def forward(self, x):
                return relu(self.b2(self.c2(relu(self.b1(self.c1(x))))) + x)

        return Block

    def net(lib, relu):
        Block = block(lib, relu)

        class Residual(lib.Module):
            def __init__(self):
                super().__init__()
                self.stem, self.pool = lib.Conv2d(3, 16, 3, padding=1), lib.MaxPool2d(2)
                self.one, self.two = Block(16), Block(16)
                self.gap, self.head = lib.AdaptiveAvgPool2d(1), lib.Linear(16, 10)

            def forward(self, x):
                h = self.two(self.pool(self.one(relu(self.stem(x)))))
                return self.head(self.gap(h).reshape(h.shape[0], -1))

        return Residual()

    return {"residual": (net(torch.nn, torch.relu), net(nn, F.relu), (1, 3, 32, 32))}


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
    module_path = fastlayers.LoadOptions(native_plans=False)
    own = own_modules(torch)
    cases = {name: (module, None, shape) for name, (module, shape) in workloads(torch).items()}
    for name, (module, stack, shape) in (cases | own).items():
        module.eval()
        if stack is None:  # a pickled Sequential
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{name}.pt"
                torch.save(module, path)
                stack = fastlayers.load(path)
        else:  # a module of one's own: torch's weights into the twin
            stack.load_state_dict({k: v.numpy() for k, v in module.state_dict().items()})
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, torch.randn(*shape), buffer, dynamo=False, input_names=["x"])
        exported = fastlayers.load(buffer.getvalue())
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        session = ort.InferenceSession(buffer.getvalue(), opts, providers=["CPUExecutionProvider"])
        x = rng.standard_normal(shape).astype(np.float32)

        def by_modules(x=x, stack=stack, traced=name in own):
            if traced:
                with fastlayers.settings.applied(module_path):
                    return stack(x)
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
