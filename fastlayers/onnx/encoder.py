"""Whole Transformer encoder layers in imported ONNX graphs -> one ``FusedEncoderLayer`` node on
the backend's ``encoder_layer`` primitive, self-attention blocks alone -> one
``FusedSelfAttention`` node on its ``self_attention`` (``fastlayers/io/onnx.py`` runs this after
the dense and attention fusions).

The exporters write a ``TransformerEncoderLayer`` as some 30 data nodes (the packed q/k/v product,
a chain of Reshape / Unsqueeze / Transpose / Squeeze / Gather splitting it into heads, the fused
attention, the out-projection, two residual adds, two LayerNormalizations and the feed-forward
products) plus the shape arithmetic feeding the Reshapes. The match has two parts:

1. structure: from each mask-less ``FusedAttention`` (or opset-23 ``Attention``) node, the q, k and v inputs are followed back
   through layout nodes (``LAYOUT``) to one dense node of (E, 3E) weights, or three of (E, E) with
   one input; its output forward through layout nodes to the out-projection (E, E), the residual
   Add, the norms and the feed-forward pair, in post-norm or pre-norm (``norm_first``) order.
   This gives the weights and the layer's input X and output Y.
2. meaning: the layout chains are not read op by op. Instead the unfused graph runs once at load
   on a probe input (``probe_inputs``: every dynamic dimension a distinct size from 2 up), and a
   candidate is kept only if the backend's ``encoder_layer`` on the probe's X, batch first or
   sequence first, with E / (q's last axis) heads (or the Attention's q_num_heads), gives the
   probe's Y. A graph that splits heads
   or scales the scores otherwise fails that check and runs node by node as before.

Where the surroundings are not an encoder layer's, the self-attention block alone (the q/k/v
products, attention and the (E, E) out-projection, ending where the out-projection's output
leaves its layout nodes: torch's ``MultiheadAttention`` on x, x, x) is the candidate, confirmed
the same way on the backend's ``self_attention``, and becomes one ``FusedSelfAttention`` node.

Masked attention (a mask input on the attention node) is not matched. LayerNormalization
spelled as ReduceMean / Sub / Pow (opsets before 17) is one node by then
(``rewrite.fuse_layer_norm``), so such layers match too.
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..backends.types import EncoderWeights

#: Nodes that move or select data without computing on it: the walks pass through them.
LAYOUT = {"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Gather", "Identity", "Slice", "Split", "Flatten"}
#: Activations of the first feed-forward product that ``encoder_layer`` takes by name.
_ACTIVATIONS = {"linear", "relu", "gelu", "gelu_tanh", "sigmoid", "silu", "onnx_sigmoid", "onnx_silu", "onnx_tanh"}
#: Readers that see only a value's shape: they do not make it a data path of its own.
_SHAPE_READERS = {"Shape", "Size"}


class _Graph:
    """Producer and reader tables of a node list."""

    def __init__(self, nodes, constants, outputs):
        self.constants, self.outputs = constants, set(outputs)
        self.producer = {o: n for n in nodes for o in n.outputs if o}
        self.readers: dict[str, list] = {}
        for n in nodes:
            for i in n.inputs:
                if i and n.op_type not in _SHAPE_READERS:
                    self.readers.setdefault(i, []).append(n)

    def source(self, name):
        """(value, nodes passed): ``name`` followed back through layout nodes (a Gather only
        with constant indices, so that an embedding lookup stops the walk)."""
        passed = []
        node = self.producer.get(name)
        while (
            node is not None
            and node.op_type in LAYOUT
            and node.inputs[0]
            and (node.op_type != "Gather" or node.inputs[1] in self.constants)
        ):
            passed.append(node)
            node = self.producer.get(node.inputs[0])
        return (passed[-1].inputs[0] if passed else name), passed

    def reader(self, name):
        """The one data reader of ``name``, else None (several, none, or a graph output)."""
        users = self.readers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def follow(self, name):
        """(node, nodes passed): the first non-layout node reached from ``name`` through layout
        nodes that each have one data reader, else (None, passed)."""
        passed = []
        node = self.reader(name)
        while node is not None and node.op_type in LAYOUT and node.inputs[0] == name:
            passed.append(node)
            name = node.outputs[0]
            node = self.reader(name)
        return node, passed

    def dense(self, node, rows, cols, activations=("linear",)):
        """(w_io, b) of a FusedDense ``node`` with (rows, cols) weights and an activation among
        ``activations``, else None."""
        if node is None or node.op_type != "FusedDense":
            return None
        w = self.constants.get(node.inputs[1])
        if w is None or w.shape != (rows, cols) or node.attrs.get("activation", "linear") not in activations:
            return None
        b = self.constants.get(node.inputs[2]) if len(node.inputs) > 2 else None
        return w, b

    def norm(self, node, e):
        """(gamma, beta, eps) of a LayerNormalization over the last axis of width ``e``, else None."""
        if (
            node is None
            or node.op_type != "LayerNormalization"
            or node.attrs.get("_stats")
            or node.attrs.get("_rms")
            or node.attrs.get("axis", -1) not in (-1, 2)
        ):
            return None
        gamma = self.constants.get(node.inputs[1])
        has_beta = len(node.inputs) > 2 and bool(node.inputs[2])
        beta = self.constants.get(node.inputs[2]) if has_beta else None
        if gamma is None or gamma.shape != (e,) or (has_beta and (beta is None or beta.shape != (e,))):
            return None
        return (
            gamma.astype(np.float32),
            None if beta is None else beta.astype(np.float32),
            float(node.attrs.get("epsilon", 1e-5)),
        )


class Candidate:
    """A matched layer: input and output values, weights, and the nodes it replaces."""

    def __init__(self, x, y, weights, activation, norm_first, attention, nodes):
        self.x, self.y, self.weights, self.activation = x, y, weights, activation
        self.norm_first, self.attention, self.nodes = norm_first, attention, nodes


class Block:
    """A matched self-attention block (q/k/v projection, attention, output projection, no
    encoder layer around it): input value, weights (w_qkv_io, b_qkv, w_o_io, b_o), the nodes
    it replaces, and ``ends``: (output value, layout nodes passed to it) for each value from
    the output projection on through its layout nodes, the farthest first."""

    def __init__(self, x, weights, attention, nodes, ends):
        self.x, self.weights, self.attention, self.nodes, self.ends = x, weights, attention, nodes, ends


def _qkv(g, att):
    """(z, w_qkv_io, b_qkv, nodes): the packed or separate q/k/v products behind ``att``."""
    sources = [g.source(att.inputs[i]) for i in range(3)]
    passed = [n for _, p in sources for n in p]
    producers = [g.producer.get(name) for name, _ in sources]
    if any(p is None or p.op_type != "FusedDense" for p in producers):
        return None
    z = producers[0].inputs[0]
    e = g.constants[producers[0].inputs[1]].shape[0]
    if producers[0] is producers[1] is producers[2]:
        found = g.dense(producers[0], e, 3 * e)
        if found is None:
            return None
        return z, found[0], found[1], passed + [producers[0]]
    found = [g.dense(p, e, e) for p in producers]
    if (
        len({id(p) for p in producers}) != 3
        or any(f is None for f in found)
        or any(p.inputs[0] != z for p in producers)
    ):
        return None
    w = np.concatenate([f[0] for f in found], axis=1)
    biases = [f[1] for f in found]
    b = (
        None
        if all(v is None for v in biases)
        else np.concatenate([np.zeros(e, np.float32) if v is None else v.reshape(e) for v in biases])
    )
    return z, w, b, passed + producers


def _plain_attention(node, g) -> bool:
    """Whether ``node`` is self-attention with no mask: a ``FusedAttention`` without its mask
    input, or an opset-23 ``Attention`` with only Q, K and V, not causal, without softcap, whose
    other outputs nothing reads."""
    if node.op_type == "FusedAttention":
        return not (len(node.inputs) > 6 and node.inputs[6])
    return (
        node.op_type == "Attention"
        and not any(node.inputs[3:])
        and not node.attrs.get("is_causal", 0)
        and not node.attrs.get("softcap", 0.0)
        and not any(o in g.readers or o in g.outputs for o in node.outputs[1:] if o)
    )


def _other(node, name):
    """The other operand of a two-input node, or None when ``name`` is not one of them."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def match(nodes, constants, outputs) -> list[list]:
    """For every mask-less attention node (``_plain_attention``) with a q/k/v projection before
    it and an (E, E) output projection after it, the ways to fuse it, best first: the encoder
    layer around it (a ``Candidate``) where its surroundings have that shape, then the
    self-attention ``Block`` alone (step 1 of the module docstring); the probe has not
    confirmed them yet."""
    g = _Graph(nodes, constants, outputs)
    found = []
    for att in nodes:
        if not _plain_attention(att, g):
            continue
        qkv = _qkv(g, att)
        if qkv is None:
            continue
        z_dense, w_qkv, b_qkv, core = qkv
        e = w_qkv.shape[0]
        z, z_passed = g.source(z_dense)
        out_proj, passed_att = g.follow(att.outputs[0])
        w_o = g.dense(out_proj, e, e)
        if w_o is None:
            continue
        core += z_passed + passed_att + [att, out_proj]
        after, passed_o = g.follow(out_proj.outputs[0])
        ends = [(n.outputs[0], passed_o[: k + 1]) for k, n in enumerate(passed_o)][::-1]
        block = Block(z, (w_qkv, b_qkv, w_o[0], w_o[1]), att, core, ends + [(out_proj.outputs[0], [])])
        layer = _layer(g, z, e, after, passed_o, out_proj, core, (w_qkv, b_qkv, w_o), att)
        found.append([block] if layer is None else [layer, block])
    return found


