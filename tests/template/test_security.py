"""Secure defaults, limits, deploy/destroy order and stable ids, asserted on what synth writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import logical_id

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.config import DeploymentConfig
from stacks.pd_serving_stack import PdServingStack

HELM = "Custom::AWSCDK-EKS-HelmChart"


def resources(template: Template, type_: str) -> dict[str, Any]:
    return dict(template.find_resources(type_))


def manifests(template_file: Path) -> list[dict[str, Any]]:
    """Every Kubernetes object embedded in the template, region token flattened."""
    objects: list[dict[str, Any]] = kubernetes_objects(json.loads(template_file.read_text()))
    return objects


# --- secure defaults ---------------------------------------------------------------------
def test_nodes_are_in_private_subnets_without_public_ips(template: Template) -> None:
    subnets = resources(template, "AWS::EC2::Subnet")
    for node_group in resources(template, "AWS::EKS::Nodegroup").values():
        for ref in node_group["Properties"]["Subnets"]:
            assert subnets[ref["Ref"]]["Properties"]["MapPublicIpOnLaunch"] is False
    for lt in resources(template, "AWS::EC2::LaunchTemplate").values():
        for interface in lt["Properties"]["LaunchTemplateData"].get("NetworkInterfaces", []):
            assert interface.get("AssociatePublicIpAddress") in (None, False)


def test_imdsv2_is_required_and_gpu_pods_cannot_reach_it(template: Template) -> None:
    """Hop limit 1 on the GPU nodes (only the node and host-network pods reach IMDS, so no Ray pod
    takes the node's role); 2 on the system nodes, where the Ray scraper's CloudWatch agent runs off
    the host network and reads the instance's metadata."""
    limits = {}
    for lt in resources(template, "AWS::EC2::LaunchTemplate").values():
        options = lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]
        assert options["HttpTokens"] == "required"
        limits["gpu" if "NetworkInterfaces" in lt["Properties"]["LaunchTemplateData"] else "system"] = options[
            "HttpPutResponseHopLimit"
        ]
    assert limits == {"system": 2, "gpu": 1}


def test_ebs_volumes_are_encrypted(template: Template) -> None:
    for lt in resources(template, "AWS::EC2::LaunchTemplate").values():
        for disk in lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]:
            assert disk["Ebs"]["Encrypted"] is True


def test_secrets_are_envelope_encrypted_and_all_control_plane_logs_on(template: Template) -> None:
    (cluster,) = resources(template, "AWS::EKS::Cluster").values()
    props = cluster["Properties"]
    assert props["EncryptionConfig"][0]["Resources"] == ["secrets"]
    assert len(props["Logging"]["ClusterLogging"]["EnabledTypes"]) == 5


def test_vpc_flow_logs_go_to_a_kms_encrypted_log_group(template: Template) -> None:
    (flow_log,) = resources(template, "AWS::EC2::FlowLog").values()
    group_id = flow_log["Properties"]["LogGroupName"]["Ref"]
    assert "KmsKeyId" in resources(template, "AWS::Logs::LogGroup")[group_id]["Properties"]


def test_every_log_group_is_kms_encrypted_and_deleted_with_the_stack(template: Template) -> None:
    groups = resources(template, "AWS::Logs::LogGroup")
    # flow logs, control plane, one per Lambda (5 + the bucket emptier's), the five the CloudWatch
    # add-on writes to, and the weights staging's (its job, its two handlers, their provider
    # framework, its waiter state machine)
    assert len(groups) == 18
    for group_id, group in groups.items():
        assert "KmsKeyId" in group["Properties"], group_id
        assert group["DeletionPolicy"] == "Delete", group_id


def test_every_kms_key_rotates(template: Template) -> None:
    keys = resources(template, "AWS::KMS::Key").values()
    # secrets, flow logs, log groups, model weights, GCS store
    assert len(keys) == 5 and all(k["Properties"]["EnableKeyRotation"] for k in keys)


def test_the_alarm_topics_key_rotates_too() -> None:
    from support import build_stack

    keys = Template.from_stack(build_stack(alarm_email="ops@example.com")).find_resources("AWS::KMS::Key")
    assert len(keys) == 6 and all(k["Properties"]["EnableKeyRotation"] for k in keys.values())


