"""Keras-style graphs run as compiled ONNX plans (``model/plans.py``): against Keras and the
layer path, which graphs compile and which keep the layer path, and what rebuilds them."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L
from fastlayers import settings
from fastlayers.backends import use_ops
from fastlayers.backends.derived import clear_derived
from fastlayers.errors import InputError, ShapeError
from fastlayers.model import plans

from ..conftest import assert_close, in_threads

LAYER_PATH = settings.LoadOptions(native_plans=False)


def _graphs():
    """name -> (builder(lib, K) -> model, input shape without the batch): ``lib`` holds Input,
    Model and Sequential, ``K`` the layer classes (Keras's or fastlayers')."""

    def cnn(lib, K):
        return lib.Sequential(
            [
                lib.Input((12, 10, 3)),
                K.Conv2D(8, 3, padding="same", activation="relu"),
                K.BatchNormalization(),
                K.MaxPooling2D(2, padding="same"),
                K.Conv2D(6, 3, strides=2, padding="valid"),
                K.BatchNormalization(),
                K.ReLU(),
                K.GlobalAveragePooling2D(),
                K.Dense(5, activation="softmax"),
            ]
        )

    def residual(lib, K):
        x = lib.Input((9, 9, 8))
        h = K.Conv2D(8, 3, padding="same", use_bias=False)(x)
        h = K.BatchNormalization()(h)
        h = K.Activation("relu")(h)
        h = K.Conv2D(8, 3, padding="same", dilation_rate=2)(h)
        h = K.Add()([h, x])
        h = K.ReLU(max_value=6.0)(h)
        h = K.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="tanh")(h)
        h = K.AveragePooling2D(3, strides=2, padding="same")(h)
        return lib.Model(x, K.GlobalMaxPooling2D()(h))

    def merges(lib, K):
        x = lib.Input((7, 6, 4))
        a = K.Conv2D(4, 1)(x)
        b = K.Conv2D(4, 3, padding="same", groups=2, activation="sigmoid")(x)
        h = K.Concatenate()([K.Average()([a, b]), K.Maximum()([a, x]), K.Subtract()([b, x])])
        h = K.Multiply()([h, K.Conv2D(12, 1, activation="softmax")(h)])
        h = K.Minimum()([h, K.Rescaling(0.5, offset=0.25)(h)])
        h = K.Flatten()(K.MaxPooling2D((2, 3))(h))
        return lib.Model(x, K.LayerNormalization()(K.Dense(6, activation="gelu")(h)))

    def conv1d(lib, K):
        x = lib.Input((17, 5))
        h = K.Conv1D(6, 3, padding="causal", dilation_rate=2, activation="elu")(x)
        h = K.Add()([h, K.Conv1D(6, 1)(x)])
        h = K.AveragePooling1D(2)(h)
        h = K.Conv1D(4, 5, strides=2, padding="same")(h)
        h = K.LayerNormalization()(K.BatchNormalization()(h))
        return lib.Model(x, K.GlobalAveragePooling1D(keepdims=True)(K.MaxPooling1D(2, padding="same")(h)))

    def channels_first(lib, K):
        return lib.Sequential(
            [
                lib.Input((3, 8, 7)),
                K.Conv2D(5, 3, data_format="channels_first", activation="relu"),
                K.MaxPooling2D(2, data_format="channels_first"),
                K.GlobalAveragePooling2D(data_format="channels_first"),
                K.Dense(2),
            ]
        )

    def outputs(lib, K):
        x = lib.Input((6, 6, 3))
        h = K.Conv2D(4, 3, padding="same", activation="relu")(x)
        return lib.Model(x, [K.GlobalMaxPooling2D(keepdims=True)(h), K.Dense(3)(K.Flatten()(h)), h])

    def padded(lib, K):
        x = lib.Input((9, 8, 3))
        h = K.ZeroPadding2D(((1, 2), (0, 1)))(x)
        h = K.Conv2D(6, 3, strides=2)(h)
        h = K.LeakyReLU(negative_slope=0.1)(h)
        h = K.SeparableConv2D(5, 3, padding="same", depth_multiplier=2, activation="relu")(h)
        h = K.ELU(alpha=0.7)(K.UpSampling2D(2)(h))
        h = K.UpSampling2D((2, 3), interpolation="bilinear")(K.ZeroPadding2D(1)(h))
        h = K.MaxPooling2D(3)(h)
        return lib.Model(x, K.Dense(3)(K.Reshape((-1, 5))(h)))

    def padded1d(lib, K):
        x = lib.Input((11, 4))
        h = K.Conv1D(5, 3)(K.ZeroPadding1D((2, 1))(x))
        return lib.Model(x, K.Reshape((5, -1))(K.BatchNormalization()(h)))

    def normalized(lib, K):
        x = lib.Input((6, 5, 3))
        h = K.Normalization(mean=[0.1, 0.2, 0.3], variance=[1.0, 2.0, 0.5])(x)
        h = K.Conv2D(4, 3, activation="relu")(h)
        h = K.Normalization(mean=[1.0, -1.0, 0.5, 0.0], variance=[4.0, 1.0, 0.25, 2.0], invert=True)(h)
        h = K.Normalization(axis=None, mean=0.5, variance=4.0)(h)
        return lib.Model(x, K.Flatten()(h))

    def decoder(lib, K):
        x = lib.Input((5, 6, 4))
        h = K.Conv2DTranspose(6, 3, strides=2, padding="same", activation="relu")(x)
        h = K.Conv2DTranspose(5, 2, strides=2, padding="valid")(K.BatchNormalization()(h))
        h = K.Conv2DTranspose(3, 1, strides=2, padding="same")(h)  # output padding 1
        h = K.Conv2DTranspose(4, 3, strides=2, padding="valid", output_padding=1)(h)
        h = K.Conv2DTranspose(2, 3, dilation_rate=2, padding="same", activation="sigmoid")(h)
        return lib.Model(x, K.Conv2D(2, 3, padding="same")(h))

    def cropped(lib, K):
        x = lib.Input((9, 8, 3))
        h = K.Cropping2D(((1, 2), (0, 1)))(x)  # channels last
        h = K.Conv2D(4, 3, padding="same")(h)
        h = K.Cropping2D(1)(h)  # held channels-first
        h = K.Conv2D(4, 1)(h)
        h = K.Cropping1D((2, 1))(K.Reshape((-1, 4))(h))
        return lib.Model(x, K.Cropping1D(1)(K.Conv1D(3, 2)(h)))

    def reordered(lib, K):
        x = lib.Input((6, 5, 4))
        h = K.Conv2D(4, 3, padding="same")(x)
        h = K.Conv2D(3, 1)(K.Permute((2, 1, 3))(h))
        h = K.RMSNormalization(epsilon=1e-3)(h)
        h = K.RepeatVector(4)(K.GlobalAveragePooling2D()(h))
        return lib.Model(x, K.Conv1D(2, 2)(h))

    def recurrent(lib, K):
        x = lib.Input((7, 5))
        h = K.LSTM(6, return_sequences=True)(x)
        h = K.GRU(5, return_sequences=True, go_backwards=True)(h)
        h = K.SimpleRNN(4, activation="relu", return_sequences=True)(h)
        h = K.Bidirectional(K.LSTM(4, return_sequences=True))(h)
        h = K.Bidirectional(K.SimpleRNN(3, return_sequences=True), merge_mode="sum")(h)
        a = K.GRU(3, reset_after=False, go_backwards=True, recurrent_activation="tanh")(h)
        b = K.Bidirectional(K.GRU(3), merge_mode="ave")(h)
        return lib.Model(x, K.Dense(2)(K.Concatenate()([a, b, K.Bidirectional(K.LSTM(2))(h)])))

    def recurrent_states(lib, K):
        x = lib.Input((6, 4))
        y, h, c = K.LSTM(5, return_state=True, go_backwards=True, activation="relu", use_bias=False)(x)
        s, sh = K.GRU(3, return_sequences=True, return_state=True)(x)
        return lib.Model(x, [K.Concatenate()([y, h, c]), s, sh])

    def attention(lib, K):
        x = lib.Input((6, 8))
        h = K.Conv1D(8, 3, padding="same")(x)
        h = K.LayerNormalization()(K.Add()([h, K.MultiHeadAttention(2, 4)(h, h)]))
        c = K.MultiHeadAttention(3, 2, value_dim=5, use_bias=False, output_shape=7)(h, x, x)
        d = K.Attention(use_scale=True)([h, x])
        e = K.AdditiveAttention()([x, h, K.Conv1D(8, 1)(x)])
        f = K.AdditiveAttention(use_scale=False)([h, x])
        cs = K.Attention(score_mode="concat", use_scale=True)([h, x])
        cw = K.Attention(score_mode="concat")([x, h, K.Conv1D(8, 1)(h)])
        parts = [c, K.MultiHeadAttention(2, 3)(h, x, h), d, e, f, K.Attention()([x, h, x]), cs, cw]
        return lib.Model(x, K.Dense(3)(K.Concatenate()(parts)))

    def causal(lib, K):
        x = lib.Input((6, 8))
        h = K.Conv1D(8, 3, padding="same")(x)
        h = K.LayerNormalization()(K.Add()([h, K.MultiHeadAttention(2, 4)(h, h, use_causal_mask=True)]))
        half = K.Conv1D(8, 2, strides=2)(h)  # 3 steps: fewer keys than queries, then fewer queries
        a = K.MultiHeadAttention(3, 2, value_dim=5)(h, half, use_causal_mask=True)
        b = K.MultiHeadAttention(2, 3)(half, h, h, use_causal_mask=True)
        d = K.Attention(use_scale=True)([h, x], use_causal_mask=True)
        e = K.AdditiveAttention()([half, h, x], use_causal_mask=True)
        f = K.Attention(score_mode="concat")([h, half], use_causal_mask=True)
        # returned scores (batch, heads, Tq, Tk): the softmax's output, with and without the mask
        sa, ss = K.MultiHeadAttention(2, 3)(h, half, return_attention_scores=True)
        ca, cs = K.MultiHeadAttention(2, 2)(h, h, use_causal_mask=True, return_attention_scores=True)
        # Attention and AdditiveAttention's scores (batch, Tq, Tk), causal and not
        da, ds = K.Attention(use_scale=True)([h, half], return_attention_scores=True)
        ea, es = K.AdditiveAttention()([half, h, x], use_causal_mask=True, return_attention_scores=True)
        outputs = [K.Dense(3)(K.Concatenate()([h, a, d, f, ca])), K.Concatenate()([b, e, ea]), sa, ss, cs]
        return lib.Model(x, [*outputs, da, ds, es])

    return {
        "attention": (attention, (6, 8)),
        "causal": (causal, (6, 8)),
        "recurrent": (recurrent, (7, 5)),
        "recurrent_states": (recurrent_states, (6, 4)),
        "reordered": (reordered, (6, 5, 4)),
        "cropped": (cropped, (9, 8, 3)),
        "decoder": (decoder, (5, 6, 4)),
        "normalized": (normalized, (6, 5, 3)),
        "padded": (padded, (9, 8, 3)),
        "padded1d": (padded1d, (11, 4)),
        "cnn": (cnn, (12, 10, 3)),
        "residual": (residual, (9, 9, 8)),
        "merges": (merges, (7, 6, 4)),
        "conv1d": (conv1d, (17, 5)),
        "channels_first": (channels_first, (3, 8, 7)),
        "outputs": (outputs, (6, 6, 3)),
    }


GRAPHS = _graphs()
OURS = SimpleNamespace(Input=fastlayers.Input, Model=fastlayers.Model, Sequential=fastlayers.Sequential)


def _compiled(model, rank):
    """The compiled model serving ``model``'s calls of ``rank`` axes, or None."""
    entry = model._plans.get(rank)
    return None if entry is None else entry[2]


