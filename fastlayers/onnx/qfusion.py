"""Load-time passes of quantized graphs (``optimize``, called by ``importer.from_model``):
QuantizeLinear -> DequantizeLinear pairs on per-tensor 8-bit constants become one
``FusedQuantizeDequantize`` node, ``quantize_dynamic``'s MatMulInteger -> Cast -> Mul (-> Add)
chains one MatMulIntegerToFloat (with their DynamicQuantizeLinear, one DynamicQuantizeMatMul),
its ConvInteger -> (bias Add) -> Cast -> Mul chains one FusedConvInteger, and the constant weights of integer products are packed once
for the native kernel."""

from __future__ import annotations

import numpy as np

from ..backends.integer import INTEGER_KERNELS
from .qlinear import _column_zero_points
from .qlstm import _pack_lstm
from .quant import MS, QUANT_RANGES, _dequantize_linear, _elementwise, _quantize_linear, integer_kernels
from .records import Family

#: Integer products whose B may be a constant packed at load: op -> (B input, B zero point input).
_PACKABLE = {
    "MatMulInteger": (1, 3),
    "QLinearMatMul": (3, 5),
    f"{MS}::MatMulIntegerToFloat": (1, 5),
    f"{MS}::DynamicQuantizeMatMul": (1, 3),
}


def _per_tensor_8bit(constants, scale_name, zp_name):
    """(scale, zero point) where both are constants, per tensor, float32 and 8-bit; else None."""
    scale = constants.get(scale_name)
    zp = constants.get(zp_name) if zp_name else np.zeros((), np.uint8)
    if (
        scale is None
        or zp is None
        or scale.size != 1
        or zp.size != 1
        or scale.dtype != np.float32
        or zp.dtype not in (np.uint8, np.int8)
    ):
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
        if (
            dq is None
            or readers.get(node.outputs[0]) != 1
            or node.outputs[0] in outputs
            or node.attrs.get("block_size")
            or dq.attrs.get("output_dtype", 0) not in (0, 1)
        ):
            continue
        q_params = _per_tensor_8bit(constants, node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else "")
        dq_params = _per_tensor_8bit(constants, dq.inputs[1], dq.inputs[2] if len(dq.inputs) > 2 else "")
        if (
            q_params is None
            or dq_params is None
            or not all(a.dtype == b.dtype and a == b for a, b in zip(q_params, dq_params))
        ):
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
    core = integer_kernels()
    if core is None or x.dtype != np.float32:
        return _dequantize_linear([_quantize_linear(inputs, {}, opset)[0], scale, zp], {}, opset)
    lo, hi = QUANT_RANGES[zp.dtype]
    return [_elementwise(x, lambda m: core.fake_quantize(m, float(scale), float(zp), lo, hi))]


#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("quantized fusions")
FAMILY.add("FusedQuantizeDequantize", _fused_quantize_dequantize, internal=True)


def _graph_index(nodes, outputs):
    """(readers: value -> the nodes reading it, producer: value -> the node writing it,
    ``only_reader(name, op_type)``: the one node reading ``name`` where it is of ``op_type``
    and ``name`` is no graph output, else None) of a graph's ``nodes``."""
    readers: dict = {}
    for node in nodes:
        for i in node.inputs:
            readers.setdefault(i, []).append(node)
    producer = {o: n for n in nodes for o in n.outputs}

    def only_reader(name, op_type):
        found = readers.get(name, [])
        ok = len(found) == 1 and found[0].op_type == op_type and name not in outputs
        return found[0] if ok else None

    return readers, producer, only_reader


