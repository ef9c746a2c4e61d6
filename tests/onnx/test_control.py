"""ONNX control flow (If, Loop, Scan) and the indexing operators exporters write, against
onnxruntime: torch exports, hand-built graphs, and the errors of malformed subgraphs."""

import warnings

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError, ModelFileError, UnsupportedError

from ..conftest import assert_close, oracle

F32, I64, BOOL = 1, 7, 9


def _save(tmp_path, name, graph, opset=17):
    onnx = oracle("onnx")
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _ort_run(path, feed):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def _export_scripted(torch, module, args, path, names, dynamic):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            torch.jit.script(module.eval()), args, str(path), dynamo=False, input_names=names, dynamic_axes=dynamic
        )


def test_torch_scripted_data_dependent_if(tmp_path, torch, rng):
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)

        def forward(self, x):
            if bool(x.sum() > 0):
                return torch.relu(self.a(x))
            return torch.tanh(self.b(x)) * 2.0

    path = tmp_path / "gate.onnx"
    _export_scripted(torch, Gate(), (torch.randn(2, 6),), path, ["x"], {"x": {0: "b"}})
    model = fastlayers.load(path)
    assert "If" in model.op_types
    for batch, sign in ((2, 1.0), (2, -1.0), (3, 1.0)):
        x = (np.abs(rng.standard_normal((batch, 6))) * sign).astype(np.float32)
        assert_close(model(x), _ort_run(path, {"x": x})[0])


def test_torch_scripted_loops_and_shape_if(tmp_path, torch, rng):
    """A for loop over the time axis (trip count from Shape), a while loop (constant trip
    count 2**63 - 1 and a condition) and an If on an input dimension."""

    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(5, 5)

        def forward(self, x):
            h = torch.zeros(x.shape[0], 5)
            for t in range(x.shape[1]):
                h = torch.tanh(self.w(x[:, t]) + h)
            k = 0
            while bool(h.sum() < 3.0) and k < 50:
                h = h + 0.5
                k += 1
            if x.shape[1] > 4:
                h = h * 2.0
            return h

    path = tmp_path / "loop.onnx"
    _export_scripted(torch, Recurrent(), (torch.randn(2, 3, 5),), path, ["x"], {"x": {0: "b", 1: "t"}})
    model = fastlayers.load(path)
    assert model.op_types.count("Loop") == 2 and "If" in model.op_types
    for shape in ((2, 3, 5), (1, 7, 5), (3, 5, 5)):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_close(model(x), _ort_run(path, {"x": x})[0])
    # the If's condition comes from the input shape alone: computed once per shape
    cond = next(n.inputs[0] for n in model._nodes if n.op_type == "If")
    assert cond in model._shape_outputs


def _sample_rate_graph(onnx, rng):
    """Like the Silero voice-activity model: an If on a scalar sample-rate input picks the
    8 kHz or 16 kHz branch, each a projection with weights of its own reading the audio of the
    outer graph."""
    h = onnx.helper

    def branch(name, rate_weights, window):
        w = h.make_tensor(f"w{name}", F32, rate_weights.shape, rate_weights.ravel())
        nodes = [
            h.make_node("Reshape", ["audio", f"shape{name}"], [f"frames{name}"]),
            h.make_node("MatMul", [f"frames{name}", f"w{name}"], [f"proj{name}"]),
            h.make_node("ReduceMean", [f"proj{name}"], [f"out{name}"], axes=[1], keepdims=0),
        ]
        shape = h.make_tensor(f"shape{name}", I64, [3], [0, -1, window])
        return h.make_graph(
            nodes, f"rate{name}", [], [h.make_tensor_value_info(f"out{name}", F32, None)], initializer=[w, shape]
        )

    w8 = rng.standard_normal((32, 3)).astype(np.float32)
    w16 = rng.standard_normal((64, 3)).astype(np.float32)
    nodes = [
        h.make_node("Constant", [], ["r16"], value=h.make_tensor("r16", I64, [], [16000])),
        h.make_node("Equal", ["sr", "r16"], ["is16"]),
        h.make_node(
            "If", ["is16"], ["y"], name="by_rate", then_branch=branch("16", w16, 64), else_branch=branch("8", w8, 32)
        ),
    ]
    return h.make_graph(
        nodes,
        "vad",
        [h.make_tensor_value_info("audio", F32, ["b", 512]), h.make_tensor_value_info("sr", I64, [])],
        [h.make_tensor_value_info("y", F32, None)],
    )


