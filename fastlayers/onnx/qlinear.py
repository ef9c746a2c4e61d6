"""Integer products of quantized ONNX graphs: MatMulInteger, QLinearMatMul, ConvInteger,
QLinearConv and the contrib DynamicQuantizeMatMul, MatMulIntegerToFloat and QGemm (semantics in
``quant.py``'s docstring). Sums are exact int32, on the native u8/s8 kernel (``native/qgemm.c``)
where the backend runs on it, else in float64 (exact).

QGemm follows onnxruntime's ``contrib::QGemm::Compute`` (quant_gemm.cc): the int32 sum of
(A - a_zp) (B - b_zp) is added to C (int32, in the output buffer MLAS accumulates into, so it
wraps as int32 does); each column's float32 multiplier is ``ComputeOutputScale``'s
(alpha * a_scale * b_scale[j]) / y_scale, left to right in float32 (no y_scale: no division);
with y_zero_point the output is ``MlasRequantizeOutput``'s (``requantize``), without it
float32(acc) * multiplier (``MLAS_QGEMM_SCALE_BIAS_OUTPUT_PROCESSOR``, ZeroMode, no bias)."""

from __future__ import annotations

import numpy as np

from ..backends.derived import derived
from ..errors import FastlayersError, InputError, ShapeError, UnsupportedError
from .quant import MS, QUANT_RANGES, _scale, dynamic_quantize, integer_kernels
from .records import BOOL, CONV, FLT, Family, fail, short, spatial_lengths, spatial_rank
from .windows import padded_output, pads_2d, spatial

#: This family's operator records (``ops.RECORDS`` gathers the families): the integer products.
FAMILY = Family("quantized products")


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
        raise InputError(f"{what}: {name} zero point of type {zp.dtype}, expected {x.dtype} (the type of {name})")
    if zp.size == 1:
        return zp.reshape(())
    if zp.ndim == 1:
        axis = -2 if per_row else -1
        if x.ndim < 2 or zp.shape[0] != x.shape[axis]:
            raise ShapeError(
                f"{what}: {name} zero point of shape {zp.shape} for {name} of shape "
                f"{x.shape} (expected a scalar or one per {'row' if per_row else 'column'})"
            )
        return zp.reshape(-1, 1) if per_row else zp
    return zp


def _column_zero_points(b_zp, n):
    """B's zero point (a scalar, or one per column) as n int32 values."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(b_zp, np.int32), (1, n)).reshape(n))


def integer_matmul(a, a_zp, b, b_zp, packed=None, requant=None):
    """(a - a_zp) @ (b - b_zp) summed exactly, as int32 (numpy matmul broadcasting; the zero
    points broadcast against their operands): on the native u8/s8 kernel (qgemm.c) for a 2-D
    b, ``packed`` its packed form where the load packed it, else in float64 (exact: products of
    two 9-bit values summed over fewer than 2**37 terms). With ``requant`` (``Requant``), the
    sums requantized to 8 bits as ``requantize`` (in the native kernel's store where it runs)."""
    if a.shape[-1:] != b.shape[-2:-1] if b.ndim >= 2 else a.shape[-1:] != b.shape:
        raise ShapeError(f"integer matmul of shapes {a.shape} and {b.shape}: inner sizes differ")
    core = integer_kernels()
    if core is None or b.ndim != 2 or a.ndim == 0:
        a64 = a.astype(np.float64) - a_zp.astype(np.float64)
        b64 = b.astype(np.float64) - b_zp.astype(np.float64)
        acc = np.matmul(a64, b64).astype(np.int32)
        return acc if requant is None else requant.apply(acc, axis=-1)
    if packed is None:
        packed = core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, b.shape[1]))
    return _qgemm(core, a, a_zp, packed, b.shape[1], requant)