def fuse_integer_matmul(nodes, constants, outputs) -> list:
    """What ``quantize_dynamic`` writes for a MatMul on constant weights, MatMulInteger on a
    DynamicQuantizeLinear's outputs -> Cast to float -> Mul by the product of the two scales
    (-> Add of a constant bias), each value read only by the next -> one
    ``com.microsoft::MatMulIntegerToFloat`` node (the same float32 operations in one call), or,
    where nothing else reads the DynamicQuantizeLinear's outputs, one
    ``com.microsoft::DynamicQuantizeMatMul`` node per such product that quantizes its float
    input itself (the same bytes, scale and zero point: several heads on one quantized input
    each quantize it again)."""
    readers, producer, only_reader = _graph_index(nodes, outputs)

    removed = set()
    fused: dict[int, list] = {}  # id of a DynamicQuantizeLinear -> (its product, the scales' Mul, B's scale, zp, bias)
    for mm in nodes:
        if mm.op_type != "MatMulInteger" or len(mm.inputs) < 3 or mm.inputs[1] not in constants:
            continue
        dql = producer.get(mm.inputs[0])
        if (
            dql is None
            or dql.op_type != "DynamicQuantizeLinear"
            or dql.outputs[0] != mm.inputs[0]
            or dql.outputs[2] != mm.inputs[2]
        ):
            continue
        cast = only_reader(mm.outputs[0], "Cast")
        mul = cast and cast.attrs.get("to") == 1 and only_reader(cast.outputs[0], "Mul")
        if not mul:
            continue
        scales = producer.get(mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0])
        if (
            scales is None
            or scales.op_type != "Mul"
            or len(readers.get(scales.outputs[0], [])) != 1
            or scales.outputs[0] in outputs
            or dql.outputs[1] not in scales.inputs
        ):
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
        b_zp = mm.inputs[3] if len(mm.inputs) > 3 else ""
        fused.setdefault(id(dql), [dql]).append((mm, scales, b_scale, b_zp, bias))
        mm.outputs, mm.attrs = list(last.outputs), {}
        removed.update(id(n) for n in (cast, mul, scales) + ((add,) if last is add else ()))
    for dql, *products in fused.values():
        mms = {id(mm) for mm, *_ in products}
        scale_muls = {id(scales) for _, scales, *_ in products}
        # the DynamicQuantizeLinear read by these products alone: each quantizes its input itself
        alone = not set(dql.outputs) & set(outputs) and all(
            {id(r) for r in readers.get(name, [])} == want and len(readers.get(name, [])) == len(want)
            for name, want in zip(dql.outputs, (mms, scale_muls, mms))
        )
        for mm, _, b_scale, b_zp, bias in products:
            if alone:
                mm.op_type = f"{MS}::DynamicQuantizeMatMul"
                mm.inputs = [dql.inputs[0], mm.inputs[1], b_scale, b_zp, bias]
            else:
                mm.op_type = f"{MS}::MatMulIntegerToFloat"
                mm.inputs = [mm.inputs[0], mm.inputs[1], dql.outputs[1], b_scale, mm.inputs[2], b_zp, bias]
        if alone:
            removed.add(id(dql))
    return [n for n in nodes if id(n) not in removed]


