"""torch.nn recurrent modules: RNN, LSTM (proj_size), GRU and their cells, with torch's
parameter names (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, weight_hr_l0, ..._reverse),
shapes, gate orders (LSTM i, f, g, o; GRU r, z, n) and outputs (``out, h_n`` / ``out, (h_n, c_n)``).

Weights are converted once to the canonical layout of the recurrent primitives (kernels
transposed to (input, gates*hidden), the two LSTM/RNN biases summed, GRU blocks reordered to
z, r, n) and cached until a parameter array is replaced (``load_state_dict`` or assignment).
Streaming: ``state = m.get_stream_state(batch)``; ``out = m.stream(chunk, state)``.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends import get_ops
from ..errors import ShapeError, UnsupportedError
from ..layers.streaming import StreamState
from .module import Module

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _uniform(rng, bound, shape):
    # float32 from the start, in place (no float64 array of the weight's size)
    a = rng.random(shape, dtype=np.float32)
    a *= np.float32(2 * bound)
    a -= np.float32(bound)
    return a


def _c(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _gru_zrn(a):
    """torch's GRU blocks r, z, n along axis 0 -> z, r, n (Keras's order, the primitive's)."""
    r, z, n = np.split(a, 3, axis=0)
    return np.concatenate([z, r, n], axis=0)


def _canonical(mode, w_ih, w_hh, b_ih, b_hh, w_hr=None):
    """Primitive arguments from torch parameters of one layer and direction."""
    if mode == "GRU":
        return (
            _c(_gru_zrn(w_ih).T),
            _c(_gru_zrn(w_hh).T),
            None if b_ih is None else _c(_gru_zrn(b_ih)),
            None if b_hh is None else _c(_gru_zrn(b_hh)),
        )
    bias = None if b_ih is None else _c(b_ih + b_hh)
    if mode == "LSTM":
        return _c(w_ih.T), _c(w_hh.T), bias, None if w_hr is None else _c(w_hr.T)
    return _c(w_ih.T), _c(w_hh.T), bias


def _run(mode, weights, x_bti, states, *, reverse=False, return_sequences=True):
    """One layer/direction over x (B, T, I): (y, new_states) with the canonical ``weights``."""
    ops = get_ops()
    if mode == "LSTM":
        w_ig, w_hg, b, w_hp = weights
        y, h, c = ops.lstm_sequence(
            x_bti, w_ig, w_hg, b, states[0], states[1], w_hp=w_hp, reverse=reverse, return_sequences=return_sequences
        )
        return y, [h, c]
    if mode == "GRU":
        y, h = ops.gru_sequence(
            x_bti, *weights, states[0], reset_after=True, reverse=reverse, return_sequences=return_sequences
        )
        return y, [h]
    act = "tanh" if mode == "RNN_TANH" else "relu"
    y, h = ops.rnn_sequence(
        x_bti, *weights, states[0], activation=act, reverse=reverse, return_sequences=return_sequences
    )
    return y, [h]


class _CanonicalCache:
    """Canonical weights per key, recomputed when the parameter arrays are replaced."""

    def __init__(self):
        self._entries = {}

    def get(self, key, arrays, make):
        ids = tuple(id(a) for a in arrays)
        entry = self._entries.get(key)
        if entry is None or entry[0] != ids:
            entry = (ids, make(), arrays)  # keep the arrays alive so their ids stay unique
            self._entries[key] = entry
        return entry[1]


