"""CpuOps recurrent primitives: one input GEMM for all steps, then a compiled time loop.

Each function returns None when the compiled loop does not cover the call (an activation other
than tanh, sigmoid, relu, linear, hard_sigmoid; an empty sequence), and CpuOps falls back to the
numpy reference. Arguments follow ``backends/recurrent_reference.py``.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .._jit import apply_num_threads
from . import _recurrent as K

_NO_MASK = np.zeros((0, 0), np.uint8)
_EMPTY_1D = np.zeros(0, np.float32)
_EMPTY_2D = np.zeros((0, 0), np.float32)


def _c32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _codes(*names):
    codes = tuple(K.CODES.get(n) for n in names)
    return None if any(c is None for c in codes) else codes


def _input_projection(x_bti, w_ig, b_g):
    """xw (B, T, G) = x (B, T, I) @ w_ig + b_g as one GEMM over all timesteps, written into a
    per-thread workspace reused across calls (a fresh multi-MB array costs its page faults)."""
    b, t_len, i = x_bti.shape
    x = np.ascontiguousarray(x_bti, dtype=np.float32).reshape(b * t_len, i)
    xw = _workspace("xw", (b * t_len, w_ig.shape[1]))
    K.input_projection(x, _c32(w_ig), _EMPTY_1D if b_g is None else _c32(b_g), xw)
    return xw.reshape(b, t_len, -1)


_local = threading.local()


def _workspace(name, shape):
    """A C-contiguous float32 scratch array of ``shape``, reused by later calls in this thread."""
    size = math.prod(shape)
    buf = getattr(_local, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 1), np.float32)
        setattr(_local, name, buf)
    return buf[:size].reshape(shape)


def _mask_tb(mask_bt):
    return _NO_MASK if mask_bt is None else np.ascontiguousarray(np.asarray(mask_bt, bool).T, np.uint8)


def _outputs(t_len, batch, size, return_sequences, y0):
    y_btp = np.empty((batch, t_len if return_sequences else 0, size), np.float32)
    last = np.zeros((batch, size), np.float32) if y0 is None else _c32(y0).copy()
    return y_btp, last


def _finish(y_btp, last, mask_tb, reverse, return_sequences, zero_masked):
    if return_sequences:
        return y_btp
    if zero_masked and mask_tb.shape[0]:
        last[mask_tb[0 if reverse else -1] == 0] = 0
    return last


def _scratch(width):
    """float32 and int32 scratch rows for the gate activations (per-thread workspace)."""
    bits = getattr(_local, "bits", None)
    if bits is None or bits.size < width:
        bits = np.empty(width, np.int32)
        _local.bits = bits
    return _workspace("tmp", (width,)), bits[:width]


def rnn_sequence(x_bti, w_ih, w_hh, b, h0, *, activation="tanh", mask_bt=None, reverse=False,
                 return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation)
    batch, t_len, _ = x_bti.shape
    if codes is None or t_len == 0 or batch == 0:
        return None
    apply_num_threads()
    units = w_hh.shape[0]
    xw = _input_projection(x_bti, w_ih, b)
    h = _c32(h0).copy()
    mask_tb = _mask_tb(mask_bt)
    y_btp, last = _outputs(t_len, batch, units, return_sequences, y0)
    tmp, bits = _scratch(units)
    K.rnn_loop(xw, _c32(w_hh), h, mask_tb, bool(reverse), bool(zero_masked), codes[0], codes[0],
               y_btp, last, _workspace("gates", (batch, units)), tmp, bits)
    return _finish(y_btp, last, mask_tb, reverse, return_sequences, zero_masked), h


def lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, *, w_hp=None, activation="tanh",
                  recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                  return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation, recurrent_activation)
    batch, t_len, _ = x_bti.shape
    if codes is None or t_len == 0 or batch == 0:
        return None
    apply_num_threads()
    out_size, units = w_hg.shape[0], w_hg.shape[1] // 4
    xw = _input_projection(x_bti, w_ig, b_g)
    h, c = _c32(h0).copy(), _c32(c0).copy()
    mask_tb = _mask_tb(mask_bt)
    y_btp, last = _outputs(t_len, batch, out_size, return_sequences, y0)
    tmp, bits = _scratch(4 * units)
    K.lstm_loop(xw, _c32(w_hg), _EMPTY_2D if w_hp is None else _c32(w_hp), h, c, mask_tb,
                bool(reverse), bool(zero_masked), codes[0], codes[1], y_btp, last,
                _workspace("gates", (batch, 4 * units)), _workspace("hfull", (batch, units)),
                _workspace("hproj", (batch, out_size)), tmp, bits)
    return _finish(y_btp, last, mask_tb, reverse, return_sequences, zero_masked), h, c


def gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, *, reset_after=True, activation="tanh",
                 recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                 return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation, recurrent_activation)
    batch, t_len, _ = x_bti.shape
    if codes is None or t_len == 0 or batch == 0:
        return None
    apply_num_threads()
    units = w_hg.shape[0]
    xw = _input_projection(x_bti, w_ig, b_ig)
    h = _c32(h0).copy()
    mask_tb = _mask_tb(mask_bt)
    y_btp, last = _outputs(t_len, batch, units, return_sequences, y0)
    if reset_after:
        w_rec, w_hn, width = _c32(w_hg), _EMPTY_2D, 3 * units
        bias = _EMPTY_1D if b_hg is None else _c32(b_hg)
    else:  # the recurrent bias does not exist without reset_after
        w_rec, w_hn, width = _c32(w_hg[:, :2 * units]), _c32(w_hg[:, 2 * units:]), 2 * units
        bias = _EMPTY_1D
    tmp, bits = _scratch(3 * units)
    K.gru_loop(xw, w_rec, w_hn, bias, h, mask_tb, bool(reverse), bool(zero_masked), codes[0],
               codes[1], y_btp, last, _workspace("gates", (batch, width)),
               _workspace("rh", (batch, units)), _workspace("cand", (batch, units)), tmp, bits)
    return _finish(y_btp, last, mask_tb, reverse, return_sequences, zero_masked), h
