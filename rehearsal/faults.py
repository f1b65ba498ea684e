"""Faults under load, on this machine: the deployed PD app (the rehearsal's profile) serving a
constant stream of greedy streamed chat requests on 127.0.0.1 while one fault at a time is
injected:

1. the decode replica's process is killed mid-stream;
2. the prefill replica's process is killed while requests are in flight;
3. the KV link between the engines is cut for ``KV_CUT_S``, both engines alive: NIXL runs over
   UCX on TCP for this run, in a port range of its own, and a packet filter resets every
   connection in that range (root and iptables), so decode's pulls fail as they would when the
   network between the phases breaks; then the link is healed and must carry KV again;
4. the decode replica is replaced by the runbook's program for a broken KV link (what an operator
   runs in the head's container: eks_pd_serving.fault_tolerance.runbook), and must serve again;
5. the Ray head's GCS is killed. With the template's GCS fault tolerance (gcsFaultToleranceOptions)
   the store runs here as the head meets it: the token in Secrets Manager (moto), the head's init
   container program, taken from the template, writing the env file the kubelet would read, and a
   redis-server requiring that token; the GCS is then started again with its own command line, as
   the head container's restart would, and must find the cluster in the store. Without it (a
   template synthesized with gcs_fault_tolerance=false) the GCS stays dead: the control.

For each: how many requests failed and how (HTTP status, error text), how long until a request
started after the fault succeeded again, and whether any completed answer is wrong: neither the
colocated control's nor the PD app's own before any fault (both recorded first; greedy, so each
is one text a prompt), nor a text the control gave under the clients' load (``--control-load-s``),
nor one that leaves a right text at a near tie (each answer carries its tokens' top two logprobs:
greedy decoding is not batch-invariant). Bounded: each fault waits at most ``--recovery-bound-s``;
everything started is stopped at the end, and the packet filter's chain is removed.

Without GCS fault tolerance a dead GCS takes the raylet down, and the raylet takes every Ray
process with it, the driver included (so that fault goes last). So the Ray side runs in a child
process (its own session) that writes each request's outcome and each fault to an events file as
they happen; this process judges from that file once the child has ended, however it ended.

    .venv-rehearse/bin/python -m rehearsal.faults --template cdk.out/RayLlmPdServing.template.json
    python -m rehearsal.faults --gpu --faults kv   # NVIDIA GPUs, the image's stack on PYTHONPATH
    python -m rehearsal.faults --judge-events RUN.events.jsonl.gz [--references-from CONTROL.events.jsonl.gz]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from eks_pd_serving import rollout
from eks_pd_serving.fault_tolerance import auth, kv_guard, runbook
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.observability import catalogue as om

from . import gpu_profile, local_aws, profile, qwen35_checkpoint, tiny_checkpoint
from .harness import (
    LOCAL_ENV,
    PROMPTS,
    build,
    deploy,
    free_port,
    kill_marked,
    local_ray,
    log,
    undeploy,
)
from .probes import Endpoint, counted_since, engine_counters_by_replica, paths_served
from .processes import MARKER, marked_processes

MAX_TOKENS = 24
# Each token's top two logprobs come with every answer: where a text leaves a reference, each one's
# token there must be in the other's top two (vLLM's own test of two runs of one model,
# tests/models/utils.py check_logprobs_close, with its N at two): a near tie that the batch's
# numerics flipped, not an answer from other KV.
TOP_LOGPROBS = 2
STREAMS = 2  # concurrent clients, by default
# Between the GCS's death and its new start: a head container's restart is longer (seconds to
# start, then the GCS loads the store); what matters here is that the cluster waits for it.
GCS_RESTART_DELAY_S = 5.0
# On one host UCX reads a peer's memory through shared memory (cma), which no packet filter sees:
# this run's NIXL takes TCP on loopback, its listeners in a range of their own (below Linux's
# ephemeral ports, above Ray's worker ports), so cutting that range cuts KV and nothing else.
KV_PORTS = (23000, 23999)
KV_UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_TCP_PORT_RANGE": "{}-{}".format(*KV_PORTS)}
KV_CUT_S = 10.0
# A failed request with the failover ends within the two replica waits plus this (a dying engine's
# own error, the HTTP round trips).
FAILED_MARGIN_S = 5.0
FAULTS = ("decode", "prefill", "kv", "replace", "update", "gcs")
# Serve puts each request's id in its error body ("Request ID: <uuid>").
REQUEST_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
REPLACED = "decode replica replaced by the runbook's command"
REDEPLOYED = "serve config redeployed"
# The update fault's changes, in order (``_changed``), by the name each fault has.
UPDATES = {
    "prefill": "prefill engine setting",
    "decode": "decode engine setting",
    "both": "both phases' max_model_len",
    "autoscaling": "decode autoscaling target",
    "failover": "failover wait",
}


# The faults that must serve again within --recovery-bound-s (every update too; not the GCS's).
BOUNDED = ("decode", "prefill", "kv", "replace")


def fault_key(title: str) -> str:
    """A fault's key from its display title, for events recorded before faults carried keys:
    ``decode``, ``prefill``, ``kv``, ``replace``, ``update:<change>``, ``gcs``."""
    for change, what in UPDATES.items():
        if title.startswith(f"{what} changed"):
            return f"update:{change}"
    for key, start in (("replace", REPLACED), ("decode", "decode replica"), ("prefill", "prefill replica"),
                       ("kv", "KV link"), ("gcs", "GCS killed")):  # fmt: skip
        if title.startswith(start):
            return key
    return title


def key_of(record: dict[str, Any]) -> str:
    """The judged fault's key (its own, or read from an older recording's title)."""
    return str(record.get("key") or fault_key(record["fault"]))


CONTROL_OUTCOME = "control_outcome"  # an answer of the colocated control under load (--control-load-s)


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


def _stream(client: httpx.Client, endpoint: Endpoint, prompt: str) -> Outcome:
    body = {
        "model": endpoint.model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,  # "token_id:<id>": byte tokens share one text
    }
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


def near_tie(answer: list[list[Any]], reference: list[list[Any]]) -> float | None:
    """Where ``answer`` first leaves ``reference`` token by token: the logprob gap between its
    token and the reference's there, when each is in the other's top ``TOP_LOGPROBS``; None when
    they are not (or one has no logprobs, or they never differ)."""
    for (mine, my_top), (theirs, their_top) in zip(answer, reference, strict=False):
        if mine != theirs:
            return float(my_top[mine] - my_top[theirs]) if mine in their_top and theirs in my_top else None
    return None


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
                outcome = _stream(client, self.endpoint, PROMPTS[turn % len(PROMPTS)])
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


def _kill(run_id: str, title: str) -> list[int]:
    victims = marked_processes(run_id, title)
    for process in victims:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    return [p.pid for p in victims]


def _restart_gcs(run_id: str, events: Events) -> list[int]:
    """Kill the GCS and start it again with its own command line and environment after
    ``GCS_RESTART_DELAY_S``, as the head container's restart would (the new process keeps the run's
    marker, so the run's teardown stops it)."""
    (gcs,) = marked_processes(run_id, "gcs_server")
    command, env, cwd = gcs.cmdline(), gcs.environ(), gcs.cwd()
    # ray.init starts the GCS on a free port (--gcs_server_port=0); the raylet and the driver know
    # the one it took, as a head's do 6379: the new GCS takes that one again.
    (raylet,) = [p for p in marked_processes(run_id, "raylet") if p.cmdline()[0].endswith("/raylet")]
    (port,) = [a.rsplit(":", 1)[1] for a in raylet.cmdline() if a.startswith("--gcs-address=")]
    command = [f"--gcs_server_port={port}" if a.startswith("--gcs_server_port=") else a for a in command]
    gcs.kill()
    gcs.wait(10)
    time.sleep(GCS_RESTART_DELAY_S)
    subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)  # fmt: skip
    events.write({"type": "gcs_restarted", "at": time.time()})
    return [gcs.pid]


