"""The same service on the standard library alone: ``http.server.ThreadingHTTPServer``, which
answers each request on a new thread (the threading model that most needs flat memory).

    python examples/serve/threaded.py --host 127.0.0.1 --port 8000

Formats and settings: ``service.py``.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import service

engine = service.engine_from_env()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client may send many requests on one connection

    def _send(self, status: int, payload: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):  # http.server's name
        if self.path != "/health":
            return self._send(404, b'{"error": "not found"}', service.JSON)
        self._send(
            200,
            json.dumps({"model": engine.path, "engine": engine.engine, "inputs": engine.input_names}).encode(),
            service.JSON,
        )

    def do_POST(self):
        if self.path != "/predict":
            return self._send(404, b'{"error": "not found"}', service.JSON)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._send(411, b'{"error": "Content-Length required"}', service.JSON)
        if length > service.MAX_BODY_BYTES or length < 0:
            self.close_connection = True
            return self._send(413, b'{"error": "body too large"}', service.JSON)
        body = self.rfile.read(length)
        self._send(*service.handle(engine, body, self.headers.get("Content-Type", service.JSON)))

    def log_message(self, format, *args):  # quiet under load
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"serving {engine.path} ({engine.engine}) on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
