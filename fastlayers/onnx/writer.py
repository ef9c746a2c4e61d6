"""ONNX graphs written in memory from fastlayers' own models (``nn/plans.py``,
``model/plans.py``) and imported as an exported file is (``importer.from_model``: folding,
fusions, native plans): one executor for every model kind."""

from __future__ import annotations

import numpy as np

from . import proto
from .importer import from_model
from .quant import DOMAIN_OPSETS

#: The default-domain opset the written graphs declare (20: Gelu; reductions take their axes
#: as an input).
OPSET = 20
_FLOAT = 1  # TensorProto.FLOAT
_INT64 = 7  # TensorProto.INT64
_BOOL = 9  # TensorProto.BOOL


class GraphWriter:
    """An ONNX graph being written: its nodes, initializers and fresh value names."""

    def __init__(self):
        self.graph = proto.Graph()
        self.count = 0

    def name(self, hint: str) -> str:
        """A value name not used before in this graph."""
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, array, hint: str) -> str:
        """An initializer holding ``array``, read-only; its name. An ndarray is held as it is
        (a view: a layer's weights in ONNX's axis order cost no copy, and the import turns a
        convolution's weights back into the layer's own order without one); the import makes
        new arrays of what it changes (folding, packing), never writes into these."""
        name = self.name(hint)
        held = np.asarray(array)
        if held is array:
            held = held.view()  # the caller's array keeps its own flags
        held.flags.writeable = False
        self.graph.initializers[name] = held
        return name

    def node(self, op_type: str, inputs: list[str], hint: str, **attrs) -> str:
        """A node of the default domain with one output; that output's name."""
        return self.nodes(op_type, inputs, hint, 1, **attrs)[0]

    def nodes(self, op_type: str, inputs: list[str], hint: str, count: int, domain: str = "", **attrs) -> list[str]:
        """A node of the default domain (or of ``domain``: fastlayers' own, ``records.FASTLAYERS``)
        with ``count`` outputs; their names."""
        outs = [self.name(hint) for _ in range(count)]
        self.graph.nodes.append(proto.NodeProto(op_type, domain, outs[0], list(inputs), outs, attrs))
        return outs

    def model(
        self,
        name: str,
        inputs: list[tuple[str, int]],
        outputs: list[str],
        int64_inputs=frozenset(),
        bool_inputs=frozenset(),
    ):
        """The ``OnnxModel`` of the graph written, its inputs float32 values of the given
        ranks (every dimension free; int64 those named in ``int64_inputs``, bool those in
        ``bool_inputs``), its outputs ``outputs``."""
        self.graph.name = name
        types = {**dict.fromkeys(int64_inputs, _INT64), **dict.fromkeys(bool_inputs, _BOOL)}
        self.graph.inputs = [proto.ValueInfo(i, types.get(i, _FLOAT), [None] * rank) for i, rank in inputs]
        self.graph.outputs = [proto.ValueInfo(o, _FLOAT, None) for o in outputs]
        opsets = {"": OPSET, **{n.domain: DOMAIN_OPSETS[n.domain] for n in self.graph.nodes if n.domain}}
        return from_model(proto.Model(8, opsets, "fastlayers", self.graph), f"{name} (compiled)", own=True)
