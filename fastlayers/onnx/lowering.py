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
- every other node is lowered (``LOWERINGS``): reshapes become aliases of their input's
  memory; data movement (Slice, Transpose, Pad, Concat, Gather on constant indices, Expand,
  Tile, ...) becomes gathers whose per-axis source tables come from running the node on
  index arrays (``_movement``: exact by construction, whatever the operator's attributes);
  convolutions, recurrent nodes (the int8 ones too), elementwise programs, layer norms and
  activations bind the cpu backend's kernels. Anything else calls the node's function and
  copies its results into the arena, checking their shapes (a node whose output shapes
  depend on values sends the call back to the Python plan, and the key's plan is dropped);
- buffers get offsets in one arena by lifetime (``_place``), then the plan runs once on the
  trace's inputs and must give its outputs (``VERIFY_RTOL``), or the key keeps the Python
  plan.

A plan runs one call at a time (its arena is its own): a call that finds it running (another
thread) takes the Python plan.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from .. import settings
from ..backends import get_ops
from ..backends.derived import derived, derived_generation
from ..backends.reference import fold_batch_norm
from .control import Body, taken_branch
from .fold import NONDETERMINISTIC
from .layout import channels_last_memory, nchw_planes
from .ops.conv import conv_transpose_form, conv_transpose_hwio
from .ops.recurrent import recurrent_calls
from .ops.reduce import AXES_INPUT_FROM, reduce_axes
from .qlinear import dynamic_matmul_constants
from .qlstm import direction_constants
from .windows import window

#: Most plans a model keeps (one per key); more: the table is cleared and rebuilt.
MAX_PLANS = 8
#: Integer and bool inputs of at most this many values are part of a plan's key (a sample
#: rate, a flag): what depends on them alone is a constant of the plan.
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
#: What each byte of a native step's result saves besides: the Python plan writes each
#: node's result into memory its allocator hands back cold in cache, where the plan's arena
#: reuses buffers while they are warm (30-90 us per MB of results measured, docs/design.md).
RESULT_BYTES_PER_US = 33000.0
#: What a call through a plan costs beyond the Python plan's, whatever its steps: the key,
#: the outputs copied out, the GIL released and taken back (10-15 us
#: measured where the steps took 3.4: a two-layer MLP of 8 rows, whose Python plan is one
#: native call, ran 43 -> 54 us as a plan).
PLAN_US = 15.0

#: Most values of an elementwise result for which a constant operand it broadcasts (other
#: than one value) is broadcast to the result's shape at the build, as the plan's own copy.
BROADCAST_CONSTANT_MAX = 1 << 18
#: Positions of a movement's table checked at a time against its per-axis factors (``_factored``).
FACTOR_BLOCK = 1 << 16
#: Operators that keep their input's memory as it is, in C order (aliases in a plan).
ALIASES = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"})
#: Reductions whose result over one value is that value: over axes of length 1, aliases.
SINGLE_IS_ITSELF = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"})
#: Means and maxima over every position of each channel (a global pool where held
#: channels-last; ReduceMean / ReduceMax over axes of length 1 only: aliases).
GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax"})
#: Operators with a map step (``_map``), by the step's name for them; Add / Sub / Mul / Div
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
#: The element types a map step reads and writes.
MAP_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.bool_))
#: The types it reads besides: quantized values (``_dequantize``).
#: Types of the values a gather moves (as bits: 1, 2, 4 or 8 bytes each).
GATHER_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8)
    + (np.uint64, np.uint32, np.uint16, np.uint8, np.bool_)
)

QUANTIZED_DTYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
#: Every type a plan step reads: a take step gathers any of them.
MAP_READ_DTYPES = MAP_DTYPES | QUANTIZED_DTYPES
#: Reductions with a native step (``_reduce``), by the step's name for them.
REDUCTIONS = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceSumSquare": "sum_square",
}
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
#: Operators that are one activation of the native core, as ``ops/elementwise.py`` runs them
#: (onnxruntime's sigmoid and tanh): name, the attribute holding alpha, its default.
ACTIVATIONS = {
    "Relu": ("relu", None, 0.0),
    "Sigmoid": ("onnx_sigmoid", None, 0.0),
    "Tanh": ("onnx_tanh", None, 0.0),
    "Softsign": ("softsign", None, 0.0),
    "LeakyRelu": ("leaky_relu", "alpha", 0.01),
}


class NotLowered(Exception):
    """A node that the native steps do not cover: it runs in Python inside the plan."""


class DoesNotPay(Exception):
    """The cost model finds that a plan of the model would not pay (``pays``)."""


class PlanMismatch(Exception):
    """A node in Python gave values of other shapes or types than the trace: the call goes
    back to the Python plan."""


class _Buffer:
    """A region of the arena: its bytes, the first and last step that use it, its offset; or
    memory of its own (``home``: an input's, which steps may read from the caller's array in
    its place)."""

    __slots__ = ("nbytes", "first", "last", "offset", "home")

    def __init__(self, nbytes, first):
        self.nbytes, self.first, self.last, self.offset, self.home = nbytes, first, first, -1, None


class _Value:
    """A value computed by the plan: ``shape`` and ``dtype`` at ``offset`` bytes into
    ``buffer``, C-contiguous (``perm`` None) or held channels-last: the C-contiguous memory
    ``memory_shape`` viewed through the axes ``perm`` (``CHANNELS_LAST``), as the Python plan
    holds a convolution's result (``layout.py``)."""

    __slots__ = ("buffer", "offset", "shape", "dtype", "perm")

    def __init__(self, buffer, offset, shape, dtype, perm=None):
        self.buffer, self.offset, self.shape, self.dtype = buffer, offset, tuple(shape), np.dtype(dtype)
        self.perm = perm

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def memory_shape(self):
        """The shape of the C-contiguous memory (``shape`` itself where ``perm`` is None)."""
        if self.perm is None:
            return self.shape
        return tuple(self.shape[a] for a in np.argsort(self.perm))


def _channels_last(ndim: int):
    """The axes that view channels-last memory (N, *S, C) as (N, C, *S)."""
    return (0, ndim - 1, *range(1, ndim - 1))


def _layout(t):
    """The ``perm`` of a plan value holding the traced array ``t`` as the Python plan holds it:
    channels-last where ``t`` is an (N, C, *S) view of (N, *S, C) memory, else None."""
    if isinstance(t, np.ndarray) and t.dtype == np.float32 and channels_last_memory(t) is not None:
        return _channels_last(t.ndim)
    return None


class _Lowering:
    """One plan being lowered: the buffers, the steps to bind once placed (``emits``), the
    nodes that run in Python."""

    def __init__(self, model, ops):
        self.model, self.ops = model, ops
        self.buffers: list[_Buffer] = []
        self.emits: list = []  # (function(plan, arena), index of its node in ``nodes``)
        self.holders: list = []  # the _Fallback steps bound, whose errors a failing run raises
        self.left = _node_count(model)  # nodes not yet traced (an upper bound: both If branches)
        self.step = 0
        self.fallbacks: list[str] = []
        self.native: list[str] = []
        self.moved = 0  # bytes the plan copies that the Python plan does not (cost model)
        self.gathered = 0  # bytes the plan gathers (layout moves) that the Python plan does not
        self.results = 0  # bytes the native steps' results take (written into warm buffers)
        self.node = None  # the node being lowered: (model, index), for the profile
        self.nodes: list = []  # per node lowered: (model, index, input shapes, output shapes, kind)
        self.python_reads: set = set()  # ids of the buffers that Python steps read
        self.c_forms: dict = {}  # id of a channels-last value -> (it, its C-contiguous copy)
        self.c_added: list = []  # the keys of c_forms in the order added (dropped with their node)

    # values and buffers
    def new(self, shape, dtype=np.float32, perm=None) -> _Value:
        shape = tuple(int(d) for d in shape)
        nbytes = max(math.prod(shape) * np.dtype(dtype).itemsize, 1)
        buffer = _Buffer(nbytes, self.step)
        self.buffers.append(buffer)
        return _Value(buffer, 0, shape, dtype, perm)

    def c_order(self, value):
        """``value`` C-contiguous: itself, or for a channels-last value its copy in C order
        (one per value, made where a step first needs it)."""
        if not isinstance(value, _Value) or value.perm is None:
            return value
        found = self.c_forms.get(id(value))
        if found is None:
            # the Python plan copies such a value to C order too (numpy, for its consumer)
            found = value, _transposed(self, _memory(value), value.perm, extra=False)
            self.c_forms[id(value)] = found
            self.c_added.append(id(value))
        return self.use(found[1])

    def use(self, value):
        if isinstance(value, _Value):
            value.buffer.last = max(value.buffer.last, self.step)
        return value

    def emit(self, fn):
        """Bind ``fn(plan, arena)`` once the buffers are placed, as a step of the node being
        lowered."""
        self.emits.append((fn, len(self.nodes) - 1))

    def mark(self):
        """Where the lowering stands (steps, buffers, counted bytes, C-order copies), for
        ``rollback``; the first item is the count of steps."""
        return len(self.emits), len(self.buffers), self.moved, len(self.c_added), self.gathered

    def rollback(self, marks):
        """Drop what was begun since ``mark`` gave ``marks``."""
        del self.emits[marks[0] :], self.buffers[marks[1] :]
        self.moved, self.gathered = marks[2], marks[4]
        for key in self.c_added[marks[3] :]:
            del self.c_forms[key]
        del self.c_added[marks[3] :]


