"""CudaOps: ReferenceOps with the primitives run as numba.cuda kernels on the device.

Residency rules (docs/design.md, "CUDA backend"):

- A model moves its inputs in at entry (``to_device``: floats as float32, integer ids as
  int64, bool masks as uint8) and its outputs out at exit (``to_host``); in between, every
  layer's own ``call`` runs on device arrays through these primitives.
- Every primitive accepts host numpy arrays or numba device arrays. Given a device array as its
  main input it returns device arrays (nothing is copied back); given host arrays (a layer
  called directly) it copies the input in once and the result out once.
- A primitive without a kernel for its arguments (an activation with no device code, zero-size
  inputs...) runs the numpy reference on host copies and moves its result back to the device
  (``Transfers.host_fallbacks`` counts these).
- Weights (kernels, biases, recurrent kernels, tables) go through a ``WeightCache``: copied to
  the device on first use and reused by every later call while the host array is alive and
  unchanged. A host array given next to a device activation is a weight (cached).
- Value checks (indices in range, RoI batch indices) run on the device and set a flag that the
  checking primitive reads once per call (``Transfers.flag_reads``); a set flag re-runs the
  reference check on host copies, which raises the layer's error.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import numpy as np

from ...errors import InputError, UnsupportedError
from ...geometry import window_out_2d
from ..activations import DEFAULT_ALPHA
from ..reference import ReferenceOps
from ..reference.conv import resize_ratio
from . import kernels as K
from .launch import install as install_fast_launches
from .runtime import (
    WeightCache,
    c_ordered,
    device_dtype,
    device_empty,
    driver,
    is_device,
    load_cuda,
    simulated,
    to_device,
    to_host,
)

_DUMMY = np.zeros(1, np.float32)
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


_BINARY_OPS = {"add": K.OP_ADD, "subtract": K.OP_SUB, "multiply": K.OP_MUL, "maximum": K.OP_MAX,
               "minimum": K.OP_MIN, "div_std": K.OP_DIV_STD, "mul_std": K.OP_MUL_STD,
               "divide": K.OP_DIV}


class Transfers(threading.local):
    """Per-thread counts of activation copies between host and device: model inputs moved in
    (``to_device``), model outputs moved out (``to_host``), primitive calls that ran on the host
    from device inputs (``host_fallbacks``) and reads of a value-check flag (``flag_reads``)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.to_device = self.to_host = self.host_fallbacks = self.flag_reads = 0


#: This thread's copies since its last ``TRANSFERS.reset()`` (also ``CudaOps.transfers``).
TRANSFERS = Transfers()


def _rows(a):
    """Device array ``a`` viewed as (rows, last axis)."""
    shape = tuple(a.shape)
    return a.reshape(math.prod(shape[:-1]), shape[-1])


def _flat(a):
    """Contiguous device array ``a`` viewed as 1-D (a 0-d array as one element)."""
    return a.reshape(max(math.prod(a.shape), 1))


def _gate_code(activation: str):
    """The kernel code of a recurrent gate activation, or None (the reference runs the layer):
    the gate kernels apply activations without a parameter, so those with one (leaky_relu,
    elu, whose Keras default alpha the reference applies) have no code here."""
    return None if activation in DEFAULT_ALPHA else K.CODES.get(activation)


