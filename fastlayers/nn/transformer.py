"""torch.nn Transformer encoder/decoder layers and stacks (post- or pre-norm), with torch's
state_dict keys, and a greedy decoding helper for encoder-decoder models."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from ..backends import get_ops
from ..backends.types import EncoderWeights
from ..errors import InputError, ShapeError
from . import functional as F
from .attention import _NAN_ROWS, MultiheadAttention, weight_io
from .module import Module
from .modules import GELU, Dropout, LayerNorm, Linear, ModuleList, ReLU


def _activation(activation) -> tuple[str | None, Callable]:
    """(fused dense activation name or None, callable) for torch's ``activation`` argument."""
    if isinstance(activation, str):
        if activation not in ("relu", "gelu"):
            raise InputError(f"activation should be relu/gelu, not {activation}")
        return activation, F.relu if activation == "relu" else F.gelu
    if activation is F.relu or isinstance(activation, ReLU):
        return "relu", activation
    if activation is F.gelu or (isinstance(activation, GELU) and activation.approximate == "none"):
        return "gelu", activation
    if isinstance(activation, GELU):
        return "gelu_tanh", activation
    if callable(activation):
        return None, activation
    raise InputError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class _FeedForward:
    """linear2(act(linear1(x))) with the activation fused into linear1's epilogue."""

    def _ff_block(self, x):
        ops = get_ops()
        l1, l2 = self.linear1, self.linear2
        x2 = x.reshape(-1, x.shape[-1])  # one 2-D GEMM, not numpy's loop over stacked ones
        if self._act_name is not None:
            h = ops.dense(x2, weight_io(l1, "weight"), l1.bias, self._act_name)
        else:
            h = np.asarray(self.activation(ops.dense(x2, weight_io(l1, "weight"), l1.bias)), np.float32)
        return ops.dense(h, weight_io(l2, "weight"), l2.bias).reshape(*x.shape[:-1], -1)


