"""Convolution layers with Keras's names, arguments, defaults and weight layouts.

Kernels run on NHWC activations with HWIO kernels (the canonical layout, see docs/design.md);
``data_format="channels_first"`` inputs are transposed in and out. A 1-D layer runs the 2-D
primitive on a height-1 image.

Padding: ``"valid"``, ``"same"`` (TensorFlow/Keras 3 rule: total padding
``max((ceil(n / s) - 1) s + d (k - 1) + 1 - n, 0)``, the odd unit at the end, so asymmetric for
stride > 1 or even kernels), ``"causal"`` (Conv1D: ``d (k - 1)`` zeros before), or explicit
(an extension of Keras): an int, one int per spatial axis, or ``(before, after)`` per axis.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..backends.derived import derived
from ..errors import InputError, ShapeError
from ..geometry import (
    causal_pads,
    dilated_size,
    padded_span,
    same_pads,
    transposed_out,
    window_out,
)
from .base import InputSpec, Layer, shape_str
from .core import _DEFAULT_ALPHA, activation_name


def normalize_tuple(value, n: int, what: str) -> tuple[int, ...]:
    """An int or n ints as a tuple of n positive ints."""
    t = (int(value),) * n if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if len(t) != n or any(v <= 0 for v in t):
        raise InputError(f"{what}: expected {n} positive int(s), got {value!r}")
    return t


def normalize_padding(padding, rank: int, what: str, allow_causal: bool = False):
    """'valid' / 'same' / 'causal' (lower-cased) or explicit ((before, after),) * rank."""
    if isinstance(padding, str):
        p = padding.lower()
        if p in ("valid", "same") or (p == "causal" and allow_causal):
            return p
        raise InputError(
            f"{what}: padding must be 'valid', 'same'{', causal' if allow_causal else ''}"
            f" or explicit amounts, got {padding!r}"
        )
    if isinstance(padding, (int, np.integer)):
        pairs = ((int(padding), int(padding)),) * rank
    else:
        items = tuple(padding)
        if rank == 1 and len(items) == 2 and all(isinstance(v, (int, np.integer)) for v in items):
            pairs = ((int(items[0]), int(items[1])),)
        elif len(items) == rank and all(isinstance(v, (int, np.integer)) for v in items):
            pairs = tuple((int(v), int(v)) for v in items)
        elif len(items) == rank and all(len(tuple(v)) == 2 for v in items):
            pairs = tuple((int(a), int(b)) for a, b in items)
        else:
            raise InputError(
                f"{what}: explicit padding must be an int, {rank} int(s) or {rank} "
                f"(before, after) pair(s), got {padding!r}"
            )
    if any(v < 0 for pair in pairs for v in pair):
        raise InputError(f"{what}: padding amounts must be >= 0, got {padding!r}")
    return pairs


def axis_pads(padding, size, k, s, d, axis):
    """(before, after) padding of spatial ``axis`` for a window op."""
    if padding == "valid":
        return 0, 0
    if padding == "same":
        return same_pads(size, k, s, d)
    if padding == "causal":
        return causal_pads(k, d)
    return padding[axis]


def check_data_format(data_format, what):
    data_format = data_format or "channels_last"
    if data_format not in ("channels_last", "channels_first"):
        raise InputError(f"{what}: data_format must be 'channels_last' or 'channels_first', got {data_format!r}")
    return data_format


class SpatialLayer(Layer):
    """Shared plumbing: moving channels_first inputs to NHWC and 1-D inputs to height 1."""

    rank = 2

    def _where(self):
        return f"{type(self).__name__} {self.name!r}"

    def _channel_axis(self):
        return 1 if self.data_format == "channels_first" else -1

    def _spatial_sizes(self, input_shape):
        return tuple(input_shape[2:]) if self.data_format == "channels_first" else tuple(input_shape[1:-1])

    def _to_nhwc(self, x):
        """x (N, H, W, C) from channels_last or channels_first input; 1-D inputs at height 1."""
        shape = tuple(x.shape)
        if self.data_format == "channels_first":
            x = self.ops.transpose(x, (0, *range(2, len(shape)), 1))
            shape = (shape[0], *shape[2:], shape[1])
        return x.reshape(shape[0], 1, *shape[1:]) if self.rank == 1 else x

    def _from_nhwc(self, y):
        """y (N, H, W, C) in the layer's data format (1-D: the height axis dropped)."""
        n, h, w, c = y.shape
        if self.rank == 1:
            y = y.reshape(n, w, c)
        if self.data_format == "channels_first":
            y = self.ops.transpose(y, (0, y.ndim - 1, *range(1, y.ndim - 1)))
        return y

    def _out_shape(self, input_shape, spatial, channels):
        if self.data_format == "channels_first":
            return (input_shape[0], channels, *spatial)
        return (input_shape[0], *spatial, channels)

    def _pads_hw(self, sizes, kernel, strides, dilation):
        """((top, bottom), (left, right)) for NHWC sizes (1-D: no vertical padding), remembered
        per input size (a few microseconds of Python per call otherwise)."""
        key = (tuple(sizes), kernel, strides, dilation)
        cache = self.__dict__.get("_pads_by_size")
        if cache is None:
            cache = self._pads_by_size = {}
        pads = cache.get(key)
        if pads is None:
            pads = tuple(
                axis_pads(self.padding, n, k, s, d, a)
                for a, (n, k, s, d) in enumerate(zip(sizes, kernel, strides, dilation))
            )
            pads = ((0, 0), *pads) if self.rank == 1 else pads
            if len(cache) < 64:
                cache[key] = pads
        return pads

    def _hw(self, t, one=1):
        """A per-axis tuple as (h, w): 1-D tuples get ``one`` for the height."""
        return (one, *t) if self.rank == 1 else tuple(t)


