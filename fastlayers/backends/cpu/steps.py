"""CpuOps' parts of native plans (``native/plan.pxi``): the plan object, and per kernel the
arguments a plan step binds once, from the weights and the shapes of one set of inputs
(``onnx/lowering.py`` lowers a model's nodes onto them).

Each function returns None where the kernel does not cover the arguments (the lowering then
runs the node in Python inside the plan), with the same terms as the cpu backend's own paths:
the weights are packed by the same functions, so a plan and the backend share one packed copy.
"""

from __future__ import annotations

import functools

import numpy as np

from ...geometry import window_out_2d
from ...native import CODES, _core
from ..derived import derived_view
from . import gemm, recurrent
from .conv import (
    NCHW_DIRECT_MAX_CIN,
    NCHW_DIRECT_MAX_COUT,
    NCHW_DIRECT_MAX_WINDOW,
    NCHW_DIRECT_MIN_COUT,
    _bias,
    _f32c,
    _packed_conv,
    _winograd_tile,
)

#: Activation names whose native codes run elementwise (the softmaxes normalise rows).
_ELEMENTWISE = {name: code for name, code in CODES.items() if name not in ("softmax", "log_softmax")}


def native_plan(arena_bytes: int):
    """An empty native plan over an arena of ``arena_bytes`` bytes."""
    return _core.NativePlan(arena_bytes)


def activation_code(name: str, rows: bool = False):
    """The native code of the elementwise activation ``name`` (with ``rows``, of a row
    activation: the softmaxes too), or None."""
    return CODES.get(name) if rows else _ELEMENTWISE.get(name)


def conv2d_step(
    x_shape, w_hwio, b, strides, pads, dilation, groups: int, activation: str, alpha: float, residual, planes=False
):
    """How a plan binds the convolution that ``conv2d_plan`` (``residual`` None) or
    ``conv2d_residual_plan`` (``residual`` (activation, alpha)) runs on NHWC inputs of
    ``x_shape`` (N, H, W, C), with the same kernel choice: ("depthwise", kwargs of
    ``add_depthwise``), ("conv2d", kwargs of ``add_conv2d``: Winograd's tile and weights where
    the backend takes it; where ``planes`` (the input held as NCHW planes), the direct kernel
    from them where ``conv2d_nchw_plan`` takes it, ``nchw_in``), or None where the backend would
    run it otherwise (empty shapes, an activation without an elementwise code, a residual its
    kernel does not add)."""
    n, h, w, c = x_shape
    kh, kw, cin_g, cout = w_hwio.shape
    (sh, sw), (dh, dw) = strides, dilation
    (pt, _), (pl, _) = pads
    ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
    code = _ELEMENTWISE.get(activation)
    if n * h * w * c == 0 or ho <= 0 or wo <= 0 or cout == 0 or min(pt, pl) < 0 or code is None:
        return None
    res_code = 0 if residual is None else _ELEMENTWISE.get(residual[0])
    if res_code is None:
        return None
    geometry = dict(sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, code=code, alpha=float(alpha))
    if groups > 1 and cin_g == 1 and groups == c:
        if residual is not None:
            return None
        wk = _f32c(w_hwio.reshape(kh, kw, c, cout // c))
        return "depthwise", dict(wk=wk, bias=_bias(b), **geometry)
    if groups < 1 or c != cin_g * groups or cout % groups:
        return None
    wk = _f32c(w_hwio)
    if (
        planes
        and residual is None
        and groups == 1
        and 1 <= c <= NCHW_DIRECT_MAX_CIN
        and NCHW_DIRECT_MIN_COUT <= cout <= NCHW_DIRECT_MAX_COUT
        and kh * kw <= NCHW_DIRECT_MAX_WINDOW
    ):
        return "conv2d", dict(pw=wk, bias=_bias(b), kh=kh, kw=kw, groups=1, nchw_in=True, **geometry)
    tile = _winograd_tile(n, ho, wo, c, cout) if kh == kw == 3 and sh == sw == dh == dw == 1 and groups == 1 else 0
    if tile and residual is not None:  # the backend adds the residual after Winograd, in a pass
        return None
    bound = dict(pw=_packed_conv(wk, groups), bias=_bias(b), kh=kh, kw=kw, groups=groups, **geometry)
    if residual is not None:
        bound.update(res_code=res_code, res_alpha=float(residual[1]))
    if tile:
        pu = derived_view(wk, f"native-winograd:{tile}", functools.partial(_core.winograd_pack, tile=tile))
        bound.update(tile=tile, pu=pu)
    return "conv2d", bound


def dense_step(w_kn, b, rows: int, activation: str, alpha: float):
    """The arguments of ``NativePlan.add_dense`` but x and y for ``CpuOps.dense`` of ``rows``
    rows on the weights ``w_kn`` (an array (k, n), or held packed), as ``_core.dense`` runs
    it: the packed weights where it packs them, else the array read in place; None where the
    activation has no native code or the weights are not float32 (k, n)."""
    code = CODES.get(activation)
    if code is None:
        return None
    if type(w_kn) is gemm.PackedWeights:
        k, n = w_kn.shape
        w, pw = None, w_kn.packed
    else:
        if not isinstance(w_kn, np.ndarray) or w_kn.dtype != np.float32 or w_kn.ndim != 2 or 0 in w_kn.shape:
            return None
        k, n = w_kn.shape
        transposed = n > 1 and w_kn.strides[1] != 4
        in_place = not transposed and w_kn.strides[0] % 4 == 0 and w_kn.strides[0] >= 4 * n and w_kn.flags.aligned
        if transposed or not in_place or max(rows, _core.PACKED_ROWS_FLOOR) * n * k >= _core.PACKED_MIN_MADDS:
            w, pw = None, gemm.packed_weights(w_kn)
        else:
            w, pw = w_kn, None
    bias = None if b is None else np.ascontiguousarray(b, np.float32).reshape(-1)
    if bias is not None and bias.size != n:
        return None
    return dict(w=w, pw=pw, bias=bias, code=code, alpha=float(alpha))


sequence_loop = recurrent.sequence_loop
