"""The native attention kernels (``fastlayers/native/attention.c``, through CpuOps) against
ReferenceOps on every ISA path this CPU runs: the fused scale + mask + softmax over (B, H, Tq,
Tk) scores (masks, causal, fully masked rows, NaN, odd and unit sizes, broadcast biases, a
Hypothesis property test) and the whole attention primitive (pairs shared among 1-3 threads,
query rows split when pairs are few, strided heads read in place, sizes around the vector
widths and 32-column panels, long keys in query blocks, weights kept or not)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastlayers import native
from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps

REF, CPU = ReferenceOps(), CpuOps()
NEG_INF = np.float32(-np.inf)


# (B, H, Tq, Tk) scores and the bias shape broadcast to them (None: no bias)
CASES_BHQK = [
    ((2, 3, 5, 7), None),
    ((2, 3, 5, 7), (2, 1, 1, 7)),  # key padding
    ((2, 3, 5, 7), (1, 1, 5, 7)),  # one (Tq, Tk) mask
    ((2, 3, 5, 7), (2, 3, 5, 7)),  # per batch and head
    ((1, 1, 1, 1), (1, 1, 1, 1)),  # length 1
    ((1, 2, 9, 4), (9, 4)),  # 2-D bias, Tq > Tk
    ((3, 1, 4, 33), (3, 1, 4, 33)),  # odd Tk past two 16-lane vectors
    ((2, 2, 6, 128), (2, 1, 1, 128)),
    ((1, 2, 3, 20), (1, 2, 1, 1)),  # one bias value per head, broadcast over keys
]


def masks(shape, rng, p=0.3):
    return np.where(rng.random(shape) < p, NEG_INF, np.float32(0))


@pytest.mark.parametrize("shape,bias_shape", CASES_BHQK)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("empty", [0, 1, 2])
def test_attention_softmax_matches_reference(isa, shape, bias_shape, causal, empty, rng):
    s = (rng.standard_normal(shape) * 4).astype(np.float32)
    bias = None
    if bias_shape is not None:
        bias = masks(bias_shape, rng)
        bias.reshape(-1, bias_shape[-1])[0] = NEG_INF  # one fully masked row
        bias = bias + (rng.standard_normal(bias_shape) * 0.5).astype(np.float32)  # float-mask values
    want = REF.attention_softmax(s.copy(), 0.37, bias, causal, empty)
    got = CPU.attention_softmax(s.copy(), 0.37, bias, causal, empty)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    finite = ~np.isnan(want).any(-1)
    np.testing.assert_allclose(got.sum(-1)[finite & (want.sum(-1) > 0)], 1.0, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
def test_attention_softmax_rows_over_threads(isa, threads, rng):
    """Enough rows for the pool to share them; a strided (float64) input is copied first."""
    s = (rng.standard_normal((3, 4, 50, 70)) * 3).astype(np.float32)
    bias = masks((3, 1, 50, 70), rng)
    want = REF.attention_softmax(s.copy(), 0.5, bias, True, 2)
    np.testing.assert_allclose(CPU.attention_softmax(s.copy(), 0.5, bias, True, 2), want, rtol=1e-5, atol=1e-7)
    strided = s.astype(np.float64).transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3)
    np.testing.assert_allclose(CPU.attention_softmax(strided, 0.5, bias, True, 2), want, rtol=1e-5, atol=1e-7)


def test_kernel_works_in_place_and_fully_masked_rows(isa, rng):
    s = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    bias = np.zeros((1, 1, 3, 4), np.float32)
    bias[0, 0, 1] = NEG_INF
    for empty, fill in [(0, np.nan), (1, 0.0), (2, 0.25)]:
        x = s.copy()
        out = CPU.attention_softmax(x, 1.0, bias, False, empty)
        assert out is x
        np.testing.assert_array_equal(out[:, :, 1], np.full((1, 2, 4), fill, np.float32))


def test_nan_propagates_and_large_scores_are_stable(isa, rng):
    s = rng.standard_normal((1, 1, 3, 21)).astype(np.float32)
    s[0, 0, 0, 2] = np.nan
    s[0, 0, 1, :5] = [1e4, 1e4 - 1, -1e4, 3e4, 3e4]
    s[0, 0, 1, 5:] = -1e4
    s[0, 0, 2, 19] = np.nan  # NaN beside masked keys only
    bias = np.zeros((1, 1, 3, 21), np.float32)
    bias[0, 0, 2, :19] = NEG_INF
    bias[0, 0, 2, 20] = NEG_INF
    out = CPU.attention_softmax(s.copy(), 1.0, bias, empty=1)
    assert np.isnan(out[0, 0, 0]).all() and np.isnan(out[0, 0, 2]).all()
    want = np.zeros(21, np.float32)
    want[3:5] = 0.5
    np.testing.assert_allclose(out[0, 0, 1], want, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 3),
    tq=st.integers(1, 9),
    tk=st.integers(1, 40),
    causal=st.booleans(),
    scale=st.floats(0.01, 4.0),
    seed=st.integers(0, 2**16),
)
def test_attention_softmax_property(b, h, tq, tk, causal, scale, seed):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((b, h, tq, tk)) * 5).astype(np.float32)
    bias = masks((b, 1, tq, tk), rng, p=0.4)
    want = REF.attention_softmax(s.copy(), scale, bias, causal, 1)
    try:
        for name in native.available_isas():
            native.set_isa(name)
            got = CPU.attention_softmax(s.copy(), scale, bias, causal, 1)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
            sums = got.sum(-1)
            assert np.all((np.abs(sums - 1) < 1e-5) | (sums == 0))
            assert np.all(got[np.broadcast_to(bias == NEG_INF, got.shape)] == 0)
    finally:
        native.set_isa(native.best_isa())


def check_attention(q, k, v, scale, bias, causal, empty, rtol=1e-5):
    """CpuOps.attention against the reference with the weights kept and without them."""
    ref_out, ref_w = REF.attention(q, k, v, scale, bias, causal, empty)
    out, w = CPU.attention(q, k, v, scale, bias, causal, empty)
    np.testing.assert_allclose(w, ref_w, rtol=rtol, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(out, ref_out, rtol=rtol, atol=1e-5, equal_nan=True)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous
    out2, w2 = CPU.attention(q, k, v, scale, bias, causal, empty, need_weights=False)
    assert w2 is None
    np.testing.assert_allclose(out2, ref_out, rtol=rtol, atol=1e-5, equal_nan=True)
    return out, w


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("shape,bias_shape", CASES_BHQK)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_reference(isa, threads, shape, bias_shape, causal, rng):
    b, h, tq, tk = shape
    q = rng.standard_normal((b, h, tq, 5)).astype(np.float32)
    k = rng.standard_normal((b, h, tk, 5)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, 3)).astype(np.float32)
    bias = None
    if bias_shape is not None:
        bias = masks(bias_shape, rng)
        bias.reshape(-1, bias_shape[-1])[0] = NEG_INF  # one fully masked row
    for empty in (0, 1, 2):
        check_attention(q, k, v, 0.4, bias, causal, empty)


# (B, H, Tq, Tk, D, Dv): 16 pairs of about 1 MFLOP (the pool cuts them in 8 chunks at two
# threads); one pair whose 256 query rows are split in 2 or 3 parts at 2 or 3 threads; two
# pairs of 100 query rows (split at 3 threads) with a causal cut crossing the parts
THREADED = [(2, 8, 64, 64, 64, 64), (1, 1, 256, 64, 64, 64), (1, 2, 200, 90, 40, 24)]


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("shape", THREADED)
def test_attention_shared_among_threads(isa, threads, shape, rng):
    b, h, tq, tk, d, dv = shape
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32) * 0.3
    k = rng.standard_normal((b, h, tk, d)).astype(np.float32) * 0.3
    v = rng.standard_normal((b, h, tk, dv)).astype(np.float32)
    bias = masks((b, 1, tq, tk), rng) + rng.standard_normal((b, 1, tq, tk)).astype(np.float32)
    for causal in (False, True):
        check_attention(q, k, v, 0.2, bias, causal, 1)


@pytest.mark.parametrize("layout", ["heads split off a projection", "transposed rows", "broadcast", "float64"])
def test_attention_reads_strided_heads_in_place(isa, layout, rng):
    """q, k, v as views (the heads of a fused q/k/v projection: rows 3 E floats apart) give the
    reference's result; views the kernel cannot read (a transposed matrix, float64) are
    copied first. The output is a (B, H, Tq, Dv) view whose (B, Tq, H, Dv) transpose is
    C-contiguous (the heads merge without a copy)."""
    n, t, h, hd = 2, 7, 3, 5
    qkv = rng.standard_normal((n, t, 3, h, hd)).astype(np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    if layout == "transposed rows":
        q = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    elif layout == "broadcast":
        k = np.broadcast_to(k[:, :, :1], k.shape)
    elif layout == "float64":
        v = v.astype(np.float64)
    check_attention(q, k, v, 0.4, None, True, 0)


# Key and head sizes around the vector widths (4, 8, 16 floats) and 32-column panels.
PAIR_SIZES = [(tk, d) for tk in (1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 48, 50, 128) for d in (1, 7, 16, 17, 33, 64)]


@pytest.mark.parametrize("tk,d", PAIR_SIZES)
def test_pair_sizes_match_reference(isa, tk, d, rng):
    """k^T and v packed into panels of 32 columns, softmax rows in vectors plus a scalar tail:
    every size around those, heads read in place from a fused projection (rows 2 H d floats
    apart), a per-(batch, head, query) float bias with masked keys, with and without the
    causal cut."""
    b, h, tq, dv = 2, 2, 19, 9
    qk = rng.standard_normal((b, max(tq, tk), 2, h, d)).astype(np.float32)
    q = qk[:, :tq, 0].transpose(0, 2, 1, 3)
    k = qk[:, :tk, 1].transpose(0, 2, 1, 3)
    v = rng.standard_normal((b, h, tk, dv)).astype(np.float32)
    bias = masks((b, h, tq, tk), rng) + rng.standard_normal((b, h, tq, tk)).astype(np.float32)
    for causal in (False, True):
        _, w = check_attention(q, k, v, 0.3, bias, causal, 1)
        assert np.all(w[bias == NEG_INF] == 0)


@pytest.mark.parametrize("tq,tk", [(30, 2400), (43, 1030), (15, 5000)])
def test_long_keys_run_in_query_blocks(isa, tq, tk, rng):
    """Long keys: a pair runs its query rows in blocks of whole register tiles whose scores
    fit 64 Ki floats, at least one tile (at 2400 and 5000 keys several blocks, the last one cut
    short by the queries; at 1030 keys one block holds all 43 queries), with the causal cut and
    a per-query bias crossing the blocks; without the weights each block's scores live in the
    thread's buffer."""
    b, h, d, dv = 1, 2, 24, 17
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    k = rng.standard_normal((b, h, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, dv)).astype(np.float32)
    bias = masks((b, 1, tq, tk), rng)
    for causal in (False, True):
        check_attention(q, k, v, 0.2, bias, causal, 2)


