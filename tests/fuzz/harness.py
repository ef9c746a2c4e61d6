"""Fuzzing fastlayers' model readers in a child process: the runner and the mutators.

A reader given a hostile file must answer with a fastlayers error (``FastlayersError``), never a
foreign exception, a hang, a crash or an unbounded allocation. ``run_cases`` checks exactly
that, case by case, in ONE long-lived child process (restarted only after a hang or a crash):

    from tests.fuzz.harness import run_cases
    failures = run_cases([(label, file_bytes, ".keras"), ...], "tests.fuzz.harness:load_and_call")
    assert not failures, format_failures(failures)

- ``cases``: (label, file bytes, suffix) tuples. The child writes each case to a file named
  ``case<suffix>`` in its own temporary directory and calls ``loader(path)``.
- ``loader``: ``"module:function"``, imported in the child (the repository root is on its
  path). ``load_and_call`` (``fastlayers.load`` then, for a small model, a call on random
  inputs of its declared shape) and ``load_state_dict`` are provided; a format adds its own the
  same way (ONNX: ``load_and_call`` already covers ``OnnxModel``).
- A case passes when the loader returns or raises a ``FastlayersError``. It fails (a
  ``Failure`` in the returned list) on any other exception ("foreign", with the traceback; the
  child turns numpy's ``RuntimeWarning`` into errors, so a warning printed from inside
  fastlayers fails too), on running past ``timeout`` seconds ("timeout": ``setitimer`` in the
  child, and the parent kills a child stuck in C code after ``timeout + HANG_GRACE_S``, "hang"),
  on the child dying ("crash": a signal, or an exit), or on its peak RSS growing by more than
  ``2 x len(file) + rss_slack_mb`` MiB during the case ("rss": the kernel's peak-RSS counter is
  reset before each case through /proc/self/clear_refs). The child runs under
  ``RLIMIT_AS`` = its size after start-up + ``memory_mb``: an allocation past it is a
  ``MemoryError``, which fails the case unless a reader turned it into its own error.
- ``stats`` (a dict, optional) receives the counts per outcome, the seconds taken, the largest
  RSS growth and the number of child restarts.

Mutators (deterministic: they draw from the ``numpy.random.Generator`` given):
``mutate_bytes`` (bit flips, bytes, "interesting" integers written over 1-8 bytes, truncation,
deleted, duplicated and zeroed runs), ``mutate_zip_headers`` (fields of the local and central
zip headers), ``zip_members`` / ``make_zip`` (rewrite members with valid CRCs, so the damage
reaches the readers behind the zip layer), and ``mutate_json`` (a config's structure: values
replaced by extreme numbers, wrong types and deep nesting, keys deleted or renamed, list items
dropped or duplicated, class names swapped).

Run as a script, this module is the child (``python tests/fuzz/harness.py --child LOADER ...``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a case may run before it counts as a timeout (the child's own timer).
DEFAULT_TIMEOUT_S = 10.0
#: Extra seconds the parent waits before it kills a child whose timer could not fire (C code).
HANG_GRACE_S = 5.0
#: Address space a case may add to the child's (RLIMIT_AS), MiB.
DEFAULT_MEMORY_MB = 1536
#: RSS a case may add beyond twice its file's size, MiB (allocator and first-use noise).
DEFAULT_RSS_SLACK_MB = 64
#: Seconds the child may take to start (imports).
START_TIMEOUT_S = 120.0


@dataclasses.dataclass
class Failure:
    """A case that ended outside a fastlayers error."""

    label: str
    kind: str  # "foreign", "timeout", "hang", "crash", "rss"
    detail: str
    suffix: str
    data: bytes = dataclasses.field(repr=False)

    def save(self, directory) -> Path:
        """Write the case's file into ``directory`` (to reproduce it); returns its path."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label)
        path = Path(directory) / f"{safe}{self.suffix}"
        path.write_bytes(self.data)
        return path