def _layer_path(model, x):
    with settings.applied(LAYER_PATH):
        return model(x)


def _listed(y):
    return y if isinstance(y, list) else [y]


@pytest.mark.parametrize("name", GRAPHS)
def test_compiled_graphs_match_keras_and_the_layer_path(name, keras, rng):
    build, shape = GRAPHS[name]
    ref = build(SimpleNamespace(Input=keras.Input, Model=keras.Model, Sequential=keras.Sequential), keras.layers)
    ref.set_weights([rng.uniform(0.5, 1.5, np.shape(w)).astype(np.float32) for w in ref.get_weights()])
    model = build(OURS, L)
    model.set_weights([np.asarray(w) for w in ref.get_weights()])
    for batch in (1, 3):
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        want = _listed(ref(x, training=False))
        want = [np.asarray(w.detach().cpu() if hasattr(w, "detach") else w) for w in want]
        for _ in range(3):  # the third call runs the native plan built at the second
            got = _listed(model(x))
            assert len(got) == len(want)
            for g, w, lp in zip(got, want, _listed(_layer_path(model, x))):
                assert g.shape == w.shape
                assert_close(g, w, rtol=1e-4, atol=1e-4, what=name)
                assert_close(g, lp, rtol=1e-5, atol=1e-5, what=name)
        assert _compiled(model, len(shape) + 1) is not None