def _layer(g, z, e, add1, passed_o, out_proj, core, projections, att) -> Candidate | None:
    """The encoder layer whose attention block reads ``z`` and ends in ``out_proj`` (``add1``
    the first non-layout node after it, ``passed_o`` the layout nodes before that; ``core``
    the block's nodes), else None."""
    if add1 is None or add1.op_type != "Add":
        return None
    w_qkv, b_qkv, w_o = projections
    residual = _other(add1, passed_o[-1].outputs[0] if passed_o else out_proj.outputs[0])
    core = core + passed_o + [add1]
    ln_z = g.producer.get(z)
    if residual == z:  # post-norm: LN1(x + mha(x)), LN2(y + ff(y))
        norm_first, x = False, z
        ln1 = g.reader(add1.outputs[0])
        norm1 = g.norm(ln1, e)
        if norm1 is None:
            return None
        y = ln1.outputs[0]
        core.append(ln1)
    elif ln_z is not None and residual == ln_z.inputs[0]:  # pre-norm: y = x + mha(LN1(x))
        norm_first, x = True, residual
        norm1 = g.norm(ln_z, e)
        if norm1 is None:
            return None
        y = add1.outputs[0]
        core.append(ln_z)
    else:
        return None
    ff = _feed_forward(g, y, e, norm_first)
    if ff is None:
        return None
    (w_1, b_1, activation), (w_2, b_2), norm2, out, ff_nodes = ff
    weights = EncoderWeights(w_qkv, b_qkv, w_o[0], w_o[1], w_1, b_1, w_2, b_2, norm1, norm2)
    return Candidate(x, out, weights, activation, norm_first, att, core + ff_nodes)


