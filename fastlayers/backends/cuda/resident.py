"""Running a graph Model with its activations kept on the device (``CudaOps.run_model``).

The model's inputs are copied to the device once, each node of its plan runs on device arrays
and the outputs are copied back once. Nodes of the layer types in ``_HANDLERS`` run their
primitive on device arrays directly; any other node is a host round trip (its inputs copied out,
the layer run as on the CPU with the cuda backend active, its outputs copied back in), counted
in ``Transfers`` so tests and users can see where a model leaves the device.
"""

from __future__ import annotations

import threading

import numpy as np

from ...layers import convolutional, core, merging, normalization, pooling
from ...layers.convolutional import window_out
from ._runtime import is_device, to_device


class Transfers(threading.local):
    """Per-thread counts of the last ``run_model`` call: activation copies in / out and the
    names of the layers that ran on the host."""

    def __init__(self):
        self.to_device = 0
        self.to_host = 0
        self.host_layers: list[str] = []
        self.depth = 0


LAST_RUN = Transfers()


def _alpha(layer):
    return getattr(layer, "_alpha", 0.0)


def _dense(ops, layer, x):
    return ops.dense(x, layer.kernel, layer.bias if layer.use_bias else None, layer.activation,
                     core._DEFAULT_ALPHA.get(layer.activation, 0.0))


def _activation(ops, layer, x):
    return ops.activation(x, layer.activation, layer._alpha)


def _relu(ops, layer, x):
    if layer.threshold == 0.0 and layer.negative_slope == 0.0 and layer.max_value in (None, 6.0):
        return ops.activation(x, "relu" if layer.max_value is None else "relu6")
    return None


def _leaky(ops, layer, x):
    return ops.activation(x, "leaky_relu", layer.negative_slope)


def _elu(ops, layer, x):
    return ops.activation(x, "elu", layer.alpha)


def _softmax(ops, layer, x):
    if isinstance(layer.axis, int) and layer.axis in (-1, len(x.shape) - 1):
        return ops.activation(x, "softmax")
    return None


def _flatten(ops, layer, x):
    shape = tuple(x.shape)
    if layer.data_format == "channels_first" and len(shape) > 2:
        return None
    return x.reshape(shape[0], int(np.prod(shape[1:])))


def _identity(ops, layer, x):
    return x


def _as_nhwc(layer, x):
    """x as a 4-D NHWC device array (1-D layers: height 1), or None for channels_first."""
    if layer.data_format != "channels_last":
        return None
    if layer.rank == 1:
        n, steps, c = tuple(x.shape)
        return x.reshape(n, 1, steps, c)
    return x


def _from_nhwc(layer, y):
    if layer.rank == 1:
        n, _, steps, c = tuple(y.shape)
        return y.reshape(n, steps, c)
    return y


def _conv(ops, layer, x):
    x4 = _as_nhwc(layer, x)
    if x4 is None:
        return None
    sizes = tuple(x4.shape)[1:3] if layer.rank == 2 else tuple(x4.shape)[2:3]
    pads = layer._pads_hw(sizes, layer.kernel_size, layer.strides, layer.dilation_rate)
    layer._check_output(x4, pads)
    kernel = layer.kernel if layer.rank == 2 else layer.kernel[None]
    y = ops.conv2d(x4, kernel, layer.bias if layer.use_bias else None, layer._hw(layer.strides),
                   pads, layer._hw(layer.dilation_rate), layer.groups, layer.activation,
                   _alpha(layer))
    return _from_nhwc(layer, y)


def _depthwise(ops, layer, x):
    if layer.rank != 2 or layer.data_format != "channels_last":
        return None
    return layer._depthwise(x, layer.kernel, layer.bias if layer.use_bias else None,
                            layer.activation, _alpha(layer))


def _pool(ops, layer, x):
    x4 = _as_nhwc(layer, x)
    if x4 is None:
        return None
    sizes = tuple(x4.shape)[1:3] if layer.rank == 2 else tuple(x4.shape)[2:3]
    pads = layer._pads_hw(sizes, layer.pool_size, layer.strides, (1,) * layer.rank)
    pool, strides = layer._hw(layer.pool_size), layer._hw(layer.strides)
    out_hw = tuple(window_out(n, k, s, 1, p)
                   for n, k, s, p in zip(tuple(x4.shape)[1:3], pool, strides, pads))
    if min(out_hw) <= 0:
        return None  # the layer's own call raises its ShapeError
    return _from_nhwc(layer, ops.pool2d(x4, layer.kind, pool, strides, pads, out_hw, (1, 1),
                                        False))


def _batch_norm(ops, layer, x):
    return ops.batch_norm(x, layer._scale, layer._shift, layer._axis)


def _layer_norm(ops, layer, x):
    return ops.layer_norm(x, layer.gamma if layer.scale else None,
                          layer.beta if layer.center else None, layer.epsilon, layer._axes,
                          layer._rms)


