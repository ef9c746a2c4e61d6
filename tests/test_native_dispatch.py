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
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


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
    assert "FASTLAYERS_ISA='sse9'" in proc.stderr and "not available" in proc.stderr
    with pytest.raises(ValueError, match="not available"):
        native.set_isa("sse9")


def test_paths_compiled_for_this_machine():
    assert native.isas()[-1] == "generic"
    assert "generic" in native.available_isas()
    if os.uname().machine in ("x86_64", "AMD64"):
        assert native.isas() == ["avx512", "avx2", "generic"]
