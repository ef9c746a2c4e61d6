"""Keras layer configs -> fastlayers layers: ``build_layer`` and the options of each Keras
class (``KERAS_OPTIONS``); an option fastlayers cannot honour fails by name."""

from __future__ import annotations

import re

from ...errors import FastlayersError, ModelFileError, UnsupportedError
from .. import limits

#: Config keys that only matter for training or for Keras internals: ignored.
#: Config keys that only matter for training or for Keras internals: ignored.
_IGNORED = re.compile(r"^(name|trainable|dtype|build_config|registered_name|module|seed|"
                      r"activity_regularizer|noise_shape|autocast|quantization_config|"
                      r"input_length|synchronized|optional|sparse|ragged|momentum|renorm_momentum)$"
                      r"|_(initializer|regularizer|constraint)$")
#: dtype policies computed in float32 (weights are cast on load).
_FLOAT_POLICIES = {"float32", "float16", "bfloat16", "float64", "mixed_float16", "mixed_bfloat16"}

#: Arguments every fastlayers layer takes (Keras's legacy input-shape arguments).
_BASE_PARAMS = {"input_shape", "batch_size", "batch_input_shape", "input_dim"}


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
    from ...layers import LAYER_CLASSES

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
        raise build_error(here, e) from e


def build_error(here: str, e: BaseException) -> FastlayersError:
    """A layer the config cannot build or call, as ModelFileError (its own ModelFileError or
    UnsupportedError as it is)."""
    if isinstance(e, (ModelFileError, UnsupportedError)):
        return e if here.split(": ")[0] in str(e) else type(e)(f"{here}: {e}")
    if isinstance(e, MemoryError):
        return ModelFileError(f"{here}: its weights cannot be allocated ({str(e)[:200] or 'MemoryError'})")
    text = str(e)[:300] if isinstance(e, FastlayersError) else f"{type(e).__name__}: {str(e)[:300]}"
    return ModelFileError(f"{here}: cannot be built from the file's config ({text})")
