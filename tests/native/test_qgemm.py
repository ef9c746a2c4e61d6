"""The native integer product (``fastlayers.native``, qgemm.c) against an int64 numpy reference
on every ISA path, the avx512 and avx2 paths with and without VNNI (vpdpbusd on u8 x s8 quads,
zmm on the avx512 path, ymm on the avx2 path: AVX-VNNI, or AVX-512 VNNI's EVEX encoding where
the CPU has no AVX-VNNI; without VNNI both widen to int16 pairs for vpmaddwd; the portable path
in C): every uint8/int8
pairing with zero points, the extremes where int16 pair sums of u8 x s8 products would
saturate, odd sizes around its tiles (up to 6 rows x 4 panels of 16 columns) and 24-row work
units, and around AMX's (16 x 64 values of a, 16 quads x 16 columns of b, 32-row units, from
8 rows), batch 1, k = 1, k not a multiple of 4, strided rows, and 1-2 threads."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers import native
from fastlayers.native import _core

pytestmark = pytest.mark.usefixtures("isa", "int8_dot")


@pytest.fixture(params=["amx", "vnni", "no-vnni"])
def int8_dot(request, isa):
    """The integer products on AMX tiles from 8 rows (skipped where the ISA path, the CPU or
    the kernel has none), with VNNI (skipped where the ISA path or the CPU has none) and
    without, restored afterwards."""
    if request.param == "amx" and not native.amx_runs():
        pytest.skip(f"no AMX on the {isa} path of this CPU")
    if request.param == "vnni" and not native.vnni_runs():
        pytest.skip(f"no VNNI on the {isa} path of this CPU")
    vnni_before, amx_before = native.vnni(), native.amx_runs() and native.amx()
    native.set_vnni(request.param != "no-vnni")
    if native.amx_runs():
        native.set_amx(request.param == "amx")
    yield request.param
    native.set_vnni(vnni_before)
    if native.amx_runs():
        native.set_amx(amx_before)


TYPES = [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8), (np.int8, np.int8)]


def _values(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _qgemm(a, za, b, zb):
    c = np.full((a.shape[0], b.shape[1]), -7, np.int32)
    return _core.qgemm(a, za, _core.qpack(b, zb), c)


def _expected(a, za, b, zb):
    return (a.astype(np.int64) - za[:, None]) @ (b.astype(np.int64) - zb[None, :])


@pytest.mark.parametrize("types", TYPES)
@pytest.mark.parametrize(
    "m, k, n",
    [
        (1, 1, 1),
        (1, 7, 33),
        (5, 1, 17),
        (6, 2, 16),
        (7, 3, 15),
        (13, 64, 40),
        (2, 40, 20),  # tiles of 2, 3, 10, 11 and 12 rows (12: the avx512 path without VNNI)
        (3, 9, 31),
        (10, 57, 16),
        (11, 24, 48),
        (12, 100, 70),
        (23, 48, 33),
        (25, 33, 1),
        (49, 130, 47),
        (1, 1021, 65),
        (8, 300, 130),
        (16, 64, 16),
        (17, 128, 33),
        (32, 65, 64),
        (33, 200, 97),
        (11, 768, 80),
        (1, 19, 50),  # 1-2 rows on vpdpbusd: quads in pairs, then an odd last quad
        (2, 75, 33),
    ],
)
def test_product_matches_int64_reference(rng, types, m, k, n):
    a_type, b_type = types
    a, b = _values(rng, a_type, (m, k)), _values(rng, b_type, (k, n))
    za, zb = _values(rng, a_type, m).astype(np.int32), _values(rng, b_type, n).astype(np.int32)
    np.testing.assert_array_equal(_qgemm(a, za, b, zb), _expected(a, za, b, zb))


def test_extremes_do_not_saturate():
    """255 x 127 and 255 x -128 pairs (over int16 once two are summed) and the widest
    zero-point shifts (255 - (-255))."""
    for a_value, b_value, za, zb in ((255, 127, 0, 0), (255, -128, 0, 0), (0, -128, 255, 127)):
        a = np.full((7, 37), a_value, np.uint8)
        b = np.full((37, 19), b_value, np.int8)
        za_v, zb_v = np.full(7, za, np.int32), np.full(19, zb, np.int32)
        np.testing.assert_array_equal(_qgemm(a, za_v, b, zb_v), _expected(a, za_v, b, zb_v))
    # int8 a (shifted by 128 for vpdpbusd) and uint8 b (shifted by -128) at their extremes,
    # k = 4000: sums near 2^27 with corrections of the same size
    for a_type, b_type in ((np.int8, np.uint8), (np.uint8, np.uint8), (np.int8, np.int8)):
        for a_value, b_value in (
            (np.iinfo(a_type).min, np.iinfo(b_type).max),
            (np.iinfo(a_type).max, np.iinfo(b_type).min),
        ):
            a = np.full((3, 4000), a_value, a_type)
            b = np.full((4000, 18), b_value, b_type)
            za_v = np.full(3, np.iinfo(a_type).max, np.int32)
            zb_v = np.full(18, np.iinfo(b_type).max, np.int32)
            np.testing.assert_array_equal(_qgemm(a, za_v, b, zb_v), _expected(a, za_v, b, zb_v))


def test_strided_rows_and_threads(rng):
    a_wide = _values(rng, np.uint8, (61, 90))
    za = np.full(61, 3, np.int32)
    threads = native.get_num_threads()
    try:
        for n_threads in (1, 2):
            native.set_num_threads(n_threads)
            for k in (71, 80):  # rows 90 bytes apart (k = 80: read in place by vpdpbusd)
                a = a_wide[:, 5 : 5 + k]
                b = _values(rng, np.int8, (k, 45))
                zb = _values(rng, np.int8, 45).astype(np.int32)
                np.testing.assert_array_equal(_qgemm(a, za, b, zb), _expected(a, za, b, zb))
    finally:
        native.set_num_threads(threads)


def test_arguments_are_checked(rng):
    a, b = _values(rng, np.uint8, (3, 4)), _values(rng, np.int8, (4, 5))
    pb = _core.qpack(b, np.zeros(5, np.int32))
    with pytest.raises(TypeError, match="uint8 or int8"):
        _core.qgemm(a.astype(np.int16), np.zeros(3, np.int32), pb, np.empty((3, 5), np.int32))
    with pytest.raises(ValueError, match="packed by qpack"):
        _core.qgemm(a, np.zeros(3, np.int32), pb[:-1], np.empty((3, 5), np.int32))
    with pytest.raises(ValueError, match="packed by qpack"):  # not 4-byte aligned
        _core.qgemm(a, np.zeros(3, np.int32), np.concatenate([pb[:1], pb])[1:], np.empty((3, 5), np.int32))
    with pytest.raises(ValueError, match="int32 vector of 3"):
        _core.qgemm(a, np.zeros(2, np.int32), pb, np.empty((3, 5), np.int32))
    with pytest.raises(ValueError, match="last axis must be contiguous"):
        _core.qpack(b.T, np.zeros(4, np.int32))


@pytest.mark.parametrize(
    "hidden, batch, attrs",
    [
        (5, 7, {"direction": "bidirectional"}),
        (16, 1, {"direction": "reverse", "clip": 0.5}),
        (3, 2, {"input_forget": 1}),
    ],
)
def test_quantized_lstm_loop_matches_numpy(rng, hidden, batch, attrs):
    """The native DynamicQuantizeLSTM time loop (qlstm.c) against the operator's numpy form
    (the reference backend): odd hidden sizes (an odd k for the recurrent product), more rows
    than a tile, peepholes, clip, input_forget, both orders."""
    import fastlayers
    from fastlayers.onnx.qlstm import _dynamic_quantize_lstm

    n_dir = 2 if attrs.get("direction") == "bidirectional" else 1
    g, n_in, steps = 4 * hidden, 3, 6
    inputs = [
        rng.standard_normal((steps, batch, n_in)).astype(np.float32),
        _values(rng, np.int8, (n_dir, n_in, g)),
        _values(rng, np.uint8, (n_dir, hidden, g)),
        rng.standard_normal((n_dir, 2 * g)).astype(np.float32),
        None,
        rng.standard_normal((n_dir, batch, hidden)).astype(np.float32),
        rng.standard_normal((n_dir, batch, hidden)).astype(np.float32),
        rng.standard_normal((n_dir, 3 * hidden)).astype(np.float32),
        rng.uniform(0.01, 0.05, (n_dir, g)).astype(np.float32),
        np.zeros((n_dir, g), np.int8),
        rng.uniform(0.01, 0.05, n_dir).astype(np.float32),
        np.full(n_dir, 128, np.uint8),
    ]
    op = _dynamic_quantize_lstm
    got = op(inputs, dict(attrs, hidden_size=hidden), 1)
    with fastlayers.use_ops("reference"):
        want = op(inputs, dict(attrs, hidden_size=hidden), 1)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"clip": 0.5}, {"input_forget": 1, "direction": "reverse"}])
@pytest.mark.parametrize("hidden", [300, 304, 320])
def test_quantized_lstm_gates_of_many_rows(rng, attrs, hidden):
    """16 rows x 300 units (a vector tail: the recurrent product shared among the threads, the
    gates on the calling thread), 304 or 320 (whole panels and at least QLSTM_SHARED_GATES_MIN
    gate units: each step shared by units of the hidden state, a share's products then its
    gates, the last share shorter): the same bits at 2 threads as at 1, and the operator's
    numpy form within float32 rounding."""
    import fastlayers
    from fastlayers.onnx.qlstm import _dynamic_quantize_lstm

    batch, n_in, steps = 16, 5, 4
    g = 4 * hidden
    inputs = [
        rng.standard_normal((steps, batch, n_in)).astype(np.float32),
        _values(rng, np.int8, (1, n_in, g)),
        _values(rng, np.uint8, (1, hidden, g)),
        rng.standard_normal((1, 2 * g)).astype(np.float32),
        None,
        rng.standard_normal((1, batch, hidden)).astype(np.float32),
        rng.standard_normal((1, batch, hidden)).astype(np.float32),
        rng.standard_normal((1, 3 * hidden)).astype(np.float32),
        rng.uniform(0.001, 0.005, (1, g)).astype(np.float32),
        np.zeros((1, g), np.int8),
        rng.uniform(0.001, 0.005, 1).astype(np.float32),
        np.full(1, 128, np.uint8),
    ]
    attrs = dict(attrs, hidden_size=hidden)
    with fastlayers.using_threads(1):
        one = _dynamic_quantize_lstm(inputs, attrs, 1)
    with fastlayers.using_threads(2):
        two = _dynamic_quantize_lstm(inputs, attrs, 1)
    with fastlayers.use_ops("reference"):
        want = _dynamic_quantize_lstm(inputs, attrs, 1)
    for a, b, w in zip(one, two, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hidden, batch", [(5, 1), (37, 3), (256, 2), (600, 16), (70, 11)])
def test_quantized_lstm_runs_side_by_side_give_each_runs_bits(rng, hidden, batch):
    """``qlstm_runs``: two directions on 1 and 2 threads (side by side where a step's product is
    small, the largest here one after another) give exactly what separate ``qlstm`` calls give;
    more runs than it takes and runs of the wrong arity are refused."""
    import fastlayers

    g, steps = 4 * hidden, 3
    args = []
    for d in range(2):
        r = _values(rng, np.int8, (hidden, g))
        args.append(
            (
                rng.standard_normal((steps, batch, g)).astype(np.float32),
                d == 1,
                _core.qpack(r, np.zeros(g, np.int32)),
                rng.uniform(0.01, 0.05, g).astype(np.float32),
                rng.standard_normal(g).astype(np.float32),
                None,
                0.0,
                False,
                rng.standard_normal((batch, hidden)).astype(np.float32),
                rng.standard_normal((batch, hidden)).astype(np.float32),
            )
        )

    def run(together, threads):
        states = [(a[8].copy(), a[9].copy(), np.full((steps, batch, hidden), np.nan, np.float32)) for a in args]
        runs = [a[:8] + s for a, s in zip(args, states)]
        before = fastlayers.get_num_threads()
        try:
            fastlayers.set_num_threads(threads)
            if together:
                _core.qlstm_runs(runs)
            else:
                for one in runs:
                    _core.qlstm(*one)
        finally:
            fastlayers.set_num_threads(before or _core.get_num_threads())
        return [v for s in states for v in s]

    want = run(False, 1)
    assert not np.isnan(want[2]).any()
    for threads in (1, 2):
        for got, expected in zip(run(True, threads), want):
            np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="at most 8"):
        _core.qlstm_runs([args[0][:8] + (np.zeros((batch, hidden), np.float32),) * 2 + (None,)] * 9)
    with pytest.raises(ValueError, match="expected qlstm's 11"):
        _core.qlstm_runs([args[0][:8]])


@pytest.mark.parametrize("steps, batch, n_in, hidden", [(1, 1, 512, 5), (4, 3, 7, 37), (0, 2, 3, 4), (2, 1, 1, 16)])
@pytest.mark.parametrize("reverse, peepholes", [(False, False), (True, True)])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_quantized_lstm_from_float_input_is_product_then_loop(
    rng, steps, batch, n_in, hidden, reverse, peepholes, threads
):
    """``dynamic_qlstm``: the input's ``dynamic_qgemm`` by W and then ``qlstm``'s loop, in one
    call: the same outputs and final states bit for bit as the two calls apart (no steps
    included: the states stay as given); a wrong shape is refused."""
    g = 4 * hidden
    x = rng.standard_normal((steps, batch, n_in)).astype(np.float32)
    w_packed = _core.qpack(_values(rng, np.int8, (n_in, g)), np.zeros(g, np.int32))
    r_packed = _core.qpack(_values(rng, np.int8, (hidden, g)), np.zeros(g, np.int32))
    w_scale, r_scale = (rng.uniform(0.01, 0.05, g).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(g).astype(np.float32)
    peep = rng.standard_normal(3 * hidden).astype(np.float32) if peepholes else None
    h0, c0 = (rng.standard_normal((batch, hidden)).astype(np.float32) for _ in range(2))
    loop = (reverse, r_packed, r_scale, bias, peep, 0.0, False)
    want = [h0.copy(), c0.copy(), np.full((steps, batch, hidden), np.nan, np.float32)]
    _core.qlstm(_core.dynamic_qgemm(x, w_packed, w_scale).reshape(steps, batch, g), *loop, *want)
    got = [h0.copy(), c0.copy(), np.full((steps, batch, hidden), np.nan, np.float32)]
    _core.dynamic_qlstm(x, w_packed, w_scale, *loop, *got)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="w_packed"):
        _core.dynamic_qlstm(
            x[..., :0] if n_in > 4 else np.zeros((1, 1, 40), np.float32), w_packed, w_scale, *loop, *got
        )
    with pytest.raises(ValueError, match="w_scale"):
        _core.dynamic_qlstm(x, w_packed, w_scale[:-1], *loop, *got)


@pytest.mark.parametrize("count", [1, 7, 8, 100, 70001])
def test_quantization_kernels_match_numpy(rng, count):
    """quantize.c: clamp(round_half_even(x / scale) + zero_point) to uint8 and int8, the fused
    quantize-dequantize and min/max, against numpy's float32 formula (exact ties and values
    past the range included; 70001 floats run on the pool's threads)."""
    x = (rng.standard_normal(count) * 40).astype(np.float32)
    x[: min(count, 6)] = np.array([0.5, 1.5, -2.5, 1e6, -1e6, 3.25], np.float32)[: min(count, 6)]
    scale = np.float32(0.25)
    for dtype, zp in ((np.uint8, 100), (np.int8, -3)):
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        q = np.clip(np.rint(x / scale) + np.float32(zp), lo, hi)
        np.testing.assert_array_equal(_core.quantize(x, scale, zp, dtype), q.astype(dtype))
        np.testing.assert_array_equal(_core.fake_quantize(x, scale, zp, lo, hi), (q - np.float32(zp)) * scale)
    assert _core.min_max(x) == (min(x.min(), 0), max(x.max(), 0))
    if count > 1:  # a NaN is passed over, in the vector body and in the tail
        for at in (0, count - 1):
            y = x.copy()
            y[at] = np.nan
            assert _core.min_max(y) == (min(np.nanmin(y), 0), max(np.nanmax(y), 0))


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 33, 17), (30, 64, 40)])
def test_float_epilogue(rng, m, k, n):
    """c = float(sum) * scale[j] (+ bias[j]) in the tiles' store, the product rounded before the
    bias is added, as numpy's separate operations (bit for bit)."""
    a, b = _values(rng, np.uint8, (m, k)), _values(rng, np.int8, (k, n))
    za, zb = _values(rng, np.uint8, m).astype(np.int32), np.zeros(n, np.int32)
    scale = rng.uniform(1e-4, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    product = _expected(a, za, b, zb).astype(np.float32) * scale
    pb = _core.qpack(b, zb)
    for with_bias in (False, True):
        c = np.full((m, n), np.nan, np.float32)
        _core.qgemm(a, za, pb, c, scale, bias if with_bias else None)
        np.testing.assert_array_equal(c, product + bias if with_bias else product)
    with pytest.raises(ValueError, match="int32 without a scale"):
        _core.qgemm(a, za, pb, np.empty((m, n), np.int32), scale)
    with pytest.raises(ValueError, match="a bias needs a scale"):
        _core.qgemm(a, za, pb, np.empty((m, n), np.int32), None, bias)


@pytest.mark.parametrize("shape, n", [((1, 1), 1), ((1, 512), 2048), ((3, 2, 33), 17), ((30, 64), 40), ((2, 7), 70)])
@pytest.mark.parametrize("values", ["mixed", "positive", "negative", "zero"])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_dynamic_product_is_quantize_then_product(rng, shape, n, values, threads):
    """dynamic_qgemm: dynamic_quantize of all of x, then the product with the column scales
    b_columns * x_scale (+ bias), bit for bit the two calls apart; x of any rank (its last axis
    reduced), an empty range (scale 1) and one-sided ranges (zero point 0 or 255) included."""
    x = rng.standard_normal(shape).astype(np.float32)
    x = {"mixed": x, "positive": np.abs(x) + 0.5, "negative": -np.abs(x), "zero": np.zeros_like(x)}[values]
    k = shape[-1]
    b, zb = _values(rng, np.int8, (k, n)), rng.integers(-3, 4, n).astype(np.int32)
    columns = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    pb = _core.qpack(b, zb)
    q, scale, zp = _core.dynamic_quantize(x)
    rows = q.reshape(-1, k)
    for given in (None, bias):
        want = np.empty((rows.shape[0], n), np.float32)
        _core.qgemm(rows, np.full(rows.shape[0], zp, np.int32), pb, want, columns * scale, given)
        got = _core.dynamic_qgemm(x, pb, columns, given)
        assert got.shape == shape[:-1] + (n,) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want.reshape(got.shape))


