"""CpuOps' parts of native plans (``native/plan.pxi``): the plan object, and per kernel the
arguments a plan step binds once, from the weights and the shapes of one set of inputs
(``onnx/lowering.py`` lowers a model's nodes onto them).

Each function returns None where the kernel does not cover the arguments (the lowering then
runs the node in Python inside the plan), with the same terms as the cpu backend's own paths:
the weights are packed by the same functions, so a plan and the backend share one packed copy.
"""

from __future__ import annotations

import numpy as np

from ...geometry import window_out_2d
from ...native import CODES, _core
from . import gemm, recurrent
from .conv import (
    PackedConvWeights,
    _bias,
    _f32c,
    _packed_conv,
    _transpose_nchw_weights,
    _transpose_one_weights,
    _transpose_packed,
    _winograd_tile,
    conv_weights_array,
    nchw_direct,
    planes_takes,
    pointwise_nchw_takes,
    pointwise_rows,
    winograd_weights,
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
    run it otherwise (empty shapes, an activation without an elementwise code). Where the
    backend adds the residual in a pass after the kernel (Winograd, depthwise), the kwargs hold
    ``then_add``: (code, alpha) of that pass, ``add_add_act``'s."""
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
    # the residual in a pass after the kernel, as the backend adds it to Winograd's and the
    # depthwise kernel's results (``add_act``)
    then_add = {} if residual is None else dict(then_add=(res_code, float(residual[1])))
    if groups > 1 and cin_g == 1 and groups == c:
        wk = _f32c(w_hwio.reshape(kh, kw, c, cout // c))
        return "depthwise", dict(wk=wk, bias=_bias(b), **geometry, **then_add)
    if groups < 1 or c != cin_g * groups or cout % groups:
        return None
    wk = w_hwio if type(w_hwio) is PackedConvWeights else _f32c(w_hwio)
    if planes and residual is None and groups == 1 and nchw_direct(c, cout, kh, kw, (sh, sw)):
        return "conv2d", dict(
            pw=conv_weights_array(wk), bias=_bias(b), kh=kh, kw=kw, groups=1, nchw_in=True, **geometry
        )
    tile = _winograd_tile(n, ho, wo, c, cout) if kh == kw == 3 and sh == sw == dh == dw == 1 and groups == 1 else 0
    bound = dict(bias=_bias(b), kh=kh, kw=kw, groups=groups, **geometry)
    if tile:
        # no packed weights for the direct sums: a non-finite value fails the step
        # (NOT_FINITE) and the Python plan, which packs them when it first needs them, runs the call
        pu = winograd_weights(wk, tile)
        bound.update(pw=None, tile=tile, pu=pu, **then_add)
    else:
        bound.update(pw=_packed_conv(wk, groups))
    if not tile and residual is not None:
        bound.update(res_code=res_code, res_alpha=float(residual[1]))
    return "conv2d", bound


def conv1x1_nchw_step(x_shape, w_oi, b, activation: str, alpha: float):
    """How a plan binds the 1x1 convolution of NCHW planes that ``conv1x1_nchw_plan`` runs on
    inputs of ``x_shape`` (N, C, H, W), ``w_oi`` (C_out, C): kwargs of ``add_conv2d`` with
    ``nchw_out`` (its output NCHW planes), or None where that plan would not take it (the
    convolution then goes to ``conv2d_step``)."""
    code = _ELEMENTWISE.get(activation)
    if not pointwise_nchw_takes(x_shape, w_oi, code):
        return None
    geometry = dict(kh=1, kw=1, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0, groups=1)
    return dict(pw=pointwise_rows(w_oi), bias=_bias(b), code=code, alpha=float(alpha), nchw_out=True, **geometry)


def conv2d_planes_step(
    x_shape, w_hwio, b, strides, pads, dilation, groups: int, activation: str, alpha: float, output=False
):
    """How a plan binds the convolution of NCHW planes into NCHW planes that
    ``conv2d_planes_plan`` runs on inputs of ``x_shape`` (N, C, H, W) (``output``: its result a
    graph's output): kwargs of ``add_conv2d`` with ``nchw_in`` and ``nchw_out``
    (``conv2d_planes``), or None where that plan would not take it (``planes_takes``)."""
    taken = planes_takes(x_shape, w_hwio, strides, pads, dilation, groups, activation, output)
    if taken is None:
        return None
    kh, kw = w_hwio.shape[:2]
    (sh, sw), (dh, dw), (pt, _), (pl, _) = strides, dilation, *pads
    geometry = dict(kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, groups=1)
    return dict(
        pw=conv_weights_array(w_hwio),
        bias=_bias(b),
        code=taken[0],
        alpha=float(alpha),
        nchw_in=True,
        nchw_out=True,
        **geometry,
    )


def conv_transpose_step(w_iohw, w_hwio, b, groups: int, activation: str, alpha: float, planes: bool):
    """How a plan binds the transposed convolution the cpu backend runs with weights ``w_iohw``
    (C_in, C_out / groups, kh, kw) (``w_hwio`` their (kh, kw, C_in, C_out / groups) form, as
    ``conv_transpose2d`` takes them; None with ``planes``): (form, kwargs of
    ``add_conv_transpose`` but x and y) with the backend's kernel and weights: "nchw" where the
    input is held as NCHW planes (``planes``: ``conv_transpose2d_nchw``), "one" for one output
    channel of a channels-last input (the NCHW kernel on the input moved to NCHW planes, as
    ``conv_transpose2d`` does), else "nhwc"; None where the activation has no elementwise code
    (the backend finishes those in another pass)."""
    code = _ELEMENTWISE.get(activation)
    cin, cout_g, kh, kw = w_iohw.shape
    if code is None or groups < 1 or cin % groups or cout_g == 0:
        return None
    bound = dict(bias=_bias(b), kh=kh, kw=kw, groups=groups, code=code, alpha=float(alpha))
    if planes:
        return "nchw", dict(wt=_transpose_nchw_weights(w_iohw, groups), nchw=True, **bound)
    if groups * cout_g == 1:
        return "one", dict(wt=_transpose_one_weights(w_hwio), nchw=True, **bound)
    return "nhwc", dict(wt=_transpose_packed(w_hwio, groups), **bound)


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
