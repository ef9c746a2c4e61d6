"""QDQ node units run as integer operators, as onnxruntime runs them on the CPU.

A statically quantized (QDQ) file writes each quantized operator as a float operator between
DequantizeLinear (DQ) nodes on its inputs and a QuantizeLinear (Q) node on its output. Run as
written, the operator computes in float and the Q rounds the result; onnxruntime instead
replaces each such *node unit* by an integer operator (its ``QDQSelectorActionTransformer``),
which rounds differently: QLinearConv adds the int32 bias to the exact integer sums and
requantizes once. ``fuse_node_units`` makes the same replacements at load, before constant
folding, so that fastlayers computes what onnxruntime computes, in integers:

- DQ(x), DQ(w), DQ(int32 bias) -> Conv -> Q                -> QLinearConv
- DQ(a), DQ(b) -> MatMul -> Q                              -> QLinearMatMul
- DQ(a), DQ(b), DQ(int32 c) -> Gemm (beta 1) [-> Q]        -> com.microsoft QGemm
- DQ(a), DQ(b) -> Add / Mul -> Q                           -> com.microsoft QLinearAdd / QLinearMul
- DQ(x) -> AveragePool / GlobalAveragePool / LeakyRelu / Sigmoid / Softmax -> Q
                                                           -> com.microsoft QLinear<op>
- DQ(x_i)... -> Concat -> Q                                -> com.microsoft QLinearConcat

onnxruntime's rules (``qdq_selectors.cc``), followed here: every input of the operator comes
from a DQ and its one output goes only to Q nodes (one), not to the graph's outputs; a Relu
between the operator and its Q is dropped where the Q's zero point is its type's minimum, a
Clip where its range holds the Q's whole range (``IsClipMadeRedundantByQ``); the activations
are 8-bit with the input and output of one type; a bias DQ's scale is x_scale * w_scale (within
1e-6 + 1%); int8 activations only where onnxruntime's
``QDQS8ToU8Transformer`` makes them uint8 (a Q whose readers are all DQs with its own scale and
zero point: the same differences from the zero point, so the same integers less 128); Conv's
and Gemm's bias int32. fastlayers also asks that the scales and zero points be constants of
the shapes the integer operators take (per tensor; per output channel for weights), and leaves
any other unit in float.

The units whose integer operator fastlayers does not have (Where, Resize, MaxPool) stay as
written: for MaxPool that gives the same values.
``LoadOptions(optimize=False)`` leaves every unit as written.
"""

from __future__ import annotations

import numpy as np

from .nodes import Node, readers_of
from .ops import OPS
from .quant import MS
from .tensors import DTYPES

_DQ = ("DequantizeLinear", f"{MS}::DequantizeLinear")
_Q = ("QuantizeLinear", f"{MS}::QuantizeLinear")
_U8, _S8 = np.dtype(np.uint8), np.dtype(np.int8)
_MIN = {_U8: 0, _S8: -128}
_MAX = {_U8: 255, _S8: 127}

#: Unary operators -> their com.microsoft integer form (onnxruntime's ``UnaryOpQDQRules``).
UNARY = {
    "AveragePool": "QLinearAveragePool",
    "GlobalAveragePool": "QLinearGlobalAveragePool",
    "LeakyRelu": "QLinearLeakyRelu",
    "Sigmoid": "QLinearSigmoid",
    "Softmax": "QLinearSoftmax",
}
#: Binary operators -> their com.microsoft integer form (``BinaryOpQDQRules``).
BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}


