"""Depthwise convolutions in channel blocks (native/conv_depthwise_blocks.c): small planes of at
least 8 channels, multiplier 1, on NCHW planes (``depthwise_conv2d_nchw``: planes up to 28 x 28,
7 x 7 windows up to 64 x 64) and NHWC memory (``depthwise_conv2d``: planes up to 8 x 8, 7 x 7
windows up to 28 x 28, 5 x 5 up to 16 x 16, on AVX-512 at stride 2 up to 28 x 28; the bounds in
``conv_blocks_fit``), against ReferenceOps on every ISA path:
channels a whole number of vectors and not (a last block of 4 or 5 lanes), 7 x 7 and 14 x 14
planes (passes of 7 outputs), 1 x 1 and 3 x 5 planes, windows wider than the plane, strides 1-3,
dilation, uneven and wide pads, batch 2, both thread counts, bias or none, activations; and the
kernels the blocks do not take on the same windows (NHWC 5 x 5 on planes over 28 x 28, NCHW 3 x 3
on 56 x 56), so that both stay tested."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps

from ..conftest import assert_close

pytestmark = pytest.mark.usefixtures("isa")

REF, CPU = ReferenceOps(), CpuOps()

# (C, H, W), window, strides, dilations, ((top, bottom), (left, right))
CASES = [
    ((16, 7, 7), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ((37, 7, 7), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2))),  # a last block of 5 (AVX-512) channels
    ((20, 14, 14), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2))),  # 14 columns: two passes of 7
    ((64, 14, 14), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1))),
    ((24, 14, 14), (5, 5), (2, 2), (1, 1), ((2, 2), (2, 2))),
    ((12, 28, 28), (7, 7), (1, 1), (1, 1), ((3, 3), (3, 3))),
    ((9, 13, 11), (3, 3), (1, 1), (2, 2), ((2, 2), (2, 2))),  # dilated: taps one by one
    ((17, 9, 10), (3, 5), (3, 2), (1, 1), ((0, 2), (1, 3))),  # uneven pads, stride 3 rows
    ((8, 1, 1), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),  # one pixel
    ((10, 3, 5), (7, 7), (1, 1), (1, 1), ((3, 3), (3, 3))),  # a window wider than the plane
    ((16, 6, 6), (3, 3), (1, 1), (1, 1), ((5, 4), (6, 3))),  # pads wider than the window
    ((33, 8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0))),  # an even window, no pads
    ((8, 40, 40), (7, 7), (2, 2), (1, 1), ((3, 3), (3, 3))),  # NCHW: a 7 x 7 window on 40 x 40
]


def _out(size, k, s, d, a, z):
    return (size + a + z - d * (k - 1) - 1) // s + 1


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("shape, k, s, d, pads", CASES)
@pytest.mark.parametrize("bias, activation", [(True, "linear"), (False, "relu6"), (True, "hard_silu")])
def test_blocks_match_reference_on_both_layouts(rng, threads, shape, k, s, d, pads, bias, activation):
    c, h, w = shape
    if min(_out(h, k[0], s[0], d[0], *pads[0]), _out(w, k[1], s[1], d[1], *pads[1])) <= 0:
        pytest.skip("no output")
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    w_ohw = rng.standard_normal((c, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if bias else None
    want = REF.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, d, activation)
    got = CPU.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, d, activation)
    assert got.shape == want.shape
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    w_hwcm = np.ascontiguousarray(w_ohw.transpose(1, 2, 0)[..., None])
    want = REF.depthwise_conv2d(x_nhwc, w_hwcm, b, s, pads, d, activation, 0.0)
    got = CPU.depthwise_conv2d(x_nhwc, w_hwcm, b, s, pads, d, activation, 0.0)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize(
    "layout, shape, k, s",
    [
        ("nhwc", (37, 5, 200), (5, 5), (1, 1)),  # a plane over 28 x 28: the NHWC passes of 8, a channel tail
        ("nhwc", (37, 30, 30), (7, 7), (1, 1)),
        ("nhwc", (16, 40, 40), (5, 5), (2, 2)),
        ("nhwc", (32, 14, 14), (3, 3), (1, 1)),  # 3 x 3 at stride 1 over 8 x 8: the 3x3 path
        ("nchw", (16, 56, 56), (3, 3), (1, 1)),  # over 28 x 28: the plane kernels
        ("nchw", (16, 40, 40), (5, 5), (2, 2)),
    ],
)
def test_beside_the_blocks(rng, threads, layout, shape, k, s):
    """Windows the channel blocks take on smaller planes, on planes they leave to the other
    kernels."""
    c, h, w = shape
    pads = ((k[0] // 2, k[0] // 2), (k[1] // 2, k[1] // 2))
    w_ohw = rng.standard_normal((c, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    if layout == "nchw":
        want = REF.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, (1, 1), "relu")
        got = CPU.depthwise_conv2d_nchw(x, w_ohw, b, s, pads, (1, 1), "relu")
    else:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        w_hwcm = np.ascontiguousarray(w_ohw.transpose(1, 2, 0)[..., None])
        want = REF.depthwise_conv2d(x, w_hwcm, b, s, pads, (1, 1), "relu", 0.0)
        got = CPU.depthwise_conv2d(x, w_hwcm, b, s, pads, (1, 1), "relu", 0.0)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
