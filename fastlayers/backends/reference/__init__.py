"""ReferenceOps: every primitive in plain numpy; the readable oracle and the fallback of all backends.

Primitives take float32 arrays and return new float32 arrays. They assume their arguments were
validated by the calling layer (shapes, dtypes) and neither check nor coerce beyond that. The
signatures use the array aliases of ``backends.types``, whose ``Ops`` protocol lists this
class's public members: the interface every backend offers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ...errors import InputError, ShapeError
from ..accumulate import wide_mean
from ..activations import _activation, _log_softmax, _softmax
from ..types import (
    ArrayXd,
    BoolsXd,
    Cell,
    EncoderWeights,
    Floats1d,
    Floats2d,
    Floats3d,
    Floats4d,
    FloatsXd,
    Ints1d,
    Ints2d,
    IntsXd,
    Pads2d,
    Pair,
    SequenceCall,
    Taps,
)

if TYPE_CHECKING:
    from ..integer import IntegerKernels


def fold_batch_norm(mean, var, gamma, beta, epsilon):
    """Inference batch norm as one affine map: scale = gamma / sqrt(var + eps), shift = beta - mean scale."""
    scale = np.float32(1) / np.sqrt(var + np.float32(epsilon))
    if gamma is not None:
        scale = scale * gamma
    shift = -mean * scale
    if beta is not None:
        shift = shift + beta
    return scale.astype(np.float32), shift.astype(np.float32)


_MERGES = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
}


#: The binary and unary operations of ``elementwise_plan`` programs.
_EW_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_EW_UNARY = {"sqrt": np.sqrt, "neg": np.negative, "abs": np.abs}


class ReferenceOps:
    """Numpy implementation of every primitive; subclasses override the hot ones."""

    name = "reference"
    #: Where activations live between layers: None for host numpy arrays (this class and
    #: CpuOps); a device backend names its device and overrides the data-movement primitives.
    device: str | None = None
    #: The packed integer kernels quantized graphs run on (``backends.integer.IntegerKernels``),
    #: or None: their integer products then run in numpy.
    integer: IntegerKernels | None = None
    #: Activations the dense kernel applies without numpy's floating-point error state (native
    #: code, which raises no warnings): a graph of such steps alone needs no ``np.errstate``.
    quiet_activations: frozenset[str] = frozenset()

    # ------------------------------------------------------------ a model's call
    def enter_call(self) -> Any:
        """Begin a model's call in this thread: how its host arrays are allocated (numpy's own
        allocator here). Returns the token to pass to ``exit_call`` when the call ends."""
        return None

    def exit_call(self, token: Any) -> None:
        """End what ``enter_call`` began."""

    # ------------------------------------------------------------ data movement and layout
    def is_device_array(self, a: object) -> bool:
        """Whether ``a`` is an array of this backend's device (never, on the host)."""
        return False

    def to_device(self, x: Any) -> Any:
        """``x`` (a host array, or a list of them) where this backend computes: the identity
        here; a device backend copies floats in as float32, integer ids as int64."""
        return x

    def to_host(self, y: Any) -> Any:
        """``y`` (an array, or a list of them) as host numpy arrays: the identity here."""
        return y

    def as_float32(self, x: ArrayXd) -> FloatsXd:
        """x cast to float32 (ids, masks) as layers cast their inputs."""
        return x if x.dtype == np.float32 else x.astype(np.float32)

    def contiguous(self, x: ArrayXd) -> ArrayXd:
        """x as a C-contiguous array (x itself when it is one)."""
        return np.ascontiguousarray(x)

    def zeros(self, shape: int | Sequence[int], dtype: npt.DTypeLike = np.float32) -> ArrayXd:
        """A new array of zeros (initial recurrent states)."""
        return np.zeros(shape, dtype)

    def transpose(self, x: ArrayXd, axes: Sequence[int]) -> ArrayXd:
        """y = x with its axes permuted (``np.transpose``), C-contiguous."""
        return np.ascontiguousarray(np.transpose(x, axes))

    def channels_last(self, x: FloatsXd) -> FloatsXd:
        """(N, C, *S) -> a new C-contiguous (N, *S, C): NCL -> NLC, NCHW -> NHWC."""
        return np.ascontiguousarray(np.moveaxis(x, 1, -1))

    def channels_first(self, x: FloatsXd) -> FloatsXd:
        """(N, *S, C) -> a new C-contiguous (N, C, *S): NLC -> NCL, NHWC -> NCHW."""
        return np.ascontiguousarray(np.moveaxis(x, -1, 1))

    def oihw_to_hwio(self, w: FloatsXd) -> FloatsXd:
        """Convolution weights (C_out, C_in, *K) -> a new C-contiguous (*K, C_in, C_out)."""
        return np.ascontiguousarray(np.moveaxis(w, (0, 1), (-1, -2)))

    def take(self, x: ArrayXd, index: tuple[Any, ...]) -> ArrayXd:
        """y = x[index] for basic indexing (slices with any step, integers), C-contiguous."""
        return np.ascontiguousarray(x[index])

    def broadcast_to(self, x: ArrayXd, shape: Sequence[int]) -> ArrayXd:
        """x repeated to ``shape`` by numpy's broadcasting rules, as a new array."""
        return np.ascontiguousarray(np.broadcast_to(x, tuple(shape)))

    def pad(self, x: ArrayXd, pads: Sequence[Sequence[int]]) -> ArrayXd:
        """x padded with zeros: ``pads`` holds one (before, after) pair per axis."""
        return np.pad(x, pads)

    def concatenate(self, xs: Sequence[ArrayXd], axis: int = -1) -> ArrayXd:
        """The arrays ``xs`` (same rank, other axes equal) joined along ``axis``."""
        return np.concatenate(xs, axis=axis)

    def merge(self, a: FloatsXd, b: FloatsXd, op: str, alpha: float = 1.0, beta: float = 1.0) -> FloatsXd:
        """y = (alpha a) op (beta b) elementwise with numpy broadcasting; op in "add",
        "subtract", "multiply", "divide", "maximum", "minimum" (NaN wins), "div_std"
        (a / max(sqrt(b), 1e-7)) and "mul_std" (a max(sqrt(b), 1e-7))."""
        if alpha != 1.0:
            a = a * np.float32(alpha)
        if beta != 1.0:
            b = b * np.float32(beta)
        if op in ("div_std", "mul_std"):
            std = np.maximum(np.sqrt(b), np.float32(1e-7))
            y = a / std if op == "div_std" else a * std
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                y = _MERGES[op](a, b)
        return np.asarray(y, np.float32)

    def relu(
        self, x: FloatsXd, threshold: float = 0.0, negative_slope: float = 0.0, max_value: float | None = None
    ) -> FloatsXd:
        """Keras's ReLU: y = x where x > threshold, else negative_slope (x - threshold); then at
        most ``max_value``."""
        t = np.float32(threshold)
        y = np.where(x > t, x, np.float32(negative_slope) * (x - t))
        if max_value is not None:
            y = np.minimum(y, np.float32(max_value))
        return y.astype(np.float32, copy=False)

    def nonzero_mask(self, x: ArrayXd) -> BoolsXd:
        """m = (x != 0) as a bool mask (ids to padding masks, numeric masks to bool)."""
        x = np.asarray(x)
        return x if x.dtype == np.bool_ else x != 0

    def mask_bias(self, mask: ArrayXd, shape: Sequence[int]) -> FloatsXd:
        """An attention mask (True, or > 0.5 for numbers, means attend) as an additive bias of
        ``shape``: 0 where attended, -inf elsewhere (the mask broadcast by numpy's rules)."""
        keep = mask if mask.dtype == np.bool_ else mask > 0.5
        bias = np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
        return np.ascontiguousarray(np.broadcast_to(bias, tuple(shape)))

    def indices(self, ids: npt.ArrayLike, size: int, where: str, what: str = "indices") -> IntsXd:
        """``ids`` checked as indices into ``size`` rows, as an integer array: integer dtypes (or
        floats holding whole numbers, as Keras casts them) with every value in [0, size).

        Raises
        ------
        InputError
            Non-integer floats, or a value outside [0, size), naming ``where``.
        ShapeError
            Neither a numeric nor a bool array.
        """
        ids = np.asarray(ids)
        if ids.dtype.kind == "f":
            if not np.all(np.isfinite(ids)) or np.any(ids != np.round(ids)):
                raise InputError(f"{where}: expected integer {what}, got non-integer floats")
        elif ids.dtype.kind not in "iub":
            raise ShapeError(f"{where}: expected integer {what}, got dtype {ids.dtype}")
        ids = ids.astype(np.intp, copy=False)
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            raise InputError(f"{where}: {what} must be in [0, {size}), got values in [{ids.min()}, {ids.max()}]")
        return ids

    def mask_keep(self, mask: ArrayXd) -> FloatsXd:
        """A Keras mask (True, or > 0.5 for numbers, means keep) as float32 1 or 0."""
        keep = mask if mask.dtype == np.bool_ else mask > 0.5
        return keep.astype(np.float32)

    def split_heads(self, x_ptc: Floats3d, heads: int) -> Floats4d:
        """x (P, T, H*D) as (P, H, T, D): a strided view here (``attention`` reads views in
        place); a device backend makes it contiguous."""
        p, t, c = x_ptc.shape
        return x_ptc.reshape(p, t, heads, c // heads).transpose(0, 2, 1, 3)

    def merge_heads(self, o_phtd: Floats4d) -> Floats3d:
        """o (P, H, T, D) as (P, T, H*D), C-contiguous (free when ``o`` is the (P, T, H, D)
        array that ``attention`` returns a view of)."""
        p, h, t, d = o_phtd.shape
        return np.ascontiguousarray(o_phtd.transpose(0, 2, 1, 3)).reshape(p, t, h * d)

    def check_rois(self, rois: Floats2d, batch: int, where: str) -> Floats2d:
        """``rois`` (K, 5) whose first column, the batch index, holds whole numbers in
        [0, batch); raises ``InputError`` naming ``where`` otherwise."""
        index = rois[:, 0]
        if rois.shape[0] and (index.min() < 0 or index.max() >= batch or np.any(index != np.floor(index))):
            raise InputError(f"{where}: roi batch indices must be integers in [0, {batch}), got {np.unique(index)[:8]}")
        return rois

    # ------------------------------------------------------------------------ arithmetic

    def add_act(self, a: FloatsXd, b: FloatsXd, name: str, alpha: float = 0.0) -> FloatsXd:
        """f(a + b) for float32 ``a`` and ``b`` of one shape: a residual add and the activation
        after it (``activation``'s names but the softmax ones)."""
        return self.activation(np.add(a, b), name, alpha)

    def outer_add_act(self, a_ic: Floats2d, b_jc: Floats2d, name: str, alpha: float = 0.0) -> Floats3d:
        """y[i, j, c] = f(a[i, c] + b[j, c]) for float32 ``a`` (I, C) and ``b`` (J, C): the
        broadcast sum of additive attention and its activation (``add_act``'s names)."""
        return self.activation(np.add(a_ic[:, None, :], b_jc[None, :, :]), name, alpha)

    def activation(self, x: FloatsXd, name: str, alpha: float = 0.0) -> FloatsXd:
        """y = f(x) elementwise (softmax and log_softmax over the last axis)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return _activation(x, name, alpha)

    def dense(
        self, x: FloatsXd, w_io: Floats2d, b_o: Floats1d | None, activation: str = "linear", alpha: float = 0.0
    ) -> FloatsXd:
        """y[..., o] = f(sum_i x[..., i] w[i, o] + b[o]); ``w_io`` an array or what
        ``dense_weights`` gave (read through ``np.asarray``)."""
        y = np.matmul(x, np.asarray(w_io))
        if b_o is not None:
            y += b_o
        return y if activation == "linear" else self.activation(y, activation, alpha)

    def dense_weights(self, w_io: Floats2d) -> Any:
        """What a model that reads the (k, n) weights ``w_io`` only through ``dense`` holds in
        their place, so that it keeps one copy of them: here ``w_io`` itself; the cpu backend
        gives its packed form alone (``np.asarray`` of it gives the values back, unpacked anew)."""
        return w_io

    def dense_chain_plan(
        self, layers: Sequence[tuple[Floats2d, Floats1d | None, str, float]]
    ) -> Callable[[FloatsXd], FloatsXd]:
        """``run(x)``: dense layers applied in turn, y = f_L(... f_1(x w_1 + b_1) ... w_L + b_L),
        ``layers`` being (w_io, b_o or None, activation, alpha) each, every layer's input the
        output of the one before; here ``dense`` per layer, one native call on the cpu backend."""
        layers = tuple(layers)

        def run(x):
            for w_io, b_o, activation, alpha in layers:
                x = self.dense(x, w_io, b_o, activation, alpha)
            return x

        return run

    def elementwise_plan(self, program: Sequence[tuple]) -> Callable[[Sequence[ArrayXd]], ArrayXd]:
        """``run(operands)``: a chain of elementwise operations, numpy's broadcasting between
        operands. ``program``: (op, a, b, param) per instruction, a and b indices of values (the
        operands, then each instruction's result in turn; b -1 for a unary op), op one of add,
        sub, mul, div, act (param: (activation, alpha), the backend's ``activation`` on float32),
        sqrt, neg, abs, clip (param: (lo, hi), NaN kept); the result is the last instruction's.
        Each instruction rounds as the operator it stands for does alone (the cpu backend runs
        float32 chains in one native pass with the same bits)."""
        program = tuple(program)

        def run(operands):
            values = list(operands)
            for insn in program:
                values.append(self.elementwise_step(insn, values))
            return values[-1]

        return run

    def elementwise_step(self, insn: tuple, values: Sequence[ArrayXd]) -> ArrayXd:
        """One instruction of an ``elementwise_plan`` program on ``values``."""
        op, a, b, param = insn
        x = values[a]
        if op in _EW_BINARY:
            return _EW_BINARY[op](x, values[b])
        if op == "act":
            return self.activation(np.asarray(x, np.float32), param[0], param[1])
        if op == "clip":
            x = np.asarray(x)
            return np.minimum(np.maximum(x, np.asarray(param[0], x.dtype)), np.asarray(param[1], x.dtype))
        return _EW_UNARY[op](x)

    def softmax(self, x: FloatsXd, axis: int | tuple[int, ...] = -1) -> FloatsXd:
        """y = exp(x - max x) / sum exp(x - max x) along ``axis``."""
        with np.errstate(invalid="ignore"):
            return _softmax(x, axis)

    def log_softmax(self, x: FloatsXd, axis: int | tuple[int, ...] = -1) -> FloatsXd:
        """y = x - max x - log sum exp(x - max x) along ``axis``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return _log_softmax(x, axis)

    def batch_norm(
        self, x: FloatsXd, scale: Floats1d, shift: Floats1d, axis: int = -1, out: FloatsXd | None = None
    ) -> FloatsXd:
        """y = x scale + shift, indexed along ``axis`` (see ``fold_batch_norm``); written into
        ``out`` where given (an array of x's shape and type, which may be x itself)."""
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        if out is None:
            return x * scale.reshape(shape) + shift.reshape(shape)
        np.multiply(x, scale.reshape(shape), out=out)
        return np.add(out, shift.reshape(shape), out=out)

    def layer_norm(
        self,
        x: FloatsXd,
        gamma: FloatsXd | None,
        beta: FloatsXd | None,
        epsilon: float,
        axes: tuple[int, ...] = (-1,),
        rms: bool = False,
    ) -> FloatsXd:
        """y = gamma (x - mean) / sqrt(var + eps) + beta over ``axes`` (rms: y = gamma x / sqrt(mean x^2 + eps))."""
        if rms:
            y = x / np.sqrt(wide_mean(np.square(x), axes, keepdims=True) + np.float32(epsilon))
        else:
            mean = wide_mean(x, axes, keepdims=True)
            var = wide_mean(np.square(x - mean), axes, keepdims=True)
            y = (x - mean) / np.sqrt(var + np.float32(epsilon))
        shape = [1] * x.ndim
        for a in axes:
            shape[a] = x.shape[a]
        if gamma is not None:
            y = y * gamma.reshape(shape)
        if beta is not None:
            y = y + beta.reshape(shape)
        return y.astype(np.float32, copy=False)

    def embedding(self, ids: IntsXd, table: Floats2d) -> FloatsXd:
        """y[..., :] = table[ids[...], :]."""
        return table[ids]

    def hsoftmax_log_probs(
        self, x: Floats2d, w_in: Floats2d, b_n: Floats1d, path_nodes: Ints2d, path_signs: Floats2d
    ) -> Floats2d:
        """log p[b, c] = sum_d log sigmoid(sign[c, d] (x[b] . w[:, node[c, d]] + b[node[c, d]])).

        ``path_nodes``/``path_signs`` are (C, depth); padded steps have sign 0 and contribute 0.
        """
        z = x @ w_in + b_n  # (B, N)
        zs = z[:, path_nodes] * path_signs  # (B, C, depth)
        return np.sum(_log_sigmoid(zs) * (path_signs != 0), axis=-1)

    def hsoftmax_class_log_probs(
        self, x: Floats2d, w_in: Floats2d, b_n: Floats1d, path_nodes: Ints2d, path_signs: Floats2d, classes: Ints1d
    ) -> Floats1d:
        """log p[b] = sum_d log sigmoid(sign[y_b, d] (x[b] . w[:, node[y_b, d]] + b[node[y_b, d]]))."""
        nodes = path_nodes[classes]  # (B, depth)
        signs = path_signs[classes]
        w_bdi = np.moveaxis(w_in[:, nodes], 0, -1)  # (B, depth, I)
        z = np.einsum("bi,bdi->bd", x, w_bdi) + b_n[nodes]
        return np.sum(_log_sigmoid(z * signs) * (signs != 0), axis=-1)

    # --------------------------------------------------------------- convolution and pooling
    # NHWC activations, HWIO kernels; the numpy code is in reference/conv.py.
    def _conv_epilogue(self, y, b, activation, alpha):
        """y = f(y + b) over the last (channel) axis."""
        if b is not None:
            y += b
        return y if activation == "linear" else self.activation(y, activation, alpha)

    def conv2d(
        self,
        x_nhwc: Floats4d,
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Floats4d:
        """y = f(conv(x, w) + b); w (kh, kw, C_in / groups, C_out); pads ((top, bottom), (left, right))."""
        from . import conv as rc

        y = rc.conv2d(x_nhwc, w_hwio, strides, pads, dilation, groups)
        return self._conv_epilogue(y, b, activation, alpha)

    def conv_weights(self, w_hwio: Floats4d, groups: int = 1) -> Any:
        """What a model that reads the convolution weights ``w_hwio`` (kh, kw, C_in / groups,
        C_out) only through ``conv2d`` and its plans holds in their place, so that it keeps one
        copy of them: here ``w_hwio`` itself; the cpu backend gives the packed form alone for
        most convolutions (``np.asarray`` of it gives the values back, unpacked anew)."""
        return w_hwio

    def conv2d_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Callable[[Floats4d], Floats4d]:
        """A function ``x -> conv2d(x, w_hwio, b, ...)`` for inputs of shape ``x_shape``, the
        work that depends on the shape and the weights alone done once (backends with compiled
        kernels bind the kernel's arguments; the reference just calls ``conv2d``)."""
        return lambda x: self.conv2d(x, w_hwio, b, strides, pads, dilation, groups, activation, alpha)

    def conv2d_residual_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
        residual_activation: str = "linear",
        residual_alpha: float = 0.0,
    ) -> Callable[[Floats4d, Floats4d | None], Floats4d]:
        """``conv2d_plan`` with a residual Add and its activation taken in: a function ``(x, r)
        -> g(conv2d(x, w_hwio, b, ...) + r)``, g the activation ``residual_activation``, r NHWC
        of the result's shape (or one that broadcasts to it); ``r`` None gives the convolution
        alone. Here the convolution, then ``add_act``."""
        conv = self.conv2d_plan(x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha)

        def run(x: Floats4d, r: Floats4d | None = None) -> Floats4d:
            y = conv(x)
            return y if r is None else self.add_act(y, r, residual_activation, residual_alpha)

        return run

    def conv2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Callable[[Floats4d], Floats4d]:
        """``conv2d_plan`` for C-contiguous NCHW inputs of shape ``x_shape`` (N, C, H, W): a
        function ``x_nchw -> y_nhwc`` (N, Ho, Wo, C_out). Here the input is made NHWC
        (``channels_last``, or a reshape where it has one channel or one position) for
        ``conv2d_plan``; a backend with a kernel reading NCHW planes overrides it."""
        n, c, h, w = x_shape
        plan = self.conv2d_plan((n, h, w, c), w_hwio, b, strides, pads, dilation, groups, activation, alpha)
        if c == 1 or h * w == 1:  # the same memory
            return lambda x: plan(x.reshape(n, h, w, c))
        return lambda x: plan(self.channels_last(x))

    def conv2d_planes_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
        output: bool = False,
    ) -> Callable[[Floats4d], Floats4d] | None:
        """A convolution of C-contiguous NCHW inputs of shape ``x_shape`` (N, C, H, W) into NCHW
        planes: a function ``x_nchw -> y_nchw`` (N, C_out, Ho, Wo), where the backend has one
        that pays for these shapes (few output channels; with ``output``, the result being a
        graph's output and so wanted as NCHW planes, more); None where it would rather run
        ``conv2d_nchw_plan`` (NHWC out). The reference has none."""
        return None

    def conv1x1_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_oi: Floats2d,
        b: Floats1d | None,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Callable[[Floats4d], Floats4d] | None:
        """A 1x1 convolution (stride 1, no padding, one group) of C-contiguous NCHW inputs of
        shape ``x_shape`` (N, C, H, W), ``w_oi`` (C_out, C): a function ``x_nchw -> y_nchw``
        (N, C_out, H, W) that reads and writes planes, where the backend has one that pays;
        None where it would rather run ``conv2d_nchw_plan`` (NHWC out). The reference has
        none."""
        return None

    def depthwise_conv2d(
        self,
        x_nhwc: Floats4d,
        w_hwcm: Floats4d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Floats4d:
        """y[..., c M + m] = f(sum_{i, j} xpad[.., s oh + d i, s ow + d j, c] w[i, j, c, m] + b[c M + m])."""
        kh, kw, c, m = w_hwcm.shape
        return self.conv2d(x_nhwc, w_hwcm.reshape(kh, kw, 1, c * m), b, strides, pads, dilation, c, activation, alpha)

    def conv_transpose2d(
        self,
        x_nhwc: Floats4d,
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair,
        crop: Pair,
        out_hw: Pair,
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Floats4d:
        """Transposed convolution; w (kh, kw, C_in, C_out / groups); output cropped at ``crop`` to ``out_hw``."""
        from . import conv as rc

        y = rc.conv_transpose2d(x_nhwc, w_hwio, strides, crop, out_hw, dilation, groups)
        return self._conv_epilogue(y, b, activation, alpha)

    def conv_transpose2d_nchw(
        self,
        x_nchw: Floats4d,
        w_iohw: Floats4d,
        b: Floats1d | None,
        strides: Pair,
        crop: Pair,
        out_hw: Pair,
        dilation: Pair = (1, 1),
        groups: int = 1,
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Floats4d:
        """``conv_transpose2d`` on NCHW: x (N, C_in, H, W), ``w_iohw`` (C_in, C_out / groups,
        kh, kw) (ONNX's and torch's layout), y (N, C_out, Ho, Wo); this backend's
        ``conv_transpose2d`` between two transposes (a backend with an NCHW kernel overrides
        it)."""
        w_hwio = np.ascontiguousarray(np.asarray(w_iohw, np.float32).transpose(2, 3, 0, 1))
        y = self.conv_transpose2d(
            np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)),
            w_hwio,
            b,
            strides,
            crop,
            out_hw,
            dilation,
            groups,
            activation,
            alpha,
        )
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def pool2d(
        self,
        x_nhwc: Floats4d,
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = (1, 1),
        count_include_pad: bool = False,
    ) -> Floats4d:
        """Max or average pooling over windows (see ``reference.conv.pool2d``)."""
        from . import conv as rc

        return rc.pool2d(x_nhwc, kind, pool, strides, pads, out_hw, dilation, count_include_pad)

    def pool2d_nchw(
        self,
        x_nchw: Floats4d,
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = (1, 1),
        count_include_pad: bool = False,
    ) -> Floats4d:
        """``pool2d`` on an NCHW input, giving NCHW (N, C, Ho, Wo): this backend's ``pool2d``
        between two transposes (a backend with an NCHW kernel overrides it)."""
        y = self.pool2d(
            np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)),
            kind,
            pool,
            strides,
            pads,
            out_hw,
            dilation,
            count_include_pad,
        )
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def pool2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = (1, 1),
        count_include_pad: bool = False,
    ) -> Callable[[Floats4d], Floats4d]:
        """``pool2d_nchw`` for C-contiguous NCHW inputs of shape ``x_shape`` (N, C, H, W): a
        function ``x_nchw -> y_nchw`` with the window bound (a backend with an NCHW kernel checks
        it once here instead of at every call)."""
        return lambda x: self.pool2d_nchw(x, kind, pool, strides, pads, out_hw, dilation, count_include_pad)

    def depthwise_conv2d_nchw(
        self,
        x_nchw: Floats4d,
        w_ohw: Floats3d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Floats4d:
        """y[n, c M + m] = f(sum_{i, j} xpad[n, c, s oh + d i, s ow + d j] w[c M + m, i, j] +
        b[c M + m]) on NCHW: x (N, C, H, W), ``w_ohw`` (C M, kh, kw), y (N, C M, Ho, Wo); this
        backend's ``depthwise_conv2d`` between two transposes (a backend with an NCHW kernel
        overrides it)."""
        cm, kh, kw = w_ohw.shape
        c = x_nchw.shape[1]
        w_hwcm = np.ascontiguousarray(w_ohw.reshape(c, cm // c, kh, kw).transpose(2, 3, 0, 1))
        y = self.depthwise_conv2d(
            np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)), w_hwcm, b, strides, pads, dilation, activation, alpha
        )
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def depthwise_conv2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_ohw: Floats3d,
        b: Floats1d | None,
        strides: Pair = (1, 1),
        pads: Pads2d = ((0, 0), (0, 0)),
        dilation: Pair = (1, 1),
        activation: str = "linear",
        alpha: float = 0.0,
    ) -> Callable[[Floats4d], Floats4d]:
        """``depthwise_conv2d_nchw`` for C-contiguous NCHW inputs of shape ``x_shape`` (N, C, H,
        W): a function ``x_nchw -> y_nchw`` with the weights, bias and geometry bound (a backend
        with an NCHW kernel checks and converts them once here instead of at every call)."""
        return lambda x: self.depthwise_conv2d_nchw(x, w_ohw, b, strides, pads, dilation, activation, alpha)

    def adaptive_pool2d(self, x_nhwc: Floats4d, kind: str, out_hw: Pair) -> Floats4d:
        """Max or average over torch's adaptive bins."""
        from . import conv as rc

        return rc.adaptive_pool2d(x_nhwc, kind, out_hw)

    def global_pool(self, x: FloatsXd, kind: str, axes: tuple[int, ...], keepdims: bool = False) -> FloatsXd:
        """Max or mean over ``axes``."""
        fn = np.max if kind == "max" else wide_mean
        return fn(x, axis=axes, keepdims=keepdims).astype(np.float32, copy=False)

    def roi_pool(self, x_nhwc: Floats4d, rois: Floats2d, output_size: Pair, spatial_scale: float = 1.0) -> Floats4d:
        """torchvision's RoI max pooling; rois (K, 5) ``(batch, x1, y1, x2, y2)`` -> (K, ph, pw, C)."""
        from . import conv as rc

        return rc.roi_pool(x_nhwc, rois, output_size, spatial_scale)

    def resize2d_taps(self, x_nhwc: Floats4d, rows: Taps, cols: Taps, bilinear: bool) -> Floats4d:
        """x (N, H, W, C) resized at given source taps: ``rows`` = (y0, y1, fy) for the Ho output
        rows and ``cols`` = (x0, x1, fx) for the Wo output columns (int64 indices inside x,
        float32 weights of the second tap). Nearest: y[n, i, j] = x[n, y0[i], x0[j]]; bilinear:
        y = (1 - fy) ((1 - fx) x[y0, x0] + fx x[y0, x1]) + fy ((1 - fx) x[y1, x0] + fx x[y1, x1])
        in float32. y (N, Ho, Wo, C), C-contiguous."""
        (y0, y1, fy), (x0, x1, fx) = rows, cols
        if not bilinear:
            return np.ascontiguousarray(x_nhwc[:, y0][:, :, x0])
        one = np.float32(1)
        wx, wy = fx.reshape(1, 1, -1, 1), fy.reshape(1, -1, 1, 1)
        top, bottom = x_nhwc[:, y0], x_nhwc[:, y1]
        up = top[:, :, x0] * (one - wx) + top[:, :, x1] * wx
        down = bottom[:, :, x0] * (one - wx) + bottom[:, :, x1] * wx
        return np.ascontiguousarray(up * (one - wy) + down * wy, np.float32)

    def upsample2d(
        self,
        x_nhwc: Floats4d,
        out_hw: Pair,
        mode: str = "nearest",
        align_corners: bool = False,
        scales: Sequence[float | None] = (None, None),
    ) -> Floats4d:
        """Nearest or bilinear resize of H, W (torch's coordinate rules)."""
        from . import conv as rc

        return rc.upsample2d(x_nhwc, out_hw, mode, align_corners, scales)

    def local_response_norm(
        self, x: FloatsXd, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
    ) -> FloatsXd:
        """y = x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels (last axis))^beta."""
        from . import conv as rc

        return rc.local_response_norm(x, size, alpha, beta, k)

    # ------------------------------------------------------------------ attention
    def matmul(self, a: FloatsXd, b: FloatsXd, trans_b: bool = False) -> FloatsXd:
        """c = a b (a b^T with ``trans_b``) over the last two axes, leading axes batched."""
        return np.matmul(a, np.swapaxes(b, -1, -2) if trans_b else b)

    def tanh_scores(
        self, q_pqd: Floats3d, k_pkd: Floats3d, w_d: Floats1d | None, inner: float = 1.0, outer: float = 1.0
    ) -> Floats3d:
        """s[p, i, j] = outer sum_d w[d] tanh(inner (q[p, i, d] + k[p, j, d])) (w None: ones):
        additive (Bahdanau) and "concat" attention scores, (P, Tq, Tk)."""
        pre = q_pqd[:, :, None, :] + k_pkd[:, None, :, :]
        if inner != 1.0:
            pre = np.float32(inner) * pre
        t = np.tanh(pre)
        if w_d is not None:
            t = t * w_d
        s = t.sum(axis=-1, dtype=np.float32)
        return s if outer == 1.0 else (np.float32(outer) * s).astype(np.float32)

    def hard_attention(self, s_pqk: Floats3d, causal: bool = False) -> Floats3d:
        """w = one-hot of the first argmax over the last axis of scores (P, Tq, Tk) (keys after
        the query excluded if ``causal``; NaN wins, as np.argmax); a row whose every key
        scores -inf (all masked) gives zeros."""
        tq, tk = s_pqk.shape[-2:]
        if causal:
            s_pqk = np.where(np.tril(np.ones((tq, tk), bool)), s_pqk, np.float32(-np.inf))
        w = np.zeros(s_pqk.shape, np.float32)
        np.put_along_axis(w, np.argmax(s_pqk, axis=-1)[..., None], np.float32(1), axis=-1)
        live = np.any((s_pqk > -np.inf) | np.isnan(s_pqk), axis=-1)
        return w * live[..., None]

    def attention_softmax(
        self, scores_bhqk: Floats4d, scale: float, bias: FloatsXd | None, causal: bool = False, empty: int = 0
    ) -> Floats4d:
        """w = softmax(scale s + bias (+ -inf above the diagonal if causal)) over the last axis.

        ``scores_bhqk`` is (B, H, Tq, Tk) and may be overwritten (backends work in place);
        ``bias`` broadcasts to it (0 attend, -inf masked, or torch's float mask values). A row
        with every key masked becomes NaN, 0 or 1/Tk for ``empty`` = 0, 1, 2.
        """
        s = scores_bhqk * np.float32(scale)
        if bias is not None:
            s = s + bias
        tq, tk = s.shape[-2:]
        if causal:
            s = np.where(np.tril(np.ones((tq, tk), bool)), s, np.float32(-np.inf))
        with np.errstate(invalid="ignore"):
            m = np.max(s, axis=-1, keepdims=True)
            empty_rows = m == -np.inf
            e = np.exp(s - np.where(empty_rows, np.float32(0), m))
            w = e / np.sum(e, axis=-1, keepdims=True)
        if np.any(empty_rows):
            fill = (np.float32(np.nan), np.float32(0), np.float32(1.0 / tk))[empty]
            w = np.where(empty_rows, fill, w)
        return w.astype(np.float32, copy=False)

    def attention(
        self,
        q_bhqd: Floats4d,
        k_bhkd: Floats4d,
        v_bhkv: Floats4d,
        scale: float,
        bias: FloatsXd | None = None,
        causal: bool = False,
        empty: int = 0,
        need_weights: bool = True,
    ) -> tuple[Floats4d, Floats4d | None]:
        """out = softmax(scale q k^T + bias) v, heads batched; returns (out_bhqv, weights_bhqk),
        the weights None without ``need_weights`` (backends then need not keep them).

        Leading axes of q, k, v broadcast as in ``np.matmul`` (BLAS per (b, h) slice).
        """
        scores = np.matmul(q_bhqd, np.swapaxes(k_bhkd, -1, -2))
        w = self.attention_softmax(scores, scale, bias, causal, empty)
        return np.matmul(w, v_bhkv), (w if need_weights else None)

    def self_attention(
        self,
        x_nle: Floats3d,
        w_qkv_io: Floats2d,
        b_qkv: Floats1d | None,
        w_o_io: Floats2d,
        b_o: Floats1d | None,
        num_heads: int,
        bias: FloatsXd | None = None,
        empty: int = 0,
        need_weights: bool = True,
    ) -> tuple[Floats3d, Floats4d | None]:
        """Multi-head self-attention (torch's ``MultiheadAttention`` on x, x, x, batch first):
        concat_h softmax(q_h k_h^T / sqrt(E / H) + bias) v_h W_o + b_o with
        [q k v] = x W_qkv + b_qkv. ``bias`` and ``empty`` as in ``attention``. Returns
        (out (N, L, E), attention weights (N, H, L, L), or None unless ``need_weights``).
        """
        n, length, e = x_nle.shape
        hd = e // num_heads
        qkv = self.dense(x_nle.reshape(n * length, e), w_qkv_io, b_qkv)
        qkv = qkv.reshape(n, length, 3, num_heads, hd)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        o, s = self.attention(q, k, v, 1.0 / math.sqrt(hd), bias, False, empty, need_weights)
        o = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(n * length, e)
        return self.dense(o, w_o_io, b_o).reshape(n, length, e), s

    def encoder_layer(
        self,
        x_nle: Floats3d,
        w: EncoderWeights,
        num_heads: int,
        activation: str = "relu",
        norm_first: bool = False,
        bias: FloatsXd | None = None,
        empty: int = 0,
        need_weights: bool = True,
    ) -> tuple[Floats3d, Floats4d | None]:
        """One Transformer encoder layer (torch's ``TransformerEncoderLayer``, batch first).

        mha(z) = concat_h softmax(q_h k_h^T / sqrt(E / H) + bias) v_h W_o + b_o with
        [q k v] = z W_qkv + b_qkv; ff(z) = f(z W_1 + b_1) W_2 + b_2. Post-norm:
        y = LN1(x + mha(x)), out = LN2(y + ff(y)); ``norm_first``: y = x + mha(LN1(x)),
        out = y + ff(LN2(y)). ``bias`` and ``empty`` as in ``attention``. Returns
        (out (N, L, E), attention weights (N, H, L, L), or None unless ``need_weights``).
        """
        n, length, e = x_nle.shape

        def norm(z, ln):
            return self.layer_norm(z, *ln)

        def mha(z):
            return self.self_attention(z, w.w_qkv_io, w.b_qkv, w.w_o_io, w.b_o, num_heads, bias, empty)

        def ff(z):
            h = self.dense(z.reshape(n * length, e), w.w_1_io, w.b_1, activation)
            return self.dense(h, w.w_2_io, w.b_2).reshape(n, length, e)

        if norm_first:
            a, s = mha(norm(x_nle, w.norm1))
            y = x_nle + a
            out = y + ff(norm(y, w.norm2))
        else:
            a, s = mha(x_nle)
            y = norm(x_nle + a, w.norm1)
            out = norm(y + ff(y), w.norm2)
        return out, (s if need_weights else None)

    # ------------------------------------------------------------------------- recurrent
    def rnn_sequence(
        self, x_bti: ArrayXd, w_ih: Floats2d, w_hh: Floats2d, b: Floats1d | None, h0: Floats2d, **kw: Any
    ) -> tuple[FloatsXd, Floats2d]:
        """h_t = act(x_t w_ih + h_{t-1} w_hh + b) over time; returns (y, h) (``reference.recurrent``)."""
        from .recurrent import rnn_sequence

        return rnn_sequence(x_bti, w_ih, w_hh, b, h0, **kw)

    def lstm_sequence(
        self,
        x_bti: ArrayXd,
        w_ig: Floats2d,
        w_hg: Floats2d,
        b_g: Floats1d | None,
        h0: Floats2d,
        c0: Floats2d,
        **kw: Any,
    ) -> tuple[FloatsXd, Floats2d, Floats2d]:
        """LSTM over time, gate blocks i, f, g, o; returns (y, h, c) (``reference.recurrent``)."""
        from .recurrent import lstm_sequence

        return lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, **kw)

    def gru_sequence(
        self,
        x_bti: ArrayXd,
        w_ig: Floats2d,
        w_hg: Floats2d,
        b_ig: Floats1d | None,
        b_hg: FloatsXd | None,
        h0: Floats2d,
        **kw: Any,
    ) -> tuple[FloatsXd, Floats2d]:
        """GRU over time, gate blocks z, r, h; returns (y, h) (``reference.recurrent``)."""
        from .recurrent import gru_sequence

        return gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw)

    def run_sequence(self, cell: Cell, x_bti: ArrayXd, *args: Any, **kw: Any) -> tuple[FloatsXd, ...]:
        """``rnn_sequence``, ``lstm_sequence`` or ``gru_sequence`` on ``x_bti``, as ``cell``
        names it."""
        if cell == Cell.LSTM:
            return self.lstm_sequence(x_bti, *args, **kw)
        if cell == Cell.GRU:
            return self.gru_sequence(x_bti, *args, **kw)
        return self.rnn_sequence(x_bti, *args, **kw)

    def sequence_plan(
        self, cell: Cell, x_bti: ArrayXd, args: Sequence[Any], kw: dict[str, Any]
    ) -> Callable[..., tuple[FloatsXd, ...]]:
        """A function ``(x, states=None) -> self.run_sequence(cell, x, *args, **kw)`` for inputs
        laid out as ``x_bti``, the work that depends on the layout and the weights alone done
        once (backends with compiled loops bind the loop's arguments; the reference just calls).
        ``states``: the call's initial states ((h0,) or (h0, c0), the last arguments of
        ``args``) in place of those bound."""

        def method(x, *a, **k):
            return self.run_sequence(cell, x, *a, **k)

        def run(x, states=None):
            if states is None:
                return method(x, *args, **kw)
            return method(x, *args[: len(args) - len(states)], *states, **kw)

        return run

    def native_plan(self, arena_bytes: int) -> Any:
        """An empty native plan (``native.NativePlan``) over an arena of ``arena_bytes`` bytes,
        for ``onnx/lowering.py`` to bind kernels to; None on backends without one (the
        reference runs every model through its Python plan). Backends that return a plan
        also give ``plan_activation_code(name, rows)``, ``plan_conv2d(x_shape, w_hwio, b,
        strides, pads, dilation, groups, activation, alpha, residual)``,
        ``plan_conv1x1_nchw(x_shape, w_oi, b, activation, alpha)``, ``plan_dense(w_kn, b,
        rows, activation, alpha)``, ``plan_elementwise(program, operands)``, ``plan_sequence_loop(cell,
        x_bti, args, kw)`` and ``plan_sequence_loops(x_bti, calls)`` (``backends/cpu/steps.py``,
        ``programs.plan_step``, ``recurrent.sequence_loops``)."""
        return None

    def plan_threads(self) -> int | None:
        """The threads a call on this backend uses now, which a native plan's steps are bound
        for (part of its key); None on backends without native plans."""
        return None

    def plan_refused_input(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a native plan's run, is a step refusing the call's
        values (an index outside its axis, a non-finite value that a Winograd step holds no
        weights to sum directly, a loop reaching the iteration limit of a loop whose length the
        file sets) without writing the call's inputs: the call then goes to the Python plan,
        which raises the node's own error or computes the call. False on backends without
        native plans."""
        return False

    def plan_shapes_changed(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a native plan's run, says that the call's values give
        other shapes than the plan holds (a loop that ran another number of iterations than
        its stacked outputs hold): the call and the later ones with its key go to the Python
        plan. False on backends without native plans."""
        return False

    def sequences_plan(
        self, x_bti: ArrayXd, calls: Sequence[SequenceCall]
    ) -> Callable[..., list[tuple[FloatsXd, ...]]]:
        """A function ``(x, states=None) -> recurrent_sequences([(cell, (x, *args), kw) ...])``
        for the ``calls`` (cell, args after the input, kw) on inputs laid out as ``x_bti``
        (here each call bound by ``sequence_plan``, one after the other); ``states``: one tuple
        of initial states per call, as ``sequence_plan``'s."""
        runs = [self.sequence_plan(cell, x_bti, args, kw) for cell, args, kw in calls]
        return lambda x, states=None: [
            run(x, None if states is None else st) for run, st in zip(runs, states or [None] * len(runs))
        ]

    def recurrent_sequences(self, calls: Sequence[SequenceCall]) -> list[tuple[FloatsXd, ...]]:
        """Independent sequence calls (the directions of a bidirectional layer): ``calls`` a
        list of (cell, args, kwargs) of ``run_sequence``; their results in order (here one after
        the other)."""
        return [self.run_sequence(cell, *args, **kw) for cell, args, kw in calls]


def _log_sigmoid(z):
    """log sigmoid(z) = -softplus(-z), stable for large |z|."""
    return -(np.log1p(np.exp(-np.abs(z))) + np.maximum(-z, np.float32(0)))
