"""Fusions at load: MatMul/Gemm (+ bias) (+ activation) -> one dense node, Conv (+ BN) (+
activation) -> one convolution node with its weights laid out once (its bias and activation
brought in from after views of its result, ``hoist_over_views``), ConvTranspose (+
activation) and Add (+ activation) -> one node each, GELU chains -> Gelu, the
exporters' attention -> one attention node, an embedding Gather into an RNN's input
projection, and whole Transformer encoder layers (``encoder.py``) -> one node each."""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from . import encoder
from .nodes import Node, consumers, node_axes, prune, readers_of, slice_arguments
from .ops.recurrent import RECURRENT_NODES
from .records import FASTLAYERS
from .weights import ConvWeights

#: Activations a dense node absorbs: ONNX op -> (fastlayers activation, attribute giving alpha).
_FUSABLE_ACTIVATIONS = {
    "Relu": ("relu", None),
    "Sigmoid": ("onnx_sigmoid", None),
    "Tanh": ("onnx_tanh", None),
    "LeakyRelu": ("leaky_relu", "alpha"),
    "Gelu": ("gelu", None),
}


def _fused_activation(follower, constants) -> dict | None:
    """The activation attributes a dense or convolution node takes from a following activation
    node (Gelu with approximate="tanh" is the tanh form; Clip to [0, 6] or [0, inf) is relu6 or
    relu; HardSigmoid with alpha 1/6 and beta 1/2 is hard_sigmoid and HardSwish hard_silu; Swish with alpha 1, which
    ``rewrite.fuse_silu`` makes of x * Sigmoid(x), is onnx_silu; Sigmoid and Tanh are onnx_sigmoid and
    onnx_tanh, in onnxruntime's arithmetic); None where it has none."""
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
        ok = np.float32(follower.attrs.get("alpha", 0.2)) == np.float32(1 / 6) and np.float32(
            follower.attrs.get("beta", 0.5)
        ) == np.float32(0.5)
        return {"activation": "hard_sigmoid", "alpha": 0.0} if ok else None
    if op == "HardSwish":  # x max(0, min(1, x / 6 + 1/2)) = x relu6(x + 3) / 6
        return {"activation": "hard_silu", "alpha": 0.0}
    if op == "Swish":
        return {"activation": "onnx_silu", "alpha": 0.0} if follower.attrs.get("alpha", 1.0) == 1.0 else None
    if op not in _FUSABLE_ACTIVATIONS:
        return None
    name, alpha_attr = _FUSABLE_ACTIVATIONS[op]
    if op == "Gelu" and follower.attrs.get("approximate", "none") in ("tanh", b"tanh"):
        name = "gelu_tanh"
    return {"activation": name, "alpha": follower.attrs.get(alpha_attr, 0.01) if alpha_attr else 0.0}


def _fused_softmax(follower, two_d) -> dict | None:
    """The activation attributes a dense node takes from a following Softmax or LogSoftmax: over
    its last axis (axis -1, or for a 2-D output, a Gemm's, axis 1 or the default: 1 before
    opset 13, -1 after, the same axis), the softmax as its epilogue; over an axis given
    otherwise (a MatMul's 3-D output with axis 2, as PaddlePaddle writes its recognisers' heads)
    also ``_softmax``, the node's op type and attributes, for the dense node to check at run time
    whether that axis is its output's last (``ops.linear._fused_dense``); None otherwise."""
    if follower.op_type not in ("Softmax", "LogSoftmax"):
        return None
    axis = follower.attrs.get("axis")
    fused = {"activation": "softmax" if follower.op_type == "Softmax" else "log_softmax", "alpha": 0.0}
    if axis == -1 or (two_d and axis in (None, 1)):
        return fused
    return {**fused, "_softmax": (follower.op_type, dict(follower.attrs))}


def _bias_vector(value, units):
    """A constant added on the last axis of a dense output, as a (units,) vector, else None."""
    if value is None or value.dtype != np.float32:
        return None
    if value.shape in ((units,), (1, units)):
        return np.ascontiguousarray(value.reshape(units))
    return None


def fuse_dense(nodes, constants, outputs) -> list[Node]:
    """MatMul/Gemm with constant 2-D weights (+ Add of a bias) (+ an activation, or a softmax
    over the last axis) -> FusedDense."""
    producers = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    uses = consumers(nodes, outputs)
    removed: set[int] = set()
    for k, node in enumerate(nodes):
        if k in removed:
            continue
        w = constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        two_d = node.op_type == "Gemm"
        if node.op_type == "MatMul" and w is not None and w.ndim == 2 and w.dtype == np.float32:
            node.op_type, node.inputs, node.attrs = "FusedDense", [node.inputs[0], node.inputs[1]], {}
        elif (
            node.op_type == "Gemm"
            and w is not None
            and w.dtype == np.float32
            and not node.attrs.get("transA", 0)
            and node.attrs.get("alpha", 1.0) == 1.0
            and node.attrs.get("beta", 1.0) == 1.0
        ):
            c = constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            bias = _bias_vector(c, w.shape[0] if node.attrs.get("transB", 0) else w.shape[1]) if c is not None else None
            if c is not None and bias is None:
                continue
            w_name = node.inputs[1]
            if node.attrs.get("transB", 0):
                w_name = f"{node.inputs[1]}::T"
                constants[w_name] = np.ascontiguousarray(w.T)
                if uses.get(node.inputs[1], 0) == 1:  # read by this node alone: freed now
                    del constants[node.inputs[1]]
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
            elif "activation" not in node.attrs and (
                fused := _fused_activation(follower, constants) or _fused_softmax(follower, two_d)
            ):
                node.attrs = fused
            else:
                break
            node.outputs = follower.outputs
            removed.add(j)
    del producers
    return [n for k, n in enumerate(nodes) if k not in removed]


