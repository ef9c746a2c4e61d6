"""Whole pickled ``torch.nn`` modules (``torch.save(model)``) rebuilt as ``fastlayers.nn``
(``load_torch_module``, used by ``fastlayers.load``): a table from torch class name to builder,
the checks of each record's attributes, and the strict weight load afterwards.
"""

from __future__ import annotations

import contextvars
import math
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from ... import settings
from ...errors import (
    FastlayersError,
    ModelFileError,
    ShapeError,
    StateDictError,
    UnsupportedError,
)
from .archive import read_torch_pickle
from .records import (
    ONNX_HINT,
    TorchFunctionRef,
    TorchModuleRecord,
    UnknownGlobal,
    brepr,
    check_module_tree,
    is_module_like,
)

#: Modules rebuilt from a pickle: strides, dilations, pooling windows, adaptive and resize output
#: sizes at most ``torch_max_geometry`` (``_geometry()``), resize scale factors at most
#: MAX_SCALE; a convolution's padding at most its dilated kernel (dilation x kernel_size), a
#: transposed convolution's stride too. Every size that a module's tensors have must be
#: theirs (``_VALIDATORS``), so that a module allocates no more than the file holds.
MAX_SCALE = 64.0


def _geometry() -> int:
    """The largest size a pickled module's geometry may hold (``torch_max_geometry``)."""
    return settings.current().torch_max_geometry


#: torch.nn class name -> builder(record) -> an unloaded fastlayers.nn module.
#: A builder only passes constructor arguments, read from the pickled attributes
#: (``record["in_features"]``, ``record.get("eps", 1e-5)``, ``record.has_param("bias")``);
#: containers also get their rebuilt children (``record`` is a ``TorchModuleRecord``).
#: The weights are loaded afterwards, strictly, from the record tree's state dict, so a builder
#: that makes the wrong structure fails with the missing/unexpected keys.
#: Adding a family is one entry, e.g. ``"Conv2d": from_attrs("Conv2d", "in_channels", ...,
#: bias=has_param("bias"))``; see ``register_torch_module``.
TORCH_MODULE_BUILDERS: dict[str, Callable] = {}


def register_torch_module(torch_name: str, builder: Callable) -> None:
    """Map the torch.nn class ``torch_name`` (e.g. ``"Conv2d"``) to ``builder(record)``."""
    TORCH_MODULE_BUILDERS[torch_name] = builder


def has_param(name: str) -> Callable:
    """Attribute getter for ``from_attrs``: whether the parameter ``name`` is present (not None)."""
    return lambda r: r.has_param(name)


class from_attrs:  # used like a function in the table
    """A builder calling ``fastlayers.nn.<cls_name>(**kwargs(record))``.

    Each name in ``names`` is a constructor keyword equal to the torch attribute of that name;
    attributes missing from an old pickle are left to the constructor's default. ``computed``
    maps keywords to functions of the record (``bias=has_param("bias")``). The class is looked up
    when a file is read, so an entry may name a module another part of fastlayers adds. The
    keywords are torch's own constructor arguments: ``kwargs(record)`` rebuilds the torch module
    too (``torch.nn.<cls_name>(**kwargs)``), which is how the tests check each entry.
    """

    def __init__(self, cls_name: str, *names: str, **computed: Callable):
        self.cls_name, self.names, self.computed = cls_name, names, computed

    def kwargs(self, r: TorchModuleRecord) -> dict:
        kwargs = {n: _plain(r, n, r[n]) for n in self.names if n in r.attrs}
        kwargs.update({k: f(r) for k, f in self.computed.items()})
        return kwargs

    def __call__(self, r: TorchModuleRecord):
        from ... import nn

        cls = getattr(nn, self.cls_name, None)
        if cls is None:
            raise UnsupportedError(f"torch.nn.{r.class_name}: fastlayers.nn has no {self.cls_name} yet")
        return cls(**self.kwargs(r))

    def __repr__(self):
        return f"from_attrs({self.cls_name!r}, {', '.join(map(repr, self.names))})"


