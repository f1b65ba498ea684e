"""A replica's start in its parts, read from the lines Ray Serve, Ray Serve LLM, the node cache and
vLLM already log (no instrumentation of their code): the fault rehearsal's report carries it per
fault, and ``verify`` prints it for a running cluster.

The parts, in order (each the gap between two lines, or vLLM's own figure):

- ``serve_saw``: Serve's controller saw the fault or the change (an actor crashed, a health check
  failed, a new version deployed) until it starts a replica;
- ``actor``: the new replica's actor up (a Ray worker process, its imports, the deployment's
  constructor reached): "Started initializing replica";
- ``node_init``: the weights made ready on the node: the node cache's fill in the replica, until its
  line, or until its compile caches' line when it shares them (``compile_caches`` holds that line:
  what it extracted); None when Ray Serve LLM's per-node download tasks did it (their end is not
  logged);
- ``engine_config``: Ray Serve LLM 2.58 builds vLLM's engine config in a Ray task on the GPU's
  bundle (a further Python process importing vLLM), until "Clearing the current platform cache";
  under Ray's download tasks it includes them;
- ``engine_process``: vLLM's engine core process up ("Initializing a V1 LLM engine");
- ``executor_worker``: the engine's Ray executor worker up (its first line, ``world_size=``);
- ``weights``: vLLM's "Model loading took ... seconds";
- ``engine_init``: vLLM's "init engine (profile, create kv cache, warmup model) took ... s";
- ``to_running``: the rest until Serve marks the replica RUNNING (the API server built, NIXL's
  listener, the first health check).

The lines, as Ray 2.58 and vLLM 0.26 write them, are held by tests against logs captured on an H100
(docs/gpu-runs/2026-12-06). vLLM's timestamps have one-second resolution and no year; the parts read
from them are good to about a second. An engine's lines are matched to a start by time, in start
order, so two replicas starting together (a first deploy) may swap engines: their parts are
flagged ``paired_by_time``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..phase import PHASES

# Serve's controller and replica lines: LEVEL YYYY-MM-DD HH:MM:SS,mmm <component> <id> -- <message>
_SERVE = re.compile(r"(?:^|\s)(?:INFO|WARNING|ERROR|DEBUG) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\S+) (\S+) -- (.*)$")
_REPLICA = r"Replica\(id='(?P<id>[^']+)', deployment='(?P<deployment>[^']+)', app='(?P<app>[^']+)'\)"
_STARTING = re.compile(rf"^Starting {_REPLICA}")
_RUNNING = re.compile(rf"^{_REPLICA} started successfully")
# What makes Serve start a replica: a crash, a failed health check, a new version.
_SEEN = (
    re.compile(rf"^Actor for {_REPLICA} crashed"),
    re.compile(rf"^Replica {_REPLICA} failed health check"),
    re.compile(rf"{_REPLICA} failed the health check"),
    re.compile(r"^Deploying new version of Deployment\(name='(?P<deployment>[^']+)', app='(?P<app>[^']+)'\)"),
)
_INITIALIZING = "Started initializing replica"
_RAY_TASKS = "Running tasks to download model files on worker nodes"
_NODE_INIT_DONE = "Clearing the current platform cache"
_IN_REPLICA = "(in the replica: Ray's per-node download tasks skipped)"  # eks_pd_node_cache.IN_REPLICA_LINE
_COMPILE_CACHES = "compile caches: "  # eks_pd_node_cache's lines of fill_compiled and share_compiled
# vLLM's lines: an optional (EngineCore pid=N) / (Worker pid=N) prefix, LEVEL MM-DD HH:MM:SS [file:line]
_VLLM = re.compile(
    r"(?:\((?P<proc>EngineCore|Worker)[^()]*?pid=(?P<pid>\d+)\)\s+)?(?:INFO|WARNING|ERROR|DEBUG) "
    r"(?P<when>\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]+\] (?P<message>.*)$"
)
_ENGINE_EVENTS = {
    "core": re.compile(r"^Initializing a V1 LLM engine"),
    "worker": re.compile(r"^world_size=\d+ rank=\d+"),
    "weights": re.compile(r"^Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds"),
    "init": re.compile(r"^init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
# The engine deployments' names start with these (Ray Serve LLM's PD builder): the starts that matter.
ENGINE_PHASES = tuple(phase.title() for phase in PHASES)
PARTS = ("serve_saw", "actor", "node_init", "engine_config", "engine_process", "executor_worker", "weights",
         "engine_init", "to_running")  # fmt: skip


@dataclass
class _Engine:
    kind: str
    at: datetime.datetime
    pid: str
    seconds: float | None
    claimed: bool = False


@dataclass
class ReplicaStart:
    """One replica's start as the logs tell it; ``parts`` turns it into seconds."""

    app: str
    deployment: str
    replica: str
    starting: datetime.datetime
    seen: datetime.datetime | None = None
    initializing: datetime.datetime | None = None
    weights_ready: datetime.datetime | None = None  # the node cache's line, when it filled in the replica
    config_done: datetime.datetime | None = None  # "Clearing the current platform cache": config built too
    node_init_how: str | None = None  # "ray tasks" or "in the replica"
    compile_caches: str | None = None  # the node cache's line on the shared compile caches, before the engine
    engine_core: datetime.datetime | None = None
    executor_worker: datetime.datetime | None = None
    weights_s: float | None = None
    engine_init_s: float | None = None
    running: datetime.datetime | None = None
    paired_by_time: bool = False
    _pids: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def phase(self) -> str:
        return self.deployment.split(":", 1)[0]

    def parts(self) -> dict[str, float | None]:
        """Each part in seconds (None where its lines are missing), and ``total`` from what Serve saw
        (or its start of the replica) to RUNNING."""

        def gap(a: datetime.datetime | None, b: datetime.datetime | None) -> float | None:
            return round((b - a).total_seconds(), 1) if a and b else None

        rest = None
        if self.executor_worker and self.running and self.weights_s is not None and self.engine_init_s is not None:
            rest = round(gap(self.executor_worker, self.running) - self.weights_s - self.engine_init_s, 1)  # type: ignore[operator]
        return {
            "serve_saw": gap(self.seen, self.starting),
            "actor": gap(self.starting, self.initializing),
            "node_init": gap(self.initializing, self.weights_ready),
            "engine_config": gap(self.weights_ready or self.initializing, self.config_done),
            "engine_process": gap(self.config_done, self.engine_core),
            "executor_worker": gap(self.engine_core, self.executor_worker),
            "weights": self.weights_s,
            "engine_init": self.engine_init_s,
            "to_running": rest,
            "total": gap(self.seen or self.starting, self.running),
        }

    def summary(self) -> dict[str, object]:
        return {
            "app": self.app, "deployment": self.deployment, "replica": self.replica,
            "starting": self.starting.isoformat(sep=" "), "node_init_how": self.node_init_how,
            "compile_caches": self.compile_caches,
            "paired_by_time": self.paired_by_time, "parts_s": self.parts(),
        }  # fmt: skip

    def line(self) -> str:
        """One line: the parts that were read, in order."""
        parts = self.parts()
        words = [f"{k} {v:.1f} s" for k, v in parts.items() if k != "total" and v is not None]
        how = f" (node init: {self.node_init_how})" if self.node_init_how else ""
        total = f"{parts['total']:.1f} s to RUNNING" if parts["total"] is not None else "not RUNNING yet"
        compiled = f"; {self.compile_caches}" if self.compile_caches else ""
        return f"{self.phase} replica {self.replica}: {total}{how}: {', '.join(words)}{compiled}"


