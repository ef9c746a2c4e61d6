"""CpuOps: ReferenceOps with the hot primitives replaced by the native core's kernels
(``fastlayers.native``: C compiled at install, one path per ISA, its own thread pool).

Kernels work on float32 rows with a contiguous last axis; the methods here reshape to rows,
allocate the output and call one kernel, which releases the GIL. Anything not overridden falls
back to the numpy reference.
"""

from __future__ import annotations

import math

import numpy as np

from ...native import CODES, _core, arena_enter, arena_exit, arena_leave, layout, trim_heap
from ..derived import derived_from
from ..integer import INTEGER_KERNELS
from ..types import EncoderWeights
from . import gemm, programs, recurrent, steps
from .conv import ConvOps

#: Fewest values a concatenation joins natively (below, numpy's copy is cheaper than the
#: checks that a native call needs).
_NATIVE_CONCAT_MIN = 1 << 14


def _native_concat_axis(xs, axis):
    """The axis (from 0) along which ``concat_rows`` joins ``xs``, or None where numpy does:
    fewer than _NATIVE_CONCAT_MIN values (numpy's copy is cheaper than these checks), one part or
    more than the kernel takes, parts that are not C-contiguous arrays of one dtype and rank,
    object arrays, and what numpy refuses (it raises the error)."""
    if not 1 < len(xs) <= _core.MAX_CONCAT_PARTS:
        return None
    total = 0
    for x in xs:  # (a loop: the small joins numpy takes pay these checks on every call)
        if type(x) is not np.ndarray:
            return None
        total += x.size
    first = xs[0]
    if total < _NATIVE_CONCAT_MIN or not first.ndim or first.dtype.hasobject:
        return None
    if any(x.dtype != first.dtype or x.ndim != first.ndim or not x.flags.c_contiguous for x in xs):
        return None
    k = axis + first.ndim if axis < 0 else axis
    if not 0 <= k < first.ndim or any(
        x.shape[:k] != first.shape[:k] or x.shape[k + 1 :] != first.shape[k + 1 :] for x in xs
    ):
        return None
    return k


def _rows_of(x: np.ndarray) -> np.ndarray:
    """x viewed as C-contiguous float32 (rows, last axis) without copying when possible."""
    if not (x.dtype == np.float32 and x.flags.c_contiguous):  # (the checks cost less than the call)
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 2:
        return x
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _dense_memory(x: np.ndarray):
    """(x's axes reordered by decreasing stride, C-contiguous float32; the axis order that
    undoes it) where x is a permuted view of dense memory (a transposed or channels-last
    array), else None."""
    if x.dtype != np.float32 or x.ndim < 2:
        return None
    order = sorted(range(x.ndim), key=lambda a: -x.strides[a])
    x_mem = x.transpose(order)
    return (x_mem, np.argsort(order)) if x_mem.flags.c_contiguous else None


def _vector(v):
    """An optional per-channel vector as contiguous float32 (None stays None)."""
    if v is None or (type(v) is np.ndarray and v.ndim == 1 and v.dtype == np.float32 and v.flags.c_contiguous):
        return v
    return np.ascontiguousarray(v, dtype=np.float32).reshape(-1)


def _scale_shift_planes(x, scale, shift, axis, out):
    """``batch_norm`` over a channel axis that is not the last (NCHW memory) on C-contiguous
    float32 ``x``: one native pass over its planes (the values after that axis), into ``out``
    where given; None where x or out is not in those terms."""
    if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous or x.size == 0:
        return None
    c = x.shape[axis]
    if np.size(scale) != c or np.size(shift) != c:
        return None
    if out is not None and not (
        type(out) is np.ndarray and out.shape == x.shape and out.dtype == np.float32 and out.flags.c_contiguous
    ):
        return None
    y = np.empty_like(x) if out is None else out
    return _core.scale_shift_planes(x, _vector(scale), _vector(shift), y, c, math.prod(x.shape[axis + 1 :]))


