"""Native plans (``native/plan.pxi``): each step kind against numpy and the kernels called on
their own, on every ISA path; argument checks before anything is bound; a plan running one
call at a time; a failing Python step's status."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import fastlayers
from fastlayers.native import _core

from ..conftest import assert_close


def _arena_views(plan, *shapes, start=0):
    """Float32 views of ``plan``'s arena, one after the other from byte ``start``, each 64-byte
    aligned."""
    views, offset = [], start
    for shape in shapes:
        n = int(np.prod(shape))
        views.append(plan.arena[offset : offset + 4 * n].view(np.float32).reshape(shape))
        offset += -(-4 * n // 64) * 64
    return views


def _gather_reference(src, dims, dst_size, dst_strides, maps, fill):
    dst = np.full(dst_size, np.nan, np.float32)
    for index in np.ndindex(*dims):
        offsets = [maps[k][i] for k, i in enumerate(index)]
        at = sum(i * s for i, s in zip(index, dst_strides))
        dst[at] = fill if min(offsets) < 0 else src[sum(offsets)]
    return dst


@pytest.mark.parametrize("dims", [(1,), (17,), (3, 5), (2, 1, 7), (2, 3, 2, 5)])
@pytest.mark.parametrize("holes", [False, True])
def test_gather_matches_numpy(rng, dims, holes):
    src = rng.standard_normal(200).astype(np.float32)
    maps = []
    for d in dims:
        m = rng.integers(0, 200 // (2 * len(dims)), d).astype(np.int64)
        if holes and d > 1:
            m[rng.integers(0, d)] = -1
        maps.append(m)
    strides = [int(np.prod(dims[k + 1 :])) for k in range(len(dims))]
    size = int(np.prod(dims))
    plan = _core.NativePlan(64 * 64)
    (dst,) = _arena_views(plan, (size,))
    plan.add_gather(src, dst, dims, strides, maps, 2.5)
    plan.run([], [], [])
    np.testing.assert_array_equal(dst, _gather_reference(src, dims, size, strides, maps, 2.5))


def test_gather_copies_inner_runs_and_strided_destinations(rng):
    """A run of consecutive source offsets on the last axis (one copy per row), written into a
    strided block of a larger destination (a Concat's part)."""
    src = rng.standard_normal((4, 9)).astype(np.float32)
    plan = _core.NativePlan(4096)
    (dst,) = _arena_views(plan, (4, 12))
    dst[...] = 0
    maps = [np.arange(4, dtype=np.int64) * 9, np.arange(2, 11, dtype=np.int64) - 2 + 0]
    plan.add_gather(src.reshape(-1), dst.reshape(-1)[3:], (4, 9), (12, 1), maps)
    plan.run([], [], [])
    want = np.zeros((4, 12), np.float32)
    want[:, 3:] = src
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize(
    "axes",
    [
        # (length, first, step) per axis; None: a random table of that length
        [(40, 0, 150), (3, None, None), (50, 0, 1)],  # whole rows, a short table, an inner run
        [(30, 29 * 20, -20), (20, 0, 2)],  # rows backwards, every other value
        [(5000, 0, 17), (17, 0, 1)],  # many rows, shared among the threads
        [(6, 0, 1), (40, 3, 5)],  # a strided last axis
    ],
)
def test_gather_evenly_spaced_maps_match_numpy(rng, axes):
    """Long evenly spaced maps (held as their first offset and spacing, no table) and tables
    side by side, at 1 and 2 threads."""
    maps = [
        rng.integers(0, 7, d).astype(np.int64) if first is None else first + step * np.arange(d, dtype=np.int64)
        for d, first, step in axes
    ]
    dims = [d for d, _, _ in axes]
    src = rng.standard_normal(sum(int(m.max()) for m in maps) + 1).astype(np.float32)
    want = src[sum(np.reshape(m, [-1 if k == a else 1 for k in range(len(dims))]) for a, m in enumerate(maps))]
    strides = [int(np.prod(dims[k + 1 :])) for k in range(len(dims))]
    for threads in (1, 2):
        with fastlayers.using_threads(threads):
            plan = _core.NativePlan(4 * want.size + 64)
            (dst,) = _arena_views(plan, (want.size,))
            plan.add_gather(src, dst, dims, strides, maps, 0.0)
            plan.run([], [], [])
            np.testing.assert_array_equal(dst.reshape(want.shape), want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.int16, np.int32, np.float64, np.int64, np.bool_])
def test_gather_moves_values_of_any_size_as_bits(rng, dtype):
    """Integers, bools, half and double floats moved as they are (tables with filled
    positions, an inner run, an evenly spaced map), the fill in the values' type; a
    destination of another type is refused."""
    src = rng.integers(-100, 100, 300).astype(dtype)
    maps = [np.r_[np.arange(0, 280, 40), -1].astype(np.int64), np.arange(5, 10, dtype=np.int64)]
    plan = _core.NativePlan(1 << 12)
    dst = plan.arena[: 8 * 5 * src.itemsize].view(dtype)
    plan.add_gather(src, dst, (8, 5), (5, 1), maps, 3)
    long = np.arange(2, 42, dtype=np.int64) * 7  # 40 entries, evenly spaced: no table
    dst2 = plan.arena[1024 : 1024 + 40 * src.itemsize].view(dtype)
    plan.add_gather(src, dst2, (40,), (1,), [long])
    plan.run([], [], [])
    want = np.where((maps[0] < 0)[:, None], dtype(3), src[np.maximum(maps[0], 0)[:, None] + maps[1]])
    np.testing.assert_array_equal(dst.reshape(8, 5), want)
    np.testing.assert_array_equal(dst2, src[long])
    with pytest.raises(TypeError, match="destination"):
        plan.add_gather(
            src, plan.arena[:8].view(np.float32 if dtype != np.float32 else np.int32), (2,), (1,), [long[:2]]
        )


def test_gather_keeps_no_table_for_an_evenly_spaced_map(rng):
    """A long evenly spaced map costs the plan no memory of its size; one with a filled
    position (-1) or offsets going negative is a table."""
    n = 1 << 20
    src = rng.standard_normal(2 * n).astype(np.float32)
    plan = _core.NativePlan(4 * n + 64)
    (dst,) = _arena_views(plan, (n,))
    tracemalloc.start()
    try:
        plan.add_gather(src, dst, (n,), (1,), [2 * np.arange(n, dtype=np.int64)])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < n  # the map was 8 n bytes
    plan.run([], [], [])
    np.testing.assert_array_equal(dst, src[::2])
    for m in (np.r_[np.arange(40), -1].astype(np.int64), 5 - np.arange(41, dtype=np.int64)):
        plan = _core.NativePlan(4 * 41 + 64)
        (dst,) = _arena_views(plan, (41,))
        plan.add_gather(src, dst, (41,), (1,), [m], 7.0)
        plan.run([], [], [])
        np.testing.assert_array_equal(dst, np.where(m < 0, 7.0, src[np.maximum(m, 0)]))


