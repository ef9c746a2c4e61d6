"""ONNX models lowered to native plans: a call's steps run in one native call.

For small models (a streaming VAD, a recurrent tagger) the Python between the kernels is most
of a call: per node a function call, its checks, the arrays it allocates. A native plan
(``native/plan.pxi``) holds one list of kernels with their arguments bound (pointers into one
arena, packed weights, sizes), built once per set of input shapes and run with the GIL
released; nodes with no native form run in Python inside the plan, on views of the arena
(``_fallback``). A cost model (``pays``) keeps a plan only where it saves more Python than it
adds copies: the small streaming models; large ones keep the Python plan.

Building (``lower``), at the second call with a key (``NativePlans.key``: the inputs' shapes
and dtypes, the values of small integer inputs, the backend, its thread count, the derived
weights' generation and the options in force):
- the plan's steps run once on the call's inputs (the trace). A value that does not depend
  on a float input (shapes, Ifs on them or on an integer input, constants) is a constant of
  the plan; If nodes whose condition is such a constant are replaced by the branch taken;
- every other node is lowered (``LOWERINGS``; the lowerings by subject in ``plan_movement``,
  ``plan_convolution``, ``plan_products`` and ``plan_elementwise``, on ``plan_values``'
  values, buffers and gathers): reshapes become aliases of their input's
  memory; data movement (Slice, Transpose, Pad, Concat, Gather on constant indices, Expand,
  Tile, ...) becomes gathers whose per-axis source tables come from running the node on
  index arrays (``lower_movement``: exact by construction, whatever the operator's attributes);
  convolutions, recurrent nodes (the int8 ones too), elementwise programs, layer norms and
  activations bind the cpu backend's kernels; Loop and Scan bodies are walked once and run
  by one loop step (``plan_control``). Anything else calls the node's function and
  copies its results into the arena, checking their shapes (a node whose output shapes
  depend on values sends the call back to the Python plan, and the key's plan is dropped);
- buffers get offsets in one arena by lifetime (``_place``), then the plan runs once on the
  trace's inputs and must give its outputs (``VERIFY_RTOL``), or the key keeps the Python
  plan.

A plan runs one call at a time (its arena is its own): a call that finds it running (another
thread) takes the Python plan.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .. import settings
from ..backends import get_ops
from ..backends.derived import derived_generation
from .control import Body, taken_branch
from .fold import NONDETERMINISTIC
from .ops.recurrent import RECURRENT_NODES
from .plan_control import lower_if, lower_loop, lower_scan
from .plan_convolution import (
    GLOBAL_POOLS,
    SINGLE_IS_ITSELF,
    lower_batch_norm,
    lower_conv,
    lower_conv_transpose,
    lower_global_pool,
    lower_pool,
)
from .plan_elementwise import (
    ACTIVATIONS,
    ARG_REDUCTIONS,
    ELEMENTWISE,
    MAPS,
    REDUCTIONS,
    activation,
    lower_arg_reduce,
    lower_cast,
    lower_dequantize,
    lower_elementwise,
    lower_fused_add,
    lower_gelu,
    lower_map,
    lower_reduce,
    row_activation,
)
from .plan_movement import (
    ALIASES,
    MOVEMENTS,
    lower_alias,
    lower_concat,
    lower_movement,
    lower_nearest_resize,
    lower_take,
)
from .plan_products import (
    lower_attention,
    lower_dense,
    lower_dense_chain,
    lower_dynamic_lstm,
    lower_dynamic_matmul,
    lower_fused_lstm_cell,
    lower_layer_norm,
    lower_one_hot_dense,
    recurrent,
)
from .plan_values import Buffer, Lowering, NotLowered, Value, arena_view, layout_of, logical_view, node_count
from .records import FASTLAYERS

#: Most plans a model keeps (one per key); more: the table is cleared and rebuilt.
MAX_PLANS = 8
#: Integer and bool inputs of at most this many values and at most one axis are part of a
#: plan's key (a sample rate, a flag, a few sizes): what depends on them alone is a constant of
#: the plan. Inputs of two or more axes (token ids (batch, time), masks) are data however short.
KEY_VALUES_MAX = 16
#: Calls with a key before its plan is built (a one-off shape does not pay for a build).
BUILD_AFTER = 2
#: Builds that may fail (a plan that does not give the trace's outputs, a node the lowering
#: cannot hold) before a model stops building plans: each costs a traced call.
MAX_FAILED_BUILDS = 2
#: Arena offsets are multiples of this many bytes (a cache line).
ALIGN = 64
#: Tolerance of the check of a new plan against the call it was traced on, relative to each
#: output's largest magnitude (the kernels are those of the Python plan; the convolutions may
#: sum in another order).
VERIFY_RTOL = 1e-4
#: The cost model deciding whether a plan pays (``pays``): what one node lowered natively
#: saves (the Python around its kernel: 3 us on fast hosts, 6-8 us on slow ones), what a node
#: run in Python inside the plan adds (the GIL taken back), and how fast the plan moves the
#: bytes the Python plan does not, each counted read and written: contiguous copies (the
#: inputs in, the outputs out, a Python node's results into the arena; 26-36 bytes per ns
#: measured) and gathers (layout moves, states; 2-7 bytes per ns), docs/design.md.
STEP_US, FALLBACK_US, COPY_BYTES_PER_US, GATHER_BYTES_PER_US = 5.0, 1.0, 20000.0, 2000.0
#: What a node of these operators lowered natively saves beyond ``STEP_US``: the Python
#: around a bound recurrent loop (its states copied, its outputs made and viewed per
#: direction), 13-20 us measured per node where its native loop took 5-8; the moves of a
#: convolution's NCHW input to channels-last and of its result back, which the plan's step
#: reads and writes in place or gathers natively (a 16-channel 3x3 convolution on 14x14: its
#: Python plan 21 us, as a plan 16; docs/design.md).
EXTRA_STEP_US = {
    **dict.fromkeys((*RECURRENT_NODES, "FusedLSTMCell"), 10.0),
    **dict.fromkeys(("Conv", "FusedConv", "ConvTranspose"), 5.0),
}
#: What each byte of a native step's result saves besides: the Python plan writes each
#: node's result into memory its allocator hands back cold in cache, where the plan's arena
#: reuses buffers while they are warm (30-90 us per MB of results measured, docs/design.md).
RESULT_BYTES_PER_US = 33000.0
#: What a call through a plan costs beyond the Python plan's, whatever its steps: the key,
#: the outputs copied out, the GIL released and taken back (a two-layer MLP of one row,
#: whose Python plan is one native call, 4.8 -> 6.1 us as a plan; with the one step it saves,
#: about 6 us; docs/design.md).
PLAN_US = 6.0


def _keyed_values(a) -> bool:
    """Whether the input array ``a``'s values are part of a plan's key (``KEY_VALUES_MAX``)."""
    return a.dtype.kind != "f" and a.size <= KEY_VALUES_MAX and a.ndim <= 1


class DoesNotPay(Exception):
    """The cost model finds that a plan of the model would not pay (``pays``)."""


class PlanMismatch(Exception):
    """A node in Python gave values of other shapes or types than the trace: the call goes
    back to the Python plan."""


#: Operator -> its lowering onto native steps: (low, node, plan values of its inputs, traced
#: inputs, traced outputs, {"_attrs": its attributes, "_fn": its function}) -> plan values of
#: its outputs, or NotLowered (the node then runs in Python inside the plan).
LOWERINGS = {
    **{name: lower_alias for name in ALIASES | SINGLE_IS_ITSELF},
    **{name: lower_global_pool for name in GLOBAL_POOLS},
    **{name: lower_reduce for name in REDUCTIONS},
    **{name: lower_arg_reduce for name in ARG_REDUCTIONS},
    "MaxPool": lower_pool,
    "AveragePool": lower_pool,
    **{name: lower_movement for name in MOVEMENTS},
    "Concat": lower_concat,
    "Gather": lower_take,
    **{name: lower_map for name in MAPS},
    "Cast": lower_cast,
    "Resize": lower_nearest_resize,
    "Upsample": lower_nearest_resize,
    "Conv": lower_conv,
    "FusedConv": lower_conv,
    "ConvTranspose": lower_conv_transpose,
    "BatchNormalization": lower_batch_norm,
    "FusedDense": lower_dense,
    "OneHotDense": lower_one_hot_dense,
    "FusedDenseChain": lower_dense_chain,
    "MatMul": lower_dense,
    "Gemm": lower_dense,
    "Softmax": row_activation("softmax"),
    "LogSoftmax": row_activation("log_softmax"),
    "FusedElementwise": lower_elementwise,
    "com.microsoft::DynamicQuantizeMatMul": lower_dynamic_matmul,
    "com.microsoft::DynamicQuantizeLSTM": lower_dynamic_lstm,
    "LayerNormalization": lower_layer_norm,
    "FusedAttention": lower_attention,
    **{name: lower_elementwise for name in ELEMENTWISE},
    "LSTM": recurrent("LSTM"),
    "FusedLSTMCell": lower_fused_lstm_cell,
    "GRU": recurrent("GRU"),
    "RNN": recurrent("RNN"),
    **{f"Embedding{kind}": recurrent(kind, embedding=True) for kind in ("LSTM", "GRU", "RNN")},
    **{f"{FASTLAYERS}::Masked{kind}": recurrent(kind, masked=True) for kind in ("LSTM", "GRU", "RNN")},
    **{f"EmbeddingMasked{kind}": recurrent(kind, embedding=True, masked=True) for kind in ("LSTM", "GRU", "RNN")},
    **{name: activation(*act) for name, act in ACTIVATIONS.items()},
    "Gelu": lower_gelu,
    "FusedAdd": lower_fused_add,
    "DequantizeLinear": lower_dequantize,
    "If": lambda *args: lower_if(*args, walk=_walk),
    "Loop": lambda *args: lower_loop(*args, walk=_walk),
    "Scan": lambda *args: lower_scan(*args, walk=_walk),
}
#: Control-flow operators, whose bodies a native plan runs inside one step (``plan_control``).
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
#: Operators whose lowering reads channels-last values as they are held; the others' plan
#: values are given to them in C order (``Lowering.c_order``).
ANY_LAYOUT = frozenset(
    {
        "Conv",
        "FusedConv",
        "ConvTranspose",
        "BatchNormalization",
        "FusedElementwise",
        "MaxPool",
        "AveragePool",
        "Resize",
        "Upsample",
        *GLOBAL_POOLS,
    }
    | set(ELEMENTWISE)
    | set(ACTIVATIONS)
    | {"Gelu", "FusedAdd"}
    | MOVEMENTS
    | ALIASES
)


class _Fallback:
    """A node run in Python inside a plan: its function on the arena's views of its inputs,
    its results copied into its outputs' views (checked against the trace's shapes and
    types). Returns 0, or -3 with the error kept in ``error``."""

    def __init__(self, fn, args, attrs, opset, views, node):
        self.fn, self.args, self.attrs, self.opset, self.views, self.node = fn, args, attrs, opset, views, node
        self.error = None

    def __call__(self):
        try:
            results = self.fn(self.args, self.attrs, self.opset)
            for r, v in zip(results, self.views):
                if v is None:
                    continue
                r = np.asarray(r)
                if r.shape != v.shape or r.dtype != v.dtype:
                    raise PlanMismatch(f"{r.dtype}{r.shape} where the plan holds {v.dtype}{v.shape}")
                np.copyto(v, r)
            return 0
        except BaseException as e:  # noqa: BLE001 - kept for the caller, who raises it
            self.error = e
            return -3


def _fallback(low, fn, node, index, ins, traced_ins, traced_outs, attrs):
    """The node's function inside the plan, on its inputs as the Python plan holds them (a
    channels-last value as an (N, C, *S) view of its memory), its results copied into values
    of the layouts the trace gave them."""
    outs = []
    for t in traced_outs:
        outs.append(None if t is None else low.new(t.shape, t.dtype, layout_of(t)))
        low.moved += 0 if t is None else 2 * t.nbytes
    for v in ins:
        low.use(v)
        if isinstance(v, Value):
            low.python_reads.add(id(v.buffer))

    # the constants alone: the trace's other values would otherwise live until the plan is bound
    constants = [None if isinstance(v, Value) else t for v, t in zip(ins, traced_ins)]

    def bind(plan, arena):
        args = [logical_view(arena, v) if isinstance(v, Value) else t for v, t in zip(ins, constants)]
        views = [None if o is None else logical_view(arena, o) for o in outs]
        holder = _Fallback(fn, args, attrs, low.model.opset, views, index)
        plan.add_python(holder)
        low.holders.append(holder)

    low.emit(bind)
    low.fallbacks.append(node.op_type)
    return outs


class Unplannable(Exception):
    """A model the plans cannot hold (a value computed from the inputs that is no array: an
    ONNX sequence); its calls run through the Python plan."""


def _array(value, node):
    """A traced value computed from the inputs, as an array (numpy scalars included)."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise Unplannable(f"{node.op_type} gives a {type(value).__name__}")


