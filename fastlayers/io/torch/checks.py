"""The checks of a pickled module record before its module is built: each attribute's type and
range, and its own tensors' shapes against the sizes its attributes declare (``RecordCheck``),
with one check per family of torch.nn classes (``linear``, ``conv(rank, transposed)``, ...).
``creators.py`` pairs each class's check with its builder.
"""

from __future__ import annotations

import math

from ... import limits, settings
from ...errors import ModelFileError
from .records import TorchModuleRecord, brepr

# Modules rebuilt from a pickle: strides, dilations, pooling windows, adaptive and resize output
# sizes at most ``torch_max_geometry`` (``_geometry()``), resize scale factors at most
# ``limits.TORCH_MAX_SCALE``; a convolution's padding at most its dilated kernel (dilation x
# kernel_size), a transposed convolution's stride too. Every size that a module's tensors have
# must be theirs (each class's check), so that a module allocates no more than the file holds.


def _geometry() -> int:
    """The largest size a pickled module's geometry may hold (``torch_max_geometry``)."""
    return settings.current().torch_max_geometry


_MISSING = object()


class RecordCheck:
    """The checks of one module record before its module is built: each attribute's type and
    range (``torch_max_geometry`` ...), and the shapes of its own parameters and buffers against the
    sizes its attributes declare (``tensors``), so that the module allocates what the file
    holds, no more. Errors are ``ModelFileError`` naming the module path and the attribute.

    A creator's ``check`` (``register_torch_module``) gets one: ``c.r`` is the record, ``c.path``
    its place in the module tree; each reader returns the attribute's value (``default`` where
    the pickle lacks it; without a default, a missing attribute fails).
    """

    def __init__(self, r: TorchModuleRecord, path: str):
        self.r, self.path = r, path

    def fail(self, what: str):
        """Raise ``ModelFileError`` naming the module, its class and ``what``."""
        raise ModelFileError(f"module {brepr(self.path) if self.path else '<root>'} ({self.r.torch_class}): {what}")

    def value(self, name, default=_MISSING):
        """The attribute as a constructor argument may be (``TorchModuleRecord.argument``)."""
        if name in self.r.attrs:
            return self.r.argument(name)
        if default is _MISSING:
            self.fail(f"attribute {name!r} is missing")
        return default

    def int(self, name, lo=0, hi=None, default=_MISSING, none=False):
        """An int in [lo, hi] (None allowed with ``none``)."""
        v = self.value(name, default)
        if v is None and none:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected an int in [{lo}, {'...' if hi is None else hi}]")
        return v

    def flag(self, name, default=False, none=False):
        """True or False (None allowed with ``none``)."""
        v = self.value(name, default)
        if v is None and none:
            return None
        if v not in (True, False, 0, 1) or isinstance(v, float):
            self.fail(f"attribute {name!r} is {brepr(v)}; expected True or False")
        return bool(v)

    def float(self, name, lo=None, hi=None, default=_MISSING, none=False, nonzero=False):
        """A finite number in [lo, hi], other than 0 with ``nonzero`` (None allowed with ``none``)."""
        v = self.value(name, default)
        if v is None and none:
            return None
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or (lo is not None and v < lo)
            or (hi is not None and v > hi)
            or (nonzero and v == 0)
        ):
            self.fail(
                f"attribute {name!r} is {brepr(v)}; expected a finite number"
                + (" other than 0" if nonzero else "")
                + (
                    f" in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
                    if lo is not None or hi is not None
                    else ""
                )
            )
        return float(v)

    def choice(self, name, choices, default=_MISSING):
        """One of ``choices``."""
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
        ok = (
            isinstance(items, (tuple, list))
            and len(items) == n
            and all(
                (x is None and none_items) or (isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi)
                for x in items
            )
        )
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
                self.fail(f"tensor {name!r} has shape {tuple(have[name].shape)}; its attributes declare {tuple(shape)}")
            kinds = "f" if name in r.parameters else "fiub"
            if have[name].dtype.kind not in kinds:
                self.fail(
                    f"tensor {name!r} is {have[name].dtype}, not " + ("floating point" if kinds == "f" else "real")
                )
        extra = [k for k in have if k not in expected]
        if extra:
            self.fail(f"tensor(s) {brepr(extra[:5])} are not those of a {r.class_name}")

    def child(self, name) -> RecordCheck:
        """The check of the child module ``name``, which must be there."""
        c = self.r.children.get(name)
        if not isinstance(c, TorchModuleRecord):
            self.fail(f"child module {name!r} is missing")
        return RecordCheck(c, f"{self.path}.{name}" if self.path else name)


def no_tensors(c: RecordCheck):
    c.tensors({})


def linear(c: RecordCheck):
    i, o = c.int("in_features"), c.int("out_features")
    c.tensors({"weight": (o, i), **({"bias": (o,)} if c.r.has_param("bias") else {})})
    return i, o


