"""Constant folding at load: nodes whose inputs are all constants run once and become
constants, within a byte budget; an If whose condition became a constant is replaced by its
branch. Loops a file alone bounds are marked for ``onnx_max_loop_iterations``."""

from __future__ import annotations

import numpy as np

from ..errors import FastlayersError, ModelFileError, UnsupportedError
from . import check
from .control import Body
from .nodes import Node, owner, prune
from .ops import OPS
from .tensors import CREATE_LIMIT, SizeLimitError

#: Operators never run at load: their outputs differ from run to run.
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}


#: Operators whose output may outgrow their inputs by broadcasting them against each other.
_BROADCASTING = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Where",
    "Sum",
    "Max",
    "Min",
    "Mean",
    "PRelu",
}


def _predicted_bytes(node, values):
    """The bytes of ``node``'s output on ``values`` where it may outgrow its inputs and its
    size follows from their shapes alone (broadcasting, products, gathers, concatenations);
    None for the others (those creating tensors from values check their own sizes,
    ``tensors.created``; the rest are no larger than their inputs)."""
    arrays = [np.asarray(v) for v in values if v is not None]
    if not arrays:
        return None
    item = max(a.itemsize for a in arrays)
    if node.op_type in _BROADCASTING:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    elif node.op_type == "MatMul" and len(arrays) == 2 and min(arrays[0].ndim, arrays[1].ndim) >= 1:
        a, b = arrays
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:-1] + b.shape[-1:]
    elif node.op_type == "Gemm" and len(arrays) >= 2:  # an upper bound, whatever transA/B
        shape = (max(arrays[0].shape, default=1), max(arrays[1].shape, default=1))
    elif node.op_type == "Gather" and len(arrays) == 2:
        shape = arrays[1].shape + arrays[0].shape
    elif node.op_type == "Concat":
        return sum(a.nbytes for a in arrays)
    else:
        return None
    count = 1
    for d in shape:
        count *= int(d)
    return count * item


def fold_constants(nodes, constants, opset, budget: int | None = None, where: str = "ONNX model") -> list[Node]:
    """Run every node whose inputs are all constants; keep the others. ``budget``: the bytes
    the constants made may take in all (None: no limit; views of constants cost nothing); a
    node that would go over it, or that fails, raises ``ModelFileError`` (``UnsupportedError``
    for what fastlayers does not implement) naming ``where`` and the node."""
    kept = []
    used, owners = 0, {id(owner(v)) for v in constants.values()}
    for node in nodes:
        if (
            node.op_type in NONDETERMINISTIC
            or not all(i == "" or i in constants for i in node.inputs)
            or _may_not_end(node)
        ):  # not run at load
            kept.append(node)
            continue
        values = [constants[i] if i else None for i in node.inputs]
        left = None if budget is None else budget - used
        label = f"node {check.short(node.name or node.outputs[0])} ({node.op_type})"
        try:
            predicted = _predicted_bytes(node, values) if left is not None else None
            if predicted is not None and predicted > left:
                raise SizeLimitError(f"its result would take {predicted} bytes")
            token = CREATE_LIMIT.set(left)
            try:
                with np.errstate(all="ignore"):
                    outs = OPS[node.op_type](values, node.attrs, opset)
            finally:
                CREATE_LIMIT.reset(token)
        except SizeLimitError as e:
            raise ModelFileError(
                f"{where}: {label}: folding it at load ({e}) would take the graph's constants over "
                f"{budget} bytes (max(onnx_max_fold_bytes, 2 x its initializers); raise "
                "FASTLAYERS_ONNX_MAX_FOLD_BYTES for a graph that needs more)"
            ) from None
        except UnsupportedError as e:
            raise UnsupportedError(f"{where}: {label}: {e}") from None
        except FastlayersError as e:
            raise ModelFileError(f"{where}: {label} cannot be computed at load: {e}") from None
        except Exception as e:  # noqa: BLE001 - any failure of an operator on the file's constants
            raise ModelFileError(
                f"{where}: {label} cannot be computed at load ({type(e).__name__}: {str(e)[:300]})"
            ) from None
        for name, value in zip(node.outputs, outs):
            if name:
                value = np.asarray(value)
                base = owner(value)
                if id(base) not in owners:
                    owners.add(id(base))
                    used += getattr(base, "nbytes", value.nbytes)
                constants[name] = value
        if budget is not None and used > budget:
            raise ModelFileError(
                f"{where}: {label}: the constants folded at load take {used} bytes, over {budget} "
                "(max(onnx_max_fold_bytes, 2 x its initializers); raise FASTLAYERS_ONNX_MAX_FOLD_BYTES "
                "for a graph that needs more)"
            )
    return kept


