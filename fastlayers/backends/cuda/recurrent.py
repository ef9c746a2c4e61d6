"""The recurrent primitives of the cuda backend (``RecurrentOps``, a base class of CudaOps).

The time loop runs on the host with every array on the device: the input projection of all
steps at once (one tiled product, or an Embedding's rows folded into the layer), then per step
the tiled product of the state with the recurrent kernel, the cell's fused gate kernels, and
``commit_step``, which applies the mask and writes the step's output. Gate activations with a parameter (leaky_relu, elu) have
no kernel code: the reference runs those layers on host copies.
"""

from __future__ import annotations

import numpy as np

from ..activations import DEFAULT_ALPHA
from . import kernels as K
from .device import DeviceOps, serialized_in_simulator
from .runtime import is_device, to_device, to_host
from .views import grid2


def _gate_code(activation: str):
    """The kernel code of a recurrent gate activation, or None (the reference runs the layer):
    the gate kernels apply activations without a parameter, so those with one (leaky_relu,
    elu, whose Keras default alpha the reference applies) have no code here."""
    return None if activation in DEFAULT_ALPHA else K.CODES.get(activation)


def _cols(lo: int, hi: int):
    """A ``WeightCache`` derivation: columns [lo, hi) of a 2-D weight, contiguous."""
    return ("cols", lo, hi), lambda a: np.ascontiguousarray(a[:, lo:hi])


