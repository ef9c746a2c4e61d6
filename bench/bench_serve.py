"""The served example (examples/serve) under a bounded load from a local client: fastlayers and
onnxruntime side by side, a new thread per request and a fixed pool of threads.

Configurations: engine (``fastlayers``, ``onnxruntime``; ``SERVE_THREADS`` threads per call
each) x server:

- ``thread-per-request``: the standard library's ``ThreadingHTTPServer`` (``threaded.py``), the
  client opening a new connection per request, so every request is answered on a new thread;
- ``thread-pool``: the Starlette app under uvicorn (``app.py``), the client keeping its
  connections open; calls run on Starlette's fixed pool of worker threads.

The model is the ONNX Conv2d(64, 64, 3, padding=1) on a (1, 64, 56, 56) input (``.npy``
requests of 784 KiB); the client's threads send requests back to back for the set time (and at
most ``--max-requests`` in all). Each answer is compared with the same engine's direct call in
the client process (``mismatches``: any bit differs). Reported per configuration: requests/s,
latency p50 / p99 / max, the server's RSS after a warm-up request, a quarter into the run, at
the end and at most (sampled 20 times), errors.

Run: ``python -m bench.bench_serve --seconds 60 --out bench/results/serve.json`` (the default is
60 s per configuration); ``pytest bench`` runs each configuration for 2 s and checks that
nothing failed, nothing differed and fastlayers' thread-per-request RSS stayed flat.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "examples" / "serve"
SERVERS = ("thread-per-request", "thread-pool")
ENGINES = ("fastlayers", "onnxruntime")


def conv_export(path: Path) -> Path:
    """The ONNX Conv2d(64, 64, 3, padding=1) + bias on (1, 64, 56, 56)."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.uniform(-0.04, 0.04, (64, 64, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(-0.04, 0.04, 64).astype(np.float32), "b"),
    ]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 56, 56])],
        inits,
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _post(conn: http.client.HTTPConnection, body: bytes, close: bool) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/x-npy"}
    if close:
        headers["Connection"] = "close"
    conn.request("POST", "/predict", body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def start_server(server: str, engine: str, model: Path, threads: int):
    """(process, port) of a server answering /health."""
    port = _free_port()
    if server == "thread-per-request":
        argv = [sys.executable, str(SERVE / "threaded.py"), "--port", str(port)]
    else:
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "app:app",
            "--app-dir",
            str(SERVE),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    env = dict(os.environ, SERVE_MODEL=str(model), SERVE_ENGINE=engine, SERVE_THREADS=str(threads))
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{server} ({engine}) exited: {proc.stderr.read()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return proc, port
        except OSError:
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"{server} ({engine}) did not answer within 90 s")


def stop_server(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def expected_outputs(engine: str, model: Path, inputs: list[np.ndarray], threads: int) -> list[np.ndarray]:
    """The engine's direct results on ``inputs`` in this process (the answers to expect)."""
    sys.path.insert(0, str(SERVE))
    import service

    direct = service.Engine(str(model), engine, threads)
    return [direct.predict(x)[0] for x in inputs]


def load(
    port: int,
    bodies: list[bytes],
    want: list[np.ndarray],
    seconds: float,
    clients: int,
    max_requests: int,
    new_connection: bool,
) -> dict:
    """``clients`` threads send requests back to back for ``seconds`` (at most ``max_requests``
    in all): latencies, errors and mismatches."""
    latencies, errors, mismatches = [], [0], [0]
    lock, count = threading.Lock(), [0]
    end = time.monotonic() + seconds

    def client(c: int) -> None:
        conn = None
        i = c
        while time.monotonic() < end:
            with lock:
                if count[0] >= max_requests:
                    return
                count[0] += 1
            k = i % len(bodies)
            i += clients
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status, body = _post(conn, bodies[k], new_connection)
                dt = time.perf_counter() - t0
                if new_connection:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                with lock:
                    errors[0] += 1
                conn = None
                continue
            same = status == 200 and np.array_equal(np.load(io.BytesIO(body), allow_pickle=False), want[k])
            with lock:
                latencies.append(dt)
                errors[0] += status != 200
                mismatches[0] += status == 200 and not same

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = sorted(x * 1e3 for x in latencies) or [float("nan")]
    return {
        "requests": len(latencies),
        "requests_per_s": len(latencies) / wall,
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "max_ms": ms[-1],
        "errors": errors[0],
        "mismatches": mismatches[0],
    }


def run(seconds: float, clients: int, threads: int, max_requests: int, engines=ENGINES, servers=SERVERS) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = conv_export(Path(tmp) / "conv.onnx")
        rng = np.random.default_rng(1)
        inputs = [rng.standard_normal((1, 64, 56, 56)).astype(np.float32) for _ in range(4)]
        bodies = [_npy(x) for x in inputs]
        for engine in engines:
            want = expected_outputs(engine, model, inputs, threads)
            for server in servers:
                proc, port = start_server(server, engine, model, threads)
                try:
                    load(port, bodies[:1], want[:1], 0.0, 1, 1, True)  # one warm-up request
                    samples, done = [_rss_mib(proc.pid)], threading.Event()

                    def watch():  # the server's RSS 20 times over the run
                        while not done.wait(seconds / 20):
                            samples.append(_rss_mib(proc.pid))

                    watcher = threading.Thread(target=watch)
                    watcher.start()
                    try:
                        row = load(port, bodies, want, seconds, clients, max_requests, server == "thread-per-request")
                    finally:
                        done.set()
                        watcher.join()
                    samples.append(_rss_mib(proc.pid))
                    row.update(
                        engine=engine,
                        server=server,
                        rss_start_mib=samples[0],
                        rss_quarter_mib=samples[len(samples) // 4],
                        rss_end_mib=samples[-1],
                        rss_max_mib=max(samples),
                    )
                finally:
                    stop_server(proc)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def bench_serve_short():
    """Each configuration for 2 s (CI): no error, no mismatch, and fastlayers'
    thread-per-request server within 128 MiB of its RSS after the warm-up request (glibc gives
    each concurrently running thread an arena, which fills once; a per-thread leak of the
    kernels' buffers, 3.4 MiB a request, would add about 2 GiB in this run)."""
    from .conftest import oracle

    for module in ("onnxruntime", "starlette", "uvicorn"):
        oracle(module)
    rows = run(seconds=2.0, clients=2, threads=2, max_requests=400)
    assert len(rows) == 4
    for row in rows:
        assert row["requests"] > 0 and row["errors"] == 0 and row["mismatches"] == 0, row
    flat = [r for r in rows if r["engine"] == "fastlayers" and r["server"] == "thread-per-request"]
    assert flat[0]["rss_max_mib"] - flat[0]["rss_start_mib"] < 128, flat[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per configuration")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--threads", type=int, default=2, help="threads per call, each engine")
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.tools.process_metrics import host_info

    rows = run(args.seconds, args.clients, args.threads, args.max_requests)
    result = {
        "host": host_info(),
        "seconds": args.seconds,
        "clients": args.clients,
        "threads": args.threads,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    print(
        f"\n{result['host']}, {args.clients} client threads, {args.threads} threads per call, "
        f"{args.seconds:g} s per row\n"
    )
    print(
        "| engine | server | requests | requests/s | p50 ms | p99 ms | max ms "
        "| RSS MiB: start, 1/4, end (max) | errors | mismatches |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['server']} | {r['requests']} | {r['requests_per_s']:.0f} | "
            f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | {r['rss_start_mib']:.0f}, "
            f"{r['rss_quarter_mib']:.0f}, {r['rss_end_mib']:.0f} ({r['rss_max_mib']:.0f}) | "
            f"{r['errors']} | {r['mismatches']} |"
        )


if __name__ == "__main__":
    main()
