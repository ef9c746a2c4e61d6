"""Lowerings of elementwise work: programs of arithmetic and activations, the map step
(comparisons, Where, Cast, logic, DequantizeLinear), activations and reductions."""

from __future__ import annotations

import math

import numpy as np

from .ops.reduce import AXES_INPUT_FROM, reduce_axes
from .plan_convolution import GLOBAL_POOLS, is_itself, lower_global_pool
from .plan_movement import BROADCAST_CONSTANT_MAX, broadcast, lower_alias
from .plan_values import MAP_DTYPES, QUANTIZED_DTYPES, NotLowered, Value, arena_view, layout_of, memory_of, operand

#: Operators with a map step (``lower_map``), by the step's name for them; Add / Sub / Mul / Div
#: where the elementwise program does not take them.
MAPS = {
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "Where": "where",
    "Cast": "cast",
    "Not": "not",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
    "IsNaN": "isnan",
    "Min": "min",
    "Max": "max",
    "Clip": "clip",
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Sqrt": "sqrt",
    "Neg": "neg",
    "Abs": "abs",
    "Reciprocal": "reciprocal",
}
#: Operands of the map steps that do not take two.
MAP_ARITY = {
    "where": 3,
    "clip": 3,
    "cast": 1,
    "not": 1,
    "isnan": 1,
    "sqrt": 1,
    "neg": 1,
    "abs": 1,
    "reciprocal": 1,
}
#: Reductions with a native step (``lower_reduce``), by the step's name for them.
REDUCTIONS = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceSumSquare": "sum_square",
}
#: Operators that are one activation of the native core, as ``ops/elementwise.py`` runs them
#: (onnxruntime's sigmoid and tanh): name, the attribute holding alpha, its default.
ACTIVATIONS = {
    "Relu": ("relu", None, 0.0),
    "Sigmoid": ("onnx_sigmoid", None, 0.0),
    "Tanh": ("onnx_tanh", None, 0.0),
    "Softsign": ("softsign", None, 0.0),
    "LeakyRelu": ("leaky_relu", "alpha", 0.01),
    "Exp": ("exponential", None, 0.0),
}


def lower_reduce(low, node, ins, traced_ins, traced_outs, attrs):
    """A Reduce* node (``REDUCTIONS``) of a float32 value: a global pool where it is one
    (``lower_global_pool``), else the reduce step over the value's C-ordered memory seen as (outer,
    r, inner), where the axes it reduces (of length > 1) are neighbours in memory."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    if node.op_type in GLOBAL_POOLS:  # over the positions of a channels-last value, or an alias
        marks = low.mark()
        try:
            return lower_global_pool(low, node, ins, traced_ins, traced_outs, attrs)
        except NotLowered:
            low.rollback(marks)
    elif is_itself(node, x, out):
        return lower_alias(low, node, [low.c_order(x), *ins[1:]], traced_ins, traced_outs, attrs)
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or x.size == 0
        or any(isinstance(v, Value) for v in ins[1:])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
    ):
        raise NotLowered
    axes = reduce_axes(traced_ins, attrs["_attrs"], low.model.opset, AXES_INPUT_FROM[node.op_type], t.ndim)
    if axes is None:
        raise NotLowered
    reduced = {a % t.ndim for a in axes}
    # a channels-last value in its own memory where that reduces neighbouring axes into the
    # result's C order (a mean over the channels of NHWC memory: contiguous runs), else in C order
    split = _reduce_split(t.shape, reduced, np.argsort(x.perm)) if x.perm is not None else None
    if split is None:
        split = _reduce_split(t.shape, reduced, range(t.ndim))
        if split is None:
            raise NotLowered
        x = low.c_order(x)
    else:
        x = memory_of(x)
    outer, r, inner = split
    if outer * inner != out.size:
        raise NotLowered
    y = low.new(out.shape)
    low.use(x)
    op = REDUCTIONS[node.op_type]

    def bind(plan, arena):
        plan.add_reduce(arena_view(arena, x), arena_view(arena, y), op, outer, r, inner)

    low.emit(bind)
    return [y]


def _reduce_split(shape, reduced, memory_axes):
    """(outer, r, inner) of a reduction over the axes ``reduced`` of a value of ``shape`` whose
    memory holds its axes in the order ``memory_axes`` (outermost first), or None where the
    reduced axes are not neighbours there or the kept ones are not in the result's C order."""
    kept = [(a, shape[a], a in reduced) for a in memory_axes if shape[a] > 1]  # length 1 changes nothing
    flags = [f for _, _, f in kept]
    first = flags.index(True) if True in flags else len(flags)
    last = len(flags) - flags[::-1].index(True) if True in flags else len(flags)
    if not all(flags[first:last]):
        return None
    rest = [a for a, _, f in kept if not f]
    if rest != sorted(rest):
        return None
    return (
        math.prod(d for _, d, _ in kept[:first]),
        math.prod(d for _, d, _ in kept[first:last]),
        math.prod(d for _, d, _ in kept[last:]),
    )


