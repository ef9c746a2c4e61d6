"""``OnnxModel``: an imported ONNX graph and its execution (``importer.from_model`` makes it).

Execution walks the kept nodes in order with a value table local to the call, so one model
serves many threads; batch size and sequence length may vary from call to call. An operator
failing on the inputs of a call raises an ``InputError`` (or its own fastlayers error) naming
the node; tensors whose size the graph's values set are limited (``onnx_max_created_bytes``).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .. import settings
from ..arrays import as_array, checked, plain
from ..backends import get_ops, using_threads
from ..errors import FastlayersError, InputError, ShapeError, UnsupportedError
from ..model.warmup import FREE_SIZE, in_proportion, warm_up
from . import (
    check,
)
from .compiled import Parts, compile_plan
from .control import Body, taken_branch
from .fold import NONDETERMINISTIC, has_loop
from .layout import contiguous
from .lowering import NativePlans
from .nodes import owner
from .ops import NODE_CACHES, OPS, bind
from .tensors import DTYPES
from .weights import held

#: TensorProto.DataType -> the type string onnxruntime's ``NodeArg.type`` gives.
ORT_TYPES = {
    t: f"tensor({n})"
    for t, n in enumerate(
        [
            "",
            "float",
            "uint8",
            "int8",
            "uint16",
            "int16",
            "int32",
            "int64",
            "string",
            "bool",
            "float16",
            "double",
            "uint32",
            "uint64",
            "complex64",
            "complex128",
            "bfloat16",
            "float8e4m3fn",
            "float8e4m3fnuz",
            "float8e5m2",
            "float8e5m2fnuz",
            "uint4",
            "int4",
            "float4e2m1",
            "float8e8m0",
            "uint2",
            "int2",
            "float6e2m3",
            "float6e3m2",
        ]
    )
    if n
}


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as the model file declares it, as onnxruntime's ``NodeArg``.

    Attributes
    ----------
    name : str
    shape : list
        One entry per dimension: an int where the file fixes it, the dim_param string where it
        names it, None where it does neither; [] for a scalar or a value declared without a shape.
    type : str or None
        onnxruntime's type string, e.g. 'tensor(float)', 'tensor(int64)'; None where the file
        declares no tensor type.
    """

    name: str
    shape: list = field(hash=False)
    type: str | None


def _dead_after(nodes, kept) -> list[tuple]:
    """Per node, the values no later node reads (its inputs read for the last time, its outputs
    nobody reads), but for those in ``kept`` (graph inputs and outputs, cached shapes): a call
    drops them from its value table there, so that their memory is freed (back to the block
    arena, warm for the next node's output) as soon as the graph is done with them, not at the
    end of the call."""
    last: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for i in n.inputs:
            if i:
                last[i] = k
    dead: list[list] = [[] for _ in nodes]
    for k, n in enumerate(nodes):
        for o in n.outputs:
            if o and o not in last and o not in kept:
                dead[k].append(o)
    for name, k in last.items():
        if name not in kept:
            dead[k].append(name)
    return [tuple(d) for d in dead]


