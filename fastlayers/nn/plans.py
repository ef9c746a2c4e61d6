"""``nn.Sequential`` models run as ONNX plans: one executor for a module stack and its export.

A Sequential holding a Linear or a convolution (``PRODUCTS``) whose every module has an
ONNX form (``FORMS``: one writer per module class, each writing the nodes torch's exporter
writes for it) is written once per input rank as an in-memory ONNX graph and imported as an exported file is (``onnx.importer.from_model``:
constant folding, the fusions, channels-last convolutions, native plans). Its calls on the cpu
backend then run that model: the steps a module stack and its ONNX export run are the same,
without the per-module layout moves and Python of the module-by-module path (a stack of
convolutions goes NCHW -> NHWC and back around each one there).

A call takes the compiled model where its input is a float32 numpy array of the rank it was
compiled for; anything else, a module without a form, or a compiled call that raises (a
wrong shape: the modules' own checks then raise their own errors) runs the modules one by
one. The compiled model is rebuilt after any module's attributes, parameters, buffers or
children change (``module.state_version``) and after ``clear_derived`` (an in-place weight
edit). ``LoadOptions(native_plans=False)`` in force turns the compiled path off.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from .. import settings
from ..backends import get_ops
from ..backends.derived import derived_generation
from ..errors import FastlayersError
from ..onnx.writer import GraphWriter
from . import functional_conv as FC
from .module import state_version

_FLOAT32 = np.dtype(np.float32)


class NoForm(Exception):
    """A module (or an input rank) that no ONNX form covers: the stack runs module by module."""


def _linear(g, m, x, rank):
    if rank < 1:
        raise NoForm
    y = g.node("MatMul", [x, g.const(m.weight.T, "weight_t")], "linear")
    return (y if m.bias is None else g.node("Add", [y, g.const(m.bias, "bias")], "linear_bias")), rank


def _activation(op_type, **fixed):
    def form(g, m, x, rank):
        return g.node(op_type, [x], op_type.lower(), **fixed), rank

    return form


def _clip(low, high):
    def form(g, m, x, rank):
        bounds = [g.const(np.array(low, np.float32), "min"), g.const(np.array(high, np.float32), "max")]
        return g.node("Clip", [x, *bounds], "clip"), rank

    return form


def _leaky_relu(g, m, x, rank):
    return g.node("LeakyRelu", [x], "leaky_relu", alpha=m.negative_slope), rank


def _elu(g, m, x, rank):
    return g.node("Elu", [x], "elu", alpha=m.alpha), rank


def _gelu(g, m, x, rank):
    if m.approximate not in ("none", "tanh"):
        raise NoForm
    return g.node("Gelu", [x], "gelu", approximate=m.approximate), rank


def _silu(g, m, x, rank):
    return g.node("Mul", [x, g.node("Sigmoid", [x], "sigmoid")], "silu"), rank


def _softplus(g, m, x, rank):
    if m.beta != 1.0:  # torch's exporter writes beta 1 alone as Softplus
        raise NoForm
    return g.node("Softplus", [x], "softplus"), rank


def _softmax(op_type):
    def form(g, m, x, rank):
        if m.dim is None or rank < 1:  # torch's implicit dim is deprecated: left to the module
            raise NoForm
        return g.node(op_type, [x], op_type.lower(), axis=int(m.dim) % rank), rank

    return form


def _identity(g, m, x, rank):
    return x, rank


def _flatten(g, m, x, rank):
    if rank < 2 or m.start_dim % rank != 1 or m.end_dim % rank != rank - 1:
        raise NoForm
    return g.node("Flatten", [x], "flatten", axis=1), 2


def _layer_norm(g, m, x, rank):
    shape = tuple(m.normalized_shape)
    if rank < len(shape):
        raise NoForm
    scale = m.weight if m.weight is not None else np.ones(shape, np.float32)
    bias = m.bias if m.bias is not None else np.zeros(shape, np.float32)
    inputs = [x, g.const(scale, "ln_scale"), g.const(bias, "ln_bias")]
    return g.node("LayerNormalization", inputs, "layer_norm", axis=-len(shape), epsilon=m.eps), rank


def _batch_norm(g, m, x, rank):
    """The module's folded scale and shift per channel (axis 1): a Mul and an Add, which the
    import folds into a convolution before it or fuses with the activation after it."""
    if rank not in m._ranks or not m.track_running_stats:
        raise NoForm
    shape = (-1,) + (1,) * (rank - 2)
    scale, shift = (g.const(np.asarray(v, np.float32).reshape(shape), "bn") for v in m._folded)
    return g.node("Add", [g.node("Mul", [x, scale], "bn_scale"), shift], "bn_shift"), rank


def _conv(g, m, x, rank):
    r = m._rank
    if rank != r + 2 or m._transposed:
        raise NoForm
    pads = FC.conv_pads(m.padding, r, m.kernel_size, m.stride, m.dilation, type(m).__name__)
    inputs = [x, g.const(m.weight, "conv_weight")] + ([] if m.bias is None else [g.const(m.bias, "conv_bias")])
    y = g.node(
        "Conv",
        inputs,
        "conv",
        kernel_shape=list(m.kernel_size),
        strides=list(m.stride),
        dilations=list(m.dilation),
        pads=[p[0] for p in pads] + [p[1] for p in pads],
        group=m.groups,
    )
    return y, rank


def _conv_transpose(g, m, x, rank):
    if rank != 4:
        raise NoForm
    inputs = [x, g.const(m.weight, "deconv_weight")] + ([] if m.bias is None else [g.const(m.bias, "deconv_bias")])
    y = g.node(
        "ConvTranspose",
        inputs,
        "conv_transpose",
        kernel_shape=list(m.kernel_size),
        strides=list(m.stride),
        dilations=list(m.dilation),
        pads=list(m.padding) * 2,
        output_padding=list(m.output_padding),
        group=m.groups,
    )
    return y, rank


def _upsample(g, m, x, rank):
    """Resize by ``scale_factor`` as torch's exporter writes it (a ``size`` needs the batch and
    channels, unknown here: left to the module)."""
    if rank != 4 or m.scale_factor is None or m.size is not None or m.recompute_scale_factor:
        raise NoForm
    sf = m.scale_factor
    factors = tuple(float(v) for v in sf) if isinstance(sf, (tuple, list)) else (float(sf), float(sf))
    if len(factors) != 2:
        raise NoForm
    scales = g.const(np.array([1.0, 1.0, *factors], np.float32), "scales")
    if m.mode == "nearest":
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        corners = "align_corners" if m.align_corners else "pytorch_half_pixel"
        attrs = {"mode": "linear", "coordinate_transformation_mode": corners}
    return g.node("Resize", [x, "", scales], "upsample", **attrs), rank


def _window(m, r, what):
    """(kernel, stride, padding, dilation) of a pooling module as tuples of ``r`` ints."""
    kernel = FC._tuple(m.kernel_size, r, f"{what} kernel_size")
    stride = kernel if m.stride is None else FC._tuple(m.stride, r, f"{what} stride")
    return kernel, stride, FC._tuple(m.padding, r, f"{what} padding"), FC._tuple(getattr(m, "dilation", 1), r, what)


def _max_pool(r):
    def form(g, m, x, rank):
        if rank != r + 2:
            raise NoForm
        kernel, stride, padding, dilation = _window(m, r, type(m).__name__)
        y = g.node(
            "MaxPool",
            [x],
            "max_pool",
            kernel_shape=list(kernel),
            strides=list(stride),
            pads=list(padding) * 2,
            dilations=list(dilation),
            ceil_mode=int(bool(m.ceil_mode)),
        )
        return y, rank

    return form


def _avg_pool(r):
    def form(g, m, x, rank):
        # torch's ceil_mode windows and divisor_override have no ONNX AveragePool twin
        if rank != r + 2 or m.ceil_mode or getattr(m, "divisor_override", None) is not None:
            raise NoForm
        kernel, stride, padding, _ = _window(m, r, type(m).__name__)
        y = g.node(
            "AveragePool",
            [x],
            "avg_pool",
            kernel_shape=list(kernel),
            strides=list(stride),
            pads=list(padding) * 2,
            count_include_pad=int(bool(m.count_include_pad)),
        )
        return y, rank

    return form


def _global_pool(op_type, r):
    def form(g, m, x, rank):
        size = m.output_size
        ones = size in (1, (1,) * r, [1] * r)
        if rank != r + 2 or not ones:  # other bins: left to the module
            raise NoForm
        return g.node(op_type, [x], op_type.lower()), rank

    return form


def class_name(m) -> str:
    """A module's class by its full name, the key of ``FORMS``."""
    return f"{type(m).__module__}.{type(m).__qualname__}"


