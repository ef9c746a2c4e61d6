"""Thread scaling and steadiness: each engine alone in its own process at 1 and 2 threads, and
each engine's 2-thread calls in rounds right after another thread pool's.

Workloads (ONNX files written with ``onnx.helper``, random weights, nothing downloaded):

- ``resnet50-nhwc``: a ResNet-50 (bottleneck blocks 3-4-6-3, convolutions with biases and no
  BatchNorm nodes, as tf2onnx folds them) taking an NHWC input through a leading Transpose, as
  tf2onnx exports Keras models, at batch 1 and 8;
- ``conv3x3``: Conv2d(64, 64, 3, padding=1) + bias on 8 x 64 x 56 x 56;
- ``linear1024``: MatMul + Add 1024 -> 1024 on 64 rows.

For each workload, engine (fastlayers, onnxruntime with its default spinning workers) and
thread count, a new process loads the model, warms it up and calls it back to back for
``--seconds``: median, p10 and p90 of the call times. Then, in a process of each engine at 2
threads, the same calls in rounds of ``ROUND_CALLS``, each round right after another pool's
work (not timed, about ``NEIGHBOUR_MS`` of it): the other engine on the same model at 2 threads
(``after the other engine``), or 512 x 512 numpy products (OpenBLAS's threads, ``after
numpy``); the p90/p10 of those calls says how steady they are. The outputs of both engines
are checked equal first.

Run: ``python -m bench.bench_scaling [--seconds 3] [--only resnet50-nhwc-b8 ...] [--out F]``;
``pytest bench`` runs a short pass on the small workloads to keep it working.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("fastlayers", "onnxruntime")
NEIGHBOURS = ("other", "numpy")
ROUND_CALLS = 10
NEIGHBOUR_MS = 20.0

#: name: (builder, input shape)
WORKLOADS = {
    "resnet50-nhwc-b1": ("resnet50_nhwc", (1, 224, 224, 3)),
    "resnet50-nhwc-b8": ("resnet50_nhwc", (8, 224, 224, 3)),
    "conv3x3-b8": ("conv3x3", (8, 64, 56, 56)),
    "linear1024-b64": ("linear1024", (64, 1024)),
}
SHORT = ("conv3x3-b8", "linear1024-b64")


def _save(nodes, inputs, outputs, inits, path: Path) -> Path:
    from onnx import helper, save

    graph = helper.make_graph(nodes, path.stem, inputs, outputs, inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def resnet50_nhwc(path: Path, batch_shape) -> Path:
    """ResNet-50 on an NHWC input (a Transpose to NCHW first, as tf2onnx writes it)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    count = [0]

    def name(kind):
        count[0] += 1
        return f"{kind}{count[0]}"

    def conv(x, cin, cout, k, stride=1, relu=True, gain=1.0):
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * np.float32(gain * (2.0 / (cin * k * k)) ** 0.5)
        b = rng.uniform(-0.05, 0.05, cout).astype(np.float32)
        wn, bn, y = name("w"), name("b"), name("conv")
        inits.extend([numpy_helper.from_array(w, wn), numpy_helper.from_array(b, bn)])
        p = k // 2
        nodes.append(
            helper.make_node("Conv", [x, wn, bn], [y], kernel_shape=[k, k], strides=[stride] * 2, pads=[p] * 4)
        )
        if not relu:
            return y
        r = name("relu")
        nodes.append(helper.make_node("Relu", [y], [r]))
        return r

    x = conv("x_nchw", 3, 64, 7, 2)
    nodes.insert(0, helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2]))
    pooled = name("pool")
    nodes.append(helper.make_node("MaxPool", [x], [pooled], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = pooled, 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            h = conv(x, cin, width, 1)
            h = conv(h, width, width, 3, s)
            h = conv(h, width, 4 * width, 1, relu=False, gain=0.3)
            short = conv(x, cin, 4 * width, 1, s, relu=False) if i == 0 else x
            added, out = name("add"), name("relu")
            nodes.append(helper.make_node("Add", [h, short], [added]))
            nodes.append(helper.make_node("Relu", [added], [out]))
            x, cin = out, 4 * width
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    inits.append(numpy_helper.from_array((rng.standard_normal((2048, 1000)) * 0.02).astype(np.float32), "fc_w"))
    inits.append(numpy_helper.from_array(np.zeros(1000, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]))
    nodes.append(helper.make_node("Softmax", ["logits"], ["y"], axis=1))
    vi = helper.make_tensor_value_info
    return _save(
        nodes, [vi("x", TensorProto.FLOAT, list(batch_shape))], [vi("y", TensorProto.FLOAT, None)], inits, path
    )


def conv3x3(path: Path, shape) -> Path:
    """Conv2d(64, 64, 3, padding=1) + bias."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.04, 0.04, (64, 64, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(-0.04, 0.04, 64).astype(np.float32), "b"),
    ]
    vi = helper.make_tensor_value_info
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    return _save([node], [vi("x", TensorProto.FLOAT, list(shape))], [vi("y", TensorProto.FLOAT, None)], inits, path)


def linear1024(path: Path, shape) -> Path:
    """MatMul + Add, 1024 -> 1024."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((1024, 1024)) / 32).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(-0.1, 0.1, 1024).astype(np.float32), "b"),
    ]
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    return _save(nodes, [vi("x", TensorProto.FLOAT, list(shape))], [vi("y", TensorProto.FLOAT, None)], inits, path)


def build(workload: str, directory: Path) -> tuple[Path, tuple]:
    """The ONNX file of ``workload`` in ``directory`` and its input shape."""
    builder, shape = WORKLOADS[workload]
    return globals()[builder](directory / f"{workload}.onnx", shape), shape


def make_call(engine: str, path: str, threads: int):
    """A function x -> first output of ``engine`` on the model at ``path`` (whose input is
    named "x") with ``threads``: bench_pauses' engines."""
    from bench.bench_pauses import make_call as feed_call

    call = feed_call(engine, path, threads)
    return lambda x: call({"x": x})


def _neighbour(kind: str, engine: str, path: str):
    """A function x -> None running another thread pool's work for about ``NEIGHBOUR_MS``:
    the other engine on the same model (``kind`` "other") or numpy products ("numpy")."""
    if kind == "other":
        other = make_call("onnxruntime" if engine == "fastlayers" else "fastlayers", path, 2)
    else:
        a = np.random.default_rng(1).standard_normal((512, 512))

        def other(x):
            return a @ a

    def run(x):
        t_end = time.perf_counter() + NEIGHBOUR_MS / 1e3
        other(x)
        while time.perf_counter() < t_end:
            other(x)

    return run


def measure(engine: str, path: str, shape, threads: int, seconds: float, neighbour: str = "", out: str = "") -> dict:
    """Call times of ``engine`` at ``threads`` in this process, in rounds of ``ROUND_CALLS``
    each after ``neighbour``'s work when one is named; the output is saved to ``out`` (.npy)
    when given."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    call = make_call(engine, path, threads)
    other = _neighbour(neighbour, engine, path) if neighbour else None
    y = call(x)
    if out:
        np.save(out, y)
    t_end = time.perf_counter() + min(1.0, seconds / 3)
    while time.perf_counter() < t_end:
        call(x)
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 10:
        if other is not None and len(times) % ROUND_CALLS == 0:
            other(x)
        t0 = time.perf_counter()
        call(x)
        times.append(time.perf_counter() - t0)
    p10, p50, p90 = (float(v) * 1e3 for v in np.percentile(times, [10, 50, 90]))
    return {
        "engine": engine,
        "threads": threads,
        "neighbour": neighbour,
        "calls": len(times),
        "median_ms": p50,
        "p10_ms": p10,
        "p90_ms": p90,
    }


def _child(*args: str) -> dict:
    cmd = [sys.executable, "-m", "bench.bench_scaling", "--child", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(workloads, seconds: float, threads=(1, 2), neighbours=NEIGHBOURS) -> list[dict]:
    """One row per workload: every engine at every thread count, each in a process of its own,
    then each engine at the largest thread count after each neighbour's work."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads:
            path, shape = build(workload, Path(tmp))
            row: dict = {"workload": workload, "shape": list(shape), "runs": []}
            outs = {}
            for engine in ENGINES:
                outs[engine] = str(Path(tmp) / f"{workload}-{engine}.npy")
                for t in threads:
                    r = _child(engine, str(path), json.dumps(shape), str(t), str(seconds), "", outs[engine])
                    row["runs"].append(r)
            a, b = np.load(outs["fastlayers"]), np.load(outs["onnxruntime"])
            row["max_abs_diff"] = float(np.abs(a - b).max())
            if not np.allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max())):
                raise AssertionError(f"{workload}: fastlayers and onnxruntime differ by {row['max_abs_diff']}")
            for engine in ENGINES:
                for kind in neighbours:
                    r = _child(engine, str(path), json.dumps(shape), str(max(threads)), str(seconds), kind, "")
                    row["runs"].append(r)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _find(row, engine, threads, neighbour=""):
    return next(
        (r for r in row["runs"] if (r["engine"], r["threads"], r["neighbour"]) == (engine, threads, neighbour)), None
    )


