"""Activation functions in numpy (float32 in, float32 out; erf-based GELU in float64): the
math that ReferenceOps and the reference time loops (``reference.recurrent``) share."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805

#: Activation names every backend understands, with the parameter ``alpha`` where one applies.
ACTIVATIONS = (
    "linear",
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "gelu",
    "gelu_tanh",
    "sigmoid",
    "hard_sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "softplus",
    "softsign",
    "silu",
    "exponential",
    "celu",
    "glu",
    "hard_silu",
    "hard_tanh",
    "hard_shrink",
    "soft_shrink",
    "tanh_shrink",
    "log_sigmoid",
    "mish",
    "sparse_plus",
    "sparse_sigmoid",
    "squareplus",
    "sparsemax",
    "onnx_sigmoid",
    "onnx_silu",
    "onnx_tanh",
)
#: ``alpha`` of the parametrized activations when given by name (Keras 3's function defaults:
#: the slope, the ELU/CELU scale, the shrink threshold, squareplus's ``b``).
DEFAULT_ALPHA = {"leaky_relu": 0.2, "elu": 1.0, "celu": 1.0, "hard_shrink": 0.5, "soft_shrink": 0.5, "squareplus": 4.0}


def erfc64(x: np.ndarray) -> np.ndarray:
    """erfc(x) in float64, Chebyshev fit with relative error < 1.2e-7 everywhere (Numerical Recipes)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (
        1.00002368
        + t
        * (
            0.37409196
            + t
            * (
                0.09678418
                + t
                * (
                    -0.18628806
                    + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))
                )
            )
        )
    )
    r = t * np.exp(-z * z + poly)
    return np.where(x >= 0, r, 2.0 - r)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


#: P and Q of ``onnx_sigmoid`` (Eigen's logistic, as onnxruntime's MLAS evaluates it),
#: highest power of v^2 first.
_ONNX_SIGMOID_P = np.float32(
    [4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03, 2.48287947061529e-01]
)
_ONNX_SIGMOID_Q = np.float32(
    [
        6.10247389755681e-13,
        5.76102136993427e-09,
        6.29106785017040e-06,
        1.70198817374094e-03,
        1.16817656904453e-01,
        9.93151921023180e-01,
    ]
)


#: P and Q of ``onnx_tanh`` (Eigen's tanh, as MLAS evaluates it), highest power of v^2 first.
_ONNX_TANH_P = np.float32(
    [
        -2.76076847742355e-16,
        2.00018790482477e-13,
        -8.60467152213735e-11,
        5.12229709037114e-08,
        1.48572235717979e-05,
        6.37261928875436e-04,
        4.89352455891786e-03,
    ]
)
_ONNX_TANH_Q = np.float32([1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03])


def _rational(x, bound, p_coeffs, q_coeffs):
    """v P(v^2) / Q(v^2) for v = clamp(x, -bound, bound), each Horner step a fused multiply-add
    (a * b + c in float64, where a float32 product is exact, rounded to float32); NaN stays NaN."""
    v = np.clip(x, np.float32(-bound), np.float32(bound)).astype(np.float64)
    v2 = (v * v).astype(np.float32).astype(np.float64)

    def horner(coeffs):
        acc = np.full_like(v2, coeffs[0])
        for c in coeffs[1:]:
            acc = (acc * v2 + np.float64(c)).astype(np.float32).astype(np.float64)
        return acc

    return (horner(p_coeffs) * v).astype(np.float32) / horner(q_coeffs).astype(np.float32)


def onnx_tanh(x):
    """tanh as onnxruntime computes the ONNX Tanh and its recurrent gates (MLAS, after Eigen):
    clamp to [-9, 9], then ``_rational``."""
    return _rational(x, 9, _ONNX_TANH_P, _ONNX_TANH_Q).astype(np.float32, copy=False)


def onnx_sigmoid(x):
    """sigmoid as onnxruntime computes the ONNX Sigmoid: v = clamp(x, -18, 18), 0.5 + v P(v^2) /
    Q(v^2) by Horner's rule with fused multiply-adds (each a * b + c in float64, where a float32
    product is exact, then rounded to float32), clamped to [0, 1]; NaN stays NaN."""
    with np.errstate(invalid="ignore"):
        r = _rational(x, 18, _ONNX_SIGMOID_P, _ONNX_SIGMOID_Q)
    y = np.clip(r + np.float32(0.5), np.float32(0), np.float32(1))
    return y.astype(np.float32, copy=False)


