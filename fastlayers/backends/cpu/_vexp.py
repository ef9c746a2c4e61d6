"""A float32 exp that LLVM vectorizes (no libm call per element).

exp(x) = 2^n e^r with n = floor(x log2 e) and r = x - n ln2 (Cody-Waite split); e^r = 2^f with
f = r log2 e in [0, 1) from a degree-6 polynomial fitted for relative error (8e-8 in float32);
2^n is built in the exponent bits of an int32 scratch row read back as float32. Results below
2^-126 flush to 0, above float32's range give inf, NaN stays NaN.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_V_LO = np.float32(-88.0)  # floor(v log2 e) = -127: 2^n underflows to 0
_V_HI = np.float32(88.8)  # above 128 ln2: 2^n overflows to inf
_BIAS = np.int32(127)
_C0 = np.float32(1.0)
_C1 = np.float32(0.6931470422926238)
_C2 = np.float32(0.24022932514641382)
_C3 = np.float32(0.05548522015628562)
_C4 = np.float32(0.009675532627369398)
_C5 = np.float32(0.0012467376378060345)
_C6 = np.float32(0.00021613808250707831)


@njit(inline=True)
def exp_inplace(row, bits):
    """row[j] = exp(row[j]); ``bits`` is an int32 scratch row at least as long as ``row``."""
    n = row.shape[0]
    for j in range(n):
        v = row[j]
        v = _V_LO if v < _V_LO else (_V_HI if v > _V_HI else v)
        k = np.floor(v * _LOG2E)
        f = ((v - k * _LN2_HI) - k * _LN2_LO) * _LOG2E
        row[j] = _C0 + f * (_C1 + f * (_C2 + f * (_C3 + f * (_C4 + f * (_C5 + f * _C6)))))
        bits[j] = (np.int32(k) + _BIAS) << 23
    scale = bits[:n].view(np.float32)
    for j in range(n):
        row[j] *= scale[j]