def test_if_selects_the_sample_rate_branch(tmp_path, rng):
    onnx = oracle("onnx")
    path = _save(tmp_path, "vad", _sample_rate_graph(onnx, rng))
    model = fastlayers.load(path)
    audio = rng.standard_normal((2, 512)).astype(np.float32)
    for sr in (8000, 16000):
        feed = {"audio": audio, "sr": np.array(sr, np.int64)}
        got, want = model(feed), _ort_run(path, feed)[0]
        assert got.shape == want.shape
        assert_close(got, want)


def test_constant_if_is_replaced_by_its_branch(tmp_path, rng):
    """An If on a constant condition becomes the branch's nodes at load (reading outer values,
    read by the outer graph through the node's output)."""
    onnx = oracle("onnx")
    h = onnx.helper
    then = h.make_graph(
        [h.make_node("Mul", ["x", "t"], ["u"]), h.make_node("Neg", ["u"], ["o"])],
        "then",
        [],
        [h.make_tensor_value_info("o", F32, None)],
    )
    other = h.make_graph([h.make_node("Abs", ["x"], ["o2"])], "else", [], [h.make_tensor_value_info("o2", F32, None)])
    nodes = [
        h.make_node("Relu", ["x"], ["t"]),
        h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        h.make_node("Add", ["y", "t"], ["z"]),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", F32, [2, 3])],
        [h.make_tensor_value_info("z", F32, [2, 3])],
        initializer=[h.make_tensor("c", BOOL, [], [True])],
    )
    path = _save(tmp_path, "const_if", graph)
    model = fastlayers.load(path)
    assert "If" not in model.op_types
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert_close(model(x), _ort_run(path, {"x": x})[0])


