"""fastlayers.nn attention and transformers against torch: MultiheadAttention (packed and
separate projections, bias_k/bias_v, add_zero_attn, bool and float masks), scaled dot-product
attention, Transformer encoder/decoder layers and stacks, greedy decoding."""

import warnings

import numpy as np
import pytest

import fastlayers.nn as nn
import fastlayers.nn.functional as F
from fastlayers.errors import InputError, ShapeError

from ..conftest import assert_close

E, H = 8, 2


def t(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a))


def randomize(module, rng, torch):
    with torch.no_grad():
        for p in module.state_dict().values():
            if p.dtype.is_floating_point:
                p.copy_(t(torch, (rng.standard_normal(tuple(p.shape)) * 0.5).astype(np.float32)))


def pair(torch, rng, cls, *args, **kwargs):
    ref = getattr(torch.nn, cls)(*args, **kwargs).eval()
    randomize(ref, rng, torch)
    ours = getattr(nn, cls)(*args, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    return ref, ours


def masks_for(kind, rng, n, lq, s, torch_bool=True):
    """(key_padding_mask (N, S), attn_mask (L, S)) in torch's MHA meaning (True = ignore)."""
    kpm = am = None
    if kind in ("padding", "both", "float"):
        kpm = np.zeros((n, s), bool)
        kpm[0, s - 2 :] = True
    if kind in ("causal", "both"):
        am = np.triu(np.ones((lq, s), bool), k=1)
    if kind == "float":
        am = (rng.standard_normal((lq, s)) * 0.5).astype(np.float32)
        kpm = np.where(kpm, np.float32(-np.inf), np.float32(0))
    return kpm, am


MHA_CONFIGS = [
    {},
    {"kdim": 5, "vdim": 3},
    {"add_bias_kv": True, "add_zero_attn": True},
    {"bias": False},
    {"batch_first": True},
]


@pytest.mark.parametrize("config", MHA_CONFIGS)
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both", "float"])
def test_multihead_attention_matches_torch(config, mask, torch, rng, backend):
    ref, ours = pair(torch, rng, "MultiheadAttention", E, H, **config)
    n, lq, s = 3, 4, 5  # Tq != Tk, odd lengths
    kd, vd = config.get("kdim", E), config.get("vdim", E)
    bf = config.get("batch_first", False)
    shp = (lambda length, d: (n, length, d)) if bf else (lambda length, d: (length, n, d))
    q = rng.standard_normal(shp(lq, E)).astype(np.float32)
    k = rng.standard_normal(shp(s, kd)).astype(np.float32)
    v = rng.standard_normal(shp(s, vd)).astype(np.float32)
    kpm, am = masks_for(mask, rng, n, lq, s)
    for avg in (True, False):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            o, w = ref(
                t(torch, q),
                t(torch, k),
                t(torch, v),
                key_padding_mask=None if kpm is None else t(torch, kpm),
                attn_mask=None if am is None else t(torch, am),
                average_attn_weights=avg,
            )
        o2, w2 = ours(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=avg)
        assert_close(o2, o.numpy(), rtol=1e-5, atol=1e-5)
        assert_close(w2, w.numpy(), rtol=1e-5, atol=1e-6)
    o3, none = ours(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert none is None
    assert_close(o3, o2)


def test_multihead_attention_self_one_head_batch1_unbatched_and_3d_mask(torch, rng, backend):
    ref, ours = pair(torch, rng, "MultiheadAttention", 6, 1)
    x = rng.standard_normal((7, 1, 6)).astype(np.float32)  # batch 1, odd length
    with torch.no_grad():
        o, w = ref(t(torch, x), t(torch, x), t(torch, x))
    o2, w2 = ours(x, x, x)
    assert_close(o2, o.numpy(), atol=1e-5)
    assert_close(w2, w.numpy(), atol=1e-6)
    xu = x[:, 0]  # unbatched (L, E)
    with torch.no_grad():
        o, w = ref(t(torch, xu), t(torch, xu), t(torch, xu))
    o2, w2 = ours(xu, xu, xu)
    assert o2.shape == (7, 6) and w2.shape == (7, 7)
    assert_close(o2, o.numpy(), atol=1e-5)
    ref, ours = pair(torch, rng, "MultiheadAttention", E, H, batch_first=True)
    q = rng.standard_normal((2, 3, E)).astype(np.float32)
    am = rng.random((2 * H, 3, 3)) < 0.3
    am[:, :, 0] = False
    with torch.no_grad():
        o, w = ref(t(torch, q), t(torch, q), t(torch, q), attn_mask=t(torch, am), average_attn_weights=False)
    o2, w2 = ours(q, q, q, attn_mask=am, average_attn_weights=False)
    assert_close(o2, o.numpy(), atol=1e-5)
    assert_close(w2, w.numpy(), atol=1e-6)


def test_multihead_attention_fully_masked_row_is_nan_like_torch(torch, rng, backend):
    ref, ours = pair(torch, rng, "MultiheadAttention", E, H, batch_first=True)
    x = rng.standard_normal((2, 3, E)).astype(np.float32)
    kpm = np.zeros((2, 3), bool)
    kpm[1] = True
    with torch.no_grad():
        o, w = ref(t(torch, x), t(torch, x), t(torch, x), key_padding_mask=t(torch, kpm))
    o2, w2 = ours(x, x, x, key_padding_mask=kpm)
    assert np.isnan(o.numpy()[1]).all() and np.isnan(o2[1]).all() and np.isnan(w2[1]).all()
    assert_close(o2[0], o.numpy()[0], atol=1e-5)


def test_multihead_attention_errors():
    with pytest.raises(InputError):
        nn.MultiheadAttention(6, 4)
    m = nn.MultiheadAttention(E, H, batch_first=True)
    x = np.zeros((2, 3, E), np.float32)
    with pytest.raises(ShapeError, match="MultiheadAttention"):
        m(x, np.zeros((2, 3, 5), np.float32), x)
    with pytest.raises(ShapeError, match="key_padding_mask"):
        m(x, x, x, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(InputError, match="is_causal"):
        m(x, x, x, is_causal=True)


SDPA_CASES = [
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {"is_causal": True}),
    ((2, 3, 6, 8), (2, 3, 4, 8), (2, 3, 4, 8), {"is_causal": True, "scale": 0.3}),
    ((1, 1, 1, 4), (1, 1, 1, 4), (1, 1, 1, 4), {}),
    ((5, 8), (7, 8), (7, 3), {"mask": "bool"}),
    ((2, 4, 8), (2, 7, 8), (2, 7, 8), {"mask": "float"}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), {"mask": "bool4"}),
]


@pytest.mark.parametrize("qs,ks,vs,opts", SDPA_CASES)
def test_scaled_dot_product_attention_matches_torch(qs, ks, vs, opts, torch, rng, backend):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qs, ks, vs))
    opts = dict(opts)
    kind = opts.pop("mask", None)
    mask = None
    if kind == "bool":  # True = take part; one row all False
        mask = rng.random((qs[-2], ks[-2])) < 0.7
        mask[0] = False
    elif kind == "float":
        mask = (rng.standard_normal((qs[-2], ks[-2]))).astype(np.float32)
    elif kind == "bool4":
        mask = rng.random((qs[0], 1, qs[-2], ks[-2])) < 0.6
    with torch.no_grad():
        want = torch.nn.functional.scaled_dot_product_attention(
            t(torch, q), t(torch, k), t(torch, v), attn_mask=None if mask is None else t(torch, mask), **opts
        ).numpy()
    got, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True, **opts)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert w.shape == (*np.broadcast_shapes(qs[:-2], ks[:-2]), qs[-2], ks[-2])


