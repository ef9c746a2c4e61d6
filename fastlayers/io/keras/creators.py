"""Keras layer configs -> fastlayers layers: one creator per Keras class, in one table
(``keras_layers``), and ``build_layer``, which reads a config through its class's creator.

A creator (``KerasLayer``) names the fastlayers class, the config keys it reads (by default the
class constructor's arguments, so nothing restates a signature) and the class's own steps: a
check of the raw config, an adaptation of the keyword arguments, whether the config's dtype is a
float policy, and where the class's variables lie in a Keras 3 weights file. Everything else
(ignored training keys, options left off, activations, dtype policies, the limits of
``fastlayers.limits``) is the same for every class, here in ``build_layer``. Users add their own classes
with ``register_keras_layer``.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ... import limits
from ...errors import FastlayersError, InputError, ModelFileError, UnsupportedError

#: Config keys that only matter for training or for Keras internals: ignored.
_IGNORED = re.compile(
    r"^(name|trainable|dtype|build_config|registered_name|module|seed|"
    r"activity_regularizer|noise_shape|autocast|quantization_config|"
    r"input_length|synchronized|optional|sparse|ragged|momentum|renorm_momentum)$"
    r"|_(initializer|regularizer|constraint)$"
)
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
            isinstance(module, str) and module.startswith("keras")
        ):
            value = value.get("config")
        if isinstance(value, (dict, list)):
            raise UnsupportedError(f"{where}: activation {limits.describe(value)} is a custom object; not supported")
    return value


#: ``adapt(kwargs, config, build)`` of a creator: the keyword arguments read from the config ->
#: those the constructor takes. ``config`` is the layer's whole config; ``build(class_name,
#: config)`` builds a layer config held inside it (a wrapper's wrapped layer).
Adapt = Callable[[dict, dict, Callable[[str, dict], Any]], dict]
#: ``check(config, here)`` of a creator: raises UnsupportedError naming ``here`` for a config the
#: class cannot honour, before its options are read.
Check = Callable[[dict, str], None]


@dataclass(frozen=True)
class KerasLayer:
    """The creator of one Keras class: how its config becomes a fastlayers layer.

    ``layer_class`` is built with the config keys in ``options`` (besides ``name`` and the
    input-shape keys of every layer); ``check`` and ``adapt`` are the class's own steps (see
    ``Check`` and ``Adapt``); ``float_policy``: the config's ``dtype`` is a dtype policy
    (computed in float32), not the data type of the layer (``InputLayer``); ``weight_groups``:
    where the layer's variables lie in a Keras 3 weights file, in Keras's order, below the
    layer's group (layers with sublayers keep theirs in child groups named after the attribute).
    """

    layer_class: type
    options: frozenset[str]
    check: Check | None = None
    adapt: Adapt | None = None
    float_policy: bool = True
    weight_groups: tuple[str, ...] = ("vars",)


def constructor_options(layer_class: type) -> frozenset[str]:
    """The named arguments of ``layer_class``'s constructor, but ``dtype`` (a dtype policy in a
    Keras config, checked by ``build_layer``): the config keys its creator reads by default."""
    params = inspect.signature(layer_class.__init__).parameters.values()
    return frozenset(
        p.name for p in params if p.name not in ("self", "dtype") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


def _no_stateful_unroll(config: dict, here: str) -> None:
    """A recurrent layer's ``stateful`` (the streaming API keeps state instead) and ``unroll``."""
    if config.get("stateful"):
        raise UnsupportedError(f"{here}: option stateful=True is not supported; use the streaming API")
    if config.get("unroll"):
        raise UnsupportedError(f"{here}: option unroll=True is not supported")


def _input_layer(kwargs: dict, config: dict, build) -> dict:
    """InputLayer: the config's dtype is the input's data type; a legacy ``batch_input_shape``
    is its ``batch_shape``."""
    kwargs["dtype"] = config.get("dtype") if isinstance(config.get("dtype"), str) else None
    if "batch_shape" not in kwargs and "batch_input_shape" in kwargs:
        kwargs["batch_shape"] = kwargs.pop("batch_input_shape")
    return kwargs


