"""Per-phase hardware, bring-your-own VPC and several deployments in one app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
import yaml
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template
from support import logical_id, new_app, ray_service, serve_args, synth_assembly

from eks_pd_serving.config import ConfigError, ConstructError, DeploymentConfig
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.pd_serving import PdServing
from eks_pd_serving.phase import Phase
from rehearsal import profile
from stacks.pd_serving_stack import PdServingStack

PER_PHASE = {
    "gpu_layout": "per_phase",
    "prefill_gpu_instance_type": "g6e.8xlarge",
    "prefill_gpu_node_count": "1",
    "decode_gpu_instance_type": "g6.8xlarge",
    "decode_gpu_node_count": "2",
    "decode_replicas": "2",
}


@pytest.fixture(scope="module")
def stack() -> PdServingStack:
    return PdServingStack(new_app(), "PerPhase", config=DeploymentConfig.from_context(PER_PHASE))


@pytest.fixture(scope="module")
def template(stack: PdServingStack) -> Template:
    return Template.from_stack(stack)


def test_each_phase_gets_its_own_efa_node_group(stack: PdServingStack, template: Template) -> None:
    serving = stack.serving
    assert [g.node.id for g in serving.gpu_node_groups] == ["PrefillGpuNodes", "DecodeGpuNodes"]
    resources = template.to_json()["Resources"]
    groups = {g.group.name: resources[logical_id(g.nodegroup)]["Properties"] for g in serving.gpu_node_groups}
    assert groups["prefill"]["InstanceTypes"] == ["g6e.8xlarge"]
    assert groups["prefill"]["ScalingConfig"]["DesiredSize"] == 1
    assert groups["decode"]["InstanceTypes"] == ["g6.8xlarge"]
    assert groups["decode"]["ScalingConfig"]["DesiredSize"] == 2
    assert groups["prefill"]["Labels"] == {"role": "gpu-worker", "phase": "prefill"}
    assert groups["decode"]["Labels"] == {"role": "gpu-worker", "phase": "decode"}
    # One AZ for both: the same GPU subnet; each group its own EFA launch template and placement group.
    assert (
        groups["prefill"]["Subnets"] == groups["decode"]["Subnets"] == [{"Ref": logical_id(serving.network.gpu_subnet)}]
    )
    template.resource_count_is("AWS::EC2::PlacementGroup", 2)
    efa_templates = [
        lt
        for lt in template.find_resources("AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in lt["Properties"]["LaunchTemplateData"]
    ]
    assert len(efa_templates) == 2  # the system group's template has no interfaces
    for lt in efa_templates:
        assert lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"][0]["InterfaceType"] == "efa"


def test_plugins_and_ray_service_wait_for_both_gpu_groups(stack: PdServingStack, template: Template) -> None:
    serving = stack.serving
    resources = template.to_json()["Resources"]
    needs = set(resources[logical_id(serving.ray_service.manifest)]["DependsOn"])
    for group in serving.gpu_node_groups:
        assert logical_id(group.nodegroup) in needs
        for chart in serving.device_plugins.charts:
            assert logical_id(group.nodegroup) in set(resources[logical_id(chart)]["DependsOn"])


def test_each_phase_gets_a_worker_group_pinned_to_its_nodes() -> None:
    service = ray_service(**PER_PHASE)
    groups = {g["groupName"]: g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert set(groups) == {"prefill-workers", "decode-workers"}
    assert groups["prefill-workers"]["replicas"] == 1 and groups["decode-workers"]["replicas"] == 2
    assert groups["prefill-workers"]["template"]["spec"]["nodeSelector"] == {"role": "gpu-worker", "phase": "prefill"}
    assert groups["prefill-workers"]["resources"] == {"prefill_gpu": "1"}
    # g6e.8xlarge: 32 vCPUs, 256 GiB; g6.8xlarge: 32 vCPUs, 128 GiB.
    prefill_limits = groups["prefill-workers"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    decode_limits = groups["decode-workers"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (prefill_limits["memory"], decode_limits["memory"]) == ("204Gi", "102Gi")
    args = serve_args(service)
    assert args["prefill_config"]["placement_group_config"] == {"bundles": [{"GPU": 1, "prefill_gpu": 1}]}
    assert args["decode_config"]["placement_group_config"] == {"bundles": [{"GPU": 1, "decode_gpu": 1}]}


def test_shared_layout_has_no_pinning() -> None:
    args = serve_args(ray_service())
    assert "placement_group_config" not in args["prefill_config"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {**PER_PHASE, "prefill_replicas": "2"},
            r"prefill_replicas=2 x prefill_tensor_parallel_size=1 needs 2 GPUs, but prefill_gpu_node_count=1",
        ),
        (
            {**PER_PHASE, "decode_gpu_node_count": "1"},
            r"decode_replicas=2 x .* needs 2 GPUs, but decode_gpu_node_count=1",
        ),
        ({"decode_gpu_node_count": "2"}, r"decode_gpu_node_count=2 is only used with gpu_layout='per_phase'"),
        ({**PER_PHASE, "decode_gpu_instance_type": "g6.xlarge"}, r"decode_gpu_instance_type='g6.xlarge': .*EFA"),
        (
            {**PER_PHASE, "prefill_tensor_parallel_size": "2", "decode_tensor_parallel_size": "2"},
            r"prefill_tensor_parallel_size=2 exceeds the 1 GPU\(s\) of one g6e.8xlarge",
        ),
    ],
    ids=["prefill GPUs", "decode GPUs", "per-phase key in shared layout", "decode type without EFA", "tp beyond node"],
)
def test_gpus_must_add_up_per_phase(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeploymentConfig.from_context(settings)


def test_sizing_uses_each_phases_gpu() -> None:
    config = DeploymentConfig.from_context(PER_PHASE)
    prefill, decode = config.sizing(Phase.PREFILL), config.sizing(Phase.DECODE)
    assert prefill is not None and decode is not None
    assert prefill.gpu_bytes == 45776 * 1024**2 and decode.gpu_bytes == 22888 * 1024**2


def test_rehearsal_config_path_keeps_the_phase_pinning(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, **PER_PHASE)
    deployed = profile.serve_config(profile.ray_service_from_template(template))
    rehearsed = profile.local_profile(deployed, Path("/ckpt"))
    prefill, decode = (layout.llm_config(rehearsed, phase) for phase in (Phase.PREFILL, Phase.DECODE))
    assert prefill["placement_group_config"] == {"bundles": [{"CPU": 1, "prefill_gpu": 1}]}
    assert decode["placement_group_config"] == {"bundles": [{"CPU": 1, "decode_gpu": 1}]}
    assert profile.custom_resources(rehearsed) == {"prefill_gpu": 1.0, "decode_gpu": 1.0}


# --- bring your own VPC ------------------------------------------------------------------------
def brought_vpc(stack: cdk.Stack, subnets: int = 2) -> ec2.IVpc:
    azs = ["us-east-1a", "us-east-1b"][:subnets]
    return ec2.Vpc.from_vpc_attributes(
        stack, "Existing", vpc_id="vpc-0123456789abcdef0", availability_zones=azs,
        private_subnet_ids=[f"subnet-0000000000000000{i}" for i in range(subnets)],
        private_subnet_route_table_ids=[f"rtb-0000000000000000{i}" for i in range(subnets)],
    )  # fmt: skip


def test_an_existing_vpc_is_used_and_no_vpc_is_created() -> None:
    stack = cdk.Stack(new_app(), "Byo")
    PdServing(stack, "PdServing", config=DeploymentConfig(), vpc=brought_vpc(stack))
    template = Template.from_stack(stack)
    template.resource_count_is("AWS::EC2::VPC", 0)
    template.resource_count_is("AWS::EC2::NatGateway", 0)
    (cluster,) = template.find_resources("AWS::EKS::Cluster").values()
    assert cluster["Properties"]["ResourcesVpcConfig"]["SubnetIds"] == [
        "subnet-00000000000000000",
        "subnet-00000000000000001",
    ]
    for ng in template.find_resources(
        "AWS::EKS::Nodegroup", {"Properties": {"AmiType": "AL2023_x86_64_NVIDIA"}}
    ).values():
        assert ng["Properties"]["Subnets"] == ["subnet-00000000000000000"]


def test_an_existing_vpc_is_warned_about_its_s3_route() -> None:
    """Its owner's routes carry the weights: synth says what it needs (a gateway endpoint)."""
    from aws_cdk.assertions import Annotations, Match

    stack = cdk.Stack(new_app(), "ByoS3")
    PdServing(stack, "PdServing", config=DeploymentConfig(), vpc=brought_vpc(stack))
    Annotations.from_stack(stack).has_warning("*", Match.string_like_regexp("weights_source=s3 with a brought VPC"))
    Template.from_stack(stack).resource_count_is("AWS::EC2::VPCEndpoint", 0)


