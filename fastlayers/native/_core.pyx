# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""fastlayers' compiled CPU core: the kernels of ``native/*.c`` for the ISA chosen at import,
and the thread pool. Every function releases the GIL for the whole native call.

Array arguments are float32 numpy arrays whose last axis is contiguous (2-D operands may
have any row stride: a view of a wider array is read in place); the callers in
``fastlayers.backends.cpu`` check shapes before calling.
"""

cimport numpy as cnp
from libc.stdint cimport int64_t

import numpy as np

cnp.import_array()

include "core.pxi"
include "gemm.pxi"
include "rows.pxi"
include "layout.pxi"
include "attention.pxi"
include "pool.pxi"
include "conv.pxi"
include "recurrent.pxi"
include "qgemm.pxi"
include "qlstm.pxi"
include "quantize.pxi"
include "elementwise.pxi"
include "plan.pxi"
