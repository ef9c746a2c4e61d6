"""The native model file: round trips, and refusal of corrupt, truncated and hostile files."""

import io
import json
import pickle
import zipfile

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model, Sequential
from fastlayers import layers as L
from fastlayers.errors import ModelFileError, UnsupportedError


def functional_model():
    a, b = Input((6,), name="a"), Input((2, 3), name="b")
    shared = L.Dense(4, activation="gelu", name="shared")
    h = L.Concatenate(name="cat")([shared(a), shared(L.Flatten(name="flat")(b))])
    h = L.BatchNormalization(name="bn")(h)
    inner_in = Input((8,))
    inner = Model(inner_in, L.LayerNormalization(name="ln")(L.Dense(8, name="d")(inner_in)), name="inner")
    out1 = L.Dense(3, activation="softmax", name="probs")(inner(h))
    out2 = L.HierarchicalSoftmax(5, name="hs")(h)
    return Model([a, b], [out1, out2], name="everything")


def randomize(model, rng):
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) for w in model.get_weights()])


def test_functional_round_trip(tmp_path, rng):
    model = functional_model()
    randomize(model, rng)
    x = [rng.standard_normal((3, 6)), rng.standard_normal((3, 2, 3))]
    path = tmp_path / "m.flm"
    model.save(path)
    loaded = fastlayers.load(path)
    for got, want in zip(loaded(x), model(x)):
        np.testing.assert_array_equal(got, want)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "layers",
    [
        [L.Dense(4, activation="relu"), L.Dropout(0.5), L.Dense(2, use_bias=False)],
        [
            L.Reshape((3, 2)),
            L.Permute((2, 1)),
            L.Flatten(),
            L.RepeatVector(2),
            L.Cropping1D((0, 1)),
            L.ZeroPadding1D(2),
            L.Activation("swish"),
        ],
        [L.Rescaling(0.5, offset=1.0), L.LeakyReLU(0.1), L.ReLU(max_value=2.0), L.ELU(0.5), L.Softmax()],
    ],
)
def test_sequential_round_trip(tmp_path, rng, layers):
    model = Sequential([Input((6,)), *layers], name="seq")
    randomize(model, rng)
    x = rng.standard_normal((4, 6))
    model.save(tmp_path / "s.flm")
    np.testing.assert_array_equal(fastlayers.load(tmp_path / "s.flm")(x), model(x))


def test_embedding_and_2d_layers_round_trip(tmp_path, rng):
    ids = Input((5,), dtype="int32")
    h = L.Embedding(20, 4)(ids)
    h = L.Reshape((5, 4, 1))(h)
    h = L.ZeroPadding2D(((1, 0), (2, 1)))(h)
    h = L.Cropping2D(((0, 1), (1, 1)))(h)
    h = L.SpatialDropout2D(0.1)(h)
    model = Model(ids, L.Flatten()(h))
    randomize(model, rng)
    x = rng.integers(0, 20, (2, 5))
    model.save(tmp_path / "e.flm")
    np.testing.assert_array_equal(fastlayers.load(tmp_path / "e.flm")(x), model(x))


def test_file_is_plain_npz_without_pickle(tmp_path):
    model = Sequential([Input((3,)), L.Dense(2)])
    model.save(tmp_path / "m.flm")
    with np.load(tmp_path / "m.flm", allow_pickle=False) as data:
        header = json.loads(bytes(data["__fastlayers__"]).decode())
        assert header["format"] == "fastlayers-model" and header["model"]["class_name"] == "Sequential"
        assert data[f"{model.layers[0].name}/kernel"].shape == (3, 2)


def write_zip(path, entries):
    with zipfile.ZipFile(path, "w") as z:
        for name, payload in entries.items():
            z.writestr(name, payload)


def npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def header_bytes(model_config):
    text = json.dumps({"format": "fastlayers-model", "version": 1, "model": model_config})
    return npy_bytes(np.frombuffer(text.encode(), np.uint8))


class Boom:
    def __reduce__(self):
        return (open, ("/tmp/fastlayers_pwned", "w"))


