"""What every Ray Serve HTTP proxy checks before it routes a request: the body's size, and (when
on) an API key. Pod-side code: shipped to every Ray pod in a ConfigMap, imported by each Serve proxy
through Ray's own hook (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=eks_pd_api_keys:middlewares``),
so it wraps the whole proxy: every request to port 8000 meets the checks before routing, before
any ingress, router or engine work. Standard library, plus boto3 (the Ray LLM image's) for Secrets
Manager.

The body: a request whose ``Content-Length`` is over ``EKS_PD_MAX_BODY_BYTES`` is answered 413 at
once; one without it (chunked) is read up to that many bytes before anything is relayed, and 413
once past it. So no body larger than the bound ever reaches the ingress or an engine.

The keys (``EKS_PD_API_KEYS_SECRET`` set): the secret is a JSON object of key id to key
(``{"initial": "<48 characters>"}``). Only SHA-256
digests of the keys are held; a presented key's digest is compared with every held one in
constant time. Logs name the key id, never a key. The keys are read again every
``EKS_PD_API_KEYS_REFRESH_S`` seconds, so a key added to or removed from the secret takes effect
within that interval without restarting anything. An entry that is not a valid key is dropped
(and logged by its id) while the rest apply. A failed read keeps the keys last read for at most
``EKS_PD_API_KEYS_MAX_STALE_S`` seconds after the last good one started (a read's answer is as
fresh as its start); then every request gets 503 until a read succeeds, so a revoked key is dead
within that bound whatever happens to the reads, a slow answer included. Each read is bounded
(``READ_LIMITS``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

SECRET_ENV = "EKS_PD_API_KEYS_SECRET"
# The largest request body a proxy relays, in bytes (set on every Ray pod).
MAX_BODY_ENV = "EKS_PD_MAX_BODY_BYTES"
TOO_LARGE = "The request body is over {} bytes, the most this endpoint takes."
REFRESH_ENV = "EKS_PD_API_KEYS_REFRESH_S"
DEFAULT_REFRESH_S = 30.0
MAX_STALE_ENV = "EKS_PD_API_KEYS_MAX_STALE_S"
DEFAULT_MAX_STALE_S = 300.0
# The warnings a proxy logs: a failed read of the secret (counted by the ApiKeysUnread alarm; no
# request can write it, request paths being escaped) and an entry of the secret it dropped.
UNREAD_LINE = "API keys not read"
DROPPED_LINE = "API key entry dropped"
# Answered without a key: KubeRay's operator and the pods' readiness probes ask each proxy's
# health here (the NLB's health check is TCP). Nothing behind it reaches an application.
OPEN_PATHS = frozenset({"/-/healthz"})
# Secrets Manager's read, bounded (botocore's defaults: 60 s to connect, 60 s to read, retried up
# to 5 times in legacy mode, about 10 minutes): a slow answer no longer stalls the refreshes.
READ_LIMITS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 10,
    "retries": {"max_attempts": 2, "mode": "standard"},
}
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
    """No keys to check against: none read yet, or the last read is older than ``max_stale_s``."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(secret_string: str) -> tuple[dict[bytes, str], list[str]]:
    """Digest to key id, entry by entry: a bad entry is dropped (one complaint each, naming its id,
    never a key) and the rest apply, so a revoked key never outlives a write that also holds a
    typo. A secret that is not a JSON object is not a read at all (ValueError)."""
    try:
        data = json.loads(secret_string)
    except json.JSONDecodeError:
        raise ValueError("the secret is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("the secret must be a JSON object of key id to key")
    digests: dict[bytes, str] = {}
    dropped: list[str] = []
    for key_id, key in data.items():
        if not KEY_ID.match(key_id):
            dropped.append(f"an entry's id ({len(key_id)} characters) is not 1-64 letters, digits, '.', '_' or '-'")
            continue
        if not isinstance(key, str) or len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
            dropped.append(f"the key of {key_id!r} is not a string of {MIN_KEY_CHARS} or more characters")
            continue
        digest = _digest(key)
        if digest in digests:
            dropped.append(f"{key_id!r} holds the same key as {digests[digest]!r}")
            continue
        digests[digest] = key_id
    return digests, dropped


class KeyStore:
    """The current keys, read by ``fetch`` (the secret's string) now and every ``refresh_s``. Keys
    last read more than ``max_stale_s`` ago are not served: every request gets 503 until a read
    succeeds, so a revoked key is dead within that bound even while reads fail."""

    def __init__(
        self,
        fetch: Callable[[], str],
        refresh_s: float = DEFAULT_REFRESH_S,
        max_stale_s: float = DEFAULT_MAX_STALE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.refresh_s = refresh_s
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._digests: dict[bytes, str] | None = None
        self._read_at = 0.0
        self._stop = threading.Event()

    def refresh(self) -> bool:
        # The keys are as fresh as the read's start, not its end: a read that hangs, then answers
        # with the secret as it was, must not make a key revoked meanwhile look fresh.
        started = self._clock()
        try:
            digests, dropped = parse_keys(self._fetch())
        except Exception as error:  # any failure keeps the keys in hand, within max_stale_s
            if self._digests is None:
                held = "none held"
            else:
                left = self.max_stale_s - (self._clock() - self._read_at)
                held = f"the {len(self._digests)} held served for {max(left, 0):.0f} s more"
            # Its message holds no key; UNREAD_LINE is what the ApiKeysUnread alarm counts.
            logger.warning("%s (%s: %s); %s", UNREAD_LINE, type(error).__name__, error, held)
            return False
        for complaint in dropped:
            logger.warning("%s: %s", DROPPED_LINE, complaint)
        if self._digests is None or set(digests.values()) != set(self._digests.values()):
            logger.info("API keys read: ids %s", ", ".join(sorted(digests.values())) or "(none)")
        self._digests = digests
        self._read_at = started
        return True

    def identify(self, presented: str) -> str | None:
        """The id of the key presented, or None. Every held digest is compared, in constant time."""
        digests = self._digests
        if digests is None:
            raise KeysUnavailable(NOT_LOADED)
        if self._clock() - self._read_at > self.max_stale_s:
            raise KeysUnavailable(STALE.format(self.max_stale_s))
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
STALE = "API keys could not be read for over {:.0f} s; refusing every key until they are."


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
        except KeysUnavailable as unavailable:
            await _refuse(kind, send, 503, _error(str(unavailable), "api_keys_unavailable", "server_error"))
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
        # The key stops here: the ingress and the engines behind it never see it.
        headers = [(name, value) for name, value in scope.get("headers", []) if name.lower() != b"authorization"]
        await self.app({**scope, "headers": headers}, receive, send)


class BodyLimitMiddleware:
    """Pure ASGI: 413 for a body over ``max_bytes``, by ``Content-Length`` before a byte is read, or
    by the bytes received before any is relayed (the body is held, then handed on whole)."""

    def __init__(self, app: App, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._too_large(send)
                    return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._too_large(send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        message = TOO_LARGE.format(self.max_bytes)
        body = json.dumps({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 413}})
        await _refuse("http", send, 413, body.encode())


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
            from botocore.config import Config

            client.append(boto3.client("secretsmanager", region_name=region, config=Config(**READ_LIMITS)))
        return str(client[0].get_secret_value(SecretId=secret_id)["SecretString"])

    return fetch


def middlewares() -> list[Any]:
    """The proxy hook: Ray Serve calls it once per proxy and wraps its ASGI app in the result: the
    key check first (when ``SECRET_ENV`` names the keys' secret), then the body's bound."""
    limit, secret_id = os.environ.get(MAX_BODY_ENV), os.environ.get(SECRET_ENV)
    if limit is not None and not limit.isdigit():
        raise RuntimeError(f"{MAX_BODY_ENV} is {limit!r}: the largest body to relay, a whole number of bytes")
    if not (limit or secret_id):
        # Fails the proxy's start: a hook configured with nothing to check is a broken pod spec.
        raise RuntimeError(f"neither {MAX_BODY_ENV} nor {SECRET_ENV} is set: the proxy hook has nothing to check")
    from starlette.middleware import Middleware

    found = [Middleware(BodyLimitMiddleware, max_bytes=int(limit))] if limit else []
    if not secret_id:
        return found
    store = KeyStore(
        secrets_manager_fetch(secret_id),
        float(os.environ.get(REFRESH_ENV, DEFAULT_REFRESH_S)),
        float(os.environ.get(MAX_STALE_ENV, DEFAULT_MAX_STALE_S)),
    )
    store.start()
    return [Middleware(ApiKeyMiddleware, store=store), *found]
