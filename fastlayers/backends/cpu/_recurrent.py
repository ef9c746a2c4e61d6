"""Compiled time loops of the recurrent layers (SimpleRNN, LSTM, GRU) and their gate math.

The primitive (``recurrent.py``) computes the input projection of all timesteps as one GEMM,
``xw[t B + b] = x[b, t] @ w_ig + b_g`` (batch shares on the packed sgemm compute their rows of
it themselves: ``_project_share``), and each loop reads step t's row of sample b as
``xw_rg[xrow_tb[t, b]]``: xrow is t B + b there, the ids themselves where the inputs are one-hot
rows of a table (an embedding folded into the layer: the loop reads the folded table's rows in
place, and nothing is gathered). Each loop is split into shares of units (``*_share(..., p)``):
share p owns units u0:u1 and the matching columns of every gate block, packed side by side in
``w_p..[p]``, and runs the whole sequence: per step one recurrent product (the gemv ``_gemv``
at batch 1, else fastlayers' sgemm on the share's weights packed once, or single-threaded sgemm
calls through numpy's CBLAS: ``_blas``), one fused pass over its gates (activations, cell
update, masking, outputs), then a barrier (``_sync``) after which every share reads the full
new state. The state alternates between hbuf[0] and hbuf[1]. ``*_one`` runs one share (the
whole layer) serially, ``*_all`` all of them in one parallel region. No Python runs per
timestep.

Activation codes: 0 tanh, 1 sigmoid, 2 relu, 3 linear, 4 hard_sigmoid (relu6(x + 3) / 6).
sigmoid and tanh use the vectorized ``exp_inplace``; tanh uses its odd Taylor series below
|x| < 0.4 (where (1 - e^-2|x|) / (1 + e^-2|x|) loses relative precision to cancellation).
Outputs ``y`` are (batch, time, out) ((batch, 0, out) when only the last output is wanted).
Masks are uint8 (time, batch), 1 = valid step; an empty (0, 0) mask means every step is valid.
"""

from __future__ import annotations

import numpy as np

from numba import prange, types
from numba.extending import overload

from .._jit import FASTMATH, njit
from ._blas import packed, sgemm
from ._sync import barrier
from ._vexp import exp_inplace

TANH, SIGMOID, RELU, LINEAR, HARD_SIGMOID = 0, 1, 2, 3, 4
CODES = {"tanh": TANH, "sigmoid": SIGMOID, "relu": RELU, "linear": LINEAR,
         "hard_sigmoid": HARD_SIGMOID}

_P0 = np.int64(0)
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


#: Largest m * n * k of one sgemm call in the recurrent products: OpenBLAS multiplies products
#: up to about this size without packing the operands (its small-matrix kernels), which made a
#: (32, 256) @ (256, 1024) step 1.7x faster in blocks of 64 columns than in one call
#: (docs/design.md, "Recurrent loops").
SMALL_GEMM = 1 << 19


def _product(fn, a_bk, w_kn, pw, out_bn):
    """out[:, :n] = a @ w (n = w's columns): the gemv above at batch 1, else one call of
    fastlayers' sgemm on ``pw`` (w packed, ``fn`` ``_blas.PACKED``) or single-threaded sgemm calls
    through ``fn`` (``_blas.SGEMM``); without sgemm (``fn`` None) the gemv per row."""
    np.matmul(a_bk, w_kn, out=out_bn[:, :w_kn.shape[1]])


def _is_packed(fn):
    """``fn`` is ``_blas.PACKED`` (9 arguments), not a CBLAS sgemm (14)."""
    return isinstance(fn, types.ExternalFunctionPointer) and len(fn.sig.args) == 9


@overload(_product, jit_options={"fastmath": FASTMATH, "nogil": True})
def _product_impl(fn, a_bk, w_kn, pw, out_bn):
    if isinstance(fn, types.NoneType):
        def product(fn, a_bk, w_kn, pw, out_bn):
            for b in range(a_bk.shape[0]):
                _gemv(a_bk[b], w_kn, out_bn[b])
    elif _is_packed(fn):
        def product(fn, a_bk, w_kn, pw, out_bn):
            if a_bk.shape[0] == 1:
                _gemv(a_bk[0], w_kn, out_bn[0])
            else:
                packed(fn, a_bk, pw, out_bn[:, :w_kn.shape[1]], 0.0)
    else:
        def product(fn, a_bk, w_kn, pw, out_bn):
            m, k = a_bk.shape
            n = w_kn.shape[1]
            if m == 1:
                _gemv(a_bk[0], w_kn, out_bn[0])
            elif m * k * 32 > SMALL_GEMM:
                sgemm(fn, a_bk, w_kn, out_bn[:, :n], False, 0.0)
            else:
                step = 32
                while 2 * step * m * k <= SMALL_GEMM and step < n:
                    step *= 2
                for c0 in range(0, n, step):
                    c1 = min(n, c0 + step)
                    sgemm(fn, a_bk, w_kn[:, c0:c1], out_bn[:, c0:c1], False, 0.0)
    return product


