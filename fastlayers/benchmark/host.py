"""Where and with what the figures were taken: the CPU, the host and the versions."""

from __future__ import annotations

import os
import platform

import numpy as np

from ..version import __version__
from .engines import ONNXRUNTIME


def cpu_name() -> str | None:
    """The CPU's model name.

    Returns
    -------
    str or None
        The ``model name`` (or ``Hardware``, ``cpu model``, ...) field of /proc/cpuinfo where
        there is one, else ``platform.processor()``, else None.
    """
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                key, sep, value = line.partition(":")
                if sep and value.strip():
                    fields.setdefault(key.strip().lower(), value.strip())
        for key in ("model name", "hardware", "cpu model", "processor name", "uarch", "cpu"):
            if key in fields and not fields[key].isdigit():
                return fields[key]
    except OSError:
        pass
    return platform.processor() or None


def host_info() -> dict:
    """Where the figures were taken.

    Returns
    -------
    dict
        ``cpu`` (model name, or None), ``machine`` (``platform.machine()``), ``system``,
        ``cpu_count`` (``os.cpu_count()``), ``usable_cpus`` (the CPUs this process may run on),
        ``isa`` (the ISA path of fastlayers' kernels, ``fastlayers.native.isa()``) and, on the
        AVX-512 and AVX2 paths, ``vnni`` (whether the 8-bit products use VNNI's vpdpbusd).
    """
    from .. import native

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "isa": native.isa(),
    }
    if info["isa"] in ("avx512", "avx2"):
        info["vnni"] = bool(native.vnni())
    return info


def versions(against: str | None = None) -> dict:
    """The versions behind the figures.

    Parameters
    ----------
    against : str, optional
        The engine compared with (``"onnxruntime"``), whose version is added.

    Returns
    -------
    dict
        ``fastlayers``, ``numpy``, ``python`` and, with ``against``, ``onnxruntime``.
    """
    out = {"fastlayers": __version__, "numpy": np.__version__, "python": platform.python_version()}
    if against == ONNXRUNTIME:
        import onnxruntime

        out[ONNXRUNTIME] = onnxruntime.__version__
    return out