def _sequential(g, m, x, rank):
    for child in m._modules.values():
        if child is None:
            continue
        form = FORMS.get(class_name(child))
        if form is None:
            raise NoForm
        x, rank = form(g, child, x, rank)
    return x, rank


#: Module class (by its full name: a subclass, whose forward may differ, has none) -> its ONNX
#: form: (graph, module, input value name, input rank) -> (output value name, output rank);
#: raises NoForm where the module's settings or the rank have none.
FORMS = {
    "fastlayers.nn.modules.Sequential": _sequential,
    "fastlayers.nn.modules.Identity": _identity,
    "fastlayers.nn.modules.Linear": _linear,
    "fastlayers.nn.modules.ReLU": _activation("Relu"),
    "fastlayers.nn.modules.ReLU6": _clip(0.0, 6.0),
    "fastlayers.nn.modules.SELU": _activation("Selu"),
    "fastlayers.nn.modules.Sigmoid": _activation("Sigmoid"),
    "fastlayers.nn.modules.Hardsigmoid": _activation("HardSigmoid", alpha=1.0 / 6.0, beta=0.5),
    "fastlayers.nn.modules.Tanh": _activation("Tanh"),
    "fastlayers.nn.modules.Softsign": _activation("Softsign"),
    "fastlayers.nn.modules.SiLU": _silu,
    "fastlayers.nn.modules.LeakyReLU": _leaky_relu,
    "fastlayers.nn.modules.ELU": _elu,
    "fastlayers.nn.modules.GELU": _gelu,
    "fastlayers.nn.modules.Softplus": _softplus,
    "fastlayers.nn.modules.Softmax": _softmax("Softmax"),
    "fastlayers.nn.modules.LogSoftmax": _softmax("LogSoftmax"),
    "fastlayers.nn.modules.Flatten": _flatten,
    "fastlayers.nn.modules.Dropout": _identity,
    "fastlayers.nn.modules.Dropout1d": _identity,
    "fastlayers.nn.modules.Dropout2d": _identity,
    "fastlayers.nn.modules.LayerNorm": _layer_norm,
    "fastlayers.nn.modules.BatchNorm1d": _batch_norm,
    "fastlayers.nn.modules.BatchNorm2d": _batch_norm,
    "fastlayers.nn.conv.Conv1d": _conv,
    "fastlayers.nn.conv.Conv2d": _conv,
    "fastlayers.nn.conv.ConvTranspose2d": _conv_transpose,
    "fastlayers.nn.conv.Upsample": _upsample,
    "fastlayers.nn.conv.MaxPool1d": _max_pool(1),
    "fastlayers.nn.conv.MaxPool2d": _max_pool(2),
    "fastlayers.nn.conv.AvgPool1d": _avg_pool(1),
    "fastlayers.nn.conv.AvgPool2d": _avg_pool(2),
    "fastlayers.nn.conv.AdaptiveAvgPool1d": _global_pool("GlobalAveragePool", 1),
    "fastlayers.nn.conv.AdaptiveAvgPool2d": _global_pool("GlobalAveragePool", 2),
    "fastlayers.nn.conv.AdaptiveMaxPool1d": _global_pool("GlobalMaxPool", 1),
    "fastlayers.nn.conv.AdaptiveMaxPool2d": _global_pool("GlobalMaxPool", 2),
}