def test_dynamic_product_arguments_are_checked(rng):
    x, b = rng.standard_normal((4, 6)).astype(np.float32), _values(rng, np.int8, (6, 5))
    pb, columns = _core.qpack(b, np.zeros(5, np.int32)), np.ones(5, np.float32)
    assert _core.dynamic_qgemm(x[:0], pb, columns).shape == (0, 5)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        _core.dynamic_qgemm(x[:, ::2], _core.qpack(b[:3], np.zeros(5, np.int32)), columns)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        _core.dynamic_qgemm(x.astype(np.float64), pb, columns)
    with pytest.raises(ValueError, match="no last axis"):
        _core.dynamic_qgemm(np.zeros((4, 0), np.float32), pb, columns)
    with pytest.raises(ValueError, match="packed by qpack"):  # 17 columns are two panels
        _core.dynamic_qgemm(x, pb, np.ones(17, np.float32))
    with pytest.raises(ValueError, match="b_columns"):
        _core.dynamic_qgemm(x, pb, np.ones((5, 1), np.float32))
    with pytest.raises(ValueError, match="bias"):
        _core.dynamic_qgemm(x, pb, columns, np.ones(4, np.float32))


@pytest.mark.parametrize("out", [np.uint8, np.int8])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 33, 17), (30, 64, 40), (25, 27, 70)])
def test_requantizing_epilogue(rng, out, m, k, n):
    """8-bit c = saturate(rint(float(sum + ibias[j]) * scale[j]) + zero point) in the tiles'
    store, bit for bit numpy's form (onnxruntime's requantization): both saturation ends, ties
    rounded to even, NaN and infinite multipliers, the int32 bias with and without, into a
    column slice of a wider c."""
    a, b = _values(rng, np.uint8, (m, k)), _values(rng, np.int8, (k, n))
    za, zb = _values(rng, np.uint8, m).astype(np.int32), _values(rng, np.int8, n).astype(np.int32)
    scale = rng.uniform(1e-5, 4e-3, n).astype(np.float32)
    scale[0] = 0.5  # exact halves: ties to even
    if n > 2:
        scale[1:3] = np.nan, np.inf  # NaN to the low end, as onnxruntime's clamp
    ibias = rng.integers(-30000, 30000, n).astype(np.int32)
    zp = 3 if out == np.uint8 else -5
    pb = _core.qpack(b, zb)
    acc = _expected(a, za, b, zb).astype(np.int32)
    for bias in (None, ibias):
        summed = acc if bias is None else acc + bias
        with np.errstate(invalid="ignore"):
            product = summed.astype(np.float32) * scale
        want = np.clip(
            np.rint(np.fmax(product, np.iinfo(out).min - zp)) + np.float32(zp), np.iinfo(out).min, np.iinfo(out).max
        ).astype(out)
        wide = np.full((m, n + 9), 77, out)
        got = _core.qgemm(a, za, pb, wide[:, 4 : 4 + n], scale, None, bias, zp)
        np.testing.assert_array_equal(got, want)
        assert (wide[:, :4] == 77).all() and (wide[:, 4 + n :] == 77).all()
    with pytest.raises(ValueError, match="an int32 bias needs a scale"):
        _core.qgemm(a, za, pb, np.empty((m, n), np.int32), None, None, ibias)
    with pytest.raises(ValueError, match="zero point 300"):
        _core.qgemm(a, za, pb, np.empty((m, n), out), scale, None, None, 300)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 33, 17), (30, 64, 40), (25, 27, 70)])
