"""Timing a loaded model as its users run it: latency percentiles and throughput over a time
budget, at several batch sizes and thread counts, optionally beside onnxruntime on the same
file (``fastlayers bench`` and the pytest plugin ``fastlayers.pytest_plugin`` use it).

Method, per configuration (a thread count and a batch size):

1. the inputs: the arrays given, or random values of each input's declared shape and dtype
   (``make_inputs``: floats standard normal, integers from 0 to ``INT_HIGH`` - 1, booleans
   fair coins; a dimension the model leaves free takes the batch size where it leads, else
   the size given in ``shapes``);
2. with ``against="onnxruntime"``: one onnxruntime CPU session per thread count
   (``intra_op_num_threads`` = the count, ``inter_op_num_threads`` = 1); both engines run once
   and their outputs must agree (``compare_outputs``), else nothing is timed
   (``MismatchError`` naming the output and the largest difference);
3. a warm-up of ``warmup_s`` seconds (at least ``WARMUP_CALLS`` calls of each engine), then
   calls timed one by one until ``seconds`` have passed per engine (at least ``MIN_CALLS``
   each); two engines take turns call by call, so that both see the same state of the host;
4. per engine: calls, mean, p50, p90, p99 and min milliseconds, and items per second (the batch
   over the mean time); fastlayers' p50 over onnxruntime's is the ratio.

Examples
--------
>>> model = fastlayers.load("model.onnx")
>>> report = run_benchmark(model, path="model.onnx", threads=[1, 2], batch_sizes=[1, 8],
...                        seconds=1.0, against="onnxruntime")
>>> print(report.table())
>>> report.write_json("bench.json")
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .backends import using_threads
from .errors import InputError, MismatchError, ShapeError, UnsupportedError
from .version import __version__

#: The engine ``against`` may name.
ONNXRUNTIME = "onnxruntime"
#: Relative tolerance of the output check (``compare_outputs``).
RTOL = 1e-4
#: Timed seconds per engine and configuration when none are given.
DEFAULT_SECONDS = 2.0
#: Fewest timed calls per engine and configuration, however long a call takes.
MIN_CALLS = 3
#: Fewest warm-up calls per engine; the warm-up lasts ``min(MAX_WARMUP_S, seconds / 4)``.
WARMUP_CALLS = 2
MAX_WARMUP_S = 0.5
#: Random integer inputs are drawn from 0 to INT_HIGH - 1 (token ids, masks, small counts).
INT_HIGH = 10
#: The ``schema`` entry of ``BenchReport.as_dict``.
SCHEMA = "fastlayers.bench/1"


# ------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class InputSpec:
    """One input of a model as it declares it.

    Attributes
    ----------
    name : str
    shape : tuple or None
        One entry per dimension: an int where the model fixes it, a string (the ONNX dim_param)
        or None where it leaves it free; None where the model declares no shape at all (a
        module from a PyTorch file).
    dtype : numpy.dtype
    """

    name: str
    shape: tuple | None
    dtype: np.dtype

    def describe(self) -> str:
        """The input in words.

        Returns
        -------
        str
            Name, dtype and declared shape, free dimensions by their name or ``?``:
            ``x float32 [N, 3, 224, 224]``.
        """
        if self.shape is None:
            dims = "shape not declared"
        else:
            dims = "[" + ", ".join(str(d) if _fixed(d) else (d if isinstance(d, str) and d else "?")
                                   for d in self.shape) + "]"
        return f"{self.name} {self.dtype} {dims}"


def _fixed(d) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0


def is_onnx(model) -> bool:
    """Whether ``model`` is an imported ONNX model.

    Parameters
    ----------
    model
        Any object.

    Returns
    -------
    bool
        True for a ``fastlayers.onnx.model.OnnxModel``.
    """
    from .onnx.model import OnnxModel

    return isinstance(model, OnnxModel)


def input_specs(model) -> list[InputSpec]:
    """The inputs ``model`` declares, in the order it takes them.

    Parameters
    ----------
    model
        What ``fastlayers.load`` returned: an ONNX model (names, dims and element types from
        the file), a Keras-style ``Model`` (its ``Input`` shapes) or a ``fastlayers.nn`` module
        (the arguments of its ``forward``, shapes not declared, float32).

    Returns
    -------
    list of InputSpec

    Raises
    ------
    UnsupportedError
        An ONNX input of a type that cannot be made up (strings).
    """
    if is_onnx(model):
        from .onnx.model import ORT_TYPES
        from .onnx.tensors import DTYPES

        dtypes = {ORT_TYPES[k]: np.dtype(t) for k, t in DTYPES.items()}
        specs = []
        for arg in model.get_inputs():
            if arg.type not in dtypes:
                raise UnsupportedError(f"ONNX model {model.name!r} input {arg.name!r}: type "
                                       f"{arg.type} cannot be benchmarked")
            specs.append(InputSpec(arg.name, tuple(arg.shape), dtypes[arg.type]))
        return specs
    if callable(getattr(model, "input_specs", None)) and getattr(model, "built", True):
        return [InputSpec(name, None if shape is None else tuple(shape), np.dtype(dtype))
                for name, (shape, dtype) in zip(model.input_names, model.input_specs())]
    forward = getattr(type(model), "forward", None)
    names = []
    if forward is not None:
        params = list(inspect.signature(forward).parameters.values())[1:]
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                 and p.default is p.empty]
    return [InputSpec(name, None, np.dtype(np.float32)) for name in (names or ["input"])]


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"x=1,3,224,224"`` -> ``("x", (1, 3, 224, 224))``; ``"x="`` is a scalar.

    Raises
    ------
    InputError
        Text not of the form ``NAME=D1,D2,...`` with positive integer dimensions.
    """
    name, sep, dims = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InputError(f"shape {text!r}: expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
    parts = [p.strip() for p in dims.split(",")] if dims.strip() else []
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(f"shape {text!r}: the dimensions must be positive integers") from None
    if any(d < 1 for d in shape):
        raise InputError(f"shape {text!r}: the dimensions must be positive integers")
    return name, shape


def _check_names(specs, names, what: str) -> None:
    unknown = [n for n in names if n not in {s.name for s in specs}]
    if unknown:
        raise InputError(f"{what}: no input named {', '.join(map(repr, unknown))}; the model's "
                         f"inputs are {[s.name for s in specs]}")


def batchable(specs: Sequence[InputSpec]) -> bool:
    """Whether a model runs at any batch size.

    Parameters
    ----------
    specs : sequence of InputSpec
        The model's inputs (``input_specs``).

    Returns
    -------
    bool
        True where the leading dimension of each non-scalar input is free (inputs without a
        declared shape count as free) and there is at least one such input.
    """
    ranked = [s for s in specs if s.shape is None or len(s.shape) > 0]
    return bool(ranked) and all(s.shape is None or not _fixed(s.shape[0]) for s in ranked)


def _shape_hint(spec: InputSpec, batch: int | None) -> str:
    if spec.shape is None:
        return f"{spec.name}=1,..."
    dims = [str(d) if _fixed(d) else (str(batch) if k == 0 and batch else
                                       f"<{d}>" if isinstance(d, str) and d else f"<dim {k}>")
            for k, d in enumerate(spec.shape)]
    return f"{spec.name}=" + ",".join(dims)


def resolve_shape(spec: InputSpec, batch: int | None = None, shape: Sequence[int] | None = None
                  ) -> tuple[int, ...]:
    """The concrete shape of input ``spec``: ``shape`` where given (checked against the declared
    rank and fixed dimensions), else the declared one; a free leading dimension takes ``batch``.

    Raises
    ------
    ShapeError
        A free dimension that neither ``batch`` nor ``shape`` sizes (naming the input and the
        dimension, with the shape to give), an input declared without a shape and not given
        one, or a ``shape`` that contradicts the declared rank or a fixed dimension.
    """
    declared = spec.shape
    if shape is not None:
        dims = [int(d) for d in shape]
        if declared is not None:
            if len(dims) != len(declared):
                raise ShapeError(f"input {spec.name!r}: the shape given, {tuple(dims)}, has "
                                 f"{len(dims)} dimensions; the model declares {len(declared)} "
                                 f"({spec.describe()})")
            for k, (d, g) in enumerate(zip(declared, dims)):
                if _fixed(d) and d != g:
                    raise ShapeError(f"input {spec.name!r}: dimension {k} is fixed at {d} by the "
                                     f"model; the shape given has {g} ({spec.describe()})")
        if batch is not None and dims and (declared is None or not _fixed(declared[0])):
            dims[0] = batch
        return tuple(dims)
    if declared is None:
        raise ShapeError(f"input {spec.name!r}: the model declares no shape for it; give one "
                         f"(--shape {spec.name}=1,... on the command line, shapes= in Python) "
                         f"or give the input's values")
    dims = []
    for k, d in enumerate(declared):
        if _fixed(d):
            dims.append(int(d))
        elif k == 0 and batch is not None:
            dims.append(batch)
        else:
            label = f"dimension {k}" + (f" ({d!r})" if isinstance(d, str) and d else "")
            raise ShapeError(f"input {spec.name!r}: {label} is not fixed by the model; give the "
                             f"input's shape (--shape {_shape_hint(spec, batch)} on the command "
                             f"line, shapes= in Python)")
    return tuple(dims)


def random_array(shape: Sequence[int], dtype, rng: np.random.Generator) -> np.ndarray:
    """Random values of one input.

    Parameters
    ----------
    shape : sequence of int
    dtype : numpy dtype
    rng : numpy.random.Generator

    Returns
    -------
    ndarray
        Floats standard normal, integers from 0 to ``INT_HIGH`` - 1, booleans fair coins.

    Raises
    ------
    UnsupportedError
        A dtype of another kind (strings, complex).
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, INT_HIGH, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise UnsupportedError(f"random inputs of dtype {dtype} cannot be made")


def make_inputs(specs: Sequence[InputSpec], batch: int | None = 1,
                shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0
                ) -> list[np.ndarray]:
    """Random inputs for a model: one array per spec, of its declared dtype and of the shape
    ``resolve_shape`` gives it (a free leading dimension: ``batch``; other free dimensions:
    ``shapes[name]``).

    Parameters
    ----------
    specs : sequence of InputSpec
        From ``input_specs(model)``.
    batch : int or None
        The size of free leading dimensions (None: from ``shapes`` only).
    shapes : mapping of str to sequence of int, optional
        Full shapes of some inputs by name (their leading entry is replaced by ``batch`` where
        the model leaves that dimension free).
    seed : int
        Seed of the random values (the same seed gives the same inputs).

    Returns
    -------
    list of ndarray
        In the order of ``specs``.

    Raises
    ------
    InputError
        ``shapes`` names no input of the model.
    ShapeError
        A dimension left free and not sized, or a shape that contradicts the declared one.
    """
    shapes = dict(shapes or {})
    _check_names(specs, shapes, "shapes")
    rng = np.random.default_rng(seed)
    return [random_array(resolve_shape(s, batch, shapes.get(s.name)), s.dtype, rng) for s in specs]


def items_of(arrays: Sequence[np.ndarray]) -> int:
    """The items of one call.

    Parameters
    ----------
    arrays : sequence of ndarray
        A call's inputs.

    Returns
    -------
    int
        The leading size of the first input that has one (1 where all are scalars).
    """
    for a in arrays:
        if np.ndim(a) > 0:
            return int(np.shape(a)[0])
    return 1


def runner(model, arrays: Sequence[np.ndarray]) -> Callable[[], list]:
    """One inference of ``model`` on ``arrays``, as a callable.

    Parameters
    ----------
    model
        What ``fastlayers.load`` returned.
    arrays : sequence of ndarray
        The inputs, in the model's order.

    Returns
    -------
    callable
        Without arguments, returning the outputs as a list: ``model.run(None, feed)`` for an
        ONNX model (as onnxruntime is called), else the model's call (one array, a list for a
        Keras-style model of several inputs, positional arguments for a ``fastlayers.nn``
        module).
    """
    arrays = list(arrays)
    if is_onnx(model):
        feed = dict(zip([s.name for s in model.get_inputs()], arrays))
        return lambda: model.run(None, feed)

    def listed(out):
        return list(out) if isinstance(out, (list, tuple)) else [out]

    if len(arrays) == 1:
        x = arrays[0]
        return lambda: listed(model(x))
    if callable(getattr(model, "input_specs", None)):
        return lambda: listed(model(arrays))
    return lambda: listed(model(*arrays))


# ----------------------------------------------------------------------------- onnxruntime
def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise UnsupportedError("comparing against onnxruntime needs the onnxruntime package "
                               "(pip install onnxruntime)") from None
    return onnxruntime


def onnxruntime_session(path, threads: int):
    """An onnxruntime CPU session on ``path`` with ``threads`` intra-op threads and one inter-op
    thread (fastlayers runs one operator at a time, on ``threads`` threads).

    Raises
    ------
    UnsupportedError
        onnxruntime is not installed, or it cannot load the file (its message, on one line).
    """
    ort = _import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
        text = " ".join(str(e).split())[:400]
        raise UnsupportedError(f"{path}: onnxruntime cannot load the file ({text})") from None


def compare_outputs(want: Sequence, got: Sequence, names: Sequence[str] | None = None,
                    rtol: float = RTOL, atol: float | None = None, where: str = "",
                    reference: str = ONNXRUNTIME) -> float:
    """Check fastlayers' outputs ``got`` against the reference's ``want``.

    Float outputs agree where ``|got - want| <= atol + rtol * |want|`` element by element (NaN
    where both are NaN), ``atol`` defaulting to ``rtol`` times the output's largest ``|want|``
    (so outputs near zero are judged at their own scale); integer and boolean outputs must be
    equal.

    Parameters
    ----------
    want, got : sequence of array_like
        The reference's outputs and fastlayers', in the same order.
    names : sequence of str, optional
        The outputs' names, for the message.
    rtol, atol : float
        Tolerances (``atol`` None: ``rtol`` x max |want| per output).
    where : str
        Said in the message (``"threads 2, batch 8"``).
    reference : str
        The reference engine's name, for the message.

    Returns
    -------
    float
        The largest absolute difference over all outputs.

    Raises
    ------
    MismatchError
        A different number of outputs, or an output of another shape, or one beyond the
        tolerance (naming it, its largest difference and where).
    """
    at = f" ({where})" if where else ""
    if len(want) != len(got):
        raise MismatchError(f"fastlayers gives {len(got)} outputs and {reference} {len(want)}{at}")
    names = list(names) if names is not None else [f"#{k}" for k in range(len(want))]
    worst = 0.0
    for name, w, g in zip(names, want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            raise MismatchError(f"output {name!r}: fastlayers gives shape {g.shape} and {reference} "
                                f"{w.shape}{at}")
        if not w.size:
            continue
        if w.dtype.kind not in "fc" and g.dtype.kind not in "fc":
            diff = np.abs(w.astype(np.float64) - g.astype(np.float64))
            biggest = float(diff.max())
            if biggest:
                raise MismatchError(f"output {name!r}: fastlayers and {reference} differ in "
                                    f"{int((diff > 0).sum())} of {w.size} values (max |difference| "
                                    f"{biggest:.3g}){at}: not timed")
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        finite = np.isfinite(w64) & np.isfinite(g64)
        same = (w64 == g64) | (np.isnan(w64) & np.isnan(g64))   # equal infinities, NaN and NaN
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite, np.abs(g64 - w64), np.where(same, 0.0, np.inf))
        scale = np.abs(w64[np.isfinite(w64)])
        tol = (rtol * float(scale.max()) if scale.size else 0.0) if atol is None else atol
        bad = ~np.where(finite, diff <= tol + rtol * np.abs(np.where(finite, w64, 0.0)), same)
        biggest = float(diff.max())
        if bad.any():
            k = int(np.argmax(np.where(bad, diff, -1.0)))
            raise MismatchError(
                f"output {name!r}: fastlayers and {reference} differ beyond rtol {rtol:g}, atol "
                f"{tol:.3g} in {int(bad.sum())} of {w.size} values (max |difference| "
                f"{float(diff.flat[k]):.3g}: {float(g64.flat[k]):.6g} against "
                f"{float(w64.flat[k]):.6g}){at}: not timed")
        worst = max(worst, biggest)
    return worst


# ---------------------------------------------------------------------------------- timing
def time_calls(fns: Mapping[str, Callable[[], object]], seconds: float,
               warmup_s: float | None = None, min_calls: int = MIN_CALLS) -> dict[str, np.ndarray]:
    """Time each engine call by call: a warm-up, then calls until ``seconds`` per engine have
    passed; several engines take turns call by call.

    Parameters
    ----------
    fns : mapping of str to callable
        Engine name -> a no-argument callable (one inference).
    seconds : float
        Timed seconds per engine (the loop stops after ``seconds`` times the number of engines).
    warmup_s : float, optional
        Untimed seconds first (default ``min(MAX_WARMUP_S, seconds / 4)``), at least
        ``WARMUP_CALLS`` calls of each engine.
    min_calls : int
        Fewest timed calls per engine.

    Returns
    -------
    dict of str to ndarray
        Engine name -> the seconds of each timed call, in order.
    """
    if not seconds > 0:
        raise InputError(f"seconds must be positive, got {seconds!r}")
    names = list(fns)
    calls = [fns[n] for n in names]
    warmup_s = min(MAX_WARMUP_S, seconds / 4) if warmup_s is None else warmup_s
    clock = time.perf_counter
    end, done = clock() + warmup_s, 0
    while done < WARMUP_CALLS or clock() < end:
        for fn in calls:
            fn()
        done += 1
    times: list[list[float]] = [[] for _ in names]
    end = clock() + seconds * len(names)
    while True:
        for fn, record in zip(calls, times):
            t0 = clock()
            fn()
            record.append(clock() - t0)
        if len(times[0]) >= min_calls and clock() >= end:
            break
    return {n: np.asarray(t) for n, t in zip(names, times)}


@dataclass
class Latency:
    """The timing of one engine in one configuration.

    Attributes
    ----------
    engine : str
        ``"fastlayers"`` or ``"onnxruntime"``.
    threads, batch : int
        The configuration: threads of the engine, items per call.
    calls : int
        Timed calls.
    mean_ms, p50_ms, p90_ms, p99_ms, min_ms : float
        Milliseconds per call: mean, percentiles (linear interpolation), fastest.
    items_per_s : float
        Throughput: ``batch`` over the mean time.
    ratio : float or None
        For fastlayers beside onnxruntime: fastlayers' p50 over onnxruntime's (below 1:
        fastlayers is faster).
    max_abs_diff : float or None
        For fastlayers beside onnxruntime: the largest absolute difference of the outputs.
    """

    engine: str
    threads: int
    batch: int
    calls: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    items_per_s: float
    ratio: float | None = None
    max_abs_diff: float | None = None

    @classmethod
    def from_times(cls, engine: str, threads: int, batch: int, seconds) -> Latency:
        """The figures of one engine's timed calls.

        Parameters
        ----------
        engine : str
        threads, batch : int
        seconds : array_like
            The seconds of each timed call.

        Returns
        -------
        Latency
        """
        ms = np.asarray(seconds, np.float64) * 1e3
        p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
        mean = float(ms.mean())
        return cls(engine, threads, batch, int(ms.size), mean, p50, p90, p99, float(ms.min()),
                   batch / (mean / 1e3) if mean > 0 else float("inf"))

    def as_dict(self) -> dict:
        """The figures as a plain dict.

        Returns
        -------
        dict
            One entry per attribute (``BenchReport.as_dict``'s ``results`` entries).
        """
        return dict(self.__dict__)


# ------------------------------------------------------------------------------------ host
def cpu_name() -> str | None:
    """The CPU's model name.

    Returns
    -------
    str or None
        The ``model name`` (or ``Hardware``, ``cpu model``, ...) field of /proc/cpuinfo where
        there is one, else ``platform.processor()``, else None.
    """
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                key, sep, value = line.partition(":")
                if sep and value.strip():
                    fields.setdefault(key.strip().lower(), value.strip())
        for key in ("model name", "hardware", "cpu model", "processor name", "uarch", "cpu"):
            if key in fields and not fields[key].isdigit():
                return fields[key]
    except OSError:
        pass
    return platform.processor() or None


def host_info() -> dict:
    """Where the figures were taken.

    Returns
    -------
    dict
        ``cpu`` (model name, or None), ``machine`` (``platform.machine()``), ``system``,
        ``cpu_count`` (``os.cpu_count()``), ``usable_cpus`` (the CPUs this process may run on),
        ``isa`` (the ISA path of fastlayers' kernels, ``fastlayers.native.isa()``) and, on the
        AVX-512 and AVX2 paths, ``vnni`` (whether the 8-bit products use VNNI's vpdpbusd).
    """
    from . import native

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {"cpu": cpu_name(), "machine": platform.machine(), "system": platform.system(),
            "cpu_count": os.cpu_count(), "usable_cpus": usable, "isa": native.isa()}
    if info["isa"] in ("avx512", "avx2"):
        info["vnni"] = bool(native.vnni())
    return info


def versions(against: str | None = None) -> dict:
    """The versions behind the figures.

    Parameters
    ----------
    against : str, optional
        The engine compared with (``"onnxruntime"``), whose version is added.

    Returns
    -------
    dict
        ``fastlayers``, ``numpy``, ``python`` and, with ``against``, ``onnxruntime``.
    """
    out = {"fastlayers": __version__, "numpy": np.__version__,
           "python": platform.python_version()}
    if against == ONNXRUNTIME:
        import onnxruntime

        out[ONNXRUNTIME] = onnxruntime.__version__
    return out


# ---------------------------------------------------------------------------------- report
def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 100 else f"{v:.3f}" if v >= 1 else f"{v:.4f}"


@dataclass
class BenchReport:
    """The figures of ``run_benchmark``: one ``Latency`` per engine and configuration.

    Attributes
    ----------
    model : str
        The model's file (or name).
    kind : str
        The class the file loaded as (``OnnxModel``, ``Model``, ``Sequential``, a module's).
    inputs : list of InputSpec
        The inputs as the model declares them.
    input_shapes : dict
        Batch -> the shapes the inputs were timed at.
    seconds, warmup_s : float
        Timed and warm-up seconds per engine and configuration.
    against : str or None
        The engine compared with (``"onnxruntime"``), or None.
    rtol : float
        The output check's relative tolerance.
    atol : float or None
        Its absolute tolerance (None: ``rtol`` x each output's largest value).
    results : list of Latency
    notes : list of str
        What the figures do not show by themselves (a batch size the model fixes).
    host, versions : dict
        ``host_info()`` and ``versions()``.
    """

    model: str
    kind: str
    inputs: list
    seconds: float
    warmup_s: float
    against: str | None
    rtol: float
    atol: float | None
    results: list = field(default_factory=list)
    input_shapes: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    host: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)

    def table(self) -> str:
        """The report as text.

        Returns
        -------
        str
            The model and its inputs, the host, the method, one row per engine and
            configuration, the output check and the notes.
        """
        h = self.host
        cpu = h.get("cpu") or "unknown CPU"
        engines = ", ".join(f"{k} {v}" for k, v in self.versions.items() if k != "python")
        lines = [f"model: {self.model} ({self.kind}; inputs: "
                 f"{'; '.join(s.describe() for s in self.inputs) or 'none'})",
                 f"host: {cpu} ({h.get('machine')}, {h.get('usable_cpus')} of {h.get('cpu_count')} "
                 f"CPUs usable, fastlayers {h.get('isa')} path); {engines}",
                 f"each configuration: {self.warmup_s:g} s warm-up, then {self.seconds:g} s timed "
                 f"per engine" + (", engines taking turns call by call" if self.against else "")]
        for batch, shapes in self.input_shapes.items():
            lines.append(f"batch {batch}: input shapes {', '.join(f'{n} {s}' for n, s in shapes.items())}")
        head = (f"{'threads':>7}  {'batch':>5}  {'engine':<12}{'calls':>7}  {'mean ms':>9}  "
                f"{'p50 ms':>9}  {'p90 ms':>9}  {'p99 ms':>9}  {'items/s':>11}")
        if self.against:
            head += f"  {'vs ' + self.against:>15}"
        lines += ["", head, "-" * len(head)]
        for r in self.results:
            row = (f"{r.threads:>7}  {r.batch:>5}  {r.engine:<12}{r.calls:>7}  {_ms(r.mean_ms):>9}  "
                   f"{_ms(r.p50_ms):>9}  {_ms(r.p90_ms):>9}  {_ms(r.p99_ms):>9}  "
                   f"{r.items_per_s:>11,.1f}")
            if self.against:
                row += f"  {(f'{r.ratio:.2f}x' if r.ratio is not None else '-'):>15}"
            lines.append(row)
        if self.against:
            diffs = [r.max_abs_diff for r in self.results if r.max_abs_diff is not None]
            tol = f"rtol {self.rtol:g}, atol " + ("rtol x max |value|" if self.atol is None
                                                    else f"{self.atol:g}")
            lines += ["", f"outputs checked against {self.against}'s before timing each "
                          f"configuration ({tol}): max |difference| {max(diffs, default=0.0):.3g}",
                      f"vs {self.against}: fastlayers' p50 over {self.against}'s (below 1: "
                      f"fastlayers is faster)"]
        if self.notes:
            lines += [""] + [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def as_dict(self) -> dict:
        """The report as plain data (what ``write_json`` writes).

        Returns
        -------
        dict
            ``schema`` (``SCHEMA``), ``model`` {``path``, ``kind``, ``inputs``: [{``name``,
            ``shape``, ``dtype``}]}, ``settings`` {``seconds``, ``warmup_s``, ``threads``,
            ``batch_sizes``, ``input_shapes``, ``against``, ``rtol``, ``atol``}, ``results``
            (``Latency.as_dict()`` of each row), ``notes``, ``host`` and ``versions``.
        """
        return {
            "schema": SCHEMA,
            "model": {"path": self.model, "kind": self.kind,
                      "inputs": [{"name": s.name, "shape": None if s.shape is None else list(s.shape),
                                  "dtype": str(s.dtype)} for s in self.inputs]},
            "settings": {"seconds": self.seconds, "warmup_s": self.warmup_s,
                         "threads": sorted({r.threads for r in self.results}),
                         "batch_sizes": list(self.input_shapes),
                         "input_shapes": {str(b): {n: list(s) for n, s in shapes.items()}
                                          for b, shapes in self.input_shapes.items()},
                         "against": self.against, "rtol": self.rtol, "atol": self.atol},
            "results": [r.as_dict() for r in self.results],
            "notes": list(self.notes),
            "host": dict(self.host),
            "versions": dict(self.versions),
        }

    def write_json(self, path) -> None:
        """Write ``as_dict()`` as JSON.

        Parameters
        ----------
        path : str or Path
            The file to write (its directory must exist).
        """
        Path(path).write_text(json.dumps(self.as_dict(), indent=1) + "\n")


# ------------------------------------------------------------------------------------- run
def _batch_plan(specs, batch_sizes, shapes, given) -> tuple[list, list[str]]:
    """(batch sizes to time, notes). ``given``: the input arrays, or None for random ones."""
    notes = []
    if given is not None:
        rows = items_of(given)
        if batch_sizes is None:
            return [None], notes
        ranked = [a for a in given if np.ndim(a) > 0]
        short = [b for b in batch_sizes if b > rows]
        if short:
            raise InputError(f"the inputs given hold {rows} samples, fewer than the batch "
                             f"size(s) {short} asked")
        if not batchable(specs) or not ranked:
            notes.append(f"the model fixes its batch: timed on the inputs as given (batch {rows}); "
                         f"batch sizes {list(batch_sizes)} not timed")
            return [None], notes
        return list(batch_sizes), notes
    if batchable(specs):
        if batch_sizes is None:
            leading = [shapes[s.name][0] for s in specs if s.name in shapes and shapes[s.name]]
            return [leading[0] if leading else 1], notes
        return list(batch_sizes), notes
    fixed = next((s for s in specs if s.shape and _fixed(s.shape[0])), None)
    if batch_sizes is not None and fixed is not None and list(batch_sizes) != [int(fixed.shape[0])]:
        notes.append(f"input {fixed.name!r} fixes its leading dimension at {fixed.shape[0]}: timed "
                     f"at that batch only (batch sizes {list(batch_sizes)} asked)")
    elif batch_sizes is not None and fixed is None and list(batch_sizes) != [1]:
        notes.append(f"the model's inputs have no batch dimension: timed as declared (batch sizes "
                     f"{list(batch_sizes)} asked)")
    return [None], notes


def run_benchmark(model, *, path=None, threads: Sequence[int] | None = None,
                  batch_sizes: Sequence[int] | None = None,
                  shapes: Mapping[str, Sequence[int]] | None = None,
                  inputs: Sequence[np.ndarray] | None = None, seconds: float = DEFAULT_SECONDS,
                  warmup_s: float | None = None, against: str | None = None, rtol: float = RTOL,
                  atol: float | None = None, seed: int = 0,
                  log: Callable[[str], None] | None = None) -> BenchReport:
    """Time ``model`` at each thread count and batch size (``fastlayers bench``).

    Parameters
    ----------
    model
        What ``fastlayers.load`` returned.
    path : str or Path, optional
        The model's file: named in the report, and the file onnxruntime loads with ``against``.
    threads : sequence of int, optional
        Thread counts of fastlayers (and onnxruntime) to time at (default: the count in force).
        The count in force before is restored afterwards.
    batch_sizes : sequence of int, optional
        Batch sizes, where the model leaves its inputs' leading dimension free (default: 1, or
        the leading entry of ``shapes``); where it fixes it, that batch only (said in
        ``notes``). With ``inputs``: the first rows of each.
    shapes : mapping of str to sequence of int, optional
        Full shapes of inputs whose other dimensions the model leaves free.
    inputs : sequence of ndarray, optional
        The arrays to run (one per input, in order; cast to the declared dtypes) instead of
        random values.
    seconds : float
        Timed seconds per engine and configuration.
    warmup_s : float, optional
        Untimed seconds first (default ``min(MAX_WARMUP_S, seconds / 4)``).
    against : {None, "onnxruntime"}
        Time onnxruntime on the same file, interleaved call by call, after checking its outputs
        against fastlayers'.
    rtol, atol : float
        Tolerances of the output check (``compare_outputs``).
    seed : int
        Seed of the random inputs.
    log : callable, optional
        Called with a line of text as each configuration starts.

    Returns
    -------
    BenchReport

    Raises
    ------
    InputError
        Bad settings (no thread count, a batch size that is not a positive integer, a
        non-positive ``seconds``, an unknown engine, ``shapes`` naming no input, too few rows
        in ``inputs``).
    ShapeError
        A free dimension left unsized (naming the input and the dimension).
    UnsupportedError
        ``against`` for a model that is not ONNX or without its file, or without onnxruntime.
    MismatchError
        fastlayers' outputs differ from onnxruntime's (naming the output and the difference);
        nothing is timed.
    """
    from . import native

    if against not in (None, ONNXRUNTIME):
        raise InputError(f"against: the engines to compare with are {ONNXRUNTIME!r}; got {against!r}")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise InputError(f"seconds must be a positive number, got {seconds!r}")
    for what, values in (("threads", threads), ("batch sizes", batch_sizes)):
        if values is not None and (not len(values) or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values)):
            raise InputError(f"{what}: expected positive integers, got {list(values)!r}")
    if against is not None:
        if not is_onnx(model):
            raise UnsupportedError(f"comparing against {against} needs an ONNX model; this one "
                                   f"loads as {type(model).__name__}")
        if path is None:
            raise UnsupportedError(f"comparing against {against} needs the model's file (path=)")
        _import_onnxruntime()
    specs = input_specs(model)
    shapes = {name: tuple(int(d) for d in s) for name, s in (shapes or {}).items()}
    _check_names(specs, shapes, "shapes")
    given = None
    if inputs is not None:
        given = list(inputs)
        if len(given) != len(specs):
            raise InputError(f"the model takes {len(specs)} input(s) {[s.name for s in specs]}; "
                             f"{len(given)} given")
        given = [np.asarray(a).astype(s.dtype, copy=False) for a, s in zip(given, specs)]
    batches, notes = _batch_plan(specs, batch_sizes, shapes, given)
    warmup_s = min(MAX_WARMUP_S, seconds / 4) if warmup_s is None else float(warmup_s)
    report = BenchReport(str(path) if path is not None else getattr(model, "name", "model"),
                         type(model).__name__, specs, float(seconds), warmup_s, against, rtol,
                         atol, notes=notes, host=host_info())
    output_names = [o.name for o in model.get_outputs()] if is_onnx(model) else None
    counts = list(threads) if threads else [None]
    for t in counts:
        with using_threads(t):
            used = native.get_num_threads()
            session = onnxruntime_session(path, used) if against else None
            for batch in batches:
                if given is not None:
                    arrays = given if batch is None else [a[:batch] if np.ndim(a) else a for a in given]
                else:
                    arrays = make_inputs(specs, batch, shapes, seed)
                items = items_of(arrays)
                report.input_shapes.setdefault(items, {s.name: tuple(np.shape(a))
                                                       for s, a in zip(specs, arrays)})
                if log:
                    log(f"threads {used}, batch {items} ...")
                fns = {"fastlayers": runner(model, arrays)}
                got = fns["fastlayers"]()
                diff = None
                if session is not None:
                    feed = dict(zip([s.name for s in specs], arrays))
                    fns[against] = lambda session=session, feed=feed: session.run(None, feed)
                    diff = compare_outputs(fns[against](), got, output_names, rtol, atol,
                                           f"threads {used}, batch {items}", against)
                times = time_calls(fns, seconds, warmup_s)
                rows = {name: Latency.from_times(name, used, items, ts) for name, ts in times.items()}
                if session is not None:
                    rows["fastlayers"].ratio = rows["fastlayers"].p50_ms / rows[against].p50_ms
                    rows["fastlayers"].max_abs_diff = diff
                report.results += rows.values()
    report.versions = versions(against)
    return report