def _rms_norm(ops, layer, x):
    return ops.layer_norm(x, layer.scale, None, layer.epsilon, layer._axes, True)


def _global_pool(ops, layer, x):
    if layer.data_format != "channels_last":
        return None
    return ops.global_pool(x, layer.kind, layer._axes(), layer.keepdims)


def _merge(op, average=False):
    def run(ops, layer, xs):
        if any(tuple(a.shape) != tuple(xs[0].shape) for a in xs):
            return None  # broadcasting merges run on the host
        out = xs[0]
        for i, a in enumerate(xs[1:]):
            scale = 1.0 / len(xs) if average and i == len(xs) - 2 else 1.0
            out = ops.merge(out, a, op, scale, scale)
        return out

    run.multi_input = True
    return run


def _concatenate(ops, layer, xs):
    shapes = [tuple(a.shape) for a in xs]
    if 0 in (n for s in shapes for n in s):
        return None
    return ops.concatenate(xs, layer.axis)


_concatenate.multi_input = True


#: Layer types (exact classes: subclasses may override ``call``) that run on device arrays.
_HANDLERS = {
    core.Dense: _dense,
    core.Activation: _activation,
    core.ReLU: _relu,
    core.LeakyReLU: _leaky,
    core.ELU: _elu,
    core.Softmax: _softmax,
    core.Flatten: _flatten,
    core.Dropout: _identity,
    convolutional.Conv1D: _conv,
    convolutional.Conv2D: _conv,
    convolutional.DepthwiseConv2D: _depthwise,
    pooling.MaxPooling1D: _pool,
    pooling.AveragePooling1D: _pool,
    pooling.MaxPooling2D: _pool,
    pooling.AveragePooling2D: _pool,
    pooling.GlobalMaxPooling1D: _global_pool,
    pooling.GlobalAveragePooling1D: _global_pool,
    pooling.GlobalMaxPooling2D: _global_pool,
    pooling.GlobalAveragePooling2D: _global_pool,
    normalization.BatchNormalization: _batch_norm,
    normalization.LayerNormalization: _layer_norm,
    normalization.RMSNormalization: _rms_norm,
    merging.Add: _merge("add"),
    merging.Subtract: _merge("subtract"),
    merging.Multiply: _merge("multiply"),
    merging.Maximum: _merge("maximum"),
    merging.Minimum: _merge("minimum"),
    merging.Average: _merge("add", average=True),
    merging.Concatenate: _concatenate,
}


def resident_layer_types() -> list[str]:
    """Names of the layer types that keep their activations on the device."""
    return sorted(t.__name__ for t in _HANDLERS)


def _to_host_tree(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host_tree(a) for a in v)
    if is_device(v):
        LAST_RUN.to_host += 1
        return v.copy_to_host()
    return v


def _to_device_tree(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device_tree(a) for a in v)
    if isinstance(v, np.ndarray) and v.dtype == np.float32:
        LAST_RUN.to_device += 1
        return to_device(v)
    return v


def run_model(ops, model, x):
    """``model.call(x)`` with activations on the device; returns host arrays (as ``call`` does)."""
    if LAST_RUN.depth == 0:  # a nested model (run on the host path) adds to its parent's counts
        LAST_RUN.to_device = LAST_RUN.to_host = 0
        LAST_RUN.host_layers = []
    LAST_RUN.depth += 1
    try:
        return _run(ops, model, x)
    finally:
        LAST_RUN.depth -= 1


def _run(ops, model, x):
    arrays = x if isinstance(x, list) else [x]
    values: dict[int, object] = {}
    for t, a in zip(model.inputs, arrays):
        values[id(t)] = _to_device_tree(a)
    nodes = _plan_nodes(model)
    for node, (fn, keys, out_keys) in zip(nodes, model._plan):
        args = [values[k] for k in keys] if type(keys) is list else values[keys]
        out = None
        handler = _HANDLERS.get(type(node.layer))
        if handler is not None and not node.extra_args and not node.kwargs:
            if getattr(handler, "multi_input", False):
                if type(args) is list and len(args) >= 2 and all(map(is_device, args)):
                    out = handler(ops, node.layer, args)
            elif type(keys) is not list and is_device(args):
                out = handler(ops, node.layer, args)
        if out is None:
            LAST_RUN.host_layers.append(node.layer.name)
            out = _to_device_tree(fn(_to_host_tree(args)))
        if len(out_keys) == 1:
            values[out_keys[0]] = out
        else:
            values.update(zip(out_keys, out))
    results = [_to_host_tree(values[id(t)]) for t in model.outputs]
    return results[0] if model._single_output else results


def _plan_nodes(model):
    from ...graph import InputLayer

    return [n for n in model._nodes if not isinstance(n.layer, InputLayer)]
