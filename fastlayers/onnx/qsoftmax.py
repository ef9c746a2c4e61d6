"""com.microsoft QLinearSoftmax: softmax of 8-bit values to 8-bit values, in onnxruntime's
arithmetic (``contrib_ops/cpu/quantization/qlinear_softmax.cc``), bit for bit.

onnxruntime does not dequantize. It looks each value up in a table of 256 float32
exponentials, ``table[i] = float32(exp((i - 255 + shift) * x_scale))`` computed in double,
with ``shift = max(0, log(FLT_MAX / D) - 5) / x_scale`` (D the length of the reduced axis, so
that a row's sum stays finite); a row's values are looked up shifted so that its maximum lands
on index 255 (int8: ``uint8(x + 127 - max)``, the table stored at ``uint8(i - 128)``). The sum is
taken in float32, left to right; then ``y = rint((table[x] * floor(1 / y_scale)) / sum) +
y_zero_point`` (float32 operations), capped at the type's maximum (the sum is at least the
largest value, so nothing falls below the zero point). x_zero_point is not read. Attribute ``opset``
(the Softmax version the node replaces): below 13 the softmax runs over the dimensions from
``axis`` flattened, from 13 over ``axis`` alone.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError, ShapeError
from .quant import MS, _scale
from .records import AXIS, INT, A, Family

#: This family's operator records (``ops.RECORDS`` gathers the families): QLinearSoftmax.
FAMILY = Family("quantized softmax")

_FLT_MAX = float(np.finfo(np.float32).max)


def exp_table(x_scale, length, signed):
    """The 256 float32 exponentials onnxruntime looks values up in (module docstring), laid out
    by uint8 index (int8 tables at uint8(i - 128))."""
    shift = np.log(np.float32(_FLT_MAX) / np.float32(length))  # a float32 quotient, its log in double
    shift = max(0.0, float(shift) - 5.0) / float(x_scale)
    i = np.arange(256, dtype=np.float64)
    values = np.exp((i - 255.0 + shift) * float(x_scale)).astype(np.float32)
    index = ((np.arange(256) - 128) & 255) if signed else np.arange(256)
    table = np.empty(256, np.float32)
    table[index] = values
    return table


def _qlinear_softmax(inputs, attrs, opset):
    what = "QLinearSoftmax"
    x, x_scale, _x_zp, y_scale = (np.asarray(v) if v is not None else None for v in inputs[:4])
    y_zp = np.asarray(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else np.zeros((), x.dtype)
    if x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise InputError(f"{what}: input of type {x.dtype}, expected uint8 or int8")
    if y_zp.dtype != x.dtype or y_zp.size != 1:
        raise InputError(
            f"{what}: y_zero_point of type {y_zp.dtype} and shape {y_zp.shape}; expected a "
            f"{x.dtype} scalar (the input's type)"
        )
    for name, v in (("x_scale", x_scale), ("y_scale", y_scale)):
        if v is None or v.size != 1:
            raise ShapeError(f"{what}: {name} of shape {None if v is None else v.shape}, expected a scalar")
    if x.ndim == 0:
        raise ShapeError(f"{what}: a scalar input; expected a tensor of rank >= 1")
    version = attrs.get("opset")
    axis = attrs.get("axis", 1 if version < 13 else -1)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{what}: axis {axis} for an input of rank {x.ndim}")
    axis %= x.ndim
    moved = x if version < 13 else np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, int(np.prod(x.shape[axis:]))) if version < 13 else moved.reshape(-1, x.shape[axis])
    if rows.size == 0:
        return [np.empty(x.shape, x.dtype)]
    signed = x.dtype == np.int8
    table = exp_table(_scale(x_scale, what).reshape(()), rows.shape[1], signed)
    top = rows.max(axis=1, keepdims=True).astype(np.int32)
    index = ((rows.astype(np.int32) + 127 - top) & 255) if signed else rows.astype(np.int32) + (255 - top)
    e = table[index]
    total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1:]  # left to right, in float32
    y_steps = np.floor(np.float32(1.0) / _scale(y_scale, what).reshape(()))
    q = np.rint((e * y_steps) / total).astype(np.int64) + int(y_zp.reshape(()))
    y = np.minimum(q, 127 if signed else 255).astype(x.dtype)
    y = y.reshape(moved.shape)
    return [y if version < 13 else np.moveaxis(y, -1, axis)]


FAMILY.add(
    "QLinearSoftmax",
    _qlinear_softmax,
    inputs=(4, 5),
    attrs={"axis": AXIS, "opset": A(INT, 1, 10_000)},
    required=("opset",),
    domain=MS,
)
