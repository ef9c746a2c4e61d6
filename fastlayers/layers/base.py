"""Layer: the base of every fastlayers layer, with Keras's call, build and weight semantics."""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import re
import threading
from collections import defaultdict
from typing import Any, ClassVar

import numpy as np

from ..arrays import as_float32, shape_str
from ..backends import get_ops
from ..backends.types import Ops
from ..errors import ShapeError, UnsupportedError
from .symbolic import call_symbolic, is_symbolic

# Keras constructor arguments that only matter for training: accepted and ignored.
_TRAINING_ONLY = re.compile(
    r".*_(regularizer|constraint)$|^activity_regularizer$|^trainable$"
    r"|^autocast$|^lora_(rank|alpha)$|^seed$|^noise_shape$"
)
_name_counters: dict[str, itertools.count] = defaultdict(itertools.count)
_name_lock = threading.Lock()
_weights_follow = contextvars.ContextVar("fastlayers_weights_follow", default=False)


def weights_pending() -> bool:
    """True inside ``weights_loaded_later``: built weights are placeholders until the loader runs."""
    return _weights_follow.get()


@contextlib.contextmanager
def weights_loaded_later():
    """Within this block, layers built allocate their weights uninitialized (``np.empty``: no
    random numbers drawn, no memory touched) because a loader is about to overwrite them all."""
    token = _weights_follow.set(True)
    try:
        yield
    finally:
        _weights_follow.reset(token)


def unique_name(base: str) -> str:
    """Keras-style automatic names: ``dense``, ``dense_1``, ``dense_2``..."""
    with _name_lock:
        n = next(_name_counters[base])
    return base if n == 0 else f"{base}_{n}"


def snake_case(name: str) -> str:
    """``BatchNormalization`` -> ``batch_normalization``; ``Conv2D`` -> ``conv2d``."""
    s = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", s).lower()


class InputSpec:
    """What a layer accepts: a rank (``ndim`` or ``min_ndim``) and fixed sizes of some axes."""

    def __init__(self, ndim: int | None = None, min_ndim: int | None = None, axes: dict[int, int] | None = None):
        self.ndim, self.min_ndim, self.axes = ndim, min_ndim, dict(axes or {})

    def check(self, shape: tuple, where: str) -> None:
        rank = len(shape)
        if self.ndim is not None and rank != self.ndim:
            raise ShapeError(
                f"{where}: expected an input of rank {self.ndim}{self._axes_text()}, got shape {shape_str(shape)}"
            )
        if self.min_ndim is not None and rank < self.min_ndim:
            raise ShapeError(
                f"{where}: expected an input of rank >= {self.min_ndim}"
                f"{self._axes_text()}, got shape {shape_str(shape)}"
            )
        for axis, size in self.axes.items():
            if shape[axis] is not None and shape[axis] != size:
                raise ShapeError(f"{where}: expected axis {axis} of size {size}, got shape {shape_str(shape)}")

    def _axes_text(self):
        return "".join(f", axis {a} of size {s}" for a, s in self.axes.items())


_INITIALIZERS = {
    "zeros": lambda rng, shape: np.zeros(shape, np.float32),
    "ones": lambda rng, shape: np.ones(shape, np.float32),
}


