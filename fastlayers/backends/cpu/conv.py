"""The convolution and pooling primitives of the cpu backend (``ConvOps``, a base class of
CpuOps), on the native core (``fastlayers.native._core``: ``native/conv_*.c`` and
``native/pool.c``).

- conv2d: 3x3 stride 1 with 16 channels each way: Winograd (``conv3x3_winograd``), F(4x4, 3x3)
  up to 128 channels on planes of many 4x4 tiles, else F(2x2, 3x3); otherwise ``conv2d``, which runs the implicit GEMM on the padded
  input (one group, output rows that fill the sgemm's register tiles) or im2col + the packed
  sgemm in L2-sized row blocks (grouped convolutions, short output rows; a 1x1 stride-1
  unpadded convolution is a product over the NHWC rows, without im2col). A convolution with
  one input channel per group is a depthwise one.
- conv2d_nchw_plan: an NCHW input of few channels (an image into a network's first layer,
  through a window of at most 3x3) convolved straight from its planes into NHWC (``conv2d_nchw_in``: a direct loop vectorized
  over output channels, no transpose or padded copy of the input); others made NHWC for conv2d.
- conv1x1_nchw_plan: a 1x1 convolution (stride 1, unpadded, one group) of an NCHW input of
  more channels and positions run as per image the product w (C_out, C) @ x (C, H W) on the
  planes, its output NCHW planes (``conv1x1_nchw``): no move of the input to NHWC and back.
- depthwise_conv2d: a direct loop vectorized over channels, four outputs per pass (3x3: the
  nine weights in registers; 5- and 7-wide windows at stride 1: passes of 8 outputs sharing
  their loads); window rows outside x are skipped.
- conv_transpose2d: one sgemm per group (x rows times w (C_in/g, kh kw C_out/g)) + a gathering
  col2im. conv_transpose2d_nchw: on NCHW planes, per chunk of input rows the sgemm w^T (C_out/g
  kh kw, C_in/g) @ x (C_in/g, rows W) in place, its rows added into output rows split in
  column phases (contiguous vector adds), each row interleaved into y with its epilogue once
  its taps are in.
- pool2d_nchw, depthwise_conv2d_nchw: the same on NCHW planes (no layout round trip), each
  block of output rows vectorized along W on a padded copy of its input rows split into
  stride phases; max pools, and means over at most 64 taps at column step 1, separable (the
  window's rows reduced straight from the plane, then its columns).
- pool2d, global_pool, adaptive_pool2d, roi_pool, upsample2d, local_response_norm: direct loops
  vectorized over channels.

Weights are packed (or Winograd-transformed) once per weight array (``derived``). The bias
and the elementwise activations run in the kernels while the output rows are in cache;
softmax over the channels runs as one pass after, and an activation without a native code
through the reference. The kernels share their work among fastlayers' threads and release
the GIL.
"""

from __future__ import annotations

import functools

import numpy as np

from ...geometry import window_out_2d
from ...native import CODES, _core
from ..derived import derived, derived_view
from ..reference import ReferenceOps
from ..reference.conv import roi_bins, source_coords
from . import gemm
from .memory import LINE, line_aligned

_SOFTMAX_CODES = (CODES["softmax"], CODES["log_softmax"])
#: An NCHW input of at most this many channels, into between these many output channels,
#: through a window of at most this many taps (or of at most ``NCHW_DIRECT_MAX_WIDE_WINDOW``
#: into at least ``NCHW_DIRECT_WIDE_MIN_COUT`` channels; at a stride of at least 2 both ways,
#: of at most ``NCHW_DIRECT_MAX_STRIDED_WINDOW`` from at most ``NCHW_DIRECT_STRIDED_MAX_CIN``
#: channels into as many: a 7x7 stem), is convolved straight from its planes
#: (``conv2d_nchw_in``) instead of made NHWC for ``conv2d``: beyond them the implicit GEMM's
#: register tiles win over the direct loop (docs/design.md, "Figures behind the code's
#: constants"). ``nchw_direct`` applies them.
NCHW_DIRECT_MAX_CIN = 4
NCHW_DIRECT_MIN_COUT = 2
NCHW_DIRECT_MAX_COUT = 64
NCHW_DIRECT_MAX_WINDOW = 9
NCHW_DIRECT_MAX_WIDE_WINDOW = 25
NCHW_DIRECT_WIDE_MIN_COUT = 16
NCHW_DIRECT_MAX_STRIDED_WINDOW = 49
NCHW_DIRECT_STRIDED_MAX_CIN = 3