def test_the_compiled_plan_fuses_across_the_layers(rng):
    """BatchNormalization folds into the convolution before it and the residual sum runs in the
    second convolution's epilogue: no Transpose is left between them."""
    build, shape = GRAPHS["residual"]
    model = build(OURS, L)
    model(rng.standard_normal((1, *shape)).astype(np.float32))
    ops = _compiled(model, 4).op_types
    assert ops.count("FusedConv") == 3 and "BatchNormalization" not in ops and "Add" not in ops
    assert ops.count("Transpose") == 1  # the input's, to channels-first


@pytest.mark.parametrize(
    "extra",
    [
        L.Cropping2D(1),  # of sizes the model does not fix (an empty result is the layer's error)
        L.Conv2D(3, 3, activation="mish"),  # an activation without an ONNX form
        L.BatchNormalization(axis=1),  # over the height
    ],
    ids=["cropping_free_sizes", "mish", "bn_axis_1"],
)
def test_a_graph_with_a_layer_without_form_runs_layer_by_layer(extra, rng, monkeypatch):
    """... and is written once: later calls, even with the layers' arrays replaced, do not try
    again (a form depends on the layers' configuration)."""
    free = isinstance(extra, L.Cropping2D)
    model = fastlayers.Sequential(
        [fastlayers.Input((None, None, 3) if free else (8, 8, 3)), L.Conv2D(4, 3, padding="same"), extra]
    )
    x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    writes = []
    real = plans.written
    monkeypatch.setattr(plans, "written", lambda *a: writes.append(1) or real(*a))
    if isinstance(extra, L.BatchNormalization):  # an axis other than the channels is compiled
        model(x)
        assert _compiled(model, 4) is not None
        assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)
        return
    np.testing.assert_array_equal(model(x), _layer_path(model, x))
    assert 4 in model._plans and _compiled(model, 4) is None
    model.layers[0].kernel = model.layers[0].kernel * 2
    for _ in range(3):
        np.testing.assert_array_equal(model(x), _layer_path(model, x))
    assert writes == [1]


def test_dense_graphs_keep_the_layer_path(rng):
    """A graph of dense layers only is not compiled (its bound layer steps cost less)."""
    model = fastlayers.Sequential([fastlayers.Input((6,)), L.Dense(8, activation="relu"), L.Dense(3)])
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(model(x), _layer_path(model, x))
    assert _compiled(model, 2) is None and model._plans == {plans.KINDS_KEY: False}


def _small(rng):
    model = fastlayers.Sequential(
        [fastlayers.Input((6, 6, 2)), L.Conv2D(3, 3), L.BatchNormalization(), L.Rescaling(2.0)]
    )
    return model, rng.standard_normal((1, 6, 6, 2)).astype(np.float32)


def test_replaced_weights_and_in_place_edits_rebuild_the_plan(rng):
    model, x = _small(rng)
    model(x)
    first = _compiled(model, 4)
    conv, bn, scale = model.layers
    conv.set_weights([w * 2 for w in conv.get_weights()])
    assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)
    assert _compiled(model, 4) is not first
    conv.kernel = -conv.kernel  # assignment
    assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)
    bn.set_weights([w + 1 for w in bn.get_weights()])  # its folded scale and shift follow
    assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)
    scale._scale = np.array(3.0, np.float32)  # a constant a form reads
    assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)
    before = model(x)
    conv.kernel[...] *= 2  # in place: needs clear_derived, as the layer path does
    conv.bias[...] *= 2
    clear_derived()
    assert_close(model(x), 2 * before - 3.0 * bn._shift, rtol=1e-5, atol=1e-5)  # 3 (2 conv s + t)
    assert_close(model(x), _layer_path(model, x), rtol=1e-5, atol=1e-5)


def test_a_sequential_grown_after_its_calls_compiles_again(rng):
    model, x = _small(rng)
    model(x)
    model.add(L.Conv2D(2, 1))
    y = model(x)
    assert y.shape == (1, 4, 4, 2)
    assert_close(y, _layer_path(model, x), rtol=1e-5, atol=1e-5)


def test_no_compiled_plan_where_plans_are_off_or_on_another_backend(rng):
    model, x = _small(rng)
    _layer_path(model, x)
    with use_ops("reference"):
        want = model(x)
    assert _compiled(model, 4) is None
    assert_close(model(x), want, rtol=1e-4, atol=1e-5)
    assert _compiled(model, 4) is not None


