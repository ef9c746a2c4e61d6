"""The whole-layer encoder primitive (CpuOps.encoder_layer, ``_encoder``) against
ReferenceOps.encoder_layer: post- and pre-norm, each fused activation, masks with a fully masked
row, no biases or norm parameters, odd and unit sizes, one row (OpenBLAS products, not the
packed sgemm), and 1 to 3 threads meeting at the barriers."""

import numpy as np
import pytest

from fastlayers.backends.cpu import CpuOps, _blas, _encoder
from fastlayers.backends.reference import EncoderWeights, ReferenceOps

REF, CPU = ReferenceOps(), CpuOps()
NEG_INF = np.float32(-np.inf)

# (N, L, E, heads, F)
SIZES = [
    (1, 128, 128, 2, 512),     # BERT-tiny's layer
    (2, 33, 24, 3, 40),        # odd lengths, three heads
    (2, 5, 8, 2, 12),          # 10 rows
    (1, 7, 6, 3, 5),           # 7 rows: tiles of the packed sgemm's smaller heights
    (1, 1, 6, 3, 5),           # 1 row: OpenBLAS products
    (3, 1, 4, 1, 4),           # length 1, one head
]


def weights(rng, e, f, biases=True, norms=True):
    def r(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    def b(n):
        return r(n) if biases else None

    def norm():
        return (1 + r(e), r(e), 1e-5) if norms else (None, None, 1e-5)

    return EncoderWeights(r(e, 3 * e), b(3 * e), r(e, e), b(e), r(e, f), b(f), r(f, e), b(e),
                          norm(), norm())


def padding_bias(rng, n, length):
    """A key-padding bias (N, 1, 1, L) whose first sequence has every key masked."""
    bias = np.where(rng.random((n, 1, 1, length)) < 0.3, NEG_INF, np.float32(0))
    bias[0] = NEG_INF
    return bias


def check(w, x, heads, activation="relu", norm_first=False, bias=None, empty=0):
    want, want_w = REF.encoder_layer(x, w, heads, activation, norm_first, bias, empty)
    got, got_w = CPU.encoder_layer(x, w, heads, activation, norm_first, bias, empty)
    assert got.shape == want.shape and got_w.shape == want_w.shape
    scale = np.nanmax(np.abs(want)) if np.isfinite(want).any() else 1.0
    # six products and two norms in float32 whose sums run in another order: a model's 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, equal_nan=True)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-4, atol=1e-5, equal_nan=True)
    return got, got_w


@pytest.fixture
def threads(request, monkeypatch):
    from fastlayers.backends.cpu import _gemm, _split

    monkeypatch.setattr(_gemm, "MIN_SHARE_FLOPS", 1)             # share even tiny layers
    monkeypatch.setattr(_split, "thread_count", lambda: request.param)
    return request.param


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_encoder_layer_matches_reference(threads, size, norm_first, activation, rng):
    n, length, e, heads, f = size
    x = rng.standard_normal((n, length, e)).astype(np.float32)
    check(weights(rng, e, f), x, heads, activation, norm_first)


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("block_floats", [1, 20 * 40, 29 * 40])
@pytest.mark.parametrize("norm_first", [False, True])
def test_rows_after_attention_in_blocks(monkeypatch, threads, block_floats, norm_first, rng):
    """The post-attention rows go through in blocks of whole 14-row tiles (at least one), each
    block reusing its share's first hidden rows: 14 or 28 rows per block on 66 rows in 1-3
    shares (blocks that end a share early and ones the share's end cuts short)."""
    monkeypatch.setattr(_encoder, "HIDDEN_BLOCK_FLOATS", block_floats)
    x = rng.standard_normal((2, 33, 24)).astype(np.float32)
    check(weights(rng, 24, 40), x, 3, "gelu", norm_first)


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("empty", [0, 1, 2])
def test_masks_and_fully_masked_sequences(threads, empty, rng):
    n, length, e, heads, f = 3, 9, 12, 3, 20
    x = rng.standard_normal((n, length, e)).astype(np.float32)
    w = weights(rng, e, f)
    got, got_w = check(w, x, heads, "relu", False, padding_bias(rng, n, length), empty)
    assert np.isnan(got[0]).all() == (empty == 0) and np.isfinite(got[1:]).all()
    causal = np.triu(np.full((length, length), NEG_INF), 1) + rng.standard_normal(
        (length, length)).astype(np.float32)                      # torch's float mask + causal
    _, got_w = check(w, x, heads, "gelu", True, causal[None, None], empty)
    assert np.all(got_w[..., np.triu_indices(length, 1)[0], np.triu_indices(length, 1)[1]] == 0)


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("biases,norms", [(False, True), (True, False), (False, False)])
def test_without_biases_or_norm_parameters(threads, biases, norms, rng):
    x = rng.standard_normal((2, 16, 8)).astype(np.float32)
    for norm_first in (False, True):
        check(weights(rng, 8, 24, biases, norms), x, 2, "relu", norm_first)


def test_other_activations_and_missing_kernels_take_the_composed_path(monkeypatch, rng):
    """An activation without a fused epilogue, and a build without the C attention kernel, run
    the reference composition on the compiled primitives."""
    x = rng.standard_normal((2, 9, 8)).astype(np.float32)
    w = weights(rng, 8, 16)
    called = []
    monkeypatch.setattr(_encoder, "encoder_layer", lambda *a: called.append(a))
    monkeypatch.setattr(_encoder, "encoder_layer_par", lambda *a: called.append(a))
    check(w, x, 2, "tanh")
    monkeypatch.setattr(_blas, "ATTENTION", None)
    check(w, x, 2, "relu")
    assert not called


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
def test_strided_input_and_float64_weights(rng):
    """A non-contiguous input is read as its values; non-float32 weights take the composed
    path (which casts as dense does)."""
    x = rng.standard_normal((9, 2, 8)).astype(np.float32).swapaxes(0, 1)
    w = weights(rng, 8, 16)
    check(w, x, 2)
    check(w._replace(w_1_io=w.w_1_io.astype(np.float64)), x, 2)


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
def test_shares_that_cannot_meet_fall_back_to_serial(monkeypatch, rng):
    """Three shares on Numba's two threads: the waiting share gives up at the barrier, every
    share returns and the layer runs again serially with the same result."""
    import contextlib

    import numba

    from fastlayers.backends import cpu
    from fastlayers.backends.cpu import _sync

    if not _sync.barrier_safe():
        pytest.skip("the barrier is used only with the OpenMP threading layer")

    @contextlib.contextmanager
    def three_shares(units, min_units):
        yield 3

    monkeypatch.setattr(cpu, "shares", three_shares)
    gave_up = []
    monkeypatch.setattr(_encoder, "aborted",
                        lambda sync: gave_up.append(_sync.aborted(sync)) or gave_up[-1])
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        check(weights(rng, 8, 16), rng.standard_normal((2, 12, 8)).astype(np.float32), 2)
    finally:
        numba.set_num_threads(before)
    assert gave_up == [True]


@pytest.mark.skipif(_blas.ATTENTION is None, reason="needs AVX-512F and the built extension")
def test_results_outlive_the_scratch_buffer(rng):
    """Intermediates (and the weights unless asked for) live in a per-thread scratch buffer:
    a later call, smaller or larger, leaves earlier results as they were."""
    w = weights(rng, 8, 16)
    xs = [rng.standard_normal((n, length, 8)).astype(np.float32)
          for n, length in [(2, 9), (1, 3), (3, 17)]]
    got = [CPU.encoder_layer(x, w, 2, need_weights=False) for x in xs]
    for x, (out, weights_) in zip(xs, got):
        assert weights_ is None
        want, _ = REF.encoder_layer(x, w, 2)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert REF.encoder_layer(xs[0], w, 2, need_weights=False)[1] is None