def _plain(r: TorchModuleRecord, name: str, value):
    """``value`` when it is what a constructor argument may be: None, a bool, number or short
    string, or a tuple or list of at most 8 of those; else ``ModelFileError``."""
    scalar = (type(None), bool, int, float, str)
    ok = isinstance(value, scalar) or (isinstance(value, (tuple, list)) and len(value) <= 8
                                        and all(isinstance(v, scalar) for v in value))
    if ok and isinstance(value, str) and len(value) > 64:
        ok = False
    if not ok:
        path = getattr(r, "_path", "")
        raise ModelFileError(f"module {brepr(path) if path else '<root>'} ({r.torch_class}): "
                             f"attribute {brepr(name)} is {brepr(value)}, not a constructor argument")
    return value


def _children(r: TorchModuleRecord) -> OrderedDict:
    return OrderedDict((name, rebuild_module(child, f"{r._path}.{name}" if r._path else name))
                       for name, child in r.children.items())


def _sequential(r):
    from ... import nn

    return nn.Sequential(_children(r))


def _module_list(r):
    from ... import nn

    m = nn.ModuleList()
    for name, child in _children(r).items():
        m.add_module(name, child)
    return m


def _module_dict(r):
    from ... import nn

    return nn.ModuleDict(_children(r))


def _simple(cls_name: str, *names: str, **computed):
    register_torch_module(cls_name, from_attrs(cls_name, *names, **computed))


register_torch_module("Sequential", _sequential)
register_torch_module("ModuleList", _module_list)
register_torch_module("ModuleDict", _module_dict)
_simple("Identity")
_simple("Linear", "in_features", "out_features", bias=has_param("bias"))
register_torch_module("NonDynamicallyQuantizableLinear",  # MultiheadAttention.out_proj's class
                      from_attrs("Linear", "in_features", "out_features", bias=has_param("bias")))
for _name in ("ReLU", "ReLU6", "SELU", "Sigmoid", "Hardsigmoid", "Tanh", "Softsign", "SiLU"):
    _simple(_name)
_simple("LeakyReLU", "negative_slope")
_simple("ELU", "alpha")
_simple("GELU", "approximate")
_simple("Softplus", "beta", "threshold")
_simple("Softmax", "dim")
_simple("LogSoftmax", "dim")
_simple("Flatten", "start_dim", "end_dim")
for _name in ("Dropout", "Dropout1d", "Dropout2d"):
    _simple(_name, "p")
_simple("LayerNorm", "normalized_shape", "eps", "elementwise_affine",
        bias=lambda r: r.has_param("bias") or not r.get("elementwise_affine", True))
for _name in ("BatchNorm1d", "BatchNorm2d"):
    _simple(_name, "num_features", "eps", "momentum", "affine", "track_running_stats")
_simple("Embedding", "num_embeddings", "embedding_dim", "padding_idx", "max_norm")

# The families other modules of fastlayers.nn provide (conv/pool, recurrent, attention). The
# classes are resolved when a file is read; until fastlayers.nn has one, reading it raises
# UnsupportedError naming it. The keywords are torch's constructor arguments, which torch stores
# as attributes of the same name.
_CONV = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
         "padding_mode")
for _name in ("Conv1d", "Conv2d"):
    _simple(_name, *_CONV, bias=has_param("bias"))