def test_sdpa_gqa_and_errors(torch, rng):
    q = rng.standard_normal((1, 4, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    with torch.no_grad():
        want = torch.nn.functional.scaled_dot_product_attention(
            t(torch, q), t(torch, k), t(torch, v), enable_gqa=True
        ).numpy()
    assert_close(F.scaled_dot_product_attention(q, k, v, enable_gqa=True), want, atol=1e-5)
    with pytest.raises(InputError):
        F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 3), bool), is_causal=True)
    with pytest.raises(ShapeError):
        F.scaled_dot_product_attention(q, k[..., :4], v)


ENC_CONFIGS = [
    {},
    {"norm_first": True, "activation": "gelu"},
    {"batch_first": True, "activation": "gelu"},
    {"batch_first": True, "norm_first": True, "bias": False},
]


def seq_first(x, bf):
    return x if bf else np.swapaxes(x, 0, 1).copy()


@pytest.mark.parametrize("config", ENC_CONFIGS)
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "both"])
def test_transformer_encoder_layer_matches_torch(config, mask, torch, rng, backend):
    ref, ours = pair(torch, rng, "TransformerEncoderLayer", E, H, dim_feedforward=16, dropout=0.0, **config)
    bf = config.get("batch_first", False)
    x = seq_first(rng.standard_normal((3, 5, E)).astype(np.float32), bf)
    kpm, am = masks_for(mask, rng, 3, 5, 5)
    with torch.no_grad():
        want = ref(
            t(torch, x),
            src_mask=None if am is None else t(torch, am),
            src_key_padding_mask=None if kpm is None else t(torch, kpm),
        ).numpy()
    got = ours(x, src_mask=am, src_key_padding_mask=kpm)
    assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_encoder_layer_runs_as_one_primitive_unless_it_cannot(torch, rng, monkeypatch):
    """The plain layer calls ``ops.encoder_layer`` once; a callable activation or bias_k/bias_v
    run block by block, and both match torch."""
    from fastlayers.backends import get_ops

    calls = []
    ops = type(get_ops())
    real = ops.encoder_layer
    monkeypatch.setattr(ops, "encoder_layer", lambda self, *a: calls.append(1) or real(self, *a))
    x = rng.standard_normal((3, 5, E)).astype(np.float32)

    def act(z):  # a callable both frameworks can run
        return z * 0.5 - z * z * 0.01

    for kwargs, bias_kv, fused in [({}, False, True), ({"activation": act}, False, False), ({}, True, False)]:
        ref, ours = pair(torch, rng, "TransformerEncoderLayer", E, H, 16, 0.0, batch_first=True, **kwargs)
        if bias_kv:
            ref.self_attn, ours.self_attn = pair(
                torch, rng, "MultiheadAttention", E, H, add_bias_kv=True, batch_first=True
            )
        calls.clear()
        want = ref(t(torch, x)).detach().numpy()  # with grad: torch's own fast path drops bias_k
        assert_close(ours(x), want, rtol=1e-4, atol=1e-5)
        assert calls == ([1] if fused else [])


