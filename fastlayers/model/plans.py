"""Keras-style graphs run as ONNX plans: one executor for a layer graph and its export.

A ``Model`` (or ``Sequential``) that holds a convolution, a recurrent layer or multi-head
attention (``COMPILE_KINDS``), and whose every
layer has an ONNX form (``FORMS``, one writer per layer class, by its exact class), is written
once per tuple of input ranks (and dtypes) as an in-memory ONNX graph (``onnx.writer``) and imported as an exported file is (folding, fusions, channels-last
convolutions, native plans), as ``nn/plans.py`` does for torch-style stacks. Values stay
channels-first from the first spatial layer on (``Value.moved``), so that the convolutions,
the normalizations and activations after them and the residual sums between them run as one
region the import fuses (BatchNormalization into the convolution, the sum into its
epilogue); a layer that reads the channels last (Dense, Flatten, LayerNormalization) gets them
back by a Transpose. The forms cover Dense, the activations with an ONNX operator, ReLU,
LeakyReLU, ELU, Softmax, the dropouts and StochasticDepth, Flatten, Reshape,
BatchNormalization, LayerNormalization and RMSNormalization over trailing axes,
Normalization, LocalResponseNormalization, Rescaling, LayerScale, Permute, RepeatVector, the
merges, Concatenate, CustomScaleLayer, Keras operation nodes (BinaryOp),
Conv1D/Conv2D/DepthwiseConv2D/SeparableConv2D/Conv2DTranspose, ZeroPadding1D/2D,
Cropping1D/2D of fixed sizes, UpSampling2D, the max and average pools, the global pools,
InceptionBlock and NiNBlock, and a Model or Sequential used as a layer (written inline): every keras.applications
architecture compiles whole. SimpleRNN, LSTM and GRU (without initial states) are
ONNX's RNN, LSTM and GRU nodes, a Bidirectional one of them one bidirectional node; under an
``Embedding(mask_zero=True)`` mask (the graph's ``PaddingMask`` node: ``ids != 0``),
fastlayers' ``Masked<kind>`` nodes (``ai.fastlayers`` domain), which skip the masked steps as
the layer does.
MultiHeadAttention and SelfAttention (rank 3, no masks but the causal mask, an additive bias
made from the shapes; MultiHeadAttention's returned scores too, the softmax's output) are their products and softmax, which the import fuses
into one attention step, and, without the causal mask, with the sums, LayerNormalizations
and feed-forward layers around them (Dense or PositionwiseFeedForward) into one encoder step; PositionalEncoding adds
its table's first rows; Attention (dot or concat scores), AdditiveAttention (the causal mask
too) and HardAttention without masks or scores are their products, softmax (HardAttention: a one-hot of the first maximum) and sums. An Embedding reading a model input
read by Embeddings (and their masks) only (integers, or whole numbers in a float input) is a Gather: the call checks those ids as the layer does (``_checked_ids``) and runs the
compiled model on them as int64 (Keras's text CNNs and recurrent taggers compile). A graph of
dense layers only keeps the layer path (docs/design.md).

A call takes the compiled model where its inputs are float32 numpy arrays (prepared by
``Model``: cast and checked against the inputs' shapes) or such ids, the backend is the cpu one and
``native_plans`` is on (the model's own ``native_plans``, else the setting in force); a call
that raises there runs layer by layer (the layers' own checks then name the error). What is
compiled is rebuilt after any array a layer holds is replaced (``set_weights``,
``load_weights``, an assignment) and after ``clear_derived`` (an in-place edit); ``Model``
empties its table when its graph is rebuilt (``Sequential.add``).
"""

from __future__ import annotations

import threading

import numpy as np

from .. import settings
from ..backends.derived import derived_generation
from ..errors import FastlayersError

_FLOAT32 = np.dtype(np.float32)


class NoForm(Exception):
    """A layer (or its settings) that no ONNX form covers: the graph runs layer by layer."""


class Value:
    """A value of the written graph as a layer sees it: its ``name``, its ``rank`` and whether
    it is held ``moved``: channels at axis 1 where the layers read them last (a spatial form's
    output, so that the convolutions, their normalizations, activations and residual sums
    between them run as one NCHW region the import fuses; ``plain`` moves it back)."""

    __slots__ = ("name", "rank", "moved", "other", "shape", "ids", "mask")

    def __init__(self, name: str, rank: int, moved: bool = False, ids: bool = False, mask: bool = False):
        self.name, self.rank, self.moved = name, rank, moved
        #: int64 indices (a model input an Embedding reads), which only the Embedding and
        #: PaddingMask forms take
        self.ids = ids
        #: a (batch, time) bool mask (``PaddingMask``'s), which only the recurrent forms take
        self.mask = mask
        self.other: str | None = None  # its Transpose to the other layout, once written
        #: its shape as the layers see it (None where a size is not fixed), once known
        self.shape: tuple | None = None


def _perm_to_first(rank):
    return [0, rank - 1, *range(1, rank - 1)]


def _perm_to_last(rank):
    return [0, *range(2, rank), 1]


def plain(g, v: Value) -> str:
    """``v`` in the layout the layers see (a Transpose back where it is held moved)."""
    if not v.moved:
        return v.name
    if v.other is None:
        v.other = g.node("Transpose", [v.name], "to_last", perm=_perm_to_last(v.rank))
    return v.other


def _first(g, v: Value) -> str:
    """``v`` (a channels-last value of a spatial layer) with its channels at axis 1."""
    if v.moved:
        return v.name
    if v.other is None:
        v.other = g.node("Transpose", [v.name], "to_first", perm=_perm_to_first(v.rank))
    return v.other


def _activation(g, name, x, axis):
    """The nodes of the activation ``name`` (``layers.core.ACTIVATIONS``) on value ``x``
    (``axis``: the axis a softmax runs over)."""
    simple = {
        "relu": "Relu",
        "sigmoid": "Sigmoid",
        "tanh": "Tanh",
        "softplus": "Softplus",
        "softsign": "Softsign",
        "selu": "Selu",
        "exponential": "Exp",
        "hard_silu": "HardSwish",
    }
    if name == "linear":
        return x
    if name in simple:
        return g.node(simple[name], [x], name)
    if name in ("softmax", "log_softmax"):
        return g.node("Softmax" if name == "softmax" else "LogSoftmax", [x], name, axis=axis)
    if name in ("gelu", "gelu_tanh"):
        return g.node("Gelu", [x], name, approximate="none" if name == "gelu" else "tanh")
    if name == "silu":
        return g.node("Mul", [x, g.node("Sigmoid", [x], "sigmoid")], name)
    if name == "relu6":
        return g.node("Clip", [x, g.const(np.float32(0.0), "min"), g.const(np.float32(6.0), "max")], name)
    if name == "leaky_relu":
        return g.node("LeakyRelu", [x], name, alpha=0.2)
    if name == "elu":
        return g.node("Elu", [x], name, alpha=1.0)
    if name == "hard_sigmoid":
        return g.node("HardSigmoid", [x], name, alpha=1.0 / 6.0, beta=0.5)
    raise NoForm


def _elementwise(g, v: Value, name: str) -> Value:
    """Activation ``name`` on ``v`` in the layout it is held in (a softmax over the channels,
    the layers' last axis, is axis 1 of a moved value)."""
    axis = 1 if v.moved else v.rank - 1
    return Value(_activation(g, name, v.name, axis), v.rank, v.moved)


def _dense(g, layer, xs):
    (v,) = xs
    y = g.node("MatMul", [plain(g, v), g.const(layer.kernel, "kernel")], "dense")
    if layer.use_bias:
        y = g.node("Add", [y, g.const(layer.bias, "bias")], "dense_bias")
    return _elementwise(g, Value(y, v.rank), layer.activation)


def _activation_layer(g, layer, xs):
    return _elementwise(g, xs[0], layer.activation)


def _relu(g, layer, xs):
    (v,) = xs
    if layer.threshold != 0.0 or layer.negative_slope != 0.0:
        raise NoForm
    if layer.max_value is None:
        return Value(g.node("Relu", [v.name], "relu"), v.rank, v.moved)
    bounds = [g.const(np.float32(0.0), "min"), g.const(np.float32(layer.max_value), "max")]
    return Value(g.node("Clip", [v.name, *bounds], "relu_max"), v.rank, v.moved)


def _softmax(g, layer, xs):
    (v,) = xs
    if not isinstance(layer.axis, int):
        raise NoForm
    return Value(g.node("Softmax", [plain(g, v)], "softmax", axis=layer.axis % v.rank), v.rank)


def _identity(g, layer, xs):
    return xs[0]


def _flatten(g, layer, xs):
    (v,) = xs
    if v.rank < 2 or getattr(layer, "data_format", "channels_last") != "channels_last":
        raise NoForm
    return Value(g.node("Flatten", [plain(g, v)], "flatten", axis=1), 2)


