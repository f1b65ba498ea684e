"""Autoscaling per phase: Serve replicas, Ray worker pods and GPU nodes between the
bounds the settings give, the Cluster Autoscaler that moves the nodes, and every rule across them."""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import DENSE, NO_AWS_ENV, ROOT, build_stack, ray_service, resources_of_type, serve_args, synth_assembly

from eks_pd_serving import versions
from eks_pd_serving._private.policies import published_policy
from eks_pd_serving.assembly import helm_releases, kubernetes_objects
from eks_pd_serving.cli import cost
from eks_pd_serving.cluster_autoscaler import MUTATING_ACTIONS
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.layout import SYSTEM_NODE_LABELS
from eks_pd_serving.phase import Phase

# cluster-autoscaler/cloudprovider/aws/README.md at kubernetes/autoscaler tag cluster-autoscaler-1.35.2,
# its "Full Cluster Autoscaler Features Policy" block.
POLICY_SHA256 = "d394a3f6e8f327a043fb43616f940152fee106d9e4839ede027c360331623fa6"
EFA_TAG = "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"
GPU_TAG = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"


@pytest.fixture(scope="module")
def scaled() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(autoscaling=True)).to_json())


def _nodegroups(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in resources_of_type(template, "AWS::EKS::Nodegroup").items()}


def _ray_service(template: dict[str, Any]) -> dict[str, Any]:
    (service,) = [o for o in kubernetes_objects(template) if o["kind"] == "RayService"]
    return service


# --- settings and their rules ---------------------------------------------------------------
def test_autoscaling_alone_gives_one_to_two_replicas_per_phase_and_the_nodes_they_need() -> None:
    config = DeploymentConfig.create(autoscaling=True)
    assert [config.replica_bounds(p) for p in (Phase.PREFILL, Phase.DECODE)] == [(1, 2), (1, 2)]
    (group,) = config.gpu_groups
    # One GPU per g6.8xlarge: 1 + 1 replicas at least, 2 + 2 at most.
    assert (group.node_count, group.node_bounds) == (2, (2, 4))
    assert config.target_ongoing_requests(Phase.PREFILL) == 4 and config.target_ongoing_requests(Phase.DECODE) == 8


def test_per_phase_bounds_default_to_what_each_phases_replicas_need() -> None:
    config = DeploymentConfig.from_context(
        {"autoscaling": "true", "gpu_layout": "per_phase", "prefill_min_replicas": "0", "decode_max_replicas": "3"}
    )
    assert {g.name: g.node_bounds for g in config.gpu_groups} == {"prefill": (0, 2), "decode": (1, 3)}


def test_scale_to_zero_is_allowed_and_warned() -> None:
    config = DeploymentConfig.create(autoscaling=True, gpu_layout="per_phase", prefill_min_replicas=0)
    (warning,) = [w for w in config.warnings() if "min_replicas" in w]
    assert warning.startswith("prefill_min_replicas=0: after a quiet period the first request waits for a GPU node")
    assert not [w for w in DeploymentConfig.create(autoscaling=True).warnings() if "min_replicas" in w]


