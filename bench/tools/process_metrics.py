"""Process-level costs of fastlayers beside onnxruntime's, measured in the same run.

- installed size: fresh venvs (``python -m venv``) in a temporary directory: a baseline with
  nothing installed, one with ``pip install`` of this repository (fastlayers and its core
  dependencies; a regular install from a copy of the source files, so the extension is
  compiled afresh rather than taken from this tree's build outputs) and one with ``pip install
  onnxruntime numpy``. Size: the venv's site-packages bytes minus the baseline's; the
  distributions each install added are recorded with it (fastlayers reads .onnx files with no
  extra package).
- first prediction: wall time of a new process (the venv's interpreter) running import + load +
  first call (onnxruntime: import + session + first run), median of the repeats, after one
  untimed process per engine and model (the files in the OS cache, as on a host that has run
  the model before). Models: the four demo models (fastlayers/data/digits_*.flm; onnxruntime
  runs the ONNX export of their torch twins, ``bench_demo.torch_twin``, as bench/contention.py
  does) and the three whole models of bench_onnx_models (the same .onnx file for both engines);
  outputs are checked equal first.
- peak RSS (VmHWM) of a process that loads the model and runs it 21 times (not ru_maxrss: Linux
  carries it over fork and exec, so a child would report its parent's peak).
- first call / steady call: in that process, the first call's time over the median of the 20
  calls after it (median over the repeats' processes; the two times are recorded too).
- load cost: for a model of ``--load-mb`` MB of weights saved as .keras, .h5 and native .flm,
  the load time against the time to read the file's bytes, and the peak RSS growth during the
  load against the weight bytes (each in a fresh process of this interpreter).

Run: ``python -m bench.tools.process_metrics --out bench/results/process_metrics.json [--repeats 5]``
(the venvs need PyPI; ``--no-install`` skips them and the installed size, and runs the children
with this interpreter); ``python -m bench.tools.report ... --process bench/results/process_metrics.json``
folds the result into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENGINES = ("fastlayers", "onnxruntime")
#: Calls after the first one in the steady-call process.
STEADY_CALLS = 20

PEAK_RSS_KIB = """
def peak_rss_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
"""

#: A child that loads a model (``{setup}`` defines ``predict``), times the first call and
#: ``{calls}`` more, and prints the first call's seconds, the median of the others and VmHWM.
CHILD = (
    PEAK_RSS_KIB
    + """
import statistics, time
import numpy as np
{setup}
x = np.load({x!r})
t0 = time.perf_counter()
predict(x)
first = time.perf_counter() - t0
times = []
for _ in range({calls}):
    t0 = time.perf_counter()
    predict(x)
    times.append(time.perf_counter() - t0)
print(first, statistics.median(times or [first]), peak_rss_kib())
"""
)

SETUP = {
    "fastlayers": """
import fastlayers
fastlayers.set_num_threads({threads})
predict = fastlayers.load({model!r})
""",
    "onnxruntime": """
