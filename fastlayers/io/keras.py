"""Keras model files without Keras or TensorFlow: ``.keras`` (Keras 3 zip or its unzipped
directory), legacy full-model ``.h5`` (Keras 3 and tf.keras 2.x) and weight files
(``.weights.h5``, legacy ``.h5`` weights). Needs h5py (``pip install fastlayers[keras]``).

The architecture (JSON) is rebuilt with fastlayers layers through ``build_layer`` and its table ``KERAS_OPTIONS``; weights are
read by position in Keras's own order. Nothing in a file is executed: ``Lambda`` layers (Python
bytecode) and custom objects are refused with ``UnsupportedError`` at load time.

Files are checked before h5py or a layer sees them (``io.limits`` for the limits): the zip
layer (flags, methods, sizes; the weights member's CRC-32 when it is read in place), the config
(size, nesting, structure, types, the ranges of layer options, weight sizes against the bytes
the file holds), the HDF5 objects (only hard links are followed, datasets must be numeric and
stored in the file itself, their bytes inside it) and, before any attribute is read from a
legacy ``.h5``, every global heap collection (see ``_check_global_heaps``).
"""

from __future__ import annotations

import io
import mmap
import os
import re
import struct
import zipfile
from collections import defaultdict, deque
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import FastlayersError, ModelFileError, UnsupportedError
from . import limits

#: Config keys that only matter for training or for Keras internals: ignored.
_IGNORED = re.compile(r"^(name|trainable|dtype|build_config|registered_name|module|seed|"
                      r"activity_regularizer|noise_shape|autocast|quantization_config|"
                      r"input_length|synchronized|optional|sparse|ragged|momentum|renorm_momentum)$"
                      r"|_(initializer|regularizer|constraint)$")
#: dtype policies computed in float32 (weights are cast on load).
_FLOAT_POLICIES = {"float32", "float16", "bfloat16", "float64", "mixed_float16", "mixed_bfloat16"}
_MODEL_CLASSES = {"Functional", "Model", "Sequential"}
#: Arguments every fastlayers layer takes (Keras's legacy input-shape arguments).
_BASE_PARAMS = {"input_shape", "batch_size", "batch_input_shape", "input_dim"}
#: Most names a ``weight_names`` or ``layer_names`` attribute may list.
_MAX_NAMES = 1 << 20
#: What h5py raises on a corrupt or hostile file (soft-link loops, bad addresses, bad heaps).
_H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError, TypeError, AttributeError,
              IndexError, OverflowError, UnicodeError)


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise UnsupportedError("reading Keras files needs h5py: pip install fastlayers[keras]") from e
    return h5py


# ------------------------------------------------------------------------------ config -> layers
def _policy_name(dtype) -> str | None:
    if isinstance(dtype, dict):
        config = dtype.get("config")
        return config.get("name") if isinstance(config, dict) else None
    return dtype


def _activation(value, where):
    """A Keras activation config (a name, or a serialized function) as a name."""
    if isinstance(value, dict):
        module = value.get("module")
        if value.get("class_name") in ("function", "builtins.function") or (
                isinstance(module, str) and module.startswith("keras")):
            value = value.get("config")
        if isinstance(value, (dict, list)):
            raise UnsupportedError(f"{where}: activation {limits.describe(value)} is a custom "
                                   "object; not supported")
    return value


#: Keras class name -> the options (config keys) its fastlayers layer takes, besides the name and
#: the input-shape keys of every layer (``_BASE_PARAMS``); the class is ``LAYER_CLASSES[name]``.
#: Other keys fail by name (``build_layer``), unless they are off (None, False) or ignored.
KERAS_OPTIONS: dict[str, tuple[str, ...]] = {
    "Activation": ("activation",),
    "Add": (),
    "AdditiveAttention": ("use_scale", "dropout"),
    "Attention": ("use_scale", "score_mode", "dropout"),
    "Average": (),
    "AveragePooling1D": ("pool_size", "strides", "padding", "data_format"),
    "AveragePooling2D": ("pool_size", "strides", "padding", "data_format"),
    "BatchNormalization": ("axis", "momentum", "epsilon", "center", "scale", "synchronized",
                           "renorm"),
    "Bidirectional": ("layer", "merge_mode", "backward_layer", "weights"),
    "BinaryOp": ("op", "constants"),
    "Concatenate": ("axis",),
    "Conv1D": ("filters", "kernel_size", "strides", "padding", "data_format", "dilation_rate",
               "groups", "activation", "use_bias"),
    "Conv2D": ("filters", "kernel_size", "strides", "padding", "data_format", "dilation_rate",
               "groups", "activation", "use_bias"),
    "Conv2DTranspose": ("filters", "kernel_size", "strides", "padding", "output_padding",
                        "data_format", "dilation_rate", "activation", "use_bias"),
    "Cropping1D": ("cropping",),
    "Cropping2D": ("cropping", "data_format"),
    "CustomScaleLayer": ("scale",),
    "Dense": ("units", "activation", "use_bias"),
    "DepthwiseConv2D": ("kernel_size", "strides", "padding", "depth_multiplier", "data_format",
                        "dilation_rate", "activation", "use_bias"),
    "Dropout": ("rate",),
    "ELU": ("alpha",),
    "Embedding": ("output_dim", "mask_zero", "input_length"),
    "Flatten": ("data_format",),
    "GRU": ("units", "activation", "recurrent_activation", "use_bias", "return_sequences",
            "return_state", "go_backwards", "stateful", "reset_after", "zero_output_for_mask",
            "dropout", "recurrent_dropout", "unroll", "use_cudnn"),
    "GRUCell": ("units", "activation", "recurrent_activation", "use_bias", "reset_after",
                "dropout", "recurrent_dropout"),
    "GlobalAveragePooling1D": ("data_format", "keepdims"),
    "GlobalAveragePooling2D": ("data_format", "keepdims"),
    "GlobalMaxPooling1D": ("data_format", "keepdims"),
    "GlobalMaxPooling2D": ("data_format", "keepdims"),
    "HardAttention": ("use_scale",),
    "HierarchicalSoftmax": ("num_classes", "tree", "use_bias"),
    "InceptionBlock": ("filters_1x1", "filters_3x3_reduce", "filters_3x3", "filters_5x5_reduce",
                       "filters_5x5", "filters_pool_proj", "activation", "data_format"),
    "InputLayer": ("shape", "batch_shape"),
    "LSTM": ("units", "activation", "recurrent_activation", "use_bias", "unit_forget_bias",
             "return_sequences", "return_state", "go_backwards", "stateful",
             "zero_output_for_mask", "dropout", "recurrent_dropout", "unroll", "use_cudnn"),
    "LSTMCell": ("units", "activation", "recurrent_activation", "use_bias", "unit_forget_bias",
                 "dropout", "recurrent_dropout"),
    "LayerNormalization": ("axis", "epsilon", "center", "scale", "rms_scaling"),
    "LayerScale": ("init_values", "projection_dim"),
    "LeakyReLU": ("negative_slope",),
    "LocalResponseNormalization": ("depth_radius", "bias", "alpha", "beta", "data_format"),
    "MaxPooling1D": ("pool_size", "strides", "padding", "data_format"),
    "MaxPooling2D": ("pool_size", "strides", "padding", "data_format"),
    "Maximum": (),
    "Minimum": (),
    "MultiHeadAttention": ("num_heads", "key_dim", "value_dim", "dropout", "use_bias",
                           "output_shape", "attention_axes", "flash_attention", "sliding_window",
                           "use_gate"),
    "Multiply": (),
    "NiNBlock": ("filters", "kernel_size", "strides", "padding", "mlp_filters", "activation",
                 "global_pool", "data_format"),
    "Normalization": ("axis", "mean", "variance", "invert"),
    "PaddingMask": (),
    "Permute": ("dims",),
    "PositionalEncoding": ("max_length", "base", "scale_input"),
    "PositionwiseFeedForward": ("hidden_units", "output_units", "activation", "use_bias"),
    "RMSNormalization": ("axis", "epsilon"),
    "ReLU": ("max_value", "negative_slope", "threshold"),
    "RepeatVector": ("n",),
    "Rescaling": ("scale", "offset"),
    "Reshape": ("target_shape",),
    "RoIPooling2D": ("pool_size", "spatial_scale", "data_format"),
    "SelfAttention": ("num_heads", "key_dim", "use_causal_mask", "return_attention_scores"),
    "SeparableConv2D": ("filters", "kernel_size", "strides", "padding", "data_format",
                        "dilation_rate", "depth_multiplier", "activation", "use_bias"),
    "SimpleRNN": ("units", "activation", "use_bias", "return_sequences", "return_state",
                  "go_backwards", "stateful", "zero_output_for_mask", "dropout",
                  "recurrent_dropout", "unroll"),
    "SimpleRNNCell": ("units", "activation", "use_bias", "dropout", "recurrent_dropout"),
    "Softmax": ("axis",),
    "SpatialDropout1D": ("rate",),
    "SpatialDropout2D": ("rate", "data_format"),
    "SpatialDropout3D": ("rate", "data_format"),
    "StochasticDepth": ("drop_path_rate",),
    "Subtract": (),
    "UpSampling2D": ("size", "data_format", "interpolation", "align_corners"),
    "ZeroPadding1D": ("padding", "data_format"),
    "ZeroPadding2D": ("padding", "data_format"),
}


