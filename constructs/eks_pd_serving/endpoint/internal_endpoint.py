"""The internal endpoint (endpoint_exposure=internal): a LoadBalancer Service that the AWS Load
Balancer Controller turns into an internal NLB in the private subnets.

Order, both ways. Deploy: controller, then the Service (the controller reconciles it into an
NLB; the NLB is not a CloudFormation resource). Destroy: the Service first; `kubectl delete`
waits for the controller's finalizer, i.e. until the NLB, its target group and its security
groups are gone; then the controller; then nodes and VPC. Encoded as DependsOn edges here.
"""

from __future__ import annotations

import cdk8s
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from ..k8s import EndpointServiceChart, EndpointServiceProps
from ..ray_service import RayServiceManifest
from .load_balancer_controller import AwsLoadBalancerController


class InternalEndpoint(Construct):
    """:param props: Service name, namespace, NLB subnets and client CIDRs.
    :param cluster: the cluster.
    :param controller: the AWS Load Balancer Controller that owns the NLB.
    :param ray_service: the RayService (its namespace, and the head the Service selects).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        props: EndpointServiceProps,
        cluster: eks.ICluster,
        controller: AwsLoadBalancerController,
        ray_service: RayServiceManifest,
    ) -> None:
        super().__init__(scope, id)
        self.props = props
        self.chart = EndpointServiceChart(cdk8s.App(), "Endpoint", props=props)
        self.manifest = cluster.add_cdk8s_chart(f"{id}Chart", self.chart)
        self.manifest.node.add_dependency(controller.chart)
        self.manifest.node.add_dependency(ray_service.manifest)
