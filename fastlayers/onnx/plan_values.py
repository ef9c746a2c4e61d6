"""A native plan being lowered: its values and buffers (``Lowering``), views of the arena,
and the gathers that move values (``gather``: transposes, merged runs)."""

from __future__ import annotations

import math

import numpy as np

from .control import Body
from .layout import channels_last_memory

#: The element types a map step reads and writes.
MAP_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.bool_))
#: The types a map step reads besides: quantized values (``lower_dequantize``).
QUANTIZED_DTYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))
#: What the cost model counts a loop body as running, times, where the trace does not tell
#: (a Loop without stacked outputs; at load, ``node_count``): one iteration would be no loop.
LOOP_ITERATIONS_GUESS = 2
#: Every type a plan step reads: a take step gathers any of them.
MAP_READ_DTYPES = MAP_DTYPES | QUANTIZED_DTYPES


class NotLowered(Exception):
    """A node that the native steps do not cover: it runs in Python inside the plan."""


class Buffer:
    """A region of the arena: its bytes, the first and last step that use it, its offset; or
    memory of its own (``home``: an input's, which steps may read from the caller's array in
    its place)."""

    __slots__ = ("nbytes", "first", "last", "offset", "home")

    def __init__(self, nbytes, first):
        self.nbytes, self.first, self.last, self.offset, self.home = nbytes, first, first, -1, None


class Value:
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


def channels_last(ndim: int):
    """The axes that view channels-last memory (N, *S, C) as (N, C, *S)."""
    return (0, ndim - 1, *range(1, ndim - 1))


def layout_of(t):
    """The ``perm`` of a plan value holding the traced array ``t`` as the Python plan holds it:
    channels-last where ``t`` is an (N, C, *S) view of (N, *S, C) memory, else None."""
    if isinstance(t, np.ndarray) and t.dtype == np.float32 and channels_last_memory(t) is not None:
        return channels_last(t.ndim)
    return None


class Lowering:
    """One plan being lowered: the buffers, the steps to bind once placed (``emits``), the
    nodes that run in Python."""

    def __init__(self, model, ops):
        self.model, self.ops = model, ops
        self.buffers: list[Buffer] = []
        self.emits: list = []  # (function(plan, arena), index of its node in ``nodes``)
        self.holders: list = []  # the _Fallback steps bound, whose errors a failing run raises
        self.left = node_count(model)  # nodes not yet traced (an upper bound: both If branches)
        self.step = 0
        self.fallbacks: list[str] = []
        self.native: list[str] = []
        self.moved = 0  # bytes the plan copies that the Python plan does not (cost model)
        self.gathered = 0  # bytes the plan gathers (layout moves) that the Python plan does not
        self.results = 0  # bytes the native steps' results take (written into warm buffers)
        self.saved_us = 0.0  # what the nodes lowered save beyond STEP_US each (EXTRA_STEP_US)
        self.node = None  # the node being lowered: (model, index), for the profile
        self.nodes: list = []  # per node lowered: (model, index, input shapes, output shapes, kind)
        # ids of the buffers read by steps that the plan cannot point at a caller's array
        # (Python steps, a loop's body): an input among them is copied into its memory
        self.python_reads: set = set()
        # native and Python node runs besides one per node lowered (loop bodies; cost model)
        self.repeated = [0, 0]
        self.c_forms: dict = {}  # id of a channels-last value -> (it, its C-contiguous copy)
        self.c_added: list = []  # the keys of c_forms in the order added (dropped with their node)

    # values and buffers
    def new(self, shape, dtype=np.float32, perm=None) -> Value:
        shape = tuple(int(d) for d in shape)
        nbytes = max(math.prod(shape) * np.dtype(dtype).itemsize, 1)
        buffer = Buffer(nbytes, self.step)
        self.buffers.append(buffer)
        return Value(buffer, 0, shape, dtype, perm)

    def c_order(self, value):
        """``value`` C-contiguous: itself, or for a channels-last value its copy in C order
        (one per value, made where a step first needs it)."""
        if not isinstance(value, Value) or value.perm is None:
            return value
        found = self.c_forms.get(id(value))
        if found is None:
            # the Python plan copies such a value to C order too (numpy, for its consumer)
            found = value, transposed(self, memory_of(value), value.perm, extra=False)
            self.c_forms[id(value)] = found
            self.c_added.append(id(value))
        return self.use(found[1])

    def use(self, value):
        if isinstance(value, Value):
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


