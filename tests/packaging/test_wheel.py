"""The binary wheel, installed into a fresh venv where no C compiler can be found, runs.

Marked ``wheel``, which the default ``pytest`` run leaves out (pyproject.toml's addopts). Run:

    python scripts/build_wheel.py                      # dist/fastlayers-*-manylinux_*.whl
    FASTLAYERS_WHEEL=dist/fastlayers-...-manylinux_2_34_x86_64.whl pytest -m wheel tests/packaging

With ``FASTLAYERS_WHEEL`` naming a wheel, that wheel is tested and nothing is built; unset, the
tests first build one with scripts/build_wheel.py into a temporary folder (a few minutes).

The venv (``python -m venv``, the running interpreter) is driven through a PATH that holds
only links to its python, pip and, once installed, the ``fastlayers`` command, with ``CC`` and
``CXX`` naming a compiler that does not exist; ``pip install --only-binary :all:
WHEEL[keras]`` takes numpy and h5py as PyPI wheels (network needed). Then, in that venv: the
``fastlayers demo`` command; an ONNX file, a Keras file (.keras and .h5), a pickled torch
``nn.Sequential`` and a torch state dict, made here with the frameworks (torch, keras on the
torch backend, onnx; onnxruntime gives the ONNX reference), compared with the frameworks'
outputs (inside_venv.py, run by the venv's interpreter, where no framework is installed); and
the native core's ISA dispatch against this CPU's /proc/cpuinfo flags, by default and with
``FASTLAYERS_ISA`` forcing each path (a path the CPU lacks must be refused at import).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from ..conftest import oracle

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[2]
INSIDE = Path(__file__).resolve().parent / "inside_venv.py"
#: Compiler commands that must not be found in the venv's PATH.
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++", "x86_64-linux-gnu-gcc", "icx")
ISAS = ("avx512", "avx2", "generic")


def host_isas() -> list[str]:
    """The ISA paths this CPU runs, best first, from /proc/cpuinfo's flags (the conditions of
    fastlayers/native/dispatch.c: AVX-512 F+BW+DQ+VL, or AVX2+FMA, else the portable path)."""
    flags: set[str] = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    assert flags, "no flags line in /proc/cpuinfo"
    out = []
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"} <= flags:
        out.append("avx512")
    if {"avx2", "fma"} <= flags:
        out.append("avx2")
    return out + ["generic"]


def run(cmd, env, cwd, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    named = os.environ.get("FASTLAYERS_WHEEL")
    if named:
        path = Path(named).resolve()
        assert path.is_file() and path.suffix == ".whl", f"FASTLAYERS_WHEEL={named}: no such wheel"
        return path
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_wheel.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return next(out.glob("fastlayers-*-manylinux_*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(env, cwd, python): the wheel installed with its keras extra into a fresh venv, driven
    with a PATH (env) that has no compiler; python: the venv's interpreter on that PATH."""
    base = tmp_path_factory.mktemp("wheel-venv")
    # The PATH folder lies inside the venv: Python finds a venv from the pyvenv.cfg beside or
    # one folder above the path it was started as (a link is not followed for that)
    env_dir, cwd = base / "venv", base / "work"
    bin_dir = env_dir / "path-bin"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env_dir)
    bin_dir.mkdir()
    cwd.mkdir()
    for name in ("python", "pip"):
        (bin_dir / name).symlink_to(env_dir / "bin" / name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "FASTLAYERS_", "VIRTUAL_ENV", "CONDA", "KERAS_"))
    }
    env.update(PATH=str(bin_dir), CC="/nonexistent/cc", CXX="/nonexistent/c++", PIP_NO_INPUT="1")
    python = bin_dir / "python"
    found = run(
        [
            python,
            "-c",
            "import json, shutil, sys; print(json.dumps([sys.prefix, {c: shutil.which(c) for c in sys.argv[1:]}]))",
            *COMPILERS,
        ],
        env,
        cwd,
    )
    assert found.returncode == 0, found.stderr
    prefix, compilers = json.loads(found.stdout)
    assert Path(prefix).resolve() == env_dir.resolve(), f"{python} does not run in the venv"
    assert compilers == dict.fromkeys(COMPILERS), found.stdout
    done = run(["pip", "install", "--only-binary", ":all:", f"{wheel}[keras]"], env, cwd)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Building wheel" not in done.stdout, done.stdout
    (bin_dir / "fastlayers").symlink_to(env_dir / "bin" / "fastlayers")
    return env, cwd, python


