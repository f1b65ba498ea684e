"""Which rollout a RayService change takes, as Ray Serve 2.58 and KubeRay 1.7 decide it (read in
their sources; the table is held by tests/template/test_impact.py on real template pairs):

- **Serve config** (``serveConfigV2``), applied to the running cluster under every strategy.
  An application's code version hashes its ``import_path``, ``runtime_env`` and ``args``
  (``serve/_private/deploy_utils.get_app_code_version``): a change there (every engine setting:
  they are the PD builder's args) restarts **every deployment of the application**, both phases
  and the ingress. Otherwise a deployment restarts only for its ``ray_actor_options``, placement
  group or ``max_replicas_per_node`` (``DeploymentVersion.requires_actor_restart``); its
  ``num_replicas``, autoscaling, ``max_ongoing_requests``, ``user_config`` and the like apply in
  place. Serve replaces restarting replicas a few at a time; a phase with one replica is down
  until its replacement has loaded the model.
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

# Ray Serve 2.58's application code version (deploy_utils.get_app_code_version).
APP_CODE_VERSION = ("import_path", "runtime_env", "args", "autoscaling_policy")
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


def serve_lines(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One line per application whose serve config changed: what restarts, or that it applies in place."""
    before, after = _apps(old), _apps(new)
    lines = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"serve config: application {name} {'added' if a is None else 'removed'}")
            continue
        moved = [k for k in APP_CODE_VERSION if a.get(k) != b.get(k)]
        if moved:
            lines.append(
                f"serve config changed: application {name}'s {', '.join(moved)} changed, so Serve restarts every "
                f"deployment of it (both phases and the ingress: Ray Serve 2.58's code version hashes them); "
                "replicas are replaced a few at a time, and a phase with one replica is down, requests to it "
                "failing, until its replacement has loaded the model: the engines restart in place"
            )
            continue
        olds = {d.get("name"): d for d in a.get("deployments") or []}
        for deployment in b.get("deployments") or []:
            previous = olds.get(deployment.get("name")) or {}
            if previous == deployment:
                continue
            restarting = [k for k in RESTARTING_OPTIONS if previous.get(k) != deployment.get(k)]
            lines.append(
                f"serve config changed: deployment {deployment.get('name')} of {name} restarts "
                f"({', '.join(restarting)} changed)"
                if restarting
                else f"serve config changed: deployment {deployment.get('name')} of {name}: applied in place, "
                "no restart"
            )
        if not lines or not lines[-1].startswith("serve config changed: deployment"):
            lines.append(f"serve config changed: application {name}: applied in place, no restart")
    return lines


def converges(ray_service: Mapping[str, Any]) -> bool:
    """Whether the stack's rollout Job converges this RayService (``recreate``)."""
    return digest_annotation() in ((ray_service.get("metadata") or {}).get("annotations") or {})


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