def test_bad_inputs_raise_the_layers_errors(rng):
    model, x = _small(rng)
    model(x)
    with pytest.raises(ShapeError, match="6, 6, 2"):
        model(np.zeros((1, 6, 6, 3), np.float32))
    with pytest.raises(ShapeError):
        model(np.zeros((1, 2, 2, 2), np.float32))  # smaller than the kernel
    y = model(x.astype(np.float64))  # cast as the layer path casts
    assert y.dtype == np.float32
    assert_close(y, _layer_path(model, x), rtol=1e-5, atol=1e-5)


def test_threads_share_a_compiled_graph_and_memory_stays_flat(rng):
    build, shape = GRAPHS["residual"]
    model = build(OURS, L)
    inputs = [rng.standard_normal((b, *shape)).astype(np.float32) for b in (1, 2, 3, 1)]
    want = [_layer_path(model, x) for x in inputs]

    def work(i):
        for _ in range(30):
            assert_close(model(inputs[i]), want[i], rtol=1e-5, atol=1e-5)

    in_threads(work, 4)
    for _ in range(5):
        model(inputs[0])
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(300):
        model(inputs[0])
    in_threads(lambda i: [model(inputs[0]) for _ in range(50)], 4)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert grown < 64 << 10
    assert _compiled(model, 4) is not None


def test_every_form_names_a_layer_class():
    """FORMS keys are the full names of fastlayers' layer classes (a renamed class would
    silently lose its form)."""
    import importlib

    for key in plans.FORMS:
        module, _, name = key.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), name), type), key
    assert plans.COMPILE_KINDS <= set(plans.FORMS)


def test_load_options_choose_for_the_model_s_calls(rng):
    """``fastlayers.load(..., options=LoadOptions(native_plans=False))`` keeps the layer path
    for the model's later calls, whatever the setting in force then."""
    from pathlib import Path

    path = Path(fastlayers.__file__).parent / "data" / "digits_cnn.flm"
    x = rng.standard_normal((2, 8, 8, 1)).astype(np.float32)
    off = fastlayers.load(path, options=LAYER_PATH)
    on = fastlayers.load(path)
    assert off.native_plans is False and on.native_plans is True
    assert_close(off(x), on(x), rtol=1e-5, atol=1e-5)
    assert _compiled(off, 4) is None and _compiled(on, 4) is not None


def test_a_model_used_as_a_layer_is_written_inline(rng):
    """Transfer learning's shape: a convolutional base (a Model) inside a Sequential with a
    head. The base's graph is written inline: base and head run as one compiled model, rebuilt
    when a weight of the base is replaced."""
    build, shape = GRAPHS["residual"]
    base = build(OURS, L)
    model = fastlayers.Sequential([fastlayers.Input(shape), base, L.Dense(3, activation="softmax")])
    x = rng.standard_normal((2, *shape)).astype(np.float32)
    for _ in range(3):
        y = model(x)
    assert_close(y, _layer_path(model, x), rtol=1e-5, atol=1e-6)
    first = _compiled(model, 4)
    assert first is not None and _compiled(base, 4) is None
    conv = base.layers[1]
    conv.kernel = conv.kernel * 2
    y = model(x)
    assert _compiled(model, 4) is not first
    assert_close(y, _layer_path(model, x), rtol=1e-5, atol=1e-6)


def test_keras_operations_and_scaled_sums_compile(rng):
    """BinaryOp (a Keras operation on tensors: ``x * 0.5``, ``a - b``), InceptionResNetV2's
    CustomScaleLayer, ConvNeXt's LayerScale and LocalResponseNormalization (not in Keras), on
    channels-first values and after them."""
    x = fastlayers.Input((6, 5, 4))
    h = L.Conv2D(4, 3, padding="same")(x)
    h = L.BinaryOp("multiply", (None, 0.5))([h])
    h = L.BinaryOp("subtract", (None, None))([h, x])
    h = L.CustomScaleLayer(0.2)([x, L.BinaryOp("divide", (1.0, None))([L.BinaryOp("add", (None, 1.0))([L.ReLU()(h)])])])
    h = L.LayerScale(1e-2, 4)(h)
    h = L.LocalResponseNormalization(depth_radius=1, bias=2.0, alpha=1e-2, beta=0.75)(h)
    h = L.LayerScale(3.0, 4)(L.Dense(4)(h))
    model = fastlayers.Model(x, L.BinaryOp("add", (2.0, None))([h]))
    y = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    for _ in range(2):
        got = model(y)
    assert _compiled(model, 4) is not None
    assert_close(got, _layer_path(model, y), rtol=1e-5, atol=1e-6)


def test_a_model_with_several_inputs_compiles(keras, rng):
    """An image and a vector of features: a convolutional branch and a dense one concatenated
    (inputs given as a list and as a dict by name, as Keras takes them)."""

    def build(lib, K):
        image, features = lib.Input((8, 8, 3), name="image"), lib.Input((5,), name="features")
        h = K.GlobalAveragePooling2D()(K.Conv2D(6, 3, padding="same", activation="relu")(image))
        f = K.Dense(4, activation="tanh")(features)
        return lib.Model([image, features], K.Dense(2)(K.Concatenate()([h, f])))

    ref = build(SimpleNamespace(Input=keras.Input, Model=keras.Model), keras.layers)
    ref.set_weights([rng.uniform(-0.5, 0.5, np.shape(w)).astype(np.float32) for w in ref.get_weights()])
    model = build(OURS, L)
    model.set_weights([np.asarray(w) for w in ref.get_weights()])
    xs = [rng.standard_normal((3, 8, 8, 3)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)]
    want = np.asarray(ref(xs, training=False).detach().cpu())
    for _ in range(3):
        assert_close(model(xs), want, rtol=1e-4, atol=1e-5)
    assert_close(model({"image": xs[0], "features": xs[1]}), want, rtol=1e-4, atol=1e-5)
    assert_close(model(xs), _layer_path(model, xs), rtol=1e-5, atol=1e-6)
    assert _compiled(model, (4, 2)) is not None


