"""What every family of ONNX operators shares: the element types (``DTYPES``), the size limit on
tensors whose size the graph's values set (``created``), and readers of attribute and input
values.
"""

from __future__ import annotations

import contextvars

import numpy as np

from .. import settings
from ..backends import get_ops
from ..errors import InputError, ShapeError

#: The most bytes one tensor may take where the graph's values, not the size of the inputs,
#: set its size: ConstantOfShape, Expand, Tile, Range, Resize, Upsample, Pad, ConvTranspose,
#: and convolutions and pooling padded beyond their window, is ``onnx_max_created_bytes`` of
#: the options in force (``settings.current()``: the model's, else the process's). Over it, a
#: call raises ``SizeLimitError`` (an ``InputError``) naming the node.
#: The limit in force where it is not ``onnx_max_created_bytes``: constant folding at load sets what
#: is left of its budget (``fold.fold_constants``).
CREATE_LIMIT: contextvars.ContextVar = contextvars.ContextVar("onnx_create_limit", default=None)


class SizeLimitError(InputError):
    """A tensor over ``onnx_max_created_bytes`` (or over what constant folding has left)."""


def created(shape, dtype, what: str):
    """Check a tensor of ``shape`` and ``dtype`` before it is made (``onnx_max_created_bytes``);
    returns the shape as a tuple of ints."""
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        if d < 0:
            raise ShapeError(f"{what}: negative dimension in shape {shape[:8]}")
        count *= d
    check_created(shape, count * np.dtype(dtype).itemsize, what)
    return shape


def check_created(shape, nbytes: int, what: str):
    """``created``'s limit check for a tensor of ``shape`` taking ``nbytes``: what a node bound
    on a shape (a record's ``bind``) checks on every call, the limit depending on the context."""
    limit = CREATE_LIMIT.get()
    limit = settings.current().onnx_max_created_bytes if limit is None else limit
    if nbytes > limit:
        raise SizeLimitError(
            f"{what}: a tensor of shape {shape[:8]}{'...' if len(shape) > 8 else ''} "
            f"would take {nbytes} bytes, over the limit of {limit} "
            "(FASTLAYERS_ONNX_MAX_CREATED_BYTES)"
        )


#: ONNX TensorProto element types -> numpy dtypes
DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


def f32(x):
    """``x`` as a float32 array (no copy where it is one)."""
    return np.asarray(x, dtype=np.float32)


def ints(x):
    """The values of an integer tensor (or a sequence) as a list of Python ints."""
    x = np.asarray(x)
    return x.reshape(-1).tolist() if x.dtype.kind in "iu" else [int(v) for v in x.reshape(-1)]


def read_axes(inputs, attrs, index, name="axes"):
    """An axes list given as an attribute (old opsets) or as input ``index`` (new opsets)."""
    if len(inputs) > index and inputs[index] is not None:
        return ints(inputs[index])
    value = attrs.get(name)
    return None if value is None else [int(v) for v in value]


def backend_plan(attrs, make):
    """The plan ``make(ops)`` of the active backend ``ops`` for a node, kept in the node's
    ``"_plans"`` cache (one per backend, the ops object held with it so that its id stays its
    own); made anew on every call where the node has no cache."""
    ops = get_ops()
    plans = attrs.get("_plans")
    held = None if plans is None else plans.get(id(ops))
    if held is None:
        held = (ops, make(ops))
        if plans is not None:
            plans[id(ops)] = held
    return held[1]