def test_float_epilogue_with_an_int32_bias(rng, isa, m, k, n):
    """float32 c = float(sum + ibias[j]) * scale[j] (+ bias[j]): the int32 bias added with
    wrap-around before the conversion (onnxruntime's Add of a quantized bias, then Cast and
    Mul), bit for bit numpy's form, into a column slice of a wider c."""
    a, b = _values(rng, np.uint8, (m, k)), _values(rng, np.int8, (k, n))
    za, zb = _values(rng, np.uint8, m).astype(np.int32), _values(rng, np.int8, n).astype(np.int32)
    scale = rng.uniform(1e-5, 4e-3, n).astype(np.float32)
    ibias = rng.integers(-30000, 30000, n).astype(np.int32)
    ibias[0] = np.iinfo(np.int32).max  # wraps around where the sum is positive
    fbias = rng.standard_normal(n).astype(np.float32)
    pb = _core.qpack(b, zb)
    acc = _expected(a, za, b, zb).astype(np.int32)
    for bias in (None, fbias):
        with np.errstate(over="ignore"):
            want = (acc + ibias).astype(np.float32) * scale
        if bias is not None:
            want = want + bias
        wide = np.full((m, n + 9), 7.0, np.float32)
        got = _core.qgemm(a, za, pb, wide[:, 4 : 4 + n], scale, bias, ibias)
        np.testing.assert_array_equal(got, want)
        assert (wide[:, :4] == 7.0).all() and (wide[:, 4 + n :] == 7.0).all()


