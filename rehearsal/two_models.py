"""Two models through one ingress, on this CPU (issue 67): the default settings' RayService with a
second model added as one typed value (what ``PdServing(models=...)`` renders), both served by the
tiny checkpoint under two ids, each model with its own phase applications and failover behind the
one ingress. The first model is deployed alone, then the second added as the serve rollout adds it
(one step): the first model's applications keep their replicas. Then the second model's decode
replica is killed: its failover serves it whole on its
own prefill while the first model's pair serves on, disaggregated, and Serve replaces that one
replica. Then a change to the second model's decode engine, rolled as the serve rollout Job rolls
it: only that application's replica is new, and both models answer before and after.

    .venv/bin/python -m rehearsal.two_models render .rehearsal/two-models.json      # the RayService, from typed props
    .venv-rehearse/bin/python -m rehearsal.two_models run .rehearsal/two-models.json  # about 12 minutes

``render`` needs the package's CDK side (``.venv``); ``run`` needs Ray and vLLM (``.venv-rehearse``).
The report (``--report``, default ``.rehearsal/two-models.report.json``) holds each model's answers,
the applications each step restarted, and the verdict; exit 0 only when it passed."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import profile, tiny_checkpoint
from .harness import LOCAL_ENV, free_port, local_ray, log

SECOND = "small"
SECOND_ID = "tiny-b"
# The second model's decode setting the rehearsal changes (its engine's args: Serve restarts it).
CHANGED_SEQS = 3


def render(out: Path) -> None:
    """The default settings' RayService with a second model (``SECOND``), 4 GPU nodes so both fit."""
    import cdk8s

    from eks_pd_serving import k8s, mapping
    from eks_pd_serving.config import DeploymentConfig
    from eks_pd_serving.k8s import RayServiceChart

    config = DeploymentConfig.create(gpu_node_count=4)
    props = mapping.ray_service_props(config, "rayproject/ray-llm:2.58.0-py312-cu128")
    (first,) = props.models
    weights = k8s.Weights("Qwen/Qwen3-0.6B", "main")
    second = replace(first, name=SECOND, model=replace(first.model, model_id=SECOND_ID, weights=weights))
    props = replace(props, models=(first, second))
    documents = cdk8s.Testing.synth(RayServiceChart(cdk8s.App(), "RayService", props=props))
    (service,) = [d for d in documents if d["kind"] == "RayService"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(service, indent=1))
    log(f"wrote {out}: models {[m.model.model_id for m in props.models]}")