def test_without_autoscaling_nothing_changes() -> None:
    config = DeploymentConfig.create()
    assert config.replica_bounds(Phase.DECODE) == (1, 1)
    assert [g.node_bounds for g in config.gpu_groups] == [None]


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"decode_max_replicas": 3},
        "decode_max_replicas=3 is only used with autoscaling=true. Fix: set autoscaling=true, or remove "
        "decode_max_replicas",
    ),
    ({"autoscaling": True, "decode_replicas": 2}, "decode_replicas=2 is a fixed count, but autoscaling=true"),
    ({"autoscaling": True, "gpu_node_count": 2}, "Fix: remove gpu_node_count and set those"),
    (
        {"autoscaling": True, "prefill_min_replicas": 3},
        "prefill_min_replicas=3 exceeds prefill_max_replicas=2 (default). Fix: set prefill_min_replicas at most",
    ),
    (
        {"autoscaling": True, "gpu_min_node_count": 3, "gpu_max_node_count": 2},
        "gpu_min_node_count=3 exceeds gpu_max_node_count=2. Fix",
    ),
    (
        {"autoscaling": True, "gpu_max_node_count": 3},
        "needs 4 GPUs at the most replicas, but gpu_max_node_count=3 x g6.8xlarge has 3. Fix: raise "
        "gpu_max_node_count to 4 or lower prefill_max_replicas and decode_max_replicas",
    ),
    (
        {"autoscaling": True, "gpu_min_node_count": 1},
        "needs 2 GPUs at the fewest replicas, but gpu_min_node_count=1 x g6.8xlarge has 1. Fix: raise "
        "gpu_min_node_count to 2",
    ),
    (
        {"autoscaling": True, "gpu_layout": "per_phase", "decode_max_replicas": 4, "decode_gpu_max_node_count": 2},
        "decode_max_replicas=4 x decode_tensor_parallel_size=1 needs 4 GPUs at the most replicas, but "
        "decode_gpu_max_node_count=2",
    ),
    (
        {"autoscaling": True, "gpu_instance_type": "g6.12xlarge", "decode_tensor_parallel_size": 4,
         "prefill_tensor_parallel_size": 4, **DENSE, "gpu_max_node_count": 3},
        "prefill_max_replicas=2 (default) x prefill_tensor_parallel_size=4 + decode_max_replicas=2 (default) x "
        "decode_tensor_parallel_size=4 needs 16 GPUs",
    ),
    ({"autoscaling": True, "prefill_gpu_max_node_count": 2}, "does not apply to gpu_layout='shared'"),
    ({"autoscaling": True, "gpu_layout": "per_phase", "gpu_max_node_count": 2}, "does not apply to gpu_layout"),
    ({"autoscaling": True, "decode_target_ongoing_requests": 0}, "decode_target_ongoing_requests=0: Input should"),
    ({"autoscaling": True, "decode_min_replicas": -1}, "decode_min_replicas=-1: Input should be greater than"),
    ({"autoscaling": True, "decode_max_replicas": 0}, "decode_max_replicas=0: Input should be greater than"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "message"), BAD, ids=[next(iter(reversed(s))) for s, _ in BAD])
def test_each_rule_fails_with_one_line_naming_the_fix(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        DeploymentConfig.create(**settings)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_command_line_rejects_a_bad_bound_with_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "eks_pd_serving", "sizing", "-c", "autoscaling=true", "-c", "decode_min_replicas=5"],
        cwd=ROOT, env=NO_AWS_ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: decode_min_replicas=5 exceeds decode_max_replicas=2 (default)")


# --- Serve and Ray ----------------------------------------------------------------------------
def test_each_phase_autoscales_between_its_bounds_with_no_fixed_count() -> None:
    args = serve_args(ray_service(autoscaling=True, decode_max_replicas=3, decode_target_ongoing_requests=6))
    for phase, high, target in (("prefill", 2, 4.0), ("decode", 3, 6.0)):
        deployment = args[f"{phase}_deployment"]
        assert "num_replicas" not in deployment  # Serve refuses both when it builds the app (deployment.py)
        assert args[f"{phase}_config"]["deployment_config"] == {}  # in the app's overrides: no restart
        assert deployment["autoscaling_config"] == {
            "min_replicas": 1,
            "max_replicas": high,
            "target_ongoing_requests": target,
            "upscale_delay_s": 30.0,
            "downscale_delay_s": 900.0,
        }
        assert deployment["graceful_shutdown_timeout_s"] == 300.0


@pytest.mark.parametrize(
    ("settings", "policy"),
    [
        ({}, "recompute"),  # Qwen3.5-9B: hybrid, vLLM 0.26.0's V1 runner
        ({"autoscaling": True}, "recompute"),
        ({"model_source": "Qwen/Qwen3-8B"}, "fail"),  # dense: the V2 runner, vllm#49250
        ({"model_source": "Qwen/Qwen3-30B-A3B-FP8", "gpu_instance_type": "g6e.8xlarge"}, "fail"),  # MoE
    ],
)
def test_decode_sets_its_kv_load_failure_policy_on_purpose(settings: dict[str, Any], policy: str) -> None:
    args = serve_args(ray_service(**settings))
    assert args["decode_config"]["engine_kwargs"]["kv_transfer_config"]["kv_load_failure_policy"] == policy
    assert "kv_load_failure_policy" not in args["prefill_config"]["engine_kwargs"]["kv_transfer_config"]