def test_scan_directions_and_axes(tmp_path, rng):
    """A Scan with a running-sum state over a reversed scan input on axis 1, and a scan output
    stacked on axis 1 in reverse, reading an outer-scope weight."""
    onnx = oracle("onnx")
    h = onnx.helper
    body = h.make_graph(
        [
            h.make_node("MatMul", ["xt", "w"], ["p"]),
            h.make_node("Add", ["s", "p"], ["s2"]),
            h.make_node("Tanh", ["s2"], ["o"]),
        ],
        "body",
        [h.make_tensor_value_info("s", F32, [2, 4]), h.make_tensor_value_info("xt", F32, [2, 3])],
        [h.make_tensor_value_info("s2", F32, [2, 4]), h.make_tensor_value_info("o", F32, [2, 4])],
    )
    w = rng.standard_normal((3, 4)).astype(np.float32)
    node = h.make_node(
        "Scan",
        ["s0", "x"],
        ["s_end", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[1],
        scan_input_directions=[1],
        scan_output_axes=[1],
        scan_output_directions=[1],
    )
    graph = h.make_graph(
        [node],
        "scan",
        [h.make_tensor_value_info("s0", F32, [2, 4]), h.make_tensor_value_info("x", F32, [2, 5, 3])],
        [h.make_tensor_value_info("s_end", F32, None), h.make_tensor_value_info("ys", F32, None)],
        initializer=[h.make_tensor("w", F32, w.shape, w.ravel())],
    )
    path = _save(tmp_path, "scan", graph)
    feed = {
        "s0": rng.standard_normal((2, 4)).astype(np.float32),
        "x": rng.standard_normal((2, 5, 3)).astype(np.float32),
    }
    for got, want in zip(fastlayers.load(path)(feed), _ort_run(path, feed)):
        assert got.shape == want.shape
        assert_close(got, want)


def _loop_graph(h, trips, body_inputs=None, body_outputs=None, cond_out="c_in"):
    """A Loop adding 1 to a carried value; ``trips``: the trip count initializer (None: none)."""
    body = h.make_graph(
        [h.make_node("Add", ["v_in", "one"], ["v_out"]), h.make_node("Identity", [cond_out], ["c_out"])],
        "body",
        body_inputs
        or [
            h.make_tensor_value_info("i", I64, []),
            h.make_tensor_value_info("c_in", BOOL, []),
            h.make_tensor_value_info("v_in", F32, [1]),
        ],
        body_outputs or [h.make_tensor_value_info("c_out", BOOL, []), h.make_tensor_value_info("v_out", F32, [1])],
    )
    inits = [h.make_tensor("one", F32, [1], [1.0]), h.make_tensor("go", BOOL, [], [True])]
    if trips is not None:
        inits.append(h.make_tensor("m", I64, [], [trips]))
    loop = h.make_node("Loop", ["m" if trips is not None else "", "go", "v0"], ["v"], name="counter", body=body)
    return h.make_graph(
        [loop],
        "loop",
        [h.make_tensor_value_info("v0", F32, [1])],
        [h.make_tensor_value_info("v", F32, [1])],
        initializer=inits,
    )


def test_loop_with_a_constant_trip_count_is_bounded(tmp_path):
    onnx = oracle("onnx")

    path = _save(tmp_path, "count", _loop_graph(onnx.helper, 7))
    model = fastlayers.load(path)
    v0 = np.zeros(1, np.float32)
    assert_close(model(v0), _ort_run(path, {"v0": v0})[0])
    assert not model.warm_up()  # a loop is not run on made-up values at load
    limited = fastlayers.load(path, options=fastlayers.LoadOptions(onnx_max_loop_iterations=5))
    with pytest.raises(InputError, match=r"'counter' \(Loop\).*ran 5 iterations"):
        limited(v0)
    assert_close(model(v0), _ort_run(path, {"v0": v0})[0])  # its own limit, not the other's


def test_loop_that_only_a_constant_condition_ends_is_bounded(tmp_path):
    """No trip count and a body passing its true condition through: the file alone makes it
    loop forever, so it stops at MAX_LOOP_ITERATIONS instead of hanging the call."""
    onnx = oracle("onnx")

    model = fastlayers.load(
        _save(tmp_path, "forever", _loop_graph(onnx.helper, None)),
        options=fastlayers.LoadOptions(onnx_max_loop_iterations=50),
    )
    with pytest.raises(InputError, match=r"'counter' \(Loop\).*ran 50 iterations"):
        model(np.zeros(1, np.float32))


@pytest.mark.parametrize("case", ["undefined", "branch_outputs", "carried", "nested_op"])
def test_malformed_subgraphs_are_refused(tmp_path, case):
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    if case in ("undefined", "branch_outputs", "nested_op"):
        op = "Det" if case == "nested_op" else "Neg"
        then = h.make_graph(
            [h.make_node(op, ["nowhere" if case == "undefined" else "x"], ["o"])], "then", [], [vi("o", F32, None)]
        )
        outs = [vi("o", F32, None)] + ([vi("x", F32, None)] if case == "branch_outputs" else [])
        other = h.make_graph([h.make_node("Abs", ["x"], ["o"])], "else", [], outs)
        graph = h.make_graph(
            [h.make_node("If", ["c"], ["y"], name="choice", then_branch=then, else_branch=other)],
            "g",
            [vi("x", F32, [2]), vi("c", BOOL, [])],
            [vi("y", F32, None)],
        )
    else:  # the body carries two values for the node's one
        graph = _loop_graph(
            h, 3, body_inputs=[vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F32, [1]), vi("w_in", F32, [1])]
        )
    path = _save(tmp_path, case, graph)
    error, pattern = {
        "undefined": (ModelFileError, r"'choice' \(If\): subgraph 'then_branch'.*reads 'nowhere', which no"),
        "branch_outputs": (ModelFileError, r"'choice' \(If\): subgraph 'else_branch' has 0 inputs and 2 outputs"),
        "carried": (ModelFileError, r"'counter' \(Loop\): subgraph 'body' has 4 inputs"),
        "nested_op": (UnsupportedError, r"unsupported ONNX operator\(s\): Det"),
    }[case]
    with pytest.raises(error, match=pattern):
        fastlayers.load(path)


