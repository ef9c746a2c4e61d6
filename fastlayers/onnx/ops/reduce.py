"""ONNX reductions: the Reduce* operators (float sums accumulated in float64), ArgMax / ArgMin
and the global poolings."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...backends.accumulate import wide_mean, wide_sum
from ..bound import constant, per_shape
from ..layout import channels_last_memory
from ..records import AXES, AXIS, BOOL, Family
from ..tensors import read_axes

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("reduce")
op = FAMILY.op


def reduce_axes(inputs, attrs, opset, axes_input_from, ndim):
    """The axes a Reduce* node reduces on an input of rank ``ndim`` (a tuple: its attribute
    before opset ``axes_input_from``, its second input from then on, all axes where empty), or
    None where it passes its input through (no axes and ``noop_with_empty_axes``)."""
    axes = read_axes(inputs, attrs, 1) if opset >= axes_input_from else read_axes([], attrs, 1)
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else tuple(range(ndim))
    return tuple(axes)


#: Reductions whose result over one value is that value.
_SINGLE_IS_ITSELF = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"}
#: Reduce* operator -> the opset from which its axes are its second input (an attribute before).
AXES_INPUT_FROM: dict[str, int] = {}


def _reduce(name, fn, axes_input_from):
    """Record the Reduce* operator ``name`` computing ``fn(x, axis, keepdims)``, its axes an
    attribute before opset ``axes_input_from`` and its second input from then on; bound on
    constant axes, the axes are read once per input shape, and a reduction over axes of
    length 1 that gives its input back is a reshape."""
    AXES_INPUT_FROM[name] = axes_input_from

    def run(inputs, attrs, opset):
        x = inputs[0]
        axes = reduce_axes(inputs, attrs, opset, axes_input_from, x.ndim)
        return [x if axes is None else fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", 1)))]

    def bind(inputs, attrs, opset):
        if opset >= axes_input_from and len(inputs) > 1 and inputs[1] is not None and constant(inputs, 1) is None:
            return None
        keep = bool(attrs.get("keepdims", 1))

        def make(ins):
            x = ins[0]
            axes = reduce_axes(ins, attrs, opset, axes_input_from, x.ndim)
            if axes is None:
                return lambda x: x
            if name in _SINGLE_IS_ITSELF and all(x.shape[a] == 1 for a in axes):
                # over axes of length 1 these reductions are their input, reshaped
                shape = (
                    x.shape if keep else tuple(d for k, d in enumerate(x.shape) if k not in {a % x.ndim for a in axes})
                )
                return lambda x: x.reshape(shape)
            return lambda x: fn(x, axis=axes, keepdims=keep)

        return per_shape(run, make)

    FAMILY.add(
        name, run, bind=bind, inputs=(1, 2), attrs={"axes": AXES, "keepdims": BOOL, "noop_with_empty_axes": BOOL}
    )


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


_reduce("ReduceMean", _reduce_mean, 18)
_reduce("ReduceSum", wide_sum, 13)
_reduce(
    "ReduceMax",
    lambda x, axis, keepdims: np.max(
        x,
        axis=axis,
        keepdims=keepdims,
        initial=-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min if x.dtype.kind in "iu" else False,
    ),
    18,
)
_reduce(
    "ReduceMin",
    lambda x, axis, keepdims: np.min(
        x,
        axis=axis,
        keepdims=keepdims,
        initial=np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max if x.dtype.kind in "iu" else True,
    ),
    18,
)
_reduce("ReduceProd", np.prod, 18)
_reduce("ReduceL2", lambda x, axis, keepdims: np.sqrt(wide_sum(np.square(x), axis, keepdims)), 18)
_reduce("ReduceSumSquare", lambda x, axis, keepdims: wide_sum(np.square(x), axis, keepdims), 18)
_reduce("ReduceL1", lambda x, axis, keepdims: wide_sum(np.abs(x), axis, keepdims), 18)
_reduce("ReduceLogSum", lambda x, axis, keepdims: np.log(wide_sum(x, axis, keepdims)), 18)


def _log_sum_exp(x, axis, keepdims):
    """log(sum(exp(x))) as m + log(sum(exp(x - m))), m the finite maximum (0 where none is)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    y = np.log(wide_sum(np.exp(x - m), axis, keepdims=True)) + m
    return (y if keepdims else np.squeeze(y, axis=axis)).astype(x.dtype)


_reduce("ReduceLogSumExp", _log_sum_exp, 18)


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


_ARG_ATTRS = {"axis": AXIS, "keepdims": BOOL, "select_last_index": BOOL}
FAMILY.add("ArgMax", _arg(np.argmax), attrs=_ARG_ATTRS)
FAMILY.add("ArgMin", _arg(np.argmin), attrs=_ARG_ATTRS)


def _global_pool(kind):
    """GlobalAveragePool / GlobalMaxPool: the mean or max over the spatial axes, keeping them as
    1s; an NCHW / NCL view of NHWC / NLC memory is pooled in that memory by the backend."""

    def run(inputs, attrs, opset):
        x = inputs[0]
        held = channels_last_memory(x) if x.dtype == np.float32 and x.ndim in (3, 4) else None
        if held is not None and held.size:
            pooled = get_ops().global_pool(held, kind, tuple(range(1, x.ndim - 1)), keepdims=True)
            return [pooled.transpose(0, 3, 1, 2) if x.ndim == 4 else pooled.transpose(0, 2, 1)]
        axes = tuple(range(2, x.ndim))
        return [wide_mean(x, axes, keepdims=True) if kind == "avg" else np.max(x, axis=axes, keepdims=True)]

    return run


FAMILY.add("GlobalAveragePool", _global_pool("avg"))
FAMILY.add("GlobalMaxPool", _global_pool("max"))