def _channel_vector(vector, axis, rank):
    """A vector along ``axis`` of values of ``rank`` axes, shaped to broadcast over them."""
    shape = [1] * rank
    shape[axis] = -1
    return np.asarray(vector, np.float32).reshape(shape[1:] if axis > 0 else shape)


def _batch_norm(g, layer, xs):
    (v,) = xs
    axis = layer._axis % v.rank
    if axis == 0:
        raise NoForm
    x = v.name
    if v.moved:  # the channels, the layers' last axis, are axis 1 here
        if axis != v.rank - 1:
            x, v = plain(g, v), Value(plain(g, v), v.rank)
        else:
            axis = 1
    scale, shift = (g.const(_channel_vector(t, axis, v.rank), "bn") for t in (layer._scale, layer._shift))
    y = g.node("Add", [g.node("Mul", [x, scale], "bn_scale"), shift], "bn_shift")
    return Value(y, v.rank, v.moved)


def _normalization(g, layer, xs):
    """Keras's Normalization: (x - mean) / std, or mean + x * std inverted, std = max(sqrt(
    variance), 1e-7), the statistics shaped as the layer broadcasts them."""
    (v,) = xs
    mean = layer.mean_value if layer.mean_value is not None else layer.mean
    var = layer.variance_value if layer.variance_value is not None else layer.variance
    std = np.maximum(np.sqrt(np.asarray(var, np.float32)), np.float32(1e-7)).astype(np.float32)
    mean = np.asarray(mean, np.float32)
    shape = layer._broadcast
    if len(shape) != v.rank or shape[0] != 1:  # statistics along the batch: left to the layer
        raise NoForm
    x = v.name
    if v.moved and shape[1:-1] == (1,) * (v.rank - 2):  # per channel (or scalar): along axis 1
        shape = (1, shape[-1]) + (1,) * (v.rank - 2)
    elif v.moved:
        v = Value(plain(g, v), v.rank)
        x = v.name
    mean_c, std_c = (g.const(t.reshape(shape) if t.ndim else t, "norm") for t in (mean, std))
    if layer.invert:
        y = g.node("Add", [g.node("Mul", [x, std_c], "norm_scale"), mean_c], "norm_shift")
    else:
        y = g.node("Div", [g.node("Sub", [x, mean_c], "norm_center"), std_c], "norm_scale")
    return Value(y, v.rank, v.moved)


def _layer_norm(g, layer, xs):
    (v,) = xs
    rank = v.rank
    axes = list(layer._axes)
    if layer._rms or axes != list(range(rank - len(axes), rank)) or not (layer.scale or layer.center):
        raise NoForm
    shape = tuple(layer.gamma.shape if layer.scale else layer.beta.shape)
    gamma = layer.gamma if layer.scale else np.ones(shape, np.float32)
    beta = layer.beta if layer.center else np.zeros(shape, np.float32)
    inputs = [plain(g, v), g.const(gamma, "gamma"), g.const(beta, "beta")]
    return Value(g.node("LayerNormalization", inputs, "layer_norm", axis=axes[0], epsilon=layer.epsilon), rank)


def _rescaling(g, layer, xs):
    (v,) = xs
    scale, offset = layer._scale, layer._offset
    if scale.ndim > 1 or offset.ndim > 1:
        raise NoForm
    if scale.size > 1 or offset.size > 1:  # a vector along the last axis
        v = Value(plain(g, v), v.rank)
    y = g.node("Mul", [v.name, g.const(scale, "scale")], "rescale")
    return Value(g.node("Add", [y, g.const(offset, "offset")], "offset"), v.rank, v.moved)


def _merge(op_type):
    def form(g, layer, xs):
        rank = xs[0].rank
        if any(v.rank != rank for v in xs):
            raise NoForm
        moved = any(v.moved for v in xs)  # a residual sum stays in the spatial region
        names = [_first(g, v) if moved else v.name for v in xs]
        if op_type in ("Max", "Min"):
            return Value(g.node(op_type, names, op_type.lower()), rank, moved)
        y = names[0]
        for x in names[1:]:
            y = g.node(op_type, [y, x], op_type.lower())
        return Value(y, rank, moved)

    return form


def _average(g, layer, xs):
    total = _merge("Add")(g, layer, xs)
    y = g.node("Mul", [total.name, g.const(np.float32(1.0 / len(xs)), "mean")], "average")
    return Value(y, total.rank, total.moved)


def _concatenate(g, layer, xs):
    rank = xs[0].rank
    if any(v.rank != rank for v in xs):
        raise NoForm
    axis = int(layer.axis) % rank
    if all(v.moved for v in xs) and axis == rank - 1:  # along the channels: axis 1 here
        return Value(g.node("Concat", [v.name for v in xs], "concat", axis=1), rank, True)
    return Value(g.node("Concat", [plain(g, v) for v in xs], "concat", axis=axis), rank)


def _spatial_in(g, layer, v: Value) -> str:
    """``v`` as an NCHW-style Conv or pool input (a channels_first layer reads it as it is)."""
    if layer.data_format == "channels_first":
        return plain(g, v)
    return _first(g, v)


def _spatial_out(layer, y: str, rank: int) -> Value:
    """A Conv or pool output: held moved for a channels_last layer."""
    return Value(y, rank, layer.data_format != "channels_first")


def _window_attrs(layer, kernel, dilation):
    """The pads (or auto_pad) of a window of ``layer.padding``: 'valid', 'same' (Keras puts
    the odd pad after: SAME_UPPER), 'causal' or explicit (before, after) pairs."""
    padding = layer.padding
    if padding == "valid":
        return {"pads": [0] * (2 * len(kernel))}
    if padding == "same":
        return {"auto_pad": "SAME_UPPER"}
    if padding == "causal":
        return {"pads": [(kernel[0] - 1) * dilation[0], 0]}
    return {"pads": [a for a, _ in padding] + [b for _, b in padding]}


def _conv_node(g, layer, x: str, w_oihw, bias, groups: int, hint: str = "conv") -> str:
    """A Conv of ``x`` (channels at axis 1) with ``w_oihw`` and ``bias`` (or None) over the
    layer's window (kernel, strides, dilation, padding)."""
    inputs = [x, g.const(w_oihw, "kernel")] + ([] if bias is None else [g.const(bias, "bias")])
    return g.node(
        "Conv",
        inputs,
        hint,
        kernel_shape=list(layer.kernel_size),
        strides=list(layer.strides),
        dilations=list(layer.dilation_rate),
        group=groups,
        **_window_attrs(layer, layer.kernel_size, layer.dilation_rate),
    )


def _activated(g, layer, y: str, rank: int) -> Value:
    """The output ``y`` of the layer's convolution, held as ``_spatial_out`` holds it, with the
    layer's activation (a softmax of a channels_first layer over its last axis)."""
    out = _spatial_out(layer, y, rank)
    if layer.activation in ("softmax", "log_softmax") and not out.moved:
        return Value(_activation(g, layer.activation, y, rank - 1), rank)
    return _elementwise(g, out, layer.activation)


def _conv_value(g, layer, v: Value, w_oihw, bias, groups) -> Value:
    """Conv of ``v`` with ``w_oihw``, then the layer's activation."""
    return _activated(g, layer, _conv_node(g, layer, _spatial_in(g, layer, v), w_oihw, bias, groups), v.rank)


def _conv(g, layer, xs):
    (v,) = xs
    r = layer.rank
    if v.rank != r + 2:
        raise NoForm
    w_oihw = np.transpose(layer.kernel, (r + 1, r, *range(r)))  # (*k, i, o) -> (o, i, *k)
    return _conv_value(g, layer, v, w_oihw, layer.bias if layer.use_bias else None, layer.groups)


def _depthwise_oihw(kernel):
    """A depthwise kernel (kh, kw, channels, multiplier) as the grouped Conv's (channels *
    multiplier, 1, kh, kw): output channel c * multiplier + m, as the layer orders them."""
    kh, kw, c, m = kernel.shape
    return np.transpose(kernel, (2, 3, 0, 1)).reshape(c * m, 1, kh, kw)


def _depthwise(g, layer, xs):
    (v,) = xs
    if v.rank != 4:
        raise NoForm
    kernel = layer.kernel
    bias = layer.bias if layer.use_bias else None
    return _conv_value(g, layer, v, _depthwise_oihw(kernel), bias, kernel.shape[2])


