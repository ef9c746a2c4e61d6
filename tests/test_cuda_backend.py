"""The cuda backend as a whole: selection, lazy import, errors, device residency, model.to("cuda").

Like tests/test_cuda_kernels.py, the device tests run in a subprocess under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1`` must be set before numba.cuda is imported); the tests that need no
device (lazy import, the error without a driver, device-name parsing) run in the main process or
in their own plain subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.conftest import assert_close
from tests.test_cuda_kernels import IN_CUDA_RUN, ROOT, run_under_simulator

import fastlayers
import fastlayers.nn
from fastlayers.errors import UnsupportedError


def _python(code: str, **env_changes) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


if not IN_CUDA_RUN:

    def test_cuda_backend_under_simulator():
        run_under_simulator("tests/test_cuda_backend.py")

    def test_import_and_cpu_backends_never_import_numba_cuda():
        proc = _python(
            "import sys, numpy as np, fastlayers\n"
            "from fastlayers import layers as L\n"
            "m = fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(2)])\n"
            "for b in ('cpu', 'reference'):\n"
            "    with fastlayers.use_ops(b):\n"
            "        m(np.ones((2, 3), np.float32))\n"
            "assert m.to('cpu') is m\n"
            "bad = [k for k in sys.modules if k.startswith(('numba.cuda', 'numba_cuda'))]\n"
            "assert not bad, bad\n"
            "print('ok')\n", NUMBA_ENABLE_CUDASIM=None)
        assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]

    def test_without_gpu_a_clear_error():
        """No driver / no device (this CI machine): use_ops, get_ops and model.to raise
        UnsupportedError naming the cause and the way out; with a GPU the backend loads."""
        proc = _python(
            "import numpy as np, fastlayers\n"
            "from fastlayers.errors import UnsupportedError\n"
            "from fastlayers import layers as L\n"
            "from numba import cuda\n"
            "m = fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(2)])\n"
            "if cuda.is_available():\n"
            "    print('GPU', fastlayers.get_ops('cuda').name)\n"
            "else:\n"
            "    msgs = []\n"
            "    for fn in (lambda: fastlayers.use_ops('cuda').__enter__(),\n"
            "               lambda: fastlayers.get_ops('cuda'), lambda: m.to('cuda')):\n"
            "        try:\n"
            "            fn()\n"
            "        except UnsupportedError as e:\n"
            "            msgs.append(str(e))\n"
            "    assert len(msgs) == 3, msgs\n"
            "    print('NOGPU', msgs[0])\n", NUMBA_ENABLE_CUDASIM=None)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if proc.stdout.startswith("NOGPU"):
            assert "no usable GPU" in proc.stdout and "NUMBA_ENABLE_CUDASIM=1" in proc.stdout
        else:
            assert proc.stdout.startswith("GPU cuda")

    def test_cli_backend_cuda_without_gpu():
        proc = subprocess.run([sys.executable, "-m", "fastlayers.cli", "--backend", "cuda", "demo",
                               "--repeats", "1"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items()
                                                if k != "NUMBA_ENABLE_CUDASIM"})
        if "no usable GPU" not in proc.stderr:  # a machine with a GPU runs the demo
            assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            assert proc.returncode != 0 and "Traceback" not in proc.stderr

    def test_kernels_lower_for_the_real_cuda_target():
        """Typing and lowering for the GPU target, float32 only (tests/cuda_lowering.py)."""
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.run([sys.executable, "tests/cuda_lowering.py"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "failures: []" in proc.stdout

    def test_device_names():
        from fastlayers.backends.placement import device_backend

        assert device_backend("cpu") is None
        assert device_backend("cuda") == device_backend("cuda:0") == "cuda"
        with pytest.raises(UnsupportedError, match="only one GPU"):
            device_backend("cuda:1")
        with pytest.raises(UnsupportedError, match="unknown device"):
            device_backend("tpu")
        assert device_backend(np.float32, strict=False) is None

    def test_module_to_cpu_and_dtypes_is_identity():
        net = fastlayers.nn.Linear(3, 2)
        assert net.to("cpu") is net and net.to(np.float32) is net and net.to(device="cpu") is net

    def test_unknown_backend_message():
        with pytest.raises(UnsupportedError, match="unknown backend"):
            fastlayers.get_ops("tpu")

else:
    from fastlayers import layers as L
    from fastlayers.backends.cuda import _runtime, resident

    @pytest.fixture(scope="module")
    def ops():
        return fastlayers.get_ops("cuda")

    def _x(rng, *shape):
        return rng.standard_normal(shape).astype(np.float32)

    def _cnn():
        return fastlayers.Sequential([
            fastlayers.Input((5, 5, 2)),
            L.Conv2D(3, 3, padding="same", activation="relu"),
            L.DepthwiseConv2D(3, padding="valid"),
            L.MaxPooling2D(2, padding="same"),
            L.AveragePooling2D(1),
            L.Flatten(),
            L.Dropout(0.5),
            L.Dense(3, activation="softmax"),
        ])

    def test_use_ops_cuda_model_is_device_resident(ops, rng):
        model, x = _cnn(), _x(rng, 2, 5, 5, 2)
        want = model(x)
        with fastlayers.use_ops("cuda"):
            got = model(x)
        assert isinstance(got, np.ndarray)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        # one activation transfer in, one out, every layer on the device
        assert (resident.LAST_RUN.to_device, resident.LAST_RUN.to_host) == (1, 1)
        assert resident.LAST_RUN.host_layers == []

    def test_layers_without_a_device_path_round_trip_and_are_reported(ops, rng):
        model = fastlayers.Sequential([fastlayers.Input((4,)), L.Dense(3), L.Rescaling(2.0, 0.5),
                                       L.Dense(2, activation="tanh")])
        x = _x(rng, 2, 4)
        want = model(x)
        got = model.to("cuda")(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert resident.LAST_RUN.host_layers == [model.layers[1].name]
        assert (resident.LAST_RUN.to_device, resident.LAST_RUN.to_host) == (2, 2)

    def test_functional_model_two_inputs_two_outputs(ops, rng):
        a, b = fastlayers.Input((3,), name="a"), fastlayers.Input((2,), name="b")
        ha = L.Dense(2, activation="relu")(a)
        merged = L.Concatenate()([ha, b])
        out1 = L.Dense(1, activation="sigmoid")(merged)
        model = fastlayers.Model([a, b], [out1, ha])
        xa, xb = _x(rng, 2, 3), _x(rng, 2, 2)
        want = model([xa, xb])
        got = model.to("cuda")([xa, xb])
        for g, w in zip(got, want):
            assert isinstance(g, np.ndarray)
            assert_close(g, w, rtol=1e-4, atol=1e-5)

    def test_model_to_cuda_wrapper(ops, rng):
        model = fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(2, activation="elu")])
        gpu = model.to("cuda")
        assert gpu.to("cpu") is model and gpu.layers == model.layers
        x = _x(rng, 3, 3)
        assert_close(gpu(x), model(x))
        assert_close(gpu.predict(x), model.predict(x))
        assert fastlayers.get_ops().name == "cpu"  # the wrapper does not leak its backend

    def test_nn_module_to_cuda(ops, rng):
        nn = fastlayers.nn
        net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Softmax(dim=-1))
        x = _x(rng, 2, 4)
        got = net.to("cuda")(x)
        assert isinstance(got, np.ndarray)
        assert_close(got, net(x), rtol=1e-4, atol=1e-5)

    def test_primitives_keep_device_arrays_on_the_device(ops, rng):
        from numba import cuda

        x, w, b = _x(rng, 2, 3), _x(rng, 3, 4), _x(rng, 4)
        dx = cuda.to_device(x)
        h = ops.dense(dx, w, b, "relu")
        assert _runtime.is_device(h)
        y = ops.activation(h, "softmax")
        assert _runtime.is_device(y)
        ref = fastlayers.get_ops("reference")
        assert_close(y.copy_to_host(), ref.activation(ref.dense(x, w, b, "relu"), "softmax"))
        assert isinstance(ops.dense(x, w, b), np.ndarray)  # host in, host out

    def test_weight_cache_reuse_invalidation_and_release(ops, rng):
        import gc

        ops.clear_weight_cache()
        model = fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(2)])
        x = _x(rng, 2, 3)
        gpu = model.to("cuda")
        gpu(x)
        n = len(ops.weights)
        assert n == 2                                   # kernel and bias, copied once
        gpu(x)
        assert len(ops.weights) == n                    # reused
        kernel = model.layers[0].kernel
        assert ops.weights.get(kernel) is ops.weights.get(kernel)
        del kernel
        new_w = [_x(rng, 3, 2), _x(rng, 2)]
        model.set_weights(new_w)                        # new host arrays: new device copies
        assert_close(gpu(x), x @ new_w[0] + new_w[1], atol=1e-5)
        gc.collect()
        assert len(ops.weights) == n                    # the replaced arrays' entries are gone
        model.layers[0].kernel[...] = 0                 # in place: not seen until cleared
        ops.clear_weight_cache()
        assert_close(gpu(x), np.broadcast_to(new_w[1], (2, 2)), atol=1e-6)

    def test_concurrent_calls(ops, rng):
        model = fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(2, activation="tanh")])
        gpu = model.to("cuda")
        xs = [_x(rng, 2, 3) for _ in range(3)]
        want = [model(x) for x in xs]
        got = [None] * len(xs)

        def work(i):
            got[i] = gpu(xs[i])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for g, w in zip(got, want):
            assert_close(g, w, atol=1e-5)

    def test_missing_numba_cuda_package(monkeypatch):
        real = _runtime.importlib.util.find_spec
        monkeypatch.setattr(_runtime.importlib.util, "find_spec",
                            lambda name, *a: None if name == "numba_cuda" else real(name, *a))
        with pytest.raises(UnsupportedError, match=r"fastlayers\[cuda\]"):
            _runtime.load_cuda()

    def test_recurrent_layers_on_cuda(ops, rng):
        """Keras LSTM / GRU layers (masked, bidirectional) and torch-style nn.LSTM / nn.GRU run
        their sequences through the cuda primitives and match the cpu backend."""
        ids = fastlayers.Input((3,), dtype="int32")
        h = L.Embedding(5, 2, mask_zero=True)(ids)
        h = L.Bidirectional(L.LSTM(2, return_sequences=True))(h)
        out = L.GRU(2, reset_after=False)(h)
        model = fastlayers.Model(ids, out)
        x = np.array([[1, 2, 0], [3, 0, 0]], np.int32)
        want = model(x)
        with fastlayers.use_ops("cuda"):
            got = model(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        nn = fastlayers.nn
        xs = _x(rng, 3, 2, 2)   # (T, B, I)
        for net in (nn.LSTM(2, 3, num_layers=2), nn.GRU(2, 3, bidirectional=True)):
            y_want, _ = net(xs)
            y_got, _ = net.to("cuda")(xs)
            assert_close(y_got, y_want, rtol=1e-4, atol=1e-5)

    def test_attention_and_host_path_layers_on_cuda(ops, rng):
        """A layer without a device path (MultiHeadAttention) still gives the cpu backend's
        results under the cuda backend (its hot primitives on the device)."""
        x_in = fastlayers.Input((4, 3))
        h = L.Conv1D(4, 3, padding="causal", activation="relu")(x_in)
        h = L.BatchNormalization()(h)
        att = L.MultiHeadAttention(num_heads=2, key_dim=2)(h, h, use_causal_mask=True)
        out = L.Add()([h, att])
        model = fastlayers.Model(x_in, out)
        x = _x(rng, 2, 4, 3)
        want = model(x)
        with fastlayers.use_ops("cuda"):
            got = model(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        on_host = {type(lay).__name__ for lay in model.layers
                   if lay.name in resident.LAST_RUN.host_layers}
        assert on_host == {"MultiHeadAttention"}


    def test_resnet_block_is_device_resident(ops, rng):
        """Conv-BN-ReLU, a residual Add, merges, a channel Concatenate, LayerNormalization,
        global pooling: all on the device."""
        x_in = fastlayers.Input((4, 4, 3))
        h = L.Conv2D(3, 3, padding="same", use_bias=False)(x_in)
        h = L.BatchNormalization()(h)
        h = L.ReLU()(h)
        h = L.Add()([h, x_in])
        a = L.Average()([h, L.Maximum()([h, x_in])])
        a = L.Concatenate()([a, L.Conv2D(1, 1)(a)])
        h = L.GlobalAveragePooling2D()(a)
        h = L.LayerNormalization()(h)
        model = fastlayers.Model(x_in, [L.Dense(2)(h), L.GlobalMaxPooling2D(keepdims=True)(a)])
        bn = model.layers[2]
        bn.set_weights([_x(rng, 3), _x(rng, 3), _x(rng, 3), np.abs(_x(rng, 3)) + 0.5])
        x = _x(rng, 2, 4, 4, 3)
        want = model(x)
        with fastlayers.use_ops("cuda"):
            got = model(x)
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
        assert resident.LAST_RUN.host_layers == []
        assert (resident.LAST_RUN.to_device, resident.LAST_RUN.to_host) == (1, 2)


    @pytest.mark.parametrize("padding", ["causal", "same", "valid"])
    def test_1d_model_is_device_resident(ops, rng, padding):
        model = fastlayers.Sequential([
            fastlayers.Input((7, 2)),
            L.Conv1D(3, 3, padding=padding, dilation_rate=2 if padding != "valid" else 1,
                     activation="relu"),
            L.MaxPooling1D(2, padding="same"),
            L.AveragePooling1D(1),
            L.GlobalAveragePooling1D(),
        ])
        x = _x(rng, 2, 7, 2)
        want = model(x)
        with fastlayers.use_ops("cuda"):
            got = model(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert resident.LAST_RUN.host_layers == []
