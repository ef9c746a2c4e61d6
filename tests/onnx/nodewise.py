"""Every intermediate value of an ONNX model in fastlayers and in onnxruntime, compared node by
node in graph order, so that a difference is reported at the first node that makes it rather
than at the output.

Both engines run the graph as written: every node output becomes a graph output (so no fusion
can hide one), fastlayers loads it with ``LoadOptions(optimize=False)`` and onnxruntime with its
graph optimizations off, on one thread (its DynamicQuantizeLSTM quantizes each thread's share
of a batch on its own)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Divergence:
    """The first node output whose values differ: the node, its operator and output, and how."""

    node: str
    op_type: str
    output: str
    detail: str

    def __str__(self) -> str:
        return f"node {self.node!r} ({self.op_type}) output {self.output!r}: {self.detail}"


def _every_value_an_output(data: bytes) -> tuple[bytes, list]:
    """The model with each node output of the main graph also a graph output (untyped), and the
    main graph's nodes."""
    import onnx

    model = onnx.load_from_string(data)
    listed = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in listed:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                listed.add(name)
    return model.SerializeToString(), list(model.graph.node)


def _difference(want: np.ndarray, got: np.ndarray, rtol: float) -> str | None:
    """None where ``got`` is ``want`` (integers and booleans exactly, floats within ``rtol`` of
    the value's largest magnitude, NaN where NaN), else what differs."""
    want, got = np.asarray(want), np.asarray(got)
    if want.shape != got.shape or want.dtype != got.dtype:
        return f"onnxruntime {want.dtype} {want.shape}, fastlayers {got.dtype} {got.shape}"
    if want.size == 0:
        return None
    if want.dtype.kind != "f":
        wrong = int(np.count_nonzero(want != got))
        return None if wrong == 0 else f"{wrong} of {want.size} values differ (integers must be equal)"
    if not np.array_equal(np.isnan(want), np.isnan(got)):
        return "NaN in different places"
    finite = ~np.isnan(want)
    scale = float(np.abs(want[finite]).max()) if finite.any() else 0.0
    diff = float(np.abs(want[finite].astype(np.float64) - got[finite]).max()) if finite.any() else 0.0
    if diff <= rtol * scale:
        return None
    return f"max difference {diff:.3g} against max |value| {scale:.3g} (relative {diff / max(scale, 1e-30):.3g})"


def first_divergence(data: bytes, feed: dict, rtol: float = 1e-6) -> Divergence | None:
    """The first node (in graph order) one of whose outputs differs between fastlayers and
    onnxruntime on ``feed``, or None where every value agrees (see ``_difference``)."""
    import onnxruntime as ort

    import fastlayers

    data, nodes = _every_value_an_output(data)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feed)))
    ours = fastlayers.load(data, options=fastlayers.LoadOptions(optimize=False))
    got = dict(zip(names, ours.run(names, feed)))
    for node in nodes:
        for name in node.output:
            if name and (detail := _difference(want[name], got[name], rtol)) is not None:
                return Divergence(node.name, node.op_type, name, detail)
    return None
