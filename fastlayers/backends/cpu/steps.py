"""CpuOps' parts of native plans (``native/plan.pxi``): the plan object, and per kernel the
arguments a plan step binds once, from the weights and the shapes of one set of inputs
(``onnx/lowering.py`` lowers a model's nodes onto them).

Each function returns None where the kernel does not cover the arguments (the lowering then
runs the node in Python inside the plan), with the same terms as the cpu backend's own paths:
the weights are packed by the same functions, so a plan and the backend share one packed copy.
"""

from __future__ import annotations

from ...native import CODES, _core
from . import recurrent
from .conv import _bias, _f32c, _packed_conv

#: Activation names whose native codes run elementwise (the softmaxes normalise rows).
_ELEMENTWISE = {name: code for name, code in CODES.items() if name not in ("softmax", "log_softmax")}


def native_plan(arena_bytes: int):
    """An empty native plan over an arena of ``arena_bytes`` bytes."""
    return _core.NativePlan(arena_bytes)


def activation_code(name: str):
    """The native code of the elementwise activation ``name``, or None."""
    return _ELEMENTWISE.get(name)


def conv2d_weights(w_hwio, b, groups: int, activation: str):
    """(packed weights, bias, activation code) for ``NativePlan.add_conv2d`` of the kernel
    ``w_hwio`` (kh, kw, C / groups, C_out) in ``groups`` groups, or None where the epilogue
    has no elementwise code for ``activation``."""
    code = _ELEMENTWISE.get(activation)
    if code is None or groups < 1 or w_hwio.ndim != 4 or w_hwio.shape[3] % groups:
        return None
    wk = _f32c(w_hwio)
    return _packed_conv(wk, groups), _bias(b), code


sequence_loop = recurrent.sequence_loop
