"""Arrays derived from weights (re-laid-out, Winograd-transformed...), computed once per weight.

Kernels that want their weights in another form ask ``derived(w, kind, make)``: the first call
computes ``make(w)``, later calls with the same array object return that result. An entry holds
only a weak reference to ``w`` and is dropped when ``w`` is garbage collected, so a new array at
the same address is never mistaken for the old one.

Weights are therefore read once: replacing a layer's weights (``set_weights``,
``load_state_dict``, assigning a new array) takes effect at the next call, but writing into a
weight array in place after it has been used does not reach the derived forms; call
``clear_derived()`` after such an edit.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np

from ..native import CODES, _core

# Re-entrant: dropping an entry under the lock can free a source array whose weakref callback
# (``_forget``) then takes the lock again on the same thread.
_lock = threading.RLock()
_cache: dict[tuple[int, object], tuple[weakref.ref, object]] = {}
#: Counts ``clear_derived()`` calls: what holds derived arrays beyond one call (a model's bound
#: steps) compares it with the count it saw and rebinds when it changed.
_generation = [0]


def _forget(key, ref, _lock=_lock, _cache=_cache) -> None:
    # the module's globals are bound as defaults: at interpreter exit they may be gone already
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is ref:
            del _cache[key]


def derived(source, kind, make: Callable):
    """``make(source)``, cached per (``source`` object, ``kind``: a name, or any hashable
    key) for as long as ``source`` lives."""
    key = (id(source), kind)
    hit = _cache.get(key)
    if hit is not None and hit[0]() is source:
        return hit[1]
    value = make(source)
    try:
        ref = weakref.ref(source, lambda r, key=key, forget=_forget: forget(key, r))
    except TypeError:  # not weak-referenceable: nothing to key the cache on
        return value
    with _lock:
        _cache[key] = (ref, value)
    return value


def derived_view(view, kind: str, make: Callable):
    """``make(view)`` cached like ``derived``, for an array that may be a view: keyed by the
    array it views, its offset, shape, strides and dtype, so views made anew per call (a slice
    of a weight) find the entry too."""
    if not hasattr(view, "base") or view.base is None:
        return derived(view, kind, make)
    key = (id(view), kind)
    hit = _cache.get(key)
    if hit is not None and hit[0]() is view:  # this view object asked before: no key to build
        return hit[1]
    root = view
    while isinstance(root.base, np.ndarray) or getattr(root.base, "__array_interface__", None) is not None:
        root = root.base
    if type(view) is np.ndarray and type(root) is np.ndarray:
        offset = _core.data_address(view) - _core.data_address(root)
    else:
        offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    value = derived(root, (kind, offset, view.shape, view.strides, view.dtype.char), lambda _: make(view))
    # also under the view itself: a view kept between calls (an ONNX initializer, a view of the
    # file's bytes) finds it at once
    try:
        ref = weakref.ref(view, lambda r, key=key, forget=_forget: forget(key, r))
    except TypeError:
        return value
    with _lock:
        _cache[key] = (ref, value)
    return value


#: Entries ``derived_from`` keeps per first source: one per set of other sources, so that
#: consumers sharing their first array (layers whose identical initializers an exporter stored
#: once, e.g. the untrained clones of a deep ``nn.TransformerEncoder``) each keep theirs
#: instead of recomputing on every call; the bound caps what stale entries (other sources
#: replaced while the first stays) can hold.
DERIVED_FROM_ENTRIES = 64


def derived_from(sources: tuple, kind: str, make: Callable):
    """``make(*sources)``, cached per (``sources[0]``, ``kind``) and the other sources' objects.

    Each set of other sources has its entry (the entry holds them, so their ids are not reused
    while it lives), up to ``DERIVED_FROM_ENTRIES`` per first source, the oldest dropped first:
    other sources replaced by new objects compute a new entry."""
    box = derived(sources[0], kind, lambda _: {})
    key = tuple(map(id, sources[1:]))
    hit = box.get(key)
    if hit is not None:
        return hit[1]
    value = make(*sources)
    with _lock:
        box[key] = (tuple(sources[1:]), value)
        while len(box) > DERIVED_FROM_ENTRIES:
            del box[next(iter(box))]
    return value


def clear_derived() -> None:
    """Forget every derived weight (needed only after writing into a used weight array in place)."""
    with _lock:
        entries = dict(_cache)
        _cache.clear()
        _generation[0] += 1
    del entries  # the entries are freed (and their callbacks run) outside the lock


def derived_generation() -> int:
    """How many times ``clear_derived()`` ran (bound steps made before a change are stale)."""
    return _generation[0]


def fold_projection(table_ve, w_eg, b_g=None):
    """The input projection of every embedding row: table @ w + b, (V, G) float32 C-ordered,
    on the native sgemm and fastlayers' threads (numpy's BLAS threads are not started)."""
    table = np.ascontiguousarray(table_ve, dtype=np.float32)
    w = np.ascontiguousarray(w_eg, dtype=np.float32)
    bias = None if b_g is None else np.ascontiguousarray(b_g, dtype=np.float32).reshape(-1)
    folded = np.empty((table.shape[0], w.shape[1]), np.float32)
    return _core.matmul(table, w, folded, None, bias, CODES["linear"], 0.0)
