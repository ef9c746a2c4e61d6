"""Cold start and peak memory of whole-model runs, fastlayers against onnxruntime, each in a fresh
process.

- cold start: wall time of ``python -c "import ...; load; first call"`` — fastlayers with a warm
  Numba cache and with an empty one (a new NUMBA_CACHE_DIR), onnxruntime with import + session
  creation + first run.
- memory: peak RSS (VmHWM) of a process that imports, loads and runs the model 20 times. (Not
  ru_maxrss: Linux carries it over fork and exec, so a child would report its parent's peak.)
- load cost: for a model of ``--load-mb`` MB of weights saved as .keras, .h5 and native .flm,
  the load time against the time to read the file's bytes, and the peak RSS growth during the
  load against the weight bytes (each in a fresh process).

Run: ``python bench/process_metrics.py --out bench/process_metrics.json [--repeats 5]``;
``python bench/report.py`` folds the result into docs/benchmarks.md.
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
sys.path.insert(0, str(ROOT))

PEAK_RSS_KIB = """
def peak_rss_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
"""

CHILD_FASTLAYERS = PEAK_RSS_KIB + """
import sys, numpy as np
import fastlayers
fastlayers.set_num_threads({threads})
m = fastlayers.load({model!r})
x = np.load({x!r})
for _ in range({runs}):
    y = m(x)
print(peak_rss_kib())
"""

CHILD_ORT = PEAK_RSS_KIB + """
import sys, numpy as np
import onnxruntime as ort
opts = ort.SessionOptions(); opts.intra_op_num_threads = {threads}; opts.inter_op_num_threads = 1
s = ort.InferenceSession({model!r}, opts, providers=["CPUExecutionProvider"])
x = np.load({x!r}); name = s.get_inputs()[0].name
for _ in range({runs}):
    y = s.run(None, {{name: x}})
print(peak_rss_kib())
"""


def run_child(code: str, env: dict) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of a fresh interpreter running ``code``."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    return wall, int(proc.stdout.strip().splitlines()[-1])


def models(workdir: Path, full: bool):
    """(name, fastlayers file, onnx file, input .npy) for each whole model measured: the demo MLP
    (native file for fastlayers, an equivalent ONNX graph for onnxruntime) and the three whole
    models of bench_onnx_models (ResNet-18-like, LSTM classifier, Transformer encoder) exported by
    torch (the same .onnx file for both engines)."""
    import warnings

    import fastlayers
    import torch

    from bench.bench_onnx_models import build
    from bench.onnx_export import to_onnx

    demo = Path(fastlayers.__file__).parent / "data" / "digits_mlp.flm"
    onnx_path = workdir / "digits_mlp.onnx"
    onnx_path.write_bytes(to_onnx(fastlayers.load(demo)).SerializeToString())
    x_path = workdir / "digits_x.npy"
    np.save(x_path, np.load(demo.parent / "digits_samples.npz")["x"][:1].astype(np.float32))
    yield "digits_mlp (demo)", demo, onnx_path, x_path

    for name in ("resnet18", "lstm_classifier", "transformer_encoder"):
        module, shape, dtype = build(torch, name, full)
        rng = np.random.default_rng(0)
        x = rng.integers(0, 50, shape) if dtype == np.int64 else rng.standard_normal(shape).astype(np.float32)
        path = workdir / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), (torch.from_numpy(x),), str(path), dynamo=False,
                              input_names=["x"], opset_version=17)
        np.save(workdir / f"{name}_x.npy", x)
        yield f"{name} {'x'.join(map(str, shape))} (.onnx)", path, path, workdir / f"{name}_x.npy"


CHILD_KERAS_SAVE = """
import os
os.environ["KERAS_BACKEND"] = "torch"
import keras
n = {n}
m = keras.Sequential([keras.Input((n,))] + [keras.layers.Dense(n) for _ in range(4)])
m.save({keras_path!r})
m.save({h5_path!r})
"""

CHILD_READ = """
import time
t0 = time.perf_counter()
with open({path!r}, "rb") as f:
    data = f.read()
