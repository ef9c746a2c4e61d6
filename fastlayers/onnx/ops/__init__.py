"""ONNX operators: the one table of operator records (``RECORDS``) and the views of it that the
plan reads.

Each operator is one record (``records.Record``: implementation, node checks, bound form, node
caches) in the module of its family, each family a module with one ``records.Family``
(``FAMILY``). ``FAMILIES`` below lists every family there is, explicitly: a new operator goes
into its family's module, a new family into ``FAMILIES``. An implementation's convention is
``run(inputs, attrs, opset) -> outputs``: the node's input arrays (None for an omitted optional
input), its attributes as Python values and the model's opset for the default domain. Semantics
follow https://onnx.ai/onnx/operators/ for opsets 9 to current; where an input moved from an
attribute to an input across opsets (axes, pads, split, min/max, ...) both are read.
"""

from __future__ import annotations

from .. import cells, control, indexing, qfusion, qlinear, qlstm, qpointwise, qpool, qsoftmax, quant
from ..records import Family, Record
from . import attention, conv, elementwise, linear, normalization, recurrent, reduce, resize, shape

#: Every family of operators.
FAMILIES: tuple[Family, ...] = (
    elementwise.FAMILY,
    linear.FAMILY,
    normalization.FAMILY,
    reduce.FAMILY,
    shape.FAMILY,
    indexing.FAMILY,
    conv.FAMILY,
    resize.FAMILY,
    recurrent.FAMILY,
    attention.FAMILY,
    control.FAMILY,
    cells.FAMILY,
    quant.FAMILY,
    qlinear.FAMILY,
    qlstm.FAMILY,
    qpointwise.FAMILY,
    qpool.FAMILY,
    qsoftmax.FAMILY,
    qfusion.FAMILY,
)


def _gathered(families) -> dict[str, Record]:
    records: dict[str, Record] = {}
    for family in families:
        for key, record in family.records.items():
            if key in records:
                raise ValueError(f"operator {key} is recorded by two families (the second: {family.name!r})")
            records[key] = record
    return records


#: Operator key (op_type, or ``"<domain>::<op_type>"``, ``check.qualified``) -> its record.
RECORDS: dict[str, Record] = _gathered(FAMILIES)
#: Operator key -> implementation: what the plan's steps run.
OPS: dict = {key: r.run for key, r in RECORDS.items()}
#: Operator key -> bound form, for the operators that have one.
BINDERS: dict = {key: r.bind for key, r in RECORDS.items() if r.bind is not None}
#: Operator key -> the names of the caches each of its nodes gets (``records.Record.caches``).
NODE_CACHES: dict = {key: r.caches for key, r in RECORDS.items() if r.caches}


def bind(op_type, inputs, attrs, opset):
    """The node's function bound on its constant inputs, or None (``records.Record.bind``)."""
    binder = BINDERS.get(op_type)
    return None if binder is None else binder(inputs, attrs, opset)
