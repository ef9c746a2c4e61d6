"""A whole Transformer encoder layer in one compiled call (``CpuOps.encoder_layer``).

Run as separate primitives, a small layer (BERT-tiny: 128 tokens, d 128) spent about a sixth of
its time between kernels: eight product calls, two attention calls, four layer norms and the
residual adds, each a Python call and most a parallel region of its own. Here each share of
Numba's threads runs its rows through the q/k/v projection, meets the others at a barrier
(attention needs every key), runs its (batch, head) pairs, meets them again and then takes its
rows through the output projection, residual add, norm and feed-forward without another
meeting: everything after attention is row by row.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import prange

from .._jit import njit, warm_call
from ..derived import derived_from
from ..reference import EncoderWeights
from . import _blas, _elementwise
from ._blas import TILE_ROWS
from ._attention import attention_pair
from ._gemm import PACKED_MIN_ROWS, _rows_product, packed_weights
from ._rows import layer_norm_rows
from ._sync import aborted, barrier, barrier_safe

_LINEAR = _elementwise.LINEAR
_ZERO = np.float32(0.0)
_EMPTY = np.zeros(0, np.float32)
_EMPTY4 = np.zeros((0, 0, 0, 0), np.float32)
#: Floats of the hidden rows one block of the post-attention part holds (512 KiB, half of L2):
#: the block's rows go through the output projection, norm, feed-forward pair and last norm
#: while its hidden rows stay in L2 (all of a share's rows at once: 2 MiB of hidden rows
#: written to L3 and read back; 2-3 % of the d 256 layer).
HIDDEN_BLOCK_FLOATS = 1 << 17


@njit(inline=True)
def _add_rows(y, r):
    """y += r (rows of equal shape)."""
    for i in range(y.shape[0]):
        yr, rr = y[i], r[i]
        for j in range(y.shape[1]):
            yr[j] += rr[j]


@njit()
def _encoder_share(fn, pfn, afn, x, w_qkv, pb_qkv, b_qkv, w_o, pb_o, b_o, w_1, pb_1, b_1, w_2,
                   pb_2, b_2, g1, be1, eps1, g2, be2, eps2, code, heads, seqlen, bias, empty,
                   norm_first, buffer_floats, row_block, bufs, p, parts, sync):
    """Share ``p`` of ``parts`` of one encoder layer on ``x`` (rows of N sequences of
    ``seqlen``): rows m p / parts onward through the projections, pairs N H p / parts onward
    through attention (ReferenceOps.encoder_layer gives the math), then its rows in blocks of
    ``row_block`` through the rest. ``bufs``: (q|k|v (m, 3e), normed input, attention output,
    post-attention rows (m, e) each, hidden (m, f: each block reuses the share's first rows),
    out (m, e), weights (N, H, L, L))."""
    qkv, xn, att, y, hid, out, s = bufs
    m, e = x.shape
    r0, r1 = m * p // parts, m * (p + 1) // parts
    src = x
    if norm_first:
        layer_norm_rows(x[r0:r1], g1, be1, eps1, False, xn[r0:r1])
        src = xn
    if r1 > r0:
        _rows_product(fn, pfn, src[r0:r1], w_qkv, pb_qkv, qkv[r0:r1], b_qkv, _LINEAR, _ZERO)
    if not barrier(sync, parts, 1):
        return
    hd = e // heads
    scale = np.float32(1.0 / math.sqrt(hd))
    pairs = (m // seqlen) * heads
    pb = np.empty(buffer_floats, np.float32)
    for bhi in range(pairs * p // parts, pairs * (p + 1) // parts):
        b, h = bhi // heads, bhi % heads
        rows = qkv[b * seqlen:(b + 1) * seqlen]
        c = h * hd
        attention_pair(afn, rows[:, c:c + hd], rows[:, e + c:e + c + hd],
                       rows[:, 2 * e + c:2 * e + c + hd], scale, bias, b, h, 0, empty,
                       np.uintp(s[b, h].ctypes.data), s.strides[2] // 4,
                       att[b * seqlen:(b + 1) * seqlen, c:c + hd], pb)
    if not barrier(sync, parts, 2):
        return
    for b0 in range(r0, r1, row_block):
        b1 = min(b0 + row_block, r1)
        yr, hr, outr = y[b0:b1], hid[r0:r0 + b1 - b0], out[b0:b1]
        _rows_product(fn, pfn, att[b0:b1], w_o, pb_o, yr, b_o, _LINEAR, _ZERO)
        _add_rows(yr, x[b0:b1])
        if norm_first:
            layer_norm_rows(yr, g2, be2, eps2, False, xn[b0:b1])
            _rows_product(fn, pfn, xn[b0:b1], w_1, pb_1, hr, b_1, code, _ZERO)
        else:
            layer_norm_rows(yr, g1, be1, eps1, False, yr)
            _rows_product(fn, pfn, yr, w_1, pb_1, hr, b_1, code, _ZERO)
        _rows_product(fn, pfn, hr, w_2, pb_2, outr, b_2, _LINEAR, _ZERO)
        _add_rows(outr, yr)
        if not norm_first:
            layer_norm_rows(outr, g2, be2, eps2, False, outr)


@njit()
def encoder_layer(fn, pfn, afn, x, w_qkv, pb_qkv, b_qkv, w_o, pb_o, b_o, w_1, pb_1, b_1, w_2,
                  pb_2, b_2, g1, be1, eps1, g2, be2, eps2, code, heads, seqlen, bias, empty,
                  norm_first, buffer_floats, row_block, bufs, sync):
    """One encoder layer in the calling thread, its result in ``bufs[5]`` and weights in
    ``bufs[6]``. ``fn``: ``_blas.SGEMM``; ``pfn``: ``_blas.PACKED`` (weights packed in
    ``pb_*``) or None; ``afn``: ``_blas.ATTENTION``; empty ``b_*``/``g*``/``be*``: none."""
    _encoder_share(fn, pfn, afn, x, w_qkv, pb_qkv, b_qkv, w_o, pb_o, b_o, w_1, pb_1, b_1, w_2,
                   pb_2, b_2, g1, be1, eps1, g2, be2, eps2, code, heads, seqlen, bias, empty,
                   norm_first, buffer_floats, row_block, bufs, 0, 1, sync)


@njit(parallel=True)
def encoder_layer_par(fn, pfn, afn, x, w_qkv, pb_qkv, b_qkv, w_o, pb_o, b_o, w_1, pb_1, b_1, w_2,
                      pb_2, b_2, g1, be1, eps1, g2, be2, eps2, code, heads, seqlen, bias, empty,
                      norm_first, buffer_floats, row_block, bufs, parts, sync):
    """``encoder_layer`` in ``parts`` shares meeting twice at a barrier (``sync``: zeros(2));
    when a share gave up waiting (``_sync.aborted``) the result is incomplete."""
    for p in prange(parts):
        _encoder_share(fn, pfn, afn, x, w_qkv, pb_qkv, b_qkv, w_o, pb_o, b_o, w_1, pb_1, b_1,
                       w_2, pb_2, b_2, g1, be1, eps1, g2, be2, eps2, code, heads, seqlen, bias,
                       empty, norm_first, buffer_floats, row_block, bufs, p, parts, sync)


_local = threading.local()


def _scratch(floats):
    """A float32 buffer of at least ``floats`` for the calling Python thread, kept between its
    calls (it grows to the largest layer the thread ran)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < floats:
        buf = _local.buf = np.empty(floats, np.float32)
    return buf


def _weight_args(w):
    """(the four product weights C-ordered, packed for ``_blas.PACKED`` (empty without it),
    the biases and norm parameters as float32 vectors, empty for None)."""
    weights = [np.ascontiguousarray(a) for a in (w.w_qkv_io, w.w_o_io, w.w_1_io, w.w_2_io)]
    packed = [_EMPTY if _blas.PACKED is None else packed_weights(a) for a in weights]
    vec = [_EMPTY if a is None else np.ascontiguousarray(a, np.float32)
           for a in (w.b_qkv, w.b_o, w.b_1, w.b_2, *w.norm1[:2], *w.norm2[:2])]
    return weights, packed, vec


def layer_args(x_nle, w, heads, code, norm_first, bias4, empty, need_weights=True):
    """(the drivers' arguments up to ``bufs``, bufs) for ``CpuOps.encoder_layer``'s call:
    float32 ``x_nle`` and weights (``EncoderWeights``), activation ``code``, 4-D ``bias4``.
    The intermediates (and the weights unless ``need_weights``) live in the thread's scratch
    buffer: fresh ones for the bench's big layer (13 MB) cost it a quarter of its time in page
    faults, glibc mapping and unmapping each."""
    n, length, e = x_nle.shape
    m, f, f32 = n * length, w.w_1_io.shape[1], np.float32
    x = np.ascontiguousarray(x_nle).reshape(m, e)
    weights, packed, vec = derived_from(
        (w.w_qkv_io, w.b_qkv, w.w_o_io, w.b_o, w.w_1_io, w.b_1, w.w_2_io, w.b_2, *w.norm1,
         *w.norm2), "encoder-layer", lambda *_: _weight_args(w))
    pfn = _blas.PACKED if m >= PACKED_MIN_ROWS else None
    if pfn is None:
        packed = [_EMPTY] * 4
    args = (_blas.SGEMM, pfn, _blas.ATTENTION, x, weights[0], packed[0], vec[0], weights[1],
            packed[1], vec[1], weights[2], packed[2], vec[2], weights[3], packed[3], vec[3],
            vec[4], vec[5], f32(w.norm1[2]), vec[6], vec[7], f32(w.norm2[2]), code, heads,
            length, bias4, int(empty), bool(norm_first),
            _blas.attention_buffer_floats(length, length, e // heads, e // heads),
            max(1, HIDDEN_BLOCK_FLOATS // f // TILE_ROWS) * TILE_ROWS)
    shapes = [(m, 3 * e), (m, e), (m, e), (m, e), (m, f)]
    s_shape = (n, heads, length, length)
    if not need_weights:
        shapes.append(s_shape)
    scratch = _scratch(sum(math.prod(shape) for shape in shapes))
    bufs, at = [], 0
    for shape in shapes:
        bufs.append(scratch[at:at + math.prod(shape)].reshape(shape))
        at += math.prod(shape)
    s = bufs.pop() if not need_weights else np.empty(s_shape, f32)
    return args, (*bufs, np.empty((m, e), f32), s)


def run(args, bufs, parts):
    """The layer into ``bufs`` in ``parts`` shares, or serially (one share, a threading layer
    that cannot keep a barrier, or a share that gave up waiting)."""
    sync = np.zeros(2, np.int64)
    if parts > 1 and barrier_safe():
        encoder_layer_par(*args, bufs, parts, sync)
        if not aborted(sync):
            return
        sync[:] = 0
    encoder_layer(*args, bufs, sync)


@warm_call
def warm_encoder():
    """Compile the layer drivers (``warmup``) on an 8-row layer, serial and in two shares:
    their ctypes arguments have no signature string."""
    if _blas.ATTENTION is None or _blas.SGEMM is None:
        return
    e, f = 4, 8
    w = EncoderWeights(*(np.ones(shape, np.float32) for shape in
                         ((e, 3 * e), (3 * e,), (e, e), (e,), (e, f), (f,), (f, e), (e,))),
                       (None, None, 1e-5), (None, None, 1e-5))
    args, bufs = layer_args(np.ones((1, 8, e), np.float32), w, 2, _LINEAR, False, _EMPTY4, 0)
    run(args, bufs, 1)
    run(args, bufs, 2)
