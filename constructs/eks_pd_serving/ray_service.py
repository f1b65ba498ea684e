"""Applies the cdk8s RayService chart to the cluster, after everything it runs on."""

from __future__ import annotations

import cdk8s
from aws_cdk import Aws
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import versions
from .config import DeploymentConfig
from .k8s import RayServiceChart, RayServiceProps
from .ray_service_props import ray_service_props


class RayServiceManifest(Construct):
    """The RayService (and its namespace) as one Kubernetes manifest."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeploymentConfig,
        cluster: eks.Cluster,
        depends_on: list[Construct],
    ) -> None:
        super().__init__(scope, id)
        image = config.image or versions.ray_image_uri(config.region or Aws.REGION)
        self.props: RayServiceProps = ray_service_props(config, image)
        self.chart = RayServiceChart(cdk8s.App(), "RayService", props=self.props)
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        # Created after, and so deleted before, the operator, the device plugins and the node
        # groups: KubeRay then tears the Ray pods down while it still runs.
        for dependency in depends_on:
            self.manifest.node.add_dependency(dependency)
