"""Quantized ONNX operators: the QDQ form, the integer operators and onnxruntime's contrib ones.

Registered into ``ops.OPS`` (and their attribute rules into ``check.OPS``); contrib
operators under ``"com.microsoft::<op_type>"`` (``check.qualified``), so that the lookup is
by (domain, operator) and a default-domain operator is never taken for a contrib one.

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
quantization on ``native/quantize.c``. At load (``optimize``, called by ``onnx.from_model``):
QuantizeLinear -> DequantizeLinear pairs become one ``FusedQuantizeDequantize`` node,
``quantize_dynamic``'s MatMulInteger -> Cast -> Mul (-> Add) chains one MatMulIntegerToFloat, and
constant weights are packed once for the native kernel.
"""

from __future__ import annotations

import numpy as np

from ..backends import get_ops
from ..errors import FastlayersError, InputError, ModelFileError, ShapeError, UnsupportedError
from . import check
from .check import _CONV, AXIS, BOOL, A, Op, _fail, _spatial_lengths, _spatial_rank, short
from .ops import DTYPES, OPS, _pads_2d, _padded_output, _spatial, _stored

MS = "com.microsoft"
#: The opset versions of the non-default domains whose operators fastlayers implements.
DOMAIN_OPSETS = {MS: 1}
#: Integer types a quantized tensor may have, with their (min, max).
QUANT_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max)
                for t in (np.uint8, np.int8, np.uint16, np.int16)}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def check_domains(model, where: str) -> None:
    """Refuse a graph whose non-default-domain nodes lack their domain's opset import, or
    import a version other than the one implemented (``DOMAIN_OPSETS``)."""
    for domain in sorted({n.domain for n in model.graph.nodes if n.domain}):
        version = model.opsets.get(domain)
        if version is None:
            raise ModelFileError(f"{where}: nodes of domain {check.short(domain)} but no opset "
                                 "import for that domain")
        if version != DOMAIN_OPSETS[domain]:
            raise UnsupportedError(f"{where}: opset {version} of domain {domain} is not supported "
                                   f"(supported: {DOMAIN_OPSETS[domain]})")


def dequantized_bytes(graph) -> int:
    """The bytes the DequantizeLinear nodes of constant initializers make when folded (float32),
    which the folding budget allows for on top of the file's own weights."""
    return sum(4 * graph.initializers[n.inputs[0]].size for n in graph.nodes
               if n.op_type == "DequantizeLinear" and n.domain in ("", MS) and n.inputs
               and n.inputs[0] in graph.initializers)


