"""Calls under contention: fastlayers and onnxruntime at 1 and 2 threads while another process
keeps one core busy, and fastlayers' 2-thread calls in a forked child.

For each demo model (fastlayers/data/digits_*.flm; onnxruntime runs the torch twin's ONNX
export, as in bench_demo.py, outputs checked equal first) and engine, the median call time is
taken quiet and then with a busy-loop process running (``while True: pass``), the 1- and
2-thread calls of an engine interleaved round by round (one engine at a time: onnxruntime's
spinning workers would otherwise take a core from fastlayers' threads). The figure that matters is the busy 2-thread time over the busy
1-thread time (a thread pool whose static shares wait for a descheduled thread runs many times
slower than its 1-thread call). A forked child (``multiprocessing`` with ``fork``, as gunicorn
``--preload``) then times fastlayers' 2-thread calls against the parent's.

Run: ``python -m bench.contention --out bench/results/contention.json``; ``bench/tools/report.py
--contention`` renders it into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fastlayers  # noqa: E402
from bench.bench_demo import DATA, DEMOS, torch_twin  # noqa: E402
from bench.tools.process_metrics import host_info  # noqa: E402

#: (model, batch): the reference workloads (demo CNN at 300, LSTM at 64) and the other two demos.
WORKLOADS = [("digits_cnn", 300), ("digits_lstm", 64), ("digits_mlp", 300), ("digits_transformer", 64)]


def median_us(fn, x, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def engines(name: str, samples: np.ndarray, tmp: Path) -> dict:
    """{(engine, threads): callable} for one demo model, outputs checked equal."""
    import onnxruntime as ort
    import torch

    model = fastlayers.load(DATA / f"{name}.flm")
    path = tmp / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch_twin(torch, name, model),
            (torch.from_numpy(samples[:2]),),
            str(path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )
    out = {}
    for threads in (1, 2):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        out[("onnxruntime", threads)] = lambda x, s=sess: s.run(None, {"x": x})[0]

        def run_fl(x, threads=threads):
            fastlayers.set_num_threads(threads)
            return model(x)

        out[("fastlayers", threads)] = run_fl
    x = samples
    ref = out[("onnxruntime", 1)](x)
    for key, fn in out.items():
        np.testing.assert_allclose(fn(x), ref, rtol=1e-4, atol=1e-5, err_msg=str(key))
    return out


def timed_rounds(fns: dict, x, rounds: int, calls: int) -> dict:
    """Median over rounds of each call's median time: one engine at a time (onnxruntime's
    spinning workers would take a core from the next engine's threads), its 1- and 2-thread
    calls interleaved per round, with a pause between engines."""
    per = {key: [] for key in fns}
    for engine in dict.fromkeys(key[0] for key in fns):
        time.sleep(0.3)
        for _ in range(rounds):
            for key, fn in fns.items():
                if key[0] == engine:
                    per[key].append(median_us(fn, x, calls))
    return {key: statistics.median(v) for key, v in per.items()}


def _child(name, batch, calls, queue):
    samples = load_samples(name)[:batch]
    model = fastlayers.load(DATA / f"{name}.flm")
    fastlayers.set_num_threads(2)
    model(samples)
    queue.put(median_us(model, samples, calls))


def load_samples(name: str) -> np.ndarray:
    with np.load(DATA / "digits_samples.npz") as d:
        return d["x"].astype(np.float32).reshape(-1, *DEMOS[name])


def measure(rounds: int, calls: int, tmp: Path) -> list[dict]:
    rows = []
    for name, batch in WORKLOADS:
        x = load_samples(name)[:batch]
        fns = engines(name, x, tmp)
        quiet = timed_rounds(fns, x, rounds, calls)
        busy_proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            busy = timed_rounds(fns, x, rounds, calls)
        finally:
            busy_proc.kill()
            busy_proc.wait()
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child, args=(name, batch, calls, queue))
        child.start()
        forked = queue.get(timeout=300)
        child.join()
        for engine in ("fastlayers", "onnxruntime"):
            rows.append(
                {
                    "workload": f"demo {name}",
                    "batch": batch,
                    "engine": engine,
                    "quiet_1t_us": quiet[(engine, 1)],
                    "quiet_2t_us": quiet[(engine, 2)],
                    "busy_1t_us": busy[(engine, 1)],
                    "busy_2t_us": busy[(engine, 2)],
                    "busy_2t_over_1t": busy[(engine, 2)] / busy[(engine, 1)],
                    "forked_2t_us": forked if engine == "fastlayers" else None,
                }
            )
        print(json.dumps(rows[-2:], indent=1), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.rounds, args.calls, Path(tmp))
    host = host_info()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"host": host, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
