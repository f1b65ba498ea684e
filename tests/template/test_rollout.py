"""``ray_upgrade_strategy=recreate`` (the default): the rollout Job, its rights, the deploy's wait
for it, and the config digest that decides when it rebuilds the Ray cluster. The Job's program is
tested against an emulated API in tests/unit/test_rollout_job.py; KubeRay acting on a deleted
cluster, and CloudFormation waiting on the Job, are on paper (read in KubeRay 1.7's controller and
aws-cdk-lib's kubectl handler)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import build_stack, resources_of_type

from eks_pd_serving import mapping, rollout
from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.config import DeploymentConfig

ANNOTATION = rollout.digest_annotation()


@cache
def synthesized(**settings: Any) -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(**settings)).to_json())


def objects(template: dict[str, Any], kind: str, serve: bool = False) -> list[dict[str, Any]]:
    """The template's Kubernetes objects of ``kind``: the cluster rollout's, or (``serve``) the
    serve rollout's (named ``<service>-serve-rollout...``), other objects either way."""
    found = [o for o in kubernetes_objects(template) if o["kind"] == kind]
    return [o for o in found if ("serve-rollout" in o["metadata"]["name"]) == serve]


def digest(template: dict[str, Any]) -> str | None:
    (service,) = objects(template, "RayService")
    return (service["metadata"].get("annotations") or {}).get(ANNOTATION)


