"""Which rollout a RayService change takes, as Ray Serve 2.58 and KubeRay 1.7 decide it (read in
their sources; the table is held by tests/template/test_impact.py on real template pairs):

- **Serve config** (``serveConfigV2``), applied to the running cluster under every strategy.
  An application's code version hashes its ``import_path``, ``runtime_env``, ``args``, its
  ``autoscaling_policy``, and from its deployments' overrides their autoscaling policies, request
  router configs and deployment actors (``serve/_private/deploy_utils.get_app_code_version``,
  ``APP_CODE_VERSION``): a change there restarts **every deployment of that application**.
  Otherwise a deployment restarts only for its ``ray_actor_options``, placement group or
  ``max_replicas_per_node`` (``DeploymentVersion.requires_actor_restart``); its replicas,
  autoscaling, ``max_ongoing_requests``, ``user_config`` and the like apply in place. With the
  failover, each phase is an application of its own and the serve rollout Job restarts them one
  at a time (prefill, decode, then the ingress) while the failover serves through the other: no
  request fails. A served model added or removed (its two applications, and the ingress's list of
  models) is one step: Serve starts or stops those applications, rolls the ingress's two replicas,
  and leaves the other models' applications running (the two-model CPU rehearsal adds a model so).
  A change to or from Ray's own one application, or an application built by another import path,
  restarts everything at once.
- **Cluster config** (``rayClusterConfig``): KubeRay applies it only through a new RayCluster
  (``shouldPrepareNewCluster``). ``recreate`` (the stack's rollout Job, when the RayService
  carries the config digest): the deploy rebuilds the cluster when the digest changes and sets
  worker bounds in place when only they changed; ``manual`` (KubeRay's None without the digest):
  not applied until someone recreates the cluster; ``NewCluster``: a second cluster beside the
  first, traffic switched when it serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from ..catalog.prices import INSTANCE_PRICES
from ..rollout import digest_annotation

# Ray Serve 2.58's application code version (deploy_utils.get_app_code_version): the application's
# own fields, and from each deployment override these (``autoscaling_config.policy``: the policy).
APP_CODE_VERSION = ("import_path", "runtime_env", "args", "autoscaling_policy")
OVERRIDE_CODE_VERSION = ("autoscaling_config.policy", "request_router_config", "deployment_actors")
# DeploymentVersion.requires_actor_restart: the options that restart a deployment's replicas.
RESTARTING_OPTIONS = ("ray_actor_options", "placement_group_bundles", "placement_group_strategy",
                      "max_replicas_per_node")  # fmt: skip
# What a rebuilt cluster costs a client, said once (engine start and model load, measured on the
# GPU rehearsal at ~2 minutes for a tiny model; a real model adds its load from S3).
REBUILD_DOWNTIME = (
    "every request fails from the deletion until the new engines serve (head and worker pods on the same "
    "nodes, images cached: the engines' start and the model's load, minutes)"
)


def _apps(ray_service: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    text = (ray_service.get("spec") or {}).get("serveConfigV2") or ""
    config = yaml.safe_load(text) if isinstance(text, str) else text
    return {a["name"]: a for a in (config or {}).get("applications") or []}


def _deployment_names(app: Mapping[str, Any]) -> list[str]:
    names = [d.get("name") for d in app.get("deployments") or []]
    return sorted(str(n) for n in names if n) or ["every deployment"]


def code_version(app: Mapping[str, Any]) -> dict[str, Any]:
    """What Serve 2.58 hashes into ``app``'s code version (``APP_CODE_VERSION``, and each
    override's fields of ``OVERRIDE_CODE_VERSION`` as Ray lists them: only overrides that set one)."""
    overrides = app.get("deployments") or []
    scaling = [d["autoscaling_config"] for d in overrides if isinstance(d.get("autoscaling_config"), dict)]
    return {
        **{key: app.get(key) for key in APP_CODE_VERSION},
        "deployment_autoscaling_policies": [a.get("policy") for a in scaling],
        "request_router_configs": [
            d["request_router_config"] for d in overrides if isinstance(d.get("request_router_config"), dict)
        ],
        "deployment_actors": [
            d["deployment_actors"] for d in overrides if isinstance(d.get("deployment_actors"), list)
        ],
    }


