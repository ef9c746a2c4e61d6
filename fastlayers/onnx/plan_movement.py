"""Lowerings of data movement (reshapes as aliases, Slice, Transpose, Pad, Concat, Split,
Gather, Expand, Tile, nearest Resize): gathers whose per-axis tables come from running the node on
index arrays; copies and broadcasts of values."""

from __future__ import annotations

import math

import numpy as np

from .plan_values import MAP_READ_DTYPES, NotLowered, Value, arena_view, channels_last, gather, layout_of, operand

#: Most values of an elementwise result for which a constant operand it broadcasts (other
#: than one value) is broadcast to the result's shape at the build, as the plan's own copy.
BROADCAST_CONSTANT_MAX = 1 << 18
#: Positions of a movement's table checked at a time against its per-axis factors (``factored``).
FACTOR_BLOCK = 1 << 16
#: Operators that keep their input's memory as it is, in C order (aliases in a plan).
ALIASES = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"})
#: Types of the values a gather moves (as bits: 1, 2, 4 or 8 bytes each).
GATHER_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8)
    + (np.uint64, np.uint32, np.uint16, np.uint8, np.bool_)
)
#: Operators that move, repeat or pad values without computing (gathers in a plan).
MOVEMENTS = frozenset(
    {"Slice", "Transpose", "Pad", "Concat", "Gather", "Expand", "Tile", "Split", "DepthToSpace", "SpaceToDepth"}
)
#: Movements whose result numpy gives as a view of the input: a gather in a plan where the
#: Python plan moves the values later if at all (its consumer's copy, or strided reads); the
#: cost model counts it as a copy.
VIEWS = frozenset({"Slice", "Transpose", "Split", "Expand"})
#: Movements whose output's axes are their inputs' (held channels-last where those are).
KEEPS_AXES = frozenset({"Slice", "Pad", "Concat", "Split", "Resize", "Upsample"})


def lower_alias(low, node, ins, traced_ins, traced_outs, attrs):
    """A node whose result is its input's memory under another shape (Reshape, Squeeze, ...):
    a view of that memory. A channels-last input stays as it is held where the shapes differ
    only by axes of length 1 (a Squeeze of a 1-D convolution's width); otherwise the view is of
    its C-order form."""
    x, out = ins[0], traced_outs[0]
    if (
        not isinstance(x, Value)
        or any(isinstance(v, Value) for v in ins[1:])  # a shape computed from the data
        or not isinstance(out, np.ndarray)
        or out.dtype != x.dtype
        or out.size != x.size
    ):
        raise NotLowered
    perm = None
    if x.perm is not None:
        perm = perm_without_ones(x.shape, x.perm, out.shape)
        if perm is False:
            x = low.c_order(x)
            perm = None
    low.use(x)
    return [Value(x.buffer, x.offset, out.shape, x.dtype, perm=perm)] + [None] * (len(traced_outs) - 1)


def perm_without_ones(shape, perm, out_shape):
    """The ``perm`` (None: C order) that holds a value of ``out_shape`` in the memory of a value
    of ``shape`` held through ``perm``, where the two shapes differ only by axes of length 1
    (their other axes in the same order); False where they differ otherwise."""
    axes = [a for a in range(len(shape)) if shape[a] != 1]
    out_axes = [a for a in range(len(out_shape)) if out_shape[a] != 1]
    if [shape[a] for a in axes] != [out_shape[a] for a in out_axes]:
        return False
    to_out = dict(zip(axes, out_axes))
    # the output's axes in memory order: its axes of length 1 first, then the others in the
    # order the input's memory holds them
    memory = [a for a in range(len(out_shape)) if out_shape[a] == 1]
    memory += [to_out[a] for a in np.argsort(perm) if shape[a] != 1]
    found = tuple(int(a) for a in np.argsort(memory))
    return None if found == tuple(range(len(out_shape))) else found


