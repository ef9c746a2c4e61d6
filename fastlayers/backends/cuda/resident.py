"""Running a graph Model with its activations kept on the device (``CudaOps.run_model``).

The model's inputs are copied to the device once (float inputs as float32, integer ids as
int64), each node of its plan runs on device arrays and the outputs are copied back once. Every
layer type of ``fastlayers.layers`` that a graph can hold has a handler here (``_HANDLERS``,
exact classes; nested models run node by node too) that runs the layer's computation with
``CudaOps`` primitives on device arrays. A node still runs on the host (inputs copied out, the
layer's own code, outputs copied back; its name recorded in ``LAST_RUN.host_layers``) when:

- its layer has no handler: a subclass of a layer type (it may override ``call``) or a layer
  defined outside ``fastlayers.layers``;
- it was recorded with arguments a handler does not take: masks given as arrays to
  ``Attention``/``AdditiveAttention``/``HardAttention`` in a numeric call recorded in the graph,
  extra positional arguments;
- its inputs are ones the device path leaves to the layer's own code, which then raises or
  handles them: shapes the layer refuses (its ShapeError comes from the host run), broadcasting
  leading axes in the dense attention layers, zero-size Concatenate inputs, more than 6 axes.

Checks of values (not shapes) that layers make on the host, e.g. Embedding indices in range,
run inside the kernels: they set a device flag, read once after the outputs are copied back
(``LAST_RUN.flag_reads``); a set flag re-runs the checked nodes on the host, which raise the
layer's own error.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...errors import InputError
from ...graph import InputLayer, Model
from ...layers import (
    attention, blocks, convolutional, core, hierarchical_softmax, merging, normalization, pooling,
    recurrent, reshaping,
)
from ...geometry import same_pads, window_out
from ._runtime import device_dtype, is_device, to_device, to_host


class Transfers(threading.local):
    """Per-thread record of the last ``run_model`` call: activation copies in / out, reads of the
    value-check flag, the names of the layers that ran on the host (and, during the call, the
    nesting depth, the pending value checks and their device flag)."""

    def __init__(self):
        self.to_device = 0
        self.to_host = 0
        self.flag_reads = 0
        self.host_layers: list[str] = []
        self.depth = 0
        self.checks: list = []  # (layer, device args) whose kernels may set ``flag``
        self.flag = None


LAST_RUN = Transfers()

#: A weight cached in another layout (``CudaOps.device_weight``): Conv2DTranspose's
#: (kh, kw, filters, channels) kernel as the (kh, kw, C_in, C_out) of ``conv_transpose2d``.
_HWOI_TO_HWIO = ("hwoi->hwio", lambda a: np.ascontiguousarray(a.transpose(0, 1, 3, 2)))

_HANDLERS: dict = {}


def _handles(*types, inputs="one", kwargs=(), raw=False):
    """Register a handler ``fn(ops, layer, args, **node_kwargs)`` for layer ``types``.

    ``inputs``: "one" (a device array), "list" (a list of them) or "any"; ``kwargs``: the call
    arguments recorded in graph nodes it takes; ``raw``: it gets non-float inputs as they are
    (ids, masks), others get them cast to float32 as ``Layer._prepare_inputs`` does. A handler
    returns device arrays, or None to leave the node to the layer's own code on the host.
    """

    def register(fn):
        fn.inputs, fn.kwargs, fn.raw = inputs, frozenset(kwargs), raw
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return register


def _shape(a) -> tuple:
    return tuple(a.shape)  # numba's simulator shapes refuse negative indices


def _float(ops, a):
    return a if a.dtype == np.float32 else ops.as_float32(a)


def _check_values_later(ops, layer, args):
    """The run's value-check flag, for a kernel to set where ``args`` hold values ``layer``
    refuses (checked after the run, see ``_raise_failed_checks``)."""
    if LAST_RUN.flag is None:
        LAST_RUN.flag = ops.zeros((1,))
    LAST_RUN.checks.append((layer, args))
    return LAST_RUN.flag


# ------------------------------------------------------------------------------------- core
@_handles(core.Dense)
def _dense(ops, layer, x):
    return ops.dense(x, layer.kernel, layer.bias if layer.use_bias else None, layer.activation,
                     core._DEFAULT_ALPHA.get(layer.activation, 0.0))


@_handles(core.Activation)
def _activation(ops, layer, x):
    return ops.activation(x, layer.activation, layer._alpha)


@_handles(core.ReLU)
def _relu(ops, layer, x):
    if layer.threshold == 0.0 and layer.negative_slope == 0.0 and layer.max_value in (None, 6.0):
        return ops.activation(x, "relu" if layer.max_value is None else "relu6")
    return ops.relu(x, layer.threshold, layer.negative_slope, layer.max_value)


@_handles(core.LeakyReLU)
def _leaky(ops, layer, x):
    return ops.activation(x, "leaky_relu", layer.negative_slope)


@_handles(core.ELU)
def _elu(ops, layer, x):
    return ops.activation(x, "elu", layer.alpha)


@_handles(core.Softmax)
def _softmax(ops, layer, x):
    axis = tuple(layer.axis) if isinstance(layer.axis, (list, tuple)) else layer.axis
    return ops.softmax(x, axis)


@_handles(core.Flatten)
def _flatten(ops, layer, x):
    shape = _shape(x)
    if layer.data_format == "channels_first" and len(shape) > 2:
        x = ops.transpose(x, (0, *range(2, len(shape)), 1))
    return x.reshape(shape[0], int(np.prod(shape[1:])))


@_handles(core.Reshape)
def _reshape(ops, layer, x):
    shape = _shape(x)
    return x.reshape((shape[0], *layer._resolve(shape[1:])))


@_handles(core.Permute)
def _permute(ops, layer, x):
    return ops.transpose(x, (0, *layer.dims))


@_handles(core.RepeatVector)
def _repeat_vector(ops, layer, x):
    n, features = _shape(x)
    return ops.copy_view(x, lambda v: np.broadcast_to(v[:, None, :], (n, layer.n, features)))


@_handles(core.Dropout, core.SpatialDropout1D, core.SpatialDropout2D, core.SpatialDropout3D,
          core.StochasticDepth)
def _identity(ops, layer, x):
    return x


@_handles(core.LayerScale)
def _layer_scale(ops, layer, x):
    return ops.merge(x, layer.gamma, "multiply")


@_handles(core.Rescaling)
def _rescaling(ops, layer, x):
    return ops.merge(ops.merge(x, layer._scale, "multiply"), layer._offset, "add")


@_handles(core.Embedding, raw=True)
def _embedding(ops, layer, ids):
    if ids.dtype not in (np.int64, np.float32):
        return None
    return ops.embedding(ids, layer.embeddings, bad=_check_values_later(ops, layer, ids))


@_handles(recurrent.PaddingMask, raw=True)
def _padding_mask(ops, layer, ids):
    return ops.nonzero_mask(ids)


@_handles(hierarchical_softmax.HierarchicalSoftmax, inputs="any", raw=True)
def _hierarchical_softmax(ops, layer, args):
    bias = layer.bias if layer.use_bias else None
    if type(args) is not list:
        log_p = ops.hsoftmax_log_probs(_float(ops, args), layer.kernel, bias, layer._nodes,
                                       layer._signs)
        return ops.activation(log_p, "exponential")
    if len(args) != 2 or args[0].ndim != 2 or _shape(args[1]) != _shape(args[0])[:1] \
            or args[1].dtype not in (np.int64, np.float32):
        return None
    log_p = ops.hsoftmax_class_log_probs(_float(ops, args[0]), layer.kernel, bias, layer._nodes,
                                         layer._signs, args[1],
                                         bad=_check_values_later(ops, layer, args))
    return ops.activation(log_p, "exponential")


# ------------------------------------------------------------------------------- merging
_MERGE_OPS = {merging.Add: "add", merging.Subtract: "subtract", merging.Multiply: "multiply",
              merging.Maximum: "maximum", merging.Minimum: "minimum", merging.Average: "add"}


@_handles(*_MERGE_OPS, inputs="list")
def _merge(ops, layer, xs):
    op = _MERGE_OPS[type(layer)]
    scale = 1.0 / len(xs) if type(layer) is merging.Average else 1.0
    out = xs[0]
    for i, a in enumerate(xs[1:], 2):
        last = i == len(xs)  # Average: (a_0 + ... + a_{n-2}) / n + a_{n-1} / n
        out = ops.merge(out, a, op, scale if last else 1.0, scale if last else 1.0)
    return out


@_handles(merging.CustomScaleLayer, inputs="list")
def _custom_scale(ops, layer, xs):
    return ops.merge(xs[0], xs[1], "add", 1.0, layer.scale)


@_handles(merging.BinaryOp, inputs="list")
def _binary_op(ops, layer, xs):
    if layer.op == "divide":       # no device division: the layer's own code on the host
        return None
    tensors = iter(xs)
    a, b = (next(tensors) if c is None else np.full((), c, np.float32) for c in layer.constants)
    return ops.merge(a, b, layer.op)


@_handles(merging.Concatenate, inputs="list")
def _concatenate(ops, layer, xs):
    if 0 in (n for a in xs for n in _shape(a)):
        return None
    return ops.concatenate(xs, layer.axis)


# ------------------------------------------------------------------------- normalization
@_handles(normalization.BatchNormalization)
def _batch_norm(ops, layer, x):
    return ops.batch_norm(x, layer._scale, layer._shift, layer._axis)


@_handles(normalization.LayerNormalization)
def _layer_norm(ops, layer, x):
    return ops.layer_norm(x, layer.gamma if layer.scale else None,
                          layer.beta if layer.center else None, layer.epsilon, layer._axes,
                          layer._rms)


@_handles(normalization.RMSNormalization)
def _rms_norm(ops, layer, x):
    return ops.layer_norm(x, layer.scale, None, layer.epsilon, layer._axes, True)


@_handles(normalization.Normalization)
def _normalization(ops, layer, x):
    mean = layer.mean_value if layer.mean_value is not None else layer.mean
    var = layer.variance_value if layer.variance_value is not None else layer.variance
    if mean.ndim:
        mean = mean.reshape(layer._broadcast)
    if var.ndim:
        var = var.reshape(layer._broadcast)
    if layer.invert:
        return ops.merge(ops.merge(x, var, "mul_std"), mean, "add")
    return ops.merge(ops.merge(x, mean, "subtract"), var, "div_std")


# ------------------------------------------------------------------------------- reshaping
@_handles(reshaping.ZeroPadding1D, reshaping.ZeroPadding2D)
def _zero_padding(ops, layer, x):
    pads = [(0, 0)] * x.ndim
    for axis, p in zip(layer._spatial_axes(), layer._amount):
        pads[axis] = p
    return ops.pad(x, pads)


@_handles(reshaping.Cropping1D, reshaping.Cropping2D)
def _cropping(ops, layer, x):
    shape = _shape(x)
    layer.compute_output_shape(shape)  # its ShapeError when nothing would be left
    index = [slice(None)] * len(shape)
    for axis, (a, b) in zip(layer._spatial_axes(), layer._amount):
        index[axis] = slice(a, shape[axis] - b)
    return ops.copy_view(x, lambda v: v[tuple(index)])


# ------------------------------------------------------------------ convolution and pooling
def _to_nhwc(ops, layer, x):
    """``SpatialLayer._to_nhwc`` on the device: channels_first moved last, 1-D at height 1."""
    shape = _shape(x)
    if layer.data_format == "channels_first":
        x = ops.transpose(x, (0, *range(2, len(shape)), 1))
        shape = (shape[0], *shape[2:], shape[1])
    return x.reshape(shape[0], 1, shape[1], shape[2]) if layer.rank == 1 else x


def _from_nhwc(ops, layer, y):
    n, h, w, c = _shape(y)
    if layer.rank == 1:
        y = y.reshape(n, w, c)
    if layer.data_format == "channels_first":
        y = ops.transpose(y, (0, y.ndim - 1, *range(1, y.ndim - 1)))
    return y


def _spatial(x4, layer):
    """The spatial sizes a layer's padding rule sees (1-D: the steps only)."""
    return _shape(x4)[1:3] if layer.rank == 2 else _shape(x4)[2:3]


