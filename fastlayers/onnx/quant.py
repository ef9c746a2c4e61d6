"""Quantized ONNX graphs: the QDQ form (QuantizeLinear, DequantizeLinear), DynamicQuantizeLinear
and the quantization parameters the other quantized operators share. The integer products are
in ``qlinear.py``, the quantized average pools in ``qpool.py``, DynamicQuantizeLSTM in
``qlstm.py``, the load-time passes in ``qfusion.py``.

Each of these modules is a family of operator records (``records.py``); contrib operators are
recorded under ``"com.microsoft::<op_type>"`` (``check.qualified``), so that the lookup is by
(domain, operator) and a default-domain operator is never taken for a contrib one.

Semantics (https://onnx.ai/onnx/operators/ and onnxruntime's docs/ContribOperators.md):

- ``QuantizeLinear``: y = saturate(round_half_even(x / scale) + zero_point), per tensor, per axis
  or per block; ``DequantizeLinear``: y = (x - zero_point) * scale (folded at load where x is a
  constant weight);
- integer products are exact: u8/s8 operands less their zero points, summed in int32 (no int16
  saturation, unlike onnxruntime's AVX2 u8 x s8 kernel, see docs/formats.md);
- requantization as onnxruntime: y = saturate(round_half_even(float32(acc) * multiplier) +
  y_zero_point) with multiplier = float32(a_scale * b_scale / y_scale);
- float outputs of integer products (MatMulIntegerToFloat, DynamicQuantizeMatMul):
  float32(acc) * float32(a_scale * b_scale) (+ bias);
- dynamic quantization of a float tensor to uint8 as ``DynamicQuantizeLinear``: its range
  widened to hold 0, scale = (max - min) / 255 (1 where max == min), zero point rounded.

Integer products run on the native kernel ``native/qgemm.c`` (the numpy reference backend: in
float64, exact), DynamicQuantizeLSTM's time loop on ``native/qlstm.c``, per-tensor 8-bit
quantization on ``native/quantize.c``.
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..errors import InputError, ModelFileError, ShapeError, UnsupportedError
from .layout import stored as _stored
from .records import AXIS, BOOL, FASTLAYERS, A, Family, short
from .tensors import DTYPES

MS = "com.microsoft"
#: The opset versions of the non-default domains whose operators fastlayers implements.
DOMAIN_OPSETS = {MS: 1, FASTLAYERS: 1}
#: Integer types a quantized tensor may have, with their (min, max).
QUANT_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.uint8, np.int8, np.uint16, np.int16)}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def check_domains(model, where: str) -> None:
    """Refuse a graph whose non-default-domain nodes lack their domain's opset import, or
    import a version other than the one implemented (``DOMAIN_OPSETS``)."""
    for domain in sorted({n.domain for n in model.graph.nodes if n.domain}):
        version = model.opsets.get(domain)
        if version is None:
            raise ModelFileError(f"{where}: nodes of domain {short(domain)} but no opset import for that domain")
        if version != DOMAIN_OPSETS[domain]:
            raise UnsupportedError(
                f"{where}: opset {version} of domain {domain} is not supported (supported: {DOMAIN_OPSETS[domain]})"
            )


def dequantized_bytes(graph) -> int:
    """The bytes the DequantizeLinear nodes of constant initializers make when folded (float32),
    which the folding budget allows for on top of the file's own weights."""
    return sum(
        4 * graph.initializers[n.inputs[0]].size
        for n in graph.nodes
        if n.op_type == "DequantizeLinear" and n.domain in ("", MS) and n.inputs and n.inputs[0] in graph.initializers
    )


#: This family's operator records (``ops.RECORDS`` gathers the families): the QDQ pair and
#: DynamicQuantizeLinear.
FAMILY = Family("quantization")


# ----------------------------------------------------------------------------- parameters
def _scale(scale, what):
    """A scale as float32, checked to be a float tensor."""
    scale = np.asarray(scale)
    if scale.dtype not in _FLOATS:
        raise InputError(f"{what}: scale of type {scale.dtype}, expected float32 or float16")
    return scale.astype(np.float32)