def test_index_values_out_of_range_name_the_node(tmp_path):
    onnx = oracle("onnx")
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("GatherND", ["x", "i"], ["y"], name="pick")],
        "g",
        [h.make_tensor_value_info("x", F32, [2, 3]), h.make_tensor_value_info("i", I64, [1, 2])],
        [h.make_tensor_value_info("y", F32, None)],
    )
    model = fastlayers.load(_save(tmp_path, "gather_nd", graph))
    x = np.zeros((2, 3), np.float32)
    assert model(x, np.array([[1, -1]])) == 0
    with pytest.raises(InputError, match=r"'pick' \(GatherND\).*index 3 is out of range"):
        model(x, np.array([[1, 3]]))


def test_malformed_einsum_equation_is_refused_at_load(tmp_path):
    onnx = oracle("onnx")
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Einsum", ["a", "b"], ["y"], name="contract", equation="ij,jk->iz")],
        "g",
        [h.make_tensor_value_info("a", F32, [2, 3]), h.make_tensor_value_info("b", F32, [3, 4])],
        [h.make_tensor_value_info("y", F32, None)],
    )
    with pytest.raises(ModelFileError, match=r"'contract' \(Einsum\).*output term 'iz'"):
        fastlayers.load(_save(tmp_path, "einsum", graph))


def test_top_k_ties_follow_the_lower_index(tmp_path, rng):
    onnx = oracle("onnx")
    h = onnx.helper
    graph = h.make_graph(
        [
            h.make_node("TopK", ["x", "k"], [f"v{largest}", f"i{largest}"], axis=1, largest=largest)
            for largest in (0, 1)
        ],
        "g",
        [h.make_tensor_value_info("x", I64, [3, 9]), h.make_tensor_value_info("k", I64, [1])],
        [h.make_tensor_value_info(f"{o}{largest}", I64, None) for largest in (0, 1) for o in "vi"],
    )
    path = _save(tmp_path, "topk", graph)
    model = fastlayers.load(path)
    feed = {"x": rng.integers(-2, 2, (3, 9)).astype(np.int64), "k": np.array([5], np.int64)}
    for got, want in zip(model(feed), _ort_run(path, feed)):
        np.testing.assert_array_equal(got, want)


def test_torch_dynamo_attention_mask_gather_nd(tmp_path, torch, rng):
    """A BERT-style block with an attention mask, pooled at each sequence's last unmasked
    token: torch's dynamo exporter writes the pooling as GatherND (and torch.cond as an If)."""
    oracle("onnxscript")

    class Encoder(torch.nn.Module):
        def __init__(self, vocab=40, d=16, heads=2):
            super().__init__()
            self.emb, self.heads = torch.nn.Embedding(vocab, d), heads
            self.qkv, self.norm = torch.nn.Linear(d, 3 * d), torch.nn.LayerNorm(d)

        def forward(self, ids, mask):
            b, t = ids.shape
            x = self.emb(ids)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            att = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + bias, -1)
            x = self.norm(x + (att @ v).transpose(1, 2).reshape(b, t, -1))
            pooled = x[torch.arange(b), mask.sum(1) - 1]
            return torch.cond(mask.sum() > 15, lambda p: p * 2.0, lambda p: torch.tanh(p), (pooled,))

    ids, mask = torch.randint(0, 40, (3, 7)), torch.ones(3, 7, dtype=torch.int64)
    path = tmp_path / "encoder.onnx"
    with warnings.catch_warnings():  # static shapes: a dynamic export takes seconds longer
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder().eval(), (ids, mask), str(path), dynamo=True, verbose=False, input_names=["ids", "mask"]
        )
    model = fastlayers.load(path)
    assert "GatherND" in model.op_types and "If" in model.op_types
    for lengths in ((7, 7, 7), (7, 3, 1)):  # the then and the else branch
        feed = {
            "ids": rng.integers(0, 40, (3, 7)).astype(np.int64),
            "mask": (np.arange(7) < np.array(lengths)[:, None]).astype(np.int64),
        }
        assert_close(model(feed), _ort_run(path, feed)[0])