def _env(job: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def _waits(template: dict[str, Any], serve: bool = False) -> list[dict[str, Any]]:
    """The deploy's wait steps on the (cluster or ``serve``) rollout Job, in the order their
    dependencies give."""
    waits = {
        k: w
        for k, w in resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesObjectValue").items()
        if ("ServeRollout" in k) == serve
    }
    ordered: list[str] = []
    while len(ordered) < len(waits):
        ordered += [
            k for k, w in waits.items() if k not in ordered and set(w.get("DependsOn", [])) & set(waits) <= set(ordered)
        ]
    return [waits[k]["Properties"] for k in ordered]


def test_the_default_converges_a_cluster_config_change_inside_the_deploy() -> None:
    template = synthesized()
    (service,) = objects(template, "RayService")
    assert service["spec"]["upgradeStrategy"] == {"type": "None"}  # KubeRay's; the Job rebuilds
    (job,) = objects(template, "Job")
    env = _env(job)
    names = rollout.env_names()
    assert env[names["digest"]] == (found := str(digest(template)))
    assert job["metadata"]["name"].startswith(f"ray-llm-rollout-{found[:10]}")
    deadline = mapping.rollout_deadline_s(DeploymentConfig.create())
    assert (env[names["service"]], env[names["namespace"]], env[names["deadline"]], env[names["window"]]) == (
        "ray-llm",
        "inference",
        str(deadline),
        str(rollout.WINDOW_S),
    )
    assert env[names["job"]] == {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == deadline + rollout.POD_START_S
    # The program, once for both rollout Jobs, with the namespace (applied before either, deleted after).
    programs = [
        c for c in kubernetes_objects(template) if c["kind"] == "ConfigMap" and "rollout" in c["metadata"]["name"]
    ]
    assert [(c["metadata"]["name"], c["data"]) for c in programs] == [
        ("ray-llm-rollout-program", {rollout.FILE_NAME: rollout.source()})
    ]
    (serve_job,) = objects(template, "Job", serve=True)
    for each in (job, serve_job):
        assert each["spec"]["template"]["spec"]["volumes"] == [
            {"name": "code", "configMap": {"name": "ray-llm-rollout-program"}}
        ]
    # The template holds its text once (CDK's validation time follows the template's size).
    assert "def rollout_steps(current" in rollout.source()
    assert json.dumps(template).count("def rollout_steps(current") == 1
    # The deploy waits for the Job by name: its start, then its success, each within the kubectl
    # handler's 15 minutes.
    waits = _waits(template)
    assert [(w["ObjectType"], w["ObjectName"], w["JsonPath"]) for w in waits] == [
        ("job", job["metadata"]["name"], ".metadata.annotations.eks-pd\\.io/rollout-started"),
        ("job", job["metadata"]["name"], ".status.succeeded"),
    ]
    assert all(int(w["TimeoutSeconds"]) == rollout.WAIT_S < 15 * 60 for w in waits)


def test_the_deadline_follows_the_model_and_the_image_and_the_wait_steps_cover_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Qwen3.5-9B: 12 minutes (engines 5, head 2, a 20 GiB image pull 3.4, 17.7 GiB read 1.5), one
    window. A model of 140 GiB needs about 23 minutes: two windows, so three wait steps, each
    under 15 minutes, together longer than the deadline plus the pod's start."""
    assert rollout.deadline_s(int(17.66 * 2**30), 40) == 12 * 60
    big = rollout.deadline_s(140 * 2**30, 40)
    assert big == 23 * 60 and rollout.windows(big) == 2
    paths = rollout.wait_paths(big)
    assert paths == [
        ".metadata.annotations.eks-pd\\.io/rollout-started",
        ".metadata.annotations.eks-pd\\.io/rollout-window-1",
        ".status.succeeded",
    ]
    # The first step covers the pod's start; then each window gets a full step, the last with room.
    assert rollout.WAIT_S >= rollout.POD_START_S and rollout.WINDOW_S < rollout.WAIT_S
    assert rollout.windows(big) * rollout.WAIT_S >= big
    # A catalogue model that big needs GPUs this template's tests do not size: the deadline is given.
    monkeypatch.setattr(mapping, "rollout_deadline_s", lambda config: big)
    template = dict(Template.from_stack(build_stack()).to_json())
    (job,) = objects(template, "Job")
    assert int(_env(job)[rollout.env_names()["deadline"]]) == big
    assert [w["JsonPath"] for w in _waits(template)] == paths


def test_the_jobs_rights_are_its_rayservice_its_rayclusters_and_its_own_marks() -> None:
    template = synthesized()
    (job,) = objects(template, "Job")
    (role,) = objects(template, "Role")
    assert role["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayservices"], "resourceNames": ["ray-llm"], "verbs": ["get"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["list", "delete", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "resourceNames": [job["metadata"]["name"]], "verbs": ["patch"]},
    ]
    (binding,) = objects(template, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ray-llm-rollout", "namespace": "inference"}]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ray-llm-rollout"
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    # Beside the Ray head, whose image is already on that node.
    (term,) = pod["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": {"ray.io/node-type": "head"}}


def test_a_new_job_prunes_the_one_before_so_a_rollback_runs_the_old_job_again() -> None:
    """Pruned: applying the new Job deletes the old one (the kubectl handler's `apply --prune -l`,
    Jobs in kubectl's default prune list). A rollback re-applies the old manifest, so the old Job
    is created again and runs (rebuilding the cluster back); a finished old Job left in place would
    make the rollback's wait pass at once while the new, possibly broken, cluster serves."""
    template = synthesized()
    manifests = resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesResource")
    jobs = [r for r, m in manifests.items() if '"kind\\":\\"Job\\"' in json.dumps(m["Properties"]["Manifest"])]
    assert all("PruneLabel" in manifests[r]["Properties"] for r in jobs)  # the serve rollout's too
    (rid,) = [r for r in jobs if "ServeRollout" not in r]
    (service_rid,) = [
        r for r, m in manifests.items() if '"kind\\":\\"RayService\\"' in json.dumps(m["Properties"]["Manifest"])
    ]
    assert service_rid in manifests[rid]["DependsOn"]
    assert "PruneLabel" in manifests[service_rid]["Properties"]


def _job(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (job,) = objects(template, "Job")
    return job["metadata"]["name"], _env(job)


def test_a_change_of_worker_bounds_alone_is_a_new_job_that_sets_them() -> None:
    """KubeRay's hash leaves bounds out, and so does the config digest: the Job's name must move
    with them, or no Job runs and the new bounds never reach the RayCluster."""
    name, env = _job(synthesized(autoscaling=True))
    moved_name, moved_env = _job(synthesized(autoscaling=True, decode_max_replicas=3))
    names = rollout.env_names()
    assert moved_env[names["digest"]] == env[names["digest"]]  # no rebuild
    assert moved_name != name
    assert json.loads(moved_env[names["bounds"]]) != json.loads(env[names["bounds"]])


def test_the_jobs_name_covers_its_whole_pod_template() -> None:
    """A Job's pod template is immutable: a release that changes it under the same name meets
    "field is immutable". Any change of the spec is a new name."""
    import cdk8s

    from eks_pd_serving.k8s import PodProgram, RolloutChart, RolloutSpec

    program = PodProgram("c", rollout.FILE_NAME, rollout.source(), rollout.source_digest(), rollout.MOUNT_PATH, "a")
    spec = RolloutSpec("ray-llm", "inference", "d" * 16, program, rollout.env_names(), "image", {"role": "system"},
                       60, 30, 840, rollout.pod_job_label(), rollout.FINISHED_TTL_S)  # fmt: skip
    variants = [
        spec,
        replace(spec, node_selector={"role": "other"}),
        replace(spec, image="image:2"),
        replace(spec, deadline_s=61),
        replace(spec, bounds={"decode": {"maxReplicas": 2}}),
        replace(spec, program=replace(program, mount_path="/elsewhere")),
    ]
    names = [v.job_name for v in variants]
    assert len(set(names)) == len(variants)
    for variant in variants:
        (job,) = [o for o in RolloutChart(cdk8s.App(), "R", spec=variant).to_json() if o["kind"] == "Job"]
        assert job["metadata"]["name"] == variant.job_name


@pytest.mark.parametrize("strategy", ["manual", "None", "NewCluster"])
def test_manual_and_new_cluster_have_no_job(strategy: str) -> None:
    extra = {"system_node_count": 2} if strategy == "NewCluster" else {}
    template = synthesized(ray_upgrade_strategy=strategy, **extra)
    assert objects(template, "Job") == [] and _waits(template) == []
    # The digest only where this deploy rebuilds the cluster: KubeRay's new cluster (the serve rollout reads it).
    assert (digest(template) is not None) is (strategy == "NewCluster")
    (service,) = objects(template, "RayService")
    assert service["spec"]["upgradeStrategy"] == {"type": "NewCluster" if strategy == "NewCluster" else "None"}


def test_none_is_the_former_name_of_manual() -> None:
    assert DeploymentConfig.create(ray_upgrade_strategy="None").ray_upgrade_strategy == "manual"


def test_the_digest_moves_with_what_only_a_new_cluster_applies() -> None:
    """Serve-config changes and worker bounds (the Job sets them in place) keep the digest, so no
    rebuild; the image, the pods' env and their code change it."""
    base = digest(synthesized(autoscaling=True))
    assert digest(synthesized(autoscaling=True, prefill_target_ongoing_requests=6)) == base  # serve config
    assert digest(synthesized(autoscaling=True, decode_max_replicas=3)) == base  # a worker group's maxReplicas
    assert digest(synthesized(autoscaling=True, image="123456789012.dkr.ecr.us-east-1.amazonaws.com/ray:x")) != base
    assert digest(synthesized(autoscaling=True, kv_pull_guard="off")) != base


def test_the_digest_leaves_out_exactly_the_in_place_fields() -> None:
    group = {"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 2,
             "scaleStrategy": {"workersToDelete": ["a"]}, "template": {"spec": {}}}  # fmt: skip
    config = {"rayVersion": "2.58.0", "upgradeStrategy": {"type": "None"}, "workerGroupSpecs": [group]}
    moved = json.loads(json.dumps(config))
    group = moved["workerGroupSpecs"][0]
    group.update(replicas=2, minReplicas=0, maxReplicas=4, scaleStrategy={"workersToDelete": []})
    moved["upgradeStrategy"] = {"type": "NewCluster"}
    assert rollout.cluster_config_digest(moved) == rollout.cluster_config_digest(config)
    group["template"]["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert rollout.cluster_config_digest(moved) != rollout.cluster_config_digest(config)


# --- the serve rollout (each phase its own Serve application) ---------------------------------
def test_the_serve_rollout_job_runs_before_the_ray_service_with_rights_on_it_alone() -> None:
    """Under every strategy: a Job named for the serve config, applied (and waited on) before the
    RayService's manifest, which may read and patch that RayService and mark itself, nothing else."""
    for strategy in ("recreate", "manual"):
        template = synthesized(ray_upgrade_strategy=strategy)
        (job,) = objects(template, "Job", serve=True)
        (role,) = objects(template, "Role", serve=True)
        assert job["metadata"]["name"].startswith("ray-llm-serve-rollout-")
        assert role["rules"] == [
            {
                "apiGroups": ["ray.io"],
                "resources": ["rayservices"],
                "resourceNames": ["ray-llm"],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": ["batch"],
                "resources": ["jobs"],
                "resourceNames": [job["metadata"]["name"]],
                "verbs": ["patch"],
            },
        ]
        env = _env(job)
        names = rollout.env_names()
        assert env[names["mode"]] == "serve" and "pd-decode" in str(env[names["serve_config"]])
        assert env[names["step"]] == "420"  # Qwen3.5-9B: the engines' start and the checkpoint's read
        (service,) = objects(template, "RayService")
        assert str(env[names["serve_config"]]) == str(service["spec"]["serveConfigV2"]).replace("\n", "\n")
        waits = _waits(template, serve=True)
        assert [w["JsonPath"] for w in waits][-1] == ".status.succeeded"
        charts = resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesResource")
        ray_chart = next(k for k in charts if k.startswith("PdServingClusterRayServiceChart"))
        serve_wait = next(k for k in resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesObjectValue")
                          if k.startswith("PdServingRayServiceServeRolloutWait"))  # fmt: skip
        assert serve_wait in charts[ray_chart]["DependsOn"]


def test_without_the_failover_there_is_no_serve_rollout() -> None:
    template = synthesized(pd_failover=False)
    assert objects(template, "Job", serve=True) == [] and _waits(template, serve=True) == []


@pytest.mark.parametrize(("strategy", "told"), [("recreate", True), ("NewCluster", True), ("manual", False)])
def test_the_serve_rollout_knows_of_a_cluster_change_where_the_deploy_rebuilds_the_cluster(
    strategy: str, told: bool
) -> None:
    """Wherever this deploy rebuilds the cluster (the rollout Job, or KubeRay's new cluster), the
    RayService carries its cluster config's digest and the serve rollout Job compares it (its ``code``
    env), stepping aside when it changed: the serve config goes with the cluster, not onto the old one
    one application at a time. Under manual nothing rebuilds it, so the serve config rolls onto the
    running cluster."""
    settings: dict[str, Any] = {"ray_upgrade_strategy": strategy}
    if strategy == "NewCluster":
        settings["system_node_count"] = 2  # the second head's room
    template = synthesized(**settings)
    cluster_digest = digest(template)
    (job,) = objects(template, "Job", serve=True)
    code = json.loads(str(_env(job)[rollout.env_names()["code"]]))
    assert (ANNOTATION in code) is told and (cluster_digest is not None) is told
    if told:
        assert code[ANNOTATION] == cluster_digest and len(cluster_digest or "") == 16
