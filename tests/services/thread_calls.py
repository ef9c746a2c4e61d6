"""Child process of test_threads_memory.py: calls models from many short-lived threads.

``python -m tests.services.thread_calls CALLS ONNX_FILE INT8_FILE`` builds one model of each kind
(Keras-style dense, convolution, LSTM and self-attention models with random weights, and the two
ONNX files given), calls each ``CALLS`` times, every call on a new thread that ends after it,
and prints one JSON object: per kind, the RSS growth over those calls (MiB, after a few warm-up
threads that create the C library's per-thread arena once), the calls whose result differs in
any bit from the main thread's, and the threads whose kernel buffers the core freed at exit.
Run in its own process so that the RSS measured is that of the calls alone.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L
from fastlayers.native import _core

from ..conftest import set_random_weights

WARM_THREADS = 8


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def keras_models(rng):
    """(kind, call, input) of the Keras-style models, each with several MiB of kernel work
    buffers per call (the per-thread state a new thread allocates)."""
    x = Input((512,))
    dense = Model(x, L.Dense(10)(L.Dense(1024, activation="relu")(L.Dense(1024, activation="relu")(x))))
    x = Input((56, 56, 64))
    h = L.Conv2D(64, 3, padding="same", activation="relu")(x)
    conv = Model(x, L.Conv2D(32, 5, strides=2, padding="same")(L.MaxPooling2D(2)(h)))
    x = Input((50, 64))
    lstm = Model(x, L.LSTM(128, return_sequences=True)(x))
    x = Input((64, 256))
    attention = Model(x, L.MultiHeadAttention(num_heads=8, key_dim=32)(x, x))
    shapes = {"dense": (64, 512), "conv": (1, 56, 56, 64), "lstm": (4, 50, 64), "attention": (4, 64, 256)}
    for kind, model in [("dense", dense), ("conv", conv), ("lstm", lstm), ("attention", attention)]:
        xi = rng.standard_normal(shapes[kind]).astype(np.float32)
        model(xi)  # built
        yield kind, set_random_weights(model, rng), xi


def onnx_model(kind, path, rng):
    model = fastlayers.load(path)
    inp = model.get_inputs()[0]
    xi = rng.standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
    return kind, lambda x: model.run(None, {inp.name: x})[0], xi


def on_new_thread(call, x):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("y", call(x)))
    t.start()
    t.join()
    return out["y"]


def measure(call, x, calls):
    want = call(x)
    for _ in range(WARM_THREADS):
        on_new_thread(call, x)
    released, start = _core.threads_released(), rss_mib()
    differ = sum(not np.array_equal(on_new_thread(call, x), want) for _ in range(calls))
    # join() returns once Python is done with a thread; the C runtime frees its buffers just after
    deadline = time.monotonic() + 2.0
    while _core.threads_released() - released < calls and time.monotonic() < deadline:
        time.sleep(0.001)
    return {"growth_mib": rss_mib() - start, "differ": differ, "released": _core.threads_released() - released}


def main(argv):
    calls, onnx_path, int8_path = int(argv[0]), argv[1], argv[2]
    fastlayers.set_num_threads(2)
    rng = np.random.default_rng(0)
    models = list(keras_models(rng)) + [onnx_model("onnx", onnx_path, rng), onnx_model("int8", int8_path, rng)]
    print(json.dumps({kind: measure(call, x, calls) for kind, call, x in models}))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