def _register(name, fn, rule, domain=""):
    key = name if not domain else f"{domain}::{name}"
    OPS[key] = fn
    check.OPS[key] = rule


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
        raise InputError(f"{what}: zero point of type {zp.dtype}, expected {np.dtype(dtype)} "
                         "(the quantized tensor's type)")
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
        want = x_shape[:axis] + (blocks,) + x_shape[axis + 1:]
        if p.shape != want:
            raise ShapeError(f"{what}: scale of shape {p.shape} for an input of shape {x_shape} with "
                             f"block_size {block_size} on axis {axis} (expected {want})")
        # block of each index along the axis (no array of blocks * block_size: the attribute may be huge)
        return np.take(p, np.arange(x_shape[axis]) // block_size, axis=axis)
    if p.shape != (x_shape[axis],):
        raise ShapeError(f"{what}: scale of shape {p.shape} for an input of shape {x_shape} on axis "
                         f"{axis} (expected a scalar or ({x_shape[axis]},))")
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
    core = _native()
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
            raise UnsupportedError(f"{what}: output_dtype {to} is not supported (uint8, int8, "
                                   "uint16, int16)")
        dtype = np.dtype(DTYPES[to]) if to else np.dtype(np.uint8)
    if dtype not in QUANT_RANGES:
        raise UnsupportedError(f"{what}: quantized type {dtype} is not supported (uint8, int8, "
                               "uint16, int16)")
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
        raise UnsupportedError(f"{what}: quantized type {x.dtype} is not supported (uint8, int8, "
                               "uint16, int16, int32)")
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
    else:                                  # 8- and 16-bit differences are exact in float32
        y = x.astype(np.float32)
        if z.ndim or z:
            y -= z.astype(np.float32)
    y *= s
    return [y.astype(DTYPES[to] if to else scale.dtype, copy=False)]


_QDQ = {"axis": AXIS, "block_size": A("int", 0), "saturate": BOOL, "output_dtype": A("int", 0),
        "precision": A("int", 0)}
for _domain in ("", MS):
    _register("QuantizeLinear", _quantize_linear, Op(inputs=(2, 3), attrs=_QDQ), _domain)
    _register("DequantizeLinear", _dequantize_linear, Op(inputs=(2, 3), attrs=_QDQ), _domain)


# --------------------------------------------------------------------------- integer products
def _quantized(x, what, name):
    """An integer operand, checked to be uint8 or int8."""
    x = np.asarray(x)
    if x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise UnsupportedError(f"{what}: {name} of type {x.dtype}; uint8 and int8 are supported")
    return x


def _operand_zero_point(zp, x, what, name, per_row):
    """The zero point of integer operand ``x`` laid out to broadcast against it: a scalar, or
    one per row of A (``per_row``, shape (M,) or (..., M, 1)) or per column of B ((N,) or
    (..., 1, N)); 0 where omitted."""
    if zp is None:
        return np.zeros((), x.dtype)
    zp = np.asarray(zp)
    if zp.dtype != x.dtype:
        raise InputError(f"{what}: {name} zero point of type {zp.dtype}, expected {x.dtype} (the "
                         f"type of {name})")
    if zp.size == 1:
        return zp.reshape(())
    if zp.ndim == 1:
        axis = -2 if per_row else -1
        if x.ndim < 2 or zp.shape[0] != x.shape[axis]:
            raise ShapeError(f"{what}: {name} zero point of shape {zp.shape} for {name} of shape "
                             f"{x.shape} (expected a scalar or one per {'row' if per_row else 'column'})")
        return zp.reshape(-1, 1) if per_row else zp
    return zp


def _native():
    """The native core where the active backend runs on it; None on the numpy reference."""
    if get_ops().name == "reference":
        return None
    from ..native import _core

    return _core


def _column_zero_points(b_zp, n):
    """B's zero point (a scalar, or one per column) as n int32 values."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(b_zp, np.int32), (1, n)).reshape(n))


def integer_matmul(a, a_zp, b, b_zp, packed=None):
    """(a - a_zp) @ (b - b_zp) summed exactly, as int32 (numpy matmul broadcasting; the zero
    points broadcast against their operands): on the native u8/s8 kernel (qgemm.c) for a 2-D
    b, ``packed`` its packed form where the load packed it, else in float64 (exact: products of
    two 9-bit values summed over fewer than 2**37 terms)."""
    if a.shape[-1:] != b.shape[-2:-1] if b.ndim >= 2 else a.shape[-1:] != b.shape:
        raise ShapeError(f"integer matmul of shapes {a.shape} and {b.shape}: inner sizes differ")
    core = _native()
    if core is None or b.ndim != 2 or a.ndim == 0:
        a64 = a.astype(np.float64) - a_zp.astype(np.float64)
        b64 = b.astype(np.float64) - b_zp.astype(np.float64)
        return np.matmul(a64, b64).astype(np.int32)
    k, n = b.shape
    a2 = np.ascontiguousarray(a.reshape(-1, k))
    za = np.ascontiguousarray(np.broadcast_to(np.asarray(a_zp, np.int32), a.shape[:-1] + (1,)).reshape(-1))
    if packed is None:
        packed = core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, n))
    c = np.empty((a2.shape[0], n), np.int32)
    return core.qgemm(a2, za, packed, c).reshape(a.shape[:-1] + (n,))


def pack_operand(b, b_zp):
    """A 2-D B less its zero point packed for the native kernel (``integer_matmul``'s
    ``packed``); None on the numpy reference."""
    core = _native()
    return None if core is None else core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, b.shape[1]))


def _pack_lstm(node, constants, core) -> None:
    """A DynamicQuantizeLSTM's constant W and R (with their zero points) packed per direction
    (attribute ``_packed``: ((W, R) packed of each direction))."""
    names = [node.inputs[i] if len(node.inputs) > i else "" for i in (1, 2, 9, 11)]
    if not all(n in constants for n in names):
        return
    w, r, w_zp, r_zp = (constants[n] for n in names)
    try:
        packed = []
        for d in range(w.shape[0] if w.ndim == 3 else 0):
            pair = []
            for m, zp, name in ((w, w_zp, "W_zero_point"), (r, r_zp, "R_zero_point")):
                z = _zero_point(_direction_param(zp, d, m.shape[2], "DynamicQuantizeLSTM", name), m.dtype,
                                "DynamicQuantizeLSTM")
                pair.append(core.qpack(np.ascontiguousarray(m[d]), _column_zero_points(z, m.shape[2])))
            packed.append(tuple(pair))
    except (FastlayersError, ValueError, TypeError, IndexError):
        return   # the operator raises its error when it runs
    if packed and r.ndim == 3 and r.shape[0] == len(packed):
        node.attrs = dict(node.attrs, _packed=tuple(packed))


#: Integer products whose B may be a constant packed at load: op -> (B input, B zero point input).
_PACKABLE = {"MatMulInteger": (1, 3), "QLinearMatMul": (3, 5), f"{MS}::MatMulIntegerToFloat": (1, 5),
             f"{MS}::DynamicQuantizeMatMul": (1, 3)}


def _per_tensor_8bit(constants, scale_name, zp_name):
    """(scale, zero point) where both are constants, per tensor, float32 and 8-bit; else None."""
    scale = constants.get(scale_name)
    zp = constants.get(zp_name) if zp_name else np.zeros((), np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or scale.dtype != np.float32 \
            or zp.dtype not in (np.uint8, np.int8):
        return None
    return scale.reshape(()), zp.reshape(())


def fuse_quantize_dequantize(nodes, constants, outputs) -> list:
    """QuantizeLinear -> DequantizeLinear on the same per-tensor 8-bit constants, the quantized
    value read by nothing else -> one ``FusedQuantizeDequantize`` node (x rounded to its
    quantization grid in one pass, quantize.c): the QDQ pairs around the activations of a
    statically quantized file."""
    readers: dict = {}
    for node in nodes:
        for i in node.inputs:
            readers[i] = readers.get(i, 0) + 1
    dq_of = {n.inputs[0]: n for n in nodes if n.op_type == "DequantizeLinear" and n.inputs}
    removed = set()
    for node in nodes:
        dq = dq_of.get(node.outputs[0]) if node.op_type == "QuantizeLinear" else None
        if dq is None or readers.get(node.outputs[0]) != 1 or node.outputs[0] in outputs \
                or node.attrs.get("block_size") or dq.attrs.get("output_dtype", 0) not in (0, 1):
            continue
        q_params = _per_tensor_8bit(constants, node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else "")
        dq_params = _per_tensor_8bit(constants, dq.inputs[1], dq.inputs[2] if len(dq.inputs) > 2 else "")
        if q_params is None or dq_params is None or not all(
                a.dtype == b.dtype and a == b for a, b in zip(q_params, dq_params)):
            continue
        node.op_type, node.outputs = "FusedQuantizeDequantize", list(dq.outputs)
        node.inputs = node.inputs[:2] + [node.inputs[2] if len(node.inputs) > 2 else dq.inputs[2]]
        node.attrs = {}
        removed.add(id(dq))
    return [n for n in nodes if id(n) not in removed]


def _fused_quantize_dequantize(inputs, attrs, opset):
    """fastlayers' own node (``fuse_quantize_dequantize``): DequantizeLinear(QuantizeLinear(x))
    with per-tensor 8-bit parameters, (clamp(round(x / s) + z) - z) * s."""
    x, scale, zp = np.asarray(inputs[0]), np.asarray(inputs[1]), np.asarray(inputs[2])
    core = _native()
    if core is None or x.dtype != np.float32:
        return _dequantize_linear([_quantize_linear(inputs, {}, opset)[0], scale, zp], {}, opset)
    lo, hi = QUANT_RANGES[zp.dtype]
    return [_elementwise(x, lambda m: core.fake_quantize(m, float(scale), float(zp), lo, hi))]


OPS["FusedQuantizeDequantize"] = _fused_quantize_dequantize


def fuse_integer_matmul(nodes, constants, outputs) -> list:
    """What ``quantize_dynamic`` writes for a MatMul on constant weights, MatMulInteger on a
    DynamicQuantizeLinear's outputs -> Cast to float -> Mul by the product of the two scales
    (-> Add of a constant bias), each value read only by the next -> one
    ``com.microsoft::MatMulIntegerToFloat`` node (the same float32 operations in one call)."""
    readers: dict = {}
    for node in nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node)
    producer = {o: n for n in nodes for o in n.outputs}

    def only_reader(name, op_type):
        found = readers.get(name, [])
        ok = len(found) == 1 and found[0].op_type == op_type and name not in outputs
        return found[0] if ok else None

    removed = set()
    for mm in nodes:
        if mm.op_type != "MatMulInteger" or len(mm.inputs) < 3 or mm.inputs[1] not in constants:
            continue
        dql = producer.get(mm.inputs[0])
        if dql is None or dql.op_type != "DynamicQuantizeLinear" or dql.outputs[0] != mm.inputs[0] \
                or dql.outputs[2] != mm.inputs[2]:
            continue
        cast = only_reader(mm.outputs[0], "Cast")
        mul = cast and cast.attrs.get("to") == 1 and only_reader(cast.outputs[0], "Mul")
        if not mul:
            continue
        scales = producer.get(mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0])
        if scales is None or scales.op_type != "Mul" or len(readers.get(scales.outputs[0], [])) != 1 \
                or scales.outputs[0] in outputs or dql.outputs[1] not in scales.inputs:
            continue
        b_scale = scales.inputs[1] if scales.inputs[0] == dql.outputs[1] else scales.inputs[0]
        if b_scale not in constants:
            continue
        last, bias = mul, ""
        add = only_reader(mul.outputs[0], "Add")
        if add is not None:
            other = add.inputs[1] if add.inputs[0] == mul.outputs[0] else add.inputs[0]
            value = constants.get(other)
            w = constants[mm.inputs[1]]
            if value is not None and value.dtype == np.float32 and w.ndim == 2 and value.shape == (w.shape[1],):
                last, bias = add, other
        mm.op_type = f"{MS}::MatMulIntegerToFloat"
        mm.inputs = [mm.inputs[0], mm.inputs[1], dql.outputs[1], b_scale, mm.inputs[2],
                     mm.inputs[3] if len(mm.inputs) > 3 else "", bias]
        mm.outputs, mm.attrs = list(last.outputs), {}
        removed.update(id(n) for n in (cast, mul, scales) + ((add,) if last is add else ()))
    return [n for n in nodes if id(n) not in removed]


def optimize(nodes, constants, outputs) -> list:
    """The load-time passes of quantized graphs (``onnx.from_model``): QDQ pairs and dynamic
    integer matmuls fused, the constant weights of integer products packed."""
    nodes = fuse_integer_matmul(fuse_quantize_dequantize(nodes, constants, outputs), constants, outputs)
    return pack_weights(nodes, constants)


def pack_weights(nodes, constants) -> list:
    """Give each integer product whose B (2-D uint8/int8) and B zero point are constants its B
    packed for the native kernel, once (attribute ``_b_packed``), where the native core is built."""
    try:
        from ..native import _core
    except ImportError:
        return nodes
    for node in nodes:
        if node.op_type == f"{MS}::DynamicQuantizeLSTM":
            _pack_lstm(node, constants, _core)
            continue
        where = _PACKABLE.get(node.op_type)
        if where is None or len(node.inputs) <= where[0]:
            continue
        b = constants.get(node.inputs[where[0]])
        zp_name = node.inputs[where[1]] if len(node.inputs) > where[1] else ""
        if b is None or b.ndim != 2 or b.dtype not in (np.uint8, np.int8) or (zp_name and zp_name not in constants):
            continue
        zp = constants[zp_name] if zp_name else np.zeros((), b.dtype)
        if zp.dtype != b.dtype or zp.size not in (1, b.shape[1]):
            continue   # the operator raises its error when it runs
        node.attrs = dict(node.attrs, _b_packed=_core.qpack(np.ascontiguousarray(b), _column_zero_points(zp.reshape(-1), b.shape[1])))
    return nodes


def _matmul_integer(inputs, attrs, opset):
    what = "MatMulInteger"
    a, b = _quantized(inputs[0], what, "A"), _quantized(inputs[1], what, "B")
    a_zp = _operand_zero_point(inputs[2] if len(inputs) > 2 else None, a, what, "A", True)
    b_zp = _operand_zero_point(inputs[3] if len(inputs) > 3 else None, b, what, "B", False)
    return [integer_matmul(a, a_zp, b, b_zp, attrs.get("_b_packed"))]


def _per_column(p, n, what, name):
    """A scale or zero point given per tensor or per column (of ``n``), as a scalar or (n,)."""
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    if p.shape != (n,):
        raise ShapeError(f"{what}: {name} of shape {p.shape} for {n} columns (expected a scalar or ({n},))")
    return p


def requantize(acc, multiplier, y_zp):
    """saturate(round_half_even(float32(acc) * multiplier) + y_zp), in y_zp's type."""
    return _saturate(acc.astype(np.float32) * multiplier, y_zp)


def _scalar(p, what, name):
    p = np.asarray(p)
    if p.size != 1:
        raise ShapeError(f"{what}: {name} of shape {p.shape}, expected a scalar")
    return p.reshape(())


def _qlinear_matmul(inputs, attrs, opset):
    what = "QLinearMatMul"
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    a, b = _quantized(a, what, "a"), _quantized(b, what, "b")
    n = b.shape[-1]
    a_zp = _operand_zero_point(_scalar(a_zp, what, "a_zero_point"), a, what, "a", True)
    b_zp = _operand_zero_point(_per_column(b_zp, n, what, "b_zero_point"), b, what, "b", False)
    y_zp = np.asarray(y_zp)
    if y_zp.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)) or y_zp.size != 1:
        raise InputError(f"{what}: y_zero_point of type {y_zp.dtype} and shape {y_zp.shape}; expected "
                         "a uint8 or int8 scalar")
    multiplier = (_scale(_scalar(a_s, what, "a_scale"), what) * _scale(_per_column(b_s, n, what, "b_scale"), what)
                  / _scale(_scalar(y_s, what, "y_scale"), what))
    return [requantize(integer_matmul(a, a_zp, b, b_zp, attrs.get("_b_packed")), multiplier, y_zp.reshape(()))]


