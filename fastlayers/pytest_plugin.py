"""pytest plugin: speed checks of fastlayers models in a project's own tests.

Installed with fastlayers (the ``pytest11`` entry point ``fastlayers``); it provides the
``fastlayers_bench`` fixture, which times a model with pytest-benchmark's ``benchmark`` fixture::

    def test_classifier_is_fast(fastlayers_bench):
        result = fastlayers_bench("models/classifier.onnx", batch=1, threads=1, max_ms=2.0,
                                  max_ratio=1.2)

The fixture needs pytest-benchmark: without it (or with ``-p no:benchmark``) a test that asks
for it is skipped, saying why, and pytest runs on. Importing this module imports neither
pytest-benchmark nor fastlayers' models, so that it costs pytest runs that do not use it
nothing.

Under ``--benchmark-disable`` the model runs once, its outputs are still checked against
onnxruntime's where ``max_ratio`` asks for the comparison, and the budgets are not checked
(a ``FastlayersBenchWarning`` says so).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: Warm-up before pytest-benchmark times: calls until this many seconds have passed...
WARMUP_S = 0.1
#: ... and at least this many.
WARMUP_CALLS = 3


class FastlayersBenchWarning(UserWarning):
    """A speed check that ran without checking its budgets (benchmarks disabled)."""


@dataclass
class SpeedResult:
    """What one ``fastlayers_bench(...)`` call measured.

    Attributes
    ----------
    model : str
        The model's file (or name).
    threads, batch : int
        Threads of fastlayers (and onnxruntime) and items per call.
    outputs : list of ndarray
        The model's outputs on the inputs timed.
    median_ms : float or None
        pytest-benchmark's median milliseconds per call (None: benchmarks disabled).
    ratio : float or None
        fastlayers' p50 over onnxruntime's, timed interleaved (None: not compared).
    fastlayers_p50_ms, onnxruntime_p50_ms : float or None
        The two p50s of that interleaved timing.
    max_abs_diff : float or None
        The largest absolute difference of the outputs from onnxruntime's.
    profile : dict or None
        ``Profile.as_dict()`` of an ONNX model's call, step by step (None for other models
        or with ``profile=False``).
    checked : bool
        Whether the budgets were checked (False under ``--benchmark-disable``).
    extra_info : dict
        What was attached to ``benchmark.extra_info``.
    """

    model: str
    threads: int
    batch: int
    outputs: list
    median_ms: float | None = None
    ratio: float | None = None
    fastlayers_p50_ms: float | None = None
    onnxruntime_p50_ms: float | None = None
    max_abs_diff: float | None = None
    profile: dict | None = None
    checked: bool = False
    extra_info: dict = field(default_factory=dict)


class ModelCache:
    """Models loaded by ``fastlayers.load``, one per file for the test session (a file rewritten
    since, of another size or modification time, is loaded again)."""

    def __init__(self):
        self._models: dict = {}

    def get(self, path):
        """The model of a file, loaded at its first request.

        Parameters
        ----------
        path : str or Path

        Returns
        -------
        model
            What ``fastlayers.load`` returns for the file.
        """
        from .io import load

        path = Path(path).resolve()
        try:
            st = os.stat(path)
            key = (str(path), st.st_mtime_ns, st.st_size)
        except OSError:
            key = (str(path), None, None)  # load() names the missing file
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = load(path)
        return model


def _fail(message: str):
    pytest.fail(f"fastlayers_bench: {message}", pytrace=False)


def _check_limit(name: str, value) -> None:
    from .errors import InputError

    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise InputError(f"fastlayers_bench: {name} must be a positive number or None, got {value!r}")


def _inputs(model, specs, inputs, batch, shapes, seed):
    """The arrays to run, in the model's input order."""
    import numpy as np

    from .benchmark import make_inputs
    from .errors import InputError

    if inputs is None:
        return make_inputs(specs, batch, shapes, seed)
    if isinstance(inputs, dict):
        names = [s.name for s in specs]
        missing = [n for n in names if n not in inputs]
        unknown = [n for n in inputs if n not in names]
        if missing or unknown:
            raise InputError(f"fastlayers_bench: inputs= names {sorted(inputs)}; the model's inputs are {names}")
        inputs = [inputs[n] for n in names]
    elif not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    if len(inputs) != len(specs):
        raise InputError(
            f"fastlayers_bench: the model takes {len(specs)} input(s) "
            f"{[s.name for s in specs]}; inputs= gives {len(inputs)}"
        )
    return [np.asarray(a).astype(s.dtype, copy=False) for a, s in zip(inputs, specs)]


