"""The values a traced ``forward`` computes (``nn/tracing.py``): ``Traced``, an array with the
name of its value in the ONNX graph being written, whose arithmetic, reshapes, reductions and
concatenations write their nodes. Light (numpy only): ``nn.functional`` checks its inputs
against it without importing the ONNX writer.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the writer is imported by the tracer, not here
    from ..onnx.writer import GraphWriter

_FLOAT32 = np.dtype(np.float32)


class NotTraced(Exception):
    """What ``forward`` did has no ONNX form here: the call runs the module path."""


#: The graph being written in this thread (``graph``).
_trace = threading.local()


def tracing() -> bool:
    """Whether this thread is tracing a module's ``forward``."""
    return getattr(_trace, "graph", None) is not None


def set_graph(g: GraphWriter | None) -> None:
    """Makes ``g`` (a ``GraphWriter``, or None at the trace's end) this thread's graph."""
    _trace.graph = g


def graph_of() -> GraphWriter:
    """This thread's graph being written; NotTraced where none is."""
    g = getattr(_trace, "graph", None)
    if g is None:
        raise NotTraced
    return g


class Traced:
    """A value of a traced ``forward``: ``name`` (its ONNX value) and ``value`` (the float32
    array the module path computes). It answers what an array answers about its shape and
    writes the nodes of what ``forward`` does with it; anything else raises ``NotTraced``."""

    __slots__ = ("name", "value")
    __array_priority__ = 1000.0

    def __init__(self, name: str, value: np.ndarray):
        if type(value) is not np.ndarray or value.dtype != _FLOAT32:
            raise NotTraced
        self.name, self.value = name, value

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    size = property(lambda self: self.value.size)
    dtype = property(lambda self: self.value.dtype)

    def __len__(self) -> int:
        return len(self.value)

    def _refuse(self, *args, **kwargs):
        raise NotTraced

    __bool__ = __iter__ = __getitem__ = __setitem__ = __array__ = __float__ = __int__ = __index__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __hash__ = None  # type: ignore[assignment]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        op_type = _UFUNCS.get(ufunc)
        if method != "__call__" or kwargs or op_type is None:
            raise NotTraced
        return _apply(op_type, ufunc, inputs)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.concatenate:
            return _concatenate(*args, **kwargs)
        raise NotTraced

    def __add__(self, other):
        return _apply("Add", np.add, (self, other))

    def __radd__(self, other):
        return _apply("Add", np.add, (other, self))

    def __sub__(self, other):
        return _apply("Sub", np.subtract, (self, other))

    def __rsub__(self, other):
        return _apply("Sub", np.subtract, (other, self))

    def __mul__(self, other):
        return _apply("Mul", np.multiply, (self, other))

    def __rmul__(self, other):
        return _apply("Mul", np.multiply, (other, self))

    def __truediv__(self, other):
        return _apply("Div", np.true_divide, (self, other))

    def __rtruediv__(self, other):
        return _apply("Div", np.true_divide, (other, self))

    def __neg__(self):
        return _apply("Neg", np.negative, (self,))

    def __matmul__(self, other):
        return _apply("MatMul", np.matmul, (self, other))

    def __rmatmul__(self, other):
        return _apply("MatMul", np.matmul, (other, self))

    def reshape(self, *shape, order="C"):
        """``ndarray.reshape`` (C order): a Reshape to the result's shape."""
        if order != "C":
            raise NotTraced
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        value = self.value.reshape(shape)
        return _reshaped(self, value)

    def flatten(self, order="C"):
        """``ndarray.flatten`` (C order): a Reshape to one axis."""
        if order != "C":
            raise NotTraced
        return _reshaped(self, self.value.reshape(-1))

    def transpose(self, *axes):
        """``ndarray.transpose``: a Transpose (the axes reversed where none are given)."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        perm = [int(a) % self.ndim for a in axes] if axes else list(range(self.ndim))[::-1]
        value = self.value.transpose(perm)
        return Traced(graph_of().node("Transpose", [self.name], "transpose", perm=perm), value)

    T = property(lambda self: self.transpose())

    def mean(self, axis=None, keepdims=False):
        """``ndarray.mean`` over ``axis`` (all axes where None): a ReduceMean."""
        return _reduce(self, "ReduceMean", np.mean, axis, keepdims)

    def sum(self, axis=None, keepdims=False):
        """``ndarray.sum`` over ``axis`` (all axes where None): a ReduceSum."""
        return _reduce(self, "ReduceSum", np.sum, axis, keepdims)


#: numpy ufuncs a traced value meets -> their ONNX operator.
_UFUNCS = {
    np.add: "Add",
    np.subtract: "Sub",
    np.multiply: "Mul",
    np.true_divide: "Div",
    np.maximum: "Max",
    np.minimum: "Min",
    np.negative: "Neg",
    np.tanh: "Tanh",
    np.exp: "Exp",
    np.sqrt: "Sqrt",
    np.matmul: "MatMul",
}


def _operand(g, a):
    """(ONNX value name, value) of an operand: a traced value, a float32 array, or a Python
    number (a float32 constant, as numpy casts it against a float32 array)."""
    if isinstance(a, Traced):
        return a.name, a.value
    if type(a) in (int, float):
        return g.const(np.array(a, np.float32), "scalar"), a
    if isinstance(a, (np.ndarray, np.float32)) and a.dtype == _FLOAT32:
        return g.const(np.asarray(a), "constant"), a
    raise NotTraced


def _apply(op_type: str, ufunc, operands) -> Traced:
    """The node ``op_type`` on the operands, its value numpy's ``ufunc`` of theirs."""
    g = graph_of()
    names, values = zip(*(_operand(g, a) for a in operands))
    value = ufunc(*values)
    return Traced(g.node(op_type, list(names), op_type.lower()), value)


def _reshaped(x: Traced, value: np.ndarray) -> Traced:
    g = graph_of()
    shape = g.const(np.array(value.shape, np.int64), "shape")
    return Traced(g.node("Reshape", [x.name, shape], "reshape"), value)


def _reduce(x: Traced, op_type: str, fn, axis, keepdims) -> Traced:
    g = graph_of()
    axes = list(range(x.ndim)) if axis is None else [int(a) % x.ndim for a in np.atleast_1d(axis)]
    value = np.asarray(fn(x.value, axis=tuple(axes), keepdims=bool(keepdims)))
    names = [x.name, g.const(np.array(axes, np.int64), "axes")]
    return Traced(g.node(op_type, names, op_type.lower(), keepdims=int(bool(keepdims))), value)


def _concatenate(arrays, axis=0, out=None, dtype=None, casting="same_kind"):
    if out is not None or dtype is not None or axis is None:
        raise NotTraced
    g = graph_of()
    names, values = zip(*(_operand(g, a) for a in arrays))
    value = np.concatenate(values, axis=axis)
    return Traced(g.node("Concat", list(names), "concat", axis=int(axis) % value.ndim), value)
