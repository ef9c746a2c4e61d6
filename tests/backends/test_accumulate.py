"""Long reductions along non-contiguous axes against a float64 reference: means, sums, norms and
pooling keep float32's own accuracy whatever the memory layout (backends/accumulate.py and the
native pooling's float64 runs)."""

import numpy as np
import pytest

from fastlayers.backends.accumulate import wide_mean, wide_sum
from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps
from fastlayers.onnx.ops import OPS

CPU, REF = CpuOps(), ReferenceOps()
# float32 rounding of the exact result is 6e-8 relative; a float32 sequential sum over the
# 9,600 positions below is off by 3e-6, so this bound tells the two apart.
TIGHT = 4e-7


def _nhwc(rng, n=1, h=80, w=120, c=19):
    """Values with a large mean (a sequential float32 sum of them drifts) in NHWC memory."""
    return (rng.standard_normal((n, h, w, c)) + 3.0).astype(np.float32)


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("axes", [(1, 2), (2, 3), (0, 1, 2), (1,), None])
def test_wide_sum_and_mean_match_float64(rng, axes):
    x_nhwc = _nhwc(rng, n=2)
    for x in (x_nhwc, x_nhwc.transpose(0, 3, 1, 2)):
        x64 = x.astype(np.float64)
        for fn, ref in ((wide_mean, np.mean), (wide_sum, np.sum)):
            got = fn(x, axes, keepdims=True)
            assert got.dtype == np.float32
            assert _rel(got, ref(x64, axis=axes, keepdims=True)) < TIGHT, (fn.__name__, axes, x.shape)


def test_wide_sum_keeps_integer_semantics():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4).transpose(2, 0, 1)
    np.testing.assert_array_equal(wide_sum(x, (1, 2)), np.sum(x, axis=(1, 2)))
    assert wide_sum(x, (1, 2)).dtype == np.sum(x, axis=(1, 2)).dtype


def _run(op, x, attrs=None, *extra):
    return OPS[op]([x, *extra], attrs or {}, 18)[0]


@pytest.mark.parametrize(
    "op,ref",
    [
        ("ReduceMean", lambda x: np.mean(x, axis=(2, 3), keepdims=True)),
        ("ReduceSum", lambda x: np.sum(x, axis=(2, 3), keepdims=True)),
        ("ReduceSumSquare", lambda x: np.sum(x * x, axis=(2, 3), keepdims=True)),
        ("ReduceL2", lambda x: np.sqrt(np.sum(x * x, axis=(2, 3), keepdims=True))),
    ],
)
def test_onnx_reductions_over_nchw_views_of_nhwc_memory(rng, op, ref):
    x = _nhwc(rng).transpose(0, 3, 1, 2)  # how a convolution's output arrives
    got = _run(op, x, {}, np.array([2, 3], np.int64))
    assert _rel(got, ref(x.astype(np.float64))) < TIGHT


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_onnx_global_pools_over_nchw_views_and_contiguous_nchw(rng, op):
    x_nhwc = _nhwc(rng, n=2)
    ref = np.mean if op == "GlobalAveragePool" else np.max
    for x in (x_nhwc.transpose(0, 3, 1, 2), np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))):
        got = _run(op, x)
        assert got.shape == (2, 19, 1, 1)
        assert _rel(got, ref(x.astype(np.float64), axis=(2, 3), keepdims=True)) < TIGHT


def test_onnx_instance_and_layer_norm_over_long_spatial_axes(rng):
    x = _nhwc(rng).transpose(0, 3, 1, 2)
    x64 = x.astype(np.float64)
    scale, bias = rng.uniform(0.5, 1.5, 19).astype(np.float32), rng.standard_normal(19).astype(np.float32)
    mean = x64.mean(axis=(2, 3), keepdims=True)
    norm = (x64 - mean) / np.sqrt(x64.var(axis=(2, 3), keepdims=True) + 1e-5)
    got = OPS["InstanceNormalization"]([x, scale, bias], {"epsilon": 1e-5}, 18)[0]
    assert _rel(got, norm * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)) < 2e-6
    # LayerNormalization over (C, H, W) of the same view, with its mean output
    gamma = rng.uniform(0.5, 1.5, x.shape[1:]).astype(np.float32)
    y, m, _ = OPS["LayerNormalization"]([x, gamma], {"axis": 1, "_stats": True}, 18)
    mean = x64.mean(axis=(1, 2, 3), keepdims=True)
    want = (x64 - mean) / np.sqrt(x64.var(axis=(1, 2, 3), keepdims=True) + 1e-5) * gamma
    assert _rel(y, want) < 2e-6 and _rel(m, mean) < TIGHT


