"""ONNX operators on numpy and the fastlayers backend: ``OPS[op_type](inputs, attrs, opset)``.

Each function takes the node's input arrays (None for an omitted optional input), its attributes
as Python values and the model's opset for the default domain, and returns the list of outputs.
Semantics follow https://onnx.ai/onnx/operators/ for opsets 9 to current; where an input moved
from an attribute to an input across opsets (axes, pads, split, min/max, ...) both are read.

The operators come in families, each a module with its own table (``OPS``, filled by the
module's ``@op`` decorator or written out as a dict). ``FAMILIES`` below lists every family
there is, and ``OPS`` is made of their tables: a new operator goes into its family's module,
a new family into ``FAMILIES``.
"""

from __future__ import annotations

# qlinear, qlstm, qpointwise, qpool, qsoftmax and quant are imported for the quantized family's
# table: quant._register fills qtable.OPS as each of them is imported
from .. import (  # noqa: F401
    cells,
    control,
    indexing,
    qfusion,
    qlinear,
    qlstm,
    qpointwise,
    qpool,
    qsoftmax,
    qtable,
    quant,
)
from . import attention, conv, elementwise, linear, normalization, recurrent, reduce, resize, shape

#: Family name -> its table (operator key -> implementation).
FAMILIES: dict[str, dict] = {
    "elementwise": elementwise.OPS,
    "linear": linear.OPS,
    "normalization": normalization.OPS,
    "reduce": reduce.OPS,
    "shape": shape.OPS,
    "indexing": indexing.OPS,
    "convolution and pooling": conv.OPS,
    "resize": resize.OPS,
    "recurrent": recurrent.OPS,
    "attention": attention.OPS,
    "control flow": control.OPS,
    "LSTM cells": cells.OPS,
    "quantized": qtable.OPS,
    "quantized fusions": qfusion.OPS,
}

#: ONNX operator key -> implementation, every family's.
OPS: dict = {name: fn for table in FAMILIES.values() for name, fn in table.items()}


#: Per operator, the caches a model gives each of its nodes (OnnxModel: empty dicts added to a
#: copy of the node's attributes, one per plan): "_windows", input shape and kernel ->
#: ``windows.window``'s geometry, so that a call on a shape seen before skips the arithmetic (the size
#: limit, which depends on the context, is checked on every call); "_plans", a convolution's
#: bound kernel per input shape; "_bound", a recurrence's bound calls (``recurrent._bound_key``, and
#: ``cells._bound_step`` for a fused LSTM step).
NODE_CACHES = {
    "Conv": ("_windows",),
    "FusedConv": ("_windows", "_plans"),
    "MaxPool": ("_windows",),
    "AveragePool": ("_windows",),
    "LSTM": ("_bound",),
    "GRU": ("_bound",),
    "RNN": ("_bound",),
    "FusedLSTMCell": ("_bound",),
    "OneHotDense": ("_tables",),
}
