"""``backends/cpu/memory.py``: the cache size read from a sysfs tree like Linux's (the default
where the tree is absent or says nothing usable), and arrays moved onto a cache line."""

from __future__ import annotations

import numpy as np
import pytest

from fastlayers.backends.cpu import memory
from fastlayers.backends.cpu.conv import conv_weights_array


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


@pytest.mark.parametrize("offset", [0, 4, 16, 48])
def test_line_aligned_starts_on_a_line_with_the_same_values(offset):
    raw = np.arange(400, dtype=np.float32)
    a = raw[offset // 4 + (-raw.ctypes.data % 64) // 4 :][: 7 * 9].reshape(7, 9)
    out = memory.line_aligned(a)
    assert out.ctypes.data % memory.LINE == 0
    assert out.dtype == a.dtype and out.shape == a.shape and out.flags.c_contiguous
    np.testing.assert_array_equal(out, a)
    assert (out is a) == (a.ctypes.data % memory.LINE == 0)


def test_direct_convolution_weights_start_on_a_line():
    raw = np.random.default_rng(0).standard_normal(3 * 3 * 3 * 16 + 20).astype(np.float32)
    w = raw[(-raw.ctypes.data % 64) // 4 + 1 :][: 3 * 3 * 3 * 16].reshape(3, 3, 3, 16)
    assert w.ctypes.data % 64 != 0
    held = conv_weights_array(w)
    assert held.ctypes.data % 64 == 0
    np.testing.assert_array_equal(held, w)
    assert conv_weights_array(w) is held  # once per weight
