"""ONNX operators on shapes, types and the movement of data: Reshape, Flatten, Transpose,
(Un)Squeeze, Concat, Split, Slice, Gather, Shape, Cast, the constants, Range, Expand, Tile,
Trilu, Dropout and Pad."""

from __future__ import annotations

import math

import numpy as np

from ... import limits
from ...backends import get_ops
from ...errors import InputError, ShapeError, UnsupportedError
from .. import bound
from ..bound import constant, per_shape, reshaper
from ..layout import channels_last_memory
from ..records import AXES, AXIS, BOOL, FLOATS, FLT, INT, INTS, STRING, TENSOR, A, Family, fail
from ..tensors import DTYPES, check_created, created, ints, read_axes

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("shape")
op = FAMILY.op


@op("Reshape", inputs=(2, 2), attrs={"allowzero": BOOL})
def _reshape(inputs, attrs, opset):
    x, shape = inputs[0], ints(inputs[1]) if len(inputs) > 1 else list(attrs["shape"])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@op("Flatten", attrs={"axis": AXIS})
def _flatten(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _transpose_check(node, attrs, ctx):
    perm = attrs.get("perm")
    if perm and sorted(perm) != list(range(len(perm))):
        fail(ctx, node, f"perm {perm} is not a permutation")


@op("Transpose", attrs={"perm": A(INTS, 0, limits.ONNX_MAX_RANK - 1)}, check=_transpose_check)
def _transpose(inputs, attrs, opset):
    perm = attrs.get("perm")
    return [np.transpose(inputs[0], perm)]


@op("Squeeze", inputs=(1, 2), attrs={"axes": AXES})
def _squeeze(inputs, attrs, opset):
    x = inputs[0]
    axes = read_axes(inputs, attrs, 1)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


def _axes_input_or_attribute(node, attrs, ctx):
    if "axes" not in attrs and not (len(node.inputs) > 1 and node.inputs[1]):
        fail(ctx, node, "needs its axes (attribute 'axes' or input 2)")


@op("Unsqueeze", inputs=(1, 2), attrs={"axes": AXES}, check=_axes_input_or_attribute)
def _unsqueeze(inputs, attrs, opset):
    x = inputs[0]
    axes = read_axes(inputs, attrs, 1)
    rank = x.ndim + len(axes)
    new = {a % rank for a in axes}
    if len(new) != len(axes) or any(not -rank <= a < rank for a in axes):
        raise ShapeError(f"Unsqueeze: axes {axes} for an output of rank {rank}")
    dims = iter(x.shape)
    return [x.reshape([1 if k in new else next(dims) for k in range(rank)])]


@op("Concat", inputs=(1, None), optional=None, attrs={"axis": AXIS}, required=("axis",))
def _concat(inputs, attrs, opset):
    parts = [x for x in inputs if x is not None]
    axis = attrs["axis"]
    if len(parts) > 1 and parts[0].ndim == 4 and all(x.ndim == 4 and x.dtype == np.float32 for x in parts):
        held = [channels_last_memory(x) for x in parts]
        if all(h is not None for h in held):
            # convolution outputs (NCHW views of NHWC memory): joined in that memory (channels
            # are its rows' last axis), so that the next convolution moves nothing
            nhwc_axis = (0, 3, 1, 2)[axis % 4] if -4 <= axis < 4 else axis
            return [get_ops().concatenate(held, nhwc_axis).transpose(0, 3, 1, 2)]
        if any(h is not None for h in held):
            shape = list(parts[0].shape)
            shape[axis] = sum(x.shape[axis] for x in parts)
            out = np.empty((shape[0], shape[2], shape[3], shape[1]), np.float32).transpose(0, 3, 1, 2)
            np.concatenate(parts, axis=axis, out=out)
            return [out]
    return [get_ops().concatenate(parts, axis)]


def _split_check(node, attrs, ctx):
    n = attrs.get("num_outputs")
    if n is not None and n != len(node.outputs):
        fail(ctx, node, f"num_outputs {n} but {len(node.outputs)} outputs")
    if "split" in attrs and len(attrs["split"]) != len(node.outputs):
        fail(ctx, node, f"split {attrs['split']} gives {len(attrs['split'])} parts for {len(node.outputs)} outputs")


@op(
    "Split",
    inputs=(1, 2),
    outputs=None,
    check=_split_check,
    attrs={"axis": AXIS, "split": A(INTS, 0), "num_outputs": A(INT, 1)},
)
def _split(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 0)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"Split: axis {axis} for an input of shape {x.shape}")
    dim = x.shape[axis]
    sizes = read_axes(inputs, attrs, 1, name="split")
    n = attrs.get("num_outputs") or attrs.get("_num_outputs", 1)
    if sizes is None:
        size = -(-dim // max(n, 1))
        sizes = [max(0, min(size, dim - i * size)) for i in range(n)]
    if len(sizes) != n or any(v < 0 for v in sizes) or sum(sizes) != dim:
        raise ShapeError(f"Split: sizes {sizes[:8]} for {n} outputs do not split an axis of {dim}")
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _slice_check(node, attrs, ctx):
    if ctx.opset < 10:
        if "starts" not in attrs or "ends" not in attrs:
            fail(ctx, node, "needs attributes 'starts' and 'ends' (opset < 10)")
        if len(attrs["starts"]) != len(attrs["ends"]) or (
            "axes" in attrs and len(attrs["axes"]) != len(attrs["starts"])
        ):
            fail(ctx, node, "starts, ends and axes differ in length")
    elif len(node.inputs) < 3 or not all(node.inputs[:3]):
        fail(ctx, node, "needs inputs data, starts and ends (opset >= 10)")


@op("Slice", inputs=(1, 5), check=_slice_check, attrs={"starts": A(INTS), "ends": A(INTS), "axes": AXES})
def _slice(inputs, attrs, opset):
    x = inputs[0]
    if opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    return [x[slice_index(x.shape, starts, ends, axes, steps)]]


def slice_index(shape, starts, ends, axes, steps) -> tuple:
    """The numpy index of Slice on an input of ``shape``."""
    index = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % len(shape)] = slice(s, None if (st < 0 and e < -shape[a]) else e, st)
    return tuple(index)


