"""ONNX reductions: the Reduce* operators (float sums accumulated in float64), ArgMax / ArgMin
and the global poolings."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...backends.accumulate import wide_mean, wide_sum
from ..layout import channels_last_memory
from ..tensors import read_axes, registrar

#: This family's operators: ONNX operator name -> implementation (``ops.OPS`` assembles the families).
OPS: dict = {}
op = registrar(OPS)


def reduce_axes(inputs, attrs, opset, axes_input_from, ndim):
    """The axes a Reduce* node reduces on an input of rank ``ndim`` (a tuple: its attribute
    before opset ``axes_input_from``, its second input from then on, all axes where empty), or
    None where it passes its input through (no axes and ``noop_with_empty_axes``)."""
    axes = read_axes(inputs, attrs, 1) if opset >= axes_input_from else read_axes([], attrs, 1)
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else tuple(range(ndim))
    return tuple(axes)


def _reduce(fn, axes_input_from):
    """A Reduce* operator computing ``fn(x, axis, keepdims)``; ``run.reducer`` keeps ``(fn,
    axes_input_from)`` for the form bound on constant axes (``bound.py``)."""

    def run(inputs, attrs, opset):
        x = inputs[0]
        axes = reduce_axes(inputs, attrs, opset, axes_input_from, x.ndim)
        return [x if axes is None else fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", 1)))]

    run.reducer = (fn, axes_input_from)
    return run


def _reduce_mean(x, axis, keepdims):
    """ReduceMean: over H and W of NHWC memory (an NCHW view, as convolutions return: the
    squeeze-and-excite means of PP-OCR's backbones) the backend's global average pool, which
    reads the memory as it lies; else ``wide_mean``."""
    if (
        x.dtype == np.float32
        and x.ndim == 4
        and axis is not None
        and sorted(a % 4 for a in np.atleast_1d(axis)) == [2, 3]
    ):
        held = channels_last_memory(x)
        if held is not None and held.size:
            y = get_ops().global_pool(held, "avg", (1, 2), keepdims=True).transpose(0, 3, 1, 2)
            return y if keepdims else y.reshape(y.shape[:2])
    return wide_mean(x, axis=axis, keepdims=keepdims)


OPS["ReduceMean"] = _reduce(_reduce_mean, 18)
OPS["ReduceSum"] = _reduce(wide_sum, 13)
OPS["ReduceMax"] = _reduce(
    lambda x, axis, keepdims: np.max(
        x,
        axis=axis,
        keepdims=keepdims,
        initial=-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min if x.dtype.kind in "iu" else False,
    ),
    18,
)
OPS["ReduceMin"] = _reduce(
    lambda x, axis, keepdims: np.min(
        x,
        axis=axis,
        keepdims=keepdims,
        initial=np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max if x.dtype.kind in "iu" else True,
    ),
    18,
)
OPS["ReduceProd"] = _reduce(np.prod, 18)
OPS["ReduceL2"] = _reduce(lambda x, axis, keepdims: np.sqrt(wide_sum(np.square(x), axis, keepdims)), 18)
OPS["ReduceSumSquare"] = _reduce(lambda x, axis, keepdims: wide_sum(np.square(x), axis, keepdims), 18)
OPS["ReduceL1"] = _reduce(lambda x, axis, keepdims: wide_sum(np.abs(x), axis, keepdims), 18)
OPS["ReduceLogSum"] = _reduce(lambda x, axis, keepdims: np.log(wide_sum(x, axis, keepdims)), 18)


def _log_sum_exp(x, axis, keepdims):
    """log(sum(exp(x))) as m + log(sum(exp(x - m))), m the finite maximum (0 where none is)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    y = np.log(wide_sum(np.exp(x - m), axis, keepdims=True)) + m
    return (y if keepdims else np.squeeze(y, axis=axis)).astype(x.dtype)


OPS["ReduceLogSumExp"] = _reduce(_log_sum_exp, 18)


def _arg(fn):
    def run(inputs, attrs, opset):
        x = inputs[0]
        axis = attrs.get("axis", 0)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        out = out.astype(np.int64)
        return [np.expand_dims(out, axis) if attrs.get("keepdims", 1) else out]

    return run


OPS["ArgMax"] = _arg(np.argmax)
OPS["ArgMin"] = _arg(np.argmin)


def _global_pool(kind):
    """GlobalAveragePool / GlobalMaxPool: the mean or max over the spatial axes, keeping them as
    1s; an NCHW view of NHWC memory is pooled in that memory by the backend."""

    def run(inputs, attrs, opset):
        x = inputs[0]
        held = channels_last_memory(x) if x.dtype == np.float32 and x.ndim == 4 else None
        if held is not None and held.size:
            return [get_ops().global_pool(held, kind, (1, 2), keepdims=True).transpose(0, 3, 1, 2)]
        axes = tuple(range(2, x.ndim))
        return [wide_mean(x, axes, keepdims=True) if kind == "avg" else np.max(x, axis=axes, keepdims=True)]

    return run


OPS["GlobalAveragePool"] = _global_pool("avg")
OPS["GlobalMaxPool"] = _global_pool("max")
