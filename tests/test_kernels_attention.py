"""The fused attention-softmax kernel (CpuOps) against ReferenceOps: masks, causal, fully masked
rows, NaN, odd and unit sizes, broadcast biases; plus a Hypothesis property test. The whole
attention primitive on both of its CPU paths: the C pair kernel on the packed sgemm
(``_attention_kernel.h``, ``_blas.ATTENTION``) and the OpenBLAS + Numba one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastlayers.backends.cpu import CpuOps, _blas
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


def pair_path(monkeypatch, path):
    """Select the attention primitive's CPU path: "C" (skipped where it is not built) or
    "openblas" (the fallback without AVX-512F)."""
    if path == "openblas":
        monkeypatch.setattr(_blas, "ATTENTION", None)
    elif _blas.ATTENTION is None:
        pytest.skip("the C attention kernel needs AVX-512F and the built extension")


@pytest.mark.parametrize("path", ["C", "openblas"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape,bias_shape", CASES_BHQK)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_split_over_threads_matches_reference(monkeypatch, path, threads, shape,
                                                        bias_shape, causal, rng):
    from fastlayers.backends.cpu import _gemm, _split

    pair_path(monkeypatch, path)
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
        out, w = CPU.attention(q, k, v, 0.4, bias, causal, empty, need_weights=False)
        assert w is None
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["C", "openblas"])
@pytest.mark.parametrize("layout", ["heads split off a projection", "transposed rows", "broadcast"])
def test_attention_reads_strided_heads_in_place(monkeypatch, path, layout, rng):
    """q, k, v as views (the heads of a fused q/k/v projection: rows 3 E floats apart) give the
    reference's result; views the sgemm cannot read in place (a transposed matrix, rows 0
    apart) are copied first. The output is a (B, H, Tq, Dv) view whose (B, Tq, H, Dv)
    transpose is C-contiguous (the heads merge without a copy)."""
    from fastlayers.backends.cpu import _gemm, _split

    pair_path(monkeypatch, path)
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


# Head and key sizes around the C kernel's 16 x 16 transposes and 32-column panels.
PAIR_SIZES = [(tk, d) for tk in (1, 15, 16, 17, 31, 32, 33, 48, 50, 128)
              for d in (1, 7, 16, 17, 33, 64)]


@pytest.mark.parametrize("tk,d", PAIR_SIZES)
def test_c_pair_kernel_sizes_match_reference(monkeypatch, tk, d, rng):
    """k^T packed by whole 16 x 16 blocks plus scalar edges, v by panels: every size around
    those blocks, heads read in place from a fused projection (rows 3 H d floats apart), a
    per-(batch, head, query) float bias with masked keys, with and without the causal cut."""
    pair_path(monkeypatch, "C")
    b, h, tq, dv = 2, 2, 19, 9
    qk = rng.standard_normal((b, max(tq, tk), 2, h, d)).astype(np.float32)
    q = qk[:, :tq, 0].transpose(0, 2, 1, 3)
    k = qk[:, :tk, 1].transpose(0, 2, 1, 3)
    v = rng.standard_normal((b, h, tk, dv)).astype(np.float32)
    bias = masks((b, h, tq, tk), rng) + rng.standard_normal((b, h, tq, tk)).astype(np.float32)
    for causal in (False, True):
        out, w = CPU.attention(q, k, v, 0.3, bias, causal, 1)
        ref_out, ref_w = REF.attention(q, k, v, 0.3, bias, causal, 1)
        np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
        assert np.all(w[bias == NEG_INF] == 0)


@pytest.mark.parametrize("tq,tk", [(30, 2400), (43, 1030), (15, 5000)])
def test_c_pair_kernel_long_keys_run_in_query_blocks(monkeypatch, tq, tk, rng):
    """Long keys: the pair runs its query rows in blocks of whole 14-row tiles whose scores fit
    64 Ki floats, at least one tile (14 rows per block at 2400 and 5000 keys: a last block
    the queries cut short at 2400 and exactly one at 5000; 56 at 1030, more than the 43
    queries), with the causal cut and a per-query bias crossing the blocks; with the weights
    kept and without them."""
    pair_path(monkeypatch, "C")
    b, h, d, dv = 1, 2, 24, 17
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, dv)).astype(np.float32)
    bias = masks((b, 1, tq, tk), rng)
    for causal in (False, True):
        out, w = CPU.attention(q, k, v, 0.2, bias, causal, 2)
        ref_out, ref_w = REF.attention(q, k, v, 0.2, bias, causal, 2)
        np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
        # without the weights each block's scores live in the thread's buffer, reused
        out, w = CPU.attention(q, k, v, 0.2, bias, causal, 2, need_weights=False)
        assert w is None
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["C", "openblas"])
def test_attention_nan_large_scores_and_fully_masked_rows(monkeypatch, path, rng):
    """A NaN in q makes its query's row NaN, huge scores stay finite (max subtracted first), a
    row with every key masked becomes the layer's choice (NaN, 0 or 1/Tk), masked weights are
    exactly 0; the same on both paths."""
    pair_path(monkeypatch, path)
    b, h, tq, tk, d = 1, 2, 4, 40, 8
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    q[0, 0, 1, 3] = np.nan
    q[0, 1, 2] *= 1e4
    k = rng.standard_normal((b, h, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, 5)).astype(np.float32)
    bias = masks((1, 1, tq, tk), rng)
    bias[0, 0, 3] = NEG_INF
    for empty, fill in [(0, np.nan), (1, 0.0), (2, 1 / tk)]:
        out, w = CPU.attention(q, k, v, 0.5, bias, False, empty)
        ref_out, ref_w = REF.attention(q, k, v, 0.5, bias, False, empty)
        assert np.isnan(w[0, 0, 1]).all() and np.isnan(out[0, 0, 1]).all()
        assert np.isfinite(w[0, 1, 2]).all()
        np.testing.assert_allclose(w[:, :, 3], np.full((b, h, tk), fill, np.float32))
        np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6, equal_nan=True)
        np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5, equal_nan=True)
        masked = np.broadcast_to(bias == NEG_INF, w.shape).copy()
        masked[0, 0, 1] = False                                  # the NaN query's row
        masked[:, :, 3] = False                                  # the fully masked rows
        assert np.all(w[masked] == 0)
