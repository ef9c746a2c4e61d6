"""ONNX convolutions and pooling: Conv (and fastlayers' FusedConv), ConvTranspose, MaxPool,
AveragePool, LRN and MaxRoiPool, on the backend's NHWC (or NCHW planes) primitives; the result
of a convolution or a pooling is an NCHW view of NHWC memory (``layout.py``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import limits
from ...backends import get_ops
from ...backends.derived import derived
from ...errors import ShapeError
from ...geometry import transposed_out
from ..layout import channels_last_memory, laid_out_as, nchw, nchw_planes, nhwc, to_nhwc
from ..records import (
    BOOL,
    CONV,
    FLT,
    INTS,
    NONNEG,
    POOL,
    POS,
    POSS,
    A,
    Family,
    fail,
    short,
    spatial_lengths,
    spatial_rank,
)
from ..tensors import created, f32
from ..windows import spatial, window
from .elementwise import add_activated

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("convolution and pooling")
op = FAMILY.op


def _conv_check(node, attrs, ctx):
    weight = ctx.constants.get(node.inputs[1])
    n = spatial_rank(node, attrs, ctx, weight)
    spatial_lengths(node, attrs, ctx, n)
    group = attrs.get("group", 1)
    if weight is None:
        return
    if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(weight.shape[2:]):
        fail(ctx, node, f"kernel_shape {attrs['kernel_shape']} does not match its weight's shape {weight.shape}")
    if min(weight.shape) == 0:
        fail(ctx, node, f"weight {short(node.inputs[1])} has an empty shape {weight.shape}")
    # Conv: (C_out, C_in / group, k...); ConvTranspose: (C_in, C_out / group, k...)
    if weight.shape[0] % group:
        what = "output" if node.op_type == "Conv" else "input"
        fail(
            ctx,
            node,
            f"group {group} does not divide the {weight.shape[0]} {what} channels of its weight {weight.shape}",
        )
    bias = ctx.constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    c_out = weight.shape[0] if node.op_type == "Conv" else weight.shape[1] * group
    if bias is not None and bias.shape != (c_out,):
        fail(ctx, node, f"bias of shape {bias.shape} for {c_out} output channels")


@op("Conv", inputs=(2, 3), attrs=CONV, check=_conv_check, caches=("_windows",))
def _conv(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    plans, ops = attrs.get("_plans"), get_ops()
    residual = attrs.get("_residual")  # FusedConv: (activation, alpha) of a residual Add taken in
    rest = (inputs[3],) if residual is not None else ()  # its other operand, run(x, r)
    if plans is not None:  # FusedConv: its NHWC plan for this input's shape, layout and backend
        key = (x.shape, x.strides, x.dtype.char, id(ops), id(b))
        run = plans.get(key)
        if run is not None:
            return [run(x, *rest)]
    if x.ndim not in (3, 4):
        nhwc(x)  # raises: only 1-D and 2-D
    one_d = x.ndim == 3
    w_hwio = attrs.get("_w_hwio")  # FusedConv: its weights, transposed at load
    w4 = None
    if w_hwio is None:
        if w.ndim != x.ndim:
            raise ShapeError(
                f"Conv: weight of shape {w.shape} for an input of shape {x.shape} "
                "(the weight's rank must be the input's)"
            )
        w4 = w[:, :, None, :] if w.ndim == 3 else w
        w_hwio = np.ascontiguousarray(w4.transpose(2, 3, 1, 0), dtype=np.float32)
    elif w_hwio.ndim != 4 or (w_hwio.shape[0] != 1 and one_d):
        raise ShapeError(
            f"Conv: weight for a {'1' if w_hwio.shape[0] == 1 else '2'}-D convolution, input of shape {x.shape}"
        )
    group = attrs.get("group", 1)
    kh, kw, cin_g, cout = w_hwio.shape
    if group < 1 or x.shape[1] != cin_g * group or cout % group:
        raise ShapeError(
            f"Conv: input of shape {x.shape} (channels on axis 1) does not fit a weight "
            f"of {cout} output and {cin_g} input channels per group with group={group}"
        )
    if b is not None and np.shape(b) != (cout,):
        raise ShapeError(f"Conv: bias of shape {np.shape(b)} for {cout} output channels")
    strides, pads, dilations, out_hw, wide = window("Conv", attrs, x.shape, (kh, kw), one_d)
    if wide:
        created([x.shape[0] * cout, *out_hw], np.float32, "Conv")
    post = attrs.get("_post_affine")  # FusedConv: y scale + shift per channel after all
    depthwise = None  # a depthwise convolution of NCHW planes into NCHW planes
    dw_planes = nchw_planes(x) if cin_g == 1 and group > 1 else None
    if dw_planes is not None:  # w (C m, kh, kw)
        w_ohw = (
            np.ascontiguousarray(w4[:, 0], dtype=np.float32)
            if w4 is not None
            else derived(w_hwio, "onnx-depthwise-ohw", lambda a: np.ascontiguousarray(a[:, :, 0].transpose(2, 0, 1)))
        )
        depthwise = ops.depthwise_conv2d_nchw_plan(
            dw_planes.shape,
            w_ohw,
            None if b is None else f32(b),
            strides,
            pads,
            dilations,
            attrs.get("activation", "linear"),
            attrs.get("alpha", 0.0),
        )
    args = (
        w_hwio,
        None if b is None else f32(b),
        strides,
        pads,
        dilations,
        group,
        attrs.get("activation", "linear"),
        attrs.get("alpha", 0.0),
    )
    planes = nchw_planes(x) if group == 1 else None
    # the residual Add in the kernel's epilogue: x (and, at each call, r) views of NHWC memory
    in_kernel = (
        depthwise is None
        and residual is not None
        and post is None
        and not one_d
        and channels_last_memory(x) is not None
    )
    pointwise = None  # a 1x1 convolution of NCHW planes into NCHW planes, where the backend has one
    if planes is not None and planes_pointwise((kh, kw), group, strides, pads, residual, post):
        w_oi = w4[:, :, 0, 0] if w4 is not None else derived(w_hwio, "onnx-conv-oi", oi_of_hwio)
        bias, activation, alpha = args[1], args[6], args[7]
        pointwise = ops.conv1x1_nchw_plan(planes.shape, w_oi, bias, activation, alpha)
    # NCHW planes into NCHW planes (few output channels, or the graph's output), where the backend has a kernel
    to_planes = None
    if planes is not None and pointwise is None and residual is None and post is None:
        to_planes = ops.conv2d_planes_plan(planes.shape, *args, output=bool(attrs.get("_planes_out")))
    if depthwise is not None:
        run = (lambda x: depthwise(x[:, :, None, :])[:, :, 0]) if one_d else depthwise
    elif in_kernel:
        run = _with_residual_in_kernel(ops.conv2d_residual_plan(to_nhwc(x, False).shape, *args, *residual), residual)
    elif pointwise is not None:
        run = (lambda x: pointwise(x[:, :, None, :])[:, :, 0]) if one_d else pointwise
    elif to_planes is not None:
        run = (lambda x: to_planes(x[:, :, None, :])[:, :, 0]) if one_d else to_planes
    elif planes is not None:  # an NCHW activation (an image): the backend's plan from NCHW to NHWC
        from_planes = ops.conv2d_nchw_plan(planes.shape, *args)
        run = (
            (lambda x: nchw(from_planes(x[:, :, None, :]), True)) if one_d else (lambda x: nchw(from_planes(x), False))
        )
    else:
        x4 = to_nhwc(x, one_d)
        run = laid_out_as(x, one_d, ops.conv2d_plan(x4.shape, *args))
    if post is not None:
        run = _then_scaled_shifted(run, post)
    if residual is not None and not in_kernel:
        run = _then_added(run, residual)
    if plans is not None:
        if len(plans) >= 64:  # bound the memory of many distinct shapes
            plans.clear()
        plans[key] = run
    return [run(x, *rest)]


def planes_pointwise(window, group, strides, pads, residual, post) -> bool:
    """Whether a convolution of NCHW planes may run on them into NCHW planes (the backend's
    ``conv1x1_nchw_plan``, where it takes the shape): a 1x1 window, stride 1, no padding, one
    group, no residual Add or scale and shift taken in. The native plan's lowering
    (``plan_convolution.lower_conv``) asks the same."""
    return (
        tuple(window) == (1, 1)
        and group == 1
        and max(strides) == 1
        and not any(map(any, pads))
        and residual is None
        and post is None
    )


def oi_of_hwio(w_hwio):
    """A 1x1 convolution's (1, 1, C_in, C_out) weights (an array or the backend's held form,
    ``Ops.conv_weights``) as (C_out, C_in)."""
    return np.ascontiguousarray(np.asarray(w_hwio)[0, 0].T)


def _with_residual_in_kernel(plan, residual):
    """``run(x, r)`` for x a view of NHWC memory: the backend's ``conv2d_residual_plan``
    ``plan`` adds r to each block of output rows as its kernel writes them, where r is float32
    NHWC memory too (the output of a convolution, or of a residual sum of such); other r after
    the convolution, as FusedAdd adds."""

    def run(x, r):
        held = channels_last_memory(r) if type(r) is np.ndarray and r.dtype == np.float32 else None
        y = plan(x.transpose(0, 2, 3, 1), held).transpose(0, 3, 1, 2)
        return y if held is not None else add_activated(y, r, *residual)

    return run


def _then_added(run, residual):
    """``run`` followed by the residual Add (and its activation) as FusedAdd computes it."""
    return lambda x, r: add_activated(run(x), r, *residual)


def _scaled_shifted(y, post):
    """y scale + shift per channel (axis 1) of a convolution's fresh result ``y``, ``post`` =
    (scale, shift) vectors, in place: on the NHWC / NLC memory a convolution leaves, one pass
    of the backend's ``batch_norm`` over its rows; on other memory numpy's broadcast."""
    scale, shift = post
    held = channels_last_memory(y)
    if held is not None:
        get_ops().batch_norm(held, scale, shift, -1, out=held)
        return y
    shape = (1, -1) + (1,) * (y.ndim - 2)
    return y * scale.reshape(shape) + shift.reshape(shape)


def _then_scaled_shifted(run, post):
    """``run`` followed by ``_scaled_shifted``."""
    return lambda x: _scaled_shifted(run(x), post)


FAMILY.add("FusedConv", _conv, internal=True, caches=("_windows", "_plans"))


class ConvTransposeForm(NamedTuple):
    """A ConvTranspose node's weights and geometry for one input shape (``conv_transpose_form``):
    ``w_iohw`` (C_in, C_out / group, kh, kw), the bias as float32 or None, per spatial axis (the
    height 1 first where the input is 1-D) the strides, dilations, the output's leading crop and
    its size, the group, the fused activation and its alpha."""

    w_iohw: np.ndarray
    bias: np.ndarray | None
    strides: tuple
    dilations: tuple
    crop: tuple
    out_hw: tuple
    group: int
    activation: str
    alpha: float
    one_d: bool


def conv_transpose_form(x_shape, w, b, attrs) -> ConvTransposeForm:
    """The weights and geometry of a ConvTranspose node (its ONNX attributes ``attrs``, an
    activation fused by ``fuse_conv_transpose``) on an input of ``x_shape`` (rank 3 or 4);
    raises ``ShapeError`` where they do not fit it."""
    one_d = len(x_shape) == 3
    if w.ndim != len(x_shape):
        raise ShapeError(
            f"ConvTranspose: weight of shape {w.shape} for an input of shape {tuple(x_shape)} "
            "(the weight's rank must be the input's)"
        )
    group = attrs.get("group", 1)
    if group < 1 or w.shape[0] != x_shape[1] or w.shape[0] % group:
        raise ShapeError(
            f"ConvTranspose: weight of shape {w.shape} with group={group} for an input "
            f"of shape {tuple(x_shape)} (expected (C_in, C_out / group, k...), group dividing C_in)"
        )
    if b is not None and np.shape(b) != (w.shape[1] * group,):
        raise ShapeError(f"ConvTranspose: bias of shape {np.shape(b)} for {w.shape[1] * group} output channels")
    # (C_in, C_out / g, kh, kw); 1-D: one copy per weight (a view would keep the weight alive
    # in the cache), the array its own derived forms are kept for
    w4 = derived(w, "onnx-conv-transpose-4d", lambda a: np.array(a[:, :, None, :], copy=True)) if w.ndim == 3 else w
    n = len(x_shape) - 2
    strides, dilations = spatial(attrs, "strides", n, 1), spatial(attrs, "dilations", n, 1)
    out_pad = spatial(attrs, "output_padding", n, 0)
    kernel = list(w4.shape[2:])
    in_hw = [1, x_shape[2]] if one_d else list(x_shape[2:])
    full = [
        transposed_out(i, k, s, d, (0, 0), op_) for i, s, op_, k, d in zip(in_hw, strides, out_pad, kernel, dilations)
    ]
    shape = attrs.get("output_shape")
    auto = attrs.get("auto_pad", "NOTSET")
    if shape:
        shape = ([1] + list(shape)) if one_d else list(shape)[-2:]
        totals = [f - o for f, o in zip(full, shape)]
        pads = [(t - t // 2, t // 2) if auto != "SAME_UPPER" else (t // 2, t - t // 2) for t in totals]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [i * s for i, s in zip(in_hw, strides)]
        totals = [f - o for f, o in zip(full, shape)]
        pads = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2) for t in totals]
    else:
        p = list(attrs.get("pads") or [0] * (2 * n))
        if len(p) != 2 * n:
            raise ShapeError(f"ConvTranspose: {len(p)} pads for {n} spatial axes")
        pads = [(p[i], p[i + n]) for i in range(n)]
        pads = ([(0, 0)] + pads) if one_d else pads
        shape = [f - a - z for f, (a, z) in zip(full, pads)]
    if min(shape) <= 0:
        raise ShapeError(f"ConvTranspose: output size {tuple(shape)} for an input of shape {tuple(x_shape)}")
    created([x_shape[0], *shape, w4.shape[1] * group], np.float32, "ConvTranspose")
    return ConvTransposeForm(
        w4,
        None if b is None else f32(b),
        tuple(strides),
        tuple(dilations),
        tuple(a for a, _ in pads),
        tuple(shape),
        group,
        attrs.get("_activation", "linear"),  # fuse_conv_transpose
        attrs.get("_alpha", 0.0),
        one_d,
    )


def conv_transpose_hwio(w_iohw):
    """A ConvTranspose's (C_in, C_out / group, kh, kw) weights as (kh, kw, C_in, C_out / group),
    once per weight."""
    return derived(
        w_iohw, "onnx-conv-transpose-hwio", lambda a: np.array(a.transpose(2, 3, 0, 1), np.float32, order="C")
    )


@op("ConvTranspose", inputs=(2, 3), check=_conv_check, attrs=dict(CONV, output_padding=NONNEG, output_shape=POSS))
def _conv_transpose(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    if x.ndim not in (3, 4):
        nhwc(x)  # raises: only 1-D and 2-D
    f = conv_transpose_form(x.shape, w, inputs[2] if len(inputs) > 2 else None, attrs)
    geometry = (f.strides, f.crop, f.out_hw, f.dilations, f.group, f.activation, f.alpha)
    planes = nchw_planes(x)
    if planes is not None:
        # NCHW planes in and out: no layout round trip
        y = get_ops().conv_transpose2d_nchw(planes, f.w_iohw, f.bias, *geometry)
        return [y[:, :, 0] if f.one_d else y]
    x4, _ = nhwc(x)
    y = get_ops().conv_transpose2d(x4, conv_transpose_hwio(f.w_iohw), f.bias, *geometry)
    return [nchw(y, f.one_d)]


def _pool(kind):
    def run(inputs, attrs, opset):
        x = inputs[0]
        plans, ops = attrs.get("_plans"), get_ops()
        key = (x.shape, x.strides, x.dtype.char, id(ops))
        bound = plans.get(key) if plans is not None else None
        if bound is not None:  # the pool of this input's shape, layout and backend
            return [bound(x)]
        planes = nchw_planes(x)
        x4, one_d = nhwc(x) if planes is None else (planes, x.ndim == 3)
        kernel = tuple(attrs["kernel_shape"])
        if len(kernel) != x.ndim - 2:
            raise ShapeError(f"{kind} pooling: kernel_shape {list(kernel)} for an input of shape {x.shape}")
        what = f"{'Max' if kind == 'max' else 'Average'}Pool"
        kernel = (1, *kernel) if one_d else kernel
        strides, pads, dilations, out_hw, wide = window(
            what, attrs, x.shape, kernel, one_d, bool(attrs.get("ceil_mode", 0))
        )
        if wide:
            created([x.shape[0] * x.shape[1], *out_hw], np.float32, what)
        cip = bool(attrs.get("count_include_pad", 0))
        if planes is not None:
            pool = ops.pool2d_nchw_plan(planes.shape, kind, kernel, strides, pads, out_hw, dilations, cip)
            bound = (lambda x: pool(x[:, :, None, :])[:, :, 0]) if one_d else pool
        else:

            def bound(x):
                return nchw(ops.pool2d(nhwc(x)[0], kind, kernel, strides, pads, out_hw, dilations, cip), one_d)

        if plans is not None:
            if len(plans) >= 64:  # bound the memory of many distinct shapes
                plans.clear()
            plans[key] = bound
        return [bound(x)]

    return run


def _pool_check(node, attrs, ctx):
    n = len(attrs["kernel_shape"])
    if n > 2:
        fail(ctx, node, f"{n}-D pooling is not supported (1-D and 2-D are)", unsupported=True)
    spatial_lengths(node, attrs, ctx, n)


for _name, _kind, _flag in (("MaxPool", "max", "storage_order"), ("AveragePool", "avg", "count_include_pad")):
    FAMILY.add(
        _name,
        _pool(_kind),
        attrs=dict(POOL, **{_flag: BOOL}),
        required=("kernel_shape",),
        check=_pool_check,
        caches=("_windows", "_plans"),
    )


@op("LRN", attrs={"size": POS, "alpha": FLT, "beta": FLT, "bias": FLT}, required=("size",))
def _lrn(inputs, attrs, opset):
    x = f32(inputs[0])
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    if x.ndim < 2:
        raise ShapeError(f"LRN: expected an input (N, C, ...), got shape {x.shape}")
    moved = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    c = moved.shape[-1]
    if size >= 2 * c + 1:
        # every window holds every channel: one sum (the kernels' work grows with the window)
        s = np.sum(np.square(moved.astype(np.float64)), axis=-1, keepdims=True)
        y = (moved / (bias + alpha / size * s) ** beta).astype(np.float32)
    elif size % 2:
        y = get_ops().local_response_norm(moved, size, alpha, beta, bias)
    else:  # ONNX centres even windows one channel later than torch does
        sq = np.pad(np.square(moved.astype(np.float64)), [(0, 0)] * (x.ndim - 1) + [((size - 1) // 2, size // 2)])
        cs = np.concatenate([np.zeros(sq.shape[:-1] + (1,)), np.cumsum(sq, axis=-1)], axis=-1)
        s = cs[..., size : size + c] - cs[..., :c]
        y = (moved / (bias + alpha / size * s) ** beta).astype(np.float32)
    return [np.ascontiguousarray(np.moveaxis(y, -1, 1))]


@op(
    "MaxRoiPool",
    inputs=(2, 2),
    attrs={"pooled_shape": A(INTS, 1, limits.ONNX_MAX_GEOMETRY, length=2), "spatial_scale": FLT},
    required=("pooled_shape",),
)
def _max_roi_pool(inputs, attrs, opset):
    x, rois = inputs
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ShapeError(
            f"MaxRoiPool: expected features (N, C, H, W) and rois (K, 5), got shapes {x.shape} and {rois.shape}"
        )
    x4, _ = nhwc(x)
    y = get_ops().roi_pool(x4, f32(rois), tuple(attrs["pooled_shape"]), attrs.get("spatial_scale", 1.0))
    return [np.ascontiguousarray(y.transpose(0, 3, 1, 2))]
