"""Pooling, resizing and local response normalization layers (Keras names and options), plus
RoI max pooling (Fast R-CNN / torchvision.ops.roi_pool semantics, no Keras counterpart).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError, ShapeError, UnsupportedError
from ..geometry import window_out
from .base import InputSpec
from .convolutional import (
    SpatialLayer,
    axis_pads,
    check_data_format,
    normalize_padding,
    normalize_tuple,
)


class _Pool(SpatialLayer):
    kind = "max"
    config_keys = ("pool_size", "strides", "padding", "data_format")

    def __init__(self, pool_size, strides=None, padding="valid", data_format=None, **kwargs):
        super().__init__(**kwargs)
        where = self._where()
        self.pool_size = normalize_tuple(pool_size, self.rank, f"{where} pool_size")
        self.strides = self.pool_size if strides is None else normalize_tuple(strides, self.rank, f"{where} strides")
        # explicit per-side padding is an extension of Keras (ONNX / torch pooling pads):
        # padded cells are ignored by max and not counted by average
        self.padding = normalize_padding(padding, self.rank, where)
        self.data_format = check_data_format(data_format, where)
        self.input_spec = InputSpec(ndim=self.rank + 2)

    def compute_output_shape(self, input_shape):
        sizes = self._spatial_sizes(input_shape)
        out = [
            None if n is None else window_out(n, k, s, 1, axis_pads(self.padding, n, k, s, 1, a))
            for a, (n, k, s) in enumerate(zip(sizes, self.pool_size, self.strides))
        ]
        return self._out_shape(input_shape, out, input_shape[self._channel_axis()])

    def call(self, x):
        x = self._to_nhwc(x)
        y = self.ops.pool2d(x, self.kind, *self._window(x.shape), (1, 1), False)
        return self._from_nhwc(y)

    def bind(self, ops, x):
        if type(x) is not np.ndarray:
            return None
        window, kind, pool2d = self._window(self._to_nhwc(x).shape), self.kind, ops.pool2d
        if self.data_format != "channels_first" and self.rank == 2:  # NHWC already
            return lambda x: pool2d(x, kind, *window, (1, 1), False)
        return lambda x: self._from_nhwc(pool2d(self._to_nhwc(x), kind, *window, (1, 1), False))

    def _window(self, shape_nhwc):
        """(pool, strides, pads, out_hw) as (h, w) pairs for an NHWC input of ``shape_nhwc``."""
        ones = (1,) * self.rank
        sizes = shape_nhwc[1:3]
        pads = self._pads_hw(sizes if self.rank == 2 else sizes[1:], self.pool_size, self.strides, ones)
        pool, strides = self._hw(self.pool_size), self._hw(self.strides)
        out_hw = tuple(window_out(n, k, s, 1, p) for n, k, s, p in zip(sizes, pool, strides, pads))
        if min(out_hw) <= 0:
            raise ShapeError(
                f"{self._where()}: input of spatial size {tuple(sizes)} is smaller than the pool {self.pool_size}"
            )
        return pool, strides, pads, out_hw


class MaxPooling1D(_Pool):
    """Max over windows of ``pool_size`` steps every ``strides`` (default pool_size).

    ``padding`` is "valid", "same" or (an extension of Keras) explicit (before, after).

    Shape
    -----
    (batch, steps, channels) -> (batch, new_steps, channels); "same": new_steps = ceil(steps / strides).
    """

    rank = 1

    def __init__(self, pool_size=2, strides=None, padding="valid", data_format=None, **kwargs):
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


class AveragePooling1D(MaxPooling1D):
    """Mean over windows of ``pool_size`` steps; "same" padding is not counted (as Keras).

    Shape
    -----
    (batch, steps, channels) -> (batch, new_steps, channels).
    """

    kind = "avg"

    def __init__(self, pool_size, strides=None, padding="valid", data_format=None, **kwargs):
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


class MaxPooling2D(_Pool):
    """Max over ``pool_size`` windows every ``strides`` (default pool_size).

    ``padding`` is "valid", "same" or (an extension of Keras) explicit, as Conv2D's.

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, channels).
    """

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", data_format=None, **kwargs):
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


class AveragePooling2D(MaxPooling2D):
    """Mean over ``pool_size`` windows; "same" padding is not counted (as Keras).

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, new_rows, new_cols, channels).
    """

    kind = "avg"

    def __init__(self, pool_size, strides=None, padding="valid", data_format=None, **kwargs):
        super().__init__(pool_size, strides, padding, data_format, **kwargs)


class _GlobalPool(SpatialLayer):
    kind = "max"
    config_keys = ("data_format", "keepdims")

    def __init__(self, data_format=None, keepdims=False, **kwargs):
        super().__init__(**kwargs)
        self.data_format = check_data_format(data_format, self._where())
        self.keepdims = bool(keepdims)
        self.input_spec = InputSpec(ndim=self.rank + 2)

    def _axes(self):
        first = 2 if self.data_format == "channels_first" else 1
        return tuple(range(first, first + self.rank))

    def compute_output_shape(self, input_shape):
        axes = self._axes()
        if self.keepdims:
            return tuple(1 if a in axes else d for a, d in enumerate(input_shape))
        return tuple(d for a, d in enumerate(input_shape) if a not in axes)

    def call(self, x):
        return self.ops.global_pool(x, self.kind, self._axes(), self.keepdims)

    def bind(self, ops, x):
        axes, kind, keepdims, global_pool = self._axes(), self.kind, self.keepdims, ops.global_pool
        return lambda x: global_pool(x, kind, axes, keepdims)


class GlobalMaxPooling1D(_GlobalPool):
    """Max over the steps axis.

    Shape
    -----
    (batch, steps, channels) -> (batch, channels) (keepdims: (batch, 1, channels)).
    """

    rank = 1


class GlobalAveragePooling1D(GlobalMaxPooling1D):
    """Mean over the steps axis.

    Shape
    -----
    (batch, steps, channels) -> (batch, channels) (keepdims: (batch, 1, channels)).
    """

    kind = "avg"


class GlobalMaxPooling2D(_GlobalPool):
    """Max over rows and columns.

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, channels) (keepdims: (batch, 1, 1, channels)).
    """


class GlobalAveragePooling2D(GlobalMaxPooling2D):
    """Mean over rows and columns.

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, channels) (keepdims: (batch, 1, 1, channels)).
    """

    kind = "avg"


class UpSampling2D(SpatialLayer):
    """Repeat rows and columns ``size`` times ("nearest") or resize bilinearly (half-pixel
    centres, as Keras; ``align_corners=True``, an extension of Keras, maps the corner pixels of
    input and output onto each other as torch's ``align_corners=True``).

    Shape
    -----
    (batch, rows, cols, channels) -> (batch, rows * size[0], cols * size[1], channels).
    """

    config_keys = ("size", "data_format", "interpolation", "align_corners")

    def __init__(self, size=(2, 2), data_format=None, interpolation="nearest", align_corners=False, **kwargs):
        super().__init__(**kwargs)
        self.align_corners = bool(align_corners)
        if self.align_corners and interpolation != "bilinear":
            raise InputError(f"{self._where()}: align_corners applies to bilinear interpolation only")
        self.size = normalize_tuple(size, 2, f"{self._where()} size")
        self.data_format = check_data_format(data_format, self._where())
        if interpolation not in ("nearest", "bilinear"):
            raise UnsupportedError(
                f"{self._where()}: interpolation {interpolation!r} is not supported; expected 'nearest' or 'bilinear'"
            )
        self.interpolation = interpolation
        self.input_spec = InputSpec(ndim=4)

    def compute_output_shape(self, input_shape):
        sizes = self._spatial_sizes(input_shape)
        out = [None if n is None else n * s for n, s in zip(sizes, self.size)]
        return self._out_shape(input_shape, out, input_shape[self._channel_axis()])

    def call(self, x):
        x = self._to_nhwc(x)
        out_hw = (x.shape[1] * self.size[0], x.shape[2] * self.size[1])
        return self._from_nhwc(self.ops.upsample2d(x, out_hw, self.interpolation, self.align_corners))


class RoIPooling2D(SpatialLayer):
    """RoI max pooling (Fast R-CNN; torchvision.ops.roi_pool semantics).

    Called on ``[features, rois]``: ``rois`` is (K, 5) rows ``(batch index, x1, y1, x2, y2)`` in
    input-image coordinates; corners are multiplied by ``spatial_scale`` (feature size / image
    size) and rounded, each region is split into a ``pool_size`` grid of bins and each bin
    max-pooled (an empty bin gives 0).

    Shape
    -----
    [(batch, rows, cols, channels), (K, 5)] -> (K, pool_h, pool_w, channels) (channels_first:
    (K, channels, pool_h, pool_w)).
    """

    multi_input = True
    config_keys = ("pool_size", "spatial_scale", "data_format")

    def __init__(self, pool_size=(7, 7), spatial_scale=1.0, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = normalize_tuple(pool_size, 2, f"{self._where()} pool_size")
        self.spatial_scale = float(spatial_scale)
        self.data_format = check_data_format(data_format, self._where())
        self.input_spec = [InputSpec(ndim=4), InputSpec(ndim=2, axes={-1: 5})]

    def compute_output_shape(self, input_shape):
        feats, rois = input_shape
        return self._out_shape((rois[0],), self.pool_size, feats[self._channel_axis()])

    def call(self, inputs):
        feats, rois = inputs
        x = self._to_nhwc(feats)
        rois = self.ops.check_rois(rois, x.shape[0], self._where())
        return self._from_nhwc(self.ops.roi_pool(x, rois, self.pool_size, self.spatial_scale))


class LocalResponseNormalization(SpatialLayer):
    """Local response normalization across channels (AlexNet, Inception v1), TensorFlow's
    ``tf.nn.local_response_normalization`` definition:

    ``y[..., c] = x[..., c] / (bias + alpha * sum_{|c' - c| <= depth_radius} x[..., c']^2)^beta``.

    (torch's LocalResponseNorm(size, alpha_t, beta, k) is depth_radius = (size - 1) / 2,
    alpha = alpha_t / size, bias = k for odd sizes.)

    Shape
    -----
    Any rank >= 2; the channel axis is the last (channels_last) or axis 1; shape unchanged.
    """

    config_keys = ("depth_radius", "bias", "alpha", "beta", "data_format")

    def __init__(self, depth_radius=5, bias=1.0, alpha=1.0, beta=0.5, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.depth_radius = int(depth_radius)
        if self.depth_radius < 0:
            raise InputError(f"{self._where()}: depth_radius must be >= 0, got {depth_radius}")
        self.bias, self.alpha, self.beta = float(bias), float(alpha), float(beta)
        self.data_format = check_data_format(data_format, self._where())
        self.input_spec = InputSpec(min_ndim=2)

    def call(self, x):
        size = 2 * self.depth_radius + 1
        rank = len(x.shape)
        if self.data_format == "channels_first":
            x = self.ops.transpose(x, (0, *range(2, rank), 1))
        y = self.ops.local_response_norm(x, size, self.alpha * size, self.beta, self.bias)
        if self.data_format == "channels_first":
            y = self.ops.transpose(y, (0, rank - 1, *range(1, rank - 1)))
        return y
