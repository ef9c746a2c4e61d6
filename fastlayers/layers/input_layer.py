"""``InputLayer``: the source of a graph's input (``graph.Input`` makes one)."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .base import Layer, shape_str
from .symbolic import Node, SymbolicTensor


class InputLayer(Layer):
    """The source of a graph's input; ``Input`` makes one and returns its tensor."""

    config_keys = ("batch_shape", "dtype")

    def __init__(self, shape=None, batch_size=None, name=None, batch_shape=None, dtype=None, **kwargs):
        super().__init__(name=name, **kwargs)
        #: Integer inputs (token ids) keep their dtype; everything else is cast to float32.
        self.keep_dtype = dtype is not None and np.dtype(dtype).kind in "iu"
        self.dtype = "float32" if dtype is None else np.dtype(dtype).name
        if batch_shape is None:
            if shape is None:
                raise ShapeError(f"InputLayer {self.name!r}: give shape (without batch) or batch_shape")
            batch_shape = (batch_size, *tuple(shape))
        self.batch_shape = tuple(None if d is None else int(d) for d in batch_shape)
        self.built = True
        node = Node(self, None, (), {})
        node.outputs = [SymbolicTensor(self.batch_shape, node)]
        node.outputs[0].name = self.name  # as Keras: an input tensor is named after its InputLayer
        self._inbound_nodes.append(node)
        self.output = node.outputs[0]

    def check(self, x: np.ndarray) -> None:
        want = self.batch_shape
        if x.ndim == len(want) and x.shape[1:] == want[1:]:  # the common case: only the batch size free
            if want[0] is None or want[0] == x.shape[0]:
                return
        if x.ndim != len(want) or any(w is not None and w != d for w, d in zip(want, x.shape)):
            raise ShapeError(f"input {self.name!r}: expected shape {shape_str(want)}, got {x.shape}")