def build_layer(class_name: str, config: dict, where: str, weight_elements: int | None = None):
    """A fastlayers layer for the Keras layer ``class_name`` with ``config``, or UnsupportedError
    naming the layer and the option that fastlayers cannot honour. ``weight_elements`` bounds the
    weight sizes the config may ask for (``limits.check_layer_config``)."""
    name = config.get("name", "?")
    here = f"{where}: layer {name!r} ({class_name})"
    if not isinstance(name, str):
        raise ModelFileError(f"{where}: layer of class {class_name!r}: field 'name': expected a "
                             f"string, found {limits.describe(name)}")
    if class_name == "Lambda":
        raise UnsupportedError(f"{here}: Lambda layers carry Python code, which fastlayers never "
                               "executes from a file; rebuild the model without Lambda layers")
    from ..layers import LAYER_CLASSES

    cls = LAYER_CLASSES.get(class_name) if class_name in KERAS_OPTIONS else None
    if cls is None:
        raise UnsupportedError(f"{here}: layer class {class_name!r} is not supported")
    policy = _policy_name(config.get("dtype"))
    if policy is not None and class_name != "InputLayer" and (
            not isinstance(policy, str) or policy not in _FLOAT_POLICIES):
        raise UnsupportedError(f"{here}: dtype policy {limits.short_repr(policy)} is not supported "
                               "(float policies are computed in float32)")
    if config.get("stateful"):
        raise UnsupportedError(f"{here}: option stateful=True is not supported; use the streaming API")
    if config.get("unroll"):
        raise UnsupportedError(f"{here}: option unroll=True is not supported")
    params = set(KERAS_OPTIONS[class_name]) | _BASE_PARAMS | {"name"}
    kwargs = {"name": name}
    for key, value in config.items():
        if key == "dtype" or (_IGNORED.search(key) and key not in params):
            continue
        if key not in params:
            if value is None or value is False:  # a feature left off
                continue
            raise UnsupportedError(f"{here}: option {key}={limits.short_repr(value)} is not supported")
        if key == "activation":
            value = _activation(value, here)
        kwargs[key] = value
    limits.check_layer_config(kwargs, where, f"layer {name!r} ({class_name})", class_name,
                              weight_elements)
    if class_name == "InputLayer":
        kwargs["dtype"] = config.get("dtype") if isinstance(config.get("dtype"), str) else None
        if "batch_shape" not in kwargs and "batch_input_shape" in kwargs:
            kwargs["batch_shape"] = kwargs.pop("batch_input_shape")
    if class_name == "Bidirectional":   # the wrapped layers are Keras configs: built here
        for key in ("layer", "backward_layer"):
            sub = kwargs.get(key)
            if isinstance(sub, dict) and isinstance(sub.get("class_name"), str) and \
                    isinstance(sub.get("config"), dict):
                kwargs[key] = build_layer(sub["class_name"], dict(sub["config"]), here,
                                          weight_elements)
    try:
        return cls(**kwargs)
    except FastlayersError as e:
        if isinstance(e, UnsupportedError):
            raise type(e)(f"{here}: {e}") from e
        raise ModelFileError(f"{here}: invalid config ({e})") from e
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{here}: invalid config ({e})") from e
    except Exception as e:  # a config from a file: any failure is the file's
        raise _build_error(here, e) from e


#: Keras 3 operation nodes (``module`` keras.src.ops.*: ``x + 3.0``, ``a + b`` on symbolic
#: tensors) that fastlayers rebuilds, as ``layers.BinaryOp`` ops.
_OPERATIONS = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply", "Divide": "divide",
               "TrueDivide": "divide"}


