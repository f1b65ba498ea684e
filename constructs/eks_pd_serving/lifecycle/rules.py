"""Lifecycle rules: small named functions over ``StackModel``, each returning what is wrong as
findings that name the rule, the resource and the missing edge (or fact).

Template rules take one model; pair rules take the templates before and after a setting flips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import INSTANCE_TYPES
from ..layout import SYSTEM_NODE_LABELS
from ..observability import ADDON_NAME as CLOUDWATCH_ADDON
from ..observability import CLUSTER_SCRAPER_AGENT
from . import facts, needs
from .graph import Resource, StackModel, named

SERVE_PORT = 8000


@dataclass(frozen=True, order=True)
class Finding:
    rule: str
    resource: str
    missing: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.resource}: {self.missing}"


def _kubectl_resources(model: StackModel) -> list[Resource]:
    return [r for r in model.resources.values() if r.type in facts.KUBECTL_TYPES]


def _needs_edge(model: StackModel, rule: str, resource: str, target: str, why: str) -> list[Finding]:
    if model.deleted_before(resource, target):
        return []
    return [Finding(rule, resource, f"no dependency on {target} ({why})")]


def kubectl_resources_outlive_api_route(model: StackModel) -> list[Finding]:
    """Every kubectl/Helm custom resource is deleted while its Lambdas can still reach the API:
    before the ingress rule that admits them to the cluster security group."""
    found = []
    for resource in _kubectl_resources(model):
        for function in facts.provider_functions(model, resource):
            for ingress in facts.api_ingress_rules(model, function):
                found += _needs_edge(
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
                found += _needs_edge(
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
            found += _needs_edge(
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
            found += _needs_edge(model, rule, controller.id, target, "its AWS credentials")
        groups = facts.nodegroups_for(model, values.get("nodeSelector") or {})
        if values.get("nodeSelector") and not any(model.deleted_before(controller.id, g.id) for g in groups):
            found.append(
                Finding(rule, controller.id, f"no dependency on a node group matching {values['nodeSelector']}")
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
                        found += _needs_edge(
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


def rendered_agents(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The add-on's agents its chart renders: the cluster scraper only with otelContainerInsights
    (amazon-cloudwatch-observability 6.4.0, templates/linux/cloudwatch-agent-custom-resource.yaml)."""
    otel = bool((config.get("otelContainerInsights") or {}).get("enabled"))
    return [a for a in config.get("agents", []) if otel or a.get("name") != CLUSTER_SCRAPER_AGENT]


def _cluster_autoscaled(model: StackModel) -> bool:
    return facts.helm_release(model, "cluster-autoscaler") is not None


def _pinned(model: StackModel, node_selector: Mapping[str, str] | None) -> bool:
    groups = facts.nodegroups_for(model, node_selector or {})
    return bool(node_selector) and bool(groups) and all(facts.fixed_size(g) for g in groups)


def no_unmovable_pods_on_autoscaled_nodes(model: StackModel) -> list[Finding]:
    """With the Cluster Autoscaler, every Deployment the stack configures is pinned to fixed-size
    node groups: the CloudWatch add-on's pods mount hostPath volumes, and the autoscaler (with
    ``--skip-nodes-with-local-storage``, on by default in 1.35) never removes a node running one,
    so a GPU node holding one would never scale down."""
    if not _cluster_autoscaled(model):
        return []
    found = []
    rule = "no_unmovable_pods_on_autoscaled_nodes"
    cloudwatch = facts.addon(model, CLOUDWATCH_ADDON)
    if cloudwatch is not None:
        config = facts.addon_configuration(cloudwatch)
        if not _pinned(model, (config.get("manager") or {}).get("nodeSelector")):
            found.append(
                Finding(
                    rule,
                    cloudwatch.id,
                    "manager (the add-on's operator) has no nodeSelector for a fixed-size node group",
                )
            )
        for agent in rendered_agents(config):
            if agent.get("mode", "daemonset") != "daemonset" and not _pinned(model, agent.get("nodeSelector")):
                found.append(
                    Finding(
                        rule,
                        cloudwatch.id,
                        f"agent {agent['name']} ({agent['mode']}) has no nodeSelector for a fixed-size node group",
                    )
                )
    for chart in model.of_type(facts.HELM):
        name = facts.release(chart)
        deployment = name in needs.HELM_DEFAULT_CPU_M or name == "cluster-autoscaler"
        if deployment and not _pinned(model, facts.helm_values(chart).get("nodeSelector")):
            found.append(Finding(rule, chart.id, f"{name} has no nodeSelector for a fixed-size node group"))
    return found


