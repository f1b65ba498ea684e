"""The clients' side of a fault run: greedy streamed chat requests carrying their tokens' top
logprobs (``stream``), how each ended as a client sees it (``Outcome``), clients sending one after
another until stopped (``Load``), and the events file each answer and fault goes to as it happens
(``Events``)."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..harness import PROMPTS
from ..probes import Endpoint

MAX_TOKENS = 24
# Each token's top two logprobs come with every answer: where a text leaves a reference, each one's
# token there must be in the other's top two (vLLM's own test of two runs of one model,
# tests/models/utils.py check_logprobs_close, with its N at two): a near tie that the batch's
# numerics flipped, not an answer from other KV.
TOP_LOGPROBS = 2
STREAMS = 2  # concurrent clients, by default
CONTROL_OUTCOME = "control_outcome"  # an answer of the colocated control under load (--control-load-s)
# Serve puts each request's id in its error body ("Request ID: <uuid>").
REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Outcome:
    prompt: str
    started: float
    ended: float
    status: int | None  # HTTP status; None: no response (connection dropped)
    error: str | None  # the error body or exception, cut short
    text: str
    finish_reason: str | None = None  # None: the stream ended before its last chunk
    done: bool = False  # the stream's closing ``data: [DONE]`` arrived
    # Each generated token and its top ``TOP_LOGPROBS``: [token, {token: logprob}], each token
    # "token_id:<id>".
    tokens: list[list[Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.status == 200 and not self.error and self.done and self.finish_reason is not None

    @property
    def kind(self) -> str:
        """How it ended, as a client sees it (request ids left out: kinds are counted)."""
        error = REQUEST_ID.sub("<id>", self.error or "")
        if self.complete:
            return "complete"
        if self.status is None:
            return f"no response ({error[:80]})"
        if self.status != 200:
            return f"HTTP {self.status}: {error[:100]}"
        if self.error:
            return f"error chunk: {error[:100]}"
        return f"stream cut after {len(self.text)} characters (HTTP 200, no [DONE])"

    @classmethod
    def of(cls, event: dict[str, Any]) -> Outcome:
        """An outcome back from its event."""
        return cls(**{k: v for k, v in event.items() if k in cls.__dataclass_fields__})


def stream_body(endpoint: Endpoint, prompt: str) -> dict[str, Any]:
    """One greedy streamed chat request's body, each a client of its own (a ``user`` of its own): the
    failover refuses a body identical to one whose engine died for its cooldown (``Poisoned``), which
    a client's resend is and another client's request is not. (9B decode kill, 2026-12-06: five
    repeats of the two in-flight bodies within 3.4 s were refused so; the poison fault sends its
    same body on purpose.)"""
    return {
        "model": endpoint.model_id,
        "user": f"rehearsal-{uuid.uuid4().hex[:12]}",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,  # "token_id:<id>": byte tokens share one text
    }


def stream(client: httpx.Client, endpoint: Endpoint, prompt: str) -> Outcome:
    """One greedy streamed chat request, read to its end or its failure."""
    body = stream_body(endpoint, prompt)
    started, pieces, status, error = time.time(), [], None, None
    tokens: list[list[Any]] = []
    finish, done = None, False
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            status = response.status_code
            if status != 200:
                error = response.read().decode(errors="replace")[:300]
            else:
                for line in response.iter_lines():
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        done = True
                    if not line.startswith("data: ") or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = json.dumps(chunk["error"])[:300]
                        break
                    choices = chunk.get("choices") or []
                    if choices and choices[0]["delta"].get("content"):
                        pieces.append(choices[0]["delta"]["content"])
                    for item in (choices and (choices[0].get("logprobs") or {}).get("content")) or []:
                        top = {t["token"]: t["logprob"] for t in item.get("top_logprobs") or []}
                        tokens.append([item["token"], top])
                    if choices and choices[0].get("finish_reason"):
                        finish = choices[0]["finish_reason"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return Outcome(prompt, started, time.time(), status, error, "".join(pieces), finish, done, tokens)


def serving_again(outcomes: list[Outcome], after: float) -> float | None:
    """When the second complete request started after ``after`` and after the last failed one
    ended, or None: a request that completed before the fault showed itself is no recovery."""
    failed = [o.ended for o in outcomes if not o.complete]
    since = max([after, *failed])
    good = sorted(o.ended for o in outcomes if o.started > since and o.complete)
    return good[1] if len(good) >= 2 else None


class Events:
    """Appends one JSON object a line, flushed at once (the process may be killed next)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a")
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()


class Load:
    """``streams`` clients sending one request after another until stopped."""

    def __init__(self, endpoint: Endpoint, events: Events, streams: int, kind: str = "outcome") -> None:
        self.endpoint = endpoint
        self.events = events
        self.kind = kind  # each answer's event type: the judge reads "outcome"
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(streams)]

    def _run(self, index: int) -> None:
        with httpx.Client(base_url=self.endpoint.base_url, timeout=120) as client:
            turn = index
            while not self._stop.is_set():
                outcome = stream(client, self.endpoint, PROMPTS[turn % len(PROMPTS)])
                turn += 1
                with self._lock:
                    self.outcomes.append(outcome)
                self.events.write({"type": self.kind, **asdict(outcome)})
                if not outcome.complete:
                    time.sleep(0.2)  # a client's pause before it retries

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)

    def since(self, moment: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.ended >= moment]


def answers(endpoint: Endpoint, what: str) -> dict[str, Outcome]:
    """Each prompt's greedy answer, one request at a time."""
    with httpx.Client(base_url=endpoint.base_url, timeout=120) as client:
        found = {p: stream(client, endpoint, p) for p in PROMPTS}
    if not all(a.complete for a in found.values()):
        raise RuntimeError(f"{what} did not answer every prompt before any fault")
    return found


def texts_under_load(endpoint: Endpoint, events: Events, streams: int, seconds: float) -> dict[str, list[Outcome]]:
    """Every complete text each prompt got from ``streams`` clients over ``seconds``, no fault: the
    first answer of each text, by text. Each answer is an event of its own type
    (``CONTROL_OUTCOME``), so how often each text came is on record."""
    with Load(endpoint, events, streams, kind=CONTROL_OUTCOME) as load:
        time.sleep(seconds)
    found: dict[str, dict[str, Outcome]] = {}
    for outcome in load.since(0.0):
        if outcome.complete:
            found.setdefault(outcome.prompt, {}).setdefault(outcome.text, outcome)
    return {prompt: [texts[t] for t in sorted(texts)] for prompt, texts in found.items()}