def _serve_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")


def _vllm_time(text: str, year: int) -> datetime.datetime:
    return datetime.datetime.strptime(f"{year}-{text}", "%Y-%m-%d %H:%M:%S")


def replica_starts(lines: Iterable[str]) -> list[ReplicaStart]:
    """Every replica start the lines show (controller lines needed for a start to be found), in the
    order Serve started them, with whatever parts the other lines supply."""
    starts: dict[str, ReplicaStart] = {}
    seen: dict[tuple[str, str], datetime.datetime] = {}
    replica_lines: list[tuple[datetime.datetime, str, str]] = []
    vllm_lines: list[tuple[str, str | None, str | None, str]] = []
    for raw in lines:
        line = raw.rstrip("\n")
        serve = _SERVE.search(line)
        if serve:
            at, component, ident, message = _serve_time(serve[1]), serve[2], serve[3], serve[4]
            if component == "controller":
                _controller(at, message, starts, seen)
            else:
                replica_lines.append((at, ident, message))
            continue
        vllm = _VLLM.search(line)
        if vllm:
            vllm_lines.append((vllm["when"], vllm["proc"], vllm["pid"], vllm["message"]))
    for at, ident, message in replica_lines:
        start = starts.get(ident)
        if start is None:
            continue
        if message.startswith(_INITIALIZING):
            start.initializing = at
        elif message.startswith(_RAY_TASKS):
            start.node_init_how = "ray tasks"
        elif message.endswith(_IN_REPLICA):
            start.node_init_how = "in the replica"
            start.weights_ready = at
        elif message.startswith(_COMPILE_CACHES) and start.config_done is None:  # the fill, not the share
            start.weights_ready = at
            start.compile_caches = message
        elif message.startswith(_NODE_INIT_DONE):
            start.config_done = at
    ordered = sorted(starts.values(), key=lambda s: s.starting)
    if ordered:
        _match_engines(ordered, _engine_events(vllm_lines, ordered[0].starting.year))
    return ordered


