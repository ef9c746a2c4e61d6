"""fastlayers' compiled CPU core (``_core``, built at install from ``native/*.c``).

The kernels run on the best ISA path this CPU has (AVX-512F, AVX2+FMA or portable C), chosen
at import; ``FASTLAYERS_ISA=avx512|avx2|generic`` forces one (an error when this CPU cannot
run it) and ``set_isa`` switches at run time (the tests run every path this way). The 8-bit
integer products run VNNI's vpdpbusd where the path and CPU have it: AVX-512 VNNI on the avx512
path, AVX-VNNI (or AVX-512 VNNI with VL) on the avx2 path (``vnni``; ``set_vnni(False)`` runs
them as on a CPU without); products of 8 rows or more run on AMX tiles (tdpbusd) where the
CPU has AMX-INT8 and Linux lets the process use it (``amx``; ``set_amx(False)`` runs them on
VNNI).
"""

from __future__ import annotations

import os

try:
    from . import _core
except ImportError as e:  # a source tree whose extension was never built
    from ..errors import native_core_missing

    raise ImportError(native_core_missing(os.path.dirname(os.path.dirname(__file__)))) from e

from ..errors import SettingError
from ..settings import env_choice, env_int
from ._core import (  # noqa: F401
    ACTIVATIONS,
    NativeError,
    amx,
    amx_runs,
    arena_limit,
    arena_release,
    arena_stats,
    best_isa,
    get_num_threads,
    get_spin_ns,
    heap_retain,
    heap_trim,
    isa,
    isa_runs,
    isas,
    set_amx,
    set_call_threads,
    set_isa,
    set_num_threads,
    set_spin_ns,
    set_vnni,
    vnni,
    vnni_runs,
)

#: Activation name -> code of the native kernels.
CODES = {name: code for code, name in enumerate(ACTIVATIONS)}


def available_isas() -> list[str]:
    """The ISA paths this CPU can run, best first."""
    return [name for name in isas() if isa_runs(name)]


_forced = env_choice("FASTLAYERS_ISA", isas(), "")
if _forced:
    try:
        set_isa(_forced)
    except ValueError as e:
        raise SettingError(f"environment variable FASTLAYERS_ISA={_forced!r}: {e}") from None
else:
    set_isa(best_isa())

#: How long idle pool workers poll for the next job before they sleep (``set_spin_ns``;
#: ``fastlayers.set_idle_spin``), from ``FASTLAYERS_IDLE_SPIN_US`` where set.
IDLE_SPIN_US_MAX = 1_000_000
_spin_us = env_int("FASTLAYERS_IDLE_SPIN_US", get_spin_ns() // 1000, minimum=0)
if _spin_us > IDLE_SPIN_US_MAX:
    raise SettingError(f"environment variable FASTLAYERS_IDLE_SPIN_US={_spin_us} must be at most {IDLE_SPIN_US_MAX}")
set_spin_ns(_spin_us * 1000)

#: The C library heap's settings at import (``heap_retain``, glibc only): blocks under 32 MiB
#: from its heap, up to 64 MiB of freed memory kept mapped, so that the outputs each call
#: allocates reuse mapped pages instead of faulting fresh ones in (docs/design.md, "Figures
#: behind the code's constants"). ``FASTLAYERS_HEAP=system`` leaves the C library's defaults.
HEAP_RETAIN = (32 << 20, 64 << 20)
_heap = env_choice("FASTLAYERS_HEAP", ("retain", "system"), "retain")
HEAP_RETAINED = _heap != "system" and heap_retain(*HEAP_RETAIN)
#: Whether a model's call allocates its arrays from the native block arena (``arena_enter``,
#: arena.h): large blocks kept mapped between calls whatever else in the process trims the C
#: library's heap. ``FASTLAYERS_HEAP=system`` turns it off with the heap settings.
ARENA = _heap != "system"


def trim_heap() -> bool:
    """Hand the free pages of the C library's heap back to the system where fastlayers keeps
    them mapped (``HEAP_RETAINED``): after a load, what the reader and the optimiser freed (a
    file's weights replaced by their re-laid-out forms, in blocks under the 32 MiB threshold)
    would otherwise stay mapped, and the derived weights made next (mapped apart) would add to
    it. Calls allocate from the native arena, which this leaves alone. Whether any was released."""
    return HEAP_RETAINED and heap_trim()


def arena_enter():
    """Have numpy allocate from the native block arena in the calling thread's context until
    ``arena_exit`` (a no-op with ``FASTLAYERS_HEAP=system``); returns what to pass to it."""
    return _core.arena_enter() if ARENA else None


def arena_leave():
    """Have numpy allocate with its own allocator in the calling thread's context until
    ``arena_exit`` (inside a model's call: what should not stay in the block arena); returns
    what to pass to it."""
    return _core.arena_leave() if ARENA else None


def arena_exit(previous) -> None:
    """End what ``arena_enter`` began (``previous``: its result)."""
    if previous is not None:
        _core.arena_exit(previous)