def _conv_reference(x_nhwc, x_zp, w_hwio, kernel, strides, dilations, pads, out_hw):
    """int64 windows of x (n, h, w, c) less x_zp by w (kh, kw, c, n_out), positions outside x
    reading as x_zp (so 0 after the shift), pads (top, left) any sign."""
    (kh, kw), (sh, sw), (dh, dw), (top, left), (oh, ow) = kernel, strides, dilations, pads, out_hw
    n, h, w, _ = x_nhwc.shape
    xs = x_nhwc.astype(np.int64) - x_zp
    y = np.zeros((n, oh, ow, w_hwio.shape[-1]), np.int64)
    for ki in range(kh):
        for kj in range(kw):
            rows = oy_rows = np.arange(oh) * sh - top + ki * dh
            cols = np.arange(ow) * sw - left + kj * dw
            inside = (rows[:, None] >= 0) & (rows[:, None] < h) & (cols[None, :] >= 0) & (cols[None, :] < w)
            taps = xs[:, np.clip(oy_rows, 0, h - 1)][:, :, np.clip(cols, 0, w - 1)] * inside[None, :, :, None]
            y += taps @ w_hwio[ki, kj].astype(np.int64)
    return y.reshape(n * oh * ow, -1)


@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize(
    "case",
    [
        # (n, h, w, c), (kh, kw), strides, dilations, (top, left), (bottom, right), (c0, cin), n_out
        ((8, 9, 11, 3), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (0, 3), 32),
        ((1, 13, 7, 5), (3, 2), (2, 1), (1, 2), (0, 2), (1, 0), (0, 5), 17),
        ((2, 6, 6, 8), (1, 1), (2, 2), (1, 1), (0, 0), (0, 0), (0, 8), 5),
        ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), (0, 0), (0, 0), (0, 1), 1),
        ((3, 10, 12, 12), (5, 5), (2, 3), (1, 1), (2, 2), (2, 2), (4, 4), 7),  # a group's channels
        ((2, 8, 8, 16), (3, 3), (1, 1), (2, 2), (-1, 1), (0, 1), (0, 16), 40),  # negative top pad
        ((1, 40, 3, 2), (7, 1), (1, 1), (1, 1), (3, 0), (3, 0), (0, 2), 9),  # k = 14, 40 + rows
        ((1, 9, 14, 1), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), (0, 1), 24),  # one channel
        ((2, 6, 7, 3), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (2, 1), 5),  # one channel of three
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_convolution_gathers_windows_like_numpy(rng, x_type, layout, case, threads):
    """``qconv`` (windows gathered straight into the product's rows) equals the int64
    reference: NHWC and the NHWC view of NCHW x, padding and out-of-range windows as the zero
    point, a group's channel slice, strides, dilations, k not a multiple of 4, 1-2 threads,
    int32 sums and the requantizing store; from 8 rows on AMX tiles where the CPU has them
    (rows padded to whole tiles, k to whole 64-byte tile rows)."""
    shape, kernel, strides, dilations, (top, left), (bottom, right), (c0, cin), n_out = case
    n, h, w, c = shape
    x_nhwc = _values(rng, x_type, shape)
    if layout == "nchw":  # channels 1 apart no more: the NHWC view of an NCHW array
        x_nhwc = np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)
    x_zp = int(_values(rng, x_type, ()))
    w_hwio = _values(rng, np.int8, kernel + (cin, n_out))
    zb = _values(rng, np.int8, n_out).astype(np.int32)
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    oh = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    ow = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    pb = _core.qpack(np.ascontiguousarray(w_hwio.reshape(-1, n_out)), zb)
    want = _conv_reference(
        x_nhwc[..., c0 : c0 + cin],
        x_zp,
        w_hwio.astype(np.int64) - zb,
        kernel,
        strides,
        dilations,
        (top, left),
        (oh, ow),
    )
    before = native.get_num_threads()
    native.set_num_threads(threads)
    try:
        got = _core.qconv(
            x_nhwc,
            x_zp,
            pb,
            np.full((n * oh * ow, n_out), -7, np.int32),
            kernel,
            strides,
            dilations,
            (top, left),
            (oh, ow),
            c0,
            cin,
        )
        np.testing.assert_array_equal(got, want)
        scale = rng.uniform(1e-4, 3e-3, n_out).astype(np.float32)
        bias = rng.integers(-5000, 5000, n_out).astype(np.int32)
        wide = np.full((n * oh * ow, n_out + 3), 77, np.uint8)
        got8 = _core.qconv(
            x_nhwc,
            x_zp,
            pb,
            wide[:, 1 : 1 + n_out],
            kernel,
            strides,
            dilations,
            (top, left),
            (oh, ow),
            c0,
            cin,
            scale,
            None,
            bias,
            128,
        )
        product = (want + bias).astype(np.int32).astype(np.float32) * scale
        np.testing.assert_array_equal(got8, np.clip(np.rint(product) + 128, 0, 255).astype(np.uint8))
        assert (wide[:, 0] == 77).all() and (wide[:, 1 + n_out :] == 77).all()
    finally:
        native.set_num_threads(before)


