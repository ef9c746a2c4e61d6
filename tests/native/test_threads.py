"""The native core's thread pool (threadpool.c): shared work gives the serial result, calls
from several Python threads at once stay correct (one holds the pool, the others run on their
own thread), a forked child creates its own workers, and the GIL is released during a call."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fastlayers
from fastlayers.errors import InputError
from fastlayers.native import CODES, _core


@pytest.fixture
def two_threads():
    before = _core.get_num_threads()
    fastlayers.set_num_threads(2)
    yield
    fastlayers.set_num_threads(before)


def _product(seed, m=300, k=200, n=170):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b, a.astype(np.float64) @ b


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("m", [1, 63, 64, 1001])
def test_shared_work_equals_the_serial_result(threads, m):
    """Row shares (64 rows or more) and column shares at any thread count give exactly the
    single-threaded result (each output is computed by one tile either way)."""
    a, b, _ = _product(0, m=m)
    before = _core.get_num_threads()
    try:
        fastlayers.set_num_threads(1)
        serial = _core.matmul(a, b, np.empty((m, b.shape[1]), np.float32), code=CODES["relu"])
        fastlayers.set_num_threads(threads)
        shared = _core.matmul(a, b, np.empty((m, b.shape[1]), np.float32), code=CODES["relu"])
    finally:
        fastlayers.set_num_threads(before)
    np.testing.assert_array_equal(shared, serial)


def test_concurrent_calls_from_python_threads(two_threads):
    """Eight Python threads call products at once, 20 times each: every result is right."""
    cases = [_product(seed) for seed in range(8)]
    errors = []

    def work(i):
        a, b, expected = cases[i]
        for _ in range(20):
            out = _core.matmul(a, b, np.empty((a.shape[0], b.shape[1]), np.float32))
            if not np.allclose(out, expected, rtol=1e-4, atol=1e-3):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def _let_back_off_run_out():
    """A call that waited for a descheduled worker (more threads than free CPUs, a busy host)
    makes the pool run calls serially for up to 640 ms, without resizing it: tests that check
    the pool's size after a call wait that out first."""
    time.sleep(0.7)


def _child_product(queue):
    a, b, expected = _product(3, m=2000)
    out = _core.matmul(a, b, np.empty((2000, b.shape[1]), np.float32))
    queue.put((bool(np.allclose(out, expected, rtol=1e-4, atol=1e-3)), _core.pool_workers(), _core.pool_generation()))


def test_forked_child_runs_on_its_own_workers(two_threads):
    """A child forked after the parent used its pool (gunicorn --preload, multiprocessing)
    creates workers of its own at its first parallel call and gets the right result."""
    a, b, _ = _product(1, m=2000)
    _let_back_off_run_out()
    _core.matmul(a, b, np.empty((2000, b.shape[1]), np.float32))
    assert _core.pool_workers() == 1
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_product, args=(queue,))
    child.start()
    ok, workers, generation = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert ok and workers == 1 and generation == 1


def test_calls_release_the_gil(two_threads):
    """A Python thread keeps running while another thread is inside a long native call."""
    a, b, _ = _product(2, m=3000, k=512, n=512)
    out = np.empty((3000, 512), np.float32)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    start = time.perf_counter()
    for _ in range(5):
        _core.matmul(a, b, out)
    end = time.perf_counter()
    done.set()
    t.join()
    assert len([x for x in ticks if start < x < end]) >= 3


def test_set_num_threads_rejects_bad_counts():
    with pytest.raises(ValueError):
        fastlayers.set_num_threads(0)
    with pytest.raises(ValueError):
        _core.set_num_threads(0)


@pytest.fixture
def idle_spin():
    before = fastlayers.get_idle_spin()
    yield
    fastlayers.set_idle_spin(before)


