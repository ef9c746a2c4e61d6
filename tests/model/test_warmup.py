"""Warm-up at load (``fastlayers/warmup.py``): ``fastlayers.load`` runs a model once on zeros so
that its first call finds its weights packed; it never changes results, never blocks a load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastlayers
from fastlayers import layers
from fastlayers.backends import derived
from fastlayers.model import warmup

from ..conftest import oracle

DATA = Path(fastlayers.__file__).parent / "data"


def _derived_entries():
    return len(derived._cache)


@pytest.mark.parametrize(
    "name, packs", [("digits_mlp", False), ("digits_cnn", True), ("digits_lstm", True), ("digits_transformer", False)]
)
def test_load_warms_up_and_results_do_not_change(name, packs):
    """(The Dense products of one row run unpacked: the MLP packs nothing at batch 1; the
    Transformer's compiled graph holds its Conv1D kernel packed from its import on
    (``Ops.conv_weights``), outside the cache of derived forms.)"""
    derived.clear_derived()
    cold = fastlayers.load(DATA / f"{name}.flm", warm_up=False)
    assert _derived_entries() == 0  # nothing packed before a call
    warm = fastlayers.load(DATA / f"{name}.flm")
    assert (_derived_entries() > 0) == packs
    assert cold.warm_up() is True
    x = np.random.default_rng(0).standard_normal((3, *cold.inputs[0].node.layer.batch_shape[1:]))
    np.testing.assert_array_equal(warm(x.astype(np.float32)), cold(x.astype(np.float32)))


def test_model_warm_up_result():
    m = fastlayers.Sequential([layers.Dense(4)])
    assert m.warm_up() is False  # not built: no input shape yet
    m = fastlayers.Sequential([fastlayers.Input((None, 3)), layers.LSTM(5)])
    assert m.warm_up() is True  # free time axis: FREE_SIZE steps
    big = fastlayers.Sequential([fastlayers.Input((warmup.MAX_ELEMENTS + 1,)), layers.Dense(1)])
    assert big.warm_up() is False  # inputs too large to make


def test_a_model_that_refuses_zeros_still_loads(tmp_path):
    """An input the warm-up cannot satisfy (a Reshape to rows of 3 of 8 free values) leaves
    the model as it is."""
    onnx = oracle("onnx")
    from onnx import TensorProto, helper

    shape = helper.make_tensor("s", TensorProto.INT64, [2], [-1, 3])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[shape],
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = fastlayers.load(path)
    assert m.warm_up() is False
    np.testing.assert_array_equal(m(np.arange(6, dtype=np.float32)[None]), np.arange(6).reshape(2, 3))


def test_zeros_like_inputs():
    arrays = warmup.zeros_like_inputs([((None, 3, None), np.float32), ((2,), np.int64)])
    assert [(a.shape, a.dtype) for a in arrays] == [((1, 3, warmup.FREE_SIZE), np.float32), ((2,), np.int64)]
    assert not any(a.any() for a in arrays)
    assert warmup.zeros_like_inputs([(None, np.float32)]) is None


def test_one_rule_decides_every_warm_up(tmp_path):
    """``warmup.in_proportion``: the largest tensor known before the run (a layer graph's
    largest activation, an ONNX graph's inputs) within PROPORTION_FLOOR elements or within the
    weights' count, and never over MAX_ELEMENTS; a layer graph and an ONNX graph of the same
    sizes get the same answer, at load and from ``warm_up()``."""
    from ..tiny_onnx import dense_model

    floor = warmup.PROPORTION_FLOOR
    assert warmup.in_proportion(floor, 0) and not warmup.in_proportion(floor + 1, 0)
    assert warmup.in_proportion(4 * floor, 4 * floor)
    assert not warmup.in_proportion(warmup.MAX_ELEMENTS + 1, 10 * warmup.MAX_ELEMENTS)
    # a layer graph: 16 inputs repeated into a (rows, 16) activation, 136 weights
    for rows, expected in [(floor // 16, True), (floor // 16 + 1, False)]:
        m = fastlayers.Sequential([fastlayers.Input((16,)), layers.RepeatVector(rows), layers.Dense(8)])
        assert m.warm_up() is expected
    # an ONNX graph with the same 136 weights: its declared inputs are what is known
    for rows, expected in [(floor // 16, True), (floor // 16 + 1, False)]:
        path = dense_model(tmp_path / f"d{rows}.onnx", [1, rows, 16])
        assert fastlayers.load(path, warm_up=False).warm_up() is expected