def test_convolution_arguments_are_checked(rng):
    x = _values(rng, np.uint8, (1, 5, 5, 4))
    pb = _core.qpack(_values(rng, np.int8, (36, 3)), np.zeros(3, np.int32))
    c = np.empty((25, 3), np.int32)
    geometry = ((3, 3), (1, 1), (1, 1), (1, 1), (5, 5))
    with pytest.raises(TypeError, match="uint8 or int8"):
        _core.qconv(x.astype(np.int16), 0, pb, c, *geometry)
    with pytest.raises(ValueError, match="4-D"):
        _core.qconv(x[0], 0, pb, c, *geometry)
    with pytest.raises(ValueError, match="channels 3:3\\+2 of 4"):
        _core.qconv(x, 0, pb, c, *geometry, 3, 2)
    with pytest.raises(ValueError, match="must be positive"):
        _core.qconv(x, 0, pb, c, (3, 3), (0, 1), (1, 1), (1, 1), (5, 5))
    with pytest.raises(ValueError, match="not a \\(27, 3\\) operand"):
        _core.qconv(x, 0, pb, c, *geometry, 0, 3)
    with pytest.raises(ValueError, match="of 25 rows"):
        _core.qconv(x, 0, pb, np.empty((24, 3), np.int32), *geometry)
    with pytest.raises(ValueError, match="zero point 256"):
        _core.qconv(x, 256, pb, c, *geometry)