def format_failures(failures, limit: int = 10) -> str:
    lines = [f"{len(failures)} case(s) outside a fastlayers error:"]
    for f in failures[:limit]:
        lines.append(f"--- {f.label} [{f.kind}]\n{f.detail.strip()[-1500:]}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- loaders
def load_and_call(path):
    """``fastlayers.load(path)``; an error must be a ModelFileError or UnsupportedError naming the
    file. A model whose inputs and activations are small is then called on random inputs of its
    declared shape (free sizes 2), through ``predict``."""
    import fastlayers
    from fastlayers.errors import ModelFileError, UnsupportedError

    try:
        model = fastlayers.load(path)
    except (ModelFileError, UnsupportedError) as e:
        if Path(path).name not in str(e):
            raise AssertionError(f"the error does not name the file: {type(e).__name__}: {e}") from e
        raise
    except Exception as e:  # a FastlayersError of another class is a finding too
        from fastlayers.errors import FastlayersError

        if isinstance(e, FastlayersError):
            raise AssertionError(f"load raised {type(e).__name__}, not ModelFileError or UnsupportedError: {e}") from e
        raise
    inputs = _random_inputs(model)
    if inputs is not None:
        model.predict(inputs if len(inputs) > 1 else inputs[0])
    return model


def _random_inputs(model, limit: int = 1 << 16):
    """Random inputs for ``model`` (a fastlayers Model), or None when the model is not one or a
    call could need more than ``limit`` elements per tensor (fuzzed sizes)."""
    from fastlayers.model.graph import Model

    if not isinstance(model, Model) or not model.built:
        return None
    rng = np.random.default_rng(0)
    arrays = []

    def size(shape):  # Python integers: fuzzed sizes overflow int64
        total = 1
        for d in shape:
            total *= 2 if d is None else max(int(d), 0)
        return total

    for t in model.inputs:
        shape = tuple(2 if d is None else d for d in t.shape)
        if size(shape) > limit:
            return None
        layer = t.node.layer
        if "int" in str(getattr(layer, "dtype", "")):
            arrays.append(rng.integers(0, 3, shape).astype(layer.dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(np.float32))
    from fastlayers.model.graph import activation_elements

    if activation_elements(model, free_size=2) > limit:  # nested models' tensors included
        return None
    return arrays


def load_state_dict(path):
    """``fastlayers.load_state_dict(path)``: errors must name the file."""
    import fastlayers
    from fastlayers.errors import FastlayersError

    try:
        return fastlayers.load_state_dict(path)
    except FastlayersError as e:
        if Path(path).name not in str(e):
            raise AssertionError(f"the error does not name the file: {type(e).__name__}: {e}") from e
        raise


# ------------------------------------------------------------------------------------ runner
def _frame(obj) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("<Q", len(body)) + body


class _Timeout(BaseException):
    """The child's per-case timer fired (a BaseException: readers catching Exception miss it)."""


class _Child:
    def __init__(self, loader: str, timeout: float, memory_mb: int):
        self.timeout = timeout
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", loader, repr(timeout), str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=str(ROOT),
            env=env,
            start_new_session=True,
        )
        ready = self._read(time.monotonic() + START_TIMEOUT_S)
        if ready != "ready":
            self.close()
            raise RuntimeError(f"fuzz child did not start: {ready!r}\n{self.stderr_tail()}")

    def _read(self, deadline):
        fd = self.proc.stdout.fileno()
        chunks, need, header = [], 8, True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "hang"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, need)
            if not chunk:
                return "crash"
            chunks.append(chunk)
            need -= len(chunk)
            if need == 0:
                data = b"".join(chunks)
                chunks = []
                if header:
                    need, header = struct.unpack("<Q", data)[0], False
                    if need == 0:
                        return None
                else:
                    return pickle.loads(data)

    def run(self, case):
        try:
            self.proc.stdin.write(_frame(case))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return "crash"
        return self._read(time.monotonic() + self.timeout + HANG_GRACE_S)

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            self.stderr.seek(0)
            return self.stderr.read().decode(errors="replace")[-n:]
        except (OSError, ValueError):
            return ""

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def finish(self):
        """Ask the child to exit; kill it if it does not."""
        try:
            self.proc.stdin.write(struct.pack("<Q", 0))
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.close()
        self.stderr.close()


