"""Operators bound at load on their constant inputs, for the compiled plan (``compiled.py``).

Operators whose axes, starts, ends, pads or indices are constants (Unsqueeze, Squeeze, Slice,
Pad, Gather and the Reduce* family: the glue of streaming models such as Silero VAD) parse those inputs on
every call in their general form (``ops``), a few microseconds each on tensors of a few
hundred values. ``bind(op_type,
inputs, attrs, opset)`` returns a function with the operator's signature that parses them once
and keeps the result per input shape, or None where the general form is needed (an input
computed by the graph). The first call with a shape runs the general form, which checks it
and raises what it raises; later calls with that shape reuse its geometry.
"""

from __future__ import annotations

import numpy as np

from .ops import OPS
from .ops.reduce import reduce_axes
from .ops.shape import pad_plan, slice_index
from .qlinear import bind_dynamic_quantize_matmul
from .qlstm import bind_dynamic_quantize_lstm
from .quant import MS
from .tensors import ints

#: Most input shapes a bound node keeps.
MAX_SHAPES = 64


def _constant(inputs, i):
    """Input ``i`` where it is a constant array of the plan (not a value's name), else None."""
    return inputs[i] if len(inputs) > i and isinstance(inputs[i], np.ndarray) else None


def _reshaper(general):
    """A function with ``general``'s signature whose output is a reshape of its input: the
    output shape kept per input shape after ``general`` computed (and checked) it."""
    shapes: dict = {}

    def run(inputs, attrs, opset):
        x = inputs[0]
        shape = shapes.get(x.shape)
        if shape is None:
            out = general(inputs, attrs, opset)
            if len(shapes) >= MAX_SHAPES:
                shapes.clear()
            shapes[x.shape] = out[0].shape
            return out
        return [x.reshape(shape)]

    return run


def _bind_axes_reshape(op_type):
    def bind(inputs, attrs, opset):
        if opset >= 13 and _constant(inputs, 1) is None and not (op_type == "Squeeze" and len(inputs) < 2):
            return None
        return _reshaper(OPS[op_type])

    return bind


def _bind_slice(inputs, attrs, opset):
    if opset < 10:
        return None
    params = [_constant(inputs, i) for i in (1, 2, 3, 4)]
    if (
        params[0] is None
        or params[1] is None
        or any(len(inputs) > i and inputs[i] is not None and params[i - 1] is None for i in (3, 4))
    ):
        return None
    starts, ends = ints(params[0]), ints(params[1])
    axes = ints(params[2]) if params[2] is not None else list(range(len(starts)))
    steps = ints(params[3]) if params[3] is not None else [1] * len(starts)
    general = OPS["Slice"]
    indexes: dict = {}

    def run(inputs, attrs, opset):
        x = inputs[0]
        index = indexes.get(x.shape)
        if index is None:
            out = general(inputs, attrs, opset)  # checks the node on this shape
            if len(indexes) >= MAX_SHAPES:
                indexes.clear()
            indexes[x.shape] = slice_index(x.shape, starts, ends, axes, steps)
            return out
        return [x[index]]

    return run


def _per_shape(general, make):
    """A function with ``general``'s signature that runs ``make(inputs)(x)``, made at the
    first call with x's shape and dtype (after ``general`` ran and checked that call)."""
    plans: dict = {}

    def run(inputs, attrs, opset):
        x = inputs[0]
        key = (x.shape, x.dtype.char)
        plan = plans.get(key)
        if plan is None:
            out = general(inputs, attrs, opset)  # checks the node on this shape
            if len(plans) >= MAX_SHAPES:
                plans.clear()
            plans[key] = make(inputs)
            return out
        return [plan(x)]

    return run


def _bind_pad(inputs, attrs, opset):
    if opset >= 11 and any(
        len(inputs) > i and inputs[i] is not None and _constant(inputs, i) is None for i in (1, 2, 3)
    ):
        return None
    return _per_shape(OPS["Pad"], lambda ins: pad_plan(ins[0].shape, ins[0].dtype, ins, attrs, opset))


#: Reductions whose result over one value is that value.
_SINGLE_IS_ITSELF = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"}


def _bind_reduce(op_type):
    def bind(inputs, attrs, opset):
        fn, axes_input_from = OPS[op_type].reducer
        if opset >= axes_input_from and len(inputs) > 1 and inputs[1] is not None and _constant(inputs, 1) is None:
            return None
        keep = bool(attrs.get("keepdims", 1))

        def make(ins):
            x = ins[0]
            axes = reduce_axes(ins, attrs, opset, axes_input_from, x.ndim)
            if axes is None:
                return lambda x: x
            if op_type in _SINGLE_IS_ITSELF and all(x.shape[a] == 1 for a in axes):
                # over axes of length 1 these reductions are their input, reshaped
                shape = (
                    x.shape if keep else tuple(d for k, d in enumerate(x.shape) if k not in {a % x.ndim for a in axes})
                )
                return lambda x: x.reshape(shape)
            return lambda x: fn(x, axis=axes, keepdims=keep)

        return _per_shape(OPS[op_type], make)

    return bind


def _bind_gather(inputs, attrs, opset):
    idx = _constant(inputs, 1)
    if idx is None or idx.dtype.kind not in "iu":
        return None
    general, index64 = OPS["Gather"], idx.astype(np.int64)

    def make(ins):
        x = ins[0]
        if x.ndim == 0:
            return lambda x: general([x, idx], attrs, opset)[0]
        axis = attrs.get("axis", 0) % x.ndim
        pos = np.where(index64 < 0, index64 + x.shape[axis], index64)
        lead = (slice(None),) * axis
        if idx.ndim == 0:  # one index: a view
            at = lead + (int(pos),)
        elif idx.ndim == 1 and idx.size and bool(np.all(np.diff(pos) == 1)):  # a run: a view
            at = lead + (slice(int(pos[0]), int(pos[-1]) + 1),)
        else:
            return lambda x: np.take(x, index64, axis=axis)
        return lambda x: x[at]

    return _per_shape(general, make)


BINDERS = {
    "Unsqueeze": _bind_axes_reshape("Unsqueeze"),
    "Squeeze": _bind_axes_reshape("Squeeze"),
    "Slice": _bind_slice,
    "Pad": _bind_pad,
    "Gather": _bind_gather,
    f"{MS}::DynamicQuantizeMatMul": bind_dynamic_quantize_matmul,
    f"{MS}::DynamicQuantizeLSTM": bind_dynamic_quantize_lstm,
    **{
        name: _bind_reduce(name)
        for name in (
            "ReduceMean",
            "ReduceSum",
            "ReduceMax",
            "ReduceMin",
            "ReduceProd",
            "ReduceL2",
            "ReduceSumSquare",
            "ReduceL1",
            "ReduceLogSum",
            "ReduceLogSumExp",
        )
    },
}


def bind(op_type, inputs, attrs, opset):
    """The node's function bound on its constant inputs, or None (see the module docstring)."""
    binder = BINDERS.get(op_type)
    return None if binder is None else binder(inputs, attrs, opset)