def test_the_compile_reads_the_layers_arrays_without_copying_or_changing_them(rng, monkeypatch):
    """The written graph holds the layers' weights as read-only views (no ONNX-order copy), and
    the import's folding (BatchNormalization into the convolution, tiny weights zeroed) makes
    new arrays: the layers' own arrays keep their values and stay writeable."""
    build, shape = GRAPHS["cnn"]
    model = build(OURS, L)
    conv = model.layers[0]
    conv.kernel[0, 0, 0, :2] = [1e-35, -1e-36]  # below the tiny-weight bound the import zeroes
    before = {name: a.copy() for _, name, a in plans._weights_held(model) if _ is conv}
    held = []
    real = plans.written

    def spy(*a):
        found = real(*a)
        held.extend(found[0].graph.initializers.values())
        return found

    monkeypatch.setattr(plans, "written", spy)
    x = rng.standard_normal((2, *shape)).astype(np.float32)
    got = model(x)
    assert _compiled(model, 4) is not None
    for name, a in before.items():
        np.testing.assert_array_equal(getattr(conv, name), a)
        assert getattr(conv, name).flags.writeable
    assert any(np.shares_memory(h, conv.kernel) for h in held) and not any(h.flags.writeable for h in held)
    assert_close(got, _layer_path(model, x), rtol=1e-5, atol=1e-6)


def _text_cnn(lib, K, mask_zero=False, dtype="int32"):
    ids = lib.Input((12,), dtype=dtype)
    h = K.Embedding(50, 8, mask_zero=mask_zero)(ids)
    h = K.Conv1D(6, 3, padding="same", activation="relu")(h)
    return lib.Model(ids, K.Dense(4)(K.GlobalMaxPooling1D()(h)))


def _text_rnn(lib, K):
    ids = lib.Input((12,), dtype="int32")
    h = K.GRU(6, return_sequences=True)(K.Embedding(50, 8)(ids))
    return lib.Model(ids, K.Dense(4)(K.LSTM(5)(h)))


def _text_cnn_on_floats(lib, K):
    return _text_cnn(lib, K, dtype="float32")  # Keras's default Input dtype: the Embedding casts


