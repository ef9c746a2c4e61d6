"""Keras-style attention layers against Keras 3 (torch backend): Attention, AdditiveAttention,
MultiHeadAttention with every mask, Tq != Tk, one head, odd lengths, batch 1, attention axes;
the fastlayers extras; symbolic calls inside functional models and native save/load."""

import math

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as fl
from fastlayers.errors import ShapeError, UnsupportedError

from ..conftest import assert_close


def kn(keras, y):
    return np.asarray(keras.ops.convert_to_numpy(y))


def random_weights(layer, rng, low=None):
    ws = []
    for w in layer.get_weights():
        w = np.asarray(w)
        ws.append(
            rng.uniform(0.5, 1.5, w.shape).astype(np.float32)
            if low
            else (rng.standard_normal(w.shape) * 0.5).astype(np.float32)
        )
    layer.set_weights(ws)


def masks(kind, rng, b, tq, tk):
    """Keras masks (True = attend): (value_mask (b, tk), causal flag); one fully masked batch row."""
    vm = None
    if kind in ("padding", "both", "full"):
        vm = rng.random((b, tk)) < 0.7
        vm[:, 0] = True
        if kind == "full":
            vm[-1] = False
    return vm, kind in ("causal", "both")


DENSE_CASES = [
    ("Attention", {}),
    ("Attention", {"use_scale": True}),
    ("Attention", {"score_mode": "concat"}),
    ("Attention", {"score_mode": "concat", "use_scale": True}),
    ("AdditiveAttention", {}),
    ("AdditiveAttention", {"use_scale": False}),
]


@pytest.mark.parametrize("name,kwargs", DENSE_CASES)
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both", "full"])
@pytest.mark.parametrize("b,tq,tk", [(2, 5, 7), (1, 3, 3)])
def test_dense_attention_matches_keras(name, kwargs, mask, b, tq, tk, keras, rng, backend):
    q = rng.standard_normal((b, tq, 6)).astype(np.float32)
    v = rng.standard_normal((b, tk, 4)).astype(np.float32)
    k = rng.standard_normal((b, tk, 6)).astype(np.float32)
    vm, causal = masks(mask, rng, b, tq, tk)
    qm = rng.random((b, tq)) < 0.8 if mask != "none" else None
    ref = getattr(keras.layers, name)(**kwargs)
    ref([q, v, k])
    random_weights(ref, rng, low=True)
    ours = getattr(fl, name)(**kwargs)
    ours([q, v, k])
    ours.set_weights(ref.get_weights())
    m = None if vm is None else [qm, vm]
    o, s = ref([q, v, k], mask=m, return_attention_scores=True, use_causal_mask=causal)
    o2, s2 = ours([q, v, k], mask=m, return_attention_scores=True, use_causal_mask=causal)
    assert_close(o2, kn(keras, o), atol=1e-5)
    assert_close(s2, kn(keras, s), atol=1e-6)
    assert_close(ours([q, k]), kn(keras, ref([q, k])), atol=1e-5)  # key defaults to value


MHA_CASES = [
    ({"num_heads": 2, "key_dim": 3}, (2, 5, 6), (2, 7, 8)),
    ({"num_heads": 1, "key_dim": 4, "value_dim": 5, "output_shape": 3}, (1, 3, 6), (1, 3, 6)),
    ({"num_heads": 3, "key_dim": 2, "use_bias": False, "output_shape": (2, 2)}, (2, 7, 5), (2, 4, 5)),
]