class OnnxModel:
    """A model imported from ONNX, run on fastlayers primitives.

    Call it like a fastlayers model: ``model(x)``, ``model(x1, x2)``, ``model([x1, x2])`` or
    ``model({"input_name": x})``; it returns one array or a list (one per graph output).
    Or like an ``onnxruntime.InferenceSession``: ``run``, ``get_inputs``, ``get_outputs``.

    ``declared``: (inputs, outputs) as the file declares them, each a list of ``_declared``
    tuples, and the initializers the file also lists as graph inputs (None: from ``inputs``,
    with no output information).
    """

    #: Threads each call of this model uses (None: the process's count,
    #: ``fastlayers.set_num_threads``), as onnxruntime's ``intra_op_num_threads``;
    #: ``fastlayers.LoadOptions(threads=...)`` sets it at load.
    num_threads: int | None = None

    def __init__(self, name, inputs, outputs, constants, nodes, opset, shapes, where, declared=None, source=None):
        self.name, self.opset, self._where = name, opset, where
        self._inputs = inputs  # [(name, numpy dtype, shape with None for symbolic dims)]
        self.output_names = list(outputs)
        if declared is None:
            types = {np.dtype(t): ORT_TYPES[k] for k, t in DTYPES.items()}
            declared = ([(n, types[d], tuple(s or ())) for n, d, s in inputs], [(n, None, ()) for n in outputs], ())
        self._declared_inputs, self._declared_outputs, self._initializer_inputs = declared
        self._constant_owners = {id(owner(c)) for c in constants.values()}
        self._constants = constants
        self._nodes = nodes
        self._shapes = shapes
        # the limits its calls check (onnx_max_created_bytes, onnx_max_loop_iterations): those
        # in force when it was loaded, where they are not the process's defaults
        options = settings.current()
        self._options = None if options is settings.DEFAULT else options
        self._source = source
        # Nodes computing only from input shapes (Shape, Size and what combines them with
        # constants) give the same values for the same input shapes: their outputs are cached
        # per input-shape key and skipped on later calls.
        shape_only: set[str] = set()
        for n in nodes:
            if n.op_type in ("Shape", "Size") or (
                n.op_type not in NONDETERMINISTIC and all(not i or i in constants or i in shape_only for i in n.inputs)
            ):
                shape_only.update(o for o in n.outputs if o)
        self._plan = [
            (
                OPS[n.op_type],
                [None if not i else (constants[i] if i in constants else i) for i in n.inputs],
                n.outputs,
                _with_fresh_caches(n.op_type, n.attrs),
                any(o in shape_only for o in n.outputs),
            )
            for n in nodes
        ]
        self._quiet = _quiet_activations(nodes)
        self._input_checks = [(dtype, _fixed_tail(shape)) for _, dtype, shape in inputs]
        self._input_names = tuple(name for name, _, _ in inputs)
        self._shape_outputs = [o for n in nodes for o in n.outputs if o in shape_only]
        self._shape_cache: dict = {}
        self._compiled = None  # compiled.compile_plan's function, built at the first call
        self._bound: list | None = None  # _bound_plan's steps, built at the first call
        self._timed: list | None = None  # _timed_plan's steps, built at the first profile
        self._compiled_shapes: dict = {}
        # lowering.NativePlans: the calls' native plans by key, made at the first plain call
        # where the options allow them (None until then, False where they do not)
        self._native = None
        self._dead = _dead_after(nodes, {*self.output_names, *self._shape_outputs, *(name for name, _, _ in inputs)})

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    @property
    def where(self) -> str:
        """Where the model was imported from, as error messages name it: the file's path, or a
        description (``"ONNX model"``) for bytes and in-memory protos."""
        return self._where

    @property
    def source(self):
        """What a pickle of the model carries: the serialized ModelProto it was imported from
        (``io.onnx.from_bytes``: a buffer), a ``FileSource`` to read its file again (``io.onnx.load_onnx``:
        the model keeps no second copy of its file), or None (not self-contained: its weights lie
        in external data files)."""
        return self._source

    @property
    def op_types(self) -> list[str]:
        """The operators run per call, after optimisation, in order."""
        return [n.op_type for n in self._nodes]

    def _weights(self) -> list[np.ndarray]:
        """The arrays the optimised graph holds (or the backend's forms it holds in their
        place, ``weights.held``): constants, fused nodes' weights, and those of the subgraphs
        of its control-flow nodes."""
        arrays = list(self._constants.values())
        for n in self._nodes:
            for v in n.attrs.values():
                if isinstance(v, np.ndarray) or held(v):
                    arrays.append(v)
                elif isinstance(v, Body):
                    arrays += v.model._weights()
        return arrays

    def count_params(self) -> int:
        """The float32 weights the optimised graph holds (constants and fused nodes' weights,
        those of subgraphs included)."""
        unique = {id(a): a for a in self._weights() if a.dtype == np.float32}
        return int(sum(a.size for a in unique.values()))

    def _prepare(self, args, kwargs, strict=False):
        """The input arrays, checked and cast, in graph order. ``strict``: a name given that
        is not an input is an error (else it is ignored)."""
        feed = kwargs or (args[0] if len(args) == 1 and isinstance(args[0], dict) else None)
        if feed is None:
            if len(args) == len(self._input_checks) and self._fit(args):
                return args
        elif len(feed) == len(self._input_names):  # every input named once, no other name
            arrays = [feed.get(name) for name in self._input_names]
            if self._fit(arrays):
                return arrays
        if feed is not None:
            names = self.input_names
            arrays = [feed.get(name) for name in names]
            unknown = [k for k in feed if k not in names] if strict else None
            if unknown:
                folded = [k for k in unknown if k in self._initializer_inputs]
                raise InputError(
                    f"ONNX model {self.name!r}: unknown input name(s) {unknown}; its inputs are "
                    f"{names}"
                    + (
                        f" ({', '.join(map(repr, folded))}: initializer(s), constants of the graph that cannot be fed)"
                        if folded
                        else ""
                    )
                )
        elif len(args) == 1 and isinstance(args[0], (list, tuple)) and len(self._inputs) > 1:
            arrays = list(args[0])
        else:
            arrays = list(args)
        if len(arrays) != len(self._inputs) or any(a is None for a in arrays):
            missing = [n for n, a in zip(self.input_names, arrays) if a is None] if feed is not None else []
            raise ShapeError(
                f"ONNX model {self.name!r} expects inputs {self.input_names}, got "
                f"{len([a for a in arrays if a is not None])}" + (f"; missing {missing}" if missing else "")
            )
        out = []
        for (name, dtype, shape), a in zip(self._inputs, arrays):
            if (
                type(a) is np.ndarray
                and a.dtype == dtype
                and shape is not None
                and plain(a)
                and a.ndim == len(shape)
                and all(d is None or d == s for d, s in zip(shape, a.shape))
            ):
                out.append(a)  # the common case: the declared type and shape
                continue
            where = f"ONNX model {self.name!r} input {name!r}"
            a = as_array(a, where)
            if a.dtype.kind not in "biuf":
                raise ShapeError(f"{where}: expected a numeric array, got dtype {a.dtype}")
            a = checked(a, where, itemsize=np.dtype(dtype).itemsize).astype(dtype, copy=False)
            if shape is not None and (
                a.ndim != len(shape) or any(d is not None and d != s for d, s in zip(shape, a.shape))
            ):
                want = ", ".join("?" if d is None else str(d) for d in shape)
                raise ShapeError(f"ONNX model {self.name!r} input {name!r}: expected shape ({want}), got {a.shape}")
            out.append(a)
        return out

    def _fit(self, arrays) -> bool:
        """Whether ``arrays`` (in graph order) are arrays of the declared types and shapes, to
        be used as they are (``_prepare``'s common case)."""
        for a, (dtype, (free, tail, rank, exact)) in zip(arrays, self._input_checks):
            if not (type(a) is np.ndarray and a.dtype == dtype and a.ndim == rank and plain(a)):
                return False
            if not (
                a.shape[free:] == tail if exact else all(d is None or d == n for d, n in zip(tail, a.shape[free:]))
            ):
                return False
        return True

    def __call__(self, *args, **kwargs):
        results = self._results(self._evaluate(self._prepare(args, kwargs)), self.output_names)
        return results[0] if len(results) == 1 else results

    def _results(self, values, names, fresh=False) -> list[np.ndarray]:
        """The arrays of outputs ``names`` from the value table of a call, C-ordered (ops may
        pass NCHW views of NHWC memory along, ops._nchw). ``fresh``: arrays, copied where
        they would share memory with an input of the call or a constant of the model, as
        onnxruntime returns."""
        results = [values[o] if o in values else self._constants[o] for o in names]
        if not fresh:
            return [contiguous(r) for r in results]
        shared = self._constant_owners.union([id(owner(values[i])) for i, _, _ in self._inputs])
        return [
            r.copy() if r.flags.c_contiguous and id(owner(r)) in shared else contiguous(r)
            for r in map(np.asarray, results)
        ]

    def run(self, output_names, input_feed, run_options=None) -> list[np.ndarray]:
        """Run the graph once, as ``onnxruntime.InferenceSession.run``.

        Parameters
        ----------
        output_names : list of str or None
            The graph outputs to return, in this order; None or [] for all of them.
        input_feed : dict
            Input name -> array, one for each name of ``get_inputs()`` and no other; each is cast
            to the input's declared element type and checked against its declared shape.
        run_options : None
            onnxruntime's ``RunOptions``; only None is accepted.

        Returns
        -------
        list of ndarray
            One array per name of ``output_names``.

        Raises
        ------
        UnsupportedError
            For ``run_options`` other than None.
        InputError
            For an output name the graph does not have, an input name unknown to the graph,
            or an input missing from ``input_feed`` or of the wrong shape (``ShapeError``).
        """
        if run_options is not None:
            raise UnsupportedError(
                f"ONNX model {self.name!r}: run options are not supported "
                f"(got {type(run_options).__name__}; pass run_options=None)"
            )
        if isinstance(output_names, str):
            raise InputError(
                f"ONNX model {self.name!r}: output_names must be a list of names or None, "
                f"got the string {output_names!r}"
            )
        names = self.output_names
        if output_names:
            names = list(output_names)
            unknown = [o for o in names if o not in self.output_names]
            if unknown:
                raise InputError(
                    f"ONNX model {self.name!r}: unknown output name(s) {unknown}; its outputs are {self.output_names}"
                )
        if type(input_feed) is not dict:
            if not isinstance(input_feed, Mapping):
                raise InputError(
                    f"ONNX model {self.name!r}: input_feed must be a dict of input "
                    f"name -> array, got {type(input_feed).__name__}"
                )
            input_feed = dict(input_feed)
        values = self._evaluate(self._prepare((input_feed,), {}, strict=True))
        return self._results(values, names, fresh=True)

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs to feed, as the file declares them, as
        ``onnxruntime.InferenceSession.get_inputs``: initializers the file also lists as inputs
        are left out (fastlayers folds them into the graph).

        Returns
        -------
        list of NodeArg
            In graph order; ``shape`` holds ints, dim_param strings and None.
        """
        return [NodeArg(name, list(shape), type_) for name, type_, shape in self._declared_inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, as the file declares them, as
        ``onnxruntime.InferenceSession.get_outputs`` (which also fills in what its shape
        inference finds where the file is silent; see ``NodeArg``).

        Returns
        -------
        list of NodeArg
            In the order ``run(None, feed)`` returns them.
        """
        return [NodeArg(name, list(shape), type_) for name, type_, shape in self._declared_outputs]

    def _evaluate(self, arrays, clock=None, log=None, every_value=False) -> dict:
        """Run every node on the checked input ``arrays``; the table of values by name: the
        graph's inputs and outputs, or with ``every_value`` (or a ``log``) every value the
        call computed. ``clock``, ``log``: see ``_run_nodes``."""
        if self.num_threads is not None or self._options is not None:
            with settings.applied(self._options), using_threads(self.num_threads):
                return self._evaluate_here(arrays, clock, log, every_value)
        return self._evaluate_here(arrays, clock, log, every_value)

    def _evaluate_here(self, arrays, clock=None, log=None, every_value=False) -> dict:
        """``_evaluate`` in the options and threads in force."""
        ops = get_ops()
        token = ops.enter_call()
        try:
            if clock is None and log is None and not every_value:
                native = self._native
                if native is None:
                    native = self._native = NativePlans(self) if settings.current().native_plans else False
                if native:
                    values = native.run(arrays)
                    if values is not None:
                        return values
            if self._quiet is not None and self._quiet <= ops.quiet_activations:
                return self._run_nodes(arrays, clock, log, every_value)
            with np.errstate(all="ignore"):  # NaN and inf propagate, as in onnxruntime
                return self._run_nodes(arrays, clock, log, every_value)
        finally:
            ops.exit_call(token)

    def _run_nodes(self, arrays, clock=None, log=None, every_value=False) -> dict:
        """``_evaluate``'s walk over the plan, in whatever numpy error state the caller set.
        ``clock``: a list to append ``(step, seconds, backend calls)`` to per step run, the calls
        being the entries the step added to ``log`` (a ``recording_calls`` list, or None).
        Values are dropped after their last reader (``_dead_after``) unless ``every_value`` or
        ``log`` asks for all of them. A plain call runs the plan compiled into one function
        (``compiled.compile_plan``)."""
        if clock is None and log is None and not every_value:
            run = self._compiled
            if run is None:
                run = self._compiled = compile_plan(self._parts(), self._step_failed, self.opset) or False
            if run:
                return run(arrays, self._compiled_shapes)
        values = dict(zip(self._input_names, arrays))
        key = cached = None
        if self._shape_outputs:
            key = tuple((a.shape, a.dtype.str) for a in arrays)
            cached = self._shape_cache.get(key)
            if cached is not None:
                values.update(cached)
        outs, dead = None, (None if every_value or log is not None else self._dead)
        plan = self._plan if clock is None else self._timed_plan() if log is None else self._labeling_plan()
        try:
            for step, (fn, ins, outs, attrs, shape_only) in enumerate(plan):
                if shape_only and cached is not None:
                    continue
                args = [values[i] if type(i) is str else i for i in ins]
                if clock is None:
                    results = fn(args, attrs, self.opset)
                else:
                    results = self._timed_step(step, fn, args, attrs, clock, log)
                for name, value in zip(outs, results):
                    if name:
                        values[name] = value
                if dead and dead[step]:
                    for name in dead[step]:
                        values.pop(name, None)
        except Exception as e:  # noqa: BLE001 - an operator failing on these inputs, whatever it raised
            self._step_failed(next((k for k, n in enumerate(self._nodes) if n.outputs == outs), -1), e)
        if cached is None and self._shape_outputs:
            if len(self._shape_cache) >= 64:  # bound the memory of many distinct shapes
                self._shape_cache.clear()
            self._shape_cache[key] = {o: values[o] for o in self._shape_outputs}
        return values

    def _bound_plan(self) -> list:
        """The plan with each step bound on its constant inputs (``bound.bind``), as a plain
        call runs it: built once, shared by the compiled plan and the profile."""
        if self._bound is None:
            self._bound = [
                (bind(n.op_type, ins, attrs, self.opset) or fn, ins, outs, attrs, so)
                for n, (fn, ins, outs, attrs, so) in zip(self._nodes, self._plan)
            ]
        return self._bound

    def _timed_plan(self) -> list:
        """The plan a profile times: the bound steps, with each If whose branches are bodies
        marked (its function None) so that ``_timed_step`` runs and times the branch's steps."""
        if self._timed is None:
            self._timed = [
                (None if n.op_type == "If" and isinstance(attrs.get("then_branch"), Body) else fn, ins, outs, attrs, so)
                for n, (fn, ins, outs, attrs, so) in zip(self._nodes, self._bound_plan())
            ]
        return self._timed

    def _labeling_plan(self) -> list:
        """The plan a profile's first, untimed call runs to learn each step's kernel (the
        backend calls in ``log``): the timed plan's steps, each bound at its call on fresh node
        caches, so that the binding and the calls it makes happen inside the step. The bound
        plan's steps were bound at earlier calls, outside any recording, and many call the
        native core directly (a recurrent step's loop), which no recording sees."""
        plan = []
        for n, (fn, ins, outs, attrs, so), (timed, *_) in zip(self._nodes, self._plan, self._timed_plan()):
            # None: an If whose branch the timed plan descends into
            labeled = None if timed is None else functools.partial(_bind_and_run, n.op_type, ins, fn)
            plan.append((labeled, ins, outs, _with_fresh_caches(n.op_type, attrs), so))
        return plan

    def _timed_step(self, step, fn, inputs, attrs, clock, log) -> list:
        """Run plan step ``step`` (``fn`` on ``inputs``; None: an If, whose taken branch's
        steps are timed too) and append ``(step, seconds, backend calls, branch)`` to
        ``clock``: the calls are the entries the step added to ``log`` (a ``recording_calls``
        list, or None), ``branch`` None or, for an If, ``(attribute of the branch taken, its
        model, its own clock, its value table)``; an If's seconds are those of choosing the
        branch (what the compiled plan's ``if`` costs), its branch's steps being timed apart."""
        mark, t0 = len(log) if log is not None else 0, time.perf_counter()
        if fn is None:
            taken = taken_branch(inputs, attrs)
            seconds = time.perf_counter() - t0
            inner: list = []
            results, values = attrs[taken].run_timed([], inputs[attrs["_formal"] :], inner, log)
            clock.append(
                (step, seconds, log[mark:] if log is not None else (), (taken, attrs[taken].model, inner, values))
            )
            return results
        results = fn(inputs, attrs, self.opset)
        clock.append((step, time.perf_counter() - t0, log[mark:] if log is not None else (), None))
        return results

    def _parts(self) -> Parts:
        """The plan as ``compile_plan`` reads it: each step bound on its constant inputs
        (``bound.bind``), each If's branches with their own parts, to be compiled in."""
        plan = self._bound_plan()
        branches = {
            k: (attrs["then_branch"].model._parts(), attrs["else_branch"].model._parts())
            for k, (n, (_, _, _, attrs, _)) in enumerate(zip(self._nodes, self._plan))
            if n.op_type == "If"
            and isinstance(attrs.get("then_branch"), Body)
            and isinstance(attrs.get("else_branch"), Body)
        }
        return Parts(
            plan,
            self._input_names,
            self.output_names,
            self._constants,
            self._shape_outputs,
            self._dead,
            self._step_failed,
            branches,
        )

    def _step_failed(self, step, e):
        """Raise the error of plan step ``step`` (-1: unknown) having raised ``e``: the
        operator's own error with the node named, or an ``InputError`` naming it."""
        node = self._nodes[step] if 0 <= step < len(self._nodes) else None
        label = "?" if node is None else f"{check.short(node.name or node.outputs[0])} ({node.op_type})"
        if isinstance(e, FastlayersError):  # the operator's own error, with the node named
            raise type(e)(f"ONNX model {self.name!r}: node {label}: {e}") from None
        text = str(e) if isinstance(e, (IndexError, ValueError)) else f"{type(e).__name__}: {e}"
        raise InputError(f"ONNX model {self.name!r}: node {label} failed on these inputs: {text[:500]}") from e

    def profile(self, *args, repeats: int = 20, pause: float = 0.0, **kwargs):
        """Time one call on these inputs step by step, as onnxruntime's profiling does.

        Parameters
        ----------
        *args, **kwargs
            The inputs, as for calling the model.
        repeats : int
            Timed calls, after one untimed call (which also records each step's kernel); each
            step's time is its median over them.
        pause : float
            Seconds to sleep before each timed call (default 0: back to back). A service's
            calls come spaced out, and what a pause lets go cold (caches other processes
            refill, sleeping workers) shows in the steps that slow down.

        Returns
        -------
        fastlayers.onnx.profile.Profile
            Per step of the optimised graph: operator, what it fused, kernel (the backend
            methods it called, or ``numpy``), output layout, input and output shapes,
            milliseconds and share of the call; ``outputs_ms``, the time after the last step
            to hand the outputs back as C-ordered arrays (a move of an NCHW output held as NHWC
            memory), part of ``total_ms``. ``print(profile)`` shows the steps slowest first;
            ``profile.by_op()`` sums them per operator. Where calls on these inputs run as a
            native plan (``LoadOptions.native_plans``), its nodes computed from the inputs
            instead, timed inside the plan: kernel ``native`` (bound in the plan), ``alias``
            (a view of its input) or ``python`` (run in Python inside the plan); the model's
            name is followed by "(native plan)". The plan is built for the profile where calls
            on these inputs would build one and none is built yet, so that a profile right
            after ``load`` times what the calls after it run.

        Examples
        --------
        >>> p = model.profile(x)
        >>> print(p.table(top=10))
        """
        from ..backends import threads_in_use
        from .lowering import profile_plan as profile_native
        from .profile import MAX_PAUSE, profile_plan

        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise InputError(f"profile: repeats must be a positive integer, got {repeats!r}")
        if isinstance(pause, bool) or not isinstance(pause, (int, float)) or not 0 <= pause <= MAX_PAUSE:
            raise InputError(f"profile: pause must be a number of seconds in [0, {MAX_PAUSE:g}], got {pause!r}")
        arrays = self._prepare(args, kwargs)
        if self._native:  # calls on these inputs run as a native plan: its steps
            with settings.applied(self._options), using_threads(self.num_threads):
                plan = self._native.plan_for(arrays)
                found = (
                    None
                    if plan is None
                    else profile_native(plan, self.name, arrays, repeats, threads_in_use(), float(pause))
                )
            if found is not None:
                return found
        return profile_plan(
            self.name,
            self._plan,
            self._nodes,
            lambda a, clock, log: self._evaluate(a, clock, log),
            arrays,
            repeats,
            threads_in_use(),
            float(pause),
            finish=lambda values: self._results(values, self.output_names),
        )

    def warm_up(self) -> bool:
        """Run the graph once on zeros of its inputs' declared shapes (free dimensions: 1 where
        they lead, ``warmup.FREE_SIZE`` elsewhere), so that its weights are packed, its buffers
        allocated and fastlayers' threads started before the first real call;
        ``fastlayers.load`` does this.

        Returns
        -------
        bool
            Whether it ran: False for inputs without a declared rank, inputs out of proportion
            to the model's weights (``warmup.in_proportion``: over ``warmup.PROPORTION_FLOOR``
            elements and over the weights' count, or over ``warmup.MAX_ELEMENTS``: a small file
            declaring large inputs is not run at load), a graph that fails on zeros of those
            sizes, or one with a Loop (how long it runs depends on the values; zeros may keep
            it going).
        """
        specs = [(shape, dtype) for _, dtype, shape in self._inputs]
        total = 0
        for shape, _ in specs:  # exact (a file may declare dimensions whose product overflows)
            count = 1
            for k, d in enumerate(shape or ()):
                count *= (1 if k == 0 else FREE_SIZE) if d is None else d
            total += count
        weights = sum(_array_elements(v) for v in self._constants.values()) + sum(
            _array_elements(v) for n in self._nodes for v in n.attrs.values()
        )
        if not in_proportion(total, weights) or has_loop(self._nodes):
            return False
        return warm_up(self._evaluate, specs)

    def predict(self, x, batch_size: int | None = None):
        """Run in batches along axis 0 of every input (all at once by default)."""
        arrays = x if isinstance(x, (list, tuple)) else [x]
        total = len(arrays[0])
        if not batch_size or total <= batch_size:
            return self(*arrays)
        parts = [self(*[a[i : i + batch_size] for a in arrays]) for i in range(0, total, batch_size)]
        if len(self.output_names) == 1:
            return np.concatenate(parts)
        return [np.concatenate([p[k] for p in parts]) for k in range(len(self.output_names))]

    def summary(self, print_fn=None) -> None:
        """Print the optimised operator sequence with the output shapes the file records
        (its value_info; "?" where it records none), and the weight count."""
        lines = [
            f'ONNX model "{self.name}" (opset {self.opset})',
            "=" * 90,
            f"{'operator':28s}{'outputs':40s}shape",
            "=" * 90,
        ]
        for n in self._nodes:
            for o in n.outputs:
                shape = self._shapes.get(o)
                text = "?" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
                lines.append(f"{n.op_type:28s}{o[:38]:40s}{text}")
        lines += ["=" * 90, f"Total params: {self.count_params():,}", "=" * 90]
        (print_fn or (lambda s: print(s, file=sys.stdout)))("\n".join(lines))

    def save(self, path):
        raise UnsupportedError("an imported ONNX model cannot be saved in the fastlayers format; keep the .onnx file")

    def __reduce__(self):
        """Pickle by value: the ONNX bytes, imported again when unpickled (fastlayers.pickling)."""
        from ..pickling import reduce_onnx  # deferred: pickling sits above the model classes

        return reduce_onnx(self)


