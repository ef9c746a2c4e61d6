"""Importing an ONNX graph into an ``OnnxModel`` (``model.py``), and optimising it once.

``from_model`` takes a model parsed by ``proto`` (``fastlayers.io.onnx`` reads the files),
refuses in one error every operator it does not implement, checks the graph
(``check.check_graph``: every value defined, the nodes in an order that runs, each node's
inputs and attributes against its operator's rules), drops the nodes no output depends on,
then optimises the graph once:

1. constant folding (``fold.py``): nodes whose inputs are all known at load run once and
   become constants, within a budget (``onnx_max_fold_bytes``: a small file cannot make large constants at load); an
   If whose condition became a constant is replaced by the nodes of its branch
   (``inline_constant_ifs``), folded in turn;
2. rewrites (``rewrite.py``): no-op nodes dropped (Identity, inference Dropout, Cast to
   the same type, identity Transpose, Add 0 / Mul or Div by 1, Unsqueeze -> Squeeze; Reshape
   chains read by one Reshape), graph outputs keeping their names; per-channel Mul / Add after
   a Conv or a dense MatMul / Gemm folded into its weights and bias (``fold_affine``);
   x * Sigmoid(x) -> Swish (``fuse_silu``); LayerNorm and RMSNorm decomposed over the last axis
   -> one LayerNormalization node (``fuse_layer_norm``); Unsqueeze -> 2-D Convs with a kernel
   of 1 on the added axis -> Squeeze: 1-D Convs (``conv_1d``, tf2onnx's transposed form too);
3. fusion (``fusion.py``): the exact and the tanh GELU spelled in arithmetic become one Gelu
   node (``fuse_gelu``, ``fuse_gelu_tanh``); a per-channel Mul / Add and an activation after
   views of a Conv's result (Slices that keep its channels, Squeezes of spatial axes) move in
   front of the views, where ``fold_affine`` and the Conv fusion take them
   (``hoist_over_views``); MatMul (+ Add) and Gemm with constant weights become one dense node
   on the backend's BLAS + fused-epilogue primitive, absorbing a following activation (Relu, Sigmoid, Tanh,
   LeakyRelu, Gelu, Clip to [0, 6] or [0, inf), HardSigmoid with alpha 1/6, Swish: the
   backend's epilogues; another Clip, HardSigmoid or HardSwish stays a node); such a dense node
   on a one-hot encoding, Cast(Equal(ids, arange(V))), with its bias Add and activation,
   becomes one ``OneHotDense`` gather of rows (``fuse_one_hot_dense``); Conv with constant weights
   absorbs a following BatchNormalization (folded into its weights) and activation, with its
   weights transposed once to the backend's layout; an embedding Gather feeding an RNN, GRU or
   LSTM is folded into its input projection (``fuse_embedding_recurrent``); one LSTM step
   written out node by node (torch's ``LSTMCell``) becomes one ``FusedLSTMCell`` node
   (``cells.py``); the exporters'
   attention becomes one attention node (``fuse_attention``), and each mask-less Transformer
   encoder layer one ``FusedEncoderLayer`` node, each mask-less self-attention block outside
   one (torch's ``MultiheadAttention``: projections and attention) one ``FusedSelfAttention``
   node, confirmed on a probe run of the graph at load (``fuse_encoder_layers``, ``encoder.py``);
   last, an Add of two computed values read only by such an activation (a residual connection
   and its Relu) becomes one ``FusedAdd`` node, one pass over both operands
   (``fuse_add_activation``), and such an Add (or FusedAdd) of a convolution's only reader is
   taken into the convolution, which adds it to each block of output rows it writes
   (``fuse_conv_residual``);
4. dead-node removal: only nodes the outputs depend on are kept, and only the constants they
   read; a constant only dense nodes read is held in the form the backend's product reads
   (``weights.py``: on the cpu backend its packed copy alone).

The subgraphs of If, Loop and Scan nodes become models of their own (``control.Body``),
folded, and optimized as graphs once the outer constants they read are bound to them
(``optimize_bodies``); the outer values they read are inputs of their node (``check``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import settings
from ..errors import FastlayersError, ModelFileError, UnsupportedError
from . import (
    cells,
    check,
    encoder,
    fusion,
    proto,
    qdq,
    qfusion,
    quant,
    rewrite,
    weights,
)
from .control import Body
from .fold import fold_and_inline, has_loop, mark_loops
from .model import ORT_TYPES, OnnxModel
from .nodes import Node, prune
from .tensors import DTYPES

#: The oldest default-domain opset a file may declare.
MIN_OPSET = 9


def _read_nodes(graph, where, opset=None, budget=None) -> list[Node]:
    """``Node`` objects of a graph's nodes (or of a list of ``proto.NodeProto``); the
    subgraphs of control-flow nodes (checked by ``check``) become ``Body`` objects, their
    constant folding taking from ``budget`` (a one-element list of bytes left; None: no limit)."""
    nodes = []
    for n in getattr(graph, "nodes", graph):
        attrs = dict(n.attrs)
        if n.op_type == "Split":
            attrs["_num_outputs"] = len(n.outputs)
        if n.op_type == "LayerNormalization":  # the mean / inv-std outputs cost two passes
            attrs["_stats"] = any(n.outputs[1:])
        for key in check.SUBGRAPHS.get(n.op_type, ()):
            label = f"{where}: node {check.short(n.name or n.outputs[0])} ({n.op_type}) {key}"
            attrs[key] = _subgraph(attrs[key], n.inputs[attrs["_formal"] :], opset, label, budget)
        nodes.append(Node(n.op_type, list(n.inputs), list(n.outputs), attrs, n.name))
    return nodes


def _subgraph(graph, captures, opset, where, budget) -> Body:
    """A checked subgraph as a ``Body``: a model whose inputs are the subgraph's inputs, then
    the outer values ``captures``; constant-folded (within ``budget``; Ifs on constant
    conditions inlined), not fused."""
    constants = dict(graph.initializers)
    outputs = [vo.name for vo in graph.outputs]
    nodes = prune(_read_nodes(graph.nodes, where, opset, budget), outputs)
    nodes = mark_loops(fold_and_inline(nodes, constants, outputs, opset, budget, where), constants)
    nodes = bind_constant_captures(nodes, constants, opset, budget)
    inputs: list[tuple[str, np.dtype, None]] = [
        (vi.name, np.dtype(DTYPES.get(vi.elem_type, np.float32)), None) for vi in graph.inputs
    ]
    inputs += [(name, np.dtype(np.float32), None) for name in captures]
    types = [
        (np.dtype(DTYPES[vo.elem_type]) if vo.elem_type in DTYPES else None, _value_shape(vo)) for vo in graph.outputs
    ]
    return Body(_body_model(where, inputs, outputs, constants, nodes, opset), types)


def _body_model(where, inputs, outputs, constants, nodes, opset) -> OnnxModel:
    """A subgraph's model, keeping the constants its nodes and outputs read."""
    used = set(outputs).union(*(n.inputs for n in nodes))
    return OnnxModel(where, inputs, outputs, {k: v for k, v in constants.items() if k in used}, nodes, opset, {}, where)


def bind_constant_captures(nodes, constants, opset, budget) -> list[Node]:
    """Control-flow nodes whose subgraphs read outer values that are ``constants`` (weights,
    shapes folded at load) get subgraphs holding those values as constants of their own and
    folded again, so that what a branch computes from weights alone (silero VAD's LSTM gate
    slices) is computed once at load, not on every call; the node no longer passes them."""
    for node in nodes:
        bodies = [k for k, v in node.attrs.items() if isinstance(v, Body)]
        if not bodies:
            continue
        formal = node.attrs["_formal"]
        captures = node.inputs[formal:]
        bound = {c: constants[c] for c in captures if c in constants}
        if not bound:
            continue
        attrs = dict(node.attrs)
        for key in bodies:
            body, model = attrs[key], attrs[key].model
            own = model._inputs[: len(model._inputs) - len(captures)]
            local = {**bound, **model._constants}  # a subgraph's own initializer shadows an outer value
            label = model._where
            inner = mark_loops(fold_and_inline(model._nodes, local, model.output_names, opset, budget, label), local)
            inner = bind_constant_captures(inner, local, opset, budget)
            inputs = own + [i for i in model._inputs[len(own) :] if i[0] not in bound]
            attrs[key] = Body(_body_model(label, inputs, model.output_names, local, inner, opset), body.output_types)
        node.attrs = attrs
        node.inputs = node.inputs[:formal] + [c for c in captures if c not in bound]
    return nodes


