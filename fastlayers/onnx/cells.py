"""Recurrent cells written out node by node -> one ``FusedLSTMCell`` node (``fuse_lstm_cell``).

torch's ``nn.LSTMCell`` (and an ``nn.LSTM`` run one step at a time, as silero VAD's decoder
is) exports as two products, their sum split in four gates, three Sigmoids, a Tanh and the
cell arithmetic: about fourteen nodes for one step. The fused node runs the step as the
backend's LSTM over a sequence of one step: one native call.

    z = x W_x (+ b_x) + h W_h (+ b_h);  i, f, g, o = split(z)
    c' = sigmoid(f) c + sigmoid(i) tanh(g);  h' = sigmoid(o) tanh(c')
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..backends.derived import derived_generation
from ..backends.types import Cell
from .nodes import Node, readers_of
from .records import Family
from .tensors import f32


def _dense_parts(node, constants):
    """(input, weight (in, 4u), bias or None) of a FusedDense node without activation whose
    weight and bias are float32 constants; else None."""
    if node is None or node.op_type != "FusedDense" or node.attrs.get("activation", "linear") != "linear":
        return None
    w = constants.get(node.inputs[1])
    b = constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if (
        w is None
        or w.ndim != 2
        or w.dtype != np.float32
        or w.shape[1] % 4
        or (len(node.inputs) > 2 and node.inputs[2] and (b is None or b.shape != (w.shape[1],)))
    ):
        return None
    return node.inputs[0], w, b


def _equal_split(node, constants, width):
    """Whether ``node`` splits its 2-D input's last axis (``width``) in four equal parts."""
    if node.op_type != "Split" or len(node.outputs) != 4 or node.attrs.get("axis", 0) not in (1, -1):
        return False
    sizes = constants.get(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    return sizes is None or list(np.asarray(sizes).reshape(-1)) == [width // 4] * 4


def _product_of(node, a, b):
    """Whether ``node`` is a Mul of exactly the values ``a`` and ``b``, in either order."""
    return node is not None and node.op_type == "Mul" and sorted(node.inputs) == sorted([a, b])


def fuse_lstm_cell(nodes, constants, outputs) -> list[Node]:
    """One LSTM step written out (module docstring; gates in torch's order i, f, g, o), each
    intermediate value read only inside the step, -> one ``FusedLSTMCell`` node: inputs x, h,
    c, W_x, W_h (each (in, 4 units)), the summed bias; outputs h', c'."""
    readers = readers_of(nodes, outputs)
    producer = {o: n for n in nodes for o in n.outputs}

    def only(name, op_type=None):
        users = readers.get(name, [])
        ok = len(users) == 1 and users[0] is not None and (op_type is None or users[0].op_type == op_type)
        return users[0] if ok else None

    removed: set[int] = set()
    for add in nodes:
        if add.op_type != "Add" or id(add) in removed or len(add.inputs) != 2:
            continue
        parts = [_dense_parts(producer.get(i), constants) for i in add.inputs]
        if None in parts or any(only(i) is not add for i in add.inputs) or parts[0][1].shape[1] != parts[1][1].shape[1]:
            continue
        width = parts[0][1].shape[1]
        units = width // 4
        split = only(add.outputs[0], "Split")
        if split is None or not _equal_split(split, constants, width):
            continue
        acts = [only(o) for o in split.outputs]
        if [a.op_type if a else None for a in acts] != ["Sigmoid", "Sigmoid", "Tanh", "Sigmoid"]:
            continue
        i, f, g, o = (a.outputs[0] for a in acts)
        forget, update = only(f, "Mul"), only(i, "Mul")
        if forget is None or update is None or not _product_of(update, i, g) or only(g) is not update:
            continue
        c = forget.inputs[1] if forget.inputs[0] == f else forget.inputs[0]
        cell = only(forget.outputs[0], "Add")
        if cell is None or only(update.outputs[0]) is not cell:
            continue
        c_new = cell.outputs[0]
        squash = [n for n in readers.get(c_new, []) if n is not None and n.op_type == "Tanh"]
        if len(squash) != 1 or only(squash[0].outputs[0], "Mul") is None or only(o, "Mul") is None:
            continue
        out = only(o, "Mul")
        if not _product_of(out, o, squash[0].outputs[0]):
            continue
        # x and h: the operand whose weight is (units, 4 units) is the recurrent one (either
        # where both are: the step treats them alike)
        (x, w_x, b_x), (h, w_h, b_h) = parts if parts[1][1].shape[0] == units else parts[::-1]
        if w_h.shape[0] != units:
            continue
        bias = np.zeros(width, np.float32)
        for b in (b_x, b_h):
            if b is not None:
                bias = bias + b
        base = f"{out.outputs[0]}::lstm_cell"
        constants[f"{base}:w_x"], constants[f"{base}:w_h"], constants[f"{base}:b"] = w_x, w_h, bias
        step = Node(
            "FusedLSTMCell", [x, h, c, f"{base}:w_x", f"{base}:w_h", f"{base}:b"], [out.outputs[0], c_new], {}, out.name
        )
        members = [
            producer[add.inputs[0]],
            producer[add.inputs[1]],
            add,
            split,
            *acts,
            forget,
            update,
            cell,
            squash[0],
            out,
        ]
        removed.update(id(n) for n in members)
        # at the cell sum's place: x, h and c are computed before it, c' read after it, h'
        # (the last member's output) after that
        nodes = [step if n is cell else n for n in nodes]
    return [n for n in nodes if id(n) not in removed]


#: Most bound steps a FusedLSTMCell node keeps (one per input shape and backend).
MAX_BOUND_CELLS = 8


def _bound_step(x, h, c, w_x, w_h, b, cache):
    """The backend's one-step LSTM bound on the weights (``ops.sequence_plan``) for inputs
    shaped as ``x``, from the node's ``_bound`` cache (made at the first call of a shape):
    a function ``(x_bt1i, (h, c)) -> (y, h', c')``."""
    ops = get_ops()
    key = (x.shape, id(w_x), id(w_h), id(b), ops.name, derived_generation())
    hit = cache.get(key)
    if hit is None:
        plan = ops.sequence_plan(Cell.LSTM, x[:, None, :], (w_x, w_h, b, h, c), {"return_sequences": False})
        if len(cache) >= MAX_BOUND_CELLS:
            cache.clear()
        # the entry holds the weights, so that no other array takes their ids while it lives
        hit = cache[key] = (plan, (w_x, w_h, b))
    return hit[0]


def _fused_lstm_cell(inputs, attrs, opset):
    """fastlayers' own node (``fuse_lstm_cell``): one LSTM step on the backend's recurrent
    kernel (batch-major 2-D x, h and c), bound once per input shape where the node has a
    ``_bound`` cache (``ops.NODE_CACHES``); numpy's broadcasting arithmetic for other shapes."""
    x, h, c, w_x, w_h, b = inputs
    x, h, c = f32(x), f32(h), f32(c)
    units = w_h.shape[0]
    if x.ndim == 2 and h.shape == c.shape == (x.shape[0], units):
        x_bti = np.ascontiguousarray(x)[:, None, :]
        cache = attrs.get("_bound")
        if cache is not None:
            _, h_new, c_new = _bound_step(x, h, c, w_x, w_h, b, cache)(x_bti, (h, c))
        else:
            _, h_new, c_new = get_ops().lstm_sequence(
                x_bti, w_x, w_h, b, np.ascontiguousarray(h), np.ascontiguousarray(c), return_sequences=False
            )
        return [h_new, c_new]
    z = (x @ w_x + h @ w_h + b).astype(np.float32)
    ops = get_ops()
    i, f, g, o = (z[..., k * units : (k + 1) * units] for k in range(4))
    c_new = ops.activation(np.ascontiguousarray(f), "sigmoid") * c + ops.activation(
        np.ascontiguousarray(i), "sigmoid"
    ) * ops.activation(np.ascontiguousarray(g), "tanh")
    h_new = ops.activation(np.ascontiguousarray(o), "sigmoid") * ops.activation(
        np.ascontiguousarray(c_new, np.float32), "tanh"
    )
    return [h_new.astype(np.float32), c_new.astype(np.float32)]


#: This family's operator record (``ops.RECORDS`` gathers the families).
FAMILY = Family("LSTM cells")
FAMILY.add("FusedLSTMCell", _fused_lstm_cell, internal=True, caches=("_bound",))
