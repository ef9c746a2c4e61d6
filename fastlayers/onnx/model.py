"""ONNX models on fastlayers kernels: graph import, load-time optimisation, execution.

``from_model`` takes a model parsed by ``proto`` (``fastlayers.io.onnx`` reads the files),
refuses in one error every operator it does not implement, checks the graph
(``check.check_graph``: every value defined, the nodes in an order that runs, each node's
inputs and attributes against its operator's rules), drops the nodes no output depends on,
then optimises the graph once:

1. constant folding (``fold.py``): nodes whose inputs are all known at load run once and
   become constants, within a budget (``onnx_max_fold_bytes``: a small file cannot make large constants at load); an
   If whose condition became a constant is replaced by the nodes of its branch
   (``inline_constant_ifs``), folded in turn;
2. rewrites (``rewrite.py``): no-op nodes dropped (Identity, inference Dropout, Cast to
   the same type, identity Transpose, Add 0 / Mul or Div by 1, Unsqueeze -> Squeeze; Reshape
   chains read by one Reshape), graph outputs keeping their names; per-channel Mul / Add after
   a Conv or a dense MatMul / Gemm folded into its weights and bias (``fold_affine``);
   x * Sigmoid(x) -> Swish (``fuse_silu``); LayerNorm and RMSNorm decomposed over the last axis
   -> one LayerNormalization node (``fuse_layer_norm``); Unsqueeze -> 2-D Convs with a kernel
   of 1 on the added axis -> Squeeze: 1-D Convs (``conv_1d``, tf2onnx's transposed form too);
3. fusion (``fusion.py``): the exact and the tanh GELU spelled in arithmetic become one Gelu
   node (``fuse_gelu``, ``fuse_gelu_tanh``); MatMul (+ Add) and Gemm with constant weights become one dense node
   on the backend's BLAS + fused-epilogue primitive, absorbing a following activation (Relu, Sigmoid, Tanh,
   LeakyRelu, Gelu, Clip to [0, 6] or [0, inf), HardSigmoid with alpha 1/6, Swish: the
   backend's epilogues; another Clip, HardSigmoid or HardSwish stays a node); Conv with constant weights
   absorbs a following BatchNormalization (folded into its weights) and activation, with its
   weights transposed once to the backend's layout; an embedding Gather feeding an RNN, GRU or
   LSTM is folded into its input projection (``fuse_embedding_recurrent``); one LSTM step
   written out node by node (torch's ``LSTMCell``) becomes one ``FusedLSTMCell`` node
   (``cells.py``); the exporters'
   attention becomes one attention node (``fuse_attention``), and each mask-less Transformer
   encoder layer one ``FusedEncoderLayer`` node, each mask-less self-attention block outside
   one (torch's ``MultiheadAttention``: projections and attention) one ``FusedSelfAttention``
   node, confirmed on a probe run of the graph at load (``fuse_encoder_layers``, ``encoder.py``);
   last, an Add of two computed values read only by such an activation (a residual connection
   and its Relu) becomes one ``FusedAdd`` node, one pass over both operands
   (``fuse_add_activation``);
4. dead-node removal: only nodes the outputs depend on are kept, and only the constants they read.

The subgraphs of If, Loop and Scan nodes become models of their own (``control.Body``),
folded, and optimized as graphs once the outer constants they read are bound to them
(``optimize_bodies``); the outer values they read are inputs of their node (``check``).

Execution walks the kept nodes in order with a value table local to the call, so one model
serves many threads; batch size and sequence length may vary from call to call. An operator
failing on the inputs of a call raises an ``InputError`` (or its own fastlayers error) naming
the node; tensors whose size the graph's values set are limited (``onnx_max_created_bytes``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import settings
from ..arrays import as_array, checked, plain
from ..backends import get_ops, using_threads
from ..errors import FastlayersError, InputError, ModelFileError, ShapeError, UnsupportedError
from ..model.warmup import FREE_SIZE, in_proportion, warm_up
from . import (
    cells,
    check,
    encoder,
    fusion,
    proto,
    qdq,
    qfusion,
    quant,
    rewrite,
)
from .bound import bind
from .compiled import Parts, compile_plan
from .control import Body
from .fold import NONDETERMINISTIC, fold_and_inline, has_loop, mark_loops
from .layout import contiguous
from .nodes import Node, owner, prune
from .ops import NODE_CACHES, OPS
from .tensors import DTYPES

MIN_OPSET = 9
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


def _read_nodes(graph, where, opset=None, budget=None) -> list[Node]:
    """``Node`` objects of a graph's nodes (or of a list of ``proto.NodeProto``); the
    subgraphs of control-flow nodes (checked by ``check``) become ``Body`` objects, their
    constant folding taking from ``budget`` (a one-element list of bytes left; None: no limit)."""
    nodes = []
    for n in getattr(graph, "nodes", graph):
        attrs = dict(n.attrs)
        if n.op_type == "Split":
            attrs["_num_outputs"] = len(n.outputs)
        if n.op_type == "LayerNormalization":  # the mean / inv-std outputs cost two passes
            attrs["_stats"] = any(n.outputs[1:])
        for key in check.SUBGRAPHS.get(n.op_type, ()):
            label = f"{where}: node {check.short(n.name or n.outputs[0])} ({n.op_type}) {key}"
            attrs[key] = _subgraph(attrs[key], n.inputs[attrs["_formal"] :], opset, label, budget)
        nodes.append(Node(n.op_type, list(n.inputs), list(n.outputs), attrs, n.name))
    return nodes


def _subgraph(graph, captures, opset, where, budget) -> Body:
    """A checked subgraph as a ``Body``: a model whose inputs are the subgraph's inputs, then
    the outer values ``captures``; constant-folded (within ``budget``; Ifs on constant
    conditions inlined), not fused."""
    constants = dict(graph.initializers)
    outputs = [vo.name for vo in graph.outputs]
    nodes = prune(_read_nodes(graph.nodes, where, opset, budget), outputs)
    nodes = mark_loops(fold_and_inline(nodes, constants, outputs, opset, budget, where), constants)
    nodes = bind_constant_captures(nodes, constants, opset, budget)
    inputs: list[tuple[str, np.dtype, None]] = [
        (vi.name, np.dtype(DTYPES.get(vi.elem_type, np.float32)), None) for vi in graph.inputs
    ]
    inputs += [(name, np.dtype(np.float32), None) for name in captures]
    types = [
        (np.dtype(DTYPES[vo.elem_type]) if vo.elem_type in DTYPES else None, _value_shape(vo)) for vo in graph.outputs
    ]
    return Body(_body_model(where, inputs, outputs, constants, nodes, opset), types)


def _body_model(where, inputs, outputs, constants, nodes, opset) -> OnnxModel:
    """A subgraph's model, keeping the constants its nodes and outputs read."""
    used = set(outputs).union(*(n.inputs for n in nodes))
    return OnnxModel(where, inputs, outputs, {k: v for k, v in constants.items() if k in used}, nodes, opset, {}, where)


