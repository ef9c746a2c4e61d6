"""bench/report.py and bench/process_metrics.py produce what docs/benchmarks.md is made of."""

import json

import pytest

from bench import process_metrics, report

from .conftest import oracle


def fake_run(threads, rows):
    return {"machine_info": {"cpu": {"brand_raw": "Test CPU", "count": 2}, "python_version": "3.x"},
            "datetime": "2026-01-01T00:00:00", "fastlayers_bench": {"threads": threads, "versions": {"numpy": "2"}},
            "benchmarks": [{"extra_info": extra, "stats": {"median": median}} for extra, median in rows]}


def test_report_tables_ratios_gflops_and_chart(tmp_path):
    oracle("matplotlib")
    run = fake_run(2, [
        ({"workload": "sgemm 256", "batch": 1, "engine": "numpy", "flops": 2e9}, 0.01),  # 200 GFLOP/s
        ({"workload": "conv", "batch": 8, "engine": "fastlayers-cpu", "flops": 1e9}, 0.01),
        ({"workload": "conv", "batch": 8, "engine": "onnxruntime", "flops": 1e9}, 0.02),
        ({"workload": "conv", "batch": 8, "engine": "torch", "flops": 1e9}, 0.005),
        ({"workload": "relu", "batch": 1, "engine": "fastlayers-cpu"}, 2e-6),
    ])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    proc = tmp_path / "proc.json"
    proc.write_text(json.dumps({"threads": 2, "records": [
        {"metric": "cold_start_s", "model": "m", "engine": "onnxruntime", "value": 0.3, "repeats": 1}]}))
    out = tmp_path / "bench.md"
    assert report.main([str(path), "--process", str(proc), "--out", str(out)]) == 0
    text = out.read_text()
    assert "measured sgemm peak at 2 thread(s): 200.0 GFLOP/s" in text
    assert "| conv | 8 | 2 | 10.00 ms | - | 20.00 ms | - | 5.00 ms | 0.50 | 2.00 | 100.0 | 50 % |" in text
    assert "| relu | 1 | 2 | 2.0 µs |" in text and "| m | cold start | onnxruntime | 0.300 s |" in text
    assert out.with_suffix(".png").stat().st_size > 1000


def test_report_takes_each_engines_best_median_over_runs(tmp_path):
    paths = []
    for i, (ours, ort) in enumerate([(0.03, 0.02), (0.01, 0.04), (0.02, 0.03)]):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(fake_run(2, [
            ({"workload": "conv", "batch": 1, "engine": "fastlayers-cpu"}, ours),
            ({"workload": "conv", "batch": 1, "engine": "onnxruntime"}, ort)])))
        paths.append(str(path))
    rows, _, meta = report.load_runs(paths)
    assert rows[("conv", 1, 2)] == {"fastlayers-cpu": 0.01, "onnxruntime": 0.02}
    assert "3 runs; each engine's row is its lowest median" in report.render(rows, {}, meta)


def test_report_recurrent_weight_rates_against_copy_bandwidth(tmp_path):
    paths = []
    for i, gbps in enumerate([30.0, 45.0]):
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(fake_run(2, [
            ({"workload": "lstm_b1", "batch": 1, "engine": "fastlayers-cpu",
              "recurrent_weight_gbps": gbps}, 0.001),
            ({"workload": "np.copyto 256 MiB", "engine": "numpy",
              "gbps_read_plus_write": 20.0 + i}, 0.02)])))
        paths.append(str(path))
    rates = report.load_rates(paths)
    assert rates == {("lstm_b1", 2, "fastlayers-cpu"): 45.0, ("np.copyto 256 MiB", 2, "numpy"): 21.0}
    rows, flops, meta = report.load_runs(paths)
    text = report.render(rows, flops, meta, None, rates)
    assert "| lstm_b1 | 2 | fastlayers-cpu | 45.0 | 2.14 |" in text
    assert "memory copy bandwidth at 2 thread(s): 21.0 GB/s" in text


def test_process_metrics_measures_cold_start_and_memory(tmp_path):
    oracle("onnxruntime")
    oracle("onnx")
    out = tmp_path / "pm.json"
    oracle("keras")
    oracle("torch")
    assert process_metrics.main(["--repeats", "1", "--load-mb", "2", "--small", "--out", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    got = {(r["metric"], r["engine"]) for r in records}
    assert ("cold_start_s", "fastlayers (warm cache)") in got and ("cold_start_s", "onnxruntime") in got
    assert ("peak_rss_mib", "fastlayers") in got and ("peak_rss_mib", "onnxruntime") in got
    assert all(r["value"] > 0 for r in records if r["metric"] != "load_peak_rss_over_weights")
    assert all(r["value"] >= 0 for r in records)
    load = {r["model"] for r in records if r["metric"] == "load_time_over_read_time"}
    assert {m.split("(")[1] for m in load} == {".keras)", ".h5)", ".flm)"}
    assert {r["model"] for r in records if r["metric"] == "cold_start_s"} == {
        "digits_mlp (demo)", "resnet18 1x3x32x32 (.onnx)", "lstm_classifier 8x12 (.onnx)",
        "transformer_encoder 1x16x32 (.onnx)"}
    empty = next(r["value"] for r in records if r["engine"] == "fastlayers (empty cache)")
    warm = next(r["value"] for r in records if r["engine"] == "fastlayers (warm cache)")
    assert empty > warm  # compiling costs more than loading the cache
