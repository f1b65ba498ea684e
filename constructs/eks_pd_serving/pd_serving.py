"""The whole deployment as one construct: VPC to RayService."""

from __future__ import annotations

from constructs import Construct

from .cluster import EksCluster
from .config import DeploymentConfig
from .device_plugins import GpuDevicePlugins
from .gpu_node_group import EfaGpuNodeGroup
from .kuberay_operator import KubeRayOperator
from .network import Network
from .ray_service import RayServiceManifest


class PdServing(Construct):
    """Prefill/decode LLM serving on EKS, configured by one validated ``DeploymentConfig``."""

    def __init__(self, scope: Construct, id: str, *, config: DeploymentConfig) -> None:
        super().__init__(scope, id)
        self.config = config
        self.network = Network(self, "Network", config=config)
        self.eks = EksCluster(self, "Cluster", config=config, network=self.network)
        cluster = self.eks.cluster
        self.gpu_nodes = EfaGpuNodeGroup(self, "GpuNodes", config=config, network=self.network, cluster=cluster)
        for addon in self.eks.node_addons:
            self.gpu_nodes.nodegroup.node.add_dependency(addon)

        self.kuberay = KubeRayOperator(self, "KubeRay", cluster=self.eks.handle)
        self.kuberay.node.add_dependency(self.eks.system_nodes)
        self.device_plugins = GpuDevicePlugins(self, "DevicePlugins", cluster=self.eks.handle)
        self.device_plugins.node.add_dependency(self.gpu_nodes.nodegroup)

        self.ray_service = RayServiceManifest(
            self,
            "RayService",
            config=config,
            cluster=cluster,
            depends_on=[self.kuberay, self.device_plugins, self.eks.system_nodes, self.gpu_nodes.nodegroup],
        )
