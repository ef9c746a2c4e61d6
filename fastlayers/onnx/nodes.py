"""The node list an imported ONNX graph is made of, and the queries the passes share."""

from __future__ import annotations

import numpy as np


class Node:
    """One operator call: op type, input and output value names, parsed attributes."""

    __slots__ = ("op_type", "inputs", "outputs", "attrs", "name")

    def __init__(self, op_type, inputs, outputs, attrs, name=""):
        self.op_type, self.inputs, self.outputs, self.attrs, self.name = op_type, inputs, outputs, attrs, name


def consumers(nodes, outputs) -> dict[str, int]:
    """Value name -> how many node inputs read it (graph outputs count once)."""
    return {name: len(users) for name, users in readers_of(nodes, outputs).items()}


def prune(nodes, outputs) -> list[Node]:
    """Keep only the nodes the graph outputs depend on."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    return kept[::-1]


def readers_of(nodes, outputs) -> dict[str, list]:
    """Value name -> the nodes reading it (once per input slot); graph outputs read by None."""
    readers: dict[str, list] = {name: [None] for name in outputs}
    for node in nodes:
        for name in node.inputs:
            if name:
                readers.setdefault(name, []).append(node)
    return readers


def owner(array):
    """The object that owns the memory of ``array`` (itself, or the end of its ``base`` chain)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array
