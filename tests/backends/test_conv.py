"""The native convolution and pooling kernels (``native/conv_*.c``, ``native/pool.c``) and the
CpuOps primitives on them, against ReferenceOps on every ISA path this CPU runs (the ``isa``
fixture of conftest.py): hypothesis over shapes and options (stride, dilation, asymmetric
padding, groups, depth multiplier, ceil-mode windows), each convolution method forced, odd
channel counts (vector tails), batch and length 1, strided inputs, several threads."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastlayers
from fastlayers import layers as L
from fastlayers import native
from fastlayers.backends import get_ops
from fastlayers.backends.cpu import conv as conv_ops
from fastlayers.backends.cpu import steps
from fastlayers.geometry import window_out, window_out_2d
from fastlayers.native import _core

from ..conftest import assert_close, assert_close_to_scale

REF, CPU = get_ops("reference"), get_ops("cpu")
ACTS = ["linear", "relu", "sigmoid", "gelu", "tanh", "leaky_relu"]


def examples(n):
    """Hypothesis settings for ``n`` examples run on the ISA fixture's path (set once per test,
    so it is not reset between examples)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def threads(n):
    """The native kernels on ``n`` threads in the block."""
    before = native.get_num_threads()
    native.set_num_threads(n)
    try:
        yield
    finally:
        native.set_num_threads(before)


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
    return dict(
        n=n,
        h=h,
        w=w,
        groups=groups,
        cin_g=cin_g,
        cout_g=cout_g,
        k=(kh, kw),
        s=(sh, sw),
        d=(dh, dw),
        pads=pads,
        act=draw(st.sampled_from(ACTS)),
        bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def conv_args(c, wide=1):
    """(x, w, b, strides, pads, dilation, groups, activation, alpha) of a drawn case; ``wide``
    multiplies the channels (vector tails and whole vectors)."""
    cin, cout = c["groups"] * c["cin_g"] * wide, c["groups"] * c["cout_g"] * wide
    x = arr(c["seed"], (c["n"], c["h"], c["w"], cin))
    fan_in = c["k"][0] * c["k"][1] * cin // c["groups"]
    w = arr(c["seed"] + 1, (*c["k"], cin // c["groups"], cout), fan_in**-0.5)
    b = arr(c["seed"] + 2, (cout,)) if c["bias"] else None
    return (x, w, b, c["s"], c["pads"], c["d"], c["groups"], c["act"], 0.1)


@examples(60)
@given(c=conv_case(), wide=st.sampled_from([1, 5]))
def test_conv2d_cpu_matches_reference(isa, c, wide):
    args = conv_args(c, wide)
    assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)


def native_conv(x, w, b, strides, pads, dilation, groups, act, alpha, method):
    """``_core.conv2d`` by ``method`` (the reference's activation applied when not native)."""
    n, h, wd, _ = x.shape
    kh, kw, _, cout = w.shape
    ho = window_out(h, kh, strides[0], dilation[0], pads[0])
    wo = window_out(wd, kw, strides[1], dilation[1], pads[1])
    y = np.empty((n, ho, wo, cout), np.float32)
    _core.conv2d(
        x,
        _core.conv_pack(w, groups),
        b,
        y,
        kh,
        kw,
        *strides,
        *dilation,
        pads[0][0],
        pads[1][0],
        groups,
        native.CODES[act],
        alpha,
        method,
    )
    return y


@examples(40)
@given(c=conv_case(), wide=st.sampled_from([1, 3, 9]), method=st.sampled_from(["implicit", "im2col", "dot"]))
def test_conv2d_each_method_matches_reference(isa, c, wide, method):
    """Each of conv2d's ways on every case it takes: the implicit GEMM (one group; window rows
    in one run, or one run per tap with a width dilation), im2col + sgemm, and the dot products
    along the window rows (one group, no width dilation, at most 4 output channels)."""
    if method != "im2col":
        c = dict(c, groups=1)
    if method == "dot":
        c = dict(c, d=(c["d"][0], 1))
    args = conv_args(c, wide)
    if method == "dot":  # at most 4 of the drawn output channels
        x, w, b, *rest = args
        args = (x, np.ascontiguousarray(w[..., :4]), None if b is None else b[:4], *rest)
    if (
        window_out(c["h"], c["k"][0], c["s"][0], c["d"][0], c["pads"][0]) <= 0
        or window_out(c["w"], c["k"][1], c["s"][1], c["d"][1], c["pads"][1]) <= 0
    ):
        return
    code = {"implicit": _core.CONV_IMPLICIT, "im2col": _core.CONV_IM2COL, "dot": _core.CONV_DOT}[method]
    assert_close(native_conv(*args, code), REF.conv2d(*args), rtol=1e-5, atol=1e-5)


RESIDUAL_CASES = [
    # (x shape, kernel (kh, kw, cout), strides, pads, method): the implicit GEMM over whole and
    # narrow column blocks, im2col by row blocks (>= 256 output rows) and on few rows, the 1x1
    # product on x itself, a grouped convolution
    ((1, 9, 11, 8), (3, 3, 32), (1, 1), ((1, 1), (1, 1)), "implicit"),
    ((2, 7, 13, 5), (3, 3, 8), (1, 1), ((1, 1), (1, 1)), "implicit"),
    ((1, 12, 40, 16), (3, 3, 24), (2, 1), ((1, 1), (1, 1)), "implicit"),
    ((1, 20, 20, 6), (3, 3, 17), (1, 1), ((1, 1), (1, 1)), "im2col"),
    ((1, 5, 6, 6), (3, 3, 40), (1, 1), ((1, 1), (1, 1)), "im2col"),
    ((2, 14, 14, 24), (1, 1, 64), (1, 1), ((0, 0), (0, 0)), "auto"),
    ((1, 3, 3, 4), (1, 1, 3), (1, 1), ((0, 0), (0, 0)), "auto"),
    # products on few rows (whole vectors of columns), on the thin path's rows (at most 8),
    # im2col on few rows with whole vectors of columns
    ((1, 4, 5, 32), (1, 1, 48), (1, 1), ((0, 0), (0, 0)), "auto"),
    ((1, 2, 3, 8), (1, 1, 32), (1, 1), ((0, 0), (0, 0)), "auto"),
    ((1, 6, 7, 16), (3, 3, 32), (1, 1), ((1, 1), (1, 1)), "im2col"),
    # dot products along the window rows, and the 1x1 form the automatic choice gives them
    ((2, 9, 11, 8), (3, 3, 2), (1, 1), ((1, 1), (1, 1)), "dot"),
    ((1, 6, 7, 24), (1, 1, 3), (1, 1), ((0, 0), (0, 0)), "auto"),
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("act, res_act", [("linear", "relu"), ("silu", "linear"), ("relu", "gelu")])
@pytest.mark.parametrize("case", RESIDUAL_CASES)
def test_conv2d_adds_a_residual_in_its_epilogue(isa, n_threads, act, res_act, case):
    """y = g(f(conv(x) + b) + r) from ``_core.conv2d``'s ``res``, on each of its ways, as the
    convolution then the residual Add and activation: the same formula, the sum's bits."""
    x_shape, (kh, kw, cout), strides, pads, method = case
    x = arr(1, x_shape)
    w = arr(2, (kh, kw, x_shape[3], cout), (kh * kw * x_shape[3]) ** -0.5)
    b = arr(3, (cout,))
    method_code = {"implicit": _core.CONV_IMPLICIT, "im2col": _core.CONV_IM2COL, "dot": _core.CONV_DOT, "auto": 0}[
        method
    ]
    with threads(n_threads):
        y = native_conv(x, w, b, strides, pads, (1, 1), 1, act, 0.1, method_code)
        r = arr(4, y.shape)
        got = np.empty_like(y)
        _core.conv2d(
            x,
            _core.conv_pack(w, 1),
            b,
            got,
            kh,
            kw,
            *strides,
            1,
            1,
            pads[0][0],
            pads[1][0],
            1,
            native.CODES[act],
            0.1,
            method_code,
            r,
            native.CODES[res_act],
            0.2,
        )
        want = CPU.add_act(y, r, res_act, 0.2)
    np.testing.assert_array_equal(got, want)
    assert_close(
        got,
        REF.activation(REF.conv2d(x, w, b, strides, pads, (1, 1), 1, act, 0.1) + r, res_act, 0.2),
        rtol=1e-5,
        atol=1e-5,
    )


def test_conv2d_residual_is_checked():
    x, w = arr(1, (1, 4, 4, 3)), arr(2, (3, 3, 3, 8))
    y = np.empty((1, 2, 2, 8), np.float32)
    pw = _core.conv_pack(w, 1)
    relu = native.CODES["relu"]
    with pytest.raises(ValueError, match="res"):
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 1, relu, 0.0, 0, arr(3, (1, 2, 2, 7)), relu, 0.0)
    with pytest.raises(ValueError, match="res"):
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 1, relu, 0.0, 0, y, relu, 0.0)
    with pytest.raises(ValueError):
        softmax = _core.ACTIVATIONS.index("softmax")
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 1, relu, 0.0, 0, arr(3, (1, 2, 2, 8)), softmax, 0.0)


