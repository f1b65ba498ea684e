"""Updates that converge inside ``cdk deploy`` (``ray_upgrade_strategy=recreate``): the rollout
Job's program (``eks_pd_rollout``, pod-side) and the config digest it acts on. The digest is of the
RayService's ``rayClusterConfig`` without what the Job sets in place (worker replicas and bounds,
``workersToDelete``) or what is no pod's (``upgradeStrategy``, ``suspend``), so a change of anything
else, and only that, rebuilds the Ray cluster. No CDK: the tests import it."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import runpy
from functools import cache
from pathlib import Path
from typing import Any

from .._private import pod_code

MODULE = "eks_pd_rollout"
FILE_NAME = f"{MODULE}.py"
MOUNT_PATH = "/opt/eks-pd/rollout"
# In place, by the Job (KubeRay's hash leaves them out too: it never pushes them itself).
_IN_PLACE = ("replicas", "minReplicas", "maxReplicas")

# What a rebuilt cluster needs before it serves, for the Job's deadline. Estimates, labelled. The
# engines' start, measured on one H100 with the image's stack (docs/features/cold-start.md): the 9B
# on a warm node 88 to 98 s to RUNNING (74 to 77 s of it four process starts); one 9B engine with
# Triton's cache empty 173 s outside Serve, to which Serve adds the actor and the engine-config task
# (about 38 s): about 211 s, inside this bound. The rest is not measured.
ENGINES_START_S = 300
HEAD_START_S = 120  # the head pod, its GCS, KubeRay submitting the serve config (estimate)
NODE_READY_S = 180  # an EKS GPU node launched until Ready (on paper: 2-4 min; not measured here)
IMAGE_PULL_MIB_S = 100  # a node pulling the image from ECR when it lacks it (estimate)
S3_READ_MIB_S = 200  # a worker reading the checkpoint through Ray's S3 mirror (estimate)
UNKNOWN_MODEL_GIB = 100  # a model the catalogue does not size: as if 100 GiB
# The deploy waits on the Job in steps that each fit the kubectl handler's Lambda (15 minutes):
# a step is at most WAIT_S, and the Job marks a window of its deadline every WINDOW_S.
WAIT_S = 14 * 60
WINDOW_S = 12 * 60
# The Job's pod may first pull the image (a system node other than the head's): Kubernetes' own
# deadline for the Job (activeDeadlineSeconds) gives it this much beside the program's.
POD_START_S = WAIT_S
# How long Kubernetes keeps a finished Job (the Job's ``ttlSecondsAfterFinished``): the deploy's
# waits after its success read it within seconds; a failed one that a rollback to a version that
# did not prune it left behind is gone before the next deploy applies it again and waits on it.
FINISHED_TTL_S = 5 * 60


def node_replacement_s(checkpoint_bytes: int | None, image_gib: float) -> int:
    """About how long one GPU node replaced by a node group update takes until its engine serves
    (whole minutes): the node joining, one pull of the compressed image, the node cache's fill of the
    checkpoint from S3 and a first engine start with empty compile caches (docs/features/cold-start.md
    has each part, measured or on paper)."""
    mib = (checkpoint_bytes if checkpoint_bytes is not None else UNKNOWN_MODEL_GIB * 2**30) / 2**20
    seconds = NODE_READY_S + image_gib / 2 * 1024 / IMAGE_PULL_MIB_S + mib / S3_READ_MIB_S + ENGINES_START_S
    return math.ceil(seconds / 60) * 60


def deadline_s(checkpoint_bytes: int | None, image_gib: float) -> int:
    """How long the Job waits for the rebuilt cluster to serve (whole minutes): the head's and the
    engines' start, one pull of the compressed image (about half its ``image_gib`` on disk) where a
    node lacks it, and each worker's read of the checkpoint (``None``: a model the catalogue does
    not size)."""
    mib = (checkpoint_bytes if checkpoint_bytes is not None else UNKNOWN_MODEL_GIB * 2**30) / 2**20
    seconds = ENGINES_START_S + HEAD_START_S + image_gib / 2 * 1024 / IMAGE_PULL_MIB_S + mib / S3_READ_MIB_S
    return math.ceil(seconds / 60) * 60


def step_s(checkpoint_bytes: int | None) -> int:
    """How long one Serve application of the serve rollout may take to serve again (whole minutes):
    its engines' start and each replica's read of the checkpoint, on nodes that have the image."""
    mib = (checkpoint_bytes if checkpoint_bytes is not None else UNKNOWN_MODEL_GIB * 2**30) / 2**20
    return math.ceil((ENGINES_START_S + mib / S3_READ_MIB_S) / 60) * 60


def windows(deadline: int) -> int:
    """How many windows of ``WINDOW_S`` the Job's deadline spans (the deploy's wait steps: one for
    the Job's start, one for each window but the last, one for its success)."""
    return max(1, math.ceil(deadline / WINDOW_S))


_CODE = pod_code.Shipped(__file__, FILE_NAME)
source = _CODE.source
source_digest = _CODE.digest


_constant = _CODE.constant  # parsed once (pod_code.Shipped)


@cache
def _program() -> dict[str, Any]:
    """The pod program's own names (it imports the standard library alone)."""
    return runpy.run_path(str(Path(__file__).with_name(FILE_NAME)))


def rollout_steps(current: dict[str, Any], target: dict[str, Any]) -> list[dict[str, Any]]:
    """The serve configs a change of ``current`` to ``target`` goes through, one Serve application
    changed a step: the serve rollout Job's own ``rollout_steps``, which the rehearsals run too."""
    steps: list[dict[str, Any]] = _program()["rollout_steps"](current, target)
    return steps


def settle_s() -> float:
    """How long after a step's patch the serve rollout first counts the application as serving (and
    so the least a step lasts: the rehearsals wait as long between their steps)."""
    return float(_constant("SETTLE_S"))


def serving_statuses() -> frozenset[str]:
    """A deployment's statuses that serve (Serve counts a scale event as running): what a rollout
    step waits for, and what ``verify`` accepts."""
    return frozenset(_program()["SERVING"])


def digest_annotation() -> str:
    return str(_constant("DIGEST_ANNOTATION"))


def env_names() -> dict[str, str]:
    return dict(_constant("ENV"))


def pod_job_label() -> str:
    return str(_constant("POD_JOB_LABEL"))


def wait_paths(deadline: int) -> list[str]:
    """The deploy's wait steps on the Job, in order: each a kubectl JSONPath that has a value once
    the step is passed (its start, each window but the last, its success)."""
    marks = [str(_constant("STARTED"))] + [f"{_constant('WINDOW')}{k}" for k in range(1, windows(deadline))]
    return [".metadata.annotations." + mark.replace(".", "\\.") for mark in marks] + [".status.succeeded"]


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
    "deadline_s",
    "digest_annotation",
    "env_names",
    "pod_job_label",
    "source",
    "source_digest",
    "wait_paths",
    "windows",
    "worker_bounds",
]
