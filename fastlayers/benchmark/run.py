"""``run_benchmark``: the settings checked, then per thread count and batch size the inputs,
the output check against onnxruntime, the timing and the report's rows (``fastlayers bench``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..backends import using_threads
from ..errors import InputError, UnsupportedError
from .engines import ONNXRUNTIME, RTOL, compare_outputs, import_onnxruntime, is_onnx, onnxruntime_session, runner
from .host import host_info, versions
from .inputs import batch_plan, check_names, input_specs, items_of, make_inputs
from .report import BenchReport
from .timing import DEFAULT_SECONDS, MAX_WARMUP_S, Latency, time_calls


def run_benchmark(
    model,
    *,
    path=None,
    threads: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    inputs: Sequence[np.ndarray] | None = None,
    seconds: float = DEFAULT_SECONDS,
    warmup_s: float | None = None,
    against: str | None = None,
    rtol: float = RTOL,
    atol: float | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> BenchReport:
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
    from .. import native

    if against not in (None, ONNXRUNTIME):
        raise InputError(f"against: the engines to compare with are {ONNXRUNTIME!r}; got {against!r}")
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise InputError(f"seconds must be a positive number, got {seconds!r}")
    for what, values in (("threads", threads), ("batch sizes", batch_sizes)):
        if values is not None and (
            not len(values) or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values)
        ):
            raise InputError(f"{what}: expected positive integers, got {list(values)!r}")
    if against is not None:
        if not is_onnx(model):
            raise UnsupportedError(
                f"comparing against {against} needs an ONNX model; this one loads as {type(model).__name__}"
            )
        if path is None:
            raise UnsupportedError(f"comparing against {against} needs the model's file (path=)")
        import_onnxruntime()
    specs = input_specs(model)
    shapes = {name: tuple(int(d) for d in s) for name, s in (shapes or {}).items()}
    check_names(specs, shapes, "shapes")
    given = None
    if inputs is not None:
        given = list(inputs)
        if len(given) != len(specs):
            raise InputError(f"the model takes {len(specs)} input(s) {[s.name for s in specs]}; {len(given)} given")
        given = [np.asarray(a).astype(s.dtype, copy=False) for a, s in zip(given, specs)]
    batches, notes = batch_plan(specs, batch_sizes, shapes, given)
    warmup_s = min(MAX_WARMUP_S, seconds / 4) if warmup_s is None else float(warmup_s)
    report = BenchReport(
        str(path) if path is not None else getattr(model, "name", "model"),
        type(model).__name__,
        specs,
        float(seconds),
        warmup_s,
        against,
        rtol,
        atol,
        notes=notes,
        host=host_info(),
    )
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
                report.input_shapes.setdefault(items, {s.name: tuple(np.shape(a)) for s, a in zip(specs, arrays)})
                if log:
                    log(f"threads {used}, batch {items} ...")
                fns = {"fastlayers": runner(model, arrays)}
                got = fns["fastlayers"]()
                diff = None
                if session is not None:
                    feed = dict(zip([s.name for s in specs], arrays))
                    fns[against] = lambda session=session, feed=feed: session.run(None, feed)
                    diff = compare_outputs(
                        fns[against](), got, output_names, rtol, atol, f"threads {used}, batch {items}", against
                    )
                times = time_calls(fns, seconds, warmup_s)
                rows = {name: Latency.from_times(name, used, items, ts) for name, ts in times.items()}
                if session is not None:
                    rows["fastlayers"].ratio = rows["fastlayers"].p50_ms / rows[against].p50_ms
                    rows["fastlayers"].max_abs_diff = diff
                report.results += rows.values()
    report.versions = versions(against)
    return report
