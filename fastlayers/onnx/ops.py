"""ONNX operators on numpy and the fastlayers backend: ``OPS[op_type](inputs, attrs, opset)``.

Each function takes the node's input arrays (None for an omitted optional input), its attributes
as Python values and the model's opset for the default domain, and returns the list of outputs.
Semantics follow https://onnx.ai/onnx/operators/ for opsets 9 to current; where an input moved
from an attribute to an input across opsets (axes, pads, split, min/max, ...) both are read.
"""

from __future__ import annotations

import contextvars
import math

import numpy as np

from .. import settings
from ..backends import get_ops
from ..backends.accumulate import wide_mean, wide_sum
from ..backends.activations import erfc64
from ..backends.derived import derived, derived_from, derived_generation, fold_projection
from ..backends.reference import fold_batch_norm
from ..errors import InputError, ShapeError, UnsupportedError
from ..geometry import dilated_size, padded_span, same_pads, transposed_out, window_out
from ..native.layout import channels_first, channels_last

#: ONNX operator name -> implementation; control.py, indexing.py and quant.py add theirs when
#: imported (onnx/model.py imports them)
OPS: dict = {}


#: The most bytes one tensor may take where the graph's values, not the size of the inputs,
#: set its size: ConstantOfShape, Expand, Tile, Range, Resize, Upsample, Pad, ConvTranspose,
#: and convolutions and pooling padded beyond their window, is ``onnx_max_created_bytes`` of
#: the options in force (``settings.current()``: the model's, else the process's). Over it, a
#: call raises ``SizeLimitError`` (an ``InputError``) naming the node.
#: The limit in force where it is not ``onnx_max_created_bytes``: constant folding at load sets what
#: is left of its budget (``fold.fold_constants``).
CREATE_LIMIT: contextvars.ContextVar = contextvars.ContextVar("onnx_create_limit", default=None)


class SizeLimitError(InputError):
    """A tensor over ``onnx_max_created_bytes`` (or over what constant folding has left)."""


def created(shape, dtype, what: str):
    """Check a tensor of ``shape`` and ``dtype`` before it is made (``onnx_max_created_bytes``);
    returns the shape as a tuple of ints."""
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        if d < 0:
            raise ShapeError(f"{what}: negative dimension in shape {shape[:8]}")
        count *= d
    check_created(shape, count * np.dtype(dtype).itemsize, what)
    return shape


def check_created(shape, nbytes: int, what: str):
    """``created``'s limit check for a tensor of ``shape`` taking ``nbytes``: what a node bound
    on a shape (``bound.py``) checks on every call, the limit depending on the context."""
    limit = CREATE_LIMIT.get()
    limit = settings.current().onnx_max_created_bytes if limit is None else limit
    if nbytes > limit:
        raise SizeLimitError(f"{what}: a tensor of shape {shape[:8]}{'...' if len(shape) > 8 else ''} "
                             f"would take {nbytes} bytes, over the limit of {limit} "
                             "(FASTLAYERS_ONNX_MAX_CREATED_BYTES)")

# ONNX TensorProto element types -> numpy dtypes
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
          7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def op(*names):
    def register(fn):
        for name in names:
            OPS[name] = fn
        return fn
    return register


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _ints(x):
    """The values of an integer tensor (or a sequence) as a list of Python ints."""
    x = np.asarray(x)
    return x.reshape(-1).tolist() if x.dtype.kind in "iu" else [int(v) for v in x.reshape(-1)]


def _axes(inputs, attrs, index, name="axes"):
    """An axes list given as an attribute (old opsets) or as input ``index`` (new opsets)."""
    if len(inputs) > index and inputs[index] is not None:
        return _ints(inputs[index])
    value = attrs.get(name)
    return None if value is None else [int(v) for v in value]


# ------------------------------------------------------------------------- elementwise, math
def _binary(fn):
    def run(inputs, attrs, opset):
        a, b = inputs
        return [fn(a, b)]
    return run


#: Elements below which numpy's elementwise arithmetic costs less than a native call's checks.
NATIVE_ELEMENTWISE_MIN = 4096


