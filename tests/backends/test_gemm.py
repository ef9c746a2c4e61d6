"""The native sgemm (``fastlayers.native``, gemm.c) against numpy on every ISA path: odd sizes
around its tiles (AVX-512 14 x 32, AVX2 6 x 16, portable 6 x 8; for at most one vector of
columns 14 x 16 or 8, 12 x 8, 12 x 4) and their near-equal splits (32 rows as 11 + 11 + 10), k blocks (256, or near-equal ones of up to 384 for at
most 64 rows of A, on AVX-512 one block up to 512) and column blocks (256, or 128 for at most 64 rows), the thin path of 1 to 8 rows (b in place or
packed), the small-row path on a transposed b, strided operands, overwrite and accumulate,
packed and per-call packing; and ``_gemm.matmul`` and ``_core.dense`` with their fused epilogue
on 1-3 threads."""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers.backends.cpu import gemm as _gemm
from fastlayers.native import CODES, _core

from ..conftest import assert_close

pytestmark = pytest.mark.usefixtures("isa")


def _expected(a, b, c0=None):
    out = a.astype(np.float64) @ b.astype(np.float64)
    return out if c0 is None else out + c0


@pytest.mark.parametrize("m", [*range(1, 20), 29, 31, 32, 43, 64, 65, 337])
@pytest.mark.parametrize(
    "k, n",
    [
        (1, 1),
        (7, 33),
        (256, 32),
        (257, 31),
        (600, 100),
        (5, 300),
        (40, 8),
        (300, 16),
        (33, 12),
        (20, 3),
        (500, 70),
        (800, 140),
    ],
)
@pytest.mark.parametrize("route", ["packed", "per-call", "trans_b"])
def test_product_matches_numpy(rng, m, k, n, route):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    if route == "packed":
        pb = _core.pack(b)
        assert pb.shape == (k * -(-n // 32) * 32,)
        _core.sgemm(a, b, c, pb=pb)
    elif route == "per-call":
        _core.sgemm(a, b, c)
    else:
        _core.sgemm(a, np.ascontiguousarray(b.T), c, trans_b=True)
    assert_close(c, _expected(a, b), rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("route", ["packed", "per-call", "trans_b"])
@pytest.mark.parametrize("m", [2, 30])
def test_product_accumulates_on_strided_operands(rng, route, m):
    """a, b and c are column windows of wider arrays (row strides larger than their widths);
    accumulate adds to c and leaves the columns around the window alone."""
    a_wide = rng.standard_normal((m, 300)).astype(np.float32)
    b_wide = rng.standard_normal((270, 60)).astype(np.float32)
    c_wide = rng.standard_normal((m, 60)).astype(np.float32)
    a, b, c = a_wide[:, 10:280], b_wide[:, 3:48], c_wide[:, 5:50]
    expected = c_wide.astype(np.float64).copy()
    expected[:, 5:50] += _expected(a, b)
    if route == "packed":
        _core.sgemm(a, b, c, accumulate=True, pb=_core.pack(b))
    elif route == "per-call":
        _core.sgemm(a, b, c, accumulate=True)
    else:
        bt_wide = np.ascontiguousarray(b_wide.T)  # (60, 270)
        _core.sgemm(a, bt_wide[3:48], c, trans_b=True, accumulate=True)
    assert_close(c_wide, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("lda", [1024, 2048, 1030])
@pytest.mark.parametrize("m", [31, 700])
@pytest.mark.parametrize("accumulate", [False, True])
def test_packed_product_reads_or_copies_rows_of_a(rng, lda, m, accumulate):
    """Rows of A a multiple of 1024 floats apart are copied block by block where the tile has
    more rows than L1 ways (AVX-512), else read in place: every row block and k block."""
    a = rng.standard_normal((m, lda)).astype(np.float32)[:, :1000]
    b = rng.standard_normal((1000, 70)).astype(np.float32)
    c0 = rng.standard_normal((m, 70)).astype(np.float32)
    c = c0.copy()
    _core.sgemm(a, b, c, accumulate=accumulate, pb=_core.pack(b))
    assert_close(c, _expected(a, b, c0 if accumulate else None), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("j0, j1", [(0, 32), (32, 100), (64, 100), (96, 100)])
def test_packed_product_on_a_share_of_columns(rng, j0, j1):
    """The panels of columns j0:j1 (j0 a multiple of 32) start at ``j0 * k``."""
    a = rng.standard_normal((20, 300)).astype(np.float32)
    b = rng.standard_normal((300, 100)).astype(np.float32)
    c = np.empty((20, j1 - j0), np.float32)
    _core.sgemm(a, b[:, j0:j1], c, pb=_core.pack(b)[j0 * 300 :])
    assert_close(c, _expected(a, b[:, j0:j1]), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m", range(1, 10))
@pytest.mark.parametrize("route", ["packed", "in place"])
def test_thin_product_matches_numpy_at_every_tail(rng, m, route):
    """1 to 8 rows take the thin tiles (up to 3 rows, 6 on AVX-512, over one or more panels;
    9 rows the packed tiles): widths around the vector and tile tails, k = 1, b a column
    window of a wider array, overwrite and accumulate."""
    for k in (1, 3, 40):
        for n in (1, 3, 8, 13, 31, 33, 65, 97, 130):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n + 7)).astype(np.float32)[:, 2 : 2 + n]
            c0 = rng.standard_normal((m, n)).astype(np.float32)
            for accumulate in (False, True):
                c = c0.copy()
                _core.sgemm(a, b, c, accumulate=accumulate, pb=_core.pack(b) if route == "packed" else None)
                assert_close(
                    c,
                    _expected(a, b, c0 if accumulate else None),
                    rtol=1e-5,
                    atol=1e-5 * np.sqrt(k),
                    what=f"k={k} n={n} acc={accumulate}",
                )


def test_product_with_no_inner_dimension_zeroes_or_keeps():
    b = np.zeros((0, 5), np.float32)
    c = np.ones((3, 5), np.float32)
    for pb in (None, _core.pack(b)):
        _core.sgemm(np.zeros((3, 0), np.float32), b, c, accumulate=True, pb=pb)
        np.testing.assert_array_equal(c, 1.0)
        _core.sgemm(np.zeros((3, 0), np.float32), b, c, pb=pb)
        np.testing.assert_array_equal(c, 0.0)
        c[:] = 1.0


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 2, 7, 8, 50, 100, 1000, 1100])
@pytest.mark.parametrize("activation", ["relu", "softmax", "gelu"])
def test_matmul_on_weights_fuses_bias_and_activation(rng, threads, m, activation):
    """``_gemm.matmul``: row shares (at least 64 rows and as many as columns) or column shares,
    row chunks with their epilogue (near-equal, at least 256 rows as these weights outgrow L2),
    softmax over whole rows after column shares; the packing cached per weight view."""
    from fastlayers.backends.reference import ReferenceOps

    before = fastlayers.get_num_threads()
    fastlayers.set_num_threads(threads)
    try:
        a = rng.standard_normal((m, 300)).astype(np.float32)
        w = rng.standard_normal((300, 1100)).astype(np.float32)
        view = w[:, 50:1050]
        bias = rng.standard_normal(1000).astype(np.float32)
        out = np.empty((m, 1000), np.float32)
        _gemm.matmul(a, view, out, bias, CODES[activation], weights=True)
    finally:
        fastlayers.set_num_threads(before or _core.get_num_threads())
    expected = ReferenceOps().activation((_expected(a, view) + bias).astype(np.float32), activation)
    assert_close(out, expected, rtol=1e-5, atol=1e-4)
    assert _gemm.packed_weights(w[:, 50:1050]) is _gemm.packed_weights(view)
    assert _gemm.packed_weights(w[:, 49:1049]) is not _gemm.packed_weights(view)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("m, k, n", [(400, 700, 1000), (70, 4000, 200), (300, 900, 333)])
def test_matmul_column_shares_of_an_a_larger_than_l2(rng, threads, m, k, n):
    """Fewer rows than columns and A over ``GEMM_A_CACHED_FLOATS``: one share of columns per
    thread (a ragged last panel, several blocks of k), the same product as numpy's."""
    before = fastlayers.get_num_threads()
    fastlayers.set_num_threads(threads)
    try:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        out = np.empty((m, n), np.float32)
        _gemm.matmul(a, w, out, bias, CODES["relu"], weights=True)
    finally:
        fastlayers.set_num_threads(before or _core.get_num_threads())
    assert_close(out, np.maximum(_expected(a, w) + bias, 0), rtol=1e-5, atol=1e-4 * np.sqrt(k / 300))


@pytest.mark.parametrize(
    "m, k, n, lda",
    [
        (9, 16, 32, 16),  # few rows, one block of k
        (64, 800, 40, 800),  # few rows, blocks of k, a tail of columns (per chunk)
        (48, 500, 64, 500),  # few rows, one block of k (AVX-512) or two, whole vectors (per tile)
        (40, 400, 300, 400),  # few rows, one block of k (AVX-512) or two, blocks of columns, a narrow last block
        (40, 700, 300, 700),  # few rows, blocks of k and of columns on every path
        (100, 16, 32, 16),  # row tiles, one block of k
        (337, 257, 17, 257),  # two blocks of k, a narrow tail (per chunk)
        (337, 600, 48, 600),  # three blocks of k, whole vectors (per tile)
        (200, 40, 300, 40),  # two blocks of columns
        (90, 24, 64, 1024),  # rows of A aliasing in L1, copied
    ],
)
@pytest.mark.parametrize("activation", sorted(set(CODES) - {"softmax", "log_softmax"}))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_tile_epilogue_is_the_row_epilogue_bit_for_bit(rng, m, k, n, lda, activation, bias, threads):
    """The bias and activation applied to each tile of a packed product once its sums are final
    (in registers for a bias and ReLU; a ragged last panel's columns by the row epilogue right
    after its tile), to shares of rows or of columns (2 threads), give the bits of the product
    followed by the row epilogue (``bias_act``), for every activation, blocks of k and of
    columns, and rows copied for aliasing."""
    before = fastlayers.get_num_threads()
    fastlayers.set_num_threads(threads)
    try:
        a = (rng.standard_normal((m, lda)) * 2).astype(np.float32)[:, :k]
        w = rng.standard_normal((k, n)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if bias else None
        pb = _core.pack(w)
        fused = np.empty((m, n), np.float32)
        _core.matmul(a, w, fused, pb, b, CODES[activation], 0.1)
        plain = np.empty((m, n), np.float32)
        _core.matmul(a, w, plain, pb, None, CODES["linear"], 0.0)
        _core.bias_act(plain, b, CODES[activation], 0.1, plain)
    finally:
        fastlayers.set_num_threads(before or _core.get_num_threads())
    np.testing.assert_array_equal(fused.view(np.int32), plain.view(np.int32))


def test_bad_operands_raise_clear_errors():
    with pytest.raises(TypeError, match="float32"):
        _core.sgemm(np.zeros((2, 2)), np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        _core.sgemm(np.zeros((2, 4), np.float32)[:, ::2], np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("k, n", [(128, 231), (128, 261)])
@pytest.mark.parametrize("weights", ["contiguous", "column window", "transposed view"])
@pytest.mark.parametrize("activation", sorted(CODES))
def test_dense_on_few_rows_is_the_same_on_1_and_2_threads(rng, k, n, weights, activation):
    """``_core.dense`` and ``_gemm.matmul`` on 1, 3, 4 and 8 rows (thin tiles of 1 and 3 rows,
    2 + 2, 3 + 3 + 2; shared by columns between threads) and 9 (packed tiles); weights read in
    place (128 x 231) or packed (128 x 261), a transposed view (torch's Linear weight.T) always
    packed: the reference's result, and on 2 threads exactly the 1-thread result."""
    from fastlayers.backends.reference import ReferenceOps

    wide = (rng.standard_normal((k, n + 9)) * 0.1).astype(np.float32)
    w = {
        "contiguous": np.ascontiguousarray(wide[:, :n]),
        "column window": wide[:, 4 : 4 + n],
        "transposed view": np.ascontiguousarray(wide[:, :n].T).T,
    }[weights]
    bias = rng.standard_normal(n).astype(np.float32)
    alpha = 0.2 if activation == "leaky_relu" else 0.0
    before = fastlayers.get_num_threads()
    try:
        for m in (1, 3, 4, 8, 9):
            x = rng.standard_normal((m, k)).astype(np.float32)
            results = []
            for threads in (1, 2):
                fastlayers.set_num_threads(threads)
                results.append(_core.dense(x, w, bias, CODES[activation], alpha, _gemm.packed_weights))
                out = np.empty((m, n), np.float32)
                _gemm.matmul(x, w, out, bias, CODES[activation], alpha, weights=True)
                results.append(out)
            assert results[0] is not None
            for y in results[1:]:
                np.testing.assert_array_equal(y, results[0], err_msg=f"m={m}")
            expected = ReferenceOps().dense(x, w, bias, activation, alpha)
            assert_close(results[0], expected, rtol=2e-5, atol=2e-5, what=f"m={m}")
    finally:
        fastlayers.set_num_threads(before or _core.get_num_threads())


def _batched_expected(a, b, trans_b=False):
    b64 = np.swapaxes(b, -1, -2) if trans_b else b
    return np.matmul(a.astype(np.float64), b64.astype(np.float64))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(
    "a_shape, b_shape, trans_b",
    [
        ((1, 1, 1), (1, 1, 1), False),  # one product of one value
        ((3, 1, 5), (3, 5, 7), False),  # one row each (the thin path)
        ((2, 17, 33), (2, 33, 65), False),  # batch of the thread count
        ((5, 17, 33), (5, 65, 33), True),  # an odd batch, b transposed
        ((9, 7, 19), (1, 19, 3), False),  # a shared b, several times the threads
        ((1, 31, 300), (4, 300, 40), False),  # a shared a
        ((3, 130, 257), (3, 257, 100), False),  # products large enough to split
    ],
)
def test_matmul_batch_matches_numpy(rng, threads, a_shape, b_shape, trans_b):
    """``_core.matmul_batch`` against float64 numpy: batches split over the threads or each
    product over every thread, shared operands (batch 1), transposed b, one row and one value."""
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    batch, m = max(a_shape[0], b_shape[0]), a_shape[1]
    n = b_shape[1] if trans_b else b_shape[2]
    c = np.full((batch, m, n), np.nan, np.float32)
    before = fastlayers.get_num_threads()
    try:
        fastlayers.set_num_threads(threads)
        assert _core.matmul_batch(a, b, c, trans_b) is c
    finally:
        fastlayers.set_num_threads(before or _core.get_num_threads())
    assert_close(c, _batched_expected(np.broadcast_to(a, (batch,) + a_shape[1:]), b, trans_b), rtol=2e-5, atol=2e-5)


def test_matmul_batch_reads_strided_operands(rng):
    """Operands with batch and row strides (windows of wider arrays) and an output window."""
    wide_a = rng.standard_normal((4, 9, 40)).astype(np.float32)
    wide_b = rng.standard_normal((4, 30, 21)).astype(np.float32)
    out = np.full((4, 9, 50), np.nan, np.float32)
    a, b, c = wide_a[:, 1:8, 3:33], wide_b[:, :30, 2:19], out[:, 1:8, 5:22]
    _core.matmul_batch(a, b, c)
    assert_close(c, _batched_expected(a, b), rtol=2e-5, atol=2e-5)
    assert np.isnan(out[:, 0]).all() and np.isnan(out[:, :, :5]).all()


def test_matmul_batch_rejects_mismatched_operands():
    f = np.float32
    with pytest.raises(ValueError, match="3-D"):
        _core.matmul_batch(np.zeros((2, 3), f), np.zeros((1, 3, 2), f), np.zeros((1, 2, 2), f))
    with pytest.raises(ValueError, match="do not give c"):
        _core.matmul_batch(np.zeros((2, 3, 4), f), np.zeros((2, 5, 2), f), np.zeros((2, 3, 2), f))
    with pytest.raises(ValueError, match="do not give c"):
        _core.matmul_batch(np.zeros((3, 3, 4), f), np.zeros((2, 4, 2), f), np.zeros((3, 3, 2), f))
    with pytest.raises(TypeError, match="float32"):
        _core.matmul_batch(np.zeros((1, 3, 4)), np.zeros((1, 4, 2), f), np.zeros((1, 3, 2), f))


@pytest.mark.parametrize(
    "a_shape, b_shape, trans_b",
    [
        ((5,), (5, 3), False),
        ((4, 5), (5,), False),  # 1-D operands: numpy
        ((3, 5), (5, 7), False),
        ((2, 3, 5), (5, 7), False),
        ((2, 3, 5), (2, 5, 7), False),
        ((1, 3, 5), (4, 5, 7), False),
        ((2, 4, 3, 5), (2, 4, 7, 5), True),
        ((2, 1, 3, 5), (1, 4, 5, 7), False),  # broadcast in part: numpy
        ((3, 5), (2, 7, 5), True),
        ((6, 1, 8), (6, 8, 1), False),
    ],
)
def test_cpu_matmul_broadcasts_as_numpy(rng, a_shape, b_shape, trans_b):
    """``CpuOps.matmul``: numpy's shapes and values on every broadcast of the leading axes."""
    from fastlayers.backends.cpu import CpuOps

    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    y = CpuOps().matmul(a, b, trans_b)
    expected = _batched_expected(a, b, trans_b) if len(b_shape) > 1 else a.astype(np.float64) @ b
    assert y.dtype == np.float32 and y.shape == expected.shape
    assert_close(y, expected, rtol=2e-5, atol=2e-5)


def test_cpu_matmul_reads_transposed_views_in_place(rng):
    """A transposed view of b (k^T of attention) and of a give numpy's product."""
    from fastlayers.backends.cpu import CpuOps

    q = rng.standard_normal((2, 3, 6, 40)).astype(np.float32)
    k = rng.standard_normal((2, 3, 9, 40)).astype(np.float32)
    assert_close(
        CpuOps().matmul(q, np.swapaxes(k, -1, -2)), _batched_expected(q, np.swapaxes(k, -1, -2)), rtol=2e-5, atol=2e-5
    )
    assert_close(
        CpuOps().matmul(np.swapaxes(k, -1, -2), k), _batched_expected(np.swapaxes(k, -1, -2), k), rtol=2e-5, atol=2e-5
    )


@pytest.mark.parametrize("k, n", [(64, 4096), (300, 1000), (1024, 257)])
@pytest.mark.parametrize("transposed", [False, True])
def test_held_weights_unpack_and_multiply_as_the_array(rng, k, n, transposed):
    """``hold``: weights every product would pack are held only packed; ``np.asarray`` gives
    the same values back, and ``CpuOps.dense`` on them gives the bits ``dense`` gives on the
    array (batch 1 and many rows, x of rank 3, a bias, an activation the epilogue has, one it
    lacks, float64 x through the reference); weights too small to pack are kept as they are."""
    ops = fastlayers.backends.get_ops("cpu")
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    w_kn = w.T if transposed else w
    held = _gemm.hold(w_kn)
    assert type(held) is _gemm.PackedWeights and held.shape == (k, n) and held.size == k * n
    assert np.array_equal(np.asarray(held), w_kn) and np.asarray(held).flags.c_contiguous
    bias = rng.standard_normal(n).astype(np.float32)
    for shape in [(1, k), (37, k), (2, 5, k)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for activation, b in [("linear", None), ("relu", bias), ("softsign", bias)]:
            got = ops.dense(x, held, b, activation)
            assert np.array_equal(got, ops.dense(x, w_kn, b, activation)), (shape, activation)
    x64 = rng.standard_normal((3, k))
    assert_close(ops.dense(x64, held, bias), x64 @ w_kn.astype(np.float64) + bias, rtol=1e-5, atol=1e-4)
    assert_close(fastlayers.backends.get_ops("reference").dense(x64[:, None], held, None)[:, 0], x64 @ w_kn)
    small = rng.standard_normal((8, 16)).astype(np.float32)
    assert _gemm.hold(small) is small and _gemm.hold(small.astype(np.float64)).dtype == np.float64
