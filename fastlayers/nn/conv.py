"""torch.nn convolution, pooling, resizing and LRN modules (torch names, signatures and
state_dict keys) over NCHW numpy arrays, plus torchvision's RoIPool.

Weights keep torch's layouts (conv ``weight`` (C_out, C_in / groups, kh, kw), transposed conv
``weight`` (C_in, C_out / groups, kh, kw)) so checkpoints load key for key; the functional layer
converts them to the kernels' HWIO layout per call.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError, UnsupportedError
from ..geometry import transposed_out
from . import functional_conv as FC
from .module import Module


def _uniform(bound, shape):
    # float32 from the start, in place (no float64 array of the weight's size)
    a = np.random.default_rng().random(shape, dtype=np.float32)
    a *= np.float32(2 * bound)
    a -= np.float32(bound)
    return a


class _ConvNd(Module):
    _rank = 2
    _transposed = False

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        output_padding=0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        name = type(self).__name__
        if padding_mode != "zeros":
            raise UnsupportedError(f"{name}: padding_mode {padding_mode!r} is not supported; only 'zeros'")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        if self.groups <= 0 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise InputError(
                f"{name}: groups={groups} must divide in_channels ({in_channels}) and out_channels ({out_channels})"
            )
        r = self._rank
        self.kernel_size = FC._tuple(kernel_size, r, f"{name} kernel_size")
        self.stride = FC._tuple(stride, r, f"{name} stride")
        self.dilation = FC._tuple(dilation, r, f"{name} dilation")
        self.padding = padding if isinstance(padding, str) else FC._tuple(padding, r, f"{name} padding")
        if isinstance(padding, str):
            FC.conv_pads(padding, r, self.kernel_size, self.stride, self.dilation, name)
        self.output_padding = FC._tuple(output_padding, r, f"{name} output_padding")
        self.padding_mode = padding_mode
        if self._transposed:
            shape = (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
            fan_in = shape[1] * int(np.prod(self.kernel_size))
        else:
            shape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
            fan_in = shape[1] * int(np.prod(self.kernel_size))
        bound = 1.0 / math.sqrt(max(fan_in, 1))
        self.weight = _uniform(bound, shape)
        self.bias = _uniform(bound, (self.out_channels,)) if bias else None

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * self._rank:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self._rank:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class Conv1d(_ConvNd):
    """1-D convolution: (N, C_in, L) -> (N, C_out, L_out); weight (C_out, C_in / groups, k), bias (C_out,).

    ``padding`` is an int, a 1-tuple, "valid" or "same" (stride 1; the odd unit after), as in torch.
    """

    _rank = 1

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode)

    def forward(self, input):
        return FC.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    """2-D convolution: (N, C_in, H, W) -> (N, C_out, H_out, W_out); weight (C_out, C_in / groups,
    kh, kw), bias (C_out,).

    ``padding`` is an int, a pair, "valid" or "same" (stride 1), as in torch; only
    ``padding_mode="zeros"`` is supported.
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode)

    def forward(self, input):
        return FC.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-D convolution: (N, C_in, H, W) -> (N, C_out, H_out, W_out) with
    H_out = (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1;
    weight (C_in, C_out / groups, kh, kw), bias (C_out,).
    """

    _transposed = True

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups=1,
        bias=True,
        dilation=1,
        padding_mode="zeros",
        device=None,
        dtype=None,
    ):
        if isinstance(padding, str):
            raise InputError("ConvTranspose2d: padding must be an int or a pair (as in torch)")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            output_padding,
        )

    def forward(self, input, output_size=None):
        op = self.output_padding
        if output_size is not None:
            x = np.asarray(input)
            want = tuple(int(v) for v in list(output_size)[-2:])
            op = []
            for n, s, p, d, k, w in zip(x.shape[-2:], self.stride, self.padding, self.dilation, self.kernel_size, want):
                smallest = transposed_out(n, k, s, d, (p, p))
                if not smallest <= w < smallest + max(s, d):
                    raise InputError(
                        f"ConvTranspose2d: requested output size {want} is not in the "
                        f"reachable range starting at {smallest}"
                    )
                op.append(w - smallest)
        return FC.conv_transpose2d(
            input, self.weight, self.bias, self.stride, self.padding, tuple(op), self.groups, self.dilation
        )


class _MaxPoolNd(Module):
    _fn = staticmethod(FC.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        if return_indices:
            raise UnsupportedError(f"{type(self).__name__}(return_indices=True) is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        return self._fn(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self):
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class MaxPool1d(_MaxPoolNd):
    """Max over windows of (N, C, L) (torch's padding, dilation and ceil_mode)."""

    _fn = staticmethod(FC.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max over windows of (N, C, H, W) (torch's padding, dilation and ceil_mode)."""


class AvgPool1d(Module):
    """Mean over windows of (N, C, L); ``count_include_pad`` counts the zero padding."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, input):
        return FC.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)


class AvgPool2d(Module):
    """Mean over windows of (N, C, H, W); ``count_include_pad`` counts the zero padding,
    ``divisor_override`` replaces the divisor."""

    def __init__(
        self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
    ):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):
        return FC.avg_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )


def _adaptive_module(name, fn, doc, has_indices):
    def init_with_indices(self, output_size, return_indices=False):
        Module.__init__(self)
        if return_indices:
            raise UnsupportedError(f"{name}(return_indices=True) is not supported")
        self.output_size = output_size

    def init(self, output_size):
        Module.__init__(self)
        self.output_size = output_size

    def forward(self, input):
        return fn(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"

    return type(
        name,
        (Module,),
        {
            "__init__": init_with_indices if has_indices else init,
            "forward": forward,
            "extra_repr": extra_repr,
            "__doc__": doc,
        },
    )


AdaptiveAvgPool1d = _adaptive_module(
    "AdaptiveAvgPool1d",
    FC.adaptive_avg_pool1d,
    "Mean over torch's adaptive bins: (N, C, L) -> (N, C, output_size).",
    False,
)
AdaptiveAvgPool2d = _adaptive_module(
    "AdaptiveAvgPool2d",
    FC.adaptive_avg_pool2d,
    "Mean over torch's adaptive bins: (N, C, H, W) -> (N, C, *output_size).",
    False,
)
AdaptiveMaxPool1d = _adaptive_module(
    "AdaptiveMaxPool1d",
    FC.adaptive_max_pool1d,
    "Max over torch's adaptive bins: (N, C, L) -> (N, C, output_size).",
    True,
)
AdaptiveMaxPool2d = _adaptive_module(
    "AdaptiveMaxPool2d",
    FC.adaptive_max_pool2d,
    "Max over torch's adaptive bins: (N, C, H, W) -> (N, C, *output_size).",
    True,
)


class Upsample(Module):
    """Resize (N, C, H, W) to ``size`` or by ``scale_factor``; mode "nearest" or "bilinear"."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        if mode not in ("nearest", "bilinear"):
            raise UnsupportedError(f"Upsample: mode {mode!r} is not supported; expected 'nearest' or 'bilinear'")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, input):
        return FC.interpolate(
            input, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )


class LocalResponseNorm(Module):
    """x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels)^beta, (N, C, ...)."""

    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = int(size), float(alpha), float(beta), float(k)

    def forward(self, input):
        return FC.local_response_norm(input, self.size, self.alpha, self.beta, self.k)


class RoIPool(Module):
    """torchvision.ops.RoIPool: ``forward(input, rois)`` -> (K, C, *output_size)."""

    def __init__(self, output_size, spatial_scale):
        super().__init__()
        self.output_size, self.spatial_scale = output_size, float(spatial_scale)

    def forward(self, input, rois):
        return FC.roi_pool(input, rois, self.output_size, self.spatial_scale)
