"""The CPU and GPU rehearsals' harness: a local Ray on loopback, the Serve applications built and
deployed, the probes, the decode scale-up when the template autoscales, the colocated control,
the report written whatever happens and the verdict. ``rehearsal.run`` (CPU) and
``rehearsal.gpu`` are its commands; everything it starts is stopped on success, failure and
Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eks_pd_serving.endpoint_check import check_endpoint
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.observability import JOIN_METRIC, OTLP_METRICS, replica_start
from eks_pd_serving.phase import Phase

from . import api_keys, autoscale, client_limits, profile, verdict
from .probes import (
    Endpoint,
    ProbeFailed,
    metric_catalogue,
    run_probes,
    short_prompts,
    short_prompts_judged,
    worker_joins,
)
from .processes import MARKER, marked_processes

PROMPTS = [
    "The quick brown fox",
    "Prefill computes the prompt",
    "NIXL moves KV blocks between engines over UCX",
    "Ray Serve exposes an endpoint",
]
LOCAL_ENV = {
    # Each engine gets 1 GiB of KV cache in host memory; two share 2 cores without pinning.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "RAY_SERVE_LOG_TO_STDERR": "0",
}
# A new engine replica on two busy cores takes minutes (three processes import torch and vLLM).
SCALE_UP_TIMEOUT_S = 480.0
# Ray exports metrics every 10 s by default; every 250 ms lets each request's counters be read
# before the next request is sent.
RAY_SETTINGS = {"RAY_metrics_report_interval_ms": "250"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def local_ray(
    env: dict[str, str],
    metrics_port: int,
    resources: dict[str, float],
    redis_password: str | None = None,
    num_cpus: int = 8,
) -> Iterator[str]:
    """Ray on loopback; on exit every process it started (engines included) is gone. With
    ``RAY_REDIS_ADDRESS`` in ``env``, the GCS keeps its state in that store (``redis_password``).
    ``num_cpus``: Ray's logical CPUs (each engine's replica and its bundle take one each)."""
    import ray

    # A caller may name the run (tests running rehearsals side by side look for their own).
    run_id = os.environ.get(MARKER) or uuid.uuid4().hex
    os.environ[MARKER] = run_id  # inherited by raylet, workers and the engines they spawn
    os.environ.update(env)
    os.environ.update(RAY_SETTINGS)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in previous:
        signal.signal(sig, interrupted)
    try:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            resources=resources,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _metrics_export_port=metrics_port,
            runtime_env={"env_vars": env},
            log_to_driver=False,
            logging_level=logging.WARNING,
            **({"_redis_password": redis_password} if redis_password else {}),
        )
        yield run_id
    finally:
        with contextlib.suppress(Exception):
            from ray import serve

            serve.shutdown()
        with contextlib.suppress(Exception):
            ray.shutdown()
        stopped = kill_marked(run_id)
        if stopped:
            log(f"teardown: stopped {stopped} leftover process(es)")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def logs_dir() -> Path:
    """The running Ray session's log folder (Serve's controller and replica logs under ``serve/``)."""
    import ray

    return Path(ray._private.worker.global_worker.node.get_logs_dir_path())


def serve_log_lines(logs: Path) -> list[str]:
    """Every line of Serve's controller and replica log files in a session's log folder."""
    return [line for path in sorted(logs.glob("serve/*.log")) for line in path.read_text(errors="replace").splitlines()]


def kill_marked(run_id: str) -> int:
    """Kill every process of this run that outlived ray.shutdown (orphaned engine cores)."""
    import psutil

    victims = marked_processes(run_id)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=10)
    return len(victims)


def build(serve_config: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """Each application built exactly as Serve would from its import path (Ray Serve LLM's
    builders validate their arguments here). Needs Ray up: a builder may otherwise start one. The
    pods' PYTHONPATH (the workers' env, in this process's since ``local_ray``) holds the package's
    own builder, as it does for the build task on a pod."""
    import sys

    from ray._common.utils import import_attr

    for folder in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
    return [(app, import_attr(app["import_path"])(app["args"])) for app in serve_config["applications"]]


def deploy(built: list[tuple[dict[str, Any], Any]], http_port: int, timeout_s: float) -> float:
    """Deploy the built applications' config as KubeRay does (the whole config through Serve's
    declarative API, each application's ``deployments:`` overrides applied); wait until exactly
    these applications are RUNNING."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    started = time.monotonic()
    config = {"applications": [app for app, _ in built]}
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    names = {app["name"] for app, _ in built}
    while True:
        status = serve.status().applications
        states = {name: s.status for name, s in status.items()}
        if set(states) == names and all(s == "RUNNING" for s in states.values()):
            return time.monotonic() - started
        failed = {name: s.message for name, s in status.items() if s.status == "DEPLOY_FAILED"}
        if failed:
            raise ProbeFailed(f"deploy failed: {failed}")
        if time.monotonic() - started > timeout_s:
            raise ProbeFailed(f"not healthy after {timeout_s:.0f} s: {states}")
        time.sleep(0.5)