class SpeedCheck:
    """The ``fastlayers_bench`` fixture's value: call it once per test (pytest-benchmark's
    ``benchmark`` fixture times one function per test).

    Parameters
    ----------
    benchmark
        pytest-benchmark's ``benchmark`` fixture of the test.
    models : ModelCache
        The session's loaded models.
    """

    def __init__(self, benchmark, models: ModelCache):
        self.benchmark, self.models = benchmark, models

    def __call__(
        self,
        model,
        *,
        inputs=None,
        batch: int = 1,
        shapes=None,
        threads: int | None = 1,
        max_ms: float | None = None,
        max_ratio: float | None = None,
        rounds: int | None = None,
        ratio_seconds: float = 1.0,
        profile: bool = True,
        profile_repeats: int = 10,
        rtol: float | None = None,
        atol: float | None = None,
        seed: int = 0,
    ) -> SpeedResult:
        """Load (once per session), warm, time and check a model.

        Parameters
        ----------
        model : str, Path or model
            A model file (loaded once per test session and kept), or a model already loaded
            (then ``max_ratio`` cannot be asked: onnxruntime needs the file).
        inputs : ndarray, list of ndarray or dict, optional
            The inputs (a dict by input name); default: random values of the declared shapes
            and dtypes (``fastlayers.benchmark.make_inputs``).
        batch : int
            The size of a free leading dimension of the random inputs.
        shapes : dict of str to tuple, optional
            Full shapes of inputs whose other dimensions the model leaves free.
        threads : int or None
            fastlayers' (and onnxruntime's) threads during the check; the count in force before
            is restored after it. None: leave the count as it is.
        max_ms : float, optional
            Fail when pytest-benchmark's median milliseconds per call exceed it.
        max_ratio : float, optional
            Time onnxruntime on the same ONNX file, the engines taking turns call by call for
            ``ratio_seconds`` each after checking that their outputs agree, and fail when
            fastlayers' p50 exceeds ``max_ratio`` times onnxruntime's.
        rounds : int, optional
            Timed rounds of one call each (``benchmark.pedantic``); default: pytest-benchmark's
            own calibration (``--benchmark-min-rounds``, ``--benchmark-max-time``, ...).
        ratio_seconds : float
            Seconds per engine of the interleaved timing of ``max_ratio``.
        profile : bool
            Attach an ONNX model's step-by-step profile to ``benchmark.extra_info``.
        profile_repeats : int
            Calls the profile takes the median of.
        rtol, atol : float, optional
            Tolerances of the output check against onnxruntime
            (``fastlayers.benchmark.compare_outputs``; default rtol 1e-4).
        seed : int
            Seed of the random inputs.

        Returns
        -------
        SpeedResult

        Raises
        ------
        fastlayers.errors.InputError
            Bad arguments (a limit that is not a positive number, inputs that do not match
            the model's, ``max_ratio`` without the model's file).
        """
        from .backends import using_threads
        from .benchmark import (
            ONNXRUNTIME,
            RTOL,
            Latency,
            compare_outputs,
            input_specs,
            is_onnx,
            items_of,
            onnxruntime_session,
            runner,
            time_calls,
        )
        from .errors import InputError, MismatchError
        from .native import get_num_threads, isa

        _check_limit("max_ms", max_ms)
        _check_limit("max_ratio", max_ratio)
        benchmark = self.benchmark
        if isinstance(model, (str, os.PathLike)):
            path = Path(model)
            model = self.models.get(path)
        else:
            path = None
            if max_ratio is not None:
                raise InputError(
                    "fastlayers_bench: max_ratio compares with onnxruntime on the "
                    "model's file: pass the file's path, not a loaded model"
                )
        if max_ratio is not None and not is_onnx(model):
            raise InputError(
                f"fastlayers_bench: max_ratio compares ONNX models with onnxruntime; "
                f"{path} loads as {type(model).__name__}"
            )
        name = str(path) if path is not None else getattr(model, "name", type(model).__name__)
        specs = input_specs(model)
        arrays = _inputs(model, specs, inputs, batch, shapes, seed)
        rtol = RTOL if rtol is None else rtol
        info = benchmark.extra_info
        with using_threads(threads):
            used = get_num_threads()
            fn = runner(model, arrays)
            outputs = fn()
            result = SpeedResult(name, used, items_of(arrays), outputs, extra_info=info)
            info.update(
                {
                    "model": name,
                    "threads": used,
                    "batch": result.batch,
                    "inputs": {s.name: list(a.shape) for s, a in zip(specs, arrays)},
                    "isa": isa(),
                    "max_ms": max_ms,
                    "max_ratio": max_ratio,
                }
            )
            session = feed = None
            if max_ratio is not None:
                session = onnxruntime_session(path, used)
                feed = dict(zip([s.name for s in specs], arrays))
                names = [o.name for o in model.get_outputs()]
                try:
                    result.max_abs_diff = compare_outputs(
                        session.run(None, feed), outputs, names, rtol, atol, f"{name}, threads {used}"
                    )
                    mismatch = None
                except MismatchError as e:
                    mismatch = str(e)
                if mismatch:
                    _fail(mismatch)
                info[ONNXRUNTIME] = {"max_abs_diff": result.max_abs_diff}
            if benchmark.disabled:
                benchmark(fn)  # runs once: the correctness run of a suite without timing
                budgets = [f"{k}={v}" for k, v in (("max_ms", max_ms), ("max_ratio", max_ratio)) if v is not None]
                info["budget"] = "not checked: benchmarks disabled"
                warnings.warn(
                    FastlayersBenchWarning(
                        f"fastlayers_bench: benchmarks are disabled (--benchmark-disable): {name} ran "
                        f"once, not timed" + (f"; {', '.join(budgets)} not checked" if budgets else "")
                    ),
                    stacklevel=2,
                )
                return result
            warm(fn)
            if rounds is not None:
                benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)
            else:
                benchmark(fn)
            result.median_ms = float(benchmark.stats.stats.median) * 1e3
            info["median_ms"] = result.median_ms
            if profile and is_onnx(model):
                result.profile = model.profile(*arrays, repeats=profile_repeats).as_dict()
                info["profile"] = result.profile
            if session is not None:
                times = time_calls({"fastlayers": fn, ONNXRUNTIME: lambda: session.run(None, feed)}, ratio_seconds)
                ours = Latency.from_times("fastlayers", used, result.batch, times["fastlayers"])
                theirs = Latency.from_times(ONNXRUNTIME, used, result.batch, times[ONNXRUNTIME])
                result.fastlayers_p50_ms, result.onnxruntime_p50_ms = ours.p50_ms, theirs.p50_ms
                result.ratio = ours.p50_ms / theirs.p50_ms
                info[ONNXRUNTIME].update(
                    fastlayers_p50_ms=ours.p50_ms,
                    onnxruntime_p50_ms=theirs.p50_ms,
                    ratio=result.ratio,
                    calls=ours.calls,
                )
        result.checked = True
        failures = []
        if max_ms is not None and result.median_ms > max_ms:
            failures.append(
                f"{name}: median {result.median_ms:.4g} ms per call exceeds "
                f"max_ms={max_ms:g} (threads {used}, batch {result.batch})"
            )
        if max_ratio is not None and result.ratio > max_ratio:
            failures.append(
                f"{name}: {result.ratio:.3g}x onnxruntime exceeds max_ratio="
                f"{max_ratio:g} (p50 {result.fastlayers_p50_ms:.4g} ms against "
                f"{result.onnxruntime_p50_ms:.4g} ms, interleaved, threads {used}, "
                f"batch {result.batch})"
            )
        info["budget"] = "failed" if failures else "passed" if (max_ms is not None or max_ratio is not None) else "none"
        if failures:
            _fail("; ".join(failures))
        return result