class RNNBase(Module):
    """Shared code of RNN, LSTM and GRU (torch.nn.RNNBase)."""

    def __init__(
        self,
        mode,
        input_size,
        hidden_size,
        num_layers=1,
        bias=True,
        batch_first=False,
        dropout=0.0,
        bidirectional=False,
        proj_size=0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.mode = mode
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias = int(num_layers), bool(bias)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self.bidirectional, self.proj_size = bool(bidirectional), int(proj_size)
        if self.hidden_size <= 0 or self.num_layers <= 0:
            raise ValueError(f"{type(self).__name__}: hidden_size and num_layers must be positive")
        if self.proj_size < 0 or (self.proj_size and self.proj_size >= self.hidden_size):
            raise ValueError(f"{type(self).__name__}: proj_size must be in [0, hidden_size), got {proj_size}")
        if self.proj_size and mode != "LSTM":
            raise ValueError("proj_size is only supported by LSTM")
        object.__setattr__(self, "_cache", _CanonicalCache())
        rng = np.random.default_rng()
        bound = 1.0 / math.sqrt(self.hidden_size)
        gate_size = _GATES[mode] * self.hidden_size
        real_hidden = self.proj_size or self.hidden_size
        self._flat_names = []
        for layer in range(self.num_layers):
            for direction in range(self.num_directions):
                in_size = self.input_size if layer == 0 else real_hidden * self.num_directions
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = [("weight_ih" + sfx, (gate_size, in_size)), ("weight_hh" + sfx, (gate_size, real_hidden))]
                if self.bias:
                    shapes += [("bias_ih" + sfx, (gate_size,)), ("bias_hh" + sfx, (gate_size,))]
                if self.proj_size:
                    shapes += [("weight_hr" + sfx, (self.proj_size, self.hidden_size))]
                for name, shape in shapes:
                    setattr(self, name, _uniform(rng, bound, shape))
                    self._flat_names.append(name)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def _out_size(self) -> int:
        return self.proj_size or self.hidden_size

    def _weights(self, layer, direction):
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        arrays = [getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)]
        arrays += [getattr(self, "bias_ih" + sfx), getattr(self, "bias_hh" + sfx)] if self.bias else [None, None]
        if self.proj_size:
            arrays.append(getattr(self, "weight_hr" + sfx))
        return self._cache.get((layer, direction), arrays, lambda: _canonical(self.mode, *arrays))

    def _state_changed(self):
        object.__setattr__(self, "_cache", _CanonicalCache())
        super()._state_changed()

    # ---------------------------------------------------------------------------- checking
    def _prepare(self, input, hx):
        name = type(self).__name__
        x = np.asarray(input)
        if x.dtype != np.float32:
            if x.dtype.kind not in "biuf":
                raise ShapeError(f"{name}: expected a numeric input, got dtype {x.dtype}")
            x = x.astype(np.float32)
        if x.ndim not in (2, 3):
            raise ShapeError(f"{name}: expected a 2-D (unbatched) or 3-D input, got shape {x.shape}")
        batched = x.ndim == 3
        if not batched:
            x = x[:, None, :] if not self.batch_first else x[None]
        x_bti = x if self.batch_first else np.swapaxes(x, 0, 1)
        if x_bti.shape[2] != self.input_size:
            raise ShapeError(
                f"{name}: expected input feature size {self.input_size}, got "
                f"{x_bti.shape[2]} (input shape {np.shape(input)})"
            )
        if x_bti.shape[1] == 0:
            raise ShapeError(f"{name}: the sequence has no timesteps")
        batch = x_bti.shape[0]
        n = self.num_layers * self.num_directions
        want = [("h_0", (n, batch, self._out_size))]
        if self.mode == "LSTM":
            want.append(("c_0", (n, batch, self.hidden_size)))
        if hx is None:
            states = [np.zeros(s, np.float32) for _, s in want]
        else:
            hs = list(hx) if self.mode == "LSTM" else [hx]
            if len(hs) != len(want):
                raise ShapeError(f"{name}: expected hx as {' and '.join(w for w, _ in want)}")
            states = []
            for (what, shape), h in zip(want, hs):
                h = np.asarray(h.detach().cpu().numpy() if hasattr(h, "detach") else h, np.float32)
                if not batched:
                    h = h[:, None, :] if h.ndim == 2 else h
                if h.shape != shape:
                    raise ShapeError(
                        f"{name}: expected {what} of shape {shape[0], *shape[1:]}"
                        f"{'' if batched else ' (unbatched: without the batch axis)'}, "
                        f"got {np.shape(h)}"
                    )
                states.append(h)
        return x_bti, states, batched

    # ----------------------------------------------------------------------------- forward
    def _forward_bti(self, x_bti, states):
        """Run all layers and directions; return y (B, T, D*out) and the final states."""
        n_states = len(states)
        finals = [[None] * (self.num_layers * self.num_directions) for _ in range(n_states)]
        y = x_bti
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                init = [np.ascontiguousarray(s[k]) for s in states]
                out, new = _run(self.mode, self._weights(layer, d), y, init, reverse=d == 1)
                outs.append(out)
                for i in range(n_states):
                    finals[i][k] = new[i]
            y = outs[0] if len(outs) == 1 else np.concatenate(outs, axis=-1)
        return y, [np.stack(f) for f in finals]

    def forward(self, input, hx=None):
        x_bti, states, batched = self._prepare(input, hx)
        y, finals = self._forward_bti(x_bti, states)
        out = y if self.batch_first else np.ascontiguousarray(np.swapaxes(y, 0, 1))
        if not batched:
            out = out[0] if self.batch_first else out[:, 0]
            finals = [f[:, 0] for f in finals]
        if self.mode == "LSTM":
            return out, (finals[0], finals[1])
        return out, finals[0]

    # --------------------------------------------------------------------------- streaming
    def get_stream_state(self, batch_size: int = 1) -> StreamState:
        """A zero ``StreamState`` holding h (and c) as (num_layers, batch, hidden) for ``stream``."""
        if self.bidirectional:
            raise UnsupportedError(
                f"{type(self).__name__}: a bidirectional module reads the sequence from its end; it cannot be streamed"
            )
        arrays = {"h": np.zeros((self.num_layers, batch_size, self._out_size), np.float32)}
        if self.mode == "LSTM":
            arrays["c"] = np.zeros((self.num_layers, batch_size, self.hidden_size), np.float32)
        return StreamState(arrays, type(self).__name__, batch_axis=1)

    def stream(self, input, state: StreamState):
        """Run the next chunk of timesteps (shaped as ``forward``'s batched input), updating
        ``state``; returns the chunk's output, equal to that slice of a full-sequence forward."""
        x = np.asarray(input)
        if x.ndim != 3:
            raise ShapeError(f"{type(self).__name__}.stream: expected a batched 3-D chunk, got shape {x.shape}")
        hx = (state["h"], state["c"]) if self.mode == "LSTM" else state["h"]
        out, new = self.forward(x, hx)
        if self.mode == "LSTM":
            state["h"], state["c"] = new
        else:
            state["h"] = new
        state.steps += x.shape[0 if not self.batch_first else 1]
        return out

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        return s


