"""Validation of an ONNX graph at load, before anything is folded, allocated or run.

``check_graph(graph, where, opset)`` is called by ``onnx.from_model`` on the graph
``proto`` read, and returns its nodes in an order that runs (each node after the nodes
whose outputs it reads), their attributes checked and cleaned. It refuses, naming the file, the
node and the attribute or value concerned:

- the graph: graph inputs without a name or named twice, a value written by two nodes (or by a
  node and a graph input / initializer), a node input that nothing defines, a cycle, a graph
  output that nothing defines (``ModelFileError``);
- each node, by the node checks of its operator's record (``records.Op``, written beside the
  operator's implementation in its family's module and gathered in ``ops.RECORDS``): the
  number of inputs, an empty input name ("" = omitted) where the operator requires the input,
  an output beyond those the operator computes that something reads (``UnsupportedError``:
  MaxPool's Indices, BatchNormalization's training statistics), and each attribute the
  operator reads: its type (int, float, string, ints, floats, strings, tensor), its range
  (strides, dilations, kernel sizes and groups >= 1, pads >= 0, flags 0 or 1, axes and
  permutations within ``limits.ONNX_MAX_RANK``, names from the operator's list), required attributes, and
  the cross-checks of the kernels' operators (a convolution's weight rank, kernel_shape and
  group against its constant weight, a recurrent node's hidden_size against its weights).

- control flow (If, Loop, Scan): each subgraph is checked as a graph of its own whose values may
  also come from the graphs enclosing it; the names it reads from them (its captures) are
  appended to the node's inputs (after its ``_formal`` own inputs), so that ordering and
  pruning see them; its counts of inputs and outputs must fit the node's (``ModelFileError``
  naming the node and the subgraph).

Attributes the record does not list are dropped (fastlayers' own node attributes start with
"_", and a file cannot set them); unknown operators were refused before (one error listing
them all). What depends on the inputs of a call (shapes, index values) is checked when the
node runs, by the operator, as an ``InputError`` naming the node.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from .ops import RECORDS
from .proto import Graph, NodeProto
from .records import FLOAT, FLOATS, GRAPH, INT, INTS, STRING, STRINGS, TENSOR, Context, fail, node_text, short
from .tensors import DTYPES


def qualified(node) -> str:
    """The key of a node's operator in ``ops.RECORDS``: its op_type in the default domain,
    ``domain::op_type`` in another (``onnx.from_model`` refuses op types holding ":", so a
    default-domain node cannot name a contrib operator)."""
    return node.op_type if not node.domain else f"{node.domain}::{node.op_type}"


def known(key: str) -> bool:
    """Whether a file's node may name the operator ``key``: it has a record with node checks
    (fastlayers' internal operators have none)."""
    record = RECORDS.get(key)
    return record is not None and record.schema is not None


#: Control-flow operators -> their subgraph attributes.
SUBGRAPHS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


# ------------------------------------------------------------------------------ the checks
_KINDS = {
    INT: "an int",
    FLOAT: "a float",
    STRING: "a string",
    INTS: "a list of ints",
    FLOATS: "a list of floats",
    STRINGS: "a list of strings",
    TENSOR: "a tensor",
    GRAPH: "a graph",
}


def _attribute(node, key, value, rule, ctx):
    """``value`` checked against ``rule`` (ints widened to floats where a float is wanted)."""
    kind = rule.kind
    ok = True
    if kind == INT:
        ok = type(value) is int
    elif kind == FLOAT:
        ok = type(value) in (int, float)
        value = float(value) if ok else value
    elif kind == STRING:
        ok = type(value) is str
    elif kind == TENSOR:
        ok = isinstance(value, np.ndarray)
    elif kind == GRAPH:
        ok = isinstance(value, Graph)
    else:
        ok = type(value) is list and all(
            type(v) is int if kind == INTS else type(v) in (int, float) if kind == FLOATS else type(v) is str
            for v in value
        )
        if ok and kind == FLOATS:
            value = [float(v) for v in value]
    if not ok:
        got = type(value).__name__
        if type(value) is list and value:
            got = f"a list of {type(value[0]).__name__}"
        fail(ctx, node, f"attribute {short(key)} must be {_KINDS[kind]}, got {got}")
    values = value if kind in (INTS, FLOATS, STRINGS) else [value]
    if rule.length is not None and len(values) != rule.length:
        fail(ctx, node, f"attribute {short(key)} must hold {rule.length} values, holds {len(values)}")
    if rule.choices is not None:
        bad = [v for v in values if v not in rule.choices]
        if bad:
            what = short(bad[0]) if isinstance(bad[0], str) else bad[0]
            unsupported = isinstance(bad[0], str)
            fail(
                ctx,
                node,
                f"attribute {short(key)} is {what}; expected one of {', '.join(map(str, rule.choices))}",
                unsupported=unsupported,
            )
    if rule.lo is not None or rule.hi is not None:
        for v in values:
            if v != v or (rule.lo is not None and v < rule.lo) or (rule.hi is not None and v > rule.hi):
                bound = (
                    f">= {rule.lo}"
                    if rule.hi is None
                    else f"<= {rule.hi}"
                    if rule.lo is None
                    else f"in [{rule.lo}, {rule.hi}]"
                )
                shown = value if kind not in (INTS, FLOATS) or len(value) <= 8 else f"{value[:8]}..."
                fail(ctx, node, f"attribute {short(key)} is {shown}; each value must be {bound}")
    return value


def check_node(node, ctx) -> dict:
    """The checked attributes of ``node`` (those its operator reads), or an error."""
    spec = RECORDS[qualified(node)].schema
    low, high = spec.inputs
    n = len(node.inputs)
    if n < low or (high is not None and n > high):
        want = f"{low}" if low == high else f"{low} to {high}" if high is not None else f"{low} or more"
        fail(ctx, node, f"has {n} inputs, expected {want}")
    for k, name in enumerate(node.inputs):
        if not name and (spec.optional is None or k < spec.optional):
            fail(ctx, node, f"input {k + 1} is required but has no name")
    attrs = {}
    for key, value in node.attrs.items():
        if key.startswith("_"):
            fail(ctx, node, f"attribute {short(key)}: names starting with '_' are reserved")
        rule = spec.attrs.get(key)
        if rule is not None:
            attrs[key] = _attribute(node, key, value, rule, ctx)
    for key in spec.required:
        if key not in attrs:
            fail(ctx, node, f"required attribute {short(key)} is missing")
    if spec.check is not None:
        spec.check(node, attrs, ctx)
    return attrs


def check_graph(graph, where: str, opset: int) -> list:
    """The nodes of ``graph`` checked (see the module docstring), with their checked attributes
    (new ``NodeProto`` objects), in an order that runs; raises ``ModelFileError`` or
    ``UnsupportedError`` naming ``where`` and the node or value."""
    return _check_scope(graph, where, opset, frozenset())[0]


def all_nodes(graph):
    """The nodes of ``graph`` and of its subgraphs, at any depth (``proto`` bounds it)."""
    for node in graph.nodes:
        yield node
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    yield from all_nodes(sub)


def _check_scope(graph, where, opset, outer):
    """(the checked nodes of ``graph`` in an order that runs, the names of ``outer`` it reads).
    ``outer``: the names the enclosing graphs define (empty for the main graph)."""
    ctx = Context(where, opset, graph.initializers)
    defined: dict[str, str] = {}
    for name in graph.initializers:
        defined[name] = "an initializer"
    for vi in graph.inputs:
        if not vi.name:
            raise ModelFileError(f"{where}: a graph input has no name")
        if defined.get(vi.name) == "a graph input":
            raise ModelFileError(f"{where}: graph input {short(vi.name)} is declared twice")
        if outer and vi.elem_type and vi.elem_type not in DTYPES:
            raise UnsupportedError(f"{where}: input {short(vi.name)} has unsupported element type {vi.elem_type}")
        defined[vi.name] = "a graph input"
    nodes = []
    producer: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        attrs = check_node(node, ctx)
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in defined:
                other = f"node {short(graph.nodes[producer[out]].name or out)}" if out in producer else defined[out]
                raise ModelFileError(
                    f"{where}: {node_text(node)}: output {short(out)} is already "
                    f"written by {other} (each value has one producer)"
                )
            producer[out] = k
        nodes.append(NodeProto(qualified(node), node.domain, node.name, list(node.inputs), list(node.outputs), attrs))
    local = set(defined) | set(producer)
    visible = None
    for node in nodes:
        if node.op_type in SUBGRAPHS:
            visible = (outer | local) if visible is None else visible
            _check_subgraphs(node, ctx, visible)
    reads = {i for n in nodes for i in n.inputs if i} | {vo.name for vo in graph.outputs}
    captures = sorted(n for n in reads if n not in local and n in outer)
    defined.update((name, "an outer-scope value") for name in captures)
    order = _sorted(nodes, producer, defined, where)
    readers = {i for n in nodes for i in n.inputs if i}
    for vo in graph.outputs:
        if not vo.name:
            raise ModelFileError(f"{where}: a graph output has no name")
        if vo.name not in producer and vo.name not in defined:
            raise ModelFileError(
                f"{where}: graph output {short(vo.name)} is computed by no node and is no input or initializer"
            )
        readers.add(vo.name)
    for node in nodes:
        computed = RECORDS[node.op_type].schema.outputs
        if computed is not None:
            extra = [o for o in node.outputs[computed:] if o and o in readers]
            if extra:
                fail(
                    ctx,
                    node,
                    f"output {short(extra[0])} (output {node.outputs.index(extra[0]) + 1}) "
                    f"is read, but fastlayers computes only the first {computed} "
                    f"output(s) of {node.op_type}",
                    unsupported=True,
                )
    return order, captures


def _check_subgraphs(node, ctx, visible) -> None:
    """Check the subgraphs of the control-flow ``node`` (each as a graph whose outer scope is
    ``visible``) and their counts of inputs and outputs against the node's; the node's
    attributes get the checked subgraphs, its inputs the outer values they read (after its
    ``_formal`` own inputs), so that ordering and pruning see them."""
    formal, captures = len(node.inputs), []
    for key in SUBGRAPHS[node.op_type]:
        sub = node.attrs[key]
        nodes, reads = _check_scope(sub, f"{ctx.where}: {node_text(node)}: subgraph {key!r}", ctx.opset, visible)
        checked = Graph()
        checked.name, checked.nodes, checked.initializers = sub.name, nodes, sub.initializers
        checked.inputs, checked.outputs, checked.value_info = sub.inputs, sub.outputs, sub.value_info
        node.attrs[key] = checked
        captures += [c for c in reads if c not in captures]
        n_in, n_out = len(sub.inputs), len(sub.outputs)
        if node.op_type == "If":
            want_in, want_out = 0, len(node.outputs)
        elif node.op_type == "Loop":  # (iteration, condition, N carried) -> (condition, N, K scans)
            want_in, want_out = formal, 1 + len(node.outputs)
            if len(node.outputs) < formal - 2:
                fail(ctx, node, f"{formal - 2} loop-carried values but {len(node.outputs)} outputs")
            if not all(node.inputs[2:formal]):
                fail(ctx, node, "a loop-carried initial value has no name (only M and cond may be omitted)")
        else:  # Scan: (N states, M scanned) -> (N states, K scans)
            want_in, want_out = formal, len(node.outputs)
            m = node.attrs["num_scan_inputs"]
            k = len(node.outputs) - (formal - m)
            if m > formal or k < 0:
                fail(ctx, node, f"num_scan_inputs {m} for {formal} inputs and {len(node.outputs)} outputs")
            for name, count in (
                ("scan_input_axes", m),
                ("scan_input_directions", m),
                ("scan_output_axes", k),
                ("scan_output_directions", k),
            ):
                if name in node.attrs and len(node.attrs[name]) != count:
                    fail(ctx, node, f"attribute {name!r} has {len(node.attrs[name])} values for {count} scanned values")
        if n_in != want_in or n_out != want_out:
            fail(
                ctx,
                node,
                f"subgraph {key!r} has {n_in} inputs and {n_out} outputs; the node's "
                f"{formal} inputs and {len(node.outputs)} outputs need {want_in} and "
                f"{want_out}",
            )
    node.inputs += captures
    node.attrs["_formal"] = formal


def _sorted(nodes, producer, defined, where) -> list:
    """``nodes`` in an order where each input is defined before it is read (the file's order
    when it already is one; else a stable topological sort); an undefined input or a cycle is a
    ``ModelFileError``."""
    seen = set(defined)
    in_order = True
    for node in nodes:
        for i in node.inputs:
            if i and i not in seen:
                if i not in producer:
                    raise ModelFileError(
                        f"{where}: {node_text(node)} reads {short(i)}, which no "
                        "node, graph input or initializer defines"
                    )
                in_order = False
        seen.update(o for o in node.outputs if o)
    if in_order:
        return nodes
    waiting = [sum(1 for i in set(n.inputs) if i and i not in defined) for n in nodes]
    readers: dict[int, list[int]] = {}
    for k, node in enumerate(nodes):
        for i in set(node.inputs):
            if i and i not in defined:
                readers.setdefault(producer[i], []).append(k)
    import heapq

    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for r in readers.get(k, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):
        stuck = next(n for k, n in enumerate(nodes) if waiting[k] > 0)
        raise ModelFileError(f"{where}: the graph has a cycle (through {node_text(stuck)})")
    return order
