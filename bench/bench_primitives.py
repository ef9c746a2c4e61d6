"""Primitives on (64, 1024) float32: fastlayers cpu vs reference vs torch (same threads)."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends import get_ops
from fastlayers.backends.reference import fold_batch_norm

from .conftest import check_same, torch_module

SHAPE = (64, 1024)
ACTS = ["relu", "leaky_relu", "sigmoid", "silu", "gelu", "gelu_tanh", "tanh", "softmax", "log_softmax"]
TORCH_ACTS = {
    "relu": lambda t, x: t.relu(x),
    "leaky_relu": lambda t, x: t.nn.functional.leaky_relu(x, 0.2),
    "sigmoid": lambda t, x: t.sigmoid(x),
    "silu": lambda t, x: t.nn.functional.silu(x),
    "gelu": lambda t, x: t.nn.functional.gelu(x),
    "gelu_tanh": lambda t, x: t.nn.functional.gelu(x, approximate="tanh"),
    "tanh": lambda t, x: t.tanh(x),
    "softmax": lambda t, x: t.softmax(x, -1),
    "log_softmax": lambda t, x: t.log_softmax(x, -1),
}


@pytest.fixture(scope="module")
def x():
    return (np.random.default_rng(0).standard_normal(SHAPE) * 3).astype(np.float32)


def engines_for(name, x):
    torch = torch_module()
    alpha = 0.2 if name == "leaky_relu" else 0.0
    tx = torch.from_numpy(x)
    fns = {
        "fastlayers-cpu": lambda: get_ops("cpu").activation(x, name, alpha),
        "fastlayers-reference": lambda: get_ops("reference").activation(x, name, alpha),
        "torch": lambda: TORCH_ACTS[name](torch, tx).numpy(),
    }
    # torch's float32 gelu is off by 1e-6 absolute (1e-3 relative) near x = -3.5; ours matches
    # the float64 reference (tests/backends/test_cpu_ops.py)
    check_same({k: f() for k, f in fns.items()}, rtol=2e-5, atol=2e-6)
    return fns


@pytest.mark.parametrize("engine", ["fastlayers-cpu", "fastlayers-reference", "torch"])
@pytest.mark.parametrize("name", ACTS)
def bench_activation(benchmark, x, name, engine):
    fn = engines_for(name, x)[engine]
    benchmark.group = f"activation {name} {SHAPE}"
    benchmark.extra_info.update(workload=f"activation {name}", batch=SHAPE[0], engine=engine)
    benchmark(fn)


@pytest.mark.parametrize("engine", ["fastlayers-cpu", "fastlayers-reference", "torch"])
@pytest.mark.parametrize("op", ["layer_norm", "batch_norm"])
def bench_normalization(benchmark, x, op, engine):
    torch = torch_module()
    rng = np.random.default_rng(1)
    g, b = rng.standard_normal(SHAPE[1]).astype(np.float32), rng.standard_normal(SHAPE[1]).astype(np.float32)
    mean, var = rng.standard_normal(SHAPE[1]).astype(np.float32), rng.uniform(0.5, 2, SHAPE[1]).astype(np.float32)
    tx, tg, tb, tm, tv = (torch.from_numpy(a) for a in (x, g, b, mean, var))
    scale, shift = fold_batch_norm(mean, var, g, b, 1e-3)
    if op == "layer_norm":
        fns = {
            "fastlayers-cpu": lambda: get_ops("cpu").layer_norm(x, g, b, 1e-3),
            "fastlayers-reference": lambda: get_ops("reference").layer_norm(x, g, b, 1e-3),
            "torch": lambda: torch.nn.functional.layer_norm(tx, (SHAPE[1],), tg, tb, 1e-3).numpy(),
        }
    else:
        fns = {
            "fastlayers-cpu": lambda: get_ops("cpu").batch_norm(x, scale, shift),
            "fastlayers-reference": lambda: get_ops("reference").batch_norm(x, scale, shift),
            "torch": lambda: torch.nn.functional.batch_norm(tx, tm, tv, tg, tb, False, 0.0, 1e-3).numpy(),
        }
    check_same({k: f() for k, f in fns.items()}, rtol=1e-5, atol=1e-5)
    benchmark.group = f"{op} {SHAPE}"
    benchmark.extra_info.update(workload=op, batch=SHAPE[0], engine=engine)
    benchmark(fns[engine])