class RNN(RNNBase):
    """Elman RNN, ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu), as torch.nn.RNN.

    Shape
    -----
    input (L, N, H_in) ((N, L, H_in) with batch_first; (L, H_in) unbatched), h_0
    (D * num_layers, N, H_out) -> output (L, N, D * H_out), h_n (D * num_layers, N, H_out).
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        num_layers=1,
        nonlinearity="tanh",
        bias=True,
        batch_first=False,
        dropout=0.0,
        bidirectional=False,
        device=None,
        dtype=None,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: unknown nonlinearity {nonlinearity!r}; expected 'tanh' or 'relu'")
        super().__init__(
            "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
        )
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Long short-term memory as torch.nn.LSTM (gate rows i, f, g, o; optional ``proj_size``).

    Shape
    -----
    input (L, N, H_in) ((N, L, H_in) with batch_first), (h_0, c_0) -> output
    (L, N, D * H_out), (h_n (D * num_layers, N, H_out), c_n (D * num_layers, N, H_cell)),
    with H_out = proj_size or hidden_size.
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        num_layers=1,
        bias=True,
        batch_first=False,
        dropout=0.0,
        bidirectional=False,
        proj_size=0,
        device=None,
        dtype=None,
    ):
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size
        )


class GRU(RNNBase):
    """Gated recurrent unit as torch.nn.GRU (gate rows r, z, n; ``n = tanh(W_in x + b_in +
    r (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``).

    Shape
    -----
    input (L, N, H_in) ((N, L, H_in) with batch_first), h_0 (D * num_layers, N, H_out) -> output
    (L, N, D * H_out), h_n (D * num_layers, N, H_out).
    """

    def __init__(
        self,
        input_size,
        hidden_size,
        num_layers=1,
        bias=True,
        batch_first=False,
        dropout=0.0,
        bidirectional=False,
        device=None,
        dtype=None,
    ):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)


# -------------------------------------------------------------------------------------- cells
class _CellBase(Module):
    mode = "RNN_TANH"

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bool(bias)
        object.__setattr__(self, "_cache", _CanonicalCache())
        rng = np.random.default_rng()
        bound = 1.0 / math.sqrt(self.hidden_size)
        g = _GATES[self.mode] * self.hidden_size
        self.weight_ih = _uniform(rng, bound, (g, self.input_size))
        self.weight_hh = _uniform(rng, bound, (g, self.hidden_size))
        if self.bias:
            self.bias_ih = _uniform(rng, bound, (g,))
            self.bias_hh = _uniform(rng, bound, (g,))

    def _state_changed(self):
        object.__setattr__(self, "_cache", _CanonicalCache())
        super()._state_changed()

    def _step(self, input, states):
        name = type(self).__name__
        x = np.asarray(input, np.float32)
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ShapeError(
                f"{name}: expected input (N, {self.input_size}) or ({self.input_size},), got shape {x.shape}"
            )
        batched = x.ndim == 2
        xb = x if batched else x[None]
        hs = []
        for i, h in enumerate(states):
            if h is None:
                hs.append(np.zeros((xb.shape[0], self.hidden_size), np.float32))
                continue
            h = np.asarray(h.detach().cpu().numpy() if hasattr(h, "detach") else h, np.float32)
            h = h if batched else h[None]
            if h.shape != (xb.shape[0], self.hidden_size):
                raise ShapeError(
                    f"{name}: expected state {i} of shape "
                    f"{(xb.shape[0], self.hidden_size) if batched else (self.hidden_size,)}, "
                    f"got {np.shape(states[i])}"
                )
            hs.append(np.ascontiguousarray(h))
        arrays = [self.weight_ih, self.weight_hh] + ([self.bias_ih, self.bias_hh] if self.bias else [None, None])
        weights = self._cache.get(0, arrays, lambda: _canonical(self.mode, *arrays))
        if self.mode == "LSTM":
            weights = (*weights[:3], None)
        _, new = _run(self.mode, weights, xb[:, None, :], hs, return_sequences=False)
        return [n if batched else n[0] for n in new]

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    """One step of ``RNN``: ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or relu).

    Shape
    -----
    input (N, H_in) or (H_in,), hx (N, H) -> h' (N, H).
    """

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity
        self.mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"

    def forward(self, input, hx=None):
        return self._step(input, [hx])[0]


class LSTMCell(_CellBase):
    """One step of ``LSTM``: ``(h', c') = cell(x, (h, c))``.

    Shape
    -----
    input (N, H_in) or (H_in,), (h, c) each (N, H) -> (h', c') each (N, H).
    """

    mode = "LSTM"

    def forward(self, input, hx=None):
        h, c = (None, None) if hx is None else hx
        new = self._step(input, [h, c])
        return new[0], new[1]


class GRUCell(_CellBase):
    """One step of ``GRU``: ``h' = cell(x, h)``.

    Shape
    -----
    input (N, H_in) or (H_in,), hx (N, H) -> h' (N, H).
    """

    mode = "GRU"

    def forward(self, input, hx=None):
        return self._step(input, [hx])[0]
