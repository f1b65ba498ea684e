"""Ray Serve's own proxy hook loads the API key check as the pods configure it, at the image's
Ray version. Runs in the Ray virtualenv (.venv-ray), with the pod's environment:

    RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=... PYTHONPATH=<the ConfigMap's files> \\
        .venv-ray/bin/python tools/check_proxy_hook.py

Ray's ``configure_http_middlewares`` calls the callback and validates what it returns (a list of
Starlette middlewares); ``_apply_middlewares`` wraps the proxy's ASGI app exactly as the proxy
does. Then one request per path goes through the wrapped app to a stand-in for the proxy's
router, and each line printed says which reached it: ``<path> <status> reached|refused``.
Exit 0 when Ray accepted the hook, 1 with its error when it did not.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any


async def _router(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"router"})


async def _request(app: Any, path: str, body: bytes = b"") -> tuple[int, bool]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    method = "POST" if body else "GET"
    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body == b"router"


def main(paths: list[str]) -> int:
    from ray.serve._private.http_util import _apply_middlewares, configure_http_middlewares
    from ray.serve.config import HTTPOptions

    try:
        options = configure_http_middlewares(HTTPOptions())
    except Exception as error:  # Ray's own refusal is the message to show
        print(f"ray refused the proxy hook: {type(error).__name__}: {error}")
        return 1
    print("middlewares: " + ", ".join(m.cls.__name__ for m in options.middlewares))
    app = _apply_middlewares(_router, options.middlewares)
    for path in paths:
        status, reached = asyncio.run(_request(app, path))
        print(f"{path} {status} {'reached' if reached else 'refused'}")
    limit = os.environ.get("EKS_PD_MAX_BODY_BYTES")
    if limit:  # a body one byte over the bound, with no Content-Length: counted as it is received
        status, reached = asyncio.run(_request(app, "/-/healthz", b"x" * (int(limit) + 1)))
        print(f"POST {int(limit) + 1} bytes {status} {'reached' if reached else 'refused'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["/-/healthz", "/v1/models", "/-/routes"]))
