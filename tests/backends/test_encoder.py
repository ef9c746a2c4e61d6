"""The whole-layer encoder primitive (CpuOps.encoder_layer: one native call,
``fastlayers/native/attention.c``) against ReferenceOps.encoder_layer on every ISA path this
CPU runs: post- and pre-norm, each fused activation, masks with a fully masked row, no biases or
norm parameters, odd and unit sizes, one row, rows after attention in several blocks per
thread, transposed weight views, 1 to 3 threads, and calls from several Python threads."""

import numpy as np
import pytest

from fastlayers import native
from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps
from fastlayers.backends.types import EncoderWeights

from ..conftest import assert_close, in_threads

REF, CPU = ReferenceOps(), CpuOps()
NEG_INF = np.float32(-np.inf)

# (N, L, E, heads, F)
SIZES = [
    (1, 128, 128, 2, 512),  # BERT-tiny's layer
    (2, 33, 24, 3, 40),  # odd lengths, three heads
    (2, 5, 8, 2, 12),  # 10 rows
    (1, 7, 6, 3, 5),  # 7 rows: register tiles of smaller heights
    (1, 1, 6, 3, 5),  # 1 row
    (3, 1, 4, 1, 4),  # length 1, one head
]


def weights(rng, e, f, biases=True, norms=True):
    def r(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    def b(n):
        return r(n) if biases else None

    def norm():
        return (1 + r(e), r(e), 1e-5) if norms else (None, None, 1e-5)

    return EncoderWeights(r(e, 3 * e), b(3 * e), r(e, e), b(e), r(e, f), b(f), r(f, e), b(e), norm(), norm())


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
    alone, none = CPU.encoder_layer(x, w, heads, activation, norm_first, bias, empty, need_weights=False)
    assert none is None
    np.testing.assert_allclose(alone, want, rtol=1e-4, atol=1e-5 * scale, equal_nan=True)
    return got, got_w


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "tanh"])
def test_encoder_layer_matches_reference(isa, threads, size, norm_first, activation, rng):
    n, length, e, heads, f = size
    x = rng.standard_normal((n, length, e)).astype(np.float32)
    check(weights(rng, e, f), x, heads, activation, norm_first)


@pytest.mark.parametrize("threads", [1, 2, 3], indirect=True)
@pytest.mark.parametrize("norm_first", [False, True])
def test_rows_after_attention_in_blocks(isa, threads, norm_first, rng):
    """The rows after attention go through the thread's buffer in near-equal blocks of whole
    register tiles whose hidden rows fit 512 KiB (at F = 2048 at most 56-60 rows): 600 rows
    make several blocks in each thread's share at 1 to 3 threads."""
    x = rng.standard_normal((2, 300, 24)).astype(np.float32)
    check(weights(rng, 24, 2048), x, 3, "gelu", norm_first)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("empty", [0, 1, 2])
def test_masks_and_fully_masked_sequences(isa, threads, empty, rng):
    n, length, e, heads, f = 3, 9, 12, 3, 20
    x = rng.standard_normal((n, length, e)).astype(np.float32)
    w = weights(rng, e, f)
    got, got_w = check(w, x, heads, "relu", False, padding_bias(rng, n, length), empty)
    assert np.isnan(got[0]).all() == (empty == 0) and np.isfinite(got[1:]).all()
    causal = np.triu(np.full((length, length), NEG_INF), 1) + rng.standard_normal((length, length)).astype(
        np.float32
    )  # torch's float mask + causal
    _, got_w = check(w, x, heads, "gelu", True, causal[None, None], empty)
    assert np.all(got_w[..., np.triu_indices(length, 1)[0], np.triu_indices(length, 1)[1]] == 0)
    per_head = np.where(rng.random((n, heads, length, length)) < 0.2, NEG_INF, np.float32(0))
    check(w, x, heads, "relu", True, per_head, empty)
    check(w, x, heads, "relu", False, per_head[:1, :, :1], empty)  # one row per head


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("biases,norms", [(False, True), (True, False), (False, False)])
def test_without_biases_or_norm_parameters(isa, threads, biases, norms, rng):
    x = rng.standard_normal((2, 16, 8)).astype(np.float32)
    for norm_first in (False, True):
        check(weights(rng, 8, 24, biases, norms), x, 2, "relu", norm_first)