def _project_share(fn, x_rti, pw_ig, b_g, xw_trg):
    """A batch share's input projection, xw[t, r] = x[r, t] @ w_ig + b_g, one product of T rows
    per sample on the packed ``pw_ig`` (``fn`` ``_blas.PACKED``; nothing to do for an empty
    ``pw_ig``: the caller projected already, as it does for any other ``fn``)."""
    raise NotImplementedError("_project_share runs only inside compiled kernels")


@overload(_project_share, jit_options={"fastmath": FASTMATH, "nogil": True})
def _project_share_impl(fn, x_rti, pw_ig, b_g, xw_trg):
    if _is_packed(fn):
        def project(fn, x_rti, pw_ig, b_g, xw_trg):
            if pw_ig.shape[0] > 0:
                for r in range(x_rti.shape[0]):
                    packed(fn, x_rti[r], pw_ig, xw_trg[:, r], 0.0)
                    if b_g.shape[0] > 0:
                        for t in range(xw_trg.shape[0]):
                            _add_to(xw_trg[t, r], b_g)      # a C-contiguous row: vectorized
    else:
        def project(fn, x_rti, pw_ig, b_g, xw_trg):
            pass
    return project


@njit(inline=True)
def _source(fn, xw_srg, xrow_ptb, x_prti, pw_ig, b_g, p):
    """The rows batch share ``p`` reads its input projection from (the rows ``xrow_ptb[p]``
    names per step and sample): its own ``xw_srg[p]``, into which it first projects its inputs
    where ``pw_ig`` is not empty (``_project_share``), or a table all shares read (``xw_srg`` of
    length 1: a folded embedding's, read by the ids in ``xrow_ptb``)."""
    xs = xw_srg[p] if xw_srg.shape[0] > 1 else xw_srg[0]
    if pw_ig.shape[0] > 0:
        t_len, rows = xrow_ptb.shape[1:]
        _project_share(fn, x_prti[p], pw_ig, b_g, xs.reshape((t_len, rows, xs.shape[1])))
    return xs


@njit(inline=True)
def _add_blocks(g, src, blocks, n, width, u0):
    """g[k n + j] += src[k width + u0 + j] for k < blocks, j < n: a share's columns of each gate
    block of a full-width row (``src``) added to its packed gates (``g``)."""
    for k in range(blocks):
        _add_to(g[k * n:(k + 1) * n], src[k * width + u0:k * width + u0 + n])


@njit(inline=True)
def _add_to(dst, src):
    """dst += src. Loops here index slices from 0 (``range(n)``): an index such as u0 + j, whose
    sign Numba cannot prove, is wrapped per element and kept the loop from vectorizing (the
    LSTM's gate pass took 50 us per batch-32 step instead of 15; docs/design.md)."""
    for j in range(dst.shape[0]):
        dst[j] += src[j]


@njit(inline=True)
def _copy_to(dst, src):
    """dst = src (see ``_add_to``)."""
    for j in range(dst.shape[0]):
        dst[j] = src[j]


@njit(inline=True)
def _emit(ts, b, valid, zero_masked, h_row, c0, c1, last_bp, y_btp):
    """Outputs of sample ``b`` at step ``ts`` in columns c0:c1: the carried output and, with
    sequences, y[b, ts]."""
    last = last_bp[b, c0:c1]
    if valid:
        _copy_to(last, h_row[c0:c1])
    if y_btp.shape[1] > 0:
        yr = y_btp[b, ts, c0:c1]
        if valid or not zero_masked:
            _copy_to(yr, last)
        else:
            yr[:] = _ZERO


@njit(inline=True)
def _carry(cur_bh, nxt_bh, b, c0, c1):
    """A masked step keeps sample ``b``'s state: nxt[b, c0:c1] = cur[b, c0:c1]."""
    _copy_to(nxt_bh[b, c0:c1], cur_bh[b, c0:c1])


