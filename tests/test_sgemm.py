"""fastlayers' own sgemm on packed weights (``_sgemm``, ``_blas.PACKED``) against numpy: odd
sizes around its tile (14 x 32), k block (256) and row block (336) edges, strided operands,
overwrite and accumulate; and the products that use it (``_gemm.matmul`` on weights)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fastlayers.backends.cpu import _blas, _elementwise, _gemm

from .conftest import assert_close

needs_packed = pytest.mark.skipif(_blas.PACKED is None,
                                  reason="fastlayers' sgemm needs AVX-512F and its extension")


def _call(a, pb, c, beta):
    m, k = a.shape
    _blas.PACKED(m, c.shape[1], k, a.ctypes.data, a.strides[0] // 4, pb.ctypes.data, beta,
                 c.ctypes.data, c.strides[0] // 4)


@needs_packed
@pytest.mark.parametrize("m", [*range(1, 19), 29, 31, 337, 700])   # every tile height
@pytest.mark.parametrize("k, n", [(1, 1), (7, 33), (256, 32), (257, 31), (600, 100), (5, 64)])
def test_packed_product_matches_numpy(rng, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    pb = _blas.pack(b)
    assert pb.shape == (k * -(-n // 32) * 32,)
    c = np.full((m, n), np.nan, np.float32)
    _call(a, pb, c, 0.0)
    assert_close(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_packed
def test_packed_product_accumulates_on_strided_operands(rng):
    """a and c are column windows of wider arrays (row strides lda > k, ldc > n); beta 1 adds
    to c and leaves the columns around the window alone."""
    a_wide = rng.standard_normal((30, 300)).astype(np.float32)
    b = rng.standard_normal((270, 45)).astype(np.float32)
    c_wide = rng.standard_normal((30, 60)).astype(np.float32)
    a, c = a_wide[:, 10:280], c_wide[:, 5:50]
    expected = c_wide.copy()
    expected[:, 5:50] += a.astype(np.float64) @ b
    _call(a, _blas.pack(b), c, 1.0)
    assert_close(c_wide, expected, rtol=1e-5, atol=1e-4)


@needs_packed
@pytest.mark.parametrize("lda", [1024, 2048, 1030])
@pytest.mark.parametrize("m", [31, 700])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_packed_product_reads_or_copies_rows_of_a(rng, lda, m, beta):
    """Rows of A whose stride is a multiple of 1024 floats are copied block by block (336 rows
    by 256 columns) to rows 272 floats apart (read in place they would share one L1 set),
    others read in place: every row block and k block, overwriting or accumulating."""
    a_wide = rng.standard_normal((m, lda)).astype(np.float32)
    a = a_wide[:, :1000]
    b = rng.standard_normal((1000, 70)).astype(np.float32)
    c0 = rng.standard_normal((m, 70)).astype(np.float32)
    c = c0.copy()
    _call(a, _blas.pack(b), c, beta)
    assert_close(c, beta * c0 + a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


@needs_packed
@pytest.mark.parametrize("j0, j1", [(0, 32), (32, 100), (64, 100), (96, 100)])
def test_packed_product_on_a_share_of_columns(rng, j0, j1):
    """The panels of columns j0:j1 (j0 a multiple of PANEL_COLS) start at ``j0 * k``: a column
    share of a product reads them there."""
    from fastlayers.backends.cpu import _sgemm

    assert _sgemm.PANEL_COLS == _gemm.COLUMN_STEP
    a = rng.standard_normal((20, 300)).astype(np.float32)
    b = rng.standard_normal((300, 100)).astype(np.float32)
    c = np.empty((20, j1 - j0), np.float32)
    _call(a, _blas.pack(b)[j0 * 300:], c, 0.0)
    assert_close(c, a.astype(np.float64) @ b[:, j0:j1], rtol=1e-5, atol=1e-4)


@needs_packed
def test_packed_product_with_no_inner_dimension_zeroes_or_keeps(rng):
    b = np.zeros((0, 5), np.float32)
    c = np.ones((3, 5), np.float32)
    _call(np.zeros((3, 0), np.float32), _blas.pack(b), c, 1.0)
    np.testing.assert_array_equal(c, 1.0)
    _call(np.zeros((3, 0), np.float32), _blas.pack(b), c, 0.0)
    np.testing.assert_array_equal(c, 0.0)


@needs_packed
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [2, 7, 8, 50, 1000])
def test_matmul_on_weights_fuses_bias_and_activation(monkeypatch, rng, threads, m):
    """The packed route of ``_gemm.matmul`` (row shares, row chunks with their epilogue; column
    shares below 64 rows), and its packing cached per weight view."""
    from fastlayers.backends.cpu import _split

    monkeypatch.setattr(_split, "thread_count", lambda: threads)
    monkeypatch.setattr(_gemm, "thread_count", lambda: threads)
    a = rng.standard_normal((m, 300)).astype(np.float32)
    w = rng.standard_normal((300, 1100)).astype(np.float32)
    view = w[:, 50:1050]
    bias = rng.standard_normal(1000).astype(np.float32)
    out = np.empty((m, 1000), np.float32)
    _gemm.matmul(a, view, out, bias, _elementwise.RELU, weights=True)
    assert_close(out, np.maximum(a.astype(np.float64) @ view + bias, 0), rtol=1e-5, atol=1e-4)
    assert _gemm.packed_weights(w[:, 50:1050]) is _gemm.packed_weights(view)
    assert _gemm.packed_weights(w[:, 49:1049]) is not _gemm.packed_weights(view)


def test_openblas_can_be_chosen_instead():
    """FASTLAYERS_SGEMM=openblas leaves every product on numpy's OpenBLAS (A/B comparisons)."""
    env = dict(os.environ, FASTLAYERS_SGEMM="openblas")
    code = "from fastlayers.backends.cpu import _blas; assert _blas.PACKED is None"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