def _grid1(n: int, sim: bool):
    t = min(32 if sim else 128, max(1, n))
    return ((n + t - 1) // t,), (t,)


_LAYOUT_BASE = np.zeros(1, np.uint8)


def _layout(shape, select=None):
    """(shape, element strides, element offset) of ``select(a)`` for a C-contiguous ``a`` of
    ``shape``: numpy's view rules (transpose, basic slicing, flip, broadcast) applied to an array
    of no data (one byte per element), as numba's device arrays do for their own views."""
    shape = tuple(int(n) for n in shape)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    a = np.lib.stride_tricks.as_strided(_LAYOUT_BASE, shape, tuple(reversed(strides)))
    v = a if select is None else select(a)
    offset = v.__array_interface__["data"][0] - _LAYOUT_BASE.__array_interface__["data"][0]
    return tuple(v.shape), tuple(v.strides), offset


def _collapse6(shape, *strides):
    """``shape`` and each operand's ``strides`` with size-1 axes dropped and neighbours that are
    contiguous in every operand merged, padded in front to the 6 axes of the strided kernels."""
    dims = []
    for k, n in enumerate(shape):
        if n == 1:
            continue
        st = [s[k] for s in strides]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    if len(dims) > 6:
        raise UnsupportedError(f"backend 'cuda': array layouts of more than 6 non-unit axes are "
                               f"not supported (shape {tuple(shape)})")
    pad = 6 - len(dims)
    return ((1,) * pad + tuple(n for n, _ in dims),
            *((0,) * pad + tuple(st[i] for _, st in dims) for i in range(len(strides))))


def _cols(lo: int, hi: int):
    """A ``WeightCache`` derivation: columns [lo, hi) of a 2-D weight, contiguous."""
    return ("cols", lo, hi), lambda a: np.ascontiguousarray(a[:, lo:hi])


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
    device = "cuda"
    transfers = TRANSFERS

    def __init__(self):
        self.cuda = load_cuda()
        if driver() is not None:  # a real GPU: launches through the driver (launch.py)
            install_fast_launches(K, driver())
        self.sim = simulated()
        self._launch_lock = threading.RLock() if self.sim else contextlib.nullcontext()
        self.weights = WeightCache()
        self._dummy = to_device(_DUMMY)
        self._dummy4 = to_device(_DUMMY4)
        self._dummy_mask = to_device(_DUMMY_MASK, np.uint8)

    def clear_weight_cache(self) -> None:
        """Forget every device copy of a weight (after writing into weight arrays in place)."""
        self.weights.clear()

    # ---------------------------------------------------------------------------- helpers
    def _empty(self, shape, dtype=np.float32):
        return device_empty(shape, dtype)

    def _weight(self, w, derive=None):
        return self.weights.get(w, derive)

    def device_weight(self, w, derive=None):
        """The cached device copy of weight ``w`` (or, with ``derive=(name, function)``, of
        ``function(w)``: the weight in another layout); see ``WeightCache.get``."""
        return self.weights.get(w, derive)

    def _operand(self, a, dev):
        """``a`` on the device: a host array next to device activations (``dev``) is a weight."""
        return a if is_device(a) else (self._weight(a) if dev else to_device(a))

    def _copy_of(self, a):
        """A new device array holding host or device array ``a`` (as float32)."""
        out = self._empty(a.shape)
        out.copy_to_device(a if is_device(a) else c_ordered(a))
        return out

    def _matmul_into(self, a_mk, b_kn, c_mn, trans_b=False):
        """c = a b (b^T) with 2-D or 3-D (batched) device operands."""
        if a_mk.ndim == b_kn.ndim == c_mn.ndim == 2 and not trans_b:  # no 3-D views to make
            m, n = c_mn.shape
            grid = ((n + K.TILE - 1) // K.TILE, (m + K.TILE - 1) // K.TILE)
            K.mm_bias_act[grid, (K.TILE, K.TILE)](a_mk, b_kn, self._dummy, False, K.LINEAR,
                                                  np.float32(0.0), c_mn)
            return c_mn
        a3 = a_mk.reshape((1,) + a_mk.shape) if a_mk.ndim == 2 else a_mk
        b3 = b_kn.reshape((1,) + b_kn.shape) if b_kn.ndim == 2 else b_kn
        c3 = c_mn.reshape((1,) + c_mn.shape) if c_mn.ndim == 2 else c_mn
        z, m, n = c3.shape
        grid = ((n + K.TILE - 1) // K.TILE, (m + K.TILE - 1) // K.TILE, z)
        K.bmm_tiled[grid, (K.TILE, K.TILE)](a3, b3, c3, bool(trans_b))
        return c_mn

    def _copy(self, src, src_view, dst, dst_view):
        """dst_view(dst) = src_view(src) for C-contiguous device arrays; a view is a function of
        a numpy array (``lambda v: v.transpose(...)``, ``v[..., 2:5]``, ``np.flip``,
        ``np.broadcast_to``) or None for the whole array. One ``copy_strided`` launch."""
        shape, s_str, s_off = _layout(src.shape, src_view)
        d_shape, d_str, d_off = _layout(dst.shape, dst_view)
        if shape != d_shape:
            raise ValueError(f"cuda copy: source view {shape} and destination view {d_shape} "
                             "differ")
        n = math.prod(shape)
        if n == 0:
            return
        shape6, s6, d6 = _collapse6(shape, s_str, d_str)
        g, t = _grid1(n, self.sim)
        K.copy_strided[g, t](_flat(src), s_off, s6, _flat(dst), d_off, d6, shape6)

    # ------------------------------------------------------------------- data movement
    def is_device_array(self, a) -> bool:
        return is_device(a)

    def to_device(self, x):
        """Host arrays (or lists of them) copied to the device: floats as float32, integer ids
        as int64, bool masks as uint8; device arrays and anything else pass through."""
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_device(a) for a in x)
        if isinstance(x, np.ndarray) and x.dtype.kind in "biuf":
            TRANSFERS.to_device += 1
            return to_device(x, device_dtype(x.dtype))
        return x

    def to_host(self, y):
        """Device arrays (or lists of them) copied to host numpy arrays; uint8 arrays, the
        device form of masks, come back as bool."""
        if isinstance(y, (list, tuple)):
            return type(y)(self.to_host(a) for a in y)
        if not is_device(y):
            return y
        TRANSFERS.to_host += 1
        host = to_host(y)
        return host.astype(bool) if host.dtype == np.uint8 else host

    def _host_path(self, dev, result):
        """The result of a reference (host) fallback: moved to the device when the call's input
        was there, so that activations stay device arrays."""
        if not dev or result is None:
            return result
        if isinstance(result, (list, tuple)):
            return type(result)(self._host_path(dev, r) for r in result)
        TRANSFERS.host_fallbacks += 1
        result = np.asarray(result)
        return to_device(result, device_dtype(result.dtype))

    def contiguous(self, x):
        """Device arrays are always C-contiguous here; host arrays are made so."""
        return x if is_device(x) else np.ascontiguousarray(x)

    # ------------------------------------------------------------ device-array utilities
    @_serialized_in_simulator
    def zeros(self, shape, dtype=np.float32):
        """A new device array of zeros (filled on the device, nothing copied in)."""
        out = self._empty(shape, dtype)
        n = math.prod(out.shape)
        if n:
            g, t = _grid1(n, self.sim)
            K.fill_flat[g, t](_flat(out), np.dtype(dtype).type(0))
        return out

    @_serialized_in_simulator
    def copy_view(self, x, select):
        """A new C-contiguous array holding ``select(x)``, ``select`` being numpy view rules
        (transpose, basic slicing, flip, broadcast_to; e.g. ``lambda v: v[:, ::-1]``)."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        shape = _layout(dx.shape, select)[0]
        out = self._empty(shape, dx.dtype)
        self._copy(dx, select, out, None)
        return self._back(out, dev)

    @_serialized_in_simulator
    def as_float32(self, x):
        """Device array ``x`` (ids, a mask) cast to float32, as layers cast their inputs."""
        out = self._empty(x.shape)
        self._copy(x, None, out, None)
        return out

    def transpose(self, x, axes):
        """``np.transpose(x, axes)`` as a new C-contiguous array."""
        axes = tuple(int(a) for a in axes)
        return self.copy_view(x, lambda v: v.transpose(axes))

    def take(self, x, index):
        """``x[index]`` (basic indexing) as a new C-contiguous array."""
        index = tuple(index)
        return self.copy_view(x, lambda v: v[index])

    def broadcast_to(self, x, shape):
        """``np.broadcast_to(x, shape)`` as a new C-contiguous array."""
        shape = tuple(int(n) for n in shape)
        return self.copy_view(x, lambda v: np.broadcast_to(v, shape))

    def split_heads(self, x_ptc, heads):
        """x (P, T, H*D) as a new (P, H, T, D) array."""
        p, t, c = x_ptc.shape
        return self.transpose(x_ptc.reshape(p, t, heads, c // heads), (0, 2, 1, 3))

    def merge_heads(self, o_phtd):
        """o (P, H, T, D) as a new (P, T, H*D) array."""
        p, h, t, d = o_phtd.shape
        return self.transpose(o_phtd, (0, 2, 1, 3)).reshape(p, t, h * d)

    @_serialized_in_simulator
    def mask_keep(self, mask):
        """A Keras mask (True, or > 0.5 for numbers) as float32 1 or 0."""
        dev = is_device(mask)
        dm = to_device(mask, device_dtype(mask.dtype))
        out = self._empty(dm.shape)
        n = math.prod(dm.shape)
        if n:
            g, t = _grid1(n, self.sim)
            K.keep_f32[g, t](_flat(dm), dm.dtype.type(0.5 if dm.dtype.kind == "f" else 0),
                             _flat(out))
        return self._back(out, dev)

    @_serialized_in_simulator
    def indices(self, ids, size, where, what="indices"):
        """As ReferenceOps.indices; device ids are checked on the device (whole numbers, in
        range) into a flag read once here, and come back as int64 device ids."""
        if not is_device(ids):
            return super().indices(ids, size, where, what)
        flag = self.zeros((1,))
        shape = tuple(ids.shape)
        di = self._indices(ids, flag)
        if di.shape[0]:
            g, t = _grid1(di.shape[0], self.sim)
            K.check_range[g, t](di, np.int64(size), flag)
        TRANSFERS.flag_reads += 1
        if to_host(flag)[0]:
            super().indices(to_host(ids), size, where, what)  # raises the layer's error
            raise InputError(f"{where}: {what} outside [0, {size}) or not whole numbers")
        return di.reshape(shape)

    def check_rois(self, rois, batch, where):
        """As ReferenceOps.check_rois; device rois (K, 5) are read back for the check."""
        if not is_device(rois):
            return super().check_rois(rois, batch, where)
        TRANSFERS.flag_reads += 1
        super().check_rois(to_host(rois), batch, where)
        return rois

    @_serialized_in_simulator
    def pad(self, x, pads):
        """``np.pad(x, pads)`` with zeros; ``pads`` is one (before, after) pair per axis."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        shape = tuple(dx.shape)
        out = self.zeros(tuple(n + a + b for n, (a, b) in zip(shape, pads)), dx.dtype)
        inner = tuple(slice(a, a + n) for n, (a, _) in zip(shape, pads))
        self._copy(dx, None, out, lambda v: v[inner])
        return self._back(out, dev)

    @_serialized_in_simulator
    def nonzero_mask(self, x):
        """``x != 0`` as a uint8 array (the device form of a bool mask)."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        out = self._empty(dx.shape, np.uint8)
        n = math.prod(dx.shape)
        if n:
            g, t = _grid1(n, self.sim)
            K.nonzero_u8[g, t](_flat(dx), dx.dtype.type(0), _flat(out))
        return self._back(out, dev)

    @_serialized_in_simulator
    def mask_bias(self, mask, shape):
        """A Keras attention mask (True, or > 0.5 for numbers, means attend) as an additive bias of
        ``shape`` (0 or -inf), the mask broadcast to ``shape`` (numpy rules)."""
        dev = is_device(mask)
        dm = to_device(mask, device_dtype(mask.dtype))
        thr = dm.dtype.type(0.5 if dm.dtype.kind == "f" else 0)
        out = self._empty(shape)
        n = math.prod(shape)
        if n:
            shape_b, m_str, m_off = _layout(dm.shape, lambda v: np.broadcast_to(v, tuple(shape)))
            shape6, m6 = _collapse6(shape_b, m_str)
            g, t = _grid1(n, self.sim)
            K.keep_bias_strided[g, t](_flat(dm), m_off, m6, thr, _flat(out), shape6)
        return self._back(out, dev)

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
        return out if is_device(a) else to_host(out)

    def _epilogue(self, y_rc, b, activation, alpha):
        """y = f(y + b) in place over device rows; unknown activations run on the host."""
        code = K.CODES.get(activation)
        rows, cols = y_rc.shape
        if b is not None or code not in (None, K.LINEAR):
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
        host = ReferenceOps.activation(self, to_host(y_rc), activation, alpha)
        return to_device(host)

    @staticmethod
    def _back(out, was_device):
        return out if was_device else to_host(out)

    # ---------------------------------------------------------------------- elementwise
    @_serialized_in_simulator
    def activation(self, x, name, alpha=0.0):
        dev = is_device(x)
        if (name not in K.CODES and name not in ("softmax", "log_softmax")) or x.size == 0 \
                or x.ndim == 0:
            return self._host_path(is_device(x), super().activation(to_host(x), name, alpha))
        if name not in K.CODES:
            return self._softmax(x, (x.ndim - 1,), name == "log_softmax")
        dx = to_device(x)
        rows = _rows(dx)
        out = self._empty(rows.shape)
        blocks, threads = _grid2(rows.shape[1], rows.shape[0], self.sim)
        K.act_rows[blocks, threads](rows, out, K.CODES[name], np.float32(alpha))
        return self._back(out.reshape(dx.shape), dev)

    @_serialized_in_simulator
    def relu(self, x, threshold=0.0, negative_slope=0.0, max_value=None):
        """Keras ReLU: x where x > threshold, else negative_slope (x - threshold); then at most
        ``max_value``."""
        dev = is_device(x)
        dx = to_device(x)
        out = self._empty(dx.shape)
        n = math.prod(dx.shape)
        if n:
            g, t = _grid1(n, self.sim)
            K.relu_flat[g, t](_flat(dx), _flat(out), np.float32(threshold),
                              np.float32(negative_slope),
                              np.float32(0.0 if max_value is None else max_value),
                              max_value is not None)
        return self._back(out, dev)

    def _softmax(self, x, axes, log):
        """Softmax (or log-softmax) over ``axes``: in place on a copy viewed as (outer, axes,
        inner) when they are adjacent, else with them moved last and back."""
        dev = is_device(x)
        dx = to_device(x)
        nd = dx.ndim
        axes = sorted({int(a) % nd for a in axes})
        if axes != list(range(axes[0], axes[-1] + 1)):
            rest = [a for a in range(nd) if a not in axes]
            moved = self.transpose(dx, rest + axes)
            y = self._softmax(moved, range(len(rest), nd), log)
            return self._back(self.transpose(y, np.argsort(rest + axes)), dev)
        shape = tuple(dx.shape)
        outer, inner = math.prod(shape[:axes[0]]), math.prod(shape[axes[-1] + 1:])
        y = self._copy_of(dx)
        g, t = _grid1(outer * inner, self.sim)
        K.softmax_oni[g, t](y.reshape(outer, math.prod(shape) // (outer * inner), inner), log)
        return self._back(y, dev)

    @_serialized_in_simulator
    def softmax(self, x, axis=-1):
        if x.ndim == 0 or x.size == 0:
            return self._host_path(is_device(x), super().softmax(to_host(x), axis))
        return self._softmax(x, axis if isinstance(axis, tuple) else (axis,), False)

    @_serialized_in_simulator
    def log_softmax(self, x, axis=-1):
        if x.ndim == 0 or x.size == 0:
            return self._host_path(is_device(x), super().log_softmax(to_host(x), axis))
        return self._softmax(x, axis if isinstance(axis, tuple) else (axis,), True)

    # ---------------------------------------------------------------------------- dense
    @_serialized_in_simulator
    def dense(self, x, w_io, b_o, activation="linear", alpha=0.0):
        dev = is_device(x)
        if x.size == 0 or w_io.shape[1] == 0 or w_io.shape[0] == 0:
            return self._host_path(is_device(x), super().dense(to_host(x), to_host(w_io), to_host(b_o), activation, alpha))
        dx = to_device(x)
        rows = dx if dx.ndim == 2 else _rows(dx)
        m, n = rows.shape[0], w_io.shape[1]
        y = self._empty((m, n))
        code = K.CODES.get(activation)
        db = self._dummy if b_o is None else self._weight(b_o)
        grid = ((n + K.TILE - 1) // K.TILE, (m + K.TILE - 1) // K.TILE)
        K.mm_bias_act[grid, (K.TILE, K.TILE)](rows, self._weight(w_io), db, b_o is not None,
                                              K.LINEAR if code is None else code,
                                              np.float32(alpha), y)
        if code is None:  # softmax over the rows, or an activation the kernels lack
            y = self._epilogue(y, None, activation, alpha)
        return self._back(y if dx.ndim == 2 else y.reshape(tuple(dx.shape)[:-1] + (n,)), dev)

    # ------------------------------------------------------------- convolution and pooling
    @_serialized_in_simulator
    def conv2d(self, x_nhwc, w_hwio, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1),
               groups=1, activation="linear", alpha=0.0):
        n, h, w, c = x_nhwc.shape
        kh, kw, cin_g, cout = w_hwio.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout == 0:
            return self._host_path(is_device(x_nhwc), super().conv2d(to_host(x_nhwc), to_host(w_hwio), to_host(b), strides, pads,
                                  dilation, groups, activation, alpha))
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
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or c * m == 0:
            return self._host_path(is_device(x_nhwc), super().depthwise_conv2d(to_host(x_nhwc), to_host(w_hwcm), to_host(b), strides,
                                            pads, dilation, activation, alpha))
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
            return self._host_path(is_device(x_nhwc), super().pool2d(to_host(x_nhwc), kind, pool, strides, pads, out_hw, dilation,
                                  count_include_pad))
        (pt, pb), (pl, pr) = pads
        dx = to_device(x_nhwc)
        y = self._empty((n, out_hw[0], out_hw[1], c))
        blocks, threads = _grid2(c, n * out_hw[0] * out_hw[1], self.sim)
        K.pool2d_nhwc[blocks, threads](dx, y, kind == "max", pool[0], pool[1], strides[0],
                                       strides[1], dilation[0], dilation[1], pt, pl, pb, pr,
                                       bool(count_include_pad))
        return self._back(y, dev)

    @_serialized_in_simulator
    def conv_transpose2d(self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation=(1, 1),
                         groups=1, activation="linear", alpha=0.0):
        """Transposed convolution, one thread per output value (gathering the inputs reaching it)."""
        dev = is_device(x_nhwc)
        cout = w_hwio.shape[3] * groups
        if x_nhwc.size == 0 or min(out_hw) <= 0 or cout == 0:
            return self._host_path(is_device(x_nhwc), super().conv_transpose2d(to_host(x_nhwc), to_host(w_hwio), to_host(b), strides,
                                            crop, out_hw, dilation, groups, activation, alpha))
        dx = to_device(x_nhwc)
        n = dx.shape[0]
        y = self._empty((n, out_hw[0], out_hw[1], cout))
        code = K.CODES.get(activation)
        db = self._dummy if b is None else self._weight(b)
        blocks, threads = _grid2(cout, n * out_hw[0] * out_hw[1], self.sim)
        K.conv_transpose2d_nhwc[blocks, threads](
            dx, self._weight(w_hwio), db, b is not None, y, strides[0], strides[1], dilation[0],
            dilation[1], crop[0], crop[1], groups, K.LINEAR if code is None else code,
            np.float32(alpha))
        if code is None:
            y = self._epilogue(_rows(y), None, activation, alpha).reshape(y.shape)
        return self._back(y, dev)

    @_serialized_in_simulator
    def upsample2d(self, x_nhwc, out_hw, mode="nearest", align_corners=False, scales=(None, None)):
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or min(out_hw) <= 0 or mode not in ("nearest", "bilinear"):
            return self._host_path(is_device(x_nhwc), super().upsample2d(to_host(x_nhwc), out_hw, mode, align_corners, scales))
        dx = to_device(x_nhwc)
        n, h, w, c = dx.shape
        y = self._empty((n, out_hw[0], out_hw[1], c))
        ratios = [resize_ratio(o, size, mode, align_corners, sc)
                  for o, size, sc in zip(out_hw, (h, w), scales)]
        blocks, threads = _grid2(c, n * out_hw[0] * out_hw[1], self.sim)
        K.upsample2d_nhwc[blocks, threads](dx, y, mode == "bilinear", bool(align_corners),
                                           ratios[0], ratios[1])
        return self._back(y, dev)

    @_serialized_in_simulator
    def local_response_norm(self, x, size, alpha=1e-4, beta=0.75, k=1.0):
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().local_response_norm(to_host(x), size, alpha, beta, k))
        dx = to_device(x)
        rows = _rows(dx)
        out = self._empty(rows.shape)
        blocks, threads = _grid2(rows.shape[1], rows.shape[0], self.sim)
        K.lrn_rows[blocks, threads](rows, out, int(size), np.float32(alpha / size),
                                    np.float32(beta), np.float32(k))
        return self._back(out.reshape(dx.shape), dev)

    @_serialized_in_simulator
    def roi_pool(self, x_nhwc, rois, output_size, spatial_scale=1.0, bad=None):
        """torchvision's RoI max pooling (see ``reference.conv.roi_pool``). A roi whose batch index
        is not a whole number in [0, N) gives zeros and, given a one-element device array ``bad``,
        sets bad[0] = 1 (the layer checks the indices before calling a host primitive)."""
        dev = is_device(x_nhwc)
        if x_nhwc.size == 0 or rois.shape[0] == 0:
            return self._host_path(is_device(x_nhwc), super().roi_pool(to_host(x_nhwc), to_host(rois), output_size, spatial_scale))
        dx = to_device(x_nhwc)
        dr = to_device(rois)
        k, c = dr.shape[0], dx.shape[3]
        ph, pw = output_size
        y = self._empty((k, ph, pw, c))
        blocks, threads = _grid2(c, k * ph * pw, self.sim)
        K.roi_pool_nhwc[blocks, threads](dx, dr, np.float32(spatial_scale), y,
                                         self.zeros((1,)) if bad is None else bad)
        return self._back(y, dev)

    # ------------------------------------------------------------------------ attention
    @_serialized_in_simulator
    def attention_softmax(self, scores_bhqk, scale, bias, causal=False, empty=0):
        dev = is_device(scores_bhqk)
        if scores_bhqk.ndim != 4 or scores_bhqk.size == 0 or (bias is not None and bias.ndim > 4):
            return self._host_path(is_device(scores_bhqk), super().attention_softmax(to_host(scores_bhqk), scale, to_host(bias), causal,
                                             empty))
        s = to_device(scores_bhqk)
        tk = s.shape[3]
        if bias is None:
            db = self._dummy4
        elif is_device(bias):
            db = bias if bias.ndim == 4 else bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
            if db.shape[3] != tk:
                db = self.copy_view(db, lambda v: np.broadcast_to(v, v.shape[:3] + (tk,)))
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
    def attention(self, q_bhqd, k_bhkd, v_bhkv, scale, bias=None, causal=False, empty=0,
                  need_weights=True):
        dev = is_device(q_bhqd)
        shapes = (q_bhqd.shape, k_bhkd.shape, v_bhkv.shape)
        if not (q_bhqd.ndim == k_bhkd.ndim == v_bhkv.ndim == 4
                and shapes[0][:2] == shapes[1][:2] == shapes[2][:2]
                and q_bhqd.size and k_bhkd.size and v_bhkv.size):
            return self._host_path(is_device(q_bhqd), super().attention(to_host(q_bhqd), to_host(k_bhkd), to_host(v_bhkv), scale,
                                     to_host(bias), causal, empty, need_weights))
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
        return self._back(out, dev), (self._back(w, dev) if need_weights else None)

    def _self_attention_rows(self, rows, n, length, w_qkv_io, b_qkv, w_o_io, b_o, num_heads,
                             bias, empty, need_weights):
        """Multi-head self-attention of the device rows (n length, E): (output rows on the
        device, attention weights or None)."""
        e = rows.shape[1]
        hd = e // num_heads
        qkv = self.dense(rows, w_qkv_io, b_qkv)
        q, k, v = (self.copy_view(qkv, lambda a, i=i: a.reshape(n, length, 3, num_heads, hd)
                                  [:, :, i].transpose(0, 2, 1, 3)) for i in range(3))
        o, s = self.attention(q, k, v, 1.0 / math.sqrt(hd), bias, False, empty, need_weights)
        o_rows = self.copy_view(o, lambda a: a.transpose(0, 2, 1, 3)).reshape(n * length, e)
        return self.dense(o_rows, w_o_io, b_o), s

    @_serialized_in_simulator
    def self_attention(self, x_nle, w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias=None,
                       empty=0, need_weights=True):
        """``ReferenceOps.self_attention`` with every value on the device: the input copied in
        once and the output out once."""
        dev = is_device(x_nle)
        n, length, e = x_nle.shape
        if x_nle.size == 0:
            return self._host_path(dev, super().self_attention(
                to_host(x_nle), w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias, empty,
                need_weights))
        out, s = self._self_attention_rows(to_device(x_nle).reshape(n * length, e), n, length,
                                           w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias, empty,
                                           need_weights)
        weights = self._back(s, dev) if need_weights else None
        return self._back(out.reshape(n, length, e), dev), weights

    @_serialized_in_simulator
    def encoder_layer(self, x_nle, w, num_heads, activation="relu", norm_first=False, bias=None,
                      empty=0, need_weights=True):
        """``ReferenceOps.encoder_layer`` with every value on the device: the input copied in
        once and the output out once (the reference composition would copy each product's,
        attention's and norm's operands in and out)."""
        dev = is_device(x_nle)
        n, length, e = x_nle.shape
        if x_nle.size == 0:
            return self._host_path(is_device(x_nle), super().encoder_layer(to_host(x_nle), w, num_heads, activation, norm_first,
                                         bias, empty, need_weights))
        rows = to_device(x_nle).reshape(n * length, e)

        def mha(z_rows):
            return self._self_attention_rows(z_rows, n, length, w.w_qkv_io, w.b_qkv, w.w_o_io,
                                             w.b_o, num_heads, bias, empty, need_weights)

        def ff(z_rows):
            return self.dense(self.dense(z_rows, w.w_1_io, w.b_1, activation), w.w_2_io, w.b_2)

        def norm(z_rows, ln):
            return self.layer_norm(z_rows, *ln)

        def add(a, b):
            return self.merge(a, b, "add")

        if norm_first:
            a, s = mha(norm(rows, w.norm1))
            y = add(rows, a)
            out = add(y, ff(norm(y, w.norm2)))
        else:
            a, s = mha(rows)
            y = norm(add(rows, a), w.norm1)
            out = norm(add(y, ff(y)), w.norm2)
        weights = self._back(s, dev) if need_weights else None
        return self._back(out.reshape(n, length, e), dev), weights

    @_serialized_in_simulator
    def tanh_scores(self, q_pqd, k_pkd, w_d, inner=1.0, outer=1.0):
        """s[p, i, j] = outer sum_d w[d] tanh(inner (q[p, i, d] + k[p, j, d])) (w None: ones):
        additive (Bahdanau) and "concat" attention scores, (P, Tq, Tk)."""
        dev = is_device(q_pqd)
        dq, dk = to_device(q_pqd), self._operand(k_pkd, dev)
        p, tq, tk = dq.shape[0], dq.shape[1], dk.shape[1]
        s = self._empty((p, tq, tk))
        if p * tq * tk:
            blocks, threads = _grid2(tk, p * tq, self.sim)
            dw = self._dummy if w_d is None else self._weight(w_d)
            K.tanh_scores[blocks, threads](dq, dk, dw, w_d is not None, np.float32(inner),
                                           np.float32(outer), s)
        return self._back(s, dev)

    @_serialized_in_simulator
    def hard_attention(self, s_pqk, causal=False):
        """One-hot weights at the first argmax over the last axis of scores (P, Tq, Tk) (keys after
        the query excluded if ``causal``; NaN wins, as np.argmax)."""
        dev = is_device(s_pqk)
        ds = to_device(s_pqk)
        w = self._empty(ds.shape)
        rows = ds.shape[0] * ds.shape[1]
        if rows and ds.shape[2]:
            g, t = _grid1(rows, self.sim)
            K.hard_attention_rows[g, t](ds, bool(causal), w)
        return self._back(w, dev)

    # ---------------------------------------------------------------- embeddings and trees
    def _indices(self, ids, bad):
        """``ids`` as a flat int64 device array; device floats are checked to be whole numbers
        (else index -1 and bad[0] = 1); host ids were checked by the layer."""
        n = math.prod(ids.shape)
        if not is_device(ids):
            return to_device(np.asarray(ids).astype(np.int64).reshape(n), np.int64)
        if ids.dtype == np.int64:
            return _flat(ids) if n else ids.reshape(0)
        out = self._empty((n,), np.int64)
        if n:
            g, t = _grid1(n, self.sim)
            K.whole_floats_to_int64[g, t](_flat(ids), out, bad)
        return out

    @_serialized_in_simulator
    def embedding(self, ids, table, bad=None):
        """y[..., :] = table[ids[...], :]. On the device an id that is not a whole number in
        [0, V) gives a zero row and, given a one-element device array ``bad``, sets bad[0] = 1
        (the Embedding layer checks host ids itself)."""
        dev = is_device(ids)
        flag = self.zeros((1,)) if bad is None else bad
        shape = tuple(ids.shape)
        di = self._indices(ids, flag)
        out = self._empty((di.shape[0], table.shape[1]))
        if di.shape[0] and table.shape[1]:
            blocks, threads = _grid2(table.shape[1], di.shape[0], self.sim)
            K.gather_rows[blocks, threads](di, self._weight(table), out, flag)
        return self._back(out.reshape(shape + (table.shape[1],)), dev)

    @_serialized_in_simulator
    def hsoftmax_log_probs(self, x, w_in, b_n, path_nodes, path_signs):
        dev = is_device(x)
        if x.shape[0] == 0:
            return self._host_path(is_device(x), super().hsoftmax_log_probs(to_host(x), w_in, b_n, path_nodes, path_signs))
        z = self.dense(to_device(x), w_in, b_n)
        out = self._empty((z.shape[0], path_nodes.shape[0]))
        blocks, threads = _grid2(path_nodes.shape[0], z.shape[0], self.sim)
        K.hsoftmax_rows[blocks, threads](z, self._weight(path_nodes), self._weight(path_signs), out)
        return self._back(out, dev)

    @_serialized_in_simulator
    def hsoftmax_class_log_probs(self, x, w_in, b_n, path_nodes, path_signs, classes, bad=None):
        """As ReferenceOps; on the device a class that is not a whole number in [0, C) gives 0 and,
        given a one-element device array ``bad``, sets bad[0] = 1."""
        dev = is_device(x)
        if x.shape[0] == 0:
            return self._host_path(is_device(x), super().hsoftmax_class_log_probs(to_host(x), w_in, b_n, path_nodes, path_signs,
                                                    to_host(classes)))
        flag = self.zeros((1,)) if bad is None else bad
        z = self.dense(to_device(x), w_in, b_n)
        dc = self._indices(classes, flag)
        out = self._empty((z.shape[0],))
        g, t = _grid1(z.shape[0], self.sim)
        K.hsoftmax_class_rows[g, t](z, self._weight(path_nodes), self._weight(path_signs), dc,
                                    out, flag)
        return self._back(out, dev)

    # ------------------------------------------------------------------------ recurrent
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

    def _recurrent_loop(self, x_bti, out_size, h0, y0, dmask, has_mask, reverse,
                        return_sequences, zero_masked, step):
        """The time loop on the host, every array on the device: ``step(t, h)`` writes the new
        output into a (B, out_size) buffer it returns; masking and outputs are committed here."""
        nb, t_len = x_bti.shape[0], x_bti.shape[1]
        h = self._copy_of(h0)
        carried = self.zeros((nb, out_size)) if y0 is None else self._copy_of(y0)
        ys = self.zeros((nb, t_len if return_sequences else 1, out_size))
        blocks, threads = _grid2(out_size, nb, self.sim)
        for t in (range(t_len - 1, -1, -1) if reverse else range(t_len)):
            hn = step(t, h)
            K.commit_step[blocks, threads](hn, h, carried, ys, t, t if return_sequences else 0,
                                           dmask, has_mask, bool(zero_masked))
        return (ys if return_sequences else ys.reshape(nb, out_size)), h

    @_serialized_in_simulator
    def rnn_sequence(self, x_bti, w_ih, w_hh, b, h0, *, activation="tanh", mask_bt=None,
                     reverse=False, return_sequences=True, zero_masked=False, y0=None):
        """SimpleRNN over time on the device: per step the tiled h w_hh product, one gate kernel."""
        code = _gate_code(activation)
        dev = is_device(x_bti)
        if code is None or 0 in x_bti.shape:
            return self._host_path(is_device(x_bti), super().rnn_sequence(
                to_host(x_bti), to_host(w_ih), to_host(w_hh), to_host(b), to_host(h0),
                activation=activation, mask_bt=to_host(mask_bt), reverse=reverse,
                return_sequences=return_sequences, zero_masked=zero_masked, y0=to_host(y0)))
        nb, units = x_bti.shape[0], w_hh.shape[0]
        xw = self._input_projection(x_bti, w_ih, b)
        dw_hh = self._weight(w_hh)
        rec = self._empty((nb, units))
        hn = self._empty((nb, units))
        blocks, threads = _grid2(units, nb, self.sim)

        def step(t, h):
            self._matmul_into(h, dw_hh, rec)
            K.rnn_gates[blocks, threads](xw, t, rec, hn, code)
            return hn

        y, h = self._recurrent_loop(x_bti, units, h0, y0, self._mask(mask_bt),
                                    mask_bt is not None, reverse, return_sequences, zero_masked,
                                    step)
        return self._back(y, dev), self._back(h, dev)

    @_serialized_in_simulator
    def lstm_sequence(self, x_bti, w_ig, w_hg, b_g, h0, c0, *, w_hp=None, activation="tanh",
                      recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                      return_sequences=True, zero_masked=False, y0=None):
        """LSTM over time on the device: one fused gate kernel per step after a tiled h w_hg product."""
        act, ract = _gate_code(activation), _gate_code(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return self._host_path(is_device(x_bti), super().lstm_sequence(
                to_host(x_bti), to_host(w_ig), to_host(w_hg), to_host(b_g), to_host(h0),
                to_host(c0), w_hp=to_host(w_hp), activation=activation,
                recurrent_activation=recurrent_activation, mask_bt=to_host(mask_bt),
                reverse=reverse, return_sequences=return_sequences, zero_masked=zero_masked,
                y0=to_host(y0)))
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
        act, ract = _gate_code(activation), _gate_code(recurrent_activation)
        dev = is_device(x_bti)
        if act is None or ract is None or 0 in x_bti.shape:
            return self._host_path(is_device(x_bti), super().gru_sequence(
                to_host(x_bti), to_host(w_ig), to_host(w_hg), to_host(b_ig), to_host(b_hg),
                to_host(h0), reset_after=reset_after, activation=activation,
                recurrent_activation=recurrent_activation, mask_bt=to_host(mask_bt),
                reverse=reverse, return_sequences=return_sequences, zero_masked=zero_masked,
                y0=to_host(y0)))
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

        y, h = self._recurrent_loop(x_bti, units, h0, y0, self._mask(mask_bt),
                                    mask_bt is not None, reverse, return_sequences, zero_masked,
                                    step)
        return self._back(y, dev), self._back(h, dev)

    # ------------------------------------------------------------- normalization, pooling
    @_serialized_in_simulator
    def batch_norm(self, x, scale, shift, axis=-1):
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().batch_norm(to_host(x), to_host(scale), to_host(shift), axis))
        dx = to_device(x)
        shape = tuple(dx.shape)
        axis %= len(shape)
        x3 = dx.reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
        out = self._empty(x3.shape)
        blocks, threads = _grid2(x3.shape[2], x3.shape[0] * x3.shape[1], self.sim)
        K.scale_shift_oci[blocks, threads](x3, self._weight(scale), self._weight(shift), out)
        return self._back(out.reshape(shape), dev)

    @_serialized_in_simulator
    def layer_norm(self, x, gamma, beta, epsilon, axes=(-1,), rms=False):
        """As ReferenceOps: one thread per row of the normalized axes (moved last when they are not
        the trailing axes; gamma and beta have the normalized axes' shape)."""
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().layer_norm(to_host(x), to_host(gamma), to_host(beta), epsilon, axes,
                                      rms))
        dx = to_device(x)
        nd = dx.ndim
        axes = sorted({int(a) % nd for a in axes})
        if axes != list(range(nd - len(axes), nd)):
            rest = [a for a in range(nd) if a not in axes]
            y = self.layer_norm(self.transpose(dx, rest + axes), gamma, beta, epsilon,
                                range(len(rest), nd), rms)
            return self._back(self.transpose(y, np.argsort(rest + axes)), dev)
        shape = tuple(dx.shape)
        n = math.prod(shape[nd - len(axes):])
        rows = dx.reshape(math.prod(shape) // n, n)
        out = self._empty(rows.shape)
        g, t = _grid1(rows.shape[0], self.sim)
        K.layer_norm_rows[g, t](
            rows, self._dummy if gamma is None else _flat(self._weight(gamma)), gamma is not None,
            self._dummy if beta is None else _flat(self._weight(beta)), beta is not None,
            np.float32(epsilon), bool(rms), out)
        return self._back(out.reshape(shape), dev)

    @_serialized_in_simulator
    def global_pool(self, x, kind, axes, keepdims=False):
        """Max or mean over ``axes`` (on the device when they are adjacent and not the batch axis,
        e.g. NHWC (1, 2) or NCHW (2, 3))."""
        dev = is_device(x)
        nd = x.ndim
        axes_n = sorted({a % nd for a in axes}) if nd else []
        if x.size == 0 or not axes_n or axes_n[0] == 0 or \
                axes_n != list(range(axes_n[0], axes_n[-1] + 1)):
            return self._host_path(is_device(x), super().global_pool(to_host(x), kind, axes, keepdims))
        shape = tuple(x.shape)
        dx = to_device(x)
        outer, inner = math.prod(shape[:axes_n[0]]), math.prod(shape[axes_n[-1] + 1:])
        x3 = dx.reshape(outer, math.prod(shape) // (outer * inner), inner)
        y = self._empty((outer, inner))
        blocks, threads = _grid2(inner, outer, self.sim)
        K.global_pool_nhwc[blocks, threads](x3, y, kind == "max")
        kept = tuple(1 if a in axes_n else n for a, n in enumerate(shape)
                     if keepdims or a not in axes_n)
        return self._back(y.reshape(kept), dev)

    @_serialized_in_simulator
    def merge(self, a, b, op, alpha=1.0, beta=1.0):
        """(alpha a) op (beta b) elementwise with numpy broadcasting, op in "add", "subtract",
        "multiply", "maximum", "minimum" (NaN wins), "div_std" (a / max(sqrt(b), 1e-7)) and
        "mul_std" (a max(sqrt(b), 1e-7)): the merge layers, Rescaling and Normalization."""
        dev = is_device(a) or is_device(b)
        da, db = self._operand(a, dev), self._operand(b, dev)
        shape = np.broadcast_shapes(tuple(da.shape), tuple(db.shape))
        out = self._empty(shape)
        n = math.prod(shape)
        if n:
            _, a_str, a_off = _layout(da.shape, lambda v: np.broadcast_to(v, shape))
            _, b_str, b_off = _layout(db.shape, lambda v: np.broadcast_to(v, shape))
            shape6, a6, b6 = _collapse6(shape, a_str, b_str)
            g, t = _grid1(n, self.sim)
            K.binary_strided[g, t](_flat(da), a_off, a6, _flat(db), b_off, b6, _flat(out), shape6,
                                   _BINARY_OPS[op], np.float32(alpha), np.float32(beta))
        return self._back(out, dev)

    @_serialized_in_simulator
    def concatenate(self, xs, axis=-1):
        """Concatenation of same-rank arrays along ``axis`` (every other axis equal)."""
        dev = any(map(is_device, xs))
        shapes = [tuple(a.shape) for a in xs]
        axis %= len(shapes[0])
        total = sum(s[axis] for s in shapes)
        out = self._empty(shapes[0][:axis] + (total,) + shapes[0][axis + 1:])
        start = 0
        for a, shape in zip(xs, shapes):
            place = (slice(None),) * axis + (slice(start, start + shape[axis]),)
            self._copy(to_device(a), None, out, lambda v, place=place: v[place])
            start += shape[axis]
        return self._back(out, dev)