def _glorot_uniform(rng, shape):
    fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
    fan_out = shape[-1]
    if len(shape) > 2:  # convolution kernels: receptive field counts in both fans
        receptive = int(np.prod(shape[:-2]))
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    limit = np.sqrt(6.0 / max(1, fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(np.float32)


class Layer:
    """Base class of layers: Keras-style ``__call__`` on numpy arrays or symbolic tensors.

    Subclasses implement ``build(input_shape)`` (create weights with ``add_weight``),
    ``compute_output_shape(input_shape)`` and ``call(x)`` (numpy in, numpy out, through the
    active backend ``self.ops``). Shapes passed to ``build`` include the batch axis as None.

    Parameters
    ----------
    name : str, optional
        Unique name in a model; default ``snake_case(class)`` with a counter.
    dtype : str, optional
        Only ``"float32"`` (or None) is supported.
    input_shape, batch_size, batch_input_shape, input_dim
        Keras's legacy way to give the first layer of a Sequential its input shape.
    """

    #: Names of constructor arguments stored as attributes of the same name (for get_config).
    config_keys: ClassVar[tuple[str, ...]] = ()
    #: Whether call takes a list of inputs (merge layers).
    multi_input = False
    #: For a layer overriding ``_prepare_inputs``: whether its plain call (one float input of
    #: a shape checked when the graph was built, no call arguments) is ``call`` on the input
    #: as it is (``Model._plan_step``).
    plain_call_validated = False

    def __init__(
        self,
        name: str | None = None,
        dtype: Any = None,
        input_shape=None,
        batch_size=None,
        batch_input_shape=None,
        input_dim=None,
        **kwargs,
    ):
        unknown = [k for k in kwargs if not _TRAINING_ONLY.match(k) and not k.endswith("_initializer")]
        if unknown:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {unknown}")
        self._initializers = {k: v for k, v in kwargs.items() if k.endswith("_initializer")}
        if dtype not in (None, "float32", np.float32) and getattr(dtype, "name", None) != "float32":
            raise UnsupportedError(
                f"{type(self).__name__}: dtype {dtype!r} is not supported; fastlayers computes in float32"
            )
        self.name = name or unique_name(snake_case(type(self).__name__))
        if input_dim is not None:
            input_shape = (input_dim,)
        if batch_input_shape is not None:
            batch_size, input_shape = batch_input_shape[0], tuple(batch_input_shape[1:])
        self._batch_input_shape = None if input_shape is None else (batch_size, *input_shape)
        self.built = False
        self.input_spec: InputSpec | list[InputSpec] | None = None
        self._weight_names: list[str] = []
        self._build_lock = threading.Lock()
        self._inbound_nodes: list = []

    # ----------------------------------------------------------------------------- weights
    def add_weight(self, name: str, shape: tuple[int, ...], initializer: str = "zeros"):
        """Create weight ``name`` of ``shape`` (float32) as an attribute, in Keras order."""
        shape = tuple(int(d) for d in shape)
        if _weights_follow.get():
            value = np.empty(shape, np.float32)
        else:
            init = self._initializers.get(f"{name}_initializer", initializer)
            value = _INITIALIZERS.get(init, _glorot_uniform)(np.random.default_rng(), shape)
        setattr(self, name, value)
        self._weight_names.append(name)
        return value

    @property
    def weights(self) -> list[np.ndarray]:
        return [getattr(self, n) for n in self._weight_names]

    @property
    def weight_names(self) -> list[str]:
        """Names of this layer's weights in Keras order (``kernel``, ``bias``...)."""
        return list(self._weight_names)

    def get_weights(self) -> list[np.ndarray]:
        """Copies of the weights in Keras order."""
        return [w.copy() for w in self.weights]

    def set_weights(self, weights) -> None:
        """Replace the weights (Keras order); each is cast to float32 and shape-checked."""
        weights = list(weights)
        if not self.built:
            raise ShapeError(
                f"layer {self.name!r} ({type(self).__name__}) is not built yet; call "
                "it on an input or put it in a model with a known input shape first"
            )
        if len(weights) != len(self._weight_names):
            raise ShapeError(
                f"layer {self.name!r} ({type(self).__name__}) expects "
                f"{len(self._weight_names)} weights {self._weight_names}, got {len(weights)}"
            )
        new = []
        for wname, w in zip(self._weight_names, weights):
            cur = getattr(self, wname)
            w = as_float32(w, f"layer {self.name!r} weight {wname!r}")
            if w.shape != cur.shape:
                raise ShapeError(
                    f"layer {self.name!r} ({type(self).__name__}): weight {wname!r} "
                    f"expects shape {cur.shape}, got {w.shape}"
                )
            new.append(np.array(w, order="C", copy=True))  # ascontiguousarray makes 0-d 1-d
        for wname, w in zip(self._weight_names, new):
            setattr(self, wname, w)
        self._weights_changed()

    def _weights_changed(self) -> None:
        """Hook for layers that derive constants from their weights."""

    def count_params(self) -> int:
        return int(sum(w.size for w in self.weights))

    # ------------------------------------------------------------------------------ config
    def get_config(self) -> dict:
        """Constructor arguments (JSON-compatible) that rebuild this layer."""
        config: dict[str, Any] = {"name": self.name}
        for key in self.config_keys:
            value = getattr(self, key)
            config[key] = list(value) if isinstance(value, tuple) else value
        return config

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        return cls(**config)

    # ------------------------------------------------------------------------------ shapes
    def build(self, input_shape) -> None:
        """Create weights for ``input_shape`` (batch axis included, as None)."""

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def _ensure_built(self, input_shape) -> None:
        if self.built:
            return
        with self._build_lock:
            if not self.built:
                self._check_spec(input_shape)
                self.build(input_shape)
                self.built = True

    def _check_spec(self, shape) -> None:
        where = f"layer {self.name!r} ({type(self).__name__})"
        if isinstance(self.input_spec, list):
            for i, (spec, s) in enumerate(zip(self.input_spec, shape)):
                spec.check(tuple(s), f"{where} input {i}")
        elif self.input_spec is not None:
            self.input_spec.check(tuple(shape), where)

    # ------------------------------------------------------------------------------ calling
    @property
    def ops(self) -> Ops:
        """The active backend (``fastlayers.use_ops``)."""
        return get_ops()

    def __call__(self, inputs, *args, **kwargs):
        kwargs.pop("training", None)
        if is_symbolic(inputs):
            return call_symbolic(self, inputs, args, kwargs)
        return self._numeric_call(inputs, args, kwargs)

    def _numeric_call(self, inputs, args=(), kwargs=None):
        """Validate and run on arrays (models call this directly for each node)."""
        x = self._prepare_inputs(inputs)
        shape = self._shape_of(x)
        if not self.built:
            self._ensure_built(shape)
        self._check_spec(shape)
        return self.call(x, *args, **kwargs) if kwargs else self.call(x, *args)

    def _prepare_inputs(self, inputs):
        where = f"layer {self.name!r} ({type(self).__name__})"
        if self.multi_input:
            if not isinstance(inputs, (list, tuple)):
                raise ShapeError(f"{where}: expected a list of inputs, got {type(inputs).__name__}")
            return [self._float_input(x, f"{where} input {i}") for i, x in enumerate(inputs)]
        return self._float_input(inputs, where)

    def _float_input(self, x, where: str):
        """An input as float32: host values through ``as_float32`` (which refuses non-numeric
        and ragged ones), arrays of a device backend cast there."""
        ops = self.ops
        if ops.device is not None and ops.is_device_array(x):
            return ops.as_float32(x)
        return as_float32(x, where)

    @staticmethod
    def _shape_of(x):
        if isinstance(x, list):
            return [(None, *a.shape[1:]) for a in x]
        return (None, *x.shape[1:])

    def call(self, x, *args, **kwargs):
        raise NotImplementedError

    def bind(self, ops, x):
        """A function computing ``call`` on ``ops`` for any input laid out as ``x`` (the same
        shapes, strides and dtypes), with the work that depends on the layout alone (padding,
        output sizes, packed weights, argument checks) done here once; None for a layer with
        nothing to save. Models bind their layers on the first call with a new input layout
        and run the bound functions after (``Model.call``). The function must check nothing
        about its input, as it is only given inputs laid out as ``x``; it must give the same
        values as ``call``, and fall back to ``call`` once a weight it captured is replaced
        (``_while_same``)."""
        return None

    def _while_same(self, run, names):
        """``run`` while the attributes ``names`` hold the objects they hold now; ``call`` after
        any of them is replaced (``set_weights``, assignment). A name is this layer's
        attribute, or (object, name) for another object's (a wrapped layer's weight)."""
        owned = [(self, n) if isinstance(n, str) else n for n in names]
        held = tuple((owner, name, getattr(owner, name)) for owner, name in owned)
        call = self.call

        def step(x):
            for owner, name, value in held:
                if getattr(owner, name) is not value:
                    return call(x)
            return run(x)

        return step

    def __repr__(self):
        return f"<{type(self).__name__} name={self.name!r}>"
