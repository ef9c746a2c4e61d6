"""ONNX import: whole Transformer encoder layers as one FusedEncoderLayer node
(fastlayers/onnx/encoder.py), against onnxruntime on the same files; the cases left unfused."""

import warnings

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import ShapeError

from ..conftest import assert_close, oracle, random_torch_module

D, HEADS, FF = 32, 4, 48


def encoder(torch, masked=False, layers=2, **options):
    """A torch TransformerEncoder of ``layers`` layers with random weights (norms included)."""

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, **options)
            self.enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, x, mask=None):
            return self.enc(x, src_key_padding_mask=mask) if masked else self.enc(x)

    return random_torch_module(torch, Encoder)


def export(torch, module, path, batch_first=True, masked=False, steps=6):
    """TorchScript export (opset 17) with a dynamic batch axis; the length stays ``steps`` (the
    exporter bakes the traced length into the head split's Reshape)."""
    x = torch.randn(2, steps, D) if batch_first else torch.randn(steps, 2, D)
    axes = {"x": {0 if batch_first else 1: "batch"}}
    args, names = (x,), ["x"]
    if masked:
        args, names = (x, torch.zeros(2, steps, dtype=torch.bool)), ["x", "mask"]
        axes["mask"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=names, dynamic_axes=axes, opset_version=17)
    return path


def check_against_onnxruntime(ours, path, rng, batch_first=True, steps=6, batches=(1, 3)):
    """``ours`` against onnxruntime at batch sizes other than the probe's 2."""
    ort = oracle("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for batch in batches:
        x = rng.standard_normal((batch, steps, D) if batch_first else (steps, batch, D)).astype(np.float32)
        want = session.run(None, {"x": x})
        got = ours(x)
        got = got if isinstance(got, list) else [got]
        for name, g, w in zip(names, got, want):
            assert_close(g, w, rtol=1e-4, atol=1e-4, what=f"{name} at batch {batch}")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_torchscript_export_runs_each_layer_as_one_node(
    torch, tmp_path, rng, backend, norm_first, batch_first, activation
):
    """Post- and pre-norm, batch or sequence first, relu and exact gelu: each layer becomes one
    node, equal to onnxruntime at batch sizes the load-time probe did not use."""
    module = encoder(torch, norm_first=norm_first, batch_first=batch_first, activation=activation)
    path = export(torch, module, tmp_path / "enc.onnx", batch_first=batch_first)
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedEncoderLayer"] * 2
    check_against_onnxruntime(ours, path, rng, batch_first)


def test_cloned_layers_pack_their_weights_once(torch, tmp_path, rng, monkeypatch):
    """``nn.TransformerEncoder`` clones its layer: without training the layers' weights are
    equal, and the exporter stores each such initializer once, so the two fused nodes share
    some weight arrays and not others. Each node's packed weights are still made once, not
    again on every call (they were, when the cache kept one entry per shared array)."""
    from fastlayers.backends import cpu

    module = encoder(torch, batch_first=True)
    for layer in module.enc.layers[1:]:
        layer.load_state_dict(module.enc.layers[0].state_dict())
    path = export(torch, module, tmp_path / "clones.onnx")
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedEncoderLayer"] * 2
    packs, real = [], cpu._packed_products
    monkeypatch.setattr(cpu, "_packed_products", lambda *a: packs.append(1) or real(*a))
    x = rng.standard_normal((2, 6, D)).astype(np.float32)
    first = ours(x)
    for _ in range(3):
        np.testing.assert_array_equal(ours(x), first)
    assert len(packs) <= 2
    check_against_onnxruntime(ours, path, rng)


def test_length_one_layers_run_as_one_node(torch, tmp_path, rng, backend):
    path = export(torch, encoder(torch, batch_first=True), tmp_path / "one.onnx", steps=1)
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedEncoderLayer"] * 2
    check_against_onnxruntime(ours, path, rng, steps=1)


def test_length_the_export_baked_in_fails_the_probe(torch, tmp_path, rng):
    """The TorchScript exporter declares a dynamic length but bakes the traced one into the head
    split: the probe (length 3) cannot run it, so nothing is fused, and the model still runs at
    the traced length as onnxruntime does."""
    module = encoder(torch, batch_first=True)
    path = tmp_path / "baked.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.randn(2, 6, D),),
            str(path),
            dynamo=False,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch", 1: "seq"}},
            opset_version=17,
        )
    ours = fastlayers.load(path)
    assert "FusedEncoderLayer" not in ours.op_types
    check_against_onnxruntime(ours, path, rng)