class _Graph:
    """What the rules ask of the graph around a node: producers, readers, constants, types."""

    def __init__(self, nodes, constants, outputs, input_dtypes, opset):
        self.constants, self.outputs, self.input_dtypes, self.opset = constants, set(outputs), input_dtypes, opset
        self.readers = readers_of(nodes, outputs)
        self.producer = {o: n for n in nodes for o in n.outputs if o}

    def made_by(self, name, op_types):
        node = self.producer.get(name)
        return node if node is not None and node.op_type in op_types else None

    def read_by(self, name) -> list:
        return self.readers.get(name, [])

    def scalar(self, name):
        """A constant scalar (any shape of one element) as a 0-d array, else None."""
        value = self.constants.get(name) if name else None
        return value.reshape(()) if value is not None and value.size == 1 else None

    def q_params(self, q):
        """(scale, zero point, its dtype) of a Q or DQ with constant per-tensor parameters, the
        zero point 0 of the node's type where it has none; None otherwise."""
        scale = self.scalar(q.inputs[1]) if len(q.inputs) > 1 else None
        if scale is None or scale.dtype != np.float32:
            return None
        if len(q.inputs) > 2 and q.inputs[2]:
            zp = self.scalar(q.inputs[2])
            return None if zp is None else (scale, zp, zp.dtype)
        if q.op_type in _Q:
            to = q.attrs.get("output_dtype", 0)
            dtype = np.dtype(DTYPES[to]) if to in DTYPES else _U8
        else:
            dtype = self.dtype_of(q.inputs[0])
        return None if dtype is None else (scale, np.zeros((), dtype), dtype)

    def dtype_of(self, name):
        """The element type of a value where the graph fixes it without running: a constant, a
        graph input, or the output of a Q."""
        if name in self.constants:
            return self.constants[name].dtype
        if name in self.input_dtypes:
            return np.dtype(self.input_dtypes[name])
        q = self.made_by(name, _Q)
        if q is not None:
            params = self.q_params(q)
            return None if params is None else params[2]
        return None

    def as_uint8(self, q) -> bool:
        """Whether onnxruntime's QDQS8ToU8Transformer turns this int8 Q (and the DQs after it)
        into uint8: constant per-tensor parameters, every reader a DQ with the same ones."""
        params = self.q_params(q)
        if params is None or params[2] != _S8 or q.outputs[0] in self.outputs:
            return False
        readers = self.read_by(q.outputs[0])
        return bool(readers) and all(
            r is not None and r.op_type in _DQ and r.inputs[0] == q.outputs[0] and _same(self.q_params(r), params)
            for r in readers
        )

    def activation_type(self, dq):
        """The 8-bit type onnxruntime sees at a DQ of an activation (after QDQS8ToU8), or None."""
        dtype = self.dtype_of(dq.inputs[0])
        if dtype == _S8:
            q = self.made_by(dq.inputs[0], _Q)
            return _U8 if q is not None and self.as_uint8(q) else _S8
        return dtype if dtype in (_U8, _S8) else None

    def output_type(self, q):
        params = self.q_params(q)
        if params is None or params[2] not in (_U8, _S8):
            return None
        return _U8 if params[2] == _S8 and self.as_uint8(q) else params[2]


def _same_raw_type(g, dqs, q) -> bool:
    """Whether the DQs' integers and the Q's are of one type as the file writes them: an
    operator on the integers themselves (pointwise, concatenation, data movement) gives its
    output its input's type, so a unit that onnxruntime would see as uint8 only after its
    QDQS8ToU8 conversion of one side runs as written."""
    params = g.q_params(q)
    return params is not None and all(g.dtype_of(dq.inputs[0]) == params[2] for dq in dqs)


def _same(a, b) -> bool:
    return a is not None and b is not None and a[2] == b[2] and a[0] == b[0] and a[1] == b[1]


class _Unit:
    """One node unit: its DQs (one per input slot), the target, a redundant Relu/Clip, its Q."""

    __slots__ = ("dqs", "target", "clip", "q")

    def __init__(self, dqs, target, clip, q):
        self.dqs, self.target, self.clip, self.q = dqs, target, clip, q


def _unit(g, node, q_optional=False, slots=None):
    """The node unit around ``node`` where onnxruntime's ``CheckQDQNodes`` holds: every
    non-empty input made by a DQ, the one output read by one Q only
    (through a redundant Relu/Clip) and not a graph output; None otherwise. With
    ``q_optional``, an output read by anything but a Q gives a unit with no Q. ``slots``: the
    input positions that must come from DQs (default: every input)."""
    dqs = []
    for k, name in enumerate(node.inputs):
        if not name or slots is not None and k not in slots:
            continue
        dq = g.made_by(name, _DQ)  # a DQ read by several units serves each (EnsureUniqueDQForNodeUnit)
        if dq is None:
            return None
        dqs.append(dq)
    if len(node.outputs) != 1 or node.outputs[0] in g.outputs:
        return None
    readers = g.read_by(node.outputs[0])
    clip = None
    if (
        len(readers) == 1
        and readers[0] is not None
        and readers[0].op_type in ("Relu", "Clip")
        and readers[0].outputs[0] not in g.outputs
    ):
        clip = readers[0]
        readers = g.read_by(clip.outputs[0])
    q = readers[0] if len(readers) == 1 and readers[0] is not None and readers[0].op_type in _Q else None
    if clip is not None and (q is None or not _clip_made_redundant(g, clip, q)):
        return None
    if q is None:
        return _Unit(dqs, node, None, None) if q_optional and clip is None else None
    return _Unit(dqs, node, clip, q)