_simple("ConvTranspose2d", *_CONV, "output_padding", bias=has_param("bias"))
for _name in ("MaxPool1d", "MaxPool2d"):
    _simple(_name, "kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
_simple("AvgPool1d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
_simple("AvgPool2d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
        "divisor_override")
for _name in ("AdaptiveAvgPool1d", "AdaptiveAvgPool2d"):
    _simple(_name, "output_size")
for _name in ("AdaptiveMaxPool1d", "AdaptiveMaxPool2d"):
    _simple(_name, "output_size", "return_indices")
_simple("Upsample", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor")
_RNN = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
_simple("RNN", *_RNN, "nonlinearity")
_simple("LSTM", *_RNN, "proj_size")
_simple("GRU", *_RNN)
_simple("RNNCell", "input_size", "hidden_size", "bias", "nonlinearity")
_simple("LSTMCell", "input_size", "hidden_size", "bias")
_simple("GRUCell", "input_size", "hidden_size", "bias")
_simple("MultiheadAttention", "embed_dim", "num_heads", "dropout", "add_zero_attn", "kdim", "vdim",
        "batch_first", bias=has_param("in_proj_bias"), add_bias_kv=has_param("bias_k"))


def _activation_name(r: TorchModuleRecord) -> str:
    """TransformerEncoderLayer's activation: a function reference or a module, as a name."""
    act = r.get("activation", r.children.get("activation"))
    if isinstance(act, type) and issubclass(act, TorchFunctionRef):  # the function itself
        name = act.function_name
    elif isinstance(act, TorchModuleRecord):
        name = act.class_name.lower()
    else:
        what = getattr(act, "global_name", type(act).__name__)
        raise UnsupportedError(f"torch.nn.{r.class_name}: activation {what} is not relu or gelu")
    if name not in ("relu", "gelu"):
        raise UnsupportedError(f"torch.nn.{r.class_name}: activation {name!r} is not relu or gelu")
    return name


def _transformer_layer(cls_name: str) -> Callable:
    computed = {
        "d_model": lambda r: r.child("self_attn")["embed_dim"],
        "nhead": lambda r: r.child("self_attn")["num_heads"],
        "dim_feedforward": lambda r: r.child("linear1")["out_features"],
        "dropout": lambda r: r.child("dropout")["p"],
        "activation": _activation_name,
        "layer_norm_eps": lambda r: r.child("norm1")["eps"],
        "batch_first": lambda r: r.child("self_attn").get("batch_first", False),
        "norm_first": lambda r: r.get("norm_first", False),
        "bias": lambda r: r.child("linear1").has_param("bias"),
    }
    return from_attrs(cls_name, **computed)


register_torch_module("TransformerEncoderLayer", _transformer_layer("TransformerEncoderLayer"))
register_torch_module("TransformerDecoderLayer", _transformer_layer("TransformerDecoderLayer"))


def _transformer_stack(cls_name: str, layer_keyword: str) -> Callable:
    """TransformerEncoder/Decoder: the first layer rebuilt as the template, cloned num_layers times
    by the constructor (the loaded state dict then sets every clone's weights), optional norm."""
    def build(r: TorchModuleRecord):
        from ... import nn

        layers = r.child("layers")
        first = rebuild_module(layers.children["0"], f"{r._path}.layers.0" if r._path else "layers.0")
        norm = r.children.get("norm")
        return getattr(nn, cls_name)(**{layer_keyword: first, "num_layers": len(layers.children),
                                        "norm": None if norm is None else rebuild_module(norm, "norm")})
    return build


register_torch_module("TransformerEncoder", _transformer_stack("TransformerEncoder", "encoder_layer"))
register_torch_module("TransformerDecoder", _transformer_stack("TransformerDecoder", "decoder_layer"))


#: Modules rebuilt so far in this load, by record (a record several parents share is rebuilt
#: once, and its module shared, as torch shares it): id -> (record, module).
_REBUILT: contextvars.ContextVar = contextvars.ContextVar("torch_rebuilt", default=None)
#: The builders fastlayers registers itself: their records are validated (``_VALIDATORS``)
#: before they run; one registered over them (``register_torch_module``) validates its own.
_DEFAULT_BUILDERS = dict(TORCH_MODULE_BUILDERS)


def rebuild_module(record, path: str = ""):
    """The fastlayers.nn module for a ``TorchModuleRecord`` tree, weights not loaded yet."""
    if isinstance(record, UnknownGlobal):
        raise UnsupportedError(
            f"module {path or '<root>'} is an instance of {record.global_name}, not a standard "
            f"torch.nn class; fastlayers rebuilds only torch.nn classes from a pickle without "
            f"running its code: {ONNX_HINT}")
    if not isinstance(record, TorchModuleRecord):
        raise ModelFileError(f"module {path or '<root>'} is a {type(record).__name__}, not a module")
    builder = TORCH_MODULE_BUILDERS.get(record.class_name)
    if builder is None or not record.torch_class.startswith("torch.nn.modules."):
        raise UnsupportedError(f"module {path or '<root>'}: {record.torch_class} is not supported by "
                               f"fastlayers.load yet; {ONNX_HINT}")
    memo = _REBUILT.get()
    if memo is not None and id(record) in memo:   # a module shared by several parents, as torch
        return memo[id(record)][1]
    object.__setattr__(record, "_path", path)
    try:
        validate = _VALIDATORS.get(record.class_name)
        if validate is not None and builder is _DEFAULT_BUILDERS.get(record.class_name):
            validate(_Check(record, path))
        module = _without_initial_weights(builder(record))
        if memo is not None:
            memo[id(record)] = (record, module)
        return module
    except FastlayersError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, MemoryError, OverflowError) as e:
        raise ModelFileError(f"module {path or '<root>'} ({record.torch_class}): cannot rebuild from "
                             f"the pickled attributes ({type(e).__name__}: {str(e)[:200]})") from e


def _without_initial_weights(module):
    """``module`` with the weights its constructor drew replaced by empty stand-ins of the
    same shape and dtype (``load_state_dict`` copies the file's over them): a module being
    rebuilt never holds its random initial weights beside the file's and their copies."""
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, value in table.items():
                if isinstance(value, np.ndarray) and value.strides != (0,) * value.ndim:
                    table[name] = np.broadcast_to(np.zeros((), value.dtype), value.shape)
    return module


# ------------------------------------------------------------------- attribute validation
_MISSING = object()


class _Check:
    """The checks of one module record before its module is built: each attribute's type and
    range (``torch_max_geometry`` ...), and the shapes of its own parameters and buffers against the
    sizes its attributes declare (``tensors``), so that the module allocates what the file
    holds, no more. Errors are ``ModelFileError`` naming the module path and the attribute."""

    def __init__(self, r: TorchModuleRecord, path: str):
        self.r, self.path = r, path

    def fail(self, what: str):
        raise ModelFileError(f"module {brepr(self.path) if self.path else '<root>'} "
                             f"({self.r.torch_class}): {what}")

    def value(self, name, default=_MISSING):
        if name in self.r.attrs:
            return _plain(self.r, name, self.r.attrs[name])
        if default is _MISSING:
            self.fail(f"attribute {name!r} is missing")
        return default

    def int(self, name, lo=0, hi=None, default=_MISSING, none=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected an int in [{lo}, "
                      f"{'...' if hi is None else hi}]")
        return v

    def flag(self, name, default=False, none=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if v not in (True, False, 0, 1) or isinstance(v, float):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected True or False")
        return bool(v)

    def float(self, name, lo=None, hi=None, default=_MISSING, none=False, nonzero=False):
        v = self.value(name, default)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (lo is not None and v < lo) or (hi is not None and v > hi) or (nonzero and v == 0):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected a finite number"
                      + (" other than 0" if nonzero else "")
                      + (f" in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
                         if lo is not None or hi is not None else ""))
        return float(v)

    def choice(self, name, choices, default=_MISSING):
        v = self.value(name, default)
        if v not in choices:
            self.fail(f"attribute {name!r} is {brepr(v)}; expected one of {', '.join(map(repr, choices))}")
        return v

    def ints(self, name, n, lo, hi, default=_MISSING, none=False, none_items=False):
        """An int or n ints (a tuple or list) in [lo, hi], as a tuple (None items allowed with
        ``none_items``)."""
        v = self.value(name, default)
        if v is None and none:
            return None
        items = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else v
        ok = isinstance(items, (tuple, list)) and len(items) == n and all(
            (x is None and none_items) or (isinstance(x, int) and not isinstance(x, bool)
                                           and lo <= x <= hi) for x in items)
        if not ok:
            self.fail(f"attribute {name!r} is {brepr(v)}; expected an int or {n} ints in [{lo}, {hi}]")
        return tuple(items)

    def tensors(self, expected: dict):
        """The record's own parameters and persistent buffers must be ``expected`` (name ->
        shape), exactly."""
        r = self.r
        skip = r.state.get("_non_persistent_buffers_set") or ()
        have = {k: v for k, v in r.parameters.items() if v is not None}
        have.update({k: v for k, v in r.buffers.items() if v is not None and k not in skip})
        for name, shape in expected.items():
            if name not in have:
                self.fail(f"tensor {name!r} of shape {shape} is missing")
            if tuple(have[name].shape) != tuple(shape):
                self.fail(f"tensor {name!r} has shape {tuple(have[name].shape)}; its attributes "
                          f"declare {tuple(shape)}")
            kinds = "f" if name in r.parameters else "fiub"
            if have[name].dtype.kind not in kinds:
                self.fail(f"tensor {name!r} is {have[name].dtype}, not "
                          + ("floating point" if kinds == "f" else "real"))
        extra = [k for k in have if k not in expected]
        if extra:
            self.fail(f"tensor(s) {brepr(extra[:5])} are not those of a {r.class_name}")

    def child(self, name) -> _Check:
        c = self.r.children.get(name)
        if not isinstance(c, TorchModuleRecord):
            self.fail(f"child module {name!r} is missing")
        return _Check(c, f"{self.path}.{name}" if self.path else name)


def _no_tensors(c: _Check):
    c.tensors({})


def _linear(c: _Check):
    i, o = c.int("in_features"), c.int("out_features")
    c.tensors({"weight": (o, i), **({"bias": (o,)} if c.r.has_param("bias") else {})})
    return i, o


def _layer_norm(c: _Check):
    shape = c.value("normalized_shape")
    shape = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        c.fail(f"attribute 'normalized_shape' is {brepr(shape)}; expected up to 8 sizes")
    c.float("eps", 0.0, default=1e-5)
    affine = c.flag("elementwise_affine", True)
    expected = {"weight": tuple(shape)} if affine else {}
    if affine and c.r.has_param("bias"):
        expected["bias"] = tuple(shape)
    c.tensors(expected)
    return tuple(shape)


def _batch_norm(c: _Check):
    n = c.int("num_features")
    c.float("eps", 0.0, default=1e-5)
    c.float("momentum", none=True, default=0.1)
    affine, track = c.flag("affine", True), c.flag("track_running_stats", True)
    expected = {}
    if affine:
        expected.update(weight=(n,), **({"bias": (n,)} if c.r.has_param("bias") else {}))
    if track:
        expected.update(running_mean=(n,), running_var=(n,))
        if c.r.buffers.get("num_batches_tracked") is not None:
            expected["num_batches_tracked"] = ()
    c.tensors(expected)


def _embedding(c: _Check):
    n, d = c.int("num_embeddings"), c.int("embedding_dim")
    c.int("padding_idx", -n, max(n - 1, 0), default=None, none=True)
    c.tensors({"weight": (n, d)})


def _conv(rank, transposed):
    def check(c: _Check):
        cin, cout = c.int("in_channels", 1), c.int("out_channels", 1)
        groups = c.int("groups", 1, default=1)
        if cin % groups or cout % groups:
            c.fail(f"groups={groups} does not divide in_channels={cin} and out_channels={cout}")
        kernel = c.ints("kernel_size", rank, 1, 1 << 31)
        stride = c.ints("stride", rank, 1, _geometry(), default=1)
        dilation = c.ints("dilation", rank, 1, _geometry(), default=1)
        extent = [d * k for d, k in zip(dilation, kernel)]
        padding = c.value("padding", 0)
        if not (isinstance(padding, str) and padding in ("same", "valid") and not transposed):
            padding = c.ints("padding", rank, 0, _geometry(), default=0)
            if any(p > e for p, e in zip(padding, extent)):
                c.fail(f"padding {padding} is wider than the dilated kernel {tuple(extent)}")
        out_pad = c.ints("output_padding", rank, 0, _geometry(), default=0)
        if transposed:
            if any(s > e for s, e in zip(stride, extent)):
                c.fail(f"stride {stride} is longer than the dilated kernel {tuple(extent)}")
            if any(o >= s and o >= d for o, s, d in zip(out_pad, stride, dilation)):
                c.fail(f"output_padding {out_pad} is not smaller than stride {stride} or dilation "
                       f"{dilation}")
        c.value("padding_mode", "zeros")
        shape = (cin, cout // groups) if transposed else (cout, cin // groups)
        c.tensors({"weight": shape + kernel, **({"bias": (cout,)} if c.r.has_param("bias") else {})})
    return check


def _pool(rank, kind):
    def check(c: _Check):
        kernel = c.ints("kernel_size", rank, 1, _geometry())
        c.ints("stride", rank, 1, _geometry(), default=None, none=True)
        padding = c.ints("padding", rank, 0, _geometry(), default=0)
        if any(p > k // 2 for p, k in zip(padding, kernel)):
            c.fail(f"padding {padding} is more than half the kernel {kernel}")
        if kind == "max":
            c.ints("dilation", rank, 1, _geometry(), default=1)
            c.flag("return_indices")
        else:
            c.flag("count_include_pad", True)
            c.int("divisor_override", 1, default=None, none=True)
        c.flag("ceil_mode")
        c.tensors({})
    return check


def _adaptive(rank):
    def check(c: _Check):
        c.ints("output_size", rank, 1, _geometry(), none_items=rank == 2)
        c.flag("return_indices")
        c.tensors({})
    return check


def _upsample(c: _Check):
    size, scale = c.value("size", None), c.value("scale_factor", None)
    if size is not None:
        c.ints("size", 2, 1, _geometry())
    if scale is not None:
        items = scale if isinstance(scale, (tuple, list)) else (scale,)
        if not 1 <= len(items) <= 2 or not all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= MAX_SCALE
                for f in items):
            c.fail(f"attribute 'scale_factor' is {brepr(scale)}; expected factors in (0, {MAX_SCALE}]")
    c.value("mode", "nearest")
    c.flag("align_corners", none=True, default=None)
    c.flag("recompute_scale_factor", none=True, default=None)
    c.tensors({})


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4, "RNNCell": 1, "GRUCell": 3, "LSTMCell": 4}


def _recurrent(c: _Check):
    kind = c.r.class_name
    gates = _GATES[kind]
    i, h = c.int("input_size"), c.int("hidden_size", 1)
    layers = c.int("num_layers", 1, 1 << 12, default=1)
    bias, dirs = c.flag("bias", True), 2 if c.flag("bidirectional") else 1
    c.flag("batch_first")
    c.float("dropout", 0.0, 1.0, default=0.0)
    proj = c.int("proj_size", 0, max(h - 1, 0), default=0) if kind == "LSTM" else 0
    if kind == "RNN":
        c.choice("nonlinearity", ("tanh", "relu"), "tanh")
    out = proj or h
    expected = {}
    for layer in range(layers):
        for suffix in ("", "_reverse")[:dirs]:
            key = f"l{layer}{suffix}"
            expected[f"weight_ih_{key}"] = (gates * h, i if layer == 0 else out * dirs)
            expected[f"weight_hh_{key}"] = (gates * h, out)
            if bias:
                expected[f"bias_ih_{key}"] = expected[f"bias_hh_{key}"] = (gates * h,)
            if proj:
                expected[f"weight_hr_{key}"] = (proj, h)
    c.tensors(expected)


def _cell(c: _Check):
    gates = _GATES[c.r.class_name]
    i, h = c.int("input_size"), c.int("hidden_size", 1)
    bias = c.flag("bias", True)
    if c.r.class_name == "RNNCell":
        c.choice("nonlinearity", ("tanh", "relu"), "tanh")
    c.tensors({"weight_ih": (gates * h, i), "weight_hh": (gates * h, h),
               **({"bias_ih": (gates * h,), "bias_hh": (gates * h,)} if bias else {})})


def _attention(c: _Check) -> int:
    e, heads = c.int("embed_dim", 1), c.int("num_heads", 1)
    if e % heads:
        c.fail(f"num_heads={heads} does not divide embed_dim={e}")
    kdim, vdim = c.int("kdim", 1, default=e, none=True) or e, c.int("vdim", 1, default=e, none=True) or e
    c.float("dropout", 0.0, 1.0, default=0.0)
    c.flag("batch_first")
    c.flag("add_zero_attn")
    expected = ({"in_proj_weight": (3 * e, e)} if kdim == e and vdim == e else
                {"q_proj_weight": (e, e), "k_proj_weight": (e, kdim), "v_proj_weight": (e, vdim)})
    if c.r.has_param("in_proj_bias"):
        expected["in_proj_bias"] = (3 * e,)
    if c.r.has_param("bias_k"):
        expected.update(bias_k=(1, 1, e), bias_v=(1, 1, e))
    c.tensors(expected)
    out = c.child("out_proj")
    if _linear(out) != (e, e):
        out.fail(f"the out-projection is not ({e}, {e})")
    return e


def _check_transformer_layer(decoder):
    def check(c: _Check):
        e = _attention(c.child("self_attn"))
        if decoder and _attention(c.child("multihead_attn")) != e:
            c.fail("its two attention blocks differ in width")
        i1, ff = _linear(c.child("linear1"))
        ff2, o2 = _linear(c.child("linear2"))
        if (i1, o2, ff2) != (e, e, ff):
            c.fail(f"linear1 ({i1} -> {ff}) and linear2 ({ff2} -> {o2}) do not fit width {e}")
        for norm in ("norm1", "norm2", "norm3")[:3 if decoder else 2]:
            if _layer_norm(c.child(norm)) != (e,):
                c.fail(f"{norm} does not normalize width {e}")
        c.flag("norm_first")
        c.tensors({})
    return check


def _check_transformer_stack(c: _Check):
    layers = c.child("layers")
    items = list(layers.r.children.values())
    if not items:
        layers.fail("holds no layers")
    first = [(k, v.shape) for k, v in items[0].state_dict().items()]
    for k, item in enumerate(items[1:], 1):
        if not isinstance(item, TorchModuleRecord) or item.class_name != items[0].class_name or \
                [(n, v.shape) for n, v in item.state_dict().items()] != first:
            layers.fail(f"layer {k} differs from layer 0 (the layers are clones of one)")
    c.tensors({})


_VALIDATORS: dict[str, Callable] = {
    "Linear": _linear, "NonDynamicallyQuantizableLinear": _linear, "LayerNorm": _layer_norm,
    "BatchNorm1d": _batch_norm, "BatchNorm2d": _batch_norm, "Embedding": _embedding,
    "Conv1d": _conv(1, False), "Conv2d": _conv(2, False), "ConvTranspose2d": _conv(2, True),
    "MaxPool1d": _pool(1, "max"), "MaxPool2d": _pool(2, "max"), "AvgPool1d": _pool(1, "avg"),
    "AvgPool2d": _pool(2, "avg"), "AdaptiveAvgPool1d": _adaptive(1), "AdaptiveAvgPool2d": _adaptive(2),
    "AdaptiveMaxPool1d": _adaptive(1), "AdaptiveMaxPool2d": _adaptive(2), "Upsample": _upsample,
    "RNN": _recurrent, "LSTM": _recurrent, "GRU": _recurrent, "RNNCell": _cell,
    "LSTMCell": _cell, "GRUCell": _cell, "MultiheadAttention": _attention,
    "TransformerEncoderLayer": _check_transformer_layer(False),
    "TransformerDecoderLayer": _check_transformer_layer(True),
    "TransformerEncoder": _check_transformer_stack, "TransformerDecoder": _check_transformer_stack,
    "LeakyReLU": lambda c: (c.float("negative_slope", default=0.01), c.tensors({})),
    "ELU": lambda c: (c.float("alpha", default=1.0), c.tensors({})),
    "GELU": lambda c: (c.choice("approximate", ("none", "tanh"), "none"), c.tensors({})),
    "Softplus": lambda c: (c.float("beta", default=1.0, nonzero=True), c.float("threshold", default=20.0),
                           c.tensors({})),
    "Softmax": lambda c: (c.int("dim", -64, 63, default=None, none=True), c.tensors({})),
    "LogSoftmax": lambda c: (c.int("dim", -64, 63, default=None, none=True), c.tensors({})),
    "Flatten": lambda c: (c.int("start_dim", -64, 63, default=1), c.int("end_dim", -64, 63, default=-1),
                          c.tensors({})),
    **{name: (lambda c: (c.float("p", 0.0, 1.0, default=0.5), c.tensors({})))
       for name in ("Dropout", "Dropout1d", "Dropout2d")},
    **{name: _no_tensors for name in ("Identity", "ReLU", "ReLU6", "SELU", "Sigmoid", "Hardsigmoid",
                                      "Tanh", "Softsign", "SiLU")},
}


def load_torch_module(path):
    """Rebuild a whole pickled ``torch.nn`` module (``torch.save(model)``) as fastlayers.nn.

    Only standard torch.nn classes in ``TORCH_MODULE_BUILDERS`` are rebuilt, from their class
    references and pickled attributes; no code from the file runs and torch is not imported.

    Raises
    ------
    ModelFileError
        Unreadable, corrupt or refused file, or a file holding a state dict (weights only).
    UnsupportedError
        A custom class or a torch.nn class fastlayers does not rebuild (suggests ONNX export).
    """
    where = str(path)
    obj = read_torch_pickle(path, unknown_globals="record")
    if not is_module_like(obj):
        _reject_unknown(obj, where)
        if isinstance(obj, dict) and any(is_module_like(v) for v in obj.values()):
            names = [k for k, v in obj.items() if is_module_like(v)]
            raise ModelFileError(
                f"{where}: holds a dict whose entries {names[:5]} are modules; fastlayers.load reads "
                "a file holding one module (torch.save(model)); re-save that module alone, or port "
                "it to fastlayers.nn and use fastlayers.load_state_dict")
        if isinstance(obj, dict):
            raise ModelFileError(
                f"{where}: holds a state dict (weights only), not a model: build the model with "
                "fastlayers.nn and load the weights with model.load_state_dict("
                "fastlayers.load_state_dict(path))")
        raise ModelFileError(f"{where}: holds a {type(obj).__name__}, not a torch.nn module")
    token = _REBUILT.set({})
    try:
        check_module_tree(obj)
        _reject_unknown_attrs(obj, "")
        module = rebuild_module(obj)
        module.load_state_dict(obj.state_dict(), strict=True)
    except (ModelFileError, UnsupportedError) as e:
        raise type(e)(f"{where}: {e}") from None
    except (StateDictError, ShapeError) as e:
        raise ModelFileError(f"{where}: the rebuilt module does not match the pickled weights: "
                             f"{str(e)[:1000]}") from e
    finally:
        _REBUILT.reset(token)
    return module


def _reject_unknown(obj, where):
    """Refuse leftover unknown globals that are not custom modules (their value would be garbage)."""
    if isinstance(obj, type) and issubclass(obj, UnknownGlobal):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")
    if isinstance(obj, UnknownGlobal) and not is_module_like(obj):
        raise ModelFileError(f"{where}: refused global {obj.global_name}")


def _reject_unknown_attrs(record, path):
    if isinstance(record, TorchModuleRecord):
        for name, value in record.attrs.items():
            if name in ("_modules",):
                continue
            _reject_unknown(value, f"module {path or '<root>'} attribute {name!r}")
        for name, child in record.children.items():
            _reject_unknown_attrs(child, f"{path}.{name}" if path else name)