@pytest.mark.parametrize("shape", [(1, 5, 3), (2, 37, 19), (3, 64, 16)])
def test_transpose_step_matches_numpy(rng, shape):
    """NHWC -> NCHW of (N, HW, C) memory from an offset into the source, and back."""
    b, r, c = shape
    src = rng.standard_normal(7 + b * r * c).astype(np.float32)
    plan = _core.NativePlan(1 << 17)
    (dst,) = _arena_views(plan, (b * c * r,))
    plan.add_transpose(src, dst, 7, b, r, c, r * c, c, c * r, r)
    plan.run([], [], [])
    np.testing.assert_array_equal(dst.reshape(b, c, r), src[7:].reshape(b, r, c).transpose(0, 2, 1))
    with pytest.raises(ValueError, match="outside"):
        plan.add_transpose(src, dst, 8, b, r, c, r * c, c, c * r, r)


def test_conv2d_step_matches_the_kernel(rng, isa):
    x = rng.standard_normal((2, 7, 9, 5)).astype(np.float32)
    w = rng.standard_normal((3, 3, 5, 11)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    pw = _core.conv_pack(w, 1)
    want = np.empty((2, 4, 5, 11), np.float32)
    _core.conv2d(x, pw, b, want, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0.0)
    plan = _core.NativePlan(1 << 16)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_conv2d(xv, pw, b, yv, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0.0)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)


def test_conv2d_step_adds_the_residual_in_its_epilogue(rng, isa):
    x = rng.standard_normal((1, 6, 7, 8)).astype(np.float32)
    w = rng.standard_normal((1, 1, 8, 13)).astype(np.float32)
    r = rng.standard_normal((1, 6, 7, 13)).astype(np.float32)
    pw = _core.conv_pack(w, 1)
    relu = 1
    want = np.empty((1, 6, 7, 13), np.float32)
    _core.conv2d(x, pw, None, want, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0.0, 0, r, relu, 0.0)
    plan = _core.NativePlan(1 << 16)
    xv, rv, yv = _arena_views(plan, x.shape, r.shape, want.shape)
    plan.add_conv2d(xv, pw, None, yv, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0.0, res=rv, res_code=relu)
    (got,) = plan.run([x, r], [xv, rv], [yv])
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("tile", [2, 4])
def test_conv2d_step_runs_winograd_and_on_a_nan_the_direct_sums_or_refuses(rng, isa, tile, direct):
    """Winograd's bits on finite values; on a NaN the direct sums (NaN where a window reads
    it), or with no direct weights bound the step fails with NOT_FINITE (the call is then the
    Python plan's)."""
    x = rng.standard_normal((1, 9, 10, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 17)).astype(np.float32)
    b = rng.standard_normal(17).astype(np.float32)
    pw, pu = _core.conv_pack(w, 1) if direct else None, _core.winograd_pack(w, tile=tile)
    want = np.empty((1, 9, 10, 17), np.float32)
    assert _core.conv3x3_winograd(x, pu, b, want, 1, 1, 0, 0.0, tile)
    plan = _core.NativePlan(1 << 16)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_conv2d(xv, pw, b, yv, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0, tile=tile, pu=pu)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)
    x[0, 4, 4, 3] = np.nan  # Winograd gives up
    if not direct:
        with pytest.raises(_core.PlanStepFailed) as failed:
            plan.run([x], [xv], [yv])
        assert failed.value.status == _core.NOT_FINITE
        with pytest.raises(TypeError, match="weights"):  # without a tile the direct weights are needed
            _core.NativePlan(1 << 16).add_conv2d(xv, None, b, yv, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0)
        return
    reference = np.empty_like(want)
    _core.conv2d(x, pw, b, reference, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, reference)
    assert np.isnan(got[0, 3:6, 3:6]).all() and np.isfinite(got[0, :3]).all()


