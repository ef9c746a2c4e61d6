"""Run by test_wheel.py with the interpreter of the venv the wheel was installed into (no
torch, keras, onnx or onnxruntime there, no compiler on PATH):

    python inside_venv.py FOLDER

FOLDER holds the model files and the inputs and reference outputs (.npy) that test_wheel.py
made with the frameworks themselves. Each model is loaded by the installed fastlayers, run, and
compared with its reference; prints one JSON line: where fastlayers was imported from, the ISA
paths of its native core (active, best, compiled, runnable on this CPU) and each case's largest
absolute difference. Exits non-zero (a traceback on stderr) when a case differs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

#: Frameworks that must not be importable where the wheel is checked: fastlayers reads their
#: files without them.
FRAMEWORKS = ("torch", "keras", "tensorflow", "onnx", "onnxruntime")


def torch_twin(nn):
    """The fastlayers.nn twin of test_wheel.torch_model (same layers, same state_dict keys)."""
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def main(folder: str) -> None:
    present = [name for name in FRAMEWORKS if importlib.util.find_spec(name) is not None]
    assert not present, f"frameworks installed in the wheel's venv: {present}"

    import fastlayers
    import fastlayers.nn as nn
    from fastlayers import native

    d = Path(folder)
    outputs = {
        "onnx": lambda: fastlayers.load(d / "model.onnx")(np.load(d / "onnx_x.npy")),
        "keras": lambda: fastlayers.load(d / "model.keras")(np.load(d / "keras_x.npy")),
        "keras_h5": lambda: fastlayers.load(d / "model.h5")(np.load(d / "keras_x.npy")),
        "torch_module": lambda: fastlayers.load(d / "torch_module.pt")(np.load(d / "torch_x.npy")),
    }

    def state_dict_case():
        model = torch_twin(nn)
        model.load_state_dict(fastlayers.load_state_dict(d / "torch_state.pt"))
        return model(np.load(d / "torch_x.npy"))

    outputs["torch_state_dict"] = state_dict_case
    refs = {
        "onnx": "onnx_y.npy",
        "keras": "keras_y.npy",
        "keras_h5": "keras_y.npy",
        "torch_module": "torch_y.npy",
        "torch_state_dict": "torch_y.npy",
    }
    errors = {}
    for name, run in outputs.items():
        got, want = np.asarray(run()), np.load(d / refs[name])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
        errors[name] = float(np.max(np.abs(got - want)))
    loaded = [name for name in FRAMEWORKS if name in sys.modules]
    assert not loaded, f"frameworks imported: {loaded}"
    print(
        json.dumps(
            {
                "file": fastlayers.__file__,
                "core": native._core.__file__,
                "isa": native.isa(),
                "best": native.best_isa(),
                "isas": native.isas(),
                "available": native.available_isas(),
                "errors": errors,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