def _memory(value: _Value) -> _Value:
    """The C-contiguous memory of ``value`` as a value (``value`` itself where it is C order)."""
    if value.perm is None:
        return value
    return _Value(value.buffer, value.offset, value.memory_shape, value.dtype)


def _view(arena, value: _Value) -> np.ndarray:
    """The arena's C-contiguous memory of ``value`` (of ``memory_shape``; in its buffer's own
    memory where it has one): what kernels take."""
    home = value.buffer.home
    start = value.offset if home is not None else value.buffer.offset + value.offset
    nbytes = value.size * value.dtype.itemsize
    return (arena if home is None else home)[start : start + nbytes].view(value.dtype).reshape(value.memory_shape)


def _logical(arena, value: _Value) -> np.ndarray:
    """``value`` as an array of its shape: a view of its memory through ``perm``."""
    view = _view(arena, value)
    return view if value.perm is None else view.transpose(value.perm)


def _operand(arena, v):
    """A step's operand: the arena memory of a plan value, or the constant itself."""
    return _view(arena, v) if isinstance(v, _Value) else v


# --- lowerings: each (low, node, ins, outs, traced inputs, traced outputs, attrs) -> values


def _alias(low, node, ins, traced_ins, traced_outs, attrs):
    x, out = ins[0], traced_outs[0]
    if (
        not isinstance(x, _Value)
        or any(isinstance(v, _Value) for v in ins[1:])  # a shape computed from the data
        or not isinstance(out, np.ndarray)
        or out.dtype != x.dtype
        or out.size != x.size
    ):
        raise NotLowered
    low.use(x)
    return [_Value(x.buffer, x.offset, out.shape, x.dtype)] + [None] * (len(traced_outs) - 1)


def _factored(table: np.ndarray):
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


def _nearest_resize(low, node, ins, traced_ins, traced_outs, attrs):
    """Resize / Upsample in nearest mode: a data movement (``_movement``); linear ones blend
    values, and stay in Python."""
    if attrs["_attrs"].get("mode", "nearest") != "nearest" or isinstance(ins[0], _Value) and len(ins[0].shape) < 1:
        raise NotLowered
    return _movement(low, node, ins, traced_ins, traced_outs, attrs, moved=(0,))  # not its scales


def _kept_layout(t, sources):
    """The ``perm`` of the result ``t`` of a movement that keeps its inputs' axes: as the trace
    holds it, or channels-last where every plan value among ``sources`` is (a channel slice or
    concatenation: runs of channels)."""
    perm = _layout(t)
    held = {v.perm for v in sources if isinstance(v, _Value)}
    if perm is None and t.ndim in (3, 4) and held == {_channels_last(t.ndim)}:
        perm = _channels_last(t.ndim)
    return perm


def _concat(low, node, ins, traced_ins, traced_outs, attrs):
    """Concat as one gather per part into its block of the result, the offsets from the
    shapes alone (no index run: the detectors' (1, 32, 320, 320) results made the build's
    largest arrays); its layout ``_kept_layout``'s."""
    out = traced_outs[0]
    parts = [(v, t) for v, t in zip(ins, traced_ins) if isinstance(t, np.ndarray) and t.size]
    if (
        not isinstance(out, np.ndarray)
        or out.dtype not in GATHER_DTYPES
        or not parts
        or any(t.dtype != out.dtype or t.ndim != out.ndim for _, t in parts)
        or any(isinstance(v, _Value) and v.dtype != out.dtype for v, _ in parts)
    ):
        raise NotLowered
    axis = attrs["_attrs"].get("axis", 0) % out.ndim
    perm = _kept_layout(out, [v for v, _ in parts])
    y = low.new(out.shape, out.dtype, perm=perm)
    y_perm = perm or tuple(range(out.ndim))
    y_strides = [math.prod(y.memory_shape[i + 1 :]) for i in range(out.ndim)]
    logical = np.argsort(y_perm)  # the logical axis of each axis of y's memory
    pieces, start = [], 0
    for v, t in parts:
        if t.shape[:axis] + t.shape[axis + 1 :] != out.shape[:axis] + out.shape[axis + 1 :]:
            raise NotLowered
        src = low.use(v) if isinstance(v, _Value) else np.ascontiguousarray(t)
        src_perm = (v.perm if isinstance(v, _Value) else None) or tuple(range(out.ndim))
        src_memory = tuple(t.shape[a] for a in np.argsort(src_perm))
        src_strides = [math.prod(src_memory[i + 1 :]) for i in range(out.ndim)]
        dims = [t.shape[a] for a in logical]
        maps = [np.arange(t.shape[a], dtype=np.int64) * src_strides[src_perm[a]] for a in logical]
        pieces.append((src, start * y_strides[y_perm[axis]], dims, maps))
        start += t.shape[axis]
    if start != out.shape[axis]:
        raise NotLowered

    def bind(plan, arena):
        dst = _view(arena, y).reshape(-1)
        for src, offset, dims, maps in pieces:
            _gather(plan, _operand(arena, src).reshape(-1), dst[offset:], dims, y_strides, maps)

    low.emit(bind)
    return [y]


def _movement(low, node, ins, traced_ins, traced_outs, attrs, moved=None):
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
            and (isinstance(v, _Value) or t.size)
            and (moved is None or k in moved)
        ]
        if any(isinstance(v, _Value) and v.dtype != np.float32 for v in ins):
            raise NotLowered
    elif data in GATHER_DTYPES and (moved is None or 0 in moved) and node.op_type != "Concat":
        # integers, bools, quantized bytes: the first input is the data, every other a constant
        sources = [0] if isinstance(ins[0], _Value) or traced_ins[0].size else []
        if any(isinstance(v, _Value) for v in ins[1:]) or (isinstance(ins[0], _Value) and ins[0].dtype != data):
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
            held = v.memory_shape if isinstance(v, _Value) else traced_ins[k].shape
            index = np.arange(traced_ins[k].size, dtype=dtype)
            index += (j + 1) * span + offset
            index = index.reshape(held)
            args[k] = index.transpose(v.perm) if isinstance(v, _Value) and v.perm is not None else index
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
        perm = _kept_layout(t, [ins[k] for k in sources]) if node.op_type in KEEPS_AXES else _layout(t)
        y = low.new(t.shape, data, perm=perm)
        order = None if perm is None else np.argsort(perm)
        if order is not None:
            a = a.transpose(order)
            b = None if b is None else b.transpose(order)
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
            maps = _factored(table)
            if maps is None:
                pieces.append((k, 0, (table.size,), [1], [table.reshape(-1)]))
            else:
                pieces.append((k, 0, table.shape, c_strides, maps))
        else:  # each source's values fill a box of the output (Concat, Split)
            if not every:
                raise NotLowered
            for k, mine, j in parts:
                box = _box(mine)
                inside = None if box is None else tuple(slice(s, s + d) for s, d in zip(*box))
                maps = None if box is None else _factored(a[inside] - (j + 1) * span)
                if maps is None:
                    raise NotLowered
                start, dims = box
                pieces.append((k, sum(s * c for s, c in zip(start, c_strides)), dims, c_strides, maps))
        sources_of = {
            k: low.use(ins[k]) if isinstance(ins[k], _Value) else np.ascontiguousarray(traced_ins[k], data)
            for k, *_ in pieces
        }

        def bind(plan, arena, y=y, pieces=pieces, sources_of=sources_of, fill=fill):
            dst = _view(arena, y).reshape(-1)
            for k, offset, dims, strides, maps in pieces:
                src = _operand(arena, sources_of[k]).reshape(-1)
                _gather(plan, src, dst[offset:], dims, strides, maps, fill)

        low.emit(bind)
        if node.op_type in VIEWS:  # numpy's result is a view: the Python plan's consumer moves it
            low.moved += 2 * t.nbytes
        outs.append(y)
    return outs


