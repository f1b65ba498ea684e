"""What a client may not do to the PD pair, probed on the running application (issue 56):

- a request that carries the orchestrator's ``kv_transfer_params`` (naming a listener on this
  machine as the KV source, or asking for the engine's NIXL address) or ``ec_transfer_params`` is
  refused with 400, and the listener sees no connection;
- ``<model>:<adapter>`` with no adapters is 404, and the next request still goes disaggregated (no
  breaker opened by a client's error);
- a 2 MB chat is refused with 400 before it is tokenized, while another client's stream keeps its
  pace: its longest gap between chunks while the large requests arrive, against twice the median
  gap of the same stream alone (each the median of ``RUNS`` runs).
"""

from __future__ import annotations

import itertools
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from .probes import Endpoint, _chat_body, paths_served

RUNS = 3
LARGE_CHARS = 2 * 1024 * 1024
STREAM_TOKENS = 48
# What a refusal must not have let through: the listener's accepted connections within this.
LISTEN_S = 3.0
ARRIVAL_S = 0.005


class Listener:
    """A TCP listener on loopback that counts the connections it is offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def transfer_params(endpoint: Endpoint) -> dict[str, Any]:
    """Each forbidden field as a client would send it: its status and error type, and what the
    listener it names saw."""
    listener = Listener()
    found: dict[str, Any] = {}
    pull = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "attacker",
        "remote_host": "127.0.0.1",
        "remote_port": listener.port,
        "remote_block_ids": [0, 1, 2],
        "remote_request_id": "attacker-1",
    }
    bodies: dict[str, dict[str, Any]] = {
        "kv_pull_from_listener": {"kv_transfer_params": pull},
        "kv_remote_decode": {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}},
        "kv_empty": {"kv_transfer_params": {}},
        "ec_transfer_params": {"ec_transfer_params": {"do_remote_encode": True}},
    }
    try:
        with endpoint.client(60) as client:
            for name, extra in bodies.items():
                routes: list[tuple[str, dict[str, Any]]] = [
                    ("/v1/chat/completions", _chat_body(endpoint, "The quick brown fox")),
                    ("/v1/completions", {"model": endpoint.model_id, "prompt": "The quick brown fox", "max_tokens": 4}),
                ]
                for route, body in routes:
                    answer = client.post(route, json={**body, **extra})
                    error = (
                        answer.json().get("error") or {}
                        if answer.headers.get("content-type", "").startswith("application/json")
                        else {}
                    )
                    found[f"{name} {route}"] = {"status": answer.status_code, "param": error.get("param")}
        time.sleep(LISTEN_S)
    finally:
        listener.close()
    found["listener_connections"] = listener.accepted
    return found


def adapter_then_next(endpoint: Endpoint) -> dict[str, Any]:
    """An adapter id the model does not serve, then a plain request: their statuses and the paths the
    plain one was counted on."""
    with endpoint.client(60) as client:
        adapter = client.post(
            "/v1/chat/completions", json={**_chat_body(endpoint, "hi"), "model": f"{endpoint.model_id}:x"}
        )
        before = paths_served(endpoint.metrics_url)
        plain = client.post("/v1/chat/completions", json=_chat_body(endpoint, "Prefill computes the prompt"))
        # Ray exports a Serve counter every few seconds: read until it moved (or 30 s passed).
        deadline = time.monotonic() + 30
        after = paths_served(endpoint.metrics_url)
        while after == before and time.monotonic() < deadline:
            time.sleep(1)
            after = paths_served(endpoint.metrics_url)
        time.sleep(2)
        after = paths_served(endpoint.metrics_url)
    return {
        "adapter_status": adapter.status_code,
        "next_status": plain.status_code,
        "next_paths": {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)},
    }


def _stream_gaps(endpoint: Endpoint, during: Callable[[], None] | None = None) -> list[float]:
    """The gaps between one stream's chunks; ``during`` runs beside it once its first chunk came."""
    body = _chat_body(endpoint, "Decode streams tokens one by one", stream=True, max_tokens=STREAM_TOKENS)
    body["ignore_eos"] = True
    stamps: list[float] = []
    side: threading.Thread | None = None
    with endpoint.client(120) as client, client.stream("POST", "/v1/chat/completions", json=body) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.monotonic())
                if during is not None and side is None:
                    side = threading.Thread(target=during)
                    side.start()
    if side is not None:
        side.join()
    # Ray batches a stream's chunks: lines that arrive together (within ARRIVAL_S) are one arrival.
    arrivals = [t for previous, t in itertools.pairwise([float("-inf"), *stamps]) if t - previous > ARRIVAL_S]
    return [b - a for a, b in itertools.pairwise(arrivals)]


