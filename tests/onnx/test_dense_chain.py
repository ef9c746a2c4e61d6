"""Consecutive dense nodes run as one FusedDenseChain (``fusion.fuse_dense_chains``): one plan
of the backend (``Ops.dense_chain_plan``), one native call on the cpu backend. The chain gives
the bits of its layers run one by one, and onnxruntime's results."""

import numpy as np
import pytest

import fastlayers
from fastlayers.backends import get_ops
from fastlayers.backends.cpu import gemm
from fastlayers.backends.reference import ReferenceOps
from fastlayers.native import CODES, _core

from ..conftest import assert_close, in_threads, oracle
from .test_import import make_graph

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

#: (in, out, bias, activation node) per layer of the test MLP.
LAYERS = [(16, 33, True, "Relu"), (33, 7, False, "Tanh"), (7, 64, True, None), (64, 5, True, "LeakyRelu")]


def _mlp(path, rng, layers=LAYERS, batch="n", extra_outputs=(), extra_readers=()):
    """An MLP of MatMul (+ Add bias) (+ activation) per layer; ``extra_outputs``: layer indices
    whose output is also a graph output; ``extra_readers``: ones whose output a Neg also reads."""
    nodes, inits, prev, ends = [], [], "x", []
    for i, (k, n, bias, act) in enumerate(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = f"m{i}"
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}"))
            nodes.append(helper.make_node("Add", [out, f"b{i}"], [f"a{i}"]))
            out = f"a{i}"
        if act:
            kw = {"alpha": 0.2} if act == "LeakyRelu" else {}
            nodes.append(helper.make_node(act, [out], [f"y{i}"], **kw))
            out = f"y{i}"
        prev = out
        ends.append(out)
    outputs = [prev, *(ends[i] for i in extra_outputs)]
    for i in extra_readers:
        nodes.append(helper.make_node("Neg", [ends[i]], [f"neg{i}"]))
        outputs.append(f"neg{i}")
    model = make_graph(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, layers[0][0]])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    onnx.save(model, str(path))
    return path