def _gather(plan, src, dst, dims, strides, maps, fill=0.0):
    """``plan.add_gather`` with axes of length 1 dropped and neighbouring axes merged where
    both read and write evenly spaced values (a Slice of whole rows: one copy per row, not per
    value); a layout move (the source's rows the destination's columns) as a transpose step."""
    dims, strides, maps = list(dims), list(strides), [np.asarray(m, np.int64) for m in maps]
    for a in reversed(range(len(dims))):
        if len(dims) > 1 and dims[a] == 1 and maps[a][0] >= 0:
            last = len(dims) - 1 if a != len(dims) - 1 else len(dims) - 2
            maps[last] = np.where(maps[last] < 0, -1, maps[last] + maps[a][0])
            del dims[a], strides[a], maps[a]
    steps = [_step_of(m) for m in maps]
    a = len(dims) - 2
    while a >= 0:  # axes a and a + 1 as one where both read and write evenly spaced values
        inner = dims[a + 1]
        if (
            steps[a] is not None
            and steps[a + 1] is not None
            and steps[a] == inner * steps[a + 1]
            and strides[a] == inner * strides[a + 1]
        ):
            maps[a : a + 2] = [maps[a][0] + maps[a + 1][0] + steps[a + 1] * np.arange(dims[a] * inner, dtype=np.int64)]
            dims[a : a + 2], strides[a : a + 2], steps[a : a + 2] = [dims[a] * inner], [strides[a + 1]], [steps[a + 1]]
        a -= 1
    if (
        src.dtype == np.float32
        and 2 <= len(dims) <= 3
        and strides[-1] == 1
        and None not in steps
        and steps[-2] == 1
        and steps[-1] > 1
    ):
        # a layout move (NHWC <-> NCHW): the source's rows are the destination's columns
        batch, src_batch, dst_batch = (dims[0], steps[0], strides[0]) if len(dims) == 3 else (1, 0, 0)
        offset = int(sum(int(m[0]) for m in maps))
        plan.add_transpose(src, dst, offset, batch, dims[-1], dims[-2], src_batch, steps[-1], dst_batch, strides[-2])
        return
    plan.add_gather(src, dst, dims, strides, maps, fill)


def _step_of(m: np.ndarray):
    """The step of ``m`` where it is an arithmetic sequence of offsets (no padded position),
    else None."""
    if m[0] < 0:
        return None
    if len(m) == 1:
        return 0
    step = int(m[1] - m[0])
    return step if step >= 0 and np.array_equal(m, m[0] + step * np.arange(len(m))) else None


def _box(mask):
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


def _transposed(low, x: _Value, perm, extra=True) -> _Value:
    """``x`` with its axes permuted (a gather into a new buffer; the same memory where the
    axes that move have length 1); ``extra``: a move the Python plan does not make (the cost
    model counts it)."""
    shape = tuple(x.shape[a] for a in perm)
    moved = [a for a in perm if x.shape[a] != 1]
    if moved == sorted(moved):
        low.use(x)
        return _Value(x.buffer, x.offset, shape, x.dtype)
    y = low.new(shape)
    low.use(x)
    low.gathered += 2 * x.size * x.dtype.itemsize if extra else 0
    strides = [math.prod(x.shape[a + 1 :]) for a in range(len(x.shape))]
    maps = [np.arange(shape[i], dtype=np.int64) * strides[a] for i, a in enumerate(perm)]

    def bind(plan, arena):
        dst = _view(arena, y)
        _gather(
            plan,
            _view(arena, x).reshape(-1),
            dst.reshape(-1),
            shape,
            [math.prod(shape[i + 1 :]) for i in range(len(shape))],
            maps,
        )

    low.emit(bind)
    return y


def _copied(low, source, shape, into=None) -> _Value:
    """A new buffer of ``shape`` (or the value ``into``, of that shape) holding ``source`` (a
    plan value or a constant of as many values), or zeros where ``source`` is None."""
    y = low.new(shape) if into is None else low.use(into)
    low.gathered += 2 * math.prod(shape) * 4
    src = (
        low.use(source)
        if isinstance(source, _Value)
        else None
        if source is None
        else np.ascontiguousarray(source, np.float32).reshape(-1)
    )
    n = math.prod(shape)

    def bind(plan, arena):
        dst = _view(arena, y).reshape(-1)
        if src is None:
            plan.add_gather(dst, dst, (n,), (1,), [np.full(n, -1, np.int64)], 0.0)
        else:
            plan.add_gather(_operand(arena, src).reshape(-1), dst, (n,), (1,), [np.arange(n, dtype=np.int64)])

    low.emit(bind)
    return y


def _broadcast(low, x: _Value, shape) -> _Value:
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
        dst = _view(arena, y).reshape(-1)
        _gather(
            plan, _view(arena, x).reshape(-1), dst, shape, [math.prod(shape[a + 1 :]) for a in range(len(shape))], maps
        )

    low.emit(bind)
    return y


def _hwio(w):
    """A Conv weight (C_out, C_in / group, [kh,] kw) as (kh, kw, C_in / group, C_out)."""
    return np.ascontiguousarray((w[:, :, None, :] if w.ndim == 3 else w).transpose(2, 3, 1, 0), dtype=np.float32)


def _channels_last_memory(low, x: _Value) -> _Value:
    """The (N, *S, C) memory of an (N, C, *S) plan value: its own where it is held
    channels-last, else a transposed copy."""
    if x.perm == _channels_last(len(x.shape)):
        return low.use(_memory(x))
    return _transposed(low, x, (0, *range(2, len(x.shape)), 1), extra=False)  # as the Python plan's


def _conv(low, node, ins, traced_ins, traced_outs, attrs):
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
        not isinstance(x, _Value)
        or x.dtype != np.float32
        or x.size == 0
        or any(isinstance(v, _Value) for v in ins[1:3])
        or (post is not None and (residual is not None or len(x.shape) != 4))
        or len(x.shape) not in (3, 4)
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or (residual is not None and (not isinstance(r, _Value) or r.dtype != np.float32 or r.shape != out.shape))
    ):
        raise NotLowered
    one_d = len(x.shape) == 3
    w_hwio = node_attrs.get("_w_hwio")
    if w_hwio is None:  # a Conv node: its (C_out, C_in / group, k...) weight as HWIO, once
        w_hwio = derived(traced_ins[1], "plan-conv-hwio", _hwio)
    group = node_attrs.get("group", 1)
    kh, kw, cin_g, cout = w_hwio.shape
    b = traced_ins[2] if len(traced_ins) > 2 and traced_ins[2] is not None else None
    strides, pads, dilations, out_hw, _ = window("Conv", node_attrs, t.shape, (kh, kw), one_d)
    n, c = x.shape[0], x.shape[1]
    hw = (1, x.shape[2]) if one_d else tuple(x.shape[2:])
    found = low.ops.plan_conv2d(
        (n, *hw, c),
        w_hwio,
        b,
        strides,
        pads,
        dilations,
        group,
        node_attrs.get("activation", "linear"),
        float(node_attrs.get("alpha", 0.0)),
        residual,
        x.perm is None,  # NCHW planes: the direct kernel from them where it is the backend's choice
    )
    if found is None or n * math.prod(out_hw) * cout != out.size:
        raise NotLowered
    kind, bound = found
    then_add = bound.pop("then_add", None)  # the residual in a pass after the kernel
    if bound.get("nchw_in"):
        low.use(x)
        x_nhwc = _Value(x.buffer, x.offset, (n, c, *hw), x.dtype)  # (N, C, H, W) planes, as nchw_in reads
    else:
        x_mem = _channels_last_memory(low, x)
        x_nhwc = _Value(x_mem.buffer, x_mem.offset, (n, *hw, c), x.dtype)
    r_nhwc = None
    if r is not None:
        r_mem = _channels_last_memory(low, r)
        r_nhwc = _Value(r_mem.buffer, r_mem.offset, (n, *out_hw, cout), r.dtype)
    y_nhwc = low.new((n, *out_hw, cout))

    def bind(plan, arena):
        if kind == "depthwise":
            plan.add_depthwise(_view(arena, x_nhwc), y=_view(arena, y_nhwc), **bound)
        else:
            res = None if r_nhwc is None or then_add else _view(arena, r_nhwc)
            plan.add_conv2d(_view(arena, x_nhwc), y=_view(arena, y_nhwc), res=res, **bound)
        if then_add:
            y = _view(arena, y_nhwc)
            plan.add_add_act(y, _view(arena, r_nhwc), y, *then_add)

    low.emit(bind)
    if post is not None:  # y scale + shift per channel in place, as ``ops/conv.py`` applies it
        scale, shift = (np.ascontiguousarray(v, np.float32).reshape(-1) for v in post)
        if scale.size != cout or shift.size != cout:
            raise NotLowered
        low.emit(lambda plan, arena: plan.add_scale_shift(_view(arena, y_nhwc), scale, shift, _view(arena, y_nhwc)))
    return [_Value(y_nhwc.buffer, 0, out.shape, np.float32, _channels_last(out.ndim))]


