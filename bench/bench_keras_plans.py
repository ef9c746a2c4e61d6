"""Keras-style models holding convolutions: the compiled ONNX plan of the graph
(``model/plans.py``), the same model run layer by layer (its bound layer steps), the written ONNX
graph loaded from its bytes by fastlayers, and onnxruntime on those bytes; interleaved in one
process (``interleaved.interleave``), same thread count, outputs checked equal first.

Workloads: ``cnn`` (two 3x3 convolutions with BatchNormalization, ReLU, a max pool, a global
average pool and a softmax Dense on (1, 32, 32, 3)), ``residual`` (two convolutions with
BatchNormalization, a residual Add, a depthwise convolution and pools on (1, 16, 16, 32)),
``vgg`` (six 3x3 convolutions with BatchNormalization in three stages on (1, 64, 64, 3) and at
batch 8), ``text_cnn`` (an Embedding of 5000 x 64 on 100 int ids, a Conv1D of 128 filters, a
global max pool and a Dense head), ``text_lstm`` (the same Embedding, an LSTM of 128 units
returning sequences, a GRU of 64, a Dense head), ``text_lstm_masked`` (the same Embedding
with ``mask_zero=True`` on ids whose first third is padding, a Bidirectional LSTM of 64 units
returning sequences, an LSTM of 64, a Dense head: fastlayers' masked recurrent nodes, which
onnxruntime does not read, so only the compiled model and the layer path run), ``seq2seq``
(the same Embedding on (4, 50) ids, an LSTM of 128 units returning its states, a second LSTM of
128 started from them on a Dense projection of the embeddings, a Dense head per step),
``text_transformer`` (the same Embedding on
64 ids, an encoder block: 4-head self-attention, residual sums, LayerNormalizations, a
256-wide feed-forward; mean pooling and a Dense head), the demo model ``digits_cnn`` (fastlayers/data), and
keras.applications' MobileNetV2,
MobileNetV3Small, ResNet50, EfficientNetB0 and ConvNeXtTiny at (1, 224, 224, 3) with random weights (``APPLICATIONS``: built
and saved by Keras on its torch backend, loaded by fastlayers; skipped without Keras).

Run: python bench/bench_keras_plans.py [--threads 1] [--calls 300 --rounds 7]
The layer path runs under ``settings.applied(LoadOptions(native_plans=False))`` (about 1 µs of
context per call).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def workloads(fastlayers, L):
    def cnn():
        return fastlayers.Sequential(
            [
                fastlayers.Input((32, 32, 3)),
                L.Conv2D(16, 3, padding="same", activation="relu"),
                L.BatchNormalization(),
                L.MaxPooling2D(2),
                L.Conv2D(32, 3, padding="same"),
                L.BatchNormalization(),
                L.ReLU(),
                L.GlobalAveragePooling2D(),
                L.Dense(10, activation="softmax"),
            ]
        )

    def residual():
        x = fastlayers.Input((16, 16, 32))
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(32, 3, padding="same")(x)))
        h = L.BatchNormalization()(L.Conv2D(32, 3, padding="same")(h))
        h = L.ReLU()(L.Add()([h, x]))
        h = L.AveragePooling2D(2)(L.DepthwiseConv2D(3, padding="same", activation="relu")(h))
        return fastlayers.Model(x, L.GlobalMaxPooling2D()(h))

    def vgg():
        stack = [fastlayers.Input((64, 64, 3))]
        for width in (16, 32, 64):
            for _ in range(2):
                stack += [L.Conv2D(width, 3, padding="same"), L.BatchNormalization(), L.ReLU()]
            stack.append(L.MaxPooling2D(2))
        return fastlayers.Sequential([*stack, L.GlobalAveragePooling2D(), L.Dense(10)])

    def text_cnn():
        ids = fastlayers.Input((100,), dtype="int32")
        h = L.Embedding(5000, 64)(ids)
        h = L.Conv1D(128, 5, activation="relu")(h)
        return fastlayers.Model(ids, L.Dense(10)(L.GlobalMaxPooling1D()(h)))

    def text_lstm():
        ids = fastlayers.Input((100,), dtype="int32")
        h = L.LSTM(128, return_sequences=True)(L.Embedding(5000, 64)(ids))
        return fastlayers.Model(ids, L.Dense(10)(L.GRU(64)(h)))

    def text_lstm_masked():
        ids = fastlayers.Input((100,), dtype="int32")
        h = L.Embedding(5000, 64, mask_zero=True)(ids)
        h = L.Bidirectional(L.LSTM(64, return_sequences=True))(h)
        return fastlayers.Model(ids, L.Dense(10)(L.LSTM(64)(h)))

    def seq2seq():
        ids = fastlayers.Input((50,), dtype="int32")
        h = L.Embedding(5000, 64)(ids)
        _, *states = L.LSTM(128, return_state=True)(h)
        y = L.LSTM(128, return_sequences=True)(L.Dense(64, activation="tanh")(h), initial_state=states)
        return fastlayers.Model(ids, L.Dense(10)(y))

    def text_transformer():
        ids = fastlayers.Input((64,), dtype="int32")
        h = L.Embedding(5000, 64)(ids)
        h = L.LayerNormalization()(L.Add()([h, L.MultiHeadAttention(4, 16)(h, h)]))
        f = L.Dense(64)(L.Dense(256, activation="relu")(h))
        h = L.LayerNormalization()(L.Add()([h, f]))
        return fastlayers.Model(ids, L.Dense(2)(L.GlobalAveragePooling1D()(h)))

    data = Path(fastlayers.__file__).parent / "data"
    apps = {name: (_application(name), (1, 224, 224, 3)) for name in APPLICATIONS}
    return apps | {
        "cnn": (cnn, (1, 32, 32, 3)),
        "residual": (residual, (1, 16, 16, 32)),
        "vgg": (vgg, (1, 64, 64, 3)),
        "vgg-b8": (vgg, (8, 64, 64, 3)),
        "text_cnn": (text_cnn, (1, 100)),
        "text_lstm": (text_lstm, (1, 100)),
        "text_lstm_masked": (text_lstm_masked, (8, 100)),
        "seq2seq": (seq2seq, (4, 50)),
        "text_transformer": (text_transformer, (1, 64)),
        "digits_cnn": (lambda: fastlayers.load(data / "digits_cnn.flm"), (1, 8, 8, 1)),
    }


#: Workloads on int64 token ids (below 5000) rather than float32 values.
ON_IDS = {"text_cnn", "text_lstm", "text_lstm_masked", "seq2seq", "text_transformer"}
#: Workloads whose written graph holds fastlayers' own operators (no ONNX engine but ours).
OWN_OPERATORS = {"text_lstm_masked"}

#: keras.applications architectures (random weights, BatchNormalization statistics moved away
#: from the identity), built and saved by Keras and loaded by fastlayers.
APPLICATIONS = {
    "mobilenet_v2": "MobileNetV2",
    "mobilenet_v3_small": "MobileNetV3Small",
    "resnet50": "ResNet50",
    "efficientnet_b0": "EfficientNetB0",
    "convnext_tiny": "ConvNeXtTiny",
}


def _application(name):
    def build():
        import os
        import tempfile

        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras

        import fastlayers

        rng = np.random.default_rng(0)
        model = getattr(keras.applications, APPLICATIONS[name])(input_shape=(224, 224, 3), weights=None)
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.set_weights([rng.uniform(0.5, 1.5, np.shape(w)).astype(np.float32) for w in layer.get_weights()])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.keras"
            model.save(path)
            return fastlayers.load(path)

    return build


def onnx_bytes(g, outputs, rank, ids=False) -> bytes:
    """The graph ``g`` (``onnx.writer.GraphWriter``) as ONNX file bytes, input ``"input"``
    (int64 where ``ids``, else float32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fastlayers.onnx.writer import OPSET

    nodes = [helper.make_node(n.op_type, n.inputs, n.outputs, n.name, **n.attrs) for n in g.graph.nodes]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in g.graph.initializers.items()]
    graph = helper.make_graph(
        nodes,
        "written",
        [helper.make_tensor_value_info("input", TensorProto.INT64 if ids else TensorProto.FLOAT, [None] * rank)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()

    import onnxruntime as ort

    import fastlayers
    from bench.interleaved import interleave
    from fastlayers import layers as L
    from fastlayers import settings
    from fastlayers.model import plans

    fastlayers.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    layer_path = settings.LoadOptions(native_plans=False)
    for name, (build, shape) in workloads(fastlayers, L).items():
        if args.only and name not in args.only:
            continue
        if name in APPLICATIONS and importlib.util.find_spec("keras") is None:
            print(f"{name}: skipped (no keras)")
            continue
        model = build()
        for layer in model.layers if name not in APPLICATIONS else []:  # BatchNormalization off the identity
            if type(layer).__name__ == "BatchNormalization":
                layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) for w in layer.get_weights()])
        ids = name in ON_IDS
        key = (plans.IDS, len(shape)) if ids else len(shape)
        x = rng.integers(0, 5000, shape) if ids else rng.standard_normal(shape).astype(np.float32)
        if name in OWN_OPERATORS:
            x[:, : shape[1] // 3] = 0  # padding before the tokens, as Keras's pad_sequences writes it
        calls = args.calls if name not in APPLICATIONS else max(3, args.calls // 30)

        def by_layers(x=x, model=model):
            with settings.applied(layer_path):
                return model(x)

        engines = {"fastlayers-compiled": lambda x=x, model=model: model(x), "fastlayers-layers": by_layers}
        if name not in OWN_OPERATORS:
            g, outputs = plans.written(model, key)
            data = onnx_bytes(g, outputs, len(shape), ids)
            exported = fastlayers.load(data)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
            session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
            engines["fastlayers-onnx"] = lambda x=x: exported(x)
            engines["onnxruntime"] = lambda x=x, session=session: session.run(None, {"input": x})
        want = engines["onnxruntime" if "onnxruntime" in engines else "fastlayers-layers"]()
        want = want[0] if isinstance(want, list) else want
        for engine, fn in engines.items():
            for _ in range(3):
                got = fn()
            got = got[0] if isinstance(got, list) else got
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name}: {engine}")
        assert model._plans[key][2] is not None, f"{name}: not compiled"
        interleave(engines, calls, args.rounds, f"{name} {shape}")


if __name__ == "__main__":
    main()
