"""What a template's resources are to the running system, read from the template alone: which
Lambdas serve a kubectl/Helm custom resource, where they log, which rule lets them reach the API,
what a manifest puts in the cluster, which node group a pod lands on."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .graph import Resource, StackModel, named, placeholders

MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"
HELM = "Custom::AWSCDK-EKS-HelmChart"
KUBECTL_TYPES = (MANIFEST, HELM)
FUNCTION = "AWS::Lambda::Function"
LOG_GROUP = "AWS::Logs::LogGroup"
ADDON = "AWS::EKS::Addon"
NODEGROUP = "AWS::EKS::Nodegroup"
INGRESS = "AWS::EC2::SecurityGroupIngress"
CLUSTER = "AWS::EKS::Cluster"
POD_IDENTITY = "AWS::EKS::PodIdentityAssociation"
GCS_STORE = "AWS::ElastiCache::ReplicationGroup"
SUBNET = "AWS::EC2::Subnet"
API_PORT = 443


@dataclass(frozen=True)
class KubeObject:
    kind: str
    namespace: str
    name: str
    body: Mapping[str, Any]

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def kube_objects(resource: Resource) -> list[KubeObject]:
    """The objects a kubectl manifest resource applies (references as ``${Id}`` placeholders)."""
    if resource.type != MANIFEST:
        return []
    found = []
    for body in json.loads(placeholders(resource.properties["Manifest"])):
        meta = body.get("metadata", {})
        found.append(KubeObject(body["kind"], meta.get("namespace", "-"), meta.get("name", ""), body))
    return found


def manifests_holding(model: StackModel, exclude: str = "") -> dict[str, str]:
    """Object key -> the manifest resource that applies it (other than ``exclude``)."""
    return {
        obj.key: resource.id
        for resource in model.of_type(MANIFEST)
        if resource.id != exclude
        for obj in kube_objects(resource)
    }


def role_policies(model: StackModel, association: Resource) -> list[str]:
    """The ``AWS::IAM::Policy`` resources attached to a Pod Identity association's role: a policy
    nothing depends on is deleted in destroy's first wave, whatever still uses the role."""
    role_arn = association.properties.get("RoleArn")
    if not (isinstance(role_arn, dict) and "Fn::GetAtt" in role_arn):
        return []
    role = role_arn["Fn::GetAtt"][0]
    return sorted(r.id for r in model.of_type("AWS::IAM::Policy") if {"Ref": role} in (r.properties.get("Roles") or []))


def helm_values(resource: Resource) -> dict[str, Any]:
    values = placeholders(resource.properties.get("Values"))
    return dict(json.loads(values)) if values else {}


def release(resource: Resource) -> str | None:
    return str(resource.properties["Release"]) if resource.type == HELM else None


def helm_release(model: StackModel, name: str) -> Resource | None:
    return next((r for r in model.of_type(HELM) if release(r) == name), None)


def addon(model: StackModel, name: str) -> Resource | None:
    return next((r for r in model.of_type(ADDON) if r.properties.get("AddonName") == name), None)


def addon_configuration(resource: Resource) -> dict[str, Any]:
    values = placeholders(resource.properties.get("ConfigurationValues"))
    return dict(json.loads(values)) if values else {}


def _function_ids(model: StackModel, value: Any) -> Iterator[str]:
    """Functions a property names by Ref or GetAtt (a ServiceToken, an environment variable)."""
    text = json.dumps(placeholders(value))
    for resource_id in model.edges:
        if model.resources[resource_id].type == FUNCTION and "${" + resource_id in text:
            yield resource_id


def provider_functions(model: StackModel, resource: Resource) -> list[str]:
    """The Lambdas that run when CloudFormation creates, updates or deletes a custom resource:
    the one its ServiceToken names and every function that one calls (named in its environment)."""
    pending = list(_function_ids(model, resource.properties.get("ServiceToken")))
    found: list[str] = []
    while pending:
        function = pending.pop()
        if function in found:
            continue
        found.append(function)
        pending += _function_ids(model, model.resources[function].properties.get("Environment"))
    return sorted(found)


