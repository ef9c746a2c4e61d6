"""fastlayers.dask on a real distributed.LocalCluster of two worker processes: results equal a
local call bit for bit (a CNN, an LSTM, an ONNX model of two inputs and two outputs, a
dataframe), the model travels to each worker once rather than with each chunk, each worker runs
its own thread count, and a worker killed mid-job is retried with the same result."""

from __future__ import annotations

import os
import signal
import time
import warnings

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")

import dask  # noqa: E402

import fastlayers  # noqa: E402
import fastlayers.dask as fd  # noqa: E402
from fastlayers import layers as L  # noqa: E402
from fastlayers.errors import InputError  # noqa: E402

from .conftest import oracle, set_random_weights  # noqa: E402

#: Rows per chunk: recurrent layers take another (per-step product) path for batches of 1-4 rows,
#: whose last bits may differ from the same rows in a bigger batch; from 5 rows up, every row
#: comes out the same at any batch size and thread count, so chunks of 25 equal one local call.
CHUNK = 25


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def one_thread():
    """The local process at the workers' thread count (a fair comparison; results do not
    depend on it, see CHUNK)."""
    from fastlayers import native

    before = native.get_num_threads()
    fastlayers.set_num_threads(1)
    yield
    fastlayers.set_num_threads(before)


def cnn(rng):
    x = fastlayers.Input((12, 12, 3))
    h = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    h = L.Conv2D(8, 3, activation="relu")(L.MaxPooling2D()(h))
    return set_random_weights(fastlayers.Model(x, L.Dense(5, activation="softmax")(L.Flatten()(h))), rng)


def lstm(rng):
    return set_random_weights(
        fastlayers.Sequential([fastlayers.Input((9, 4)), L.LSTM(16, return_sequences=True), L.LSTM(8), L.Dense(3)]), rng
    )


def count_unpickles():
    """On a worker: count the native models this process unpickles from now on."""
    from fastlayers.io import native

    load = getattr(native.load_native, "__wrapped__", native.load_native)

    def counted(path):
        counted.calls += 1
        return load(path)

    counted.calls, counted.__wrapped__ = 0, load
    native.load_native = counted


def unpickles():
    from fastlayers.io import native

    return native.load_native.calls


def test_predict_on_local_schedulers(rng, monkeypatch):
    """Without a distributed Client the graph holds the model as one object."""
    monkeypatch.setattr(distributed, "default_client", lambda: (_ for _ in ()).throw(ValueError()))
    model = cnn(rng)
    x = rng.standard_normal((60, 12, 12, 3)).astype(np.float32)
    y = fd.predict(model, da.from_array(x, chunks=CHUNK))
    with dask.config.set(scheduler="sync"):
        np.testing.assert_array_equal(y.compute(), model(x))
    with pytest.raises(InputError, match="batch axis first, of size 60"):
        fd.predict(model, [da.from_array(x, chunks=CHUNK), da.zeros((59, 2))])