def undeploy(serve_config: dict[str, Any]) -> None:
    from ray import serve

    for app in serve_config["applications"]:
        serve.delete(app["name"])


@dataclass(frozen=True)
class Rehearsal:
    """One rehearsal: the serve config to run, the workers' environment, the model id clients ask
    for, how long a deploy may take, and when the command started (``time.monotonic()``).
    ``control``: the application compared with it (default: one colocated engine with no
    connector). ``keys``: every Serve proxy checks API keys and every probe sends the key."""

    rehearsed: dict[str, Any]
    env: dict[str, str]
    model_id: str
    timeout_s: float
    started: float
    control: dict[str, Any] | None = None
    keys: api_keys.LocalKeys | None = None
    # The deployed conditional-disaggregation threshold (the profile rehearses every prompt
    # disaggregated): above 0, the PD app is deployed again with it and probed with a prompt
    # within it and one past it.
    short_prompt_tokens: int = 0


def rehearse_both(run: Rehearsal) -> dict[str, Any]:
    """The PD application (and its scale-up, when decode autoscales), then the control, in one Ray
    session. With keys, the check itself is probed on the PD app."""
    rehearsed, keys, model_id = run.rehearsed, run.keys, run.model_id
    http_port, metrics_port = free_port(), free_port()
    endpoint = Endpoint(
        f"http://127.0.0.1:{http_port}",
        model_id,
        f"http://127.0.0.1:{metrics_port}/metrics",
        keys.key if keys else None,
    )
    report: dict[str, Any] = {}
    used: list[str] = []
    control = run.control or profile.colocated_control(rehearsed)
    with local_ray(
        profile.merged_env(run.env, keys.env if keys else {}), metrics_port, profile.custom_resources(rehearsed)
    ) as run_id:
        # Built first, with Ray up (building can start a Ray of its own otherwise): a broken
        # config fails before anything deploys.
        phases = [("pd", rehearsed, build(rehearsed)), ("colocated", control, build(control))]
        for name, config, built in phases:
            log(f"== {name}: deploying")
            ready_s = deploy(built, http_port, run.timeout_s)
            since_start = time.monotonic() - run.started
            log(f"== {name}: healthy after {ready_s:.1f} s ({since_start:.1f} s since start)")
            report[name] = run_probes(endpoint, PROMPTS)
            report[name].update(ready_s=ready_s, ready_from_start_s=since_start)
            # The HTTP half of `python -m eks_pd_serving verify`, against this endpoint.
            report[name]["verify_endpoint"] = asdict(
                check_endpoint(endpoint.base_url, model_id, api_key=endpoint.api_key)
            )
            # First after the plain probes (one request at a time): the later probes' concurrent
            # load can start a scale-up of their own, which Serve keeps for the downscale delay.
            if config is rehearsed and autoscale.decode_scaling(rehearsed):
                log("== pd: decode autoscales; bursts until Serve adds a replica")
                report["autoscale"] = autoscale.scale_up(endpoint, SCALE_UP_TIMEOUT_S, log)
            if config is rehearsed:
                log("== pd: what a client may not do (transfer params, adapter ids, a 2 MB chat)")
                length = layout.llm_config(rehearsed, Phase.DECODE)["engine_kwargs"]["max_model_len"]
                report["client_limits"] = client_limits.probe(endpoint, run_id, int(length))
            if keys and config is rehearsed:
                log("== pd: API keys (OpenAI SDK with, without and with a wrong key; a rotation)")
                report["api_keys"], used = api_keys.probe(endpoint, keys, run_id, log)
            if config is rehearsed:
                # Each engine start so far, split (observability/replica_start.py), from Serve's files.
                starts = replica_start.engine_starts(serve_log_lines(logs_dir()))
                report["replica_starts"] = [s.summary() for s in starts]
            if config is rehearsed:
                # After traffic, so the request and KV families exist: the dashboard's metric
                # names are checked against this (tests/template/test_observability.py).
                report["metrics"] = metric_catalogue(endpoint.metrics_url)
                histograms = [family for family, kind in OTLP_METRICS if kind == "histogram"]
                report["metric_joins"] = worker_joins(endpoint.metrics_url, histograms, JOIN_METRIC)
            undeploy(config)
            if config is rehearsed and run.short_prompt_tokens:
                log(f"== pd: deploying again with the deployed short_prompt_tokens={run.short_prompt_tokens}")
                short = with_short_prompts(rehearsed, run.short_prompt_tokens)
                deploy(build(short), http_port, run.timeout_s)
                report["short_prompts"] = short_prompts(endpoint, run.short_prompt_tokens)
                undeploy(short)
    if keys:
        # After Ray is down: every log file it wrote this run, searched for the keys.
        report["api_keys"]["logs"] = api_keys.scan_logs(report["api_keys"]["session_dir"], used)
    return report