def test_an_existing_vpc_honours_the_gpu_az() -> None:
    stack = cdk.Stack(new_app(), "Byo")
    config = DeploymentConfig.create(availability_zones="us-east-1a,us-east-1b", gpu_availability_zone="us-east-1b")
    serving = PdServing(stack, "PdServing", config=config, vpc=brought_vpc(stack))
    assert serving.network.gpu_subnet.subnet_id == "subnet-00000000000000001"


def test_a_vpc_with_one_private_subnet_is_refused() -> None:
    stack = cdk.Stack(new_app(), "Byo")
    with pytest.raises(
        ConfigError, match=r"has 1 private subnet\(s\) in 1 AZ\(s\); EKS needs private subnets in at least two AZs"
    ):
        PdServing(stack, "PdServing", config=DeploymentConfig(), vpc=brought_vpc(stack, subnets=1))


# --- several deployments in one app --------------------------------------------------------------
def test_two_deployments_in_one_app_do_not_collide(tmp_path: Path) -> None:
    app = new_app(outdir=str(tmp_path))
    small = DeploymentConfig.create(cluster_name="team-a", model_id="qwen-a")
    large = DeploymentConfig.create(cluster_name="team-b", gpu_node_count=4, decode_replicas=3, namespace="llm")
    PdServingStack(app, "TeamA", config=small)
    PdServingStack(app, "TeamB", config=large)
    app.synth()
    names: dict[str, set[str]] = {"cluster": set(), "release": set(), "log": set()}
    for stack in ("TeamA", "TeamB"):
        template = json.loads((tmp_path / f"{stack}.template.json").read_text())
        for resource in template["Resources"].values():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::EKS::Cluster":
                names["cluster"].add(props["Name"])
            if resource["Type"] == "Custom::AWSCDK-EKS-HelmChart":
                names["release"].add(f"{stack}:{json.dumps(props['ClusterName'])}/{props['Release']}")
            # Physical names that would collide across stacks: none set beyond the cluster's own
            # (its control-plane log group is named by EKS after the cluster).
            if resource["Type"] == "AWS::Logs::LogGroup" and isinstance(props.get("LogGroupName"), str):
                names["log"].add(props["LogGroupName"])
                continue
            if resource["Type"] == "AWS::CloudWatch::Dashboard":
                names.setdefault("dashboard", set()).add(props["DashboardName"])
            for key in ("RoleName", "FunctionName", "AliasName", "NodegroupName"):
                assert not isinstance(props.get(key), str), f"{stack}: fixed {key} {props.get(key)}"
    assert names["cluster"] == {"team-a", "team-b"}
    containerinsights = {f"/aws/containerinsights/{c}/{k}" for c in ("team-a", "team-b")
                         for k in ("application", "dataplane", "host", "performance", "prometheus")}  # fmt: skip
    assert names["log"] == {"/aws/eks/team-a/cluster", "/aws/eks/team-b/cluster"} | containerinsights
    assert len(names["release"]) == 6  # three releases per cluster, each cluster its own
    assert names["dashboard"] == {"team-a-pd-serving", "team-b-pd-serving"}


def test_two_deployments_in_one_stack_and_a_duplicate_name() -> None:
    stack = cdk.Stack(new_app(), "Both")
    PdServing(stack, "Small", config=DeploymentConfig.create(cluster_name="small"))
    PdServing(stack, "Large", config=DeploymentConfig.create(cluster_name="large", gpu_node_count=3))
    Template.from_stack(stack).resource_count_is("AWS::EKS::Cluster", 2)
    with pytest.raises(
        ConstructError, match=r"^Both/Again: cluster_name='small' is already used by Both/Small in this app"
    ):
        PdServing(stack, "Again", config=DeploymentConfig.create(cluster_name="small"))


def test_per_phase_manifest_matches_the_kuberay_crd() -> None:
    from test_ray_service_chart import CRD_DIR

    if not CRD_DIR.is_dir():
        pytest.skip(f"KubeRay CRDs not found at {CRD_DIR}")
    from kuberay_schema import load_crd_schema, schema_errors

    schema = load_crd_schema(CRD_DIR / "ray.io_rayservices.yaml")
    assert schema_errors(schema, ray_service(**PER_PHASE)) == []
    assert yaml.safe_load(ray_service(**PER_PHASE)["spec"]["serveConfigV2"])["applications"]
