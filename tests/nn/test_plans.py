"""``nn.Sequential`` stacks run as compiled ONNX plans (``nn/plans.py``): against torch, the
module-by-module path and its errors; rebuilt when the modules change."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastlayers
import fastlayers.nn as nn
from fastlayers.backends import use_ops
from fastlayers.backends.derived import clear_derived
from fastlayers.errors import ShapeError
from fastlayers.nn import plans
from fastlayers.onnx.writer import GraphWriter

from ..conftest import assert_close, in_threads
from .test_conv import CONV_CASES, POOL_CASES
from .test_core import CASES, randomize


def _compiled(seq, rank):
    """The compiled model serving ``seq``'s calls of ``rank`` axes, or None."""
    entry = plans._COMPILED.get(seq, {}).get(rank)
    return None if entry is None else entry[1]


def _pair(torch, rng, name, args, kwargs):
    ref = getattr(torch.nn, name)(*args, **kwargs).eval()
    randomize(ref, rng, torch)
    ours = getattr(nn, name)(*args, **kwargs)
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    return ref, ours


@pytest.mark.parametrize("name,args,kwargs,shape", CASES + CONV_CASES + POOL_CASES)
def test_each_module_in_a_compiled_stack_matches_torch(name, args, kwargs, shape, torch, rng):
    """A module with a Tanh and a Linear after it (a stack holds a product to be compiled):
    the compiled model where the module has an ONNX form, torch's result either way."""
    ref, ours = _pair(torch, rng, name, args, kwargs)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    with torch.no_grad():
        width = ref(torch.from_numpy(x)).shape[-1]
    head = torch.nn.Linear(width, 3)
    ref_stack = torch.nn.Sequential(ref, torch.nn.Tanh(), head)
    stack = nn.Sequential(ours, nn.Tanh(), nn.Linear(width, 3))
    stack[2].load_state_dict({k: v.numpy() for k, v in head.state_dict().items()})
    with torch.no_grad():
        expected = ref_stack(torch.from_numpy(x)).numpy()
    for _ in range(3):  # the third call runs the plan built at the second
        got = stack(x)
        assert_close(got, expected, rtol=1e-5, atol=1e-5, what=f"{name}{args}{kwargs}")
    key = f"{type(ours).__module__}.{type(ours).__qualname__}"
    if key in plans.FORMS:
        try:
            plans.FORMS[key](GraphWriter(), ours, "x", len(shape))
            has_form = True
        except plans.NoForm:
            has_form = False
        assert (_compiled(stack, len(shape)) is not None) == has_form


def test_a_stack_without_products_keeps_the_modules_path(rng):
    stack = nn.Sequential(nn.BatchNorm1d(16), nn.ReLU())
    x = rng.standard_normal((8, 16)).astype(np.float32)
    for _ in range(2):
        stack(x)
    assert _compiled(stack, 2) is None


def _cnn(torch):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding="same", groups=2),
        torch.nn.SiLU(),
        torch.nn.Sequential(torch.nn.Conv2d(8, 16, 1), torch.nn.ReLU6()),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(16, 10),
        torch.nn.LogSoftmax(dim=-1),
    )


def test_a_torch_cnn_loads_and_runs_compiled(torch, rng, tmp_path):
    ref = _cnn(torch).eval()
    randomize(ref, rng, torch)
    path = tmp_path / "cnn.pt"
    torch.save(ref, path)
    ours = fastlayers.load(path)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 12, 12)).astype(np.float32)
        with torch.no_grad():
            expected = ref(torch.from_numpy(x)).numpy()
        for _ in range(3):
            assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
    model = _compiled(ours, 4)
    assert model is not None
    assert {"FusedConv", "MaxPool", "GlobalAveragePool", "FusedDense"} <= set(model.op_types)
    assert model._native.plan_for([x]) is not None  # its calls run a native plan


def test_changed_weights_and_modules_reach_the_compiled_model(rng):
    stack = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = rng.standard_normal((2, 4)).astype(np.float32)

    def by_modules():
        h = x
        for m in stack:
            h = m(h)
        return h

    assert_close(stack(x), by_modules())
    stack[0].weight = rng.standard_normal((6, 4)).astype(np.float32)  # assigned
    assert_close(stack(x), by_modules())
    stack.load_state_dict({k: v * 2 for k, v in stack.state_dict().items()})  # loaded
    assert_close(stack(x), by_modules())
    stack[2].weight[:] = 0.5  # written in place: seen after clear_derived, as derived weights are
    clear_derived()
    assert_close(stack(x), by_modules())
    stack.append(nn.Sigmoid())  # a module added
    assert_close(stack(x), by_modules())
    assert stack(x).min() > 0


def test_stacks_without_a_form_and_bad_inputs_take_the_modules_path(rng):
    class Doubled(nn.Linear):  # a subclass's forward is its own
        def forward(self, input):
            return 2 * super().forward(input)

    stack = nn.Sequential(Doubled(4, 3), nn.Tanh())
    x = rng.standard_normal((2, 4)).astype(np.float32)
    plain = nn.Linear(4, 3)
    plain.load_state_dict(stack[0].state_dict())
    assert_close(stack(x), np.tanh(2 * plain(x)))
    assert _compiled(stack, 2) is None
    compiled = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    compiled(x)
    assert _compiled(compiled, 2) is not None
    with pytest.raises(ShapeError, match=r"Linear\(in_features=4\): expected input \(\.\.\., 4\)"):
        compiled(np.zeros((2, 5), np.float32))
    # float64 and lists take the modules' path, which casts them
    assert_close(compiled(x.astype(np.float64)), compiled(x))
    assert_close(compiled(x.tolist()), compiled(x))
    with use_ops("reference"):
        assert_close(compiled(x), np.tanh(x @ compiled[0].weight.T + compiled[0].bias), rtol=1e-5, atol=1e-6)
    with fastlayers.settings.applied(fastlayers.LoadOptions(native_plans=False)):
        assert_close(compiled(x), np.tanh(x @ compiled[0].weight.T + compiled[0].bias), rtol=1e-5, atol=1e-6)


def test_threads_share_a_compiled_stack(rng):
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    xs = [rng.standard_normal((3, 8)).astype(np.float32) for _ in range(4)]
    expected = [stack(x) for x in xs]
    results = {}

    def work(i):
        for _ in range(50):
            results[i] = stack(xs[i % 4])

    in_threads(work, 8)
    for i, got in results.items():
        np.testing.assert_array_equal(got, expected[i % 4])


def test_compiled_stacks_keep_memory_flat(rng):
    stack = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4))
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    for _ in range(20):
        stack(x)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(300):
        stack(x)
    in_threads(lambda i: [stack(x) for _ in range(50)], 4)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
    assert _compiled(stack, 4) is not None