def test_conv2d_step_reads_nchw_planes(rng, isa):
    x = rng.standard_normal((2, 3, 11, 13)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    want = np.empty((2, 6, 7, 8), np.float32)
    _core.conv2d_nchw_in(x, w, b, want, 2, 2, 1, 1, 1, 1, 1, 0.0)
    plan = _core.NativePlan(1 << 16)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_conv2d(xv, w, b, yv, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0.0, nchw_in=True)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_step_matches_the_kernel(rng, isa, stride):
    x = rng.standard_normal((2, 9, 8, 19)).astype(np.float32)
    w = rng.standard_normal((3, 3, 19, 2)).astype(np.float32)
    b = rng.standard_normal(38).astype(np.float32)
    ho, wo = (9 - 1) // stride + 1, (8 - 1) // stride + 1
    want = np.empty((2, ho, wo, 38), np.float32)
    _core.depthwise_conv2d(x, w, b, want, stride, stride, 1, 1, 1, 1, 2, 0.0)
    plan = _core.NativePlan(1 << 17)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_depthwise(xv, w, b, yv, stride, stride, 1, 1, 1, 1, 2, 0.0)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("size", [1, 17, 1000])
def test_add_act_step_matches_the_kernel_in_place(rng, isa, size):
    a = rng.standard_normal(size).astype(np.float32)
    b = rng.standard_normal(size).astype(np.float32)
    relu = _core.ACTIVATIONS.index("relu")
    want = _core.add_act(a, b, relu, 0.0)
    plan = _core.NativePlan(1 << 13)
    av, bv = _arena_views(plan, (size,), (size,))
    plan.add_add_act(av, bv, av, relu, 0.0)
    (got,) = plan.run([a, b], [av, bv], [av])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="add_act"):
        plan.add_add_act(av, bv[: size // 2], av, relu, 0.0)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("nchw", [False, True])
def test_conv_transpose_step_matches_the_kernel(rng, isa, groups, nchw):
    """Both forms (NHWC with packed weights, NCHW planes), strided, cropped, grouped."""
    x = rng.standard_normal((2, 5, 7, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 6, 5)).astype(np.float32)  # (kh, kw, C_in, C_out / groups)
    b = rng.standard_normal(5 * groups).astype(np.float32)
    ho, wo = (5 - 1) * 2 + 3 - 1, (7 - 1) * 2 + 2 - 1  # crops 1 (top) and 0 (left), trailing 1 and 1
    geometry = (3, 2, groups, 2, 2, 1, 1, 1, 0, 1, 0.0)  # kh kw groups sh sw dh dw ct cl code alpha
    if nchw:
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        # each group's (C_out / groups kh kw, C_in / groups): w as (C_in, C_out / groups, kh, kw)
        w_iohw = w.transpose(2, 3, 0, 1)
        wt = np.ascontiguousarray(w_iohw.reshape(groups, 6 // groups, -1).transpose(0, 2, 1))
        want = np.empty((2, 5 * groups, ho, wo), np.float32)
        _core.conv_transpose2d_nchw(x, wt, b, want, *geometry)
    else:
        wt = _core.conv_transpose_pack(w, groups)
        want = np.empty((2, ho, wo, 5 * groups), np.float32)
        _core.conv_transpose2d(x, wt, b, want, *geometry)
    plan = _core.NativePlan(1 << 17)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_conv_transpose(xv, wt, b, yv, *geometry, nchw=nchw)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("activation", ["relu", "softmax"])
def test_dense_step_matches_the_kernel(rng, isa, rows, packed, activation):
    """On the packed weights or on the array read in place; the softmax over each row too."""
    x = rng.standard_normal((rows, 37)).astype(np.float32)
    w = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal(29).astype(np.float32)
    code = _core.ACTIVATIONS.index(activation)
    pb = _core.pack(w) if packed else None
    want = np.empty((rows, 29), np.float32)
    _core.matmul(x, w, want, pb, b, code, 0.0)
    plan = _core.NativePlan(1 << 16)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_dense(xv, None if packed else w, pb, b, yv, code, 0.0)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)
    reference = x.astype(np.float64) @ w + b
    if activation == "relu":
        reference = np.maximum(reference, 0)
    else:
        e = np.exp(reference - reference.max(axis=1, keepdims=True))
        reference = e / e.sum(axis=1, keepdims=True)
    assert_close(got, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_row_activation_step_normalizes_each_row(rng, isa, name):
    x = rng.standard_normal((6, 37)).astype(np.float32)
    code = _core.ACTIVATIONS.index(name)
    want = _core.apply_activation(x, code, 0.0)
    plan = _core.NativePlan(1 << 14)
    xv, yv = _arena_views(plan, x.shape, x.shape)
    plan.add_activation(xv, yv, code, 0.0, 37)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="rows of 5"):
        plan.add_activation(xv, yv, code, 0.0, 5)


@pytest.mark.parametrize("shared", [None, "a", "b"])
def test_batched_matmul_step_matches_the_kernel(rng, isa, shared):
    a = rng.standard_normal((1 if shared == "a" else 3, 5, 17)).astype(np.float32)
    b = rng.standard_normal((1 if shared == "b" else 3, 17, 9)).astype(np.float32)
    want = np.empty((3, 5, 9), np.float32)
    _core.matmul_batch(np.broadcast_to(a, (3, 5, 17)).copy(), np.broadcast_to(b, (3, 17, 9)).copy(), want, False)
    plan = _core.NativePlan(1 << 14)
    av, bv, cv = _arena_views(plan, a.shape, b.shape, want.shape)
    plan.add_batched_matmul(av, bv, cv)
    (got,) = plan.run([a, b], [av, bv], [cv])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="matmul"):
        plan.add_batched_matmul(av, bv.reshape(-1, 9, 17), cv)


@pytest.mark.parametrize("is_max", [False, True])
def test_pool_and_scale_shift_steps_match_the_kernels(rng, isa, is_max):
    x = rng.standard_normal((2, 7, 9, 5)).astype(np.float32)
    want = np.empty((2, 4, 5, 5), np.float32)
    _core.pool2d(x, want, is_max, 3, 3, 2, 2, 1, 1, 1, 1, 8, 10, False)
    scale, shift = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    plan = _core.NativePlan(1 << 16)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_pool2d(xv, yv, is_max, 3, 3, 2, 2, 1, 1, 1, 1, 8, 10, False)
    plan.add_scale_shift(yv, scale, shift, yv)  # in place
    (got,) = plan.run([x], [xv], [yv])
    shifted = np.empty_like(want)
    _core.scale_shift(want.reshape(-1, 5), scale, shift, shifted.reshape(-1, 5))
    np.testing.assert_array_equal(got, shifted)


@pytest.mark.parametrize("size", [1, 15, 4096, 4097, 9000])
def test_activation_step_matches_apply_activation(rng, isa, size):
    from fastlayers.native import CODES

    x = (3 * rng.standard_normal(size)).astype(np.float32)
    for name in ("relu", "tanh", "onnx_sigmoid"):
        plan = _core.NativePlan(8 * size + 128)
        xv, yv = _arena_views(plan, (size,), (size,))
        plan.add_activation(xv, yv, CODES[name], 0.0)
        (got,) = plan.run([x], [xv], [yv])
        np.testing.assert_array_equal(got, _core.apply_activation(x, CODES[name], 0.0))


def test_rnn_step_matches_the_loop(rng, isa):
    from fastlayers.backends.cpu import recurrent
    from fastlayers.backends.types import Cell

    b, t, i, u = 2, 5, 3, 8
    x = rng.standard_normal((b, t, i)).astype(np.float32)
    w_ig = rng.standard_normal((i, 4 * u)).astype(np.float32)
    w_hg = rng.standard_normal((u, 4 * u)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, b, u)).astype(np.float32)
    args, serial = recurrent.sequence_loop(Cell.LSTM, x, (w_ig, w_hg, None, h0, c0), {})
    want_y, want_h, want_c = args.y.copy(), args.h.copy(), args.c.copy()
    _core.rnn_loop(*args._replace(y=want_y, h=want_h, c=want_c, last=args.last.copy()))
    plan = _core.NativePlan(1 << 14)
    xv, hv, cv, yv, lv = _arena_views(plan, x.shape, (b, u), (b, u), (b, t, u), (b, u))
    plan.add_rnn(tuple(args._replace(x=xv, h=hv, c=cv, y=yv, last=lv)), serial)
    got_y, got_h, got_c = plan.run([x, h0, c0, np.zeros((b, u), np.float32)], [xv, hv, cv, lv], [yv, hv, cv])
    assert_close(got_y, want_y, rtol=1e-6, atol=1e-6)
    assert_close(got_h, want_h, rtol=1e-6, atol=1e-6)
    assert_close(got_c, want_c, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loops_step", [False, True])
def test_rnn_step_reads_its_ids_per_call_and_refuses_one_outside_the_table(rng, isa, loops_step):
    """A loop over rows of its folded table (ids in the arena): bound whatever the arena holds,
    the loop's values for each call's ids; an id outside [0, rows) fails the step with
    BAD_INDEX before the loop writes its states."""
    from fastlayers.backends.cpu import recurrent
    from fastlayers.backends.types import Cell

    b, t, v, u = 3, 4, 7, 5
    table = rng.standard_normal((v, 3 * u)).astype(np.float32)
    w_hg = rng.standard_normal((u, 3 * u)).astype(np.float32)
    h0 = rng.standard_normal((b, u)).astype(np.float32)
    traced = rng.integers(0, v, (b, t))
    args, serial = recurrent.sequence_loop(Cell.GRU, traced, (table, w_hg, None, None, h0), {})
    plan = _core.NativePlan(1 << 14)
    idv = plan.arena[: b * t * 8].view(np.int64).reshape(b, t)
    idv[...] = 1 << 40  # bound whatever the arena holds: ids are read per call
    hv, yv, lv = _arena_views(plan, (b, u), (b, t, u), (b, u), start=1024)
    call = tuple(args._replace(ids=idv, h=hv, y=yv, last=lv))
    if loops_step:  # rnn_loops_step's check (a bidirectional layer's steps)
        plan.add_rnn_loops([call])
    else:
        plan.add_rnn(call, serial)
    for _ in range(2):
        ids = rng.integers(0, v, (b, t))
        want_y, want_h = args.y.copy(), h0.copy()
        _core.rnn_loop(*args._replace(ids=ids, y=want_y, h=want_h, last=args.last.copy()))
        got_y, got_h = plan.run([ids, h0, np.zeros((b, u), np.float32)], [idv, hv, lv], [yv, hv])
        np.testing.assert_array_equal(got_y, want_y)
        np.testing.assert_array_equal(got_h, want_h)
    for bad in (v, -1):
        ids[1, 2] = bad
        with pytest.raises(_core.PlanStepFailed) as info:
            plan.run([ids, h0, np.zeros((b, u), np.float32)], [idv, hv, lv], [yv, hv])
        assert (info.value.step, info.value.status) == (0, _core.BAD_INDEX)
        np.testing.assert_array_equal(hv, h0)


def test_arguments_are_checked_when_bound():
    plan = _core.NativePlan(256)
    (dst,) = _arena_views(plan, (8,))
    src = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="past the end"):
        plan.add_gather(src, dst, (8,), (1,), [np.arange(8, dtype=np.int64)])
    with pytest.raises(ValueError, match="axes"):
        plan.add_gather(src, dst, (), (), [])
    with pytest.raises(ValueError, match="axis 0"):
        plan.add_gather(src, dst, (8,), (1,), [np.arange(4, dtype=np.int64)])
    with pytest.raises(TypeError, match="float32"):
        plan.add_gather(src.astype(np.float64), dst, (4,), (1,), [np.arange(4, dtype=np.int64)])
    with pytest.raises(ValueError, match="values into"):
        plan.add_activation(src, dst, 1, 0.0)
    with pytest.raises(TypeError, match="callable"):
        plan.add_python(3)
    with pytest.raises(ValueError, match="arena"):
        _core.NativePlan(-1)
    x4, y4 = np.zeros((1, 4, 4, 16), np.float32), np.zeros((1, 4, 4, 8), np.float32)
    w = np.zeros((3, 3, 16, 8), np.float32)
    with pytest.raises(ValueError, match="Winograd tile 3"):
        plan.add_conv2d(x4, _core.conv_pack(w, 1), None, y4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0, tile=3)
    with pytest.raises(ValueError, match="Winograd weights"):
        plan.add_conv2d(x4, _core.conv_pack(w, 1), None, y4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0, tile=2)
    with pytest.raises(ValueError, match="residual"):
        plan.add_conv2d(x4, _core.conv_pack(w, 1), None, y4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0, res=x4)
    with pytest.raises(ValueError, match="NCHW input"):
        plan.add_conv2d(x4, w, None, y4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0.0, nchw_in=True)
    with pytest.raises(ValueError, match="weights must be"):
        plan.add_dense(
            np.zeros((2, 5), np.float32), np.zeros((4, 3), np.float32), None, None, dst[:6].reshape(2, 3), 0, 0.0
        )
    with pytest.raises(ValueError, match="no activation"):
        plan.add_dense(
            np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32), None, None, dst[:6].reshape(2, 3), 99, 0.0
        )
    with pytest.raises(ValueError, match="packed weights too small"):
        plan.add_conv_transpose(x4, np.zeros(4, np.float32), None, y4, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="conv_transpose: weights"):
        plan.add_conv_transpose(
            x4, np.zeros((1, 9, 4), np.float32), None, y4, 3, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0.0, nchw=True
        )
    with pytest.raises(ValueError, match="bad geometry"):
        plan.add_conv_transpose(x4, np.zeros(4, np.float32), None, y4, 3, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="depthwise"):
        plan.add_depthwise(x4, np.zeros((3, 3, 8, 1), np.float32), None, y4, 1, 1, 1, 1, 1, 1, 0, 0.0)
    with pytest.raises(ValueError, match="pool"):
        plan.add_pool2d(x4, y4, True, 2, 2, 2, 2, 1, 1, 0, 0, 4, 4, False)
    with pytest.raises(ValueError, match="scale_shift"):
        plan.add_scale_shift(x4, np.zeros(8, np.float32), np.zeros(8, np.float32), x4)
    assert len(plan) == 0