@pytest.mark.parametrize("threads", [1, 2])
def test_many_rows_run_block_by_block(rng, threads):
    """Products and convolutions whose prepared rows outgrow one of qgemm_run's blocks of
    units (512 KiB of prepared rows) equal the int64 reference on every block: the int32 sums
    and the requantizing store."""
    before = native.get_num_threads()
    native.set_num_threads(threads)
    try:
        m, k, n = 3001, 301, 21  # 2 to 4 blocks of rows, the last one partial
        a = _values(rng, np.uint8, (m, k))
        za = _values(rng, np.uint8, m).astype(np.int32)
        b = _values(rng, np.int8, (k, n))
        zb = _values(rng, np.int8, n).astype(np.int32)
        want = _expected(a, za, b, zb)
        np.testing.assert_array_equal(_qgemm(a, za, b, zb), want)
        scale = rng.uniform(1e-5, 1e-4, n).astype(np.float32)
        got8 = _core.qgemm(a, za, _core.qpack(b, zb), np.empty((m, n), np.int8), scale, None, None, -3)
        product = want.astype(np.int32).astype(np.float32) * scale
        np.testing.assert_array_equal(got8, np.clip(np.rint(product) - 3, -128, 127).astype(np.int8))

        x = _values(rng, np.uint8, (1, 70, 60, 24))  # 4200 windows of 216 values
        w_hwio = _values(rng, np.int8, (3, 3, 24, 10))
        zb = _values(rng, np.int8, 10).astype(np.int32)
        pb = _core.qpack(np.ascontiguousarray(w_hwio.reshape(-1, 10)), zb)
        geometry = ((3, 3), (1, 1), (1, 1), (1, 1), (70, 60))
        got = _core.qconv(x, 9, pb, np.full((4200, 10), -7, np.int32), *geometry)
        want = _conv_reference(x, 9, w_hwio.astype(np.int64) - zb, *geometry)
        np.testing.assert_array_equal(got, want.reshape(4200, 10))
    finally:
        native.set_num_threads(before)