def _feed_forward(g, y, e, norm_first):
    """((w_1, b_1, activation), (w_2, b_2), norm2, output, nodes) of the feed-forward half after
    ``y``: post-norm LN2(y + ff(y)), pre-norm y + ff(LN2(y)); else None."""
    users = g.readers.get(y, [])
    if len(users) != 2 or y in g.outputs:
        return None
    add2 = next((n for n in users if n.op_type == "Add"), None)
    first = next((n for n in users if n is not add2), None)
    if add2 is None or first is None:
        return None
    nodes = [add2]
    if norm_first:
        norm2 = g.norm(first, e)
        if norm2 is None:
            return None
        nodes.append(first)
        first = g.reader(first.outputs[0])
    if first is None or first.op_type != "FusedDense":
        return None
    found1 = g.dense(first, e, g.constants[first.inputs[1]].shape[1], _ACTIVATIONS)
    if found1 is None:
        return None
    activation = first.attrs.get("activation", "linear")
    second = g.reader(first.outputs[0])
    found2 = g.dense(second, found1[0].shape[1], e)
    if found2 is None or g.reader(second.outputs[0]) is not add2 or _other(add2, second.outputs[0]) != y:
        return None
    nodes += [first, second]
    if norm_first:
        return (*found1, activation), found2, norm2, add2.outputs[0], nodes
    ln2 = g.reader(add2.outputs[0])
    norm2 = g.norm(ln2, e)
    if norm2 is None:
        return None
    return (*found1, activation), found2, norm2, ln2.outputs[0], nodes + [ln2]