@pytest.mark.parametrize("masked", [False, True])
def test_attention_step_matches_the_kernel(rng, isa, masked):
    """q, k, v heads as strided views of one projection (rows contiguous), a mask broadcast
    over heads and queries, the output C-ordered."""
    qkv = rng.standard_normal((2, 7, 3, 3, 5)).astype(np.float32)  # (B, T, q|k|v, H, D)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    bias = np.where(rng.random((2, 1, 1, 7)) < 0.3, -1e4, 0).astype(np.float32) if masked else None
    want = np.empty((2, 3, 7, 5), np.float32)
    _core.attention(q, k, v, 0.4, bias, False, 0, None, want)
    plan = _core.NativePlan(1 << 14)
    (out,) = _arena_views(plan, want.shape)
    plan.add_attention(q, k, v, out, 0.4, bias)
    plan.run([], [], [])
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="attention"):
        plan.add_attention(q, k[:, :, :, :4], v, out, 0.4)
    with pytest.raises(ValueError, match="contiguous rows"):
        plan.add_attention(q.transpose(0, 1, 3, 2), k, v, out, 0.4)


def test_steps_read_an_input_in_place(rng):
    """After ``read_in_place`` a step reads the caller's array (its own view left untouched);
    an array that is not C-contiguous, aligned and of the view's type is copied into the view
    as before, and the next array read in place again."""
    x = rng.standard_normal((3, 8)).astype(np.float32)
    plan = _core.NativePlan(1 << 12)
    xv, yv = _arena_views(plan, x.shape, x.shape)
    home = np.full(x.shape, np.nan, np.float32)
    relu = _core.ACTIVATIONS.index("relu")
    plan.add_activation(home, yv, relu, 0.0)
    plan.add_add_act(home, yv, yv, 0, 0.0)  # two steps, two words pointing into the input
    plan.read_in_place([home], [True])
    for a in (x, x * 2, np.asfortranarray(x * 3), x.astype(np.float64) * 4, x * 5):
        (got,) = plan.run([a], [home], [yv])
        want = np.asarray(a, np.float32)
        np.testing.assert_array_equal(got, np.maximum(want, 0) + want)
        if a.dtype == np.float32 and a.flags.c_contiguous:
            assert np.isnan(home).all()  # read in place
        else:
            np.testing.assert_array_equal(home, want)  # copied
            home[...] = np.nan
    unaligned = np.empty(x.size * 4 + 1, np.uint8)[1:].view(np.float32).reshape(x.shape)
    unaligned[...] = x
    (got,) = plan.run([unaligned], [home], [yv])
    np.testing.assert_array_equal(got, np.maximum(x, 0) + x)
    with pytest.raises(ValueError, match="flags"):
        plan.read_in_place([home], [])