#: At most this many output channels, at a column stride of 1, through a window larger than
#: 1x1, into rows of at least this many columns: a convolution of NCHW planes (one group, not
#: the few-input-channel kernel's) runs on them into NCHW planes (``conv2d_planes``, vectorized
#: over output columns), where the implicit GEMM's vectors over the output channels are mostly
#: empty lanes (docs/design.md, "Few output channels from NCHW planes"). ``planes_direct``
#: applies them (``planes_takes`` for whole arguments).
PLANES_MAX_COUT = 8
PLANES_MIN_COLUMNS = 16
#: Fewest positions per image for a 1x1 convolution of NCHW planes to run on them
#: (``conv1x1_nchw``, per image the product w @ x over H W columns): fewer, such as a
#: squeeze-and-excite block's pooled (N, C, 1, 1), run as rows of one product on packed
#: weights (``conv2d``).
POINTWISE_NCHW_MIN_POSITIONS = 64


def nchw_direct(c, cout, kh, kw, strides=(1, 1)):
    """Whether a one-group convolution of ``c`` NCHW planes into ``cout`` channels through a
    ``kh`` x ``kw`` window at ``strides`` runs straight from the planes (``conv2d_nchw_in``,
    the bounds above) rather than through an NHWC copy and the implicit GEMM."""
    taps = kh * kw
    wide = taps <= NCHW_DIRECT_MAX_WIDE_WINDOW or (
        taps <= NCHW_DIRECT_MAX_STRIDED_WINDOW and min(strides) >= 2 and c <= NCHW_DIRECT_STRIDED_MAX_CIN
    )
    return (
        1 <= c <= NCHW_DIRECT_MAX_CIN
        and NCHW_DIRECT_MIN_COUT <= cout <= NCHW_DIRECT_MAX_COUT
        and (taps <= NCHW_DIRECT_MAX_WINDOW or (wide and cout >= NCHW_DIRECT_WIDE_MIN_COUT))
    )


def planes_direct(c, cout, kh, kw, strides, wo, groups, code, output=False) -> bool:
    """Whether a convolution of ``c`` NCHW planes into ``cout`` channels through a ``kh`` x
    ``kw`` window at ``strides`` into rows of ``wo`` columns, ``groups`` groups and activation
    ``code`` runs from the planes into NCHW planes (``conv2d_planes``, the bounds above). Where
    its result is wanted as NCHW planes (``output``: a graph's output, which an NHWC result
    would be moved to), also every shape ``conv2d_nchw_in`` takes (``nchw_direct``): its rows
    transposed into the planes from cache as it writes them cost less than a move of the whole
    result after it."""
    if groups != 1 or code is None:
        return False
    if output and nchw_direct(c, cout, kh, kw, strides):
        return True
    return (
        1 <= cout <= PLANES_MAX_COUT
        and strides[1] == 1
        and kh * kw > 1
        and wo >= PLANES_MIN_COLUMNS
        and not nchw_direct(c, cout, kh, kw, strides)
    )


def planes_takes(x_shape, w_hwio, strides, pads, dilation, groups, activation, output=False):
    """(the activation's code, the output shape (N, C_out, Ho, Wo)) where a convolution of NCHW
    planes of ``x_shape`` (N, C, H, W) with ``w_hwio`` runs on them into NCHW planes
    (``conv2d_planes``: ``planes_direct`` on its shapes, ``output`` passed on, a non-empty
    output, an elementwise code), else None. The Python plan (``conv2d_planes_plan``) and the
    native plan's step (``steps.conv2d_planes_step``) decide by it."""
    n, c, h, w = x_shape
    kh, kw, _, cout = w_hwio.shape
    ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
    code = CODES.get(activation)
    code = None if code in _SOFTMAX_CODES else code
    if n * c * h * w == 0 or ho <= 0 or min(pads[0][0], pads[1][0]) < 0:
        return None
    return (code, (n, cout, ho, wo)) if planes_direct(c, cout, kh, kw, strides, wo, groups, code, output) else None


def pointwise_rows(w_oi):
    """1x1 weights (C_out, C) as ``conv1x1_nchw`` reads them: float32 rows, (C_out, C + 16) with
    the weights in the first C columns where C is a multiple of 1024 (rows a multiple of 4 KiB
    apart fall into one L1 set, and the sgemm's register tile reads 14 of them at once;
    docs/design.md, "1x1 convolutions on NCHW planes"), else as they are. Shared by the Python
    and native plans (``derived_view``)."""

    def rows(w):
        cout, c = w.shape
        if c % 1024:
            return _f32c(w)
        padded = np.zeros((cout, c + 16), np.float32)
        padded[:, :c] = w
        return padded

    return derived_view(w_oi, "conv1x1-nchw-rows", rows)


