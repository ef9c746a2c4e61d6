"""Lowerings of products: batched matmuls, dense layers and chains, fused attention, layer
norms, the recurrent layers (float and int8, one direction and both) and their states."""

from __future__ import annotations

import math

import numpy as np

from ..backends.types import Cell
from .ops.linear import one_hot_table
from .ops.recurrent import masked_calls, recurrent_calls
from .plan_elementwise import map_step
from .plan_movement import copied
from .plan_values import NotLowered, Value, arena_view, operand, transposed
from .qlinear import dynamic_matmul_constants
from .qlstm import direction_constants


def lower_batched_matmul(low, node, ins, traced_ins, traced_outs, attrs):
    """MatMul of two values of at least 2 axes, computed or constant, their leading axes all
    alike or one operand's all 1 (shared), as the cpu backend's batched product runs it."""
    a, b, out = ins[0], ins[1], traced_outs[0]
    ta, tb = traced_ins[0], traced_ins[1]
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or not all(isinstance(t, np.ndarray) and t.dtype == np.float32 and t.ndim >= 2 and t.size for t in (ta, tb))
        or ta.shape[-1] != tb.shape[-2]
    ):
        raise NotLowered
    m, n = ta.shape[-2], tb.shape[-1]
    lead = out.shape[:-2]
    batch = math.prod(lead)
    operands = []
    for v, t in ((a, ta), (b, tb)):
        size = math.prod(t.shape[:-2])
        if size not in (1, batch) or (size == batch and (1,) * (len(lead) - t.ndim + 2) + t.shape[:-2] != lead):
            raise NotLowered
        if not isinstance(v, Value):
            v = np.ascontiguousarray(t, np.float32)
        operands.append((v, (size, *t.shape[-2:])))
    if out.shape != (*lead, m, n):
        raise NotLowered
    y = low.new(out.shape)
    for v, _ in operands:
        low.use(v)

    def bind(plan, arena):
        a3, b3 = (operand(arena, v).reshape(shape) for v, shape in operands)
        plan.add_batched_matmul(a3, b3, arena_view(arena, y).reshape(batch, m, n))

    low.emit(bind)
    return [y]


def rows_times_constants(ins, out) -> bool:
    """Whether a product's first input is a float32 plan value of at least 2 axes (rows of its
    last), its other inputs constants, and its traced result a float32 array."""
    x = ins[0]
    return (
        isinstance(x, Value)
        and x.dtype == np.float32
        and len(x.shape) >= 2
        and not any(isinstance(v, Value) for v in ins[1:])
        and isinstance(out, np.ndarray)
        and out.dtype == np.float32
    )


