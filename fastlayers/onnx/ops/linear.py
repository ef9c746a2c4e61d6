"""ONNX matrix products: MatMul, Gemm and fastlayers' FusedDense, on the backend's primitives."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ..tensors import f32, registrar

#: This family's operators: ONNX operator name -> implementation (``ops.OPS`` assembles the families).
OPS: dict = {}
op = registrar(OPS)


@op("MatMul")
def _matmul(inputs, attrs, opset):
    return [get_ops().matmul(inputs[0], inputs[1])]


@op("Gemm")
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


@op("FusedDense")
def _fused_dense(inputs, attrs, opset):
    """fastlayers' own fused node: activation(x @ w + b) through the backend's dense primitive."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    return [get_ops().dense(f32(x), w, b, attrs.get("activation", "linear"), attrs.get("alpha", 0.0))]
