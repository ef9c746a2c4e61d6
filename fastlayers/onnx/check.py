"""Validation of an ONNX graph at load, before anything is folded, allocated or run.

``check_graph(graph, where, opset)`` is called by ``onnx.from_model`` on the graph
``proto`` read, and returns its nodes in an order that runs (each node after the nodes
whose outputs it reads), their attributes checked and cleaned. It refuses, naming the file, the
node and the attribute or value concerned:

- the graph: graph inputs without a name or named twice, a value written by two nodes (or by a
  node and a graph input / initializer), a node input that nothing defines, a cycle, a graph
  output that nothing defines (``ModelFileError``);
- each node, by the table ``OPS`` below (one entry per operator fastlayers implements): the
  number of inputs, an empty input name ("" = omitted) where the operator requires the input,
  an output beyond those the operator computes that something reads (``UnsupportedError``:
  MaxPool's Indices, BatchNormalization's training statistics), and each attribute the
  operator reads: its type (int, float, string, ints, floats, strings, tensor), its range
  (strides, dilations, kernel sizes and groups >= 1, pads >= 0, flags 0 or 1, axes and
  permutations within ``limits.ONNX_MAX_RANK``, names from the operator's list), required attributes, and
  the cross-checks of the kernels' operators (a convolution's weight rank, kernel_shape and
  group against its constant weight, a recurrent node's hidden_size against its weights).

- control flow (If, Loop, Scan): each subgraph is checked as a graph of its own whose values may
  also come from the graphs enclosing it; the names it reads from them (its captures) are
  appended to the node's inputs (after its ``_formal`` own inputs), so that ordering and
  pruning see them; its counts of inputs and outputs must fit the node's (``ModelFileError``
  naming the node and the subgraph).

Attributes the table does not list are dropped (fastlayers' own node attributes start with
"_", and a file cannot set them); unknown operators were refused before (one error listing
them all). What depends on the inputs of a call (shapes, index values) is checked when the
node runs, by the operator, as an ``InputError`` naming the node.
"""

from __future__ import annotations

import numpy as np

from .. import limits
from ..errors import ModelFileError, ShapeError, UnsupportedError
from .indexing import einsum_terms
from .proto import Graph, NodeProto
from .tensors import DTYPES

INT, FLOAT, STRING, INTS, FLOATS, STRINGS, TENSOR, GRAPH = (
    "int",
    "float",
    "string",
    "ints",
    "floats",
    "strings",
    "tensor",
    "graph",
)


def short(name, limit: int = 60) -> str:
    """``repr(name)`` cut to about ``limit`` characters, for error messages."""
    text = repr(name)
    return text if len(text) <= limit else text[:limit] + "...'"


class A:
    """An attribute rule: its kind, the range of its values (each element for lists), the
    values it may take (``choices``) and, for lists, a fixed length."""

    __slots__ = ("kind", "lo", "hi", "choices", "length")

    def __init__(self, kind, lo=None, hi=None, choices=None, length=None):
        self.kind, self.lo, self.hi, self.choices, self.length = kind, lo, hi, choices, length


class Op:
    """An operator's rules: inputs (min, max; max None: any number), the first input position
    that may be omitted (""; None: none may be), how many outputs fastlayers computes (None:
    as many as the node declares), attribute rules, the attributes it requires, and a
    cross-check ``check(node, attrs, ctx)``."""

    __slots__ = ("inputs", "optional", "outputs", "attrs", "required", "check")

    def __init__(self, inputs=(1, 1), optional=-1, outputs=1, attrs=None, required=(), check=None):
        self.inputs, self.outputs = inputs, outputs
        self.optional = inputs[0] if optional == -1 else optional
        self.attrs, self.required, self.check = attrs or {}, required, check


