"""Settings: the options a model is loaded and run with, and the environment variables that set
their process-wide defaults.

``LoadOptions`` holds every loader limit and load-time choice; ``fastlayers.load(path,
options=LoadOptions(...))`` applies one set to one model, so a service can load a trusted large
model and an untrusted upload side by side with different limits. A field left out takes the
process-wide default, which its environment variable (``FASTLAYERS_...``, read once, at import)
sets; ``SETTINGS`` lists them all, and ``ENVIRONMENT`` the variables that configure the process
itself (ISA path, heap). Every variable goes through one parser (``env_int``, ``env_choice``),
which rejects a bad value with ``SettingError`` naming the variable.

The options in force for the running code are ``current()``: those of the load or the model
call under way in this thread's context (``applied``), else the process defaults.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from typing import Any

from .errors import SettingError


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of ``LoadOptions``: its environment variable, default and meaning."""

    name: str
    env: str | None
    default: Any
    doc: str


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """The integer the environment variable ``name`` holds (decimal, ``0x`` hex, ``_``
    separators), ``default`` where it is unset or blank.

    Raises
    ------
    SettingError
        The value is not an integer, or is under ``minimum``.
    """
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        parsed = int(value.strip().replace("_", ""), 0)
    except ValueError:
        raise SettingError(f"environment variable {name}={value!r} is not an integer") from None
    if parsed < minimum:
        raise SettingError(f"environment variable {name}={value!r} must be at least {minimum}")
    return parsed


def env_choice(name: str, choices, default: str) -> str:
    """The value of the environment variable ``name``, lower-cased, one of ``choices``;
    ``default`` where it is unset or blank.

    Raises
    ------
    SettingError
        The value is none of ``choices``.
    """
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in choices:
        raise SettingError(
            f"environment variable {name}={value!r}: expected one of {', '.join(repr(c) for c in choices)}"
        )
    return value