class RecurrentOps(DeviceOps):
    """CudaOps' recurrent primitives (a base class of ``CudaOps``)."""

    def _input_projection(self, x_bti, w_ig, b_g):
        """xw = x w_ig + b over every time step at once, (B, T, G) on the device; ids x (B, T)
        select rows of w_ig instead (an Embedding folded into the layer)."""
        if x_bti.ndim == 2:
            ids = x_bti if is_device(x_bti) else to_device(np.asarray(x_bti), np.int64)
            nb, t_len = ids.shape
            xw = self.embedding(ids, w_ig)
            self._epilogue(xw.reshape(nb * t_len, w_ig.shape[1]), b_g, "linear", 0.0)
            return xw
        dx = to_device(x_bti)
        nb, t_len, _ = dx.shape
        g = w_ig.shape[1]
        xw = self._empty((nb * t_len, g))
        self._matmul_into(dx.reshape(nb * t_len, dx.shape[2]), self._weight(w_ig), xw)
        xw = self._epilogue(xw, b_g, "linear", 0.0)
        return xw.reshape(nb, t_len, g)

    def _mask(self, mask_bt):
        """(B, T) step mask as uint8 on the device (a (1, 1) dummy when None)."""
        if mask_bt is None:
            return self._dummy_mask
        if is_device(mask_bt):
            return mask_bt if mask_bt.dtype == np.uint8 else self.nonzero_mask(mask_bt)
        return to_device(np.ascontiguousarray(mask_bt, np.uint8), np.uint8)

    def _recurrent_loop(self, x_bti, out_size, h0, y0, dmask, has_mask, reverse, return_sequences, zero_masked, step):
        """The time loop on the host, every array on the device: ``step(t, h)`` writes the new
        output into a (B, out_size) buffer it returns; masking and outputs are committed here."""
        nb, t_len = x_bti.shape[0], x_bti.shape[1]
        h = self._copy_of(h0)
        carried = self.zeros((nb, out_size)) if y0 is None else self._copy_of(y0)
        ys = self.zeros((nb, t_len if return_sequences else 1, out_size))
        blocks, threads = grid2(out_size, nb, self.sim)
        for t in range(t_len - 1, -1, -1) if reverse else range(t_len):
            hn = step(t, h)
            K.commit_step[blocks, threads](
                hn, h, carried, ys, t, t if return_sequences else 0, dmask, has_mask, bool(zero_masked)
            )
        return (ys if return_sequences else ys.reshape(nb, out_size)), h

    @serialized_in_simulator
    def rnn_sequence(
        self,
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
        """SimpleRNN over time on the device: per step the tiled h w_hh product, one gate kernel."""
        code = _gate_code(activation)
        dev = is_device(x_bti)
        if code is None or 0 in x_bti.shape:
            return self._host_path(
                is_device(x_bti),
                super().rnn_sequence(
                    to_host(x_bti),
                    to_host(w_ih),
                    to_host(w_hh),
                    to_host(b),
                    to_host(h0),
                    activation=activation,
                    mask_bt=to_host(mask_bt),
                    reverse=reverse,
                    return_sequences=return_sequences,
                    zero_masked=zero_masked,
                    y0=to_host(y0),
                ),
            )
        nb, units = x_bti.shape[0], w_hh.shape[0]
        xw = self._input_projection(x_bti, w_ih, b)
        dw_hh = self._weight(w_hh)
        rec = self._empty((nb, units))
        hn = self._empty((nb, units))
        blocks, threads = grid2(units, nb, self.sim)

        def step(t, h):
            self._matmul_into(h, dw_hh, rec)
            K.rnn_gates[blocks, threads](xw, t, rec, hn, code)
            return hn

        y, h = self._recurrent_loop(
            x_bti, units, h0, y0, self._mask(mask_bt), mask_bt is not None, reverse, return_sequences, zero_masked, step
        )
        return self._back(y, dev), self._back(h, dev)

    @serialized_in_simulator
    def lstm_sequence(
        self,
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
        """LSTM over time on the device: one fused gate kernel per step after a tiled h w_hg product."""
        act, ract = _gate_code(activation), _gate_code(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return self._host_path(
                is_device(x_bti),
                super().lstm_sequence(
                    to_host(x_bti),
                    to_host(w_ig),
                    to_host(w_hg),
                    to_host(b_g),
                    to_host(h0),
                    to_host(c0),
                    w_hp=to_host(w_hp),
                    activation=activation,
                    recurrent_activation=recurrent_activation,
                    mask_bt=to_host(mask_bt),
                    reverse=reverse,
                    return_sequences=return_sequences,
                    zero_masked=zero_masked,
                    y0=to_host(y0),
                ),
            )
        nb = x_bti.shape[0]
        units = w_hg.shape[1] // 4
        out_size = w_hg.shape[0]
        xw = self._input_projection(x_bti, w_ig, b_g)
        dw_hg, dw_hp = self._weight(w_hg), self._weight(w_hp)
        c = self._copy_of(c0)
        rec = self._empty((nb, 4 * units))
        hc = self._empty((nb, units))
        hp = self._empty((nb, out_size)) if w_hp is not None else None
        has_mask, dmask = mask_bt is not None, self._mask(mask_bt)
        blocks, threads = grid2(units, nb, self.sim)

        def step(t, h):
            self._matmul_into(h, dw_hg, rec)
            K.lstm_gates[blocks, threads](xw, t, rec, c, hc, dmask, has_mask, act, ract)
            if dw_hp is None:
                return hc
            return self._matmul_into(hc, dw_hp, hp)

        y, h = self._recurrent_loop(
            x_bti, out_size, h0, y0, dmask, has_mask, reverse, return_sequences, zero_masked, step
        )
        return self._back(y, dev), self._back(h, dev), self._back(c, dev)

    @serialized_in_simulator
    def gru_sequence(
        self,
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
        """GRU over time on the device: the h w_hg product (tiled kernel) and fused gate kernels."""
        act, ract = _gate_code(activation), _gate_code(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return self._host_path(
                is_device(x_bti),
                super().gru_sequence(
                    to_host(x_bti),
                    to_host(w_ig),
                    to_host(w_hg),
                    to_host(b_ig),
                    to_host(b_hg),
                    to_host(h0),
                    reset_after=reset_after,
                    activation=activation,
                    recurrent_activation=recurrent_activation,
                    mask_bt=to_host(mask_bt),
                    reverse=reverse,
                    return_sequences=return_sequences,
                    zero_masked=zero_masked,
                    y0=to_host(y0),
                ),
            )
        nb = x_bti.shape[0]
        units = w_hg.shape[0]
        xw = self._input_projection(x_bti, w_ig, b_ig)
        hn = self._empty((nb, units))
        blocks, threads = grid2(units, nb, self.sim)
        if reset_after:
            dw_hg = self._weight(w_hg)
            db_hg = self._dummy if b_hg is None else self._weight(b_hg)
            rec = self._empty((nb, 3 * units))

            def step(t, h):
                self._matmul_into(h, dw_hg, rec)
                K.gru_gates_after[blocks, threads](xw, t, rec, db_hg, b_hg is not None, h, hn, act, ract)
                return hn
        else:
            dw_zr = self._weight(w_hg, _cols(0, 2 * units))
            dw_h = self._weight(w_hg, _cols(2 * units, 3 * units))
            rec2 = self._empty((nb, 2 * units))
            rec1 = self._empty((nb, units))
            z = self._empty((nb, units))
            rh = self._empty((nb, units))

            def step(t, h):
                self._matmul_into(h, dw_zr, rec2)
                K.gru_zr_before[blocks, threads](xw, t, rec2, h, z, rh, ract)
                self._matmul_into(rh, dw_h, rec1)
                K.gru_cand_before[blocks, threads](xw, t, rec1, z, h, hn, act)
                return hn

        y, h = self._recurrent_loop(
            x_bti, units, h0, y0, self._mask(mask_bt), mask_bt is not None, reverse, return_sequences, zero_masked, step
        )
        return self._back(y, dev), self._back(h, dev)