def run_cases(
    cases,
    loader: str = "tests.fuzz.harness:load_and_call",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    rss_slack_mb: int = DEFAULT_RSS_SLACK_MB,
    workers: int = 1,
    stats: dict | None = None,
) -> list[Failure]:
    """Run each (label, file bytes, suffix) case through ``loader`` in a child process; return
    the cases that ended outside a fastlayers error (see the module docstring). ``cases`` may
    be a generator: it is consumed as the children ask for work (``workers`` children side by
    side), so a long run holds one case per child in memory, plus the failures."""
    source = iter(cases)
    lock = threading.Lock()
    failures: list[Failure] = []
    counts: dict[str, int] = {}
    extra = {"cases": 0, "restarts": 0, "max_rss_growth_mb": 0.0, "max_case_s": 0.0}

    def next_case():
        with lock:
            case = next(source, None)
            if case is not None:
                extra["cases"] += 1
            return case

    def record(kind, failure=None, growth=0, took=0.0):
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if failure is not None:
                failures.append(failure)
            extra["max_rss_growth_mb"] = max(extra["max_rss_growth_mb"], growth / 2**20)
            extra["max_case_s"] = max(extra["max_case_s"], took)

    def work():
        child = None
        try:
            while (case := next_case()) is not None:
                label, data, suffix = case
                data = bytes(data)
                if child is None:
                    child = _Child(loader, timeout, memory_mb)
                t0 = time.monotonic()
                reply = child.run((label, data, suffix))
                took = time.monotonic() - t0
                if reply in ("hang", "crash"):
                    detail = (
                        f"no answer after {timeout + HANG_GRACE_S:.0f} s: killed"
                        if reply == "hang"
                        else f"child died (exit {child.proc.poll()})\n{child.stderr_tail()}"
                    )
                    child.close()
                    child = None
                    with lock:
                        extra["restarts"] += 1
                    record(reply, Failure(label, reply, detail, suffix, data), took=took)
                    continue
                kind, detail, growth = reply
                budget = 2 * len(data) + rss_slack_mb * 2**20
                failure = None
                if kind in ("foreign", "timeout"):
                    failure = Failure(label, kind, detail, suffix, data)
                elif growth > budget:
                    failure = Failure(
                        label,
                        "rss",
                        f"peak RSS grew {growth / 2**20:.1f} MiB (budget "
                        f"{budget / 2**20:.1f} MiB); outcome {kind}: {detail}",
                        suffix,
                        data,
                    )
                record(kind, failure, growth, took)
        finally:
            if child is not None:
                child.finish()

    start = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if stats is not None:
        stats.update(seconds=round(time.monotonic() - start, 1), outcomes=counts, failures=len(failures), **extra)
    return failures