#: Every field of LoadOptions: name, environment variable, default, meaning (the user guide's
#: settings page is generated from the same facts: tests/test_settings.py checks it lists each).
SETTINGS = (
    # readers of every format
    Setting(
        "max_config_bytes",
        "FASTLAYERS_MAX_CONFIG_BYTES",
        32 << 20,
        "Largest JSON text read from a file (a .keras config.json, an .h5 model_config, the "
        "native header, a safetensors header), in bytes, checked before it is read or "
        "decompressed.",
    ),
    Setting(
        "max_json_depth",
        "FASTLAYERS_MAX_JSON_DEPTH",
        200,
        "Deepest nesting of lists and objects accepted in that JSON.",
    ),
    Setting(
        "max_layers",
        "FASTLAYERS_MAX_LAYERS",
        100_000,
        "Most layers (nested models' included) and layer calls one model config may describe.",
    ),
    Setting(
        "max_compression_ratio",
        "FASTLAYERS_MAX_COMPRESSION_RATIO",
        200,
        "Largest ratio of a compressed zip member's declared size to its compressed size.",
    ),
    Setting(
        "max_positions",
        "FASTLAYERS_MAX_POSITIONS",
        1 << 20,
        "Largest position table a PositionalEncoding layer may ask for (computed at load, "
        "held by no weight in the file).",
    ),
    # torch files
    Setting(
        "torch_max_pickle_nodes",
        "FASTLAYERS_TORCH_MAX_PICKLE_NODES",
        10_000_000,
        "Most objects a torch pickle may build, each counted once per place it is used.",
    ),
    Setting(
        "torch_max_pickle_depth",
        "FASTLAYERS_TORCH_MAX_PICKLE_DEPTH",
        1000,
        "Deepest nesting of objects in a torch pickle.",
    ),
    Setting(
        "torch_max_modules",
        "FASTLAYERS_TORCH_MAX_MODULES",
        10_000,
        "Most modules in a pickled torch module tree (a shared module counted once per parent).",
    ),
    Setting(
        "torch_max_module_depth",
        "FASTLAYERS_TORCH_MAX_MODULE_DEPTH",
        100,
        "Deepest nesting of modules in a pickled torch module tree.",
    ),
    Setting(
        "torch_max_index_bytes",
        "FASTLAYERS_TORCH_MAX_INDEX_BYTES",
        256 << 20,
        "Largest sharded-checkpoint index (model.safetensors.index.json), in bytes.",
    ),
    Setting(
        "torch_max_shards", "FASTLAYERS_TORCH_MAX_SHARDS", 100_000, "Most shards one sharded-checkpoint index may name."
    ),
    Setting(
        "torch_max_geometry",
        "FASTLAYERS_TORCH_MAX_GEOMETRY",
        4096,
        "Largest stride, dilation, pooling window, adaptive or resize output size of a pickled torch module.",
    ),
    # ONNX graphs
    Setting(
        "onnx_max_fold_bytes",
        "FASTLAYERS_ONNX_MAX_FOLD_BYTES",
        64 << 20,
        "Constant folding at load may make constants of at most max(this, twice the bytes of "
        "the graph's initializers).",
    ),
    Setting(
        "onnx_max_created_bytes",
        "FASTLAYERS_ONNX_MAX_CREATED_BYTES",
        1 << 31,
        "Most bytes one tensor may take where the graph's values, not the size of the "
        "inputs, set its size (ConstantOfShape, Expand, Tile, Range, Resize, Pad, ...), at "
        "load and at each call.",
    ),
    Setting(
        "onnx_max_loop_iterations",
        "FASTLAYERS_ONNX_MAX_LOOP_ITERATIONS",
        1 << 16,
        "Most iterations of a Loop whose trip count the file sets (a loop bounded by the "
        "inputs runs as long as they say).",
    ),
    # load-time choices and run settings
    Setting(
        "warm_up",
        None,
        True,
        "Run the model once on zeros of its declared input shapes before load returns it, "
        "so that the first real call finds its weights packed and its threads started.",
    ),
    Setting(
        "optimize",
        None,
        True,
        "Rewrite an ONNX graph at load into fused steps (convolutions with their "
        "activations, dense layers, normalizations, attention, recurrent cells). False runs "
        "the operators as the file writes them, after constant folding: slower, for "
        "checking a fusion against the plain operators.",
    ),
    Setting(
        "native_plans",
        None,
        True,
        "Run an ONNX model's calls as native plans, built once per set of input shapes: its "
        "kernels in one native call, the nodes with no native form in Python inside it. False "
        "runs every call through the Python plan.",
    ),
    Setting(
        "threads",
        None,
        None,
        "Threads each call of the model uses (None: the process's count, "
        "fastlayers.set_num_threads), as onnxruntime's intra_op_num_threads.",
    ),
)

#: Environment variables that configure the process rather than a model (read at import):
#: name -> meaning.
ENVIRONMENT = {
    "FASTLAYERS_ISA": "Kernel path: 'avx512', 'avx2' or 'generic' (default: the best this CPU runs).",
    "FASTLAYERS_HEAP": "'retain' (default): keep freed blocks mapped between calls (glibc "
    "mallopt and the native arena); 'system': the C library's defaults.",
    "FASTLAYERS_IDLE_SPIN_US": "Microseconds idle thread-pool workers poll for the next call "
    "before they sleep (default 200; up to 1000000): fastlayers.set_idle_spin.",
    "FASTLAYERS_CUDA_CACHING_ALLOCATOR": "'1' (default): numba-cuda allocations through a "
    "caching pool; '0': numba's own allocator.",
    "FASTLAYERS_DEBUG": "'1': the command line prints a traceback with its one-line error.",
}


def _defaults() -> dict:
    values = {}
    for s in SETTINGS:
        values[s.name] = s.default if s.env is None else env_int(s.env, s.default)
    return values


_DEFAULTS = _defaults()


