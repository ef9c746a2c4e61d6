"""fastlayers.nn convolution / pooling / resizing modules against torch.nn (NCHW), and roi_pool
against a brute-force implementation of torchvision's documented semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastlayers.nn as nn
import fastlayers.nn.functional as F
from fastlayers.errors import InputError, ShapeError, UnsupportedError

from ..conftest import assert_close

CONV_CASES = [
    ("Conv1d", (4, 6, 3), {}, (2, 4, 11)),
    ("Conv1d", (4, 6, 3), {"stride": 2, "padding": 2, "dilation": 2, "groups": 2}, (1, 4, 9)),
    ("Conv1d", (4, 4, 4), {"padding": "same", "bias": False}, (2, 4, 7)),
    ("Conv1d", (3, 2, 1), {"stride": 3}, (1, 3, 10)),
    ("Conv2d", (4, 6, 3), {}, (2, 4, 7, 9)),
    ("Conv2d", (4, 6, (3, 2)), {"stride": (2, 1), "padding": (1, 0)}, (2, 4, 7, 9)),
    ("Conv2d", (4, 6, 3), {"stride": 2, "dilation": 2, "padding": 2}, (1, 4, 9, 8)),  # dilation + stride
    ("Conv2d", (6, 6, 3), {"groups": 3, "padding": 1}, (2, 6, 5, 5)),
    ("Conv2d", (6, 12, 3), {"groups": 6, "padding": "same"}, (2, 6, 5, 4)),  # depthwise x2
    ("Conv2d", (4, 4, 4), {"padding": "same", "dilation": (1, 2)}, (1, 4, 7, 9)),  # even kernel same
    ("Conv2d", (4, 5, 1), {"bias": False}, (2, 4, 3, 3)),  # 1x1
    ("Conv2d", (4, 5, 2), {"stride": 5}, (1, 4, 11, 7)),  # stride > kernel
    ("Conv2d", (3, 2, 3), {"padding": "valid"}, (1, 3, 3, 3)),
    ("Conv2d", (3, 2, (1, 3)), {"padding": (0, 1)}, (2, 3, 1, 6)),  # height 1
    ("ConvTranspose2d", (4, 6, 3), {}, (2, 4, 5, 4)),
    ("ConvTranspose2d", (4, 6, 3), {"stride": 2, "padding": 1, "output_padding": 1}, (2, 4, 5, 4)),
    ("ConvTranspose2d", (4, 6, (3, 2)), {"stride": (3, 2), "padding": (2, 0), "groups": 2}, (1, 4, 4, 5)),
    ("ConvTranspose2d", (4, 2, 3), {"stride": 2, "dilation": 2, "output_padding": 1, "bias": False}, (1, 4, 3, 3)),
    ("ConvTranspose2d", (2, 3, 1), {"stride": 3}, (1, 2, 1, 4)),
]


def randomize(module, rng, torch):
    with torch.no_grad():
        for p in module.state_dict().values():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32)))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("name,args,kwargs,shape", CONV_CASES)
def test_conv_modules_match_torch(name, args, kwargs, shape, torch, rng, backend):
    ref = getattr(torch.nn, name)(*args, **kwargs).eval()
    randomize(ref, rng, torch)
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [v.shape for v in ours.state_dict().values()] == [tuple(v.shape) for v in ref.state_dict().values()]
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    assert_close(ours(x), expected, rtol=1e-5, atol=1e-5, what=f"{name}{args}{kwargs}")
    with torch.no_grad():  # unbatched input
        assert_close(ours(x[0]), ref(torch.from_numpy(x[0])).numpy(), rtol=1e-5, atol=1e-5)


def test_conv_transpose_output_size(torch, rng, backend):
    ref = torch.nn.ConvTranspose2d(3, 2, 3, stride=3, padding=1)
    ours = nn.ConvTranspose2d(3, 2, 3, stride=3, padding=1)
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x), output_size=(11, 12)).numpy()
    assert_close(ours(x, output_size=(11, 12)), expected, rtol=1e-5, atol=1e-5)


POOL_CASES = [
    ("MaxPool1d", (3,), {}, (2, 3, 10)),
    ("MaxPool1d", (3, 2, 1), {"dilation": 2, "ceil_mode": True}, (2, 3, 10)),
    ("MaxPool2d", (3, 2), {}, (2, 3, 9, 8)),
    ("MaxPool2d", (3, 2, 1), {"ceil_mode": True}, (2, 3, 10, 7)),
    ("MaxPool2d", ((2, 3), (3, 1), (1, 0)), {"dilation": (2, 1)}, (1, 3, 9, 6)),
    ("MaxPool2d", (1, 4), {}, (1, 2, 9, 5)),  # stride > kernel
    ("AvgPool1d", (3, 2, 1), {}, (2, 3, 10)),
    ("AvgPool1d", (3, 2, 1), {"ceil_mode": True, "count_include_pad": False}, (2, 3, 10)),
    ("AvgPool2d", (3, 2, 1), {}, (2, 3, 9, 8)),
    ("AvgPool2d", (3, 2, 1), {"count_include_pad": False}, (2, 3, 9, 8)),
    ("AvgPool2d", (3, 2, 1), {"ceil_mode": True}, (2, 3, 10, 7)),
    ("AvgPool2d", (3, 2, 1), {"ceil_mode": True, "count_include_pad": False}, (2, 3, 10, 7)),
    ("AvgPool2d", ((2, 3), (2, 2), (1, 1)), {"divisor_override": 4}, (1, 2, 7, 7)),
    ("AvgPool2d", (3, 2, 1), {"ceil_mode": True, "divisor_override": 5}, (1, 2, 8, 6)),
    ("AdaptiveAvgPool1d", (4,), {}, (2, 3, 10)),
    ("AdaptiveMaxPool1d", (3,), {}, (2, 3, 7)),
    ("AdaptiveAvgPool2d", ((3, 4),), {}, (2, 3, 7, 9)),
    ("AdaptiveAvgPool2d", (1,), {}, (2, 3, 5, 6)),
    ("AdaptiveAvgPool2d", ((None, 2),), {}, (1, 3, 5, 7)),
    ("AdaptiveMaxPool2d", ((5, 3),), {}, (2, 3, 4, 9)),  # output > input rows
    ("Upsample", (), {"scale_factor": 2}, (2, 3, 3, 4)),
    ("Upsample", (), {"size": (5, 7)}, (2, 3, 3, 4)),
    ("Upsample", (), {"scale_factor": 1.5, "mode": "nearest"}, (1, 2, 4, 5)),
    ("Upsample", (), {"scale_factor": 2, "mode": "bilinear"}, (2, 3, 3, 4)),
    ("Upsample", (), {"scale_factor": 2, "mode": "bilinear", "align_corners": True}, (2, 3, 3, 4)),
    ("Upsample", (), {"size": (7, 3), "mode": "bilinear", "align_corners": False}, (1, 3, 4, 5)),
    ("Upsample", (), {"size": (7, 3), "mode": "bilinear", "align_corners": True}, (1, 3, 4, 5)),
    ("Upsample", (), {"size": (1, 6), "mode": "bilinear", "align_corners": True}, (1, 2, 4, 5)),
    ("Upsample", (), {"scale_factor": 2.5, "mode": "bilinear"}, (1, 2, 3, 4)),
    ("LocalResponseNorm", (5,), {}, (2, 7, 3, 4)),
    ("LocalResponseNorm", (4, 0.01, 0.5, 2.0), {}, (2, 6, 5)),
    ("LocalResponseNorm", (3, 0.1), {}, (1, 4, 2, 3, 2)),
]


@pytest.mark.parametrize("name,args,kwargs,shape", POOL_CASES)
def test_pool_modules_match_torch(name, args, kwargs, shape, torch, rng, backend):
    ref = getattr(torch.nn, name)(*args, **kwargs)
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict()) == []
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    assert_close(ours(x), expected, rtol=1e-5, atol=1e-5, what=f"{name}{args}{kwargs}")


def test_max_pool_propagates_nan(backend):
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    y = F.max_pool2d(x, 2)
    assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1, 1])


def test_conv_errors():
    with pytest.raises(UnsupportedError, match="padding_mode"):
        nn.Conv2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(InputError, match="groups=3 must divide"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(InputError, match="strided"):
        nn.Conv2d(2, 2, 3, stride=2, padding="same")
    with pytest.raises(ShapeError, match="groups=2 must divide both the 3 input channels"):
        F.conv2d(np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 1, 3, 3), np.float32), groups=2)
    with pytest.raises(ShapeError, match="expects 4 input channels"):
        nn.Conv2d(4, 2, 3)(np.zeros((1, 3, 5, 5), np.float32))
    with pytest.raises(ShapeError, match="smaller than the dilated kernel"):
        nn.Conv2d(1, 1, 3, dilation=3)(np.zeros((1, 1, 5, 5), np.float32))
    with pytest.raises(InputError, match="at most half"):
        nn.MaxPool2d(2, padding=2)(np.zeros((1, 1, 5, 5), np.float32))
    with pytest.raises(UnsupportedError):
        nn.MaxPool2d(2, return_indices=True)
    with pytest.raises(UnsupportedError, match="bicubic"):
        nn.Upsample(scale_factor=2, mode="bicubic")


# ----------------------------------------------------------------------------------- roi_pool
def brute_roi_pool(x_nchw, rois, output_size, spatial_scale):
    """torchvision.ops.roi_pool as documented (roi_pool_kernel.cpp), pixel by pixel."""
    k_, (ph, pw) = rois.shape[0], output_size
    n, c, h, w = x_nchw.shape
    out = np.zeros((k_, c, ph, pw), np.float32)

    def rnd(v):  # std::round: half away from zero
        return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))

    for k in range(k_):
        b = int(rois[k, 0])
        sw, sh = (
            rnd(float(np.float32(rois[k, 1]) * np.float32(spatial_scale))),
            rnd(float(np.float32(rois[k, 2]) * np.float32(spatial_scale))),
        )
        ew, eh = (
            rnd(float(np.float32(rois[k, 3]) * np.float32(spatial_scale))),
            rnd(float(np.float32(rois[k, 4]) * np.float32(spatial_scale))),
        )
        rw, rh = max(ew - sw + 1, 1), max(eh - sh + 1, 1)
        bsh, bsw = np.float32(rh) / np.float32(ph), np.float32(rw) / np.float32(pw)
        for i in range(ph):
            for j in range(pw):
                hs = min(max(math.floor(np.float32(i) * bsh) + sh, 0), h)
                he = min(max(math.ceil(np.float32(i + 1) * bsh) + sh, 0), h)
                ws = min(max(math.floor(np.float32(j) * bsw) + sw, 0), w)
                we = min(max(math.ceil(np.float32(j + 1) * bsw) + sw, 0), w)
                for ch in range(c):
                    best = None
                    for yy in range(h):
                        for xx in range(w):
                            if hs <= yy < he and ws <= xx < we:
                                v = x_nchw[b, ch, yy, xx]
                                best = v if best is None or v > best else best
                    out[k, ch, i, j] = 0 if best is None else best
    return out


@pytest.mark.parametrize("output_size,scale", [((2, 2), 1.0), ((3, 2), 0.5), ((1, 1), 0.25), ((4, 3), 0.5)])
def test_roi_pool_matches_brute_force(backend, rng, output_size, scale):
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    rois = np.array(
        [
            [0, 0, 0, 13, 11],
            [1, 2.5, 1.5, 9.4, 6.6],
            [1, 3, 3, 3, 3],
            [0, -4, -2, 5, 20],
            [1, 10, 8, 6, 4],
            [0, 1.5, 2.5, 30, 30],
        ],
        np.float32,
    )
    expected = brute_roi_pool(x, rois, output_size, scale)
    assert_close(F.roi_pool(x, rois, output_size, scale), expected)
    # the list-of-boxes form and the RoIPool module
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)]
    order = np.concatenate([np.flatnonzero(rois[:, 0] == i) for i in range(2)])
    assert_close(nn.RoIPool(output_size, scale)(x, boxes), expected[order])


def test_roi_pool_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(InputError, match="batch indices"):
        F.roi_pool(x, np.array([[1, 0, 0, 2, 2]], np.float32), 2)
    with pytest.raises(ShapeError):
        F.roi_pool(x, np.zeros((3, 4), np.float32), 2)
