"""Model graphs: symbolic tensors, ``Input``, functional ``Model`` and ``Sequential``.

A model is a DAG of nodes, one per layer call, in topological order. Running it keeps every
intermediate value in a dict local to the call, so one model serves many threads at once.
"""

from __future__ import annotations

import json
import numbers
import sys
import threading
from typing import Any, NamedTuple

import numpy as np

from ..arrays import as_array, as_float32, checked, plain, shape_str
from ..backends import using_threads
from ..backends.derived import derived_generation
from ..errors import InputError, ModelFileError, ShapeError, UnsupportedError
from ..layers.base import Layer
from ..layers.input_layer import InputLayer
from ..layers.symbolic import Node, SymbolicTensor, call_symbolic, is_symbolic  # noqa: F401
from .folding import fold_embeddings
from .placement import on_device
from .plans import compiled_call
from .summary import model_summary
from .warmup import FREE_SIZE, in_proportion, warm_up


def Input(shape=None, batch_size=None, name=None, dtype=None, batch_shape=None, **kwargs) -> SymbolicTensor:
    """A symbolic graph input of ``shape`` (without the batch axis), as ``keras.Input``.

    Parameters
    ----------
    shape : tuple of int or None
        The shape of one sample; None marks a size known only at call time.
    batch_size : int, optional
        A fixed batch size (default: any).
    name : str, optional
        The input's name, used to pass inputs as a dict.
    """
    return InputLayer(
        shape=shape, batch_size=batch_size, name=name, dtype=dtype, batch_shape=batch_shape, **kwargs
    ).output


#: Input layouts a model keeps bound steps for (``Model._run_bound``).
_MAX_BOUND = 8


def _layout_key(x):
    """(shape, strides, dtype) of the array ``x``, or a tuple of those for a list of arrays;
    None for anything else (such inputs run unbound)."""
    if type(x) is np.ndarray:
        return x.shape, x.strides, x.dtype.char
    if type(x) is list and all(type(a) is np.ndarray for a in x):
        return tuple((a.shape, a.strides, a.dtype.char) for a in x)
    return None


def _bound_step(fn, ops, args):
    """The function ``Layer.bind`` gives for the plan step ``fn`` when it is a layer's own
    ``call`` (a node validated when the graph was built, see ``Model._plan_step``), else ``fn``."""
    layer = getattr(fn, "__self__", None)
    if not isinstance(layer, Layer) or getattr(fn, "__func__", None) is not type(layer).call:
        return fn
    return layer.bind(ops, args) or fn


def _flatten(x) -> list:
    if isinstance(x, dict):
        return list(x.values())
    return list(x) if isinstance(x, (list, tuple)) else [x]


class GraphSpec(NamedTuple):
    """A built model's graph, as the native writer (``io/native.py``) and ``summary`` read it."""

    #: The graph's nodes in the order a call runs them, the InputLayer nodes among them.
    nodes: tuple[Node, ...]
    #: Built on one input tensor, not a list: a call takes one array.
    single_input: bool
    #: Built with one output tensor, not a list: a call returns one array.
    single_output: bool
    #: A ``Sequential``'s InputLayer (None for a functional model).
    input_layer: InputLayer | None = None