def _native_add_mul(a, b, multiply: bool):
    """a + b (a b) in one native pass, threaded, or None where numpy is to compute it: a
    float32 per-channel vector ((1, C, 1, 1) or (C, 1, 1)) and an NCHW view of NHWC memory, the
    result in that memory (a squeeze-and-excite Mul between convolutions keeps their layout;
    numpy broadcasts the vector over strided memory at half the speed or less). numpy's own
    sum of two operands of one memory order runs at memory speed already."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != np.float32 \
            or b.dtype != np.float32:
        return None
    if b.size > a.size:
        a, b = b, a
    if a.size < NATIVE_ELEMENTWISE_MIN:
        return None
    ops = get_ops()
    if a.ndim == 4 and b.shape in ((1, a.shape[1], 1, 1), (a.shape[1], 1, 1)):
        held = _channels_last_memory(a)
        if held is None:
            return None
        v = np.ascontiguousarray(b.reshape(-1))
        y = ops.batch_norm(held, v, np.zeros_like(v)) if multiply else ops.merge(held, v, "add")
        return y.transpose(0, 3, 1, 2)
    return None


@op("Add")
def _add(inputs, attrs, opset):
    a, b = inputs
    y = _native_add_mul(a, b, False)
    return [np.add(a, b) if y is None else y]


@op("Mul")
def _mul(inputs, attrs, opset):
    a, b = inputs
    y = _native_add_mul(a, b, True)
    return [np.multiply(a, b) if y is None else y]


for _name, _fn in {"Sub": np.subtract, "Pow": np.power,
                   "Equal": np.equal, "Less": np.less, "Greater": np.greater,
                   "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
                   "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}.items():
    OPS[_name] = _binary(_fn)


@op("FusedAdd")
def _fused_add(inputs, attrs, opset):
    """f(a + b) (``fusion.fuse_add_activation``): one native pass where both operands are float32
    of one shape held in the same layout (NHWC memory behind NCHW views included), else numpy's
    broadcasting sum and the activation."""
    a, b = inputs
    name, alpha = attrs["activation"], attrs.get("alpha", 0.0)
    if type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype == np.float32 \
            and a.shape == b.shape:
        (xa, back_a), (xb, back_b) = _stored(a), _stored(b)
        if back_a == back_b:
            y = get_ops().add_act(xa, xb, name, alpha)
            return [y if back_a is None else y.transpose(back_a)]
    outer = _outer_operands(a, b)
    if outer is not None:
        a_ic, b_jc, shape = outer
        return [get_ops().outer_add_act(a_ic, b_jc, name, alpha).reshape(shape)]
    return [get_ops().activation(_f32(np.add(a, b)), name, alpha)]   # as the activation op casts


def _outer_operands(a, b):
    """(a as (I, C), b as (J, C), the sum's shape) where float32 a + b is an outer sum of rows:
    one operand varies only over the leading axes and the other only over the next ones, both
    over the whole last axis (additive attention's q (.., I, 1, C) + k (.., 1, J, C)); operands
    swapped where b leads (the sum is the same bits). None for other operands."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != np.float32 \
            or b.dtype != np.float32 or a.ndim != b.ndim or a.ndim < 2 or a.shape[-1] != b.shape[-1]:
        return None
    for lead, rest in ((a, b), (b, a)):
        sl, sr = lead.shape[:-1], rest.shape[:-1]
        split = len(sl)
        while split and sl[split - 1] == 1:
            split -= 1
        if all(d == 1 for d in sr[:split]) and split < len(sl) and lead.size > lead.shape[-1] \
                and rest.size > rest.shape[-1]:
            shape = sl[:split] + sr[split:] + lead.shape[-1:]
            return (np.ascontiguousarray(lead).reshape(-1, lead.shape[-1]),
                    np.ascontiguousarray(rest).reshape(-1, rest.shape[-1]), shape)
    return None


@op("Div")
def _div(inputs, attrs, opset):
    a, b = inputs
    if np.issubdtype(np.result_type(a, b), np.integer):
        return [np.trunc(np.divide(a, b)).astype(np.result_type(a, b))]
    return [np.divide(a, b)]


@op("Mod")
def _mod(inputs, attrs, opset):
    a, b = inputs
    return [np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)]


def _unary(fn):
    def run(inputs, attrs, opset):
        return [fn(inputs[0])]
    return run


for _name, _fn in {"Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
                   "Reciprocal": np.reciprocal, "Floor": np.floor, "Ceil": np.ceil, "Not": np.logical_not,
                   "Sign": np.sign, "Round": np.round, "Sin": np.sin, "Cos": np.cos, "IsNaN": np.isnan,
                   "Identity": lambda x: x, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos,
                   "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh,
                   "Acosh": np.arccosh, "Atanh": np.arctanh, "BitwiseNot": np.invert}.items():
    OPS[_name] = _unary(_fn)
for _name, _fn in {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or,
                   "BitwiseXor": np.bitwise_xor}.items():
    OPS[_name] = _binary(_fn)


@op("BitShift")
def _bit_shift(inputs, attrs, opset):
    """x << y or x >> y (unsigned types)."""
    x, y = inputs
    shift = np.left_shift if attrs["direction"] == "LEFT" else np.right_shift
    return [shift(x, y.astype(x.dtype)).astype(x.dtype)]


@op("IsInf")
def _is_inf(inputs, attrs, opset):
    x = inputs[0]
    return [(np.isposinf(x) & bool(attrs.get("detect_positive", 1)))
            | (np.isneginf(x) & bool(attrs.get("detect_negative", 1)))]


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


OPS["Sum"] = _variadic(np.add)
OPS["Max"] = _variadic(np.maximum)
OPS["Min"] = _variadic(np.minimum)


@op("Mean")
def _mean(inputs, attrs, opset):
    return [_variadic(np.add)(inputs, attrs, opset)[0] / np.float32(len(inputs))]


@op("Where")
def _where(inputs, attrs, opset):
    c, a, b = inputs
    return [np.where(c, a, b)]


@op("Clip")
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
        x, back = _stored(_f32(inputs[0]))
        y = get_ops().activation(x, name, alpha)
        return [y if back is None else y.transpose(back)]
    return run


OPS["Relu"] = _activation("relu")
# Sigmoid, Swish and Tanh in onnxruntime's arithmetic (``onnx_sigmoid``, ``onnx_tanh``): a quantized graph's
# DynamicQuantizeLinear after them then rounds as onnxruntime's does
OPS["Sigmoid"] = _activation("onnx_sigmoid")
OPS["Tanh"] = _activation("onnx_tanh")
OPS["Softsign"] = _activation("softsign")
OPS["LeakyRelu"] = _activation("leaky_relu", "alpha", 0.01)
_silu = _activation("onnx_silu")   # Swish with alpha 1


@op("Elu")
def _elu(inputs, attrs, opset):
    return [get_ops().activation(_f32(inputs[0]), "elu", attrs.get("alpha", 1.0))]


@op("Selu")
def _selu(inputs, attrs, opset):
    alpha, gamma = attrs.get("alpha", 1.67326319217681884765625), attrs.get("gamma", 1.05070102214813232421875)
    x = _f32(inputs[0])
    return [np.where(x > 0, np.float32(gamma) * x, np.float32(gamma * alpha) * np.expm1(np.minimum(x, 0)))
            .astype(np.float32)]


@op("Softplus")
def _softplus(inputs, attrs, opset):
    return [get_ops().activation(_f32(inputs[0]), "softplus")]


_hard_sigmoid_sixth = _activation("hard_sigmoid")   # relu6(x + 3) / 6


@op("HardSigmoid")
def _hard_sigmoid(inputs, attrs, opset):
    alpha, beta = np.float32(attrs.get("alpha", 0.2)), np.float32(attrs.get("beta", 0.5))
    if alpha == np.float32(1 / 6) and beta == np.float32(0.5):   # torch's Hardsigmoid: native
        return _hard_sigmoid_sixth(inputs, attrs, opset)
    return [np.clip(alpha * _f32(inputs[0]) + beta, np.float32(0), np.float32(1))]


# x max(0, min(1, x / 6 + 1/2)) as x relu6(x + 3) / 6, natively (within an ulp of the quotient)
OPS["HardSwish"] = _activation("hard_silu")


@op("Celu")
def _celu(inputs, attrs, opset):
    """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    x, alpha = _f32(inputs[0]), np.float32(attrs.get("alpha", 1.0))
    return [(np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))).astype(np.float32)]


@op("Swish")
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


@op("ThresholdedRelu")
def _thresholded_relu(inputs, attrs, opset):
    """x where x > alpha, else 0."""
    x = inputs[0]
    return [np.where(x > np.asarray(attrs.get("alpha", 1.0), x.dtype), x, 0).astype(x.dtype)]


@op("Shrink")
def _shrink(inputs, attrs, opset):
    """x + bias where x < -lambd, x - bias where x > lambd, else 0."""
    x = inputs[0]
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    y = np.where(x < -lambd, x + np.asarray(bias, x.dtype),
                 np.where(x > lambd, x - np.asarray(bias, x.dtype), 0))
    return [y.astype(x.dtype)]


@op("PRelu")
def _prelu(inputs, attrs, opset):
    x, slope = inputs
    return [np.where(x >= 0, x, x * slope).astype(np.float32)]


@op("Gelu")
def _gelu(inputs, attrs, opset):
    approx = attrs.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return [get_ops().activation(_f32(inputs[0]), "gelu_tanh" if approx == "tanh" else "gelu")]


def _softmax_like(kind):
    def run(inputs, attrs, opset):
        x = _f32(inputs[0])
        ops = get_ops()
        if opset >= 13:
            axis = attrs.get("axis", -1)
            return [getattr(ops, kind)(x, axis)]
        axis = attrs.get("axis", 1) % max(x.ndim, 1)  # opsets < 13: coerce to 2-D at axis
        flat = x.reshape(math.prod(x.shape[:axis]), -1)
        return [getattr(ops, kind)(flat, -1).reshape(x.shape)]
    return run


OPS["Softmax"] = _softmax_like("softmax")
OPS["LogSoftmax"] = _softmax_like("log_softmax")


# --------------------------------------------------------------------------- linear algebra
@op("MatMul")
def _matmul(inputs, attrs, opset):
    return [get_ops().matmul(inputs[0], inputs[1])]


@op("Gemm")
def _gemm(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = a.T
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    y = get_ops().matmul(a, b, trans_b=bool(attrs.get("transB", 0)))
    if alpha != 1.0:
        y *= np.float32(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else np.float32(beta) * c)
    return [y]


@op("FusedDense")
def _fused_dense(inputs, attrs, opset):
    """fastlayers' own fused node: activation(x @ w + b) through the backend's dense primitive."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    return [get_ops().dense(_f32(x), w, b, attrs.get("activation", "linear"), attrs.get("alpha", 0.0))]


# ---------------------------------------------------------------------------- normalization
@op("BatchNormalization")
def _batch_norm(inputs, attrs, opset):
    if attrs.get("training_mode", 0):
        raise UnsupportedError("BatchNormalization with training_mode=1 (batch statistics) is not supported")
    x, scale, bias, mean, var = inputs[:5]
    s, t = fold_batch_norm(mean, var, scale, bias, attrs.get("epsilon", 1e-5))
    return [get_ops().batch_norm(_f32(x), s, t, axis=1)]


@op("InstanceNormalization")
def _instance_norm(inputs, attrs, opset):
    x, scale, bias = inputs
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = get_ops().layer_norm(_f32(x), None, None, attrs.get("epsilon", 1e-5), axes)
    return [y * scale.reshape(shape) + bias.reshape(shape)]


@op("LayerNormalization")
def _layer_norm(inputs, attrs, opset):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    eps = attrs.get("epsilon", 1e-5)
    y = get_ops().layer_norm(_f32(x), scale, bias, eps, axes, rms=attrs.get("_rms", False))
    if not attrs.get("_stats", True):
        return [y]
    # optional outputs 1 and 2: the mean and the inverse standard deviation (kept dims)
    mean = wide_mean(_f32(x), axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(wide_mean(np.square(x - mean), axes, keepdims=True) + np.float32(eps))
    return [y, mean, inv_std.astype(np.float32)]


@op("LpNormalization")
def _lp_norm(inputs, attrs, opset):
    x = inputs[0]
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    norm = wide_sum(np.abs(x) ** p, axis, keepdims=True) ** (1.0 / p)
    return [np.divide(x, norm, out=np.zeros_like(x), where=norm != 0).astype(x.dtype)]


@op("GroupNormalization")
def _group_norm(inputs, attrs, opset):
    """(x - mean) / sqrt(var + eps) over each group of C / G channels (and the spatial axes),
    times scale plus bias per channel (opset 21) or per group (opset 18)."""
    x, scale, bias = inputs
    groups = attrs["num_groups"]
    n, c = x.shape[:2]
    if c % groups:
        raise ShapeError(f"GroupNormalization: {groups} groups for {c} channels")
    if scale.shape != (c if opset >= 21 else groups,) or bias.shape != scale.shape:
        raise ShapeError(f"GroupNormalization: scale {scale.shape} and bias {bias.shape} for "
                         f"{c} channels in {groups} groups")
    grouped = _f32(x).reshape(n, groups, -1)
    y = get_ops().layer_norm(np.ascontiguousarray(grouped), None, None, attrs.get("epsilon", 1e-5), (2,))
    shape = (1, c) + (1,) * (x.ndim - 2)
    if opset < 21:
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    return [(y.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


@op("RMSNormalization")
def _rms_norm(inputs, attrs, opset):
    """x / sqrt(mean(x^2 over the axes from ``axis`` on) + eps) * scale."""
    x, scale = inputs
    axis = attrs.get("axis", -1) % max(x.ndim, 1)
    xf = x.astype(np.float32) if x.dtype != np.float64 else x
    ms = wide_mean(np.square(xf), tuple(range(axis, x.ndim)), keepdims=True)
    return [(xf / np.sqrt(ms + np.float32(attrs.get("epsilon", 1e-5))) * scale).astype(x.dtype)]


@op("MeanVarianceNormalization")
def _mean_variance_norm(inputs, attrs, opset):
    """(x - mean) / sqrt(var + 1e-9) over ``axes`` (default 0, 2, 3)."""
    x = inputs[0]
    axes = tuple(attrs.get("axes", (0, 2, 3)))
    mean = wide_mean(x, axes, keepdims=True)
    var = wide_mean(np.square(x - mean), axes, keepdims=True)
    return [((x - mean) / np.sqrt(var + np.asarray(1e-9, x.dtype))).astype(x.dtype)]


# ----------------------------------------------------------------------------------- reduce
def reduce_axes(inputs, attrs, opset, axes_input_from, ndim):
    """The axes a Reduce* node reduces on an input of rank ``ndim`` (a tuple: its attribute
    before opset ``axes_input_from``, its second input from then on, all axes where empty), or
    None where it passes its input through (no axes and ``noop_with_empty_axes``)."""
    axes = _axes(inputs, attrs, 1) if opset >= axes_input_from else _axes([], attrs, 1)
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else tuple(range(ndim))
    return tuple(axes)


def _reduce(fn, axes_input_from):
    """A Reduce* operator computing ``fn(x, axis, keepdims)``; ``run.reducer`` keeps ``(fn,
    axes_input_from)`` for the form bound on constant axes (``bound.py``)."""
    def run(inputs, attrs, opset):
        x = inputs[0]
        axes = reduce_axes(inputs, attrs, opset, axes_input_from, x.ndim)
        return [x if axes is None else fn(x, axis=axes, keepdims=bool(attrs.get("keepdims", 1)))]
    run.reducer = (fn, axes_input_from)
    return run


def _reduce_mean(x, axis, keepdims):
    """ReduceMean: over H and W of NHWC memory (an NCHW view, as convolutions return: the
    squeeze-and-excite means of PP-OCR's backbones) the backend's global average pool, which
    reads the memory as it lies; else ``wide_mean``."""
    if x.dtype == np.float32 and x.ndim == 4 and axis is not None \
            and sorted(a % 4 for a in np.atleast_1d(axis)) == [2, 3]:
        held = _channels_last_memory(x)
        if held is not None and held.size:
            y = get_ops().global_pool(held, "avg", (1, 2), keepdims=True).transpose(0, 3, 1, 2)
            return y if keepdims else y.reshape(y.shape[:2])
    return wide_mean(x, axis=axis, keepdims=keepdims)


OPS["ReduceMean"] = _reduce(_reduce_mean, 18)
OPS["ReduceSum"] = _reduce(wide_sum, 13)
OPS["ReduceMax"] = _reduce(lambda x, axis, keepdims: np.max(
    x, axis=axis, keepdims=keepdims, initial=-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    if x.dtype.kind in "iu" else False), 18)
OPS["ReduceMin"] = _reduce(lambda x, axis, keepdims: np.min(
    x, axis=axis, keepdims=keepdims, initial=np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max
    if x.dtype.kind in "iu" else True), 18)
OPS["ReduceProd"] = _reduce(np.prod, 18)
OPS["ReduceL2"] = _reduce(lambda x, axis, keepdims: np.sqrt(wide_sum(np.square(x), axis, keepdims)), 18)
OPS["ReduceSumSquare"] = _reduce(lambda x, axis, keepdims: wide_sum(np.square(x), axis, keepdims), 18)
OPS["ReduceL1"] = _reduce(lambda x, axis, keepdims: wide_sum(np.abs(x), axis, keepdims), 18)
OPS["ReduceLogSum"] = _reduce(lambda x, axis, keepdims: np.log(wide_sum(x, axis, keepdims)), 18)


def _log_sum_exp(x, axis, keepdims):
    """log(sum(exp(x))) as m + log(sum(exp(x - m))), m the finite maximum (0 where none is)."""
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    y = np.log(wide_sum(np.exp(x - m), axis, keepdims=True)) + m
    return (y if keepdims else np.squeeze(y, axis=axis)).astype(x.dtype)


OPS["ReduceLogSumExp"] = _reduce(_log_sum_exp, 18)


def _arg(fn):
    def run(inputs, attrs, opset):
        x = inputs[0]
        axis = attrs.get("axis", 0)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        out = out.astype(np.int64)
        return [np.expand_dims(out, axis) if attrs.get("keepdims", 1) else out]
    return run


OPS["ArgMax"] = _arg(np.argmax)
OPS["ArgMin"] = _arg(np.argmin)


def _global_pool(kind):
    """GlobalAveragePool / GlobalMaxPool: the mean or max over the spatial axes, keeping them as
    1s; an NCHW view of NHWC memory is pooled in that memory by the backend."""
    def run(inputs, attrs, opset):
        x = inputs[0]
        held = _channels_last_memory(x) if x.dtype == np.float32 and x.ndim == 4 else None
        if held is not None and held.size:
            return [get_ops().global_pool(held, kind, (1, 2), keepdims=True).transpose(0, 3, 1, 2)]
        axes = tuple(range(2, x.ndim))
        return [wide_mean(x, axes, keepdims=True) if kind == "avg" else np.max(x, axis=axes, keepdims=True)]
    return run


OPS["GlobalAveragePool"] = _global_pool("avg")
OPS["GlobalMaxPool"] = _global_pool("max")


# ---------------------------------------------------------------------------- shape, layout
@op("Reshape")
def _reshape(inputs, attrs, opset):
    x, shape = inputs[0], _ints(inputs[1]) if len(inputs) > 1 else list(attrs["shape"])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@op("Flatten")
def _flatten(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@op("Transpose")
def _transpose(inputs, attrs, opset):
    perm = attrs.get("perm")
    return [np.transpose(inputs[0], perm)]


@op("Squeeze")
def _squeeze(inputs, attrs, opset):
    x = inputs[0]
    axes = _axes(inputs, attrs, 1)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


@op("Unsqueeze")
def _unsqueeze(inputs, attrs, opset):
    x = inputs[0]
    axes = _axes(inputs, attrs, 1)
    rank = x.ndim + len(axes)
    new = {a % rank for a in axes}
    if len(new) != len(axes) or any(not -rank <= a < rank for a in axes):
        raise ShapeError(f"Unsqueeze: axes {axes} for an output of rank {rank}")
    dims = iter(x.shape)
    return [x.reshape([1 if k in new else next(dims) for k in range(rank)])]


@op("Concat")
def _concat(inputs, attrs, opset):
    parts = [x for x in inputs if x is not None]
    axis = attrs["axis"]
    if len(parts) > 1 and all(x.ndim == 4 and x.dtype == np.float32 for x in parts):
        held = [_channels_last_memory(x) for x in parts]
        if all(h is not None for h in held):
            # convolution outputs (NCHW views of NHWC memory): joined in that memory (channels
            # are its rows' last axis), so that the next convolution moves nothing
            nhwc_axis = (0, 3, 1, 2)[axis % 4] if -4 <= axis < 4 else axis
            return [get_ops().concatenate(held, nhwc_axis).transpose(0, 3, 1, 2)]
        if any(h is not None for h in held):
            shape = list(parts[0].shape)
            shape[axis] = sum(x.shape[axis] for x in parts)
            out = np.empty((shape[0], shape[2], shape[3], shape[1]), np.float32).transpose(0, 3, 1, 2)
            np.concatenate(parts, axis=axis, out=out)
            return [out]
    return [get_ops().concatenate(parts, axis)]


@op("Split")
def _split(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 0)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"Split: axis {axis} for an input of shape {x.shape}")
    dim = x.shape[axis]
    sizes = _axes(inputs, attrs, 1, name="split")
    n = attrs.get("num_outputs") or attrs.get("_num_outputs", 1)
    if sizes is None:
        size = -(-dim // max(n, 1))
        sizes = [max(0, min(size, dim - i * size)) for i in range(n)]
    if len(sizes) != n or any(v < 0 for v in sizes) or sum(sizes) != dim:
        raise ShapeError(f"Split: sizes {sizes[:8]} for {n} outputs do not split an axis of {dim}")
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@op("Slice")
def _slice(inputs, attrs, opset):
    x = inputs[0]
    if opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
        steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    return [x[slice_index(x.shape, starts, ends, axes, steps)]]


def slice_index(shape, starts, ends, axes, steps) -> tuple:
    """The numpy index of Slice on an input of ``shape``."""
    index = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % len(shape)] = slice(s, None if (st < 0 and e < -shape[a]) else e, st)
    return tuple(index)


@op("Gather")
def _gather(inputs, attrs, opset):
    x, idx = inputs
    axis = attrs.get("axis", 0) % max(x.ndim, 1)
    if idx.ndim == 0 and x.ndim > 0:               # one index: a view (q, k, v out of a packed qkv)
        i = int(idx)
        if not -x.shape[axis] <= i < x.shape[axis]:
            raise IndexError(f"Gather index {i} is out of bounds for axis {axis} with size {x.shape[axis]}")
        return [x[(slice(None),) * axis + (i,)]]
    return [np.take(x, idx.astype(np.int64), axis=axis)]


@op("GatherElements")
def _gather_elements(inputs, attrs, opset):
    x, idx = inputs
    return [np.take_along_axis(x, idx.astype(np.int64) % x.shape[attrs.get("axis", 0)], axis=attrs.get("axis", 0))]


@op("Shape")
def _shape(inputs, attrs, opset):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    return [shape[attrs.get("start", 0):attrs.get("end", None)]]


@op("Size")
def _size(inputs, attrs, opset):
    return [np.array(inputs[0].size, dtype=np.int64)]


@op("Cast")
def _cast(inputs, attrs, opset):
    to = attrs["to"]
    if to not in DTYPES:
        raise UnsupportedError(f"Cast to ONNX type {to} is not supported")
    return [inputs[0].astype(DTYPES[to])]


@op("CastLike")
def _cast_like(inputs, attrs, opset):
    return [inputs[0].astype(inputs[1].dtype)]


@op("Constant")
def _constant(inputs, attrs, opset):
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            value = attrs[key]
            if key in ("value_float", "value_floats"):
                return [np.asarray(value, np.float32)]
            if key in ("value_int", "value_ints"):
                return [np.asarray(value, np.int64)]
            return [value]
    raise UnsupportedError(f"Constant with attributes {sorted(attrs)} is not supported")


@op("ConstantOfShape")
def _constant_of_shape(inputs, attrs, opset):
    value = attrs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    shape = created(_ints(inputs[0]), value.dtype, "ConstantOfShape")
    return [np.full(shape, value.reshape(-1)[0], dtype=value.dtype)]


@op("Range")
def _range(inputs, attrs, opset):
    start, limit, delta = (np.asarray(v).reshape(()) for v in inputs)
    dtype = np.result_type(start, limit, delta)
    if delta == 0:
        raise InputError("Range: delta is 0")
    span = (float(limit) - float(start)) / float(delta)
    if span != span:
        raise InputError("Range: start, limit or delta is NaN")
    created([0 if span <= 0 else int(np.ceil(span)) if span < 2 ** 62 else 2 ** 62], dtype, "Range")
    return [np.arange(start, limit, delta, dtype=dtype)]


@op("Expand")
def _expand(inputs, attrs, opset):
    x, shape = inputs
    target = _ints(shape)
    if any(d < 0 for d in target):
        raise ShapeError(f"Expand: negative dimension in shape {target[:8]}")
    out = broadcast_shape(x.shape, target, "Expand")
    created(out, x.dtype, "Expand")
    return [np.array(np.broadcast_to(x, out))]


def broadcast_shape(a, b, what):
    """The shape that shapes ``a`` and ``b`` broadcast to (numpy's rules; ``np.broadcast_shapes``
    costs a few microseconds on small shapes); a ``ShapeError`` naming ``what`` where they
    do not."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1:
            raise ShapeError(f"{what}: shapes {a} and {b} do not broadcast")
        out.append(q if p == 1 else p)
    return tuple(out)


@op("Tile")
def _tile(inputs, attrs, opset):
    x, repeats = inputs[0], _ints(inputs[1])
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise ShapeError(f"Tile: repeats {repeats[:8]} for an input of rank {x.ndim} (one "
                         "non-negative count per axis)")
    created([d * r for d, r in zip(x.shape, repeats)], x.dtype, "Tile")
    return [np.tile(x, repeats)]


@op("Trilu")
def _trilu(inputs, attrs, opset):
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


@op("Dropout")
def _dropout(inputs, attrs, opset):
    x = inputs[0]
    return [x, np.ones(x.shape, dtype=np.bool_)]


@op("Pad")
def _pad(inputs, attrs, opset):
    x = inputs[0]
    return [pad_plan(x.shape, x.dtype, inputs, attrs, opset)(x)]


def pad_plan(x_shape, dtype, inputs, attrs, opset):
    """A function ``x -> Pad's output`` for inputs of ``x_shape`` and ``dtype``, the node's pads
    read and checked here: negative pads crop; constant mode fills, the other modes gather
    each padded axis through one index array (reflect: mirrored without the edge, edge: the
    edge repeated, wrap: the other end's). Each call checks the output against the size limit
    (``check_created``)."""
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ndim = len(x_shape)
    if opset < 11:
        pads, value = list(attrs["pads"]), attrs.get("value", 0.0)
        axes = list(range(ndim))
    else:
        pads = _ints(inputs[1])
        value = np.asarray(inputs[2]).reshape(()) if len(inputs) > 2 and inputs[2] is not None and np.asarray(inputs[2]).size else 0
        axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(ndim))
    n = len(axes)
    if len(pads) != 2 * n:
        raise ShapeError(f"Pad: {len(pads)} pads for {n} axes (expected {2 * n})")
    width = [(0, 0)] * ndim
    for i, a in enumerate(axes):
        width[a % ndim] = (pads[i], pads[i + n])
    crop = None
    if any(p < 0 for pair in width for p in pair):  # negative pads crop
        crop = tuple(slice(-b if b < 0 else 0, x_shape[k] + e if e < 0 else None)
                     for k, (b, e) in enumerate(width))
        x_shape = tuple(len(range(*c.indices(d))) for c, d in zip(crop, x_shape))
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    out_shape = created([d + b + e for d, (b, e) in zip(x_shape, width)], dtype, "Pad")
    nbytes = int(np.prod(out_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if mode in ("reflect", "wrap") and any(
            max(b, e) > (d - 1 if mode == "reflect" else d) for d, (b, e) in zip(x_shape, width) if b or e):
        raise ShapeError(f"Pad: {mode} pads {width} are larger than the axes {x_shape} they mirror")
    if mode == "constant":
        inner = tuple(slice(b, b + d) for d, (b, _) in zip(x_shape, width))

        def run(x):
            check_created(out_shape, nbytes, "Pad")
            out = np.full(out_shape, value, x.dtype)
            out[inner] = x if crop is None else x[crop]
            return out
        return run
    if mode not in ("reflect", "edge", "wrap"):
        raise UnsupportedError(f"Pad mode {mode!r} is not supported")
    takes = [(axis, _pad_index(d, b, e, mode)) for axis, (d, (b, e)) in enumerate(zip(x_shape, width))
             if b or e]

    def run(x):
        check_created(out_shape, nbytes, "Pad")
        if crop is not None:
            x = x[crop]
        for axis, index in takes:
            x = np.take(x, index, axis=axis)
        return x
    return run


def _pad_index(d, before, after, mode):
    """The positions along an axis of length ``d`` that Pad's output reads in ``mode``, with
    ``before`` and ``after`` values added: mirrored without the edge (reflect), the edge
    repeated (edge), or the other end's (wrap)."""
    if mode == "reflect":
        head, tail = np.arange(before, 0, -1), np.arange(d - 2, d - 2 - after, -1)
    elif mode == "wrap":
        head, tail = np.arange(d - before, d), np.arange(after)
    else:
        head, tail = np.zeros(before, np.intp), np.full(after, d - 1)
    return np.concatenate([head, np.arange(d), tail]).astype(np.intp)


# ------------------------------------------------------------------------- recurrent (RNN/GRU/LSTM)
def _rnn_activation(name, alpha, beta):
    """An ONNX recurrent activation function by name (with its optional alpha/beta)."""
    name = name.lower()
    table = {
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "affine": lambda x: alpha * x + beta,
        "elu": lambda x: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0))),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0, x),
    }
    if name not in table:
        raise UnsupportedError(f"recurrent activation {name!r} is not supported")
    return table[name]


def _recurrent(kind, inputs, attrs):
    """The ONNX RNN/GRU/LSTM recurrences (https://onnx.ai/onnx/operators/onnx__LSTM.html), every
    attribute: direction, layout, activations (+ alpha/beta), clip, sequence_lens, initial states,
    peepholes (LSTM), input_forget (LSTM), linear_before_reset (GRU). Computed in float64."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    x, w, r = inputs[0], inputs[1], inputs[2]
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    b, seq_lens, h0 = get(3), get(4), get(5)
    c0, p = (get(6), get(7)) if kind == "LSTM" else (None, None)
    layout = attrs.get("layout", 0)
    if layout:
        x = np.swapaxes(x, 0, 1)
        h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
    steps, batch, _ = x.shape
    hidden = attrs.get("hidden_size") or r.shape[-1]
    direction = attrs.get("direction", "forward")
    n_dir = 2 if direction == "bidirectional" else 1
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    names = list(attrs.get("activations", [])) or defaults * n_dir
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    acts = [_rnn_activation(n, alphas[i] if i < len(alphas) else 0.01 if n.lower() == "leakyrelu" else 1.0,
                            betas[i] if i < len(betas) else 0.0) for i, n in enumerate(names)]
    clip = attrs.get("clip")
    lens = np.full(batch, steps, np.int64) if seq_lens is None else seq_lens.astype(np.int64)
    x64 = x.astype(np.float64)
    ys = np.zeros((steps, n_dir, batch, hidden))
    h_last = np.zeros((n_dir, batch, hidden))
    c_last = np.zeros((n_dir, batch, hidden))
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        f = acts[d * len(defaults):(d + 1) * len(defaults)]
        wd, rd = w[d].astype(np.float64), r[d].astype(np.float64)
        wb = b[d, :gates * hidden].astype(np.float64) if b is not None else np.zeros(gates * hidden)
        rb = b[d, gates * hidden:].astype(np.float64) if b is not None else np.zeros(gates * hidden)
        h = np.zeros((batch, hidden)) if h0 is None else h0[d].astype(np.float64)
        c = np.zeros((batch, hidden)) if c0 is None else c0[d].astype(np.float64)
        pd = p[d].astype(np.float64) if p is not None else np.zeros(3 * hidden)
        for t in range(steps):
            for n in range(batch):
                if t >= lens[n]:
                    continue
                step = lens[n] - 1 - t if reverse else t
                xt, hp = x64[step, n], h[n]
                zx = wd @ xt + wb
                if kind == "RNN":
                    z = zx + rd @ hp + rb
                    if clip is not None:
                        z = np.clip(z, -clip, clip)
                    h[n] = f[0](z)
                elif kind == "GRU":
                    zr = zx[:2 * hidden] + rd[:2 * hidden] @ hp + rb[:2 * hidden]
                    if clip is not None:
                        zr = np.clip(zr, -clip, clip)
                    zt, rt = f[0](zr[:hidden]), f[0](zr[hidden:])
                    if attrs.get("linear_before_reset", 0):
                        hh = zx[2 * hidden:] + rt * (rd[2 * hidden:] @ hp + rb[2 * hidden:])
                    else:
                        hh = zx[2 * hidden:] + rd[2 * hidden:] @ (rt * hp) + rb[2 * hidden:]
                    if clip is not None:
                        hh = np.clip(hh, -clip, clip)
                    h[n] = (1 - zt) * f[1](hh) + zt * hp
                else:
                    z = zx + rd @ hp + rb
                    zi, zo, zf, zc = (z[k * hidden:(k + 1) * hidden] for k in range(4))
                    zi = zi + pd[:hidden] * c[n]
                    zf = zf + pd[2 * hidden:] * c[n]
                    if clip is not None:
                        zi, zf, zc = (np.clip(v, -clip, clip) for v in (zi, zf, zc))
                    it, ft = f[0](zi), f[0](zf)
                    if attrs.get("input_forget", 0):
                        ft = 1 - it
                    c[n] = ft * c[n] + it * f[1](zc)
                    zo = zo + pd[hidden:2 * hidden] * c[n]
                    if clip is not None:
                        zo = np.clip(zo, -clip, clip)
                    h[n] = f[0](zo) * f[2](c[n])
                ys[step, d, n] = h[n]
        h_last[d], c_last[d] = h, c
    y, yh, yc = ys.astype(np.float32), h_last.astype(np.float32), c_last.astype(np.float32)
    if layout:
        y, yh, yc = y.transpose(2, 0, 1, 3), np.swapaxes(yh, 0, 1), np.swapaxes(yc, 0, 1)
    return [y, yh, yc] if kind == "LSTM" else [y, yh]


_DEFAULT_ACTIVATIONS = {"RNN": [["tanh"], ["relu"]], "GRU": [["sigmoid", "tanh"]],
                        "LSTM": [["sigmoid", "tanh", "tanh"]]}


def _recurrent_fast(kind, inputs, attrs, table=None):
    """The ONNX recurrence on the backend's compiled time loops (one input-projection GEMM, one
    recurrent product and one fused gate pass per step), when the node uses only what they do:
    no clip, peepholes, input_forget or sequence_lens, standard activations. Else None.
    Gate blocks are reordered once per weight array: ONNX LSTM i,o,f,c -> i,f,c,o; GRU z,r,h as
    is. With an embedding ``table`` (``EmbeddingLSTM`` ...), inputs[0] holds ids (batch, time)
    of its rows whatever the layout, and each direction gathers rows of table @ W^T + input
    bias (computed once). Where nothing reads Y (``_y_read`` False, set at load) the loops
    write no output per step and Y is None."""
    planned = _recurrent_calls(kind, inputs, attrs, table)
    if planned is None:
        return None
    calls, _, _ = planned
    return _recurrent_outputs(kind, get_ops().recurrent_sequences(calls), attrs)


def _recurrent_calls(kind, inputs, attrs, table=None):
    """``_recurrent_fast``'s backend calls, one (method name, args, kwargs) per direction, the
    input as the calls read it (batch, time, input) and the initial states per direction; None
    where the compiled loops do not cover the node."""
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    x, w, r, b, seq_lens, h0 = inputs[0], inputs[1], inputs[2], get(3), get(4), get(5)
    c0, p = (get(6), get(7)) if kind == "LSTM" else (None, None)
    direction = attrs.get("direction", "forward")
    n_dir = 2 if direction == "bidirectional" else 1
    names = [n.lower() for n in attrs.get("activations", [])]
    per_dir = len(_DEFAULT_ACTIVATIONS[kind][0])
    if names and (names[:per_dir] not in _DEFAULT_ACTIVATIONS[kind] or names[per_dir:] not in ([], names[:per_dir])):
        return None
    if attrs.get("clip") is not None or attrs.get("input_forget", 0) or (p is not None and np.any(p)) \
            or attrs.get("activation_alpha") or attrs.get("activation_beta"):
        return None
    layout = attrs.get("layout", 0)
    if table is None:
        x_bti = np.ascontiguousarray(x if layout else np.swapaxes(x, 0, 1), dtype=np.float32)
    else:
        x_bti = x
    batch, steps = x_bti.shape[:2]
    if seq_lens is not None and np.any(seq_lens != steps):
        return None
    hidden = r.shape[-1]
    if layout:
        h0, c0 = (None if s is None else np.swapaxes(s, 0, 1) for s in (h0, c0))

    def kernel(m, d, kind, reorder=lambda a: a):
        """Direction d of W or R as C-ordered (input, gates * hidden), computed once per weight
        array (C order: the backend caches its own layouts per array and would otherwise copy
        and repack a transposed view on every call)."""
        return derived(m, f"onnx-{kind}-kernel:{d}",
                       lambda a: np.ascontiguousarray(reorder(a[d]).T, dtype=np.float32))

    def input_weights(d, reorder, bias):
        """(w_ig, b_ig) of direction d: the kernel and bias, or the folded embedding table."""
        w_in = kernel(w, d, kind.lower(), reorder)
        if table is None:
            return w_in, bias
        return derived_from((w, table, b), f"onnx-{kind}-fold:{d}",
                            lambda *_: fold_projection(table, w_in, bias)), None

    def biases(d, input_part):
        """(input bias, recurrent bias) of direction d from B = [Wb, Rb], computed once per
        array by ``input_part(wb, rb)`` (the recurrent one: Rb, for GRU's linear_before_reset
        only); (None, None) without B."""
        if b is None:
            return None, None
        return derived(b, f"onnx-{kind}-bias:{d}:{lbr}", lambda a: (
            _f32(input_part(a[d, :a.shape[1] // 2], a[d, a.shape[1] // 2:])),
            _f32(a[d, a.shape[1] // 2:]) if lbr else None))

    lbr = kind == "GRU" and bool(attrs.get("linear_before_reset", 0))
    y_read = attrs.get("_y_read", True)
    calls, states = [], []         # (ops method, args, kwargs) and initial states per direction
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        options = {"reverse": reverse, "return_sequences": y_read}
        h_init = np.zeros((batch, hidden), np.float32) if h0 is None else _f32(h0[d])
        if kind == "LSTM":
            order = [0, 2, 3, 1]
            blocks = lambda m: m.reshape(4, hidden, -1)[order].reshape(4 * hidden, -1)  # noqa: E731
            c_init = np.zeros((batch, hidden), np.float32) if c0 is None else _f32(c0[d])
            b_in = biases(d, lambda wb, rb: (wb + rb).reshape(4, hidden)[order].reshape(-1))[0]
            w_ig, b_g = input_weights(d, blocks, b_in)
            calls.append(("lstm_sequence", (x_bti, w_ig, kernel(r, d, "lstm", blocks), b_g,
                                            h_init, c_init), options))
            states.append((h_init, c_init))
        elif kind == "GRU":
            b_in, b_rec = biases(d, lambda wb, rb: wb if lbr else wb + rb)
            w_ig, b_ig = input_weights(d, lambda m: m, b_in)
            calls.append(("gru_sequence", (x_bti, w_ig, kernel(r, d, "gru"), b_ig, b_rec, h_init),
                          {"reset_after": lbr, **options}))
            states.append((h_init,))
        else:
            act = names[0] if names else "tanh"
            w_ih, b_ih = input_weights(d, lambda m: m, biases(d, lambda wb, rb: wb + rb)[0])
            calls.append(("rnn_sequence", (x_bti, w_ih, kernel(r, d, "rnn"), b_ih, h_init),
                          {"activation": act, **options}))
            states.append((h_init,))
    return calls, x_bti, states


def _recurrent_outputs(kind, results, attrs):
    """The node's outputs (Y or None, Y_h, Y_c for LSTM) from the backend calls' results, one
    (y, h[, c]) per direction."""
    layout, y_read = attrs.get("layout", 0), attrs.get("_y_read", True)
    n_dir = len(results)
    ys, hs, cs = [], [], []
    for y, h, *c in results:
        ys.append(y)
        hs.append(h)
        cs.extend(c)
    # one direction: Y as a view of the batch-major output, which a following recurrent node
    # (Squeeze, then its swap back to batch-major) reads in place; two: stacked (B, 2, T, H)
    if not y_read:
        y = None
    else:
        y = ys[0][:, None] if n_dir == 1 else np.stack(ys, axis=1)
        y = y.transpose(0, 2, 1, 3) if layout else y.transpose(2, 1, 0, 3)
    axis = 1 if layout else 0
    if n_dir == 1:   # a view with the direction axis (np.stack costs several microseconds)
        index = (slice(None), None) if layout else (None,)
        return [y, hs[0][index], cs[0][index]] if kind == "LSTM" else [y, hs[0][index]]
    outs = [y, np.stack(hs, axis=axis)]
    if kind == "LSTM":
        outs.append(np.stack(cs, axis=axis))
    return outs


def _check_recurrent(kind, x_shape, inputs, attrs):
    """The shapes of a recurrent node's inputs, checked before the time loops read them:
    ``x_shape`` is X's, (time, batch, input) or with layout=1 (batch, time, input)."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    n_dir = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    r = inputs[2]
    if len(x_shape) != 3:
        raise ShapeError(f"{kind}: X of shape {tuple(x_shape)} is not (time, batch, input)")
    if r.ndim != 3 or r.shape[0] != n_dir or r.shape[2] == 0 or r.shape[1] != gates * r.shape[2]:
        raise ShapeError(f"{kind}: R of shape {r.shape} is not ({n_dir}, {gates} * hidden, hidden)")
    hidden = r.shape[2]
    if attrs.get("hidden_size") not in (None, hidden):
        raise ShapeError(f"{kind}: hidden_size {attrs['hidden_size']} does not match R of shape {r.shape}")
    batch = x_shape[0] if layout else x_shape[1]
    state = (batch, n_dir, hidden) if layout else (n_dir, batch, hidden)
    want = {1: (n_dir, gates * hidden, x_shape[2]), 3: (n_dir, 2 * gates * hidden), 4: (batch,),
            5: state, 6: state, 7: (n_dir, 3 * hidden)}
    names = {1: "W", 3: "B", 4: "sequence_lens", 5: "initial_h", 6: "initial_c", 7: "P"}
    for i in (1, 3, 4, 5) + ((6, 7) if kind == "LSTM" else ()):
        a = inputs[i] if len(inputs) > i else None
        if a is not None and (a.size or i == 1) and a.shape != want[i]:
            raise ShapeError(f"{kind}: {names[i]} of shape {a.shape}, expected {want[i]}")


