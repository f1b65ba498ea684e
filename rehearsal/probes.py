"""What a client sees, and what the engines' own counters say about the KV cache they moved."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from eks_pd_serving.observability import catalogue as om

MAX_TOKENS = 16
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
# vLLM engine counters as Ray exports them (log_engine_metrics, on by default in Ray Serve LLM).
EXTERNAL = ("ray_vllm_prompt_tokens_by_source_total", "external_kv_transfer")
LOCAL = ("ray_vllm_prompt_tokens_by_source_total", "local_compute")
NIXL_TRANSFERS = ("ray_vllm_nixl_xfer_time_seconds_count", None)
NIXL_BYTES = ("ray_vllm_nixl_bytes_transferred_sum", None)
NIXL_FAILED = ("ray_vllm_nixl_num_failed_transfers_total", None)
COUNTERS = {
    "external_kv_tokens": EXTERNAL,
    "local_tokens": LOCAL,
    "nixl_transfers": NIXL_TRANSFERS,
    "nixl_bytes": NIXL_BYTES,
    "nixl_failed_transfers": NIXL_FAILED,
}


# The failover's path counter (fault_tolerance/failover: METRIC), as Ray exports a Serve counter.
PATHS_METRIC = om.REQUESTS_BY_PATH


def paths_served(metrics_url: str) -> dict[str, float]:
    """Requests by the path that served them, summed over the processes counting them (the
    ingress counts prefill_whole and refused, decode the others)."""
    found: dict[str, float] = {}
    for name, labels, value in _samples(metrics_url):
        if name == PATHS_METRIC:
            found[labels.get("path", "")] = found.get(labels.get("path", ""), 0.0) + value
    return found


class ProbeFailed(RuntimeError):
    """A probe did not get what an OpenAI client expects."""


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model_id: str
    metrics_url: str
    # With the deployment's API key check: the key every probe sends.
    api_key: str | None = None

    def client(self, timeout_s: float) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        return httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ProbeFailed(message)


def _samples(metrics_url: str) -> list[tuple[str, dict[str, str], float]]:
    found = []
    for line in httpx.get(metrics_url, timeout=30).text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            found.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), float(match["value"])))
    return found


_TYPE = re.compile(r"^# TYPE (?P<name>\S+) (?P<type>\S+)$")
# Labels whose values say which component a sample came from; the others (ids, addresses) only
# have their keys recorded.
_CATALOGUED_VALUES = frozenset({"deployment", "application", "source", "engine", "model_name", "Component", "path"})


def metric_catalogue(metrics_url: str) -> dict[str, dict[str, Any]]:
    """Every metric family Ray's Prometheus endpoint exports: its type, and its label keys (with
    the values of the few labels that name a component). What a dashboard may name."""
    text = httpx.get(metrics_url, timeout=30).text
    families: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if match := _TYPE.match(line):
            families[match["name"]] = {"type": match["type"], "labels": {}}
    for name, labels, _value in _samples(metrics_url):
        family = next((f for f in (name, name.rsplit("_", 1)[0]) if f in families), None)
        if family is None:
            continue
        known = families[family]["labels"]
        for key, value in labels.items():
            values = known.setdefault(key, [])
            if key in _CATALOGUED_VALUES and value not in values:
                values.append(value)
    for entry in families.values():
        entry["labels"] = {key: sorted(values) for key, values in sorted(entry["labels"].items())}
    return dict(sorted(families.items()))


def worker_joins(metrics_url: str, histograms: list[str], join: str) -> dict[str, dict[str, Any]]:
    """For each vLLM histogram: the workers that observed something, and the Serve deployments
    those workers join to through ``join``'s WorkerId label (the join the dashboard's PromQL makes,
    as Ray's own Serve LLM dashboard does). Proves a per-phase query can attribute every series."""
    deployment_of: dict[str, str] = {}
    observed: dict[str, set[str]] = {family: set() for family in histograms}
    for name, labels, value in _samples(metrics_url):
        if name == join and labels.get("WorkerId"):
            deployment_of[labels["WorkerId"]] = labels.get("deployment", "")
        for family in histograms:
            if name == f"{family}_count" and value > 0:
                observed[family].add(labels.get("WorkerId", ""))
    return {
        family: {
            "workers": len(workers),
            "unjoined": sorted(w for w in workers if w not in deployment_of),
            "deployments": sorted({deployment_of[w].split(":")[0] for w in workers if w in deployment_of}),
        }
        for family, workers in observed.items()
    }


