"""What operators bound at load on their constant inputs share (the ``bind`` of their
records, ``records.py``), for the compiled plan (``compiled.py``).

Operators whose axes, starts, ends, pads or indices are constants (Unsqueeze, Squeeze, Slice,
Pad, Gather and the Reduce* family: the glue of streaming models such as Silero VAD) parse those
inputs on every call in their general form, a few microseconds each on tensors of a few hundred
values. Their bound form parses them once and keeps the result per input shape; the first call
with a shape runs the general form, which checks it and raises what it raises, and later calls
with that shape reuse its geometry. A binder returns None where the general form is needed (an
input computed by the graph).
"""

from __future__ import annotations

import numpy as np

#: Most input shapes a bound node keeps.
MAX_SHAPES = 64


def constant(inputs, i):
    """Input ``i`` where it is a constant array of the plan (not a value's name), else None."""
    return inputs[i] if len(inputs) > i and isinstance(inputs[i], np.ndarray) else None


def reshaper(general):
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


def per_shape(general, make):
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
