"""CpuOps convolution and pooling kernels against ReferenceOps, with hypothesis over shapes and
options (stride, dilation, asymmetric padding, groups, depth multiplier, ceil-mode windows)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastlayers
from fastlayers import layers as L
from fastlayers.backends import get_ops
from fastlayers.backends.cpu import _blas, _gemm, _split, conv_ops
from fastlayers.backends.reference_conv import conv_out_size

from .conftest import assert_close

REF, CPU = get_ops("reference"), get_ops("cpu")
ACTS = ["linear", "relu", "sigmoid", "gelu", "tanh", "leaky_relu"]


def arr(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@st.composite
def conv_case(draw):
    groups = draw(st.integers(1, 3))
    cin_g, cout_g = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - sum(pads[0])), 12))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - sum(pads[1])), 12))
    n = draw(st.integers(1, 3))
    return dict(n=n, h=h, w=w, groups=groups, cin_g=cin_g, cout_g=cout_g, k=(kh, kw), s=(sh, sw),
                d=(dh, dw), pads=pads, act=draw(st.sampled_from(ACTS)), bias=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=60, deadline=None)
@given(conv_case())
def test_conv2d_cpu_matches_reference(c):
    x = arr(c["seed"], (c["n"], c["h"], c["w"], c["groups"] * c["cin_g"]))
    w = arr(c["seed"] + 1, (*c["k"], c["cin_g"], c["groups"] * c["cout_g"]))
    b = arr(c["seed"] + 2, (c["groups"] * c["cout_g"],)) if c["bias"] else None
    args = (x, w, b, c["s"], c["pads"], c["d"], c["groups"], c["act"], 0.1)
    assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(conv_case(), st.integers(1, 3))
def test_depthwise_cpu_matches_reference(c, m):
    ch = c["groups"] * c["cin_g"]
    x = arr(c["seed"], (c["n"], c["h"], c["w"], ch))
    w = arr(c["seed"] + 1, (*c["k"], ch, m))
    b = arr(c["seed"] + 2, (ch * m,)) if c["bias"] else None
    args = (x, w, b, c["s"], c["pads"], c["d"], c["act"], 0.1)
    assert_close(CPU.depthwise_conv2d(*args), REF.depthwise_conv2d(*args), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(conv_case(), st.integers(0, 2), st.integers(0, 2))
def test_conv_transpose2d_cpu_matches_reference(c, extra_h, extra_w):
    x = arr(c["seed"], (c["n"], c["h"], c["w"], c["groups"] * c["cin_g"]))
    w = arr(c["seed"] + 1, (*c["k"], c["groups"] * c["cin_g"], c["cout_g"]))
    b = arr(c["seed"] + 2, (c["groups"] * c["cout_g"],)) if c["bias"] else None
    (kh, kw), (sh, sw), (dh, dw) = c["k"], c["s"], c["d"]
    crop = (c["pads"][0][0], c["pads"][1][0])
    out = ((c["h"] - 1) * sh + dh * (kh - 1) + 1 - crop[0] + extra_h,
           (c["w"] - 1) * sw + dw * (kw - 1) + 1 - crop[1] + extra_w)
    if min(out) <= 0:
        return
    args = (x, w, b, c["s"], crop, out, c["d"], c["groups"], c["act"], 0.1)
    assert_close(CPU.conv_transpose2d(*args), REF.conv_transpose2d(*args), rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(conv_case(), st.sampled_from(["max", "avg"]), st.booleans(), st.integers(0, 1))
def test_pool2d_cpu_matches_reference(c, kind, count_include_pad, ceil_extra):
    x = arr(c["seed"], (c["n"], c["h"], c["w"], c["cin_g"]))
    (kh, kw), (sh, sw) = c["k"], c["s"]
    pads = tuple((min(p[0], k // 2), min(p[1], k // 2)) for p, k in zip(c["pads"], c["k"]))
    d = c["d"] if kind == "max" else (1, 1)
    ho = conv_out_size(c["h"], kh, sh, sum(pads[0]), d[0])
    wo = conv_out_size(c["w"], kw, sw, sum(pads[1]), d[1])
    if min(ho, wo) <= 0:
        return
    # ceil mode: one more window while it starts inside the input or the leading padding
    if ceil_extra and ho * sh < c["h"] + pads[0][0]:
        ho += 1
    args = (x, kind, c["k"], c["s"], pads, (ho, wo), d, count_include_pad)
    assert_close(CPU.pool2d(*args), REF.pool2d(*args), rtol=1e-5, atol=1e-6)


def test_conv2d_in_several_workspace_chunks(monkeypatch):
    x, w, b = arr(0, (3, 9, 10, 5)), arr(1, (3, 3, 5, 7)), arr(2, (7,))
    whole = CPU.conv2d(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu")
    monkeypatch.setattr(conv_ops, "_COLS_CHUNK", 45 * 37)    # 37 rows per chunk: 8 ragged chunks
    monkeypatch.setattr(conv_ops, "_winograd_pays", lambda *a: False)
    chunked = CPU.conv2d(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu")
    assert_close(chunked, whole)   # sgemm may round differently for other row counts
    assert_close(whole, REF.conv2d(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu"))


@pytest.mark.parametrize("threads", [2, 3])
def test_kernels_split_over_threads_match_reference(monkeypatch, threads):
    monkeypatch.setattr(conv_ops, "_MIN_OUT_VALUES", 1)     # split even tiny calls
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    x = arr(0, (2, 7, 9, 5))
    w = arr(1, (3, 3, 5, 2))
    pads = ((1, 1), (0, 2))
    assert_close(CPU.depthwise_conv2d(x, w, None, (2, 1), pads),
                 REF.depthwise_conv2d(x, w, None, (2, 1), pads))
    for kind in ("max", "avg"):
        assert_close(CPU.pool2d(x, kind, (3, 3), (2, 1), pads, (4, 9), (1, 1), True),
                     REF.pool2d(x, kind, (3, 3), (2, 1), pads, (4, 9), (1, 1), True))


WINOGRAD_CASES = [   # (n, h, w, c_in, c_out, pads): odd outputs, one-sided / no padding, batch > 1
    (1, 5, 7, 3, 4, ((1, 1), (1, 1))),
    (2, 6, 5, 8, 3, ((0, 1), (1, 0))),
    (1, 1, 1, 2, 2, ((1, 1), (1, 1))),
    (3, 4, 4, 5, 6, ((0, 0), (0, 0))),
    (2, 9, 3, 17, 9, ((2, 0), (0, 2))),
    (1, 12, 11, 16, 20, ((1, 1), (1, 1))),
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("block_tiles", [1, 5, 64])
@pytest.mark.parametrize("case", WINOGRAD_CASES)
def test_winograd_conv_matches_reference(monkeypatch, case, block_tiles, threads):
    n, h, w, cin, cout, pads = case
    monkeypatch.setattr(conv_ops, "_winograd_pays", lambda *a: True)
    monkeypatch.setattr(conv_ops, "_WINOGRAD_BLOCK_TILES", block_tiles)   # several blocks
    monkeypatch.setattr(conv_ops, "_MIN_SHARE_FLOPS", 1)                  # split tiny calls
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    x, k, b = arr(n, (n, h, w, cin)), arr(h, (3, 3, cin, cout)), arr(w, (cout,))
    for bias, act in ((b, "relu"), (None, "linear"), (b, "tanh")):
        args = (x, k, bias, (1, 1), pads, (1, 1), 1, act)
        assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_winograd_with_few_tiles_shares_the_products_by_e(monkeypatch, threads):
    """Up to 2 blocks of tiles, the three phases run in separate regions (products shared by e)
    whenever there are threads to share them; the result does not depend on the path."""
    calls = []
    real = conv_ops._winograd.products_f23_par
    monkeypatch.setattr(conv_ops._winograd, "products_f23_par",
                        lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    x, k, b = arr(0, (2, 7, 9, 16)), arr(1, (3, 3, 16, 24)), arr(2, (24,))
    args = (x, k, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu")
    assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)
    assert calls == ([] if threads == 1 else [min(threads, 2)])


def test_winograd_is_chosen_for_large_3x3_convolutions(monkeypatch):
    calls = []
    for name in ("conv3x3_f23", "products_f23_par"):           # by tile rows, or by e
        real = getattr(conv_ops._winograd, name)
        monkeypatch.setattr(conv_ops._winograd, name,
                            lambda *a, real=real: calls.append(1) or real(*a))
    x, k = arr(0, (1, 16, 16, 16)), arr(1, (3, 3, 16, 16))
    y = CPU.conv2d(x, k, None, (1, 1), ((1, 1), (1, 1)))
    assert calls
    assert_close(y, REF.conv2d(x, k, None, (1, 1), ((1, 1), (1, 1))), rtol=1e-5, atol=1e-5)
    calls.clear()
    CPU.conv2d(x, k, None, (2, 2), ((1, 1), (1, 1)))        # stride 2: im2col
    assert not calls


@pytest.mark.parametrize("threads", [2, 3])
def test_im2col_conv_split_over_threads_matches_reference(monkeypatch, threads):
    monkeypatch.setattr(conv_ops, "_MIN_SHARE_FLOPS", 1)
    monkeypatch.setattr(conv_ops, "_COLS_CHUNK", 30 * 7)      # 7-row chunks inside each share
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    x, k, b = arr(0, (2, 7, 9, 6)), arr(1, (5, 1, 6, 4)), arr(2, (4,))
    args = (x, k, b, (2, 1), ((2, 1), (0, 0)), (1, 2), 1, "relu")
    assert_close(CPU.conv2d(*args), REF.conv2d(*args))


needs_implicit = pytest.mark.skipif(_blas.CONV is None,
                                    reason="the implicit-GEMM kernel needs AVX-512F and its extension")


@needs_implicit
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("x_shape, k_shape, strides, pads, dilation", [
    ((2, 9, 23, 5), (3, 3, 5, 40), (2, 1), ((1, 0), (2, 1)), (2, 1)),   # wo 24: tiles 14 + 10
    ((1, 3, 7, 16), (3, 3, 16, 70), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 3 rows: column shares
    ((3, 5, 4, 3), (2, 2, 3, 33), (3, 3), ((0, 0), (0, 0)), (1, 1)),    # stride > kernel, wo 1
    ((1, 12, 19, 8), (1, 3, 8, 32), (1, 4), ((0, 0), (1, 0)), (1, 1)),  # 1x3, wo 5: 8-row tile
    ((2, 6, 17, 4), (7, 7, 4, 9), (2, 2), ((3, 3), (3, 3)), (1, 1)),    # stem-like, wo 9
    ((1, 10, 13, 6), (3, 2, 6, 64), (1, 3), ((2, 0), (0, 1)), (3, 1)),  # wo 4: 4-row tile
])
def test_implicit_gemm_conv_matches_reference(monkeypatch, threads, x_shape, k_shape, strides,
                                              pads, dilation):
    """The implicit-GEMM route (groups 1, no width dilation, kernel larger than 1x1, from 256 K
    multiply-adds; smaller ones cost more in its setup than they gain): by rows
    in chunks and shares, or by column shares when there are few output rows; every tile
    height (14, 8, 4) for the last output columns of a row."""
    calls = []
    real = conv_ops._conv_implicit
    monkeypatch.setattr(conv_ops, "_conv_implicit", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(conv_ops, "_MIN_SHARE_FLOPS", 1)
    monkeypatch.setattr(_gemm, "PACKED_CHUNK_FLOATS", 200)       # a few output rows per chunk
    monkeypatch.setattr(_gemm, "PACKED_MIN_MADDS", 0)            # small convolutions too
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    x, k, b = arr(0, x_shape), arr(1, k_shape), arr(2, k_shape[-1:])
    args = (x, k, b, strides, pads, dilation, 1, "relu")
    assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)
    assert calls


def test_replaced_weights_reach_the_winograd_path():
    layer = L.Conv2D(16, 3, padding="same")
    x = arr(0, (1, 16, 16, 16))
    y0 = layer(x)
    new = [arr(3, layer.kernel.shape), arr(4, layer.bias.shape)]
    layer.set_weights(new)
    with fastlayers.use_ops("reference"):
        expected = layer(x)
    assert not np.allclose(y0, expected)
    assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_outputs_do_not_alias_the_workspace():
    x, w = arr(0, (1, 6, 6, 3)), arr(1, (3, 3, 3, 4))
    first = CPU.conv2d(x, w, None, pads=((1, 1), (1, 1)))
    kept = first.copy()
    CPU.conv2d(arr(5, (1, 6, 6, 3)), w, None, pads=((1, 1), (1, 1)))
    np.testing.assert_array_equal(first, kept)


def test_nan_propagates_through_conv_and_pool():
    x = arr(0, (1, 5, 5, 2))
    x[0, 2, 2, 0] = np.nan
    y = CPU.conv2d(x, arr(1, (3, 3, 2, 2)), None, pads=((1, 1), (1, 1)))
    assert np.isnan(y[0, 1:4, 1:4]).all() and not np.isnan(y[0, 0, 0]).any()
    p = CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (4, 4))
    assert np.isnan(p[0, 1:3, 1:3, 0]).all() and not np.isnan(p[..., 1]).any()
    d = CPU.depthwise_conv2d(x, arr(2, (3, 3, 2, 1)), None, pads=((1, 1), (1, 1)))
    assert np.isnan(d[0, 1:4, 1:4, 0]).all() and not np.isnan(d[..., 1]).any()


@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_3x3_nan_at_every_tap_wins(stride):
    """The 3x3 fast path takes a plain max and recomputes a cell that saw a NaN: a NaN at any of
    the nine taps, in any channel, next to +-inf, gives NaN exactly where the reference does."""
    c = 19                                  # a vector of 16 and a remainder
    for tap in range(9):
        x = arr(tap, (1, 7, 7, c))
        x[0, 2 + tap // 3, 2 + tap % 3, tap] = np.nan
        x[0, 3, 3, c - 1] = np.nan
        x[0, 2, 3, 4], x[0, 4, 2, 4] = np.inf, -np.inf
        args = ("max", (3, 3), (stride, stride), ((1, 1), (1, 1)),
                (conv_out_size(7, 3, stride, 2), ) * 2)
        got, want = CPU.pool2d(x, *args), REF.pool2d(x, *args)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert np.isnan(want).any()
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def conv_model():
    inp = fastlayers.Input((10, 10, 3))
    h = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inp)
    h = L.DepthwiseConv2D(3, padding="same", activation="relu6")(h)
    h = L.Conv2D(8, 1)(h)
    h = L.MaxPooling2D(3, strides=1, padding="same")(h)
    h = L.Conv2DTranspose(4, 3, strides=2, padding="same")(h)
    h = L.AveragePooling2D(2)(h)
    return fastlayers.Model(inp, L.Dense(3, activation="softmax")(L.GlobalAveragePooling2D()(h)))


@pytest.mark.parametrize("ops", ["cpu", "reference"])
def test_conv_model_8_threads_x_200_calls_equal_serial(ops, monkeypatch):
    monkeypatch.setattr(conv_ops, "_MIN_OUT_VALUES", 64)   # split kernels over threads too
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    threads, calls = 8, 200
    model = conv_model()
    rng = np.random.default_rng(3)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])
    # varied batch sizes and image sizes so workspaces of different shapes interleave
    inputs = [rng.standard_normal((1 + i % 3, 10, 10, 3)).astype(np.float32) for i in range(threads * calls)]
    with fastlayers.use_ops(ops):
        serial = [model(x) for x in inputs]

    def worker(t):
        with fastlayers.use_ops(ops):
            return [model(inputs[t * calls + i]) for i in range(calls)]

    with ThreadPoolExecutor(threads) as pool:
        results = [y for chunk in pool.map(worker, range(threads)) for y in chunk]
    assert all(np.all(np.isfinite(y)) for y in serial)
    for got, want in zip(results, serial):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 5), st.integers(1, 6),
       st.integers(1, 6), st.sampled_from(["max", "avg"]), st.integers(0, 2**16))
def test_adaptive_pool_cpu_matches_reference(n, h, w, c, oh, ow, kind, seed):
    x = arr(seed, (n, h, w, c))
    assert_close(CPU.adaptive_pool2d(x, kind, (oh, ow)), REF.adaptive_pool2d(x, kind, (oh, ow)),
                 rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), st.sampled_from([1.0, 0.5, 0.25]),
       st.integers(0, 2**16))
def test_roi_pool_cpu_matches_reference(k, ph, pw, scale, seed):
    rng = np.random.default_rng(seed)
    x = arr(seed, (2, 7, 9, 3))
    corners = rng.uniform(-5, 40, (k, 4)).astype(np.float32)
    rois = np.concatenate([rng.integers(0, 2, (k, 1)).astype(np.float32), corners], axis=1)
    np.testing.assert_array_equal(CPU.roi_pool(x, rois, (ph, pw), scale),
                                  REF.roi_pool(x, rois, (ph, pw), scale))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_split_kernels_work_in_a_forked_child(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(conv_ops, "_MIN_OUT_VALUES", 1)
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    x = arr(0, (1, 6, 6, 4))
    parent = CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (5, 5))   # starts the pool
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply_async(_child_pool, (x,)).get(timeout=60)
    np.testing.assert_array_equal(child, parent)


def _child_pool(x):
    conv_ops._MIN_OUT_VALUES = 1
    _split.thread_count = lambda: 2
    return CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (5, 5))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.integers(1, 6), st.integers(1, 6), st.integers(1, 4), st.integers(1, 13),
       st.integers(1, 13), st.sampled_from(["nearest", "bilinear"]), st.booleans(), st.integers(0, 2**16))
def test_upsample_cpu_matches_reference(n, h, w, c, oh, ow, mode, align, seed):
    x = arr(seed, (n, h, w, c))
    align = align and mode == "bilinear"
    assert_close(CPU.upsample2d(x, (oh, ow), mode, align), REF.upsample2d(x, (oh, ow), mode, align),
                 rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 7), st.sampled_from([1e-4, 0.1, 2.0]),
       st.sampled_from([0.5, 0.75, 1.0, 0.6]), st.sampled_from([1.0, 2.0]), st.integers(0, 2**16))
def test_lrn_cpu_matches_reference(c, size, alpha, beta, k, seed):
    x = arr(seed, (2, 3, c), scale=3.0)
    assert_close(CPU.local_response_norm(x, size, alpha, beta, k),
                 REF.local_response_norm(x, size, alpha, beta, k), rtol=2e-5, atol=1e-6)


def test_lrn_and_resize_propagate_nan():
    x = arr(0, (1, 2, 2, 5))
    x[0, 0, 0, 2] = np.nan
    y = CPU.local_response_norm(x, 3)
    assert np.isnan(y[0, 0, 0, 1:4]).all() and not np.isnan(y[0, 0, 0, [0, 4]]).any()
    assert np.isnan(CPU.upsample2d(x, (4, 4), "bilinear")[0, :2, :2, 2]).all()