def factored(table: np.ndarray):
    """Per-axis tables of source offsets whose sums give ``table`` (-1: filled), or None (a few
    arrays of a block's size at a time: tables can be large)."""
    if table.ndim > 8 or table.ndim == 0:
        return None
    lowest = int(table.min())
    if lowest < -1:  # any negative offset is a filled position
        table = np.maximum(table, -1)
    if lowest < 0:
        filled = table < 0
        if filled.all():
            return None
        found = np.where(filled, np.iinfo(table.dtype).max, table)
        p = np.unravel_index(int(np.argmin(found)), table.shape)
        del found, filled
    else:
        p = np.unravel_index(int(np.argmin(table)), table.shape)
    base = int(table[p])
    maps = []
    for a in range(table.ndim):
        index = list(p)
        index[a] = slice(None)
        line = table[tuple(index)].astype(np.int64)
        m = np.where(line < 0, -1, line - (0 if a == 0 else base))
        maps.append(m)
    # the check, a block of the leading axes' positions at a time: the trailing axes' sums once
    lead, block = 0, table.size
    while lead < table.ndim - 1 and block > FACTOR_BLOCK:
        block //= table.shape[lead]
        lead += 1
    trailing = table.shape[lead:]
    total = np.zeros(trailing, table.dtype)  # (the table's own integer type: int32 where it fits)
    hole = np.zeros(trailing, bool)
    for a, m in enumerate(maps[lead:]):
        shape = [1] * len(trailing)
        shape[a] = -1
        total += np.where(m < 0, 0, m).reshape(shape).astype(table.dtype)
        hole |= (m < 0).reshape(shape)
    total[hole] = -1
    for at in np.ndindex(*table.shape[:lead]):
        offsets = [int(maps[a][i]) for a, i in enumerate(at)]
        if min(offsets, default=0) < 0:
            if not (table[at] == -1).all():
                return None
        elif not np.array_equal(table[at], np.where(hole, -1, total + sum(offsets))):
            return None
    return maps


def lower_nearest_resize(low, node, ins, traced_ins, traced_outs, attrs):
    """Resize / Upsample in nearest mode: a data movement (``lower_movement``); linear ones blend
    values, and stay in Python."""
    if attrs["_attrs"].get("mode", "nearest") != "nearest" or isinstance(ins[0], Value) and len(ins[0].shape) < 1:
        raise NotLowered
    return lower_movement(low, node, ins, traced_ins, traced_outs, attrs, moved=(0,))  # not its scales


def kept_layout(t, sources):
    """The ``perm`` of the result ``t`` of a movement that keeps its inputs' axes: as the trace
    holds it, or channels-last where every plan value among ``sources`` is (a channel slice or
    concatenation: runs of channels)."""
    perm = layout_of(t)
    held = {v.perm for v in sources if isinstance(v, Value)}
    if perm is None and t.ndim in (3, 4) and held == {channels_last(t.ndim)}:
        perm = channels_last(t.ndim)
    return perm


def lower_concat(low, node, ins, traced_ins, traced_outs, attrs):
    """Concat as one gather per part into its block of the result, the offsets from the
    shapes alone (no index run: the detectors' (1, 32, 320, 320) results made the build's
    largest arrays); its layout ``kept_layout``'s."""
    out = traced_outs[0]
    parts = [(v, t) for v, t in zip(ins, traced_ins) if isinstance(t, np.ndarray) and t.size]
    if (
        not isinstance(out, np.ndarray)
        or out.dtype not in GATHER_DTYPES
        or not parts
        or any(t.dtype != out.dtype or t.ndim != out.ndim for _, t in parts)
        or any(isinstance(v, Value) and v.dtype != out.dtype for v, _ in parts)
    ):
        raise NotLowered
    axis = attrs["_attrs"].get("axis", 0) % out.ndim
    perm = kept_layout(out, [v for v, _ in parts])
    y = low.new(out.shape, out.dtype, perm=perm)
    y_perm = perm or tuple(range(out.ndim))
    y_strides = [math.prod(y.memory_shape[i + 1 :]) for i in range(out.ndim)]
    logical = np.argsort(y_perm)  # the logical axis of each axis of y's memory
    pieces, start = [], 0
    for v, t in parts:
        if t.shape[:axis] + t.shape[axis + 1 :] != out.shape[:axis] + out.shape[axis + 1 :]:
            raise NotLowered
        src = low.use(v) if isinstance(v, Value) else np.ascontiguousarray(t)
        src_perm = (v.perm if isinstance(v, Value) else None) or tuple(range(out.ndim))
        src_memory = tuple(t.shape[a] for a in np.argsort(src_perm))
        src_strides = [math.prod(src_memory[i + 1 :]) for i in range(out.ndim)]
        dims = [t.shape[a] for a in logical]
        maps = [np.arange(t.shape[a], dtype=np.int64) * src_strides[src_perm[a]] for a in logical]
        pieces.append((src, start * y_strides[y_perm[axis]], dims, maps))
        start += t.shape[axis]
    if start != out.shape[axis]:
        raise NotLowered

    def bind(plan, arena):
        dst = arena_view(arena, y).reshape(-1)
        for src, offset, dims, maps in pieces:
            gather(plan, operand(arena, src).reshape(-1), dst[offset:], dims, y_strides, maps)

    low.emit(bind)
    return [y]