class KvLink:
    """Loopback TCP in ``KV_PORTS``, through a chain of this run's own: ``cut()`` resets every
    connection there (both directions), ``heal()`` lets it through again, ``remove()`` leaves the
    host's filter as it was (also called by the parent, whatever became of the child)."""

    def __init__(self, chain: str) -> None:
        self.chain = chain

    @staticmethod
    def _iptables(*args: str, check: bool = True) -> bool:
        ran = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
        if check and ran.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(args)}: {ran.stderr.strip()}")
        return ran.returncode == 0

    @classmethod
    def preflight(cls) -> None:
        if shutil.which("iptables") is None:
            raise RuntimeError("iptables not found. Fix: apt-get install iptables (make rehearse-faults does)")
        if not cls._iptables("-S", "INPUT", check=False):
            raise RuntimeError("iptables cannot read the filter table. Fix: run the KV fault as root (CAP_NET_ADMIN)"
                               " or leave it out with --faults decode,prefill,gcs")  # fmt: skip

    def install(self) -> None:
        self.remove()
        self._iptables("-N", self.chain)
        self._iptables("-I", "INPUT", "-i", "lo", "-j", self.chain)

    def cut(self) -> None:
        ports = "{}:{}".format(*KV_PORTS)
        # The resets themselves pass (from a port in the range too): else they are rejected in
        # turn, never arrive, and the connections hang like a silent drop instead of failing.
        self._iptables("-A", self.chain, "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "RETURN")
        for direction in ("--dport", "--sport"):
            rule = ["-p", "tcp", direction, ports, "-j", "REJECT", "--reject-with", "tcp-reset"]
            self._iptables("-A", self.chain, *rule)

    def heal(self) -> None:
        self._iptables("-F", self.chain)

    def remove(self) -> None:
        while self._iptables("-D", "INPUT", "-i", "lo", "-j", self.chain, check=False):
            pass
        self._iptables("-F", self.chain, check=False)
        self._iptables("-X", self.chain, check=False)


def _kv_connections(run_id: str) -> int:
    """The run's TCP connections with an end in ``KV_PORTS``: NIXL's, if UCX took TCP."""
    low, high = KV_PORTS
    found = set()
    for process in marked_processes(run_id):
        with contextlib.suppress(psutil.Error):
            for connection in process.net_connections("tcp"):
                ends = [connection.laddr, connection.raddr]
                if connection.status == psutil.CONN_ESTABLISHED and any(e and low <= e.port <= high for e in ends):
                    found.add((connection.laddr, connection.raddr))
    return len(found)


def _cut_kv_link(link: KvLink, endpoint: Endpoint, run_id: str, events: Events) -> list[int]:
    """Cut the KV link now and heal it ``KV_CUT_S`` later (a timer: the load goes on meanwhile);
    the engines' NIXL counters at the cut, at the heal and at the fault's end go to the events."""
    connections = _kv_connections(run_id)
    if not connections:
        raise RuntimeError(f"no connection in {KV_PORTS} before the cut: NIXL did not take UCX over TCP")
    before = engine_counters_by_replica(endpoint.metrics_url)  # read first: a scrape takes seconds here
    link.cut()
    events.write({"type": "kv_link", "event": "cut", "at": time.time(), "connections": connections, "counters": before})

    def heal() -> None:
        link.heal()
        at = time.time()
        events.write(
            {
                "type": "kv_link",
                "event": "healed",
                "at": at,
                "counters": engine_counters_by_replica(endpoint.metrics_url),
            }
        )

    threading.Timer(KV_CUT_S, heal).start()
    return []


def _replace_decode() -> list[str]:
    """The runbook's program for a broken KV link (docs/features/failures.md), run as the
    operator runs it in the head's container: a driver of its own on the cluster's Ray."""
    ran = subprocess.run([sys.executable, "-c", runbook.REPLACE_DECODE], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"the runbook's program failed: {ran.stderr.strip()[-300:]}")
    (line,) = [line for line in ran.stdout.splitlines() if line.startswith(runbook.REPLACED_LINE)]
    return list(json.loads(line.removeprefix(runbook.REPLACED_LINE)))


def _fault(
    load: Load, key: str, name: str, inject: Any, bound_s: float, hold_s: float = 0.0, settle_s: float = 0.0
) -> None:
    """Inject, wait (bounded) until it serves again (``_serving_again``, counting only requests
    started ``settle_s`` or more after the fault), keep the load ``hold_s`` longer; with the
    failover, then wait (bounded) until the pair serves disaggregated again; the events file
    records when, and the failover's path counters at each step."""
    time.sleep(3.0)  # steady load first
    paths = paths_served(load.endpoint.metrics_url)
    at = time.time()
    killed = inject()
    load.events.write(
        {"type": "fault", "key": key, "name": name, "at": at, "killed": killed, "hold_s": hold_s, "paths": paths}
    )
    log(f"== fault {name}: killed {killed}")
    while time.time() - at < bound_s:
        if _serving_again(load.since(at), at + settle_s) is not None:
            break
        time.sleep(0.5)
    held_from = time.time()
    if paths:  # timed from the fault, not from the end of the hold
        _disaggregated_again(load, at, bound_s)
    time.sleep(max(0.0, 2.0 + hold_s - (time.time() - held_from)))
    load.events.write(
        {"type": "fault_end", "name": name, "at": time.time(), "paths": paths_served(load.endpoint.metrics_url)}
    )


def _disaggregated_again(load: Load, at: float, bound_s: float) -> None:
    """Wait until requests are served disaggregated again and by nothing else (two in a row over
    a second's readings), at most ``bound_s`` after the fault at ``at``; the events file records when."""
    previous = paths_served(load.endpoint.metrics_url)
    while time.time() - at < bound_s:
        time.sleep(1.0)
        current = paths_served(load.endpoint.metrics_url)
        grown = {path: current.get(path, 0.0) - previous.get(path, 0.0) for path in current}
        if grown.get("disaggregated", 0.0) >= 2 and not any(v for p, v in grown.items() if p != "disaggregated"):
            load.events.write({"type": "disaggregated_again", "at": time.time(), "after_s": time.time() - at})
            return
        previous = current


def _changed(serve_config: dict[str, Any], change: str) -> dict[str, Any]:
    """The serve config as a user's next deploy would change it (``UPDATES``): ``prefill`` or
    ``decode``: that engine's ``max_num_seqs`` one lower (greedy answers do not depend on it);
    ``both``: the model's ``max_model_len`` 64 lower, in both engines and the ingress's card, with the
    phases' pair key changed as synth changes it; ``autoscaling``: decode's autoscaling target;
    ``failover``: the failover's replica wait."""
    changed = copy.deepcopy(serve_config)
    if change in ("prefill", "decode"):
        engine = layout.llm_config(changed, change)["engine_kwargs"]
        engine["max_num_seqs"] = max(1, int(engine.get("max_num_seqs", 8)) - 1)
    elif change == "both":
        for app in changed["applications"]:
            args = app["args"]
            for _, llm in layout.phase_llm_configs({"applications": [app]}):
                llm["engine_kwargs"]["max_model_len"] -= 64
            if "pair" in args:
                args["pair"] = f"{args['pair']}-{change}"
            for model in args.get("models", []):
                model["max_model_len"] -= 64
    elif change == "autoscaling":
        options = layout.replica_options(changed, "decode")
        target = _override(changed, options["name"]) if "name" in options else None
        options = target or layout.llm_config(changed, "decode")["deployment_config"]
        if "num_replicas" in options:  # Ray's builder: a fixed count becomes equal bounds (Serve takes one)
            count = options.pop("num_replicas")
            options["autoscaling_config"] = {"min_replicas": count, "max_replicas": count}
        scaling = options.setdefault("autoscaling_config", {})
        scaling["target_ongoing_requests"] = float(scaling.get("target_ongoing_requests", 2.0)) + 1.0
    elif change == "failover":
        for settings in layout.failover_settings(changed):
            settings["wait_s"] = float(settings["wait_s"]) + 1.0
    else:
        raise ValueError(f"unknown change {change!r}")
    return changed


def _override(serve_config: dict[str, Any], deployment: str) -> dict[str, Any] | None:
    for app in serve_config["applications"]:
        for override in app.get("deployments") or []:
            if override.get("name") == deployment:
                return override  # type: ignore[no-any-return]
    return None


def _deploy_steps(current: dict[str, Any], target: dict[str, Any], http_port: int, timeout_s: float) -> float:
    """``target`` as the rollout applies it: one application at a time (``rollout.rollout_steps``),
    each step waited on until it serves; returns the seconds in all."""
    total = 0.0
    steps = rollout.rollout_steps(current, target)
    for number, step in enumerate(steps, 1):
        total += _deploy_config(step, http_port, timeout_s)
        if number < len(steps):  # the Job's least gap between steps: the phases differ meanwhile
            time.sleep(rollout.settle_s())
            total += rollout.settle_s()
    return total


def _deploy_config(serve_config: dict[str, Any], http_port: int, timeout_s: float) -> float:
    """The serve config as KubeRay sends it: the whole config through Serve's declarative API (the
    dashboard's PUT /api/serve/applications/ calls the same ``deploy_apps``), so Serve decides what
    restarts by its code-version rules; returns once every application is RUNNING on it."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    started = time.monotonic()
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(serve_config))
    seen_update = False
    while time.monotonic() - started < timeout_s:
        states = {name: s.status for name, s in serve.status().applications.items()}
        seen_update = seen_update or any(s != "RUNNING" for s in states.values()) or time.monotonic() - started > 15
        if seen_update and states and all(s == "RUNNING" for s in states.values()):
            return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"the serve config did not come up within {timeout_s} s")


def _serving_again(outcomes: list[Outcome], after: float) -> float | None:
    """When the second complete request started after ``after`` and after the last failed one
    ended, or None: a request that completed before the fault showed itself is no recovery."""
    failed = [o.ended for o in outcomes if not o.complete]
    since = max([after, *failed])
    good = sorted(o.ended for o in outcomes if o.started > since and o.complete)
    return good[1] if len(good) >= 2 else None


def judge(events: list[dict[str, Any]], bound_s: float) -> list[dict[str, Any]]:
    """Per fault: the requests it could touch (in flight at it, or started before recovery and
    the hold), how they ended, the recovery time, and the completed answers that are wrong.

    An answer has two right forms: the colocated control's (the prompt computed where it is
    decoded, as decode does when it recomputes a failed pull) and the PD app's own before any
    fault (the KV computed by prefill and moved). Greedy, each is one text a prompt; the two
    can differ in the last tokens (prefill's and decode's numerics on random weights). Greedy
    decoding is not batch-invariant either, so an answer that leaves every right text is still
    right where it leaves one of them at a near tie (``near_tie``); it is wrong when it is neither."""
    answers = next(e for e in events if e["type"] == "expected")
    control, pd = answers["control"], answers["pd"]
    # Each prompt's right texts: the control's and the PD app's, and (``--control-load-s``) every
    # text the colocated control gave under the clients' load with no fault (on random weights a
    # near tie can flip a late token with the batch: GPU, 2026-12-05).
    right = {p: {control[p], pd[p], *(answers.get("control_under_load") or {}).get(p, [])} for p in pd}
    # The right texts' tokens and top logprobs (runs from the logprobs on; older events have none).
    references = answers.get("reference_tokens") or {}
    outcomes = [_as_outcome(e) for e in events if e["type"] == "outcome"]
    faults = [e for e in events if e["type"] == "fault"]
    results = []
    for index, fault in enumerate(faults):
        until = faults[index + 1]["at"] if index + 1 < len(faults) else float("inf")
        # The KV link's fault starts when the link is cut (its counters are read just before).
        cut = [
            e["at"] for e in events if e["type"] == "kv_link" and e["event"] == "cut" and fault["at"] <= e["at"] < until
        ]
        at = cut[0] if cut else fault["at"]
        # Its requests: those that ended from the fault on, before the next fault (a request still
        # in flight at the next one is that fault's: it is cut, or held, by that one).
        window = [o for o in outcomes if o.ended >= at and o.started < until and o.ended <= until]
        serving = _serving_again(window, at)
        recovered_s = serving - at if serving is not None and serving - at <= bound_s + 5 else None
        affected = [o for o in window if o.started <= at + (recovered_s or bound_s) + fault["hold_s"]]
        completed = [o for o in window if o.complete]
        # The answers that are no right text: the gap at the near tie where each left one, or None.
        other = [o for o in completed if o.text not in right[o.prompt]]
        gaps = [min((g for r in references.get(o.prompt, []) if (g := near_tie(o.tokens, r)) is not None), default=None)
                for o in other]  # fmt: skip
        restarted = next((e["at"] for e in events if e["type"] == "gcs_restarted" and at <= e["at"] < until), None)
        down = [o for o in window if restarted is not None and at < o.started <= restarted]
        results.append(
            {
                "fault": fault["name"],
                "key": fault.get("key") or fault_key(fault["name"]),
                "killed": fault["killed"],
                "requests_affected": len(affected),
                "requests_failed": sum(not o.complete for o in affected),
                "failures": dict(Counter(o.kind for o in affected if not o.complete)),
                "recovered_s": recovered_s,
                "held_s": fault["hold_s"],
                "first_failure_s": min((o.ended - at for o in affected if not o.complete), default=None),
                # The longest any request of the fault's window took (held, not failed, counts too).
                "slowest_s": max((o.ended - o.started for o in window), default=None),
                # The update fault: how long Serve took to bring the new config to RUNNING.
                "redeploy_s": next(
                    (
                        round(e["ready_s"], 1)
                        for e in events
                        if e["type"] == "redeployed" and at <= e.get("at", at) < until
                    ),
                    None,
                ),
                # The bounds a client meets: how long after the fault the requests in flight at it
                # ended, and the longest a failed request took from its start to its end.
                "in_flight_ended_s": max((o.ended - at for o in window if o.started <= at), default=None),
                "in_flight_at_fault": sum(o.started <= at for o in window),
                "longest_failed_s": max((o.ended - o.started for o in affected if not o.complete), default=None),
                "completed": len(completed),
                "wrong_answers": sum(g is None for g in gaps),
                "near_tie_answers": sum(g is not None for g in gaps),
                "near_tie_gap_max": max((round(g, 4) for g in gaps if g is not None), default=None),
                "answers_without_logprobs": sum(not o.tokens for o in completed),
                "answered_as_control": sum(o.text == control[o.prompt] != pd[o.prompt] for o in completed),
                "ended_by_fault": not any(e["type"] == "fault_end" and e["name"] == fault["name"] for e in events),
                # A GCS restarted from its store: how long it was down, the answers finished while it
                # was (in flight at the kill or started after it), and those started while it was.
                "gcs_down_s": None if restarted is None else round(restarted - at, 1),
                "completed_while_gcs_down": None
                if restarted is None
                else sum(o.complete and at < o.ended <= restarted for o in window),
                "started_while_gcs_down": None if restarted is None else [sum(o.complete for o in down), len(down)],
                **_kv_link_figures(events, at, until),
                **_path_figures(events, fault, until),
            }
        )
    return results


def _as_outcome(event: dict[str, Any]) -> Outcome:
    return Outcome(**{k: v for k, v in event.items() if k in Outcome.__dataclass_fields__})


def control_texts(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """The colocated control under load: each prompt's complete answers and how many gave each
    text (most first); None when the run served it no load."""
    answers = [_as_outcome(e) for e in events if e["type"] == CONTROL_OUTCOME]
    if not answers:
        return None
    found: dict[str, Counter[str]] = {}
    for answer in (a for a in answers if a.complete):
        found.setdefault(answer.prompt, Counter())[answer.text] += 1
    return {p: {"answers": sum(c.values()), "by_text": dict(c.most_common())} for p, c in sorted(found.items())}


def _path_figures(events: list[dict[str, Any]], fault: dict[str, Any], until: float) -> dict[str, Any]:
    """With the failover: requests by the path that served them from the fault to its end, and how
    long after the fault the pair served disaggregated again; {} without it."""
    start = fault.get("paths")
    if not start:
        return {}
    end = next((e for e in events if e["type"] == "fault_end" and e["name"] == fault["name"]), None)
    again = next((e for e in events if e["type"] == "disaggregated_again" and fault["at"] <= e["at"] < until), None)
    stop = (end or {}).get("paths") or {}
    return {
        "served_by_path": {
            path: stop[path] - start.get(path, 0.0) for path in sorted(stop) if stop[path] - start.get(path, 0.0)
        },
        "disaggregated_again_s": None if again is None else round(again["after_s"], 1),
    }


def _kv_link_figures(events: list[dict[str, Any]], at: float, until: float) -> dict[str, Any]:
    """For the KV link's cut: the engines' NIXL counters over the cut and after the heal (pulls
    that failed, pulls that moved KV once the link was back), from the events; {} otherwise."""
    link = {e["event"]: e for e in events if e["type"] == "kv_link" and at <= e["at"] < until}
    if "cut" not in link:
        return {}
    cut, healed, end = (link.get(k, {}).get("counters") for k in ("cut", "healed", "end"))

    def by_replica(reading: dict[str, Any]) -> dict[str, dict[str, float]]:
        # Runs recorded before 2026-12-03 summed every replica into one reading.
        return {"": reading} if all(isinstance(v, (int, float)) for v in reading.values()) else reading

    def moved(key: str, start: dict[str, Any] | None, stop: dict[str, Any] | None) -> float | None:
        return None if start is None or stop is None else counted_since(key, by_replica(start), by_replica(stop))

    return {
        "kv_connections_cut": link["cut"]["connections"],
        "kv_cut_s": round(link["healed"]["at"] - link["cut"]["at"], 1) if "healed" in link else None,
        "kv_failed_transfers_while_cut": moved("nixl_failed_transfers", cut, healed),
        "kv_failed_transfers_after_heal": moved("nixl_failed_transfers", healed, end),
        "kv_transfers_while_cut": moved("nixl_transfers", cut, healed),
        "kv_transfers_after_heal": moved("nixl_transfers", healed, end),
        "kv_external_tokens_after_heal": moved("external_kv_tokens", healed, end),
        # Engine replicas exporting at the end that were not at the cut: Serve replaced them.
        "kv_replicas_new_at_end": sorted(set(by_replica(end or {})) - set(by_replica(cut or {}))),
    }


def _env_file(path: Path) -> dict[str, str]:
    """The env file as the kubelet reads it: KEY=VALUE lines."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@dataclass(frozen=True)
