"""Updates that converge inside ``cdk deploy`` (``ray_upgrade_strategy=recreate``): the rollout
Job's program (``eks_pd_rollout``, pod-side) and the config digest it acts on. The digest is of the
RayService's ``rayClusterConfig`` without what the Job sets in place (worker replicas and bounds,
``workersToDelete``) or what is no pod's (``upgradeStrategy``, ``suspend``), so a change of anything
else, and only that, rebuilds the Ray cluster. No CDK: the tests import it."""

from __future__ import annotations

import copy
import hashlib
import json
from functools import cache
from typing import Any

from .._private import pod_code

MODULE = "eks_pd_rollout"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/rollout"
# In place, by the Job (KubeRay's hash leaves them out too: it never pushes them itself).
_IN_PLACE = ("replicas", "minReplicas", "maxReplicas")


def source() -> str:
    return pod_code.source(__file__, FILE_NAME)


def source_digest() -> str:
    return pod_code.digest(source())


@cache
def _constant(name: str) -> Any:
    return pod_code.constant(source(), FILE_NAME, name)


def digest_annotation() -> str:
    return str(_constant("DIGEST_ANNOTATION"))


def env_names() -> dict[str, str]:
    return dict(_constant("ENV"))


def worker_bounds(ray_cluster_config: dict[str, Any]) -> dict[str, dict[str, int]]:
    """What the Job sets in place: each worker group's replicas and bounds, by group name."""
    return {
        str(group["groupName"]): {f: group[f] for f in _IN_PLACE if f in group}
        for group in ray_cluster_config.get("workerGroupSpecs") or []
    }


def cluster_config_digest(ray_cluster_config: dict[str, Any]) -> str:
    """Digest of the parts of a ``rayClusterConfig`` that only a new RayCluster applies (tokens
    resolved to their CloudFormation form first, so the digest is the template's)."""
    spec = copy.deepcopy(ray_cluster_config)
    spec.pop("upgradeStrategy", None)
    spec.pop("suspend", None)
    for group in spec.get("workerGroupSpecs") or []:
        for field in _IN_PLACE:
            group.pop(field, None)
        (group.get("scaleStrategy") or {}).pop("workersToDelete", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


__all__ = [
    "FILE_NAME",
    "MODULE",
    "MOUNT_PATH",
    "cluster_config_digest",
    "digest_annotation",
    "env_names",
    "source",
    "source_digest",
    "worker_bounds",
]