def test_no_kubernetes_service_or_ingress_reaches_outside_the_cluster(template_file: Path) -> None:
    """The default exposure (port-forward); the internal NLB is tests/template/test_endpoint.py's."""
    objects = manifests(template_file)
    # Role, RoleBinding and Job: the rollout Job's, namespace-scoped (tests/template/test_rollout.py).
    assert {o["kind"] for o in objects} == {
        "Namespace", "RayService", "NetworkPolicy", "ServiceAccount", "ConfigMap", "Role", "RoleBinding", "Job"
    }  # fmt: skip
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]
    # KubeRay's head and serve services stay ClusterIP: dashboard (8265) and serve (8000) are
    # reachable only inside the cluster (kubectl port-forward from outside).
    assert head["serviceType"] == "ClusterIP"
    assert "serveService" not in service["spec"]
    assert "LoadBalancer" not in json.dumps(objects) and "NodePort" not in json.dumps(objects)


def _ray_egress(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The NetworkPolicy that limits the Ray pods' egress, if any."""
    found = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy"
        and "Egress" in o["spec"].get("policyTypes", [])
        and o["spec"]["podSelector"].get("matchLabels") == {"ray.io/is-ray-node": "yes"}
    ]
    return found[0] if found else None


def test_ray_pods_reach_only_what_they_need(template_file: Path) -> None:
    """Other Ray pods, DNS, the Pod Identity agent, HTTPS and the GCS store's port inside the VPC;
    not the kubelet, instance metadata or any other port in the VPC, whatever a request names.
    Before (0a5e276): no egress policy, and a client's kv_transfer_params made decode connect to a
    listener of its choice."""
    import gzip

    from support import FIXTURES

    policy = _ray_egress(manifests(template_file))
    assert policy is not None
    rules = [
        ({p["protocol"]: p["port"] for p in rule["ports"]} if rule["ports"] else "any", rule["to"])
        for rule in policy["spec"]["egress"]
    ]
    assert rules[0] == ("any", [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "inference"}},
                                 "podSelector": {"matchLabels": {"ray.io/is-ray-node": "yes"}}}])  # fmt: skip
    assert [ports for ports, _ in rules[1:]] == [{"UDP": 53, "TCP": 53}, {"TCP": 80}, {"TCP": 443}, {"TCP": 6379}]
    assert rules[2][1] == [{"ipBlock": {"cidr": "169.254.170.23/32"}}]
    assert rules[3][1] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    assert rules[4][1] == [{"ipBlock": {"cidr": "10.0.0.0/16"}}]  # the store: inside the VPC alone
    before = FIXTURES / "lifecycle" / "before-failover-fixes" / "default.template.json.gz"
    assert _ray_egress(kubernetes_objects(json.loads(gzip.decompress(before.read_bytes())))) is None


def test_helm_values_open_nothing_to_the_outside(template: Template) -> None:
    for chart in resources(template, HELM).values():
        values = chart["Properties"].get("Values", "")
        assert "LoadBalancer" not in values and "ingress" not in values.lower()


def test_node_roles_hold_only_the_eks_node_policies(template: Template) -> None:
    template_json = template.to_json()
    for node_group in resources(template, "AWS::EKS::Nodegroup").values():
        role_id = node_group["Properties"]["NodeRole"]["Fn::GetAtt"][0]
        role = template_json["Resources"][role_id]["Properties"]
        names = {json.dumps(arn).split("policy/")[1].split('"')[0] for arn in role["ManagedPolicyArns"]}
        assert names == {
            "AmazonEKSWorkerNodePolicy",
            "AmazonEKS_CNI_Policy",
            "AmazonEC2ContainerRegistryReadOnly",
        }
        assert "Policies" not in role


