"""Settings: ``LoadOptions`` per load and per model, the environment variables that set the
process defaults (one parser, clear errors), the public namespace, and the user guide's
settings page listing each setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastlayers
from fastlayers import settings
from fastlayers.errors import ModelFileError, SettingError
from fastlayers.native import _core

from .conftest import oracle

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, **env), timeout=120
    )


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("FASTLAYERS_MAX_LAYERS", "many", "is not an integer"),
        ("FASTLAYERS_ONNX_MAX_CREATED_BYTES", "0", "must be at least 1"),
        ("FASTLAYERS_TORCH_MAX_PICKLE_NODES", "-5", "must be at least 1"),
        ("FASTLAYERS_ISA", "sse9", "expected one of"),
        ("FASTLAYERS_HEAP", "huge", "expected one of 'retain', 'system'"),
    ],
)
def test_a_bad_environment_value_fails_the_import_naming_the_variable(variable, value, expected):
    out = _python("import fastlayers.native", **{variable: value})
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlayers.errors.SettingError") and variable in last
    assert expected in last


def test_environment_values_set_the_defaults_of_every_field():
    """Every limit of SETTINGS is read from its variable, through the one parser (decimal,
    hex, underscores)."""
    limits = [s for s in settings.SETTINGS if s.env]
    env = {s.env: f"0x{i + 17:x}" for i, s in enumerate(limits)}
    code = (
        "import fastlayers; o = fastlayers.LoadOptions(); "
        f"print(*(getattr(o, n) for n in {[s.name for s in limits]!r}))"
    )
    out = _python(code, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(i + 17) for i in range(len(limits))]


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_layers", 0),
        ("max_layers", -1),
        ("max_layers", 1.5),
        ("max_layers", True),
        ("onnx_max_created_bytes", "big"),
        ("warm_up", 1),
        ("optimize", None),
        ("threads", 0),
        ("threads", 300),
    ],
)
def test_load_options_check_their_fields(field, value):
    with pytest.raises(SettingError, match=f"LoadOptions.{field}"):
        fastlayers.LoadOptions(**{field: value})


def test_load_refuses_options_of_another_type(tmp_path):
    with pytest.raises(SettingError, match="must be a fastlayers.LoadOptions"):
        fastlayers.load(tmp_path / "missing.onnx", options={"max_layers": 3})


def test_options_are_frozen_and_replaced():
    options = fastlayers.LoadOptions(max_layers=7)
    with pytest.raises(AttributeError):
        options.max_layers = 8
    assert options.replace(threads=2) == fastlayers.LoadOptions(max_layers=7, threads=2)
    assert fastlayers.LoadOptions() == settings.DEFAULT


def _identity_onnx(tmp_path) -> Path:
    onnx = oracle("onnx")
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def test_a_model_runs_on_its_own_threads_and_keeps_the_process_count(tmp_path, monkeypatch):
    """``LoadOptions(threads=n)``: every call of that model runs its kernels on n threads (as
    onnxruntime's intra_op_num_threads), other models and the process keep theirs."""
    path = _identity_onnx(tmp_path)
    one = fastlayers.load(path, options=fastlayers.LoadOptions(threads=1))
    default = fastlayers.load(path)
    assert one.num_threads == 1 and default.num_threads is None
    seen = []
    evaluate = type(one)._evaluate_here

    def spy(self, *args, **kwargs):
        seen.append(_core.get_num_threads())
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(type(one), "_evaluate_here", spy)
    before = _core.get_num_threads()
    try:
        fastlayers.set_num_threads(2)
        x = np.array([[-1, 2, -3, 4]], np.float32)
        np.testing.assert_array_equal(one(x), np.maximum(x, 0))
        one.run(None, {"x": x})
        np.testing.assert_array_equal(default(x), np.maximum(x, 0))
        assert seen == [1, 1, 2] and _core.get_num_threads() == 2
    finally:
        fastlayers.set_num_threads(before)


def test_threads_apply_to_keras_and_torch_models(tmp_path):
    model = fastlayers.Sequential([fastlayers.Input((4,)), fastlayers.layers.Dense(3)])
    model.save(tmp_path / "m.flm")
    loaded = fastlayers.load(tmp_path / "m.flm", options=fastlayers.LoadOptions(threads=1))
    assert loaded.num_threads == 1
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(loaded(x), model(x))
    module = fastlayers.nn.Linear(4, 3)
    module.num_threads = 1
    assert module(x).shape == (2, 3)


def test_load_time_limits_apply_to_one_load(tmp_path):
    """A limit of the options given is in force for that load only; the ONNX model keeps its
    run-time limits for its own calls."""
    path = _identity_onnx(tmp_path)
    with settings.applied(fastlayers.LoadOptions(max_layers=5)):
        assert settings.current().max_layers == 5
        model = fastlayers.load(path)
    assert settings.current() is settings.DEFAULT
    assert model(np.ones((1, 4), np.float32)).shape == (1, 4)


def test_warm_up_is_an_option(tmp_path):
    path = _identity_onnx(tmp_path)
    cold = fastlayers.load(path, options=fastlayers.LoadOptions(warm_up=False))
    warm = fastlayers.load(path)
    assert cold._compiled is None and warm._compiled is not None
    assert fastlayers.load(path, warm_up=False)._compiled is None  # the keyword still works


def test_an_unoptimized_graph_runs_the_file_s_operators_and_agrees(tmp_path):
    """``optimize=False`` keeps the file's operators (no fused steps) and gives what the
    optimized plan and onnxruntime give."""
    onnx, ort = oracle("onnx"), oracle("onnxruntime")
    h, rng = onnx.helper, np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("w", (8, 3, 3, 3)), ("b", (8,)), ("d", (8, 5)))
    ]
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("GlobalAveragePool", ["r"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("MatMul", ["f", "d"], ["m"]),
        h.make_node("Softmax", ["m"], ["y"], axis=-1),
    ]
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 9, 9])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5])
    path = tmp_path / "net.onnx"
    onnx.save(h.make_model(h.make_graph(nodes, "net", [x], [y], weights), opset_imports=[h.make_opsetid("", 17)]), path)
    plain = fastlayers.load(path, options=fastlayers.LoadOptions(optimize=False))
    fused = fastlayers.load(path)
    assert plain.op_types == ["Conv", "Relu", "GlobalAveragePool", "Flatten", "MatMul", "Softmax"]
    assert len(fused.op_types) < len(plain.op_types)
    data = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": data})[0]
    np.testing.assert_allclose(plain(data), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused(data), expected, rtol=1e-5, atol=1e-6)


