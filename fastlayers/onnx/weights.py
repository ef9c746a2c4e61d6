"""How an optimised graph holds its weights: once, in the form its kernels read.

A dense node's weight (``FusedDense``, input 1) is packed by the cpu backend at its first
product; the array the file gave (or the optimiser made: a transposed or folded copy) would
then be held beside the packed copy for the model's life. ``hold_dense_weights`` hands each
constant that only dense nodes read to the backend (``Ops.dense_weights``), which gives the
form it keeps (the cpu backend: the packed copy alone, unpacked anew for whoever reads it as an
array), and the model keeps only that. A convolution's weights (``FusedConv``'s ``_w_hwio``,
made at load: transposed, BatchNorm folded in) go the same way through ``Ops.conv_weights``,
asked as each convolution is fused so that its transposed copy is freed at once
(``ConvWeights``; the cpu backend: the implicit GEMM's packed form alone, for one group of
more than a few input channels). A recurrent node's W and R, where its every reader runs on
the backend's loops, are held as the loops' gate-reordered kernels alone
(``hold_recurrent_weights``, ``ops.recurrent.RecurrentWeights``). Pickles carry the file, not
these arrays (``OnnxModel.source``).
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from .control import Body
from .nodes import Node
from .ops.recurrent import RecurrentWeights, loops_cover
from .records import FASTLAYERS


def held(value) -> bool:
    """Whether ``value`` is a backend's form held in place of a weight array
    (``Ops.dense_weights``, ``Ops.conv_weights``): it has the array's shape, dtype and size,
    gives the values through ``np.asarray`` and unpacks them anew (``unpacked``)."""
    return not isinstance(value, np.ndarray) and callable(getattr(value, "unpacked", None))


def hold_dense_weights(nodes, constants, outputs) -> list[Node]:
    """Each constant read only as the weights of ``FusedDense`` nodes (never a graph output)
    replaced in ``constants`` by what the backend holds in its place (``Ops.dense_weights``)."""
    readers: dict[str, set] = {}
    for node in nodes:
        for k, name in enumerate(node.inputs):
            if name in constants:
                readers.setdefault(name, set()).add((node.op_type, k))
    ops = get_ops()
    for name, uses in readers.items():
        if uses == {("FusedDense", 1)} and name not in outputs:
            constants[name] = ops.dense_weights(constants[name])
    return nodes


#: (prefix, inputs before W beyond the plain node's x, masked) of each recurrent node form
#: (``ops.recurrent.RECURRENT_NODES``): ``Embedding<kind>`` reads the table and ids in place of x.
_RECURRENT_FORMS = (
    ("", 0, False),
    ("Embedding", 1, False),
    (f"{FASTLAYERS}::Masked", 0, True),
    ("EmbeddingMasked", 1, True),
)


def _loops_run(node, constants):
    """(kind, index of W) where ``node`` is a recurrent node whose every call runs on the
    backend's loops (``loops_cover``; no sequence_lens, peepholes constant), else None."""
    for prefix, offset, masked in _RECURRENT_FORMS:
        kind = node.op_type[len(prefix) :] if node.op_type.startswith(prefix) else ""
        if kind not in ("LSTM", "GRU", "RNN"):
            continue
        given = lambda i: len(node.inputs) > i and bool(node.inputs[i])  # noqa: E731
        if not masked and given(4 + offset):  # sequence_lens: the reference runs uneven lengths
            return None
        p = None
        if kind == "LSTM" and not masked and given(7 + offset):
            p = constants.get(node.inputs[7 + offset])
            if p is None:
                return None
        return (kind, 1 + offset) if loops_cover(kind, node.attrs, p) else None
    return None


def hold_recurrent_weights(nodes, constants, outputs) -> list[Node]:
    """Each float32 constant read only as W or R by recurrent nodes of one kind that all run on
    the backend's loops (never a graph output, nor held by a subgraph too) replaced in
    ``constants`` by ``RecurrentWeights``: the loops' kernels alone, not those beside the
    file's array."""
    readers: dict[str, set] = {}
    in_bodies = {id(a) for n in nodes for v in n.attrs.values() if isinstance(v, Body) for a in v.model._weights()}
    for node in nodes:
        run = _loops_run(node, constants)
        for k, name in enumerate(node.inputs):
            if name in constants:
                role = run[0] if run is not None and k in (run[1], run[1] + 1) else None
                readers.setdefault(name, set()).add(role)
    for name, roles in readers.items():
        value = constants[name]
        if len(roles) != 1 or None in roles or name in outputs or id(value) in in_bodies:
            continue
        (kind,) = roles
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
        if type(value) is np.ndarray and value.dtype == np.float32 and value.ndim == 3 and value.size:
            if value.shape[1] % gates == 0:
                constants[name] = RecurrentWeights(value, kind)
    return nodes


class ConvWeights:
    """What the convolutions of one graph hold in place of their weights (``Ops.conv_weights``
    of the backend at load), asked per convolution as it is fused, so that each transposed
    (and BatchNorm-folded) copy is freed at once; one form for equal weights (convolutions
    that read one initializer get a transposed copy each)."""

    def __init__(self):
        self.ops = get_ops()
        self.held: dict[tuple, list] = {}

    def __call__(self, w_hwio, group: int):
        if not isinstance(w_hwio, np.ndarray) or w_hwio.size == 0:
            return w_hwio
        # candidates by shape, dtype and the end values; equal ones by a full compare (of the
        # forms kept, unpacked for it: no copy of the arrays is kept)
        key = (w_hwio.shape, w_hwio.dtype.str, group, w_hwio.flat[0].tobytes(), w_hwio.flat[-1].tobytes())
        same = self.held.setdefault(key, [])
        for form in same:
            if np.array_equal(form, w_hwio):
                return form
        form = self.ops.conv_weights(w_hwio, group)
        same.append(form)
        return form
