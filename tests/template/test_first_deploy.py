"""What a person's first `cdk deploy` needs beyond a valid template: a way in, disks that hold
the image, a capacity check before the cluster, nothing outliving `cdk destroy`, and an explicit
upgrade strategy. Each test names the property; the README says what only the docs confirm."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from support import logical_id

from eks_pd_serving import versions
from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.capacity_check import RESOURCE_TYPE
from eks_pd_serving.config import ConfigError, DeploymentConfig
from stacks.pd_serving_stack import PdServingStack


def resources(template: Template, type_: str) -> dict[str, Any]:
    return dict(template.find_resources(type_))


def ray_service(template: Template) -> dict[str, Any]:
    return next(o for o in kubernetes_objects(template.to_json()) if o["kind"] == "RayService")


# --- access -------------------------------------------------------------------------------------
def test_without_admin_role_arn_the_stack_creates_an_assumable_cluster_admin_role(
    default_stack: PdServingStack, template: Template
) -> None:
    role = default_stack.serving.eks.admin_role
    assert role is not None
    role_json = template.to_json()["Resources"][logical_id(role)]
    (statement,) = role_json["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Action"] == "sts:AssumeRole"
    assert "root" in json.dumps(statement["Principal"])  # the account: IAM there decides who
    entry = template.find_resources(
        "AWS::EKS::AccessEntry", {"Properties": {"PrincipalArn": {"Fn::GetAtt": [logical_id(role), "Arn"]}}}
    )
    (props,) = [e["Properties"] for e in entry.values()]
    (policy,) = props["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])


# --- disks --------------------------------------------------------------------------------------
def system_volume(stack: PdServingStack) -> dict[str, Any]:
    template = Template.from_stack(stack).to_json()["Resources"]
    node_group = template[logical_id(stack.serving.eks.system_nodes)]["Properties"]
    launch_template = template[node_group["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
    assert "DiskSize" not in node_group
    (mapping,) = launch_template["BlockDeviceMappings"]
    return dict(mapping["Ebs"])


def test_system_nodes_get_a_root_volume_for_the_ray_image(default_stack: PdServingStack) -> None:
    volume = system_volume(default_stack)
    assert volume == {"VolumeSize": 100, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}


def test_system_root_volume_is_a_setting(stack_factory: Callable[..., PdServingStack]) -> None:
    assert system_volume(stack_factory(system_root_volume_gib="250"))["VolumeSize"] == 250


def test_a_system_volume_too_small_for_the_image_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^system_root_volume_gib=20: .*Fix: set system_root_volume_gib to a whole"):
        DeploymentConfig.create(system_root_volume_gib=20)


# --- fail fast ----------------------------------------------------------------------------------
def test_capacity_check_sees_every_gpu_group_and_the_gpu_az(stack_factory: Callable[..., PdServingStack]) -> None:
    stack = stack_factory(
        gpu_layout="per_phase", prefill_gpu_node_count=2, decode_gpu_instance_type="g6e.8xlarge",
        availability_zones="us-east-1a,us-east-1c", gpu_availability_zone="us-east-1c",
    )  # fmt: skip
    Template.from_stack(stack).has_resource_properties(
        RESOURCE_TYPE,
        {
            "ClusterName": "ray-llm-multinode",
            "GpuAvailabilityZone": "us-east-1c",
            "Groups": [
                {"Name": "prefill", "InstanceType": "g6.8xlarge", "NodeCount": "2"},
                {"Name": "decode", "InstanceType": "g6e.8xlarge", "NodeCount": "1"},
            ],
        },
    )


def test_the_cluster_waits_for_the_capacity_check(default_stack: PdServingStack, template: Template) -> None:
    serving = default_stack.serving
    cluster = template.to_json()["Resources"][logical_id(serving.eks.cluster)]
    assert logical_id(serving.capacity_check.resource) in cluster["DependsOn"]


def test_the_capacity_check_runs_outside_the_vpc_with_read_only_permissions(
    default_stack: PdServingStack, template: Template
) -> None:
    check = default_stack.serving.capacity_check
    function = template.to_json()["Resources"][logical_id(check.function)]["Properties"]
    assert "VpcConfig" not in function and function["Timeout"] == 120
    role = check.function.role
    assert role is not None
    policy = template.to_json()["Resources"][logical_id(role.node.find_child("DefaultPolicy"))]
    actions = {a for s in policy["Properties"]["PolicyDocument"]["Statement"] for a in _list(s["Action"])}
    assert actions == {
        "ec2:DescribeInstanceTypes", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstances",
        "servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota",
        "cloudformation:DescribeStacks",  # its own stack's status: a rollback is reported, not refused
    }  # fmt: skip


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# --- teardown -----------------------------------------------------------------------------------
def test_control_plane_logs_go_to_a_group_the_stack_owns_and_creates_first(
    default_stack: PdServingStack, template: Template
) -> None:
    eks = default_stack.serving.eks
    group = template.to_json()["Resources"][logical_id(eks.control_plane_logs)]
    assert group["Properties"]["LogGroupName"] == "/aws/eks/ray-llm-multinode/cluster"
    assert group["Properties"]["RetentionInDays"] == 30
    assert group["DeletionPolicy"] == "Delete"
    assert logical_id(eks.control_plane_logs) in template.to_json()["Resources"][logical_id(eks.cluster)]["DependsOn"]


def _log_group_of(function_id: str, function: dict[str, Any], groups: dict[str, Any]) -> dict[str, Any]:
    """The group named in LoggingConfig, or the one aws-cdk-lib manages as /aws/lambda/<name>."""
    ref = function["Properties"].get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
    if ref:
        return dict(groups[ref])
    name = {"Fn::Join": ["", ["/aws/lambda/", {"Ref": function_id}]]}
    (group,) = [g for g in groups.values() if g["Properties"].get("LogGroupName") == name]
    return dict(group)


def test_every_lambda_logs_to_a_group_the_stack_deletes(template: Template) -> None:
    groups = resources(template, "AWS::Logs::LogGroup")
    functions = resources(template, "AWS::Lambda::Function")
    # kubectl handler + framework, capacity check + framework, the VPC's default-SG provider, the
    # weights staging's two handlers and three framework functions, the model bucket's emptier
    assert len(functions) == 11
    for function_id, function in functions.items():
        group = _log_group_of(function_id, function, groups)
        assert group["DeletionPolicy"] == "Delete", function_id
        assert group["Properties"]["RetentionInDays"] == 30 and "KmsKeyId" in group["Properties"], function_id


@pytest.mark.parametrize("days", ["7", "365"])
def test_log_retention_is_a_setting(stack_factory: Callable[..., PdServingStack], days: str) -> None:
    groups = resources(Template.from_stack(stack_factory(log_retention_days=days)), "AWS::Logs::LogGroup")
    retained = {g["Properties"]["RetentionInDays"] for g in groups.values() if "FlowLog" not in str(g)}
    assert retained == {int(days)}


def test_a_retention_cloudwatch_does_not_offer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^log_retention_days=10: CloudWatch Logs does not offer"):
        DeploymentConfig.create(log_retention_days=10)


def test_vpc_lambdas_use_a_security_group_of_the_stack_that_may_reach_the_api(
    default_stack: PdServingStack, template: Template
) -> None:
    eks = default_stack.serving.eks
    own = {"Fn::GetAtt": [logical_id(eks.kubectl_security_group), "GroupId"]}
    in_vpc = [f for f in resources(template, "AWS::Lambda::Function").values() if "VpcConfig" in f["Properties"]]
    assert len(in_vpc) == 2
    assert all(f["Properties"]["VpcConfig"]["SecurityGroupIds"] == [own] for f in in_vpc)
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "GroupId": {"Fn::GetAtt": [logical_id(eks.cluster), "ClusterSecurityGroupId"]},
            "SourceSecurityGroupId": own,
            "IpProtocol": "tcp",
            "FromPort": 443,
            "ToPort": 443,
        },
    )


# --- updates and the Ray pods -------------------------------------------------------------------
def test_upgrade_strategy_is_explicit_and_in_place_by_default(template: Template) -> None:
    assert ray_service(template)["spec"]["upgradeStrategy"] == {"type": "None"}


def test_new_cluster_upgrades_are_a_setting_with_a_warning(stack_factory: Callable[..., PdServingStack]) -> None:
    # Two system nodes: the new cluster's head has room beside the first (one is refused).
    stack = stack_factory(ray_upgrade_strategy="NewCluster", system_node_count=2)
    assert ray_service(Template.from_stack(stack))["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    config = DeploymentConfig.create(ray_upgrade_strategy="NewCluster", system_node_count=2)
    assert any("NewCluster" in w and "fixed GPU node counts" in w for w in config.warnings())
    with_autoscaling = DeploymentConfig.create(ray_upgrade_strategy="NewCluster", system_node_count=2, autoscaling=True)
    assert not any("NewCluster" in w for w in with_autoscaling.warnings())


def _shm_bytes(pod: dict[str, Any]) -> int:
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert volume["emptyDir"]["medium"] == "Memory"
    return int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi")) * 2**30


def test_every_ray_pod_puts_its_object_store_inside_dev_shm(template: Template) -> None:
    cluster = ray_service(template)["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        store = int(group["rayStartParams"]["object-store-memory"])
        assert 0 < store < _shm_bytes(group["template"])
        (container,) = group["template"]["spec"]["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_efa_device_plugin_chart_is_the_one_that_ships_a_current_image(template: Template) -> None:
    template.has_resource_properties(
        "Custom::AWSCDK-EKS-HelmChart",
        {"Chart": "aws-efa-k8s-device-plugin", "Version": versions.EFA_DEVICE_PLUGIN_CHART.version},
    )
    chart = versions.EFA_DEVICE_PLUGIN_CHART
    assert (chart.version, versions.EFA_DEVICE_PLUGIN_IMAGE_VERSION) == ("v0.5.30", "v0.5.20")


def test_without_the_managed_log_group_flag_every_lambda_still_gets_a_group_of_ours() -> None:
    """An app without cdk.json's flags (``useCdkManagedLogGroup`` off, no default-SG provider):
    the groups are created beside the functions and named in their LoggingConfig."""
    stack = PdServingStack(cdk.App(), "NoFlags", config=DeploymentConfig())
    template = Template.from_stack(stack)
    groups = resources(template, "AWS::Logs::LogGroup")
    functions = resources(template, "AWS::Lambda::Function")
    assert len(functions) == 10  # without the default-SG provider
    for function_id, function in functions.items():
        ref = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert groups[ref]["DeletionPolicy"] == "Delete", function_id