# ----------------------------------------------------------------------- integer convolutions
def integer_conv(x, x_zp, w, w_zp, attrs, what):
    """The int32 convolution of (x - x_zp) by (w - w_zp), NCHW / NCL, with ONNX Conv's strides,
    dilations, pads / auto_pad and group (padding reads as x_zp: 0 after the shift)."""
    if x.ndim not in (3, 4) or w.ndim != x.ndim:
        raise ShapeError(f"{what}: input of shape {x.shape} and weight of shape {w.shape}; 1-D and 2-D "
                         "convolutions (rank 3 or 4, equal ranks) are supported")
    one_d = x.ndim == 3
    x4 = x[:, :, None, :] if one_d else x
    w4 = w[:, :, None, :] if one_d else w
    group = attrs.get("group", 1)
    n, c, h, wd = x4.shape
    cout, cin_g, kh, kw = w4.shape
    if c != cin_g * group or cout % group:
        raise ShapeError(f"{what}: input of shape {x.shape} does not fit a weight of shape {w.shape} "
                         f"with group={group}")
    if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(w.shape[2:]):
        raise ShapeError(f"{what}: kernel_shape {list(attrs['kernel_shape'])} for a weight of shape {w.shape}")
    nsp = x.ndim - 2
    strides, dilations = _spatial(attrs, "strides", nsp, 1), _spatial(attrs, "dilations", nsp, 1)
    pads = _pads_2d(attrs, x.shape, [kh, kw], strides, dilations, one_d)
    oh, ow = _padded_output(what, n * cout, (h, wd), (kh, kw), strides, dilations, pads)
    w_zp = np.asarray(w_zp)
    if _native() is not None:
        y = _integer_conv_native(x4, x_zp, w4, w_zp, group, (oh, ow), strides, dilations, pads)
        return y[:, :, 0, :] if one_d else y
    if w_zp.ndim == 1:
        w_zp = w_zp.reshape(-1, 1, 1, 1)
    x64 = np.pad(x4.astype(np.float64) - np.asarray(x_zp, np.float64),
                 ((0, 0), (0, 0), pads[0], pads[1]))
    w64 = w4.astype(np.float64) - w_zp.astype(np.float64)
    y = np.zeros((n, oh, ow, cout), np.float64)
    (sh, sw), (dh, dw), cout_g = strides, dilations, cout // group
    for i in range(kh):
        for j in range(kw):
            window = x64[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw]
            window = window.transpose(0, 2, 3, 1)            # (n, oh, ow, c)
            for g in range(group):
                y[..., g * cout_g:(g + 1) * cout_g] += (window[..., g * cin_g:(g + 1) * cin_g]
                                                        @ w64[g * cout_g:(g + 1) * cout_g, :, i, j].T)
    y = y.transpose(0, 3, 1, 2).astype(np.int32)
    return y[:, :, 0, :] if one_d else y