def pointwise_nchw_takes(x_shape, w_oi, code) -> bool:
    """Whether a 1x1 convolution (stride 1, unpadded, one group) of NCHW planes of ``x_shape``
    (N, C, H, W) with weights ``w_oi`` (C_out, C) and activation ``code`` runs on the planes
    (``conv1x1_nchw``): more channels than the direct NHWC-out kernel takes
    (``NCHW_DIRECT_MAX_CIN``), at least ``POINTWISE_NCHW_MIN_POSITIONS`` positions, an
    elementwise code. The Python plan (``conv1x1_nchw_plan``) and the native plan's step
    (``steps.conv1x1_nchw_step``) decide the same way."""
    n, c, h, w = x_shape
    cout, cin = w_oi.shape
    return (
        n >= 1
        and cin == c
        and c > NCHW_DIRECT_MAX_CIN
        and h * w >= POINTWISE_NCHW_MIN_POSITIONS
        and cout >= 1
        and code is not None
        and code not in _SOFTMAX_CODES
    )


#: Winograd needs this many channels each way (fewer: its products are too thin), this many
#: tiles (2x2 outputs, all images), and, for weights wider than WINOGRAD_WIDE channels squared,
#: WINOGRAD_WIDE_TILES tiles (its U is 16/9 the size of the weights, read for few rows).
_WINOGRAD_MIN_CHANNELS = 16
_WINOGRAD_MIN_TILES = 4
_WINOGRAD_WIDE = 256
_WINOGRAD_WIDE_TILES = 36
#: F(4x4, 3x3) up to this many channels each way (its error against the exact convolution,
#: about 3e-6 of the output's largest magnitude there, grows with the channels: 4.7e-6 at 256),
#: where its 36 products per 4x4 tile come to at most this fraction of F(2x2)'s 16 per 2x2 tile
#: (on the avx512 path, whose 16 lanes and 32 registers suit F(4x4)'s 6x6 transforms, the
#: larger fraction: 14x14 planes).
_WINOGRAD4_MAX_CHANNELS = 128
_WINOGRAD4_WORK = 0.6
_WINOGRAD4_WORK_AVX512 = 0.75