def _fold(nodes, constants, opset, budget, where) -> list[Node]:
    """``fold_constants`` within what is left of ``budget`` (a one-element list, or None),
    which the memory of the new constants is taken from."""
    if budget is None:
        return fold_constants(nodes, constants, opset, None, where)
    owners = {id(owner(v)) for v in constants.values()}
    nodes = fold_constants(nodes, constants, opset, budget[0], where)
    new = {id(owner(v)): owner(v) for v in constants.values() if id(owner(v)) not in owners}
    budget[0] -= sum(getattr(o, "nbytes", 0) for o in new.values())
    return nodes


def fold_and_inline(nodes, constants, outputs, opset, budget, where) -> list[Node]:
    """Constant folding (``_fold``); each If whose condition became a constant replaced by its
    branch (``inline_constant_ifs``), which is folded in turn; then the dead nodes dropped."""
    nodes = _fold(nodes, constants, opset, budget, where)
    changed = True
    while changed:
        nodes, changed = inline_constant_ifs(nodes, constants)
        nodes = _fold(nodes, constants, opset, budget, where) if changed else nodes
    return prune(nodes, outputs)


def _may_not_end(node) -> bool:
    """Whether ``node`` is, or holds in a subgraph, a Loop without a trip count (which only
    its condition ends)."""
    return (node.op_type == "Loop" and not node.inputs[0]) or any(
        isinstance(v, Body) and any(map(_may_not_end, v.model._nodes)) for v in node.attrs.values()
    )


def has_loop(nodes) -> bool:
    """Whether ``nodes`` or the subgraphs of their control-flow nodes hold a Loop."""
    return any(
        n.op_type == "Loop" or any(isinstance(v, Body) and has_loop(v.model._nodes) for v in n.attrs.values())
        for n in nodes
    )


def mark_loops(nodes, constants) -> list[Node]:
    """Loop nodes get ``_bounded``: whether the file alone sets how long they may run (a
    constant trip count, or none: the condition alone ends the loop), so that
    ``onnx_max_loop_iterations`` bounds them."""
    for node in nodes:
        if node.op_type == "Loop":
            node.attrs = dict(node.attrs, _bounded=not node.inputs[0] or node.inputs[0] in constants)
    return nodes


def inline_constant_ifs(nodes, constants) -> tuple[list[Node], bool]:
    """Each If whose condition is a constant -> the nodes of the branch it takes, their values
    renamed apart (``<output>::<branch>::<name>``, the branch's constants likewise) and an
    Identity per output; also whether any was replaced."""
    kept, changed = [], False
    for node in nodes:
        cond = constants.get(node.inputs[0]) if node.op_type == "If" else None
        if cond is None or cond.size != 1:
            kept.append(node)
            continue
        key = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = node.attrs[key].model
        prefix = f"{node.outputs[0]}::{key}::"
        local = set(branch._constants).union(*(n.outputs for n in branch._nodes))

        def renamed(name):
            return prefix + name if name in local else name

        for name, value in branch._constants.items():
            constants[prefix + name] = value
        kept += [
            Node(n.op_type, [renamed(i) for i in n.inputs], [renamed(o) for o in n.outputs], n.attrs, n.name)
            for n in branch._nodes
        ]
        kept += [Node("Identity", [renamed(b)], [o], {}) for o, b in zip(node.outputs, branch.output_names) if o]
        changed = True
    return kept, changed