def memory_of(value: Value) -> Value:
    """The C-contiguous memory of ``value`` as a value (``value`` itself where it is C order)."""
    if value.perm is None:
        return value
    return Value(value.buffer, value.offset, value.memory_shape, value.dtype)


def arena_view(arena, value: Value) -> np.ndarray:
    """The arena's C-contiguous memory of ``value`` (of ``memory_shape``; in its buffer's own
    memory where it has one): what kernels take."""
    home = value.buffer.home
    start = value.offset if home is not None else value.buffer.offset + value.offset
    nbytes = value.size * value.dtype.itemsize
    return (arena if home is None else home)[start : start + nbytes].view(value.dtype).reshape(value.memory_shape)


def logical_view(arena, value: Value) -> np.ndarray:
    """``value`` as an array of its shape: a view of its memory through ``perm``."""
    view = arena_view(arena, value)
    return view if value.perm is None else view.transpose(value.perm)


def operand(arena, v):
    """A step's operand: the arena memory of a plan value, or the constant itself."""
    return arena_view(arena, v) if isinstance(v, Value) else v


def gather(plan, src, dst, dims, strides, maps, fill=0.0):
    """``plan.add_gather`` with axes of length 1 dropped and neighbouring axes merged where
    both read and write evenly spaced values (a Slice of whole rows: one copy per row, not per
    value); a layout move (the source's rows the destination's columns) as a transpose step."""
    dims, strides, maps = list(dims), list(strides), [np.asarray(m, np.int64) for m in maps]
    for a in reversed(range(len(dims))):
        if len(dims) > 1 and dims[a] == 1 and maps[a][0] >= 0:
            last = len(dims) - 1 if a != len(dims) - 1 else len(dims) - 2
            maps[last] = np.where(maps[last] < 0, -1, maps[last] + maps[a][0])
            del dims[a], strides[a], maps[a]
    steps = [step_of(m) for m in maps]
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


def step_of(m: np.ndarray):
    """The step of ``m`` where it is an arithmetic sequence of offsets (no padded position),
    else None."""
    if m[0] < 0:
        return None
    if len(m) == 1:
        return 0
    step = int(m[1] - m[0])
    return step if step >= 0 and np.array_equal(m, m[0] + step * np.arange(len(m))) else None


def transposed(low, x: Value, perm, extra=True) -> Value:
    """``x`` with its axes permuted (a gather into a new buffer; the same memory where the
    axes that move have length 1); ``extra``: a move the Python plan does not make (the cost
    model counts it)."""
    shape = tuple(x.shape[a] for a in perm)
    moved = [a for a in perm if x.shape[a] != 1]
    if moved == sorted(moved):
        low.use(x)
        return Value(x.buffer, x.offset, shape, x.dtype)
    y = low.new(shape, x.dtype)
    low.use(x)
    low.gathered += 2 * x.size * x.dtype.itemsize if extra else 0
    strides = [math.prod(x.shape[a + 1 :]) for a in range(len(x.shape))]
    maps = [np.arange(shape[i], dtype=np.int64) * strides[a] for i, a in enumerate(perm)]

    def bind(plan, arena):
        dst = arena_view(arena, y)
        gather(
            plan,
            arena_view(arena, x).reshape(-1),
            dst.reshape(-1),
            shape,
            [math.prod(shape[i + 1 :]) for i in range(len(shape))],
            maps,
        )

    low.emit(bind)
    return y


def node_count(model) -> int:
    """The nodes of ``model`` and of the branches of its Ifs, the nodes of a Loop's or Scan's
    body counted ``LOOP_ITERATIONS_GUESS`` times."""
    count = 0
    for node, (_, _, _, attrs, _) in zip(model._nodes, model._plan):
        count += 1
        for key, body in attrs.items():
            if isinstance(body, Body):
                times = 1 if key in ("then_branch", "else_branch") else LOOP_ITERATIONS_GUESS
                count += times * node_count(body.model)
    return count
