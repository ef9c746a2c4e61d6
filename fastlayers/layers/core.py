"""Core layers: Dense, activations, reshaping, dropout, embedding, rescaling."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ..backends.activations import ACTIVATIONS
from ..backends.activations import DEFAULT_ALPHA as _DEFAULT_ALPHA
from ..errors import ShapeError, UnsupportedError
from .base import InputSpec, Layer, shape_str, weights_pending

_ALIASES = {None: "linear", "swish": "silu", "hard_swish": "hard_silu", "gelu_approximate": "gelu_tanh"}


def activation_name(spec) -> str:
    """Normalize an activation given by name (or None) to one of ``ACTIVATIONS``.

    ``swish`` is ``silu``, ``hard_swish`` is ``hard_silu``; ``gelu`` is the exact (erf) form and
    ``gelu_tanh`` the tanh approximation. Keras's ``threshold`` is refused: its two parameters
    have no defaults, so Keras cannot call it by name either.
    """
    if spec == "threshold":
        raise UnsupportedError(
            "activation 'threshold' needs its threshold and default_value, "
            "which a name cannot carry (Keras cannot call it by name either)"
        )
    name = _ALIASES.get(spec, spec)
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise UnsupportedError(
            f"activation {spec!r} is not supported; expected one of "
            f"{sorted(ACTIVATIONS + ('swish', 'hard_swish', None), key=str)}"
        )
    return name


class Dense(Layer):
    """Densely connected layer: ``y = activation(x @ kernel + bias)`` on the last axis.

    Parameters
    ----------
    units : int
        Output size.
    activation : str, optional
        Activation name (see ``fastlayers.layers.Activation``); None is linear.
    use_bias : bool, default True

    Shape
    -----
    (batch, ..., input_dim) -> (batch, ..., units). Weights: kernel (input_dim, units), bias (units,).
    """

    config_keys = ("units", "activation", "use_bias")

    def __init__(self, units: int, activation=None, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        if self.units <= 0:
            raise ValueError(f"Dense {self.name!r}: units must be positive, got {units}")
        self.activation = activation_name(activation)
        self.use_bias = bool(use_bias)
        self.input_spec = InputSpec(min_ndim=2)

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ShapeError(
                f"Dense {self.name!r}: the last axis of the input must be known, got shape {shape_str(input_shape)}"
            )
        self.add_weight("kernel", (d, self.units), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (self.units,), "zeros")
        self.input_spec = InputSpec(min_ndim=2, axes={-1: d})

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def call(self, x):
        return self.ops.dense(
            x,
            self.kernel,
            self.bias if self.use_bias else None,
            self.activation,
            _DEFAULT_ALPHA.get(self.activation, 0.0),
        )


class Activation(Layer):
    """Apply an activation function by name.

    Names: linear, relu, relu6, leaky_relu (slope 0.2), elu (alpha 1), selu, gelu (exact),
    gelu_tanh (tanh approximation), sigmoid, hard_sigmoid (relu6(x + 3) / 6), tanh, softmax and
    log_softmax (last axis), softplus, softsign, swish / silu, exponential; Keras 3's celu
    (alpha 1), glu (halves of the last axis: the output has half its size), hard_silu /
    hard_swish (x relu6(x + 3) / 6), hard_tanh, hard_shrink and soft_shrink (threshold 0.5),
    tanh_shrink, log_sigmoid, mish, sparse_plus, sparse_sigmoid, squareplus (b = 4) and
    sparsemax (last axis).
    """

    config_keys = ("activation",)

    def __init__(self, activation, **kwargs):
        super().__init__(**kwargs)
        self.activation = activation_name(activation)
        self._alpha = _DEFAULT_ALPHA.get(self.activation, 0.0)

    def compute_output_shape(self, input_shape):
        if self.activation == "glu" and input_shape and input_shape[-1] is not None:
            return (*input_shape[:-1], input_shape[-1] // 2)
        return tuple(input_shape)

    def call(self, x):
        return self.ops.activation(x, self.activation, self._alpha)


class ReLU(Layer):
    """``y = min(max_value, x)`` for x > threshold, else ``negative_slope * (x - threshold)``.

    At x == threshold the output is 0, as in Keras's implementation (its docstring says ``>=``).
    """

    config_keys = ("max_value", "negative_slope", "threshold")

    def __init__(self, max_value=None, negative_slope=0.0, threshold=0.0, **kwargs):
        super().__init__(**kwargs)
        self.max_value = None if max_value is None else float(max_value)
        self.negative_slope = float(negative_slope)
        self.threshold = float(threshold)

    def call(self, x):
        if self.threshold == 0.0 and self.negative_slope == 0.0:
            if self.max_value is None:
                return self.ops.activation(x, "relu")
            if self.max_value == 6.0:
                return self.ops.activation(x, "relu6")
        return self.ops.relu(x, self.threshold, self.negative_slope, self.max_value)


class LeakyReLU(Layer):
    """``y = x`` for x >= 0, else ``negative_slope * x`` (Keras default slope 0.3)."""

    config_keys = ("negative_slope",)

    def __init__(self, negative_slope=0.3, **kwargs):
        super().__init__(**kwargs)
        self.negative_slope = float(negative_slope)

    def call(self, x):
        return self.ops.activation(x, "leaky_relu", self.negative_slope)


class ELU(Layer):
    """``y = x`` for x > 0, else ``alpha * (exp(x) - 1)``."""

    config_keys = ("alpha",)

    def __init__(self, alpha=1.0, **kwargs):
        super().__init__(**kwargs)
        self.alpha = float(alpha)

    def call(self, x):
        return self.ops.activation(x, "elu", self.alpha)


class Softmax(Layer):
    """Softmax over ``axis`` (an int or a list of axes)."""

    config_keys = ("axis",)

    def __init__(self, axis=-1, **kwargs):
        super().__init__(**kwargs)
        self.axis = axis

    def call(self, x):
        return self.ops.softmax(x, tuple(self.axis) if isinstance(self.axis, (list, tuple)) else self.axis)


class Flatten(Layer):
    """Flatten all axes but the batch; ``channels_first`` inputs are moved to channels-last first."""

    config_keys = ("data_format",)

    def __init__(self, data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.data_format = data_format or "channels_last"

    def compute_output_shape(self, input_shape):
        rest = input_shape[1:]
        return (input_shape[0], None if any(d is None for d in rest) else math.prod(rest))

    def call(self, x):
        shape = tuple(x.shape)
        if self.data_format == "channels_first" and len(shape) > 2:
            x = self.ops.transpose(x, (0, *range(2, len(shape)), 1))
        return x.reshape(shape[0], math.prod(shape[1:]))


class Reshape(Layer):
    """Reshape each sample to ``target_shape`` (one entry may be -1)."""

    config_keys = ("target_shape",)

    def __init__(self, target_shape, **kwargs):
        super().__init__(**kwargs)
        self.target_shape = tuple(int(d) for d in target_shape)
        if sum(d == -1 for d in self.target_shape) > 1:
            raise ValueError(f"Reshape {self.name!r}: at most one -1 in target_shape {self.target_shape}")

    def _resolve(self, sample_shape):
        size = math.prod(sample_shape)
        known = math.prod([d for d in self.target_shape if d != -1])
        target = self.target_shape
        if -1 in target:
            if known == 0 or size % known:
                raise ShapeError(
                    f"Reshape {self.name!r}: cannot reshape samples of shape {tuple(sample_shape)} to {target}"
                )
            target = tuple(size // known if d == -1 else d for d in target)
        if math.prod(target) != size:
            raise ShapeError(
                f"Reshape {self.name!r}: cannot reshape samples of shape "
                f"{tuple(sample_shape)} ({size} values) to {self.target_shape}"
            )
        return target

    def compute_output_shape(self, input_shape):
        if any(d is None for d in input_shape[1:]):
            return (input_shape[0], *(None if d == -1 else d for d in self.target_shape))
        return (input_shape[0], *self._resolve(input_shape[1:]))

    def call(self, x):
        shape = tuple(x.shape)
        return x.reshape(shape[0], *self._resolve(shape[1:]))


class Permute(Layer):
    """Permute the non-batch axes; ``dims`` counts from 1 (``(2, 1)`` swaps axes 1 and 2)."""

    config_keys = ("dims",)

    def __init__(self, dims, **kwargs):
        super().__init__(**kwargs)
        self.dims = tuple(int(d) for d in dims)
        if sorted(self.dims) != list(range(1, len(self.dims) + 1)):
            raise ValueError(
                f"Permute {self.name!r}: dims must be a permutation of 1..{len(self.dims)}, got {self.dims}"
            )
        self.input_spec = InputSpec(ndim=len(self.dims) + 1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *(input_shape[d] for d in self.dims))

    def call(self, x):
        return self.ops.transpose(x, (0, *self.dims))


class RepeatVector(Layer):
    """Repeat a (batch, features) input ``n`` times: (batch, n, features)."""

    config_keys = ("n",)

    def __init__(self, n, **kwargs):
        super().__init__(**kwargs)
        self.n = int(n)
        self.input_spec = InputSpec(ndim=2)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.n, input_shape[1])

    def call(self, x):
        n, features = x.shape
        return self.ops.broadcast_to(x.reshape(n, 1, features), (n, self.n, features))


class Dropout(Layer):
    """Dropout: the identity at inference (``rate`` is kept for the config)."""

    config_keys: ClassVar[tuple[str, ...]] = ("rate",)

    def __init__(self, rate, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"{type(self).__name__} {self.name!r}: rate must be in [0, 1], got {rate}")

    def call(self, x):
        return x


class StochasticDepth(Layer):
    """Stochastic depth (drop path, Keras's ConvNeXt): the identity at inference
    (``drop_path_rate`` is kept for the config)."""

    config_keys = ("drop_path_rate",)

    def __init__(self, drop_path_rate, **kwargs):
        super().__init__(**kwargs)
        self.drop_path_rate = float(drop_path_rate)
        if not 0.0 <= self.drop_path_rate <= 1.0:
            raise ValueError(f"StochasticDepth {self.name!r}: drop_path_rate must be in [0, 1], got {drop_path_rate}")

    def call(self, x):
        return x


class LayerScale(Layer):
    """``y = x * gamma`` over the last axis (Keras's ConvNeXt; Touvron et al., 2021).

    Parameters
    ----------
    init_values : float
        Initial value of every ``gamma`` entry (kept for the config; weights replace it).
    projection_dim : int
        Size of the last axis. Weight: gamma (projection_dim,).
    """

    config_keys = ("init_values", "projection_dim")

    def __init__(self, init_values, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.init_values = float(init_values)
        self.projection_dim = int(projection_dim)
        if self.projection_dim <= 0:
            raise ValueError(f"LayerScale {self.name!r}: projection_dim must be positive, got {projection_dim}")
        self.input_spec = InputSpec(min_ndim=1, axes={-1: self.projection_dim})

    def build(self, input_shape):
        gamma = self.add_weight("gamma", (self.projection_dim,), "zeros")
        if not weights_pending():
            gamma[...] = np.float32(self.init_values)

    def call(self, x):
        return self.ops.merge(x, self.gamma, "multiply")


class SpatialDropout1D(Dropout):
    """Spatial (channel-wise) dropout: the identity at inference."""

    def __init__(self, rate, **kwargs):
        super().__init__(rate, **kwargs)
        self.input_spec = InputSpec(ndim=3)


class SpatialDropout2D(Dropout):
    """Spatial (channel-wise) dropout: the identity at inference."""

    config_keys = ("rate", "data_format")

    def __init__(self, rate, data_format=None, **kwargs):
        super().__init__(rate, **kwargs)
        self.data_format = data_format or "channels_last"
        self.input_spec = InputSpec(ndim=4)


class SpatialDropout3D(SpatialDropout2D):
    """Spatial (channel-wise) dropout: the identity at inference."""

    def __init__(self, rate, data_format=None, **kwargs):
        super().__init__(rate, data_format, **kwargs)
        self.input_spec = InputSpec(ndim=5)


class Rescaling(Layer):
    """``y = x * scale + offset`` (scale and offset scalars or broadcastable lists)."""

    config_keys = ("scale", "offset")

    def __init__(self, scale, offset=0.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale if np.isscalar(scale) else list(np.asarray(scale, np.float32).tolist())
        self.offset = offset if np.isscalar(offset) else list(np.asarray(offset, np.float32).tolist())
        self._scale = np.asarray(scale, np.float32)
        self._offset = np.asarray(offset, np.float32)

    def call(self, x):
        return self.ops.merge(self.ops.merge(x, self._scale, "multiply"), self._offset, "add")

    def bind(self, ops, x):
        # scalars or per-channel vectors: one scale-and-shift pass over the last axis
        if type(x) is not np.ndarray or x.ndim == 0 or x.dtype != np.float32:
            return None
        width = x.shape[-1]
        if any(v.size != 1 and v.shape != (width,) for v in (self._scale, self._offset)):
            return None
        scale, shift = (np.broadcast_to(v.reshape(-1), (width,)).copy() for v in (self._scale, self._offset))
        batch_norm = ops.batch_norm
        return self._while_same(lambda x: batch_norm(x, scale, shift, -1), ("_scale", "_offset"))


class Embedding(Layer):
    """Look up rows of ``embeddings`` (input_dim, output_dim) by integer index.

    Float inputs holding whole numbers are accepted (Keras casts them to int); an index outside
    ``[0, input_dim)`` raises ``InputError`` naming the layer. ``mask_zero=True`` is recorded and
    ``compute_mask`` returns ``ids != 0``.

    Shape
    -----
    (batch, ...) integers -> (batch, ..., output_dim)
    """

    config_keys = ("input_dim", "output_dim", "mask_zero")

    def __init__(self, input_dim, output_dim, mask_zero=False, input_length=None, **kwargs):
        super().__init__(**kwargs)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.mask_zero = bool(mask_zero)

    def build(self, input_shape):
        self.add_weight("embeddings", (self.input_dim, self.output_dim), "uniform")

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def _prepare_inputs(self, inputs):
        return self.ops.indices(inputs, self.input_dim, f"Embedding {self.name!r}")

    def compute_mask(self, ids):
        """Boolean mask of the non-padding positions (``ids != 0``), or None without mask_zero."""
        return None if not self.mask_zero else self.ops.nonzero_mask(ids)

    def call(self, ids):
        return self.ops.embedding(ids, self.embeddings)