@_handles(convolutional.Conv1D, convolutional.Conv2D)
def _conv(ops, layer, x):
    x4 = _to_nhwc(ops, layer, x)
    pads = layer._pads_hw(_spatial(x4, layer), layer.kernel_size, layer.strides,
                          layer.dilation_rate)
    layer._check_output(x4, pads)
    kernel = layer.kernel if layer.rank == 2 else layer.kernel[None]
    y = ops.conv2d(x4, kernel, layer.bias if layer.use_bias else None, layer._hw(layer.strides),
                   pads, layer._hw(layer.dilation_rate), layer.groups, layer.activation,
                   layer._alpha)
    return _from_nhwc(ops, layer, y)


@_handles(convolutional.DepthwiseConv2D)
def _depthwise(ops, layer, x):
    y = layer._depthwise(_to_nhwc(ops, layer, x), layer.kernel,
                         layer.bias if layer.use_bias else None, layer.activation, layer._alpha)
    return _from_nhwc(ops, layer, y)


@_handles(convolutional.SeparableConv2D)
def _separable(ops, layer, x):
    h = layer._depthwise(_to_nhwc(ops, layer, x), layer.depthwise_kernel, None, "linear", 0.0)
    y = ops.conv2d(h, layer.pointwise_kernel, layer.bias if layer.use_bias else None,
                   activation=layer.activation, alpha=layer._alpha)
    return _from_nhwc(ops, layer, y)


