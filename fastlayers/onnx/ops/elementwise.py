"""Elementwise ONNX operators: arithmetic, comparison, logic and bitwise operators, the unary
math functions, Where and Clip, the activations (on the backend's primitives where they are
hot) and Softmax / LogSoftmax.
"""

from __future__ import annotations

import math

import numpy as np

from ...backends import get_ops
from ...backends.activations import erfc64
from ..layout import channels_last_memory, stored
from ..records import AXIS, BOOL, FLT, STRING, A, Family
from ..tensors import backend_plan, f32

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("elementwise")
op = FAMILY.op


def _binary(fn):
    def run(inputs, attrs, opset):
        a, b = inputs
        return [fn(a, b)]

    return run


#: Elements below which numpy's elementwise arithmetic costs less than a native call's checks.
NATIVE_ELEMENTWISE_MIN = 4096


def _native_add_mul(a, b, multiply: bool):
    """a + b (a b) in one native pass, threaded, or None where numpy is to compute it: a
    float32 per-channel vector ((1, C, 1, 1) or (C, 1, 1); for a product also (N, C, 1, 1), a
    vector per sample) and an NCHW view of NHWC memory, the result in that memory (a squeeze-and-excite Mul between convolutions keeps their layout;
    numpy broadcasts the vector over strided memory at half the speed or less). numpy's own
    sum of two operands of one memory order runs at memory speed already."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != np.float32 or b.dtype != np.float32:
        return None
    if b.size > a.size:
        a, b = b, a
    if a.size < NATIVE_ELEMENTWISE_MIN:
        return None
    ops = get_ops()
    if a.ndim == 4 and b.shape in ((1, a.shape[1], 1, 1), (a.shape[1], 1, 1)):
        held = channels_last_memory(a)
        if held is None:
            return None
        v = np.ascontiguousarray(b.reshape(-1))
        y = ops.batch_norm(held, v, np.zeros_like(v)) if multiply else ops.merge(held, v, "add")
        return y.transpose(0, 3, 1, 2)
    if (
        multiply
        and a.ndim == 4
        and b.shape == (a.shape[0], a.shape[1], 1, 1)
        and a.size >= a.shape[0] * NATIVE_ELEMENTWISE_MIN
    ):
        # a gate per sample and channel (squeeze-and-excite over a batch): each sample's NHWC
        # memory times its own vector
        held = channels_last_memory(a)
        if held is None or not held.flags.c_contiguous:
            return None
        v = np.ascontiguousarray(b.reshape(a.shape[0], a.shape[1]))
        zeros = np.zeros(a.shape[1], np.float32)
        y = np.empty(held.shape, np.float32)
        for i in range(a.shape[0]):
            ops.batch_norm(held[i], v[i], zeros, out=y[i])
        return y.transpose(0, 3, 1, 2)
    return None


def _sum_in_layout(a, b, name, alpha):
    """f(a + b) in one native pass on the pool's threads where a and b are float32 arrays of one
    shape held in the same layout (NHWC memory behind NCHW views included), the result in that
    layout; else None."""
    if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype == np.float32 and a.shape == b.shape:
        (xa, back_a), (xb, back_b) = stored(a), stored(b)
        if back_a == back_b:
            y = get_ops().add_act(xa, xb, name, alpha)
            return y if back_a is None else y.transpose(back_a)
    return None


@op("Add", inputs=(2, 2))
def _add(inputs, attrs, opset):
    a, b = inputs
    y = _native_add_mul(a, b, False)
    if y is None and getattr(a, "size", 0) >= NATIVE_ELEMENTWISE_MIN:
        # a residual sum: numpy's runs on one thread (same bits)
        y = _sum_in_layout(a, b, "linear", 0.0)
    return [np.add(a, b) if y is None else y]


@op("Mul", inputs=(2, 2))
def _mul(inputs, attrs, opset):
    a, b = inputs
    y = _native_add_mul(a, b, True)
    return [np.multiply(a, b) if y is None else y]


for _name, _fn in {
    "Sub": np.subtract,
    "Pow": np.power,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}.items():
    FAMILY.add(_name, _binary(_fn), inputs=(2, 2))


@op("FusedElementwise", internal=True, caches=("_plans",))
def _fused_elementwise(inputs, attrs, opset):
    """A chain of elementwise nodes (``fusion.fuse_elementwise``) as one program of the
    backend's (``Ops.elementwise_plan``), made once per backend."""
    return [backend_plan(attrs, lambda ops: ops.elementwise_plan(attrs["program"]))(inputs)]


