"""``backends/cpu/memory.py``'s cache size: read from a sysfs tree like Linux's, the default
where the tree is absent or says nothing usable."""

from __future__ import annotations

import pytest

from fastlayers.backends.cpu import memory


def _cache(root, index, level, kind, size):
    d = root / f"index{index}"
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "_CACHES", tmp_path)
    memory.l2_cache_bytes.cache_clear()
    yield tmp_path
    memory.l2_cache_bytes.cache_clear()


@pytest.mark.parametrize("size,expected", [("2048K", 2 << 20), ("1M", 1 << 20), ("524288", 1 << 19)])
def test_l2_size_read_from_sysfs(sysfs, size, expected):
    _cache(sysfs, 0, 1, "Data", "48K")
    _cache(sysfs, 1, 1, "Instruction", "32K")
    _cache(sysfs, 2, 2, "Unified", size)
    _cache(sysfs, 3, 3, "Unified", "480M")
    assert memory.l2_cache_bytes() == expected


@pytest.mark.parametrize("size", [None, "big"])
def test_l2_size_defaults(sysfs, size):
    if size:
        _cache(sysfs, 0, 2, "Unified", size)
    assert memory.l2_cache_bytes() == memory.L2_DEFAULT_BYTES


def test_l2_size_of_this_machine_is_plausible():
    memory.l2_cache_bytes.cache_clear()
    assert 64 << 10 <= memory.l2_cache_bytes() <= 64 << 20