@_handles(convolutional.Conv2DTranspose)
def _conv_transpose(ops, layer, x):
    x4 = _to_nhwc(ops, layer, x)
    crops, outs = layer._geometry(_shape(x4)[1:3])
    if min(outs) <= 0:
        return None  # the layer's own call raises its ShapeError
    y = ops.conv_transpose2d(x4, ops.device_weight(layer.kernel, _HWOI_TO_HWIO),
                             layer.bias if layer.use_bias else None, layer.strides, tuple(crops),
                             tuple(outs), layer.dilation_rate, 1, layer.activation, layer._alpha)
    return _from_nhwc(ops, layer, y)


@_handles(pooling.MaxPooling1D, pooling.AveragePooling1D, pooling.MaxPooling2D,
          pooling.AveragePooling2D)
def _pool(ops, layer, x):
    x4 = _to_nhwc(ops, layer, x)
    pads = layer._pads_hw(_spatial(x4, layer), layer.pool_size, layer.strides, (1,) * layer.rank)
    pool, strides = layer._hw(layer.pool_size), layer._hw(layer.strides)
    out_hw = tuple(window_out(n, k, s, 1, p)
                   for n, k, s, p in zip(_shape(x4)[1:3], pool, strides, pads))
    if min(out_hw) <= 0:
        return None  # the layer's own call raises its ShapeError
    y = ops.pool2d(x4, layer.kind, pool, strides, pads, out_hw, (1, 1), False)
    return _from_nhwc(ops, layer, y)


