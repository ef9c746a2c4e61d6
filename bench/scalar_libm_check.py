"""Numba loops calling math.exp / math.tanh (scalar libm) vs numpy SIMD ufuncs; see docs/design.md.

Run: python bench/scalar_libm_check.py
"""
import math, time
import numba, numpy as np
@numba.njit(fastmath={"nsz","arcp","contract","afn","reassoc"})
def exp_loop(x, out):
    for i in range(x.size): out.flat[i] = math.exp(x.flat[i])
@numba.njit(fastmath={"nsz","arcp","contract","afn","reassoc"})
def tanh_loop(x, out):
    for i in range(x.size): out.flat[i] = math.tanh(x.flat[i])
x = (np.random.default_rng(0).standard_normal((64, 1024)) * 3).astype(np.float32); out = np.empty_like(x)
def t(f):
    f(); s = time.perf_counter()
    for _ in range(100): f()
    return (time.perf_counter() - s) / 100 * 1e6
print(f"exp: numba libm loop {t(lambda: exp_loop(x, out)):.1f} us, numpy {t(lambda: np.exp(x, out=out)):.1f} us")
print(f"tanh: numba libm loop {t(lambda: tanh_loop(x, out)):.1f} us, numpy {t(lambda: np.tanh(x, out=out)):.1f} us")
print("numba SVML:", numba.config.USING_SVML)