def _conv_transpose(low, node, ins, traced_ins, traced_outs, attrs):
    """A ConvTranspose (its activation fused) as the cpu backend runs it: from NCHW planes where
    the Python plan holds its input so (its result NCHW), else from channels-last memory (its
    result held channels-last; one output channel from the input's NCHW copy, as the backend
    makes it)."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    if (
        not isinstance(x, _Value)
        or x.dtype != np.float32
        or x.size == 0
        or len(x.shape) not in (3, 4)
        or any(isinstance(v, _Value) for v in ins[1:3])
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
        x_mem = _channels_last_memory(low, x)
        x_in = _Value(x_mem.buffer, x_mem.offset, (n, *hw, c), x.dtype)
        y = low.new((n, *f.out_hw, cout))
        perm = _channels_last(out.ndim)
    else:  # NCHW planes: the value's own memory, or its C-order copy
        x_mem = low.use(x) if planes else low.c_order(x)
        x_in = _Value(x_mem.buffer, x_mem.offset, (n, c, *hw), x.dtype)
        y = low.new((n, cout, *f.out_hw))
        perm = _layout(out) if form == "one" else None  # one channel: NHWC memory is the planes
    if math.prod(y.shape) != out.size or perm != _layout(out):
        raise NotLowered
    strides, dilations, crop = f.strides, f.dilations, f.crop

    def bind(plan, arena):
        plan.add_conv_transpose(
            _view(arena, x_in),
            y=_view(arena, y),
            sh=strides[0],
            sw=strides[1],
            dh=dilations[0],
            dw=dilations[1],
            ct=crop[0],
            cl=crop[1],
            **bound,
        )

    low.emit(bind)
    return [_Value(y.buffer, 0, out.shape, np.float32, perm)]


def _batch_norm(low, node, ins, traced_ins, traced_outs, attrs):
    """An inference BatchNormalization of a value held channels-last (or of rows (N, C)): one
    scale and shift per channel over the rows of its memory, folded once at the plan's build
    (the cpu backend's ``batch_norm`` runs the same kernel on the same rows)."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    rows = isinstance(x, _Value) and (x.perm == _channels_last(len(x.shape)) or (x.perm is None and len(x.shape) == 2))
    if (
        not rows
        or x.dtype != np.float32
        or node_attrs.get("training_mode", 0)
        or any(isinstance(v, _Value) for v in ins[1:5])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or _layout(out) != x.perm
    ):
        raise NotLowered
    gamma, beta, mean, var = traced_ins[1:5]
    scale, shift = fold_batch_norm(mean, var, gamma, beta, node_attrs.get("epsilon", 1e-5))
    c = x.shape[1]
    if scale.shape != (c,) or shift.shape != (c,):
        raise NotLowered
    x_mem = low.use(_memory(x))
    y = low.new(x_mem.shape)
    low.emit(lambda plan, arena: plan.add_scale_shift(_view(arena, x_mem), scale, shift, _view(arena, y)))
    return [_Value(y.buffer, 0, out.shape, np.float32, x.perm)]


def _nhwc_of(x: _Value) -> _Value:
    """A channels-last (N, C, *S) value's memory as (N, H, W, C) (1-D: height 1)."""
    n, c = x.shape[0], x.shape[1]
    hw = (1, x.shape[2]) if len(x.shape) == 3 else tuple(x.shape[2:])
    return _Value(x.buffer, x.offset, (n, *hw, c), x.dtype)


def _pool(low, node, ins, traced_ins, traced_outs, attrs):
    """MaxPool (without indices) and AveragePool of a channels-last value: the cpu backend's
    NHWC pool2d, its result channels-last (a C-ordered input keeps the Python plan's NCHW
    kernel, in Python)."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if (
        not isinstance(x, _Value)
        or x.dtype != np.float32
        or len(x.shape) not in (3, 4)
        or x.perm != _channels_last(len(x.shape))
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
    x_nhwc = _nhwc_of(x)
    n, h, w, c = x_nhwc.shape
    if min(pt, pl, pb, pr) < 0 or n * math.prod(out_hw) * c != out.size or 0 in out_hw:
        raise NotLowered
    y = low.new(out.shape, perm=_channels_last(out.ndim))
    low.use(x)
    y_nhwc = _Value(y.buffer, 0, (n, *out_hw, c), y.dtype)
    count_pad = bool(node_attrs.get("count_include_pad", 0))

    def bind(plan, arena):
        plan.add_pool2d(
            _view(arena, x_nhwc),
            _view(arena, y_nhwc),
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


def _is_itself(node, x, out) -> bool:
    """Whether a reduction's result ``out`` is its input ``x`` reshaped (over axes of length 1)."""
    return (
        isinstance(x, _Value)
        and isinstance(out, np.ndarray)
        and out.size == x.size
        and node.op_type in SINGLE_IS_ITSELF
    )


def _global_pool(low, node, ins, traced_ins, traced_outs, attrs):
    """GlobalAveragePool / GlobalMaxPool, and ReduceMean / ReduceMax over the positions, of a
    channels-last value: one window over each image's NHWC rows (the cpu backend's
    ``global_pool``), the (N, C) result in C order; a reduction over axes of length 1 is an
    alias."""
    x, out = ins[0], traced_outs[0]
    if _is_itself(node, x, out):
        return _alias(low, node, [low.c_order(x), *ins[1:]], traced_ins, traced_outs, attrs)
    if (
        not isinstance(x, _Value)
        or x.dtype != np.float32
        or len(x.shape) not in (3, 4)
        or x.perm != _channels_last(len(x.shape))
        or any(isinstance(v, _Value) for v in ins[1:])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.shape[:2] != x.shape[:2]
        or out.size != x.shape[0] * x.shape[1]
        or x.size == 0
    ):
        raise NotLowered
    n, c = x.shape[0], x.shape[1]
    steps = x.size // (n * c)
    x_rows = _Value(x.buffer, x.offset, (n, 1, steps, c), x.dtype)
    y = low.new(out.shape)
    low.use(x)
    is_max = node.op_type in ("GlobalMaxPool", "ReduceMax")

    def bind(plan, arena):
        y_rows = _view(arena, y).reshape(n, 1, 1, c)
        plan.add_pool2d(_view(arena, x_rows), y_rows, is_max, 1, steps, 1, 1, 1, 1, 0, 0, 1, steps, False)

    low.emit(bind)
    return [y]


def _reduce(low, node, ins, traced_ins, traced_outs, attrs):
    """A Reduce* node (``REDUCTIONS``) of a float32 value: a global pool where it is one
    (``_global_pool``), else the reduce step over the value's C-ordered memory seen as (outer,
    r, inner), where the axes it reduces (of length > 1) are neighbours in memory."""
    x, t, out = ins[0], traced_ins[0], traced_outs[0]
    if node.op_type in GLOBAL_POOLS:  # over the positions of a channels-last value, or an alias
        marks = low.mark()
        try:
            return _global_pool(low, node, ins, traced_ins, traced_outs, attrs)
        except NotLowered:
            low.rollback(marks)
    elif _is_itself(node, x, out):
        return _alias(low, node, [low.c_order(x), *ins[1:]], traced_ins, traced_outs, attrs)
    if (
        not isinstance(x, _Value)
        or x.dtype != np.float32
        or x.size == 0
        or any(isinstance(v, _Value) for v in ins[1:])
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
    ):
        raise NotLowered
    axes = reduce_axes(traced_ins, attrs["_attrs"], low.model.opset, AXES_INPUT_FROM[node.op_type], t.ndim)
    if axes is None:
        raise NotLowered
    reduced = {a % t.ndim for a in axes}
    kept = [(d, a in reduced) for a, d in enumerate(t.shape) if d > 1]  # axes of length 1 change nothing
    flags = [r for _, r in kept]
    first = flags.index(True) if True in flags else len(flags)
    last = len(flags) - flags[::-1].index(True) if True in flags else len(flags)
    if not all(flags[first:last]):
        raise NotLowered
    outer = math.prod(d for d, _ in kept[:first])
    r = math.prod(d for d, _ in kept[first:last])
    inner = math.prod(d for d, _ in kept[last:])
    if outer * inner != out.size:
        raise NotLowered
    x = low.c_order(x)
    y = low.new(out.shape)
    low.use(x)
    op = REDUCTIONS[node.op_type]

    def bind(plan, arena):
        plan.add_reduce(_view(arena, x), _view(arena, y), op, outer, r, inner)

    low.emit(bind)
    return [y]


def _take(low, node, ins, traced_ins, traced_outs, attrs):
    """Gather: on constant indices a data movement (``_movement``); on computed ones (an
    embedding lookup of token ids, a float or quantized table) the take step, which reads the
    indices per call and checks each against the axis (a call with one outside it is run by
    the Python plan, which raises the node's error)."""
    x, idx, t, out = ins[0], ins[1], traced_ins[0], traced_outs[0]
    if not isinstance(idx, _Value):
        return _movement(low, node, ins, traced_ins, traced_outs, attrs)
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
    src = low.use(low.c_order(x)) if isinstance(x, _Value) else np.ascontiguousarray(t).reshape(-1)
    y = low.new(out.shape, out.dtype)
    low.use(idx)

    def bind(plan, arena):
        source = _view(arena, src).reshape(-1) if isinstance(src, _Value) else src
        plan.add_take(source, _view(arena, idx).reshape(-1), _view(arena, y).reshape(-1), outer, n, run)

    low.emit(bind)
    return [y]


def _batched_matmul(low, node, ins, traced_ins, traced_outs, attrs):
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
        if not isinstance(v, _Value):
            v = np.ascontiguousarray(t, np.float32)
        operands.append((v, (size, *t.shape[-2:])))
    if out.shape != (*lead, m, n):
        raise NotLowered
    y = low.new(out.shape)
    for v, _ in operands:
        low.use(v)

    def bind(plan, arena):
        a3, b3 = (_operand(arena, v).reshape(shape) for v, shape in operands)
        plan.add_batched_matmul(a3, b3, _view(arena, y).reshape(batch, m, n))

    low.emit(bind)
    return [y]


def _rows_times_constants(ins, out) -> bool:
    """Whether a product's first input is a float32 plan value of at least 2 axes (rows of its
    last), its other inputs constants, and its traced result a float32 array."""
    x = ins[0]
    return (
        isinstance(x, _Value)
        and x.dtype == np.float32
        and len(x.shape) >= 2
        and not any(isinstance(v, _Value) for v in ins[1:])
        and isinstance(out, np.ndarray)
        and out.dtype == np.float32
    )


def _dense(low, node, ins, traced_ins, traced_outs, attrs):
    """A product of a plan value (..., k) and constant weights (k, n): FusedDense (its
    activation or row softmax in the epilogue), MatMul, Gemm without transA / alpha / beta; the
    cpu backend's ``dense`` as one step (``plan_dense``)."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if node.op_type == "MatMul" and isinstance(ins[1], _Value):  # a product of two computed values
        return _batched_matmul(low, node, ins, traced_ins, traced_outs, attrs)
    if not _rows_times_constants(ins, out) or out.ndim != len(x.shape):
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
    low.emit(lambda plan, arena: plan.add_dense(_view(arena, x), y=_view(arena, y), **bound))
    return [y]


def _state(low, ins, traced_ins, i, shape, direction=0, into=None) -> _Value:
    """A new buffer of ``shape`` (batch, hidden) (or the value ``into``) holding direction
    ``direction`` of input ``i``, an initial state ((D, B, H), or (1, B, H) and (B, 1, H) of
    one direction: the memory of (B, H) each), or zeros where it is absent."""
    given, size = None, math.prod(shape)
    if len(ins) > i and isinstance(ins[i], _Value):
        given = ins[i]
        if direction:
            given = _Value(given.buffer, given.offset + direction * size * 4, shape, given.dtype)
    elif len(traced_ins) > i and traced_ins[i] is not None and traced_ins[i].size:
        given = np.asarray(traced_ins[i]).reshape(-1)[direction * size : (direction + 1) * size]
    return _copied(low, given, shape, into)


def _dynamic_matmul(low, node, ins, traced_ins, traced_outs, attrs):
    """com.microsoft DynamicQuantizeMatMul on its constant B: the quantization of A and the
    exact integer product in one step (``dynamic_qgemm``)."""
    a, out = ins[0], traced_outs[0]
    if not isinstance(a, _Value) or a.dtype != np.float32 or a.size == 0 or _reads_data(ins[1:]):
        raise NotLowered
    found = dynamic_matmul_constants(traced_ins, attrs["_attrs"])
    if found is None or out is None or out.dtype != np.float32:
        raise NotLowered
    packed, b_columns, bias = found
    y = low.new(out.shape)
    low.use(a)
    low.emit(lambda plan, arena: plan.add_dynamic_qgemm(_view(arena, a), packed, b_columns, bias, _view(arena, y)))
    return [y]


def _dynamic_lstm(low, node, ins, traced_ins, traced_outs, attrs):
    """com.microsoft DynamicQuantizeLSTM on its packed constants, one direction or both: each
    direction's input product and the time loops (side by side, ``qlstm_runs``) in one step,
    the states copied in; each direction writes its part of Y (T, D, B, H), Y_h and Y_c
    (D, B, H) in place."""
    x = ins[0]
    node_attrs = attrs["_attrs"]
    if not isinstance(x, _Value) or x.dtype != np.float32 or len(x.shape) != 3 or x.size == 0:
        raise NotLowered
    if _reads_data(ins[1:5]) or _reads_data(ins[7:]):  # weights, lengths, P, scales: constants
        raise NotLowered
    found = direction_constants(traced_ins, node_attrs)
    if found is None or len(traced_outs) != 3:
        raise NotLowered
    steps, batch, _ = x.shape
    n_dir, hidden = len(found), found[0][5].shape[0] // 4  # the bias: 4 hidden
    h_all, c_all = low.new((n_dir, batch, hidden)), low.new((n_dir, batch, hidden))
    half = lambda value, d: _Value(value.buffer, d * batch * hidden * 4, (batch, hidden), np.float32)  # noqa: E731
    states = [
        (
            _state(low, ins, traced_ins, 5, (batch, hidden), d, into=half(h_all, d)),
            _state(low, ins, traced_ins, 6, (batch, hidden), d, into=half(c_all, d)),
        )
        for d in range(n_dir)
    ]
    ys = low.new((steps, n_dir, batch, hidden)) if traced_outs[0] is not None else None
    x_proj = [low.new((steps, batch, 4 * hidden)) for _ in range(n_dir)]
    low.use(x)

    def bind(plan, arena):
        y = None if ys is None else _view(arena, ys)
        directions = [
            (*found[d], _view(arena, h), _view(arena, c), None if y is None else y[:, d], _view(arena, x_proj[d]))
            for d, (h, c) in enumerate(states)
        ]
        plan.add_dynamic_qlstms(_view(arena, x), directions)

    low.emit(bind)
    outs = [ys, h_all, c_all]
    if any(o is not None and t is not None and o.shape != t.shape for o, t in zip(outs, traced_outs)):
        raise NotLowered
    return outs


def _attention(low, node, ins, traced_ins, traced_outs, attrs):
    """FusedAttention where the Python plan makes it one call of the backend's attention
    (float32 heads, one-value scales, a mask of at most the heads' rank): the same kernel as a
    step, q, k and v read from the arena (k^T moved to k's rows as the backend copies it), the
    result in C order."""
    q, k, v, s_q, s_k, s_scores, mask = (list(ins) + [None] * 7)[:7]
    t_q, t_k, t_v, *t_rest = (list(traced_ins) + [None] * 7)[:7]
    node_attrs, out = attrs["_attrs"], traced_outs[0]
    t_scales = list(zip(t_rest[:3], node_attrs["_divide"]))
    if (
        not all(isinstance(a, _Value) and a.dtype == np.float32 for a in (q, k, v))
        or any(isinstance(a, _Value) for a in (s_q, s_k, s_scores))
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or any(s is not None and np.size(s) != 1 for s, _ in t_scales)
        or (isinstance(mask, _Value) and mask.dtype != np.float32)
    ):
        raise NotLowered
    if mask is None and t_rest[3] is not None:  # a constant of the plan (from keyed inputs)
        mask = np.ascontiguousarray(t_rest[3], np.float32)
    if node_attrs["_k_transposed"]:
        k = _transposed(low, k, (*range(len(k.shape) - 2), len(k.shape) - 1, len(k.shape) - 2), extra=False)
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
        bias = None if mask is None else _operand(arena, mask).reshape(four(mask.shape))
        plan.add_attention(
            _view(arena, q).reshape(four(q.shape)),
            _view(arena, k).reshape(four(k.shape)),
            _view(arena, v).reshape(four(v.shape)),
            _view(arena, y).reshape(four(y.shape)),
            float(scale),
            bias,
        )

    low.emit(bind)
    return [y]


def _layer_norm(low, node, ins, traced_ins, traced_outs, attrs):
    """LayerNormalization (and the RMS norm the rewrites make of it) over the trailing axes,
    its scale and bias constants of their width, its statistics outputs unread."""
    x, out = ins[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    if not isinstance(x, _Value) or x.dtype != np.float32 or x.size == 0 or _reads_data(ins[1:]):
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
        plan.add_layer_norm(_view(arena, x).reshape(rows), gamma, beta, eps, rms, _view(arena, y).reshape(rows))

    low.emit(bind)
    return [y] + [None] * (len(traced_outs) - 1)


def _reads_data(values) -> bool:
    """Whether any of ``values`` is computed by the plan (not a constant)."""
    return any(isinstance(v, _Value) for v in values)


def _recurrent(kind):
    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        node_attrs = attrs["_attrs"]
        x = ins[0]
        if (
            not isinstance(x, _Value)
            or x.dtype != np.float32
            or any(isinstance(v, _Value) for v in ins[1:5] if v is not None)
        ):
            raise NotLowered
        planned = recurrent_calls(kind, traced_ins, node_attrs)
        if planned is not None and len(planned[0]) == 2:
            return _bidirectional(low, kind, planned, ins, traced_ins, traced_outs, node_attrs)
        if planned is None or len(planned[0]) != 1:
            raise NotLowered
        (cell, args, kw), x_bti_traced, _ = planned[0][0], planned[1], planned[2]
        found = low.ops.plan_sequence_loop(cell, x_bti_traced, args[1:], kw)
        if found is None:
            raise NotLowered
        loop, serial = found
        layout = node_attrs.get("layout", 0)
        x_bti = x if layout else _transposed(low, x, (1, 0, 2))
        batch, steps = x_bti.shape[:2]
        h = _state(low, ins, traced_ins, 5, loop.h.shape)
        c = None if loop.c is None else _state(low, ins, traced_ins, 6, loop.c.shape)
        last = _copied(low, None, loop.last.shape)
        y = None if loop.y is None else low.new(loop.y.shape)
        low.use(x_bti)

        def bind(plan, arena):
            call = loop._replace(
                x=_view(arena, x_bti),
                h=_view(arena, h),
                c=None if c is None else _view(arena, c),
                y=None if y is None else _view(arena, y),
                last=_view(arena, last),
            )
            plan.add_rnn(tuple(call), serial)

        low.emit(bind)
        outs = []
        if traced_outs[0] is not None and y is not None:  # Y: (T, 1, B, H) or (B, T, 1, H)
            y4 = _Value(y.buffer, y.offset, (batch, 1, steps, y.shape[2]), y.dtype)
            outs.append(_transposed(low, y4, (0, 2, 1, 3) if layout else (2, 1, 0, 3)))
        else:
            outs.append(None)
        hidden_shape = lambda s: (s[0], 1, s[1]) if layout else (1, *s)  # noqa: E731
        outs.append(_Value(h.buffer, 0, hidden_shape(h.shape), np.float32))
        if kind == "LSTM":
            outs.append(_Value(c.buffer, 0, hidden_shape(c.shape), np.float32))
        for k, (o, t) in enumerate(zip(outs, traced_outs)):
            if o is not None and t is not None and (tuple(o.shape) != t.shape):
                raise NotLowered
        return outs[: len(traced_outs)]

    return lower


def _bidirectional(low, kind, planned, ins, traced_ins, traced_outs, node_attrs):
    """A bidirectional LSTM / GRU / RNN (layout 0) as the backend runs its directions
    (``plan_sequence_loops``): at once, one thread each (one ``rnn_loops`` step), or one after
    the other. Both directions' states are halves of one (2, B, H) buffer, the node's Y_h (and
    Y_c) as they are; their sequences halves of one (2, B, T, H) buffer, moved to Y (T, 2, B, H)
    by one gather."""
    calls, x_bti_traced, _ = planned
    if node_attrs.get("layout", 0):
        raise NotLowered
    found = low.ops.plan_sequence_loops(x_bti_traced, [(cell, args[1:], kw) for cell, args, kw in calls])
    if found is None:
        raise NotLowered
    loops, at_once = found
    loops = [(loop, None) for loop in loops] if at_once else loops
    first = loops[0][0]
    x_bti = _transposed(low, ins[0], (1, 0, 2))
    batch, steps = x_bti.shape[:2]
    hidden = first.h.shape[1]
    h_all = low.new((2, batch, hidden))
    c_all = None if first.c is None else low.new((2, batch, hidden))
    y_all = None if first.y is None else low.new((2, batch, steps, hidden))
    half = lambda value, d, shape: _Value(value.buffer, d * math.prod(shape) * 4, shape, np.float32)  # noqa: E731
    bound = []
    for d, (loop, serial) in enumerate(loops):
        h = _state(low, ins, traced_ins, 5, (batch, hidden), d, into=half(h_all, d, (batch, hidden)))
        c = (
            None
            if c_all is None
            else _state(low, ins, traced_ins, 6, (batch, hidden), d, half(c_all, d, (batch, hidden)))
        )
        y = None if y_all is None else half(y_all, d, (batch, steps, hidden))
        bound.append((loop, serial, h, c, y, _copied(low, None, loop.last.shape)))
    low.use(x_bti)
    for value in (h_all, c_all, y_all):
        low.use(value)

    def bind(plan, arena):
        made = [
            loop._replace(
                x=_view(arena, x_bti),
                h=_view(arena, h),
                c=None if c is None else _view(arena, c),
                y=None if y is None else _view(arena, y),
                last=_view(arena, last),
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
        y_out = _transposed(low, y_all, (2, 0, 1, 3))
    outs = [y_out, h_all] + ([c_all] if kind == "LSTM" else [])
    for o, t in zip(outs, traced_outs):
        if t is not None and (o is None or tuple(o.shape) != t.shape):
            raise NotLowered
    return outs[: len(traced_outs)]


def _activation(name, alpha_attr, default):
    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        x = ins[0]
        code = low.ops.plan_activation_code(name)
        if not isinstance(x, _Value) or x.dtype != np.float32 or code is None:
            raise NotLowered
        alpha = float(attrs["_attrs"].get(alpha_attr, default)) if alpha_attr else default
        y = low.new(x.shape, perm=x.perm)  # elementwise: in the memory order of x
        low.use(x)
        low.emit(lambda plan, arena: plan.add_activation(_view(arena, x), _view(arena, y), code, alpha))
        return [y]

    return lower


def _gelu(low, node, ins, traced_ins, traced_outs, attrs):
    """Gelu: the activation kernel the Python plan calls (its tanh form where ``approximate``
    is "tanh")."""
    approximate = attrs["_attrs"].get("approximate", "none")
    tanh = approximate in ("tanh", b"tanh")
    return _activation("gelu_tanh" if tanh else "gelu", None, 0.0)(low, node, ins, traced_ins, traced_outs, attrs)


def _row_activation(name):
    """Softmax / LogSoftmax over the last axis (opset >= 13) or over the axes from ``axis`` on
    (before 13): the row kernel over rows of that width, as ``CpuOps.softmax`` runs it."""

    def lower(low, node, ins, traced_ins, traced_outs, attrs):
        x = ins[0]
        code = low.ops.plan_activation_code(name, rows=True)
        if not isinstance(x, _Value) or x.dtype != np.float32 or code is None or not x.size or not x.shape:
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
        low.emit(lambda plan, arena: plan.add_activation(_view(arena, x), _view(arena, y), code, 0.0, row))
        return [y]

    return lower


def _dense_chain(low, node, ins, traced_ins, traced_outs, attrs):
    """FusedDenseChain: its layers as consecutive dense steps (``plan_dense``), as the
    backend's chain runs each product."""
    x, out = ins[0], traced_outs[0]
    layers = attrs["_attrs"]["layers"]
    if not _rows_times_constants(ins, out):
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
            lambda plan, arena, x=value, y=y, bound=bound: plan.add_dense(_view(arena, x), y=_view(arena, y), **bound)
        )
        value = y
    if value.shape != out.shape:
        raise NotLowered
    return [value]


#: Elementwise operators as one instruction of an elementwise program (the ops of
#: ``Ops.elementwise_plan``; numpy's float32 arithmetic gives the same bits).
ELEMENTWISE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs"}


def _program_step(low, program, ins, traced_ins, shape, perm, data=()):
    """A new value of ``shape`` (held as ``perm``) computed by one pass of the elementwise
    ``program`` over ``ins`` (plan values and constants; the plan values among ``data``
    channel vectors read per call); raises NotLowered where the native pass does not take it."""
    operands = []  # as the Python plan holds them: channels-last values as views of that memory
    for k, (v, t) in enumerate(zip(ins, traced_ins)):
        if isinstance(v, _Value):
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
    if probe.shape != tuple(shape) or not (probe.flags.c_contiguous if perm is None else _layout(probe) == perm):
        raise NotLowered
    y = low.new(shape, perm=perm)
    for v in ins:
        low.use(v)
    # the constants alone: the stand-ins of plan values would otherwise live until the plan is bound
    constants = [None if isinstance(v, _Value) else o for v, o in zip(ins, operands)]
    del operands, probe

    def bind(plan, arena):
        args = [
            (
                kind,
                array if k is None else _operand(arena, ins[k]) if isinstance(ins[k], _Value) else constants[k],
                stride,
            )
            for kind, k, array, stride in sources
        ]
        plan.add_elementwise(prog, samples, inner, c, args, _view(arena, y).reshape(-1))

    low.emit(bind)
    return y


def _vector_parts(low, program, ins, traced_ins, shape):
    """``program`` (over ``ins``) with the values it computes from vectors of the data alone
    (a squeeze-and-excite gate: (N, C, 1, 1) from a global pool) each computed first, by a pass
    of its own over the vectors' shape: (program, operands, traced operands, indices of the
    data vectors among them)."""
    n = len(ins)
    full = [isinstance(v, _Value) and v.shape == tuple(shape) for v in ins]
    data = [isinstance(v, _Value) and not f for v, f in zip(ins, full)]
    for _, a, b, _ in program:
        full.append(any(full[x] for x in (a, b) if x >= 0))
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
        value = _program_step(low, sub, [ins[u] for u in reads], [traced_ins[u] for u in reads], vector_shape, None)
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
    vectors = [k for k, v in enumerate(ins) if isinstance(v, _Value) and v.shape != tuple(shape)]
    return main, ins, traced_ins, vectors


def _arrays(traced):
    """The traced values with numpy scalars (a constant's one value) as 0-d arrays."""
    return [np.asarray(t) if isinstance(t, np.generic) else t for t in traced]


def _map_operands(op, node, ins, traced_ins, out, node_attrs):
    """(plan values and constants, their traced arrays) that the map step ``op`` reads for
    ``node``: Clip's omitted bounds as infinities (its attributes before opset 11), its
    constant bounds in the result's type; raises NotLowered where the step does not take the
    types."""
    ins, traced = list(ins), _arrays(traced_ins)
    if op == "clip":
        bounds = []
        for k, name, fill in ((1, "min", -np.inf), (2, "max", np.inf)):
            v = ins[k] if k < len(ins) else None
            t = traced[k] if k < len(traced) else None
            if t is None:  # omitted: the attribute (before opset 11), else no bound
                v = t = np.asarray(node_attrs.get(name, fill), out.dtype)
            elif not isinstance(v, _Value):
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
        or (op == "clip" and any(isinstance(v, _Value) and v.dtype != out.dtype for v in ins))
    ):
        raise NotLowered
    return ins, traced


def _map(low, node, ins, traced_ins, traced_outs, attrs):
    """A comparison, Where, Cast, logic, IsNaN, Min / Max of two, Clip, or an Add / Sub / Mul /
    Div that the elementwise program does not take: one map step (``_map_step``)."""
    out, op = traced_outs[0], MAPS[node.op_type]
    if not isinstance(out, np.ndarray) or out.dtype not in MAP_DTYPES or out.size == 0:
        raise NotLowered
    ins, traced = _map_operands(op, node, ins, traced_ins, out, attrs["_attrs"])
    return [_map_step(low, op, ins, traced, out)]


def _map_step(low, op, ins, traced, out) -> _Value:
    """A new value like the traced ``out``: the map step ``op`` over its indices, each of
    ``ins`` (plan values, in C order, and constants) read through strides that are 0 along the
    axes it broadcasts, neighbouring axes merged where every operand allows."""
    shape = out.shape or (1,)
    operands, strides = [], []
    for v, t in zip(ins, traced):
        held = low.c_order(v) if isinstance(v, _Value) else np.ascontiguousarray(t).reshape(-1)
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
        arrays = [_view(arena, v).reshape(-1) if isinstance(v, _Value) else v for v in operands]
        plan.add_map(op, _view(arena, y).reshape(-1), arrays, dims, strides)

    low.emit(bind)
    return y


#: Instructions of an elementwise program that a map step runs (``_program_by_maps``), with
#: numpy's form of each (the traced values of the steps between them).
PROGRAM_MAPS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "clip": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
}


