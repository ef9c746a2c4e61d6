"""Zero padding and cropping of the spatial axes (1D: steps; 2D: rows and columns)."""

from __future__ import annotations

import inspect

from ..errors import ShapeError
from .base import InputSpec, Layer, shape_str


def _pairs(value, n, what):
    """Keras's padding/cropping argument as n (before, after) pairs of ints."""
    if isinstance(value, int):
        return ((value, value),) * n
    value = tuple(value)
    if n == 1 and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value,)
    if len(value) == n and all(isinstance(v, int) for v in value):
        return tuple((v, v) for v in value)
    if len(value) == n and all(len(tuple(v)) == 2 for v in value):
        return tuple((int(a), int(b)) for a, b in value)
    raise ValueError(f"{what}: expected an int, {n} ints or {n} (before, after) pairs, got {value!r}")


class _Spatial(Layer):
    """Shared shape logic: ``_rank`` spatial axes, located by data_format."""

    _rank = 1

    def __init__(self, amount, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.data_format = data_format or "channels_last"
        if self.data_format not in ("channels_last", "channels_first"):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: data_format must be "
                f"channels_last or channels_first, got {data_format!r}"
            )
        self._amount = _pairs(amount, self._rank, f"{type(self).__name__} {self.name!r}")
        self.input_spec = InputSpec(ndim=self._rank + 2)

    def _spatial_axes(self):
        first = 2 if self.data_format == "channels_first" else 1
        return range(first, first + self._rank)

    def get_config(self):
        config = super().get_config()
        config[self._amount_key] = [list(p) for p in self._amount]
        if "data_format" in inspect.signature(type(self).__init__).parameters:
            config["data_format"] = self.data_format
        return config


class _ZeroPadding(_Spatial):
    _amount_key = "padding"

    def compute_output_shape(self, input_shape):
        out = list(input_shape)
        for axis, (a, b) in zip(self._spatial_axes(), self._amount):
            out[axis] = None if out[axis] is None else out[axis] + a + b
        return tuple(out)

    def call(self, x):
        pad = [(0, 0)] * x.ndim
        for axis, p in zip(self._spatial_axes(), self._amount):
            pad[axis] = p
        return self.ops.pad(x, pad)


class _Cropping(_Spatial):
    _amount_key = "cropping"

    def compute_output_shape(self, input_shape):
        out = list(input_shape)
        for axis, (a, b) in zip(self._spatial_axes(), self._amount):
            if out[axis] is not None:
                if a + b >= out[axis]:
                    raise ShapeError(
                        f"{type(self).__name__} {self.name!r}: cropping {(a, b)} leaves "
                        f"nothing of axis {axis} in shape {shape_str(input_shape)}"
                    )
                out[axis] -= a + b
        return tuple(out)

    def call(self, x):
        shape = tuple(x.shape)
        self.compute_output_shape(shape)
        index = [slice(None)] * len(shape)
        for axis, (a, b) in zip(self._spatial_axes(), self._amount):
            index[axis] = slice(a, shape[axis] - b)
        return self.ops.take(x, tuple(index))


class ZeroPadding1D(_ZeroPadding):
    """Pad the steps axis of (batch, steps, features) with zeros: ``padding`` int or (before, after)."""

    def __init__(self, padding=1, data_format=None, **kwargs):
        super().__init__(padding, data_format, **kwargs)


class ZeroPadding2D(_ZeroPadding):
    """Pad rows and columns with zeros: int, (rows, cols) or ((top, bottom), (left, right))."""

    _rank = 2

    def __init__(self, padding=(1, 1), data_format=None, **kwargs):
        super().__init__(padding, data_format, **kwargs)


class Cropping1D(_Cropping):
    """Crop the steps axis of (batch, steps, features): ``cropping`` int or (before, after)."""

    def __init__(self, cropping=(1, 1), **kwargs):
        super().__init__(cropping, **kwargs)


class Cropping2D(_Cropping):
    """Crop rows and columns: int, (rows, cols) or ((top, bottom), (left, right))."""

    _rank = 2

    def __init__(self, cropping=((0, 0), (0, 0)), data_format=None, **kwargs):
        super().__init__(cropping, data_format, **kwargs)
