"""Exported ONNX files (NCHW) as users run them: fastlayers.load against onnxruntime, OpenVINO
and tract on the same file, same input, same thread count.

Every layer and model workload of bench/ is built in torch (reusing the builders of bench_conv,
bench_mlp, bench_rnn, bench_attention and bench_onnx_models), exported with
``torch.onnx.export`` (TorchScript exporter, opset 17; for the attention and Transformer
workloads also the dynamo exporter, which writes a different graph) and loaded by each engine:

- fastlayers: ``fastlayers.load(path)``, ``fastlayers.set_num_threads``;
- onnxruntime: CPUExecutionProvider, ``intra_op_num_threads`` (bench.conftest.ort_session);
- OpenVINO (``pip install openvino``): CPU plugin, ``INFERENCE_NUM_THREADS``,
  ``INFERENCE_PRECISION_HINT`` f32;
- tract (``pip install tract``): the default runtime on the input's concrete shape (tract sets
  no thread count: it runs these graphs on one thread).

Engines not installed are skipped with the reason, as is a workload an engine cannot load or
run (its error is the reason). Outputs are checked equal to fastlayers' (1e-4 relative) before
any timing. Small shapes unless FASTLAYERS_BENCH_FULL=1.

A second set, ``--set kernels`` (``KERNELS``), is one convolution or pool per file at the shapes
where classic CNNs spend their time: pointwise convolutions with many input channels, strided
5x5 and 7x7 stems, depthwise convolutions at stride 1 and 2 (3x3 and MobileNetV3's 5x5),
average and max pools, and ResNet-50's convolutions. It is meant to run at 1 thread, on every
ISA path the host has (``FASTLAYERS_ISA=avx2`` forces the AVX2 path on an AVX-512 host).

Run: FASTLAYERS_BENCH_FULL=1 python bench/bench_onnx_exports.py --threads 2 [--set kernels]
prints, per workload, the median ms per call of each engine over interleaved rounds
(bench/interleaved.py), fastlayers / onnxruntime and fastlayers / OpenVINO, and the geomean of
each ratio over the workloads.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

if __name__ == "__main__":  # the runner: thread count read by bench.conftest at import
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if "--threads" in sys.argv:
        os.environ["FASTLAYERS_BENCH_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import fastlayers
from bench import bench_attention, bench_conv, bench_mlp, bench_onnx_models, bench_rnn
from bench.conftest import THREADS, check_same, oracle, ort_session, torch_module

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
ENGINES = ["fastlayers", "onnxruntime", "openvino", "tract"]
# (workload, exporter): "ts" is the TorchScript exporter, "dynamo" torch.export's
WORKLOADS = [
    ("conv3x3_b1", "ts"),
    ("conv3x3_b8", "ts"),
    ("depthwise3x3_b1", "ts"),
    ("maxpool3x3s2_b1", "ts"),
    ("convtranspose3x3s2_b1", "ts"),
    ("resnet18_conv_b1", "ts"),
    ("digits_mlp_b1", "ts"),
    ("digits_mlp_b8", "ts"),
    ("wide_mlp_b1", "ts"),
    ("wide_mlp_b8", "ts"),
    ("lstm_b1", "ts"),
    ("lstm_b32", "ts"),
    ("bilstm_b1", "ts"),
    ("bilstm_b32", "ts"),
    ("gru_b1", "ts"),
    ("gru_b32", "ts"),
    ("bigru_b1", "ts"),
    ("bigru_b32", "ts"),
    ("mha", "ts"),
    ("mha", "dynamo"),
    ("encoder_layer", "ts"),
    ("encoder_layer", "dynamo"),
    ("bert_tiny", "ts"),
    ("bert_tiny", "dynamo"),
    ("onnx_resnet18", "ts"),
    ("onnx_lstm_classifier", "ts"),
    ("onnx_transformer_encoder", "ts"),
    ("onnx_transformer_encoder", "dynamo"),
]

# name: (torch layer factory, full NCHW input shape, small one: its channels, a small image)
KERNELS = {
    "pointwise256to64_b4": (lambda nn: nn.Conv2d(256, 64, 1), (4, 256, 28, 28), (1, 256, 7, 7)),
    "pointwise64to256_b1": (lambda nn: nn.Conv2d(64, 256, 1), (1, 64, 56, 56), (1, 64, 14, 14)),
    "pointwise1024to256_b1": (lambda nn: nn.Conv2d(1024, 256, 1), (1, 1024, 14, 14), (1, 1024, 7, 7)),
    "pointwise512to2048_b1": (lambda nn: nn.Conv2d(512, 2048, 1), (1, 512, 7, 7), (1, 512, 7, 7)),
    "conv3x3s2_128_b1": (lambda nn: nn.Conv2d(128, 128, 3, 2, 1), (1, 128, 56, 56), (1, 128, 14, 14)),
    "conv3x3_512_7x7_b1": (lambda nn: nn.Conv2d(512, 512, 3, 1, 1), (1, 512, 7, 7), (1, 512, 7, 7)),
    "conv7x7s2_stem_b1": (lambda nn: nn.Conv2d(3, 64, 7, 2, 3), (1, 3, 224, 224), (1, 3, 32, 32)),
    "conv5x5s2_stem_b1": (lambda nn: nn.Conv2d(3, 32, 5, 2, 2), (1, 3, 224, 224), (1, 3, 32, 32)),
    "conv5x5s2_b1": (lambda nn: nn.Conv2d(32, 64, 5, 2, 2), (1, 32, 112, 112), (1, 32, 16, 16)),
    "depthwise3x3s2_b1": (lambda nn: nn.Conv2d(128, 128, 3, 2, 1, groups=128), (1, 128, 56, 56), (1, 128, 14, 14)),
    "depthwise5x5_b1": (lambda nn: nn.Conv2d(120, 120, 5, 1, 2, groups=120), (1, 120, 28, 28), (1, 120, 14, 14)),
    "depthwise5x5s2_b1": (lambda nn: nn.Conv2d(72, 72, 5, 2, 2, groups=72), (1, 72, 56, 56), (1, 72, 14, 14)),
    # MobileNetV3-Large's depthwise convolutions on 14 x 14 and 7 x 7
    "depthwise3x3_14x14_b1": (
        lambda nn: nn.Conv2d(480, 480, 3, 1, 1, groups=480),
        (1, 480, 14, 14),
        (1, 480, 7, 7),
    ),
    "depthwise5x5s2_14x14_b1": (
        lambda nn: nn.Conv2d(672, 672, 5, 2, 2, groups=672),
        (1, 672, 14, 14),
        (1, 672, 7, 7),
    ),
    "depthwise5x5_7x7_b1": (lambda nn: nn.Conv2d(960, 960, 5, 1, 2, groups=960), (1, 960, 7, 7), (1, 960, 7, 7)),
    "avgpool2x2_b1": (lambda nn: nn.AvgPool2d(2), (1, 64, 112, 112), (1, 64, 28, 28)),
    "avgpool3x3s1_b1": (
        lambda nn: nn.AvgPool2d(3, 1, 1, count_include_pad=False),
        (1, 192, 28, 28),
        (1, 192, 14, 14),
    ),
    "maxpool2x2_b1": (lambda nn: nn.MaxPool2d(2), (1, 64, 112, 112), (1, 64, 28, 28)),
    "maxpool3x3s1_b1": (lambda nn: nn.MaxPool2d(3, 1, 1), (1, 192, 28, 28), (1, 192, 14, 14)),
    # GoogLeNet's pool branch on 14 x 14
    "maxpool3x3s1_14x14_b1": (lambda nn: nn.MaxPool2d(3, 1, 1), (1, 480, 14, 14), (1, 480, 7, 7)),
}


def recurrent_module(torch, kind, bidirectional):
    """torch LSTM/GRU over x (batch, time, input) returning h_n (directions, batch, hidden)."""

    class LastState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(
                bench_rnn.INPUT, bench_rnn.HIDDEN, batch_first=True, bidirectional=bidirectional
            )

        def forward(self, x):
            h = self.rnn(x)[1]
            return h[0] if kind == "LSTM" else h

    return LastState()


def _calling_module(torch, inner, call):
    """A torch module whose forward(x) is call(inner, x)."""

    class Calling(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return call(self.inner, x)

    return Calling()


def build(name, rng):
    """(torch module in eval mode, input array) of a workload."""
    torch = torch_module()
    torch.manual_seed(0)
    if name in KERNELS:
        factory, full, small = KERNELS[name]
        return factory(torch.nn).eval(), rng.standard_normal(full if FULL else small).astype(np.float32)
    if name.startswith("onnx_"):
        module, x, _ = bench_onnx_models.exported(torch, name[len("onnx_") :], tempfile.mkdtemp(), FULL)
        return module, x
    base, _, batch = name.rpartition("_b")
    if base in ("conv3x3", "depthwise3x3", "maxpool3x3s2"):
        _, _, module, shape, _ = bench_conv.single_op(base, rng, int(batch))
    elif base == "convtranspose3x3s2":
        s = bench_conv.SHAPES["conv3x3"]
        module = torch.nn.ConvTranspose2d(s["c"], s["c"] // 2, 3, 2, 1, output_padding=1)
        shape = (int(batch), s["c"], s["hw"], s["hw"])
    elif base == "resnet18_conv":
        s = bench_conv.SHAPES["resnet18"]
        module = bench_conv.build_torch_resnet(bench_conv.resnet_spec(rng, s["width"]))
        shape = (int(batch), 3, s["hw"], s["hw"])
    elif base in bench_mlp.WORKLOADS:
        d_in, spec = bench_mlp.WORKLOADS[base]
        module = bench_mlp.build_torch(bench_mlp.build_fastlayers(d_in, spec, rng), spec)
        shape = (int(batch), d_in)
    elif base.endswith(("lstm", "gru")):
        kind = "LSTM" if base.endswith("lstm") else "GRU"
        module = recurrent_module(torch, kind, base.startswith("bi"))
        shape = (int(batch), bench_rnn.STEPS, bench_rnn.INPUT)
    else:  # bench_attention
        module = bench_attention.build_torch(name, rng)
        d, _, _, _, n, batch, steps = bench_attention.shapes(name)
        if n == 0:  # self-attention: the same x as query, key and value
            module = _calling_module(torch, module, lambda m, x: m(x, x, x, need_weights=False)[0])
        elif name == "encoder_layer":
            # torch 2.13's TorchScript exporter traces the layer's default is_causal=False as a
            # tensor, which scaled_dot_product_attention refuses; passed as a bool it exports
            module = _calling_module(torch, module, lambda m, x: m(x, is_causal=False))
        shape = (batch, steps, d)
    return module.eval(), rng.standard_normal(shape).astype(np.float32)


def export(module, x, path, exporter):
    """Write ``module`` at input ``x`` to ``path`` with the TorchScript or dynamo exporter."""
    torch = torch_module()
    with warnings.catch_warnings():  # not under no_grad: torch's Transformer fast path won't export
        warnings.simplefilter("ignore")
        if exporter == "ts":
            torch.onnx.export(
                module, (torch.from_numpy(x),), str(path), dynamo=False, input_names=["x"], opset_version=17
            )
        else:
            torch.onnx.export(
                module,
                (torch.from_numpy(x),),
                str(path),
                dynamo=True,
                input_names=["x"],
                opset_version=18,
                verbose=False,
            )
    return path


def _openvino(path, x):
    import openvino as ov

    compiled = ov.Core().compile_model(
        str(path), "CPU", {"INFERENCE_NUM_THREADS": THREADS, "INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()

    def run(a):
        request.infer({0: a})
        return request.get_output_tensor(0).data.copy()

    return run


def _tract(path, x):
    import tract

    model = tract.onnx().load(str(path))
    dtype = "i64" if x.dtype == np.int64 else "f32"
    model.set_input_fact(0, ",".join(map(str, x.shape)) + "," + dtype)
    runnable = tract.runtime_for_name("default").prepare(model.into_model())
    return lambda a: runnable.run([a])[0].to_numpy()


def _onnxruntime(path, x):
    import onnx

    session = ort_session(onnx.load(str(path)))
    return lambda a: session.run(None, {"x": a})[0]


_MAKERS = {
    "fastlayers": lambda path, x: fastlayers.load(path),
    "onnxruntime": _onnxruntime,
    "openvino": _openvino,
    "tract": _tract,
}
_PACKAGES = {"onnxruntime": "onnxruntime", "openvino": "openvino", "tract": "tract"}


def setup(name, exporter, directory):
    """(input, {engine: callable or the reason it cannot run}) of a workload's export; every
    runnable engine's output checked equal to fastlayers' first."""
    oracle("onnx")
    module, x = build(name, np.random.default_rng(0))
    path = Path(directory) / f"{name}-{exporter}.onnx"
    try:
        export(module, x, path, exporter)
    except Exception as exc:  # noqa: BLE001 - recorded as the workload's reason
        return x, {e: f"{exporter} export failed: {type(exc).__name__}: {str(exc)[:160]}" for e in ENGINES}
    fns = {}
    for engine in ENGINES:
        package = _PACKAGES.get(engine)
        if package and importlib.util.find_spec(package) is None:
            fns[engine] = f"{package} is not installed (pip install {package})"
            continue
        try:
            fn = _MAKERS[engine](path, x)
            fn(x)
            fns[engine] = fn
        except Exception as exc:  # noqa: BLE001 - an engine's refusal is recorded, not fatal
            fns[engine] = f"{engine} cannot run it: {type(exc).__name__}: {str(exc)[:160]}"
    if callable(fns["fastlayers"]):
        outs = {e: np.asarray(f(x)) for e, f in fns.items() if callable(f)}
        scale = max(float(np.max(np.abs(outs["fastlayers"]))), 1.0)
        check_same(outs, rtol=1e-4, atol=1e-5 * scale)
    return x, fns


ALL = WORKLOADS + [(name, "ts") for name in KERNELS]


@pytest.fixture(scope="module", params=ALL, ids=[f"{w}-{e}" for w, e in ALL])
def engines(request, tmp_path_factory):
    name, exporter = request.param
    if exporter == "dynamo" and not FULL:
        pytest.skip("dynamo exports (about 5 s each) only with FASTLAYERS_BENCH_FULL=1")
    return name, exporter, *setup(name, exporter, tmp_path_factory.mktemp("exports"))


@pytest.mark.parametrize("engine", ENGINES)
def bench_onnx_export(benchmark, engines, engine):
    name, exporter, x, fns = engines
    if not callable(fns[engine]):
        pytest.skip(fns[engine])
    benchmark.group = f"onnx export {name} ({exporter})"
    benchmark.extra_info.update(workload=f"onnx export {name} {exporter}", batch=x.shape[0], engine=engine)
    benchmark(fns[engine], x)


# ------------------------------------------------------------------------------------ runner
def main() -> None:
    import argparse
    import time

    from bench.interleaved import interleave

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--round-seconds", type=float, default=0.05, help="about how long each engine's round runs")
    parser.add_argument("-k", default="", help="only workloads whose name contains this")
    parser.add_argument(
        "--set", choices=["exports", "kernels"], default="exports", help="the layer and model exports, or KERNELS"
    )
    args = parser.parse_args()
    fastlayers.set_num_threads(args.threads)
    rows, reasons = [], []
    directory = tempfile.mkdtemp()
    chosen = WORKLOADS if args.set == "exports" else [(name, "ts") for name in KERNELS]
    for name, exporter in chosen:
        if args.k not in name:
            continue
        x, fns = setup(name, exporter, directory)
        failed = {fn for fn in fns.values() if not callable(fn)}
        for reason in sorted(failed):
            reasons.append(
                f"{name} ({exporter}) " + ", ".join(e for e, f in fns.items() if f == reason) + f": {reason}"
            )
        runnable = {e: (lambda f=f: f(x)) for e, f in fns.items() if callable(f)}
        if "fastlayers" not in runnable:
            continue
        runnable["fastlayers"]()  # the first call builds the plan: rounds are sized from warm calls
        start = time.perf_counter()
        for _ in range(3):
            runnable["fastlayers"]()
        calls = int(np.clip(args.round_seconds * 3 / (time.perf_counter() - start), 3, 300))
        times = interleave(runnable, calls, args.rounds, f"{name}-{exporter}")
        rows.append((f"{name} ({exporter})", {e: float(np.median(t)) for e, t in times.items()}))
    print(f"\nthreads {args.threads}; median ms per call; ratio = fastlayers / engine\n")
    print("| workload | " + " | ".join(ENGINES) + " | / onnxruntime | / OpenVINO |")
    print("| --- |" + " ---: |" * (len(ENGINES) + 2))
    ratios = {"onnxruntime": [], "openvino": []}
    for label, med in rows:
        cells = [f"{med[e]:.3f}" if e in med else "-" for e in ENGINES]
        for e in ratios:
            if e in med:
                ratios[e].append(med["fastlayers"] / med[e])
        cells += [f"{med['fastlayers'] / med[e]:.2f}" if e in med else "-" for e in ratios]
        print(f"| {label} | " + " | ".join(cells) + " |")
    geo = [f"{np.exp(np.mean(np.log(r))):.2f} ({len(r)})" if r else "-" for r in ratios.values()]
    print("| geomean (workloads) |" + " |" * len(ENGINES) + " " + " | ".join(geo) + " |")
    for reason in reasons:
        print(f"- {reason}")


if __name__ == "__main__":
    main()