@pytest.mark.parametrize("opset", [18, 23])
def test_dynamo_export_runs_each_layer_as_one_node(torch, tmp_path, rng, opset):
    """The dynamo exporter's spelling: K^T through Reshape / Transpose / Reshape at opset 18, the
    ONNX Attention operator at opset 23."""
    oracle("onnxscript")
    module = encoder(torch, norm_first=True, batch_first=True)
    path = tmp_path / f"dyn{opset}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.randn(2, 6, D),),
            str(path),
            dynamo=True,
            input_names=["x"],
            opset_version=opset,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            verbose=False,
        )
    ours = fastlayers.load(path)
    assert ours.op_types == ["FusedEncoderLayer"] * 2
    check_against_onnxruntime(ours, path, rng)


def test_masked_layers_run_node_by_node(torch, tmp_path, rng):
    """A key-padding mask is an input of the attention node: the layer is not fused (its
    attention still is) and equals onnxruntime, a padded key included."""
    ort = oracle("onnxruntime")
    path = export(torch, encoder(torch, masked=True, batch_first=True), tmp_path / "masked.onnx", masked=True)
    ours = fastlayers.load(path)
    assert "FusedEncoderLayer" not in ours.op_types and "FusedAttention" in ours.op_types
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((3, 6, D)).astype(np.float32)
    mask = np.zeros((3, 6), bool)
    mask[1, 3:] = True
    assert_close(ours(x, mask), session.run(None, {"x": x, "mask": mask})[0], rtol=1e-4, atol=1e-4)


def _edited(path, edit):
    import onnx

    proto = onnx.load(str(path))
    edit(proto)
    onnx.save(proto, str(path))
    return path


def test_layer_computing_something_else_is_left_as_written(torch, tmp_path, rng):
    """q and k swapped (softmax(k q^T) v): the structure matches, the load-time probe does not
    confirm it, and the graph runs node by node."""

    def swap_q_and_k(proto):
        for node in proto.graph.node:
            gathers = [n for n in proto.graph.node if n.op_type == "Gather" and n.input[0] == node.output[0]]
            if node.op_type == "Squeeze" and len(gathers) == 3:  # the q, k, v split
                gathers[0].input[1], gathers[1].input[1] = gathers[1].input[1], gathers[0].input[1]

    path = _edited(export(torch, encoder(torch, batch_first=True), tmp_path / "swapped.onnx"), swap_q_and_k)
    ours = fastlayers.load(path)
    assert "FusedEncoderLayer" not in ours.op_types and ours.op_types.count("FusedAttention") == 2
    check_against_onnxruntime(ours, path, rng)


def test_layer_with_an_intermediate_read_elsewhere_is_left_as_written(torch, tmp_path, rng):
    """The first layer's attention block output is also a graph output: that layer stays node by
    node, the second is fused, and both outputs equal onnxruntime's."""
    from onnx import helper

    def expose_first_residual(proto):
        add = next(n for n in proto.graph.node if n.op_type == "Add")
        proto.graph.output.append(helper.make_empty_tensor_value_info(add.output[0]))

    path = _edited(export(torch, encoder(torch, batch_first=True), tmp_path / "exposed.onnx"), expose_first_residual)
    ours = fastlayers.load(path)
    assert ours.op_types.count("FusedEncoderLayer") == 1 and ours.op_types.count("FusedAttention") == 1
    check_against_onnxruntime(ours, path, rng)


def test_input_of_unknown_rank_leaves_the_layers_as_written(torch, tmp_path, rng):
    """Without the input's rank there is no probe input: nothing is fused, the graph still runs."""

    def forget_shape(proto):
        proto.graph.input[0].type.tensor_type.ClearField("shape")

    path = _edited(export(torch, encoder(torch, batch_first=True), tmp_path / "rankless.onnx"), forget_shape)
    ours = fastlayers.load(path)
    assert "FusedEncoderLayer" not in ours.op_types
    check_against_onnxruntime(ours, path, rng)


def test_probe_inputs_give_each_dimension_name_one_size():
    from fastlayers.onnx.encoder import probe_inputs

    arrays = probe_inputs(
        [
            ("x", np.dtype(np.float32), ["batch", "seq", 8]),
            ("ids", np.dtype(np.int64), ["batch", None, None]),
            ("keep", np.dtype(bool), ["seq"]),
        ]
    )
    assert [a.shape for a in arrays] == [(2, 3, 8), (2, 4, 5), (3,)]
    assert arrays[0].dtype == np.float32 and np.all(arrays[1] == 1) and arrays[2].all()
    assert len(np.unique(arrays[0])) == arrays[0].size and np.abs(arrays[0]).max() <= 1
    assert probe_inputs([("x", np.dtype(np.float32), None)]) is None


def test_fused_node_names_itself_on_a_wrong_input(torch, tmp_path):
    path = export(torch, encoder(torch, batch_first=True, layers=1), tmp_path / "one.onnx")
    ours = fastlayers.load(path)
    node = ours._nodes[0]
    from fastlayers.onnx.ops import OPS

    with pytest.raises(ShapeError, match=f"{node.name}.*width {D}.*got shape \\(2, 3, 5\\)"):
        OPS["FusedEncoderLayer"]([np.zeros((2, 3, 5), np.float32)], node.attrs, 17)