def test_a_plan_runs_one_call_at_a_time():
    """A call that finds the plan running (here: from inside one of its own steps) gets None,
    and the plan serves the next call."""
    plan = _core.NativePlan(256)
    (dst,) = _arena_views(plan, (4,))
    inner = []

    def step():
        inner.append(plan.run([], [], [dst]))
        return 0

    plan.add_python(step)
    assert plan.run([], [], []) == []
    assert inner == [None]
    assert plan.run([], [], []) == []


def test_a_failing_python_step_stops_the_plan():
    plan = _core.NativePlan(256)
    (dst,) = _arena_views(plan, (4,))
    ran = []
    plan.add_python(lambda: 7)
    plan.add_python(lambda: ran.append(1) or 0)
    with pytest.raises(_core.PlanStepFailed) as info:
        plan.run([], [], [dst])
    assert (info.value.step, info.value.status) == (0, 7)
    assert ran == []


def test_inputs_are_cast_into_their_views(rng):
    plan = _core.NativePlan(256)
    (xv,) = _arena_views(plan, (2, 3))
    x = rng.standard_normal((3, 2)).T  # float64, not C-contiguous
    (got,) = plan.run([x], [xv], [xv])
    np.testing.assert_array_equal(got, x.astype(np.float32))


@pytest.mark.parametrize("rms", [False, True])
def test_layer_norm_step_matches_the_kernel(rng, isa, rms):
    x = rng.standard_normal((5, 37)).astype(np.float32)
    gamma, beta = rng.standard_normal((2, 37)).astype(np.float32)
    want = _core.apply_layer_norm(x, gamma, beta, 1e-5, rms)
    plan = _core.NativePlan(4096)
    xv, yv = _arena_views(plan, x.shape, x.shape)
    plan.add_layer_norm(xv, gamma, beta, 1e-5, rms, yv)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)


def test_elementwise_step_matches_the_program(rng, isa):
    program = _core.ElementwiseProgram(
        [
            ("mul", 0, 0, 0, 0, 0.0, 0.0, 0.0),
            ("mul", 1, 1, 1, 0, 0.0, 0.0, 0.0),
            ("add", 0, -1, -2, 0, 0.0, 0.0, 0.0),
            ("sqrt", 0, -1, -1, 0, 0.0, 0.0, 0.0),
        ],
        2,
        2,
    )
    a, b = rng.standard_normal((2, 3, 33)).astype(np.float32)
    want = np.empty(a.size, np.float32)
    program(1, a.size, 1, [(_core.EW_FULL, a, a.size), (_core.EW_FULL, b, b.size)], want)
    plan = _core.NativePlan(4096)
    av, bv, yv = _arena_views(plan, a.shape, b.shape, (a.size,))
    plan.add_elementwise(program, 1, a.size, 1, [(_core.EW_FULL, av, a.size), (_core.EW_FULL, bv, b.size)], yv)
    (got,) = plan.run([a, b], [av, bv], [yv])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, np.sqrt(a * a + b * b).reshape(-1), rtol=1e-6)
    with pytest.raises(ValueError, match="operands"):
        plan.add_elementwise(program, 1, a.size, 1, [(_core.EW_FULL, av, a.size)], yv)


