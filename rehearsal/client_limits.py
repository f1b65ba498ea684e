"""What a client may not do to the PD pair, probed on the running application (issues 56 and 65):

- a request that carries the orchestrator's ``kv_transfer_params`` or ``ec_transfer_params`` (at the
  top level naming a listener on this machine as the KV source, or inside ``vllm_xargs`` as every
  JSON type) is refused with 400 naming the field, the listener sees no connection, and no Serve
  replica or engine process restarts;
- a request's own chat template (top level, in ``chat_template_kwargs``) and ``tokenize`` are 400;
- each field a template renders, at 2 MB (assistant text, ``reasoning_content``, tool-call
  arguments, a tool's description, documents, a template option's value), is 400 before it is
  tokenized; a token-id prompt past max_model_len is 400 by its length, 2,000,000 of them and a 64 MB
  body are 413 at the Serve proxy, by Content-Length and chunked;
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
from .processes import marked_processes

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


# Every JSON type a nested transfer field may take (vLLM's engine core calls .get on any non-None one).
NESTED_VALUES: dict[str, Any] = {
    "string": "", "zero": 0, "number": 1.5, "true": True, "null": None, "list": [], "list_of_one": [1],
    "object": {}, "pull": {"do_remote_prefill": True},
}  # fmt: skip
# A JSON body of this size is refused at the Serve proxy (it is over any deployment's bound).
HUGE_BODY_BYTES = 64 * 1024 * 1024
TOKEN_IDS = 2_000_000


def serving_processes(run_id: str) -> list[int]:
    """The PIDs of this run's Serve replica processes and the engine processes under them."""
    found = set()
    for replica in marked_processes(run_id, "ServeReplica"):
        found.add(replica.pid)
        found.update(child.pid for child in replica.children(recursive=True))
    return sorted(found)


def transfer_params(endpoint: Endpoint) -> dict[str, Any]:
    """Each forbidden field as a client would send it, at the top level and nested in ``vllm_xargs``
    as every JSON type: its status and error ``param``, and what the listener it names saw."""
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
        **{
            f"vllm_xargs.{field} {kind}": {"vllm_xargs": {field: value}}
            for field in ("kv_transfer_params", "ec_transfer_params")
            for kind, value in NESTED_VALUES.items()
        },
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


def _refusal(answer: Any) -> dict[str, Any]:
    kind = answer.headers.get("content-type", "")
    error = (answer.json().get("error") or {}) if kind.startswith("application/json") else {}
    return {"status": answer.status_code, "param": error.get("param"), "type": error.get("type")}


def client_code(endpoint: Endpoint) -> dict[str, Any]:
    """A request's own chat template (a loop that would hold a tokenizer thread), at the top level
    and as a template option, and ``tokenize``: each status and ``param``."""
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    extras: dict[str, dict[str, Any]] = {
        "chat_template": {"chat_template": loop},
        "chat_template_kwargs.chat_template": {"chat_template_kwargs": {"chat_template": loop}},
        "chat_template_kwargs.tokenize": {"chat_template_kwargs": {"tokenize": True}},
    }
    with endpoint.client(60) as client:
        return {
            name: _refusal(client.post("/v1/chat/completions", json={**_chat_body(endpoint, "hi"), **extra}))
            for name, extra in extras.items()
        }


