"""An ONNX model's plan as one generated Python function.

The plan interpreter (``OnnxModel._run_nodes``) keeps values in a dict keyed by name and walks
the steps in a loop: per step a tuple unpack, a list built by a comprehension, dict reads and
writes and a few branches, about a microsecond before the operator does anything. A model of
small tensors (a streaming VAD, a recurrent tagger) spends much of its call there. The function
generated here runs the same steps in straight-line code: each value is a local variable, each
step one call with its inputs written out (constants and attributes bound as globals of the
function), values freed after their last reader by ``del``, the steps that compute only from
input shapes (``OnnxModel._shape_outputs``) taken from a per-shape cache after the first call
with those shapes.

An ``If`` node's two branches are compiled into the same function, as the two arms of a
Python ``if`` on its condition (``branches``): a branch costs its own steps, not a call through
the subgraph's model (``control.Body.run``) with its argument lists and table of results, which
a streaming model nesting seven small Ifs per call (Silero VAD) paid on every call. A branch's
steps that compute from shapes are cached like the graph's, per the call's input shapes, in a
dict of the arm's own (an arm need not run for every shape); a step failing in a branch is
named by the branch's model, then the If by the outer one, as when the branch runs on its own.

Only fastlayers' own templates become code: value names from the file appear as ``repr``
string literals (the keys of the returned table), never as identifiers or expressions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .control import condition

#: Most steps a plan compiles with (a longer one runs on the interpreter): the generated
#: function's size stays well within what CPython compiles in milliseconds.
MAX_STEPS = 20000
#: Most input-shape keys whose shape-only values are kept.
MAX_SHAPE_KEYS = 64


class Parts(NamedTuple):
    """What compiling a (sub)graph reads of its model: the bound plan steps (fn, inputs,
    outputs, attrs, shape_only), its input and output names, its constants (for outputs that
    are constants), the names its shape-only steps produce (``shape_outputs``), the names no
    later step reads after each step (``dead``), its error for a failing step
    (``fail(step, error)``), and per ``If`` step its two branches' ``Parts`` (``branches``:
    {step: (then, else)})."""

    plan: list
    input_names: tuple
    output_names: list
    constants: dict
    shape_outputs: list
    dead: list
    fail: Callable
    branches: dict


class _Writer:
    """The generated function's lines and the objects its names stand for (``env``)."""

    def __init__(self, opset):
        self.env = {"OPSET": opset, "ndarray": np.ndarray, "condition": condition}
        self.names = 0
        self.objects = 0
        self.steps = 0
        self.keyed = False  # whether a branch caches shape-only values by the call's key

    def fresh(self) -> str:
        self.names += 1
        return f"v{self.names - 1}"

    def bind(self, prefix, value) -> str:
        """A global of the function holding ``value``."""
        self.objects += 1
        name = f"{prefix}{self.objects - 1}"
        self.env[name] = value
        return name

    def steps_of(self, parts, scope, depth, cached=None) -> list:
        """Lines running ``parts``' plan with its values in ``scope`` (name -> expression);
        ``cached``: (the variable holding this call's cached shape-only values or None, their
        positions by name), or None where nothing is cached."""
        kvar = "k" if depth == 0 else f"k{depth}"
        body, own = [], set()  # own: the values this (sub)graph's steps compute
        for k, (fn, ins, outs, attrs, shape_only) in enumerate(parts.plan):
            self.steps += 1
            operands = []
            for i in ins:
                if i is None:
                    operands.append("None")
                elif type(i) is str:
                    operands.append(scope[i])
                else:
                    operands.append(self.bind("c", i))
            named = [(j, o) for j, o in enumerate(outs) if o]
            step = [f"{kvar} = {k}"]
            branches = parts.branches.get(k)
            own.update(o for _, o in named)
            if branches is not None:
                step += self.branch(branches, operands, attrs, named, scope, depth)
            else:
                call = f"{self.bind('f', fn)}([{', '.join(operands)}], {self.bind('a', attrs)}, OPSET)"
                for _, o in named:
                    scope[o] = self.fresh()
                if len(named) == 1 and named[0][0] == 0:
                    step.append(f"{scope[named[0][1]]} = {call}[0]")
                elif named:
                    step.append(f"r = {call}")
                    step += [f"{scope[o]} = r[{j}]" for j, o in named]
                else:
                    step.append(call)
            if shape_only and cached is not None:
                holder, index = cached
                body.append(f"if {holder} is None:")
                body += ["    " + s for s in step]
                body.append("else:")
                body += [f"    {scope[o]} = {holder}[{index[o]}]" for _, o in named if o in index] or ["    pass"]
            else:
                body += step
            gone = [scope[n] for n in parts.dead[k] if n in own]
            if gone:
                body.append(f"del {', '.join(gone)}")
        return body

    def branch(self, branches, operands, attrs, named, scope, depth) -> list:
        """An If step's lines: its condition, then each branch's steps under its own try, its
        outputs assigned from what the taken branch computed."""
        for _, o in named:
            scope[o] = self.fresh()
        formal = attrs["_formal"]
        cond = operands[0]
        lines = [
            f"if ({cond}.item() if type({cond}) is ndarray and {cond}.size == 1 "
            f"else condition({cond}, 'If condition')):"
        ]
        for arm, parts in zip(("then", "else"), branches):
            if arm == "else":
                lines.append("else:")
            inner = dict(zip(parts.input_names, operands[formal:]))
            arm_lines, cached = [], None
            if parts.shape_outputs:  # the branch's own cache, by the call's input shapes
                self.keyed = True
                store, holder = self.bind("shapes", {}), self.fresh()
                arm_lines.append(f"{holder} = {store}.get(key)")
                cached = (holder, {o: i for i, o in enumerate(parts.shape_outputs)})
            arm_lines.append("try:")
            arm_lines += ["    " + s for s in self.steps_of(parts, inner, depth + 1, cached)] or ["    pass"]
            arm_lines.append("except Exception as e:  # noqa: BLE001 - the branch names its step")
            arm_lines.append(f"    {self.bind('fail', parts.fail)}(k{depth + 1}, e)")
            if cached is not None:
                arm_lines += _stored(holder, store, [inner[o] for o in parts.shape_outputs])
            for j, o in named:
                source = parts.output_names[j]
                value = inner[source] if source in inner else self.bind("c", parts.constants[source])
                arm_lines.append(f"{scope[o]} = {value}")
            lines += ["    " + s for s in arm_lines]
        return lines