def _is_operation(entry) -> bool:
    """A Keras 3 operation node: its module (``.keras``), or in a legacy ``.h5`` (no modules)
    an operation's class name with a config of only its name (layers also record trainable
    and dtype)."""
    module = entry.get("module")
    if module is None:
        return entry["class_name"] in _OPERATIONS and set(entry["config"]) <= {"name"}
    return isinstance(module, str) and module.startswith("keras.src.ops.")


def _is_tensor(arg) -> bool:
    return isinstance(arg, dict) and arg.get("class_name") == "__keras_tensor__"


def build_operation(entry: dict, where: str):
    """A Keras 3 operation node (one call of ``op(a, b)``, each operand a tensor or a number) as
    a ``layers.BinaryOp``; UnsupportedError for other operations or operands."""
    from ..layers import BinaryOp

    class_name = entry["class_name"]
    name = entry.get("name") or entry["config"].get("name")
    here = f"{where}: operation {name!r} ({entry.get('module')}.{class_name})"
    op = _OPERATIONS.get(class_name)
    if op is None:
        raise UnsupportedError(f"{here}: this Keras operation is not supported (supported: "
                               f"{', '.join(sorted(_OPERATIONS))} between tensors and numbers)")
    nodes = entry.get("inbound_nodes", [])
    if len(nodes) != 1 or not isinstance(nodes[0], dict):
        raise ModelFileError(f"{here}: expected one Keras 3 call node, found "
                             f"{limits.describe(nodes)}")
    args, kwargs = nodes[0].get("args", []), nodes[0].get("kwargs", {})
    if len(args) != 2 or kwargs:
        raise UnsupportedError(f"{here}: expected two operands and no keyword arguments, found "
                               f"{len(args)} operand(s) and {sorted(kwargs)}")
    constants = []
    for arg in args:
        if _is_tensor(arg):
            constants.append(None)
        elif (type(arg) is float and np.isfinite(arg)) or (
                type(arg) is int and abs(arg) <= limits.MAX_CONFIG_INT):
            constants.append(float(arg))
        else:
            raise UnsupportedError(f"{here}: operand {limits.describe(arg)} is neither a tensor "
                                   "nor a finite number")
    if None not in constants:
        raise ModelFileError(f"{here}: no tensor operand")
    return BinaryOp(op, constants, name=name)


def _build_error(here: str, e: BaseException) -> FastlayersError:
    """A layer the config cannot build or call, as ModelFileError (its own ModelFileError or
    UnsupportedError as it is)."""
    if isinstance(e, (ModelFileError, UnsupportedError)):
        return e if here.split(": ")[0] in str(e) else type(e)(f"{here}: {e}")
    if isinstance(e, MemoryError):
        return ModelFileError(f"{here}: its weights cannot be allocated ({str(e)[:200] or 'MemoryError'})")
    text = str(e)[:300] if isinstance(e, FastlayersError) else f"{type(e).__name__}: {str(e)[:300]}"
    return ModelFileError(f"{here}: cannot be built from the file's config ({text})")


# ---------------------------------------------------------------------------- config structure
def _expect(condition: bool, where: str, field: str, expected: str, found) -> None:
    if not condition:
        raise ModelFileError(f"{where}: {field}: expected {expected}, found {limits.describe(found)}")


def _is_history(ref) -> bool:
    """A Keras tensor reference: [layer name, node index, tensor index]."""
    return (isinstance(ref, list) and len(ref) >= 3 and isinstance(ref[0], str)
            and all(type(v) is int and 0 <= v <= limits.MAX_CONFIG_INT for v in ref[1:3]))


def _check_node(node, where: str, field: str) -> None:
    if isinstance(node, dict):
        _expect(isinstance(node.get("args", []), list), where, f"{field}.args", "a list",
                node.get("args"))
        _expect(isinstance(node.get("kwargs", {}), dict), where, f"{field}.kwargs", "an object",
                node.get("kwargs"))
        stack = [(node.get("args", []), f"{field}.args"), (node.get("kwargs", {}), f"{field}.kwargs")]
        while stack:
            value, path = stack.pop()
            if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
                config = value.get("config")
                history = config.get("keras_history") if isinstance(config, dict) else None
                _expect(_is_history(history), where, f"{path}.config.keras_history",
                        "[layer name, node index, tensor index]", history)
            elif isinstance(value, dict):
                stack.extend((v, f"{path}.{k}") for k, v in value.items())
            elif isinstance(value, list):
                stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        return
    _expect(isinstance(node, list) and node, where, field,
            "a Keras 3 node object or a tf.keras list of [layer, node, tensor, kwargs]", node)
    for i, entry in enumerate(node):
        _expect(_is_history(entry) and (len(entry) == 3 or isinstance(entry[3], dict)), where,
                f"{field}[{i}]", "[layer name, node index, tensor index, kwargs]", entry)


def _check_io_refs(spec, where: str, field: str) -> None:
    ok = _is_history(spec) or (isinstance(spec, list) and spec and all(_is_history(s) for s in spec))
    _expect(ok, where, field, "[layer, node, tensor] or a list of them", spec)


def check_config(entry, where: str, count: list | None = None, path: str = "config") -> None:
    """The structure and types of a Keras model config (``Functional``/``Model``/``Sequential``,
    nested models included) before anything is built: ModelFileError naming ``where`` and the
    field otherwise; layer and node counts against ``max_layers`` (``settings.current()``)."""
    count = [0] if count is None else count
    _expect(isinstance(entry, dict) and isinstance(entry.get("class_name"), str)
            and isinstance(entry.get("config"), dict), where, path,
            "an object with a string 'class_name' and an object 'config'", entry)
    class_name, cfg = entry["class_name"], entry["config"]
    if class_name not in _MODEL_CLASSES:
        raise UnsupportedError(f"{where}: model class {class_name!r} is not supported")
    layers = cfg.get("layers")
    _expect(isinstance(layers, list), where, f"{path}.config.layers", "a list of layers", layers)
    _expect(cfg.get("name") is None or isinstance(cfg.get("name"), str), where,
            f"{path}.config.name", "a string", cfg.get("name"))
    for i, layer in enumerate(layers):
        field = f"{path}.config.layers[{i}]"
        _expect(isinstance(layer, dict) and isinstance(layer.get("class_name"), str)
                and isinstance(layer.get("config"), dict), where, field,
                "an object with a string 'class_name' and an object 'config'", layer)
        limits.count_layers(count, where)
        if layer["class_name"] in _MODEL_CLASSES:
            check_config(layer, where, count, field)
        name = layer.get("name", layer["config"].get("name"))
        _expect(isinstance(name, str) or (class_name == "Sequential" and name is None), where,
                f"{field}.name", "a string", name)
        if class_name == "Sequential":
            continue
        nodes = layer.get("inbound_nodes", [])
        _expect(isinstance(nodes, list), where, f"{field}.inbound_nodes", "a list", nodes)
        limits.count_layers(count, where, len(nodes))
        for j, node in enumerate(nodes):
            _check_node(node, where, f"{field}.inbound_nodes[{j}]")
    if class_name == "Sequential":
        shape = cfg.get("build_input_shape")
        _expect(shape is None or _is_shape(shape), where, f"{path}.config.build_input_shape",
                "a list of sizes", shape)
        return
    for key in ("input_layers", "output_layers"):
        _check_io_refs(cfg.get(key), where, f"{path}.config.{key}")


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and 1 <= len(shape) <= 16 and all(
        d is None or (type(d) is int and 0 <= d <= limits.MAX_CONFIG_INT) for d in shape)


