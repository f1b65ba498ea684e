"""`impact` on real pairs of synthesized templates: what each setting change does to CloudFormation
and to the running service."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import NO_AWS_ENV, ROOT, synth_assembly

from eks_pd_serving import rollout
from eks_pd_serving.catalog import MODELS
from eks_pd_serving.lifecycle.changes import Change, Impact, compare, create_only_paths
from eks_pd_serving.lifecycle.graph import StackModel
from eks_pd_serving.sizing import IMAGE_DISK_GIB, checkpoint_bytes

SETTINGS: dict[str, dict[str, Any]] = {
    "base": {},
    "g6e": {"gpu_instance_type": "g6e.8xlarge"},
    "volume": {"gpu_root_volume_gib": 300},
    "context": {"max_model_len": 2048},
    "no_failover": {"pd_failover": False},
    "four_nodes": {"gpu_node_count": 4},
    "second_model": {"gpu_node_count": 4, "served_models": "qwen3-8b=Qwen/Qwen3-8B@main"},
    "scaled": {"autoscaling": True},
    "scaled_target": {"autoscaling": True, "decode_target_ongoing_requests": 6},
    "internal": {"endpoint_exposure": "internal"},
    "observability_off": {"observability": False},
    "autoscaling": {"autoscaling": True},
    "wider": {"autoscaling": True, "gpu_max_node_count": 5},
    "gcs_ft_off": {"gcs_fault_tolerance": False},
    "api_keys": {"api_keys": True},
    # ray_upgrade_strategy=manual: KubeRay's None without the rollout Job (the former default).
    "manual": {"ray_upgrade_strategy": "manual"},
    "manual_g6e": {"ray_upgrade_strategy": "manual", "gpu_instance_type": "g6e.8xlarge"},
    "manual_api_keys": {"ray_upgrade_strategy": "manual", "api_keys": True},
    "manual_gcs_ft_off": {"ray_upgrade_strategy": "manual", "gcs_fault_tolerance": False},
    "new_cluster": {"ray_upgrade_strategy": "NewCluster", "system_node_count": 2},
    "new_cluster_guard_off": {"ray_upgrade_strategy": "NewCluster", "system_node_count": 2, "kv_pull_guard": "off"},
    "pinned_az": {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a"},
    "odcr": {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a",
             "gpu_capacity": "odcr:cr-0123456789abcdef0"},
    "block": {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a",
              "gpu_capacity": "capacity-block:cr-0123456789abcdef0"},
    "odcr_volume": {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a",
                    "gpu_capacity": "odcr:cr-0123456789abcdef0", "gpu_root_volume_gib": 300},
    "block_volume": {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a",
                     "gpu_capacity": "capacity-block:cr-0123456789abcdef0", "gpu_root_volume_gib": 300},
}  # fmt: skip
REBUILDS = "RayCluster config changed under recreate: the deploy rebuilds the Ray cluster"
MANUAL = "not applied until the cluster is recreated"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: synth_assembly(tmp_path_factory.mktemp(name), nag=False, **s) for name, s in SETTINGS.items()}


def impact(synthesized: dict[str, Path], old: str, new: str) -> Impact:
    return compare(
        StackModel.from_json(synthesized[old].read_text()), StackModel.from_json(synthesized[new].read_text())
    )


def by_type(result: Impact, type_: str) -> list[Change]:
    return [c for c in result.changes if c.type == type_]


def test_a_gpu_instance_type_change_replaces_the_gpu_node_group(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "base", "g6e")
    (group,) = by_type(result, "AWS::EKS::Nodegroup")
    assert (group.action, group.cause) == ("replace", "create-only /InstanceTypes/0")
    assert group.effect.startswith("GPU node group replaced") and "engines reload the model" in group.effect
    assert group.resource in result.cleanup
    effects = sorted(o.effect.split(":")[0] for o in result.objects if o.object == "RayService/inference/ray-llm")
    # The workers' pod size follows the GPU type, and so does max_num_seqs (the larger GPU's KV cache):
    # each phase's application restarts, one at a time; the ingress's does not.
    assert effects == ["RayCluster config changed under recreate", *["serve config changed"] * 2]
    serve = " ".join(o.effect for o in result.objects if o.effect.startswith("serve config changed"))
    assert "application pd-prefill restarts" in serve and "application pd-decode restarts" in serve
    assert "pd-openai" not in serve
    ray = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    assert REBUILDS in ray and "every request fails from the deletion until the new engines serve" in ray
    # The deploy's bound on it: the rollout Job's deadline, derived from the model and the image.
    assert "the deploy waits until it serves (at most 12 minutes, the rollout Job's deadline" in ray
    assert "the rollback rebuilds the cluster back" in ray
    # The rollout Job for the new digest is created and the old one pruned (so a rollback re-creates
    # and runs it), and the deploy's wait follows the new one.
    job = [o for o in result.objects if o.object.startswith("Job/inference/ray-llm-rollout-")]
    assert sorted(o.action for o in job) == ["create", "prune"]
    waits = by_type(result, "Custom::AWSCDK-EKS-KubernetesObjectValue")  # its start, its success
    assert [w.action for w in waits if "ServeRollout" not in w.resource] == ["modify", "modify"]


def test_under_manual_a_cluster_config_change_waits_for_a_recreate_by_hand(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "manual", "manual_g6e")
    ray = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    assert "under upgradeStrategy None (manual)" in ray and MANUAL in ray
    # No cluster rollout waits: only the serve rollout's, for the phases' new max_num_seqs.
    waits = by_type(result, "Custom::AWSCDK-EKS-KubernetesObjectValue")
    assert waits and all("ServeRollout" in w.resource for w in waits)


def test_a_root_volume_change_rolls_the_gpu_nodes_through_the_launch_template(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "base", "volume")
    (template,) = by_type(result, "AWS::EC2::LaunchTemplate")
    (group,) = by_type(result, "AWS::EKS::Nodegroup")
    assert template.action == "modify" and "VolumeSize" in template.cause
    # The node group's template text is unchanged; the launch template's new version carries it.
    assert group.action == "modify" and group.cause == f"/LaunchTemplate/Version follows {template.resource} (modify)"
    assert "launches a new node first (surge)" in group.effect and "Ray workers on it restart" in group.effect
    # How long, from the budget (rollout.node_replacement_s: the node, the image, the 9B's 17.7 GiB
    # from S3 at the budgeted 200 MiB/s, a first engine start), for the group's two nodes.
    each = rollout.node_replacement_s(checkpoint_bytes(MODELS["Qwen/Qwen3.5-9B"]), IMAGE_DISK_GIB)
    assert f"about {each // 60} min a node until its engine serves" in group.effect
    assert "2 node(s) one after another" in group.effect
    assert result.cleanup == ()


def test_max_model_len_restarts_each_application_alone_one_at_a_time(synthesized: dict[str, Path]) -> None:
    """A model setting is in every application's args: the serve rollout's new Job restarts them one
    at a time (prefill, decode, the ingress) before the RayService's manifest; no request fails."""
    result = impact(synthesized, "base", "context")
    manifests = [c.resource for c in by_type(result, "Custom::AWSCDK-EKS-KubernetesResource")]
    assert sorted(m.removeprefix("PdServingCluster") for m in manifests) == [
        "RayServiceChart91B4A846",
        "RayServiceServeRolloutF46E52EA",
    ]
    waits = by_type(result, "Custom::AWSCDK-EKS-KubernetesObjectValue")
    assert waits and all("ServeRollout" in w.resource for w in waits)  # the new Job's start, windows, success
    ray = [o.effect for o in result.objects if o.object == "RayService/inference/ray-llm"]
    assert [e.split(" restarts")[0] for e in ray] == [
        f"serve config changed: application {app}" for app in ("pd-prefill", "pd-decode", "pd-openai")
    ]
    assert all("one application at a time" in e and "no request fails" in e for e in ray)
    job = [o for o in result.objects if o.object.startswith("Job/inference/ray-llm-serve-rollout-")]
    assert sorted(o.action for o in job) == ["create", "prune"]


