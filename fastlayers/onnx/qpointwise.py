"""The pointwise QOperator-format contrib operators onnxruntime writes when it optimizes a QDQ
file (``com.microsoft``, opset 1): QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu and
QLinearConcat, on uint8 or int8 tensors with per-tensor parameters (float32 scales and zero
points of the tensor's type, each a scalar or a one-value vector; a zero point omitted is 0,
except QLinearConcat's, which are required).

Each follows onnxruntime's CPU kernel bit for bit on x86-64 with AVX2 (onnxruntime 1.32 at one
thread, checked on an AVX-512 host too, whose MLAS dispatch runs the same kernels for these
operators), on every backend. fma(x, r, c) is a fused multiply-add rounded once to float32;
cvt is ``_mm256_cvtps_epi32`` (round half to even; NaN and values beyond int32 give INT32_MIN)
followed by the saturating packs to the 8-bit type:

- QLinearAdd (``QLinearImpl`` -> ``MlasQLinearAdd`` -> ``MlasQLinearAddKernelAvx2Helper`` in
  qladd_avx2.cpp): rA = float32(A_scale / C_scale), rB = float32(B_scale / C_scale),
  F = float32(C_zp - fma(rA, A_zp, float32(rB * B_zp))) (the compiler contracts the C++
  ``ScaleRatio_AC * ZeroPointA + ScaleRatio_BC * ZeroPointB`` into a fused multiply-add, and
  ``VectorFixedPart + b * rB`` for a scalar B), C = cvt(fma(A, rA, fma(B, rB, F))) with A and B
  the raw integers (their zero points are in F). Where onnxruntime's broadcaster finds input A
  broadcast along the innermost axis it walks (``InputBroadcaster::IsInput0Scalar``: A a scalar,
  or A's last non-trivial axis 1 where B's is not), the kernel gets the operands the other way
  round, B as its span and A as its scalar: the same formula with A and B exchanged, which can
  round differently (``_swapped``).
- QLinearMul (``MlasQLinearMul``, qlmul.cpp's SSE2 kernel; no fused multiply-add):
  ratio = float32(float32(A_scale * B_scale) / C_scale),
  C = cvt(float32(float32(float32((A - A_zp) * (B - B_zp)) * ratio) + C_zp)) (the integer product
  is exact).
- QLinearSigmoid and QLinearLeakyRelu (qlinear_activations.cc, ``QlinearBuildLookupTable`` in
  qlinear_lookup_table.cc): a table of the 256 values of the input's type: x dequantized as
  float32(X_scale * (x - X_zp)), mapped by ``MlasComputeLogistic`` (``onnx_sigmoid``, MLAS's
  rational logistic with fused multiply-adds) or by ``v >= 0 ? v : float32(alpha * v)`` (alpha
  default 0.01), then quantized by ``MlasQuantizeLinear`` (its AVX-512F kernel:
  float32(v / Y_scale), clamped to [min - Y_zp, max - Y_zp] with NaN taken as the low bound,
  rounded half to even, plus Y_zp); the input is looked up in it.
- QLinearConcat (qlinear_concat.cc): an input whose scale and zero point equal the output's
  (float ``==``) is copied, the others are mapped through the same table with the identity;
  inputs with no element are skipped, as onnxruntime's ``ConcatBase`` does.

Large QLinearAdd calls look up a 256 x 256 table of the same formula (the result depends only
on the two bytes), built once per parameters.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..backends.activations import onnx_sigmoid
from ..errors import FastlayersError, InputError, ShapeError, UnsupportedError
from .quant import MS, QUANT_RANGES
from .records import AXIS, FLT, Family, fail

#: This family's operator records (``ops.RECORDS`` gathers the families): the QLinear elementwise operators and QLinearConcat.
FAMILY = Family("quantized pointwise")

_F32, _F64 = np.float32, np.float64
_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))
#: Outputs of at least this many values use QLinearAdd's 256 x 256 table (building it costs
#: about what computing as many values directly does).
_TABLE_FROM = 1 << 16


# ---------------------------------------------------------------------------- parameters
def _quantized(x, what, name):
    """A quantized operand, checked to be uint8 or int8."""
    x = np.asarray(x)
    if x.dtype not in _TYPES:
        raise UnsupportedError(f"{what}: {name} of type {x.dtype}; uint8 and int8 are supported")
    return x


def _one_value(p, what, name):
    """onnxruntime's ``IsScalarOr1ElementVector``: a scalar or a vector of one value."""
    if p.ndim > 1 or p.size != 1:
        raise ShapeError(f"{what}: {name} of shape {p.shape}, expected a scalar or a 1-element vector")
    return p.reshape(())