def test_attention_nan_large_scores_and_fully_masked_rows(isa, rng):
    """A NaN in q makes its query's row NaN, huge scores stay finite (max subtracted first), a
    row with every key masked becomes the layer's choice (NaN, 0 or 1/Tk), masked weights are
    exactly 0."""
    b, h, tq, tk, d = 1, 2, 4, 40, 8
    q = rng.standard_normal((b, h, tq, d)).astype(np.float32)
    q[0, 0, 1, 3] = np.nan
    q[0, 1, 2] *= 1e4
    k = rng.standard_normal((b, h, tk, d)).astype(np.float32)
    v = rng.standard_normal((b, h, tk, 5)).astype(np.float32)
    bias = masks((1, 1, tq, tk), rng)
    bias[0, 0, 3] = NEG_INF
    for empty, fill in [(0, np.nan), (1, 0.0), (2, 1 / tk)]:
        out, w = check_attention(q, k, v, 0.5, bias, False, empty)
        assert np.isnan(w[0, 0, 1]).all() and np.isnan(out[0, 0, 1]).all()
        assert np.isfinite(w[0, 1, 2]).all()
        np.testing.assert_allclose(w[:, :, 3], np.full((b, h, tk), fill, np.float32))
        masked = np.broadcast_to(bias == NEG_INF, w.shape).copy()
        masked[0, 0, 1] = False  # the NaN query's row
        masked[:, :, 3] = False  # the fully masked rows
        assert np.all(w[masked] == 0)