class Requant:
    """onnxruntime's requantization of int32 sums (MlasRequantizeOutput):
    saturate(rint(float32(acc + bias) * multiplier) + y_zp) in y_zp's type (uint8 or int8),
    ``multiplier`` float32 and ``bias`` int32 (or None) one per output channel or scalars."""

    __slots__ = ("multiplier", "bias", "y_zp")

    def __init__(self, multiplier, bias, y_zp):
        self.multiplier, self.bias, self.y_zp = np.asarray(multiplier, np.float32), bias, y_zp

    def columns(self, n):
        """(multiplier, bias) as contiguous vectors of ``n`` values, for the native kernel."""
        m = np.ascontiguousarray(np.broadcast_to(self.multiplier.reshape(-1), (n,)), np.float32)
        b = None if self.bias is None else np.ascontiguousarray(np.broadcast_to(self.bias.reshape(-1), (n,)), np.int32)
        return m, b

    def part(self, j0, j1):
        """The requantization of columns j0:j1 (a group of a grouped convolution)."""

        def cut(v):
            return v if v is None or not np.ndim(v) else v.reshape(-1)[j0:j1]

        return Requant(cut(self.multiplier), cut(self.bias), self.y_zp)

    @property
    def dtype(self):
        """The type of what it stores: y_zp's."""
        return self.y_zp.dtype

    @property
    def zero_point(self) -> int:
        return int(self.y_zp)

    def apply(self, acc, axis):
        """The requantized int32 ``acc`` whose channels lie on ``axis`` (numpy)."""
        shape = [1] * acc.ndim
        shape[axis] = -1
        if self.bias is not None:
            acc = acc + self.bias.reshape(shape)
        return requantize(acc, self.multiplier.reshape(shape) if self.multiplier.ndim else self.multiplier, self.y_zp)


class ToFloat(Requant):
    """The float32 output of int32 sums as onnxruntime's dynamically quantized ConvInteger
    graphs compute it (Add of an int32 bias, Cast, Mul): float32(acc + bias) * multiplier,
    ``bias`` int32 (or None, added with wrap-around) and ``multiplier`` float32, one per
    output channel or scalars."""

    __slots__ = ()

    def __init__(self, multiplier, bias):
        super().__init__(multiplier, bias, None)

    @property
    def dtype(self):
        return np.dtype(np.float32)

    @property
    def zero_point(self) -> int:
        return 0

    def part(self, j0, j1):
        requant = super().part(j0, j1)
        return ToFloat(requant.multiplier, requant.bias)

    def apply(self, acc, axis):
        shape = [1] * acc.ndim
        shape[axis] = -1
        if self.bias is not None:
            acc = acc + self.bias.reshape(shape)  # int32 + int32: numpy wraps around
        multiplier = self.multiplier.reshape(shape) if self.multiplier.ndim else self.multiplier
        return np.multiply(acc.astype(np.float32), multiplier, dtype=np.float32)


def _qgemm(core, a, a_zp, packed, n, requant=None, out=None):
    """(a - a_zp) @ B on the native kernel, B (k, ``n``) less its zero points ``packed``: int32,
    or requantized (``Requant``) into ``out`` (rows of ``n`` values, any row stride) or a new
    array."""
    a2 = np.ascontiguousarray(a.reshape(-1, a.shape[-1]))
    za = np.ascontiguousarray(np.broadcast_to(np.asarray(a_zp, np.int32), a.shape[:-1] + (1,)).reshape(-1))
    if requant is None:
        return core.qgemm(a2, za, packed, np.empty((a2.shape[0], n), np.int32)).reshape(a.shape[:-1] + (n,))
    c = np.empty((a2.shape[0], n), requant.y_zp.dtype) if out is None else out
    multiplier, bias = requant.columns(n)
    core.qgemm(a2, za, packed, c, multiplier, None, bias, int(requant.y_zp))
    return c.reshape(a.shape[:-1] + (n,)) if out is None else c


def pack_operand(b, b_zp):
    """A 2-D B less its zero point packed for the native kernel (``integer_matmul``'s
    ``packed``); None on the numpy reference."""
    core = integer_kernels()
    return None if core is None else core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, b.shape[1]))


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
    """onnxruntime's ``MlasRequantizeOutput``: float32(acc) * multiplier (float32, per tensor or
    broadcasting), clamped to [min - y_zp, max - y_zp] of y_zp's type (NaN to the low end, as
    MAXPS returns its second operand), rounded half to even, plus y_zp; the native kernel's
    8-bit store computes the same (qgemm.c)."""
    lo, hi = QUANT_RANGES[y_zp.dtype]
    z = int(y_zp)
    y = np.multiply(acc.astype(np.float32), multiplier, dtype=np.float32)
    np.fmax(y, np.float32(lo - z), out=y)
    np.fmin(y, np.float32(hi - z), out=y)
    np.rint(y, out=y)
    if z:
        y += np.float32(z)
    return y.astype(y_zp.dtype)