@pytest.mark.parametrize("settings", [{}, {"autoscaling": True}])
def test_both_phases_set_shutdown_and_health_check_timing(settings: dict[str, Any]) -> None:
    for side in ("prefill_config", "decode_config"):
        deployment = serve_args(ray_service(**settings))[side.replace("_config", "_deployment")]
        assert (
            deployment["graceful_shutdown_timeout_s"],
            deployment["health_check_period_s"],
            deployment["health_check_timeout_s"],
        ) == (300.0, 10.0, 10.0)


def test_the_ray_autoscaler_runs_and_worker_groups_have_the_node_bounds() -> None:
    cluster = ray_service(autoscaling=True, gpu_layout="per_phase", prefill_min_replicas=0)["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    options = cluster["autoscalerOptions"]
    assert (options["idleTimeoutSeconds"], options["upscalingMode"]) == (300, "Default")
    assert options["resources"]["requests"] == options["resources"]["limits"] == {"cpu": "500m", "memory": "512Mi"}
    bounds = {g["groupName"]: (g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in cluster["workerGroupSpecs"]}
    assert bounds == {"prefill-workers": (0, 0, 2), "decode-workers": (1, 1, 2)}
    for group in cluster["workerGroupSpecs"]:
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        assert "k8s.amazonaws.com/accelerator" not in group["template"]["spec"]["nodeSelector"]


def test_fixed_layout_has_no_ray_autoscaler() -> None:
    cluster = ray_service()["spec"]["rayClusterConfig"]
    assert "enableInTreeAutoscaling" not in cluster and "autoscalerOptions" not in cluster
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in group["template"]["metadata"]["annotations"]


# --- nodes and the Cluster Autoscaler ------------------------------------------------------------
def test_gpu_node_groups_take_the_bounds_and_tell_the_autoscaler_what_an_empty_group_offers(
    scaled: dict[str, Any],
) -> None:
    groups = _nodegroups(scaled)
    gpu = next(g for k, g in groups.items() if "GpuNodeGroup" in k)
    assert gpu["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 4}
    assert gpu["Tags"] == {GPU_TAG: "1", EFA_TAG: "1"}
    assert gpu["Labels"]["k8s.amazonaws.com/accelerator"] == "nvidia-l4"
    # Nodes added later inherit the one GPU subnet and the launch template's placement group.
    assert len(gpu["Subnets"]) == 1
    template_id = gpu["LaunchTemplate"]["Id"]["Ref"]
    placement = scaled["Resources"][template_id]["Properties"]["LaunchTemplateData"]["Placement"]
    assert placement == {"GroupName": {"Ref": next(iter(resources_of_type(scaled, "AWS::EC2::PlacementGroup")))}}
    system = next(g for k, g in groups.items() if "SystemNodeGroup" in k)
    # The Ray head's group is never scaled: the autoscaler can neither add nor remove its node.
    assert system["ScalingConfig"] == {"MinSize": 1, "DesiredSize": 1, "MaxSize": 1}


def test_per_phase_groups_each_get_their_own_bounds_and_efa_count() -> None:
    template = dict(
        Template.from_stack(
            build_stack(
                autoscaling=True,
                gpu_layout="per_phase",
                decode_gpu_instance_type="g6e.24xlarge",
                decode_max_replicas=8,
                prefill_min_replicas=0,
            )
        ).to_json()
    )
    groups = {k: g for k, g in _nodegroups(template).items() if "GpuNodeGroup" in k}
    prefill = next(g for k, g in groups.items() if "Prefill" in k)
    decode = next(g for k, g in groups.items() if "Decode" in k)
    assert prefill["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 2}
    assert decode["ScalingConfig"] == {"MinSize": 1, "DesiredSize": 1, "MaxSize": 2}  # 4 GPUs a node
    assert decode["Tags"] == {GPU_TAG: "4", EFA_TAG: "2"}
    assert decode["Labels"]["k8s.amazonaws.com/accelerator"] == "nvidia-l40s"


def test_fixed_node_groups_are_unchanged(template: Template) -> None:
    gpu = next(g for k, g in _nodegroups(dict(template.to_json())).items() if "GpuNodeGroup" in k)
    assert gpu["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 2}
    assert "Tags" not in gpu and gpu["Labels"] == {"role": "gpu-worker"}


def test_the_cluster_autoscaler_of_the_clusters_minor_runs_on_the_system_nodes(scaled: dict[str, Any]) -> None:
    release = helm_releases(scaled)["cluster-autoscaler"]
    assert (release["chart"], release["version"], release["repository"], release["namespace"]) == (
        "cluster-autoscaler",
        "9.59.0",
        "https://kubernetes.github.io/autoscaler",
        "kube-system",
    )
    values = release["values"]
    (cluster_id,) = resources_of_type(scaled, "AWS::EKS::Cluster")
    assert values["autoDiscovery"] == {"clusterName": f"<{cluster_id}>"}
    assert values["cloudProvider"] == "aws" and values["image"] == {"tag": "v1.35.2"}
    assert values["rbac"]["serviceAccount"] == {"create": True, "name": "cluster-autoscaler"}
    assert values["nodeSelector"] == SYSTEM_NODE_LABELS


def test_the_autoscaler_image_follows_the_kubernetes_version() -> None:
    template = dict(
        Template.from_stack(
            build_stack(autoscaling=True, kubernetes_version="1.33", gcs_fault_tolerance=False)
        ).to_json()
    )
    assert helm_releases(template)["cluster-autoscaler"]["values"]["image"] == {"tag": "v1.33.6"}
    assert set(versions.CLUSTER_AUTOSCALER_IMAGE_TAGS) == set(versions.KUBERNETES_RELEASES)
    for minor, tag in versions.CLUSTER_AUTOSCALER_IMAGE_TAGS.items():
        assert tag.startswith(f"v{minor}.")


def test_the_autoscaler_gets_the_published_policy_scoped_to_this_cluster(scaled: dict[str, Any]) -> None:
    (association,) = [
        r["Properties"]
        for r in resources_of_type(scaled, "AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == "cluster-autoscaler"
    ]
    assert association["Namespace"] == "kube-system"
    role = scaled["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    assert {s["Principal"]["Service"] for s in role["AssumeRolePolicyDocument"]["Statement"]} == {
        "pods.eks.amazonaws.com"
    }
    (policy_id,) = [k for k in resources_of_type(scaled, "AWS::IAM::ManagedPolicy") if "Autoscaler" in k]
    assert role["ManagedPolicyArns"] == [{"Ref": policy_id}]
    statements = scaled["Resources"][policy_id]["Properties"]["PolicyDocument"]["Statement"]
    granted = {a for s in statements for a in s["Action"]}
    published = {a for s in published_policy(versions.CLUSTER_AUTOSCALER_POLICY)["Statement"] for a in s["Action"]}
    assert granted == published  # nothing dropped, nothing added
    (cluster_id,) = resources_of_type(scaled, "AWS::EKS::Cluster")
    for statement in statements:
        if set(statement["Action"]) & set(MUTATING_ACTIONS):
            assert set(statement["Action"]) == set(MUTATING_ACTIONS)
            assert statement["Condition"] == {"StringEquals": {"aws:ResourceTag/eks:cluster-name": {"Ref": cluster_id}}}
        elif "eks:DescribeNodegroup" in statement["Action"]:
            (arn,) = statement["Resource"]
            assert {"Ref": cluster_id} in arn["Fn::Join"][1] and arn["Fn::Join"][1][-1] == "/*/*"
        else:
            assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in statement["Action"])


def test_the_shipped_policy_is_the_pinned_releases_block() -> None:
    """A hand edit changes the digest; an autoscaler bump must bring its release's policy."""
    data = resources.files("eks_pd_serving").joinpath(versions.CLUSTER_AUTOSCALER_POLICY).read_bytes()
    assert hashlib.sha256(data).hexdigest() == POLICY_SHA256
    assert versions.CLUSTER_AUTOSCALER_POLICY.endswith(
        f"{versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[versions.DEFAULT_KUBERNETES_VERSION]}.json"
    )


def test_deploy_order_autoscaler_before_the_ray_cluster_after_its_identity(scaled: dict[str, Any]) -> None:
    helm = resources_of_type(scaled, "Custom::AWSCDK-EKS-HelmChart")
    (chart_id,) = [k for k in helm if "ClusterAutoscaler" in k]
    depends = set(scaled["Resources"][chart_id].get("DependsOn", []))
    (association_id,) = [k for k in resources_of_type(scaled, "AWS::EKS::PodIdentityAssociation") if "Autoscaler" in k]
    (system_id,) = [k for k in resources_of_type(scaled, "AWS::EKS::Nodegroup") if "SystemNodeGroup" in k]
    assert {association_id, system_id} <= depends
    manifests = resources_of_type(scaled, "Custom::AWSCDK-EKS-KubernetesResource")
    (ray_id,) = [k for k in manifests if "RayServiceChart" in k]
    # CloudFormation deletes the RayService (its pods) before the autoscaler on destroy.
    assert chart_id in scaled["Resources"][ray_id]["DependsOn"]


def test_the_capacity_check_asks_for_the_most_nodes(scaled: dict[str, Any]) -> None:
    """Quota and AZ are checked for the maximum: scaling up later must not meet them first."""
    (check,) = resources_of_type(scaled, "Custom::GpuCapacityCheck").values()
    assert check["Properties"]["Groups"] == [{"Name": "gpu", "InstanceType": "g6.8xlarge", "NodeCount": "4"}]


def test_the_manifest_on_the_cluster_carries_the_autoscaling_serve_config(scaled: dict[str, Any]) -> None:
    service = _ray_service(scaled)
    assert serve_args(service)["decode_deployment"]["autoscaling_config"]["max_replicas"] == 2
    assert service["spec"]["upgradeStrategy"] == {"type": "None"}  # serve-config changes stay in place


# --- sizing and cost report both ends -----------------------------------------------------------
def test_sizing_reports_what_the_min_and_max_replicas_hold() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "eks_pd_serving", "sizing", "-c", "autoscaling=true", "-c", "decode_max_replicas=3"],
        cwd=ROOT, env={**NO_AWS_ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "replicas 1 to 2 (autoscaling): 15.27 to 30.55 sequences of 4096 tokens in all" in result.stdout
    assert "replicas 1 to 3 (autoscaling): 15.27 to 45.82 sequences of 4096 tokens in all" in result.stdout


def test_cost_prices_every_group_at_its_min_and_at_its_max(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, autoscaling=True)
    lines, _ = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    (gpu,) = [line for line in lines if line.item == "g6.8xlarge nodes"]
    assert (gpu.quantity, gpu.max_quantity, gpu.note) == (2, 4, "autoscaled 2 to 4")
    at_min, at_max = sum(ln.hourly for ln in lines), sum(ln.hourly_at_max for ln in lines)
    # The fixed default's total at the minimum (observability included); two more g6.8xlarge with their
    # 200 GiB volumes at the maximum.
    assert at_min * cost.HOURS_30_DAYS == pytest.approx(3242.37, abs=0.01)
    assert at_max - at_min == pytest.approx(2 * 2.0144 + 2 * 200 * 0.08 / 720)
    result = subprocess.run(
        [sys.executable, "-m", "eks_pd_serving", "cost", "--template", str(template), "--on", "2026-11-29"],
        cwd=ROOT, env={**NO_AWS_ENV, "COLUMNS": "200"}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and "30 days at max" in result.stdout
    assert "$3,242.37" in result.stdout and f"${at_max * cost.HOURS_30_DAYS:,.2f}" in result.stdout


def test_verify_names_scale_to_zero_when_a_phase_has_no_replica() -> None:
    from eks_pd_serving.cli import verify

    apps = {"applications": {"pd-openai": {"deployments": {
        "Prefill:qwen3_5-9b": {"replicas": []},
        "Decode:qwen3_5-9b": {"replicas": [{"node_ip": "10.0.64.31"}]},
    }}}}  # fmt: skip
    check = verify.check_replica_placement(apps, {"10.0.64.31": "node-b"})
    assert not check.passed and "autoscaled to zero has none until a request arrives" in check.detail