def test_cpu_global_average_pool_matches_float64_on_every_isa(isa, rng):
    for shape in [(1, 80, 120, 19), (3, 1, 1, 5), (2, 9, 7, 33), (1, 1, 9600, 8), (2, 13, 11, 130), (1, 3, 4, 64)]:
        x = _nhwc(rng, *shape)
        want = np.mean(x.astype(np.float64), axis=(1, 2))
        assert _rel(CPU.global_pool(x, "avg", (1, 2)), want) < TIGHT, shape
        assert _rel(CPU.global_pool(x, "avg", (1, 2), keepdims=True), want[:, None, None]) < TIGHT
        np.testing.assert_array_equal(CPU.global_pool(x, "max", (1, 2)), x.max(axis=(1, 2)))


def test_cpu_large_window_and_adaptive_average_pools_on_every_isa(isa, rng):
    x = _nhwc(rng, n=2, h=64, w=90, c=11)
    x64 = x.astype(np.float64)
    # one 64 x 45 window per output column (2,880 taps), and torch's adaptive bins of 1x1 and 2x3
    got = CPU.pool2d(x, "avg", (64, 45), (64, 45), ((0, 0), (0, 0)), (1, 2))
    want = x64.reshape(2, 1, 64, 2, 45, 11).mean(axis=(2, 4))
    assert _rel(got, want) < TIGHT
    assert _rel(CPU.adaptive_pool2d(x, "avg", (1, 1)), x64.mean(axis=(1, 2), keepdims=True)) < TIGHT
    got = CPU.adaptive_pool2d(x, "avg", (2, 3))
    assert _rel(got, REF.adaptive_pool2d(x, "avg", (2, 3))) < TIGHT
    want = x64.reshape(2, 2, 32, 3, 30, 11).mean(axis=(2, 4))
    assert _rel(got, want) < TIGHT


@pytest.mark.parametrize("axes", [(1, 2), (2,), (-2, -1)])
def test_cpu_layer_norm_over_trailing_axes_matches_float64(isa, rng, axes):
    x = _nhwc(rng, n=3, h=40, w=60, c=1)[..., 0]  # (3, 40, 60)
    x64 = x.astype(np.float64)
    shape = [1, 1, 1]
    for a in axes:
        shape[a] = x.shape[a]
    gamma = rng.uniform(0.5, 1.5, shape).astype(np.float32).reshape([x.shape[a] for a in axes])
    beta = rng.standard_normal(gamma.shape).astype(np.float32)
    mean = x64.mean(axis=axes, keepdims=True)
    want = (x64 - mean) / np.sqrt(x64.var(axis=axes, keepdims=True) + 1e-3)
    want = want * gamma.reshape(shape) + beta.reshape(shape)
    for ops in (CPU, REF):
        assert _rel(ops.layer_norm(x, gamma, beta, 1e-3, axes), want) < 2e-6, (type(ops).__name__, axes)
    assert (
        _rel(
            CPU.layer_norm(x, None, None, 1e-3, axes, rms=True),
            x64 / np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + 1e-3),
        )
        < 2e-6
    )