class Model(Layer):
    """A functional model: a DAG of layer calls from ``inputs`` to ``outputs``.

    Parameters
    ----------
    inputs : SymbolicTensor or list of SymbolicTensor
        Tensors returned by ``fastlayers.Input``.
    outputs : SymbolicTensor or list of SymbolicTensor
        Tensors computed from the inputs by calling layers.
    name : str, optional

    Examples
    --------
    >>> x = fastlayers.Input(shape=(64,))
    >>> h = fastlayers.layers.Dense(32, activation="relu")(x)
    >>> model = fastlayers.Model(x, fastlayers.layers.Dense(10, activation="softmax")(h))
    >>> model(np.zeros((2, 64))).shape
    (2, 10)
    """

    #: Threads each call of this model uses (None: the process's count,
    #: ``fastlayers.set_num_threads``); ``fastlayers.LoadOptions(threads=...)`` sets it at load.
    num_threads: int | None = None
    #: Whether calls may run the graph compiled as an ONNX plan (``model/plans.py``; None: the
    #: ``native_plans`` setting in force at the call); ``fastlayers.load`` sets it from its options.
    native_plans: bool | None = None

    def __init__(self, inputs=None, outputs=None, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        if inputs is not None:
            self._init_graph(inputs, outputs)

    def _init_graph(self, inputs, outputs) -> None:
        if isinstance(outputs, dict):
            raise UnsupportedError(
                f"model {self.name!r}: outputs given as a dict are not "
                "supported; give a list (the call returns them in its order)"
            )
        self._single_input = not isinstance(inputs, (list, tuple, dict))
        self._single_output = not isinstance(outputs, (list, tuple))
        self.inputs = _flatten(inputs)
        self.outputs = _flatten(outputs)
        for t in self.inputs + self.outputs:
            if not isinstance(t, SymbolicTensor):
                raise TypeError(
                    f"model {self.name!r}: inputs and outputs must be tensors from "
                    f"fastlayers.Input and layer calls, got {type(t).__name__}"
                )
        for t in self.inputs:
            if not isinstance(t.node.layer, InputLayer):
                raise ValueError(f"model {self.name!r}: every input must come from fastlayers.Input")
        self._nodes = self._topological_nodes()
        _name_tensors(self._nodes)
        self._layers = self._keras_layer_order()
        run_nodes = [node for node in self._nodes if not isinstance(node.layer, InputLayer)]
        plan = [self._plan_step(node) for node in run_nodes]
        # the run plan of every backend: layers folded together where that saves work (folding.py)
        self._host_plan = fold_embeddings(run_nodes, plan, self.outputs)
        self._host_chain = self._chain_of(self._host_plan)
        self._bound: dict = {}
        self._plans: dict = {}  # input ranks -> the graph compiled as an ONNX model (plans.py)
        names = [layer.name for layer in self._layers]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"model {self.name!r}: layer names must be unique, repeated: {duplicated}")
        self.built = True

    def _topological_nodes(self) -> list[Node]:
        order, state = [], {}
        input_nodes = {id(t.node) for t in self.inputs}
        stack = [(t.node, False) for t in reversed(self.outputs)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                state[id(node)] = 2
                order.append(node)
                continue
            if state.get(id(node)):
                continue
            if isinstance(node.layer, InputLayer) and id(node) not in input_nodes:
                raise ValueError(
                    f"model {self.name!r}: output depends on input "
                    f"{node.layer.name!r}, which is not among the model's inputs"
                )
            state[id(node)] = 1
            stack.append((node, True))
            stack.extend((p.node, False) for p in reversed(node.parents) if not state.get(id(p.node)))
        return order

    def _chain_of(self, plan) -> list | None:
        """The step functions of ``plan`` when each step reads the one output of the step before
        (the first reads the model's one input, the last writes its one output): a Sequential
        runs as ``x = fn(x)`` with no value table. None for any other graph."""
        if len(self.inputs) != 1 or not self._single_output or not plan:
            return None
        key = id(self.inputs[0])
        for _, keys, out_keys in plan:
            if keys != key or len(out_keys) != 1:
                return None
            key = out_keys[0]
        return [fn for fn, _, _ in plan] if key == id(self.outputs[0]) else None

    @staticmethod
    def _plan_step(node: Node):
        """(function, input keys, output keys) to run ``node``, value keys being tensor ids.

        A node whose inputs are float32 arrays of shapes fully known when the graph was built
        was validated then: it runs ``layer.call`` directly (the model validates its inputs once).
        So does the plain call (one input, no call arguments) of a layer whose
        ``plain_call_validated`` says such a call checks nothing more than that (recurrent
        layers, which take initial states and masks as extra inputs), on a float tensor.
        Other nodes (unknown sizes, layers converting their inputs) go through full validation.
        """
        layer, extra, kwargs = node.layer, node.extra_args, node.kwargs
        floats = type(layer)._prepare_inputs is Layer._prepare_inputs or (
            layer.plain_call_validated
            and not extra
            and not kwargs
            and isinstance(node.args, SymbolicTensor)
            and not getattr(node.args.node.layer, "keep_dtype", False)
        )
        static = floats and all(d is not None for t in node.parents for d in t.shape[1:])
        if static and not extra and not kwargs:
            fn = layer.call
        elif static:

            def fn(args):
                return layer.call(args, *extra, **kwargs)
        else:

            def fn(args):
                return layer._numeric_call(args, extra, kwargs)

        keys = [id(t) for t in node.args] if isinstance(node.args, list) else id(node.args)
        return fn, keys, [id(t) for t in node.outputs]

    def _keras_layer_order(self) -> list[Layer]:
        """Layers in Keras's order (keras.src.ops.function.map_graph): by decreasing depth from the
        outputs, ties broken by first visit in a depth-first walk from the outputs. Weight lists
        follow this order, so ``set_weights(keras_model.get_weights())`` lines up."""
        first_visit: dict[int, int] = {}
        post_order: list[Node] = []
        done: set[int] = set()

        def walk(node):
            if id(node) in done:
                return
            first_visit.setdefault(id(node.layer), len(first_visit))
            for parent in node.parents:
                walk(parent.node)
            done.add(id(node))
            post_order.append(node)

        for t in self.outputs:
            walk(t.node)
        node_depth: dict[int, int] = {}
        layer_depth: dict[int, int] = {}
        layers: dict[int, Layer] = {}
        for node in reversed(post_order):
            depth = max(node_depth.setdefault(id(node), 0), layer_depth.get(id(node.layer), 0))
            layer_depth[id(node.layer)] = depth
            layers[id(node.layer)] = node.layer
            for parent in node.parents:
                node_depth[id(parent.node)] = max(depth + 1, node_depth.get(id(parent.node), 0))
        for t in self.inputs:  # inputs the outputs do not depend on
            if id(t.node.layer) not in layer_depth:
                layer_depth[id(t.node.layer)], first_visit[id(t.node.layer)] = 0, -1
                layers[id(t.node.layer)] = t.node.layer
        order = sorted(layers, key=lambda k: (-layer_depth[k], first_visit[k]))
        return [layers[k] for k in order]

    # ---------------------------------------------------------------------------- structure
    @property
    def layers(self) -> list[Layer]:
        """Layers in Keras's order (InputLayer included, as in Keras functional models)."""
        return list(self._layers)

    @property
    def graph_spec(self) -> GraphSpec:
        """The built graph (nodes in run order, whether it takes and returns one array), read-only:
        what the native format writes and ``summary`` prints."""
        return GraphSpec(tuple(self._nodes), self._single_input, self._single_output)

    @property
    def input_names(self) -> list[str]:
        """Names of the model's inputs (their ``InputLayer`` names), in ``inputs`` order: the keys
        of a dict of inputs. Keras 2 had this attribute; Keras 3 has it no more."""
        return [t.node.layer.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """Names of the layers that compute the model's outputs, in ``outputs`` order, as Keras 3's
        functional ``Model.output_names`` (a layer with several outputs among the model's outputs
        appears once for each). Keras 3's ``Sequential`` lacks the attribute; here it has it."""
        return [t.node.layer.name for t in self._graph_tensors("outputs", "output names")]

    @property
    def input_shape(self):
        """The shape of the model's input, batch axis first, as Keras's ``Model.input_shape``.

        Returns
        -------
        tuple or list of tuple
            ``(None, 64)`` style (None for a size free at call time, the batch size included
            unless ``Input`` fixed it) for a model of one input; a list of such tuples, in
            ``inputs`` order, for several.

        Raises
        ------
        AttributeError
            A ``Sequential`` whose input shape is not known yet (as Keras).
        """
        return _shape_or_shapes(self._graph_tensors("inputs", "input shape"))

    @property
    def output_shape(self):
        """The shape of the model's output, batch axis first, as Keras's ``Model.output_shape``.

        Returns
        -------
        tuple or list of tuple
            One tuple for a model of one output (also when it was given as a list of one, as
            Keras); a list of tuples, in ``outputs`` order, for several.

        Raises
        ------
        AttributeError
            A ``Sequential`` whose input shape is not known yet (as Keras).
        """
        return _shape_or_shapes(self._graph_tensors("outputs", "output shape"))

    def _graph_tensors(self, which: str, what: str) -> list[SymbolicTensor]:
        if not self.built or which not in self.__dict__:  # an unbuilt Sequential: AttributeError, as Keras
            raise AttributeError(
                f"{type(self).__name__} model {self.name!r} has no defined {what} "
                "yet: start it with fastlayers.Input(shape) or call it once"
            )
        return self.__dict__[which]

    def get_layer(self, name: str | None = None, index: int | None = None) -> Layer:
        """The layer called ``name``, or at position ``index`` of ``layers``."""
        if index is not None:
            return self.layers[index]
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise ValueError(f"model {self.name!r} has no layer {name!r}; layers: {[layer.name for layer in self.layers]}")

    @property
    def weights(self):
        return [w for layer in self.layers for w in layer.weights]

    def get_weights(self) -> list[np.ndarray]:
        """All weights, layer by layer in ``layers`` order, each layer in Keras order."""
        return [w for layer in self.layers for w in layer.get_weights()]

    def set_weights(self, weights) -> None:
        """Set all weights from a flat list in ``get_weights`` order."""
        weights = list(weights)
        expected = sum(len(layer.weights) for layer in self.layers)
        if len(weights) != expected:
            raise ShapeError(f"model {self.name!r} expects {expected} weight arrays, got {len(weights)}")
        i = 0
        for layer in self.layers:
            n = len(layer.weights)
            if n:
                layer.set_weights(weights[i : i + n])
            i += n

    def count_params(self) -> int:
        return sum(layer.count_params() for layer in self.layers)

    def compute_output_shape(self, input_shape):
        shapes = [t.shape for t in self.outputs]
        return shapes[0] if self._single_output else shapes

    def _check_spec(self, shape) -> None:
        shapes = shape if isinstance(shape, list) else [shape]
        for t, s in zip(self.inputs, shapes):
            want = t.shape
            if len(s) != len(want) or any(w is not None and d is not None and w != d for w, d in zip(want[1:], s[1:])):
                raise ShapeError(
                    f"model {self.name!r} input {t.node.layer.name!r}: expected shape "
                    f"{shape_str(want)}, got {shape_str(s)}"
                )

    # ------------------------------------------------------------------------------ running
    def _numeric_call(self, inputs, args=(), kwargs=None):
        # the inputs are checked against the model's Input shapes; nothing else to validate
        return self.call(self._prepare_inputs(inputs))

    def _prepare_inputs(self, inputs):
        n = len(self.inputs)
        if n == 1 and type(inputs) is np.ndarray and inputs.dtype == np.float32 and plain(inputs):
            self.inputs[0].node.layer.check(inputs)
            return inputs
        if isinstance(inputs, dict):
            missing = [k for k in self.input_names if k not in inputs]
            if missing:
                raise ShapeError(f"model {self.name!r}: missing inputs {missing}; got keys {sorted(inputs)}")
            arrays = [inputs[k] for k in self.input_names]
        elif isinstance(inputs, (list, tuple)) and not (n == 1 and _is_array_like_batch(inputs)):
            arrays = list(inputs)
        else:
            arrays = [inputs]
        if len(arrays) != n:
            raise ShapeError(f"model {self.name!r} expects {n} input(s) {self.input_names}, got {len(arrays)}")
        out = []
        for t, a in zip(self.inputs, arrays):
            if getattr(t.node.layer, "keep_dtype", False):
                where = f"model {self.name!r} input {t.node.layer.name!r}"
                a = a if self.ops.is_device_array(a) else checked(as_array(a, where), where)
            else:
                a = self._float_input(a, f"model {self.name!r} input {t.node.layer.name!r}")
            t.node.layer.check(a)
            out.append(a)
        if len({a.shape[0] for a in out}) > 1:
            raise ShapeError(
                f"model {self.name!r}: inputs must share the batch size, got "
                f"{[a.shape[0] for a in out]} for {self.input_names}"
            )
        return out if n > 1 else out[0]

    def __call__(self, *inputs, **kwargs):
        """Run the model on numpy arrays (one per input: positional, a list or a dict by name),
        on ``num_threads`` threads where set."""
        if self.num_threads is not None:
            with using_threads(self.num_threads):
                return self._call_model(inputs, kwargs)
        return self._call_model(inputs, kwargs)

    def _call_model(self, inputs, kwargs):
        if len(inputs) == 1 and not kwargs and type(inputs[0]) is np.ndarray:  # nothing symbolic
            return self.call(self._prepare_inputs(inputs[0]))
        kwargs.pop("training", None)
        if len(inputs) == 1:
            inputs = inputs[0]
        elif len(inputs) == 0:
            raise TypeError(f"model {self.name!r}: no input given")
        else:
            inputs = list(inputs)
        return super().__call__(inputs, **kwargs)

    def call(self, x):
        """Run the plan on prepared inputs. On a device backend (``ops.device``) the inputs
        are moved to the device here and the outputs back to the host at the end; every layer
        in between computes on device arrays. A model nested in another one finds its inputs
        on the device already and leaves its outputs there. On the host a graph that compiles
        runs as its compiled ONNX plan (``plans.compiled_call``), any other with its layers
        bound to the inputs' layout (``_run_bound``)."""
        ops = self.ops
        if ops.device is None:
            if ops.name == "cpu" and self.native_plans is not False:
                y = compiled_call(self, x, self._plans, self.native_plans)
                if y is not None:
                    return y
            token = ops.enter_call()
            try:
                return self._run_bound(x, ops)
            finally:
                ops.exit_call(token)
        entry = not any(map(ops.is_device_array, x if type(x) is list else [x]))
        if not entry:
            return self._run_plan(x)
        return ops.to_host(self._run_plan(ops.to_device(x)))

    def _run_bound(self, x, ops):
        """The plan's outputs, each layer run by the function ``Layer.bind`` gave it for inputs
        laid out as ``x`` (shapes, strides, dtypes) on ``ops``: bound on the first call with a
        layout, reused while ``ops`` and the derived weights (``clear_derived``) stay the
        same. Up to ``_MAX_BOUND`` layouts are kept."""
        key = _layout_key(x)
        generation = derived_generation()
        hit = self._bound.get(key)
        if hit is not None and hit[0] is ops and hit[1] == generation:
            return self._run_plan(x, hit[2], hit[3])
        plan = []
        out = self._run_plan(x, bind=(ops, plan))
        if key is not None:
            if len(self._bound) >= _MAX_BOUND:
                self._bound.clear()
            chain = None if self._host_chain is None else [fn for fn, _, _ in plan]
            self._bound[key] = (ops, generation, chain, plan)
        return out

    def _run_plan(self, x, chain=None, plan=None, bind=None):
        """The outputs of the plan's steps from the model's inputs ``x`` (one array, or a list
        with one per input). ``chain`` / ``plan``: the steps to run in place of the model's
        (``_host_chain`` / ``_host_plan``); ``bind``: (ops, a list): each layer step is bound
        on ops (``Layer.bind``) before it runs and the steps run are appended to the list."""
        chain = self._host_chain if chain is None else chain
        if chain is not None and bind is None and type(x) is not list:
            for fn in chain:
                x = fn(x)
            return x
        arrays = x if isinstance(x, list) else [x]
        values: dict[int, Any] = {}
        for t, a in zip(self.inputs, arrays):
            values[id(t)] = a
        for fn, keys, out_keys in plan or self._host_plan:
            args = [values[k] for k in keys] if type(keys) is list else values[keys]
            if bind is not None:
                fn = _bound_step(fn, bind[0], args)
                bind[1].append((fn, keys, out_keys))
            out = fn(args)
            if len(out_keys) == 1:
                values[out_keys[0]] = out
            else:
                values.update(zip(out_keys, out))
        results = [values[id(t)] for t in self.outputs]
        return results[0] if self._single_output else results

    def warm_up(self) -> bool:
        """Run the model once on zeros of its inputs' shapes (batch 1, other free sizes
        ``warmup.FREE_SIZE``), so that its weights are packed, its buffers allocated and
        fastlayers' threads started before the first real call; ``fastlayers.load`` does this.

        Returns
        -------
        bool
            Whether it ran: False for a model not built yet, one whose largest activation at
            those sizes is out of proportion to its weights (``warmup.in_proportion``: over
            ``warmup.PROPORTION_FLOOR`` elements and over its weights' count, or over
            ``warmup.MAX_ELEMENTS``), or a model that refuses zeros of those sizes.
        """
        if not self.built or not warm_up_in_proportion(self):
            return False
        return warm_up(lambda arrays: self(arrays if len(arrays) > 1 else arrays[0]), self.input_specs())

    def input_specs(self) -> list[tuple]:
        """(batch shape with None for free sizes, dtype) of each input, in ``inputs`` order."""
        return [(t.node.layer.batch_shape, t.node.layer.dtype) for t in self.inputs]

    def predict(self, x, batch_size: int | None = None, verbose: int = 0):
        """Run the model in batches of ``batch_size`` (all at once by default), like Keras.

        ``batch_size`` is None or a positive integer (else ``InputError``); inputs that are not
        rectangular numeric arrays (ragged nested lists) raise ``ShapeError``. Floating-point
        overflow and invalid operations (inf or NaN in the inputs or weights) give inf and NaN
        in the outputs without numpy warnings."""
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1
        ):
            raise InputError(
                f"model {self.name!r}: predict expects batch_size None or a positive integer, got {batch_size!r}"
            )
        with np.errstate(all="ignore"):
            arrays = self._prepare_inputs(x if not isinstance(x, tuple) else list(x))
            arrays = arrays if isinstance(arrays, list) else [arrays]
            total = arrays[0].shape[0] if arrays[0].ndim else 0
            if not batch_size or total <= batch_size:
                return self(arrays if len(arrays) > 1 else arrays[0])
            batch_size = int(batch_size)
            parts = []
            for start in range(0, total, batch_size):
                chunk = [a[start : start + batch_size] for a in arrays]
                parts.append(self(chunk if len(chunk) > 1 else chunk[0]))
            if self._single_output:
                return np.concatenate(parts)
            return [np.concatenate([p[i] for p in parts]) for i in range(len(self.outputs))]

    def predict_on_batch(self, x):
        """Run the model on one batch, as Keras's ``Model.predict_on_batch``.

        Parameters
        ----------
        x : array_like, or list, tuple or dict of array_like
            The batch: one array for a model of one input; one array per input (in ``inputs``
            order, or a dict keyed by ``input_names``) for several.

        Returns
        -------
        numpy.ndarray or list of numpy.ndarray
            The output for the whole batch; a list, in ``outputs`` order, for a model of
            several outputs. A model of one output returns its array, also when that output was
            given as a list of one (as Keras).
        """
        out = self.predict(x)
        if isinstance(out, list):
            out = [np.asarray(o) for o in out]
            return out[0] if len(out) == 1 else out
        return np.asarray(out)

    # -------------------------------------------------------------------------- description
    def to(self, device):
        """This model on ``device``: "cpu" returns the model; "cuda" (or "cuda:0") a wrapper whose
        calls run under ``use_ops("cuda")`` and return host numpy arrays."""
        return on_device(self, device)

    def summary(self, print_fn=None, line_length: int = 98) -> None:
        """Print each layer with its output shape, parameter count and inputs, then totals."""
        text = model_summary(self, not isinstance(self, Sequential), line_length)
        (print_fn or (lambda s: print(s, file=sys.stdout)))(text)

    def load_weights(self, path) -> None:
        """Load weights saved by Keras (``.weights.h5``, or a legacy ``.h5`` model/weights file)
        into this model, which must have the saved model's architecture."""
        from ..io.keras import load_weights  # deferred: io/ sits above the model classes

        load_weights(self, path)

    def save(self, path) -> None:
        """Write architecture and weights to one file (fastlayers native format, no pickle)."""
        from ..io.native import save_model  # deferred: io/ sits above the model classes

        save_model(self, path)

    def __reduce__(self):
        """Pickle by value: the native file's bytes, read back as ``fastlayers.load`` reads a
        file (``fastlayers.pickling``). ``copy.deepcopy`` goes the same way."""
        from ..pickling import reduce_model  # deferred: pickling sits above the model classes

        return reduce_model(self)

    def get_config(self) -> dict:
        from ..io.native import model_config  # deferred: io/ sits above the model classes

        return model_config(self)

    def to_json(self, **kwargs) -> str:
        """The model's architecture as a JSON string, as Keras's ``Model.to_json``; weights are
        not included (``get_weights``). ``fastlayers.model_from_json`` rebuilds the model.

        The JSON is fastlayers' native format (the architecture header ``Model.save`` writes),
        not Keras's: Keras's ``model_from_json`` does not read it, and a Keras model's
        ``to_json`` is not read here (save it as ``.keras`` and ``fastlayers.load`` that).

        Parameters
        ----------
        **kwargs
            Passed to ``json.dumps`` (``indent``, ``sort_keys``...).

        Returns
        -------
        str

        Raises
        ------
        UnsupportedError
            The native format cannot represent the model: a ``Sequential`` whose input shape is
            not known yet, a layer or model class of its own (a subclass, outside
            ``fastlayers.layers``), or a layer option that is not JSON-serializable.
        """
        from ..io.native import model_header  # deferred: io/ sits above the model classes

        return model_header(self, "written as JSON", **kwargs)


def _shape_or_shapes(tensors):
    """Keras's ``input_shape``/``output_shape``: one tuple, or a list of them for several."""
    shapes = [tuple(None if d is None else int(d) for d in t.shape) for t in tensors]
    return shapes[0] if len(shapes) == 1 else shapes


def _name_tensors(nodes) -> None:
    """Give each tensor of a graph a ``name`` (kept if it has one): an input's is its InputLayer's
    (as Keras), any other's its layer's, with ``/call_<k>`` for the layer's k-th call (k >= 1) in
    the graph and ``:<i>`` for its i-th output when the layer returns several."""
    calls: dict[int, int] = {}
    for node in nodes:
        k = calls.get(id(node.layer), 0)
        calls[id(node.layer)] = k + 1
        for i, t in enumerate(node.outputs):
            if getattr(t, "name", None) is None:
                t.name = node.layer.name + (f"/call_{k}" if k else "") + (f":{i}" if len(node.outputs) > 1 else "")


def model_from_json(json_string) -> Model:
    """Rebuild a model from ``Model.to_json`` output, as ``keras.models.model_from_json``.

    The weights are initialized as a fresh build would be; copy them from the original with
    ``model.set_weights(original.get_weights())``. The string may come from anywhere: only
    fastlayers layer classes are built, no code is run, and anything but a well-formed
    architecture raises a fastlayers error.

    Parameters
    ----------
    json_string : str, bytes or bytearray
        The JSON of ``Model.to_json`` (also the ``__fastlayers__`` header of a native model file).

    Returns
    -------
    Model or Sequential

    Raises
    ------
    ModelFileError
        The string is not JSON, not fastlayers' architecture JSON (Keras's own ``to_json`` output
        included), or a malformed or invalid architecture.
    UnsupportedError
        A layer class fastlayers does not know, or JSON written by a newer fastlayers.
    TypeError
        ``json_string`` is not a str, bytes or bytearray.

    Examples
    --------
    >>> clone = fastlayers.model_from_json(model.to_json())
    >>> clone.set_weights(model.get_weights())
    """
    if not isinstance(json_string, (str, bytes, bytearray)):
        raise TypeError(f"model_from_json expects the JSON string of Model.to_json(), got {type(json_string).__name__}")
    try:
        header = json.loads(json_string)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError included
        raise ModelFileError(f"model JSON: not valid JSON ({type(e).__name__}: {e})") from e
    from ..io.native import model_from_header  # deferred: io/ sits above the model classes

    return model_from_header(header, "model JSON")


def _is_array_like_batch(x) -> bool:
    """A list that is one nested-list array rather than a list of several inputs."""
    return not any(isinstance(e, np.ndarray) for e in x)


class Sequential(Model):
    """A linear stack of layers, as ``keras.Sequential``.

    Built as soon as the input shape is known: from a leading ``Input``/``InputLayer``, a first
    layer given ``input_shape``, or else at the first call.

    Parameters
    ----------
    layers : list of Layer, optional
    name : str, optional
    """

    def __init__(self, layers=None, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self._stack: list[Layer] = []
        self._input_layer: InputLayer | None = None
        self._lazy_lock = threading.Lock()
        for layer in layers or []:
            self.add(layer)

    def add(self, layer) -> None:
        """Append a layer (or a leading ``Input`` tensor) and rebuild the graph if possible."""
        if isinstance(layer, SymbolicTensor):
            layer = layer.node.layer
        if isinstance(layer, InputLayer):
            if self._stack or self._input_layer is not None:
                raise ValueError(f"Sequential {self.name!r}: an Input can only come first")
            self._input_layer = layer
        elif isinstance(layer, Layer):
            self._stack.append(layer)
        else:
            raise TypeError(f"Sequential {self.name!r}: expected a Layer, got {type(layer).__name__}")
        self.built = False
        shape = self._known_input_shape()
        if shape is not None:
            self._build_graph(shape)

    def _known_input_shape(self):
        if self._input_layer is not None:
            return self._input_layer.batch_shape
        if self._stack and self._stack[0]._batch_input_shape is not None:
            return self._stack[0]._batch_input_shape
        return None

    def _build_graph(self, batch_shape) -> None:
        if self._input_layer is None:
            self._input_layer = InputLayer(batch_shape=batch_shape)
        x = self._input_layer.output
        for layer in self._stack:
            x = layer(x)
        self._init_graph(self._input_layer.output, x)

    def build(self, input_shape) -> None:
        with self._lazy_lock:
            if not self.built:
                self._build_graph(tuple(input_shape))

    def _ensure_built(self, input_shape) -> None:
        if not self.built:
            self.build(input_shape)

    def _prepare_inputs(self, inputs):
        if not self.built:
            if isinstance(inputs, (list, tuple)) and not _is_array_like_batch(inputs):
                raise ShapeError(f"Sequential {self.name!r} takes one input")
            a = as_float32(inputs, f"model {self.name!r} input")
            self.build((None, *a.shape[1:]))
            return a
        return super()._prepare_inputs(inputs)

    @property
    def layers(self) -> list[Layer]:
        """The stacked layers (without the InputLayer, as in Keras)."""
        return list(self._stack)

    @property
    def graph_spec(self) -> GraphSpec:
        """The built graph with the InputLayer the stack starts from (see ``Model.graph_spec``);
        a ``Sequential`` whose input shape is not known yet has none (ValueError)."""
        self._require_built("its graph (saving, to_json, summary)")
        return super().graph_spec._replace(input_layer=self._input_layer)

    def _require_built(self, what: str) -> None:
        if not self.built:
            raise ValueError(
                f"Sequential {self.name!r} is not built: {what} needs the input shape; "
                "start it with fastlayers.Input(shape) or call it once"
            )

    def summary(self, print_fn=None, line_length: int = 98) -> None:
        self._require_built("summary()")
        super().summary(print_fn, line_length)

    def set_weights(self, weights) -> None:
        self._require_built("set_weights()")
        super().set_weights(weights)


# ------------------------------------------------------------------------------ graph measures
def all_graph_nodes(model: Model):
    """Every node of ``model``'s graph, nested models' included (each model once); none for a
    ``Sequential`` not built yet."""
    pending, seen = [model], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for node in getattr(current, "_nodes", ()):
            yield node
            if isinstance(node.layer, Model):
                pending.append(node.layer)


def activation_elements(model: Model, free_size: int = FREE_SIZE) -> int:
    """The most elements any tensor of ``model``'s graph (nested models' included) holds for one
    sample, free sizes counted as ``free_size`` (the batch as 1): what a call at batch 1 needs
    per activation."""
    largest = 0
    for node in all_graph_nodes(model):
        for out in node.outputs:
            size = 1
            for k, d in enumerate(out.shape):
                size *= (1 if k == 0 else free_size) if d is None else max(int(d), 0)
            largest = max(largest, size)
    return largest


def weight_elements(model: Model) -> int:
    """The elements of all of ``model``'s weights (nested models' included, shared layers once)."""
    seen, pending, total = set(), list(model.layers), 0
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, Model):
            pending.extend(layer.layers)
        else:
            total += sum(int(w.size) for w in layer.weights)
    return total


def warm_up_in_proportion(model: Model) -> bool:
    """``warmup.in_proportion`` for a layer graph: its largest activation at batch 1 against its
    weights' count."""
    return in_proportion(activation_elements(model), weight_elements(model))
