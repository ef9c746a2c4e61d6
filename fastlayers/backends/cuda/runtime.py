"""numba.cuda loading, device checks, host/device transfers and the device weight cache.

Nothing here imports ``numba.cuda`` at module import time of ``fastlayers``: this module is only
imported when the ``cuda`` backend is first requested (``fastlayers.backends._BACKENDS``).
``NUMBA_ENABLE_CUDASIM=1`` (set before numba is imported) runs every kernel in numba's CUDA
simulator, on the CPU, which is how CI tests them without a GPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import weakref

import numpy as np

from ...errors import UnsupportedError
from ...settings import env_choice


def require_numba_cuda() -> None:
    """UnsupportedError, saying how to install it, where the numba-cuda package is missing."""
    if importlib.util.find_spec("numba_cuda") is None:
        raise UnsupportedError(
            "backend 'cuda' needs the numba-cuda package: pip install 'fastlayers[cuda]' (or pip install numba-cuda)"
        )


def load_cuda():
    """Import ``numba.cuda`` (the numba-cuda package) and check that a device can be used.

    Raises UnsupportedError when numba-cuda is not installed, or when neither a CUDA driver with a
    device nor the simulator (``NUMBA_ENABLE_CUDASIM=1``) is available.
    """
    require_numba_cuda()
    from numba import cuda

    if not simulated() and env_choice("FASTLAYERS_CUDA_CACHING_ALLOCATOR", ("0", "1"), "1") == "1":
        _install_caching_allocator()
    if not simulated():
        check_numpy_support()
    if not cuda.is_available():
        reason = ""
        try:
            cuda.current_context()
        except Exception as e:  # noqa: BLE001 - only used to word the error
            text = " ".join(str(e).split()).rstrip(" :")
            reason = f" ({text or type(e).__name__})"
        raise UnsupportedError(
            "backend 'cuda' has no usable GPU: no CUDA driver or no CUDA device was found"
            f"{reason}. Install an NVIDIA driver, or set NUMBA_ENABLE_CUDASIM=1 before numba is "
            "imported to run the kernels in numba's (slow) CUDA simulator; use 'cpu' otherwise"
        )
    return cuda


def check_numpy_support(load=importlib.import_module) -> None:
    """UnsupportedError where numba-cuda cannot compile kernels with the installed numpy.

    numba-cuda 0.30.4 (in maintenance mode, NVIDIA/numba-cuda#907) registers an overload of
    ``np.row_stack`` when its array implementations are imported, which they are at the first
    kernel compile; numpy 2.5 removed ``np.row_stack``, so every kernel then failed with an
    ``AttributeError`` from numba's typing (seen on an H200 with numpy 2.5.2). The simulator never
    imports them. ``load`` imports a module by name (a parameter for the tests).
    """
    try:
        load("numba.cuda.np.arrayobj")
    except AttributeError as e:
        if "row_stack" not in str(e):
            raise
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = f"numba-cuda {version('numba-cuda')}"
        except PackageNotFoundError:  # pragma: no cover - numba-cuda runs, so it is installed
            found = "numba-cuda"
        raise UnsupportedError(
            f"backend 'cuda': {found} cannot compile kernels with numpy {np.__version__} (numpy 2.5 "
            "removed np.row_stack, which numba-cuda still registers; NVIDIA/numba-cuda#907). "
            "Install numpy<2.5 (pip install 'fastlayers[cuda]' pins it), or use 'cpu'"
        ) from None


def _install_caching_allocator() -> None:
    """numba.cuda allocates through ``memory.CachingMemoryManager`` from its first context on,
    unless another manager is configured or a context exists already."""
    from numba import config
    from numba.cuda.cudadrv import driver

    if config.CUDA_MEMORY_MANAGER != "default" or driver._memory_manager is not None:
        return
    from .memory import CachingMemoryManager

    driver.set_memory_manager(CachingMemoryManager)


def simulated() -> bool:
    """True when numba.cuda runs in the CUDA simulator."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def is_device(a) -> bool:
    """True for a numba device array (real or simulated)."""
    return hasattr(a, "copy_to_host") and hasattr(a, "shape")


def device_dtype(dtype) -> np.dtype:
    """The type an array of ``dtype`` has on the device: float32 for floats, int64 for integer
    ids, uint8 for bool masks (every kernel is typed for these)."""
    kind = np.dtype(dtype).kind
    return np.dtype(np.float32 if kind == "f" else np.uint8 if kind == "b" else np.int64)


def c_ordered(a, dtype=np.float32) -> np.ndarray:
    """Host array ``a`` as ``dtype`` with C strides on every axis. numpy calls an array with
    odd strides on its length-1 axes contiguous (``a[None]``, ``a[:, None]``); numba.cuda copies
    those strides to the device, where ``reshape`` then refuses it ("operation requires
    copying"; seen on an H100, not under the simulator)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    expected, step = [], a.itemsize
    for n in reversed(a.shape):
        expected.append(step)
        step *= n
    return a if a.strides == tuple(reversed(expected)) else a.copy()


class _Driver:
    """Allocation and C-contiguous host <-> device copies straight through the CUDA driver
    (cuda-bindings, which numba-cuda runs on) and the context's memory manager: numba's own
    ``to_device`` / ``copy_to_host`` / ``device_array`` spend several times as long in Python
    around the driver call (docs/design.md, "CUDA backend"). Copies are synchronous on the legacy default stream, which orders them
    with the kernels numba launches there. None under the simulator (``driver()``)."""

    def __init__(self):
        from cuda.bindings import driver as drv
        from numba import cuda
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        self._drv, self._cuda, self._array = drv, cuda, DeviceNDArray
        self._ok = drv.CUresult.CUDA_SUCCESS
        self._thread = threading.local()

    def _context(self):
        """The numba context, made current on this thread (driver calls act on the current one)."""
        ctx = getattr(self._thread, "ctx", None)
        if ctx is None:
            ctx = self._thread.ctx = self._cuda.current_context()
        return ctx

    def _check(self, result, what):
        if result[0] != self._ok:
            raise RuntimeError(f"CUDA {what} failed: {result[0]!r}")

    def empty(self, shape, dtype):
        """An uninitialised C-contiguous device array."""
        dtype = np.dtype(dtype)
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= n
        memory = self._context().memalloc(max(step, dtype.itemsize))
        return self._array(shape, tuple(reversed(strides)), dtype, gpu_data=memory)

    def to_device(self, host):
        """A device copy of C-ordered host array ``host``."""
        out = self.empty(host.shape, host.dtype)
        if host.nbytes:
            self._check(
                self._drv.cuMemcpyHtoD(out.device_ctypes_pointer.value, host.ctypes.data, host.nbytes),
                "host-to-device copy",
            )
        return out

    def launch(self, function, grid, block, params_address):
        """cuLaunchKernel of ``function`` on the legacy default stream (``launch.FastKernel``)."""
        self._context()
        self._check(self._drv.cuLaunchKernel(function, *grid, *block, 0, 0, params_address, 0), "kernel launch")

    def to_host(self, dev):
        """A host copy of device array ``dev`` (C-contiguous ones directly, others via numba)."""
        if not dev.is_c_contiguous():
            return dev.copy_to_host()
        out = np.empty(dev.shape, dev.dtype)
        if out.nbytes:
            self._context()
            self._check(
                self._drv.cuMemcpyDtoH(out.ctypes.data, dev.device_ctypes_pointer.value, out.nbytes),
                "device-to-host copy",
            )
        return out


_driver: list = []


def driver() -> _Driver | None:
    """The direct driver path, or None under the simulator (numba's own calls then)."""
    if not _driver:
        _driver.append(None if simulated() else _Driver())
    return _driver[0]


def device_empty(shape, dtype=np.float32):
    """An uninitialised C-contiguous device array of ``shape`` and ``dtype``."""
    shape = tuple(int(s) for s in shape)
    fast = driver()
    if fast is None:
        from numba import cuda

        return cuda.device_array(shape, dtype)
    return fast.empty(shape, dtype)


def to_device(a, dtype=np.float32):
    """A C-contiguous device copy of host array ``a`` (device arrays are returned as they are)."""
    if is_device(a):
        return a
    fast = driver()
    if fast is None:
        from numba import cuda

        return cuda.to_device(c_ordered(a, dtype))
    return fast.to_device(c_ordered(a, dtype))


def to_host(a) -> np.ndarray:
    """A host numpy copy of device array ``a`` (host arrays are returned as they are)."""
    if not is_device(a):
        return a
    fast = driver()
    return a.copy_to_host() if fast is None else fast.to_host(a)


class WeightCache:
    """Device copies of host weight arrays, made once and reused by every later call.

    Entries are keyed by ``id`` of the host array (of its root array for a view) and a "version"
    (data pointer, shape and strides, so a ``set_weights`` that installs new arrays is seen); an
    entry is dropped when its host array is garbage collected. Writing into a weight array IN PLACE is
    not detected: call ``clear()`` (``CudaOps.clear_weight_cache``) after doing that. Only
    C-contiguous arrays are cached (others are converted per call); float weights are stored as
    float32, integer tables (e.g. tree paths) keep their type. Thread-safe.
    """

    def __init__(self):
        self._entries: dict[int, tuple] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _version(a: np.ndarray):
        return (a.__array_interface__["data"][0], a.shape, a.strides)

    def get(self, a, derive=None):
        """The device copy of weight ``a`` (None stays None; device arrays pass through).

        ``derive`` = (name, function): cache ``function(a)`` instead (a weight in another layout,
        e.g. a transposed kernel or a column block), keyed by ``a`` and ``name``.
        """
        if a is None or is_device(a):
            return a
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
            return to_device(a if derive is None else derive[1](a))
        # a view (e.g. one row of a stacked bias) is keyed by its root array and its position,
        # so the per-call view objects of the same weight share one device copy
        owner = a
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        key = (id(owner), self._version(a), None if derive is None else derive[0])
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is owner:
                return entry[1]
        host = a if derive is None else derive[1](a)
        dev = to_device(host, np.float32 if host.dtype.kind == "f" else host.dtype)
        with self._lock:
            if key not in self._entries:
                weakref.finalize(owner, self._drop, key)
            self._entries[key] = (weakref.ref(owner), dev)
        return dev

    def _drop(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is None:  # its host array is gone
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
