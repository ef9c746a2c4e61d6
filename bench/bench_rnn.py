"""Recurrent layers: fastlayers (cpu, reference) vs onnxruntime vs torch, float32, same inputs.

Workloads: LSTM hidden 256, input 128, T = 100 at batch 1 and 32; GRU the same at
batch 1; a 2-layer LSTM text classifier (Embedding 5000x128, LSTM 128, LSTM 128, Dense 5
softmax) at T = 64, batch 8. By default the sequences are short (T = 10 and 16) so CI stays
cheap; set FASTLAYERS_BENCH_FULL=1 for the sizes above. Every engine returns the last hidden
state (or the class probabilities); outputs are compared before timing.

At batch 1, ``extra_info["recurrent_weight_gbps"]`` is the rate at which the recurrent weights
(hidden x gates*hidden float32, read once per step) are streamed: bytes * T / seconds, to set
against the machine's memory bandwidth (``bench_memory_bandwidth`` below: a large np.copyto).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

from ._rnn_onnx import gru_onnx_weights, lstm_onnx_weights, recurrent_model
from .conftest import check_same, oracle, ort_session, torch_module

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
STEPS = 100 if FULL else 10
TEXT_STEPS = 64 if FULL else 16
INPUT, HIDDEN = 128, 256
VOCAB, EMBED, TEXT_HIDDEN, CLASSES, TEXT_BATCH = 5000, 128, 128, 5, 8
ENGINES = ["fastlayers-cpu", "fastlayers-reference", "onnxruntime", "torch"]
WORKLOADS = {"lstm_b1": ("LSTM", 1), "lstm_b32": ("LSTM", 32), "gru_b1": ("GRU", 1)}


def _random_weights(model, rng):
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])


def _torch_gru_rows(m):
    """Keras z, r, h column blocks -> torch r, z, n row blocks (transposed)."""
    z, r, h = np.split(m, 3, axis=-1)
    return np.ascontiguousarray(np.concatenate([r, z, h], axis=-1).T)


def _torch_recurrent(kind, kernel, recurrent, bias):
    torch = torch_module()
    mod = getattr(torch.nn, kind)(kernel.shape[0], recurrent.shape[0], batch_first=True).eval()
    with torch.no_grad():
        if kind == "LSTM":
            mod.weight_ih_l0.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            mod.weight_hh_l0.copy_(torch.from_numpy(np.ascontiguousarray(recurrent.T)))
            mod.bias_ih_l0.copy_(torch.from_numpy(bias))
            mod.bias_hh_l0.zero_()
        else:
            mod.weight_ih_l0.copy_(torch.from_numpy(_torch_gru_rows(kernel)))
            mod.weight_hh_l0.copy_(torch.from_numpy(_torch_gru_rows(recurrent)))
            mod.bias_ih_l0.copy_(torch.from_numpy(_torch_gru_rows(bias[0][None])[:, 0].copy()))
            mod.bias_hh_l0.copy_(torch.from_numpy(_torch_gru_rows(bias[1][None])[:, 0].copy()))
    return mod


def _run_ref(model):
    def run(x):
        with fastlayers.use_ops("reference"):
            return model(x)

    return run


@pytest.fixture(scope="module", params=list(WORKLOADS))
def recurrent_engines(request):
    return recurrent_setup(request.param)


def recurrent_setup(name):
    """(name, kind, batch, x, {engine: fn}) of a ``WORKLOADS`` entry."""
    kind, batch = WORKLOADS[name]
    rng = np.random.default_rng(0)
    x_in = Input((STEPS, INPUT))
    model = Model(x_in, getattr(L, kind)(HIDDEN)(x_in))
    _random_weights(model, rng)
    kernel, recurrent, bias = model.get_weights()
    weights = (
        lstm_onnx_weights(kernel, recurrent, bias) if kind == "LSTM" else gru_onnx_weights(kernel, recurrent, bias)
    )
    sess = ort_session(recurrent_model(kind, weights, INPUT, HIDDEN))
    torch = torch_module()
    tmod = _torch_recurrent(kind, kernel, recurrent, bias)

    def run_torch(x):
        with torch.inference_mode():
            h = tmod(torch.from_numpy(x))[1]
            return (h[0] if kind == "LSTM" else h)[0].numpy()

    fns = {
        "fastlayers-cpu": model,
        "fastlayers-reference": _run_ref(model),
        "onnxruntime": lambda x: sess.run(None, {"x": x})[0],
        "torch": run_torch,
    }
    x = rng.standard_normal((batch, STEPS, INPUT)).astype(np.float32)
    return name, kind, batch, x, fns


@pytest.mark.parametrize("engine", ENGINES)
def bench_recurrent(benchmark, recurrent_engines, engine):
    name, kind, batch, x, fns = recurrent_engines
    check_same({e: f(x) for e, f in fns.items()})
    benchmark.group = f"{name} T={STEPS}"
    benchmark.extra_info.update(workload=name, batch=batch, engine=engine, steps=STEPS, hidden=HIDDEN, input=INPUT)
    benchmark(fns[engine], x)
    if batch == 1 and benchmark.stats is not None:
        gates = 4 if kind == "LSTM" else 3
        step_bytes = HIDDEN * gates * HIDDEN * 4
        benchmark.extra_info["recurrent_weight_gbps"] = step_bytes * STEPS / benchmark.stats.stats.min / 1e9


# ---------------------------------------------------------------------------- text classifier
def _text_onnx(model):
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    emb, k1, r1, b1, k2, r2, b2, wd, bd = model.get_weights()
    inits = [
        numpy_helper.from_array(emb, "emb"),
        numpy_helper.from_array(wd, "wd"),
        numpy_helper.from_array(bd, "bd"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
    ]
    for i, (k, r, b) in enumerate([(k1, r1, b1), (k2, r2, b2)]):
        for arr, n in zip(lstm_onnx_weights(k, r, b), "WRB"):
            inits.append(numpy_helper.from_array(arr, f"{n}{i}"))
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("Transpose", ["e"], ["e_tbi"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["e_tbi", "W0", "R0", "B0"], ["y0"], hidden_size=TEXT_HIDDEN),
        helper.make_node("Squeeze", ["y0", "ax1"], ["y0s"]),
        helper.make_node("LSTM", ["y0s", "W1", "R1", "B1"], ["y1", "h1"], hidden_size=TEXT_HIDDEN),
        helper.make_node("Squeeze", ["h1", "ax0"], ["h1s"]),
        helper.make_node("Gemm", ["h1s", "wd", "bd"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "text_lstm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _text_torch(model):
    torch = torch_module()
    emb, k1, r1, b1, k2, r2, b2, wd, bd = model.get_weights()

    class TextLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, EMBED)
            self.lstm = torch.nn.LSTM(EMBED, TEXT_HIDDEN, num_layers=2, batch_first=True)
            self.out = torch.nn.Linear(TEXT_HIDDEN, CLASSES)

        def forward(self, ids):
            h = self.lstm(self.emb(ids))[1][0][-1]
            return torch.softmax(self.out(h), -1)

    m = TextLSTM().eval()
    with torch.no_grad():
        m.emb.weight.copy_(torch.from_numpy(emb))
        for i, (k, r, b) in enumerate([(k1, r1, b1), (k2, r2, b2)]):
            getattr(m.lstm, f"weight_ih_l{i}").copy_(torch.from_numpy(np.ascontiguousarray(k.T)))
            getattr(m.lstm, f"weight_hh_l{i}").copy_(torch.from_numpy(np.ascontiguousarray(r.T)))
            getattr(m.lstm, f"bias_ih_l{i}").copy_(torch.from_numpy(b))
            getattr(m.lstm, f"bias_hh_l{i}").zero_()
        m.out.weight.copy_(torch.from_numpy(np.ascontiguousarray(wd.T)))
        m.out.bias.copy_(torch.from_numpy(bd))
    return m


@pytest.fixture(scope="module")
def text_engines():
    return text_setup()


def text_setup():
    """(ids, {engine: fn}) of the text classifier."""
    rng = np.random.default_rng(0)
    ids_in = Input((TEXT_STEPS,), dtype="int64")
    h = L.Embedding(VOCAB, EMBED)(ids_in)
    h = L.LSTM(TEXT_HIDDEN, return_sequences=True)(h)
    h = L.LSTM(TEXT_HIDDEN)(h)
    model = Model(ids_in, L.Dense(CLASSES, activation="softmax")(h))
    _random_weights(model, rng)
    sess = ort_session(_text_onnx(model))
    torch = torch_module()
    tmodel = _text_torch(model)

    def run_torch(ids):
        with torch.inference_mode():
            return tmodel(torch.from_numpy(ids)).numpy()

    ids = rng.integers(1, VOCAB, (TEXT_BATCH, TEXT_STEPS)).astype(np.int64)
    return ids, {
        "fastlayers-cpu": model,
        "fastlayers-reference": _run_ref(model),
        "onnxruntime": lambda i: sess.run(None, {"ids": i})[0],
        "torch": run_torch,
    }


@pytest.mark.parametrize("engine", ENGINES)
def bench_text_classifier(benchmark, text_engines, engine):
    ids, fns = text_engines
    check_same({e: f(ids) for e, f in fns.items()})
    benchmark.group = f"text_lstm2 T={TEXT_STEPS} batch {TEXT_BATCH}"
    benchmark.extra_info.update(workload="text_lstm2", batch=TEXT_BATCH, engine=engine, steps=TEXT_STEPS)
    benchmark(fns[engine], ids)


def bench_memory_bandwidth(benchmark):
    """This machine's copy bandwidth (read + write of 256 MiB; 4 MiB in CI's check run, which
    times nothing), for the GB/s figures above."""
    mib = 256 if FULL else 4
    src = np.ones(mib * 2**18, np.float32)
    dst = np.empty_like(src)
    benchmark.group = "memory bandwidth"
    benchmark.extra_info.update(workload=f"np.copyto {mib} MiB", engine="numpy")
    benchmark(np.copyto, dst, src)
    if benchmark.stats is not None:
        benchmark.extra_info["gbps_read_plus_write"] = 2 * src.nbytes / benchmark.stats.stats.min / 1e9
