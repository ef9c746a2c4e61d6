"""Malformed and hostile inputs: one regression test per class of failure found by
flipping bits, inflating size fields and editing configs and graphs in valid files. Each must
end in a ModelFileError or UnsupportedError naming the file (or, for calls, a fastlayers
error), quickly and without a large allocation.

The Keras seeds are tests/fuzz/seeds/*.keras and *.h5 (written by Keras: make_seeds.py); the
fuzz suite itself is tests/fuzz/test_io.py.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

import fastlayers
from fastlayers import layers as L
from fastlayers.errors import FastlayersError, InputError, ModelFileError, ShapeError, UnsupportedError

from ..fuzz.harness import make_zip, zip_members

SEEDS = Path(__file__).resolve().parents[1] / "fuzz" / "seeds"
MLP = fastlayers.DEMO_DIR / "digits_mlp.flm"
h5py = pytest.importorskip("h5py")


def refused(path, kind=(ModelFileError, UnsupportedError), match=None, **kwargs):
    """fastlayers.load(path) raises ``kind`` naming the file (and matching ``match``)."""
    with pytest.raises(kind) as info:
        fastlayers.load(path, **kwargs)
    assert Path(path).name in str(info.value), info.value
    if match:
        assert any(m in str(info.value) for m in ([match] if isinstance(match, str) else match)), info.value
    return info.value


def zip_seeds(tmp_path):
    """A native file and a .keras archive (both zips) to damage."""
    return {"flm": MLP.read_bytes(), "keras": (SEEDS / "mlp.keras").read_bytes()}


def patch_zip_field(data: bytes, field: str, value: int, name_bytes: bytes | None = None) -> bytes:
    """Set a field of every local and central header: "version" (needed to extract), "flags",
    "method"; or replace the first member's name (same length)."""
    buf = bytearray(data)
    offsets = {"version": (4, 6), "flags": (6, 8), "method": (8, 10)}  # local; central is +2
    for magic, shift in ((b"PK\x03\x04", 0), (b"PK\x01\x02", 2)):
        at = buf.find(magic)
        while at != -1:
            lo, hi = offsets[field]
            buf[at + lo + shift : at + hi + shift] = value.to_bytes(2, "little")
            at = buf.find(magic, at + 1)
    return bytes(buf)


# ---------------------------------------------------------------------------------- zip layer
@pytest.mark.parametrize("fmt", ["flm", "keras"])
def test_zip_name_not_utf8(tmp_path, fmt):
    """UnicodeDecodeError: a member name flagged UTF-8 that is not."""
    data = bytearray(patch_zip_field(zip_seeds(tmp_path)[fmt], "flags", 0x800))
    first = data.find(b"PK\x01\x02")
    name_len = struct.unpack_from("<H", data, first + 28)[0]
    data[first + 46 : first + 46 + name_len] = b"\xff" * name_len
    path = tmp_path / f"name.{fmt}"
    path.write_bytes(bytes(data))
    refused(path, match="not a readable")


@pytest.mark.parametrize("fmt", ["flm", "keras"])
def test_zip_version_encryption_and_methods(tmp_path, fmt):
    """NotImplementedError (zip version 25.5, a compression method), RuntimeError (the
    encryption flag), strong encryption: all refused before a member is read."""
    seed = zip_seeds(tmp_path)[fmt]
    cases = {
        "version": (patch_zip_field(seed, "version", 255), "readable"),
        "encrypted": (patch_zip_field(seed, "flags", 0x1), "encrypted"),
        "strong": (patch_zip_field(seed, "flags", 0x41), "encrypted"),
        "method99": (patch_zip_field(seed, "method", 99), "compression method 99"),
        "lzma": (patch_zip_field(seed, "method", zipfile.ZIP_LZMA), "lzma"),
    }
    for name, (data, match) in cases.items():
        path = tmp_path / f"{name}.{fmt}"
        path.write_bytes(data)
        refused(path, match=match)


