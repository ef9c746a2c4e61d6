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

Only fastlayers' own templates become code: value names from the file appear as ``repr``
string literals (the keys of the returned table), never as identifiers or expressions.
"""

from __future__ import annotations

#: Most steps a plan compiles with (a longer one runs on the interpreter): the generated
#: function's size stays well within what CPython compiles in milliseconds.
MAX_STEPS = 20000
#: Most input-shape keys whose shape-only values are kept.
MAX_SHAPE_KEYS = 64


def compile_plan(plan, input_names, output_names, shape_outputs, dead, opset, fail):
    """``run(arrays, shape_cache) -> values``: the plan's steps on the graph's input
    ``arrays`` (in ``input_names`` order); ``values`` holds the inputs and the outputs by name.

    ``plan``: ``OnnxModel._plan``'s steps (fn, inputs (names, constants or None), outputs,
    attrs, shape_only); ``shape_outputs``: the names the shape-only steps produce, cached in
    ``shape_cache`` (a dict) per input shapes and types; ``dead``: per step, the names no later
    step reads; ``fail(step, error)``: raises the model's error for a step that raised. None
    for a plan over ``MAX_STEPS`` steps."""
    if len(plan) > MAX_STEPS:
        return None
    names: dict[str, str] = {}

    def var(name):
        if name not in names:
            names[name] = f"v{len(names)}"
        return names[name]

    env = {"OPSET": opset, "fail": fail, "MAX_SHAPE_KEYS": MAX_SHAPE_KEYS}
    args = [var(n) for n in input_names]
    lines = ["def run(arrays, shape_cache):"]
    lines.append(f"    {', '.join(args)}{',' if len(args) == 1 else ''} = arrays" if args else
                 "    pass")
    shape_index = {name: i for i, name in enumerate(shape_outputs)}
    if shape_outputs:
        key = ", ".join(f"{a}.shape, {a}.dtype.str" for a in args)
        lines.append(f"    key = ({key}{',' if len(args) == 1 else ''})")
        lines.append("    cached = shape_cache.get(key)")
    lines.append("    k = -1")
    lines.append("    try:")
    body = []
    for k, (fn, ins, outs, attrs, shape_only) in enumerate(plan):
        env[f"f{k}"], env[f"a{k}"] = fn, attrs
        operands = []
        for j, i in enumerate(ins):
            if i is None:
                operands.append("None")
            elif type(i) is str:
                operands.append(var(i))
            else:
                env[f"c{k}_{j}"] = i
                operands.append(f"c{k}_{j}")
        call = f"f{k}([{', '.join(operands)}], a{k}, OPSET)"
        named = [(j, o) for j, o in enumerate(outs) if o]
        step = [f"k = {k}"]
        if len(named) == 1 and named[0][0] == 0:
            step.append(f"{var(named[0][1])} = {call}[0]")
        elif named:
            step.append(f"r = {call}")
            step += [f"{var(o)} = r[{j}]" for j, o in named]
        else:
            step.append(call)
        if shape_only and shape_outputs:
            body.append("if cached is None:")
            body += ["    " + s for s in step]
            body.append("else:")
            body += [f"    {var(o)} = cached[{shape_index[o]}]" for _, o in named
                     if o in shape_index] or ["    pass"]
        else:
            body += step
        gone = [var(n) for n in dead[k] if n in names]
        if gone:
            body.append(f"del {', '.join(gone)}")
    lines += ["        " + s for s in body] or ["        pass"]
    lines.append("    except Exception as e:  # noqa: BLE001 - the model names the step")
    lines.append("        fail(k, e)")
    if shape_outputs:
        kept = ", ".join(var(o) for o in shape_outputs)
        lines.append("    if cached is None:")
        lines.append("        if len(shape_cache) >= MAX_SHAPE_KEYS:")
        lines.append("            shape_cache.clear()")
        lines.append(f"        shape_cache[key] = ({kept}{',' if len(shape_outputs) == 1 else ''})")
    table = {n: names[n] for n in (*input_names, *output_names) if n in names}
    lines.append("    return {" + ", ".join(f"{n!r}: {v}" for n, v in table.items()) + "}")
    exec(compile("\n".join(lines) + "\n", "<fastlayers onnx plan>", "exec"), env)  # noqa: S102
    return env["run"]