def fuse_integer_conv(nodes, constants, outputs) -> list:
    """What ``quantize_dynamic`` writes for a Conv on constant weights with a per-tensor weight
    scale: ConvInteger on a DynamicQuantizeLinear's outputs -> [Add of Reshape(Cast(Floor(Div(
    bias, s)), int32))] -> Cast to float -> Mul by s, s = x_scale * w_scale (a Mul node each
    time it is used), each value read only by the next -> one ``FusedConvInteger`` node
    (``qlinear._fused_conv_integer``: the same int32 and float32 operations, the bias added and
    the scale applied in the native kernel's store instead of three passes over the output)."""
    readers, producer, only_reader = _graph_index(nodes, outputs)

    def scales_of(name, dql, w_scale):
        """The Mul node computing ``name`` = dql's scale * w_scale, or None."""
        mul = producer.get(name)
        if (
            mul is None
            or mul.op_type != "Mul"
            or name in outputs
            or sorted(mul.inputs) != sorted([dql.outputs[1], w_scale])
        ):
            return None
        return mul

    removed = set()
    for conv in nodes:
        if conv.op_type != "ConvInteger" or len(conv.inputs) < 3 or conv.inputs[1] not in constants:
            continue
        dql = producer.get(conv.inputs[0])
        w_zp = conv.inputs[3] if len(conv.inputs) > 3 else ""
        if (
            dql is None
            or dql.op_type != "DynamicQuantizeLinear"
            or dql.outputs[0] != conv.inputs[0]
            or dql.outputs[2] != conv.inputs[2]
            or (w_zp and w_zp not in constants)
        ):
            continue
        chain, bias, s_div = [], "", None
        add = only_reader(conv.outputs[0], "Add")
        if add is not None:  # the bias, quantized at run time by the scales' product
            other = add.inputs[1] if add.inputs[0] == conv.outputs[0] else add.inputs[0]
            reshape = producer.get(other)
            cast = (
                reshape
                and reshape.op_type == "Reshape"
                and only_reader(reshape.inputs[0], "Reshape")
                and producer.get(reshape.inputs[0])
            )
            floor = (
                cast
                and cast.op_type == "Cast"
                and cast.attrs.get("to") == 6
                and only_reader(cast.inputs[0], "Cast")
                and producer.get(cast.inputs[0])
            )
            div = (
                floor
                and floor.op_type == "Floor"
                and only_reader(floor.inputs[0], "Floor")
                and producer.get(floor.inputs[0])
            )
            if not (div and div.op_type == "Div" and len(readers.get(other, [])) == 1 and other not in outputs):
                continue
            b = constants.get(div.inputs[0])
            cout = constants[conv.inputs[1]].shape[0]
            shape = constants.get(reshape.inputs[1])
            want = [1, cout] + [1] * (constants[conv.inputs[1]].ndim - 2)
            if b is None or b.dtype != np.float32 or b.shape != (cout,) or _reshaped(cout, shape) != want:
                continue
            s_div, bias = div.inputs[1], div.inputs[0]
            chain += [add, reshape, cast, floor, div]
            last = add
        else:
            last = conv
        to_float = only_reader(last.outputs[0], "Cast")
        mul = to_float and to_float.attrs.get("to") == 1 and only_reader(to_float.outputs[0], "Mul")
        if not mul:
            continue
        s_mul = mul.inputs[1] if mul.inputs[0] == to_float.outputs[0] else mul.inputs[0]
        s_node = producer.get(s_mul)
        if s_node is None or s_node.op_type != "Mul" or dql.outputs[1] not in s_node.inputs:
            continue
        w_scale = s_node.inputs[1] if s_node.inputs[0] == dql.outputs[1] else s_node.inputs[0]
        w_scale_value = constants.get(w_scale)
        if w_scale_value is None or w_scale_value.size != 1 or w_scale_value.dtype != np.float32:
            continue  # per-channel scales broadcast along another axis of the Mul: left alone
        scale_nodes = {id(s_node): s_node}
        if s_div is not None:
            div_scales = scales_of(s_div, dql, w_scale)
            if div_scales is None:
                continue
            scale_nodes[id(div_scales)] = div_scales
        # a scales' Mul goes only where the nodes fused here are all that read it
        fused = {id(n) for n in chain} | {id(to_float), id(mul)}
        if any(
            n.outputs[0] in outputs or any(id(r) not in fused for r in readers.get(n.outputs[0], []))
            for n in scale_nodes.values()
        ):
            continue
        conv.op_type = "FusedConvInteger"
        conv.inputs = [conv.inputs[0], conv.inputs[1], conv.inputs[2], w_zp, dql.outputs[1], w_scale, bias]
        conv.outputs = list(mul.outputs)
        removed.update(fused | set(scale_nodes))
    return [n for n in nodes if id(n) not in removed]


def _reshaped(count, shape) -> list | None:
    """The dimensions a Reshape to the constant ``shape`` (no 0 entries) gives a 1-D tensor of
    ``count`` values, or None."""
    if shape is None or shape.ndim != 1 or shape.dtype != np.int64 or 0 in shape.tolist():
        return None
    try:
        return list(np.empty(count, np.int8).reshape(shape.tolist()).shape)
    except ValueError:
        return None


def optimize(nodes, constants, outputs) -> list:
    """The load-time passes of quantized graphs (``onnx.from_model``): QDQ pairs and dynamic
    integer matmuls fused, the constant weights of integer products packed."""
    nodes = fuse_integer_matmul(fuse_quantize_dequantize(nodes, constants, outputs), constants, outputs)
    nodes = fuse_integer_conv(nodes, constants, outputs)
    return pack_weights(nodes, constants)


def pack_weights(nodes, constants) -> list:
    """Give each integer product whose B (2-D uint8/int8) and B zero point are constants its B
    packed for the native kernel, once (attribute ``_b_packed``), whichever backend is active
    at load: a backend with integer kernels then finds it packed."""
    for node in nodes:
        if node.op_type == f"{MS}::DynamicQuantizeLSTM":
            _pack_lstm(node, constants, INTEGER_KERNELS)
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
            continue  # the operator raises its error when it runs
        node.attrs = dict(
            node.attrs,
            _b_packed=INTEGER_KERNELS.qpack(np.ascontiguousarray(b), _column_zero_points(zp.reshape(-1), b.shape[1])),
        )
    return nodes