def _selectors(model: StackModel, resource: Resource) -> list[tuple[str, Mapping[str, str]]]:
    """(what, nodeSelector) for the pods a kubectl/Helm resource or an add-on's configuration places."""
    if resource.type == facts.HELM:
        selector = facts.helm_values(resource).get("nodeSelector")
        return [(f"{facts.release(resource)}", selector)] if selector else []
    if resource.type == facts.ADDON:
        config = facts.addon_configuration(resource)
        found = [("manager", (config.get("manager") or {}).get("nodeSelector"))]
        found += [(str(a.get("name")), a.get("nodeSelector")) for a in rendered_agents(config)]
        return [(what, selector) for what, selector in found if selector]
    found = []
    for obj in facts.kube_objects(resource):
        if obj.kind == "RayService":
            cluster = obj.body["spec"]["rayClusterConfig"]
            groups = [("head", cluster["headGroupSpec"])]
            groups += [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
            found += [(f"{obj.key} {name}", g["template"]["spec"].get("nodeSelector") or {}) for name, g in groups]
    return [(what, selector) for what, selector in found if selector]


def workloads_follow_their_nodes(model: StackModel) -> list[Finding]:
    """Whatever places pods on a node group depends on it: created once the nodes exist (a Helm
    `--wait` or an add-on would time out otherwise), deleted while they still run its pods."""
    found = []
    for resource in model.resources.values():
        if resource.type not in (*facts.KUBECTL_TYPES, facts.ADDON):
            continue
        for what, selector in _selectors(model, resource):
            groups = facts.nodegroups_for(model, selector)
            if not groups:
                found.append(
                    Finding(
                        "workloads_follow_their_nodes", resource.id, f"{what}: no node group matches {dict(selector)}"
                    )
                )
            found += [
                Finding(
                    "workloads_follow_their_nodes", resource.id, f"{what}: no dependency on {g.id} (its pods run there)"
                )
                for g in groups
                if not model.deleted_before(resource.id, g.id)
            ]
    return found


def _cpu_m(quantity: Any) -> int:
    text = str(quantity)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def _requests_cpu_m(resources: Mapping[str, Any] | None, default: int = 0) -> int:
    requests = (resources or {}).get("requests") or (resources or {}).get("limits") or {}
    return _cpu_m(requests["cpu"]) if "cpu" in requests else default


def ray_heads(model: StackModel) -> list[tuple[str, Mapping[str, Any]]]:
    """(manifest id, RayService spec) for every RayService the template applies."""
    return [
        (resource.id, obj.body["spec"])
        for resource in model.of_type(facts.MANIFEST)
        for obj in facts.kube_objects(resource)
        if obj.kind == "RayService"
    ]


def head_cpu_m(spec: Mapping[str, Any]) -> int:
    cluster = spec["rayClusterConfig"]
    pod = cluster["headGroupSpec"]["template"]["spec"]
    total = sum(_requests_cpu_m(c.get("resources")) for c in pod["containers"])
    if cluster.get("enableInTreeAutoscaling"):
        options = cluster.get("autoscalerOptions") or {}
        total += _requests_cpu_m(options.get("resources"), needs.RAY_AUTOSCALER_DEFAULT_CPU_M)
    return total


@dataclass(frozen=True)
class NodeBudget:
    groups: tuple[str, ...]
    allocatable_m: int
    requested_m: int
    lines: tuple[str, ...]


def system_budget(model: StackModel) -> NodeBudget | None:
    """CPU requested on the system node groups (``role=system``: fixed size, never scaled)
    against what their nodes hold."""
    groups = facts.nodegroups_for(model, SYSTEM_NODE_LABELS)
    if not groups:
        return None
    ids = {g.id for g in groups}

    def here(selector: Mapping[str, str] | None) -> bool:
        matching = {g.id for g in facts.nodegroups_for(model, selector or {})}
        return bool(selector) and bool(matching) and matching <= ids

    nodes = sum(int(g.properties["ScalingConfig"]["MinSize"]) for g in groups)
    allocatable = 0
    for group in groups:
        instance_facts = INSTANCE_TYPES.get(str((group.properties.get("InstanceTypes") or ["?"])[0]))
        if instance_facts is None:
            return None
        allocatable += int(group.properties["ScalingConfig"]["MinSize"]) * needs.allocatable_cpu_m(instance_facts.vcpus)
    lines: list[tuple[str, int]] = []
    for manifest, spec in ray_heads(model):
        if here(spec["rayClusterConfig"]["headGroupSpec"]["template"]["spec"].get("nodeSelector")):
            lines.append((f"Ray head ({manifest})", head_cpu_m(spec)))
    for chart in model.of_type(facts.HELM):
        name, values = facts.release(chart), facts.helm_values(chart)
        if name and here(values.get("nodeSelector")):
            replicas = int(values.get("replicaCount", needs.HELM_DEFAULT_REPLICAS.get(name, 1)))
            cpu = _requests_cpu_m(values.get("resources"), needs.HELM_DEFAULT_CPU_M.get(name, 0))
            lines.append((f"{name} x{replicas}", replicas * cpu))
    cloudwatch = facts.addon(model, CLOUDWATCH_ADDON)
    if cloudwatch is not None:
        config = facts.addon_configuration(cloudwatch)
        lines.append((f"CloudWatch node agent and Fluent Bit x{nodes}", nodes * needs.CLOUDWATCH_DAEMONSET_CPU_M))
        if here((config.get("manager") or {}).get("nodeSelector")):
            lines.append(("CloudWatch add-on manager", needs.CLOUDWATCH_MANAGER_CPU_M))
        for agent in rendered_agents(config):
            if agent.get("mode", "daemonset") != "daemonset" and here(agent.get("nodeSelector")):
                cpu = _requests_cpu_m(agent.get("resources"), needs.CLOUDWATCH_AGENT_CPU_M)
                lines.append((f"CloudWatch {agent['name']}", cpu))
    for addon_name, cpu in needs.EKS_ADDON_CPU_M.items():
        if facts.addon(model, addon_name) is not None:
            per_node = addon_name != "coredns"
            lines.append((addon_name + (f" x{nodes}" if per_node else ""), cpu * (nodes if per_node else 1)))
    return NodeBudget(
        groups=tuple(sorted(ids)),
        allocatable_m=allocatable,
        requested_m=sum(cpu for _, cpu in lines),
        lines=tuple(f"{what}: {cpu}m" for what, cpu in lines),
    )


def system_nodes_hold_their_pods(model: StackModel) -> list[Finding]:
    """What is pinned to the fixed-size (system) node groups fits their allocatable CPU."""
    budget = system_budget(model)
    if budget is None or budget.requested_m <= budget.allocatable_m:
        return []
    return [
        Finding(
            "system_nodes_hold_their_pods",
            ",".join(budget.groups),
            f"{budget.requested_m}m CPU requested, {budget.allocatable_m}m allocatable ({'; '.join(budget.lines)})",
        )
    ]


def new_cluster_upgrade_fits(model: StackModel) -> list[Finding]:
    """A RayService upgraded with NewCluster (KubeRay's default when unset) needs a second head
    beside the first until the switch: the head's nodes must hold both."""
    budget = system_budget(model)
    found = []
    for manifest, spec in ray_heads(model):
        strategy = (spec.get("upgradeStrategy") or {}).get("type", "NewCluster")
        if strategy == "NewCluster" and budget is not None:
            need = budget.requested_m + head_cpu_m(spec)
            if need > budget.allocatable_m:
                found.append(
                    Finding(
                        "new_cluster_upgrade_fits",
                        manifest,
                        f"a second Ray head ({head_cpu_m(spec)}m) does not fit beside the first: {need}m "
                        f"CPU needed, {budget.allocatable_m}m allocatable on {','.join(budget.groups)}",
                    )
                )
    return found


def serve_port_admits_nlb_subnets(model: StackModel) -> list[Finding]:
    """With an NLB in front (client IP preservation off), the serve port's NetworkPolicy admits
    exactly the NLB subnets' CIDRs: those are the sources its health checks and requests come from."""
    subnets: list[str] = []
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            annotations = obj.body.get("metadata", {}).get("annotations") or {}
            listed = annotations.get("service.beta.kubernetes.io/aws-load-balancer-subnets")
            if obj.kind == "Service" and listed:
                subnets += [s.strip() for s in str(listed).split(",")]
    if not subnets:
        return []
    cidrs = {}
    for subnet in subnets:
        target = named(subnet)
        cidr = facts.subnet_cidr(model, target) if target else None
        if cidr is None:
            return []  # a brought VPC's subnets: their CIDRs are not in the template
        cidrs[subnet] = cidr
    found = []
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            if obj.kind != "NetworkPolicy":
                continue
            admitted = set(_ip_blocks_on_port(obj.body, SERVE_PORT))
            if not admitted:
                continue
            rule = "serve_port_admits_nlb_subnets"
            found += [
                Finding(rule, resource.id, f"{obj.key} does not admit NLB subnet {s} ({c})")
                for s, c in cidrs.items()
                if c not in admitted
            ]
            found += [
                Finding(rule, resource.id, f"{obj.key} admits {c} beyond the NLB subnets")
                for c in sorted(admitted - set(cidrs.values()))
            ]
    return found


def _ip_blocks_on_port(policy: Mapping[str, Any], port: int) -> list[str]:
    blocks = []
    for rule in (policy.get("spec") or {}).get("ingress") or []:
        ports = [p.get("port") for p in rule.get("ports") or []]
        if port in ports:
            blocks += [peer["ipBlock"]["cidr"] for peer in rule.get("from") or [] if "ipBlock" in peer]
    return blocks


def named_log_groups_preflighted(model: StackModel, preflighted: Iterable[str]) -> list[Finding]:
    """Every log group the template names literally is one preflight looks for (an existing group
    of that name fails the first deploy)."""
    checked = set(preflighted)
    return [
        Finding("named_log_groups_preflighted", group.id, f"preflight does not check {name}")
        for group in model.of_type(facts.LOG_GROUP)
        if isinstance(name := group.properties.get("LogGroupName"), str) and name not in checked
    ]


def pruned_objects_leave(before: StackModel, after: StackModel) -> list[Finding]:
    """An object that leaves a manifest resource that stays is removed by `kubectl apply --prune`
    only if its kind is in kubectl's default prune list; anything else stays in the cluster
    (unless another manifest applies it now: it is then that manifest's)."""
    found = []
    applied_after = {o.key for r in after.of_type(facts.MANIFEST) for o in facts.kube_objects(r)}
    for resource_id, resource in before.resources.items():
        if resource.type != facts.MANIFEST or resource_id not in after.resources:
            continue
        kept = applied_after  # an object another manifest applies now is that manifest's
        for obj in facts.kube_objects(resource):
            if obj.key not in kept and obj.kind not in needs.PRUNED_KINDS:
                found.append(
                    Finding(
                        "pruned_objects_leave",
                        resource_id,
                        f"{obj.key} leaves the manifest but kubectl's prune keeps {obj.kind}s: it stays in the cluster",
                    )
                )
    return found


TEMPLATE_RULES: dict[str, Callable[[StackModel], list[Finding]]] = {
    rule.__name__: rule
    for rule in (
        kubectl_resources_outlive_api_route,
        kubectl_resources_outlive_egress,
        lambda_log_groups_outlive_their_functions,
        aws_controllers_outlive_dns,
        aws_controllers_outlive_credentials_and_nodes,
        finalized_objects_outlive_no_controller,
        no_unmovable_pods_on_autoscaled_nodes,
        workloads_follow_their_nodes,
        system_nodes_hold_their_pods,
        new_cluster_upgrade_fits,
        serve_port_admits_nlb_subnets,
    )
}


def check(model: StackModel, preflighted: Iterable[str] | None = None) -> list[Finding]:
    """Every template rule's findings, sorted (and the preflight rule when its names are given)."""
    found = [finding for rule in TEMPLATE_RULES.values() for finding in rule(model)]
    if preflighted is not None:
        found += named_log_groups_preflighted(model, preflighted)
    return sorted(found)
