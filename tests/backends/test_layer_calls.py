"""The native core's whole-layer entries (``_core.dense``, ``apply_activation``,
``apply_layer_norm``, ``apply_scale_shift``: check, allocate and run in one call) against
numpy on every ISA path, and the arguments they decline (None: the caller's general path)."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends.cpu import gemm as _gemm
from fastlayers.backends.reference import ReferenceOps
from fastlayers.native import CODES, _core

from ..conftest import assert_close

pytestmark = pytest.mark.usefixtures("isa")
REF = ReferenceOps()


def _never_packed(w):
    raise AssertionError("packed weights asked for a product below the packing threshold")


@pytest.mark.parametrize("x_shape", [(1, 7), (5, 7), (2, 3, 7), (7,), (1, 1, 1)])
@pytest.mark.parametrize("activation", ["linear", "relu", "softmax"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_matches_numpy_at_any_rank(rng, x_shape, activation, use_bias):
    k = x_shape[-1]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((k, 9)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32) if use_bias else None
    y = _core.dense(x, w, b, CODES[activation], 0.0, _never_packed)
    assert y.shape == x_shape[:-1] + (9,) and y.dtype == np.float32
    assert_close(y, REF.dense(x, w, b, activation), rtol=2e-5, atol=2e-6)


def test_dense_packs_large_products_once(rng):
    """Above the packing threshold the weights are packed through ``packer`` (cached per array)."""
    m, k, n = 64, 300, 100
    assert m * k * n >= _core.PACKED_MIN_MADDS
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n + 13)).astype(np.float32)[:, 5 : 5 + n]  # a strided view
    asked = []
    y = _core.dense(x, w, None, CODES["gelu"], 0.0, lambda v: asked.append(v) or _gemm.packed_weights(v))
    assert len(asked) == 1 and asked[0] is w
    assert_close(y, REF.dense(x, w, None, "gelu"), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "case",
    [
        "float64 x",
        "strided x",
        "list x",
        "0-d x",
        "empty x",
        "wrong width",
        "float64 w",
        "columns strided w",
        "3-d w",
        "strided bias",
        "short bias",
        "float64 bias",
        "list bias",
    ],
)
def test_dense_declines_what_it_does_not_take(rng, case):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    x, w, b = {
        "float64 x": (x.astype(np.float64), w, b),
        "strided x": (x[:, ::2], w[:3], b),
        "list x": (x.tolist(), w, b),
        "0-d x": (np.float32(1.0), w[:1], b),
        "empty x": (x[:0], w, b),
        "wrong width": (np.ascontiguousarray(x[:, :5]), w, b),
        "float64 w": (x, w.astype(np.float64), b),
        "columns strided w": (x, w[:, ::2], b[:3]),
        "3-d w": (x, w[None], b),
        "strided bias": (x, w, np.repeat(b, 2)[::2]),
        "short bias": (x, w, b[:4]),
        "float64 bias": (x, w, b.astype(np.float64)),
        "list bias": (x, w, b.tolist()),
    }[case]
    assert _core.dense(x, w, b, CODES["linear"], 0.0, _never_packed) is None


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 17), (2, 3, 33), (5,)])
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "sigmoid", "softmax", "log_softmax"])
def test_apply_activation_matches_numpy(rng, shape, name):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    alpha = 0.2 if name == "leaky_relu" else 0.0
    y = _core.apply_activation(x, CODES[name], alpha)
    assert y.shape == x.shape and y is not x
    assert_close(y, REF.activation(x, name, alpha), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 33), (40,)])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("affine", [False, True])
def test_apply_layer_norm_matches_numpy(rng, shape, rms, affine):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    n = shape[-1]
    gamma = rng.standard_normal(n).astype(np.float32) if affine else None
    beta = rng.standard_normal(n).astype(np.float32) if affine and not rms else None
    y = _core.apply_layer_norm(x, gamma, beta, 1e-5, rms)
    assert_close(y, REF.layer_norm(x, gamma, beta, 1e-5, rms=rms), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 3, 33), (9,)])
def test_apply_scale_shift_matches_numpy(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    scale, shift = rng.standard_normal((2, shape[-1])).astype(np.float32)
    assert_close(_core.apply_scale_shift(x, scale, shift), x * scale + shift, rtol=1e-6, atol=1e-6)


def test_row_entries_decline_what_they_do_not_take(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    v = np.ones(6, np.float32)
    for bad in (x.astype(np.float64), x[:, ::2], x.T, x.tolist(), x[:0], np.float32(2.0)):
        assert _core.apply_activation(bad, CODES["relu"], 0.0) is None
        assert _core.apply_layer_norm(bad, None, None, 1e-5, False) is None
        assert _core.apply_scale_shift(bad, v[: np.shape(bad)[-1]] if np.ndim(bad) else v, v) is None
    assert _core.apply_layer_norm(x, v[:5], None, 1e-5, False) is None
    assert _core.apply_layer_norm(x, None, v.astype(np.float64), 1e-5, False) is None
    assert _core.apply_scale_shift(x, None, v) is None
    assert _core.apply_scale_shift(x, v, np.repeat(v, 2)[::2]) is None


@pytest.mark.parametrize("view", ["transposed", "every other column"])
def test_packed_products_on_strided_weight_views(rng, view):
    """Weights read through a strided view (torch's Linear reads ``weight.T``) are packed from
    that view once the product is large enough to pack."""
    from fastlayers.backends import get_ops

    m, k, n = 8, 300, 200
    x = rng.standard_normal((m, k)).astype(np.float32)
    if view == "transposed":
        w = rng.standard_normal((n, k)).astype(np.float32).T
    else:
        w = rng.standard_normal((k, 2 * n)).astype(np.float32)[:, ::2]
    assert m * k * n >= _core.PACKED_MIN_MADDS and not w.flags.c_contiguous
    assert_close(get_ops("cpu").dense(x, w, None, "relu"), REF.dense(x, w, None, "relu"), rtol=2e-5, atol=2e-5)
