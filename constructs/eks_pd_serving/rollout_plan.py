"""What a deploy rolls, decided before any manifest is made: the cluster config's digest, the
rollout Job where the deploy rebuilds the cluster (``recreate``), and the serve rollout that
changes the failover's applications one at a time. A Job's name carries the digest of its whole
spec as the template holds it (tokens as CloudFormation has them), so the plan is made with the
stack's resolver; ``PdServing`` makes it once from the mapping's props and ``RayServiceManifest``
applies it as given."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import rollout
from .k8s import PodProgram, RayServiceProps, RolloutSpec
from .k8s.ray_service import ray_service_spec, serve_config_yaml
from .k8s.rollout import job_spec, spec_digest
from .k8s.serve_config import build_serve_config

# The Job's deadline when the caller gives none (the fixed one it had before ``rollout.deadline_s``;
# ``PdServing`` always passes the derived one).
ROLLOUT_DEADLINE_S = 11 * 60
# One Serve application's bound in the serve rollout when the caller gives none (``rollout.step_s``
# of an unknown model; ``PdServing`` passes the model's).
SERVE_STEP_S = 10 * 60
#: What turns a value holding CloudFormation tokens into the template's own (``Stack.resolve``).
Resolve = Callable[[Any], Any]


@dataclass(frozen=True)
class RolloutPlan:
    """The rollouts of one RayService's deploy."""

    #: The digest of the cluster config as the template holds it.
    cluster_digest: str
    #: The RayService's annotations where this deploy rebuilds the cluster (the rollout Job's
    #: ``recreate``, KubeRay's ``NewCluster``): the digest, which the serve rollout reads there.
    #: None under ``manual``, where nothing rebuilds it.
    annotations: Mapping[str, str] | None
    #: The rollout Job (``recreate``); None otherwise.
    rollout: RolloutSpec | None
    #: The serve rollout Job (the failover's layout: each phase an application); None otherwise.
    serve_rollout: RolloutSpec | None


def rollout_program(name: str) -> PodProgram:
    """The rollout Jobs' program (``rollout/eks_pd_rollout.py``) as the namespace chart ships it."""
    return PodProgram(
        config_map=f"{name}-rollout-program",
        file_name=rollout.FILE_NAME,
        source=rollout.source(),
        digest=rollout.source_digest(),
        mount_path=rollout.MOUNT_PATH,
        annotation="eks-pd.io/rollout-code",
    )


def with_rollout_program(props: RayServiceProps) -> RayServiceProps:
    """``props`` shipping the rollout Jobs' program once, with the namespace (applied before either
    Job, deleted after); unchanged where they already name one."""
    return props if props.rollout_program else replace(props, rollout_program=rollout_program(props.name))


def rollout_plan(
    props: RayServiceProps,
    resolve: Resolve,
    *,
    converge: bool = False,
    rollout_deadline_s: int = ROLLOUT_DEADLINE_S,
    serve_step_s: int = SERVE_STEP_S,
) -> RolloutPlan:
    """The rollouts of ``props`` (as ``with_rollout_program`` gives them). ``converge``: the deploy
    rebuilds the cluster after each change of its config (``recreate``), its Job waiting
    ``rollout_deadline_s``; ``serve_step_s``: how long each application of the serve rollout may
    take to serve again."""
    resolved = resolve(ray_service_spec(props)["rayClusterConfig"])
    cluster_digest = rollout.cluster_config_digest(resolved)
    rebuilds = converge or props.upgrade_strategy == "NewCluster"
    annotations = {rollout.digest_annotation(): cluster_digest} if rebuilds else None
    recreate = None
    if converge:
        spec = _rollout_spec(props, cluster_digest, rollout.worker_bounds(resolved), rollout_deadline_s)
        recreate = _named(spec, resolve)
    serve = None
    if any(served.failover for served in props.models):
        applications = len(build_serve_config(props.models)["applications"])
        text = serve_config_yaml(props)
        digest = hashlib.sha256(json.dumps(resolve(text), sort_keys=True).encode()).hexdigest()
        spec = _serve_rollout_spec(props, text, digest, serve_step_s, serve_step_s * applications)
        if rebuilds:
            # A changed cluster config is rebuilt by this deploy: the serve config then goes along
            # with the RayService, not onto the old cluster. Under manual it rolls onto the running one.
            spec = replace(spec, code={**spec.code, rollout.digest_annotation(): cluster_digest})
        serve = _named(spec, resolve)
    return RolloutPlan(cluster_digest, annotations, recreate, serve)


def _named(spec: RolloutSpec, resolve: Resolve) -> RolloutSpec:
    """The Job's name carries a digest of its whole spec as the template holds it."""
    return replace(spec, template_digest=spec_digest(resolve(job_spec(spec))))


def _serve_rollout_spec(
    props: RayServiceProps, serve_config: str, digest: str, step_s: int, deadline_s: int
) -> RolloutSpec:
    """The serve rollout: its Job is named for ``digest`` (of the serve config as the template holds
    it), and given ``deadline_s`` in all (a step per application at most)."""
    program = props.failover_program
    code = {program.annotation: program.digest} if program is not None else {}
    return replace(
        _rollout_spec(props, digest, {}, deadline_s),
        mode="serve",
        serve_config=serve_config,
        step_s=step_s,
        code=code,
    )


def _rollout_spec(
    props: RayServiceProps, digest: str, bounds: dict[str, dict[str, int]], deadline_s: int
) -> RolloutSpec:
    """A rollout Job's spec, its program the one ``props`` ships (both Jobs read the same ConfigMap:
    a Job's pod reads it once, at its start)."""
    names = rollout.env_names()
    program = props.rollout_program or rollout_program(props.name)
    return RolloutSpec(
        ray_service=props.name,
        namespace=props.namespace,
        digest=digest,
        program=program,
        ships_program=props.rollout_program is None,
        env_names=names,
        image=props.image,
        node_selector=props.system_node_selector,
        deadline_s=deadline_s,
        window_s=rollout.WINDOW_S,
        pod_start_s=rollout.POD_START_S,
        pod_job_label=rollout.pod_job_label(),
        finished_ttl_s=rollout.FINISHED_TTL_S,
        bounds=bounds,
    )
