"""fastlayers' compiled CPU core (``_core``, built at install from ``native/*.c``).

The kernels run on the best ISA path this CPU has (AVX-512F, AVX2+FMA or portable C), chosen
at import; ``FASTLAYERS_ISA=avx512|avx2|generic`` forces one (an error when this CPU cannot
run it) and ``set_isa`` switches at run time (the tests run every path this way).
"""

from __future__ import annotations

import os

try:
    from . import _core
except ImportError as e:  # a source tree whose extension was never built
    from ..errors import native_core_missing

    raise ImportError(native_core_missing(os.path.dirname(os.path.dirname(__file__)))) from e

from ._core import (ACTIVATIONS, NativeError, best_isa, get_num_threads, isa, isa_runs,  # noqa: F401
                    isas, set_isa, set_num_threads)

#: Activation name -> code of the native kernels.
CODES = {name: code for code, name in enumerate(ACTIVATIONS)}


def available_isas() -> list[str]:
    """The ISA paths this CPU can run, best first."""
    return [name for name in isas() if isa_runs(name)]


_forced = os.environ.get("FASTLAYERS_ISA", "").strip().lower()
if _forced:
    try:
        set_isa(_forced)
    except ValueError as e:
        raise ImportError(f"FASTLAYERS_ISA={_forced!r}: {e}") from None
else:
    set_isa(best_isa())