def with_short_prompts(serve_config: dict[str, Any], threshold: int) -> dict[str, Any]:
    """``serve_config`` with the failover's conditional disaggregation at ``threshold``."""
    import copy

    from eks_pd_serving.k8s import serve_config as serve_config_module

    changed = copy.deepcopy(serve_config)
    for settings in serve_config_module.failover_settings(changed):
        settings["short_prompt_tokens"] = threshold
    return changed


def recorded(report: dict[str, Any], report_file: Path, action: Callable[[], dict[str, Any]]) -> int | None:
    """``report.update(action())``, the report written whatever happens. None when it completed;
    else the exit status (1 failed, with the error shown, 130 interrupted)."""
    try:
        report.update(action())
    except KeyboardInterrupt:
        log("interrupted: everything stopped")
        return 130
    except Exception as error:  # Ray's own rejection of a config is the message to show
        log(f"REHEARSAL FAILED: {type(error).__name__}: {error}")
        return 1
    finally:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(json.dumps(report, indent=2, default=str))
    return None


def rehearse_and_judge(report: dict[str, Any], run: Rehearsal, report_file: Path, strict: bool = True) -> int:
    """rehearse_both, the report written whatever happens, the verdict printed; the exit status
    (0 pass, 1 fail, 130 interrupted)."""
    failed = recorded(report, report_file, lambda: rehearse_both(run))
    if failed is not None:
        return failed
    ok, lines = verdict.judge(report, strict=strict)
    if run.keys:
        keyed, key_lines = api_keys.judge(report["api_keys"])
        ok, lines = ok and keyed, lines + key_lines
    if "client_limits" in report:
        limited, limit_lines = client_limits.judge(report["client_limits"])
        ok, lines = ok and limited, lines + limit_lines
    if run.short_prompt_tokens:
        short, short_lines = short_prompts_judged(report["short_prompts"], run.short_prompt_tokens)
        ok, lines = ok and short, lines + short_lines
    scaling = autoscale.decode_scaling(run.rehearsed)
    if scaling:
        scaled, scale_lines = autoscale.judge(report["autoscale"], scaling)
        ok, lines = ok and scaled, lines + scale_lines
    for line in lines:
        log(line)
    log(f"total {time.monotonic() - run.started:.1f} s; report in {report_file}")
    return 0 if ok else 1