def test_integer_steps_match_the_kernels(rng, isa):
    k, n, hidden = 24, 40, 16
    b = rng.integers(-64, 64, (k, n)).astype(np.int8)
    pb = _core.qpack(b, np.zeros(n, np.int32))
    columns = rng.uniform(0.01, 0.03, n).astype(np.float32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    want = _core.dynamic_qgemm(x, pb, columns, None)
    plan = _core.NativePlan(1 << 14)
    xv, yv = _arena_views(plan, x.shape, want.shape)
    plan.add_dynamic_qgemm(xv, pb, columns, None, yv)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, want)

    w = rng.integers(-64, 64, (k, 4 * hidden)).astype(np.int8)
    r = rng.integers(-64, 64, (hidden, 4 * hidden)).astype(np.int8)
    w_packed = _core.qpack(w, np.zeros(4 * hidden, np.int32))
    r_packed = _core.qpack(r, np.zeros(4 * hidden, np.int32))
    w_scale = rng.uniform(0.01, 0.03, 4 * hidden).astype(np.float32)
    r_scale = rng.uniform(0.01, 0.03, 4 * hidden).astype(np.float32)
    bias = rng.standard_normal(4 * hidden).astype(np.float32)
    xs = rng.standard_normal((4, 2, k)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, 2, hidden)).astype(np.float32)
    want_h, want_c, want_y = h0.copy(), c0.copy(), np.empty((4, 2, hidden), np.float32)
    args = (w_packed, w_scale, False, r_packed, r_scale, bias, None, 0.0, False)
    _core.dynamic_qlstm(xs, *args, want_h, want_c, want_y)
    plan = _core.NativePlan(1 << 15)
    xv, hv, cv, yv, pv = _arena_views(plan, xs.shape, h0.shape, c0.shape, want_y.shape, (4, 2, 4 * hidden))
    plan.add_dynamic_qlstm(xv, *args, hv, cv, yv, pv)
    got_y, got_h, got_c = plan.run([xs, h0, c0], [xv, hv, cv], [yv, hv, cv])
    for g, w_ in ((got_y, want_y), (got_h, want_h), (got_c, want_c)):
        np.testing.assert_array_equal(g, w_)


@pytest.mark.parametrize("outer, n, run", [(1, 7, 5), (3, 4, 1), (2, 30, 1100), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_take_step_matches_numpy(rng, isa, outer, n, run, dtype):
    """A Gather on computed indices (negative ones counted from the end), the indices read
    per call from the arena; rows long enough to be shared among the threads."""
    src = rng.standard_normal((outer, n, run)).astype(np.float32)
    count = 37
    plan = _core.NativePlan(1 << 20)
    idx_view = plan.arena[: 8 * count].view(dtype)
    dst = plan.arena[1024 : 1024 + 4 * outer * count * run].view(np.float32)
    plan.add_take(src.reshape(-1), idx_view[:count], dst, outer, n, run)
    for _ in range(2):
        idx = rng.integers(-n, n, count).astype(dtype)
        (got,) = plan.run([idx], [idx_view[:count]], [dst])
        np.testing.assert_array_equal(got.reshape(outer, count, run), np.take(src, idx, axis=1))


def test_take_step_refuses_an_index_outside_its_axis_before_writing(rng):
    src = rng.standard_normal((6, 4)).astype(np.float32)
    plan = _core.NativePlan(4096)
    idx_view = plan.arena[:24].view(np.int64)
    dst = plan.arena[64 : 64 + 48].view(np.float32)
    dst[...] = -1.0
    plan.add_take(src.reshape(-1), idx_view, dst, 1, 6, 4)
    for bad in (6, -7):
        with pytest.raises(_core.PlanStepFailed) as info:
            plan.run([np.array([0, bad, 1], np.int64)], [idx_view], [dst])
        assert (info.value.step, info.value.status) == (0, _core.BAD_INDEX)
        np.testing.assert_array_equal(dst, -1.0)
    with pytest.raises(TypeError, match="int64 or int32"):
        plan.add_take(src.reshape(-1), idx_view.view(np.float64), dst, 1, 6, 4)
    with pytest.raises(ValueError, match="indices"):
        plan.add_take(src.reshape(-1), idx_view, dst, 1, 5, 4)


_REDUCTIONS = {
    "sum": lambda x: x.sum(axis=1, dtype=np.float64),
    "mean": lambda x: x.mean(axis=1, dtype=np.float64),
    "max": lambda x: x.max(axis=1),
    "min": lambda x: x.min(axis=1),
    "l1": lambda x: np.abs(x).sum(axis=1, dtype=np.float64),
    "l2": lambda x: np.sqrt(np.square(x.astype(np.float64)).sum(axis=1)),
    "sum_square": lambda x: np.square(x.astype(np.float64)).sum(axis=1),
}


@pytest.mark.parametrize("op", sorted(_REDUCTIONS))
@pytest.mark.parametrize(
    "shape", [(1, 9, 1), (4, 1, 5), (3, 17, 300), (700, 80, 1), (1, 3, 1), (5, 8, 1), (2, 1001, 1), (6, 1, 1)]
)
def test_reduce_step_matches_numpy(rng, isa, op, shape):
    """(outer, r, inner) -> (outer, inner): sums in double rounded once (a contiguous run, inner
    1, in partial sums over lanes and their tail), max / min exact; blocks of outer positions
    shared among the threads where large."""
    x = rng.standard_normal(shape).astype(np.float32)
    plan = _core.NativePlan(4 * (x.size + x.shape[0] * x.shape[2]) + 128)
    xv, yv = _arena_views(plan, x.shape, (x.shape[0], x.shape[2]))
    plan.add_reduce(xv, yv, op, *shape)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, _REDUCTIONS[op](x).astype(np.float32))


@pytest.mark.parametrize("op", ["max", "min"])
def test_reduce_step_keeps_a_nan_as_numpy_does(op):
    x = np.array([[[1.0, 2.0], [np.nan, 5.0], [3.0, np.nan]], [[7.0, 1.0], [2.0, 3.0], [np.nan, 0.0]]], np.float32)
    plan = _core.NativePlan(1024)
    xv, yv = _arena_views(plan, x.shape, (2, 2))
    plan.add_reduce(xv, yv, op, 2, 3, 2)
    (got,) = plan.run([x], [xv], [yv])
    np.testing.assert_array_equal(got, getattr(np, op)(x, axis=1))
    with pytest.raises(ValueError, match="no reduction"):
        plan.add_reduce(xv, yv, "prod", 2, 3, 2)
    with pytest.raises(ValueError, match="values into"):
        plan.add_reduce(xv, yv, op, 2, 2, 2)


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape", [(1, 9, 1), (4, 1, 5), (3, 17, 300), (700, 80, 1)])
def test_arg_reduce_step_matches_numpy(rng, op, shape, last):
    """The index of the largest / smallest of each (outer, inner) position's r values as int64,
    numpy's argmax / argmin: the first of equal values (with ``last`` the last, as numpy on the
    flipped axis), a NaN winning over any number (the first NaN, or the last)."""
    x = rng.integers(-3, 4, shape).astype(np.float32)  # many ties
    x[rng.random(shape) < 0.02] = np.nan
    plan = _core.NativePlan(4 * x.size + 8 * x.shape[0] * x.shape[2] + 128)
    (xv,) = _arena_views(plan, x.shape)
    yv = plan.arena[-(8 * x.shape[0] * x.shape[2]) :].view(np.int64).reshape(x.shape[0], x.shape[2])
    plan.add_reduce(xv, yv, op, *shape, last=last)
    (got,) = plan.run([x], [xv], [yv])
    fn = getattr(np, op)
    want = shape[1] - 1 - fn(np.flip(x, 1), axis=1) if last else fn(x, axis=1)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="int64"):
        plan.add_reduce(xv, xv[:, 0], op, *shape)


