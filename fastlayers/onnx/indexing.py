"""ONNX indexing, scatter, selection and rearrangement operators on numpy, a family of operator
records (``records.py``; ``ops.RECORDS`` gathers the families).

Index values come from the data of a call: each operator checks them against the axis they
address (negative values count from the end where the operator allows it) and raises an
``InputError`` for one out of range; the interpreter names the node. Outputs whose size the
values (not the shapes of the inputs) set are checked with ``tensors.created`` first.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .. import limits
from ..errors import InputError, ShapeError
from .records import AXIS, BOOL, INT, POS, STRING, A, Family, fail
from .tensors import DTYPES, created

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("indexing")
op = FAMILY.op


def _scalar_int(value, what: str) -> int:
    """The one integer a scalar or one-element input holds."""
    value = np.asarray(value)
    if value.size != 1:
        raise ShapeError(f"{what} must hold one value, holds {value.size} (shape {value.shape})")
    return int(value.reshape(-1)[0])


def _checked_indices(idx, size, what: str):
    """``idx`` as int64 with negative values counted from the end of an axis of ``size``;
    an InputError for any outside [-size, size)."""
    idx = np.asarray(idx).astype(np.int64, copy=False)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        bad = idx[(idx < -size) | (idx >= size)].reshape(-1)[0]
        raise InputError(f"{what}: index {int(bad)} is out of range for an axis of size {size}")
    return np.where(idx < 0, idx + size, idx)


def _axis(axis, rank, what: str) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{what}: axis {axis} for an input of rank {rank}")
    return axis % rank


# ----------------------------------------------------------------------------- gather, scatter
def _nd_index(data_shape, indices, batch_dims, what):
    """GatherND / ScatterND addressing: (batch row of each index tuple, the index tuples as
    columns, the shape of the addressed slices); ``indices``: (*batch, *m, k)."""
    if indices.ndim < 1:
        raise ShapeError(f"{what}: indices must have rank >= 1, got a scalar")
    k = indices.shape[-1]
    rank = len(data_shape)
    if batch_dims < 0 or batch_dims >= min(rank, indices.ndim):
        raise ShapeError(f"{what}: batch_dims {batch_dims} for data of rank {rank} and indices of rank {indices.ndim}")
    if tuple(indices.shape[:batch_dims]) != tuple(data_shape[:batch_dims]):
        raise ShapeError(
            f"{what}: the batch dimensions of indices {indices.shape[:batch_dims]} "
            f"and data {tuple(data_shape[:batch_dims])} differ"
        )
    if k < 1 or k > rank - batch_dims:
        raise ShapeError(
            f"{what}: index tuples of length {k} for data of rank {rank} with {batch_dims} batch dimension(s)"
        )
    batch = math.prod(data_shape[:batch_dims])
    flat = indices.reshape(batch, math.prod(indices.shape[batch_dims:-1]), k)
    columns = [_checked_indices(flat[..., j], data_shape[batch_dims + j], what) for j in range(k)]
    rows = np.arange(batch, dtype=np.int64)[:, None]
    return rows, columns, tuple(data_shape[batch_dims + k :])


@op("GatherND", inputs=(2, 2), attrs={"batch_dims": A(INT, 0, limits.ONNX_MAX_RANK)})
def _gather_nd(inputs, attrs, opset):
    """y[b, m] = data[b, indices[b, m, 0], ..., indices[b, m, k-1]] (b: the batch_dims axes)."""
    data, indices = inputs
    b = attrs.get("batch_dims", 0)
    rows, columns, tail = _nd_index(data.shape, indices, b, "GatherND")
    created(indices.shape[:-1] + tail, data.dtype, "GatherND")
    flat = data.reshape((rows.shape[0],) + data.shape[b:]) if b else data[None]
    return [flat[(rows, *columns)].reshape(indices.shape[:-1] + tail)]


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out, where, updates, reduction):
    """out[where] = updates, or combined with what is there by ``reduction`` (each duplicate
    index applied in turn)."""
    if reduction in ("none", None):
        out[where] = updates
    else:
        _REDUCTIONS[reduction].at(out, where, updates)
    return out


_REDUCTION = A(STRING, choices=("none", "add", "mul", "max", "min"))


@op("ScatterND", inputs=(3, 3), attrs={"reduction": _REDUCTION})
def _scatter_nd(inputs, attrs, opset):
    """y = data; y[indices[m]] (reduction)= updates[m] for each index tuple m."""
    data, indices, updates = inputs
    rows, columns, tail = _nd_index(data.shape, indices, 0, "ScatterND")
    want = indices.shape[:-1] + tail
    if updates.shape != want:
        raise ShapeError(
            f"ScatterND: updates of shape {updates.shape} for indices of shape "
            f"{indices.shape} into data of shape {data.shape} (expected {want})"
        )
    out = np.array(data, copy=True)
    m = math.prod(indices.shape[:-1])
    where = tuple(c.reshape(-1) for c in columns)
    return [
        _scatter(out, where, updates.reshape((m,) + tail).astype(out.dtype, copy=False), attrs.get("reduction", "none"))
    ]


@op("ScatterElements", inputs=(3, 3), attrs={"axis": AXIS, "reduction": _REDUCTION})
def _scatter_elements(inputs, attrs, opset):
    """y = data; y[..., indices[i, j, ...], ...] (reduction)= updates[i, j, ...] on ``axis``."""
    data, indices, updates = inputs
    axis = _axis(attrs.get("axis", 0), data.ndim, "ScatterElements")
    if (
        indices.shape != updates.shape
        or indices.ndim != data.ndim
        or any(i > d for k, (i, d) in enumerate(zip(indices.shape, data.shape)) if k != axis)
    ):
        raise ShapeError(
            f"ScatterElements: indices {indices.shape} and updates {updates.shape} "
            f"do not fit data of shape {data.shape} on axis {axis}"
        )
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = _checked_indices(indices, data.shape[axis], "ScatterElements")
    out = np.array(data, copy=True)
    return [_scatter(out, tuple(grid), updates.astype(out.dtype, copy=False), attrs.get("reduction", "none"))]


FAMILY.add("Scatter", _scatter_elements, inputs=(3, 3), attrs={"axis": AXIS})


@op("Compress", inputs=(2, 2), attrs={"axis": AXIS})
def _compress(inputs, attrs, opset):
    """The slices of the input (flattened without an axis) where the condition is true."""
    x, condition = inputs
    condition = np.asarray(condition).reshape(-1).astype(bool)
    axis = attrs.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim, "Compress")
    if condition.size > x.shape[axis]:
        raise ShapeError(f"Compress: a condition of {condition.size} values for an axis of {x.shape[axis]}")
    return [np.compress(condition, x, axis=axis)]


@op("NonZero")
def _nonzero(inputs, attrs, opset):
    """The indices of the non-zero elements, one row per axis: (rank, count), int64."""
    x = np.asarray(inputs[0])
    return [np.array(np.nonzero(x.reshape(1) if x.ndim == 0 else x), dtype=np.int64)]


@op("OneHot", inputs=(3, 3), attrs={"axis": AXIS})
def _one_hot(inputs, attrs, opset):
    """y[..., i, ...] = on where indices == i (indices < 0 count from depth), else off."""
    indices, depth, values = inputs
    depth = _scalar_int(depth, "OneHot depth")
    values = np.asarray(values).reshape(-1)
    if depth < 1 or values.size != 2:
        raise ShapeError(f"OneHot: depth {depth} (>= 1) and values of {values.size} elements (2)")
    rank = indices.ndim + 1
    axis = attrs.get("axis", -1)
    if not -rank <= axis < rank:
        raise ShapeError(f"OneHot: axis {axis} for an output of rank {rank}")
    axis %= rank
    created(indices.shape[:axis] + (depth,) + indices.shape[axis:], values.dtype, "OneHot")
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape((-1,) + (1,) * (rank - 1 - axis))
    return [np.where(hot, values[1], values[0])]


def _eye_like_check(node, attrs, ctx):
    if "dtype" in attrs and attrs["dtype"] not in DTYPES:
        fail(ctx, node, f"EyeLike of ONNX element type {attrs['dtype']} is not supported", unsupported=True)


@op("EyeLike", attrs={"dtype": A(INT), "k": A(INT)}, check=_eye_like_check)
def _eye_like(inputs, attrs, opset):
    """Ones on diagonal k of a 2-D shape, zeros elsewhere, of ``dtype`` (else the input's)."""
    x = inputs[0]
    if x.ndim != 2:
        raise ShapeError(f"EyeLike: the input must be 2-D, got shape {x.shape}")
    dtype = DTYPES[attrs["dtype"]] if "dtype" in attrs else x.dtype
    return [np.eye(x.shape[0], x.shape[1], attrs.get("k", 0), dtype=dtype)]


# ------------------------------------------------------------------------- ordering, scans
def _top_k_check(node, attrs, ctx):
    if ctx.opset < 10 and "k" not in attrs:
        fail(ctx, node, "needs attribute 'k' (opset < 10)")
    if ctx.opset >= 10 and (len(node.inputs) < 2 or not node.inputs[1]):
        fail(ctx, node, "needs input 'K' (opset >= 10)")


@op(
    "TopK",
    inputs=(1, 2),
    outputs=2,
    check=_top_k_check,
    attrs={"axis": AXIS, "k": A(INT, 0), "largest": BOOL, "sorted": BOOL},
)
def _top_k(inputs, attrs, opset):
    """The k largest (smallest) values on ``axis`` and their indices, in order; of equal
    values the one with the lower index comes first."""
    x = inputs[0]
    k = _scalar_int(inputs[1], "TopK K") if opset >= 10 else attrs["k"]
    axis = _axis(attrs.get("axis", -1), x.ndim, "TopK")
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise InputError(f"TopK: k {k} for an axis of size {n}")
    if attrs.get("largest", 1):
        # a stable ascending sort of the reversed axis, read backwards: descending values,
        # ties in ascending index order (no negation: exact for unsigned and extreme ints)
        order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        idx = (n - 1) - np.flip(order, axis)
    else:
        idx = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


@op("CumSum", inputs=(2, 2), attrs={"exclusive": BOOL, "reverse": BOOL})
def _cum_sum(inputs, attrs, opset):
    """y[i] = sum of x[j] for j <= i (j < i: exclusive; j >= i / j > i: reverse) on the axis."""
    x = inputs[0]
    axis = _axis(_scalar_int(inputs[1], "CumSum axis"), x.ndim, "CumSum")
    reverse = attrs.get("reverse", 0)
    y = np.flip(x, axis) if reverse else x
    y = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0) and y.shape[axis]:
        y = np.concatenate(
            [np.zeros_like(np.take(y, [0], axis=axis)), np.take(y, np.arange(y.shape[axis] - 1), axis=axis)], axis=axis
        )
    return [np.flip(y, axis) if reverse else y]


