"""Rules across a change or beyond the template: what kubectl's prune leaves behind or deletes
too early, what a running cluster still mounts, and the log groups preflight must look for."""

from __future__ import annotations

from collections.abc import Iterable

from .. import facts, needs
from ..graph import StackModel
from .finding import Finding, needs_edge


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


def _mounted(ray_service: facts.KubeObject) -> list[str]:
    """The ConfigMaps and Secrets the RayService's pod templates mount as non-optional volumes."""
    cluster = (ray_service.body.get("spec") or {}).get("rayClusterConfig") or {}
    groups = [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]
    found = []
    for group in groups:
        for volume in ((group.get("template") or {}).get("spec") or {}).get("volumes") or []:
            for kind, field, name_field in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName")):
                source = volume.get(field)
                if isinstance(source, dict) and not source.get("optional"):
                    found.append(f"{kind}/{ray_service.namespace}/{source.get(name_field)}")
    return sorted(set(found))


def old_pods_keep_what_they_mount(before: StackModel, after: StackModel) -> list[Finding]:
    """A running RayCluster keeps the pod spec it was built from until it is rebuilt (under
    upgradeStrategy None only when someone recreates it; under NewCluster once the new one is
    ready), so every ConfigMap and Secret the RayService mounted before a change is still applied
    after it: else the old spec's next pod (a restart, a replaced node, a scale-up) never starts
    (FailedMount)."""
    applied_after = facts.manifests_holding(after)
    found = []
    for resource in before.of_type(facts.MANIFEST):
        for obj in facts.kube_objects(resource):
            if obj.kind != "RayService":
                continue
            found += [
                Finding(
                    "old_pods_keep_what_they_mount",
                    resource.id,
                    f"{key} leaves the cluster while the running {obj.key}'s pods mount it",
                )
                for key in _mounted(obj)
                if key not in applied_after
            ]
    return found


def moved_objects_applied_before_prune(before: StackModel, after: StackModel) -> list[Finding]:
    """An object moving from one manifest to another is applied by its new manifest before its old
    one prunes: the old manifest depends on the new (CloudFormation then creates or updates the new
    one first, and kubectl's apply replaces the object's prune label), and a new manifest applies
    on create (`Overwrite`; `kubectl create` fails on an object that exists). Else the prune deletes
    it (a Namespace: everything in it; only kinds in kubectl's prune list), or the create fails the
    update."""
    found = []
    holders = facts.manifests_holding(after)
    for resource in before.of_type(facts.MANIFEST):
        if resource.id not in after.resources:
            continue
        kept = {o.key for o in facts.kube_objects(after.resources[resource.id])}
        for obj in facts.kube_objects(resource):
            new = holders.get(obj.key)
            if obj.key in kept or new is None or new == resource.id:
                continue
            rule = "moved_objects_applied_before_prune"
            if obj.kind in needs.PRUNED_KINDS:
                found += needs_edge(after, rule, resource.id, new, f"{obj.key} moves there; its prune would delete it")
            if new not in before.resources and str(after.resources[new].properties.get("Overwrite")).lower() != "true":
                found.append(
                    Finding(rule, new, f"creates {obj.key}, which exists: kubectl create fails (no Overwrite)")
                )
    return found


WAIT = "Custom::AWSCDK-EKS-KubernetesObjectValue"


# One staged revision of a served model (weights/model_weights.py's custom resource).
STAGED_WEIGHTS = "Custom::ModelWeights"


def engines_start_after_their_weights(model: StackModel) -> list[Finding]:
    """The RayService's manifest is applied after every revision it serves is staged (each served
    model's ``Custom::ModelWeights``): its engines read their revision at their start, and one started
    on a prefix still empty fails its start over and over until the deploy's wait gives up."""
    found = []
    staged = [r.id for r in model.of_type(STAGED_WEIGHTS)]
    for manifest in model.of_type(facts.MANIFEST):
        if any(obj.kind == "RayService" for obj in facts.kube_objects(manifest)):
            for revision in staged:
                found += needs_edge(
                    model, "engines_start_after_their_weights", manifest.id, revision, "its engines read that revision"
                )
    return found


