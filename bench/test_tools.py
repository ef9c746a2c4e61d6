"""bench/tools/report.py and bench/tools/process_metrics.py produce what docs/benchmarks.md is made of."""

import json

import pytest

from bench.conftest import oracle
from bench.tools import process_metrics, report


def fake_run(threads, rows):
    return {
        "machine_info": {"cpu": {"brand_raw": "Test CPU", "count": 2}, "python_version": "3.x"},
        "datetime": "2026-01-01T00:00:00",
        "fastlayers_bench": {"threads": threads, "versions": {"numpy": "2"}},
        "benchmarks": [{"extra_info": extra, "stats": {"median": median}} for extra, median in rows],
    }


def test_report_tables_ratios_gflops_and_chart(tmp_path):
    oracle("matplotlib")
    run = fake_run(
        2,
        [
            ({"workload": "sgemm 256", "batch": 1, "engine": "numpy", "flops": 2e9}, 0.01),  # 200 GFLOP/s
            ({"workload": "conv", "batch": 8, "engine": "fastlayers-cpu", "flops": 1e9}, 0.01),
            ({"workload": "conv", "batch": 8, "engine": "onnxruntime", "flops": 1e9}, 0.02),
            ({"workload": "conv", "batch": 8, "engine": "torch", "flops": 1e9}, 0.005),
            ({"workload": "relu", "batch": 1, "engine": "fastlayers-cpu"}, 2e-6),
        ],
    )
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "bench.md"
    assert report.main([str(path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "measured sgemm peak at 2 thread(s): 200.0 GFLOP/s" in text
    assert "| conv | 8 | 2 | 10.00 ms | - | 20.00 ms | - | 5.00 ms | 0.50 | 2.00 | 100.0 | 50 % |" in text
    assert "| relu | 1 | 2 | 2.0 µs |" in text
    assert out.with_suffix(".png").stat().st_size > 1000


HOST = {"cpu": "Test CPU", "isa": "avx2", "cores": 4}


def test_report_process_metrics_table_per_metric_beside_onnxruntime(tmp_path):
    oracle("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(fake_run(2, [({"workload": "relu", "batch": 1, "engine": "fastlayers-cpu"}, 2e-6)])))
    records = [
        {
            "metric": "installed_mib",
            "model": "core install",
            "engine": "fastlayers",
            "value": 100.0,
            "repeats": 1,
            "distributions": ["fastlayers 0.1", "numpy 2"],
        },
        {
            "metric": "installed_mib",
            "model": "core install",
            "engine": "onnxruntime",
            "value": 50.0,
            "repeats": 1,
            "distributions": ["numpy 2", "onnxruntime 1"],
        },
        {"metric": "first_prediction_s", "model": "m", "engine": "fastlayers", "value": 0.6, "repeats": 3},
        {"metric": "first_prediction_s", "model": "m", "engine": "onnxruntime", "value": 0.3, "repeats": 3},
        {"metric": "first_call_s", "model": "m", "engine": "fastlayers", "value": 1.2, "repeats": 3},
        {"metric": "first_call_s", "model": "m", "engine": "onnxruntime", "value": 0.3, "repeats": 3},
        {"metric": "first_over_steady_call", "model": "m", "engine": "fastlayers", "value": 1.5, "repeats": 3},
        {"metric": "load_time_over_read_time", "model": "big", "engine": "fastlayers", "value": 2.0, "repeats": 3},
    ]
    proc = tmp_path / "proc.json"
    proc.write_text(json.dumps({"threads": 2, "host": HOST, "records": records}))
    out = tmp_path / "bench.md"
    assert report.main([str(path), "--process", str(proc), "--out", str(out)]) == 0
    text = out.read_text()
    assert "on Test CPU (ISA path avx2, 4 cores), 2 threads; the processes run the fresh venvs'" in text
    assert "the median over 3 processes" in text
    assert "### Installed size" in text and "| core install | 100.0 MiB | 50.0 MiB | 2.00 |" in text
    assert "- fastlayers installed: fastlayers 0.1, numpy 2" in text
    assert "- onnxruntime installed: numpy 2, onnxruntime 1" in text
    assert "### New process: import to first prediction" in text and "| m | 600.00 ms | 300.00 ms | 2.00 |" in text
    assert "| m | 1.50x |\n" in text and "| big | 2.00x |\n" in text  # fastlayers only: one column
    assert "| m | 1.20 s | 300.00 ms | 4.00 |" in text
    assert "### Peak memory" not in text  # no records, no table
    proc.write_text(
        json.dumps(
            {
                "threads": 2,
                "host": HOST,
                "records": [
                    {"metric": "cold_start_s", "model": "m", "engine": "onnxruntime", "value": 0.3, "repeats": 1}
                ],
            }
        )
    )
    with pytest.raises(ValueError, match="cold_start_s"):
        report.main([str(path), "--process", str(proc), "--out", str(out)])


def test_report_contention_table(tmp_path):
    oracle("matplotlib")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(fake_run(2, [({"workload": "relu", "batch": 1, "engine": "fastlayers-cpu"}, 2e-6)])))
    row = {
        "workload": "demo digits_cnn",
        "batch": 300,
        "quiet_1t_us": 1200.0,
        "quiet_2t_us": 700.0,
        "busy_1t_us": 1300.0,
        "busy_2t_us": 1560.0,
        "busy_2t_over_1t": 1.2,
    }
    contention = tmp_path / "contention.json"
    contention.write_text(
        json.dumps(
            {
                "host": HOST,
                "rows": [
                    {**row, "engine": "fastlayers", "forked_2t_us": 710.0},
                    {
                        **row,
                        "engine": "onnxruntime",
                        "busy_2t_us": 2600.0,
                        "busy_2t_over_1t": 2.0,
                        "forked_2t_us": None,
                    },
                ],
            }
        )
    )
    out = tmp_path / "bench.md"
    assert report.main([str(path), "--contention", str(contention), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Calls under contention" in text and "on Test CPU (ISA path avx2, 4 cores)" in text
    assert "| demo digits_cnn | 300 | fastlayers | 1.20 ms | 700.0 µs | 1.30 ms | 1.56 ms | 1.20 | 710.0 µs |" in text
    assert "| demo digits_cnn | 300 | onnxruntime | 1.20 ms | 700.0 µs | 1.30 ms | 2.60 ms | 2.00 | - |" in text


def test_report_takes_each_engines_best_median_over_runs(tmp_path):
    paths = []
    for i, (ours, ort) in enumerate([(0.03, 0.02), (0.01, 0.04), (0.02, 0.03)]):
        path = tmp_path / f"run{i}.json"
        path.write_text(
            json.dumps(
                fake_run(
                    2,
                    [
                        ({"workload": "conv", "batch": 1, "engine": "fastlayers-cpu"}, ours),
                        ({"workload": "conv", "batch": 1, "engine": "onnxruntime"}, ort),
                    ],
                )
            )
        )
        paths.append(str(path))
    rows, _, meta = report.load_runs(paths)
    assert rows[("conv", 1, 2)] == {"fastlayers-cpu": 0.01, "onnxruntime": 0.02}
    assert "3 runs; each engine's row is its lowest median" in report.render(rows, {}, meta)


def test_report_recurrent_weight_rates_against_copy_bandwidth(tmp_path):
    paths = []
    for i, gbps in enumerate([30.0, 45.0]):
        path = tmp_path / f"run{i}.json"
        path.write_text(
            json.dumps(
                fake_run(
                    2,
                    [
                        (
                            {
                                "workload": "lstm_b1",
                                "batch": 1,
                                "engine": "fastlayers-cpu",
                                "recurrent_weight_gbps": gbps,
                            },
                            0.001,
                        ),
                        ({"workload": "np.copyto 256 MiB", "engine": "numpy", "gbps_read_plus_write": 20.0 + i}, 0.02),
                    ],
                )
            )
        )
        paths.append(str(path))
    rates = report.load_rates(paths)
    assert rates == {("lstm_b1", 2, "fastlayers-cpu"): 45.0, ("np.copyto 256 MiB", 2, "numpy"): 21.0}
    rows, flops, meta = report.load_runs(paths)
    text = report.render(rows, flops, meta, None, rates)
    assert "| lstm_b1 | 2 | fastlayers-cpu | 45.0 | 2.14 |" in text
    assert "memory copy bandwidth at 2 thread(s): 21.0 GB/s" in text


def test_process_metrics_beside_onnxruntime_in_new_processes(tmp_path):
    oracle("onnxruntime")
    oracle("onnx")
    oracle("keras")
    oracle("torch")
    out = tmp_path / "pm.json"
    assert process_metrics.main(["--repeats", "1", "--load-mb", "2", "--small", "--no-install", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["threads"] == 2 and set(data["host"]) == {"cpu", "isa", "cores"}
    records = data["records"]
    models = {
        "digits_mlp (demo)",
        "digits_cnn (demo)",
        "digits_lstm (demo)",
        "digits_transformer (demo)",
        "resnet18 1x3x32x32 (.onnx)",
        "lstm_classifier 8x12 (.onnx)",
        "transformer_encoder 1x16x32 (.onnx)",
    }
    for metric in ("first_prediction_s", "first_call_s", "steady_call_s", "first_over_steady_call", "peak_rss_mib"):
        got = {(r["model"], r["engine"]) for r in records if r["metric"] == metric}
        assert got == {(m, e) for m in models for e in ("fastlayers", "onnxruntime")}, metric
    assert not any(r["metric"] == "installed_mib" for r in records)  # --no-install
    assert all(r["value"] > 0 for r in records if r["metric"] != "load_peak_rss_over_weights")
    assert all(r["value"] >= 0 for r in records)
    value = {(r["metric"], r["model"], r["engine"]): r["value"] for r in records}
    for model in models:  # one process each: the ratio is that process's
        for engine in ("fastlayers", "onnxruntime"):
            ratio = value[("first_call_s", model, engine)] / value[("steady_call_s", model, engine)]
            assert value[("first_over_steady_call", model, engine)] == pytest.approx(ratio)
    load = {r["model"] for r in records if r["metric"] == "load_time_over_read_time"}
    assert {m.split("(")[1] for m in load} == {".keras)", ".h5)", ".flm)"}


def test_int8_benchmark_picks_quantized_operators():
    from bench.bench_onnx_int8 import quantized_operator

    quantized = [
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLinear",
        "DynamicQuantizeLSTM",
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QGemm",
        "QAttention",
    ]
    plain = ["MatMul", "Conv", "LSTM", "Gemm", "Add", "If", "Cast"]
    assert [quantized_operator(op) for op in quantized] == [True] * len(quantized)
    assert [quantized_operator(op) for op in plain] == [False] * len(plain)


@pytest.mark.parametrize("int8", [False, True])
def test_products_benchmark_checks_both_engines_outputs(int8, capsys):
    """bench_products: one MatMul / MatMulInteger node, fastlayers' output equal to the exact
    (int8) or onnxruntime's (float) product before any timing, then interleaved rounds."""
    oracle("onnxruntime")
    from bench import bench_products

    engines = bench_products.product_engines(7, 33, 17, 1, int8=int8)
    assert set(engines) == {"fastlayers", "onnxruntime"}
    assert engines["fastlayers"]().shape == engines["onnxruntime"]()[0].shape == (7, 17)
    bench_products.main(["7x33x17", "--rounds", "1", "--calls", "1"] + (["--int8"] if int8 else []))
    assert "x onnxruntime per round" in capsys.readouterr().out
