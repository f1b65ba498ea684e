"""A user's next deploy under load: the serve config changed (``UPDATES``) and applied as the serve
rollout Job applies it, one application at a time, each through Serve's declarative API as KubeRay
sends it, so Serve decides what restarts by its code-version rules."""

from __future__ import annotations

import copy
import time
from typing import Any

from eks_pd_serving import rollout
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

from .fault import Context, Fault

REDEPLOYED = "serve config redeployed"
# The changes, in order (``changed``), by the name each judged fault has.
UPDATES = {
    "prefill": "prefill engine setting",
    "decode": "decode engine setting",
    "both": "both phases' max_model_len",
    "autoscaling": "decode autoscaling target",
    "failover": "failover wait",
}


def changed(serve_config: dict[str, Any], change: str) -> dict[str, Any]:
    """The serve config as a user's next deploy would change it (``UPDATES``): ``prefill`` or
    ``decode``: that engine's ``max_num_seqs`` one lower (greedy answers do not depend on it);
    ``both``: the model's ``max_model_len`` 64 lower, in both engines and the ingress's card, with the
    phases' pair key changed as synth changes it; ``autoscaling``: decode's autoscaling target;
    ``failover``: the failover's replica wait."""
    result = copy.deepcopy(serve_config)
    if change in ("prefill", "decode"):
        engine = layout.llm_config(result, Phase(change))["engine_kwargs"]
        engine["max_num_seqs"] = max(1, int(engine.get("max_num_seqs", 8)) - 1)
    elif change == "both":
        for app in result["applications"]:
            args = app["args"]
            for _, llm in layout.phase_llm_configs({"applications": [app]}):
                llm["engine_kwargs"]["max_model_len"] -= 64
            if "pair" in args:
                args["pair"] = f"{args['pair']}-{change}"
            for model in args.get("models", []):
                model["max_model_len"] -= 64
    elif change == "autoscaling":
        options = layout.replica_options(result, Phase.DECODE)
        target = _override(result, options["name"]) if "name" in options else None
        options = target or layout.llm_config(result, Phase.DECODE)["deployment_config"]
        if "num_replicas" in options:  # Ray's builder: a fixed count becomes equal bounds (Serve takes one)
            count = options.pop("num_replicas")
            options["autoscaling_config"] = {"min_replicas": count, "max_replicas": count}
        scaling = options.setdefault("autoscaling_config", {})
        scaling["target_ongoing_requests"] = float(scaling.get("target_ongoing_requests", 2.0)) + 1.0
    elif change == "failover":
        for settings in layout.failover_settings(result):
            settings["wait_s"] = float(settings["wait_s"]) + 1.0
    else:
        raise ValueError(f"unknown change {change!r}")
    return result


def _override(serve_config: dict[str, Any], deployment: str) -> dict[str, Any] | None:
    for app in serve_config["applications"]:
        for override in app.get("deployments") or []:
            if override.get("name") == deployment:
                return override  # type: ignore[no-any-return]
    return None


def deploy_steps(current: dict[str, Any], target: dict[str, Any], http_port: int, timeout_s: float) -> float:
    """``target`` as the rollout applies it: one application at a time (``rollout.rollout_steps``),
    each step waited on until it serves; returns the seconds in all."""
    total = 0.0
    steps = rollout.rollout_steps(current, target)
    for number, step in enumerate(steps, 1):
        total += deploy_config(step, http_port, timeout_s)
        if number < len(steps):  # the Job's least gap between steps: the phases differ meanwhile
            time.sleep(rollout.settle_s())
            total += rollout.settle_s()
    return total


def deploy_config(serve_config: dict[str, Any], http_port: int, timeout_s: float) -> float:
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


class Update(Fault):
    key = "update"
    injects = f"each chosen change (`--updates`: {', '.join(UPDATES)}) deployed as the serve rollout Job deploys it"
    heals = "Serve brings each application of the new config to RUNNING, one at a time"
    shows = "each change serves again within the bound; with the failover, no request fails"
    titles = tuple((f"{what} changed", f"update:{change}") for change, what in UPDATES.items())
    deploys_as_kuberay = True  # the first deploy goes the way each update goes

    def run(self, context: Context) -> None:
        current = context.rehearsed
        for change in context.run.updates:
            target = changed(current, change)

            def redeploy(before: dict[str, Any] = current, after: dict[str, Any] = target) -> list[int]:
                ready_s = deploy_steps(before, after, context.http_port, context.run.timeout_s)
                context.events.write({"type": "redeployed", "at": time.time(), "ready_s": ready_s})
                return []

            context.inject(f"update:{change}", f"{UPDATES[change]} changed, {REDEPLOYED}", redeploy, hold_s=5.0)
            current = target

    def judged_keys(self, report: dict[str, Any]) -> tuple[str, ...]:
        return tuple(f"update:{change}" for change in report.get("updates_chosen") or UPDATES)

    def failover_holds(self, judged: dict[str, Any], wait_s: float) -> bool:
        return bool(judged["requests_failed"] == 0)  # each phase its own application, rolled one at a time


FAULT = Update()