def test_nested_subgraphs_read_the_outermost_graph(tmp_path, rng):
    """A Loop whose body holds an If whose branches read the main graph's input two scopes up,
    and the body's own iteration number one scope up."""
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    then = h.make_graph([h.make_node("Add", ["v_in", "x"], ["a"])], "then", [], [vi("a", F32, None)])
    other = h.make_graph([h.make_node("Sub", ["v_in", "x"], ["b"])], "else", [], [vi("b", F32, None)])
    body = h.make_graph(
        [
            h.make_node("Mod", ["i", "two"], ["r"]),
            h.make_node("Equal", ["r", "zero"], ["even"]),
            h.make_node("If", ["even"], ["v_out"], then_branch=then, else_branch=other),
            h.make_node("Identity", ["c_in"], ["c_out"]),
            h.make_node("Mul", ["v_out", "x"], ["step"]),
        ],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F32, [3])],
        [vi("c_out", BOOL, []), vi("v_out", F32, [3]), vi("step", F32, [3])],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["m", "", "v0"], ["v", "steps"], body=body)],
        "nested",
        [vi("x", F32, [3]), vi("v0", F32, [3]), vi("m", I64, [])],
        [vi("v", F32, [3]), vi("steps", F32, None)],
        initializer=[h.make_tensor("two", I64, [], [2]), h.make_tensor("zero", I64, [], [0])],
    )
    path = _save(tmp_path, "nested", graph)
    model = fastlayers.load(path)
    for trips in (5, 0):
        feed = {
            "x": rng.standard_normal(3).astype(np.float32),
            "v0": rng.standard_normal(3).astype(np.float32),
            "m": np.array(trips, np.int64),
        }
        for got, want in zip(model(feed), _ort_run(path, feed)):
            assert got.shape == want.shape
            assert_close(got, want)


def test_a_capture_orders_its_producer_first(tmp_path, rng):
    """The If comes first in the file and its branch reads 't', which a later node writes: the
    capture is an input of the If, so the graph is sorted and 't' is kept."""
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    then = h.make_graph([h.make_node("Neg", ["t"], ["a"])], "then", [], [vi("a", F32, None)])
    other = h.make_graph([h.make_node("Abs", ["t"], ["b"])], "else", [], [vi("b", F32, None)])
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other), h.make_node("Relu", ["x"], ["t"])]
    graph = h.make_graph(nodes, "g", [vi("x", F32, [4]), vi("c", BOOL, [])], [vi("y", F32, None)])
    model = fastlayers.load(_save(tmp_path, "order", graph))
    assert model.op_types == ["Relu", "If"]
    x = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(model(x, np.array(True)), -np.maximum(x, 0))
    np.testing.assert_array_equal(model(x, np.array(False)), np.maximum(x, 0))


def test_a_loop_without_trip_count_is_not_run_at_load(tmp_path):
    """Constant inputs everywhere, a condition that stays true: the If (inlined) and its Loop
    would never end if folded; the load leaves the Loop to the calls."""
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("Identity", ["v_in"], ["v_out"])],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, []), vi("v_in", F32, [1])],
        [vi("c_out", BOOL, []), vi("v_out", F32, [1])],
    )
    then = h.make_graph([h.make_node("Loop", ["", "go", "v0"], ["o"], body=body)], "then", [], [vi("o", F32, None)])
    other = h.make_graph([h.make_node("Identity", ["v0"], ["o2"])], "else", [], [vi("o2", F32, None)])
    graph = h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other), h.make_node("Add", ["y", "x"], ["z"])],
        "g",
        [vi("x", F32, [1])],
        [vi("z", F32, None)],
        initializer=[
            h.make_tensor("c", BOOL, [], [True]),
            h.make_tensor("go", BOOL, [], [True]),
            h.make_tensor("v0", F32, [1], [1.0]),
        ],
    )
    assert fastlayers.load(_save(tmp_path, "endless", graph)).op_types == ["Loop", "Add"]  # the If's Identity dropped


