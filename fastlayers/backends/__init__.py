"""Backend selection: the active Ops object lives in a ContextVar (default ``cpu``).

``use_ops`` switches it for a block; ``set_num_threads`` sizes fastlayers' thread pool.
Backends are imported lazily: ``import fastlayers`` loads no kernel, and the cuda backend
alone imports Numba (numba-cuda, the ``cuda`` extra).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import numbers
import os
import threading

from ..errors import InputError, UnsupportedError
from .reference import ReferenceOps

_BACKENDS = {
    "reference": ("fastlayers.backends.reference", "ReferenceOps"),
    "cpu": ("fastlayers.backends.cpu", "CpuOps"),
    "cuda": ("fastlayers.backends.cuda", "CudaOps"),  # imports numba.cuda only when first used
}
_instances: dict[str, ReferenceOps] = {}
_instances_lock = threading.Lock()
_active: contextvars.ContextVar[str] = contextvars.ContextVar("fastlayers_ops", default="cpu")
_num_threads: list[int | None] = [None]


def get_ops(name: str | None = None) -> ReferenceOps:
    """Return the Ops instance of backend ``name`` (default: the active one)."""
    name = _active.get() if name is None else name
    ops = _instances.get(name)
    if ops is None:
        if name not in _BACKENDS:
            raise UnsupportedError(f"unknown backend {name!r}; expected one of {sorted(_BACKENDS)}")
        with _instances_lock:
            ops = _instances.get(name)
            if ops is None:
                module, cls = _BACKENDS[name]
                ops = _instances[name] = getattr(importlib.import_module(module), cls)()
    return ops


@contextlib.contextmanager
def use_ops(name: str):
    """Run the block with backend ``name`` ("reference", "cpu" or "cuda") in this thread's context.

    Examples
    --------
    >>> with fastlayers.use_ops("reference"):
    ...     y = model(x)
    """
    get_ops(name)  # fail before the block starts
    token = _active.set(name)
    try:
        yield get_ops(name)
    finally:
        _active.reset(token)


#: Most threads the native pool runs (its fixed size, ``FL_MAX_THREADS`` in threadpool.c).
MAX_THREADS = 256


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in fastlayers' kernels (the native core's thread pool).

    fastlayers shares each call's work among its own threads; a call made while another one
    runs (another Python thread) runs on its caller's thread alone, so the cores are never
    oversubscribed.

    Raises
    ------
    InputError
        ``n`` is not an integer from 1 to ``MAX_THREADS`` (256, the pool's size).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_THREADS:
        raise InputError(f"set_num_threads expects an integer from 1 to {MAX_THREADS} (this "
                         f"machine has {os.cpu_count()} CPUs), got {n!r}")
    n = int(n)
    _num_threads[0] = n
    from ..native import set_num_threads as native_threads

    native_threads(n)


def get_num_threads() -> int | None:
    """The count set by ``set_num_threads``, or None when the libraries' defaults are in force."""
    return _num_threads[0]