def _wrapped_layers(kwargs: dict, config: dict, build) -> dict:
    """Bidirectional: the wrapped layers are Keras layer configs, built here."""
    for key in ("layer", "backward_layer"):
        sub = kwargs.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("class_name"), str) and isinstance(sub.get("config"), dict):
            kwargs[key] = build(sub["class_name"], dict(sub["config"]))
    return kwargs


_RECURRENT = {"check": _no_stateful_unroll, "weight_groups": ("vars", "cell/vars")}

#: The Keras classes fastlayers reads -> the class's own parts of its creator (``KerasLayer``'s
#: fields; none for most). Each builds the fastlayers layer class of its name
#: (``fastlayers.layers.LAYER_CLASSES``) from the config keys its constructor takes
#: (``constructor_options``). A new Keras layer is one line here.
_BUILTIN: dict[str, dict[str, Any]] = {
    "Activation": {},
    "Add": {},
    "AdditiveAttention": {},
    "Attention": {},
    "Average": {},
    "AveragePooling1D": {},
    "AveragePooling2D": {},
    "BatchNormalization": {},
    "Bidirectional": {
        "adapt": _wrapped_layers,
        "weight_groups": (
            "vars",
            "forward_layer/vars",
            "forward_layer/cell/vars",
            "backward_layer/vars",
            "backward_layer/cell/vars",
        ),
    },
    "BinaryOp": {},
    "Concatenate": {},
    "Conv1D": {},
    "Conv2D": {},
    "Conv2DTranspose": {},
    "Cropping1D": {},
    "Cropping2D": {},
    "CustomScaleLayer": {},
    "Dense": {},
    "DepthwiseConv2D": {},
    "Dropout": {},
    "ELU": {},
    "Embedding": {},
    "Flatten": {},
    "GRU": _RECURRENT,
    "GRUCell": {},
    "GlobalAveragePooling1D": {},
    "GlobalAveragePooling2D": {},
    "GlobalMaxPooling1D": {},
    "GlobalMaxPooling2D": {},
    "HardAttention": {},
    "HierarchicalSoftmax": {},
    "InceptionBlock": {},
    "InputLayer": {"adapt": _input_layer, "float_policy": False},
    "LSTM": _RECURRENT,
    "LSTMCell": {},
    "LayerNormalization": {},
    "LayerScale": {},
    "LeakyReLU": {},
    "LocalResponseNormalization": {},
    "MaxPooling1D": {},
    "MaxPooling2D": {},
    "Maximum": {},
    "Minimum": {},
    "MultiHeadAttention": {
        "weight_groups": ("vars", "query_dense/vars", "key_dense/vars", "value_dense/vars", "output_dense/vars")
    },
    "Multiply": {},
    "NiNBlock": {},
    "Normalization": {},
    "PaddingMask": {},
    "Permute": {},
    "PositionalEncoding": {},
    "PositionwiseFeedForward": {},
    "RMSNormalization": {},
    "ReLU": {},
    "RepeatVector": {},
    "Rescaling": {},
    "Reshape": {},
    "RoIPooling2D": {},
    "SelfAttention": {},
    "SeparableConv2D": {},
    "SimpleRNN": _RECURRENT,
    "SimpleRNNCell": {},
    "Softmax": {},
    "SpatialDropout1D": {},
    "SpatialDropout2D": {},
    "SpatialDropout3D": {},
    "StochasticDepth": {},
    "Subtract": {},
    "UpSampling2D": {},
    "ZeroPadding1D": {},
    "ZeroPadding2D": {},
}
#: Keras classes whose config carries Python code (bytecode), which fastlayers never runs from a
#: file: refused, and no class can be registered for them.
CODE_CLASSES = frozenset({"Lambda"})

_table: dict[str, KerasLayer] = {}
_table_lock = threading.Lock()


def keras_layers() -> dict[str, KerasLayer]:
    """Keras class name -> its creator: the built-in ones (made at the first call, which
    imports ``fastlayers.layers``) and those of ``register_keras_layer``. Read-only: register
    to change it."""
    if not _table:
        with _table_lock:
            if not _table:
                from ...layers import LAYER_CLASSES

                _table.update(
                    {
                        name: KerasLayer(LAYER_CLASSES[name], constructor_options(LAYER_CLASSES[name]), **parts)
                        for name, parts in _BUILTIN.items()
                    }
                )
    return _table