def optimize(nodes, constants, outputs, input_dtypes, opset, probe=None) -> list[Node]:
    """The load-time rewrites and fusions of a graph's folded ``nodes`` (the module docstring's
    steps 2-4), the subgraphs of its control-flow nodes first (``optimize_bodies``).
    ``constants`` gains what the passes fold; ``input_dtypes``: graph input name -> numpy dtype
    where known; ``probe``: ``fuse_encoder_layers``'s probe run (None: no encoder fusion)."""
    nodes = optimize_bodies(nodes, opset, rewrite.known_dtypes(nodes, constants, input_dtypes))
    nodes = prune(rewrite.drop_noops(nodes, constants, outputs, input_dtypes), outputs)
    nodes = rewrite.fuse_layer_norm(rewrite.fuse_silu(nodes, constants, outputs), constants, outputs)
    nodes = rewrite.fold_affine(rewrite.conv_1d(nodes, constants, outputs), constants, outputs)
    nodes = rewrite.fold_pads(nodes, constants, outputs, opset)
    # GELU chains first, so that the Gelu node they become is absorbed by a dense node
    nodes = fusion.fuse_gelu_tanh(fusion.fuse_gelu(nodes, constants, outputs), constants, outputs)
    # a convolution's bias and activation spelled after views of its result, brought to it
    nodes = rewrite.fold_affine(fusion.hoist_over_views(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_one_hot_dense(fusion.fuse_dense(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_embedding_recurrent(fusion.fuse_conv(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_conv_transpose(nodes, constants, outputs)
    nodes = cells.fuse_lstm_cell(nodes, constants, outputs)
    nodes = fusion.fuse_attention(nodes, constants, outputs, opset)
    nodes = qfusion.optimize(nodes, constants, outputs)
    nodes = prune(fusion.mark_recurrent_sequences(fusion.mark_attention_scores(nodes, outputs), outputs), outputs)
    if probe is not None:
        nodes = fusion.fuse_encoder_layers(nodes, constants, list(input_dtypes), outputs, probe)
    nodes = fusion.fuse_conv_residual(fusion.fuse_add_activation(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_dense_chains(nodes, constants, outputs)
    dtypes = rewrite.known_dtypes(nodes, constants, input_dtypes)
    nodes = fusion.fuse_elementwise(nodes, constants, outputs, dtypes, opset)
    nodes = weights.hold_dense_weights(nodes, constants, outputs)
    return weights.hold_recurrent_weights(nodes, constants, outputs)


def optimize_bodies(nodes, opset, outer_dtypes) -> list[Node]:
    """Control-flow nodes get their subgraphs optimized as a graph is (``optimize``, without
    the encoder fusion's probe run), once their outer constants are bound
    (``bind_constant_captures``): a model that is one If on its sample rate (silero VAD) runs
    fused convolutions and recurrent cells in its branch. The types of a body's own inputs are
    those it declares; its captures' those the outer graph knows (``outer_dtypes``: name ->
    dtype, ``rewrite.known_dtypes``), so that a Cast in a branch to the type its captured
    input has is dropped."""
    for node in nodes:
        bodies = [k for k, v in node.attrs.items() if isinstance(v, Body)]
        if not bodies:
            continue
        attrs = dict(node.attrs)
        for key in bodies:
            body, model = attrs[key], attrs[key].model
            n_own = len(model._inputs) - (len(node.inputs) - node.attrs["_formal"])
            own_types = {name: dtype for name, dtype, _ in model._inputs[:n_own]}
            own_types.update((name, outer_dtypes[name]) for name, _, _ in model._inputs[n_own:] if name in outer_dtypes)
            constants = dict(model._constants)
            inner = optimize(list(model._nodes), constants, model.output_names, own_types, opset)
            attrs[key] = Body(
                _body_model(model._where, model._inputs, model.output_names, constants, inner, opset), body.output_types
            )
        node.attrs = attrs
    return nodes


def _declared(value_info) -> tuple:
    """(name, type string, dimensions) of a declared graph input or output, for ``NodeArg``."""
    return (value_info.name, ORT_TYPES.get(value_info.elem_type), tuple(_value_shape(value_info, named=True) or ()))


def _value_shape(value_info, named=False):
    """The dimensions of a value (None when unknown, or its name where ``named``), or None
    without a shape."""
    if value_info.shape is None:
        return None
    return [d if (isinstance(d, int) and d >= 0) or (named and isinstance(d, str)) else None for d in value_info.shape]


def _prober(name, inputs, dims, outputs, constants, opset, where):
    """``probe(nodes)`` for ``fuse_encoder_layers``: every value of the graph ``nodes`` on
    ``encoder.probe_inputs``, or None where it cannot run (an optimisation only)."""

    def probe(nodes):
        arrays = encoder.probe_inputs(dims)
        if arrays is None or has_loop(nodes):  # a loop on made-up values may not end
            return None
        try:
            model = OnnxModel(name, inputs, outputs, constants, prune(nodes, outputs), opset, {}, where)
            return model._evaluate(arrays, every_value=True)
        except Exception:  # noqa: BLE001 - the graph may not run on the probe's sizes
            return None

    return probe


def _op_name(node) -> str:
    """A node's operator as error messages name it (``domain::op_type`` outside the default
    domain), cut short and escaped where a file makes it long or unprintable."""
    name = node.op_type if node.domain == "" else f"{node.domain}::{node.op_type}"
    return name if name.isprintable() and 0 < len(name) <= 60 else check.short(name)


def from_model(model: proto.Model, where: str, source=None, own: bool = False) -> OnnxModel:
    """Import a model read by ``proto``; ``source`` is what its pickles carry
    (``OnnxModel.source``). ``own``: the caller hands ``model`` over (a file's parse), whose
    initializers are then taken out of its graph, so that each weight the optimiser replaces
    is freed as it goes rather than at the end of the import."""
    graph = model.graph
    opset = model.opsets.get("")
    if opset is None or not graph.nodes:
        raise ModelFileError(f"{where}: not an ONNX model (no default-domain opset or no nodes)")
    if opset < MIN_OPSET:
        raise UnsupportedError(f"{where}: opset {opset} is older than the oldest supported ({MIN_OPSET})")
    unsupported = sorted(
        {_op_name(n) for n in check.all_nodes(graph) if ":" in n.op_type or not check.known(check.qualified(n))}
    )
    if unsupported:
        raise UnsupportedError(f"{where}: unsupported ONNX operator(s): {', '.join(unsupported)}")
    quant.check_domains(model, where)
    # the graph's structure, types and attributes, checked before anything is folded or run;
    # the nodes in an order that runs, dead nodes dropped before folding
    checked = check.check_graph(graph, where, opset)
    constants = dict(graph.initializers)
    initializer_names = frozenset(constants)
    initializer_bytes = sum(v.nbytes for v in constants.values())
    if own:
        graph.initializers.clear()
    inputs, dims = [], []
    for vi in graph.inputs:
        if vi.name in initializer_names:
            continue
        if vi.elem_type not in DTYPES:
            raise UnsupportedError(f"{where}: input {check.short(vi.name)} has unsupported element type {vi.elem_type}")
        inputs.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi)))
        dims.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi, named=True)))
    outputs = [o.name for o in graph.outputs]
    # constant folding makes constants of at most max(onnx_max_fold_bytes, twice the bytes of
    # the file's initializers) in all; a graph asking more is refused (ModelFileError naming
    # the node)
    budget = [max(settings.current().onnx_max_fold_bytes, 2 * initializer_bytes + quant.dequantized_bytes(graph))]
    try:
        nodes = prune(_read_nodes(checked, where, opset, budget), outputs)
        if settings.current().optimize:  # before folding: the DQs of constant weights are part of their units
            nodes = prune(qdq.fuse_node_units(nodes, constants, outputs, {i: t for i, t, _ in inputs}, opset), outputs)
        nodes = mark_loops(fold_and_inline(nodes, constants, outputs, opset, budget, where), constants)
        nodes = bind_constant_captures(nodes, constants, opset, budget)
        name = graph.name or Path(where).stem
        if settings.current().optimize:
            nodes = optimize(
                nodes,
                constants,
                outputs,
                {i: t for i, t, _ in inputs},
                opset,
                _prober(name, inputs, dims, outputs, constants, opset, where),
            )
    except FastlayersError:
        raise
    except Exception as e:  # a graph the optimisations cannot take
        raise ModelFileError(f"{where}: invalid graph ({type(e).__name__}: {str(e)[:300]})") from e
    used = set(outputs).union(*(n.inputs for n in nodes))
    constants = {k: v for k, v in constants.items() if k in used}
    shapes = {vi.name: _value_shape(vi) for vi in graph.value_info + graph.outputs}
    declared = (
        [_declared(vi) for vi in graph.inputs if vi.name not in initializer_names],
        [_declared(vi) for vi in graph.outputs],
        frozenset(vi.name for vi in graph.inputs if vi.name in initializer_names),
    )
    return OnnxModel(name, inputs, outputs, constants, nodes, opset, shapes, where, declared, source)
