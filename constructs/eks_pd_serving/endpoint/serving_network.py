"""The serving namespace's NetworkPolicies (every exposure): the Ray head's control ports closed
to all but the Ray cluster and the KubeRay operator."""

from __future__ import annotations

import cdk8s
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from .._private.manifests import adopting_manifest
from ..k8s import MetricsAccessChart, ServingNetworkChart, ServingNetworkProps
from ..ray_service import RayServiceManifest


class ServingNetwork(Construct):
    """:param props: namespace, operator namespace, client CIDRs (``ServingNetworkProps``).
    :param cluster: the cluster the policies are applied to (its VPC CNI enforces them).
    :param ray_service: the RayService manifest, which creates the namespace: applied after it,
        deleted before it.

    With ``props.metrics_scraper_namespace``, the metrics port's policy is a second manifest.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: ServingNetworkProps,
        cluster: eks.ICluster,
        ray_service: RayServiceManifest,
    ) -> None:
        super().__init__(scope, id)
        self.props = props
        self.chart = ServingNetworkChart(cdk8s.App(), "ServingNetwork", props=props)
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        self.manifest.node.add_dependency(ray_service.manifest)
        self.metrics_manifest: eks.KubernetesManifest | None = None
        if props.metrics_scraper_namespace:
            self.metrics_chart = MetricsAccessChart(cdk8s.App(), "MetricsAccess", props=props)
            # Once part of the manifest above: an update finds it in place (kubectl's prune never
            # deletes a NetworkPolicy, so the two need no order).
            self.metrics_manifest = adopting_manifest(cluster, f"{id}MetricsChart", self.metrics_chart)
            self.metrics_manifest.node.add_dependency(ray_service.manifest)
