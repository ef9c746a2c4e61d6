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
from .types import Ops

_BACKENDS = {
    "reference": ("fastlayers.backends.reference", "ReferenceOps"),
    "cpu": ("fastlayers.backends.cpu", "CpuOps"),
    "cuda": ("fastlayers.backends.cuda", "CudaOps"),  # imports numba.cuda only when first used
}
_instances: dict[str, Ops] = {}
_instances_lock = threading.Lock()
_active: contextvars.ContextVar[str] = contextvars.ContextVar("fastlayers_ops", default="cpu")
_num_threads: list[int | None] = [None]


def get_ops(name: str | None = None) -> Ops:
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


def _thread_count(n, what: str) -> int:
    """``n`` as an int from 1 to MAX_THREADS, else InputError naming ``what``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= int(n) <= MAX_THREADS:
        raise InputError(
            f"{what} expects an integer from 1 to {MAX_THREADS} (this machine has {os.cpu_count()} CPUs), got {n!r}"
        )
    return int(n)


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
    n = _thread_count(n, "set_num_threads")
    _num_threads[0] = n
    from ..native import set_num_threads as native_threads

    native_threads(n)


@contextlib.contextmanager
def using_threads(n: int | None):
    """Run the block's kernels on ``n`` threads, in the calling Python thread only.

    Other Python threads keep the process's count (``set_num_threads``); a model loaded with
    ``LoadOptions(threads=n)`` runs each call this way. ``None`` leaves the count as it is.

    Raises
    ------
    InputError
        ``n`` is not None or an integer from 1 to ``MAX_THREADS``.

    Examples
    --------
    >>> with fastlayers.using_threads(1):
    ...     y = model(x)
    """
    if n is None:
        yield
        return
    n = _thread_count(n, "using_threads")
    from ..native import set_call_threads

    previous = set_call_threads(n)
    try:
        yield
    finally:
        set_call_threads(previous)


#: Longest idle spin ``set_idle_spin`` accepts, in seconds (the pool's own bound).
MAX_IDLE_SPIN = 1.0


def set_idle_spin(seconds: float) -> None:
    """Let the thread pool's idle workers poll for the next call for ``seconds`` before they
    sleep (default 0.0002, or ``FASTLAYERS_IDLE_SPIN_US`` at import).

    Calls that come back to back find the workers awake either way. Calls spaced out as a
    service makes them (a request every 10-100 ms) find sleeping workers whose cores went idle,
    and on a virtual machine the host hands an idle core's time and caches to others: such a
    call can take twice as long as a back-to-back one, at 2 threads more than at 1. A spin
    as long as the gap between calls keeps the workers' cores running, as onnxruntime's
    spinning workers do, and costs that much CPU per worker after each call (a 50 ms spin at
    20 calls a second: one core's worth per worker). Set it where latency matters more than
    the CPU an idle process burns; 0 sleeps at once. Polling workers follow a new value at
    once, sleeping ones from the end of the next call.

    Raises
    ------
    InputError
        ``seconds`` is not a number from 0 to ``MAX_IDLE_SPIN`` (1.0).

    Examples
    --------
    >>> fastlayers.set_idle_spin(0.05)   # a service answering about 20 requests a second
    """
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not 0 <= seconds <= MAX_IDLE_SPIN:
        raise InputError(f"set_idle_spin expects seconds from 0 to {MAX_IDLE_SPIN}, got {seconds!r}")
    from ..native import set_spin_ns

    set_spin_ns(round(float(seconds) * 1e9))


def get_idle_spin() -> float:
    """Seconds the pool's idle workers poll for the next call before they sleep (``set_idle_spin``)."""
    from ..native import get_spin_ns

    return get_spin_ns() / 1e9


def get_num_threads() -> int | None:
    """The count set by ``set_num_threads``, or None when the libraries' defaults are in force."""
    return _num_threads[0]


def threads_in_use() -> int:
    """The threads a native call started now in this thread uses: the count of
    ``using_threads``, else of ``set_num_threads``, else the pool's default."""
    from ..native import get_num_threads as native_threads

    return native_threads()


class _Recording:
    """The active Ops object seen through a log: each method called is appended to ``log`` as
    ``"<backend>.<method>"``, and each of its integer kernels (``Ops.integer``) as
    ``"<backend>.integer.<kernel>"``; everything else (``name``, attributes) reads through
    unchanged."""

    def __init__(self, ops, log: list, prefix: str | None = None):
        self._ops, self._log = ops, log
        self._prefix = ops.name if prefix is None else prefix

    def __getattr__(self, attr):
        value = getattr(self._ops, attr)
        if attr == "integer" and value is not None and self._prefix == self._ops.name:
            return _Recording(value, self._log, f"{self._prefix}.integer")
        if not callable(value) or attr.startswith("__"):
            return value
        label = f"{self._prefix}.{attr}"
        log = self._log

        def call(*args, **kwargs):
            log.append(label)
            return value(*args, **kwargs)

        return call


@contextlib.contextmanager
def recording_calls(log: list):
    """Run the block on the active backend, appending to ``log`` the name of every backend
    method called in it (``"cpu.conv2d"``), in this thread's context; profiles use it to tell a
    step run by a backend kernel from one run in numpy.

    Examples
    --------
    >>> log = []
    >>> with recording_calls(log):
    ...     y = model(x)
    """
    ops = get_ops()
    key = f"{ops.name}+recording-{id(log)}"
    with _instances_lock:
        _instances[key] = _Recording(ops, log)
    token = _active.set(key)
    try:
        yield
    finally:
        _active.reset(token)
        with _instances_lock:
            _instances.pop(key, None)