def test_a_layout_change_says_it_is_the_outage(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "base", "no_failover")
    ray = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    assert "the Serve layout changes (pd-decode removed, pd-prefill removed, pd-openai built by another" in ray
    assert "requests fail until the new engines serve" in ray


def test_a_model_added_starts_its_applications_and_leaves_the_first_models_running(
    synthesized: dict[str, Path],
) -> None:
    result = impact(synthesized, "four_nodes", "second_model")
    ray = [o.effect for o in result.objects if o.object == "RayService/inference/ray-llm"]
    assert ray[0].startswith("serve config changed: applications added (qwen3-8b-decode, qwen3-8b-prefill)")
    assert "the applications already serving keep serving" in ray[0]
    assert ray[1].startswith("serve config changed: application pd-openai restarts (args changed) in the same step")
    assert not any("every application restarts" in e or "pd-prefill" in e or "pd-decode" in e for e in ray)
    staging = [c for c in by_type(result, "Custom::ModelWeights")]
    assert [(c.action, c.resource) for c in staging] == [("add", "PdServingModelWeightsResourceqwen38b86D5771C")]
    removed = impact(synthesized, "second_model", "four_nodes")
    gone = [o.effect for o in removed.objects if o.object == "RayService/inference/ray-llm"]
    assert gone[0].startswith("serve config changed: applications removed (qwen3-8b-decode, qwen3-8b-prefill)")