@pytest.mark.parametrize("config", ENC_CONFIGS[:3])
def test_transformer_decoder_layer_matches_torch(config, torch, rng, backend):
    ref, ours = pair(torch, rng, "TransformerDecoderLayer", E, H, dim_feedforward=16, dropout=0.0, **config)
    bf = config.get("batch_first", False)
    tgt = seq_first(rng.standard_normal((2, 4, E)).astype(np.float32), bf)
    mem = seq_first(rng.standard_normal((2, 7, E)).astype(np.float32), bf)
    tmask = nn.generate_square_subsequent_mask(4)
    mkpm = np.zeros((2, 7), bool)
    mkpm[1, 5:] = True
    with torch.no_grad():
        want = ref(
            t(torch, tgt),
            t(torch, mem),
            tgt_mask=t(torch, tmask),
            tgt_is_causal=True,
            memory_key_padding_mask=t(torch, mkpm),
        ).numpy()
    got, (w_self, w_cross) = ours(
        tgt, mem, tgt_mask=tmask, tgt_is_causal=True, memory_key_padding_mask=mkpm, return_attention_weights=True
    )
    assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert w_self.shape == (2, H, 4, 4) and w_cross.shape == (2, H, 4, 7)
    assert np.all(w_self[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)
    assert np.all(w_cross[1, ..., 5:] == 0)


def test_transformer_stacks_match_torch(torch, rng, backend):
    enc_ref = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True),
        2,
        norm=torch.nn.LayerNorm(E),
        enable_nested_tensor=False,
    ).eval()
    dec_ref = torch.nn.TransformerDecoder(
        torch.nn.TransformerDecoderLayer(E, H, 16, 0.0, batch_first=True), 2, norm=torch.nn.LayerNorm(E)
    ).eval()
    for m in (enc_ref, dec_ref):
        randomize(m, rng, torch)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True), 2, norm=nn.LayerNorm(E))
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, 16, 0.0, batch_first=True), 2, norm=nn.LayerNorm(E))
    for ours, ref in ((enc, enc_ref), (dec, dec_ref)):
        assert list(ours.state_dict()) == list(ref.state_dict())
        ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    src = rng.standard_normal((2, 6, E)).astype(np.float32)
    tgt = rng.standard_normal((2, 3, E)).astype(np.float32)
    kpm = np.zeros((2, 6), bool)
    kpm[0, 4:] = True
    with torch.no_grad():
        mem_ref = enc_ref(t(torch, src), src_key_padding_mask=t(torch, kpm))
        out_ref = dec_ref(
            t(torch, tgt),
            mem_ref,
            tgt_mask=t(torch, nn.generate_square_subsequent_mask(3)),
            memory_key_padding_mask=t(torch, kpm),
        ).numpy()
    mem, enc_w = enc(src, src_key_padding_mask=kpm, return_attention_weights=True)
    assert_close(mem, mem_ref.numpy(), rtol=1e-4, atol=1e-5)
    out = dec(tgt, mem, tgt_mask=nn.generate_square_subsequent_mask(3), memory_key_padding_mask=kpm)
    assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    assert len(enc_w) == 2 and enc_w[0].shape == (2, H, 6, 6)