@pytest.mark.parametrize("build", [_text_cnn, _text_rnn, _text_cnn_on_floats], ids=["cnn", "rnn", "float_input"])
def test_text_models_on_integer_ids_compile(build, keras, rng):
    """Embedding on int ids (Keras's text classifiers and taggers): a Gather of the ids, which
    the call checks as the layer does (range, whole-number floats) before the compiled model runs."""
    ref = build(SimpleNamespace(Input=keras.Input, Model=keras.Model), keras.layers)
    model = build(OURS, L)
    model.set_weights(ref.get_weights())
    ids = rng.integers(0, 50, (3, 12)).astype(np.int32)
    want = ref.predict(ids, verbose=0)
    for x in (ids, ids.astype(np.int64), ids.astype(np.float32)):
        for _ in range(2):
            got = model(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert_close(got, _layer_path(model, x), rtol=1e-5, atol=1e-6)
    assert _compiled(model, (plans.IDS, 2)) is not None
    bad = ids.copy()
    bad[1, 3] = 50
    with pytest.raises(InputError, match="Embedding"):
        model(bad)
    bad[1, 3] = -1  # a Gather would wrap it around
    with pytest.raises(InputError, match="Embedding"):
        model(bad)
    with pytest.raises(InputError, match="non-integer"):
        model(ids + np.float32(0.5))


def test_masked_embeddings_compile_where_no_layer_reads_the_mask(rng):
    """mask_zero before layers that do not take a mask (a text CNN): the Gather, as the layer
    path runs it."""
    model = _text_cnn(OURS, L, mask_zero=True)
    ids = rng.integers(0, 50, (2, 12)).astype(np.int32)
    for _ in range(2):
        got = model(ids)
    np.testing.assert_array_equal(got, _layer_path(model, ids))
    assert _compiled(model, (plans.IDS, 2)) is not None


#: Keras-style recurrent layers under an Embedding(mask_zero=True) mask: (layer class, options,
#: wrapped in Bidirectional with this merge mode or None, a GRU returning sequences before it)
MASKED_RECURRENT = {
    "lstm": ("LSTM", {}, None, False),
    "gru_sequences": ("GRU", {"return_sequences": True}, None, False),
    "rnn_backwards": ("SimpleRNN", {"return_sequences": True, "go_backwards": True}, None, False),
    "lstm_states_stacked": ("LSTM", {"return_sequences": True, "return_state": True}, None, True),
    "gru_zero_output": ("GRU", {"return_sequences": True, "zero_output_for_mask": True}, None, False),
    "bilstm_sequences": ("LSTM", {"return_sequences": True}, "concat", False),
    "bigru_sum": ("GRU", {}, "sum", True),
}


def _masked_text_rnn(lib, K, kind, options, merge, stacked):
    ids = lib.Input((None,), dtype="int32")
    h = K.Dropout(0.1)(K.Embedding(20, 8, mask_zero=True)(ids))
    if stacked:
        h = K.GRU(5, return_sequences=True)(h)
    layer = getattr(K, kind)(6, **options)
    y = (K.Bidirectional(layer, merge_mode=merge) if merge else layer)(h)
    return lib.Model(ids, y)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("case", sorted(MASKED_RECURRENT))
def test_recurrent_layers_under_an_embedding_mask_compile(case, threads, keras, rng):
    """SimpleRNN / LSTM / GRU (go_backwards, returned states, zero_output_for_mask,
    Bidirectional, stacked) after Embedding(mask_zero=True): fastlayers' masked recurrent node
    on the native plan's loops, which read each call's mask (pre- and post-padding, zeros
    inside, a row of padding only), against Keras on torch and the layer path."""
    spec = MASKED_RECURRENT[case]
    ref = _masked_text_rnn(SimpleNamespace(Input=keras.Input, Model=keras.Model), keras.layers, *spec)
    model = _masked_text_rnn(OURS, L, *spec)
    model.set_weights([w * 2 for w in ref.get_weights()])
    ref.set_weights(model.get_weights())
    first = np.array([[0, 0, 3, 4, 5, 6, 7], [1, 2, 3, 0, 0, 0, 0], [0] * 7, [7, 0, 8, 0, 9, 1, 0]], np.int32)
    for ids in (first, first, first, first[::-1].copy(), rng.integers(0, 3, (3, 5)).astype(np.int32)):
        got = model(ids)
        want = ref(ids)
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        assert len(_listed(got)) == len(want)
        for g, w in zip(_listed(got), want):
            assert_close(g, keras.ops.convert_to_numpy(w), rtol=1e-4, atol=1e-5)
        for g, w in zip(_listed(got), _listed(_layer_path(model, ids))):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    compiled = _compiled(model, (plans.IDS, 2))
    assert compiled is not None
    # the embedding's table folded into the first recurrence's input projection
    kind = spec[0].replace("SimpleRNN", "RNN")
    masked = {f"EmbeddingMasked{'GRU' if spec[3] else kind}", *([f"ai.fastlayers::Masked{kind}"] if spec[3] else [])}
    plan = compiled._native.plan_for([first.astype(np.int64)])
    assert plan is not None
    native, fallbacks, _ = plan.summary
    assert masked <= set(native) and not fallbacks


def test_masked_recurrence_on_whole_numbers_in_a_float_input(rng):
    """Keras's default float Input holding ids: the Embedding's check casts them, and the
    compiled PaddingMask reads the int64 ids the compiled model takes."""
    ids = fastlayers.Input((None,))
    h = L.Embedding(12, 4, mask_zero=True)(ids)
    model = fastlayers.Model(ids, L.Bidirectional(L.GRU(3, return_sequences=True))(h))
    x = np.array([[0, 0, 5, 7, 1, 2, 9], [3, 0, 2, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]], np.float32)
    for _ in range(3):
        got = model(x)
    assert_close(got, _layer_path(model, x), rtol=1e-5, atol=1e-6)
    assert _compiled(model, (plans.IDS, 2))._native.plan_for([x.astype(np.int64)]) is not None
    with pytest.raises(InputError, match="non-integer"):
        model(x + np.float32(0.5))


def test_short_token_ids_are_data_of_one_native_plan(monkeypatch, rng):
    """Ids of a short text (batch x time at most ``KEY_VALUES_MAX``) are not part of the native
    plan's key (only integer inputs of at most one axis are): one plan serves every sentence of
    that shape, built once."""
    from fastlayers.onnx import lowering

    builds = []
    real = lowering.lower
    monkeypatch.setattr(lowering, "lower", lambda *a: builds.append(1) or real(*a))
    ids = fastlayers.Input((None,), dtype="int32")
    h = L.Embedding(30, 8, mask_zero=True)(ids)
    model = fastlayers.Model(ids, L.Dense(2)(L.LSTM(6)(h)))
    for _ in range(6):
        x = rng.integers(0, 30, (1, 12)).astype(np.int32)
        x[0, :3] = 0
        got = model(x)
        assert_close(got, _layer_path(model, x), rtol=1e-5, atol=1e-6)
    assert builds == [1]
    assert _compiled(model, (plans.IDS, 2))._native.plan_for([x.astype(np.int64)]) is not None


#: Recurrent layers started from initial states (a seq2seq decoder's from its encoder's final
#: states): (layer class, options, Bidirectional merge mode or None, under an
#: Embedding(mask_zero=True) mask)
INITIAL_STATES = {
    "lstm": ("LSTM", {"return_sequences": True}, None, False),
    "gru_backwards": ("GRU", {"go_backwards": True, "return_state": True}, None, False),
    "rnn": ("SimpleRNN", {}, None, False),
    "bilstm": ("LSTM", {"return_sequences": True}, "concat", False),
    "lstm_masked_encoder": ("LSTM", {"return_sequences": True, "return_state": True}, None, True),
    "bigru_masked_encoder": ("GRU", {}, "ave", True),
}


def _seq2seq(lib, K, kind, options, merge, masked):
    """An encoder of ids (Embedding, a recurrent layer returning its states) and a decoder of
    the same kind on other features of the ids, started from the encoder's final states (both
    directions' for a Bidirectional: the encoder is one too). With ``masked``, the Embedding's
    mask_zero masks the encoder; the decoder, given initial_state, takes no mask (Keras 3)."""
    ids = lib.Input((None,), dtype="int32")
    h = K.Embedding(20, 8, mask_zero=masked)(ids)
    make = lambda **kw: getattr(K, kind)(6, **kw)  # noqa: E731
    encoder = make(return_state=True)
    if merge:
        _, *states = K.Bidirectional(encoder, merge_mode=merge)(h)
    else:
        _, *states = encoder(h)
    decoder = make(**options)
    features = K.Dense(5, activation="tanh")(h)
    y = (K.Bidirectional(decoder, merge_mode=merge) if merge else decoder)(features, initial_state=states)
    return lib.Model(ids, y)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("case", sorted(INITIAL_STATES))
def test_recurrent_layers_from_initial_states_compile(case, threads, keras, rng):
    """SimpleRNN / LSTM / GRU (go_backwards, returned states, Bidirectional, under a mask)
    started from initial states other layers give: the node's initial_h / initial_c on the
    native plan's loops, against Keras on torch and the layer path."""
    spec = INITIAL_STATES[case]
    ref = _seq2seq(SimpleNamespace(Input=keras.Input, Model=keras.Model), keras.layers, *spec)
    model = _seq2seq(OURS, L, *spec)
    model.set_weights([w * 2 for w in ref.get_weights()])
    ref.set_weights(model.get_weights())
    first = np.array([[0, 0, 3, 4, 5, 6, 7], [1, 2, 3, 0, 0, 0, 0], [7, 1, 8, 2, 9, 1, 3]], np.int32)
    for ids in (first, first, first, first[::-1].copy(), rng.integers(1, 20, (2, 4)).astype(np.int32)):
        got, want = _listed(model(ids)), ref(ids)
        want = list(want) if isinstance(want, (list, tuple)) else [want]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, keras.ops.convert_to_numpy(w), rtol=1e-4, atol=1e-5)
        for g, w in zip(got, _listed(_layer_path(model, ids))):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    compiled = _compiled(model, (plans.IDS, 2))
    assert compiled is not None
    plan = compiled._native.plan_for([first.astype(np.int64)])
    assert plan is not None
    native, fallbacks, _ = plan.summary
    assert not fallbacks
    kind = spec[0].replace("SimpleRNN", "RNN")
    assert sum(op.endswith(kind) for op in native) >= 2  # the encoder's and the decoder's


