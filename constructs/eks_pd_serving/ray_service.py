"""Applies the cdk8s RayService chart to the cluster, after everything it runs on."""

from __future__ import annotations

from collections.abc import Sequence

import cdk8s
from aws_cdk import Duration, Stack
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import rollout
from ._private.manifests import adopting_manifest
from .config import ConstructError
from .k8s import RayNamespaceChart, RayServiceChart, RayServiceProps, RolloutChart, RolloutSpec, gpu_accounting
from .rollout_plan import RolloutPlan, rollout_plan, with_rollout_program


class RayServiceManifest(Construct):
    """The RayService, and its namespace in a manifest of its own that is deleted after it.

    On destroy the RayService's ``kubectl delete`` waits for its finalizers, KubeRay's GCS cleanup
    Job among them, while the namespace, the head's service account and the key check's code are
    still there; then the namespace goes.

    :param props: the chart's typed props (``mapping.ray_service_props`` builds them from the settings).
    :param cluster: the cluster the manifest is applied to.
    :param depends_on: what must exist first and be deleted after (operator, plugins, nodes).
        Default: () (nothing).
    :param rollouts: the rollouts of this deploy, made by ``rollout_plan.rollout_plan`` from ``props``
        as ``rollout_plan.with_rollout_program`` gives them (``PdServing`` passes the settings':
        ``ray_upgrade_strategy=recreate`` rebuilds the cluster through the rollout Job, its deadline
        and each serve-rollout step from the model's size). Default: ``rollout_plan(props, <this
        stack's resolver>)``: no rebuild by the deploy, ``SERVE_STEP_S`` (600) a serve-rollout step.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: RayServiceProps,
        cluster: eks.ICluster,
        depends_on: Sequence[Construct] = (),
        rollouts: RolloutPlan | None = None,
    ) -> None:
        super().__init__(scope, id)
        refuse_gpu_shortfall(self, props)
        self.props = props = with_rollout_program(props)
        plan = rollouts or rollout_plan(props, Stack.of(self).resolve)
        self.plan = plan
        self.cluster_digest = plan.cluster_digest
        self.rollout: RolloutSpec | None = plan.rollout
        self.serve_rollout: RolloutSpec | None = plan.serve_rollout
        self.namespace_chart = RayNamespaceChart(cdk8s.App(), "RayNamespace", props=props)
        # Once part of the RayService's manifest: an update takes its objects over first.
        self.namespace_manifest = adopting_manifest(cluster, f"{id}NamespaceChart", self.namespace_chart)
        self.chart = RayServiceChart(
            cdk8s.App(), "RayService", props=props, annotations=dict(plan.annotations) if plan.annotations else None
        )
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        self.manifest.node.add_dependency(self.namespace_manifest)
        self.serve_rollout_waits: list[eks.KubernetesObjectValue] = []
        if self.serve_rollout is not None:
            # Before the RayService's manifest: the serve config rolls one application at a time
            # there, and the manifest then applies the text the RayService already holds.
            serve_manifest = cluster.add_cdk8s_chart(
                f"{id}ServeRollout", RolloutChart(cdk8s.App(), "ServeRollout", spec=self.serve_rollout)
            )
            # After what the RayService's needs too: the system nodes its pod runs on, the CRD it reads.
            for dependency in (self.namespace_manifest, *depends_on):
                serve_manifest.node.add_dependency(dependency)
            self.serve_rollout_waits = _job_waits(
                self,
                "ServeRollout",
                cluster,
                self.serve_rollout,
                serve_manifest,
                self.serve_rollout.deadline_s,
                props.namespace,
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


def refuse_gpu_shortfall(scope: Construct, props: RayServiceProps) -> None:
    """``ConstructError`` (code ``GpuShortfall``, at ``scope``'s path) when ``props``' models need
    more GPUs than their worker groups hold: every model counted, not only the settings' one."""
    if short := gpu_accounting.shortfall(props):
        raise ConstructError(scope, "GpuShortfall", short)


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
