"""One model called from many threads at once gives exactly the serial results."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

THREADS, CALLS = 8, 200


def make_model():
    x = Input((16,))
    h = L.Dense(32, activation="gelu")(x)
    h = L.LayerNormalization()(h)
    h = L.Dense(32, activation="silu")(h)
    h = L.BatchNormalization()(h)
    return Model(x, L.Dense(8, activation="softmax")(h))


@pytest.mark.parametrize("ops", ["cpu", "reference"])
def test_8_threads_x_200_calls_equal_serial(ops):
    model = make_model()
    rng = np.random.default_rng(7)
    model.set_weights([rng.uniform(0.2, 1.0, w.shape).astype(np.float32) for w in model.get_weights()])
    # varied batch sizes so calls of different shapes interleave
    inputs = [rng.standard_normal((1 + i % 5, 16)).astype(np.float32) for i in range(THREADS * CALLS)]
    with fastlayers.use_ops(ops):
        serial = [model(x) for x in inputs]

    def worker(t):
        with fastlayers.use_ops(ops):
            return [model(inputs[t * CALLS + i]) for i in range(CALLS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = [y for chunk in pool.map(worker, range(THREADS)) for y in chunk]
    assert len(results) == len(serial) and all(np.all(np.isfinite(y)) for y in serial)
    for got, want in zip(results, serial):
        np.testing.assert_array_equal(got, want)


def test_lazy_sequential_builds_once_under_concurrency():
    model = fastlayers.Sequential([L.Dense(4), L.Dense(2)])
    x = np.ones((1, 3), np.float32)
    with ThreadPoolExecutor(THREADS) as pool:
        outs = list(pool.map(lambda _: model(x), range(64)))
    assert all(np.array_equal(o, outs[0]) for o in outs)
    assert len(model.get_weights()) == 4