@pytest.mark.parametrize("merge", [None, "concat"])
def test_a_masked_recurrence_from_initial_states_compiles(merge, rng):
    """fastlayers' list form ``layer([x, *states])`` under an Embedding(mask_zero=True) mask (as
    tf.keras masked it): the masked node with initial states after its mask, on the native
    plan's loops, against the layer path; the mask is applied (a masked step repeats the last
    output, zeros under Bidirectional's zero_output_for_mask)."""
    ids = fastlayers.Input((None,), dtype="int32")
    h = L.Embedding(20, 8, mask_zero=True)(ids)
    encoder = L.LSTM(6, return_state=True)
    _, *states = (L.Bidirectional(encoder) if merge else encoder)(h)
    decoder = L.LSTM(6, return_sequences=True, return_state=True)
    y = (L.Bidirectional(decoder, merge_mode=merge) if merge else decoder)([L.Dense(5)(h), *states])
    model = fastlayers.Model(ids, y)
    first = np.array([[0, 0, 3, 4, 5, 6, 7], [1, 2, 3, 0, 0, 0, 0], [7, 1, 8, 2, 9, 1, 3]], np.int32)
    for x in (first, first, first, first[::-1].copy()):
        got = _listed(model(x))
        for g, w in zip(got, _listed(_layer_path(model, x))):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    padded = got[0][1, 3:]  # ids [1, 2, 3, 0, 0, 0, 0]: masked steps repeat the last output
    np.testing.assert_array_equal(padded, 0 * padded if merge else np.broadcast_to(got[0][1, 2], padded.shape))
    plan = _compiled(model, (plans.IDS, 2))._native.plan_for([first.astype(np.int64)])
    assert plan is not None
    native, fallbacks, _ = plan.summary
    assert not fallbacks and sum(op.endswith("MaskedLSTM") for op in native) == 2


def _caller_masked(lib, K, mask_dtype):
    """Recurrent layers masked by a model input (``mask=``): an LSTM returning its states, a
    Bidirectional GRU returning sequences (zero_output_for_mask) and a SimpleRNN from the LSTM's
    h, each reading the same mask."""
    x, m = lib.Input((None, 4)), lib.Input((None,), dtype=mask_dtype)
    y, h, _ = K.LSTM(5, return_state=True)(x, mask=m)
    s = K.Bidirectional(K.GRU(3, return_sequences=True))(x, mask=m)
    r = K.SimpleRNN(5, go_backwards=True)(x, initial_state=[h], mask=m)
    return lib.Model([x, m], [y, h, s, r])


@pytest.mark.parametrize("mask_dtype", ["bool", "int32", "float32"])
def test_masks_given_by_the_caller_compile(mask_dtype, keras, rng):
    """A mask from a model input (bool, integers or floats: nonzero is a step taken) read by
    recurrent layers only: the compiled model takes it as a bool input of fastlayers' masked
    nodes, against Keras on torch and the layer path; the native plan serves; a mask of the
    wrong shape is the layer path's error."""
    ref = _caller_masked(SimpleNamespace(Input=keras.Input, Model=keras.Model), keras.layers, mask_dtype)
    model = _caller_masked(OURS, L, mask_dtype)
    model.set_weights([w * 2 for w in ref.get_weights()])
    ref.set_weights(model.get_weights())
    x = rng.standard_normal((3, 6, 4)).astype(np.float32)
    m = np.array([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 1, 1]]).astype(mask_dtype)
    for xs in ([x, m], [x, m], [x, m], [x[:, ::-1].copy(), m[::-1].copy()]):
        got, want = model(xs), ref(xs)
        for g, w in zip(got, want):
            assert_close(g, keras.ops.convert_to_numpy(w), rtol=1e-4, atol=1e-5)
        for g, w in zip(got, _layer_path(model, xs)):
            assert_close(g, w, rtol=1e-5, atol=1e-6)
    compiled = _compiled(model, (3, (plans.MASK, 2)))
    assert compiled is not None
    plan = compiled._native.plan_for([x, m != 0])
    assert plan is not None
    native, fallbacks, _ = plan.summary
    assert not fallbacks and sum("Masked" in op for op in native) == 3
    with pytest.raises(ShapeError, match="mask of shape"):
        model([x, m[:, :5]])


def test_a_mask_input_read_as_data_keeps_the_layer_path(rng):
    """A mask input that another layer also reads as values: not a mask input, the layer path."""
    x, m = fastlayers.Input((5, 4)), fastlayers.Input((5,))
    y = L.LSTM(3)(x, mask=m)
    model = fastlayers.Model([x, m], [y, L.Dense(2)(m)])
    xs = [rng.standard_normal((2, 5, 4)).astype(np.float32), np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)]
    for _ in range(2):
        got = model(xs)
    for g, w in zip(got, _layer_path(model, xs)):
        np.testing.assert_array_equal(g, w)
    assert not any(type(e) is tuple and len(e) == 3 and e[2] is not None for e in model._plans.values())


