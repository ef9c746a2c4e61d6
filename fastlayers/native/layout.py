"""Memory-order moves on the native core's tiled, threaded transpose (``native/layout.c``):
about 2x numpy's single-threaded ``ascontiguousarray(x.transpose(...))`` on one thread, 4x on
two (docs/design.md, "Figures behind the code's constants")."""

from __future__ import annotations

import numpy as np

from . import _core


def _native(a) -> bool:
    return a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned


def channels_last(x: np.ndarray) -> np.ndarray:
    """(N, C, *S) -> a new C-contiguous (N, *S, C): NCL -> NLC, NCHW -> NHWC."""
    if not _native(x) or x.ndim < 3:
        return np.ascontiguousarray(np.moveaxis(x, 1, -1))
    n, c = x.shape[:2]
    out = np.empty((n, *x.shape[2:], c), np.float32)
    _core.transpose(x.reshape(n, c, -1), out.reshape(n, -1, c))
    return out


def channels_first(x: np.ndarray) -> np.ndarray:
    """(N, *S, C) -> a new C-contiguous (N, C, *S): NLC -> NCL, NHWC -> NCHW."""
    if not _native(x) or x.ndim < 3:
        return np.ascontiguousarray(np.moveaxis(x, -1, 1))
    n, c = x.shape[0], x.shape[-1]
    out = np.empty((n, c, *x.shape[1:-1]), np.float32)
    _core.transpose(x.reshape(n, -1, c), out.reshape(n, c, -1))
    return out


def oihw_to_hwio(w: np.ndarray) -> np.ndarray:
    """Convolution weights (C_out, C_in, *K) -> a new C-contiguous (*K, C_in, C_out)."""
    if not _native(w) or w.ndim < 3:
        return np.ascontiguousarray(np.moveaxis(w, (0, 1), (-1, -2)))
    o, i = w.shape[:2]
    out = np.empty((*w.shape[2:], i, o), np.float32)
    # for each input channel: (C_out, K) -> (K, C_out)
    _core.transpose(w.reshape(o, i, -1).transpose(1, 0, 2), out.reshape(-1, i, o).transpose(1, 0, 2))
    return out