def log_group_of(model: StackModel, function: str) -> tuple[str | None, bool]:
    """(the stack's log group a function writes to, whether the function names it itself).

    A function names its group in ``LoggingConfig.LogGroup``; otherwise Lambda writes to
    ``/aws/lambda/<function name>``, which a group of the stack may carry (a group named after the
    function depends on it, so it is deleted first)."""
    props = model.resources[function].properties
    given = (props.get("LoggingConfig") or {}).get("LogGroup")
    if given is not None:
        target = named(str(placeholders(given)))
        if target in model.resources and model.resources[target].type == LOG_GROUP:
            return target, True
        literal = str(placeholders(given))
        for group in model.of_type(LOG_GROUP):
            if placeholders(group.properties.get("LogGroupName")) == literal:
                return group.id, True
        return None, True
    default_name = "/aws/lambda/${" + function + "}"
    for group in model.of_type(LOG_GROUP):
        if placeholders(group.properties.get("LogGroupName")) == default_name:
            return group.id, False
    return None, False


def security_groups_of(model: StackModel, function: str) -> list[str]:
    groups = (model.resources[function].properties.get("VpcConfig") or {}).get("SecurityGroupIds", [])
    return sorted({n for n in (named(str(placeholders(g))) for g in groups) if n})


def subnets_of(model: StackModel, function: str) -> list[str]:
    subnets = (model.resources[function].properties.get("VpcConfig") or {}).get("SubnetIds", [])
    return sorted({n for n in (named(str(placeholders(s))) for s in subnets) if n})


def api_ingress_rules(model: StackModel, function: str) -> list[str]:
    """Ingress rules into an EKS cluster's security group on the API port from the function's
    security groups: its route to the private API endpoint."""
    groups = set(security_groups_of(model, function))
    clusters = {r.id for r in model.of_type(CLUSTER)}
    found = []
    for rule in model.of_type(INGRESS):
        props = rule.properties
        source = named(str(placeholders(props.get("SourceSecurityGroupId", ""))))
        target = str(placeholders(props.get("GroupId", "")))
        covers = int(props.get("FromPort", -1)) <= API_PORT <= int(props.get("ToPort", -1)) or props.get(
            "IpProtocol"
        ) in ("-1", -1)
        if source in groups and covers and any(target == "${" + c + ".ClusterSecurityGroupId}" for c in clusters):
            found.append(rule.id)
    return found


def default_routes(model: StackModel, subnets: list[str]) -> list[str]:
    """The 0.0.0.0/0 routes of the route tables these subnets are associated with (the NAT path
    the provider Lambdas take to the EKS and STS APIs and to chart repositories)."""
    tables = set()
    for association in model.of_type("AWS::EC2::SubnetRouteTableAssociation"):
        props = association.properties
        if named(str(placeholders(props.get("SubnetId", "")))) in subnets:
            tables.add(named(str(placeholders(props.get("RouteTableId", "")))))
    return sorted(
        route.id
        for route in model.of_type("AWS::EC2::Route")
        if route.properties.get("DestinationCidrBlock") == "0.0.0.0/0"
        and named(str(placeholders(route.properties.get("RouteTableId", "")))) in tables
    )


def nodegroups_for(model: StackModel, node_selector: Mapping[str, str]) -> list[Resource]:
    """Node groups whose labels satisfy a nodeSelector (labels EKS sets on every node, such as
    ``kubernetes.io/os``, are taken as present)."""
    own = {k: v for k, v in node_selector.items() if not k.startswith("kubernetes.io/")}
    return [
        group
        for group in model.of_type(NODEGROUP)
        if all((group.properties.get("Labels") or {}).get(k) == v for k, v in own.items())
    ]


def placed_on(model: StackModel, node_selector: Mapping[str, str] | None) -> list[Resource]:
    """The node groups pods with this nodeSelector may land on; none without a selector (such pods
    may land anywhere, which no rule counts as placed)."""
    return nodegroups_for(model, node_selector) if node_selector else []


def fixed_size(group: Resource) -> bool:
    """Whether a node group's size is pinned (min = max): no autoscaler removes its nodes."""
    scaling = group.properties.get("ScalingConfig") or {}
    return scaling.get("MinSize") is not None and scaling.get("MinSize") == scaling.get("MaxSize")


def subnet_cidr(model: StackModel, subnet: str) -> str | None:
    resource = model.resources.get(subnet)
    if resource is None or resource.type != SUBNET:
        return None
    cidr = resource.properties.get("CidrBlock")
    return cidr if isinstance(cidr, str) else None