@op("FusedAdd", internal=True)
def _fused_add(inputs, attrs, opset):
    """f(a + b) (``fusion.fuse_add_activation``): one native pass where both operands are float32
    of one shape held in the same layout (NHWC memory behind NCHW views included), else numpy's
    broadcasting sum and the activation."""
    a, b = inputs
    return [add_activated(a, b, attrs["activation"], attrs.get("alpha", 0.0))]


def add_activated(a, b, name, alpha):
    """f(a + b), f the activation ``name``, as FusedAdd computes it (also the residual Add of a
    convolution whose kernel could not take it in, ``conv._conv``)."""
    y = _sum_in_layout(a, b, name, alpha)
    if y is not None:
        return y
    outer = outer_operands(a, b)
    if outer is not None:
        a_ic, b_jc, shape = outer
        return get_ops().outer_add_act(a_ic, b_jc, name, alpha).reshape(shape)
    return get_ops().activation(f32(np.add(a, b)), name, alpha)  # as the activation op casts


def outer_operands(a, b):
    """(a as (I, C), b as (J, C), the sum's shape) where float32 a + b is an outer sum of rows:
    one operand varies only over the leading axes and the other only over the next ones, both
    over the whole last axis (additive attention's q (.., I, 1, C) + k (.., 1, J, C)); operands
    swapped where b leads (the sum is the same bits). None for other operands."""
    if (
        type(a) is not np.ndarray
        or type(b) is not np.ndarray
        or a.dtype != np.float32
        or b.dtype != np.float32
        or a.ndim != b.ndim
        or a.ndim < 2
        or a.shape[-1] != b.shape[-1]
    ):
        return None
    for lead, rest in ((a, b), (b, a)):
        sl, sr = lead.shape[:-1], rest.shape[:-1]
        split = len(sl)
        while split and sl[split - 1] == 1:
            split -= 1
        if (
            all(d == 1 for d in sr[:split])
            and split < len(sl)
            and lead.size > lead.shape[-1]
            and rest.size > rest.shape[-1]
        ):
            shape = sl[:split] + sr[split:] + lead.shape[-1:]
            return (
                np.ascontiguousarray(lead).reshape(-1, lead.shape[-1]),
                np.ascontiguousarray(rest).reshape(-1, rest.shape[-1]),
                shape,
            )
    return None


@op("Div", inputs=(2, 2))
def _div(inputs, attrs, opset):
    a, b = inputs
    if np.issubdtype(np.result_type(a, b), np.integer):
        return [np.trunc(np.divide(a, b)).astype(np.result_type(a, b))]
    return [np.divide(a, b)]


@op("Mod", inputs=(2, 2), attrs={"fmod": BOOL})
def _mod(inputs, attrs, opset):
    a, b = inputs
    return [np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)]


def _unary(fn):
    def run(inputs, attrs, opset):
        return [fn(inputs[0])]

    return run


for _name, _fn in {
    "Neg": np.negative,
    "Abs": np.abs,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Log": np.log,
    "Reciprocal": np.reciprocal,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Not": np.logical_not,
    "Sign": np.sign,
    "Round": np.round,
    "Sin": np.sin,
    "Cos": np.cos,
    "IsNaN": np.isnan,
    "Identity": lambda x: x,
    "Tan": np.tan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atan": np.arctan,
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Atanh": np.arctanh,
    "BitwiseNot": np.invert,
}.items():
    FAMILY.add(_name, _unary(_fn))