@op("Gather", inputs=(2, 2), attrs={"axis": AXIS})
def _gather(inputs, attrs, opset):
    x, idx = inputs
    axis = attrs.get("axis", 0) % max(x.ndim, 1)
    if idx.ndim == 0 and x.ndim > 0:  # one index: a view (q, k, v out of a packed qkv)
        i = int(idx)
        if not -x.shape[axis] <= i < x.shape[axis]:
            raise IndexError(f"Gather index {i} is out of bounds for axis {axis} with size {x.shape[axis]}")
        return [x[(slice(None),) * axis + (i,)]]
    return [np.take(x, idx.astype(np.int64), axis=axis)]


@op("GatherElements", inputs=(2, 2), attrs={"axis": AXIS})
def _gather_elements(inputs, attrs, opset):
    x, idx = inputs
    return [np.take_along_axis(x, idx.astype(np.int64) % x.shape[attrs.get("axis", 0)], axis=attrs.get("axis", 0))]


@op("Shape", attrs={"start": A(INT), "end": A(INT)})
def _shape(inputs, attrs, opset):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    return [shape[attrs.get("start", 0) : attrs.get("end", None)]]


@op("Size")
def _size(inputs, attrs, opset):
    return [np.array(inputs[0].size, dtype=np.int64)]


def _cast_check(node, attrs, ctx):
    if attrs["to"] not in DTYPES:
        fail(ctx, node, f"Cast to ONNX element type {attrs['to']} is not supported", unsupported=True)


@op("Cast", attrs={"to": A(INT), "saturate": BOOL}, required=("to",), check=_cast_check)
def _cast(inputs, attrs, opset):
    to = attrs["to"]
    if to not in DTYPES:
        raise UnsupportedError(f"Cast to ONNX type {to} is not supported")
    return [inputs[0].astype(DTYPES[to])]


