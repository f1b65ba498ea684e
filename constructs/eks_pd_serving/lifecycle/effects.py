"""What a change does to the running service, in one line per resource, and to the Kubernetes
objects of a manifest that stays (created, changed, pruned, left behind or moved): the readings of
CloudFormation, EKS, KubeRay and kubectl behaviour that ``changes.compare`` attaches."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..assembly import field_diff
from ..catalog import MODELS
from ..endpoint import proxy
from ..layout import GPU_NODE_LABELS, SYSTEM_NODE_LABELS
from ..rollout import digest_annotation, env_names, node_replacement_s
from ..sizing import IMAGE_DISK_GIB, largest_checkpoint_bytes
from . import facts, needs, rollout
from .graph import Resource, StackModel, placeholders

Action = Literal["add", "modify", "replace", "delete"]


@dataclass(frozen=True)
class ObjectChange:
    resource: str
    action: Literal["create", "change", "prune", "stays", "moves"]
    object: str
    effect: str


# --- what a change does to the running service -------------------------------------------------


def _labels(resource: Resource) -> Mapping[str, str]:
    return resource.properties.get("Labels") or {}


def _rolling_update(resource: Resource) -> str:
    """How EKS replaces the group's nodes, by its UpdateConfig (EKS API, NodegroupUpdateConfig; EKS
    user guide, managed-node-update-behavior)."""
    config = resource.properties.get("UpdateConfig") or {}
    unavailable = config.get("MaxUnavailable", 1)
    if config.get("UpdateStrategy") == "MINIMAL":
        line = (
            f"EKS terminates up to {unavailable} old node(s) before launching each replacement (UpdateStrategy "
            "MINIMAL): no surge node, so it fits a full reservation, and the group runs that many nodes short "
            "until each replacement joins"
        )
        if resource.properties.get("CapacityType") == "CAPACITY_BLOCK":
            line += (
                " (EKS's Capacity Block guide also advises desired size 0 before an upgrade; that the block "
                "takes MINIMAL's replacement is on paper)"
            )
        return line
    line = (
        f"EKS launches a new node first (surge), then drains and terminates an old one, up to {unavailable} at a "
        "time (UpdateStrategy DEFAULT)"
    )
    if resource.properties.get("CapacityType") == "CAPACITY_BLOCK":
        line += "; a full block has no spare instance for the surge node, so the update fails"
    return line


def _node_time(stack: StackModel | None, nodes: int) -> str:
    """About how long the group's nodes take to serve again, replaced one at a time: the largest
    staged model's read bounds it (None, an unknown model's size, when one is outside the catalogue
    or nothing is staged), as the rollout's deadline takes it."""
    staged = [r for r in (stack.resources.values() if stack else ()) if r.type == "Custom::ModelWeights"]
    largest = largest_checkpoint_bytes([MODELS.get(str(r.properties.get("Model"))) for r in staged])
    each = node_replacement_s(largest, IMAGE_DISK_GIB)
    return (
        f"about {each // 60} min a node until its engine serves (node, image pull, weights from S3, a first engine "
        f"start: docs/features/cold-start.md), {nodes} node(s) one after another"
    )


def _desired(resource: Resource) -> int:
    scaling = resource.properties.get("ScalingConfig") or {}
    return int(scaling.get("DesiredSize", scaling.get("MinSize", 1)))


def _nodegroup_effect(action: Action, resource: Resource, paths: set[str], stack: StackModel | None = None) -> str:
    labels = _labels(resource)
    gpu = GPU_NODE_LABELS.items() <= labels.items()
    system = SYSTEM_NODE_LABELS.items() <= labels.items()
    what = "GPU node group" if gpu else "system node group" if system else "node group"
    pods = (
        "the Ray workers on it restart and their engines reload the model"
        if gpu
        else "the Ray head restarts and with it the whole Ray cluster (all engines reload), KubeRay restarts"
        if system
        else "its pods restart"
    )
    if action == "add":
        return f"{what} added: new nodes join the cluster"
    if action == "delete":
        return f"{what} deleted: its nodes are drained and terminated; {pods}"
    if action == "replace":
        timing = f"; {_node_time(stack, _desired(resource))}" if gpu else ""
        return f"{what} replaced: a new group is created, then the old one drained and deleted; {pods}{timing}"
    rolling = [p for p in paths if p.startswith(("/LaunchTemplate", "/ReleaseVersion", "/Version", "/AmiType"))]
    if rolling:
        timing = f"; {_node_time(stack, _desired(resource))}" if gpu else ""
        return f"{what} updated: {_rolling_update(resource)}; {pods}{timing}"
    if any(p.startswith("/ScalingConfig") for p in paths):
        return (
            f"{what} size bounds changed: EKS sets the group to the template's desired size at once "
            "(aws/containers-roadmap#1259); nodes above it are removed, with the pods on them"
        )
    return f"{what} updated in place (labels, tags or taints): no node replaced"