def _stored(holder, store, values) -> list:
    """Lines keeping ``values`` in the dict ``store`` under the call's ``key`` where
    ``holder`` (what it held) is None."""
    return [
        f"if {holder} is None:",
        f"    if len({store}) >= MAX_SHAPE_KEYS:",
        f"        {store}.clear()",
        f"    {store}[key] = ({', '.join(values)}{',' if len(values) == 1 else ''})",
    ]


def compile_plan(parts: Parts, fail, opset):
    """``run(arrays, shape_cache) -> values``: the plan's steps on the graph's input
    ``arrays`` (in ``parts.input_names`` order); ``values`` holds the inputs and the outputs by
    name.

    ``parts``: the graph's ``Parts`` (its If steps' branches compiled in), the values of its
    shape-only steps cached in ``shape_cache`` (a dict) per input shapes and types (those of
    a branch in a dict of its own); ``fail(step, error)``: raises the model's error for a step that raised. None for
    a plan over ``MAX_STEPS`` steps, branches included."""
    writer = _Writer(opset)
    scope = {name: writer.fresh() for name in parts.input_names}
    args = [scope[n] for n in parts.input_names]
    lines = ["def run(arrays, shape_cache):"]
    lines.append(f"    {', '.join(args)}{',' if len(args) == 1 else ''} = arrays" if args else "    pass")
    shape_outputs = parts.shape_outputs
    body = writer.steps_of(
        parts, scope, 0, ("cached", {name: i for i, name in enumerate(shape_outputs)}) if shape_outputs else None
    )
    if writer.steps > MAX_STEPS:
        return None
    if shape_outputs or writer.keyed:
        key = ", ".join(f"{a}.shape, {a}.dtype.str" for a in args)
        lines.append(f"    key = ({key}{',' if len(args) == 1 else ''})")
    if shape_outputs:
        lines.append("    cached = shape_cache.get(key)")
    lines.append("    k = -1")
    lines.append("    try:")
    lines += ["        " + s for s in body] or ["        pass"]
    lines.append("    except Exception as e:  # noqa: BLE001 - the model names the step")
    lines.append("        fail(k, e)")
    if shape_outputs:
        lines += ["    " + s for s in _stored("cached", "shape_cache", [scope[o] for o in shape_outputs])]
    table = {}
    for n in (*parts.input_names, *parts.output_names):
        if n in scope:
            table[n] = scope[n]
    lines.append("    return {" + ", ".join(f"{n!r}: {v}" for n, v in table.items()) + "}")
    env = {**writer.env, "fail": fail, "MAX_SHAPE_KEYS": MAX_SHAPE_KEYS}
    exec(compile("\n".join(lines) + "\n", "<fastlayers onnx plan>", "exec"), env)  # noqa: S102
    return env["run"]
