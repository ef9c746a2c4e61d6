"""Calls spaced out as a service makes them: latency against the pause before each call, and
the CPU a process burns between calls at 20 requests a second, fastlayers beside onnxruntime.

For each engine (fastlayers with its default idle spin and with ``set_idle_spin(SPIN_S)``, at 2
threads; onnxruntime with its default spinning workers and without) at 1 and 2 threads, in a process of its own (another engine's spinning threads would take a core),
on the ONNX Conv2d(64, 64, 3, padding=1) export of a (1, 64, 56, 56) input, and on the real
models named with ``--real`` (bench/real_models.py ids, from its cache) with their feeds:

- the median and p90 call time over ``--calls`` calls with a pause of 0, 2, 10 and 50 ms before
  each (``time.sleep``);
- served at 20 Hz for ``--seconds`` (a call every 50 ms): the process's CPU seconds per wall
  second, and that less the calls' own time (the CPU burnt between calls: spinning workers).

Outputs are checked equal to onnxruntime's first. Run: ``python -m bench.bench_pauses``;
``pytest bench`` runs a few calls of each to keep it working.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAUSES_MS = (0, 2, 10, 50)
ENGINES = ("fastlayers", "fastlayers-spin", "onnxruntime", "onnxruntime-nospin")
#: The idle spin of the "fastlayers-spin" engine (``fastlayers.set_idle_spin``): as long as the
#: longest pause, as onnxruntime's spinning workers keep their cores for about that long.
SPIN_S = 0.05


def make_call(engine: str, path: str, threads: int):
    """A function feed -> first output of ``engine`` on the model at ``path``."""
    if engine.startswith("fastlayers"):
        import fastlayers

        fastlayers.set_num_threads(threads)
        if engine == "fastlayers-spin":
            fastlayers.set_idle_spin(SPIN_S)
        model = fastlayers.load(path)
        return lambda feed: model.run(None, feed)[0]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0" if engine.endswith("nospin") else "1")
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda feed: sess.run(None, feed)[0]


def measure(engine: str, path: str, feed_path: str, threads: int, calls: int, seconds: float) -> dict:
    """The figures of one engine at one thread count (in this process), on the feed saved in
    ``feed_path`` (.npz)."""
    call = make_call(engine, path, threads)
    with np.load(feed_path) as saved:
        x = dict(saved)
    for _ in range(20):
        y = call(x)
    row = {"engine": engine, "threads": threads, "output_sum": float(np.abs(y).sum())}
    for pause in PAUSES_MS:
        times = []
        for _ in range(calls):
            if pause:
                time.sleep(pause / 1e3)
            t0 = time.perf_counter()
            call(x)
            times.append(time.perf_counter() - t0)
        row[f"pause_{pause}_median_ms"] = statistics.median(times) * 1e3
        row[f"pause_{pause}_p90_ms"] = float(np.percentile(times, 90)) * 1e3
    busy, n = 0.0, 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        t0 = time.perf_counter()
        call(x)
        dt = time.perf_counter() - t0
        busy, n = busy + dt, n + 1
        time.sleep(max(0.0, 0.05 - dt))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    row["served_20hz_cpu_per_s"] = cpu / wall
    row["served_20hz_idle_cpu_per_s"] = max(0.0, cpu - busy * threads) / wall
    return row


def workloads(tmp: Path, real: list[str]) -> list[tuple[str, str, str]]:
    """(name, model path, feed path) of the Conv2d export and of each real model in ``real``
    (bench/real_models.py ids; those not in the cache are skipped with a message)."""
    sys.path.insert(0, str(ROOT))
    from bench import real_models
    from bench.bench_serve import conv_export

    feed = tmp / "conv.npz"
    np.savez(feed, x=np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32))
    out = [("conv3x3", str(conv_export(tmp / "conv.onnx")), str(feed))]
    for name in real:
        entry = real_models.BY_ID[name]
        path = real_models.model_path(entry)
        if path is None:
            print(f"{name}: not in the cache (python bench/bench_real_models.py --fetch)", file=sys.stderr)
            continue
        feed = tmp / f"{name}.npz"
        np.savez(feed, **entry.feed())
        out.append((name, str(path), str(feed)))
    return out


def run(calls: int, seconds: float, engines=ENGINES, threads=(1, 2), real=()) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, feed in workloads(Path(tmp), list(real)):
            done = _run_workload(name, path, feed, calls, seconds, engines, threads)
            sums = [r["output_sum"] for r in done]
            if max(sums) - min(sums) > 1e-3 * max(abs(v) for v in sums) + 1e-6:
                raise AssertionError(f"{name}: the engines' outputs differ (sums of |y|: {sums})")
            rows.extend(done)
    return rows


def _run_workload(name, path, feed, calls, seconds, engines, threads) -> list[dict]:
    """Each engine at each thread count on one workload, each in a process of its own."""
    rows = []
    for t in threads:
        for engine in engines:
            if engine == "fastlayers-spin" and t == 1:
                continue  # no workers to keep spinning
            cmd = [sys.executable, "-m", "bench.bench_pauses", "--child", engine, path, feed, str(t), str(calls)]
            out = subprocess.run(
                [*cmd, str(seconds)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=900,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
            )
            if out.returncode:
                raise RuntimeError(f"{name}: {engine} at {t} threads: {out.stderr[-2000:]}")
            rows.append({"workload": name, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_pauses_short():
    """A few calls of each configuration: the engines agree and every figure is there."""
    from .conftest import oracle

    oracle("onnxruntime")
    rows = run(calls=3, seconds=0.3, engines=("fastlayers", "onnxruntime"), threads=(2,))
    sums = [r["output_sum"] for r in rows]
    assert abs(sums[0] - sums[1]) <= 1e-4 * abs(sums[1])
    assert all(r[f"pause_{p}_median_ms"] > 0 for r in rows for p in PAUSES_MS)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import real_models

    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, path, feed, threads, calls, seconds = sys.argv[2:8]
        print(json.dumps(measure(engine, path, feed, int(threads), int(calls), float(seconds))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60, help="calls per pause")
    parser.add_argument("--seconds", type=float, default=5.0, help="served at 20 Hz for this long")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--real", nargs="*", default=[], choices=sorted(real_models.BY_ID), help="also these real models"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.tools.process_metrics import host_info

    rows = run(args.calls, args.seconds, real=args.real)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"host": host_info(), "rows": rows}, indent=1))
    print(f"\n{host_info()}; median (p90) ms of a call after each pause; CPU at 20 Hz\n")
    print(
        "| workload | engine | threads | "
        + " | ".join(f"{p} ms" for p in PAUSES_MS)
        + " | 50 ms / 0 ms | 20 Hz: CPU s/s | between calls |"
    )
    print("|---|---|---:|" + "---:|" * len(PAUSES_MS) + "---:|---:|---:|")
    for r in rows:
        cells = " | ".join(f"{r[f'pause_{p}_median_ms']:.2f} ({r[f'pause_{p}_p90_ms']:.2f})" for p in PAUSES_MS)
        cold = r["pause_50_median_ms"] / r["pause_0_median_ms"]
        print(
            f"| {r['workload']} | {r['engine']} | {r['threads']} | {cells} | {cold:.2f} | "
            f"{r['served_20hz_cpu_per_s']:.2f} | {r['served_20hz_idle_cpu_per_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
