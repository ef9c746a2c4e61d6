"""Lowerings of convolutions, transposed convolutions, batch norms and pools onto the cpu
backend's kernels, on channels-last values."""

from __future__ import annotations

import math

import numpy as np

from ..backends.derived import derived
from ..backends.reference import fold_batch_norm
from .layout import nchw_planes
from .ops.conv import conv_transpose_form, conv_transpose_hwio, oi_of_hwio, planes_pointwise
from .plan_movement import lower_alias
from .plan_values import NotLowered, Value, arena_view, channels_last, layout_of, memory_of, transposed
from .windows import window

#: Reductions whose result over one value is that value: over axes of length 1, aliases.
SINGLE_IS_ITSELF = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"})
#: Means and maxima over every position of each channel (a global pool where held
#: channels-last; ReduceMean / ReduceMax over axes of length 1 only: aliases).
GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"})


def hwio(w):
    """A Conv weight (C_out, C_in / group, [kh,] kw) as (kh, kw, C_in / group, C_out)."""
    return np.ascontiguousarray((w[:, :, None, :] if w.ndim == 3 else w).transpose(2, 3, 1, 0), dtype=np.float32)


def channels_last_value(low, x: Value) -> Value:
    """The (N, *S, C) memory of an (N, C, *S) plan value: its own where it is held
    channels-last, else a transposed copy."""
    if x.perm == channels_last(len(x.shape)):
        return low.use(memory_of(x))
    return transposed(low, x, (0, *range(2, len(x.shape)), 1), extra=False)  # as the Python plan's


def lower_conv(low, node, ins, traced_ins, traced_outs, attrs):
    """A convolution as the cpu backend runs it (``plan_conv2d``: implicit GEMM, Winograd,
    depthwise, direct from NCHW planes; a FusedConv's residual Add in the epilogue, its scale
    and shift per channel a pass after) on channels-last memory; its result held channels-last,
    as the Python plan holds it."""
    x, t = ins[0], traced_ins[0]
    node_attrs = attrs["_attrs"]
    residual, post = node_attrs.get("_residual"), node_attrs.get("_post_affine")
    r = ins[3] if residual is not None and len(ins) > 3 else None
    out = traced_outs[0]
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or x.size == 0
        or any(isinstance(v, Value) for v in ins[1:3])
        or (post is not None and (residual is not None or len(x.shape) != 4))
        or len(x.shape) not in (3, 4)
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or (residual is not None and (not isinstance(r, Value) or r.dtype != np.float32 or r.shape != out.shape))
    ):
        raise NotLowered
    one_d = len(x.shape) == 3
    w_hwio = node_attrs.get("_w_hwio")
    if w_hwio is None:  # a Conv node: its (C_out, C_in / group, k...) weight as HWIO, once
        w_hwio = derived(traced_ins[1], "plan-conv-hwio", hwio)
    group = node_attrs.get("group", 1)
    kh, kw, cin_g, cout = w_hwio.shape
    b = traced_ins[2] if len(traced_ins) > 2 and traced_ins[2] is not None else None
    strides, pads, dilations, out_hw, _ = window("Conv", node_attrs, t.shape, (kh, kw), one_d)
    n, c = x.shape[0], x.shape[1]
    hw = (1, x.shape[2]) if one_d else tuple(x.shape[2:])
    activation, alpha = node_attrs.get("activation", "linear"), float(node_attrs.get("alpha", 0.0))
    if x.perm is None and planes_pointwise((kh, kw), group, strides, pads, residual, post):
        # NCHW planes into NCHW planes, where the Python plan runs it so (``conv1x1_nchw_plan``)
        w_oi = (
            traced_ins[1].reshape(cout, c)
            if node_attrs.get("_w_hwio") is None
            else derived(w_hwio, "onnx-conv-oi", oi_of_hwio)
        )
        bound = low.ops.plan_conv1x1_nchw((n, c, *hw), w_oi, b, activation, alpha)
        if bound is not None:
            if layout_of(out) is not None or n * cout * math.prod(hw) != out.size:
                raise NotLowered
            low.use(x)
            x_in = Value(x.buffer, x.offset, (n, c, *hw), x.dtype)
            y_nchw = low.new((n, cout, *hw))
            low.emit(lambda plan, arena: plan.add_conv2d(arena_view(arena, x_in), y=arena_view(arena, y_nchw), **bound))
            return [Value(y_nchw.buffer, 0, out.shape, np.float32, None)]
    if x.perm is None and residual is None and post is None:
        # NCHW planes into NCHW planes (few output channels, or the graph's output), where the
        # Python plan runs it so (``conv2d_planes_plan``)
        output = bool(node_attrs.get("_planes_out"))
        bound = low.ops.plan_conv2d_planes(
            (n, c, *hw), w_hwio, b, strides, pads, dilations, group, activation, alpha, output
        )
        if bound is not None:
            if n * cout * math.prod(out_hw) != out.size:
                raise NotLowered
            low.use(x)
            x_in = Value(x.buffer, x.offset, (n, c, *hw), x.dtype)
            y_planes = low.new((n, cout, *out_hw))
            low.emit(
                lambda plan, arena: plan.add_conv2d(arena_view(arena, x_in), y=arena_view(arena, y_planes), **bound)
            )
            return [Value(y_planes.buffer, 0, out.shape, np.float32, None)]
    found = low.ops.plan_conv2d(
        (n, *hw, c),
        w_hwio,
        b,
        strides,
        pads,
        dilations,
        group,
        activation,
        alpha,
        residual,
        x.perm is None,  # NCHW planes: the direct kernel from them where it is the backend's choice
    )
    if found is None or n * math.prod(out_hw) * cout != out.size:
        raise NotLowered
    kind, bound = found
    then_add = bound.pop("then_add", None)  # the residual in a pass after the kernel
    if bound.get("nchw_in"):
        low.use(x)
        x_nhwc = Value(x.buffer, x.offset, (n, c, *hw), x.dtype)  # (N, C, H, W) planes, as nchw_in reads
    else:
        x_mem = channels_last_value(low, x)
        x_nhwc = Value(x_mem.buffer, x_mem.offset, (n, *hw, c), x.dtype)
    r_nhwc = None
    if r is not None:
        r_mem = channels_last_value(low, r)
        r_nhwc = Value(r_mem.buffer, r_mem.offset, (n, *out_hw, cout), r.dtype)
    y_nhwc = low.new((n, *out_hw, cout))

    def bind(plan, arena):
        if kind == "depthwise":
            plan.add_depthwise(arena_view(arena, x_nhwc), y=arena_view(arena, y_nhwc), **bound)
        else:
            res = None if r_nhwc is None or then_add else arena_view(arena, r_nhwc)
            plan.add_conv2d(arena_view(arena, x_nhwc), y=arena_view(arena, y_nhwc), res=res, **bound)
        if then_add:
            y = arena_view(arena, y_nhwc)
            plan.add_add_act(y, arena_view(arena, r_nhwc), y, *then_add)

    low.emit(bind)
    if post is not None:  # y scale + shift per channel in place, as ``ops/conv.py`` applies it
        scale, shift = (np.ascontiguousarray(v, np.float32).reshape(-1) for v in post)
        if scale.size != cout or shift.size != cout:
            raise NotLowered
        low.emit(
            lambda plan, arena: plan.add_scale_shift(arena_view(arena, y_nhwc), scale, shift, arena_view(arena, y_nhwc))
        )
    return [Value(y_nhwc.buffer, 0, out.shape, np.float32, channels_last(out.ndim))]


