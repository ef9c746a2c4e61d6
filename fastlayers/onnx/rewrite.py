"""Load-time rewrites of an ONNX graph into fewer nodes, run by ``onnx.from_model`` in this
order after constant folding and before the dense / convolution fusions:

- ``drop_noops``: Identity, inference Dropout, Cast to the type its input has, Transpose by the
  identity permutation, Slice of every element (start 0, end the largest int64, step 1), Add /
  Sub of a scalar 0, Mul / Div by a scalar 1, Squeeze of the axes
  an Unsqueeze just added; a Reshape to a constant shape reads the input of a Reshape, Flatten,
  Squeeze or Unsqueeze before it (one Reshape for the chain; the nodes it skips are left for
  ``onnx.prune``); a Reshape to ``Shape(u)`` of u, or of u and a one-element constant
  through Add / Sub / Mul / Div, is dropped. Graph outputs keep their names;
- ``fuse_silu``: x * Sigmoid(x) -> one Swish node (x sigmoid(x), the backend's ``silu``), x *
  HardSigmoid(x) with alpha 1/6 and beta 1/2 -> one HardSwish node;
- ``fuse_layer_norm``: LayerNorm and RMSNorm over the last axis as exporters decompose them ->
  one LayerNormalization node (with ``_rms`` for RMSNorm);
- ``conv_1d``: Unsqueeze -> 2-D Convs with a kernel of 1 on the added axis (and elementwise
  nodes, BatchNormalizations, arithmetic) -> Squeezes of it (1-D convolutions exported as 2-D,
  tf2onnx's with Transposes around them) -> the same nodes on the rank-3 values, Convs 1-D;
- ``fold_affine``: Mul / Div / Add / Sub by a per-output-channel constant after a Conv or a
  dense MatMul / Gemm folded into its weights and bias;
- ``fold_pads``: a Pad of zeros on the spatial axes before a Conv or a pool -> the reader's
  own pads, where that gives the same.

Each pass takes the node list (``nodes.Node`` objects, changed in place), the constants (new
ones added under new names; the file's are never changed) and the graph output names, and
returns the nodes kept; a value is rewritten only where nothing else reads it.
"""

from __future__ import annotations

import numpy as np

from .nodes import node_axes, readers_of, slice_arguments
from .tensors import DTYPES


def _only_reader(readers, name):
    """The one node reading ``name``, where it is read once and is no graph output, else None."""
    users = readers.get(name, [])
    return users[0] if len(users) == 1 else None


def _scalar_of(constants, name):
    """The value of a constant holding one number with no axes (no broadcasting), else None."""
    value = constants.get(name)
    return value.item() if value is not None and value.ndim == 0 else None