for _name, _fn in {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}.items():
    FAMILY.add(_name, _binary(_fn), inputs=(2, 2))


@op("BitShift", inputs=(2, 2), attrs={"direction": A(STRING, choices=("LEFT", "RIGHT"))}, required=("direction",))
def _bit_shift(inputs, attrs, opset):
    """x << y or x >> y (unsigned types)."""
    x, y = inputs
    shift = np.left_shift if attrs["direction"] == "LEFT" else np.right_shift
    return [shift(x, y.astype(x.dtype)).astype(x.dtype)]


@op("IsInf", attrs={"detect_negative": BOOL, "detect_positive": BOOL})
def _is_inf(inputs, attrs, opset):
    x = inputs[0]
    return [
        (np.isposinf(x) & bool(attrs.get("detect_positive", 1)))
        | (np.isneginf(x) & bool(attrs.get("detect_negative", 1)))
    ]


@op("Erf")
def _erf(inputs, attrs, opset):
    x = inputs[0]
    return [(1.0 - erfc64(x.astype(np.float64))).astype(x.dtype)]


def _variadic(fn):
    def run(inputs, attrs, opset):
        out = inputs[0]
        for x in inputs[1:]:
            out = fn(out, x)
        return [out]

    return run


#: Sum, Max, Min and Mean take one or more inputs, none omitted.
_VARIADIC = {"inputs": (1, None), "optional": None}
FAMILY.add("Sum", _variadic(np.add), **_VARIADIC)
FAMILY.add("Max", _variadic(np.maximum), **_VARIADIC)
FAMILY.add("Min", _variadic(np.minimum), **_VARIADIC)


@op("Mean", **_VARIADIC)
def _mean(inputs, attrs, opset):
    return [_variadic(np.add)(inputs, attrs, opset)[0] / np.float32(len(inputs))]


@op("Where", inputs=(3, 3))
def _where(inputs, attrs, opset):
    c, a, b = inputs
    return [np.where(c, a, b)]


@op("Clip", inputs=(1, 3), attrs={"min": FLT, "max": FLT})
def _clip(inputs, attrs, opset):
    x = inputs[0]
    lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, x.dtype))
    return [x]


# ------------------------------------------------------------------------------ activations
def _activation(name, alpha_attr=None, default=0.0):
    def run(inputs, attrs, opset):
        alpha = attrs.get(alpha_attr, default) if alpha_attr else default
        x, back = stored(f32(inputs[0]))
        y = get_ops().activation(x, name, alpha)
        return [y if back is None else y.transpose(back)]

    return run


FAMILY.add("Relu", _activation("relu"))
# Sigmoid, Swish and Tanh in onnxruntime's arithmetic (``onnx_sigmoid``, ``onnx_tanh``): a quantized graph's
# DynamicQuantizeLinear after them then rounds as onnxruntime's does
FAMILY.add("Sigmoid", _activation("onnx_sigmoid"))
FAMILY.add("Tanh", _activation("onnx_tanh"))
FAMILY.add("Softsign", _activation("softsign"))
FAMILY.add("LeakyRelu", _activation("leaky_relu", "alpha", 0.01), attrs={"alpha": FLT})
_silu = _activation("onnx_silu")  # Swish with alpha 1


@op("Elu", attrs={"alpha": FLT})
def _elu(inputs, attrs, opset):
    return [get_ops().activation(f32(inputs[0]), "elu", attrs.get("alpha", 1.0))]


@op("Selu", attrs={"alpha": FLT, "gamma": FLT})
def _selu(inputs, attrs, opset):
    alpha, gamma = attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)
    x = f32(inputs[0])
    return [
        np.where(x > 0, np.float32(gamma) * x, np.float32(gamma * alpha) * np.expm1(np.minimum(x, 0))).astype(
            np.float32
        )
    ]


@op("Softplus")
def _softplus(inputs, attrs, opset):
    return [get_ops().activation(f32(inputs[0]), "softplus")]


