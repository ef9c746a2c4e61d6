"""torch.nn.MultiheadAttention over fastlayers kernels: projections through BLAS, heads batched
in one ``np.matmul`` per product, masks folded into one additive bias for the fused softmax."""

from __future__ import annotations

import math

import numpy as np

from ..backends import get_ops
from ..errors import InputError, ShapeError
from . import functional as F
from .module import Module
from .modules import Linear

_NAN_ROWS = 0  # torch's MultiheadAttention leaves a query whose keys are all masked as NaN


def _rows(x: np.ndarray) -> np.ndarray:
    """(..., d) as (rows, d): one 2-D GEMM is faster than numpy's loop of stacked GEMMs."""
    return x.reshape(-1, x.shape[-1])


def weight_io(module: Module, name: str) -> np.ndarray:
    """``module.<name>`` (out, in) transposed to a C-contiguous (in, out) copy, cached until the
    attribute is replaced (load_state_dict replaces arrays): OpenBLAS ran x @ W.T (transposed
    operand) ~30% slower than x @ W_io on this machine. In-place edits of the weight array are
    not seen; assign a new array instead."""
    w = getattr(module, name)
    cache = module.__dict__.get("_io_cache")
    if cache is None:
        cache = {}
        object.__setattr__(module, "_io_cache", cache)
    hit = cache.get(name)
    if hit is None or hit[0] is not w:
        hit = (w, np.ascontiguousarray(w.T))
        cache[name] = hit
    return hit[1]


def _xavier(rng, shape):
    bound = math.sqrt(6.0 / (shape[0] + shape[1]))
    a = rng.random(shape, dtype=np.float32)  # float32 from the start, in place
    a *= np.float32(2 * bound)
    a -= np.float32(bound)
    return a


