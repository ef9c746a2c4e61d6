"""Composite blocks built from the convolution and pooling primitives: Inception (GoogLeNet v1)
and Network-in-Network. Each block owns its weights (named per branch) and is saved like any layer.
"""

from __future__ import annotations

import numpy as np

from ..backends.derived import derived_from
from ..errors import InputError, ShapeError
from ..geometry import same_pads, window_out
from .base import InputSpec, shape_str, unique_name
from .convolutional import (
    SpatialLayer,
    axis_pads,
    check_data_format,
    normalize_padding,
    normalize_tuple,
)
from .core import _DEFAULT_ALPHA, activation_name

_NO_PAD = ((0, 0), (0, 0))


def _positive(value, what):
    v = int(value)
    if v <= 0:
        raise InputError(f"{what} must be positive, got {value!r}")
    return v


class InceptionBlock(SpatialLayer):
    """GoogLeNet's Inception module: four branches concatenated on the channel axis.

    1. 1x1 convolution to ``filters_1x1``;
    2. 1x1 reduction to ``filters_3x3_reduce``, then 3x3 "same" convolution to ``filters_3x3``;
    3. 1x1 reduction to ``filters_5x5_reduce``, then 5x5 "same" convolution to ``filters_5x5``;
    4. 3x3 max pooling (stride 1, "same"), then 1x1 convolution to ``filters_pool_proj``.

    Every convolution has a bias and ``activation`` (relu by default). The three 1x1
    convolutions of the input run as one GEMM.

    Weights, in order (kernels HWIO as Keras's Conv2D): ``b1_kernel`` (1, 1, C, f1), ``b1_bias``,
    ``b2_reduce_kernel`` (1, 1, C, f3r), ``b2_reduce_bias``, ``b2_kernel`` (3, 3, f3r, f3),
    ``b2_bias``, ``b3_reduce_kernel`` (1, 1, C, f5r), ``b3_reduce_bias``, ``b3_kernel``
    (5, 5, f5r, f5), ``b3_bias``, ``b4_kernel`` (1, 1, C, fp), ``b4_bias``. The block equals a
    Keras graph of Conv2D(padding="same") / MaxPooling2D(3, 1, "same") / Concatenate layers with
    these weights in this order.

    Shape
    -----
    (batch, rows, cols, C) -> (batch, rows, cols, f1 + f3 + f5 + fp).
    """

    config_keys = (
        "filters_1x1",
        "filters_3x3_reduce",
        "filters_3x3",
        "filters_5x5_reduce",
        "filters_5x5",
        "filters_pool_proj",
        "activation",
        "data_format",
    )

    def __init__(
        self,
        filters_1x1,
        filters_3x3_reduce,
        filters_3x3,
        filters_5x5_reduce,
        filters_5x5,
        filters_pool_proj,
        activation="relu",
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        w = self._where()
        self.filters_1x1 = _positive(filters_1x1, f"{w} filters_1x1")
        self.filters_3x3_reduce = _positive(filters_3x3_reduce, f"{w} filters_3x3_reduce")
        self.filters_3x3 = _positive(filters_3x3, f"{w} filters_3x3")
        self.filters_5x5_reduce = _positive(filters_5x5_reduce, f"{w} filters_5x5_reduce")
        self.filters_5x5 = _positive(filters_5x5, f"{w} filters_5x5")
        self.filters_pool_proj = _positive(filters_pool_proj, f"{w} filters_pool_proj")
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)
        self.data_format = check_data_format(data_format, w)
        self.input_spec = InputSpec(ndim=4)

    def build(self, input_shape):
        c = input_shape[self._channel_axis()]
        if c is None:
            raise ShapeError(f"{self._where()}: the channel axis must be known, got {shape_str(input_shape)}")
        for name, shape in (
            ("b1", (1, 1, c, self.filters_1x1)),
            ("b2_reduce", (1, 1, c, self.filters_3x3_reduce)),
            ("b2", (3, 3, self.filters_3x3_reduce, self.filters_3x3)),
            ("b3_reduce", (1, 1, c, self.filters_5x5_reduce)),
            ("b3", (5, 5, self.filters_5x5_reduce, self.filters_5x5)),
            ("b4", (1, 1, c, self.filters_pool_proj)),
        ):
            self.add_weight(f"{name}_kernel", shape, "glorot_uniform")
            self.add_weight(f"{name}_bias", shape[-1:], "zeros")
        self.input_spec = InputSpec(ndim=4, axes={self._channel_axis(): c})

    def compute_output_shape(self, input_shape):
        out = self.filters_1x1 + self.filters_3x3 + self.filters_5x5 + self.filters_pool_proj
        return self._out_shape(input_shape, self._spatial_sizes(input_shape), out)

    def call(self, x):
        ops, act, alpha = self.ops, self.activation, self._alpha
        x = self._to_nhwc(x)
        n, h, w, _ = x.shape
        f1, f3r = self.filters_1x1, self.filters_3x3_reduce
        # the three 1x1 convolutions of x as one GEMM
        k = derived_from(
            (self.b1_kernel, self.b2_reduce_kernel, self.b3_reduce_kernel),
            "inception-1x1",
            lambda *ks: np.concatenate(ks, axis=-1),
        )
        b = derived_from(
            (self.b1_bias, self.b2_reduce_bias, self.b3_reduce_bias), "inception-1x1", lambda *bs: np.concatenate(bs)
        )
        y = ops.conv2d(x, k, b, activation=act, alpha=alpha)
        b1 = ops.take(y, (..., slice(0, f1)))
        r3 = ops.take(y, (..., slice(f1, f1 + f3r)))
        r5 = ops.take(y, (..., slice(f1 + f3r, None)))
        b2 = ops.conv2d(
            r3, self.b2_kernel, self.b2_bias, pads=(same_pads(h, 3, 1), same_pads(w, 3, 1)), activation=act, alpha=alpha
        )
        b3 = ops.conv2d(
            r5, self.b3_kernel, self.b3_bias, pads=(same_pads(h, 5, 1), same_pads(w, 5, 1)), activation=act, alpha=alpha
        )
        pooled = ops.pool2d(x, "max", (3, 3), (1, 1), ((1, 1), (1, 1)), (h, w))
        b4 = ops.conv2d(pooled, self.b4_kernel, self.b4_bias, activation=act, alpha=alpha)
        return self._from_nhwc(ops.concatenate([b1, b2, b3, b4], -1))