def _phase_apps(apps: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the config is the failover's layout (each phase its own application), which the
    stack's serve rollout rolls one application at a time."""
    from ..fault_tolerance import failover

    paths = set(failover.import_paths().values())
    return bool(apps) and all(a.get("import_path") in paths for a in apps.values())


def serve_lines(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One line per application whose serve config changed: what restarts, and whether requests fail."""
    before, after = _apps(old), _apps(new)
    layout_changed = set(before) != set(after) or any(
        before[name].get("import_path") != after[name].get("import_path") for name in after
    )
    if layout_changed:
        added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
        rebuilt = [
            n for n in sorted(set(before) & set(after)) if before[n].get("import_path") != after[n].get("import_path")
        ]
        if rebuilt or not (_phase_apps(before) and _phase_apps(after)):
            moved = ", ".join(
                [*(f"{a} added" for a in added), *(f"{r} removed" for r in removed)]
                + [f"{n} built by another import path" for n in rebuilt]
            )
            return [
                f"serve config changed: the Serve layout changes ({moved}): every application restarts at once and "
                "requests fail until the new engines serve (the outage: the engines' start and the model's load, "
                "minutes); the serve rollout does not stage it (the old applications hold the GPUs the new ones need)"
            ]
        # A served model added or removed in the failover's layout: Serve deploys and deletes those
        # applications and leaves every unchanged one running (its config, and so its version, is the
        # same); the serve rollout applies the new layout in one step.
        lines = []
        if added:
            lines.append(
                f"serve config changed: applications added ({', '.join(added)}): their engines start on GPUs the "
                "worker groups must hold, in one serve-rollout step that waits until they serve; the applications "
                "already serving keep serving"
            )
        if removed:
            lines.append(
                f"serve config changed: applications removed ({', '.join(removed)}): Serve stops them, so requests "
                "for their model fail from then on; the other applications keep serving"
            )
        for name in (n for n in after if n in before and before[n] != after[n]):
            versioned = [k for k, v in code_version(after[name]).items() if code_version(before[name]).get(k) != v]
            lines.append(
                f"serve config changed: application {name} restarts ({', '.join(versioned) or 'its deployments'} "
                "changed) in the same step, its replicas replaced a few at a time: with two or more (the ingress "
                "has two) the others serve meanwhile"
            )
        return lines
    rolled = _phase_apps(after)
    lines = []
    for name in after:
        a, b = before[name], after[name]
        if a == b:
            continue
        versioned = [k for k, v in code_version(b).items() if code_version(a).get(k) != v]
        if versioned and rolled:
            lines.append(
                f"serve config changed: application {name} restarts ({', '.join(versioned)} changed, Serve 2.58's code "
                "version), alone: the serve rollout Job applies it before the RayService's manifest, one "
                "application at a time (prefill, decode, the ingress), waiting until each serves; the failover "
                "serves through the other phase meanwhile, so no request fails (a stream on a stopping replica "
                "finishes within its graceful shutdown)"
            )
            continue
        if versioned:
            lines.append(
                f"serve config changed: application {name}'s {', '.join(versioned)} changed, so Serve restarts every "
                f"deployment of it (both phases and the ingress: Ray Serve 2.58's code version hashes them); "
                "replicas are replaced a few at a time, and a phase with one replica is down, requests to it "
                "failing, until its replacement has loaded the model: the engines restart in place"
            )
            continue
        olds = {d.get("name"): d for d in a.get("deployments") or []}
        found = False
        for deployment in b.get("deployments") or []:
            previous = olds.get(deployment.get("name")) or {}
            if previous == deployment:
                continue
            found = True
            restarting = [k for k in RESTARTING_OPTIONS if previous.get(k) != deployment.get(k)]
            lines.append(
                f"serve config changed: deployment {deployment.get('name')} of {name} restarts "
                f"({', '.join(restarting)} changed)"
                if restarting
                else f"serve config changed: deployment {deployment.get('name')} of {name}: applied in place "
                "(replicas, autoscaling, the failover's settings, timing), no restart, no request fails"
            )
        if not found:
            lines.append(f"serve config changed: application {name}: applied in place, no restart, no request fails")
    return lines


def converges(ray_service: Mapping[str, Any]) -> bool:
    """Whether the stack's rollout Job converges this RayService (``recreate``: the cluster digest
    under KubeRay's None; NewCluster carries the digest too, for the serve rollout)."""
    strategy = (((ray_service.get("spec") or {}).get("upgradeStrategy") or {}).get("type")) or "None"
    return strategy == "None" and digest_annotation() in ((ray_service.get("metadata") or {}).get("annotations") or {})


def _digest(ray_service: Mapping[str, Any]) -> str | None:
    return ((ray_service.get("metadata") or {}).get("annotations") or {}).get(digest_annotation())


def worker_nodes(ray_service: Mapping[str, Any]) -> int:
    """The GPU worker pods the cluster starts with (one a node here), the second cluster's need."""
    groups = ((ray_service.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
    return sum(int(g.get("replicas") or g.get("minReplicas") or 0) for g in groups)


def second_cluster_cost(ray_service: Mapping[str, Any], instance_types: Mapping[str, str]) -> str:
    """What the second cluster's GPU workers cost while both run: one node a worker pod (the GPU
    groups' layout), priced on-demand from the catalogue (``instance_types``: worker group name to
    its node group's type)."""
    groups = ((ray_service.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
    parts, total = [], 0.0
    for group in groups:
        count = int(group.get("replicas") or group.get("minReplicas") or 0)
        kind = instance_types.get(str(group.get("groupName")), "")
        price = INSTANCE_PRICES.get(kind)
        if price is None:
            parts.append(f"{count} x {kind or 'an unknown type'} (no price in the table)")
            continue
        total += count * price
        parts.append(f"{count} x {kind} at ${price:.4g}/h")
    return f"{', '.join(parts)}: ${total:.2f} an hour on demand in us-east-1 while both run"


def cluster_line(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    instance_types: Mapping[str, str] | None = None,
    deadline_s: int | None = None,
) -> str:
    """What a changed ``rayClusterConfig`` does under the new spec's strategy (``instance_types``:
    each worker group's node type, for NewCluster's extra nodes; ``deadline_s``: the rollout Job's)."""
    strategy = ((new.get("spec") or {}).get("upgradeStrategy") or {}).get("type", "NewCluster")
    if strategy == "NewCluster":
        return (
            "RayCluster config changed under NewCluster: a second Ray cluster is built beside the first, traffic "
            f"switches when it serves; meanwhile {worker_nodes(new)} more GPU node(s) and a second head run ("
            + second_cluster_cost(new, instance_types or {})
            + ")"
        )
    if converges(new):
        if _digest(old) == _digest(new):
            return (
                "RayCluster config changed (worker replicas or bounds only): the rollout Job sets them in place, "
                "no restart"
            )
        waits = (
            f" (at most {deadline_s // 60} minutes, the rollout Job's deadline from the model's size and the "
            "image's; past it the deploy fails and the rollback rebuilds the cluster back)"
            if deadline_s
            else ""
        )
        return (
            "RayCluster config changed under recreate: the deploy rebuilds the Ray cluster (the rollout Job deletes "
            f"the RayCluster, KubeRay builds one from the new spec, the deploy waits until it serves{waits}); "
            + REBUILD_DOWNTIME
        )
    return (
        "RayCluster config changed under upgradeStrategy None (manual): not applied until the cluster is recreated "
        "(kubectl delete raycluster -l ray.io/originated-from-cr-name=<name>)"
    )


def rebuilt(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the deploy itself rebuilds the cluster for this change."""
    return converges(new) and _digest(old) != _digest(new)
