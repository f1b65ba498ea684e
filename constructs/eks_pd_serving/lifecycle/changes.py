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

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from .effects import Action, ObjectChange, effect, object_changes
from .graph import StackModel, reference_paths

_ACTION_ORDER = {"replace": 0, "modify": 1, "add": 2, "delete": 3}
# Attributes that change when their resource is updated in place (a launch template's new
# version); every other attribute keeps its value, and a Ref keeps the physical id.
_UPDATED_ATTRIBUTES = {
    ("AWS::EC2::LaunchTemplate", "LatestVersionNumber"),
    ("AWS::EC2::LaunchTemplate", "DefaultVersionNumber"),
}


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
            for path, target, attribute in reference_paths(new.resources[rid].properties):
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
                actions[rid],
                rid,
                resource.type,
                cause,
                effect(actions[rid], old.resources[rid], resource, paths[rid], new),
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