class NiNBlock(SpatialLayer):
    """Network-in-Network block: a convolution followed by 1x1 convolutions (the "mlpconv"),
    each with a bias and ``activation``, ending in global average pooling (``global_pool``).

    Parameters
    ----------
    filters : int
        Channels of the first convolution.
    kernel_size, strides : int or (int, int)
    padding : "valid", "same" or explicit, as Conv2D
    mlp_filters : list of int, default (filters, filters)
        Output channels of the 1x1 convolutions.
    activation : str, default "relu"
    global_pool : bool, default True
        End with global average pooling (the NiN classifier head); False keeps the feature map.

    Weights
    -------
    In order: ``conv_kernel`` (kh, kw, C, filters), ``conv_bias``, then ``mlp{i}_kernel``
    (1, 1, c_in, mlp_filters[i]) and ``mlp{i}_bias`` for each 1x1 convolution.

    Shape
    -----
    (batch, rows, cols, C) -> (batch, mlp_filters[-1]) (global_pool) or
    (batch, new_rows, new_cols, mlp_filters[-1]).
    """

    config_keys = (
        "filters",
        "kernel_size",
        "strides",
        "padding",
        "mlp_filters",
        "activation",
        "global_pool",
        "data_format",
    )

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        mlp_filters=None,
        activation="relu",
        global_pool=True,
        data_format=None,
        **kwargs,
    ):
        if kwargs.get("name") is None:
            kwargs["name"] = unique_name("nin_block")  # not snake_case's "ni_n_block"
        super().__init__(**kwargs)
        w = self._where()
        self.filters = _positive(filters, f"{w} filters")
        self.kernel_size = normalize_tuple(kernel_size, 2, f"{w} kernel_size")
        self.strides = normalize_tuple(strides, 2, f"{w} strides")
        self.padding = normalize_padding(padding, 2, w)
        mlp = (self.filters, self.filters) if mlp_filters is None else tuple(mlp_filters)
        self.mlp_filters = tuple(_positive(f, f"{w} mlp_filters") for f in mlp)
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)
        self.global_pool = bool(global_pool)
        self.data_format = check_data_format(data_format, w)
        self.input_spec = InputSpec(ndim=4)

    def build(self, input_shape):
        c = input_shape[self._channel_axis()]
        if c is None:
            raise ShapeError(f"{self._where()}: the channel axis must be known, got {shape_str(input_shape)}")
        self.add_weight("conv_kernel", (*self.kernel_size, c, self.filters), "glorot_uniform")
        self.add_weight("conv_bias", (self.filters,), "zeros")
        prev = self.filters
        for i, f in enumerate(self.mlp_filters):
            self.add_weight(f"mlp{i}_kernel", (1, 1, prev, f), "glorot_uniform")
            self.add_weight(f"mlp{i}_bias", (f,), "zeros")
            prev = f
        self.input_spec = InputSpec(ndim=4, axes={self._channel_axis(): c})

    def _conv_geometry(self, sizes):
        pads = tuple(
            axis_pads(self.padding, n, k, s, 1, a)
            for a, (n, k, s) in enumerate(zip(sizes, self.kernel_size, self.strides))
        )
        outs = [
            None if n is None else window_out(n, k, s, 1, p)
            for n, k, s, p in zip(sizes, self.kernel_size, self.strides, pads)
        ]
        return pads, outs

    def compute_output_shape(self, input_shape):
        last = self.mlp_filters[-1] if self.mlp_filters else self.filters
        if self.global_pool:
            return (input_shape[0], last)
        _, outs = self._conv_geometry(self._spatial_sizes(input_shape))
        return self._out_shape(input_shape, outs, last)

    def call(self, x):
        ops, act, alpha = self.ops, self.activation, self._alpha
        x = self._to_nhwc(x)
        pads, outs = self._conv_geometry(x.shape[1:3])
        if min(outs) <= 0:
            raise ShapeError(
                f"{self._where()}: input of spatial size {tuple(x.shape[1:3])} is smaller "
                f"than the kernel {self.kernel_size} after padding"
            )
        h = ops.conv2d(x, self.conv_kernel, self.conv_bias, self.strides, pads, activation=act, alpha=alpha)
        for i in range(len(self.mlp_filters)):
            h = ops.conv2d(
                h, getattr(self, f"mlp{i}_kernel"), getattr(self, f"mlp{i}_bias"), activation=act, alpha=alpha
            )
        if self.global_pool:
            return ops.global_pool(h, "avg", (1, 2))
        return self._from_nhwc(h)
