"""Every CUDA kernel (``CudaOps``) against ReferenceOps, on tiny shapes.

numba.cuda must see ``NUMBA_ENABLE_CUDASIM=1`` before it is first imported, and the main test
process has numba loaded already, so in a normal ``pytest`` run this file holds ONE test that
re-runs this file in a subprocess with the simulator on (and fails if any test there fails or is
skipped). Inside that subprocess (or with ``FASTLAYERS_CUDA_DEVICE_TESTS=1`` on a machine with a
GPU, to run the same tests on the device) the real tests below are defined.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_close

ROOT = Path(__file__).resolve().parents[1]
IN_CUDA_RUN = (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
               or os.environ.get("FASTLAYERS_CUDA_DEVICE_TESTS") == "1")


def run_under_simulator(test_file: str, timeout: int = 240) -> str:
    """Run ``pytest test_file`` in a subprocess under the CUDA simulator; fail on a failure or skip."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop("FASTLAYERS_CUDA_DEVICE_TESTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-rs",
         "--benchmark-disable"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"CUDA simulator run of {test_file} failed:\n{out[-6000:]}"
    assert " passed" in out and "skipped" not in out, f"unexpected summary:\n{out[-3000:]}"
    return out


if not IN_CUDA_RUN:

    def test_cuda_kernels_under_simulator():
        out = run_under_simulator("tests/test_cuda_kernels.py")
        assert "numba.cuda" not in sys.modules or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
        print(out.strip().splitlines()[-1])