def bind_constant_captures(nodes, constants, opset, budget) -> list[Node]:
    """Control-flow nodes whose subgraphs read outer values that are ``constants`` (weights,
    shapes folded at load) get subgraphs holding those values as constants of their own and
    folded again, so that what a branch computes from weights alone (silero VAD's LSTM gate
    slices) is computed once at load, not on every call; the node no longer passes them."""
    for node in nodes:
        bodies = [k for k, v in node.attrs.items() if isinstance(v, Body)]
        if not bodies:
            continue
        formal = node.attrs["_formal"]
        captures = node.inputs[formal:]
        bound = {c: constants[c] for c in captures if c in constants}
        if not bound:
            continue
        attrs = dict(node.attrs)
        for key in bodies:
            body, model = attrs[key], attrs[key].model
            own = model._inputs[: len(model._inputs) - len(captures)]
            local = {**bound, **model._constants}  # a subgraph's own initializer shadows an outer value
            label = model._where
            inner = mark_loops(fold_and_inline(model._nodes, local, model.output_names, opset, budget, label), local)
            inner = bind_constant_captures(inner, local, opset, budget)
            inputs = own + [i for i in model._inputs[len(own) :] if i[0] not in bound]
            attrs[key] = Body(_body_model(label, inputs, model.output_names, local, inner, opset), body.output_types)
        node.attrs = attrs
        node.inputs = node.inputs[:formal] + [c for c in captures if c not in bound]
    return nodes