def _manifest_effect(action: Action, resource: Resource) -> str:
    kinds = sorted({o.kind for o in facts.kube_objects(resource)})
    if action == "add":
        return f"manifest applied: creates {', '.join(kinds)}"
    if action == "delete":
        nlb = any(
            o.kind == "Service" and o.body.get("spec", {}).get("type") == "LoadBalancer"
            for o in facts.kube_objects(resource)
        )
        extra = "; the load balancer controller deletes the NLB, and callers lose the endpoint" if nlb else ""
        return f"kubectl delete of {', '.join(kinds)}{extra}"
    return "kubectl apply --prune: see the object rows below"


def _helm_effect(action: Action, old: Resource | None, new: Resource | None, paths: set[str]) -> str:
    resource = new or old
    assert resource is not None
    name = facts.release(resource)
    if action == "add":
        return f"helm install {name}"
    if action == "delete":
        return f"helm uninstall {name}: its pods go"
    if any(p.startswith("/Version") for p in paths):
        crds = " (helm does not upgrade CRDs: apply the new ones first)" if name == "kuberay-operator" else ""
        return f"helm upgrade {name} to a new chart version: its pods restart{crds}"
    if any(p.startswith("/Values") for p in paths):
        return f"helm upgrade {name} with new values: its pods restart"
    return f"helm upgrade {name}: no change to its pods"


def _addon_effect(action: Action, resource: Resource, paths: set[str]) -> str:
    name = resource.properties.get("AddonName")
    if name == "amazon-cloudwatch-observability":
        if action == "delete":
            return "CloudWatch add-on removed: Container Insights, GPU/EFA metrics, Ray metrics and container logs stop"
        if action == "add":
            return "CloudWatch add-on installed: agents and Fluent Bit start on every node"
    if action in ("add", "delete", "replace"):
        return f"add-on {name} {dict(add='installed', delete='removed', replace='reinstalled')[action]}"
    if any(p.startswith("/ConfigurationValues") for p in paths):
        return f"add-on {name} configuration updated: EKS restarts its pods with the new values (no Ray pod restarts)"
    return f"add-on {name} updated in place"


