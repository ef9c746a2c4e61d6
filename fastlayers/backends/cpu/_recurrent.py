"""Compiled time loops of the recurrent layers (SimpleRNN, LSTM, GRU) and their gate math.

The primitive (``recurrent.py``) computes the input projection of all timesteps as one GEMM,
``xw[b, t] = x[b, t] @ w_ig + b_g`` laid out (batch, time, gates); each loop below then runs the
whole sequence in compiled code: per step one recurrent product (BLAS sgemm through ``np.dot``
with an ``out`` array, from scipy's cython_blas; at batch 1 the Numba gemv ``_gemv``) and one
fused pass over the gates (activations, cell update, masking, outputs). No Python runs per
timestep.

Activation codes: 0 tanh, 1 sigmoid, 2 relu, 3 linear, 4 hard_sigmoid (relu6(x + 3) / 6).
sigmoid and tanh use the vectorized ``exp_inplace``; tanh uses its odd Taylor series below
|x| < 0.4 (where (1 - e^-2|x|) / (1 + e^-2|x|) loses relative precision to cancellation).
Outputs ``y`` are (batch, time, out) ((batch, 0, out) when only the last
output is wanted). Masks are uint8 (time, batch), 1 = valid step; an empty (0, 0) mask means every step is valid.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from ._vexp import exp_inplace

TANH, SIGMOID, RELU, LINEAR, HARD_SIGMOID = 0, 1, 2, 3, 4
CODES = {"tanh": TANH, "sigmoid": SIGMOID, "relu": RELU, "linear": LINEAR,
         "hard_sigmoid": HARD_SIGMOID}

_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_TWO = np.float32(2.0)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
_INV6 = np.float32(1.0 / 6.0)
_TANH_SMALL = np.float32(0.4)
# tanh x = x (1 + x^2 (T3 + x^2 (T5 + ...))) for |x| < 0.4; the next term is below 3e-8 relative
_T3 = np.float32(-1.0 / 3.0)
_T5 = np.float32(2.0 / 15.0)
_T7 = np.float32(-17.0 / 315.0)
_T9 = np.float32(62.0 / 2835.0)
_T11 = np.float32(-1382.0 / 155925.0)
_T13 = np.float32(21844.0 / 6081075.0)


@njit(inline=True)
def act_inplace(row, code, tmp, bits):
    """row = f(row) for activation ``code``; ``tmp``/``bits`` are scratch rows as long as ``row``."""
    n = row.shape[0]
    if code == SIGMOID:
        for j in range(n):
            tmp[j] = -row[j]
        exp_inplace(tmp[:n], bits)
        for j in range(n):
            row[j] = _ONE / (_ONE + tmp[j])
    elif code == TANH:
        for j in range(n):
            tmp[j] = -_TWO * abs(row[j])
        exp_inplace(tmp[:n], bits)
        for j in range(n):
            x = row[j]
            e = tmp[j]
            big = (_ONE - e) / (_ONE + e)
            x2 = x * x
            small = x * (_ONE + x2 * (_T3 + x2 * (_T5 + x2 * (_T7 + x2 * (_T9 + x2 * (
                _T11 + x2 * _T13))))))
            row[j] = small if abs(x) < _TANH_SMALL else (big if x >= _ZERO else -big)
    elif code == RELU:
        for j in range(n):
            x = row[j]
            row[j] = x if not x < _ZERO else _ZERO
    elif code == HARD_SIGMOID:
        for j in range(n):
            v = row[j] + _THREE
            v = _ZERO if v < _ZERO else v
            v = _SIX if v > _SIX else v
            row[j] = v * _INV6


@njit(inline=True)
def _gemv(h_k, w_kn, out_n):
    """out = h @ w, four rows of w per pass over out (single-threaded, vectorized)."""
    k_len, n = w_kn.shape
    for j in range(n):
        out_n[j] = _ZERO
    k = 0
    while k + 4 <= k_len:
        h0, h1, h2, h3 = h_k[k], h_k[k + 1], h_k[k + 2], h_k[k + 3]
        w0, w1, w2, w3 = w_kn[k], w_kn[k + 1], w_kn[k + 2], w_kn[k + 3]
        for j in range(n):
            out_n[j] += h0 * w0[j] + h1 * w1[j] + h2 * w2[j] + h3 * w3[j]
        k += 4
    while k < k_len:
        hk = h_k[k]
        wk = w_kn[k]
        for j in range(n):
            out_n[j] += hk * wk[j]
        k += 1


@njit(inline=True)
def _matmul(a_bk, w_kn, out_bn):
    """out = a @ w: our own gemv at batch 1, BLAS sgemm otherwise."""
    if a_bk.shape[0] == 1:
        _gemv(a_bk[0], w_kn, out_bn[0])
    else:
        np.dot(a_bk, w_kn, out_bn)


@njit(inline=True)
def _emit(ts, b, valid, zero_masked, h_row, last_bp, y_btp):
    """Outputs of one sample at step ts: the carried output and, with sequences, y[b, ts]."""
    p = h_row.shape[0]
    if valid:
        for j in range(p):
            last_bp[b, j] = h_row[j]
    if y_btp.shape[1] > 0:
        yr = y_btp[b, ts]
        if valid or not zero_masked:
            for j in range(p):
                yr[j] = last_bp[b, j]
        else:
            for j in range(p):
                yr[j] = _ZERO


_SIG_COMMON = "uint8[:, ::1], boolean, boolean, int64, int64, float32[:, :, ::1], float32[:, ::1]"


@njit(signatures=("void(float32[:, :, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], "
                  "float32[:, ::1], " + _SIG_COMMON + ", float32[:, ::1], float32[:, ::1], "
                  "float32[:, ::1], float32[::1], int32[::1])",))
def lstm_loop(xw_btg, w_hg, w_hp, h_bp, c_bh, mask_tb, reverse, zero_masked, act, ract, y_btp,
              last_bp, gates_bg, hfull_bh, hproj_bp, tmp, bits):
    """[i f g o] = xw[t] + h w_hg; c = ract(f) c + ract(i) act(g); h = (ract(o) act(c)) w_hp."""
    batch, t_len, _ = xw_btg.shape
    units = c_bh.shape[1]
    has_mask = mask_tb.shape[0] > 0
    has_proj = w_hp.shape[0] > 0
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        _matmul(h_bp, w_hg, gates_bg)
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            if not valid:
                continue
            g = gates_bg[b]
            xr = xw_btg[b, ts]
            for j in range(4 * units):
                g[j] += xr[j]
            act_inplace(g[:2 * units], ract, tmp, bits)
            act_inplace(g[2 * units:3 * units], act, tmp, bits)
            act_inplace(g[3 * units:], ract, tmp, bits)
            cr = c_bh[b]
            hr = hfull_bh[b]
            for j in range(units):
                cn = g[units + j] * cr[j] + g[j] * g[2 * units + j]
                cr[j] = cn
                hr[j] = cn
            act_inplace(hr, act, tmp, bits)
            for j in range(units):
                hr[j] *= g[3 * units + j]
            if not has_proj:
                for j in range(units):
                    h_bp[b, j] = hr[j]
        if has_proj:
            _matmul(hfull_bh, w_hp, hproj_bp)
            for b in range(batch):
                if (not has_mask) or mask_tb[ts, b] != 0:
                    for j in range(h_bp.shape[1]):
                        h_bp[b, j] = hproj_bp[b, j]
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            _emit(ts, b, valid, zero_masked, h_bp[b], last_bp, y_btp)


@njit(signatures=("void(float32[:, :, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
                  "float32[:, ::1], " + _SIG_COMMON + ", float32[:, ::1], float32[:, ::1], "
                  "float32[:, ::1], float32[::1], int32[::1])",))
def gru_loop(xw_btg, w_hg, w_hn, b_hg, h_bh, mask_tb, reverse, zero_masked, act, ract, y_bth,
             last_bh, rec_bg, rh_bh, cand_bh, tmp, bits):
    """z, r = ract(xw + h u + b_hg); cand = act(xw_h + r (h u_h + b_hh)) (reset_after) or
    act(xw_h + (r h) w_hn); h = z h + (1 - z) cand.

    reset_after: ``w_hn`` is empty and ``w_hg``/``rec_bg`` hold the 3 blocks; otherwise they hold
    z and r (2 blocks) and ``w_hn`` the candidate block. An empty ``b_hg`` means no recurrent bias.
    """
    batch, t_len, _ = xw_btg.shape
    units = h_bh.shape[1]
    has_mask = mask_tb.shape[0] > 0
    reset_after = w_hn.shape[0] == 0
    has_bias = b_hg.shape[0] > 0
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        _matmul(h_bh, w_hg, rec_bg)
        for b in range(batch):
            if has_mask and mask_tb[ts, b] == 0:
                continue
            g = rec_bg[b]
            xr = xw_btg[b, ts]
            if has_bias:
                for j in range(g.shape[0]):
                    g[j] += b_hg[j]
            for j in range(2 * units):
                g[j] += xr[j]
            act_inplace(g[:2 * units], ract, tmp, bits)
            cr = cand_bh[b]
            if reset_after:
                for j in range(units):
                    cr[j] = xr[2 * units + j] + g[units + j] * g[2 * units + j]
            else:
                for j in range(units):
                    rh_bh[b, j] = g[units + j] * h_bh[b, j]
        if not reset_after:
            _matmul(rh_bh, w_hn, cand_bh)
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            if valid:
                g = rec_bg[b]
                cr = cand_bh[b]
                if not reset_after:
                    xr = xw_btg[b, ts]
                    for j in range(units):
                        cr[j] += xr[2 * units + j]
                act_inplace(cr, act, tmp, bits)
                hr = h_bh[b]
                for j in range(units):
                    z = g[j]
                    hr[j] = z * hr[j] + (_ONE - z) * cr[j]
            _emit(ts, b, valid, zero_masked, h_bh[b], last_bh, y_bth)


@njit(signatures=("void(float32[:, :, ::1], float32[:, ::1], float32[:, ::1], " + _SIG_COMMON
                  + ", float32[:, ::1], float32[::1], int32[::1])",))
def rnn_loop(xw_bth, w_hh, h_bh, mask_tb, reverse, zero_masked, act, ract, y_bth, last_bh, rec_bh,
             tmp, bits):
    """h = act(xw[t] + h w_hh) (``ract`` unused, kept for a uniform signature)."""
    batch, t_len, units = xw_bth.shape
    has_mask = mask_tb.shape[0] > 0
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        _matmul(h_bh, w_hh, rec_bh)
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            if valid:
                g = rec_bh[b]
                xr = xw_bth[b, ts]
                for j in range(units):
                    g[j] += xr[j]
                act_inplace(g, act, tmp, bits)
                for j in range(units):
                    h_bh[b, j] = g[j]
            _emit(ts, b, valid, zero_masked, h_bh[b], last_bh, y_bth)


@njit(signatures=("void(float32[:, ::1], float32[:, ::1], float32[::1], float32[:, ::1])",))
def input_projection(x_ni, w_ig, b_g, out_ng):
    """out = x @ w_ig + b_g (all timesteps at once; an empty ``b_g`` adds nothing).

    Compiled so that the GEMM runs in the same BLAS library as the time loops' products (Numba
    calls scipy's OpenBLAS, numpy has its own): two libraries' spinning thread pools would
    compete for the cores right when the loop starts.
    """
    np.dot(x_ni, w_ig, out_ng)
    if b_g.shape[0] > 0:
        for r in range(out_ng.shape[0]):
            row = out_ng[r]
            for j in range(row.shape[0]):
                row[j] += b_g[j]
