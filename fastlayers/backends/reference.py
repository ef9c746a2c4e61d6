"""ReferenceOps: every primitive in plain numpy; the readable oracle and the fallback of all backends.

Primitives take float32 arrays and return new float32 arrays. They assume their arguments were
validated by the calling layer (shapes, dtypes) and neither check nor coerce beyond that.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import ShapeError, UnsupportedError
from .accumulate import wide_mean

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805

#: Activation names every backend understands, with the parameter ``alpha`` where one applies.
ACTIVATIONS = (
    "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "gelu_tanh", "sigmoid",
    "hard_sigmoid", "tanh", "softmax", "log_softmax", "softplus", "softsign", "silu",
    "exponential", "celu", "glu", "hard_silu", "hard_tanh", "hard_shrink", "soft_shrink",
    "tanh_shrink", "log_sigmoid", "mish", "sparse_plus", "sparse_sigmoid", "squareplus",
    "sparsemax",
)
#: ``alpha`` of the parametrized activations when given by name (Keras 3's function defaults:
#: the slope, the ELU/CELU scale, the shrink threshold, squareplus's ``b``).
DEFAULT_ALPHA = {"leaky_relu": 0.2, "elu": 1.0, "celu": 1.0, "hard_shrink": 0.5,
                 "soft_shrink": 0.5, "squareplus": 4.0}


def erfc64(x: np.ndarray) -> np.ndarray:
    """erfc(x) in float64, Chebyshev fit with relative error < 1.2e-7 everywhere (Numerical Recipes)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(-z * z + poly)
    return np.where(x >= 0, r, 2.0 - r)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


def _activation(x, name, alpha):
    if name == "linear":
        return x.copy()
    if name == "relu":
        return np.maximum(x, np.float32(0))
    if name == "relu6":
        return np.minimum(np.maximum(x, np.float32(0)), np.float32(6))
    if name == "leaky_relu":
        return np.where(x >= 0, x, np.float32(alpha) * x)
    if name in ("elu", "selu"):
        a, s = (alpha, 1.0) if name == "elu" else (SELU_ALPHA, SELU_SCALE)
        neg = np.float32(a) * np.expm1(np.minimum(x, np.float32(0)))
        return np.float32(s) * np.where(x > 0, x, neg)
    if name == "gelu":
        x64 = x.astype(np.float64)
        return (0.5 * x64 * erfc64(-x64 / np.sqrt(2.0))).astype(np.float32)
    if name == "gelu_tanh":
        x64 = x.astype(np.float64)
        inner = np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)
        return (0.5 * x64 * (1.0 + np.tanh(inner))).astype(np.float32)
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "hard_sigmoid":
        return np.minimum(np.maximum(x + np.float32(3), np.float32(0)), np.float32(6)) / np.float32(6)
    if name == "tanh":
        return np.tanh(x)
    if name == "softplus":
        return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, np.float32(0))
    if name == "softsign":
        return x / (np.float32(1) + np.abs(x))
    if name == "silu":
        return x * _sigmoid(x)
    if name == "exponential":
        return np.exp(x)
    if name == "softmax":
        return _softmax(x, -1)
    if name == "log_softmax":
        return _log_softmax(x, -1)
    return _activation_keras3(x, name, alpha)