def _f32c(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _bias(b):
    return None if b is None else _f32c(b)


def _kernel_code(activation):
    """The kernels' epilogue code of ``activation``: its code when elementwise, else linear."""
    code = CODES.get(activation)
    return 0 if code is None or code in _SOFTMAX_CODES else code


def _finish(self, y, activation, alpha):
    """y after a kernel whose epilogue ran ``_kernel_code(activation)``: softmax over the
    channels in one native pass (in place), activations without a code by the reference."""
    code = CODES.get(activation)
    if code is None:
        return ReferenceOps.activation(self, y, activation, alpha)
    if code in _SOFTMAX_CODES:
        rows = y.reshape(-1, y.shape[-1])
        _core.bias_act(rows, None, code, alpha, rows)
    return y


def _transpose_packed(w_hwio, groups):
    """A transposed convolution's (kh, kw, C_in, C_out / groups) weights packed for
    ``conv_transpose2d``, once per weight."""
    return derived(_f32c(w_hwio), f"native-conv-transpose:{groups}", lambda a: _core.conv_transpose_pack(a, groups))


def _transpose_one_weights(w_hwio):
    """A one-output-channel transposed convolution's (kh, kw, C_in, 1) weights as
    ``conv_transpose2d_nchw``'s (1, kh kw, C_in), once per weight."""
    kh, kw, cin, _ = w_hwio.shape
    return derived(w_hwio, "native-conv-transpose-one", lambda a: _f32c(a.reshape(1, kh * kw, cin)))


def _transpose_nchw_weights(w_iohw, groups):
    """A transposed convolution's (C_in, C_out / groups, kh, kw) weights as each group's
    (C_out / groups kh kw, C_in / groups), ``conv_transpose2d_nchw``'s A read in place (a copy:
    a view would keep w_iohw alive in the cache), once per weight."""
    cin = w_iohw.shape[0]
    return derived(
        w_iohw,
        f"native-conv-transpose-nchw:{groups}",
        lambda a: np.array(a.reshape(groups, cin // groups, -1).transpose(0, 2, 1), np.float32, order="C"),
    )


def _winograd_tile(n, ho, wo, cin, cout) -> int:
    """The Winograd tile of a 3x3 stride-1 convolution: 0 (``conv2d`` is faster), 2 or 4.

    F(2x2, 3x3) beats ``conv2d`` from 16 channels each way and 4 tiles, except for wide weights
    on few tiles; F(4x4, 3x3) beats F(2x2) on planes whose 4x4 tiles leave little padding, and
    is taken up to ``_WINOGRAD4_MAX_CHANNELS`` channels for its precision; the fraction depends
    on the ISA path the kernels run now (docs/design.md,
    "Figures behind the code's constants")."""
    if min(cin, cout) < _WINOGRAD_MIN_CHANNELS:
        return 0
    tiles2 = n * ((ho + 1) // 2) * ((wo + 1) // 2)
    wide = cin * cout > _WINOGRAD_WIDE * _WINOGRAD_WIDE
    if tiles2 < (_WINOGRAD_WIDE_TILES if wide else _WINOGRAD_MIN_TILES):
        return 0
    tiles4 = n * ((ho + 3) // 4) * ((wo + 3) // 4)
    work = _WINOGRAD4_WORK_AVX512 if _core.isa() == "avx512" else _WINOGRAD4_WORK
    if max(cin, cout) <= _WINOGRAD4_MAX_CHANNELS and 36 * tiles4 <= work * 16 * tiles2:
        return 4
    return 2


class PackedConvWeights:
    """A convolution's (kh, kw, C_in, C_out) weights of one group held only in the form
    ``_core.conv2d`` reads (``_core.conv_pack``: the (kh kw C_in, C_out) matrix in the sgemm's
    panels), for a model that keeps no other copy (``hold_conv``). The kernels take ``packed``
    as it is; Winograd's transformed weights and the other forms are derived from the values
    unpacked anew (once per form, ``derived``), and anything that reads them as an array
    (``np.asarray``, another backend) gets those values, the same bits."""

    __slots__ = ("packed", "shape", "__weakref__")
    dtype = np.dtype(np.float32)
    ndim = 4

    def __init__(self, packed, shape):
        self.packed, self.shape = packed, tuple(int(d) for d in shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return int(self.packed.nbytes)

    def unpacked(self):
        """The weights as a new (kh, kw, C_in, C_out) C-ordered float32 array."""
        kh, kw, cin, cout = self.shape
        return gemm.unpack(self.packed, kh * kw * cin, cout).reshape(self.shape)

    def __array__(self, dtype=None, copy=None):
        w = self.unpacked()
        return w if dtype is None else w.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"PackedConvWeights(shape={self.shape})"


def hold_conv(w_hwio, groups):
    """What a model that reads the convolution weights ``w_hwio`` (kh, kw, C_in / groups,
    C_out) only through the convolutions of this backend holds in their place: their packed
    form alone (``PackedConvWeights``) for one group of more input channels than the direct
    NCHW kernel reads raw (``NCHW_DIRECT_MAX_CIN``), else ``w_hwio`` itself."""
    if (
        type(w_hwio) is not np.ndarray
        or w_hwio.dtype != np.float32
        or w_hwio.ndim != 4
        or groups != 1
        or 0 in w_hwio.shape
        or w_hwio.shape[2] <= NCHW_DIRECT_MAX_CIN
    ):
        return w_hwio
    return PackedConvWeights(_core.conv_pack(_f32c(w_hwio), 1), w_hwio.shape)


def conv_weights_array(w_hwio):
    """``w_hwio`` as a float32 array the kernels read in place, its data on a cache line (the
    direct kernels load whole vectors of it; from a line's middle each load spans two lines:
    docs/design.md, "Algorithms", few input channels from NCHW): an array as it is where it starts
    on one, else a copy of it once per weight; held weights unpacked once for as long as they
    live."""
    if type(w_hwio) is PackedConvWeights:
        return derived(w_hwio, "conv-hwio", lambda w: line_aligned(w.unpacked()))
    w = _f32c(w_hwio)
    return w if w.ctypes.data % LINE == 0 else derived(w, "conv-hwio-line", line_aligned)


def _packed_conv(wk, groups):
    """Each group's weights of ``wk`` packed for ``_core.conv2d`` (once per weight array; held
    weights are that form already)."""
    if type(wk) is PackedConvWeights and groups == 1:
        return wk.packed
    return derived_view(wk, f"native-conv:{groups}", lambda w: _core.conv_pack(w, groups))


def winograd_weights(wk, tile: int):
    """``wk`` (3, 3, C_in, C_out) transformed for ``conv3x3_winograd`` at ``tile`` (2 or 4),
    once per weight array (held weights: from their values unpacked for the transform)."""
    if type(wk) is PackedConvWeights:
        return derived(wk, f"native-winograd:{tile}", lambda w: _core.winograd_pack(w.unpacked(), tile=tile))
    return derived_view(wk, f"native-winograd:{tile}", functools.partial(_core.winograd_pack, tile=tile))


@functools.lru_cache(maxsize=256)
def _adaptive_bins(size: int, out: int):
    """The starts and ends of ``adaptive_bins(size, out)`` as two int64 arrays (read only)."""
    i = np.arange(out, dtype=np.int64)
    bins = np.stack([i * size // out, -(-(i + 1) * size // out)])
    bins.setflags(write=False)
    return bins[0], bins[1]


class ConvOps(ReferenceOps):
    """The convolution and pooling primitives of ``CpuOps`` (a base class of it)."""

    def conv2d(
        self,
        x_nhwc,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
    ):
        return self.conv2d_plan(x_nhwc.shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha)(x_nhwc)

    def conv_weights(self, w_hwio, groups=1):
        return hold_conv(w_hwio, groups)

    def conv2d_plan(
        self,
        x_shape,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
    ):
        return self._conv2d_plan(x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, None)

    def conv2d_residual_plan(
        self,
        x_shape,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
        residual_activation="linear",
        residual_alpha=0.0,
    ):
        """The direct and implicit-GEMM convolutions add the residual to each block of output
        rows as their epilogue writes it (``_core.conv2d``'s ``res``); the other forms (Winograd,
        depthwise, empty shapes, a softmax or non-native activation) in a pass after."""
        residual = (residual_activation, residual_alpha)
        return self._conv2d_plan(x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, residual)

    def _conv2d_plan(self, x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha, residual):
        """``conv2d_plan`` (residual None: ``run(x)``) or ``conv2d_residual_plan`` (residual
        (activation, alpha): ``run(x, r)``)."""
        n, h, w, c = x_shape
        kh, kw, cin_g, cout = w_hwio.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)

        def plain(run):  # the residual, where wanted, in a pass after run
            if residual is None:
                return run
            return lambda x, r=None: run(x) if r is None else self.add_act(run(x), r, *residual)

        if n * h * w * c == 0 or ho <= 0 or wo <= 0 or cout == 0 or min(pt, pl) < 0:
            w_ref = np.asarray(w_hwio)
            return plain(
                lambda x: ReferenceOps.conv2d(self, x, w_ref, b, strides, pads, dilation, groups, activation, alpha)
            )
        if groups > 1 and cin_g == 1 and groups == c:
            # one input channel per group: a depthwise convolution (multiplier cout / c)
            w_hwcm = w_hwio.reshape(kh, kw, c, cout // c)
            return plain(lambda x: self.depthwise_conv2d(x, w_hwcm, b, strides, pads, dilation, activation, alpha))
        wk = w_hwio if type(w_hwio) is PackedConvWeights else _f32c(w_hwio)
        bias, code, out = _bias(b), _kernel_code(activation), (n, ho, wo, cout)
        finish = code != CODES.get(activation)  # softmax or no native code: a pass after
        tile = _winograd_tile(n, ho, wo, c, cout) if kh == kw == 3 and sh == sw == dh == dw == 1 and groups == 1 else 0

        def direct(x, y, pw):
            _core.conv2d(x, pw, bias, y, kh, kw, sh, sw, dh, dw, pt, pl, groups, code, alpha)

        if tile:
            pu = winograd_weights(wk, tile)

            def run(x):
                x, y = _f32c(x), np.empty(out, np.float32)
                if not _core.conv3x3_winograd(x, pu, bias, y, pt, pl, code, alpha, tile):
                    # a NaN / inf input or an overflow in the transforms: the exact sums
                    direct(x, y, _packed_conv(wk, groups))
                return _finish(self, y, activation, alpha) if finish else y

            return plain(run)
        pw, conv2d = _packed_conv(wk, groups), _core.conv2d

        def run(x):
            y = np.empty(out, np.float32)
            if not (x.dtype == np.float32 and x.flags.c_contiguous):
                x = _f32c(x)
            conv2d(x, pw, bias, y, kh, kw, sh, sw, dh, dw, pt, pl, groups, code, alpha)
            return _finish(self, y, activation, alpha) if finish else y

        if residual is None:
            return run
        res_code = _kernel_code(residual[0])
        if finish or res_code != CODES.get(residual[0]):  # no kernel code: the residual after
            return plain(run)
        res_alpha = residual[1]

        def run_residual(x, r=None):
            if r is None or r.shape != out:  # none, or broadcast by the Add: a pass after
                return run(x) if r is None else self.add_act(run(x), r, *residual)
            y = np.empty(out, np.float32)
            if not (x.dtype == np.float32 and x.flags.c_contiguous):
                x = _f32c(x)
            conv2d(
                x, pw, bias, y, kh, kw, sh, sw, dh, dw, pt, pl, groups, code, alpha, 0, _f32c(r), res_code, res_alpha
            )
            return y

        return run_residual

    def conv2d_nchw_plan(
        self,
        x_shape,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
    ):
        n, c, h, w = x_shape
        kh, kw, _, cout = w_hwio.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, _), (pl, _) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        code = CODES.get(activation)
        if (
            groups != 1
            or not nchw_direct(c, cout, kh, kw, strides)
            or n * h * w * cout == 0
            or ho <= 0
            or wo <= 0
            or min(pt, pl) < 0
            or code is None
            or code in _SOFTMAX_CODES
        ):
            return super().conv2d_nchw_plan(x_shape, w_hwio, b, strides, pads, dilation, groups, activation, alpha)
        wk, bias, out = conv_weights_array(w_hwio), _bias(b), (n, ho, wo, cout)

        def run(x):
            y = np.empty(out, np.float32)
            return _core.conv2d_nchw_in(_f32c(x), wk, bias, y, sh, sw, dh, dw, pt, pl, code, alpha)

        return run

    def conv2d_planes_plan(
        self,
        x_shape,
        w_hwio,
        b,
        strides=(1, 1),
        pads=((0, 0), (0, 0)),
        dilation=(1, 1),
        groups=1,
        activation="linear",
        alpha=0.0,
        output=False,
    ):
        taken = planes_takes(x_shape, w_hwio, strides, pads, dilation, groups, activation, output)
        if taken is None:
            return None
        code, out = taken
        (sh, sw), (dh, dw), (pt, _), (pl, _) = strides, dilation, *pads
        wk, bias = conv_weights_array(w_hwio), _bias(b)

        def run(x):
            y = np.empty(out, np.float32)
            return _core.conv2d_planes(_f32c(x), wk, bias, y, sh, sw, dh, dw, pt, pl, code, alpha)

        return run

    def conv1x1_nchw_plan(self, x_shape, w_oi, b, activation="linear", alpha=0.0):
        n, c, h, w = x_shape
        cout, code = w_oi.shape[0], CODES.get(activation)
        if not pointwise_nchw_takes(x_shape, w_oi, code):
            return None
        rows, bias, out = pointwise_rows(w_oi), _bias(b), (n, cout, h, w)
        wk = rows[:, :c]

        def run(x):
            y = np.empty(out, np.float32)
            return _core.conv1x1_nchw(_f32c(x), wk, bias, y, code, alpha)

        return run

    def depthwise_conv2d(
        self, x_nhwc, w_hwcm, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), activation="linear", alpha=0.0
    ):
        n, h, w, c = x_nhwc.shape
        kh, kw, _, m = w_hwcm.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or m == 0 or min(pt, pl) < 0:
            return ReferenceOps.depthwise_conv2d(self, x_nhwc, w_hwcm, b, strides, pads, dilation, activation, alpha)
        y = np.empty((n, ho, wo, c * m), np.float32)
        _core.depthwise_conv2d(
            _f32c(x_nhwc), _f32c(w_hwcm), _bias(b), y, sh, sw, dh, dw, pt, pl, _kernel_code(activation), alpha
        )
        return _finish(self, y, activation, alpha)

    def conv_transpose2d(
        self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation=(1, 1), groups=1, activation="linear", alpha=0.0
    ):
        n, h, w, cin = x_nhwc.shape
        kh, kw, _, cout_g = w_hwio.shape
        (sh, sw), (dh, dw), (ct, cl), (ho, wo) = strides, dilation, crop, out_hw
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0 or cout_g == 0 or min(ct, cl) < 0:
            return ReferenceOps.conv_transpose2d(
                self, x_nhwc, w_hwio, b, strides, crop, out_hw, dilation, groups, activation, alpha
            )
        code = _kernel_code(activation)
        if groups * cout_g == 1:
            # one output channel: NHWC memory is its NCHW plane, and the NCHW kernel's product (a
            # row per tap over the pixels) fills whole vectors where this kernel's has kh kw
            # columns; x moved to NCHW first (docs/design.md, "NCHW transposed convolution")
            wt = _transpose_one_weights(w_hwio)
            y = np.empty((n, 1, ho, wo), np.float32)
            x_nchw = self.channels_first(_f32c(x_nhwc))
            _core.conv_transpose2d_nchw(x_nchw, wt, _bias(b), y, kh, kw, 1, sh, sw, dh, dw, ct, cl, code, alpha)
            return _finish(self, y.reshape(n, ho, wo, 1), activation, alpha)
        pw = _transpose_packed(w_hwio, groups)
        y = np.empty((n, ho, wo, groups * cout_g), np.float32)
        _core.conv_transpose2d(_f32c(x_nhwc), pw, _bias(b), y, kh, kw, groups, sh, sw, dh, dw, ct, cl, code, alpha)
        return _finish(self, y, activation, alpha)

    def conv_transpose2d_nchw(
        self, x_nchw, w_iohw, b, strides, crop, out_hw, dilation=(1, 1), groups=1, activation="linear", alpha=0.0
    ):
        n, cin, h, w = x_nchw.shape
        _, cout_g, kh, kw = w_iohw.shape
        (sh, sw), (dh, dw), (ct, cl), (ho, wo) = strides, dilation, crop, out_hw
        code = CODES.get(activation)
        if (
            x_nchw.size == 0
            or ho <= 0
            or wo <= 0
            or cout_g == 0
            or min(ct, cl) < 0
            or code is None
            or code in _SOFTMAX_CODES
        ):
            return ReferenceOps.conv_transpose2d_nchw(
                self, x_nchw, w_iohw, b, strides, crop, out_hw, dilation, groups, activation, alpha
            )
        wt = _transpose_nchw_weights(w_iohw, groups)
        y = np.empty((n, groups * cout_g, ho, wo), np.float32)
        _core.conv_transpose2d_nchw(_f32c(x_nchw), wt, _bias(b), y, kh, kw, groups, sh, sw, dh, dw, ct, cl, code, alpha)
        return y

    def pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation=(1, 1), count_include_pad=False):
        n, h, w, c = x_nhwc.shape
        (ho, wo), (pt, pb), (pl, pr) = out_hw, pads[0], pads[1]
        if x_nhwc.size == 0 or ho <= 0 or wo <= 0:
            return ReferenceOps.pool2d(self, x_nhwc, kind, pool, strides, pads, out_hw, dilation, count_include_pad)
        y = np.empty((n, ho, wo, c), np.float32)
        return _core.pool2d(
            _f32c(x_nhwc),
            y,
            kind == "max",
            pool[0],
            pool[1],
            strides[0],
            strides[1],
            dilation[0],
            dilation[1],
            pt,
            pl,
            h + pb,
            w + pr,
            bool(count_include_pad),
        )

    def pool2d_nchw(self, x_nchw, kind, pool, strides, pads, out_hw, dilation=(1, 1), count_include_pad=False):
        return self.pool2d_nchw_plan(x_nchw.shape, kind, pool, strides, pads, out_hw, dilation, count_include_pad)(
            x_nchw
        )

    def pool2d_nchw_plan(self, x_shape, kind, pool, strides, pads, out_hw, dilation=(1, 1), count_include_pad=False):
        n, c, h, w = x_shape
        (ho, wo), (pt, pb), (pl, pr) = out_hw, pads[0], pads[1]
        if n * c * h * w == 0 or ho <= 0 or wo <= 0 or min(pt, pl) < 0:
            return lambda x: ReferenceOps.pool2d_nchw(
                self, x, kind, pool, strides, pads, out_hw, dilation, count_include_pad
            )
        is_max, (kh, kw), (sh, sw), (dh, dw) = kind == "max", pool, strides, dilation
        out, h_end, w_end, cip = (n, c, ho, wo), h + pb, w + pr, bool(count_include_pad)

        def run(x):
            y = np.empty(out, np.float32)
            return _core.pool2d_nchw(_f32c(x), y, is_max, kh, kw, sh, sw, dh, dw, pt, pl, h_end, w_end, cip)

        return run

    def depthwise_conv2d_nchw(
        self, x_nchw, w_ohw, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), activation="linear", alpha=0.0
    ):
        return self.depthwise_conv2d_nchw_plan(x_nchw.shape, w_ohw, b, strides, pads, dilation, activation, alpha)(
            x_nchw
        )

    def depthwise_conv2d_nchw_plan(
        self, x_shape, w_ohw, b, strides=(1, 1), pads=((0, 0), (0, 0)), dilation=(1, 1), activation="linear", alpha=0.0
    ):
        n, c, h, w = x_shape
        cm, kh, kw = w_ohw.shape
        (sh, sw), (dh, dw) = strides, dilation
        (pt, pb), (pl, pr) = pads
        ho, wo = window_out_2d((h, w), (kh, kw), strides, dilation, pads)
        code = CODES.get(activation)
        if (
            n * c * h * w == 0
            or ho <= 0
            or wo <= 0
            or cm == 0
            or min(pt, pl) < 0
            or code is None
            or code in _SOFTMAX_CODES
        ):  # softmax over channels: the reference's NHWC epilogue
            return lambda x: ReferenceOps.depthwise_conv2d_nchw(
                self, x, w_ohw, b, strides, pads, dilation, activation, alpha
            )
        wk, bias, out = _f32c(w_ohw), _bias(b), (n, cm, ho, wo)

        def run(x):
            y = np.empty(out, np.float32)
            return _core.depthwise_conv2d_nchw(_f32c(x), wk, bias, y, sh, sw, dh, dw, pt, pl, code, alpha)

        return run

    def global_pool(self, x, kind, axes, keepdims=False):
        # every axis between the batch and the channels: one (1, steps) window over NHWC rows
        if x.ndim < 3 or x.size == 0 or tuple(sorted(a % x.ndim for a in axes)) != tuple(range(1, x.ndim - 1)):
            return ReferenceOps.global_pool(self, x, kind, axes, keepdims)
        n, c = x.shape[0], x.shape[-1]
        steps = x.size // (n * c)
        y = self.pool2d(x.reshape(n, 1, steps, c), kind, (1, steps), (1, 1), ((0, 0), (0, 0)), (1, 1))
        return y.reshape((n, *(1,) * (x.ndim - 2), c)) if keepdims else y.reshape(n, c)

    def adaptive_pool2d(self, x_nhwc, kind, out_hw):
        n, h, w, c = x_nhwc.shape
        if x_nhwc.size == 0 or min(out_hw) <= 0:
            return ReferenceOps.adaptive_pool2d(self, x_nhwc, kind, out_hw)
        (h0, h1), (w0, w1) = _adaptive_bins(h, out_hw[0]), _adaptive_bins(w, out_hw[1])
        y = np.empty((n, out_hw[0], out_hw[1], c), np.float32)
        return _core.bin_pool(_f32c(x_nhwc), None, h0, h1, w0, w1, kind == "max", y)

    def roi_pool(self, x_nhwc, rois, output_size, spatial_scale=1.0):
        n, h, w, c = x_nhwc.shape
        if x_nhwc.size == 0 or len(rois) == 0:
            return ReferenceOps.roi_pool(self, x_nhwc, rois, output_size, spatial_scale)
        batch, h0, h1, w0, w1 = roi_bins(rois, output_size, spatial_scale, h, w)
        y = np.empty((batch.shape[0], output_size[0], output_size[1], c), np.float32)
        return _core.bin_pool(_f32c(x_nhwc), batch, h0, h1, w0, w1, True, y)

    def resize2d_taps(self, x_nhwc, rows, cols, bilinear):
        (y0, y1, fy), (x0, x1, fx) = rows, cols
        if x_nhwc.size == 0 or x_nhwc.dtype != np.float32 or len(y0) == 0 or len(x0) == 0:
            return ReferenceOps.resize2d_taps(self, x_nhwc, rows, cols, bilinear)
        y = np.empty((x_nhwc.shape[0], len(y0), len(x0), x_nhwc.shape[3]), np.float32)
        if not bilinear:
            return _core.resize(_f32c(x_nhwc), y0, y0, None, x0, x0, None, False, y)
        return _core.resize(_f32c(x_nhwc), y0, y1, fy, x0, x1, fx, True, y)

    def upsample2d(self, x_nhwc, out_hw, mode="nearest", align_corners=False, scales=(None, None)):
        n, h, w, c = x_nhwc.shape
        if x_nhwc.size == 0 or min(out_hw) <= 0:
            return ReferenceOps.upsample2d(self, x_nhwc, out_hw, mode, align_corners, scales)
        sy = source_coords(out_hw[0], h, mode, align_corners, scales[0])
        sx = source_coords(out_hw[1], w, mode, align_corners, scales[1])
        y = np.empty((n, out_hw[0], out_hw[1], c), np.float32)
        if mode == "nearest":
            y0, x0 = sy.astype(np.int64), sx.astype(np.int64)
            return _core.resize(_f32c(x_nhwc), y0, y0, None, x0, x0, None, False, y)
        y0 = np.minimum(np.floor(sy).astype(np.int64), h - 1)
        x0 = np.minimum(np.floor(sx).astype(np.int64), w - 1)
        y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
        fy, fx = (sy - y0).astype(np.float32), (sx - x0).astype(np.float32)
        return _core.resize(_f32c(x_nhwc), y0, y1, fy, x0, x1, fx, True, y)

    def local_response_norm(self, x, size, alpha=1e-4, beta=0.75, k=1.0):
        if x.size == 0 or x.ndim == 0:
            return ReferenceOps.local_response_norm(self, x, size, alpha, beta, k)
        xr = _f32c(x).reshape(-1, x.shape[-1])
        return _core.lrn(xr, int(size), alpha, beta, k, np.empty_like(xr)).reshape(x.shape)