def replica_ids() -> dict[str, set[str]]:
    """Each Serve application's running replica ids (Serve's own details)."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    return {
        name: {r["replica_id"] for d in app["deployments"].values() for r in d["replicas"] if r["state"] == "RUNNING"}
        for name, app in details["applications"].items()
    }


def answers(base_url: str, model_ids: list[str]) -> dict[str, Any]:
    from eks_pd_serving.endpoint_check import EndpointFailed, check_endpoint

    found: dict[str, Any] = {}
    for model_id in model_ids:
        try:
            report = check_endpoint(base_url, model_id)
            found[model_id] = {"ok": True, "text": report.text, "ttft_s": round(report.ttft_s, 3)}
        except (EndpointFailed, OSError) as error:
            found[model_id] = {"ok": False, "error": str(error)[:300]}
    return found


def decode_killed(
    run_id: str, base_url: str, metrics_url: str, model_ids: list[str], timeout_s: float
) -> dict[str, Any]:
    """The second model's decode replica killed (SIGKILL, as a crash): what served each model while
    it was gone (the failover's path counters over a request to one model at a time), and the
    replicas Serve replaced."""
    from eks_pd_serving.k8s.serve_config import deployment_name
    from eks_pd_serving.phase import Phase

    from .faults.fault import kill
    from .probes import paths_served

    first_id = next(m for m in model_ids if m != SECOND_ID)
    before = replica_ids()
    title = f"ServeReplica:{SECOND}-decode:{deployment_name(Phase.DECODE, SECOND_ID)}"
    found: dict[str, Any] = {"killed": kill(run_id, title)}
    time.sleep(3.0)  # past failover_wait_s (2 s): the failover has counted the replica out
    counted = paths_served(metrics_url)
    found["second_during"] = answers(base_url, [SECOND_ID])[SECOND_ID]
    after_second = paths_served(metrics_url)
    found["first_during"] = answers(base_url, [first_id])[first_id]
    after_first = paths_served(metrics_url)
    found["second_by_path"] = {p: v - counted.get(p, 0.0) for p, v in after_second.items() if v - counted.get(p, 0.0)}
    found["first_by_path"] = {
        p: v - after_second.get(p, 0.0) for p, v in after_first.items() if v - after_second.get(p, 0.0)
    }
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = replica_ids()
        if now.get(f"{SECOND}-decode") and not now[f"{SECOND}-decode"] & before.get(f"{SECOND}-decode", set()):
            break
        time.sleep(2.0)
    found["replaced_s"] = round(time.monotonic() - deadline + timeout_s, 1)
    after = replica_ids()
    found["restarted"] = sorted(name for name in before if before[name] != after.get(name))
    found["answers_after"] = answers(base_url, model_ids)
    found["passed"] = bool(
        found["killed"]
        and found["second_during"]["ok"]
        and found["second_by_path"].get("prefill_whole", 0) >= 1
        and found["first_during"]["ok"]
        and found["first_by_path"].get("disaggregated", 0) >= 1
        and found["restarted"] == [f"{SECOND}-decode"]
        and all(a["ok"] for a in found["answers_after"].values())
    )
    return found


def first_alone(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` before the second model was added: its applications gone, the ingress's list of
    models without it."""
    alone = copy.deepcopy(config)
    alone["applications"] = [a for a in alone["applications"] if not a["name"].startswith(f"{SECOND}-")]
    for app in alone["applications"]:
        models = (app.get("args") or {}).get("models")
        if isinstance(models, list):
            app["args"]["models"] = [m for m in models if m.get("model_id") != SECOND_ID]
    return alone


def decode_changed(config: dict[str, Any], name: str) -> dict[str, Any]:
    """``config`` with ``name``'s decode engine's ``max_num_seqs`` changed (its application's args)."""
    changed = copy.deepcopy(config)
    (app,) = [a for a in changed["applications"] if a["name"] == f"{name}-decode"]
    app["args"]["llm_config"]["engine_kwargs"]["max_num_seqs"] = CHANGED_SEQS
    return changed


def run(ray_service_file: Path, checkpoint: Path, report_file: Path, timeout_s: float) -> int:
    from .faults.update import deploy_config, deploy_steps

    ray_service = json.loads(ray_service_file.read_text())
    deployed = profile.serve_config(ray_service)
    rehearsed = profile.local_profile(deployed, tiny_checkpoint.build(checkpoint.resolve()))
    (ingress,) = [a for a in rehearsed["applications"] if a["route_prefix"] == "/"]
    model_ids = [entry["model_id"] for entry in ingress["args"]["models"]]
    env = {**profile.worker_env(ray_service), **LOCAL_ENV}
    http_port, metrics_port = free_port(), free_port()
    base_url = f"http://127.0.0.1:{http_port}"
    report: dict[str, Any] = {"models": model_ids, "applications": [a["name"] for a in rehearsed["applications"]]}
    started = time.monotonic()
    # Four engines (a replica and a bundle each) and the ingress's two replicas: more than the
    # one-model rehearsals' 8 logical CPUs.
    with local_ray(env, metrics_port, profile.custom_resources(rehearsed), num_cpus=12) as run_id:
        alone = first_alone(rehearsed)
        log(f"== deploying the first model alone: {[a['name'] for a in alone['applications']]}")
        report["first_ready_s"] = round(deploy_config(alone, http_port, timeout_s), 1)
        first_replicas = replica_ids()
        log(f"== adding {SECOND}: steps {len(layout_steps(alone, rehearsed))}")
        report["add_s"] = round(deploy_steps(alone, rehearsed, http_port, timeout_s), 1)
        added = replica_ids()
        report["added_restarted"] = sorted(n for n in first_replicas if first_replicas[n] != added.get(n))
        report["answers_before"] = answers(base_url, model_ids)
        log(f"== both models: {report['answers_before']}")
        log(f"== {SECOND}'s decode replica killed")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        report["decode_killed"] = decode_killed(run_id, base_url, metrics_url, model_ids, timeout_s)
        log(f"== after the kill: {report['decode_killed']}")
        before = replica_ids()
        target = decode_changed(rehearsed, SECOND)
        report["steps"] = [
            [a["name"] for a in step["applications"] if a not in rehearsed["applications"]]
            for step in layout_steps(rehearsed, target)
        ]
        log(f"== {SECOND}'s decode max_num_seqs -> {CHANGED_SEQS}: steps {report['steps']}")
        report["update_s"] = round(deploy_steps(rehearsed, target, http_port, timeout_s), 1)
        after = replica_ids()
        report["restarted"] = sorted(name for name in before if before[name] != after.get(name))
        report["answers_after"] = answers(base_url, model_ids)
    report["total_s"] = round(time.monotonic() - started, 1)
    answered = all(a["ok"] for side in ("answers_before", "answers_after") for a in report[side].values())
    report["passed"] = (
        answered
        and report["restarted"] == [f"{SECOND}-decode"]
        and report["decode_killed"]["passed"]
        # Adding a model left the first model's engines running (the ingress may roll its replicas).
        and not set(report["added_restarted"]) & {"pd-prefill", "pd-decode"}
    )
    report_file.write_text(json.dumps(report, indent=2))
    verdict = "PASS" if report["passed"] else "FAIL"
    log(f"{verdict}: two models, restarted {report['restarted']}; report in {report_file}")
    return 0 if report["passed"] else 1


def layout_steps(current: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    from eks_pd_serving import rollout

    steps: list[dict[str, Any]] = rollout.rollout_steps(current, target)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("render", "run"))
    parser.add_argument("ray_service", type=Path)
    parser.add_argument("--checkpoint", type=Path, default=Path(".rehearsal/tiny-checkpoint"))
    parser.add_argument("--report", type=Path)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.command == "render":
        render(args.ray_service)
        return 0
    report = args.report or args.ray_service.with_suffix(".report.json")
    return run(args.ray_service, args.checkpoint, report, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