@op("CastLike", inputs=(2, 2), attrs={"saturate": BOOL})
def _cast_like(inputs, attrs, opset):
    return [inputs[0].astype(inputs[1].dtype)]


def _constant_check(node, attrs, ctx):
    given = [k for k in ("value", "value_float", "value_floats", "value_int", "value_ints") if k in attrs]
    if len(given) != 1:
        strings = [k for k in node.attrs if k in ("value_string", "value_strings", "sparse_value")]
        if strings and not given:
            fail(ctx, node, f"a Constant of {strings[0]} is not supported", unsupported=True)
        fail(ctx, node, f"a Constant needs exactly one value attribute, has {given or 'none'}")


@op(
    "Constant",
    inputs=(0, 0),
    check=_constant_check,
    attrs={
        "value": A(TENSOR),
        "value_float": FLT,
        "value_floats": A(FLOATS),
        "value_int": A(INT),
        "value_ints": A(INTS),
    },
)
def _constant(inputs, attrs, opset):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            value = attrs[key]
            if key in ("value_float", "value_floats"):
                return [np.asarray(value, np.float32)]
            if key in ("value_int", "value_ints"):
                return [np.asarray(value, np.int64)]
            return [value]
    raise UnsupportedError(f"Constant with attributes {sorted(attrs)} is not supported")


def _constant_of_shape_check(node, attrs, ctx):
    value = attrs.get("value")
    if value is not None and value.size != 1:
        fail(ctx, node, f"attribute 'value' must hold one element, holds {value.size}")


@op("ConstantOfShape", attrs={"value": A(TENSOR)}, check=_constant_of_shape_check)
def _constant_of_shape(inputs, attrs, opset):
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    shape = created(ints(inputs[0]), value.dtype, "ConstantOfShape")
    return [np.full(shape, value.reshape(-1)[0], dtype=value.dtype)]


@op("Range", inputs=(3, 3))
def _range(inputs, attrs, opset):
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs)
    dtype = np.result_type(start, limit, delta)
    if delta == 0:
        raise InputError("Range: delta is 0")
    span = (float(limit) - float(start)) / float(delta)
    if span != span:
        raise InputError("Range: start, limit or delta is NaN")
    created([0 if span <= 0 else int(np.ceil(span)) if span < 2**62 else 2**62], dtype, "Range")
    return [np.arange(start, limit, delta, dtype=dtype)]


@op("Expand", inputs=(2, 2))
def _expand(inputs, attrs, opset):
    x, shape = inputs
    target = ints(shape)
    if any(d < 0 for d in target):
        raise ShapeError(f"Expand: negative dimension in shape {target[:8]}")
    out = broadcast_shape(x.shape, target, "Expand")
    if out == x.shape:  # nothing to repeat: the input itself, as a dropped Identity passes it
        return [x]
    created(out, x.dtype, "Expand")
    return [np.array(np.broadcast_to(x, out))]