@pytest.mark.parametrize("kwargs,qs,vs", MHA_CASES)
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both", "full"])
def test_multi_head_attention_matches_keras(kwargs, qs, vs, mask, keras, rng, backend):
    q, v = rng.standard_normal(qs).astype(np.float32), rng.standard_normal(vs).astype(np.float32)
    key = rng.standard_normal(vs[:-1] + (7,)).astype(np.float32)
    b, tq, tk = qs[0], qs[1], vs[1]
    am = None
    if mask in ("padding", "both", "full"):
        am = rng.random((b, tq, tk)) < 0.7
        am[..., 0] = True
        if mask == "full":
            am[0, -1] = False  # one fully masked query
    causal = mask in ("causal", "both")
    ref = keras.layers.MultiHeadAttention(**kwargs)
    ref(q, v, key)
    random_weights(ref, rng)
    ours = fl.MultiHeadAttention(**kwargs)
    ours(q, v, key)
    ours.set_weights(ref.get_weights())
    assert [w.shape for w in ours.get_weights()] == [tuple(w.shape) for w in ref.get_weights()]
    o, s = ref(q, v, key, attention_mask=am, use_causal_mask=causal, return_attention_scores=True)
    o2, s2 = ours(q, v, key, attention_mask=am, use_causal_mask=causal, return_attention_scores=True)
    assert_close(o2, kn(keras, o), rtol=1e-4, atol=1e-5)
    assert_close(s2, kn(keras, s), atol=1e-6)
    # the fused path of Keras (no scores) agrees too
    o3 = ref(q, v, key, attention_mask=am, use_causal_mask=causal)
    assert_close(ours(q, v, key, attention_mask=am, use_causal_mask=causal), kn(keras, o3), rtol=1e-4, atol=1e-5)


def _self_attention_pair(keras, rng, x, *args, **kwargs):
    """Keras's MultiHeadAttention(*args, **kwargs) built on (x, x) with random weights, and
    fastlayers' with the same weights."""
    ref = keras.layers.MultiHeadAttention(*args, **kwargs)
    ref(x, x)
    random_weights(ref, rng)
    ours = fl.MultiHeadAttention(*args, **kwargs)
    ours(x, x)
    ours.set_weights(ref.get_weights())
    return ref, ours


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
def test_multi_head_self_attention_runs_as_one_op(use_bias, batch, keras, rng, backend, monkeypatch):
    """One array as query, key and value, heads of width dim / num_heads, no mask or scores:
    one ``ops.self_attention`` call on the q/k/v kernels side by side, equal to Keras; with a
    mask, causal, or scores the general path runs."""
    x = rng.standard_normal((batch, 6, 8)).astype(np.float32)
    ref, ours = _self_attention_pair(keras, rng, x, 2, 4, use_bias=use_bias)
    fused, real = [], fl.MultiHeadAttention._self_attention
    monkeypatch.setattr(fl.MultiHeadAttention, "_self_attention", lambda self, q: fused.append(1) or real(self, q))
    for _ in range(2):
        assert_close(ours(x, x), kn(keras, ref(x, x)), rtol=1e-4, atol=1e-5)
    assert len(fused) == 2
    causal = ours(x, x, use_causal_mask=True)
    assert len(fused) == 2
    assert_close(causal, kn(keras, ref(x, x, use_causal_mask=True)), rtol=1e-4, atol=1e-5)
    ours.set_weights([w * 0.5 for w in ref.get_weights()])  # new weights reach the op
    ref.set_weights([w * 0.5 for w in ref.get_weights()])
    assert_close(ours(x, x), kn(keras, ref(x, x)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes", [None, (2,), (1,), (1, 2)])
def test_multi_head_attention_axes_match_keras(axes, keras, rng, backend):
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    ref, ours = _self_attention_pair(keras, rng, x, 2, 3, attention_axes=axes)
    o, s = ref(x, x, return_attention_scores=True)
    o2, s2 = ours(x, x, return_attention_scores=True)
    assert s2.shape == tuple(s.shape)
    assert_close(o2, kn(keras, o), rtol=1e-4, atol=1e-5)
    assert_close(s2, kn(keras, s), atol=1e-6)


def test_multi_head_attention_in_functional_model_and_round_trip(keras, rng, tmp_path, backend):
    q_in, v_in, m_in = Input((5, 6), name="q"), Input((7, 8), name="v"), Input((5, 7), name="m")
    mha = fl.MultiHeadAttention(2, 3, name="mha")
    out, scores = mha(q_in, v_in, attention_mask=m_in, return_attention_scores=True)
    assert out.shape == (None, 5, 6) and scores.shape == (None, 2, 5, 7)
    y = fl.Dense(4, name="head")(out)
    model = Model([q_in, v_in, m_in], [y, scores])
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in model.get_weights()])
    q = rng.standard_normal((3, 5, 6)).astype(np.float32)
    v = rng.standard_normal((3, 7, 8)).astype(np.float32)
    m = rng.random((3, 5, 7)) < 0.7
    got_y, got_s = model([q, v, m])
    want_o, want_s = mha(q, v, attention_mask=m, return_attention_scores=True)
    assert_close(got_s, want_s)
    assert_close(got_y, model.get_layer("head")(want_o))
    # against Keras with the same weights
    ref = keras.layers.MultiHeadAttention(2, 3)
    ref(q, v)
    ref.set_weights(mha.get_weights())
    o, s = ref(q, v, attention_mask=m, return_attention_scores=True)
    assert_close(got_s, kn(keras, s), atol=1e-6)
    path = tmp_path / "mha.flm"
    model.save(path)
    loaded = fastlayers.load(path)
    for a, b in zip(loaded([q, v, m]), model([q, v, m])):
        assert_close(a, b, rtol=0, atol=0)