def one_value(p, what, name, dtype=None):
    """A scale or zero point onnxruntime requires to be a scalar or a 1-D tensor of one value
    (``IsScalarOr1ElementVector``), as a 0-d array; checked to be float32 (``dtype`` None) or of
    ``dtype`` (a zero point: its tensor's type)."""
    p = np.asarray(p)
    want = np.dtype(np.float32) if dtype is None else np.dtype(dtype)
    if p.dtype != want:
        kind = "scale" if dtype is None else "zero point"
        extra = "" if dtype is None else " (the type of its tensor)"
        raise InputError(f"{what}: {name} of type {p.dtype}, expected {want}{extra} for a {kind}")
    if not (p.ndim == 0 or p.shape == (1,)):
        raise ShapeError(f"{what}: {name} of shape {p.shape}, expected a scalar or a 1-D tensor of one value")
    return p.reshape(())


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
        raise InputError(
            f"{what}: y_zero_point of type {y_zp.dtype} and shape {y_zp.shape}; expected a uint8 or int8 scalar"
        )
    multiplier = (
        _scale(_scalar(a_s, what, "a_scale"), what)
        * _scale(_per_column(b_s, n, what, "b_scale"), what)
        / _scale(_scalar(y_s, what, "y_scale"), what)
    )
    return [integer_matmul(a, a_zp, b, b_zp, attrs.get("_b_packed"), Requant(multiplier, None, y_zp.reshape(())))]


