"""The convolution and pooling primitives of the cuda backend (``ConvOps``, a base class of
CudaOps): one thread per output value of an NHWC array.

- conv2d, depthwise_conv2d: one kernel (``conv2d_nhwc``; a depthwise convolution is the grouped
  convolution of its (kh, kw, 1, C M) weights, one group per channel) with the bias and the
  elementwise activations in its epilogue; softmax and activations without a device code
  after it (``_epilogue``).
- conv_transpose2d: each output value gathers the inputs that reach it.
- pool2d, global_pool, roi_pool, upsample2d, local_response_norm: direct loops.

A call without a kernel for its arguments (empty arrays, an upsampling mode without one, global
pooling over axes that are not adjacent) runs the reference on host copies.
"""

from __future__ import annotations

import math

import numpy as np

from ...geometry import window_out_2d
from ..derived import derived
from ..reference.conv import resize_ratio
from . import kernels as K
from .device import DeviceOps, serialized_in_simulator
from .runtime import is_device, to_device, to_host
from .views import as_rows, grid2


class ConvOps(DeviceOps):
    """CudaOps' convolution and pooling primitives (a base class of ``CudaOps``)."""

    @serialized_in_simulator
    def conv2d(
        self,
        x_nhwc,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
    ):
        if not isinstance(w_hwio, np.ndarray) and not is_device(w_hwio):  # another backend's conv_weights
            w_hwio = derived(w_hwio, "host-array", np.asarray)
        n, h, w, c = x_nhwc.shape
        kh, kw, cin_g, cout = w_hwio.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout == 0:
            return self._host_path(
                is_device(x_nhwc),
                super().conv2d(
                    to_host(x_nhwc), to_host(w_hwio), to_host(b), strides, pads, dilation, groups, activation, alpha
                ),
            )
        dw_ = self._weight(w_hwio)
        return self._conv(x_nhwc, dw_, b, (sh, sw), (dh, dw), (pt, pl), groups, (ho, wo), activation, alpha, dev)

    def _conv(self, x_nhwc, dw_hwio, b, strides, dilation, pads_tl, groups, out_hw, activation, alpha, dev):
        n = x_nhwc.shape[0]
        cout = dw_hwio.shape[3]
        dx = to_device(x_nhwc)
        y = self._empty((n, out_hw[0], out_hw[1], cout))
        code = K.CODES.get(activation)
        db = self._dummy if b is None else self._weight(b)
        blocks, threads = grid2(cout, n * out_hw[0] * out_hw[1], self.sim)
        K.conv2d_nhwc[blocks, threads](
            dx,
            dw_hwio,
            db,
            b is not None,
            y,
            strides[0],
            strides[1],
            dilation[0],
            dilation[1],
            pads_tl[0],
            pads_tl[1],
            groups,
            K.LINEAR if code is None else code,
            np.float32(alpha),
        )
        if code is None:
            y = self._epilogue(as_rows(y), None, activation, alpha).reshape(y.shape)
        return self._back(y, dev)

    @serialized_in_simulator
    def depthwise_conv2d(
        self, x_nhwc, w_hwcm, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), activation="linear", alpha=0.0
    ):
        n, h, w, c = x_nhwc.shape
        kh, kw, _, m = w_hwcm.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or c * m == 0:
            return self._host_path(
                is_device(x_nhwc),
                super().depthwise_conv2d(
                    to_host(x_nhwc), to_host(w_hwcm), to_host(b), strides, pads, dilation, activation, alpha
                ),
            )
        # cache the layer's own (kh, kw, C, M) array; the (kh, kw, 1, C M) view is made on the device
        dwk = self._weight(w_hwcm).reshape(kh, kw, 1, c * m)
        return self._conv(x_nhwc, dwk, b, (sh, sw), (dh, dw), (pt, pl), c, (ho, wo), activation, alpha, dev)

    @serialized_in_simulator
    def pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1), count_include_pad=False):
        n, h, w, c = x_nhwc.shape
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or out_hw[0] <= 0 or out_hw[1] <= 0:
            return self._host_path(
                is_device(x_nhwc),
                super().pool2d(to_host(x_nhwc), kind, pool, strides, pads, out_hw, dilation, count_include_pad),
            )
        (pt, pb), (pl, pr) = pads
        dx = to_device(x_nhwc)
        y = self._empty((n, out_hw[0], out_hw[1], c))
        blocks, threads = grid2(c, n * out_hw[0] * out_hw[1], self.sim)
        K.pool2d_nhwc[blocks, threads](
            dx,
            y,
            kind == "max",
            pool[0],
            pool[1],
            strides[0],
            strides[1],
            dilation[0],
            dilation[1],
            pt,
            pl,
            pb,
            pr,
            bool(count_include_pad),
        )
        return self._back(y, dev)

    @serialized_in_simulator
    def conv_transpose2d(
        self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation=(1, 1), groups=1, activation="linear", alpha=0.0
    ):
        """Transposed convolution, one thread per output value (gathering the inputs reaching it)."""
        dev = is_device(x_nhwc)
        cout = w_hwio.shape[3] * groups
        if x_nhwc.size == 0 or min(out_hw) <= 0 or cout == 0:
            return self._host_path(
                is_device(x_nhwc),
                super().conv_transpose2d(
                    to_host(x_nhwc),
                    to_host(w_hwio),
                    to_host(b),
                    strides,
                    crop,
                    out_hw,
                    dilation,
                    groups,
                    activation,
                    alpha,
                ),
            )
        dx = to_device(x_nhwc)
        n = dx.shape[0]
        y = self._empty((n, out_hw[0], out_hw[1], cout))
        code = K.CODES.get(activation)
        db = self._dummy if b is None else self._weight(b)
        blocks, threads = grid2(cout, n * out_hw[0] * out_hw[1], self.sim)
        K.conv_transpose2d_nhwc[blocks, threads](
            dx,
            self._weight(w_hwio),
            db,
            b is not None,
            y,
            strides[0],
            strides[1],
            dilation[0],
            dilation[1],
            crop[0],
            crop[1],
            groups,
            K.LINEAR if code is None else code,
            np.float32(alpha),
        )
        if code is None:
            y = self._epilogue(as_rows(y), None, activation, alpha).reshape(y.shape)
        return self._back(y, dev)

    @serialized_in_simulator
    def upsample2d(self, x_nhwc, out_hw, mode="nearest", align_corners=False, scales=(None, None)):
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or min(out_hw) <= 0 or mode not in ("nearest", "bilinear"):
            return self._host_path(
                is_device(x_nhwc), super().upsample2d(to_host(x_nhwc), out_hw, mode, align_corners, scales)
            )
        dx = to_device(x_nhwc)
        n, h, w, c = dx.shape
        y = self._empty((n, out_hw[0], out_hw[1], c))
        ratios = [resize_ratio(o, size, mode, align_corners, sc) for o, size, sc in zip(out_hw, (h, w), scales)]
        blocks, threads = grid2(c, n * out_hw[0] * out_hw[1], self.sim)
        K.upsample2d_nhwc[blocks, threads](dx, y, mode == "bilinear", bool(align_corners), ratios[0], ratios[1])
        return self._back(y, dev)

    @serialized_in_simulator
    def local_response_norm(self, x, size, alpha=1e-4, beta=0.75, k=1.0):
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().local_response_norm(to_host(x), size, alpha, beta, k))
        dx = to_device(x)
        rows = as_rows(dx)
        out = self._empty(rows.shape)
        blocks, threads = grid2(rows.shape[1], rows.shape[0], self.sim)
        K.lrn_rows[blocks, threads](rows, out, int(size), np.float32(alpha / size), np.float32(beta), np.float32(k))
        return self._back(out.reshape(dx.shape), dev)

    @serialized_in_simulator
    def roi_pool(self, x_nhwc, rois, output_size, spatial_scale=1.0, bad=None):
        """torchvision's RoI max pooling (see ``reference.conv.roi_pool``). A roi whose batch index
        is not a whole number in [0, N) gives zeros and, given a one-element device array ``bad``,
        sets bad[0] = 1 (the layer checks the indices before calling a host primitive)."""
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or rois.shape[0] == 0:
            return self._host_path(
                is_device(x_nhwc), super().roi_pool(to_host(x_nhwc), to_host(rois), output_size, spatial_scale)
            )
        dx = to_device(x_nhwc)
        dr = to_device(rois)
        k, c = dr.shape[0], dx.shape[3]
        ph, pw = output_size
        y = self._empty((k, ph, pw, c))
        blocks, threads = grid2(c, k * ph * pw, self.sim)
        K.roi_pool_nhwc[blocks, threads](dx, dr, np.float32(spatial_scale), y, self.zeros((1,)) if bad is None else bad)
        return self._back(y, dev)

    @serialized_in_simulator
    def global_pool(self, x, kind, axes, keepdims=False):
        """Max or mean over ``axes`` (on the device when they are adjacent and not the batch axis,
        e.g. NHWC (1, 2) or NCHW (2, 3))."""
        dev = is_device(x)
        nd = x.ndim
        axes_n = sorted({a % nd for a in axes}) if nd else []
        if x.size == 0 or not axes_n or axes_n[0] == 0 or axes_n != list(range(axes_n[0], axes_n[-1] + 1)):
            return self._host_path(is_device(x), super().global_pool(to_host(x), kind, axes, keepdims))
        shape = tuple(x.shape)
        dx = to_device(x)
        outer, inner = math.prod(shape[: axes_n[0]]), math.prod(shape[axes_n[-1] + 1 :])
        x3 = dx.reshape(outer, math.prod(shape) // (outer * inner), inner)
        y = self._empty((outer, inner))
        blocks, threads = grid2(inner, outer, self.sim)
        K.global_pool_nhwc[blocks, threads](x3, y, kind == "max")
        kept = tuple(1 if a in axes_n else n for a, n in enumerate(shape) if keepdims or a not in axes_n)
        return self._back(y.reshape(kept), dev)