def _pool(op_type):
    def form(g, layer, xs):
        (v,) = xs
        if v.rank != layer.rank + 2:
            raise NoForm
        attrs = _window_attrs(layer, layer.pool_size, (1,) * layer.rank)
        if op_type == "AveragePool":  # padded cells are not counted (Keras)
            attrs["count_include_pad"] = 0
        y = g.node(
            op_type,
            [_spatial_in(g, layer, v)],
            op_type.lower(),
            kernel_shape=list(layer.pool_size),
            strides=list(layer.strides),
            **attrs,
        )
        return _spatial_out(layer, y, v.rank)

    return form


def _global_pool(op_type):
    def form(g, layer, xs):
        (v,) = xs
        if v.rank != layer.rank + 2:
            raise NoForm
        keep = int(layer.keepdims)
        # channels at axis 1 of a moved value: the spatial axes follow them
        axes = list(range(2, v.rank)) if v.moved else list(layer._axes())
        y = g.node(op_type, [v.name, g.const(np.array(axes, np.int64), "axes")], op_type.lower(), keepdims=keep)
        return Value(y, v.rank, v.moved) if keep else Value(y, 2)

    return form


def _separable(g, layer, xs):
    """A depthwise convolution (no bias, no activation) and its pointwise one, as Keras runs it."""
    (v,) = xs
    if v.rank != 4:
        raise NoForm
    kernel = layer.depthwise_kernel
    y = _conv_node(g, layer, _spatial_in(g, layer, v), _depthwise_oihw(kernel), None, kernel.shape[2], "depthwise")
    depthwise = _spatial_out(layer, y, 4)
    inputs = [_spatial_in(g, layer, depthwise), g.const(np.transpose(layer.pointwise_kernel, (3, 2, 0, 1)), "kernel")]
    if layer.use_bias:
        inputs.append(g.const(layer.bias, "bias"))
    return _activated(g, layer, g.node("Conv", inputs, "pointwise", kernel_shape=[1, 1]), 4)


def _conv_transpose(g, layer, xs):
    """ConvTranspose cropped as Keras crops the full transposed convolution
    (``layers.convolutional.transpose_pads``), a negative crop after as output_padding."""
    from ..layers.convolutional import transpose_pads  # loaded with the layer itself

    (v,) = xs
    if v.rank != 4:
        raise NoForm
    begins, ends, extra = [], [], []
    for a, (k, s, d) in enumerate(zip(layer.kernel_size, layer.strides, layer.dilation_rate)):
        op = None if layer.output_padding is None else layer.output_padding[a]
        padding = layer.padding if isinstance(layer.padding, str) else layer.padding[a]
        # the full output ((n - 1) s + k_eff) less the crops, whatever n: read at n = 1
        before, out_1 = transpose_pads(1, k, s, d, padding, op)
        after = (k - 1) * d + 1 - before - out_1
        begins.append(before)
        ends.append(max(after, 0))
        extra.append(max(-after, 0))
    if any(e >= max(s, d) for e, s, d in zip(extra, layer.strides, layer.dilation_rate)):
        raise NoForm
    w = np.transpose(layer.kernel, (3, 2, 0, 1))  # (kh, kw, out, in) -> (in, out, kh, kw)
    inputs = [_spatial_in(g, layer, v), g.const(w, "kernel")]
    if layer.use_bias:
        inputs.append(g.const(layer.bias, "bias"))
    y = g.node(
        "ConvTranspose",
        inputs,
        "conv_transpose",
        kernel_shape=list(layer.kernel_size),
        strides=list(layer.strides),
        dilations=list(layer.dilation_rate),
        pads=begins + ends,
        output_padding=extra,
    )
    return _activated(g, layer, y, 4)


def _leaky_relu(g, layer, xs):
    (v,) = xs
    return Value(g.node("LeakyRelu", [v.name], "leaky_relu", alpha=layer.negative_slope), v.rank, v.moved)


def _elu(g, layer, xs):
    (v,) = xs
    return Value(g.node("Elu", [v.name], "elu", alpha=layer.alpha), v.rank, v.moved)


def _zero_padding(g, layer, xs):
    """Pad of the spatial axes, which the import folds into the convolution or pool after it."""
    (v,) = xs
    rank = v.rank
    if rank != layer._rank + 2:
        raise NoForm
    x = _spatial_in(g, layer, v)  # channels at axis 1: the spatial axes are 2 ...
    before, after = [0] * rank, [0] * rank
    for k, (a, b) in enumerate(layer._amount):
        before[2 + k], after[2 + k] = a, b
    pads = g.const(np.array(before + after, np.int64), "pads")
    return _spatial_out(layer, g.node("Pad", [x, pads], "zero_pad"), rank)


def _upsampling(g, layer, xs):
    (v,) = xs
    if v.rank != 4:
        raise NoForm
    scales = g.const(np.array([1.0, 1.0, *layer.size], np.float32), "scales")
    if layer.interpolation == "nearest":
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        corners = "align_corners" if layer.align_corners else "half_pixel"
        attrs = {"mode": "linear", "coordinate_transformation_mode": corners}
    y = g.node("Resize", [_spatial_in(g, layer, v), "", scales], "upsampling", **attrs)
    return _spatial_out(layer, y, 4)


def _reshape(g, layer, xs):
    (v,) = xs
    shape = g.const(np.array([0, *layer.target_shape], np.int64), "shape")  # 0: the batch kept
    return Value(g.node("Reshape", [plain(g, v), shape], "reshape"), 1 + len(layer.target_shape))


def _operands(g, xs) -> tuple[list[str], int, bool]:
    """The names of ``xs`` as operands of one elementwise node, its rank and whether it is held
    moved: in the moved layout where one is and all have one rank (a residual sum stays in
    the spatial region; broadcasting holds as both are moved alike), else as the layers see them."""
    rank = max(v.rank for v in xs)
    moved = any(v.moved for v in xs) and all(v.rank == rank for v in xs)
    return [_first(g, v) if moved else plain(g, v) for v in xs], rank, moved


_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div"}


def _binary(g, layer, xs):
    """A Keras operation node (``x + 3.0``, ``a * b``): each operand a tensor or a number."""
    names, rank, moved = _operands(g, xs)
    given = iter(names)
    operands = [next(given) if c is None else g.const(np.float32(c), "operand") for c in layer.constants]
    return Value(g.node(_BINARY[layer.op], operands, layer.op), rank, moved)


def _custom_scale(g, layer, xs):
    """InceptionResNetV2's residual sum: x0 + x1 * scale."""
    (x0, x1), rank, moved = _operands(g, xs)
    scaled = g.node("Mul", [x1, g.const(np.float32(layer.scale), "scale")], "scaled")
    return Value(g.node("Add", [x0, scaled], "residual"), rank, moved)


def _layer_scale(g, layer, xs):
    """ConvNeXt's LayerScale: x * gamma along the channels (axis 1 of a moved value)."""
    (v,) = xs
    gamma = g.const(_channel_vector(layer.gamma, 1 if v.moved else v.rank - 1, v.rank), "gamma")
    return Value(g.node("Mul", [v.name, gamma], "layer_scale"), v.rank, v.moved)


def _cropping(g, layer, xs):
    """A Slice of the spatial axes, in the layout the value is held in. Each cropped axis must
    have a size the model fixes and keep at least one entry (else the layer's own error)."""
    (v,) = xs
    if v.rank != layer._rank + 2 or v.shape is None or (v.moved and layer.data_format == "channels_first"):
        raise NoForm
    axes = list(layer._spatial_axes())
    sizes = [v.shape[a] for a in axes]
    if any(n is None or a + b >= n for n, (a, b) in zip(sizes, layer._amount)):
        raise NoForm
    held = [a + 1 for a in axes] if v.moved else axes  # channels at axis 1: the rest move up one
    begins = [a for a, _ in layer._amount]
    ends = [n - b for n, (_, b) in zip(sizes, layer._amount)]
    inputs = [v.name, *(g.const(np.array(t, np.int64), "crop") for t in (begins, ends, held))]
    return Value(g.node("Slice", inputs, "cropping"), v.rank, v.moved)


def _nested(g, layer, xs):
    """A Model (or Sequential) used as a layer: its graph written inline on the values given."""
    if len(xs) != len(layer.inputs):
        raise NoForm
    outputs = _write(g, layer, xs)
    return outputs[0] if len(outputs) == 1 else outputs


def _rms_norm(g, layer, xs):
    """RMSNormalization over trailing axes: x / sqrt(mean(x^2) + epsilon) * scale."""
    (v,) = xs
    rank = v.rank
    axes = list(layer._axes)
    if axes != list(range(rank - len(axes), rank)):
        raise NoForm
    x = plain(g, v)
    mean = g.node(
        "ReduceMean",
        [g.node("Mul", [x, x], "square"), g.const(np.array(axes, np.int64), "axes")],
        "mean_square",
        keepdims=1,
    )
    root = g.node(
        "Sqrt", [g.node("Add", [mean, g.const(np.float32(layer.epsilon), "epsilon")], "plus_epsilon")], "root"
    )
    y = g.node("Div", [x, root], "rms_normalized")
    return Value(g.node("Mul", [y, g.const(layer.scale, "scale")], "rms_scaled"), rank)


