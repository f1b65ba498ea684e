"""The KubeRay operator (Helm), on the system nodes. Helm installs its CRDs: at about 1 MB
each they cannot travel through a CloudFormation-embedded manifest."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import versions
from ._private.helm import helm_chart
from .layout import SYSTEM_NODE_LABELS

RELEASE = "kuberay-operator"
NAMESPACE = "kuberay-system"


class KubeRayOperator(Construct):
    """The KubeRay operator (Helm release ``kuberay-operator``) on the system nodes; its chart
    installs the RayCluster, RayJob and RayService CRDs.

    :param cluster: the cluster it is installed in.
    """

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster) -> None:
        super().__init__(scope, id)
        self.chart = helm_chart(
            self,
            "Resource",
            cluster=cluster,
            pin=versions.KUBERAY_CHART,
            release=RELEASE,
            namespace=NAMESPACE,
            create_namespace=True,
            values={"nodeSelector": SYSTEM_NODE_LABELS},
        )
