"""NVIDIA and EFA device plugins (Helm), on the GPU nodes only. The AL2023 NVIDIA AMI carries
the drivers and the host EFA software but not the plugins that advertise
``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` to the scheduler."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import versions
from ._private.helm import helm_chart
from .layout import GPU_NODE_LABELS

NVIDIA_RELEASE = "nvidia-device-plugin"
EFA_RELEASE = "aws-efa-k8s-device-plugin"
NAMESPACE = "kube-system"

# The chart's default affinity asks for Node Feature Discovery labels that EKS nodes do not
# carry; a list in a Helm override replaces the chart's list, so this is the only term left.
_GPU_NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": key, "operator": "In", "values": [value]} for key, value in GPU_NODE_LABELS.items()
                    ]
                }
            ]
        }
    }
}


class GpuDevicePlugins(Construct):
    """The NVIDIA and EFA device plugins (Helm), on the GPU nodes only: each node then advertises
    ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa``.

    :param cluster: the cluster they are installed in.
    """

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster) -> None:
        super().__init__(scope, id)
        self.nvidia = helm_chart(
            self, "NvidiaDevicePlugin", cluster=cluster, pin=versions.NVIDIA_DEVICE_PLUGIN_CHART,
            release=NVIDIA_RELEASE, namespace=NAMESPACE, values={"affinity": _GPU_NODE_AFFINITY},
        )  # fmt: skip
        self.efa = helm_chart(
            self, "EfaDevicePlugin", cluster=cluster, pin=versions.EFA_DEVICE_PLUGIN_CHART,
            release=EFA_RELEASE, namespace=NAMESPACE, values={"nodeSelector": GPU_NODE_LABELS},
        )  # fmt: skip
        self.charts = [self.nvidia, self.efa]
