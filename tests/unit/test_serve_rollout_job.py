"""The serve rollout (rollout/eks_pd_rollout.py in ``serve`` mode) against a Kubernetes API that
keeps a RayService as KubeRay 1.7 and Serve 2.58 would: a patch of ``spec.serveConfigV2`` raises
``metadata.generation``; KubeRay sees it (``status.observedGeneration``) a poll later and submits
the config; Serve restarts each application whose entry changed (DEPLOYING for a few polls, its
deployments UPDATING) and leaves the others RUNNING. The program runs as the pod runs it (a
subprocess), over HTTP; what KubeRay and Serve do is this emulation's, not run."""

from __future__ import annotations

import copy
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support import FakeApiHandler, fake_api, ray_service, run_rollout_program

from eks_pd_serving import rollout
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.phase import Phase

NS, NAME, JOB = "inference", "ray-llm", "ray-llm-serve-rollout-abc-def"
DIGEST = rollout.digest_annotation()  # the cluster config's, under recreate
CODE = {"eks-pd-serving/failover-code": "d1", DIGEST: "c1"}


def dump(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


class Service:
    """The RayService and what KubeRay and Serve do with its serve config. ``restart_polls``: how
    many reads an application that changed stays DEPLOYING (None: it never comes back)."""

    def __init__(
        self,
        config: dict[str, Any],
        restart_polls: int | None = 2,
        code: str = "d1",
        cluster: str = "c1",
        scaling: frozenset[str] = frozenset(),
    ) -> None:
        self.text, self.generation, self.observed = dump(config), 1, 1
        self.running = {app["name"]: app for app in config["applications"]}
        self.deploying: dict[str, int] = {}
        self.restart_polls, self.code, self.cluster = restart_polls, code, cluster
        #: Applications whose deployments are in a scale event once running (Serve: RUNNING, UPSCALING).
        self.scaling = scaling
        self.patches: list[str] = []
        #: Each read's set of applications Serve was restarting at once.
        self.together: list[set[str]] = []
        self.lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        if self.observed < self.generation:  # KubeRay's reconcile: submit the spec's config
            self.observed = self.generation
            for app in yaml.safe_load(self.text)["applications"]:
                if self.running.get(app["name"]) != app:
                    self.deploying[app["name"]] = self.restart_polls if self.restart_polls is not None else 10**9
                self.running[app["name"]] = app
        elif self.deploying:
            self.deploying = {a: n - 1 for a, n in self.deploying.items() if n > 1}
        self.together.append(set(self.deploying))
        statuses = {
            name: {
                "status": "DEPLOYING" if name in self.deploying else "RUNNING",
                "serveDeploymentStatuses": {
                    d["name"]: {
                        "status": "UPDATING"
                        if name in self.deploying
                        else "UPSCALING"
                        if name in self.scaling
                        else "HEALTHY"
                    }
                    for d in app.get("deployments") or []
                },
            }
            for name, app in self.running.items()
        }
        annotations = {"eks-pd-serving/failover-code": self.code}
        return {
            "metadata": {"name": NAME, "generation": self.generation, "annotations": {DIGEST: self.cluster}},
            "spec": {
                "serveConfigV2": self.text,
                "rayClusterConfig": {"headGroupSpec": {"template": {"metadata": {"annotations": annotations}}}},
            },
            "status": {"observedGeneration": self.observed, "activeServiceStatus": {"applicationStatuses": statuses}},
        }


@pytest.fixture
def api() -> Iterator[tuple[str, list[Service | None]]]:
    state: list[Service | None] = []

    class Handler(FakeApiHandler):
        def handle_request(self, method: str, body: Any) -> None:
            (service,) = state
            path = f"/apis/ray.io/v1/namespaces/{NS}/rayservices/{NAME}"
            if self.path.startswith(f"/apis/batch/v1/namespaces/{NS}/jobs/"):
                return self.answer({})
            if service is None or self.path != path:
                return self.answer({"message": "not found"}, 404)
            with service.lock:
                if method == "PATCH":
                    assert self.headers["Content-Type"] == "application/merge-patch+json" and body is not None
                    service.text = body["spec"]["serveConfigV2"]
                    service.generation += 1
                    service.patches.append(service.text)
                return self.answer(service.read())

    with fake_api(Handler) as base:
        yield base, state


def run(base: str, target: dict[str, Any], step_s: float = 10) -> subprocess.CompletedProcess[str]:
    """The program in serve mode as the Job runs it, with a test's API, no settle wait, fast polls."""
    return run_rollout_program(
        base,
        "roll_serve",
        f"api, {NS!r}, {NAME!r}, {dump(target)!r}, {step_s!r}, job={JOB!r}, poll_s=0.02, settle_s=0.0, code={CODE!r}",
    )


@pytest.fixture(scope="module")
def deployed() -> dict[str, Any]:
    return dict(yaml.safe_load(ray_service()["spec"]["serveConfigV2"]))


def both_phases_changed(config: dict[str, Any]) -> dict[str, Any]:
    """The model's max_model_len 64 lower everywhere it is written, the pair key with it."""
    changed = copy.deepcopy(config)
    for app in changed["applications"]:
        for _, llm in layout.phase_llm_configs({"applications": [app]}):
            llm["engine_kwargs"]["max_model_len"] -= 64
        if "pair" in app["args"]:
            app["args"]["pair"] += "-new"
        for model in app["args"].get("models", []):
            model["max_model_len"] -= 64
    return changed


def test_a_change_of_both_phases_restarts_one_application_at_a_time_prefill_first(api: Any, deployed: Any) -> None:
    base, state = api
    state.append(service := Service(deployed))
    target = both_phases_changed(deployed)
    ran = run(base, target)
    assert ran.returncode == 0, ran.stderr
    steps = [
        line.split(": ", 2)[2] for line in ran.stdout.splitlines() if line.startswith("rollout: serve config step")
    ]
    assert steps == ["pd-prefill (generation 2)", "pd-decode (generation 3)", "pd-openai (generation 4)"]
    assert all(len(restarting) <= 1 for restarting in service.together), service.together
    assert service.text == dump(target)  # the last step is the template's own text
    # Each step waited for its application: decode was patched only once prefill served again.
    assert yaml.safe_load(service.patches[1])["applications"][0] == target["applications"][0]


def test_a_change_of_one_phase_is_one_step_and_no_change_none(api: Any, deployed: Any) -> None:
    base, state = api
    state.append(service := Service(deployed))
    target = copy.deepcopy(deployed)
    layout.llm_config(target, Phase.DECODE)["engine_kwargs"]["max_num_seqs"] = 7
    ran = run(base, target)
    assert ran.returncode == 0 and len(service.patches) == 1 and "1/1: pd-decode" in ran.stdout
    state[:] = [service := Service(deployed)]
    ran = run(base, deployed)
    assert ran.returncode == 0 and not service.patches and "rollout: serve config unchanged" in ran.stdout


def test_a_step_that_does_not_serve_fails_the_job_naming_it(api: Any, deployed: Any) -> None:
    base, state = api
    state.append(Service(deployed, restart_polls=None))
    ran = run(base, both_phases_changed(deployed), step_s=1)
    assert ran.returncode == 1
    assert (
        "rollout failed: step 1/3 (pd-prefill) of ray-llm did not serve within 1 s: pd-prefill DEPLOYING" in ran.stderr
    )


def test_a_step_accepts_a_scale_event_in_progress(api: Any, deployed: Any) -> None:
    """Serve counts a deployment that is UPSCALING or DOWNSCALING as running: a decode scaling up while
    it restarts (autoscaling on) is serving, not a failed step."""
    base, state = api
    state.append(Service(deployed, scaling=frozenset({"pd-decode"})))
    ran = run(base, both_phases_changed(deployed), step_s=2)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert len(state[0].patches) == 3


def test_nothing_is_rolled_before_the_first_deploy_or_with_new_pod_code(api: Any, deployed: Any) -> None:
    base, state = api
    state.append(None)
    ran = run(base, deployed)
    assert ran.returncode == 0 and "rollout: no RayService yet" in ran.stdout
    state[:] = [service := Service(deployed, code="d0")]
    ran = run(base, both_phases_changed(deployed))
    assert ran.returncode == 0 and not service.patches
    assert (
        "rollout: the pods' code or the cluster changes with this deploy (eks-pd-serving/failover-code)" in ran.stdout
    )
    # Under recreate, a new cluster config: the rollout Job rebuilds the cluster with the new config.
    state[:] = [service := Service(deployed, cluster="c0")]
    ran = run(base, both_phases_changed(deployed))
    assert ran.returncode == 0 and not service.patches and f"({DIGEST})" in ran.stdout


@pytest.mark.parametrize("change", ["both", "decode", "layout", "none"])
def test_the_package_plans_with_the_jobs_own_steps(deployed: Any, change: str) -> None:
    """``rollout.rollout_steps`` (what the rehearsals run) is the Job's function, one copy."""
    target = copy.deepcopy(deployed)
    if change == "both":
        target = both_phases_changed(deployed)
    elif change == "decode":
        layout.llm_config(target, Phase.DECODE)["engine_kwargs"]["max_num_seqs"] = 7
    elif change == "layout":
        target["applications"] = target["applications"][1:]
    steps = rollout.rollout_steps(deployed, target)
    assert len(steps) == {"both": 3, "decode": 1, "layout": 1, "none": 0}[change]
    assert not steps or steps[-1] == target
    assert rollout.rollout_steps.__doc__ and "Job's own" in rollout.rollout_steps.__doc__
