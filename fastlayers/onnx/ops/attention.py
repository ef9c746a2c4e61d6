"""ONNX attention: fastlayers' own nodes fused at load (FusedAttention, FusedEncoderLayer,
FusedSelfAttention) and the opset-23 Attention operator, on the backend's attention primitives."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...errors import ShapeError, UnsupportedError
from ..records import BOOL, FLT, INT, POS, A, Family, fail
from ..tensors import f32
from .elementwise import softmax_on

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("attention")
op = FAMILY.op


@op("FusedAttention", internal=True)
def _fused_attention(inputs, attrs, opset):
    """fastlayers' own node for the exporters' MatMul / Softmax attention (``fuse_attention``):
    inputs Q, K (K^T where ``_k_transposed``), V, the scales of Q, of K and of the scores and
    an additive mask ("" where absent). One call of the backend's attention primitive where
    Q, K and V are float32 heads (rank 3 or 4, the same leading axes) and every scale has one
    element and the Softmax's axis (``_axis``) is the scores' last; else the graph's own
    arithmetic, broadcasting as ONNX does."""
    q, k, v, s_q, s_k, s_scores, mask = (list(inputs) + [None] * 7)[:7]
    k = np.swapaxes(k, -1, -2) if attrs["_k_transposed"] else k
    axis = attrs.get("_axis", -1)
    last = axis % max(q.ndim, k.ndim) == max(q.ndim, k.ndim) - 1
    divide_q, divide_k, divide_scores = attrs["_divide"]
    scales = [(s, d) for s, d in zip((s_q, s_k, s_scores), attrs["_divide"]) if s is not None]
    heads = (
        all(a.dtype == np.float32 for a in (q, k, v))
        and q.ndim == k.ndim == v.ndim
        and q.ndim in (3, 4)
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
        and k.shape[-2] == v.shape[-2]
        and q.shape[-1] == k.shape[-1]
    )
    if heads and last and all(s.size == 1 for s, _ in scales) and (mask is None or mask.ndim <= q.ndim):
        scale = np.float32(1.0)
        for s, divide in scales:
            value = np.float32(s.reshape(-1)[0])
            scale = scale / value if divide else scale * value
        three_d = q.ndim == 3
        if three_d:
            q, k, v = q[None], k[None], v[None]
        bias = None if mask is None else f32(mask)
        out, _ = get_ops().attention(q, k, v, float(scale), bias, False, 0, need_weights=False)
        return [out[0] if three_d else out]
    scores = _scaled(
        get_ops().matmul(_scaled(q, s_q, divide_q), _scaled(np.swapaxes(k, -1, -2), s_k, divide_k)),
        s_scores,
        divide_scores,
    )
    if mask is not None:
        scores = scores + mask
    return [get_ops().matmul(softmax_on(f32(scores), axis, opset), v)]


@op("FusedEncoderLayer", internal=True)
def _fused_encoder_layer(inputs, attrs, opset):
    """fastlayers' own node for a whole Transformer encoder layer (``fuse_encoder_layers``):
    one call of the backend's ``encoder_layer`` on the (batch, length, embed) input, or on the
    (length, batch, embed) one where the graph is sequence first."""
    x = inputs[0]
    w = attrs["weights"]
    e = w.w_qkv_io.shape[0]
    if x.ndim != 3 or x.shape[2] != e:
        raise ShapeError(
            f"ONNX encoder layer {attrs['name']!r} (FusedEncoderLayer): expected a "
            f"3-D input of width {e}, got shape {x.shape}"
        )
    x_nle = x if attrs["batch_first"] else x.transpose(1, 0, 2)
    y, _ = get_ops().encoder_layer(
        f32(x_nle), w, attrs["num_heads"], attrs["activation"], attrs["norm_first"], need_weights=False
    )
    return [y if attrs["batch_first"] else y.transpose(1, 0, 2)]


@op("FusedSelfAttention", internal=True)
def _fused_self_attention(inputs, attrs, opset):
    """fastlayers' own node for a self-attention block outside an encoder layer (torch's
    ``MultiheadAttention`` on x, x, x; ``fuse_encoder_layers``): one call of the backend's
    ``self_attention`` on the (batch, length, embed) input, or on the (length, batch, embed)
    one where the graph is sequence first."""
    x = inputs[0]
    w_qkv, b_qkv, w_o, b_o = attrs["weights"]
    e = w_qkv.shape[0]
    if x.ndim != 3 or x.shape[2] != e:
        raise ShapeError(
            f"ONNX attention block {attrs['name']!r} (FusedSelfAttention): expected a "
            f"3-D input of width {e}, got shape {x.shape}"
        )
    x_nle = x if attrs["batch_first"] else x.transpose(1, 0, 2)
    y, _ = get_ops().self_attention(f32(x_nle), w_qkv, b_qkv, w_o, b_o, attrs["num_heads"], need_weights=False)
    return [y if attrs["batch_first"] else y.transpose(1, 0, 2)]


def _scaled(x, s, divide):
    """x / s or x * s as the graph's Div or Mul (broadcasting); x where there is no scale."""
    return x if s is None else (x / s if divide else x * s)