# ----------------------------------------------------------------------------- config -> model
def _inbound_refs(node) -> tuple:
    """Keras 3 node {"args": [...], "kwargs": {...}} or tf.keras 2 [[name, node, tensor, kw], ...]
    as (structure of (layer name, node index, tensor index), extra args, kwargs)."""
    if isinstance(node, dict):
        def conv(obj):
            if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
                return tuple(obj["config"]["keras_history"][:3])
            if isinstance(obj, (list, tuple)):
                return [conv(o) for o in obj]
            return obj
        args = [conv(a) for a in node.get("args", [])]
        kwargs = {k: conv(v) for k, v in node.get("kwargs", {}).items() if v is not None}
        first = args[0] if args else None
        return first, args[1:], kwargs
    refs = [tuple(entry[:3]) for entry in node]
    kwargs = node[0][3] if node and len(node[0]) > 3 and node[0][3] else {}
    return (refs[0] if len(refs) == 1 else refs), [], dict(kwargs)


def _refs_in(obj, out: set) -> set:
    """The (layer, node, tensor) references anywhere in ``obj``."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            out.add(value)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return out


def build_model(entry: dict, where: str, weight_elements: int | None = None, _checked=False):
    """Rebuild a Keras ``Functional``/``Sequential`` config as a fastlayers model (the config is
    checked first: ``check_config``)."""
    from ..layers import BinaryOp
    from ..model.graph import Input, InputLayer, Model, Sequential

    if not _checked:
        limits.check_depth(entry, where, "the model config")
        check_config(entry, where)
    class_name, cfg = entry["class_name"], entry["config"]
    model_name = cfg.get("name")

    def build(e):
        if e["class_name"] in _MODEL_CLASSES:
            return build_model(e, where, weight_elements, True)
        if _is_operation(e):
            return build_operation(e, where)
        return build_layer(e["class_name"], e["config"], where, weight_elements)

    if class_name == "Sequential":
        layers = [build(e) for e in cfg["layers"]]
        try:
            if not isinstance(layers[0] if layers else None, InputLayer):
                shape = cfg.get("build_input_shape") or (layers[0]._batch_input_shape if layers else None)
                first_cfg = cfg["layers"][0]["config"] if cfg["layers"] else {}
                shape = shape or first_cfg.get("batch_input_shape") or first_cfg.get("batch_shape")
                if shape is None:
                    raise ModelFileError(f"{where}: Sequential {model_name!r} has no input shape")
                _expect(_is_shape(list(shape)), where, f"Sequential {model_name!r} input shape",
                        "a list of sizes", shape)
                layers.insert(0, Input(batch_shape=shape).node.layer)
            return Sequential(layers, name=model_name)
        except Exception as e:  # a config from a file: any failure is the file's
            raise _build_error(f"{where}: Sequential {model_name!r}", e) from e
    layers, entries = {}, {}
    for e in cfg["layers"]:
        if e["class_name"] == "NotEqual":
            # Keras 3 records Embedding(mask_zero=True)'s mask as a NotEqual op feeding `mask=`
            # kwargs (dropped below); recurrent layers recompute that mask (PaddingMask). A
            # NotEqual used as an ordinary input leaves its consumers unresolved: a clear error.
            continue
        lname = e.get("name") or e["config"]["name"]
        if lname in layers:
            raise ModelFileError(f"{where}: model {model_name!r} has two layers named {lname!r}")
        layers[lname] = build(e)
        entries[lname] = e
    outputs: dict[tuple, object] = {}  # (layer, node index, tensor index) -> symbolic tensor

    def resolve(ref):
        if isinstance(ref, list):
            return [resolve(r) for r in ref]
        if isinstance(ref, tuple):
            return outputs[ref]
        return ref

    # replay the calls in dependency order (Kahn): each waits for the calls producing its inputs
    items, waiting, missing = [], defaultdict(list), []
    done = {(lname, 0) for lname, layer in layers.items() if isinstance(layer, InputLayer)}
    for lname in done:
        outputs[(lname[0], 0, 0)] = layers[lname[0]].output
    ready = deque()
    for lname, e in entries.items():
        for index, node in enumerate(e.get("inbound_nodes", [])):
            first, extra, kwargs = _inbound_refs(node)
            kwargs.pop("mask", None)
            kwargs.pop("training", None)
            producers = {r[:2] for r in _refs_in([first, extra, kwargs], set())} - done
            item = len(items)
            items.append((lname, index, first, extra, kwargs))
            missing.append(len(producers))
            for p in producers:
                waiting[p].append(item)
            if not producers:
                ready.append(item)
    replayed = 0
    while ready:
        item = ready.popleft()
        lname, index, first, extra, kwargs = items[item]
        here = f"{where}: layer {lname!r} ({type(layers[lname]).__name__}) call {index}"
        try:
            args, extra_args = resolve(first), [resolve(a) for a in extra]
            kwargs = {k: resolve(v) for k, v in kwargs.items()}
        except KeyError as e:
            raise ModelFileError(f"{here}: input {e.args[0]} is not an output of that layer "
                                 "call") from None
        if isinstance(layers[lname], BinaryOp):   # its tensor operands, as a list
            args, extra_args = [a for a in (args, *extra_args) if type(a) not in (int, float)], []
        try:
            out = layers[lname](args, *extra_args, **kwargs)
        except Exception as e:  # a graph from a file: any failure is the file's
            raise _build_error(here, e) from e
        for t, tensor in enumerate(out if isinstance(out, list) else [out]):
            outputs[(lname, index, t)] = tensor
        replayed += 1
        for waiter in waiting.pop((lname, index), ()):
            missing[waiter] -= 1
            if missing[waiter] == 0:
                ready.append(waiter)
    if replayed != len(items):
        stuck = [items[i][0] for i in range(len(items)) if missing[i] > 0]
        raise ModelFileError(f"{where}: the graph of {model_name!r} cannot be rebuilt "
                             f"(unresolved inputs for {stuck[:5]})")

    def refs(spec, key):
        """A single [name, node, tensor] (or a one-element list of them, which Keras unwraps)
        gives one tensor; several give a list."""
        specs = [spec] if isinstance(spec[0], str) else spec
        tensors = []
        for s in specs:
            if tuple(s[:3]) not in outputs:
                raise ModelFileError(f"{where}: {key} of {model_name!r}: {s[:3]} is not a layer output")
            tensors.append(outputs[tuple(s[:3])])
        return tensors[0] if len(tensors) == 1 else tensors

    inputs, outs = refs(cfg["input_layers"], "input_layers"), refs(cfg["output_layers"], "output_layers")
    try:
        return Model(inputs, outs, name=model_name)
    except Exception as e:
        raise _build_error(f"{where}: model {model_name!r}", e) from e


# ------------------------------------------------------------------------------------ weights
def _keras_weights_of(layer) -> list:
    """(fastlayers attribute) names in Keras's variable order for ``layer``."""
    return layer.weight_names