def _clip_made_redundant(g, clip, q) -> bool:
    """onnxruntime's ``IsClipMadeRedundantByQ``: a Relu before a Q whose zero point is its type's
    minimum, a Clip whose range, in steps of the Q, holds the whole range of the Q's type."""
    params = g.q_params(q)
    if params is None or params[2] not in _MIN:
        return False
    scale, zp, dtype = params
    if clip.op_type == "Relu":
        return int(zp) == _MIN[dtype]
    bounds = []
    for i, (attr, default) in enumerate(
        (("min", -np.finfo(np.float32).max), ("max", np.finfo(np.float32).max)), start=1
    ):
        name = clip.inputs[i] if len(clip.inputs) > i else ""
        if name:
            value = g.scalar(name)
            if value is None:
                return False
        else:
            value = clip.attrs.get(attr, default)
        steps = np.rint(np.float32(value) / scale)
        bounds.append(float(np.clip(steps, -(2.0**31), 2.0**31 - 1)) + int(zp))
    return bounds[0] <= _MIN[dtype] and bounds[1] >= _MAX[dtype]


def _per_tensor(g, dq) -> bool:
    params = g.q_params(dq)
    return params is not None and params[2] in _MIN


def _weights(g, dq, axis, channels) -> bool:
    """A DQ of 8-bit weights with a constant scale (and zero point) per tensor or per
    ``channels`` along ``axis``."""
    if _per_tensor(g, dq):
        return True
    scale = g.constants.get(dq.inputs[1]) if len(dq.inputs) > 1 else None
    zp_name = dq.inputs[2] if len(dq.inputs) > 2 else ""
    zp = g.constants.get(zp_name) if zp_name else None
    w_dtype = g.dtype_of(dq.inputs[0])
    if (
        scale is None
        or scale.dtype != np.float32
        or scale.shape != (channels,)
        or w_dtype not in _MIN
        or (zp_name and (zp is None or zp.shape != (channels,) or zp.dtype != w_dtype))
    ):
        return False
    rank = g.constants[dq.inputs[0]].ndim if dq.inputs[0] in g.constants else None
    return rank is not None and dq.attrs.get("axis", 1) % max(rank, 1) == axis


def _bias(g, bias_dq, x_dq, w_dq) -> bool:
    """Whether onnxruntime takes the int32 bias of a DQ into the integer operator: its scale
    within 1e-6 + 1% of x_scale * w_scale (per channel where w's is), its zero point 0. (The
    tolerance is onnxruntime 1.32's, found by trying scales on either side; outside it the
    unit stays in float.)"""
    b_scale = g.constants.get(bias_dq.inputs[1]) if len(bias_dq.inputs) > 1 else None
    zp_name = bias_dq.inputs[2] if len(bias_dq.inputs) > 2 else ""
    zp = g.constants.get(zp_name) if zp_name else np.zeros((), np.int32)
    w_scale = g.constants.get(w_dq.inputs[1])
    if (
        g.dtype_of(bias_dq.inputs[0]) != np.int32
        or b_scale is None
        or zp is None
        or np.any(zp != 0)
        or b_scale.dtype != np.float32
        or w_scale is None
    ):
        return False
    expected = g.q_params(x_dq)[0] * w_scale.reshape(-1)
    if b_scale.size not in (1, expected.size):
        return False
    return bool(np.all(np.abs(b_scale.reshape(-1) - expected) <= 1e-6 + 0.01 * np.abs(expected)))


def _zero_point(g, dq, dtype):
    """The zero point input of a DQ/Q, or a constant 0 of ``dtype`` made for a node without."""
    if len(dq.inputs) > 2 and dq.inputs[2]:
        return dq.inputs[2]
    name = f"fastlayers::zero_{np.dtype(dtype).name}"
    g.constants.setdefault(name, np.zeros((), dtype))
    return name


