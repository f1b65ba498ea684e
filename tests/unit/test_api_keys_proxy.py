"""The Serve proxies' API key check (endpoint/proxy/eks_pd_api_keys.py), as pure ASGI in front of
a stand-in application, through httpx's ASGI transport; the Secrets Manager read against moto.
Ray's own loading of it (the proxy hook) is in tests/gates/test_ray_validation.py; the whole
path in front of the PD app, with the OpenAI SDK, in the CPU rehearsal."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import MutableMapping
from typing import Any

import boto3
import httpx
import pytest
from moto import mock_aws

from eks_pd_serving.endpoint.proxy import eks_pd_api_keys as keys

KEY_A = "a" * 40
KEY_B = "B1" * 24
SECRET = json.dumps({"app-a": KEY_A})


class Engine:
    """Stands in for Serve's router: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.headers: list[list[tuple[bytes, bytes]]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        self.headers.append(list(scope.get("headers", [])))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"served"})


def store_of(secret: str) -> keys.KeyStore:
    store = keys.KeyStore(lambda: secret)
    assert store.refresh()
    return store


def call(store: keys.KeyStore, path: str, key: str | None, method: str = "POST") -> tuple[httpx.Response, Engine]:
    engine = Engine()
    app = keys.ApiKeyMiddleware(engine, store)
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            return await client.request(method, path, headers=headers, json={"model": "m"})

    return asyncio.run(go()), engine