# ------------------------------------------------------------------------------------- child
def check_cases(cases, loader: str, **options) -> dict:
    """``run_cases`` that fails the test on any failure (each saved under
    ``FASTLAYERS_FUZZ_SAVE`` when set); prints and returns the run's statistics."""
    stats: dict = {}
    failures = run_cases(cases, loader, stats=stats, **options)
    print(f"\nfuzz {loader}: {stats}")
    save = os.environ.get("FASTLAYERS_FUZZ_SAVE")
    if save and failures:
        Path(save).mkdir(parents=True, exist_ok=True)
        for f in failures:
            f.save(save)
    assert not failures, format_failures(failures)
    return stats


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _child_main(loader_spec: str, timeout: float, memory_mb: int) -> None:
    import gc
    import importlib
    import resource
    import shutil
    import signal
    import traceback
    import warnings

    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the loaders' own prints go nowhere
    proto_in = sys.stdin.buffer
    warnings.simplefilter("error", RuntimeWarning)  # a numpy warning from inside fastlayers
    import fastlayers
    from fastlayers.errors import FastlayersError

    for optional in ("h5py", "safetensors"):  # imported now, not inside the first case's RSS
        try:
            importlib.import_module(optional)
        except ImportError:
            pass
    module, _, func = loader_spec.partition(":")
    loader = getattr(importlib.import_module(module), func)
    fastlayers.get_ops()
    limit = _proc_status("VmSize") + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def on_alarm(signum, frame):
        raise _Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    tmp = tempfile.mkdtemp(prefix="fastlayers-fuzz-")

    def send(obj):
        proto_out.write(_frame(obj))
        proto_out.flush()

    send("ready")
    done = 0
    try:
        while True:
            header = proto_in.read(8)
            if len(header) < 8 or struct.unpack("<Q", header)[0] == 0:
                break
            label, data, suffix = pickle.loads(proto_in.read(struct.unpack("<Q", header)[0]))
            path = os.path.join(tmp, "case" + suffix)
            with open(path, "wb") as f:
                f.write(data)
            done += 1
            if done % 50 == 0:  # cycles of dropped models (a full collection costs ~10 ms)
                gc.collect()
            rss0 = _proc_status("VmRSS")
            _reset_peak_rss()
            result = None  # the loaded model, alive until its RSS is measured
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                result = loader(path)
                kind, detail = "ok", ""
            except _Timeout:
                kind, detail = "timeout", f"over {timeout} s\n{traceback.format_exc()[-3000:]}"
            except FastlayersError as e:
                kind, detail = "error", f"{type(e).__name__}: {e}"[:500]
            except BaseException:  # noqa: BLE001 - the finding
                kind, detail = "foreign", traceback.format_exc()[-4000:]
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            growth = max(0, _proc_status("VmHWM") - rss0)
            del result
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
            send((kind, detail, growth))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------- mutators
#: Integers that break size, count, offset and index fields.
INTERESTING_INTS = [
    0,
    1,
    2,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x10000,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    0x100000000,
    2**63 - 1,
    2**63,
    2**64 - 1,
    10**5,
    10**9,
    10**11,
    -1,
    -2,
]


def _interesting_bytes(rng) -> bytes:
    width = int(rng.choice([1, 2, 4, 8]))
    value = int(rng.choice(INTERESTING_INTS)) % (1 << (8 * width))
    return value.to_bytes(width, "little" if rng.random() < 0.8 else "big")


def mutate_bytes(data: bytes, rng, max_ops: int = 4) -> bytes:
    """``data`` with 1..max_ops byte-level edits."""
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, max_ops + 1))):
        if not buf:
            break
        op = rng.random()
        i = int(rng.integers(0, len(buf)))
        if op < 0.35:
            buf[i] ^= 1 << int(rng.integers(0, 8))
        elif op < 0.5:
            buf[i] = int(rng.integers(0, 256))
        elif op < 0.75:
            value = _interesting_bytes(rng)
            buf[i : i + len(value)] = value
        elif op < 0.8:
            del buf[i:]
        elif op < 0.87:
            del buf[i : i + int(rng.integers(1, 65))]
        elif op < 0.93:
            k = int(rng.integers(1, 65))
            buf[i:i] = buf[i : i + k]
        else:
            k = int(rng.integers(1, 65))
            buf[i : i + k] = bytes(len(buf[i : i + k]))
    return bytes(buf)


#: Fixed sizes of the zip records mutate_zip_headers edits: signature -> record length.
_ZIP_RECORDS = {b"PK\x03\x04": 30, b"PK\x01\x02": 46, b"PK\x05\x06": 22}