def _operand(g, dq):
    """(x, scale, zero point) input names of the integer operator, from a DQ."""
    dtype = g.dtype_of(dq.inputs[0])
    return [dq.inputs[0], dq.inputs[1], _zero_point(g, dq, dtype)]


def _result(g, q):
    dtype = g.q_params(q)[2]
    return [q.inputs[1], _zero_point(g, q, dtype)]


def _conv(g, node):
    unit = _unit(g, node)
    if unit is None or len(unit.dqs) not in (2, 3) or node.inputs[0] != unit.dqs[0].outputs[0]:
        return None
    x_dq, w_dq = unit.dqs[0], unit.dqs[1]
    dt_x, dt_y = g.activation_type(x_dq), g.output_type(unit.q)
    w = g.constants.get(w_dq.inputs[0])
    if dt_x != _U8 or dt_y != _U8 or not _per_tensor(g, x_dq) or w is None or not _weights(g, w_dq, 0, w.shape[0]):
        return None
    inputs = _operand(g, x_dq) + _operand(g, w_dq) + _result(g, unit.q)
    if len(unit.dqs) == 3:
        if not _bias(g, unit.dqs[2], x_dq, w_dq):
            return None
        inputs.append(unit.dqs[2].inputs[0])  # the int32 bias added to the sums as it is
    return unit, Node("QLinearConv", inputs, list(unit.q.outputs), dict(node.attrs), node.name)


def _matmul(g, node):
    unit = _unit(g, node)
    if unit is None or len(unit.dqs) != 2:
        return None
    a_dq, b_dq = unit.dqs
    b = g.constants.get(b_dq.inputs[0])
    if (
        g.activation_type(a_dq) != _U8
        or g.output_type(unit.q) != _U8
        or not _per_tensor(g, a_dq)
        or b is None
        or b.ndim != 2
        or not _weights(g, b_dq, 1, b.shape[1])
    ):
        return None
    inputs = _operand(g, a_dq) + _operand(g, b_dq) + _result(g, unit.q)
    return unit, Node("QLinearMatMul", inputs, list(unit.q.outputs), {}, node.name)


def _gemm(g, node):
    unit = _unit(g, node, q_optional=True)
    if unit is None or len(unit.dqs) not in (2, 3):
        return None
    a_dq, b_dq = unit.dqs[:2]
    dt_a = g.activation_type(a_dq)
    b = g.constants.get(b_dq.inputs[0])
    trans_b = node.attrs.get("transB", 0)
    if (
        dt_a not in _MIN
        or (dt_a == _S8 and g.dtype_of(b_dq.inputs[0]) != _S8)
        or not _per_tensor(g, a_dq)
        or b is None
        or b.ndim != 2
        or not _weights(g, b_dq, 0 if trans_b else 1, b.shape[0 if trans_b else 1])
    ):
        return None
    if unit.q is not None and g.output_type(unit.q) != dt_a:
        return None
    inputs = _operand(g, a_dq) + _operand(g, b_dq)
    if len(unit.dqs) == 3:
        if node.attrs.get("beta", 1.0) != 1.0 or not _bias(g, unit.dqs[2], a_dq, b_dq):
            return None
        inputs.append(unit.dqs[2].inputs[0])
    else:
        inputs.append("")
    outputs = list(node.outputs)
    if unit.q is not None:
        inputs += _result(g, unit.q)
        outputs = list(unit.q.outputs)
    attrs = {k: node.attrs[k] for k in ("alpha", "transA", "transB") if k in node.attrs}
    return unit, Node(f"{MS}::QGemm", inputs, outputs, attrs, node.name)


def _unary(g, node):
    unit = _unit(g, node, slots=(0,))
    if unit is None or len(unit.dqs) != 1 or node.inputs[0] != unit.dqs[0].outputs[0]:
        return None
    dt = g.activation_type(unit.dqs[0])
    if (
        dt not in _MIN
        or g.output_type(unit.q) != dt
        or not _per_tensor(g, unit.dqs[0])
        or not _same_raw_type(g, unit.dqs, unit.q)
    ):
        return None
    inputs = _operand(g, unit.dqs[0]) + _result(g, unit.q)
    attrs = dict(node.attrs)
    if node.op_type == "Softmax":  # the version it replaces: below 13 over the flattened trailing axes
        attrs["opset"] = 13 if g.opset >= 13 else 11
    return unit, Node(f"{MS}::{UNARY[node.op_type]}", inputs, list(unit.q.outputs), attrs, node.name)


