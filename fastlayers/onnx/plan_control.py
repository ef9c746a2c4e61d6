"""Loop and Scan nodes lowered into a native plan: the body's steps are bound once, into a
step list of their own, and one loop step (``plan.h``'s loop_step) runs them per iteration,
with the copies that carry values between iterations, slice the scanned inputs and stack
the per-iteration outputs. The body is lowered by walking it once on the first iteration's
traced values (``lowering._walk``, passed in as ``walk``), as an If's taken branch is.

The body's own inputs are values the loop step writes: the iteration number (a Loop's first
input), the carried values, a Scan's slices. Its condition input is true whenever the body
runs, so it is a constant. What the body reads from the enclosing graph (its captures) and
the body's outputs live across the whole loop (``_close``): no value of one iteration may
take their memory. A Loop whose stacked outputs would hold another number of iterations
than the trace's, or that reaches the iteration limit of a loop whose length the file sets,
fails the step with a status that sends the call to the Python plan (``OTHER_SHAPES``: the
key's plan is dropped; ``LOOP_LIMIT``: the Python plan raises the limit's error).

Lowered natively: scanned inputs and stacked outputs on any axis and in either direction
(those on another axis than 0 moved to axis 0 before the loop, or from it after), carried
values of fixed shapes, and a trace that ran at least one iteration. Anything else runs the
node in Python inside the plan (``NotLowered``).
"""

from __future__ import annotations

import math

import numpy as np

from .. import settings
from .control import Body
from .plan_values import LOOP_ITERATIONS_GUESS, NotLowered, Value, arena_view, transposed


def _one(t, dtype) -> bool:
    """Whether the traced value ``t`` is one value of type ``dtype``."""
    return isinstance(t, np.ndarray) and t.dtype == dtype and t.size == 1


def _array(v, t):
    """A loop operand: the plan value ``v``, or the traced constant ``t`` held C-contiguous."""
    return v if isinstance(v, Value) else np.ascontiguousarray(t)


def _view(arena, v, index=None):
    """The memory of a loop operand (``_array``), or of its ``index``-th slice on axis 0."""
    a = arena_view(arena, v) if isinstance(v, Value) else v
    return a if index is None else a[index]


def _walk_body(low, walk, body: Body, own, captures):
    """The body of a loop walked once on the first iteration: ``own`` and ``captures`` its
    inputs as (traced array, plan value or None). Returns its outputs (traced, plan value or
    None), the steps it emitted (taken out of the enclosing plan's) and the first step of
    the loop."""
    start = low.step
    emits, nodes, left, c_added = len(low.emits), len(low.nodes), low.left, len(low.c_added)
    native, fallbacks = len(low.native), len(low.fallbacks)
    try:
        outputs = walk(low, body.model, list(own) + list(captures))
        # the outputs in C order, by steps of the body
        outputs = [(t, low.use(low.c_order(v)) if isinstance(v, Value) else v) for t, v in outputs]
    except BaseException:  # the steps and buffers begun are dropped with the node's (``_walk``)
        del low.nodes[nodes:]
        low.left = left
        raise
    body_emits = low.emits[emits:]
    del low.emits[emits:], low.nodes[nodes:]
    # C-order copies made inside the body are not there for the nodes after the loop
    for key in low.c_added[c_added:]:
        del low.c_forms[key]
    del low.c_added[c_added:]
    low.left = left
    return outputs, body_emits, start, (len(low.native) - native, len(low.fallbacks) - fallbacks)


def _close(low, start, iterations, body_nodes):
    """The loop's memory and cost, once its body is walked from step ``start``: every buffer
    live when the loop starts (what the body reads from outside, the body's inputs, the
    loop's stacks) lives until its end, and the plan copies those from outside rather than
    reading the caller's arrays in place (the body's steps are not the plan's own)."""
    low.step += 1
    end = low.step
    for b in low.buffers:
        if b.first <= start <= b.last:
            b.last = max(b.last, end)
            low.python_reads.add(id(b))
    native, fallbacks = body_nodes  # each runs once per iteration
    low.repeated[0] += native * (max(iterations, 1) - 1)
    low.repeated[1] += fallbacks * (max(iterations, 1) - 1)