class TransformerEncoderLayer(_FeedForward, Module):
    """Self-attention and feed-forward block, as ``torch.nn.TransformerEncoderLayer``.

    Parameters
    ----------
    d_model, nhead, dim_feedforward : int
    dropout : float
        Ignored (inference).
    activation : {"relu", "gelu"} or callable
    layer_norm_eps : float
    batch_first, norm_first, bias : bool

    Shape
    -----
    src (S, N, E), or (N, S, E) with ``batch_first``, or unbatched (S, E) -> same shape.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation="relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self._act_name, self.activation = _activation(activation)

    def forward(
        self,
        src,
        src_mask=None,
        src_key_padding_mask=None,
        is_causal: bool = False,
        *,
        return_attention_weights: bool = False,
    ):
        """Run the layer; ``return_attention_weights=True`` (fastlayers) also returns the
        self-attention weights (N, H, L, S), per head."""
        x = F._f32(src, "TransformerEncoderLayer")
        if x.ndim not in (2, 3) or x.shape[-1] != self.self_attn.embed_dim:
            raise ShapeError(
                f"TransformerEncoderLayer(d_model={self.self_attn.embed_dim}): expected "
                f"src (S, N, E), (N, S, E) or (S, E), got {x.shape}"
            )
        fused = self._fused_weights()
        # a fused layer has an activation name (_fused_weights); tested again for the type checker
        if fused is not None and self._act_name is not None and (src_mask is not None or not is_causal):
            sa = self.self_attn
            (xb,), kpm = sa.batch_first_inputs((x,), src_key_padding_mask)
            n, length = xb.shape[:2]
            bias = sa._bias(kpm, src_mask, n, length, length, 0)
            y, w = get_ops().encoder_layer(
                xb, fused, sa.num_heads, self._act_name, self.norm_first, bias, _NAN_ROWS, return_attention_weights
            )
            y = sa.from_batch_first(y, x.ndim == 3)
            if not return_attention_weights:
                return y
            return y, (w if w is None or x.ndim == 3 else w[0])
        if self.norm_first:
            a, w = self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal, return_attention_weights)
            x = x + a
            x = x + self._ff_block(self.norm2(x))
        else:
            a, w = self._sa_block(x, src_mask, src_key_padding_mask, is_causal, return_attention_weights)
            x = self.norm1(x + a)
            x = self.norm2(x + self._ff_block(x))
        return (x, w) if return_attention_weights else x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal, need_weights):
        return self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            average_attn_weights=False,
            is_causal=is_causal,
        )

    def _fused_weights(self) -> EncoderWeights | None:
        """The weights for ``ops.encoder_layer`` (the whole layer as one primitive), or None
        when the layer is not its plain form: a callable activation, separate q/k/v weights,
        bias_k/bias_v, add_zero_attn, or norms replaced by other modules. Built once and kept
        while the parameter arrays stay the same objects (read through the tables directly:
        this runs on every call)."""
        children = self._modules
        sa, n1, n2 = children["self_attn"], children["norm1"], children["norm2"]
        e = sa.embed_dim
        if (
            self._act_name is None
            or not sa._qkv_same_embed_dim
            or sa.add_zero_attn
            or sa._parameters.get("bias_k") is not None
            or type(n1) is not LayerNorm
            or type(n2) is not LayerNorm
            or n1.normalized_shape != (e,)
            or n2.normalized_shape != (e,)
        ):
            return None
        op, l1, l2 = sa._modules["out_proj"], children["linear1"], children["linear2"]
        raw = (
            *(m._parameters.get(k) for m, k in ((sa, "in_proj_weight"), (sa, "in_proj_bias"))),
            *(m._parameters.get(k) for m in (op, l1, l2, n1, n2) for k in ("weight", "bias")),
            n1.eps,
            n2.eps,
        )
        cached = self.__dict__.get("_fused_cache")
        if cached is not None and all(a is b for a, b in zip(cached[0], raw)):
            return cached[1]
        fused = EncoderWeights(
            weight_io(sa, "in_proj_weight"),
            raw[1],
            weight_io(op, "weight"),
            raw[3],
            weight_io(l1, "weight"),
            raw[5],
            weight_io(l2, "weight"),
            raw[7],
            (raw[8], raw[9], n1.eps),
            (raw[10], raw[11], n2.eps),
        )
        object.__setattr__(self, "_fused_cache", (raw, fused))
        return fused


class TransformerDecoderLayer(_FeedForward, Module):
    """Masked self-attention, cross-attention over ``memory`` and feed-forward, as
    ``torch.nn.TransformerDecoderLayer``.

    Parameters
    ----------
    d_model, nhead, dim_feedforward : int
    dropout : float
        Ignored (inference).
    activation : {"relu", "gelu"} or callable
    layer_norm_eps : float
    batch_first, norm_first, bias : bool

    Shape
    -----
    tgt (T, N, E), memory (S, N, E) (batch first: (N, T, E), (N, S, E)) -> like tgt.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation="relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self._act_name, self.activation = _activation(activation)

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
        *,
        return_attention_weights: bool = False,
    ):
        """Run the layer; ``return_attention_weights=True`` (fastlayers) also returns
        (self-attention weights, cross-attention weights), each (N, H, T, S) per head."""
        x = F._f32(tgt, "TransformerDecoderLayer")
        mem = F._f32(memory, "TransformerDecoderLayer")
        E = self.self_attn.embed_dim
        if x.ndim not in (2, 3) or x.shape[-1] != E or mem.ndim != x.ndim or mem.shape[-1] != E:
            raise ShapeError(
                f"TransformerDecoderLayer(d_model={E}): expected tgt and memory of "
                f"rank 3 (or 2) ending in {E}, got {x.shape} and {mem.shape}"
            )
        if self.norm_first:
            a, w_self = self._sa_block(
                self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal, return_attention_weights
            )
            x = x + a
            a, w_cross = self._mha_block(
                self.norm2(x), mem, memory_mask, memory_key_padding_mask, memory_is_causal, return_attention_weights
            )
            x = x + a
            x = x + self._ff_block(self.norm3(x))
        else:
            a, w_self = self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal, return_attention_weights)
            x = self.norm1(x + a)
            a, w_cross = self._mha_block(
                x, mem, memory_mask, memory_key_padding_mask, memory_is_causal, return_attention_weights
            )
            x = self.norm2(x + a)
            x = self.norm3(x + self._ff_block(x))
        return (x, (w_self, w_cross)) if return_attention_weights else x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal, need_weights):
        return self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=bool(is_causal),
            need_weights=need_weights,
            average_attn_weights=False,
        )

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal, need_weights):
        return self.multihead_attn(
            x,
            mem,
            mem,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=bool(is_causal),
            need_weights=need_weights,
            average_attn_weights=False,
        )


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


