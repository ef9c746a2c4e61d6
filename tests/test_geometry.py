"""fastlayers.geometry against the frameworks: torch's output lengths (convolution, pools with and
without ceil_mode, transposed convolution) and Keras's 'same' and 'causal' padding (values, so the
split of an odd padding is checked too), over odd and even sizes, kernels, strides, dilations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fastlayers.geometry import (
    causal_pads,
    padded_span,
    same_pads,
    same_pads_stride1,
    transposed_out,
    window_out,
    window_out_2d,
)

#: Odd and even lengths, one shorter than most kernels.
SIZES = (1, 2, 3, 4, 7, 8)


def test_window_out_matches_torch_conv(torch):
    w = torch.zeros(1, 1, 4)
    for n, k, s, d, p in itertools.product(SIZES, range(1, 5), (1, 2, 3), (1, 2), (0, 1, 2)):
        fits = padded_span(n, k, d, (p, p)) >= 0
        assert fits == (n + 2 * p >= (k - 1) * d + 1)
        if not fits:
            assert window_out(n, k, s, d, (p, p)) <= 0
            continue
        y = torch.nn.functional.conv1d(torch.zeros(1, 1, n), w[..., :k], stride=s, padding=p, dilation=d)
        assert window_out(n, k, s, d, (p, p)) == y.shape[-1], (n, k, s, d, p)


def test_window_out_2d_matches_torch_conv2d(torch):
    """Rows and columns with different kernel, stride, dilation and asymmetric pads."""
    for (h, w), (kh, kw), st, dl, pads in [
        ((7, 8), (3, 2), (2, 1), (1, 2), ((1, 0), (0, 2))),
        ((5, 4), (1, 3), (1, 3), (2, 1), ((0, 0), (1, 1))),
    ]:
        x = torch.nn.functional.pad(torch.zeros(1, 1, h, w), (*pads[1], *pads[0]))
        y = torch.nn.functional.conv2d(x, torch.zeros(1, 1, kh, kw), stride=st, dilation=dl)
        assert window_out_2d((h, w), (kh, kw), st, dl, pads) == tuple(y.shape[-2:])


@pytest.mark.parametrize("ceil", [False, True])
def test_window_out_matches_torch_pools(torch, ceil):
    F = torch.nn.functional
    for n, k, s, d in itertools.product(SIZES, range(1, 5), (1, 2, 3), (1, 2)):
        for p in range(k // 2 + 1):  # torch: padding at most half the kernel
            if padded_span(n, k, d, (p, p)) < 0:
                continue
            x = torch.zeros(1, 1, n)
            got = window_out(n, k, s, d, (p, p), ceil)
            assert got == F.max_pool1d(x, k, s, p, d, ceil_mode=ceil).shape[-1], (n, k, s, d, p)
            if d == 1:
                assert got == F.avg_pool1d(x, k, s, p, ceil_mode=ceil).shape[-1], (n, k, s, p)


def test_transposed_out_matches_torch(torch):
    for n, k, s, d, p in itertools.product(range(1, 6), range(1, 4), (1, 2, 3), (1, 2), (0, 1)):
        for op in range(max(s, d)):
            out = transposed_out(n, k, s, d, (p, p), op)
            if out <= 0:
                continue
            y = torch.nn.functional.conv_transpose1d(
                torch.zeros(1, 1, n), torch.zeros(1, 1, k), stride=s, padding=p, output_padding=op, dilation=d
            )
            assert out == y.shape[-1], (n, k, s, d, p, op)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_same_stride1_matches_torch_same(torch):
    for n, k, d in itertools.product(SIZES, range(1, 6), (1, 2, 3)):
        x = torch.arange(n, dtype=torch.float32).reshape(1, 1, n) + 1
        w = torch.arange(k, dtype=torch.float32).reshape(1, 1, k) + 1
        pads = same_pads_stride1(k, d)
        assert pads == same_pads(n, k, 1, d)
        want = torch.nn.functional.conv1d(x, w, padding="same", dilation=d)
        got = torch.nn.functional.conv1d(torch.nn.functional.pad(x, pads), w, dilation=d)
        assert torch.equal(got, want), (n, k, d)


def test_same_and_causal_match_keras(keras, torch):
    """Keras pads 'same' with the odd cell after and 'causal' before: the same values as an
    explicit pad of ``same_pads`` / ``causal_pads`` followed by a valid convolution."""
    rng = np.random.default_rng(0)
    for n, k, s, d in itertools.product((1, 2, 5, 8), (1, 2, 3, 4), (1, 2, 3), (1, 2)):
        if s > 1 and d > 1:  # Keras refuses strides > 1 with dilation > 1
            continue
        x = rng.standard_normal((1, n, 1)).astype(np.float32)
        w = rng.standard_normal((k, 1, 1)).astype(np.float32)
        want = np.asarray(keras.ops.convert_to_numpy(keras.ops.conv(x, w, strides=s, padding="same", dilation_rate=d)))
        pads = same_pads(n, k, s, d)
        assert window_out(n, k, s, d, pads) == -(-n // s) == want.shape[1]
        got = torch.nn.functional.conv1d(
            torch.nn.functional.pad(torch.from_numpy(x).permute(0, 2, 1), pads),
            torch.from_numpy(w).permute(2, 1, 0),
            stride=s,
            dilation=d,
        )
        np.testing.assert_allclose(got.permute(0, 2, 1).numpy(), want, rtol=1e-5, atol=1e-6)
    for k, d in ((1, 1), (2, 1), (3, 2), (4, 3)):
        layer = keras.layers.Conv1D(1, k, padding="causal", dilation_rate=d, use_bias=False)
        x = rng.standard_normal((1, 7, 1)).astype(np.float32)
        want = keras.ops.convert_to_numpy(layer(x))
        w = layer.get_weights()[0]
        got = torch.nn.functional.conv1d(
            torch.nn.functional.pad(torch.from_numpy(x).permute(0, 2, 1), causal_pads(k, d)),
            torch.from_numpy(w).permute(2, 1, 0),
            dilation=d,
        )
        np.testing.assert_allclose(got.permute(0, 2, 1).numpy(), want, rtol=1e-5, atol=1e-6)


def test_same_lower_mirrors_upper():
    """ONNX SAME_LOWER puts the odd cell before: the mirror of SAME_UPPER, same total."""
    for n, k, s, d in itertools.product(SIZES, range(1, 6), (1, 2, 3), (1, 2)):
        upper, lower = same_pads(n, k, s, d), same_pads(n, k, s, d, lower=True)
        assert lower == upper[::-1] and upper[1] - upper[0] in (0, 1)


def test_unknown_size():
    assert window_out(None, 3, 2) is None
