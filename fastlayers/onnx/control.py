"""ONNX control flow: If, Loop and Scan, a family of operator records
(``records.py``; ``ops.RECORDS`` gathers the families).

A subgraph runs as a ``Body``: a model of its own (``onnx.OnnxModel``, built by
``onnx._subgraph`` at load), whose inputs are the subgraph's own inputs followed by the values
of the enclosing graphs it reads (its captures). ``check`` appends those captures to the
control-flow node's inputs (after its ``_formal`` own inputs), so ordering, pruning, folding
and the fusion passes see them; the operator passes them on to the body by position.
"""

from __future__ import annotations

import numpy as np

from .. import settings
from ..errors import InputError, ShapeError
from .records import AXES, GRAPH, INTS, POS, A, Family
from .tensors import created

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("control flow")
op = FAMILY.op

# The most iterations a Loop runs where the file alone sets how long it may run (a constant
# trip count: torch's exporter writes while-loops as a constant trip count of 2**63 - 1 and a
# condition; or none: the condition alone ends the loop, and a file can make it loop forever)
# is ``onnx_max_loop_iterations`` of the options in force (``settings.current()``). Over it,
# the call raises an ``InputError`` naming the node. A trip count computed from the inputs is
# the caller's, and bounds the loop itself.


class Body:
    """A subgraph ready to run: ``run(own, captures)`` -> its output arrays."""

    __slots__ = ("model", "output_types", "forwarded")

    def __init__(self, model, output_types):
        self.model = model
        #: numpy dtype and shape (None where unknown) of each output, as the file declares them
        #: (the empty scan outputs of a Loop that runs no iteration take them)
        self.output_types = output_types
        #: where the body only passes values on (Identity nodes: a TorchScript export's
        #: branches that keep a value as it is), the position of each output among its inputs
        #: (own, then captures); else None
        self.forwarded = _forwarded(model)

    def run(self, own, captures) -> list:
        """The body's outputs on its own inputs ``own`` and the outer values ``captures``, as
        its nodes left them (no copies: they are the next iteration's inputs or are stacked).
        The body runs inside its enclosing graph's call (``OnnxModel._evaluate``), which has
        entered the backend's call and numpy's error state (a control-flow node is never
        quiet): its own nodes run straight away."""
        if self.forwarded is not None:
            arrays = [*own, *captures]
            return [arrays[i] for i in self.forwarded]
        return self._outputs(self.model._run_nodes(list(own) + list(captures)))

    def run_timed(self, own, captures, clock: list, log) -> tuple[list, dict | None]:
        """``run`` with each of the body's steps timed into ``clock`` and its backend calls
        into ``log`` (``OnnxModel._run_nodes``' arguments, for a profile): the outputs and the
        body's value table (None where the body only forwards values and runs nothing)."""
        if self.forwarded is not None:
            return self.run(own, captures), None
        values = self.model._run_nodes(list(own) + list(captures), clock, log)
        return self._outputs(values), values

    def _outputs(self, values) -> list:
        return [values[o] if o in values else self.model._constants[o] for o in self.model.output_names]


def _forwarded(model):
    """The position among ``model``'s inputs of each of its outputs, where its nodes are all
    Identity nodes (each output an input, through any number of them); else None."""
    source = {name: i for i, name in enumerate(model.input_names)}
    for node in model._nodes:
        if node.op_type != "Identity" or node.inputs[0] not in source:
            return None
        source[node.outputs[0]] = source[node.inputs[0]]
    if any(name not in source for name in model.output_names):
        return None
    return [source[name] for name in model.output_names]


def _one(value, what: str):
    """The one element of a scalar or one-element tensor."""
    value = np.asarray(value)
    if value.size != 1:
        raise ShapeError(f"{what} must hold one value, holds {value.size} (shape {value.shape})")
    return value.reshape(-1)[0]


def condition(value, what: str) -> bool:
    """The truth of a one-element condition (an If's, a Loop's)."""
    return bool(_one(value, what))


def taken_branch(inputs, attrs) -> str:
    """The attribute naming the If branch its condition ``inputs[0]`` selects:
    ``"then_branch"`` where it is true, else ``"else_branch"``."""
    cond = inputs[0]
    flag = cond.item() if type(cond) is np.ndarray and cond.size == 1 else condition(cond, "If condition")
    return "then_branch" if flag else "else_branch"


@op(
    "If",
    outputs=None,
    attrs={"then_branch": A(GRAPH), "else_branch": A(GRAPH)},
    required=("then_branch", "else_branch"),
)
def _if(inputs, attrs, opset):
    """The outputs of then_branch where the condition is true, else of else_branch."""
    return attrs[taken_branch(inputs, attrs)].run([], inputs[attrs["_formal"] :])