class Store:
    """The GCS store on loopback: the head's environment as KubeRay sets it, and the password."""

    env: dict[str, str]
    password: str
    port: int

    def usage(self) -> dict[str, Any]:
        """What the GCS keeps there: keys and memory, as the store itself reports them."""

        def ask(*command: str) -> str:
            env = {**os.environ, "REDISCLI_AUTH": self.password}  # not on the command line
            answer = subprocess.run(["redis-cli", "-p", str(self.port), *command], capture_output=True, text=True,
                                    timeout=10, check=True, env=env)  # fmt: skip
            return answer.stdout

        memory = dict(line.split(":", 1) for line in ask("info", "memory").split() if ":" in line)
        return {"keys": int(ask("dbsize")), "used_memory_bytes": int(memory["used_memory"])}


@contextlib.contextmanager
def gcs_store(ray_service: dict[str, Any], workdir: Path) -> Iterator[Store | None]:
    """With the template's gcsFaultToleranceOptions: the store on loopback, reached as the head
    reaches it (the head's init container program from the template turns the secret into the env
    file; the password is the file's key the options name). Yields the head's environment as
    KubeRay sets it and the password (passed as ``ray start --redis-password`` is); None without."""
    options = ray_service["spec"]["rayClusterConfig"].get("gcsFaultToleranceOptions")
    if options is None:
        yield None
        return
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server not found. Fix: apt-get install redis-server (make rehearse-faults does)")
    (init,) = ray_service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["initContainers"]
    token = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(64))
    env_file = workdir / auth.ENV_FILE
    env_file.unlink(missing_ok=True)
    with local_aws.moto_server(free_port()) as endpoint:
        client = local_aws.client("secretsmanager", endpoint)
        arn = client.create_secret(Name="gcs-store-token", SecretString=json.dumps({auth.FIELD: token}))["ARN"]
        program = [sys.executable, *init["command"][1:]]  # python -c <the template's source>
        ran = subprocess.run(program, capture_output=True, text=True, timeout=60, check=False,
                             env={"PATH": os.environ["PATH"], **local_aws.CREDENTIALS,
                                  "AWS_ENDPOINT_URL_SECRETS_MANAGER": endpoint,
                                  auth.SECRET_ENV: arn, auth.FILE_ENV: str(env_file)})  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"the head's init container program failed: {ran.stderr.strip()}")
    password = _env_file(env_file)[options["redisPassword"]["valueFrom"]["fileKeyRef"]["key"]]
    port = free_port()
    config = f'port {port}\nbind 127.0.0.1\nrequirepass {password}\nsave ""\nappendonly no\n'
    # It inherits the run's marker, so the run's teardown stops it whatever happens here.
    store = subprocess.Popen(["redis-server", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert store.stdin is not None
    store.stdin.write(config)
    store.stdin.close()
    try:
        _wait_for_port(port)
        log(f"GCS store: redis-server on 127.0.0.1:{port}, token from the init program's env file")
        namespace = f"faults-{os.getpid()}"  # KubeRay's is the RayCluster's UID: one per cluster
        yield Store({"RAY_REDIS_ADDRESS": f"127.0.0.1:{port}", "RAY_external_storage_namespace": namespace},
                    password, port)  # fmt: skip
    finally:
        store.terminate()
        store.wait(10)


def _serve_state(events: Events) -> None:
    """After the GCS restarted: whether the cluster's named actors came back from the store (the
    Serve controller is a detached actor the new GCS must know by name)."""
    import ray
    from ray import serve

    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        applications = {name: str(app.status) for name, app in serve.status().applications.items()}
        events.write({"type": "state_after_restart", "controller_found": True, "applications": applications})
    except Exception as exc:
        events.write({"type": "state_after_restart", "controller_found": False, "error": f"{exc}"[:300]})


def _child(args: argparse.Namespace) -> int:
    """The Ray side: the store (with the template's GCS fault tolerance), deploy, the app's own
    answers, then the faults under load."""
    events = Events(args.events)
    ray_service = profile.ray_service_from_template(args.template)
    deployed = profile.serve_config(ray_service)
    if args.gpu:  # the image's stack on NVIDIA GPUs: Qwen3.5's own class, the GPU profile
        host = gpu_profile.detect_host()
        model_dir = qwen35_checkpoint.build((args.checkpoint.parent / "qwen3.5-tiny").resolve(), "tiny")
        rehearsed = gpu_profile.gpu_profile(deployed, model_dir, host, dummy_weights=False)
        env = gpu_profile.gpu_env(profile.worker_env(ray_service), host)
    else:
        rehearsed = profile.local_profile(deployed, tiny_checkpoint.build(args.checkpoint.resolve()))
        env = {**profile.worker_env(ray_service), **LOCAL_ENV}
    model_id = layout.llm_config(deployed, "decode")["model_loading_config"]["model_id"]
    for name in [k for k in env if k.startswith(("EKS_PD_API_KEYS", "RAY_SERVE_HTTP_PROXY"))]:
        env.pop(name)  # the key check is the main rehearsal's; here every request goes unkeyed
    # Serve's replica lines on stderr too (its log files buffer them): the parent counts the KV
    # guard's from the child's output, as a pod's log would show them.
    env["RAY_SERVE_LOG_TO_STDERR"] = "1"
    # On a GPU, every fault's KV goes over TCP: the two engines share one GPU there, where UCX
    # would take CUDA IPC, which no two nodes have (deployed, KV crosses EFA).
    if "kv" in args.faults or args.gpu:
        env.update(KV_UCX_ENV)
        if args.gpu:
            # KV stays in CUDA memory as deployed; UCX copies it through host memory onto TCP.
            # (Host staging, kv_buffer_device cpu, fails for hybrid models in vLLM 0.26:
            # initialize_host_xfer_buffer takes every KV cache for one tensor.)
            env["UCX_TLS"] = "tcp,cuda_copy"
    http_port, metrics_port = free_port(), free_port()
    endpoint = Endpoint(f"http://127.0.0.1:{http_port}", model_id, f"http://127.0.0.1:{metrics_port}/metrics")
    with contextlib.ExitStack() as stack:
        # The store serves the GCS fault only; without it, a run of the others needs no redis-server.
        store = stack.enter_context(gcs_store(ray_service, args.events.parent)) if "gcs" in args.faults else None
        events.write({"type": "gcs_store", "on": store is not None})
        if store is not None:
            env.update(store.env)
        run_id = stack.enter_context(
            local_ray(
                env, metrics_port, profile.custom_resources(rehearsed), redis_password=store.password if store else None
            )
        )
        return _under_load(args, events, rehearsed, endpoint, http_port, run_id, store)


def _texts_under_load(endpoint: Endpoint, events: Events, streams: int, seconds: float) -> dict[str, list[Outcome]]:
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


def _answers(endpoint: Endpoint, what: str) -> dict[str, Outcome]:
    """Each prompt's greedy answer, one request at a time."""
    with httpx.Client(base_url=endpoint.base_url, timeout=120) as client:
        answers = {p: _stream(client, endpoint, p) for p in PROMPTS}
    if not all(a.complete for a in answers.values()):
        raise RuntimeError(f"{what} did not answer every prompt before any fault")
    return answers


def _under_load(args: argparse.Namespace, events: Events, rehearsed: dict[str, Any], endpoint: Endpoint,
                http_port: int, run_id: str, store: Store | None) -> int:  # fmt: skip
    """The colocated control's answers (the reference), then the PD app's before any fault, then
    the faults in order under the clients' load."""
    reference: dict[str, Outcome] = {}
    under_load: dict[str, list[Outcome]] | None = None
    if not args.no_control:
        control = profile.colocated_control(rehearsed, placement=None if args.gpu else profile.LOCAL_PLACEMENT)
        deploy(build(control), http_port, args.timeout_s)
        reference = _answers(endpoint, "the colocated control")
        if args.control_load_s > 0:
            under_load = _texts_under_load(endpoint, events, args.streams, args.control_load_s)
        undeploy(control)
    # The update fault redeploys the config as KubeRay does, so the first deploy goes that way too.
    ready_s = (
        _deploy_config(rehearsed, http_port, args.timeout_s)
        if "update" in args.faults
        else deploy(build(rehearsed), http_port, args.timeout_s)
    )
    events.write({"type": "ready", "ready_s": ready_s})
    kv = layout.llm_config(rehearsed, "decode")["engine_kwargs"]["kv_transfer_config"]
    own = _answers(endpoint, "the PD app")
    # Without the control, the PD app's own answers are the only right ones (a guarded decode
    # never recomputes: it refuses).
    right = {p: [own[p], *([reference[p]] if reference else []), *(under_load or {}).get(p, [])] for p in PROMPTS}
    events.write({"type": "expected", "control": {p: (reference or own)[p].text for p in PROMPTS},
                  "pd": {p: own[p].text for p in PROMPTS},
                  "control_under_load": under_load and {p: [o.text for o in os] for p, os in under_load.items()},
                  "reference_tokens": {p: [o.tokens for o in outcomes if o.tokens] for p, outcomes in right.items()},
                  "kv_load_failure_policy": kv.get("kv_load_failure_policy", "fail"),
                  "failover": next(iter(layout.failover_settings(rehearsed)), None)})  # fmt: skip
    with Load(endpoint, events, args.streams) as load:
        for key in ("decode", "prefill"):
            name, title = f"{key} replica killed", layout.replica_title(rehearsed, key)
            if key in args.faults:
                _fault(load, key, name, lambda t=title: _kill(run_id, t), args.recovery_bound_s)
        if "kv" in args.faults:
            link = KvLink(args.kv_chain)
            link.install()
            # Held past the heal: the link must carry KV again, not only decode recompute.
            _fault(load, "kv", "KV link cut", lambda: _cut_kv_link(link, endpoint, run_id, events),
                   args.recovery_bound_s, hold_s=KV_CUT_S + 20.0, settle_s=KV_CUT_S)  # fmt: skip
            events.write({"type": "kv_link", "event": "end", "at": time.time(),
                          "counters": engine_counters_by_replica(endpoint.metrics_url)})  # fmt: skip
            link.remove()
        if "replace" in args.faults:
            _fault(load, "replace", REPLACED, _replace_decode, args.recovery_bound_s)
        if "update" in args.faults:
            current = rehearsed
            for change in args.updates:
                target = _changed(current, change)

                def redeploy(before: dict[str, Any] = current, after: dict[str, Any] = target) -> list[int]:
                    ready_s = _deploy_steps(before, after, http_port, args.timeout_s)
                    events.write({"type": "redeployed", "at": time.time(), "ready_s": ready_s})
                    return []

                _fault(load, f"update:{change}", f"{UPDATES[change]} changed, {REDEPLOYED}", redeploy,
                       args.recovery_bound_s, hold_s=5.0)  # fmt: skip
                current = target
        if "gcs" not in args.faults:
            return 0
        if store is not None:
            # Held 90 s: past Ray's 60 s default for a raylet to reconnect to a GCS.
            _fault(load, "gcs", "GCS killed, restarted from the store", lambda: _restart_gcs(run_id, events),
                   args.recovery_bound_s, hold_s=90.0)  # fmt: skip
            _serve_state(events)
            events.write({"type": "gcs_store_usage", **store.usage()})
        else:  # last: without a store the dead GCS takes every Ray process with it
            _fault(load, "gcs", "GCS killed (no fault tolerance)", lambda: _kill(run_id, "gcs_server"),
                   args.recovery_bound_s, hold_s=90.0)  # fmt: skip
    return 0


class Output:
    """The child's output (the engines' and Ray's too), passed through as it comes, and the lines
    the ``KvPullFailed`` alarm's filter counts on the cluster."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.pull_failed_lines = 0
        # The KV guard's lines (Serve logs them to stderr here, as in a pod; its log files buffer).
        self.guard_lines = dict.fromkeys(kv_guard.lines(), 0)
        self._thread = threading.Thread(target=self._read, args=(child,), daemon=True)
        self._thread.start()

    def _read(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            self.pull_failed_lines += om.KV_PULL_FAILED_LINE in line
            for what, phrase in kv_guard.lines().items():
                self.guard_lines[what] += f"{phrase}:" in line

    def join(self) -> None:
        self._thread.join(timeout=30)


def _faults(value: str) -> tuple[str, ...]:
    chosen = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in chosen if v not in FAULTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{value!r}: name one or more of {','.join(FAULTS)}, comma-separated")
    return tuple(f for f in FAULTS if f in chosen)  # always in the rehearsal's order


def _updates(value: str) -> tuple[str, ...]:
    chosen = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in chosen if v not in UPDATES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{value!r}: name one or more of {','.join(UPDATES)}, comma-separated")
    return tuple(u for u in UPDATES if u in chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path, default=Path(".rehearsal/faults.json"))
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--recovery-bound-s", type=float, default=240.0)
    parser.add_argument(
        "--gpu", action="store_true", help="on NVIDIA GPUs with the image's stack (Ray 2.58, vLLM 0.26)"
    )
    parser.add_argument("--streams", type=int, default=STREAMS, help=f"concurrent clients ({STREAMS})")
    parser.add_argument(
        "--no-control", action="store_true", help="skip the colocated control (saves an engine start on a GPU)"
    )
    parser.add_argument("--faults", type=_faults, default=FAULTS, help=f"comma-separated, of {','.join(FAULTS)} (all)")
    parser.add_argument(
        "--updates",
        type=_updates,
        default=tuple(UPDATES),
        help=f"the update fault's changes, of {','.join(UPDATES)} (all)",
    )
    parser.add_argument(
        "--control-load-s",
        type=float,
        default=0.0,
        help="also serve the colocated control under the clients' load this long; its texts count as right (0: off)",
    )
    parser.add_argument(
        "--judge-events",
        type=Path,
        help="run nothing: judge a run's recorded events (.events.jsonl, or .gz) into --report",
    )
    parser.add_argument(
        "--references-from",
        type=Path,
        help="with --judge-events: the right answers (control, under load, tokens) of this other run's events",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kv-chain", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for noisy in ("httpx", "ray", "ray.serve", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.child:
        return _child(args)
    if args.judge_events:
        return _judge_recorded(args)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    events_file = args.report.with_suffix(".events.jsonl")
    events_file.unlink(missing_ok=True)
    run_id = os.environ.get(MARKER) or f"faults-{os.getpid()}"
    link = KvLink(f"EKSPD-KV-{os.getpid()}")  # iptables chain names: at most 28 characters
    if "kv" in args.faults:
        try:
            KvLink.preflight()
        except RuntimeError as exc:
            log(f"FAIL: {exc}")
            return 2
    command = [sys.executable, "-m", "rehearsal.faults", "--child", "--events", str(events_file),
               "--template", str(args.template), "--checkpoint", str(args.checkpoint),
               "--timeout-s", str(args.timeout_s), "--recovery-bound-s", str(args.recovery_bound_s),
               "--faults", ",".join(args.faults), "--kv-chain", link.chain, "--streams", str(args.streams),
               "--control-load-s", str(args.control_load_s), "--updates", ",".join(args.updates),
               *(["--gpu"] if args.gpu else []), *(["--no-control"] if args.no_control else [])]  # fmt: skip
    bound_s = 2 * args.timeout_s + args.control_load_s + len(args.faults) * (args.recovery_bound_s + 100) + 300
    child = subprocess.Popen(command, env={**os.environ, MARKER: run_id}, start_new_session=True, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace")  # fmt: skip
    output = Output(child)
    try:
        exit_code: int | None = child.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        exit_code = None
    finally:
        stopped = kill_marked(run_id)
        if "kv" in args.faults:
            link.remove()
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    faults = judge(events, args.recovery_bound_s) if any(e["type"] == "expected" for e in events) else []
    store = next((e["on"] for e in events if e["type"] == "gcs_store"), None)
    state = next((e for e in events if e["type"] == "state_after_restart"), None)
    usage = next(({k: v for k, v in e.items() if k != "type"} for e in events if e["type"] == "gcs_store_usage"), None)
    expected = next((e for e in events if e["type"] == "expected"), None)
    differs = expected and [p for p in PROMPTS if expected["control"][p] != expected["pd"][p]]
    report = {"child_exit": exit_code, "leftovers_stopped": stopped, "recovery_bound_s": args.recovery_bound_s,
              "streams": args.streams, "gpu": args.gpu, "faults_chosen": list(args.faults),
              "updates_chosen": list(args.updates),
              "kv_load_failure_policy": expected and expected["kv_load_failure_policy"],
              "failover": expected and expected.get("failover"),
              "pd_differs_from_control": differs,
              "gcs_fault_tolerance": store, "state_after_gcs_restart": state, "gcs_store_usage": usage,
              "control_under_load": control_texts(events), "faults": faults}  # fmt: skip
    output.join()
    report["kv_pull_failed_lines"] = output.pull_failed_lines
    # The decode engines' KV guard: started on, stood aside (a vLLM that handles failed pulls), tripped.
    report["kv_guard"] = output.guard_lines
    args.report.write_text(json.dumps(report, indent=2))
    for fault in faults:
        log(
            f"{fault['fault']}: {fault['requests_failed']} of {fault['requests_affected']} failed {fault['failures']}; "
            f"recovered in {fault['recovered_s']} s; first failure at {fault['first_failure_s']} s; "
            f"{_answers_judged(fault)}"
        )
    ok = holds(report)
    log(f"{'PASS' if ok else 'FAIL'}: faults rehearsed; report in {args.report}")
    return 0 if ok else 1


def _answers_judged(fault: dict[str, Any]) -> str:
    """A fault's line's end: its wrong answers, and those that left a right text at a near tie."""
    line = f"{fault['wrong_answers']} of {fault['completed']} completed answers wrong"
    count = fault.get("near_tie_answers")
    return (
        f"{line}, {count} more left a right text at a near tie (gap at most {fault['near_tie_gap_max']})"
        if count
        else line
    )


def _read_events(path: Path, setting: str) -> list[dict[str, Any]]:
    """A run's events; a file that is missing, unreadable or holds no answers to judge by is one
    line naming the setting."""
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as lines:
            events = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{setting} {path}: cannot read it ({type(exc).__name__}); name a run's .events.jsonl(.gz)"
        ) from None
    if not any(e.get("type") == "expected" for e in events):
        raise ValueError(f"{setting} {path}: no answers recorded (the run ended before its first fault)")
    return events


def _judge_recorded(args: argparse.Namespace) -> int:
    """Judge recorded events again, optionally by another run's right answers (the same checkpoint
    and stack): a run made without the control, judged by one made with it."""
    try:
        events = _read_events(args.judge_events, "--judge-events")
        control = _read_events(args.references_from, "--references-from") if args.references_from else events
    except ValueError as exc:
        log(f"FAIL: {exc}")
        return 2
    if control is not events:  # the other run's right answers replace this one's (its PD answers stay)
        theirs = next(e for e in control if e["type"] == "expected")
        keys = ("control", "control_under_load", "reference_tokens")
        events = [{**e, **{k: theirs.get(k) for k in keys}} if e["type"] == "expected" else e for e in events]
    faults = judge(events, args.recovery_bound_s)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    references = args.references_from and str(args.references_from)
    report = {"judged_from": str(args.judge_events), "references_from": references,
              "recovery_bound_s": args.recovery_bound_s, "control_under_load": control_texts(control),
              "faults": faults}  # fmt: skip
    args.report.write_text(json.dumps(report, indent=2))
    for fault in faults:
        log(f"{fault['fault']}: {fault['requests_failed']} of {fault['requests_affected']} failed; "
            f"{_answers_judged(fault)}")  # fmt: skip
    return 0 if all(f["wrong_answers"] == 0 for f in faults) else 1


def holds(report: dict[str, Any]) -> bool:
    """What must hold: every chosen fault was injected, no completed answer is wrong, each
    replica fault and the KV link's cut recover within the bound; the cut failed pulls (or
    requests), the healed link moved KV again; with the KV guard on, it tripped at a counted
    failed pull and Serve replaced decode, without it the engines logged their failed pulls and
    under ``recompute`` no request failed; the runbook's program found a decode replica;
    with GCS fault tolerance, the GCS's death fails no request, the replicas serve while it is
    down, and the restarted GCS knows the Serve controller."""
    faults = report["faults"]
    bounded = [f for f in faults if key_of(f) in BOUNDED or key_of(f).startswith("update:")]
    # The update fault is one injection per change (UPDATES).
    updates = len(report.get("updates_chosen") or UPDATES)
    injected = sum(updates if chosen == "update" else 1 for chosen in report["faults_chosen"])
    ok = len(faults) == injected and all(f["recovered_s"] is not None for f in bounded)
    ok = ok and all(f["wrong_answers"] == 0 for f in faults)
    ok = ok and all(f["killed"] for f in faults if key_of(f) == "replace")  # the program found the replica
    for kv in (f for f in faults if key_of(f) == "kv"):
        pulls_failed = (kv["kv_failed_transfers_while_cut"] or 0) > 0
        # The cut reached the KV path: pulls failed, or (an engine that died of it) requests did.
        ok = ok and (pulls_failed or kv["requests_failed"] > 0) and (kv["kv_transfers_after_heal"] or 0) > 0
        guard = report.get("kv_guard") or {}
        if guard.get("on"):
            # A guarded decode trips at the first failed pull it counts, and whatever failed, Serve
            # replaced the decode replica (the new one pulled KV after the heal).
            ok = ok and (not pulls_failed or guard["tripped"] > 0)
            ok = ok and (kv["requests_failed"] == 0 or bool(kv["kv_replicas_new_at_end"]))
        else:
            ok = ok and report["kv_pull_failed_lines"] > 0  # the engine logged its failed pulls
            ok = ok and (report["kv_load_failure_policy"] != "recompute" or kv["requests_failed"] == 0)
    if report.get("failover"):
        ok = ok and failover_holds(report)
    if report["gcs_fault_tolerance"] and "gcs" in report["faults_chosen"]:
        gcs: dict[str, Any] = next((f for f in faults if key_of(f) == "gcs"), {})
        ok = ok and gcs.get("requests_failed") == 0 and bool(gcs.get("completed_while_gcs_down"))
        ok = ok and bool((report["state_after_gcs_restart"] or {}).get("controller_found"))
    return ok


def failover_holds(report: dict[str, Any]) -> bool:
    """With the PD pair's failover: a prefill kill and a KV link cut fail no request; a decode kill
    fails at most the requests in flight at it (decode streams already started cannot move); no
    failed request took longer than the two replica waits; and after each replica fault and the
    cut the pair served disaggregated again by itself."""
    wait_s = float(report["failover"]["wait_s"])
    ok = True
    for fault in report["faults"]:
        key = key_of(fault)
        if key.startswith("update:"):  # each phase its own application, rolled one at a time
            ok = ok and fault["requests_failed"] == 0
            continue
        if key not in ("decode", "prefill", "kv"):
            continue
        allowed = fault["in_flight_at_fault"] if key == "decode" else 0
        ok = ok and fault["requests_failed"] <= allowed
        ok = ok and (fault["longest_failed_s"] or 0.0) <= 2 * wait_s + FAILED_MARGIN_S
        ok = ok and fault.get("disaggregated_again_s") is not None
    return ok


if __name__ == "__main__":
    sys.exit(main())