@pytest.mark.parametrize(
    "x_shape, k, groups",
    [
        ((1, 8, 8, 16), (3, 3, 32), 1),
        ((1, 10, 10, 8), (3, 3, 8), 8),
        ((2, 6, 6, 4), (3, 3, 4), 1),
        ((1, 4, 4, 3), (2, 2, 5), 1),
    ],
)
def test_residual_plan_on_every_form(isa, x_shape, k, groups):
    """``conv2d_residual_plan`` on the forms that add the residual after the kernel (Winograd,
    depthwise) as on those that take it in, and with r None (the convolution alone) or one
    that broadcasts: each as the reference's convolution then ``add_act``."""
    kh, kw, cout = k
    x = arr(1, x_shape)
    w = arr(2, (kh, kw, x_shape[3] // groups, cout), 0.3)
    b = arr(3, (cout,))
    args = ((1, 1), ((1, 1), (1, 1)), (1, 1), groups, "relu", 0.0)
    want_y = REF.conv2d(x, w, b, *args)
    for ops in (CPU, REF):
        run = ops.conv2d_residual_plan(x.shape, w, b, *args, "sigmoid", 0.0)
        for r in (arr(4, want_y.shape), arr(5, (1, 1, 1, cout))):
            assert_close(run(x, r), REF.activation(want_y + r, "sigmoid"), rtol=1e-5, atol=1e-6)
        assert_close(run(x, None), want_y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("groups", [1, 2])
def test_a_window_over_the_height_of_a_width_one_input(isa, n_threads, groups):
    """TensorFlow's 1-D convolutions over (L, 1): ``conv2d`` runs them along the width (one
    output row of L columns), grouped or not, with a residual and without: the reference's
    convolution over the height."""
    x, b = arr(0, (2, 300, 1, 48)), arr(2, (64,))
    k = arr(1, (5, 1, 48 // groups, 64), (5 * 48 // groups) ** -0.5)
    args = (x, k, b, (1, 1), ((2, 2), (0, 0)), (1, 1), groups, "gelu_tanh", 0.0)
    want = REF.conv2d(*args)
    r = arr(3, want.shape)
    with threads(n_threads):
        assert_close(CPU.conv2d(*args), want, rtol=1e-5, atol=1e-5)
        run = CPU.conv2d_residual_plan(x.shape, *args[1:], "relu", 0.0)
        assert_close(run(x, r), REF.activation(want + r, "relu"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(
    "x_shape, k_shape, strides, pads, dilation",
    [
        ((1, 70, 70, 64), (3, 3, 64, 16), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # narrow tiles, stride 2
        ((2, 40, 61, 56), (3, 3, 56, 40), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # wide tiles and a tail
        ((1, 50, 80, 72), (5, 5, 72, 8), (1, 2), ((2, 1), (2, 0)), (1, 1)),  # asymmetric, 8 outputs
        ((1, 48, 90, 64), (3, 3, 64, 32), (1, 1), ((2, 2), (2, 2)), (2, 2)),  # dilated both ways
        ((1, 300, 20, 48), (3, 3, 48, 24), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # rows of 20: copied
        ((1, 33, 129, 70), (2, 2, 70, 16), (2, 2), ((0, 1), (0, 1)), (1, 1)),  # padding at the end
        ((1, 64, 66, 64), (7, 7, 64, 20), (2, 2), ((3, 3), (3, 3)), (1, 1)),  # stem-like
    ],
)
def test_implicit_conv2d_reads_large_inputs_in_place(isa, n_threads, x_shape, k_shape, strides, pads, dilation):
    """Inputs above CONV_PAD_COPY_FLOATS: the windows inside the input read it in place, the
    ends of each row (a whole tile each) and the rows along the top and bottom edges a copy of
    their window rows with the padding (inputs above a 1 MiB L2 bring the next output row's
    new input rows into L2 meanwhile); every output against the reference."""
    x, b = arr(0, x_shape), arr(2, k_shape[-1:])
    k = arr(1, k_shape, np.prod(k_shape[:3]) ** -0.5)
    assert np.prod(x_shape) > 1 << 18
    args = (x, k, b, strides, pads, dilation, 1, "relu", 0.0)
    with threads(n_threads):
        got = native_conv(*args, _core.CONV_IMPLICIT)
    assert_close(got, REF.conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("method", ["implicit", "im2col"])
@pytest.mark.parametrize(
    "x_shape, k_shape, strides, pads, dilation",
    [
        ((2, 9, 23, 5), (3, 3, 5, 40), (2, 1), ((1, 0), (2, 1)), (2, 1)),  # tiles and a tail
        ((1, 3, 7, 16), (3, 3, 16, 70), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 3 rows: column blocks
        ((3, 5, 4, 3), (2, 2, 3, 33), (3, 3), ((0, 0), (0, 0)), (1, 1)),  # stride > kernel, wo 1
        ((1, 12, 19, 8), (1, 3, 8, 32), (1, 4), ((0, 0), (1, 0)), (1, 1)),  # 1x3, wo 5
        ((2, 6, 17, 4), (7, 7, 4, 9), (2, 2), ((3, 3), (3, 3)), (1, 1)),  # stem-like
        ((1, 10, 13, 6), (3, 2, 6, 64), (1, 3), ((2, 0), (0, 1)), (3, 1)),  # wo 4
        ((1, 14, 30, 24), (3, 3, 24, 48), (1, 1), ((2, 2), (2, 2)), (2, 2)),  # dilated both ways
        ((2, 28, 28, 64), (3, 3, 64, 96), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # shares over threads
        ((1, 16, 16, 40), (1, 1, 40, 72), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # 1x1 stride 2
        ((1, 16, 16, 40), (1, 1, 40, 72), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # 1x1: x is the matrix
        ((1, 4, 4, 130), (3, 3, 130, 67), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 16 rows, k 1170
        ((3, 5, 5, 96), (3, 3, 96, 40), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # 27 rows, batch 3
        ((3, 9, 9, 3), (7, 7, 3, 20), (2, 2), ((3, 3), (3, 3)), (1, 1)),  # 3-channel stem
        ((1, 5, 61, 3), (3, 3, 3, 16), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # narrow: 28-row tiles
        ((1, 4, 67, 16), (2, 2, 16, 8), (1, 1), ((0, 1), (0, 1)), (1, 1)),  # 8 outputs, 2x2
        ((2, 7, 45, 32), (3, 3, 32, 12), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # 12 outputs, stride 2
        ((1, 3, 40, 9), (1, 3, 9, 5), (1, 1), ((0, 0), (1, 1)), (1, 2)),  # 5 outputs, dilated
        ((1, 6, 50, 64), (1, 1, 64, 16), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # 1x1 to 16 outputs
        # windows over the height of a width-1 input: seen along the width
        ((2, 37, 1, 24), (5, 1, 24, 40), (2, 1), ((2, 1), (0, 0)), (2, 1)),
        ((1, 70, 1, 32), (5, 1, 32, 70), (1, 3), ((0, 0), (0, 0)), (1, 1)),
        ((1, 2, 1, 8), (2, 1, 8, 16), (1, 1), ((0, 1), (0, 0)), (1, 1)),
    ],
)
def test_conv2d_methods_on_threads(isa, n_threads, method, x_shape, k_shape, strides, pads, dilation):
    x, b = arr(0, x_shape), arr(2, k_shape[-1:])
    k = arr(1, k_shape, np.prod(k_shape[:3]) ** -0.5)
    args = (x, k, b, strides, pads, dilation, 1, "relu", 0.0)
    code = _core.CONV_IMPLICIT if method == "implicit" else _core.CONV_IM2COL
    with threads(n_threads):
        got = native_conv(*args, code)
    assert_close(got, REF.conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("cout", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize(
    "x_shape, kernel, strides, pads, dh",
    [
        ((2, 9, 23, 32), (7, 3), (1, 1), ((3, 3), (1, 1)), 1),  # runs of 96: whole vectors
        ((1, 1, 301, 1), (1, 256), (1, 2), ((0, 0), (0, 0)), 1),  # a long 1-D filter at stride 2
        ((1, 1, 2000, 2), (1, 33), (1, 1), ((0, 0), (16, 16)), 1),  # one row: spans of it on threads
        ((1, 6, 40, 33), (3, 3), (1, 1), ((1, 1), (1, 1)), 1),  # runs of 99: a tail of 3
        ((2, 7, 30, 8), (5, 5), (1, 1), ((2, 2), (2, 2)), 1),  # runs of 40
        ((1, 8, 19, 3), (3, 3), (2, 3), ((0, 2), (2, 1)), 2),  # runs of 9, strides, dilated rows
        ((1, 5, 11, 5), (3, 9), (1, 1), ((1, 1), (8, 8)), 1),  # windows leaving x both sides
        ((1, 4, 3, 16), (3, 3), (1, 1), ((4, 4), (1, 1)), 1),  # rows wholly outside x, wo < a pass
        ((3, 4, 5, 24), (1, 1), (1, 1), ((0, 0), (0, 0)), 1),  # 1x1: runs of the channels
        ((1, 1, 1, 40), (1, 1), (1, 1), ((0, 0), (0, 0)), 1),  # one position
        ((1, 37, 1, 12), (5, 1), (2, 1), ((2, 1), (0, 0)), 1),  # over the height of a width-1 input
        ((1, 37, 1, 12), (5, 1), (2, 1), ((2, 1), (0, 0)), 2),  # the same dilated: along the height
        ((1, 300, 5, 4), (257, 3), (1, 1), ((128, 128), (1, 1)), 1),  # a window of 257 rows
    ],
)
def test_conv2d_dot_products_on_threads(isa, n_threads, cout, x_shape, kernel, strides, pads, dh):
    """CONV_DOT (each output a dot product along its window rows): whole runs and tails, edge
    windows read from a padded copy, window rows outside x, columns fewer than a pass, batches,
    against the reference, up to 4 output channels (6 on the avx512 path); and the automatic
    choice takes it where the window rows hold at least half a vector, and 64 floats for 5 or 6
    channels (the same bits)."""
    x, b = arr(0, x_shape), arr(2, (cout,))
    w = arr(1, (*kernel, x_shape[3], cout), (kernel[0] * kernel[1] * x_shape[3]) ** -0.5)
    args = (x, w, b, strides, pads, (dh, 1), 1, "silu", 0.0)
    if cout > (6 if isa == "avx512" else 4):
        with pytest.raises(native.NativeError):
            native_conv(*args, _core.CONV_DOT)
        return
    with threads(n_threads):
        got = native_conv(*args, _core.CONV_DOT)
        auto = native_conv(*args, _core.CONV_AUTO)
    assert_close(got, REF.conv2d(*args), rtol=1e-5, atol=1e-5)
    along = x_shape[2] == 1 and kernel[1] == 1  # a width-1 input: seen along the width
    run = (kernel[0] if along else kernel[1]) * x_shape[3]
    half = {"avx512": 16, "avx2": 8}.get(isa, 4) // 2
    if run >= half and (cout <= 4 or run >= 64) and not (along and dh > 1):
        np.testing.assert_array_equal(auto, got)


def test_conv2d_dot_products_with_a_residual(isa):
    """CONV_DOT with a residual Add and its activation after the epilogue."""
    x, w, b, r = arr(0, (2, 6, 21, 16)), arr(1, (3, 3, 16, 2), 0.1), arr(2, (2,)), arr(3, (2, 6, 21, 2))
    y = np.empty_like(r)
    relu, tanh = native.CODES["relu"], native.CODES["tanh"]
    _core.conv2d(x, _core.conv_pack(w, 1), b, y, 3, 3, 1, 1, 1, 1, 1, 1, 1, relu, 0.0, _core.CONV_DOT, r, tanh)
    want = REF.conv2d(x, w, b, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu", 0.0)
    assert_close(y, np.tanh(want + r), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "w_shape, groups, dw",
    [((3, 3, 4, 7), 1, 1), ((3, 3, 2, 4), 2, 1), ((3, 3, 4, 2), 1, 2)],
    ids=["7 outputs", "2 groups", "width dilation"],
)
def test_conv2d_dot_products_refuse_other_convolutions(w_shape, groups, dw):
    x = arr(0, (1, 8, 8, 4))
    pw = _core.conv_pack(arr(1, w_shape), groups)
    y = np.empty((1, 6, 8 - 2 * dw, w_shape[3]), np.float32)
    with pytest.raises(native.NativeError):
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, dw, 0, 0, groups, 0, 0.0, _core.CONV_DOT)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_grouped_conv_on_threads(isa, n_threads):
    x, k, b = arr(0, (2, 20, 21, 24)), arr(1, (3, 3, 6, 36), 54**-0.5), arr(2, (36,))
    args = (x, k, b, (1, 2), ((1, 1), (0, 2)), (1, 1), 4, "silu", 0.0)
    with threads(n_threads):
        assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("cin, cout", [(1, 1), (3, 16), (3, 17), (4, 32), (2, 7), (3, 40), (5, 16), (3, 64), (2, 103)])
@pytest.mark.parametrize(
    "shape_hw, k, strides, pads, dilation",
    [
        ((37, 53), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # a stem: 27 interior columns
        ((6, 224), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # a MobileNet stem's rows of 112
        ((5, 32), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 32 columns: a widest pass and a tail
        ((3, 60), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 60: passes of 24, 14, 9 or 6, tails
        ((4, 23), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # 23: half passes and passes of 3
        ((3, 47), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),  # a 5x5 stem: 22 of 24 columns interior
        ((4, 19), (3, 3), (3, 3), ((1, 1), (1, 1)), (1, 1)),  # a stride of 3
        ((12, 80), (9, 9), (1, 1), ((8, 8), (8, 8)), (2, 8)),  # a wide dilated window: many border columns
        ((20, 31), (7, 7), (2, 2), ((3, 2), (3, 2)), (1, 1)),
        ((9, 40), (3, 3), (1, 1), ((0, 2), (1, 0)), (1, 2)),  # asymmetric pads, dilated columns
        ((8, 40), (5, 3), (1, 1), ((2, 2), (1, 1)), (2, 1)),
        ((6, 5), (3, 3), (1, 1), ((4, 4), (4, 4)), (1, 1)),  # rows and columns wholly outside x
        ((1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1)),  # one position
        ((11, 70), (1, 1), (1, 3), ((0, 0), (0, 0)), (1, 1)),
        ((4, 30), (3, 33), (1, 1), ((1, 1), (16, 16)), (1, 1)),  # 4-5 channels: 396-495 taps a window
        ((6, 30), (5, 33), (1, 1), ((2, 2), (16, 16)), (1, 1)),  # over 512 taps (4-5 channels): pixels
        ((10, 90), (9, 9), (1, 1), ((8, 8), (64, 64)), (1, 16)),  # edge windows too large to copy
        ((3, 2), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # rows too narrow for a pass
        ((3, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # passes of 6 and 3 that overlap
    ],
)
def test_convolution_from_nchw_planes(isa, n_threads, cin, cout, shape_hw, k, strides, pads, dilation):
    """``conv2d_nchw_plan``: an NCHW input convolved into NHWC, straight from its planes within
    the NCHW_DIRECT_* bounds, through an NHWC copy beyond; and the direct kernel itself on every
    case (1 to 4 channel vectors per pass and blocks of them, each pass width and the tails of
    a row, border and interior columns, window rows outside x): the reference's NHWC
    convolution each way."""
    x = arr(0, (2, cin, *shape_hw))
    w, b = arr(1, (*k, cin, cout), (k[0] * k[1] * cin) ** -0.5), arr(2, (cout,))
    args = (w, b, strides, pads, dilation, 1, "hard_silu", 0.0)
    want = REF.conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *args)
    (pt, _), (pl, _) = pads
    with threads(n_threads):
        got = CPU.conv2d_nchw_plan(x.shape, *args)(x)
        direct = _core.conv2d_nchw_in(
            x, w, b, np.empty_like(want), *strides, *dilation, pt, pl, _core.ACTIVATIONS.index("hard_silu"), 0.0
        )
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_close(direct, want, rtol=1e-5, atol=1e-5)
    assert_close(REF.conv2d_nchw_plan(x.shape, *args)(x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["linear", "relu", "silu"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("cin, cout", [(3, 32), (3, 17), (1, 8)])
def test_convolution_from_nchw_planes_epilogues(isa, activation, with_bias, cin, cout):
    """``conv2d_nchw_in``'s epilogue: the bias and ReLU on a pass's sums in registers (interior
    and edge passes, border pixels), other activations over the row after its passes, no bias
    at all: the reference's values, NaN where the reference has NaN (ReLU included), and a
    linear convolution with a bias exactly the same sums without it plus the bias."""
    x = arr(0, (1, cin, 9, 41))
    x[0, 0, 4, 20] = np.nan  # one input NaN: every output reading it is NaN, ReLU or not
    w, b = arr(1, (5, 5, cin, cout), (25 * cin) ** -0.5), arr(2, (cout,))
    bias = b if with_bias else None
    code = _core.ACTIVATIONS.index(activation)
    want = REF.conv2d(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, bias, (2, 2), ((2, 2), (2, 2)), (1, 1), 1, activation, 0.0
    )
    got = _core.conv2d_nchw_in(x, w, bias, np.full(want.shape, 7.0, np.float32), 2, 2, 1, 1, 2, 2, code, 0.0)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    if activation == "linear" and with_bias:
        bare = _core.conv2d_nchw_in(x, w, None, np.empty_like(want), 2, 2, 1, 1, 2, 2, code, 0.0)
        np.testing.assert_array_equal(got, bare + b)  # the bias added to the same sums


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("cout", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize(
    "cin, shape_hw, k, strides, pads, dilation",
    [
        (8, (7, 40), (3, 9), (1, 1), ((1, 1), (4, 4)), (1, 1)),  # a 3x39-like window, rows of 40
        (5, (6, 16), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # one whole vector a row
        (9, (5, 17), (2, 3), (2, 1), ((0, 1), (2, 0)), (1, 1)),  # a vector and one column, stride 2 down
        (3, (6, 49), (5, 3), (1, 1), ((2, 2), (0, 2)), (2, 3)),  # dilated both ways, asymmetric pads
        (6, (3, 100), (3, 7), (1, 1), ((4, 4), (3, 3)), (1, 1)),  # window rows wholly outside x
        (1, (5, 230), (3, 5), (1, 1), ((1, 1), (2, 2)), (1, 1)),  # 15 vectors: passes of 12, 6, 3, 1
        (33, (3, 31), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1)),  # many input channels
        (64, (13, 100), (3, 3), (1, 1), ((1, 1), (1, 1)), (2, 1)),  # bands of 2 output rows, dilated rows
    ],
)
def test_convolution_of_planes_into_planes(isa, n_threads, cout, cin, shape_hw, k, strides, pads, dilation):
    """``conv2d_planes``: NCHW planes into NCHW planes for up to 8 output channels (blocks of 8,
    4, 2 and 1), passes of whole vectors of output columns and a partial last one, padded
    window rows, strides down and dilations: the reference's NHWC convolution each way; and
    the backend's plan where ``planes_direct`` takes the shape."""
    x = arr(0, (2, cin, *shape_hw))
    w, b = arr(1, (*k, cin, cout), (k[0] * k[1] * cin) ** -0.5), arr(2, (cout,))
    args = (w, b, strides, pads, dilation, 1, "hard_silu", 0.0)
    want = REF.conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), *args).transpose(0, 3, 1, 2)
    (pt, _), (pl, _) = pads
    y = np.full(want.shape, np.nan, np.float32)
    with threads(n_threads):
        got = _core.conv2d_planes(x, w, b, y, *strides, *dilation, pt, pl, _core.ACTIVATIONS.index("hard_silu"), 0.0)
        plan = CPU.conv2d_planes_plan(x.shape, *args)
    assert got is y
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    wo = want.shape[3]
    assert (plan is not None) == conv_ops.planes_direct(cin, cout, *k, strides, wo, 1, 1)
    if plan is not None:
        assert_close(plan(x), want, rtol=1e-5, atol=1e-5)


def test_convolution_of_planes_into_planes_where_it_pays():
    """``planes_direct``: one group, at most 8 output channels, column stride 1, a window larger
    than 1x1, rows of at least 16 columns, not the few-input-channel kernel's shapes; and the
    kernel's own errors."""
    planes = conv_ops.planes_direct
    assert planes(8, 8, 3, 39, (1, 1), 264, 1, 1) and planes(32, 1, 7, 3, (1, 1), 88, 1, 0)
    assert planes(8, 1, 5, 5, (2, 1), 16, 1, 0)
    assert not planes(8, 9, 3, 3, (1, 1), 64, 1, 0) and not planes(8, 8, 3, 3, (1, 2), 64, 1, 0)
    assert not planes(8, 8, 1, 1, (1, 1), 64, 1, 0) and not planes(8, 8, 3, 3, (1, 1), 15, 1, 0)
    assert not planes(8, 8, 3, 3, (1, 1), 64, 2, 0) and not planes(8, 8, 3, 3, (1, 1), 64, 1, None)
    assert not planes(3, 8, 3, 3, (1, 1), 64, 1, 0)  # 3 input channels: conv2d_nchw_in's
    # a graph's output: also conv2d_nchw_in's shapes (a 5x5 stem), not the others'
    assert planes(3, 32, 5, 5, (2, 2), 112, 1, 0, output=True) and planes(3, 8, 3, 3, (1, 1), 64, 1, 0, output=True)
    assert not planes(3, 32, 5, 5, (2, 2), 112, 1, 0) and not planes(8, 9, 3, 3, (1, 1), 64, 1, 0, output=True)
    assert not planes(3, 32, 5, 5, (2, 2), 112, 2, 0, output=True)
    assert not planes(3, 32, 5, 5, (2, 2), 112, 1, None, output=True)
    x, y = arr(0, (1, 4, 5, 20)), np.empty((1, 9, 5, 20), np.float32)
    with pytest.raises(ValueError):
        _core.conv2d_planes(x, arr(1, (3, 3, 5, 9)), None, y, 1, 1, 1, 1, 1, 1, 0, 0.0)
    with pytest.raises(ValueError):
        _core.conv2d_planes(x, arr(1, (3, 3, 4, 8)), None, y, 1, 1, 1, 1, 1, 1, 0, 0.0)
    with pytest.raises(ValueError):
        _core.conv2d_planes(x, arr(1, (3, 3, 4, 9)), None, y, 1, 0, 1, 1, 1, 1, 0, 0.0)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("activation", ["linear", "relu", "hard_silu"])
@pytest.mark.parametrize(
    "cin, cout, shape_hw, k, strides, pads",
    [
        (3, 32, (23, 61), (5, 5), (2, 2), ((2, 2), (2, 2))),  # a 5x5 stem: 31 columns, an edge each side
        (3, 64, (20, 45), (7, 7), (2, 2), ((3, 3), (3, 3))),  # a 7x7 stem: 4 channel vectors
        (3, 16, (9, 70), (3, 3), (1, 1), ((1, 1), (1, 1))),  # 16 channels at stride 1
        (1, 8, (9, 40), (3, 3), (1, 2), ((1, 1), (1, 1))),  # 8 channels at a column stride of 2
        (4, 40, (5, 33), (3, 3), (2, 2), ((1, 1), (0, 0))),  # 40 channels: 3 vectors, the last partial
    ],
)
def test_few_input_channels_into_planes(isa, n_threads, activation, cin, cout, shape_hw, k, strides, pads):
    """``conv2d_planes`` beyond 8 output channels or at a column stride above 1 (at stride 2 on
    AVX-512 its own passes over the even and odd columns' copies, elsewhere
    ``conv2d_nchw_in``'s sums with each output row transposed into the NCHW planes; odd row
    lengths, channel counts not a multiple of the vector, both batches): exactly
    ``conv2d_nchw_in``'s NHWC result transposed (the same sums in the same order); and the
    backend's plan where the result is a graph's output."""
    x = arr(0, (2, cin, *shape_hw))
    w, b = arr(1, (*k, cin, cout), (k[0] * k[1] * cin) ** -0.5), arr(2, (cout,))
    code = _core.ACTIVATIONS.index(activation)
    (pt, _), (pl, _) = pads
    want_nhwc = REF.conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, b, strides, pads, (1, 1), 1, activation)
    with threads(n_threads):
        nhwc = _core.conv2d_nchw_in(x, w, b, np.empty_like(want_nhwc), *strides, 1, 1, pt, pl, code, 0.0)
        y = np.full(want_nhwc.transpose(0, 3, 1, 2).shape, np.nan, np.float32)
        got = _core.conv2d_planes(x, w, b, y, *strides, 1, 1, pt, pl, code, 0.0)
        plan = CPU.conv2d_planes_plan(x.shape, w, b, strides, pads, (1, 1), 1, activation, 0.0, output=True)
    assert got is y
    np.testing.assert_array_equal(got, nhwc.transpose(0, 3, 1, 2))
    assert_close(got, want_nhwc.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    assert plan is not None
    np.testing.assert_array_equal(plan(x), got)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("activation, with_bias", [("relu", True), ("linear", False), ("hard_silu", True)])
@pytest.mark.parametrize(
    "cin, cout, shape_hw, k, strides, pads, dilation",
    [
        (3, 16, (7, 224), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # 112 columns: passes of 3, 2, 2 vectors
        (3, 64, (9, 229), (7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1)),  # 115 columns: 3, 3, 2 and a partial
        (3, 32, (9, 61), (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1)),  # 31 columns: one pass of 2 vectors
        (4, 13, (5, 70), (3, 5), (1, 2), ((1, 1), (2, 2)), (1, 2)),  # 13 channels (8, 4, 1), dilated columns
        (2, 9, (4, 40), (3, 3), (2, 2), ((0, 0), (0, 0)), (1, 1)),  # no padding, x past the last window
        (1, 24, (3, 5), (3, 3), (2, 2), ((1, 1), (4, 4)), (1, 1)),  # columns wholly outside x
        (3, 8, (5, 99), (3, 4), (2, 2), ((1, 1), (1, 0)), (2, 1)),  # asymmetric pads, an even window
        (16, 8, (21, 250), (5, 5), (2, 2), ((2, 2), (2, 2)), (2, 1)),  # bands of 2 output rows, dilated rows
        (12, 40, (23, 130), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1)),  # bands of 8 rows, 40 channels
    ],
)
def test_column_stride_two_into_planes(
    isa, n_threads, activation, with_bias, cin, cout, shape_hw, k, strides, pads, dilation
):
    """``conv2d_planes`` at column stride 2, any number of output channels: every pass width
    and a partial last vector, dilated and even windows, padding on one side, none, or wider
    than x, images in several bands of output rows (``CONV_PLANES_BAND_FLOATS``); the
    reference's convolution within float32 tolerance, and exactly ``conv2d_nchw_in``'s sums
    transposed."""
    x = arr(0, (2, cin, *shape_hw))
    w = arr(1, (*k, cin, cout), (k[0] * k[1] * cin) ** -0.5)
    b = arr(2, (cout,)) if with_bias else None
    code = _core.ACTIVATIONS.index(activation)
    (pt, _), (pl, _) = pads
    want_nhwc = REF.conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, b, strides, pads, dilation, 1, activation)
    with threads(n_threads):
        nhwc = _core.conv2d_nchw_in(x, w, b, np.empty_like(want_nhwc), *strides, *dilation, pt, pl, code, 0.0)
        y = np.full(want_nhwc.transpose(0, 3, 1, 2).shape, np.nan, np.float32)
        got = _core.conv2d_planes(x, w, b, y, *strides, *dilation, pt, pl, code, 0.0)
    assert got is y
    assert_close(got, want_nhwc.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got, nhwc.transpose(0, 3, 1, 2))


def test_convolution_from_nchw_planes_where_it_pays():
    """``nchw_direct``: few input channels into 2 to 64, through windows up to 3x3, or up to
    5x5 into at least 16 channels (a 5x5 stem), or at strides of 2 up to 7x7 from at most 3
    channels into at least 16 (a 7x7 stem); the rest through an NHWC copy and the implicit
    GEMM; the native plan binds the same choice (``nchw_in``)."""
    nchw_direct = conv_ops.nchw_direct
    assert nchw_direct(3, 16, 3, 3) and nchw_direct(3, 64, 3, 3) and nchw_direct(4, 2, 1, 9)
    assert nchw_direct(3, 32, 5, 5) and nchw_direct(1, 16, 5, 5) and nchw_direct(3, 64, 5, 5)
    assert not nchw_direct(3, 8, 5, 5)  # one narrow channel vector through a wide window
    assert not nchw_direct(3, 64, 7, 7) and not nchw_direct(3, 32, 1, 26)
    assert nchw_direct(3, 64, 7, 7, (2, 2)) and nchw_direct(1, 16, 7, 7, (2, 3))  # strided stems
    assert not nchw_direct(4, 64, 7, 7, (2, 2)) and not nchw_direct(3, 8, 7, 7, (2, 2))
    assert not nchw_direct(3, 64, 7, 7, (1, 2)) and not nchw_direct(3, 64, 9, 9, (2, 2))
    assert not nchw_direct(5, 16, 3, 3) and not nchw_direct(3, 65, 3, 3) and not nchw_direct(3, 1, 3, 3)
    x, w = arr(0, (1, 3, 40, 40)), arr(1, (5, 5, 3, 32), 75**-0.5)
    for cout, direct in ((32, True), (8, False)):
        kind, bound = steps.conv2d_step(
            (1, 40, 40, 3), w[..., :cout], None, (2, 2), ((2, 2), (2, 2)), (1, 1), 1, "linear", 0.0, None, True
        )
        assert kind == "conv2d" and bound.get("nchw_in", False) == direct
    w7 = arr(1, (7, 7, 3, 64), 147**-0.5)
    for strides, direct in (((2, 2), True), ((1, 1), False)):
        kind, bound = steps.conv2d_step(
            (1, 40, 40, 3), w7, None, strides, ((3, 3), (3, 3)), (1, 1), 1, "linear", 0.0, None, True
        )
        assert kind == "conv2d" and bound.get("nchw_in", False) == direct
    assert_close(
        CPU.conv2d_nchw_plan(x.shape, w, None, (2, 2), ((2, 2), (2, 2)))(x),
        REF.conv2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, None, (2, 2), ((2, 2), (2, 2))),
        rtol=1e-5,
        atol=1e-5,
    )


def test_convolution_from_nchw_planes_checks_its_arguments():
    x, w, y = arr(0, (1, 3, 8, 8)), arr(1, (3, 3, 3, 16)), np.empty((1, 8, 8, 16), np.float32)
    relu = _core.ACTIVATIONS.index("relu")
    with pytest.raises(ValueError, match="inconsistent shapes"):
        _core.conv2d_nchw_in(x, arr(1, (3, 3, 4, 16)), None, y, 1, 1, 1, 1, 1, 1, relu, 0.0)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        _core.conv2d_nchw_in(x, w, None, y, 0, 1, 1, 1, 1, 1, relu, 0.0)
    with pytest.raises(ValueError, match="bias"):
        _core.conv2d_nchw_in(x, w, arr(2, (15,)), y, 1, 1, 1, 1, 1, 1, relu, 0.0)
    with pytest.raises(ValueError, match="activation"):
        _core.conv2d_nchw_in(x, w, None, y, 1, 1, 1, 1, 1, 1, _core.ACTIVATIONS.index("softmax"), 0.0)
    # softmax over the channels: the NHWC convolution's epilogue
    got = CPU.conv2d_nchw_plan(x.shape, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "softmax")(x)
    want = REF.conv2d(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, None, (1, 1), ((1, 1), (1, 1)), activation="softmax"
    )
    assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("activation", ["linear", "relu", "hard_silu", "gelu"])
@pytest.mark.parametrize(
    "n, cin, cout, shape_hw",
    [
        (1, 64, 256, (14, 14)),  # 196 columns: six panels, the last 4 columns by conv_pw_dot
        (1, 1024, 256, (14, 14)),  # threads on blocks of whole panels, the last with the rest
        (1, 1027, 30, (1, 69)),  # 5 columns past two panels; k not a whole number of vectors
        (2, 20, 7, (3, 34)),  # 6 past three panels, fewer output rows than a block of 4
        (4, 33, 17, (9, 31)),  # 279 columns: two blocks of 128 and 151 (vector tails)
        (1, 64, 256, (56, 56)),  # 98 panels: 13 blocks of 7-8 panels, 14 of 7 on 2 threads
        (2, 5, 1, (1, 64)),  # one output channel, the fewest positions it takes
        (1, 300, 70, (23, 23)),  # k past one sgemm block of b
        (3, 16, 48, (1, 1000)),  # four blocks of 256 columns, the last of 232
        (1, 1024, 40, (8, 8)),  # rows 4 KiB apart: held padded (pointwise_rows)
    ],
)
def test_pointwise_convolution_on_nchw_planes(isa, n_threads, n, cin, cout, shape_hw, activation):
    """``conv1x1_nchw_plan``: a 1x1 convolution from NCHW planes into NCHW planes (per image w @
    x, then the bias and activation per output plane): the reference's NHWC convolution, moved
    back to NCHW."""
    x = arr(0, (n, cin, *shape_hw))
    w_oi, b = arr(1, (cout, cin), cin**-0.5), arr(2, (cout,))
    want = REF.conv2d(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
        np.ascontiguousarray(w_oi.T)[None, None],
        b,
        activation=activation,
    ).transpose(0, 3, 1, 2)
    with threads(n_threads):
        got = CPU.conv1x1_nchw_plan(x.shape, w_oi, b, activation)(x)
        unbiased = CPU.conv1x1_nchw_plan(x.shape, w_oi, None, activation)(x)
    assert got.shape == want.shape and got.flags.c_contiguous
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    rows = conv_ops.pointwise_rows(w_oi)
    assert rows.shape == (cout, cin + 16 if cin % 1024 == 0 else cin) and np.array_equal(rows[:, :cin], w_oi)
    want0 = REF.conv2d(
        np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
        np.ascontiguousarray(w_oi.T)[None, None],
        None,
        activation=activation,
    ).transpose(0, 3, 1, 2)
    assert_close(unbiased, want0, rtol=1e-5, atol=1e-5)


def test_pointwise_convolution_on_nchw_planes_where_it_pays():
    """The planes path takes more input channels than the NHWC-out direct kernel and at least
    POINTWISE_NCHW_MIN_POSITIONS positions, elementwise activations; the reference has none; the
    kernel checks its arguments."""
    w = arr(1, (16, 8))
    assert CPU.conv1x1_nchw_plan((1, 8, 8, 8), w, None) is not None
    assert CPU.conv1x1_nchw_plan((1, 8, 1, 1), w, None) is None  # a squeeze-and-excite vector
    assert CPU.conv1x1_nchw_plan((1, 8, 7, 9), w, None) is None  # 63 positions
    assert CPU.conv1x1_nchw_plan((1, 8, 8, 8), w, None, "softmax") is None
    assert CPU.conv1x1_nchw_plan((1, 4, 8, 8), arr(1, (16, 4)), None) is None  # conv2d_nchw_in's
    assert REF.conv1x1_nchw_plan((1, 8, 8, 8), w, None) is None
    x, y = arr(0, (1, 8, 8, 8)), np.empty((1, 16, 8, 8), np.float32)
    relu = _core.ACTIVATIONS.index("relu")
    with pytest.raises(ValueError, match="conv1x1_nchw"):
        _core.conv1x1_nchw(x, arr(1, (16, 7)), None, y, relu, 0.0)
    with pytest.raises(ValueError, match="conv1x1_nchw"):
        _core.conv1x1_nchw(x, w, None, np.empty((1, 16, 8, 9), np.float32), relu, 0.0)
    with pytest.raises(ValueError, match="bias"):
        _core.conv1x1_nchw(x, w, arr(2, (15,)), y, relu, 0.0)
    with pytest.raises(ValueError, match="activation"):
        _core.conv1x1_nchw(x, w, None, y, _core.ACTIVATIONS.index("softmax"), 0.0)


@examples(40)
@given(c=conv_case(), m=st.integers(1, 3), wide=st.sampled_from([1, 6]))
def test_depthwise_cpu_matches_reference(isa, c, m, wide):
    ch = c["groups"] * c["cin_g"] * wide
    x = arr(c["seed"], (c["n"], c["h"], c["w"], ch))
    w = arr(c["seed"] + 1, (*c["k"], ch, m))
    b = arr(c["seed"] + 2, (ch * m,)) if c["bias"] else None
    args = (x, w, b, c["s"], c["pads"], c["d"], c["act"], 0.1)
    assert_close(CPU.depthwise_conv2d(*args), REF.depthwise_conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("channels", [1, 7, 16, 37])
@pytest.mark.parametrize(
    "strides, pads, dilation",
    [
        ((1, 1), ((1, 1), (1, 1)), (1, 1)),  # the 3x3 path, four outputs per pass
        ((2, 2), ((1, 1), (0, 1)), (1, 1)),
        ((1, 1), ((2, 2), (2, 2)), (2, 2)),
        ((1, 2), ((0, 0), (3, 3)), (1, 3)),
    ],
)
def test_depthwise_3x3_on_threads(isa, n_threads, channels, strides, pads, dilation):
    x, w, b = arr(0, (2, 19, 23, channels)), arr(1, (3, 3, channels, 1)), arr(2, (channels,))
    args = (x, w, b, strides, pads, dilation, "relu6", 0.0)
    with threads(n_threads):
        assert_close(CPU.depthwise_conv2d(*args), REF.depthwise_conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("channels", [1, 16, 37, 64])
@pytest.mark.parametrize(
    "shape_hw, k, strides, pads",
    [
        ((5, 40), (5, 5), (1, 1), ((2, 2), (2, 2))),  # 36 interior columns: 4 passes of 8 and 4 left
        ((3, 29), (5, 5), (1, 1), ((2, 2), (2, 2))),  # most window rows outside x
        ((9, 30), (7, 7), (1, 1), ((3, 3), (3, 3))),
        ((6, 21), (3, 5), (1, 1), ((1, 1), (0, 0))),  # no horizontal padding, 17 interior columns
        ((5, 40), (5, 5), (2, 2), ((2, 2), (2, 2))),
        ((2, 12), (5, 7), (1, 1), ((4, 4), (3, 3))),  # window rows wholly outside x for some outputs
    ],
)
def test_depthwise_wide_windows(isa, n_threads, channels, shape_hw, k, strides, pads):
    """5- and 7-wide windows: the stride-1 passes of 8 (4 on AVX2) outputs sharing their loads,
    their column and channel tails, and the window rows outside x skipped, against the
    reference (on these planes 8 channels or more run in channel blocks; the passes on wider
    planes: ``test_depthwise_blocks.py``)."""
    x, w, b = arr(0, (2, *shape_hw, channels)), arr(1, (*k, channels, 1)), arr(2, (channels,))
    args = (x, w, b, strides, pads, (1, 1), "hard_silu", 0.0)
    with threads(n_threads):
        assert_close(CPU.depthwise_conv2d(*args), REF.depthwise_conv2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, k, pad", [((1, 2, 2, 8), 3, 1), ((1, 1, 1, 9), 3, 1), ((2, 3, 2, 5), 5, 2), ((1, 4, 3, 16), 5, 2)]
)
def test_depthwise_narrower_than_its_window(isa, shape, k, pad):
    """No output column has its whole window inside x."""
    x, w = arr(0, shape), arr(1, (k, k, shape[-1], 1))
    args = (x, w, None, (1, 1), ((pad, pad), (pad, pad)), (1, 1), "relu", 0.0)
    assert_close(CPU.depthwise_conv2d(*args), REF.depthwise_conv2d(*args), rtol=1e-5, atol=1e-5)


@examples(40)
@given(c=conv_case(), extra_h=st.integers(0, 2), extra_w=st.integers(0, 2), wide=st.sampled_from([1, 5]))
def test_conv_transpose2d_cpu_matches_reference(isa, c, extra_h, extra_w, wide):
    cin, cout_g = c["groups"] * c["cin_g"] * wide, c["cout_g"] * wide
    x = arr(c["seed"], (c["n"], c["h"], c["w"], cin))
    w = arr(c["seed"] + 1, (*c["k"], cin, cout_g), (c["k"][0] * c["k"][1] * cin) ** -0.5)
    b = arr(c["seed"] + 2, (c["groups"] * cout_g,)) if c["bias"] else None
    (kh, kw), (sh, sw), (dh, dw) = c["k"], c["s"], c["d"]
    crop = (c["pads"][0][0], c["pads"][1][0])
    out = (
        (c["h"] - 1) * sh + dh * (kh - 1) + 1 - crop[0] + extra_h,
        (c["w"] - 1) * sw + dw * (kw - 1) + 1 - crop[1] + extra_w,
    )
    if min(out) <= 0:
        return
    args = (x, w, b, c["s"], crop, out, c["d"], c["groups"], c["act"], 0.1)
    assert_close(CPU.conv_transpose2d(*args), REF.conv_transpose2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(
    "shape, k, cout, act, extra",
    [
        ((1, 5, 7, 16), (2, 2), 1, "sigmoid", (0, 0)),
        ((2, 3, 4, 3), (2, 3), 5, "relu", (0, 0)),
        ((1, 4, 9, 8), (3, 3), 16, "linear", (0, 0)),
        ((1, 1, 1, 2), (2, 2), 17, "gelu", (0, 0)),
        ((1, 3, 5, 4), (2, 2), 3, "relu", (1, 0)),
        ((1, 6, 6, 8), (1, 1), 9, "linear", (0, 0)),
    ],
)
def test_conv_transpose2d_kernel_equal_to_stride(isa, n_threads, shape, k, cout, act, extra):
    """Kernel = stride, no crop, one group: every output pixel has one tap, copied in place
    (an output_padding row or column keeps the general path)."""
    x, w, b = arr(3, shape), arr(4, (*k, shape[-1], cout), 0.3), arr(5, (cout,))
    out = (shape[1] * k[0] + extra[0], shape[2] * k[1] + extra[1])
    for bias in (b, None):
        args = (x, w, bias, k, (0, 0), out, (1, 1), 1, act, 0.0)
        with threads(n_threads):
            assert_close(CPU.conv_transpose2d(*args), REF.conv_transpose2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(
    "shape, k, s, crop, d, out_extra",
    [
        ((2, 9, 11, 16), (2, 2), (2, 2), (0, 0), (1, 1), (0, 0)),  # a detector's last layer
        ((1, 7, 6, 5), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0)),
        ((1, 5, 8, 24), (4, 3), (2, 3), (1, 0), (1, 2), (1, 2)),  # crop, dilation, output padding
    ],
)
def test_conv_transpose2d_one_output_channel(isa, n_threads, shape, k, s, crop, d, out_extra):
    """One output channel (the NCHW kernel on x moved to NCHW) against the reference, with bias
    and an activation."""
    x, w, b = arr(3, shape), arr(4, (*k, shape[3], 1), 0.3), arr(5, (1,))
    out = tuple((shape[1 + a] - 1) * s[a] - 2 * crop[a] + d[a] * (k[a] - 1) + 1 + out_extra[a] for a in range(2))
    for bias, act in ((b, "sigmoid"), (None, "linear")):
        args = (x, w, bias, s, crop, out, d, 1, act, 0.0)
        with threads(n_threads):
            got = CPU.conv_transpose2d(*args)
        assert got.shape == (shape[0], *out, 1)
        assert_close(got, REF.conv_transpose2d(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_conv_transpose2d_on_threads(isa, n_threads):
    x, w, b = arr(0, (2, 14, 15, 32)), arr(1, (4, 4, 32, 24), 0.1), arr(2, (48,))
    args = (x, w, b, (2, 2), (1, 1), (28, 30), (1, 1), 2, "relu", 0.0)
    with threads(n_threads):
        assert_close(CPU.conv_transpose2d(*args), REF.conv_transpose2d(*args), rtol=1e-5, atol=1e-5)


@examples(60)
@given(
    c=conv_case(),
    kind=st.sampled_from(["max", "avg"]),
    count_include_pad=st.booleans(),
    ceil_extra=st.integers(0, 1),
    wide=st.sampled_from([1, 5]),
)
def test_pool2d_cpu_matches_reference(isa, c, kind, count_include_pad, ceil_extra, wide):
    x = arr(c["seed"], (c["n"], c["h"], c["w"], c["cin_g"] * wide))
    (kh, kw), (sh, sw) = c["k"], c["s"]
    pads = tuple((min(p[0], k // 2), min(p[1], k // 2)) for p, k in zip(c["pads"], c["k"]))
    d = c["d"] if kind == "max" else (1, 1)
    ho = window_out(c["h"], kh, sh, d[0], pads[0])
    wo = window_out(c["w"], kw, sw, d[1], pads[1])
    if min(ho, wo) <= 0:
        return
    # ceil mode: one more window while it starts inside the input or the leading padding
    if ceil_extra and ho * sh < c["h"] + pads[0][0]:
        ho += 1
    args = (x, kind, c["k"], c["s"], pads, (ho, wo), d, count_include_pad)
    assert_close(CPU.pool2d(*args), REF.pool2d(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "shape, k, s, d, pads",
    [
        ((1, 9, 20, 16), (2, 2), (1, 1), (1, 1), ((0, 1), (0, 1))),  # SAME_UPPER 2x2: the bottom/right pad
        ((2, 7, 11, 5), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
        ((1, 6, 13, 17), (3, 3), (2, 2), (2, 2), ((2, 2), (2, 2))),  # dilated, strided
        ((1, 4, 3, 8), (3, 5), (1, 1), (1, 1), ((1, 1), (2, 2))),  # windows wider than x: no interior
    ],
)
@pytest.mark.parametrize("kind, cip", [("max", False), ("avg", False), ("avg", True)])
def test_pool2d_interior_and_edge_columns_with_nan(isa, shape, k, s, d, pads, kind, cip):
    """The columns whose windows lie inside x (run without clipping) and the edge ones, NaN
    included: a max over a window holding it is NaN."""
    x = arr(7, shape)
    x[0, 2, 2, 1] = np.nan
    if kind == "avg":
        d = (1, 1)
    ho = window_out(shape[1], k[0], s[0], d[0], pads[0])
    wo = window_out(shape[2], k[1], s[1], d[1], pads[1])
    args = (x, kind, k, s, pads, (ho, wo), d, cip)
    got, want = CPU.pool2d(*args), REF.pool2d(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    assert_close(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_pools_split_over_threads_match_reference(isa, n_threads):
    x = arr(0, (2, 41, 39, 21))
    pads = ((1, 1), (0, 2))
    with threads(n_threads):
        for kind in ("max", "avg"):
            assert_close(
                CPU.pool2d(x, kind, (3, 3), (2, 1), pads, (21, 39), (1, 1), True),
                REF.pool2d(x, kind, (3, 3), (2, 1), pads, (21, 39), (1, 1), True),
            )
        assert_close(CPU.adaptive_pool2d(x, "avg", (5, 6)), REF.adaptive_pool2d(x, "avg", (5, 6)))
        assert_close(CPU.upsample2d(x, (80, 77), "bilinear"), REF.upsample2d(x, (80, 77), "bilinear"))
        assert_close(CPU.local_response_norm(x, 5), REF.local_response_norm(x, 5), rtol=2e-5)


WINOGRAD_CASES = [  # (n, h, w, c_in, c_out, pads): odd outputs, one-sided / no padding, batch > 1
    (1, 5, 7, 3, 4, ((1, 1), (1, 1))),
    (2, 6, 5, 8, 3, ((0, 1), (1, 0))),
    (1, 1, 1, 2, 2, ((1, 1), (1, 1))),
    (3, 4, 4, 5, 6, ((0, 0), (0, 0))),
    (2, 9, 3, 17, 9, ((2, 0), (0, 2))),
    (1, 12, 11, 16, 20, ((1, 1), (1, 1))),
    (2, 30, 30, 16, 16, ((1, 1), (1, 1))),  # two blocks of tiles
    (1, 64, 64, 16, 16, ((1, 1), (1, 1))),  # four blocks: shared by blocks
    (1, 16, 16, 48, 48, ((1, 1), (1, 1))),  # one block (F(2x2)): shared by smaller blocks
    (1, 12, 12, 96, 96, ((1, 1), (1, 1))),  # few tiles: the three steps shared in turn
    (1, 95, 93, 16, 16, ((1, 1), (1, 1))),  # F(4x4) too shared by blocks, odd tile tails
]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("case", WINOGRAD_CASES)
def test_winograd_conv_matches_reference(isa, case, n_threads, tile):
    n, h, w, cin, cout, pads = case
    x, k, b = arr(n, (n, h, w, cin)), arr(h, (3, 3, cin, cout), (9 * cin) ** -0.5), arr(w, (cout,))
    ho, wo = h + sum(pads[0]) - 2, w + sum(pads[1]) - 2
    pu = _core.winograd_pack(k, tile)
    for bias, act in ((b, "relu"), (None, "linear"), (b, "tanh")):
        y = np.empty((n, ho, wo, cout), np.float32)
        with threads(n_threads):
            _core.conv3x3_winograd(x, pu, bias, y, pads[0][0], pads[1][0], native.CODES[act], 0.0, tile)
        assert_close(y, REF.conv2d(x, k, bias, (1, 1), pads, (1, 1), 1, act), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c", [64, 128])
def test_winograd_4x4_error_on_resnet_channels(isa, c):
    """F(4x4, 3x3) against the float64 convolution at ResNet widths: within 1e-5 of the output's
    largest magnitude (F(2x2) within 1e-6)."""
    x, k = arr(c, (2, 9, 10, c)), arr(1, (3, 3, c, c), (9 * c) ** -0.5)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(xp[:, i : i + 9, j : j + 10] @ k[i, j].astype(np.float64) for i in range(3) for j in range(3))
    for tile, bound in ((2, 1e-6), (4, 1e-5)):
        y = np.empty(ref.shape, np.float32)
        _core.conv3x3_winograd(x, _core.winograd_pack(k, tile), None, y, 1, 1, 0, 0.0, tile)
        assert np.abs(y - ref).max() <= bound * np.abs(ref).max()


def test_winograd_tile_must_be_2_or_4():
    k = arr(0, (3, 3, 4, 4))
    with pytest.raises(ValueError, match="tile must be 2 or 4"):
        _core.winograd_pack(k, 3)
    with pytest.raises(ValueError, match="tile must be 2 or 4"):
        _core.conv3x3_winograd(
            arr(1, (1, 6, 6, 4)), _core.winograd_pack(k, 4), None, np.empty((1, 4, 4, 4), np.float32), 0, 0, 0, 0.0, 8
        )


def test_winograd_is_chosen_for_large_3x3_convolutions(monkeypatch):
    calls = []
    real = _core.conv3x3_winograd
    monkeypatch.setattr(conv_ops._core, "conv3x3_winograd", lambda *a: calls.append(a) or real(*a), raising=False)
    x, k = arr(0, (1, 16, 16, 16)), arr(1, (3, 3, 16, 16))
    y = CPU.conv2d(x, k, None, (1, 1), ((1, 1), (1, 1)))
    assert calls and calls[0][-1] == 4  # 16x16 planes: F(4x4, 3x3)
    assert_close_to_scale(y, REF.conv2d(x, k, None, (1, 1), ((1, 1), (1, 1))))
    calls.clear()
    CPU.conv2d(x, k, None, (2, 2), ((1, 1), (1, 1)))  # stride 2: conv2d
    assert not calls


@pytest.mark.parametrize(
    "n,hw,cin,cout,tile,tile_avx512",
    [
        (1, 56, 64, 64, 4, 4),
        (1, 28, 128, 128, 4, 4),
        (8, 28, 16, 32, 4, 4),
        (1, 14, 64, 64, 2, 4),  # 4x4 tiles padded 14 -> 16: F(2x2), but F(4x4) on the avx512 path
        (8, 10, 32, 32, 2, 2),  # padded 10 -> 12: F(2x2) on every path
        (1, 28, 128, 256, 2, 2),  # more than 128 channels: F(2x2), for its precision
        (1, 7, 512, 512, 0, 0),
        (1, 56, 8, 64, 0, 0),
        (1, 2, 32, 32, 0, 0),
    ],
)
def test_winograd_tile_rule(isa, n, hw, cin, cout, tile, tile_avx512):
    """The tile follows the ISA path the kernels run now."""
    assert conv_ops._winograd_tile(n, hw, hw, cin, cout) == (tile_avx512 if isa == "avx512" else tile)


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_nan_and_inf_stay_in_their_tiles(isa, tile):
    """A NaN or an inf input makes NaN every output whose tile's input patch holds it (the
    transforms add and subtract across the patch): a superset of the exact convolution's
    non-finite outputs, confined to those tiles; every other output is unchanged."""
    x, k = arr(0, (1, 16, 16, 16)), arr(1, (3, 3, 16, 16), 1 / 12)
    clean = np.empty((1, 16, 16, 16), np.float32)
    pu = _core.winograd_pack(k, tile)
    _core.conv3x3_winograd(x, pu, None, clean, 1, 1, 0, 0.0, tile)
    for bad in (np.nan, np.inf):
        for ih, iw in ((5, 6), (0, 0), (15, 9)):
            xb = x.copy()
            xb[0, ih, iw, 3] = bad
            y = np.empty_like(clean)
            _core.conv3x3_winograd(xb, pu, None, y, 1, 1, 0, 0.0, tile)
            exact = REF.conv2d(xb, k, None, (1, 1), ((1, 1), (1, 1)))
            hit = ~np.isfinite(y)
            assert hit[~np.isfinite(exact)].all()
            # tiles whose (tile + 2)-wide patch, in padded coordinates, holds (ih + 1, iw + 1)
            rows = [t for t in range(0, 16, tile) if t <= ih + 1 < t + tile + 2]
            cols = [t for t in range(0, 16, tile) if t <= iw + 1 < t + tile + 2]
            inside = np.zeros((16, 16), bool)
            for r in rows:
                for c in cols:
                    inside[r : r + tile, c : c + tile] = True
            assert not hit[0][~inside].any()
            np.testing.assert_array_equal(y[0][~inside], clean[0][~inside])


@pytest.mark.parametrize("activation", ["softmax", "log_softmax", "selu"])
def test_activations_outside_the_epilogue(activation):
    """Softmax over the channels runs after the kernel; an activation without a native code
    through the reference."""
    x, k, b = arr(0, (1, 9, 9, 16)), arr(1, (3, 3, 16, 20)), arr(2, (20,))
    for strides in ((1, 1), (2, 2)):  # Winograd and conv2d
        args = (x, k, b, strides, ((1, 1), (1, 1)), (1, 1), 1, activation)
        assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)
    dw = arr(3, (3, 3, 16, 1))
    assert_close(
        CPU.depthwise_conv2d(x, dw, None, activation=activation),
        REF.depthwise_conv2d(x, dw, None, activation=activation),
        rtol=1e-5,
        atol=1e-5,
    )


def test_strided_and_fortran_ordered_operands():
    x = arr(0, (2, 12, 22, 10))[:, :, ::2]
    k = np.asfortranarray(arr(1, (3, 3, 10, 12)))
    args = (x, k, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu")
    assert_close(CPU.conv2d(*args), REF.conv2d(*args), rtol=1e-5, atol=1e-5)
    assert_close(
        CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (11, 10)),
        REF.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (11, 10)),
    )


def test_pad_nhwc_matches_numpy(isa):
    x = arr(0, (2, 5, 7, 9))
    y = _core.pad_nhwc(x, 2, 1, np.full((2, 9, 11, 9), np.nan, np.float32))
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (2, 2), (1, 3), (0, 0))))
    cut = _core.pad_nhwc(x, 1, 3, np.empty((2, 4, 8, 9), np.float32))  # cut to y
    np.testing.assert_array_equal(cut, np.pad(x, ((0, 0), (1, 0), (3, 0), (0, 0)))[:, :4, :8])


def test_kernels_reject_bad_arguments():
    x, y = arr(0, (1, 5, 5, 4)), np.empty((1, 3, 3, 8), np.float32)
    pw = _core.conv_pack(arr(1, (3, 3, 2, 8)), 2)
    with pytest.raises(ValueError):  # softmax is not an epilogue
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 2, native.CODES["softmax"], 0.0)
    with pytest.raises(ValueError):  # a float64 input
        _core.conv2d(x.astype(np.float64), pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 2, 0, 0.0)
    with pytest.raises(ValueError):  # packed weights too small
        _core.conv2d(x, pw[:10], None, y, 3, 3, 1, 1, 1, 1, 0, 0, 2, 0, 0.0)
    with pytest.raises(native.NativeError):  # the implicit GEMM: one group
        _core.conv2d(x, pw, None, y, 3, 3, 1, 1, 1, 1, 0, 0, 2, 0, 0.0, _core.CONV_IMPLICIT)
    with pytest.raises(IndexError):  # a region of a missing image
        CPU.roi_pool(x, np.array([[3, 0, 0, 2, 2]], np.float32), (2, 2))
    rows = np.array([0, 5], np.int64)  # row 5 of 5
    with pytest.raises(IndexError):
        _core.resize(x, rows, rows, None, rows * 0, rows * 0, None, False, np.empty((1, 2, 2, 4), np.float32))


def test_no_input_channels_give_the_bias(isa):
    x, w, b = np.zeros((1, 4, 5, 0), np.float32), np.zeros((3, 3, 0, 6), np.float32), arr(0, (6,))
    y = np.empty((1, 2, 3, 6), np.float32)
    _core.conv2d(x, _core.conv_pack(w, 1), b, y, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1, 0.0)
    np.testing.assert_array_equal(y, np.broadcast_to(np.maximum(b, 0), y.shape))


HELD_CASES = [
    # (x NHWC, window, C_out, strides, pads): Winograd F(4x4) and F(2x2), implicit GEMM with
    # vector tails, strided, a 1x1 window, batch and width 1
    ((2, 16, 16, 16), (3, 3), 16, (1, 1), ((1, 1), (1, 1))),
    ((1, 14, 14, 24), (3, 3), 40, (1, 1), ((1, 1), (1, 1))),
    ((1, 9, 11, 5), (3, 3), 7, (2, 2), ((1, 0), (1, 2))),
    ((3, 6, 5, 33), (1, 1), 17, (1, 1), ((0, 0), (0, 0))),
    ((1, 1, 7, 9), (1, 5), 3, (1, 1), ((0, 0), (2, 2))),
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("case", HELD_CASES)
def test_held_conv_weights_unpack_and_convolve_as_the_array(isa, n_threads, case):
    """``conv_weights``: one group of more than a few input channels is held only in its packed
    form; ``np.asarray`` gives the same bits back, and every plan of the backend (plain, with a
    residual Add, from NCHW planes, the native plan's step) gives on it the bits it gives on the
    array, Winograd's NaN fallback included; the reference and the other backends read it
    through ``np.asarray``."""
    x_shape, (kh, kw), cout, strides, pads = case
    cin = x_shape[-1]
    w = arr(cin, (kh, kw, cin, cout), (kh * kw * cin) ** -0.5)
    b = arr(cout, (cout,))
    held = CPU.conv_weights(w)
    assert type(held) is conv_ops.PackedConvWeights
    assert held.shape == w.shape and held.ndim == 4 and held.dtype == np.float32 and held.size == w.size
    assert np.array_equal(np.asarray(held), w) and np.asarray(held).flags.c_contiguous
    assert REF.conv_weights(w) is w
    x = arr(1, x_shape)
    r = arr(2, (*x_shape[:1], *window_out_2d(x_shape[1:3], (kh, kw), strides, (1, 1), pads), cout))
    with threads(n_threads):
        for act in ("linear", "relu", "softmax"):
            args = (b, strides, pads, (1, 1), 1, act, 0.1)
            want = CPU.conv2d_plan(x.shape, w, *args)(x)
            assert np.array_equal(CPU.conv2d_plan(x.shape, held, *args)(x), want), act
            assert np.array_equal(CPU.conv2d(x, held, *args), want), act
            plain = CPU.conv2d_residual_plan(x.shape, w, *args, "relu")(x, r)
            assert np.array_equal(CPU.conv2d_residual_plan(x.shape, held, *args, "relu")(x, r), plain), act
            x_nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
            from_planes = CPU.conv2d_nchw_plan(x_nchw.shape, w, *args)(x_nchw)
            assert np.array_equal(CPU.conv2d_nchw_plan(x_nchw.shape, held, *args)(x_nchw), from_planes), act
        bad = x.copy()
        bad[0, 0, 0, 0] = np.nan  # Winograd's transforms fail: the exact sums on the packed form
        args = (b, strides, pads, (1, 1), 1, "linear", 0.0)
        want = CPU.conv2d(bad, w, *args)
        assert np.array_equal(CPU.conv2d(bad, held, *args), want, equal_nan=True)
    kind, bound = steps.conv2d_step(x.shape, held, b, strides, pads, (1, 1), 1, "linear", 0.0, None)
    assert kind == "conv2d" and (bound["pw"] is held.packed or bound.get("tile"))
    assert_close(REF.conv2d(x, held, *args), REF.conv2d(x, w, *args))


def test_conv_weights_kept_as_they_are_where_nothing_packs_them():
    """Several groups, a depthwise weight, few input channels (the direct NCHW kernel reads
    them raw), another dtype: the array itself."""
    for w, groups in (
        (arr(0, (3, 3, 4, 8)), 2),
        (arr(0, (3, 3, 1, 8)), 8),
        (arr(0, (3, 3, 3, 16)), 1),
        (arr(0, (3, 3, 8, 8)).astype(np.float64), 1),
        (arr(0, (3, 3, 0, 8)), 1),
    ):
        assert CPU.conv_weights(w, groups) is w


def test_replaced_weights_reach_the_winograd_path():
    layer = L.Conv2D(16, 3, padding="same")
    x = arr(0, (1, 16, 16, 16))
    y0 = layer(x)
    new = [arr(3, layer.kernel.shape), arr(4, layer.bias.shape)]
    layer.set_weights(new)
    with fastlayers.use_ops("reference"):
        expected = layer(x)
    assert not np.allclose(y0, expected)
    assert_close_to_scale(layer(x), expected)


def test_outputs_do_not_alias_the_workspace():
    x, w = arr(0, (1, 6, 6, 3)), arr(1, (3, 3, 3, 4))
    first = CPU.conv2d(x, w, None, pads=((1, 1), (1, 1)))
    kept = first.copy()
    CPU.conv2d(arr(5, (1, 6, 6, 3)), w, None, pads=((1, 1), (1, 1)))
    np.testing.assert_array_equal(first, kept)


def test_nan_propagates_through_conv_and_pool(isa):
    x = arr(0, (1, 5, 5, 2))
    x[0, 2, 2, 0] = np.nan
    y = CPU.conv2d(x, arr(1, (3, 3, 2, 2)), None, pads=((1, 1), (1, 1)))
    assert np.isnan(y[0, 1:4, 1:4]).all() and not np.isnan(y[0, 0, 0]).any()
    p = CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (4, 4))
    assert np.isnan(p[0, 1:3, 1:3, 0]).all() and not np.isnan(p[..., 1]).any()
    d = CPU.depthwise_conv2d(x, arr(2, (3, 3, 2, 1)), None, pads=((1, 1), (1, 1)))
    assert np.isnan(d[0, 1:4, 1:4, 0]).all() and not np.isnan(d[..., 1]).any()


@pytest.mark.parametrize("stride", [1, 2])
def test_max_pool_3x3_nan_at_every_tap_wins(isa, stride):
    """A NaN at any of the nine taps, in any channel (whole vectors and the tail), next to
    +-inf, gives NaN exactly where the reference does."""
    c = 19
    for tap in range(9):
        x = arr(tap, (1, 7, 7, c))
        x[0, 2 + tap // 3, 2 + tap % 3, tap] = np.nan
        x[0, 3, 3, c - 1] = np.nan
        x[0, 2, 3, 4], x[0, 4, 2, 4] = np.inf, -np.inf
        args = ("max", (3, 3), (stride, stride), ((1, 1), (1, 1)), (window_out(7, 3, stride, 1, (1, 1)),) * 2)
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
def test_conv_model_8_threads_x_200_calls_equal_serial(ops):
    n_threads, calls = 8, 200
    model = conv_model()
    rng = np.random.default_rng(3)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])
    # varied batch sizes so workspaces of different shapes interleave
    inputs = [rng.standard_normal((1 + i % 3, 10, 10, 3)).astype(np.float32) for i in range(n_threads * calls)]
    with threads(2), fastlayers.use_ops(ops):
        serial = [model(x) for x in inputs]

    def worker(t):
        with fastlayers.use_ops(ops):
            return [model(inputs[t * calls + i]) for i in range(calls)]

    with threads(2), ThreadPoolExecutor(n_threads) as pool:
        results = [y for chunk in pool.map(worker, range(n_threads)) for y in chunk]
    assert all(np.all(np.isfinite(y)) for y in serial)
    for got, want in zip(results, serial):
        np.testing.assert_array_equal(got, want)


@examples(40)
@given(
    n=st.integers(1, 3),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    c=st.integers(1, 19),
    oh=st.integers(1, 6),
    ow=st.integers(1, 6),
    kind=st.sampled_from(["max", "avg"]),
    seed=st.integers(0, 2**16),
)
def test_adaptive_pool_cpu_matches_reference(isa, n, h, w, c, oh, ow, kind, seed):
    x = arr(seed, (n, h, w, c))
    assert_close(CPU.adaptive_pool2d(x, kind, (oh, ow)), REF.adaptive_pool2d(x, kind, (oh, ow)), rtol=1e-5, atol=1e-6)


@examples(40)
@given(
    k=st.integers(1, 6),
    ph=st.integers(1, 4),
    pw=st.integers(1, 4),
    scale=st.sampled_from([1.0, 0.5, 0.25]),
    c=st.sampled_from([3, 17]),
    seed=st.integers(0, 2**16),
)
def test_roi_pool_cpu_matches_reference(isa, k, ph, pw, scale, c, seed):
    rng = np.random.default_rng(seed)
    x = arr(seed, (2, 7, 9, c))
    corners = rng.uniform(-5, 40, (k, 4)).astype(np.float32)
    rois = np.concatenate([rng.integers(0, 2, (k, 1)).astype(np.float32), corners], axis=1)
    np.testing.assert_array_equal(CPU.roi_pool(x, rois, (ph, pw), scale), REF.roi_pool(x, rois, (ph, pw), scale))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_split_kernels_work_in_a_forked_child():
    import multiprocessing

    x = arr(0, (2, 40, 40, 16))
    with threads(2):
        parent = _child_pool(x)  # starts the pool
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            child = pool.apply_async(_child_pool, (x,)).get(timeout=60)
    np.testing.assert_array_equal(child, parent)


def _child_pool(x):
    native.set_num_threads(2)
    return CPU.pool2d(x, "max", (2, 2), (1, 1), ((0, 0), (0, 0)), (39, 39))


@examples(40)
@given(
    n=st.integers(1, 2),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    c=st.integers(1, 19),
    oh=st.integers(1, 13),
    ow=st.integers(1, 13),
    mode=st.sampled_from(["nearest", "bilinear"]),
    align=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_upsample_cpu_matches_reference(isa, n, h, w, c, oh, ow, mode, align, seed):
    x = arr(seed, (n, h, w, c))
    align = align and mode == "bilinear"
    assert_close(
        CPU.upsample2d(x, (oh, ow), mode, align), REF.upsample2d(x, (oh, ow), mode, align), rtol=1e-5, atol=1e-6
    )


@examples(40)
@given(
    c=st.integers(1, 21),
    size=st.integers(1, 7),
    alpha=st.sampled_from([1e-4, 0.1, 2.0]),
    beta=st.sampled_from([0.5, 0.75, 1.0, 0.6]),
    k=st.sampled_from([1.0, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_lrn_cpu_matches_reference(isa, c, size, alpha, beta, k, seed):
    x = arr(seed, (2, 3, c), scale=3.0)
    assert_close(
        CPU.local_response_norm(x, size, alpha, beta, k),
        REF.local_response_norm(x, size, alpha, beta, k),
        rtol=2e-5,
        atol=1e-6,
    )


def test_lrn_and_resize_propagate_nan():
    x = arr(0, (1, 2, 2, 5))
    x[0, 0, 0, 2] = np.nan
    y = CPU.local_response_norm(x, 3)
    assert np.isnan(y[0, 0, 0, 1:4]).all() and not np.isnan(y[0, 0, 0, [0, 4]]).any()
    assert np.isnan(CPU.upsample2d(x, (4, 4), "bilinear")[0, :2, :2, 2]).all()


@pytest.mark.parametrize(
    "x_shape, pads",
    [
        ((0, 5, 5, 2), ((1, 1), (1, 1))),  # no images
        ((1, 2, 2, 2), ((0, 0), (0, 0))),
    ],
)  # no output rows
def test_conv2d_outside_the_kernels_terms_runs_the_reference(x_shape, pads, rng):
    """Shapes the native kernel does not take run the reference, directly and through a plan."""
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((3, 3, 2, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    want = REF.conv2d(x, w, b, (1, 1), pads)
    np.testing.assert_array_equal(CPU.conv2d(x, w, b, (1, 1), pads), want)
    np.testing.assert_array_equal(CPU.conv2d_plan(x.shape, w, b, (1, 1), pads)(x), want)