else:
    from fastlayers.backends import get_ops

    REF = get_ops("reference")

    @pytest.fixture(scope="module")
    def ops():
        return get_ops("cuda")

    def _r(rng, *shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def test_simulator_or_device(ops):
        assert ops.name == "cuda"
        if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
            assert ops.sim

    @pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 4), (17, 18, 19)])
    @pytest.mark.parametrize("trans_b", [False, True])
    def test_matmul_tiled(ops, rng, m, k, n, trans_b):
        a = _r(rng, m, k)
        b = _r(rng, n, k) if trans_b else _r(rng, k, n)
        assert_close(ops.matmul(a, b, trans_b), a @ (b.T if trans_b else b), rtol=1e-5, atol=1e-5)

    def test_matmul_batched_broadcast(ops, rng):
        a, b = _r(rng, 3, 2, 5), _r(rng, 5, 4)
        assert_close(ops.matmul(a, b[None]), a @ b, atol=1e-5)

    ACTS = ["linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "gelu_tanh",
            "sigmoid", "hard_sigmoid", "tanh", "softplus", "softsign", "silu", "exponential",
            "softmax", "log_softmax"]

    def test_activation_kernels(ops, rng):
        x = _r(rng, 2, 3, 7, scale=3.0)
        x[0, 0, 0] = np.nan
        for name in ACTS:
            assert_close(ops.activation(x[1:], name, 0.2), REF.activation(x[1:], name, 0.2),
                         what=name)
            if name not in ("softmax", "log_softmax"):
                got, want = ops.activation(x, name, 0.2), REF.activation(x, name, 0.2)
                assert np.isnan(got[0, 0, 0]) == np.isnan(want[0, 0, 0]), name
        assert_close(ops.softmax(x[1:], axis=1), REF.softmax(x[1:], axis=1))

    @pytest.mark.parametrize("activation", ["linear", "relu", "tanh", "softmax"])
    @pytest.mark.parametrize("bias", [True, False])
    def test_dense(ops, rng, activation, bias):
        x, w = _r(rng, 2, 3, 5), _r(rng, 5, 4)
        b = _r(rng, 4) if bias else None
        assert_close(ops.dense(x, w, b, activation), REF.dense(x, w, b, activation), atol=1e-5)

    def test_dense_batch_one_and_width_one(ops, rng):
        x, w, b = _r(rng, 1, 1), _r(rng, 1, 1), _r(rng, 1)
        assert_close(ops.dense(x, w, b, "sigmoid"), REF.dense(x, w, b, "sigmoid"))

    CONV_CASES = [
        # (x shape, kernel hw, strides, pads, dilation, groups, activation)
        ((1, 5, 5, 3), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "relu"),
        ((2, 5, 4, 2), (2, 3), (2, 1), ((0, 1), (2, 0)), (1, 2), 1, "linear"),
        ((1, 5, 5, 4), (3, 3), (1, 2), ((1, 1), (1, 1)), (1, 1), 2, "relu6"),
        ((1, 5, 5, 3), (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, "gelu"),
        ((1, 1, 5, 2), (1, 3), (1, 1), ((0, 0), (1, 1)), (1, 1), 1, "softmax"),  # 1-D
    ]

    @pytest.mark.parametrize("case", CONV_CASES)
    def test_conv2d(ops, rng, case):
        shape, (kh, kw), strides, pads, dilation, groups, activation = case
        x = _r(rng, *shape)
        w = _r(rng, kh, kw, shape[3] // groups, 4)
        b = _r(rng, 4)
        got = ops.conv2d(x, w, b, strides, pads, dilation, groups, activation)
        want = REF.conv2d(x, w, b, strides, pads, dilation, groups, activation)
        assert got.shape == want.shape
        assert_close(got, want, atol=1e-5)

    @pytest.mark.parametrize("mult", [1, 2])
    def test_depthwise_conv2d(ops, rng, mult):
        x, w, b = _r(rng, 2, 5, 5, 3), _r(rng, 3, 3, 3, mult), _r(rng, 3 * mult)
        args = ((2, 2), ((1, 1), (1, 1)), (1, 1), "relu")
        assert_close(ops.depthwise_conv2d(x, w, b, *args), REF.depthwise_conv2d(x, w, b, *args),
                     atol=1e-5)
        # groups == channels through conv2d is the same depthwise kernel
        w2 = w.reshape(3, 3, 1, 3 * mult)
        assert_close(ops.conv2d(x, w2, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 3),
                     REF.conv2d(x, w2, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 3), atol=1e-5)

    POOL_CASES = [
        ("max", (2, 2), (2, 2), ((0, 0), (0, 0)), (2, 2), (1, 1), False),
        ("max", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), False),
        ("avg", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), False),
        ("avg", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), True),
        ("avg", (2, 2), (2, 2), ((0, 1), (0, 1)), (3, 3), (1, 1), True),   # ceil-mode cell
        ("max", (2, 2), (1, 1), ((0, 0), (0, 0)), (3, 3), (2, 2), False),  # dilated
    ]

    @pytest.mark.parametrize("case", POOL_CASES)
    def test_pool2d(ops, rng, case):
        kind, pool, strides, pads, out_hw, dilation, include = case
        x = _r(rng, 2, 5, 5, 3)
        x[1, 0, 0, 1] = np.nan
        got = ops.pool2d(x, kind, pool, strides, pads, out_hw, dilation, include)
        want = REF.pool2d(x, kind, pool, strides, pads, out_hw, dilation, include)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert_close(got, want)

    @pytest.mark.parametrize("causal", [False, True])
    @pytest.mark.parametrize("bias_shape", [None, (3,), (2, 1, 1, 3), (1, 2, 4, 3)])
    def test_attention_softmax(ops, rng, causal, bias_shape):
        s = _r(rng, 2, 2, 4, 3)
        bias = None if bias_shape is None else _r(rng, *bias_shape)
        got = ops.attention_softmax(s.copy(), 0.5, bias, causal)
        assert_close(got, REF.attention_softmax(s.copy(), 0.5, bias, causal))

    @pytest.mark.parametrize("empty", [0, 1, 2])
    def test_attention_softmax_masked_rows(ops, rng, empty):
        s = _r(rng, 1, 2, 3, 4)
        bias = np.zeros((1, 1, 3, 4), np.float32)
        bias[0, 0, 1] = -np.inf               # a fully masked query row
        bias[0, 0, 2, :2] = -np.inf
        got = ops.attention_softmax(s.copy(), 1.0, bias, False, empty)
        want = REF.attention_softmax(s.copy(), 1.0, bias, False, empty)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert_close(got, want)

    def test_attention_on_device(ops, rng):
        q, k, v = _r(rng, 1, 2, 3, 4), _r(rng, 1, 2, 5, 4), _r(rng, 1, 2, 5, 2)
        bias = np.where(rng.random((1, 1, 1, 5)) < 0.3, -np.inf, 0).astype(np.float32)
        out, w = ops.attention(q, k, v, 0.5, bias, causal=False)
        out_r, w_r = REF.attention(q, k, v, 0.5, bias, causal=False)
        assert_close(w, w_r)
        assert_close(out, out_r, atol=1e-5)

    def _lstm_args(rng, b=2, t=3, i=3, units=2, proj=None):
        out = proj or units
        return (_r(rng, b, t, i), _r(rng, i, 4 * units), _r(rng, out, 4 * units), _r(rng, 4 * units),
                _r(rng, b, out), _r(rng, b, units))

    LSTM_CASES = [
        dict(),
        dict(reverse=True, return_sequences=False),
        dict(mask=True),
        dict(mask=True, zero_masked=True, y0=True),
        dict(proj=3),
        dict(activation="relu", recurrent_activation="hard_sigmoid"),
    ]

    def _kw(rng, case, b, t, out):
        kw = {k: v for k, v in case.items() if k not in ("mask", "y0", "proj")}
        if case.get("mask"):
            kw["mask_bt"] = np.array([[True, False, True], [False, False, True]][:b])[:, :t]
        if case.get("y0"):
            kw["y0"] = _r(rng, b, out)
        return kw

    @pytest.mark.parametrize("case", LSTM_CASES)
    def test_lstm_sequence(ops, rng, case):
        proj = case.get("proj")
        x, w_ig, w_hg, b_g, h0, c0 = _lstm_args(rng, proj=proj)
        kw = _kw(rng, case, 2, 3, proj or 2)
        if proj:
            w_hg = _r(rng, proj, 8)
            kw["w_hp"] = _r(rng, 2, proj)
        got = ops.lstm_sequence(x, w_ig, w_hg, b_g, h0, c0, **kw)
        want = REF.lstm_sequence(x, w_ig, w_hg, b_g, h0, c0, **kw)
        for g, r in zip(got, want):
            assert g.shape == r.shape
            assert_close(g, r, atol=1e-5)

    GRU_CASES = [
        dict(),
        dict(reset_after=False),
        dict(reverse=True, return_sequences=False, no_bh=True),
        dict(mask=True, zero_masked=True),
        dict(mask=True, y0=True, reset_after=False),
    ]

    @pytest.mark.parametrize("case", GRU_CASES)
    def test_gru_sequence(ops, rng, case):
        b, t, i, units = 2, 3, 3, 2
        x, w_ig, w_hg = _r(rng, b, t, i), _r(rng, i, 3 * units), _r(rng, units, 3 * units)
        b_ig = _r(rng, 3 * units)
        b_hg = None if case.get("no_bh") else _r(rng, 3 * units)
        h0 = _r(rng, b, units)
        kw = _kw(rng, {k: v for k, v in case.items() if k != "no_bh"}, b, t, units)
        got = ops.gru_sequence(x, w_ig, w_hg, b_ig, b_hg, h0, **kw)
        want = REF.gru_sequence(x, w_ig, w_hg, b_ig, b_hg, h0, **kw)
        for g, r in zip(got, want):
            assert g.shape == r.shape
            assert_close(g, r, atol=1e-5)

    @pytest.mark.parametrize("rms", [False, True])
    @pytest.mark.parametrize("affine", [False, True])
    def test_layer_norm(ops, rng, rms, affine):
        x = _r(rng, 2, 3, 5, scale=2.0) + np.float32(1.5)
        g, b = (_r(rng, 5), _r(rng, 5)) if affine else (None, None)
        assert_close(ops.layer_norm(x, g, b, 1e-3, (-1,), rms),
                     REF.layer_norm(x, g, b, 1e-3, (-1,), rms), atol=1e-5)
        assert_close(ops.layer_norm(x, g if g is None else g[:3], None, 1e-3, (1,), rms),
                     REF.layer_norm(x, g if g is None else g[:3], None, 1e-3, (1,), rms),
                     atol=1e-5)  # not the last axis: reference fallback

    def test_batch_norm(ops, rng):
        x, scale, shift = _r(rng, 2, 3, 4), _r(rng, 4), _r(rng, 4)
        assert_close(ops.batch_norm(x, scale, shift), REF.batch_norm(x, scale, shift))
        assert_close(ops.batch_norm(x, scale[:3], shift[:3], 1),
                     REF.batch_norm(x, scale[:3], shift[:3], 1))

    @pytest.mark.parametrize("kind", ["max", "avg"])
    @pytest.mark.parametrize("keepdims", [False, True])
    def test_global_pool(ops, rng, kind, keepdims):
        x = _r(rng, 2, 3, 4, 5)
        x[1, 0, 0, 2] = np.nan
        for axes in [(1, 2), (1,), (1, 2, 3)]:
            xx = x if len(axes) != 1 else x[:, 0]
            got = ops.global_pool(xx, kind, axes, keepdims)
            want = REF.global_pool(xx, kind, axes, keepdims)
            assert got.shape == want.shape
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            assert_close(got, want)

    def test_merge(ops, rng):
        a, b = _r(rng, 2, 3, 4), _r(rng, 2, 3, 4)
        a[0, 0, 0] = np.nan
        b[1, 0, 0] = np.nan
        for op, fn in [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply),
                       ("maximum", np.maximum), ("minimum", np.minimum)]:
            got, want = ops.merge(a, b, op), fn(a, b)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            assert_close(got, want, what=op)
        assert_close(ops.merge(a, b, "add", 0.5), (a + b) * np.float32(0.5))

    def test_concatenate(ops, rng):
        a, b, c = _r(rng, 2, 3, 4), _r(rng, 2, 3, 1), _r(rng, 2, 3, 2)
        assert_close(ops.concatenate([a, b, c], -1), np.concatenate([a, b, c], -1))
        assert_close(ops.concatenate([a, a[:, :1]], 1), np.concatenate([a, a[:, :1]], 1))
        assert_close(ops.concatenate([a, a], 0), np.concatenate([a, a], 0))