#: ArgMax / ArgMin with a native step: the reduce step's index forms.
ARG_REDUCTIONS = {"ArgMax": "argmax", "ArgMin": "argmin"}


def lower_arg_reduce(low, node, ins, traced_ins, traced_outs, attrs):
    """ArgMax / ArgMin of a float32 value over one axis: the reduce step's index form over its
    C-ordered memory seen as (outer, r, inner), int64 indices as numpy gives them (the first
    of equal values or, with ``select_last_index``, the last; a NaN wins)."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    if (
        not isinstance(x, Value)
        or x.dtype != np.float32
        or x.size == 0
        or not isinstance(out, np.ndarray)
        or out.dtype != np.int64
    ):
        raise NotLowered
    node_attrs = attrs["_attrs"]
    axis = node_attrs.get("axis", 0) % t.ndim
    outer, r, inner = math.prod(t.shape[:axis]), t.shape[axis], math.prod(t.shape[axis + 1 :])
    if outer * inner != out.size:
        raise NotLowered
    x = low.c_order(x)
    y = low.new(out.shape, np.int64)
    low.use(x)
    op, last = ARG_REDUCTIONS[node.op_type], bool(node_attrs.get("select_last_index", 0))

    def bind(plan, arena):
        plan.add_reduce(arena_view(arena, x), arena_view(arena, y), op, outer, r, inner, last)

    low.emit(bind)
    return [y]


def activation(name, alpha_attr, default):
    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        x = ins[0]
        code = low.ops.plan_activation_code(name)
        if not isinstance(x, Value) or x.dtype != np.float32 or code is None:
            raise NotLowered
        alpha = float(attrs["_attrs"].get(alpha_attr, default)) if alpha_attr else default
        y = low.new(x.shape, perm=x.perm)  # elementwise: in the memory order of x
        low.use(x)
        low.emit(lambda plan, arena: plan.add_activation(arena_view(arena, x), arena_view(arena, y), code, alpha))
        return [y]

    return lower


def lower_fused_add(low, node, ins, traced_ins, traced_outs, attrs):
    """FusedAdd of two float32 values of the result's shape: f(a + b) in one pass (the
    add_act step), in their memory order where they share it, else in C order."""
    a, b, out = ins[0], ins[1], traced_outs[0]
    node_attrs = attrs["_attrs"]
    code = low.ops.plan_activation_code(node_attrs.get("activation", "linear"))
    if (
        code is None
        or not all(isinstance(v, Value) and v.dtype == np.float32 for v in (a, b))
        or not isinstance(out, np.ndarray)
        or not a.shape == b.shape == out.shape
    ):
        raise NotLowered
    if a.perm != b.perm:
        a, b = low.c_order(a), low.c_order(b)
    y = low.new(a.shape, perm=a.perm)
    low.use(a), low.use(b)
    alpha = float(node_attrs.get("alpha", 0.0))
    low.emit(
        lambda plan, arena: plan.add_add_act(
            arena_view(arena, a), arena_view(arena, b), arena_view(arena, y), code, alpha
        )
    )
    return [y]


def lower_gelu(low, node, ins, traced_ins, traced_outs, attrs):
    """Gelu: the activation kernel the Python plan calls (its tanh form where ``approximate``
    is "tanh")."""
    approximate = attrs["_attrs"].get("approximate", "none")
    tanh = approximate in ("tanh", b"tanh")
    return activation("gelu_tanh" if tanh else "gelu", None, 0.0)(low, node, ins, traced_ins, traced_outs, attrs)


def row_activation(name):
    """Softmax / LogSoftmax over the last axis (opset >= 13) or over the axes from ``axis`` on
    (before 13): the row kernel over rows of that width, as ``CpuOps.softmax`` runs it."""

    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        x = ins[0]
        code = low.ops.plan_activation_code(name, rows=True)
        if not isinstance(x, Value) or x.dtype != np.float32 or code is None or not x.size or not x.shape:
            raise NotLowered
        ndim = len(x.shape)
        if low.model.opset >= 13:
            if attrs["_attrs"].get("axis", -1) % ndim != ndim - 1:
                raise NotLowered
            row = x.shape[-1]
        else:
            row = math.prod(x.shape[attrs["_attrs"].get("axis", 1) % ndim :])
        y = low.new(x.shape)
        low.use(x)
        low.emit(lambda plan, arena: plan.add_activation(arena_view(arena, x), arena_view(arena, y), code, 0.0, row))
        return [y]

    return lower


#: Elementwise operators as one instruction of an elementwise program (the ops of
#: ``Ops.elementwise_plan``; numpy's float32 arithmetic gives the same bits).
ELEMENTWISE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs"}


def program_step(low, program, ins, traced_ins, shape, perm, data=()):
    """A new value of ``shape`` (held as ``perm``) computed by one pass of the elementwise
    ``program`` over ``ins`` (plan values and constants; the plan values among ``data``
    channel vectors read per call); raises NotLowered where the native pass does not take it."""
    operands = []  # as the Python plan holds them: channels-last values as views of that memory
    for k, (v, t) in enumerate(zip(ins, traced_ins)):
        if isinstance(v, Value):
            if v.dtype != np.float32 or (v.shape != shape and k not in data):
                raise NotLowered
            memory = np.empty(v.memory_shape, np.float32)
            operands.append(memory if v.perm is None else memory.transpose(v.perm))
        elif isinstance(t, np.ndarray) and t.dtype == np.float32 and t.ndim <= len(shape):
            operands.append(np.ascontiguousarray(t))
        else:
            raise NotLowered
    found = low.ops.plan_elementwise(program, operands, data)
    if found is None:
        raise NotLowered
    prog, samples, inner, c, memory_shape, back, sources = found
    probe = np.empty(memory_shape, np.float32).transpose(back)  # the result: the memory of perm?
    if probe.shape != tuple(shape) or not (probe.flags.c_contiguous if perm is None else layout_of(probe) == perm):
        raise NotLowered
    y = low.new(shape, perm=perm)
    for v in ins:
        low.use(v)
    # the constants alone: the stand-ins of plan values would otherwise live until the plan is bound
    constants = [None if isinstance(v, Value) else o for v, o in zip(ins, operands)]
    del operands, probe

    def bind(plan, arena):
        args = [
            (
                kind,
                array if k is None else operand(arena, ins[k]) if isinstance(ins[k], Value) else constants[k],
                stride,
            )
            for kind, k, array, stride in sources
        ]
        plan.add_elementwise(prog, samples, inner, c, args, arena_view(arena, y).reshape(-1))

    low.emit(bind)
    return y


def vector_parts(low, program, ins, traced_ins, shape):
    """``program`` (over ``ins``) with the values it computes from vectors of the data alone
    (a squeeze-and-excite gate: (N, C, 1, 1) from a global pool) each computed first, by a pass
    of its own over the vectors' shape: (program, operands, traced operands, indices of the
    data vectors among them)."""
    n = len(ins)
    full = [isinstance(v, Value) and v.shape == tuple(shape) for v in ins]
    data = [isinstance(v, Value) and not f for v, f in zip(ins, full)]
    shapes = [np.shape(t) for t in traced_ins]
    for _, a, b, _ in program:
        shapes.append(np.broadcast_shapes(*(shapes[x] for x in (a, b) if x >= 0)))
        # a value of the result's shape is the main pass's to compute, from vectors alone too
        # (a mean per position times a scale per channel)
        full.append(any(full[x] for x in (a, b) if x >= 0) or shapes[-1] == tuple(shape))
        data.append(any(data[x] for x in (a, b) if x >= 0))
    needed = sorted(
        {
            x
            for k, (_, a, b, _) in enumerate(program)
            if full[n + k]
            for x in (a, b)
            if x >= n and not full[x] and data[x]
        }
    )
    ins, traced_ins = list(ins), list(traced_ins)
    renamed = {}  # value index -> its index in the new program
    for x in needed:  # the instructions x depends on, over the operands they read
        wanted, stack = set(), [x]
        while stack:
            v = stack.pop()
            if v >= n and v not in wanted:
                wanted.add(v)
                stack += [u for u in program[v - n][1:3] if u >= 0]
        reads = sorted({u for v in wanted for u in program[v - n][1:3] if 0 <= u < n})
        index = {u: i for i, u in enumerate(reads)}
        sub = []
        for v in sorted(wanted):
            op, a, b, param = program[v - n]
            index[v] = len(reads) + len(sub)
            sub.append((op, index[a], index[b] if b >= 0 else -1, param))
        vector_shape = np.broadcast_shapes(*(np.shape(traced_ins[u]) for u in reads))
        if len(vector_shape) != len(shape):
            raise NotLowered
        value = program_step(low, sub, [ins[u] for u in reads], [traced_ins[u] for u in reads], vector_shape, None)
        renamed[x] = len(ins)
        ins.append(value)
        traced_ins.append(np.zeros(vector_shape, np.float32))
    index = {u: u for u in range(n)} | renamed
    main = []
    for k, (op, a, b, param) in enumerate(program):
        v = n + k
        if v in renamed or (not full[v] and data[v]):
            continue
        index[v] = len(ins) + len(main)
        main.append((op, index[a], index[b] if b >= 0 else -1, param))
    vectors = [k for k, v in enumerate(ins) if isinstance(v, Value) and v.shape != tuple(shape)]
    return main, ins, traced_ins, vectors


def arrays(traced):
    """The traced values with numpy scalars (a constant's one value) as 0-d arrays."""
    return [np.asarray(t) if isinstance(t, np.generic) else t for t in traced]


def map_operands(op, node, ins, traced_ins, out, node_attrs):
    """(plan values and constants, their traced arrays) that the map step ``op`` reads for
    ``node``: Clip's omitted bounds as infinities (its attributes before opset 11), its
    constant bounds in the result's type; raises NotLowered where the step does not take the
    types."""
    ins, traced = list(ins), arrays(traced_ins)
    if op == "clip":
        bounds = []
        for k, name, fill in ((1, "min", -np.inf), (2, "max", np.inf)):
            v = ins[k] if k < len(ins) else None
            t = traced[k] if k < len(traced) else None
            if t is None:  # omitted: the attribute (before opset 11), else no bound
                v = t = np.asarray(node_attrs.get(name, fill), out.dtype)
            elif not isinstance(v, Value):
                v = t = np.asarray(t, out.dtype)
            bounds.append((v, t))
        ins, traced = [ins[0], *(v for v, _ in bounds)], [traced[0], *(t for _, t in bounds)]
    arity = MAP_ARITY.get(op, 2)
    if len(ins) != arity or any(not isinstance(t, np.ndarray) or t.dtype not in MAP_DTYPES for t in traced):
        raise NotLowered
    kinds = {t.dtype.kind for t in traced}
    if (
        (op in ("add", "sub", "mul", "div", "clip", "isnan", "sqrt", "neg", "abs", "reciprocal") and not kinds <= {"f"})
        or (op in ("and", "or", "xor", "not") and kinds != {"b"})
        or (op == "where" and traced[0].dtype != np.bool_)
        or (op == "clip" and any(isinstance(v, Value) and v.dtype != out.dtype for v in ins))
    ):
        raise NotLowered
    return ins, traced


def lower_map(low, node, ins, traced_ins, traced_outs, attrs):
    """A comparison, Where, Cast, logic, IsNaN, Min / Max of two, Clip, or an Add / Sub / Mul /
    Div that the elementwise program does not take: one map step (``map_step``)."""
    out, op = traced_outs[0], MAPS[node.op_type]
    if not isinstance(out, np.ndarray) or out.dtype not in MAP_DTYPES or out.size == 0:
        raise NotLowered
    ins, traced = map_operands(op, node, ins, traced_ins, out, attrs["_attrs"])
    return [map_step(low, op, ins, traced, out)]


def map_step(low, op, ins, traced, out) -> Value:
    """A new value like the traced ``out``: the map step ``op`` over its indices, each of
    ``ins`` (plan values, in C order, and constants) read through strides that are 0 along the
    axes it broadcasts, neighbouring axes merged where every operand allows."""
    shape = out.shape or (1,)
    operands, strides = [], []
    for v, t in zip(ins, traced):
        held = low.c_order(v) if isinstance(v, Value) else np.ascontiguousarray(t).reshape(-1)
        operands.append(low.use(held))
        own = (1,) * (len(shape) - t.ndim) + t.shape
        strides.append([math.prod(own[a + 1 :]) if own[a] == shape[a] else 0 for a in range(len(shape))])
    dims = list(shape)
    for a in reversed(range(len(dims) - 1)):  # axes a and a + 1 as one where every operand allows
        if all(st[a] == st[a + 1] * dims[a + 1] for st in strides):
            dims[a : a + 2] = [dims[a] * dims[a + 1]]
            for st in strides:
                st[a : a + 2] = [st[a + 1]]
    y = low.new(out.shape, out.dtype)

    def bind(plan, arena):
        arrays = [arena_view(arena, v).reshape(-1) if isinstance(v, Value) else v for v in operands]
        plan.add_map(op, arena_view(arena, y).reshape(-1), arrays, dims, strides)

    low.emit(bind)
    return y


#: Instructions of an elementwise program that a map step runs (``program_by_maps``), with
#: numpy's form of each (the traced values of the steps between them); the map step's square
#: root in double rounds to the float32 one.
PROGRAM_MAPS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "sqrt": np.sqrt,
    "neg": np.negative,
    "abs": np.abs,
}


