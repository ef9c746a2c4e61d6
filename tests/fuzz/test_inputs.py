"""Bad inputs at call time, one table across the model kinds: each is answered by a fastlayers
error naming the model and input, or simply works, never with a foreign exception, an
allocation the machine cannot hold, or a result that differs from the framework's.

| input                                        | answer                                       |
|----------------------------------------------|----------------------------------------------|
| float32 data not aligned to 4 bytes          | works, the bits of the aligned call          |
| a ragged nested list                         | ShapeError                                   |
| a zero-stride view larger than memory        | InputError, before anything is allocated     |
| values near float32's limit, 3x3 convolution | the exact convolution's (no Winograd inf)    |
"""

from __future__ import annotations

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, nn
from fastlayers import layers as L
from fastlayers.arrays import MAX_INPUT_BYTES
from fastlayers.errors import InputError, ShapeError

from ..conftest import oracle
from ..services.graphs import conv_relu


def _randomize(model, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(-scale, scale, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def _models(tmp_path):
    """kind -> (call, one sample's shape) for the model kinds users call."""
    x = Input((32,))
    dense = _randomize(Model(x, L.Dense(8)(L.Dense(64, activation="relu")(x))))
    x = Input((16, 16, 16))
    conv = _randomize(Model(x, L.Conv2D(16, 3, padding="same", activation="relu")(x)), scale=0.05)
    x = Input((12, 32))
    attention = _randomize(Model(x, L.MultiHeadAttention(num_heads=4, key_dim=8)(x, x)))
    dense.save(tmp_path / "dense.flm")
    native_file = fastlayers.load(tmp_path / "dense.flm")
    module = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
    rng = np.random.default_rng(5)
    module.load_state_dict(
        {k: rng.uniform(-0.05, 0.05, v.shape).astype(np.float32) for k, v in module.state_dict().items()}
    )
    onnx_model = fastlayers.load(conv_relu(tmp_path / "conv.onnx", channels=16, hw=16, seed=3))
    return {
        "dense": (dense, (32,)),
        "conv": (conv, (16, 16, 16)),
        "attention": (attention, (12, 32)),
        "native file": (native_file, (32,)),
        "torch-style module": (module, (16, 16, 16)),
        "onnx": (lambda a: onnx_model.run(None, {"x": a})[0], (16, 16, 16)),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _models(tmp_path_factory.mktemp("inputs"))


KINDS = ["dense", "conv", "attention", "native file", "torch-style module", "onnx"]


@pytest.mark.parametrize("kind", KINDS)
def test_unaligned_input_works(models, kind):
    call, shape = models[kind]
    x = np.random.default_rng(1).standard_normal((2, *shape)).astype(np.float32)
    buf = b"\0\0" + x.tobytes()
    unaligned = np.frombuffer(buf, np.float32, count=x.size, offset=2).reshape(x.shape)
    assert not unaligned.flags.aligned
    np.testing.assert_array_equal(call(unaligned), call(x))


@pytest.mark.parametrize("kind", KINDS)
def test_ragged_list_is_a_shape_error(models, kind):
    call, shape = models[kind]
    row = np.zeros(shape, np.float32).tolist()
    ragged = [row, row[:-1]]
    with pytest.raises(ShapeError, match="rectangular"):
        call(ragged)


@pytest.mark.parametrize("kind", KINDS)
def test_broadcast_batch_larger_than_memory_is_refused(models, kind):
    call, shape = models[kind]
    one = np.ones((1, *shape), np.float32)
    huge = np.broadcast_to(one, (MAX_INPUT_BYTES // one.nbytes + 1, *shape))
    assert huge.nbytes > MAX_INPUT_BYTES
    with pytest.raises(InputError, match="more than this machine's memory"):
        call(huge)


def _near_limit(shape, seed=2):
    return np.random.default_rng(seed).uniform(-1e37, 1e37, shape).astype(np.float32)


@pytest.mark.parametrize("tile_shape", [(1, 16, 16, 16), (1, 28, 28, 32)])
def test_convolution_near_float32_limit_matches_the_exact_sums(isa, tile_shape):
    """|x| up to 1e37 overflows the Winograd transforms (sums of up to 100 inputs); the
    convolution then runs directly and gives the reference's finite values."""
    cpu, ref = fastlayers.get_ops("cpu"), fastlayers.get_ops("reference")
    c = tile_shape[-1]
    x = _near_limit(tile_shape)
    w = np.random.default_rng(4).uniform(-0.05, 0.05, (3, 3, c, c)).astype(np.float32)
    b = np.zeros(c, np.float32)
    pads = ((1, 1), (1, 1))
    want = ref.conv2d(x, w, b, (1, 1), pads)
    got = cpu.conv2d(x, w, b, (1, 1), pads)
    assert np.isfinite(want).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_onnx_convolution_near_float32_limit_matches_onnxruntime(models, tmp_path):
    ort = oracle("onnxruntime")
    path = conv_relu(tmp_path / "conv.onnx", channels=16, hw=16, seed=3)
    x = _near_limit((2, 16, 16, 16))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = models["onnx"][0](x)
    assert np.isfinite(want).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_convolution_nan_input_gives_the_exact_nan_positions():
    """A NaN input reaches exactly the outputs whose window holds it (the direct sums), not
    every output of its Winograd tiles."""
    cpu, ref = fastlayers.get_ops("cpu"), fastlayers.get_ops("reference")
    x = np.random.default_rng(6).standard_normal((1, 16, 16, 16)).astype(np.float32)
    x[0, 5, 6, 3] = np.nan
    w = np.random.default_rng(7).uniform(-0.1, 0.1, (3, 3, 16, 16)).astype(np.float32)
    pads = ((1, 1), (1, 1))
    got, want = cpu.conv2d(x, w, None, (1, 1), pads), ref.conv2d(x, w, None, (1, 1), pads)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-4, atol=1e-5)