def _local_response_norm(g, layer, xs):
    """LRN across the channels (axis 1 of the ONNX operator: a moved value as it is held)."""
    (v,) = xs
    if v.rank < 3:
        raise NoForm
    size = 2 * layer.depth_radius + 1
    y = g.node(
        "LRN",
        [_spatial_in(g, layer, v)],
        "lrn",
        size=size,
        alpha=layer.alpha * size,
        beta=layer.beta,
        bias=layer.bias,
    )
    return _spatial_out(layer, y, v.rank)


def _permute(g, layer, xs):
    (v,) = xs
    return Value(g.node("Transpose", [plain(g, v)], "permute", perm=[0, *layer.dims]), v.rank)


def _repeat_vector(g, layer, xs):
    """(batch, features) -> (batch, n, features): a Reshape to (batch, 1, features) expanded."""
    (v,) = xs
    if v.rank != 2:
        raise NoForm
    y = g.node("Reshape", [plain(g, v), g.const(np.array([0, 1, -1], np.int64), "shape")], "one_step")
    return Value(g.node("Expand", [y, g.const(np.array([1, layer.n, 1], np.int64), "repeats")], "repeat"), 3)


def _embedding(g, layer, xs):
    """Rows of the table by index: a Gather of int64 ids the call has checked against the
    layer's rows (``compiled_call``). With ``mask_zero`` the same: the graph carries its mask
    to the recurrent layers in a ``PaddingMask`` node of its own (``_padding_mask``)."""
    (v,) = xs
    if not v.ids:
        raise NoForm
    return Value(g.node("Gather", [g.const(layer.embeddings, "embeddings"), v.name], "embedding", axis=0), v.rank + 1)


def _padding_mask(g, layer, xs):
    """``ids != 0`` (batch, time) as bool, the mask an ``Embedding(mask_zero=True)`` hands the
    recurrent layers (``Masked<kind>`` nodes)."""
    (v,) = xs
    if not v.ids or v.rank != 2:
        raise NoForm
    zero = g.const(np.array(0, np.int64), "zero")
    return Value(g.node("Not", [g.node("Equal", [v.name, zero], "padding")], "mask"), 2, mask=True)


#: Keras recurrent activations -> ONNX's names for them in a recurrent node's ``activations``.
_RNN_ACTIVATIONS = {"tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu"}


def _gate_blocks(w, order, units):
    """``w`` (..., gates units) with its gate blocks in ``order`` (Keras's block indices)."""
    return np.concatenate([w[..., g * units : (g + 1) * units] for g in order], axis=-1)


def _rnn_arrays(layer, op_type, order):
    """(W, R, B, activations) of one direction of ONNX's ``op_type`` node for the Keras
    recurrent ``layer``: gate blocks from Keras's order (LSTM i f c o, GRU z r h) to ONNX's
    (``order``: i o f c, z r h), kernels transposed, biases as [input, recurrent]. Raises NoForm
    for activations ONNX's recurrent nodes do not name."""
    acts = [layer.activation] if op_type == "RNN" else [layer.recurrent_activation, layer.activation]
    if any(a not in _RNN_ACTIVATIONS for a in acts):
        raise NoForm
    units = layer.units
    w = _gate_blocks(np.asarray(layer.kernel), order, units).T[None]
    r = _gate_blocks(np.asarray(layer.recurrent_kernel), order, units).T[None]
    bias = np.zeros((1, 2 * w.shape[1]), np.float32)
    if layer.use_bias:
        b = np.asarray(layer.bias, np.float32)
        if op_type == "GRU" and layer.reset_after:  # (input bias, recurrent bias)
            bias[0] = np.concatenate([_gate_blocks(b[0], order, units), _gate_blocks(b[1], order, units)])
        else:
            bias[0, : w.shape[1]] = _gate_blocks(b, order, units)
    names = [_RNN_ACTIVATIONS[a] for a in acts]
    return w, r, bias, [*names, names[-1]] if op_type == "LSTM" else names


def _rnn_node(g, v: Value, op_type, arrays, layer, direction, mask: Value | None = None, states=()):
    """ONNX's ``op_type`` node on ``v`` (batch, time, input), time first (layout 0, which
    onnxruntime also runs: Transposes around the node) with the stacked ``arrays`` (W, R, B,
    activations) of its directions: (Y (time, directions, batch, units), its final states).
    With a ``mask`` (batch, time), fastlayers' ``Masked<op_type>`` node, which skips the
    masked steps as the layer does (its ``zero_output_for_mask`` too). ``states``: the
    initial states as the layer takes them (h, and c for LSTM, each (batch, units); a
    Bidirectional's forward ones, then its backward ones), stacked per direction into the
    node's initial_h (and initial_c) (directions, batch, units)."""
    w, r, bias, acts = arrays
    attrs = {"hidden_size": layer.units, "direction": direction, "activations": acts}
    if op_type == "GRU":
        attrs["linear_before_reset"] = int(layer.reset_after)
    x_tbi = g.node("Transpose", [plain(g, v)], "time_first", perm=[1, 0, 2])
    inputs = [x_tbi, g.const(w, "w"), g.const(r, "r"), g.const(bias, "b")]
    if states:
        inputs.append("" if mask is None else mask.name)  # sequence_lens' place
        per = len(states) // w.shape[0]  # states per direction: h (and c)
        axis = g.const(np.array([0], np.int64), "axis")
        for k in range(per):  # initial_h, then initial_c
            stacked = [g.node("Unsqueeze", [plain(g, s), axis], "initial") for s in states[k::per]]
            inputs.append(stacked[0] if len(stacked) == 1 else g.node("Concat", stacked, "initial", axis=0))
    count = 3 if op_type == "LSTM" else 2
    if mask is None:
        y, *states_out = g.nodes(op_type, inputs, op_type.lower(), count, **attrs)
    else:
        from ..onnx.records import FASTLAYERS  # here: written graphs only import onnx/

        attrs["zero_output_for_mask"] = int(layer.zero_output_for_mask)
        if not states:
            inputs.append(mask.name)
        y, *states_out = g.nodes(f"Masked{op_type}", inputs, op_type.lower(), count, FASTLAYERS, **attrs)
    return y, states_out


def _recurrent_inputs(layer, xs, n_states=0, has_mask=False, **other):
    """(sequence, mask or None, initial states) of a recurrent layer's node: a mask only where
    it is the graph's ``PaddingMask``, initial states (batch, units) values, no other call
    arguments, and no output that ``zero_output_for_mask`` would zero while its state is kept
    (a last output of a masked step); else NoForm."""
    if other or len(xs) != 1 + n_states + bool(has_mask):
        raise NoForm
    v, states = xs[0], xs[1 : 1 + n_states]
    mask = xs[1 + n_states] if has_mask else None
    if v.rank != 3 or v.mask or (mask is not None and not mask.mask):
        raise NoForm
    if any(s.rank != 2 or s.ids or s.mask for s in states):
        raise NoForm
    if mask is not None and layer.zero_output_for_mask and not layer.return_sequences:
        raise NoForm
    return v, mask, states


def _sequence_of(g, y) -> str:
    """Y (time, directions, batch, units) as (batch, time, directions units): the directions'
    outputs side by side (Keras's concat)."""
    y_btdu = g.node("Transpose", [y], "batch_first", perm=[2, 0, 1, 3])
    return g.node("Reshape", [y_btdu, g.const(np.array([0, 0, -1], np.int64), "shape")], "sequence")


def _recurrent(op_type, order):
    """A Keras SimpleRNN / LSTM / GRU as ONNX's RNN / LSTM / GRU node (``_rnn_arrays``,
    ``_rnn_node``); go_backwards is the reverse direction, whose sequence Keras returns in
    processing order. Under an ``Embedding(mask_zero=True)`` mask, fastlayers' masked node;
    initial states (call arguments) are the node's."""

    def form(g, layer, xs, **call):
        v, mask, initial = _recurrent_inputs(layer, xs, **call)
        if initial and len(initial) != len(layer.state_size):
            raise NoForm
        arrays = _rnn_arrays(layer, op_type, order)
        direction = "reverse" if layer.go_backwards else "forward"
        y, states = _rnn_node(g, v, op_type, arrays, layer, direction, mask, initial)
        first = None
        if layer.return_sequences:
            out = _sequence_of(g, y)
            if layer.go_backwards:  # Keras: in processing order
                steps = [np.array([v], np.int64) for v in (-1, np.iinfo(np.int64).min, 1, -1)]
                out = g.node("Slice", [out, *(g.const(t, "slice") for t in steps)], "backwards")
            first = Value(out, 3)
        axis = g.const(np.array([0], np.int64), "axis")
        last = [Value(g.node("Squeeze", [s, axis], "state"), 2) for s in states]  # (1, B, units)
        if not layer.return_state:
            return first if first is not None else last[0]
        return [first if first is not None else last[0], *last]

    return form