@pytest.mark.parametrize("fmt", ["flm", "keras"])
def test_zip_corrupt_deflate_stream(tmp_path, fmt):
    """zlib.error: a deflated member whose compressed bytes are damaged (valid headers)."""
    members = zip_members(zip_seeds(tmp_path)[fmt])
    data = bytearray(make_zip(members, zipfile.ZIP_DEFLATED))
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).infolist()[-1]
    start = info.header_offset + 30 + len(info.filename)
    data[start : start + 8] = b"\xff" * 8  # an invalid block type
    path = tmp_path / f"deflate.{fmt}"
    path.write_bytes(bytes(data))
    refused(path)


def test_zip_lzma_member_never_decompressed(tmp_path):
    """LZMAError: an lzma member (corrupt or not) is refused by its method, never decoded."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_LZMA) as z:
        for name, payload in zip_members(MLP.read_bytes()):
            z.writestr(name, payload)
    data = bytearray(out.getvalue())
    data[60:70] = b"\x00" * 10  # the lzma stream of the first member
    (tmp_path / "lzma.flm").write_bytes(bytes(data))
    refused(tmp_path / "lzma.flm", UnsupportedError, "lzma")


def test_keras_weight_byte_flip_fails_the_crc(tmp_path):
    """.keras weights were read past the zip CRC: a flipped weight byte loaded silently."""
    data = bytearray((SEEDS / "mlp.keras").read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("model.weights.h5")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.file_size - 200] ^= 0x10  # inside the last weights written
    (tmp_path / "flip.keras").write_bytes(bytes(data))
    refused(tmp_path / "flip.keras", ModelFileError, "CRC-32")


# ------------------------------------------------------------------------------ native format
def native_members():
    return dict(zip_members(MLP.read_bytes()))


def write_native(path, members):
    path.write_bytes(make_zip(list(members.items())))
    return path


def test_npy_header_length_1(tmp_path):
    """tokenize.TokenError from numpy's header parser: a header of length 1."""
    members = native_members()
    key = next(k for k in members if k.endswith("kernel.npy"))
    members[key] = b"\x93NUMPY\x01\x00\x01\x00{" + members[key][128:]
    refused(write_native(tmp_path / "len1.flm", members), ModelFileError, "header")


def test_member_that_is_not_an_npy(tmp_path):
    """AttributeError: a weight member holding arbitrary bytes (or a pickle)."""
    members = native_members()
    key = next(k for k in members if k.endswith("bias.npy"))
    members[key] = b"just some bytes, no magic"
    refused(write_native(tmp_path / "notnpy.flm", members), ModelFileError, "not an .npy")


def header_member(obj) -> bytes:
    out = io.BytesIO()
    text = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    np.save(out, np.frombuffer(text, np.uint8))
    return out.getvalue()


def mlp_header() -> dict:
    return json.loads(bytes(np.load(io.BytesIO(native_members()["__fastlayers__.npy"]))))


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda h: h.update(model=[1, 2]), "model: expected an object"),
        (lambda h: h["model"].update(config="x"), "model: expected an object"),
        (lambda h: h["model"]["config"].update(layers={"a": 1}), "layers: expected a list"),
        (lambda h: h["model"]["config"]["layers"][0].update(config=[]), "layers[0]: expected an object"),
        (lambda h: h["model"]["config"]["layers"][0].update(class_name=7), "layers[0]: expected an object"),
        (lambda h: h["model"]["config"].update(nodes="big"), "nodes: expected a list"),
        (lambda h: h["model"]["config"]["nodes"][1].update(args=[[1, "x"]]), "args[0][0]: expected"),
        (lambda h: h.update(version="2"), "malformed format version"),
        (lambda h: h.update(format=["x"]), "not a fastlayers architecture"),
    ],
)
def test_native_config_of_the_wrong_type(tmp_path, edit, match):
    """AttributeError inside the handler that builds the error; version "2" (TypeError)."""
    header = mlp_header()
    edit(header)
    members = native_members()
    members["__fastlayers__.npy"] = header_member(header)
    refused(write_native(tmp_path / "types.flm", members), ModelFileError, match)