#: ONNX operators on floats -> the activation of the backends they run (``ops.elementwise``).
_PROGRAM_ACTIVATIONS = {
    "Relu": "relu",
    "Sigmoid": "onnx_sigmoid",
    "Tanh": "onnx_tanh",
    "Softsign": "softsign",
    "HardSwish": "hard_silu",
}
#: Most instructions of one FusedElementwise program.
MAX_PROGRAM = 24


def _program_form(node, constants, opset):
    """The instructions of ``node`` as ``elementwise_plan`` runs them, each input a name (a
    value or a constant) or a new constant, (op, input, input or None, param) with results
    referred to as ("insn", k) within the node; None where the operator has no such form (or
    not as its inputs are given here). Each instruction is an operation the operator's own
    implementation (``ops.elementwise``) makes, in its order."""
    ins, t = node.inputs, node.op_type
    if t in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
        return [(t.lower(), ins[0], ins[1], None)]
    if t in _PROGRAM_ACTIVATIONS:
        return [("act", ins[0], None, (_PROGRAM_ACTIVATIONS[t], 0.0))]
    if t == "LeakyRelu":
        return [("act", ins[0], None, ("leaky_relu", float(np.float32(node.attrs.get("alpha", 0.01)))))]
    if t in ("Sqrt", "Neg", "Abs"):
        return [(t.lower(), ins[0], None, None)]
    if t == "FusedAdd":
        return [
            ("add", ins[0], ins[1], None),
            ("act", ("insn", 0), None, (node.attrs["activation"], node.attrs.get("alpha", 0.0))),
        ]
    if t == "HardSigmoid":
        alpha, beta = np.float32(node.attrs.get("alpha", 0.2)), np.float32(node.attrs.get("beta", 0.5))
        if alpha == np.float32(1 / 6) and beta == np.float32(0.5):
            return [("act", ins[0], None, ("hard_sigmoid", 0.0))]
        return [
            ("mul", np.asarray(alpha), ins[0], None),
            ("add", ("insn", 0), np.asarray(beta), None),
            ("clip", ("insn", 1), None, (0.0, 1.0)),
        ]
    if t == "Pow" and len(ins) == 2:
        e = constants.get(ins[1])
        if e is not None and e.dtype == np.float32 and e.size == 1 and float(e.reshape(-1)[0]) == 2.0:
            return [("mul", ins[0], ins[0], None)]
        return None
    if t == "Clip":
        if opset < 11:
            lo, hi = node.attrs.get("min"), node.attrs.get("max")
        else:
            bounds = []
            for k in (1, 2):
                name = ins[k] if len(ins) > k else ""
                if name and (name not in constants or constants[name].size != 1):
                    return None
                bounds.append(float(constants[name].reshape(-1)[0]) if name else None)
            lo, hi = bounds
        lo = float(np.float32(-np.inf if lo is None else lo))
        hi = float(np.float32(np.inf if hi is None else hi))
        return [("clip", ins[0], None, (lo, hi))]
    return None


#: Operators whose node alone runs in numpy (``ops.elementwise``): one alone is a program too.
_NUMPY_ALONE = {"Sqrt", "Neg", "Abs", "Clip", "Pow", "HardSigmoid"}


def _numpy_alone(node, form) -> bool:
    """Whether ``node``, outside any chain, would run in numpy where its program runs natively
    (a HardSigmoid of torch's slope and offset is the backends' own activation)."""
    return node.op_type in _NUMPY_ALONE and not (len(form) == 1 and form[0][0] == "act")


def _float32(name, constants, dtypes) -> bool:
    """Whether the value or constant ``name`` is float32."""
    return (constants[name].dtype if name in constants else dtypes.get(name)) == np.float32


def fuse_elementwise(nodes, constants, outputs, dtypes, opset) -> list[Node]:
    """Elementwise float32 nodes (arithmetic, the activations the backends know, Sqrt, Neg,
    Abs, Clip, Pow by 2, HardSigmoid, FusedAdd) whose values only the next of them reads -> one
    FusedElementwise node: one program the backend runs in one pass (``Ops.elementwise_plan``;
    on the cpu backend over blocks that stay in cache where its tensors share one shape and
    memory order, e.g. a squeeze-and-excite gate times a feature map plus that map). A region
    grows from a node whose value something else reads (a graph output, another operator, two
    readers) back through the producers of its inputs that nothing else reads; ``dtypes``: the
    element types known at load (``rewrite.known_dtypes``), float32 for every value it takes."""
    # readers by node: a node reading a value twice (x * x) is its only reader
    uses = {name: len({id(r) for r in rs}) for name, rs in readers_of(nodes, outputs).items()}
    producer = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    forms, dtypes = {}, dict(dtypes)
    for k, n in enumerate(nodes):
        if len(n.outputs) == 1 and all(_float32(i, constants, dtypes) for i in n.inputs if i):
            form = _program_form(n, constants, opset)
            if form is not None:  # float32 operations of float32 values: a float32 value
                forms[k] = form
                dtypes[n.outputs[0]] = np.dtype(np.float32)
    removed: set[int] = set()
    inside = set()  # nodes taken by a region
    for root in range(len(nodes) - 1, -1, -1):
        if root not in forms or root in inside:
            continue
        region, frontier = {root}, [root]
        while frontier:
            k = frontier.pop()
            for i in nodes[k].inputs:
                j = producer.get(i)
                if j is not None and j in forms and j not in region and j not in inside and uses.get(i) == 1:
                    if sum(len(forms[m]) for m in region) + len(forms[j]) <= MAX_PROGRAM:
                        region.add(j)
                        frontier.append(j)
        if len(region) < 2 and not _numpy_alone(nodes[root], forms[root]):
            continue
        inside |= region
        order = sorted(region)  # the graph's order: producers first
        operands: list[str] = []

        def operand(v):
            if isinstance(v, np.ndarray):  # a constant the node's form makes
                name = f"{nodes[root].outputs[0]}::program{len(constants)}"
                constants[name] = v
                v = name
            if v not in operands:
                operands.append(v)
            return v

        def outside(v):
            return v is not None and not isinstance(v, tuple) and not (isinstance(v, str) and producer.get(v) in region)

        named = [
            (k, [(op, *(operand(v) if outside(v) else v for v in (a, b)), param) for op, a, b, param in forms[k]])
            for k in order
        ]
        index = {name: i for i, name in enumerate(operands)}
        program: list[tuple] = []
        for k, form in named:
            base = len(operands) + len(program)
            for op, a, b, param in form:
                refs = [-1 if v is None else base + v[1] if isinstance(v, tuple) else index[v] for v in (a, b)]
                program.append((op, refs[0], refs[1], param))
            index[nodes[k].outputs[0]] = len(operands) + len(program) - 1
        node = nodes[root]
        fused = "+".join(nodes[k].op_type for k in order)
        node.op_type, node.inputs, node.attrs = "FusedElementwise", operands, {"program": tuple(program), "_ops": fused}
        removed |= region - {root}
    return [n for k, n in enumerate(nodes) if k not in removed]


