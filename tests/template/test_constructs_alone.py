"""Each construct the construct guide names is built from its own props, with no DeploymentConfig
(``Network``, ``LogGroups``, ``EksCluster``, ``EfaGpuNodeGroup``, ``RayServiceManifest``,
``GpuCapacityCheck``): what a pipeline that reuses one piece (a cluster, an EFA node group) relies on."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from eks_pd_serving.cluster import EksCluster, EksClusterProps
from eks_pd_serving.gpu_node_group import EfaGpuNodeGroup
from eks_pd_serving.layout import GpuGroup
from eks_pd_serving.log_groups import LogGroups
from eks_pd_serving.network import Network
from eks_pd_serving.phase import Phase


def alone() -> tuple[cdk.Stack, Network, LogGroups, EksCluster]:
    """A stack with a network, its log groups and a cluster, each from its own props."""
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
    return stack, network, logs, eks


def test_network_cluster_and_an_efa_group_from_their_own_props() -> None:
    stack, network, _, eks = alone()
    group = GpuGroup(Phase.DECODE, (Phase.DECODE,), "g6e.8xlarge", 3)
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


def test_the_ray_service_and_the_capacity_check_from_their_own_props() -> None:
    """The other two the construct guide names: a RayService from hand-written typed props (one
    model, Ray's own builder, no failover) on a cluster, and the capacity check for one group."""
    import json

    import yaml

    from eks_pd_serving import k8s
    from eks_pd_serving.capacity.checks import GroupNeed
    from eks_pd_serving.capacity_check import GpuCapacityCheck
    from eks_pd_serving.ray_service import RayServiceManifest

    stack, network, logs, eks = alone()
    engine = k8s.EngineSpec(replicas=1, tensor_parallel_size=1, enforce_eager=True)
    served = k8s.ServedModel(
        model=k8s.ModelSpec(
            model_id="small",
            weights=k8s.Weights("Qwen/Qwen3-0.6B", "main"),
            max_model_len=4096,
            dtype="bfloat16",
            gpu_memory_utilization=0.9,
        ),
        prefill=engine,
        decode=engine,
        kv=k8s.KvTransferSpec(backend="LIBFABRIC", buffer_device="cuda"),
    )
    props = k8s.RayServiceProps(
        name="ray-alone",
        namespace="serving",
        image="rayproject/ray-llm:2.58.0-py312-cu128",
        ray_version="2.58.0",
        models=(served,),
        head=k8s.PodResources(cpu=2, memory_gib=8, shm_gib=2),
        workers=(
            k8s.WorkerGroupSpec(
                "gpu-workers",
                2,
                k8s.PodResources(cpu=30, memory_gib=120, gpus=1, efa_interfaces=1, shm_gib=32),
                {"role": "gpu-worker"},
            ),
        ),
        hybrid_model=False,
        system_node_selector={"role": "system"},
    )
    RayServiceManifest(stack, "RayService", props=props, cluster=eks.handle)
    GpuCapacityCheck(
        stack,
        "Capacity",
        cluster_name="alone",
        gpu_availability_zone=network.gpu_subnet.availability_zone,
        groups=[GroupNeed("gpu", "g6.8xlarge", 2)],
        log_groups=logs,
    )
    template = Template.from_stack(stack)
    manifests = [
        json.loads(m["Manifest"]) if isinstance(m["Manifest"], str) else m["Manifest"]
        for m in template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values()
        for m in [m["Properties"]]
        if isinstance(m.get("Manifest"), str) and "RayService" in m["Manifest"]
    ]
    (service,) = [o for objects in manifests for o in objects if o["kind"] == "RayService"]
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["decode_config"]["model_loading_config"] == {
        "model_id": "small",
        "model_source": "Qwen/Qwen3-0.6B",
    }
    assert app["args"]["decode_config"]["engine_kwargs"]["revision"] == "main"
    template.resource_count_is("Custom::GpuCapacityCheck", 1)
    # Its role reads its own stack's status (an update during a rollback only reports).
    describe = Match.object_like({"Action": "cloudformation:DescribeStacks", "Resource": {"Ref": "AWS::StackId"}})
    template.has_resource_properties(
        "AWS::IAM::Policy", {"PolicyDocument": Match.object_like({"Statement": Match.array_with([describe])})}
    )