def test_transposed_weight_views(isa, rng):
    """Weights given as transposes of (out, in) arrays (torch's layout) are packed from the
    view; other strided views are copied first."""
    w = weights(rng, 8, 16)
    t = w._replace(
        **{name: np.ascontiguousarray(getattr(w, name).T).T for name in ("w_qkv_io", "w_o_io", "w_1_io", "w_2_io")}
    )
    x = rng.standard_normal((2, 9, 8)).astype(np.float32)
    check(t, x, 2)
    check(w._replace(w_1_io=np.repeat(w.w_1_io, 2, axis=1)[:, ::2]), x, 2)


def test_other_activations_and_dtypes_take_the_composed_path(monkeypatch, rng):
    """An activation without a native code, non-float32 weights and a mask of more than four
    axes run the reference composition on the compiled primitives (the attention block still
    one native call, f = 0); a strided input is read as its values."""
    x = rng.standard_normal((9, 2, 8)).astype(np.float32).swapaxes(0, 1)
    w = weights(rng, 8, 16)
    check(w, x, 2)
    called, kernel = [], native._core.encoder_layer
    monkeypatch.setattr(native._core, "encoder_layer", lambda *a: called.append(a[3]) or kernel(*a))
    check(w, x, 2, "elu")
    check(w._replace(w_1_io=w.w_1_io.astype(np.float64)), x, 2)
    assert called and set(called) == {0}


def test_results_outlive_the_buffers(rng):
    """Intermediates live in per-thread buffers that later calls reuse: a later call, smaller
    or larger, leaves earlier results as they were."""
    w = weights(rng, 8, 16)
    xs = [rng.standard_normal((n, length, 8)).astype(np.float32) for n, length in [(2, 9), (1, 3), (3, 17)]]
    got = [CPU.encoder_layer(x, w, 2) for x in xs]
    for x, (out, weights_) in zip(xs, got):
        want, want_w = REF.encoder_layer(x, w, 2)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(weights_, want_w, rtol=1e-4, atol=1e-6)


def test_calls_from_several_python_threads(rng):
    """Layers of different sizes called from four Python threads at once (one holds the pool,
    the others run serially, each in its own buffers) give each its own result."""
    w = weights(rng, 16, 32)
    xs = [rng.standard_normal((2, length, 16)).astype(np.float32) for length in (5, 40, 17, 64)]
    want = [REF.encoder_layer(x, w, 4)[0] for x in xs]

    def run(i):
        for _ in range(20):
            got, _ = CPU.encoder_layer(xs[i], w, 4, need_weights=False)
            assert_close(got, want[i], rtol=1e-4, atol=1e-4)

    in_threads(run, len(xs))


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("size", [SIZES[1], SIZES[3], SIZES[5], (2, 20, 15, 3, 0)])
@pytest.mark.parametrize("biases", [True, False])
def test_self_attention_block_matches_reference(isa, threads, size, biases, rng):
    """CpuOps.self_attention (the encoder kernel without its feed-forward half, f = 0) against
    ReferenceOps.self_attention: odd sizes and head widths (5), one row, with and without
    biases, the weights kept or not, and a key-padding mask with a fully masked sequence."""
    n, length, e, heads, _ = size
    w = weights(rng, e, 4, biases)
    block = (w.w_qkv_io, w.b_qkv, w.w_o_io, w.b_o, heads)
    x = rng.standard_normal((n, length, e)).astype(np.float32)
    for bias, empty in [(None, 0), (padding_bias(rng, n, length), 1)]:
        want, want_w = REF.self_attention(x, *block, bias, empty)
        got, got_w = CPU.self_attention(x, *block, bias, empty)
        alone, none = CPU.self_attention(x, *block, bias, empty, need_weights=False)
        assert none is None
        for out in (got, alone):
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        np.testing.assert_allclose(got_w, want_w, rtol=1e-4, atol=1e-6)