def _cpu_while_idle(seconds: float) -> float:
    """CPU seconds this process burns in ``seconds`` of sleep right after a parallel call."""
    a = np.ones((512, 256), np.float32)  # not _product: numpy's own product leaves BLAS threads spinning
    _core.pool_clear_backoff()  # an earlier stall (a busy machine) would run the call serially
    _core.matmul(a, a[:256], np.empty((512, 256), np.float32))
    cpu = time.process_time()
    time.sleep(seconds)
    return time.process_time() - cpu


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs for a worker to spin beside the caller")
def test_idle_spin_keeps_the_workers_polling_after_a_call(two_threads, idle_spin):
    """With a long idle spin the worker burns CPU through the caller's sleep (all of it on a
    quiet machine, half beside a busy process); with none it sleeps at once (a call before
    each measurement starts the pool)."""
    fastlayers.set_idle_spin(0.2)
    spinning = _cpu_while_idle(0.1)
    fastlayers.set_idle_spin(0.0)
    _cpu_while_idle(0.01)  # a worker spinning from before goes to sleep after this call
    sleeping = _cpu_while_idle(0.1)
    assert spinning > 0.03, spinning
    assert sleeping < 0.02, sleeping


def _workers() -> list[int]:
    """Thread ids of the pool's workers (named "fastlayers")."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "fastlayers":
                    tids.append(int(tid))
        except OSError:  # a thread that ended meanwhile
            pass
    return tids


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs this process may run on",
)
def test_workers_woken_beside_a_pinned_caller_keep_their_cpus(two_threads, idle_spin):
    """Calls from a thread pinned to one CPU, each waking the sleeping workers (the caller's
    CPU taken out of their affinity before the wake, restored by each once it runs): the
    results are right, the workers are named "fastlayers", and each one's affinity is the
    process's whole set afterwards."""
    allowed = os.sched_getaffinity(0)
    a, b, expected = _product(3)
    for _ in range(3):  # the workers exist and have named themselves
        _core.matmul(a, b, np.empty((a.shape[0], b.shape[1]), np.float32))
    time.sleep(0.01)
    fastlayers.set_idle_spin(0.0)  # ... and sleep after each call
    workers = _workers()
    assert workers
    results = []

    def calls():
        os.sched_setaffinity(0, {min(allowed)})  # this thread only
        for _ in range(20):
            time.sleep(0.002)
            results.append(_core.matmul(a, b, np.empty((a.shape[0], b.shape[1]), np.float32)))

    thread = threading.Thread(target=calls)
    thread.start()
    thread.join()
    assert len(results) == 20
    for y in results:
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-3)
    assert all(os.sched_getaffinity(t) == allowed for t in workers)


