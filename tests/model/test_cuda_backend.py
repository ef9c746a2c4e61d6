"""The cuda backend as a whole: selection, lazy import, errors, device residency, model.to("cuda").

Like tests/backends/test_cuda_kernels.py, the device tests run in a subprocess under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1`` must be set before numba.cuda is imported); the tests that need no
device (lazy import, the error without a driver, device-name parsing) run in the main process or
in their own plain subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fastlayers
import fastlayers.nn
from fastlayers.errors import UnsupportedError
from tests.backends.test_cuda_kernels import IN_CUDA_RUN, ROOT, run_under_simulator

from ..conftest import assert_close, needs_numba_cuda

pytestmark = needs_numba_cuda


def _python(code: str, **env_changes) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


if not IN_CUDA_RUN:

    @pytest.mark.simulator
    def test_cuda_backend_under_simulator():
        run_under_simulator("tests/model/test_cuda_backend.py")

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
            "print('ok')\n",
            NUMBA_ENABLE_CUDASIM=None,
        )
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
            "    print('NOGPU', msgs[0])\n",
            NUMBA_ENABLE_CUDASIM=None,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        if proc.stdout.startswith("NOGPU"):
            assert "no usable GPU" in proc.stdout and "NUMBA_ENABLE_CUDASIM=1" in proc.stdout
        else:
            assert proc.stdout.startswith("GPU cuda")

    def test_caching_allocator_block_sizes():
        """Requests share blocks by rounded size: 512-byte steps below 1 MiB, then eighths of
        the power of two (checked in a plain process: the module imports numba's driver)."""
        proc = _python(
            "from fastlayers.backends.cuda.memory import rounded\n"
            "print([rounded(n) for n in (1, 512, 513, 1 << 20, (1 << 20) + 1, 3_000_000)])",
            NUMBA_ENABLE_CUDASIM=None,
        )
        assert proc.stdout.strip() == "[512, 512, 1024, 1048576, 1179648, 3145728]", proc.stderr

    def test_cli_backend_cuda_without_gpu():
        proc = subprocess.run(
            [sys.executable, "-m", "fastlayers.cli", "--backend", "cuda", "demo", "--repeats", "1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"},
        )
        if "no usable GPU" not in proc.stderr:  # a machine with a GPU runs the demo
            assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            assert proc.returncode != 0 and "Traceback" not in proc.stderr

    def test_kernels_lower_for_the_real_cuda_target():
        """Typing and lowering for the GPU target, float32 only (tests/backends/cuda_lowering.py)."""
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "tests/backends/cuda_lowering.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "failures: []" in proc.stdout

    def test_device_names():
        from fastlayers.model.placement import device_backend

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

    def test_host_arrays_go_to_the_device_with_c_strides():
        """numpy calls an array with odd strides on its length-1 axes contiguous; the device copy
        must have C strides everywhere (real numba.cuda refuses to reshape it otherwise)."""
        from fastlayers.backends.cuda.runtime import c_ordered

        c = np.arange(3, dtype=np.float32).reshape(3, 1)
        view = c[None, :, :, None]
        assert view.flags.c_contiguous
        got = c_ordered(view)
        assert got.strides == (12, 4, 4, 4) and np.array_equal(got, view)
        plain = np.zeros((2, 3), np.float32)
        assert c_ordered(plain) is plain

    from fastlayers import layers as L
    from fastlayers.backends.cuda import runtime as _runtime
    from fastlayers.backends.cuda.ops import TRANSFERS

    @pytest.fixture(scope="module")
    def ops():
        return fastlayers.get_ops("cuda")

    def _x(rng, *shape):
        return rng.standard_normal(shape).astype(np.float32)

    @contextlib.contextmanager
    def _device_only():
        """Count the real host <-> device copies (activations in and out, weights into the cache)
        and fail on anything that would copy silently on a GPU (numpy reading a device array, a
        host array given to a kernel) or a weight uploaded without being cached. On a GPU the
        copies counted are the real ones, through the driver (``_runtime._Driver``), and every
        launch (``_launch.FastKernel``) must get device arrays only."""
        counts = {"in": 0, "out": 0, "weights": 0}
        if not fastlayers.get_ops("cuda").sim:
            yield from _gpu_transfers(counts)
            return
        from numba import cuda
        from numba.cuda.simulator import kernel as sim_kernel
        from numba.cuda.simulator.cudadrv import devicearray as sim_array

        cls, internal, in_cache = sim_array.FakeCUDAArray, [0], [False]
        saved = {n: cls.__dict__[n] for n in ("__getattr__", "__len__", "copy_to_host", "copy_to_device")}
        saved_launch, saved_to_device = sim_kernel.FakeCUDAKernel.__call__, cuda.to_device
        saved_get = _runtime.WeightCache.get

        def getattr_(self, name):
            if name.startswith("__array") and not internal[0]:
                raise AssertionError(f"a device array was read as a host array ({name})")
            return saved["__getattr__"](self, name)

        def len_(self):
            raise AssertionError("len() of a device array")

        def copy_to_host(self, *args, **kw):
            counts["out"] += 1
            return saved["copy_to_host"](self, *args, **kw)

        def copy_to_device(self, ary, *args, **kw):
            counts["in"] += not isinstance(ary, cls)
            internal[0] += 1  # the simulator's own device-to-device copy reads its arrays
            try:
                return saved["copy_to_device"](self, ary, *args, **kw)
            finally:
                internal[0] -= 1

        def to_device(*args, **kw):
            counts["weights" if in_cache[0] else "in"] += 1
            return saved_to_device(*args, **kw)

        def cached_get(self, a, derive=None):
            entries, uploads = len(self._entries), counts["weights"]
            in_cache[0] = True
            try:
                return saved_get(self, a, derive)
            finally:
                in_cache[0] = False
                assert counts["weights"] - uploads == len(self._entries) - entries, (
                    "a weight was uploaded without being cached"
                )

        def launch(self, *args):
            assert not any(isinstance(a, np.ndarray) and a.ndim for a in args), (
                f"host array given to kernel {self.fn.__name__}"
            )
            return saved_launch(self, *args)

        for name, fn in (
            ("__getattr__", getattr_),
            ("__len__", len_),
            ("copy_to_host", copy_to_host),
            ("copy_to_device", copy_to_device),
        ):
            setattr(cls, name, fn)
        sim_kernel.FakeCUDAKernel.__call__, cuda.to_device = launch, to_device
        _runtime.WeightCache.get = cached_get
        try:
            yield counts
        finally:
            for name, fn in saved.items():
                setattr(cls, name, fn)
            sim_kernel.FakeCUDAKernel.__call__, cuda.to_device = saved_launch, saved_to_device
            _runtime.WeightCache.get = saved_get

    def _gpu_transfers(counts):
        """``_device_only`` on a GPU: the driver's copies counted, host arrays at launches refused."""
        from fastlayers.backends.cuda import launch as _launch

        driver_cls = type(_runtime.driver())
        saved_in, saved_out = driver_cls.to_device, driver_cls.to_host
        saved_get, saved_launch = _runtime.WeightCache.get, _launch.FastKernel.launch
        in_cache = [False]

        def to_device(self, host):
            counts["weights" if in_cache[0] else "in"] += 1
            return saved_in(self, host)

        def to_host(self, dev):
            counts["out"] += 1
            return saved_out(self, dev)

        def cached_get(self, a, derive=None):
            in_cache[0] = True
            try:
                return saved_get(self, a, derive)
            finally:
                in_cache[0] = False

        def launch(self, grid, block, args):
            assert not any(isinstance(a, np.ndarray) and a.ndim for a in args), (
                f"host array given to kernel {self.dispatcher.__name__}"
            )
            return saved_launch(self, grid, block, args)

        driver_cls.to_device, driver_cls.to_host = to_device, to_host
        _runtime.WeightCache.get, _launch.FastKernel.launch = cached_get, launch
        try:
            yield counts
        finally:
            driver_cls.to_device, driver_cls.to_host = saved_in, saved_out
            _runtime.WeightCache.get, _launch.FastKernel.launch = saved_get, saved_launch

    def _assert_resident(model, x, flag_reads=0, atol=1e-5):
        """The model on the cuda backend equals the cpu backend, every node runs on the device and
        the only activation copies are one per input in and one per output out (plus
        ``flag_reads`` reads of a value check, one per checking layer); no primitive falls back
        to the host; weights go into the cache once."""
        want = model(x)
        TRANSFERS.reset()
        with fastlayers.use_ops("cuda"), _device_only() as counts:
            got = model(x)
        for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
            assert isinstance(g, np.ndarray) and g.shape == w.shape and g.dtype == w.dtype
            assert_close(g, w, rtol=1e-4, atol=atol)
        n_in, n_out = len(model.inputs), len(model.outputs)
        assert (TRANSFERS.to_device, TRANSFERS.to_host, TRANSFERS.flag_reads, TRANSFERS.host_fallbacks) == (
            n_in,
            n_out,
            flag_reads,
            0,
        )
        if counts is not None:
            assert (counts["in"], counts["out"]) == (n_in, n_out + flag_reads)

    def _cnn():
        return fastlayers.Sequential(
            [
                fastlayers.Input((5, 5, 2)),
                L.Conv2D(3, 3, padding="same", activation="relu"),
                L.DepthwiseConv2D(3, padding="valid"),
                L.MaxPooling2D(2, padding="same"),
                L.AveragePooling2D(1),
                L.Flatten(),
                L.Dropout(0.5),
                L.Dense(3, activation="softmax"),
            ]
        )

    def test_use_ops_cuda_model_is_device_resident(ops, rng):
        _assert_resident(_cnn(), _x(rng, 2, 5, 5, 2))

    class _Scaled(L.Dense):
        """A user subclass overriding call with ops primitives."""

        two = np.full((), 2.0, np.float32)

        def call(self, x):
            return self.ops.merge(super().call(x), self.two, "multiply")

    def test_a_layer_subclass_calling_ops_runs_on_the_device(ops, rng):
        model = fastlayers.Sequential([fastlayers.Input((4,)), L.Dense(3), _Scaled(3), L.Dense(2, activation="tanh")])
        x = _x(rng, 2, 4)
        _assert_resident(model, x)

    def test_application_layers_run_on_the_device(ops, rng):
        """ConvNeXt's LayerScale and StochasticDepth, InceptionResNetV2's CustomScaleLayer and
        Keras 3's operation nodes (BinaryOp): on the device, except a division (host)."""
        x = fastlayers.Input((5, 6))
        h = L.StochasticDepth(0.1)(L.LayerScale(0.5, 6)(x))
        h = L.CustomScaleLayer(0.2)([x, h])
        h = L.BinaryOp("multiply", (None, None))([L.BinaryOp("add", (None, 3.0))([h]), h])
        y = L.BinaryOp("divide", (None, 6.0), name="sixth")([L.BinaryOp("subtract", (1.0, None))([h])])
        model = fastlayers.Model(x, y)
        model.layers[1].set_weights([_x(rng, 6)])
        xs = _x(rng, 2, 5, 6)
        want = model(xs)
        TRANSFERS.reset()
        assert_close(model.to("cuda")(xs), want, rtol=1e-5, atol=1e-6)
        assert (TRANSFERS.to_device, TRANSFERS.to_host, TRANSFERS.host_fallbacks) == (1, 1, 0)

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
        assert_close(gpu.predict_on_batch(x), model.predict_on_batch(x))
        assert fastlayers.get_ops().name == "cpu"  # the wrapper does not leak its backend

    def test_the_cuda_guide_block_runs_as_written(ops, tmp_path, monkeypatch):
        from tests.test_readme import cuda_blocks, run_block

        (block,) = cuda_blocks()  # docs/guide/cuda.md's example
        monkeypatch.chdir(tmp_path)
        ns = run_block(block)
        with fastlayers.use_ops("reference"):
            expected = ns["model"](ns["x"])
        assert_close(ns["y"], expected, rtol=1e-4, atol=1e-5)

    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":  # GPU sizes (the simulator is too slow)

        @pytest.mark.parametrize(
            "m, k, n, activation", [(2048, 1024, 4096, "gelu"), (1, 4096, 4096, "relu"), (777, 333, 1001, "softmax")]
        )
        def test_dense_at_realistic_sizes(ops, rng, m, k, n, activation):
            """Grids far beyond the simulator's sizes (up to 256 x 128 blocks), and float32 accuracy
            of the fused product against float64 over long reductions."""
            x = _x(rng, m, k)
            w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
            b = _x(rng, n)
            got = ops.dense(x, w, b, activation)
            want = fastlayers.get_ops("reference").activation(
                (x.astype(np.float64) @ w + b).astype(np.float32), activation
            )
            assert_close(got, want, rtol=2e-4, atol=2e-5)

        def test_cnn_at_realistic_size_is_resident(ops, rng):
            model = fastlayers.Sequential(
                [
                    fastlayers.Input((64, 64, 3)),
                    L.Conv2D(32, 3, padding="same", activation="relu"),
                    L.DepthwiseConv2D(3, padding="same"),
                    L.MaxPooling2D(2),
                    L.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
                    L.GlobalAveragePooling2D(),
                    L.Dense(10, activation="softmax"),
                ]
            )
            _assert_resident(model, _x(rng, 32, 64, 64, 3), atol=1e-5)

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
        assert n == 2  # kernel and bias, copied once
        gpu(x)
        assert len(ops.weights) == n  # reused
        kernel = model.layers[0].kernel
        assert ops.weights.get(kernel) is ops.weights.get(kernel)
        del kernel
        new_w = [_x(rng, 3, 2), _x(rng, 2)]
        model.set_weights(new_w)  # new host arrays: new device copies
        assert_close(gpu(x), x @ new_w[0] + new_w[1], atol=1e-5)
        gc.collect()
        assert len(ops.weights) == n  # the replaced arrays' entries are gone
        model.layers[0].kernel[...] = 0  # in place: not seen until cleared
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
        monkeypatch.setattr(
            _runtime.importlib.util, "find_spec", lambda name, *a: None if name == "numba_cuda" else real(name, *a)
        )
        with pytest.raises(UnsupportedError, match=r"fastlayers\[cuda\]"):
            _runtime.load_cuda()

    def test_numpy_without_row_stack_a_clear_error():
        """numba-cuda's array implementations fail to import under numpy 2.5 (np.row_stack
        removed): UnsupportedError naming both versions and the way out, not numba's typing
        errors at the first kernel; other import errors pass through."""

        def removed(name):
            raise AttributeError("module 'numpy' has no attribute 'row_stack'")

        with pytest.raises(UnsupportedError, match=r"numba-cuda .*numpy .*row_stack.*numpy<2\.5") as info:
            _runtime.check_numpy_support(removed)
        assert np.__version__ in str(info.value)

        def other(name):
            raise AttributeError("something else")

        with pytest.raises(AttributeError, match="something else"):
            _runtime.check_numpy_support(other)
        loaded = []
        _runtime.check_numpy_support(loaded.append)
        assert loaded == ["numba.cuda.np.arrayobj"]

    def test_recurrent_model_is_device_resident(ops, rng):
        """SimpleRNN read backwards, an LSTM returning its states, a GRU (reset before) started
        from them: time loops, state passing and the reversal all on the device."""
        x_in = fastlayers.Input((3, 2))
        h = L.SimpleRNN(2, go_backwards=True, return_sequences=True)(x_in)
        y, h_state, c_state = L.LSTM(2, return_sequences=True, return_state=True)(h)
        out = L.GRU(2, reset_after=False)(y, initial_state=[h_state])
        _assert_resident(fastlayers.Model(x_in, [out, c_state]), _x(rng, 2, 3, 2))

    def test_bidirectional_gru_with_embedding_mask_is_device_resident(ops, rng):
        ids = fastlayers.Input((3,), dtype="int32")
        h = L.Embedding(5, 2, mask_zero=True)(ids)
        h = L.Bidirectional(L.GRU(2, return_sequences=True), merge_mode="ave")(h)
        h = L.Bidirectional(L.LSTM(2))(h)
        model = fastlayers.Model(ids, L.Dense(2, activation="softmax")(h))
        _assert_resident(model, np.array([[1, 2, 0], [3, 0, 0]], np.int32), flag_reads=1)

    def test_nn_recurrent_modules_on_cuda(ops, rng):
        """torch-style modules have no graph: their sequence primitives run on the device."""
        nn = fastlayers.nn
        xs = _x(rng, 3, 2, 2)  # (T, B, I)
        for net in (nn.LSTM(2, 3, num_layers=2), nn.GRU(2, 3, bidirectional=True)):
            y_want, _ = net(xs)
            y_got, _ = net.to("cuda")(xs)
            assert_close(y_got, y_want, rtol=1e-4, atol=1e-5)

    def test_transformer_model_is_device_resident(ops, rng):
        """Embedding, positional encoding, causal multi-head attention, residual + layer norm,
        the feed-forward block and self-attention."""
        ids = fastlayers.Input((4,), dtype="int32")
        h = L.PositionalEncoding(scale_input=True)(L.Embedding(7, 4)(ids))
        a = L.MultiHeadAttention(num_heads=2, key_dim=2)(h, h, use_causal_mask=True)
        h = L.LayerNormalization()(L.Add()([h, a]))
        h = L.PositionwiseFeedForward(6, activation="gelu")(h)
        h = L.GlobalAveragePooling1D()(L.SelfAttention(2, 2)(h))
        model = fastlayers.Model(ids, L.Dense(3, activation="softmax")(h))
        _assert_resident(model, np.array([[1, 2, 3, 0], [4, 5, 6, 1]], np.int32), flag_reads=1)

    def test_attention_layers_with_masks_and_scores_are_device_resident(ops, rng):
        q_in, v_in = fastlayers.Input((3, 4)), fastlayers.Input((2, 4))
        mask_in = fastlayers.Input((3, 2))
        mha, scores = L.MultiHeadAttention(2, 3, value_dim=2, output_shape=5)(
            q_in, v_in, attention_mask=mask_in, return_attention_scores=True
        )
        outs = [
            mha,
            scores,
            L.Attention(use_scale=True)([q_in, v_in], use_causal_mask=True),
            L.Attention(score_mode="concat", use_scale=True)([q_in, v_in]),
            L.AdditiveAttention()([q_in, v_in, v_in], return_attention_scores=True)[1],
            L.HardAttention(use_scale=True)([q_in, v_in], use_causal_mask=True),
        ]
        model = fastlayers.Model([q_in, v_in, mask_in], outs)
        for layer in model.layers:
            if isinstance(layer, L.Attention) and layer.use_scale:
                layer.set_weights([np.array(-1.7, np.float32)] + layer.get_weights()[1:])
        mask = (rng.random((2, 3, 2)) > 0.3).astype(np.float32)
        mask[0, 1] = 0  # a fully masked query
        _assert_resident(model, [_x(rng, 2, 3, 4), _x(rng, 2, 2, 4), mask])

    def test_conv_transpose_and_upsampling_model_is_device_resident(ops, rng):
        model = fastlayers.Sequential(
            [
                fastlayers.Input((2, 2, 1)),
                L.Conv2DTranspose(2, 3, strides=2, padding="same", activation="relu"),  # (4, 4)
                L.UpSampling2D((1, 2)),  # (4, 8)
                L.Conv2DTranspose(
                    1, 2, strides=(2, 1), dilation_rate=(1, 2), padding="same", output_padding=(1, 0)
                ),  # (8, 8)
                L.UpSampling2D((2, 1), interpolation="bilinear"),
                L.UpSampling2D((1, 2), interpolation="bilinear", align_corners=True),
            ]
        )
        _assert_resident(model, _x(rng, 1, 2, 2, 1))

    def test_channels_first_cnn_is_device_resident(ops, rng):
        cf = {"data_format": "channels_first"}
        model = fastlayers.Sequential(
            [
                fastlayers.Input((2, 6, 6)),
                L.Conv2D(3, 3, padding="same", activation="relu", **cf),
                L.BatchNormalization(axis=1),
                L.DepthwiseConv2D(3, **cf),
                L.MaxPooling2D(2, **cf),
                L.LocalResponseNormalization(1, **cf),
                L.UpSampling2D(2, **cf),
                L.SeparableConv2D(2, 3, **cf),
                L.ZeroPadding2D(1, **cf),
                L.Cropping2D(((1, 0), (0, 1)), **cf),
                L.AveragePooling2D(2, **cf),
                L.Conv2D(2, 1, use_bias=False, **cf),
                L.Flatten(**cf),
            ]
        )
        model.layers[1].set_weights([_x(rng, 3), _x(rng, 3), _x(rng, 3), np.abs(_x(rng, 3)) + 0.5])
        _assert_resident(model, _x(rng, 2, 2, 6, 6))
        model_1d = fastlayers.Sequential(
            [
                fastlayers.Input((2, 7)),
                L.Conv1D(3, 3, padding="same", **cf),
                L.MaxPooling1D(2, **cf),
                L.GlobalAveragePooling1D(**cf),
            ]
        )
        _assert_resident(model_1d, _x(rng, 2, 2, 7))

    def test_core_reshaping_and_block_layers_are_device_resident(ops, rng):
        x_in = fastlayers.Input((4, 3))
        h = L.ZeroPadding1D((1, 2))(x_in)
        h = L.Cropping1D((2, 0))(L.SpatialDropout1D(0.3)(h))  # (5, 3)
        h = L.Rescaling([0.5, 2.0, -1.0], 0.25)(h)
        h = L.ReLU(max_value=1.5, negative_slope=0.1, threshold=-0.2)(h)
        h = L.Normalization(mean=[0.1, 0.2, 0.3], variance=[1.0, 4.0, 0.0])(h)
        h = L.Softmax(axis=1)(L.Permute((2, 1))(h))  # (3, 5)
        h = L.Reshape((5, 3))(h)
        r = L.RepeatVector(5)(L.Flatten()(L.Reshape((-1,))(L.GlobalMaxPooling1D()(h))))
        h = L.Multiply()([L.Subtract()([h, r]), L.Dense(1)(h)])  # broadcasts
        inner = fastlayers.Sequential([fastlayers.Input((5, 3)), L.Dense(4, activation="elu")])
        h = L.Average()([inner(h), L.Dense(4)(h), L.Dense(4)(h)])
        h = L.Reshape((5, 2, 2))(h)
        h = L.InceptionBlock(1, 1, 2, 1, 1, 1)(h)
        h = L.NiNBlock(2, 2, padding="same", mlp_filters=(3,), global_pool=False)(h)
        h = L.Normalization(axis=None, mean=0.5, variance=2.0, invert=True)(h)
        feats = L.Flatten()(h)
        probs = L.HierarchicalSoftmax(5)(feats)
        model = fastlayers.Model(x_in, [probs, L.LeakyReLU()(h)])
        _assert_resident(model, _x(rng, 2, 4, 3))

    def test_roi_pooling_and_class_probabilities_are_device_resident(ops, rng):
        feats_in, rois_in = fastlayers.Input((6, 5, 2)), fastlayers.Input((5,), batch_size=None)
        pooled = L.RoIPooling2D((2, 2), spatial_scale=0.5)([feats_in, rois_in])
        classes_in = fastlayers.Input((), dtype="int32")
        p = L.HierarchicalSoftmax(3)([L.Flatten()(pooled), classes_in])
        model = fastlayers.Model([feats_in, rois_in, classes_in], [pooled, p])
        rois = np.array([[0, 0, 0, 8, 9], [1, 1.4, 2.5, 9, 9]], np.float32)  # (K, 5), K = batch
        _assert_resident(
            model, [_x(rng, 2, 6, 5, 2), rois, np.array([0, 2], np.int32)], flag_reads=2
        )  # one per checking layer: the rois, the classes

    def test_value_checks_raise_the_layers_own_errors(ops, rng):
        """Indices are checked in the kernels; a bad one raises what the cpu backend raises."""
        from fastlayers.errors import InputError

        ids = fastlayers.Input((2,))
        model = fastlayers.Model(ids, L.Dense(2)(L.Flatten()(L.Embedding(4, 2)(ids))))
        for bad in (np.array([[1, 4]], np.float32), np.array([[0.5, 1]], np.float32)):
            with pytest.raises(InputError) as cpu_error:
                model(bad)
            with fastlayers.use_ops("cuda"), pytest.raises(InputError) as cuda_error:
                model(bad)
            assert str(cuda_error.value) == str(cpu_error.value)
        feats_in, rois_in = fastlayers.Input((3, 3, 1)), fastlayers.Input((5,))
        roi = fastlayers.Model([feats_in, rois_in], L.RoIPooling2D((1, 1))([feats_in, rois_in]))
        with fastlayers.use_ops("cuda"), pytest.raises(InputError, match="batch indices"):
            roi([_x(rng, 1, 3, 3, 1), np.array([[1, 0, 0, 1, 1]], np.float32)])

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
        TRANSFERS.reset()
        with fastlayers.use_ops("cuda"):
            got = model(x)
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-4, atol=1e-5)
        assert (TRANSFERS.to_device, TRANSFERS.to_host, TRANSFERS.host_fallbacks) == (1, 2, 0)

    @pytest.mark.parametrize("padding", ["causal", "same", "valid"])
    def test_1d_model_is_device_resident(ops, rng, padding):
        model = fastlayers.Sequential(
            [
                fastlayers.Input((7, 2)),
                L.Conv1D(3, 3, padding=padding, dilation_rate=2 if padding != "valid" else 1, activation="relu"),
                L.MaxPooling1D(2, padding="same"),
                L.AveragePooling1D(1),
                L.GlobalAveragePooling1D(),
            ]
        )
        x = _x(rng, 2, 7, 2)
        want = model(x)
        TRANSFERS.reset()
        with fastlayers.use_ops("cuda"):
            got = model(x)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert (TRANSFERS.to_device, TRANSFERS.to_host, TRANSFERS.host_fallbacks) == (1, 1, 0)