def _bidirectional(g, layer, xs, **call):
    """Keras's Bidirectional (concat, sum or ave of its outputs) as one bidirectional node: its
    forward layer forward and its backward one reading time backwards, of one class and
    configuration (else the layer path), initial states and returned final states (forward
    ones, then backward ones) the node's; under an ``Embedding(mask_zero=True)`` mask,
    fastlayers' masked node."""
    fwd, bwd = layer.forward_layer, layer.backward_layer
    v, mask, initial = _recurrent_inputs(fwd, xs, **call)
    if initial and len(initial) != 2 * len(fwd.state_size):
        raise NoForm
    kind = _class_name(fwd)
    op_type, order = _RNN_KINDS.get(kind, (None, None))
    same = (
        ("units", "activation", "use_bias", "return_sequences")
        + (("recurrent_activation",) if op_type != "RNN" else ())
        + (("reset_after",) if op_type == "GRU" else ())
        + ("zero_output_for_mask",)
    )
    if (
        op_type is None
        or _class_name(bwd) != kind
        or fwd.go_backwards
        or not bwd.go_backwards
        or layer.merge_mode not in ("concat", "sum", "ave")
        or any(getattr(fwd, a) != getattr(bwd, a) for a in same)
    ):
        raise NoForm
    f, b = _rnn_arrays(fwd, op_type, order), _rnn_arrays(bwd, op_type, order)
    arrays = [np.concatenate([f[k], b[k]]) for k in range(3)] + [f[3] + b[3]]
    y, states = _rnn_node(g, v, op_type, arrays, fwd, "bidirectional", mask, initial)
    if layer.return_sequences:  # (T, 2, B, u): the backward outputs at their input steps
        y_bt2u = g.node("Transpose", [y], "batch_first", perm=[2, 0, 1, 3])
        rank = 3
    else:  # the final states (2, B, u): the last outputs of the two directions
        y_bt2u = g.node("Transpose", [states[0]], "batch_first", perm=[1, 0, 2])
        rank = 2
    axis = rank - 1  # the directions' axis of (B, [T,] 2, u)
    if layer.merge_mode == "concat":
        shape = [0, 0, -1] if rank == 3 else [0, -1]
        out = g.node("Reshape", [y_bt2u, g.const(np.array(shape, np.int64), "shape")], "concat")
    else:
        reduce = "ReduceSum" if layer.merge_mode == "sum" else "ReduceMean"
        out = g.node(reduce, [y_bt2u, g.const(np.array([axis], np.int64), "axes")], layer.merge_mode, keepdims=0)
    if not layer.return_state:
        return Value(out, rank)
    # Keras's order: the forward layer's final states (h, and c for LSTM), then the backward's
    direction = [g.const(np.array(d, np.int64), "direction") for d in (0, 1)]
    final = [Value(g.node("Gather", [s, direction[d]], "state", axis=0), 2) for d in (0, 1) for s in states]
    return [Value(out, rank), *final]


def _causal_bias(g, q: str, q_axis: int, k: str, k_axis: int) -> str:
    """The additive causal mask (Tq, Tk) of queries along axis ``q_axis`` of ``q`` and keys
    along axis ``k_axis`` of ``k``: 0 where key j <= query i, -inf above (``_causal_keys``),
    as ``use_causal_mask`` masks."""
    zero, masked = (g.const(np.array(v, np.float32), "bias") for v in (0.0, -np.inf))
    return g.node("Where", [_causal_keys(g, q, q_axis, k, k_axis), zero, masked], "causal")


def _causal_keys(g, q: str, q_axis: int, k: str, k_axis: int) -> str:
    """Whether key j <= query i, (Tq, Tk) bool, of queries along axis ``q_axis`` of ``q`` and
    keys along axis ``k_axis`` of ``k``, made from their shapes (a constant of each call's
    shapes for the import and its plans)."""

    def positions(x: str, axis: int, hint: str) -> str:
        length = g.node("Squeeze", [g.node("Shape", [x], f"{hint}_len", start=axis, end=axis + 1)], hint)
        zero, one = (g.const(np.array(v, np.int64), "step") for v in (0, 1))
        return g.node("Range", [zero, length, one], f"{hint}_positions")

    rows = g.node("Unsqueeze", [positions(q, q_axis, "query"), g.const(np.array([1], np.int64), "axis")], "rows")
    cols = g.node("Unsqueeze", [positions(k, k_axis, "key"), g.const(np.array([0], np.int64), "axis")], "cols")
    return g.node("LessOrEqual", [cols, rows], "allowed")


def _multi_head_attention(
    g, layer, xs, packed=("query", "value"), use_causal_mask=False, return_attention_scores=False, **other
):
    """Keras's MultiHeadAttention on rank-3 values (attention over axis 1), without a mask:
    the projections as MatMuls, softmax(q k^T / sqrt(key_dim) (+ the causal mask)) v per head,
    the output projection; the import fuses the product-softmax-product into one attention
    step. With ``return_attention_scores``, the softmax's output (batch, heads, Tq, Tk) is the
    second output (the import then keeps the products and the softmax apart)."""
    named = dict(zip(packed, xs))
    if other or set(packed) - {"query", "value", "key"} or any(v.rank != 3 for v in xs):
        raise NoForm
    if layer.attention_axes not in (None, (1,)) or len(layer._out_tail((None, None, 1))) != 1:
        raise NoForm
    H, kd, vd = layer.num_heads, layer.key_dim, layer.value_dim
    q, v = named["query"], named["value"]
    k = named.get("key", v)

    def project(x: Value, name: str, d: int) -> str:
        kernel = getattr(layer, f"{name}_kernel")
        y = g.node("MatMul", [plain(g, x), g.const(kernel.reshape(kernel.shape[0], H * d), name)], name)
        if layer.use_bias:
            y = g.node("Add", [y, g.const(getattr(layer, f"{name}_bias").reshape(H * d), "bias")], f"{name}_bias")
        heads = g.node("Reshape", [y, g.const(np.array([0, 0, H, d], np.int64), "heads")], f"{name}_heads")
        return heads

    qh = g.node("Transpose", [project(q, "query", kd)], "q", perm=[0, 2, 1, 3])  # (B, H, Tq, kd)
    kt = g.node("Transpose", [project(k, "key", kd)], "k_t", perm=[0, 2, 3, 1])  # (B, H, kd, Tk)
    vh = g.node("Transpose", [project(v, "value", vd)], "v", perm=[0, 2, 1, 3])  # (B, H, Tk, vd)
    qs = g.node("Mul", [qh, g.const(np.float32(1.0 / np.sqrt(kd)), "scale")], "q_scaled")
    scores = g.node("MatMul", [qs, kt], "scores")
    if use_causal_mask:
        scores = g.node("Add", [scores, _causal_bias(g, qh, 2, kt, 3)], "scores_causal")
    weights = g.node("Softmax", [scores], "weights", axis=-1)
    ctx = g.node("Transpose", [g.node("MatMul", [weights, vh], "context")], "context_t", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, g.const(np.array([0, 0, H * vd], np.int64), "merged")], "merged")
    out = layer.output_kernel
    y = g.node("MatMul", [ctx, g.const(out.reshape(H * vd, out.shape[-1]), "output")], "output")
    if layer.use_bias:
        y = g.node("Add", [y, g.const(layer.output_bias, "bias")], "output_bias")
    return [Value(y, 3), Value(weights, 4)] if return_attention_scores else Value(y, 3)


def _self_attention(g, layer, xs):
    """fastlayers' SelfAttention (query = key = value), with its causal mask where it has
    one, without returned scores."""
    if layer.return_attention_scores:
        raise NoForm
    return _multi_head_attention(g, layer, [xs[0]] * 3, ("query", "value", "key"), layer.use_causal_mask)


def _positional_encoding(g, layer, xs):
    """x (times sqrt(d) where ``scale_input``) + the table's first T rows, T read from x."""
    (v,) = xs
    if v.rank != 3:
        raise NoForm
    x = plain(g, v)
    if layer.scale_input:
        x = g.node("Mul", [x, g.const(layer._sqrt_d, "sqrt_d")], "scaled")
    steps = g.node("Shape", [x], "steps", start=1, end=2)
    zero = g.const(np.array([0], np.int64), "zero")
    rows = g.node("Slice", [g.const(layer.table, "table"), zero, steps, zero], "positions")
    return Value(g.node("Add", [x, rows], "encoded"), 3)