def layer_norm(c: RecordCheck):
    shape = c.value("normalized_shape")
    shape = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if (
        not isinstance(shape, (tuple, list))
        or not 1 <= len(shape) <= 8
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        c.fail(f"attribute 'normalized_shape' is {brepr(shape)}; expected up to 8 sizes")
    c.float("eps", 0.0, default=1e-5)
    affine = c.flag("elementwise_affine", True)
    expected = {"weight": tuple(shape)} if affine else {}
    if affine and c.r.has_param("bias"):
        expected["bias"] = tuple(shape)
    c.tensors(expected)
    return tuple(shape)


def batch_norm(c: RecordCheck):
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


def embedding(c: RecordCheck):
    n, d = c.int("num_embeddings"), c.int("embedding_dim")
    c.int("padding_idx", -n, max(n - 1, 0), default=None, none=True)
    c.tensors({"weight": (n, d)})


def conv(rank, transposed):
    def check(c: RecordCheck):
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
                c.fail(f"output_padding {out_pad} is not smaller than stride {stride} or dilation {dilation}")
        c.value("padding_mode", "zeros")
        shape = (cin, cout // groups) if transposed else (cout, cin // groups)
        c.tensors({"weight": shape + kernel, **({"bias": (cout,)} if c.r.has_param("bias") else {})})

    return check


def pool(rank, kind):
    def check(c: RecordCheck):
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


def adaptive(rank):
    def check(c: RecordCheck):
        c.ints("output_size", rank, 1, _geometry(), none_items=rank == 2)
        c.flag("return_indices")
        c.tensors({})

    return check


def upsample(c: RecordCheck):
    size, scale = c.value("size", None), c.value("scale_factor", None)
    if size is not None:
        c.ints("size", 2, 1, _geometry())
    if scale is not None:
        items = scale if isinstance(scale, (tuple, list)) else (scale,)
        if not 1 <= len(items) <= 2 or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= limits.TORCH_MAX_SCALE for f in items
        ):
            c.fail(f"attribute 'scale_factor' is {brepr(scale)}; expected factors in (0, {limits.TORCH_MAX_SCALE}]")
    c.value("mode", "nearest")
    c.flag("align_corners", none=True, default=None)
    c.flag("recompute_scale_factor", none=True, default=None)
    c.tensors({})


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4, "RNNCell": 1, "GRUCell": 3, "LSTMCell": 4}


def recurrent(c: RecordCheck):
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


def cell(c: RecordCheck):
    gates = _GATES[c.r.class_name]
    i, h = c.int("input_size"), c.int("hidden_size", 1)
    bias = c.flag("bias", True)
    if c.r.class_name == "RNNCell":
        c.choice("nonlinearity", ("tanh", "relu"), "tanh")
    c.tensors(
        {
            "weight_ih": (gates * h, i),
            "weight_hh": (gates * h, h),
            **({"bias_ih": (gates * h,), "bias_hh": (gates * h,)} if bias else {}),
        }
    )


def attention(c: RecordCheck) -> int:
    e, heads = c.int("embed_dim", 1), c.int("num_heads", 1)
    if e % heads:
        c.fail(f"num_heads={heads} does not divide embed_dim={e}")
    kdim, vdim = c.int("kdim", 1, default=e, none=True) or e, c.int("vdim", 1, default=e, none=True) or e
    c.float("dropout", 0.0, 1.0, default=0.0)
    c.flag("batch_first")
    c.flag("add_zero_attn")
    expected = (
        {"in_proj_weight": (3 * e, e)}
        if kdim == e and vdim == e
        else {"q_proj_weight": (e, e), "k_proj_weight": (e, kdim), "v_proj_weight": (e, vdim)}
    )
    if c.r.has_param("in_proj_bias"):
        expected["in_proj_bias"] = (3 * e,)
    if c.r.has_param("bias_k"):
        expected.update(bias_k=(1, 1, e), bias_v=(1, 1, e))
    c.tensors(expected)
    out = c.child("out_proj")
    if linear(out) != (e, e):
        out.fail(f"the out-projection is not ({e}, {e})")
    return e


def transformer_layer(decoder):
    def check(c: RecordCheck):
        e = attention(c.child("self_attn"))
        if decoder and attention(c.child("multihead_attn")) != e:
            c.fail("its two attention blocks differ in width")
        i1, ff = linear(c.child("linear1"))
        ff2, o2 = linear(c.child("linear2"))
        if (i1, o2, ff2) != (e, e, ff):
            c.fail(f"linear1 ({i1} -> {ff}) and linear2 ({ff2} -> {o2}) do not fit width {e}")
        for norm in ("norm1", "norm2", "norm3")[: 3 if decoder else 2]:
            if layer_norm(c.child(norm)) != (e,):
                c.fail(f"{norm} does not normalize width {e}")
        c.flag("norm_first")
        c.tensors({})

    return check


def transformer_stack(c: RecordCheck):
    layers = c.child("layers")
    items = list(layers.r.children.values())
    if not items:
        layers.fail("holds no layers")
    first = [(k, v.shape) for k, v in items[0].state_dict().items()]
    for k, item in enumerate(items[1:], 1):
        if (
            not isinstance(item, TorchModuleRecord)
            or item.class_name != items[0].class_name
            or [(n, v.shape) for n, v in item.state_dict().items()] != first
        ):
            layers.fail(f"layer {k} differs from layer 0 (the layers are clones of one)")
    c.tensors({})


def leaky_relu(c: RecordCheck):
    c.float("negative_slope", default=0.01)
    c.tensors({})


def elu(c: RecordCheck):
    c.float("alpha", default=1.0)
    c.tensors({})


def gelu(c: RecordCheck):
    c.choice("approximate", ("none", "tanh"), "none")
    c.tensors({})


def softplus(c: RecordCheck):
    c.float("beta", default=1.0, nonzero=True)
    c.float("threshold", default=20.0)
    c.tensors({})


def softmax(c: RecordCheck):
    """Softmax and LogSoftmax."""
    c.int("dim", -64, 63, default=None, none=True)
    c.tensors({})


def flatten(c: RecordCheck):
    c.int("start_dim", -64, 63, default=1)
    c.int("end_dim", -64, 63, default=-1)
    c.tensors({})


def dropout(c: RecordCheck):
    c.float("p", 0.0, 1.0, default=0.5)
    c.tensors({})