def fuse_dense_chains(nodes, constants, outputs) -> list[Node]:
    """Runs of FusedDense nodes, each reading the output of the one before, which nothing else
    reads -> one FusedDenseChain node (``ops.linear``): the backend's ``dense_chain_plan`` runs
    them in one call (on the cpu backend one native call, the values between layers in buffers
    of the call's own), where a plan of small layers (an MLP at batch 1) spent most of its time
    between them. A dense node whose softmax is over an axis given (``_softmax``) stays alone."""
    uses = consumers(nodes, outputs)
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(k)

    def link(node):
        return (
            node.op_type == "FusedDense"
            and "_softmax" not in node.attrs
            and all(i in constants for i in node.inputs[1:])
        )

    removed: set[int] = set()
    for k, node in enumerate(nodes):
        if k in removed or not link(node):
            continue
        chain = [node]
        while True:
            out = chain[-1].outputs[0]
            users = readers.get(out, [])
            if (
                uses.get(out, 0) != 1
                or len(users) != 1
                or not link(nodes[users[0]])
                or nodes[users[0]].inputs[0] != out
            ):
                break
            chain.append(nodes[users[0]])
            removed.add(users[0])
        if len(chain) < 2:
            continue
        inputs, layers = [node.inputs[0]], []
        for n in chain:
            inputs += [n.inputs[1], n.inputs[2] if len(n.inputs) > 2 else ""]
            layers.append((n.attrs.get("activation", "linear"), float(n.attrs.get("alpha", 0.0))))
        node.op_type, node.inputs, node.outputs = "FusedDenseChain", inputs, chain[-1].outputs
        node.attrs = {"layers": tuple(layers)}
    return [n for k, n in enumerate(nodes) if k not in removed]


#: Views of a convolution's result that keep each element's channel: what ``hoist_over_views``
#: moves a following per-channel affine and activation in front of.
_CHANNEL_VIEWS = ("Slice", "Squeeze")


def _channel_view_rank(node, constants, rank, channels):
    """The rank of what the Slice or Squeeze ``node`` makes of a rank-``rank`` value holding
    ``channels`` channels on axis 1, where each element it keeps keeps its channel, still on axis
    1: a Slice from 0 by steps of 1 that keeps every channel (it may cut the other axes short),
    a Squeeze of constant axes past 1. None for any other."""
    if node.op_type == "Slice":
        found = slice_arguments(node, constants)
        if found is None:
            return None
        starts, ends, axes, steps = found
        if (starts != 0).any() or (steps != 1).any() or ((axes < -rank) | (axes >= rank)).any():
            return None
        axes = axes % rank
        return rank if len(set(axes.tolist())) == axes.size and (ends[axes == 1] >= channels).all() else None
    if node.op_type == "Squeeze":
        listed = node_axes(node, constants)
        if not listed or any(not -rank <= int(a) < rank for a in listed):
            return None  # (no axes: every axis of length 1, the channels' too where there is one)
        axes = {int(a) % rank for a in listed}
        return rank - len(axes) if min(axes) > 1 and len(axes) == len(listed) else None
    return None