def mutate_zip_headers(data: bytes, rng) -> bytes:
    """Overwrite one field (1, 2, 4 or 8 bytes) inside a local, central or end-of-directory zip
    record: versions, flags (encryption), compression method, CRC, sizes, name lengths, offsets."""
    starts = [(m, i) for m in _ZIP_RECORDS for i in _find_all(data, m)]
    if not starts:
        return mutate_bytes(data, rng)
    magic, start = starts[int(rng.integers(0, len(starts)))]
    buf = bytearray(data)
    at = start + int(rng.integers(4, _ZIP_RECORDS[magic]))
    if rng.random() < 0.3:
        buf[at] ^= 1 << int(rng.integers(0, 8))
    else:
        value = _interesting_bytes(rng)
        buf[at : at + len(value)] = value
    return bytes(buf)


def _find_all(data: bytes, needle: bytes):
    i = data.find(needle)
    while i != -1:
        yield i
        i = data.find(needle, i + 1)


def zip_members(data: bytes) -> list[tuple[str, bytes]]:
    """The (name, bytes) members of a zip, in order."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(info.filename, z.read(info)) for info in z.infolist()]


def make_zip(members, compression=zipfile.ZIP_STORED) -> bytes:
    """A zip of (name, bytes) members (fixed timestamps: deterministic bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, payload in members:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = compression
            z.writestr(info, payload)
    return out.getvalue()


_DEEP = "\u0000deep\u0000"


def _nodes(obj):
    """(parent, key) for every node below ``obj``, iteratively."""
    out, stack = [], [obj]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            out.append((node, key))
            if isinstance(value, (dict, list)):
                stack.append(value)
    return out


def _replacement(rng, value, names):
    choice = rng.random()
    if choice < 0.3:
        return int(rng.choice([0, -1, 1, 2**31, 2**31 - 1, 2**32, 2**63, 2**64, 10**11, 10**6, -(2**63), 10**100]))
    if choice < 0.4 and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value * int(rng.choice([2, 10, 1000, -1])) + int(rng.integers(-2, 3))
    if choice < 0.5:
        return float(rng.choice([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 0.5]))
    if choice < 0.6 and names:
        return str(rng.choice(names))
    if choice < 0.75:
        return [None, True, "", "x" * 100, "relu", {}, [], [1, 2], {"a": 1}, [[None]]][int(rng.integers(0, 10))]
    if choice < 0.8:
        return _DEEP
    if choice < 0.9:
        return [value] if rng.random() < 0.5 else {"class_name": value, "config": value}
    return None


def mutate_json(obj, rng, names=(), max_ops: int = 3) -> bytes:
    """JSON text of a deep copy of ``obj`` with 1..max_ops structural edits; ``names`` are
    strings worth trying as values (class names, layer names, activations)."""
    obj = json.loads(json.dumps(obj))
    for _ in range(int(rng.integers(1, max_ops + 1))):
        nodes = _nodes(obj)
        if not nodes:
            break
        parent, key = nodes[int(rng.integers(0, len(nodes)))]
        op = rng.random()
        if op < 0.6:
            parent[key] = _replacement(rng, parent[key], list(names))
        elif op < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.8 and isinstance(parent, list):
            if rng.random() < 0.5:
                parent.insert(key, json.loads(json.dumps(parent[key])))
            else:
                del parent[key]
        elif op < 0.85 and isinstance(parent, dict):
            parent[str(rng.choice(["name", "config", "class_name", "layers", "units", "x"]))] = parent.pop(key)
        elif op < 0.95:
            other_parent, other_key = nodes[int(rng.integers(0, len(nodes)))]
            parent[key], other_parent[other_key] = other_parent[other_key], parent[key]
        else:
            parent[key] = _DEEP
    text = json.dumps(obj)
    depth = int(rng.choice([64, 500, 3000, 100_000]))
    return text.replace(json.dumps(_DEEP), "[" * depth + "]" * depth).encode()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--child":
    sys.path.insert(0, str(ROOT))
    _child_main(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