def _activation_keras3(x, name, alpha):
    """The activations Keras 3 added (``keras.activations``), on the reference path only."""
    zero, one = np.float32(0), np.float32(1)
    if name == "celu":   # max(x, 0) + min(alpha (exp(x / alpha) - 1), 0)
        a = np.float32(alpha)
        return np.maximum(x, zero) + np.minimum(a * np.expm1(np.minimum(x, zero) / a), zero)
    if name == "glu":    # a * sigmoid(b), [a, b] the two halves of the last axis
        if x.ndim == 0 or x.shape[-1] % 2:
            raise ShapeError(f"activation 'glu' splits the last axis in two halves; it needs an "
                             f"even size, found shape {x.shape}")
        a, b = np.split(x, 2, axis=-1)
        return a * _sigmoid(b)
    if name == "hard_silu":   # x relu6(x + 3) / 6
        return x * (np.minimum(np.maximum(x + np.float32(3), zero), np.float32(6)) / np.float32(6))
    if name == "hard_tanh":   # clip(x, -1, 1)
        return np.clip(x, -one, one)
    if name == "hard_shrink":   # x where |x| > alpha, else 0
        return np.where(np.abs(x) > np.float32(alpha), x, zero)
    if name == "soft_shrink":   # sign(x) max(|x| - alpha, 0)
        a = np.float32(alpha)
        return np.where(x > a, x - a, np.where(x < -a, x + a, zero))
    if name == "tanh_shrink":   # x - tanh(x)
        return x - np.tanh(x)
    if name == "log_sigmoid":   # -softplus(-x)
        return np.minimum(x, zero) - np.log1p(np.exp(-np.abs(x)))
    if name == "mish":   # x tanh(softplus(x))
        return x * np.tanh(np.log1p(np.exp(-np.abs(x))) + np.maximum(x, zero))
    if name == "sparse_plus":   # 0 for x <= -1, (x + 1)^2 / 4 for -1 < x < 1, x for x >= 1
        return np.where(x <= -one, zero, np.where(x < one, np.float32(0.25) * (x + one) ** 2, x))
    if name == "sparse_sigmoid":   # clip((x + 1) / 2, 0, 1)
        return np.clip(np.float32(0.5) * (x + one), zero, one)
    if name == "squareplus":   # (x + sqrt(x^2 + b)) / 2, in float64 (no cancellation for x << 0)
        x64 = x.astype(np.float64)
        return (0.5 * (x64 + np.sqrt(x64 * x64 + alpha))).astype(np.float32)
    if name == "sparsemax":
        return _sparsemax(x, -1)
    raise UnsupportedError(f"activation {name!r} is not supported; expected one of {ACTIVATIONS}")


