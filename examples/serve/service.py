"""The part both example servers share: one model loaded once per process, and the request and
response formats.

Settings (environment variables, read at import, so that gunicorn ``--preload`` loads the model
once in its master process and its forked workers share the pages):

- ``SERVE_MODEL``: a model file ``fastlayers.load`` reads (``.onnx``, ``.keras``, ``.h5``,
  ``.flm``, ...); default: the demo digits CNN shipped with fastlayers (input (N, 8, 8, 1)).
- ``SERVE_ENGINE``: ``fastlayers`` (default) or ``onnxruntime`` (``.onnx`` files only; for
  side-by-side benchmarks, ``bench/bench_serve.py``).
- ``SERVE_THREADS``: threads per call (``fastlayers.set_num_threads`` / onnxruntime's
  ``intra_op_num_threads``); default: fastlayers' own default, the CPUs the process may use.

Requests (``POST /predict``):

- ``Content-Type: application/json``: ``{"inputs": X}`` where X is a nested list (a model with
  one input) or an object from input name to nested list. The answer is JSON,
  ``{"outputs": [Y, ...]}`` with one nested list per output (float32 values written exactly).
- ``Content-Type: application/x-npy``: the body is one ``.npy`` array (read with
  ``allow_pickle=False``) for a model with one input; the answer is the first output as ``.npy``.

Bad requests get status 400 with ``{"error": "..."}`` (fastlayers' message names the model, the
input and what was expected); a body over ``MAX_BODY_BYTES`` gets 413.
"""

from __future__ import annotations

import io
import json
import os
import threading
from importlib import resources

import numpy as np

import fastlayers
from fastlayers.errors import FastlayersError

MAX_BODY_BYTES = 64 << 20
NPY = "application/x-npy"
# np.load reads a .npy header with ast.literal_eval; CPython's AST constructor (3.11 at least)
# keeps its recursion depth per interpreter, and two threads building ASTs at once can fail
# with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905): one request
# thread reads a body at a time (a header parse takes microseconds).
_NPY_LOCK = threading.Lock()
JSON = "application/json"


def _default_model() -> str:
    return str(resources.files("fastlayers") / "data" / "digits_cnn.flm")


class Engine:
    """The model of this process: ``predict(inputs)`` gives the list of output arrays."""

    def __init__(self, path: str, engine: str = "fastlayers", threads: int | None = None):
        self.path, self.engine = path, engine
        if engine == "fastlayers":
            if threads:
                fastlayers.set_num_threads(threads)
            self.model = fastlayers.load(path)
            self.onnx = hasattr(self.model, "get_inputs")
            self.input_names = [i.name for i in self.model.get_inputs()] if self.onnx else list(self.model.input_names)
        elif engine == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            if threads:
                opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            self.model = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            self.onnx = True
            self.input_names = [i.name for i in self.model.get_inputs()]
        else:
            raise ValueError(f"SERVE_ENGINE={engine!r}: expected 'fastlayers' or 'onnxruntime'")

    def predict(self, inputs) -> list[np.ndarray]:
        """Outputs for ``inputs``: one array (a model of one input) or a dict name -> array."""
        if not isinstance(inputs, dict):
            if len(self.input_names) != 1:
                raise ValueError(f"the model takes inputs {self.input_names}: send an object from input name to array")
            inputs = {self.input_names[0]: inputs}
        if self.onnx:
            if self.engine == "onnxruntime":  # onnxruntime takes only its declared dtypes
                types = {i.name: i.type for i in self.model.get_inputs()}
                inputs = {
                    k: np.asarray(v, np.float32) if types.get(k) == "tensor(float)" else v for k, v in inputs.items()
                }
            return list(self.model.run(None, inputs))
        out = self.model(inputs if len(inputs) > 1 else next(iter(inputs.values())))
        return list(out) if isinstance(out, (list, tuple)) else [out]


def decode(body: bytes, content_type: str):
    """The inputs of a request body (an array or a dict name -> array)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == NPY:
        with _NPY_LOCK:
            return np.load(io.BytesIO(body), allow_pickle=False)
    if kind in (JSON, ""):
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise ValueError(f"the body is not JSON: {e}") from None
        if not isinstance(doc, dict) or "inputs" not in doc:
            raise ValueError('expected a JSON object {"inputs": ...}')
        inputs = doc["inputs"]
        return {k: v for k, v in inputs.items()} if isinstance(inputs, dict) else inputs
    raise ValueError(f"Content-Type {content_type!r}: send {JSON} or {NPY}")


def encode(outputs: list[np.ndarray], content_type: str) -> tuple[bytes, str]:
    """The response body for ``outputs``, in the request's format."""
    if content_type.split(";")[0].strip().lower() == NPY:
        buf = io.BytesIO()
        np.save(buf, np.asarray(outputs[0]), allow_pickle=False)
        return buf.getvalue(), NPY
    return json.dumps({"outputs": [np.asarray(o).tolist() for o in outputs]}).encode(), JSON


def handle(engine: Engine, body: bytes, content_type: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of the answer to one request."""
    if len(body) > MAX_BODY_BYTES:
        return 413, _error(f"the body has {len(body)} bytes, more than {MAX_BODY_BYTES}"), JSON
    try:
        inputs = decode(body, content_type)
        outputs = engine.predict(inputs)
    except (FastlayersError, ValueError, TypeError, KeyError) as e:
        return 400, _error(str(e)), JSON
    except Exception as e:  # onnxruntime's own errors on bad inputs, for one
        if type(e).__module__.startswith("onnxruntime"):
            return 400, _error(str(e)), JSON
        raise
    payload, kind = encode(outputs, content_type)
    return 200, payload, kind


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def engine_from_env() -> Engine:
    threads = os.environ.get("SERVE_THREADS")
    return Engine(
        os.environ.get("SERVE_MODEL") or _default_model(),
        os.environ.get("SERVE_ENGINE", "fastlayers"),
        int(threads) if threads else None,
    )
