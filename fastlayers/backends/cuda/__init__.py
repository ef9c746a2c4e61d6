"""The CUDA backend: ``CudaOps`` runs the hot primitives as numba.cuda kernels (numba-cuda).

Loaded only through ``fastlayers.use_ops("cuda")`` / ``get_ops("cuda")`` / ``model.to("cuda")``;
``import fastlayers`` and the CPU backends never import ``numba.cuda``. Install with
``pip install 'fastlayers[cuda]'``. Without a GPU, ``NUMBA_ENABLE_CUDASIM=1`` (set before numba
is imported) runs the same kernels in numba's CUDA simulator.
"""

from __future__ import annotations

from .runtime import require_numba_cuda

require_numba_cuda()  # before the kernel modules import numba

from .ops import CudaOps  # noqa: E402

__all__ = ["CudaOps"]