#: Most bound calls a recurrent node keeps (one per input shape and weights).
_MAX_BOUND_RECURRENT = 8


def _bound_key(kind, inputs, ops):
    """What a bound recurrent call depends on: X's shape and type, the weights' identities
    (W, R, B, P: the plan's constants), the states' shapes, the backend and the derived
    weights' generation; None where the node does not bind (sequence_lens given)."""
    if len(inputs) > 4 and inputs[4] is not None and inputs[4].size:
        return None
    x, padded = inputs[0], (*inputs, None, None, None, None, None)
    return (x.shape, x.dtype.str, id(inputs[1]), id(inputs[2]), id(padded[3]), id(padded[7]),
            None if padded[5] is None else padded[5].shape,
            None if padded[6] is None else padded[6].shape, ops.name, derived_generation())


def _bind_recurrent(kind, inputs, attrs, ops):
    """A function ``inputs -> outputs`` for calls like this one (``_bound_key``): the backend's
    sequence plans (``ops.sequence_plan``, ``sequences_plan`` for two directions), bound once
    on the weights, run with each call's input and initial states. None where the compiled
    loops do not cover the node."""
    planned = _recurrent_calls(kind, inputs, attrs)
    if planned is None:
        return None
    calls, x_bti, _ = planned
    bound = [(name, args[1:], kw) for name, args, kw in calls]
    if len(bound) == 1:
        name, args, kw = bound[0]
        plan = ops.sequence_plan(name, x_bti, args, kw)
        run_all = lambda x, states: [plan(x, states[0])]  # noqa: E731
    else:
        run_all = ops.sequences_plan(x_bti, bound)
    layout, n_dir = attrs.get("layout", 0), len(calls)
    gates = 2 if kind == "LSTM" else 1
    if n_dir == 1 and not attrs.get("_y_read", True):
        return _one_direction_states_only(kind, plan, layout, gates)

    def run(inputs):
        x = inputs[0]
        x_bti = np.ascontiguousarray(x if layout else np.swapaxes(x, 0, 1), dtype=np.float32)
        given = [inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size
                 else None for i in (5, 6)[:gates]]
        given = [s if s is None or not layout else np.swapaxes(s, 0, 1) for s in given]
        shape = (x_bti.shape[0], inputs[2].shape[-1])
        states = [tuple(np.zeros(shape, np.float32) if s is None else _f32(s[d]) for s in given)
                  for d in range(n_dir)]
        return _recurrent_outputs(kind, run_all(x_bti, states), attrs)
    return run