@njit(inline=True)
def _lstm_row(g, xw_row, n, units, u0, cr, hr, act, ract, tmp, bits):
    """One row of an LSTM step, units u0:u0 + n: [i f g o] = g + xw_row's blocks (``units``
    apart); c = ract(f) c + ract(i) act(g); h = ract(o) act(c), into ``cr`` and ``hr``: one
    vectorized pass per activation through the scratch rows (a fused pass in C was slower on
    the project's Zen 5 host: docs/design.md)."""
    _add_blocks(g, xw_row, 4, n, units, u0)
    act_inplace(g[:2 * n], ract, tmp, bits)
    act_inplace(g[2 * n:3 * n], act, tmp, bits)
    act_inplace(g[3 * n:4 * n], ract, tmp, bits)
    gi, gf, gg, go = g[:n], g[n:2 * n], g[2 * n:3 * n], g[3 * n:4 * n]
    for j in range(n):
        cn = gf[j] * cr[j] + gi[j] * gg[j]
        cr[j] = cn
        hr[j] = cn
    act_inplace(hr, act, tmp, bits)
    for j in range(n):
        hr[j] *= go[j]


@njit()
def lstm_share(fn, xw_rg, xrow_tb, w_pkg, pw_pg, wp_pkq, pwp_pq, hbuf_2bp, hfull_bh, c_bh,
               mask_tb, reverse, zero_masked, act, ract, y_btp, last_bp, gates_pbg, proj_pbq,
               tmp_pg, bits_pg, ubounds, qbounds, sync, p):
    """Share ``p`` of the LSTM loop, units u0:u1 = ubounds[p:p + 2]: [i f g o] = xw[t] + h w_hg;
    c = ract(f) c + ract(i) act(g); h = (ract(o) act(c)) w_hp (outputs qbounds[p:p + 2]); the
    gate pass per row through ``_lstm_row``.

    ``w_pkg[p]`` holds the share's columns of the 4 gate blocks side by side (``pw_pg[p]`` the
    same packed for ``_blas.PACKED``, ``pwp_pq`` likewise for ``wp_pkq``); ``hbuf`` is the
    state of even and odd steps (step s reads hbuf[s % 2], writes hbuf[(s + 1) % 2]).
    """
    t_len, batch = xrow_tb.shape
    units = c_bh.shape[1]
    parts = ubounds.shape[0] - 1
    u0 = ubounds[p]
    n = ubounds[p + 1] - u0
    has_proj = wp_pkq.shape[0] > 0
    q0, q1 = (qbounds[p], qbounds[p + 1]) if has_proj else (u0, u0 + n)
    has_mask = mask_tb.shape[0] > 0
    gates, tmp, bits = gates_pbg[p], tmp_pg[p], bits_pg[p]
    met = 0
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        cur, nxt = hbuf_2bp[s % 2], hbuf_2bp[(s + 1) % 2]
        _product(fn, cur, w_pkg[p], pw_pg[p], gates)
        for b in range(batch):
            if has_mask and mask_tb[ts, b] == 0:
                if not has_proj:
                    _carry(cur, nxt, b, u0, u0 + n)
                continue
            cr = c_bh[b, u0:u0 + n]
            hr = (hfull_bh[b] if has_proj else nxt[b])[u0:u0 + n]
            _lstm_row(gates[b], xw_rg[xrow_tb[ts, b]], n, units, u0, cr, hr, act, ract, tmp, bits)
        if has_proj:
            met += 1
            if not barrier(sync, parts, met):
                return
            proj = proj_pbq[p]
            _product(fn, hfull_bh, wp_pkq[p], pwp_pq[p], proj)
            for b in range(batch):
                if has_mask and mask_tb[ts, b] == 0:
                    _carry(cur, nxt, b, q0, q1)
                else:
                    _copy_to(nxt[b, q0:q1], proj[b, :q1 - q0])
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            _emit(ts, b, valid, zero_masked, nxt[b], q0, q1, last_bp, y_btp)
        met += 1
        if not barrier(sync, parts, met):
            return