def integer_conv(x, x_zp, w, w_zp, attrs, what, requant=None):
    """The int32 convolution of (x - x_zp) by (w - w_zp), NCHW / NCL, with ONNX Conv's strides,
    dilations, pads / auto_pad and group (padding reads as x_zp: 0 after the shift); with
    ``requant`` (``Requant``, one value per output channel), requantized to 8 bits."""
    if x.ndim not in (3, 4) or w.ndim != x.ndim:
        raise ShapeError(
            f"{what}: input of shape {x.shape} and weight of shape {w.shape}; 1-D and 2-D "
            "convolutions (rank 3 or 4, equal ranks) are supported"
        )
    one_d = x.ndim == 3
    x4 = x[:, :, None, :] if one_d else x
    w4 = w[:, :, None, :] if one_d else w
    group = attrs.get("group", 1)
    n, c, h, wd = x4.shape
    cout, cin_g, kh, kw = w4.shape
    if c != cin_g * group or cout % group:
        raise ShapeError(
            f"{what}: input of shape {x.shape} does not fit a weight of shape {w.shape} with group={group}"
        )
    if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(w.shape[2:]):
        raise ShapeError(f"{what}: kernel_shape {list(attrs['kernel_shape'])} for a weight of shape {w.shape}")
    nsp = x.ndim - 2
    strides, dilations = spatial(attrs, "strides", nsp, 1), spatial(attrs, "dilations", nsp, 1)
    pads = pads_2d(attrs, x.shape, [kh, kw], strides, dilations, one_d)
    oh, ow = padded_output(what, n * cout, (h, wd), (kh, kw), strides, dilations, pads)
    w_zp = np.asarray(w_zp)
    if integer_kernels() is not None:
        packed = _packed_conv_weights(w, w4, w_zp, group)
        y = _integer_conv_native(x4, x_zp, packed, (cout, kh, kw), group, (oh, ow), strides, dilations, pads, requant)
        return y[:, :, 0, :] if one_d else y
    if w_zp.ndim == 1:
        w_zp = w_zp.reshape(-1, 1, 1, 1)
    x64 = np.pad(x4.astype(np.float64) - np.asarray(x_zp, np.float64), ((0, 0), (0, 0), pads[0], pads[1]))
    w64 = w4.astype(np.float64) - w_zp.astype(np.float64)
    y = np.zeros((n, oh, ow, cout), np.float64)
    (sh, sw), (dh, dw), cout_g = strides, dilations, cout // group
    for i in range(kh):
        for j in range(kw):
            window = x64[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
            window = window.transpose(0, 2, 3, 1)  # (n, oh, ow, c)
            for g in range(group):
                y[..., g * cout_g : (g + 1) * cout_g] += (
                    window[..., g * cin_g : (g + 1) * cin_g] @ w64[g * cout_g : (g + 1) * cout_g, :, i, j].T
                )
    y = y.transpose(0, 3, 1, 2).astype(np.int32)
    y = y if requant is None else requant.apply(y, axis=1)
    return y[:, :, 0, :] if one_d else y


def _packed_conv_weights(w, w_oihw, w_zp, group):
    """Each group's weight laid out (kh kw c/group, c_out/group), less its zero point per output
    channel, packed for the native kernel; computed once per weight array ``w`` (``w_oihw`` is
    ``w``, or its 2-D view of a 1-D weight) and zero-point values."""
    cout, cin_g, kh, kw = w_oihw.shape
    zb = np.ascontiguousarray(np.broadcast_to(np.asarray(w_zp, np.int32), (cout,)))
    cout_g = cout // group

    def pack(_):
        return [
            pack_operand(
                w_oihw[g * cout_g : (g + 1) * cout_g].transpose(2, 3, 1, 0).reshape(kh * kw * cin_g, cout_g),
                zb[g * cout_g : (g + 1) * cout_g],
            )
            for g in range(group)
        ]

    return derived(w, f"qconv:{group}:{zb.tobytes().hex()}", pack)


def _integer_conv_native(x, x_zp, packed, w_shape, group, out_hw, strides, dilations, pads, requant=None):
    """``integer_conv`` (NCHW x) as one native integer product per group: the kernel gathers
    the windows of x (read channels last through its NHWC view, positions outside x reading
    as x_zp) into rows (n oh ow, kh kw c/group) and multiplies them by each group's ``packed``
    weight (``_packed_conv_weights``), requantizing in its store. Returns the NCHW view of an
    NHWC result."""
    core = integer_kernels()
    n, c = x.shape[:2]
    cout, kh, kw = w_shape
    cin_g, cout_g = c // group, cout // group
    oh, ow = out_hw
    x_nhwc = x.transpose(0, 2, 3, 1)
    top_left = (pads[0][0], pads[1][0])
    y = np.empty((n * oh * ow, cout), np.int32 if requant is None else requant.dtype)
    for g in range(group):
        y_g = y[:, g * cout_g : (g + 1) * cout_g]
        if requant is None:
            core.qconv(
                x_nhwc,
                int(x_zp),
                packed[g],
                y_g,
                (kh, kw),
                tuple(strides),
                tuple(dilations),
                top_left,
                (oh, ow),
                g * cin_g,
                cin_g,
            )
        else:  # each group's columns requantized in the kernel's store, straight into y
            multiplier, bias = requant.part(g * cout_g, (g + 1) * cout_g).columns(cout_g)
            core.qconv(
                x_nhwc,
                int(x_zp),
                packed[g],
                y_g,
                (kh, kw),
                tuple(strides),
                tuple(dilations),
                top_left,
                (oh, ow),
                g * cin_g,
                cin_g,
                multiplier,
                None,
                bias,
                requant.zero_point,
            )
    return y.reshape(n, oh, ow, cout).transpose(0, 3, 1, 2)


def _conv_zero_points(x, x_zp, w, w_zp, what):
    x_zp = np.zeros((), x.dtype) if x_zp is None else np.asarray(x_zp)
    w_zp = np.zeros((), w.dtype) if w_zp is None else np.asarray(w_zp)
    if x_zp.dtype != x.dtype or w_zp.dtype != w.dtype:
        raise InputError(
            f"{what}: zero points of types {x_zp.dtype} and {w_zp.dtype} for x of type "
            f"{x.dtype} and w of type {w.dtype} (each must be its tensor's type)"
        )
    if x_zp.size != 1:
        raise ShapeError(f"{what}: x zero point of shape {x_zp.shape}, expected a scalar")
    if w_zp.size != 1 and w_zp.shape != (w.shape[0],):
        raise ShapeError(
            f"{what}: w zero point of shape {w_zp.shape} for {w.shape[0]} output "
            "channels (expected a scalar or one per output channel)"
        )
    return x_zp.reshape(()), (w_zp.reshape(()) if w_zp.size == 1 else w_zp)


def _conv_integer(inputs, attrs, opset):
    what = "ConvInteger"
    x, w = _quantized(inputs[0], what, "x"), _quantized(inputs[1], what, "w")
    x_zp, w_zp = _conv_zero_points(
        x, inputs[2] if len(inputs) > 2 else None, w, inputs[3] if len(inputs) > 3 else None, what
    )
    return [integer_conv(x, x_zp, w, w_zp, attrs, what)]


def _fused_conv_integer(inputs, attrs, opset):
    """fastlayers' ``FusedConvInteger`` (``qfusion.fuse_integer_conv``): what onnxruntime's
    ``quantize_dynamic`` writes for a Conv, ConvInteger -> Add of the bias quantized at run time
    -> Cast to float -> Mul by the scales' product, in one node: inputs x_q, w_q, x_zp, w_zp,
    x_scale, w_scale and the float bias (or None), each step's float32 arithmetic as the graph's
    nodes do it (s = x_scale w_scale; b_q = int32(floor(bias / s)); float32(acc + b_q) s), the
    last two in the native kernel's store."""
    what = "ConvInteger"
    x, w = _quantized(inputs[0], what, "x"), _quantized(inputs[1], what, "w")
    x_zp, w_zp = _conv_zero_points(x, inputs[2], w, inputs[3], what)
    cout = w.shape[0]
    s = np.multiply(
        _scale(_scalar(inputs[4], what, "x_scale"), what),
        _scale(_per_column(inputs[5], cout, what, "w_scale"), what),
        dtype=np.float32,
    )
    bias = inputs[6] if len(inputs) > 6 else None
    b_q = None
    if bias is not None:
        with np.errstate(all="ignore"):  # as the graph's Div, Floor and Cast: inf and NaN pass
            b_q = np.floor(np.divide(bias, s, dtype=np.float32)).astype(np.int32)
    return [integer_conv(x, x_zp, w, w_zp, attrs, what, ToFloat(s, b_q))]


#: fastlayers' own node (made at load by ``qfusion.fuse_integer_conv``, never read from a file).
FAMILY.add("FusedConvInteger", _fused_conv_integer, internal=True)


def _qlinear_conv(inputs, attrs, opset):
    what = "QLinearConv"
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    x, w = _quantized(x, what, "x"), _quantized(w, what, "w")
    x_zp, w_zp = _conv_zero_points(x, x_zp, w, w_zp, what)
    cout = w.shape[0]
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.int32 or bias.shape != (cout,):
            raise InputError(
                f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected int32 of shape ({cout},)"
            )
    y_zp = _scalar(y_zp, what, "y_zero_point")
    if y_zp.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise InputError(f"{what}: y_zero_point of type {y_zp.dtype}; expected uint8 or int8")
    multiplier = (
        _scale(_scalar(x_s, what, "x_scale"), what)
        * _scale(_per_column(w_s, cout, what, "w_scale"), what)
        / _scale(_scalar(y_s, what, "y_scale"), what)
    )
    return [integer_conv(x, x_zp, w, w_zp, attrs, what, Requant(multiplier, bias, y_zp))]


def _float_product(acc, a_scale, b_scale, bias, n, what):
    """float32(acc) * float32(a_scale * b_scale) (+ bias), as onnxruntime's integer-to-float
    output (b_scale per tensor or per column of ``n``)."""
    multiplier = _scale(a_scale, what) * _scale(_per_column(b_scale, n, what, "b_scale"), what)
    y = acc.astype(np.float32) * multiplier
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (n,):
            raise InputError(
                f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected float32 of shape ({n},)"
            )
        y += bias
    return y


def integer_matmul_to_float(a, a_zp, b, b_zp, packed, a_scale, b_scale, bias, what):
    """float32((a - a_zp) @ (b - b_zp)) * float32(a_scale * b_scale) (+ bias), b_scale per tensor
    or per column of a 2-D b: the native kernel's float epilogue where it runs, else
    ``_float_product`` of ``integer_matmul``."""
    core = integer_kernels()
    if core is None or b.ndim != 2 or a.ndim == 0 or a.shape[-1] != b.shape[0]:
        n = b.shape[-1] if b.ndim else 0
        return _float_product(integer_matmul(a, a_zp, b, b_zp, packed), a_scale, b_scale, bias, n, what)
    n = b.shape[1]
    multiplier = _scale(a_scale, what) * _scale(_per_column(b_scale, n, what, "b_scale"), what)
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (n,):
            raise InputError(
                f"{what}: bias of type {bias.dtype} and shape {bias.shape}; expected float32 of shape ({n},)"
            )
    if packed is None:
        packed = core.qpack(np.ascontiguousarray(b), _column_zero_points(b_zp, n))
    columns = (
        np.full(n, multiplier, np.float32)
        if multiplier.ndim == 0
        else np.ascontiguousarray(np.broadcast_to(multiplier, (n,)))
    )
    return native_product_to_float(core, a, a_zp, packed, n, columns, bias)


def native_product_to_float(core, a, a_zp, packed, n, columns, bias):
    """float32((a - a_zp) @ B) * columns (+ bias) on the native kernel: ``packed`` B (n
    columns, ``core.qpack``), ``columns`` the float32 multiplier of each column, ``a_zp`` a
    scalar or one zero point per row of ``a``."""
    k = a.shape[-1]
    a2 = np.ascontiguousarray(a.reshape(-1, k))
    a_zp = np.asarray(a_zp)
    za = (
        np.full(a2.shape[0], int(a_zp), np.int32)
        if a_zp.ndim == 0
        else np.ascontiguousarray(np.broadcast_to(a_zp.astype(np.int32), a.shape[:-1] + (1,)).reshape(-1))
    )
    y = np.empty((a2.shape[0], n), np.float32)
    core.qgemm(a2, za, packed, y, columns, None if bias is None else np.ascontiguousarray(bias))
    return y.reshape(a.shape[:-1] + (n,))


def dynamic_product_to_float(core, a, packed, n, b_columns, bias):
    """float32(q(a) @ B) * (b_columns * a's scale) (+ bias), q being DynamicQuantizeLinear over
    all of float32 ``a`` (..., k): ``packed`` B (n columns, ``core.qpack``), ``b_columns`` B's
    float32 scale per column. One native call (``dynamic_qgemm``: the quantized rows never
    become an array) where ``a`` has values, else ``dynamic_quantize`` and the product."""
    if a.size:
        return core.dynamic_qgemm(a if a.flags.c_contiguous else np.ascontiguousarray(a), packed, b_columns, bias)
    a_q, a_scale, a_zp = dynamic_quantize(a)
    return native_product_to_float(core, a_q, a_zp, packed, n, b_columns * a_scale, bias)


def dynamic_matmul_constants(inputs, attrs):
    """(packed B, B's float32 scale per column, bias or None) of a DynamicQuantizeMatMul node
    whose B was packed at load (``_b_packed``) and whose B, scale, zero point and bias are
    constants; None otherwise, or where the general form would reject them."""
    packed, b = attrs.get("_b_packed"), inputs[1] if len(inputs) > 1 else None
    constant = all(v is None or isinstance(v, np.ndarray) for v in inputs[1:])
    if (
        packed is None
        or not constant
        or not isinstance(b, np.ndarray)
        or b.ndim != 2
        or len(inputs) < 3
        or inputs[2] is None
    ):
        return None
    n = b.shape[1]
    try:
        b_scale = _scale(_per_column(inputs[2], n, "DynamicQuantizeMatMul", "b_scale"), "DynamicQuantizeMatMul")
    except FastlayersError:
        return None  # the general form raises it
    bias = inputs[4] if len(inputs) > 4 else None
    return (
        packed,
        np.ascontiguousarray(np.broadcast_to(b_scale, (n,))),
        None if bias is None else np.ascontiguousarray(bias),
    )


def bind_dynamic_quantize_matmul(inputs, attrs, opset):
    """DynamicQuantizeMatMul bound on its constant B (packed at load: ``_b_packed``), B scale,
    zero point and bias, for the compiled plan (its record's ``bind``): B's scales as one float32 per
    column and the bias checked once; each input shape checked by the general form at its
    first call, later calls quantize A and run the native product. None where one of them is
    computed by the graph or the native core does not run."""
    bound = dynamic_matmul_constants(inputs, attrs)
    if bound is None:
        return None
    packed, b_columns, bias = bound
    general, n = _dynamic_quantize_matmul, b_columns.shape[0]
    checked: set = set()

    def run(inputs, attrs, opset):
        a = inputs[0]
        core = integer_kernels()
        if core is None or type(a) is not np.ndarray or (a.shape, a.dtype.str) not in checked:
            out = general(inputs, attrs, opset)
            if core is not None and type(a) is np.ndarray:
                if len(checked) >= 64:
                    checked.clear()
                checked.add((a.shape, a.dtype.str))
            return out
        return [dynamic_product_to_float(core, a, packed, n, b_columns, bias)]

    return run


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
    b_zp = _operand_zero_point(
        None if b_zp is None else _per_column(b_zp, n, what, "b_zero_point"), b, what, "B", False
    )
    a_q, a_scale, a_zp = dynamic_quantize(a)
    return [
        integer_matmul_to_float(
            a_q,
            np.asarray(a_zp),
            b,
            b_zp,
            attrs.get("_b_packed"),
            a_scale,
            inputs[2],
            inputs[4] if len(inputs) > 4 else None,
            what,
        )
    ]


def _matmul_integer_to_float(inputs, attrs, opset):
    """com.microsoft MatMulIntegerToFloat: (A - a_zp) @ (B - b_zp) * (a_scale * b_scale) + bias."""
    what = "MatMulIntegerToFloat"
    a, b = _quantized(inputs[0], what, "A"), _quantized(inputs[1], what, "B")
    n = b.shape[-1] if b.ndim else 0
    opt = list(inputs[4:]) + [None] * (7 - len(inputs))
    a_zp = _operand_zero_point(None if opt[0] is None else _scalar(opt[0], what, "a_zero_point"), a, what, "A", True)
    b_zp = _operand_zero_point(
        None if opt[1] is None else _per_column(opt[1], n, what, "b_zero_point"), b, what, "B", False
    )
    return [
        integer_matmul_to_float(
            a, a_zp, b, b_zp, attrs.get("_b_packed"), _scalar(inputs[2], what, "a_scale"), inputs[3], opt[2], what
        )
    ]


def _qgemm_columns(b_scale, b_zp, b, n, what):
    """QGemm's B scale and zero point: each a scalar, a 1-D tensor of one value or of ``n``
    (one per column), both of the same shape (``QGemm::CheckInputs``); as float32 and B's type,
    0-d or (n,)."""
    b_scale, b_zp = np.asarray(b_scale), np.asarray(b_zp)
    if b_scale.dtype != np.float32:
        raise InputError(f"{what}: b_scale of type {b_scale.dtype}, expected float32")
    if b_zp.dtype != b.dtype:
        raise InputError(f"{what}: b_zero_point of type {b_zp.dtype}, expected {b.dtype} (the type of B)")
    for p, name in ((b_scale, "b_scale"), (b_zp, "b_zero_point")):
        if not (p.ndim == 0 or p.shape in ((1,), (n,))):
            raise ShapeError(
                f"{what}: {name} of shape {p.shape}, expected a scalar, (1,) or ({n},) "
                f"(one per column of the {n} columns of the output)"
            )
    if b_scale.shape != b_zp.shape:
        raise ShapeError(
            f"{what}: b_scale of shape {b_scale.shape} and b_zero_point of shape "
            f"{b_zp.shape}; onnxruntime requires both of the same shape"
        )
    if b_scale.size == 1:
        return b_scale.reshape(()), b_zp.reshape(())
    return b_scale, b_zp


def _qgemm_bias(c, m, n, what):
    """QGemm's C, checked: int32, of a shape onnxruntime broadcasts to (M, N) (one value, (N,),
    (1, N), (M, 1) or (M, N); ``GemmHelper::IsValidBroadcast``)."""
    c = np.asarray(c)
    if c.dtype != np.int32:
        raise InputError(f"{what}: C of type {c.dtype}, expected int32")
    ok = c.ndim <= 2 and (c.size == 1 or c.shape in ((n,), (1, n), (m, 1), (m, n)))
    if not ok:
        raise ShapeError(
            f"{what}: C of shape {c.shape} for an output of shape ({m}, {n}); expected one "
            f"value, ({n},), (1, {n}), ({m}, 1) or ({m}, {n})"
        )
    return c


def _qgemm_op(inputs, attrs, opset):
    """com.microsoft QGemm: alpha * (A - a_zp) @ (B - b_zp) (A, B transposed by transA / transB)
    plus an int32 C, requantized to y_scale / y_zero_point or, without y_zero_point, float32
    (see the module docstring for onnxruntime's exact arithmetic)."""
    what = "QGemm"
    opt = list(inputs[6:]) + [None] * (9 - len(inputs))
    c, y_scale, y_zp = opt[:3]
    a, b = _quantized(inputs[0], what, "A"), _quantized(inputs[3], what, "B")
    if a.dtype == np.int8 and b.dtype != np.int8:
        raise UnsupportedError(
            f"{what}: A of type int8 with B of type {b.dtype}; int8 A takes int8 B (onnxruntime has no such kernel)"
        )
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"{what}: A of shape {a.shape} and B of shape {b.shape}; both must have rank 2")
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    (k, m), (n, k_b) = (a.shape if trans_a else a.shape[::-1]), (b.shape if trans_b else b.shape[::-1])
    if k != k_b:
        raise ShapeError(
            f"{what}: A of shape {a.shape} (transA={int(trans_a)}) has K={k} but B of shape "
            f"{b.shape} (transB={int(trans_b)}) has K={k_b}"
        )
    if k == 0:
        raise ShapeError(
            f"{what}: A of shape {a.shape} and B of shape {b.shape} have K=0 (onnxruntime's result is undefined there)"
        )
    a_scale = one_value(inputs[1], what, "a_scale")
    a_zp = one_value(inputs[2], what, "a_zero_point", a.dtype)
    b_scale, b_zp = _qgemm_columns(inputs[4], inputs[5], b, n, what)
    if c is not None:
        c = _qgemm_bias(c, m, n, what)
    if y_zp is not None:
        y_zp = np.asarray(y_zp)
        if y_zp.dtype != a.dtype:
            raise UnsupportedError(
                f"{what}: y_zero_point of type {y_zp.dtype} for A of type {a.dtype}; "
                "the output has A's type (onnxruntime's kernels)"
            )
        y_zp = one_value(y_zp, what, "y_zero_point", a.dtype)
    # ComputeOutputScale: (alpha * a_scale * b_scale[j]) / y_scale, left to right in float32
    multiplier = np.float32(attrs.get("alpha", 1.0)) * a_scale * b_scale
    if y_scale is not None:
        multiplier = multiplier / one_value(y_scale, what, "y_scale")
    if m == 0 or n == 0:
        return [np.zeros((m, n), np.float32 if y_zp is None else y_zp.dtype)]
    a_m, b_m = (a.T if trans_a else a), (b.T if trans_b else b)
    core, packed = integer_kernels(), None
    if core is not None:  # B less its zero points packed once per B array and zero points
        zb = _column_zero_points(b_zp, n)
        packed = derived(
            b,
            f"qgemm:{int(trans_b)}:{zb.tobytes().hex()}",
            lambda w: core.qpack(np.ascontiguousarray(w.T if trans_b else w), zb),
        )
    per_column_c = c is None or c.size == 1 or c.shape in ((n,), (1, n))
    if y_zp is not None and per_column_c:  # C added and requantized in the product's store
        c_cols = None if c is None else np.broadcast_to(c.reshape(-1), (n,))
        return [integer_matmul(a_m, a_zp, b_m, b_zp, packed, Requant(multiplier, c_cols, y_zp))]
    acc = integer_matmul(a_m, a_zp, b_m, b_zp, packed)
    if c is not None:
        acc = acc + c  # int32, wrapping as MLAS's accumulation into C
    if y_zp is None:
        return [np.multiply(acc.astype(np.float32), multiplier, dtype=np.float32)]
    return [requantize(acc, multiplier, y_zp)]