#: Operators whose output has their first input's element type, whatever it is, as run here.
_MOVES_VALUES = {
    "Identity",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Slice",
    "Dropout",
    "Pad",
    "Expand",
    "Tile",
    "Gather",
}
#: Recurrent operators, whose outputs (Y, Y_h, Y_c) are float32 where X is.
_RECURRENT = {"RNN", "GRU", "LSTM"}
#: Operators whose output is bool whatever their inputs.
_GIVES_BOOL = {"Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "IsNaN", "IsInf"}
#: Operators whose output is float32 where their first input is (others, e.g. Pow by an integer
#: exponent or the float64 reductions, may widen it, and some compute float32 from float64).
_KEEPS_FLOAT32 = {
    "Relu",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "Gelu",
    "Neg",
    "Abs",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sqrt",
    "Exp",
    "Log",
    "MatMul",
    "Gemm",
    "Conv",
    "Softmax",
    "LayerNormalization",
    "BatchNormalization",
    "HardSigmoid",
    "HardSwish",
    "Softsign",
    "Clip",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MaxPool",
    "AveragePool",
    "ConvTranspose",
    # the reductions computed in float64 round to their input's type (backends/accumulate.py)
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    # fastlayers' fused nodes (the passes after the rewrites read their types too)
    "FusedConv",
    "FusedDense",
    "FusedDenseChain",
    "FusedAdd",
    # (same-type operands: Max and Min of a float32 first operand are float32)
    "Reciprocal",
    "Max",
    "Min",
}
#: Operators whose output has the element type of one of their inputs other than the first:
#: op -> that input's index (a one-hot product's weights).
_TYPE_OF_INPUT = {"OneHotDense": 2}


def known_dtypes(nodes, constants, input_dtypes) -> dict:
    """The element types known at load, as the nodes compute them: graph inputs, constants,
    Cast outputs, and the outputs of ``_MOVES_VALUES``, ``_KEEPS_FLOAT32`` and
    ``_TYPE_OF_INPUT`` nodes on them."""
    known = dict(input_dtypes)
    known.update((name, value.dtype) for name, value in constants.items())
    for node in nodes:
        first = known.get(node.inputs[0]) if node.inputs else None
        if node.op_type == "Cast" and node.attrs.get("to") in DTYPES:
            known[node.outputs[0]] = np.dtype(DTYPES[node.attrs["to"]])
        elif node.op_type in _GIVES_BOOL:
            known[node.outputs[0]] = np.dtype(bool)
        elif node.op_type in _TYPE_OF_INPUT and len(node.inputs) > _TYPE_OF_INPUT[node.op_type]:
            typed = known.get(node.inputs[_TYPE_OF_INPUT[node.op_type]])
            if typed is not None:
                known[node.outputs[0]] = typed
        elif first is not None and (
            node.op_type in _MOVES_VALUES or (node.op_type in _KEEPS_FLOAT32 and first == np.float32)
        ):
            known[node.outputs[0]] = first
        elif first == np.float32 and node.op_type in _RECURRENT:
            known.update((o, first) for o in node.outputs if o)
    return known


# ---------------------------------------------------------------------------- no-op nodes
def _passes_through(node, constants, dtypes, readers):
    """The input a node returns unchanged (values, shape and type), else None."""
    op, ins = node.op_type, node.inputs
    if op == "Identity":
        return ins[0]
    if op == "Dropout":  # inference: y = x; the mask output unread, training_mode a constant false
        mask_read = len(node.outputs) > 1 and node.outputs[1] and readers.get(node.outputs[1])
        training = len(ins) > 2 and ins[2] and (ins[2] not in constants or bool(constants[ins[2]].any()))
        return None if mask_read or training else ins[0]
    if op == "Cast":
        to, known = DTYPES.get(node.attrs.get("to")), dtypes.get(ins[0])
        return ins[0] if to is not None and known is not None and known == np.dtype(to) else None
    if op == "Transpose":
        perm = node.attrs.get("perm")
        return ins[0] if perm is not None and list(perm) == list(range(len(perm))) else None
    if op == "Slice" and _whole_slice(node, constants):
        return ins[0]
    if op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
        # (both operands have one type, T; a float64 constant would widen what float ops here
        # compute as float32 from float64 values)
        neutral = 0 if op in ("Add", "Sub") else 1
        if _scalar_of(constants, ins[1]) == neutral and constants[ins[1]].dtype != np.float64:
            return ins[0]
        if op in ("Add", "Mul") and _scalar_of(constants, ins[0]) == neutral and constants[ins[0]].dtype != np.float64:
            return ins[1]
    return None


def _whole_slice(node, constants) -> bool:
    """Whether a Slice keeps every element on any input: each of its axes from 0 to the largest
    int64 (torch's ``x[..., 0:]``, which clamps to the axis's length) by steps of 1, with
    constant arguments (``slice_arguments``)."""
    found = slice_arguments(node, constants)
    if found is None:
        return False
    starts, ends, _, steps = found
    return (
        starts.size > 0
        and bool(np.all(starts == 0))
        and bool(np.all(ends >= np.iinfo(np.int64).max))
        and bool(np.all(steps == 1))
    )


def _collapse_reshapes(nodes, constants, readers):
    """A Reshape to a constant shape (no 0 copying an input dimension) whose input only it reads
    and a Reshape, Flatten, Squeeze or Unsqueeze makes, reads that node's input instead."""
    producer = {o: n for n in nodes for o in n.outputs}
    for node in nodes:
        if node.op_type == "Squeeze":  # of the axes an Unsqueeze just added: the Unsqueeze's input
            src = producer.get(node.inputs[0])
            axes = node_axes(node, constants)
            if (
                src is not None
                and src.op_type == "Unsqueeze"
                and axes
                and _only_reader(readers, src.outputs[0]) is node
                and sorted(node_axes(src, constants) or []) == sorted(axes)
            ):
                node.op_type, node.inputs, node.attrs = "Identity", [src.inputs[0]], {}
            continue
        if node.op_type != "Reshape" or node.inputs[1] not in constants:
            continue
        shape = constants[node.inputs[1]]
        if not node.attrs.get("allowzero", 0) and (shape == 0).any():
            continue
        while True:
            src = producer.get(node.inputs[0])
            if (
                src is None
                or src.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
                or _only_reader(readers, src.outputs[0]) is not node
            ):
                break
            readers[src.inputs[0]] = [node if r is src else r for r in readers.get(src.inputs[0], [])]
            readers[src.outputs[0]] = []
            node.inputs = [src.inputs[0], node.inputs[1]]


def _reshapes_to_own_shape(nodes, constants, readers):
    """A Reshape to ``Shape(u)`` (the whole shape) of u itself, or of Add / Sub / Mul / Div of u
    and a one-element constant, becomes an Identity (PaddlePaddle's exports reshape SVTR's
    scaled queries back to their own shape). Arithmetic that only the Reshape reads takes the
    constant with no axes, so that its result has u's shape on any rank (exact, the same
    number); other arithmetic only where the constant has no axes already."""
    producer = {o: n for n in nodes for o in n.outputs}

    def source(name):
        """``name`` read through Identity nodes."""
        while name in producer and producer[name].op_type == "Identity":
            name = producer[name].inputs[0]
        return name

    for node in nodes:
        if node.op_type != "Reshape" or len(node.inputs) != 2:
            continue
        shape = producer.get(source(node.inputs[1]))
        if shape is None or shape.op_type != "Shape" or shape.attrs.get("start", 0) != 0 or "end" in shape.attrs:
            continue
        u, data = source(shape.inputs[0]), node.inputs[0]
        if source(data) != u:
            src = producer.get(source(data))
            if src is None or src.op_type not in ("Add", "Sub", "Mul", "Div") or len(src.inputs) != 2:
                continue
            operands = [source(i) for i in src.inputs]
            if u not in operands:
                continue
            c = src.inputs[1] if operands[0] == u else src.inputs[0]
            if source(c) == u or c not in constants or constants[c].size != 1:
                continue
            if constants[c].ndim:  # (a constant with no axes: the arithmetic has u's shape already)
                if _only_reader(readers, data) is not node:
                    continue
                scalar = f"{c}__no_axes"
                while scalar in constants:
                    scalar += "_"
                constants[scalar] = constants[c].reshape(())
                src.inputs = [scalar if i == c else i for i in src.inputs]
        node.op_type, node.inputs, node.attrs = "Identity", [data], {}


def drop_noops(nodes, constants, outputs, input_dtypes) -> list:
    """Nodes that return an input unchanged removed, their readers reading that input (see the
    module docstring); ``input_dtypes``: graph input name -> numpy dtype."""
    readers = readers_of(nodes, outputs)
    _collapse_reshapes(nodes, constants, readers)
    _reshapes_to_own_shape(nodes, constants, readers)
    dtypes = known_dtypes(nodes, constants, input_dtypes)
    producer = {o: n for n in nodes for o in n.outputs}
    alias: dict[str, str] = {}
    dropped: set[int] = set()
    graph_outputs = set(outputs)

    def resolved(name):
        while name in alias:  # (keys are never graph outputs, values never earlier keys: no cycle)
            name = alias[name]
        return name

    for node in nodes:
        node.inputs = [resolved(i) for i in node.inputs]
        x = _passes_through(node, constants, dtypes, readers)
        if x is None:
            continue
        y = node.outputs[0]
        src = producer.get(x)
        if y not in graph_outputs:
            alias[y] = x
        elif x not in graph_outputs and src is not None and id(src) not in dropped and src.outputs.count(x) == 1:
            # y is a graph output: the node making x names its output y, x's readers read y
            src.outputs = [y if o == x else o for o in src.outputs]
            alias[x] = y
            for reader in nodes:
                reader.inputs = [y if i == x else i for i in reader.inputs]
        else:
            node.op_type, node.inputs, node.attrs = "Identity", [x], {}
            continue
        dropped.add(id(node))
    return [n for n in nodes if id(n) not in dropped]


# ------------------------------------------------------------------------- Pad into windows
def _zero_pads(pad, constants, opset, rank):
    """(begin, end) per axis of a constant-mode Pad adding zeros to an input of ``rank`` axes,
    pads constant and none negative; None for another Pad (another value or mode, computed
    pads, axes that do not fit ``rank``)."""
    if pad.attrs.get("mode", "constant") != "constant":
        return None
    if opset < 11:
        pads, value, axes = pad.attrs.get("pads"), float(pad.attrs.get("value", 0.0)), None
    else:
        if len(pad.inputs) < 2 or pad.inputs[1] not in constants:
            return None
        pads, value, axes = [int(p) for p in np.asarray(constants[pad.inputs[1]]).reshape(-1)], 0.0, None
        if len(pad.inputs) > 2 and pad.inputs[2]:
            fill = constants.get(pad.inputs[2])
            if fill is None or fill.size > 1:
                return None
            value = float(fill.reshape(-1)[0]) if fill.size else 0.0
        if len(pad.inputs) > 3 and pad.inputs[3]:
            axes = node_axes(pad, constants, 3)
            if axes is None:
                return None
    if pads is None or value != 0.0 or np.signbit(value) or len(pads) % 2:
        return None
    n = len(pads) // 2
    axes = list(range(rank)) if axes is None else axes
    if len(axes) != n or any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != n:
        return None
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a % rank], end[a % rank] = pads[k], pads[k + n]
    if min(begin + end) < 0:
        return None
    return begin, end


