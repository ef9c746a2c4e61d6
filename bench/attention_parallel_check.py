"""Why the attention softmax kernel is serial: matmul -> softmax -> matmul with a prange kernel vs
the serial one, interleaved, 2 threads (see docs/design.md). Run: python bench/attention_parallel_check.py"""
import numpy as np, time, fastlayers, numba, os
from numba import prange
fastlayers.set_num_threads(2)
from fastlayers.backends._jit import njit, apply_num_threads
from fastlayers.backends.cpu._attention import attention_softmax_bhqk as ser, _row_max, exp_inplace, _ZERO, _ONE
@njit(parallel=True)
def par(s_bhqk, scale):
    nb, nh, tq, tk = s_bhqk.shape
    for bhi in prange(nb * nh):
        b = bhi // nh
        h = bhi - b * nh
        bits = np.empty(tk, dtype=np.int32)
        for i in range(tq):
            row = s_bhqk[b, h, i]
            for j in range(tk):
                row[j] = row[j] * scale
            m = _row_max(row)
            for j in range(tk):
                row[j] -= m
            exp_inplace(row, bits)
            total = _ZERO
            for j in range(tk):
                total += row[j]
            inv = _ONE / total
            for j in range(tk):
                row[j] *= inv
E4=np.zeros((0,0,0,0),np.float32)
rng=np.random.default_rng(0)
N,L,H,hd=8,128,4,64
qkv=rng.standard_normal((N,L,3,H,hd)).astype(np.float32)
q,k,v=(qkv[:,:,i].transpose(0,2,1,3) for i in range(3))
apply_num_threads()
def run(kind):
    s=np.matmul(q, np.swapaxes(k,-1,-2))
    if kind=="par": par(s, np.float32(0.125))
    else: ser(s, np.float32(0.125), E4, False, 0)
    return np.matmul(s, v)
run("par"); run("ser")
res={"par":[], "ser":[]}
for _ in range(40):
    for kind in ("par","ser"):
        t0=time.perf_counter(); run(kind); res[kind].append(time.perf_counter()-t0)
for kind,ts in res.items():
    ts=np.array(ts)*1e3; print(kind, "min %.2f median %.2f ms" % (ts.min(), np.median(ts)))