def confirmed(candidate, values) -> dict | None:
    """The ``FusedEncoderLayer`` attributes when the backend's ``encoder_layer`` (the one the
    fused node will run; its weights are packed on the way) reproduces the probe's output of ``candidate`` (step 2 of the module docstring), else None."""
    x, want = values.get(candidate.x), values.get(candidate.y)
    q = values.get(candidate.attention.inputs[0])
    if x is None or want is None or q is None or x.ndim != 3 or x.dtype != np.float32:
        return None
    e = candidate.weights.w_qkv_io.shape[0]
    if x.shape[2] != e or q.shape[-1] == 0 or e % q.shape[-1]:
        return None
    for heads in _heads(candidate.attention, e, q):
        for batch_first in (True, False):
            x_nle = x if batch_first else x.transpose(1, 0, 2)
            y, _ = get_ops().encoder_layer(
                np.ascontiguousarray(x_nle),
                candidate.weights,
                heads,
                candidate.activation,
                candidate.norm_first,
                need_weights=False,
            )
            y = y if batch_first else y.transpose(1, 0, 2)
            if _same(y, want):
                return {
                    "weights": candidate.weights,
                    "num_heads": heads,
                    "activation": candidate.activation,
                    "norm_first": candidate.norm_first,
                    "batch_first": batch_first,
                }
    return None


def confirmed_block(block, values) -> tuple | None:
    """(output value, layout nodes passed to it, ``FusedSelfAttention`` attributes) of the
    farthest end of ``block`` whose probe value the backend's ``self_attention`` on the probe's
    X reproduces, batch first or sequence first, with E / (q's last axis) heads (or the
    Attention's q_num_heads); else None."""
    x, q = values.get(block.x), values.get(block.attention.inputs[0])
    w_qkv, b_qkv, w_o, b_o = block.weights
    e = w_qkv.shape[0]
    if (
        x is None
        or q is None
        or x.ndim != 3
        or x.dtype != np.float32
        or x.shape[2] != e
        or q.shape[-1] == 0
        or e % q.shape[-1]
    ):
        return None
    for heads in _heads(block.attention, e, q):
        for batch_first in (True, False):
            x_nle = x if batch_first else x.transpose(1, 0, 2)
            y, _ = get_ops().self_attention(
                np.ascontiguousarray(x_nle), w_qkv, b_qkv, w_o, b_o, heads, need_weights=False
            )
            y = y if batch_first else y.transpose(1, 0, 2)
            for end, passed in block.ends:
                if _same(y, values.get(end)):
                    return end, passed, {"weights": block.weights, "num_heads": heads, "batch_first": batch_first}
    return None


def _heads(attention, e, q) -> list[int]:
    """The head counts a fused node may have: E / (q's last axis), and an opset-23 Attention's
    q_num_heads."""
    heads_tried = [e // q.shape[-1]]
    q_heads = attention.attrs.get("q_num_heads")  # opset-23 Attention on 3-D q, k, v
    if q_heads and q_heads not in heads_tried and e % q_heads == 0:
        heads_tried.append(q_heads)
    return heads_tried


def _same(y, want) -> bool:
    """Whether ``y`` is ``want`` to float32 rounding of a fused computation."""
    return (
        want is not None
        and y.shape == want.shape
        and np.allclose(y, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))
    )


def _noise(shape) -> np.ndarray:
    """Deterministic values spread over [-1, 1) (a sine hash of the flat index: numpy.random
    would cost 12 ms of import at load)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.float64)
    return (np.sin(i * 12.9898 + 78.233) * 43758.5453 % 2.0 - 1.0).reshape(shape)


def probe_inputs(graph_inputs) -> list[np.ndarray] | None:
    """One array per (name, dtype, dims) graph input, ``dims`` holding ints and dimension names
    (None: unnamed): each named dimension one size, each unnamed one its own, from 2 up and all
    different. Floats are noise (``_noise``), integers and booleans ones. None when a rank is
    unknown, or where they would take more than ``warmup.MAX_ELEMENTS`` elements in all (the
    dimensions a file declares are not trusted to be small)."""
    from ..model.warmup import MAX_ELEMENTS

    sizes: dict = {}
    arrays, total = [], 0
    for _, dtype, dims in graph_inputs:
        if dims is None:
            return None
        shape = []
        for d in dims:
            if isinstance(d, int):
                if d < 0:
                    return None
                shape.append(d)
                continue
            key = d if d else object()
            sizes.setdefault(key, len(sizes) + 2)
            shape.append(sizes[key])
        count = 1
        for d in shape:
            count *= d
        total += count
        if total > MAX_ELEMENTS:
            return None
        if dtype.kind == "f":
            arrays.append(_noise(shape).astype(dtype))
        else:
            arrays.append(np.ones(shape, dtype))
    return arrays
