"""Faults under load, on this machine: the deployed PD app (the rehearsal's profile) serving a
constant stream of greedy streamed chat requests on 127.0.0.1 while one fault at a time is
injected:

1. the decode replica's process is killed mid-stream;
2. the prefill replica's process is killed while requests are in flight;
3. the Ray head's GCS is killed. With the template's GCS fault tolerance (gcsFaultToleranceOptions)
   the store runs here as the head meets it: the token in Secrets Manager (moto), the head's init
   container program, taken from the template, writing the env file the kubelet would read, and a
   redis-server requiring that token; the GCS is then started again with its own command line, as
   the head container's restart would, and must find the cluster in the store. Without it (a
   template synthesized with gcs_fault_tolerance=false) the GCS stays dead: the control.

For each: how many requests failed and how (HTTP status, error text), how long until a request
started after the fault succeeded again, and whether any completed answer differs from the app's
own answer to the same prompt before any fault (greedy: it must not). Bounded: each fault waits
at most ``--recovery-bound-s``; everything started is stopped at the end.

Without GCS fault tolerance a dead GCS takes the raylet down, and the raylet takes every Ray
process with it, the driver included (so that fault goes last). So the Ray side runs in a child
process (its own session) that writes each request's outcome and each fault to an events file as
they happen; this process judges from that file once the child has ended, however it ended.

    .venv-rehearse/bin/python -m rehearsal.faults --template cdk.out/RayLlmPdServing.template.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from eks_pd_serving.fault_tolerance import auth

from . import local_aws, profile, tiny_checkpoint
from .harness import (
    LOCAL_ENV,
    PROMPTS,
    build,
    deploy,
    free_port,
    kill_marked,
    local_ray,
    log,
)
from .probes import Endpoint
from .processes import MARKER, marked_processes

MAX_TOKENS = 24
STREAMS = 2  # concurrent clients
# Between the GCS's death and its new start: a head container's restart is longer (seconds to
# start, then the GCS loads the store); what matters here is that the cluster waits for it.
GCS_RESTART_DELAY_S = 5.0


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

    @property
    def complete(self) -> bool:
        return self.status == 200 and not self.error and self.done and self.finish_reason is not None

    @property
    def kind(self) -> str:
        """How it ended, as a client sees it."""
        if self.complete:
            return "complete"
        if self.status is None:
            return f"no response ({(self.error or '')[:80]})"
        if self.status != 200:
            return f"HTTP {self.status}: {(self.error or '')[:100]}"
        if self.error:
            return f"error chunk: {self.error[:100]}"
        return f"stream cut after {len(self.text)} characters (HTTP 200, no [DONE])"


def _stream(client: httpx.Client, endpoint: Endpoint, prompt: str) -> Outcome:
    body = {
        "model": endpoint.model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    started, pieces, status, error = time.time(), [], None, None
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
                    if choices and choices[0].get("finish_reason"):
                        finish = choices[0]["finish_reason"]
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return Outcome(prompt, started, time.time(), status, error, "".join(pieces), finish, done)


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
    """``STREAMS`` clients sending one request after another until stopped."""

    def __init__(self, endpoint: Endpoint, events: Events) -> None:
        self.endpoint = endpoint
        self.events = events
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(STREAMS)]

    def _run(self, index: int) -> None:
        with httpx.Client(base_url=self.endpoint.base_url, timeout=120) as client:
            turn = index
            while not self._stop.is_set():
                outcome = _stream(client, self.endpoint, PROMPTS[turn % len(PROMPTS)])
                turn += 1
                with self._lock:
                    self.outcomes.append(outcome)
                self.events.write({"type": "outcome", **asdict(outcome)})
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


def _fault(load: Load, name: str, inject: Any, bound_s: float, hold_s: float = 0.0) -> None:
    """Inject, wait (bounded) until two requests started after the fault completed, keep the
    load ``hold_s`` longer; the events file records when."""
    time.sleep(3.0)  # steady load first
    at = time.time()
    killed = inject()
    load.events.write({"type": "fault", "name": name, "at": at, "killed": killed, "hold_s": hold_s})
    log(f"== fault {name}: killed {killed}")
    while time.time() - at < bound_s:
        if len([o for o in load.since(at) if o.started > at and o.complete]) >= 2:
            break
        time.sleep(0.5)
    time.sleep(2.0 + hold_s)
    load.events.write({"type": "fault_end", "name": name, "at": time.time()})


def judge(events: list[dict[str, Any]], bound_s: float) -> list[dict[str, Any]]:
    """Per fault: the requests it could touch (in flight at it, or started before recovery and
    the hold), how they ended, the recovery time, and the completed answers that differ from
    the app's own before any fault."""
    expected = next(e["answers"] for e in events if e["type"] == "expected")
    fields = set(Outcome.__dataclass_fields__)
    outcomes = [Outcome(**{k: v for k, v in e.items() if k in fields}) for e in events if e["type"] == "outcome"]
    faults = [e for e in events if e["type"] == "fault"]
    results = []
    for index, fault in enumerate(faults):
        at = fault["at"]
        until = faults[index + 1]["at"] if index + 1 < len(faults) else float("inf")
        window = [o for o in outcomes if o.ended >= at and o.started < until]
        good = sorted(o.ended for o in window if o.started > at and o.complete)
        recovered_s = good[1] - at if len(good) >= 2 and good[1] - at <= bound_s + 5 else None
        affected = [o for o in window if o.started <= at + (recovered_s or bound_s) + fault["hold_s"]]
        completed = [o for o in window if o.complete]
        restarted = next((e["at"] for e in events if e["type"] == "gcs_restarted" and at <= e["at"] < until), None)
        down = [o for o in window if restarted is not None and at < o.started <= restarted]
        results.append(
            {
                "fault": fault["name"],
                "killed": fault["killed"],
                "requests_affected": len(affected),
                "requests_failed": sum(not o.complete for o in affected),
                "failures": dict(Counter(o.kind for o in affected if not o.complete)),
                "recovered_s": recovered_s,
                "held_s": fault["hold_s"],
                "first_failure_s": min((o.ended - at for o in affected if not o.complete), default=None),
                "completed": len(completed),
                "wrong_answers": sum(o.text != expected[o.prompt] for o in completed),
                "ended_by_fault": not any(e["type"] == "fault_end" and e["name"] == fault["name"] for e in events),
                # A GCS restarted from its store: how long it was down, the answers finished while it
                # was (in flight at the kill or started after it), and those started while it was.
                "gcs_down_s": None if restarted is None else round(restarted - at, 1),
                "completed_while_gcs_down": None
                if restarted is None
                else sum(o.complete and at < o.ended <= restarted for o in window),
                "started_while_gcs_down": None if restarted is None else [sum(o.complete for o in down), len(down)],
            }
        )
    return results


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
    checkpoint = tiny_checkpoint.build(args.checkpoint.resolve())
    deployed = profile.serve_config(ray_service)
    (app,) = deployed["applications"]
    rehearsed = profile.local_profile(deployed, checkpoint)
    model_id = app["args"]["decode_config"]["model_loading_config"]["model_id"]
    env = {**profile.worker_env(ray_service), **LOCAL_ENV}
    for name in [k for k in env if k.startswith(("EKS_PD_API_KEYS", "RAY_SERVE_HTTP_PROXY")) or k == "PYTHONPATH"]:
        env.pop(name)  # the key check is the main rehearsal's; here every request goes unkeyed
    http_port, metrics_port = free_port(), free_port()
    endpoint = Endpoint(f"http://127.0.0.1:{http_port}", model_id, f"http://127.0.0.1:{metrics_port}/metrics")
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(gcs_store(ray_service, args.events.parent))
        events.write({"type": "gcs_store", "on": store is not None})
        if store is not None:
            env.update(store.env)
        run_id = stack.enter_context(
            local_ray(
                env, metrics_port, profile.custom_resources(rehearsed), redis_password=store.password if store else None
            )
        )
        return _under_load(args, events, rehearsed, endpoint, http_port, run_id, store)