def _scale(p, what, name):
    """A scale, checked (float32, one value), as a numpy float32."""
    p = np.asarray(p)
    if p.dtype != np.float32:
        raise InputError(f"{what}: {name} of type {p.dtype}, expected float32")
    return _F32(_one_value(p, what, name))


def _zero_point(p, dtype, what, name):
    """A zero point, checked (``dtype``, one value; 0 where omitted), as an int."""
    if p is None:
        return 0
    p = np.asarray(p)
    if p.dtype != dtype:
        raise InputError(f"{what}: {name} of type {p.dtype}, expected {dtype} (the quantized tensor's type)")
    return int(_one_value(p, what, name))


def _bits(v) -> int:
    """A float32's bit pattern (a cache key that tells NaNs and signed zeros apart)."""
    return int(np.asarray(v, _F32).view(np.uint32))


# ------------------------------------------------------------------------------ arithmetic
def _fma(x, r, c):
    """float32(x * r + c) rounded once (a fused multiply-add) for float32 ``x`` and ``c``
    (arrays or scalars, broadcast) and a float32 scalar ``r``. x * r is exact in float64 (two
    24-bit significands); the sum is rounded to float64 to odd (its last bit set where it is
    inexact), from which the rounding to float32 is the correct one (53 >= 24 + 2 bits)."""
    p = np.multiply(x, r, dtype=_F64)
    c = np.asarray(c, _F64)
    shape = np.broadcast_shapes(np.shape(p), c.shape)
    s = np.atleast_1d(np.add(p, c))
    b = s - p
    err = (p - (s - b)) + (c - b)  # s + err == p + c exactly (TwoSum)
    bits = s.view(np.int64)
    with np.errstate(invalid="ignore"):
        inexact = (err != 0) & np.isfinite(s) & ((bits & 1) == 0)
    if inexact.any():
        # one step away from zero where the exact sum lies further from zero, else towards it
        bits += np.where(inexact, np.where((err > 0) == (s > 0), 1, -1), 0)
    return s.astype(_F32).reshape(shape)


def _cvt(y, dtype):
    """``_mm256_cvtps_epi32`` (round half to even; NaN and values outside int32 give INT32_MIN)
    then the saturating packs to ``dtype``; ``y`` float32."""
    lo, hi = QUANT_RANGES[np.dtype(dtype)]
    with np.errstate(invalid="ignore"):
        y = np.where(np.abs(y) < _F32(2**31), y, _F32(lo))
    np.rint(y, out=y)
    np.clip(y, lo, hi, out=y)
    return y.astype(dtype)


def _mlas_quantize(v, scale, zp, dtype):
    """``MlasQuantizeLinear`` (AVX-512F kernel) of float32 ``v``: float32(v / scale) clamped to
    [min - zp, max - zp] (``_mm512_max_ps`` turns NaN into the low bound), rounded half to even,
    plus zp."""
    lo, hi = QUANT_RANGES[np.dtype(dtype)]
    with np.errstate(all="ignore"):
        y = np.divide(np.asarray(v, _F32), scale, dtype=_F32)
    low = _F32(lo - zp)
    y = np.where(np.isnan(y), low, np.clip(y, low, _F32(hi - zp)))
    return (np.rint(y).astype(np.int32) + zp).astype(dtype)


def _dequantized_domain(scale, zp, dtype):
    """float32(scale * (x - zp)) for the 256 values x of ``dtype``, in the order of their bytes."""
    x = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int32) - zp
    with np.errstate(all="ignore"):
        return np.multiply(_F32(scale), x.astype(_F32), dtype=_F32)


def _leaky_relu(alpha):
    a = _F32(alpha)

    def fn(v):
        with np.errstate(all="ignore"):
            return np.where(v >= 0, v, np.multiply(a, v, dtype=_F32))

    return fn


def _identity(v):
    return v


