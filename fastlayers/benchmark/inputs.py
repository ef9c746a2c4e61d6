"""The inputs of a timed model: what it declares (``input_specs``), the shapes to run it at
(``resolve_shape``, ``batch_plan``) and random values of them (``make_inputs``: floats standard
normal, integers from 0 to ``INT_HIGH`` - 1, booleans fair coins; a dimension the model leaves
free takes the batch size where it leads, else the size given in ``shapes``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, ShapeError, UnsupportedError
from .engines import is_onnx

#: Random integer inputs are drawn from 0 to INT_HIGH - 1 (token ids, masks, small counts).
INT_HIGH = 10


@dataclass(frozen=True)
class InputSpec:
    """One input of a model as it declares it.

    Attributes
    ----------
    name : str
    shape : tuple or None
        One entry per dimension: an int where the model fixes it, a string (the ONNX dim_param)
        or None where it leaves it free; None where the model declares no shape at all (a
        module from a PyTorch file).
    dtype : numpy.dtype
    """

    name: str
    shape: tuple | None
    dtype: np.dtype

    def describe(self) -> str:
        """The input in words.

        Returns
        -------
        str
            Name, dtype and declared shape, free dimensions by their name or ``?``:
            ``x float32 [N, 3, 224, 224]``.
        """
        if self.shape is None:
            dims = "shape not declared"
        else:
            dims = (
                "["
                + ", ".join(str(d) if _fixed(d) else (d if isinstance(d, str) and d else "?") for d in self.shape)
                + "]"
            )
        return f"{self.name} {self.dtype} {dims}"


def _fixed(d) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0


def input_specs(model) -> list[InputSpec]:
    """The inputs ``model`` declares, in the order it takes them.

    Parameters
    ----------
    model
        What ``fastlayers.load`` returned: an ONNX model (names, dims and element types from
        the file), a Keras-style ``Model`` (its ``Input`` shapes) or a ``fastlayers.nn`` module
        (the arguments of its ``forward``, shapes not declared, float32).

    Returns
    -------
    list of InputSpec

    Raises
    ------
    UnsupportedError
        An ONNX input of a type that cannot be made up (strings).
    """
    if is_onnx(model):
        from ..onnx.model import ORT_TYPES
        from ..onnx.tensors import DTYPES

        dtypes = {ORT_TYPES[k]: np.dtype(t) for k, t in DTYPES.items()}
        specs = []
        for arg in model.get_inputs():
            if arg.type not in dtypes:
                raise UnsupportedError(
                    f"ONNX model {model.name!r} input {arg.name!r}: type {arg.type} cannot be benchmarked"
                )
            specs.append(InputSpec(arg.name, tuple(arg.shape), dtypes[arg.type]))
        return specs
    if callable(getattr(model, "input_specs", None)) and getattr(model, "built", True):
        return [
            InputSpec(name, None if shape is None else tuple(shape), np.dtype(dtype))
            for name, (shape, dtype) in zip(model.input_names, model.input_specs())
        ]
    forward = getattr(type(model), "forward", None)
    names = []
    if forward is not None:
        params = list(inspect.signature(forward).parameters.values())[1:]
        names = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    return [InputSpec(name, None, np.dtype(np.float32)) for name in (names or ["input"])]


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"x=1,3,224,224"`` -> ``("x", (1, 3, 224, 224))``; ``"x="`` is a scalar.

    Raises
    ------
    InputError
        Text not of the form ``NAME=D1,D2,...`` with positive integer dimensions.
    """
    name, sep, dims = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InputError(f"shape {text!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
    parts = [p.strip() for p in dims.split(",")] if dims.strip() else []
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(f"shape {text!r}: the dimensions must be positive integers") from None
    if any(d < 1 for d in shape):
        raise InputError(f"shape {text!r}: the dimensions must be positive integers")
    return name, shape


def check_names(specs, names, what: str) -> None:
    """InputError naming each of ``names`` that is no input of ``specs`` (``what``: the setting
    that names them, for the message)."""
    unknown = [n for n in names if n not in {s.name for s in specs}]
    if unknown:
        raise InputError(
            f"{what}: no input named {', '.join(map(repr, unknown))}; the model's inputs are {[s.name for s in specs]}"
        )


def batchable(specs: Sequence[InputSpec]) -> bool:
    """Whether a model runs at any batch size.

    Parameters
    ----------
    specs : sequence of InputSpec
        The model's inputs (``input_specs``).

    Returns
    -------
    bool
        True where the leading dimension of each non-scalar input is free (inputs without a
        declared shape count as free) and there is at least one such input.
    """
    ranked = [s for s in specs if s.shape is None or len(s.shape) > 0]
    return bool(ranked) and all(s.shape is None or not _fixed(s.shape[0]) for s in ranked)


def _shape_hint(spec: InputSpec, batch: int | None) -> str:
    if spec.shape is None:
        return f"{spec.name}=1,..."
    dims = [
        str(d)
        if _fixed(d)
        else (str(batch) if k == 0 and batch else f"<{d}>" if isinstance(d, str) and d else f"<dim {k}>")
        for k, d in enumerate(spec.shape)
    ]
    return f"{spec.name}=" + ",".join(dims)


def resolve_shape(spec: InputSpec, batch: int | None = None, shape: Sequence[int] | None = None) -> tuple[int, ...]:
    """The concrete shape of input ``spec``: ``shape`` where given (checked against the declared
    rank and fixed dimensions), else the declared one; a free leading dimension takes ``batch``.

    Raises
    ------
    ShapeError
        A free dimension that neither ``batch`` nor ``shape`` sizes (naming the input and the
        dimension, with the shape to give), an input declared without a shape and not given
        one, or a ``shape`` that contradicts the declared rank or a fixed dimension.
    """
    declared = spec.shape
    if shape is not None:
        dims = [int(d) for d in shape]
        if declared is not None:
            if len(dims) != len(declared):
                raise ShapeError(
                    f"input {spec.name!r}: the shape given, {tuple(dims)}, has "
                    f"{len(dims)} dimensions; the model declares {len(declared)} "
                    f"({spec.describe()})"
                )
            for k, (d, g) in enumerate(zip(declared, dims)):
                if _fixed(d) and d != g:
                    raise ShapeError(
                        f"input {spec.name!r}: dimension {k} is fixed at {d} by the "
                        f"model; the shape given has {g} ({spec.describe()})"
                    )
        if batch is not None and dims and (declared is None or not _fixed(declared[0])):
            dims[0] = batch
        return tuple(dims)
    if declared is None:
        raise ShapeError(
            f"input {spec.name!r}: the model declares no shape for it; give one "
            f"(--shape {spec.name}=1,... on the command line, shapes= in Python) "
            f"or give the input's values"
        )
    dims = []
    for k, d in enumerate(declared):
        if _fixed(d):
            dims.append(int(d))
        elif k == 0 and batch is not None:
            dims.append(batch)
        else:
            label = f"dimension {k}" + (f" ({d!r})" if isinstance(d, str) and d else "")
            raise ShapeError(
                f"input {spec.name!r}: {label} is not fixed by the model; give the "
                f"input's shape (--shape {_shape_hint(spec, batch)} on the command "
                f"line, shapes= in Python)"
            )
    return tuple(dims)


def random_array(shape: Sequence[int], dtype, rng: np.random.Generator) -> np.ndarray:
    """Random values of one input.

    Parameters
    ----------
    shape : sequence of int
    dtype : numpy dtype
    rng : numpy.random.Generator

    Returns
    -------
    ndarray
        Floats standard normal, integers from 0 to ``INT_HIGH`` - 1, booleans fair coins.

    Raises
    ------
    UnsupportedError
        A dtype of another kind (strings, complex).
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, INT_HIGH, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise UnsupportedError(f"random inputs of dtype {dtype} cannot be made")


def make_inputs(
    specs: Sequence[InputSpec], batch: int | None = 1, shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0
) -> list[np.ndarray]:
    """Random inputs for a model: one array per spec, of its declared dtype and of the shape
    ``resolve_shape`` gives it (a free leading dimension: ``batch``; other free dimensions:
    ``shapes[name]``).

    Parameters
    ----------
    specs : sequence of InputSpec
        From ``input_specs(model)``.
    batch : int or None
        The size of free leading dimensions (None: from ``shapes`` only).
    shapes : mapping of str to sequence of int, optional
        Full shapes of some inputs by name (their leading entry is replaced by ``batch`` where
        the model leaves that dimension free).
    seed : int
        Seed of the random values (the same seed gives the same inputs).

    Returns
    -------
    list of ndarray
        In the order of ``specs``.

    Raises
    ------
    InputError
        ``shapes`` names no input of the model.
    ShapeError
        A dimension left free and not sized, or a shape that contradicts the declared one.
    """
    shapes = dict(shapes or {})
    check_names(specs, shapes, "shapes")
    rng = np.random.default_rng(seed)
    return [random_array(resolve_shape(s, batch, shapes.get(s.name)), s.dtype, rng) for s in specs]


def items_of(arrays: Sequence[np.ndarray]) -> int:
    """The items of one call.

    Parameters
    ----------
    arrays : sequence of ndarray
        A call's inputs.

    Returns
    -------
    int
        The leading size of the first input that has one (1 where all are scalars).
    """
    for a in arrays:
        if np.ndim(a) > 0:
            return int(np.shape(a)[0])
    return 1


def batch_plan(specs, batch_sizes, shapes, given) -> tuple[list, list[str]]:
    """(batch sizes to time, notes). ``given``: the input arrays, or None for random ones."""
    notes = []
    if given is not None:
        rows = items_of(given)
        if batch_sizes is None:
            return [None], notes
        ranked = [a for a in given if np.ndim(a) > 0]
        short = [b for b in batch_sizes if b > rows]
        if short:
            raise InputError(f"the inputs given hold {rows} samples, fewer than the batch size(s) {short} asked")
        if not batchable(specs) or not ranked:
            notes.append(
                f"the model fixes its batch: timed on the inputs as given (batch {rows}); "
                f"batch sizes {list(batch_sizes)} not timed"
            )
            return [None], notes
        return list(batch_sizes), notes
    if batchable(specs):
        if batch_sizes is None:
            leading = [shapes[s.name][0] for s in specs if s.name in shapes and shapes[s.name]]
            return [leading[0] if leading else 1], notes
        return list(batch_sizes), notes
    fixed = next((s for s in specs if s.shape and _fixed(s.shape[0])), None)
    if batch_sizes is not None and fixed is not None and list(batch_sizes) != [int(fixed.shape[0])]:
        notes.append(
            f"input {fixed.name!r} fixes its leading dimension at {fixed.shape[0]}: timed "
            f"at that batch only (batch sizes {list(batch_sizes)} asked)"
        )
    elif batch_sizes is not None and fixed is None and list(batch_sizes) != [1]:
        notes.append(
            f"the model's inputs have no batch dimension: timed as declared (batch sizes {list(batch_sizes)} asked)"
        )
    return [None], notes