def _integer_conv_native(x, x_zp, w, w_zp, group, out_hw, strides, dilations, pads):
    """``integer_conv`` (NCHW x, OIHW w) as one integer product per group on the native kernel:
    the windows of x (channels last, padded with x_zp) gathered into rows (n oh ow, kh kw c/group)
    less x_zp, times w laid out (kh kw c/group, c_out/group) less its zero point per output
    channel. Returns the NCHW view of an NHWC result."""
    n, c = x.shape[:2]
    cout, cin_g, kh, kw = w.shape
    (oh, ow), (sh, sw), (dh, dw) = out_hw, strides, dilations
    x_nhwc = x.transpose(0, 2, 3, 1)
    (top, bottom), (left, right) = pads
    if top or bottom or left or right:     # padding reads as x_zp (np.pad took 4x as long)
        xp = np.full((n, x.shape[2] + top + bottom, x.shape[3] + left + right, c), x_zp, x.dtype)
        xp[:, top:top + x.shape[2], left:left + x.shape[3]] = x_nhwc
    else:
        xp = x_nhwc
    s0, s1, s2, s3 = xp.strides
    windows = np.lib.stride_tricks.as_strided(xp, (n, oh, ow, kh, kw, c),
                                              (s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3), writeable=False)
    zb = np.broadcast_to(np.asarray(w_zp, np.int32), (cout,))
    cout_g = cout // group
    y = np.empty((n * oh * ow, cout), np.int32)
    for g in range(group):
        rows = windows[..., g * cin_g:(g + 1) * cin_g].reshape(n * oh * ow, kh * kw * cin_g)
        w_g = w[g * cout_g:(g + 1) * cout_g].transpose(2, 3, 1, 0).reshape(kh * kw * cin_g, cout_g)
        zb_g = zb[g * cout_g:(g + 1) * cout_g]
        y[:, g * cout_g:(g + 1) * cout_g] = integer_matmul(rows, np.asarray(x_zp), w_g, zb_g,
                                                           pack_operand(w_g, zb_g))
    return y.reshape(n, oh, ow, cout).transpose(0, 3, 1, 2)