def test_no_policy_grants_everything(template: Template) -> None:
    for policy in resources(template, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert not (statement["Action"] == "*" and statement.get("Resource") == "*")
    for role in resources(template, "AWS::IAM::Role").values():
        assert "AdministratorAccess" not in json.dumps(role)


def test_api_endpoint_allow_list_is_what_was_asked(stack_factory: Callable[..., PdServingStack]) -> None:
    (cluster,) = resources(
        Template.from_stack(stack_factory(endpoint_allowed_cidrs="198.51.100.0/24")), "AWS::EKS::Cluster"
    ).values()
    assert cluster["Properties"]["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["198.51.100.0/24"]


# --- limits -------------------------------------------------------------------------------
def test_template_stays_far_from_cloudformation_limits(template_file: Path) -> None:
    template = json.loads(template_file.read_text())
    size = template_file.stat().st_size
    print(f"template: {size} bytes, {len(template['Resources'])} resources")
    assert size < 800_000
    assert len(template["Resources"]) < 400


def test_each_embedded_manifest_fits_the_kubectl_handler(template_file: Path) -> None:
    # kubectl apply stores each object in the last-applied-configuration annotation (262,144
    # bytes at most); keep every object well below it.
    for obj in manifests(template_file):
        assert len(json.dumps(obj)) < 128_000, obj["kind"]


def test_no_crd_is_applied_outside_helm(template_file: Path) -> None:
    assert "CustomResourceDefinition" not in {o["kind"] for o in manifests(template_file)}


def test_helm_timeouts_stay_within_the_handler_lambda(template: Template) -> None:
    for chart in resources(template, HELM).values():
        assert chart["Properties"]["Timeout"] in ("600s", "900s")


# --- deploy / destroy order ------------------------------------------------------------------
def dependency_graph(template_json: Mapping[str, Any]) -> dict[str, set[str]]:
    """resource -> resources it needs (DependsOn, Ref, GetAtt); CloudFormation creates the
    needed ones first and deletes them last."""
    names = set(template_json["Resources"])

    def refs(node: Any) -> set[str]:
        if isinstance(node, dict):
            found = set()
            if "Ref" in node and node["Ref"] in names:
                found.add(node["Ref"])
            if "Fn::GetAtt" in node and node["Fn::GetAtt"][0] in names:
                found.add(node["Fn::GetAtt"][0])
            for value in node.values():
                found |= refs(value)
            return found
        if isinstance(node, list):
            return set().union(*map(refs, node)) if node else set()
        return set()

    graph = {}
    for name, resource in template_json["Resources"].items():
        depends = resource.get("DependsOn", [])
        graph[name] = refs(resource.get("Properties", {})) | set([depends] if isinstance(depends, str) else depends)
    return graph


def needs(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for dep in graph[stack.pop()] - seen:
            seen.add(dep)
            stack.append(dep)
    return seen


@pytest.fixture(scope="module")
def graph(template: Template) -> dict[str, set[str]]:
    return dependency_graph(template.to_json())


def test_ray_service_is_created_after_and_deleted_before_kuberay_and_the_system_nodes(
    default_stack: PdServingStack, graph: dict[str, set[str]]
) -> None:
    serving = default_stack.serving
    ray_service = needs(graph, logical_id(serving.ray_service.manifest))
    assert logical_id(serving.kuberay.chart) in ray_service
    assert logical_id(serving.eks.system_nodes) in needs(graph, logical_id(serving.kuberay.chart))
    assert logical_id(serving.gpu_nodes.nodegroup) in ray_service


def test_device_plugins_come_after_the_gpu_nodes(default_stack: PdServingStack, graph: dict[str, set[str]]) -> None:
    serving = default_stack.serving
    for chart in serving.device_plugins.charts:
        assert logical_id(serving.gpu_nodes.nodegroup) in needs(graph, logical_id(chart))


def test_node_groups_never_wait_on_kubernetes_objects(
    default_stack: PdServingStack, graph: dict[str, set[str]]
) -> None:
    serving = default_stack.serving
    k8s = {logical_id(serving.ray_service.manifest), logical_id(serving.kuberay.chart)}
    k8s |= {logical_id(c) for c in serving.device_plugins.charts}
    for node_group in (serving.eks.system_nodes, serving.gpu_nodes.nodegroup):
        assert not (needs(graph, logical_id(node_group)) & k8s)


def test_the_dependency_check_would_catch_a_missing_edge(
    default_stack: PdServingStack, graph: dict[str, set[str]]
) -> None:
    serving = default_stack.serving
    broken = {k: set(v) for k, v in graph.items()}
    for edges in broken.values():  # every path to the operator (the serve rollout's manifest is one)
        edges.discard(logical_id(serving.kuberay.chart))
    assert logical_id(serving.kuberay.chart) not in needs(broken, logical_id(serving.ray_service.manifest))


# --- stable ids of stateful resources ----------------------------------------------------------
# Changing one of these logical ids makes CloudFormation REPLACE a live resource: a new VPC,
# a new cluster (all workloads lost), new node groups, a new KMS key (secrets unreadable).
STATEFUL_IDS = {
    "AWS::EC2::VPC": {"PdServingNetworkFCADE806"},
    "AWS::EKS::Cluster": {"PdServingCluster8667F20E"},
    "AWS::EKS::Nodegroup": {
        "PdServingClusterNodegroupSystemNodeGroup96DAEDDD",
        "PdServingClusterNodegroupGpuNodeGroup322EECD2",
    },
    "AWS::KMS::Key": {
        "PdServingClusterSecretsKey424EDBC4",
        "PdServingNetworkFlowLogKey60984D8E",
        "PdServingLogsKeyCD93001E",
        "PdServingModelWeightsKey208352AB",
        "PdServingGcsStoreKeyF551786C",
    },
    # A new logical id would be a new, empty store: the head's GCS state (and the cluster) lost.
    "AWS::ElastiCache::ReplicationGroup": {"PdServingGcsStoreA77F9243"},
    "AWS::EC2::PlacementGroup": {"PdServingGpuNodesPlacementGroupD08642E2"},
}


@pytest.mark.parametrize("type_", sorted(STATEFUL_IDS))
def test_stateful_logical_ids_do_not_move(template: Template, type_: str) -> None:
    found = set(resources(template, type_))
    assert found == STATEFUL_IDS[type_], (
        f"logical ids of {type_} changed from {sorted(STATEFUL_IDS[type_])} to {sorted(found)}: "
        "on an existing deployment CloudFormation would replace the live resource. Revert the "
        "construct id/path change, or update STATEFUL_IDS only for a deliberate replacement."
    )


def test_config_is_not_part_of_the_ids(stack_factory: Callable[..., PdServingStack]) -> None:
    other = Template.from_stack(stack_factory(gpu_node_count=4, cluster_name="other", nat_gateways=2))
    for type_, ids in STATEFUL_IDS.items():
        assert set(resources(other, type_)) == ids


def test_default_config_is_what_the_ids_were_taken_from() -> None:
    assert DeploymentConfig().cluster_name == "ray-llm-multinode"


def test_every_pod_identity_role_trusts_only_its_own_service_account_on_this_cluster(template: Template) -> None:
    """Pod Identity sets session tags (cluster, namespace, service account); the trust requires them,
    so no other association in the account, on any cluster, can name the role."""
    stack = template.to_json()
    resources = stack["Resources"]
    pairs = [
        (a["Properties"]["RoleArn"]["Fn::GetAtt"][0], a["Properties"]["ClusterName"], a["Properties"]["Namespace"],
         a["Properties"]["ServiceAccount"])
        for a in resources.values() if a["Type"] == "AWS::EKS::PodIdentityAssociation"
    ] + [
        (p["RoleArn"]["Fn::GetAtt"][0], a["Properties"]["ClusterName"], "amazon-cloudwatch", p["ServiceAccount"])
        for a in resources.values() if a["Type"] == "AWS::EKS::Addon"
        for p in a["Properties"].get("PodIdentityAssociations", [])
    ]  # fmt: skip
    # The Ray workers and head and the add-on's agents (the controller and autoscaler come with options).
    assert {account for *_, account in pairs} >= {"ray-llm-workers", "ray-llm-head", "cloudwatch-agent"}
    for role_id, cluster, namespace, account in pairs:
        statements = resources[role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {
            "sts:AssumeRole", "sts:TagSession"}  # fmt: skip
        for statement in statements:
            assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
            tags = statement["Condition"]["StringEquals"]
            assert tags["aws:RequestTag/kubernetes-namespace"] == namespace, role_id
            assert tags["aws:RequestTag/kubernetes-service-account"] == account, role_id
            named = resources[cluster["Ref"]]["Properties"]["Name"]  # the cluster's own name, or its Ref
            assert tags["aws:RequestTag/eks-cluster-name"] in (cluster, named), role_id
