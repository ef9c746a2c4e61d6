"""ONNX LSTM/GRU graphs built from fastlayers' canonical recurrent weights (for bench_rnn.py).

Canonical (fastlayers) layouts: LSTM kernel (I, 4H) with gate blocks i, f, g, o; GRU kernel
(I, 3H) with z, r, h. ONNX wants W (dirs, gates*H, I) with LSTM gates i, o, f, c and GRU z, r, h,
and B (dirs, 2*gates*H) = input bias then recurrent bias.
"""

from __future__ import annotations

import numpy as np


def lstm_onnx_weights(kernel_ig, recurrent_hg, bias_g):
    """(W, R, B) for one ONNX LSTM direction from canonical i, f, g, o weights."""
    units = recurrent_hg.shape[0]

    def reorder(m):  # columns i f g o -> i o f g
        i, f, g, o = (m[..., k * units : (k + 1) * units] for k in range(4))
        return np.concatenate([i, o, f, g], axis=-1)

    w = reorder(kernel_ig).T[None]
    r = reorder(recurrent_hg).T[None]
    b = np.concatenate([reorder(bias_g), np.zeros(4 * units, np.float32)])[None]
    return [np.ascontiguousarray(a, np.float32) for a in (w, r, b)]


def gru_onnx_weights(kernel_ig, recurrent_hg, bias_2g):
    """(W, R, B) for one ONNX GRU direction (linear_before_reset=1) from Keras z, r, h weights."""
    w = kernel_ig.T[None]
    r = recurrent_hg.T[None]
    b = np.concatenate([bias_2g[0], bias_2g[1]])[None]
    return [np.ascontiguousarray(a, np.float32) for a in (w, r, b)]


def recurrent_model(op, weights, input_size, hidden):
    """An ONNX model running one LSTM/GRU node over x (batch, time, input); output Y_h[0] (batch, H).

    onnxruntime's CPU LSTM/GRU refuse ``layout=1`` (batch-first), so the graph transposes x to
    (time, batch, input) first, as exporters do for batch-first models.
    """
    from onnx import TensorProto, helper, numpy_helper

    names = ["W", "R", "B"]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(weights, names)]
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    transpose = helper.make_node("Transpose", ["x"], ["x_tbi"], perm=[1, 0, 2])
    node = helper.make_node(op, ["x_tbi", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden, **extra)
    squeeze = helper.make_node("Squeeze", ["Y_h", "axis0"], ["h"])
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    graph = helper.make_graph(
        [transpose, node, squeeze],
        op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, input_size])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
