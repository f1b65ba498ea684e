"""What a fault is to the harness (``Fault``: what it injects, how it heals, what it must show),
the run's arguments the parent hands its child (``RunArgs``), and what a fault gets while it runs
(``Context``, whose ``inject`` times it against the clients' load)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..harness import log
from ..probes import Endpoint, paths_served
from ..processes import marked_processes
from .load import Events, Load, serving_again

# A failed request with the failover ends within the two replica waits plus this (a dying engine's
# own error, the HTTP round trips).
FAILED_MARGIN_S = 5.0


@dataclass(frozen=True)
class RunArgs:
    """One run's arguments, the same for the CPU and the GPU (``gpu``): the parent parses them once
    and hands them to its child whole (``to_json``), so a new one is added in one place."""

    template: Path
    checkpoint: Path
    report: Path
    faults: tuple[str, ...]
    updates: tuple[str, ...]
    timeout_s: float = 240.0
    recovery_bound_s: float = 240.0
    gpu: bool = False
    streams: int = 2
    no_control: bool = False
    control_load_s: float = 0.0
    kv_chain: str = ""  # the packet filter's chain of this run (the parent removes it, however the child ended)
    weights: str = ""  # on a GPU: a checkpoint folder served from the node cache as a warm node holds it

    @property
    def events(self) -> Path:
        return self.report.with_suffix(".events.jsonl")

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> RunArgs:
        values: dict[str, Any] = json.loads(text)
        paths = {f.name for f in dataclasses.fields(cls) if f.type == "Path"}
        lists = {"faults", "updates"}
        typed: dict[str, Any] = {k: Path(v) if k in paths else tuple(v) if k in lists else v for k, v in values.items()}
        return cls(**typed)


@dataclass
class Setup:
    """What a fault adds to the cluster before it starts: the Ray processes' environment, the GCS
    store's password (``ray start --redis-password``), and its own state, handed back in ``Context``."""

    env: dict[str, str] = field(default_factory=dict)
    redis_password: str | None = None
    state: Any = None


@dataclass
class Context:
    """A running rehearsal as a fault sees it: the clients' load on the deployed app, its events, the
    Ray run's marker (its processes carry it), and each fault's own state from its ``Setup``."""

    run: RunArgs
    load: Load
    events: Events
    endpoint: Endpoint
    http_port: int
    run_id: str
    rehearsed: dict[str, Any]
    state: dict[str, Any]

    def inject(self, key: str, name: str, inject: Callable[[], list[Any]], hold_s: float = 0.0,
               settle_s: float = 0.0) -> None:  # fmt: skip
        """Inject, wait (bounded) until it serves again (``serving_again``, counting only requests
        started ``settle_s`` or more after the fault), keep the load ``hold_s`` longer; with the
        failover, then wait (bounded) until the pair serves disaggregated again; the events file
        records when, and the failover's path counters at each step."""
        bound_s, metrics = self.run.recovery_bound_s, self.endpoint.metrics_url
        time.sleep(3.0)  # steady load first
        paths = paths_served(metrics)
        at = time.time()
        killed = inject()
        self.events.write(
            {"type": "fault", "key": key, "name": name, "at": at, "killed": killed, "hold_s": hold_s, "paths": paths}
        )
        log(f"== fault {name}: killed {killed}")
        while time.time() - at < bound_s:
            if serving_again(self.load.since(at), at + settle_s) is not None:
                break
            time.sleep(0.5)
        held_from = time.time()
        if paths:  # timed from the fault, not from the end of the hold
            self._disaggregated_again(at)
        time.sleep(max(0.0, 2.0 + hold_s - (time.time() - held_from)))
        self.events.write({"type": "fault_end", "name": name, "at": time.time(), "paths": paths_served(metrics)})

    def _disaggregated_again(self, at: float) -> None:
        """Wait until requests are served disaggregated again and by nothing else (two in a row over
        a second's readings), at most the bound after the fault at ``at``; the events file records when."""
        previous = paths_served(self.endpoint.metrics_url)
        while time.time() - at < self.run.recovery_bound_s:
            time.sleep(1.0)
            current = paths_served(self.endpoint.metrics_url)
            grown = {path: current.get(path, 0.0) - previous.get(path, 0.0) for path in current}
            if grown.get("disaggregated", 0.0) >= 2 and not any(v for p, v in grown.items() if p != "disaggregated"):
                self.events.write({"type": "disaggregated_again", "at": time.time(), "after_s": time.time() - at})
                return
            previous = current


def kill(run_id: str, title: str) -> list[int]:
    """SIGKILL the run's processes whose title holds ``title``; their pids."""
    victims = marked_processes(run_id, title)
    for process in victims:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGKILL)
    return [p.pid for p in victims]


class Fault:
    """One fault of the rehearsal: a subclass in a file of its own, one line in ``registry``.

    ``injects``, ``heals`` and ``shows`` are the docs' fault table (generated); ``titles`` maps the
    starts of display titles in recordings made before faults carried keys to their keys."""

    key: str  # its name in --faults and in the events
    injects: str
    heals: str
    shows: str
    titles: tuple[tuple[str, str], ...]  # (title start, key)
    bounded: bool = True  # must serve again within --recovery-bound-s
    deploys_as_kuberay: bool = False  # the app's first deploy goes through Serve's declarative API

    def preflight(self) -> None:
        """In the parent, before anything starts: raise RuntimeError with one line naming the fix."""

    def engine_env(self) -> dict[str, str]:
        """The Ray processes' environment this fault needs."""
        return {}

    def setup(self, stack: contextlib.ExitStack, ray_service: dict[str, Any], run: RunArgs) -> Setup:
        """Before the cluster starts (``stack`` closes after it)."""
        return Setup()

    def run(self, context: Context) -> None:
        """Inject under the load (``context.inject``), once or once per variant."""
        raise NotImplementedError

    def cleanup(self, run: RunArgs) -> None:
        """In the parent, after the child ended however it ended."""

    def judged_keys(self, report: dict[str, Any]) -> tuple[str, ...]:
        """The judged faults it yields in the run ``report`` tells of."""
        return (self.key,)

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        """Its own checks beyond every fault's (injected, no wrong answer, recovered when bounded)."""
        return True

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        """With the PD pair's failover (its replica wait ``wait_s``)."""
        return True


def served_through_failover(judged: dict[str, Any], wait_s: float, allowed: int) -> bool:
    """A replica fault under the failover: at most ``allowed`` failed requests, none took longer than
    the two replica waits, and the pair served disaggregated again by itself."""
    ok = judged["requests_failed"] <= allowed
    ok = ok and (judged["longest_failed_s"] or 0.0) <= 2 * wait_s + FAILED_MARGIN_S
    return ok and judged.get("disaggregated_again_s") is not None