def lower_movement(low, node, ins, traced_ins, traced_outs, attrs, moved=None):
    """Gathers for a data-movement node: the node runs on index arrays in place of its float
    inputs (each its own range of integers; for Pad a second time shifted) to find each output
    value's source; positions that no input supplies are filled with one constant."""
    fn, opset = attrs["_fn"], low.model.opset
    data = traced_ins[0].dtype if traced_ins and isinstance(traced_ins[0], np.ndarray) else None
    if data == np.float32:  # the float inputs are the data; the others (offsets, shapes) constants
        sources = [
            k
            for k, (v, t) in enumerate(zip(ins, traced_ins))
            if isinstance(t, np.ndarray)
            and t.dtype == np.float32
            and (isinstance(v, Value) or t.size)
            and (moved is None or k in moved)
        ]
        if any(isinstance(v, Value) and v.dtype != np.float32 for v in ins):
            raise NotLowered
    elif data in GATHER_DTYPES and (moved is None or 0 in moved) and node.op_type != "Concat":
        # integers, bools, quantized bytes: the first input is the data, every other a constant
        sources = [0] if isinstance(ins[0], Value) or traced_ins[0].size else []
        if any(isinstance(v, Value) for v in ins[1:]) or (isinstance(ins[0], Value) and ins[0].dtype != data):
            raise NotLowered
    else:
        raise NotLowered
    if not sources:
        raise NotLowered
    # source j's values are (j + 1) span + their offsets (+ shift in the second run): int32
    # where they fit, half the memory of int64 (the runs are the build's largest arrays)
    span = 1 << (2 * max(traced_ins[k].size for k in sources)).bit_length()
    shift = span >> 1
    dtype = np.int32 if (len(sources) + 2) * span < 1 << 31 else np.int64

    def run(offset):  # each value's offset in its source's memory (channels-last ones too)
        args = list(traced_ins)
        for j, k in enumerate(sources):
            v = ins[k]
            held = v.memory_shape if isinstance(v, Value) else traced_ins[k].shape
            index = np.arange(traced_ins[k].size, dtype=dtype)
            index += (j + 1) * span + offset
            index = index.reshape(held)
            args[k] = index.transpose(v.perm) if isinstance(v, Value) and v.perm is not None else index
        return fn(args, attrs["_attrs"], opset)

    def filled():  # the value of positions no source supplies: a run on zeros
        zeros = list(traced_ins)
        for k in sources:
            zeros[k] = np.zeros(traced_ins[k].shape, data)
        return fn(zeros, attrs["_attrs"], opset)

    # only Pad writes values no source supplies: the other movements' outputs are found by one
    # run (a second, shifted, tells Pad's filled positions apart from a fill value that looks
    # like an index)
    fills = node.op_type == "Pad"
    try:
        first = list(run(0))
        second = list(run(shift)) if fills else [None] * len(first)
    except Exception as e:  # an operator that does not take index arrays
        raise NotLowered from e
    filled_run = None
    outs = []
    for o, t in enumerate(traced_outs):  # (the runs' arrays dropped as each output is done)
        a, b, first[o], second[o] = first[o], second[o], None, None
        if t is None or not isinstance(t, np.ndarray):
            outs.append(None)
            continue
        a = np.asarray(a)
        b = None if b is None else np.asarray(b)
        if a.shape != t.shape or (b is not None and b.shape != t.shape) or t.dtype != data or a.dtype != dtype:
            raise NotLowered
        perm = kept_layout(t, [ins[k] for k in sources]) if node.op_type in KEEPS_AXES else layout_of(t)
        order = None if perm is None else np.argsort(perm)
        if order is not None:
            a = a.transpose(order)
            b = None if b is None else b.transpose(order)
        alias = _run_of_source(a, b, span, [ins[k] for k in sources], data)
        if alias is not None:  # the output is a run of one source's memory as it lies: a view
            v, start = alias
            low.use(v)
            outs.append(Value(v.buffer, v.offset + start * data.itemsize, t.shape, data, perm=perm))
            continue
        y = low.new(t.shape, data, perm=perm)
        shape = y.memory_shape
        if b is None:  # every value from a source
            copied = a >= span
            if not copied.all():
                raise NotLowered
        else:
            if b.flags.writeable and b.base is None:  # the run's own array: in place
                b -= a
            else:
                b = b - a
            copied = b == shift
        del b
        fill = 0.0
        if not copied.all():
            if filled_run is None:
                try:
                    filled_run = filled()
                except Exception as e:  # as the runs above
                    raise NotLowered from e
            z = np.asarray(filled_run[o])
            z = z if order is None else z.transpose(order)
            values = np.unique(z[~copied].astype(data))
            if values.size != 1:
                raise NotLowered
            fill = values[0].item()
        every = bool(copied.all())
        parts = []
        if len(sources) == 1 and every:  # one source supplies every value: no masks of the output's size
            parts.append((sources[0], None, 0))
        for j, k in enumerate(sources if not parts else ()):
            mine = copied & (a >= (j + 1) * span) & (a < (j + 2) * span)
            if mine.any():
                parts.append((k, mine, j))
        del copied
        if not parts:
            raise NotLowered
        c_strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))] or [1]
        pieces = []  # (source, destination offset, dims, destination strides, maps)
        if len(parts) == 1:  # the whole output: -1 (the fill) where no source value lands
            k, mine, j = parts[0]
            table = a - (j + 1) * span if mine is None else np.where(mine, a - (j + 1) * span, -1)
            del a, mine, parts
            maps = factored(table)
            if maps is None:
                pieces.append((k, 0, (table.size,), [1], [table.reshape(-1)]))
            else:
                pieces.append((k, 0, table.shape, c_strides, maps))
        else:  # each source's values fill a box of the output (Concat, Split)
            if not every:
                raise NotLowered
            for k, mine, j in parts:
                box = box_of(mine)
                inside = None if box is None else tuple(slice(s, s + d) for s, d in zip(*box))
                maps = None if box is None else factored(a[inside] - (j + 1) * span)
                if maps is None:
                    raise NotLowered
                start, dims = box
                pieces.append((k, sum(s * c for s, c in zip(start, c_strides)), dims, c_strides, maps))
        sources_of = {
            k: low.use(ins[k]) if isinstance(ins[k], Value) else np.ascontiguousarray(traced_ins[k], data)
            for k, *_ in pieces
        }

        def bind(plan, arena, y=y, pieces=pieces, sources_of=sources_of, fill=fill):
            dst = arena_view(arena, y).reshape(-1)
            for k, offset, dims, strides, maps in pieces:
                src = operand(arena, sources_of[k]).reshape(-1)
                gather(plan, src, dst[offset:], dims, strides, maps, fill)

        low.emit(bind)
        if node.op_type in VIEWS:  # numpy's result is a view: the Python plan's consumer moves it
            low.moved += 2 * t.nbytes
        outs.append(y)
    return outs