@_handles(pooling.GlobalMaxPooling1D, pooling.GlobalAveragePooling1D, pooling.GlobalMaxPooling2D,
          pooling.GlobalAveragePooling2D)
def _global_pool(ops, layer, x):
    return ops.global_pool(x, layer.kind, layer._axes(), layer.keepdims)


@_handles(pooling.UpSampling2D)
def _upsampling(ops, layer, x):
    x4 = _to_nhwc(ops, layer, x)
    _, h, w, _ = _shape(x4)
    y = ops.upsample2d(x4, (h * layer.size[0], w * layer.size[1]), layer.interpolation,
                       layer.align_corners)
    return _from_nhwc(ops, layer, y)


@_handles(pooling.RoIPooling2D, inputs="list")
def _roi_pooling(ops, layer, args):
    feats, rois = args
    y = ops.roi_pool(_to_nhwc(ops, layer, feats), rois, layer.pool_size, layer.spatial_scale,
                     bad=_check_values_later(ops, layer, args))
    return _from_nhwc(ops, layer, y)


@_handles(pooling.LocalResponseNormalization)
def _local_response_norm(ops, layer, x):
    nd = x.ndim
    channels_first = layer.data_format == "channels_first" and nd > 2
    if channels_first:
        x = ops.transpose(x, (0, *range(2, nd), 1))
    size = 2 * layer.depth_radius + 1
    y = ops.local_response_norm(x, size, layer.alpha * size, layer.beta, layer.bias)
    return ops.transpose(y, (0, nd - 1, *range(1, nd - 1))) if channels_first else y


