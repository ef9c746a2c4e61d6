"""torch.nn.functional counterparts over numpy arrays, running on the active fastlayers backend."""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..errors import InputError, ShapeError
from ..layers.base import as_float32


def _f32(x, what: str) -> np.ndarray:
    return as_float32(x, f"nn.functional.{what}")


def _act(name: str, alpha: float = 0.0):
    def fn(input, inplace: bool = False):
        return get_ops().activation(_f32(input, name), name, alpha)
    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (``inplace`` is accepted and ignored: outputs are new arrays)."
    return fn


relu = _act("relu")
relu6 = _act("relu6")
selu = _act("selu")
sigmoid = _act("sigmoid")
hardsigmoid = _act("hard_sigmoid")
tanh = _act("tanh")
softsign = _act("softsign")
silu = _act("silu")


def leaky_relu(input, negative_slope: float = 0.01, inplace: bool = False):
    """x for x >= 0, else negative_slope * x."""
    return get_ops().activation(_f32(input, "leaky_relu"), "leaky_relu", negative_slope)


def elu(input, alpha: float = 1.0, inplace: bool = False):
    """x for x > 0, else alpha * (exp(x) - 1)."""
    return get_ops().activation(_f32(input, "elu"), "elu", alpha)


def gelu(input, approximate: str = "none"):
    """x * Phi(x) (``approximate="none"``, erf form) or its tanh approximation (``"tanh"``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return get_ops().activation(_f32(input, "gelu"), "gelu" if approximate == "none" else "gelu_tanh")


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold (torch's definition)."""
    x = _f32(input, "softplus")
    if beta == 1.0:
        y = get_ops().activation(x, "softplus")
    else:
        y = get_ops().activation(x * np.float32(beta), "softplus") / np.float32(beta)
    return np.where(x * np.float32(beta) > threshold, x, y).astype(np.float32, copy=False)


def softmax(input, dim: int | None = None, dtype=None):
    """Softmax along ``dim``."""
    x = _f32(input, "softmax")
    return get_ops().softmax(x, _dim(dim, x, "softmax"))


def log_softmax(input, dim: int | None = None, dtype=None):
    """Log-softmax along ``dim``."""
    x = _f32(input, "log_softmax")
    return get_ops().log_softmax(x, _dim(dim, x, "log_softmax"))


def _dim(dim, x, what):
    if dim is None:  # torch's legacy implicit choice
        dim = 0 if x.ndim in (0, 1, 3) else 1
    if not -max(x.ndim, 1) <= dim < max(x.ndim, 1):
        raise ShapeError(f"nn.functional.{what}: dim {dim} is out of range for an input of shape {x.shape}")
    return dim


def linear(input, weight, bias=None):
    """y = x W^T + b with W (out_features, in_features), as torch."""
    x = _f32(input, "linear")
    if x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"nn.functional.linear: input has {x.shape[-1]} features, weight expects "
                         f"{weight.shape[1]} (weight shape {weight.shape}, input shape {x.shape})")
    return get_ops().dense(x, weight.T, bias)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing ``normalized_shape`` axes, then scale and shift."""
    x = _f32(input, "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape):] != shape:
        raise ShapeError(f"nn.functional.layer_norm: input of shape {x.shape} does not end with the "
                         f"normalized shape {shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    return get_ops().layer_norm(x, weight, bias, eps, axes)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    """Inference batch norm with the running statistics, channels on axis 1."""
    from ..backends.reference import fold_batch_norm

    x = _f32(input, "batch_norm")
    scale, shift = fold_batch_norm(running_mean, running_var, weight, bias, eps)
    return get_ops().batch_norm(x, scale, shift, axis=1)


def embedding(input, weight, padding_idx=None):
    """Rows of ``weight`` selected by the integer ``input``."""
    ids = np.asarray(input)
    if ids.dtype.kind not in "iu":
        raise ShapeError(f"nn.functional.embedding: expected integer indices, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        raise InputError(f"nn.functional.embedding: indices must be in [0, {weight.shape[0]}), got "
                         f"values in [{ids.min()}, {ids.max()}]")
    return get_ops().embedding(ids, weight)


def dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False):
    """The identity: fastlayers only runs inference."""
    return _f32(input, "dropout")


# convolution, pooling, resizing (functional_conv.py)
from .functional_conv import (  # noqa: E402,F401
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d, adaptive_max_pool2d, avg_pool1d,
    avg_pool2d, conv1d, conv2d, conv_transpose2d, interpolate, local_response_norm, max_pool1d,
    max_pool2d, roi_pool,
)
