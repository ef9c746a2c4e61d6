"""Modules with a ``forward`` of their own (a user's ``nn.Module`` subclass) run as ONNX plans.

The first call at an input shape runs ``forward`` on a ``Traced`` value: the array the module
path computes, with the name of its value in an ONNX graph being written. A fastlayers module
called on it writes its ONNX form (``plans.FORMS``) and computes its array as the module path
does; so do the functional activations (``nn.functional``: relu, gelu, softmax ...); numpy
arithmetic (``+ - * / @``, ``np.maximum`` / ``np.minimum`` / ``np.tanh`` / ``np.exp`` /
``np.sqrt``), ``reshape``, ``transpose``, ``flatten``, ``mean`` / ``sum`` and
``np.concatenate`` write their nodes; a nested module of one's own is traced through its
``forward``. That call returns the arrays the module path computed, and the graph becomes an
``OnnxModel`` for that input shape (imported as an exported file is: fusions, native plans),
kept where its outputs on the traced input agree with those arrays. Shapes read in
``forward`` (``x.shape[0]``) are constants of the graph, which is why each input shape has its
own (at most ``MAX_SHAPES`` per module). A forward of several arrays is traced on all of them.

Anything the trace cannot write ends it (``NotTraced``): a module without a form, a branch on
a value (``if x.mean() > 0``), an index, another numpy function, a float64 result. That shape
then keeps the module path, whose call runs ``forward`` again on arrays (code with side
effects in ``forward`` runs them twice on that first call). Only modules holding a Linear or a
convolution (``plans.PRODUCTS``) are traced, on the cpu backend, with ``native_plans`` on; a
compiled call that raises a fastlayers error runs the module path, whose own checks name the
error. What is compiled is rebuilt after any module changes (``module.state_version``) or
``clear_derived``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from types import SimpleNamespace

import numpy as np

from .. import settings
from ..backends import get_ops
from ..backends.derived import derived_generation
from ..errors import FastlayersError
from . import plans
from .module import TRACES, attach_tracer, state_version
from .traced import NotTraced, Traced, graph_of, set_graph, tracing

_FLOAT32 = np.dtype(np.float32)
#: Input shapes a module keeps compiled models for (then they are all dropped).
MAX_SHAPES = 8


def traced_args(args) -> bool:
    """Whether this thread is tracing and ``args`` hold a traced value."""
    return tracing() and any(isinstance(a, Traced) for a in args)


def module_call(m, args, kwargs):
    """A module called on a traced value: its ONNX form and its module-path value, or its
    own ``forward`` traced (a module of one's own); else NotTraced."""
    form = plans.FORMS.get(plans.class_name(m))
    if form is not None and len(args) == 1 and not kwargs and isinstance(args[0], Traced):
        x = args[0]
        try:
            name, _ = form(graph_of(), m, x.name, x.ndim)
        except plans.NoForm:
            raise NotTraced from None
        return Traced(name, m(x.value))
    if type(m).traceable:
        return m.forward(*args, **kwargs)
    raise NotTraced


def functional(fn, module_class: str, x: Traced, value_kwargs: dict, **settings_of) -> Traced:
    """``fn`` (an ``nn.functional`` function) on a traced value: the form of the module
    ``module_class`` (set as ``settings_of``), its value ``fn(x.value, **value_kwargs)``."""
    try:
        name, _ = plans.FORMS[module_class](graph_of(), SimpleNamespace(**settings_of), x.name, x.ndim)
    except plans.NoForm:
        raise NotTraced from None
    return Traced(name, fn(x.value, **value_kwargs))


#: module -> {input shapes (one per array): ((state version, derived generation), OnnxModel or
#: None, output kind: None for one array, else tuple or list)}.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _input_names(count: int) -> list[str]:
    return ["input"] if count == 1 else [f"input_{k}" for k in range(count)]


def _trace_forward(m, xs: tuple):
    """``m``'s forward traced on the arrays ``xs``: (the module path's output, OnnxModel or
    None, output kind); raises NotTraced (or what ``forward`` raised) where the trace cannot
    follow."""
    from ..onnx.writer import GraphWriter  # here: modules that are never traced never import onnx/

    g = GraphWriter()
    inputs = _input_names(len(xs))
    set_graph(g)
    with _lock:
        TRACES[0] += 1
    try:
        out = m.forward(*(Traced(name, x) for name, x in zip(inputs, xs)))
    finally:
        set_graph(None)
        with _lock:
            TRACES[0] -= 1
    kind = None if isinstance(out, Traced) else type(out)
    outs = [out] if kind is None else list(out) if kind in (tuple, list) else None
    if not outs or not all(isinstance(o, Traced) for o in outs):
        raise NotTraced
    values = [o.value for o in outs]
    names = [o.name for o in outs]
    if set(names) & set(inputs):  # an input given back: no work to compile
        return _shaped(kind, values), None, kind
    for k, name in enumerate(names):  # one value given twice
        if name in names[:k]:
            names[k] = g.node("Identity", [name], "again")
    model = g.model(type(m).__name__, [(name, x.ndim) for name, x in zip(inputs, xs)], names)
    got = model(*xs)
    got = got if isinstance(got, list) else [got]
    agree = len(got) == len(values) and all(
        a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True) for a, b in zip(got, values)
    )
    return _shaped(kind, values), (model if agree else None), kind


def _shaped(kind, values):
    return values[0] if kind is None else kind(values)


def compiled_call(m, args, kwargs):
    """``m(*args, **kwargs)`` (float32 arrays, no keywords) through its compiled model for
    these input shapes where one serves, the first call at new shapes tracing it (see the
    module docstring); else None. Shapes known to keep the module path cost two lookups (a
    module of one's own without a product is called as often as any)."""
    if kwargs or not args:
        return None
    for x in args:
        if type(x) is not np.ndarray or x.dtype is not _FLOAT32 or not x.ndim:
            return None
    shapes = tuple(x.shape for x in args)
    if type(m).__hash__ is None:  # a class defining __eq__ alone: no table can key it
        return None
    entries = _COMPILED.get(m)
    hit = None if entries is None else entries.get(shapes)
    stamp = (state_version(), derived_generation())
    if hit is not None and hit[0] == stamp and hit[1] is None:
        return None
    if get_ops().name != "cpu" or not settings.current().native_plans or (TRACES[0] and tracing()):
        return None
    if hit is not None and hit[0] == stamp:
        try:
            y = hit[1](*args)
        except FastlayersError:  # the modules' own checks name what is wrong
            return None
        return _shaped(hit[2], y if isinstance(y, list) else [y])
    if not plans.holds_product(m):
        out, model, kind = None, None, None
    else:
        try:
            out, model, kind = _trace_forward(m, args)
        except Exception:  # noqa: BLE001 - what the trace cannot follow runs the module path
            out, model, kind = None, None, None
    with _lock:
        entries = _COMPILED.setdefault(m, {})
        if len(entries) >= MAX_SHAPES and shapes not in entries:
            entries.clear()
        entries[shapes] = (stamp, model, kind)
    return out


attach_tracer(sys.modules[__name__])