def test_branches_compute_from_outer_weights_once_at_load(tmp_path, rng):
    """Branches (one nested in another) that transpose and slice a weight of the outer graph,
    as silero VAD's LSTM branch reorders its gates: the weight becomes a constant of each
    subgraph and what they compute from it alone is folded at load, so a call runs only the
    products; the If nodes no longer read the weight."""
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    w = rng.standard_normal((6, 4)).astype(np.float32)
    inner_then = h.make_graph(
        [h.make_node("Slice", ["wt", "lo", "hi", "ax"], ["ws"]), h.make_node("MatMul", ["x", "ws"], ["p"])],
        "inner_then",
        [],
        [vi("p", F32, None)],
        initializer=[
            h.make_tensor("lo", I64, [1], [1]),
            h.make_tensor("hi", I64, [1], [4]),
            h.make_tensor("ax", I64, [1], [1]),
        ],
    )
    inner_else = h.make_graph([h.make_node("Neg", ["x"], ["q"])], "inner_else", [], [vi("q", F32, None)])
    then = h.make_graph(
        [
            h.make_node("Transpose", ["w"], ["wt"]),
            h.make_node("If", ["c2"], ["r"], then_branch=inner_then, else_branch=inner_else),
        ],
        "then",
        [],
        [vi("r", F32, None)],
    )
    other = h.make_graph([h.make_node("Abs", ["x"], ["s"])], "else", [], [vi("s", F32, None)])
    graph = h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g",
        [vi("x", F32, [2, 4]), vi("c", BOOL, []), vi("c2", BOOL, [])],
        [vi("y", F32, None)],
        initializer=[h.make_tensor("w", F32, w.shape, w.ravel())],
    )
    path = _save(tmp_path, "weights", graph)
    model = fastlayers.load(path)
    (outer,) = [n for n in model._nodes if n.op_type == "If"]
    assert "w" not in outer.inputs
    then_nodes = outer.attrs["then_branch"].model._nodes
    assert [n.op_type for n in then_nodes] == ["If"]  # the Transpose folded at load
    (inner,) = then_nodes
    # the Slice folded too, and the MatMul on a constant weight optimized as in a graph
    assert [n.op_type for n in inner.attrs["then_branch"].model._nodes] == ["FusedDense"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for c, c2 in ((True, True), (True, False), (False, True)):
        feed = {"x": x, "c": np.array(c), "c2": np.array(c2)}
        assert_close(model(feed), _ort_run(path, feed)[0])


def test_branch_bodies_are_optimized_as_graphs(tmp_path, rng):
    """A model that is one If (silero VAD's on its sample rate): its branches' Conv -> Relu and
    MatMul + Add -> Sigmoid on outer weights run fused, as they would in the graph itself, a
    Loop body's too; a Cast in a branch of a value whose type the branch cannot know stays.
    Outputs equal onnxruntime's on both branches."""
    onnx = oracle("onnx")
    h = onnx.helper
    vi = h.make_tensor_value_info
    k = rng.standard_normal((4, 3, 3)).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    then = h.make_graph(
        [
            h.make_node("Conv", ["x", "k"], ["cv"], pads=[1, 1]),
            h.make_node("Relu", ["cv"], ["r"]),
            h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
            h.make_node("MatMul", ["t", "w"], ["m"]),
            h.make_node("Add", ["m", "b"], ["a"]),
            h.make_node("Sigmoid", ["a"], ["s"]),
            h.make_node("Cast", ["n"], ["nf"], to=F32),
            h.make_node("Mul", ["s", "nf"], ["y_then"]),
        ],
        "then",
        [],
        [vi("y_then", F32, None)],
    )
    body = h.make_graph(
        [
            h.make_node("Conv", ["xc", "k"], ["bc"], pads=[1, 1]),
            h.make_node("Relu", ["bc"], ["br"]),
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Identity", ["xc"], ["xc_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", BOOL, []), vi("xc", F32, None)],
        [vi("cond_out", BOOL, []), vi("xc_out", F32, None), vi("br", F32, None)],
    )
    other = h.make_graph(
        [
            h.make_node("Loop", ["trips", "", "x"], ["xl", "ys"], body=body),
            h.make_node("ReduceSum", ["ys"], ["y_else"], keepdims=0),
        ],
        "else",
        [],
        [vi("y_else", F32, None)],
        initializer=[h.make_tensor("trips", I64, [], [2])],
    )
    graph = h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g",
        [vi("x", F32, [2, 3, 4]), vi("c", BOOL, []), vi("n", I64, [])],
        [vi("y", F32, None)],
        initializer=[
            h.make_tensor("k", F32, (4, 3, 3), k.ravel()),
            h.make_tensor("w", F32, w.shape, w.ravel()),
            h.make_tensor("b", F32, b.shape, b.ravel()),
        ],
    )
    path = _save(tmp_path, "fused_branches", graph)
    model = fastlayers.load(path)
    (node,) = [n for n in model._nodes if n.op_type == "If"]
    then_ops = [n.op_type for n in node.attrs["then_branch"].model._nodes]
    assert "Relu" not in then_ops and "Sigmoid" not in then_ops and "Cast" in then_ops
    assert then_ops.count("FusedConv") == 1 and then_ops.count("FusedDense") == 1
    (loop,) = [n for n in node.attrs["else_branch"].model._nodes if n.op_type == "Loop"]
    assert [n.op_type for n in loop.attrs["body"].model._nodes if n.op_type != "Identity"] == ["FusedConv"]
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c), "n": np.array(3, np.int64)}
        assert_close(model(feed), _ort_run(path, feed)[0], rtol=1e-5, atol=1e-5)


