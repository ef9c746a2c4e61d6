"""Type and lower every CUDA kernel for the real CUDA target (no GPU, driver or NVVM needed).

The simulator runs kernels as Python, so it cannot catch a typing or lowering error of the real
target (or a float64 operation slipping into a float32 kernel). This script compiles each kernel
to LLVM IR for the argument types ``CudaOps`` launches it with, and checks that the IR has no
double-precision values. Run by tests/model/test_cuda_backend.py in a subprocess (it must import
numba.cuda without the simulator, and it stands in a compute capability for the absent device).
"""

import sys
import types

import numba.cuda.dispatcher as dispatcher
from numba.core import types as T
from numba.cuda import compiler

# device functions (``act``) ask the current device for its compute capability while typing
dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))

from fastlayers.backends.cuda import kernels as K  # noqa: E402
from fastlayers.backends.cuda import strided_kernels as S  # noqa: E402

f1, f2, f3, f4 = (T.Array(T.float32, n, "C") for n in (1, 2, 3, 4))
l1, l2 = (T.Array(T.int64, n, "C") for n in (1, 2))
u1, u2 = (T.Array(T.uint8, n, "C") for n in (1, 2))
t6 = T.UniTuple(T.int64, 6)
i, b, f, u = T.int64, T.boolean, T.float32, T.uint8
# one signature per kernel, or a list of them for kernels launched on several dtypes
SIGNATURES = {
    "bmm_tiled": (f3, f3, f3, b),
    "mm_bias_act": (f2, f2, f1, b, i, f, f2),
    "bias_act_rows": (f2, f1, b, i, f),
    "softmax_rows": (f2, b),
    "act_rows": (f2, f2, i, f),
    "softmax_oni": (f3, b),
    "relu_flat": (f1, f1, f, f, f, b),
    "conv2d_nhwc": (f4, f4, f1, b, f4, i, i, i, i, i, i, i, i, f),
    "pool2d_nhwc": (f4, f4, b, i, i, i, i, i, i, i, i, i, i, b),
    "conv_transpose2d_nhwc": (f4, f4, f1, b, f4, i, i, i, i, i, i, i, i, f),
    "upsample2d_nhwc": (f4, f4, b, b, f, f),
    "lrn_rows": (f2, f2, i, f, f, f),
    "roi_pool_nhwc": (f4, f2, f, f4, f1),
    "attention_softmax_bhqk": (f4, f4, b, f, b, f),
    "tanh_scores": (f3, f3, f1, b, f, f, f3),
    "hard_attention_rows": (f3, b, f3),
    "rnn_gates": (f3, i, f2, f2, i),
    "lstm_gates": (f3, i, f2, f2, f2, u2, b, i, i),
    "gru_gates_after": (f3, i, f2, f1, b, f2, f2, i, i),
    "gru_zr_before": (f3, i, f2, f2, f2, f2, i),
    "gru_cand_before": (f3, i, f2, f2, f2, f2, i),
    "commit_step": (f2, f2, f2, f3, i, i, u2, b, b),
    "scale_shift_oci": (f3, f1, f1, f3),
    "layer_norm_rows": (f2, f1, b, f1, b, f, b, f2),
    "global_pool_nhwc": (f3, f2, b),
    "copy_strided": [(f1, i, t6, f1, i, t6, t6), (l1, i, t6, f1, i, t6, t6), (u1, i, t6, f1, i, t6, t6)],
    "binary_strided": (f1, i, t6, f1, i, t6, f1, t6, i, f, f),
    "fill_flat": (f1, f),
    "nonzero_u8": [(l1, i, u1), (f1, f, u1)],
    "keep_bias_strided": [(f1, i, t6, f, f1, t6), (l1, i, t6, i, f1, t6), (u1, i, t6, u, f1, t6)],
    "keep_f32": [(f1, f, f1), (l1, i, f1), (u1, u, f1)],
    "check_range": (l1, i, f1),
    "whole_floats_to_int64": (f1, l1, f1),
    "gather_rows": (l1, f2, f2, f1),
    "hsoftmax_rows": (f2, l2, f2, f2),
    "hsoftmax_class_rows": (f2, l2, f2, l1, f1, f1),
}

failures = []
#: Kernel name -> its dispatcher, from both kernel modules.
DISPATCHERS = {
    n: getattr(m, n)
    for m in (K, S)
    for n in dir(m)
    if hasattr(getattr(m, n), "py_func") and not getattr(m, n).targetoptions.get("device")
}
kernels = set(DISPATCHERS)
missing = kernels - set(SIGNATURES)
if missing:
    failures.append(f"kernels without a signature here: {sorted(missing)}")
count = 0
for name, sigs in SIGNATURES.items():
    for sig in sigs if isinstance(sigs, list) else [sigs]:
        count += 1
        try:
            cres = compiler.compile_cuda(DISPATCHERS[name].py_func, T.void, sig, cc=(8, 0))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"{name}{sig}: {type(e).__name__}: {' '.join(str(e).split())[:500]}")
            continue
        ir = "\n".join(lib.get_llvm_str() for lib in [cres.library] + list(cres.library._linking_libraries))
        if "double" in ir:
            failures.append(f"{name}{sig}: float64 in the IR")
print(f"{len(SIGNATURES)} kernels lowered ({count} signatures); failures: {failures}")
sys.exit(1 if failures else 0)
