"""Fuzzing the ONNX and PyTorch readers, and each class of hostile file the readers must refuse.

Seed files are built here (torch.onnx.export(dynamo=False) of small models and onnx.helper
graphs, one of them with If, Loop and Scan subgraphs, indexing and quantized operators; torch.save of small state dicts and nn.Sequential, zip and legacy) and mutated
deterministically (seeded by case index):

- ONNX, byte level (``tests.fuzz.harness.mutate_bytes``) and graph level (``mutate_onnx_graph``:
  attributes, node inputs and outputs, graph input shapes and dims, initializers and their
  dims and types, op types, node order);
- torch, byte level (anywhere in the file, in the zip records, inside ``data.pkl`` re-zipped
  with valid checksums, in legacy files) and pickle-record level (``mutate_pickle_ops``:
  integer, float, string and global arguments, memo references; ``mutate_torch_objects``:
  module attributes, ``_parameters``/``_modules`` tables, shared and deeply nested children,
  strided and retyped tensors, saved by torch).

Every case runs through ``tests/fuzz/harness.py``'s child-process runner (timeout, RLIMIT_AS, peak RSS
within twice the file + 64 MiB): it must load (and, for a model, run on random inputs of its
declared shape, batch 0 included), or fail with a fastlayers error; at load, a
``ModelFileError``/``UnsupportedError`` naming the file. The children run with the ONNX size
limits lowered to 16 MiB (``FASTLAYERS_ONNX_MAX_CREATED_BYTES``, ``FASTLAYERS_ONNX_MAX_FOLD_BYTES``)
so that what a graph may legitimately make stays inside the runner's RSS budget.

``FASTLAYERS_FUZZ_CASES=N`` runs N cases per kind (four kinds) instead of the CI counts (the long
mode: ``FASTLAYERS_FUZZ_CASES=2500 pytest tests/fuzz/test_onnx_torch.py -k fuzzed`` runs 10,000
cases); ``FASTLAYERS_FUZZ_SEED`` changes the seed; ``FASTLAYERS_FUZZ_SAVE=dir`` writes failing
cases there.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickletools
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from ..conftest import oracle
from .harness import check_cases, make_zip, mutate_bytes, mutate_zip_headers, zip_members

#: Cases per kind in CI; FASTLAYERS_FUZZ_CASES overrides.
CI_CASES = {"onnx_bytes": 200, "onnx_graph": 300, "torch_bytes": 175, "torch_records": 200}
SEED = int(os.environ.get("FASTLAYERS_FUZZ_SEED", "27"))
#: The ONNX limits the fuzz children run with (bytes).
CHILD_LIMIT = str(16 << 20)
#: Inputs of the torch module seeds, by the name their files carry.
TORCH_INPUTS = {
    "cnn": ((2, 3, 8, 8), "f"),
    "mlp": ((2, 6), "f"),
    "enc": ((2, 5, 8), "f"),
    "emb": ((2, 5), "i"),
    "tcnn": ((2, 4, 6), "f"),
}


def pick(rng, items):
    """One of ``items`` (any objects), drawn from ``rng``."""
    return items[int(rng.integers(0, len(items)))]


def n_cases(kind: str) -> int:
    return int(os.environ.get("FASTLAYERS_FUZZ_CASES") or CI_CASES[kind])


def check(cases, loader, monkeypatch):
    monkeypatch.setenv("FASTLAYERS_ONNX_MAX_CREATED_BYTES", CHILD_LIMIT)
    monkeypatch.setenv("FASTLAYERS_ONNX_MAX_FOLD_BYTES", CHILD_LIMIT)
    return check_cases(cases, loader)


# ------------------------------------------------------------------------ loaders (children)
def _refused_at_load(path, e):
    from fastlayers.errors import ModelFileError, UnsupportedError

    if not isinstance(e, (ModelFileError, UnsupportedError)):
        raise AssertionError(f"load raised {type(e).__name__}, not ModelFileError or UnsupportedError: {e}") from e
    if Path(path).name not in str(e):
        raise AssertionError(f"the error does not name the file: {type(e).__name__}: {e}") from e


def load_onnx_and_call(path):
    """``fastlayers.load`` (which runs the graph once on zeros), then ``run`` on random inputs
    of the declared shapes (free dimensions 2), and on a batch of 0 where the first dimension is
    free."""
    import fastlayers
    from fastlayers.errors import FastlayersError

    try:
        model = fastlayers.load(path)
    except FastlayersError as e:
        _refused_at_load(path, e)
        raise
    rng = np.random.default_rng(0)
    for batch in (2, 0):
        feed, total, free = {}, 0, False
        args = model.get_inputs()
        shapes = [[d if isinstance(d, int) else (batch if k == 0 else 2) for k, d in enumerate(a.shape)] for a in args]
        for shape in shapes:  # exact: the declared dimensions are the fuzzer's
            count = 1
            for d in shape:
                count *= d
            total += count
        if total > 1 << 16 or any(d > 1 << 16 for shape in shapes for d in shape):
            continue
        for arg, shape in zip(args, shapes):
            free = free or (bool(arg.shape) and not isinstance(arg.shape[0], int))
            kind = arg.type or "tensor(float)"
            if "float" in kind or "double" in kind:
                feed[arg.name] = rng.standard_normal(shape).astype(np.float32)
            elif "bool" in kind:
                feed[arg.name] = rng.random(shape) < 0.5
            else:
                feed[arg.name] = rng.integers(0, 3, shape).astype(np.int64)
        if batch == 0 and not free:
            continue
        try:
            model.run(None, feed)
        except FastlayersError:
            pass
    return None


def load_torch_and_call(path):
    """``fastlayers.load`` of a whole module, then a call on the seed's input (by the file's
    name: ``case-<seed>.pt``), batch 2 and batch 0."""
    import fastlayers
    from fastlayers.errors import FastlayersError

    try:
        module = fastlayers.load(path)
    except FastlayersError as e:
        _refused_at_load(path, e)
        raise
    seed = Path(path).stem.split("-")[-1]
    shape, kind = TORCH_INPUTS.get(seed, ((2, 4), "f"))
    rng = np.random.default_rng(0)
    for batch in (2, 0):
        s = (batch, *shape[1:])
        x = rng.standard_normal(s).astype(np.float32) if kind == "f" else rng.integers(0, 3, s)
        try:
            module(x)
        except FastlayersError:
            pass
    return None


def load_state_dict(path):
    import fastlayers
    from fastlayers.errors import FastlayersError

    try:
        return fastlayers.load_state_dict(path)
    except FastlayersError as e:
        _refused_at_load(path, e)
        raise


def expect_refused(path):
    """The regression cases: the file must be refused, at load, with a ModelFileError or
    UnsupportedError naming it (a success is a finding)."""
    import fastlayers
    from fastlayers.errors import FastlayersError

    load = fastlayers.load_state_dict if "-sd" in Path(path).stem else fastlayers.load
    try:
        load(path)
    except FastlayersError as e:
        _refused_at_load(path, e)
        raise
    raise AssertionError("the hostile file loaded")


# ---------------------------------------------------------------------------------- seeds
def _onnx_export(torch, module, args, **kwargs) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, buf, dynamo=False, **kwargs)
    return buf.getvalue()


def _helper_graphs() -> list[tuple[str, bytes]]:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
        helper.make_node("Concat", ["n1", "flat"], ["target"], axis=0),
        helper.make_node("Pad", ["x", "pads", "pad_value"], ["padded"], mode="constant"),
        helper.make_node("ConvTranspose", ["padded", "wt"], ["up"], strides=[2, 2], group=1),
        helper.make_node("LRN", ["up"], ["lrn"], size=3),
        helper.make_node("Resize", ["lrn", "", "scales"], ["rs"], mode="linear"),
        helper.make_node(
            "AveragePool", ["rs"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1
        ),
        helper.make_node("Split", ["pool", "split"], ["s1", "s2"], axis=1),
        helper.make_node("Slice", ["s1", "starts", "ends", "axes"], ["sl"]),
        helper.make_node("Reshape", ["sl", "target"], ["r"]),
        helper.make_node("ReduceMean", ["r", "one"], ["m"], keepdims=1),
        helper.make_node("ConstantOfShape", ["cshape"], ["c"], value=init("v", np.array([0.5], np.float32))),
        helper.make_node("Expand", ["m", "eshape"], ["e"]),
        helper.make_node("Add", ["e", "c"], ["ec"]),
        helper.make_node("Range", ["r0", "r1", "r2"], ["rng"]),
        helper.make_node("Cast", ["rng"], ["rngf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ec", "rngf"], ["ecr"]),
        helper.make_node("Tile", ["ecr", "reps"], ["t"]),
        helper.make_node("Trilu", ["t"], ["tri"], upper=0),
        helper.make_node("Where", ["cond", "tri", "tri"], ["w"]),
        helper.make_node("Softmax", ["w"], ["y"], axis=-1),
        helper.make_node("Transpose", ["s2"], ["s2t"], perm=[0, 2, 3, 1]),
        helper.make_node("Clip", ["s2t", "lo", "hi"], ["z"]),
    ]
    inits = [
        init("zero", np.array([0], np.int64)),
        init("flat", np.array([-1], np.int64)),
        init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
        init("pad_value", np.array(0.0, np.float32)),
        init("wt", rng.standard_normal((3, 2, 3, 3)).astype(np.float32)),
        init("scales", np.array([1, 1, 0.5, 0.5], np.float32)),
        init("split", np.array([1, 1], np.int64)),
        init("starts", np.array([0], np.int64)),
        init("ends", np.array([3], np.int64)),
        init("axes", np.array([2], np.int64)),
        init("one", np.array([1], np.int64)),
        init("cshape", np.array([1, 4], np.int64)),
        init("eshape", np.array([1, 4], np.int64)),
        init("r0", np.array(0, np.int64)),
        init("r1", np.array(4, np.int64)),
        init("r2", np.array(1, np.int64)),
        init("reps", np.array([2, 1], np.int64)),
        init("cond", np.array([True, False, True, False])),
        init("lo", np.array(-0.5, np.float32)),
        init("hi", np.array(0.5, np.float32)),
    ]
    shapes = helper.make_model(
        helper.make_graph(nodes, "shapes", [x], [y, z], inits),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=9,
    )
    # an older opset: attributes where later opsets take inputs
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4, 5])
    old_nodes = [
        helper.make_node("Unsqueeze", ["a"], ["u"], axes=[1]),
        helper.make_node("Upsample", ["u", "up"], ["us"], mode="nearest"),
        helper.make_node("Squeeze", ["us"], ["sq"], axes=[1]),
        helper.make_node("Slice", ["sq"], ["sl"], starts=[0], ends=[6], axes=[2]),
        helper.make_node("Pad", ["sl"], ["pd"], pads=[0, 0, 1, 0, 0, 1], mode="reflect"),
        helper.make_node("MaxPool", ["pd"], ["mp"], kernel_shape=[2], strides=[1]),
        helper.make_node("Conv", ["mp", "w1"], ["cv"], group=2, dilations=[2], pads=[1, 1]),
        helper.make_node("Gemm", ["flat_w", "g"], ["gm"], transB=1, alpha=0.5),
        helper.make_node("Flatten", ["cv"], ["fl"], axis=1),
        helper.make_node("LSTM", ["lx", "lw", "lr", "lb"], ["ly", "lh"], hidden_size=3, direction="bidirectional"),
        helper.make_node("ReduceSum", ["lh"], ["lhs"], axes=[0, 2], keepdims=0),
        helper.make_node("Identity", ["fl"], ["y"]),
    ]
    old_inits = [
        init("up", np.array([1, 1, 2, 1], np.float32)),
        init("w1", rng.standard_normal((4, 2, 3)).astype(np.float32)),
        init("flat_w", rng.standard_normal((2, 3)).astype(np.float32)),
        init("g", rng.standard_normal((4, 3)).astype(np.float32)),
        init("lx", rng.standard_normal((3, 2, 2)).astype(np.float32)),
        init("lw", rng.standard_normal((2, 12, 2)).astype(np.float32)),
        init("lr", rng.standard_normal((2, 12, 3)).astype(np.float32)),
        init("lb", rng.standard_normal((2, 24)).astype(np.float32)),
    ]
    lh = helper.make_tensor_value_info("lhs", TensorProto.FLOAT, None)
    older = helper.make_model(
        helper.make_graph(old_nodes, "older", [a], [y, lh], old_inits),
        opset_imports=[helper.make_opsetid("", 9)],
        ir_version=4,
    )
    return [
        ("shapes", shapes.SerializeToString()),
        ("older", older.SerializeToString()),
        ("control", _control_graph(helper, init, rng).SerializeToString()),
    ]


def _control_graph(helper, init, rng):
    """If, Loop and Scan with subgraphs reading outer values, the indexing operators, and a
    quantized product (QDQ and integer forms), on a (n, 4) input."""
    from onnx import TensorProto

    f32, i64, flag = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    vi = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [vi("t", f32, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", f32, None)])
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
            helper.make_node("Less", ["i", "three"], ["go"]),
            helper.make_node("Identity", ["acc_out"], ["step"]),
        ],
        "body",
        [vi("i", i64, []), vi("c", flag, []), vi("acc_in", f32, None)],
        [vi("go", flag, []), vi("acc_out", f32, None), vi("step", f32, None)],
    )
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"]), helper.make_node("Relu", ["s_out"], ["r"])],
        "scan",
        [vi("s_in", f32, [4]), vi("row", f32, [4])],
        [vi("s_out", f32, [4]), vi("r", f32, [4])],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero_f"], ["positive"]),
        helper.make_node("If", ["positive"], ["chosen"], then_branch=then, else_branch=other),
        helper.make_node("Loop", ["trips", "yes", "chosen"], ["acc", "steps"], body=body),
        helper.make_node("Scan", ["state0", "acc"], ["state", "rows"], body=scan_body, num_scan_inputs=1),
        helper.make_node("TopK", ["rows", "k"], ["top", "top_i"], axis=1),
        helper.make_node("GatherND", ["steps", "nd_idx"], ["picked"]),
        helper.make_node("CumSum", ["top", "one_axis"], ["cum"], exclusive=1),
        helper.make_node("Einsum", ["cum", "proj"], ["ein"], equation="nk,kj->nj"),
        helper.make_node("QuantizeLinear", ["ein", "q_scale", "q_zero"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "q_scale", "q_zero"], ["dq"]),
        helper.make_node("DynamicQuantizeLinear", ["dq"], ["a_q", "a_scale", "a_zero"]),
        helper.make_node("MatMulInteger", ["a_q", "w_q", "a_zero", "w_zero"], ["acc_i"]),
        helper.make_node("Cast", ["acc_i"], ["y"], to=f32),
        helper.make_node("OneHot", ["top_i", "depth", "on_off"], ["z"], axis=-1),
    ]
    inits = [
        init("two", np.array(2.0, np.float32)),
        init("zero_f", np.array(0.0, np.float32)),
        init("three", np.array(3, np.int64)),
        init("trips", np.array(5, np.int64)),
        init("yes", np.array(True)),
        init("state0", np.zeros(4, np.float32)),
        init("k", np.array([2], np.int64)),
        init("nd_idx", np.array([[0, 0], [1, 0]], np.int64)),
        init("one_axis", np.array(1, np.int64)),
        init("proj", rng.standard_normal((2, 3)).astype(np.float32)),
        init("q_scale", np.array(0.05, np.float32)),
        init("q_zero", np.array(0, np.int8)),
        init("w_q", rng.integers(-100, 100, (3, 2)).astype(np.int8)),
        init("w_zero", np.array(0, np.int8)),
        init("depth", np.array(3, np.int64)),
        init("on_off", np.array([0.0, 1.0], np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "control",
        [vi("x", f32, ["n", 4])],
        [vi("y", f32, None), vi("z", f32, None), vi("picked", f32, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.fixture(scope="module")
def onnx_seeds(torch):
    oracle("onnx")
    torch.manual_seed(0)
    tnn = torch.nn
    cnn = tnn.Sequential(
        tnn.Conv2d(3, 4, 3, padding=1),
        tnn.BatchNorm2d(4),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(4, 4, 3, groups=2, stride=2, padding=1),
        tnn.AvgPool2d(2, ceil_mode=True),
        tnn.Flatten(),
        tnn.Linear(4, 3),
        tnn.Softmax(-1),
    )
    mlp = tnn.Sequential(tnn.Linear(6, 8), tnn.GELU(), tnn.LayerNorm(8), tnn.Linear(8, 3), tnn.LogSoftmax(-1))

    class Recurrent(tnn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm = tnn.Embedding(10, 4), tnn.LSTM(4, 5, batch_first=True, bidirectional=True)
            self.gru, self.fc = tnn.GRU(10, 3), tnn.Linear(3, 2)

        def forward(self, ids):
            h = self.lstm(self.emb(ids))[0]
            return self.fc(self.gru(h)[0][:, -1])

    layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    encoder = tnn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    dyn = {"x": {0: "batch"}}
    seeds = [
        (
            "cnn",
            _onnx_export(torch, cnn, (torch.randn(1, 3, 8, 8),), input_names=["x"], dynamic_axes=dyn, opset_version=13),
        ),
        ("mlp", _onnx_export(torch, mlp, (torch.randn(2, 6),), input_names=["x"], dynamic_axes=dyn, opset_version=17)),
        (
            "rnn",
            _onnx_export(
                torch,
                Recurrent(),
                (torch.randint(0, 10, (2, 5)),),
                input_names=["x"],
                dynamic_axes=dyn,
                opset_version=14,
            ),
        ),
        (
            "enc",
            _onnx_export(
                torch, encoder, (torch.randn(2, 5, 8),), input_names=["x"], dynamic_axes=dyn, opset_version=17
            ),
        ),
        *_helper_graphs(),
    ]
    import fastlayers

    for name, data in seeds:  # every seed loads and runs as it is
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fastlayers-seed-{os.getpid()}-{name}.onnx"
        path.write_bytes(data)
        try:
            load_onnx_and_call(str(path))
            fastlayers.load(path)
        finally:
            path.unlink()
    return seeds


def _zip_canonical(data: bytes) -> bytes:
    """A torch.save zip re-written without its random serialization id (fixed timestamps)."""
    return make_zip([(n, b) for n, b in zip_members(data) if not n.endswith("serialization_id")])


def _legacy_canonical(data: bytes) -> bytes:
    """A legacy torch.save file with its storage keys (object addresses) replaced by counters
    of the same length, so that the bytes are the same from run to run."""
    pickles, pos = [], 0
    for _ in range(5):
        ops = list(pickletools.genops(data[pos:]))
        pickles.append((pos, ops))
        pos += ops[-1][2] + 1
    keys = [arg for op, arg, _ in pickles[4][1] if op.name in ("BINUNICODE", "SHORT_BINUNICODE")]
    for k, key in enumerate(sorted(set(keys), key=keys.index)):
        data = data.replace(key.encode(), str(k).zfill(len(key)).encode())
    return data


def torch_save(torch, obj, fmt="zip") -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, buf, _use_new_zipfile_serialization=(fmt == "zip"))
    data = buf.getvalue()
    return _zip_canonical(data) if fmt == "zip" else _legacy_canonical(data)


def _torch_models(torch):
    """name -> a function building the torch module of a seed (fresh each call, seeded)."""
    tnn = torch.nn

    def cnn():
        torch.manual_seed(0)
        return tnn.Sequential(
            tnn.Conv2d(3, 4, 3, padding=1),
            tnn.BatchNorm2d(4),
            tnn.ReLU(),
            tnn.MaxPool2d(2),
            tnn.Conv2d(4, 6, 3, groups=2, padding=1, dilation=1),
            tnn.AdaptiveAvgPool2d(2),
            tnn.Upsample(scale_factor=2.0),
            tnn.AvgPool2d(2),
            tnn.Flatten(),
            tnn.Dropout(0.1),
            tnn.Linear(24, 3),
        )

    def mlp():
        torch.manual_seed(1)
        return tnn.Sequential(
            tnn.Linear(6, 8), tnn.GELU(), tnn.LayerNorm(8), tnn.Linear(8, 4), tnn.LeakyReLU(0.1), tnn.Softmax(-1)
        )

    def enc():
        torch.manual_seed(2)
        layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return tnn.Sequential(tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False), tnn.Linear(8, 2))

    def emb():
        torch.manual_seed(3)
        return tnn.Sequential(tnn.Embedding(10, 4, padding_idx=0), tnn.Flatten(), tnn.Linear(20, 2))

    def tcnn():
        torch.manual_seed(4)
        return tnn.Sequential(
            tnn.Conv1d(4, 4, 3, padding=1), tnn.MaxPool1d(2), tnn.ELU(), tnn.Flatten(), tnn.Linear(12, 2)
        )

    return {"cnn": cnn, "mlp": mlp, "enc": enc, "emb": emb, "tcnn": tcnn}


@pytest.fixture(scope="module")
def torch_seeds(torch):
    """{"modules": [(name, zip bytes, legacy bytes)], "state_dicts": [(name, bytes)]}."""
    models = _torch_models(torch)
    modules = [
        (name, torch_save(torch, build()), torch_save(torch, build(), "legacy")) for name, build in models.items()
    ]
    torch.manual_seed(5)
    rnn = torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True, proj_size=3)
    sd = collections.OrderedDict(models["cnn"]().state_dict())
    sd.update({f"rnn.{k}": v for k, v in rnn.state_dict().items()})
    sd["half"] = torch.randn(3, 2).half().t()
    sd["bf16"] = torch.randn(4).bfloat16()
    sd["ints"] = torch.arange(6).reshape(2, 3)[:, 1:]
    state_dicts = [
        ("sd", torch_save(torch, sd)),
        ("sdlegacy", torch_save(torch, sd, "legacy")),
        ("ckpt", torch_save(torch, {"model": dict(models["mlp"]().state_dict()), "epoch": 3})),
    ]
    return {"modules": modules, "state_dicts": state_dicts, "models": models}


# -------------------------------------------------------------------------------- mutators
#: Values worth writing where a graph or a pickle gives a number.
INTS = [
    0,
    1,
    2,
    3,
    -1,
    -2,
    7,
    255,
    256,
    4097,
    65535,
    2**31 - 1,
    2**31,
    -(2**31),
    2**32,
    2**40,
    2**62,
    2**63 - 1,
    -(2**63),
    10**9,
]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 3.4e38, -3.4e38, float("nan"), float("inf"), float("-inf")]
ATTR_NAMES = [
    "axis",
    "axes",
    "perm",
    "strides",
    "pads",
    "dilations",
    "kernel_shape",
    "group",
    "to",
    "keepdims",
    "size",
    "split",
    "num_outputs",
    "hidden_size",
    "direction",
    "mode",
    "value",
    "alpha",
    "transB",
    "starts",
    "ends",
    "scales",
    "output_shape",
    "_w_hwio",
    "activation",
    "_stats",
    "q_num_heads",
    "ceil_mode",
    "auto_pad",
    "allowzero",
]


def _onnx_ops_names():
    from fastlayers.onnx.ops import RECORDS

    return sorted(k for k, r in RECORDS.items() if r.schema is not None) + [
        "FusedConv",
        "FusedDense",
        "FusedEncoderLayer",
        "EmbeddingLSTM",
        "If",
        "Loop",
        "relu",
        "",
        "Conv\x00",
        "é" * 10,
    ]


def _mutate_attribute(node, rng):
    from onnx import AttributeProto, helper, numpy_helper

    if not node.attribute or rng.random() < 0.2:
        name = str(rng.choice(ATTR_NAMES))
        choices = [
            int(rng.choice(INTS)),
            [int(rng.choice(INTS)) for _ in range(int(rng.integers(0, 5)))],
            float(rng.choice(FLOATS)),
            "SAME_UPPER",
            "bidirectional",
            "nearest",
        ]
        value = choices[int(rng.integers(0, len(choices)))]
        del_names = [a for a in node.attribute if a.name == name]
        for a in del_names:
            node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(name, value if value != [] else [0]))
        return
    attr = node.attribute[int(rng.integers(0, len(node.attribute)))]
    op = rng.random()
    if op < 0.15:
        node.attribute.remove(attr)
    elif op < 0.25:  # a type the reader does not expect
        attr.type = int(
            rng.choice(
                [
                    AttributeProto.FLOAT,
                    AttributeProto.INT,
                    AttributeProto.STRING,
                    AttributeProto.INTS,
                    AttributeProto.FLOATS,
                    AttributeProto.TENSOR,
                    AttributeProto.GRAPH,
                    0,
                ]
            )
        )
    elif attr.type == AttributeProto.INT:
        attr.i = int(rng.choice(INTS))
    elif attr.type == AttributeProto.INTS:
        values = list(attr.ints)
        if values and rng.random() < 0.7:
            values[int(rng.integers(0, len(values)))] = int(rng.choice(INTS))
        elif rng.random() < 0.5:
            values = values[:-1]
        else:
            values = values + [int(rng.choice(INTS))]
        del attr.ints[:]
        attr.ints.extend(values)
    elif attr.type == AttributeProto.FLOAT:
        attr.f = float(rng.choice(FLOATS))
    elif attr.type == AttributeProto.FLOATS:
        values = list(attr.floats) or [1.0]
        values[int(rng.integers(0, len(values)))] = float(rng.choice(FLOATS))
        del attr.floats[:]
        attr.floats.extend(values)
    elif attr.type == AttributeProto.STRING:
        attr.s = pick(
            rng,
            [b"", b"tanh", b"linear", b"cubic", b"reflect", b"SAME_LOWER", b"\xff\xfe", b"x" * 300, b"bidirectional"],
        )
    elif attr.type == AttributeProto.STRINGS:
        attr.strings.append(b"Nope")
    elif attr.type == AttributeProto.TENSOR:
        t = attr.t
        if rng.random() < 0.5:
            t.dims[:] = [int(rng.choice([0, 1, 4, 2**20, -1]))] * max(1, len(t.dims))
        else:
            attr.t.CopyFrom(numpy_helper.from_array(np.array([rng.choice(INTS)], np.int64)))


def _mutate_tensor(t, rng):
    from onnx import TensorProto

    op = rng.random()
    if op < 0.35 and t.data_type == TensorProto.INT64 and t.raw_data and len(t.raw_data) % 8 == 0:
        values = np.frombuffer(t.raw_data, "<i8").copy()
        if values.size:
            values[int(rng.integers(0, values.size))] = int(rng.choice(INTS))
            t.raw_data = values.tobytes()
    elif op < 0.5 and t.dims:
        t.dims[int(rng.integers(0, len(t.dims)))] = int(rng.choice([0, 1, 2, 3, 2**20, 2**40, -1]))
    elif op < 0.6:
        t.data_type = int(rng.choice([0, 1, 6, 7, 8, 9, 10, 11, 16, 17, 30]))
    elif op < 0.7 and t.raw_data:
        t.raw_data = t.raw_data[: int(rng.integers(0, len(t.raw_data)))]
    elif op < 0.8:
        del t.dims[:]
    elif t.raw_data and t.data_type == TensorProto.FLOAT and len(t.raw_data) % 4 == 0:
        values = np.frombuffer(t.raw_data, "<f4").copy()
        if values.size:
            values[int(rng.integers(0, values.size))] = rng.choice(FLOATS)
            t.raw_data = values.tobytes()


def mutate_onnx_graph(data: bytes, rng) -> bytes:
    """``data`` (a ModelProto) with 1..3 graph-level edits."""
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(data)
    g = model.graph
    for _ in range(int(rng.integers(1, 4))):
        nodes = list(g.node)
        values = (
            [i.name for i in g.input]
            + [t.name for t in g.initializer]
            + [o for n in nodes for o in n.output]
            + ["", "undefined"]
        )
        op = rng.random()
        node = nodes[int(rng.integers(0, len(nodes)))] if nodes else None
        if op < 0.3 and node is not None:
            _mutate_attribute(node, rng)
        elif op < 0.42 and node is not None and node.input:  # rewire an input
            k = int(rng.integers(0, len(node.input)))
            node.input[k] = str(rng.choice(values))
        elif op < 0.47 and node is not None:  # add or drop inputs
            if rng.random() < 0.5 and node.input:
                del node.input[-1]
            else:
                node.input.append(str(rng.choice(values)))
        elif op < 0.55 and node is not None and node.output:  # rename or blank an output
            k = int(rng.integers(0, len(node.output)))
            node.output[k] = str(rng.choice(values + ["renamed"]))
        elif op < 0.6 and node is not None:  # the op type
            node.op_type = str(rng.choice(_onnx_ops_names()))
        elif op < 0.63 and node is not None:
            node.domain = str(rng.choice(["ai.onnx", "com.microsoft", "ai.onnx.ml"]))
        elif op < 0.68 and len(nodes) > 1:  # the order
            order = list(range(len(nodes)))
            if rng.random() < 0.5:
                rng.shuffle(order)
            else:
                order = order[::-1]
            copies = [type(nodes[0])() for _ in nodes]
            for c, k in zip(copies, order):
                c.CopyFrom(nodes[k])
            del g.node[:]
            g.node.extend(copies)
        elif op < 0.72 and node is not None:  # drop or duplicate a node
            if rng.random() < 0.5:
                g.node.remove(node)
            else:
                g.node.append(node)
        elif op < 0.86 and g.initializer:
            _mutate_tensor(g.initializer[int(rng.integers(0, len(g.initializer)))], rng)
        elif op < 0.93 and g.input:  # a graph input's declared type
            vi = g.input[int(rng.integers(0, len(g.input)))]
            dims = vi.type.tensor_type.shape.dim
            if dims and rng.random() < 0.7:
                d = dims[int(rng.integers(0, len(dims)))]
                if rng.random() < 0.5:
                    d.dim_value = int(rng.choice([0, 1, 2, 7, 2**20, 2**40, 2**62]))
                else:
                    d.dim_param = str(rng.choice(["n", "batch", "", "é"]))
            else:
                vi.type.tensor_type.elem_type = int(rng.choice([0, 1, 2, 6, 7, 8, 9, 10, 16, 99]))
        elif g.output:  # a graph output's name
            g.output[int(rng.integers(0, len(g.output)))].name = str(rng.choice(values + ["missing"]))
    if rng.random() < 0.05:
        del model.opset_import[:]
        model.opset_import.add(domain="", version=int(rng.choice([1, 8, 9, 30, 10**6])))
    return model.SerializeToString()


#: Globals to swap in for a pickle's own (admitted ones of other kinds, and refused ones).
GLOBALS = [
    b"torch.nn.modules.linear\nLinear",
    b"torch.nn.modules.conv\nConv2d",
    b"torch.nn.modules.container\nSequential",
    b"torch.nn.modules.pooling\nMaxPool2d",
    b"torch.nn.modules.rnn\nLSTM",
    b"torch.nn.modules.flatten\nFlatten",
    b"torch.nn.modules.normalization\nLayerNorm",
    b"torch\nHalfStorage",
    b"torch\nLongStorage",
    b"torch\nBFloat16Storage",
    b"torch._utils\n_rebuild_parameter",
    b"torch._utils\n_rebuild_tensor_v3",
    b"collections\nOrderedDict",
    b"builtins\nset",
    b"builtins\nfrozenset",
    b"torch\nSize",
    b"torch\nfloat8_e4m3fn",
    b"torch.nn.functional\nrelu",
    b"os\nsystem",
    b"builtins\neval",
    b"mymodels\nNet",
    b"torch.nn.modules.sparse\nEmbedding",
]
#: Strings to swap in (attribute and table names, keys).
STRINGS = [
    "_parameters",
    "_buffers",
    "_modules",
    "weight",
    "bias",
    "in_features",
    "out_features",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "num_features",
    "running_mean",
    "normalized_shape",
    "start_dim",
    "0",
    "1",
    "storage",
    "cpu",
    "",
    "é",
    "padding_idx",
    "scale_factor",
    "output_size",
    "hidden_size",
    "num_layers",
    "embed_dim",
    "num_heads",
]


def _long1(value: int) -> bytes:
    body = value.to_bytes((value.bit_length() + 8) // 8 or 1, "little", signed=True)
    return b"\x8a" + bytes([len(body)]) + body


def mutate_pickle_ops(pkl: bytes, rng) -> bytes:
    """A torch pickle with 1..3 edits that keep its opcode stream readable: numbers, floats,
    strings and globals replaced, memo references redirected, opcodes dropped or repeated."""
    for _ in range(int(rng.integers(1, 4))):
        try:
            ops = list(pickletools.genops(pkl))
        except Exception:  # noqa: BLE001 - an earlier edit broke the stream: keep it as is
            return pkl
        ends = [p for _, _, p in ops[1:]] + [len(pkl)]
        k = int(rng.integers(0, len(ops)))
        op, arg, pos = ops[k]
        end = ends[k]
        name = op.name
        choice = rng.random()
        if name in ("BININT1", "BININT2", "BININT", "LONG1") and choice < 0.8:
            value = int(rng.choice(INTS))
            new = b"J" + struct.pack("<i", value) if -(2**31) <= value < 2**31 else _long1(value)
        elif name == "BINFLOAT" and choice < 0.8:
            new = b"G" + struct.pack(">d", float(rng.choice(FLOATS)))
        elif name in ("BINUNICODE", "SHORT_BINUNICODE") and choice < 0.8:
            s = str(rng.choice(STRINGS)).encode()
            new = b"X" + struct.pack("<I", len(s)) + s
        elif name == "GLOBAL" and choice < 0.8:
            new = b"c" + pick(rng, GLOBALS) + b"\n"
        elif name in ("BINGET", "LONG_BINGET") and choice < 0.8:
            puts = [a for o, a, _ in ops[:k] if o.name in ("BINPUT", "LONG_BINPUT")]
            target = int(rng.choice(puts)) if puts else 0
            new = b"h" + bytes([target]) if target < 256 else b"j" + struct.pack("<I", target)
        elif name in ("NEWTRUE", "NEWFALSE", "NONE") and choice < 0.8:
            new = pick(rng, [b"\x88", b"\x89", b"N", b"K\x00", b"J\xff\xff\xff\x7f"])
        elif choice < 0.9 and name not in ("PROTO", "STOP"):
            new = b""  # drop the opcode
        elif name not in ("PROTO", "STOP"):
            new = pkl[pos:end] * 2  # repeat it
        else:
            continue
        pkl = pkl[:pos] + new + pkl[end:]
    return pkl


def _hostile_value(torch, rng):
    choice = int(rng.integers(0, 12))
    if choice == 0:
        t = ()
        for _ in range(int(rng.integers(20, 45))):
            t = (t, t)
        return t
    if choice == 1:
        return int(rng.choice(INTS))
    if choice == 2:
        return float(rng.choice(FLOATS))
    if choice == 3:
        return tuple(int(rng.choice(INTS)) for _ in range(int(rng.integers(0, 4))))
    if choice == 4:
        return pick(rng, ["same", "valid", "reflect", "tanh", "x" * 1000, ""])
    if choice == 5:
        return [1, 2]
    if choice == 6:
        return None
    if choice == 7:
        return torch.zeros(int(rng.integers(0, 4)))
    if choice == 8:
        return {"a": 1}
    if choice == 9:
        return bool(rng.random() < 0.5)
    if choice == 10:
        return collections.OrderedDict(weight=torch.zeros(2))
    return (int(rng.choice(INTS)), None)


def _strange_tensor(torch, t, rng):
    """``t`` replaced by a tensor torch can save but a reader must be careful with."""
    choice = int(rng.integers(0, 7))
    base = t.detach().reshape(-1)
    if base.numel() == 0:
        base = torch.zeros(1)
    if choice == 0:  # zero strides expanding a small storage
        return torch.as_strided(base, (2 ** int(rng.integers(4, 22)),) * 2, (0, 0))
    if choice == 1:  # overlapping strides
        k = (base.numel() + 1) // 2
        return torch.as_strided(base, (k, k), (1, 1))
    if choice == 2:
        return t.detach().to(
            pick(rng, [torch.float16, torch.bfloat16, torch.int8, torch.bool, torch.complex64, torch.float64])
        )
    if choice == 3:  # a transposed (non-contiguous) view of the same data
        return t.detach().t() if t.dim() == 2 else t.detach().reshape(-1, 1)
    if choice == 4:  # a different shape
        return torch.zeros(*(int(rng.integers(1, 5)) for _ in range(max(1, t.dim()))))
    if choice == 5:
        return t.detach()[..., :0]
    return torch.zeros(())


def mutate_torch_objects(torch, build, rng, fmt) -> bytes:
    """A seed module with 1..3 edits of its objects (attributes, tables, tensors, the tree),
    saved by torch."""
    import sys

    model = build()
    modules = list(model.modules())  # before any edit: torch's own walk may fail after
    for _ in range(int(rng.integers(1, 4))):
        m = modules[int(rng.integers(0, len(modules)))]
        choice = rng.random()
        if not isinstance(m.__dict__.get("_modules"), dict):
            continue
        if choice < 0.4:  # an attribute
            names = [k for k in m.__dict__ if not k.startswith("_") and k != "training"] or ["extra"]
            m.__dict__[str(rng.choice(names))] = _hostile_value(torch, rng)
        elif choice < 0.5:  # a table of the wrong type
            table = str(rng.choice(["_parameters", "_buffers", "_modules"]))
            m.__dict__[table] = pick(rng, [[1, 2], None, "x", (), {"w": 3}, torch.zeros(2)])
        elif choice < 0.7:  # a tensor
            tables = [
                m.__dict__[t]
                for t in ("_parameters", "_buffers")
                if isinstance(m.__dict__.get(t), dict) and m.__dict__[t]
            ]
            if tables:
                table = pick(rng, tables)
                key = pick(rng, list(table))
                if isinstance(table[key], torch.Tensor):
                    table[key] = _strange_tensor(torch, table[key], rng)
        elif choice < 0.8 and len(modules) > 2:  # share a module under several parents
            other = modules[int(rng.integers(1, len(modules)))]
            for k in range(int(rng.integers(1, 40))):
                other = torch.nn.Sequential(other, other) if rng.random() < 0.8 else other
            m.__dict__["_modules"]["shared"] = other
        elif choice < 0.85:  # nest deeply
            inner = torch.nn.Identity()
            for _ in range(int(rng.choice([50, 150, 900]))):
                inner = torch.nn.Sequential(inner)
            m.__dict__["_modules"]["deep"] = inner
        elif choice < 0.92:  # a module of another class in place of a child
            children = list(m.__dict__.get("_modules", {}) or {})
            if children and isinstance(m.__dict__["_modules"], dict):
                m.__dict__["_modules"][pick(rng, children)] = pick(
                    rng, [torch.nn.Linear(2, 3), torch.nn.Conv2d(1, 1, 1), torch.nn.Identity(), 7, "child"]
                )
        else:  # a key of the wrong type
            if isinstance(m.__dict__.get("_parameters"), dict):
                m.__dict__["_parameters"][(1, 2)] = torch.zeros(1)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        return torch_save(torch, model, fmt)
    except Exception:  # noqa: BLE001 - torch cannot save what the edits made: the seed as it is
        return torch_save(torch, build(), fmt)
    finally:
        sys.setrecursionlimit(limit)


# ------------------------------------------------------------------------------ fuzz tests
def test_fuzzed_onnx_bytes(onnx_seeds, monkeypatch):
    rng = np.random.default_rng(SEED)
    cases = []
    for i in range(n_cases("onnx_bytes")):
        name, data = onnx_seeds[i % len(onnx_seeds)]
        cases.append((f"onnx-bytes-{i}-{name}", mutate_bytes(data, rng), ".onnx"))
    check(cases, "tests.fuzz.test_onnx_torch:load_onnx_and_call", monkeypatch)


def test_fuzzed_onnx_graph(onnx_seeds, monkeypatch):
    rng = np.random.default_rng(SEED + 1)
    cases = []
    for i in range(n_cases("onnx_graph")):
        name, data = onnx_seeds[i % len(onnx_seeds)]
        cases.append((f"onnx-graph-{i}-{name}", mutate_onnx_graph(data, rng), ".onnx"))
    check(cases, "tests.fuzz.test_onnx_torch:load_onnx_and_call", monkeypatch)


def _pickle_member(data: bytes):
    members = zip_members(data)
    k = next(i for i, (n, _) in enumerate(members) if n.endswith("data.pkl"))
    return members, k


def test_fuzzed_torch_bytes(torch_seeds, monkeypatch):
    rng = np.random.default_rng(SEED + 2)
    module_cases, sd_cases = [], []
    modules, sds = torch_seeds["modules"], torch_seeds["state_dicts"]
    for i in range(n_cases("torch_bytes")):
        how = i % 4
        if i % 2 == 0:
            name, zipped, legacy = modules[(i // 2) % len(modules)]
            target, suffix = module_cases, f"-{name}.pt"
        else:
            name, zipped = sds[(i // 2) % len(sds)]
            legacy = zipped if not zipped.startswith(b"PK") else None
            target, suffix = sd_cases, ".pt"
        if how == 0 or not zipped.startswith(b"PK"):
            data = mutate_bytes(legacy if legacy is not None and how == 0 else zipped, rng)
        elif how == 1:
            data = mutate_zip_headers(zipped, rng)
        else:  # inside data.pkl, re-zipped with valid checksums
            members, k = _pickle_member(zipped)
            members[k] = (members[k][0], mutate_bytes(members[k][1], rng))
            data = make_zip(members)
        target.append((f"torch-bytes-{i}-{name}", data, suffix))
    check(module_cases, "tests.fuzz.test_onnx_torch:load_torch_and_call", monkeypatch)
    check(sd_cases, "tests.fuzz.test_onnx_torch:load_state_dict", monkeypatch)


def test_fuzzed_torch_records(torch, torch_seeds, monkeypatch):
    rng = np.random.default_rng(SEED + 3)
    module_cases, sd_cases = [], []
    modules, sds, models = torch_seeds["modules"], torch_seeds["state_dicts"], torch_seeds["models"]
    for i in range(n_cases("torch_records")):
        if i % 3 == 0:  # objects edited before torch.save
            name = list(models)[(i // 3) % len(models)]
            fmt = "legacy" if i % 9 == 6 else "zip"
            data = mutate_torch_objects(torch, models[name], rng, fmt)
            module_cases.append((f"torch-objects-{i}-{name}", data, f"-{name}.pt"))
            continue
        if i % 3 == 1:
            name, data, _ = modules[(i // 3) % len(modules)]
            target, suffix = module_cases, f"-{name}.pt"
        else:
            name, data = sds[(i // 3) % len(sds)]
            target, suffix = sd_cases, ".pt"
            if not data.startswith(b"PK"):
                name, data = sds[0]
        members, k = _pickle_member(data)
        members[k] = (members[k][0], mutate_pickle_ops(members[k][1], rng))
        target.append((f"torch-pickle-{i}-{name}", make_zip(members), suffix))
    check(module_cases, "tests.fuzz.test_onnx_torch:load_torch_and_call", monkeypatch)
    check(sd_cases, "tests.fuzz.test_onnx_torch:load_state_dict", monkeypatch)


# ------------------------------------------------------------------- the classes: ONNX
def _graph(nodes, inputs=None, outputs=None, inits=(), opset=17):
    from onnx import TensorProto, helper

    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])]
    outputs = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _save(tmp_path, name, model) -> Path:
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _weight(shape=(4, 3, 3, 3), name="w"):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _onnx_cases():
    """name -> (nodes, initializers, error class name, message pattern) of graphs that are
    refused at load."""
    from onnx import helper, numpy_helper

    n = helper.make_node
    shape = numpy_helper.from_array(np.array([4096, 4096, 64], np.int64), "s")
    claim = numpy_helper.from_array(np.ones(4, np.float32))
    claim.dims[:] = [1 << 20, 4]  # a tensor attribute claiming more than its data
    return {
        "tensor attribute past its data": (
            [n("Constant", [], ["c"], value=claim), n("Add", ["x", "c"], ["y"])],
            [],
            "ModelFileError",
            r"dimensions \(1048576, 4\) need",
        ),
        "undefined value": (
            [n("Relu", ["nope"], ["y"])],
            [],
            "ModelFileError",
            r"node 'y' \(Relu\) reads 'nope', which no node",
        ),
        "cycle": (
            [n("Add", ["x", "b"], ["a"]), n("Relu", ["a"], ["b"]), n("Relu", ["a"], ["y"])],
            [],
            "ModelFileError",
            "has a cycle",
        ),
        "renamed output": ([n("Relu", ["x"], ["z"])], [], "ModelFileError", "graph output 'y' is computed by no node"),
        "two producers": (
            [n("Relu", ["x"], ["y"]), n("Sigmoid", ["x"], ["y"])],
            [],
            "ModelFileError",
            "output 'y' is already written",
        ),
        "empty input at call": (
            [n("Add", ["x", ""], ["y"])],
            [],
            "ModelFileError",
            r"node 'y' \(Add\): input 2 is required but has no name",
        ),
        "empty input when folding": (
            [n("Mul", ["w", ""], ["w2"]), n("Conv", ["x", "w2"], ["y"])],
            [_weight()],
            "ModelFileError",
            r"node 'w2' \(Mul\): input 2 is required",
        ),
        "missing attribute": (
            [n("Concat", ["x", "x"], ["y"])],
            [],
            "ModelFileError",
            "required attribute 'axis' is missing",
        ),
        "mistyped attribute": (
            [n("Conv", ["x", "w"], ["y"], strides=[1.5, 1.0])],
            [_weight()],
            "ModelFileError",
            "attribute 'strides' must be a list of ints",
        ),
        "string for an int": (
            [n("Conv", ["x", "w"], ["y"], group="two")],
            [_weight()],
            "ModelFileError",
            "attribute 'group' must be an int",
        ),
        "zero strides": (
            [n("Conv", ["x", "w"], ["y"], strides=[0, 0])],
            [_weight()],
            "ModelFileError",
            r"attribute 'strides' is \[0, 0\]; each value must be in \[1, ",
        ),
        "zero pooling strides": (
            [n("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 0])],
            [],
            "ModelFileError",
            "attribute 'strides'",
        ),
        "zero group": (
            [n("Conv", ["x", "w"], ["y"], group=0)],
            [_weight()],
            "ModelFileError",
            "attribute 'group' is 0",
        ),
        "huge group": (
            [n("Conv", ["x", "w"], ["y"], group=10**9)],
            [_weight()],
            "ModelFileError",
            "group 1000000000 does not divide the 4 output channels",
        ),
        "rank-5 weight": (
            [n("Conv", ["x", "w"], ["y"])],
            [_weight((4, 3, 3, 3, 3))],
            "UnsupportedError",
            "3-D convolution and pooling are not supported",
        ),
        "kernel_shape against the weight": (
            [n("Conv", ["x", "w"], ["y"], kernel_shape=[5, 5])],
            [_weight()],
            "ModelFileError",
            "kernel_shape .* does not match",
        ),
        "not a permutation": (
            [n("Transpose", ["x"], ["y"], perm=[0, 0, 1, 2])],
            [],
            "ModelFileError",
            "is not a permutation",
        ),
        "fastlayers' own node": (
            [n("FusedConv", ["x", "w"], ["y"])],
            [_weight()],
            "UnsupportedError",
            r"unsupported ONNX operator\(s\): FusedConv",
        ),
        "reserved attribute": (
            [n("Conv", ["x", "w"], ["y"], activation="relu", _w_hwio=7)],
            [_weight()],
            "ModelFileError",
            "attribute '_w_hwio': names starting with '_' are reserved",
        ),
        "folded constant over the limit": (
            [n("ConstantOfShape", ["s"], ["big"]), n("Add", ["x", "big"], ["y"])],
            [shape],
            "ModelFileError",
            r"node 'big' \(ConstantOfShape\): folding it at load .* over 67108864 bytes",
        ),
        "MaxPool's Indices read": (
            [n("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2]), n("Cast", ["i"], ["y"], to=1)],
            [],
            "UnsupportedError",
            "computes only the first 1 output",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "tensor attribute past its data",
        "undefined value",
        "cycle",
        "renamed output",
        "two producers",
        "empty input at call",
        "empty input when folding",
        "missing attribute",
        "mistyped attribute",
        "string for an int",
        "zero strides",
        "zero pooling strides",
        "zero group",
        "huge group",
        "rank-5 weight",
        "kernel_shape against the weight",
        "not a permutation",
        "fastlayers' own node",
        "reserved attribute",
        "folded constant over the limit",
        "MaxPool's Indices read",
    ],
)
def test_onnx_graph_defects_refused_at_load(tmp_path, case):
    """Each defect of the issue's ONNX list is a ModelFileError or UnsupportedError at load,
    naming the file, the node and the attribute or value."""
    oracle("onnx")
    import fastlayers
    from fastlayers import errors

    nodes, inits, error, pattern = _onnx_cases()[case]
    path = _save(tmp_path, "defect", _graph(nodes, inits=inits))
    with pytest.raises(getattr(errors, error), match=pattern) as info:
        fastlayers.load(path)
    assert str(path) in str(info.value)


def test_onnx_check_table_covers_every_attribute_the_operators_read():
    """onnx_check keeps only the attributes an operator's record lists: each one an operator
    reads must be there (else a file's value would be dropped silently), bar fastlayers' own
    fused nodes'."""
    import re

    from fastlayers.onnx import check as onnx_check
    from fastlayers.onnx import ops as onnx_ops

    onnx_dir = Path(onnx_check.__file__).parent
    paths = [*sorted(Path(onnx_ops.__file__).parent.glob("*.py"))] + [
        onnx_dir / name for name in ("tensors.py", "layout.py", "windows.py", "indexing.py", "control.py")
    ]
    source = "".join(path.read_text() for path in paths)
    read = set(re.findall(r'attrs(?:\.get\(|\[)"([A-Za-z_][A-Za-z0-9_]*)"', source))
    listed = set().union(*(set(r.schema.attrs) for r in onnx_ops.RECORDS.values() if r.schema is not None))
    fused_only = {
        "activation",
        "layers",
        "program",
        "batch_first",
        "norm_first",
        "num_heads",
        "weights",
        "shape",
    }  # shape: Reshape before opset 5, older than fastlayers reads
    assert {n for n in read - listed if not n.startswith("_")} <= fused_only


def test_onnx_unsorted_graph_is_sorted(tmp_path, rng):
    oracle("onnx")
    from onnx import helper

    import fastlayers

    nodes = [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])]
    model = fastlayers.load(_save(tmp_path, "unsorted", _graph(nodes)))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(model(x), np.maximum(-x, 0))