def _feed_forward(g, layer, xs):
    """fastlayers' PositionwiseFeedForward: two Dense products, the activation between."""
    (v,) = xs
    y = g.node("MatMul", [plain(g, v), g.const(layer.kernel1, "kernel1")], "hidden")
    if layer.use_bias:
        y = g.node("Add", [y, g.const(layer.bias1, "bias1")], "hidden_bias")
    y = g.node("MatMul", [_activation(g, layer.activation, y, v.rank - 1), g.const(layer.kernel2, "kernel2")], "out")
    if layer.use_bias:
        y = g.node("Add", [y, g.const(layer.bias2, "bias2")], "out_bias")
    return Value(y, v.rank)


def _dense_attention(g, layer, xs, use_causal_mask=False, return_attention_scores=False, **other):
    """Keras's Attention (dot scores, times ``scale`` with use_scale; or score_mode "concat":
    concat_score_weight times the sum over the features of tanh(scale (q + k))) and
    AdditiveAttention (sum over the features of scale * tanh(q + k)) on rank-3 [query,
    value(, key)], no masks but the causal one: softmax over the keys, then the product with
    the values; with ``return_attention_scores``, that softmax (batch, Tq, Tk) is the second
    output."""
    if other or any(v.rank != 3 for v in xs) or len(xs) not in (2, 3):
        raise NoForm
    q, v = plain(g, xs[0]), plain(g, xs[1])
    k = plain(g, xs[2]) if len(xs) == 3 else v
    concat = _class_name(layer) == f"{_LAYERS}.attention.Attention" and layer.score_mode == "concat"
    if _class_name(layer) == f"{_LAYERS}.attention.Attention" and not concat:
        scores = g.node("MatMul", [q, g.node("Transpose", [k], "k_t", perm=[0, 2, 1])], "scores")
        if layer.use_scale:
            scores = g.node("Mul", [scores, g.const(np.asarray(layer.scale, np.float32), "scale")], "scaled")
    else:  # (B, Tq, 1, d) + (B, 1, Tk, d)
        q4 = g.node("Unsqueeze", [q, g.const(np.array([2], np.int64), "axis")], "q4")
        k4 = g.node("Unsqueeze", [k, g.const(np.array([1], np.int64), "axis")], "k4")
        s = g.node("Add", [q4, k4], "sum")
        if concat and layer.use_scale:  # a scalar inside the tanh
            s = g.node("Mul", [s, g.const(np.asarray(layer.scale, np.float32), "scale")], "scaled_sum")
        t = g.node("Tanh", [s], "tanh")
        if not concat and layer.use_scale:  # a vector over the features outside it
            t = g.node("Mul", [t, g.const(np.asarray(layer.scale, np.float32), "scale")], "scaled")
        scores = g.node("ReduceSum", [t, g.const(np.array([3], np.int64), "axes")], "scores", keepdims=0)
        if concat:
            weight = g.const(np.asarray(layer.concat_score_weight, np.float32), "concat_score_weight")
            scores = g.node("Mul", [scores, weight], "weighted")
    if use_causal_mask:
        scores = g.node("Add", [scores, _causal_bias(g, q, 1, k, 1)], "scores_causal")
    weights = g.node("Softmax", [scores], "weights", axis=-1)
    attended = Value(g.node("MatMul", [weights, v], "attended"), 3)
    return [attended, Value(weights, 3)] if return_attention_scores else attended


def _hard_attention(g, layer, xs, use_causal_mask=False, return_attention_scores=False, **other):
    """HardAttention on rank-3 [query, value(, key)], no masks but the causal one: the one-hot
    of the first maximum of the dot scores (times ``scale`` with use_scale; -inf for keys after
    the query with ``use_causal_mask``) over the keys, zeros for a query whose every key scores
    -inf, as the layer; then the product with the values. With ``return_attention_scores``,
    the one-hot weights (batch, Tq, Tk) are the second output."""
    if other or any(v.rank != 3 for v in xs) or len(xs) not in (2, 3):
        raise NoForm
    q, v = plain(g, xs[0]), plain(g, xs[1])
    k = plain(g, xs[2]) if len(xs) == 3 else v
    scores = g.node("MatMul", [q, g.node("Transpose", [k], "k_t", perm=[0, 2, 1])], "scores")
    if layer.use_scale:
        scores = g.node("Mul", [scores, g.const(np.asarray(layer.scale, np.float32), "scale")], "scaled")
    if use_causal_mask:  # later keys -inf, NaN scores too (as the layer replaces them)
        minus_inf = g.const(np.array(-np.inf, np.float32), "minus_inf")
        scores = g.node("Where", [_causal_keys(g, q, 1, k, 1), scores, minus_inf], "scores_causal")
    first = g.node("ArgMax", [scores], "first_max", axis=-1, keepdims=0)
    keys = g.node("Shape", [scores], "keys", start=2, end=3)
    weights = g.node("OneHot", [first, keys, g.const(np.array([0, 1], np.float32), "off_on")], "one_hot", axis=-1)
    top = g.node("ReduceMax", [scores, g.const(np.array([2], np.int64), "axes")], "top", keepdims=1)
    none = g.node("Equal", [top, g.const(np.array(-np.inf, np.float32), "minus_inf")], "none_live")
    weights = g.node("Where", [none, g.const(np.zeros((), np.float32), "zero"), weights], "weights")
    attended = Value(g.node("MatMul", [weights, v], "attended"), 3)
    return [attended, Value(weights, 3)] if return_attention_scores else attended


def _hwio_conv(g, layer, x: str, name: str, strides=(1, 1), **window) -> str:
    """The block's convolution ``name`` (weights ``{name}_kernel`` HWIO, ``{name}_bias``) of
    ``x`` (channels at axis 1), then the block's activation."""
    w_hwio = getattr(layer, f"{name}_kernel")
    inputs = [x, g.const(np.transpose(w_hwio, (3, 2, 0, 1)), "kernel"), g.const(getattr(layer, f"{name}_bias"), "bias")]
    window = window or {"pads": [0, 0, 0, 0]}
    y = g.node("Conv", inputs, name, kernel_shape=list(w_hwio.shape[:2]), strides=list(strides), **window)
    return _activation(g, layer.activation, y, 1)


def _inception(g, layer, xs):
    """InceptionBlock: four branches (1x1; 1x1 then 3x3; 1x1 then 5x5; a 3x3 stride-1 max pool
    then 1x1), every convolution 'same', concatenated along the channels."""
    (v,) = xs
    if v.rank != 4:
        raise NoForm
    x = _spatial_in(g, layer, v)
    b2 = _hwio_conv(g, layer, _hwio_conv(g, layer, x, "b2_reduce"), "b2", pads=[1, 1, 1, 1])
    b3 = _hwio_conv(g, layer, _hwio_conv(g, layer, x, "b3_reduce"), "b3", pads=[2, 2, 2, 2])
    pooled = g.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    branches = [_hwio_conv(g, layer, x, "b1"), b2, b3, _hwio_conv(g, layer, pooled, "b4")]
    return _spatial_out(layer, g.node("Concat", branches, "branches", axis=1), 4)


def _nin(g, layer, xs):
    """NiNBlock: its convolution, the 1x1 convolutions, a global average pool where it ends in one."""
    (v,) = xs
    if v.rank != 4:
        raise NoForm
    window = _window_attrs(layer, layer.kernel_size, (1, 1))
    y = _hwio_conv(g, layer, _spatial_in(g, layer, v), "conv", layer.strides, **window)
    for i in range(len(layer.mlp_filters)):
        y = _hwio_conv(g, layer, y, f"mlp{i}")
    if layer.global_pool:
        return Value(g.node("ReduceMean", [y, g.const(np.array([2, 3], np.int64), "axes")], "pool", keepdims=0), 2)
    return _spatial_out(layer, y, 4)


