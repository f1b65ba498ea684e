"""Applies the cdk8s RayService chart to the cluster, after everything it runs on."""

from __future__ import annotations

from collections.abc import Sequence

import cdk8s
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from ._private.manifests import adopting_manifest
from .k8s import RayNamespaceChart, RayServiceChart, RayServiceProps


class RayServiceManifest(Construct):
    """The RayService, and its namespace in a manifest of its own that is deleted after it.

    On destroy the RayService's ``kubectl delete`` waits for its finalizers, KubeRay's GCS cleanup
    Job among them, while the namespace, the head's service account and the key check's code are
    still there; then the namespace goes.

    :param props: the chart's typed props (``mapping.ray_service_props`` builds them from the settings).
    :param cluster: the cluster the manifest is applied to.
    :param depends_on: what must exist first and be deleted after (operator, plugins, nodes).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: RayServiceProps,
        cluster: eks.Cluster,
        depends_on: Sequence[Construct] = (),
    ) -> None:
        super().__init__(scope, id)
        self.props = props
        self.namespace_chart = RayNamespaceChart(cdk8s.App(), "RayNamespace", props=props)
        # Once part of the RayService's manifest: an update takes its objects over first.
        self.namespace_manifest = adopting_manifest(cluster, f"{id}NamespaceChart", self.namespace_chart)
        self.chart = RayServiceChart(cdk8s.App(), "RayService", props=self.props)
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        self.manifest.node.add_dependency(self.namespace_manifest)
        # Created after, and so deleted before, the operator, the device plugins and the node
        # groups: KubeRay then tears the Ray pods down while it still runs.
        for dependency in depends_on:
            self.manifest.node.add_dependency(dependency)