@lru_cache(maxsize=64)
def _lookup_table(kind, alpha_bits, x_scale_bits, x_zp, y_scale_bits, y_zp, dtype_str):
    """``QlinearBuildLookupTable``: the 256 outputs of ``kind`` ("sigmoid", "leaky_relu",
    "identity") indexed by the input's byte (read-only)."""
    dtype = np.dtype(dtype_str)
    as_float = lambda bits: np.uint32(bits).view(_F32)  # noqa: E731
    v = _dequantized_domain(as_float(x_scale_bits), x_zp, dtype)
    fn = {"sigmoid": onnx_sigmoid, "identity": _identity}.get(kind) or _leaky_relu(as_float(alpha_bits))
    with np.errstate(all="ignore"):
        table = _mlas_quantize(fn(v), as_float(y_scale_bits), y_zp, dtype)
    table.flags.writeable = False
    return table


def _look_up(table, x):
    """x's bytes looked up in a 256-entry table of x's type."""
    return np.asarray(np.take(table, x.view(np.uint8)))


# ---------------------------------------------------------------------------- QLinearAdd/Mul
def _binary_operands(inputs, what):
    """(A, B, dtype, (A_scale, A_zp), (B_scale, B_zp), (C_scale, C_zp), output shape), checked."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    a, b = _quantized(inputs[0], what, "A"), _quantized(inputs[3], what, "B")
    if a.dtype != b.dtype:
        raise InputError(f"{what}: A of type {a.dtype} and B of type {b.dtype}, expected the same type")
    dtype = a.dtype
    params = [
        (_scale(inputs[k], what, f"{n}_scale"), _zero_point(inputs[k + 1], dtype, what, f"{n}_zero_point"))
        for k, n in ((1, "A"), (4, "B"), (6, "C"))
    ]
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"{what}: A of shape {a.shape} and B of shape {b.shape} do not broadcast") from None
    return a, b, dtype, params, shape


def _swapped(a_shape, b_shape) -> bool:
    """Whether onnxruntime's ``Broadcaster`` makes input 0 the scalar of each span
    (``IsInput0Scalar``): its first iterated axis is the innermost one where the output is
    longer than 1 (the outermost common axis where none is), and input 0 is broadcast there."""
    if not a_shape:
        return True
    if not b_shape:
        return a_shape[-1] <= 1
    n = min(len(a_shape), len(b_shape))
    for k in range(1, n + 1):
        da, db = a_shape[-k], b_shape[-k]
        if (0 if min(da, db) == 0 else max(da, db)) > 1 or k == n:
            return da <= 1
    return False  # not reached


def _add_formula(u, ru, v, rv, fixed, dtype):
    """cvt(fma(u, ru, fma(v, rv, fixed))): ``MlasQLinearAddKernelAvx2Helper`` with u its span
    and v its second operand (a span or a scalar), u and v the raw integers."""
    inner = _fma(np.asarray(v, _F32), rv, fixed)
    return _cvt(_fma(np.asarray(u, _F32), ru, inner), dtype)


@lru_cache(maxsize=16)
def _add_table(su_bits, zu, sv_bits, zv, sc_bits, zc, dtype_str):
    """QLinearAdd's 256 x 256 outputs, indexed by (u's byte << 8) | v's byte (read-only)."""
    dtype = np.dtype(dtype_str)
    values = np.arange(256, dtype=np.uint8).view(dtype)
    ru, rv, fixed = _add_constants(*(np.uint32(b).view(_F32) for b in (su_bits, sv_bits, sc_bits)), zu, zv, zc)
    table = _add_formula(values[:, None], ru, values[None, :], rv, fixed, dtype).reshape(-1)
    table.flags.writeable = False
    return table


def _add_constants(su, sv, sc, zu, zv, zc):
    """(ru, rv, F) of ``MlasQLinearAddKernelAvx2Helper``."""
    with np.errstate(all="ignore"):
        ru, rv = _F32(su / sc), _F32(sv / sc)
        fixed = _F32(_F32(zc) - _F32(_fma(ru, _F32(zu), _F32(rv * _F32(zv)))))
    return ru, rv, fixed