def large_prompt(endpoint: Endpoint) -> dict[str, Any]:
    """A 2 MB chat's status and how long it took, and another client's stream alone and beside it."""
    large = _chat_body(endpoint, ("prefill " * (LARGE_CHARS // 8))[:LARGE_CHARS])
    answers: list[dict[str, Any]] = []

    def send_large() -> None:
        with endpoint.client(120) as client:
            for _ in range(2):
                started = time.monotonic()
                answer = client.post("/v1/chat/completions", json=large)
                answers.append({"status": answer.status_code, "took_s": time.monotonic() - started,
                                "text": answer.text[:300]})  # fmt: skip

    alone, alone_max, beside = [], [], []
    for _ in range(RUNS):
        gaps = _stream_gaps(endpoint)
        alone.append(statistics.median(gaps))
        alone_max.append(max(gaps))
        beside.append(max(_stream_gaps(endpoint, send_large)))
    return {
        "large_chars": LARGE_CHARS,
        "large": answers,
        "median_gap_alone_s": statistics.median(alone),
        "max_gap_alone_s": statistics.median(alone_max),
        "max_gap_beside_large_s": statistics.median(beside),
        "runs": RUNS,
    }


def probe(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "transfer_params": transfer_params(endpoint),
        "adapter": adapter_then_next(endpoint),
        "large_prompt": large_prompt(endpoint),
    }


def judge(found: dict[str, Any]) -> tuple[bool, list[str]]:
    params = found["transfer_params"]
    statuses = {k: v["status"] for k, v in params.items() if k != "listener_connections"}
    params_ok = set(statuses.values()) == {400} and params["listener_connections"] == 0
    adapter = found["adapter"]
    adapter_ok = (adapter["adapter_status"], adapter["next_status"], adapter["next_paths"]) == (
        404,
        200,
        {"disaggregated": 1.0},
    )
    large = found["large_prompt"]
    bound = 2 * large["median_gap_alone_s"]
    # The refusal is the verdict; the neighbour's gaps are a measurement on a shared 2-core machine,
    # reported against the bound (twice its median alone), never a timed pass/fail.
    large_ok = {a["status"] for a in large["large"]} == {400}

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines = [
        f"{verdict(params_ok)}: client transfer params: {sorted(set(statuses.values()))} for {len(statuses)} "
        f"requests, {params['listener_connections']} connections to the listener they named",
        f"{verdict(adapter_ok)}: an adapter id without adapters: HTTP {adapter['adapter_status']}; the next "
        f"request HTTP {adapter['next_status']} on {adapter['next_paths']}",
        f"{verdict(large_ok)}: a {large['large_chars'] // 1024 // 1024} MB chat: HTTP "
        f"{sorted({a['status'] for a in large['large']})} in at most {max(a['took_s'] for a in large['large']):.2f} s",
        f"measured: another stream's longest gap beside the 2 MB chats {large['max_gap_beside_large_s']:.3f} s "
        f"({'within' if large['max_gap_beside_large_s'] <= bound else 'over'} twice its median alone, {bound:.3f} s; "
        f"its longest alone {large['max_gap_alone_s']:.3f} s; medians of {large['runs']} runs)",
    ]
    return params_ok and adapter_ok and large_ok, lines