import onnxruntime as ort
opts = ort.SessionOptions()
opts.intra_op_num_threads = {threads}
opts.inter_op_num_threads = 1
session = ort.InferenceSession({model!r}, opts, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
predict = lambda x: session.run(None, {{name: x}})
""",
}


def host_info() -> dict:
    """CPU model (/proc/cpuinfo), the native core's ISA path and the cores this process may use
    (``fastlayers.benchmark.host_info``, in the keys the benchmarks' tables use)."""
    from fastlayers.benchmark import host_info as fastlayers_host

    info = fastlayers_host()
    return {"cpu": info["cpu"] or platform.machine(), "isa": info["isa"], "cores": info["usable_cpus"]}


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> tuple[float, str]:
    """(wall seconds, stdout) of ``cmd``, with PYTHONPATH unset; raises on failure."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr[-2000:]}")
    return wall, proc.stdout


def source_copy(dest: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored) copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the work tree is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def new_venv(path: Path, *requirements: str) -> Path:
    """The interpreter of a fresh venv at ``path`` with ``requirements`` pip-installed."""
    _run([sys.executable, "-m", "venv", str(path)])
    python = path / "bin" / "python"
    if requirements:
        pip_install(python, *requirements)
    return python


def pip_install(python: Path, *requirements: str) -> None:
    """``pip install`` ``requirements`` with the interpreter ``python`` (from PyPI)."""
    _run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *requirements], timeout=3600
    )


def site_packages(python: Path) -> tuple[int, dict[str, str]]:
    """(bytes of the files in a venv's site-packages, {distribution: version} installed there)."""
    code = (
        "import importlib.metadata as m, json, sysconfig; print(json.dumps(["
        "sysconfig.get_paths()['purelib'], {d.metadata['Name']: d.version for d in m.distributions()}]))"
    )
    path, dists = json.loads(_run([str(python), "-c", code])[1])
    size = sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(path) for f in files)
    return size, dists


def install(work: Path) -> tuple[dict[str, Path], list[dict]]:
    """Fresh venvs under ``work``: ({engine: interpreter}, installed-size records)."""
    base_size, base_dists = site_packages(new_venv(work / "venv-baseline"))
    src = source_copy(work / "src")
    pythons = {
        "fastlayers": new_venv(work / "venv-fastlayers", str(src)),
        "onnxruntime": new_venv(work / "venv-onnxruntime", "onnxruntime", "numpy"),
    }
    records = []
    for engine, python in pythons.items():
        size, dists = site_packages(python)
        added = sorted(f"{name} {version}" for name, version in dists.items() if base_dists.get(name) != version)
        records.append(
            {
                "metric": "installed_mib",
                "model": "core install",
                "engine": engine,
                "value": (size - base_size) / 2**20,
                "repeats": 1,
                "distributions": added,
            }
        )
    return pythons, records


def models(work: Path, full: bool) -> list[tuple[str, Path, Path, Path]]:
    """(name, fastlayers file, ONNX file, input .npy) of each model measured, outputs checked
    equal: the demo models on one sample (onnxruntime runs their torch twins' export) and the
    whole models of bench_onnx_models (the same .onnx file for both engines)."""
    import warnings

    import onnxruntime as ort
    import torch

    import fastlayers
    from bench.bench_demo import DATA, DEMOS, torch_twin
    from bench.bench_onnx_models import WORKLOADS, exported

    with np.load(DATA / "digits_samples.npz") as d:
        samples = d["x"].astype(np.float32)
    found = []
    for name, shape in DEMOS.items():
        x = samples[:1].reshape(1, *shape)
        path = work / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                torch_twin(torch, name, fastlayers.load(DATA / f"{name}.flm")),
                (torch.from_numpy(x),),
                str(path),
                dynamo=False,
                input_names=["x"],
                dynamic_axes={"x": {0: "batch"}},
                opset_version=17,
            )
        found.append((f"{name} (demo)", DATA / f"{name}.flm", path, x))
    for name, _ in WORKLOADS:
        _, x, path = exported(torch, name, work, full)
        found.append((f"{name} {'x'.join(map(str, x.shape))} (.onnx)", path, path, x))
    out = []
    for label, fl_path, onnx_path, x in found:
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(
            fastlayers.load(fl_path)(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4, err_msg=label
        )
        x_path = work / f"{fl_path.stem}_x.npy"
        np.save(x_path, x)
        out.append((label, fl_path, onnx_path, x_path))
    return out


def measure(pythons: dict[str, Path], cwd: Path, work: Path, repeats: int, threads: int, full: bool) -> list[dict]:
    """First-prediction, first/steady-call and peak-RSS records of each model and engine; the
    children run ``pythons[engine]`` in ``cwd``."""
    records = []
    for label, fl_path, onnx_path, x_path in models(work, full):
        files = {"fastlayers": fl_path, "onnxruntime": onnx_path}
        code = {
            (engine, calls): CHILD.format(
                setup=SETUP[engine].format(threads=threads, model=str(files[engine])), x=str(x_path), calls=calls
            )
            for engine in ENGINES
            for calls in (0, STEADY_CALLS)
        }

        def child(engine, calls):
            wall, out = _run([str(pythons[engine]), "-c", code[(engine, calls)]], cwd=cwd)
            return wall, [float(v) for v in out.split()]

        for engine in ENGINES:
            child(engine, 0)  # untimed: the files in the OS cache
        runs = {(engine, calls): [] for engine, calls in code}
        for _ in range(repeats):
            for key in code:
                runs[key].append(child(*key))
        for engine in ENGINES:
            walls = [wall for wall, _ in runs[(engine, 0)]]
            first, steady, rss = zip(*(out for _, out in runs[(engine, STEADY_CALLS)]))
            values = {
                "first_prediction_s": statistics.median(walls),
                "first_call_s": statistics.median(first),
                "steady_call_s": statistics.median(steady),
                "first_over_steady_call": statistics.median(f / s for f, s in zip(first, steady)),
                "peak_rss_mib": statistics.median(rss) / 1024.0,
            }
            records += [
                {"metric": metric, "model": label, "engine": engine, "value": value, "repeats": repeats}
                for metric, value in values.items()
            ]
    return records


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

CHILD_LOAD = (
    PEAK_RSS_KIB
    + """
import time
import fastlayers, h5py
base = peak_rss_kib()
t0 = time.perf_counter()
m = fastlayers.load({path!r})
t = time.perf_counter() - t0
grown = peak_rss_kib() - base
print(t, grown * 1024 / sum(w.nbytes for w in m.get_weights()))
"""
)


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
        records.append(
            {
                "metric": "load_time_over_read_time",
                "model": name,
                "engine": "fastlayers",
                "value": statistics.median(loads) / statistics.median(reads),
                "repeats": repeats,
            }
        )
        records.append(
            {
                "metric": "load_peak_rss_over_weights",
                "model": name,
                "engine": "fastlayers",
                "value": max(growth),
                "repeats": repeats,
            }
        )
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "process_metrics.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load-mb", type=float, default=100.0, help="weights of the load-cost model")
    parser.add_argument("--small", action="store_true", help="small ONNX models (for tests)")
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="no venvs and no installed size; the children run with this interpreter",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.no_install:  # this interpreter, started in the repository: it imports this tree
            pythons, records, cwd = dict.fromkeys(ENGINES, Path(sys.executable)), [], ROOT
        else:  # the venvs' interpreters, started outside the repository
            pythons, records = install(work)
            cwd = work
        records += measure(pythons, cwd, work, args.repeats, args.threads, full=not args.small)
    with tempfile.TemporaryDirectory() as tmp:
        records += measure_load_cost(Path(tmp), args.load_mb, args.repeats)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "host": host_info(), "records": records}, indent=1))
    for r in records:
        print(f"{r['metric']:26s} {r['model']:38s} {r['engine']:12s} {r['value']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