def _wakes(tid: int) -> int:
    """Times the thread ``tid`` gave up its CPU of its own accord (a sleep on the pool's wake)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def _wait_asleep(tid: int, seconds: float = 2.0) -> None:
    """Wait up to ``seconds`` for the thread ``tid`` to sleep (state S: a woken worker beside a
    busy process may still be waiting for a CPU, or polling, after the caller's pause)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/self/task/{tid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "S":
                return
        time.sleep(0.002)


def _woken_since(tid: int, before: int, seconds: float = 2.0) -> bool:
    """Whether the thread ``tid`` slept again (so was woken) since its count was ``before``,
    waiting up to ``seconds`` for it (beside a busy process a woken worker may wait for a CPU)."""
    deadline = time.monotonic() + seconds
    while _wakes(tid) == before and time.monotonic() < deadline:
        time.sleep(0.005)
    return _wakes(tid) > before


def _small_products_after_a_sleep(spin: float, pause: float):
    """With the workers' idle spin ``spin`` s: a 512 x 512 product (which wakes the one
    worker), a ``pause`` (it falls asleep), then 50 products of 1 x 512 x 214 back to back,
    each checked; (the worker's thread id, its wakes before the small products, the big
    product's operands and result), read ``pause`` after the last small one."""
    fastlayers.set_idle_spin(spin)
    big_a, big_b, big_want = _product(4, m=512, k=512, n=512)
    small_a, small_b, small_want = _product(5, m=1, k=512, n=214)
    _core.pool_clear_backoff()
    _core.matmul(big_a, big_b, np.empty((512, 512), np.float32))
    time.sleep(pause)
    workers = _workers()
    assert len(workers) == 1
    _wait_asleep(workers[0])
    before = _wakes(workers[0])
    for _ in range(50):
        y = _core.matmul(small_a, small_b, np.empty((1, 214), np.float32))
        np.testing.assert_allclose(y, small_want, rtol=1e-4, atol=1e-3)
    time.sleep(pause)
    return workers[0], before, (big_a, big_b, big_want)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs this process may run on",
)
def test_small_products_leave_a_sleeping_worker_asleep(two_threads, idle_spin):
    """Workers that sleep (no idle spin) are woken by a product worth a second thread, not by
    ones smaller than what the wake costs (``GEMM_WAKE_FLOPS``: a 1 x 512 x 214 product runs on
    the caller alone; with no spin they never add up to a burst), and both give the serial
    result."""
    worker, before, (big_a, big_b, big_want) = _small_products_after_a_sleep(0.0, 0.01)
    assert _wakes(worker) == before
    _core.pool_clear_backoff()  # the first big product may have waited for a descheduled worker
    np.testing.assert_allclose(
        _core.matmul(big_a, big_b, np.empty((512, 512), np.float32)), big_want, rtol=1e-4, atol=1e-3
    )
    assert _woken_since(worker, before)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs this process may run on",
)
def test_a_burst_of_small_products_wakes_a_sleeping_worker(two_threads, idle_spin):
    """Small products back to back (each within the workers' spin time of the last) add up to
    a wake's worth and wake the sleeping worker, which then polls for the rest of the burst:
    a tiny model called in a loop keeps its second thread."""
    worker, before, _ = _small_products_after_a_sleep(0.005, 0.05)
    assert _woken_since(worker, before)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("n", "grain"), [(0, 1), (1, 1), (7, 1), (16, 1), (1000, 3), (1000, 400)])
def test_each_unit_of_a_parallel_call_runs_once(threads, n, grain):
    """Every unit of a call is run, once, by the caller or one of its workers, whichever span
    of chunks it lies in and whoever takes it (threads beyond the CPUs included)."""
    before = _core.get_num_threads()
    try:
        fastlayers.set_num_threads(threads)
        for _ in range(3):
            owners = _core.parallel_owners(n, grain, 2e-6)
            assert owners.shape == (n,)
            assert ((owners >= 0) & (owners < threads)).all(), owners
    finally:
        fastlayers.set_num_threads(before)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs this process may run on",
)
def test_the_caller_and_a_polling_worker_each_run_their_own_span(two_threads, idle_spin):
    """At 2 threads the caller runs the first half of a call's chunks and the worker the
    second, call after call (each thread's kernels then read what its own earlier kernels
    wrote, in its own core's cache). Each runs its span from the front and takes what is left
    of the other's from the back, so whatever the scheduling, each span is a run of its own
    thread's units followed by the other's. The worker polls between the calls (a long idle
    spin) and so takes its span before the caller is done with its own; a descheduled worker
    (another process on the machine) may still leave a call to the caller now and then, hence
    most calls of a round, not all (and beside a busy process, whose stalls make the pool run
    calls serially for a while, in some round of ten)."""
    fastlayers.set_idle_spin(0.5)
    split = [0] * 8 + [1] * 8
    for _ in range(10):
        _core.pool_clear_backoff()
        _core.parallel_owners(16, 1, 1e-4)  # starts or wakes the worker, which then polls
        runs = [_core.parallel_owners(16, 1, 2e-4).tolist() for _ in range(10)]
        for r in runs:
            caller_span, worker_span = r[:8], r[8:]
            assert caller_span == sorted(caller_span) and worker_span == sorted(worker_span, reverse=True), runs
        if sum(r == split for r in runs) >= 5:
            return
    pytest.fail(f"the worker ran its own span in fewer than half of the calls: {runs}")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two CPUs this process may run on",
)
def test_the_caller_takes_a_sleeping_worker_s_span(two_threads, idle_spin):
    """A call too small to wake a sleeping worker runs the worker's span on the caller too
    (taken from its back), every unit once."""
    fastlayers.set_idle_spin(0.0)
    _core.parallel_owners(16, 1, 1e-4)
    time.sleep(0.02)  # the worker sleeps
    owners = _core.parallel_owners(16, 1, 0.0, permille=1)
    assert owners.tolist() == [0] * 16


