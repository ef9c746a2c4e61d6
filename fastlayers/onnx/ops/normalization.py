"""ONNX normalizations: Batch-, Instance-, Layer-, Lp-, Group-, RMS- and MeanVariance-
Normalization (statistics accumulated in float64 where numpy computes them)."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...backends.accumulate import wide_mean, wide_sum
from ...backends.reference import fold_batch_norm
from ...errors import ShapeError, UnsupportedError
from ..records import AXES, AXIS, BOOL, FLT, INT, POS, A, Family, fail
from ..tensors import f32

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("normalization")
op = FAMILY.op


def _batch_norm_check(node, attrs, ctx):
    if attrs.get("training_mode"):
        fail(ctx, node, "BatchNormalization with training_mode=1 (batch statistics) is not supported", unsupported=True)


@op(
    "BatchNormalization",
    inputs=(5, 5),
    outputs=1,
    check=_batch_norm_check,
    attrs={"epsilon": FLT, "momentum": FLT, "training_mode": BOOL, "spatial": BOOL},
)
def _batch_norm(inputs, attrs, opset):
    if attrs.get("training_mode", 0):
        raise UnsupportedError("BatchNormalization with training_mode=1 (batch statistics) is not supported")
    x, scale, bias, mean, var = inputs[:5]
    s, t = fold_batch_norm(mean, var, scale, bias, attrs.get("epsilon", 1e-5))
    return [get_ops().batch_norm(f32(x), s, t, axis=1)]


@op("InstanceNormalization", inputs=(3, 3), attrs={"epsilon": FLT})
def _instance_norm(inputs, attrs, opset):
    x, scale, bias = inputs
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = get_ops().layer_norm(f32(x), None, None, attrs.get("epsilon", 1e-5), axes)
    return [y * scale.reshape(shape) + bias.reshape(shape)]


@op("LayerNormalization", inputs=(2, 3), outputs=3, attrs={"axis": AXIS, "epsilon": FLT, "stash_type": A(INT)})
def _layer_norm(inputs, attrs, opset):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    eps = attrs.get("epsilon", 1e-5)
    y = get_ops().layer_norm(f32(x), scale, bias, eps, axes, rms=attrs.get("_rms", False))
    if not attrs.get("_stats", True):
        return [y]
    # optional outputs 1 and 2: the mean and the inverse standard deviation (kept dims)
    mean = wide_mean(f32(x), axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(wide_mean(np.square(x - mean), axes, keepdims=True) + np.float32(eps))
    return [y, mean, inv_std.astype(np.float32)]


@op("LpNormalization", attrs={"axis": AXIS, "p": A(INT, choices=(1, 2))})
def _lp_norm(inputs, attrs, opset):
    x = inputs[0]
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    norm = wide_sum(np.abs(x) ** p, axis, keepdims=True) ** (1.0 / p)
    return [np.divide(x, norm, out=np.zeros_like(x), where=norm != 0).astype(x.dtype)]


@op(
    "GroupNormalization",
    inputs=(3, 3),
    attrs={"epsilon": FLT, "num_groups": POS, "stash_type": A(INT)},
    required=("num_groups",),
)
def _group_norm(inputs, attrs, opset):
    """(x - mean) / sqrt(var + eps) over each group of C / G channels (and the spatial axes),
    times scale plus bias per channel (opset 21) or per group (opset 18)."""
    x, scale, bias = inputs
    groups = attrs["num_groups"]
    n, c = x.shape[:2]
    if c % groups:
        raise ShapeError(f"GroupNormalization: {groups} groups for {c} channels")
    if scale.shape != (c if opset >= 21 else groups,) or bias.shape != scale.shape:
        raise ShapeError(
            f"GroupNormalization: scale {scale.shape} and bias {bias.shape} for {c} channels in {groups} groups"
        )
    grouped = f32(x).reshape(n, groups, -1)
    y = get_ops().layer_norm(np.ascontiguousarray(grouped), None, None, attrs.get("epsilon", 1e-5), (2,))
    shape = (1, c) + (1,) * (x.ndim - 2)
    if opset < 21:
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    return [(y.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


@op("RMSNormalization", inputs=(2, 2), attrs={"axis": AXIS, "epsilon": FLT, "stash_type": A(INT)})
def _rms_norm(inputs, attrs, opset):
    """x / sqrt(mean(x^2 over the axes from ``axis`` on) + eps) * scale."""
    x, scale = inputs
    axis = attrs.get("axis", -1) % max(x.ndim, 1)
    xf = x.astype(np.float32) if x.dtype != np.float64 else x
    ms = wide_mean(np.square(xf), tuple(range(axis, x.ndim)), keepdims=True)
    return [(xf / np.sqrt(ms + np.float32(attrs.get("epsilon", 1e-5))) * scale).astype(x.dtype)]


@op("MeanVarianceNormalization", attrs={"axes": AXES})
def _mean_variance_norm(inputs, attrs, opset):
    """(x - mean) / sqrt(var + 1e-9) over ``axes`` (default 0, 2, 3)."""
    x = inputs[0]
    axes = tuple(attrs.get("axes", (0, 2, 3)))
    mean = wide_mean(x, axes, keepdims=True)
    var = wide_mean(np.square(x - mean), axes, keepdims=True)
    return [((x - mean) / np.sqrt(var + np.asarray(1e-9, x.dtype))).astype(x.dtype)]