def test_self_attention_and_extras_round_trip(rng, tmp_path):
    x_in = Input((6, 8))
    h = fl.PositionalEncoding(max_length=16, name="pe")(x_in)
    h, s = fl.SelfAttention(2, 4, use_causal_mask=True, return_attention_scores=True, name="sa")(h)
    h = fl.PositionwiseFeedForward(12, activation="gelu", name="ff")(h)
    k_in = Input((6, 8))
    hard, w = fl.HardAttention(name="hard")([h, k_in], return_attention_scores=True)
    a = fl.Attention(use_scale=True, name="att")([h, k_in])
    ad = fl.AdditiveAttention(name="add")([h, k_in])
    model = Model([x_in, k_in], [hard, w, s, a, ad])
    model.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in model.get_weights()])
    x = rng.standard_normal((2, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 6, 8)).astype(np.float32)
    path = tmp_path / "extras.flm"
    model.save(path)
    loaded = fastlayers.load(path)
    for got, want in zip(loaded([x, k]), model([x, k])):
        assert_close(got, want, rtol=0, atol=0)
    assert np.all(model([x, k])[2][..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)


def test_self_attention_equals_multi_head_attention(rng, backend):
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    sa = fl.SelfAttention(2, 3, use_causal_mask=True, return_attention_scores=True)
    sa(x)
    mha = fl.MultiHeadAttention(2, 3)
    mha(x, x)
    mha.set_weights(sa.get_weights())
    o, s = sa(x)
    o2, s2 = mha(x, x, use_causal_mask=True, return_attention_scores=True)
    assert_close(o, o2, rtol=0, atol=0)
    assert_close(s, s2, rtol=0, atol=0)


def test_hard_attention_picks_the_argmax_value(rng, backend):
    q = rng.standard_normal((2, 4, 5)).astype(np.float32)
    k = rng.standard_normal((2, 6, 5)).astype(np.float32)
    v = rng.standard_normal((2, 6, 3)).astype(np.float32)
    vm = np.ones((2, 6), bool)
    vm[0, :2] = False
    vm[1] = False  # nothing to attend: zeros
    layer = fl.HardAttention()
    out, w = layer([q, v, k], mask=[None, vm], return_attention_scores=True)
    scores = np.where(vm[:, None, :], q @ k.transpose(0, 2, 1), -np.inf)
    idx = scores.argmax(-1)
    assert_close(out[0], v[0][idx[0]], rtol=0, atol=0)
    assert np.all(out[1] == 0) and np.all(w[1] == 0)
    assert np.all(w[0].sum(-1) == 1) and np.all(w[0][:, :2] == 0)
    causal = layer([q, v, k], use_causal_mask=True, return_attention_scores=True)[1]
    assert np.all(causal[:, 0, 1:] == 0)


def test_positional_encoding_matches_the_paper_and_torch_tutorial(torch, rng, backend):
    d, T = 10, 7
    x = rng.standard_normal((2, T, d)).astype(np.float32)
    pe = fl.PositionalEncoding(max_length=50)
    # the formula of "Attention Is All You Need", in float64
    pos, i = np.arange(T)[:, None], np.arange(d)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    assert_close(pe(x), x + table, atol=1e-6)
    # the PyTorch tutorial's construction
    position = torch.arange(50).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    ref = torch.zeros(50, d)
    ref[:, 0::2] = torch.sin(position * div_term)
    ref[:, 1::2] = torch.cos(position * div_term)
    assert_close(pe.table, ref.numpy(), atol=2e-6)
    assert_close(fl.PositionalEncoding(scale_input=True)(x), x * math.sqrt(d) + table, atol=1e-5)
    with pytest.raises(ShapeError):
        fl.PositionalEncoding(max_length=4)(x)


def test_positionwise_feed_forward_matches_keras_dense_stack(keras, rng, backend):
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    ref = keras.Sequential([keras.layers.Dense(9, activation="gelu"), keras.layers.Dense(6)])
    ref(x)
    random_weights(ref, rng)
    ours = fl.PositionwiseFeedForward(9, activation="gelu")
    ours(x)
    ours.set_weights(ref.get_weights())
    assert_close(ours(x), kn(keras, ref(x)), rtol=1e-5, atol=1e-5)


def test_attention_layer_errors(rng):
    q = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ShapeError):
        fl.Attention()([q, np.zeros((2, 3), np.float32)])
    with pytest.raises(ShapeError):
        fl.Attention()([q, q, np.zeros((2, 5, 4), np.float32)])
    with pytest.raises(UnsupportedError):
        fl.Attention(score_mode="general")
    with pytest.raises(ShapeError, match="attention_mask"):
        fl.MultiHeadAttention(2, 2)(q, q, attention_mask=np.ones((2, 5, 5), bool))
    with pytest.raises(UnsupportedError):
        fl.MultiHeadAttention(2, 2, use_gate=True)
    x = Input((3, 4))
    with pytest.raises(UnsupportedError):
        fl.MultiHeadAttention(2, 2)(x, x, attention_mask=np.ones((1, 3, 3), bool))


