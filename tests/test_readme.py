"""Every Python block of README.md runs as written: each one alone, in a fresh namespace, in an
empty folder (the cuda backend's block runs under the CUDA simulator in test_cuda_backend.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fastlayers

README = Path(__file__).resolve().parents[1] / "README.md"
CUDA_MARK = 'use_ops("cuda")'


def readme_blocks() -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of the README."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def run_block(line: int, code: str) -> dict:
    namespace = {"__name__": f"readme_line_{line}"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
    return namespace


def test_the_readme_has_its_blocks():
    blocks = readme_blocks()
    assert len(blocks) >= 6 and sum(CUDA_MARK in code for _, code in blocks) == 1


@pytest.mark.parametrize("line, code", [b for b in readme_blocks() if CUDA_MARK not in b[1]],
                         ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_block_runs_as_written(line, code, tmp_path, monkeypatch):
    pytest.importorskip("torch") if "import torch" in code else None
    monkeypatch.chdir(tmp_path)
    from fastlayers import native

    threads = fastlayers.get_num_threads() or native.get_num_threads()
    try:
        run_block(line, code)
    finally:
        fastlayers.set_num_threads(threads)