def test_native_deep_json(tmp_path):
    """RecursionError: a 100,000-deep JSON header."""
    members = native_members()
    members["__fastlayers__.npy"] = header_member(
        b'{"format": "fastlayers-model", "model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    )
    refused(write_native(tmp_path / "deep.flm", members), ModelFileError, "nested")


def test_npy_header_claiming_a_huge_array(tmp_path):
    """MemoryError before any check: an npy header claiming 100000x100000 float32 (40 GB)."""
    members = native_members()
    key = next(k for k in members if k.endswith("kernel.npy"))
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }".ljust(117) + "\n"
    members[key] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64
    start = time.perf_counter()
    refused(write_native(tmp_path / "huge.flm", members), ModelFileError, "declares")
    assert time.perf_counter() - start < 5


def test_native_weight_sizes_against_the_file(tmp_path):
    """units: 10**11 (MemoryError at build) and 2**63 (OverflowError) are refused from the
    config, before a weight is allocated."""
    for units, match in (
        (10**8, "weight elements the file can hold"),
        (10**11, "outside the range"),
        (2**63, "outside the range"),
    ):
        header = mlp_header()
        layer = next(e for e in header["model"]["config"]["layers"] if e["class_name"] == "Dense")
        layer["config"]["units"] = units
        members = native_members()
        members["__fastlayers__.npy"] = header_member(header)
        refused(write_native(tmp_path / "units.flm", members), ModelFileError, match)


# ------------------------------------------------------------------------------------- Keras
def keras_entries(name="mlp"):
    return dict(zip_members((SEEDS / f"{name}.keras").read_bytes()))


def write_keras(path, entries):
    path.write_bytes(make_zip(list(entries.items())))
    return path


def edit_weights_h5(data: bytes, edit) -> bytes:
    bio = io.BytesIO(data)
    with h5py.File(bio, "r+") as f:
        edit(f)
    return bio.getvalue()


def edit_h5_file(src: Path, dst: Path, edit) -> Path:
    dst.write_bytes(edit_weights_h5(src.read_bytes(), edit))
    return dst


KERNEL_KERAS = "layers/dense/vars/0"
KERNEL_H5 = "model_weights/dense/mlp/dense/kernel"


@pytest.mark.parametrize("fmt", ["keras", "h5"])
@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda f, k: f.__delitem__(k), ["no dataset", "expects 2 weights, the file has 1"]),
        (lambda f, k: (f.__delitem__(k), f.create_group(k)), "expected a dataset"),
        (lambda f, k: (f.__delitem__(k), f.__setitem__(k, h5py.SoftLink("/" + k))), "SoftLink"),
        (lambda f, k: (f.__delitem__(k), f.__setitem__(k, h5py.ExternalLink("/etc/passwd", "/"))), "ExternalLink"),
        (lambda f, k: (f.__delitem__(k), f.create_dataset(k, data=np.array(["a"] * 48, "S1").reshape(6, 8))), "dtype"),
    ],
)
def test_keras_missing_datasets_links_and_groups(tmp_path, fmt, edit, match):
    """h5py KeyError / RuntimeError (too many links) escaped from the weight assignment; a
    dataset replaced by a group (AttributeError); an external link (opens another file); a
    dataset of strings."""
    if fmt == "keras":
        entries = keras_entries()
        entries["model.weights.h5"] = edit_weights_h5(entries["model.weights.h5"], lambda f: edit(f, KERNEL_KERAS))
        path = write_keras(tmp_path / "links.keras", entries)
    else:
        path = edit_h5_file(SEEDS / "mlp.h5", tmp_path / "links.h5", lambda f: edit(f, KERNEL_H5))
    refused(path, ModelFileError, match)


def test_h5_bad_object_address(tmp_path):
    """OSError / RuntimeError (addr overflow) from a link whose object address is corrupt."""
    data = (SEEDS / "mlp.h5").read_bytes()
    with h5py.File(io.BytesIO(data), "r") as f:
        addr = h5py.h5o.get_info(f[KERNEL_H5].id).addr
    needle = struct.pack("<Q", addr)
    assert needle in data
    (tmp_path / "addr.h5").write_bytes(data.replace(needle, struct.pack("<Q", 2**40)))
    refused(tmp_path / "addr.h5", ModelFileError)