# -------------------------------------------------------------------------- attention (opset 23)
def _attention_check(node, attrs, ctx):
    q, kv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if (q is None) != (kv is None):
        fail(ctx, node, "q_num_heads and kv_num_heads go together")
    if q is not None and q % kv:
        fail(ctx, node, f"kv_num_heads {kv} does not divide q_num_heads {q}")


@op(
    "Attention",
    inputs=(3, 7),
    outputs=4,
    check=_attention_check,
    attrs={
        "is_causal": BOOL,
        "kv_num_heads": POS,
        "q_num_heads": POS,
        "scale": FLT,
        "softcap": FLT,
        "qk_matmul_output_mode": A(INT, 0, 3),
        "softmax_precision": A(INT),
        "left_window_size": A(INT),
        "right_window_size": A(INT),
    },
)  # the operator refuses windows
def _attention(inputs, attrs, opset):
    """ONNX Attention: softmax(scale Q K^T (+ softcap) + mask (+ causal)) V over batched heads, with
    3-D inputs split into heads, grouped-query K/V repeated, and a past K/V cache prepended.
    A query row with no key left attends to nothing (output 0), as the spec's reference does.
    Without softcap and where nothing reads the scores output (``_qk_read`` False, set at load),
    one call of the backend's attention primitive."""
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    q, k, v = (f32(a) for a in inputs[:3])
    mask, past_k, past_v = get(3), get(4), get(5)
    if (
        get(6) is not None
        or attrs.get("left_window_size", -1) not in (-1, None)
        or attrs.get("right_window_size", -1) not in (-1, None)
    ):
        raise UnsupportedError("Attention with nonpad_kv_seqlen or sliding windows is not supported")
    three_d = q.ndim == 3
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(
            f"Attention: Q, K and V of shapes {q.shape}, {k.shape}, {v.shape} (expected three 3-D or three 4-D inputs)"
        )
    if three_d:
        if "q_num_heads" not in attrs:
            raise ShapeError("Attention: 3-D inputs need the attributes q_num_heads and kv_num_heads")
        qh, kvh = attrs["q_num_heads"], attrs["kv_num_heads"]
        split = lambda a, h: a.reshape(a.shape[0], a.shape[1], h, -1).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q, qh), split(k, kvh), split(v, kvh)
    if past_k is not None:
        k, v = np.concatenate([f32(past_k), k], axis=2), np.concatenate([f32(past_v), v], axis=2)
    present_k, present_v = k, v
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or v.shape[1] != k.shape[1]:
        raise ShapeError(
            f"Attention: {q.shape[1]} query heads and {k.shape[1]} / {v.shape[1]} key / "
            "value heads (the key heads must divide the query heads)"
        )
    if q.shape[1] != k.shape[1]:  # grouped-query attention
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scale = attrs.get("scale") or 1.0 / np.sqrt(q.shape[-1])
    tq, tk = q.shape[2], k.shape[2]
    bias = np.zeros((tq, tk), np.float32)
    if mask is not None:
        if mask.shape[-1] < tk:  # a mask shorter than the keys (past cache) masks the rest
            width = [(0, 0)] * (mask.ndim - 1) + [(0, tk - mask.shape[-1])]
            mask = np.pad(mask, width, constant_values=False if mask.dtype == np.bool_ else -np.inf)
        bias = bias + (np.where(mask, np.float32(0), np.float32(-np.inf)) if mask.dtype == np.bool_ else f32(mask))
    if attrs.get("is_causal", 0):
        offset = 0 if past_k is None else past_k.shape[2]
        allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset
        bias = bias + np.where(allowed, np.float32(0), np.float32(-np.inf))
    softcap = attrs.get("softcap", 0.0) or 0.0
    if not attrs.get("_qk_read", True) and softcap <= 0:  # one call of the backend's primitive
        y, _ = get_ops().attention(q, k, v, float(scale), bias, False, 1, need_weights=False)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], tq, -1)
        return [y, present_k, present_v]
    scores = get_ops().matmul(q, k, trans_b=True) * np.float32(scale)
    if softcap > 0:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    capped = scores
    scores = scores + bias
    w = get_ops().attention_softmax(np.ascontiguousarray(scores, dtype=np.float32), 1.0, None, False, 1)
    y = get_ops().matmul(w, v)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], tq, -1)
    # the optional 4th output, as the spec's reference computes it: the (soft-capped) scores,
    # with the mask added for mode 2, the softmax weights for mode 3
    mode = attrs.get("qk_matmul_output_mode", 0)
    qk = capped + bias if mode == 2 else (w if mode == 3 else capped)
    return [y, present_k, present_v, qk]