BOOL = A(INT, 0, 1)
AXIS = A(INT, -2 * limits.ONNX_MAX_RANK, 2 * limits.ONNX_MAX_RANK)
AXES = A(INTS, -2 * limits.ONNX_MAX_RANK, 2 * limits.ONNX_MAX_RANK)
FLT = A(FLOAT)
POS = A(INT, 1, limits.ONNX_MAX_GEOMETRY)
POSS = A(INTS, 1, limits.ONNX_MAX_GEOMETRY)
NONNEG = A(INTS, 0, limits.ONNX_MAX_GEOMETRY)
AUTO_PAD = A(STRING, choices=("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))


class Context:
    """What a cross-check may read: the file, the opset and the initializers."""

    __slots__ = ("where", "opset", "constants")

    def __init__(self, where, opset, constants):
        self.where, self.opset, self.constants = where, opset, constants


def qualified(node) -> str:
    """The key of a node's operator in ``OPS``: its op_type in the default domain,
    ``domain::op_type`` in another (``onnx.from_model`` refuses op types holding ":", so a
    default-domain node cannot name a contrib operator)."""
    return node.op_type if not node.domain else f"{node.domain}::{node.op_type}"


def _node_text(node) -> str:
    label = node.name or (node.outputs[0] if node.outputs else "")
    return f"node {short(label)} ({node.op_type})"


def _fail(ctx, node, what, unsupported=False):
    cls = UnsupportedError if unsupported else ModelFileError
    raise cls(f"{ctx.where}: {_node_text(node)}: {what}")


# ------------------------------------------------------------------------------ cross-checks
def _spatial_lengths(node, attrs, ctx, n, names=("strides", "dilations", "kernel_shape")):
    for key in names:
        if key in attrs and len(attrs[key]) not in (0, n):
            _fail(ctx, node, f"attribute {key!r} has {len(attrs[key])} values for {n} spatial axes")
    for key in ("pads",):
        if key in attrs and len(attrs[key]) not in (0, 2 * n):
            _fail(ctx, node, f"attribute 'pads' has {len(attrs[key])} values for {n} spatial axes (expected {2 * n})")
    for key in ("output_padding", "output_shape"):
        if key in attrs and len(attrs[key]) not in (0, n):
            _fail(ctx, node, f"attribute {key!r} has {len(attrs[key])} values for {n} spatial axes")


def _spatial_rank(node, attrs, ctx, weight):
    """The number of spatial axes (1 or 2) the node's attributes or constant weight give."""
    if weight is not None:
        if weight.ndim < 3:
            _fail(
                ctx,
                node,
                f"weight {short(node.inputs[1])} has shape {weight.shape}: a "
                "convolution weight has rank 3 (1-D) or 4 (2-D)",
            )
        n = weight.ndim - 2
    else:
        lengths = [len(attrs[k]) for k in ("kernel_shape", "strides", "dilations") if attrs.get(k)]
        lengths += [len(attrs["pads"]) // 2] if attrs.get("pads") else []
        n = lengths[0] if lengths else 2
    if n > 2:
        _fail(ctx, node, f"{n}-D convolution and pooling are not supported (1-D and 2-D are)", unsupported=True)
    if n < 1:
        _fail(ctx, node, "a convolution or pooling without spatial axes")
    return n


def _conv_check(node, attrs, ctx):
    weight = ctx.constants.get(node.inputs[1])
    n = _spatial_rank(node, attrs, ctx, weight)
    _spatial_lengths(node, attrs, ctx, n)
    group = attrs.get("group", 1)
    if weight is None:
        return
    if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != list(weight.shape[2:]):
        _fail(ctx, node, f"kernel_shape {attrs['kernel_shape']} does not match its weight's shape {weight.shape}")
    if min(weight.shape) == 0:
        _fail(ctx, node, f"weight {short(node.inputs[1])} has an empty shape {weight.shape}")
    # Conv: (C_out, C_in / group, k...); ConvTranspose: (C_in, C_out / group, k...)
    if weight.shape[0] % group:
        what = "output" if node.op_type == "Conv" else "input"
        _fail(
            ctx,
            node,
            f"group {group} does not divide the {weight.shape[0]} {what} channels of its weight {weight.shape}",
        )
    bias = ctx.constants.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    c_out = weight.shape[0] if node.op_type == "Conv" else weight.shape[1] * group
    if bias is not None and bias.shape != (c_out,):
        _fail(ctx, node, f"bias of shape {bias.shape} for {c_out} output channels")


def _pool_check(node, attrs, ctx):
    n = len(attrs["kernel_shape"])
    if n > 2:
        _fail(ctx, node, f"{n}-D pooling is not supported (1-D and 2-D are)", unsupported=True)
    _spatial_lengths(node, attrs, ctx, n)


def _transpose_check(node, attrs, ctx):
    perm = attrs.get("perm")
    if perm and sorted(perm) != list(range(len(perm))):
        _fail(ctx, node, f"perm {perm} is not a permutation")


def _axes_input_or_attribute(name):
    def check(node, attrs, ctx):
        if name not in attrs and not (len(node.inputs) > 1 and node.inputs[1]):
            _fail(ctx, node, f"needs its {name} (attribute {name!r} or input 2)")

    return check


def _slice_check(node, attrs, ctx):
    if ctx.opset < 10:
        if "starts" not in attrs or "ends" not in attrs:
            _fail(ctx, node, "needs attributes 'starts' and 'ends' (opset < 10)")
        if len(attrs["starts"]) != len(attrs["ends"]) or (
            "axes" in attrs and len(attrs["axes"]) != len(attrs["starts"])
        ):
            _fail(ctx, node, "starts, ends and axes differ in length")
    elif len(node.inputs) < 3 or not all(node.inputs[:3]):
        _fail(ctx, node, "needs inputs data, starts and ends (opset >= 10)")


def _pad_check(node, attrs, ctx):
    if ctx.opset < 11:
        if "pads" not in attrs:
            _fail(ctx, node, "needs attribute 'pads' (opset < 11)")
    elif len(node.inputs) < 2 or not node.inputs[1]:
        _fail(ctx, node, "needs input 'pads' (opset >= 11)")


def _cast_check(node, attrs, ctx):
    if attrs["to"] not in DTYPES:
        _fail(ctx, node, f"Cast to ONNX element type {attrs['to']} is not supported", unsupported=True)


def _constant_check(node, attrs, ctx):
    given = [k for k in ("value", "value_float", "value_floats", "value_int", "value_ints") if k in attrs]
    if len(given) != 1:
        strings = [k for k in node.attrs if k in ("value_string", "value_strings", "sparse_value")]
        if strings and not given:
            _fail(ctx, node, f"a Constant of {strings[0]} is not supported", unsupported=True)
        _fail(ctx, node, f"a Constant needs exactly one value attribute, has {given or 'none'}")


def _constant_of_shape_check(node, attrs, ctx):
    value = attrs.get("value")
    if value is not None and value.size != 1:
        _fail(ctx, node, f"attribute 'value' must hold one element, holds {value.size}")


def _split_check(node, attrs, ctx):
    n = attrs.get("num_outputs")
    if n is not None and n != len(node.outputs):
        _fail(ctx, node, f"num_outputs {n} but {len(node.outputs)} outputs")
    if "split" in attrs and len(attrs["split"]) != len(node.outputs):
        _fail(ctx, node, f"split {attrs['split']} gives {len(attrs['split'])} parts for {len(node.outputs)} outputs")


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_RNN_ACTIVATIONS = {
    "sigmoid",
    "tanh",
    "relu",
    "hardsigmoid",
    "leakyrelu",
    "thresholdedrelu",
    "scaledtanh",
    "affine",
    "elu",
    "softsign",
    "softplus",
}


def _recurrent_check(node, attrs, ctx):
    kind = node.op_type
    gates, n_dir = _GATES[kind], 2 if attrs.get("direction") == "bidirectional" else 1
    names = attrs.get("activations")
    if names:
        unknown = [a for a in names if a.lower() not in _RNN_ACTIVATIONS]
        if unknown:
            _fail(ctx, node, f"recurrent activation {short(unknown[0])} is not supported", unsupported=True)
        per = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
        if len(names) != per * n_dir:
            _fail(ctx, node, f"{len(names)} activations for {n_dir} direction(s) of {kind} (expected {per * n_dir})")
    w, r = (ctx.constants.get(node.inputs[i]) for i in (1, 2))
    hidden = attrs.get("hidden_size")
    if r is not None:
        if r.ndim != 3 or r.shape[0] != n_dir or r.shape[1] != gates * r.shape[2] or r.shape[2] == 0:
            _fail(ctx, node, f"R of shape {r.shape} is not ({n_dir}, {gates} * hidden, hidden)")
        if hidden is not None and hidden != r.shape[2]:
            _fail(ctx, node, f"hidden_size {hidden} does not match R of shape {r.shape}")
        hidden = r.shape[2]
    if w is not None and (w.ndim != 3 or w.shape[0] != n_dir or (hidden is not None and w.shape[1] != gates * hidden)):
        _fail(ctx, node, f"W of shape {w.shape} is not ({n_dir}, {gates} * hidden, input)")


def _resize_check(node, attrs, ctx):
    if attrs.get("mode") == "cubic":
        _fail(ctx, node, "Resize mode 'cubic' is not supported (nearest and linear are)", unsupported=True)
    if attrs.get("antialias"):
        _fail(ctx, node, "Resize with antialias=1 is not supported", unsupported=True)
    if ctx.opset < 11:
        if len(node.inputs) < 2 or not node.inputs[1]:
            _fail(ctx, node, "needs input 'scales' (opset 10)")
    elif not any(node.inputs[2:4]):
        _fail(ctx, node, "needs input 'scales' or 'sizes'")


def _upsample_check(node, attrs, ctx):
    if "scales" not in attrs and not (len(node.inputs) > 1 and node.inputs[1]):
        _fail(ctx, node, "needs its scales (input 2 or attribute 'scales')")


def _attention_check(node, attrs, ctx):
    q, kv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if (q is None) != (kv is None):
        _fail(ctx, node, "q_num_heads and kv_num_heads go together")
    if q is not None and q % kv:
        _fail(ctx, node, f"kv_num_heads {kv} does not divide q_num_heads {q}")


def _eye_like_check(node, attrs, ctx):
    if "dtype" in attrs and attrs["dtype"] not in DTYPES:
        _fail(ctx, node, f"EyeLike of ONNX element type {attrs['dtype']} is not supported", unsupported=True)


def _einsum_check(node, attrs, ctx):
    try:
        einsum_terms(attrs["equation"], len(node.inputs))
    except ShapeError as e:
        _fail(ctx, node, str(e))


def _top_k_check(node, attrs, ctx):
    if ctx.opset < 10 and "k" not in attrs:
        _fail(ctx, node, "needs attribute 'k' (opset < 10)")
    if ctx.opset >= 10 and (len(node.inputs) < 2 or not node.inputs[1]):
        _fail(ctx, node, "needs input 'K' (opset >= 10)")


def _batch_norm_check(node, attrs, ctx):
    if attrs.get("training_mode"):
        _fail(
            ctx, node, "BatchNormalization with training_mode=1 (batch statistics) is not supported", unsupported=True
        )


# --------------------------------------------------------------------------------- the table
OPS: dict[str, Op] = {}


def _add(names, **kw):
    for name in names.split():
        OPS[name] = Op(**kw)


_add(
    "Add Sub Mul Pow Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Div PRelu MatMul Expand Tile",
    inputs=(2, 2),
)
_add("CastLike", inputs=(2, 2), attrs={"saturate": BOOL})
_add("GatherElements", inputs=(2, 2), attrs={"axis": AXIS})
_add("Mod", inputs=(2, 2), attrs={"fmod": BOOL})
_add(
    "Neg Abs Sqrt Exp Log Reciprocal Floor Ceil Not Sign Round Sin Cos IsNaN Identity Erf Relu "
    "Sigmoid Tanh Softsign HardSwish Softplus GlobalAveragePool GlobalMaxPool Size Tan Asin Acos "
    "Atan Sinh Cosh Asinh Acosh Atanh BitwiseNot Mish NonZero"
)
_add("Sum Max Min Mean", inputs=(1, None), optional=None)
_add("Where Range", inputs=(3, 3))
_add("Clip", inputs=(1, 3), attrs={"min": FLT, "max": FLT})
_add("LeakyRelu Elu", attrs={"alpha": FLT})
_add("Selu", attrs={"alpha": FLT, "gamma": FLT})
_add("HardSigmoid", attrs={"alpha": FLT, "beta": FLT})
_add("Gelu", attrs={"approximate": A(STRING, choices=("none", "tanh"))})
_add("Softmax LogSoftmax", attrs={"axis": AXIS})
_add("Gemm", inputs=(2, 3), attrs={"transA": BOOL, "transB": BOOL, "alpha": FLT, "beta": FLT})
_add(
    "BatchNormalization",
    inputs=(5, 5),
    outputs=1,
    check=_batch_norm_check,
    attrs={"epsilon": FLT, "momentum": FLT, "training_mode": BOOL, "spatial": BOOL},
)
_add("InstanceNormalization", inputs=(3, 3), attrs={"epsilon": FLT})
_add("LayerNormalization", inputs=(2, 3), outputs=3, attrs={"axis": AXIS, "epsilon": FLT, "stash_type": A(INT)})
_add("LpNormalization", attrs={"axis": AXIS, "p": A(INT, choices=(1, 2))})
_add(
    "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 ReduceSumSquare ReduceL1 "
    "ReduceLogSum ReduceLogSumExp",
    inputs=(1, 2),
    attrs={"axes": AXES, "keepdims": BOOL, "noop_with_empty_axes": BOOL},
)
_add("ArgMax ArgMin", attrs={"axis": AXIS, "keepdims": BOOL, "select_last_index": BOOL})
_add("Reshape", inputs=(2, 2), attrs={"allowzero": BOOL})
_add("Flatten", attrs={"axis": AXIS})
_add("Transpose", attrs={"perm": A(INTS, 0, limits.ONNX_MAX_RANK - 1)}, check=_transpose_check)
_add("Squeeze", inputs=(1, 2), attrs={"axes": AXES})
_add("Unsqueeze", inputs=(1, 2), attrs={"axes": AXES}, check=_axes_input_or_attribute("axes"))
_add("Concat", inputs=(1, None), optional=None, attrs={"axis": AXIS}, required=("axis",))
_add(
    "Split",
    inputs=(1, 2),
    outputs=None,
    check=_split_check,
    attrs={"axis": AXIS, "split": A(INTS, 0), "num_outputs": A(INT, 1)},
)
_add("Slice", inputs=(1, 5), check=_slice_check, attrs={"starts": A(INTS), "ends": A(INTS), "axes": AXES})
_add("Gather", inputs=(2, 2), attrs={"axis": AXIS})
_add("Shape", attrs={"start": A(INT), "end": A(INT)})
_add("Cast", attrs={"to": A(INT), "saturate": BOOL}, required=("to",), check=_cast_check)
_add(
    "Constant",
    inputs=(0, 0),
    check=_constant_check,
    attrs={
        "value": A(TENSOR),
        "value_float": FLT,
        "value_floats": A(FLOATS),
        "value_int": A(INT),
        "value_ints": A(INTS),
    },
)
_add("ConstantOfShape", attrs={"value": A(TENSOR)}, check=_constant_of_shape_check)
_add("Trilu", inputs=(1, 2), attrs={"upper": BOOL})
_add("Dropout", inputs=(1, 3), outputs=2, attrs={"ratio": FLT, "seed": A(INT)})
_add(
    "Pad",
    inputs=(1, 4),
    check=_pad_check,
    attrs={"mode": A(STRING, choices=("constant", "reflect", "edge", "wrap")), "pads": A(INTS), "value": FLT},
)
_RECURRENT = {
    "activation_alpha": A(FLOATS),
    "activation_beta": A(FLOATS),
    "activations": A(STRINGS),
    "clip": FLT,
    "hidden_size": POS,
    "layout": BOOL,
    "direction": A(STRING, choices=("forward", "reverse", "bidirectional")),
}
_add("RNN", inputs=(3, 6), outputs=2, attrs=_RECURRENT, check=_recurrent_check)
_add("GRU", inputs=(3, 6), outputs=2, attrs=dict(_RECURRENT, linear_before_reset=BOOL), check=_recurrent_check)
_add("LSTM", inputs=(3, 8), outputs=3, attrs=dict(_RECURRENT, input_forget=BOOL), check=_recurrent_check)
_CONV = {"auto_pad": AUTO_PAD, "dilations": POSS, "group": POS, "kernel_shape": POSS, "pads": NONNEG, "strides": POSS}
_add("Conv", inputs=(2, 3), attrs=_CONV, check=_conv_check)
_add("ConvTranspose", inputs=(2, 3), check=_conv_check, attrs=dict(_CONV, output_padding=NONNEG, output_shape=POSS))
_POOL = {
    "auto_pad": AUTO_PAD,
    "ceil_mode": BOOL,
    "dilations": POSS,
    "kernel_shape": POSS,
    "pads": NONNEG,
    "strides": POSS,
}
_add("MaxPool", attrs=dict(_POOL, storage_order=BOOL), required=("kernel_shape",), check=_pool_check)
_add("AveragePool", attrs=dict(_POOL, count_include_pad=BOOL), required=("kernel_shape",), check=_pool_check)
_add("LRN", attrs={"size": POS, "alpha": FLT, "beta": FLT, "bias": FLT}, required=("size",))
_add(
    "MaxRoiPool",
    inputs=(2, 2),
    attrs={"pooled_shape": A(INTS, 1, limits.ONNX_MAX_GEOMETRY, length=2), "spatial_scale": FLT},
    required=("pooled_shape",),
)
_add(
    "Resize",
    inputs=(1, 4),
    check=_resize_check,
    attrs={
        "antialias": BOOL,
        "axes": AXES,
        "cubic_coeff_a": FLT,
        "exclude_outside": BOOL,
        "extrapolation_value": FLT,
        "mode": A(STRING, choices=("nearest", "linear", "cubic")),
        "coordinate_transformation_mode": A(
            STRING,
            choices=(
                "half_pixel",
                "pytorch_half_pixel",
                "align_corners",
                "asymmetric",
                "half_pixel_symmetric",
                "tf_crop_and_resize",
            ),
        ),
        "keep_aspect_ratio_policy": A(STRING, choices=("stretch", "not_larger", "not_smaller")),
        "nearest_mode": A(STRING, choices=("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")),
    },
)
_add(
    "Upsample",
    inputs=(1, 2),
    check=_upsample_check,
    attrs={"mode": A(STRING, choices=("nearest", "linear")), "scales": A(FLOATS, 0.0)},
)
_add(
    "Attention",
    inputs=(3, 7),
    outputs=4,
    check=_attention_check,
    attrs={
        "is_causal": BOOL,
        "kv_num_heads": POS,
        "q_num_heads": POS,
        "scale": FLT,
        "softcap": FLT,
        "qk_matmul_output_mode": A(INT, 0, 3),
        "softmax_precision": A(INT),
        "left_window_size": A(INT),
        "right_window_size": A(INT),
    },
)  # the operator refuses windows


_add("BitwiseAnd BitwiseOr BitwiseXor", inputs=(2, 2))
_add("BitShift", inputs=(2, 2), attrs={"direction": A(STRING, choices=("LEFT", "RIGHT"))}, required=("direction",))
_add("IsInf", attrs={"detect_negative": BOOL, "detect_positive": BOOL})
_add("Celu ThresholdedRelu", attrs={"alpha": FLT})
_add("Shrink", attrs={"bias": FLT, "lambd": FLT})
_add("Hardmax", attrs={"axis": AXIS})
_add("Swish", attrs={"alpha": FLT})
_add(
    "GroupNormalization",
    inputs=(3, 3),
    attrs={"epsilon": FLT, "num_groups": POS, "stash_type": A(INT)},
    required=("num_groups",),
)
_add("RMSNormalization", inputs=(2, 2), attrs={"axis": AXIS, "epsilon": FLT, "stash_type": A(INT)})
_add("MeanVarianceNormalization", attrs={"axes": AXES})
_add("ReverseSequence", inputs=(2, 2), attrs={"batch_axis": A(INT, 0, 1), "time_axis": A(INT, 0, 1)})
_add("GatherND", inputs=(2, 2), attrs={"batch_dims": A(INT, 0, limits.ONNX_MAX_RANK)})
_REDUCTION = A(STRING, choices=("none", "add", "mul", "max", "min"))
_add("ScatterND", inputs=(3, 3), attrs={"reduction": _REDUCTION})
_add("ScatterElements", inputs=(3, 3), attrs={"axis": AXIS, "reduction": _REDUCTION})
_add("Scatter", inputs=(3, 3), attrs={"axis": AXIS})
_add("Compress", inputs=(2, 2), attrs={"axis": AXIS})
_add("OneHot", inputs=(3, 3), attrs={"axis": AXIS})
_add("EyeLike", attrs={"dtype": A(INT), "k": A(INT)}, check=_eye_like_check)
_add(
    "TopK",
    inputs=(1, 2),
    outputs=2,
    check=_top_k_check,
    attrs={"axis": AXIS, "k": A(INT, 0), "largest": BOOL, "sorted": BOOL},
)
_add("CumSum", inputs=(2, 2), attrs={"exclusive": BOOL, "reverse": BOOL})
_add(
    "Einsum",
    inputs=(1, None),
    optional=None,
    attrs={"equation": A(STRING)},
    required=("equation",),
    check=_einsum_check,
)
_add("DepthToSpace", attrs={"blocksize": POS, "mode": A(STRING, choices=("DCR", "CRD"))}, required=("blocksize",))
_add("SpaceToDepth", attrs={"blocksize": POS, "mode": A(STRING, choices=("DCR", "CRD"))}, required=("blocksize",))
# control flow: the subgraphs are checked as graphs of their own (``_check_subgraphs``)
_add(
    "If",
    outputs=None,
    attrs={"then_branch": A(GRAPH), "else_branch": A(GRAPH)},
    required=("then_branch", "else_branch"),
)
_add("Loop", inputs=(2, None), optional=0, outputs=None, attrs={"body": A(GRAPH)}, required=("body",))
_add(
    "Scan",
    inputs=(1, None),
    optional=None,
    outputs=None,
    required=("body", "num_scan_inputs"),
    attrs={
        "body": A(GRAPH),
        "num_scan_inputs": POS,
        "scan_input_axes": AXES,
        "scan_output_axes": AXES,
        "scan_input_directions": A(INTS, 0, 1),
        "scan_output_directions": A(INTS, 0, 1),
    },
)
#: Control-flow operators -> their subgraph attributes.
SUBGRAPHS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


# ------------------------------------------------------------------------------ the checks
_KINDS = {
    INT: "an int",
    FLOAT: "a float",
    STRING: "a string",
    INTS: "a list of ints",
    FLOATS: "a list of floats",
    STRINGS: "a list of strings",
    TENSOR: "a tensor",
    GRAPH: "a graph",
}


def _attribute(node, key, value, rule, ctx):
    """``value`` checked against ``rule`` (ints widened to floats where a float is wanted)."""
    kind = rule.kind
    ok = True
    if kind == INT:
        ok = type(value) is int
    elif kind == FLOAT:
        ok = type(value) in (int, float)
        value = float(value) if ok else value
    elif kind == STRING:
        ok = type(value) is str
    elif kind == TENSOR:
        ok = isinstance(value, np.ndarray)
    elif kind == GRAPH:
        ok = isinstance(value, Graph)
    else:
        ok = type(value) is list and all(
            type(v) is int if kind == INTS else type(v) in (int, float) if kind == FLOATS else type(v) is str
            for v in value
        )
        if ok and kind == FLOATS:
            value = [float(v) for v in value]
    if not ok:
        got = type(value).__name__
        if type(value) is list and value:
            got = f"a list of {type(value[0]).__name__}"
        _fail(ctx, node, f"attribute {short(key)} must be {_KINDS[kind]}, got {got}")
    values = value if kind in (INTS, FLOATS, STRINGS) else [value]
    if rule.length is not None and len(values) != rule.length:
        _fail(ctx, node, f"attribute {short(key)} must hold {rule.length} values, holds {len(values)}")
    if rule.choices is not None:
        bad = [v for v in values if v not in rule.choices]
        if bad:
            what = short(bad[0]) if isinstance(bad[0], str) else bad[0]
            unsupported = isinstance(bad[0], str)
            _fail(
                ctx,
                node,
                f"attribute {short(key)} is {what}; expected one of {', '.join(map(str, rule.choices))}",
                unsupported=unsupported,
            )
    if rule.lo is not None or rule.hi is not None:
        for v in values:
            if v != v or (rule.lo is not None and v < rule.lo) or (rule.hi is not None and v > rule.hi):
                bound = (
                    f">= {rule.lo}"
                    if rule.hi is None
                    else f"<= {rule.hi}"
                    if rule.lo is None
                    else f"in [{rule.lo}, {rule.hi}]"
                )
                shown = value if kind not in (INTS, FLOATS) or len(value) <= 8 else f"{value[:8]}..."
                _fail(ctx, node, f"attribute {short(key)} is {shown}; each value must be {bound}")
    return value


def check_node(node, ctx) -> dict:
    """The checked attributes of ``node`` (those its operator reads), or an error."""
    spec = OPS[qualified(node)]
    low, high = spec.inputs
    n = len(node.inputs)
    if n < low or (high is not None and n > high):
        want = f"{low}" if low == high else f"{low} to {high}" if high is not None else f"{low} or more"
        _fail(ctx, node, f"has {n} inputs, expected {want}")
    for k, name in enumerate(node.inputs):
        if not name and (spec.optional is None or k < spec.optional):
            _fail(ctx, node, f"input {k + 1} is required but has no name")
    attrs = {}
    for key, value in node.attrs.items():
        if key.startswith("_"):
            _fail(ctx, node, f"attribute {short(key)}: names starting with '_' are reserved")
        rule = spec.attrs.get(key)
        if rule is not None:
            attrs[key] = _attribute(node, key, value, rule, ctx)
    for key in spec.required:
        if key not in attrs:
            _fail(ctx, node, f"required attribute {short(key)} is missing")
    if spec.check is not None:
        spec.check(node, attrs, ctx)
    return attrs


def check_graph(graph, where: str, opset: int) -> list:
    """The nodes of ``graph`` checked (see the module docstring), with their checked attributes
    (new ``NodeProto`` objects), in an order that runs; raises ``ModelFileError`` or
    ``UnsupportedError`` naming ``where`` and the node or value."""
    return _check_scope(graph, where, opset, frozenset())[0]


def all_nodes(graph):
    """The nodes of ``graph`` and of its subgraphs, at any depth (``proto`` bounds it)."""
    for node in graph.nodes:
        yield node
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    yield from all_nodes(sub)


def _check_scope(graph, where, opset, outer):
    """(the checked nodes of ``graph`` in an order that runs, the names of ``outer`` it reads).
    ``outer``: the names the enclosing graphs define (empty for the main graph)."""
    ctx = Context(where, opset, graph.initializers)
    defined: dict[str, str] = {}
    for name in graph.initializers:
        defined[name] = "an initializer"
    for vi in graph.inputs:
        if not vi.name:
            raise ModelFileError(f"{where}: a graph input has no name")
        if defined.get(vi.name) == "a graph input":
            raise ModelFileError(f"{where}: graph input {short(vi.name)} is declared twice")
        if outer and vi.elem_type and vi.elem_type not in DTYPES:
            raise UnsupportedError(f"{where}: input {short(vi.name)} has unsupported element type {vi.elem_type}")
        defined[vi.name] = "a graph input"
    nodes = []
    producer: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        attrs = check_node(node, ctx)
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in defined:
                other = f"node {short(graph.nodes[producer[out]].name or out)}" if out in producer else defined[out]
                raise ModelFileError(
                    f"{where}: {_node_text(node)}: output {short(out)} is already "
                    f"written by {other} (each value has one producer)"
                )
            producer[out] = k
        nodes.append(NodeProto(qualified(node), node.domain, node.name, list(node.inputs), list(node.outputs), attrs))
    local = set(defined) | set(producer)
    visible = None
    for node in nodes:
        if node.op_type in SUBGRAPHS:
            visible = (outer | local) if visible is None else visible
            _check_subgraphs(node, ctx, visible)
    reads = {i for n in nodes for i in n.inputs if i} | {vo.name for vo in graph.outputs}
    captures = sorted(n for n in reads if n not in local and n in outer)
    defined.update((name, "an outer-scope value") for name in captures)
    order = _sorted(nodes, producer, defined, where)
    readers = {i for n in nodes for i in n.inputs if i}
    for vo in graph.outputs:
        if not vo.name:
            raise ModelFileError(f"{where}: a graph output has no name")
        if vo.name not in producer and vo.name not in defined:
            raise ModelFileError(
                f"{where}: graph output {short(vo.name)} is computed by no node and is no input or initializer"
            )
        readers.add(vo.name)
    for node in nodes:
        computed = OPS[node.op_type].outputs
        if computed is not None:
            extra = [o for o in node.outputs[computed:] if o and o in readers]
            if extra:
                _fail(
                    ctx,
                    node,
                    f"output {short(extra[0])} (output {node.outputs.index(extra[0]) + 1}) "
                    f"is read, but fastlayers computes only the first {computed} "
                    f"output(s) of {node.op_type}",
                    unsupported=True,
                )
    return order, captures


def _check_subgraphs(node, ctx, visible) -> None:
    """Check the subgraphs of the control-flow ``node`` (each as a graph whose outer scope is
    ``visible``) and their counts of inputs and outputs against the node's; the node's
    attributes get the checked subgraphs, its inputs the outer values they read (after its
    ``_formal`` own inputs), so that ordering and pruning see them."""
    formal, captures = len(node.inputs), []
    for key in SUBGRAPHS[node.op_type]:
        sub = node.attrs[key]
        nodes, reads = _check_scope(sub, f"{ctx.where}: {_node_text(node)}: subgraph {key!r}", ctx.opset, visible)
        checked = Graph()
        checked.name, checked.nodes, checked.initializers = sub.name, nodes, sub.initializers
        checked.inputs, checked.outputs, checked.value_info = sub.inputs, sub.outputs, sub.value_info
        node.attrs[key] = checked
        captures += [c for c in reads if c not in captures]
        n_in, n_out = len(sub.inputs), len(sub.outputs)
        if node.op_type == "If":
            want_in, want_out = 0, len(node.outputs)
        elif node.op_type == "Loop":  # (iteration, condition, N carried) -> (condition, N, K scans)
            want_in, want_out = formal, 1 + len(node.outputs)
            if len(node.outputs) < formal - 2:
                _fail(ctx, node, f"{formal - 2} loop-carried values but {len(node.outputs)} outputs")
            if not all(node.inputs[2:formal]):
                _fail(ctx, node, "a loop-carried initial value has no name (only M and cond may be omitted)")
        else:  # Scan: (N states, M scanned) -> (N states, K scans)
            want_in, want_out = formal, len(node.outputs)
            m = node.attrs["num_scan_inputs"]
            k = len(node.outputs) - (formal - m)
            if m > formal or k < 0:
                _fail(ctx, node, f"num_scan_inputs {m} for {formal} inputs and {len(node.outputs)} outputs")
            for name, count in (
                ("scan_input_axes", m),
                ("scan_input_directions", m),
                ("scan_output_axes", k),
                ("scan_output_directions", k),
            ):
                if name in node.attrs and len(node.attrs[name]) != count:
                    _fail(
                        ctx, node, f"attribute {name!r} has {len(node.attrs[name])} values for {count} scanned values"
                    )
        if n_in != want_in or n_out != want_out:
            _fail(
                ctx,
                node,
                f"subgraph {key!r} has {n_in} inputs and {n_out} outputs; the node's "
                f"{formal} inputs and {len(node.outputs)} outputs need {want_in} and "
                f"{want_out}",
            )
    node.inputs += captures
    node.attrs["_formal"] = formal


def _sorted(nodes, producer, defined, where) -> list:
    """``nodes`` in an order where each input is defined before it is read (the file's order
    when it already is one; else a stable topological sort); an undefined input or a cycle is a
    ``ModelFileError``."""
    seen = set(defined)
    in_order = True
    for node in nodes:
        for i in node.inputs:
            if i and i not in seen:
                if i not in producer:
                    raise ModelFileError(
                        f"{where}: {_node_text(node)} reads {short(i)}, which no "
                        "node, graph input or initializer defines"
                    )
                in_order = False
        seen.update(o for o in node.outputs if o)
    if in_order:
        return nodes
    waiting = [sum(1 for i in set(n.inputs) if i and i not in defined) for n in nodes]
    readers: dict[int, list[int]] = {}
    for k, node in enumerate(nodes):
        for i in set(node.inputs):
            if i and i not in defined:
                readers.setdefault(producer[i], []).append(k)
    import heapq

    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(nodes[k])
        for r in readers.get(k, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):
        stuck = next(n for k, n in enumerate(nodes) if waiting[k] > 0)
        raise ModelFileError(f"{where}: the graph has a cycle (through {_node_text(stuck)})")
    return order
