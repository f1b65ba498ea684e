"""The endpoint and the Ray lock-down: the internal NLB through the AWS Load Balancer
Controller, its deploy and destroy order, and the NetworkPolicies closing the Ray head."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from typing import Any

import kubernetes_validate
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template
from support import build_stack, new_app

from eks_pd_serving import versions
from eks_pd_serving._private.policies import published_policy
from eks_pd_serving.assembly import helm_releases, kubernetes_objects
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.k8s.network import NLB_CLASS, RAY_NODE_LABELS
from eks_pd_serving.layout import SYSTEM_NODE_LABELS
from eks_pd_serving.pd_serving import PdServing

KUBERNETES_SCHEMA = f"{versions.DEFAULT_KUBERNETES_VERSION}.0"
# docs/install/iam_policy.json at kubernetes-sigs/aws-load-balancer-controller tag v3.5.0.
POLICY_SHA256 = "16f232c9d9f79366fe949c4550ad517a202380058a9e48d45a4e215044a20a6a"


@pytest.fixture(scope="module")
def internal() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(endpoint_exposure="internal")).to_json())


@pytest.fixture(scope="module")
def default(template: Template) -> dict[str, Any]:
    return dict(template.to_json())


def _objects(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in kubernetes_objects(template) if o["kind"] == kind}


def _logical_id(template: dict[str, Any], type_: str, fragment: str) -> str:
    (found,) = [str(k) for k, v in template["Resources"].items() if v["Type"] == type_ and fragment in k]
    return found


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _depends_on(template: dict[str, Any], logical_id: str) -> set[str]:
    return set(template["Resources"][logical_id].get("DependsOn", []))


# --- exposure: the controller, its identity, the Service ------------------------------------
def test_port_forward_adds_no_load_balancer(default: dict[str, Any]) -> None:
    assert "aws-load-balancer-controller" not in helm_releases(default)
    assert not any(o["spec"].get("type") == "LoadBalancer" for o in _objects(default, "Service").values())
    associations = [r for r in default["Resources"].values() if r["Type"] == "AWS::EKS::PodIdentityAssociation"]
    # The weights' readers and the head (the GCS store's token); no controller's.
    assert sorted(a["Properties"]["ServiceAccount"] for a in associations) == ["ray-llm-head", "ray-llm-workers"]


def test_internal_installs_the_pinned_controller_on_the_system_nodes(internal: dict[str, Any]) -> None:
    release = helm_releases(internal)["aws-load-balancer-controller"]
    assert (release["chart"], release["version"], release["repository"], release["namespace"]) == (
        "aws-load-balancer-controller",
        "3.5.0",
        "https://aws.github.io/eks-charts",
        "kube-system",
    )
    values = release["values"]
    assert values["clusterName"] == f"<{_logical_id(internal, 'AWS::EKS::Cluster', 'Cluster')}>"
    assert values["serviceAccount"] == {"create": True, "name": "aws-load-balancer-controller"}
    assert values["enableServiceMutatorWebhook"] is False
    assert values["nodeSelector"] == SYSTEM_NODE_LABELS
    assert values["vpcId"].startswith("<PdServingNetwork")  # the stack's VPC, not discovered through instance metadata


def test_the_controller_gets_its_releases_policy_through_pod_identity(internal: dict[str, Any]) -> None:
    resources = internal["Resources"]
    (association,) = [
        r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation" and r["Properties"]["Namespace"] == "kube-system"
    ]
    assert (association["Namespace"], association["ServiceAccount"]) == ("kube-system", "aws-load-balancer-controller")
    role = resources[association["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    trust = role["AssumeRolePolicyDocument"]["Statement"]
    assert {a for s in trust for a in _listed(s["Action"])} == {
        "sts:AssumeRole",
        "sts:TagSession",
    }
    assert {s["Principal"]["Service"] for s in trust} == {"pods.eks.amazonaws.com"}
    (policy,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::IAM::ManagedPolicy"]
    # Byte for byte what the release publishes.
    assert policy["PolicyDocument"] == published_policy(versions.AWS_LOAD_BALANCER_CONTROLLER_POLICY)
    assert role["ManagedPolicyArns"] == [{"Ref": _logical_id(internal, "AWS::IAM::ManagedPolicy", "LoadBalancer")}]


def test_the_shipped_policy_is_the_pinned_releases_file() -> None:
    """A hand edit changes the digest; a controller bump must bring its release's file."""
    path = versions.AWS_LOAD_BALANCER_CONTROLLER_POLICY
    assert path.endswith(f"v{versions.AWS_LOAD_BALANCER_CONTROLLER_CHART.version}.json")
    from importlib import resources

    data = resources.files("eks_pd_serving").joinpath(path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == POLICY_SHA256
    actions = {
        a
        for s in published_policy(versions.AWS_LOAD_BALANCER_CONTROLLER_POLICY)["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert "elasticloadbalancing:CreateLoadBalancer" in actions and "ec2:AuthorizeSecurityGroupIngress" in actions


def test_the_endpoint_service_asks_for_an_internal_nlb_with_ip_targets(internal: dict[str, Any]) -> None:
    service = _objects(internal, "Service")["ray-llm-endpoint"]
    annotations = service["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    attributes = annotations["service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"]
    assert attributes == "preserve_client_ip.enabled=false"  # the source the serve-port policy admits
    private = [k for k, r in internal["Resources"].items() if r["Type"] == "AWS::EC2::Subnet" and "PrivateSubnet" in k]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-subnets"].split(",") == [f"<{k}>" for k in private]
    spec = service["spec"]
    assert (spec["type"], spec["loadBalancerClass"]) == ("LoadBalancer", NLB_CLASS)
    assert spec["loadBalancerSourceRanges"] == ["10.0.0.0/16"]  # default: the VPC
    assert spec["ports"] == [{"name": "http", "port": 80, "targetPort": 8000}]
    assert spec["selector"] == {**RAY_NODE_LABELS, "ray.io/node-type": "head", "ray.io/serve": "true"}


def test_client_cidrs_reach_the_load_balancer_and_the_serve_port() -> None:
    template = dict(
        Template.from_stack(
            build_stack(endpoint_exposure="internal", endpoint_client_cidrs="192.168.0.0/16,172.16.5.0/24")
        ).to_json()
    )
    service = _objects(template, "Service")["ray-llm-endpoint"]
    assert service["spec"]["loadBalancerSourceRanges"] == ["192.168.0.0/16", "172.16.5.0/24"]
    serve = _objects(template, "NetworkPolicy")["ray-serve-from-clients"]
    blocks = [p["ipBlock"]["cidr"] for rule in serve["spec"]["ingress"] for p in rule["from"] if "ipBlock" in p]
    # The pods see the NLB's own addresses (client IP preservation off): its subnets, not the
    # clients (the NLB's security group admits those) and not the rest of the VPC.
    assert blocks == ["10.0.32.0/19", "10.0.64.0/19"]
    # ... and only on the head, the NLB's one target: every pod's IP is in those subnets, so on the
    # GPU workers the rule admitted the whole cluster.
    assert serve["spec"]["podSelector"] == {"matchLabels": {"ray.io/is-ray-node": "yes", "ray.io/node-type": "head"}}
    assert {(r["metadata"]["name"], tuple(r["spec"]["podSelector"].get("matchLabels", {}).items())) for r in
            _objects(template, "NetworkPolicy").values() if any(
                p.get("port") == 8000 for rule in r["spec"].get("ingress", []) for p in rule.get("ports", []))} == {
        ("ray-serve-from-clients", (("ray.io/is-ray-node", "yes"), ("ray.io/node-type", "head"))),
        ("ray-from-operator", (("ray.io/is-ray-node", "yes"),)),
    }  # fmt: skip


def test_an_internal_endpoint_output_tells_how_to_read_the_nlb_address(internal: dict[str, Any]) -> None:
    command = internal["Outputs"]["InternalEndpointAddressCommand"]["Value"]
    assert command.startswith("kubectl -n inference get service ray-llm-endpoint -o jsonpath=")


# --- order: deploy and destroy ----------------------------------------------------------------
def test_deploy_and_destroy_order(internal: dict[str, Any]) -> None:
    """CloudFormation deletes in reverse: the Service (waiting for the controller's finalizer,
    that is for the NLB to go) before the controller, the controller before the nodes."""
    endpoint = _logical_id(internal, "Custom::AWSCDK-EKS-KubernetesResource", "InternalEndpoint")
    controller = _logical_id(internal, "Custom::AWSCDK-EKS-HelmChart", "LoadBalancerController")
    ray_service = _logical_id(internal, "Custom::AWSCDK-EKS-KubernetesResource", "RayServiceChart")
    policies = _logical_id(internal, "Custom::AWSCDK-EKS-KubernetesResource", "ServingNetworkChart")
    association = _logical_id(internal, "AWS::EKS::PodIdentityAssociation", "LoadBalancer")
    system_nodes = _logical_id(internal, "AWS::EKS::Nodegroup", "SystemNodeGroup")
    assert {controller, ray_service} <= _depends_on(internal, endpoint)
    coredns = [k for k, v in internal["Resources"].items() if v["Properties"].get("AddonName") == "coredns"]
    assert {association, system_nodes, *coredns} <= _depends_on(internal, controller)
    assert ray_service in _depends_on(internal, policies)
    # Nothing waits on the Service: it is the first thing destroy removes.
    assert not [k for k, v in internal["Resources"].items() if endpoint in v.get("DependsOn", [])]


# --- the VPC CNI enforces the policies; the namespace states what it admits -------------------
def test_the_vpc_cni_enforces_network_policies(default: dict[str, Any]) -> None:
    addons = [r["Properties"] for r in default["Resources"].values() if r["Type"] == "AWS::EKS::Addon"]
    (cni,) = [a for a in addons if a["AddonName"] == "vpc-cni"]
    assert json.loads(cni["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}


def test_the_namespace_admits_privileged_pods_and_says_why(default: dict[str, Any]) -> None:
    labels = _objects(default, "Namespace")["inference"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # EFA workers are privileged
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "baseline"


# --- what the policies admit, evaluated with NetworkPolicy's own rules ------------------------
HEAD = {"namespace": "inference", "labels": {**RAY_NODE_LABELS, "ray.io/node-type": "head"}}
WORKER = {"namespace": "inference", "labels": {**RAY_NODE_LABELS, "ray.io/node-type": "worker"}}
OPERATOR = {"namespace": "kuberay-system", "labels": {"app.kubernetes.io/name": "kuberay-operator"}}
OTHER_POD = {"namespace": "default", "labels": {"app": "anything"}}
PEER_IN_NAMESPACE = {"namespace": "inference", "labels": {"app": "client"}}
NLB_ADDRESS = {"ip": "10.0.33.17"}  # in a private subnet, where the NLB is placed
VPC_ELSEWHERE = {"ip": "10.0.0.17"}  # a public subnet of the same VPC
OUTSIDE = {"ip": "203.0.113.9"}


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(peer: dict[str, Any], policy_ns: str, source: dict[str, Any]) -> bool:
    if "ipBlock" in peer:
        return "ip" in source and ipaddress.ip_address(source["ip"]) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if "ip" in source:
        return False
    ns_ok = (
        _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": source["namespace"]})
        if "namespaceSelector" in peer
        else source["namespace"] == policy_ns
    )
    return ns_ok and _matches(peer.get("podSelector", {}), source["labels"])


def admitted(policies: list[dict[str, Any]], target: dict[str, Any], source: dict[str, Any], port: int) -> bool:
    """Kubernetes semantics: a pod selected by any ingress policy admits only what one of them
    allows (rules are unions; no ports means every port); an unselected pod admits everything."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target["namespace"] and _matches(p["spec"]["podSelector"], target["labels"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if (not ports or port in ports) and any(
                _peer_matches(peer, policy["metadata"]["namespace"], source) for peer in rule["from"]
            ):
                return True
    return False


RAY_CONTROL_PORTS = (6379, 8265, 10001, 8080)


@pytest.mark.parametrize("exposure", ["port-forward", "internal"])
def test_only_the_ray_cluster_reaches_the_heads_control_ports(
    exposure: str, default: dict[str, Any], internal: dict[str, Any]
) -> None:
    policies = list(_objects(default if exposure == "port-forward" else internal, "NetworkPolicy").values())
    for port in RAY_CONTROL_PORTS:
        assert admitted(policies, HEAD, WORKER, port)
        for stranger in (OTHER_POD, PEER_IN_NAMESPACE, NLB_ADDRESS, OUTSIDE):
            assert not admitted(policies, HEAD, stranger, port), (stranger, port)
    assert admitted(policies, HEAD, OPERATOR, 8265)  # KubeRay reads Serve's status there
    assert admitted(policies, HEAD, OPERATOR, 8000)  # and probes the proxy to set ray.io/serve
    assert not admitted(policies, HEAD, OPERATOR, 6379)
    assert admitted(policies, HEAD, PEER_IN_NAMESPACE, 8000)
    assert not admitted(policies, HEAD, OTHER_POD, 8000)
    assert admitted(policies, HEAD, NLB_ADDRESS, 8000) is (exposure == "internal")
    assert not admitted(policies, HEAD, VPC_ELSEWHERE, 8000)
    assert not admitted(policies, HEAD, OUTSIDE, 8000)


def test_the_evaluator_sees_a_broken_policy_set() -> None:
    """Without the default deny and with an open rule, strangers get in: the checks above can fail."""
    open_rule = {
        "metadata": {"name": "open", "namespace": "inference"},
        "spec": {"podSelector": {"matchLabels": RAY_NODE_LABELS}, "ingress": [{"from": [{"namespaceSelector": {}}]}]},
    }
    assert admitted([open_rule], HEAD, OTHER_POD, 6379)
    assert admitted([], HEAD, OUTSIDE, 6379)


# --- every new object is valid Kubernetes 1.35 ------------------------------------------------
def test_new_objects_validate_against_the_kubernetes_schema(internal: dict[str, Any]) -> None:
    new = [o for o in kubernetes_objects(internal) if o["kind"] in ("NetworkPolicy", "Service", "Namespace")]
    # Namespace, Service, six NetworkPolicies (the metrics scraper's with observability; the Ray
    # pods' egress).
    assert {o["kind"] for o in new} == {"NetworkPolicy", "Service", "Namespace"} and len(new) == 8
    for obj in new:
        kubernetes_validate.validate(obj, desired_version=KUBERNETES_SCHEMA, strict=True)


def test_a_broken_object_fails_the_schema() -> None:
    broken = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "x", "namespace": "inference"},
        # "fromm": a misspelt field the API server would silently drop, opening the port to all.
        "spec": {"podSelector": {}, "ingress": [{"fromm": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, desired_version=KUBERNETES_SCHEMA, strict=True)


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"endpoint_exposure": "public"}, "endpoint_exposure"),
        ({"endpoint_exposure": "internal", "endpoint_client_cidrs": "10.0.0.0/33"}, "is not an IPv4 network"),
        ({"endpoint_exposure": "internal", "endpoint_client_cidrs": "fd00::/8"}, "is IPv6"),
        ({"endpoint_client_cidrs": "10.1.0.0/16"}, "has no effect with endpoint_exposure='port-forward'"),
        ({"endpoint_exposure": "internal", "region": "us-gov-west-1"}, "commercial-partition"),
    ],
)
def test_bad_endpoint_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DeploymentConfig.create(**settings)


def test_internal_with_a_vpc_whose_cidr_is_unknown_is_refused() -> None:
    app = new_app()
    from aws_cdk import Stack

    stack = Stack(app, "Brought", env={"account": "123456789012", "region": "us-east-1"})
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-1", availability_zones=["us-east-1a", "us-east-1b"],
        private_subnet_ids=["subnet-1", "subnet-2"],
    )  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"^endpoint_exposure='internal' needs the IPv4 CIDR of private subnet subnet-1"
    ):
        PdServing(stack, "PdServing", config=DeploymentConfig.create(endpoint_exposure="internal"), vpc=vpc)


def test_a_brought_vpc_with_subnets_in_a_secondary_cidr_admits_those_subnets() -> None:
    app = new_app()
    from aws_cdk import Stack

    stack = Stack(app, "Brought", env={"account": "123456789012", "region": "us-east-1"})
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-0123456789abcdef0", availability_zones=["us-east-1a", "us-east-1b"],
        vpc_cidr_block="10.0.0.0/16",
        private_subnet_ids=["subnet-00000000000000000", "subnet-00000000000000001"],
        private_subnet_route_table_ids=["rtb-00000000000000000", "rtb-00000000000000001"],
        private_subnet_ipv4_cidr_blocks=["100.64.0.0/20", "100.64.16.0/20"],
    )  # fmt: skip
    PdServing(stack, "PdServing", config=DeploymentConfig.create(endpoint_exposure="internal"), vpc=vpc)
    template = dict(Template.from_stack(stack).to_json())
    serve = _objects(template, "NetworkPolicy")["ray-serve-from-clients"]
    blocks = [p["ipBlock"]["cidr"] for rule in serve["spec"]["ingress"] for p in rule["from"] if "ipBlock" in p]
    assert blocks == ["100.64.0.0/20", "100.64.16.0/20"]
    assert _objects(template, "Service")["ray-llm-endpoint"]["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/16"]
