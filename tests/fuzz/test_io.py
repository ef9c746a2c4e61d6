"""Fuzzing the native, Keras (.keras, .h5) and safetensors readers.

Each format's valid seed files are mutated at the byte level (anywhere in the file, in the zip
records, inside zip members re-zipped with valid checksums) and at the structure level (configs
and headers as JSON, HDF5 objects and attributes), deterministically (seeded by case index),
and every case runs through ``tests/fuzz/harness.py``'s child-process runner: it must load, or fail with
a ``ModelFileError``/``UnsupportedError`` naming the file, within the time and memory limits.

The CI default runs ``CI_CASES`` (1,600 cases: about 9 s on 2 idle cores). The long mode:
``FASTLAYERS_FUZZ_CASES=N`` runs N cases per format instead (``FASTLAYERS_FUZZ_CASES=2500
pytest tests/fuzz/test_io.py`` runs 10,000); ``FASTLAYERS_FUZZ_WORKERS`` runs that many child
processes side by side; ``FASTLAYERS_FUZZ_SEED`` changes the seed (cases stay deterministic for
a seed); ``FASTLAYERS_FUZZ_SAVE=dir`` writes the failing cases' files there. The figures of each
run (cases, outcomes, seconds, largest RSS growth) are printed (``pytest -s``).
"""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from .harness import check_cases, make_zip, mutate_bytes, mutate_json, mutate_zip_headers, zip_members

SEEDS = Path(__file__).resolve().parent / "seeds"
DATA = Path(__file__).resolve().parents[2] / "fastlayers" / "data"
#: Cases per format in CI (9-18 s in all on 2 cores); FASTLAYERS_FUZZ_CASES overrides.
CI_CASES = {"native": 500, "keras": 350, "h5": 350, "safetensors": 400}
SEED = int(os.environ.get("FASTLAYERS_FUZZ_SEED", "27"))
#: RSS a case may add beyond twice its file's size, MiB (the largest growth seen in 70,000
#: cases of these formats was 16 MiB: allocator and first-use noise).
RSS_SLACK_MB = 32


def n_cases(fmt: str) -> int:
    return int(os.environ.get("FASTLAYERS_FUZZ_CASES") or CI_CASES[fmt])


def class_names() -> list[str]:
    import fastlayers.layers as L

    return [
        *L.__all__,
        "Functional",
        "Sequential",
        "Model",
        "InputLayer",
        "Lambda",
        "NotEqual",
        "__keras_tensor__",
        "relu",
        "softmax",
        "float16",
        "int8",
        "channels_first",
    ]


def check(cases, loader="tests.fuzz.harness:load_and_call"):
    workers = int(os.environ.get("FASTLAYERS_FUZZ_WORKERS") or 1)
    check_cases(cases, loader, workers=workers, rss_slack_mb=RSS_SLACK_MB)


