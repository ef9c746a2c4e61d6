"""The native block arena behind a model call's arrays (``fastlayers.native.arena_*``,
arena.c): numpy's allocator handler while a call runs, blocks reused from call to call and
kept mapped whatever trims the C library's heap, merged when freed, a bounded free footprint,
threads and fork."""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import resource
import subprocess
import sys
import threading

import numpy as np
import pytest

import fastlayers
from fastlayers import native
from fastlayers.backends import get_ops
from fastlayers.native import _core

pytestmark = pytest.mark.skipif(not native.ARENA, reason="FASTLAYERS_HEAP=system")


def _handler_name(a):
    return np._core.multiarray.get_handler_name(a)


@pytest.fixture
def limit():
    """Restores the arena's limit after a test changes it."""
    before = native.arena_limit()
    yield
    native.arena_limit(before)


def test_arrays_made_in_a_call_come_from_the_arena_and_outlive_it():
    token = native.arena_enter()
    try:
        small, large = np.empty(10), np.empty(1 << 20, np.float32)
        small[:] = 1.0
        large[:] = 2.0
        inner = _handler_name(large)
    finally:
        native.arena_exit(token)
    assert inner == "fastlayers_arena" and _handler_name(np.empty(3)) != "fastlayers_arena"
    assert small.sum() == 10 and large.sum() == 2 << 20  # usable after the scope
    assert large.ctypes.data % 64 == 0
    del small, large


def test_zeros_resize_and_reuse():
    token = native.arena_enter()
    try:
        a = np.full(300_000, 7.0, np.float32)
        del a  # its dirty block goes back to the arena
        hits = native.arena_stats()["hits"]
        z = np.zeros(300_000, np.float32)  # the same block, zeroed
        assert native.arena_stats()["hits"] == hits + 1 and not z.any()
        z[:] = np.arange(300_000)
        z.resize(900_000, refcheck=False)  # grows into a new block, contents kept
        assert (z[:300_000] == np.arange(300_000)).all() and not z[300_000:].any()
        z.resize(100, refcheck=False)  # shrinks in place
        assert (z == np.arange(100)).all()
        s = np.arange(10.0)
        s.resize(200_000, refcheck=False)  # a small block grows into a mapped one
        assert (s[:10] == np.arange(10.0)).all() and not s[10:].any()
    finally:
        native.arena_exit(token)


def test_the_limit_bounds_what_stays_mapped(limit):
    native.arena_limit(3 << 20)
    token = native.arena_enter()
    try:
        blocks = [np.empty(1 << 20, np.uint8) for _ in range(8)]
        del blocks
        assert (
            native.arena_stats()["free_bytes"] <= 3 << 20 or native.arena_stats()["in_use_bytes"] > 0
        )  # a region another array holds
        native.arena_limit(0)
        stats = native.arena_stats()
        assert stats["free_bytes"] == 0 or stats["in_use_bytes"] > 0
    finally:
        native.arena_exit(token)
    with pytest.raises(ValueError, match="arena_limit"):
        native.arena_limit(-1)


def test_freed_neighbours_merge_and_the_footprint_stays_flat():
    token = native.arena_enter()
    try:
        parts = [np.empty(10 << 20, np.uint8) for _ in range(4)]
        del parts
        misses = native.arena_stats()["misses"]
        whole = np.empty(40 << 20, np.uint8)  # the four merged back into one block
        assert native.arena_stats()["misses"] == misses
        del whole
        mapped = []
        for _ in range(20):
            held = [np.empty(mib << 20, np.uint8) for mib in (3, 5, 1, 7, 2)]
            del held[1], held[2]
            held.append(np.empty(6 << 20, np.uint8))
            del held
            mapped.append(native.arena_stats()["mapped_bytes"])
        assert len(set(mapped[1:])) == 1  # no growth from call to call
    finally:
        native.arena_exit(token)


def test_release_unmaps_free_regions():
    token = native.arena_enter()
    try:
        a = np.empty(2 << 20, np.uint8)
    finally:
        native.arena_exit(token)
    del a
    before = native.arena_stats()
    released = native.arena_release()
    after = native.arena_stats()
    assert released >= 0 and after["mapped_bytes"] == before["mapped_bytes"] - released
    assert after["mapped_bytes"] == after["in_use_bytes"] + after["free_bytes"]
    if after["in_use_bytes"] == 0:
        assert after["mapped_bytes"] == 0


def test_threads_share_the_arena_safely():
    before = native.arena_stats()["in_use_bytes"]
    errors = []

    def work(seed):
        token = native.arena_enter()
        try:
            rng = np.random.default_rng(seed)
            for _ in range(200):
                n = int(rng.integers(1, 400_000))
                a = np.full(n, seed, np.int32)
                if not (a == seed).all():
                    errors.append(seed)
        finally:
            native.arena_exit(token)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert native.arena_stats()["in_use_bytes"] == before


def _conv_model():
    """A two-convolution ONNX model whose intermediates are a few MiB each, on its Python plan
    (whose nodes allocate from the arena per call; a native plan holds its own buffers)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "arena",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 160, 160])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return fastlayers.load(model.SerializeToString(), options=fastlayers.LoadOptions(native_plans=False))


def _faults_after_trims(model, x, expected):
    """Page faults of each of 3 calls, the C library's heap trimmed before each."""
    libc, faults = ctypes.CDLL(None), []
    for _ in range(3):
        libc.malloc_trim(0)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = model.run(None, {"x": x})[0]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        np.testing.assert_array_equal(y, expected)
        del y
    return min(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_calls_reuse_blocks_when_the_heap_is_trimmed(limit):
    """Between calls, something else in the process trims the C library's heap (as another
    engine's frees do): the next call still reuses the arena's mapped blocks. Without them
    (limit 0: free regions unmapped) it faults its 3-4 MiB of intermediates in again."""
    if get_ops().name != "cpu":
        pytest.skip("the cpu backend's calls")
    # models of earlier tests not yet collected (reference cycles) may still hold blocks of an
    # arena region, which limit 0 then keeps mapped: their pages would serve this model's calls
    gc.collect()
    model = _conv_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 160, 160)).astype(np.float32)
    expected = model.run(None, {"x": x})[0]
    misses = native.arena_stats()["misses"]
    cached = _faults_after_trims(model, x, expected)
    assert native.arena_stats()["misses"] == misses  # every large block reused
    native.arena_limit(0)
    uncached = _faults_after_trims(model, x, expected)
    assert uncached > 600 and cached < uncached / 3, (cached, uncached)


def test_reference_backend_calls_use_numpy_allocator():
    ops = get_ops("reference")
    assert ops.enter_call() is None
    ops.exit_call(None)


_FORKED = """
import os, numpy as np, fastlayers.native as n
t = n.arena_enter(); a = np.ones(1 << 20); n.arena_exit(t); del a
pid = os.fork()
if pid == 0:
    t = n.arena_enter(); b = np.full(1 << 20, 3.0); ok = b.sum() == 3 << 20; del b
    n.arena_exit(t); os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), n.ARENA)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_allocates_from_its_copy():
    proc = subprocess.run([sys.executable, "-c", _FORKED], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "True"]


def test_system_heap_turns_the_arena_off():
    code = "import fastlayers.native as n; print(n.ARENA, n.arena_enter())"
    env = dict(os.environ, FASTLAYERS_HEAP="system")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "None"]


def test_stats_name_their_counters():
    assert set(_core.arena_stats()) == {"free_bytes", "free_blocks", "hits", "misses", "in_use_bytes", "mapped_bytes"}