def _walk(low, model, inputs):
    """Trace and lower ``model``'s bound plan on ``inputs`` (per input: (traced array, plan
    value or None for a constant)); its outputs likewise."""
    traced = dict(zip(model._input_names, (t for t, _ in inputs)))
    lowered = dict(zip(model._input_names, (v for _, v in inputs)))
    bound = model._bound_plan()
    last = {}  # name -> the last node that reads it: the trace keeps no value longer than the Python plan
    for index, (_, ins, _, _, _) in enumerate(bound):
        last.update((i, index) for i in ins if type(i) is str)
    kept = set(model.output_names)
    for index, (node, (fn, ins, outs, attrs, _)) in enumerate(zip(model._nodes, bound)):
        low.left -= 1
        t_ins = [traced[i] if type(i) is str else i for i in ins]
        l_ins = [lowered.get(i) if type(i) is str else None for i in ins]
        # Shape and Size read the shapes alone, fixed for the plan
        dynamic = node.op_type in NONDETERMINISTIC or (
            node.op_type not in ("Shape", "Size") and any(v is not None for v in l_ins)
        )
        if node.op_type == "If" and isinstance(attrs.get("then_branch"), Body) and l_ins[0] is None:
            body = attrs[taken_branch(t_ins, attrs)]
            captured = list(zip(t_ins[attrs["_formal"] :], l_ins[attrs["_formal"] :]))
            results = _walk(low, body.model, captured)
        elif not dynamic:
            results = [(r, None) for r in fn(t_ins, attrs, model.opset)]
        else:
            t_outs = [_array(t, node) for t in fn(t_ins, attrs, model.opset)]
            low.step += 1
            low.nodes.append(
                [
                    model,
                    index,
                    [None if t is None else np.shape(t) for t in t_ins],
                    [np.shape(t) for t in t_outs if t is not None],
                    "native",
                ]
            )
            lower = LOWERINGS.get(node.op_type)
            marks = low.mark()
            try:
                if lower is None:
                    raise NotLowered
                ins_here = l_ins if node.op_type in ANY_LAYOUT else [low.c_order(v) for v in l_ins]
                token = low.ops.begin_build()  # its tables on the C library's heap, trimmed after
                try:
                    l_outs = lower(low, node, ins_here, t_ins, t_outs, {"_attrs": attrs, "_fn": fn})
                finally:
                    low.ops.end_build(token)
                if any(name and t is not None and not isinstance(v, Value) for name, t, v in zip(outs, t_outs, l_outs)):
                    raise NotLowered
                low.native.append(node.op_type)
                low.saved_us += EXTRA_STEP_US.get(node.op_type, 0.0)
                if len(low.emits) > marks[0]:  # steps of its own (not a view of its input)
                    low.results += sum(t.nbytes for t in t_outs if t is not None)
            except NotLowered:  # what the lowering began is dropped
                low.rollback(marks)
                low.nodes[-1][4] = "python"
                l_outs = _fallback(low, fn, node, (model, index), l_ins, t_ins, t_outs, attrs)
            results = list(zip(t_outs, l_outs))
            # stop tracing once the copies so far outweigh all the plan could still save
            runs, python_runs = len(low.native) + low.repeated[0], len(low.fallbacks) + low.repeated[1]
            if not pays(runs + low.left, python_runs, low.moved, low.gathered, low.results, low.saved_us):
                raise DoesNotPay
        for name, (t, v) in zip(outs, results):
            if name:
                traced[name], lowered[name] = t, v
        for name in ins:
            if type(name) is str and last.get(name) == index and name not in kept:
                traced.pop(name, None)
    return [(traced[o], lowered.get(o)) if o in traced else (model._constants[o], None) for o in model.output_names]


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` bytes whose address is a multiple of ``ALIGN``, as the arena's are."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


def _place(buffers, end):
    """Offsets for ``buffers`` in one arena: buffers whose steps overlap never share bytes
    (the largest placed first, each at the lowest offset free over its lifetime); the
    arena's size."""
    placed: list[Buffer] = []
    top = 0
    for b in sorted(buffers, key=lambda b: -b.nbytes):
        clashes = sorted((p.offset, p.offset + p.nbytes) for p in placed if not (p.last < b.first or b.last < p.first))
        offset = 0
        for lo, hi in clashes:
            if offset + b.nbytes <= lo:
                break
            offset = max(offset, -(-hi // ALIGN) * ALIGN)
        b.offset = offset
        top = max(top, offset + b.nbytes)
        placed.append(b)
    return top


def pays(native: int, fallbacks: int, moved: int, gathered: int = 0, results: int = 0, extra_us: float = 0.0) -> bool:
    """Whether a plan of ``native`` nodes lowered natively (their steps writing ``results``
    bytes; ``extra_us`` what some of them save beyond ``STEP_US``, ``EXTRA_STEP_US``),
    ``fallbacks`` run in Python, ``moved`` bytes copied and ``gathered`` bytes gathered that the
    Python plan does not move saves more than it costs."""
    cost = PLAN_US + FALLBACK_US * fallbacks + moved / COPY_BYTES_PER_US + gathered / GATHER_BYTES_PER_US
    return STEP_US * native + extra_us + results / RESULT_BYTES_PER_US > cost


class Plan:
    """A model's native plan for one key: ``run(arrays)`` -> {output name: array}, or None
    where it cannot serve the call (another thread runs it)."""

    def __init__(self, native, inputs, input_views, outputs, constants, holders, summary):
        self.native, self.inputs, self.outputs = native, inputs, outputs
        self.fed = [k for k, v in enumerate(input_views) if v is not None]
        self.input_views = [input_views[k] for k in self.fed]
        self.constants, self.holders, self.summary = constants, holders, summary
        self.all_fed = len(self.fed) == len(inputs)  # every input copied in or read in place
        self.output_names = [name for name, _ in outputs]
        self.output_views = [v for _, v in outputs]

    def run(self, arrays):
        fed = arrays if self.all_fed and type(arrays) is list else [arrays[k] for k in self.fed]
        results = self.native.run(fed, self.input_views, self.output_views)
        if results is None:
            return None
        values = dict(zip(self.inputs, arrays))  # the call's inputs, as the Python plan's table
        values.update(zip(self.output_names, results))
        for name, array in self.constants:
            values[name] = array.copy()
        return values


def profile_plan(plan, name, arrays, repeats: int, threads: int, pause: float):
    """The profile (``profile.Profile``) of ``repeats`` calls of native ``plan`` on ``arrays``
    (each after ``pause`` seconds; one untimed call before them): per node lowered, the median
    over the calls of its steps' time, its kernel ``native`` (its steps bound in the plan),
    ``alias`` (none: a view of its input's memory) or ``python`` (its function run inside the
    plan); None where another call runs the plan now."""
    from .profile import Profile, Step, body_detail, node_detail

    fed = [arrays[k] for k in plan.fed]
    outputs = [v for _, v in plan.outputs]
    ns = np.zeros(len(plan.native), np.int64)
    per_call, totals = [], []
    if plan.native.run(fed, plan.input_views, outputs, ns) is None:  # untimed, as the Python plan's first
        return None
    for _ in range(repeats):
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        if plan.native.run(fed, plan.input_views, outputs, ns) is None:
            return None
        totals.append(time.perf_counter() - t0)
        per_call.append(
            np.bincount(plan.owner, weights=ns, minlength=len(plan.nodes)) if len(ns) else np.zeros(len(plan.nodes))
        )
    node_ms = np.median(np.array(per_call), axis=0) * 1e-6 if per_call else np.zeros(len(plan.nodes))
    total_ms = float(np.median(totals) * 1e3)
    steps = []
    counts = np.bincount(plan.owner, minlength=len(plan.nodes)) if len(plan.owner) else np.zeros(len(plan.nodes), int)
    for k, (model, index, in_shapes, out_shapes, kind) in enumerate(plan.nodes):
        node = model._nodes[index]
        attrs = model._plan[index][3]
        kernel = "python" if kind == "python" else "native" if counts[k] else "alias"
        # a control-flow node run natively is one step: its bodies' operators are in its row
        fused = (
            body_detail(attrs)
            if kind == "native" and node.op_type in CONTROL_FLOW
            else node_detail(node.op_type, attrs)
        )
        label = node.name or (node.outputs[0] if node.outputs else "")
        steps.append(Step(k, node.op_type, label, fused, in_shapes, out_shapes, "-", kernel, float(node_ms[k])))
    for s in steps:
        s.share = s.ms / total_ms if total_ms else 0.0
    return Profile(f"{name} (native plan)", threads, repeats, total_ms, steps, pause)


def lower(model, arrays, ops):
    """A ``Plan`` of ``model`` for calls like ``arrays`` (the checked inputs, graph order) on
    backend ``ops``, or None where the backend has no native plans or the plan built does not
    give the call's outputs. Raises ``DoesNotPay`` where the cost model rejects the plan, and
    the error of a node that fails on the trace. The trace's values, the plan's arena and
    its inputs' memory come from the call's block arena as the Python plan's values do; the
    lowering's tables and the build's check from the C library's heap, whose free pages go
    back to the system after the build."""
    try:
        return _lower(model, arrays, ops)
    finally:
        ops.trim_build()


def _lower(model, arrays, ops):
    """``lower``."""
    low = Lowering(model, ops)
    inputs = []
    for a in arrays:
        if not _keyed_values(a):
            inputs.append((a, low.new(a.shape, a.dtype)))
        else:
            inputs.append((a, None))
    outputs = _walk(low, model, inputs)
    outputs = [(t, low.c_order(v)) for t, v in outputs]
    low.step += 1
    values = []
    for name, (t, v) in zip(model.output_names, outputs):
        if isinstance(v, Value):
            low.use(v)
        values.append((name, t, v))
    # an input that no Python step reads and no output shares is read from the caller's array
    shared = {id(v.buffer) for _, _, v in values if isinstance(v, Value)} | low.python_reads
    movable = [v is not None and id(v.buffer) not in shared for _, v in inputs]
    low.moved += 2 * sum(a.nbytes for (a, v), move in zip(inputs, movable) if v is not None and not move)
    low.moved += 2 * sum(np.asarray(t).nbytes for _, t, v in values if v is not None)
    runs, python_runs = len(low.native) + low.repeated[0], len(low.fallbacks) + low.repeated[1]
    if not pays(runs, python_runs, low.moved, low.gathered, low.results, low.saved_us):
        raise DoesNotPay
    end = low.step
    for b in low.buffers:
        if any(b is v.buffer for _, _, v in values if isinstance(v, Value)):
            b.last = end
    # the plan's memory from the call's block arena: the pages the trace's values just freed
    for a, v in inputs:  # each input in memory of its own, which no other value shares
        if v is not None:
            v.buffer.home = _aligned_bytes(v.buffer.nbytes)
    native = ops.native_plan(_place([b for b in low.buffers if b.home is None], end))
    if native is None:
        return None
    token = ops.begin_build()
    try:
        return _bind(low, model, arrays, native, inputs, values, movable)
    finally:
        ops.end_build(token)


def _bind(low, model, arrays, native, inputs, values, movable):
    """The plan ``low`` lowered and placed, bound and checked on ``arrays`` (``lower``)."""
    arena = native.arena
    owner = []  # per native step, the index of its node in low.nodes
    for fn, node in low.emits:
        start = len(native)
        fn(native, arena)
        owner += [node] * (len(native) - start)
    plan = Plan(
        native,
        model._input_names,
        [arena_view(arena, v) if v is not None else None for _, v in inputs],
        [(name, arena_view(arena, v)) for name, _, v in values if isinstance(v, Value)],
        [(name, np.asarray(t)) for name, t, v in values if not isinstance(v, Value)],
        low.holders,
        (tuple(low.native), tuple(low.fallbacks), low.moved + low.gathered),
    )
    plan.nodes, plan.owner = low.nodes, np.array(owner, np.int64)
    native.read_in_place(plan.input_views, [movable[k] for k in plan.fed])
    trial = [np.array(a) for a in arrays]  # copies: the check below that no step writes an input
    try:
        got = plan.run(trial)
    except Exception:
        holder = next((h for h in low.holders if h.error is not None), None)
        if holder is not None:  # the node's own error (the key keeps the Python plan)
            raise holder.error from None
        raise
    for name, want, _ in values:
        have = got[name]
        want = np.asarray(want)
        if have.shape != want.shape or have.dtype != want.dtype:
            return None
        if want.dtype.kind == "f":
            finite = np.abs(want[np.isfinite(want)])  # a NaN or inf output leaves the scale finite
            scale = float(finite.max()) if finite.size else 0.0
            if not np.allclose(have, want, rtol=VERIFY_RTOL, atol=VERIFY_RTOL * scale, equal_nan=True):
                return None
        elif not np.array_equal(have, want):
            return None
    if any(a.tobytes() != b.tobytes() for a, b in zip(trial, arrays)):
        return None  # a step wrote into an input it reads in place: the plan cannot serve
    return plan


class NativePlans:
    """A model's native plans by key, built at the ``BUILD_AFTER``-th call with a key."""

    def __init__(self, model):
        self.model = model
        self.plans: dict = {}
        self.lock = threading.Lock()
        #: the most nodes a plan of the model could lower (those of If branches included)
        self.nodes = node_count(model)
        #: what its nodes could save beyond ``STEP_US`` each (``EXTRA_STEP_US``)
        self.extra_us = sum(EXTRA_STEP_US.get(node.op_type, 0.0) for node in model._nodes)
        #: builds that failed; no more builds once a plan did not pay or MAX_FAILED_BUILDS failed
        self.failures, self.off = 0, False
        #: whether some key has a plan (while none has and no more are built, a call looks
        #: up nothing: ``run`` returns at once)
        self.serving = False

    def key(self, arrays, ops, threads):
        return (
            tuple([(a.shape, a.dtype.char, a.tobytes() if _keyed_values(a) else None) for a in arrays]),
            ops.name,
            threads,
            derived_generation(),
            settings.current(),  # the limits a call checks: a plan is built under them
        )

    def run(self, arrays):
        """The call's {output name: array} from its key's plan; None where the Python plan
        takes the call (no plan yet, none possible, or the plan busy)."""
        if self.off and not self.serving:
            return None
        ops = get_ops()
        threads = ops.plan_threads()
        if threads is None:
            return None
        key = self.key(arrays, ops, threads)
        plan = self._plan(key, arrays, ops, BUILD_AFTER)
        if plan is None:
            return None
        try:
            if not plan.holders:  # native kernels do not signal floating-point errors to numpy
                return plan.run(arrays)
            with np.errstate(all="ignore"):  # NaN and inf propagate, as in onnxruntime
                return plan.run(arrays)
        except Exception as e:
            if ops.plan_refused_input(e):  # a bad index, a NaN for Winograd, a loop limit: the Python plan's call
                return None
            if ops.plan_shapes_changed(e):  # a loop's iterations other than the trace's: Python from now on
                self._keep(key, False)
                return None
            holder = next((h for h in plan.holders if h.error is not None), None)
            if holder is None:  # a native step failed (a work buffer not allocated)
                raise
            error, holder.error = holder.error, None
            if isinstance(error, PlanMismatch):  # shapes that depend on values: Python from now on
                self._keep(key, False)
                return None
            model, index = holder.node
            model._step_failed(index, error)  # raises the node's error, named
            raise

    def _plan(self, key, arrays, ops, build_after):
        """The plan of ``key`` for calls like ``arrays``, built at the ``build_after``-th call
        with the key (this one counted); None where there is none (yet)."""
        plan = self.plans.get(key)
        if plan is None or type(plan) is int:
            seen = (plan or 0) + 1
            if self.off:
                return None
            if seen < build_after:
                self._keep(key, seen)
                return None
            if not pays(self.nodes, 0, 0, extra_us=self.extra_us):  # the plan's own cost alone
                self.off = True  # the same for every key
                self._keep(key, False)
                return None
            with self.lock:
                plan = self._build(key, arrays, ops)
        return plan if isinstance(plan, Plan) else None

    def _build(self, key, arrays, ops):
        """The plan of ``key`` for calls like ``arrays``, kept; False where there is none."""
        try:
            plan = lower(self.model, arrays, ops) or False
        except DoesNotPay:
            plan = False
            if not any(_keyed_values(a) for a in arrays):  # nor would it at other shapes, as a rule
                self.off = True
            else:  # what read the key's integer inputs was a constant; other keys read them as data
                self._keep(key, plan)
                return plan
        except Exception:  # noqa: BLE001 - a model the lowering does not cover runs in Python
            plan = False
        if plan is False and not self.off:
            self.failures += 1
            self.off = self.failures >= MAX_FAILED_BUILDS
        self._keep(key, plan)
        return plan

    def plan_for(self, arrays):
        """The native plan that serves calls on ``arrays`` from their ``BUILD_AFTER``-th on,
        built now where none is yet (a profile's calls are those calls), or None where calls
        on them run in Python."""
        ops = get_ops()
        threads = ops.plan_threads()
        if threads is None:
            return None
        return self._plan(self.key(arrays, ops, threads), arrays, ops, 1)

    def _keep(self, key, value):
        if len(self.plans) >= MAX_PLANS and key not in self.plans:
            self.plans.clear()
        self.plans[key] = value
        self.serving = any(isinstance(p, Plan) for p in self.plans.values())