@njit()
def gru_share(fn, xw_rg, xrow_tb, w_pkg, pw_pg, wn_pkn, pwn_pn, b_hg, hbuf_2bh, rh_bh, mask_tb,
              reverse, zero_masked, act, ract, y_bth, last_bh, gates_pbg, cand_pbn, tmp_pg,
              bits_pg, ubounds, sync, p):
    """Share ``p`` of the GRU loop, units u0:u1 = ubounds[p:p + 2]: z, r = ract(xw + h u + b_hg);
    cand = act(xw_h + r (h u_h + b_hh)) (reset_after) or act(xw_h + (r h) w_hn);
    h = z h + (1 - z) cand.

    reset_after: ``wn_pkn`` is empty and ``w_pkg[p]`` holds the share's columns of the 3 blocks;
    otherwise of z and r, and ``wn_pkn[p]`` its candidate columns (a second barrier per step:
    r h must be complete first); ``pw_pg``/``pwn_pn`` hold them packed for ``_blas.PACKED``. An
    empty ``b_hg`` means no recurrent bias.
    """
    t_len, batch = xrow_tb.shape
    units = hbuf_2bh.shape[2]
    parts = ubounds.shape[0] - 1
    u0 = ubounds[p]
    n = ubounds[p + 1] - u0
    has_mask = mask_tb.shape[0] > 0
    reset_after = wn_pkn.shape[0] == 0
    has_bias = b_hg.shape[0] > 0
    gates, cand, tmp, bits = gates_pbg[p], cand_pbn[p], tmp_pg[p], bits_pg[p]
    met = 0
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        cur, nxt = hbuf_2bh[s % 2], hbuf_2bh[(s + 1) % 2]
        _product(fn, cur, w_pkg[p], pw_pg[p], gates)
        for b in range(batch):
            if has_mask and mask_tb[ts, b] == 0:
                continue
            g = gates[b]
            xr = xw_rg[xrow_tb[ts, b]]
            if has_bias:
                _add_blocks(g, b_hg, 3 if reset_after else 2, n, units, u0)
            _add_blocks(g, xr, 2, n, units, u0)
            act_inplace(g[:2 * n], ract, tmp, bits)
            gr = g[n:2 * n]
            if reset_after:
                cr, xh, hh = cand[b, :n], xr[2 * units + u0:2 * units + u0 + n], g[2 * n:3 * n]
                for j in range(n):
                    cr[j] = xh[j] + gr[j] * hh[j]
            else:
                rh, hr = rh_bh[b, u0:u0 + n], cur[b, u0:u0 + n]
                for j in range(n):
                    rh[j] = gr[j] * hr[j]
        if not reset_after:
            met += 1
            if not barrier(sync, parts, met):
                return
            _product(fn, rh_bh, wn_pkn[p], pwn_pn[p], cand)
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            if valid:
                g = gates[b]
                cr = cand[b, :n]
                if not reset_after:
                    _add_to(cr, xw_rg[xrow_tb[ts, b], 2 * units + u0:2 * units + u0 + n])
                act_inplace(cr, act, tmp, bits)
                hn, hc = nxt[b, u0:u0 + n], cur[b, u0:u0 + n]
                for j in range(n):
                    z = g[j]
                    hn[j] = z * hc[j] + (_ONE - z) * cr[j]
            else:
                _carry(cur, nxt, b, u0, u0 + n)
            _emit(ts, b, valid, zero_masked, nxt[b], u0, u0 + n, last_bh, y_bth)
        met += 1
        if not barrier(sync, parts, met):
            return


@njit()
def rnn_share(fn, xw_rh, xrow_tb, w_pkh, pw_ph, hbuf_2bh, mask_tb, reverse, zero_masked, act,
              y_bth, last_bh, gates_pbh, tmp_ph, bits_ph, ubounds, sync, p):
    """Share ``p`` of the SimpleRNN loop, units u0:u1 = ubounds[p:p + 2]: h = act(xw[t] + h w_hh)
    (``pw_ph[p]``: ``w_pkh[p]`` packed for ``_blas.PACKED``)."""
    t_len, batch = xrow_tb.shape
    units = hbuf_2bh.shape[2]
    parts = ubounds.shape[0] - 1
    u0 = ubounds[p]
    n = ubounds[p + 1] - u0
    has_mask = mask_tb.shape[0] > 0
    gates, tmp, bits = gates_pbh[p], tmp_ph[p], bits_ph[p]
    for s in range(t_len):
        ts = t_len - 1 - s if reverse else s
        cur, nxt = hbuf_2bh[s % 2], hbuf_2bh[(s + 1) % 2]
        _product(fn, cur, w_pkh[p], pw_ph[p], gates)
        for b in range(batch):
            valid = (not has_mask) or mask_tb[ts, b] != 0
            if valid:
                g = gates[b]
                _add_blocks(g, xw_rh[xrow_tb[ts, b]], 1, n, units, u0)
                act_inplace(g[:n], act, tmp, bits)
                _copy_to(nxt[b, u0:u0 + n], g[:n])
            else:
                _carry(cur, nxt, b, u0, u0 + n)
            _emit(ts, b, valid, zero_masked, nxt[b], u0, u0 + n, last_bh, y_bth)
        if not barrier(sync, parts, s + 1):
            return


