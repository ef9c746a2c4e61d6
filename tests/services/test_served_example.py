"""The served example (examples/serve): each server started for real on 127.0.0.1, concurrent
requests from a client in JSON and .npy, every answer checked against a direct call, then the
server stopped. Uvicorn (ASGI, a fixed pool of threads), gunicorn with two pre-forked workers
after ``--preload`` (the model loaded once, before the fork), and the standard library's
``ThreadingHTTPServer`` (a new thread per connection) on an ONNX file."""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import fastlayers

from ..conftest import oracle
from .graphs import conv_relu

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "examples" / "serve"
DIGITS = ROOT / "fastlayers" / "data" / "digits_cnn.flm"
CLIENTS, REQUESTS = 8, 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port, method, path, body=None, content_type="application/json", timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": content_type} if body else {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


class Server:
    """A server process on 127.0.0.1:port, stopped (and its workers) on exit."""

    def __init__(self, argv, port, env=None):
        self.port = port
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(os.environ, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def __enter__(self):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited ({self.proc.returncode}):\n{self.proc.stdout.read()}")
            try:
                if _request(self.port, "GET", "/health", timeout=5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self._stop()
        raise AssertionError(f"the server did not answer within 90 s:\n{self.proc.stdout.read()}")

    def __exit__(self, *exc):
        self._stop()

    def _stop(self):
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _check_concurrent_answers(port, call, inputs):
    """CLIENTS threads send REQUESTS each, alternately JSON and .npy; every answer equals
    ``call`` on the same input, bit for bit."""

    def client(c):
        wrong = []
        for i in range(REQUESTS):
            x = inputs[(c * REQUESTS + i) % len(inputs)]
            if i % 2:
                status, kind, body = _request(port, "POST", "/predict", _npy(x), "application/x-npy")
                got = np.load(io.BytesIO(body), allow_pickle=False) if status == 200 else None
            else:
                status, kind, body = _request(port, "POST", "/predict", json.dumps({"inputs": x.tolist()}).encode())
                got = np.asarray(json.loads(body)["outputs"][0], np.float32) if status == 200 else None
            if status != 200 or not np.array_equal(got, call(x)):
                wrong.append((status, body[:200]))
        return wrong

    with ThreadPoolExecutor(CLIENTS) as pool:
        wrong = [w for ws in pool.map(client, range(CLIENTS)) for w in ws]
    assert wrong == [], f"{len(wrong)} of {CLIENTS * REQUESTS} answers wrong, e.g. {wrong[:3]}"


def _digits_inputs():
    x = np.load(ROOT / "fastlayers" / "data" / "digits_samples.npz")["x"].astype(np.float32)
    return [x[i : i + 1 + i % 3].reshape(-1, 8, 8, 1) for i in range(0, 60, 3)]


def _bad_request_is_400(port):
    status, kind, body = _request(port, "POST", "/predict", json.dumps({"inputs": [[1, 2], [3]]}).encode())
    assert status == 400 and "rectangular" in json.loads(body)["error"]


def test_uvicorn_app():
    oracle("starlette")
    oracle("uvicorn")
    model, port = fastlayers.load(DIGITS), _free_port()
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
    with Server(argv, port):
        _check_concurrent_answers(port, model, _digits_inputs())
        _bad_request_is_400(port)


def test_gunicorn_preforked_workers_after_preload():
    oracle("gunicorn")
    oracle("uvicorn_worker")
    model, port = fastlayers.load(DIGITS), _free_port()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "app:app",
        "--chdir",
        str(SERVE),
        "-k",
        "uvicorn_worker.UvicornWorker",
        "-w",
        "2",
        "--preload",
        "-b",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "--graceful-timeout",
        "5",
    ]
    with Server(argv, port):
        _check_concurrent_answers(port, model, _digits_inputs())
        _bad_request_is_400(port)


def test_threading_http_server_on_an_onnx_file(tmp_path):
    path = conv_relu(tmp_path / "conv.onnx", channels=16, hw=16)
    model, port = fastlayers.load(path), _free_port()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1 + i % 3, 16, 16, 16)).astype(np.float32) for i in range(6)]
    argv = [sys.executable, str(SERVE / "threaded.py"), "--port", str(port)]
    with Server(argv, port, {"SERVE_MODEL": str(path)}):
        _check_concurrent_answers(port, lambda x: model.run(None, {"x": x})[0], inputs)
