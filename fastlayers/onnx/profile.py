"""Per-step timings of an imported ONNX model: where a call's time goes, step by step of the
optimised node list (``OnnxModel.profile``, ``fastlayers profile``), in the spirit of
onnxruntime's ``enable_profiling`` and OpenVINO's ``benchmark_app -pc``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..backends import recording_calls
from .control import Body

#: Attributes of a fused node that name what it absorbed, shown in the ``fused`` column.
_FUSED_ATTRS = ("activation", "_activation", "residual", "kind", "_ops")


@dataclass
class Step:
    """One step of the plan: what it runs and how long it took (median over the timed calls).

    ``kernel`` names the backend methods the step called (``"cpu.conv2d"``), or ``"numpy"`` for
    a step computed in numpy alone (a fallback for the native backend), ``"cached"`` for a
    shape computation served from the per-shape cache, or ``"control flow"`` for an If, whose
    ``fused`` names the branch taken ("then" or "else") and whose time is that of choosing it:
    the branch's steps follow it as rows of their own (``branch``).
    """

    index: int
    op_type: str
    name: str
    fused: str
    input_shapes: list
    output_shapes: list
    layout: str
    kernel: str
    ms: float
    share: float = 0.0
    #: Where the step runs: "" in the model's own graph, "12.then/" in the branch that the If
    #: at step 12 took (nested: "12.then/3.else/"); ``index`` counts within that branch.
    branch: str = ""


#: The table's first line names the outputs' time from this many milliseconds (a move of an
#: output; below it, the few microseconds of handing back arrays already in order).
_SHOWN_OUTPUTS_MS = 0.005


@dataclass
class Profile:
    """The steps of one call of the model named ``model``, with the whole call's median time.

    ``str(profile)`` is a table of the steps, slowest first when ``sort`` is True;
    ``by_op()`` sums them per operator. ``total_ms`` includes ``outputs_ms``, the median time
    the call takes after its last step to hand the graph's outputs back as C-ordered arrays (an
    NCHW output that a step left as NHWC memory is moved then: one transpose of the output);
    0 for a native plan, whose run returns copies of its outputs within its own time.
    """

    model: str
    threads: int
    repeats: int
    total_ms: float
    steps: list = field(default_factory=list)
    pause: float = 0.0
    outputs_ms: float = 0.0

    def by_op(self) -> list[tuple[str, int, float, float]]:
        """(op type, steps, milliseconds, share of the call) per operator, slowest first."""
        table: dict[str, list] = {}
        for s in self.steps:
            row = table.setdefault(s.op_type, [0, 0.0])
            row[0] += 1
            row[1] += s.ms
        return sorted(
            ((op, n, ms, ms / self.total_ms if self.total_ms else 0.0) for op, (n, ms) in table.items()),
            key=lambda r: -r[2],
        )

    def table(self, top: int | None = None, sort: bool = True) -> str:
        """The steps as aligned text: time, share, operator, fused part, kernel, layout, shapes."""
        steps = sorted(self.steps, key=lambda s: -s.ms) if sort else list(self.steps)
        steps = steps[:top] if top else steps
        spaced = f", each after a {self.pause * 1e3:g} ms pause" if self.pause else ""
        lines = [
            f"{self.model}: {self.total_ms:.3f} ms per call (median of {self.repeats}{spaced}, "
            f"{self.threads} thread{'s' if self.threads != 1 else ''}), {len(self.steps)} steps"
            + (f", outputs {self.outputs_ms:.3f} ms" if self.outputs_ms >= _SHOWN_OUTPUTS_MS else ""),
            f"{'#':>4} {'ms':>9} {'share':>6}  {'op':<22} {'fused':<14} {'kernel':<26} {'layout':<7} shapes",
        ]
        for s in steps:
            shapes = f"{_shapes(s.input_shapes)} -> {_shapes(s.output_shapes)}"
            lines.append(
                f"{s.branch + str(s.index):>4} {s.ms:>9.4f} {s.share:>6.1%}  {s.op_type[:22]:<22} "
                f"{s.fused[:14]:<14} {s.kernel[:26]:<26} {s.layout:<7} {shapes}"
            )
        lines.append(
            "by operator: " + ", ".join(f"{op} x{n} {ms:.3f} ms ({share:.0%})" for op, n, ms, share in self.by_op())
        )
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """The profile as plain data (JSON-ready): the call's figures, each step in plan order
        (shapes as lists, None for a value that is not an array) and the sums per operator.

        Returns
        -------
        dict
            ``model``, ``threads``, ``repeats``, ``pause`` (seconds), ``total_ms``, ``outputs_ms``;
            ``steps``: one dict per step with
            ``index``, ``branch``, ``op_type``, ``name``, ``fused``, ``kernel``, ``layout``,
            ``input_shapes``, ``output_shapes``, ``ms``, ``share``; ``by_op``: one dict per
            operator with ``op_type``, ``steps``, ``ms``, ``share``, slowest first.
        """

        def shapes(values):
            return [list(v) if v is not None else None for v in values]

        return {
            "model": self.model,
            "threads": self.threads,
            "repeats": self.repeats,
            "pause": self.pause,
            "total_ms": self.total_ms,
            "outputs_ms": self.outputs_ms,
            "steps": [
                {
                    "index": s.index,
                    "branch": s.branch,
                    "op_type": s.op_type,
                    "name": s.name,
                    "fused": s.fused,
                    "kernel": s.kernel,
                    "layout": s.layout,
                    "input_shapes": shapes(s.input_shapes),
                    "output_shapes": shapes(s.output_shapes),
                    "ms": s.ms,
                    "share": s.share,
                }
                for s in self.steps
            ],
            "by_op": [{"op_type": op, "steps": n, "ms": ms, "share": share} for op, n, ms, share in self.by_op()],
        }

    def __str__(self) -> str:
        return self.table()


def _shapes(shapes) -> str:
    return ", ".join("x".join(map(str, s)) if s is not None else "-" for s in shapes) or "-"


def _shape(value):
    return tuple(value.shape) if isinstance(value, np.ndarray) or hasattr(value, "__array__") else None


def layout_of(value) -> str:
    """How a 4-D (3-D) value's memory is laid out: "nchw" (C-contiguous), "nhwc" (a
    channels-first view of channels-last memory, as the convolutions pass along), or "-"."""
    if not isinstance(value, np.ndarray) or value.ndim not in (3, 4):
        return "-"
    if value.flags.c_contiguous:
        return "nchw" if value.ndim == 4 else "ncw"
    if value.strides[1] == value.itemsize:
        return "nhwc" if value.ndim == 4 else "nwc"
    return "strided"


def node_detail(op_type: str, attrs) -> str:
    """The ``fused`` column of a node: what a fused node (or a ConvTranspose, which takes its
    activation in) took in; "" for others."""
    return fused_detail(attrs) if op_type.startswith("Fused") or op_type == "ConvTranspose" else ""


def body_detail(attrs) -> str:
    """The ``fused`` column of a Loop, Scan or If that a native plan runs as one step: the
    operators of its bodies ("body: MatMul+Tanh", "then: ... | else: ...")."""
    parts = []
    for key in ("body", "then_branch", "else_branch"):
        body = attrs.get(key)
        if isinstance(body, Body):
            parts.append(f"{key.split('_')[0]}: " + "+".join(n.op_type for n in body.model._nodes))
    return " | ".join(parts)


def fused_detail(attrs) -> str:
    """What a fused node took in, from its attributes (its activation, a residual add)."""
    parts = [str(attrs[k]) for k in _FUSED_ATTRS if isinstance(attrs.get(k), (str, bool)) and attrs.get(k)]
    if attrs.get("_post_affine") is not None:  # a convolution's Mul / Add by constants after it
        parts.append("affine")
    if isinstance(attrs.get("_residual"), tuple):  # a convolution's residual Add (and activation)
        act = attrs["_residual"][0]
        parts.append("add" if act == "linear" else f"add+{act}")
    if isinstance(attrs.get("layers"), tuple):  # a chain of dense nodes
        parts.append(f"{len(attrs['layers'])} dense")
    return "+".join(p if p != "True" else "residual" for p in parts)


#: Longest pause before each timed call that ``profile`` accepts, in seconds.
MAX_PAUSE = 10.0


def profile_plan(
    name, plan, nodes, run, arrays, repeats: int, threads: int, pause: float = 0.0, finish=None
) -> Profile:
    """The profile of the model ``name`` whose ``plan`` runs ``nodes``. ``run(arrays, clock,
    log)`` evaluates the plan and returns its value table, appending ``(step, seconds, backend
    calls, branch)`` to ``clock`` per step (``OnnxModel._timed_step``: ``branch``, for an If,
    holds the branch taken, its model, its own clock and value table); it runs once untimed
    with ``log`` recording the backend calls (each step's kernel), then ``repeats`` times,
    each after ``pause`` seconds of sleep; the median per step and per call. The steps of an
    If's branch follow the If, whose own time is that of choosing the branch. ``finish(values)``,
    where given, makes the call's outputs from its value table as the call does: timed after
    each run, part of the call's time and its median the profile's ``outputs_ms``."""
    calls: list = []
    with recording_calls(calls):
        first: list = []
        values = run(arrays, first, calls)
    kernels: dict[tuple, str] = {}
    tables: dict[tuple, tuple] = {(): (nodes, plan, values)}  # (path of a branch) -> its steps and values
    taken: dict[tuple, str] = {}  # path of an If step -> the branch it took

    def untimed(clock, prefix):
        for step, _, names, branch in clock:
            path = prefix + (step,)
            kernels[path] = ", ".join(dict.fromkeys(names)) or "numpy"
            if branch is not None:
                attr, body, inner, body_values = branch
                kernels[path], taken[path] = "control flow", attr
                if body_values is not None:
                    tables[path + (attr,)] = (body._nodes, body._plan, body_values)
                    untimed(inner, path + (attr,))

    untimed(first, ())
    per_step: dict[tuple, list] = {}

    def timed(clock, prefix):
        for step, seconds, _, branch in clock:
            path = prefix + (step,)
            if branch is not None:  # the If's choice of branch; the branch's steps are rows of their own
                timed(branch[2], path + (branch[0],))
            per_step.setdefault(path, []).append(seconds)

    totals, finishing = [], []
    for _ in range(repeats):
        clock: list = []
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        values = run(arrays, clock, None)
        t1 = time.perf_counter()
        if finish is not None:
            finish(values)
        t2 = time.perf_counter()
        del values  # not held through the next run
        totals.append(t2 - t0)
        finishing.append(t2 - t1)
        timed(clock, ())
    total_ms = float(np.median(totals) * 1e3)
    outputs_ms = float(np.median(finishing) * 1e3) if finish is not None else 0.0
    steps: list = []

    def rows(prefix, label):
        table_nodes, table_plan, table_values = tables[prefix]
        for k, (node, (_, ins, outs, attrs, _)) in enumerate(zip(table_nodes, table_plan)):
            path = prefix + (k,)
            times = per_step.get(path)
            ms = float(np.median(times) * 1e3) if times else 0.0
            in_shapes = [_shape(table_values.get(i) if isinstance(i, str) else i) for i in ins]
            out_values = [table_values.get(o) for o in outs if o]
            if path in taken:
                fused = taken[path].removesuffix("_branch")
            else:
                fused = node_detail(node.op_type, attrs)
            steps.append(
                Step(
                    k,
                    node.op_type,
                    node.name or (node.outputs[0] if node.outputs else ""),
                    fused,
                    in_shapes,
                    [_shape(v) for v in out_values],
                    layout_of(out_values[0]) if out_values else "-",
                    kernels.get(path, "cached") if times else "cached",
                    ms,
                    branch=label,
                )
            )
            if path + (taken.get(path),) in tables:
                rows(path + (taken[path],), f"{label}{k}.{taken[path].removesuffix('_branch')}/")

    rows((), "")
    for s in steps:
        s.share = s.ms / total_ms if total_ms else 0.0
    return Profile(name, threads, repeats, total_ms, steps, pause, outputs_ms)
