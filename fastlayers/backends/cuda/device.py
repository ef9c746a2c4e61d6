"""DeviceOps, the base class of CudaOps: the device, the weight cache, the copies between host
and device, the device-array utilities that layers call, and what the primitives of the family
modules (``ops.py``, ``conv.py``, ``attention.py``, ``recurrent.py``, ``indexing.py``) share:
device buffers, weights, tiled products, strided copies, the bias and activation epilogue, and
the host fallback (``ops.py`` states the residency rules).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import numpy as np

from ..reference import ReferenceOps
from . import kernels as K
from . import strided_kernels as S
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
from .views import collapse6, flat, grid1, grid2, layout

_DUMMY = np.zeros(1, np.float32)
_DUMMY4 = np.zeros((1, 1, 1, 1), np.float32)
_DUMMY_MASK = np.zeros((1, 1), np.uint8)


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


def serialized_in_simulator(method):
    """Run ``method`` under the ops' simulator lock: numba's CUDA simulator keeps per-launch
    state in module globals and cannot run kernels from several Python threads at once (a real
    device can; there the lock is a no-op)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._launch_lock:
            return method(self, *args, **kwargs)

    return wrapper


class DeviceOps(ReferenceOps):
    """The device side that every family of CudaOps' primitives builds on (a base class of
    ``CudaOps``; raises UnsupportedError when no device, or simulator, is usable)."""

    def __init__(self):
        self.cuda = load_cuda()
        if driver() is not None:  # a real GPU: launches through the driver (launch.py)
            for kernels in (K, S):
                install_fast_launches(kernels, driver())
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
            K.mm_bias_act[grid, (K.TILE, K.TILE)](a_mk, b_kn, self._dummy, False, K.LINEAR, np.float32(0.0), c_mn)
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
        shape, s_str, s_off = layout(src.shape, src_view)
        d_shape, d_str, d_off = layout(dst.shape, dst_view)
        if shape != d_shape:
            raise ValueError(f"cuda copy: source view {shape} and destination view {d_shape} differ")
        n = math.prod(shape)
        if n == 0:
            return
        shape6, s6, d6 = collapse6(shape, s_str, d_str)
        g, t = grid1(n, self.sim)
        S.copy_strided[g, t](flat(src), s_off, s6, flat(dst), d_off, d6, shape6)

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
    @serialized_in_simulator
    def zeros(self, shape, dtype=np.float32):
        """A new device array of zeros (filled on the device, nothing copied in)."""
        out = self._empty(shape, dtype)
        n = math.prod(out.shape)
        if n:
            g, t = grid1(n, self.sim)
            S.fill_flat[g, t](flat(out), np.dtype(dtype).type(0))
        return out

    @serialized_in_simulator
    def copy_view(self, x, select):
        """A new C-contiguous array holding ``select(x)``, ``select`` being numpy view rules
        (transpose, basic slicing, flip, broadcast_to; e.g. ``lambda v: v[:, ::-1]``)."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        shape = layout(dx.shape, select)[0]
        out = self._empty(shape, dx.dtype)
        self._copy(dx, select, out, None)
        return self._back(out, dev)

    @serialized_in_simulator
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

    @serialized_in_simulator
    def mask_keep(self, mask):
        """A Keras mask (True, or > 0.5 for numbers) as float32 1 or 0."""
        dev = is_device(mask)
        dm = to_device(mask, device_dtype(mask.dtype))
        out = self._empty(dm.shape)
        n = math.prod(dm.shape)
        if n:
            g, t = grid1(n, self.sim)
            S.keep_f32[g, t](flat(dm), dm.dtype.type(0.5 if dm.dtype.kind == "f" else 0), flat(out))
        return self._back(out, dev)

    @serialized_in_simulator
    def pad(self, x, pads):
        """``np.pad(x, pads)`` with zeros; ``pads`` is one (before, after) pair per axis."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        shape = tuple(dx.shape)
        out = self.zeros(tuple(n + a + b for n, (a, b) in zip(shape, pads)), dx.dtype)
        inner = tuple(slice(a, a + n) for n, (a, _) in zip(shape, pads))
        self._copy(dx, None, out, lambda v: v[inner])
        return self._back(out, dev)

    @serialized_in_simulator
    def nonzero_mask(self, x):
        """``x != 0`` as a uint8 array (the device form of a bool mask)."""
        dev = is_device(x)
        dx = to_device(x, device_dtype(x.dtype))
        out = self._empty(dx.shape, np.uint8)
        n = math.prod(dx.shape)
        if n:
            g, t = grid1(n, self.sim)
            S.nonzero_u8[g, t](flat(dx), dx.dtype.type(0), flat(out))
        return self._back(out, dev)

    @serialized_in_simulator
    def mask_bias(self, mask, shape):
        """A Keras attention mask (True, or > 0.5 for numbers, means attend) as an additive bias of
        ``shape`` (0 or -inf), the mask broadcast to ``shape`` (numpy rules)."""
        dev = is_device(mask)
        dm = to_device(mask, device_dtype(mask.dtype))
        thr = dm.dtype.type(0.5 if dm.dtype.kind == "f" else 0)
        out = self._empty(shape)
        n = math.prod(shape)
        if n:
            shape_b, m_str, m_off = layout(dm.shape, lambda v: np.broadcast_to(v, tuple(shape)))
            shape6, m6 = collapse6(shape_b, m_str)
            g, t = grid1(n, self.sim)
            S.keep_bias_strided[g, t](flat(dm), m_off, m6, thr, flat(out), shape6)
        return self._back(out, dev)

    # --------------------------------------------------------------- epilogue and results
    def _epilogue(self, y_rc, b, activation, alpha):
        """y = f(y + b) in place over device rows; unknown activations run on the host."""
        code = K.CODES.get(activation)
        rows, cols = y_rc.shape
        if b is not None or code not in (None, K.LINEAR):
            blocks, threads = grid2(cols, rows, self.sim)
            db = self._dummy if b is None else self._weight(b)
            K.bias_act_rows[blocks, threads](
                y_rc, db, b is not None, K.LINEAR if code is None else code, np.float32(alpha)
            )
        if code is not None:
            return y_rc
        if activation in ("softmax", "log_softmax"):
            g, t = grid1(rows, self.sim)
            K.softmax_rows[g, t](y_rc, activation == "log_softmax")
            return y_rc
        host = ReferenceOps.activation(self, to_host(y_rc), activation, alpha)
        return to_device(host)

    @staticmethod
    def _back(out, was_device):
        return out if was_device else to_host(out)