@_handles(blocks.InceptionBlock)
def _inception(ops, layer, x):
    act, alpha = layer.activation, layer._alpha
    x4 = _to_nhwc(ops, layer, x)
    _, h, w, _ = _shape(x4)
    b1 = ops.conv2d(x4, layer.b1_kernel, layer.b1_bias, activation=act, alpha=alpha)
    r3 = ops.conv2d(x4, layer.b2_reduce_kernel, layer.b2_reduce_bias, activation=act, alpha=alpha)
    r5 = ops.conv2d(x4, layer.b3_reduce_kernel, layer.b3_reduce_bias, activation=act, alpha=alpha)
    b2 = ops.conv2d(r3, layer.b2_kernel, layer.b2_bias, pads=(same_pads(h, 3, 1),
                                                              same_pads(w, 3, 1)),
                    activation=act, alpha=alpha)
    b3 = ops.conv2d(r5, layer.b3_kernel, layer.b3_bias, pads=(same_pads(h, 5, 1),
                                                              same_pads(w, 5, 1)),
                    activation=act, alpha=alpha)
    pooled = ops.pool2d(x4, "max", (3, 3), (1, 1), ((1, 1), (1, 1)), (h, w))
    b4 = ops.conv2d(pooled, layer.b4_kernel, layer.b4_bias, activation=act, alpha=alpha)
    return _from_nhwc(ops, layer, ops.concatenate([b1, b2, b3, b4], -1))


@_handles(blocks.NiNBlock)
def _nin(ops, layer, x):
    act, alpha = layer.activation, layer._alpha
    x4 = _to_nhwc(ops, layer, x)
    pads, outs = layer._conv_geometry(_shape(x4)[1:3])
    if min(outs) <= 0:
        return None  # the layer's own call raises its ShapeError
    h = ops.conv2d(x4, layer.conv_kernel, layer.conv_bias, layer.strides, pads, activation=act,
                   alpha=alpha)
    for i in range(len(layer.mlp_filters)):
        h = ops.conv2d(h, getattr(layer, f"mlp{i}_kernel"), getattr(layer, f"mlp{i}_bias"),
                       activation=act, alpha=alpha)
    if layer.global_pool:
        return ops.global_pool(h, "avg", (1, 2))
    return _from_nhwc(ops, layer, h)


# ------------------------------------------------------------------------------ recurrent
def _rnn_inputs(ops, layer, args, n_states, has_mask):
    """(x, states or None, mask or None) of a recurrent node ``[x, *states, mask]``, or None when
    they do not fit (the layer's own call raises its ShapeError)."""
    items = args if type(args) is list else [args]
    if len(items) != 1 + n_states + int(has_mask) or items[0].ndim != 3 or _shape(items[0])[1] == 0:
        return None
    x = _float(ops, items[0])
    batch, steps = _shape(x)[:2]
    states = [_float(ops, s) for s in items[1:1 + n_states]] or None
    if states is not None and (len(states) != len(layer.state_size) or any(
            _shape(s) != (batch, size) for s, size in zip(states, layer.state_size))):
        return None
    mask = items[-1] if has_mask else None
    if mask is not None and _shape(mask) != (batch, steps):
        return None
    return x, states, mask


def _rnn_call(ops, layer, x, states, mask):
    """``_RNNLayer.call`` on device arrays (states None: zeros)."""
    if states is None:
        states = [ops.zeros((_shape(x)[0], size)) for size in layer.state_size]
    y, new_states = layer._run(x, states, mask, reverse=layer.go_backwards,
                               return_sequences=layer.return_sequences,
                               zero_masked=layer.zero_output_for_mask)
    if layer.return_sequences and layer.go_backwards:
        y = ops.copy_view(y, lambda v: v[:, ::-1])  # Keras returns outputs in processing order
    return [y, *new_states] if layer.return_state else y


@_handles(recurrent.SimpleRNN, recurrent.LSTM, recurrent.GRU, inputs="any",
          kwargs=("n_states", "has_mask"), raw=True)
