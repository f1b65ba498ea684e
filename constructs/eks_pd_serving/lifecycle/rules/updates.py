"""Rules across a change or beyond the template: what kubectl's prune leaves behind, and the log
groups preflight must look for."""

from __future__ import annotations

from collections.abc import Iterable

from .. import facts, needs
from ..graph import StackModel
from .finding import Finding


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
