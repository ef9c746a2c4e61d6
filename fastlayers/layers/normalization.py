"""Normalization layers (inference): BatchNormalization with moving statistics, LayerNormalization."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..backends.reference import fold_batch_norm
from ..errors import ShapeError, UnsupportedError
from .base import InputSpec, Layer, shape_str, weights_pending


def _normalize_axes(axis, rank, where):
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    out = []
    for a in axes:
        if not -rank <= int(a) < rank or int(a) % rank == 0:
            raise ShapeError(
                f"{where}: axis {a} is out of range for inputs of rank {rank} "
                "(the batch axis cannot be normalized over)"
            )
        out.append(int(a) % rank)
    return tuple(sorted(out))


class BatchNormalization(Layer):
    """Inference batch normalization with the moving statistics.

    ``y = gamma * (x - moving_mean) / sqrt(moving_variance + epsilon) + beta`` along ``axis``.
    Weights in Keras order: gamma (if scale), beta (if center), moving_mean, moving_variance.
    """

    config_keys = ("axis", "momentum", "epsilon", "center", "scale")

    def __init__(
        self, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True, synchronized=False, renorm=False, **kwargs
    ):
        for key in ("renorm_clipping", "renorm_momentum", "virtual_batch_size", "adjustment", "fused"):
            kwargs.pop(key, None)
        super().__init__(**kwargs)
        self.axis = int(axis)
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        self.center, self.scale = bool(center), bool(scale)

    def build(self, input_shape):
        where = f"BatchNormalization {self.name!r}"
        (axis,) = _normalize_axes(self.axis, len(input_shape), where)
        c = input_shape[axis]
        if c is None:
            raise ShapeError(
                f"{where}: axis {self.axis} of the input must be known, got shape {shape_str(input_shape)}"
            )
        if self.scale:
            self.add_weight("gamma", (c,), "ones")
        if self.center:
            self.add_weight("beta", (c,), "zeros")
        self.add_weight("moving_mean", (c,), "zeros")
        self.add_weight("moving_variance", (c,), "ones")
        self.input_spec = InputSpec(ndim=len(input_shape), axes={axis: c})
        self._axis = axis
        if not weights_pending():  # else the loader folds the loaded statistics
            self._weights_changed()

    def _weights_changed(self):
        """Fold the four vectors into the affine map the kernel applies (once, not per call)."""
        self._scale, self._shift = fold_batch_norm(
            self.moving_mean,
            self.moving_variance,
            self.gamma if self.scale else None,
            self.beta if self.center else None,
            self.epsilon,
        )

    def call(self, x):
        return self.ops.batch_norm(x, self._scale, self._shift, self._axis)


class LayerNormalization(Layer):
    """Layer normalization over ``axis`` (an int or a list), per sample.

    ``y = gamma * (x - mean) / sqrt(var + epsilon) + beta``. Keras's deprecated
    ``rms_scaling=True`` is refused; use ``RMSNormalization``.
    """

    config_keys: ClassVar[tuple[str, ...]] = ("axis", "epsilon", "center", "scale")
    _rms = False

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True, rms_scaling=False, **kwargs):
        super().__init__(**kwargs)
        if rms_scaling:
            raise UnsupportedError(
                f"LayerNormalization {self.name!r}: rms_scaling=True (deprecated "
                "in Keras) is not supported; use RMSNormalization"
            )
        self.axis = list(axis) if isinstance(axis, (list, tuple)) else int(axis)
        self.epsilon = float(epsilon)
        self.center, self.scale = bool(center), bool(scale)

    def build(self, input_shape):
        where = f"LayerNormalization {self.name!r}"
        self._axes = _normalize_axes(self.axis, len(input_shape), where)
        shape = tuple(input_shape[a] for a in self._axes)
        if None in shape:
            raise ShapeError(f"{where}: normalized axes {self._axes} must be known, got shape {shape_str(input_shape)}")
        self._add_norm_weights(shape)
        self.input_spec = InputSpec(ndim=len(input_shape), axes={a: input_shape[a] for a in self._axes})

    def _add_norm_weights(self, shape):
        if self.scale:
            self.add_weight("gamma", shape, "ones")
        if self.center:
            self.add_weight("beta", shape, "zeros")

    def call(self, x):
        return self.ops.layer_norm(
            x,
            self.gamma if self.scale else None,
            self.beta if self.center else None,
            self.epsilon,
            self._axes,
            self._rms,
        )


class RMSNormalization(LayerNormalization):
    """Root-mean-square normalization: ``y = scale * x / sqrt(mean(x^2) + epsilon)`` over ``axis``."""

    config_keys = ("axis", "epsilon")
    _rms = True

    def __init__(self, axis=-1, epsilon=1e-6, **kwargs):
        super().__init__(axis=axis, epsilon=epsilon, center=False, scale=True, **kwargs)

    def _add_norm_weights(self, shape):
        self.add_weight("scale", shape, "ones")

    def call(self, x):
        return self.ops.layer_norm(x, self.scale, None, self.epsilon, self._axes, True)


class Normalization(Layer):
    """Feature-wise standardization with stored statistics (Keras's preprocessing layer).

    ``y = (x - mean) / max(sqrt(variance), 1e-7)`` (``invert=True``: ``mean + x * max(...)``),
    statistics indexed by the kept ``axis`` (None: one scalar pair). Given ``mean``/``variance``
    are stored in the config; otherwise they are weights (mean, variance, count), as Keras
    saves an adapted layer.
    """

    config_keys = ("axis", "mean", "variance", "invert")

    def __init__(self, axis=-1, mean=None, variance=None, invert=False, **kwargs):
        super().__init__(**kwargs)
        self.axis = () if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
        if (mean is None) != (variance is None):
            raise ValueError(f"Normalization {self.name!r}: give both mean and variance, or neither")
        self.mean_value = None if mean is None else np.asarray(mean, np.float32)
        self.variance_value = None if variance is None else np.asarray(variance, np.float32)
        self.invert = bool(invert)

    def get_config(self):
        config = super().get_config()
        config["axis"] = list(self.axis)
        config["mean"] = None if self.mean_value is None else self.mean_value.tolist()
        config["variance"] = None if self.variance_value is None else self.variance_value.tolist()
        return config

    def build(self, input_shape):
        ndim = len(input_shape)
        keep = sorted(a % ndim for a in self.axis)
        if any(input_shape[a] is None for a in keep):
            raise ShapeError(
                f"Normalization {self.name!r}: kept axes {self.axis} must be known, got shape {shape_str(input_shape)}"
            )
        self._broadcast = tuple(input_shape[d] if d in keep else 1 for d in range(ndim))
        stat_shape = tuple(input_shape[d] for d in keep)
        if self.mean_value is None:
            self.add_weight("mean", stat_shape, "zeros")
            self.add_weight("variance", stat_shape, "ones")
            self.add_weight("count", (), "zeros")
        self.input_spec = InputSpec(ndim=ndim, axes={a: input_shape[a] for a in keep})

    def call(self, x):
        mean = self.mean_value if self.mean_value is not None else self.mean
        var = self.variance_value if self.variance_value is not None else self.variance
        shape = self._broadcast  # kept axes' sizes, 1 elsewhere (scalar statistics broadcast)
        if mean.ndim:
            mean = mean.reshape(shape)
        if var.ndim:
            var = var.reshape(shape)
        ops = self.ops  # std = max(sqrt(var), 1e-7)
        if self.invert:
            return ops.merge(ops.merge(x, var, "mul_std"), mean, "add")
        return ops.merge(ops.merge(x, mean, "subtract"), var, "div_std")
