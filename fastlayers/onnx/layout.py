"""The memory layout of ONNX tensors between operators: NCHW arrays that are views of NHWC memory.

ONNX tensors are NCHW; the backend's convolution primitives run NHWC/HWIO. A convolution or
pooling op returns its NHWC result as an NCHW *view* (no copy), so the next one finds its input
already NHWC in memory and moves nothing; numpy's elementwise ops keep that memory order (an
Add of two such views is one), activations run on the stored order (``stored``), and any other
op sees a correct NCHW array (strided). The model's outputs are made C-contiguous at the end.
1-D ops run as 2-D with height 1.
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..errors import UnsupportedError


def channels_last(x):
    """(N, C, *S) -> a new C-contiguous (N, *S, C), on the active backend (``Ops.channels_last``:
    the cpu backend's native tiled transpose)."""
    return get_ops().channels_last(x)


def channels_first(x):
    """(N, *S, C) -> a new C-contiguous (N, C, *S), on the active backend (``Ops.channels_first``)."""
    return get_ops().channels_first(x)


def nhwc(x):
    """(N, C, L) or (N, C, H, W) -> NHWC (a copy unless ``x`` is a view of NHWC memory) and
    whether the input was 1-D."""
    if x.ndim not in (3, 4):
        raise UnsupportedError(f"only 1-D and 2-D convolution and pooling are supported, got input of rank {x.ndim}")
    return to_nhwc(x, x.ndim == 3), x.ndim == 3


def nchw_planes(x):
    """``x`` (N, C, L) or (N, C, H, W) as C-contiguous float32 NCHW planes (N, C, H, W) when it
    is not a view of NHWC memory (``nchw``), else None: an NCHW activation runs the NCHW
    kernels, where the layout round trip to NHWC and back cost more than the pooling or
    depthwise convolution it served (docs/design.md)."""
    if x.ndim not in (3, 4) or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    return x[:, :, None, :] if x.ndim == 3 else x


def nchw(y, one_d):
    """The NCHW (or NCL) view of an NHWC result (no copy)."""
    return y[:, 0].transpose(0, 2, 1) if one_d else y.transpose(0, 3, 1, 2)


def channels_last_memory(x):
    """The C-contiguous NHWC / NLC array whose NCHW / NCL view ``x`` is (``nchw``), else None."""
    if x.flags.c_contiguous or x.ndim not in (3, 4):
        return None
    held = x.transpose(0, 2, 3, 1) if x.ndim == 4 else x.transpose(0, 2, 1)
    return held if held.flags.c_contiguous else None


def contiguous(x):
    """``x`` C-contiguous: itself, or a copy; an NCHW / NCL view of NHWC / NLC memory
    (``nchw``) is moved back by the native threaded transpose (numpy's strided copy runs at
    about a fifth of its speed)."""
    if x.flags.c_contiguous:
        return x
    held = channels_last_memory(x)
    return x.copy() if held is None else channels_first(held)


def stored(x):
    """(``x`` as the C-contiguous array its memory holds, the axes that view it back as ``x``):
    an NCHW / NCL view of NHWC / NLC memory (``nchw``) gives that memory, any other
    non-contiguous ``x`` a contiguous copy (and None)."""
    held = channels_last_memory(x)
    if held is None:  # (ascontiguousarray makes a 0-d array 1-d: a 0-d x is returned as it is)
        return (np.ascontiguousarray(x) if x.ndim else np.asarray(x)), None
    return held, (0, 3, 1, 2) if x.ndim == 4 else (0, 2, 1)


def to_nhwc(x, one_d):
    """``nhwc`` for an input of checked rank: its NHWC memory where it is a view of it, the
    same memory reshaped where it has one channel or one position, else a native transpose;
    1-D inputs get height 1."""
    if x.dtype == np.float32:
        held = channels_last_memory(x)
        if held is not None:
            return held[:, None] if one_d else held
        if x.flags.c_contiguous and (x.shape[1] == 1 or x[0, 0].size == 1):
            return (
                x.reshape((x.shape[0], 1) + x.shape[2:] + x.shape[1:2])
                if one_d
                else x.reshape(x.shape[:1] + x.shape[2:] + x.shape[1:2])
            )
    y = channels_last(np.ascontiguousarray(x, dtype=np.float32))
    return y[:, None] if one_d else y


def laid_out_as(x, one_d, run_nhwc):
    """``run_nhwc`` (NHWC in, NHWC out) as a function of inputs of x's shape, strides and dtype
    (NCHW / NCL in, the NCHW / NCL view of the result out): ``to_nhwc``'s case for that layout
    chosen once, leaving a view (or a reshape) per call."""
    if x.dtype == np.float32:
        if channels_last_memory(x) is not None:
            if one_d:
                return lambda x: run_nhwc(x.transpose(0, 2, 1)[:, None])[:, 0].transpose(0, 2, 1)
            return lambda x: run_nhwc(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        if x.flags.c_contiguous and (x.shape[1] == 1 or x[0, 0].size == 1):
            shape = to_nhwc(x, one_d).shape
            if one_d:
                return lambda x: run_nhwc(x.reshape(shape))[:, 0].transpose(0, 2, 1)
            return lambda x: run_nhwc(x.reshape(shape)).transpose(0, 3, 1, 2)
    return lambda x: nchw(run_nhwc(to_nhwc(x, one_d)), one_d)
