"""How an optimised graph holds its weights: once, in the form its kernels read.

A dense node's weight (``FusedDense``, input 1) is packed by the cpu backend at its first
product; the array the file gave (or the optimiser made: a transposed or folded copy) would
then be held beside the packed copy for the model's life. ``hold_dense_weights`` hands each
constant that only dense nodes read to the backend (``Ops.dense_weights``), which gives the
form it keeps (the cpu backend: the packed copy alone, unpacked anew for whoever reads it as an
array), and the model keeps only that. Pickles carry the file, not these arrays
(``OnnxModel.source``).
"""

from __future__ import annotations

from ..backends import get_ops
from .nodes import Node


def hold_dense_weights(nodes, constants, outputs) -> list[Node]:
    """Each constant read only as the weights of ``FusedDense`` nodes (never a graph output)
    replaced in ``constants`` by what the backend holds in its place (``Ops.dense_weights``)."""
    readers: dict[str, set] = {}
    for node in nodes:
        for k, name in enumerate(node.inputs):
            if name in constants:
                readers.setdefault(name, set()).add((node.op_type, k))
    ops = get_ops()
    for name, uses in readers.items():
        if uses == {("FusedDense", 1)} and name not in outputs:
            constants[name] = ops.dense_weights(constants[name])
    return nodes