def _conv_zero_points(x, x_zp, w, w_zp, what):
    x_zp = np.zeros((), x.dtype) if x_zp is None else np.asarray(x_zp)
    w_zp = np.zeros((), w.dtype) if w_zp is None else np.asarray(w_zp)
    if x_zp.dtype != x.dtype or w_zp.dtype != w.dtype:
        raise InputError(f"{what}: zero points of types {x_zp.dtype} and {w_zp.dtype} for x of type "
                         f"{x.dtype} and w of type {w.dtype} (each must be its tensor's type)")
    if x_zp.size != 1:
        raise ShapeError(f"{what}: x zero point of shape {x_zp.shape}, expected a scalar")
    if w_zp.size != 1 and w_zp.shape != (w.shape[0],):
        raise ShapeError(f"{what}: w zero point of shape {w_zp.shape} for {w.shape[0]} output "
                         "channels (expected a scalar or one per output channel)")
    return x_zp.reshape(()), (w_zp.reshape(()) if w_zp.size == 1 else w_zp)


def _conv_integer(inputs, attrs, opset):
    what = "ConvInteger"
    x, w = _quantized(inputs[0], what, "x"), _quantized(inputs[1], what, "w")
    x_zp, w_zp = _conv_zero_points(x, inputs[2] if len(inputs) > 2 else None, w,
                                   inputs[3] if len(inputs) > 3 else None, what)
    return [integer_conv(x, x_zp, w, w_zp, attrs, what)]