def test_an_autoscaling_target_restarts_nothing(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "scaled", "scaled_target")
    ray = [o.effect for o in result.objects if o.object == "RayService/inference/ray-llm"]
    assert ray == [
        "serve config changed: deployment Decode:qwen3_5-9b of pd-decode: applied in place (replicas, autoscaling, "
        "the failover's settings, timing), no restart, no request fails"
    ]


def test_internal_exposure_on_adds_the_controller_and_the_nlb_service(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "base", "internal")
    assert {c.action for c in result.changes} == {"add", "modify"}
    assert "helm install aws-load-balancer-controller" in [c.effect for c in result.changes]
    objects: dict[str, str] = {}
    for o in result.objects:
        objects[o.object] = f"{objects.get(o.object, '')} {o.effect}"
    assert "no pod restarts" in objects.pop("NetworkPolicy/inference/ray-serve-from-clients")
    # API keys come on with the NLB: a pod change, which the deploy's rebuild of the cluster
    # brings. Their code's ConfigMap is applied either way.
    assert "ConfigMap/inference/ray-llm-api-keys-code" not in objects
    service = objects.pop("RayService/inference/ray-llm")
    assert REBUILDS in service and "API key check turns on with the rebuilt cluster, inside the deploy" in service
    # The new rollout Job, and its Role, which names it (the Job may mark only itself).
    assert {o.split("/")[0] for o in objects} == {"Job", "Role"}


def test_api_keys_off_says_what_a_restarting_pod_meets_and_keeps_the_code(synthesized: dict[str, Path]) -> None:
    """G3: the running cluster keeps mounting the check's code (applied either way); its key secret
    goes, so the line says a restarting Ray pod answers 503 until the cluster is rebuilt."""
    result = impact(synthesized, "manual_api_keys", "manual")
    assert not [o for o in result.objects if o.object.startswith("ConfigMap/")]
    (keys,) = [o.effect for o in result.objects if "API key check turns off" in o.effect]
    assert "a Ray pod that restarts meanwhile answers 503" in keys and "recreate the RayCluster" in keys
    (secret,) = [c for c in by_type(result, "AWS::SecretsManager::Secret") if c.action == "delete"]
    assert "unreadable at once" in secret.effect and "serving unaffected" not in secret.effect


