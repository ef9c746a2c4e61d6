"""An ASGI service (Starlette) answering ``POST /predict`` with one model loaded once.

    uvicorn app:app --app-dir examples/serve --host 127.0.0.1 --port 8000
    gunicorn app:app --chdir examples/serve -k uvicorn_worker.UvicornWorker -w 2 --preload \\
        -b 127.0.0.1:8000

The model call runs on Starlette's pool of worker threads (``run_in_threadpool``), so the event
loop keeps accepting requests while a call computes; fastlayers releases the GIL in its kernels
and its calls from several threads at once are safe. With ``--preload`` gunicorn imports this
module, and so loads the model, once in its master; each forked worker then starts its own
kernel threads at its first call. Formats and settings: ``service.py``.
"""

from __future__ import annotations

import service
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

engine = service.engine_from_env()


async def predict(request: Request) -> Response:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > service.MAX_BODY_BYTES:
            return JSONResponse({"error": f"the body is over {service.MAX_BODY_BYTES} bytes"}, 413)
    status, payload, kind = await run_in_threadpool(
        service.handle, engine, bytes(body), request.headers.get("content-type", service.JSON)
    )
    return Response(payload, status_code=status, media_type=kind)


async def health(request: Request) -> Response:
    return JSONResponse({"model": engine.path, "engine": engine.engine, "inputs": engine.input_names})


app = Starlette(routes=[Route("/predict", predict, methods=["POST"]), Route("/health", health)])
