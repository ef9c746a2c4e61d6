"""CpuOps elementwise programs: a chain of float32 elementwise operations in one native pass
(``native/elementwise.c``) where its tensors share one shape and memory order.

Per layout of a call's operands (shapes and strides, kept per plan) each operand is a tensor
of the result's shape whose memory is runs of contiguous values at a constant stride, in the
same axis order for all (C-contiguous, NCHW views of NHWC memory as convolutions hand on,
slices of them), a vector over the channels of 4-D values ((1, C, 1, 1), (C, 1, 1) or one per
sample (N, C, 1, 1); where the channels are the memory's innermost axis), one value per
position (the result's shape but one along its innermost axis in memory: a mean or a variance
over the channels of NHWC memory, or over the rows' values of (N, L) rows, spread over them in
the pass) or one value; the result has the tensors' axis order in memory. Instructions whose operands
are all vectors or single values (a squeeze-and-excite gate's activation) run first on those
small arrays, one by one as the reference runs them; the native program takes the rest, its
values in registers allocated by their lifetimes. Any other layout, type or shape runs the
reference's numpy program.
"""

from __future__ import annotations

import math

import numpy as np

from ...native import CODES, _core

#: Most registers a native program may use (each a block of about 1024 floats per thread).
MAX_REGISTERS = 16
#: Most layouts a plan keeps.
MAX_LAYOUTS = 16
FULL, CHANNEL, SCALAR, POSITION = _core.EW_FULL, _core.EW_CHANNEL, _core.EW_SCALAR, _core.EW_POSITION


def _layout_of(operands):
    """(result shape, the layout of its memory, kind per operand) of a call, or None where the
    native pass does not take it. The layout: (axis order of the memory, outermost first;
    samples; inner values per sample; channels; each tensor operand's sample stride in floats):
    every tensor operand holds, in that order, ``samples`` runs of ``inner`` contiguous values at
    a constant stride (a C-contiguous array, NHWC memory behind an NCHW view, a slice of either);
    channel vectors run along the innermost axis of memory (axis 1 of an (N, C, ...) result:
    NCHW views of NHWC memory; (N, C) rows; (1, 1, L) over (1, C, L) rows), one per sample with
    the batch axis outermost; a position operand (the result's shape but one along that axis)
    holds a value per run of it. ``channels``: the length of that axis where either is there."""
    for o in operands:
        if type(o) is not np.ndarray or o.dtype != np.float32 or o.size == 0:
            return None
    shape = np.broadcast_shapes(*(o.shape for o in operands))
    kinds, full = [], []
    for o in operands:
        if o.size == 1:
            kinds.append(SCALAR)
        elif o.shape == shape:
            kinds.append(FULL)
            full.append(o)
        else:
            kinds.append(None)  # a vector or a value per position: known from the memory order
    if not full or any(st % 4 for o in full for st in o.strides):
        return None
    first = full[0]
    order = sorted((a for a in range(len(shape)) if shape[a] > 1), key=lambda a: -first.strides[a])
    per_sample = False
    for i, o in enumerate(operands):
        if kinds[i] is not None:
            continue
        padded = (1,) * (len(shape) - o.ndim) + o.shape
        inner_axis = order[-1] if order else -1
        if inner_axis > 0 and all(
            d == (shape[a] if a == inner_axis else 1) or (a == 0 and d == shape[0]) for a, d in enumerate(padded)
        ):
            kinds[i] = CHANNEL  # a vector along the innermost axis of memory, or one per sample
            per_sample |= padded[0] > 1
        elif _spread_over_last(o, shape, order):
            kinds[i] = POSITION
        else:
            return None
    k = 0  # order[k:]: the axes contiguous in every tensor operand
    for o in full:
        j, expect = len(order), 1
        while j > 0 and o.strides[order[j - 1]] == 4 * expect:
            expect *= shape[order[j - 1]]
            j -= 1
        k = max(k, j)
    if order and k == len(order):
        return None
    c = shape[order[-1]] if CHANNEL in kinds or POSITION in kinds else 1
    if CHANNEL in kinds:
        if per_sample:
            if order[0] != 0 or k > 1:
                return None
            k = 1
    prefix = order[:k]
    samples, inner = math.prod(shape[a] for a in prefix), math.prod(shape[a] for a in order[k:])
    strides = []
    for o in full:
        stride = o.strides[prefix[-1]] // 4 if prefix else inner
        step = stride
        for a in reversed(prefix):
            if o.strides[a] != 4 * step:
                return None
            step *= shape[a]
        strides.append(stride)
    perm = [a for a in range(len(shape)) if shape[a] == 1] + order
    return shape, (perm, samples, inner, c, strides), kinds