def lower_dense(low, node, ins, traced_ins, traced_outs, attrs):
    """A product of a plan value (..., k) and constant weights (k, n): FusedDense (its
    activation or row softmax in the epilogue), MatMul, Gemm without transA / alpha / beta; the
    cpu backend's ``dense`` as one step (``plan_dense``)."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if node.op_type == "MatMul" and isinstance(ins[1], Value):  # a product of two computed values
        return lower_batched_matmul(low, node, ins, traced_ins, traced_outs, attrs)
    if not rows_times_constants(ins, out) or out.ndim != len(x.shape):
        raise NotLowered
    w, b = traced_ins[1], traced_ins[2] if len(traced_ins) > 2 else None
    activation, alpha = "linear", 0.0
    if node.op_type == "FusedDense":
        activation, alpha = node_attrs.get("activation", "linear"), node_attrs.get("alpha", 0.0)
        softmax = node_attrs.get("_softmax")
        if softmax is not None:  # in the epilogue where its axis is the last
            axis = softmax[1].get("axis", -1 if low.model.opset >= 13 else 1)
            if axis % out.ndim != out.ndim - 1:
                raise NotLowered
    elif node.op_type == "Gemm":
        if node_attrs.get("transA", 0) or node_attrs.get("alpha", 1.0) != 1.0 or node_attrs.get("beta", 1.0) != 1.0:
            raise NotLowered
        if b is not None and np.ndim(b) > 1 and np.shape(b)[0] != 1:  # a bias per row
            raise NotLowered
        w = w.T if node_attrs.get("transB", 0) and isinstance(w, np.ndarray) else w
        if node_attrs.get("transB", 0) and not isinstance(w, np.ndarray):
            raise NotLowered
    elif b is not None:
        raise NotLowered
    if np.ndim(w) != 2 or np.shape(w)[0] != x.shape[-1] or out.shape != (*x.shape[:-1], np.shape(w)[1]):
        raise NotLowered
    bound = low.ops.plan_dense(w, b, x.size // x.shape[-1], activation, alpha)
    if bound is None:
        raise NotLowered
    y = low.new(out.shape)
    low.use(x)
    low.emit(lambda plan, arena: plan.add_dense(arena_view(arena, x), y=arena_view(arena, y), **bound))
    return [y]


def state(low, ins, traced_ins, i, shape, direction=0, into=None) -> Value:
    """A new buffer of ``shape`` (batch, hidden) (or the value ``into``) holding direction
    ``direction`` of input ``i``, an initial state ((D, B, H), or (1, B, H) and (B, 1, H) of
    one direction: the memory of (B, H) each), or zeros where it is absent."""
    given, size = None, math.prod(shape)
    if len(ins) > i and isinstance(ins[i], Value):
        given = ins[i]
        if direction:
            given = Value(given.buffer, given.offset + direction * size * 4, shape, given.dtype)
    elif len(traced_ins) > i and traced_ins[i] is not None and traced_ins[i].size:
        given = np.asarray(traced_ins[i]).reshape(-1)[direction * size : (direction + 1) * size]
    return copied(low, given, shape, into)


def lower_dynamic_matmul(low, node, ins, traced_ins, traced_outs, attrs):
    """com.microsoft DynamicQuantizeMatMul on its constant B: the quantization of A and the
    exact integer product in one step (``dynamic_qgemm``)."""
    a, out = ins[0], traced_outs[0]
    if not isinstance(a, Value) or a.dtype != np.float32 or a.size == 0 or reads_data(ins[1:]):
        raise NotLowered
    found = dynamic_matmul_constants(traced_ins, attrs["_attrs"])
    if found is None or out is None or out.dtype != np.float32:
        raise NotLowered
    packed, b_columns, bias = found
    y = low.new(out.shape)
    low.use(a)
    low.emit(
        lambda plan, arena: plan.add_dynamic_qgemm(arena_view(arena, a), packed, b_columns, bias, arena_view(arena, y))
    )
    return [y]


def lower_dynamic_lstm(low, node, ins, traced_ins, traced_outs, attrs):
    """com.microsoft DynamicQuantizeLSTM on its packed constants, one direction or both: each
    direction's input product and the time loops (side by side, ``qlstm_runs``) in one step,
    the states copied in; each direction writes its part of Y (T, D, B, H), Y_h and Y_c
    (D, B, H) in place."""
    x = ins[0]
    node_attrs = attrs["_attrs"]
    if not isinstance(x, Value) or x.dtype != np.float32 or len(x.shape) != 3 or x.size == 0:
        raise NotLowered
    if reads_data(ins[1:5]) or reads_data(ins[7:]):  # weights, lengths, P, scales: constants
        raise NotLowered
    found = direction_constants(traced_ins, node_attrs)
    if found is None or len(traced_outs) != 3:
        raise NotLowered
    steps, batch, _ = x.shape
    n_dir, hidden = len(found), found[0][5].shape[0] // 4  # the bias: 4 hidden
    h_all, c_all = low.new((n_dir, batch, hidden)), low.new((n_dir, batch, hidden))
    half = lambda value, d: Value(value.buffer, d * batch * hidden * 4, (batch, hidden), np.float32)  # noqa: E731
    states = [
        (
            state(low, ins, traced_ins, 5, (batch, hidden), d, into=half(h_all, d)),
            state(low, ins, traced_ins, 6, (batch, hidden), d, into=half(c_all, d)),
        )
        for d in range(n_dir)
    ]
    ys = low.new((steps, n_dir, batch, hidden)) if traced_outs[0] is not None else None
    x_proj = [low.new((steps, batch, 4 * hidden)) for _ in range(n_dir)]
    low.use(x)

    def bind(plan, arena):
        y = None if ys is None else arena_view(arena, ys)
        directions = [
            (
                *found[d],
                arena_view(arena, h),
                arena_view(arena, c),
                None if y is None else y[:, d],
                arena_view(arena, x_proj[d]),
            )
            for d, (h, c) in enumerate(states)
        ]
        plan.add_dynamic_qlstms(arena_view(arena, x), directions)

    low.emit(bind)
    outs = [ys, h_all, c_all]
    if any(o is not None and t is not None and o.shape != t.shape for o, t in zip(outs, traced_outs)):
        raise NotLowered
    return outs


def lower_attention(low, node, ins, traced_ins, traced_outs, attrs):
    """FusedAttention where the Python plan makes it one call of the backend's attention
    (float32 heads, one-value scales, a mask of at most the heads' rank, the softmax on the
    scores' last axis): the same kernel as a step, q, k and v read from the arena (k^T moved to
    k's rows as the backend copies it), the result in C order."""
    q, k, v, s_q, s_k, s_scores, mask = (list(ins) + [None] * 7)[:7]
    t_q, t_k, t_v, *t_rest = (list(traced_ins) + [None] * 7)[:7]
    node_attrs, out = attrs["_attrs"], traced_outs[0]
    t_scales = list(zip(t_rest[:3], node_attrs["_divide"]))
    if (
        not all(isinstance(a, Value) and a.dtype == np.float32 for a in (q, k, v))
        or any(isinstance(a, Value) for a in (s_q, s_k, s_scores))
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or any(s is not None and np.size(s) != 1 for s, _ in t_scales)
        or (isinstance(mask, Value) and mask.dtype != np.float32)
        or node_attrs.get("_axis", -1) % len(q.shape) != len(q.shape) - 1
    ):
        raise NotLowered
    if mask is None and t_rest[3] is not None:  # a constant of the plan (from keyed inputs)
        mask = np.ascontiguousarray(t_rest[3], np.float32)
    if node_attrs["_k_transposed"]:
        k = transposed(low, k, (*range(len(k.shape) - 2), len(k.shape) - 1, len(k.shape) - 2), extra=False)
    ndim = len(q.shape)
    if (
        ndim not in (3, 4)
        or not (len(k.shape) == len(v.shape) == ndim)
        or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2])
        or k.shape[-2] != v.shape[-2]
        or q.shape[-1] != k.shape[-1]
        or (mask is not None and len(mask.shape) > ndim)
    ):
        raise NotLowered
    scale = np.float32(1.0)
    for s, divide in t_scales:
        if s is not None:
            value = np.float32(np.reshape(s, -1)[0])
            scale = scale / value if divide else scale * value
    four = lambda shape: (1,) * (4 - len(shape)) + tuple(shape)  # noqa: E731
    tk = k.shape[-2]
    if mask is not None and four(mask.shape)[3] != tk:
        raise NotLowered  # keys broadcast: the backend copies the mask per call
    y = low.new(out.shape)
    for a in (q, k, v, mask):
        low.use(a)

    def bind(plan, arena):
        bias = None if mask is None else operand(arena, mask).reshape(four(mask.shape))
        plan.add_attention(
            arena_view(arena, q).reshape(four(q.shape)),
            arena_view(arena, k).reshape(four(k.shape)),
            arena_view(arena, v).reshape(four(v.shape)),
            arena_view(arena, y).reshape(four(y.shape)),
            float(scale),
            bias,
        )

    low.emit(bind)
    return [y]


