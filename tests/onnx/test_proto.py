"""The ONNX file reader (fastlayers/onnx/proto.py) against the onnx package's own parser, and
its answers to damaged and hostile files."""

import numpy as np
import pytest

import fastlayers
from fastlayers import limits
from fastlayers.errors import FastlayersError, ModelFileError, UnsupportedError
from fastlayers.io.onnx import from_proto
from fastlayers.onnx import proto as onnx_proto

from ..conftest import oracle

# TensorProto data types the reader returns, with the numpy dtype of test values
DTYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


@pytest.fixture(scope="module")
def onnx():
    return oracle("onnx")


def _values(dtype, shape, rng):
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _identity_model(onnx, initializers, attrs=None, nodes=None):
    """A graph y = Identity(x) (plus ``nodes``) carrying ``initializers`` and a node with ``attrs``."""
    from onnx import TensorProto, helper

    nodes = list(nodes or []) + [helper.make_node("Identity", ["x"], ["y"], name="id", **(attrs or {}))]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "typed_fields"])
@pytest.mark.parametrize("shape", [(), (1,), (3, 5), (2, 1, 7)], ids=str)
def test_tensors_match_numpy_helper(onnx, raw, shape):
    """Every supported element type, as raw_data and as the typed fields, scalars and odd sizes."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(len(shape))
    tensors = []
    for code, dtype in DTYPES.items():
        v = _values(dtype, shape, rng)
        if raw:
            tensors.append(numpy_helper.from_array(v, f"t{code}"))
        else:
            vals = v.view(np.uint16) if dtype == np.float16 else v
            tensors.append(helper.make_tensor(f"t{code}", code, shape, vals.reshape(-1).tolist()))
    model = _identity_model(onnx, tensors)
    got = onnx_proto.parse_model(bytearray(model.SerializeToString())).graph.initializers
    for t in tensors:
        want = numpy_helper.to_array(t)
        assert got[t.name].dtype == want.dtype and got[t.name].shape == want.shape, t.name
        np.testing.assert_array_equal(got[t.name], want, err_msg=t.name)
        assert got[t.name].flags.aligned and got[t.name].flags.writeable, t.name


def test_attributes_match_onnx_helper(onnx):
    from onnx import numpy_helper

    t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "t")
    attrs = {
        "f": 0.25,
        "i": -7,
        "s": "text",
        "t": t,
        "fs": [1.5, -2.0],
        "is": [3, -1, 2**40],
        "ss": ["a", "bc"],
        "big": 2**62,
    }
    model = _identity_model(onnx, [], attrs)
    node = onnx_proto.parse_model(model.SerializeToString()).graph.nodes[0]
    assert node.op_type == "Identity" and node.name == "id" and node.inputs == ["x"]
    np.testing.assert_array_equal(node.attrs.pop("t"), numpy_helper.to_array(t))
    attrs.pop("t")
    assert node.attrs == attrs


def test_graph_fields(onnx):
    from onnx import numpy_helper

    model = _identity_model(onnx, [numpy_helper.from_array(np.ones(3, np.float32), "w")])
    m = onnx_proto.parse_model(model.SerializeToString())
    assert m.opsets == {"": 17} and m.ir_version == model.ir_version and m.graph.name == "g"
    assert [(v.name, v.elem_type, v.shape) for v in m.graph.inputs] == [("x", 1, ["n", 3])]
    assert [v.name for v in m.graph.outputs] == ["y"] and list(m.graph.initializers) == ["w"]


def test_raw_weights_are_views_of_the_file_bytes(onnx, tmp_path):
    """Aligned raw_data tensors are not copied: they view the buffer the file was read into."""
    from onnx import numpy_helper

    big = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    model = _identity_model(onnx, [numpy_helper.from_array(big, "w")])
    data = bytearray(model.SerializeToString())
    w = onnx_proto.parse_model(data).graph.initializers["w"]
    np.testing.assert_array_equal(w, big)
    if w.ctypes.data % 4 == 0 and w.base is not None:
        base = w
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert base is data or np.shares_memory(w, np.frombuffer(data, np.uint8))


def _many_tensors_model(onnx, rng):
    """A model whose raw_data tensors (some misaligned, some across several pages, some
    smaller than a page) fill a file of more than ``MAPPED_READ_BYTES``."""
    from onnx import numpy_helper

    sizes = [1, 3, 1000, 1025, 4096, 70_000, 3, 200_000, 5, 65_536, 17]
    arrays = {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}
    arrays["i"] = rng.integers(-9, 9, 4097).astype(np.int64)
    model = _identity_model(onnx, [numpy_helper.from_array(a, k) for k, a in arrays.items()])
    return model, arrays


def test_a_file_read_owns_its_weights_and_hands_back_its_buffer(onnx, tmp_path):
    """``read_model``'s tensors own their memory (no view of the file's buffer, which one small
    surviving constant would otherwise keep alive), and the pages of the mapped buffer under
    each tensor's bytes are handed back once copied, and only those."""
    import mmap

    model, arrays = _many_tensors_model(onnx, np.random.default_rng(3))
    data = model.SerializeToString()
    assert len(data) >= onnx_proto.MAPPED_READ_BYTES
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    got = onnx_proto.read_model(path).graph.initializers
    for name, want in arrays.items():
        np.testing.assert_array_equal(got[name], want)
        base = got[name]
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert isinstance(base, np.ndarray) and base.flags.owndata, name

    with open(path, "rb") as f:
        buf = onnx_proto.read_buffer(f, len(data))
    assert isinstance(buf, mmap.mmap)
    parsed = onnx_proto.parse_model(buf, "m", own=True).graph.initializers
    for name, want in arrays.items():
        np.testing.assert_array_equal(parsed[name], want)
    page = mmap.PAGESIZE
    released = np.zeros(len(data), bool)
    for want in arrays.values():
        raw = want.tobytes()
        start = data.find(raw)
        first, last = -(-start // page) * page, (start + len(raw)) // page * page
        released[first:last] = True
    assert released.any()
    now = np.frombuffer(buf, np.uint8)
    np.testing.assert_array_equal(now[~released], np.frombuffer(data, np.uint8)[~released])
    assert not now[released].any()  # zero pages: handed back
    del now
    buf.close()


def test_a_loaded_model_keeps_no_file_buffer(onnx, tmp_path):
    """A model loaded from a file holds no array viewing the buffer the file was read into:
    only the weights it uses stay in memory."""
    import gc
    import mmap

    model, _ = _many_tensors_model(onnx, np.random.default_rng(4))
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = fastlayers.load(path)
    np.testing.assert_array_equal(loaded(np.ones((2, 3), np.float32)), np.ones((2, 3), np.float32))
    gc.collect()
    assert not [
        o for o in gc.get_objects() if isinstance(o, mmap.mmap) and not o.closed and len(o) == path.stat().st_size
    ]


def test_sparse_initializer(onnx):
    from onnx import TensorProto, helper

    values = helper.make_tensor("s", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    linear = helper.make_tensor("i", TensorProto.INT64, [3], [0, 5, 11])
    coords = helper.make_tensor("i", TensorProto.INT64, [3, 2], [0, 0, 1, 1, 2, 3])
    for indices in (linear, coords):
        model = _identity_model(onnx, [])
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [3, 4]))
        got = onnx_proto.parse_model(model.SerializeToString()).graph.initializers["s"]
        want = np.zeros(12, np.float32)
        want[[0, 5, 11]] = [1, 2, 3]
        np.testing.assert_array_equal(got, want.reshape(3, 4))
    bad = helper.make_tensor("i", TensorProto.INT64, [3], [0, 5, 12])
    model = _identity_model(onnx, [])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, bad, [3, 4]))
    with pytest.raises(ModelFileError, match="'s'"):
        onnx_proto.parse_model(model.SerializeToString())