def _qlinear_conv(inputs, attrs, opset):
    what = "QLinearConv"
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    x, w = _quantized(x, what, "x"), _quantized(w, what, "w")
    x_zp, w_zp = _conv_zero_points(x, x_zp, w, w_zp, what)
    cout = w.shape[0]
    acc = integer_conv(x, x_zp, w, w_zp, attrs, what)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.shape != (cout,):
            raise InputError(f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected "
                             f"int32 of shape ({cout},)")
        acc += bias.reshape((-1,) + (1,) * (acc.ndim - 2))
    y_zp = _scalar(y_zp, what, "y_zero_point")
    if y_zp.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise InputError(f"{what}: y_zero_point of type {y_zp.dtype}; expected uint8 or int8")
    multiplier = (_scale(_scalar(x_s, what, "x_scale"), what) * _scale(_per_column(w_s, cout, what, "w_scale"), what)
                  / _scale(_scalar(y_s, what, "y_scale"), what))
    return [requantize(acc, multiplier.reshape((-1,) + (1,) * (acc.ndim - 2)), y_zp)]


# ------------------------------------------------------------------------- dynamic quantization
def dynamic_quantize(x):
    """(x as uint8, scale, zero point) as DynamicQuantizeLinear: the range [min(x, 0),
    max(x, 0)] mapped onto [0, 255] (scale 1 where it is empty), the zero point rounded half to
    even."""
    x = np.asarray(x, np.float32)
    core = _native()
    if core is not None:
        lo, hi = core.min_max(_stored(x)[0]) if x.size else (np.float32(0), np.float32(0))
    else:
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


def _float_product(acc, a_scale, b_scale, bias, n, what):
    """float32(acc) * float32(a_scale * b_scale) (+ bias), as onnxruntime's integer-to-float
    output (b_scale per tensor or per column of ``n``)."""
    multiplier = _scale(a_scale, what) * _scale(_per_column(b_scale, n, what, "b_scale"), what)
    y = acc.astype(np.float32) * multiplier
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (n,):
            raise InputError(f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected "
                             f"float32 of shape ({n},)")
        y += bias
    return y


def integer_matmul_to_float(a, a_zp, b, b_zp, packed, a_scale, b_scale, bias, what):
    """float32((a - a_zp) @ (b - b_zp)) * float32(a_scale * b_scale) (+ bias), b_scale per tensor
    or per column of a 2-D b: the native kernel's float epilogue where it runs, else
    ``_float_product`` of ``integer_matmul``."""
    core = _native()
    if core is None or b.ndim != 2 or a.ndim == 0 or a.shape[-1] != b.shape[0]:
        n = b.shape[-1] if b.ndim else 0
        return _float_product(integer_matmul(a, a_zp, b, b_zp, packed), a_scale, b_scale, bias, n, what)
    k, n = b.shape
    multiplier = _scale(a_scale, what) * _scale(_per_column(b_scale, n, what, "b_scale"), what)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (n,):
            raise InputError(f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected "
                             f"float32 of shape ({n},)")
    a2 = np.ascontiguousarray(a.reshape(-1, k))
    za = np.ascontiguousarray(np.broadcast_to(np.asarray(a_zp, np.int32), a.shape[:-1] + (1,)).reshape(-1))
    if packed is None:
        packed = core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, n))
    y = np.empty((a2.shape[0], n), np.float32)
    core.qgemm(a2, za, packed, y, np.ascontiguousarray(np.broadcast_to(multiplier, (n,))),
               None if bias is None else np.ascontiguousarray(bias))
    return y.reshape(a.shape[:-1] + (n,))


def _dynamic_quantize_matmul(inputs, attrs, opset):
    """com.microsoft DynamicQuantizeMatMul: A quantized as DynamicQuantizeLinear, then
    MatMulIntegerToFloat."""
    what = "DynamicQuantizeMatMul"
    a = np.asarray(inputs[0])
    if a.dtype != np.float32:
        raise InputError(f"{what}: A of type {a.dtype}, expected float32")
    b = _quantized(inputs[1], what, "B")
    n = b.shape[-1] if b.ndim else 0
    b_zp = inputs[3] if len(inputs) > 3 else None
    b_zp = _operand_zero_point(None if b_zp is None else _per_column(b_zp, n, what, "b_zero_point"),
                               b, what, "B", False)
    a_q, a_scale, a_zp = dynamic_quantize(a)
    return [integer_matmul_to_float(a_q, np.asarray(a_zp), b, b_zp, attrs.get("_b_packed"), a_scale, inputs[2],
                                    inputs[4] if len(inputs) > 4 else None, what)]