def _spread_over_last(o, shape, order) -> bool:
    """Whether ``o`` holds one value per position of a result of ``shape`` whose memory has the
    axes ``order`` (outermost first): the result's shape on every axis but the innermost in
    memory, one there (a statistic over the channels of NHWC memory)."""
    if len(order) < 2:
        return False
    padded = (1,) * (len(shape) - o.ndim) + o.shape
    return all(padded[a] == (1 if a == order[-1] else shape[a]) for a in range(len(shape)))


def _in_memory_order(x, perm):
    """Position operand ``x`` (a view) with its axes in the memory order ``perm`` of the result
    (the result's axes, outermost first)."""
    x = np.asarray(x, np.float32)
    return x.reshape((1,) * (len(perm) - x.ndim) + x.shape).transpose(perm)


def _positions(x, perm):
    """The values of position operand ``x`` in the memory order ``perm`` of the result,
    C-contiguous and flat: one per position."""
    return np.ascontiguousarray(_in_memory_order(x, perm)).reshape(-1)


def _registers(insns, n_operands):
    """``insns`` ((op, a, b, param) on values: the operands, then each result in turn; b -1
    for none) with their results in registers: (op, dst, a, b, param), a and b operand indices
    or the register -1 - r; and the number of registers. A register is free again after its
    value's last reader."""
    last = {}
    for k, (_, a, b, _) in enumerate(insns):
        for v in (a, b):
            if v >= n_operands:
                last[v] = k
    free, where, out, top = [], {}, [], 0
    for k, (op, a, b, param) in enumerate(insns):
        refs = [v if v < n_operands else -1 - where[v] for v in (a, b)]
        for v in {a, b}:
            if v >= n_operands and last.get(v) == k:
                free.append(where[v])
        if free:
            dst = free.pop()
        else:
            dst, top = top, top + 1
        where[n_operands + k] = dst
        out.append((op, dst, refs[0], refs[1] if b >= 0 else 0, param))
    return out, top