def test_greedy_decode_matches_torch_loop(torch, rng, backend):
    vocab, d = 11, E
    emb_ref = torch.nn.Embedding(vocab, d)
    tr_ref = torch.nn.Transformer(d, H, 1, 1, 16, 0.0, batch_first=True).eval()
    head_ref = torch.nn.Linear(d, vocab)
    for m in (emb_ref, tr_ref, head_ref):
        randomize(m, rng, torch)
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, H, 16, 0.0, batch_first=True), 1, norm=nn.LayerNorm(d))
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, H, 16, 0.0, batch_first=True), 1, norm=nn.LayerNorm(d))
    emb.load_state_dict(emb_ref.state_dict())
    head.load_state_dict(head_ref.state_dict())
    sd = {k: v.numpy() for k, v in tr_ref.state_dict().items()}
    enc.load_state_dict({k[len("encoder.") :]: v for k, v in sd.items() if k.startswith("encoder.")})
    dec.load_state_dict({k[len("decoder.") :]: v for k, v in sd.items() if k.startswith("decoder.")})
    src = rng.integers(1, vocab, (3, 5))

    def step(ys, memory):
        mask = nn.generate_square_subsequent_mask(ys.shape[1])
        return head(dec(emb(ys), memory, tgt_mask=mask))

    got = nn.greedy_decode(lambda s: enc(emb(s)), step, src, start_token=1, end_token=2, max_len=7)
    with torch.no_grad():
        mem = tr_ref.encoder(emb_ref(t(torch, src)))
        ys = torch.full((3, 1), 1, dtype=torch.long)
        done = torch.zeros(3, dtype=torch.bool)
        while ys.shape[1] < 7 and not bool(done.all()):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(ys.shape[1])
            logits = head_ref(tr_ref.decoder(emb_ref(ys), mem, tgt_mask=mask))[:, -1]
            nxt = torch.where(done, torch.tensor(2), logits.argmax(-1))
            done |= nxt == 2
            ys = torch.cat([ys, nxt[:, None]], 1)
    np.testing.assert_array_equal(got, ys.numpy())
    assert got[:, 0].tolist() == [1, 1, 1]
    with pytest.raises(InputError):
        nn.greedy_decode(lambda s: s, step, src, 1, max_len=0)


def test_cached_transposed_weights_follow_load_state_dict(torch, rng, backend):
    ref, ours = pair(torch, rng, "TransformerEncoderLayer", E, H, 16, 0.0, batch_first=True)
    x = rng.standard_normal((2, 3, E)).astype(np.float32)
    ours(x)  # fills the caches
    randomize(ref, rng, torch)  # new weights
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    with torch.no_grad():
        want = ref(t(torch, x)).numpy()
    assert_close(ours(x), want, rtol=1e-4, atol=1e-5)
    ours.self_attn.in_proj_weight = np.zeros((3 * E, E), np.float32)  # assignment is seen too
    _, w = ours.self_attn(x, x, x)
    assert_close(w, np.full((2, 3, 3), 1 / 3, np.float32), atol=1e-7)


def test_encoder_layer_is_thread_safe(rng):
    from concurrent.futures import ThreadPoolExecutor

    layer = nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True)
    xs = [rng.standard_normal((2, 5, E)).astype(np.float32) for _ in range(8)]
    serial = [layer(x, is_causal=True, src_mask=nn.generate_square_subsequent_mask(5)) for x in xs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            results = list(
                pool.map(lambda x: layer(x, is_causal=True, src_mask=nn.generate_square_subsequent_mask(5)), xs)
            )
            for got, want in zip(results, serial):
                np.testing.assert_array_equal(got, want)