def warm(fn) -> None:
    """Warm a model's call before it is timed.

    Parameters
    ----------
    fn : callable
        One inference, without arguments; called for ``WARMUP_S`` seconds, at least
        ``WARMUP_CALLS`` times.
    """
    import time

    end, calls = time.perf_counter() + WARMUP_S, 0
    while calls < WARMUP_CALLS or time.perf_counter() < end:
        fn()
        calls += 1


@pytest.fixture(scope="session")
def fastlayers_models() -> ModelCache:
    """The models ``fastlayers_bench`` loaded, one per file for the test session.

    Returns
    -------
    ModelCache
    """
    return ModelCache()


@pytest.fixture
def fastlayers_bench(request, fastlayers_models):
    """Time a fastlayers model with pytest-benchmark and check its speed.

    Call the value once per test: ``fastlayers_bench(path, batch=1, threads=1, max_ms=...,
    max_ratio=...)`` (``SpeedCheck.__call__``). Skips the test where pytest-benchmark is not
    installed or its plugin is turned off.

    Returns
    -------
    SpeedCheck
    """
    if not request.config.pluginmanager.hasplugin("benchmark"):
        pytest.skip("fastlayers_bench needs pytest-benchmark (pip install pytest-benchmark), with its plugin enabled")
    return SpeedCheck(request.getfixturevalue("benchmark"), fastlayers_models)
