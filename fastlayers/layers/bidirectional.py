"""Keras's Bidirectional wrapper: a recurrent layer (``recurrent.py``) run forwards and a copy
backwards, their outputs merged."""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, UnsupportedError
from .base import InputSpec, Layer
from .recurrent import GRU, LSTM, REVERSED_TIME, RecurrentLayer, SimpleRNN, first_shape

_MERGE_MODES = ("concat", "sum", "mul", "ave", None)


class Bidirectional(Layer):
    """Run a recurrent layer forwards and a copy backwards, and merge their outputs (Keras).

    Parameters
    ----------
    layer : SimpleRNN, LSTM or GRU
        The forward layer's template (cloned from its config, named ``forward_<name>``).
    merge_mode : {"concat", "sum", "mul", "ave", None}, default "concat"
        None returns the two outputs as a list.
    backward_layer : layer, optional
        The backward layer (default: a clone of ``layer`` with ``go_backwards`` flipped).

    Call
    ----
    ``initial_state`` (forward states then backward states), ``mask``.

    Weights
    -------
    The forward layer's, then the backward layer's, named ``forward_<weight>`` and
    ``backward_<weight>``.

    Shape
    -----
    (batch, time, input_dim) -> (batch, time, 2 units) with concat and return_sequences
    ((batch, 2 units) without), (.., units) for sum/mul/ave; with return_state the states of
    both directions follow the output(s).
    """

    config_keys = ("merge_mode",)
    plain_call_validated = True

    def __init__(self, layer, merge_mode="concat", backward_layer=None, weights=None, **kwargs):
        if not isinstance(layer, RecurrentLayer):
            raise UnsupportedError(f"Bidirectional wraps SimpleRNN, LSTM or GRU, got {type(layer).__name__}")
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"Bidirectional: merge_mode must be one of {_MERGE_MODES}, got {merge_mode!r}")
        super().__init__(**kwargs)
        config = layer.get_config()
        self.forward_layer = type(layer).from_config({**config, "name": f"forward_{layer.name}"})
        if backward_layer is None:
            self.backward_layer = type(layer).from_config(
                {**config, "name": f"backward_{layer.name}", "go_backwards": not layer.go_backwards}
            )
        else:
            if not isinstance(backward_layer, RecurrentLayer):
                raise UnsupportedError("Bidirectional: backward_layer must be SimpleRNN, LSTM or GRU")
            self.backward_layer = backward_layer
        for sub in (self.forward_layer, self.backward_layer):
            sub.zero_output_for_mask = sub.return_sequences  # as Keras forces it
        self.merge_mode = merge_mode
        self.return_sequences = self.forward_layer.return_sequences
        self.return_state = self.forward_layer.return_state
        self._layer_config = {"class_name": type(layer).__name__, "config": config}
        self._backward_config = (
            None
            if backward_layer is None
            else {"class_name": type(backward_layer).__name__, "config": backward_layer.get_config()}
        )
        self.input_spec = InputSpec(ndim=3)
        if weights is not None:
            raise UnsupportedError("Bidirectional(weights=...) is not supported; use set_weights")

    # weights of the two sub-layers, exposed as forward_<name> / backward_<name>
    def __getattr__(self, name):
        for prefix in ("forward_", "backward_"):
            if name.startswith(prefix) and name != prefix + "layer":
                sub = self.__dict__.get(prefix + "layer")
                if sub is not None and name[len(prefix) :] in sub.__dict__.get("_weight_names", ()):
                    return getattr(sub, name[len(prefix) :])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        for prefix in ("forward_", "backward_"):
            sub = self.__dict__.get(prefix + "layer")
            if name.startswith(prefix) and sub is not None and name[len(prefix) :] in sub._weight_names:
                setattr(sub, name[len(prefix) :], value)
                return
        object.__setattr__(self, name, value)

    @property
    def weight_names(self):
        return [f"forward_{n}" for n in self.forward_layer.weight_names] + [
            f"backward_{n}" for n in self.backward_layer.weight_names
        ]

    @property
    def weights(self):
        return self.forward_layer.weights + self.backward_layer.weights

    def get_weights(self):
        return self.forward_layer.get_weights() + self.backward_layer.get_weights()

    def set_weights(self, weights):
        weights = list(weights)
        if not self.built:
            raise ShapeError(f"layer {self.name!r} (Bidirectional) is not built yet; call it once first")
        n = len(self.forward_layer.weights)
        if len(weights) != n + len(self.backward_layer.weights):
            raise ShapeError(
                f"layer {self.name!r} (Bidirectional) expects "
                f"{n + len(self.backward_layer.weights)} weights, got {len(weights)}"
            )
        self.forward_layer.set_weights(weights[:n])
        self.backward_layer.set_weights(weights[n:])

    def count_params(self):
        return self.forward_layer.count_params() + self.backward_layer.count_params()

    def _weights_changed(self):
        self.forward_layer._weights_changed()
        self.backward_layer._weights_changed()

    def get_config(self):
        config = {"name": self.name, "layer": self._layer_config, "merge_mode": self.merge_mode}
        if self._backward_config is not None:
            config["backward_layer"] = self._backward_config
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        layer = _wrapped_from_config(config.pop("layer", None))
        backward = config.pop("backward_layer", None)
        if backward is not None:
            backward = _wrapped_from_config(backward)
        return cls(layer, backward_layer=backward, **config)

    # ----------------------------------------------------------------------------- calling
    def __call__(self, inputs, initial_state=None, mask=None, training=None, **kwargs):
        return RecurrentLayer.__call__(self, inputs, initial_state=initial_state, mask=mask, **kwargs)

    _prepare_inputs = RecurrentLayer._prepare_inputs

    def _ensure_built(self, input_shape):
        shape = first_shape(input_shape)
        if not self.built:
            with self._build_lock:
                if not self.built:
                    self._check_spec(shape)
                    self.forward_layer._ensure_built(shape)
                    self.backward_layer._ensure_built(shape)
                    self.input_spec = InputSpec(ndim=3, axes={-1: shape[-1]})
                    self.built = True

    def _check_spec(self, shape):
        Layer._check_spec(self, first_shape(shape))

    def compute_output_shape(self, input_shape, n_states=0, has_mask=False):
        shape = first_shape(input_shape)
        out_f = self.forward_layer.compute_output_shape(shape)
        out_b = self.backward_layer.compute_output_shape(shape)
        states = []
        if self.return_state:
            out_f, states_f = out_f[0], out_f[1:]
            out_b, states_b = out_b[0], out_b[1:]
            states = states_f + states_b
        if self.merge_mode is None:
            outputs = [out_f, out_b]
        elif self.merge_mode == "concat":
            outputs = [(*out_f[:-1], out_f[-1] + out_b[-1])]
        else:
            outputs = [out_f]
        return outputs + states if (self.return_state or self.merge_mode is None) else outputs[0]

    def _numeric_call(self, inputs, args=(), kwargs=None):
        return RecurrentLayer._numeric_call(self, inputs, args, kwargs)

    @property
    def state_size(self):
        return self.forward_layer.state_size + self.backward_layer.state_size

    @property
    def state_names(self):
        return tuple(f"forward_{n}" for n in self.forward_layer.state_names) + tuple(
            f"backward_{n}" for n in self.backward_layer.state_names
        )

    def _check_states(self, states, batch, where):
        return RecurrentLayer._check_states(self, states, batch, where)

    _check_mask = RecurrentLayer._check_mask

    def call(self, x, initial_state=None, mask=None):
        # the two directions in one backend call: at once where the backend can
        nf = len(self.forward_layer.state_size)
        subs = (self.forward_layer, self.backward_layer)
        inits = (None, None) if initial_state is None else (initial_state[:nf], initial_state[nf:])
        calls = []
        for sub, init in zip(subs, inits):
            sub._check_steps(x)
            cell, args, kw = sub._sequence_call(
                sub._zero_states(x.shape[0]) if init is None else init, mask, **sub._direction()
            )
            calls.append((cell, (x, *args), kw))
        return self._merge(self.ops, self.ops.recurrent_sequences(calls))

    def bind(self, ops, x):
        # the plain call on float sequences with timesteps, as RecurrentLayer.bind
        if type(x) is not np.ndarray or x.ndim != 3 or x.shape[1] == 0:
            return None
        calls = [
            sub._sequence_call([ops.zeros((x.shape[0], size)) for size in sub.state_size], None, **sub._direction())
            for sub in (self.forward_layer, self.backward_layer)
        ]
        run, merge = ops.sequences_plan(x, calls), self._merge

        def step(x):
            return merge(ops, run(x))

        subs = (self.forward_layer, self.backward_layer)
        return self._while_same(
            step, ("forward_layer", "backward_layer", *((sub, name) for sub in subs for name in sub.weight_names))
        )

    def _merge(self, ops, results):
        """The layer's outputs from the results (y, *states) of its two directions' sequence
        calls."""
        out_f, out_b = (
            sub._layer_outputs(ops, y, states)
            for sub, (y, *states) in zip((self.forward_layer, self.backward_layer), results)
        )
        states = []
        if self.return_state:
            out_f, states_f = out_f[0], out_f[1:]
            out_b, states_b = out_b[0], out_b[1:]
            states = states_f + states_b
        if self.return_sequences:
            out_b = ops.take(out_b, REVERSED_TIME)
        if self.merge_mode == "concat":
            y = [ops.concatenate([out_f, out_b], -1)]
        elif self.merge_mode == "sum":
            y = [ops.merge(out_f, out_b, "add")]
        elif self.merge_mode == "ave":
            y = [ops.merge(out_f, out_b, "add", 0.5, 0.5)]
        elif self.merge_mode == "mul":
            y = [ops.merge(out_f, out_b, "multiply")]
        else:
            y = [out_f, out_b]
        return y + states if (self.return_state or self.merge_mode is None) else y[0]


#: The layers Bidirectional wraps, by the class names of its config (``get_config``).
_WRAPPABLE = {"SimpleRNN": SimpleRNN, "LSTM": LSTM, "GRU": GRU}


def _wrapped_from_config(entry):
    """The wrapped layer of a Bidirectional config: ``{"class_name", "config"}`` rebuilt."""
    cls = _WRAPPABLE.get(entry.get("class_name")) if isinstance(entry, dict) else None
    if cls is None or not isinstance(entry.get("config"), dict):
        found = entry.get("class_name") if isinstance(entry, dict) else type(entry).__name__
        raise UnsupportedError(
            f"Bidirectional config: the wrapped layer must be a SimpleRNN, LSTM "
            f"or GRU entry {{'class_name': ..., 'config': {{...}}}}, found {found!r}"
        )
    return cls.from_config(dict(entry["config"]))
