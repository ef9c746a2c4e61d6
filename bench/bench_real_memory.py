"""Real models' peak memory: fastlayers against onnxruntime, each engine alone in a new process.

For each model of the real-models manifest (bench/real_models.py; cached packages only) and each
engine, a new interpreter imports the engine, loads the model's .onnx file, runs it twice on the
manifest's feed (on ``--threads`` threads) and prints its RSS once the engine is imported
(before the load) and its peak RSS (VmHWM; not ru_maxrss, which Linux carries over fork and
exec). Each figure is the median over ``--repeats`` processes. The table gives both engines'
peaks, their ratio (the target: at most 1.0), and the ratio of the peaks' growth over the
RSS before the load (what the model itself costs, without the engines' import):

    python bench/bench_real_memory.py [--threads 2] [--repeats 3] [--only ID ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import real_models  # noqa: E402
from bench.bench_real_models import host_line, selected  # noqa: E402
from bench.tools.process_metrics import PEAK_RSS_KIB  # noqa: E402

ENGINES = ("fastlayers", "onnxruntime")
#: Calls after the load: the first binds and packs what the warm-up did not, the second shows
#: whether a steady call adds more.
CALLS = 2

#: The child: ``{setup}`` imports the engine and defines ``load(path) -> run(feed)``.
CHILD = (
    PEAK_RSS_KIB
    + """
import numpy as np
def rss_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])
with np.load({feed!r}) as archive:
    feed = {{name: archive[name] for name in archive.files}}
{setup}
before = rss_kib()
run = load({path!r})
for _ in range({calls}):
    run(feed)
print(before, peak_rss_kib())
"""
)

SETUP = {
    "fastlayers": """
import fastlayers
fastlayers.set_num_threads({threads})
def load(path):
    return fastlayers.load(path)
""",
    "onnxruntime": """
import onnxruntime as ort
def load(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = {threads}
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)
""",
}


def child_source(path: Path, feed: Path, engine: str, threads: int) -> str:
    """The child process's program for the model at ``path``, its inputs saved in ``feed``
    (.npz, one array per input name) and ``engine``."""
    setup = SETUP[engine].format(threads=threads)
    return CHILD.format(feed=str(feed), setup=setup, path=str(path), calls=CALLS)


def measure(path: Path, feed: Path, engine: str, threads: int, repeats: int) -> dict:
    """{"before_mib", "peak_mib"}: medians over ``repeats`` new processes (``child_source``);
    or {"error": text}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    before, peak = [], []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", child_source(path, feed, engine, threads)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        if done.returncode:
            return {"error": (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:300]}
        b, p = map(int, done.stdout.split()[-2:])
        before.append(b / 1024)
        peak.append(p / 1024)
    return {"before_mib": statistics.median(before), "peak_mib": statistics.median(peak)}


def row(model_id: str, path: Path, feed: Path, threads: int, repeats: int) -> dict:
    """One model's figures for both engines, and the ratios where both ran."""
    out = {"id": model_id, "threads": threads}
    for engine in ENGINES:
        out[engine] = measure(path, feed, engine, threads, repeats)
    fl, ort = out["fastlayers"], out["onnxruntime"]
    if "peak_mib" in fl and "peak_mib" in ort:
        out["peak_ratio"] = fl["peak_mib"] / ort["peak_mib"]
        out["growth_ratio"] = (fl["peak_mib"] - fl["before_mib"]) / max(ort["peak_mib"] - ort["before_mib"], 1e-9)
    return out


def markdown(rows: list[dict]) -> str:
    """The per-model table and the geomean of the peak ratios."""

    def cell(fig: dict) -> str:
        return f"{fig['peak_mib']:.1f} ({fig['before_mib']:.1f})" if "peak_mib" in fig else "fails"

    lines = [
        "| model | fastlayers peak MiB (before load) | onnxruntime peak MiB (before load) | peak ratio | growth ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratios = f"{r['peak_ratio']:.2f} | {r['growth_ratio']:.2f}" if "peak_ratio" in r else "- | -"
        lines.append(f"| {r['id']} | {cell(r['fastlayers'])} | {cell(r['onnxruntime'])} | {ratios} |")
    peaks = [r["peak_ratio"] for r in rows if "peak_ratio" in r]
    if peaks:
        above = [r["id"] for r in rows if r.get("peak_ratio", 0) > 1.0]
        lines += [
            "",
            f"geomean peak fastlayers / onnxruntime: {math.exp(statistics.fmean(map(math.log, peaks))):.2f} "
            f"over {len(peaks)} models; above 1.0: {len(above)}" + (f" ({', '.join(above)})" if above else ""),
        ]
    return "\n".join(lines)


def test_memory_beside_onnxruntime_in_new_processes(tmp_path):
    """Both engines' RSS before the load and peak, measured in new processes on a small ONNX
    model, and the table made from them."""
    from bench.conftest import oracle

    onnx = oracle("onnx")
    oracle("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    feed = tmp_path / "feed.npz"
    np.savez(feed, x=np.ones((4, 256), np.float32))
    r = row("tiny", path, feed, threads=1, repeats=1)
    for engine in ENGINES:
        assert 0 < r[engine]["before_mib"] <= r[engine]["peak_mib"], r
    assert r["peak_ratio"] > 0 and r["growth_ratio"] > 0
    table = markdown([r])
    assert "| tiny |" in table and "geomean peak fastlayers / onnxruntime" in table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="new processes per model and engine (median)")
    parser.add_argument("--only", nargs="+", metavar="ID", help="these model ids only")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the rows here")
    args = parser.parse_args(argv)

    host = host_line()
    print(host)
    rows = []
    for entry in selected(args.only):
        path = real_models.model_path(entry)
        if path is None:
            print(f"skipped {entry.id}: {entry.package}=={entry.version} not in {real_models.cache_dir()}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            feed = Path(tmp) / "feed.npz"
            np.savez(feed, **entry.feed())
            rows.append(row(entry.id, path, feed, args.threads, args.repeats))
        print(f"{entry.id}: {rows[-1]}", flush=True)
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"host": host, "threads": args.threads, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