def _zero_point(zp, dtype, what, shape=None):
    """A zero point as ``dtype`` (0 where omitted), checked: its type is ``dtype`` and its shape
    is ``shape`` (that of the scale) where given."""
    if zp is None:
        return np.zeros(() if shape is None else shape, dtype)
    zp = np.asarray(zp)
    if zp.dtype != dtype:
        raise InputError(
            f"{what}: zero point of type {zp.dtype}, expected {np.dtype(dtype)} (the quantized tensor's type)"
        )
    if shape is not None and zp.shape != tuple(shape) and not (zp.size == 1 and np.prod(shape) == 1):
        raise ShapeError(f"{what}: zero point of shape {zp.shape} for a scale of shape {tuple(shape)}")
    return zp


def _broadcast_param(p, x_shape, axis, block_size, what):
    """A scale or zero point ``p`` laid out to broadcast against a tensor of ``x_shape``: a
    scalar (per tensor), a vector of x_shape[axis] values (per axis), or, with ``block_size``, a
    tensor of x's rank whose ``axis`` holds ceil(x_shape[axis] / block_size) blocks."""
    rank = len(x_shape)
    if p.ndim == 0 or p.shape == (1,) and not block_size:
        return p.reshape(())
    if not -rank <= axis < rank:
        raise ShapeError(f"{what}: axis {axis} for an input of rank {rank}")
    axis %= rank
    if block_size:
        blocks = -(-x_shape[axis] // block_size)
        want = x_shape[:axis] + (blocks,) + x_shape[axis + 1 :]
        if p.shape != want:
            raise ShapeError(
                f"{what}: scale of shape {p.shape} for an input of shape {x_shape} with "
                f"block_size {block_size} on axis {axis} (expected {want})"
            )
        # block of each index along the axis (no array of blocks * block_size: the attribute may be huge)
        return np.take(p, np.arange(x_shape[axis]) // block_size, axis=axis)
    if p.shape != (x_shape[axis],):
        raise ShapeError(
            f"{what}: scale of shape {p.shape} for an input of shape {x_shape} on axis "
            f"{axis} (expected a scalar or ({x_shape[axis]},))"
        )
    return p.reshape((-1,) + (1,) * (rank - 1 - axis))


def _saturate(y, zp):
    """saturate(round_half_even(y) + zp) in zp's type (rounded before the zero point is added,
    as the spec and onnxruntime); overwrites ``y``, a float32 array of its own."""
    lo, hi = QUANT_RANGES[zp.dtype]
    np.rint(y, out=y)
    if zp.ndim or zp:
        y += zp.astype(np.float32)
    np.clip(y, lo, hi, out=y)
    return y.astype(zp.dtype)


def _elementwise(x_f32, fn):
    """fn(the C-contiguous float32 memory of x) viewed back as x (NCHW views of NHWC memory
    stay views)."""
    held, back = _stored(np.asarray(x_f32, np.float32))
    y = fn(held)
    return y if back is None else y.transpose(back)


def quantize(x_f32, scale, zp):
    """saturate(round_half_even(x / scale) + zero_point) in zero_point's type (float32 division,
    as onnxruntime); per tensor 8-bit on the native core (quantize.c)."""
    core = integer_kernels()
    if core is not None and np.ndim(scale) == 0 and zp.ndim == 0 and zp.dtype in (np.uint8, np.int8):
        return _elementwise(x_f32, lambda x: core.quantize(x, float(scale), float(zp), zp.dtype))
    return _saturate(np.asarray(np.divide(x_f32, scale, dtype=np.float32)), zp)


# ------------------------------------------------------------------------------- QDQ form
def _quantize_linear(inputs, attrs, opset):
    x = np.asarray(inputs[0])
    what = "QuantizeLinear"
    scale = np.asarray(inputs[1])
    zp = inputs[2] if len(inputs) > 2 else None
    if zp is not None:
        dtype = np.asarray(zp).dtype
    else:
        to = attrs.get("output_dtype", 0)
        if to and DTYPES.get(to) is None or to and np.dtype(DTYPES[to]) not in QUANT_RANGES:
            raise UnsupportedError(f"{what}: output_dtype {to} is not supported (uint8, int8, uint16, int16)")
        dtype = np.dtype(DTYPES[to]) if to else np.dtype(np.uint8)
    if dtype not in QUANT_RANGES:
        raise UnsupportedError(f"{what}: quantized type {dtype} is not supported (uint8, int8, uint16, int16)")
    if x.dtype not in _FLOATS + (np.dtype(np.int32),):
        raise InputError(f"{what}: input of type {x.dtype}, expected float32, float16 or int32")
    zp = _zero_point(zp, dtype, what, scale.shape)
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    s = _broadcast_param(_scale(scale, what), x.shape, axis, block, what)
    z = _broadcast_param(zp, x.shape, axis, block, what)
    return [quantize(x.astype(np.float32, copy=False), s, z)]


def _dequantize_linear(inputs, attrs, opset):
    x = np.asarray(inputs[0])
    what = "DequantizeLinear"
    if x.dtype not in QUANT_RANGES and x.dtype != np.int32:
        raise UnsupportedError(f"{what}: quantized type {x.dtype} is not supported (uint8, int8, uint16, int16, int32)")
    scale = np.asarray(inputs[1])
    zp = _zero_point(inputs[2] if len(inputs) > 2 else None, x.dtype, what, scale.shape)
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    s = _broadcast_param(_scale(scale, what), x.shape, axis, block, what)
    z = _broadcast_param(zp, x.shape, axis, block, what)
    to = attrs.get("output_dtype", 0)
    if to not in (0, 1, 10):
        raise UnsupportedError(f"{what}: output_dtype {to} is not supported (float32, float16)")
    if x.dtype == np.int32:
        y = (x - z.astype(np.int32)).astype(np.float32)
    else:  # 8- and 16-bit differences are exact in float32
        y = x.astype(np.float32)
        if z.ndim or z:
            y -= z.astype(np.float32)
    y *= s
    return [y.astype(DTYPES[to] if to else scale.dtype, copy=False)]


_QDQ = {
    "axis": AXIS,
    "block_size": A("int", 0),
    "saturate": BOOL,
    "output_dtype": A("int", 0),
    "precision": A("int", 0),
}
for _domain in ("", MS):
    FAMILY.add("QuantizeLinear", _quantize_linear, inputs=(2, 3), attrs=_QDQ, domain=_domain)
    FAMILY.add("DequantizeLinear", _dequantize_linear, inputs=(2, 3), attrs=_QDQ, domain=_domain)


def integer_kernels():
    """The active backend's integer kernels (``Ops.integer``: ``backends.integer``), or None
    where it has none: integer products then run in numpy."""
    return get_ops().integer


# ------------------------------------------------------------------------- dynamic quantization
def dynamic_quantize(x):
    """(x as uint8, scale, zero point) as DynamicQuantizeLinear: the range [min(x, 0),
    max(x, 0)] mapped onto [0, 255] (scale 1 where it is empty), the zero point rounded half to
    even."""
    x = np.asarray(x, np.float32)
    core = integer_kernels()
    if core is not None:  # the same arithmetic in one native call
        held, back = _stored(x)
        q, scale, zp = core.dynamic_quantize(held)
        return (q if back is None else q.transpose(back)), scale, zp
    lo = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
    hi = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    zp = np.uint8(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    return quantize(x, scale, np.asarray(zp)), scale, zp


def _dynamic_quantize_linear(inputs, attrs, opset):
    x = np.asarray(inputs[0])
    if x.dtype != np.float32:
        raise InputError(f"DynamicQuantizeLinear: input of type {x.dtype}, expected float32")
    y, scale, zp = dynamic_quantize(x)
    return [y, np.asarray(scale), np.asarray(zp)]


FAMILY.add("DynamicQuantizeLinear", _dynamic_quantize_linear, outputs=3)
# ------------------------------------------------------------------------------ quantized LSTM