def _program_by_maps(low, program, ins, traced_ins, out):
    """A FusedElementwise the native pass does not take (a result of one value, operands of
    other types) whose instructions are all arithmetic and clips (``PROGRAM_MAPS``): one map
    step per instruction, each result a value of the plan."""
    if any(op not in PROGRAM_MAPS for op, *_ in program):
        raise NotLowered
    values, traced = list(ins), list(traced_ins)
    if any(not isinstance(t, np.ndarray) or t.dtype != np.float32 for t in traced):
        raise NotLowered
    for op, a, b, param in program:
        if op == "clip":  # its bounds: float32 values, infinite where the node had none
            bounds = [np.float32(param[0]), np.float32(param[1])]
            args, targs = [values[a], *bounds], [traced[a], *(np.asarray(v) for v in bounds)]
        else:
            args, targs = [values[a], values[b]], [traced[a], traced[b]]
        with np.errstate(all="ignore"):
            result = np.asarray(PROGRAM_MAPS[op](*targs), np.float32)
        values.append(_map_step(low, op, args, targs, result))
        traced.append(result)
    if traced[-1].shape != out.shape:
        raise NotLowered
    return [values[-1]]


def _dequantize(low, node, ins, traced_ins, traced_outs, attrs):
    """DequantizeLinear of 8- or 16-bit values with one scale and zero point (per tensor) into
    float32: the map step's (x - zero point) * scale, the difference exact and the product
    rounded once, as the Python plan's float32 arithmetic gives it."""
    x, t, out = ins[0], _arrays(traced_ins)[0], traced_outs[0]
    node_attrs = attrs["_attrs"]
    scale = _arrays(traced_ins)[1]
    zero = _arrays(traced_ins)[2] if len(traced_ins) > 2 and traced_ins[2] is not None else np.zeros((), t.dtype)
    if (
        not isinstance(t, np.ndarray)
        or t.dtype not in QUANTIZED_DTYPES
        or not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or node_attrs.get("block_size", 0)
        or any(isinstance(v, _Value) for v in ins[1:])
        or np.size(scale) != 1
        or np.size(zero) != 1
        or np.asarray(scale).dtype != np.float32
    ):
        raise NotLowered
    operands = [x, None, None]
    traced = [t, np.asarray(scale, np.float32).reshape(()), np.asarray(zero).reshape(())]
    return [_map_step(low, "dequantize", operands, traced, out)]


