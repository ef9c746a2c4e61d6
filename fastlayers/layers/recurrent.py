"""Keras-style recurrent layers: SimpleRNN, LSTM, GRU and their cells (Bidirectional, which wraps
them, is in ``bidirectional.py``).

Weights follow Keras (kernel (input, gates*units), recurrent_kernel (units, gates*units), bias),
gate blocks LSTM i, f, c, o and GRU z, r, h, so ``set_weights(keras_layer.get_weights())`` lines
up. Each layer runs one backend primitive (``ops.lstm_sequence`` ...): on the cpu backend, one
GEMM for the input projection of every step and a compiled time loop.

Masks follow Keras: pass ``mask=`` (batch, time) bool (True = valid step) when calling the layer.
A masked step leaves the state unchanged; its output repeats the previous step's output (zeros
before the first valid step), or is zeros with ``zero_output_for_mask=True`` (what Bidirectional
sets when returning sequences). In graphs built from symbolic tensors, a recurrent layer called
on the output of ``Embedding(mask_zero=True)`` (directly, through Dropout, Dense, Activation
or normalization layers, or through recurrent layers returning sequences) gets the mask
``ids != 0`` automatically, as in Keras: a ``PaddingMask`` node computing it from the ids is
added to the graph. As in Keras 3, a call given ``initial_state=`` does not take that mask (pass
``mask=`` to mask it). On arrays, pass ``mask=embedding.compute_mask(ids)`` yourself.

Streaming: ``state = layer.get_stream_state(batch_size)`` then ``y = layer.stream(chunk, state)``
for each chunk of timesteps; the outputs equal one call on the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backends.derived import derived_from, fold_projection
from ..backends.types import Cell
from ..errors import ShapeError, UnsupportedError
from .base import InputSpec, Layer, as_float32, shape_str
from .core import Activation, Dense, Dropout, Embedding, activation_name
from .normalization import BatchNormalization, LayerNormalization
from .streaming import StreamState
from .symbolic import SymbolicTensor

#: The index that reverses the time axis of (batch, time, ...) outputs.
REVERSED_TIME = (slice(None), slice(None, None, -1))
_IGNORED = ("dropout", "recurrent_dropout", "unroll", "use_cudnn", "time_major")


def first_shape(shape):
    """The sequence's shape out of a list [x, *states, mask] of shapes, or the shape itself."""
    return tuple(shape[0]) if isinstance(shape, list) else tuple(shape)


def _pop_ignored(kwargs):
    for key in _IGNORED:
        kwargs.pop(key, None)


class _RecurrentMath:
    """Weights and one-sequence math of a cell type, shared by the layer and the cell classes."""

    gates = 1
    state_names: tuple[str, ...] = ("h",)

    def _init_math(self, units, activation, recurrent_activation, use_bias):
        self.units = int(units)
        if self.units <= 0:
            raise ValueError(f"{type(self).__name__} {self.name!r}: units must be positive, got {units}")
        self.activation = activation_name(activation)
        self.recurrent_activation = activation_name(recurrent_activation)
        self.use_bias = bool(use_bias)

    @property
    def state_size(self) -> list[int]:
        return [self.units] * len(self.state_names)

    def _build_math(self, input_dim):
        if input_dim is None:
            raise ShapeError(f"{type(self).__name__} {self.name!r}: the feature axis of the input must be known")
        g = self.gates * self.units
        self.add_weight("kernel", (input_dim, g), "glorot_uniform")
        self.add_weight("recurrent_kernel", (self.units, g), "orthogonal")
        if self.use_bias:
            self._add_bias()
        self.input_dim = int(input_dim)

    def _add_bias(self):
        self.add_weight("bias", (self.gates * self.units,), "zeros")

    def _input_bias(self):
        """The bias added to the input projection, or None."""
        return self.bias if self.use_bias else None

    def _input_weights(self, table=None):
        """(w_ig, b_ig) of the input projection: the kernel and its bias, or, for inputs that are
        rows of an embedding ``table`` given by their ids, ``table @ kernel + bias`` (the
        projection of every row; the bias then lies in it) and None. The fold is computed once
        and kept while the table, kernel and bias stay the same array objects (as derived
        weights are: ``backends.derived``)."""
        kernel, bias = self.kernel, self._input_bias()
        if table is None:
            return kernel, bias
        whole_bias = self.bias if self.use_bias else None  # GRU: _input_bias is a view
        return derived_from(
            (kernel, table, whole_bias), "embedding-fold", lambda *_: fold_projection(table, kernel, bias)
        ), None

    def _run(self, x, states, mask, *, table=None, **kw):
        """(y, new_states) for x (B, T, I) from states [h, (c)]; see ``reference.recurrent``.
        With an embedding ``table``, x holds ids (B, T) of its rows (``_input_weights``)."""
        cell, args, kw = self._sequence_call(states, mask, table, **kw)
        y, *new_states = self.ops.run_sequence(cell, x, *args, **kw)
        return y, new_states

    def _sequence_call(
        self, states, mask, table=None, *, reverse=False, return_sequences=True, zero_masked=False, y0=None
    ):
        """(its cell, its arguments after the input, its keyword arguments) of the sequence call
        ``_run`` makes: ``ops.run_sequence(cell, x, *args, **kw)`` gives (y, *states)."""
        raise NotImplementedError


