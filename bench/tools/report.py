"""Turn benchmark runs into docs/benchmarks.md and a bar chart of the speed ratios.

    python -m pytest bench --benchmark-enable --benchmark-json=bench/run-2t.json
    FASTLAYERS_BENCH_THREADS=1 python -m pytest bench --benchmark-enable --benchmark-json=bench/run-1t.json
    python -m bench.tools.process_metrics --out bench/process_metrics.json
    python -m bench.contention --out bench/contention.json
    python -m bench.tools.report bench/run-2t.json bench/run-1t.json --process bench/process_metrics.json \
        --contention bench/contention.json

Each benchmark carries ``extra_info`` workload, batch and engine (and ``flops`` per call for
GEMM-bound rows). Rows are (workload, batch, threads); columns are the engines' medians; ratios
are fastlayers-cpu over onnxruntime (spinning, its default) and over torch. Process metrics get
a table each (fastlayers, onnxruntime, their ratio) and the contention runs one table, each
naming its host. The output is one host's section of docs/benchmarks.md: paste it under that
host's heading (the default ``--out`` is bench/results/report.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "onnxruntime-nospin", "torch"]


def load_runs(paths):
    """Rows {(workload, batch, threads): {engine: median seconds}}, flops, run metadata; with
    several runs at one thread count, each engine's lowest median over them."""
    rows, flops, meta = {}, {}, []
    for path in paths:
        data = json.loads(Path(path).read_text())
        info = data.get("fastlayers_bench", {})
        threads = info.get("threads")
        meta.append(
            {
                "machine": data.get("machine_info", {}),
                "versions": info.get("versions", {}),
                "threads": threads,
                "datetime": data.get("datetime", ""),
                "path": str(path),
            }
        )
        for bench in data["benchmarks"]:
            extra = bench.get("extra_info", {})
            if "workload" not in extra or "engine" not in extra:
                continue
            key = (extra["workload"], extra.get("batch", 1), threads)
            engines = rows.setdefault(key, {})
            median = bench["stats"]["median"]
            # several runs at one thread count: each engine's best median (host noise only adds)
            engines[extra["engine"]] = min(median, engines.get(extra["engine"], median))
            if "flops" in extra:
                flops[key] = extra["flops"]
    return rows, flops, meta


def load_rates(paths):
    """Streaming rates in GB/s, {(workload, threads, engine): best over the runs}: the batch-1
    recurrent benchmarks' ``recurrent_weight_gbps`` (recurrent weights read per step) and the
    memory benchmark's ``gbps_read_plus_write`` (this machine's copy bandwidth)."""
    rates = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        threads = data.get("fastlayers_bench", {}).get("threads")
        for bench in data["benchmarks"]:
            extra = bench.get("extra_info", {})
            for field in ("recurrent_weight_gbps", "gbps_read_plus_write"):
                if field in extra and "workload" in extra:
                    key = (extra["workload"], threads, extra.get("engine", "?"))
                    rates[key] = max(extra[field], rates.get(key, 0.0))
    return rates


def render_rates(rates) -> list[str]:
    """The recurrent weights' read rate at batch 1 against the copy bandwidth, per thread count."""
    copy = {k[1]: v for k, v in rates.items() if k[0].startswith("np.copyto")}
    keys = sorted(k for k in rates if not k[0].startswith("np.copyto"))
    if not keys:
        return []
    lines = [
        "",
        "## Recurrent weights read per step (batch 1)",
        "",
        "GB/s at which each step's recurrent weights (hidden x gates x hidden float32) are "
        "read: weight bytes x steps / the fastest call, against this machine's memory copy "
        "bandwidth (`np.copyto` of 256 MiB, read + write). The weights (768 KiB-1 MiB) stay "
        "in the cores' L2/L3 caches, so rates above the memory's are cache rates.",
        "",
        "| workload | threads | engine | GB/s | x memory copy bandwidth |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for workload, threads, engine in keys:
        gbps, mem = rates[(workload, threads, engine)], copy.get(threads)
        lines.append(f"| {workload} | {threads} | {engine} | {gbps:.1f} | {'-' if not mem else f'{gbps / mem:.2f}'} |")
    lines += [f"- memory copy bandwidth at {t} thread(s): {v:.1f} GB/s" for t, v in sorted(copy.items())]
    return lines


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    if us >= 1e6:
        return f"{seconds:,.2f} s"
    return f"{us:,.1f} µs" if us < 1000 else f"{us / 1000:,.2f} ms"


def ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def sgemm_peak(rows, flops):
    """Best measured sgemm GFLOP/s per thread count."""
    peak = {}
    for key, engines in rows.items():
        if key[0].startswith("sgemm") and key in flops and "numpy" in engines:
            peak[key[2]] = max(peak.get(key[2], 0.0), flops[key] / engines["numpy"] / 1e9)
    return peak


def host_line(host: dict) -> str:
    """``CPU (ISA path isa, n cores)`` of a process-metrics or contention JSON's host entry."""
    return f"{host.get('cpu', '?')} (ISA path {host.get('isa', '?')}, {host.get('cores', '?')} cores)"


def fmt_mib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib:,.1f} MiB"


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}x"


