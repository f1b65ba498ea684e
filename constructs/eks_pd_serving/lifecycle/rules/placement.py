"""Rules on where pods land: nothing unmovable on autoscaled nodes, and whatever places pods on a
node group depends on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...observability import ADDON_NAME as CLOUDWATCH_ADDON
from ...observability import CLUSTER_SCRAPER_AGENT
from .. import facts, needs
from ..graph import Resource, StackModel
from .finding import Finding


def rendered_agents(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The add-on's agents its chart renders: the cluster scraper only with otelContainerInsights
    (amazon-cloudwatch-observability 6.4.0, templates/linux/cloudwatch-agent-custom-resource.yaml)."""
    otel = bool((config.get("otelContainerInsights") or {}).get("enabled"))
    return [a for a in config.get("agents", []) if otel or a.get("name") != CLUSTER_SCRAPER_AGENT]


def _cluster_autoscaled(model: StackModel) -> bool:
    return facts.helm_release(model, "cluster-autoscaler") is not None


def _pinned(model: StackModel, node_selector: Mapping[str, str] | None) -> bool:
    groups = facts.placed_on(model, node_selector)
    return bool(groups) and all(facts.fixed_size(g) for g in groups)


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
        if name in needs.DEPLOYMENT_RELEASES and not _pinned(model, facts.helm_values(chart).get("nodeSelector")):
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