def test_idle_spin_setting_is_checked_and_read_back(idle_spin):
    assert fastlayers.get_idle_spin() == pytest.approx(2e-4)  # the default (FASTLAYERS_IDLE_SPIN_US unset)
    fastlayers.set_idle_spin(0.05)
    assert fastlayers.get_idle_spin() == pytest.approx(0.05)
    fastlayers.set_idle_spin(0)
    assert fastlayers.get_idle_spin() == 0.0
    for bad in (-1e-3, 1.5, float("nan"), "0.1", True, None):
        with pytest.raises(InputError, match="set_idle_spin"):
            fastlayers.set_idle_spin(bad)


@pytest.mark.parametrize(
    "value, expect",
    [("5000", "0.005"), ("0", "0.0"), ("2000000", "SettingError"), ("fast", "SettingError")],
)
def test_idle_spin_from_the_environment(value, expect):
    code = "import fastlayers\nfrom fastlayers.errors import SettingError\ntry:\n    import fastlayers.native\n"
    code += "    print(fastlayers.get_idle_spin())\nexcept SettingError as e:\n    print('SettingError', e)"
    env = dict(os.environ, FASTLAYERS_IDLE_SPIN_US=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(expect), out.stdout
    if expect == "SettingError":
        assert "FASTLAYERS_IDLE_SPIN_US" in out.stdout


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and at least two CPUs",
)
def test_the_default_count_follows_the_thread_s_affinity():
    """With no count set, a thread's kernels use the CPUs it may run on; the count is read
    again at most every 50 ms (threadpool.c's FL_AFFINITY_REUSE_NS), so a thread pinned to one
    CPU runs serially from then on."""
    code = (
        "import os, threading, time\nimport numpy as np\nfrom fastlayers.native import _core\n"
        "print(_core.get_num_threads())\n"
        "def pinned():\n"
        "    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "    time.sleep(0.1)\n"
        "    a = np.ones((64, 64), np.float32)\n"
        "    _core.matmul(a, a, np.empty((64, 64), np.float32))\n"
        "    print(_core.get_num_threads())\n"
        "threading.Thread(target=pinned).start()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FASTLAYERS_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(min(len(os.sched_getaffinity(0)), 256)), "1"], out.stdout


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_thread_s_own_count_gives_the_same_bits_as_the_process_count(threads):
    """``using_threads(n)`` runs the calling thread's kernels on n threads whatever the
    process's count (the pool grows to the widest call and a job asking fewer leaves the other
    workers idle): the result equals a call at set_num_threads(n), and the count is the
    process's again after the block and in other Python threads during it."""
    a, b, _ = _product(1, m=517)
    before = _core.get_num_threads()
    try:
        fastlayers.set_num_threads(threads)
        expected = _core.matmul(a, b, np.empty((517, b.shape[1]), np.float32))
        fastlayers.set_num_threads(4)
        _core.matmul(a, b, np.empty((517, b.shape[1]), np.float32))  # a pool of 4
        fastlayers.set_num_threads(1)
        _let_back_off_run_out()
        seen = []
        with fastlayers.using_threads(threads):
            assert _core.get_num_threads() == threads
            other = threading.Thread(target=lambda: seen.append(_core.get_num_threads()))
            other.start()
            other.join()
            out = _core.matmul(a, b, np.empty((517, b.shape[1]), np.float32))
        assert seen == [1] and _core.get_num_threads() == 1
        np.testing.assert_array_equal(out, expected)
        assert _core.pool_workers() == max(threads - 1, 0) or threads == 1
    finally:
        fastlayers.set_num_threads(before)


def test_using_threads_checks_its_count():
    for bad in (0, -1, 257, 1.5, True, "2"):
        with pytest.raises(fastlayers.errors.InputError, match="using_threads"):
            with fastlayers.using_threads(bad):
                pass
    with fastlayers.using_threads(None):
        assert _core.get_num_threads() >= 1


def test_a_call_beside_a_busy_pool_gives_the_same_bits(two_threads):
    """A call made while another thread holds the pool runs its chunks serially, in the same
    ranges: self-attention, whose row blocks follow its chunks, gives the shared call's bits."""
    rng = np.random.default_rng(4)
    ops = fastlayers.get_ops("cpu")
    x = rng.standard_normal((4, 64, 256)).astype(np.float32)
    w_qkv = rng.uniform(-0.1, 0.1, (256, 768)).astype(np.float32)
    w_o = rng.uniform(-0.1, 0.1, (256, 256)).astype(np.float32)
    args = (x, w_qkv, np.zeros(768, np.float32), w_o, np.zeros(256, np.float32), 8)
    kwargs = {"need_weights": False}
    want = ops.self_attention(*args, **kwargs)[0]
    a, b, _ = _product(5, m=3000, k=512, n=512)
    stop = threading.Event()

    def hold_the_pool():
        while not stop.is_set():
            _core.matmul(a, b, np.empty((3000, 512), np.float32))

    holder = threading.Thread(target=hold_the_pool)
    holder.start()
    try:
        results = [ops.self_attention(*args, **kwargs)[0] for _ in range(40)]
    finally:
        stop.set()
        holder.join()
    assert sum(not np.array_equal(r, want) for r in results) == 0


def test_thread_buffers_are_freed_when_the_thread_exits():
    """Kernel work buffers of a thread that ends go back to the C library (a thread-per-request
    server would otherwise keep every dead thread's buffers)."""
    x = np.random.default_rng(6).standard_normal((1, 32, 32, 16)).astype(np.float32)
    ops = fastlayers.get_ops("cpu")
    w = np.ones((3, 3, 16, 16), np.float32)
    held = []

    def call():
        ops.conv2d(x, w, None, (1, 1), ((1, 1), (1, 1)))
        held.append(_core.thread_buffer_bytes())

    before = _core.threads_released()
    t = threading.Thread(target=call)
    t.start()
    t.join()
    deadline = time.monotonic() + 2
    while _core.threads_released() == before and time.monotonic() < deadline:
        time.sleep(0.001)
    assert held[0] > 0
    # at least this thread (threads of earlier tests may end meanwhile too)
    assert _core.threads_released() >= before + 1


@pytest.mark.parametrize(
    "n, grain, threads, chunks",
    [
        (10, 1, 2, 2),  # not 5 chunks of 2 (3 rounds on one thread, 2 on the other)
        (16, 1, 2, 8),
        (3, 1, 2, 3),
        (9, 1, 2, 2),
        (1000, 1, 2, 8),
        (1000, 400, 2, 2),
        (10, 1, 1, 1),
        (12, 1, 3, 12),
        (14, 1, 4, 14),
        (0, 1, 2, 0),
    ],
)
def test_chunks_give_every_thread_the_same_rounds(n, grain, threads, chunks):
    """A call's units are cut into chunks whose rounds over the threads are as even as the
    count allows, with at least ``grain`` units each and a few chunks per thread at most."""
    before = _core.set_call_threads(threads)
    try:
        assert _core.parallel_chunks(n, grain) == chunks
    finally:
        _core.set_call_threads(before)