def _qlinear_add(inputs, attrs, opset):
    what = "QLinearAdd"
    a, b, dtype, ((sa, za), (sb, zb), (sc, zc)), shape = _binary_operands(inputs, what)
    # the kernel's span operand u and second operand v
    (u, su, zu), (v, sv, zv) = ((a, sa, za), (b, sb, zb))
    if _swapped(a.shape, b.shape):
        (u, su, zu), (v, sv, zv) = (v, sv, zv), (u, su, zu)
    if int(np.prod(shape)) >= _TABLE_FROM:
        table = _add_table(_bits(su), zu, _bits(sv), zv, _bits(sc), zc, dtype.str)
        index = np.empty(shape, np.uint16)
        np.left_shift(u.view(np.uint8), 8, out=index, dtype=np.uint16)
        np.bitwise_or(index, v.view(np.uint8), out=index)
        return [np.take(table, index)]
    ru, rv, fixed = _add_constants(su, sv, sc, zu, zv, zc)
    return [_add_formula(u, ru, v, rv, fixed, dtype).reshape(shape)]


def _qlinear_mul(inputs, attrs, opset):
    what = "QLinearMul"
    a, b, dtype, ((sa, za), (sb, zb), (sc, zc)), shape = _binary_operands(inputs, what)
    with np.errstate(all="ignore"):
        ratio = _F32(_F32(sa * sb) / sc)
        # differences of 8-bit values and their products (|p| <= 255 * 255) are exact in float32
        product = np.multiply(np.subtract(a, _F32(za), dtype=_F32), np.subtract(b, _F32(zb), dtype=_F32))
        y = np.multiply(product, ratio, dtype=_F32)
        y = np.add(y, _F32(zc), out=y if y.ndim else None, dtype=_F32)
    return [_cvt(np.asarray(y, _F32), dtype).reshape(shape)]


# --------------------------------------------------------------------- lookup-table operators
def _unary(inputs, kind, alpha, what):
    inputs = list(inputs) + [None] * (5 - len(inputs))
    x = _quantized(inputs[0], what, "X")
    sx, zx = _scale(inputs[1], what, "X_scale"), _zero_point(inputs[2], x.dtype, what, "X_zero_point")
    sy, zy = _scale(inputs[3], what, "Y_scale"), _zero_point(inputs[4], x.dtype, what, "Y_zero_point")
    table = _lookup_table(kind, _bits(alpha), _bits(sx), zx, _bits(sy), zy, x.dtype.str)
    return [_look_up(table, x)]


def _qlinear_sigmoid(inputs, attrs, opset):
    return _unary(inputs, "sigmoid", 0.0, "QLinearSigmoid")


def _qlinear_leaky_relu(inputs, attrs, opset):
    return _unary(inputs, "leaky_relu", attrs.get("alpha", 0.01), "QLinearLeakyRelu")