def _recurrent(ops, layer, args, n_states=0, has_mask=False):
    parsed = _rnn_inputs(ops, layer, args, n_states, has_mask)
    return None if parsed is None else _rnn_call(ops, layer, *parsed)


@_handles(recurrent.Bidirectional, inputs="any", kwargs=("n_states", "has_mask"), raw=True)
def _bidirectional(ops, layer, args, n_states=0, has_mask=False):
    parsed = _rnn_inputs(ops, layer, args, n_states, has_mask)
    if parsed is None:
        return None
    x, states, mask = parsed
    nf = len(layer.forward_layer.state_size)
    out_f = _rnn_call(ops, layer.forward_layer, x, None if states is None else states[:nf], mask)
    out_b = _rnn_call(ops, layer.backward_layer, x, None if states is None else states[nf:], mask)
    new_states = []
    if layer.return_state:
        out_f, new_states = out_f[0], out_f[1:]
        out_b, new_states = out_b[0], new_states + out_b[1:]
    if layer.return_sequences:
        out_b = ops.copy_view(out_b, lambda v: v[:, ::-1])
    if layer.merge_mode == "concat":
        y = [ops.concatenate([out_f, out_b], -1)]
    elif layer.merge_mode == "sum":
        y = [ops.merge(out_f, out_b, "add")]
    elif layer.merge_mode == "ave":
        y = [ops.merge(out_f, out_b, "add", 0.5, 0.5)]
    elif layer.merge_mode == "mul":
        y = [ops.merge(out_f, out_b, "multiply")]
    else:
        y = [out_f, out_b]
    return y + new_states if (layer.return_state or layer.merge_mode is None) else y[0]


# ------------------------------------------------------------------------------ attention
@_handles(attention.Attention, attention.AdditiveAttention, attention.HardAttention,
          inputs="list", kwargs=("return_attention_scores", "use_causal_mask"))
def _dense_attention(ops, layer, xs, return_attention_scores=False, use_causal_mask=False):
    if len(xs) not in (2, 3):
        return None
    q, v = xs[0], xs[1]
    k = xs[2] if len(xs) > 2 else v
    layer._shapes([_shape(a) for a in (q, v, k)])
    lead = _shape(q)[:-2]
    if _shape(k)[:-2] != lead or _shape(v)[:-2] != lead or _shape(q)[-1] != _shape(k)[-1]:
        return None  # numpy's broadcasting, or the layer's own ShapeError
    p, tq, tk = int(np.prod(lead)), _shape(q)[-2], _shape(k)[-2]
    q3, k3 = q.reshape(p, tq, _shape(q)[-1]), k.reshape(p, tk, _shape(k)[-1])
    v3 = v.reshape(p, tk, _shape(v)[-1])
    scale = 1.0
    if isinstance(layer, attention.AdditiveAttention):
        s = ops.tanh_scores(q3, k3, layer.scale if layer.use_scale else None)
    elif layer.score_mode == "concat":
        s = ops.tanh_scores(q3, k3, None, float(layer.scale) if layer.use_scale else 1.0,
                            float(layer.concat_score_weight))
    else:
        s = ops.matmul(q3, k3, trans_b=True)
        scale = float(layer.scale) if layer.use_scale else 1.0
    if isinstance(layer, attention.HardAttention):
        w = ops.hard_attention(ops.merge(s, layer.scale, "multiply") if layer.use_scale else s,
                               use_causal_mask)
    else:
        w = ops.attention_softmax(s.reshape(p, 1, tq, tk), scale, None, bool(use_causal_mask),
                                  attention._EMPTY_UNIFORM).reshape(p, tq, tk)
    out = ops.matmul(w, v3).reshape(*lead, tq, _shape(v)[-1])
    return [out, w.reshape(*lead, tq, tk)] if return_attention_scores else out