def render(rows, host) -> str:
    """The markdown table of ``rows``."""

    def cell(r):
        return f"{r['median_ms']:.2f} ({r['p10_ms']:.2f}-{r['p90_ms']:.2f})" if r else "-"

    def ratio(a, b):
        return f"{a['median_ms'] / b['median_ms']:.2f}" if a and b else "-"

    def spread(r):
        return f"{r['p90_ms'] / r['p10_ms']:.2f}" if r else "-"

    def spreads(row, engine):
        runs = [_find(row, engine, 2, kind) for kind in ("",) + NEIGHBOURS]
        return ", ".join(f"{r['median_ms']:.2f} ({spread(r)})" if r else "-" for r in runs)

    lines = [
        f"{host}; median (p10-p90) ms, each engine alone in its own process; then median (p90/p10) at 2 "
        f"threads alone, and in rounds of {ROUND_CALLS} calls after the other engine's or numpy's threads",
        "",
        "| workload | fastlayers 1t | fastlayers 2t | 2t/1t | onnxruntime 1t | onnxruntime 2t | 2t/1t "
        "| fastlayers 2t alone, after onnxruntime, after numpy | onnxruntime 2t alone, after fastlayers, "
        "after numpy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        f1, f2 = _find(row, "fastlayers", 1), _find(row, "fastlayers", 2)
        o1, o2 = _find(row, "onnxruntime", 1), _find(row, "onnxruntime", 2)
        lines.append(
            f"| {row['workload']} | {cell(f1)} | {cell(f2)} | {ratio(f2, f1)} | {cell(o1)} | {cell(o2)} | "
            f"{ratio(o2, o1)} | {spreads(row, 'fastlayers')} | {spreads(row, 'onnxruntime')} |"
        )
    return "\n".join(lines)


def bench_scaling_short():
    """A short pass on the small workloads: the engines agree and every figure is there."""
    from .conftest import oracle

    oracle("onnxruntime")
    rows = run(SHORT[:1], seconds=0.2, threads=(1, 2), neighbours=("numpy",))
    assert len(rows[0]["runs"]) == 6
    assert all(r["median_ms"] > 0 and r["p10_ms"] <= r["p90_ms"] for r in rows[0]["runs"])
    assert "| conv3x3-b8 |" in render(rows, "host")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        engine, path, shape, threads, seconds, neighbour, out = sys.argv[2:9]
        print(json.dumps(measure(engine, path, tuple(json.loads(shape)), int(threads), float(seconds), neighbour, out)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed calls per process")
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), help="these workloads only")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.tools.process_metrics import host_info

    rows = run(args.only or list(WORKLOADS), args.seconds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"host": host_info(), "rows": rows}, indent=1))
    print()
    print(render(rows, host_info()))


if __name__ == "__main__":
    main()