def broadcast_shape(a, b, what):
    """The shape that shapes ``a`` and ``b`` broadcast to (numpy's rules; ``np.broadcast_shapes``
    costs a few microseconds on small shapes); a ``ShapeError`` naming ``what`` where they
    do not."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            raise ShapeError(f"{what}: shapes {a} and {b} do not broadcast")
        out.append(q if p == 1 else p)
    return tuple(out)


@op("Tile", inputs=(2, 2))
def _tile(inputs, attrs, opset):
    x, repeats = inputs[0], ints(inputs[1])
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise ShapeError(f"Tile: repeats {repeats[:8]} for an input of rank {x.ndim} (one non-negative count per axis)")
    created([d * r for d, r in zip(x.shape, repeats)], x.dtype, "Tile")
    return [np.tile(x, repeats)]


@op("Trilu", inputs=(1, 2), attrs={"upper": BOOL})
def _trilu(inputs, attrs, opset):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


@op("Dropout", inputs=(1, 3), outputs=2, attrs={"ratio": FLT, "seed": A(INT)})
def _dropout(inputs, attrs, opset):
    x = inputs[0]
    return [x, np.ones(x.shape, dtype=np.bool_)]


def _pad_check(node, attrs, ctx):
    if ctx.opset < 11:
        if "pads" not in attrs:
            fail(ctx, node, "needs attribute 'pads' (opset < 11)")
    elif len(node.inputs) < 2 or not node.inputs[1]:
        fail(ctx, node, "needs input 'pads' (opset >= 11)")


@op(
    "Pad",
    inputs=(1, 4),
    check=_pad_check,
    attrs={"mode": A(STRING, choices=("constant", "reflect", "edge", "wrap")), "pads": A(INTS), "value": FLT},
)
def _pad(inputs, attrs, opset):
    x = inputs[0]
    return [pad_plan(x.shape, x.dtype, inputs, attrs, opset)(x)]


def pad_plan(x_shape, dtype, inputs, attrs, opset):
    """A function ``x -> Pad's output`` for inputs of ``x_shape`` and ``dtype``, the node's pads
    read and checked here: negative pads crop; constant mode fills, the other modes gather
    each padded axis through one index array (reflect: mirrored without the edge, edge: the
    edge repeated, wrap: the other end's). Each call checks the output against the size limit
    (``check_created``)."""
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ndim = len(x_shape)
    if opset < 11:
        pads, value = list(attrs["pads"]), attrs.get("value", 0.0)
        axes = list(range(ndim))
    else:
        pads = ints(inputs[1])
        value = (
            np.asarray(inputs[2]).reshape(())
            if len(inputs) > 2 and inputs[2] is not None and np.asarray(inputs[2]).size
            else 0
        )
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(ndim))
    n = len(axes)
    if len(pads) != 2 * n:
        raise ShapeError(f"Pad: {len(pads)} pads for {n} axes (expected {2 * n})")
    width = [(0, 0)] * ndim
    for i, a in enumerate(axes):
        width[a % ndim] = (pads[i], pads[i + n])
    crop = None
    if any(p < 0 for pair in width for p in pair):  # negative pads crop
        crop = tuple(slice(-b if b < 0 else 0, x_shape[k] + e if e < 0 else None) for k, (b, e) in enumerate(width))
        x_shape = tuple(len(range(*c.indices(d))) for c, d in zip(crop, x_shape))
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    out_shape = created([d + b + e for d, (b, e) in zip(x_shape, width)], dtype, "Pad")
    nbytes = int(np.prod(out_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if mode in ("reflect", "wrap") and any(
        max(b, e) > (d - 1 if mode == "reflect" else d) for d, (b, e) in zip(x_shape, width) if b or e
    ):
        raise ShapeError(f"Pad: {mode} pads {width} are larger than the axes {x_shape} they mirror")
    if mode == "constant":
        inner = tuple(slice(b, b + d) for d, (b, _) in zip(x_shape, width))

        def run(x):
            check_created(out_shape, nbytes, "Pad")
            out = np.full(out_shape, value, x.dtype)
            out[inner] = x if crop is None else x[crop]
            return out

        return run
    if mode not in ("reflect", "edge", "wrap"):
        raise UnsupportedError(f"Pad mode {mode!r} is not supported")
    takes = [
        (axis, b, d, e, *_pad_ends(d, b, e, mode)) for axis, (d, (b, e)) in enumerate(zip(x_shape, width)) if b or e
    ]

    def run(x):
        check_created(out_shape, nbytes, "Pad")
        if crop is not None:
            x = x[crop]
        for axis, b, d, e, head, tail in takes:  # per padded axis: x copied whole, then its ends
            shape = list(x.shape)
            shape[axis] = b + d + e
            out = np.empty(shape, x.dtype)
            at = [slice(None)] * x.ndim
            at[axis] = slice(b, b + d)
            out[tuple(at)] = x
            for part, source in ((slice(0, b), head), (slice(b + d, None), tail)):
                if source is not None:
                    at[axis] = part
                    src = [slice(None)] * x.ndim
                    src[axis] = source
                    out[tuple(at)] = x[tuple(src)]  # a view (broadcast for edge's one position)
            x = out
        return x

    return run


def _pad_ends(d, before, after, mode):
    """The slices of an axis of length ``d`` that Pad's ``before`` and ``after`` values copy in
    ``mode`` (None for an end with no values): mirrored without the edge (reflect, a reversed
    slice), the edge (one position, broadcast), or the other end's (wrap)."""
    if mode == "reflect":
        head, tail = slice(before, 0, -1), slice(d - 2, None if d - 2 - after < 0 else d - 2 - after, -1)
    elif mode == "wrap":
        head, tail = slice(d - before, d), slice(0, after)
    else:
        head, tail = slice(0, 1), slice(d - 1, d)
    return head if before else None, tail if after else None


# ------------------------------------------------------------------ bound on constant inputs
def _bind_axes_reshape(op_type):
    def bind(inputs, attrs, opset):
        if opset >= 13 and constant(inputs, 1) is None and not (op_type == "Squeeze" and len(inputs) < 2):
            return None
        return reshaper(FAMILY.run(op_type))

    return bind


FAMILY.binder("Unsqueeze")(_bind_axes_reshape("Unsqueeze"))
FAMILY.binder("Squeeze")(_bind_axes_reshape("Squeeze"))


@FAMILY.binder("Slice")
def _bind_slice(inputs, attrs, opset):
    if opset < 10:
        return None
    params = [constant(inputs, i) for i in (1, 2, 3, 4)]
    if (
        params[0] is None
        or params[1] is None
        or any(len(inputs) > i and inputs[i] is not None and params[i - 1] is None for i in (3, 4))
    ):
        return None
    starts, ends = ints(params[0]), ints(params[1])
    axes = ints(params[2]) if params[2] is not None else list(range(len(starts)))
    steps = ints(params[3]) if params[3] is not None else [1] * len(starts)
    indexes: dict = {}

    def run(inputs, attrs, opset):
        x = inputs[0]
        index = indexes.get(x.shape)
        if index is None:
            out = _slice(inputs, attrs, opset)  # checks the node on this shape
            if len(indexes) >= bound.MAX_SHAPES:
                indexes.clear()
            indexes[x.shape] = slice_index(x.shape, starts, ends, axes, steps)
            return out
        return [x[index]]

    return run


@FAMILY.binder("Pad")
def _bind_pad(inputs, attrs, opset):
    if opset >= 11 and any(
        len(inputs) > i and inputs[i] is not None and constant(inputs, i) is None for i in (1, 2, 3)
    ):
        return None
    return per_shape(_pad, lambda ins: pad_plan(ins[0].shape, ins[0].dtype, ins, attrs, opset))


@FAMILY.binder("Gather")
def _bind_gather(inputs, attrs, opset):
    idx = constant(inputs, 1)
    if idx is None or idx.dtype.kind not in "iu":
        return None
    index64 = idx.astype(np.int64)

    def make(ins):
        x = ins[0]
        if x.ndim == 0:
            return lambda x: _gather([x, idx], attrs, opset)[0]
        axis = attrs.get("axis", 0) % x.ndim
        pos = np.where(index64 < 0, index64 + x.shape[axis], index64)
        lead = (slice(None),) * axis
        if idx.ndim == 0:  # one index: a view
            at = lead + (int(pos),)
        elif idx.ndim == 1 and idx.size and bool(np.all(np.diff(pos) == 1)):  # a run: a view
            at = lead + (slice(int(pos[0]), int(pos[-1]) + 1),)
        else:
            return lambda x: np.take(x, index64, axis=axis)
        return lambda x: x[at]

    return per_shape(_gather, make)
