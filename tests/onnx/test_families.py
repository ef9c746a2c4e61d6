"""ONNX operators are one record each (``records.Record``), in the family that implements them,
and ``ops.RECORDS`` is made of the families ``ops.FAMILIES`` lists: no family's record silently
replaces another's, and the plan's tables are views of the records."""

import numpy as np
import pytest

from fastlayers.errors import ModelFileError, UnsupportedError
from fastlayers.onnx import check, ops
from fastlayers.onnx.ops import BINDERS, FAMILIES, NODE_CACHES, OPS, RECORDS
from fastlayers.onnx.proto import NodeProto
from fastlayers.onnx.records import Context, Family, Op

INTERNAL = {
    "FusedAdd",
    "FusedDense",
    "FusedDenseChain",
    "FusedElementwise",
    "OneHotDense",
    "FusedConv",
    "EmbeddingRNN",
    "EmbeddingGRU",
    "EmbeddingLSTM",
    "EmbeddingMaskedRNN",
    "EmbeddingMaskedGRU",
    "EmbeddingMaskedLSTM",
    "FusedAttention",
    "FusedEncoderLayer",
    "FusedSelfAttention",
    "FusedLSTMCell",
    "FusedConvInteger",
    "FusedQuantizeDequantize",
}


def test_every_operator_is_in_exactly_one_family():
    family_of: dict[str, str] = {}
    for family in FAMILIES:
        for key, record in family.records.items():
            assert key not in family_of, f"{key!r} is in both {family_of[key]!r} and {family.name!r}"
            assert record.key == key
            family_of[key] = family.name
    assert set(family_of) == set(RECORDS) == set(OPS)
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_tables_are_views_of_the_records():
    assert all(OPS[k] is r.run for k, r in RECORDS.items())
    assert BINDERS == {k: r.bind for k, r in RECORDS.items() if r.bind is not None}
    assert NODE_CACHES == {k: r.caches for k, r in RECORDS.items() if r.caches}
    assert {"Slice", "Pad", "Gather", "Squeeze", "Unsqueeze", "ReduceMean"} <= set(BINDERS)
    assert NODE_CACHES["FusedConv"] == ("_windows", "_plans")


def test_only_fastlayers_own_operators_lack_node_checks():
    """A record without node checks is an operator fastlayers' fusions make: a file may not
    name it (``check.known``), and every operator a file may name has its checks."""
    internal = {k for k, r in RECORDS.items() if r.schema is None}
    assert internal == INTERNAL
    assert all(isinstance(r.schema, Op) for k, r in RECORDS.items() if k not in internal)
    assert not any(check.known(k) for k in internal)
    assert check.known("Conv") and check.known("com.microsoft::QLinearAdd")
    assert not check.known("NoSuchOp")


def test_a_file_cannot_name_an_internal_operator(tmp_path):
    onnx = pytest.importorskip("onnx")
    import fastlayers

    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("FusedConv", ["x", "w"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 3, 3])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [h.make_tensor("w", onnx.TensorProto.FLOAT, [1, 1, 1, 1], [1.0])],
    )
    path = tmp_path / "internal.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    with pytest.raises(UnsupportedError, match="FusedConv"):
        fastlayers.load(path)


def test_a_record_checks_its_nodes():
    """``check.check_node`` applies the record's rules: input counts, attribute types and
    ranges, required attributes and the family's cross-check."""
    ctx = Context("f.onnx", 17, {"w": np.zeros((3, 3, 3, 3), np.float32)})
    node = NodeProto("Conv", "", "c", ["x", "w"], ["y"], {"group": 2})
    with pytest.raises(ModelFileError, match="group 2 does not divide"):
        check.check_node(node, ctx)
    with pytest.raises(ModelFileError, match="has 1 inputs, expected 2 to 3"):
        check.check_node(NodeProto("Conv", "", "c", ["x"], ["y"], {}), ctx)
    with pytest.raises(ModelFileError, match="required attribute 'axis'"):
        check.check_node(NodeProto("Concat", "", "c", ["x"], ["y"], {}), ctx)
    assert check.check_node(NodeProto("Softmax", "", "s", ["x"], ["y"], {"axis": 1, "other": 3}), ctx) == {"axis": 1}


def test_family_refuses_a_key_twice_and_checks_on_internal_operators():
    family = Family("test")
    family.add("A", lambda i, a, o: i)
    with pytest.raises(ValueError, match="recorded twice"):
        family.add("A", lambda i, a, o: i)
    with pytest.raises(TypeError, match="no node checks"):
        family.add("B", lambda i, a, o: i, internal=True, inputs=(2, 2))
    family.add("C", lambda i, a, o: i, domain="com.example", inputs=(2, 2))
    assert family.records["com.example::C"].schema.inputs == (2, 2)
    assert ops.bind("Relu", ["x"], {}, 17) is None