def _multi_head(ops, layer, q, v, k, mask, return_attention_scores, use_causal_mask):
    """``MultiHeadAttention.call`` on device arrays (heads moved by device transposes)."""
    q_shape, k_shape = _shape(q), _shape(k)
    axes, others = layer._shape_info(q_shape, _shape(v), k_shape)
    if use_causal_mask and len(axes) != 1:
        return None  # the layer's own call raises its UnsupportedError
    heads_n, kd, vd = layer.num_heads, layer.key_dim, layer.value_dim
    rank = len(q_shape)
    perm = (0, *others, *axes, rank - 1)
    o_shape = tuple(q_shape[a] for a in others)
    tq_shape, tk_shape = tuple(q_shape[a] for a in axes), tuple(k_shape[a] for a in axes)
    batch = q_shape[0] * int(np.prod(o_shape, dtype=np.int64))
    tq, tk = int(np.prod(tq_shape)), int(np.prod(tk_shape))

    def heads(x, kernel, bias, t, d):
        """Project x (one GEMM) and lay it out as (batch, heads, t, d)."""
        shape = _shape(x)
        rows = int(np.prod(shape[:-1]))
        y = ops.dense(x.reshape(rows, shape[-1]), kernel.reshape(shape[-1], heads_n * d),
                      bias.reshape(heads_n * d) if layer.use_bias else None)
        y = y.reshape(*shape[:-1], heads_n * d)
        if perm != tuple(range(rank)):
            y = ops.transpose(y, perm)
        return ops.transpose(y.reshape(batch, t, heads_n, d), (0, 2, 1, 3))

    q4 = heads(q, layer.query_kernel, layer.query_bias if layer.use_bias else None, tq, kd)
    k4 = heads(k, layer.key_kernel, layer.key_bias if layer.use_bias else None, tk, kd)
    v4 = heads(v, layer.value_kernel, layer.value_bias if layer.use_bias else None, tk, vd)
    bias = None
    if mask is not None:
        want = (q_shape[0], *o_shape, *tq_shape, *tk_shape)
        try:
            if np.broadcast_shapes(_shape(mask), want) != want:
                return None
        except ValueError:
            return None  # the layer's own call raises its ShapeError
        bias = ops.mask_bias(mask, want).reshape(batch, 1, tq, tk)
    fused = not return_attention_scores and rank == 3 and layer.dropout == 0
    out, w = ops.attention(q4, k4, v4, 1.0 / math.sqrt(kd), bias, bool(use_causal_mask),
                           attention._EMPTY_UNIFORM if fused else attention._EMPTY_ZERO)
    ctx = ops.transpose(out, (0, 2, 1, 3)).reshape(q_shape[0], *o_shape, *tq_shape, heads_n * vd)
    if perm != tuple(range(rank)):
        ctx = ops.transpose(ctx, np.argsort(perm))
    tail = layer._out_tail(q_shape)
    rows = int(np.prod(q_shape[:-1]))
    y = ops.dense(ctx.reshape(rows, heads_n * vd),
                  layer.output_kernel.reshape(heads_n * vd, int(np.prod(tail))),
                  layer.output_bias.reshape(int(np.prod(tail))) if layer.use_bias else None)
    y = y.reshape(*q_shape[:-1], *tail)
    if not return_attention_scores:
        return y
    return [y, w.reshape(q_shape[0], *o_shape, heads_n, *tq_shape, *tk_shape)]


@_handles(attention.MultiHeadAttention, inputs="list",
          kwargs=("packed", "return_attention_scores", "use_causal_mask"))
def _mha(ops, layer, items, packed=("query", "value"), return_attention_scores=False,
         use_causal_mask=False):
    q, v, k, mask = layer._unpack(items, packed)
    return _multi_head(ops, layer, q, v, k, mask, return_attention_scores, use_causal_mask)


@_handles(attention.SelfAttention)
def _self_attention(ops, layer, x):
    return _multi_head(ops, layer, x, x, x, None, layer.return_attention_scores,
                       layer.use_causal_mask)


@_handles(attention.PositionalEncoding)
def _positional_encoding(ops, layer, x):
    shape = _shape(x)
    if len(shape) != 3 or shape[-1] != layer.table.shape[1] or shape[1] > layer.max_length:
        return None  # the layer's own call raises its ShapeError
    return ops.merge(x, layer.table[:shape[1]], "add", layer._sqrt_d if layer.scale_input else 1.0)


