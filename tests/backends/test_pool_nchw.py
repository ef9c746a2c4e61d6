"""The NCHW pooling and depthwise convolution kernels (``pool2d_nchw`` in native/pool.c,
``depthwise_conv2d_nchw`` in native/conv_depthwise.c) through the CPU backend's primitives, against
ReferenceOps on every ISA path: odd planes, widths around the vector width, 1x1 planes, batch 1,
strides 1-3, pads, ceil-mode outputs, dilations, windows over 64 taps, NaN, the activation
epilogue and a channel multiplier; at stride 1 with outputs as wide as the input and rows of at
most 32 columns, whole planes as flat arrays (rows fewer than the input's, taps reaching beyond
the row, planes over the bound); 2x2 windows at stride 2 inside the plane and 3x3 max windows
at stride 2 with at most one row and column of padding before, each in one pass (odd sizes,
ceil mode, one window, NaN in a window), and the others of those sizes on the buffered
path; small planes of many channels in blocks of a vector of channels."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps
from fastlayers.native import _core

from ..conftest import assert_close

pytestmark = pytest.mark.usefixtures("isa")

REF, CPU = ReferenceOps(), CpuOps()


def _out(size, k, s, d, a, z, ceil):
    """Output size of a window (ONNX's rule: a ceil-mode window may not start in the end pad)."""
    span = size + a + z - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    return out - 1 if ceil and (out - 1) * s >= size + a else out


# (N, C, H, W), window, strides, dilations, ((top, bottom), (left, right)), ceil mode
CASES = [
    ((1, 3, 9, 13), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),
    ((2, 2, 17, 37), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), True),
    ((1, 4, 8, 8), (3, 3), (2, 2), (1, 1), ((0, 0), (0, 0)), True),
    ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), False),
    ((1, 2, 1, 1), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),
    ((1, 5, 11, 30), (2, 5), (3, 2), (2, 1), ((0, 1), (2, 2)), True),
    ((3, 2, 7, 33), (1, 4), (1, 3), (1, 2), ((0, 0), (1, 3)), False),
    ((1, 2, 9, 75), (3, 3), (2, 1), (2, 1), ((2, 1), (1, 1)), True),  # rows of 4 vectors + a tail
    ((2, 3, 28, 28), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # a vector and a 12-lane tail
    ((1, 2, 6, 40), (5, 5), (1, 1), (1, 2), ((2, 2), (4, 4)), False),  # dilated taps along a row
    ((1, 2, 12, 21), (8, 8), (1, 1), (1, 1), ((3, 4), (3, 4)), True),  # 64 taps: still separable
    ((1, 2, 13, 70), (3, 2), (1, 3), (1, 1), ((1, 1), (0, 1)), True),  # column step 3, 5 vectors a row
    ((1, 3, 10, 17), (5, 3), (1, 1), (1, 1), ((0, 1), (1, 1)), False),  # flat planes: fewer rows out
    ((2, 2, 5, 3), (3, 5), (1, 1), (2, 9), ((2, 2), (18, 18)), False),  # taps reaching 18 columns out
    ((1, 2, 600, 30), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # a plane over the flat bound
    ((2, 3, 8, 32), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False),  # 2x2/2 inside: 16 columns out
    ((1, 2, 9, 75), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False),  # odd sizes: last row, column unread
    ((1, 3, 2, 2), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False),  # one window
    ((1, 2, 5, 7), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), True),  # ceil mode: partial windows
    ((1, 2, 6, 8), (2, 2), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # padded 2x2/2
    ((1, 2, 20, 65), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # 3x3/2 pad 1: 33 columns out
    ((2, 2, 9, 32), (3, 3), (2, 2), (1, 1), ((0, 0), (0, 0)), False),  # 3x3/2 unpadded: e[k + 1]
    ((1, 2, 10, 31), (3, 3), (2, 2), (1, 1), ((1, 0), (1, 0)), True),  # ceil mode, pad before only
    ((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), ((0, 1), (1, 1)), True),  # pad left, none on top
    ((1, 3, 3, 3), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # 2x2 outputs of a 3x3 plane
    ((1, 2, 11, 11), (3, 3), (2, 2), (1, 1), ((2, 2), (2, 2)), False),  # two rows of pad: buffered
]
# the depthwise kernel's: the first six, those of whole planes as flat arrays (stride 1,
# outputs as wide as the input), and more at stride 2
DEPTHWISE = (
    CASES[:6]
    + CASES[8:10]
    + CASES[12:]
    + [
        ((1, 3, 56, 56), (5, 5), (2, 2), (1, 1), ((2, 2), (2, 2)), False),
        ((2, 2, 15, 21), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # odd sizes
        ((2, 2, 15, 21), (3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)), False),  # no top or left pad
        ((1, 2, 9, 12), (4, 4), (2, 2), (1, 1), ((1, 2), (2, 1)), False),  # an even kernel, uneven pads
        ((1, 2, 7, 64), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # 32 columns out
        ((1, 2, 9, 150), (3, 7), (3, 2), (2, 1), ((2, 1), (3, 3)), False),  # 75 columns out: 2 groups
        ((1, 2, 5, 40), (2, 8), (1, 2), (1, 1), ((0, 1), (4, 3)), True),  # 8 columns: the widest
        ((1, 1, 3, 200), (1, 3), (1, 2), (1, 1), ((0, 0), (1, 100)), False),  # a middle group past w
        ((1, 2, 11, 23), (3, 9), (2, 2), (1, 1), ((1, 1), (4, 4)), False),  # 9 columns: phase split
        ((1, 2, 6, 5), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # rows narrower than a vector
        # 17 columns out: two vectors, the first one's second loads past the row's end (every
        # load through the group's mask table, not only the first and last vectors' edges)
        ((1, 2, 6, 33), (5, 5), (2, 2), (1, 1), ((2, 2), (2, 2)), False),
        # stride 1, 3x3 and 5x5 off the flat path: bands of 4 rows and their tails, the last
        # group of columns one or two vectors, partial
        ((1, 2, 7, 57), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # 7 rows: 4 + 2 + 1
        ((1, 2, 11, 33), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # 33 columns: 2 + 1 vectors
        ((2, 2, 6, 40), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), False),
        ((1, 2, 10, 20), (3, 3), (1, 1), (1, 1), ((0, 0), (0, 0)), False),  # unpadded: 8 x 18 out
        ((1, 2, 9, 17), (5, 5), (1, 1), (1, 1), ((0, 1), (1, 0)), False),  # uneven pads: 6 x 14 out
        ((1, 1, 3, 16), (3, 3), (1, 1), (1, 1), ((0, 0), (0, 0)), False),  # one row out
        # whole groups (AVX-512 reads each buffer row as whole vectors, one past the group)
        ((1, 2, 6, 64), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # 2 groups of 2 vectors
        ((1, 2, 5, 48), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), False),  # 3 vectors of 16
    ]
)


@pytest.mark.parametrize("shape, k, s, d, pads, ceil", CASES)
@pytest.mark.parametrize("kind, cip", [("max", False), ("avg", False), ("avg", True)])
def test_pool2d_nchw_matches_reference(rng, shape, k, s, d, pads, ceil, kind, cip):
    x = rng.standard_normal(shape).astype(np.float32)
    out = tuple(_out(shape[2 + a], k[a], s[a], d[a], *pads[a], ceil) for a in range(2))
    want = REF.pool2d_nchw(x, kind, k, s, pads, out, d, cip)
    got = CPU.pool2d_nchw(x, kind, k, s, pads, out, d, cip)
    assert got.shape == want.shape == (*shape[:2], *out)
    assert_close(got, want)


# planes of at most 8 x 8 with 8 channels or more, and on AVX-512 of at most 16 x 16 with 64 or
# more: pooled in blocks of a vector of channels (pool_blocks in native/pool.c), but 2x2 windows
# at stride 2 inside the plane; the 14 x 14 and 16 x 16 cases of fewer channels on the plane kernels
SMALL_PLANES = [
    ((1, 64, 14, 14), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # passes of 8 past each row
    ((1, 70, 14, 14), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False),  # a channel tail
    ((1, 64, 16, 16), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), True),
    ((1, 20, 14, 14), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),
    ((1, 8, 9, 9), (9, 9), (1, 1), (1, 1), ((1, 1), (2, 0)), False),  # 81 taps: the plane kernels
    ((1, 16, 7, 7), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),
    ((2, 37, 7, 7), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), True),  # a channel tail, ceil mode
    ((1, 24, 7, 7), (7, 7), (1, 1), (1, 1), ((0, 0), (0, 0)), False),  # one window over the plane
    ((1, 8, 8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False),
    ((1, 9, 3, 5), (3, 3), (1, 2), (2, 1), ((2, 1), (1, 2)), True),  # dilation, uneven pads
    ((2, 16, 1, 1), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # one pixel
    ((1, 8, 16, 4), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), False),  # 64 pixels
]


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("shape, k, s, d, pads, ceil", SMALL_PLANES)
@pytest.mark.parametrize("kind, cip", [("max", False), ("avg", False), ("avg", True)])
def test_pool2d_nchw_small_planes(rng, threads, shape, k, s, d, pads, ceil, kind, cip):
    """Small planes of many channels, against the reference, with NaN in one window (it wins
    the max, and the mean) and -inf in another."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 3, 0, 0] = np.nan
    x[-1, -1, -1, -1] = -np.inf
    out = tuple(_out(shape[2 + a], k[a], s[a], d[a], *pads[a], ceil) for a in range(2))
    want = REF.pool2d_nchw(x, kind, k, s, pads, out, d, cip)
    got = CPU.pool2d_nchw(x, kind, k, s, pads, out, d, cip)
    assert got.shape == want.shape == (*shape[:2], *out)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_pool2d_nchw_threads_nan_and_wide_means(rng, threads):
    """NaN wins the max; a mean over 81 taps adds float32 runs of at most 64 taps in float64
    (the design's accumulation rule): on data far from 0 its error against the float64 mean is
    bounded by one run's, 63 roundings of 2^-24 each, plus the final one and float64's."""
    x = rng.standard_normal((2, 3, 20, 21)).astype(np.float32)
    x[0, 1, 4, 5] = np.nan
    y = CPU.pool2d_nchw(x, "max", (3, 3), (2, 2), ((1, 1), (1, 1)), (10, 11))
    assert_close(y, REF.pool2d_nchw(x, "max", (3, 3), (2, 2), ((1, 1), (1, 1)), (10, 11)))
    assert np.isnan(y[0, 1, 2, 2:4]).all() and np.isnan(y).sum() == 2  # the two windows over it
    far = (1000 + rng.standard_normal((1, 2, 18, 18))).astype(np.float32)
    mean = CPU.pool2d_nchw(far, "avg", (9, 9), (9, 9), ((0, 0), (0, 0)), (2, 2))
    exact = far.astype(np.float64).reshape(1, 2, 2, 9, 2, 9).mean(axis=(3, 5))
    np.testing.assert_allclose(mean, exact, rtol=65 * 2.0**-24)
    wide = rng.standard_normal((1, 2, 7, 71)).astype(np.float32)  # NaN in the 4-vector runs and the tail
    wide[0, 0, 3, [5, 40, 69]] = np.nan
    got = CPU.pool2d_nchw(wide, "max", (3, 3), (1, 1), ((1, 1), (1, 1)), (7, 71))
    assert_close(got, REF.pool2d_nchw(wide, "max", (3, 3), (1, 1), ((1, 1), (1, 1)), (7, 71)))
    assert np.isnan(got).sum() == 3 * 9
    halve = rng.standard_normal((2, 3, 10, 70)).astype(np.float32)  # 2x2/2: NaN at each window place
    halve[0, 0, 0, 0] = halve[0, 1, 1, 3] = halve[1, 2, 2, 68] = halve[1, 0, 9, 69] = np.nan
    got = CPU.pool2d_nchw(halve, "max", (2, 2), (2, 2), ((0, 0), (0, 0)), (5, 35))
    assert_close(got, REF.pool2d_nchw(halve, "max", (2, 2), (2, 2), ((0, 0), (0, 0)), (5, 35)))
    assert np.isnan(got).sum() == 4 and np.isnan(got[[0, 0, 1, 1], [0, 1, 2, 0], [0, 0, 1, 4], [0, 1, 34, 34]]).all()
    stem = rng.standard_normal((1, 2, 9, 40)).astype(np.float32)  # 3x3/2 pad 1: NaN in a row, a column
    stem[0, 0, 0, 0] = stem[0, 1, 4, 39] = stem[0, 1, 8, 17] = np.nan
    got = CPU.pool2d_nchw(stem, "max", (3, 3), (2, 2), ((1, 1), (1, 1)), (5, 20))
    assert_close(got, REF.pool2d_nchw(stem, "max", (3, 3), (2, 2), ((1, 1), (1, 1)), (5, 20)))
    assert np.isnan(got).sum() == 1 + 1 + 2  # an odd column (17) is in two windows, an even one in one


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize(
    "shape, k, d, pads",
    [
        ((2, 3, 28, 28), (3, 3), (1, 1), ((1, 1), (1, 1))),  # 3 taps centred on the column
        ((1, 2, 9, 17), (3, 3), (1, 2), ((2, 2), (2, 2))),  # centred, dilated
        ((1, 3, 12, 20), (5, 5), (1, 1), ((2, 2), (2, 2))),
        ((1, 2, 10, 16), (3, 3), (1, 1), ((0, 2), (2, 0))),  # 3 taps, all to the left
        ((2, 3, 9, 45), (3, 3), (1, 1), ((1, 1), (1, 1))),  # rows too wide for the flat path
        ((1, 3, 7, 70), (5, 5), (1, 1), ((2, 2), (2, 2))),
    ],
)
def test_pool2d_nchw_separable_max_nan(rng, threads, shape, k, d, pads):
    """The separable max at stride 1 (flat planes, and rows too wide for them) with NaN at a
    row's first and last column, inside a row, in the last partial vector and on the first and
    last rows, in some planes only: NaN wins in every window over one, and the planes without
    NaN (which skip the NaN bookkeeping of their horizontal taps) are the reference's values."""
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 0, 0] = x[0, 0, h // 2, w - 1] = x[0, 0, h - 1, w // 2] = np.nan
    x[-1, -1, h - 1, w - 1] = x[-1, -1, 1, 3] = np.nan
    x[0, 1, 2] = np.inf
    x[0, 1, 3] = -np.inf
    out = tuple(_out(shape[2 + a], k[a], 1, d[a], *pads[a], False) for a in range(2))
    assert out[1] == w
    got = CPU.pool2d_nchw(x, "max", k, (1, 1), pads, out, d)
    want = REF.pool2d_nchw(x, "max", k, (1, 1), pads, out, d)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.isnan(got).any(axis=(2, 3)), np.isnan(x).any(axis=(2, 3)))


@pytest.mark.parametrize("shape, k, s, d, pads, ceil", DEPTHWISE)
@pytest.mark.parametrize("m, activation", [(1, "linear"), (1, "relu6"), (2, "silu")])
def test_depthwise_conv2d_nchw_matches_reference(rng, shape, k, s, d, pads, ceil, m, activation):
    x = rng.standard_normal(shape).astype(np.float32)
    w_ohw = rng.standard_normal((shape[1] * m, *k)).astype(np.float32)
    b = rng.standard_normal(shape[1] * m).astype(np.float32)
    want = REF.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, d, activation)
    got = CPU.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, d, activation)
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("shape", [(1, 1, 40, 56), (2, 3, 56, 56)])
def test_depthwise_conv2d_nchw_stride_2_threads(rng, threads, shape):
    """Stride 2, straight from the planes: one plane split in row blocks over the threads, and
    several planes each whole; bias and ReLU6 in the epilogue."""
    x = rng.standard_normal(shape).astype(np.float32)
    for k in (3, 5):
        w_ohw = rng.standard_normal((shape[1], k, k)).astype(np.float32)
        b = rng.standard_normal(shape[1]).astype(np.float32)
        pads = ((k // 2, k // 2), (k // 2, k // 2))
        want = REF.depthwise_conv2d_nchw(x, w_ohw, b, (2, 2), pads, (1, 1), "relu6")
        got = CPU.depthwise_conv2d_nchw(x, w_ohw, b, (2, 2), pads, (1, 1), "relu6")
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_nchw_kernel_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="pool2d_nchw"):
        _core.pool2d_nchw(x, np.zeros((1, 3, 2, 2), np.float32), True, 3, 3, 1, 1, 1, 1, 0, 0, 4, 4, False)
    with pytest.raises(ValueError, match="depthwise_conv2d_nchw"):
        _core.depthwise_conv2d_nchw(
            x, np.zeros((3, 3, 3), np.float32), None, np.zeros((1, 3, 2, 2), np.float32), 1, 1, 1, 1, 0, 0, 0, 0.0
        )
