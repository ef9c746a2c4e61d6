"""Shared fixtures: the framework oracles (keras on the torch backend, torch, onnxruntime).

An interop test asks for its oracle through ``oracle("torch")`` or the ``keras``/``torch``
fixtures. When the oracle is not installed the test is skipped, unless
FASTLAYERS_REQUIRE_ORACLES=1 (set by .ci/run), where it fails: CI must never pass by skipping.
The cuda backend's tests need numba-cuda, which the test extra leaves out: they skip without it
and run with ``pip install -e ".[test,cuda]"`` (the README's CUDA test line, which .ci/run runs).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

#: Skips a cuda backend test file where numba-cuda is not installed.
needs_numba_cuda = pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda") is None,
    reason="numba-cuda not installed: the cuda backend's tests run after "
    'pip install -e ".[test,cuda]" (README, Development)',
)


def oracle(module: str):
    """Import a reference framework, or skip (fail under FASTLAYERS_REQUIRE_ORACLES=1)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("FASTLAYERS_REQUIRE_ORACLES") == "1":
            pytest.fail(f"oracle {module!r} is required (FASTLAYERS_REQUIRE_ORACLES=1) but missing: {e}")
        pytest.skip(f"oracle {module!r} not installed")


@pytest.fixture(scope="session")
def keras():
    k = oracle("keras")
    if k.backend.backend() != "torch":
        pytest.fail(f"keras must run on the torch backend, got {k.backend.backend()}")
    return k


@pytest.fixture(scope="session")
def torch():
    t = oracle("torch")
    t.set_num_threads(1)
    return t


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


#: The cuda backend under numba-cuda's simulator joins the ``backend`` fixture when the run asks
#: for the simulator (NUMBA_ENABLE_CUDASIM=1, set before numba is imported) and numba-cuda is
#: installed: README's CUDA test line selects those cases with ``-k cuda``.
CUDA_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and importlib.util.find_spec("numba_cuda") is not None


@pytest.fixture(params=["reference", "cpu", *(["cuda"] if CUDA_SIMULATOR else [])])
def backend(request):
    """Run the test once per backend: reference, cpu, and cuda under the CUDA simulator."""
    import fastlayers

    with fastlayers.use_ops(request.param):
        yield request.param


@pytest.fixture(params=["best", *__import__("fastlayers.native", fromlist=["x"]).available_isas()[1:]])
def isa(request):
    """Run the test once per ISA path of the native core this CPU can execute (the best one,
    then each lesser one, forced with ``set_isa``)."""
    from fastlayers import native

    best = native.isa()
    if request.param != "best":
        native.set_isa(request.param)
    try:
        yield native.isa()
    finally:
        native.set_isa(best)


@pytest.fixture
def threads(request):
    """The native pool at ``request.param`` threads for the test (indirect parametrization),
    restored afterwards."""
    from fastlayers import native

    before = native.get_num_threads()
    native.set_num_threads(request.param)
    yield request.param
    native.set_num_threads(before)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, what=""):
    """float32 comparison at the project's per-op tolerance."""
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol, err_msg=what
    )


def assert_close_to_scale(actual, expected, rel=1e-5, what=""):
    """float32 comparison at the per-op tolerance taken against the output's scale: every
    element within ``rel`` of the largest expected magnitude (for kernels that reorder sums
    through transforms, such as Winograd F(4x4, 3x3), whose error follows the operands' scale,
    not each output's)."""
    expected = np.asarray(expected, np.float64)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=0, atol=rel * max(scale, 1e-30), err_msg=what
    )


def random_torch_module(torch, module_class, scale=0.3):
    """``module_class()`` in eval mode with every parameter drawn from N(0, scale^2) (seed 0)."""
    torch.manual_seed(0)
    module = module_class().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, scale)
    return module


def set_random_weights(model, rng, scale=0.3):
    """``model`` (a fastlayers Model) with every weight drawn from N(0, scale^2), a
    BatchNormalization's made positive (|w| + 0.5: a variance must be); returns ``model``."""
    from fastlayers.layers import BatchNormalization

    for layer in model.layers:
        weights = [rng.standard_normal(w.shape).astype(np.float32) * scale for w in layer.get_weights()]
        if isinstance(layer, BatchNormalization):
            weights = [np.abs(w) + 0.5 for w in weights]
        if weights:
            layer.set_weights(weights)
    return model


def in_threads(work, count):
    """Run ``work(i)`` for i < ``count``, each in its own Python thread, all at once; the first
    exception a thread raised is raised again here."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - raised again below
            errors.append(e)

    workers = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
