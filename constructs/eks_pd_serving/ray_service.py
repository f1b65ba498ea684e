"""Applies the cdk8s RayService chart to the cluster, after everything it runs on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

import cdk8s
from aws_cdk import Duration, Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import rollout
from ._private.manifests import adopting_manifest
from .config import ConstructError
from .k8s import (
    PodProgram,
    RayNamespaceChart,
    RayServiceChart,
    RayServiceProps,
    RolloutChart,
    RolloutSpec,
    gpu_accounting,
)
from .k8s.ray_service import ray_service_spec, serve_config_yaml
from .k8s.rollout import job_spec, spec_digest
from .k8s.serve_config import build_serve_config

# The Job's deadline when the caller gives none (the fixed one it had before ``rollout.deadline_s``;
# ``PdServing`` always passes the derived one).
ROLLOUT_DEADLINE_S = 11 * 60
# One Serve application's bound in the serve rollout when the caller gives none (``rollout.step_s``
# of an unknown model; ``PdServing`` passes the model's).
SERVE_STEP_S = 10 * 60


class RayServiceManifest(Construct):
    """The RayService, and its namespace in a manifest of its own that is deleted after it.

    On destroy the RayService's ``kubectl delete`` waits for its finalizers, KubeRay's GCS cleanup
    Job among them, while the namespace, the head's service account and the key check's code are
    still there; then the namespace goes.

    :param props: the chart's typed props (``mapping.ray_service_props`` builds them from the settings).
    :param cluster: the cluster the manifest is applied to.
    :param depends_on: what must exist first and be deleted after (operator, plugins, nodes).
        Default: () (nothing).
    :param converge: run the rollout Job after each change of the cluster config, and have the
        deploy wait until it succeeds (``ray_upgrade_strategy=recreate``). Default: False.
    :param rollout_deadline_s: how long the rollout Job waits for a rebuilt cluster to serve
        (``rollout.deadline_s`` derives it from the model and the image); the deploy waits on the
        Job in steps of ``rollout.WAIT_S`` at most, one per window of it. Default: ROLLOUT_DEADLINE_S (660).
    :param serve_step_s: with the failover's layout (each phase its own Serve application), a change
        of the serve config is rolled before the RayService's manifest by a Job of its own, one
        application at a time, each given this long to serve again (``rollout.step_s``); the deploy
        waits on it as on the rollout Job, and fails (rolling back) when a step does not serve.
        Default: SERVE_STEP_S (600).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: RayServiceProps,
        cluster: eks.ICluster,
        depends_on: Sequence[Construct] = (),
        converge: bool = False,
        rollout_deadline_s: int = ROLLOUT_DEADLINE_S,
        serve_step_s: int = SERVE_STEP_S,
    ) -> None:
        super().__init__(scope, id)
        if short := gpu_accounting.shortfall(props):  # every model counted, not only the settings' one
            raise ConstructError(self, "GpuShortfall", short)
        # The rollout Jobs' program, once, with the namespace (applied before either Job, deleted after).
        props = props if props.rollout_program else replace(props, rollout_program=rollout_program(props.name))
        self.props = props
        self.namespace_chart = RayNamespaceChart(cdk8s.App(), "RayNamespace", props=props)
        # Once part of the RayService's manifest: an update takes its objects over first.
        self.namespace_manifest = adopting_manifest(cluster, f"{id}NamespaceChart", self.namespace_chart)
        self.rollout: RolloutSpec | None = None
        # The digest of the template's own cluster config (tokens as CloudFormation has them), on the
        # RayService wherever this deploy rebuilds the cluster (the rollout Job's, or KubeRay's new
        # cluster): the serve rollout reads it there (below). Under manual nothing rebuilds it.
        resolved = Stack.of(self).resolve(ray_service_spec(props)["rayClusterConfig"])
        self.cluster_digest = rollout.cluster_config_digest(resolved)
        rebuilds = converge or props.upgrade_strategy == "NewCluster"
        annotations = {rollout.digest_annotation(): self.cluster_digest} if rebuilds else None
        if converge:
            spec = _rollout_spec(props, self.cluster_digest, rollout.worker_bounds(resolved), rollout_deadline_s)
            # The Job's name carries a digest of its whole spec as the template holds it.
            self.rollout = replace(spec, template_digest=spec_digest(Stack.of(self).resolve(job_spec(spec))))
        self.chart = RayServiceChart(cdk8s.App(), "RayService", props=self.props, annotations=annotations)
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        self.manifest.node.add_dependency(self.namespace_manifest)
        self.serve_rollout: RolloutSpec | None = None
        self.serve_rollout_waits: list[eks.KubernetesObjectValue] = []
        if any(served.failover for served in props.models):
            # Before the RayService's manifest: the serve config rolls one application at a time
            # there, and the manifest then applies the text the RayService already holds.
            applications = len(build_serve_config(props.models)["applications"])
            text = serve_config_yaml(props)
            digest = hashlib.sha256(json.dumps(Stack.of(self).resolve(text), sort_keys=True).encode()).hexdigest()
            spec = _serve_rollout_spec(props, text, digest, serve_step_s, serve_step_s * applications)
            if rebuilds:
                # A changed cluster config is rebuilt by this deploy: the serve config then goes along
                # with the RayService, not onto the old cluster. Under manual it rolls onto the running one.
                spec = replace(spec, code={**spec.code, rollout.digest_annotation(): self.cluster_digest})
            self.serve_rollout = replace(spec, template_digest=spec_digest(Stack.of(self).resolve(job_spec(spec))))
            serve_manifest = cluster.add_cdk8s_chart(
                f"{id}ServeRollout", RolloutChart(cdk8s.App(), "ServeRollout", spec=self.serve_rollout)
            )
            # After what the RayService's needs too: the system nodes its pod runs on, the CRD it reads.
            for dependency in (self.namespace_manifest, *depends_on):
                serve_manifest.node.add_dependency(dependency)
            self.serve_rollout_waits = _job_waits(
                self, "ServeRollout", cluster, self.serve_rollout, serve_manifest, spec.deadline_s, props.namespace
            )
            self.manifest.node.add_dependency(self.serve_rollout_waits[-1])
        # Created after, and so deleted before, the operator, the device plugins and the node
        # groups: KubeRay then tears the Ray pods down while it still runs.
        for dependency in depends_on:
            self.manifest.node.add_dependency(dependency)
        self.rollout_manifest: eks.KubernetesManifest | None = None
        self.rollout_wait: eks.KubernetesObjectValue | None = None
        if self.rollout is not None:
            # Its own manifest, pruned: applying a new Job deletes the one before (the kubectl
            # handler's `apply --prune`; Jobs are in kubectl's default prune list). A rollback, or a
            # deploy of that config again, then re-creates the old Job, which runs and rebuilds the
            # cluster back; a finished old Job left in place would pass at once on the new cluster.
            self.rollout_manifest = cluster.add_cdk8s_chart(
                f"{id}Rollout", RolloutChart(cdk8s.App(), "Rollout", spec=self.rollout)
            )
            self.rollout_manifest.node.add_dependency(self.manifest)
            self.rollout_waits = _job_waits(
                self, "Rollout", cluster, self.rollout, self.rollout_manifest, self.rollout.deadline_s, props.namespace
            )
            self.rollout_wait = self.rollout_waits[-1]


def _job_waits(
    scope: Construct,
    prefix: str,
    cluster: eks.ICluster,
    spec: RolloutSpec,
    manifest: Construct,
    deadline_s: int,
    namespace: str,
) -> list[eks.KubernetesObjectValue]:
    """Steps that each fit the kubectl handler's 15 minutes: the Job's start, each window of its
    deadline it marks on itself, its success (``<prefix>Wait``, the id it always had)."""
    previous: Construct = manifest
    waits: list[eks.KubernetesObjectValue] = []
    paths = rollout.wait_paths(deadline_s)
    for index, path in enumerate(paths):
        last = index == len(paths) - 1
        wait = eks.KubernetesObjectValue(
            scope,
            f"{prefix}Wait" if last else (f"{prefix}Started" if index == 0 else f"{prefix}Window{index}"),
            cluster=cluster,
            object_type="job",
            object_name=spec.job_name,
            object_namespace=namespace,
            json_path=path,
            timeout=Duration.seconds(rollout.WAIT_S),
        )
        wait.node.add_dependency(previous)
        waits.append(wait)
        previous = wait
    return waits


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