@pytest.mark.parametrize("make", [cnn, lstm])
def test_predict_equals_a_local_call(client, one_thread, rng, make):
    model = make(rng)
    shape = (200, *model.input_shape[1:])
    x = rng.standard_normal(shape).astype(np.float32)
    dx = da.from_array(x, chunks=(CHUNK, *[max(1, d // 2) for d in shape[1:]]))  # split everywhere
    client.run(count_unpickles)
    y = fd.predict(model, dx)
    assert y.chunks == ((CHUNK,) * 8, *[(d,) for d in model.output_shape[1:]])
    assert y.dtype == np.float32 and y.shape == (200, *model.output_shape[1:])
    np.testing.assert_array_equal(y.compute(), model(x))
    # the model travels once per worker, not with each of the 8 chunks; distributed may hand a
    # worker its key a second time (a stolen task's dependencies fetched again)
    counts = client.run(unpickles)
    assert set(counts) == set(client.scheduler_info()["workers"])
    assert all(1 <= c <= 2 for c in counts.values()) and sum(counts.values()) < 8, counts
    assert set(client.run(fastlayers.get_num_threads).values()) == {1}


def two_headed_onnx(directory):
    """An ONNX export of an image + vector model with two outputs."""
    torch = oracle("torch")
    oracle("onnx")
    torch.manual_seed(0)

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
            self.vec = torch.nn.Linear(4, 6)
            self.cls, self.reg = torch.nn.Linear(6, 3), torch.nn.Linear(6, 2)

        def forward(self, image, vector):
            h = torch.relu(self.conv(image)).mean(dim=(2, 3)) + torch.tanh(self.vec(vector))
            return torch.softmax(self.cls(h), -1), self.reg(h)

    path = directory / "two_heads.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TwoHeads().eval(),
            (torch.zeros(1, 3, 8, 8), torch.zeros(1, 4)),
            str(path),
            dynamo=False,
            input_names=["image", "vector"],
            output_names=["probs", "box"],
            dynamic_axes={n: {0: "n"} for n in ("image", "vector", "probs", "box")},
        )
    return path


def test_onnx_model_of_two_inputs_and_outputs(client, one_thread, rng, tmp_path):
    model = fastlayers.load(two_headed_onnx(tmp_path))
    image = rng.standard_normal((150, 3, 8, 8)).astype(np.float32)
    vector = rng.standard_normal((150, 4)).astype(np.float32)
    probs, box = fd.predict(
        model, [da.from_array(image, chunks=CHUNK), da.from_array(vector, chunks=50)]
    )  # rechunked to 25s
    assert probs.chunks == ((CHUNK,) * 6, (3,)) and box.chunks == ((CHUNK,) * 6, (2,))
    got = dask.compute(probs, box)  # one model call per block for both outputs
    for a, b in zip(got, model(image, vector)):
        np.testing.assert_array_equal(a, b)


def test_predict_partitions_of_a_dataframe(client, one_thread, rng):
    pd = pytest.importorskip("pandas")
    model = set_random_weights(
        fastlayers.Sequential([fastlayers.Input((3,)), L.Dense(8, activation="relu"), L.Dense(2)]), rng
    )
    frame = pd.DataFrame(rng.standard_normal((120, 4)), columns=["a", "b", "c", "d"])
    ddf = dd.from_pandas(frame, npartitions=4)
    ddf = ddf[ddf.index.to_series() >= 30]  # the first partition is now empty
    preds = fd.predict_partitions(model, ddf, columns=["d", "a", "b"], output_columns=["p", "q"])
    assert list(preds.columns) == ["p", "q"] and preds.npartitions == 4
    got = preds.compute()
    want = model(frame[["d", "a", "b"]].to_numpy()[30:])
    np.testing.assert_array_equal(got.to_numpy(), want)
    assert (got.index == frame.index[30:]).all() and list(got.dtypes) == [np.float32] * 2


def test_a_worker_killed_mid_job_is_retried(client, one_thread, rng):
    model = lstm(rng)
    x = rng.standard_normal((400, 9, 4)).astype(np.float32)

    def slow(block):  # an upstream step slow enough to kill a worker during
        time.sleep(0.15)
        return block

    dx = da.from_array(x, chunks=CHUNK).map_blocks(slow, dtype=np.float32)
    pids = client.run(os.getpid)
    future = client.compute(fd.predict(model, dx))
    deadline = time.monotonic() + 30
    busy = []
    while not busy and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if keys and w in pids]
        time.sleep(0.05)
    assert busy and not future.done()
    os.kill(pids[busy[0]], signal.SIGKILL)
    np.testing.assert_array_equal(future.result(timeout=60), model(x))
    while time.monotonic() < deadline:  # its nanny starts a new worker process
        now = client.run(os.getpid, on_error="ignore")
        if len(now) == 2 and pids[busy[0]] not in now.values():
            break
        time.sleep(0.1)
    assert len(now) == 2 and pids[busy[0]] not in now.values()
