"""Keras-style attention layers: Attention (Luong), AdditiveAttention (Bahdanau),
MultiHeadAttention, and the fastlayers extras HardAttention, SelfAttention, PositionalEncoding
and PositionwiseFeedForward.

Every attention layer can return its attention weights (``return_attention_scores=True``), so a
service can show what the model looked at. Masks follow Keras: True (or > 0.5) means *attend*.
A query whose keys are all masked gets what Keras computes: uniform weights 1/Tk in Attention and
AdditiveAttention (Keras subtracts 1e9 from masked scores before the softmax), in
MultiHeadAttention zero weights when the scores are returned (or the inputs have rank > 3),
as Keras's Softmax layer zeroes masked positions, and uniform weights otherwise, as Keras's fused
``dot_product_attention`` path gives (Keras itself differs between the two paths).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ..backends.derived import derived, derived_from
from ..errors import ShapeError, UnsupportedError
from .base import Layer, shape_str
from .core import _DEFAULT_ALPHA, activation_name
from .symbolic import SymbolicTensor, is_symbolic

_EMPTY_ZERO, _EMPTY_UNIFORM = 1, 2  # what a fully masked query row becomes (see the module doc)


def _mask_array(ops, mask):
    """A mask given to a call as an array of the backend (device arrays stay where they are)."""
    return mask if ops.is_device_array(mask) else np.asarray(mask)


def _where(layer) -> str:
    return f"layer {layer.name!r} ({type(layer).__name__})"


def _no_symbolic_mask(layer, mask):
    if mask is not None and (
        isinstance(mask, SymbolicTensor)
        or (isinstance(mask, (list, tuple)) and any(isinstance(m, SymbolicTensor) for m in mask))
    ):
        raise UnsupportedError(
            f"{_where(layer)}: masks given as symbolic tensors are not supported in graphs; pass them in numeric calls"
        )


# ----------------------------------------------------------------------------- Luong / Bahdanau
class _BaseDenseAttention(Layer):
    """[query, value(, key)] -> softmax(scores(query, key)) @ value, with Keras's masks."""

    multi_input = True

    def __init__(self, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = float(dropout)

    def _shapes(self, input_shape):
        if (
            not isinstance(input_shape, (list, tuple))
            or len(input_shape) not in (2, 3)
            or not all(isinstance(s, (list, tuple)) for s in input_shape)
        ):
            raise ShapeError(f"{_where(self)}: expected a list [query, value] or [query, value, key]")
        q, v = tuple(input_shape[0]), tuple(input_shape[1])
        k = tuple(input_shape[2]) if len(input_shape) == 3 else v
        if len(q) < 3 or len(v) != len(q) or len(k) != len(q):
            raise ShapeError(
                f"{_where(self)}: expected query (batch, Tq, dim), value (batch, Tv, "
                f"dim_v) and key (batch, Tv, dim) of the same rank >= 3, got "
                f"{[shape_str(s) for s in input_shape]}"
            )
        if k[-2] is not None and v[-2] is not None and k[-2] != v[-2]:
            raise ShapeError(
                f"{_where(self)}: key and value must have the same length, got key "
                f"{shape_str(k)} and value {shape_str(v)}"
            )
        return q, v, k

    def compute_output_shape(self, input_shape, mask=None, return_attention_scores=False, use_causal_mask=False):
        q, v, k = self._shapes(input_shape)
        out = (*q[:-1], v[-1])
        return [out, (*q[:-1], k[-2])] if return_attention_scores else out

    def __call__(self, inputs, *args, **kwargs):
        _no_symbolic_mask(self, kwargs.get("mask"))
        if is_symbolic(inputs) and isinstance(inputs, (list, tuple)):
            self._shapes([t.shape for t in inputs])
        return super().__call__(inputs, *args, **kwargs)

    def _scores(self, q, k):
        raise NotImplementedError

    def call(self, inputs, mask=None, return_attention_scores=False, use_causal_mask=False):
        q3, v3, k3, lead = self._arrays(inputs)  # (P, T, dim), P = prod(lead)
        p, tq, tk = q3.shape[0], q3.shape[1], k3.shape[1]
        q_mask, v_mask = self._masks(mask)
        w = self.ops.attention_softmax(
            self._scores(q3, k3).reshape(p, 1, tq, tk),
            1.0,
            self._value_bias(v_mask, inputs, lead, p),
            bool(use_causal_mask),
            _EMPTY_UNIFORM,
        ).reshape(p, tq, tk)
        return self._outputs(w, v3, lead, q_mask, return_attention_scores)

    @staticmethod
    def _masks(mask):
        """(query mask, value mask), each None when not given."""
        if mask is None:
            return None, None
        return tuple((list(mask) + [None, None])[:2])

    def _value_bias(self, v_mask, inputs, lead, p):
        """The value mask as an additive bias (P, 1, 1, Tk): 0 attend, -inf masked."""
        if v_mask is None:
            return None
        v_shape = tuple(inputs[1].shape)
        vm = _mask_array(self.ops, v_mask)
        if tuple(vm.shape) != v_shape[:-1]:
            raise ShapeError(f"{_where(self)}: value mask must have shape {v_shape[:-1]}, got {tuple(vm.shape)}")
        tk = v_shape[-2]
        bias = self.ops.mask_bias(vm.reshape(*v_shape[:-2], 1, tk), (*lead, 1, tk))
        return bias.reshape(p, 1, 1, tk)

    def _outputs(self, w_pqk, v3, lead, q_mask, return_attention_scores):
        """out = w v with masked queries zeroed (Keras multiplies by the query mask), and the
        weights, both with the leading axes restored."""
        ops = self.ops
        p, tq, tk = w_pqk.shape
        out = ops.matmul(w_pqk, v3).reshape(*lead, tq, v3.shape[2])
        if q_mask is not None:
            keep = ops.mask_keep(_mask_array(ops, q_mask))
            out = ops.merge(out, keep.reshape(*keep.shape, 1), "multiply")
        return [out, w_pqk.reshape(*lead, tq, tk)] if return_attention_scores else out

    def _arrays(self, inputs):
        """query, value and key as (P, T, dim) arrays over their broadcast leading axes
        ``lead`` (P = prod(lead)), and ``lead``."""
        q, v = inputs[0], inputs[1]
        k = inputs[2] if len(inputs) > 2 else v
        q_shape, v_shape, k_shape = (tuple(a.shape) for a in (q, v, k))
        self._shapes([q_shape, v_shape, k_shape])
        if q_shape[-1] != k_shape[-1] and self._needs_same_dim:
            raise ShapeError(f"{_where(self)}: query and key must share the last axis, got {q_shape} and {k_shape}")
        try:
            lead = np.broadcast_shapes(q_shape[:-2], v_shape[:-2], k_shape[:-2])
        except ValueError:
            raise ShapeError(
                f"{_where(self)}: the leading axes of query {q_shape}, value "
                f"{v_shape} and key {k_shape} do not broadcast"
            ) from None
        p = math.prod(lead) if lead else 1

        def batched(a, shape):
            if shape[:-2] != lead:
                a = self.ops.broadcast_to(a, (*lead, *shape[-2:]))
            return a.reshape(p, shape[-2], shape[-1])

        return batched(q, q_shape), batched(v, v_shape), batched(k, k_shape), lead

    _needs_same_dim = True


class Attention(_BaseDenseAttention):
    """Dot-product (Luong) attention, as ``keras.layers.Attention``.

    scores = query @ key^T (times the learned scalar ``scale`` with ``use_scale``), or with
    ``score_mode="concat"``: concat_score_weight * sum(tanh(scale * (query + key))).

    Parameters
    ----------
    use_scale : bool, default False
    score_mode : {"dot", "concat"}
    dropout : float
        Ignored (inference).

    Call
    ----
    ``inputs`` [query, value] or [query, value, key]; ``mask`` [query_mask, value_mask]
    (numeric calls; True = keep), ``return_attention_scores``, ``use_causal_mask``.

    Shape
    -----
    query (batch, Tq, dim), value (batch, Tv, dim_v), key (batch, Tv, dim) -> (batch, Tq, dim_v);
    scores (batch, Tq, Tv). Weights: ``scale`` () with use_scale, ``concat_score_weight`` ()
    with score_mode="concat".
    """

    config_keys: ClassVar[tuple[str, ...]] = ("use_scale", "score_mode", "dropout")

    def __init__(self, use_scale: bool = False, score_mode: str = "dot", dropout: float = 0.0, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        if score_mode not in ("dot", "concat"):
            raise UnsupportedError(f"Attention: score_mode must be 'dot' or 'concat', got {score_mode!r}")
        self.use_scale, self.score_mode = bool(use_scale), score_mode

    def build(self, input_shape):
        self._shapes(input_shape)
        if self.use_scale:
            self.add_weight("scale", (), "ones")
        if self.score_mode == "concat":
            self.add_weight("concat_score_weight", (), "ones")

    def _scores(self, q_pqd, k_pkd):
        if self.score_mode == "dot":
            s = self.ops.matmul(q_pqd, k_pkd, trans_b=True)
            return self.ops.merge(s, self.scale, "multiply") if self.use_scale else s
        return self.ops.tanh_scores(
            q_pqd, k_pkd, None, float(self.scale) if self.use_scale else 1.0, float(self.concat_score_weight)
        )


class AdditiveAttention(_BaseDenseAttention):
    """Additive (Bahdanau) attention, as ``keras.layers.AdditiveAttention``.

    scores = sum(scale * tanh(query + key), axis=-1) (``scale`` (dim,) with ``use_scale``).

    Parameters
    ----------
    use_scale : bool, default True
    dropout : float
        Ignored (inference).

    Shape
    -----
    As ``Attention``. Weights: ``scale`` (dim,) with use_scale.
    """

    config_keys = ("use_scale", "dropout")

    def __init__(self, use_scale: bool = True, dropout: float = 0.0, **kwargs):
        super().__init__(dropout=dropout, **kwargs)
        self.use_scale = bool(use_scale)

    def build(self, input_shape):
        q, v, k = self._shapes(input_shape)
        if self.use_scale:
            self.add_weight("scale", (k[-1],), "glorot_uniform")

    def _scores(self, q_pqd, k_pkd):
        return self.ops.tanh_scores(q_pqd, k_pkd, self.scale if self.use_scale else None)


class HardAttention(Attention):
    """Hard (argmax) attention for inference: each query takes the one value whose key has the
    highest dot-product score (ties: the first), a fastlayers extra.

    Parameters
    ----------
    use_scale : bool, default False
        Learned scalar on the scores (only matters for its sign).

    Call
    ----
    As ``Attention``: masked keys are never chosen; a query with every key masked takes value 0.
    ``return_attention_scores=True`` returns the one-hot weights (and the chosen index is their
    argmax).

    Shape
    -----
    query (batch, Tq, dim), value (batch, Tv, dim_v), key (batch, Tv, dim) -> (batch, Tq, dim_v);
    weights (batch, Tq, Tv), one-hot.
    """

    config_keys = ("use_scale",)

    def __init__(self, use_scale: bool = False, **kwargs):
        super().__init__(use_scale=use_scale, score_mode="dot", **kwargs)

    def get_config(self):
        return {"name": self.name, "use_scale": self.use_scale}

    def call(self, inputs, mask=None, return_attention_scores=False, use_causal_mask=False):
        q3, v3, k3, lead = self._arrays(inputs)  # (P, T, dim), P = prod(lead)
        p, tk = q3.shape[0], k3.shape[1]
        q_mask, v_mask = self._masks(mask)
        s = self._scores(q3, k3)  # (P, Tq, Tk)
        bias = self._value_bias(v_mask, inputs, lead, p)
        if bias is not None:  # masked keys score -inf
            s = self.ops.merge(s, bias.reshape(p, 1, tk), "add")
        w = self.ops.hard_attention(s, bool(use_causal_mask))
        return self._outputs(w, v3, lead, q_mask, return_attention_scores)


# ---------------------------------------------------------------------------- multi-head
_PACK_NAMES = ("query", "value", "key", "attention_mask")


class MultiHeadAttention(Layer):
    """Multi-head attention, as ``keras.layers.MultiHeadAttention`` (inference).

    Projections are one BLAS product each, heads batched in one ``np.matmul`` per product, and
    scale + mask + softmax run in one fused kernel.

    Parameters
    ----------
    num_heads, key_dim : int
    value_dim : int, optional
        Default ``key_dim``.
    dropout : float
        Ignored (inference).
    use_bias : bool, default True
    output_shape : int or tuple, optional
        Trailing output shape; default the query's last axis.
    attention_axes : int or tuple, optional
        Axes attention is computed over (default: every axis between batch and features).

    Call
    ----
    ``query``, ``value``, ``key`` (default ``value``), ``attention_mask`` (batch, Tq..., Tk...)
    with True / > 0.5 meaning *attend*, ``value_mask``/``key_mask`` (batch, Tk) (numeric rank-3
    calls; ``query_mask`` is refused: Keras ignores it), ``return_attention_scores``,
    ``use_causal_mask`` (one attention axis). A query with every key masked gets what Keras
    gives: zero weights with ``return_attention_scores`` (or inputs of rank > 3), else uniform.
    In a functional model the call is recorded with its tensors packed in a list
    ``[query, value(, key)(, attention_mask)]``.

    Shape
    -----
    query (batch, *T, dim), value (batch, *S, dim_v), key (batch, *S, dim_k) ->
    (batch, *T, *output_shape); scores (batch, *other axes, num_heads, *Tq_attn, *Tk_attn).
    Weights: query/key/value kernels (dim, num_heads, key_dim|value_dim) and biases
    (num_heads, key_dim|value_dim), output kernel (num_heads, value_dim, *output_shape) and bias.
    """

    multi_input = True
    config_keys: ClassVar[tuple[str, ...]] = (
        "num_heads",
        "key_dim",
        "value_dim",
        "dropout",
        "use_bias",
        "output_shape",
        "attention_axes",
    )

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_shape=None,
        attention_axes=None,
        flash_attention=None,
        sliding_window=None,
        use_gate: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if sliding_window is not None or use_gate:
            raise UnsupportedError("MultiHeadAttention: sliding_window and use_gate are not supported")
        self.num_heads, self.key_dim = int(num_heads), int(key_dim)
        self.value_dim = int(value_dim) if value_dim is not None else self.key_dim
        if self.num_heads <= 0 or self.key_dim <= 0 or self.value_dim <= 0:
            raise ValueError(f"MultiHeadAttention {self.name!r}: num_heads, key_dim and value_dim must be positive")
        self.dropout, self.use_bias = float(dropout), bool(use_bias)
        if isinstance(output_shape, (list, tuple)):
            output_shape = tuple(int(d) for d in output_shape)
        elif output_shape is not None:
            output_shape = int(output_shape)
        self.output_shape = output_shape
        if isinstance(attention_axes, int):
            attention_axes = (attention_axes,)
        self.attention_axes = None if attention_axes is None else tuple(int(a) for a in attention_axes)
        self._rank = None

    # ------------------------------------------------------------------------- calling
    def __call__(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        return_attention_scores: bool = False,
        training=None,
        use_causal_mask: bool = False,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        packed=None,
    ):
        if query_mask is not None:
            raise UnsupportedError(
                f"{_where(self)}: Keras 3 replaces an explicit query_mask argument "
                "by the query's implicit Keras mask, so it has no effect there; "
                "pass attention_mask (batch, Tq, Tk) instead"
            )
        if value_mask is not None or key_mask is not None:
            attention_mask = self._merge_masks(query, value, key, attention_mask, value_mask, key_mask)
        if packed is None:  # the Keras signature: pack the tensors into one list input
            if value is None:
                raise TypeError(
                    f"MultiHeadAttention {self.name!r}: call(query, value, key=None, "
                    "attention_mask=None, ...) needs a value"
                )
            parts = [("query", query), ("value", value), ("key", key), ("attention_mask", attention_mask)]
            parts = [(n, t) for n, t in parts if t is not None]
            packed = [n for n, _ in parts]
            query = [t for _, t in parts]
        kinds = [isinstance(t, SymbolicTensor) for t in query]
        if any(kinds) and not all(kinds):
            raise UnsupportedError(
                f"{_where(self)}: in a graph every tensor argument (query, value, key, attention_mask) must be symbolic"
            )
        if not self.built:  # build from [query, value, key] shapes, whatever was packed
            q, v, k, _ = self._unpack(
                [tuple(np.shape(t) if not isinstance(t, SymbolicTensor) else t.shape) for t in query], packed
            )
            self._ensure_built([(None, *s[1:]) for s in (q, v, k)])
        kwargs: dict[str, Any] = {"packed": list(packed)}
        if return_attention_scores:
            kwargs["return_attention_scores"] = True
        if use_causal_mask:
            kwargs["use_causal_mask"] = True
        return Layer.__call__(self, list(query), **kwargs)

    def _merge_masks(self, query, value, key, attention_mask, value_mask, key_mask):
        """Keras's _compute_attention_mask: (B, S) value and key masks combined
        with ``attention_mask`` into one (B, T, S) mask (numeric rank-3 calls only)."""
        given = [m for m in (query, value, key, attention_mask, value_mask, key_mask) if m is not None]
        if any(isinstance(m, SymbolicTensor) for m in given) or np.ndim(query) != 3:
            raise UnsupportedError(
                f"{_where(self)}: query_mask/value_mask/key_mask are supported in "
                "numeric calls on rank-3 inputs; pass attention_mask instead"
            )

        def keep(m):
            m = np.asarray(m)
            return m if m.dtype == np.bool_ else m > 0.5

        mask = None
        for m in (value_mask, key_mask if key is not None and key is not value else None):
            if m is not None:
                m = keep(m)[:, None, :]
                mask = m if mask is None else mask & m
        if attention_mask is not None:
            mask = keep(attention_mask) & mask
        t, s = np.shape(query)[1], np.shape(value)[1]
        return np.broadcast_to(mask, (np.shape(query)[0], t, s))

    def _unpack(self, items, packed):
        named = dict(zip(packed, items))
        if set(named) - set(_PACK_NAMES) or "query" not in named or "value" not in named:
            raise ShapeError(f"{_where(self)}: bad packed inputs {packed}")
        return named["query"], named["value"], named.get("key", named["value"]), named.get("attention_mask")

    def _shape_info(self, q, v, k):
        """Validate shapes; return (attention axes, other axes) for inputs of rank len(q)."""
        rank = len(q)
        if rank < 3 or len(v) != rank or len(k) != rank:
            raise ShapeError(
                f"{_where(self)}: expected query, value and key of the same rank >= 3, "
                f"got {shape_str(q)}, {shape_str(v)}, {shape_str(k)}"
            )
        if self.attention_axes is None:
            axes = tuple(range(1, rank - 1))
        else:
            axes = tuple(sorted(a % rank for a in self.attention_axes))
            if any(a in (0, rank - 1) for a in axes):
                raise ShapeError(
                    f"{_where(self)}: attention_axes {self.attention_axes} must lie "
                    f"between the batch and feature axes of rank-{rank} inputs"
                )
        others = tuple(a for a in range(1, rank - 1) if a not in axes)
        for a in others:
            if None not in (q[a], v[a]) and q[a] != v[a]:
                raise ShapeError(
                    f"{_where(self)}: query {shape_str(q)} and value {shape_str(v)} differ on non-attention axis {a}"
                )
        if tuple(k[:-1]) != tuple(v[:-1]) and None not in k[1:-1] + v[1:-1]:
            raise ShapeError(
                f"{_where(self)}: key {shape_str(k)} and value {shape_str(v)} must have "
                "the same shape but for the last axis"
            )
        return axes, others

    def _out_tail(self, q_shape):
        if self.output_shape is None:
            return (q_shape[-1],)
        return self.output_shape if isinstance(self.output_shape, tuple) else (self.output_shape,)

    def build(self, input_shape):
        q, v, k = (tuple(s) for s in input_shape)  # always [query, value, key]: see __call__
        self._shape_info(q, v, k)
        if None in (q[-1], v[-1], k[-1]):
            raise ShapeError(f"{_where(self)}: the feature axes must be known")
        H, kd, vd = self.num_heads, self.key_dim, self.value_dim
        self.add_weight("query_kernel", (q[-1], H, kd), "glorot_uniform")
        if self.use_bias:
            self.add_weight("query_bias", (H, kd), "zeros")
        self.add_weight("key_kernel", (k[-1], H, kd), "glorot_uniform")
        if self.use_bias:
            self.add_weight("key_bias", (H, kd), "zeros")
        self.add_weight("value_kernel", (v[-1], H, vd), "glorot_uniform")
        if self.use_bias:
            self.add_weight("value_bias", (H, vd), "zeros")
        tail = self._out_tail(q)
        self.add_weight("output_kernel", (H, vd, *tail), "glorot_uniform")
        if self.use_bias:
            self.add_weight("output_bias", tail, "zeros")
        self._rank = len(q)

    def compute_output_shape(
        self, input_shape, packed=("query", "value"), return_attention_scores=False, use_causal_mask=False
    ):
        q, v, k, _ = self._unpack([tuple(s) for s in input_shape], packed)
        axes, others = self._shape_info(q, v, k)
        out = (*q[:-1], *self._out_tail(q))
        if not return_attention_scores:
            return out
        scores = (q[0], *(q[a] for a in others), self.num_heads, *(q[a] for a in axes), *(k[a] for a in axes))
        return [out, scores]

    def _self_attention(self, x):
        """The layer on x as query, key and value (rank 3, no mask, heads of width E / H, an
        output of width E): one ``ops.self_attention`` call, on the q, k and v kernels side by
        side (made once per set of weight arrays)."""
        e = tuple(x.shape)[-1]  # device arrays' shapes may not index from the end
        w_qkv = derived_from(
            (self.query_kernel, self.key_kernel, self.value_kernel),
            "mha-qkv",
            lambda *w: np.concatenate([a.reshape(e, e) for a in w], axis=1),
        )
        b_qkv = (
            derived_from(
                (self.query_bias, self.key_bias, self.value_bias),
                "mha-qkv",
                lambda *b: np.concatenate([a.reshape(e) for a in b]),
            )
            if self.use_bias
            else None
        )
        w_o = derived(self.output_kernel, "mha-out", lambda w: w.reshape(e, e))
        return self.ops.self_attention(
            x, w_qkv, b_qkv, w_o, self.output_bias if self.use_bias else None, self.num_heads, need_weights=False
        )[0]

    def call(self, inputs, packed=("query", "value"), return_attention_scores=False, use_causal_mask=False):
        q, v, k, mask = self._unpack(inputs, packed)
        q_shape, k_shape = tuple(q.shape), tuple(k.shape)
        axes, others = self._shape_info(q_shape, tuple(v.shape), k_shape)
        ops = self.ops
        H, kd, vd = self.num_heads, self.key_dim, self.value_dim
        rank = len(q_shape)
        if (
            q is v
            and k is v
            and mask is None
            and not use_causal_mask
            and not return_attention_scores
            and rank == 3
            and axes == (1,)
            and kd == vd
            and H * kd == q_shape[-1]
            and self._out_tail(q_shape) == (H * kd,)
        ):
            return self._self_attention(q)

        # projections: one GEMM each, (..., dim) @ (dim, H*kd)
        def project(x, kernel, bias, d):  # one 2-D GEMM, not numpy's loop over stacked ones
            shape = tuple(x.shape)
            rows = math.prod(shape[:-1])
            y = ops.dense(
                x.reshape(rows, shape[-1]),
                kernel.reshape(shape[-1], H * d),
                bias.reshape(H * d) if self.use_bias else None,
            )
            return y.reshape(*shape[:-1], H * d)

        qp = project(q, self.query_kernel, self.query_bias if self.use_bias else None, kd)
        kp = project(k, self.key_kernel, self.key_bias if self.use_bias else None, kd)
        vp = project(v, self.value_kernel, self.value_bias if self.use_bias else None, vd)
        # (B, other..., attn..., H*d) -> (B*other, H, prod(attn), d)
        perm = (0, *others, *axes, rank - 1)
        B = q_shape[0]
        o_shape = tuple(q_shape[a] for a in others)
        tq_shape = tuple(q_shape[a] for a in axes)
        tk_shape = tuple(k_shape[a] for a in axes)
        P, TQ, TK = B * math.prod(o_shape), math.prod(tq_shape), math.prod(tk_shape)
        moved = perm != tuple(range(rank))

        def heads(x, t, d):
            x = ops.transpose(x, perm) if moved else x
            return ops.split_heads(x.reshape(P, t, H * d), H)

        q4, k4, v4 = heads(qp, TQ, kd), heads(kp, TK, kd), heads(vp, TK, vd)
        bias = None
        if mask is not None:
            m = _mask_array(ops, mask)
            want = (B, *o_shape, *tq_shape, *tk_shape)
            try:
                if np.broadcast_shapes(tuple(m.shape), want) != want:
                    raise ValueError
            except ValueError:
                raise ShapeError(
                    f"{_where(self)}: attention_mask of shape {tuple(m.shape)} does "
                    f"not broadcast to {want} (batch, other axes, query axes, key "
                    "axes)"
                ) from None
            bias = ops.mask_bias(m, want).reshape(P, 1, TQ, TK)
        if use_causal_mask and len(axes) != 1:
            raise UnsupportedError(f"{_where(self)}: use_causal_mask needs exactly one attention axis")
        # a fully masked query: Keras's explicit-scores path zeroes its weights; its fused path
        # (rank-3 inputs, no scores returned, no dropout) gives uniform weights; match both
        fused = not return_attention_scores and rank == 3 and self.dropout == 0
        out, w = ops.attention(
            q4,
            k4,
            v4,
            1.0 / math.sqrt(kd),
            bias,
            bool(use_causal_mask),
            _EMPTY_UNIFORM if fused else _EMPTY_ZERO,
            need_weights=bool(return_attention_scores),
        )
        # (P, H, TQ, vd) -> (B, other..., attn..., H*vd) -> output projection
        ctx = ops.merge_heads(out).reshape(B, *o_shape, *tq_shape, H * vd)
        if moved:
            ctx = ops.transpose(ctx, tuple(int(a) for a in np.argsort(perm)))
        tail = self._out_tail(q_shape)
        width = math.prod(tail)
        y = ops.dense(
            ctx.reshape(math.prod(q_shape[:-1]), H * vd),
            self.output_kernel.reshape(H * vd, width),
            self.output_bias.reshape(width) if self.use_bias else None,
        )
        y = y.reshape(*q_shape[:-1], *tail)
        if not return_attention_scores:
            return y
        scores = w.reshape(B, *o_shape, H, *tq_shape, *tk_shape)
        return [y, scores]


class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention on one input (query = key = value), a fastlayers convenience.

    Parameters
    ----------
    num_heads, key_dim : int
        As ``MultiHeadAttention``.
    use_causal_mask : bool, default False
        Each position attends to itself and earlier positions only.
    return_attention_scores : bool, default False
        Output [output, scores] instead of output.
    **kwargs
        ``value_dim``, ``use_bias``, ``output_shape``, ``attention_axes`` and the other keyword
        arguments of ``MultiHeadAttention``, with the same weights.

    Shape
    -----
    (batch, T, dim) -> (batch, T, output_shape or dim); scores (batch, num_heads, T, T).
    """

    multi_input = False
    config_keys = MultiHeadAttention.config_keys + ("use_causal_mask", "return_attention_scores")

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        self.use_causal_mask = bool(use_causal_mask)
        self.return_attention_scores = bool(return_attention_scores)

    def __call__(self, inputs, *args, **kwargs):
        return Layer.__call__(self, inputs, *args, **kwargs)

    def build(self, input_shape):
        super().build([input_shape] * 3)

    def compute_output_shape(self, input_shape):
        return super().compute_output_shape([input_shape] * 3, ("query", "value", "key"), self.return_attention_scores)

    def call(self, x):
        return super().call([x, x, x], ("query", "value", "key"), self.return_attention_scores, self.use_causal_mask)


# ---------------------------------------------------------------------------- transformer parts
class PositionalEncoding(Layer):
    """Adds the sinusoidal position encoding of "Attention Is All You Need" (fastlayers extra):
    PE[t, 2i] = sin(t / base^(2i/d)), PE[t, 2i+1] = cos(t / base^(2i/d)).

    Parameters
    ----------
    max_length : int, default 2048
        Longest sequence; the table (max_length, d) is computed once, in float64, at build.
    base : float, default 10000
    scale_input : bool, default False
        Multiply the input by sqrt(d) first (as the paper does for embeddings).

    Shape
    -----
    (batch, T, d) -> (batch, T, d), T <= max_length.
    """

    config_keys = ("max_length", "base", "scale_input")

    def __init__(self, max_length: int = 2048, base: float = 10000.0, scale_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.max_length, self.base, self.scale_input = int(max_length), float(base), bool(scale_input)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ShapeError(f"{_where(self)}: expected (batch, T, d) with d known, got {shape_str(input_shape)}")
        d = input_shape[-1]
        pos = np.arange(self.max_length, dtype=np.float64)[:, None]
        inv = np.exp(-math.log(self.base) * np.arange(0, d, 2, dtype=np.float64) / d)
        table = np.zeros((self.max_length, d), np.float64)
        table[:, 0::2] = np.sin(pos * inv)
        table[:, 1::2] = np.cos(pos * inv[: d // 2])
        object.__setattr__(self, "table", table.astype(np.float32))
        object.__setattr__(self, "_sqrt_d", np.float32(math.sqrt(d)))

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 3 and input_shape[1] is not None and input_shape[1] > self.max_length:
            raise ShapeError(f"{_where(self)}: sequence length {input_shape[1]} exceeds max_length {self.max_length}")
        return tuple(input_shape)

    def call(self, x):
        shape = tuple(x.shape)
        if len(shape) != 3 or shape[-1] != self.table.shape[1] or shape[1] > self.max_length:
            raise ShapeError(
                f"{_where(self)}: expected (batch, T <= {self.max_length}, {self.table.shape[1]}), got {shape}"
            )
        return self.ops.merge(x, self.table[: shape[1]], "add", self._sqrt_d if self.scale_input else 1.0)


class PositionwiseFeedForward(Layer):
    """The Transformer's position-wise feed-forward block (fastlayers extra):
    y = activation(x @ kernel1 + bias1) @ kernel2 + bias2 at each position.

    Parameters
    ----------
    hidden_units : int
        Inner size (d_ff).
    output_units : int, optional
        Default: the input's last axis (d_model).
    activation : str, default "relu"
        Any ``Dense`` activation name ("gelu" is exact).
    use_bias : bool, default True

    Shape
    -----
    (batch, ..., d_model) -> (batch, ..., output_units). Weights: kernel1 (d_model, d_ff),
    bias1 (d_ff,), kernel2 (d_ff, output_units), bias2 (output_units,), as two Keras Dense layers.
    """

    config_keys = ("hidden_units", "output_units", "activation", "use_bias")

    def __init__(
        self, hidden_units: int, output_units: int | None = None, activation="relu", use_bias: bool = True, **kwargs
    ):
        super().__init__(**kwargs)
        self.hidden_units = int(hidden_units)
        self.output_units = None if output_units is None else int(output_units)
        self.activation = activation_name(activation)
        self.use_bias = bool(use_bias)

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None or len(input_shape) < 2:
            raise ShapeError(f"{_where(self)}: the last axis must be known, got {shape_str(input_shape)}")
        out = self.output_units or d
        self.add_weight("kernel1", (d, self.hidden_units), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias1", (self.hidden_units,), "zeros")
        self.add_weight("kernel2", (self.hidden_units, out), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias2", (out,), "zeros")

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.output_units or input_shape[-1])

    def call(self, x):
        if tuple(x.shape)[-1] != self.kernel1.shape[0]:
            raise ShapeError(f"{_where(self)}: expected last axis {self.kernel1.shape[0]}, got {x.shape}")
        h = self.ops.dense(
            x,
            self.kernel1,
            self.bias1 if self.use_bias else None,
            self.activation,
            _DEFAULT_ALPHA.get(self.activation, 0.0),
        )
        return self.ops.dense(h, self.kernel2, self.bias2 if self.use_bias else None)