def _map_reference(op, xs):
    """numpy's result of the map step's ``op`` on ``xs`` (broadcast)."""
    fns = {
        "equal": np.equal,
        "less": np.less,
        "less_equal": np.less_equal,
        "greater": np.greater,
        "greater_equal": np.greater_equal,
        "where": np.where,
        "and": np.logical_and,
        "or": np.logical_or,
        "xor": np.logical_xor,
        "not": np.logical_not,
        "isnan": np.isnan,
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "min": np.minimum,
        "max": np.maximum,
        "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    }
    with np.errstate(all="ignore"):
        return fns[op](*xs)


def _broadcast_strides(x, shape):
    own = (1,) * (len(shape) - x.ndim) + x.shape
    return [int(np.prod(own[a + 1 :])) if own[a] == shape[a] else 0 for a in range(len(shape))]


def _map_step(op, xs, out_dtype, shape):
    plan = _core.NativePlan(64)
    out = np.empty(int(np.prod(shape)), out_dtype)
    operands = [np.ascontiguousarray(x).reshape(-1) for x in xs]
    plan.add_map(op, out, operands, list(shape), [_broadcast_strides(np.asarray(x), shape) for x in xs])
    plan.run([], [], [])
    return out.reshape(shape)


_SHAPES = [((3, 1, 5), (1, 4, 1)), ((2, 300), ()), ((1,), (1,)), ((4, 1, 1, 700), (4, 3, 1, 1))]


@pytest.mark.parametrize("op", ["equal", "less", "less_equal", "greater", "greater_equal"])
@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.int64, np.int64), (np.int32, np.float32)])
@pytest.mark.parametrize("shapes", _SHAPES)
def test_map_step_compares_as_numpy(rng, op, dtypes, shapes):
    """Comparisons into bool, operands broadcast by strides of 0; integers compared as int64
    (values past 2^53 told apart), mixed ones as doubles, as numpy promotes them."""
    a, b = (rng.integers(-3, 3, s).astype(d) for s, d in zip(shapes, dtypes))
    if dtypes[0] == np.int64 and a.size:
        a.reshape(-1)[0], b.reshape(-1)[0] = (1 << 60) + 1, 1 << 60
    shape = np.broadcast_shapes(a.shape, b.shape)
    np.testing.assert_array_equal(_map_step(op, [a, b], np.bool_, shape), _map_reference(op, [a, b]))


@pytest.mark.parametrize("shapes", _SHAPES)
def test_map_step_where_logic_and_isnan(rng, shapes):
    shape = np.broadcast_shapes(*shapes)
    c, d = (rng.integers(0, 2, s).astype(np.bool_) for s in shapes)
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    a.reshape(-1)[0] = np.nan
    np.testing.assert_array_equal(_map_step("where", [c, a, b], np.float32, shape), np.where(c, a, b))
    i, j = rng.integers(-9, 9, shapes[0]), rng.integers(-9, 9, shapes[1])
    np.testing.assert_array_equal(_map_step("where", [d, i, j], np.int64, shape), np.where(d, i, j))
    for op in ("and", "or", "xor"):
        np.testing.assert_array_equal(_map_step(op, [c, d], np.bool_, shape), _map_reference(op, [c, d]))
    np.testing.assert_array_equal(_map_step("not", [c], np.bool_, c.shape), ~c)
    np.testing.assert_array_equal(_map_step("isnan", [a], np.bool_, a.shape), np.isnan(a))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "min", "max"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", _SHAPES)
def test_map_step_arithmetic_gives_numpys_bits(rng, op, dtype, shapes):
    """Float arithmetic in double, rounded once: float32 results bit for bit numpy's; a NaN
    wins minimum and maximum."""
    a = rng.standard_normal(shapes[0]).astype(dtype)
    b = rng.standard_normal(shapes[1]).astype(dtype)
    a.reshape(-1)[-1] = np.nan
    shape = np.broadcast_shapes(a.shape, b.shape)
    np.testing.assert_array_equal(_map_step(op, [a, b], dtype, shape), _map_reference(op, [a, b]))
    if op in ("min", "max"):
        i, j = rng.integers(-9, 9, shapes[0]), rng.integers(-9, 9, shapes[1])
        np.testing.assert_array_equal(_map_step(op, [i, j], np.int64, shape), _map_reference(op, [i, j]))


def test_map_step_clips_and_casts_as_numpy(rng):
    x = (3 * rng.standard_normal((5, 7))).astype(np.float32)
    x[0, 0], x[1, 1] = np.nan, np.inf
    lo, hi = np.float32(-1.5), rng.uniform(0, 2, (5, 1)).astype(np.float32)
    np.testing.assert_array_equal(
        _map_step("clip", [x, lo, hi], np.float32, x.shape), np.minimum(np.maximum(x, lo), hi)
    )
    finite = np.nan_to_num(x, nan=0.5, posinf=7.0)
    big = np.array([(1 << 62) + 3, -((1 << 40) + 7), 5, 0], np.int64)
    cases = [
        (finite, np.int64),
        (finite, np.int32),
        (x, np.bool_),
        (x, np.float64),
        (big, np.float32),
        (big, np.float64),
        (big, np.int32),
        (big, np.bool_),
        (np.array([True, False]), np.float32),
        (big.astype(np.float64), np.float32),
    ]
    for value, dtype in cases:
        np.testing.assert_array_equal(_map_step("cast", [value], dtype, value.shape), value.astype(dtype))


def test_map_step_arguments_are_checked():
    plan = _core.NativePlan(64)
    a, out = np.zeros(6, np.float32), np.zeros(6, np.bool_)
    with pytest.raises(ValueError, match="no operation"):
        plan.add_map("pow", out, [a, a], [6], [[1], [1]])
    with pytest.raises(ValueError, match="takes 2 operands"):
        plan.add_map("equal", out, [a], [6], [[1]])
    with pytest.raises(TypeError, match="C-contiguous"):
        plan.add_map("equal", out, [a, a.astype(np.float16)], [6], [[1], [1]])
    with pytest.raises(ValueError, match="read at"):
        plan.add_map("equal", out, [a, a[:3]], [6], [[1], [1]])
    with pytest.raises(ValueError, match="results"):
        plan.add_map("equal", out[:5], [a, a], [6], [[1], [1]])
    assert len(plan) == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int64])