def test_h5_dataset_address_outside_the_file(tmp_path):
    """A contiguous dataset whose data address points past the file: bounds-checked read."""
    data = (SEEDS / "mlp.h5").read_bytes()
    with h5py.File(io.BytesIO(data), "r") as f:
        offset = f[KERNEL_H5].id.get_offset()
    needle = struct.pack("<Q", offset)
    (tmp_path / "data.h5").write_bytes(data.replace(needle, struct.pack("<Q", len(data) - 8)))
    refused(tmp_path / "data.h5", ModelFileError, ["outside the file", "corrupt"])


def keras_config(name="mlp"):
    return json.loads(keras_entries(name)["config.json"])


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda c: c.update(config=[]), "config: expected an object"),
        (lambda c: c["config"].update(layers="x"), "layers: expected a list"),
        (lambda c: c["config"]["layers"].__setitem__(1, 5), "layers[1]: expected an object"),
        (lambda c: c["config"]["layers"][1].update(config=None), "layers[1]: expected an object"),
        (lambda c: c["config"]["layers"][1]["config"].update(dtype=[1]), "dtype policy"),
        (lambda c: c["config"]["layers"][1]["config"].update(activation=[{}]), "invalid config"),
        (lambda c: c["config"]["layers"][1]["config"].update(units=10**8), "weight elements"),
        (lambda c: c["config"]["layers"][1]["config"].update(units=10**11), "outside the range"),
        (lambda c: c["config"]["layers"][1]["config"].update(units=2**63), "outside the range"),
    ],
)
def test_keras_configs_of_the_wrong_type_and_range(tmp_path, edit, match):
    """AttributeError from configs of the wrong type; units 10**11 (MemoryError)."""
    config = keras_config()
    edit(config)
    entries = keras_entries()
    entries["config.json"] = json.dumps(config).encode()
    refused(write_keras(tmp_path / "cfg.keras", entries), (ModelFileError, UnsupportedError), match)


def test_keras_dilation_rate_2_63_refused_at_load(tmp_path):
    """dilation_rate: 2**63 raised OverflowError at the first call."""
    config = keras_config("conv")
    layer = next(e for e in config["config"]["layers"] if e["class_name"] == "DepthwiseConv2D")
    layer["config"]["dilation_rate"] = [2**63, 2**63]
    entries = keras_entries("conv")
    entries["config.json"] = json.dumps(config).encode()
    refused(write_keras(tmp_path / "dil.keras", entries), ModelFileError, "dilation_rate")


def deflate_bomb(size: int, declared: int | None = None) -> bytes:
    """A .keras archive whose config.json decompresses to ``size`` bytes of spaces (declared as
    ``declared``)."""
    entries = keras_entries()
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = b" " * (1 << 20)
    piece = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, no
    body = piece * ((size >> 20) - 1) + compressor.compress(chunk) + compressor.flush()  # history
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, payload in entries.items():
            if name != "config.json":
                z.writestr(name, payload)
    data = out.getvalue()
    # a hand-made deflated member: local header, data, central header; then the rest moved
    name = b"config.json"
    crc = zlib.crc32(b"")
    for _ in range(size >> 20):
        crc = zlib.crc32(chunk, crc)
    file_size = size if declared is None else declared
    local = (
        struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(body), min(file_size, 2**32 - 1), len(name), 0
        )
        + name
    )
    cd_start = data.rfind(b"PK\x05\x06")
    eocd = bytearray(data[cd_start:])
    old_cd_offset = struct.unpack_from("<I", eocd, 16)[0]
    members, central = data[:old_cd_offset], data[old_cd_offset:cd_start]
    new_central = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            20,
            20,
            0,
            8,
            0,
            0,
            crc,
            len(body),
            min(file_size, 2**32 - 1),
            len(name),
            0,
            0,
            0,
            0,
            0,
            len(members),
        )
        + name
    )
    central_all = central + new_central
    struct.pack_into("<HH", eocd, 8, eocd[8] + 1, eocd[10] + 1)
    struct.pack_into("<II", eocd, 12, len(central_all), len(members) + len(local) + len(body))
    return members + local + body + central_all + bytes(eocd)