def _window_rank(node, constants):
    """The rank of the input of a Conv (from its constant weight) or a pool (from its kernel)."""
    if node.op_type == "Conv":
        w = constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
        return None if w is None else w.ndim
    kernel = node.attrs.get("kernel_shape")
    return None if kernel is None else len(kernel) + 2


def _takes_zero_pads(node, begin, end, non_negative) -> bool:
    """Whether ``node``, reading a Pad's zeros on its spatial axes (``begin``, ``end``, spatial
    only), gives what it gives with those pads as its own: a Conv (zeros are its padding); an
    AveragePool counting the padding (count_include_pad); a MaxPool on values that are never
    negative (zeros lose to them as its -inf padding does) whose windows all keep a value of the
    input (pads under the window's span); ``non_negative``: whether the Pad's input is (a Relu's
    output). Explicit padding only (auto_pad NOTSET), floor mode."""
    if node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    if node.op_type == "Conv":
        return True
    if node.attrs.get("ceil_mode", 0):
        return False
    if node.op_type == "AveragePool":
        return bool(node.attrs.get("count_include_pad", 0))
    if node.op_type != "MaxPool" or (len(node.outputs) > 1 and node.outputs[1]):
        return False
    kernel = node.attrs["kernel_shape"]
    dilations = node.attrs.get("dilations") or [1] * len(kernel)
    old = node.attrs.get("pads") or [0] * (2 * len(kernel))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    n = len(kernel)
    return non_negative and all(old[i] + begin[i] < spans[i] and old[i + n] + end[i] < spans[i] for i in range(n))