def lower_conv_transpose(low, node, ins, traced_ins, traced_outs, attrs):
    """A ConvTranspose (its activation fused) as the cpu backend runs it: from NCHW planes where
    the Python plan holds its input so (its result NCHW), else from channels-last memory (its
    result held channels-last; one output channel from the input's NCHW copy, as the backend
    makes it)."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or x.size == 0
        or len(x.shape) not in (3, 4)
        or any(isinstance(v, Value) for v in ins[1:3])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
    ):
        raise NotLowered
    f = conv_transpose_form(t.shape, traced_ins[1], traced_ins[2] if len(traced_ins) > 2 else None, attrs["_attrs"])
    planes = nchw_planes(t) is not None  # the Python plan's choice of kernel
    found = low.ops.plan_conv_transpose(
        f.w_iohw, None if planes else conv_transpose_hwio(f.w_iohw), f.bias, f.group, f.activation, f.alpha, planes
    )
    if found is None:
        raise NotLowered
    form, bound = found
    n, c = x.shape[0], x.shape[1]
    hw = (1, x.shape[2]) if f.one_d else tuple(x.shape[2:])
    cout = f.w_iohw.shape[1] * f.group
    if form == "nhwc":
        x_mem = channels_last_value(low, x)
        x_in = Value(x_mem.buffer, x_mem.offset, (n, *hw, c), x.dtype)
        y = low.new((n, *f.out_hw, cout))
        perm = channels_last(out.ndim)
    else:  # NCHW planes: the value's own memory, or its C-order copy
        x_mem = low.use(x) if planes else low.c_order(x)
        x_in = Value(x_mem.buffer, x_mem.offset, (n, c, *hw), x.dtype)
        y = low.new((n, cout, *f.out_hw))
        perm = layout_of(out) if form == "one" else None  # one channel: NHWC memory is the planes
    if math.prod(y.shape) != out.size or perm != layout_of(out):
        raise NotLowered
    strides, dilations, crop = f.strides, f.dilations, f.crop

    def bind(plan, arena):
        plan.add_conv_transpose(
            arena_view(arena, x_in),
            y=arena_view(arena, y),
            sh=strides[0],
            sw=strides[1],
            dh=dilations[0],
            dw=dilations[1],
            ct=crop[0],
            cl=crop[1],
            **bound,
        )

    low.emit(bind)
    return [Value(y.buffer, 0, out.shape, np.float32, perm)]


def lower_batch_norm(low, node, ins, traced_ins, traced_outs, attrs):
    """An inference BatchNormalization of a value held channels-last (or of rows (N, C)): one
    scale and shift per channel over the rows of its memory, folded once at the plan's build
    (the cpu backend's ``batch_norm`` runs the same kernel on the same rows)."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    rows = isinstance(x, Value) and (x.perm == channels_last(len(x.shape)) or (x.perm is None and len(x.shape) == 2))
    if (
        not rows
        or x.dtype != np.float32
        or node_attrs.get("training_mode", 0)
        or any(isinstance(v, Value) for v in ins[1:5])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or layout_of(out) != x.perm
    ):
        raise NotLowered
    gamma, beta, mean, var = traced_ins[1:5]
    scale, shift = fold_batch_norm(mean, var, gamma, beta, node_attrs.get("epsilon", 1e-5))
    c = x.shape[1]
    if scale.shape != (c,) or shift.shape != (c,):
        raise NotLowered
    x_mem = low.use(memory_of(x))
    y = low.new(x_mem.shape)
    low.emit(lambda plan, arena: plan.add_scale_shift(arena_view(arena, x_mem), scale, shift, arena_view(arena, y)))
    return [Value(y.buffer, 0, out.shape, np.float32, x.perm)]


def nhwc_of(x: Value) -> Value:
    """A channels-last (N, C, *S) value's memory as (N, H, W, C) (1-D: height 1)."""
    n, c = x.shape[0], x.shape[1]
    hw = (1, x.shape[2]) if len(x.shape) == 3 else tuple(x.shape[2:])
    return Value(x.buffer, x.offset, (n, *hw, c), x.dtype)


def lower_pool(low, node, ins, traced_ins, traced_outs, attrs):
    """MaxPool (without indices) and AveragePool of a channels-last value: the cpu backend's
    NHWC pool2d, its result channels-last (a C-ordered input keeps the Python plan's NCHW
    kernel, in Python)."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or len(x.shape) not in (3, 4)
        or x.perm != channels_last(len(x.shape))
        or x.size == 0
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or any(o is not None for o in traced_outs[1:])
    ):
        raise NotLowered
    one_d = len(x.shape) == 3
    kernel = tuple(node_attrs["kernel_shape"])
    kernel = (1, *kernel) if one_d else kernel
    what = "MaxPool" if node.op_type == "MaxPool" else "AveragePool"
    strides, pads, dilations, out_hw, _ = window(
        what, node_attrs, t.shape, kernel, one_d, bool(node_attrs.get("ceil_mode", 0))
    )
    (pt, pb), (pl, pr) = pads
    x_nhwc = nhwc_of(x)
    n, h, w, c = x_nhwc.shape
    if min(pt, pl, pb, pr) < 0 or n * math.prod(out_hw) * c != out.size or 0 in out_hw:
        raise NotLowered
    y = low.new(out.shape, perm=channels_last(out.ndim))
    low.use(x)
    y_nhwc = Value(y.buffer, 0, (n, *out_hw, c), y.dtype)
    count_pad = bool(node_attrs.get("count_include_pad", 0))

    def bind(plan, arena):
        plan.add_pool2d(
            arena_view(arena, x_nhwc),
            arena_view(arena, y_nhwc),
            what == "MaxPool",
            *kernel,
            *strides,
            *dilations,
            pt,
            pl,
            h + pb,
            w + pr,
            count_pad,
        )

    low.emit(bind)
    return [y]


def is_itself(node, x, out) -> bool:
    """Whether a reduction's result ``out`` is its input ``x`` reshaped (over axes of length 1)."""
    return (
        isinstance(x, Value) and isinstance(out, np.ndarray) and out.size == x.size and node.op_type in SINGLE_IS_ITSELF
    )


def lower_global_pool(low, node, ins, traced_ins, traced_outs, attrs):
    """GlobalAveragePool / GlobalMaxPool, and ReduceMean / ReduceMax over the positions, of a
    channels-last value: one window over each image's NHWC rows (the cpu backend's
    ``global_pool``), the (N, C) result in C order; a reduction over axes of length 1 is an
    alias."""
    x, out = ins[0], traced_outs[0]
    if is_itself(node, x, out):
        return lower_alias(low, node, [low.c_order(x), *ins[1:]], traced_ins, traced_outs, attrs)
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or len(x.shape) not in (3, 4)
        or x.perm != channels_last(len(x.shape))
        or any(isinstance(v, Value) for v in ins[1:])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.shape[:2] != x.shape[:2]
        or out.size != x.shape[0] * x.shape[1]
        or x.size == 0
    ):
        raise NotLowered
    n, c = x.shape[0], x.shape[1]
    steps = x.size // (n * c)
    x_rows = Value(x.buffer, x.offset, (n, 1, steps, c), x.dtype)
    y = low.new(out.shape)
    low.use(x)
    is_max = node.op_type in ("GlobalMaxPool", "ReduceMax")

    def bind(plan, arena):
        y_rows = arena_view(arena, y).reshape(n, 1, 1, c)
        plan.add_pool2d(arena_view(arena, x_rows), y_rows, is_max, 1, steps, 1, 1, 1, 1, 0, 0, 1, steps, False)

    low.emit(bind)
    return [y]
