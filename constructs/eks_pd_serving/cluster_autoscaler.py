"""The Cluster Autoscaler (Helm, kubernetes/autoscaler) with EKS Pod Identity, on the system nodes.

It finds the managed node groups by the tags EKS puts on their Auto Scaling groups
(``k8s.io/cluster-autoscaler/enabled`` and ``k8s.io/cluster-autoscaler/<cluster>``) and moves each
group's desired size between the min and max the stack sets; CloudFormation never sees those
moves. Its IAM policy is the one the release's AWS README publishes, narrowed: the two mutating
actions only on Auto Scaling groups of this cluster (the ``eks:cluster-name`` tag EKS sets on
managed node groups' groups), ``eks:DescribeNodegroup`` only on this cluster's node groups.
"""

from __future__ import annotations

import copy
from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from . import versions
from ._private import nag
from ._private.helm import pod_identity_release
from ._private.policies import published_policy
from .layout import SYSTEM_NODE_LABELS

RELEASE = "cluster-autoscaler"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"
MUTATING_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")
DESCRIBE_NODEGROUP = "eks:DescribeNodegroup"
# EKS tags each managed node group's Auto Scaling group with its cluster's name; the autoscaler's
# own AWS provider reads the same tag to recognise managed node groups (aws_manager.go).
CLUSTER_TAG_CONDITION = "aws:ResourceTag/eks:cluster-name"
# The chart's own documented example (values.yaml, `resources`).
RESOURCES = {"cpu": "100m", "memory": "300Mi"}


def scoped_policy(document: dict[str, Any], cluster_name: str) -> dict[str, Any]:
    """``document`` with every action kept and the two narrowings above applied."""
    scoped = copy.deepcopy(document)
    nodegroups = f"arn:{Aws.PARTITION}:eks:{Aws.REGION}:{Aws.ACCOUNT_ID}:nodegroup/{cluster_name}/*/*"
    statements = []
    for statement in scoped["Statement"]:
        actions = statement["Action"]
        if set(actions) == set(MUTATING_ACTIONS):
            statement["Condition"] = {"StringEquals": {CLUSTER_TAG_CONDITION: cluster_name}}
        statements.append(statement)
        if DESCRIBE_NODEGROUP in actions:
            statement["Action"] = [a for a in actions if a != DESCRIBE_NODEGROUP]
            statements.append({"Effect": "Allow", "Action": [DESCRIBE_NODEGROUP], "Resource": [nodegroups]})
    scoped["Statement"] = statements
    return scoped


class ClusterAutoscaler(Construct):
    """:param cluster: the cluster whose managed node groups it scales.
    :param kubernetes_version: the cluster's version; the image of the same minor runs.
    :param region: the region (given, so it needs no instance metadata to find it).
    """

    def __init__(
        self, scope: Construct, id: str, *, cluster: eks.ICluster, kubernetes_version: str, region: str
    ) -> None:
        super().__init__(scope, id)
        installed = pod_identity_release(
            self,
            cluster=cluster,
            policy_document=scoped_policy(published_policy(versions.CLUSTER_AUTOSCALER_POLICY), cluster.cluster_name),
            policy_description=f"Cluster Autoscaler (published policy of v1.35.2, scoped to {cluster.cluster_name})",
            controller="Cluster Autoscaler",
            service_account=SERVICE_ACCOUNT,
            pin=versions.CLUSTER_AUTOSCALER_CHART,
            release=RELEASE,
            namespace=NAMESPACE,
            values={
                "cloudProvider": "aws",
                "awsRegion": region,
                "autoDiscovery": {"clusterName": cluster.cluster_name},
                "fullnameOverride": RELEASE,
                "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
                "image": {"tag": versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[kubernetes_version]},
                "nodeSelector": SYSTEM_NODE_LABELS,
                "resources": {"requests": dict(RESOURCES), "limits": dict(RESOURCES)},
            },
        )
        self.policy, self.role, self.association, self.chart = installed.parts()
        nag.acknowledge(
            self.policy,
            {
                f"{nag.PACK}-IAM5[Resource::*]": (
                    "The Cluster Autoscaler's published policy: its Describe* and "
                    "GetInstanceTypesFromInstanceRequirements actions have no resource-level permissions; "
                    "SetDesiredCapacity and TerminateInstanceInAutoScalingGroup are conditioned on the "
                    "eks:cluster-name tag of this cluster's Auto Scaling groups."
                ),
                f"{nag.PACK}-IAM5[Resource::{nag.arn_prefix(self, 'eks')}:nodegroup/"
                f"<{nag.logical_id(cluster.node.default_child)}>/*/*]": (
                    "eks:DescribeNodegroup on this cluster's node groups only (their names and ids are "
                    "chosen by EKS at creation)."
                ),
            },
        )