def _packed_products(weights, *arrays):
    """(the first ``weights`` arrays, product weights (in, out), packed for the sgemm; the
    others, biases and norm parameters, as float32 vectors or None)."""
    return (
        tuple(
            _core.pack(a.T, True) if a.T.flags.c_contiguous else _core.pack(np.ascontiguousarray(a))
            for a in arrays[:weights]
        ),
        tuple(None if a is None else np.ascontiguousarray(a, np.float32).reshape(-1) for a in arrays[weights:]),
    )


def _rows_in_place(a):
    """``a`` as float32 whose matrices the sgemm reads in place (unit last-axis stride, rows
    at least a row apart, every stride a non-negative whole number of floats); a C-ordered
    copy otherwise."""
    if (
        a.dtype == np.float32
        and a.ndim >= 2
        and a.strides[-1] == 4
        and a.strides[-2] >= 4 * a.shape[-1]
        and all(st % 4 == 0 and st >= 0 for st in a.strides)
    ):
        return a
    return np.ascontiguousarray(a, dtype=np.float32)


class CpuOps(ConvOps):
    """Compiled CPU backend: the methods below, the convolution and pooling family of
    ``conv.ConvOps`` (native/conv_*.c, pool.c), and ReferenceOps for what neither overrides."""

    name = "cpu"
    integer = INTEGER_KERNELS
    quiet_activations = frozenset(CODES)

    def enter_call(self):
        """Begin a model's call: numpy allocates its arrays from the native block arena
        (``fastlayers.native.arena_enter``), so large intermediates reuse mapped pages from one
        call to the next."""
        return arena_enter()

    def exit_call(self, token) -> None:
        arena_exit(token)

    def begin_build(self):
        """Begin building a native plan's step inside a call: numpy allocates from the C
        library's heap (``arena_leave``), so the build's transient index tables do not grow the
        block arena, which keeps its regions mapped; ``end_build`` restores the call's."""
        return arena_leave()

    def end_build(self, token) -> None:
        arena_exit(token)

    def trim_build(self) -> None:
        """Hand what a plan's build freed on the C library's heap back to the system."""
        trim_heap()

    def channels_last(self, x):
        return layout.channels_last(x)

    def channels_first(self, x):
        return layout.channels_first(x)

    def oihw_to_hwio(self, w):
        return layout.oihw_to_hwio(w)

    def activation(self, x, name, alpha=0.0):
        code = CODES.get(name)
        if code is None or x.size == 0:
            return super().activation(x, name, alpha)
        y = _core.apply_activation(x, code, alpha)
        if y is not None:
            return y
        dense = _dense_memory(x) if name not in ("softmax", "log_softmax") else None
        if dense is not None:  # elementwise on the memory as it lies: the result has x's strides
            x_mem, back = dense
            return _core.apply_activation(x_mem, code, alpha).transpose(back)
        xr = _rows_of(x)
        out = np.empty_like(xr)
        _core.bias_act(xr, None, code, alpha, out)
        return out.reshape(x.shape)

    def add_act(self, a, b, name, alpha=0.0):
        code = CODES.get(name)
        y = None if code is None or name in ("softmax", "log_softmax") else _core.add_act(a, b, code, alpha)
        return super().add_act(a, b, name, alpha) if y is None else y

    def outer_add_act(self, a_ic, b_jc, name, alpha=0.0):
        code = CODES.get(name)
        y = None if code is None or name in ("softmax", "log_softmax") else _core.outer_add_act(a_ic, b_jc, code, alpha)
        return super().outer_add_act(a_ic, b_jc, name, alpha) if y is None else y

    def dense(self, x, w_io, b_o, activation="linear", alpha=0.0):
        code = CODES.get(activation)
        if type(w_io) is gemm.PackedWeights:
            return self._dense_packed(x, w_io, b_o, activation, alpha)
        if code is not None:  # the common case in one native call (None: not in its terms)
            y = _core.dense(x, w_io, b_o, code, alpha, gemm.packed_weights)
            if y is not None:
                return y
        x = np.asarray(x)
        if (
            x.ndim < 1
            or x.dtype != np.float32
            or w_io.dtype != np.float32
            or w_io.ndim != 2
            or x.shape[-1] != w_io.shape[0]
            or x.size == 0
            or w_io.size == 0
        ):
            return super().dense(x, w_io, b_o, activation, alpha)
        x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        y = np.empty((x2.shape[0], w_io.shape[1]), np.float32)
        gemm.matmul(
            x2,
            w_io,
            y,
            None if b_o is None else np.ascontiguousarray(b_o, np.float32),
            CODES["linear"] if code is None else code,
            alpha,
            weights=True,
        )
        y = y.reshape(x.shape[:-1] + (w_io.shape[1],))
        return y if code is not None else self.activation(y, activation, alpha)

    def _dense_packed(self, x, w, b_o, activation, alpha):
        """``dense`` on weights held packed (``dense_weights``): the native product on them,
        or the reference on their unpacked values where x is not float32 of width k."""
        code = CODES.get(activation)
        k, n = w.shape
        run = CODES["linear"] if code is None else code
        y = _core.dense_held(x, w.packed, k, n, b_o, run, alpha)
        if y is None:
            x = np.asarray(x)
            if x.ndim < 1 or x.dtype != np.float32 or x.shape[-1] != k or x.size == 0:
                return super().dense(x, np.asarray(w), b_o, activation, alpha)
            bias = None if b_o is None else np.ascontiguousarray(b_o, np.float32).reshape(n)
            y = _core.dense_held(np.ascontiguousarray(x), w.packed, k, n, bias, run, alpha)
        return y if code is not None else self.activation(y, activation, alpha)

    def dense_weights(self, w_io):
        return gemm.hold(w_io)

    def elementwise_plan(self, program):
        return programs.native_plan(self, program, super().elementwise_plan(program))

    def dense_chain_plan(self, layers):
        layers = tuple(layers)
        general = super().dense_chain_plan(layers)
        try:  # the layers in the native chain's terms (else ValueError), each activation native
            codes = [CODES[activation] for _, _, activation, _ in layers]
            chain = _core.DenseChain(
                [(w, b, code, alpha) for (w, b, _, alpha), code in zip(layers, codes)], gemm.packed_weights
            )
        except (KeyError, ValueError):
            return general

        def run(x):
            y = chain(x)  # None: x not in its terms (another type, a strided view)
            return general(x) if y is None else y

        return run

    def matmul(self, a, b, trans_b=False):
        y = gemm.batched_matmul(a, b, trans_b)
        return super().matmul(a, b, trans_b) if y is None else y

    def concatenate(self, xs, axis=-1):
        xs = list(xs)
        k = _native_concat_axis(xs, axis)
        if k is None:
            return super().concatenate(xs, axis)
        first = xs[0]
        shape = list(first.shape)
        shape[k] = sum(x.shape[k] for x in xs)
        out = np.empty(shape, first.dtype)
        rows = math.prod(shape[:k])
        if out.size:
            _core.concat_rows([x.reshape(rows, -1) for x in xs], out.reshape(rows, -1))
        return out

    def merge(self, a, b, op, alpha=1.0, beta=1.0):
        if op == "add" and alpha == 1.0 and beta == 1.0:  # same shapes or a bias row: one pass
            y = _core.apply_add(a, b)
            if y is not None:
                return y
        return super().merge(a, b, op, alpha, beta)

    def _over_axis(self, name, x, axis, fallback):
        """A row activation over ``axis``: moved last, run as rows, moved back."""
        if x.size == 0 or x.ndim == 0 or isinstance(axis, tuple):
            return fallback(x, axis)
        moved = axis not in (-1, x.ndim - 1)
        xm = np.moveaxis(x, axis, -1) if moved else x
        out = self.activation(xm, name)
        return np.moveaxis(out, -1, axis) if moved else out

    def softmax(self, x, axis=-1):
        return self._over_axis("softmax", x, axis, super().softmax)

    def log_softmax(self, x, axis=-1):
        return self._over_axis("log_softmax", x, axis, super().log_softmax)

    def layer_norm(self, x, gamma, beta, epsilon, axes=(-1,), rms=False):
        # the native kernel normalizes rows: the trailing axes (C-contiguous when several:
        # InstanceNormalization, LayerNormalization with axis < -1), gamma and beta read as
        # rows of their width
        if len(axes) == 1 and (axes[0] == -1 or axes[0] == x.ndim - 1):  # one native call, or None
            y = _core.apply_layer_norm(x, gamma, beta, epsilon, rms)
            if y is not None:
                return y
        k = len(axes)
        width = math.prod(x.shape[x.ndim - k :])
        if (
            x.size == 0
            or x.ndim == 0
            or sorted(a % x.ndim for a in axes) != list(range(x.ndim - k, x.ndim))
            or (k > 1 and not x.flags.c_contiguous)
            or any(v is not None and v.size != width for v in (gamma, beta))
        ):
            return super().layer_norm(x, gamma, beta, epsilon, axes, rms)
        if k > 1:
            y = self.layer_norm(
                x.reshape(x.shape[: x.ndim - k] + (-1,)),
                None if gamma is None else gamma.reshape(-1),
                None if beta is None else beta.reshape(-1),
                epsilon,
                (-1,),
                rms,
            )
            return y.reshape(x.shape)
        xr = _rows_of(x)
        out = np.empty_like(xr)
        _core.layer_norm(xr, _vector(gamma), _vector(beta), epsilon, rms, out)
        return out if x.ndim == 2 else out.reshape(x.shape)

    def batch_norm(self, x, scale, shift, axis=-1, out=None):
        if out is None and (axis == -1 or axis == x.ndim - 1):  # the common case in one native call, else None
            y = _core.apply_scale_shift(x, scale, shift)
            if y is not None:
                return y
        if x.ndim >= 2 and axis % x.ndim != x.ndim - 1:  # channels before other axes (NCHW)
            a = axis % x.ndim
            perm = [*range(a), *range(a + 1, x.ndim), a]
            if type(x) is np.ndarray and out is None and x.transpose(perm).flags.c_contiguous:
                # NHWC memory behind an NCHW view: the rows' kernel on that memory, viewed back
                y = self.batch_norm(x.transpose(perm), scale, shift, -1)
                return y.transpose(np.argsort(perm))
            y = _scale_shift_planes(x, scale, shift, a, out)
            if y is not None:
                return y
        if (
            axis % x.ndim != x.ndim - 1
            or x.size == 0
            or np.size(scale) != x.shape[-1]
            or np.size(shift) != x.shape[-1]
            or x.dtype != np.float32
            or not (out is None or (out.shape == x.shape and out.dtype == np.float32 and out.flags.c_contiguous))
        ):  # (the native kernel reads rows of that width)
            return super().batch_norm(x, scale, shift, axis, out)
        xr = _rows_of(x)
        rows = np.empty_like(xr) if out is None else out.reshape(xr.shape)
        _core.scale_shift(xr, _vector(scale), _vector(shift), rows)
        return out if out is not None else rows if x.ndim == 2 else rows.reshape(x.shape)

    # ------------------------------------------------------------------ attention
    def attention_softmax(self, scores_bhqk, scale, bias, causal=False, empty=0):
        """As ReferenceOps.attention_softmax, in place on C-contiguous float32 scores (the
        native kernel, threaded over rows)."""
        s = scores_bhqk
        if s.ndim != 4 or s.dtype != np.float32 or not s.flags.c_contiguous:
            s = np.ascontiguousarray(s, dtype=np.float32)
        if s.ndim != 4 or s.size == 0 or (bias is not None and np.ndim(bias) > 4):
            return super().attention_softmax(s, scale, bias, causal, empty)
        return _core.attention_softmax(s, scale, self._attention_bias(bias, s.shape[3]), causal, empty)

    def attention(self, q_bhqd, k_bhkd, v_bhkv, scale, bias=None, causal=False, empty=0, need_weights=True):
        """As ReferenceOps.attention, one native call: the (batch, head) pairs shared among the
        threads, both products of a pair on the packed sgemm. q, k and v may be strided views
        (heads split off a projection's columns): their rows are read in place. The output is
        a (B, H, Tq, Dv) view of a (B, Tq, H, Dv) array, so merging the heads back is free.
        Without ``need_weights`` each thread keeps one block of scores and no (B, H, Tq, Tk)
        array is made."""
        q, k, v = (_rows_in_place(a) for a in (q_bhqd, k_bhkd, v_bhkv))
        if (
            q.ndim != 4
            or k.ndim != 4
            or v.ndim != 4
            or (bias is not None and np.ndim(bias) > 4)
            or not q.shape[:2] == k.shape[:2] == v.shape[:2]
            or k.shape[2] != v.shape[2]
            or q.shape[3] != k.shape[3]
            or 0 in q.shape
            or 0 in k.shape
            or 0 in v.shape
        ):
            return super().attention(q_bhqd, k_bhkd, v_bhkv, scale, bias, causal, empty, need_weights)
        nb, nh, tq, _ = q.shape
        tk, dv = k.shape[2], v.shape[3]
        s = np.empty((nb, nh, tq, tk), np.float32) if need_weights else None
        out = np.empty((nb, tq, nh, dv), np.float32).transpose(0, 2, 1, 3)
        _core.attention(q, k, v, scale, self._attention_bias(bias, tk), causal, empty, s, out)
        return out, s

    def self_attention(self, x_nle, w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias=None, empty=0, need_weights=True):
        """As ReferenceOps.self_attention, in one native call (``encoder_layer``'s kernel
        without the feed-forward half): the q/k/v projection by rows, attention by
        (batch, head) pairs and the output projection by rows, each shared among the threads,
        the two products on weights packed once per weight array; q, k and v are read as
        strided heads of the projection, no head is copied out."""
        n, length, e = x_nle.shape
        if (
            n * length == 0
            or e % num_heads
            or (bias is not None and np.ndim(bias) > 4)
            or any(a.dtype != np.float32 for a in (x_nle, w_qkv_io, w_o_io))
            or w_qkv_io.shape != (e, 3 * e)
            or w_o_io.shape != (e, e)
        ):
            return super().self_attention(x_nle, w_qkv_io, b_qkv, w_o_io, b_o, num_heads, bias, empty, need_weights)
        packed, vectors = derived_from(
            (w_qkv_io, w_o_io, b_qkv, b_o), "self-attention", lambda *a: _packed_products(2, *a)
        )
        s = np.empty((n, num_heads, length, length), np.float32) if need_weights else None
        out = np.empty((n * length, e), np.float32)
        _core.encoder_layer(
            np.ascontiguousarray(x_nle).reshape(n * length, e),
            n,
            num_heads,
            0,
            packed,
            vectors,
            0.0,
            0.0,
            CODES["linear"],
            False,
            self._attention_bias(bias, length),
            empty,
            s,
            out,
        )
        return out.reshape(n, length, e), s

    def encoder_layer(
        self,
        x_nle,
        w: EncoderWeights,
        num_heads,
        activation="relu",
        norm_first=False,
        bias=None,
        empty=0,
        need_weights=True,
    ):
        """As ReferenceOps.encoder_layer, in one native call: the q/k/v projection, attention
        and the rows after it (output projection, residual, norms, feed-forward) each shared
        among the threads, the products on weights packed once per weight array."""
        code = CODES.get(activation)
        n, length, e = x_nle.shape
        f = w.w_1_io.shape[-1]
        if (
            code is None
            or n * length == 0
            or e % num_heads
            or (bias is not None and np.ndim(bias) > 4)
            or any(a.dtype != np.float32 for a in (x_nle, w.w_qkv_io, w.w_o_io, w.w_1_io, w.w_2_io))
            or w.w_qkv_io.shape != (e, 3 * e)
            or w.w_o_io.shape != (e, e)
            or w.w_1_io.shape != (e, f)
            or w.w_2_io.shape != (f, e)
        ):
            return super().encoder_layer(x_nle, w, num_heads, activation, norm_first, bias, empty, need_weights)

        packed, vectors = derived_from(
            (w.w_qkv_io, w.w_o_io, w.w_1_io, w.w_2_io, w.b_qkv, w.b_o, w.b_1, w.b_2, *w.norm1[:2], *w.norm2[:2]),
            "encoder-layer",
            lambda *a: _packed_products(4, *a),
        )
        s = np.empty((n, num_heads, length, length), np.float32) if need_weights else None
        out = np.empty((n * length, e), np.float32)
        _core.encoder_layer(
            np.ascontiguousarray(x_nle).reshape(n * length, e),
            n,
            num_heads,
            f,
            packed,
            vectors,
            w.norm1[2],
            w.norm2[2],
            code,
            norm_first,
            self._attention_bias(bias, length),
            empty,
            s,
            out,
        )
        return out.reshape(n, length, e), s

    @staticmethod
    def _attention_bias(bias, tk):
        """bias (at most 4-D) as the native kernels' (B or 1, H or 1, Tq or 1, Tk) float32 array
        with contiguous keys; None for None."""
        if bias is None:
            return None
        b = np.asarray(bias, dtype=np.float32)
        b = b.reshape((1,) * (4 - b.ndim) + b.shape)
        if b.shape[3] != tk:
            b = np.broadcast_to(b, b.shape[:3] + (tk,))
        return b if b.strides[3] == 4 or tk == 1 else np.ascontiguousarray(b)

    # ------------------------------------------------------------------------- recurrent
    def rnn_sequence(self, x_bti, w_ih, w_hh, b, h0, **kw):
        out = recurrent.rnn_sequence(x_bti, w_ih, w_hh, b, h0, **kw)
        return super().rnn_sequence(x_bti, w_ih, w_hh, b, h0, **kw) if out is None else out

    def lstm_sequence(self, x_bti, w_ig, w_hg, b_g, h0, c0, **kw):
        out = recurrent.lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, **kw)
        return super().lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, **kw) if out is None else out

    def gru_sequence(self, x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw):
        out = recurrent.gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw)
        return super().gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw) if out is None else out

    def sequence_plan(self, cell, x_bti, args, kw):
        run = recurrent.sequence_plan(cell, x_bti, args, kw)
        return super().sequence_plan(cell, x_bti, args, kw) if run is None else run

    def native_plan(self, arena_bytes):
        return steps.native_plan(arena_bytes)

    def plan_threads(self):
        return _core.get_num_threads()

    def plan_refused_input(self, error):
        return isinstance(error, _core.PlanStepFailed) and error.status in (
            _core.BAD_INDEX,
            _core.NOT_FINITE,
            _core.LOOP_LIMIT,
        )

    def plan_shapes_changed(self, error):
        return isinstance(error, _core.PlanStepFailed) and error.status == _core.OTHER_SHAPES

    def plan_activation_code(self, name, rows=False):
        return steps.activation_code(name, rows)

    def plan_conv2d(self, x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, residual, planes):
        return steps.conv2d_step(
            x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, residual, planes
        )

    def plan_conv1x1_nchw(self, x_shape, w_oi, b, activation, alpha):
        return steps.conv1x1_nchw_step(x_shape, w_oi, b, activation, alpha)

    def plan_conv2d_planes(self, x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, output=False):
        return steps.conv2d_planes_step(x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, output)

    def plan_conv_transpose(self, w_iohw, w_hwio, b, groups, activation, alpha, planes):
        return steps.conv_transpose_step(w_iohw, w_hwio, b, groups, activation, alpha, planes)

    def plan_dense(self, w_kn, b, rows, activation, alpha):
        return steps.dense_step(w_kn, b, rows, activation, alpha)

    def plan_elementwise(self, program, operands, data=()):
        return programs.plan_step(self, program, operands, data)

    def plan_sequence_loop(self, cell, x_bti, args, kw):
        return steps.sequence_loop(cell, x_bti, args, kw)

    def plan_sequence_loops(self, x_bti, calls):
        return recurrent.sequence_loops(x_bti, calls)

    def sequences_plan(self, x_bti, calls):
        run = recurrent.sequences_plan(x_bti, calls)
        return super().sequences_plan(x_bti, calls) if run is None else run

    def recurrent_sequences(self, calls):
        out = recurrent.sequences(calls)
        return super().recurrent_sequences(calls) if out is None else out
