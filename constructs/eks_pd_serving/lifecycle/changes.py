"""What a stack update does: for two templates (before and after a change), the resources
CloudFormation adds, updates in place, replaces and deletes, in the order it does so, the
Kubernetes objects each manifest update creates, changes, prunes or leaves behind, and one line
per change on what it does to the running service.

Replacement comes from the ``createOnlyProperties`` of the CloudFormation registry schemas that
cfn-lint ships, and follows references: a replaced resource gets a new id, so every property
that refers to it changes too (and may replace its owner in turn); an in-place update changes
only the attributes listed in ``_UPDATED_ATTRIBUTES``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from ..assembly import field_diff
from . import facts, needs
from .graph import Resource, StackModel, placeholders

Action = Literal["add", "modify", "replace", "delete"]
_ACTION_ORDER = {"replace": 0, "modify": 1, "add": 2, "delete": 3}
# Attributes that change when their resource is updated in place (a launch template's new
# version); every other attribute keeps its value, and a Ref keeps the physical id.
_UPDATED_ATTRIBUTES = {
    ("AWS::EC2::LaunchTemplate", "LatestVersionNumber"),
    ("AWS::EC2::LaunchTemplate", "DefaultVersionNumber"),
}
_GPU_LABEL = ("role", "gpu-worker")
_SYSTEM_LABEL = ("role", "system")


@cache
def create_only_paths(resource_type: str) -> tuple[str, ...]:
    """The schema's createOnlyProperties as property paths ('/InstanceTypes'); none for custom
    resources (CloudFormation updates those in place, and the handlers keep their ids)."""
    if not resource_type.startswith("AWS::"):
        return ()
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema
    return tuple(path.removeprefix("/properties") for path in schema.get("createOnlyProperties", []))


@dataclass(frozen=True)
class Change:
    action: Action
    resource: str
    type: str
    #: Why: the changed property paths, or the reference that carries a change.
    cause: str
    #: What it does to the running service, in one line.
    effect: str


@dataclass(frozen=True)
class ObjectChange:
    resource: str
    action: Literal["create", "change", "prune", "stays", "moves"]
    object: str
    effect: str


@dataclass(frozen=True)
class Impact:
    changes: tuple[Change, ...]
    objects: tuple[ObjectChange, ...]
    #: Resources CloudFormation deletes in its cleanup phase (removed ones, and the old copies of
    #: replaced ones), in the order it deletes them (by the old template's delete waves).
    cleanup: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.changes


def _leaf_paths(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """Changed property paths, down to the first intrinsic function (a change inside an Fn::Join
    is a change of the property that holds it)."""
    intrinsic = any(isinstance(v, dict) and any(k.startswith("Fn::") for k in v) for v in (old, new))
    if intrinsic:
        if old != new:
            yield path or "/"
    elif isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from _leaf_paths(old.get(key), new.get(key), f"{path}/{key}")
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            yield from _leaf_paths(a, b, f"{path}/{index}")
    elif old != new:
        yield path or "/"


def _reference_paths(value: Any, path: str = "") -> Iterator[tuple[str, str, str | None]]:
    """(property path, logical id, attribute or None for a Ref) for each reference."""
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            yield path, str(value["Ref"]), None
            return
        if set(value) == {"Fn::GetAtt"}:
            target = value["Fn::GetAtt"]
            parts = target if isinstance(target, list) else str(target).split(".", 1)
            yield path, str(parts[0]), str(parts[1])
            return
        for key, item in value.items():
            yield from _reference_paths(item, f"{path}/{key}" if not key.startswith("Fn::") else path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _reference_paths(item, f"{path}/{index}")


def _replaces(resource_type: str, paths: set[str]) -> list[str]:
    create_only = create_only_paths(resource_type)
    return sorted(p for p in paths if any(p == c or p.startswith(c + "/") for c in create_only))


def compare(old: StackModel, new: StackModel) -> Impact:
    common = sorted(set(old.resources) & set(new.resources))
    paths: dict[str, set[str]] = {}
    carried: dict[str, list[str]] = {}
    for rid in common:
        paths[rid] = set(_leaf_paths(old.resources[rid].properties, new.resources[rid].properties))
    actions: dict[str, Action] = {}
    while True:
        for rid in common:
            if old.resources[rid].type != new.resources[rid].type or _replaces(new.resources[rid].type, paths[rid]):
                actions[rid] = "replace"
            elif paths[rid]:
                actions[rid] = "modify"
        grown = False
        for rid in common:
            for path, target, attribute in _reference_paths(new.resources[rid].properties):
                action = actions.get(target)
                if action is None or path in paths[rid]:
                    continue
                target_type = new.resources[target].type if target in new.resources else ""
                updated_attribute = attribute is not None and (
                    (target_type, attribute) in _UPDATED_ATTRIBUTES or not target_type.startswith("AWS::")
                )
                if action == "replace" or updated_attribute:
                    paths[rid].add(path)
                    carried.setdefault(rid, []).append(f"{path} follows {target} ({action})")
                    grown = True
        if not grown:
            break
    changes = []
    for rid in common:
        if rid not in actions:
            continue
        resource = new.resources[rid]
        why = _replaces(resource.type, paths[rid]) if actions[rid] == "replace" else sorted(paths[rid])
        cause = ", ".join(sorted(set(carried.get(rid, [])))) or ", ".join(why[:4]) + (" ..." if len(why) > 4 else "")
        if actions[rid] == "replace" and why:
            cause = "create-only " + ", ".join(why) + (f"; {cause}" if carried.get(rid) else "")
        changes.append(
            Change(
                actions[rid], rid, resource.type, cause, effect(actions[rid], old.resources[rid], resource, paths[rid])
            )
        )
    for rid in sorted(set(new.resources) - set(old.resources)):
        changes.append(
            Change("add", rid, new.resources[rid].type, "new", effect("add", None, new.resources[rid], set()))
        )
    for rid in sorted(set(old.resources) - set(new.resources)):
        changes.append(
            Change("delete", rid, old.resources[rid].type, "removed", effect("delete", old.resources[rid], None, set()))
        )
    waves = {rid: i for i, wave in enumerate(new.create_waves()) for rid in wave}
    changes.sort(key=lambda c: (_ACTION_ORDER[c.action], waves.get(c.resource, 0), c.resource))
    gone = {c.resource for c in changes if c.action in ("delete", "replace")}
    cleanup = tuple(rid for wave in old.delete_waves() for rid in wave if rid in gone)
    objects = tuple(o for rid in common for o in object_changes(old, new, rid))
    return Impact(tuple(changes), objects, cleanup)


# --- what a change does to the running service -------------------------------------------------


def _labels(resource: Resource) -> Mapping[str, str]:
    return resource.properties.get("Labels") or {}


def _nodegroup_effect(action: Action, resource: Resource, paths: set[str]) -> str:
    labels = _labels(resource)
    gpu = labels.get(_GPU_LABEL[0]) == _GPU_LABEL[1]
    system = labels.get(_SYSTEM_LABEL[0]) == _SYSTEM_LABEL[1]
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
        return f"{what} replaced: a new group is created, then the old one drained and deleted; {pods}"
    rolling = [p for p in paths if p.startswith(("/LaunchTemplate", "/ReleaseVersion", "/Version", "/AmiType"))]
    if rolling:
        return f"{what} updated: EKS replaces its nodes one at a time (rolling update); {pods}"
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
    name = facts.release(new or old) if (new or old) else "?"  # type: ignore[arg-type]
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


def effect(action: Action, old: Resource | None, new: Resource | None, paths: set[str]) -> str:
    resource = new or old
    assert resource is not None
    kind = resource.type
    if kind == facts.NODEGROUP:
        return _nodegroup_effect(action, resource, paths)
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
        return "the GPU capacity check runs again (EFA, AZ offering, vCPU quota): a failure stops the update first"
    if kind.startswith(("AWS::CloudWatch::", "AWS::SNS::", "AWS::Logs::MetricFilter")):
        return "monitoring only: serving unaffected"
    if kind.startswith("AWS::IAM::") or kind == facts.POD_IDENTITY:
        if action == "modify":
            return "permissions change: pods pick up new credentials on their next refresh"
        return "permissions " + ("for what the change adds" if action == "add" else "removed") + ": no pod restarts"
    if kind in (facts.FUNCTION, "AWS::Lambda::LayerVersion"):
        return "deployment tooling (a provider Lambda): serving unaffected"
    return f"{kind.split('::')[-1]} {action}: serving unaffected"


# --- Kubernetes objects inside a manifest that stays ---------------------------------------------


def _ray_service_effect(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    changed = {path.split(".")[1] if path.startswith("spec.") else path for path, _, _ in field_diff(old, new)}
    strategy = ((new.get("spec") or {}).get("upgradeStrategy") or {}).get("type", "NewCluster")
    lines = []
    if "serveConfigV2" in changed:
        lines.append(
            "serve config changed: KubeRay redeploys the Serve applications on the running cluster; "
            "engines restart in place and requests fail during the restart"
        )
    if "rayClusterConfig" in changed:
        lines.append(
            "RayCluster config changed under upgradeStrategy None: not applied until the cluster is recreated "
            "(kubectl delete raycluster -l ray.io/originated-from-cr-name=<name>)"
            if strategy == "None"
            else "RayCluster config changed under NewCluster: a second Ray cluster is built beside the first, "
            "traffic switches when it is ready (needs room for both)"
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
    elsewhere = manifests_holding(new, exclude=rid)
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
                _ray_service_effect(olds[key].body, news[key].body)
                if news[key].kind == "RayService"
                else [_object_effect(news[key])]
            )
            found += [ObjectChange(rid, "change", key, line) for line in lines]
    return found


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(placeholders(body), sort_keys=True)


def manifests_holding(model: StackModel, exclude: str = "") -> dict[str, str]:
    """Object key -> the manifest resource that applies it (other than ``exclude``)."""
    return {
        obj.key: resource.id
        for resource in model.of_type(facts.MANIFEST)
        if resource.id != exclude
        for obj in facts.kube_objects(resource)
    }


def _object_effect(obj: facts.KubeObject) -> str:
    if obj.kind == "NetworkPolicy":
        return "NetworkPolicy updated: the VPC CNI enforces it within seconds, no pod restarts"
    if obj.kind == "Service" and (obj.body.get("spec") or {}).get("type") == "LoadBalancer":
        return "load balancer Service updated: the controller reconciles the NLB in place"
    return f"{obj.kind} updated by kubectl apply"