class _SimpleRNNMath(_RecurrentMath):
    def _sequence_call(self, states, mask, table=None, **kw):
        w_ih, b = self._input_weights(table)
        return (
            Cell.RNN,
            (w_ih, self.recurrent_kernel, b, states[0]),
            dict(activation=self.activation, mask_bt=mask, **kw),
        )


class _LSTMMath(_RecurrentMath):
    gates = 4
    state_names: tuple[str, ...] = ("h", "c")

    def _add_bias(self):
        bias = self.add_weight("bias", (4 * self.units,), "zeros")
        if getattr(self, "unit_forget_bias", False) and "bias_initializer" not in self._initializers:
            bias[self.units : 2 * self.units] = 1.0

    def _sequence_call(self, states, mask, table=None, **kw):
        w_ig, b_g = self._input_weights(table)
        return (
            Cell.LSTM,
            (w_ig, self.recurrent_kernel, b_g, states[0], states[1]),
            dict(activation=self.activation, recurrent_activation=self.recurrent_activation, mask_bt=mask, **kw),
        )


class _GRUMath(_RecurrentMath):
    gates = 3

    def _add_bias(self):
        shape = (2, 3 * self.units) if self.reset_after else (3 * self.units,)
        self.add_weight("bias", shape, "zeros")

    def _input_bias(self):
        if not self.use_bias:
            return None
        return self.bias[0] if self.reset_after else self.bias

    def _sequence_call(self, states, mask, table=None, **kw):
        w_ig, b_ig = self._input_weights(table)
        b_hg = self.bias[1] if self.use_bias and self.reset_after else None
        return (
            Cell.GRU,
            (w_ig, self.recurrent_kernel, b_ig, b_hg, states[0]),
            dict(
                reset_after=self.reset_after,
                activation=self.activation,
                recurrent_activation=self.recurrent_activation,
                mask_bt=mask,
                **kw,
            ),
        )


# ------------------------------------------------------------------------------ implicit masks
class PaddingMask(Layer):
    """``ids != 0`` as a (batch, time) bool mask: the node that carries an
    ``Embedding(mask_zero=True)`` mask to the recurrent layers of a graph (added automatically).

    Shape
    -----
    (batch, time) integers -> (batch, time) bool.
    """

    def _prepare_inputs(self, inputs):
        return inputs if self.ops.is_device_array(inputs) else np.asarray(inputs)

    def call(self, ids):
        return self.ops.nonzero_mask(ids)


#: Layers that pass a mask through unchanged (Keras ``supports_masking``), for ``implicit_mask``.
_MASK_PASSING = (Dropout, Dense, Activation, BatchNormalization, LayerNormalization)