def effect(
    action: Action, old: Resource | None, new: Resource | None, paths: set[str], stack: StackModel | None = None
) -> str:
    """One line on what the change does to the running service (``stack``: the new template, for
    what a line needs beyond the resource, such as the model's size)."""
    resource = new or old
    assert resource is not None
    kind = resource.type
    if kind == facts.NODEGROUP:
        return _nodegroup_effect(action, resource, paths, stack)
    if kind == facts.MANIFEST:
        return _manifest_effect(action, resource)
    if kind == facts.HELM:
        return _helm_effect(action, old, new, paths)
    if kind == facts.ADDON:
        return _addon_effect(action, resource, paths)
    if kind == facts.CLUSTER:
        if action == "replace":
            return "EKS cluster replaced: every node, pod and object is rebuilt (full outage)"
        return f"EKS cluster {action}"
    if kind == "AWS::EC2::LaunchTemplate":
        if action == "modify":
            return "launch template: a new version; its node group rolls its nodes to it"
        return f"launch template {action}"
    if kind == facts.LOG_GROUP:
        if action == "delete":
            return "log group deleted, with its events"
        if action == "replace":
            return "log group replaced: a new group; the old one is deleted with its events"
        return "log group " + ("created" if action == "add" else "settings changed")
    if kind == "Custom::GpuCapacityCheck" and action in ("add", "modify"):
        return (
            "the GPU capacity check runs again (EFA, AZ offering, vCPU quota, each reservation): a failure stops "
            "the update first"
        )
    if kind == "AWS::Scheduler::Schedule":
        if action == "delete":
            return "Capacity Block schedule removed: nothing scales the group down before a block's end"
        return (
            "Capacity Block schedule: the group is warned a day ahead and scaled to zero an hour before the block ends"
        )
    if kind.startswith(("AWS::CloudWatch::", "AWS::SNS::", "AWS::Logs::MetricFilter")):
        return "monitoring only: serving unaffected"
    if kind.startswith("AWS::IAM::") or kind == facts.POD_IDENTITY:
        if action == "modify":
            return "permissions change: pods pick up new credentials on their next refresh"
        return "permissions " + ("for what the change adds" if action == "add" else "removed") + ": no pod restarts"
    if kind == "AWS::SecretsManager::Secret" and action == "delete":
        # A secret scheduled for deletion answers GetSecretValue with InvalidRequestException at once.
        return "secret deleted: unreadable at once; a Ray pod that reads it when it starts (key check, GCS token) fails"
    if kind in (facts.FUNCTION, "AWS::Lambda::LayerVersion"):
        return "deployment tooling (a provider Lambda): serving unaffected"
    return f"{kind.split('::')[-1]} {action}: serving unaffected"


# --- Kubernetes objects inside a manifest that stays ---------------------------------------------


def _checks_api_keys(ray_service: Mapping[str, Any]) -> bool:
    """Whether the RayService's pods check API keys (the proxy hook itself is on every pod: the body's bound)."""
    return proxy.SECRET_ENV in json.dumps((ray_service.get("spec") or {}).get("rayClusterConfig"))


def _gcs_fault_tolerant(ray_service: Mapping[str, Any]) -> bool:
    """Whether the RayService's head keeps the GCS state in an external store."""
    return "gcsFaultToleranceOptions" in ((ray_service.get("spec") or {}).get("rayClusterConfig") or {})