def test_pickled_object_array_is_refused_and_never_runs(tmp_path):
    path = tmp_path / "hostile.flm"
    model = Sequential([Input((3,)), L.Dense(2, name="d")])
    model.save(path)
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    entries["d/kernel.npy"] = npy_bytes(np.array([Boom()], dtype=object))
    write_zip(path, entries)
    with pytest.raises(ModelFileError, match="hostile.flm"):
        fastlayers.load(path)
    import os

    assert not os.path.exists("/tmp/fastlayers_pwned")
    assert b"fastlayers_pwned" in pickle.dumps(Boom())  # the payload really was there


def test_truncated_and_corrupt_files(tmp_path):
    model = Sequential([Input((3,)), L.Dense(2)])
    good = tmp_path / "good.flm"
    model.save(good)
    data = good.read_bytes()
    for i, blob in enumerate([data[: len(data) // 2], data[:100], b"garbage" * 10, data.replace(b"kernel", b"kernex")]):
        bad = tmp_path / f"bad{i}.flm"
        bad.write_bytes(blob)
        with pytest.raises((ModelFileError, UnsupportedError), match=f"bad{i}.flm"):
            fastlayers.load(bad)


def test_unknown_layer_class_is_unsupported(tmp_path):
    config = {
        "class_name": "Sequential",
        "config": {
            "name": "s",
            "batch_shape": [None, 3],
            "layers": [{"class_name": "Lambda", "config": {"name": "evil", "function": "os.system"}}],
        },
    }
    write_zip(tmp_path / "u.flm", {"__fastlayers__.npy": header_bytes(config)})
    with pytest.raises(UnsupportedError, match="'evil' has unknown class 'Lambda'"):
        fastlayers.load(tmp_path / "u.flm")


def test_weights_not_matching_architecture(tmp_path):
    config = {
        "class_name": "Sequential",
        "config": {
            "name": "s",
            "batch_shape": [None, 3],
            "layers": [{"class_name": "Dense", "config": {"name": "d", "units": 2}}],
        },
    }
    write_zip(
        tmp_path / "w.flm",
        {"__fastlayers__.npy": header_bytes(config), "d/kernel.npy": npy_bytes(np.zeros((3, 2), np.float32))},
    )
    with pytest.raises(ModelFileError, match=r"missing \['d/bias'\]"):
        fastlayers.load(tmp_path / "w.flm")
    write_zip(
        tmp_path / "w.flm",
        {
            "__fastlayers__.npy": header_bytes(config),
            "d/kernel.npy": npy_bytes(np.zeros((4, 2), np.float32)),
            "d/bias.npy": npy_bytes(np.zeros(2, np.float32)),
        },
    )
    with pytest.raises(ModelFileError, match=r"'d/kernel' expects float32 \(3, 2\), found float32 \(4, 2\)"):
        fastlayers.load(tmp_path / "w.flm")


def test_bad_config_values(tmp_path):
    config = {
        "class_name": "Sequential",
        "config": {
            "name": "s",
            "batch_shape": [None, 3],
            "layers": [{"class_name": "Dense", "config": {"name": "d", "units": "many"}}],
        },
    }
    write_zip(tmp_path / "c.flm", {"__fastlayers__.npy": header_bytes(config)})
    with pytest.raises(ModelFileError, match="'d' \\(Dense\\) has an invalid config"):
        fastlayers.load(tmp_path / "c.flm")


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        fastlayers.load(tmp_path / "absent.flm")
    for suffix in (".keras", ".h5", ".onnx"):
        (tmp_path / f"m{suffix}").write_bytes(b"\x00" * 16)
        with pytest.raises(ModelFileError, match=f"m{suffix}: not a readable"):
            fastlayers.load(tmp_path / f"m{suffix}")
    (tmp_path / "m.pt").write_bytes(b"\x00" * 16)  # PyTorch files are read (tests/io/test_torch.py)
    with pytest.raises(ModelFileError, match="m.pt: corrupt"):
        fastlayers.load(tmp_path / "m.pt")
    (tmp_path / "m.xyz").write_bytes(b"hello")
    with pytest.raises(ModelFileError, match="unknown format"):
        fastlayers.load(tmp_path / "m.xyz")


def test_save_accepts_numpy_scalar_options(tmp_path):
    model = Sequential([Input((3,)), L.Rescaling(np.float32(2.0))])
    model.save(tmp_path / "ok.flm")
    assert fastlayers.load(tmp_path / "ok.flm")(np.ones((1, 3))).tolist() == [[2.0, 2.0, 2.0]]
