"""Small ONNX graphs the service tests serve and call (built with the onnx package)."""

from __future__ import annotations

import numpy as np


def conv_relu(path, channels: int = 64, hw: int = 56, batch="N", matmul: bool = False, seed: int = 1):
    """Conv channels -> channels 3x3 (pads 1) + Relu on (batch, channels, hw, hw), then with
    ``matmul`` an (hw, hw) MatMul over the last axis; ``batch`` a number or a free dimension."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.05, 0.05, (channels, channels, 3, 3)).astype(np.float32)
    b = rng.uniform(-0.1, 0.1, channels).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r" if matmul else "y"]),
    ]
    if matmul:
        inits.append(numpy_helper.from_array(rng.uniform(-0.1, 0.1, (hw, hw)).astype(np.float32), "m"))
        nodes.append(helper.make_node("MatMul", ["r", "m"], ["y"]))
    shape = [batch, channels, hw, hw]
    graph = helper.make_graph(
        nodes,
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