class _Layout:
    """The native program of one layout of a call's operands: the instructions run first
    (``hoisted``: (instruction, its value index)), the values the native pass reads
    (``sources``, with their kinds), its result's shape and memory."""

    def __init__(self, program, n_operands, shape, memory, kinds):
        perm, self.samples, self.inner, self.c, strides = memory
        self.perm = tuple(perm)
        self.memory_shape = tuple(shape[a] for a in perm)
        self.back = tuple(int(a) for a in np.argsort(perm))  # memory order -> the result's axes
        self.strides = dict(zip((k for k, kind in enumerate(kinds) if kind == FULL), strides))
        kind_of = list(kinds)
        for _, a, b, _ in program:
            used = [kind_of[v] for v in (a, b) if v >= 0]
            # a value per position with any other: the native pass's, over the whole tensor
            kind_of.append(FULL if FULL in used or POSITION in used else CHANNEL if CHANNEL in used else SCALAR)
        if kind_of[-1] != FULL:
            raise ValueError("the result is no tensor of the operands' shape")
        self.hoisted = [(insn, n_operands + k) for k, insn in enumerate(program) if kind_of[n_operands + k] != FULL]
        native = [(k, insn) for k, insn in enumerate(program) if kind_of[n_operands + k] == FULL]
        self.sources = []
        for _, (_, a, b, _) in native:
            for v in (a, b):
                if (0 <= v < n_operands or (v >= 0 and kind_of[v] != FULL)) and v not in self.sources:
                    self.sources.append(v)
        self.kinds = [kind_of[v] for v in self.sources]
        index = {v: i for i, v in enumerate(self.sources)}
        for k, _ in native:
            index[n_operands + k] = len(index)
        renamed = [(op, index[a], index[b] if b >= 0 else -1, param) for _, (op, a, b, param) in native]
        insns, registers = _registers(renamed, len(self.sources))
        if registers > MAX_REGISTERS:
            raise ValueError("too many registers")
        self.program = _core.ElementwiseProgram(
            [
                (op, dst, a, b, *(_act(param) if op == "act" else (0, 0.0)), *(param if op == "clip" else (0.0, 0.0)))
                for op, dst, a, b, param in insns
            ],
            max(registers, 1),
            len(self.sources),
        )

    def run(self, ops, operands, n_program):
        values = [*operands, *([None] * n_program)]
        for insn, v in self.hoisted:
            values[v] = ops.elementwise_step(insn, values)
        args = []
        for v, kind in zip(self.sources, self.kinds):
            x = values[v]
            if kind == FULL:
                args.append((kind, x, self.strides[v]))
            elif kind == CHANNEL:
                vec = np.ascontiguousarray(x, np.float32).reshape(-1)
                args.append((kind, vec, self.c if vec.size > self.c else 0))
            elif kind == POSITION:
                args.append((kind, _positions(x, self.perm), self.inner // self.c))
            else:
                args.append((kind, np.ascontiguousarray(x, np.float32).reshape(1), 0))
        out = np.empty(self.memory_shape, np.float32)
        self.program(self.samples, self.inner, self.c, args, out)
        return out.transpose(self.back)


def _act(param):
    name, alpha = param
    return CODES[name], float(alpha)


def native_plan(ops, program, general):
    """``run(operands)`` for CpuOps.elementwise_plan: the native pass per layout of the
    operands (kept per plan), ``general`` (the reference's run) where it does not apply."""
    program = tuple(program)
    if not program or any(op == "act" and param[0] not in CODES for op, _, _, param in program):
        return general
    layouts: dict = {}

    def run(operands):
        key = tuple((o.shape, o.strides, o.dtype.char) if type(o) is np.ndarray else None for o in operands)
        layout = layouts.get(key)
        if layout is None:
            found = _layout_of(operands)
            try:
                layout = False if found is None else _Layout(program, len(operands), *found)
            except ValueError:
                layout = False
            if len(layouts) >= MAX_LAYOUTS:
                layouts.clear()
            layouts[key] = layout
        if layout is False:
            return general(operands)
        return layout.run(ops, operands, len(program))

    return run


def plan_step(ops, program, operands, data=()):
    """The native pass of ``program`` over ``operands`` laid out as they are, for a native
    plan's step: (ElementwiseProgram, samples, inner, channels, memory shape of the result,
    the axes that give the result from it, sources), sources being (kind, operand index, None,
    stride) for each tensor operand the pass reads and for each channel vector among ``data``
    (operand indices whose values the plan computes: read per call), and (kind, None, array,
    stride) for each other vector or value (the instructions on those alone computed now, as
    ``run`` computes them per call: the caller makes sure they hold constants). None where the
    native pass does not take the program or the layout, or an instruction computed now reads
    one of ``data``."""
    program = tuple(program)
    if not program or any(op == "act" and param[0] not in CODES for op, _, _, param in program):
        return None
    found = _layout_of(operands)
    if found is None:
        return None
    try:
        layout = _Layout(program, len(operands), *found)
    except ValueError:
        return None
    data = set(data)
    reads_data = [k in data for k in range(len(operands))]
    for _, a, b, _ in program:
        reads_data.append(any(reads_data[v] for v in (a, b) if v >= 0))
    if any(reads_data[v] for _, v in layout.hoisted):
        return None
    values = [*operands, *([None] * len(program))]
    for insn, v in layout.hoisted:
        values[v] = ops.elementwise_step(insn, values)
    sources = []
    for v, kind in zip(layout.sources, layout.kinds):
        if kind == FULL:
            sources.append((kind, v, None, layout.strides[v]))
        elif kind == CHANNEL and v in data:
            sources.append((kind, v, None, layout.c if operands[v].size > layout.c else 0))
        elif kind == CHANNEL:
            vec = np.ascontiguousarray(values[v], np.float32).reshape(-1)
            sources.append((kind, None, vec, layout.c if vec.size > layout.c else 0))
        elif kind == POSITION and v in data:
            # read per call from the plan's memory of the value: its memory order must be the
            # result's (the stand-in operand is a view of that memory)
            if not _in_memory_order(operands[v], layout.perm).flags.c_contiguous:
                return None
            sources.append((kind, v, None, layout.inner // layout.c))
        elif kind == POSITION:
            sources.append((kind, None, _positions(values[v], layout.perm), layout.inner // layout.c))
        elif v in data:
            return None
        else:
            sources.append((kind, None, np.ascontiguousarray(values[v], np.float32).reshape(1), 0))
    return layout.program, layout.samples, layout.inner, layout.c, layout.memory_shape, layout.back, sources