def _encoder(causal=False, max_length=16):
    ids = fastlayers.Input((None,), dtype="int32")
    h = L.PositionalEncoding(max_length=max_length, scale_input=True)(L.Embedding(30, 8)(ids))
    h = L.LayerNormalization()(L.Add()([h, L.SelfAttention(2, 4, use_causal_mask=causal)(h)]))
    h = L.LayerNormalization()(L.Add()([h, L.PositionwiseFeedForward(16, activation="gelu")(h)]))
    return fastlayers.Model(ids, L.Dense(3)(h))


def test_fastlayers_transformer_parts_compile(rng):
    """SelfAttention, PositionalEncoding (its rows sliced to each call's length) and
    PositionwiseFeedForward against the layer path, at two sequence lengths (causal too); a
    sequence longer than the table is the layer's error."""
    model = _encoder()
    for steps in (5, 11):
        ids = rng.integers(0, 30, (2, steps))
        for _ in range(2):
            got = model(ids)
        assert_close(got, _layer_path(model, ids), rtol=1e-5, atol=1e-6)
    assert _compiled(model, (plans.IDS, 2)) is not None
    with pytest.raises(ShapeError, match="PositionalEncoding"):
        model(rng.integers(0, 30, (1, 17)))
    causal = _encoder(causal=True)
    for steps in (6, 9):
        ids = rng.integers(0, 30, (2, steps))
        for _ in range(3):  # the third call runs the native plan built at the second
            got = causal(ids)
        assert_close(got, _layer_path(causal, ids), rtol=1e-5, atol=1e-6)
        assert_close(got[:, :3], causal(ids[:, :3]), rtol=1e-5, atol=1e-6)  # no step sees a later one
    assert _compiled(causal, (plans.IDS, 2)) is not None


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_inception_and_nin_blocks_compile(data_format, rng):
    """InceptionBlock (four branches concatenated) and NiNBlock (strided 'same' and 'valid'
    convolutions, 1x1 convolutions, with and without its global pool) against the layer path."""
    shape = (9, 10, 3) if data_format == "channels_last" else (3, 9, 10)
    x = fastlayers.Input(shape)
    h = L.InceptionBlock(4, 3, 5, 2, 3, 2, data_format=data_format)(x)
    h = L.NiNBlock(6, 3, strides=2, padding="same", mlp_filters=[5, 4], global_pool=False, data_format=data_format)(h)
    a = L.GlobalAveragePooling2D(data_format=data_format)(h)
    b = L.NiNBlock(3, (2, 3), padding="valid", activation="tanh", data_format=data_format)(h)
    model = fastlayers.Model(x, L.Concatenate()([a, b]))
    for layer in model.layers[1:]:  # non-zero biases
        layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.3 for w in layer.get_weights()])
    y = rng.standard_normal((2, *shape)).astype(np.float32)
    for _ in range(2):
        got = model(y)
    assert _compiled(model, 4) is not None
    assert_close(got, _layer_path(model, y), rtol=1e-5, atol=1e-5)


def test_hard_attention_compiles(rng):
    """HardAttention (a fastlayers extra) against the layer path: the first of tied maxima, with
    and without its scale; a query whose every key scores -inf takes zeros."""
    x = fastlayers.Input((6, 4))
    h = L.Conv1D(4, 1)(x)
    a = L.HardAttention()([h, x])
    b = L.HardAttention(use_scale=True)([x, h, L.Conv1D(4, 1)(h)])
    model = fastlayers.Model(x, L.Concatenate()([a, b]))
    y = rng.standard_normal((2, 6, 4)).astype(np.float32)
    y[:, 4] = y[:, 1]  # tied keys: the first wins
    for _ in range(3):  # the third call runs the native plan built at the second
        got = model(y)
    assert _compiled(model, 3) is not None
    assert_close(got, _layer_path(model, y), rtol=1e-5, atol=1e-6)

    q, v, k = (fastlayers.Input((5, 3)) for _ in range(3))
    model = fastlayers.Model([q, v, k], L.Conv1D(2, 1)(L.HardAttention()([q, v, k])))
    qs, vs = rng.standard_normal((2, 2, 5, 3)).astype(np.float32)
    ks = -np.abs(rng.standard_normal((2, 5, 3))).astype(np.float32) - 0.1  # every key below 0
    qs[1, 2] = np.inf  # its scores: -inf for every key
    for _ in range(3):
        got = model([qs, vs, ks])
    assert _compiled(model, (3, 3, 3)) is not None
    want = _layer_path(model, [qs, vs, ks])
    assert_close(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1, 2], model.layers[-1].bias)  # zeros attended


def test_hard_attention_with_a_causal_mask_and_its_weights_compiles(rng):
    """HardAttention's use_causal_mask (a later key never chosen, with fewer keys than queries
    and more) and its returned one-hot weights against the layer path."""
    x = fastlayers.Input((6, 4))
    h = L.Conv1D(4, 1)(x)
    half = L.Conv1D(4, 2, strides=2)(h)  # 3 steps
    a, w = L.HardAttention()([h, x], use_causal_mask=True, return_attention_scores=True)
    b = L.HardAttention(use_scale=True)([half, h], use_causal_mask=True)
    c, v = L.HardAttention()([h, half], return_attention_scores=True)
    model = fastlayers.Model(x, [L.Concatenate()([a, c]), b, w, v])
    y = rng.standard_normal((2, 6, 4)).astype(np.float32)
    for _ in range(3):  # the third call runs the native plan built at the second
        got = model(y)
    assert _compiled(model, 3) is not None
    for g, lp in zip(got, _layer_path(model, y)):
        assert_close(g, lp, rtol=1e-5, atol=1e-6)
    assert not np.any(np.triu(got[2], 1)) and np.all(got[2].sum(-1) == 1)  # causal one-hot rows
