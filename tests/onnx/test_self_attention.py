"""ONNX import: torch ``MultiheadAttention`` self-attention blocks (q/k/v projection, attention,
output projection) as one FusedSelfAttention node (fastlayers/onnx/encoder.py), against
onnxruntime on the same files; the blocks left unfused (masks, cross-attention, the weights
read)."""

import warnings

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import ShapeError

from ..conftest import assert_close, oracle, random_torch_module

E, HEADS, STEPS = 15, 3, 5  # heads of width 5


def attention(torch, call, batch_first=True, bias=True):
    """``call(mha, *inputs)`` as a module, ``mha`` a MultiheadAttention with random weights."""

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(E, HEADS, bias=bias, batch_first=batch_first)

        def forward(self, *inputs):
            return call(self.mha, *inputs)

    return random_torch_module(torch, Module)


def self_attention(mha, x):
    return mha(x, x, x, need_weights=False)[0]


def export(torch, module, path, feed, batch_first=True, dynamo=False):
    """TorchScript (opset 17, dynamic batch axis) or dynamo (opset 18) export at the named
    arrays of ``feed``."""
    names = list(feed)
    inputs = [torch.from_numpy(a) for a in feed.values()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            oracle("onnxscript")
            torch.onnx.export(
                module, tuple(inputs), str(path), dynamo=True, input_names=names, opset_version=18, verbose=False
            )
        else:
            axes = {n: {0 if batch_first or n == "mask" else 1: "batch"} for n in names}
            torch.onnx.export(
                module, tuple(inputs), str(path), dynamo=False, input_names=names, dynamic_axes=axes, opset_version=17
            )
    return path


def check_against_onnxruntime(ours, path, feeds):
    """``ours`` against onnxruntime on each dict of ``feeds``."""
    ort = oracle("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = session.run(None, feed)
        got = ours(*feed.values())
        got = got if isinstance(got, list) else [got]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-4, atol=1e-4, what=f"at shapes {[a.shape for a in feed.values()]}")


def x_at(rng, batch, batch_first=True):
    shape = (batch, STEPS, E) if batch_first else (STEPS, batch, E)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "batch_first,bias", [(True, True), (False, True), (True, False)], ids=["batch-first", "sequence-first", "no-bias"]
)
def test_torchscript_export_runs_as_one_node(torch, tmp_path, rng, backend, batch_first, bias):
    """Batch or sequence first, with or without projection biases: one node, equal to
    onnxruntime at batch sizes the load-time probe (2) did not use, batch 1 among them."""
    module = attention(torch, self_attention, batch_first, bias)
    path = export(torch, module, tmp_path / "mha.onnx", {"x": x_at(rng, 2, batch_first)}, batch_first)
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedSelfAttention"]
    check_against_onnxruntime(ours, path, [{"x": x_at(rng, b, batch_first)} for b in (1, 3)])


def test_dynamo_export_runs_as_one_node(torch, tmp_path, rng):
    module = attention(torch, self_attention)
    path = export(torch, module, tmp_path / "dyn.onnx", {"x": x_at(rng, 2)}, dynamo=True)
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedSelfAttention"]
    check_against_onnxruntime(ours, path, [{"x": x_at(rng, 2)}])


def test_key_padding_mask_is_not_fused(torch, tmp_path, rng):
    """A key-padding mask is an input of the attention node: the block runs node by node (its
    attention still fused) and equals onnxruntime, padded keys included."""
    module = attention(torch, lambda mha, x, mask: mha(x, x, x, key_padding_mask=mask, need_weights=False)[0])
    x = x_at(rng, 2)
    mask = np.zeros((2, STEPS), bool)
    mask[1, 3:] = True
    path = export(torch, module, tmp_path / "masked.onnx", {"x": x, "mask": mask})
    ours = fastlayers.load(path)
    assert "FusedSelfAttention" not in ours.op_types and "FusedAttention" in ours.op_types
    check_against_onnxruntime(ours, path, [{"x": x, "mask": mask}])


@pytest.mark.parametrize("case", ["cross-attention", "weights-read"])
def test_blocks_that_are_not_self_attention_alone_are_not_fused(torch, tmp_path, rng, case):
    """Keys and values from another input than the queries, or the averaged attention weights
    a second output: no FusedSelfAttention, results equal onnxruntime's."""
    if case == "cross-attention":
        module = attention(torch, lambda mha, x, y: mha(x, y, y, need_weights=False)[0])
        feed = {"x": x_at(rng, 2), "y": x_at(rng, 2)}
    else:
        module = attention(torch, lambda mha, x: mha(x, x, x, need_weights=True))
        feed = {"x": x_at(rng, 2)}
    path = export(torch, module, tmp_path / "other.onnx", feed)
    ours = fastlayers.load(path)
    assert "FusedSelfAttention" not in ours.op_types
    check_against_onnxruntime(ours, path, [feed])


def test_fused_node_names_itself_on_a_wrong_input(torch, tmp_path, rng):
    module = attention(torch, self_attention)
    path = export(torch, module, tmp_path / "mha.onnx", {"x": x_at(rng, 2)})
    node = fastlayers.load(path)._nodes[0]
    from fastlayers.onnx.ops import OPS

    with pytest.raises(ShapeError, match=f"{node.name}.*width {E}.*got shape \\(2, 3, 4\\)"):
        OPS["FusedSelfAttention"]([np.zeros((2, 3, 4), np.float32)], node.attrs, 17)
