"""The HTTP half of `verify`: /v1/models and one streamed chat completion, timed. Only httpx,
so the CPU rehearsal runs the very same check against its local endpoint."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class EndpointReport:
    models: list[str]
    ttft_s: float
    total_s: float
    text: str


class EndpointFailed(RuntimeError):
    pass


def check_refused_without_key(base_url: str, timeout_s: float = 30.0) -> int:
    """The status of ``GET /v1/models`` sent with no key: 401 where the API key check runs."""
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        return client.get("/v1/models").status_code


def check_endpoint(
    base_url: str, model_id: str, timeout_s: float = 120.0, api_key: str | None = None
) -> EndpointReport:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    with httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers) as client:
        response = client.get("/v1/models")
        if response.status_code != 200:
            raise EndpointFailed(f"GET /v1/models: HTTP {response.status_code}")
        models = [m["id"] for m in response.json()["data"]]
        if model_id not in models:
            raise EndpointFailed(f"/v1/models lists {models}, not {model_id}")
        body = {
            "model": model_id,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
        }
        started = time.monotonic()
        first = None
        pieces = []
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            if stream.status_code != 200:
                raise EndpointFailed(f"POST /v1/chat/completions: HTTP {stream.status_code}")
            for line in stream.iter_lines():
                data = line.removeprefix("data: ")
                if not line.startswith("data: ") or data == "[DONE]":
                    continue
                choices = json.loads(data)["choices"]
                delta = choices[0]["delta"].get("content") if choices else None
                if delta:
                    first = first or time.monotonic()
                    pieces.append(delta)
        if first is None:
            raise EndpointFailed("chat completion streamed no content")
        return EndpointReport(models, first - started, time.monotonic() - started, "".join(pieces))
