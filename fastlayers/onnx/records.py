"""ONNX operator records: each operator fastlayers implements is one ``Record``.

A record holds, under the operator's key (its op_type, or ``"<domain>::<op_type>"`` for a
contrib operator, ``check.qualified``):

- ``run(inputs, attrs, opset) -> outputs``: the implementation on numpy and the backend's
  primitives (the reference, and the fallback where nothing faster is bound);
- ``schema``: the node checks made at load on a file's node (``Op``: input counts, omitted
  inputs, outputs computed, each attribute's type and range, required attributes, a
  cross-check against the node's constants); None for fastlayers' internal operators, which
  only its own fusions make and a file cannot name;
- ``bind(inputs, attrs, opset)``: the lowering used by the compiled plan, a function with
  ``run``'s signature that did once what depends only on the node's constant inputs (axes,
  starts, pads, a constant weight), or None where the general form is needed; None where the
  operator has no bound form;
- ``caches``: the names of the caches a model gives each of the operator's nodes (empty dicts
  added to a copy of the node's attributes, one set per plan, so that what a node keeps per
  input shape or backend is the model's own): ``"_windows"``, a window's geometry per input
  shape and kernel (``windows.window``; the size limit, which depends on the context, is still
  checked on every call); ``"_plans"``, a convolution's bound kernel per input shape;
  ``"_bound"``, a recurrence's bound calls; ``"_tables"``, a one-hot product's table per
  backend.

Each family of operators is a module with one ``Family`` (its ``FAMILY``), filled by the
family's ``@FAMILY.op(...)`` decorators and ``FAMILY.add(...)`` calls beside the functions they
name; ``ops/__init__.py`` lists the families explicitly and makes the one table of records
(``ops.RECORDS``) from them. The rule vocabulary below (``A``, ``Op`` and the shared rules) is
what families describe their nodes with; ``check.py`` applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .. import limits
from ..errors import ModelFileError, UnsupportedError

INT, FLOAT, STRING, INTS, FLOATS, STRINGS, TENSOR, GRAPH = (
    "int",
    "float",
    "string",
    "ints",
    "floats",
    "strings",
    "tensor",
    "graph",
)


def short(name, limit: int = 60) -> str:
    """``repr(name)`` cut to about ``limit`` characters, for error messages."""
    text = repr(name)
    return text if len(text) <= limit else text[:limit] + "...'"


class A:
    """An attribute rule: its kind, the range of its values (each element for lists), the
    values it may take (``choices``) and, for lists, a fixed length."""

    __slots__ = ("kind", "lo", "hi", "choices", "length")

    def __init__(self, kind, lo=None, hi=None, choices=None, length=None):
        self.kind, self.lo, self.hi, self.choices, self.length = kind, lo, hi, choices, length


class Op:
    """An operator's rules: inputs (min, max; max None: any number), the first input position
    that may be omitted (""; None: none may be), how many outputs fastlayers computes (None:
    as many as the node declares), attribute rules, the attributes it requires, and a
    cross-check ``check(node, attrs, ctx)``."""

    __slots__ = ("inputs", "optional", "outputs", "attrs", "required", "check")

    def __init__(self, inputs=(1, 1), optional=-1, outputs=1, attrs=None, required=(), check=None):
        self.inputs, self.outputs = inputs, outputs
        self.optional = inputs[0] if optional == -1 else optional
        self.attrs, self.required, self.check = attrs or {}, required, check


BOOL = A(INT, 0, 1)
AXIS = A(INT, -2 * limits.ONNX_MAX_RANK, 2 * limits.ONNX_MAX_RANK)
AXES = A(INTS, -2 * limits.ONNX_MAX_RANK, 2 * limits.ONNX_MAX_RANK)
FLT = A(FLOAT)
POS = A(INT, 1, limits.ONNX_MAX_GEOMETRY)
POSS = A(INTS, 1, limits.ONNX_MAX_GEOMETRY)
NONNEG = A(INTS, 0, limits.ONNX_MAX_GEOMETRY)
AUTO_PAD = A(STRING, choices=("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
#: The attributes of a convolution (Conv, ConvTranspose, their quantized forms).
CONV = {"auto_pad": AUTO_PAD, "dilations": POSS, "group": POS, "kernel_shape": POSS, "pads": NONNEG, "strides": POSS}
#: The attributes of a windowed pool (MaxPool, AveragePool, their quantized forms).
POOL = {
    "auto_pad": AUTO_PAD,
    "ceil_mode": BOOL,
    "dilations": POSS,
    "kernel_shape": POSS,
    "pads": NONNEG,
    "strides": POSS,
}

#: fastlayers' own operator domain (version 1): operators its compiled Keras-style graphs
#: write where ONNX has none (``MaskedLSTM`` ...), which a file may name too.
FASTLAYERS = "ai.fastlayers"


class Context:
    """What a cross-check may read: the file, the opset and the initializers."""

    __slots__ = ("where", "opset", "constants")

    def __init__(self, where, opset, constants):
        self.where, self.opset, self.constants = where, opset, constants


def node_text(node) -> str:
    """``node 'name' (OpType)`` for error messages (its first output where it has no name)."""
    label = node.name or (node.outputs[0] if node.outputs else "")
    return f"node {short(label)} ({node.op_type})"


def fail(ctx, node, what, unsupported=False):
    """Raise the load-time error for ``node`` of the file ``ctx.where``: ``UnsupportedError``
    where fastlayers does not implement what the node asks, else ``ModelFileError``."""
    cls = UnsupportedError if unsupported else ModelFileError
    raise cls(f"{ctx.where}: {node_text(node)}: {what}")


def spatial_lengths(node, attrs, ctx, n, names=("strides", "dilations", "kernel_shape")):
    """Refuse window attributes whose lengths do not fit ``n`` spatial axes."""
    for key in names:
        if key in attrs and len(attrs[key]) not in (0, n):
            fail(ctx, node, f"attribute {key!r} has {len(attrs[key])} values for {n} spatial axes")
    for key in ("pads",):
        if key in attrs and len(attrs[key]) not in (0, 2 * n):
            fail(ctx, node, f"attribute 'pads' has {len(attrs[key])} values for {n} spatial axes (expected {2 * n})")
    for key in ("output_padding", "output_shape"):
        if key in attrs and len(attrs[key]) not in (0, n):
            fail(ctx, node, f"attribute {key!r} has {len(attrs[key])} values for {n} spatial axes")


def spatial_rank(node, attrs, ctx, weight):
    """The number of spatial axes (1 or 2) the node's attributes or constant weight give."""
    if weight is not None:
        if weight.ndim < 3:
            fail(
                ctx,
                node,
                f"weight {short(node.inputs[1])} has shape {weight.shape}: a "
                "convolution weight has rank 3 (1-D) or 4 (2-D)",
            )
        n = weight.ndim - 2
    else:
        lengths = [len(attrs[k]) for k in ("kernel_shape", "strides", "dilations") if attrs.get(k)]
        lengths += [len(attrs["pads"]) // 2] if attrs.get("pads") else []
        n = lengths[0] if lengths else 2
    if n > 2:
        fail(ctx, node, f"{n}-D convolution and pooling are not supported (1-D and 2-D are)", unsupported=True)
    if n < 1:
        fail(ctx, node, "a convolution or pooling without spatial axes")
    return n


class Record(NamedTuple):
    """One operator: its key, implementation, node checks and bound form (see the module
    docstring)."""

    key: str
    run: Callable
    schema: Op | None
    bind: Callable | None
    caches: tuple = ()


class Family:
    """A family's records, in the module of its operators.

    ``@FAMILY.op("Name", ..., **rules)`` records the function it decorates under each name,
    with the node checks ``Op(**rules)``; ``FAMILY.add("Name", run, **rules)`` does the same
    for a function made by a factory. ``internal=True`` records an operator of fastlayers' own
    (no node checks: a file cannot name it), ``domain`` a contrib operator's domain, ``bind``
    its bound form (``FAMILY.binder("Name")`` decorates one after the fact), ``caches`` the
    node caches its nodes get.
    """

    def __init__(self, name: str):
        self.name = name
        self.records: dict[str, Record] = {}

    def add(self, names, run, *, domain="", internal=False, bind=None, caches=(), **rules):
        """Record ``run`` under each of ``names`` (a name or a sequence of names), with the node
        checks ``Op(**rules)``."""
        if internal and rules:
            raise TypeError(f"internal operator {names}: no node checks (a file cannot name it)")
        schema = None if internal else Op(**rules)
        for name in (names,) if isinstance(names, str) else names:
            key = f"{domain}::{name}" if domain else name
            if key in self.records:
                raise ValueError(f"operator {key} recorded twice in family {self.name!r}")
            self.records[key] = Record(key, run, schema, bind, tuple(caches))
        return run

    def op(self, *names, **options):
        """The decorator form of ``add``."""

        def record(fn):
            return self.add(names, fn, **options)

        return record

    def binder(self, *keys):
        """A decorator setting the bound form of the operators ``keys`` (recorded before)."""

        def record(bind):
            for key in keys:
                self.records[key] = self.records[key]._replace(bind=bind)
            return bind

        return record

    def run(self, key):
        """The implementation recorded under ``key``."""
        return self.records[key].run