def test_take_step_gathers_any_table(rng, dtype):
    """A quantized embedding's 8-bit rows (and 8-byte values) gathered as they are."""
    src = rng.integers(-100, 100, (2, 9, 5)).astype(dtype)
    plan = _core.NativePlan(1024)
    idx_view = plan.arena[: 8 * 11].view(np.int64)
    dst = np.empty(2 * 11 * 5, dtype)
    plan.add_take(src.reshape(-1), idx_view, dst, 2, 9, 5)
    idx = rng.integers(-9, 9, 11)
    plan.run([idx], [idx_view], [])
    np.testing.assert_array_equal(dst.reshape(2, 11, 5), np.take(src, idx, axis=1))
    with pytest.raises(TypeError, match="source's type"):
        plan.add_take(src.reshape(-1), idx_view, dst.astype(np.float32), 2, 9, 5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16])
def test_map_step_dequantizes_and_runs_unary_functions_as_numpy(rng, dtype):
    """(x - zero point) * scale of 8- and 16-bit values, bit for bit numpy's float32; sqrt, neg,
    abs and reciprocal of floats (double, rounded once: numpy's float32 bits)."""
    info = np.iinfo(dtype)
    q = rng.integers(info.min, info.max, (3, 40), endpoint=True).astype(dtype)
    scale, zero = np.float32(0.0173), np.array(info.min // 2 + 7, dtype)
    want = (q.astype(np.float32) - zero.astype(np.float32)) * scale
    np.testing.assert_array_equal(_map_step("dequantize", [q, scale, zero], np.float32, q.shape), want)
    x = (10 * rng.standard_normal((5, 33))).astype(np.float32)
    x[0, :3] = [0.0, -0.0, np.nan]
    with np.errstate(all="ignore"):
        for op, fn in (("sqrt", np.sqrt), ("neg", np.negative), ("abs", np.abs), ("reciprocal", np.reciprocal)):
            np.testing.assert_array_equal(_map_step(op, [x], np.float32, x.shape), fn(x))


def _loop_plan(n, values, trips=None, expect=-1, most=-1, stop_at=None, reverse=False):
    """A plan whose loop step runs ``acc += x[t]`` over the rows of ``values`` (n, 3) read in
    ``reverse`` or in order, stacking each iteration's acc into its row of ``stacked`` and the
    iteration number into ``seen``; with ``stop_at``, the body's condition is t + 1 < stop_at."""
    plan = _core.NativePlan(4096)
    body = _core.NativePlan(0)
    acc, row, stacked = _arena_views(plan, (3,), (3,), (n, 3))
    counter = np.zeros(1, np.int64)
    seen = np.full(n + 2, -1, np.int64)
    cond_out = np.ones(1, np.bool_)
    body.add_map("add", acc, [acc, row], [3], [[1], [1]])

    def note():
        seen[counter[0]] = counter[0]
        if stop_at is not None:
            cond_out[0] = counter[0] + 1 < stop_at
        return 0

    body.add_python(note)
    step = 3 * 4
    source = values[n - 1] if reverse else values[0]
    plan.add_loop(
        body,
        None if trips is None else np.array([trips], np.int64),
        None,
        cond_out if stop_at is not None else None,
        counter,
        most,
        expect,
        [(np.zeros(3, np.float32), acc, 0, 0)],
        [(source, row, -step if reverse else step, 0)],
        [(acc, stacked[0], 0, step)],
    )
    return plan, acc, stacked, seen


@pytest.mark.parametrize("reverse", [False, True])
def test_loop_step_runs_its_body_per_iteration(rng, reverse):
    values = rng.standard_normal((5, 3)).astype(np.float32)
    plan, acc, stacked, seen = _loop_plan(5, values, trips=5, expect=5, reverse=reverse)
    for _ in range(2):  # its state starts again from the init copies at every run
        plan.run([], [], [])
        rows = values[::-1] if reverse else values
        np.testing.assert_array_equal(stacked, np.cumsum(rows, axis=0, dtype=np.float32))
        np.testing.assert_array_equal(seen[:5], np.arange(5))


def test_loop_step_stops_on_its_condition_and_refuses_other_iteration_counts(rng):
    values = rng.standard_normal((6, 3)).astype(np.float32)
    plan, acc, _, seen = _loop_plan(6, values, expect=4, stop_at=4)
    plan.run([], [], [])
    np.testing.assert_array_equal(seen, [0, 1, 2, 3, -1, -1, -1, -1])
    np.testing.assert_array_equal(acc, np.cumsum(values[:4], axis=0, dtype=np.float32)[-1])
    for expect, stop in ((3, 4), (5, 4)):  # more iterations, fewer: both refused
        plan, _, _, _ = _loop_plan(6, values, expect=expect, stop_at=stop)
        with pytest.raises(_core.PlanStepFailed) as failed:
            plan.run([], [], [])
        assert failed.value.status == _core.OTHER_SHAPES
    plan, _, _, seen = _loop_plan(6, values, expect=5, most=2, stop_at=5)
    with pytest.raises(_core.PlanStepFailed) as failed:
        plan.run([], [], [])
    assert failed.value.status == _core.LOOP_LIMIT
    np.testing.assert_array_equal(seen[:3], [0, 1, -1])


def test_loop_step_checks_its_copies():
    plan = _core.NativePlan(256)
    body = _core.NativePlan(0)
    a, b = _arena_views(plan, (4,), (4,))
    with pytest.raises(ValueError, match="past its array"):  # the 4th iteration's slice lies outside
        plan.add_loop(body, np.array([4], np.int64), None, None, None, -1, 4, [], [(a[:2], b[:2], 8 * 1024, 0)], [])
    with pytest.raises(ValueError, match="needs the iterations"):
        plan.add_loop(body, None, None, None, None, -1, -1, [], [(a, b, 16, 0)], [])
    with pytest.raises(ValueError, match="bytes into"):
        plan.add_loop(body, None, None, None, None, -1, -1, [(a, b[:2], 0, 0)], [], [])
    with pytest.raises(TypeError, match="trip count"):
        plan.add_loop(body, np.array([4], np.int32), None, None, None, -1, -1, [], [], [])
    assert len(plan) == 0
