"""The NCHW transposed convolution (``conv_transpose2d_nchw`` in native/conv_transpose.c)
through the CPU backend's primitive, against ReferenceOps on every ISA path: strides 1-3 and
strides wider than the window (output rows without taps), dilations, crops, outputs longer
than the full transposed size (output_padding), groups, batch 1 and 3, odd planes, 1x1 inputs
and kernels, rows wider than a chunk of the sgemm, output channels in several blocks, the
activation epilogue, one and two threads (bands of output rows)."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps
from fastlayers.native import _core

from ..conftest import assert_close

pytestmark = pytest.mark.usefixtures("isa")

REF, CPU = ReferenceOps(), CpuOps()

# (N, C_in, H, W), C_out / groups, groups, kernel, strides, dilations, crop (top, left),
# extra output (rows, columns) past the full size less the crop on both sides
CASES = [
    ((1, 4, 5, 7), 3, 1, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    ((3, 6, 9, 13), 4, 2, (3, 3), (1, 1), (1, 1), (0, 0), (0, 0)),
    ((1, 3, 1, 1), 2, 1, (3, 3), (2, 2), (1, 1), (0, 0), (0, 0)),
    ((2, 4, 6, 11), 5, 1, (4, 3), (3, 2), (1, 2), (2, 1), (2, 1)),
    ((1, 8, 17, 30), 7, 4, (2, 5), (3, 3), (2, 1), (1, 3), (1, 2)),
    ((1, 5, 7, 9), 3, 1, (1, 1), (1, 1), (1, 1), (0, 0), (0, 0)),
    ((1, 4, 3, 3), 2, 1, (2, 2), (4, 4), (1, 1), (0, 0), (3, 3)),
    ((1, 3, 9, 300), 2, 1, (3, 3), (1, 2), (3, 1), (2, 1), (0, 1)),
    ((1, 16, 6, 40), 70, 1, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)),
    ((3, 2, 2, 1), 3, 2, (1, 3), (3, 1), (1, 2), (0, 2), (2, 0)),
]


def _out(size, k, s, d, crop, extra):
    return (size - 1) * s + d * (k - 1) + 1 - 2 * crop + extra


@pytest.mark.parametrize("shape, cout_g, groups, k, s, d, crop, extra", CASES)
@pytest.mark.parametrize("bias, activation", [(True, "linear"), (False, "relu"), (True, "leaky_relu")])
def test_conv_transpose2d_nchw_matches_reference(rng, shape, cout_g, groups, k, s, d, crop, extra, bias, activation):
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], cout_g, *k)).astype(np.float32)
    b = rng.standard_normal(cout_g * groups).astype(np.float32) if bias else None
    out = tuple(_out(shape[2 + a], k[a], s[a], d[a], crop[a], extra[a]) for a in range(2))
    args = (b, s, crop, out, d, groups, activation, 0.1)
    want = REF.conv_transpose2d_nchw(x, w, *args)
    got = CPU.conv_transpose2d_nchw(x, w, *args)
    assert got.shape == want.shape == (shape[0], cout_g * groups, *out)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("n, groups", [(1, 1), (1, 3), (2, 1)])
def test_conv_transpose2d_nchw_on_threads(rng, threads, n, groups):
    """One or three blocks of channels per image, each with work for two shares at least: at 2
    threads the rows are split in bands (each band computes the input rows it needs)."""
    x = rng.standard_normal((n, 64 * groups, 23, 19)).astype(np.float32)
    w = (rng.standard_normal((64 * groups, 8, 3, 3)) / 24).astype(np.float32)
    b = rng.standard_normal(8 * groups).astype(np.float32)
    args = (b, (2, 2), (1, 1), (46, 38), (1, 1), groups, "tanh")
    assert_close(CPU.conv_transpose2d_nchw(x, w, *args), REF.conv_transpose2d_nchw(x, w, *args), rtol=1e-5, atol=1e-5)


def test_conv_transpose2d_nchw_too_small_to_share_is_not_split(rng):
    """A call whose work is under two shares runs in one band at 2 threads, the same bits as
    at 1 (bands would recompute the rows their windows overlap, on one thread)."""
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    args = (None, (2, 2), (1, 1), (28, 28), (1, 1), 1, "linear")
    with fastlayers.using_threads(1):
        one = CPU.conv_transpose2d_nchw(x, w, *args)
    with fastlayers.using_threads(2):
        np.testing.assert_array_equal(CPU.conv_transpose2d_nchw(x, w, *args), one)


def test_conv_transpose2d_nchw_reference_matches_the_nhwc_one(rng):
    """ReferenceOps' NCHW form is its NHWC one between transposes, the weight (C_in, C_out /
    groups, kh, kw) moved to (kh, kw, C_in, C_out / groups)."""
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 2, 3)).astype(np.float32)
    got = REF.conv_transpose2d_nchw(x, w, None, (2, 1), (0, 1), (10, 6), (1, 1), 2)
    want = REF.conv_transpose2d(
        x.transpose(0, 2, 3, 1), w.transpose(2, 3, 0, 1), None, (2, 1), (0, 1), (10, 6), (1, 1), 2
    )
    np.testing.assert_array_equal(got, want.transpose(0, 3, 1, 2))


def test_conv_transpose2d_nchw_kernel_errors():
    x, y = np.zeros((1, 4, 3, 3), np.float32), np.zeros((1, 2, 5, 5), np.float32)
    wt = np.zeros((1, 18, 4), np.float32)
    with pytest.raises(ValueError, match="wt of shape"):
        _core.conv_transpose2d_nchw(x, wt[:, :9], None, y, 3, 3, 1, 2, 2, 1, 1, 1, 1, 0, 0.0)
    with pytest.raises(ValueError, match="inconsistent"):
        _core.conv_transpose2d_nchw(x, wt, None, y, 3, 3, 1, 0, 2, 1, 1, 1, 1, 0, 0.0)
    with pytest.raises(ValueError, match="bias"):
        _core.conv_transpose2d_nchw(x, wt, np.zeros(3, np.float32), y, 3, 3, 1, 2, 2, 1, 1, 1, 1, 0, 0.0)
