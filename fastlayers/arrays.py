"""Array helpers used at every level: input casting and the text of shapes in messages."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import InputError, ShapeError


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf names: no limit known
        return 1 << 62


#: The most bytes one input array may describe (elements times item size): this machine's
#: physical memory. Only a view can claim more (a zero-stride ``np.broadcast_to``), and a model
#: would then allocate outputs in proportion and fail in the C library or numpy.
MAX_INPUT_BYTES = _physical_memory()


def plain(a: np.ndarray) -> bool:
    """Whether ``a`` can go to the kernels as it is: aligned to its item size, and describing
    no more than ``MAX_INPUT_BYTES``."""
    return a.flags.aligned and a.nbytes <= MAX_INPUT_BYTES


def checked(a: np.ndarray, where: str, itemsize: int | None = None) -> np.ndarray:
    """``a`` ready for the kernels: refused (``InputError``) when it describes more than
    ``MAX_INPUT_BYTES`` (at ``itemsize`` bytes an element, default its own), copied when its
    data is not aligned to its item size (a view into a ``bytes`` buffer at an odd offset),
    else itself."""
    nbytes = a.size * (itemsize or a.itemsize)
    if nbytes > MAX_INPUT_BYTES:
        raise InputError(
            f"{where}: an array of shape {a.shape} describes {nbytes / 2**30:.1f} "
            f"GiB, more than this machine's memory ({MAX_INPUT_BYTES / 2**30:.1f} "
            "GiB); a broadcast (zero-stride) view of that size cannot be computed on"
        )
    return a if a.flags.aligned else a.copy()


def as_array(x: Any, where: str) -> np.ndarray:
    """``np.asarray(x)``, a ragged nested list refused with a ``ShapeError`` naming ``where``
    (numpy's own error names neither the model nor the input)."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:  # numpy on ragged nested lists
        raise ShapeError(f"{where}: not a rectangular numeric array ({e})") from None


def as_float32(x: Any, where: str) -> np.ndarray:
    """Cast a numeric input to float32 (bool, int, uint, float16/64); refuse other dtypes,
    ragged nested lists (``as_array``) and arrays larger than memory (``checked``); an
    unaligned float32 array is copied. float64 values beyond float32's range become inf,
    without a warning."""
    a = as_array(x, where)
    if a.dtype == np.float32:
        return a if plain(a) else checked(a, where)
    if a.dtype.kind not in "biuf":
        raise ShapeError(f"{where}: expected a numeric array (cast to float32), got dtype {a.dtype}")
    checked(a, where, itemsize=4)  # the size only: astype makes an aligned copy
    with np.errstate(over="ignore"):
        return a.astype(np.float32)


def shape_str(shape) -> str:
    """``(None, 4)`` style text of a shape with unknown sizes."""
    inner = ", ".join("None" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"