def test_if_with_pass_through_branches(tmp_path, rng):
    """Branches that only pass outer values on (Identity chains, as TorchScript exports keep a
    value as it is) return those values; a branch that computes runs its nodes. The condition
    comes from the input, so the If stays."""
    onnx = oracle("onnx")
    h = onnx.helper
    then = h.make_graph(
        [
            h.make_node("Identity", ["t"], ["a"]),
            h.make_node("Identity", ["a"], ["o"]),
            h.make_node("Identity", ["x"], ["p"]),
        ],
        "then",
        [],
        [h.make_tensor_value_info(n, F32, None) for n in "op"],
    )
    other = h.make_graph(
        [h.make_node("Neg", ["t"], ["o2"]), h.make_node("Identity", ["t"], ["p2"])],
        "else",
        [],
        [h.make_tensor_value_info(n, F32, None) for n in ("o2", "p2")],
    )
    nodes = [
        h.make_node("Relu", ["x"], ["t"]),
        h.make_node("If", ["c"], ["y", "w"], then_branch=then, else_branch=other),
        h.make_node("Add", ["y", "w"], ["z"]),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", F32, [2, 3]), h.make_tensor_value_info("c", BOOL, [])],
        [h.make_tensor_value_info("z", F32, [2, 3])],
    )
    path = _save(tmp_path, "pass_if", graph)
    model = fastlayers.load(path)
    assert "If" in model.op_types
    body = next(n.attrs for n in model._nodes if n.op_type == "If")
    assert body["then_branch"].forwarded is not None and body["else_branch"].forwarded is None
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for c in (True, False, True):
        feed = {"x": x, "c": np.array(c)}
        assert_close(model(feed), _ort_run(path, feed)[0], rtol=0, atol=0)