#: Operators that only move data or whose float arithmetic runs in the cpu backend's native
#: kernels: a graph of these alone runs without numpy's error state set around it (entering
#: ``np.errstate`` costs a noticeable share of a small MLP's call).
QUIET_OPS = frozenset(
    {"FusedDense", "FusedDenseChain", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"}
)


def _bind_and_run(op_type, ins, fn, args, attrs, opset) -> list:
    """One step of ``_labeling_plan``: the step bound on its constant inputs now (``bind``),
    or its general form, run on ``args``."""
    return (bind(op_type, ins, attrs, opset) or fn)(args, attrs, opset)


def _with_fresh_caches(op_type, attrs) -> dict:
    """A node's attributes for one plan: with an empty dict for each cache its operator keeps
    per node (``NODE_CACHES``: bound calls, packed plans), so that plans share none."""
    return {**attrs, **{k: {} for k in NODE_CACHES[op_type]}} if op_type in NODE_CACHES else attrs


def _quiet_activations(nodes) -> frozenset | None:
    """The activations of the FusedDense nodes where every node is one of ``QUIET_OPS``: the
    graph then runs without ``np.errstate`` on a backend whose dense kernel applies them quietly
    (``Ops.quiet_activations``); None where some node may raise numpy's warnings."""
    if not all(n.op_type in QUIET_OPS and "_softmax" not in n.attrs for n in nodes):
        return None  # (a softmax over another axis runs the numpy operator after the product)
    names = {n.attrs.get("activation", "linear") for n in nodes if n.op_type == "FusedDense"}
    names.update(name for n in nodes if n.op_type == "FusedDenseChain" for name, _ in n.attrs["layers"])
    return frozenset(names)


def _fixed_tail(shape):
    """(k, dims, rank, exact) for a declared input ``shape``: an array fits when its rank is
    ``rank`` and ``shape[k:]`` matches ``dims`` (k: the leading free dimensions), equal to it
    where ``exact``, else dimension by dimension where ``dims`` has a free one (None);
    (0, None, -1, True) (never fits) for an unknown shape."""
    if shape is None:
        return 0, None, -1, True
    free = 0
    while free < len(shape) and shape[free] is None:
        free += 1
    tail = tuple(shape[free:])
    return free, tail, len(shape), None not in tail


def _array_elements(value) -> int:
    """The elements of the arrays ``value`` is or holds (a tuple of arrays: a fused node's
    weights)."""
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):  # an array, or a backend's held weights
        return int(value.size)
    if isinstance(value, tuple):
        return sum(_array_elements(v) for v in value)
    return 0