def lower_layer_norm(low, node, ins, traced_ins, traced_outs, attrs):
    """LayerNormalization (and the RMS norm the rewrites make of it) over the trailing axes,
    its scale and bias constants of their width, its statistics outputs unread."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if not isinstance(x, Value) or x.dtype != np.float32 or x.size == 0 or reads_data(ins[1:]):
        raise NotLowered
    if any(node.outputs[1:]):  # the mean or the inverse standard deviation is read
        raise NotLowered
    axis = node_attrs.get("axis", -1) % len(x.shape)
    width = math.prod(x.shape[axis:])
    gamma, beta = (
        None if len(traced_ins) <= i or traced_ins[i] is None else np.ascontiguousarray(traced_ins[i], np.float32)
        for i in (1, 2)
    )
    if any(v is not None and v.size != width for v in (gamma, beta)) or out is None or out.shape != x.shape:
        raise NotLowered
    gamma, beta = (None if v is None else v.reshape(-1) for v in (gamma, beta))
    eps, rms = float(node_attrs.get("epsilon", 1e-5)), bool(node_attrs.get("_rms", False))
    y = low.new(x.shape)
    low.use(x)

    def bind(plan, arena):
        rows = (x.size // width, width)
        plan.add_layer_norm(
            arena_view(arena, x).reshape(rows), gamma, beta, eps, rms, arena_view(arena, y).reshape(rows)
        )

    low.emit(bind)
    return [y] + [None] * (len(traced_outs) - 1)


def lower_one_hot_dense(low, node, ins, traced_ins, traced_outs, attrs):
    """OneHotDense on ids computed by the plan (int32 or int64, last axis 1): the ids clipped
    to [-1, V] (map steps: -1 and V both name row V of the table, the activation of the bias
    alone, as an id outside [0, V) gets), then the take step of rows of the node's table
    (``one_hot_table``, the Python plan's)."""
    ids, t, out = ins[0], traced_ins[0], traced_outs[0]
    if (
        not isinstance(ids, Value)
        or ids.dtype not in (np.int64, np.int32)
        or reads_data(ins[1:])
        or not isinstance(t, np.ndarray)
        or t.ndim == 0
        or t.shape[-1] != 1
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
    ):
        raise NotLowered
    w = traced_ins[2]
    b = traced_ins[3] if len(traced_ins) > 3 else None
    table = one_hot_table(w, b, attrs["_attrs"], low.ops)
    v, e = w.shape
    if out.size != t.size * e or table.shape != (v + 1, e):
        raise NotLowered
    lo, hi = np.asarray(-1, t.dtype), np.asarray(v, t.dtype)
    above = np.maximum(t, lo)  # the map steps' integer maximum, then minimum
    idx = map_step(
        low, "min", [map_step(low, "max", [ids, lo], [t, lo], above), hi], [above, hi], np.minimum(above, hi)
    )
    y = low.new(out.shape, np.float32)
    low.use(idx)
    rows = table.reshape(-1)

    def bind(plan, arena):
        plan.add_take(rows, arena_view(arena, idx).reshape(-1), arena_view(arena, y).reshape(-1), 1, v + 1, e)

    low.emit(bind)
    return [y]


def reads_data(values) -> bool:
    """Whether any of ``values`` is computed by the plan (not a constant)."""
    return any(isinstance(v, Value) for v in values)


def loop_input(arena, x_bti):
    """A loop's input fields for the plan value ``x_bti``: float inputs (B, T, I) as ``x``, or
    int64 ids (B, T) of its folded table's rows as ``ids`` (checked by ``table_rows``)."""
    view = arena_view(arena, x_bti)
    return {"x": view} if x_bti.dtype == np.float32 else {"x": None, "ids": view}


def table_rows(low, ids, vocab, time_major) -> Value:
    """The int64 (B, T) rows of a table of ``vocab`` rows that the plan value ``ids`` (int64 or
    int32 (B, T), or (T, B) where ``time_major``) names, a negative id counted from the end: a
    take step from the row numbers, which fails the call (``BAD_INDEX``, the Python plan then
    raises the node's error) before the loop reads a row past the table."""
    ids_bt = transposed(low, ids, (1, 0)) if time_major else ids
    rows = low.new(ids_bt.shape, np.int64)
    low.use(ids_bt)
    numbers = np.arange(vocab, dtype=np.int64)

    def bind(plan, arena):
        plan.add_take(numbers, arena_view(arena, ids_bt).reshape(-1), arena_view(arena, rows).reshape(-1), 1, vocab, 1)

    low.emit(bind)
    return rows


def mask_bytes(mask):
    """The plan value ``mask`` (B, T) bool as the loops read it: the same bytes as uint8."""
    return None if mask is None else Value(mask.buffer, mask.offset, mask.shape, np.uint8)


def emit_loop(low, loop, serial, x_bti, h, c, mask=None):
    """Emits one direction's time loop (``loop``, ``plan_sequence_loop``'s, bound by
    ``add_rnn``) reading ``x_bti`` (and the (B, T) bool ``mask``: fastlayers' masked nodes)
    and carrying its states in the values ``h`` and ``c`` (None for GRU / RNN), with a carried
    output of its own; returns its Y value, or None where the loop writes none."""
    last = copied(low, None, loop.last.shape)
    y = None if loop.y is None else low.new(loop.y.shape)
    low.use(x_bti)
    mask_u8 = mask_bytes(mask)
    if mask is not None:
        low.use(mask)

    def bind(plan, arena):
        call = loop._replace(
            **loop_input(arena, x_bti),
            h=arena_view(arena, h),
            c=None if c is None else arena_view(arena, c),
            y=None if y is None else arena_view(arena, y),
            last=arena_view(arena, last),
            mask=None if mask_u8 is None else arena_view(arena, mask_u8),
        )
        plan.add_rnn(tuple(call), serial)

    low.emit(bind)
    return y


def recurrent(kind, embedding=False, masked=False):
    """The lowering of an ONNX ``kind`` (LSTM, GRU or RNN) node, with ``embedding`` of its
    ``Embedding<kind>`` form (inputs [table, ids, W, R, ...]: the ids checked and turned into
    batch-major rows of the table folded into the input projection, ``table_rows``), with
    ``masked`` of fastlayers' ``Masked<kind>`` (input 4 a (B, T) bool mask the loops read, the
    initial states after it)."""

    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        node_attrs = attrs["_attrs"]
        table = mask = None
        if embedding:
            if isinstance(ins[0], Value) or not isinstance(traced_ins[0], np.ndarray) or traced_ins[0].ndim != 2:
                raise NotLowered
            table, ins, traced_ins = traced_ins[0], ins[1:], traced_ins[1:]
        if masked:
            mask, traced_mask = ins[4], traced_ins[4]
            ins, traced_ins = [*ins[:4], None, *ins[5:]], [*traced_ins[:4], None, *traced_ins[5:]]
            if not isinstance(mask, Value) or mask.dtype != np.bool_ or len(mask.shape) != 2:
                raise NotLowered
        x = ins[0]
        if not isinstance(x, Value) or any(isinstance(v, Value) for v in ins[1:5] if v is not None):
            raise NotLowered
        if x.dtype != np.float32 if table is None else x.dtype not in (np.int64, np.int32) or len(x.shape) != 2:
            raise NotLowered
        layout = node_attrs.get("layout", 0)
        traced = list(traced_ins)
        if table is not None:
            time_major = node_attrs["_ids_time_major"]
            ids = np.asarray(traced[0])
            traced[0] = (ids.T if time_major else ids).astype(np.int64) % table.shape[0]
        planned = recurrent_calls(kind, traced, node_attrs, table)
        if planned is not None and masked:
            planned = (masked_calls(planned[0], np.asarray(traced_mask), node_attrs), *planned[1:])
        if planned is not None and len(planned[0]) == 2:
            x_bti = transposed(low, x, (1, 0, 2)) if table is None else table_rows(low, x, table.shape[0], time_major)
            return bidirectional(low, kind, planned, x_bti, ins, traced_ins, traced_outs, node_attrs, mask)
        if planned is None or len(planned[0]) != 1:
            raise NotLowered
        (cell, args, kw), x_bti_traced, _ = planned[0][0], planned[1], planned[2]
        found = low.ops.plan_sequence_loop(cell, x_bti_traced, args[1:], kw)
        if found is None:
            raise NotLowered
        loop, serial = found
        if table is not None:
            x_bti = table_rows(low, x, table.shape[0], time_major)
        else:
            x_bti = x if layout else transposed(low, x, (1, 0, 2))
        batch, steps = x_bti.shape[:2]
        h = state(low, ins, traced_ins, 5, loop.h.shape)
        c = None if loop.c is None else state(low, ins, traced_ins, 6, loop.c.shape)
        y = emit_loop(low, loop, serial, x_bti, h, c, mask)
        outs = []
        if traced_outs[0] is not None and y is not None:  # Y: (T, 1, B, H) or (B, T, 1, H)
            y4 = Value(y.buffer, y.offset, (batch, 1, steps, y.shape[2]), y.dtype)
            outs.append(transposed(low, y4, (0, 2, 1, 3) if layout else (2, 1, 0, 3)))
        else:
            outs.append(None)
        hidden_shape = lambda s: (s[0], 1, s[1]) if layout else (1, *s)  # noqa: E731
        outs.append(Value(h.buffer, 0, hidden_shape(h.shape), np.float32))
        if kind == "LSTM":
            outs.append(Value(c.buffer, 0, hidden_shape(c.shape), np.float32))
        for k, (o, t) in enumerate(zip(outs, traced_outs)):
            if o is not None and t is not None and (tuple(o.shape) != t.shape):
                raise NotLowered
        return outs[: len(traced_outs)]

    return lower


def lower_fused_lstm_cell(low, node, ins, traced_ins, traced_outs, attrs):
    """A FusedLSTMCell (one LSTM step, torch's gate order; x, h and c batch-major 2-D) as the
    node's bound step runs it: the backend's recurrent loop over one step, h and c read from
    copies that become h' and c'."""
    x, h_in, c_in = ins[:3]
    tx, th, tc, w_x, w_h, b = traced_ins
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or len(x.shape) != 2
        or any(isinstance(v, Value) for v in ins[3:])
        or any(isinstance(v, Value) and v.dtype != np.float32 for v in (h_in, c_in))
        or not all(isinstance(t, np.ndarray) for t in (th, tc, w_h))
        or th.shape != (x.shape[0], w_h.shape[0])
        or tc.shape != th.shape
    ):
        raise NotLowered
    x_bti_traced = np.ascontiguousarray(tx, np.float32)[:, None, :]
    args = (w_x, w_h, b, np.ascontiguousarray(th, np.float32), np.ascontiguousarray(tc, np.float32))
    found = low.ops.plan_sequence_loop(Cell.LSTM, x_bti_traced, args, {"return_sequences": False})
    if found is None:
        raise NotLowered
    loop, serial = found
    if loop.c is None or loop.h.shape != th.shape or loop.c.shape != tc.shape:
        raise NotLowered
    x_bti = Value(x.buffer, x.offset, (x.shape[0], 1, x.shape[1]), x.dtype)  # a time axis of one step
    h = copied(low, h_in if isinstance(h_in, Value) else th, loop.h.shape)
    c = copied(low, c_in if isinstance(c_in, Value) else tc, loop.c.shape)
    emit_loop(low, loop, serial, x_bti, h, c)
    return [h, c][: len(traced_outs)]


