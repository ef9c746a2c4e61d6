"""Timing calls and their statistics: a warm-up, then calls timed one by one until the time
budget has passed (engines taking turns call by call, ``time_calls``), and the figures of one
engine's calls (``Latency``: mean, percentiles, fastest, throughput).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

#: Timed seconds per engine and configuration when none are given.
DEFAULT_SECONDS = 2.0
#: Fewest timed calls per engine and configuration, however long a call takes.
MIN_CALLS = 3
#: Fewest warm-up calls per engine; the warm-up lasts ``min(MAX_WARMUP_S, seconds / 4)``.
WARMUP_CALLS = 2
MAX_WARMUP_S = 0.5


def time_calls(
    fns: Mapping[str, Callable[[], object]], seconds: float, warmup_s: float | None = None, min_calls: int = MIN_CALLS
) -> dict[str, np.ndarray]:
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
        return cls(
            engine,
            threads,
            batch,
            int(ms.size),
            mean,
            p50,
            p90,
            p99,
            float(ms.min()),
            batch / (mean / 1e3) if mean > 0 else float("inf"),
        )

    def as_dict(self) -> dict:
        """The figures as a plain dict.

        Returns
        -------
        dict
            One entry per attribute (``BenchReport.as_dict``'s ``results`` entries).
        """
        return dict(self.__dict__)
