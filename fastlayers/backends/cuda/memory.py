"""A caching device allocator for numba.cuda (its External Memory Management plugin interface).

numba-cuda allocates every device array with ``cuMemAlloc`` and frees it with ``cuMemFree``,
which cost far more than the kernels of a Dense layer (docs/design.md, "CUDA backend"). This manager keeps freed blocks
by rounded size and hands them out again, as torch's caching allocator does. Reuse is safe
because fastlayers runs every transfer and kernel on the default stream, in order: a block freed
on the host is reused only by work queued after the work that last read it.

Cached blocks are returned to the driver when an allocation fails (then it is retried once)
and when the context is reset. ``load_cuda`` installs the manager before numba creates its CUDA
context, unless numba is configured with another manager (``NUMBA_CUDA_MEMORY_MANAGER``) or
``FASTLAYERS_CUDA_CACHING_ALLOCATOR=0``.
"""

from __future__ import annotations

import threading
import weakref

from numba.cuda.cudadrv import driver as _driver

#: Block sizes are rounded up to a multiple of this many bytes (small blocks) ...
_SMALL_STEP = 512
#: ... or, from 1 MiB, to a multiple of 1/8 of their power of two (at most 12.5 % over).
_LARGE_FROM = 1 << 20


def rounded(size: int) -> int:
    """The block size that serves a request of ``size`` bytes."""
    if size < _LARGE_FROM:
        return max(_SMALL_STEP, -(-size // _SMALL_STEP) * _SMALL_STEP)
    step = 1 << (size.bit_length() - 4)
    return -(-size // step) * step


class CachingMemoryManager(_driver.GetIpcHandleMixin, _driver.HostOnlyCUDAMemoryManager):
    """numba.cuda memory manager that caches freed device blocks by size (see the module)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}

    def initialize(self):
        if self.deallocations.memory_capacity == _driver._SizeNotSet:
            self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        block = rounded(size)
        with self._lock:
            cached = self._free.get(block)
            ptr = cached.pop() if cached else None
        if ptr is None:
            ptr = self._new_block(block)
        free, lock = self._free, self._lock

        def give_back(ptr=ptr, block=block):
            with lock:
                free.setdefault(block, []).append(ptr)

        return _driver.MemoryPointer(weakref.proxy(self.context), ptr, size, finalizer=give_back)

    def _new_block(self, block):
        try:
            return _driver.driver.cuMemAlloc(block)
        except _driver.CudaAPIError:
            self.release_cached()
            self.deallocations.clear()
            return _driver.driver.cuMemAlloc(block)

    def release_cached(self) -> int:
        """Return every cached block to the driver; the bytes released."""
        with self._lock:
            blocks, self._free = self._free, {}
        released = 0
        for size, ptrs in blocks.items():
            for ptr in ptrs:
                _driver.driver.cuMemFree(ptr)
                released += size
        return released

    def get_memory_info(self):
        free, total = _driver.driver.cuMemGetInfo()
        return _driver.MemoryInfo(free=free, total=total)

    def reset(self):
        self.release_cached()
        super().reset()

    @property
    def interface_version(self):
        return 1