def _worker_instance_types(model: StackModel, ray_service: Mapping[str, Any]) -> dict[str, str]:
    """Each Ray worker group's node type: the node group its nodeSelector lands on."""
    found = {}
    for group in ((ray_service.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []:
        selector = ((group.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
        for nodegroup in facts.nodegroups_for(model, selector) if selector else []:
            types = nodegroup.properties.get("InstanceTypes") or []
            if types and isinstance(types[0], str):
                found[str(group.get("groupName"))] = types[0]
    return found


def _rollout_deadline(model: StackModel) -> int | None:
    """The rollout Job's deadline in the template (its env), if it has the Job."""
    name = env_names()["deadline"]
    for resource in model.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            if obj.kind != "Job":
                continue
            for container in ((obj.body.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers", []):
                for env in container.get("env") or []:
                    if env.get("name") == name and str(env.get("value", "")).isdigit():
                        return int(env["value"])
    return None


def _ray_service_effect(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    instance_types: Mapping[str, str] | None = None,
    deadline_s: int | None = None,
) -> list[str]:
    # The rollout's digest annotation moves with the cluster config; the cluster line says what it does.
    digest = f"metadata.annotations.{digest_annotation()}"
    changed = {
        path.split(".")[1] if path.startswith("spec.") else path
        for path, _, _ in field_diff(old, new)
        if not path.startswith(digest)
    }
    lines = rollout.serve_lines(old, new) if "serveConfigV2" in changed else []
    if "rayClusterConfig" in changed:
        lines.append(rollout.cluster_line(old, new, instance_types, deadline_s))
    # Where the deploy rebuilds the cluster itself, what turns on or off with it does so then.
    rebuilt = rollout.rebuilt(old, new)
    keyed = [_checks_api_keys(side) for side in (old, new)]
    if keyed[1] and not keyed[0]:
        lines.append(
            "the API key check turns on with the rebuilt cluster, inside the deploy; until the deletion the endpoint "
            "answers without keys"
            if rebuilt
            else "the API key check turns on only in a RayCluster built from the new spec; until then the endpoint "
            "answers without keys (verify shows which)"
        )
    elif keyed[0] and not keyed[1]:
        lines.append(
            "the API key check turns off with the rebuilt cluster, inside the deploy"
            if rebuilt
            else "the API key check turns off only in a RayCluster built from the new spec; until then the running "
            "proxies check the keys they hold, and a Ray pod that restarts meanwhile answers 503 (its role may no "
            "longer read the key secret): recreate the RayCluster right after the deploy"
        )
    tolerant = [_gcs_fault_tolerant(side) for side in (old, new)]
    if tolerant[1] and not tolerant[0]:
        lines.append(
            "GCS fault tolerance turns on with the rebuilt cluster, inside the deploy (the store is created first)"
            if rebuilt
            else "GCS fault tolerance turns on only in a RayCluster built from the new spec (the store is created "
            "first); until then a head restart still rebuilds the whole Ray cluster"
        )
    elif tolerant[0] and not tolerant[1]:
        lines.append(
            "GCS fault tolerance turns off with the rebuilt cluster; CloudFormation deletes the store in the cleanup "
            "phase, after the deploy has rebuilt the cluster without it"
            if rebuilt
            else "GCS fault tolerance turns off, and CloudFormation deletes the store while the running RayCluster "
            "still uses it: its head fails once the store is gone and restarts against an address that no longer "
            "exists, until the RayCluster is rebuilt from the new spec (recreate it right after the deploy)"
        )
    rest = sorted(changed - {"serveConfigV2", "rayClusterConfig"})
    if rest:
        lines.append(f"RayService {', '.join(rest)} changed: KubeRay applies it to the running service")
    return lines


def object_changes(old: StackModel, new: StackModel, rid: str) -> list[ObjectChange]:
    before, after = old.resources[rid], new.resources[rid]
    if before.type != facts.MANIFEST or before.properties.get("Manifest") == after.properties.get("Manifest"):
        return []
    olds = {o.key: o for o in facts.kube_objects(before)}
    news = {o.key: o for o in facts.kube_objects(after)}
    elsewhere = facts.manifests_holding(new, exclude=rid)
    found = []
    for key in sorted(set(olds) | set(news)):
        if key not in olds:
            found.append(ObjectChange(rid, "create", key, "created by kubectl apply"))
        elif key not in news:
            if key in elsewhere:
                found.append(
                    ObjectChange(
                        rid,
                        "moves",
                        key,
                        f"moves to {elsewhere[key]}, which applies it "
                        "(kubectl apply): stays in the cluster, owned by that manifest",
                    )
                )
            elif "PruneLabel" not in after.properties:
                found.append(
                    ObjectChange(rid, "stays", key, "removed from a manifest that does not prune: stays in the cluster")
                )
            elif olds[key].kind in needs.PRUNED_KINDS:
                found.append(ObjectChange(rid, "prune", key, "removed from the manifest: kubectl's prune deletes it"))
            else:
                found.append(
                    ObjectChange(
                        rid,
                        "stays",
                        key,
                        f"{olds[key].kind} removed from a pruned manifest: "
                        "stays in the cluster (kubectl's default prune list does not have the kind)",
                    )
                )
        elif _canonical(olds[key].body) != _canonical(news[key].body):
            lines = (
                _ray_service_effect(
                    olds[key].body, news[key].body, _worker_instance_types(new, news[key].body), _rollout_deadline(new)
                )
                if news[key].kind == "RayService"
                else [_object_effect(news[key])]
            )
            found += [ObjectChange(rid, "change", key, line) for line in lines]
    return found


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(placeholders(body), sort_keys=True)


def _object_effect(obj: facts.KubeObject) -> str:
    if obj.kind == "NetworkPolicy":
        return "NetworkPolicy updated: the VPC CNI enforces it within seconds, no pod restarts"
    if obj.kind == "Service" and (obj.body.get("spec") or {}).get("type") == "LoadBalancer":
        return "load balancer Service updated: the controller reconciles the NLB in place"
    return f"{obj.kind} updated by kubectl apply"
