"""Recurrent sequences in plain numpy (the oracle of the native time loops in ``native/recurrent.c``).

Canonical layouts shared by every backend (loaders and layers convert once):

- input ``x`` is batch-major (batch, time, input), or integer ids (batch, time) standing for
  one-hot inputs, whose projection ``x_t @ w_ig`` is the row ``w_ig[ids[:, t]]`` (how a model
  runs an Embedding folded into the recurrent layer after it: ``w_ig`` is then the table of
  every embedding row's projection); outputs ``y`` are aligned with the input time
  axis (``y[:, t]`` is the output of the step that read ``x[:, t]``, also when ``reverse``);
- kernels are (input, gates * units) and recurrent kernels (units or proj, gates * units), so a
  step is ``x_t @ w_ig + h @ w_hg``;
- LSTM gate blocks i, f, g (cell candidate), o (Keras's i, f, c, o and torch's i, f, g, o);
  GRU gate blocks z (update), r (reset), h (candidate) as in Keras (torch's r, z, n is permuted
  on load); SimpleRNN has one block.

Masks (batch, time) bool, True = a valid step, follow Keras: a masked step keeps the state and
outputs the previous step's output (zeros before the first valid step, or with ``zero_masked``
zeros at every masked step, as Keras's ``zero_output_for_mask``).
"""

from __future__ import annotations

import numpy as np

from ..activations import DEFAULT_ALPHA, _activation


def _act(x, name):
    with np.errstate(over="ignore", invalid="ignore"):
        return _activation(x, name, DEFAULT_ALPHA.get(name, 0.0))


def _order(steps: int, reverse: bool):
    return range(steps - 1, -1, -1) if reverse else range(steps)


def run_sequence(x_bti, w_ig, b_g, state, step, *, mask_bt, reverse, return_sequences, zero_masked, y0, out_size):
    """The shared time loop: ``step(xw_t, state) -> (y_t, new_state)``; masking and outputs here.

    Returns ``(y, state)`` with y (B, T, out_size) or (B, out_size) (the last processed output).
    """
    b, t_len = x_bti.shape[:2]
    xw = w_ig[x_bti] if x_bti.ndim == 2 else np.matmul(x_bti, w_ig)
    if b_g is not None:
        xw += b_g
    carried = np.zeros((b, out_size), np.float32) if y0 is None else y0.astype(np.float32)
    ys = np.zeros((b, t_len, out_size), np.float32) if return_sequences else None
    stored = carried
    for t in _order(t_len, reverse):
        y_t, new_state = step(xw[:, t], state)
        if mask_bt is None:
            state, carried, stored = new_state, y_t, y_t
        else:
            m = mask_bt[:, t : t + 1]
            state = tuple(np.where(m, n, s) for n, s in zip(new_state, state))
            carried = np.where(m, y_t, carried)
            stored = np.where(m, y_t, np.float32(0)) if zero_masked else carried
        if ys is not None:
            ys[:, t] = stored
    return (ys if return_sequences else stored.copy()), state


def rnn_sequence(
    x_bti,
    w_ih,
    w_hh,
    b,
    h0,
    *,
    activation="tanh",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
):
    """h_t = act(x_t w_ih + h_{t-1} w_hh + b); y_t = h_t. Returns (y, h)."""

    def step(xw_t, state):
        h = _act(xw_t + state[0] @ w_hh, activation).astype(np.float32)
        return h, (h,)

    y, (h,) = run_sequence(
        x_bti,
        w_ih,
        b,
        (h0,),
        step,
        mask_bt=mask_bt,
        reverse=reverse,
        return_sequences=return_sequences,
        zero_masked=zero_masked,
        y0=y0,
        out_size=w_hh.shape[0],
    )
    return y, h


def lstm_sequence(
    x_bti,
    w_ig,
    w_hg,
    b_g,
    h0,
    c0,
    *,
    w_hp=None,
    activation="tanh",
    recurrent_activation="sigmoid",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
):
    """[i f g o] = x_t w_ig + h w_hg + b; c = ract(f) c + ract(i) act(g); h = (ract(o) act(c)) w_hp.

    Returns (y, h, c); without ``w_hp`` the projection is the identity.
    """
    units = w_hg.shape[1] // 4

    def step(xw_t, state):
        h, c = state
        z = xw_t + h @ w_hg
        i = _act(z[:, :units], recurrent_activation)
        f = _act(z[:, units : 2 * units], recurrent_activation)
        g = _act(z[:, 2 * units : 3 * units], activation)
        o = _act(z[:, 3 * units :], recurrent_activation)
        c_new = (f * c + i * g).astype(np.float32)
        h_new = (o * _act(c_new, activation)).astype(np.float32)
        if w_hp is not None:
            h_new = h_new @ w_hp
        return h_new, (h_new, c_new)

    y, (h, c) = run_sequence(
        x_bti,
        w_ig,
        b_g,
        (h0, c0),
        step,
        mask_bt=mask_bt,
        reverse=reverse,
        return_sequences=return_sequences,
        zero_masked=zero_masked,
        y0=y0,
        out_size=w_hg.shape[0],
    )
    return y, h, c


def gru_sequence(
    x_bti,
    w_ig,
    w_hg,
    b_ig,
    b_hg,
    h0,
    *,
    reset_after=True,
    activation="tanh",
    recurrent_activation="sigmoid",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
):
    """z, r = ract(x w + h u (+ b_h)); cand = act(x w_h + r (h u_h + b_hh)) (reset_after) or
    act(x w_h + (r h) u_h); h = z h + (1 - z) cand. Returns (y, h); ``b_hg`` may be None."""
    units = w_hg.shape[0]

    def step(xw_t, state):
        (h,) = state
        if reset_after:
            inner = h @ w_hg
            if b_hg is not None:
                inner = inner + b_hg
            z = _act(xw_t[:, :units] + inner[:, :units], recurrent_activation)
            r = _act(xw_t[:, units : 2 * units] + inner[:, units : 2 * units], recurrent_activation)
            cand = _act(xw_t[:, 2 * units :] + r * inner[:, 2 * units :], activation)
        else:
            inner = h @ w_hg[:, : 2 * units]
            z = _act(xw_t[:, :units] + inner[:, :units], recurrent_activation)
            r = _act(xw_t[:, units : 2 * units] + inner[:, units:], recurrent_activation)
            cand = _act(xw_t[:, 2 * units :] + (r * h) @ w_hg[:, 2 * units :], activation)
        h_new = (z * h + (np.float32(1) - z) * cand).astype(np.float32)
        return h_new, (h_new,)

    y, (h,) = run_sequence(
        x_bti,
        w_ig,
        b_ig,
        (h0,),
        step,
        mask_bt=mask_bt,
        reverse=reverse,
        return_sequences=return_sequences,
        zero_masked=zero_masked,
        y0=y0,
        out_size=units,
    )
    return y, h