def hoist_over_views(nodes, constants, outputs) -> list[Node]:
    """Conv -> views of its result that keep each element's channel (``_channel_view_rank``:
    whole or cut-short Slices, Squeezes of spatial axes) -> Mul / Div / Add / Sub by one value
    or one per channel, then at most one activation the epilogues know
    (``_fused_activation``) -> the arithmetic and the activation first, on the convolution's
    result, then the views: the same values (elementwise work commutes with taking a part
    of the elements), and the convolution's bias and epilogue take what ``fold_affine`` and
    ``fuse_conv`` then find right after it. tf2onnx and jax2tf spell a 1-D convolution's
    bias and activation after such views (magika's Conv1D: Conv -> Slice -> Squeeze -> Add
    -> GELU)."""
    readers = readers_of(nodes, outputs)
    position = {id(n): k for k, n in enumerate(nodes)}

    def only_reader(name):
        users = readers.get(name, [])
        return users[0] if len(users) == 1 else None  # (a graph output is read by None too)

    order = list(nodes)
    for conv in nodes:
        w = constants.get(conv.inputs[1]) if conv.op_type == "Conv" and len(conv.inputs) > 1 else None
        if w is None or w.dtype != np.float32 or w.ndim not in (3, 4):
            continue
        channels, rank = w.shape[0], w.ndim
        views, value, view_rank = [], conv.outputs[0], rank
        while (nxt := only_reader(value)) is not None and nxt.op_type in _CHANNEL_VIEWS and nxt.inputs[0] == value:
            made = _channel_view_rank(nxt, constants, view_rank, channels)
            if made is None:
                break
            views.append(nxt)
            value, view_rank = nxt.outputs[0], made
        moved, vectors = [], []
        while views and (nxt := only_reader(value)) is not None:
            if nxt.op_type in ("Mul", "Div", "Add", "Sub") and not (
                nxt.op_type in ("Div", "Sub") and nxt.inputs[0] != value
            ):
                vector = _channel_constant(nxt, value, constants, channels, view_rank)
                if vector is None:
                    break
                vectors.append(vector)
            elif nxt.inputs[0] == value and _fused_activation(nxt, constants) is not None:
                vectors.append(None)
                moved.append(nxt)
                break
            else:
                break
            moved.append(nxt)
            value = nxt.outputs[0]
        if not moved:
            continue
        # conv -> moved (on the convolution's rank) -> views -> what the last moved node made
        last, before = moved[-1].outputs[0], views[-1].outputs[0]
        source = conv.outputs[0]
        for node, vector in zip(moved, vectors):
            at = node.inputs.index(before)
            node.inputs[at] = source
            if vector is not None:
                name = f"{node.outputs[0]}::per-channel"
                constants[name] = vector.reshape((1, channels) + (1,) * (rank - 2))
                node.inputs[1 - at] = name
            before = source = node.outputs[0]
        moved[-1].outputs = [f"{last}::before-views"]
        views[0].inputs[0] = moved[-1].outputs[0]
        views[-1].outputs = [last]
        slots = sorted(position[id(n)] for n in views + moved)
        for k, node in zip(slots, moved + views):
            order[k] = node
    return order


#: Convolution weights smaller than this are zero in a FusedConv. A channel that training
#: switched off (a folded BatchNormalization's scale near 0) keeps weights of 1e-38 or so, and
#: each product of such a weight and an activation is a subnormal float, which x86 cores
#: compute in a microcode assist hundreds of cycles long: PP-OCRv5's classifier spent 14 ms of
#: 56 in a stem convolution whose 27 weights of one channel were below 1e-35 (0.8 ms without
#: them). What a zeroed weight took away is below 1e-30 of its activation, far under float32's
#: resolution of any output that is not itself that small.
TINY_WEIGHT = 2.0**-100


def fuse_conv(nodes, constants, outputs) -> list[Node]:
    """Conv with constant weights (+ BatchNormalization folded in) (+ an activation) (+ a Mul
    and / or an Add by one value or one per channel, ``_post_affine``) -> FusedConv, its
    weights pre-transposed to the backend's HWIO layout once (those below ``TINY_WEIGHT`` in
    magnitude zero), then held in the backend's form (``weights.ConvWeights``); one whose
    result only the graph's outputs read is marked ``_planes_out`` (its result wanted as NCHW
    planes, ``conv2d_planes_plan``'s ``output``)."""
    uses = consumers(nodes, outputs)
    removed: set[int] = set()
    held = ConvWeights()
    for k, node in enumerate(nodes):
        w = constants.get(node.inputs[1]) if node.op_type == "Conv" and len(node.inputs) > 1 else None
        if w is None or w.dtype != np.float32 or w.ndim not in (3, 4):
            continue
        b = constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        if len(node.inputs) > 2 and node.inputs[2] and b is None:
            continue
        attrs = dict(node.attrs)
        scale = None  # per output channel, from a BatchNormalization folded in
        for _ in range(2):
            out = node.outputs[0]
            nxt = [j for j, n in enumerate(nodes) if j not in removed and j > k and out in n.inputs]
            if uses.get(out, 0) != 1 or len(nxt) != 1:
                break
            follower = nodes[nxt[0]]
            if (
                follower.op_type == "BatchNormalization"
                and "activation" not in attrs
                and not follower.attrs.get("training_mode", 0)
                and all(i in constants for i in follower.inputs[1:5])
                and len(follower.outputs) == 1
            ):
                scale, beta, mean, var = (constants[i].astype(np.float32) for i in follower.inputs[1:5])
                scale = (scale / np.sqrt(var + np.float32(follower.attrs.get("epsilon", 1e-5)))).astype(np.float32)
                b = ((np.zeros_like(mean) if b is None else b) - mean) * scale + beta
            elif "activation" not in attrs and (fused := _fused_activation(follower, constants)):
                attrs.update(fused)
            else:
                break
            node.outputs = follower.outputs
            removed.add(nxt[0])
        post = _post_affine(nodes, k, removed, uses, constants, w.shape[0], w.ndim)
        if post is not None:
            attrs["_post_affine"] = post
        if node.outputs[0] in outputs and uses.get(node.outputs[0], 0) == 1:
            attrs["_planes_out"] = True  # read only as the graph's output: wanted as NCHW planes
        key = node.name or f"conv{k}"
        w_hwio = get_ops().oihw_to_hwio(w[:, :, None, :] if w.ndim == 3 else w)
        if scale is not None:
            w_hwio = w_hwio * scale
        tiny = np.abs(w_hwio) < TINY_WEIGHT
        if tiny.any():
            if not w_hwio.flags.writeable:  # a written graph's weights are the layer's own
                w_hwio = w_hwio.copy()
            w_hwio[tiny] = 0.0
        attrs["_w_hwio"] = held(w_hwio, attrs.get("group", 1))  # the backend's form alone
        node.inputs = [node.inputs[0], ""]
        if b is not None:
            constants[f"{key}::b"] = np.asarray(b, np.float32)
            node.inputs.append(f"{key}::b")
        node.op_type, node.attrs = "FusedConv", attrs
    return [n for k, n in enumerate(nodes) if k not in removed]