def _carried(low, outs, ins_here):
    """The after-iteration copies of carried values: each body output in ``outs`` (traced,
    plan value or None) to its body input in ``ins_here`` (a plan value); an output held in
    another carried input's memory (``b = a`` of the iteration before) goes through a buffer
    of its own first, copied before any carried input is replaced. Raises NotLowered for a
    value whose shape or type changes."""
    staged, copies = [], []
    buffers = {id(v.buffer): k for k, v in enumerate(ins_here)}
    for k, ((t, v), into) in enumerate(zip(outs, ins_here)):
        t = np.asarray(t)
        if t.shape != into.shape or t.dtype != into.dtype:
            raise NotLowered
        if isinstance(v, Value):
            held = buffers.get(id(v.buffer))
            if held is not None and (held != k or v.offset != into.offset):
                stage = low.new(t.shape, t.dtype)
                staged.append((v, None, stage, None, 0, 0))
                v = stage
        copies.append((_array(v, t), None, into, None, 0, 0))
    return staged + copies


def _stacks(low, t_stacks):
    """The values that stack a loop's per-iteration outputs on axis 0, as traced in
    ``t_stacks`` (made before the body is walked: the loop writes them at every iteration)."""
    if any(not isinstance(s, np.ndarray) or s.ndim < 1 or s.shape[0] < 1 for s in t_stacks):
        raise NotLowered
    return [low.new(s.shape, s.dtype) for s in t_stacks]


def _stacked(outs, stacks):
    """(source operand, stack) per per-iteration output in ``outs`` (traced, plan value or
    None), its shape and type checked against its stack's."""
    found = []
    for (t, v), stack in zip(outs, stacks):
        t = np.asarray(t)
        if stack.shape[1:] != t.shape or stack.dtype != t.dtype:
            raise NotLowered
        found.append((_array(v, t), stack))
    return found


def _emit(low, body_emits, trips, cond, cond_out, counter, most, expect, init, before, after):
    """The loop step, bound once placed: ``init`` / ``before`` / ``after`` copies as
    (source operand, its slice index or None, destination, its slice index or None, source
    step, destination step), operands as ``_array`` gives them."""

    def bind(plan, arena):
        sub = low.ops.native_plan(0)
        for fn, _ in body_emits:
            fn(sub, arena)

        def copies(specs):
            return [(_view(arena, s, si), _view(arena, d, di), ss, ds) for s, si, d, di, ss, ds in specs]

        plan.add_loop(
            sub,
            None if trips is None else _view(arena, trips).reshape(1),
            None if cond is None else _view(arena, cond).reshape(1),
            None if cond_out is None else _view(arena, cond_out).reshape(1),
            None if counter is None else _view(arena, counter).reshape(1),
            most,
            expect,
            copies(init),
            copies(before),
            copies(after),
        )

    low.emit(bind)


def _lowered(low, build):
    """``build()``'s result, where the names of the body's nodes it counts as native or
    Python are dropped again should it raise ``NotLowered`` (the node then runs in Python,
    and ``lowering._walk`` drops the steps and buffers it began)."""
    native, fallbacks, repeated = len(low.native), len(low.fallbacks), list(low.repeated)
    try:
        return build()
    except NotLowered:
        del low.native[native:], low.fallbacks[fallbacks:]
        low.repeated = repeated
        raise


def lower_loop(low, node, ins, traced_ins, traced_outs, attrs, walk):
    """Loop: for i < M while cond: cond, carried..., scans... = body(i, cond, carried...)."""
    return _lowered(low, lambda: _loop(low, ins, traced_ins, traced_outs, attrs["_attrs"], walk))


