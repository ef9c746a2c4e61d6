"""Modules with a ``forward`` of their own run as compiled ONNX plans (``nn/tracing.py``):
against torch and the module path, per input shape, what ends a trace, rebuilt when the
modules change, shared by threads with memory flat."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastlayers
import fastlayers.nn as nn
import fastlayers.nn.functional as F
from fastlayers.backends.derived import clear_derived
from fastlayers.errors import ShapeError
from fastlayers.nn import tracing

from ..conftest import assert_close, in_threads

MODULE_PATH = fastlayers.LoadOptions(native_plans=False)


def _compiled(module, *shapes):
    """The compiled model serving ``module``'s calls on inputs of ``shapes``, or None."""
    entry = tracing._COMPILED.get(module, {}).get(tuple(tuple(s) for s in shapes))
    return None if entry is None else entry[1]


def _by_modules(module, x):
    with fastlayers.settings.applied(MODULE_PATH):
        return module(x)


def _randomize(module, rng, torch):
    """Weights of either sign within 0.3 (running variances within [0.5, 1.5]): outputs of
    order one, where float32 rounding stays within the tolerances."""
    with torch.no_grad():
        for name, p in module.state_dict().items():
            if p.dtype.is_floating_point:
                low, high = (0.5, 1.5) if name.endswith("running_var") else (-0.3, 0.3)
                p.copy_(torch.from_numpy(rng.uniform(low, high, tuple(p.shape)).astype(np.float32)))