#: The modules whose kernels the compiled model runs better than the modules do (dense
#: chains, channels-last convolutions with their normalizations and activations folded in): a
#: stack holding none of them keeps the module-by-module path, whose one kernel per module
#: costs less than a compiled model's call (measured in docs/design.md).
PRODUCTS = frozenset({"fastlayers.nn.modules.Linear", "fastlayers.nn.conv.Conv1d", "fastlayers.nn.conv.Conv2d"})


def holds_product(m) -> bool:
    """Whether ``m``'s children (at any depth) hold a module of ``PRODUCTS``."""
    return any(class_name(c) in PRODUCTS or holds_product(c) for c in m._modules.values() if c is not None)


def compile_sequential(seq, rank: int):
    """``seq`` (a Sequential) as an ``OnnxModel`` taking one float32 input of ``rank`` axes,
    or None where some module has no form for it or none is a product (``PRODUCTS``)."""
    if not holds_product(seq):
        return None
    g = GraphWriter()
    try:
        y, _ = _sequential(g, seq, "input", rank)
    except NoForm:
        return None
    return g.model(type(seq).__name__, [("input", rank)], [y])


#: Sequential -> {input rank: ((state version, derived generation), OnnxModel or None)}.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def compiled_call(seq, x):
    """``seq(x)`` through its compiled model where one serves (see the module docstring),
    else None."""
    if type(x) is not np.ndarray or x.dtype is not _FLOAT32 or not x.ndim or get_ops().name != "cpu":
        return None
    if not settings.current().native_plans:
        return None
    stamp = (state_version(), derived_generation())
    entry = _COMPILED.get(seq)
    hit = None if entry is None else entry.get(x.ndim)
    if hit is None or hit[0] != stamp:
        with _lock:
            model = compile_sequential(seq, x.ndim)
            _COMPILED.setdefault(seq, {})[x.ndim] = (stamp, model)
    else:
        model = hit[1]
    if model is None:
        return None
    try:
        return model(x)
    except FastlayersError:  # the modules' own checks name what is wrong
        return None
