"""The AWS Load Balancer Controller (Helm, eks-charts) with EKS Pod Identity, on the system nodes.

It creates the internal NLB for the endpoint Service, outside CloudFormation; so it must run
until that Service is gone (see InternalEndpoint for the order). Its IAM policy is the one the
controller's release publishes (``policies/``), not a retyped one.
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from .. import versions
from .._private import checkov, nag
from .._private.helm import pod_identity_release
from .._private.policies import published_policy
from ..layout import SYSTEM_NODE_LABELS

RELEASE = "aws-load-balancer-controller"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "aws-load-balancer-controller"
VERSION = versions.AWS_LOAD_BALANCER_CONTROLLER_CHART.version


class AwsLoadBalancerController(Construct):
    """:param cluster: the cluster (its name goes into the chart values).
    :param vpc: the VPC (given to the controller, so it needs no instance metadata to find it).
    :param region: the region (likewise).
    """

    def __init__(self, scope: Construct, id: str, *, cluster: eks.ICluster, vpc: ec2.IVpc, region: str) -> None:
        super().__init__(scope, id)
        document = published_policy(versions.AWS_LOAD_BALANCER_CONTROLLER_POLICY)
        installed = pod_identity_release(
            self,
            cluster=cluster,
            policy_document=document,
            policy_description=f"AWS Load Balancer Controller v{VERSION} (published policy)",
            controller="AWS Load Balancer Controller",
            service_account=SERVICE_ACCOUNT,
            pin=versions.AWS_LOAD_BALANCER_CONTROLLER_CHART,
            release=RELEASE,
            namespace=NAMESPACE,
            values={
                "clusterName": cluster.cluster_name,
                "region": region,
                "vpcId": vpc.vpc_id,
                "serviceAccount": {"create": True, "name": SERVICE_ACCOUNT},
                "nodeSelector": SYSTEM_NODE_LABELS,
                # Off: with it on, every new LoadBalancer Service in the cluster would go through
                # this controller's webhook. The endpoint Service names its class instead.
                "enableServiceMutatorWebhook": False,
            },
        )
        self.policy, self.role, self.association, self.chart = installed.parts()
        source = f"The AWS Load Balancer Controller's published policy (v{VERSION})"
        nag.acknowledge(self.policy, nag.published_policy_wildcards(document, source))
        checkov.skip(
            self.policy,
            checkov.IAM_WRITE_WITHOUT_CONSTRAINTS,
            f"{source}: its writes on load balancers, target groups and security groups are tag-conditioned",
        )