_LAYERS = "fastlayers.layers"
#: Keras recurrent layer classes -> (ONNX node, their gate blocks in ONNX's order)
_RNN_KINDS = {
    f"{_LAYERS}.recurrent.SimpleRNN": ("RNN", [0]),
    f"{_LAYERS}.recurrent.LSTM": ("LSTM", [0, 3, 1, 2]),
    f"{_LAYERS}.recurrent.GRU": ("GRU", [0, 1, 2]),
}
_RECURRENT_FORMS = {kind: _recurrent(op_type, order) for kind, (op_type, order) in _RNN_KINDS.items()}
#: The forms that take a mask value (the recurrent layers under an Embedding's ``PaddingMask``
#: or a mask input, ``_mask_inputs``)
_TAKES_MASKS = frozenset({*_RECURRENT_FORMS.values(), _bidirectional})
#: The forms that take a node's call arguments (MultiHeadAttention's packed input names, the
#: attentions' causal mask and returned scores, the recurrent layers' count of states and
#: mask; any other argument or another mask is refused: NoForm)
_TAKES_CALL_ARGUMENTS = frozenset({_multi_head_attention, _dense_attention, _hard_attention, *_TAKES_MASKS})
#: The forms that take int64 ids (a model input read by Embeddings and their masks)
_TAKES_IDS = frozenset({_embedding, _padding_mask})
#: The graph classes a model may use as a layer (written inline)
_MODELS = ("fastlayers.model.graph.Model", "fastlayers.model.graph.Sequential")
#: Layer class (by its full name: a subclass, whose call may differ, has none) -> its ONNX
#: form: (graph, layer, input Values) -> output Value; raises NoForm where the layer's
#: settings or its inputs' ranks have none.
FORMS = {
    f"{_LAYERS}.core.Dense": _dense,
    f"{_LAYERS}.core.Activation": _activation_layer,
    f"{_LAYERS}.core.ReLU": _relu,
    f"{_LAYERS}.core.Softmax": _softmax,
    f"{_LAYERS}.core.Dropout": _identity,
    f"{_LAYERS}.core.SpatialDropout1D": _identity,
    f"{_LAYERS}.core.SpatialDropout2D": _identity,
    f"{_LAYERS}.core.Flatten": _flatten,
    f"{_LAYERS}.core.Rescaling": _rescaling,
    f"{_LAYERS}.normalization.BatchNormalization": _batch_norm,
    f"{_LAYERS}.normalization.LayerNormalization": _layer_norm,
    f"{_LAYERS}.normalization.Normalization": _normalization,
    f"{_LAYERS}.merging.Add": _merge("Add"),
    f"{_LAYERS}.merging.Subtract": _merge("Sub"),
    f"{_LAYERS}.merging.Multiply": _merge("Mul"),
    f"{_LAYERS}.merging.Maximum": _merge("Max"),
    f"{_LAYERS}.merging.Minimum": _merge("Min"),
    f"{_LAYERS}.merging.Average": _average,
    f"{_LAYERS}.merging.Concatenate": _concatenate,
    f"{_LAYERS}.convolutional.Conv1D": _conv,
    f"{_LAYERS}.convolutional.Conv2D": _conv,
    f"{_LAYERS}.convolutional.DepthwiseConv2D": _depthwise,
    f"{_LAYERS}.convolutional.SeparableConv2D": _separable,
    f"{_LAYERS}.convolutional.Conv2DTranspose": _conv_transpose,
    f"{_LAYERS}.core.LeakyReLU": _leaky_relu,
    f"{_LAYERS}.core.ELU": _elu,
    f"{_LAYERS}.core.Reshape": _reshape,
    f"{_LAYERS}.reshaping.ZeroPadding1D": _zero_padding,
    f"{_LAYERS}.reshaping.ZeroPadding2D": _zero_padding,
    f"{_LAYERS}.pooling.UpSampling2D": _upsampling,
    f"{_LAYERS}.pooling.MaxPooling1D": _pool("MaxPool"),
    f"{_LAYERS}.pooling.MaxPooling2D": _pool("MaxPool"),
    f"{_LAYERS}.pooling.AveragePooling1D": _pool("AveragePool"),
    f"{_LAYERS}.pooling.AveragePooling2D": _pool("AveragePool"),
    f"{_LAYERS}.pooling.GlobalMaxPooling1D": _global_pool("ReduceMax"),
    f"{_LAYERS}.pooling.GlobalMaxPooling2D": _global_pool("ReduceMax"),
    f"{_LAYERS}.pooling.GlobalAveragePooling1D": _global_pool("ReduceMean"),
    f"{_LAYERS}.pooling.GlobalAveragePooling2D": _global_pool("ReduceMean"),
    f"{_LAYERS}.merging.BinaryOp": _binary,
    f"{_LAYERS}.merging.CustomScaleLayer": _custom_scale,
    f"{_LAYERS}.core.LayerScale": _layer_scale,
    f"{_LAYERS}.core.StochasticDepth": _identity,
    f"{_LAYERS}.core.SpatialDropout3D": _identity,
    f"{_LAYERS}.reshaping.Cropping1D": _cropping,
    f"{_LAYERS}.reshaping.Cropping2D": _cropping,
    f"{_LAYERS}.normalization.RMSNormalization": _rms_norm,
    f"{_LAYERS}.pooling.LocalResponseNormalization": _local_response_norm,
    f"{_LAYERS}.core.Permute": _permute,
    f"{_LAYERS}.core.RepeatVector": _repeat_vector,
    f"{_LAYERS}.core.Embedding": _embedding,
    f"{_LAYERS}.recurrent.PaddingMask": _padding_mask,
    **_RECURRENT_FORMS,
    f"{_LAYERS}.bidirectional.Bidirectional": _bidirectional,
    f"{_LAYERS}.attention.MultiHeadAttention": _multi_head_attention,
    f"{_LAYERS}.attention.SelfAttention": _self_attention,
    f"{_LAYERS}.attention.Attention": _dense_attention,
    f"{_LAYERS}.blocks.InceptionBlock": _inception,
    f"{_LAYERS}.blocks.NiNBlock": _nin,
    f"{_LAYERS}.attention.AdditiveAttention": _dense_attention,
    f"{_LAYERS}.attention.HardAttention": _hard_attention,
    f"{_LAYERS}.attention.PositionalEncoding": _positional_encoding,
    f"{_LAYERS}.attention.PositionwiseFeedForward": _feed_forward,
    **dict.fromkeys(_MODELS, _nested),
}


def _class_name(layer) -> str:
    return f"{type(layer).__module__}.{type(layer).__qualname__}"


def input_names(model) -> list[str]:
    """The written graph's input names: ``"input"``, or ``"input_0"``... for several."""
    n = len(model.inputs)
    return ["input"] if n == 1 else [f"input_{k}" for k in range(n)]


def _write(g, model, given: list) -> list:
    """The nodes of ``model``'s graph written on ``given`` (a Value per model input): the
    Values of its outputs. Raises NoForm where a node has none."""
    values = {id(t): v for t, v in zip(model.inputs, given)}
    for t, v in zip(model.inputs, given):
        v.shape = v.shape or tuple(t.shape)
    inputs = {id(t.node.layer) for t in model.inputs}
    for node in model._nodes:
        if id(node.layer) in inputs:
            continue
        form = FORMS.get(_class_name(node.layer))
        if form is None or node.extra_args or (node.kwargs and form not in _TAKES_CALL_ARGUMENTS):
            raise NoForm
        found = [values[id(t)] for t in node.parents if id(t) in values]
        if (
            len(found) != len(node.parents)
            or (form not in _TAKES_IDS and any(v.ids for v in found))
            or (form not in _TAKES_MASKS and any(v.mask for v in found))
        ):
            raise NoForm
        out = form(g, node.layer, found, **node.kwargs)
        outs = out if isinstance(out, list) else [out]
        if len(outs) != len(node.outputs):
            raise NoForm
        for t, v in zip(node.outputs, outs):
            v.shape = tuple(t.shape)
            values[id(t)] = v
    return [values[id(t)] for t in model.outputs]


def _key_items(model, key) -> tuple:
    """The items of a table key (``_key``): one per model input."""
    return (key,) if len(model.inputs) == 1 else tuple(key)


def _rank_of(item) -> int:
    """The rank of a key item: an int for float32, ``(IDS, rank)`` for int64 ids, ``(MASK,
    rank)`` for a bool mask."""
    return item if type(item) is int else item[1]


def written(model, key):
    """``model`` written as an ONNX graph taking inputs of ``key`` (``_key``: per input its
    rank, float32, ``(IDS, rank)``, int64 ids, or ``(MASK, rank)``, a recurrent layer's bool
    mask), named by ``input_names``:
    (``onnx.writer.GraphWriter``, its output names in the model's order), or None where some
    node has no form for it."""
    from ..onnx.writer import GraphWriter  # here: a model without COMPILE_KINDS never imports onnx/

    items = _key_items(model, key)
    names = input_names(model)
    g = GraphWriter()
    given = [
        Value(
            name,
            _rank_of(item),
            ids=type(item) is not int and item[0] == IDS,
            mask=type(item) is not int and item[0] == MASK,
        )
        for name, item in zip(names, items)
    ]
    try:
        outputs = _write(g, model, given)
        ys = [plain(g, v) for v in outputs]
    except NoForm:
        return None
    if set(ys) & set(names):  # an input given back: no work to compile
        return None
    for k, y in enumerate(ys):  # one value given twice (a recurrent layer's output and its h)
        if y in ys[:k]:
            ys[k] = g.node("Identity", [y], "again")
    return g, ys