# One share (serially) or all of them at once (one parallel region), each loop with ``args`` its
# arguments between ``fn`` and ``p``; Numba cannot cache a kernel that takes another kernel as
# argument. ``fn`` stays outside the tuple: Numba types a tuple holding a ctypes function in
# Python, element by element (about 60 us per call), a tuple of arrays in C.
#
# ``*_rows_*``: shares of the batch instead. Every batch-major argument (inputs, states, masks,
# outputs) is laid out (parts, ...) with share p's rows in its C-contiguous [p], and per-share
# scratch is (parts, ...); share p runs its rows through the whole sequence on all units as a
# single unit share (no barrier). ``*_rows_one`` runs the shares one after the other.
#
# Every driver passes the share index as an int64 (a literal 0, a range or a prange index are
# three different Numba types): one compiled share loop serves them all (three had been
# compiled, about 20 s each with an empty cache).
@njit()
def lstm_one(fn, args):
    lstm_share(fn, *args, _P0)


@njit(parallel=True)
def lstm_all(fn, args, parts):
    for p in prange(parts):
        lstm_share(fn, *args, np.int64(p))


@njit()
def _lstm_rows_share(fn, args, p):
    (xw, xrow, w, pw, wp, pwp, hbuf, hfull, c, mask, reverse, zero_masked, act, ract, y, last,
     gates, proj, tmp, bits, ub, qb, sync, x, pw_i, b_i) = args
    xs = _source(fn, xw, xrow, x, pw_i, b_i, p)
    lstm_share(fn, xs, xrow[p], w, pw, wp, pwp, hbuf[p], hfull[p], c[p], mask[p], reverse,
               zero_masked, act, ract, y[p], last[p], gates[p:p + 1], proj[p:p + 1],
               tmp[p:p + 1], bits[p:p + 1], ub, qb, sync, _P0)


@njit()
def lstm_rows_one(fn, args, parts):
    for p in range(parts):
        _lstm_rows_share(fn, args, p)


@njit(parallel=True)
def lstm_rows_all(fn, args, parts):
    for p in prange(parts):
        _lstm_rows_share(fn, args, p)


@njit()
def gru_one(fn, args):
    gru_share(fn, *args, _P0)


@njit(parallel=True)
def gru_all(fn, args, parts):
    for p in prange(parts):
        gru_share(fn, *args, np.int64(p))


@njit()
def _gru_rows_share(fn, args, p):
    (xw, xrow, w, pw, wn, pwn, b_hg, hbuf, rh, mask, reverse, zero_masked, act, ract, y, last,
     gates, cand, tmp, bits, ub, sync, x, pw_i, b_i) = args
    xs = _source(fn, xw, xrow, x, pw_i, b_i, p)
    gru_share(fn, xs, xrow[p], w, pw, wn, pwn, b_hg, hbuf[p], rh[p], mask[p], reverse, zero_masked,
              act, ract, y[p], last[p], gates[p:p + 1], cand[p:p + 1], tmp[p:p + 1],
              bits[p:p + 1], ub, sync, _P0)


@njit()
def gru_rows_one(fn, args, parts):
    for p in range(parts):
        _gru_rows_share(fn, args, p)


@njit(parallel=True)
def gru_rows_all(fn, args, parts):
    for p in prange(parts):
        _gru_rows_share(fn, args, p)


@njit()
def rnn_one(fn, args):
    rnn_share(fn, *args, _P0)


@njit(parallel=True)
def rnn_all(fn, args, parts):
    for p in prange(parts):
        rnn_share(fn, *args, np.int64(p))


@njit()
def _rnn_rows_share(fn, args, p):
    (xw, xrow, w, pw, hbuf, mask, reverse, zero_masked, act, y, last, gates, tmp, bits, ub, sync,
     x, pw_i, b_i) = args
    xs = _source(fn, xw, xrow, x, pw_i, b_i, p)
    rnn_share(fn, xs, xrow[p], w, pw, hbuf[p], mask[p], reverse, zero_masked, act, y[p], last[p],
              gates[p:p + 1], tmp[p:p + 1], bits[p:p + 1], ub, sync, _P0)


@njit()
def rnn_rows_one(fn, args, parts):
    for p in range(parts):
        _rnn_rows_share(fn, args, p)


@njit(parallel=True)
def rnn_rows_all(fn, args, parts):
    for p in prange(parts):
        _rnn_rows_share(fn, args, p)
