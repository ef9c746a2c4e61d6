"""Timing a loaded model as its users run it: latency percentiles and throughput over a time
budget, at several batch sizes and thread counts, optionally beside onnxruntime on the same
file (``fastlayers bench`` and the pytest plugin ``fastlayers.pytest_plugin`` use it).

By subject: ``inputs`` (declared inputs, shapes, random values), ``engines`` (fastlayers' call,
onnxruntime's session, the output check), ``timing`` (timed calls and their statistics),
``host`` (CPU and versions), ``report`` (the table and the JSON) and ``run``
(``run_benchmark``); the public names of each are importable from here.

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

from .engines import ONNXRUNTIME, RTOL, compare_outputs, is_onnx, onnxruntime_session, runner
from .host import cpu_name, host_info, versions
from .inputs import (
    INT_HIGH,
    InputSpec,
    batchable,
    input_specs,
    items_of,
    make_inputs,
    parse_shape,
    random_array,
    resolve_shape,
)
from .report import SCHEMA, BenchReport
from .run import run_benchmark
from .timing import DEFAULT_SECONDS, MAX_WARMUP_S, MIN_CALLS, WARMUP_CALLS, Latency, time_calls

__all__ = [
    "DEFAULT_SECONDS",
    "INT_HIGH",
    "MAX_WARMUP_S",
    "MIN_CALLS",
    "ONNXRUNTIME",
    "RTOL",
    "SCHEMA",
    "WARMUP_CALLS",
    "BenchReport",
    "InputSpec",
    "Latency",
    "batchable",
    "compare_outputs",
    "cpu_name",
    "host_info",
    "input_specs",
    "is_onnx",
    "items_of",
    "make_inputs",
    "onnxruntime_session",
    "parse_shape",
    "random_array",
    "resolve_shape",
    "run_benchmark",
    "runner",
    "time_calls",
    "versions",
]