def _activation(x, name, alpha):
    if name == "linear":
        return x.copy()
    if name == "relu":
        return np.maximum(x, np.float32(0))
    if name == "relu6":
        return np.minimum(np.maximum(x, np.float32(0)), np.float32(6))
    if name == "leaky_relu":
        return np.where(x >= 0, x, np.float32(alpha) * x)
    if name in ("elu", "selu"):
        a, s = (alpha, 1.0) if name == "elu" else (SELU_ALPHA, SELU_SCALE)
        neg = np.float32(a) * np.expm1(np.minimum(x, np.float32(0)))
        return np.float32(s) * np.where(x > 0, x, neg)
    if name == "gelu":
        x64 = x.astype(np.float64)
        return (0.5 * x64 * erfc64(-x64 / np.sqrt(2.0))).astype(np.float32)
    if name == "gelu_tanh":
        x64 = x.astype(np.float64)
        inner = np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)
        return (0.5 * x64 * (1.0 + np.tanh(inner))).astype(np.float32)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "onnx_sigmoid":
        return onnx_sigmoid(x)
    if name == "onnx_tanh":
        return onnx_tanh(x)
    if name == "onnx_silu":
        with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as in onnxruntime
            return x * onnx_sigmoid(x)
    if name == "hard_sigmoid":
        return np.minimum(np.maximum(x + np.float32(3), np.float32(0)), np.float32(6)) / np.float32(6)
    if name == "tanh":
        return np.tanh(x)
    if name == "softplus":
        return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, np.float32(0))
    if name == "softsign":
        return x / (np.float32(1) + np.abs(x))
    if name == "silu":
        return x * _sigmoid(x)
    if name == "exponential":
        return np.exp(x)
    if name == "softmax":
        return _softmax(x, -1)
    if name == "log_softmax":
        return _log_softmax(x, -1)
    return _activation_keras3(x, name, alpha)


def _activation_keras3(x, name, alpha):
    """The activations Keras 3 added (``keras.activations``), on the reference path only."""
    zero, one = np.float32(0), np.float32(1)
    if name == "celu":  # max(x, 0) + min(alpha (exp(x / alpha) - 1), 0)
        a = np.float32(alpha)
        return np.maximum(x, zero) + np.minimum(a * np.expm1(np.minimum(x, zero) / a), zero)
    if name == "glu":  # a * sigmoid(b), [a, b] the two halves of the last axis
        if x.ndim == 0 or x.shape[-1] % 2:
            raise ShapeError(
                f"activation 'glu' splits the last axis in two halves; it needs an even size, found shape {x.shape}"
            )
        a, b = np.split(x, 2, axis=-1)
        return a * _sigmoid(b)
    if name == "hard_silu":  # x relu6(x + 3) / 6
        return x * (np.minimum(np.maximum(x + np.float32(3), zero), np.float32(6)) / np.float32(6))
    if name == "hard_tanh":  # clip(x, -1, 1)
        return np.clip(x, -one, one)
    if name == "hard_shrink":  # x where |x| > alpha, else 0
        return np.where(np.abs(x) > np.float32(alpha), x, zero)
    if name == "soft_shrink":  # sign(x) max(|x| - alpha, 0)
        a = np.float32(alpha)
        return np.where(x > a, x - a, np.where(x < -a, x + a, zero))
    if name == "tanh_shrink":  # x - tanh(x)
        return x - np.tanh(x)
    if name == "log_sigmoid":  # -softplus(-x)
        return np.minimum(x, zero) - np.log1p(np.exp(-np.abs(x)))
    if name == "mish":  # x tanh(softplus(x))
        return x * np.tanh(np.log1p(np.exp(-np.abs(x))) + np.maximum(x, zero))
    if name == "sparse_plus":  # 0 for x <= -1, (x + 1)^2 / 4 for -1 < x < 1, x for x >= 1
        return np.where(x <= -one, zero, np.where(x < one, np.float32(0.25) * (x + one) ** 2, x))
    if name == "sparse_sigmoid":  # clip((x + 1) / 2, 0, 1)
        return np.clip(np.float32(0.5) * (x + one), zero, one)
    if name == "squareplus":  # (x + sqrt(x^2 + b)) / 2, in float64 (no cancellation for x << 0)
        x64 = x.astype(np.float64)
        return (0.5 * (x64 + np.sqrt(x64 * x64 + alpha))).astype(np.float32)
    if name == "sparsemax":
        return _sparsemax(x, -1)
    raise UnsupportedError(f"activation {name!r} is not supported; expected one of {ACTIVATIONS}")


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _sparsemax(x, axis):
    """Euclidean projection onto the simplex along ``axis``: max(x - tau, 0), tau the threshold
    making the outputs sum to 1 (Martins & Astudillo, 2016)."""
    xm = np.moveaxis(x, axis, -1)
    z = -np.sort(-xm, axis=-1)
    cumsum = np.cumsum(z, axis=-1, dtype=np.float64)
    k = np.arange(1, z.shape[-1] + 1, dtype=np.float64)
    support = z > (cumsum - 1) / k
    size = np.maximum(np.sum(support, axis=-1, keepdims=True), 1)
    tau = (np.take_along_axis(cumsum, size - 1, axis=-1) - 1) / size
    return np.moveaxis(np.maximum(xm - tau, 0).astype(np.float32), -1, axis)


def _log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