def keras_class_of(layer) -> str:
    """The Keras class a layer stands for: the one ``build_layer`` recorded for a registered
    class of another name, else the layer's class name."""
    return getattr(layer, "keras_class_name", type(layer).__name__)


def register_keras_layer(
    keras_class: str,
    layer_class: type,
    *,
    options: Iterable[str] | None = None,
    adapt: Adapt | None = None,
    weight_groups: Iterable[str] = ("vars",),
) -> None:
    """Read the Keras layer class ``keras_class`` (a custom layer, or a built-in one read
    differently) from Keras files as the fastlayers layer class ``layer_class``.

    Registered before ``fastlayers.load``, it is used by every later load in the process: the
    layer's config keys (its ``get_config``) are passed to ``layer_class``'s constructor, and its
    weights are assigned in the order of ``layer_class``'s ``add_weight`` calls, which must be
    the Keras layer's variable order. Config keys that only matter for training (initializers,
    regularizers, ``trainable``, ...) are dropped as for every layer, and any other key that is
    not an option raises ``UnsupportedError`` naming it at load, unless it is ``None`` or
    ``False`` (a feature left off).

    Parameters
    ----------
    keras_class : str
        The ``class_name`` of the layer in the Keras config: the Python class name of a layer
        registered with ``keras.saving.register_keras_serializable`` (``"MyScale"``; a legacy
        ``.h5``, which names it ``"package>MyScale"``, finds it too). Registering a built-in
        name replaces its creator.
    layer_class : type
        A subclass of ``fastlayers.layers.Layer``.
    options : iterable of str, optional
        The config keys read, each an argument of the constructor (unless ``adapt`` renames
        it); by default all of the constructor's named arguments but ``dtype``.
    adapt : callable, optional
        ``adapt(kwargs, config, build) -> kwargs``: turns the keyword arguments read from the
        config (``options`` and ``name``) into those of the constructor (renamed or converted
        values). ``config`` is the layer's whole config, ``build(class_name, config)`` builds a
        layer config found inside it (the layer a wrapper wraps).
    weight_groups : iterable of str, default ("vars",)
        Where the layer's variables lie in a Keras 3 weights file (``.keras``, ``.weights.h5``),
        in order, below the layer's group: ``("vars", "inner/vars")`` for a layer keeping a
        sublayer in its attribute ``inner``.

    Raises
    ------
    InputError
        ``keras_class`` is not a class name, or names a model class or a class carrying code
        (``Lambda``); ``layer_class`` is not a fastlayers layer class; an option is not a
        string, or (without ``adapt``) not an argument of its constructor; ``adapt`` is not
        callable; a weight group is not a path.
        The message names the Keras class.

    Examples
    --------
    A Keras layer ``MyScale(factor)`` computing ``x * factor * w`` with one weight ``w``:

    >>> class Scale(fastlayers.layers.Layer):
    ...     def __init__(self, factor=1.0, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.factor = float(factor)
    ...     def build(self, input_shape):
    ...         self.add_weight("w", (input_shape[-1],), "ones")
    ...     def call(self, x):
    ...         return self.ops.merge(x, self.w, "multiply", beta=self.factor)
    >>> fastlayers.io.register_keras_layer("MyScale", Scale)
    >>> model = fastlayers.load("model_with_my_scale.keras")
    """
    where = f"register_keras_layer({keras_class!r})"
    if not isinstance(keras_class, str) or not keras_class.isidentifier():
        raise InputError(f"{where}: the Keras class must be a class name (a Python identifier)")
    from ...layers.base import Layer
    from .config import MODEL_CLASSES

    if keras_class in MODEL_CLASSES:
        raise InputError(f"{where}: {keras_class} is a model class, which the loader reads itself")
    if keras_class in CODE_CLASSES:
        raise InputError(
            f"{where}: {keras_class} layers carry Python code, which fastlayers never "
            "executes from a file; no class can be registered for them"
        )
    if not (isinstance(layer_class, type) and issubclass(layer_class, Layer)) or layer_class is Layer:
        raise InputError(
            f"{where}: expected a subclass of fastlayers.layers.Layer, got {limits.short_repr(layer_class)}"
        )
    if adapt is not None and not callable(adapt):
        raise InputError(f"{where}: adapt must be callable, got {limits.short_repr(adapt)}")
    arguments = constructor_options(layer_class)
    if options is None:
        read = arguments
    else:
        read = frozenset([options] if isinstance(options, str) else options)
        if not all(isinstance(o, str) for o in read):
            raise InputError(f"{where}: options must be config keys (strings), got {limits.short_repr(options)}")
        unknown = sorted(read - arguments - _BASE_PARAMS - {"name"})
        if unknown and adapt is None:  # with adapt, the keys read may be renamed
            raise InputError(
                f"{where}: options {unknown} are not arguments of "
                f"{layer_class.__name__}'s constructor ({sorted(arguments)})"
            )
    groups = (weight_groups,) if isinstance(weight_groups, str) else tuple(weight_groups)
    if not groups or not all(isinstance(g, str) and g.strip("/") for g in groups):
        raise InputError(
            f"{where}: weight_groups must be group paths such as 'vars', got {limits.short_repr(weight_groups)}"
        )
    entry = KerasLayer(layer_class, read, adapt=adapt, weight_groups=groups)
    table = keras_layers()
    with _table_lock:
        table[keras_class] = entry