def fold_pads(nodes, constants, outputs, opset) -> list:
    """A Pad adding zeros on the spatial axes whose only reader is a Conv or a pool that gives
    the same with the pads as its own (``_takes_zero_pads``) -> the reader's pads (a Keras
    ZeroPadding2D before a convolution or a pool, as tf2onnx exports it): the padded copy of
    the input is never made."""
    readers = readers_of(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    dropped: set[int] = set()
    for pad in nodes:
        if pad.op_type != "Pad":
            continue
        node = _only_reader(readers, pad.outputs[0])
        if node is None or node.op_type not in ("Conv", "AveragePool", "MaxPool") or node.inputs[0] != pad.outputs[0]:
            continue
        rank = _window_rank(node, constants)
        zeros = None if rank is None or rank < 3 else _zero_pads(pad, constants, opset, rank)
        if zeros is None or any(zeros[0][:2]) or any(zeros[1][:2]):
            continue
        begin, end = zeros[0][2:], zeros[1][2:]
        source = producer.get(pad.inputs[0])
        if not _takes_zero_pads(node, begin, end, source is not None and source.op_type == "Relu"):
            continue
        n = rank - 2
        old = node.attrs.get("pads") or [0] * (2 * n)
        node.attrs = {
            **node.attrs,
            "pads": [old[i] + begin[i] for i in range(n)] + [old[n + i] + end[i] for i in range(n)],
        }
        node.inputs = [pad.inputs[0], *node.inputs[1:]]
        dropped.add(id(pad))
    return [n for n in nodes if id(n) not in dropped]


# --------------------------------------------------------------- per-channel affine folding
def _per_channel(value, channels, rank, axis):
    """A constant broadcast along one axis of a rank-``rank`` output (``axis`` counted from the
    front; None: rank unknown, the last axis) as a (channels,) float32 vector, else None."""
    if value is None or value.dtype != np.float32 or (rank is not None and value.ndim > rank):
        return None
    if value.size == 1 and (rank is not None or value.ndim <= 1):
        return np.full(channels, value.reshape(-1)[0], np.float32)
    if rank is None:
        return value.reshape(channels) if value.shape == (channels,) else None
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[axis] == channels and all(d == 1 for k, d in enumerate(shape) if k != axis):
        return value.reshape(channels)
    return None


def fold_affine(nodes, constants, outputs) -> list:
    """Mul / Div / Add / Sub by a per-output-channel constant after a Conv or ConvTranspose
    (constant weights and bias; a grouped ConvTranspose takes Add / Sub only) or a MatMul / Gemm
    with constant 2-D weights -> its weights and bias changed instead:
    y = (x * w + b) * s + t = x * (w s) + (b s + t). A MatMul without a bias keeps its next Add
    (which ``fuse_dense`` then takes) with the bias scaled."""
    readers = readers_of(nodes, outputs)
    dropped: set[int] = set()
    for node in nodes:
        dense_or_conv = node.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and len(node.inputs) > 1
        w = constants.get(node.inputs[1]) if dense_or_conv else None
        if w is None or w.dtype != np.float32 or id(node) in dropped:
            continue
        if node.op_type == "Conv":
            if w.ndim not in (3, 4):
                continue
            channels, rank, axis = w.shape[0], w.ndim, 1
        elif node.op_type == "ConvTranspose":
            if w.ndim not in (3, 4):
                continue
            channels, rank, axis = w.shape[1] * node.attrs.get("group", 1), w.ndim, 1
        elif node.op_type == "MatMul" and w.ndim == 2:
            channels, rank, axis = w.shape[1], None, -1
        elif (
            node.op_type == "Gemm"
            and w.ndim == 2
            and not node.attrs.get("transA", 0)
            and node.attrs.get("alpha", 1.0) == 1.0
            and node.attrs.get("beta", 1.0) == 1.0
        ):
            channels, rank, axis = w.shape[0 if node.attrs.get("transB", 0) else 1], 2, 1
        else:
            continue
        has_bias = len(node.inputs) > 2 and node.inputs[2]
        if has_bias and node.inputs[2] not in constants:
            continue
        b = _per_channel(constants[node.inputs[2]], channels, None, -1) if has_bias else None
        if has_bias and b is None:
            continue
        bias_node = None  # a MatMul's Add of a bias, kept
        scale = np.ones(channels, np.float32)
        end, folded_before = node, len(dropped)
        while True:
            follower = _only_reader(readers, end.outputs[0])
            if follower is None or follower.op_type not in ("Mul", "Div", "Add", "Sub") or len(follower.inputs) != 2:
                break
            first = follower.inputs[0] == end.outputs[0]
            if not first and follower.op_type in ("Div", "Sub"):
                break
            vec = _per_channel(constants.get(follower.inputs[1 if first else 0]), channels, rank, axis)
            if vec is None or (follower.op_type == "Div" and not vec.all()):
                break
            if (
                follower.op_type in ("Mul", "Div")
                and node.op_type == "ConvTranspose"
                and node.attrs.get("group", 1) != 1
            ):
                break
            if follower.op_type in ("Mul", "Div"):
                vec = vec if follower.op_type == "Mul" else (np.float32(1) / vec).astype(np.float32)
                scale, b = scale * vec, None if b is None else b * vec
            elif node.op_type == "MatMul" and bias_node is None:
                bias_node = follower  # kept; its bias replaced below
                b = vec
                end = follower
                continue
            else:
                b = (np.zeros(channels, np.float32) if b is None else b) + (vec if follower.op_type == "Add" else -vec)
            end.outputs = follower.outputs
            dropped.add(id(follower))
        if len(dropped) == folded_before:
            continue  # nothing folded
        key = f"{node.outputs[0]}::affine"
        if not (scale == 1).all():
            if node.op_type == "Conv":
                w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
            elif node.op_type == "ConvTranspose":  # (C_in, C_out, k...), one group
                w = w * scale.reshape((1, -1) + (1,) * (w.ndim - 2))
            elif node.op_type == "Gemm" and node.attrs.get("transB", 0):
                w = w * scale[:, None]
            else:
                w = w * scale
            constants[f"{key}::w"] = np.ascontiguousarray(w, np.float32)
            node.inputs = [node.inputs[0], f"{key}::w", *node.inputs[2:]]
        if b is not None:
            constants[f"{key}::b"] = np.asarray(b, np.float32)
            if bias_node is not None:
                first = bias_node.inputs[0] in node.outputs
                bias_node.inputs = [node.outputs[0], f"{key}::b"] if first else [f"{key}::b", node.outputs[0]]
            else:
                node.inputs = [node.inputs[0], node.inputs[1], f"{key}::b"]
    return [n for n in nodes if id(n) not in dropped]


# ------------------------------------------------------------------------------ activations
def _is_hard_swish_gate(node) -> bool:
    """Whether ``node`` is HardSigmoid with alpha 1/6 and beta 1/2 (in float32), the gate of
    HardSwish: x max(0, min(1, x / 6 + 1/2))."""
    return (
        node.op_type == "HardSigmoid"
        and np.float32(node.attrs.get("alpha", 0.2)) == np.float32(1 / 6)
        and np.float32(node.attrs.get("beta", 0.5)) == np.float32(0.5)
    )


def fuse_silu(nodes, constants, outputs) -> list:
    """Mul(x, Sigmoid(x)) -> one Swish node (alpha 1: x sigmoid(x), the backend's ``silu``) and
    Mul(x, HardSigmoid(x) with alpha 1/6, beta 1/2) -> one HardSwish node (PaddlePaddle's
    exports), operands in either order, the gate read by nothing else; a dense or convolution
    node before it takes it as its activation."""
    readers = readers_of(nodes, outputs)
    dropped: set[int] = set()
    for gate in nodes:
        if gate.op_type != "Sigmoid" and not _is_hard_swish_gate(gate):
            continue
        mul = _only_reader(readers, gate.outputs[0])
        x = gate.inputs[0]
        if mul is None or mul.op_type != "Mul" or sorted(mul.inputs) != sorted([x, gate.outputs[0]]):
            continue
        if gate.op_type == "Sigmoid":
            mul.op_type, mul.inputs, mul.attrs = "Swish", [x], {"alpha": 1.0}
        else:
            mul.op_type, mul.inputs, mul.attrs = "HardSwish", [x], {}
        dropped.add(id(gate))
    return [n for n in nodes if id(n) not in dropped]


# ---------------------------------------------------------------------------- normalization
def _last_axis_mean(node, constants) -> bool:
    """Whether ``node`` is a ReduceMean over the last axis keeping it."""
    return (
        node is not None
        and node.op_type == "ReduceMean"
        and node.attrs.get("keepdims", 1) == 1
        and node_axes(node, constants) == [-1]
    )


def _squares(node, constants):
    """The value ``node`` squares (Pow by 2, or Mul of a value by itself), else None."""
    if node is None:
        return None
    if node.op_type == "Pow" and _scalar_of(constants, node.inputs[1]) == 2:
        return node.inputs[0]
    if node.op_type == "Mul" and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return None


def _vector_operand(node, value, constants):
    """The constant 1-D vector (more than one entry, float32) ``node`` combines with ``value``."""
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    vec = constants.get(other)
    return other if vec is not None and vec.ndim == 1 and vec.size > 1 and vec.dtype == np.float32 else None


def _mul_operands(node, value):
    """The other operand of a Mul reading ``value``, else None."""
    if node is None or node.op_type != "Mul" or value not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == value else node.inputs[0]


def _moments_form(sub, mean, square, sqrt, readers, constants):
    """tf2onnx's tf.nn.moments + tf.nn.batch_normalization on the last axis after the variance:
    inv = Reciprocal(sqrt) [* gamma]; x * inv + (beta - mean * inv), or x * inv - mean * inv.
    (last node, scale, bias, the nodes before it) or None."""
    x, d = sub.inputs[0], sub.outputs[0]
    inverse = _only_reader(readers, sqrt.outputs[0])
    if inverse is None or not (
        inverse.op_type == "Reciprocal" or (inverse.op_type == "Div" and _scalar_of(constants, inverse.inputs[0]) == 1)
    ):
        return None
    chain, inv, scale = [inverse], inverse.outputs[0], ""
    gamma = _only_reader(readers, inv)
    if gamma is not None and _mul_operands(gamma, inv) is not None and _vector_operand(gamma, inv, constants):
        chain.append(gamma)
        inv, scale = gamma.outputs[0], _vector_operand(gamma, inv, constants)
    users = [u for u in readers.get(inv, []) if u is not None]
    if len(users) != 2 or len(readers.get(inv, [])) != 2:
        return None
    xi = next((u for u in users if _mul_operands(u, inv) == x), None)
    mi = next((u for u in users if _mul_operands(u, inv) == mean.outputs[0] and u is not xi), None)
    if (
        xi is None
        or mi is None
        or sorted(map(id, readers.get(mean.outputs[0], []))) != sorted(map(id, [sub, mi]))
        or sorted(map(id, readers.get(d, []))) != sorted(map(id, [square] * square.inputs.count(d)))
    ):
        return None
    after = _only_reader(readers, mi.outputs[0])
    bias = ""
    if after is not None and after.op_type == "Sub" and after.inputs == [xi.outputs[0], mi.outputs[0]]:
        last = after  # x * inv - mean * inv
    elif (
        after is not None
        and after.op_type == "Sub"
        and after.inputs[1] == mi.outputs[0]
        and _vector_operand(after, mi.outputs[0], constants) == after.inputs[0]
    ):
        last = _only_reader(readers, after.outputs[0])  # x * inv + (beta - mean * inv)
        if last is None or last.op_type != "Add" or sorted(last.inputs) != sorted([xi.outputs[0], after.outputs[0]]):
            return None
        chain.append(after)
        bias = after.inputs[0]
    else:
        return None
    if _only_reader(readers, xi.outputs[0]) is not last:
        return None
    return last, scale, bias, chain + [xi, mi, sub, mean]


def fuse_layer_norm(nodes, constants, outputs) -> list:
    """Normalization over the last axis as exporters decompose it -> one LayerNormalization
    node (run by the backend's layer-norm kernel):

        d = x - ReduceMean(x); d / Sqrt(ReduceMean(d^2) + eps) [* gamma] [+ beta]   (LayerNorm)
        inv = Reciprocal(Sqrt(ReduceMean(d^2) + eps)) [* gamma];
            x * inv + (beta - ReduceMean(x) * inv), or x * inv - ReduceMean(x) * inv  (tf2onnx)
        x / Sqrt(ReduceMean(x^2) + eps), x * Reciprocal(..), x * (1 / ..) [* gamma]   (RMSNorm)

    (d^2 as Pow(d, 2) or Mul(d, d); gamma and beta constant vectors; RMSNorm becomes a
    LayerNormalization node with ``_rms``)."""
    readers = readers_of(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    dropped: set[int] = set()
    for var in nodes:
        if not _last_axis_mean(var, constants) or id(var) in dropped:
            continue
        square = producer.get(var.inputs[0])
        base = _squares(square, constants)
        if base is None or _only_reader(readers, square.outputs[0]) is not var:
            continue
        sub = producer.get(base)
        mean = producer.get(sub.inputs[1]) if sub is not None and sub.op_type == "Sub" else None
        rms = not (
            _last_axis_mean(mean, constants)
            and mean.inputs[0] == sub.inputs[0]
            and _only_reader(readers, mean.outputs[0]) is sub
        )
        add = _only_reader(readers, var.outputs[0])
        if add is None or add.op_type != "Add":
            continue
        eps_name = add.inputs[1] if add.inputs[0] == var.outputs[0] else add.inputs[0]
        eps = _scalar_of(constants, eps_name)
        sqrt = _only_reader(readers, add.outputs[0])
        if eps is None or constants[eps_name].dtype != np.float32 or sqrt is None or sqrt.op_type != "Sqrt":
            continue  # (eps has x's type: the node computes float32)
        chain = [square, var, add, sqrt]
        moments = (
            _moments_form(sub, mean, square, sqrt, readers, constants)
            if sub is not None and _last_axis_mean(mean, constants) and mean.inputs[0] == sub.inputs[0]
            else None
        )
        if moments is not None:
            last, scale, bias, before = moments
            if not (scale and bias and constants[scale].shape != constants[bias].shape):
                last.op_type, last.inputs = "LayerNormalization", [sub.inputs[0], scale, bias]
                last.attrs = {"axis": -1, "epsilon": float(eps), "_stats": False, "_rms": False}
                dropped.update(map(id, chain + before))
            continue
        last = _only_reader(readers, sqrt.outputs[0])
        if (
            last is not None
            and last.op_type in ("Reciprocal", "Div")
            and rms
            and (last.op_type == "Reciprocal" or _scalar_of(constants, last.inputs[0]) == 1)
        ):
            inverse, last = last, _only_reader(readers, last.outputs[0])  # x * (1 / s)
            if last is None or last.op_type != "Mul" or sorted(last.inputs) != sorted([base, inverse.outputs[0]]):
                continue
            chain.append(inverse)
        elif last is None or last.op_type != "Div" or last.inputs != [base, sqrt.outputs[0]]:
            continue
        if not rms:  # d is read by the square (once or twice) and the division only
            if sorted(map(id, readers.get(base, []))) != sorted(map(id, [square] * square.inputs.count(base) + [last])):
                continue
            chain += [mean, sub]
        x = base if rms else sub.inputs[0]
        scale = bias = ""
        for op in ("Mul", "Add"):
            follower = _only_reader(readers, last.outputs[0])
            vec = (
                _vector_operand(follower, last.outputs[0], constants)
                if follower is not None and follower.op_type == op
                else None
            )
            if vec is None or (rms and op == "Add"):
                continue
            chain.append(last)
            last = follower
            if op == "Mul":
                scale = vec
            else:
                bias = vec
        if scale and bias and constants[scale].shape != constants[bias].shape:
            continue
        last.op_type, last.inputs = "LayerNormalization", [x, scale, bias]
        last.attrs = {"axis": -1, "epsilon": float(eps), "_stats": False, "_rms": rms}
        dropped.update(map(id, chain))
    return [n for n in nodes if id(n) not in dropped]


# ----------------------------------------------------------------------- 1-D convolutions
#: Operators that work on each element alone (any rank) and pass a width-1 axis through.
_ELEMENTWISE = {
    "Relu",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "Clip",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Selu",
    "Gelu",
    "Softplus",
    "Softsign",
    "Swish",
    "Neg",
    "Abs",
    "Exp",
    "Erf",
    "Identity",
}


def _conv_1d_weights(conv, axis, constants):
    """(1-D weights, attributes) of a 2-D Conv with constant weights whose kernel is 1 and
    padding 0 on ``axis`` (2 or 3), else None."""
    w = constants.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    pads = list(conv.attrs.get("pads") or [0, 0, 0, 0])
    drop, keep = axis - 2, 3 - axis  # spatial index dropped and kept
    if w is None or w.ndim != 4 or w.shape[axis] != 1 or len(pads) != 4 or pads[drop] or pads[drop + 2]:
        return None  # (any auto_pad pads a length of 1 with a kernel of 1 by nothing)
    attrs = dict(conv.attrs)
    for key in ("strides", "dilations", "kernel_shape"):
        if attrs.get(key):
            attrs[key] = [list(attrs[key])[keep]]
    if "pads" in attrs:
        attrs["pads"] = [pads[keep], pads[keep + 2]]
    return np.ascontiguousarray(w[:, :, 0, :] if axis == 2 else w[:, :, :, 0]), attrs


def _without_axis(value, axis):
    """A constant broadcast against a rank-4 value whose ``axis`` is 1, for the rank-3 value
    without that axis; None where it would add or widen that axis."""
    if value is None or value.ndim > 4:
        return None
    shaped = value.reshape((1,) * (4 - value.ndim) + value.shape)
    return np.squeeze(shaped, axis) if shaped.shape[axis] == 1 else None


def _width_one_region(nodes, start, axis, outputs, constants):
    """The nodes after the Unsqueeze ``nodes[start]`` (adding ``axis``) that read what it makes,
    up to the Squeezes of that axis, when each reads only values of the region or constants and
    is a Conv with a kernel of 1 on it, an elementwise node, a BatchNormalization or an Add /
    Sub / Mul / Div; else None. (The nodes are in an order that runs.)"""
    region, squeezes, values = [], [], {nodes[start].outputs[0]}
    for node in nodes[start + 1 :]:
        data = [i for i in node.inputs if i and i not in constants]
        if not any(i in values for i in data):
            continue
        if node.op_type == "Squeeze":
            if [a % 4 for a in node_axes(node, constants) or []] != [axis]:
                return None
            squeezes.append(node)
            continue
        one_input = data == node.inputs[:1]
        if (
            not all(i in values for i in data)
            or (node.op_type == "Conv" and (_conv_1d_weights(node, axis, constants) is None or not one_input))
            or (node.op_type == "BatchNormalization" and (len(node.outputs) > 1 or not one_input))
            or (
                node.op_type in ("Add", "Sub", "Mul", "Div")
                and any(_without_axis(constants.get(i), axis) is None for i in node.inputs if i in constants)
            )
            or node.op_type not in _ELEMENTWISE | {"Conv", "BatchNormalization", "Add", "Sub", "Mul", "Div"}
        ):
            return None
        region.append(node)
        values.add(node.outputs[0])
    return None if values & set(outputs) else (region, squeezes)


def _channels_first_1d(nodes, constants, outputs, alias, dropped) -> None:
    """tf2onnx's Conv1D on (N, W, C) values, Unsqueeze([1]) -> Transpose([0, 3, 1, 2]) -> Conv
    -> Transpose([0, 2, 3, 1]) -> Squeeze([1]), respelled Transpose([0, 2, 1]) -> Unsqueeze([2])
    -> Conv -> Squeeze([2]) -> Transpose([0, 2, 1]) (the same values), so that ``conv_1d``
    finds the Unsqueeze and Squeeze beside the Conv; two Transposes([0, 2, 1]) in a row then
    cancel (into ``alias`` and ``dropped``)."""
    readers = readers_of(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}
    for node in nodes:
        perm = list(node.attrs.get("perm", ())) if node.op_type == "Transpose" else None
        if perm == [0, 3, 1, 2]:
            unsq = producer.get(node.inputs[0])
            if (
                unsq is not None
                and unsq.op_type == "Unsqueeze"
                and _only_reader(readers, unsq.outputs[0]) is node
                and [a % 4 for a in node_axes(unsq, constants) or []] == [1]
            ):
                unsq.op_type, unsq.inputs, unsq.attrs = "Transpose", unsq.inputs[:1], {"perm": [0, 2, 1]}
                node.op_type, node.attrs = "Unsqueeze", {"axes": [2]}
        elif perm == [0, 2, 3, 1]:
            squeeze = _only_reader(readers, node.outputs[0])
            if (
                squeeze is not None
                and squeeze.op_type == "Squeeze"
                and [a % 4 for a in node_axes(squeeze, constants) or []] == [1]
            ):
                squeeze.op_type, squeeze.inputs, squeeze.attrs = "Transpose", squeeze.inputs[:1], {"perm": [0, 2, 1]}
                node.op_type, node.attrs = "Squeeze", {"axes": [2]}
    for node in nodes:
        first = producer.get(node.inputs[0]) if node.op_type == "Transpose" else None
        if (
            first is not None
            and first.op_type == "Transpose"
            and id(first) not in dropped
            and _only_reader(readers, first.outputs[0]) is node
            and list(first.attrs.get("perm", ())) == list(node.attrs.get("perm", ())) == [0, 2, 1]
        ):
            dropped.add(id(first))
            if node.outputs[0] in outputs:
                node.op_type, node.inputs, node.attrs = "Identity", first.inputs[:1], {}
            else:
                alias[node.outputs[0]] = first.inputs[0]
                dropped.add(id(node))


def conv_1d(nodes, constants, outputs) -> list:
    """Unsqueeze(x, [a]) -> 2-D Convs whose kernel is 1 and padding 0 on axis a (a 1-D
    convolution exported as 2-D, a = 2 or 3), with activations, BatchNormalizations and
    arithmetic between them -> Squeeze([a]): the same nodes on the rank-3 values, the Convs 1-D
    (run on the whole length at once instead of as a tall image one pixel wide); constant
    operands lose axis a."""
    alias: dict[str, str] = {}
    dropped: set[int] = set()
    _channels_first_1d(nodes, constants, outputs, alias, dropped)
    for start, unsq in enumerate(nodes):
        axes = node_axes(unsq, constants) if unsq.op_type == "Unsqueeze" else None
        if axes is None or len(axes) != 1 or axes[0] % 4 not in (2, 3):
            continue
        axis = axes[0] % 4
        found = _width_one_region(nodes, start, axis, outputs, constants)
        if found is None or not any(n.op_type == "Conv" for n in found[0]):
            continue
        region, squeezes = found
        for node in region:
            if node.op_type == "Conv":
                w, node.attrs = _conv_1d_weights(node, axis, constants)
                constants[f"{node.outputs[0]}::1d"] = w
                node.inputs = [node.inputs[0], f"{node.outputs[0]}::1d", *node.inputs[2:]]
            elif node.op_type in ("Add", "Sub", "Mul", "Div"):
                for k, name in enumerate(node.inputs):
                    if name in constants:
                        constants[f"{name}::{node.outputs[0]}::1d"] = _without_axis(constants[name], axis)
                        node.inputs[k] = f"{name}::{node.outputs[0]}::1d"
        alias[unsq.outputs[0]] = unsq.inputs[0]
        dropped.add(id(unsq))
        makers = {n.outputs[0]: n for n in region}
        for squeeze in squeezes:
            x, y = squeeze.inputs[0], squeeze.outputs[0]
            if y in outputs and x in makers and x not in alias:  # the maker of x names it y
                makers[x].outputs = [y]
                alias[x] = y
                dropped.add(id(squeeze))
            elif y in outputs:
                squeeze.op_type, squeeze.inputs, squeeze.attrs = "Identity", [x], {}
            else:
                alias[squeeze.outputs[0]] = squeeze.inputs[0]
                dropped.add(id(squeeze))

    def resolved(name):
        while name in alias:  # a Squeeze right after the Unsqueeze: two steps
            name = alias[name]
        return name

    for node in nodes:
        node.inputs = [resolved(i) for i in node.inputs]
    return [n for n in nodes if id(n) not in dropped]