def test_keras_config_deflate_bomb(tmp_path):
    """A 1 GB deflate bomb in config.json took 8-11 s and +2 GiB before an error: now refused
    from its declared size, and a bomb declaring a small size is read only that far."""
    import resource

    bomb = deflate_bomb(1 << 30)
    assert len(bomb) < 2 << 20
    (tmp_path / "bomb.keras").write_bytes(bomb)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    refused(tmp_path / "bomb.keras", ModelFileError, "over the")
    (tmp_path / "liar.keras").write_bytes(deflate_bomb(1 << 30, declared=1000))
    refused(tmp_path / "liar.keras", ModelFileError)
    assert time.perf_counter() - start < 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB


def corrupt_global_heap(data: bytes) -> bytes:
    """Keras's .h5 with one object of its HDF5 global heap (the vlen strings: model config,
    weight_names) turned into a free-space object of size 0."""
    buf = bytearray(data)
    at = buf.find(b"GCOL")
    p = at + 16
    for _ in range(10):  # the 10th object: a weight_names list
        size = struct.unpack_from("<Q", buf, p + 8)[0]
        p += 16 + ((size + 7) & ~7)
    struct.pack_into("<HHIQ", buf, p, 0, 0, 0, 0)
    return bytes(buf)


def test_h5_global_heap_endless_loop_refused(tmp_path):
    """An .h5 whose weight_names attribute sent h5py into an endless loop (HDF5 loops on a
    global heap object of size 0): refused before HDF5 reads it. Run in a child process with a
    timeout, so that a regression fails instead of hanging the suite."""
    path = tmp_path / "loop.h5"
    path.write_bytes(corrupt_global_heap((SEEDS / "mlp.h5").read_bytes()))
    code = (
        "import fastlayers, sys\n"
        "try:\n    fastlayers.load(sys.argv[1])\n"
        "except fastlayers.errors.ModelFileError as e:\n    print('refused:', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert "refused:" in proc.stdout and "global heap" in proc.stdout, proc.stdout + proc.stderr


def test_h5_weights_file_endless_loop_refused(tmp_path):
    """The same guard in Model.load_weights on a legacy file."""
    model = fastlayers.load(SEEDS / "mlp.h5")
    path = tmp_path / "loopw.h5"
    path.write_bytes(corrupt_global_heap((SEEDS / "mlp.h5").read_bytes()))
    with pytest.raises(ModelFileError, match="global heap"):
        model.load_weights(path)


# ------------------------------------------------------------------------------- safetensors
def test_safetensors_deep_header(tmp_path):
    """RecursionError: a deeply nested safetensors header."""
    text = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (tmp_path / "deep.safetensors").write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(ModelFileError, match="deep.safetensors.*nested"):
        fastlayers.load_state_dict(tmp_path / "deep.safetensors")


# -------------------------------------------------------------------------------------- calls
def test_ragged_input_to_predict():
    """numpy's ValueError on a ragged nested list."""
    model = fastlayers.load(MLP)
    with pytest.raises(ShapeError, match="not a rectangular numeric array"):
        model.predict([[1.0] * 64, [1.0] * 63])


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, "4"])
def test_predict_batch_size_validated(batch_size):
    with pytest.raises(InputError, match="batch_size"):
        fastlayers.load(MLP).predict(np.zeros((5, 64)), batch_size=batch_size)


def test_inf_input_no_numpy_warnings():
    """An inf (or float64 overflowing float32) input printed numpy RuntimeWarnings."""
    model = fastlayers.load(MLP)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fill in (np.inf, -np.inf, np.nan, 1e300):
            for backend in ("cpu", "reference"):
                with fastlayers.use_ops(backend):
                    assert model.predict(np.full((2, 64), fill), batch_size=1).shape == (2, 10)


@pytest.mark.parametrize("n", [0, -1, 1000, 2.5, True, "2"])
def test_set_num_threads_validated(n):
    with pytest.raises(InputError, match="set_num_threads"):
        fastlayers.set_num_threads(n)


# ----------------------------------------------------------------------------------------- API
def test_load_directory_says_directory(tmp_path):
    refused(tmp_path, ModelFileError, "is a directory")