def _controller(
    at: datetime.datetime, message: str, starts: dict[str, ReplicaStart], seen: dict[tuple[str, str], datetime.datetime]
) -> None:
    starting = _STARTING.search(message)
    if starting:
        key = (starting["deployment"], starting["app"])
        start = ReplicaStart(starting["app"], starting["deployment"], starting["id"], at, seen.pop(key, None))
        starts[start.replica] = start
        return
    running = _RUNNING.search(message)
    if running and running["id"] in starts:
        starts[running["id"]].running = at
        return
    for pattern in _SEEN:
        match = pattern.search(message)
        if match:
            seen.setdefault((match["deployment"], match["app"]), at)  # the first line of this fault
            return


def _engine_events(lines: list[tuple[str, str | None, str | None, str]], year: int) -> list[_Engine]:
    events = []
    for when, _proc, pid, message in lines:
        for kind, pattern in _ENGINE_EVENTS.items():
            match = pattern.search(message)
            if match:
                seconds = float(match[1]) if match.groups() else None
                events.append(_Engine(kind, _vllm_time(when, year), pid or "", seconds))
    return events


def _overlap(one: ReplicaStart, other: ReplicaStart) -> bool:
    """Their engine windows (node init done to RUNNING, open-ended while starting) overlap."""
    assert one.config_done is not None and other.config_done is not None
    far = datetime.datetime.max
    return one.config_done <= (other.running or far) and other.config_done <= (one.running or far)


def _match_engines(starts: list[ReplicaStart], events: list[_Engine]) -> None:
    """Each start's engine lines: the first unclaimed engine core after its node init, that core's
    executor worker after it, the worker's weights and the core's init (by pid where the lines
    carry one; vLLM's second resolution allows a second of slack)."""
    slack = datetime.timedelta(seconds=1)

    def take(kind: str, after: datetime.datetime, before: datetime.datetime | None, pid: str = "") -> _Engine | None:
        for event in events:
            if event.claimed or event.kind != kind or event.at < after - slack:
                continue
            if before is not None and event.at > before + slack:
                return None
            if pid and event.pid and event.pid != pid:
                continue
            event.claimed = True
            return event
        return None

    by_config = sorted((s for s in starts if s.config_done), key=lambda s: s.config_done)  # type: ignore[arg-type,return-value]
    for start in by_config:
        assert start.config_done is not None
        start.paired_by_time = any(_overlap(start, other) for other in by_config if other is not start)
        core = take("core", start.config_done, start.running)
        if core is None:
            continue
        start.engine_core = core.at
        worker = take("worker", core.at, start.running)
        if worker is not None:
            start.executor_worker = worker.at
            weights = take("weights", worker.at, start.running, worker.pid)
            start.weights_s = weights.seconds if weights else None
        init = take("init", core.at, start.running, core.pid)
        start.engine_init_s = init.seconds if init else None


def engine_starts(lines: Iterable[str]) -> list[ReplicaStart]:
    """``replica_starts`` of the engine deployments alone (not the ingress's)."""
    return [s for s in replica_starts(lines) if s.phase in ENGINE_PHASES]
