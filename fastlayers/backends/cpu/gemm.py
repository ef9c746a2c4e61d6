"""Matrix products of the cpu backend on the native core (``fastlayers.native``, gemm.c):
weights packed once per array (``packed_weights``), products shared among the pool's threads
with the bias + activation epilogue fused (``matmul``)."""

from __future__ import annotations

import math

import numpy as np

from ...native import CODES, _core
from ...native._core import PACKED_MIN_MADDS, PACKED_ROWS_FLOOR, PANEL
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


class PackedWeights:
    """Dense weights (k, n) held only in their packed form (gemm.h's panels of ``PANEL``
    columns), for a model that keeps no other copy (``hold``): ``CpuOps.dense`` runs on
    ``packed``; anything else that reads them as an array (``np.asarray``, another backend)
    gets the (k, n) float32 values unpacked anew, the same bits."""

    __slots__ = ("packed", "shape", "__weakref__")
    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(self, packed, k: int, n: int):
        self.packed, self.shape = packed, (int(k), int(n))

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes)

    def unpacked(self):
        """The weights as a new (k, n) C-ordered float32 array."""
        return unpack(self.packed, *self.shape)

    def __array__(self, dtype=None, copy=None):
        w = self.unpacked()
        return w if dtype is None else w.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"PackedWeights(shape={self.shape})"


def unpack(packed, k: int, n: int):
    """The (k, n) matrix ``_core.pack`` packed into ``packed``, as a new C-ordered float32
    array (its panels of ``PANEL`` columns read back, the last one's padding dropped)."""
    panels = -(-n // PANEL)
    blocks = packed[: panels * k * PANEL].reshape(panels, k, PANEL)
    return np.ascontiguousarray(blocks.transpose(1, 0, 2).reshape(k, panels * PANEL)[:, :n])


def hold(w_kn):
    """What a model that reads ``w_kn`` (k, n) only through ``CpuOps.dense`` holds in its place:
    ``PackedWeights`` where every product would pack it (a float32 matrix whose product with
    ``PACKED_ROWS_FLOOR`` rows reaches ``PACKED_MIN_MADDS``, or a transposed view), so that the
    original array can be dropped; else ``w_kn`` itself."""
    if type(w_kn) is not np.ndarray or w_kn.dtype != np.float32 or w_kn.ndim != 2 or 0 in w_kn.shape:
        return w_kn
    k, n = w_kn.shape
    if PACKED_ROWS_FLOOR * n * k < PACKED_MIN_MADDS and not (n > 1 and w_kn.strides[-1] != 4):
        return w_kn
    return PackedWeights(packed_weights(w_kn), k, n)


def matmul(a_mk, b_kn, out_mn, bias=None, code=CODES["linear"], alpha=0.0, weights=False):
    """out = f(a @ b + bias) for 2-D float32 arrays (``out`` with contiguous rows, the others
    with a contiguous last axis) on the native core's threads; ``code`` is an activation code
    (``fastlayers.native.CODES``), applied with the bias while the rows are hot. ``weights``: b
    is a weight array (or a view of one), packed once (``packed_weights``) when the product is
    large enough for the packing to pay or its columns are strided (never copied per call)."""
    m, k = a_mk.shape
    n = b_kn.shape[1]
    strided = b_kn.strides[-1] != 4 and n > 1
    pb = (
        packed_weights(b_kn) if weights and (strided or max(m, PACKED_ROWS_FLOOR) * n * k >= PACKED_MIN_MADDS) else None
    )
    if strided and pb is None:
        b_kn = np.ascontiguousarray(b_kn)
    return _core.matmul(a_mk, b_kn, out_mn, pb, bias, code, alpha)


def _last_axis_contiguous(x):
    return x.shape[-1] <= 1 or x.strides[-1] == 4


def _as_batch(x, lead, batch):
    """``x`` (..., r, c) as (batch or 1, r, c) for ``_core.matmul_batch``: its leading axes
    either all of ``lead`` (merged into one, a copy where their strides do not allow it) or of
    one element (shared); None where they broadcast only in part (numpy then does it)."""
    size = math.prod(x.shape[:-2])
    if size == batch and (1,) * (len(lead) - x.ndim + 2) + x.shape[:-2] == lead:
        return x.reshape((batch,) + x.shape[-2:])
    if size == 1:
        return x.reshape((1,) + x.shape[-2:])
    return None


def batched_matmul(a, b, trans_b=False):
    """a @ b (b^T over its last two axes with ``trans_b``) for float32 arrays of at least 2 axes,
    leading axes broadcast as ``np.matmul`` does, on the pool's threads (``_core.matmul_batch``);
    None where numpy does it: other dtypes, fewer axes, empty operands, mismatched inner
    sizes (numpy raises the error) and leading axes that broadcast only in part."""
    if (
        type(a) is not np.ndarray
        or type(b) is not np.ndarray
        or a.dtype != np.float32
        or b.dtype != np.float32
        or a.ndim < 2
        or b.ndim < 2
        or not a.size
        or not b.size
    ):
        return None
    if not _last_axis_contiguous(b) and b.strides[-2] == 4:
        b, trans_b = np.swapaxes(b, -1, -2), not trans_b  # a transposed view read as what it views
    m, k = a.shape[-2:]
    kb, n = b.shape[-2:][::-1] if trans_b else b.shape[-2:]
    if kb != k:
        return None
    try:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    batch = math.prod(lead)
    if math.prod(b.shape[:-2]) == 1 and a.ndim > 2:
        rows = a.reshape(1, -1, k)  # a shared b: every row in one product
        a3, b3, c3 = rows, b.reshape((1,) + b.shape[-2:]), np.empty((1, rows.shape[1], n), np.float32)
    else:
        a3, b3 = _as_batch(a, lead, batch), _as_batch(b, lead, batch)
        if a3 is None or b3 is None:
            return None
        c3 = np.empty((batch, m, n), np.float32)
    if not _last_axis_contiguous(a3):
        a3 = np.ascontiguousarray(a3)
    if not _last_axis_contiguous(b3):
        b3 = np.ascontiguousarray(b3)
    _core.matmul_batch(a3, b3, c3, trans_b)
    return c3.reshape(lead + (m, n))