def program_by_maps(low, program, ins, traced_ins, out):
    """A FusedElementwise the native pass does not take (a result of one value, operands of
    other types) whose instructions are all arithmetic, square roots, negations, absolute
    values and clips (``PROGRAM_MAPS``): one map step per instruction, each result a value of
    the plan."""
    if any(op not in PROGRAM_MAPS for op, *_ in program):
        raise NotLowered
    values, traced = list(ins), list(traced_ins)
    if any(not isinstance(t, np.ndarray) or t.dtype != np.float32 for t in traced):
        raise NotLowered
    for op, a, b, param in program:
        if op == "clip":  # its bounds: float32 values, infinite where the node had none
            bounds = [np.float32(param[0]), np.float32(param[1])]
            args, targs = [values[a], *bounds], [traced[a], *(np.asarray(v) for v in bounds)]
        elif MAP_ARITY.get(op) == 1:
            args, targs = [values[a]], [traced[a]]
        else:
            args, targs = [values[a], values[b]], [traced[a], traced[b]]
        with np.errstate(all="ignore"):
            result = np.asarray(PROGRAM_MAPS[op](*targs), np.float32)
        values.append(map_step(low, op, args, targs, result))
        traced.append(result)
    if traced[-1].shape != out.shape:
        raise NotLowered
    return [values[-1]]


