"""Array helpers used at every level: input casting and the text of shapes in messages."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ShapeError


def as_float32(x: Any, where: str) -> np.ndarray:
    """Cast a numeric input to float32 (bool, int, uint, float16/64); refuse other dtypes and
    ragged nested lists. float64 values beyond float32's range become inf, without a warning."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:  # numpy on ragged nested lists
        raise ShapeError(f"{where}: not a rectangular numeric array ({e})") from None
    if a.dtype == np.float32:
        return a
    if a.dtype.kind not in "biuf":
        raise ShapeError(f"{where}: expected a numeric array (cast to float32), got dtype {a.dtype}")
    with np.errstate(over="ignore"):
        return a.astype(np.float32)


def shape_str(shape) -> str:
    """``(None, 4)`` style text of a shape with unknown sizes."""
    inner = ", ".join("None" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"