def _one_direction_states_only(kind, plan, layout, gates):
    """``_bind_recurrent``'s function for one direction whose Y nothing reads (a streaming
    model's step: its outputs are the final states): the same steps as the general one, with
    nothing per call but the input's batch-major view, the states given (``plan`` copies
    them: the loop updates its states) and the outputs' direction axis."""
    index = (slice(None), None) if layout else (None,)

    def run(inputs):
        x = inputs[0] if layout else inputs[0].swapaxes(0, 1)
        if not (x.dtype == np.float32 and x.flags.c_contiguous):
            x = np.ascontiguousarray(x, dtype=np.float32)
        states = []
        for i in (5, 6)[:gates]:
            s = inputs[i] if len(inputs) > i else None
            if s is None or not s.size:
                states.append(np.zeros((x.shape[0], inputs[2].shape[-1]), np.float32))
            else:
                states.append(s[:, 0] if layout else s[0])
        _, *finals = plan(x, states)
        return [None, *(f[index] for f in finals)]
    return run


def _recurrent_op(kind):
    def run(inputs, attrs, opset):
        cache = attrs.get("_bound")   # per plan (OnnxModel): bound calls by _bound_key
        if cache is not None:
            ops = get_ops()
            key = _bound_key(kind, inputs, ops)
            hit = cache.get(key) if key is not None else None
            if hit is not None:
                return hit[0](inputs)
        _check_recurrent(kind, inputs[0].shape, inputs, attrs)
        if cache is not None and key is not None:
            bound = _bind_recurrent(kind, inputs, attrs, ops)
            if bound is None:        # the compiled loops do not cover the node
                return _recurrent(kind, inputs, attrs)
            if len(cache) >= _MAX_BOUND_RECURRENT:
                cache.clear()
            # the key holds the weights' ids: the entry holds the arrays, so that no other
            # array takes their ids while it lives
            cache[key] = (bound, tuple(inputs[i] for i in (1, 2, 3, 7) if len(inputs) > i))
            return bound(inputs)
        fast = _recurrent_fast(kind, inputs, attrs)
        return fast if fast is not None else _recurrent(kind, inputs, attrs)
    return run