def test_state_dict_limits_are_options(tmp_path):
    torch = oracle("torch")
    torch.save({"a": torch.ones(3), "b": torch.zeros(2, 2)}, tmp_path / "sd.pt")
    assert set(fastlayers.load_state_dict(tmp_path / "sd.pt")) == {"a", "b"}
    with pytest.raises(ModelFileError, match="FASTLAYERS_TORCH_MAX_PICKLE_NODES"):
        fastlayers.load_state_dict(tmp_path / "sd.pt", options=fastlayers.LoadOptions(torch_max_pickle_nodes=3))


def test_the_namespace_is_the_public_api():
    assert dir(fastlayers) == sorted(fastlayers.__all__)
    for name in fastlayers.__all__:
        assert getattr(fastlayers, name) is not None
    for private in ("os", "importlib", "EXTENSION_SUFFIXES", "services", "pickling"):
        assert private not in dir(fastlayers)


def test_the_settings_page_lists_every_setting_once():
    page = (ROOT / "docs" / "guide" / "settings.md").read_text()
    for s in settings.SETTINGS:
        assert f"`{s.name}`" in page, s.name
        if s.env:
            assert page.count(f"`{s.env}`") == 1, s.env
    for variable in settings.ENVIRONMENT:
        assert page.count(f"`{variable}`") == 1, variable
    # other pages may name a variable where they explain its limit, but list none in a table
    variables = [s.env for s in settings.SETTINGS if s.env] + list(settings.ENVIRONMENT)
    for doc in (ROOT / "README.md", *(ROOT / "docs").rglob("*.md")):
        if doc.name != "settings.md":
            rows = [
                line
                for line in doc.read_text().splitlines()
                if line.startswith("|") and any(f"`{v}`" in line for v in variables)
            ]
            assert not rows, f"{doc} lists settings in a table: link docs/guide/settings.md"