def _cast(low, node, ins, traced_ins, traced_outs, attrs):
    """Cast: to its input's own type an alias, else the map step."""
    marks = low.mark()
    try:
        return _alias(low, node, ins, traced_ins, traced_outs, attrs)
    except NotLowered:
        low.rollback(marks)
    return _map(low, node, ins, traced_ins, traced_outs, attrs)


def _elementwise(low, node, ins, traced_ins, traced_outs, attrs):
    """A FusedElementwise, or Add / Sub / Mul / Div / Sqrt / Neg / Abs: the backend's
    elementwise program (``_program``), else map steps (other types, results of one value):
    one for the operators that have one (``_map``), one per instruction for a program of
    arithmetic and clips (``_program_by_maps``)."""
    traced_ins = _arrays(traced_ins)
    marks = low.mark()
    try:
        return _program(low, node, ins, traced_ins, traced_outs, attrs)
    except NotLowered:
        low.rollback(marks)
    if node.op_type == "FusedElementwise":
        return _program_by_maps(low, attrs["_attrs"]["program"], ins, traced_ins, traced_outs[0])
    if node.op_type not in MAPS:
        raise NotLowered
    return _map(low, node, ins, traced_ins, traced_outs, attrs)


def _program(low, node, ins, traced_ins, traced_outs, attrs):
    """One pass of the backend's elementwise program (a FusedElementwise's, or one operator's)
    over tensors of the result's shape, constant vectors or values and vectors of the data
    (each computed by a pass of its own where the program computes on it: ``_vector_parts``)."""
    out = traced_outs[0]
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.size <= 1:
        raise NotLowered
    if node.op_type == "FusedElementwise":
        program = attrs["_attrs"]["program"]
    else:
        op = ELEMENTWISE[node.op_type]
        program = [(op, 0, 1 if len(ins) == 2 else -1, None)]
    tensors = [v for v in ins if isinstance(v, _Value) and v.shape == out.shape]
    perms = {v.perm for v in tensors}
    if len(perms) > 1 or not tensors:  # operands held in different orders: all in C order
        ins, perms = [low.c_order(v) if isinstance(v, _Value) and v.shape == out.shape else v for v in ins], {None}
    perm, marks = perms.pop(), low.mark()
    try:
        parts = _vector_parts(low, list(program), ins, traced_ins, out.shape)
        return [_program_step(low, parts[0], parts[1], parts[2], out.shape, perm, parts[3])]
    except NotLowered:
        low.rollback(marks)
    # operands broadcast in ways the pass does not read (a row's sum against its row): each
    # such operand broadcast to the result's shape first, the pass then over whole tensors
    if any(
        not isinstance(t, np.ndarray)
        or t.dtype != np.float32
        or t.ndim > out.ndim
        or (not isinstance(v, _Value) and t.size > 1 and t.shape != out.shape and out.size > BROADCAST_CONSTANT_MAX)
        for v, t in zip(ins, traced_ins)
    ):
        raise NotLowered
    full, held = [], []
    for v, t in zip(ins, traced_ins):
        if isinstance(v, _Value):
            full.append(low.c_order(v) if v.shape == out.shape else _broadcast(low, v, out.shape))
        else:
            full.append(
                t if t.size == 1 or t.shape == out.shape else np.ascontiguousarray(np.broadcast_to(t, out.shape))
            )
        held.append(np.zeros(out.shape, np.float32) if isinstance(v, _Value) else full[-1])
    return [_program_step(low, program, full, held, out.shape, None)]