def implicit_mask(tensor: SymbolicTensor):
    """The symbolic Keras mask carried by ``tensor``, or None: from Embedding(mask_zero=True)
    (through Dropout, Dense, Activation and normalization layers) or from a recurrent layer that
    returned sequences under a mask."""
    while True:
        known = tensor.keras_mask
        if known is not None:
            return known
        layer = tensor.node.layer
        if (
            isinstance(layer, Embedding)
            and layer.mask_zero
            and isinstance(tensor.node.args, SymbolicTensor)
            and len(tensor.node.args.shape) == 2
        ):
            ids = tensor.node.args
            mask = ids.padding_mask
            if mask is None:  # one PaddingMask per ids tensor, shared by its consumers
                mask = PaddingMask(name=f"{layer.name}_mask")(ids)
                ids.padding_mask = mask
            tensor.keras_mask = mask
            return mask
        if isinstance(layer, _MASK_PASSING) and isinstance(tensor.node.args, SymbolicTensor):
            tensor = tensor.node.args
            continue
        return None


# ------------------------------------------------------------------------------------- layers
class RecurrentLayer(Layer):
    """Shared call, shape, state and streaming logic of SimpleRNN, LSTM and GRU."""

    _common_keys = (
        "units",
        "activation",
        "use_bias",
        "return_sequences",
        "return_state",
        "go_backwards",
        "zero_output_for_mask",
    )
    plain_call_validated = True
    # given by the cell type's math (``_RecurrentMath``), the other base of every concrete layer
    units: int
    gates: int
    state_names: tuple[str, ...]
    _run: Callable[..., tuple[np.ndarray, list[np.ndarray]]]

    def _init_layer(self, return_sequences, return_state, go_backwards, stateful, zero_output_for_mask):
        if stateful:
            raise UnsupportedError(
                f"{type(self).__name__} {self.name!r}: stateful=True is not "
                "supported; use the explicit streaming API "
                "(layer.get_stream_state / layer.stream)"
            )
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.zero_output_for_mask = bool(zero_output_for_mask)
        self.input_spec = InputSpec(ndim=3)

    # ------------------------------------------------------------------------ graph plumbing
    def __call__(self, inputs, initial_state=None, mask=None, training=None, **kwargs):
        if set(kwargs) == {"n_states", "has_mask"}:  # a recorded call replayed (native format)
            return Layer.__call__(self, inputs, **kwargs)
        if kwargs:
            raise TypeError(f"{type(self).__name__} {self.name!r}: unexpected call argument(s) {sorted(kwargs)}")
        listed = isinstance(inputs, (list, tuple)) and len(inputs) > 1 and initial_state is None
        if listed:
            inputs, initial_state = inputs[0], list(inputs[1:])  # tf.keras: layer([x, h0, c0])
        elif isinstance(inputs, (list, tuple)) and len(inputs) == 1:
            inputs = inputs[0]
        states = (
            []
            if initial_state is None
            else (list(initial_state) if isinstance(initial_state, (list, tuple)) else [initial_state])
        )
        # Keras 3 fills a layer's mask from its input only where the call has one tensor
        # argument: with initial_state given by keyword, the sequence's mask is not applied
        # (the list form masks, as tf.keras did)
        if mask is None and isinstance(inputs, SymbolicTensor) and (listed or not states):
            mask = implicit_mask(inputs)
        if not states and mask is None:
            out = Layer.__call__(self, inputs)
        else:
            items = [inputs, *states] + ([mask] if mask is not None else [])
            out = Layer.__call__(self, items, n_states=len(states), has_mask=mask is not None)
        if mask is not None and isinstance(mask, SymbolicTensor) and self.return_sequences:
            first = out[0] if isinstance(out, list) else out
            first.keras_mask = mask  # Keras propagates the mask of returned sequences
            if isinstance(out, list) and getattr(self, "merge_mode", "") is None:
                out[1].keras_mask = mask
        return out

    def _ensure_built(self, input_shape):
        super()._ensure_built(first_shape(input_shape))

    def _check_spec(self, shape):
        super()._check_spec(first_shape(shape))

    def build(self, input_shape):
        self._build_math(input_shape[-1])
        self.input_spec = InputSpec(ndim=3, axes={-1: self.input_dim})

    def compute_output_shape(self, input_shape, n_states=0, has_mask=False):
        b, t = first_shape(input_shape)[:2]
        out = (b, t, self.units) if self.return_sequences else (b, self.units)
        if self.return_state:
            return [out] + [(b, s) for s in self.state_size]
        return out

    def _prepare_inputs(self, inputs):
        # overridden so that graphs run these layers through _numeric_call, which unpacks
        # [x, *initial_states, mask] and validates states and masks
        return inputs

    def _numeric_call(self, inputs, args=(), kwargs=None, embedding=None):
        """Validate and run on arrays. ``embedding``: an Embedding layer folded into this one by
        its model (``folding.py``); the sequence input then holds the ids it would look up,
        validated by it, and this layer projects its table's rows instead of the looked-up
        vectors (``_input_weights``)."""
        kwargs = dict(kwargs or {})
        n_states, has_mask = kwargs.pop("n_states", 0), kwargs.pop("has_mask", False)
        where = f"layer {self.name!r} ({type(self).__name__})"
        if isinstance(inputs, (list, tuple)):
            x, rest = inputs[0], list(inputs[1:])
        else:
            x, rest = inputs, []
        if len(rest) != n_states + int(has_mask):
            raise ShapeError(
                f"{where}: expected {n_states} initial state(s)"
                f"{' and a mask' if has_mask else ''}, got {len(rest)} extra input(s)"
            )
        table = None
        if embedding is not None:
            ids = embedding._prepare_inputs(x)
            embedding._check_spec((None, *ids.shape[1:]))
            if ids.ndim == 2:
                x, table = ids, embedding.embeddings
            else:  # not a (batch, time) sequence of ids: look them up (and fail as unfolded)
                x = embedding.call(ids)
        if table is None:
            x = self._float_input(x, where)
        shape = (None, *x.shape[1:]) if table is None else (None, x.shape[1], table.shape[1])
        if not self.built:
            self._ensure_built(shape)
        self._check_spec(shape)
        states = self._check_states(rest[:n_states], x.shape[0], where) if n_states else None
        mask = self._check_mask(rest[n_states], tuple(x.shape[:2]), where) if has_mask else None
        if table is None:
            return self.call(x, initial_state=states, mask=mask)
        return self._sequence(x, states, mask, table)

    def _check_mask(self, mask, bt, where):
        if not self.ops.is_device_array(mask):
            mask = np.asarray(mask)
        if tuple(mask.shape) != tuple(bt):
            raise ShapeError(f"{where}: expected a mask of shape (batch, time) = {tuple(bt)}, got {tuple(mask.shape)}")
        return self.ops.nonzero_mask(mask)

    def _check_states(self, states, batch, where):
        if len(states) != len(self.state_size):
            raise ShapeError(
                f"{where}: expected {len(self.state_size)} initial state(s) "
                f"({', '.join(self.state_names)}), got {len(states)}"
            )
        out = []
        for name, size, s in zip(self.state_names, self.state_size, states):
            s = self._float_input(s, f"{where} initial state {name!r}")
            if tuple(s.shape) != (batch, size):
                raise ShapeError(
                    f"{where}: initial state {name!r} expects shape ({batch}, {size}), got {tuple(s.shape)}"
                )
            out.append(self.ops.contiguous(s))
        return out

    # ------------------------------------------------------------------------------ compute
    def _zero_states(self, batch):
        return [self.ops.zeros((batch, s)) for s in self.state_size]

    def call(self, x, initial_state=None, mask=None):
        return self._sequence(x, initial_state, mask)

    def _sequence(self, x, initial_state, mask, table=None):
        """``call``, or with an embedding ``table`` on ids x (B, T) of its rows."""
        self._check_steps(x)
        states = initial_state if initial_state is not None else self._zero_states(x.shape[0])
        y, new_states = self._run(x, states, mask, table=table, **self._direction())
        return self._layer_outputs(self.ops, y, new_states)

    def _check_steps(self, x):
        if x.shape[1] == 0:
            raise ShapeError(
                f"layer {self.name!r} ({type(self).__name__}): the sequence has no "
                f"timesteps (input shape {shape_str(x.shape)})"
            )

    def _direction(self):
        """The sequence call's keyword arguments set by the layer's configuration."""
        return dict(
            reverse=self.go_backwards, return_sequences=self.return_sequences, zero_masked=self.zero_output_for_mask
        )

    def _layer_outputs(self, ops, y, new_states):
        """The layer's outputs from the sequence call's output y and final states."""
        if self.return_sequences and self.go_backwards:
            y = ops.take(y, REVERSED_TIME)  # Keras returns outputs in processing order
        return [y, *new_states] if self.return_state else y

    def bind(self, ops, x):
        # the plain call (no initial state, no mask: those run through _numeric_call) on
        # float sequences with timesteps; the empty sequence raises in call
        if type(x) is not np.ndarray or x.ndim != 3 or x.shape[1] == 0:
            return None
        states = [ops.zeros((x.shape[0], size)) for size in self.state_size]
        cell, args, kw = self._sequence_call(states, None, **self._direction())
        run = ops.sequence_plan(cell, x, args, kw)
        outputs = self._layer_outputs

        def step(x):
            y, *new_states = run(x)
            return outputs(ops, y, new_states)

        return self._while_same(step, tuple(self._weight_names))

    # ---------------------------------------------------------------------------- streaming
    def get_stream_state(self, batch_size: int = 1, initial_state=None) -> StreamState:
        """A fresh ``StreamState`` (zeros, or ``initial_state``) for ``stream``.

        Shape
        -----
        Holds ``h`` (and ``c`` for LSTM) of shape (batch_size, units) and ``y``, the last output
        (what masked steps repeat).
        """
        if self.go_backwards:
            raise UnsupportedError(
                f"{type(self).__name__} {self.name!r}: go_backwards reads the "
                "sequence from its end; it cannot be streamed"
            )
        if not self.built:
            raise ShapeError(
                f"{type(self).__name__} {self.name!r} is not built yet; call it once "
                "or put it in a model with a known input shape first"
            )
        where = f"layer {self.name!r} ({type(self).__name__})"
        states = (
            self._check_states(list(initial_state), batch_size, where)
            if initial_state is not None
            else self._zero_states(batch_size)
        )
        arrays = dict(zip(self.state_names, states))
        arrays["y"] = np.zeros((batch_size, self.units), np.float32)
        return StreamState(arrays, self.name)

    def stream(self, x, state: StreamState, mask=None) -> np.ndarray:
        """Run the next timestep(s) of a stream, updating ``state`` in place.

        Parameters
        ----------
        x : ndarray
            (batch, time, features) for a chunk of timesteps, or (batch, features) for one step.
        state : StreamState
            From ``get_stream_state``; keep one per stream.
        mask : ndarray of bool, optional
            (batch, time) (or (batch,) for one step), True = valid step.

        Returns
        -------
        ndarray
            The outputs of these steps: (batch, time, units), or (batch, units) for one step,
            equal to the corresponding slice of a full-sequence call with ``return_sequences``.
        """
        where = f"layer {self.name!r} ({type(self).__name__}) stream"
        x = as_float32(x, where)
        one_step = x.ndim == 2
        if one_step:
            x = x[:, None, :]
            if mask is not None:
                mask = np.asarray(mask).reshape(-1, 1)
        shape = (None, *x.shape[1:])
        self._ensure_built(shape)
        self._check_spec(shape)
        state.check_batch(x.shape[0], where)
        if mask is not None:
            mask = self._check_mask(mask, x.shape[:2], where)
        if x.shape[1] == 0:
            return np.zeros((x.shape[0], 0, self.units), np.float32)
        y, new_states = self._run(
            x,
            [state[n] for n in self.state_names],
            mask,
            return_sequences=True,
            zero_masked=self.zero_output_for_mask,
            y0=state["y"],
        )
        for name, value in zip(self.state_names, new_states):
            state[name] = value
        if mask is None:
            state["y"] = y[:, -1]
        else:  # the carried output: the last valid step's output, else unchanged
            valid = mask.any(axis=1)
            last = np.where(mask, np.arange(mask.shape[1]), -1).max(axis=1)
            state["y"] = np.where(valid[:, None], y[np.arange(y.shape[0]), np.maximum(last, 0)], state["y"])
        state.steps += x.shape[1]
        return y[:, 0] if one_step else y


