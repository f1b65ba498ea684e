"""Each construct is built from its own props, with no DeploymentConfig: what a pipeline that
reuses one piece (a cluster, an EFA node group) relies on."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from eks_pd_serving.cluster import EksCluster, EksClusterProps
from eks_pd_serving.gpu_node_group import EfaGpuNodeGroup
from eks_pd_serving.layout import GpuGroup
from eks_pd_serving.log_groups import LogGroups
from eks_pd_serving.network import Network


def test_network_cluster_and_an_efa_group_from_their_own_props() -> None:
    stack = cdk.Stack(cdk.App(), "Alone")
    network = Network(stack, "Net", nat_gateways=1)
    logs = LogGroups(stack, "Logs", retention_days=7)
    eks = EksCluster(
        stack,
        "Eks",
        props=EksClusterProps(cluster_name="alone", system_instance_type="m7i.2xlarge", system_root_volume_gib=120),
        vpc=network.vpc,
        log_groups=logs,
    )
    group = GpuGroup("decode", ("decode",), "g6e.8xlarge", 3)
    EfaGpuNodeGroup(
        stack, group.construct_id, group=group, cluster=eks.cluster, vpc=network.vpc, subnet=network.gpu_subnet
    )
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::EKS::Cluster", {"Name": "alone"})
    template.has_resource_properties(
        "AWS::Logs::LogGroup", {"LogGroupName": "/aws/eks/alone/cluster", "RetentionInDays": 7}
    )
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {"InstanceTypes": ["g6e.8xlarge"], "Labels": {"role": "gpu-worker", "phase": "decode"},
         "ScalingConfig": {"DesiredSize": 3, "MaxSize": 3, "MinSize": 3}},
    )  # fmt: skip
    template.has_resource_properties("AWS::EKS::Nodegroup", {"InstanceTypes": ["m7i.2xlarge"]})
    gpu_volume = Match.object_like({"Ebs": Match.object_like({"VolumeSize": 200})})
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate", {"LaunchTemplateData": Match.object_like({"BlockDeviceMappings": [gpu_volume]})}
    )
    assert isinstance(network.vpc, ec2.Vpc)
