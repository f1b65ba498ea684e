"""API keys on every route of Ray Serve's HTTP proxy. Pod-side code: shipped to every Ray pod in
a ConfigMap, imported by each Serve proxy through Ray's own hook
(``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=eks_pd_api_keys:middlewares``), so it wraps the
whole proxy: every request to port 8000 meets the check before routing, before any ingress,
router or engine work. Standard library, plus boto3 (the Ray LLM image's) for Secrets Manager.

The secret is a JSON object of key id to key (``{"initial": "<48 characters>"}``). Only SHA-256
digests of the keys are held; a presented key's digest is compared with every held one in
constant time. Logs name the key id, never a key. The keys are read again every
``EKS_PD_API_KEYS_REFRESH_S`` seconds, so a key added to or removed from the secret takes effect
within that interval without restarting anything; a failed read keeps the keys last read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

SECRET_ENV = "EKS_PD_API_KEYS_SECRET"
REFRESH_ENV = "EKS_PD_API_KEYS_REFRESH_S"
DEFAULT_REFRESH_S = 30.0
# Answered without a key: KubeRay's operator and the pods' readiness probes ask each proxy's
# health here (the NLB's health check is TCP). Nothing behind it reaches an application.
OPEN_PATHS = frozenset({"/-/healthz"})
KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MIN_KEY_CHARS = 32
# A logged path is at most this long: anyone who reaches the port, without a key, chooses it.
LOGGED_PATH_CHARS = 200

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("ray.serve")


class KeysUnavailable(RuntimeError):
    """No keys have been read yet."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(secret_string: str) -> dict[bytes, str]:
    """Digest to key id. The messages name ids, never keys."""
    try:
        data = json.loads(secret_string)
    except json.JSONDecodeError:
        raise ValueError("the secret is not JSON") from None
    if not isinstance(data, dict) or not data:
        raise ValueError("the secret must be a JSON object of key id to key, with at least one key")
    digests: dict[bytes, str] = {}
    for key_id, key in data.items():
        if not KEY_ID.match(key_id):
            raise ValueError(f"key id {key_id[:64]!r} is not 1-64 letters, digits, '.', '_' or '-'")
        if not isinstance(key, str) or len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
            raise ValueError(f"the key of {key_id!r} is not a string of {MIN_KEY_CHARS} or more characters")
        digest = _digest(key)
        if digest in digests:
            raise ValueError(f"{digests[digest]!r} and {key_id!r} hold the same key")
        digests[digest] = key_id
    return digests


class KeyStore:
    """The current keys, read by ``fetch`` (the secret's string) now and every ``refresh_s``."""

    def __init__(self, fetch: Callable[[], str], refresh_s: float = DEFAULT_REFRESH_S) -> None:
        self._fetch = fetch
        self.refresh_s = refresh_s
        self._digests: dict[bytes, str] | None = None
        self._stop = threading.Event()

    def refresh(self) -> bool:
        try:
            digests = parse_keys(self._fetch())
        except Exception as error:  # any failure keeps the keys in hand; its message holds no key
            held = "none" if self._digests is None else f"the {len(self._digests)} held"
            logger.warning("API keys not read (%s: %s); keeping %s", type(error).__name__, error, held)
            return False
        if self._digests is None or set(digests.values()) != set(self._digests.values()):
            logger.info("API keys read: ids %s", ", ".join(sorted(digests.values())))
        self._digests = digests
        return True

    def identify(self, presented: str) -> str | None:
        """The id of the key presented, or None. Every held digest is compared, in constant time."""
        digests = self._digests
        if digests is None:
            raise KeysUnavailable
        wanted = _digest(presented)
        found = None
        for digest, key_id in digests.items():
            if hmac.compare_digest(digest, wanted):
                found = key_id
        return found

    def start(self) -> None:
        """Read now, then every ``refresh_s`` on a daemon thread (off the proxy's event loop)."""
        self.refresh()

        def loop() -> None:
            while not self._stop.wait(self.refresh_s):
                self.refresh()

        threading.Thread(target=loop, name="eks-pd-api-keys", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() or None if scheme.lower() == "bearer" else None
    return None


def _error(message: str, code: str, kind: str) -> bytes:
    # OpenAI's error shape, which its SDKs turn into AuthenticationError (401).
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


NO_KEY = "No API key provided. Send it as 'Authorization: Bearer <key>'."
UNKNOWN_KEY = "Incorrect API key provided."
NOT_LOADED = "API keys are not loaded yet; try again shortly."


class ApiKeyMiddleware:
    """Pure ASGI (streams pass through untouched): refuses, or passes the request on and logs
    which key it carried."""

    def __init__(self, app: App, store: KeyStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope.get("headers", []))
        try:
            key_id = self.store.identify(token) if token else None
        except KeysUnavailable:
            await _refuse(kind, send, 503, _error(NOT_LOADED, "api_keys_unavailable", "server_error"))
            return
        method = scope.get("method", "WS")
        if key_id is None:
            logger.info(
                "api_key refused %s %s: %s", method, loggable(scope["path"]), "unknown key" if token else "no key"
            )
            await _refuse(
                kind, send, 401, _error(UNKNOWN_KEY if token else NO_KEY, "invalid_api_key", "invalid_request_error")
            )
            return
        logger.info("api_key_id=%s %s %s", key_id, method, loggable(scope["path"]))
        await self.app(scope, receive, send)


def loggable(path: str) -> str:
    """A request's path as one log token: percent-encoded again (ASGI hands it decoded, so a
    ``%0A`` would start a forged line and ``%20`` spell a phrase an alarm counts), then capped."""
    quoted = urllib.parse.quote(path, safe="/-._~")
    return quoted if len(quoted) <= LOGGED_PATH_CHARS else quoted[:LOGGED_PATH_CHARS] + "..."


async def _refuse(kind: str, send: Send, status: int, body: bytes) -> None:
    if kind == "websocket":  # closed before accept: the server answers the handshake with 403
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def secrets_manager_fetch(secret_id: str) -> Callable[[], str]:
    """Reads the secret's current string with the pod's credentials (EKS Pod Identity), in the
    secret's own region (its ARN's): botocore reads AWS_DEFAULT_REGION, not AWS_REGION, and Pod
    Identity sets neither."""
    client: list[Any] = []
    parts = secret_id.split(":")
    region = parts[3] if secret_id.startswith("arn:") and len(parts) > 3 else os.environ.get("AWS_REGION")

    def fetch() -> str:
        if not client:
            import boto3

            client.append(boto3.client("secretsmanager", region_name=region))
        return str(client[0].get_secret_value(SecretId=secret_id)["SecretString"])

    return fetch


def middlewares() -> list[Any]:
    """The proxy hook: Ray Serve calls it once per proxy and wraps its ASGI app in the result."""
    secret_id = os.environ.get(SECRET_ENV)
    if not secret_id:
        # Fails the proxy's start: Serve never serves unchecked when the hook is configured.
        raise RuntimeError(f"{SECRET_ENV} is not set: the API key secret to read")
    from starlette.middleware import Middleware

    store = KeyStore(secrets_manager_fetch(secret_id), float(os.environ.get(REFRESH_ENV, DEFAULT_REFRESH_S)))
    store.start()
    return [Middleware(ApiKeyMiddleware, store=store)]