#: Process metric -> (title, what it is, value format), in the report's order.
PROCESS_METRICS = {
    "installed_mib": (
        "Installed size",
        "Bytes of site-packages in a fresh venv after `pip install` minus an "
        "empty venv's: fastlayers with its core dependencies against `onnxruntime numpy` (target: "
        "fastlayers no larger).",
        fmt_mib,
    ),
    "first_prediction_s": (
        "New process: import to first prediction",
        "Wall time of a new interpreter running "
        "import + load + first call; onnxruntime: import + session + first run (target: "
        "fastlayers no slower).",
        fmt_time,
    ),
    "peak_rss_mib": (
        "Peak memory",
        "Peak RSS (VmHWM) of a new process that loads the model and runs it 21 "
        "times (target: fastlayers at most 1.2x onnxruntime).",
        fmt_mib,
    ),
    "first_over_steady_call": (
        "First call against steady call",
        "The first call's time over the median of the 20 "
        "calls after it, in the 21-call process above (target: at most 2x for fastlayers).",
        fmt_x,
    ),
    "first_call_s": ("First call", "The first call's time in the 21-call process.", fmt_time),
    "steady_call_s": (
        "Steady call",
        "The median of the 20 calls after the first one in the 21-call process.",
        fmt_time,
    ),
    "load_time_over_read_time": (
        "Load time / file read time",
        "Load time of a model of Dense layers over the time to read its file's bytes (fastlayers only).",
        fmt_x,
    ),
    "load_peak_rss_over_weights": (
        "Peak RSS growth during load / weight bytes",
        "The same models' peak RSS growth while loading, over their weight bytes (fastlayers only).",
        fmt_x,
    ),
}


def render_process(process: dict) -> list[str]:
    """A table per metric of bench/tools/process_metrics.py's JSON: fastlayers, onnxruntime, ratio."""
    by_metric = {}
    for r in process["records"]:
        by_metric.setdefault(r["metric"], []).append(r)
    unknown = set(by_metric) - set(PROCESS_METRICS)
    if unknown:
        raise ValueError(
            f"unknown process metrics {sorted(unknown)} (a JSON from an older bench/tools/process_metrics.py?)"
        )
    repeats = max(r["repeats"] for r in process["records"])
    children = (
        "the fresh venvs' interpreters"
        if "installed_mib" in by_metric
        else "the measuring interpreter (`--no-install`)"
    )
    lines = [
        "",
        "## New processes: installed size, first prediction, memory",
        "",
        f"`bench/tools/process_metrics.py` on {host_line(process.get('host', {}))}, "
        f"{process.get('threads')} threads; the processes run {children}; each figure is "
        f"the median over {repeats} process{'es' if repeats > 1 else ''}. onnxruntime runs the demo models' torch twins "
        "exported to ONNX, and the ONNX models' same .onnx file as fastlayers; a ratio below "
        "1.00 means fastlayers is smaller or faster.",
    ]
    for metric, (title, text, fmt) in PROCESS_METRICS.items():
        records = by_metric.get(metric, [])
        if not records:
            continue
        values = {(r["model"], r["engine"]): r["value"] for r in records}
        lines += ["", f"### {title}", "", text, ""]
        models = dict.fromkeys(r["model"] for r in records)
        if all(r["engine"] == "fastlayers" for r in records):
            lines += ["| model | fastlayers |", "| --- | ---: |"]
            lines += [f"| {model} | {fmt(values[(model, 'fastlayers')])} |" for model in models]
            continue
        lines += ["| model | fastlayers | onnxruntime | fastlayers / onnxruntime |", "| --- | ---: | ---: | ---: |"]
        for model in models:
            ours, ort = values.get((model, "fastlayers")), values.get((model, "onnxruntime"))
            lines.append(f"| {model} | {fmt(ours)} | {fmt(ort)} | {ratio(ours, ort)} |")
        lines += [
            f"- {r['engine']} installed: {', '.join(r['distributions'])}" for r in records if "distributions" in r
        ]
    return lines