def lower_dequantize(low, node, ins, traced_ins, traced_outs, attrs):
    """DequantizeLinear of 8- or 16-bit values with one scale and zero point (per tensor) into
    float32: the map step's (x - zero point) * scale, the difference exact and the product
    rounded once, as the Python plan's float32 arithmetic gives it."""
    x, t, out = ins[0], arrays(traced_ins)[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    scale = arrays(traced_ins)[1]
    zero = arrays(traced_ins)[2] if len(traced_ins) > 2 and traced_ins[2] is not None else np.zeros((), t.dtype)
    if (
        not isinstance(t, np.ndarray)
        or t.dtype not in QUANTIZED_DTYPES
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or node_attrs.get("block_size", 0)
        or any(isinstance(v, Value) for v in ins[1:])
        or np.size(scale) != 1
        or np.size(zero) != 1
        or np.asarray(scale).dtype != np.float32
    ):
        raise NotLowered
    operands = [x, None, None]
    traced = [t, np.asarray(scale, np.float32).reshape(()), np.asarray(zero).reshape(())]
    return [map_step(low, "dequantize", operands, traced, out)]


def lower_cast(low, node, ins, traced_ins, traced_outs, attrs):
    """Cast: to its input's own type an alias, else the map step."""
    marks = low.mark()
    try:
        return lower_alias(low, node, ins, traced_ins, traced_outs, attrs)
    except NotLowered:
        low.rollback(marks)
    return lower_map(low, node, ins, traced_ins, traced_outs, attrs)


def lower_elementwise(low, node, ins, traced_ins, traced_outs, attrs):
    """A FusedElementwise, or Add / Sub / Mul / Div / Sqrt / Neg / Abs: the backend's
    elementwise program (``lower_program``), else map steps (other types, results of one value):
    one for the operators that have one (``lower_map``), one per instruction for a program of
    arithmetic and clips (``program_by_maps``)."""
    traced_ins = arrays(traced_ins)
    marks = low.mark()
    try:
        return lower_program(low, node, ins, traced_ins, traced_outs, attrs)
    except NotLowered:
        low.rollback(marks)
    if node.op_type == "FusedElementwise":
        return program_by_maps(low, attrs["_attrs"]["program"], ins, traced_ins, traced_outs[0])
    if node.op_type not in MAPS:
        raise NotLowered
    return lower_map(low, node, ins, traced_ins, traced_outs, attrs)


def lower_program(low, node, ins, traced_ins, traced_outs, attrs):
    """One pass of the backend's elementwise program (a FusedElementwise's, or one operator's)
    over tensors of the result's shape, constant vectors or values and vectors of the data
    (each computed by a pass of its own where the program computes on it: ``vector_parts``)."""
    out = traced_outs[0]
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.size <= 1:
        raise NotLowered
    if node.op_type == "FusedElementwise":
        program = attrs["_attrs"]["program"]
    else:
        op = ELEMENTWISE[node.op_type]
        program = [(op, 0, 1 if len(ins) == 2 else -1, None)]
    tensors = [v for v in ins if isinstance(v, Value) and v.shape == out.shape]
    perms = {v.perm for v in tensors}
    if len(perms) > 1 or not tensors:  # operands held in different orders: all in C order
        ins, perms = [low.c_order(v) if isinstance(v, Value) and v.shape == out.shape else v for v in ins], {None}
    perm, marks = perms.pop(), low.mark()
    try:
        parts = vector_parts(low, list(program), ins, traced_ins, out.shape)
        return [program_step(low, parts[0], parts[1], parts[2], out.shape, perm, parts[3])]
    except NotLowered:
        low.rollback(marks)
    # operands broadcast in ways the pass does not read (a row's sum against its row): each
    # such operand broadcast to the result's shape first, the pass then over whole tensors
    if any(
        not isinstance(t, np.ndarray)
        or t.dtype != np.float32
        or t.ndim > out.ndim
        or (not isinstance(v, Value) and t.size > 1 and t.shape != out.shape and out.size > BROADCAST_CONSTANT_MAX)
        for v, t in zip(ins, traced_ins)
    ):
        raise NotLowered
    full, held = [], []
    for v, t in zip(ins, traced_ins):
        if isinstance(v, Value):
            full.append(low.c_order(v) if v.shape == out.shape else broadcast(low, v, out.shape))
        else:
            full.append(
                t if t.size == 1 or t.shape == out.shape else np.ascontiguousarray(np.broadcast_to(t, out.shape))
            )
        held.append(np.zeros(out.shape, np.float32) if isinstance(v, Value) else full[-1])
    return [program_step(low, program, full, held, out.shape, None)]