@_handles(attention.PositionwiseFeedForward)
def _feed_forward(ops, layer, x):
    if _shape(x)[-1] != layer.kernel1.shape[0]:
        return None  # the layer's own call raises its ShapeError
    h = ops.dense(x, layer.kernel1, layer.bias1 if layer.use_bias else None, layer.activation,
                  core._DEFAULT_ALPHA.get(layer.activation, 0.0))
    return ops.dense(h, layer.kernel2, layer.bias2 if layer.use_bias else None)


# ---------------------------------------------------------------------------------- models
@_handles(inputs="any", raw=True)
def _nested_model(ops, model, args):
    outputs = _run(ops, model, args if type(args) is list else [args])
    return outputs[0] if model._single_output else outputs


def resident_layer_types() -> list[str]:
    """Names of the layer types whose nodes keep their activations on the device."""
    return sorted(t.__name__ for t in _HANDLERS)


def _handler(layer):
    handler = _HANDLERS.get(type(layer))
    return _nested_model if handler is None and isinstance(layer, Model) else handler


def _to_host_tree(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host_tree(a) for a in v)
    if is_device(v):
        LAST_RUN.to_host += 1
        host = to_host(v)
        return host.astype(bool) if host.dtype == np.uint8 else host  # uint8 arrays are masks
    return v


def _to_device_tree(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device_tree(a) for a in v)
    if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
        LAST_RUN.to_device += 1
        return to_device(v, device_dtype(v.dtype))
    return v


def run_model(ops, model, x):
    """``model.call(x)`` with activations on the device; returns host arrays (as ``call`` does)."""
    if LAST_RUN.depth == 0:
        LAST_RUN.to_device = LAST_RUN.to_host = LAST_RUN.flag_reads = 0
        LAST_RUN.host_layers, LAST_RUN.checks, LAST_RUN.flag = [], [], None
    LAST_RUN.depth += 1
    try:
        inputs = [_to_device_tree(a) for a in (x if isinstance(x, list) else [x])]
        results = [_to_host_tree(v) for v in _run(ops, model, inputs)]
        if LAST_RUN.depth == 1 and LAST_RUN.checks:
            _raise_failed_checks()
        return results[0] if model._single_output else results
    finally:
        LAST_RUN.depth -= 1


def _raise_failed_checks():
    """Read the value-check flag once; if a kernel set it, re-run the checked nodes on the host
    so that the failing layer raises its own error."""
    LAST_RUN.flag_reads += 1
    if not to_host(LAST_RUN.flag)[0]:
        return
    for layer, args in LAST_RUN.checks:
        host = [to_host(a) for a in args] if type(args) is list else to_host(args)
        layer._numeric_call(host)
    raise InputError(f"a value check failed on the device in layers "
                     f"{[layer.name for layer, _ in LAST_RUN.checks]}")


def _run(ops, model, inputs):
    """The device values of ``model``'s outputs from device ``inputs`` (one per model input)."""
    values: dict[int, object] = {id(t): a for t, a in zip(model.inputs, inputs)}
    for node, (fn, keys, out_keys) in zip(_plan_nodes(model), model._plan):
        args = [values[k] for k in keys] if type(keys) is list else values[keys]
        out = _on_device(ops, node, fn, args)
        if out is None:
            LAST_RUN.host_layers.append(node.layer.name)
            out = _to_device_tree(fn(_to_host_tree(args)))
        if len(out_keys) == 1:
            values[out_keys[0]] = out
        else:
            values.update(zip(out_keys, out))
    return [values[id(t)] for t in model.outputs]


def _on_device(ops, node, fn, args):
    """The node's outputs computed by its handler on device arrays, or None (a host run)."""
    layer = node.layer
    handler = _handler(layer)
    if handler is None or node.extra_args or not handler.kwargs.issuperset(node.kwargs):
        return None
    many = type(args) is list
    if handler.inputs != "any" and many != (handler.inputs == "list"):
        return None
    items = args if many else [args]
    if not all(is_device(a) and a.ndim <= 6 for a in items):
        return None
    if fn != layer.call:  # the host path would validate this node's input shapes per call
        layer._check_spec(layer._shape_of(args))
    if not handler.raw:
        items = [_float(ops, a) for a in items]
        args = items if many else items[0]
    return handler(ops, layer, args, **node.kwargs)


def _plan_nodes(model):
    return [n for n in model._nodes if not isinstance(n.layer, InputLayer)]
