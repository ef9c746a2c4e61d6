"""Memory for the arrays hot loops read over and over: cache-line aligned, and large derived
weights on transparent huge pages.

A share of a recurrent kernel (512 KiB of a 1 MiB LSTM kernel at two threads) is read from its
core's L2 cache every step. With 4 KiB pages its physical pages fall on the cache's sets at
random and some sets overflow, and the step's time varied about 2x from one process to the
next; on 2 MiB pages (contiguous physical memory) it holds steady (docs/design.md, "Units split
among threads").
Linux backs an ``madvise(MADV_HUGEPAGE)`` region with huge pages when
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``; elsewhere the
advice is a no-op and the array is an ordinary aligned one.
"""

from __future__ import annotations

import functools
import math
import mmap
from pathlib import Path

import numpy as np

LINE = 64
HUGE_PAGE = 2 << 20
#: Smallest array put on huge pages (each takes whole 2 MiB pages).
HUGE_MIN_BYTES = 1 << 20
#: A core's L2 cache where the system does not say (AMD Zen 4 and 5; Zen 3 has half, recent
#: Intel Xeons twice).
L2_DEFAULT_BYTES = 1 << 20
#: Where Linux describes the first CPU's caches.
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


def aligned_empty(shape, dtype=np.float32, align=LINE):
    """An uninitialized C-contiguous array whose data starts on an ``align``-byte boundary."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    return np.ndarray(shape, dtype, raw, -raw.ctypes.data % align)  # cheaper than slicing raw


def line_aligned(a):
    """``a`` where its data starts on a cache line, else a copy of it that does (C-ordered)."""
    if a.ctypes.data % LINE == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def weights_empty(shape, dtype=np.float32):
    """An uninitialized array for long-lived derived weights: on huge pages from
    ``HUGE_MIN_BYTES`` where the platform has ``MADV_HUGEPAGE``, else cache-line aligned."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes < HUGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return aligned_empty(shape, dtype)
    size = (-(-nbytes // HUGE_PAGE) + 1) * HUGE_PAGE  # one page of slack for alignment
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # kernel without THP
        pass
    raw = np.frombuffer(region, np.uint8)  # the array keeps the mapping alive
    start = -raw.ctypes.data % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


@functools.cache
def l2_cache_bytes() -> int:
    """Bytes of one core's L2 cache, read once from ``/sys/devices/system/cpu/cpu0/cache``
    (Linux); ``L2_DEFAULT_BYTES`` where that is absent or unreadable."""
    try:
        for index in sorted(_CACHES.glob("index*")):
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return L2_DEFAULT_BYTES