# Ray Serve LLM's OpenAI routes (ray.llm._internal.serve.core.ingress.ingress.DEFAULT_ENDPOINTS),
# Serve's own route table, and a path nothing serves.
ROUTES = [
    "/v1/models",
    "/v1/models/m",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/audio/transcriptions",
    "/v1/score",
    "/tokenize",
    "/detokenize",
    "/-/routes",
    "/nothing-here",
]


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_without_a_key_gets_401_in_openai_shape_and_reaches_nothing(path: str) -> None:
    response, engine = call(store_of(SECRET), path, None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert engine.paths == []


@pytest.mark.parametrize("presented", ["x" * 40, KEY_A[:-1], KEY_A + "a", ""])
def test_an_unknown_key_gets_401_and_reaches_nothing(presented: str) -> None:
    response, engine = call(store_of(SECRET), "/v1/chat/completions", presented)
    assert response.status_code == 401
    assert engine.paths == []


def test_a_known_key_passes_and_the_log_names_its_id_not_the_key(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        response, engine = call(store_of(SECRET), "/v1/chat/completions", KEY_A)
    assert (response.status_code, response.text, engine.paths) == (200, "served", ["/v1/chat/completions"])
    assert "api_key_id=app-a POST /v1/chat/completions" in caplog.text
    assert KEY_A not in caplog.text


def test_a_refused_path_cannot_forge_a_line_or_spell_the_kv_alarms_phrase(caplog: pytest.LogCaptureFixture) -> None:
    """Anyone who reaches the port chooses the path: logged re-encoded and capped (issue 37/38)."""
    from eks_pd_serving.observability.catalogue import KV_PULL_FAILED_LINE

    forged = "/" + KV_PULL_FAILED_LINE.replace(" ", "%20") + "%0AERROR%20forged" + "x" * 500
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        response, engine = call(store_of(SECRET), forged, None, method="GET")
    assert response.status_code == 401 and engine.paths == []
    (record,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert KV_PULL_FAILED_LINE not in record and "\n" not in record
    assert record.startswith("api_key refused GET /Skipping%20KV%20post-processing") and "%0AERROR" in record
    assert len(record) < keys.LOGGED_PATH_CHARS + 40


def test_the_health_path_is_open_and_only_it() -> None:
    response, engine = call(store_of(SECRET), "/-/healthz", None, method="GET")
    assert (response.status_code, engine.paths) == (200, ["/-/healthz"])
    response, engine = call(store_of(SECRET), "/-/healthz/more", None, method="GET")
    assert (response.status_code, engine.paths) == (401, [])


def test_basic_and_other_schemes_are_not_a_key() -> None:
    engine = Engine()
    app = keys.ApiKeyMiddleware(engine, store_of(SECRET))

    async def go() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            return (await client.get("/v1/models", headers={"Authorization": f"Basic {KEY_A}"})).status_code

    assert asyncio.run(go()) == 401


def test_every_held_digest_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_of(json.dumps({"first": KEY_A, "second": KEY_B, "third": "c" * 32}))
    calls: list[int] = []
    real = hmac.compare_digest

    def counted(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counted)
    assert store.identify(KEY_A) == "first"
    assert len(calls) == 3  # no early exit on the first match


def test_rotation_takes_effect_at_the_next_read_without_a_restart() -> None:
    secret = {"value": json.dumps({"old": KEY_A})}
    store = keys.KeyStore(lambda: secret["value"], refresh_s=0.05)
    store.start()
    try:
        assert store.identify(KEY_A) == "old"
        secret["value"] = json.dumps({"old": KEY_A, "new": KEY_B})
        assert _eventually(lambda: store.identify(KEY_B) == "new")
        secret["value"] = json.dumps({"new": KEY_B})
        assert _eventually(lambda: store.identify(KEY_A) is None)
        assert store.identify(KEY_B) == "new"
    finally:
        store.stop()


def _eventually(condition: Any, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_read_keeps_the_keys_in_hand_until_max_stale_then_refuses_every_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def unreadable() -> str:
        raise ConnectionError("no route to Secrets Manager")

    secret, clock = {"read": lambda: SECRET}, Clock()
    store = keys.KeyStore(lambda: secret["read"](), refresh_s=30, max_stale_s=300, clock=clock)
    assert store.refresh()
    secret["read"] = unreadable
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        for _ in range(9):
            clock.now += 30
            assert not store.refresh()
    assert store.identify(KEY_A) == "app-a"  # 270 s after the last good read
    assert (
        "API keys not read (ConnectionError: no route to Secrets Manager); the 1 held served for 30 s more"
        in caplog.text
    )
    clock.now += 31
    response, engine = call(store, "/v1/models", KEY_A, method="GET")
    assert (response.status_code, engine.paths) == (503, [])
    assert response.json()["error"]["message"] == keys.STALE.format(300)
    # The first good read serves again.
    secret["read"] = lambda: SECRET
    assert store.refresh() and store.identify(KEY_A) == "app-a"


def test_a_revoked_key_dies_at_the_next_read_even_when_the_write_holds_a_bad_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The attack that held before: revoke app-a and, in the same write, add a too-short key. The
    whole secret was refused and app-a stayed valid without limit."""
    secret = {"value": json.dumps({"app-a": KEY_A, "app-b": KEY_B})}
    store = keys.KeyStore(lambda: secret["value"])
    assert store.refresh()
    secret["value"] = json.dumps({"app-b": KEY_B, "typo": "short"})
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert store.refresh()
    assert store.identify(KEY_A) is None and store.identify(KEY_B) == "app-b"
    assert f"{keys.DROPPED_LINE}: the key of 'typo' is not a string of 32 or more characters" in caplog.text
    assert "short" not in caplog.text.replace("'typo'", "")


def test_the_unread_line_is_the_one_the_alarm_counts() -> None:
    from eks_pd_serving.observability import catalogue

    assert keys.UNREAD_LINE == catalogue.API_KEYS_UNREAD_LINE


def test_before_any_key_is_read_requests_get_503_not_through() -> None:
    def unreadable() -> str:
        raise ConnectionError("no route to Secrets Manager")

    store = keys.KeyStore(unreadable)
    assert not store.refresh()
    response, engine = call(store, "/v1/models", KEY_A, method="GET")
    assert (response.status_code, engine.paths) == (503, [])
    assert response.json()["error"]["code"] == "api_keys_unavailable"


@pytest.mark.parametrize(("secret", "complaint"), [("not json", "not JSON"), ("[]", "JSON object")])
def test_a_secret_that_is_not_an_object_is_no_read_at_all(secret: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        keys.parse_keys(secret)


@pytest.mark.parametrize(
    ("entries", "complaint"),
    [
        ({"bad id!": KEY_A}, "an entry's id (7 characters) is not 1-64 letters"),
        ({"app": "short-key"}, "the key of 'app' is not a string of 32 or more"),
        ({"app": KEY_A[:20] + " " + KEY_A[:20]}, "the key of 'app' is not a string of 32 or more"),
        ({"one": KEY_B, "two": KEY_B}, "'two' holds the same key as 'one'"),
    ],
)
def test_a_bad_entry_is_dropped_by_its_id_and_the_rest_apply(entries: dict[str, str], complaint: str) -> None:
    digests, dropped = keys.parse_keys(json.dumps({"good": KEY_A, **entries}))
    assert "good" in digests.values() and len(dropped) == 1
    assert dropped[0].startswith(complaint), dropped
    assert KEY_A not in dropped[0] and KEY_B not in dropped[0] and "short-key" not in dropped[0]


def test_an_empty_object_is_a_read_of_no_keys_every_request_refused() -> None:
    store = store_of("{}")
    response, engine = call(store, "/v1/models", KEY_A, method="GET")
    assert (response.status_code, engine.paths) == (401, [])


def test_a_websocket_without_a_key_is_closed_before_accept() -> None:
    engine = Engine()
    sent: list[dict[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    asyncio.run(keys.ApiKeyMiddleware(engine, store_of(SECRET))(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}] and engine.paths == []


def test_the_proxy_hook_refuses_to_start_with_nothing_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(keys.SECRET_ENV, raising=False)
    monkeypatch.delenv(keys.MAX_BODY_ENV, raising=False)
    with pytest.raises(RuntimeError, match=keys.SECRET_ENV):
        keys.middlewares()
    monkeypatch.setenv(keys.MAX_BODY_ENV, "lots")
    with pytest.raises(RuntimeError, match=keys.MAX_BODY_ENV):
        keys.middlewares()


class Reader(Engine):
    """Reads the whole body, as Serve's router relays it."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        await super().__call__(scope, receive, send)


def post_body(content: Any, max_bytes: int, headers: dict[str, str] | None = None) -> tuple[httpx.Response, Reader]:
    reader = Reader()

    async def go() -> httpx.Response:
        app = keys.BodyLimitMiddleware(reader, max_bytes)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
            return await client.post("/v1/completions", content=content, headers=headers or {})

    return asyncio.run(go()), reader


def test_a_body_over_the_bound_by_its_length_is_413_and_relays_nothing() -> None:
    answer, reader = post_body(b"x" * 1001, 1000)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == 413 and reader.paths == []


def test_a_chunked_body_over_the_bound_is_413_before_any_byte_is_relayed() -> None:
    async def chunks() -> Any:
        for _ in range(11):
            yield b"x" * 100

    answer, reader = post_body(chunks(), 1000)
    assert answer.status_code == 413 and reader.paths == [] and reader.bodies == []


def test_a_body_within_the_bound_reaches_the_app_whole() -> None:
    async def chunks() -> Any:
        for _ in range(10):
            yield b"x" * 100

    answer, reader = post_body(chunks(), 1000)
    assert answer.status_code == 200 and reader.bodies == [b"x" * 1000]
    answer, reader = post_body(b'{"model": "m"}', 1000)
    assert answer.status_code == 200 and reader.bodies == [b'{"model": "m"}']


def test_a_lying_content_length_is_still_counted() -> None:
    """A client that declares less than it sends: the bytes received decide."""

    async def go() -> list[Any]:
        sent: list[Any] = []
        messages = iter([{"type": "http.request", "body": b"x" * 600, "more_body": True},
                         {"type": "http.request", "body": b"x" * 600, "more_body": False}])  # fmt: skip
        reader = Reader()
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"content-length", b"10")]}

        async def receive() -> Any:
            return next(messages)

        async def send(message: Any) -> None:
            sent.append(message)

        await keys.BodyLimitMiddleware(reader, 1000)(scope, receive, send)
        assert reader.paths == []
        return sent

    assert asyncio.run(go())[0]["status"] == 413


@mock_aws
def test_the_keys_are_read_from_secrets_manager_in_the_secrets_region(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a pod: no AWS_DEFAULT_REGION (botocore's variable); the ARN names the region.
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    client = boto3.client("secretsmanager", region_name="eu-west-1")
    arn = client.create_secret(Name="api-keys", SecretString=SECRET)["ARN"]
    store = keys.KeyStore(keys.secrets_manager_fetch(arn))
    assert store.refresh() and store.identify(KEY_A) == "app-a"
    client.put_secret_value(SecretId=arn, SecretString=json.dumps({"app-b": KEY_B}))
    assert store.refresh() and store.identify(KEY_A) is None and store.identify(KEY_B) == "app-b"


def test_the_key_does_not_travel_past_the_check() -> None:
    response, engine = call(store_of(SECRET), "/v1/chat/completions", KEY_A)
    assert response.status_code == 200
    ((headers),) = engine.headers
    assert not [name for name, _ in headers if name.lower() == b"authorization"]
    assert KEY_A.encode() not in b"".join(value for _, value in headers)
    assert (b"content-type", b"application/json") in headers  # the rest is passed on


def test_a_slow_read_that_answers_with_the_old_secret_does_not_make_a_revoked_key_fresh() -> None:
    """Seen before: a read that hung for an hour, then answered with the secret as it was when the
    read began, kept a key revoked meanwhile alive past the 300 s bound (its time was the answer's).
    Now the keys are as fresh as the read's start: revoked at R, the key dies by R + max_stale_s."""
    clock = Clock()
    store = keys.KeyStore(lambda: SECRET, refresh_s=30, max_stale_s=300, clock=clock)
    assert store.refresh()

    def slow_old_answer() -> str:
        clock.now += 3600  # the read hangs; the key is revoked meanwhile; the old secret comes back
        return SECRET

    store._fetch = slow_old_answer
    assert store.refresh()
    with pytest.raises(keys.KeysUnavailable, match="could not be read for over 300 s"):
        store.identify(KEY_A)


def test_the_secret_read_is_bounded() -> None:
    """botocore's defaults (60 s connect, 60 s read, five tries) let one read hang for minutes."""
    with mock_aws():
        fetch = keys.secrets_manager_fetch("arn:aws:secretsmanager:us-east-1:111122223333:secret:k-AbCdEf")
        with pytest.raises(Exception):  # noqa: B017  moto: no such secret; the client is made on the first read
            fetch()
    (client,) = fetch.__closure__[0].cell_contents  # type: ignore[index]
    config = client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (5, 10)
    assert config.retries == {"total_max_attempts": 3, "mode": "standard"}  # botocore counts the first try