def _waited_jobs(model: StackModel) -> dict[str, tuple[str, facts.KubeObject]]:
    """Job name -> (its manifest resource, the Job), for each Job the deploy waits on."""
    waited = {
        str(r.properties.get("ObjectName"))
        for r in model.of_type(WAIT)
        if str(r.properties.get("ObjectType", "")).lower() in ("job", "jobs")
    }
    return {
        obj.name: (resource.id, obj)
        for resource in model.of_type(facts.MANIFEST)
        for obj in facts.kube_objects(resource)
        if obj.kind == "Job" and obj.name in waited
    }


def waited_jobs_are_pruned(model: StackModel) -> list[Finding]:
    """A Job the deploy waits on is applied pruned: the next Job's apply deletes it, so a rollback
    (or a deploy of that config again) creates it anew and it runs. Left finished in place, the
    re-applied old Job changes nothing and the wait passes at once."""
    return [
        Finding("waited_jobs_are_pruned", manifest, f"Job {name} stays after the next one: a rollback would not run it")
        for name, (manifest, _) in sorted(_waited_jobs(model).items())
        if "PruneLabel" not in model.resources[manifest].properties
    ]


# A label value's limit: the Job controller copies a Job's name into its pods' labels.
JOB_NAME_MAX = 63
# A waited Job must outlive the deploy's reads of it after it finished (the remaining wait steps,
# seconds apart) and be gone before a next deploy, the earliest after a rollback of the one it failed.
FINISHED_TTL_MIN_S = 120


def waited_jobs_leave_after_they_finish(model: StackModel) -> list[Finding]:
    """A Job the deploy waits on is removed by Kubernetes once finished
    (``ttlSecondsAfterFinished`` between ``FINISHED_TTL_MIN_S`` and one wait step): a failed Job
    that a rollback to a release without pruning left in place would otherwise be applied unchanged
    by the next deploy, which then waits out its steps on a Job that never runs again."""
    rule = "waited_jobs_leave_after_they_finish"
    found = []
    step = max((int(r.properties.get("TimeoutSeconds", 0) or 0) for r in model.of_type(WAIT)), default=0)
    for name, (manifest, job) in sorted(_waited_jobs(model).items()):
        ttl = job.body.get("spec", {}).get("ttlSecondsAfterFinished")
        if not isinstance(ttl, int) or not FINISHED_TTL_MIN_S <= ttl <= max(step, FINISHED_TTL_MIN_S):
            found.append(Finding(rule, manifest, f"Job {name} stays once finished (ttlSecondsAfterFinished {ttl})"))
    return found


def waited_jobs_fit_their_names(model: StackModel) -> list[Finding]:
    """A Job's name fits a label value (``JOB_NAME_MAX``): a longer one is refused at apply."""
    return [
        Finding("waited_jobs_fit_their_names", manifest, f"Job {name} has {len(name)} characters, over {JOB_NAME_MAX}")
        for name, (manifest, _) in sorted(_waited_jobs(model).items())
        if len(name) > JOB_NAME_MAX
    ]


def _cluster_config(model: StackModel) -> dict[str, object]:
    return {
        obj.name: obj.body.get("spec", {}).get("rayClusterConfig")
        for resource in model.of_type(facts.MANIFEST)
        for obj in facts.kube_objects(resource)
        if obj.kind == "RayService"
    }


def waited_jobs_move_with_what_they_apply(before: StackModel, after: StackModel) -> list[Finding]:
    """A Job the deploy waits on is a new Job (a new name) whenever the RayService's cluster config
    changes, worker bounds included (else no Job runs: KubeRay applies none of it under None), and
    keeps its name only with the same spec (a Job's pod template is immutable: "field is immutable")."""
    rule = "waited_jobs_move_with_what_they_apply"
    old, new = _waited_jobs(before), _waited_jobs(after)
    found = [
        Finding(rule, new[name][0], f"Job {name} keeps its name with another spec: the apply fails (immutable)")
        for name in sorted(set(old) & set(new))
        if old[name][1].body.get("spec") != new[name][1].body.get("spec")
    ]
    if old and new and set(old) == set(new) and _cluster_config(before) != _cluster_config(after):
        found += [
            Finding(rule, new[name][0], f"the RayService's cluster config changed but Job {name} did not: nothing runs")
            for name in sorted(new)
        ]
    return found
