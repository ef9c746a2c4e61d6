"""Winograd F(2x2, 3x3) convolution (3x3 kernel, stride 1, no dilation, one group), NHWC.

Per 2x2 output tile and channel pair, y = A^T [(G g G^T) * (B^T d B)] A with d the 4x4 input
patch (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). Summed over the
input channels, the 16 elementwise products become 16 sgemms V[e] (tiles, C_in) @ U[e] (C_in,
C_out): 2.25x fewer multiplies than im2col + sgemm. The transforms only add, subtract and halve,
so rounding stays at the level of the direct sum (tests compare with the reference at 1e-5).

``conv3x3_f23`` works on a range of tile rows in blocks whose V and M panels fit in the L2 cache,
runs the 16 products on fastlayers' sgemm with each U[e] packed once (``_products``; numpy's
BLAS through Numba's ``np.dot`` without it), one thread each (``conv3x3_f23_par`` shares the
tile rows among Numba's threads), and runs the bias + activation epilogue on each block's output
rows while they are hot.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from numba import types
from numba.extending import overload

from .._jit import FASTMATH, njit
from ._blas import packed
from ._elementwise import bias_act_rows

_ZERO = np.float32(0.0)
_HALF = np.float32(0.5)


@njit(signatures=("void(float32[:, :, :, ::1], float32[:, :, ::1])",))
def weights_f23(w_hwio, u_eio):
    """u[4 a + b, i, o] = (G w[:, :, i, o] G^T)[a, b], G = [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]]."""
    cin, cout = w_hwio.shape[2], w_hwio.shape[3]
    t = np.empty((4, 3, cout), np.float32)
    for i in range(cin):
        for c in range(3):                      # t = G g, column c
            g0, g1, g2 = w_hwio[0, c, i], w_hwio[1, c, i], w_hwio[2, c, i]
            for o in range(cout):
                t[0, c, o] = g0[o]
                t[1, c, o] = _HALF * (g0[o] + g1[o] + g2[o])
                t[2, c, o] = _HALF * (g0[o] - g1[o] + g2[o])
                t[3, c, o] = g2[o]
        for a in range(4):                      # u = t G^T, row a
            t0, t1, t2 = t[a, 0], t[a, 1], t[a, 2]
            u0, u1, u2, u3 = u_eio[4 * a, i], u_eio[4 * a + 1, i], u_eio[4 * a + 2, i], u_eio[4 * a + 3, i]
            for o in range(cout):
                u0[o] = t0[o]
                u1[o] = _HALF * (t0[o] + t1[o] + t2[o])
                u2[o] = _HALF * (t0[o] - t1[o] + t2[o])
                u3[o] = t2[o]


@njit(inline=True)
def _bt4(p0, p1, p2, p3, q0, q1, q2, q3):
    """q = B^T p over the channels, B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]."""
    for c in range(p0.shape[0]):
        a0, a1, a2, a3 = p0[c], p1[c], p2[c], p3[c]
        q0[c] = a0 - a2
        q1[c] = a1 + a2
        q2[c] = a2 - a1
        q3[c] = a1 - a3


@njit(inline=True)
def _at4(m0, m1, m2, m3, y0, y1):
    """(y0, y1) = A^T m over the channels, A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]."""
    for c in range(m0.shape[0]):
        a1, a2 = m1[c], m2[c]
        y0[c] = m0[c] + a1 + a2
        y1[c] = a1 - a2 - m3[c]


@njit(inline=True)
def _input_tiles(x_nhwc, v_etc, patch, pt, pl, th, tw, r0, r1, t0):
    """v[:, t0 + (tr - r0) tw + tj] = B^T d B for the tiles of tile rows tr in [r0, r1)."""
    n_, h, w, cin = x_nhwc.shape
    t = t0
    for tr in range(r0, r1):
        n, ti = tr // th, tr % th
        for tj in range(tw):
            for a in range(4):
                ih = 2 * ti - pt + a
                for bb in range(4):
                    iw = 2 * tj - pl + bb
                    dst = patch[4 * a + bb, :cin]
                    if 0 <= ih < h and 0 <= iw < w:
                        src = x_nhwc[n, ih, iw]
                        for c in range(cin):
                            dst[c] = src[c]
                    else:
                        for c in range(cin):
                            dst[c] = _ZERO
            for bb in range(4):                    # columns: B^T d
                p0, p1 = patch[bb, :cin], patch[4 + bb, :cin]
                p2, p3 = patch[8 + bb, :cin], patch[12 + bb, :cin]
                _bt4(p0, p1, p2, p3, p0, p1, p2, p3)
            for a in range(4):                     # rows: (B^T d) B
                _bt4(patch[4 * a, :cin], patch[4 * a + 1, :cin], patch[4 * a + 2, :cin],
                     patch[4 * a + 3, :cin], v_etc[4 * a, t], v_etc[4 * a + 1, t],
                     v_etc[4 * a + 2, t], v_etc[4 * a + 3, t])
            t += 1


@njit(inline=True)
def _output_tiles(m_eto, b, out_nhwc, code, alpha, patch, dump, th, tw, r0, r1, t0):
    """y = A^T M A for the tiles of tile rows tr in [r0, r1) (M's tile t0 + (tr - r0) tw + tj),
    then the bias + activation epilogue over their output rows."""
    n_, ho, wo, cout = out_nhwc.shape
    out_rows = out_nhwc.reshape(n_ * ho * wo, cout)
    t = t0
    for tr in range(r0, r1):
        n, ti = tr // th, tr % th
        for tj in range(tw):
            for bb in range(4):                    # s = A^T M, column bb -> patch rows bb, 4 + bb
                _at4(m_eto[bb, t], m_eto[4 + bb, t], m_eto[8 + bb, t], m_eto[12 + bb, t],
                     patch[bb, :cout], patch[4 + bb, :cout])
            for a in range(2):
                oh = 2 * ti + a
                if oh >= ho:
                    break
                base = (n * ho + oh) * wo + 2 * tj
                y1 = out_rows[base + 1] if 2 * tj + 1 < wo else dump
                _at4(patch[4 * a, :cout], patch[4 * a + 1, :cout], patch[4 * a + 2, :cout],
                     patch[4 * a + 3, :cout], out_rows[base], y1)
            t += 1
    n0, n1 = r0 // th, (r1 - 1) // th              # epilogue over the tiles' output rows
    row0 = (n0 * ho + 2 * (r0 % th)) * wo
    row1 = (n1 * ho + min(2 * ((r1 - 1) % th) + 2, ho)) * wo
    if code != 0 or b.shape[0] > 0:
        bias_act_rows(out_rows[row0:row1], b, out_rows[row0:row1], code, alpha)


def _products(pfn, v_etc, u_eio, pu_ep, m_eto, nt, e0, e1):
    """M[e, :nt] = V[e, :nt] U[e] for e in [e0, e1): fastlayers' sgemm on ``pu_ep[e]`` (U[e]
    packed) when ``pfn`` is ``_blas.PACKED``, else Numba's ``np.dot`` (compiled only: the
    overload below)."""
    raise NotImplementedError("_products runs only inside compiled kernels")


@overload(_products, jit_options={"fastmath": FASTMATH, "nogil": True})
def _products_impl(pfn, v_etc, u_eio, pu_ep, m_eto, nt, e0, e1):
    if isinstance(pfn, types.NoneType):
        def products(pfn, v_etc, u_eio, pu_ep, m_eto, nt, e0, e1):
            for e in range(e0, e1):
                np.dot(v_etc[e, :nt], u_eio[e], m_eto[e, :nt])
    else:
        def products(pfn, v_etc, u_eio, pu_ep, m_eto, nt, e0, e1):
            for e in range(e0, e1):
                packed(pfn, v_etc[e, :nt], pu_ep[e], m_eto[e, :nt], 0.0)
    return products


@njit()
def conv3x3_f23(x_nhwc, u_eio, pfn, pu_ep, b, out_nhwc, code, alpha, pt, pl, v_etc, m_eto, patch,
                block_rows, tr_begin, tr_end):
    """out = f(conv3x3(x, w) + b) for tile rows tr = n Th + ti in [tr_begin, tr_end), Th = ceil(Ho / 2):
    V = B^T d B per tile, M[e] = V[e] U[e] (``_products``), y = A^T M A, then bias and
    activation ``code``.

    ``v_etc`` / ``m_eto`` hold ``block_rows`` tile rows of V / M; ``patch`` is (16, C_in) scratch
    (its first 8 rows also hold A^T M for the output transform, so C_in >= C_out is not needed:
    ``patch`` has max(C_in, C_out) columns)."""
    ho, wo, cout = out_nhwc.shape[1], out_nhwc.shape[2], out_nhwc.shape[3]
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    dump = np.empty(cout, np.float32)              # target of the outputs past an odd edge
    for r0 in range(tr_begin, tr_end, block_rows):
        r1 = min(r0 + block_rows, tr_end)
        nt = (r1 - r0) * tw
        _input_tiles(x_nhwc, v_etc, patch, pt, pl, th, tw, r0, r1, 0)
        _products(pfn, v_etc, u_eio, pu_ep, m_eto, nt, 0, 16)
        _output_tiles(m_eto, b, out_nhwc, code, alpha, patch, dump, th, tw, r0, r1, 0)


# The same convolution in three phases, each shared among the threads in its own parallel
# region: the input transform and the output transform by tile rows, the 16 products by e.
# For layers with few tiles and large kernels (ResNet's 14x14x256), where splitting by tile rows
# made every thread stream all of U (16 C_in C_out floats) for a thin product.
@njit(parallel=True, signatures=(
    "void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int64, int64, int64, "
    "int64, int64)",))
def input_f23_par(x_nhwc, v_etc, patch_p, pt, pl, ho, wo, parts):
    """V for all tiles (tile t = tr Tw + tj), the tile rows in ``parts`` shares."""
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    rows = x_nhwc.shape[0] * th
    for p in prange(parts):
        r0, r1 = rows * p // parts, rows * (p + 1) // parts
        _input_tiles(x_nhwc, v_etc, patch_p[p], pt, pl, th, tw, r0, r1, r0 * tw)


@njit(parallel=True)
def products_f23_par(v_etc, u_eio, pfn, pu_ep, m_eto, parts):
    """M[e] = V[e] U[e] for e < 16, the 16 products in ``parts`` shares (``_products``)."""
    for p in prange(parts):
        _products(pfn, v_etc, u_eio, pu_ep, m_eto, v_etc.shape[1], 16 * p // parts,
                  16 * (p + 1) // parts)


@njit(parallel=True, signatures=(
    "void(float32[:, :, ::1], float32[::1], float32[:, :, :, ::1], int64, float32, "
    "float32[:, :, ::1], int64)",))
def output_f23_par(m_eto, b, out_nhwc, code, alpha, patch_p, parts):
    """y = f(A^T M A + b) for all tiles, the tile rows in ``parts`` shares."""
    ho, wo = out_nhwc.shape[1], out_nhwc.shape[2]
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    rows = out_nhwc.shape[0] * th
    for p in prange(parts):
        r0, r1 = rows * p // parts, rows * (p + 1) // parts
        if r1 > r0:
            dump = np.empty(out_nhwc.shape[3], np.float32)
            _output_tiles(m_eto, b, out_nhwc, code, alpha, patch_p[p], dump, th, tw, r0, r1,
                          r0 * tw)


@njit(parallel=True)
def conv3x3_f23_par(x_nhwc, u_eio, pfn, pu_ep, b, out_nhwc, code, alpha, pt, pl, v_petc, m_peto,
                    patch_p, block_rows, parts):
    """``conv3x3_f23`` over all tile rows in ``parts`` shares on Numba's threads, share p with
    the workspaces ``v_petc[p]``, ``m_peto[p]``, ``patch_p[p]``."""
    rows = out_nhwc.shape[0] * ((out_nhwc.shape[1] + 1) // 2)
    for p in prange(parts):
        conv3x3_f23(x_nhwc, u_eio, pfn, pu_ep, b, out_nhwc, code, alpha, pt, pl, v_petc[p],
                    m_peto[p], patch_p[p], block_rows, rows * p // parts, rows * (p + 1) // parts)