#: Operator -> its lowering onto native steps.
LOWERINGS = {
    **{name: _alias for name in ALIASES | SINGLE_IS_ITSELF},
    **{name: _global_pool for name in GLOBAL_POOLS},
    **{name: _reduce for name in REDUCTIONS},
    "MaxPool": _pool,
    "AveragePool": _pool,
    **{name: _movement for name in MOVEMENTS},
    "Concat": _concat,
    "Gather": _take,
    **{name: _map for name in MAPS},
    "Cast": _cast,
    "Resize": _nearest_resize,
    "Upsample": _nearest_resize,
    "Conv": _conv,
    "FusedConv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "FusedDense": _dense,
    "FusedDenseChain": _dense_chain,
    "MatMul": _dense,
    "Gemm": _dense,
    "Softmax": _row_activation("softmax"),
    "LogSoftmax": _row_activation("log_softmax"),
    "FusedElementwise": _elementwise,
    "com.microsoft::DynamicQuantizeMatMul": _dynamic_matmul,
    "com.microsoft::DynamicQuantizeLSTM": _dynamic_lstm,
    "LayerNormalization": _layer_norm,
    "FusedAttention": _attention,
    **{name: _elementwise for name in ELEMENTWISE},
    "LSTM": _recurrent("LSTM"),
    "GRU": _recurrent("GRU"),
    "RNN": _recurrent("RNN"),
    **{name: _activation(*act) for name, act in ACTIVATIONS.items()},
    "Gelu": _gelu,
    "DequantizeLinear": _dequantize,
}
#: Operators whose lowering reads channels-last values as they are held; the others' plan
#: values are given to them in C order (``_Lowering.c_order``).
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
    | {"Gelu"}
    | MOVEMENTS
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
        outs.append(None if t is None else low.new(t.shape, t.dtype, _layout(t)))
        low.moved += 0 if t is None else 2 * t.nbytes
    for v in ins:
        low.use(v)
        if isinstance(v, _Value):
            low.python_reads.add(id(v.buffer))

    # the constants alone: the trace's other values would otherwise live until the plan is bound
    constants = [None if isinstance(v, _Value) else t for v, t in zip(ins, traced_ins)]

    def bind(plan, arena):
        args = [_logical(arena, v) if isinstance(v, _Value) else t for v, t in zip(ins, constants)]
        views = [None if o is None else _logical(arena, o) for o in outs]
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
                if any(
                    name and t is not None and not isinstance(v, _Value) for name, t, v in zip(outs, t_outs, l_outs)
                ):
                    raise NotLowered
                low.native.append(node.op_type)
                if len(low.emits) > marks[0]:  # steps of its own (not a view of its input)
                    low.results += sum(t.nbytes for t in t_outs if t is not None)
            except NotLowered:  # what the lowering began is dropped
                low.rollback(marks)
                low.nodes[-1][4] = "python"
                l_outs = _fallback(low, fn, node, (model, index), l_ins, t_ins, t_outs, attrs)
            results = list(zip(t_outs, l_outs))
            # stop tracing once the copies so far outweigh all the plan could still save
            if not pays(len(low.native) + low.left, len(low.fallbacks), low.moved, low.gathered, low.results):
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
    placed: list[_Buffer] = []
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