def engine_counters(metrics_url: str) -> dict[str, float]:
    """The KV counters summed over every engine replica, from Ray's Prometheus endpoint."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for name, labels, value in _samples(metrics_url):
        for key, (wanted, wanted_source) in COUNTERS.items():
            if name == wanted and wanted_source in (None, labels.get("source")):
                totals[key] += value
    return totals


def engine_counters_by_replica(metrics_url: str) -> dict[str, dict[str, float]]:
    """The same counters by the Serve replica exporting them (Ray tags each with its ReplicaId):
    a replica that Serve replaced starts its own from zero, so a delta is taken per replica."""
    found: dict[str, dict[str, float]] = {}
    for name, labels, value in _samples(metrics_url):
        for key, (wanted, wanted_source) in COUNTERS.items():
            if name == wanted and wanted_source in (None, labels.get("source")):
                replica = found.setdefault(labels.get("ReplicaId", ""), dict.fromkeys(COUNTERS, 0.0))
                replica[key] += value
    return found


def counted_since(key: str, start: dict[str, dict[str, float]], stop: dict[str, dict[str, float]]) -> float:
    """How much ``key`` grew from ``start`` to ``stop`` (by-replica readings): a replica that is new
    at ``stop`` counts from zero, one that is gone counts nothing more."""
    return sum(counts[key] - start.get(replica, {}).get(key, 0.0) for replica, counts in stop.items())


def external_kv_by_replica(metrics_url: str) -> dict[str, float]:
    """Prompt tokens each engine loaded from a remote engine, by the Serve replica it runs in."""
    name, source = EXTERNAL
    found: dict[str, float] = {}
    for sample, labels, value in _samples(metrics_url):
        if sample == name and labels.get("source") == source:
            # Ray tags every metric a Serve replica exports with its ReplicaId.
            replica = labels.get("ReplicaId", "")
            found[replica] = found.get(replica, 0.0) + value
    return found


def settled_counters(metrics_url: str, quiet_s: float = 2.0, limit_s: float = 30.0) -> dict[str, float]:
    """Counters once no engine has exported a change for ``quiet_s`` (several export intervals,
    so every engine process flushed at least once since the last change)."""
    deadline = time.monotonic() + limit_s
    last = engine_counters(metrics_url)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.25)
        now = engine_counters(metrics_url)
        if now != last:
            last, quiet_since = now, time.monotonic()
    return last


class CounterTracker:
    """Attributes the engines' counter movement to one request at a time: requests go one by
    one, and the counters are read settled between them."""

    def __init__(self, metrics_url: str) -> None:
        self.metrics_url = metrics_url
        self.last = settled_counters(metrics_url)

    def measured(self, send: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        before = self.last
        result = send()
        self.last = settled_counters(self.metrics_url)
        result["engine"] = {k: self.last[k] - before[k] for k in before}
        return result


def _chat_body(endpoint: Endpoint, prompt: str, stream: bool = False, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": endpoint.model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def chat(client: httpx.Client, endpoint: Endpoint, prompt: str) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json=_chat_body(endpoint, prompt))
    _check(resp.status_code == 200, f"chat: HTTP {resp.status_code} {resp.text[:200]}")
    body = resp.json()
    return {
        "kind": "chat",
        "prompt": prompt,
        "text": body["choices"][0]["message"]["content"],
        "prompt_tokens": body["usage"]["prompt_tokens"],
    }


def completion(client: httpx.Client, endpoint: Endpoint, prompt: str) -> dict[str, Any]:
    body = {"model": endpoint.model_id, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    resp = client.post("/v1/completions", json=body)
    _check(resp.status_code == 200, f"completions: HTTP {resp.status_code} {resp.text[:200]}")
    out = resp.json()
    return {
        "kind": "completion",
        "prompt": prompt,
        "text": out["choices"][0]["text"],
        "prompt_tokens": out["usage"]["prompt_tokens"],
    }


def stream_chat(client: httpx.Client, endpoint: Endpoint, prompt: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """One streaming chat completion (SSE): text, time to first token, tokens per second."""
    started = time.monotonic()
    first = last = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    done = False
    body = _chat_body(endpoint, prompt, stream=True, max_tokens=max_tokens)
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        _check(resp.status_code == 200, f"streaming chat: HTTP {resp.status_code}")
        _check(resp.headers["content-type"].startswith("text/event-stream"), "streaming chat: not SSE")
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if delta:
                last = time.monotonic()
                first = first or last
                pieces.append(delta)
    _check(done, "streaming chat: no [DONE]")
    _check(first is not None and last is not None and bool(usage), "streaming chat: no content or usage")
    assert first is not None and last is not None
    tokens = int(usage["completion_tokens"])
    return {
        "kind": "stream",
        "prompt": prompt,
        "text": "".join(pieces),
        "prompt_tokens": usage["prompt_tokens"],
        "ttft_s": first - started,
        "completion_tokens": tokens,
        "tokens_per_s": (tokens - 1) / (last - first) if tokens > 1 and last > first else None,
    }


def run_probes(endpoint: Endpoint, prompts: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with endpoint.client(120) as client:
        models = client.get("/v1/models")
        _check(models.status_code == 200, f"/v1/models: HTTP {models.status_code}")
        ids = [m["id"] for m in models.json()["data"]]
        _check(endpoint.model_id in ids, f"/v1/models lists {ids}, not {endpoint.model_id}")
        result["models"] = ids

        tracker = CounterTracker(endpoint.metrics_url)
        result["requests"] = [
            tracker.measured(lambda p=probe, q=prompt: p(client, endpoint, q))  # type: ignore[misc]
            for probe in (chat, stream_chat, completion)
            for prompt in prompts
        ]

        bad = client.post("/v1/chat/completions", json={"model": endpoint.model_id, "messages": "not a list"})
        _check(400 <= bad.status_code < 500, f"malformed request: HTTP {bad.status_code}, expected 4xx")
        _check(isinstance(bad.json(), dict), "malformed request: no JSON error body")
        unknown = client.post("/v1/chat/completions", json={**_chat_body(endpoint, "hi"), "model": "no-such-model"})
        _check(400 <= unknown.status_code < 500, f"unknown model: HTTP {unknown.status_code}, expected 4xx")
        _check(client.get("/v1/models").status_code == 200, "server down after bad requests")
        result["errors"] = {"malformed": bad.status_code, "unknown_model": unknown.status_code}
    return result


def short_prompts(endpoint: Endpoint, threshold: int) -> dict[str, Any]:
    """Conditional disaggregation as a client meets it: a chat prompt within ``threshold`` tokens
    and one past it, each alone. For each: its prompt tokens, the paths the failover counted and
    the KV decode loaded from prefill while it ran."""
    found: dict[str, Any] = {}
    with endpoint.client(120) as client:
        # Grown until a chat completion's own usage counts more prompt tokens than the threshold.
        words: list[str] = []
        while True:
            words += ["prefill", "decode", "cache", "block", "transfer"] * 4
            counted = chat(client, endpoint, " ".join(words))
            if counted["prompt_tokens"] > threshold or len(words) > 4 * threshold:
                break
        past = " ".join(words)
        tracker = CounterTracker(endpoint.metrics_url)
        for name, prompt in (("within", "The quick brown fox"), ("past", past)):
            before = paths_served(endpoint.metrics_url)
            result = tracker.measured(lambda q=prompt: chat(client, endpoint, q))  # type: ignore[misc]
            after = paths_served(endpoint.metrics_url)
            result["paths"] = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)}
            result.pop("text")
            result["prompt"] = result["prompt"][:40]
            found[name] = result
    return found


def short_prompts_judged(found: dict[str, Any], threshold: int) -> tuple[bool, list[str]]:
    """Within the threshold: served on decode alone, no KV loaded; past it: disaggregated, KV loaded."""
    within, past = found["within"], found["past"]
    ok = (
        within["prompt_tokens"] <= threshold < past["prompt_tokens"]
        and within["paths"] == {"short_prompt": 1.0}
        and within["engine"]["external_kv_tokens"] == 0
        and past["paths"] == {"disaggregated": 1.0}
        and past["engine"]["external_kv_tokens"] > 0
    )
    shown = [
        f"{r['prompt_tokens']} tokens -> {r['paths']}, KV loaded {r['engine']['external_kv_tokens']:.0f}"
        for r in (within, past)
    ]
    line = f"{'PASS' if ok else 'FAIL'}: short prompts (at most {threshold} tokens) on decode alone: " + "; ".join(
        shown
    )
    return ok, [line]