def _embedding_recurrent_op(kind):
    """``Embedding<kind>`` (``onnx.fuse_embedding_recurrent``): inputs [table, ids, W, R, ...],
    the recurrence run on rows of the table looked up by ids (time-major ids when the attribute
    ``_ids_time_major`` is set), folded into the input projection where the fast path runs."""
    def run(inputs, attrs, opset):
        table, ids, rest = inputs[0], inputs[1], inputs[2:]
        time_major = attrs["_ids_time_major"]   # the recurrences read no other extra key but _y_read
        if ids.ndim == 2:
            x_shape = ids.shape + table.shape[1:]
            if time_major != (attrs.get("layout", 0) == 0):
                x_shape = (x_shape[1], x_shape[0], x_shape[2])
            _check_recurrent(kind, x_shape, [None, *rest], attrs)
        if ids.ndim == 2 and ids.size:
            vocab = table.shape[0]
            if ids.min() < -vocab or ids.max() >= vocab:     # as Gather: negatives count back
                raise IndexError(f"Gather index out of bounds for a table of {vocab} rows "
                                 f"(indices in [{ids.min()}, {ids.max()}])")
            ids_bt = (ids.T if time_major else ids).astype(np.int64) % vocab
            fast = _recurrent_fast(kind, [ids_bt, *rest], attrs, table)
            if fast is not None:
                return fast
        x = np.take(table, ids.astype(np.int64), axis=0)
        if time_major != (attrs.get("layout", 0) == 0):
            x = np.swapaxes(x, 0, 1)
        return OPS[kind]([x, *rest], attrs, opset)
    return run


for _kind in ("RNN", "GRU", "LSTM"):
    OPS[_kind] = _recurrent_op(_kind)
    OPS[f"Embedding{_kind}"] = _embedding_recurrent_op(_kind)


# --------------------------------------------------------------------- convolution and pooling
# ONNX tensors are NCHW; the backend's convolution primitives run NHWC/HWIO. A convolution or
# pooling op returns its NHWC result as an NCHW *view* (no copy), so the next one finds its input
# already NHWC in memory and moves nothing; numpy's elementwise ops keep that memory order (an
# Add of two such views is one), activations run on the stored order (``_stored``), and any other
# op sees a correct NCHW array (strided). The model's outputs are made C-contiguous at the end.
# 1-D ops run as 2-D with height 1.
def _nhwc(x):
    """(N, C, L) or (N, C, H, W) -> NHWC (a copy unless ``x`` is a view of NHWC memory) and
    whether the input was 1-D."""
    if x.ndim not in (3, 4):
        raise UnsupportedError(f"only 1-D and 2-D convolution and pooling are supported, got input of rank {x.ndim}")
    return _to_nhwc(x, x.ndim == 3), x.ndim == 3


def _planes(x):
    """``x`` (N, C, L) or (N, C, H, W) as C-contiguous float32 NCHW planes (N, C, H, W) when it
    is not a view of NHWC memory (``_nchw``), else None: an NCHW activation runs the NCHW
    kernels, where the layout round trip to NHWC and back cost more than the pooling or
    depthwise convolution it served (docs/design.md)."""
    if x.ndim not in (3, 4) or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    return x[:, :, None, :] if x.ndim == 3 else x


def _nchw(y, one_d):
    """The NCHW (or NCL) view of an NHWC result (no copy)."""
    return y[:, 0].transpose(0, 2, 1) if one_d else y.transpose(0, 3, 1, 2)