def test_no_compiler_and_installed_from_the_wheel(installed, wheel):
    env, cwd, python = installed
    done = run(
        [
            python,
            "-c",
            "import shutil, sys, sysconfig; import fastlayers.native as n; "
            "print(n.__file__); print(n._core.__file__); "
            "print(shutil.which(sysconfig.get_config_var('CC').split()[0]))",
        ],
        env,
        cwd,
    )
    assert done.returncode == 0, done.stderr
    package, core, cc = done.stdout.split("\n")[:3]
    venv_dir = Path(python).parent.parent.resolve()
    assert Path(package).resolve().is_relative_to(venv_dir), package
    assert Path(core).name.startswith("_core.") and Path(core).suffix == ".so", core
    assert cc == "None", f"the interpreter's compiler {cc} is reachable"
    shown = run(["pip", "show", "fastlayers"], env, cwd)
    version = re.search(r"^Version: (\S+)", shown.stdout, re.M).group(1)
    assert wheel.name.startswith(f"fastlayers-{version}-")


def test_demo(installed):
    env, cwd, _ = installed
    done = run(["fastlayers", "demo", "--repeats", "3"], env, cwd)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    accuracies = [float(a) for a in re.findall(r"accuracy on \d+ held-out samples: ([\d.]+)%", done.stdout)]
    assert len(accuracies) == 4 and min(accuracies) > 90, done.stdout


def torch_model(torch):
    """A torch nn.Sequential; inside_venv.torch_twin is its fastlayers.nn twin."""
    nn = torch.nn
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).eval()


def onnx_model(onnx, rng):
    """Conv 3x3 -> Relu -> MaxPool 2 -> Flatten -> Gemm -> Softmax on 3x8x8 images."""
    from onnx import TensorProto, helper, numpy_helper

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "wheel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        [init("w", (4, 3, 3, 3)), init("b", (4,)), init("w2", (10, 64)), init("b2", (10,))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Model files, inputs and the frameworks' outputs, made in this (outer) environment."""
    torch, keras, onnx = oracle("torch"), oracle("keras"), oracle("onnx")
    ort = oracle("onnxruntime")
    assert keras.backend.backend() == "torch", keras.backend.backend()
    d = tmp_path_factory.mktemp("wheel-models")
    rng = np.random.default_rng(7)

    model = onnx_model(onnx, rng)
    onnx.save(model, str(d / "model.onnx"))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    np.save(d / "onnx_x.npy", x)
    np.save(d / "onnx_y.npy", session.run(None, {"x": x})[0])

    K = keras.layers
    keras.utils.set_random_seed(7)
    km = keras.Sequential(
        [keras.Input((10, 6)), K.Conv1D(8, 3, activation="relu"), K.LSTM(12), K.Dense(5, activation="softmax")]
    )
    km.save(d / "model.keras")
    km.save(d / "model.h5")
    x = rng.standard_normal((3, 10, 6)).astype(np.float32)
    np.save(d / "keras_x.npy", x)
    np.save(d / "keras_y.npy", np.asarray(km.predict(x, verbose=0)))

    torch.manual_seed(7)
    tm = torch_model(torch)
    torch.save(tm, d / "torch_module.pt")
    torch.save(tm.state_dict(), d / "torch_state.pt")
    x = rng.standard_normal((5, 6)).astype(np.float32)
    np.save(d / "torch_x.npy", x)
    with torch.no_grad():
        np.save(d / "torch_y.npy", tm(torch.from_numpy(x)).numpy())
    return d


@pytest.mark.parametrize("forced", ["", *ISAS], ids=["best", *ISAS])
def test_models_and_isa_dispatch(installed, models, forced):
    env, cwd, python = installed
    env = dict(env, FASTLAYERS_ISA=forced) if forced else env
    host = host_isas()
    done = run([python, INSIDE, models], env, cwd)
    if forced and forced not in host:
        assert done.returncode != 0, done.stdout
        assert f"FASTLAYERS_ISA={forced!r}" in done.stderr, done.stderr[-2000:]
        pytest.skip(f"this CPU cannot run the {forced} path (refused at import, as it must be)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["isas"] == list(ISAS), "the wheel must carry every x86-64 ISA path"
    assert report["available"] == host, (report["available"], host)
    assert report["best"] == host[0]
    assert report["isa"] == (forced or host[0])
    assert Path(report["core"]).resolve().is_relative_to(Path(python).parent.parent.resolve())
    assert set(report["errors"]) == {"onnx", "keras", "keras_h5", "torch_module", "torch_state_dict"}
    print(json.dumps(report))