class _RawFile:
    """Where the HDF5 image lives: an open binary file (a path's, or an in-memory buffer) and
    the image's offset and size in it (non-zero offset: an uncompressed member of a .keras zip).
    Contiguous datasets are read at their offset, inside ``size`` bytes, straight into the
    layer's array: as fast as reading the bytes, one copy in memory."""

    def __init__(self, fobj, offset: int = 0, size: int | None = None):
        self.fobj, self.offset = fobj, offset
        if size is None:
            fobj.seek(0, io.SEEK_END)
            size = fobj.tell() - offset
        self.size = size

    def read_into(self, out: np.ndarray, offset: int, where: str, what: str) -> None:
        nbytes = out.nbytes
        if offset < 0 or offset + nbytes > self.size:
            raise ModelFileError(f"{where}: {what} claims bytes [{offset:,}, {offset + nbytes:,}) "
                                 f"of a {self.size:,}-byte HDF5 image: outside the file")
        self.fobj.seek(self.offset + offset)
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        done = 0
        while done < nbytes:
            n = self.fobj.readinto(view[done:done + limits.CHUNK_BYTES])
            if not n:
                raise ModelFileError(f"{where}: {what} is truncated")
            done += n


def _assign(layer, datasets, where, raw=None):
    """Set ``layer``'s weights from h5py datasets in Keras order (``raw``: see ``_RawFile``)."""
    names = _keras_weights_of(layer)
    if len(datasets) != len(names):
        raise ModelFileError(f"{where}: layer {layer.name!r} ({type(layer).__name__}) expects "
                             f"{len(names)} weights {names}, the file has {len(datasets)}")
    values = []
    for wname, dataset in zip(names, datasets):
        current = getattr(layer, wname)
        if dataset.shape != current.shape:
            raise ModelFileError(f"{where}: weight {wname!r} of layer {layer.name!r} expects shape "
                                 f"{current.shape}, the file has {dataset.shape}")
        values.append(_read_dataset(dataset, raw, where, current))
    for wname, value in zip(names, values):
        setattr(layer, wname, value)
    with np.errstate(all="ignore"):   # weights from a file may hold inf or NaN
        layer._weights_changed()


def _check_dataset(h5py, dataset, where) -> None:
    """A weight dataset must be numeric and hold its bytes in this file: no external raw data
    files, no virtual datasets (mappings to other files), chunks no larger than the data."""
    if dataset.dtype.kind not in "fiu" and str(dataset.dtype) != "bfloat16":
        raise ModelFileError(f"{where}: dataset {dataset.name} has dtype {dataset.dtype}, expected floats")
    plist = dataset.id.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL or plist.get_external_count():
        raise ModelFileError(f"{where}: dataset {dataset.name} keeps its data outside the file "
                             "(external or virtual storage); refused")
    chunks = dataset.chunks
    if chunks is not None:
        chunk_bytes = int(np.prod(chunks, dtype=np.float64)) * dataset.dtype.itemsize
        if chunk_bytes > max(dataset.size * dataset.dtype.itemsize, 1 << 20):
            raise ModelFileError(f"{where}: dataset {dataset.name} declares {chunks} chunks, "
                                 f"larger than its shape {dataset.shape}")


def _read_dataset(dataset, raw: _RawFile | None, where, current=None) -> np.ndarray:
    """A dataset as a new C-contiguous float32 array (float16/bfloat16/float64 policies cast):
    ``current`` (the layer's uninitialized array) itself when the bytes are float32."""
    h5py = _h5py()
    _check_dataset(h5py, dataset, where)
    shape = dataset.shape
    usable = (current is not None and current.dtype == np.float32 and current.flags.c_contiguous
              and current.flags.writeable and current.base is None and current.shape == shape)
    if not dataset.size:
        return np.zeros(shape, np.float32)
    offset = dataset.id.get_offset() if raw is not None and dataset.chunks is None else None
    what = f"dataset {dataset.name}"
    if offset is not None:
        dtype = dataset.dtype
        if dtype == np.float32 and usable:
            raw.read_into(current, offset, where, what)
            return current
        if str(dtype) == "bfloat16":
            offset = None   # h5py's own conversion
        else:
            buf = np.empty(shape, dtype)
            raw.read_into(buf, offset, where, what)
            with np.errstate(all="ignore"):
                return np.array(buf, dtype=np.float32, order="C", copy=None)
    try:
        if dataset.dtype == np.float32:
            value = current if usable else np.empty(shape, np.float32)
            dataset.read_direct(value)
            return value
        with np.errstate(all="ignore"):
            return np.asarray(dataset[()], dtype=np.float32)
    except _H5_ERRORS as e:
        raise ModelFileError(f"{where}: cannot read {what} ({type(e).__name__}: {str(e)[:200]})") from e


