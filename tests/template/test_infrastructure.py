"""The synthesized template carries the reference infrastructure, property by property."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aws_cdk.assertions import Capture, Match, Template
from support import logical_id

from stacks.pd_serving_stack import PdServingStack


def _one(template: Template, type_: str) -> dict[str, Any]:
    found = template.find_resources(type_)
    assert len(found) == 1, f"expected one {type_}, found {len(found)}"
    return dict(next(iter(found.values())))


def test_vpc_has_public_and_private_subnets_in_two_azs_and_one_nat(template: Template) -> None:
    subnets = template.find_resources("AWS::EC2::Subnet")
    public = [s for s in subnets.values() if s["Properties"]["MapPublicIpOnLaunch"]]
    private = [s for s in subnets.values() if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert len(public) == 2 and len(private) == 2
    assert len({str(s["Properties"]["AvailabilityZone"]) for s in private}) == 2
    template.resource_count_is("AWS::EC2::NatGateway", 1)


def test_nat_per_az_is_a_setting(stack_factory: Callable[..., PdServingStack]) -> None:
    template = Template.from_stack(stack_factory(nat_gateways=2))
    template.resource_count_is("AWS::EC2::NatGateway", 2)


def test_vpc_flow_logs_capture_all_traffic(template: Template) -> None:
    template.has_resource_properties("AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL"})


def test_cluster_is_native_eks_with_version_logging_and_kms(template: Template) -> None:
    key = Capture()
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Name": "ray-llm-multinode",
            "Version": "1.35",
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": Match.array_equals(
                        [{"Type": t} for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")]
                    )
                }
            },
            "EncryptionConfig": [{"Provider": {"KeyArn": {"Fn::GetAtt": [key, "Arn"]}}, "Resources": ["secrets"]}],
            "ResourcesVpcConfig": Match.object_like(
                {
                    "EndpointPublicAccess": True,
                    "EndpointPrivateAccess": True,
                    "PublicAccessCidrs": ["0.0.0.0/0"],
                }
            ),
            "BootstrapSelfManagedAddons": False,
        },
    )
    assert template.to_json()["Resources"][key.as_string()]["Properties"]["EnableKeyRotation"] is True


def test_endpoint_allow_list_is_honoured(stack_factory: Callable[..., PdServingStack]) -> None:
    template = Template.from_stack(stack_factory(endpoint_allowed_cidrs="203.0.113.0/24,198.51.100.7/32"))
    template.has_resource_properties(
        "AWS::EKS::Cluster",
        {"ResourcesVpcConfig": Match.object_like({"PublicAccessCidrs": ["203.0.113.0/24", "198.51.100.7/32"]})},
    )


def test_kubectl_layer_matches_the_kubernetes_version(stack_factory: Callable[..., PdServingStack]) -> None:
    stack = stack_factory(kubernetes_version="1.33", gcs_fault_tolerance=False)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::EKS::Cluster", {"Version": "1.33"})
    layer = stack.serving.eks.node.find_child("KubectlLayer")
    assert type(layer).__name__ == "KubectlV33Layer"


def test_kubectl_handler_runs_in_the_vpc(template: Template) -> None:
    handlers = template.find_resources("AWS::Lambda::Function", {"Properties": {"Layers": Match.any_value()}})
    assert handlers
    assert all("VpcConfig" in h["Properties"] for h in handlers.values())


def test_managed_addons_are_installed(template: Template) -> None:
    names = {a["Properties"]["AddonName"] for a in template.find_resources("AWS::EKS::Addon").values()}
    assert names == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent", "amazon-cloudwatch-observability"}


def test_a_named_admin_role_gets_the_access_entry_and_no_role_is_created(
    stack_factory: Callable[..., PdServingStack],
) -> None:
    arn = "arn:aws:iam::123456789012:role/PlatformAdmin"
    stack = stack_factory(admin_role_arn=arn)
    template = Template.from_stack(stack)
    entries = template.find_resources("AWS::EKS::AccessEntry", {"Properties": {"PrincipalArn": arn}})
    (entry,) = entries.values()
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "policy/AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])
    assert stack.serving.eks.admin_role is None
    assert len(template.find_resources("AWS::EKS::AccessEntry")) == 2  # this role's and the kubectl handler's
    (*_, tail) = template.to_json()["Outputs"]["UpdateKubeconfigCommand"]["Value"]["Fn::Join"][1]
    assert tail == f" --role-arn {arn}"


def test_system_node_group(template: Template) -> None:
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_STANDARD",
            "InstanceTypes": ["m7i.xlarge"],
            "Labels": {"role": "system"},
            "ScalingConfig": {"DesiredSize": 1, "MaxSize": 1, "MinSize": 1},
            "Subnets": Match.array_with([Match.object_like({"Ref": Match.string_like_regexp("Private")})]),
        },
    )


def test_gpu_node_group_is_nvidia_al2023_in_exactly_one_private_subnet(
    default_stack: PdServingStack, template: Template
) -> None:
    gpu = default_stack.serving.gpu_nodes
    node_group = template.to_json()["Resources"][logical_id(gpu.nodegroup)]["Properties"]
    assert node_group["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert node_group["InstanceTypes"] == ["g6.8xlarge"]
    assert node_group["Labels"] == {"role": "gpu-worker"}
    assert node_group["ScalingConfig"] == {"DesiredSize": 2, "MaxSize": 2, "MinSize": 2}
    assert node_group["Subnets"] == [{"Ref": logical_id(default_stack.serving.network.gpu_subnet)}]
    assert node_group["LaunchTemplate"]["Id"] == {"Ref": logical_id(gpu.launch_template)}
    assert "DiskSize" not in node_group  # the launch template carries the volume


def test_gpu_subnet_follows_the_gpu_az(stack_factory: Callable[..., PdServingStack]) -> None:
    stack = stack_factory(availability_zones="us-east-1a,us-east-1c", gpu_availability_zone="us-east-1c")
    template = Template.from_stack(stack)
    subnet = template.to_json()["Resources"][logical_id(stack.serving.network.gpu_subnet)]
    assert subnet["Properties"]["AvailabilityZone"] == "us-east-1c"
    assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_launch_template_has_one_efa_interface_imdsv2_and_encrypted_gp3(
    default_stack: PdServingStack, template: Template
) -> None:
    gpu = default_stack.serving.gpu_nodes
    data = template.to_json()["Resources"][logical_id(gpu.launch_template)]["Properties"]["LaunchTemplateData"]
    (interface,) = data["NetworkInterfaces"]
    assert interface["InterfaceType"] == "efa"
    assert (interface["DeviceIndex"], interface["NetworkCardIndex"]) == (0, 0)
    assert {"Fn::GetAtt": [logical_id(gpu.security_group), "GroupId"]} in interface["Groups"]
    cluster_id = logical_id(default_stack.serving.eks.cluster)
    assert {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]} in interface["Groups"]
    assert "SubnetId" not in interface
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpPutResponseHopLimit": 1,  # no Ray pod reaches IMDS (the node's role)
        "HttpTokens": "required",
    }
    (disk,) = data["BlockDeviceMappings"]
    assert disk["Ebs"] == {
        "DeleteOnTermination": True,
        "Encrypted": True,
        "VolumeSize": 200,
        "VolumeType": "gp3",  # no Throughput: the pull writes to the instance store (tests/template/test_node_cache.py)
    }
    assert data["Placement"] == {"GroupName": {"Ref": logical_id(gpu.placement_group)}}


def test_placement_group_is_cluster(template: Template) -> None:
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})


def test_efa_security_group_allows_all_traffic_to_and_from_itself(
    default_stack: PdServingStack, template: Template
) -> None:
    sg = logical_id(default_stack.serving.gpu_nodes.security_group)
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "GroupId": {"Fn::GetAtt": [sg, "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [sg, "GroupId"]},
        },
    )
    egress = template.to_json()["Resources"][sg]["Properties"]["SecurityGroupEgress"]
    assert egress == [
        {"CidrIp": "0.0.0.0/0", "Description": "Allow all outbound traffic by default", "IpProtocol": "-1"}
    ]


def _helm(template: Template, release: str) -> dict[str, Any]:
    charts = template.find_resources("Custom::AWSCDK-EKS-HelmChart", {"Properties": {"Release": release}})
    assert len(charts) == 1, f"no single Helm release {release}"
    return dict(next(iter(charts.values()))["Properties"])


def test_kuberay_operator_is_pinned_on_system_nodes(template: Template) -> None:
    chart = _helm(template, "kuberay-operator")
    assert (chart["Chart"], chart["Version"]) == ("kuberay-operator", "1.7.0")
    assert chart["Repository"] == "https://ray-project.github.io/kuberay-helm/"
    assert '"nodeSelector":{"role":"system"}' in chart["Values"]


def test_device_plugins_run_on_gpu_nodes(template: Template) -> None:
    nvidia = _helm(template, "nvidia-device-plugin")
    assert (nvidia["Chart"], nvidia["Version"]) == ("nvidia-device-plugin", "0.20.0")
    assert '"key":"role","operator":"In","values":["gpu-worker"]' in nvidia["Values"]
    efa = _helm(template, "aws-efa-k8s-device-plugin")
    assert efa["Repository"] == "https://aws.github.io/eks-charts"
    assert '"nodeSelector":{"role":"gpu-worker"}' in efa["Values"]


def _depends_on(template: Template, resource_id: str) -> set[str]:
    return set(template.to_json()["Resources"][resource_id].get("DependsOn", []))


def test_charts_depend_on_the_node_groups_they_run_on(default_stack: PdServingStack, template: Template) -> None:
    serving = default_stack.serving
    system_ng, gpu_ng = logical_id(serving.eks.system_nodes), logical_id(serving.gpu_nodes.nodegroup)
    assert system_ng in _depends_on(template, logical_id(serving.kuberay.chart))
    for chart in serving.device_plugins.charts:
        assert gpu_ng in _depends_on(template, logical_id(chart))


def test_ray_service_depends_on_kuberay_and_both_node_groups(default_stack: PdServingStack, template: Template) -> None:
    serving = default_stack.serving
    needs = _depends_on(template, logical_id(serving.ray_service.manifest))
    assert {
        logical_id(serving.kuberay.chart),
        logical_id(serving.eks.system_nodes),
        logical_id(serving.gpu_nodes.nodegroup),
        *(logical_id(c) for c in serving.device_plugins.charts),
    } <= needs


def test_node_groups_wait_for_cni_and_coredns_waits_for_nodes(
    default_stack: PdServingStack, template: Template
) -> None:
    serving = default_stack.serving
    addons = {logical_id(a) for a in serving.eks.node_addons}
    assert addons <= _depends_on(template, logical_id(serving.eks.system_nodes))
    assert addons <= _depends_on(template, logical_id(serving.gpu_nodes.nodegroup))
    core_dns = serving.eks.node.find_child("CoreDns")
    assert logical_id(serving.eks.system_nodes) in _depends_on(template, logical_id(core_dns))


def test_outputs_tell_the_user_what_to_run_next(default_stack: PdServingStack, template: Template) -> None:
    outputs = template.to_json()["Outputs"]
    assert outputs["ClusterName"]["Value"] == "ray-llm-multinode"
    kubeconfig = outputs["UpdateKubeconfigCommand"]["Value"]
    role_arn = {"Fn::GetAtt": [logical_id(default_stack.serving.eks.admin_role), "Arn"]}
    assert kubeconfig == {
        "Fn::Join": [
            "",
            [
                "aws eks update-kubeconfig --name ray-llm-multinode --region ",
                {"Ref": "AWS::Region"},
                " --role-arn ",
                role_arn,
            ],
        ]
    }
    assert outputs["ClusterAdminRoleArn"]["Value"] == role_arn
    assert outputs["PortForwardCommand"]["Value"] == "kubectl -n inference port-forward svc/ray-llm-serve-svc 8000:8000"
    assert '"model": "qwen3.5-9b"' in outputs["ChatCompletionsCurl"]["Value"]
    assert outputs["ChatCompletionsCurl"]["Value"].startswith("curl -s http://localhost:8000/v1/chat/completions")