class SimpleRNN(_SimpleRNNMath, RecurrentLayer):
    """Fully connected RNN: ``h_t = activation(x_t @ kernel + h_{t-1} @ recurrent_kernel + bias)``.

    Parameters
    ----------
    units : int
    activation : str, default "tanh"
    use_bias : bool, default True
    return_sequences, return_state, go_backwards : bool, default False
        As Keras: all outputs or the last; also return the final state; read time backwards
        (outputs then come in processing order).
    zero_output_for_mask : bool, default False
        Masked steps output zeros instead of repeating the previous output.

    Call
    ----
    ``initial_state`` (list [h]), ``mask`` (batch, time) bool. dropout, recurrent_dropout,
    unroll (and use_cudnn for LSTM/GRU) are accepted and ignored (inference).

    Shape
    -----
    (batch, time, input_dim) -> (batch, time, units) with return_sequences, else (batch, units);
    with return_state, [output, h]. Weights: kernel (input_dim, units), recurrent_kernel
    (units, units), bias (units,).
    """

    config_keys = RecurrentLayer._common_keys

    def __init__(
        self,
        units,
        activation="tanh",
        use_bias=True,
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        zero_output_for_mask=False,
        dropout=0.0,
        recurrent_dropout=0.0,
        unroll=False,
        **kwargs,
    ):
        _pop_ignored(kwargs)
        super().__init__(**kwargs)
        self._init_math(units, activation, "sigmoid", use_bias)
        self._init_layer(return_sequences, return_state, go_backwards, stateful, zero_output_for_mask)


