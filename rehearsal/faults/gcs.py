"""The Ray head's GCS killed. With the template's GCS fault tolerance (gcsFaultToleranceOptions)
the store runs here as the head meets it: the token in Secrets Manager (moto), the head's init
container program, taken from the template, writing the env file the kubelet would read, and a
redis-server requiring that token; the GCS is then started again with its own command line, as the
head container's restart would, and must find the cluster in the store. Without it (a template
synthesized with gcs_fault_tolerance=false) the GCS stays dead: the control. A dead GCS without a
store takes the raylet down, and the raylet every Ray process, so this fault goes last."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eks_pd_serving.fault_tolerance import auth

from .. import local_aws
from ..harness import free_port, log
from ..processes import marked_processes
from .fault import Context, Fault, RunArgs, Setup, kill

# Between the GCS's death and its new start: a head container's restart is longer (seconds to
# start, then the GCS loads the store); what matters here is that the cluster waits for it.
GCS_RESTART_DELAY_S = 5.0
HOLD_S = 90.0  # past Ray's 60 s default for a raylet to reconnect to a GCS


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


def _restart_gcs(context: Context) -> list[int]:
    """Kill the GCS and start it again with its own command line and environment after
    ``GCS_RESTART_DELAY_S``, as the head container's restart would (the new process keeps the run's
    marker, so the run's teardown stops it)."""
    (gcs,) = marked_processes(context.run_id, "gcs_server")
    command, env, cwd = gcs.cmdline(), gcs.environ(), gcs.cwd()
    # ray.init starts the GCS on a free port (--gcs_server_port=0); the raylet and the driver know
    # the one it took, as a head's do 6379: the new GCS takes that one again.
    (raylet,) = [p for p in marked_processes(context.run_id, "raylet") if p.cmdline()[0].endswith("/raylet")]
    (port,) = [a.rsplit(":", 1)[1] for a in raylet.cmdline() if a.startswith("--gcs-address=")]
    command = [f"--gcs_server_port={port}" if a.startswith("--gcs_server_port=") else a for a in command]
    gcs.kill()
    gcs.wait(10)
    time.sleep(GCS_RESTART_DELAY_S)
    subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)  # fmt: skip
    context.events.write({"type": "gcs_restarted", "at": time.time()})
    return [gcs.pid]


def _serve_state(context: Context) -> None:
    """After the GCS restarted: whether the cluster's named actors came back from the store (the
    Serve controller is a detached actor the new GCS must know by name)."""
    import ray
    from ray import serve

    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        applications = {name: str(app.status) for name, app in serve.status().applications.items()}
        context.events.write({"type": "state_after_restart", "controller_found": True, "applications": applications})
    except Exception as exc:
        context.events.write({"type": "state_after_restart", "controller_found": False, "error": f"{exc}"[:300]})


class GcsKilled(Fault):
    key = "gcs"
    injects = "SIGKILL to the head's GCS; with the store, the GCS started again with its own command line"
    heals = f"with the store, the new GCS finds the cluster there ({HOLD_S:g} s held); without it, nothing"
    shows = (
        "with GCS fault tolerance: no request fails, the replicas serve while it is down, the new GCS knows "
        "the Serve controller; without it: no wrong answer (the control)"
    )
    titles = (("GCS killed", "gcs"),)
    bounded = False

    def setup(self, stack: contextlib.ExitStack, ray_service: dict[str, Any], run: RunArgs) -> Setup:
        store = stack.enter_context(gcs_store(ray_service, run.events.parent))
        return Setup(store.env, store.password, store) if store else Setup()

    def run(self, context: Context) -> None:
        store: Store | None = context.state.get(self.key)
        if store is None:  # the dead GCS takes every Ray process with it
            context.inject(self.key, "GCS killed (no fault tolerance)", lambda: kill(context.run_id, "gcs_server"),
                           hold_s=HOLD_S)  # fmt: skip
            return
        context.inject(self.key, "GCS killed, restarted from the store", lambda: _restart_gcs(context), hold_s=HOLD_S)
        _serve_state(context)
        context.events.write({"type": "gcs_store_usage", **store.usage()})

    def holds(self, judged: dict[str, Any], report: dict[str, Any]) -> bool:
        if not report["gcs_fault_tolerance"]:
            return True
        ok = judged["requests_failed"] == 0 and bool(judged["completed_while_gcs_down"])
        return ok and bool((report["state_after_gcs_restart"] or {}).get("controller_found"))


FAULT = GcsKilled()
