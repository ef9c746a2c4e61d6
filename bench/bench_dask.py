"""Batch inference on a Dask cluster (fastlayers.dask) against one process: throughput of a CNN
on a batch of a few thousand images.

Engines: ``fastlayers-cpu``, one call ``model(x)`` in this process (``THREADS`` threads), and
``dask-2x1``, ``fastlayers.dask.predict(model, x).compute()`` on a ``distributed.LocalCluster``
of two worker processes of one thread each (the same cores), the input already on the workers
(persisted, as data read by the workers would be) and the model scattered anew at each call.
Samples per second = batch / time. Outputs are compared (bit for bit) before timing.
Batch 4096 in chunks of 256 with FASTLAYERS_BENCH_FULL=1, else 512 in chunks of 128.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L

FULL = os.environ.get("FASTLAYERS_BENCH_FULL") == "1"
BATCH, CHUNK = (4096, 256) if FULL else (512, 128)
ENGINES = ["fastlayers-cpu", "dask-2x1"]


def build_cnn(rng):
    """A small image classifier: 3 convolutions (32x32x3 in), global pooling, softmax."""
    x = Input((32, 32, 3))
    h = L.MaxPooling2D()(L.Conv2D(32, 3, padding="same", activation="relu")(x))
    h = L.MaxPooling2D()(L.Conv2D(64, 3, padding="same", activation="relu")(h))
    h = L.GlobalAveragePooling2D()(L.Conv2D(64, 3, activation="relu")(h))
    model = Model(x, L.Dense(10, activation="softmax")(h))
    model.set_weights([(rng.standard_normal(w.shape) * 0.1).astype(np.float32) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def engines():
    distributed = pytest.importorskip("distributed")
    da = pytest.importorskip("dask.array")
    import fastlayers.dask as fd

    rng = np.random.default_rng(0)
    model = build_cnn(rng)
    x = rng.standard_normal((BATCH, 32, 32, 3)).astype(np.float32)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        dx = client.persist(da.from_array(x, chunks=(CHUNK, 32, 32, 3)))
        distributed.wait(dx)
        fns = {"fastlayers-cpu": lambda: model(x), "dask-2x1": lambda: fd.predict(model, dx).compute()}
        outputs = {name: fn() for name, fn in fns.items()}
        np.testing.assert_array_equal(outputs["dask-2x1"], outputs["fastlayers-cpu"])
        yield fns


@pytest.mark.parametrize("engine", ENGINES)
def bench_dask_cnn(benchmark, engines, engine):
    benchmark.group = f"dask cnn batch {BATCH}"
    benchmark.extra_info.update(
        workload="dask cnn", batch=BATCH, engine=engine, chunk=CHUNK, threads=fastlayers.get_num_threads()
    )
    benchmark(engines[engine])