def rendered_fields(endpoint: Endpoint, max_model_len: int) -> dict[str, Any]:
    """Each field a chat template renders at ``LARGE_CHARS``, a token-id prompt one past
    ``max_model_len``: each status, ``param`` and how long the answer took."""
    large = ("prefill " * (LARGE_CHARS // 8))[:LARGE_CHARS]
    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": large}}
    tool = {"type": "function", "function": {"name": "f", "description": large, "parameters": {"type": "object"}}}
    chats: dict[str, dict[str, Any]] = {
        "assistant content": {"messages": [user, {"role": "assistant", "content": large}, user]},
        "reasoning_content": {
            "messages": [user, {"role": "assistant", "content": "a", "reasoning_content": large}, user]
        },
        "tool_calls arguments": {"messages": [user, {"role": "assistant", "tool_calls": [call]}, user]},
        "a tool's description": {"messages": [user], "tools": [tool]},
        "documents": {"messages": [user], "documents": [{"title": "t", "text": large}]},
        "chat_template_kwargs value": {"messages": [user], "chat_template_kwargs": {"enable_thinking": large}},
    }  # fmt: skip
    found: dict[str, Any] = {}
    with endpoint.client(120) as client:
        for name, extra in chats.items():
            started = time.monotonic()
            answer = client.post("/v1/chat/completions", json={**_chat_body(endpoint, "hi"), **extra})
            found[name] = {**_refusal(answer), "took_s": round(time.monotonic() - started, 3)}
        body = {"model": endpoint.model_id, "prompt": [7] * (max_model_len + 1), "max_tokens": 4}
        found["token ids past max_model_len"] = _refusal(client.post("/v1/completions", json=body))
    return found


def huge_bodies(endpoint: Endpoint) -> dict[str, Any]:
    """What the Serve proxy answers a body over any deployment's bound, by Content-Length and
    chunked (no length: the proxy counts what it receives), and 2,000,000 token ids."""
    blob = b'{"model": "m", "prompt": "' + b"x" * HUGE_BODY_BYTES + b'"}'

    def chunks() -> Any:
        for start in range(0, len(blob), 1 << 20):
            yield blob[start : start + (1 << 20)]

    found: dict[str, Any] = {}
    with endpoint.client(120) as client:
        headers = {"content-type": "application/json"}
        for name, content in (("64 MB by Content-Length", blob), ("64 MB chunked", chunks())):
            started = time.monotonic()
            try:
                answer = client.post("/v1/completions", content=content, headers=headers)
                found[name] = {**_refusal(answer), "took_s": round(time.monotonic() - started, 3)}
            except Exception as error:  # the proxy may close the connection once it answered
                found[name] = {"status": None, "error": f"{type(error).__name__}: {error}"[:200]}
        ids = {"model": endpoint.model_id, "prompt": [7] * TOKEN_IDS, "max_tokens": 4}
        started = time.monotonic()
        found[f"{TOKEN_IDS} token ids"] = {
            **_refusal(client.post("/v1/completions", json=ids)),
            "took_s": round(time.monotonic() - started, 3),
        }
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

    def send_ids() -> None:
        ids = {"model": endpoint.model_id, "prompt": [7] * TOKEN_IDS, "max_tokens": 4}
        with endpoint.client(120) as client:
            answers.append({"status": client.post("/v1/completions", json=ids).status_code, "ids": True})

    alone, alone_max, beside, beside_ids = [], [], [], []
    for _ in range(RUNS):
        gaps = _stream_gaps(endpoint)
        alone.append(statistics.median(gaps))
        alone_max.append(max(gaps))
        beside.append(max(_stream_gaps(endpoint, send_large)))
        beside_ids.append(max(_stream_gaps(endpoint, send_ids)))
    return {
        "large_chars": LARGE_CHARS,
        "large": answers,
        "median_gap_alone_s": statistics.median(alone),
        "max_gap_alone_s": statistics.median(alone_max),
        "max_gap_beside_large_s": statistics.median(beside),
        "max_gap_beside_ids_s": statistics.median(beside_ids),
        "runs": RUNS,
    }


def probe(endpoint: Endpoint, run_id: str, max_model_len: int) -> dict[str, Any]:
    before = serving_processes(run_id)
    found = {
        "transfer_params": transfer_params(endpoint),
        "client_code": client_code(endpoint),
        "rendered_fields": rendered_fields(endpoint, max_model_len),
        "huge_bodies": huge_bodies(endpoint),
    }
    found["processes"] = {"before": before, "after": serving_processes(run_id)}
    found["adapter"] = adapter_then_next(endpoint)
    found["large_prompt"] = large_prompt(endpoint)
    return found


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
    code = found["client_code"]
    code_ok = all(v["status"] == 400 and v["param"] == k for k, v in code.items())
    rendered = found["rendered_fields"]
    rendered_ok = all(v["status"] == 400 for v in rendered.values())
    huge = found["huge_bodies"]
    # 64 MB is over the proxy's bound (413); 2,000,000 token ids (about 6 MB of JSON) are within it
    # and refused at the ingress by their length (400).
    huge_ok = [v["status"] for v in huge.values()] == [413, 413, 400]
    processes = found["processes"]
    processes_ok = bool(processes["before"]) and processes["before"] == processes["after"]
    large = found["large_prompt"]
    bound = 2 * large["median_gap_alone_s"]
    # The refusal is the verdict; the neighbour's gaps are a measurement on a shared 2-core machine,
    # reported against the bound (twice its median alone), never a timed pass/fail.
    large_ok = {a["status"] for a in large["large"] if not a.get("ids")} == {400}

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines = [
        f"{verdict(params_ok)}: client transfer params: {sorted(set(statuses.values()))} for {len(statuses)} "
        f"requests, {params['listener_connections']} connections to the listener they named",
        f"{verdict(processes_ok)}: no engine restarted: {len(processes['before'])} replica and engine processes "
        f"before the hostile requests, {'the same' if processes_ok else processes['after']} after",
        f"{verdict(code_ok)}: client templates and tokenize: {sorted({v['status'] for v in code.values()})} "
        f"for {len(code)} requests",
        f"{verdict(rendered_ok)}: rendered fields at {LARGE_CHARS // 1024 // 1024} MB and token ids past "
        f"max_model_len: {sorted({v['status'] for v in rendered.values()})} for {len(rendered)} requests, the "
        f"slowest in {max(v.get('took_s', 0.0) for v in rendered.values()):.2f} s",
        f"{verdict(huge_ok)}: 64 MB with and without Content-Length at the Serve proxy, then {TOKEN_IDS:,} token "
        f"ids: {[v['status'] for v in huge.values()]}, the ids in {huge[f'{TOKEN_IDS} token ids']['took_s']:.2f} s",
        f"{verdict(adapter_ok)}: an adapter id without adapters: HTTP {adapter['adapter_status']}; the next "
        f"request HTTP {adapter['next_status']} on {adapter['next_paths']}",
        f"{verdict(large_ok)}: a {large['large_chars'] // 1024 // 1024} MB chat: HTTP "
        f"{sorted({a['status'] for a in large['large'] if not a.get('ids')})} in at most "
        f"{max(a['took_s'] for a in large['large'] if not a.get('ids')):.2f} s",
        f"measured: another stream's longest gap beside the 2 MB chats {large['max_gap_beside_large_s']:.3f} s "
        f"({'within' if large['max_gap_beside_large_s'] <= bound else 'over'} twice its median alone, {bound:.3f} s; "
        f"its longest alone {large['max_gap_alone_s']:.3f} s; medians of {large['runs']} runs); beside "
        f"{TOKEN_IDS:,} token ids {large['max_gap_beside_ids_s']:.3f} s",
    ]
    ok = params_ok and processes_ok and code_ok and rendered_ok and huge_ok
    return ok and adapter_ok and large_ok, lines
