"""ISA dispatch of the native core: the best path this CPU runs is chosen at import,
FASTLAYERS_ISA forces one (and fails clearly where the CPU cannot run it), set_isa switches at
run time, and every CPU call runs without importing Numba, llvmlite or SciPy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastlayers import native


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_the_best_path_is_chosen_at_import():
    proc = _python("from fastlayers import native; print(native.isa())", FASTLAYERS_ISA="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == native.best_isa() == native.available_isas()[0]


@pytest.mark.parametrize("name", native.available_isas())
def test_the_environment_forces_a_path(name):
    proc = _python("from fastlayers import native; print(native.isa())", FASTLAYERS_ISA=name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == name


def test_an_unavailable_path_is_a_clear_error():
    proc = _python("import fastlayers.native", FASTLAYERS_ISA="sse9")
    assert proc.returncode != 0
    assert "SettingError: environment variable FASTLAYERS_ISA='sse9': expected one of" in proc.stderr
    with pytest.raises(ValueError, match="not available"):
        native.set_isa("sse9")


def test_paths_compiled_for_this_machine():
    assert native.isas()[-1] == "generic"
    assert "generic" in native.available_isas()
    if os.uname().machine in ("x86_64", "AMD64"):
        assert native.isas() == ["avx512", "avx2", "generic"]


NO_JIT = """
import sys
import numpy as np
import fastlayers
from fastlayers import layers
rng = np.random.default_rng(0)
inp = fastlayers.Input((12, 12, 3))
h = layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
h = layers.DepthwiseConv2D(3)(h)
h = layers.MaxPooling2D()(h)
h = layers.Reshape((25, 8))(h)
h = layers.LSTM(16, return_sequences=True)(h)
h = layers.GRU(8, return_sequences=True)(h)
h = layers.SimpleRNN(8, return_sequences=True)(h)
h = layers.MultiHeadAttention(2, 4)(h, h)
h = layers.LayerNormalization()(h)
h = layers.Flatten()(h)
out = layers.Dense(5, activation="softmax")(h)
model = fastlayers.Model(inp, out)
y = model(rng.standard_normal((2, 12, 12, 3)).astype(np.float32))
assert y.shape == (2, 5) and np.isfinite(y).all()
import fastlayers.nn as nn
enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
assert enc(rng.standard_normal((2, 5, 16)).astype(np.float32)).shape == (2, 5, 16)
loaded = [m for m in ("numba", "llvmlite", "scipy") if m in sys.modules]
print("loaded:", loaded)
assert not loaded, loaded
"""


def test_cpu_calls_import_no_jit():
    """Convolution, pooling, recurrent, attention, Transformer and dense calls in a fresh
    process load neither Numba, llvmlite nor SciPy."""
    proc = _python(NO_JIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_source_tree_without_the_extension_fails_at_import(tmp_path):
    """Python started in a checkout whose extension was never built stops at ``import
    fastlayers`` with the way out, rather than failing (or running slower) at a later call."""
    import shutil

    import fastlayers

    shutil.copytree(
        os.path.dirname(fastlayers.__file__),
        tmp_path / "fastlayers",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import fastlayers"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode != 0
    assert (
        f"ImportError: fastlayers' compiled core (fastlayers.native._core) is not built in {tmp_path / 'fastlayers'}"
        in proc.stderr
        and "pip install -e ." in proc.stderr
    )


_FAULTS = """
import resource, numpy as np, fastlayers.native as n
def run():
    for mib in (1, 3, 6, 12, 20, 6, 3):
        a = np.ones(mib << 18, np.float32); b = np.ones(mib << 18, np.float32); del a, b
run()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    run()
print(n.HEAP_RETAINED, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's heap settings")
def test_the_heap_keeps_freed_memory_mapped():
    """Outputs allocated anew each call reuse mapped pages (4 rounds touch about 50000 pages)."""
    proc = _python(_FAULTS)
    assert proc.returncode == 0, proc.stderr
    retained, faults = proc.stdout.split()
    assert retained == "True" and int(faults) < 2000
    proc = _python(_FAULTS, FASTLAYERS_HEAP="system")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "False"
    assert native.heap_retain(-1, 0) is False and native.heap_retain(1 << 40, 0) is False


_TRIM = """
import numpy as np
import fastlayers.native as n
def rss():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) // 1024
blocks = [np.ones(1 << 18, np.float32) for _ in range(64)]  # 64 x 1 MiB from the retained heap
keep = blocks[::8]
del blocks
before = rss()
print(n.trim_heap(), before - rss(), float(sum(k.sum() for k in keep)))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's heap settings")
def test_trimming_the_heap_hands_back_freed_blocks():
    """``trim_heap`` (run after each load) returns what the retained heap keeps of freed blocks
    (56 MiB here, under the 64 MiB it keeps) and leaves live ones alone; with
    ``FASTLAYERS_HEAP=system`` it does nothing."""
    proc = _python(_TRIM)
    assert proc.returncode == 0, proc.stderr
    trimmed, released, total = proc.stdout.split()
    assert trimmed == "True" and int(released) >= 40 and float(total) == 8 * (1 << 18)
    proc = _python(_TRIM, FASTLAYERS_HEAP="system")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "False"


def test_an_unknown_heap_setting_is_a_clear_error():
    proc = _python("import fastlayers.native", FASTLAYERS_HEAP="arena")
    assert proc.returncode != 0 and "FASTLAYERS_HEAP='arena'" in proc.stderr