# ------------------------------------------------------------------------------------- native
def npy_bytes(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def native_seeds() -> list[tuple[str, bytes]]:
    import fastlayers
    from fastlayers import layers as L

    seeds = [(p.stem, p.read_bytes()) for p in sorted(DATA.glob("digits_*.flm"))]
    a, b = fastlayers.Input((4,), name="a"), fastlayers.Input((3, 2), name="b")
    shared = L.Dense(5, activation="swish", name="shared")
    h = L.Concatenate()([shared(a), L.Dense(4)(L.Flatten()(b))])
    inner = fastlayers.Sequential(
        [fastlayers.Input((9,)), L.Dense(6, activation="elu"), L.LayerNormalization()], name="inner"
    )
    model = fastlayers.Model([a, b], [L.Dense(2)(inner(h)), L.Add()([L.Dense(3)(h), L.Dense(3)(h)])])
    rng = np.random.default_rng(0)
    model.set_weights([rng.uniform(-1, 1, w.shape) for w in model.get_weights()])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save(Path(tmp) / "f.flm")
        seeds.append(("functional", (Path(tmp) / "f.flm").read_bytes()))
    return seeds


def native_cases(n: int):
    seeds, names = native_seeds(), class_names()
    for i in range(n):
        rng = np.random.default_rng([SEED, 1, i])
        name, data = seeds[i % len(seeds)]
        kind = rng.random()
        if kind < 0.2:
            op, out = "bytes", mutate_bytes(data, rng)
        elif kind < 0.35:
            op, out = "zipheaders", mutate_zip_headers(data, rng)
        elif kind < 0.65:  # one member's bytes (its npy header more often), valid CRCs
            members = zip_members(data)
            j = int(rng.integers(0, len(members)))
            member, payload = members[j]
            if rng.random() < 0.5:
                payload = mutate_bytes(payload[:128], rng) + payload[128:]
            else:
                payload = mutate_bytes(payload, rng)
            members[j] = (member, payload)
            op, out = f"member:{member}", make_zip(members)
        else:
            members = zip_members(data)
            header = json.loads(bytes(np.load(io.BytesIO(members[0][1]))).decode())
            text = mutate_json(header, rng, names + [m for m, _ in members])
            members[0] = (members[0][0], npy_bytes(np.frombuffer(text, np.uint8)))
            op, out = "config", make_zip(members)
        yield f"native-{i}-{name}-{op}", out, ".flm"


def test_fuzz_native():
    check(native_cases(n_cases("native")))


# -------------------------------------------------------------------------------------- keras
def mutate_h5(data: bytes, rng, config_attr: str | None, names) -> bytes:
    """Structure-level edits of an HDF5 image through h5py: objects deleted, a dataset replaced
    by a group, a soft-link loop, an external link, a dataset of another dtype or shape, and
    attributes (``weight_names``, the model config) of other types and values."""
    import h5py

    bio = io.BytesIO(data)
    with h5py.File(bio, "r+") as f:
        objects, attrs = [], []
        f.visititems(lambda name, obj: objects.append((name, obj)))
        for name, obj in [("", f), *objects]:
            attrs += [(obj, key) for key in obj.attrs]
        op = rng.random()
        if op < 0.35 and attrs:
            obj, key = attrs[int(rng.integers(0, len(attrs)))]
            value = obj.attrs[key]
            if key == config_attr and rng.random() < 0.7:
                text = value.decode() if isinstance(value, bytes) else str(value)
                obj.attrs[key] = mutate_json(json.loads(text), rng, names).decode("utf-8", "replace")
            else:
                choices = [
                    np.arange(int(rng.choice([1, 3, 1000]))),
                    np.array([[b"a", b"b"]]),
                    np.array([b"\xff\xfe"]),
                    b"",
                    "x" * 70000,
                    np.array([1.5]),
                    np.array([b"../../etc/passwd"]),
                    np.array([b"vars/0" * 3]),
                    np.zeros((0,), "S1"),
                ]
                obj.attrs[key] = choices[int(rng.integers(0, len(choices)))]
        elif objects:
            name, obj = objects[int(rng.integers(0, len(objects)))]
            kind = rng.random()
            del f[name]
            if kind < 0.2:
                pass  # deleted
            elif kind < 0.4:
                f.create_group(name)
            elif kind < 0.55:
                f[name] = h5py.SoftLink("/" + name)  # a loop
            elif kind < 0.65:
                f[name] = h5py.SoftLink("/" + name.rsplit("/", 1)[0]) if "/" in name else h5py.SoftLink("/")
            elif kind < 0.72:
                f[name] = h5py.ExternalLink("/etc/passwd", "/")
            elif isinstance(obj, h5py.Dataset):
                shape = obj.shape
                choices = [
                    (shape, "f2"),
                    (shape, "f8"),
                    (shape, "i4"),
                    (shape, "S4"),
                    (shape[::-1], "f4"),
                    ((), "f4"),
                    ((*shape, 2), "f4"),
                    ((0,), "f4"),
                ]
                shape, dtype = choices[int(rng.integers(0, len(choices)))]
                f.create_dataset(
                    name,
                    shape=shape,
                    dtype=dtype,
                    chunks=True if shape and 0 not in shape and rng.random() < 0.3 else None,
                )
    return bio.getvalue()


def keras_cases(n: int):
    seeds = [(p.stem, p.read_bytes()) for p in sorted(SEEDS.glob("*.keras"))]
    names = class_names()
    for i in range(n):
        rng = np.random.default_rng([SEED, 2, i])
        name, data = seeds[i % len(seeds)]
        kind = rng.random()
        members = zip_members(data)
        index = {m: j for j, (m, _) in enumerate(members)}
        if kind < 0.15:
            op, out = "bytes", mutate_bytes(data, rng)
        elif kind < 0.25:
            op, out = "zipheaders", mutate_zip_headers(data, rng)
        elif kind < 0.55:
            j = index["config.json"]
            members[j] = ("config.json", mutate_json(json.loads(members[j][1]), rng, names))
            op, out = "config", make_zip(members)
        elif kind < 0.8:
            j = index["model.weights.h5"]
            members[j] = ("model.weights.h5", mutate_bytes(members[j][1], rng))
            op, out = "h5bytes", make_zip(members)
        else:
            j = index["model.weights.h5"]
            members[j] = ("model.weights.h5", mutate_h5(members[j][1], rng, None, names))
            op, out = "h5struct", make_zip(members)
        yield f"keras-{i}-{name}-{op}", out, ".keras"


def test_fuzz_keras():
    check(keras_cases(n_cases("keras")))


def h5_cases(n: int):
    seeds = [(p.stem, p.read_bytes()) for p in sorted(SEEDS.glob("*.h5"))]
    names = class_names()
    for i in range(n):
        rng = np.random.default_rng([SEED, 3, i])
        name, data = seeds[i % len(seeds)]
        if rng.random() < 0.5:
            op, out = "bytes", mutate_bytes(data, rng)
        else:
            op, out = "struct", mutate_h5(data, rng, "model_config", names)
        yield f"h5-{i}-{name}-{op}", out, ".h5"


def test_fuzz_h5():
    check(h5_cases(n_cases("h5")))


# -------------------------------------------------------------------------------- safetensors
def safetensors_bytes(header: dict, payload: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + payload


def safetensors_seed() -> tuple[dict, bytes]:
    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "h": rng.standard_normal(5).astype(np.float16),
        "i": np.arange(6, dtype=np.int64).reshape(2, 3),
        "bf": (rng.standard_normal(4).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16),
    }
    dtypes = {"w": "F32", "h": "F16", "i": "I64", "bf": "BF16"}
    header, payload = {"__metadata__": {"format": "pt"}}, b""
    for key, value in tensors.items():
        raw = value.tobytes()
        header[key] = {
            "dtype": dtypes[key],
            "shape": list(value.shape),
            "data_offsets": [len(payload), len(payload) + len(raw)],
        }
        payload += raw
    return header, payload


def safetensors_cases(n: int):
    header, payload = safetensors_seed()
    data = safetensors_bytes(header, payload)
    names = ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "__metadata__", "w", "data_offsets"]
    for i in range(n):
        rng = np.random.default_rng([SEED, 4, i])
        kind = rng.random()
        if kind < 0.4:
            op, out = "bytes", mutate_bytes(data, rng)
        elif kind < 0.5:
            op, out = "length", mutate_bytes(data[:8], rng) + data[8:]
        else:
            text = mutate_json(header, rng, names)
            op = "header"
            out = struct.pack("<Q", len(text)) + text + payload
        yield f"safetensors-{i}-{op}", out, ".safetensors"


def test_fuzz_safetensors():
    pytest.importorskip("safetensors")
    check(safetensors_cases(n_cases("safetensors")), "tests.fuzz.harness:load_state_dict")