def _channels_last_memory(x):
    """The C-contiguous NHWC / NLC array whose NCHW / NCL view ``x`` is (``_nchw``), else None."""
    if x.flags.c_contiguous or x.ndim not in (3, 4):
        return None
    held = x.transpose(0, 2, 3, 1) if x.ndim == 4 else x.transpose(0, 2, 1)
    return held if held.flags.c_contiguous else None


def contiguous(x):
    """``x`` C-contiguous: itself, or a copy; an NCHW / NCL view of NHWC / NLC memory
    (``_nchw``) is moved back by the native threaded transpose (numpy's strided copy runs at
    about a fifth of its speed)."""
    if x.flags.c_contiguous:
        return x
    held = _channels_last_memory(x)
    return x.copy() if held is None else channels_first(held)


def _stored(x):
    """(``x`` as the C-contiguous array its memory holds, the axes that view it back as ``x``):
    an NCHW / NCL view of NHWC / NLC memory (``_nchw``) gives that memory, any other
    non-contiguous ``x`` a contiguous copy (and None)."""
    held = _channels_last_memory(x)
    if held is None:
        return np.ascontiguousarray(x), None
    return held, (0, 3, 1, 2) if x.ndim == 4 else (0, 2, 1)


def _spatial(attrs, key, n, default):
    v = attrs.get(key)
    v = [default] * n if v is None or len(v) == 0 else list(v)
    if len(v) != n:
        raise ShapeError(f"attribute {key!r} has {len(v)} values for an input with {n} spatial axes")
    return v if n == 2 else [default if key != "kernel_shape" else 1] + v


def conv_pads(attrs, in_hw, kernel, strides, dilations):
    """((top, bottom), (left, right)) from ``pads`` or ``auto_pad`` (SAME_UPPER puts the extra
    cell at the end, SAME_LOWER at the start)."""
    auto = attrs.get("auto_pad", "NOTSET")
    n = len(in_hw)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return tuple(same_pads(size, k, s, d, lower=auto == "SAME_LOWER")
                     for size, k, s, d in zip(in_hw, kernel, strides, dilations))
    if auto == "VALID":
        return ((0, 0),) * n
    p = list(attrs.get("pads") or [0] * (2 * n))
    if len(p) != 2 * n:
        raise ShapeError(f"attribute 'pads' has {len(p)} values for an input with {n} spatial axes")
    return tuple((p[i], p[i + n]) for i in range(n))


def _pads_2d(attrs, x_shape, kernel, strides, dilations, one_d):
    pads = conv_pads(attrs, x_shape[2:], kernel[-len(x_shape[2:]):], strides[-len(x_shape[2:]):],
                     dilations[-len(x_shape[2:]):])
    return ((0, 0),) + pads if one_d else pads


def _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil=False):
    """The output (height, width) of a window op, checked positive, and whether the padding is
    wider than the dilated window (only then may the graph's values, not the input, make the
    output large)."""
    out_hw = []
    for size, k, s, d, (a, z) in zip(in_hw, kernel, strides, dilations, pads):
        if padded_span(size, k, d, (a, z)) < 0:
            raise ShapeError(f"{what}: input of spatial size {tuple(in_hw)} (padded by {tuple(pads)}) "
                             f"is smaller than the dilated window {tuple(kernel)} (dilations "
                             f"{tuple(dilations)})")
        out_hw.append(window_out(size, k, s, d, (a, z), ceil))
    return out_hw, any(max(a, z) >= dilated_size(k, d) for k, d, (a, z) in zip(kernel, dilations, pads))


def _padded_output(what, n_c, in_hw, kernel, strides, dilations, pads, ceil=False):
    """The output (height, width) of a window op (``_output_hw``), within ``onnx_max_created_bytes``
    (as float32, with ``n_c`` = batch x channels) where the padding is wider than the window."""
    out_hw, wide = _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil)
    if wide:
        created([n_c, *out_hw], np.float32, what)
    return out_hw


#: Per operator, the caches a model gives each of its nodes (OnnxModel: empty dicts added to a
#: copy of the node's attributes, one per plan): "_windows", input shape and kernel ->
#: ``_window``'s geometry, so that a call on a shape seen before skips the arithmetic (the size
#: limit, which depends on the context, is checked on every call); "_plans", a convolution's
#: bound kernel per input shape; "_bound", a recurrence's bound calls (``_bound_key``, and
#: ``cells._bound_step`` for a fused LSTM step).
NODE_CACHES = {"Conv": ("_windows",), "FusedConv": ("_windows", "_plans"),
               "MaxPool": ("_windows",), "AveragePool": ("_windows",),
               "LSTM": ("_bound",), "GRU": ("_bound",), "RNN": ("_bound",),
               "FusedLSTMCell": ("_bound",)}


def _window(what, attrs, x_shape, kernel, one_d, ceil=False):
    """(strides, pads, dilations, out_hw, wide) of a 2-D window op (``kernel``: (kh, kw); 1-D
    ops as 2-D with height 1) over an NCHW / NCL input of ``x_shape``; see ``_output_hw``."""
    cache = attrs.get("_windows")
    hit = None if cache is None else cache.get((x_shape, kernel))
    if hit is not None:
        return hit
    n = len(x_shape) - 2
    strides, dilations = _spatial(attrs, "strides", n, 1), _spatial(attrs, "dilations", n, 1)
    pads = _pads_2d(attrs, x_shape, kernel, strides, dilations, one_d)
    in_hw = (1, x_shape[2]) if one_d else x_shape[2:]
    out_hw, wide = _output_hw(what, in_hw, kernel, strides, dilations, pads, ceil)
    geometry = (tuple(strides), pads, tuple(dilations), tuple(out_hw), wide)
    if cache is not None:
        if len(cache) >= 64:   # bound the memory of many distinct shapes
            cache.clear()
        cache[x_shape, kernel] = geometry
    return geometry


def _to_nhwc(x, one_d):
    """``_nhwc`` for an input of checked rank: its NHWC memory where it is a view of it, the
    same memory reshaped where it has one channel or one position, else a native transpose;
    1-D inputs get height 1."""
    if x.dtype == np.float32:
        held = _channels_last_memory(x)
        if held is not None:
            return held[:, None] if one_d else held
        if x.flags.c_contiguous and (x.shape[1] == 1 or x[0, 0].size == 1):
            return x.reshape((x.shape[0], 1) + x.shape[2:] + x.shape[1:2]) if one_d else \
                x.reshape(x.shape[:1] + x.shape[2:] + x.shape[1:2])
    y = channels_last(np.ascontiguousarray(x, dtype=np.float32))
    return y[:, None] if one_d else y