def _run_of_source(a, b, span, sources, dtype):
    """(source value, first offset) where the output's values in memory order (``a``: source
    j's offsets + (j + 1) span) are one run of consecutive values of a plan value's memory of
    ``dtype`` (a whole Slice, a Transpose that keeps memory as it lies, a Split's pieces of
    leading rows), else None; never where a fill is possible (``b``: Pad's second run)."""
    if b is not None or a.size == 0:
        return None
    flat = a.reshape(-1)
    j = int(flat[0]) // span - 1
    if not 0 <= j < len(sources) or not isinstance(sources[j], Value) or sources[j].dtype != dtype:
        return None
    start = int(flat[0]) - (j + 1) * span
    if start + flat.size > sources[j].size:
        return None
    if not np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size, dtype=flat.dtype)):
        return None
    return sources[j], start


def box_of(mask):
    """(start, dims) of the box ``mask`` fills exactly, or None (from each axis's extent: no
    index arrays of the whole mask)."""
    start, dims = [], []
    for a in range(mask.ndim):
        hit = np.flatnonzero(mask.any(axis=tuple(b for b in range(mask.ndim) if b != a)))
        if not hit.size:
            return None
        start.append(int(hit[0]))
        dims.append(int(hit[-1]) - int(hit[0]) + 1)
    if math.prod(dims) != int(np.count_nonzero(mask)):
        return None
    return tuple(start), tuple(dims)