class TransformerEncoder(Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` and an optional final ``norm``.

    ``enable_nested_tensor`` and ``mask_check`` are accepted for porting. Unlike torch's
    nested-tensor fast path, which returns 0 at padded positions of ``src_key_padding_mask``,
    padded positions keep their computed values (the non-padded positions are identical).

    Shape
    -----
    src (S, N, E) (or (N, S, E) with the layer's ``batch_first``) -> same shape.
    """

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm=None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(
        self,
        src,
        mask=None,
        src_key_padding_mask=None,
        is_causal: bool | None = None,
        *,
        return_attention_weights: bool = False,
    ):
        """``return_attention_weights=True`` (fastlayers) also returns each layer's weights."""
        x, weights = src, []
        for layer in self.layers:
            x = layer(
                x,
                src_mask=mask,
                src_key_padding_mask=src_key_padding_mask,
                is_causal=bool(is_causal),
                return_attention_weights=return_attention_weights,
            )
            if return_attention_weights:
                x, w = x
                weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if return_attention_weights else x


class TransformerDecoder(Module):
    """A stack of ``num_layers`` copies of ``decoder_layer`` and an optional final ``norm``.

    Shape
    -----
    tgt (T, N, E), memory (S, N, E) (or batch first) -> like tgt.
    """

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        return_attention_weights: bool = False,
    ):
        """``return_attention_weights=True`` (fastlayers) also returns each layer's
        (self, cross) weights."""
        x, weights = tgt, []
        for layer in self.layers:
            x, w = layer(
                x,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_is_causal=bool(tgt_is_causal),
                memory_is_causal=memory_is_causal,
                return_attention_weights=True,
            )
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return (x, weights) if return_attention_weights else x


def generate_square_subsequent_mask(sz: int) -> np.ndarray:
    """The causal float mask (sz, sz): 0 on and below the diagonal, -inf above (torch's helper)."""
    return np.triu(np.full((sz, sz), -np.inf, np.float32), k=1)


def greedy_decode(
    encode: Callable, decode_step: Callable, src, start_token: int, end_token: int | None = None, max_len: int = 50
) -> np.ndarray:
    """Greedy decoding of an encoder-decoder model: at each step the argmax token is appended.

    Parameters
    ----------
    encode : callable
        ``encode(src) -> memory``, run once.
    decode_step : callable
        ``decode_step(ys, memory) -> logits`` with ``ys`` the (N, t) int64 tokens so far and
        logits (N, t, V) (the last position is used) or (N, V).
    src : array
        Passed to ``encode`` as is (batch first along axis 0 of the result's rows).
    start_token, end_token : int
        The first token of every sequence; decoding of a sequence stops after ``end_token``
        (later positions repeat ``end_token``), and the loop ends when all sequences have.
    max_len : int
        Upper bound on the output length, ``start_token`` included.

    Returns
    -------
    ndarray of int64, shape (N, t) with t <= max_len, starting with ``start_token``.
    """
    if max_len < 1:
        raise InputError(f"greedy_decode: max_len must be >= 1, got {max_len}")
    memory = encode(src)
    n = len(src) if not hasattr(src, "shape") else src.shape[0]
    ys = np.full((n, 1), start_token, np.int64)
    done = np.zeros(n, bool)
    while ys.shape[1] < max_len and not done.all():
        logits = np.asarray(decode_step(ys, memory))
        if logits.ndim == 3:
            logits = logits[:, -1]
        if logits.ndim != 2 or logits.shape[0] != n:
            raise ShapeError(
                f"greedy_decode: decode_step must return logits (N, t, V) or (N, V) with "
                f"N = {n}, got shape {np.shape(logits)}"
            )
        nxt = np.argmax(logits, axis=-1).astype(np.int64)
        if end_token is not None:
            nxt = np.where(done, end_token, nxt)
            done |= nxt == end_token
        ys = np.concatenate([ys, nxt[:, None]], axis=1)
    return ys