_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def einsum_terms(equation: str, count: int) -> tuple[list[str], str | None]:
    """(the input terms, the output term or None without '->') of an Einsum ``equation`` for
    ``count`` inputs: letters, at most one '...' per term, ',' between the input terms, at
    most one '->', each output letter once and from an input; a ShapeError for any other."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != count or "->" in rhs or not all(_TERM.match(t) and t.count("...") <= 1 for t in terms + [rhs]):
        raise ShapeError(
            f"Einsum: malformed equation {equation[:80]!r} for {count} inputs "
            "(letters, at most one '...' per term, one ',' between terms, one '->')"
        )
    letters = rhs.replace("...", "")
    if arrow and (len(set(letters)) != len(letters) or not set(letters) <= set(lhs)):
        raise ShapeError(f"Einsum: output term {rhs!r} of {equation[:80]!r} (each letter once, each from an input)")
    return terms, rhs if arrow else None


def _einsum_shape(equation, operands):
    """The output shape of ``equation`` on ``operands``; ShapeError for a malformed equation
    or operands it does not fit."""
    terms, rhs = einsum_terms(equation, len(operands))
    sizes: dict[str, int] = {}
    ellipsis: tuple = ()
    for term, x in zip(terms, operands):
        letters = term.replace("...", "")
        rest = x.ndim - len(letters)
        if rest < 0 or (rest and "..." not in term):
            raise ShapeError(f"Einsum: term {term!r} for an input of shape {x.shape}")
        at = term.find("...")
        dims = list(x.shape)
        if "..." in term:
            ellipsis = np.broadcast_shapes(ellipsis, tuple(dims[at : at + rest]))
            dims = dims[:at] + dims[at + rest :]
        for letter, d in zip(letters, dims):
            if sizes.setdefault(letter, d) != d:
                raise ShapeError(f"Einsum: {letter!r} is {sizes[letter]} and {d} in {equation[:80]!r}")
    if rhs is not None:
        dims = [sizes[c] for c in rhs.replace("...", "")]
        at = rhs.find("...")
        return tuple(dims[:at] + list(ellipsis) + dims[at:]) if at >= 0 else tuple(dims)
    counts = {c: "".join(terms).count(c) for c in sizes}
    return tuple(ellipsis) + tuple(sizes[c] for c in sorted(sizes) if counts[c] == 1)


def _einsum_check(node, attrs, ctx):
    try:
        einsum_terms(attrs["equation"], len(node.inputs))
    except ShapeError as e:
        fail(ctx, node, str(e))


@op(
    "Einsum",
    inputs=(1, None),
    optional=None,
    attrs={"equation": A(STRING)},
    required=("equation",),
    check=_einsum_check,
)
def _einsum(inputs, attrs, opset):
    """Sums of products over the letters the equation contracts (numpy's einsum)."""
    equation = attrs["equation"]
    shape = _einsum_shape(equation, inputs)
    created(shape, np.result_type(*inputs), "Einsum")
    return [np.asarray(np.einsum(equation.replace(" ", ""), *inputs, optimize=len(inputs) > 2))]


# ------------------------------------------------------------------------------ rearrangement
_BLOCK_MODE = A(STRING, choices=("DCR", "CRD"))


@op("DepthToSpace", attrs={"blocksize": POS, "mode": _BLOCK_MODE}, required=("blocksize",))
def _depth_to_space(inputs, attrs, opset):
    """(N, C*b*b, H, W) -> (N, C, H*b, W*b); DCR: depth ordered (b, b, C), CRD: (C, b, b)."""
    x, b = inputs[0], attrs["blocksize"]
    if x.ndim != 4 or x.shape[1] % (b * b):
        raise ShapeError(
            f"DepthToSpace: blocksize {b} for an input of shape {x.shape} (4-D, channels a multiple of blocksize^2)"
        )
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


@op("SpaceToDepth", attrs={"blocksize": POS, "mode": _BLOCK_MODE}, required=("blocksize",))
def _space_to_depth(inputs, attrs, opset):
    """(N, C, H*b, W*b) -> (N, C*b*b, H, W); DCR: depth ordered (b, b, C), CRD: (C, b, b)."""
    x, b = inputs[0], attrs["blocksize"]
    if x.ndim != 4 or x.shape[2] % b or x.shape[3] % b:
        raise ShapeError(
            f"SpaceToDepth: blocksize {b} for an input of shape {x.shape} (4-D, "
            "height and width multiples of blocksize)"
        )
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return [y.reshape(n, c * b * b, h // b, w // b)]


@op("ReverseSequence", inputs=(2, 2), attrs={"batch_axis": A(INT, 0, 1), "time_axis": A(INT, 0, 1)})
def _reverse_sequence(inputs, attrs, opset):
    """Along time_axis, the first sequence_lens[b] elements of each batch entry b reversed,
    the rest kept."""
    x, lengths = inputs
    t_axis, b_axis = attrs.get("time_axis", 0), attrs.get("batch_axis", 1)
    if x.ndim < 2 or {t_axis, b_axis} != {0, 1}:
        raise ShapeError(
            f"ReverseSequence: time_axis {t_axis} and batch_axis {b_axis} (0 and 1) for an input of shape {x.shape}"
        )
    lengths = np.asarray(lengths).astype(np.int64).reshape(-1)
    steps, batch = x.shape[t_axis], x.shape[b_axis]
    if lengths.size != batch or (lengths.size and (lengths.min() < 0 or lengths.max() > steps)):
        raise InputError(
            f"ReverseSequence: sequence_lens {lengths[:8].tolist()} for {batch} sequences of {steps} steps"
        )
    t = np.arange(steps)[:, None]
    source = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)  # (time, batch)
    xt = x if t_axis == 0 else np.swapaxes(x, 0, 1)
    y = xt[source, np.arange(batch)[None, :]]
    return [y if t_axis == 0 else np.swapaxes(y, 0, 1)]


@op("Hardmax", attrs={"axis": AXIS})
def _hardmax(inputs, attrs, opset):
    """1 at the first maximum along the axis (opsets < 13: of the input coerced to 2-D at
    the axis), 0 elsewhere."""
    x = inputs[0]
    if opset >= 13:
        axis = _axis(attrs.get("axis", -1), x.ndim, "Hardmax")
        idx = np.expand_dims(np.argmax(x, axis=axis), axis)
        y = np.zeros_like(x)
        np.put_along_axis(y, idx, 1, axis=axis)
        return [y]
    axis = _axis(attrs.get("axis", 1), x.ndim, "Hardmax")
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return [_hardmax([flat], {"axis": -1}, 13)[0].reshape(x.shape)]