def _get(group, path: str, where: str, kind: str):
    """The object at ``path`` below ``group`` (a Group or Dataset by ``kind``), following hard
    links only (a soft link can loop, an external link opens another file): None where a
    component is missing, ModelFileError where the path is not what the layout says."""
    h5py = _h5py()
    node = group
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ModelFileError(f"{where}: empty object path {path!r} in {group.name}")
    for part in parts:
        if not isinstance(node, h5py.Group):
            raise ModelFileError(f"{where}: {node.name} is a {type(node).__name__}, expected a group")
        name = part.encode("utf-8", "surrogateescape")
        links = node.id.links
        if not links.exists(name):
            return None
        link_type = links.get_info(name).type
        if link_type != h5py.h5l.TYPE_HARD:
            kind_name = {h5py.h5l.TYPE_SOFT: "SoftLink", h5py.h5l.TYPE_EXTERNAL: "ExternalLink"}.get(
                link_type, f"link of type {link_type}")
            raise ModelFileError(f"{where}: {node.name}/{part} is a {kind_name}; Keras files use "
                                 "hard links only")
        node = node[part]
    expected = h5py.Dataset if kind == "dataset" else h5py.Group
    if not isinstance(node, expected):
        raise ModelFileError(f"{where}: {node.name} is a {type(node).__name__}, expected a {kind}")
    return node


def _names_attr(obj, key: str, where: str) -> list[str]:
    """A list-of-names attribute (``weight_names``, ``layer_names``) checked before it is read:
    a string array of rank 0 or 1 (an empty numeric array counts as no names) and at most
    ``_MAX_NAMES`` entries; each name valid UTF-8."""
    h5py = _h5py()
    if key not in obj.attrs:
        return []
    attr = h5py.h5a.open(obj.id, key.encode())
    shape, dtype = attr.shape, attr.dtype
    size = int(np.prod(shape)) if shape else (0 if shape is None else 1)
    if shape is None or size == 0:
        return []
    if len(shape) > 1 or size > _MAX_NAMES:
        raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} has shape {shape}; "
                             "expected a list of names")
    if dtype.kind not in "SO" or (dtype.kind == "O" and h5py.check_string_dtype(dtype) is None):
        raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} has dtype {dtype}; "
                             "expected strings")
    value = obj.attrs[key]
    names = []
    for item in np.atleast_1d(value).tolist():
        try:
            names.append(item.decode("utf-8") if isinstance(item, bytes) else
                         item.encode("utf-8", "surrogateescape").decode("utf-8"))
        except UnicodeError:
            raise ModelFileError(f"{where}: attribute {key!r} of {obj.name} holds a name that is "
                                 "not UTF-8") from None
    return names


def _text_attr(obj, key: str, where: str) -> str:
    """A string attribute (the model config) checked before it is read: one string value."""
    h5py = _h5py()
    attr = h5py.h5a.open(obj.id, key.encode())
    shape, dtype = attr.shape, attr.dtype
    if shape is None or (shape and int(np.prod(shape)) != 1) or dtype.kind not in "SO" or (
            dtype.kind == "O" and h5py.check_string_dtype(dtype) is None):
        raise ModelFileError(f"{where}: attribute {key!r} has shape {shape} and dtype {dtype}; "
                             "expected one string")
    value = obj.attrs[key]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0]
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape")


#: Where a layer's variables live in the Keras 3 weights file, in Keras's ``get_weights`` order:
#: layers with sublayers save them in child groups named after the attribute.
_VAR_GROUPS = {
    "SimpleRNN": ("vars", "cell/vars"), "LSTM": ("vars", "cell/vars"), "GRU": ("vars", "cell/vars"),
    "Bidirectional": ("vars", "forward_layer/vars", "forward_layer/cell/vars",
                      "backward_layer/vars", "backward_layer/cell/vars"),
    "MultiHeadAttention": ("vars", "query_dense/vars", "key_dense/vars", "value_dense/vars",
                           "output_dense/vars"),
}


def _count_error(layer_name: str, class_name: str, expected: int, found: int, where: str):
    return ModelFileError(f"{where}: layer {layer_name!r} ({class_name}) expects {expected} "
                          f"weights, the file has {found}")


def _read_vars(group, layer_name: str, class_name: str, where: str, expected: int) -> list:
    """The datasets of a layer's variables, in Keras's order (see ``_VAR_GROUPS``); their count
    is checked against ``expected`` before any is opened."""
    groups = [g for g in (_get(group, path, where, "group")
                          for path in _VAR_GROUPS.get(class_name, ("vars",))) if g is not None]
    total = sum(len(g) for g in groups)
    if total != expected:
        raise _count_error(layer_name, class_name, expected, total, where)
    datasets = []
    for vars_ in groups:
        for i in range(len(vars_)):
            ds = _get(vars_, str(i), where, "dataset")
            if ds is None:
                raise ModelFileError(f"{where}: {vars_.name} has no dataset {str(i)!r}")
            datasets.append(ds)
    return datasets


def _assign_keras3(model, group, where, visited, raw=None) -> None:
    """Weights of the Keras 3 layout: ``layers/<snake_case class>[_n]/vars/<i>``, nested models
    under their own ``layers`` group (keras.src.saving.saving_lib container naming)."""
    from ..layers.base import snake_case
    from ..model.graph import InputLayer, Model

    used: dict[str, int] = {}
    layers_group = _get(group, "layers", where, "group")
    for layer in model.layers:
        base = snake_case(type(layer).__name__) if not isinstance(layer, Model) else (
            "sequential" if type(layer).__name__ == "Sequential" else "functional")
        n = used.get(base)
        used[base] = 0 if n is None else n + 1
        key = base if n is None else f"{base}_{n + 1}"
        if id(layer) in visited or isinstance(layer, InputLayer):
            continue
        visited.add(id(layer))
        sub = _get(layers_group, key, where, "group") if layers_group is not None else None
        if sub is None:
            if layer.weight_names or isinstance(layer, Model):
                raise ModelFileError(f"{where}: no weights group 'layers/{key}' for layer {layer.name!r}")
            continue
        if isinstance(layer, Model):
            _assign_keras3(layer, sub, where, visited, raw)
        elif layer.weight_names:
            _assign(layer, _read_vars(sub, layer.name, type(layer).__name__, where,
                                      len(layer.weight_names)), where, raw)


def _datasets(group, names, where) -> list:
    out = []
    for n in names:
        ds = _get(group, n, where, "dataset")
        if ds is None:
            raise ModelFileError(f"{where}: {group.name} has no dataset {n!r} (listed in its "
                                 "weight_names)")
        out.append(ds)
    return out