@pytest.mark.parametrize("path", [MLP, SEEDS / "conv.keras", SEEDS / "conv.h5"])
def test_load_bytes_and_binary_file_objects(path):
    expected = fastlayers.load(path)
    x = np.random.default_rng(0).standard_normal((2, *expected.input_shape[1:])).astype(np.float32)
    data = path.read_bytes()
    with open(path, "rb") as f:
        sources = [data, bytearray(data), memoryview(data), io.BytesIO(data), f]
        for source in sources:
            np.testing.assert_array_equal(fastlayers.load(source)(x), expected(x))


def test_load_bytes_errors_name_the_source():
    with pytest.raises(ModelFileError, match="<7 bytes>: not a fastlayers model file"):
        fastlayers.load(b"garbage")
    with pytest.raises(ModelFileError, match="binary mode"):
        fastlayers.load(io.StringIO("text"))
    with pytest.raises(ModelFileError, match="expected a path"):
        fastlayers.load(42)


def test_onnx_sniffed_without_its_suffix(tmp_path):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [weight],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    (tmp_path / "model.bin.v2").write_bytes(data)
    x = np.ones((1, 3), np.float32)
    for source in (tmp_path / "model.bin.v2", data):
        np.testing.assert_array_equal(fastlayers.load(source)(x), x @ np.arange(6.0).reshape(3, 2))


# ------------------------------------------------------------------------------------ limits
def test_limits_have_environment_overrides():
    code = (
        "import fastlayers; o = fastlayers.LoadOptions(); "
        "print(o.max_config_bytes, o.max_json_depth, o.max_layers, o.max_compression_ratio, "
        "o.max_positions)"
    )
    env = dict(
        os.environ,
        FASTLAYERS_MAX_CONFIG_BYTES="1_000",
        FASTLAYERS_MAX_JSON_DEPTH="7",
        FASTLAYERS_MAX_LAYERS="0x10",
        FASTLAYERS_MAX_COMPRESSION_RATIO="3",
        FASTLAYERS_MAX_POSITIONS="99",
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    ).stdout.split()
    assert out == ["1000", "7", "16", "3", "99"]


def test_config_limits_apply_and_can_be_raised(tmp_path):
    def refused_with(path, variable, **fields):
        with pytest.raises(ModelFileError, match=variable):
            fastlayers.load(path, options=fastlayers.LoadOptions(**fields))

    refused_with(SEEDS / "mlp.keras", "FASTLAYERS_MAX_CONFIG_BYTES", max_config_bytes=100)
    refused_with(MLP, "FASTLAYERS_MAX_LAYERS", max_layers=3)
    refused_with(SEEDS / "mlp.h5", "FASTLAYERS_MAX_JSON_DEPTH", max_json_depth=4)
    fastlayers.load(SEEDS / "mlp.h5", options=fastlayers.LoadOptions(max_layers=100))
    fastlayers.load(SEEDS / "mlp.h5")  # the process's limits are untouched


def test_positional_encoding_table_bounded(tmp_path):
    model = fastlayers.Sequential([fastlayers.Input((4, 8)), L.PositionalEncoding(max_length=16)])
    model.save(tmp_path / "pe.flm")
    members = dict(zip_members((tmp_path / "pe.flm").read_bytes()))
    header = json.loads(bytes(np.load(io.BytesIO(members["__fastlayers__.npy"]))))
    header["model"]["config"]["layers"][0]["config"]["max_length"] = 10**9
    members["__fastlayers__.npy"] = header_member(header)
    refused(write_native(tmp_path / "pe.flm", members), ModelFileError, "FASTLAYERS_MAX_POSITIONS")


def test_no_warm_up_for_activations_far_above_the_weights(tmp_path):
    """A RepeatVector sized to 10**8 from a tiny file loads (it is a valid model) but is not
    run at load: the warm-up would allocate 3 GB."""
    model = fastlayers.Sequential([fastlayers.Input((8,)), L.RepeatVector(10**8)])
    model.save(tmp_path / "rep.flm")
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = fastlayers.load(tmp_path / "rep.flm")
    assert loaded.output_shape == (None, 10**8, 8)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB


def test_errors_are_fastlayers_errors_for_every_seed_truncation(tmp_path):
    """Every prefix length class of every seed (a quick sweep beside the fuzz suite)."""
    for seed in [MLP, *sorted(SEEDS.glob("*.keras")), *sorted(SEEDS.glob("*.h5"))]:
        data = seed.read_bytes()
        for cut in (0, 1, 8, 64, len(data) // 3, len(data) - 1):
            path = tmp_path / f"cut{seed.suffix}"
            path.write_bytes(data[:cut])
            with pytest.raises(FastlayersError):
                fastlayers.load(path)


def test_npy_dtype_string_never_reaches_numpys_parser(tmp_path):
    """Found by the long fuzz run: a descr of ',f4' made np.dtype raise SyntaxError (numpy
    parses comma strings with literal_eval)."""
    members = native_members()
    key = next(k for k in members if k.endswith("bias.npy"))
    members[key] = members[key].replace(b"'<f4'", b"',f4'")
    refused(write_native(tmp_path / "descr.flm", members), ModelFileError, "plain numeric dtype")


def test_long_sequence_attention_loads_without_a_warm_up(tmp_path):
    """Found by the long fuzz run: a few-KB .keras declaring 10**6 time steps through
    MultiHeadAttention made the warm-up inside load run for hours (O(T^2) work)."""
    config = keras_config("seq")
    config["config"]["layers"][0]["config"]["batch_shape"] = [None, 10**6]
    entries = keras_entries("seq")
    entries["config.json"] = json.dumps(config).encode()
    start = time.perf_counter()
    model = fastlayers.load(write_keras(tmp_path / "long.keras", entries))
    assert time.perf_counter() - start < 10
    assert model.input_shape == (None, 10**6)


def test_repeated_attention_axes_refused(tmp_path):
    """Found by the long fuzz run: attention_axes [1, 1] built, then every call raised numpy's
    ValueError ("axes don't match array")."""
    config = keras_config("seq")
    layer = next(e for e in config["config"]["layers"] if e["class_name"] == "MultiHeadAttention")
    layer["config"]["attention_axes"] = [1, 1]
    entries = keras_entries("seq")
    entries["config.json"] = json.dumps(config).encode()
    refused(write_keras(tmp_path / "axes.keras", entries), ModelFileError, "distinct axes")


def test_graph_sizes_checked_at_load(tmp_path):
    """Found by the long fuzz run: an Input of shape (-5,) (numpy's ValueError in the warm-up)
    and a padding of 2**31 - 1 on each side (an output of 2**32 x 2**32: numpy's "array is too
    big" at the first call) loaded."""
    config = keras_config("seq")
    config["config"]["layers"][0]["config"]["batch_shape"] = [None, -5]
    entries = keras_entries("seq")
    entries["config.json"] = json.dumps(config).encode()
    refused(write_keras(tmp_path / "neg.keras", entries), ModelFileError, "'batch_shape'")
    model = fastlayers.Sequential([fastlayers.Input((4, 4, 1)), L.Conv2D(2, 1, name="conv")])
    model.save(tmp_path / "pad.flm")
    members = dict(zip_members((tmp_path / "pad.flm").read_bytes()))
    header = json.loads(bytes(np.load(io.BytesIO(members["__fastlayers__.npy"]))))
    big = 2**31 - 1
    header["model"]["config"]["layers"][0]["config"]["padding"] = [[big, big], [big, big]]
    members["__fastlayers__.npy"] = header_member(header)
    refused(write_native(tmp_path / "pad.flm", members), ModelFileError, "gives an output of shape")


def test_model_failing_on_zeros_is_refused_at_load(tmp_path):
    """Found by the long fuzz run: a Rescaling scale of the wrong length built, and every call
    raised numpy's broadcasting ValueError; the warm-up at load now reports it."""
    header = json.loads(
        bytes(
            np.load(
                io.BytesIO(
                    dict(zip_members((fastlayers.DEMO_DIR / "digits_lstm.flm").read_bytes()))["__fastlayers__.npy"]
                )
            )
        )
    )
    layer = next(e for e in header["model"]["config"]["layers"] if e["class_name"] == "Rescaling")
    layer["config"]["scale"] = [1.0, 2.0]
    members = dict(zip_members((fastlayers.DEMO_DIR / "digits_lstm.flm").read_bytes()))
    members["__fastlayers__.npy"] = header_member(header)
    refused(write_native(tmp_path / "scale.flm", members), ModelFileError, "fails on zeros")
