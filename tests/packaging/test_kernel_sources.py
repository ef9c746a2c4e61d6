"""Each kernel file of the native core compiles on its own.

The build compiles the kernel files together, one translation unit per ISA (``isa_<name>.c``
includes ``kernels.inc``, which includes every kernel file). Here ``gcc -fsyntax-only`` takes
each file that ``kernels.inc`` includes by itself, with the flags setup.py gives that ISA and
the macros its ``isa_<name>.c`` defines, for every ISA the host's gcc can target: a file that
used something of another file without including that file's internal header
(``<subject>_internal.h``) would compile only after it in ``kernels.inc``, and fails here.
Warnings are errors, since GCC only warns of a function called without a declaration.
Skipped where gcc is not found.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "fastlayers" / "native"
GCC = shutil.which("gcc")

pytestmark = pytest.mark.skipif(GCC is None, reason="gcc is not on PATH")


def setup_flags() -> tuple[list[str], dict[str, list[str]]]:
    """setup.py's ``COMMON`` and ``ISA_FLAGS``, read from its source (importing it builds)."""
    values = {}
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("COMMON", "ISA_FLAGS"):
                values[target.id] = ast.literal_eval(node.value)
    return values["COMMON"], values["ISA_FLAGS"]


COMMON, ISA_FLAGS = setup_flags()


def kernel_files() -> list[str]:
    """The kernel files kernels.inc includes, in its order."""
    text = (NATIVE / "kernels.inc").read_text()
    return re.findall(r'^#include "(\w+\.c)"$', text, re.MULTILINE)


def isa_defines(isa: str) -> list[str]:
    """The macros isa_<isa>.c defines before it includes kernels.inc, as -D options."""
    text = (NATIVE / f"isa_{isa}.c").read_text()
    return [f"-D{name}={value}" for name, value in re.findall(r"^#define (\w+) (\S+)$", text, re.MULTILINE)]


def gcc(args: list[str], source: str | None = None) -> subprocess.CompletedProcess[str]:
    assert GCC is not None
    return subprocess.run([GCC, *args], input=source, cwd=NATIVE, capture_output=True, text=True, timeout=120)


def gcc_each(args: list[str], files: list[str]) -> list[tuple[int, str]]:
    """gcc args on every file, each its own translation unit, the files shared among as many
    gcc runs at once as there are cores: (return code, stderr) of each run."""
    assert GCC is not None
    runs = min(os.cpu_count() or 1, len(files))
    procs = [
        subprocess.Popen(
            [GCC, *args, *files[i::runs]], cwd=NATIVE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for i in range(runs)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    return [(p.returncode, e) for p, e in zip(procs, errors)]


def test_kernel_files_listed() -> None:
    files = kernel_files()
    assert "gemm.c" in files and "conv_gemm.c" in files, files
    assert all((NATIVE / f).is_file() for f in files), files
    assert len(set(files)) == len(files), files


@pytest.mark.parametrize("isa", sorted(ISA_FLAGS))
def test_kernel_file_compiles_alone(isa: str) -> None:
    flags = [*COMMON, *ISA_FLAGS[isa], "-Werror", "-I", str(NATIVE), *isa_defines(isa)]
    if gcc(["-fsyntax-only", *ISA_FLAGS[isa], "-x", "c", "-"], "int x;\n").returncode:
        pytest.skip(f"this gcc cannot target {isa}")
    for code, stderr in gcc_each(["-fsyntax-only", *flags], kernel_files()):
        assert code == 0 and stderr == "", stderr