def compile_graph(model, key):
    """``model`` as an ``OnnxModel`` taking inputs of ``key`` (``written``) and giving the
    model's outputs, or None where some node has no form."""
    found = written(model, key)
    if found is None:
        return None
    g, ys = found
    names, items = input_names(model), _key_items(model, key)
    ranks = [(name, _rank_of(item)) for name, item in zip(names, items)]
    int64 = frozenset(name for name, item in zip(names, items) if type(item) is not int and item[0] == IDS)
    bools = frozenset(name for name, item in zip(names, items) if type(item) is not int and item[0] == MASK)
    return g.model(model.name, ranks, ys, int64, bools)


#: The layers that make a graph worth compiling: convolutions (the compiled graph folds their
#: normalizations and sums into them), recurrent layers (the same kernels, run with less
#: around them) and multi-head attention (an encoder block becomes one fused step). A graph holding none of them (dense networks, whose layer path binds each
#: Dense to one native call already) keeps the layer-by-layer path, which costs less than a
#: compiled model's call (measured in docs/design.md).
COMPILE_KINDS = frozenset(
    {
        f"{_LAYERS}.convolutional.Conv1D",
        f"{_LAYERS}.convolutional.Conv2D",
        f"{_LAYERS}.convolutional.DepthwiseConv2D",
        f"{_LAYERS}.convolutional.SeparableConv2D",
        f"{_LAYERS}.convolutional.Conv2DTranspose",
        f"{_LAYERS}.blocks.InceptionBlock",
        f"{_LAYERS}.blocks.NiNBlock",
        *_RNN_KINDS,
        f"{_LAYERS}.bidirectional.Bidirectional",
        f"{_LAYERS}.attention.MultiHeadAttention",
        f"{_LAYERS}.attention.SelfAttention",
    }
)


def _weights_held(model) -> tuple:
    """(layer, attribute name, array) of every array the model's layers hold: their weights
    and the constants derived from them (BatchNormalization's folded scale and shift,
    Rescaling's), which ``set_weights``, ``load_weights`` and an assignment replace
    (``_current``)."""
    return tuple(
        (layer, name, value)
        for layer in _all_layers(model)
        for name, value in vars(layer).items()
        if type(value) is np.ndarray
    )


def _all_layers(model):
    """The layers of ``model``, those of the models it uses as layers included."""
    for layer in model._layers:
        yield layer
        if _class_name(layer) in _MODELS:
            yield from _all_layers(layer)


def _current(held) -> bool:
    """Whether every array ``_weights_held`` listed is still its layer's."""
    for layer, name, array in held:
        if getattr(layer, name) is not array:
            return False
    return True


_lock = threading.Lock()
#: The key under which a model's table holds whether its graph holds a layer of COMPILE_KINDS.
KINDS_KEY = "kinds"


#: A key item's mark for int64 ids (an input whose dtype the model keeps).
IDS = "ids"
#: A key item's mark for a bool mask (an input recurrent layers read as their mask only).
MASK = "mask"
_INT64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def _key(x):
    """The key of prepared inputs ``x`` (an array, or a list of one per input): per input its
    rank (float32), ``(IDS, rank)`` (int64 ids, checked by ``_checked_ids``) or ``(MASK,
    rank)`` (a bool mask, ``_as_masks``); one item for one input, else their tuple. None where
    an input is another kind of array or has no axes."""
    if type(x) is np.ndarray:
        return _key_item(x)
    items = tuple(_key_item(a) for a in x)
    return None if None in items else items


def _key_item(a):
    if type(a) is not np.ndarray or not a.ndim:
        return None
    if a.dtype is _FLOAT32:
        return a.ndim
    if a.dtype == _INT64:
        return (IDS, a.ndim)
    return (MASK, a.ndim) if a.dtype == _BOOL else None


#: The keys under which a model's table holds its ids inputs (``_id_readers``) and its mask
#: inputs (``_mask_inputs``).
IDS_KEY = "ids"
MASKS_KEY = "masks"


def _mask_inputs(model) -> tuple:
    """Indices of the model inputs that recurrent layers (and Bidirectional) read as their mask
    only (a mask the caller gives, ``layer(x, mask=m)``): the compiled model takes them as bool,
    x != 0 as the layers read a mask (``_as_masks``)."""
    found = []
    for k, t in enumerate(model.inputs):
        uses = [(node, i) for node in model._nodes for i, p in enumerate(node.parents) if p is t]
        if uses and all(_reads_as_mask(node, i) for node, i in uses):
            found.append(k)
    return tuple(found)


def _reads_as_mask(node, i: int) -> bool:
    """Whether parent ``i`` of a graph node is a recurrent layer's mask: [x, *states, mask]."""
    kwargs = node.kwargs or {}
    return (
        FORMS.get(_class_name(node.layer)) in _TAKES_MASKS
        and bool(kwargs.get("has_mask"))
        and i == 1 + kwargs.get("n_states", 0)
    )


def _as_masks(x, masks):
    """``x`` with each mask input (``_mask_inputs``) as bool, nonzero where the layers take a
    step (their ``nonzero_mask``); device arrays as they are (no key: the layer path)."""
    xs = [x] if type(x) is np.ndarray else list(x)
    for k in masks:
        if type(xs[k]) is np.ndarray and xs[k].dtype != _BOOL:
            xs[k] = xs[k] != 0
    return xs[0] if type(x) is np.ndarray else xs


def _id_readers(model, masks=()):
    """(index, Embedding layers reading it) of each model input read by Embeddings (and their
    masks, ``PaddingMask``) only (ids:
    integers, or floats holding whole numbers where the model's Input is float, as Keras casts
    them), or None where an input whose dtype the model keeps (integers) feeds another layer
    (but as a recurrent layer's mask: an input of ``masks``)."""
    found = []
    for k, t in enumerate(model.inputs):
        if k in masks:
            continue
        readers = [node.layer for node in model._nodes if any(p is t for p in node.parents)]
        embeddings = [layer for layer in readers if _class_name(layer) == f"{_LAYERS}.core.Embedding"]
        padding = [layer for layer in readers if _class_name(layer) == f"{_LAYERS}.recurrent.PaddingMask"]
        if embeddings and len(embeddings) + len(padding) == len(readers):
            found.append((k, embeddings))
        elif getattr(t.node.layer, "keep_dtype", False):
            return None
    return tuple(found)


def _checked_ids(x, readers):
    """``x`` with each ids input checked and cast by the Embeddings reading it (their own
    errors: an index outside the table, non-integer floats), as the layer path checks them."""
    xs = [x] if type(x) is np.ndarray else list(x)
    for k, layers in readers:
        for layer in layers:
            xs[k] = layer._prepare_inputs(xs[k])
    return xs[0] if type(x) is np.ndarray else xs


def compiled_call(model, x, plans: dict, enabled: bool | None = None):
    """``model``'s output on ``x`` (its prepared input: an array, or a list of one per input)
    through its compiled model where one serves (see the module docstring), else None.
    ``plans``: the model's own table, ``_key`` -> (weights held, derived generation,
    OnnxModel or None), emptied when its graph is rebuilt; ``enabled``: the model's own choice
    (None: the ``native_plans`` setting in force)."""
    worth = plans.get(KINDS_KEY)
    if worth is None:  # the graph's layers do not change while the table lives
        worth = plans[KINDS_KEY] = _holds_compile_kind(model)
        if worth:
            masks = plans[MASKS_KEY] = _mask_inputs(model)
            plans[IDS_KEY] = _id_readers(model, masks)
    if not worth or not (settings.current().native_plans if enabled is None else enabled):
        return None
    readers = plans[IDS_KEY]
    if readers is None:
        return None
    if readers:
        x = _checked_ids(x, readers)
    if plans[MASKS_KEY]:
        x = _as_masks(x, plans[MASKS_KEY])
    key = _key(x)
    if key is None:
        return None
    hit = plans.get(key)
    if hit is not None and hit[2] is None:  # no form: the layers' configuration, not their arrays
        return None
    fresh = hit is None or hit[1] != derived_generation() or not _current(hit[0])
    if hit is None or fresh:
        with _lock:
            held, generation = _weights_held(model), derived_generation()
            compiled = compile_graph(model, key)
            plans[key] = (held, generation, compiled)
    else:
        compiled = hit[2]
    if compiled is None:
        return None
    xs = (x,) if type(x) is np.ndarray else x
    try:
        if fresh:  # a first call, so that this one builds the native plan (at a key's second
            compiled(*xs)  # call): the one a warm-up makes serves the first real call
        y = compiled(*xs)
    except FastlayersError:  # the layers' own checks name what is wrong
        return None
    return y if model._single_output or type(y) is list else [y]


def _holds_compile_kind(model) -> bool:
    return any(_class_name(layer) in COMPILE_KINDS for layer in _all_layers(model))
