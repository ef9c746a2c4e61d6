"""torch.nn.functional counterparts over numpy arrays, running on the active fastlayers backend."""

from __future__ import annotations

import math

import numpy as np

from ..arrays import as_float32
from ..backends import get_ops
from ..errors import InputError, ShapeError
from .traced import Traced


def _f32(x, what: str) -> np.ndarray:
    return as_float32(x, f"nn.functional.{what}")


#: The module whose ONNX form each traceable function writes on a traced value
#: (``nn/tracing.py``): by the function's name.
_MODULE_OF = {
    name: f"fastlayers.nn.modules.{module}"
    for name, module in {
        "relu": "ReLU",
        "relu6": "ReLU6",
        "selu": "SELU",
        "sigmoid": "Sigmoid",
        "hard_sigmoid": "Hardsigmoid",
        "tanh": "Tanh",
        "softsign": "Softsign",
        "silu": "SiLU",
        "leaky_relu": "LeakyReLU",
        "elu": "ELU",
        "gelu": "GELU",
        "softplus": "Softplus",
        "softmax": "Softmax",
        "log_softmax": "LogSoftmax",
    }.items()
}


def _traced(fn, name: str, x, value_kwargs: dict, **settings_of):
    """``fn`` on a traced value (a module's ``forward`` being compiled, ``nn/tracing.py``):
    the form of its module ``_MODULE_OF[name]`` with ``settings_of``."""
    from . import tracing  # here: functions called on arrays never import the tracer

    return tracing.functional(fn, _MODULE_OF[name], x, value_kwargs, **settings_of)


def _act(name: str, alpha: float = 0.0):
    def fn(input, inplace: bool = False):
        if isinstance(input, Traced):
            return _traced(fn, name, input, {})
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
    if isinstance(input, Traced):
        return _traced(
            leaky_relu, "leaky_relu", input, {"negative_slope": negative_slope}, negative_slope=negative_slope
        )
    return get_ops().activation(_f32(input, "leaky_relu"), "leaky_relu", negative_slope)


def elu(input, alpha: float = 1.0, inplace: bool = False):
    """x for x > 0, else alpha * (exp(x) - 1)."""
    if isinstance(input, Traced):
        return _traced(elu, "elu", input, {"alpha": alpha}, alpha=alpha)
    return get_ops().activation(_f32(input, "elu"), "elu", alpha)


def gelu(input, approximate: str = "none"):
    """x * Phi(x) (``approximate="none"``, erf form) or its tanh approximation (``"tanh"``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if isinstance(input, Traced):
        return _traced(gelu, "gelu", input, {"approximate": approximate}, approximate=approximate)
    return get_ops().activation(_f32(input, "gelu"), "gelu" if approximate == "none" else "gelu_tanh")


def softplus(input, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta x)) / beta, and x where beta x > threshold (torch's definition)."""
    if isinstance(input, Traced):
        kwargs = {"beta": beta, "threshold": threshold}
        return _traced(softplus, "softplus", input, kwargs, **kwargs)
    x = _f32(input, "softplus")
    if beta == 1.0:
        y = get_ops().activation(x, "softplus")
    else:
        y = get_ops().activation(x * np.float32(beta), "softplus") / np.float32(beta)
    return np.where(x * np.float32(beta) > threshold, x, y).astype(np.float32, copy=False)


def softmax(input, dim: int | None = None, dtype=None):
    """Softmax along ``dim``."""
    if isinstance(input, Traced):
        return _traced(softmax, "softmax", input, {"dim": dim}, dim=dim)
    x = _f32(input, "softmax")
    dim = _dim(dim, x, "softmax")
    return x.copy() if x.size == 0 else get_ops().softmax(x, dim)  # an empty batch: empty


def log_softmax(input, dim: int | None = None, dtype=None):
    """Log-softmax along ``dim``."""
    if isinstance(input, Traced):
        return _traced(log_softmax, "log_softmax", input, {"dim": dim}, dim=dim)
    x = _f32(input, "log_softmax")
    dim = _dim(dim, x, "log_softmax")
    return x.copy() if x.size == 0 else get_ops().log_softmax(x, dim)


def _dim(dim, x, what):
    if dim is None:  # torch's legacy implicit choice
        dim = 0 if x.ndim in (0, 1, 3) else 1
    if not -max(x.ndim, 1) <= dim < max(x.ndim, 1):
        raise ShapeError(f"nn.functional.{what}: dim {dim} is out of range for an input of shape {x.shape}")
    return dim


