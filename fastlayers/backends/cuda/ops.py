"""CudaOps: ReferenceOps with the hot primitives run as numba.cuda kernels on the device.

Residency rules (docs/design.md, "CUDA backend"):

- Every overridden primitive accepts host numpy arrays or numba device arrays. Given a device
  array as its main input it returns device arrays (nothing is copied back), so a chain of
  primitive calls keeps its activations on the device; given host arrays it copies the input in
  once and the result out once.
- Weights (kernels, biases, recurrent kernels) go through a ``WeightCache``: copied to the device
  on first use and reused by every later call while the host array is alive and unchanged.
- Primitives not overridden here (layer norm, embeddings, transposed convolution, resizing...)
  are the numpy reference: they take and return host arrays.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import numpy as np

from ..reference import ReferenceOps
from ..reference_conv import conv_out_size
from . import _kernels as K
from ._runtime import WeightCache, is_device, load_cuda, simulated, to_device, to_host

_DUMMY = np.zeros(1, np.float32)
_DUMMY2 = np.zeros((1, 1), np.float32)
_DUMMY4 = np.zeros((1, 1, 1, 1), np.float32)
_DUMMY_MASK = np.zeros((1, 1), np.uint8)


def _grid2(cols: int, rows: int, sim: bool):
    """(blocks, threads) of a 2-D launch over (cols, rows), cols on the fast axis."""
    tx = 1
    while tx < cols and tx < 32:
        tx *= 2
    ty = max(1, (32 if sim else 256) // tx)
    ty = min(ty, max(1, rows))
    return ((cols + tx - 1) // tx, (rows + ty - 1) // ty), (tx, ty)


_MERGE_OPS = {"add": K.MERGE_ADD, "subtract": K.MERGE_SUB, "multiply": K.MERGE_MUL,
              "maximum": K.MERGE_MAX, "minimum": K.MERGE_MIN}


def _rows(a):
    """Device array ``a`` viewed as (rows, last axis)."""
    shape = tuple(a.shape)
    return a.reshape(int(np.prod(shape[:-1])), shape[-1])


def _grid1(n: int, sim: bool):
    t = min(32 if sim else 128, max(1, n))
    return ((n + t - 1) // t,), (t,)


def _serialized_in_simulator(method):
    """Run ``method`` under the ops' simulator lock: numba's CUDA simulator keeps per-launch
    state in module globals and cannot run kernels from several Python threads at once (a real
    device can; there the lock is a no-op)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._launch_lock:
            return method(self, *args, **kwargs)

    return wrapper


