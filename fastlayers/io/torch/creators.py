"""The creators of the torch.nn classes fastlayers rebuilds: for each class, its builder (most
are ``from_attrs``: a ``fastlayers.nn`` class called with torch's own constructor keywords, read
from the pickled attributes) beside its check (``checks.py``), as one ``TorchModuleCreator`` in
``TORCH_MODULE_CREATORS``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ...errors import UnsupportedError
from . import checks
from .records import TorchFunctionRef, TorchModuleRecord
from .registry import TORCH_MODULE_CREATORS, TorchModuleCreator, rebuild_module


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
        kwargs = {n: r.argument(n) for n in self.names if n in r.attrs}
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


def _children(r: TorchModuleRecord) -> OrderedDict:
    return OrderedDict(
        (name, rebuild_module(child, f"{r.path}.{name}" if r.path else name)) for name, child in r.children.items()
    )


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


def _add(torch_name: str, build: Callable, check: Callable | None) -> None:
    TORCH_MODULE_CREATORS[torch_name] = TorchModuleCreator(build, check)


def _simple(cls_name: str, *names: str, check: Callable, **computed):
    """The creator of ``cls_name``: ``from_attrs(cls_name, *names, **computed)`` after ``check``."""
    _add(cls_name, from_attrs(cls_name, *names, **computed), check)


_add("Sequential", _sequential, None)
_add("ModuleList", _module_list, None)
_add("ModuleDict", _module_dict, None)
_simple("Identity", check=checks.no_tensors)
_simple("Linear", "in_features", "out_features", bias=has_param("bias"), check=checks.linear)
_add(
    "NonDynamicallyQuantizableLinear",  # MultiheadAttention.out_proj's class
    from_attrs("Linear", "in_features", "out_features", bias=has_param("bias")),
    checks.linear,
)
for _name in ("ReLU", "ReLU6", "SELU", "Sigmoid", "Hardsigmoid", "Tanh", "Softsign", "SiLU"):
    _simple(_name, check=checks.no_tensors)
_simple("LeakyReLU", "negative_slope", check=checks.leaky_relu)
_simple("ELU", "alpha", check=checks.elu)
_simple("GELU", "approximate", check=checks.gelu)
_simple("Softplus", "beta", "threshold", check=checks.softplus)
_simple("Softmax", "dim", check=checks.softmax)
_simple("LogSoftmax", "dim", check=checks.softmax)
_simple("Flatten", "start_dim", "end_dim", check=checks.flatten)
for _name in ("Dropout", "Dropout1d", "Dropout2d"):
    _simple(_name, "p", check=checks.dropout)
_simple(
    "LayerNorm",
    "normalized_shape",
    "eps",
    "elementwise_affine",
    bias=lambda r: r.has_param("bias") or not r.get("elementwise_affine", True),
    check=checks.layer_norm,
)
for _name in ("BatchNorm1d", "BatchNorm2d"):
    _simple(_name, "num_features", "eps", "momentum", "affine", "track_running_stats", check=checks.batch_norm)
_simple("Embedding", "num_embeddings", "embedding_dim", "padding_idx", "max_norm", check=checks.embedding)

# The families other modules of fastlayers.nn provide (conv/pool, recurrent, attention). The
# classes are resolved when a file is read; until fastlayers.nn has one, reading it raises
# UnsupportedError naming it. The keywords are torch's constructor arguments, which torch stores
# as attributes of the same name.
_CONV = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode")
for _rank, _name in ((1, "Conv1d"), (2, "Conv2d")):
    _simple(_name, *_CONV, bias=has_param("bias"), check=checks.conv(_rank, False))
_simple("ConvTranspose2d", *_CONV, "output_padding", bias=has_param("bias"), check=checks.conv(2, True))
for _rank, _name in ((1, "MaxPool1d"), (2, "MaxPool2d")):
    _simple(
        _name,
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "return_indices",
        "ceil_mode",
        check=checks.pool(_rank, "max"),
    )
_simple("AvgPool1d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", check=checks.pool(1, "avg"))
_simple(
    "AvgPool2d",
    "kernel_size",
    "stride",
    "padding",
    "ceil_mode",
    "count_include_pad",
    "divisor_override",
    check=checks.pool(2, "avg"),
)
for _rank, _name in ((1, "AdaptiveAvgPool1d"), (2, "AdaptiveAvgPool2d")):
    _simple(_name, "output_size", check=checks.adaptive(_rank))
for _rank, _name in ((1, "AdaptiveMaxPool1d"), (2, "AdaptiveMaxPool2d")):
    _simple(_name, "output_size", "return_indices", check=checks.adaptive(_rank))
_simple("Upsample", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", check=checks.upsample)
_RNN = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
_simple("RNN", *_RNN, "nonlinearity", check=checks.recurrent)
_simple("LSTM", *_RNN, "proj_size", check=checks.recurrent)
_simple("GRU", *_RNN, check=checks.recurrent)
_simple("RNNCell", "input_size", "hidden_size", "bias", "nonlinearity", check=checks.cell)
_simple("LSTMCell", "input_size", "hidden_size", "bias", check=checks.cell)
_simple("GRUCell", "input_size", "hidden_size", "bias", check=checks.cell)
_simple(
    "MultiheadAttention",
    "embed_dim",
    "num_heads",
    "dropout",
    "add_zero_attn",
    "kdim",
    "vdim",
    "batch_first",
    bias=has_param("in_proj_bias"),
    add_bias_kv=has_param("bias_k"),
    check=checks.attention,
)


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


_add("TransformerEncoderLayer", _transformer_layer("TransformerEncoderLayer"), checks.transformer_layer(False))
_add("TransformerDecoderLayer", _transformer_layer("TransformerDecoderLayer"), checks.transformer_layer(True))


def _transformer_stack(cls_name: str, layer_keyword: str) -> Callable:
    """TransformerEncoder/Decoder: the first layer rebuilt as the template, cloned num_layers times
    by the constructor (the loaded state dict then sets every clone's weights), optional norm."""

    def build(r: TorchModuleRecord):
        from ... import nn

        layers = r.child("layers")
        first = rebuild_module(layers.children["0"], f"{r.path}.layers.0" if r.path else "layers.0")
        norm = r.children.get("norm")
        return getattr(nn, cls_name)(
            **{
                layer_keyword: first,
                "num_layers": len(layers.children),
                "norm": None if norm is None else rebuild_module(norm, "norm"),
            }
        )

    return build


_add("TransformerEncoder", _transformer_stack("TransformerEncoder", "encoder_layer"), checks.transformer_stack)
_add("TransformerDecoder", _transformer_stack("TransformerDecoder", "decoder_layer"), checks.transformer_stack)