def _assign_legacy(model, group, where, visited, raw=None) -> None:
    """Weights of the legacy HDF5 layout: ``<layer name>`` groups with a ``weight_names`` attribute."""
    from ..model.graph import Model

    for layer in model.layers:
        if id(layer) in visited:
            continue
        visited.add(id(layer))
        if isinstance(layer, Model):
            sub = _get(group, layer.name, where, "group")
            if sub is None:
                raise ModelFileError(f"{where}: no weights for nested model {layer.name!r}")
            _assign_legacy_nested(layer, sub, where, visited, raw)
            continue
        if not layer.weight_names:
            continue
        sub = _get(group, layer.name, where, "group")
        if sub is None:
            raise ModelFileError(f"{where}: no weights group for layer {layer.name!r}")
        names = _names_attr(sub, "weight_names", where)
        if len(names) != len(layer.weight_names):
            raise _count_error(layer.name, type(layer).__name__, len(layer.weight_names),
                               len(names), where)
        _assign(layer, _datasets(sub, names, where), where, raw)


def _assign_legacy_nested(model, group, where, visited, raw=None) -> None:
    """A nested model's weights in the legacy layout: paths ``<model>/<layer>/<weight>``."""
    names = _names_attr(group, "weight_names", where)
    by_layer: dict[str, list] = {}
    for n in names:
        parts = [p for p in n.split("/") if p]
        if len(parts) < 2:
            raise ModelFileError(f"{where}: weight name {n!r} of nested model {model.name!r} is not "
                                 "a <layer>/<weight> path")
        by_layer.setdefault(parts[-2], []).append(n)
    for layer in model.layers:
        if id(layer) in visited or not layer.weight_names:
            continue
        visited.add(id(layer))
        listed = by_layer.get(layer.name, [])
        if len(listed) != len(layer.weight_names):
            raise _count_error(layer.name, type(layer).__name__, len(layer.weight_names),
                               len(listed), where)
        _assign(layer, _datasets(group, listed, where), where, raw)


def _check_weights_fit(model, where: str, available: int) -> None:
    """Refuse, before reading, a model whose weights need more elements than ``available`` (the
    HDF5 image's bytes, times the compression ratio limit for chunked datasets)."""
    from ..model.graph import weight_elements

    needed = weight_elements(model)
    if needed > available:
        raise ModelFileError(f"{where}: the architecture needs {needed:,} weight elements, more "
                             f"than the {available:,} the file can hold")


# ---------------------------------------------------------------------------------- HDF5 layer
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_global_heaps(buf, start: int, end: int, where: str) -> None:
    """Walk every global heap collection (``GCOL``: variable-length strings such as the model
    config and the ``weight_names`` lists) in ``buf[start:end]`` as HDF5 will, before HDF5 does:
    a free-space object of size 0, or an object running past its collection, makes HDF5's
    reader loop forever (H5HG__cache_heap_deserialize, through HDF5 2.0: a hang inside
    ``fastlayers.load`` that no timeout in the process can stop), so such a file is refused.

    The scan finds the collections by their signature anywhere in the image (HDF5 keeps no list
    of them); a weight whose bytes happen to read ``GCOL`` followed by a plausible header and an
    impossible object list would refuse a valid file, at odds under 2**-64 per position."""
    length_size = _hdf5_length_size(buf, start, end, where)
    header = 8 + length_size
    objhdr = 8 + length_size
    fmt = {2: "<H", 4: "<I", 8: "<Q"}[length_size]
    at = buf.find(b"GCOL", start, end)
    while at != -1:
        if at + header <= end and buf[at + 4] == 1 and buf[at + 5:at + 8] == b"\x00\x00\x00":
            (size,) = struct.unpack_from(fmt, buf, at + 8)
            stop = at + size
            if at + header < stop <= end:   # HDF5 refuses collections past the end of the file
                p = at + header
                while p < stop:
                    if p + objhdr > stop:
                        break   # the tail: free space HDF5 skips to the end
                    index = struct.unpack_from("<H", buf, p)[0]
                    (osize,) = struct.unpack_from(fmt, buf, p + 8)
                    need = objhdr + ((osize + 7) & ~7) if index > 0 else osize
                    if need <= 0 or need > stop - p:
                        raise ModelFileError(
                            f"{where}: corrupt HDF5 global heap at byte {at:,} (object {index} "
                            f"of size {osize:,} at byte {p:,}); HDF5 would never finish reading it")
                    p += need
        at = buf.find(b"GCOL", at + 1, end)


def _hdf5_length_size(buf, start: int, end: int, where: str) -> int:
    """The superblock's 'size of lengths' (8 in every file h5py writes)."""
    base = start
    while base + 16 <= end and buf[base:base + 8] != _HDF5_SIGNATURE:
        base = start + max(512, 2 * (base - start))   # a user block: 512, 1024, 2048, ...
    if base + 16 > end:
        raise ModelFileError(f"{where}: not a readable HDF5 file (no superblock)")
    version = buf[base + 8]
    size = buf[base + 14] if version in (0, 1) else buf[base + 10]
    return size if size in (2, 4, 8) else 8


def _scan_file(fobj, start: int, size: int, where: str) -> None:
    """``_check_global_heaps`` over ``size`` bytes at ``start`` of an open file or buffer."""
    if size <= 0:
        raise ModelFileError(f"{where}: not a readable HDF5 file (empty)")
    if isinstance(fobj, io.BytesIO):   # getvalue shares the bytes the buffer was made from
        data = fobj.getvalue()
        return _check_global_heaps_safe(data, start, min(start + size, len(data)), where)
    try:
        mapped = mmap.mmap(fobj.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, io.UnsupportedOperation):
        fobj.seek(start)
        return _check_global_heaps_safe(fobj.read(size), 0, size, where)
    with mapped:
        _check_global_heaps_safe(mapped, start, min(start + size, len(mapped)), where)


def _check_global_heaps_safe(buf, start, end, where) -> None:
    try:
        _check_global_heaps(buf, start, end, where)
    except (struct.error, IndexError):
        raise ModelFileError(f"{where}: corrupt HDF5 global heap (truncated)") from None


# --------------------------------------------------------------------------------- entry points
def _open_h5(source, where):
    h5py = _h5py()
    try:
        return h5py.File(source, "r")
    except _H5_ERRORS as e:
        raise ModelFileError(f"{where}: not a readable HDF5 file ({type(e).__name__}: "
                             f"{str(e)[:200]})") from e


def _weights_stage(where: str, fn, *args):
    """``fn(*args)`` (a step that reads the HDF5 file), h5py's errors on a corrupt file (missing
    objects, bad addresses, heaps) turned into ModelFileError naming the file."""
    try:
        return fn(*args)
    except FastlayersError:
        raise
    except _H5_ERRORS as e:
        raise ModelFileError(f"{where}: corrupt weights ({type(e).__name__}: {str(e)[:200]})") from e
    except MemoryError as e:
        raise ModelFileError(f"{where}: the weights cannot be allocated ({e})") from e