class LSTM(_LSTMMath, RecurrentLayer):
    """Long short-term memory (Hochreiter 1997), Keras semantics, gate blocks i, f, c, o.

    ``c = ract(f) c + ract(i) act(x W_c + h U_c + b_c)``, ``h = ract(o) act(c)``.

    Parameters
    ----------
    units : int
    activation : str, default "tanh"
    recurrent_activation : str, default "sigmoid"
    use_bias : bool, default True
    unit_forget_bias : bool, default True
        Initialize the forget-gate bias to 1 (only matters for fresh weights).
    return_sequences, return_state, go_backwards, zero_output_for_mask : bool
        As ``SimpleRNN``.

    Call
    ----
    ``initial_state`` (list [h, c]), ``mask`` (batch, time) bool.

    Shape
    -----
    (batch, time, input_dim) -> (batch, time, units) or (batch, units); with return_state
    [output, h, c]. Weights: kernel (input_dim, 4 units), recurrent_kernel (units, 4 units),
    bias (4 units,).
    """

    config_keys = RecurrentLayer._common_keys + ("recurrent_activation", "unit_forget_bias")

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        unit_forget_bias=True,
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        zero_output_for_mask=False,
        dropout=0.0,
        recurrent_dropout=0.0,
        unroll=False,
        use_cudnn="auto",
        **kwargs,
    ):
        _pop_ignored(kwargs)
        super().__init__(**kwargs)
        self.unit_forget_bias = bool(unit_forget_bias)
        self._init_math(units, activation, recurrent_activation, use_bias)
        self._init_layer(return_sequences, return_state, go_backwards, stateful, zero_output_for_mask)


