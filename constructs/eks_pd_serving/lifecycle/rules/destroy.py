"""Rules on what a resource needs while CloudFormation deletes it: the kubectl/Helm handlers' route
to the API and out of the VPC, every Lambda's log group, the controllers' DNS, credentials and
nodes, and the controller that holds an object's finalizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import facts, needs
from ..graph import Resource, StackModel
from .finding import Finding, needs_edge


def _kubectl_resources(model: StackModel) -> list[Resource]:
    return [r for r in model.resources.values() if r.type in facts.KUBECTL_TYPES]


def kubectl_resources_outlive_api_route(model: StackModel) -> list[Finding]:
    """Every kubectl/Helm custom resource is deleted while its Lambdas can still reach the API:
    before the ingress rule that admits them to the cluster security group."""
    found = []
    for resource in _kubectl_resources(model):
        for function in facts.provider_functions(model, resource):
            for ingress in facts.api_ingress_rules(model, function):
                found += needs_edge(
                    model,
                    "kubectl_resources_outlive_api_route",
                    resource.id,
                    ingress,
                    f"{function} reaches the private API endpoint through it",
                )
    return found


def kubectl_resources_outlive_egress(model: StackModel) -> list[Finding]:
    """...and before their subnets' default routes (the EKS and STS calls of `update-kubeconfig`,
    chart downloads)."""
    found = []
    for resource in _kubectl_resources(model):
        for function in facts.provider_functions(model, resource):
            for route in facts.default_routes(model, facts.subnets_of(model, function)):
                found += needs_edge(
                    model, "kubectl_resources_outlive_egress", resource.id, route, f"{function}'s way out of its subnet"
                )
    return found


def lambda_log_groups_outlive_their_functions(model: StackModel) -> list[Finding]:
    """Every Lambda writes to a log group of the stack that is deleted after it (so it is not
    recreated by the function's own delete-time runs, outside the stack)."""
    found = []
    for function in model.of_type(facts.FUNCTION):
        group, explicit = facts.log_group_of(model, function.id)
        if group is None:
            found.append(
                Finding(
                    "lambda_log_groups_outlive_their_functions",
                    function.id,
                    "no log group of the stack: Lambda creates one that outlives destroy",
                )
            )
        elif not model.deleted_before(function.id, group):
            how = "named after the function, so deleted before it" if not explicit else "deleted before the function"
            found.append(
                Finding(
                    "lambda_log_groups_outlive_their_functions",
                    function.id,
                    f"no dependency on {group} ({how}; recreated by the function's next run)",
                )
            )
    return found


def aws_controllers_outlive_dns(model: StackModel) -> list[Finding]:
    """A controller that calls AWS APIs while its objects are deleted keeps CoreDNS until it goes
    (or CoreDNS is preserved on delete)."""
    coredns = facts.addon(model, "coredns")
    if coredns is None or coredns.properties.get("PreserveOnDelete") is True:
        return []
    found = []
    for name in needs.AWS_CLEANUP_CONTROLLERS:
        controller = facts.helm_release(model, name)
        if controller is not None:
            found += needs_edge(
                model,
                "aws_controllers_outlive_dns",
                controller.id,
                coredns.id,
                f"{name} resolves AWS endpoints while it deletes what it created",
            )
    return found


def aws_controllers_outlive_credentials_and_nodes(model: StackModel) -> list[Finding]:
    """...and its Pod Identity association, the Pod Identity agent and the nodes it runs on."""
    found = []
    agent = facts.addon(model, "eks-pod-identity-agent")
    for name in needs.AWS_CLEANUP_CONTROLLERS:
        controller = facts.helm_release(model, name)
        if controller is None:
            continue
        rule, values = "aws_controllers_outlive_credentials_and_nodes", facts.helm_values(controller)
        account = (values.get("serviceAccount") or {}).get("name")
        associations = [
            r.id for r in model.of_type(facts.POD_IDENTITY) if r.properties.get("ServiceAccount") == account
        ]
        if not associations:
            found.append(Finding(rule, controller.id, f"no Pod Identity association for service account {account}"))
        for target in (*associations, *([agent.id] if agent else [])):
            found += needs_edge(model, rule, controller.id, target, "its AWS credentials")
        groups = facts.nodegroups_for(model, values.get("nodeSelector") or {})
        if values.get("nodeSelector") and not any(model.deleted_before(controller.id, g.id) for g in groups):
            found.append(
                Finding(rule, controller.id, f"no dependency on a node group matching {values['nodeSelector']}")
            )
    return found


def ray_clusters_outlive_no_gcs_store(model: StackModel) -> list[Finding]:
    """A RayService with GCS fault tolerance is deleted before what KubeRay's Redis cleanup Job
    needs while it runs: the store it deletes the cluster's keys from, the head's Pod Identity
    association, role policy and agent (the Job keeps the head's init containers, which read the
    store's token), the head's nodes, and, in a manifest of their own, its namespace and the head's
    service account (KubeRay v1.7.0 raycluster_controller.go, buildRedisCleanupJob: the head's pod
    template, best effort for 300 s, behind the RayCluster's finalizer; a terminating namespace
    admits no new pod, and the RayService's own ``kubectl delete`` waits for that finalizer)."""
    rule, found = "ray_clusters_outlive_no_gcs_store", []
    agent = facts.addon(model, "eks-pod-identity-agent")
    stores = [r.id for r in model.of_type(facts.GCS_STORE)]
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            cluster = (obj.body.get("spec") or {}).get("rayClusterConfig") or {}
            if obj.kind != "RayService" or "gcsFaultToleranceOptions" not in cluster:
                continue
            if not stores:
                found.append(Finding(rule, resource.id, "gcsFaultToleranceOptions without a store in the stack"))
            head = cluster["headGroupSpec"]["template"]["spec"]
            account, namespace = head.get("serviceAccountName"), obj.body["metadata"].get("namespace")
            associations = [
                r
                for r in model.of_type(facts.POD_IDENTITY)
                if (r.properties.get("ServiceAccount"), r.properties.get("Namespace")) == (account, namespace)
            ]
            if head.get("initContainers") and not associations:
                found.append(Finding(rule, resource.id, f"no Pod Identity association for service account {account}"))
            policies = [p for a in associations for p in facts.role_policies(model, a)]
            for target in (*stores, *(a.id for a in associations), *policies, *([agent.id] if agent else [])):
                found += needs_edge(model, rule, resource.id, target, "KubeRay's Redis cleanup Job uses it")
            holders = facts.manifests_holding(model)
            for key in (f"Namespace/-/{namespace}", f"ServiceAccount/{namespace}/{account}"):
                holder = holders.get(key)
                if holder == resource.id:
                    found.append(
                        Finding(rule, resource.id, f"{key} is deleted with the RayService (the cleanup Job needs it)")
                    )
                elif holder is not None:
                    found += needs_edge(model, rule, resource.id, holder, f"it applies {key}, which the Job needs")
            groups = facts.nodegroups_for(model, head.get("nodeSelector") or {})
            if not any(model.deleted_before(resource.id, g.id) for g in groups):
                found.append(
                    Finding(rule, resource.id, f"no dependency on a node group matching {head.get('nodeSelector')}")
                )
    return found


def finalized_objects_outlive_no_controller(model: StackModel) -> list[Finding]:
    """An object whose finalizer a controller removes is deleted before that controller."""
    found = []
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            for (kind, path, value), holder in needs.FINALIZER_HOLDERS.items():
                if obj.kind == kind and _at(obj.body, path) == value:
                    controller = facts.helm_release(model, holder)
                    if controller is None:
                        found.append(
                            Finding(
                                "finalized_objects_outlive_no_controller",
                                resource.id,
                                f"{obj.key} needs {holder}, which the template does not install",
                            )
                        )
                    else:
                        found += needs_edge(
                            model,
                            "finalized_objects_outlive_no_controller",
                            resource.id,
                            controller.id,
                            f"{holder} removes {obj.key}'s finalizer",
                        )
    return found


def _at(body: Mapping[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