def _session(path):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_an_mlp_is_one_chain_with_its_layers_bits(tmp_path, rng, backend):
    path = _mlp(tmp_path / "mlp.onnx", rng)
    model = fastlayers.load(path)
    assert model.op_types == ["FusedDenseChain"]
    layered = fastlayers.load(path, options=fastlayers.LoadOptions(optimize=False))
    for shape in [(1, 16), (3, 16), (200, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = model(x)
        assert_close(got, _session(path).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert_close(got, layered(x), rtol=1e-5, atol=1e-6)


def test_the_chain_gives_the_bits_of_its_layers_one_by_one(tmp_path, rng, isa):
    """Against the same layers as separate FusedDense nodes (the chain pass undone), bit for
    bit, on every ISA path, at batch 1, a few rows and enough rows for packed weights."""
    from fastlayers.onnx import fusion

    path = _mlp(tmp_path / "mlp.onnx", rng)
    chained = fastlayers.load(path)
    original = fusion.fuse_dense_chains
    try:
        fusion.fuse_dense_chains = lambda nodes, constants, outputs: nodes
        separate = fastlayers.load(path)
    finally:
        fusion.fuse_dense_chains = original
    assert separate.op_types == ["FusedDense"] * 4
    for rows in (1, 5, 300):
        x = rng.standard_normal((rows, 16)).astype(np.float32)
        np.testing.assert_array_equal(chained(x), separate(x))


def test_values_read_elsewhere_end_the_chain(tmp_path, rng):
    """A layer's output that is a graph output, or that another node reads, is computed as it
    is: the chain stops before it and a new one starts after it."""
    path = _mlp(tmp_path / "out.onnx", rng, extra_outputs=(1,))
    model = fastlayers.load(path)
    assert model.op_types == ["FusedDenseChain", "FusedDenseChain"]
    x = rng.standard_normal((4, 16)).astype(np.float32)
    for got, want in zip(model.run(None, {"x": x}), _session(path).run(None, {"x": x})):
        assert_close(got, want, rtol=1e-5, atol=1e-5)
    path = _mlp(tmp_path / "read.onnx", rng, extra_readers=(2,))
    model = fastlayers.load(path)
    # the reader (a Neg) is a one-node elementwise program
    assert sorted(model.op_types) == ["FusedDense", "FusedDenseChain", "FusedElementwise"]
    for got, want in zip(model.run(None, {"x": x}), _session(path).run(None, {"x": x})):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_chain_in_the_profile_and_from_many_threads(tmp_path, rng):
    path = _mlp(tmp_path / "mlp.onnx", rng)
    model = fastlayers.load(path)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    want = model(x)
    (step,) = model.profile(x, repeats=2).steps
    assert (step.op_type, step.fused, step.kernel) == ("FusedDenseChain", "4 dense", "cpu.dense_chain_plan")
    results = []

    def calls(_):
        for _ in range(50):
            results.append(model(x))

    in_threads(calls, 4)
    assert len(results) == 200
    for y in results:
        np.testing.assert_array_equal(y, want)


# ------------------------------------------------------------------------- the backend primitive
def _layers(rng, widths, acts, biases):
    return [
        (
            (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32) if bias else None,
            act,
            0.1,
        )
        for k, n, act, bias in zip(widths[:-1], widths[1:], acts, biases)
    ]


@pytest.mark.parametrize("widths", [(16, 33, 7, 300), (1, 1), (5, 17, 1, 9), (256, 512, 256)])
@pytest.mark.parametrize("rows", [(1,), (3,), (2, 7), (129,)])
@pytest.mark.parametrize("transposed", [False, True], ids=["w_kn", "w_nk.T"])
def test_dense_chain_plan_matches_the_reference(isa, rng, widths, rows, transposed):
    """The native chain on (k, n) weights, or on transposed views of (n, k) ones (torch's
    ``weight.T``, read in place, natively): the reference's values and the backend's dense
    layer by layer bit for bit. (Small products read (k, n) weights unpacked, the transposed
    ones always packed, as ``dense`` does: the two forms round differently there.)"""
    acts = ["relu", "tanh", "leaky_relu", "gelu", "linear", "softmax"][: len(widths) - 1]
    layers = _layers(rng, widths, acts, [True, False, True, True, False][: len(widths) - 1])
    x = rng.standard_normal((*rows, widths[0])).astype(np.float32)
    if transposed:
        plain = get_ops().dense_chain_plan(layers)(x)
        layers = [(np.ascontiguousarray(w.T).T, *rest) for w, *rest in layers]
        codes = [CODES[act] for _, _, act, _ in layers]
        chain = _core.DenseChain([(w, b, c, a) for (w, b, _, a), c in zip(layers, codes)], gemm.packed_weights)
        np.testing.assert_allclose(chain(x), plain, rtol=2e-5, atol=2e-5)  # natively: no ValueError
    got = get_ops().dense_chain_plan(layers)(x)
    want = ReferenceOps().dense_chain_plan(layers)(x)
    assert got.shape == (*rows, widths[-1]) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    step = x
    for w, b, act, alpha in layers:  # the backend's dense layer by layer: the same bits
        step = get_ops().dense(step, w, b, act, alpha)
    np.testing.assert_array_equal(got, step)


def test_dense_chain_plan_takes_its_general_path_outside_the_native_terms(rng):
    ops = get_ops()
    layers = _layers(rng, (8, 6, 4), ["relu", "linear"], [True, True])
    x = rng.standard_normal((5, 8)).astype(np.float32)
    want = ReferenceOps().dense_chain_plan(layers)(x)
    run = ops.dense_chain_plan(layers)
    assert_close(run(x.astype(np.float64)), want, rtol=1e-5, atol=1e-5)  # another type
    assert_close(run(np.repeat(x, 2, axis=1)[:, ::2]), want, rtol=1e-5, atol=1e-5)  # a strided view
    # weights outside the native terms (a strided view, an unknown activation) run layer by layer
    odd = [(np.repeat(layers[0][0], 2, axis=1)[:, ::2], *layers[0][1:]), layers[1]]
    with pytest.raises(ValueError, match="weights must be"):
        _core.DenseChain([(odd[0][0], None, 0, 0.0)], None)
    with pytest.raises(ValueError, match="need a packer"):
        _core.DenseChain([(np.ascontiguousarray(layers[0][0].T).T, None, 0, 0.0)], None)
    assert_close(ops.dense_chain_plan(odd)(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="takes 7 values"):
        _core.DenseChain([(layers[0][0], None, 0, 0.0), (np.zeros((7, 2), np.float32), None, 0, 0.0)], None)
    with pytest.raises(ValueError, match="bias must be"):
        _core.DenseChain([(layers[0][0], np.zeros(5, np.float32), 0, 0.0)], None)
    assert _core.DenseChain([(layers[0][0], None, 0, 0.0)], None)(np.zeros((2, 7), np.float32)) is None
