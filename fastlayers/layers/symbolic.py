"""Symbolic tensors and nodes: the records of layer calls made while building a graph."""

from __future__ import annotations

from ..arrays import shape_str


class SymbolicTensor:
    """A placeholder for an array in a graph under construction (Keras's KerasTensor)."""

    def __init__(self, shape: tuple, node: Node, index: int = 0):
        self.shape = tuple(shape)
        self.node = node
        self.index = index
        self.dtype = "float32"
        #: The Keras mask this tensor carries (an Embedding(mask_zero=True) output's, or the
        #: one a recurrent layer returning sequences passes on), once known; see
        #: ``layers.recurrent.implicit_mask``.
        self.keras_mask: SymbolicTensor | None = None
        #: For ids: the mask ``ids != 0`` made from them, one for all their consumers.
        self.padding_mask: SymbolicTensor | None = None

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"<SymbolicTensor shape={shape_str(self.shape)} from {self.node.layer.name!r}>"


class Node:
    """One call of ``layer`` (a ``layers.base.Layer``, not imported here: layers import this
    module) on ``args`` (a symbolic tensor or a list of them)."""

    def __init__(self, layer, args, extra_args: tuple, kwargs: dict):
        self.layer, self.args, self.extra_args, self.kwargs = layer, args, extra_args, kwargs
        self.outputs: list[SymbolicTensor] = []

    @property
    def parents(self) -> list[SymbolicTensor]:
        if self.args is None:
            return []
        return list(self.args) if isinstance(self.args, (list, tuple)) else [self.args]


def is_symbolic(x) -> bool:
    if isinstance(x, SymbolicTensor):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, SymbolicTensor) for t in x)


def call_symbolic(layer, inputs, args, kwargs):
    """Record a call of ``layer`` in the graph; return its symbolic output(s)."""
    if isinstance(inputs, tuple):
        inputs = list(inputs)
    shape = [t.shape for t in inputs] if isinstance(inputs, list) else inputs.shape
    layer._ensure_built(shape)
    layer._check_spec(shape)
    out_shape = (
        layer.compute_output_shape(shape, *args, **kwargs) if (args or kwargs) else layer.compute_output_shape(shape)
    )
    node = Node(layer, inputs, args, kwargs)
    multi = isinstance(out_shape, list)
    shapes = out_shape if multi else [out_shape]
    node.outputs = [SymbolicTensor(s, node, i) for i, s in enumerate(shapes)]
    layer._inbound_nodes.append(node)
    return node.outputs if multi else node.outputs[0]