def linear(input, weight, bias=None):
    """y = x W^T + b with W (out_features, in_features), as torch."""
    if isinstance(input, Traced):  # a traced forward: its MatMul (and Add), the kernel's value
        y = input @ np.ascontiguousarray(np.asarray(weight, np.float32).T)
        y = y if bias is None else y + np.asarray(bias, np.float32)
        y.value = linear(input.value, weight, bias)
        return y
    x = _f32(input, "linear")
    if x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"nn.functional.linear: input has {x.shape[-1]} features, weight expects "
            f"{weight.shape[1]} (weight shape {weight.shape}, input shape {x.shape})"
        )
    return get_ops().dense(x, weight.T, bias)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalize over the trailing ``normalized_shape`` axes, then scale and shift."""
    x = _f32(input, "layer_norm")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape) :] != shape:
        raise ShapeError(
            f"nn.functional.layer_norm: input of shape {x.shape} does not end with the normalized shape {shape}"
        )
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    return get_ops().layer_norm(x, weight, bias, eps, axes)


def batch_norm(
    input,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
):
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
        raise InputError(
            f"nn.functional.embedding: indices must be in [0, {weight.shape[0]}), got "
            f"values in [{ids.min()}, {ids.max()}]"
        )
    return get_ops().embedding(ids, weight)


def dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False):
    """The identity: fastlayers only runs inference."""
    return _f32(input, "dropout")


# convolution, pooling, resizing (functional_conv.py)
from .functional_conv import (  # noqa: E402,F401
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    avg_pool1d,
    avg_pool2d,
    conv1d,
    conv2d,
    conv_transpose2d,
    interpolate,
    local_response_norm,
    max_pool1d,
    max_pool2d,
    roi_pool,
)


# ------------------------------------------------------------------------- attention
def _attn_bias(mask, what: str, true_means_attend: bool) -> np.ndarray | None:
    """A torch attention mask as an additive float32 bias: bool -> 0 / -inf, float -> itself."""
    if mask is None:
        return None
    m = np.asarray(mask.detach().cpu().numpy() if hasattr(mask, "detach") else mask)
    if m.dtype == np.bool_:
        keep = m if true_means_attend else ~m
        return np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    if m.dtype.kind not in "fiu":
        raise ShapeError(f"nn.functional.{what}: expected a bool or float mask, got dtype {m.dtype}")
    return m.astype(np.float32, copy=False)


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    return_weights: bool = False,
):
    """softmax(q k^T scale + mask) v, as ``torch.nn.functional.scaled_dot_product_attention``.

    ``attn_mask`` bool: True means *take part in attention*; float: added to the scores.
    ``is_causal`` masks keys after the query position (top-left aligned). ``scale`` defaults to
    1/sqrt(E). ``dropout_p`` is ignored (inference). A query whose keys are all masked gets 0,
    as torch's math kernel gives. ``return_weights=True`` (fastlayers) also returns the weights.

    Shape
    -----
    query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); weights (..., L, S).
    With ``enable_gqa`` the head axis (-3) of key/value may divide that of query.
    """
    q, k, v = (_f32(t, "scaled_dot_product_attention") for t in (query, key, value))
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(
            "nn.functional.scaled_dot_product_attention: expected query (..., L, E), "
            f"key (..., S, E), value (..., S, Ev); got {q.shape}, {k.shape}, {v.shape}"
        )
    if is_causal and attn_mask is not None:
        raise InputError(
            "nn.functional.scaled_dot_product_attention: is_causal and attn_mask cannot both be given (as in torch)"
        )
    if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if q.shape[-3] % k.shape[-3] or q.shape[-3] % v.shape[-3]:
            raise ShapeError(
                "nn.functional.scaled_dot_product_attention: query heads "
                f"{q.shape[-3]} must be a multiple of key/value heads {k.shape[-3]}"
            )
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
        v = np.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    try:
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ShapeError(
            "nn.functional.scaled_dot_product_attention: batch axes of query "
            f"{q.shape}, key {k.shape} and value {v.shape} do not broadcast"
        ) from None
    bias = _attn_bias(attn_mask, "scaled_dot_product_attention", true_means_attend=True)
    if bias is not None:
        try:
            bias = np.broadcast_to(bias, (*lead, L, S)) if bias.ndim > 2 else np.broadcast_to(bias, (L, S))
        except ValueError:
            raise ShapeError(
                f"nn.functional.scaled_dot_product_attention: attn_mask of shape "
                f"{np.shape(attn_mask)} does not broadcast to {(*lead, L, S)}"
            ) from None
    # run as (B, H, L, E): the leading axes flattened into one "head" axis of a batch of 1
    P = math.prod(lead) if lead else 1
    q4 = np.broadcast_to(q, (*lead, L, q.shape[-1])).reshape(1, P, L, q.shape[-1])
    k4 = np.broadcast_to(k, (*lead, S, k.shape[-1])).reshape(1, P, S, k.shape[-1])
    v4 = np.broadcast_to(v, (*lead, S, v.shape[-1])).reshape(1, P, S, v.shape[-1])
    if bias is not None:
        bias = bias.reshape(1, P, L, S) if bias.ndim > 2 else bias.reshape(1, 1, L, S)
    sc = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, w = get_ops().attention(q4, k4, v4, sc, bias, bool(is_causal), 1, need_weights=return_weights)
    out = out.reshape(*lead, L, v.shape[-1])
    if not return_weights:
        return out
    return out, (None if w is None else w.reshape(*lead, L, S))
