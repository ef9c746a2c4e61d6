"""The native integer kernels, as the ops interface offers them (``Ops.integer``).

Quantized ONNX graphs (``onnx/quant.py``, ``qlinear.py``, ``qlstm.py``, ``qfusion.py``) run their
integer products on these where the active backend has them, and in numpy where its ``integer`` is
None (the reference backend): they reach the native core only through ``get_ops().integer``.
"""

from __future__ import annotations

from ..native import _core


class IntegerKernels:
    """The integer kernels of ``native/quantize.c``, ``qgemm.c`` and ``qlstm.c`` (their argument
    lists are documented in ``native/quantize.pxi``, ``qgemm.pxi`` and ``qlstm.pxi``)."""

    #: y = saturate(round(x / scale) + zero_point) as uint8 or int8, per tensor.
    quantize = staticmethod(_core.quantize)
    #: y = (clip(round(x / scale) + zero_point, lo, hi) - zero_point) * scale, as float32.
    fake_quantize = staticmethod(_core.fake_quantize)
    #: (x as uint8, scale, zero point) over the range [min(x, 0), max(x, 0)].
    dynamic_quantize = staticmethod(_core.dynamic_quantize)
    #: B (k, n) uint8/int8 packed once for ``qgemm``/``qconv``, its column zero points folded in.
    qpack = staticmethod(_core.qpack)
    #: c = (a - za) @ (b - zb), int32 or requantized to uint8/int8.
    qgemm = staticmethod(_core.qgemm)
    #: y = float(dynamic_quantize(x) @ b) * (b_columns * x's scale) (+ bias), in one call.
    dynamic_qgemm = staticmethod(_core.dynamic_qgemm)
    #: the integer convolution of NHWC uint8 x with packed weights, as ``qgemm`` per window.
    qconv = staticmethod(_core.qconv)
    #: one direction of an int8 LSTM's time loop over projected inputs.
    qlstm = staticmethod(_core.qlstm)
    #: several ``qlstm`` directions/layers in one call.
    qlstm_runs = staticmethod(_core.qlstm_runs)
    #: one direction from its float input: ``dynamic_qgemm`` by W, then ``qlstm``, in one call.
    dynamic_qlstm = staticmethod(_core.dynamic_qlstm)


#: The one instance the backends that run on the native core offer.
INTEGER_KERNELS = IntegerKernels()
