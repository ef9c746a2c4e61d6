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

from ..conftest import assert_close, needs_numba_cuda

pytestmark = needs_numba_cuda
ROOT = Path(__file__).resolve().parents[2]
IN_CUDA_RUN = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("FASTLAYERS_CUDA_DEVICE_TESTS") == "1"


def run_under_simulator(test_file: str, timeout: int = 240) -> str:
    """Run ``pytest test_file`` in a subprocess under the CUDA simulator; fail on a failure or skip."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop("FASTLAYERS_CUDA_DEVICE_TESTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-rs", "--benchmark-disable"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"CUDA simulator run of {test_file} failed:\n{out[-6000:]}"
    assert " passed" in out and "skipped" not in out, f"unexpected summary:\n{out[-3000:]}"
    return out


if not IN_CUDA_RUN:

    @pytest.mark.simulator
    def test_cuda_kernels_under_simulator():
        out = run_under_simulator("tests/backends/test_cuda_kernels.py")
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

    @pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 4), (9, 10, 11)])
    @pytest.mark.parametrize("trans_b", [False, True])
    def test_matmul_tiled(ops, rng, m, k, n, trans_b):
        a = _r(rng, m, k)
        b = _r(rng, n, k) if trans_b else _r(rng, k, n)
        assert_close(ops.matmul(a, b, trans_b), a @ (b.T if trans_b else b), rtol=1e-5, atol=1e-5)

    def test_matmul_batched_broadcast(ops, rng):
        a, b = _r(rng, 3, 2, 5), _r(rng, 5, 4)
        assert_close(ops.matmul(a, b[None]), a @ b, atol=1e-5)

    ACTS = [
        "linear",
        "relu",
        "relu6",
        "leaky_relu",
        "elu",
        "selu",
        "gelu",
        "gelu_tanh",
        "sigmoid",
        "hard_sigmoid",
        "tanh",
        "softplus",
        "softsign",
        "silu",
        "exponential",
        "softmax",
        "log_softmax",
    ]

    def test_activation_kernels(ops, rng):
        x = _r(rng, 2, 3, 7, scale=3.0)
        x[0, 0, 0] = np.nan
        for name in ACTS:
            assert_close(ops.activation(x[1:], name, 0.2), REF.activation(x[1:], name, 0.2), what=name)
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
        assert_close(ops.depthwise_conv2d(x, w, b, *args), REF.depthwise_conv2d(x, w, b, *args), atol=1e-5)
        # groups == channels through conv2d is the same depthwise kernel
        w2 = w.reshape(3, 3, 1, 3 * mult)
        assert_close(
            ops.conv2d(x, w2, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 3),
            REF.conv2d(x, w2, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 3),
            atol=1e-5,
        )

    POOL_CASES = [
        ("max", (2, 2), (2, 2), ((0, 0), (0, 0)), (2, 2), (1, 1), False),
        ("max", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), False),
        ("avg", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), False),
        ("avg", (3, 3), (2, 2), ((1, 1), (1, 1)), (3, 3), (1, 1), True),
        ("avg", (2, 2), (2, 2), ((0, 1), (0, 1)), (3, 3), (1, 1), True),  # ceil-mode cell
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
        bias[0, 0, 1] = -np.inf  # a fully masked query row
        bias[0, 0, 2, :2] = -np.inf
        got = ops.attention_softmax(s.copy(), 1.0, bias, False, empty)
        want = REF.attention_softmax(s.copy(), 1.0, bias, False, empty)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert_close(got, want)

    @pytest.mark.parametrize("norm_first", [False, True])
    @pytest.mark.parametrize("masked, need_weights", [(False, True), (True, False)])
    def test_encoder_layer(ops, rng, norm_first, masked, need_weights):
        """The whole encoder layer on the device, against the reference composition."""
        from fastlayers.backends.types import EncoderWeights

        n, length, e, heads, f = 2, 5, 8, 2, 12
        ws = [_r(rng, *shape, scale=0.3) for shape in ((e, 3 * e), (3 * e,), (e, e), (e,), (e, f), (f,), (f, e), (e,))]
        norms = [(_r(rng, e) + 1, _r(rng, e), 1e-5) for _ in range(2)]
        w = EncoderWeights(*ws, *norms)
        x = _r(rng, n, length, e)
        bias = np.where(rng.random((n, 1, 1, length)) < 0.3, -np.inf, 0).astype(np.float32) if masked else None
        got, got_w = ops.encoder_layer(x, w, heads, "gelu", norm_first, bias, 0, need_weights)
        want, want_w = REF.encoder_layer(x, w, heads, "gelu", norm_first, bias, 0, need_weights)
        assert isinstance(got, np.ndarray)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        if need_weights:
            assert_close(got_w, want_w, rtol=1e-4, atol=1e-6)
        else:
            assert got_w is None

    @pytest.mark.parametrize("masked, need_weights, biased", [(False, True, True), (True, False, False)])
    def test_self_attention(ops, rng, masked, need_weights, biased):
        """Multi-head self-attention (the fused ONNX ``FusedSelfAttention`` node's op) on the
        device, against the reference composition."""
        n, length, e, heads = 2, 5, 8, 2
        w_qkv, w_o = _r(rng, e, 3 * e, scale=0.3), _r(rng, e, e, scale=0.3)
        b_qkv, b_o = (_r(rng, 3 * e), _r(rng, e)) if biased else (None, None)
        x = _r(rng, n, length, e)
        bias = np.where(rng.random((n, 1, 1, length)) < 0.3, -np.inf, 0).astype(np.float32) if masked else None
        got, got_w = ops.self_attention(x, w_qkv, b_qkv, w_o, b_o, heads, bias, 0, need_weights)
        want, want_w = REF.self_attention(x, w_qkv, b_qkv, w_o, b_o, heads, bias, 0, need_weights)
        assert isinstance(got, np.ndarray) and got.shape == (n, length, e)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        if need_weights:
            assert_close(got_w, want_w, rtol=1e-4, atol=1e-6)
        else:
            assert got_w is None

    def test_attention_on_device(ops, rng):
        q, k, v = _r(rng, 1, 2, 3, 4), _r(rng, 1, 2, 5, 4), _r(rng, 1, 2, 5, 2)
        bias = np.where(rng.random((1, 1, 1, 5)) < 0.3, -np.inf, 0).astype(np.float32)
        out, w = ops.attention(q, k, v, 0.5, bias, causal=False)
        out_r, w_r = REF.attention(q, k, v, 0.5, bias, causal=False)
        assert_close(w, w_r)
        assert_close(out, out_r, atol=1e-5)

    def _lstm_args(rng, b=2, t=3, i=3, units=2, proj=None):
        out = proj or units
        return (
            _r(rng, b, t, i),
            _r(rng, i, 4 * units),
            _r(rng, out, 4 * units),
            _r(rng, 4 * units),
            _r(rng, b, out),
            _r(rng, b, units),
        )

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
        assert_close(ops.layer_norm(x, g, b, 1e-3, (-1,), rms), REF.layer_norm(x, g, b, 1e-3, (-1,), rms), atol=1e-5)
        assert_close(
            ops.layer_norm(x, g if g is None else g[:3], None, 1e-3, (1,), rms),
            REF.layer_norm(x, g if g is None else g[:3], None, 1e-3, (1,), rms),
            atol=1e-5,
        )  # not the last axis: reference fallback

    def test_batch_norm(ops, rng):
        x, scale, shift = _r(rng, 2, 3, 4), _r(rng, 4), _r(rng, 4)
        assert_close(ops.batch_norm(x, scale, shift), REF.batch_norm(x, scale, shift))
        assert_close(ops.batch_norm(x, scale[:3], shift[:3], 1), REF.batch_norm(x, scale[:3], shift[:3], 1))
        out = np.empty_like(x)
        assert ops.batch_norm(x, scale, shift, out=out) is out
        assert_close(out, REF.batch_norm(x, scale, shift))

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

    def test_merge_broadcast_and_normalization_ops(ops, rng):
        a, b = _r(rng, 2, 3, 4), _r(rng, 2, 3, 4)
        a[0, 0, 0] = np.nan
        b[1, 0, 0] = np.nan
        for op, fn in [
            ("add", np.add),
            ("subtract", np.subtract),
            ("multiply", np.multiply),
            ("maximum", np.maximum),
            ("minimum", np.minimum),
        ]:
            got, want = ops.merge(a, b, op), fn(a, b)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            assert_close(got, want, what=op)
        assert_close(ops.merge(a, b, "add", 0.5, 0.25), a * np.float32(0.5) + b * np.float32(0.25))
        c = _r(rng, 3, 1)
        assert_close(ops.merge(a, c, "subtract"), a - c)  # broadcast (3, 1)
        assert_close(
            ops.merge(c[None, :, :, None], a[:, :, None], "multiply"), c[None, :, :, None] * a[:, :, None]
        )  # both broadcast
        var = np.abs(_r(rng, 4))
        var[0] = 0
        std = np.maximum(np.sqrt(var), np.float32(1e-7))
        assert_close(ops.merge(a, var, "div_std"), a / std)
        assert_close(ops.merge(a, var, "mul_std"), a * std)
        assert_close(ops.merge(a, np.float32(3.0) * np.ones((), np.float32), "multiply"), a * 3)

    def test_concatenate(ops, rng):
        a, b, c = _r(rng, 2, 3, 4), _r(rng, 2, 3, 1), _r(rng, 2, 3, 2)
        assert_close(ops.concatenate([a, b, c], -1), np.concatenate([a, b, c], -1))
        assert_close(ops.concatenate([a, a[:, :1]], 1), np.concatenate([a, a[:, :1]], 1))
        assert_close(ops.concatenate([a, a], 0), np.concatenate([a, a], 0))

    def test_strided_copies(ops, rng):
        """copy_strided: transpose, flip, slice, broadcast, padding, int -> float32, zeros."""
        x = _r(rng, 2, 3, 4, 5)
        np.testing.assert_array_equal(ops.transpose(x, (0, 3, 1, 2)), x.transpose(0, 3, 1, 2))
        np.testing.assert_array_equal(ops.copy_view(x, lambda v: v[:, ::-1, 1:3]), x[:, ::-1, 1:3])
        np.testing.assert_array_equal(
            ops.copy_view(x[0, 0], lambda v: np.broadcast_to(v[:, None], (4, 3, 5))),
            np.broadcast_to(x[0, 0][:, None], (4, 3, 5)),
        )
        np.testing.assert_array_equal(
            ops.pad(x, ((0, 0), (1, 2), (0, 1), (0, 0))), np.pad(x, ((0, 0), (1, 2), (0, 1), (0, 0)))
        )
        ids = np.array([[3, -1], [0, 7]], np.int64)
        got = ops.as_float32(ops.cuda.to_device(ids)).copy_to_host()
        assert got.dtype == np.float32 and np.array_equal(got, ids)
        np.testing.assert_array_equal(ops.zeros((2, 3)).copy_to_host(), np.zeros((2, 3)))

    def test_relu_general(ops, rng):
        x = _r(rng, 3, 7, scale=3.0)
        x[0, 0] = np.nan
        want = np.minimum(np.where(x > 0.5, x, np.float32(0.1) * (x - np.float32(0.5))), 2.0)
        got = ops.relu(x, 0.5, 0.1, 2.0)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert_close(got, want)
        assert_close(ops.relu(x[1:], -1.0, 0.3), np.where(x[1:] > -1, x[1:], 0.3 * (x[1:] + 1)))

    @pytest.mark.parametrize("axis", [1, (1, 2), (1, 3)])
    def test_softmax_any_axes(ops, rng, axis):
        x = _r(rng, 2, 3, 4, 2)
        assert_close(ops.softmax(x, axis), REF.softmax(x, axis))
        assert_close(ops.log_softmax(x, axis), REF.log_softmax(x, axis), atol=1e-5)

    def test_norms_on_any_axis(ops, rng):
        x = _r(rng, 2, 3, 4, 5) + np.float32(0.5)
        scale, shift = _r(rng, 3), _r(rng, 3)
        assert_close(ops.batch_norm(x, scale, shift, 1), REF.batch_norm(x, scale, shift, 1))
        g, b = _r(rng, 3, 5), _r(rng, 3, 5)
        for axes in [(1, 3), (2, 3)]:
            gg, bb = (g, b) if axes == (1, 3) else (_r(rng, 4, 5), _r(rng, 4, 5))
            for rms in (False, True):
                assert_close(
                    ops.layer_norm(x, gg, bb, 1e-3, axes, rms), REF.layer_norm(x, gg, bb, 1e-3, axes, rms), atol=1e-5
                )
        for axes in [(2, 3), (3,)]:  # channels-first global pooling
            for kind in ("max", "avg"):
                assert_close(ops.global_pool(x, kind, axes, True), REF.global_pool(x, kind, axes, True))

    def test_masks(ops, rng):
        ids = np.array([[1, 0, 3], [0, 0, 2]], np.int64)
        assert np.array_equal(ops.nonzero_mask(ids), (ids != 0).astype(np.uint8))
        m = rng.random((2, 1, 3)).astype(np.float32)
        np.testing.assert_array_equal(ops.mask_bias(m, (2, 4, 3)), REF.mask_bias(m, (2, 4, 3)))
        np.testing.assert_array_equal(ops.mask_bias(ids, (2, 3)), REF.mask_bias(ids != 0, (2, 3)))
        np.testing.assert_array_equal(ops.mask_keep(m), REF.mask_keep(m))
        np.testing.assert_array_equal(ops.mask_keep(ids != 0), REF.mask_keep(ids != 0))

    def test_embedding_gather_and_index_check(ops, rng):
        from numba import cuda

        table = _r(rng, 5, 3)
        ids = np.array([[1, 4, 0], [2, 2, 3]], np.int64)
        np.testing.assert_array_equal(ops.embedding(ids, table), REF.embedding(ids, table))
        cases = [
            (ids.astype(np.float32), True),
            (np.array([[1.5, 2]], np.float32), False),
            (np.array([[5, 1]], np.int64), False),
            (np.array([[-1]], np.int64), False),
            (np.array([[np.nan]], np.float32), False),
        ]
        for bad_ids, ok in cases:
            flag = ops.zeros((1,))
            got = ops.embedding(cuda.to_device(bad_ids), table, bad=flag).copy_to_host()
            assert (flag.copy_to_host()[0] == 0) == ok, bad_ids
            if ok:
                np.testing.assert_array_equal(got, table[bad_ids.astype(np.int64)])

    @pytest.mark.parametrize(
        "case",
        [
            dict(),
            dict(mask=True, zero_masked=True),
            dict(reverse=True, return_sequences=False, y0=True),
            dict(activation="relu"),
        ],
    )
    def test_rnn_sequence(ops, rng, case):
        x, w_ih, w_hh = _r(rng, 2, 3, 3), _r(rng, 3, 2), _r(rng, 2, 2)
        b, h0 = _r(rng, 2), _r(rng, 2, 2)
        kw = _kw(rng, case, 2, 3, 2)
        for g, r in zip(ops.rnn_sequence(x, w_ih, w_hh, b, h0, **kw), REF.rnn_sequence(x, w_ih, w_hh, b, h0, **kw)):
            assert g.shape == r.shape
            assert_close(g, r, atol=1e-5)

    CONVT_CASES = [
        # (x shape, kernel hw, strides, crop, out_hw, dilation, groups, activation)
        ((1, 3, 3, 2), (3, 3), (2, 2), (1, 1), (5, 6), (1, 1), 1, "relu"),
        ((2, 2, 3, 4), (2, 3), (1, 2), (0, 0), (3, 7), (1, 1), 2, "linear"),
        ((1, 3, 2, 2), (2, 2), (2, 1), (0, 1), (7, 2), (2, 1), 1, "softmax"),
    ]

    @pytest.mark.parametrize("case", CONVT_CASES)
    def test_conv_transpose2d(ops, rng, case):
        shape, (kh, kw), strides, crop, out_hw, dilation, groups, activation = case
        x, w, b = _r(rng, *shape), _r(rng, kh, kw, shape[3], 3), _r(rng, 3 * groups)
        args = (strides, crop, out_hw, dilation, groups, activation)
        assert_close(ops.conv_transpose2d(x, w, b, *args), REF.conv_transpose2d(x, w, b, *args), atol=1e-5)

    @pytest.mark.parametrize(
        "mode,align,out_hw,scales",
        [
            ("nearest", False, (6, 4), (None, None)),
            ("nearest", False, (5, 3), (1.7, None)),
            ("bilinear", False, (6, 5), (None, None)),
            ("bilinear", True, (5, 4), (None, None)),
        ],
    )
    def test_upsample2d(ops, rng, mode, align, out_hw, scales):
        x = _r(rng, 1, 3, 2, 2)
        assert_close(ops.upsample2d(x, out_hw, mode, align, scales), REF.upsample2d(x, out_hw, mode, align, scales))

    def test_local_response_norm(ops, rng):
        x = _r(rng, 2, 3, 6)
        for size in (1, 2, 5):
            assert_close(
                ops.local_response_norm(x, size, 0.3, 0.75, 2.0), REF.local_response_norm(x, size, 0.3, 0.75, 2.0)
            )

    def test_roi_pool(ops, rng):
        x = _r(rng, 2, 6, 5, 2)
        x[1, 3, 3, 1] = np.nan
        rois = np.array([[0, 0, 0, 4, 5], [1, 1.4, 2.5, 9, 9], [1, -3, -2, 1, 0], [0, 3, 3, 3, 3]], np.float32)
        assert_close(ops.roi_pool(x, rois, (2, 3), 0.5), REF.roi_pool(x, rois, (2, 3), 0.5))
        for bad_index in (2, -1, 0.5):
            flag = ops.zeros((1,))
            ops.roi_pool(x, np.array([[bad_index, 0, 0, 1, 1]], np.float32), (1, 1), bad=flag)
            assert flag.copy_to_host()[0] == 1

    def test_tanh_and_hard_attention_scores(ops, rng):
        q, k, w = _r(rng, 2, 3, 4), _r(rng, 2, 5, 4), _r(rng, 4)
        t = np.tanh(np.float32(0.7) * (q[:, :, None] + k[:, None]))
        assert_close(ops.tanh_scores(q, k, w), np.tanh(q[:, :, None] + k[:, None]) @ w, atol=1e-5)
        assert_close(ops.tanh_scores(q, k, None, 0.7, 1.5), 1.5 * t.sum(-1), atol=1e-5)
        s = _r(rng, 2, 3, 5)
        s[0, 1, 3] = np.nan
        s[1, 2, :] = s[1, 2, 0]  # ties: the first wins
        for causal in (False, True):
            allowed = np.tril(np.ones((3, 5), bool)) if causal else np.ones((3, 5), bool)
            want = np.zeros_like(s)
            np.put_along_axis(want, np.argmax(np.where(allowed, s, -np.inf), -1)[..., None], 1, -1)
            np.testing.assert_array_equal(ops.hard_attention(s, causal), want)

    def test_hierarchical_softmax(ops, rng):
        from fastlayers.layers.hierarchical_softmax import huffman_tree, tree_paths

        nodes, signs, n_inner = tree_paths(huffman_tree([5, 1, 1, 2, 3]), 5)
        x, w, b = _r(rng, 3, 4), _r(rng, 4, n_inner), _r(rng, n_inner)
        assert_close(
            ops.hsoftmax_log_probs(x, w, b, nodes, signs), REF.hsoftmax_log_probs(x, w, b, nodes, signs), atol=1e-5
        )
        classes = np.array([4, 0, 2])
        assert_close(
            ops.hsoftmax_class_log_probs(x, w, b, nodes, signs, classes),
            REF.hsoftmax_class_log_probs(x, w, b, nodes, signs, classes),
            atol=1e-5,
        )
        flag = ops.zeros((1,))
        ops.hsoftmax_class_log_probs(
            ops.cuda.to_device(x), w, b, nodes, signs, ops.cuda.to_device(np.array([0, 5, 1], np.int64)), bad=flag
        )
        assert flag.copy_to_host()[0] == 1

    def test_attention_softmax_device_bias_broadcasts_keys(ops, rng):
        s, bias = _r(rng, 1, 2, 3, 4), np.array([[[[0.0], [-np.inf], [1.0]]]], np.float32)
        got = ops.attention_softmax(ops.cuda.to_device(s.copy()), 1.0, ops.cuda.to_device(bias))
        assert_close(got.copy_to_host(), REF.attention_softmax(s.copy(), 1.0, bias), atol=1e-6)
