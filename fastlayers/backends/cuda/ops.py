"""CudaOps: ReferenceOps with the primitives run as numba.cuda kernels on the device.

The primitives are split by family, as in the cpu backend: the elementwise, dense,
normalization and merging ones here; convolution and pooling in ``conv.py``, attention in
``attention.py``, the recurrent loops in ``recurrent.py``, ids and embeddings in
``indexing.py``, each a base class of CudaOps; ``device.py`` holds their common base
(``DeviceOps``: the device, the weight cache, transfers, the device-array utilities) and
``views.py`` the launch sizes and strided views. The kernels are in ``kernels.py``.

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

import math

import numpy as np

from ..derived import derived
from ..integer import INTEGER_KERNELS
from . import kernels as K
from . import strided_kernels as S
from .attention import AttentionOps
from .conv import ConvOps
from .device import TRANSFERS, Transfers, serialized_in_simulator
from .indexing import IndexingOps
from .recurrent import RecurrentOps
from .runtime import is_device, to_device, to_host
from .views import as_rows, collapse6, flat, grid1, grid2, layout

__all__ = ["TRANSFERS", "CudaOps", "Transfers"]

_BINARY_OPS = {
    "add": S.OP_ADD,
    "subtract": S.OP_SUB,
    "multiply": S.OP_MUL,
    "maximum": S.OP_MAX,
    "minimum": S.OP_MIN,
    "div_std": S.OP_DIV_STD,
    "mul_std": S.OP_MUL_STD,
    "divide": S.OP_DIV,
}


class CudaOps(ConvOps, AttentionOps, RecurrentOps, IndexingOps):
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
    #: Quantized ONNX graphs' integer products run on the host's native kernels.
    integer = INTEGER_KERNELS

    # ---------------------------------------------------------------------- elementwise
    @serialized_in_simulator
    def activation(self, x, name, alpha=0.0):
        dev = is_device(x)
        if (name not in K.CODES and name not in ("softmax", "log_softmax")) or x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().activation(to_host(x), name, alpha))
        if name not in K.CODES:
            return self._softmax(x, (x.ndim - 1,), name == "log_softmax")
        dx = to_device(x)
        rows = as_rows(dx)
        out = self._empty(rows.shape)
        blocks, threads = grid2(rows.shape[1], rows.shape[0], self.sim)
        K.act_rows[blocks, threads](rows, out, K.CODES[name], np.float32(alpha))
        return self._back(out.reshape(dx.shape), dev)

    @serialized_in_simulator
    def relu(self, x, threshold=0.0, negative_slope=0.0, max_value=None):
        """Keras ReLU: x where x > threshold, else negative_slope (x - threshold); then at most
        ``max_value``."""
        dev = is_device(x)
        dx = to_device(x)
        out = self._empty(dx.shape)
        n = math.prod(dx.shape)
        if n:
            g, t = grid1(n, self.sim)
            K.relu_flat[g, t](
                flat(dx),
                flat(out),
                np.float32(threshold),
                np.float32(negative_slope),
                np.float32(0.0 if max_value is None else max_value),
                max_value is not None,
            )
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
        outer, inner = math.prod(shape[: axes[0]]), math.prod(shape[axes[-1] + 1 :])
        y = self._copy_of(dx)
        g, t = grid1(outer * inner, self.sim)
        K.softmax_oni[g, t](y.reshape(outer, math.prod(shape) // (outer * inner), inner), log)
        return self._back(y, dev)

    @serialized_in_simulator
    def softmax(self, x, axis=-1):
        if x.ndim == 0 or x.size == 0:
            return self._host_path(is_device(x), super().softmax(to_host(x), axis))
        return self._softmax(x, axis if isinstance(axis, tuple) else (axis,), False)

    @serialized_in_simulator
    def log_softmax(self, x, axis=-1):
        if x.ndim == 0 or x.size == 0:
            return self._host_path(is_device(x), super().log_softmax(to_host(x), axis))
        return self._softmax(x, axis if isinstance(axis, tuple) else (axis,), True)

    # ---------------------------------------------------------------------------- dense
    @serialized_in_simulator
    def dense(self, x, w_io, b_o, activation="linear", alpha=0.0):
        dev = is_device(x)
        if not isinstance(w_io, np.ndarray) and not is_device(w_io):  # another backend's dense_weights
            w_io = derived(w_io, "host-array", np.asarray)
        if x.size == 0 or w_io.shape[1] == 0 or w_io.shape[0] == 0:
            return self._host_path(
                is_device(x), super().dense(to_host(x), to_host(w_io), to_host(b_o), activation, alpha)
            )
        dx = to_device(x)
        rows = dx if dx.ndim == 2 else as_rows(dx)
        m, n = rows.shape[0], w_io.shape[1]
        y = self._empty((m, n))
        code = K.CODES.get(activation)
        db = self._dummy if b_o is None else self._weight(b_o)
        grid = ((n + K.TILE - 1) // K.TILE, (m + K.TILE - 1) // K.TILE)
        K.mm_bias_act[grid, (K.TILE, K.TILE)](
            rows, self._weight(w_io), db, b_o is not None, K.LINEAR if code is None else code, np.float32(alpha), y
        )
        if code is None:  # softmax over the rows, or an activation the kernels lack
            y = self._epilogue(y, None, activation, alpha)
        return self._back(y if dx.ndim == 2 else y.reshape(tuple(dx.shape)[:-1] + (n,)), dev)

    @serialized_in_simulator
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

    # ---------------------------------------------------------------------- normalization
    @serialized_in_simulator
    def batch_norm(self, x, scale, shift, axis=-1, out=None):
        if out is not None:  # the result, then copied into out (host or device)
            y = self.batch_norm(x, scale, shift, axis)
            if is_device(out):
                out.copy_to_device(y)
            else:
                np.copyto(out, to_host(y))
            return out
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(is_device(x), super().batch_norm(to_host(x), to_host(scale), to_host(shift), axis))
        dx = to_device(x)
        shape = tuple(dx.shape)
        axis %= len(shape)
        x3 = dx.reshape(math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))
        out = self._empty(x3.shape)
        blocks, threads = grid2(x3.shape[2], x3.shape[0] * x3.shape[1], self.sim)
        K.scale_shift_oci[blocks, threads](x3, self._weight(scale), self._weight(shift), out)
        return self._back(out.reshape(shape), dev)

    @serialized_in_simulator
    def layer_norm(self, x, gamma, beta, epsilon, axes=(-1,), rms=False):
        """As ReferenceOps: one thread per row of the normalized axes (moved last when they are not
        the trailing axes; gamma and beta have the normalized axes' shape)."""
        dev = is_device(x)
        if x.size == 0 or x.ndim == 0:
            return self._host_path(
                is_device(x), super().layer_norm(to_host(x), to_host(gamma), to_host(beta), epsilon, axes, rms)
            )
        dx = to_device(x)
        nd = dx.ndim
        axes = sorted({int(a) % nd for a in axes})
        if axes != list(range(nd - len(axes), nd)):
            rest = [a for a in range(nd) if a not in axes]
            y = self.layer_norm(self.transpose(dx, rest + axes), gamma, beta, epsilon, range(len(rest), nd), rms)
            return self._back(self.transpose(y, np.argsort(rest + axes)), dev)
        shape = tuple(dx.shape)
        n = math.prod(shape[nd - len(axes) :])
        rows = dx.reshape(math.prod(shape) // n, n)
        out = self._empty(rows.shape)
        g, t = grid1(rows.shape[0], self.sim)
        K.layer_norm_rows[g, t](
            rows,
            self._dummy if gamma is None else flat(self._weight(gamma)),
            gamma is not None,
            self._dummy if beta is None else flat(self._weight(beta)),
            beta is not None,
            np.float32(epsilon),
            bool(rms),
            out,
        )
        return self._back(out.reshape(shape), dev)

    # ---------------------------------------------------------------------------- merging
    @serialized_in_simulator
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
            _, a_str, a_off = layout(da.shape, lambda v: np.broadcast_to(v, shape))
            _, b_str, b_off = layout(db.shape, lambda v: np.broadcast_to(v, shape))
            shape6, a6, b6 = collapse6(shape, a_str, b_str)
            g, t = grid1(n, self.sim)
            S.binary_strided[g, t](
                flat(da),
                a_off,
                a6,
                flat(db),
                b_off,
                b6,
                flat(out),
                shape6,
                _BINARY_OPS[op],
                np.float32(alpha),
                np.float32(beta),
            )
        return self._back(out, dev)

    @serialized_in_simulator
    def concatenate(self, xs, axis=-1):
        """Concatenation of same-rank arrays along ``axis`` (every other axis equal)."""
        dev = any(map(is_device, xs))
        shapes = [tuple(a.shape) for a in xs]
        axis %= len(shapes[0])
        total = sum(s[axis] for s in shapes)
        out = self._empty(shapes[0][:axis] + (total,) + shapes[0][axis + 1 :])
        start = 0
        for a, shape in zip(xs, shapes):
            place = (slice(None),) * axis + (slice(start, start + shape[axis]),)
            self._copy(to_device(a), None, out, lambda v, place=place: v[place])
            start += shape[axis]
        return self._back(out, dev)
