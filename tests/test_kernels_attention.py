"""The fused attention-softmax kernel (CpuOps) against ReferenceOps: masks, causal, fully masked
rows, NaN, odd and unit sizes, broadcast biases; plus a Hypothesis property test."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps

REF, CPU = ReferenceOps(), CpuOps()
NEG_INF = np.float32(-np.inf)

# (B, H, Tq, Tk) scores and the bias shape broadcast to them (None: no bias)
CASES_BHQK = [
    ((2, 3, 5, 7), None),
    ((2, 3, 5, 7), (2, 1, 1, 7)),       # key padding
    ((2, 3, 5, 7), (1, 1, 5, 7)),       # one (Tq, Tk) mask
    ((2, 3, 5, 7), (2, 3, 5, 7)),       # per batch and head
    ((1, 1, 1, 1), (1, 1, 1, 1)),       # length 1
    ((1, 2, 9, 4), (9, 4)),             # 2-D bias, Tq > Tk
    ((3, 1, 4, 33), (3, 1, 4, 33)),     # odd Tk past the 8-lane max
    ((2, 2, 6, 128), (2, 1, 1, 128)),
]


def masks(shape, rng, p=0.3):
    return np.where(rng.random(shape) < p, NEG_INF, np.float32(0))


@pytest.mark.parametrize("shape,bias_shape", CASES_BHQK)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("empty", [0, 1, 2])
def test_attention_softmax_matches_reference(shape, bias_shape, causal, empty, rng):
    s = (rng.standard_normal(shape) * 4).astype(np.float32)
    bias = None
    if bias_shape is not None:
        bias = masks(bias_shape, rng)
        bias.reshape(-1, bias_shape[-1])[0] = NEG_INF            # one fully masked row
        bias = bias + (rng.standard_normal(bias_shape) * 0.5).astype(np.float32)  # float-mask values
    want = REF.attention_softmax(s.copy(), 0.37, bias, causal, empty)
    got = CPU.attention_softmax(s.copy(), 0.37, bias, causal, empty)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    finite = ~np.isnan(want).any(-1)
    np.testing.assert_allclose(got.sum(-1)[finite & (want.sum(-1) > 0)], 1.0, rtol=1e-5)


def test_kernel_works_in_place_and_fully_masked_rows(rng):
    s = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    bias = np.zeros((1, 1, 3, 4), np.float32)
    bias[0, 0, 1] = NEG_INF
    for empty, fill in [(0, np.nan), (1, 0.0), (2, 0.25)]:
        x = s.copy()
        out = CPU.attention_softmax(x, 1.0, bias, False, empty)
        assert out is x
        np.testing.assert_array_equal(out[:, :, 1], np.full((1, 2, 4), fill, np.float32))


def test_nan_propagates_and_large_scores_are_stable(rng):
    s = rng.standard_normal((1, 1, 2, 5)).astype(np.float32)
    s[0, 0, 0, 2] = np.nan
    s[0, 0, 1] = [1e4, 1e4 - 1, -1e4, 3e4, 3e4]
    out = CPU.attention_softmax(s.copy(), 1.0, None)
    assert np.isnan(out[0, 0, 0]).all()
    np.testing.assert_allclose(out[0, 0, 1], [0, 0, 0, 0.5, 0.5], atol=1e-7)


def test_attention_primitive_both_backends(rng):
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    v = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    bias = masks((2, 1, 1, 6), rng)
    o1, w1 = REF.attention(q, k, v, 0.5, bias, True, 1)
    o2, w2 = CPU.attention(q, k, v, 0.5, bias, True, 1)
    np.testing.assert_allclose(o2, o1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-7)
    assert o1.shape == (2, 3, 5, 7) and w1.shape == (2, 3, 5, 6)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 3), tq=st.integers(1, 9), tk=st.integers(1, 19),
       causal=st.booleans(), scale=st.floats(0.01, 4.0), seed=st.integers(0, 2**16))
def test_attention_softmax_property(b, h, tq, tk, causal, scale, seed):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((b, h, tq, tk)) * 5).astype(np.float32)
    bias = masks((b, 1, tq, tk), rng, p=0.4)
    want = REF.attention_softmax(s.copy(), scale, bias, causal, 1)
    got = CPU.attention_softmax(s.copy(), scale, bias, causal, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    sums = got.sum(-1)
    assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))
    assert np.all(got[np.broadcast_to(bias == NEG_INF, got.shape)] == 0)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape,bias_shape", CASES_BHQK)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_split_over_threads_matches_reference(monkeypatch, threads, shape, bias_shape,
                                                        causal, rng):
    from fastlayers.backends.cpu import _gemm, _split

    monkeypatch.setattr(_gemm, "MIN_SHARE_FLOPS", 1)            # share even tiny calls
    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    b, h, tq, tk = shape
    q = rng.standard_normal((b, h, tq, 5)).astype(np.float32)
    k = rng.standard_normal((b, h, tk, 5)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, 3)).astype(np.float32)
    bias = None
    if bias_shape is not None:
        bias = masks(bias_shape, rng)
        bias.reshape(-1, bias_shape[-1])[0] = NEG_INF            # one fully masked row
    for empty in (0, 1, 2):
        out, w = CPU.attention(q, k, v, 0.4, bias, causal, empty)
        ref_out, ref_w = REF.attention(q, k, v, 0.4, bias, causal, empty)
        np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["heads split off a projection", "transposed rows", "broadcast"])
def test_attention_reads_strided_heads_in_place(monkeypatch, layout, rng):
    """q, k, v as views (the heads of a fused q/k/v projection: rows 3 E floats apart) give the
    reference's result; views the sgemm cannot read in place (a transposed matrix, rows 0
    apart) are copied first. The output is a (B, H, Tq, Dv) view whose (B, Tq, H, Dv)
    transpose is C-contiguous (the heads merge without a copy)."""
    from fastlayers.backends.cpu import _gemm, _split

    monkeypatch.setattr(_gemm, "MIN_SHARE_FLOPS", 1)
    monkeypatch.setattr(_split, "thread_count", lambda: 2)
    n, t, h, hd = 2, 7, 3, 5
    qkv = rng.standard_normal((n, t, 3, h, hd)).astype(np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    if layout == "transposed rows":
        q = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    elif layout == "broadcast":
        k = np.broadcast_to(k[:, :, :1], k.shape)
    out, w = CPU.attention(q, k, v, 0.4, None, True, 0)
    ref_out, ref_w = REF.attention(q, k, v, 0.4, None, True, 0)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous
