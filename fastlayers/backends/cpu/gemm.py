"""Matrix products of the cpu backend on the native core (``fastlayers.native``, gemm.c):
weights packed once per array (``packed_weights``), products shared among the pool's threads
with the bias + activation epilogue fused (``matmul``)."""

from __future__ import annotations

import numpy as np

from ...native import CODES, _core
from ...native._core import PACKED_MIN_MADDS, PACKED_ROWS_FLOOR
from ..derived import derived_view

def packed_weights(w_kn):
    """``w_kn`` (k, n) packed for the native sgemm (gemm.h's panel layout), computed once per
    weight array (a view is keyed by the array it views, its offset, shape and strides)."""
    return derived_view(w_kn, "packed-native", _pack)


def _pack(w_kn):
    """``_core.pack`` of any (k, n) view: a transposed (n, k) array (torch's Linear weight read
    as ``weight.T``) is packed from its rows, other strided views from a contiguous copy."""
    if w_kn.shape[1] > 1 and w_kn.strides[-1] != 4:
        if w_kn.shape[0] > 1 and w_kn.strides[0] == 4:
            return _core.pack(w_kn.T, True)
        w_kn = np.ascontiguousarray(w_kn)
    return _core.pack(w_kn)


def matmul(a_mk, b_kn, out_mn, bias=None, code=CODES["linear"], alpha=0.0, weights=False):
    """out = f(a @ b + bias) for 2-D float32 arrays (``out`` with contiguous rows, the others
    with a contiguous last axis) on the native core's threads; ``code`` is an activation code
    (``fastlayers.native.CODES``), applied with the bias while the rows are hot. ``weights``: b
    is a weight array (or a view of one), packed once (``packed_weights``) when the product is
    large enough for the packing to pay or its columns are strided (never copied per call)."""
    m, k = a_mk.shape
    n = b_kn.shape[1]
    strided = b_kn.strides[-1] != 4 and n > 1
    pb = (packed_weights(b_kn) if weights and (
        strided or max(m, PACKED_ROWS_FLOOR) * n * k >= PACKED_MIN_MADDS) else None)
    if strided and pb is None:
        b_kn = np.ascontiguousarray(b_kn)
    return _core.matmul(a_mk, b_kn, out_mn, pb, bias, code, alpha)