class GRU(_GRUMath, RecurrentLayer):
    """Gated recurrent unit (Cho 2014), Keras semantics, gate blocks z, r, h.

    ``h = z h_prev + (1 - z) act(x W_h + r (h_prev U_h + b_rh))`` with ``reset_after=True``
    (Keras 3's default, torch's and cuDNN's form) or ``act(x W_h + (r h_prev) U_h + b_h)``.

    Parameters
    ----------
    units : int
    activation : str, default "tanh"
    recurrent_activation : str, default "sigmoid"
    use_bias : bool, default True
    reset_after : bool, default True
    return_sequences, return_state, go_backwards, zero_output_for_mask : bool
        As ``SimpleRNN``.

    Shape
    -----
    (batch, time, input_dim) -> (batch, time, units) or (batch, units); with return_state
    [output, h]. Weights: kernel (input_dim, 3 units), recurrent_kernel (units, 3 units),
    bias (2, 3 units) with reset_after (input and recurrent bias), else (3 units,).
    """

    config_keys = RecurrentLayer._common_keys + ("recurrent_activation", "reset_after")

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        return_sequences=False,
        return_state=False,
        go_backwards=False,
        stateful=False,
        reset_after=True,
        zero_output_for_mask=False,
        dropout=0.0,
        recurrent_dropout=0.0,
        unroll=False,
        use_cudnn="auto",
        **kwargs,
    ):
        _pop_ignored(kwargs)
        super().__init__(**kwargs)
        self.reset_after = bool(reset_after)
        self._init_math(units, activation, recurrent_activation, use_bias)
        self._init_layer(return_sequences, return_state, go_backwards, stateful, zero_output_for_mask)