def bidirectional(low, kind, planned, x_bti, ins, traced_ins, traced_outs, node_attrs, mask=None):
    """A bidirectional LSTM / GRU / RNN (layout 0) reading the plan value ``x_bti`` (the input
    batch-major, or the rows of its folded table) as the backend runs its directions
    (``plan_sequence_loops``): at once, one thread each (one ``rnn_loops`` step), or one after
    the other. Both directions' states are halves of one (2, B, H) buffer, the node's Y_h (and
    Y_c) as they are; their sequences halves of one (2, B, T, H) buffer, moved to Y (T, 2, B, H)
    by one gather. Both read the (B, T) bool ``mask`` where there is one."""
    calls, x_bti_traced, _ = planned
    if node_attrs.get("layout", 0):
        raise NotLowered
    found = low.ops.plan_sequence_loops(x_bti_traced, [(cell, args[1:], kw) for cell, args, kw in calls])
    if found is None:
        raise NotLowered
    loops, at_once = found
    loops = [(loop, None) for loop in loops] if at_once else loops
    first = loops[0][0]
    batch, steps = x_bti.shape[:2]
    hidden = first.h.shape[1]
    h_all = low.new((2, batch, hidden))
    c_all = None if first.c is None else low.new((2, batch, hidden))
    y_all = None if first.y is None else low.new((2, batch, steps, hidden))
    half = lambda value, d, shape: Value(value.buffer, d * math.prod(shape) * 4, shape, np.float32)  # noqa: E731
    bound = []
    for d, (loop, serial) in enumerate(loops):
        h = state(low, ins, traced_ins, 5, (batch, hidden), d, into=half(h_all, d, (batch, hidden)))
        c = (
            None
            if c_all is None
            else state(low, ins, traced_ins, 6, (batch, hidden), d, half(c_all, d, (batch, hidden)))
        )
        y = None if y_all is None else half(y_all, d, (batch, steps, hidden))
        bound.append((loop, serial, h, c, y, copied(low, None, loop.last.shape)))
    low.use(x_bti)
    for value in (h_all, c_all, y_all, mask):
        if value is not None:
            low.use(value)
    mask_u8 = mask_bytes(mask)

    def bind(plan, arena):
        made = [
            loop._replace(
                **loop_input(arena, x_bti),
                h=arena_view(arena, h),
                c=None if c is None else arena_view(arena, c),
                y=None if y is None else arena_view(arena, y),
                last=arena_view(arena, last),
                mask=None if mask_u8 is None else arena_view(arena, mask_u8),
            )
            for loop, _, h, c, y, last in bound
        ]
        if at_once:
            plan.add_rnn_loops([tuple(call) for call in made])
        else:
            for call, (_, serial, *_) in zip(made, bound):
                plan.add_rnn(tuple(call), serial)

    low.emit(bind)
    y_out = None
    if traced_outs[0] is not None and y_all is not None:
        y_out = transposed(low, y_all, (2, 0, 1, 3))
    outs = [y_out, h_all] + ([c_all] if kind == "LSTM" else [])
    for o, t in zip(outs, traced_outs):
        if t is not None and (o is None or tuple(o.shape) != t.shape):
            raise NotLowered
    return outs[: len(traced_outs)]


def lower_dense_chain(low, node, ins, traced_ins, traced_outs, attrs):
    """FusedDenseChain: its layers as consecutive dense steps (``plan_dense``), as the
    backend's chain runs each product."""
    x, out = ins[0], traced_outs[0]
    layers = attrs["_attrs"]["layers"]
    if not rows_times_constants(ins, out):
        raise NotLowered
    rows, value = x.size // x.shape[-1], x
    for i, (activation, alpha) in enumerate(layers):
        w, b = traced_ins[1 + 2 * i], traced_ins[2 + 2 * i] if 2 + 2 * i < len(traced_ins) else None
        if np.ndim(w) != 2 or np.shape(w)[0] != value.shape[-1]:
            raise NotLowered
        bound = low.ops.plan_dense(w, None if b is None or np.size(b) == 0 else b, rows, activation, alpha)
        if bound is None:
            raise NotLowered
        y = low.new((*value.shape[:-1], np.shape(w)[1]))
        low.use(value)
        low.emit(
            lambda plan, arena, x=value, y=y, bound=bound: plan.add_dense(
                arena_view(arena, x), y=arena_view(arena, y), **bound
            )
        )
        value = y
    if value.shape != out.shape:
        raise NotLowered
    return [value]