class MultiheadAttention(Module):
    """Multi-head attention with torch's arguments, state_dict keys and results.

    Parameters
    ----------
    embed_dim, num_heads : int
    dropout : float
        Ignored (inference).
    bias : bool
        ``in_proj_bias`` and ``out_proj.bias``.
    add_bias_kv : bool
        Learned ``bias_k``/``bias_v`` (1, 1, E) appended to the keys and values.
    add_zero_attn : bool
        A zero key and value appended after projection.
    kdim, vdim : int, optional
        Key/value feature sizes; when either differs from ``embed_dim`` the projections are the
        separate ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, else the packed
        ``in_proj_weight`` (3E, E).
    batch_first : bool
        Inputs and outputs are (N, L, E) instead of (L, N, E).

    Shape
    -----
    query (L, N, E) (or (N, L, E) with ``batch_first``, or unbatched (L, E)), key (S, N, kdim),
    value (S, N, vdim) -> output like query; weights (N, L, S) averaged over heads, or
    (N, H, L, S) with ``average_attn_weights=False``.
    """

    # the parameters that some arguments leave out (None)
    in_proj_weight: np.ndarray | None
    q_proj_weight: np.ndarray | None
    k_proj_weight: np.ndarray | None
    v_proj_weight: np.ndarray | None
    in_proj_bias: np.ndarray | None
    bias_k: np.ndarray | None
    bias_v: np.ndarray | None

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise InputError(
                f"MultiheadAttention: embed_dim and num_heads must be > 0, got {embed_dim} and {num_heads}"
            )
        if embed_dim % num_heads:
            raise InputError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.head_dim = self.embed_dim // self.num_heads
        self.dropout, self.batch_first, self.add_zero_attn = dropout, batch_first, add_zero_attn
        rng = np.random.default_rng()
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _xavier(rng, (3 * E, E))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.q_proj_weight = _xavier(rng, (E, E))
            self.k_proj_weight = _xavier(rng, (E, self.kdim))
            self.v_proj_weight = _xavier(rng, (E, self.vdim))
            self.in_proj_weight = None
        self.in_proj_bias = np.zeros(3 * E, np.float32) if bias else None
        self.out_proj = Linear(E, E, bias=bias)
        if bias:
            self.out_proj.bias = np.zeros(E, np.float32)
        if add_bias_kv:
            self.bias_k = (rng.standard_normal((1, 1, E)) * math.sqrt(2.0 / (1 + E))).astype(np.float32)
            self.bias_v = (rng.standard_normal((1, 1, E)) * math.sqrt(2.0 / (1 + E))).astype(np.float32)
        else:
            self.bias_k = self.bias_v = None

    # ------------------------------------------------------------------------- forward
    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """(attn_output, attn_weights or None), as torch's ``MultiheadAttention.forward``.

        ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or (N*H, L, S): bool True means
        *not allowed to attend*, float values are added to the scores. ``is_causal`` is a hint
        that ``attn_mask`` is causal (torch requires ``attn_mask`` with it). A query whose keys
        are all masked gives NaN, as torch does.
        """
        where = "MultiheadAttention"
        q, k, v = (F._f32(t, where) for t in (query, key, value))
        if is_causal and attn_mask is None:
            raise InputError(
                "MultiheadAttention: is_causal is a hint that attn_mask is the causal "
                "mask; attn_mask must be given (as in torch)"
            )
        batched = q.ndim == 3
        if q.ndim not in (2, 3) or k.ndim != q.ndim or v.ndim != q.ndim:
            raise ShapeError(
                f"{where}: expected query, key, value of rank 3 (or 2, unbatched), got "
                f"shapes {q.shape}, {k.shape}, {v.shape}"
            )
        (q, k, v), key_padding_mask = self.batch_first_inputs((q, k, v), key_padding_mask)
        out, w = self._attend(q, k, v, key_padding_mask, attn_mask, need_weights)
        out = self.from_batch_first(out, batched)
        if not need_weights:
            return out, None
        if average_attn_weights:
            w = w.mean(axis=1, dtype=np.float32)
        return out, (w if batched else w[0])

    def batch_first_inputs(self, tensors, key_padding_mask):
        """Rank-3 (or unbatched rank-2) inputs in this module's layout as batch-first (N, L, E)
        views, and the key padding mask with its batch axis."""
        if tensors[0].ndim == 2:
            if key_padding_mask is not None:
                key_padding_mask = np.asarray(key_padding_mask)[None]
            return tuple(t[None] for t in tensors), key_padding_mask
        if not self.batch_first:
            tensors = tuple(np.swapaxes(t, 0, 1) for t in tensors)
        return tensors, key_padding_mask

    def from_batch_first(self, out_nle, batched: bool):
        """A batch-first (N, L, E) result back in this module's layout (unbatched: (L, E))."""
        if not batched:
            return out_nle[0]
        return out_nle if self.batch_first else np.swapaxes(out_nle, 0, 1)

    def _attend(self, q_nle, k_nse, v_nse, key_padding_mask, attn_mask, need_weights):
        """Batch-first attention; returns (out (N, L, E), weights (N, H, L, S'))."""
        where = "MultiheadAttention"
        E, H, hd = self.embed_dim, self.num_heads, self.head_dim
        N, L = q_nle.shape[:2]
        S = k_nse.shape[1]
        if (
            q_nle.shape[2] != E
            or k_nse.shape[2] != self.kdim
            or v_nse.shape[2] != self.vdim
            or k_nse.shape[0] != N
            or v_nse.shape[:2] != (N, S)
        ):
            raise ShapeError(
                f"{where}(embed_dim={E}, kdim={self.kdim}, vdim={self.vdim}): got "
                f"query {q_nle.shape}, key {k_nse.shape}, value {v_nse.shape} "
                "(batch first)"
            )
        ops = get_ops()
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E : 2 * E], b[2 * E :])
        if self._qkv_same_embed_dim:
            w = weight_io(self, "in_proj_weight")  # (E, 3E)
            if q_nle is k_nse and k_nse is v_nse:  # self-attention: one GEMM for q, k and v
                qkv = ops.dense(_rows(q_nle), w, b).reshape(N, L, 3, H, hd)
                q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            else:
                q = ops.dense(_rows(q_nle), w[:, :E], bq).reshape(N, L, H, hd)
                if k_nse is v_nse:  # cross-attention over one memory: one GEMM for k and v
                    kv = ops.dense(_rows(k_nse), w[:, E:], None if b is None else b[E:])
                    kv = kv.reshape(N, S, 2, H, hd)
                    k, v = kv[:, :, 0], kv[:, :, 1]
                else:
                    k = ops.dense(_rows(k_nse), w[:, E : 2 * E], bk).reshape(N, S, H, hd)
                    v = ops.dense(_rows(v_nse), w[:, 2 * E :], bv).reshape(N, S, H, hd)
        else:
            q = ops.dense(_rows(q_nle), weight_io(self, "q_proj_weight"), bq).reshape(N, L, H, hd)
            k = ops.dense(_rows(k_nse), weight_io(self, "k_proj_weight"), bk).reshape(N, S, H, hd)
            v = ops.dense(_rows(v_nse), weight_io(self, "v_proj_weight"), bv).reshape(N, S, H, hd)
        extra = 0
        if self.bias_k is not None:  # one learned key/value appended along S
            k = np.concatenate([k, np.broadcast_to(self.bias_k.reshape(1, 1, H, hd), (N, 1, H, hd))], 1)
            v = np.concatenate([v, np.broadcast_to(self.bias_v.reshape(1, 1, H, hd), (N, 1, H, hd))], 1)
            extra += 1
        if self.add_zero_attn:
            k = np.concatenate([k, np.zeros((N, 1, H, hd), np.float32)], 1)
            v = np.concatenate([v, np.zeros((N, 1, H, hd), np.float32)], 1)
            extra += 1
        bias = self._bias(key_padding_mask, attn_mask, N, L, S, extra)
        q_nhld, k_nhsd, v_nhsd = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        out, w = ops.attention(
            q_nhld, k_nhsd, v_nhsd, 1.0 / math.sqrt(hd), bias, False, _NAN_ROWS, need_weights=need_weights
        )
        out = np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(N * L, E)
        op = self.out_proj
        return ops.dense(out, weight_io(op, "weight"), op.bias).reshape(N, L, E), w

    def _bias(self, key_padding_mask, attn_mask, N, L, S, extra):
        """key_padding_mask (N, S) and attn_mask (L, S) / (N*H, L, S) as one (N|1, H|1, L|1, S+extra) bias."""
        where = "MultiheadAttention"
        H = self.num_heads
        bias = None
        if attn_mask is not None:
            am = F._attn_bias(attn_mask, where, true_means_attend=False)
            if am.shape == (L, S):
                am = am.reshape(1, 1, L, S)
            elif am.shape == (N * H, L, S):
                am = am.reshape(N, H, L, S)
            else:
                raise ShapeError(f"{where}: attn_mask must be ({L}, {S}) or ({N * H}, {L}, {S}), got {am.shape}")
            bias = am
        if key_padding_mask is not None:
            kp = F._attn_bias(key_padding_mask, where, true_means_attend=False)
            if kp.shape != (N, S):
                raise ShapeError(f"{where}: key_padding_mask must be (N, S) = ({N}, {S}), got {kp.shape}")
            kp = kp.reshape(N, 1, 1, S)
            bias = kp if bias is None else bias + kp
        if bias is not None and extra:
            bias = np.concatenate([bias, np.zeros((*bias.shape[:3], extra), np.float32)], axis=-1)
        return bias

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
