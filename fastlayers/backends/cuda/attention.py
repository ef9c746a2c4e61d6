"""The attention primitives of the cuda backend (``AttentionOps``, a base class of CudaOps).

- attention_softmax: one thread per row of the (B, H, Tq, Tk) scores, in place: scale, bias,
  causal mask, softmax (``empty`` says what a row with every key masked gives).
- attention: the two batched tiled products around it.
- self_attention, encoder_layer: the reference's composition (products, attention, norms,
  residual adds) with every value on the device, the input copied in once and the output out
  once.
- tanh_scores, hard_attention: additive (Bahdanau) scores and the one-hot argmax weights.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernels as K
from .device import DeviceOps, serialized_in_simulator
from .runtime import is_device, to_device, to_host
from .views import grid1, grid2


class AttentionOps(DeviceOps):
    """CudaOps' attention primitives (a base class of ``CudaOps``)."""

    @serialized_in_simulator
    def attention_softmax(self, scores_bhqk, scale, bias, causal=False, empty=0):
        dev = is_device(scores_bhqk)
        if scores_bhqk.ndim != 4 or scores_bhqk.size == 0 or (bias is not None and bias.ndim > 4):
            return self._host_path(
                is_device(scores_bhqk),
                super().attention_softmax(to_host(scores_bhqk), scale, to_host(bias), causal, empty),
            )
        s = to_device(scores_bhqk)
        tk = s.shape[3]
        if bias is None:
            db = self._dummy4
        elif is_device(bias):
            db = bias if bias.ndim == 4 else bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
            if db.shape[3] != tk:
                db = self.copy_view(db, lambda v: np.broadcast_to(v, v.shape[:3] + (tk,)))
        else:
            b = np.asarray(bias, np.float32)
            b = b.reshape((1,) * (4 - b.ndim) + b.shape)
            db = to_device(np.broadcast_to(b, b.shape[:3] + (tk,)))
        fill = (np.float32(np.nan), np.float32(0), np.float32(1.0 / tk))[empty]
        rows = s.shape[0] * s.shape[1] * s.shape[2]
        g, t = grid1(rows, self.sim)
        K.attention_softmax_bhqk[g, t](s, db, bias is not None, np.float32(scale), bool(causal), fill)
        return self._back(s, dev)

    @serialized_in_simulator
    def attention(self, q_bhqd, k_bhkd, v_bhkv, scale, bias=None, causal=False, empty=0, need_weights=True):
        dev = is_device(q_bhqd)
        shapes = (q_bhqd.shape, k_bhkd.shape, v_bhkv.shape)
        if not (
            q_bhqd.ndim == k_bhkd.ndim == v_bhkv.ndim == 4
            and shapes[0][:2] == shapes[1][:2] == shapes[2][:2]
            and q_bhqd.size
            and k_bhkd.size
            and v_bhkv.size
        ):
            return self._host_path(
                is_device(q_bhqd),
                super().attention(
                    to_host(q_bhqd), to_host(k_bhkd), to_host(v_bhkv), scale, to_host(bias), causal, empty, need_weights
                ),
            )
        nb, nh, tq, _ = shapes[0]
        tk, dv = shapes[1][2], shapes[2][3]
        dq, dk, dv_ = to_device(q_bhqd), to_device(k_bhkd), to_device(v_bhkv)
        scores = self._empty((nb, nh, tq, tk))
        self._matmul_into(
            dq.reshape(nb * nh, tq, shapes[0][3]),
            dk.reshape(nb * nh, tk, shapes[1][3]),
            scores.reshape(nb * nh, tq, tk),
            trans_b=True,
        )
        w = self.attention_softmax(scores, scale, bias, causal, empty)
        out = self._empty((nb, nh, tq, dv))
        self._matmul_into(w.reshape(nb * nh, tq, tk), dv_.reshape(nb * nh, tk, dv), out.reshape(nb * nh, tq, dv))
        return self._back(out, dev), (self._back(w, dev) if need_weights else None)

    def _self_attention_rows(self, rows, n, length, w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias, empty, need_weights):
        """Multi-head self-attention of the device rows (n length, E): (output rows on the
        device, attention weights or None)."""
        e = rows.shape[1]
        hd = e // num_heads
        qkv = self.dense(rows, w_qkv_io, b_qkv)
        q, k, v = (
            self.copy_view(qkv, lambda a, i=i: a.reshape(n, length, 3, num_heads, hd)[:, :, i].transpose(0, 2, 1, 3))
            for i in range(3)
        )
        o, s = self.attention(q, k, v, 1.0 / math.sqrt(hd), bias, False, empty, need_weights)
        o_rows = self.copy_view(o, lambda a: a.transpose(0, 2, 1, 3)).reshape(n * length, e)
        return self.dense(o_rows, w_o_io, b_o), s

    @serialized_in_simulator
    def self_attention(self, x_nle, w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias=None, empty=0, need_weights=True):
        """``ReferenceOps.self_attention`` with every value on the device: the input copied in
        once and the output out once."""
        dev = is_device(x_nle)
        n, length, e = x_nle.shape
        if x_nle.size == 0:
            return self._host_path(
                dev,
                super().self_attention(
                    to_host(x_nle), w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias, empty, need_weights
                ),
            )
        out, s = self._self_attention_rows(
            to_device(x_nle).reshape(n * length, e),
            n,
            length,
            w_qkv_io,
            b_qkv,
            w_o_io,
            b_o,
            num_heads,
            bias,
            empty,
            need_weights,
        )
        weights = self._back(s, dev) if need_weights else None
        return self._back(out.reshape(n, length, e), dev), weights

    @serialized_in_simulator
    def encoder_layer(
        self, x_nle, w, num_heads, activation="relu", norm_first=False, bias=None, empty=0, need_weights=True
    ):
        """``ReferenceOps.encoder_layer`` with every value on the device: the input copied in
        once and the output out once (the reference composition would copy each product's,
        attention's and norm's operands in and out)."""
        dev = is_device(x_nle)
        n, length, e = x_nle.shape
        if x_nle.size == 0:
            return self._host_path(
                is_device(x_nle),
                super().encoder_layer(to_host(x_nle), w, num_heads, activation, norm_first, bias, empty, need_weights),
            )
        rows = to_device(x_nle).reshape(n * length, e)

        def mha(z_rows):
            return self._self_attention_rows(
                z_rows, n, length, w.w_qkv_io, w.b_qkv, w.w_o_io, w.b_o, num_heads, bias, empty, need_weights
            )

        def ff(z_rows):
            return self.dense(self.dense(z_rows, w.w_1_io, w.b_1, activation), w.w_2_io, w.b_2)

        def norm(z_rows, ln):
            return self.layer_norm(z_rows, *ln)

        def add(a, b):
            return self.merge(a, b, "add")

        if norm_first:
            a, s = mha(norm(rows, w.norm1))
            y = add(rows, a)
            out = add(y, ff(norm(y, w.norm2)))
        else:
            a, s = mha(rows)
            y = norm(add(rows, a), w.norm1)
            out = norm(add(y, ff(y)), w.norm2)
        weights = self._back(s, dev) if need_weights else None
        return self._back(out.reshape(n, length, e), dev), weights

    @serialized_in_simulator
    def tanh_scores(self, q_pqd, k_pkd, w_d, inner=1.0, outer=1.0):
        """s[p, i, j] = outer sum_d w[d] tanh(inner (q[p, i, d] + k[p, j, d])) (w None: ones):
        additive (Bahdanau) and "concat" attention scores, (P, Tq, Tk)."""
        dev = is_device(q_pqd)
        dq, dk = to_device(q_pqd), self._operand(k_pkd, dev)
        p, tq, tk = dq.shape[0], dq.shape[1], dk.shape[1]
        s = self._empty((p, tq, tk))
        if p * tq * tk:
            blocks, threads = grid2(tk, p * tq, self.sim)
            dw = self._dummy if w_d is None else self._weight(w_d)
            K.tanh_scores[blocks, threads](dq, dk, dw, w_d is not None, np.float32(inner), np.float32(outer), s)
        return self._back(s, dev)

    @serialized_in_simulator
    def hard_attention(self, s_pqk, causal=False):
        """One-hot weights at the first argmax over the last axis of scores (P, Tq, Tk) (keys after
        the query excluded if ``causal``; NaN wins, as np.argmax)."""
        dev = is_device(s_pqk)
        ds = to_device(s_pqk)
        w = self._empty(ds.shape)
        rows = ds.shape[0] * ds.shape[1]
        if rows and ds.shape[2]:
            g, t = grid1(rows, self.sim)
            K.hard_attention_rows[g, t](ds, bool(causal), w)
        return self._back(w, dev)