def _channel_constant(node, x, constants, channels, rank):
    """The float32 constant that the binary ``node`` applies to its input ``x`` (the output of
    a convolution of ``rank`` dimensions and ``channels`` output channels), as one value per
    channel (``channels``,), where it is one value or one per channel on axis 1 and broadcasting
    leaves x's shape alone; else None."""
    if len(node.inputs) != 2 or x not in node.inputs or node.inputs[0] == node.inputs[1]:
        return None
    c = constants.get(node.inputs[1] if node.inputs[0] == x else node.inputs[0])
    if c is None or c.dtype != np.float32 or c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for k, d in enumerate(shape) if k != 1) or shape[1] not in (1, channels):
        return None
    return np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (channels,)), np.float32)


def _post_affine(nodes, k, removed, uses, constants, channels, rank):
    """(scale, shift) of a Mul and / or an Add by constants (``_channel_constant``) that follow
    the convolution ``nodes[k]`` (after its activation), in that order, each the only reader of
    the value before: the node takes their outputs and they join ``removed``; None where there
    is neither. The convolution applies y scale + shift per channel to its result
    (``ops.conv._conv``), as the PP-LCNetV3 "learnable affine" blocks after each activation
    of PP-OCR's models are."""
    node, found = nodes[k], {}
    for op_type in ("Mul", "Add"):
        out = node.outputs[0]
        nxt = [j for j, n in enumerate(nodes) if j not in removed and j > k and out in n.inputs]
        if uses.get(out, 0) != 1 or len(nxt) != 1 or nodes[nxt[0]].op_type != op_type:
            continue
        value = _channel_constant(nodes[nxt[0]], out, constants, channels, rank)
        if value is None:
            break
        found[op_type] = value
        node.outputs = nodes[nxt[0]].outputs
        removed.add(nxt[0])
    if not found:
        return None
    return (
        found.get("Mul", np.ones(channels, np.float32)),
        found.get("Add", np.zeros(channels, np.float32)),
    )


def _absorb_activations(nodes, constants, outputs, wants, absorb) -> list[Node]:
    """Each node ``wants(node)`` accepts whose output is read only by an activation the
    backends' epilogues know (``_fused_activation``): ``absorb(node, fused)`` takes the
    activation's attributes in, the node takes the activation's outputs and the activation
    node goes."""
    uses = consumers(nodes, outputs)
    readers = {}
    for j, n in enumerate(nodes):
        for i in n.inputs:
            readers.setdefault(i, []).append(j)
    removed: set[int] = set()
    for node in nodes:
        if not wants(node):
            continue
        out = node.outputs[0]
        nxt = readers.get(out, [])
        if uses.get(out, 0) != 1 or len(nxt) != 1:
            continue
        fused = _fused_activation(nodes[nxt[0]], constants)
        if fused is None:
            continue
        absorb(node, fused)
        node.outputs = nodes[nxt[0]].outputs
        removed.add(nxt[0])
    return [n for k, n in enumerate(nodes) if k not in removed]


def fuse_conv_transpose(nodes, constants, outputs) -> list[Node]:
    """ConvTranspose (+ an activation) -> the activation as its ``_activation`` and ``_alpha``
    attributes, run in the kernel's epilogue (a bias Add after it ``rewrite.fold_affine`` has
    already taken in)."""

    def absorb(node, fused):
        node.attrs = {**node.attrs, "_activation": fused["activation"], "_alpha": fused["alpha"]}

    return _absorb_activations(
        nodes, constants, outputs, lambda n: n.op_type == "ConvTranspose" and "_activation" not in n.attrs, absorb
    )


def fuse_add_activation(nodes, constants, outputs) -> list[Node]:
    """Add of two computed values (a residual connection) whose only reader is an activation the
    backends' epilogues know (Relu, Sigmoid, ...) -> one FusedAdd node: f(a + b) in one pass,
    without the sum as an array of its own."""

    def absorb(node, fused):
        node.op_type, node.attrs = "FusedAdd", fused

    return _absorb_activations(
        nodes,
        constants,
        outputs,
        lambda n: n.op_type == "Add" and len(n.inputs) == 2 and not any(i in constants for i in n.inputs),
        absorb,
    )


def fuse_conv_residual(nodes, constants, outputs) -> list[Node]:
    """A FusedConv whose only reader is an Add of it and another computed value r (a residual
    connection), or a FusedAdd (the Add and its activation g) -> the FusedConv takes r as its
    fourth input and g as ``_residual`` (activation, alpha): g(conv(x) + r), the residual added
    to each block of output rows as the kernel writes them (``Ops.conv2d_residual_plan``) rather
    than in a pass of its own over both arrays. The fused node takes the Add's place in the
    order, where r has been computed. A convolution with a scale and shift after it
    (``_post_affine``), which would come after the Add, stays as it is."""
    uses = consumers(nodes, outputs)
    made = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    moved: dict[int, Node] = {}  # the Add's index -> the convolution that replaces it
    taken: set[int] = set()
    for k, node in enumerate(nodes):
        if node.op_type not in ("Add", "FusedAdd") or len(node.inputs) != 2 or len(set(node.inputs)) != 2:
            continue
        if any(i in constants or not i for i in node.inputs):
            continue
        for side in (0, 1):
            j = made.get(node.inputs[side])
            conv = nodes[j] if j is not None else None
            if (
                conv is None
                or j in taken
                or conv.op_type != "FusedConv"
                or len(conv.outputs) != 1
                or uses.get(conv.outputs[0], 0) != 1
                or conv.attrs.get("_post_affine") is not None
                or "_residual" in conv.attrs
            ):
                continue
            act = (node.attrs.get("activation", "linear"), node.attrs.get("alpha", 0.0))
            conv.attrs = {**conv.attrs, "_residual": act}
            conv.inputs = [*conv.inputs[:3], *[""] * (3 - len(conv.inputs)), node.inputs[1 - side]]
            conv.outputs = node.outputs
            moved[k] = conv
            taken.add(j)
            break
    return [moved.get(k, n) for k, n in enumerate(nodes) if k not in taken]


