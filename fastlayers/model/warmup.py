"""Warm-up runs: a model runs once on zeros when it is loaded, so that its first real call finds
its weights packed (``backends/derived.py``), its buffers allocated and fastlayers' threads
started, and costs about what later calls cost.

One rule decides whether a model is warmed up, for every kind of model (``in_proportion``): its
inputs can be made (``MAX_ELEMENTS``), and the largest tensor known before the run (a layer
graph's largest activation, an ONNX graph's inputs) holds at most ``PROPORTION_FLOOR`` elements or
at most as many as the model's weights, so that the run's work stays in proportion to the file (a
file of a few KB declaring a sequence of 10**6 steps through attention would otherwise run for
hours inside ``load``).

A run that takes under ``REPEAT_BELOW_S`` is repeated, up to ``MAX_RUNS`` runs: for small models
the Python around the kernels is most of a call, and CPython specializes a function's bytecode
only after it has run several times (the demo MLP's second call took 2.5x its steady time, its
ninth about 1.1x).

Without it, a first call packs weights, transforms Winograd kernels and folds embeddings, and
takes several times a steady call (figures: docs/design.md, "Figures behind the code's
constants").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

#: Inputs larger than this many elements in all are not made: the warm-up is skipped.
MAX_ELEMENTS = 1 << 22
#: The size given to a free dimension other than the leading (batch) one.
FREE_SIZE = 8
#: A warm-up runs where its largest known tensor holds at most this many elements, or at most as
#: many as the model's weights (``in_proportion``).
PROPORTION_FLOOR = 1 << 16
#: A run faster than this (seconds) is repeated, up to MAX_RUNS runs in all.
REPEAT_BELOW_S = 1e-3
MAX_RUNS = 8


def in_proportion(tensor_elements: int, weight_elements: int) -> bool:
    """Whether a warm-up whose largest known tensor holds ``tensor_elements`` elements runs, for
    a model of ``weight_elements`` weight elements: the module's one rule."""
    return tensor_elements <= MAX_ELEMENTS and tensor_elements <= max(PROPORTION_FLOOR, weight_elements)


def zeros_like_inputs(specs: Sequence[tuple]) -> list[np.ndarray] | None:
    """One array of zeros per (shape, dtype) input spec: free dimensions (None) get 1 where they
    lead (the batch) and ``FREE_SIZE`` elsewhere. None where a shape is unknown or the arrays
    would exceed ``MAX_ELEMENTS``."""
    arrays, total = [], 0
    for shape, dtype in specs:
        if shape is None:
            return None
        dims = tuple((1 if k == 0 else FREE_SIZE) if d is None else d for k, d in enumerate(shape))
        total += int(np.prod(dims, dtype=np.int64))
        if total > MAX_ELEMENTS:
            return None
        arrays.append(np.zeros(dims, dtype))
    return arrays


def warm_up(run: Callable[[list], object], specs: Sequence[tuple]) -> bool:
    """``run(zeros_like_inputs(specs))``, repeated while it is quick; whether it ran. A failure (zeros the model refuses,
    free sizes it cannot take) is not an error: the first real call then does the work."""
    arrays = zeros_like_inputs(specs)
    if arrays is None:
        return False
    try:
        for _ in range(MAX_RUNS):
            start = time.perf_counter()
            run(arrays)
            if time.perf_counter() - start >= REPEAT_BELOW_S:
                break
    except Exception:  # noqa: BLE001 - an optimisation only
        return False
    return True
