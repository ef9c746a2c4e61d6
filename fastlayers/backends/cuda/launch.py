"""Kernel launches straight through the CUDA driver, with numba-cuda compiling the kernels.

``kernel[grid, block](*args)`` through numba's dispatcher costs tens of microseconds of Python
per launch (typing every argument, then marshalling each array into ctypes through several
layers; docs/design.md, "CUDA backend"), which made the backend launch-bound: an MLP call of 7 launches spent most of
its time there. ``FastKernel`` keeps numba's dispatcher for compiling and for the simulator,
and launches the compiled kernel itself: the argument types of a call are keyed cheaply
(dtype, rank and layout of each device array, type of each scalar and of each element of a
tuple of scalars), the kernel is compiled once per key through ``dispatcher.compile``, and each
launch packs numba's kernel ABI (per array: meminfo, parent, size, itemsize, data pointer,
shape, strides; scalars as their C type; a tuple as its elements) into one parameter buffer for ``cuLaunchKernel`` on the legacy default stream, as numba does.
Arguments it does not know (host arrays, records) take numba's own path.
"""

from __future__ import annotations

import ctypes

import numpy as np

_c_intp = ctypes.c_ssize_t
#: numba scalar type name -> the C type its kernel parameter has.
_SCALARS = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "bool": ctypes.c_uint8,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8,
    "uint16": ctypes.c_uint16,
    "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64,
}
_ARRAY = object()


def _dim3(d) -> tuple:
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


def _key(a):
    """A cheap stand-in for numba's type of launch argument ``a`` (None: not handled here)."""
    if hasattr(a, "device_ctypes_pointer") and hasattr(a, "strides"):
        layout = "C" if a.is_c_contiguous() else "F" if a.is_f_contiguous() else "A"
        return (a.dtype.str, a.ndim, layout)
    t = type(a)
    if t is tuple:  # numba passes a tuple of scalars as its elements, one parameter each
        keys = tuple(map(_key, a))
        return None if None in keys or any(type(k) is tuple for k in keys) else ("tuple", keys)
    return t if t in (bool, int, float) or isinstance(a, np.generic) else None


class FastKernel:
    """A numba-cuda kernel launched through the driver: ``kernel[grid, block](*args)``."""

    def __init__(self, dispatcher, driver):
        self.dispatcher, self._driver = dispatcher, driver
        self._compiled: dict[tuple, tuple | None] = {}

    def __getitem__(self, config):
        grid, block = config[:2]
        if len(config) > 2:  # a stream or dynamic shared memory: numba's launch
            return self.dispatcher[config]
        return _Configured(self, _dim3(grid), _dim3(block))

    def _entry(self, key, args):
        """(CUfunction, per-argument packers) for the argument types ``key``, compiled once;
        None where an argument type is not one this launcher packs."""
        if key in self._compiled:
            return self._compiled[key]
        entry = None
        if None not in key:
            from numba import typeof
            from numba.core import types

            signature = tuple(typeof(a) for a in args)
            kinds = []
            for ty in signature:
                if isinstance(ty, types.Array):
                    kinds.append(_ARRAY)
                elif str(ty) in _SCALARS:
                    kinds.append(_SCALARS[str(ty)])
                elif isinstance(ty, types.BaseTuple) and all(str(t) in _SCALARS for t in ty):
                    kinds.append(tuple(_SCALARS[str(t)] for t in ty))
                else:
                    kinds = None
                    break
            if kinds is not None:
                kernel = self.dispatcher.compile(signature)
                entry = (kernel._codelibrary.get_cufunc().handle, tuple(kinds))
        self._compiled[key] = entry
        return entry

    def launch(self, grid, block, args):
        entry = self._entry(tuple(map(_key, args)), args)
        if entry is None:
            return self.dispatcher[grid, block](*args)
        handle, kinds = entry
        values = []
        for kind, a in zip(kinds, args):
            if kind is _ARRAY:
                values += [
                    ctypes.c_void_p(0),
                    ctypes.c_void_p(0),
                    _c_intp(a.size),
                    _c_intp(a.dtype.itemsize),
                    ctypes.c_void_p(a.device_ctypes_pointer.value),
                ]
                values += [_c_intp(s) for s in a.shape]
                values += [_c_intp(s) for s in a.strides]
            elif type(kind) is tuple:
                values += [k(v) for k, v in zip(kind, a)]
            else:
                values.append(kind(a))
        params = (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))
        self._driver.launch(handle, grid, block, ctypes.addressof(params))
        return None


class _Configured:
    __slots__ = ("kernel", "grid", "block")

    def __init__(self, kernel, grid, block):
        self.kernel, self.grid, self.block = kernel, grid, block

    def __call__(self, *args):
        return self.kernel.launch(self.grid, self.block, args)


def install(module, driver) -> None:
    """Replace every kernel (not device function) of ``module`` by its ``FastKernel``."""
    from numba.cuda.dispatcher import CUDADispatcher

    for name, value in list(vars(module).items()):
        if isinstance(value, CUDADispatcher) and not value.targetoptions.get("device"):
            setattr(module, name, FastKernel(value, driver))