def _field(name: str):
    return dataclasses.field(default=_DEFAULTS[name])


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """The limits a model file is read within, and the load-time and run choices of one model.

    Every field defaults to the process-wide value: its environment variable where set when
    fastlayers was imported, else the built-in default (``fastlayers.settings.SETTINGS`` lists
    each with its variable and meaning). Limits are positive integers; a file over one raises
    ``ModelFileError`` naming the file, the limit and its variable.

    Parameters
    ----------
    max_config_bytes, max_json_depth, max_layers, max_compression_ratio, max_positions : int
        Limits of every reader (JSON configs, zip members, layer configs).
    torch_max_pickle_nodes, torch_max_pickle_depth, torch_max_modules, torch_max_module_depth : int
        Limits of the torch pickle reader.
    torch_max_index_bytes, torch_max_shards, torch_max_geometry : int
        Limits of sharded checkpoints and pickled module configs.
    onnx_max_fold_bytes, onnx_max_created_bytes, onnx_max_loop_iterations : int
        Limits of ONNX graphs: constant folding at load, tensors sized by the graph's values,
        loop trip counts set by the file.
    warm_up : bool
        Run the model once on zeros before ``load`` returns it.
    optimize : bool
        Fuse an ONNX graph's operators at load (True); False runs them as the file writes
        them, to check a fusion against the plain operators.
    native_plans : bool
        Run an ONNX model's calls as native plans (True); False runs them through the
        Python plan.
    threads : int or None
        Threads each call of the model uses; None: the process's count.

    Raises
    ------
    SettingError
        A field of the wrong type or out of range.

    Examples
    --------
    >>> options = fastlayers.LoadOptions(max_layers=1_000, threads=1)
    >>> model = fastlayers.load("upload.onnx", options=options)
    """

    max_config_bytes: int = _field("max_config_bytes")
    max_json_depth: int = _field("max_json_depth")
    max_layers: int = _field("max_layers")
    max_compression_ratio: int = _field("max_compression_ratio")
    max_positions: int = _field("max_positions")
    torch_max_pickle_nodes: int = _field("torch_max_pickle_nodes")
    torch_max_pickle_depth: int = _field("torch_max_pickle_depth")
    torch_max_modules: int = _field("torch_max_modules")
    torch_max_module_depth: int = _field("torch_max_module_depth")
    torch_max_index_bytes: int = _field("torch_max_index_bytes")
    torch_max_shards: int = _field("torch_max_shards")
    torch_max_geometry: int = _field("torch_max_geometry")
    onnx_max_fold_bytes: int = _field("onnx_max_fold_bytes")
    onnx_max_created_bytes: int = _field("onnx_max_created_bytes")
    onnx_max_loop_iterations: int = _field("onnx_max_loop_iterations")
    warm_up: bool = _field("warm_up")
    optimize: bool = _field("optimize")
    native_plans: bool = _field("native_plans")
    threads: int | None = _field("threads")

    def __post_init__(self):
        for s in SETTINGS:
            value = getattr(self, s.name)
            if s.name in ("warm_up", "optimize", "native_plans"):
                if not isinstance(value, bool):
                    raise SettingError(f"LoadOptions.{s.name} must be True or False, got {value!r}")
            elif s.name == "threads":
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256
                ):
                    raise SettingError(f"LoadOptions.threads must be None or an integer from 1 to 256, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SettingError(f"LoadOptions.{s.name} must be a positive integer, got {value!r}")
        # hashed once: a native plan's key holds the options in force at each call
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, s.name) for s in SETTINGS)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def replace(self, **changes) -> LoadOptions:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


#: The process-wide defaults (environment variables read at import).
DEFAULT = LoadOptions()

_current: contextvars.ContextVar = contextvars.ContextVar("fastlayers_options", default=DEFAULT)


def current() -> LoadOptions:
    """The options in force in this thread's context: those of the load or model call under
    way (``applied``), else the process defaults."""
    return _current.get()


@contextlib.contextmanager
def applied(options: LoadOptions | None):
    """Make ``options`` the ones in force (``current()``) for the block, in this thread's
    context; None leaves those in force.

    Raises
    ------
    SettingError
        ``options`` is not a LoadOptions.
    """
    if options is None:
        yield current()
        return
    if not isinstance(options, LoadOptions):
        raise SettingError(f"options must be a fastlayers.LoadOptions, got {type(options).__name__}")
    token = _current.set(options)
    try:
        yield options
    finally:
        _current.reset(token)