def _conv_model(onnx):
    """Conv (8 <- 3 channels, 3x3) with a bias: weights big enough to be stored externally."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_external_data(onnx, tmp_path):
    model = _conv_model(onnx)
    x = np.random.default_rng(2).standard_normal((2, 3, 6, 6)).astype(np.float32)
    want = from_proto(model)(x)
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=0
    )
    assert (tmp_path / "m.data").is_file()
    np.testing.assert_array_equal(fastlayers.load(path)(x), want)


@pytest.mark.parametrize("location", ["../secret.data", "/etc/passwd", "sub/../../x"])
def test_external_data_outside_the_model_directory_is_refused(onnx, tmp_path, location):
    model = _conv_model(onnx)
    path = tmp_path / "d" / "m.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    for t in proto.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(ModelFileError, match="not a file beside the model"):
        fastlayers.load(path)


def test_external_data_size_mismatch(onnx, tmp_path):
    model = _conv_model(onnx)
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").write_bytes((tmp_path / "m.data").read_bytes()[:100])
    with pytest.raises(ModelFileError, match="'w'.*ends before"):
        fastlayers.load(path)


def test_raw_data_that_does_not_match_the_dims(onnx, tmp_path):
    from onnx import numpy_helper

    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    t.dims[:] = [2, 4]
    path = tmp_path / "m.onnx"
    path.write_bytes(_identity_model(onnx, [t]).SerializeToString())
    with pytest.raises(ModelFileError, match=r"m\.onnx.*'w'.*\(2, 4\) need 32 bytes.*has 24"):
        fastlayers.load(path)


def test_huge_dims_are_refused_before_allocating(onnx):
    from onnx import TensorProto, helper

    t = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    t.dims[:] = [100000, 100000, 100000]
    with pytest.raises(ModelFileError, match="'w'"):
        onnx_proto.parse_model(_identity_model(onnx, [t]).SerializeToString())


def test_unsupported_element_type_names_the_tensor(onnx):
    from onnx import TensorProto, helper

    t = helper.make_tensor("w", TensorProto.BFLOAT16, [1], [1.0])
    with pytest.raises(UnsupportedError, match="'w'.*BFLOAT16"):
        onnx_proto.parse_model(_identity_model(onnx, [t]).SerializeToString())


def _field(number, payload: bytes) -> bytes:
    """A length-delimited protobuf field (numbers and lengths here stay below 2**14)."""

    def varint(v):
        return bytes([v]) if v < 0x80 else bytes([(v & 0x7F) | 0x80, v >> 7])

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_deeply_nested_subgraphs_are_refused():
    """If nodes nested deeper than limits.ONNX_MAX_NESTING (the wire bytes written here: protobuf itself
    refuses to build them)."""
    graph = _field(1, _field(4, b"Identity"))
    for _ in range(limits.ONNX_MAX_NESTING + 2):
        attr = _field(1, b"then_branch") + b"\xa0\x01\x05" + _field(6, graph)  # type (20) = GRAPH
        graph = _field(1, _field(4, b"If") + _field(5, attr))
    data = _field(7, graph) + _field(8, b"\x10\x11")  # the graph, opset_import version 17
    with pytest.raises(ModelFileError, match="nested more than"):
        onnx_proto.parse_model(data)


def test_truncated_and_mutated_files_raise_fastlayers_errors(onnx, tmp_path):
    """Every truncation point of a small model, and random byte flips: either the model loads
    or a FastlayersError names the file; nothing else escapes."""
    data = _conv_model(onnx).SerializeToString()
    path = tmp_path / "m.onnx"
    for cut in range(0, len(data), 7):
        path.write_bytes(data[:cut])
        with pytest.raises(FastlayersError, match=r"m\.onnx"):
            fastlayers.load(path)
    rng = np.random.default_rng(3)
    for _ in range(300):
        mutated = bytearray(data)
        for pos in rng.integers(0, len(data), 3):
            mutated[pos] = rng.integers(0, 256)
        path.write_bytes(bytes(mutated))
        try:
            fastlayers.load(path)
        except FastlayersError as e:
            assert "m.onnx" in str(e)


def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\xff" * 40)
    with pytest.raises(ModelFileError, match=r"m\.onnx"):
        fastlayers.load(path)


def test_a_process_loading_onnx_imports_neither_onnx_nor_the_layers(onnx, tmp_path):
    """The reader needs no onnx package, and an ONNX model needs no layer module (both cost
    start-up time)."""
    import subprocess
    import sys

    path = tmp_path / "m.onnx"
    onnx.save_model(_conv_model(onnx), str(path))
    code = (
        "import sys, numpy as np, fastlayers\n"
        f"m = fastlayers.load({str(path)!r})\n"
        "m(np.zeros((1, 3, 6, 6), np.float32))\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'onnx'"
        " or n.startswith(('fastlayers.layers', 'fastlayers.model.graph', 'fastlayers.nn'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