def _scalar(constants, name):
    """The value of a one-element float constant, else None."""
    value = constants.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 and value.dtype.kind == "f" else None


def fuse_gelu(nodes, constants, outputs) -> list[Node]:
    """The exact GELU as exporters spell it, x * 0.5 * (1 + Erf(x / sqrt 2)) (Div by sqrt 2 or Mul
    by 1/sqrt 2; the 0.5 before or after; operands in either order) -> one Gelu node, which runs
    on the backend's fused kernel instead of five elementwise passes and a float64 Erf."""
    uses = consumers(nodes, outputs)
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


#: Arithmetic a tanh GELU is spelled with: ONNX op -> numpy function.
_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}
#: Most arithmetic nodes on either side of the Tanh in one tanh GELU.
_GELU_TANH_NODES = 8


def _gelu_tanh(x):
    """x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the reference the spelled forms must match."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def fuse_gelu_tanh(nodes, constants, outputs) -> list[Node]:
    """The tanh GELU as exporters spell it, x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in
    any arrangement of Add/Sub/Mul/Div/Pow by scalars and by x around one Tanh (torch's Pow(x,
    3), jax2tf's x * (c x) * x, the 0.5 and the x in either order) -> one Gelu node with
    approximate="tanh", which a dense or convolution node before it takes as its activation.
    The arithmetic before the Tanh must read only x, one-element constants (with no more axes
    than x is known to have) and its own values, the arithmetic after it such constants and x
    once, no value but the last read elsewhere; the chain is then run on sample points and
    kept only where it matches the formula."""
    readers = readers_of(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    order = {id(n): k for k, n in enumerate(nodes)}

    def arithmetic(node):
        return node is not None and node.op_type in _ARITHMETIC and len(node.inputs) == 2

    def rank_at_least(name, depth=4):
        """A lower bound on the rank of ``name``: a convolution's is at least 3, broadcast
        arithmetic has at least its operands' ranks (constants' known, others' bounded the
        same way)."""
        node = producer.get(name)
        if node is not None and node.op_type == "Conv":
            return 3
        if depth == 0 or not arithmetic(node):
            return 0
        return max(constants[i].ndim if i in constants else rank_at_least(i, depth - 1) for i in node.inputs)

    def before(value, x, region):
        """Add to ``region`` the arithmetic computing ``value`` from x and scalars; False where
        something else feeds it or one of its values is read outside."""
        if value == x or _scalar(constants, value) is not None:
            return True
        node = producer.get(value)
        if not arithmetic(node) or len(region) >= 2 * _GELU_TANH_NODES:
            return False
        if id(node) not in region:
            region[id(node)] = node
            if not all(before(i, x, region) for i in node.inputs):
                return False
        return True

    def matches(region, x, last):
        sample = np.linspace(-5.0, 5.0, 41)
        env = {x: sample}
        for node in sorted(region.values(), key=lambda n: order[id(n)]):
            args = [env[i] if i in env else _scalar(constants, i) for i in node.inputs]
            env[node.outputs[0]] = np.tanh(args[0]) if node.op_type == "Tanh" else _ARITHMETIC[node.op_type](*args)
        return np.allclose(env[last.outputs[0]], _gelu_tanh(sample), rtol=1e-5, atol=1e-6)

    removed: set[int] = set()
    for tanh in [n for n in nodes if n.op_type == "Tanh"]:
        # after the Tanh: arithmetic by constants and one Mul by a value, x or what x makes
        # by arithmetic with constants (torch's x * 0.5)
        after, factor, current = [], None, tanh
        while len(after) < _GELU_TANH_NODES:
            users = readers.get(current.outputs[0], [])
            nxt = users[0] if len(users) == 1 else None
            if not arithmetic(nxt) or nxt.inputs[0] == nxt.inputs[1]:
                break
            other = nxt.inputs[1] if nxt.inputs[0] == current.outputs[0] else nxt.inputs[0]
            if _scalar(constants, other) is None:
                if factor is not None or nxt.op_type != "Mul":
                    break
                factor = other
            after.append(nxt)
            current = nxt
        candidates, value = [], factor
        while value is not None and len(candidates) < 4:
            candidates.append(value)
            node = producer.get(value)
            operands = [i for i in node.inputs if _scalar(constants, i) is None] if arithmetic(node) else []
            value = operands[0] if len(operands) == 1 else None
        for x in candidates:
            region: dict[int, Node] = {id(tanh): tanh}
            if not (before(tanh.inputs[0], x, region) and before(factor, x, region)):
                continue
            # a one-element constant of more axes than x would add axes to the result
            chain = list(region.values()) + after
            if max((constants[i].ndim for n in chain for i in n.inputs if i in constants), default=0) > rank_at_least(
                x
            ):
                continue
            inside = set(region) | {id(n) for n in after}
            if any(
                r is None or id(r) not in inside for n in region.values() for o in n.outputs for r in readers.get(o, [])
            ):
                continue
            for end in range(len(after), 0, -1):
                last = after[end - 1]
                if factor in {i for n in after[:end] for i in n.inputs} and matches(
                    {**region, **{id(n): n for n in after[:end]}}, x, last
                ):
                    removed.update(set(region) | {id(n) for n in after[: end - 1]})
                    last.op_type, last.inputs, last.attrs = "Gelu", [x], {"approximate": "tanh"}
                    break
            break
    return [n for n in nodes if id(n) not in removed]


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
    A Transpose of the last two axes of K is read through; else K^T is taken as it is. The
    Softmax's axis is kept (``_axis``): a positive one (PaddlePaddle's axis=3 on 4-D scores)
    is the last axis at run time or the node runs the graph's own Softmax. Only where each
    intermediate has one reader and is not a graph output."""
    uses = consumers(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    from_shapes: set[str] = set()
    for n in nodes:
        if n.op_type == "Shape" or (n.inputs and all(i in constants or i in from_shapes for i in n.inputs if i)):
            from_shapes.update(n.outputs)
    removed: set[int] = set()
    index = {id(n): k for k, n in enumerate(nodes)}

    def single(name, *op_types):
        """The producer of ``name`` when it is one of ``op_types``, ``name`` has one reader and
        the producer is not fused yet."""
        node = producer.get(name)
        if node is None or node.op_type not in op_types or uses.get(name, 0) != 1 or index[id(node)] in removed:
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
        if sm.op_type != "Softmax" or index[id(sm)] in removed or uses.get(sm.outputs[0], 0) != 1:
            continue
        axis = sm.attrs.get("axis", -1 if opset >= 13 else 1)
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
        k_transposed = not (
            transpose is not None
            and transpose.op_type == "Transpose"
            and _swaps_last_axes(transpose.attrs.get("perm", ()))
        )
        k = kt if k_transposed else transpose.inputs[0]
        mm2.op_type = "FusedAttention"
        mm2.inputs = [q, k, mm2.inputs[1], s_q, s_k, s_scores, mask]
        mm2.attrs = {"_k_transposed": k_transposed, "_divide": (div_q, div_k, div_scores), "_axis": axis}
        removed.update(index[id(n)] for n in chain + via + [mm1] + via_q + via_k)
    return [n for k, n in enumerate(nodes) if k not in removed]


def mark_attention_scores(nodes, outputs) -> list[Node]:
    """Opset-23 Attention nodes get ``_qk_read``: whether anything reads their scores output
    (without a reader the op runs as one call of the attention primitive)."""
    uses = consumers(nodes, outputs)
    for node in nodes:
        if node.op_type == "Attention":
            node.attrs = dict(node.attrs, _qk_read=len(node.outputs) > 3 and uses.get(node.outputs[3], 0) > 0)
    return nodes


def mark_recurrent_sequences(nodes, outputs) -> list[Node]:
    """RNN, GRU and LSTM nodes (and their ``Embedding<op>`` and ``Masked<op>`` forms) get ``_y_read``: whether
    anything reads their Y output (without a reader the time loops write no output per step)."""
    uses = consumers(nodes, outputs)
    for node in nodes:
        if node.op_type in RECURRENT_NODES:
            node.attrs = dict(node.attrs, _y_read=bool(node.outputs) and uses.get(node.outputs[0], 0) > 0)
    return nodes


def _classes(value) -> int | None:
    """V where ``value`` is the integer constant arange(V) on its last axis, every other axis
    of length 1 (the classes a one-hot encoding compares ids with), else None."""
    if value is None or value.dtype.kind not in "iu" or value.ndim < 1 or value.size != value.shape[-1]:
        return None
    return value.size if value.size and np.array_equal(value.reshape(-1), np.arange(value.size)) else None


def fuse_one_hot_dense(nodes, constants, outputs) -> list[Node]:
    """A one-hot encoding multiplied by constant weights, Cast(Equal(ids, arange(V)), float) ->
    FusedDense (V, E) (jax2tf's ``jax.nn.one_hot`` before a Dense: magika), with a following
    Add of a constant (1, ..., 1, E) bias and an activation -> one ``OneHotDense`` node on the
    ids: a gather of rows of weights + bias, row V (ids outside [0, V)) the bias alone, the
    activation applied to that table once per backend. Exact: a one-hot row times the weights
    is the weights' row (every other product a zero), so the row plus the bias is the one
    rounding the graph makes. Only where every weight is finite (0 x inf would be NaN) and each
    intermediate has this one reader; an ids tensor whose last axis is not 1 runs the
    encoding and the product (``ops/linear.py``)."""
    uses = consumers(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    removed: set[int] = set()
    for node in nodes:
        if node.op_type != "FusedDense" or len(node.inputs) != 2 or node.attrs or uses.get(node.inputs[0]) != 1:
            continue
        cast = producer.get(node.inputs[0])
        if cast is None or cast.op_type != "Cast" or cast.attrs.get("to") != 1 or uses.get(cast.inputs[0]) != 1:
            continue
        equal = producer.get(cast.inputs[0])
        if equal is None or equal.op_type != "Equal" or len(equal.inputs) != 2:
            continue
        side = (
            1 if _classes(constants.get(equal.inputs[1])) else 0 if _classes(constants.get(equal.inputs[0])) else None
        )
        w = constants[node.inputs[1]]
        if side is None or equal.inputs[1 - side] in constants:
            continue
        classes = constants[equal.inputs[side]]
        if w.shape[0] != classes.size or not np.isfinite(w).all():
            continue
        fused = Node(
            "OneHotDense",
            [equal.inputs[1 - side], equal.inputs[side], node.inputs[1]],
            node.outputs,
            {"activation": "linear", "alpha": 0.0},
            node.name,
        )
        # a following Add of a bias on the last axis (whose rank the output's reaches: the
        # classes' rank), then an activation, each the only reader of what it reads
        for wants in ("bias", "activation"):
            readers = [n for n in nodes if fused.outputs[0] in n.inputs and id(n) not in removed]
            if uses.get(fused.outputs[0]) != 1 or len(readers) != 1:
                break
            follower = readers[0]
            if wants == "bias":
                if follower.op_type != "Add":
                    continue  # no bias: an activation may follow
                other = follower.inputs[1] if follower.inputs[0] == fused.outputs[0] else follower.inputs[0]
                bias = constants.get(other)
                if (
                    bias is None
                    or bias.dtype != np.float32
                    or bias.shape[-1:] != (w.shape[1],)
                    or bias.size != w.shape[1]
                    or bias.ndim > classes.ndim
                ):
                    break
                constants[f"{other}::vec"] = np.ascontiguousarray(bias.reshape(-1))
                fused.inputs.append(f"{other}::vec")
            else:
                activation = _fused_activation(follower, constants)
                if activation is None:
                    break
                fused.attrs.update(activation)
            fused.outputs = follower.outputs
            removed.add(id(follower))
        removed.update((id(node), id(cast), id(equal)))
        nodes[nodes.index(node)] = fused
    return [n for n in nodes if id(n) not in removed]


def fuse_embedding_recurrent(nodes, constants, outputs) -> list[Node]:
    """Gather of rows of a constant 2-D float32 table (an embedding) feeding the X of an RNN,
    GRU or LSTM node (or fastlayers' ``Masked<op>``) with constant W, directly or through a
    Transpose to time-major, whose output nothing else reads (but Shape nodes, which then read
    the Gather's shape permuted) -> ``Embedding<op>`` (``EmbeddingMasked<op>``) on the ids: its
    input projection becomes a gather of
    rows of table @ W^T + bias (``fastlayers/folding.py``). The Gather stays for any other
    reader (exporters take the batch size from its shape); unread, it is pruned."""
    uses = consumers(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    for node in list(nodes):
        kind = node.op_type.removeprefix(f"{FASTLAYERS}::Masked")
        if kind not in ("RNN", "GRU", "LSTM") or node.inputs[1] not in constants:
            continue
        x = node.inputs[0]
        src = producer.get(x)
        time_major = node.attrs.get("layout", 0) == 0
        shapes = []  # Shape nodes reading the Transpose (torch's exporter: the batch size)
        if src is not None and src.op_type == "Transpose" and list(src.attrs.get("perm", ())) == [1, 0, 2]:
            shapes = [n for n in nodes if x in n.inputs and n is not node]
            if uses.get(x, 0) != len(shapes) + 1 or any(
                n.op_type != "Shape" or n.attrs or n.inputs != [x] for n in shapes
            ):
                continue
            src, time_major = producer.get(src.inputs[0]), not time_major
        if src is None or src.op_type != "Gather" or src.attrs.get("axis", 0) != 0:
            continue
        table = constants.get(src.inputs[0])
        if table is None or table.dtype != np.float32 or table.ndim != 2 or src.inputs[1] in constants:
            continue
        for shape in shapes:  # Shape(Transpose(e)) = Shape(e) permuted
            out, k = shape.outputs[0], nodes.index(shape)
            constants[f"{x}::perm"] = np.array([1, 0, 2], np.int64)
            shape.inputs, shape.outputs = [src.outputs[0]], [f"{out}::unpermuted"]
            nodes.insert(k + 1, Node("Gather", [f"{out}::unpermuted", f"{x}::perm"], [out], {"axis": 0}))
        node.inputs = [src.inputs[0], src.inputs[1], *node.inputs[1:]]
        node.attrs = dict(node.attrs, _ids_time_major=time_major)
        node.op_type = f"Embedding{kind}" if kind == node.op_type else f"EmbeddingMasked{kind}"
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
    """Whole Transformer encoder layers -> one ``FusedEncoderLayer`` node each, and
    self-attention blocks outside such layers (q/k/v projection, attention, output projection:
    torch's ``MultiheadAttention``) -> one ``FusedSelfAttention`` node each
    (``fastlayers/onnx/encoder.py``): matched by structure, then confirmed on the values of
    ``probe(nodes)`` (the unfused graph run once on a probe input; None when it could not run).
    ``inputs``: the graph's input names.
    A layer or block is replaced only where nothing outside it reads its intermediate values."""
    found = encoder.match(nodes, constants, outputs)
    values = probe(nodes) if found else None
    if values is None:
        return nodes
    for alternatives in found:
        for candidate in alternatives:
            if isinstance(candidate, encoder.Candidate):
                op_type, y, core = "FusedEncoderLayer", candidate.y, candidate.nodes
                attrs = encoder.confirmed(candidate, values)
                if attrs is None:
                    continue
            else:
                end = encoder.confirmed_block(candidate, values)
                if end is None:
                    continue
                y, passed, attrs = end
                op_type, core = "FusedSelfAttention", candidate.nodes + passed
            trial = _replaced(nodes, {id(n) for n in core}, candidate, op_type, y, attrs, outputs)
            known = set(constants) | set(inputs) | {o for n in trial for o in n.outputs}
            if all(o in known for o in outputs) and all(not i or i in known for n in trial for i in n.inputs):
                nodes = trial
                break
    return nodes


def _replaced(nodes, core, candidate, op_type, y, attrs, outputs) -> list[Node]:
    """``nodes`` with those in ``core`` (ids) replaced by one ``op_type`` node from the
    candidate's input to ``y``."""
    name = candidate.attention.name or y
    fused = Node(op_type, [candidate.x], [y], dict(attrs, name=name), name)
    return prune([fused if y in n.outputs else n for n in nodes if id(n) not in core or y in n.outputs], outputs)