def build_layer(class_name: str, config: dict, where: str, weight_elements: int | None = None):
    """A fastlayers layer for the Keras layer ``class_name`` with ``config``, made by its
    creator (``keras_layers``), or UnsupportedError naming the layer and the option that
    fastlayers cannot honour. ``weight_elements`` bounds the weight sizes the config may ask for
    (``limits.check_layer_config``)."""
    name = config.get("name", "?")
    here = f"{where}: layer {name!r} ({class_name})"
    if not isinstance(name, str):
        raise ModelFileError(
            f"{where}: layer of class {class_name!r}: field 'name': expected a string, found {limits.describe(name)}"
        )
    if class_name in CODE_CLASSES:
        raise UnsupportedError(
            f"{here}: {class_name} layers carry Python code, which fastlayers "
            f"never executes from a file; rebuild the model without {class_name} "
            "layers"
        )
    table = keras_layers()
    # a legacy .h5 names a registered custom class by its registered name, "package>Class"
    keras_class = class_name if class_name in table else class_name.rpartition(">")[2]
    creator = table.get(keras_class)
    if creator is None:
        raise UnsupportedError(
            f"{here}: layer class {class_name!r} is not supported (a custom "
            "layer: register a fastlayers class for it with "
            "fastlayers.io.register_keras_layer)"
        )
    policy = _policy_name(config.get("dtype"))
    if policy is not None and creator.float_policy and (not isinstance(policy, str) or policy not in _FLOAT_POLICIES):
        raise UnsupportedError(
            f"{here}: dtype policy {limits.short_repr(policy)} is not supported "
            "(float policies are computed in float32)"
        )
    if creator.check is not None:
        creator.check(config, here)
    params = creator.options | _BASE_PARAMS | {"name"}
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
    limits.check_layer_config(kwargs, where, f"layer {name!r} ({class_name})", weight_elements)
    if creator.adapt is not None:
        kwargs = creator.adapt(
            kwargs, config, lambda sub_class, sub_config: build_layer(sub_class, sub_config, here, weight_elements)
        )
    try:
        layer = creator.layer_class(**kwargs)
    except FastlayersError as e:
        if isinstance(e, UnsupportedError):
            raise type(e)(f"{here}: {e}") from e
        raise ModelFileError(f"{here}: invalid config ({e})") from e
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{here}: invalid config ({e})") from e
    except Exception as e:  # a config from a file: any failure is the file's
        raise build_error(here, e) from e
    if type(layer).__name__ != keras_class:  # its weights lie under the Keras class's name
        layer.keras_class_name = keras_class
    return layer


def build_error(here: str, e: BaseException) -> FastlayersError:
    """A layer the config cannot build or call, as ModelFileError (its own ModelFileError or
    UnsupportedError as it is)."""
    if isinstance(e, (ModelFileError, UnsupportedError)):
        return e if here.split(": ")[0] in str(e) else type(e)(f"{here}: {e}")
    if isinstance(e, MemoryError):
        return ModelFileError(f"{here}: its weights cannot be allocated ({str(e)[:200] or 'MemoryError'})")
    text = str(e)[:300] if isinstance(e, FastlayersError) else f"{type(e).__name__}: {str(e)[:300]}"
    return ModelFileError(f"{here}: cannot be built from the file's config ({text})")