def test_internal_exposure_off_deletes_the_service_before_the_controller(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "internal", "base")
    (service,) = [c for c in result.changes if c.action == "delete" and "NLB" in c.effect]
    (controller,) = [c for c in result.changes if c.effect.startswith("helm uninstall aws-load-balancer-controller")]
    # The cleanup phase follows the old template: the Service (the controller removes the NLB
    # behind its finalizer) goes before the controller.
    assert result.cleanup.index(service.resource) < result.cleanup.index(controller.resource)


def test_observability_off_removes_the_addon_its_logs_and_the_metrics_policy(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "base", "observability_off")
    assert {c.action for c in result.changes} == {"delete"}
    (addon,) = by_type(result, "AWS::EKS::Addon")
    assert addon.effect.startswith("CloudWatch add-on removed")
    assert len([c for c in by_type(result, "AWS::Logs::LogGroup") if "with its events" in c.effect]) == 5
    (policy,) = [c for c in result.changes if c.effect == "kubectl delete of NetworkPolicy"]
    assert policy.resource.startswith("PdServingClusterServingNetworkMetricsChart")
    assert result.objects == ()  # nothing left behind inside a manifest that stays


def test_autoscaling_bounds_change_the_group_size_and_the_worker_group(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "autoscaling", "wider")
    (group,) = by_type(result, "AWS::EKS::Nodegroup")
    assert group.action == "modify" and group.cause.startswith("/ScalingConfig/MaxSize")
    assert "aws/containers-roadmap#1259" in group.effect
    (check,) = by_type(result, "Custom::GpuCapacityCheck")
    assert "capacity check runs again" in check.effect
    # KubeRay pushes no bound change itself (its hash leaves them out): the rollout Job sets them.
    (ray,) = [o for o in result.objects if o.object == "RayService/inference/ray-llm"]
    assert "worker replicas or bounds only): the rollout Job sets them in place, no restart" in ray.effect


def test_replacement_comes_from_the_schemas_cfn_lint_ships() -> None:
    assert "/InstanceTypes" in create_only_paths("AWS::EKS::Nodegroup")
    assert "/LogGroupName" in create_only_paths("AWS::Logs::LogGroup")
    assert create_only_paths("Custom::AWSCDK-EKS-HelmChart") == ()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**NO_AWS_ENV, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "eks_pd_serving", "impact", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_the_command_prints_a_deterministic_table_and_exits_1_on_a_change(synthesized: dict[str, Path]) -> None:
    first = run_cli(str(synthesized["base"].parent), str(synthesized["g6e"].parent))
    second = run_cli(str(synthesized["base"].parent), str(synthesized["g6e"].parent))
    assert first.returncode == 1 and first.stdout == second.stdout
    assert "REPLACE" in first.stdout and "GPU node group replaced" in first.stdout
    assert first.stdout.rstrip().endswith("10 change(s)")


def test_the_command_exits_0_without_a_change_and_2_on_a_missing_folder(
    synthesized: dict[str, Path], tmp_path: Path
) -> None:
    same = run_cli(str(synthesized["base"]), str(synthesized["base"]))
    assert (same.returncode, same.stdout.splitlines()[-1]) == (0, "no change")
    missing = run_cli(str(tmp_path / "nowhere"), str(synthesized["base"]))
    assert missing.returncode == 2 and "not found. Fix: synthesize it first" in missing.stdout
    assert "Traceback" not in missing.stderr


def test_gcs_fault_tolerance_on_creates_the_store_and_says_when_the_head_uses_it(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "gcs_ft_off", "base")
    assert [c.action for c in by_type(result, "AWS::ElastiCache::ReplicationGroup")] == ["add"]
    service = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    assert REBUILDS in service and "GCS fault tolerance turns on with the rebuilt cluster, inside the deploy" in service
    manual = impact(synthesized, "manual_gcs_ft_off", "manual")
    service = " ".join(o.effect for o in manual.objects if o.object == "RayService/inference/ray-llm")
    assert MANUAL in service and "GCS fault tolerance turns on only in a RayCluster built from the new spec" in service