class _Conv(SpatialLayer):
    config_keys = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "data_format",
        "dilation_rate",
        "groups",
        "activation",
        "use_bias",
    )

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="valid",
        data_format=None,
        dilation_rate=1,
        groups=1,
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        where = self._where()
        self.filters = int(filters)
        if self.filters <= 0:
            raise InputError(f"{where}: filters must be positive, got {filters}")
        self.kernel_size = normalize_tuple(kernel_size, self.rank, f"{where} kernel_size")
        self.strides = normalize_tuple(strides, self.rank, f"{where} strides")
        self.dilation_rate = normalize_tuple(dilation_rate, self.rank, f"{where} dilation_rate")
        self.padding = normalize_padding(padding, self.rank, where, allow_causal=self.rank == 1)
        self.data_format = check_data_format(data_format, where)
        self.groups = int(groups)
        if self.groups <= 0 or self.filters % self.groups:
            raise InputError(f"{where}: filters ({self.filters}) must be a positive multiple of groups ({groups})")
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)
        self.use_bias = bool(use_bias)
        self.input_spec = InputSpec(ndim=self.rank + 2)

    def build(self, input_shape):
        channels = input_shape[self._channel_axis()]
        if channels is None:
            raise ShapeError(
                f"{self._where()}: the channel axis of the input must be known, got shape {shape_str(input_shape)}"
            )
        if channels % self.groups:
            raise ShapeError(
                f"{self._where()}: groups={self.groups} does not divide the "
                f"{channels} input channels (shape {shape_str(input_shape)})"
            )
        self.add_weight("kernel", (*self.kernel_size, channels // self.groups, self.filters), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (self.filters,), "zeros")
        self.input_spec = InputSpec(ndim=self.rank + 2, axes={self._channel_axis(): channels})

    def compute_output_shape(self, input_shape):
        sizes = self._spatial_sizes(input_shape)
        out = []
        for a, (n, k, s, d) in enumerate(zip(sizes, self.kernel_size, self.strides, self.dilation_rate)):
            out.append(None if n is None else window_out(n, k, s, d, axis_pads(self.padding, n, k, s, d, a)))
        return self._out_shape(input_shape, out, self.filters)

    def call(self, x):
        x = self._to_nhwc(x)
        sizes = x.shape[1:3] if self.rank == 2 else x.shape[2:3]
        pads = self._pads_hw(sizes, self.kernel_size, self.strides, self.dilation_rate)
        self._check_output(x, pads)
        kernel = self.kernel if self.rank == 2 else self.kernel[None]
        y = self.ops.conv2d(
            x,
            kernel,
            self.bias if self.use_bias else None,
            self._hw(self.strides),
            pads,
            self._hw(self.dilation_rate),
            self.groups,
            self.activation,
            self._alpha,
        )
        return self._from_nhwc(y)

    def bind(self, ops, x):
        # channels_last: the input is the kernel's NHWC (1-D: at height 1) with no copy
        if self.data_format == "channels_first" or type(x) is not np.ndarray:
            return None
        x4 = self._to_nhwc(x)
        pads = self._pads_hw(
            x4.shape[1:3] if self.rank == 2 else x4.shape[2:3], self.kernel_size, self.strides, self.dilation_rate
        )
        self._check_output(x4, pads)
        kernel = self.kernel if self.rank == 2 else self.kernel[None]
        run = ops.conv2d_plan(
            x4.shape,
            kernel,
            self.bias if self.use_bias else None,
            self._hw(self.strides),
            pads,
            self._hw(self.dilation_rate),
            self.groups,
            self.activation,
            self._alpha,
        )
        if self.rank == 1:
            shape_4d = x4.shape
            conv = run

            def run(x):
                y = conv(x.reshape(shape_4d))
                return y.reshape(y.shape[0], y.shape[2], y.shape[3])

        return self._while_same(run, ("kernel", "bias") if self.use_bias else ("kernel",))

    def _check_output(self, x_nhwc, pads):
        kh, kw = self._hw(self.kernel_size)
        dh, dw = self._hw(self.dilation_rate)
        for n, k, d, (a, b) in ((x_nhwc.shape[1], kh, dh, pads[0]), (x_nhwc.shape[2], kw, dw, pads[1])):
            if padded_span(n, k, d, (a, b)) < 0:
                raise ShapeError(
                    f"{self._where()}: input of spatial size {tuple(x_nhwc.shape[1:3])} "
                    f"is smaller than the (dilated) kernel {self.kernel_size} after padding"
                )


class Conv1D(_Conv):
    """1-D convolution over (batch, steps, channels) (or channels_first (batch, channels, steps)).

    Parameters
    ----------
    filters : int
    kernel_size, strides, dilation_rate : int or (int,)
    padding : "valid", "same", "causal" or explicit (before, after)
    data_format : "channels_last" (default) or "channels_first"
    groups : int
        Channels are split into ``groups``; both channel counts must be multiples of it.
    activation : str, optional
    use_bias : bool

    Shape
    -----
    (batch, steps, channels) -> (batch, new_steps, filters). Weights: kernel
    (kernel_size, channels / groups, filters), bias (filters,).
    """

    rank = 1

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="valid",
        data_format=None,
        dilation_rate=1,
        groups=1,
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(
            filters, kernel_size, strides, padding, data_format, dilation_rate, groups, activation, use_bias, **kwargs
        )


class Conv2D(_Conv):
    """2-D convolution over (batch, rows, cols, channels) (or channels_first).

    Parameters
    ----------
    filters : int
    kernel_size, strides, dilation_rate : int or (int, int)
    padding : "valid", "same" or explicit (int, (rows, cols) or ((top, bottom), (left, right)))
    data_format : "channels_last" (default) or "channels_first"
    groups : int
    activation : str, optional
    use_bias : bool

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, filters). Weights: kernel
    (kh, kw, channels / groups, filters), bias (filters,).
    """

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        data_format=None,
        dilation_rate=(1, 1),
        groups=1,
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(
            filters, kernel_size, strides, padding, data_format, dilation_rate, groups, activation, use_bias, **kwargs
        )


class DepthwiseConv2D(SpatialLayer):
    """Depthwise 2-D convolution: each input channel convolved with ``depth_multiplier`` filters.

    Output channel ``c * depth_multiplier + m`` is channel c convolved with filter m.

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, channels * depth_multiplier).
    Weights: kernel (kh, kw, channels, depth_multiplier), bias (channels * depth_multiplier,).
    """

    config_keys: ClassVar[tuple[str, ...]] = (
        "kernel_size",
        "strides",
        "padding",
        "depth_multiplier",
        "data_format",
        "dilation_rate",
        "activation",
        "use_bias",
    )

    def __init__(
        self,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        depth_multiplier=1,
        data_format=None,
        dilation_rate=(1, 1),
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        kwargs.pop("depthwise_initializer", None)
        super().__init__(**kwargs)
        where = self._where()
        self.kernel_size = normalize_tuple(kernel_size, 2, f"{where} kernel_size")
        self.strides = normalize_tuple(strides, 2, f"{where} strides")
        self.dilation_rate = normalize_tuple(dilation_rate, 2, f"{where} dilation_rate")
        self.padding = normalize_padding(padding, 2, where)
        self.data_format = check_data_format(data_format, where)
        self.depth_multiplier = int(depth_multiplier)
        if self.depth_multiplier <= 0:
            raise InputError(f"{where}: depth_multiplier must be positive, got {depth_multiplier}")
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)
        self.use_bias = bool(use_bias)
        self.input_spec = InputSpec(ndim=4)

    def _channels(self, input_shape):
        channels = input_shape[self._channel_axis()]
        if channels is None:
            raise ShapeError(
                f"{self._where()}: the channel axis of the input must be known, got shape {shape_str(input_shape)}"
            )
        return channels

    def build(self, input_shape):
        channels = self._channels(input_shape)
        self.add_weight("kernel", (*self.kernel_size, channels, self.depth_multiplier), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (channels * self.depth_multiplier,), "zeros")
        self.input_spec = InputSpec(ndim=4, axes={self._channel_axis(): channels})

    def compute_output_shape(self, input_shape):
        sizes = self._spatial_sizes(input_shape)
        out = [
            None if n is None else window_out(n, k, s, d, axis_pads(self.padding, n, k, s, d, a))
            for a, (n, k, s, d) in enumerate(zip(sizes, self.kernel_size, self.strides, self.dilation_rate))
        ]
        return self._out_shape(input_shape, out, self._channels(input_shape) * self.depth_multiplier)

    def _depthwise(self, x_nhwc, kernel, bias, activation, alpha):
        pads = self._pads_hw(x_nhwc.shape[1:3], self.kernel_size, self.strides, self.dilation_rate)
        _Conv._check_output(self, x_nhwc, pads)
        return self.ops.depthwise_conv2d(
            x_nhwc, kernel, bias, self.strides, pads, self.dilation_rate, activation, alpha
        )

    def call(self, x):
        y = self._depthwise(
            self._to_nhwc(x), self.kernel, self.bias if self.use_bias else None, self.activation, self._alpha
        )
        return self._from_nhwc(y)


class SeparableConv2D(DepthwiseConv2D):
    """Depthwise convolution followed by a 1x1 (pointwise) convolution to ``filters`` channels.

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, filters). Weights (Keras order):
    depthwise_kernel (kh, kw, channels, depth_multiplier), pointwise_kernel
    (1, 1, channels * depth_multiplier, filters), bias (filters,).
    """

    config_keys = ("filters", *DepthwiseConv2D.config_keys)

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        data_format=None,
        dilation_rate=(1, 1),
        depth_multiplier=1,
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        kwargs.pop("pointwise_initializer", None)
        super().__init__(
            kernel_size, strides, padding, depth_multiplier, data_format, dilation_rate, activation, use_bias, **kwargs
        )
        self.filters = int(filters)
        if self.filters <= 0:
            raise InputError(f"{self._where()}: filters must be positive, got {filters}")

    def build(self, input_shape):
        channels = self._channels(input_shape)
        m = self.depth_multiplier
        self.add_weight("depthwise_kernel", (*self.kernel_size, channels, m), "glorot_uniform")
        self.add_weight("pointwise_kernel", (1, 1, channels * m, self.filters), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (self.filters,), "zeros")
        self.input_spec = InputSpec(ndim=4, axes={self._channel_axis(): channels})

    def compute_output_shape(self, input_shape):
        shape = list(super().compute_output_shape(input_shape))
        shape[self._channel_axis()] = self.filters
        return tuple(shape)

    def call(self, x):
        h = self._depthwise(self._to_nhwc(x), self.depthwise_kernel, None, "linear", 0.0)
        y = self.ops.conv2d(
            h,
            self.pointwise_kernel,
            self.bias if self.use_bias else None,
            activation=self.activation,
            alpha=self._alpha,
        )
        return self._from_nhwc(y)


def transpose_pads(size, k, s, d, padding, output_padding):
    """(crop before, output length) of one axis of a Keras transposed convolution.

    Keras pads the stride-dilated input by (left, right) and runs a valid convolution (its JAX
    rule, shared by every backend); the transposed convolution's full output is then cropped
    by ``k_eff - 1 - left``.
    """
    k_eff = dilated_size(k, d)
    if padding == "valid":
        op = max(k_eff, s) - k_eff if output_padding is None else output_padding
        left, right = k_eff - 1, k_eff - 1 + op
    elif padding == "same":
        pad_len = s + k_eff - 2 if output_padding is None else k_eff + k_eff % 2 - 2 + output_padding
        left = min(pad_len // 2 + pad_len % 2, k_eff - 1)
        right = pad_len - left
    else:  # explicit (before, after) cropping, torch-style: out = (n-1) s - a - b + k_eff + op
        a, b = padding
        op = output_padding or 0
        return a, transposed_out(size, k, s, d, (a, b), op)
    return k_eff - 1 - left, (size - 1) * s + 1 + left + right - k_eff + 1


class Conv2DTranspose(SpatialLayer):
    """Transposed 2-D convolution (the gradient of Conv2D), Keras semantics for padding and
    output_padding.

    Parameters
    ----------
    filters : int
    kernel_size, strides, dilation_rate : int or (int, int)
    padding : "valid", "same", or explicit per-side cropping (torch's ``padding``)
    output_padding : int or (int, int), optional
        Extra rows/columns at the end of the output (must be smaller than the stride or dilation).

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, filters); with padding "valid"
    and no output_padding new_rows = (rows - 1) * stride + max(k_eff, stride). Weights: kernel
    (kh, kw, filters, channels), bias (filters,).
    """

    config_keys = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "output_padding",
        "data_format",
        "dilation_rate",
        "activation",
        "use_bias",
    )

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        output_padding=None,
        data_format=None,
        dilation_rate=(1, 1),
        activation=None,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        where = self._where()
        self.filters = int(filters)
        if self.filters <= 0:
            raise InputError(f"{where}: filters must be positive, got {filters}")
        self.kernel_size = normalize_tuple(kernel_size, 2, f"{where} kernel_size")
        self.strides = normalize_tuple(strides, 2, f"{where} strides")
        self.dilation_rate = normalize_tuple(dilation_rate, 2, f"{where} dilation_rate")
        self.padding = normalize_padding(padding, 2, where)
        if output_padding is None:
            self.output_padding = None
        else:
            op = (
                (int(output_padding),) * 2
                if isinstance(output_padding, (int, np.integer))
                else tuple(int(v) for v in output_padding)
            )
            if len(op) != 2 or any(
                o < 0 or (o >= s and o >= d) for o, s, d in zip(op, self.strides, self.dilation_rate)
            ):
                raise InputError(
                    f"{where}: output_padding {output_padding!r} must be 2 values each "
                    "smaller than the stride or the dilation"
                )
            self.output_padding = op
        self.data_format = check_data_format(data_format, where)
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)
        self.use_bias = bool(use_bias)
        self.input_spec = InputSpec(ndim=4)

    def build(self, input_shape):
        channels = input_shape[self._channel_axis()]
        if channels is None:
            raise ShapeError(
                f"{self._where()}: the channel axis of the input must be known, got shape {shape_str(input_shape)}"
            )
        self.add_weight("kernel", (*self.kernel_size, self.filters, channels), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (self.filters,), "zeros")
        self.input_spec = InputSpec(ndim=4, axes={self._channel_axis(): channels})

    def _geometry(self, sizes):
        crops, outs = [], []
        for a, (n, k, s, d) in enumerate(zip(sizes, self.kernel_size, self.strides, self.dilation_rate)):
            pad = self.padding if isinstance(self.padding, str) else self.padding[a]
            op = None if self.output_padding is None else self.output_padding[a]
            if n is None:
                crops.append(None)
                outs.append(None)
                continue
            c, o = transpose_pads(n, k, s, d, pad, op)
            crops.append(c)
            outs.append(o)
        return crops, outs

    def compute_output_shape(self, input_shape):
        _, outs = self._geometry(self._spatial_sizes(input_shape))
        return self._out_shape(input_shape, outs, self.filters)

    def call(self, x):
        x = self._to_nhwc(x)
        crops, outs = self._geometry(x.shape[1:3])
        if min(outs) <= 0:
            raise ShapeError(
                f"{self._where()}: padding {self.padding} leaves an empty output for input size {tuple(x.shape[1:3])}"
            )
        w_hwio = derived(self.kernel, "hwoi->hwio", lambda k: np.ascontiguousarray(k.transpose(0, 1, 3, 2)))
        y = self.ops.conv_transpose2d(
            x,
            w_hwio,
            self.bias if self.use_bias else None,
            self.strides,
            tuple(crops),
            tuple(outs),
            self.dilation_rate,
            1,
            self.activation,
            self._alpha,
        )
        return self._from_nhwc(y)