def _append(steps, value, what):
    """``value`` appended to the per-iteration outputs ``steps``, their stack checked against
    the size limit first (``tensors.created``): a long loop cannot pile up memory unchecked."""
    value = np.asarray(value)
    created((len(steps) + 1,) + value.shape, value.dtype, what)
    steps.append(value)


def _stacked(steps, axis, what, declared):
    """The per-iteration arrays ``steps`` stacked on a new ``axis`` (``declared``: dtype and
    shape of one step, for zero steps)."""
    if not steps:
        dtype, shape = declared
        return np.zeros((0,) + tuple(d or 0 for d in (shape or ())), dtype or np.float32)
    first = steps[0]
    if any(s.shape != first.shape for s in steps):
        raise ShapeError(
            f"{what}: the scan output changes shape across iterations "
            f"({first.shape}, then {next(s.shape for s in steps if s.shape != first.shape)})"
        )
    axis = axis % (first.ndim + 1) if -first.ndim - 1 <= axis <= first.ndim else None
    if axis is None:
        raise ShapeError(f"{what}: scan output axis for a step of rank {first.ndim}")
    return np.stack(steps, axis=axis)


@op("Loop", inputs=(2, None), optional=0, outputs=None, attrs={"body": A(GRAPH)}, required=("body",))
def _loop(inputs, attrs, opset):
    """for i in range(M) while cond: cond, carried..., scans... = body(i, cond, carried...);
    the outputs are the final carried values, then each scan output stacked over iterations."""
    formal = attrs["_formal"]
    trips, cond, carried = inputs[0], inputs[1], list(inputs[2:formal])
    captures, body = inputs[formal:], attrs["body"]
    limit = None if trips is None else int(_one(trips, "Loop trip count M"))
    bounded = attrs.get("_bounded", True)  # run at load: bounded
    go = True if cond is None else condition(cond, "Loop condition")
    scans: list[list] = [[] for _ in body.output_types[1 + len(carried) :]]
    i = 0
    most = settings.current().onnx_max_loop_iterations
    while go and (limit is None or i < limit):
        if bounded and i >= most:
            raise InputError(
                f"Loop: ran {i} iterations without stopping, the most a loop "
                f"whose length the file sets may (LoadOptions.onnx_max_loop_"
                "iterations; FASTLAYERS_ONNX_MAX_LOOP_ITERATIONS)"
            )
        outs = body.run([np.array(i, np.int64), np.array(go)] + carried, captures)
        go = condition(outs[0], "Loop body's condition output")
        carried = outs[1 : 1 + len(carried)]
        for steps, value in zip(scans, outs[1 + len(carried) :]):
            _append(steps, value, "Loop scan output")
        i += 1
    stacked = [
        _stacked(steps, 0, "Loop", declared) for steps, declared in zip(scans, body.output_types[1 + len(carried) :])
    ]
    return carried + stacked


@op(
    "Scan",
    inputs=(1, None),
    optional=None,
    outputs=None,
    required=("body", "num_scan_inputs"),
    attrs={
        "body": A(GRAPH),
        "num_scan_inputs": POS,
        "scan_input_axes": AXES,
        "scan_output_axes": AXES,
        "scan_input_directions": A(INTS, 0, 1),
        "scan_output_directions": A(INTS, 0, 1),
    },
)
def _scan(inputs, attrs, opset):
    """For t along the scan axis of the M scanned inputs (each in its direction):
    states..., outs... = body(states..., slices at t...); the outputs are the final states,
    then each per-step output stacked on its scan output axis (in its direction)."""
    formal, m = attrs["_formal"], attrs["num_scan_inputs"]
    n = formal - m
    states, scanned, captures = list(inputs[:n]), inputs[n:formal], inputs[formal:]
    body = attrs["body"]
    k = len(body.output_types) - n
    in_axes = list(attrs.get("scan_input_axes") or [0] * m)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * m)
    out_axes = list(attrs.get("scan_output_axes") or [0] * k)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * k)
    lengths = set()
    for j, x in enumerate(scanned):
        if not -x.ndim <= in_axes[j] < x.ndim:
            raise ShapeError(f"Scan: scan_input_axes {in_axes[j]} for scanned input {j + 1} of shape {x.shape}")
        in_axes[j] %= x.ndim
        lengths.add(x.shape[in_axes[j]])
    if len(lengths) != 1:
        raise ShapeError(f"Scan: the scanned inputs have different lengths {sorted(lengths)}")
    length = lengths.pop()
    steps: list[list] = [[] for _ in range(k)]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(scanned, in_axes, in_dirs)]
        outs = body.run(states + slices, captures)
        states = outs[:n]
        for per_step, value in zip(steps, outs[n:]):
            _append(per_step, value, "Scan output")
    stacked = []
    for per_step, axis, direction, declared in zip(steps, out_axes, out_dirs, body.output_types[n:]):
        stacked.append(_stacked(per_step[::-1] if direction else per_step, axis, "Scan", declared))
    return states + stacked