def _loop(low, ins, traced_ins, traced_outs, node_attrs, walk):
    """``lower_loop``."""
    body, formal = node_attrs.get("body"), node_attrs["_formal"]
    if not isinstance(body, Body):
        raise NotLowered
    t_trips, t_cond = (None if t is None else np.asarray(t) for t in traced_ins[:2])
    n = formal - 2
    t_init, v_init = traced_ins[2:formal], ins[2:formal]
    if (t_trips is not None and not _one(t_trips, np.int64)) or (t_cond is not None and not _one(t_cond, np.bool_)):
        raise NotLowered
    # the trace ran the body at least once: its first iteration is the one lowered
    if (t_trips is not None and int(t_trips.reshape(-1)[0]) <= 0) or (t_cond is not None and not t_cond.any()):
        raise NotLowered
    if any(not isinstance(t, np.ndarray) for t in t_init):
        raise NotLowered
    stacks = _stacks(low, traced_outs[n:])
    expect = stacks[0].shape[0] if stacks else -1
    counter = low.new((), np.int64)
    carried = [low.new(t.shape, t.dtype) for t in t_init]
    for v in (ins[0], ins[1], *v_init):
        low.use(v)
    own = [(np.array(0, np.int64), counter), (np.array(True), None), *zip(t_init, carried)]
    captures = list(zip(traced_ins[formal:], ins[formal:]))
    outs, body_emits, start, body_nodes = _walk_body(low, walk, body, own, captures)
    (t_cond_out, cond_out), carried_outs, scan_outs = outs[0], outs[1 : 1 + n], outs[1 + n :]
    if not _one(np.asarray(t_cond_out), np.bool_):
        raise NotLowered
    if not isinstance(cond_out, Value):  # a constant: true runs on, false stops after one iteration
        cond_out = None if np.asarray(t_cond_out).any() else np.zeros(1, np.bool_)
    init = [(_array(v, t), None, into, None, 0, 0) for v, t, into in zip(v_init, t_init, carried)]
    # the stacks first: an output that is a carried input's value is read before it is replaced
    after = [
        (src, None, stack, 0, 0, math.prod(stack.shape[1:]) * stack.dtype.itemsize)
        for src, stack in _stacked(scan_outs, stacks)
    ]
    after += _carried(low, carried_outs, carried)
    most = settings.current().onnx_max_loop_iterations if node_attrs.get("_bounded", True) else -1
    trips = None if t_trips is None else _array(ins[0], t_trips)
    cond = ins[1] if isinstance(ins[1], Value) else None  # a constant condition is true here
    _close(low, start, expect if expect > 0 else LOOP_ITERATIONS_GUESS, body_nodes)
    _emit(low, body_emits, trips, cond, cond_out, counter, most, expect, init, [], after)
    return carried + stacks


def lower_scan(low, node, ins, traced_ins, traced_outs, attrs, walk):
    """Scan: states..., outs... = body(states..., slices at t...) for t along the scan axis of
    each scanned input, in its direction; the per-iteration outputs stacked on their axes."""
    return _lowered(low, lambda: _scan(low, ins, traced_ins, traced_outs, attrs["_attrs"], walk))


def _scan(low, ins, traced_ins, traced_outs, node_attrs, walk):
    """``lower_scan``."""
    body, formal, m = node_attrs.get("body"), node_attrs["_formal"], node_attrs["num_scan_inputs"]
    if not isinstance(body, Body):
        raise NotLowered
    n = formal - m
    k = len(traced_outs) - n
    in_dirs = list(node_attrs.get("scan_input_directions") or [0] * m)
    out_dirs = list(node_attrs.get("scan_output_directions") or [0] * k)
    t_states, t_scanned = traced_ins[:n], list(traced_ins[n:formal])
    if any(not isinstance(t, np.ndarray) or t.ndim < (1 if j >= n else 0) for j, t in enumerate(traced_ins[:formal])):
        raise NotLowered
    in_axes = [a % t.ndim for a, t in zip(node_attrs.get("scan_input_axes") or [0] * m, t_scanned)]
    t_outs = traced_outs[n:]
    if any(not isinstance(t, np.ndarray) or t.ndim < 1 for t in t_outs):
        raise NotLowered
    out_axes = [a % t.ndim for a, t in zip(node_attrs.get("scan_output_axes") or [0] * k, t_outs)]
    length = t_scanned[0].shape[in_axes[0]]
    if length < 1:
        raise NotLowered
    for v in ins[:formal]:
        low.use(v)
    # scanned inputs on another axis than 0: moved to axis 0 first (the stacks moved after)
    scanned = list(ins[n:formal])
    for j, a in enumerate(in_axes):
        if a:
            perm = [a, *(d for d in range(t_scanned[j].ndim) if d != a)]
            scanned[j] = transposed(low, scanned[j], perm) if isinstance(scanned[j], Value) else None
            t_scanned[j] = np.ascontiguousarray(np.moveaxis(t_scanned[j], a, 0))
    stacks = _stacks(low, [np.moveaxis(t, a, 0) for t, a in zip(t_outs, out_axes)])
    states = [low.new(t.shape, t.dtype) for t in t_states]
    slices = [low.new(t.shape[1:], t.dtype) for t in t_scanned]
    first = [t[length - 1 if d else 0] for t, d in zip(t_scanned, in_dirs)]
    own = [*zip(t_states, states), *zip(first, slices)]
    captures = list(zip(traced_ins[formal:], ins[formal:]))
    outs, body_emits, start, body_nodes = _walk_body(low, walk, body, own, captures)
    init = [(_array(v, t), None, into, None, 0, 0) for v, t, into in zip(ins[:n], t_states, states)]
    before = []
    for v, t, into, d in zip(scanned, t_scanned, slices, in_dirs):
        step = math.prod(t.shape[1:]) * t.dtype.itemsize
        before.append((_array(v, t), length - 1 if d else 0, into, None, -step if d else step, 0))
    after = []
    for (src, stack), d in zip(_stacked(outs[n:], stacks), out_dirs):
        step = math.prod(stack.shape[1:]) * stack.dtype.itemsize
        after.append((src, None, stack, length - 1 if d else 0, 0, -step if d else step))
    after += _carried(low, outs[:n], states)
    _close(low, start, length, body_nodes)
    _emit(low, body_emits, np.array([length], np.int64), None, None, None, -1, length, init, before, after)
    moved = [
        transposed(low, stack, [*range(1, a + 1), 0, *range(a + 1, stack_ndim)]) if a else stack
        for stack, a, stack_ndim in zip(stacks, out_axes, (len(x.shape) for x in stacks))
    ]
    return states + moved