def test_onnx_non_utf8_and_unprintable_op_types(tmp_path):
    oracle("onnx")
    from onnx import helper

    import fastlayers
    from fastlayers.errors import ModelFileError, UnsupportedError

    data = _graph([helper.make_node("Relu", ["x"], ["y"])]).SerializeToString()
    with pytest.raises(ModelFileError, match="an op_type is not UTF-8 text"):
        fastlayers.load(_save(tmp_path, "bytes", data.replace(b"Relu", b"R\xfflu")))
    with pytest.raises(UnsupportedError, match=r"unsupported ONNX operator\(s\): 'R\\nlu'"):
        fastlayers.load(_save(tmp_path, "newline", data.replace(b"Relu", b"R\nlu")))


def test_onnx_dead_constant_of_shape_is_pruned_before_folding(tmp_path, rng):
    """A 5 KB file with a dead ConstantOfShape(4096, 4096, 64) loads without making it."""
    oracle("onnx")
    import tracemalloc

    from onnx import helper, numpy_helper

    import fastlayers

    shape = numpy_helper.from_array(np.array([4096, 4096, 64], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"]), helper.make_node("Relu", ["x"], ["y"])]
    path = _save(tmp_path, "dead", _graph(nodes, inits=[shape]))
    assert path.stat().st_size < 5000
    tracemalloc.start()
    try:
        model = fastlayers.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    assert model.op_types == ["Relu"]


def test_onnx_call_time_sizes_are_limited(tmp_path):
    """Tensors whose size the graph's values set are checked before they are made; the limit
    is LoadOptions.onnx_max_created_bytes (FASTLAYERS_ONNX_MAX_CREATED_BYTES)."""
    oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import fastlayers
    from fastlayers.errors import InputError

    reps = numpy_helper.from_array(np.array([1, 1, 2**20, 2**20], np.int64), "r")
    model = fastlayers.load(
        _save(tmp_path, "tile", _graph([helper.make_node("Tile", ["x", "r"], ["y"])], inits=[reps]))
    )
    with pytest.raises(InputError, match=r"node 'y' \(Tile\).*over the limit of 2147483648"):
        model(np.zeros((1, 3, 8, 8), np.float32))
    pad = helper.make_node("Conv", ["x", "w"], ["y"], pads=[300, 300, 300, 300])
    model = fastlayers.load(
        _save(tmp_path, "pad", _graph([pad], inits=[_weight()])),
        options=fastlayers.LoadOptions(onnx_max_created_bytes=1 << 10),
    )
    with pytest.raises(InputError, match="over the limit of 1024"):
        model(np.zeros((1, 3, 8, 8), np.float32))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    lrn = fastlayers.load(
        _save(tmp_path, "lrn", _graph([helper.make_node("LRN", ["x"], ["y"], size=10**9)], inputs=[x])),
        options=fastlayers.LoadOptions(onnx_max_created_bytes=1 << 10),
    )
    assert lrn(np.ones((1, 3, 8, 8), np.float32)).shape == (1, 3, 8, 8)  # no window walked


def test_onnx_operator_failures_at_call_are_input_errors(tmp_path):
    """A rank-5 weight computed at call time, a Reshape that cannot be done: InputError or
    ShapeError naming the node, before any compiled kernel sees them."""
    oracle("onnx")
    from onnx import helper, numpy_helper

    import fastlayers
    from fastlayers.errors import InputError

    nodes = [helper.make_node("Identity", ["w"], ["w2"]), helper.make_node("Conv", ["x", "w2"], ["y"])]
    model = fastlayers.load(_save(tmp_path, "r5", _graph(nodes, inits=[_weight((4, 3, 3, 3, 3))])))
    with pytest.raises(InputError, match=r"node 'y' \(Conv\).*rank must be the input's"):
        model(np.zeros((1, 3, 8, 8), np.float32))
    target = numpy_helper.from_array(np.array([7, -1], np.int64), "t")
    model = fastlayers.load(
        _save(tmp_path, "reshape", _graph([helper.make_node("Reshape", ["x", "t"], ["y"])], inits=[target]))
    )
    with pytest.raises(InputError, match=r"node 'y' \(Reshape\) failed on these inputs"):
        model(np.zeros((1, 3, 8, 8), np.float32))


# ------------------------------------------------------------------ the classes: torch
def _uni(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _empty_module(cls: bytes) -> bytes:
    """The pickle opcodes of a torch module record without children, parameters or buffers
    (NEWOBJ, then BUILD of its __dict__)."""
    od = b"ccollections\nOrderedDict\n)R"
    return b"c" + cls + b"\n)\x81}(" + _uni("_modules") + od + _uni("_parameters") + od + _uni("_buffers") + od + b"ub"


def deep_sequential_pickle(depth: int) -> bytes:
    """A Sequential nested ``depth`` deep around a ReLU, written opcode by opcode (torch's own
    pickler would overflow the C stack)."""
    od = b"ccollections\nOrderedDict\n)R"
    head = b"ctorch.nn.modules.container\nSequential\n)\x81}(" + _uni("_modules") + od + b"(" + _uni("0")
    tail = b"u" + _uni("_parameters") + od + _uni("_buffers") + od + b"ub"
    return b"\x80\x02" + head * depth + _empty_module(b"torch.nn.modules.activation\nReLU") + tail * depth + b"."


def torch_zip(pkl: bytes, storages=()) -> bytes:
    return make_zip(
        [
            ("archive/data.pkl", pkl),
            ("archive/byteorder", b"little"),
            *((f"archive/data/{k}", v) for k, v in storages),
            ("archive/version", b"3"),
        ]
    )


def _torch_hostile_files(torch, tmp_path) -> dict:
    """name -> path of the issue's hostile torch files (names ending in "-sd" are read with
    load_state_dict)."""
    files = {}
    m = torch.nn.Linear(1, 1)
    for _ in range(41):  # the same record twice per level: 2**40 paths in about 1 KB
        s = torch.nn.Sequential()
        s.add_module("0", m)
        s.add_module("1", m)
        m = s
    files["shared-41"] = torch_save(torch, m)
    files["shared-41-sd"] = files["shared-41"]
    dag = ()
    for _ in range(41):
        dag = (dag, dag)
    storage = torch.zeros(4).untyped_storage()

    class DagSize:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (storage, 0, dag, (1,), False, collections.OrderedDict()))

    files["dag-size-sd"] = torch_save(torch, {"w": DagSize()})

    class DagKey:
        def __reduce__(self):
            return (collections.OrderedDict, ([(dag, 1)],))

    files["dag-key-sd"] = torch_save(torch, {"w": DagKey()})
    files["deep-20000"] = torch_zip(deep_sequential_pickle(20000))
    files["deep-20000-sd"] = files["deep-20000"]
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"{name}.pt"
        paths[name].write_bytes(data)
    return paths


def test_torch_hangs_and_recursions_are_refused(torch, tmp_path):
    """Shared records 41 deep (2**40 paths), a tensor size and a dict key that are tuple DAGs,
    20,000-deep nesting: refused quickly at load, with the file named (in a child process, with
    a timeout: a regression would hang)."""
    paths = _torch_hostile_files(torch, tmp_path)
    cases = [(name, p.read_bytes(), f"-{name}.pt") for name, p in paths.items()]
    stats = check_cases(cases, "tests.fuzz.test_onnx_torch:expect_refused", timeout=10)
    assert stats["outcomes"] == {"error": len(cases)}


@pytest.mark.parametrize(
    "name,pattern",
    [
        ("shared-41", "it builds objects of more than 10000000 nodes"),
        ("dag-size-sd", "once its shared references are expanded"),
        ("deep-20000", "nested more than 1000 deep"),
    ],
)
def test_torch_hostile_pickles_messages(torch, tmp_path, name, pattern):
    import fastlayers
    from fastlayers.errors import ModelFileError

    path = _torch_hostile_files(torch, tmp_path)[name]
    load = fastlayers.load_state_dict if name.endswith("-sd") else fastlayers.load
    with pytest.raises(ModelFileError, match=pattern):
        load(path)


def test_torch_module_trees_are_checked(torch, tmp_path):
    """_parameters of the wrong type, a child that is no module, a module its own ancestor and
    nesting past MAX_MODULE_DEPTH: ModelFileError naming the file, the module and the field, from
    load and from load_state_dict alike."""
    import fastlayers
    from fastlayers.errors import ModelFileError

    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    m[0].__dict__["_parameters"] = [1, 2]
    path = tmp_path / "params.pt"
    path.write_bytes(torch_save(torch, m))
    for load in (fastlayers.load, fastlayers.load_state_dict):
        with pytest.raises(ModelFileError, match=r"params.pt: module '0': _parameters is a list, not a dict"):
            load(path)
    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    m.__dict__["_modules"]["1"] = 7
    path.write_bytes(torch_save(torch, m))
    with pytest.raises(ModelFileError, match="child '1' is a int, not a module"):
        fastlayers.load(path)
    path.write_bytes(torch_zip(deep_sequential_pickle(150)))
    with pytest.raises(ModelFileError, match="modules nested more than 100 deep"):
        fastlayers.load(path)
    path.write_bytes(torch_zip(deep_sequential_pickle(50)))
    assert fastlayers.load(path) is not None  # 50 deep is fine


def test_torch_shared_modules_stay_shared(torch, tmp_path):
    """A module two parents share (torch shares it) is rebuilt once and shared; sharing that
    multiplies the tensors a state dict lists beyond twice the distinct ones is refused."""
    import fastlayers
    from fastlayers.errors import ModelFileError

    torch.manual_seed(0)
    tied = torch.nn.Linear(4, 4)
    path = tmp_path / "tied.pt"
    path.write_bytes(torch_save(torch, torch.nn.Sequential(tied, torch.nn.ReLU(), tied)))
    module = fastlayers.load(path)
    assert module[0] is module[2]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        want = torch.nn.Sequential(tied, torch.nn.ReLU(), tied)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(module(x), want, rtol=1e-5, atol=1e-6)
    big = torch.nn.Linear(1024, 1024)
    many = torch.nn.Sequential(*([big] * 40))  # 160 MiB listed for 4 MiB of weights
    path.write_bytes(torch_save(torch, many))
    with pytest.raises(ModelFileError, match="modules shared by several parents list"):
        fastlayers.load(path)


def test_torch_sharded_indexes_naming_each_other(tmp_path):
    import fastlayers
    from fastlayers.errors import ModelFileError

    (tmp_path / "a.index.json").write_text(json.dumps({"weight_map": {"w": "b.index.json"}}))
    (tmp_path / "b.index.json").write_text(json.dumps({"weight_map": {"w": "a.index.json"}}))
    with pytest.raises(ModelFileError, match="a.index.json: shard 'b.index.json' is an index"):
        fastlayers.load_state_dict(tmp_path / "a.index.json")
    (tmp_path / "c.index.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelFileError, match="c.index.json: not a sharded checkpoint index"):
        fastlayers.load_state_dict(tmp_path / "c.index.json")


@pytest.mark.parametrize(
    "edit,pattern",
    [
        (lambda c: c.__dict__.update(padding=(2**31, 2**31)), r"attribute 'padding' is \(2147483648, "),
        (lambda c: c.__dict__.update(padding=(5, 5)), r"padding \(5, 5\) is wider than the dilated kernel"),
        (
            lambda c: c.__dict__.update(out_channels=2**31),
            r"tensor 'weight' has shape \(4, 3, 3, 3\); its "
            r"attributes declare \(2147483648, 3, 3, 3\)",
        ),
        (lambda c: c.__dict__.update(kernel_size=(2**31, 3)), r"tensor 'weight' .*its attributes declare"),
        (lambda c: c.__dict__.update(stride=(0, 1)), r"attribute 'stride' is \(0, 1\)"),
        (lambda c: c.__dict__.update(groups=0), r"attribute 'groups' is 0"),
        (lambda c: c.__dict__.update(dilation=((), ())), "attribute 'dilation'"),
    ],
    ids=[
        "padding 2**31",
        "padding past the kernel",
        "out_channels 2**31",
        "kernel 2**31",
        "stride 0",
        "groups 0",
        "nested dilation",
    ],
)
def test_torch_module_attributes_are_validated(torch, tmp_path, edit, pattern):
    """A Conv's declared sizes must be its weight's, its geometry in range: refused at load,
    before anything is allocated (was: a 960 GiB workspace at call time)."""
    import fastlayers
    from fastlayers.errors import ModelFileError

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    edit(m[0])
    path = tmp_path / "conv.pt"
    path.write_bytes(torch_save(torch, m))
    with pytest.raises(ModelFileError, match=r"conv.pt: module '0' \(torch.nn.modules.conv.Conv2d\): " + pattern):
        fastlayers.load(path)


def test_torch_linear_sizes_must_match_weights(torch, tmp_path):
    import fastlayers
    from fastlayers.errors import ModelFileError

    m = torch.nn.Sequential(torch.nn.Linear(3, 4))
    m[0].__dict__["in_features"] = 10**6
    path = tmp_path / "linear.pt"
    path.write_bytes(torch_save(torch, m))
    with pytest.raises(
        ModelFileError,
        match=r"tensor 'weight' has shape \(4, 3\); its attributes "
        r"declare \(4, 1000000\)",
    ):
        fastlayers.load(path)


def test_torch_zero_strides_cannot_expand_a_storage(torch, tmp_path):
    import fastlayers
    from fastlayers.errors import ModelFileError

    path = tmp_path / "expand.pt"
    path.write_bytes(torch_save(torch, {"w": torch.as_strided(torch.zeros(1), (2**20, 2**20), (0, 0))}))
    with pytest.raises(
        ModelFileError,
        match=r"expand.pt: tensor \(size \(1048576, 1048576\), stride "
        r"\(0, 0\)\) copies 4398046511104 bytes",
    ):
        fastlayers.load_state_dict(path)
    small = tmp_path / "small.pt"  # an expanded tensor of legitimate size still loads
    small.write_bytes(torch_save(torch, {"w": torch.ones(3).expand(4, 3)}))
    np.testing.assert_array_equal(fastlayers.load_state_dict(small)["w"], np.ones((4, 3), np.float32))


def test_torch_sequential_runs_on_batch_zero(torch, tmp_path):
    """A Sequential loaded from torch runs on a batch of 0 (Flatten failed on it)."""
    import fastlayers

    for name, build in _torch_models(torch).items():
        if name == "enc":
            continue
        path = tmp_path / f"{name}.pt"
        path.write_bytes(torch_save(torch, build()))
        module = fastlayers.load(path)
        shape, kind = TORCH_INPUTS[name]
        x = np.zeros((0, *shape[1:]), np.float32 if kind == "f" else np.int64)
        with torch.no_grad():
            want = build().eval()(torch.from_numpy(x)).shape
        assert module(x).shape == tuple(want), name