_hard_sigmoid_sixth = _activation("hard_sigmoid")  # relu6(x + 3) / 6


@op("HardSigmoid", attrs={"alpha": FLT, "beta": FLT})
def _hard_sigmoid(inputs, attrs, opset):
    alpha, beta = np.float32(attrs.get("alpha", 0.2)), np.float32(attrs.get("beta", 0.5))
    if alpha == np.float32(1 / 6) and beta == np.float32(0.5):  # torch's Hardsigmoid: native
        return _hard_sigmoid_sixth(inputs, attrs, opset)
    return [np.clip(alpha * f32(inputs[0]) + beta, np.float32(0), np.float32(1))]


# x max(0, min(1, x / 6 + 1/2)) as x relu6(x + 3) / 6, natively (within an ulp of the quotient)
FAMILY.add("HardSwish", _activation("hard_silu"))


@op("Celu", attrs={"alpha": FLT})
def _celu(inputs, attrs, opset):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    x, alpha = f32(inputs[0]), np.float32(attrs.get("alpha", 1.0))
    return [(np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))).astype(np.float32)]


@op("Swish", attrs={"alpha": FLT})
def _swish(inputs, attrs, opset):
    """x sigmoid(alpha x)."""
    x, alpha = inputs[0], attrs.get("alpha", 1.0)
    if alpha == 1.0 and x.dtype == np.float32:
        return _silu(inputs, attrs, opset)
    return [(x / (1 + np.exp(-np.asarray(alpha, x.dtype) * x))).astype(x.dtype)]


@op("Mish")
def _mish(inputs, attrs, opset):
    """x tanh(softplus(x))."""
    x = inputs[0]
    return [(x * np.tanh(np.logaddexp(0, x))).astype(x.dtype)]


@op("ThresholdedRelu", attrs={"alpha": FLT})
def _thresholded_relu(inputs, attrs, opset):
    """x where x > alpha, else 0."""
    x = inputs[0]
    return [np.where(x > np.asarray(attrs.get("alpha", 1.0), x.dtype), x, 0).astype(x.dtype)]


@op("Shrink", attrs={"bias": FLT, "lambd": FLT})
def _shrink(inputs, attrs, opset):
    """x + bias where x < -lambd, x - bias where x > lambd, else 0."""
    x = inputs[0]
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    y = np.where(x < -lambd, x + np.asarray(bias, x.dtype), np.where(x > lambd, x - np.asarray(bias, x.dtype), 0))
    return [y.astype(x.dtype)]


@op("PRelu", inputs=(2, 2))
def _prelu(inputs, attrs, opset):
    x, slope = inputs
    return [np.where(x >= 0, x, x * slope).astype(np.float32)]


@op("Gelu", attrs={"approximate": A(STRING, choices=("none", "tanh"))})
def _gelu(inputs, attrs, opset):
    approx = attrs.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return [get_ops().activation(f32(inputs[0]), "gelu_tanh" if approx == "tanh" else "gelu")]


def softmax_on(x, axis, opset, kind="softmax"):
    """ONNX Softmax (``kind`` "log_softmax": LogSoftmax) of float32 ``x`` along ``axis`` as
    ``opset`` reads it: that one axis from opset 13, before it the 2-D coercion, every axis
    from ``axis`` on as one."""
    ops = get_ops()
    if opset >= 13:
        return getattr(ops, kind)(x, axis)
    axis %= max(x.ndim, 1)
    flat = x.reshape(math.prod(x.shape[:axis]), -1)
    return getattr(ops, kind)(flat, -1).reshape(x.shape)


def _softmax_like(kind):
    def run(inputs, attrs, opset):
        return [softmax_on(f32(inputs[0]), attrs.get("axis", -1 if opset >= 13 else 1), opset, kind)]

    return run


FAMILY.add("Softmax", _softmax_like("softmax"), attrs={"axis": AXIS})
FAMILY.add("LogSoftmax", _softmax_like("log_softmax"), attrs={"axis": AXIS})