def lower_if(low, node, ins, traced_ins, traced_outs, attrs, walk):
    """If on a condition computed per call: both branches bound, each run by a loop step of
    at most one iteration (the then branch where the condition holds, the else branch where
    its negation does), each copying its outputs into the If's."""
    return _lowered(low, lambda: _if(low, ins, traced_ins, traced_outs, attrs["_attrs"], walk))


def _if(low, ins, traced_ins, traced_outs, node_attrs, walk):
    """``lower_if``."""
    branches = [node_attrs.get("then_branch"), node_attrs.get("else_branch")]
    cond = ins[0]
    if (
        not all(isinstance(b, Body) for b in branches)
        or not isinstance(cond, Value)
        or not _one(np.asarray(traced_ins[0]), np.bool_)
        or any(not isinstance(t, np.ndarray) for t in traced_outs)
    ):
        raise NotLowered
    formal = node_attrs["_formal"]
    captures = list(zip(traced_ins[formal:], ins[formal:]))
    results = [low.new(t.shape, t.dtype) for t in traced_outs]
    negated = low.new((), np.bool_)
    for v in ins:
        low.use(v)
    walked = []
    for branch in branches:
        try:  # the branch the trace did not take runs here on values it may not be made for
            outs, body_emits, start, counts = _walk_body(low, walk, branch, [], captures)
        except NotLowered:
            raise
        except Exception:  # noqa: BLE001 - any failure of it keeps the If in Python
            raise NotLowered from None
        copies = []
        for (t, v), into in zip(outs, results):
            t = np.asarray(t)
            if t.shape != into.shape or t.dtype != into.dtype:
                raise NotLowered
            copies.append((_array(v, t), None, into, None, 0, 0))
        walked.append((body_emits, start, copies, counts))
    _close(low, walked[0][1], 1, (0, 0))
    # one branch runs per call: the cost model counts the nodes of the larger one
    low.repeated[0] -= min(walked[0][3][0], walked[1][3][0])
    low.repeated[1] -= min(walked[0][3][1], walked[1][3][1])
    once = np.ones(1, np.int64)
    (then_emits, _, then_copies, _), (else_emits, _, else_copies, _) = walked
    _emit(low, then_emits, once, cond, None, None, -1, -1, [], [], then_copies)

    def bind(plan, arena):
        plan.add_map("not", arena_view(arena, negated).reshape(1), [arena_view(arena, cond).reshape(1)], [1], [[1]])

    low.emit(bind)
    _emit(low, else_emits, once, negated, None, None, -1, -1, [], [], else_copies)
    return results