class CudaOps(ReferenceOps):
    """CUDA backend (numba-cuda); raises UnsupportedError when no device (or simulator) is usable.

    Examples
    --------
    >>> with fastlayers.use_ops("cuda"):
    ...     y = model(x)            # host arrays in and out, weights cached on the device
    >>> gpu_model = model.to("cuda")  # the same, as a model object
    """

    name = "cuda"

    def __init__(self):
        self.cuda = load_cuda()
        self.sim = simulated()
        self._launch_lock = threading.RLock() if self.sim else contextlib.nullcontext()
        self.weights = WeightCache()
        self._dummy = to_device(_DUMMY)
        self._dummy2 = to_device(_DUMMY2)
        self._dummy4 = to_device(_DUMMY4)
        self._dummy_mask = to_device(_DUMMY_MASK, np.uint8)

    def clear_weight_cache(self) -> None:
        """Forget every device copy of a weight (after writing into weight arrays in place)."""
        self.weights.clear()

    # ---------------------------------------------------------------------------- helpers
    def _empty(self, shape):
        return self.cuda.device_array(tuple(int(s) for s in shape), np.float32)

    def _weight(self, w):
        return self.weights.get(w)

    def _matmul_into(self, a_mk, b_kn, c_mn, trans_b=False):
        """c = a b (b^T) with 2-D or 3-D (batched) device operands."""
        a3 = a_mk.reshape((1,) + a_mk.shape) if a_mk.ndim == 2 else a_mk
        b3 = b_kn.reshape((1,) + b_kn.shape) if b_kn.ndim == 2 else b_kn
        c3 = c_mn.reshape((1,) + c_mn.shape) if c_mn.ndim == 2 else c_mn
        z, m, n = c3.shape
        grid = ((n + K.TILE - 1) // K.TILE, (m + K.TILE - 1) // K.TILE, z)
        K.bmm_tiled[grid, (K.TILE, K.TILE)](a3, b3, c3, bool(trans_b))
        return c_mn

    @_serialized_in_simulator
    def matmul(self, a, b, trans_b=False):
        """c = a b (or a b^T) on the device; 2-D, or 3-D batched with a size-1 batch broadcasting."""
        da, db = to_device(a), to_device(b)
        sa, sb = tuple(da.shape), tuple(db.shape)
        m = sa[-2]
        n = sb[-2] if trans_b else sb[-1]
        if da.ndim == 3 or db.ndim == 3:
            z = max(da.shape[0] if da.ndim == 3 else 1, db.shape[0] if db.ndim == 3 else 1)
            out = self._empty((z, m, n))
        else:
            out = self._empty((m, n))
        self._matmul_into(da, db, out, trans_b)
        return out if is_device(a) else out.copy_to_host()

    def _epilogue(self, y_rc, b, activation, alpha):
        """y = f(y + b) in place over device rows; unknown activations run on the host."""
        code = K.CODES.get(activation)
        rows, cols = y_rc.shape
        if b is None and activation == "linear":
            return y_rc
        blocks, threads = _grid2(cols, rows, self.sim)
        db = self._dummy if b is None else self._weight(b)
        K.bias_act_rows[blocks, threads](y_rc, db, b is not None,
                                         K.LINEAR if code is None else code, np.float32(alpha))
        if code is not None:
            return y_rc
        if activation in ("softmax", "log_softmax"):
            g, t = _grid1(rows, self.sim)
            K.softmax_rows[g, t](y_rc, activation == "log_softmax")
            return y_rc
        host = ReferenceOps.activation(self, y_rc.copy_to_host(), activation, alpha)
        return to_device(host)

    @staticmethod
    def _back(out, was_device):
        return out if was_device else out.copy_to_host()

    # ---------------------------------------------------------------------- elementwise
    @_serialized_in_simulator
    def activation(self, x, name, alpha=0.0):
        dev = is_device(x)
        if (name not in K.CODES and name not in ("softmax", "log_softmax")) or x.size == 0 \
                or x.ndim == 0:
            return super().activation(to_host(x), name, alpha)
        dx = to_device(x)
        rows = _rows(dx)
        out = self._empty(rows.shape)
        if name in K.CODES:
            blocks, threads = _grid2(rows.shape[1], rows.shape[0], self.sim)
            K.act_rows[blocks, threads](rows, out, K.CODES[name], np.float32(alpha))
        else:
            out.copy_to_device(rows)
            g, t = _grid1(rows.shape[0], self.sim)
            K.softmax_rows[g, t](out, name == "log_softmax")
        return self._back(out.reshape(dx.shape), dev)

    @_serialized_in_simulator
    def softmax(self, x, axis=-1):
        if isinstance(axis, int) and x.ndim and axis % x.ndim == x.ndim - 1:
            return self.activation(x, "softmax")
        return super().softmax(to_host(x), axis)

    @_serialized_in_simulator
    def log_softmax(self, x, axis=-1):
        if isinstance(axis, int) and x.ndim and axis % x.ndim == x.ndim - 1:
            return self.activation(x, "log_softmax")
        return super().log_softmax(to_host(x), axis)

    # ---------------------------------------------------------------------------- dense
    @_serialized_in_simulator
    def dense(self, x, w_io, b_o, activation="linear", alpha=0.0):
        dev = is_device(x)
        if x.size == 0 or w_io.shape[1] == 0 or w_io.shape[0] == 0:
            return super().dense(to_host(x), to_host(w_io), to_host(b_o), activation, alpha)
        dx = to_device(x)
        rows = _rows(dx)
        y = self._empty((rows.shape[0], w_io.shape[1]))
        self._matmul_into(rows, self._weight(w_io), y)
        y = self._epilogue(y, b_o, activation, alpha)
        return self._back(y.reshape(tuple(dx.shape)[:-1] + (w_io.shape[1],)), dev)

    # ------------------------------------------------------------- convolution and pooling
    @_serialized_in_simulator
    def conv2d(self, x_nhwc, w_hwio, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1),
               groups=1, activation="linear", alpha=0.0):
        n, h, w, c = x_nhwc.shape
        kh, kw, cin_g, cout = w_hwio.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho = conv_out_size(h, kh, sh, pt + pb, dh)
        wo = conv_out_size(w, kw, sw, pl + pr, dw)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout == 0:
            return super().conv2d(to_host(x_nhwc), to_host(w_hwio), to_host(b), strides, pads,
                                  dilation, groups, activation, alpha)
        dw_ = self._weight(w_hwio)
        return self._conv(x_nhwc, dw_, b, (sh, sw), (dh, dw), (pt, pl), groups, (ho, wo),
                          activation, alpha, dev)

    def _conv(self, x_nhwc, dw_hwio, b, strides, dilation, pads_tl, groups, out_hw, activation,
              alpha, dev):
        n = x_nhwc.shape[0]
        cout = dw_hwio.shape[3]
        dx = to_device(x_nhwc)
        y = self._empty((n, out_hw[0], out_hw[1], cout))
        code = K.CODES.get(activation)
        db = self._dummy if b is None else self._weight(b)
        blocks, threads = _grid2(cout, n * out_hw[0] * out_hw[1], self.sim)
        K.conv2d_nhwc[blocks, threads](dx, dw_hwio, db, b is not None, y, strides[0], strides[1],
                                       dilation[0], dilation[1], pads_tl[0], pads_tl[1], groups,
                                       K.LINEAR if code is None else code, np.float32(alpha))
        if code is None:
            y = self._epilogue(_rows(y), None, activation, alpha).reshape(y.shape)
        return self._back(y, dev)

    @_serialized_in_simulator
    def depthwise_conv2d(self, x_nhwc, w_hwcm, b, strides=(1, 1), pads=((0, 0), (0, 0)),
                         dilation=(1, 1), activation="linear", alpha=0.0):
        n, h, w, c = x_nhwc.shape
        kh, kw, _, m = w_hwcm.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho = conv_out_size(h, kh, sh, pt + pb, dh)
        wo = conv_out_size(w, kw, sw, pl + pr, dw)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or c * m == 0:
            return super().depthwise_conv2d(to_host(x_nhwc), to_host(w_hwcm), to_host(b), strides,
                                            pads, dilation, activation, alpha)
        # cache the layer's own (kh, kw, C, M) array; the (kh, kw, 1, C M) view is made on the device
        dwk = self._weight(w_hwcm).reshape(kh, kw, 1, c * m)
        return self._conv(x_nhwc, dwk, b, (sh, sw), (dh, dw), (pt, pl), c, (ho, wo), activation,
                          alpha, dev)

    @_serialized_in_simulator
    def pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1),
               count_include_pad=False):
        n, h, w, c = x_nhwc.shape
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or out_hw[0] <= 0 or out_hw[1] <= 0:
            return super().pool2d(to_host(x_nhwc), kind, pool, strides, pads, out_hw, dilation,
                                  count_include_pad)
        (pt, pb), (pl, pr) = pads
        dx = to_device(x_nhwc)
        y = self._empty((n, out_hw[0], out_hw[1], c))
        blocks, threads = _grid2(c, n * out_hw[0] * out_hw[1], self.sim)
        K.pool2d_nhwc[blocks, threads](dx, y, kind == "max", pool[0], pool[1], strides[0],
                                       strides[1], dilation[0], dilation[1], pt, pl, pb, pr,
                                       bool(count_include_pad))
        return self._back(y, dev)

    # ------------------------------------------------------------------------ attention
    @_serialized_in_simulator
    def attention_softmax(self, scores_bhqk, scale, bias, causal=False, empty=0):
        dev = is_device(scores_bhqk)
        if scores_bhqk.ndim != 4 or scores_bhqk.size == 0 or (bias is not None and bias.ndim > 4):
            return super().attention_softmax(to_host(scores_bhqk), scale, to_host(bias), causal,
                                             empty)
        s = to_device(scores_bhqk)
        tk = s.shape[3]
        if bias is None:
            db = self._dummy4
        elif is_device(bias):
            db = bias if bias.ndim == 4 else bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
            if db.shape[3] != tk:
                db = to_device(np.broadcast_to(db.copy_to_host(), tuple(db.shape)[:3] + (tk,)))
        else:
            b = np.asarray(bias, np.float32)
            b = b.reshape((1,) * (4 - b.ndim) + b.shape)
            db = to_device(np.broadcast_to(b, b.shape[:3] + (tk,)))
        fill = (np.float32(np.nan), np.float32(0), np.float32(1.0 / tk))[empty]
        rows = s.shape[0] * s.shape[1] * s.shape[2]
        g, t = _grid1(rows, self.sim)
        K.attention_softmax_bhqk[g, t](s, db, bias is not None, np.float32(scale), bool(causal),
                                       fill)
        return self._back(s, dev)

    @_serialized_in_simulator
    def attention(self, q_bhqd, k_bhkd, v_bhkv, scale, bias=None, causal=False, empty=0):
        dev = is_device(q_bhqd)
        shapes = (q_bhqd.shape, k_bhkd.shape, v_bhkv.shape)
        if not (q_bhqd.ndim == k_bhkd.ndim == v_bhkv.ndim == 4
                and shapes[0][:2] == shapes[1][:2] == shapes[2][:2]
                and q_bhqd.size and k_bhkd.size and v_bhkv.size):
            return super().attention(to_host(q_bhqd), to_host(k_bhkd), to_host(v_bhkv), scale,
                                     to_host(bias), causal, empty)
        nb, nh, tq, _ = shapes[0]
        tk, dv = shapes[1][2], shapes[2][3]
        dq, dk, dv_ = to_device(q_bhqd), to_device(k_bhkd), to_device(v_bhkv)
        scores = self._empty((nb, nh, tq, tk))
        self._matmul_into(dq.reshape(nb * nh, tq, shapes[0][3]),
                          dk.reshape(nb * nh, tk, shapes[1][3]),
                          scores.reshape(nb * nh, tq, tk), trans_b=True)
        w = self.attention_softmax(scores, scale, bias, causal, empty)
        out = self._empty((nb, nh, tq, dv))
        self._matmul_into(w.reshape(nb * nh, tq, tk), dv_.reshape(nb * nh, tk, dv),
                          out.reshape(nb * nh, tq, dv))
        return self._back(out, dev), self._back(w, dev)

    # ------------------------------------------------------------------------ recurrent
    def _input_projection(self, x_bti, w_ig, b_g):
        """xw = x w_ig + b over every time step at once, (B, T, G) on the device."""
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
        return to_device(np.ascontiguousarray(to_host(mask_bt), np.uint8), np.uint8)

    def _recurrent_loop(self, x_bti, out_size, h0, y0, dmask, has_mask, reverse,
                        return_sequences, zero_masked, step):
        """The time loop on the host, every array on the device: ``step(t, h)`` writes the new
        output into a (B, out_size) buffer it returns; masking and outputs are committed here."""
        nb, t_len = x_bti.shape[0], x_bti.shape[1]
        h = self._empty((nb, out_size))
        h.copy_to_device(np.ascontiguousarray(to_host(h0), np.float32))
        carried = to_device(np.zeros((nb, out_size), np.float32) if y0 is None
                            else np.ascontiguousarray(to_host(y0), np.float32))
        ys = to_device(np.zeros((nb, t_len if return_sequences else 1, out_size), np.float32))
        blocks, threads = _grid2(out_size, nb, self.sim)
        for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
            hn = step(t, h)
            K.commit_step[blocks, threads](hn, h, carried, ys, t, t if return_sequences else 0,
                                           dmask, has_mask, bool(zero_masked))
        return (ys if return_sequences else ys.reshape(nb, out_size)), h

    @_serialized_in_simulator
    def lstm_sequence(self, x_bti, w_ig, w_hg, b_g, h0, c0, *, w_hp=None, activation="tanh",
                      recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                      return_sequences=True, zero_masked=False, y0=None):
        """LSTM over time on the device: one fused gate kernel per step after a tiled h w_hg product."""
        act, ract = K.CODES.get(activation), K.CODES.get(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return super().lstm_sequence(
                to_host(x_bti), to_host(w_ig), to_host(w_hg), to_host(b_g), to_host(h0),
                to_host(c0), w_hp=to_host(w_hp), activation=activation,
                recurrent_activation=recurrent_activation, mask_bt=to_host(mask_bt),
                reverse=reverse, return_sequences=return_sequences, zero_masked=zero_masked,
                y0=to_host(y0))
        nb = x_bti.shape[0]
        units = w_hg.shape[1] // 4
        out_size = w_hg.shape[0]
        xw = self._input_projection(x_bti, w_ig, b_g)
        dw_hg, dw_hp = self._weight(w_hg), self._weight(w_hp)
        c = to_device(np.array(to_host(c0), np.float32, order="C", copy=True))
        rec = self._empty((nb, 4 * units))
        hc = self._empty((nb, units))
        hp = self._empty((nb, out_size)) if w_hp is not None else None
        has_mask, dmask = mask_bt is not None, self._mask(mask_bt)
        blocks, threads = _grid2(units, nb, self.sim)

        def step(t, h):
            self._matmul_into(h, dw_hg, rec)
            K.lstm_gates[blocks, threads](xw, t, rec, c, hc, dmask, has_mask, act, ract)
            if dw_hp is None:
                return hc
            return self._matmul_into(hc, dw_hp, hp)

        y, h = self._recurrent_loop(x_bti, out_size, h0, y0, dmask, has_mask, reverse,
                                    return_sequences, zero_masked, step)
        return self._back(y, dev), self._back(h, dev), self._back(c, dev)

    @_serialized_in_simulator
    def gru_sequence(self, x_bti, w_ig, w_hg, b_ig, b_hg, h0, *, reset_after=True,
                     activation="tanh", recurrent_activation="sigmoid", mask_bt=None,
                     reverse=False, return_sequences=True, zero_masked=False, y0=None):
        """GRU over time on the device: the h w_hg product (tiled kernel) and fused gate kernels."""
        act, ract = K.CODES.get(activation), K.CODES.get(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return super().gru_sequence(
                to_host(x_bti), to_host(w_ig), to_host(w_hg), to_host(b_ig), to_host(b_hg),
                to_host(h0), reset_after=reset_after, activation=activation,
                recurrent_activation=recurrent_activation, mask_bt=to_host(mask_bt),
                reverse=reverse, return_sequences=return_sequences, zero_masked=zero_masked,
                y0=to_host(y0))
        nb = x_bti.shape[0]
        units = w_hg.shape[0]
        xw = self._input_projection(x_bti, w_ig, b_ig)
        hn = self._empty((nb, units))
        blocks, threads = _grid2(units, nb, self.sim)
        if reset_after:
            dw_hg = self._weight(w_hg)
            db_hg = self._dummy if b_hg is None else self._weight(b_hg)
            rec = self._empty((nb, 3 * units))

            def step(t, h):
                self._matmul_into(h, dw_hg, rec)
                K.gru_gates_after[blocks, threads](xw, t, rec, db_hg, b_hg is not None, h, hn,
                                                   act, ract)
                return hn
        else:
            w_host = to_host(w_hg)
            dw_zr = to_device(np.ascontiguousarray(w_host[:, :2 * units]))
            dw_h = to_device(np.ascontiguousarray(w_host[:, 2 * units:]))
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

        y, h = self._recurrent_loop(x_bti, units, h0, y0, self._mask(mask_bt),
                                    mask_bt is not None, reverse, return_sequences, zero_masked,
                                    step)
        return self._back(y, dev), self._back(h, dev)

    # ------------------------------------------------------------- normalization, pooling
    @_serialized_in_simulator
    def batch_norm(self, x, scale, shift, axis=-1):
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0 or axis % x.ndim != x.ndim - 1:
            return super().batch_norm(to_host(x), to_host(scale), to_host(shift), axis)
        dx = to_device(x)
        rows = _rows(dx)
        out = self._empty(rows.shape)
        blocks, threads = _grid2(rows.shape[1], rows.shape[0], self.sim)
        K.scale_shift_rows[blocks, threads](rows, self._weight(scale), self._weight(shift), out)
        return self._back(out.reshape(tuple(dx.shape)), dev)

    @_serialized_in_simulator
    def layer_norm(self, x, gamma, beta, epsilon, axes=(-1,), rms=False):
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0 or tuple(a % x.ndim for a in axes) != (x.ndim - 1,):
            return super().layer_norm(to_host(x), to_host(gamma), to_host(beta), epsilon, axes,
                                      rms)
        dx = to_device(x)
        rows = _rows(dx)
        out = self._empty(rows.shape)
        g, t = _grid1(rows.shape[0], self.sim)
        K.layer_norm_rows[g, t](rows, self._dummy if gamma is None else self._weight(gamma),
                                gamma is not None,
                                self._dummy if beta is None else self._weight(beta),
                                beta is not None, np.float32(epsilon), bool(rms), out)
        return self._back(out.reshape(tuple(dx.shape)), dev)

    @_serialized_in_simulator
    def global_pool(self, x, kind, axes, keepdims=False):
        """Max or mean over ``axes`` (on the device when they are all the axes between the first
        and the last, e.g. NHWC (1, 2))."""
        dev = is_device(x)
        nd = x.ndim
        axes_n = tuple(sorted(a % nd for a in axes)) if nd else ()
        if x.size == 0 or nd < 3 or axes_n != tuple(range(1, nd - 1)):
            return super().global_pool(to_host(x), kind, axes, keepdims)
        shape = tuple(x.shape)
        dx = to_device(x)
        x3 = dx.reshape(shape[0], int(np.prod(shape[1:-1])), shape[-1])
        y = self._empty((shape[0], shape[-1]))
        blocks, threads = _grid2(shape[-1], shape[0], self.sim)
        K.global_pool_nhwc[blocks, threads](x3, y, kind == "max")
        if keepdims:
            y = y.reshape((shape[0],) + (1,) * (nd - 2) + (shape[-1],))
        return self._back(y, dev)

    @_serialized_in_simulator
    def merge(self, a, b, op, scale=1.0):
        """scale (a op b) elementwise for same-shape arrays; op in "add", "subtract", "multiply",
        "maximum", "minimum" (the merge layers on the device)."""
        dev = is_device(a) or is_device(b)
        shape = tuple(a.shape)
        da, db = to_device(a), to_device(b)
        n = int(np.prod(shape))
        out = self._empty((n,))
        g, t = _grid1(n, self.sim)
        K.merge_flat[g, t](da.reshape(n), db.reshape(n), out, _MERGE_OPS[op], np.float32(scale))
        return self._back(out.reshape(shape), dev)

    @_serialized_in_simulator
    def concatenate(self, xs, axis=-1):
        """Concatenation of same-rank arrays along ``axis`` (every other axis equal)."""
        dev = any(map(is_device, xs))
        shapes = [tuple(a.shape) for a in xs]
        axis %= len(shapes[0])
        outer = int(np.prod(shapes[0][:axis]))
        inner = int(np.prod(shapes[0][axis + 1:]))
        total = sum(s[axis] for s in shapes)
        out = self._empty((outer, total * inner))
        col0 = 0
        for a, shape in zip(xs, shapes):
            cols = shape[axis] * inner
            if outer and cols:
                src = to_device(a).reshape(outer, cols)
                blocks, threads = _grid2(cols, outer, self.sim)
                K.copy_cols[blocks, threads](src, out, col0)
            col0 += cols
        y = out.reshape(shapes[0][:axis] + (total,) + shapes[0][axis + 1:])
        return self._back(y, dev)

    # ------------------------------------------------------------------------ residency
    @_serialized_in_simulator
    def run_model(self, model, x):
        """``model.call(x)`` (a graph Model) with activations kept on the device between layers;
        see ``resident.py`` for the layer types that run there and ``resident.LAST_RUN``."""
        from .resident import run_model

        return run_model(self, model, x)
