"""Tiny ONNX files made with onnx.helper, for the tests of the bench command and the pytest
plugin."""

from __future__ import annotations

import numpy as np

from .conftest import oracle


def dense_model(path, dims, name="x"):
    """An ONNX file y = relu(x @ W + b) with W of shape (16, 8): ``dims`` declares x's shape
    (its last entry 16; strings are free dimensions)."""
    onnx = oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [name, "W"], ["h"]),
            helper.make_node("Add", ["h", "B"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "dense",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*dims[:-1], 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)
