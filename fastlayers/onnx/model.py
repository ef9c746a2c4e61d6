"""ONNX models on fastlayers kernels: graph import, load-time optimisation, execution.

``from_model`` takes a model parsed by ``proto`` (``fastlayers.io.onnx`` reads the files),
refuses in one error every operator it does not implement, checks the graph
(``check.check_graph``: every value defined, the nodes in an order that runs, each node's
inputs and attributes against its operator's rules), drops the nodes no output depends on,
then optimises the graph once:

1. constant folding: nodes whose inputs are all known at load run once and become constants,
   within a budget (``MAX_FOLD_BYTES``: a small file cannot make large constants at load); an
   If whose condition became a constant is replaced by the nodes of its branch
   (``inline_constant_ifs``), folded in turn;
2. rewrites (``rewrite.py``): no-op nodes dropped (Identity, inference Dropout, Cast to
   the same type, identity Transpose, Add 0 / Mul or Div by 1, Unsqueeze -> Squeeze; Reshape
   chains read by one Reshape), graph outputs keeping their names; per-channel Mul / Add after
   a Conv or a dense MatMul / Gemm folded into its weights and bias (``fold_affine``);
   x * Sigmoid(x) -> Swish (``fuse_silu``); LayerNorm and RMSNorm decomposed over the last axis
   -> one LayerNormalization node (``fuse_layer_norm``); Unsqueeze -> 2-D Convs with a kernel
   of 1 on the added axis -> Squeeze: 1-D Convs (``conv_1d``, tf2onnx's transposed form too);
3. fusion: MatMul (+ Add) and Gemm with constant weights become one dense node on the backend's
   BLAS + fused-epilogue primitive, absorbing a following activation (Relu, Sigmoid, Tanh,
   LeakyRelu, Gelu, Clip to [0, 6] or [0, inf), HardSigmoid with alpha 1/6, Swish: the
   backend's epilogues; another Clip, HardSigmoid or HardSwish stays a node); Conv with constant weights
   absorbs a following BatchNormalization (folded into its weights) and activation, with its
   weights transposed once to the backend's layout; an embedding Gather feeding an RNN, GRU or
   LSTM is folded into its input projection (``fuse_embedding_recurrent``); the exporters'
   attention becomes one attention node (``fuse_attention``), and each mask-less Transformer
   encoder layer one ``FusedEncoderLayer`` node, confirmed on a probe run of the graph at load
   (``fuse_encoder_layers``, ``encoder.py``);
4. dead-node removal: only nodes the outputs depend on are kept, and only the constants they read.

The subgraphs of If, Loop and Scan nodes become models of their own (``control.Body``),
folded but not fused; the outer values they read are inputs of their node (``check``).

Execution walks the kept nodes in order with a value table local to the call, so one model
serves many threads; batch size and sequence length may vary from call to call. An operator
failing on the inputs of a call raises an ``InputError`` (or its own fastlayers error) naming
the node; tensors whose size the graph's values set are limited (``ops.MAX_CREATED_BYTES``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import FastlayersError, InputError, ModelFileError, ShapeError, UnsupportedError
from ..native.layout import oihw_to_hwio
from ..services import service
from ..warmup import warm_up
# control, indexing and quant add their operators to ops.OPS when imported: this module, which
# runs OPS, imports them all
from . import check, encoder, indexing, proto, quant, rewrite  # noqa: F401 - indexing registers
from .control import Body
from .ops import CREATE_LIMIT, DTYPES, OPS, SizeLimitError, WINDOW_OPS, _env_bytes, contiguous

MIN_OPSET = 9
#: Constant folding at load may make constants of at most max(MAX_FOLD_BYTES, twice the bytes
#: of the file's initializers) in all; a graph asking more is refused (``ModelFileError``
#: naming the node). The environment variable FASTLAYERS_ONNX_MAX_FOLD_BYTES, read at import,
#: sets another MAX_FOLD_BYTES.
MAX_FOLD_BYTES = _env_bytes("FASTLAYERS_ONNX_MAX_FOLD_BYTES", 64 << 20)
#: Activations a dense node absorbs: ONNX op -> (fastlayers activation, attribute giving alpha).
_FUSABLE_ACTIVATIONS = {"Relu": ("relu", None), "Sigmoid": ("sigmoid", None), "Tanh": ("tanh", None),
                        "LeakyRelu": ("leaky_relu", "alpha"), "Gelu": ("gelu", None)}
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
#: TensorProto.DataType -> the type string onnxruntime's ``NodeArg.type`` gives.
ORT_TYPES = {t: f"tensor({n})" for t, n in enumerate(
    ["", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string", "bool", "float16",
     "double", "uint32", "uint64", "complex64", "complex128", "bfloat16", "float8e4m3fn",
     "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4", "float4e2m1", "float8e8m0",
     "uint2", "int2", "float6e2m3", "float6e3m2"]) if n}


def _fused_activation(follower, constants) -> dict | None:
    """The activation attributes a dense or convolution node takes from a following activation
    node (Gelu with approximate="tanh" is the tanh form; Clip to [0, 6] or [0, inf) is relu6 or
    relu; HardSigmoid with alpha 1/6 and beta 1/2 is hard_sigmoid; Swish with alpha 1, which
    ``rewrite.fuse_silu`` makes of x * Sigmoid(x), is silu); None where it has none."""
    op = follower.op_type
    if op == "Clip":
        bounds = [follower.attrs.get("min"), follower.attrs.get("max")]
        for k, name in enumerate(follower.inputs[1:3]):
            bounds[k] = _scalar(constants, name) if name else bounds[k]
            if name and bounds[k] is None:
                return None
        name = {(0.0, 6.0): "relu6", (0.0, None): "relu", (0.0, np.inf): "relu"}.get(tuple(bounds))
        return None if name is None else {"activation": name, "alpha": 0.0}
    if op == "HardSigmoid":
        ok = np.float32(follower.attrs.get("alpha", 0.2)) == np.float32(1 / 6) \
            and np.float32(follower.attrs.get("beta", 0.5)) == np.float32(0.5)
        return {"activation": "hard_sigmoid", "alpha": 0.0} if ok else None
    if op == "Swish":
        return {"activation": "silu", "alpha": 0.0} if follower.attrs.get("alpha", 1.0) == 1.0 else None
    if op not in _FUSABLE_ACTIVATIONS:
        return None
    name, alpha_attr = _FUSABLE_ACTIVATIONS[op]
    if op == "Gelu" and follower.attrs.get("approximate", "none") in ("tanh", b"tanh"):
        name = "gelu_tanh"
    return {"activation": name, "alpha": follower.attrs.get(alpha_attr, 0.01) if alpha_attr else 0.0}


class Node:
    """One operator call: op type, input and output value names, parsed attributes."""

    __slots__ = ("op_type", "inputs", "outputs", "attrs", "name")

    def __init__(self, op_type, inputs, outputs, attrs, name=""):
        self.op_type, self.inputs, self.outputs, self.attrs, self.name = op_type, inputs, outputs, attrs, name


def _read_nodes(graph, where, opset=None, budget=None) -> list[Node]:
    """``Node`` objects of a graph's nodes (or of a list of ``proto.NodeProto``); the
    subgraphs of control-flow nodes (checked by ``check``) become ``Body`` objects, their
    constant folding taking from ``budget`` (a one-element list of bytes left; None: no limit)."""
    nodes = []
    for n in getattr(graph, "nodes", graph):
        attrs = dict(n.attrs)
        if n.op_type == "Split":
            attrs["_num_outputs"] = len(n.outputs)
        if n.op_type == "LayerNormalization":      # the mean / inv-std outputs cost two passes
            attrs["_stats"] = any(n.outputs[1:])
        for key in check.SUBGRAPHS.get(n.op_type, ()):
            label = f"{where}: node {check.short(n.name or n.outputs[0])} ({n.op_type}) {key}"
            attrs[key] = _subgraph(attrs[key], n.inputs[attrs["_formal"]:], opset, label, budget)
        nodes.append(Node(n.op_type, list(n.inputs), list(n.outputs), attrs, n.name))
    return nodes


def _subgraph(graph, captures, opset, where, budget) -> Body:
    """A checked subgraph as a ``Body``: a model whose inputs are the subgraph's inputs, then
    the outer values ``captures``; constant-folded (within ``budget``; Ifs on constant
    conditions inlined), not fused."""
    constants = dict(graph.initializers)
    outputs = [vo.name for vo in graph.outputs]
    nodes = prune(_read_nodes(graph.nodes, where, opset, budget), outputs)
    nodes = _mark_loops(_fold_and_inline(nodes, constants, outputs, opset, budget, where), constants)
    used = set(outputs).union(*(n.inputs for n in nodes))
    inputs = [(vi.name, np.dtype(DTYPES.get(vi.elem_type, np.float32)), None) for vi in graph.inputs]
    inputs += [(name, np.dtype(np.float32), None) for name in captures]
    model = OnnxModel(where, inputs, outputs, {k: v for k, v in constants.items() if k in used},
                      nodes, opset, {}, where)
    types = [(np.dtype(DTYPES[vo.elem_type]) if vo.elem_type in DTYPES else None, _value_shape(vo))
             for vo in graph.outputs]
    return Body(model, types)


def _fold(nodes, constants, opset, budget, where) -> list[Node]:
    """``fold_constants`` within what is left of ``budget`` (a one-element list, or None),
    which the memory of the new constants is taken from."""
    if budget is None:
        return fold_constants(nodes, constants, opset, None, where)
    owners = {id(_owner(v)) for v in constants.values()}
    nodes = fold_constants(nodes, constants, opset, budget[0], where)
    new = {id(_owner(v)): _owner(v) for v in constants.values() if id(_owner(v)) not in owners}
    budget[0] -= sum(getattr(o, "nbytes", 0) for o in new.values())
    return nodes


def _fold_and_inline(nodes, constants, outputs, opset, budget, where) -> list[Node]:
    """Constant folding (``_fold``); each If whose condition became a constant replaced by its
    branch (``inline_constant_ifs``), which is folded in turn; then the dead nodes dropped."""
    nodes = _fold(nodes, constants, opset, budget, where)
    changed = True
    while changed:
        nodes, changed = inline_constant_ifs(nodes, constants)
        nodes = _fold(nodes, constants, opset, budget, where) if changed else nodes
    return prune(nodes, outputs)


def _may_not_end(node) -> bool:
    """Whether ``node`` is, or holds in a subgraph, a Loop without a trip count (which only
    its condition ends)."""
    return (node.op_type == "Loop" and not node.inputs[0]) or any(
        isinstance(v, Body) and any(map(_may_not_end, v.model._nodes)) for v in node.attrs.values())


def _has_loop(nodes) -> bool:
    """Whether ``nodes`` or the subgraphs of their control-flow nodes hold a Loop."""
    return any(n.op_type == "Loop" or any(isinstance(v, Body) and _has_loop(v.model._nodes)
                                          for v in n.attrs.values()) for n in nodes)


def _mark_loops(nodes, constants) -> list[Node]:
    """Loop nodes get ``_bounded``: whether the file alone sets how long they may run (a
    constant trip count, or none: the condition alone ends the loop), so that
    ``control.MAX_LOOP_ITERATIONS`` bounds them."""
    for node in nodes:
        if node.op_type == "Loop":
            node.attrs = dict(node.attrs, _bounded=not node.inputs[0] or node.inputs[0] in constants)
    return nodes


def inline_constant_ifs(nodes, constants) -> tuple[list[Node], bool]:
    """Each If whose condition is a constant -> the nodes of the branch it takes, their values
    renamed apart (``<output>::<branch>::<name>``, the branch's constants likewise) and an
    Identity per output; also whether any was replaced."""
    kept, changed = [], False
    for node in nodes:
        cond = constants.get(node.inputs[0]) if node.op_type == "If" else None
        if cond is None or cond.size != 1:
            kept.append(node)
            continue
        key = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = node.attrs[key].model
        prefix = f"{node.outputs[0]}::{key}::"
        local = set(branch._constants).union(*(n.outputs for n in branch._nodes))

        def renamed(name):
            return prefix + name if name in local else name

        for name, value in branch._constants.items():
            constants[prefix + name] = value
        kept += [Node(n.op_type, [renamed(i) for i in n.inputs], [renamed(o) for o in n.outputs],
                      n.attrs, n.name) for n in branch._nodes]
        kept += [Node("Identity", [renamed(b)], [o], {}) for o, b in zip(node.outputs, branch.output_names) if o]
        changed = True
    return kept, changed


# ------------------------------------------------------------------------------ optimisation
#: Operators whose output may outgrow their inputs by broadcasting them against each other.
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual",
                 "GreaterOrEqual", "And", "Or", "Xor", "Where", "Sum", "Max", "Min", "Mean", "PRelu"}


def _predicted_bytes(node, values):
    """The bytes of ``node``'s output on ``values`` where it may outgrow its inputs and its
    size follows from their shapes alone (broadcasting, products, gathers, concatenations);
    None for the others (those creating tensors from values check their own sizes,
    ``ops.created``; the rest are no larger than their inputs)."""
    arrays = [np.asarray(v) for v in values if v is not None]
    if not arrays:
        return None
    item = max(a.itemsize for a in arrays)
    if node.op_type in _BROADCASTING:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    elif node.op_type == "MatMul" and len(arrays) == 2 and min(arrays[0].ndim, arrays[1].ndim) >= 1:
        a, b = arrays
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:-1] + b.shape[-1:]
    elif node.op_type == "Gemm" and len(arrays) >= 2:    # an upper bound, whatever transA/B
        shape = (max(arrays[0].shape, default=1), max(arrays[1].shape, default=1))
    elif node.op_type == "Gather" and len(arrays) == 2:
        shape = arrays[1].shape + arrays[0].shape
    elif node.op_type == "Concat":
        return sum(a.nbytes for a in arrays)
    else:
        return None
    count = 1
    for d in shape:
        count *= int(d)
    return count * item


def fold_constants(nodes, constants, opset, budget: int | None = None,
                   where: str = "ONNX model") -> list[Node]:
    """Run every node whose inputs are all constants; keep the others. ``budget``: the bytes
    the constants made may take in all (None: no limit; views of constants cost nothing); a
    node that would go over it, or that fails, raises ``ModelFileError`` (``UnsupportedError``
    for what fastlayers does not implement) naming ``where`` and the node."""
    kept = []
    used, owners = 0, {id(_owner(v)) for v in constants.values()}
    for node in nodes:
        if node.op_type in _NONDETERMINISTIC or not all(i == "" or i in constants for i in node.inputs) \
                or _may_not_end(node):   # not run at load
            kept.append(node)
            continue
        values = [constants[i] if i else None for i in node.inputs]
        left = None if budget is None else budget - used
        label = f"node {check.short(node.name or node.outputs[0])} ({node.op_type})"
        try:
            predicted = _predicted_bytes(node, values) if left is not None else None
            if predicted is not None and predicted > left:
                raise SizeLimitError(f"its result would take {predicted} bytes")
            token = CREATE_LIMIT.set(left)
            try:
                with np.errstate(all="ignore"):
                    outs = OPS[node.op_type](values, node.attrs, opset)
            finally:
                CREATE_LIMIT.reset(token)
        except SizeLimitError as e:
            raise ModelFileError(
                f"{where}: {label}: folding it at load ({e}) would take the graph's constants over "
                f"{budget} bytes (max(MAX_FOLD_BYTES, 2 x its initializers); raise "
                "FASTLAYERS_ONNX_MAX_FOLD_BYTES for a graph that needs more)") from None
        except UnsupportedError as e:
            raise UnsupportedError(f"{where}: {label}: {e}") from None
        except FastlayersError as e:
            raise ModelFileError(f"{where}: {label} cannot be computed at load: {e}") from None
        except Exception as e:  # noqa: BLE001 - any failure of an operator on the file's constants
            raise ModelFileError(f"{where}: {label} cannot be computed at load "
                                 f"({type(e).__name__}: {str(e)[:300]})") from None
        for name, value in zip(node.outputs, outs):
            if name:
                value = np.asarray(value)
                owner = _owner(value)
                if id(owner) not in owners:
                    owners.add(id(owner))
                    used += getattr(owner, "nbytes", value.nbytes)
                constants[name] = value
        if budget is not None and used > budget:
            raise ModelFileError(
                f"{where}: {label}: the constants folded at load take {used} bytes, over {budget} "
                "(max(MAX_FOLD_BYTES, 2 x its initializers); raise FASTLAYERS_ONNX_MAX_FOLD_BYTES "
                "for a graph that needs more)")
    return kept


def _consumers(nodes, outputs) -> dict[str, int]:
    count: dict[str, int] = {name: 1 for name in outputs}
    for node in nodes:
        for i in node.inputs:
            count[i] = count.get(i, 0) + 1
    return count


def _bias_vector(value, units):
    """A constant added on the last axis of a dense output, as a (units,) vector, else None."""
    if value is None or value.dtype != np.float32:
        return None
    if value.shape in ((units,), (1, units)):
        return np.ascontiguousarray(value.reshape(units))
    return None


def fuse_dense(nodes, constants, outputs) -> list[Node]:
    """MatMul/Gemm with constant 2-D weights (+ Add of a bias) (+ an activation) -> FusedDense."""
    producers = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    uses = _consumers(nodes, outputs)
    removed: set[int] = set()
    for k, node in enumerate(nodes):
        if k in removed:
            continue
        w = constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if node.op_type == "MatMul" and w is not None and w.ndim == 2 and w.dtype == np.float32:
            node.op_type, node.inputs, node.attrs = "FusedDense", [node.inputs[0], node.inputs[1]], {}
        elif (node.op_type == "Gemm" and w is not None and w.dtype == np.float32 and not node.attrs.get("transA", 0)
              and node.attrs.get("alpha", 1.0) == 1.0 and node.attrs.get("beta", 1.0) == 1.0):
            c = constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            bias = _bias_vector(c, w.shape[0] if node.attrs.get("transB", 0) else w.shape[1]) if c is not None else None
            if c is not None and bias is None:
                continue
            w_name = node.inputs[1]
            if node.attrs.get("transB", 0):
                w_name = f"{node.inputs[1]}::T"
                constants[w_name] = np.ascontiguousarray(w.T)
            ins = [node.inputs[0], w_name]
            if bias is not None:
                constants[f"{node.name or k}::bias"] = bias
                ins.append(f"{node.name or k}::bias")
            node.op_type, node.inputs, node.attrs = "FusedDense", ins, {}
        else:
            continue
        # absorb a following Add of a bias, then an activation, when this node is their only input
        for _ in range(2):
            out = node.outputs[0]
            nxt = [j for j, n in enumerate(nodes) if j not in removed and j > k and out in n.inputs]
            if uses.get(out, 0) != 1 or len(nxt) != 1:
                break
            j = nxt[0]
            follower = nodes[j]
            if follower.op_type == "Add" and len(node.inputs) == 2:
                other = follower.inputs[1] if follower.inputs[0] == out else follower.inputs[0]
                bias = _bias_vector(constants.get(other), constants[node.inputs[1]].shape[1])
                if bias is None:
                    break
                constants[f"{other}::vec"] = bias
                node.inputs.append(f"{other}::vec")
            elif "activation" not in node.attrs and _fused_activation(follower, constants):
                node.attrs = _fused_activation(follower, constants)
            else:
                break
            node.outputs = follower.outputs
            removed.add(j)
    del producers
    return [n for k, n in enumerate(nodes) if k not in removed]


def fuse_conv(nodes, constants, outputs) -> list[Node]:
    """Conv with constant weights (+ BatchNormalization folded in) (+ an activation) -> FusedConv,
    its weights pre-transposed to the backend's HWIO layout once."""
    uses = _consumers(nodes, outputs)
    removed: set[int] = set()
    for k, node in enumerate(nodes):
        w = constants.get(node.inputs[1]) if node.op_type == "Conv" and len(node.inputs) > 1 else None
        if w is None or w.dtype != np.float32 or w.ndim not in (3, 4):
            continue
        b = constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if len(node.inputs) > 2 and node.inputs[2] and b is None:
            continue
        attrs = dict(node.attrs)
        scale = None     # per output channel, from a BatchNormalization folded in
        for _ in range(2):
            out = node.outputs[0]
            nxt = [j for j, n in enumerate(nodes) if j not in removed and j > k and out in n.inputs]
            if uses.get(out, 0) != 1 or len(nxt) != 1:
                break
            follower = nodes[nxt[0]]
            if follower.op_type == "BatchNormalization" and "activation" not in attrs \
                    and not follower.attrs.get("training_mode", 0) \
                    and all(i in constants for i in follower.inputs[1:5]) and len(follower.outputs) == 1:
                scale, beta, mean, var = (constants[i].astype(np.float32) for i in follower.inputs[1:5])
                scale = (scale / np.sqrt(var + np.float32(follower.attrs.get("epsilon", 1e-5)))).astype(np.float32)
                b = ((np.zeros_like(mean) if b is None else b) - mean) * scale + beta
            elif "activation" not in attrs and _fused_activation(follower, constants):
                attrs.update(_fused_activation(follower, constants))
            else:
                break
            node.outputs = follower.outputs
            removed.add(nxt[0])
        key = node.name or f"conv{k}"
        w_hwio = oihw_to_hwio(w[:, :, None, :] if w.ndim == 3 else w)
        if scale is not None:
            w_hwio *= scale
        attrs["_w_hwio"] = w_hwio
        node.inputs = [node.inputs[0], ""]
        if b is not None:
            constants[f"{key}::b"] = np.asarray(b, np.float32)
            node.inputs.append(f"{key}::b")
        node.op_type, node.attrs = "FusedConv", attrs
    return [n for k, n in enumerate(nodes) if k not in removed]


def _scalar(constants, name):
    """The value of a one-element float constant, else None."""
    value = constants.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 and value.dtype.kind == "f" else None


def fuse_gelu(nodes, constants, outputs) -> list[Node]:
    """The exact GELU as exporters spell it, x * 0.5 * (1 + Erf(x / sqrt 2)) (Div by sqrt 2 or Mul
    by 1/sqrt 2; the 0.5 before or after; operands in either order) -> one Gelu node, which runs
    on the backend's fused kernel instead of five elementwise passes and a float64 Erf."""
    uses = _consumers(nodes, outputs)
    consumer = {}
    for k, n in enumerate(nodes):
        for i in n.inputs:
            consumer.setdefault(i, []).append(k)

    def only_user(name):
        users = consumer.get(name, [])
        return nodes[users[0]] if uses.get(name, 0) == 1 and len(users) == 1 else None

    def other(node, name):
        return node.inputs[1] if node.inputs[0] == name else node.inputs[0]

    removed: set[int] = set()
    index = {id(n): k for k, n in enumerate(nodes)}
    for erf in [n for n in nodes if n.op_type == "Erf"]:
        pre = next((n for n in nodes if erf.inputs[0] in n.outputs), None)
        if pre is None or pre.op_type not in ("Div", "Mul") or uses.get(pre.outputs[0], 0) != 1:
            continue
        c = _scalar(constants, pre.inputs[1])
        x = pre.inputs[0]
        if c is None or not np.isclose(c if pre.op_type == "Div" else 1.0 / c, np.sqrt(2.0), rtol=1e-4):
            continue
        add = only_user(erf.outputs[0])
        if add is None or add.op_type != "Add" or _scalar(constants, other(add, erf.outputs[0])) != 1.0:
            continue
        muls, current = [], add
        for _ in range(2):  # the two multiplications, by x and by 0.5, in either order
            nxt = only_user(current.outputs[0])
            if nxt is None or nxt.op_type != "Mul":
                break
            muls.append((nxt, other(nxt, current.outputs[0])))
            current = nxt
        operands = [operand for _, operand in muls]
        if len(muls) != 2 or x not in operands or _scalar(constants, operands[1 - operands.index(x)]) != 0.5:
            continue
        chain = [pre, erf, add] + [m for m, _ in muls]
        last = chain[-1]
        last.op_type, last.inputs, last.attrs = "Gelu", [x], {}
        removed.update(index[id(n)] for n in chain[:-1])
    return [n for k, n in enumerate(nodes) if k not in removed]


def _swaps_last_axes(perm) -> bool:
    """Whether a Transpose ``perm`` swaps only the last two axes."""
    perm = list(perm)
    return len(perm) >= 2 and perm == list(range(len(perm) - 2)) + [len(perm) - 1, len(perm) - 2]


def fuse_attention(nodes, constants, outputs, opset) -> list[Node]:
    """Scaled dot-product attention as exporters spell it -> one ``FusedAttention`` node, run
    by the backend's attention primitive (both products and the softmax per (batch, head) pair,
    the scores kept in cache) instead of two batched MatMuls, one to three Muls and a Softmax:

        MatMul(Mul(Q, sq), Mul(Transpose(K), sk)) [Mul by ss] [Add mask] -> Softmax(axis -1)
        -> MatMul(., V)

    Each Mul is optional and may be a Div by its scale; a scale is a one-element constant or a
    value computed from shapes (the TorchScript exporter's sqrt(1 / sqrt(d)) on Q and on K^T).
    A Transpose of the last two axes of K is read through; else K^T is taken as it is. Only
    where each intermediate has one reader and is not a graph output."""
    uses = _consumers(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    from_shapes: set[str] = set()
    for n in nodes:
        if n.op_type == "Shape" or (n.inputs and all(i in constants or i in from_shapes
                                                     for i in n.inputs if i)):
            from_shapes.update(n.outputs)
    removed: set[int] = set()
    index = {id(n): k for k, n in enumerate(nodes)}

    def single(name, *op_types):
        """The producer of ``name`` when it is one of ``op_types``, ``name`` has one reader and
        the producer is not fused yet."""
        node = producer.get(name)
        if node is None or node.op_type not in op_types or uses.get(name, 0) != 1 \
                or index[id(node)] in removed:
            return None
        return node

    def is_scale(name):
        value = constants.get(name)
        return name in from_shapes if value is None else value.size == 1

    def unscaled(name):
        """(tensor, scale, divide, nodes read through) for ``name`` = Mul(tensor, scale) or
        Div(tensor, scale), else (name, "", False, [])."""
        node = single(name, "Mul", "Div")
        if node is not None and len(node.inputs) == 2:
            a, b = node.inputs
            if is_scale(b) and not is_scale(a):
                return a, b, node.op_type == "Div", [node]
            if node.op_type == "Mul" and is_scale(a) and not is_scale(b):
                return b, a, False, [node]
        return name, "", False, []

    for sm in nodes:
        axis = sm.attrs.get("axis", -1 if opset >= 13 else 1)
        if sm.op_type != "Softmax" or axis != -1 or index[id(sm)] in removed \
                or uses.get(sm.outputs[0], 0) != 1:
            continue
        mm2 = next((n for n in nodes if sm.outputs[0] in n.inputs), None)
        if mm2 is None or mm2.op_type != "MatMul" or mm2.inputs[0] != sm.outputs[0]:
            continue
        scores, mask, chain = sm.inputs[0], "", [sm]
        add = single(scores, "Add")
        if add is not None and len(add.inputs) == 2:
            for i in (0, 1):
                if single(unscaled(add.inputs[i])[0], "MatMul") is not None:
                    scores, mask = add.inputs[i], add.inputs[1 - i]
                    chain.append(add)
                    break
        scores, s_scores, div_scores, via = unscaled(scores)
        mm1 = single(scores, "MatMul")
        if mm1 is None:
            continue
        q, s_q, div_q, via_q = unscaled(mm1.inputs[0])
        kt, s_k, div_k, via_k = unscaled(mm1.inputs[1])
        transpose = producer.get(kt)
        k_transposed = not (transpose is not None and transpose.op_type == "Transpose"
                            and _swaps_last_axes(transpose.attrs.get("perm", ())))
        k = kt if k_transposed else transpose.inputs[0]
        mm2.op_type = "FusedAttention"
        mm2.inputs = [q, k, mm2.inputs[1], s_q, s_k, s_scores, mask]
        mm2.attrs = {"_k_transposed": k_transposed, "_divide": (div_q, div_k, div_scores)}
        removed.update(index[id(n)] for n in chain + via + [mm1] + via_q + via_k)
    return [n for k, n in enumerate(nodes) if k not in removed]


def mark_attention_scores(nodes, outputs) -> list[Node]:
    """Opset-23 Attention nodes get ``_qk_read``: whether anything reads their scores output
    (without a reader the op runs as one call of the attention primitive)."""
    uses = _consumers(nodes, outputs)
    for node in nodes:
        if node.op_type == "Attention":
            node.attrs = dict(node.attrs, _qk_read=len(node.outputs) > 3 and
                              uses.get(node.outputs[3], 0) > 0)
    return nodes


def fuse_embedding_recurrent(nodes, constants, outputs) -> list[Node]:
    """Gather of rows of a constant 2-D float32 table (an embedding) feeding the X of an RNN,
    GRU or LSTM node with constant W, directly or through a Transpose to time-major, whose output
    nothing else reads -> ``Embedding<op>`` on the ids: its input projection becomes a gather of
    rows of table @ W^T + bias (``fastlayers/folding.py``). The Gather stays for any other
    reader (exporters take the batch size from its shape); unread, it is pruned."""
    uses = _consumers(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    for node in list(nodes):
        if node.op_type not in ("RNN", "GRU", "LSTM") or node.inputs[1] not in constants:
            continue
        x = node.inputs[0]
        src = producer.get(x)
        time_major = node.attrs.get("layout", 0) == 0
        if src is not None and src.op_type == "Transpose" and uses.get(x, 0) == 1 \
                and list(src.attrs.get("perm", ())) == [1, 0, 2]:
            src, time_major = producer.get(src.inputs[0]), not time_major
        if src is None or src.op_type != "Gather" or src.attrs.get("axis", 0) != 0:
            continue
        table = constants.get(src.inputs[0])
        if table is None or table.dtype != np.float32 or table.ndim != 2 or \
                src.inputs[1] in constants:
            continue
        node.inputs = [src.inputs[0], src.inputs[1], *node.inputs[1:]]
        node.attrs = dict(node.attrs, _ids_time_major=time_major)
        node.op_type = f"Embedding{node.op_type}"
        shapes_of_ids(nodes, src, table.shape[1], constants)
    return nodes


def shapes_of_ids(nodes, gather, width, constants) -> None:
    """Shape nodes reading an embedding Gather's output (rows of ``width``) read its ids
    instead, the row width appended by a Concat: the Gather then has no reader left."""
    emb, ids = gather.outputs[0], gather.inputs[1]
    for k in range(len(nodes) - 1, -1, -1):
        shape = nodes[k]
        if shape.op_type != "Shape" or shape.inputs != [emb] or shape.attrs:
            continue
        constants[f"{emb}::width"] = np.array([width], np.int64)
        out = shape.outputs[0]
        shape.inputs, shape.outputs = [ids], [f"{out}::ids"]
        nodes.insert(k + 1, Node("Concat", [f"{out}::ids", f"{emb}::width"], [out], {"axis": 0}))


def fuse_encoder_layers(nodes, constants, inputs, outputs, probe) -> list[Node]:
    """Whole Transformer encoder layers -> one ``FusedEncoderLayer`` node each
    (``fastlayers/io/encoder.py``): matched by structure, then confirmed on the values of
    ``probe(nodes)`` (the unfused graph run once on a probe input; None when it could not run).
    ``inputs``: the graph's input names.
    A layer is replaced only where nothing outside it reads its intermediate values."""
    candidates = encoder.match(nodes, constants, outputs)
    values = probe(nodes) if candidates else None
    if values is None:
        return nodes
    for candidate in candidates:
        attrs = encoder.confirmed(candidate, values)
        if attrs is None:
            continue
        core = {id(n) for n in candidate.nodes}
        name = candidate.attention.name or candidate.y
        fused = Node("FusedEncoderLayer", [candidate.x], [candidate.y], dict(attrs, name=name), name)
        trial = prune([fused if candidate.y in n.outputs else n for n in nodes
                       if id(n) not in core or candidate.y in n.outputs], outputs)
        known = set(constants) | set(inputs) | {o for n in trial for o in n.outputs}
        if all(o in known for o in outputs) and all(not i or i in known for n in trial for i in n.inputs):
            nodes = trial
    return nodes


def prune(nodes, outputs) -> list[Node]:
    """Keep only the nodes the graph outputs depend on."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    return kept[::-1]


# --------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as the model file declares it, as onnxruntime's ``NodeArg``.

    Attributes
    ----------
    name : str
    shape : list
        One entry per dimension: an int where the file fixes it, the dim_param string where it
        names it, None where it does neither; [] for a scalar or a value declared without a shape.
    type : str or None
        onnxruntime's type string, e.g. 'tensor(float)', 'tensor(int64)'; None where the file
        declares no tensor type.
    """

    name: str
    shape: list = field(hash=False)
    type: str | None


def _owner(array):
    """The object that owns the memory of ``array`` (itself, or the end of its ``base`` chain)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def _declared(value_info) -> tuple:
    """(name, type string, dimensions) of a declared graph input or output, for ``NodeArg``."""
    return (value_info.name, ORT_TYPES.get(value_info.elem_type),
            tuple(_value_shape(value_info, named=True) or ()))


class OnnxModel:
    """A model imported from ONNX, run on fastlayers primitives.

    Call it like a fastlayers model: ``model(x)``, ``model(x1, x2)``, ``model([x1, x2])`` or
    ``model({"input_name": x})``; it returns one array or a list (one per graph output).
    Or like an ``onnxruntime.InferenceSession``: ``run``, ``get_inputs``, ``get_outputs``.

    ``declared``: (inputs, outputs) as the file declares them, each a list of ``_declared``
    tuples, and the initializers the file also lists as graph inputs (None: from ``inputs``,
    with no output information).
    """

    def __init__(self, name, inputs, outputs, constants, nodes, opset, shapes, where, declared=None):
        self.name, self.opset, self._where = name, opset, where
        self._inputs = inputs            # [(name, numpy dtype, shape with None for symbolic dims)]
        self.output_names = list(outputs)
        if declared is None:
            types = {np.dtype(t): ORT_TYPES[k] for k, t in DTYPES.items()}
            declared = ([(n, types[d], tuple(s or ())) for n, d, s in inputs],
                        [(n, None, ()) for n in outputs], ())
        self._declared_inputs, self._declared_outputs, self._initializer_inputs = declared
        self._constant_owners = {id(_owner(c)) for c in constants.values()}
        self._constants = constants
        self._nodes = nodes
        self._shapes = shapes
        #: What a pickle carries: the serialized ModelProto it was imported from (``from_bytes``),
        #: the file to read it from again (``load_onnx``: the model keeps no second copy of its
        #: file), or None (not self-contained: its weights lie in external data files).
        self._source = None
        # Nodes computing only from input shapes (Shape, Size and what combines them with
        # constants) give the same values for the same input shapes: their outputs are cached
        # per input-shape key and skipped on later calls.
        shape_only: set[str] = set()
        for n in nodes:
            if n.op_type in ("Shape", "Size") or (
                    n.op_type not in _NONDETERMINISTIC
                    and all(not i or i in constants or i in shape_only for i in n.inputs)):
                shape_only.update(o for o in n.outputs if o)
        self._plan = [(OPS[n.op_type], [None if not i else (constants[i] if i in constants else i)
                                         for i in n.inputs], n.outputs,
                       {**n.attrs, "_windows": {}} if n.op_type in WINDOW_OPS else n.attrs,
                       any(o in shape_only for o in n.outputs)) for n in nodes]
        self._shape_outputs = [o for n in nodes for o in n.outputs if o in shape_only]
        self._shape_cache: dict = {}

    @property
    def input_names(self) -> list[str]:
        return [name for name, _, _ in self._inputs]

    @property
    def op_types(self) -> list[str]:
        """The operators run per call, after optimisation, in order."""
        return [n.op_type for n in self._nodes]

    def _weights(self) -> list[np.ndarray]:
        """The arrays the optimised graph holds: constants, fused nodes' weights, and those of
        the subgraphs of its control-flow nodes."""
        arrays = list(self._constants.values())
        for n in self._nodes:
            for v in n.attrs.values():
                if isinstance(v, np.ndarray):
                    arrays.append(v)
                elif isinstance(v, Body):
                    arrays += v.model._weights()
        return arrays

    def count_params(self) -> int:
        """The float32 weights the optimised graph holds (constants and fused nodes' weights,
        those of subgraphs included)."""
        unique = {id(a): a for a in self._weights() if a.dtype == np.float32}
        return int(sum(a.size for a in unique.values()))

    def _prepare(self, args, kwargs, strict=False):
        """The input arrays, checked and cast, in graph order. ``strict``: a name given that
        is not an input is an error (else it is ignored)."""
        feed = kwargs or (args[0] if len(args) == 1 and isinstance(args[0], dict) else None)
        if feed is not None:
            names = self.input_names
            arrays = [feed.get(name) for name in names]
            unknown = [k for k in feed if k not in names] if strict else None
            if unknown:
                folded = [k for k in unknown if k in self._initializer_inputs]
                raise InputError(
                    f"ONNX model {self.name!r}: unknown input name(s) {unknown}; its inputs are "
                    f"{names}" + (f" ({', '.join(map(repr, folded))}: initializer(s), "
                                  f"constants of the graph that cannot be fed)" if folded else ""))
        elif len(args) == 1 and isinstance(args[0], (list, tuple)) and len(self._inputs) > 1:
            arrays = list(args[0])
        else:
            arrays = list(args)
        if len(arrays) != len(self._inputs) or any(a is None for a in arrays):
            missing = [n for n, a in zip(self.input_names, arrays) if a is None] if feed is not None else []
            raise ShapeError(f"ONNX model {self.name!r} expects inputs {self.input_names}, got "
                             f"{len([a for a in arrays if a is not None])}"
                             + (f"; missing {missing}" if missing else ""))
        out = []
        for (name, dtype, shape), a in zip(self._inputs, arrays):
            a = np.asarray(a)
            if a.dtype.kind not in "biuf":
                raise ShapeError(f"ONNX model {self.name!r} input {name!r}: expected a numeric array, "
                                 f"got dtype {a.dtype}")
            a = a.astype(dtype, copy=False)
            if shape is not None and (a.ndim != len(shape) or any(
                    d is not None and d != s for d, s in zip(shape, a.shape))):
                want = ", ".join("?" if d is None else str(d) for d in shape)
                raise ShapeError(f"ONNX model {self.name!r} input {name!r}: expected shape ({want}), "
                                 f"got {a.shape}")
            out.append(a)
        return out

    def __call__(self, *args, **kwargs):
        results = self._results(self._evaluate(self._prepare(args, kwargs)), self.output_names)
        return results[0] if len(results) == 1 else results

    def _results(self, values, names, fresh=False) -> list[np.ndarray]:
        """The arrays of outputs ``names`` from the value table of a call, C-ordered (ops may
        pass NCHW views of NHWC memory along, ops._nchw). ``fresh``: arrays, copied where
        they would share memory with an input of the call or a constant of the model, as
        onnxruntime returns."""
        results = [values[o] if o in values else self._constants[o] for o in names]
        if not fresh:
            return [contiguous(r) for r in results]
        shared = self._constant_owners.union([id(_owner(values[i])) for i, _, _ in self._inputs])
        return [r.copy() if r.flags.c_contiguous and id(_owner(r)) in shared else contiguous(r)
                for r in map(np.asarray, results)]

    def run(self, output_names, input_feed, run_options=None) -> list[np.ndarray]:
        """Run the graph once, as ``onnxruntime.InferenceSession.run``.

        Parameters
        ----------
        output_names : list of str or None
            The graph outputs to return, in this order; None or [] for all of them.
        input_feed : dict
            Input name -> array, one for each name of ``get_inputs()`` and no other; each is cast
            to the input's declared element type and checked against its declared shape.
        run_options : None
            onnxruntime's ``RunOptions``; only None is accepted.

        Returns
        -------
        list of ndarray
            One array per name of ``output_names``.

        Raises
        ------
        UnsupportedError
            For ``run_options`` other than None.
        InputError
            For an output name the graph does not have, an input name unknown to the graph,
            or an input missing from ``input_feed`` or of the wrong shape (``ShapeError``).
        """
        if run_options is not None:
            raise UnsupportedError(f"ONNX model {self.name!r}: run options are not supported "
                                   f"(got {type(run_options).__name__}; pass run_options=None)")
        if isinstance(output_names, str):
            raise InputError(f"ONNX model {self.name!r}: output_names must be a list of names or None, "
                             f"got the string {output_names!r}")
        names = list(output_names) if output_names else self.output_names
        unknown = [o for o in names if o not in self.output_names]
        if unknown:
            raise InputError(f"ONNX model {self.name!r}: unknown output name(s) {unknown}; its outputs "
                             f"are {self.output_names}")
        if not isinstance(input_feed, Mapping):
            raise InputError(f"ONNX model {self.name!r}: input_feed must be a dict of input name -> "
                             f"array, got {type(input_feed).__name__}")
        values = self._evaluate(self._prepare((dict(input_feed),), {}, strict=True))
        return self._results(values, names, fresh=True)

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs to feed, as the file declares them, as
        ``onnxruntime.InferenceSession.get_inputs``: initializers the file also lists as inputs
        are left out (fastlayers folds them into the graph).

        Returns
        -------
        list of NodeArg
            In graph order; ``shape`` holds ints, dim_param strings and None.
        """
        return [NodeArg(name, list(shape), type_) for name, type_, shape in self._declared_inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, as the file declares them, as
        ``onnxruntime.InferenceSession.get_outputs`` (which also fills in what its shape
        inference finds where the file is silent; see ``NodeArg``).

        Returns
        -------
        list of NodeArg
            In the order ``run(None, feed)`` returns them.
        """
        return [NodeArg(name, list(shape), type_) for name, type_, shape in self._declared_outputs]

    def _evaluate(self, arrays) -> dict:
        """Run every node on the checked input ``arrays``; the table of values by name."""
        values = dict(zip(self.input_names, arrays))
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        cached = self._shape_cache.get(key)
        if cached is not None:
            values.update(cached)
        outs = None
        try:
            with np.errstate(all="ignore"):   # NaN and inf propagate, as in onnxruntime
                for fn, ins, outs, attrs, shape_only in self._plan:
                    if shape_only and cached is not None:
                        continue
                    results = fn([values[i] if type(i) is str else i for i in ins], attrs, self.opset)
                    for name, value in zip(outs, results):
                        if name:
                            values[name] = value
        except Exception as e:  # noqa: BLE001 - an operator failing on these inputs, whatever it raised
            node = next((n for n in self._nodes if n.outputs == outs), None)
            label = "?" if node is None else f"{check.short(node.name or node.outputs[0])} ({node.op_type})"
            if isinstance(e, FastlayersError):   # the operator's own error, with the node named
                raise type(e)(f"ONNX model {self.name!r}: node {label}: {e}") from None
            text = str(e) if isinstance(e, (IndexError, ValueError)) else f"{type(e).__name__}: {e}"
            raise InputError(f"ONNX model {self.name!r}: node {label} failed on these inputs: "
                             f"{text[:500]}") from e
        if cached is None and self._shape_outputs:
            if len(self._shape_cache) >= 64:  # bound the memory of many distinct shapes
                self._shape_cache.clear()
            self._shape_cache[key] = {o: values[o] for o in self._shape_outputs}
        return values

    def warm_up(self) -> bool:
        """Run the graph once on zeros of its inputs' declared shapes (free dimensions: 1 where
        they lead, ``warmup.FREE_SIZE`` elsewhere), so that its weights are packed, its buffers
        allocated and fastlayers' threads started before the first real call;
        ``fastlayers.load`` does this.

        Returns
        -------
        bool
            Whether it ran: False for inputs without a declared rank, over
            ``warmup.MAX_ELEMENTS`` elements, or taking more bytes than the model's weights (and
            1 MiB: a small file declaring large inputs is not run at load), or a graph that
            fails on zeros of those sizes, or one with a Loop (how long it runs depends on
            the values; zeros may keep it going).
        """
        from .. import warmup

        specs = [(shape, dtype) for _, dtype, shape in self._inputs]
        total = nbytes = 0
        for shape, dtype in specs:   # exact (a file may declare dimensions whose product overflows)
            count = 1
            for k, d in enumerate(shape or ()):
                count *= (1 if k == 0 else warmup.FREE_SIZE) if d is None else d
            total += count
            nbytes += count * dtype.itemsize
        weights = sum(_array_bytes(v) for v in self._constants.values()) + sum(
            _array_bytes(v) for n in self._nodes for v in n.attrs.values())
        if total > warmup.MAX_ELEMENTS or nbytes > max(1 << 20, weights) or _has_loop(self._nodes):
            return False
        return warm_up(self._evaluate, specs)

    def predict(self, x, batch_size: int | None = None):
        """Run in batches along axis 0 of every input (all at once by default)."""
        arrays = x if isinstance(x, (list, tuple)) else [x]
        total = len(arrays[0])
        if not batch_size or total <= batch_size:
            return self(*arrays)
        parts = [self(*[a[i:i + batch_size] for a in arrays]) for i in range(0, total, batch_size)]
        if len(self.output_names) == 1:
            return np.concatenate(parts)
        return [np.concatenate([p[k] for p in parts]) for k in range(len(self.output_names))]

    def summary(self, print_fn=None) -> None:
        """Print the optimised operator sequence with the output shapes the file records
        (its value_info; "?" where it records none), and the weight count."""
        lines = [f'ONNX model "{self.name}" (opset {self.opset})', "=" * 90,
                 f"{'operator':28s}{'outputs':40s}shape", "=" * 90]
        for n in self._nodes:
            for o in n.outputs:
                shape = self._shapes.get(o)
                text = "?" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
                lines.append(f"{n.op_type:28s}{o[:38]:40s}{text}")
        lines += ["=" * 90, f"Total params: {self.count_params():,}", "=" * 90]
        (print_fn or (lambda s: print(s, file=sys.stdout)))("\n".join(lines))

    def save(self, path):
        raise UnsupportedError("an imported ONNX model cannot be saved in the fastlayers format; keep the .onnx file")

    def __reduce__(self):
        """Pickle by value: the ONNX bytes, imported again when unpickled (fastlayers.pickling)."""
        return service("reduce_onnx")(self)


def _array_bytes(value) -> int:
    """The bytes of the arrays ``value`` is or holds (a tuple of arrays: a fused node's weights)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, tuple):
        return sum(_array_bytes(v) for v in value)
    return 0


def _value_shape(value_info, named=False):
    """The dimensions of a value (None when unknown, or its name where ``named``), or None
    without a shape."""
    if value_info.shape is None:
        return None
    return [d if (isinstance(d, int) and d >= 0) or (named and isinstance(d, str)) else None
            for d in value_info.shape]


def _prober(name, inputs, dims, outputs, constants, opset, where):
    """``probe(nodes)`` for ``fuse_encoder_layers``: every value of the graph ``nodes`` on
    ``encoder.probe_inputs``, or None where it cannot run (an optimisation only)."""
    def probe(nodes):
        arrays = encoder.probe_inputs(dims)
        if arrays is None or _has_loop(nodes):   # a loop on made-up values may not end
            return None
        try:
            model = OnnxModel(name, inputs, outputs, constants, prune(nodes, outputs), opset, {}, where)
            return model._evaluate(arrays)
        except Exception:  # noqa: BLE001 - the graph may not run on the probe's sizes
            return None
    return probe


def _op_name(node) -> str:
    """A node's operator as error messages name it (``domain::op_type`` outside the default
    domain), cut short and escaped where a file makes it long or unprintable."""
    name = node.op_type if node.domain == "" else f"{node.domain}::{node.op_type}"
    return name if name.isprintable() and 0 < len(name) <= 60 else check.short(name)


def from_model(model: proto.Model, where: str) -> OnnxModel:
    """Import a model read by ``proto``."""
    graph = model.graph
    opset = model.opsets.get("")
    if opset is None or not graph.nodes:
        raise ModelFileError(f"{where}: not an ONNX model (no default-domain opset or no nodes)")
    if opset < MIN_OPSET:
        raise UnsupportedError(f"{where}: opset {opset} is older than the oldest supported ({MIN_OPSET})")
    unsupported = sorted({_op_name(n) for n in check.all_nodes(graph)
                          if ":" in n.op_type or check.qualified(n) not in check.OPS})
    if unsupported:
        raise UnsupportedError(f"{where}: unsupported ONNX operator(s): {', '.join(unsupported)}")
    quant.check_domains(model, where)
    # the graph's structure, types and attributes, checked before anything is folded or run;
    # the nodes in an order that runs, dead nodes dropped before folding
    checked = check.check_graph(graph, where, opset)
    constants = dict(graph.initializers)
    inputs, dims = [], []
    for vi in graph.inputs:
        if vi.name in constants:
            continue
        if vi.elem_type not in DTYPES:
            raise UnsupportedError(f"{where}: input {check.short(vi.name)} has unsupported "
                                   f"element type {vi.elem_type}")
        inputs.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi)))
        dims.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi, named=True)))
    outputs = [o.name for o in graph.outputs]
    budget = [max(MAX_FOLD_BYTES, 2 * sum(v.nbytes for v in graph.initializers.values())
                  + quant.dequantized_bytes(graph))]
    try:
        nodes = prune(_read_nodes(checked, where, opset, budget), outputs)
        nodes = _mark_loops(_fold_and_inline(nodes, constants, outputs, opset, budget, where),
                            constants)
        nodes = prune(rewrite.drop_noops(nodes, constants, outputs, {i: t for i, t, _ in inputs}), outputs)
        nodes = rewrite.fuse_layer_norm(rewrite.fuse_silu(nodes, constants, outputs), constants, outputs)
        nodes = rewrite.fold_affine(rewrite.conv_1d(nodes, constants, outputs), constants, outputs)
        # GELU chains first, so that the Gelu node they become is absorbed by a dense node
        nodes = fuse_dense(fuse_gelu(nodes, constants, outputs), constants, outputs)
        nodes = fuse_embedding_recurrent(fuse_conv(nodes, constants, outputs), constants, outputs)
        nodes = fuse_attention(nodes, constants, outputs, opset)
        nodes = quant.optimize(nodes, constants, outputs)
        nodes = prune(mark_attention_scores(nodes, outputs), outputs)
        name = graph.name or Path(where).stem
        nodes = fuse_encoder_layers(nodes, constants, [i for i, _, _ in inputs], outputs,
                                    _prober(name, inputs, dims, outputs, constants, opset, where))
    except FastlayersError:
        raise
    except Exception as e:  # noqa: BLE001 - a graph the optimisations cannot take
        raise ModelFileError(f"{where}: invalid graph ({type(e).__name__}: {str(e)[:300]})") from e
    used = set(outputs).union(*(n.inputs for n in nodes))
    constants = {k: v for k, v in constants.items() if k in used}
    shapes = {vi.name: _value_shape(vi) for vi in graph.value_info + graph.outputs}
    declared = ([_declared(vi) for vi in graph.inputs if vi.name not in graph.initializers],
                [_declared(vi) for vi in graph.outputs],
                frozenset(vi.name for vi in graph.inputs if vi.name in graph.initializers))
    return OnnxModel(name, inputs, outputs, constants, nodes, opset, shapes, where, declared)