def _nets(torch):
    """(torch's net, ours): a residual block of its own inside a net of its own (a stem, max
    and average pools, shapes read in forward, a concatenation, a scaled branch, a Linear head,
    log-softmax), written the same way in both."""

    class TorchBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.c2(torch.relu(self.b1(self.c1(x)))) + x)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.block = torch.nn.Conv2d(3, 8, 3, padding=1), TorchBlock()
            self.pool, self.mp = torch.nn.AdaptiveAvgPool2d(1), torch.nn.MaxPool2d(2)
            self.fc = torch.nn.Linear(8 * 4 * 4 + 8, 5)

        def forward(self, x):
            h = self.block(torch.relu(self.stem(x)))
            g = self.pool(h).reshape(h.shape[0], -1)
            f = self.mp(h).reshape(h.shape[0], -1)
            return torch.nn.functional.log_softmax(self.fc(torch.cat([f, g * 0.5], 1)), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)

        def forward(self, x):
            return F.relu(self.c2(F.relu(self.b1(self.c1(x)))) + x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.block = nn.Conv2d(3, 8, 3, padding=1), Block()
            self.pool, self.mp = nn.AdaptiveAvgPool2d(1), nn.MaxPool2d(2)
            self.fc = nn.Linear(8 * 4 * 4 + 8, 5)

        def forward(self, x):
            h = self.block(F.relu(self.stem(x)))
            g = self.pool(h).reshape(h.shape[0], -1)
            f = self.mp(h).reshape(h.shape[0], -1)
            return F.log_softmax(self.fc(np.concatenate([f, g * 0.5], 1)), dim=-1)

    return TorchNet().eval(), Net()


def test_a_module_of_ones_own_compiles_and_matches_torch(torch, rng):
    """Its forward traced at the first call of each input shape (that call's result is the
    module path's), then the compiled model: torch's outputs, the convolutions fused with the
    normalization and the residual sum, a native plan serving."""
    ref, ours = _nets(torch)
    _randomize(ref, rng, torch)
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        with torch.no_grad():
            want = ref(torch.from_numpy(x)).numpy()
        for _ in range(3):  # traced, compiled, the compiled model's native plan
            assert_close(ours(x), want, rtol=1e-4, atol=1e-5)
        assert_close(ours(x), _by_modules(ours, x), rtol=1e-5, atol=1e-5)
        model = _compiled(ours, x.shape)
        assert model is not None
        assert model.op_types.count("FusedConv") == 3 and "Add" not in model.op_types
        assert model._native.plan_for([x]) is not None


class _Head(nn.Module):
    """A Linear and a LayerNorm under functional calls, transposes, a mean, a matrix product
    with a parameter, returning a tuple."""

    def __init__(self, rng):
        super().__init__()
        self.proj, self.norm = nn.Linear(6, 8), nn.LayerNorm(8)
        self.mix = rng.standard_normal((5, 5)).astype(np.float32)

    def forward(self, x):  # x (batch, 5, 6)
        h = F.gelu(self.norm(self.proj(x)), approximate="tanh")
        mixed = (h.transpose(0, 2, 1) @ self.mix).transpose(0, 2, 1)  # along the 5 steps
        pooled = np.maximum(mixed.mean(axis=1), 0.0) - np.tanh(h.sum(axis=1)) / 2
        return F.softmax(F.linear(pooled, self.proj.weight[:, :6].T.copy()), dim=-1), h


def test_functional_calls_and_array_methods_compile(rng):
    head = _Head(rng)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    want = _by_modules(head, x)
    for _ in range(3):
        got = head(x)
        assert type(got) is tuple and len(got) == 2
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert _compiled(head, x.shape) is not None


class _Pair(nn.Module):
    """A forward of two arrays: features of each, concatenated, a Linear head."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 6), nn.Linear(3, 6), nn.Linear(12, 2)

    def forward(self, x, y):
        return self.head(np.concatenate([F.relu(self.a(x)), F.tanh(self.b(y))], axis=-1)), self.a(x) * 0.5


def test_a_forward_of_several_arrays_compiles(rng):
    pair = _Pair()
    x, y = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    with fastlayers.settings.applied(MODULE_PATH):
        want = pair(x, y)
    for _ in range(3):
        got = pair(x, y)
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    model = _compiled(pair, x.shape, y.shape)
    assert model is not None and model._native.plan_for([x, y]) is not None
    assert _compiled(pair, x.shape, y.shape) is _compiled(pair, (3, 4), (3, 3))


class _Branching(nn.Module):
    def __init__(self, calls):
        super().__init__()
        self.fc, self.calls = nn.Linear(4, 3), calls

    def forward(self, x):
        self.calls.append(1)  # a list held, not set: the module's state does not change
        if x.mean() > 0:  # a branch on a value: the trace ends
            return self.fc(x)
        return -self.fc(x)


class _Clipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return np.clip(self.fc(x), -0.1, 0.1)  # a numpy function the trace does not write


class _Activations(nn.Module):
    def forward(self, x):  # no Linear or convolution: not worth a compiled model
        return F.relu(x) * 2


def test_what_the_trace_cannot_write_keeps_the_module_path(rng):
    """A branch on a value, a numpy function without a node, or no product: that shape keeps
    the module path (the first call runs forward twice when its trace ends early, once after),
    the same numbers."""
    x = rng.standard_normal((2, 4)).astype(np.float32)
    calls = []
    branching = _Branching(calls)
    for _ in range(3):
        got = branching(x)
    assert len(calls) == 4  # the first call traced forward, then ran it on arrays; one each after
    np.testing.assert_array_equal(got, branching.fc(x) if x.mean() > 0 else -branching.fc(x))
    assert _compiled(branching, x.shape) is None
    clipped = _Clipped()
    for _ in range(2):
        got = clipped(x)
    np.testing.assert_array_equal(got, np.clip(clipped.fc(x), -0.1, 0.1))
    assert _compiled(clipped, x.shape) is None
    plain = _Activations()
    np.testing.assert_array_equal(plain(x), np.maximum(x, 0) * 2)
    assert tracing._COMPILED[plain][(x.shape,)][1] is None

    class Noisy(nn.Module):
        traceable = False  # its forward draws numbers: a trace would keep the first draw

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x) + rng.standard_normal(3).astype(np.float32)

    noisy = Noisy()
    assert not np.array_equal(noisy(x), noisy(x)) and noisy not in tracing._COMPILED

    class Compared(_Clipped):  # __eq__ without __hash__: unhashable, the module path
        def __eq__(self, other):
            return self is other

        def forward(self, x):
            return self.fc(x)

    compared = Compared()
    np.testing.assert_array_equal(compared(x), compared.fc(x))


def test_the_first_call_runs_forward_once_and_errors_are_the_modules(rng):
    ref_calls = []

    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            ref_calls.append(1)
            return F.tanh(self.fc(x))

    module = Counted()
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for _ in range(3):
        module(x)
    assert len(ref_calls) == 1  # the trace was the first call
    with pytest.raises(ShapeError, match=r"Linear\(in_features=4\)"):
        module(np.zeros((2, 5), np.float32))
    assert_close(module(x.astype(np.float64)), module(x))  # other dtypes: the module path casts


def test_changed_weights_reach_the_compiled_model(torch, rng):
    _, ours = _nets(torch)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for _ in range(2):
        ours(x)
    ours.load_state_dict({k: v * 0.5 for k, v in ours.state_dict().items()})
    assert_close(ours(x), _by_modules(ours, x), rtol=1e-5, atol=1e-6)
    ours.fc.bias[:] = 3.0  # in place: seen after clear_derived, as derived weights are
    clear_derived()
    assert_close(ours(x), _by_modules(ours, x), rtol=1e-5, atol=1e-6)
    with fastlayers.settings.applied(MODULE_PATH):
        ours(x[:1])
    assert _compiled(ours, (1, 3, 8, 8)) is None  # native_plans off: not traced


def test_threads_share_a_compiled_module_and_memory_stays_flat(torch, rng):
    _, ours = _nets(torch)
    xs = [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    expected = [_by_modules(ours, x) for x in xs]
    for x in xs:
        for _ in range(3):
            ours(x)
    results = {}

    def work(i):
        for _ in range(30):
            results[i] = ours(xs[i % 4])

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    in_threads(work, 8)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
    for i, got in results.items():
        assert_close(got, expected[i % 4], rtol=1e-5, atol=1e-6)