def _softmax(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _sparsemax(x, axis):
    """Euclidean projection onto the simplex along ``axis``: max(x - tau, 0), tau the threshold
    making the outputs sum to 1 (Martins & Astudillo, 2016)."""
    xm = np.moveaxis(x, axis, -1)
    z = -np.sort(-xm, axis=-1)
    cumsum = np.cumsum(z, axis=-1, dtype=np.float64)
    k = np.arange(1, z.shape[-1] + 1, dtype=np.float64)
    support = z > (cumsum - 1) / k
    size = np.maximum(np.sum(support, axis=-1, keepdims=True), 1)
    tau = (np.take_along_axis(cumsum, size - 1, axis=-1) - 1) / size
    return np.moveaxis(np.maximum(xm - tau, 0).astype(np.float32), -1, axis)


def _log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def fold_batch_norm(mean, var, gamma, beta, epsilon):
    """Inference batch norm as one affine map: scale = gamma / sqrt(var + eps), shift = beta - mean scale."""
    scale = np.float32(1) / np.sqrt(var + np.float32(epsilon))
    if gamma is not None:
        scale = scale * gamma
    shift = -mean * scale
    if beta is not None:
        shift = shift + beta
    return scale.astype(np.float32), shift.astype(np.float32)


class EncoderWeights(NamedTuple):
    """The weights of one Transformer encoder layer (``ReferenceOps.encoder_layer``): products
    as (in, out) arrays, biases (out,) or None, norms as (gamma or None, beta or None, eps)."""

    w_qkv_io: np.ndarray        # (E, 3E): q, k, v projections side by side, heads within each
    b_qkv: np.ndarray | None
    w_o_io: np.ndarray          # (E, E)
    b_o: np.ndarray | None
    w_1_io: np.ndarray          # (E, F)
    b_1: np.ndarray | None
    w_2_io: np.ndarray          # (F, E)
    b_2: np.ndarray | None
    norm1: tuple
    norm2: tuple


class ReferenceOps:
    """Numpy implementation of every primitive; subclasses override the hot ones."""

    name = "reference"

    def activation(self, x: np.ndarray, name: str, alpha: float = 0.0) -> np.ndarray:
        """y = f(x) elementwise (softmax and log_softmax over the last axis)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return _activation(x, name, alpha)

    def dense(self, x: np.ndarray, w_io: np.ndarray, b_o: np.ndarray | None,
              activation: str = "linear", alpha: float = 0.0) -> np.ndarray:
        """y[..., o] = f(sum_i x[..., i] w[i, o] + b[o])."""
        y = np.matmul(x, w_io)
        if b_o is not None:
            y += b_o
        return y if activation == "linear" else self.activation(y, activation, alpha)

    def softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """y = exp(x - max x) / sum exp(x - max x) along ``axis``."""
        with np.errstate(invalid="ignore"):
            return _softmax(x, axis)

    def log_softmax(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        """y = x - max x - log sum exp(x - max x) along ``axis``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return _log_softmax(x, axis)

    def batch_norm(self, x: np.ndarray, scale: np.ndarray, shift: np.ndarray,
                   axis: int = -1) -> np.ndarray:
        """y = x scale + shift, indexed along ``axis`` (see ``fold_batch_norm``)."""
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        return x * scale.reshape(shape) + shift.reshape(shape)

    def layer_norm(self, x: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                   epsilon: float, axes: tuple[int, ...] = (-1,), rms: bool = False) -> np.ndarray:
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

    def embedding(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        """y[..., :] = table[ids[...], :]."""
        return table[ids]

    def hsoftmax_log_probs(self, x: np.ndarray, w_in: np.ndarray, b_n: np.ndarray,
                           path_nodes: np.ndarray, path_signs: np.ndarray) -> np.ndarray:
        """log p[b, c] = sum_d log sigmoid(sign[c, d] (x[b] . w[:, node[c, d]] + b[node[c, d]])).

        ``path_nodes``/``path_signs`` are (C, depth); padded steps have sign 0 and contribute 0.
        """
        z = x @ w_in + b_n                                   # (B, N)
        zs = z[:, path_nodes] * path_signs                   # (B, C, depth)
        return np.sum(_log_sigmoid(zs) * (path_signs != 0), axis=-1)

    def hsoftmax_class_log_probs(self, x: np.ndarray, w_in: np.ndarray, b_n: np.ndarray,
                                 path_nodes: np.ndarray, path_signs: np.ndarray,
                                 classes: np.ndarray) -> np.ndarray:
        """log p[b] = sum_d log sigmoid(sign[y_b, d] (x[b] . w[:, node[y_b, d]] + b[node[y_b, d]]))."""
        nodes = path_nodes[classes]                          # (B, depth)
        signs = path_signs[classes]
        w_bdi = np.moveaxis(w_in[:, nodes], 0, -1)           # (B, depth, I)
        z = np.einsum("bi,bdi->bd", x, w_bdi) + b_n[nodes]
        return np.sum(_log_sigmoid(z * signs) * (signs != 0), axis=-1)

    # --------------------------------------------------------------- convolution and pooling
    # NHWC activations, HWIO kernels; the numpy code is in reference_conv.py.
    def _conv_epilogue(self, y, b, activation, alpha):
        """y = f(y + b) over the last (channel) axis."""
        if b is not None:
            y += b
        return y if activation == "linear" else self.activation(y, activation, alpha)

    def conv2d(self, x_nhwc, w_hwio, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1),
               groups=1, activation="linear", alpha=0.0):
        """y = f(conv(x, w) + b); w (kh, kw, C_in / groups, C_out); pads ((top, bottom), (left, right))."""
        from . import reference_conv as rc
        y = rc.conv2d(x_nhwc, w_hwio, strides, pads, dilation, groups)
        return self._conv_epilogue(y, b, activation, alpha)

    def depthwise_conv2d(self, x_nhwc, w_hwcm, b, strides=(1, 1), pads=((0, 0), (0, 0)),
                         dilation=(1, 1), activation="linear", alpha=0.0):
        """y[..., c M + m] = f(sum_{i, j} xpad[.., s oh + d i, s ow + d j, c] w[i, j, c, m] + b[c M + m])."""
        kh, kw, c, m = w_hwcm.shape
        return self.conv2d(x_nhwc, w_hwcm.reshape(kh, kw, 1, c * m), b, strides, pads, dilation,
                           c, activation, alpha)

    def conv_transpose2d(self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation=(1, 1),
                         groups=1, activation="linear", alpha=0.0):
        """Transposed convolution; w (kh, kw, C_in, C_out / groups); output cropped at ``crop`` to ``out_hw``."""
        from . import reference_conv as rc
        y = rc.conv_transpose2d(x_nhwc, w_hwio, strides, crop, out_hw, dilation, groups)
        return self._conv_epilogue(y, b, activation, alpha)

    def pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1),
               count_include_pad=False):
        """Max or average pooling over windows (see ``reference_conv.pool2d``)."""
        from . import reference_conv as rc
        return rc.pool2d(x_nhwc, kind, pool, strides, pads, out_hw, dilation, count_include_pad)

    def pool2d_nchw(self, x_nchw, kind, pool, strides, pads, out_hw, dilation=(1, 1),
                    count_include_pad=False):
        """``pool2d`` on an NCHW input, giving NCHW (N, C, Ho, Wo): this backend's ``pool2d``
        between two transposes (a backend with an NCHW kernel overrides it)."""
        y = self.pool2d(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)), kind, pool, strides,
                        pads, out_hw, dilation, count_include_pad)
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def depthwise_conv2d_nchw(self, x_nchw, w_ohw, b, strides=(1, 1), pads=((0, 0), (0, 0)),
                              dilation=(1, 1), activation="linear", alpha=0.0):
        """y[n, c M + m] = f(sum_{i, j} xpad[n, c, s oh + d i, s ow + d j] w[c M + m, i, j] +
        b[c M + m]) on NCHW: x (N, C, H, W), ``w_ohw`` (C M, kh, kw), y (N, C M, Ho, Wo); this
        backend's ``depthwise_conv2d`` between two transposes (a backend with an NCHW kernel
        overrides it)."""
        cm, kh, kw = w_ohw.shape
        c = x_nchw.shape[1]
        w_hwcm = np.ascontiguousarray(w_ohw.reshape(c, cm // c, kh, kw).transpose(2, 3, 0, 1))
        y = self.depthwise_conv2d(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)), w_hwcm, b,
                                  strides, pads, dilation, activation, alpha)
        return np.ascontiguousarray(y.transpose(0, 3, 1, 2))

    def adaptive_pool2d(self, x_nhwc, kind, out_hw):
        """Max or average over torch's adaptive bins."""
        from . import reference_conv as rc
        return rc.adaptive_pool2d(x_nhwc, kind, out_hw)

    def global_pool(self, x, kind, axes, keepdims=False):
        """Max or mean over ``axes``."""
        fn = np.max if kind == "max" else wide_mean
        return fn(x, axis=axes, keepdims=keepdims).astype(np.float32, copy=False)

    def roi_pool(self, x_nhwc, rois, output_size, spatial_scale=1.0):
        """torchvision's RoI max pooling; rois (K, 5) ``(batch, x1, y1, x2, y2)`` -> (K, ph, pw, C)."""
        from . import reference_conv as rc
        return rc.roi_pool(x_nhwc, rois, output_size, spatial_scale)

    def upsample2d(self, x_nhwc, out_hw, mode="nearest", align_corners=False, scales=(None, None)):
        """Nearest or bilinear resize of H, W (torch's coordinate rules)."""
        from . import reference_conv as rc
        return rc.upsample2d(x_nhwc, out_hw, mode, align_corners, scales)

    def local_response_norm(self, x, size, alpha=1e-4, beta=0.75, k=1.0):
        """y = x / (k + alpha / size * sum of x^2 over ``size`` neighbouring channels (last axis))^beta."""
        from . import reference_conv as rc
        return rc.local_response_norm(x, size, alpha, beta, k)

    # ------------------------------------------------------------------ attention (issue 5)
    def attention_softmax(self, scores_bhqk: np.ndarray, scale: float, bias: np.ndarray | None,
                          causal: bool = False, empty: int = 0) -> np.ndarray:
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

    def attention(self, q_bhqd: np.ndarray, k_bhkd: np.ndarray, v_bhkv: np.ndarray, scale: float,
                  bias: np.ndarray | None = None, causal: bool = False, empty: int = 0,
                  need_weights: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """out = softmax(scale q k^T + bias) v, heads batched; returns (out_bhqv, weights_bhqk),
        the weights None without ``need_weights`` (backends then need not keep them).

        Leading axes of q, k, v broadcast as in ``np.matmul`` (BLAS per (b, h) slice).
        """
        scores = np.matmul(q_bhqd, np.swapaxes(k_bhkd, -1, -2))
        w = self.attention_softmax(scores, scale, bias, causal, empty)
        return np.matmul(w, v_bhkv), (w if need_weights else None)

    def encoder_layer(self, x_nle: np.ndarray, w: EncoderWeights, num_heads: int,
                      activation: str = "relu", norm_first: bool = False,
                      bias: np.ndarray | None = None, empty: int = 0,
                      need_weights: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """One Transformer encoder layer (torch's ``TransformerEncoderLayer``, batch first).

        mha(z) = concat_h softmax(q_h k_h^T / sqrt(E / H) + bias) v_h W_o + b_o with
        [q k v] = z W_qkv + b_qkv; ff(z) = f(z W_1 + b_1) W_2 + b_2. Post-norm:
        y = LN1(x + mha(x)), out = LN2(y + ff(y)); ``norm_first``: y = x + mha(LN1(x)),
        out = y + ff(LN2(y)). ``bias`` and ``empty`` as in ``attention``. Returns
        (out (N, L, E), attention weights (N, H, L, L), or None unless ``need_weights``).
        """
        n, length, e = x_nle.shape
        hd = e // num_heads

        def norm(z, ln):
            return self.layer_norm(z, *ln)

        def mha(z):
            qkv = self.dense(z.reshape(n * length, e), w.w_qkv_io, w.b_qkv)
            qkv = qkv.reshape(n, length, 3, num_heads, hd)
            q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
            o, s = self.attention(q, k, v, 1.0 / math.sqrt(hd), bias, False, empty)
            o = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(n * length, e)
            return self.dense(o, w.w_o_io, w.b_o).reshape(n, length, e), s

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
    def rnn_sequence(self, x_bti, w_ih, w_hh, b, h0, **kw):
        """h_t = act(x_t w_ih + h_{t-1} w_hh + b) over time; returns (y, h) (``recurrent_reference``)."""
        from .recurrent_reference import rnn_sequence
        return rnn_sequence(x_bti, w_ih, w_hh, b, h0, **kw)

    def lstm_sequence(self, x_bti, w_ig, w_hg, b_g, h0, c0, **kw):
        """LSTM over time, gate blocks i, f, g, o; returns (y, h, c) (``recurrent_reference``)."""
        from .recurrent_reference import lstm_sequence
        return lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, **kw)

    def gru_sequence(self, x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw):
        """GRU over time, gate blocks z, r, h; returns (y, h) (``recurrent_reference``)."""
        from .recurrent_reference import gru_sequence
        return gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw)


def _log_sigmoid(z):
    """log sigmoid(z) = -softplus(-z), stable for large |z|."""
    return -(np.log1p(np.exp(-np.abs(z))) + np.maximum(-z, np.float32(0)))
