"""Minimal export of fastlayers models to ONNX graphs, so onnxruntime runs the same network on the
same weights in the benchmarks (onnx.helper; no torch needed). Covers the layers the benchmark
models use; anything else raises UnsupportedError."""

from __future__ import annotations

import numpy as np

from fastlayers.errors import UnsupportedError

_ACT_OPS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "gelu": "Gelu", "softmax": "Softmax", "linear": None}


def to_onnx(model, input_name: str = "x"):
    """An ONNX ModelProto (opset 20, IR 10) computing ``model`` (a single-input chain of layers)."""
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.model.graph import InputLayer

    nodes, inits = [], []
    current = input_name
    layers = [layer for layer in model.layers if not isinstance(layer, InputLayer)]

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def act(kind, src, tag):
        op = _ACT_OPS.get(kind, "unsupported")
        if op == "unsupported":
            raise UnsupportedError(f"onnx_export: activation {kind!r} is not mapped")
        if op is None:
            return src
        out = f"{tag}_act"
        attrs = {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, [src], [out], **attrs))
        return out

    for i, layer in enumerate(layers):
        kind, tag = type(layer).__name__, f"l{i}"
        if kind == "Dense":
            out = f"{tag}_y"
            args = [current, const(f"{tag}_w", layer.kernel)]
            if layer.use_bias:
                args.append(const(f"{tag}_b", layer.bias))
            nodes.append(helper.make_node("Gemm", args, [out]))
            current = act(layer.activation, out, tag)
        elif kind == "Rescaling":
            nodes.append(helper.make_node("Mul", [current, const(f"{tag}_s", layer._scale)], [f"{tag}_m"]))
            nodes.append(helper.make_node("Add", [f"{tag}_m", const(f"{tag}_o", layer._offset)], [f"{tag}_y"]))
            current = f"{tag}_y"
        elif kind == "BatchNormalization":
            nodes.append(helper.make_node("Mul", [current, const(f"{tag}_s", layer._scale)], [f"{tag}_m"]))
            nodes.append(helper.make_node("Add", [f"{tag}_m", const(f"{tag}_t", layer._shift)], [f"{tag}_y"]))
            current = f"{tag}_y"
        elif kind in ("Dropout", "SpatialDropout1D", "SpatialDropout2D"):
            continue
        elif kind == "Activation":
            current = act(layer.activation, current, tag)
        else:
            raise UnsupportedError(f"onnx_export: layer {layer.name!r} ({kind}) is not mapped")
    d_in = model.inputs[0].shape[1:]
    graph = helper.make_graph(
        nodes,
        model.name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [None, *d_in])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