def _matmul_integer_to_float(inputs, attrs, opset):
    """com.microsoft MatMulIntegerToFloat: (A - a_zp) @ (B - b_zp) * (a_scale * b_scale) + bias."""
    what = "MatMulIntegerToFloat"
    a, b = _quantized(inputs[0], what, "A"), _quantized(inputs[1], what, "B")
    n = b.shape[-1] if b.ndim else 0
    opt = list(inputs[4:]) + [None] * (7 - len(inputs))
    a_zp = _operand_zero_point(None if opt[0] is None else _scalar(opt[0], what, "a_zero_point"),
                               a, what, "A", True)
    b_zp = _operand_zero_point(None if opt[1] is None else _per_column(opt[1], n, what, "b_zero_point"),
                               b, what, "B", False)
    return [integer_matmul_to_float(a, a_zp, b, b_zp, attrs.get("_b_packed"), _scalar(inputs[2], what, "a_scale"),
                                    inputs[3], opt[2], what)]


def _qconv_check(weight_index):
    """The load-time checks of Conv (spatial rank, attribute lengths, kernel_shape and group
    against a constant weight) for a node whose weight is input ``weight_index``."""
    def check(node, attrs, ctx):
        weight = ctx.constants.get(node.inputs[weight_index])
        _spatial_lengths(node, attrs, ctx, _spatial_rank(node, attrs, ctx, weight))
        if weight is None:
            return
        if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(weight.shape[2:]):
            _fail(ctx, node, f"kernel_shape {attrs['kernel_shape']} does not match its weight's "
                             f"shape {weight.shape}")
        if min(weight.shape) == 0 or weight.shape[0] % attrs.get("group", 1):
            _fail(ctx, node, f"weight {short(node.inputs[weight_index])} of shape {weight.shape} "
                             f"for group {attrs.get('group', 1)}")
    return check


_register("DynamicQuantizeLinear", _dynamic_quantize_linear, Op(outputs=3))
_register("MatMulInteger", _matmul_integer, Op(inputs=(2, 4)))
_register("QLinearMatMul", _qlinear_matmul, Op(inputs=(8, 8)))
_register("ConvInteger", _conv_integer, Op(inputs=(2, 4), attrs=_CONV, check=_qconv_check(1)))
_register("QLinearConv", _qlinear_conv, Op(inputs=(8, 9), attrs=_CONV, check=_qconv_check(3)))
_register("DynamicQuantizeMatMul", _dynamic_quantize_matmul, Op(inputs=(3, 5)), MS)
_register("MatMulIntegerToFloat", _matmul_integer_to_float, Op(inputs=(4, 7)), MS)


# ------------------------------------------------------------------------------ quantized LSTM
def _sigmoid(z):
    return np.float32(1) / (np.float32(1) + np.exp(-z))


def _direction_param(p, d, n_gates, what, name):
    """Direction ``d``'s scale or zero point of a DynamicQuantizeLSTM weight: given per
    direction (n_dir,) or per direction and column (n_dir, 4 * hidden)."""
    p = np.asarray(p)
    if p.ndim == 1:
        return p[d]
    if p.ndim == 2 and p.shape[1] == n_gates:
        return p[d]
    raise ShapeError(f"{what}: {name} of shape {p.shape}, expected (directions,) or (directions, {n_gates})")