print(time.perf_counter() - t0)
"""

CHILD_LOAD = PEAK_RSS_KIB + """
import time
import fastlayers, h5py
base = peak_rss_kib()
t0 = time.perf_counter()
m = fastlayers.load({path!r})
t = time.perf_counter() - t0
grown = peak_rss_kib() - base
print(t, grown * 1024 / sum(w.nbytes for w in m.get_weights()))
"""


def _child_output(code: str) -> list[float]:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    return [float(v) for v in proc.stdout.split()]


def measure_load_cost(work: Path, megabytes: float, repeats: int) -> list[dict]:
    """Load time / read time and peak RSS growth / weight bytes for each Keras and native file."""
    n = max(8, int((megabytes * 1e6 / 4 / 4) ** 0.5))  # four Dense(n) layers of n*n floats
    keras_path, h5_path, flm_path = work / "big.keras", work / "big.h5", work / "big.flm"
    _child_output(CHILD_KERAS_SAVE.format(n=n, keras_path=str(keras_path), h5_path=str(h5_path)) + "\nprint(0)")
    _child_output(f"import fastlayers; fastlayers.load({str(keras_path)!r}).save({str(flm_path)!r}); print(0)")
    records = []
    for path in (keras_path, h5_path, flm_path):
        reads, loads, growth = [], [], []
        for _ in range(repeats):
            reads.append(_child_output(CHILD_READ.format(path=str(path)))[0])
            t, g = _child_output(CHILD_LOAD.format(path=str(path)))
            loads.append(t)
            growth.append(g)
        name = f"{16 * n * n / 1e6:.0f} MB Dense stack ({path.suffix})"
        records.append({"metric": "load_time_over_read_time", "model": name, "engine": "fastlayers",
                        "value": statistics.median(loads) / statistics.median(reads), "repeats": repeats})
        records.append({"metric": "load_peak_rss_over_weights", "model": name, "engine": "fastlayers",
                        "value": max(growth), "repeats": repeats})
    return records


def measure(repeats: int, threads: int, full: bool = True) -> list[dict]:
    records = []
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        warm_cache = work / "numba-warm"
        for name, fl_path, onnx_path, x_path in models(work, full):
            fl_code = CHILD_FASTLAYERS.format(threads=threads, model=str(fl_path), x=str(x_path), runs=1)
            ort_code = CHILD_ORT.format(threads=threads, model=str(onnx_path), x=str(x_path), runs=1)
            warm_env = {**base_env, "NUMBA_CACHE_DIR": str(warm_cache)}
            run_child(fl_code, warm_env)  # fill the warm cache
            rows = {"fastlayers (warm cache)": [], "fastlayers (empty cache)": [], "onnxruntime": []}
            for i in range(repeats):
                rows["fastlayers (warm cache)"].append(run_child(fl_code, warm_env)[0])
                empty = {**base_env, "NUMBA_CACHE_DIR": str(work / f"numba-empty-{i}")}
                rows["fastlayers (empty cache)"].append(run_child(fl_code, empty)[0])
                rows["onnxruntime"].append(run_child(ort_code, base_env)[0])
            for engine, walls in rows.items():
                records.append({"metric": "cold_start_s", "model": name, "engine": engine,
                                "value": statistics.median(walls), "repeats": repeats})
            mem_fl = CHILD_FASTLAYERS.format(threads=threads, model=str(fl_path), x=str(x_path), runs=20)
            mem_ort = CHILD_ORT.format(threads=threads, model=str(onnx_path), x=str(x_path), runs=20)
            for engine, code, env in [("fastlayers", mem_fl, warm_env), ("onnxruntime", mem_ort, base_env)]:
                records.append({"metric": "peak_rss_mib", "model": name, "engine": engine,
                                "value": run_child(code, env)[1] / 1024.0, "repeats": 1})
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "process_metrics.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load-mb", type=float, default=100.0, help="weights of the load-cost model")
    parser.add_argument("--small", action="store_true", help="a small ResNet (for tests)")
    args = parser.parse_args(argv)
    records = measure(args.repeats, args.threads, full=not args.small)
    with tempfile.TemporaryDirectory() as tmp:
        records += measure_load_cost(Path(tmp), args.load_mb, args.repeats)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "records": records}, indent=1))
    for r in records:
        print(f"{r['metric']:14s} {r['model']:22s} {r['engine']:26s} {r['value']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