def copied(low, source, shape, into=None) -> Value:
    """A new buffer of ``shape`` (or the value ``into``, of that shape) holding ``source`` (a
    plan value or a constant of as many values), or zeros where ``source`` is None."""
    y = low.new(shape) if into is None else low.use(into)
    low.gathered += 2 * math.prod(shape) * 4
    src = (
        low.use(source)
        if isinstance(source, Value)
        else None
        if source is None
        else np.ascontiguousarray(source, np.float32).reshape(-1)
    )
    n = math.prod(shape)

    def bind(plan, arena):
        dst = arena_view(arena, y).reshape(-1)
        if src is None:
            plan.add_gather(dst, dst, (n,), (1,), [np.full(n, -1, np.int64)], 0.0)
        else:
            plan.add_gather(operand(arena, src).reshape(-1), dst, (n,), (1,), [np.arange(n, dtype=np.int64)])

    low.emit(bind)
    return y


def broadcast(low, x: Value, shape) -> Value:
    """A new C-ordered buffer of ``shape`` holding ``x`` broadcast to it (numpy's rules: ``x``'s
    axes aligned on the right, those of length 1 repeated): one gather."""
    x = low.c_order(x)
    padded = (1,) * (len(shape) - len(x.shape)) + x.shape
    y = low.new(shape)
    low.use(x)
    low.gathered += 2 * y.size * 4
    strides = [math.prod(padded[a + 1 :]) for a in range(len(padded))]
    maps = [
        np.arange(d, dtype=np.int64) * strides[a] if padded[a] == d else np.zeros(d, np.int64)
        for a, d in enumerate(shape)
    ]

    def bind(plan, arena):
        dst = arena_view(arena, y).reshape(-1)
        gather(
            plan,
            arena_view(arena, x).reshape(-1),
            dst,
            shape,
            [math.prod(shape[a + 1 :]) for a in range(len(shape))],
            maps,
        )

    low.emit(bind)
    return y


def lower_take(low, node, ins, traced_ins, traced_outs, attrs):
    """Gather: on constant indices a data movement (``lower_movement``); on computed ones (an
    embedding lookup of token ids, a float or quantized table) the take step, which reads the
    indices per call and checks each against the axis (a call with one outside it is run by
    the Python plan, which raises the node's error)."""
    x, idx, t, out = ins[0], ins[1], traced_ins[0], traced_outs[0]
    if not isinstance(idx, Value):
        return lower_movement(low, node, ins, traced_ins, traced_outs, attrs)
    if (
        idx.dtype not in (np.int64, np.int32)
        or not isinstance(t, np.ndarray)
        or t.dtype not in MAP_READ_DTYPES
        or t.ndim == 0
        or not isinstance(out, np.ndarray)
        or out.dtype != t.dtype
    ):
        raise NotLowered
    axis = attrs["_attrs"].get("axis", 0) % t.ndim
    outer, n, run = math.prod(t.shape[:axis]), t.shape[axis], math.prod(t.shape[axis + 1 :])
    if n == 0 or outer * idx.size * run != out.size:
        raise NotLowered
    src = low.use(low.c_order(x)) if isinstance(x, Value) else np.ascontiguousarray(t).reshape(-1)
    y = low.new(out.shape, out.dtype)
    low.use(idx)

    def bind(plan, arena):
        source = arena_view(arena, src).reshape(-1) if isinstance(src, Value) else src
        plan.add_take(source, arena_view(arena, idx).reshape(-1), arena_view(arena, y).reshape(-1), outer, n, run)

    low.emit(bind)
    return [y]