def _dynamic_quantize_lstm(inputs, attrs, opset):
    """com.microsoft DynamicQuantizeLSTM: ONNX LSTM (gates i, o, f, c) whose weights W
    (directions, input, 4 * hidden) and R (directions, hidden, 4 * hidden) are u8/s8 with
    scales and zero points per direction or per column; each product quantizes its float
    operand as DynamicQuantizeLinear (X over the whole sequence, h at each step) and is summed
    exactly: z = float(acc_x) * (x_scale * w_scale) + float(acc_h) * (h_scale * r_scale) + Wb + Rb."""
    what = "DynamicQuantizeLSTM"
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and np.size(inputs[i]) else None  # noqa: E731
    x = np.asarray(inputs[0])
    w, r = _quantized(inputs[1], what, "W"), _quantized(inputs[2], what, "R")
    if x.dtype != np.float32 or x.ndim != 3:
        raise InputError(f"{what}: X of type {x.dtype} and shape {x.shape}; expected float32 (time, batch, input)")
    if get(4) is not None:
        raise UnsupportedError(f"{what}: sequence_lens is not supported")
    names = [a.lower() for a in attrs.get("activations", [])]
    if any(n != d for n, d in zip(names, ["sigmoid", "tanh", "tanh"] * 2)) or len(names) not in (0, 3, 6):
        raise UnsupportedError(f"{what}: activations {attrs.get('activations')} (only the default "
                               "Sigmoid, Tanh, Tanh are supported)")
    direction = attrs.get("direction", "forward")
    n_dir = 2 if direction == "bidirectional" else 1
    steps, batch, n_in = x.shape
    hidden = r.shape[1] if r.ndim == 3 else 0
    n_gates = 4 * hidden
    if w.shape != (n_dir, n_in, n_gates) or r.shape != (n_dir, hidden, n_gates) or not hidden \
            or attrs.get("hidden_size", hidden) != hidden:
        raise ShapeError(f"{what}: W of shape {w.shape} and R of shape {r.shape} for X of shape {x.shape} "
                         f"(expected ({n_dir}, {n_in}, 4 * hidden) and ({n_dir}, hidden, 4 * hidden))")
    want = {3: (n_dir, 2 * n_gates), 5: (n_dir, batch, hidden), 6: (n_dir, batch, hidden), 7: (n_dir, 3 * hidden)}
    for i, name in ((3, "B"), (5, "initial_h"), (6, "initial_c"), (7, "P")):
        if get(i) is not None and np.shape(get(i)) != want[i]:
            raise ShapeError(f"{what}: {name} of shape {np.shape(get(i))}, expected {want[i]}")
    clip = attrs.get("clip")
    ys = np.zeros((steps, n_dir, batch, hidden), np.float32)
    h_last = np.zeros((n_dir, batch, hidden), np.float32)
    c_last = np.zeros((n_dir, batch, hidden), np.float32)
    x_q, x_scale, x_zp = dynamic_quantize(x.reshape(-1, n_in))
    for d in range(n_dir):
        w_zp, r_zp = (_zero_point(_direction_param(inputs[k], d, n_gates, what, name), m.dtype, what)
                      for k, name, m in ((9, "W_zero_point", w), (11, "R_zero_point", r)))
        w_scale = _direction_param(inputs[8], d, n_gates, what, "W_scale")
        r_scale = _direction_param(inputs[10], d, n_gates, what, "R_scale")
        w_packed, r_packed = attrs["_packed"][d] if "_packed" in attrs and _native() is not None else (
            pack_operand(w[d], w_zp), pack_operand(r[d], r_zp))
        x_proj = integer_matmul_to_float(x_q, np.asarray(x_zp), w[d], w_zp, w_packed, x_scale, w_scale, None,
                                         what).reshape(steps, batch, n_gates)
        b = get(3)
        bias = np.zeros(n_gates, np.float32) if b is None else (b[d, :n_gates] + b[d, n_gates:]).astype(np.float32)
        h = np.zeros((batch, hidden), np.float32) if get(5) is None else get(5)[d].astype(np.float32)
        c = np.zeros((batch, hidden), np.float32) if get(6) is None else get(6)[d].astype(np.float32)
        p = np.zeros(3 * hidden, np.float32) if get(7) is None else get(7)[d].astype(np.float32)
        reverse = direction == "reverse" or d == 1
        if r_packed is not None:    # the time loop on the native core (qlstm.c)
            r_scale_columns = np.ascontiguousarray(np.broadcast_to(_scale(r_scale, what), (n_gates,)))
            _native().qlstm(x_proj, reverse, r_packed, r_scale_columns, bias,
                            None if get(7) is None else p, float(clip or 0.0),
                            bool(attrs.get("input_forget", 0)), h, c, ys[:, d])
            h_last[d], c_last[d] = h, c
            continue
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h_q, h_scale, h_zp = dynamic_quantize(h)
            z = x_proj[t] + _float_product(integer_matmul(h_q, np.asarray(h_zp), r[d], r_zp, r_packed), h_scale,
                                           r_scale, None, n_gates, what) + bias
            zi, zo, zf, zc = (z[:, k * hidden:(k + 1) * hidden] for k in range(4))
            zi, zf = zi + p[:hidden] * c, zf + p[2 * hidden:] * c
            if clip is not None:
                zi, zf, zc = (np.clip(v, -clip, clip) for v in (zi, zf, zc))
            gi = _sigmoid(zi)
            gf = 1 - gi if attrs.get("input_forget", 0) else _sigmoid(zf)
            c = gf * c + gi * np.tanh(zc)
            zo = zo + p[hidden:2 * hidden] * c
            if clip is not None:
                zo = np.clip(zo, -clip, clip)
            h = (_sigmoid(zo) * np.tanh(c)).astype(np.float32)
            ys[t, d] = h
        h_last[d], c_last[d] = h, c
    return [ys, h_last, c_last]


_LSTM_ATTRS = {"activation_alpha": A("floats"), "activation_beta": A("floats"), "activations": A("strings"),
               "clip": A("float"), "hidden_size": A("int", 1),
               "direction": A("string", choices=("forward", "reverse", "bidirectional")),
               "input_forget": BOOL}
_register("DynamicQuantizeLSTM", _dynamic_quantize_lstm, Op(inputs=(12, 12), optional=3, outputs=3,
                                                            attrs=_LSTM_ATTRS), MS)
