"""Window and padding arithmetic of convolutions and pools, one spatial axis at a time: the one
place that layers (Keras), nn (torch), onnx and the kernels take it from.

A window of ``k`` taps at dilation ``d`` spans ``(k - 1) d + 1`` cells. Over ``size`` cells padded
by ``(before, after)`` at stride ``s`` it has ``(size + before + after - (k - 1) d - 1) // s + 1``
positions; with ``ceil`` (torch's and ONNX's ``ceil_mode``) the division rounds up, but the last
window must still start inside the input or the before padding.
"""

from __future__ import annotations

from typing import overload


def dilated_size(k: int, d: int = 1) -> int:
    """Cells a window of ``k`` taps at dilation ``d`` spans: (k - 1) d + 1."""
    return (k - 1) * d + 1


def padded_span(size: int, k: int, d: int, pads: tuple[int, int]) -> int:
    """Cells of the padded axis beyond the first window: size + before + after - (k - 1) d - 1;
    negative when the window does not fit."""
    return size + pads[0] + pads[1] - dilated_size(k, d)


@overload
def window_out(
    size: int, k: int, s: int = 1, d: int = 1, pads: tuple[int, int] = (0, 0), ceil: bool = False
) -> int: ...
@overload
def window_out(
    size: None, k: int, s: int = 1, d: int = 1, pads: tuple[int, int] = (0, 0), ceil: bool = False
) -> None: ...
def window_out(
    size: int | None, k: int, s: int = 1, d: int = 1, pads: tuple[int, int] = (0, 0), ceil: bool = False
) -> int | None:
    """Window positions along an axis of ``size`` cells (None when ``size`` is unknown); <= 0
    (floor) when the window does not fit, which callers check (``padded_span``)."""
    if size is None:
        return None
    span = padded_span(size, k, d, pads)
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + pads[0]:
        out -= 1  # the last window would start in the after padding
    return out


def window_out_2d(
    hw: tuple[int, int], khw: tuple[int, int], strides=(1, 1), dilation=(1, 1), pads=((0, 0), (0, 0))
) -> tuple[int, int]:
    """``window_out`` along both axes of a 2-D window: (rows, columns) of window positions."""
    return (
        window_out(hw[0], khw[0], strides[0], dilation[0], tuple(pads[0])),
        window_out(hw[1], khw[1], strides[1], dilation[1], tuple(pads[1])),
    )


def transposed_out(
    size: int, k: int, s: int = 1, d: int = 1, pads: tuple[int, int] = (0, 0), output_padding: int = 0
) -> int:
    """Length of a transposed window op (the gradient of ``window_out``): (size - 1) s - before -
    after + (k - 1) d + 1 + output_padding."""
    return (size - 1) * s - pads[0] - pads[1] + dilated_size(k, d) + output_padding


def _split(total: int, lower: bool) -> tuple[int, int]:
    small, big = total // 2, total - total // 2
    return (big, small) if lower else (small, big)


def same_pads(size: int, k: int, s: int = 1, d: int = 1, lower: bool = False) -> tuple[int, int]:
    """'same' padding (Keras/TensorFlow, ONNX SAME_UPPER): ceil(size / s) outputs, total padding
    max((out - 1) s + (k - 1) d + 1 - size, 0), the odd cell after (before with ``lower``, ONNX
    SAME_LOWER)."""
    out = -(-size // s)
    return _split(max((out - 1) * s + dilated_size(k, d) - size, 0), lower)


def same_pads_stride1(k: int, d: int = 1) -> tuple[int, int]:
    """'same' padding at stride 1, (k - 1) d in all whatever the size (torch's padding='same');
    equal to ``same_pads(size, k, 1, d)``."""
    return _split((k - 1) * d, False)


def causal_pads(k: int, d: int = 1) -> tuple[int, int]:
    """Keras's 'causal' padding: (k - 1) d cells before, none after."""
    return (k - 1) * d, 0
