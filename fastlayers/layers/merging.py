"""Merge layers: elementwise combinations of several inputs, and concatenation."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError
from .base import Layer, shape_str


def _broadcast_shape(shapes, where):
    out = []
    rank = max(len(s) for s in shapes)
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        known = {d for d in sizes if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError(
                f"{where}: inputs of shapes {[shape_str(s) for s in shapes]} cannot be combined elementwise"
            )
        out.append(known.pop() if known else (None if None in sizes else 1))
    return tuple(out)


class _Merge(Layer):
    multi_input = True
    _arity: int | None = None

    def _check_spec(self, input_shape):
        where = f"{type(self).__name__} {self.name!r}"
        if not isinstance(input_shape, list) or len(input_shape) < 2:
            raise ShapeError(f"{where}: expected a list of at least 2 inputs")
        if self._arity is not None and len(input_shape) != self._arity:
            raise ShapeError(f"{where}: expected exactly {self._arity} inputs, got {len(input_shape)}")
        _broadcast_shape(input_shape, where)

    def compute_output_shape(self, input_shape):
        return _broadcast_shape(input_shape, f"{type(self).__name__} {self.name!r}")

    def call(self, xs):
        out = xs[0]
        for x in xs[1:]:
            out = self.ops.merge(out, x, self._merge)
        return out


class Add(_Merge):
    """Sum of the inputs (broadcasting as numpy)."""

    _merge = "add"


class Subtract(_Merge):
    """First input minus the second (exactly two inputs)."""

    _arity = 2
    _merge = "subtract"


class Multiply(_Merge):
    """Product of the inputs."""

    _merge = "multiply"


class Maximum(_Merge):
    """Elementwise maximum of the inputs (NaN propagates)."""

    _merge = "maximum"


class Minimum(_Merge):
    """Elementwise minimum of the inputs (NaN propagates)."""

    _merge = "minimum"


class Average(_Merge):
    """Mean of the inputs."""

    def call(self, xs):
        # (x_0 + ... + x_{n-2}) / n + x_{n-1} / n
        out, scale = xs[0], 1.0 / len(xs)
        for i, x in enumerate(xs[1:], 2):
            last = i == len(xs)
            out = self.ops.merge(out, x, "add", scale if last else 1.0, scale if last else 1.0)
        return out


class Concatenate(Layer):
    """Concatenate the inputs along ``axis`` (the other axes must match)."""

    multi_input = True
    config_keys = ("axis",)

    def __init__(self, axis=-1, **kwargs):
        super().__init__(**kwargs)
        self.axis = int(axis)

    def _check_spec(self, shapes):
        where = f"Concatenate {self.name!r}"
        if not isinstance(shapes, list) or len(shapes) < 2:
            raise ShapeError(f"{where}: expected a list of at least 2 inputs")
        rank = len(shapes[0])
        if any(len(s) != rank for s in shapes) or not -rank <= self.axis < rank:
            raise ShapeError(
                f"{where}: inputs of shapes {[shape_str(s) for s in shapes]} cannot be concatenated on axis {self.axis}"
            )
        axis = self.axis % rank
        for a in range(rank):
            sizes = {s[a] for s in shapes if s[a] is not None}
            if a != axis and len(sizes) > 1:
                raise ShapeError(
                    f"{where}: inputs of shapes {[shape_str(s) for s in shapes]} must "
                    f"match on every axis but {self.axis}"
                )

    def compute_output_shape(self, shapes):
        axis = self.axis % len(shapes[0])
        out = list(shapes[0])
        for a in range(len(out)):
            if out[a] is None:
                out[a] = next((s[a] for s in shapes if s[a] is not None), None)
        sizes = [s[axis] for s in shapes]
        out[axis] = None if None in sizes else sum(sizes)
        return tuple(out)

    def call(self, xs):
        return self.ops.concatenate(xs, self.axis)


class CustomScaleLayer(_Merge):
    """``y = x0 + x1 * scale``: the residual sum of Keras's InceptionResNetV2 (two inputs)."""

    _arity = 2
    config_keys = ("scale",)

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, xs):
        return self.ops.merge(xs[0], xs[1], "add", 1.0, self.scale)


_BINARY_OPS = ("add", "subtract", "multiply", "divide")


class BinaryOp(Layer):
    """``y = a (op) b``, op one of add, subtract, multiply, divide, each operand a tensor input
    or a constant: a Keras 3 operation node (``x + 3.0``, ``x * (1 / 6)``, ``a + b`` on
    symbolic tensors; ``keras.ops.add`` ...).

    Parameters
    ----------
    op : str
        ``"add"``, ``"subtract"``, ``"multiply"`` or ``"divide"``.
    constants : pair of (float or None)
        The operands in order: a number for a constant, None for the next tensor input (at
        least one). The layer takes the list of its tensor inputs.
    """

    multi_input = True
    config_keys = ("op", "constants")

    def __init__(self, op, constants=(None, None), **kwargs):
        super().__init__(**kwargs)
        if op not in _BINARY_OPS:
            raise UnsupportedError(f"BinaryOp {self.name!r}: op {op!r} is not one of {sorted(_BINARY_OPS)}")
        constants = list(constants)
        if len(constants) != 2 or None not in constants:
            raise ValueError(
                f"BinaryOp {self.name!r}: constants must be two entries, None for "
                f"each tensor operand (at least one), got {constants}"
            )
        self.op = op
        self.constants = [None if c is None else float(c) for c in constants]
        self._tensors = self.constants.count(None)
        #: the constant operands as 0-d weights (a device backend caches them)
        self._operands = [None if c is None else np.full((), c, np.float32) for c in self.constants]

    def _check_spec(self, input_shape):
        where = f"BinaryOp {self.name!r}"
        if not isinstance(input_shape, list) or len(input_shape) != self._tensors:
            raise ShapeError(f"{where}: expected a list of {self._tensors} tensor input(s)")
        _broadcast_shape(input_shape, where)

    def compute_output_shape(self, input_shape):
        return _broadcast_shape(input_shape, f"BinaryOp {self.name!r}")

    def call(self, xs):
        tensors = iter(xs)
        a, b = (next(tensors) if c is None else c for c in self._operands)
        return self.ops.merge(a, b, self.op)