def test_exported_squeeze_excite_and_moment_layer_norm_as_accurate_as_onnxruntime(torch, tmp_path, rng):
    """A squeeze-and-excite block (a spatial mean of the convolution's output) and a layer norm
    written as E[x^2] - E[x]^2, exported from torch: fastlayers' error against the float64
    module is no more than onnxruntime's (it was 7x with float32 sequential sums)."""
    from ..conftest import oracle
    from ..onnx.test_import import export

    ort = oracle("onnxruntime")
    import fastlayers

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.squeeze, self.excite = torch.nn.Linear(16, 4), torch.nn.Linear(4, 16)

        def forward(self, x):
            h = self.conv(x)
            s = torch.sigmoid(self.excite(torch.relu(self.squeeze(h.mean((2, 3))))))
            h = (h * s[:, :, None, None]).flatten(2)  # (N, 16, 9600)
            m = h.mean(-1, keepdim=True)
            var = (h * h).mean(-1, keepdim=True) - m * m
            return (h - m) / torch.sqrt(var + 1e-5)

    torch.manual_seed(0)
    module = Block().eval()
    x = (rng.standard_normal((1, 3, 80, 120)) + 2).astype(np.float32)
    path = tmp_path / "se.onnx"
    export(torch, module, (torch.from_numpy(x),), path, input_names=["x"], opset_version=17)
    with torch.no_grad():
        exact = module.double()(torch.from_numpy(x).double()).numpy()
    ours = fastlayers.load(path)(x)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _rel(ours, exact) <= max(1.5 * _rel(theirs, exact), 1e-6), (_rel(ours, exact), _rel(theirs, exact))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize(
    "shape, axes",
    [((1, 1), (1,)), ((3, 50, 7), (2,)), ((3, 50, 7), (1, 2)), ((1000,), None), ((4, 5), (0, 1)), ((0, 3), (1,))],
)
@pytest.mark.parametrize("keepdims", [True, False])
def test_wide_mean_of_contiguous_axes_is_numpys_mean_bit_for_bit(rng, dtype, shape, axes, keepdims):
    # the sum-over-count form of a trailing-axes mean gives numpy's own result
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    got, want = wide_mean(x, axes, keepdims=keepdims), np.mean(x, axis=axes, keepdims=keepdims)
    assert type(got) is type(want) and np.asarray(got).dtype == np.asarray(want).dtype
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_cpu_global_max_pool_nan_in_every_block_of_channels(isa, rng, threads):
    """A global max over blocks of channels (a thread's share) with NaN in some channels: those
    channels are NaN, the others the max."""
    x = _nhwc(rng, 3, 17, 9, 150)
    x[1, 16, 8, [0, 70, 149]] = np.nan
    got = CPU.global_pool(x, "max", (1, 2))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x).any(axis=(1, 2)))
    np.testing.assert_array_equal(np.nan_to_num(got, nan=0.0), np.nan_to_num(x.max(axis=(1, 2)), nan=0.0))
    assert _rel(CPU.global_pool(x[2:], "avg", (1, 2)), np.mean(x[2:].astype(np.float64), axis=(1, 2))) < TIGHT


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (1, 309, 172), (0,)], ids=str)
def test_sums_over_a_short_last_axis_are_numpys(rng, dtype, n, shape):
    """A sum over a short last axis (2 to SHORT_AXIS, added as slices) is numpy's bit for bit:
    its left-to-right order, signed zeros, infinities and NaN, keepdims; other lengths and
    float16 (which numpy adds in float32) go to numpy."""
    x = (rng.standard_normal((*shape, n)) * 1e3).astype(dtype)
    x.reshape(-1)[::7] = -0.0
    x.reshape(-1)[::11] = np.inf if n % 2 else np.nan
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[x.itemsize]
    for keepdims in (False, True):
        got, want = wide_sum(x, axis=-1, keepdims=keepdims), np.sum(x, axis=-1, keepdims=keepdims)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("memory", ["transposed", "sliced", "contiguous"])
def test_sums_over_a_short_axis_of_any_layout(rng, dtype, n, axis, memory):
    """A sum over one short axis of any position and memory layout (a transposed view, a
    slice) is numpy's sum of the same values in contiguous memory, bit for bit."""
    shape = [5, 6, 9]
    shape[axis] = n
    x = (rng.standard_normal(shape) * 1e3).astype(dtype)
    x.reshape(-1)[::7] = -0.0
    if memory == "transposed":
        x = np.ascontiguousarray(x.transpose(2, 0, 1)).transpose(1, 2, 0)
    elif memory == "sliced":
        x = np.concatenate([x, x], axis=2)[:, :, : shape[2]]
    assert x.shape == tuple(shape) and (memory == "contiguous") == x.flags.c_contiguous
    bits = {4: np.int32, 8: np.int64}[x.itemsize]
    for keepdims in (False, True):
        got = wide_sum(x, axis=axis, keepdims=keepdims)
        want = np.sum(np.ascontiguousarray(np.moveaxis(x, axis, -1)), axis=-1, keepdims=keepdims)
        if keepdims:
            want = np.moveaxis(want, -1, axis)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(bits), want.view(bits))