# -------------------------------------------------------------------------------------- cells
class _Cell(Layer):
    """One timestep: ``cell(x, states) -> (output, new_states)`` as Keras cells."""

    _cell_keys = ("units", "activation", "use_bias")

    def __init__(self, **kwargs):
        _pop_ignored(kwargs)
        super().__init__(**kwargs)

    def build(self, input_shape):
        self._build_math(input_shape[-1])
        self.input_spec = InputSpec(ndim=2, axes={-1: self.input_dim})

    def get_initial_state(self, batch_size=None):
        """Zero states, one (batch_size, units) array per state."""
        return [np.zeros((batch_size or 1, s), np.float32) for s in self.state_size]

    def compute_output_shape(self, input_shape, states=None):
        return (input_shape[0], self.units)

    def __call__(self, inputs, states=None, training=None):
        if states is None:
            raise TypeError(f"{type(self).__name__} {self.name!r}: call it as cell(x, states)")
        if isinstance(inputs, SymbolicTensor):
            raise UnsupportedError(
                f"{type(self).__name__} {self.name!r}: cells run on arrays; in a graph use SimpleRNN, LSTM or GRU"
            )
        return super().__call__(inputs, states)

    def call(self, x, states):
        where = f"layer {self.name!r} ({type(self).__name__})"
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        states = RecurrentLayer._check_states(self, states, x.shape[0], where)
        n, features = x.shape
        y, new_states = self._run(x.reshape(n, 1, features), states, None, return_sequences=False)
        return y, new_states


class SimpleRNNCell(_SimpleRNNMath, _Cell):
    """One step of ``SimpleRNN``: ``cell(x (batch, input_dim), [h]) -> (h_new, [h_new])``.

    Shape
    -----
    x (batch, input_dim), states [(batch, units)] -> (batch, units), [(batch, units)].
    """

    config_keys = _Cell._cell_keys

    def __init__(self, units, activation="tanh", use_bias=True, dropout=0.0, recurrent_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self._init_math(units, activation, "sigmoid", use_bias)


class LSTMCell(_LSTMMath, _Cell):
    """One step of ``LSTM``: ``cell(x, [h, c]) -> (h_new, [h_new, c_new])``.

    Shape
    -----
    x (batch, input_dim), states [(batch, units)] * 2 -> (batch, units), [h, c].
    """

    config_keys = _Cell._cell_keys + ("recurrent_activation", "unit_forget_bias")

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        unit_forget_bias=True,
        dropout=0.0,
        recurrent_dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.unit_forget_bias = bool(unit_forget_bias)
        self._init_math(units, activation, recurrent_activation, use_bias)


class GRUCell(_GRUMath, _Cell):
    """One step of ``GRU``: ``cell(x, [h]) -> (h_new, [h_new])``.

    Shape
    -----
    x (batch, input_dim), states [(batch, units)] -> (batch, units), [(batch, units)].
    """

    config_keys = _Cell._cell_keys + ("recurrent_activation", "reset_after")

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        reset_after=True,
        dropout=0.0,
        recurrent_dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.reset_after = bool(reset_after)
        self._init_math(units, activation, recurrent_activation, use_bias)