def _qconv_check(weight_index):
    """The load-time checks of Conv (spatial rank, attribute lengths, kernel_shape and group
    against a constant weight) for a node whose weight is input ``weight_index``."""

    def check(node, attrs, ctx):
        weight = ctx.constants.get(node.inputs[weight_index])
        spatial_lengths(node, attrs, ctx, spatial_rank(node, attrs, ctx, weight))
        if weight is None:
            return
        if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(weight.shape[2:]):
            fail(ctx, node, f"kernel_shape {attrs['kernel_shape']} does not match its weight's shape {weight.shape}")
        if min(weight.shape) == 0 or weight.shape[0] % attrs.get("group", 1):
            fail(
                ctx,
                node,
                f"weight {short(node.inputs[weight_index])} of shape {weight.shape} for group {attrs.get('group', 1)}",
            )

    return check


FAMILY.add("MatMulInteger", _matmul_integer, inputs=(2, 4))


FAMILY.add("QLinearMatMul", _qlinear_matmul, inputs=(8, 8))


FAMILY.add("ConvInteger", _conv_integer, inputs=(2, 4), attrs=CONV, check=_qconv_check(1))


FAMILY.add("QLinearConv", _qlinear_conv, inputs=(8, 9), attrs=CONV, check=_qconv_check(3))


FAMILY.add(
    "DynamicQuantizeMatMul",
    _dynamic_quantize_matmul,
    inputs=(3, 5),
    domain=MS,
    bind=bind_dynamic_quantize_matmul,
)


FAMILY.add("MatMulIntegerToFloat", _matmul_integer_to_float, inputs=(4, 7), domain=MS)


FAMILY.add("QGemm", _qgemm_op, inputs=(6, 9), attrs={"transA": BOOL, "transB": BOOL, "alpha": FLT}, domain=MS)