def _qlinear_concat(inputs, attrs, opset):
    what = "QLinearConcat"
    if len(inputs) < 5 or (len(inputs) - 2) % 3:
        raise InputError(
            f"{what}: {len(inputs)} inputs, expected Y_scale, Y_zero_point and then "
            "(X, X_scale, X_zero_point) for each input"
        )
    sy = _scale(inputs[0], what, "Y_scale")
    y_zp = np.asarray(inputs[1]) if inputs[1] is not None else None
    if y_zp is None or y_zp.dtype not in _TYPES:
        raise InputError(f"{what}: Y_zero_point of type {None if y_zp is None else y_zp.dtype}, expected uint8 or int8")
    dtype = y_zp.dtype
    zy = _zero_point(y_zp, dtype, what, "Y_zero_point")
    parts = []
    for k in range((len(inputs) - 2) // 3):
        x, s, z = inputs[2 + 3 * k : 5 + 3 * k]
        name = f"input {k}"
        x = _quantized(x, what, name)
        if x.dtype != dtype:
            raise InputError(f"{what}: {name} of type {x.dtype}, expected {dtype} (the type of Y_zero_point)")
        if z is None:
            raise InputError(f"{what}: {name} has no zero point (each input is a (X, X_scale, X_zero_point) triple)")
        sx, zx = _scale(s, what, f"{name}'s scale"), _zero_point(z, dtype, what, f"{name}'s zero point")
        if not (sx == sy and zx == zy):
            x = _look_up(_lookup_table("identity", 0, _bits(sx), zx, _bits(sy), zy, dtype.str), x)
        parts.append(x)
    # onnxruntime's ConcatBase checks and joins the inputs that hold values
    full = [x for x in parts if x.size] or parts
    ref = full[0]
    axis = attrs["axis"]
    if not -ref.ndim <= axis < ref.ndim:
        raise ShapeError(
            f"{what}: axis {axis} for inputs of rank {ref.ndim} (expected in [{-ref.ndim}, {ref.ndim - 1}])"
        )
    axis %= ref.ndim
    for k, x in enumerate(parts):
        if x.size == 0 and full is not parts:
            continue
        if x.ndim != ref.ndim or x.shape[:axis] != ref.shape[:axis] or x.shape[axis + 1 :] != ref.shape[axis + 1 :]:
            raise ShapeError(
                f"{what}: input {k} of shape {x.shape} does not concatenate with an input of "
                f"shape {ref.shape} on axis {axis} (all other axes must be equal)"
            )
    return [np.concatenate(full, axis=axis)]


# ------------------------------------------------------------------------------ load checks
def _params_check(required, params):
    """A cross-check refusing at load a node whose required inputs are unnamed or whose
    constant scales and zero points are malformed: ``required`` the input positions that
    must be named, ``params`` (scale position, zero point position, scale name, zero point
    name) for each quantized tensor."""

    def check(node, attrs, ctx):
        what = node.op_type
        for k in required:
            if k < len(node.inputs) and not node.inputs[k]:
                fail(ctx, node, f"input {k + 1} is required but has no name")

        def constant(k):
            return ctx.constants.get(node.inputs[k]) if k < len(node.inputs) and node.inputs[k] else None

        zps = {}
        try:
            for s, z, s_name, z_name in params:
                if constant(s) is not None:
                    _scale(constant(s), what, s_name)
                if constant(z) is not None:
                    zps[z_name] = np.asarray(constant(z))
                    _zero_point(zps[z_name], zps[z_name].dtype, what, z_name)
            types = {v.dtype for v in zps.values()}
            if len(types) > 1 or types - set(_TYPES):
                found = ", ".join(f"{n} {v.dtype}" for n, v in zps.items())
                raise InputError(f"{what}: zero points of types {found}; expected one type, uint8 or int8")
        except FastlayersError as e:
            fail(ctx, node, str(e))

    return check


def _named(*tensors):
    """``_params_check``'s params of tensors named ``tensors`` whose scale and zero point follow
    at the given positions."""
    return [(k, k + 1, f"{n}_scale", f"{n}_zero_point") for k, n in tensors]


def _concat_check(node, attrs, ctx):
    n = len(node.inputs)
    if (n - 2) % 3:
        fail(
            ctx,
            node,
            f"has {n} inputs, expected Y_scale, Y_zero_point and then (X, X_scale, "
            "X_zero_point) for each input (2 + 3k)",
        )
    params = [(0, 1, "Y_scale", "Y_zero_point")] + [
        (3 + 3 * k, 4 + 3 * k, f"input {k}'s scale", f"input {k}'s zero point") for k in range((n - 2) // 3)
    ]
    _params_check((), params)(node, attrs, ctx)


_BINARY = {
    "inputs": (7, 8),
    "optional": 2,
    "check": _params_check((0, 1, 3, 4, 6), _named((1, "A"), (4, "B"), (6, "C"))),
}
_UNARY = _params_check((0, 1, 3), _named((1, "X"), (3, "Y")))
FAMILY.add("QLinearAdd", _qlinear_add, domain=MS, **_BINARY)
FAMILY.add("QLinearMul", _qlinear_mul, domain=MS, **_BINARY)
FAMILY.add("QLinearSigmoid", _qlinear_sigmoid, inputs=(4, 5), optional=2, check=_UNARY, domain=MS)
FAMILY.add(
    "QLinearLeakyRelu",
    _qlinear_leaky_relu,
    inputs=(4, 5),
    optional=2,
    attrs={"alpha": FLT},
    check=_UNARY,
    domain=MS,
)
FAMILY.add(
    "QLinearConcat",
    _qlinear_concat,
    inputs=(5, None),
    optional=None,
    attrs={"axis": AXIS},
    required=("axis",),
    check=_concat_check,
    domain=MS,
)