def _under_load(args: argparse.Namespace, events: Events, rehearsed: dict[str, Any], endpoint: Endpoint,
                http_port: int, run_id: str, store: Store | None) -> int:  # fmt: skip
    """Deploy, record the app's own answers, then the faults in order under the clients' load."""
    events.write({"type": "ready", "ready_s": deploy(build(rehearsed), http_port, args.timeout_s)})
    with httpx.Client(base_url=endpoint.base_url, timeout=120) as client:
        answers = {p: _stream(client, endpoint, p) for p in PROMPTS}
    if not all(a.complete for a in answers.values()):
        raise RuntimeError("the app did not answer every prompt before any fault")
    events.write({"type": "expected", "answers": {p: a.text for p, a in answers.items()}})
    with Load(endpoint, events) as load:
        for name, title in (("decode replica killed", "ServeReplica:pd-openai:Decode"),
                            ("prefill replica killed", "ServeReplica:pd-openai:Prefill")):  # fmt: skip
            _fault(load, name, lambda t=title: _kill(run_id, t), args.recovery_bound_s)
        if store is not None:
            # Held 90 s: past Ray's 60 s default for a raylet to reconnect to a GCS.
            _fault(load, "GCS killed, restarted from the store", lambda: _restart_gcs(run_id, events),
                   args.recovery_bound_s, hold_s=90.0)  # fmt: skip
            _serve_state(events)
            events.write({"type": "gcs_store_usage", **store.usage()})
        else:  # last: without a store the dead GCS takes every Ray process with it
            _fault(load, "GCS killed (no fault tolerance)", lambda: _kill(run_id, "gcs_server"),
                   args.recovery_bound_s, hold_s=90.0)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--template", type=Path, default=Path("cdk.out/RayLlmPdServing.template.json"))
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path, default=Path(".rehearsal/faults.json"))
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--recovery-bound-s", type=float, default=240.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--events", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for noisy in ("httpx", "ray", "ray.serve", "vllm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.child:
        return _child(args)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    events_file = args.report.with_suffix(".events.jsonl")
    events_file.unlink(missing_ok=True)
    run_id = os.environ.get(MARKER) or f"faults-{os.getpid()}"
    command = [sys.executable, "-m", "rehearsal.faults", "--child", "--events", str(events_file),
               "--template", str(args.template), "--checkpoint", str(args.checkpoint),
               "--timeout-s", str(args.timeout_s), "--recovery-bound-s", str(args.recovery_bound_s)]  # fmt: skip
    bound_s = args.timeout_s + 3 * (args.recovery_bound_s + 100) + 300
    try:
        child = subprocess.run(
            command, env={**os.environ, MARKER: run_id}, start_new_session=True, timeout=bound_s, check=False
        )
        exit_code: int | None = child.returncode
    except subprocess.TimeoutExpired:
        exit_code = None
    finally:
        stopped = kill_marked(run_id)
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    faults = judge(events, args.recovery_bound_s) if any(e["type"] == "expected" for e in events) else []
    store = next((e["on"] for e in events if e["type"] == "gcs_store"), None)
    state = next((e for e in events if e["type"] == "state_after_restart"), None)
    usage = next(({k: v for k, v in e.items() if k != "type"} for e in events if e["type"] == "gcs_store_usage"), None)
    report = {"child_exit": exit_code, "leftovers_stopped": stopped, "recovery_bound_s": args.recovery_bound_s,
              "streams": STREAMS, "gcs_fault_tolerance": store, "state_after_gcs_restart": state,
              "gcs_store_usage": usage, "faults": faults}  # fmt: skip
    args.report.write_text(json.dumps(report, indent=2))
    for fault in faults:
        log(
            f"{fault['fault']}: {fault['requests_failed']} of {fault['requests_affected']} failed {fault['failures']}; "
            f"recovered in {fault['recovered_s']} s; first failure at {fault['first_failure_s']} s; "
            f"{fault['wrong_answers']} of {fault['completed']} completed answers wrong"
        )
    ok = holds(report)
    log(f"{'PASS' if ok else 'FAIL'}: faults rehearsed; report in {args.report}")
    return 0 if ok else 1


def holds(report: dict[str, Any]) -> bool:
    """What must hold: every fault was injected, no completed answer differs, each replica fault
    recovers within the bound; with GCS fault tolerance, the GCS's death fails no request, the
    replicas serve while it is down, and the restarted GCS knows the Serve controller."""
    faults = report["faults"]
    replica_faults = [f for f in faults if "replica" in f["fault"]]
    ok = len(faults) == 3 and all(f["recovered_s"] is not None for f in replica_faults)
    ok = ok and all(f["wrong_answers"] == 0 for f in faults)
    if report["gcs_fault_tolerance"]:
        gcs = faults[-1] if faults else {}
        ok = ok and gcs.get("requests_failed") == 0 and bool(gcs.get("completed_while_gcs_down"))
        ok = ok and bool((report["state_after_gcs_restart"] or {}).get("controller_found"))
    return ok


if __name__ == "__main__":
    sys.exit(main())