def render_contention(contention: dict) -> list[str]:
    """bench/contention.py's rows: quiet and busy 1-/2-thread times, busy 2t/1t, forked child."""

    def us(value):
        return fmt_time(None if value is None else value * 1e-6)

    lines = [
        "",
        "## Calls under contention",
        "",
        f"`bench/contention.py` on {host_line(contention['host'])}: median call time with the "
        "machine quiet and beside a busy-loop process (`while True: pass`), at 1 and 2 "
        "threads; busy 2t / 1t is the busy 2-thread time over the busy 1-thread time "
        "(target: within 1.3 for fastlayers). Forked child: fastlayers' 2-thread calls in a "
        "child forked after the parent ran them (machine quiet; compare with quiet 2t).",
        "",
        "| workload | batch | engine | quiet 1t | quiet 2t | busy 1t | busy 2t | busy 2t / 1t | forked child 2t |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in contention["rows"]:
        lines.append(
            f"| {r['workload']} | {r['batch']} | {r['engine']} | {us(r['quiet_1t_us'])} | "
            f"{us(r['quiet_2t_us'])} | {us(r['busy_1t_us'])} | {us(r['busy_2t_us'])} | "
            f"{r['busy_2t_over_1t']:.2f} | {us(r['forked_2t_us'])} |"
        )
    return lines


def render(rows, flops, meta, process=None, rates=None, contention=None) -> str:
    peak = sgemm_peak(rows, flops)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench.tools.report` from pytest-benchmark runs (medians; lower is better; a "
        "ratio below 1.00 means fastlayers is faster). Every engine gets the same inputs and "
        "weights and the same thread count, and outputs are checked equal before timing.",
        "",
    ]
    lines += ["## Runs", ""]
    for m in meta:
        cpu = m["machine"].get("cpu", {})
        versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        lines.append(
            f"- `{m['path']}`: {m['threads']} thread(s), {cpu.get('brand_raw', '?')} "
            f"({cpu.get('count', '?')} cores), Python {m['machine'].get('python_version', '?')}, "
            f"{m['datetime'][:16]}; {versions}"
        )
    counts = {}
    for m in meta:
        counts[m["threads"]] = counts.get(m["threads"], 0) + 1
    for threads, count in sorted(counts.items(), key=lambda kv: kv[0] or 0):
        if count > 1:
            lines.append(
                f"- {threads} thread(s): {count} runs; each engine's row is its lowest "
                "median over them (every engine gets the same treatment)"
            )
    for threads, gflops in sorted(peak.items()):
        lines.append(f"- measured sgemm peak at {threads} thread(s): {gflops:.1f} GFLOP/s")
    lines += [
        "",
        "## Latency",
        "",
        "| workload | batch | threads | fastlayers cpu | fastlayers reference | onnxruntime | "
        "onnxruntime (no spin) | torch | cpu / onnxruntime | cpu / torch | GFLOP/s | % of sgemm |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2] or 0)):
        if key[0].startswith("sgemm"):
            continue
        e = rows[key]
        cpu = e.get("fastlayers-cpu")
        gf = share = "-"
        if key in flops and cpu:
            g = flops[key] / cpu / 1e9
            gf = f"{g:.1f}"
            if key[2] in peak:
                share = f"{100 * g / peak[key[2]]:.0f} %"
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | "
            + " | ".join(fmt_time(e.get(n)) for n in ENGINES)
            + f" | {ratio(cpu, e.get('onnxruntime'))} | {ratio(cpu, e.get('torch'))} | {gf} | {share} |"
        )
    lines += render_rates(rates or {})
    if process:
        lines += render_process(process)
    if contention:
        lines += render_contention(contention)
    lines += ["", "![fastlayers cpu time / other engine's time](benchmarks.png)", ""]
    return "\n".join(lines)


def chart(rows, path: Path) -> None:
    """Horizontal bars of fastlayers-cpu / onnxruntime and / torch per row (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in sorted(rows) if not k[0].startswith("sgemm") and "fastlayers-cpu" in rows[k]]
    labels = [f"{k[0]} b{k[1]} t{k[2]}" for k in keys]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(keys) + 1.5))
    for offset, other, color in [(-0.2, "onnxruntime", "tab:blue"), (0.2, "torch", "tab:orange")]:
        vals = [rows[k]["fastlayers-cpu"] / rows[k][other] if other in rows[k] else float("nan") for k in keys]
        ax.barh(
            [i + offset for i in range(len(keys))], vals, height=0.4, color=color, label=f"fastlayers cpu / {other}"
        )
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(keys)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time ratio (below 1: fastlayers faster)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="pytest-benchmark JSON files")
    parser.add_argument("--process", help="JSON written by bench/tools/process_metrics.py")
    parser.add_argument("--contention", help="JSON written by bench/contention.py")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "report.md"))
    args = parser.parse_args(argv)
    rows, flops, meta = load_runs(args.runs)
    process = json.loads(Path(args.process).read_text()) if args.process else None
    contention = json.loads(Path(args.contention).read_text()) if args.contention else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rows, flops, meta, process, load_rates(args.runs), contention))
    chart(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