def _binary(g, node):
    unit = _unit(g, node)
    if unit is None or len(unit.dqs) != 2 or len(node.inputs) != 2:
        return None
    a_dq, b_dq = (g.made_by(name, _DQ) for name in node.inputs)
    dt = g.activation_type(a_dq)
    if (
        dt not in _MIN
        or g.activation_type(b_dq) != dt
        or g.output_type(unit.q) != dt
        or not (_per_tensor(g, a_dq) and _per_tensor(g, b_dq))
        or not _same_raw_type(g, (a_dq, b_dq), unit.q)
    ):
        return None
    inputs = _operand(g, a_dq) + _operand(g, b_dq) + _result(g, unit.q)
    return unit, Node(f"{MS}::{BINARY[node.op_type]}", inputs, list(unit.q.outputs), {}, node.name)


def _concat(g, node):
    unit = _unit(g, node)
    if unit is None or len(unit.dqs) != len(node.inputs) or unit.clip is not None:
        return None
    dqs = [g.made_by(name, _DQ) for name in node.inputs]
    dt = g.output_type(unit.q)
    if (
        dt not in _MIN
        or any(g.activation_type(dq) != dt or not _per_tensor(g, dq) for dq in dqs)
        or not _same_raw_type(g, dqs, unit.q)
    ):
        return None
    inputs = _result(g, unit.q) + [name for dq in dqs for name in _operand(g, dq)]
    return unit, Node(f"{MS}::QLinearConcat", inputs, list(unit.q.outputs), {"axis": node.attrs.get("axis")}, node.name)


def _drop(g, node):
    """DQ -> a data movement operator -> Q with the same per-tensor parameters: the operator on
    the integers (onnxruntime's ``DropQDQNodesRules``)."""
    unit = _unit(g, node, slots=(0,))
    if (
        unit is None
        or unit.clip is not None
        or not unit.dqs
        or node.inputs[0] != unit.dqs[0].outputs[0]
        or len(unit.dqs) != 1
    ):
        return None
    params = g.q_params(unit.q)
    dt = g.activation_type(unit.dqs[0])
    if (
        dt not in _MIN
        or g.output_type(unit.q) != dt
        or not _same(g.q_params(unit.dqs[0]), params)
        or not params[0] > 0
        or not _same_raw_type(g, unit.dqs, unit.q)
    ):
        return None
    return unit, Node(
        node.op_type, [unit.dqs[0].inputs[0]] + node.inputs[1:], list(unit.q.outputs), dict(node.attrs), node.name
    )


#: Data movement operators whose units run on the integers. MaxPool (which onnxruntime also
#: runs on them) and Resize stay in float: fastlayers' pools compute in float, and
#: onnxruntime's 8-bit linear Resize rounds its own way; for MaxPool the values are the same.
DROPPED = (
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Slice",
    "Gather",
    "Expand",
    "Tile",
    "GatherElements",
)

#: Target operator -> its rule: (graph, node) -> (unit, integer node) or None.
RULES = {
    "Conv": _conv,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Concat": _concat,
    **{op: _unary for op in UNARY},
    **{op: _binary for op in BINARY},
    **{op: _drop for op in DROPPED},
}


def fuse_node_units(nodes, constants, outputs, input_dtypes, opset) -> list[Node]:
    """Each QDQ node unit that onnxruntime turns into an integer operator, and whose integer
    operator fastlayers implements, replaced by that operator (the module docstring).
    ``constants``: the graph's initializers (zero points made for DQs without one are added);
    ``input_dtypes``: graph input name -> numpy dtype; ``opset``: the default domain's. DQs
    left without readers are pruned by the caller."""
    g = _Graph(nodes, constants, outputs, input_dtypes, opset)
    replaced, removed = {}, set()
    for node in nodes:
        rule = RULES.get(node.op_type)
        found = rule(g, node) if rule is not None else None
        if found is None or found[1].op_type not in OPS:
            continue
        unit, fused = found
        replaced[id(node)] = fused
        removed.update(id(n) for n in (unit.clip, unit.q) if n is not None)
    return [replaced.get(id(n), n) for n in nodes if id(n) not in removed]
