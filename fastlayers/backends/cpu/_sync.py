"""A spinning barrier for the shares of one ``prange`` region that must meet once per step.

The recurrent loops split each step's units among threads; step ``s + 1`` needs all of step
``s``'s hidden state. Ending the parallel region every step and starting a new one costs about
2.5 us on this project's VM (OpenMP fork/join, measured with a 10 000-step loop), a barrier
inside one region a fraction of that. Numba has no atomics on the CPU, so the two it needs are
written here as LLVM intrinsics (``atomicrmw add`` and ``load atomic acquire`` on an int64).

``sync`` is a 2-element int64 array: ``sync[0]`` counts arrivals (barrier number ``n`` is passed
when it reaches ``n * parts``), ``sync[1]`` is set when a share gave up. A share gives up after
``SPIN_LIMIT`` polls (about 80 ms on this project's VM: a poll takes a cycle), so that a
runtime that ran the shares one after the other instead of at once cannot hang the call: every
share then returns early and the caller runs the work again serially (``aborted``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._jit import njit

#: Polls of the counter before a share gives up (see the module doc).
SPIN_LIMIT = 1 << 28


def _item_pointer(context, builder, ary_type, ary, idx):
    array = context.make_array(ary_type)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, ary_type, array, [idx])


@intrinsic
def atomic_add(typingctx, ary, idx, val):
    """ary[idx] += val as one sequentially consistent read-modify-write (int64 ``ary``)."""
    if not (isinstance(ary, types.Array) and ary.dtype == types.int64 and ary.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, value, "seq_cst")

    return types.int64(ary, idx, val), codegen


@intrinsic
def atomic_load(typingctx, ary, idx):
    """ary[idx] read with acquire ordering (int64 ``ary``)."""
    if not (isinstance(ary, types.Array) and ary.dtype == types.int64 and ary.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        ptr = _item_pointer(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", ir.IntType(64).width // 8)

    return types.int64(ary, idx), codegen


@njit(inline=True)
def barrier(sync, parts, number):
    """Wait until all ``parts`` shares reached barrier ``number`` (1, 2, ...); False when a share
    gave up (the caller must return at once). A single share never waits."""
    if parts <= 1:
        return True
    atomic_add(sync, 0, 1)
    target = number * parts
    polls = 0
    while atomic_load(sync, 0) < target:
        if atomic_load(sync, 1) != 0:
            return False
        polls += 1
        if polls > SPIN_LIMIT:
            atomic_add(sync, 1, 1)
            return False
    return atomic_load(sync, 1) == 0


def aborted(sync) -> bool:
    """Whether a share gave up in the region that used ``sync``."""
    return bool(sync[1])


@njit(parallel=True)
def _start_threads(out):
    """A trivial parallel region (out[p] = p): starts Numba's threading layer."""
    for p in prange(out.shape[0]):
        out[p] = p


_layer: list[str] = []


def barrier_safe() -> bool:
    """Whether Numba's threading layer runs the shares of a region at the same time, as a
    barrier needs: OpenMP gives each thread of its team one share; TBB may run two shares one
    after the other on one thread (the ``SPIN_LIMIT`` fallback would then cost every call)."""
    if not _layer:
        import numba

        try:
            name = numba.threading_layer()
        except ValueError:      # no parallel region has run yet
            _start_threads(np.zeros(2, np.int64))
            name = numba.threading_layer()
        _layer.append(name)
    return _layer[0] == "omp"
