"""Rules on what the system nodes must hold: what is pinned to them, and a second Ray head during a
NewCluster upgrade. CPU only: the binding resource on the system types in the catalogue."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...catalog import INSTANCE_TYPES
from ...layout import SYSTEM_NODE_LABELS
from ...observability import ADDON_NAME as CLOUDWATCH_ADDON
from .. import facts, needs
from ..graph import StackModel
from .finding import Finding
from .placement import rendered_agents


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
        matching = {g.id for g in facts.placed_on(model, selector)}
        return bool(matching) and matching <= ids

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