def test_gcs_fault_tolerance_off_warns_that_the_running_head_loses_its_store(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "manual", "manual_gcs_ft_off")
    assert [c.action for c in by_type(result, "AWS::ElastiCache::ReplicationGroup")] == ["delete"]
    service = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    assert "deletes the store while the running RayCluster still uses it" in service
    # Under recreate the deploy rebuilds the cluster without it before the cleanup phase deletes it.
    rebuilt = impact(synthesized, "base", "gcs_ft_off")
    service = " ".join(o.effect for o in rebuilt.objects if o.object == "RayService/inference/ray-llm")
    assert "after the deploy has rebuilt the cluster without it" in service


def test_under_new_cluster_the_second_clusters_gpu_nodes_are_counted_and_priced(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "new_cluster", "new_cluster_guard_off")
    ray = " ".join(o.effect for o in result.objects if o.object == "RayService/inference/ray-llm")
    # The walkthrough's two g6.8xlarge workers again beside the first cluster, at the catalogue's price.
    assert "a second Ray cluster is built beside the first" in ray and "2 more GPU node(s)" in ray
    assert "2 x g6.8xlarge at $2.014/h: $4.03 an hour on demand in us-east-1 while both run" in ray


def test_moving_the_gpu_group_onto_an_odcr_rolls_its_nodes_into_the_reservation(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "pinned_az", "odcr")
    (group,) = by_type(result, "AWS::EKS::Nodegroup")
    assert group.action == "modify" and "(UpdateStrategy MINIMAL)" in group.effect
    (template,) = by_type(result, "AWS::EC2::LaunchTemplate")
    assert "CapacityReservationSpecification" in template.cause and "Placement" in template.cause
    (placement,) = by_type(result, "AWS::EC2::PlacementGroup")
    assert placement.action == "delete"
    (check,) = by_type(result, "Custom::GpuCapacityCheck")
    assert "each reservation" in check.effect


def test_moving_the_gpu_group_onto_a_capacity_block_replaces_it_and_adds_its_end(synthesized: dict[str, Path]) -> None:
    result = impact(synthesized, "odcr", "block")
    (group,) = by_type(result, "AWS::EKS::Nodegroup")
    assert (group.action, group.cause.split(";")[0]) == ("replace", "create-only /CapacityType")
    schedules = by_type(result, "AWS::Scheduler::Schedule")
    assert len(schedules) == 2 and all(
        s.action == "add" and "an hour before the block ends" in s.effect for s in schedules
    )
    back = by_type(impact(synthesized, "block", "odcr"), "AWS::Scheduler::Schedule")
    assert [s.effect.split(":")[0] for s in back] == ["Capacity Block schedule removed"] * 2


def test_a_reserved_group_rolls_without_a_surge_node_and_impact_says_so(synthesized: dict[str, Path]) -> None:
    """EKS's default update launches a new node before it terminates an old one; a full ODCR or
    Capacity Block refuses it. Reserved groups roll with UpdateStrategy MINIMAL (terminate first),
    and impact says what that costs; an on-demand group keeps the surge."""
    for reserved in ("odcr", "block"):
        (group,) = by_type(impact(synthesized, reserved, f"{reserved}_volume"), "AWS::EKS::Nodegroup")
        assert group.action == "modify"
        assert "terminates up to 1 old node(s) before launching each replacement (UpdateStrategy MINIMAL)" in (
            group.effect
        )
    (block,) = by_type(impact(synthesized, "block", "block_volume"), "AWS::EKS::Nodegroup")
    assert "EKS's Capacity Block guide also advises desired size 0" in block.effect
    (plain,) = by_type(impact(synthesized, "base", "volume"), "AWS::EKS::Nodegroup")
    assert "launches a new node first (surge)" in plain.effect and "Capacity Block" not in plain.effect