def optimize(nodes, constants, outputs, input_dtypes, opset, probe=None) -> list[Node]:
    """The load-time rewrites and fusions of a graph's folded ``nodes`` (the module docstring's
    steps 2-4), the subgraphs of its control-flow nodes first (``optimize_bodies``).
    ``constants`` gains what the passes fold; ``input_dtypes``: graph input name -> numpy dtype
    where known; ``probe``: ``fuse_encoder_layers``'s probe run (None: no encoder fusion)."""
    nodes = optimize_bodies(nodes, opset, rewrite.known_dtypes(nodes, constants, input_dtypes))
    nodes = prune(rewrite.drop_noops(nodes, constants, outputs, input_dtypes), outputs)
    nodes = rewrite.fuse_layer_norm(rewrite.fuse_silu(nodes, constants, outputs), constants, outputs)
    nodes = rewrite.fold_affine(rewrite.conv_1d(nodes, constants, outputs), constants, outputs)
    # GELU chains first, so that the Gelu node they become is absorbed by a dense node
    nodes = fusion.fuse_gelu_tanh(fusion.fuse_gelu(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_dense(nodes, constants, outputs)
    nodes = fusion.fuse_embedding_recurrent(fusion.fuse_conv(nodes, constants, outputs), constants, outputs)
    nodes = fusion.fuse_conv_transpose(nodes, constants, outputs)
    nodes = cells.fuse_lstm_cell(nodes, constants, outputs)
    nodes = fusion.fuse_attention(nodes, constants, outputs, opset)
    nodes = qfusion.optimize(nodes, constants, outputs)
    nodes = prune(fusion.mark_recurrent_sequences(fusion.mark_attention_scores(nodes, outputs), outputs), outputs)
    if probe is not None:
        nodes = fusion.fuse_encoder_layers(nodes, constants, list(input_dtypes), outputs, probe)
    return fusion.fuse_add_activation(nodes, constants, outputs)


def optimize_bodies(nodes, opset, outer_dtypes) -> list[Node]:
    """Control-flow nodes get their subgraphs optimized as a graph is (``optimize``, without
    the encoder fusion's probe run), once their outer constants are bound
    (``bind_constant_captures``): a model that is one If on its sample rate (silero VAD) runs
    fused convolutions and recurrent cells in its branch. The types of a body's own inputs are
    those it declares; its captures' those the outer graph knows (``outer_dtypes``: name ->
    dtype, ``rewrite.known_dtypes``), so that a Cast in a branch to the type its captured
    input has is dropped."""
    for node in nodes:
        bodies = [k for k, v in node.attrs.items() if isinstance(v, Body)]
        if not bodies:
            continue
        attrs = dict(node.attrs)
        for key in bodies:
            body, model = attrs[key], attrs[key].model
            n_own = len(model._inputs) - (len(node.inputs) - node.attrs["_formal"])
            own_types = {name: dtype for name, dtype, _ in model._inputs[:n_own]}
            own_types.update((name, outer_dtypes[name]) for name, _, _ in model._inputs[n_own:] if name in outer_dtypes)
            constants = dict(model._constants)
            inner = optimize(list(model._nodes), constants, model.output_names, own_types, opset)
            attrs[key] = Body(
                _body_model(model._where, model._inputs, model.output_names, constants, inner, opset), body.output_types
            )
        node.attrs = attrs
    return nodes


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


def _declared(value_info) -> tuple:
    """(name, type string, dimensions) of a declared graph input or output, for ``NodeArg``."""
    return (value_info.name, ORT_TYPES.get(value_info.elem_type), tuple(_value_shape(value_info, named=True) or ()))


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
                {**n.attrs, **{k: {} for k in NODE_CACHES[n.op_type]}} if n.op_type in NODE_CACHES else n.attrs,
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
        self._compiled_shapes: dict = {}
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
        """The arrays the optimised graph holds: constants, fused nodes' weights, and those of
        the subgraphs of its control-flow nodes."""
        arrays = list(self._constants.values())
        for n in self._nodes:
            for v in n.attrs.values():
                if isinstance(v, np.ndarray):
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
        try:
            for step, (fn, ins, outs, attrs, shape_only) in enumerate(self._plan):
                if shape_only and cached is not None:
                    continue
                if clock is not None:
                    mark, t0 = len(log) if log is not None else 0, time.perf_counter()
                results = fn([values[i] if type(i) is str else i for i in ins], attrs, self.opset)
                if clock is not None:
                    clock.append((step, time.perf_counter() - t0, log[mark:] if log is not None else ()))
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

    def _parts(self) -> Parts:
        """The plan as ``compile_plan`` reads it: each step bound on its constant inputs
        (``bound.bind``), each If's branches with their own parts, to be compiled in."""
        plan = [
            (bind(n.op_type, ins, attrs, self.opset) or fn, ins, outs, attrs, so)
            for n, (fn, ins, outs, attrs, so) in zip(self._nodes, self._plan)
        ]
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

    def profile(self, *args, repeats: int = 20, **kwargs):
        """Time one call on these inputs step by step, as onnxruntime's profiling does.

        Parameters
        ----------
        *args, **kwargs
            The inputs, as for calling the model.
        repeats : int
            Timed calls, after one untimed call (which also records each step's kernel); each
            step's time is its median over them.

        Returns
        -------
        fastlayers.onnx.profile.Profile
            Per step of the optimised graph: operator, what it fused, kernel (the backend
            methods it called, or ``numpy``), output layout, input and output shapes,
            milliseconds and share of the call. ``print(profile)`` shows them slowest first;
            ``profile.by_op()`` sums them per operator.

        Examples
        --------
        >>> p = model.profile(x)
        >>> print(p.table(top=10))
        """
        from ..backends import threads_in_use
        from .profile import profile_plan

        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise InputError(f"profile: repeats must be a positive integer, got {repeats!r}")
        arrays = self._prepare(args, kwargs)
        return profile_plan(
            self.name,
            self._plan,
            self._nodes,
            lambda a, clock, log: self._evaluate(a, clock, log),
            arrays,
            repeats,
            threads_in_use(),
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
QUIET_OPS = frozenset({"FusedDense", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"})


def _quiet_activations(nodes) -> frozenset | None:
    """The activations of the FusedDense nodes where every node is one of ``QUIET_OPS``: the
    graph then runs without ``np.errstate`` on a backend whose dense kernel applies them quietly
    (``Ops.quiet_activations``); None where some node may raise numpy's warnings."""
    if not all(n.op_type in QUIET_OPS for n in nodes):
        return None
    return frozenset(n.attrs.get("activation", "linear") for n in nodes if n.op_type == "FusedDense")


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
    if isinstance(value, np.ndarray):
        return value.size
    if isinstance(value, tuple):
        return sum(_array_elements(v) for v in value)
    return 0


def _value_shape(value_info, named=False):
    """The dimensions of a value (None when unknown, or its name where ``named``), or None
    without a shape."""
    if value_info.shape is None:
        return None
    return [d if (isinstance(d, int) and d >= 0) or (named and isinstance(d, str)) else None for d in value_info.shape]


def _prober(name, inputs, dims, outputs, constants, opset, where):
    """``probe(nodes)`` for ``fuse_encoder_layers``: every value of the graph ``nodes`` on
    ``encoder.probe_inputs``, or None where it cannot run (an optimisation only)."""

    def probe(nodes):
        arrays = encoder.probe_inputs(dims)
        if arrays is None or has_loop(nodes):  # a loop on made-up values may not end
            return None
        try:
            model = OnnxModel(name, inputs, outputs, constants, prune(nodes, outputs), opset, {}, where)
            return model._evaluate(arrays, every_value=True)
        except Exception:  # noqa: BLE001 - the graph may not run on the probe's sizes
            return None

    return probe


def _op_name(node) -> str:
    """A node's operator as error messages name it (``domain::op_type`` outside the default
    domain), cut short and escaped where a file makes it long or unprintable."""
    name = node.op_type if node.domain == "" else f"{node.domain}::{node.op_type}"
    return name if name.isprintable() and 0 < len(name) <= 60 else check.short(name)


def from_model(model: proto.Model, where: str, source=None) -> OnnxModel:
    """Import a model read by ``proto``; ``source`` is what its pickles carry
    (``OnnxModel.source``)."""
    graph = model.graph
    opset = model.opsets.get("")
    if opset is None or not graph.nodes:
        raise ModelFileError(f"{where}: not an ONNX model (no default-domain opset or no nodes)")
    if opset < MIN_OPSET:
        raise UnsupportedError(f"{where}: opset {opset} is older than the oldest supported ({MIN_OPSET})")
    unsupported = sorted(
        {_op_name(n) for n in check.all_nodes(graph) if ":" in n.op_type or check.qualified(n) not in check.OPS}
    )
    if unsupported:
        raise UnsupportedError(f"{where}: unsupported ONNX operator(s): {', '.join(unsupported)}")
    quant.check_domains(model, where)
    # the graph's structure, types and attributes, checked before anything is folded or run;
    # the nodes in an order that runs, dead nodes dropped before folding
    checked = check.check_graph(graph, where, opset)
    constants = dict(graph.initializers)
    inputs, dims = [], []
    for vi in graph.inputs:
        if vi.name in constants:
            continue
        if vi.elem_type not in DTYPES:
            raise UnsupportedError(f"{where}: input {check.short(vi.name)} has unsupported element type {vi.elem_type}")
        inputs.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi)))
        dims.append((vi.name, np.dtype(DTYPES[vi.elem_type]), _value_shape(vi, named=True)))
    outputs = [o.name for o in graph.outputs]
    # constant folding makes constants of at most max(onnx_max_fold_bytes, twice the bytes of
    # the file's initializers) in all; a graph asking more is refused (ModelFileError naming
    # the node)
    initializer_bytes = sum(v.nbytes for v in graph.initializers.values())
    budget = [max(settings.current().onnx_max_fold_bytes, 2 * initializer_bytes + quant.dequantized_bytes(graph))]
    try:
        nodes = prune(_read_nodes(checked, where, opset, budget), outputs)
        if settings.current().optimize:  # before folding: the DQs of constant weights are part of their units
            nodes = prune(qdq.fuse_node_units(nodes, constants, outputs, {i: t for i, t, _ in inputs}, opset), outputs)
        nodes = mark_loops(fold_and_inline(nodes, constants, outputs, opset, budget, where), constants)
        nodes = bind_constant_captures(nodes, constants, opset, budget)
        name = graph.name or Path(where).stem
        if settings.current().optimize:
            nodes = optimize(
                nodes,
                constants,
                outputs,
                {i: t for i, t, _ in inputs},
                opset,
                _prober(name, inputs, dims, outputs, constants, opset, where),
            )
    except FastlayersError:
        raise
    except Exception as e:  # a graph the optimisations cannot take
        raise ModelFileError(f"{where}: invalid graph ({type(e).__name__}: {str(e)[:300]})") from e
    used = set(outputs).union(*(n.inputs for n in nodes))
    constants = {k: v for k, v in constants.items() if k in used}
    shapes = {vi.name: _value_shape(vi) for vi in graph.value_info + graph.outputs}
    declared = (
        [_declared(vi) for vi in graph.inputs if vi.name not in graph.initializers],
        [_declared(vi) for vi in graph.outputs],
        frozenset(vi.name for vi in graph.inputs if vi.name in graph.initializers),
    )
    return OnnxModel(name, inputs, outputs, constants, nodes, opset, shapes, where, declared, source)