def pays(native: int, fallbacks: int, moved: int, gathered: int = 0, results: int = 0) -> bool:
    """Whether a plan of ``native`` nodes lowered natively (their steps writing ``results``
    bytes), ``fallbacks`` run in Python, ``moved`` bytes copied and ``gathered`` bytes gathered
    that the Python plan does not move saves more than it costs."""
    cost = PLAN_US + FALLBACK_US * fallbacks + moved / COPY_BYTES_PER_US + gathered / GATHER_BYTES_PER_US
    return STEP_US * native + results / RESULT_BYTES_PER_US > cost


class Plan:
    """A model's native plan for one key: ``run(arrays)`` -> {output name: array}, or None
    where it cannot serve the call (another thread runs it)."""

    def __init__(self, native, inputs, input_views, outputs, constants, holders, summary):
        self.native, self.inputs, self.outputs = native, inputs, outputs
        self.fed = [k for k, v in enumerate(input_views) if v is not None]
        self.input_views = [input_views[k] for k in self.fed]
        self.constants, self.holders, self.summary = constants, holders, summary

    def run(self, arrays):
        results = self.native.run([arrays[k] for k in self.fed], self.input_views, [v for _, v in self.outputs])
        if results is None:
            return None
        values = dict(zip(self.inputs, arrays))  # the call's inputs, as the Python plan's table
        values.update(zip((name for name, _ in self.outputs), results))
        for name, array in self.constants:
            values[name] = array.copy()
        return values


def profile_plan(plan, name, arrays, repeats: int, threads: int, pause: float):
    """The profile (``profile.Profile``) of ``repeats`` calls of native ``plan`` on ``arrays``
    (each after ``pause`` seconds): per node lowered, the median over the calls of its steps'
    time, its kernel ``native`` (its steps bound in the plan), ``alias`` (none: a view of its
    input's memory) or ``python`` (its function run inside the plan); None where another call
    runs the plan now."""
    from .profile import Profile, Step, node_detail

    fed = [arrays[k] for k in plan.fed]
    outputs = [v for _, v in plan.outputs]
    ns = np.zeros(len(plan.native), np.int64)
    per_call, totals = [], []
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
        fused = node_detail(node.op_type, attrs)
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
    low = _Lowering(model, ops)
    inputs = []
    for a in arrays:
        if a.dtype.kind == "f" or a.size > KEY_VALUES_MAX:
            inputs.append((a, low.new(a.shape, a.dtype)))
        else:
            inputs.append((a, None))
    outputs = _walk(low, model, inputs)
    outputs = [(t, low.c_order(v)) for t, v in outputs]
    low.step += 1
    values = []
    for name, (t, v) in zip(model.output_names, outputs):
        if isinstance(v, _Value):
            low.use(v)
        values.append((name, t, v))
    # an input that no Python step reads and no output shares is read from the caller's array
    shared = {id(v.buffer) for _, _, v in values if isinstance(v, _Value)} | low.python_reads
    movable = [v is not None and id(v.buffer) not in shared for _, v in inputs]
    low.moved += 2 * sum(a.nbytes for (a, v), move in zip(inputs, movable) if v is not None and not move)
    low.moved += 2 * sum(np.asarray(t).nbytes for _, t, v in values if v is not None)
    if not pays(len(low.native), len(low.fallbacks), low.moved, low.gathered, low.results):
        raise DoesNotPay
    end = low.step
    for b in low.buffers:
        if any(b is v.buffer for _, _, v in values if isinstance(v, _Value)):
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
        [_view(arena, v) if v is not None else None for _, v in inputs],
        [(name, _view(arena, v)) for name, _, v in values if isinstance(v, _Value)],
        [(name, np.asarray(t)) for name, t, v in values if not isinstance(v, _Value)],
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


def _node_count(model) -> int:
    """The nodes of ``model`` and of the branches of its Ifs."""
    count = 0
    for node, (_, _, _, attrs, _) in zip(model._nodes, model._plan):
        count += 1
        for branch in ("then_branch", "else_branch"):
            body = attrs.get(branch)
            if isinstance(body, Body):
                count += _node_count(body.model)
    return count


class NativePlans:
    """A model's native plans by key, built at the ``BUILD_AFTER``-th call with a key."""

    def __init__(self, model):
        self.model = model
        self.plans: dict = {}
        self.lock = threading.Lock()
        #: the most nodes a plan of the model could lower (those of If branches included)
        self.nodes = _node_count(model)
        #: builds that failed; no more builds once a plan did not pay or MAX_FAILED_BUILDS failed
        self.failures, self.off = 0, False

    def key(self, arrays, ops, threads):
        return (
            tuple(
                (a.shape, a.dtype.char, None if a.dtype.kind == "f" or a.size > KEY_VALUES_MAX else a.tobytes())
                for a in arrays
            ),
            ops.name,
            threads,
            derived_generation(),
            settings.current(),  # the limits a call checks: a plan is built under them
        )

    def run(self, arrays):
        """The call's {output name: array} from its key's plan; None where the Python plan
        takes the call (no plan yet, none possible, or the plan busy)."""
        ops = get_ops()
        threads = ops.plan_threads()
        if threads is None:
            return None
        key = self.key(arrays, ops, threads)
        plan = self.plans.get(key)
        if plan is None or type(plan) is int:
            seen = (plan or 0) + 1
            if self.off:
                return None
            if seen < BUILD_AFTER:
                self._keep(key, seen)
                return None
            if not pays(self.nodes, 0, 0):  # the plan's own cost alone (steps read the inputs in place)
                self._keep(key, False)
                return None
            with self.lock:
                plan = self._build(key, arrays, ops)
        if plan is False:
            return None
        try:
            if not plan.holders:  # native kernels do not signal floating-point errors to numpy
                return plan.run(arrays)
            with np.errstate(all="ignore"):  # NaN and inf propagate, as in onnxruntime
                return plan.run(arrays)
        except Exception as e:
            if ops.plan_refused_input(e):  # a bad index or a NaN for Winograd: the Python plan's call
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

    def _build(self, key, arrays, ops):
        """The plan of ``key`` for calls like ``arrays``, kept; False where there is none."""
        try:
            plan = lower(self.model, arrays, ops) or False
        except DoesNotPay:  # nor would it at other shapes, as a rule: no more traced calls
            plan, self.off = False, True
        except Exception:  # noqa: BLE001 - a model the lowering does not cover runs in Python
            plan = False
        if plan is False and not self.off:
            self.failures += 1
            self.off = self.failures >= MAX_FAILED_BUILDS
        self._keep(key, plan)
        return plan

    def plan_for(self, arrays):
        """The native plan that serves calls on ``arrays`` now, or None."""
        ops = get_ops()
        threads = ops.plan_threads()
        if threads is None:
            return None
        plan = self.plans.get(self.key(arrays, ops, threads))
        return plan if isinstance(plan, Plan) else None

    def _keep(self, key, value):
        if len(self.plans) >= MAX_PLANS and key not in self.plans:
            self.plans.clear()
        self.plans[key] = value
