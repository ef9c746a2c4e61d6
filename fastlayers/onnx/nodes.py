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


def node_axes(node, constants, slot=1):
    """A node's ``axes``, from its attribute or its constant input ``slot``; None if unknown."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > slot and node.inputs[slot] in constants:
        return [int(a) for a in np.asarray(constants[node.inputs[slot]]).reshape(-1)]
    return None


def slice_arguments(node, constants):
    """(starts, ends, axes, steps) of a Slice whose arguments are constants (inputs from opset 10,
    attributes before), as int64 vectors of one length; None where any is not."""
    if len(node.inputs) > 1:
        parts = [node.inputs[i] if len(node.inputs) > i and node.inputs[i] else None for i in (1, 2, 3, 4)]
        if parts[0] is None or parts[1] is None or any(p is not None and p not in constants for p in parts):
            return None
        starts, ends = (np.asarray(constants[p]).reshape(-1) for p in parts[:2])
        axes = np.asarray(constants[parts[2]]).reshape(-1) if parts[2] else np.arange(starts.size)
        steps = np.asarray(constants[parts[3]]).reshape(-1) if parts[3] else np.ones(starts.size, np.int64)
    else:
        starts, ends = np.asarray(node.attrs.get("starts", [])), np.asarray(node.attrs.get("ends", []))
        axes = np.asarray(node.attrs.get("axes", np.arange(starts.size)))
        steps = np.ones(starts.size, np.int64)
    found = (starts, ends, axes, steps)
    if len({v.size for v in found}) != 1 or any(v.dtype.kind not in "iu" for v in found):
        return None
    return tuple(v.astype(np.int64) for v in found)


def owner(array):
    """The object that owns the memory of ``array`` (itself, or the end of its ``base`` chain)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array