def _laid_out_as(x, one_d, run_nhwc):
    """``run_nhwc`` (NHWC in, NHWC out) as a function of inputs of x's shape, strides and dtype
    (NCHW / NCL in, the NCHW / NCL view of the result out): ``_to_nhwc``'s case for that layout
    chosen once, leaving a view (or a reshape) per call."""
    if x.dtype == np.float32:
        if _channels_last_memory(x) is not None:
            if one_d:
                return lambda x: run_nhwc(x.transpose(0, 2, 1)[:, None])[:, 0].transpose(0, 2, 1)
            return lambda x: run_nhwc(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        if x.flags.c_contiguous and (x.shape[1] == 1 or x[0, 0].size == 1):
            shape = _to_nhwc(x, one_d).shape
            if one_d:
                return lambda x: run_nhwc(x.reshape(shape))[:, 0].transpose(0, 2, 1)
            return lambda x: run_nhwc(x.reshape(shape)).transpose(0, 3, 1, 2)
    return lambda x: _nchw(run_nhwc(_to_nhwc(x, one_d)), one_d)


@op("Conv", "FusedConv")
def _conv(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    plans, ops = attrs.get("_plans"), get_ops()
    if plans is not None:   # FusedConv: its NHWC plan for this input's shape, layout and backend
        key = (x.shape, x.strides, x.dtype.char, id(ops), id(b))
        run = plans.get(key)
        if run is not None:
            return [run(x)]
    if x.ndim not in (3, 4):
        _nhwc(x)   # raises: only 1-D and 2-D
    one_d = x.ndim == 3
    w_hwio = attrs.get("_w_hwio")   # FusedConv: its weights, transposed at load
    w4 = None
    if w_hwio is None:
        if w.ndim != x.ndim:
            raise ShapeError(f"Conv: weight of shape {w.shape} for an input of shape {x.shape} "
                             "(the weight's rank must be the input's)")
        w4 = w[:, :, None, :] if w.ndim == 3 else w
        w_hwio = np.ascontiguousarray(w4.transpose(2, 3, 1, 0), dtype=np.float32)
    elif w_hwio.ndim != 4 or (w_hwio.shape[0] != 1 and one_d):
        raise ShapeError(f"Conv: weight for a {'1' if w_hwio.shape[0] == 1 else '2'}-D "
                         f"convolution, input of shape {x.shape}")
    group = attrs.get("group", 1)
    kh, kw, cin_g, cout = w_hwio.shape
    if group < 1 or x.shape[1] != cin_g * group or cout % group:
        raise ShapeError(f"Conv: input of shape {x.shape} (channels on axis 1) does not fit a weight "
                         f"of {cout} output and {cin_g} input channels per group with group={group}")
    if b is not None and np.shape(b) != (cout,):
        raise ShapeError(f"Conv: bias of shape {np.shape(b)} for {cout} output channels")
    strides, pads, dilations, out_hw, wide = _window("Conv", attrs, x.shape, (kh, kw), one_d)
    if wide:
        created([x.shape[0] * cout, *out_hw], np.float32, "Conv")
    planes = _planes(x) if cin_g == 1 and group > 1 else None
    if planes is not None:
        # depthwise on NCHW planes: w (C m, kh, kw)
        w_ohw = (np.ascontiguousarray(w4[:, 0], dtype=np.float32) if w4 is not None else
                 derived(w_hwio, "onnx-depthwise-ohw",
                         lambda a: np.ascontiguousarray(a[:, :, 0].transpose(2, 0, 1))))
        y = get_ops().depthwise_conv2d_nchw(planes, w_ohw, None if b is None else _f32(b),
                                            strides, pads, dilations,
                                            attrs.get("activation", "linear"),
                                            attrs.get("alpha", 0.0))
        return [y[:, :, 0] if one_d else y]
    x4 = _to_nhwc(x, one_d)
    plan = ops.conv2d_plan(x4.shape, w_hwio, None if b is None else _f32(b), strides, pads,
                           dilations, group, attrs.get("activation", "linear"), attrs.get("alpha", 0.0))
    if plans is not None:
        if len(plans) >= 64:   # bound the memory of many distinct shapes
            plans.clear()
        plans[key] = _laid_out_as(x, one_d, plan)
    return [_nchw(plan(x4), one_d)]


@op("ConvTranspose")
def _conv_transpose(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if x.ndim not in (3, 4):
        _nhwc(x)   # raises: only 1-D and 2-D
    one_d = x.ndim == 3
    if w.ndim != x.ndim:
        raise ShapeError(f"ConvTranspose: weight of shape {w.shape} for an input of shape {x.shape} "
                         "(the weight's rank must be the input's)")
    group = attrs.get("group", 1)
    if group < 1 or w.shape[0] != x.shape[1] or w.shape[0] % group:
        raise ShapeError(f"ConvTranspose: weight of shape {w.shape} with group={group} for an input "
                         f"of shape {x.shape} (expected (C_in, C_out / group, k...), group dividing C_in)")
    if b is not None and np.shape(b) != (w.shape[1] * group,):
        raise ShapeError(f"ConvTranspose: bias of shape {np.shape(b)} for {w.shape[1] * group} "
                         "output channels")
    # (C_in, C_out / g, kh, kw); 1-D: one copy per weight (a view would keep the weight alive
    # in the cache), the array its own derived forms are kept for
    w4 = (derived(w, "onnx-conv-transpose-4d", lambda a: np.array(a[:, :, None, :], copy=True))
          if w.ndim == 3 else w)
    n = x.ndim - 2
    strides, dilations = _spatial(attrs, "strides", n, 1), _spatial(attrs, "dilations", n, 1)
    out_pad = _spatial(attrs, "output_padding", n, 0)
    kernel = list(w4.shape[2:])
    in_hw = [1, x.shape[2]] if one_d else list(x.shape[2:])
    full = [transposed_out(i, k, s, d, (0, 0), op_)
            for i, s, op_, k, d in zip(in_hw, strides, out_pad, kernel, dilations)]
    shape = attrs.get("output_shape")
    auto = attrs.get("auto_pad", "NOTSET")
    if shape:
        shape = ([1] + list(shape)) if one_d else list(shape)[-2:]
        totals = [f - o for f, o in zip(full, shape)]
        pads = [(t - t // 2, t // 2) if auto != "SAME_UPPER" else (t // 2, t - t // 2) for t in totals]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [i * s for i, s in zip(in_hw, strides)]
        totals = [f - o for f, o in zip(full, shape)]
        pads = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2) for t in totals]
    else:
        p = list(attrs.get("pads") or [0] * (2 * n))
        if len(p) != 2 * n:
            raise ShapeError(f"ConvTranspose: {len(p)} pads for {n} spatial axes")
        pads = [(p[i], p[i + n]) for i in range(n)]
        pads = ([(0, 0)] + pads) if one_d else pads
        shape = [f - a - z for f, (a, z) in zip(full, pads)]
    if min(shape) <= 0:
        raise ShapeError(f"ConvTranspose: output size {tuple(shape)} for an input of shape {x.shape}")
    created([x.shape[0], *shape, w4.shape[1] * group], np.float32, "ConvTranspose")
    bias = None if b is None else _f32(b)
    crop = tuple(a for a, _ in pads)
    act, alpha = attrs.get("_activation", "linear"), attrs.get("_alpha", 0.0)   # fuse_conv_transpose
    planes = _planes(x)
    if planes is not None:
        # NCHW planes in and out: no layout round trip
        y = get_ops().conv_transpose2d_nchw(planes, w4, bias, tuple(strides), crop, tuple(shape),
                                            tuple(dilations), group, act, alpha)
        return [y[:, :, 0] if one_d else y]
    x4, _ = _nhwc(x)
    w_hwio = derived(w4, "onnx-conv-transpose-hwio",
                     lambda a: np.array(a.transpose(2, 3, 0, 1), np.float32, order="C"))
    y = get_ops().conv_transpose2d(x4, w_hwio, bias, tuple(strides), crop, tuple(shape),
                                   tuple(dilations), group, act, alpha)
    return [_nchw(y, one_d)]


def _pool(kind):
    def run(inputs, attrs, opset):
        x = inputs[0]
        planes = _planes(x)
        x4, one_d = _nhwc(x) if planes is None else (planes, x.ndim == 3)
        kernel = tuple(attrs["kernel_shape"])
        if len(kernel) != x.ndim - 2:
            raise ShapeError(f"{kind} pooling: kernel_shape {list(kernel)} for an input of shape {x.shape}")
        what = f"{'Max' if kind == 'max' else 'Average'}Pool"
        kernel = (1, *kernel) if one_d else kernel
        strides, pads, dilations, out_hw, wide = _window(what, attrs, x.shape, kernel, one_d,
                                                         bool(attrs.get("ceil_mode", 0)))
        if wide:
            created([x.shape[0] * x.shape[1], *out_hw], np.float32, what)
        if planes is not None:
            y = get_ops().pool2d_nchw(planes, kind, kernel, strides, pads, out_hw, dilations,
                                      bool(attrs.get("count_include_pad", 0)))
            return [y[:, :, 0] if one_d else y]
        y = get_ops().pool2d(x4, kind, kernel, strides, pads, out_hw, dilations,
                             bool(attrs.get("count_include_pad", 0)))
        return [_nchw(y, one_d)]
    return run


OPS["MaxPool"] = _pool("max")
OPS["AveragePool"] = _pool("avg")


@op("LRN")
def _lrn(inputs, attrs, opset):
    x = _f32(inputs[0])
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    if x.ndim < 2:
        raise ShapeError(f"LRN: expected an input (N, C, ...), got shape {x.shape}")
    moved = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    c = moved.shape[-1]
    if size >= 2 * c + 1:
        # every window holds every channel: one sum (the kernels' work grows with the window)
        s = np.sum(np.square(moved.astype(np.float64)), axis=-1, keepdims=True)
        y = (moved / (bias + alpha / size * s) ** beta).astype(np.float32)
    elif size % 2:
        y = get_ops().local_response_norm(moved, size, alpha, beta, bias)
    else:  # ONNX centres even windows one channel later than torch does
        sq = np.pad(np.square(moved.astype(np.float64)), [(0, 0)] * (x.ndim - 1) + [((size - 1) // 2, size // 2)])
        cs = np.concatenate([np.zeros(sq.shape[:-1] + (1,)), np.cumsum(sq, axis=-1)], axis=-1)
        s = cs[..., size:size + c] - cs[..., :c]
        y = (moved / (bias + alpha / size * s) ** beta).astype(np.float32)
    return [np.ascontiguousarray(np.moveaxis(y, -1, 1))]


@op("MaxRoiPool")
def _max_roi_pool(inputs, attrs, opset):
    x, rois = inputs
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 5:
        raise ShapeError(f"MaxRoiPool: expected features (N, C, H, W) and rois (K, 5), got shapes "
                         f"{x.shape} and {rois.shape}")
    x4, _ = _nhwc(x)
    y = get_ops().roi_pool(x4, _f32(rois), tuple(attrs["pooled_shape"]), attrs.get("spatial_scale", 1.0))
    return [np.ascontiguousarray(y.transpose(0, 3, 1, 2))]


def _source_coords(out_size, in_size, scale, mode, roi=(0.0, 1.0)):
    """The input coordinate of each output index for a coordinate_transformation_mode, in
    float32 arithmetic and with the integer output length, as onnxruntime computes them (a
    float64 coordinate such as 3 / 0.6 = 4.9999... floors to another row than its 5.0)."""
    f = np.float32
    i = np.arange(out_size, dtype=f)
    scale, length, original = f(scale), f(out_size), f(in_size)
    if mode == "half_pixel":
        return (i + f(0.5)) / scale - f(0.5)
    if mode == "pytorch_half_pixel":
        return (i + f(0.5)) / scale - f(0.5) if out_size > 1 else np.zeros(out_size, f)
    if mode == "align_corners":
        return i * (original - f(1)) / (length - f(1)) if out_size > 1 else np.zeros(out_size, f)
    if mode == "asymmetric":
        return i / scale
    if mode == "half_pixel_symmetric":
        adjustment = length / (scale * original)
        offset = original / f(2) * (f(1) - adjustment)
        # onnxruntime adds the half pixels in double precision here
        return (np.float64(offset) + (i.astype(np.float64) + 0.5) / np.float64(scale) - 0.5).astype(f)
    if mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_size > 1:
            return start * (original - f(1)) + i * (end - start) * (original - f(1)) / (length - f(1))
        return np.full(out_size, f(0.5) * (start + end) * (original - f(1)), f)
    raise UnsupportedError(f"Resize coordinate_transformation_mode {mode!r} is not supported")


def _resize(x, out_shape, scales, attrs, roi):
    """Nearest or linear resize of every axis whose size changes (numpy, separable)."""
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise UnsupportedError(f"Resize mode {mode!r} is not supported (nearest and linear are)")
    if attrs.get("antialias", 0):
        raise UnsupportedError("Resize with antialias=1 is not supported")
    if len(out_shape) != x.ndim:
        raise ShapeError(f"Resize: output shape {tuple(out_shape)[:8]} for an input of rank {x.ndim}")
    created(out_shape, np.float64 if x.dtype.kind == "f" else x.dtype, "Resize")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    changed = [a for a, (i, o) in enumerate(zip(x.shape, out_shape)) if i != o or scales[a] != 1.0]
    if x.dtype == np.float32 and x.ndim == 4 and coord != "tf_crop_and_resize" and set(changed) <= {2, 3}:
        return _resize_spatial(x, out_shape, scales, mode, coord, nearest)
    y = x.astype(np.float64) if x.dtype.kind == "f" else x
    for axis, (size_in, size_out) in enumerate(zip(x.shape, out_shape)):
        if size_in == size_out and scales[axis] == 1.0 and coord != "tf_crop_and_resize":
            continue
        src = _source_coords(size_out, size_in, scales[axis], coord,
                             (roi[axis], roi[axis + x.ndim]) if roi is not None else (0.0, 1.0))
        if mode == "nearest":
            idx = _nearest(src, nearest)
            outside = (idx < 0) | (idx > size_in - 1)
            y = np.take(y, np.clip(idx, 0, size_in - 1).astype(np.int64), axis=axis)
        else:
            outside = (src < 0) | (src > size_in - 1)
            lo, hi, frac = _linear_taps(src, size_in)
            frac = frac.reshape([-1 if a == axis else 1 for a in range(x.ndim)])
            y = np.take(y, lo, axis=axis) * (1 - frac) + np.take(y, hi, axis=axis) * frac
        if coord == "tf_crop_and_resize" and np.any(outside):
            mask = outside.reshape([-1 if a == axis else 1 for a in range(x.ndim)])
            y = np.where(mask, attrs.get("extrapolation_value", 0.0), y)
    return y.astype(x.dtype, copy=False)


def _nearest(src, nearest_mode):
    """The input index (float, unclipped) nearest each source coordinate, ties as the mode says."""
    if nearest_mode == "round_prefer_floor":
        return np.where(src - np.floor(src) == 0.5, np.floor(src), np.round(src))
    if nearest_mode == "round_prefer_ceil":
        return np.where(src - np.floor(src) == 0.5, np.ceil(src), np.round(src))
    return np.floor(src) if nearest_mode == "floor" else np.ceil(src)


def _linear_taps(src, size_in):
    """(lower index, upper index, weight of the upper) of each source coordinate, clamped to
    the input."""
    src_c = np.clip(src, 0, size_in - 1)
    lo = np.floor(src_c).astype(np.int64)
    return lo, np.minimum(lo + 1, size_in - 1), src_c - lo


def _resize_spatial(x, out_shape, scales, mode, coord, nearest):
    """A float32 NCHW resize of H and W only, on channels-last memory: each output pixel's
    source rows and columns found once per axis, the pixels gathered (linear: blended in
    float32) by the backend's ``resize2d_taps``; the result is an NCHW view of NHWC memory as
    the convolutions return, so the next convolution moves nothing."""
    held = _channels_last_memory(x)
    y = held if held is not None else x.transpose(0, 2, 3, 1)
    taps = []
    for axis in (1, 2):   # H, W of the NHWC array
        size_in, size_out = y.shape[axis], out_shape[axis + 1]
        if size_in == size_out and scales[axis + 1] == 1.0:
            same = np.arange(size_in, dtype=np.int64)
            taps.append((same, same, np.zeros(size_in, np.float32)))
            continue
        src = _source_coords(size_out, size_in, scales[axis + 1], coord)
        if mode == "nearest":
            index = np.clip(_nearest(src, nearest), 0, size_in - 1).astype(np.int64)
            taps.append((index, index, np.zeros(size_out, np.float32)))
            continue
        lo, hi, frac = _linear_taps(src, size_in)
        taps.append((lo, hi, frac.astype(np.float32)))
    return get_ops().resize2d_taps(y, taps[0], taps[1], mode != "nearest").transpose(0, 3, 1, 2)


@op("Resize")
def _resize_op(inputs, attrs, opset):
    x = inputs[0]
    roi = inputs[1] if len(inputs) > 1 and inputs[1] is not None and inputs[1].size else None
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else None
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None and inputs[3].size else None
    if opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
        scales, roi = inputs[1], None
        attrs = {**attrs, "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": attrs.get("nearest_mode", "floor") if attrs.get("mode", "nearest") == "nearest" else "floor"}
    axes = attrs.get("axes")
    n = x.ndim
    full_scales = [1.0] * n
    out = list(x.shape)
    if axes is not None:
        axes = [a % n for a in axes]
    else:
        axes = list(range(n))
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) < n:
        r = [0.0] * n + [1.0] * n
        for k, a in enumerate(axes):
            r[a], r[a + n] = roi[k], roi[k + len(axes)]
        roi = r
    if sizes is not None:
        sizes = _ints(sizes)
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [sizes[k] / x.shape[a] for k, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(round(r * x.shape[a])) for a in axes]
            for a in axes:
                full_scales[a] = r
        for k, a in enumerate(axes):
            out[a] = sizes[k]
            if policy == "stretch":
                full_scales[a] = sizes[k] / x.shape[a]
    else:
        scales = [float(s) for s in np.asarray(scales).reshape(-1)]
        for k, a in enumerate(axes):
            full_scales[a] = scales[k]
            out[a] = int(np.floor(x.shape[a] * scales[k]))
    return [_resize(x, out, full_scales, attrs, roi)]


@op("Upsample")
def _upsample(inputs, attrs, opset):
    x = inputs[0]
    scales = [float(s) for s in (np.asarray(inputs[1]).reshape(-1) if len(inputs) > 1 else attrs["scales"])]
    out = [int(np.floor(d * s)) for d, s in zip(x.shape, scales)]
    mode = attrs.get("mode", "nearest")
    return [_resize(x, out, scales, {"mode": mode, "coordinate_transformation_mode": "asymmetric",
                                     "nearest_mode": "floor"}, None)]


# ------------------------------------------------------------ attention (fused at load time)
@op("FusedAttention")
def _fused_attention(inputs, attrs, opset):
    """fastlayers' own node for the exporters' MatMul / Softmax attention (``fuse_attention``):
    inputs Q, K (K^T where ``_k_transposed``), V, the scales of Q, of K and of the scores and
    an additive mask ("" where absent). One call of the backend's attention primitive where
    Q, K and V are float32 heads (rank 3 or 4, the same leading axes) and every scale has one
    element; else the graph's own arithmetic, broadcasting as ONNX does."""
    q, k, v, s_q, s_k, s_scores, mask = (list(inputs) + [None] * 7)[:7]
    k = np.swapaxes(k, -1, -2) if attrs["_k_transposed"] else k
    divide_q, divide_k, divide_scores = attrs["_divide"]
    scales = [(s, d) for s, d in zip((s_q, s_k, s_scores), attrs["_divide"]) if s is not None]
    heads = (all(a.dtype == np.float32 for a in (q, k, v)) and q.ndim == k.ndim == v.ndim
             and q.ndim in (3, 4) and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
             and k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1])
    if heads and all(s.size == 1 for s, _ in scales) and (mask is None or mask.ndim <= q.ndim):
        scale = np.float32(1.0)
        for s, divide in scales:
            value = np.float32(s.reshape(-1)[0])
            scale = scale / value if divide else scale * value
        three_d = q.ndim == 3
        if three_d:
            q, k, v = q[None], k[None], v[None]
        bias = None if mask is None else _f32(mask)
        out, _ = get_ops().attention(q, k, v, float(scale), bias, False, 0,
                                     need_weights=False)
        return [out[0] if three_d else out]
    scores = _scaled(get_ops().matmul(_scaled(q, s_q, divide_q),
                                      _scaled(np.swapaxes(k, -1, -2), s_k, divide_k)),
                     s_scores, divide_scores)
    if mask is not None:
        scores = scores + mask
    return [get_ops().matmul(get_ops().softmax(_f32(scores), -1), v)]


@op("FusedEncoderLayer")
def _fused_encoder_layer(inputs, attrs, opset):
    """fastlayers' own node for a whole Transformer encoder layer (``fuse_encoder_layers``):
    one call of the backend's ``encoder_layer`` on the (batch, length, embed) input, or on the
    (length, batch, embed) one where the graph is sequence first."""
    x = inputs[0]
    w = attrs["weights"]
    e = w.w_qkv_io.shape[0]
    if x.ndim != 3 or x.shape[2] != e:
        raise ShapeError(f"ONNX encoder layer {attrs['name']!r} (FusedEncoderLayer): expected a "
                         f"3-D input of width {e}, got shape {x.shape}")
    x_nle = x if attrs["batch_first"] else x.transpose(1, 0, 2)
    y, _ = get_ops().encoder_layer(_f32(x_nle), w, attrs["num_heads"], attrs["activation"],
                                   attrs["norm_first"], need_weights=False)
    return [y if attrs["batch_first"] else y.transpose(1, 0, 2)]


@op("FusedSelfAttention")
def _fused_self_attention(inputs, attrs, opset):
    """fastlayers' own node for a self-attention block outside an encoder layer (torch's
    ``MultiheadAttention`` on x, x, x; ``fuse_encoder_layers``): one call of the backend's
    ``self_attention`` on the (batch, length, embed) input, or on the (length, batch, embed)
    one where the graph is sequence first."""
    x = inputs[0]
    w_qkv, b_qkv, w_o, b_o = attrs["weights"]
    e = w_qkv.shape[0]
    if x.ndim != 3 or x.shape[2] != e:
        raise ShapeError(f"ONNX attention block {attrs['name']!r} (FusedSelfAttention): expected a "
                         f"3-D input of width {e}, got shape {x.shape}")
    x_nle = x if attrs["batch_first"] else x.transpose(1, 0, 2)
    y, _ = get_ops().self_attention(_f32(x_nle), w_qkv, b_qkv, w_o, b_o, attrs["num_heads"],
                                    need_weights=False)
    return [y if attrs["batch_first"] else y.transpose(1, 0, 2)]


def _scaled(x, s, divide):
    """x / s or x * s as the graph's Div or Mul (broadcasting); x where there is no scale."""
    return x if s is None else (x / s if divide else x * s)


# -------------------------------------------------------------------------- attention (opset 23)
@op("Attention")
def _attention(inputs, attrs, opset):
    """ONNX Attention: softmax(scale Q K^T (+ softcap) + mask (+ causal)) V over batched heads, with
    3-D inputs split into heads, grouped-query K/V repeated, and a past K/V cache prepended.
    A query row with no key left attends to nothing (output 0), as the spec's reference does.
    Without softcap and where nothing reads the scores output (``_qk_read`` False, set at load),
    one call of the backend's attention primitive."""
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    q, k, v = (_f32(a) for a in inputs[:3])
    mask, past_k, past_v = get(3), get(4), get(5)
    if get(6) is not None or attrs.get("left_window_size", -1) not in (-1, None) \
            or attrs.get("right_window_size", -1) not in (-1, None):
        raise UnsupportedError("Attention with nonpad_kv_seqlen or sliding windows is not supported")
    three_d = q.ndim == 3
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(f"Attention: Q, K and V of shapes {q.shape}, {k.shape}, {v.shape} (expected "
                         "three 3-D or three 4-D inputs)")
    if three_d:
        if "q_num_heads" not in attrs:
            raise ShapeError("Attention: 3-D inputs need the attributes q_num_heads and kv_num_heads")
        qh, kvh = attrs["q_num_heads"], attrs["kv_num_heads"]
        split = lambda a, h: a.reshape(a.shape[0], a.shape[1], h, -1).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q, qh), split(k, kvh), split(v, kvh)
    if past_k is not None:
        k, v = np.concatenate([_f32(past_k), k], axis=2), np.concatenate([_f32(past_v), v], axis=2)
    present_k, present_v = k, v
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or v.shape[1] != k.shape[1]:
        raise ShapeError(f"Attention: {q.shape[1]} query heads and {k.shape[1]} / {v.shape[1]} key / "
                         "value heads (the key heads must divide the query heads)")
    if q.shape[1] != k.shape[1]:  # grouped-query attention
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scale = attrs.get("scale") or 1.0 / np.sqrt(q.shape[-1])
    tq, tk = q.shape[2], k.shape[2]
    bias = np.zeros((tq, tk), np.float32)
    if mask is not None:
        if mask.shape[-1] < tk:  # a mask shorter than the keys (past cache) masks the rest
            width = [(0, 0)] * (mask.ndim - 1) + [(0, tk - mask.shape[-1])]
            mask = np.pad(mask, width, constant_values=False if mask.dtype == np.bool_ else -np.inf)
        bias = bias + (np.where(mask, np.float32(0), np.float32(-np.inf)) if mask.dtype == np.bool_
                       else _f32(mask))
    if attrs.get("is_causal", 0):
        offset = 0 if past_k is None else past_k.shape[2]
        allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset
        bias = bias + np.where(allowed, np.float32(0), np.float32(-np.inf))
    softcap = attrs.get("softcap", 0.0) or 0.0
    if not attrs.get("_qk_read", True) and softcap <= 0:   # one call of the backend's primitive
        y, _ = get_ops().attention(q, k, v, float(scale), bias, False, 1, need_weights=False)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], tq, -1)
        return [y, present_k, present_v]
    scores = get_ops().matmul(q, k, trans_b=True) * np.float32(scale)
    if softcap > 0:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    capped = scores
    scores = scores + bias
    w = get_ops().attention_softmax(np.ascontiguousarray(scores, dtype=np.float32), 1.0, None, False, 1)
    y = get_ops().matmul(w, v)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], tq, -1)
    # the optional 4th output, as the spec's reference computes it: the (soft-capped) scores,
    # with the mask added for mode 2, the softmax weights for mode 3
    mode = attrs.get("qk_matmul_output_mode", 0)
    qk = capped + bias if mode == 2 else (w if mode == 3 else capped)
    return [y, present_k, present_v, qk]

