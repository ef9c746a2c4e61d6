"""The ops interface for type checkers: array aliases and ``Ops``, what callers use of a backend.

The aliases are numpy arrays by element type: ``Floats*`` float32 (what every primitive takes
and returns), ``Ints*`` integers (ids, indices), ``Bools*`` masks, ``ArrayXd`` any type (data
movement). The rank in a name (``Floats4d``) documents the axes the argument names spell
(``x_nhwc``); numpy's annotations check the element type, not the rank. ``Xd`` means any rank.

``EncoderWeights`` is the record of weights that ``Ops.encoder_layer`` takes.

``Ops`` is the protocol that ``get_ops()`` returns and that layers, nn modules, graphs and ONNX
operators are checked against. Each member's meaning is the docstring of the same name on
``ReferenceOps`` (``backends/reference``), the oracle; ``CpuOps`` and ``CudaOps`` override some
members with the same signatures (``tests/backends/test_ops_protocol.py`` checks that every backend
class has every member, with compatible parameters).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .integer import IntegerKernels

Floats1d: TypeAlias = npt.NDArray[np.float32]
Floats2d: TypeAlias = npt.NDArray[np.float32]
Floats3d: TypeAlias = npt.NDArray[np.float32]
Floats4d: TypeAlias = npt.NDArray[np.float32]
FloatsXd: TypeAlias = npt.NDArray[np.float32]
Ints1d: TypeAlias = npt.NDArray[np.integer[Any]]
Ints2d: TypeAlias = npt.NDArray[np.integer[Any]]
IntsXd: TypeAlias = npt.NDArray[np.integer[Any]]
Bools2d: TypeAlias = npt.NDArray[np.bool_]
BoolsXd: TypeAlias = npt.NDArray[np.bool_]
ArrayXd: TypeAlias = npt.NDArray[Any]

#: (rows, columns) of a 2-D window: strides, dilation, pool and output sizes.
Pair: TypeAlias = Sequence[int]
#: ((top, bottom), (left, right)) zero padding of a 2-D window.
Pads2d: TypeAlias = Sequence[Sequence[int]]
#: (source row or column before, after, float32 weight of the after one) per output position.
Taps: TypeAlias = tuple[Ints1d, Ints1d, Floats1d]
#: One call of a recurrent primitive: (method name, arguments after the input, keywords).


class Cell(str, enum.Enum):
    """The recurrent cell a sequence call runs, named by its ``Ops`` method: ``run_sequence``
    dispatches on it to ``rnn_sequence``, ``lstm_sequence`` or ``gru_sequence``."""

    RNN = "rnn_sequence"
    LSTM = "lstm_sequence"
    GRU = "gru_sequence"


#: One sequence call: (its cell, its arguments after the input, its keyword arguments).
SequenceCall: TypeAlias = tuple[Cell, Sequence[Any], dict[str, Any]]


class EncoderWeights(NamedTuple):
    """The weights of one Transformer encoder layer (``ReferenceOps.encoder_layer``): products
    as (in, out) arrays, biases (out,) or None, norms as (gamma or None, beta or None, eps)."""

    w_qkv_io: Floats2d  # (E, 3E): q, k, v projections side by side, heads within each
    b_qkv: Floats1d | None
    w_o_io: Floats2d  # (E, E)
    b_o: Floats1d | None
    w_1_io: Floats2d  # (E, F)
    b_1: Floats1d | None
    w_2_io: Floats2d  # (F, E)
    b_2: Floats1d | None
    norm1: tuple[Floats1d | None, Floats1d | None, float]
    norm2: tuple[Floats1d | None, Floats1d | None, float]


class Ops(Protocol):
    """The primitives of a backend; the semantics of each are ``ReferenceOps``'s."""

    # read-only for callers (a backend class sets them as class attributes)
    @property
    def name(self) -> str: ...
    @property
    def device(self) -> str | None: ...
    @property
    def integer(self) -> IntegerKernels | None: ...
    @property
    def quiet_activations(self) -> frozenset[str]: ...

    # a model's call
    def enter_call(self) -> Any: ...
    def exit_call(self, token: Any) -> None: ...

    # data movement and layout
    def is_device_array(self, a: object) -> bool: ...
    def to_device(self, x: Any) -> Any: ...
    def to_host(self, y: Any) -> Any: ...
    def as_float32(self, x: ArrayXd) -> FloatsXd: ...
    def contiguous(self, x: ArrayXd) -> ArrayXd: ...
    def zeros(self, shape: int | Sequence[int], dtype: npt.DTypeLike = ...) -> ArrayXd: ...
    def transpose(self, x: ArrayXd, axes: Sequence[int]) -> ArrayXd: ...
    def channels_last(self, x: FloatsXd) -> FloatsXd: ...
    def channels_first(self, x: FloatsXd) -> FloatsXd: ...
    def oihw_to_hwio(self, w: FloatsXd) -> FloatsXd: ...
    def take(self, x: ArrayXd, index: tuple[Any, ...]) -> ArrayXd: ...
    def broadcast_to(self, x: ArrayXd, shape: Sequence[int]) -> ArrayXd: ...
    def pad(self, x: ArrayXd, pads: Sequence[Sequence[int]]) -> ArrayXd: ...
    def concatenate(self, xs: Sequence[ArrayXd], axis: int = ...) -> ArrayXd: ...
    def merge(self, a: FloatsXd, b: FloatsXd, op: str, alpha: float = ..., beta: float = ...) -> FloatsXd: ...
    def relu(
        self, x: FloatsXd, threshold: float = ..., negative_slope: float = ..., max_value: float | None = ...
    ) -> FloatsXd: ...
    def nonzero_mask(self, x: ArrayXd) -> BoolsXd: ...
    def mask_bias(self, mask: ArrayXd, shape: Sequence[int]) -> FloatsXd: ...
    def indices(self, ids: npt.ArrayLike, size: int, where: str, what: str = ...) -> IntsXd: ...
    def mask_keep(self, mask: ArrayXd) -> FloatsXd: ...
    def split_heads(self, x_ptc: Floats3d, heads: int) -> Floats4d: ...
    def merge_heads(self, o_phtd: Floats4d) -> Floats3d: ...
    def check_rois(self, rois: Floats2d, batch: int, where: str) -> Floats2d: ...

    # arithmetic
    def add_act(self, a: FloatsXd, b: FloatsXd, name: str, alpha: float = ...) -> FloatsXd: ...
    def outer_add_act(self, a_ic: Floats2d, b_jc: Floats2d, name: str, alpha: float = ...) -> Floats3d: ...
    def activation(self, x: FloatsXd, name: str, alpha: float = ...) -> FloatsXd: ...
    def dense(
        self, x: FloatsXd, w_io: Floats2d, b_o: Floats1d | None, activation: str = ..., alpha: float = ...
    ) -> FloatsXd: ...
    def dense_weights(self, w_io: Floats2d) -> Any: ...
    def elementwise_plan(self, program: Sequence[tuple]) -> Callable[[Sequence[ArrayXd]], ArrayXd]: ...
    def elementwise_step(self, insn: tuple, values: Sequence[ArrayXd]) -> ArrayXd: ...
    def dense_chain_plan(
        self, layers: Sequence[tuple[Floats2d, Floats1d | None, str, float]]
    ) -> Callable[[FloatsXd], FloatsXd]: ...
    def softmax(self, x: FloatsXd, axis: int | tuple[int, ...] = ...) -> FloatsXd: ...
    def log_softmax(self, x: FloatsXd, axis: int | tuple[int, ...] = ...) -> FloatsXd: ...
    def batch_norm(
        self, x: FloatsXd, scale: Floats1d, shift: Floats1d, axis: int = ..., out: FloatsXd | None = ...
    ) -> FloatsXd: ...
    def layer_norm(
        self,
        x: FloatsXd,
        gamma: FloatsXd | None,
        beta: FloatsXd | None,
        epsilon: float,
        axes: tuple[int, ...] = ...,
        rms: bool = ...,
    ) -> FloatsXd: ...
    def embedding(self, ids: IntsXd, table: Floats2d) -> FloatsXd: ...
    def hsoftmax_log_probs(
        self, x: Floats2d, w_in: Floats2d, b_n: Floats1d, path_nodes: Ints2d, path_signs: Floats2d
    ) -> Floats2d: ...
    def hsoftmax_class_log_probs(
        self, x: Floats2d, w_in: Floats2d, b_n: Floats1d, path_nodes: Ints2d, path_signs: Floats2d, classes: Ints1d
    ) -> Floats1d: ...

    # convolution and pooling (NHWC activations, HWIO kernels, unless the name says NCHW)
    def conv_weights(self, w_hwio: Floats4d, groups: int = ...) -> Any: ...
    def conv2d(
        self,
        x_nhwc: Floats4d,
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Floats4d: ...
    def conv2d_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Callable[[Floats4d], Floats4d]: ...
    def conv2d_residual_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
        residual_activation: str = ...,
        residual_alpha: float = ...,
    ) -> Callable[[Floats4d, Floats4d | None], Floats4d]: ...
    def conv2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Callable[[Floats4d], Floats4d]: ...
    def conv2d_planes_plan(
        self,
        x_shape: Sequence[int],
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
        output: bool = ...,
    ) -> Callable[[Floats4d], Floats4d] | None: ...
    def conv1x1_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_oi: Floats2d,
        b: Floats1d | None,
        activation: str = ...,
        alpha: float = ...,
    ) -> Callable[[Floats4d], Floats4d] | None: ...
    def depthwise_conv2d(
        self,
        x_nhwc: Floats4d,
        w_hwcm: Floats4d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Floats4d: ...
    def conv_transpose2d(
        self,
        x_nhwc: Floats4d,
        w_hwio: Floats4d,
        b: Floats1d | None,
        strides: Pair,
        crop: Pair,
        out_hw: Pair,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Floats4d: ...
    def conv_transpose2d_nchw(
        self,
        x_nchw: Floats4d,
        w_iohw: Floats4d,
        b: Floats1d | None,
        strides: Pair,
        crop: Pair,
        out_hw: Pair,
        dilation: Pair = ...,
        groups: int = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Floats4d: ...
    def pool2d(
        self,
        x_nhwc: Floats4d,
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = ...,
        count_include_pad: bool = ...,
    ) -> Floats4d: ...
    def pool2d_nchw(
        self,
        x_nchw: Floats4d,
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = ...,
        count_include_pad: bool = ...,
    ) -> Floats4d: ...
    def pool2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        kind: str,
        pool: Pair,
        strides: Pair,
        pads: Pads2d,
        out_hw: Pair,
        dilation: Pair = ...,
        count_include_pad: bool = ...,
    ) -> Callable[[Floats4d], Floats4d]: ...
    def depthwise_conv2d_nchw(
        self,
        x_nchw: Floats4d,
        w_ohw: Floats3d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Floats4d: ...
    def depthwise_conv2d_nchw_plan(
        self,
        x_shape: Sequence[int],
        w_ohw: Floats3d,
        b: Floats1d | None,
        strides: Pair = ...,
        pads: Pads2d = ...,
        dilation: Pair = ...,
        activation: str = ...,
        alpha: float = ...,
    ) -> Callable[[Floats4d], Floats4d]: ...
    def adaptive_pool2d(self, x_nhwc: Floats4d, kind: str, out_hw: Pair) -> Floats4d: ...
    def global_pool(self, x: FloatsXd, kind: str, axes: tuple[int, ...], keepdims: bool = ...) -> FloatsXd: ...
    def roi_pool(self, x_nhwc: Floats4d, rois: Floats2d, output_size: Pair, spatial_scale: float = ...) -> Floats4d: ...
    def resize2d_taps(self, x_nhwc: Floats4d, rows: Taps, cols: Taps, bilinear: bool) -> Floats4d: ...
    def upsample2d(
        self,
        x_nhwc: Floats4d,
        out_hw: Pair,
        mode: str = ...,
        align_corners: bool = ...,
        scales: Sequence[float | None] = ...,
    ) -> Floats4d: ...
    def local_response_norm(
        self, x: FloatsXd, size: int, alpha: float = ..., beta: float = ..., k: float = ...
    ) -> FloatsXd: ...

    # attention
    def matmul(self, a: FloatsXd, b: FloatsXd, trans_b: bool = ...) -> FloatsXd: ...
    def tanh_scores(
        self, q_pqd: Floats3d, k_pkd: Floats3d, w_d: Floats1d | None, inner: float = ..., outer: float = ...
    ) -> Floats3d: ...
    def hard_attention(self, s_pqk: Floats3d, causal: bool = ...) -> Floats3d: ...
    def attention_softmax(
        self, scores_bhqk: Floats4d, scale: float, bias: FloatsXd | None, causal: bool = ..., empty: int = ...
    ) -> Floats4d: ...
    def attention(
        self,
        q_bhqd: Floats4d,
        k_bhkd: Floats4d,
        v_bhkv: Floats4d,
        scale: float,
        bias: FloatsXd | None = ...,
        causal: bool = ...,
        empty: int = ...,
        need_weights: bool = ...,
    ) -> tuple[Floats4d, Floats4d | None]: ...
    def self_attention(
        self,
        x_nle: Floats3d,
        w_qkv_io: Floats2d,
        b_qkv: Floats1d | None,
        w_o_io: Floats2d,
        b_o: Floats1d | None,
        num_heads: int,
        bias: FloatsXd | None = ...,
        empty: int = ...,
        need_weights: bool = ...,
    ) -> tuple[Floats3d, Floats4d | None]: ...
    def encoder_layer(
        self,
        x_nle: Floats3d,
        w: EncoderWeights,
        num_heads: int,
        activation: str = ...,
        norm_first: bool = ...,
        bias: FloatsXd | None = ...,
        empty: int = ...,
        need_weights: bool = ...,
    ) -> tuple[Floats3d, Floats4d | None]: ...

    # recurrent: x_bti is float32 (batch, time, input), or integer ids (batch, time) of the rows
    # of a folded embedding; y is (batch, time, units), or (batch, units) without
    # return_sequences; the states are (batch, units)
    def rnn_sequence(
        self,
        x_bti: ArrayXd,
        w_ih: Floats2d,
        w_hh: Floats2d,
        b: Floats1d | None,
        h0: Floats2d,
        *,
        activation: str = ...,
        mask_bt: Bools2d | None = ...,
        reverse: bool = ...,
        return_sequences: bool = ...,
        zero_masked: bool = ...,
        y0: Floats2d | None = ...,
    ) -> tuple[FloatsXd, Floats2d]: ...
    def lstm_sequence(
        self,
        x_bti: ArrayXd,
        w_ig: Floats2d,
        w_hg: Floats2d,
        b_g: Floats1d | None,
        h0: Floats2d,
        c0: Floats2d,
        *,
        w_hp: Floats2d | None = ...,
        activation: str = ...,
        recurrent_activation: str = ...,
        mask_bt: Bools2d | None = ...,
        reverse: bool = ...,
        return_sequences: bool = ...,
        zero_masked: bool = ...,
        y0: Floats2d | None = ...,
    ) -> tuple[FloatsXd, Floats2d, Floats2d]: ...
    def gru_sequence(
        self,
        x_bti: ArrayXd,
        w_ig: Floats2d,
        w_hg: Floats2d,
        b_ig: Floats1d | None,
        b_hg: FloatsXd | None,
        h0: Floats2d,
        *,
        reset_after: bool = ...,
        activation: str = ...,
        recurrent_activation: str = ...,
        mask_bt: Bools2d | None = ...,
        reverse: bool = ...,
        return_sequences: bool = ...,
        zero_masked: bool = ...,
        y0: Floats2d | None = ...,
    ) -> tuple[FloatsXd, Floats2d]: ...
    def run_sequence(self, cell: Cell, x_bti: ArrayXd, *args: Any, **kw: Any) -> tuple[FloatsXd, ...]: ...
    def sequence_plan(
        self, cell: Cell, x_bti: ArrayXd, args: Sequence[Any], kw: dict[str, Any]
    ) -> Callable[..., tuple[FloatsXd, ...]]: ...
    def sequences_plan(
        self, x_bti: ArrayXd, calls: Sequence[SequenceCall]
    ) -> Callable[..., list[tuple[FloatsXd, ...]]]: ...
    def recurrent_sequences(self, calls: Sequence[SequenceCall]) -> list[tuple[FloatsXd, ...]]: ...
    def native_plan(self, arena_bytes: int) -> Any: ...
    def plan_threads(self) -> int | None: ...
    def plan_refused_input(self, error: BaseException) -> bool: ...
    def plan_shapes_changed(self, error: BaseException) -> bool: ...