def load_keras(source):
    """Load a Keras 3 ``.keras`` archive (a path or a seekable binary file object), or its
    unzipped directory, as a fastlayers model."""
    where = str(source)
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        path = Path(source)
        config = path / "config.json"
        weights = path / "model.weights.h5"
        try:
            limit = settings.current().max_config_bytes
            if config.stat().st_size > limit:
                limits.parse_json(b" " * (limit + 1), where, "config.json")
            entry = limits.parse_json(config.read_bytes(), where, "config.json")
            fobj = open(weights, "rb")
        except FileNotFoundError as e:
            raise ModelFileError(f"{where}: the directory has no {Path(e.filename).name}") from None
        except OSError as e:
            raise ModelFileError(f"{where}: cannot read the archive directory ({e})") from None
        with fobj, _open_h5(fobj, where) as f:
            raw = _RawFile(fobj)
            return _model_with_weights(entry, f, where, raw, raw.size)
    opened = limits.open_file(source, where)
    fobj = opened or source
    try:
        try:
            z = limits.open_zip(fobj, where)
        except ModelFileError as e:
            raise ModelFileError(str(e).replace("not a readable zip archive",
                                                "not a readable .keras archive")) from None
        with z:
            info = limits.get_member(z, "config.json", where)
            limit = settings.current().max_config_bytes
            entry = limits.parse_json(limits.read_member(z, info, where, limit),
                                      where, "config.json")
            info = limits.get_member(z, "model.weights.h5", where)
            if info.compress_type != zipfile.ZIP_STORED:
                data = limits.read_member(z, info, where, info.file_size)
                member = io.BytesIO(data)
                with _open_h5(member, where) as f:
                    return _model_with_weights(entry, f, where, _RawFile(member), len(data))
            # h5py reads the metadata through the member; the weight bytes of a stored
            # (uncompressed) member are read straight from the archive at their offset, after
            # the member's CRC-32 is checked (the bytes bypass zipfile)
            size = limits._source_size(z)
            start = limits.member_data_offset(fobj, info, where, size)
            limits.check_crc(fobj, start, info.compress_size, info.CRC, where,
                             "zip member 'model.weights.h5'")
            member = _Region(fobj, start, info.file_size)
            with _open_h5(member, where) as f:
                return _model_with_weights(entry, f, where, _RawFile(fobj, start, info.file_size),
                                           info.file_size)
    finally:
        if opened is not None:
            opened.close()


class _Region(io.RawIOBase):
    """A read-only, seekable window ``[start, start + size)`` of an open binary file (a stored zip
    member), so h5py reads the member in place; zipfile's own member objects re-read and
    checksum everything before each forward seek."""

    def __init__(self, fobj, start: int, size: int):
        super().__init__()
        self._f, self._start, self._size, self._pos = fobj, start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer):
        n = max(0, min(len(buffer), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buffer)[:n])
        self._pos += got
        return got


def _model_with_weights(entry, h5file, where, raw, h5_bytes: int):
    """Build the model of ``entry`` (checked first) and read its weights from ``h5file`` (an
    image of ``h5_bytes`` bytes)."""
    from ..layers.base import weights_loaded_later  # the layers are imported at the first load

    check_config(entry, where)   # parse_json checked the nesting
    with weights_loaded_later(), np.errstate(all="ignore"):
        model = build_model(entry, where, h5_bytes, _checked=True)
    limits.check_graph(model, where)
    _check_weights_fit(model, where, h5_bytes * settings.current().max_compression_ratio)
    _weights_stage(where, _assign_keras3, model, h5file, where, set(), raw)
    return model


def load_keras_h5(source):
    """Load a legacy full-model HDF5 file (Keras 3 or tf.keras 2.x ``model.save("x.h5")``) from a
    path or a seekable binary file object."""
    from ..layers.base import weights_loaded_later  # the layers are imported at the first load

    where = str(source)
    with _h5_source(source, where) as (fobj, size):
        _scan_file(fobj, 0, size, where)
        with _open_h5(fobj, where) as f:
            def read_config():
                if "model_config" not in f.attrs:
                    raise ModelFileError(f"{where}: HDF5 file without a model_config attribute (a "
                                         "weights file? use model.load_weights)")
                return _text_attr(f, "model_config", where)

            entry = limits.parse_json(_weights_stage(where, read_config), where,
                                      "the model_config attribute")
            check_config(entry, where)
            with weights_loaded_later(), np.errstate(all="ignore"):
                model = build_model(entry, where, size, _checked=True)
            limits.check_graph(model, where)
            _check_weights_fit(model, where, size * settings.current().max_compression_ratio)

            def assign():
                group = _get(f, "model_weights", where, "group")
                if group is None:
                    raise ModelFileError(f"{where}: no model_weights group")
                _assign_legacy(model, group, where, set(), _RawFile(fobj))

            _weights_stage(where, assign)
    return model


class _h5_source:
    """An open binary file for a path (or the given file object, left open) and its size."""

    def __init__(self, source, where):
        self.source, self.where, self.opened = source, where, None

    def __enter__(self):
        fobj = self.source
        if isinstance(self.source, (str, os.PathLike)):
            try:
                fobj = self.opened = open(self.source, "rb")
            except FileNotFoundError:
                raise ModelFileError(f"{self.where}: no such file") from None
            except OSError as e:
                raise ModelFileError(f"{self.where}: cannot open the file ({e.strerror or e})") from None
        fobj.seek(0, io.SEEK_END)
        size = fobj.tell()
        fobj.seek(0)
        return fobj, size

    def __exit__(self, *exc):
        if self.opened is not None:
            self.opened.close()


def load_weights(model, path) -> None:
    """Load Keras weights (``.weights.h5`` Keras 3 layout, or a legacy ``.h5``) into ``model``."""
    where = str(path)
    with _h5_source(path, where) as (fobj, size):
        _scan_file(fobj, 0, size, where)
        with _open_h5(fobj, where) as f:
            raw = _RawFile(fobj)

            def assign():
                if "layers" in f or "vars" in f:
                    _assign_keras3(model, f, where, set(), raw)
                elif "model_weights" in f:
                    _assign_legacy(model, _get(f, "model_weights", where, "group"), where, set(), raw)
                elif "layer_names" in f.attrs:
                    _assign_legacy(model, f, where, set(), raw)
                else:
                    raise ModelFileError(f"{where}: no Keras weights found (expected a 'layers' "
                                         "group or 'layer_names' attribute)")

            _weights_stage(where, assign)
