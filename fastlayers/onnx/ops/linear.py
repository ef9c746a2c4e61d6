"""ONNX matrix products: MatMul, Gemm and fastlayers' FusedDense, on the backend's primitives."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ..records import BOOL, FLT, Family
from ..tensors import backend_plan, created, f32
from . import elementwise
from .shape import broadcast_shape

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("linear")
op = FAMILY.op


@op("MatMul", inputs=(2, 2))
def _matmul(inputs, attrs, opset):
    return [get_ops().matmul(inputs[0], inputs[1])]


@op("Gemm", inputs=(2, 3), attrs={"transA": BOOL, "transB": BOOL, "alpha": FLT, "beta": FLT})
def _gemm(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = a.T
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    y = get_ops().matmul(a, b, trans_b=bool(attrs.get("transB", 0)))
    if alpha != 1.0:
        y *= np.float32(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else np.float32(beta) * c)
    return [y]


@op("FusedDense", internal=True)
def _fused_dense(inputs, attrs, opset):
    """fastlayers' own fused node: activation(x @ w + b) through the backend's dense primitive.
    A softmax absorbed with its axis given (``fusion._fused_softmax``'s ``_softmax``) is the
    epilogue where that axis is the output's last, else its own node's operation after the
    product."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    activation = attrs.get("activation", "linear")
    softmax = attrs.get("_softmax")
    if softmax is not None:
        op_type, sm_attrs = softmax
        axis = sm_attrs.get("axis", -1 if opset >= 13 else 1)
        ndim = max(np.ndim(x), 1)
        if not (-ndim <= axis < ndim and axis % ndim == ndim - 1):
            y = get_ops().dense(f32(x), w, b, "linear", 0.0)
            return elementwise.FAMILY.run(op_type)([y], sm_attrs, opset)
    return [get_ops().dense(f32(x), w, b, activation, attrs.get("alpha", 0.0))]


@op("FusedDenseChain", internal=True, caches=("_plans",))
def _fused_dense_chain(inputs, attrs, opset):
    """f_L(... f_1(x @ w_1 + b_1) ... @ w_L + b_L) (``fusion.fuse_dense_chains``): consecutive
    dense nodes as one plan of the backend's (``Ops.dense_chain_plan``), made once per backend;
    inputs x, then each layer's weights and bias ("" where it has none), ``layers`` each
    layer's (activation, alpha)."""

    def make(ops):
        pairs = enumerate(attrs["layers"])
        return ops.dense_chain_plan([(inputs[1 + 2 * i], inputs[2 + 2 * i], name, alpha) for i, (name, alpha) in pairs])

    return [backend_plan(attrs, make)(f32(inputs[0]))]


def one_hot_table(w, b, attrs, ops):
    """The rows a ``OneHotDense`` gathers on the backend ``ops``: activation(w + b) (V, E),
    then row V activation(b) (the product of an all-zero one-hot row), float32 C-contiguous;
    made once per backend into the node's cache (``_tables``)."""
    tables = attrs.get("_tables")
    table = None if tables is None else tables.get(ops.name)
    if table is None:
        name, alpha = attrs.get("activation", "linear"), attrs.get("alpha", 0.0)
        rows = np.concatenate([w, np.zeros((1, w.shape[1]), np.float32)])
        if b is not None:
            rows = rows + b
        table = np.ascontiguousarray(rows if name == "linear" else ops.activation(rows, name, alpha))
        if tables is not None:
            tables[ops.name] = table
    return table


@op("OneHotDense", internal=True, caches=("_tables",))
def _one_hot_dense(inputs, attrs, opset):
    """fastlayers' fused node (``fusion.fuse_one_hot_dense``): activation(float(ids == classes)
    @ w + b) for ids whose last axis is 1 and classes arange(V) on their last axis: a gather of
    rows of activation(w + b) (``one_hot_table``), row V (ids outside [0, V), whose one-hot
    row is all zeros) activation(b). Other ids run the encoding and the product as the graph
    wrote them."""
    ids, classes, w = inputs[0], inputs[1], inputs[2]
    b = inputs[3] if len(inputs) > 3 else None
    name, alpha = attrs.get("activation", "linear"), attrs.get("alpha", 0.0)
    ops = get_ops()
    if type(ids) is not np.ndarray or ids.dtype.kind not in "iu" or ids.ndim == 0 or ids.shape[-1] != 1:
        one_hot = np.equal(ids, classes).astype(np.float32)
        return [ops.dense(one_hot, w, b, name, alpha)]
    lead = broadcast_shape(ids.shape[:-1], classes.shape[:-1], "OneHotDense")
    shape = created(lead + (w.shape[1],), np.float32, "OneHotDense")
    table = one_hot_table(w, b, attrs, ops)
    v = w.shape[0]
    flat = ids.reshape(-1)
    index = np.where((flat >= 0) & (flat < v), flat, v)
    return [table[index].reshape(shape)]