def test_multi_head_attention_query_value_key_masks_match_keras(keras, rng, backend):
    q = rng.standard_normal((2, 4, 6)).astype(np.float32)
    v = rng.standard_normal((2, 5, 6)).astype(np.float32)
    k = rng.standard_normal((2, 5, 6)).astype(np.float32)
    qm, vm, km = rng.random((2, 4)) < 0.7, rng.random((2, 5)) < 0.7, rng.random((2, 5)) < 0.8
    vm[:, 0] = km[:, 0] = True
    am = rng.random((2, 4, 5)) < 0.8
    ref = keras.layers.MultiHeadAttention(2, 3)
    ref(q, v, k)
    random_weights(ref, rng)
    ours = fl.MultiHeadAttention(2, 3)
    ours(q, v, k)
    ours.set_weights(ref.get_weights())
    kw = dict(value_mask=vm, key_mask=km, attention_mask=am, return_attention_scores=True)
    o, s = ref(q, v, k, **kw)
    o2, s2 = ours(q, v, k, **kw)
    assert_close(o2, kn(keras, o), rtol=1e-4, atol=1e-5)
    assert_close(s2, kn(keras, s), atol=1e-6)
    with pytest.raises(UnsupportedError, match="query_mask"):  # Keras ignores it; we refuse it
        ours(q, v, k, query_mask=qm)
