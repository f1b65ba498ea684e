"""The one way this package installs a Helm chart: release and namespace explicit (a renamed
construct never renames what is deployed), wait for the pods, within the handler's 15 minutes;
and the one way it installs a controller that calls AWS (the chart plus its Pod Identity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from ..versions import ChartPin
from .pod_identity import pod_identity_role

TIMEOUT = Duration.minutes(10)


def helm_chart(
    scope: Construct,
    id: str,
    *,
    cluster: eks.ICluster,
    pin: ChartPin,
    release: str,
    namespace: str,
    values: dict[str, Any],
    create_namespace: bool = False,
) -> eks.HelmChart:
    return eks.HelmChart(
        scope,
        id,
        cluster=cluster,
        chart=pin.chart,
        repository=pin.repository,
        version=pin.version,
        release=release,
        namespace=namespace,
        values=values,
        wait=True,
        timeout=TIMEOUT,
        create_namespace=create_namespace or None,  # unset rather than false: the template stays as it was
    )


@dataclass(frozen=True)
class PodIdentityRelease:
    """A controller installed as a Helm release whose service account gets an IAM policy through
    EKS Pod Identity (the AWS Load Balancer Controller, the Cluster Autoscaler)."""

    policy: iam.CfnManagedPolicy
    role: iam.Role
    association: eks.CfnPodIdentityAssociation
    chart: eks.HelmChart

    def parts(self) -> tuple[iam.CfnManagedPolicy, iam.Role, eks.CfnPodIdentityAssociation, eks.HelmChart]:
        return self.policy, self.role, self.association, self.chart


def pod_identity_release(
    scope: Construct,
    *,
    cluster: eks.ICluster,
    policy_document: dict[str, Any],
    policy_description: str,
    controller: str,
    service_account: str,
    pin: ChartPin,
    release: str,
    namespace: str,
    values: dict[str, Any],
) -> PodIdentityRelease:
    """The policy (the L1 resource: a published document goes in exactly as published; the L2
    would rewrite and merge its statements), the Pod Identity role and association of
    ``namespace``/``service_account``, and the chart (``Resource``), which waits for the
    association: credentials are injected when the pod starts. ``controller``: its name, in the
    role's description."""
    policy = iam.CfnManagedPolicy(scope, "Policy", description=policy_description, policy_document=policy_document)
    role, association = pod_identity_role(
        scope,
        cluster=cluster,
        namespace=namespace,
        service_account=service_account,
        policy_arn=policy.ref,
        description=f"{controller} in {cluster.cluster_name} (EKS Pod Identity)",
    )
    chart = helm_chart(scope, "Resource", cluster=cluster, pin=pin, release=release, namespace=namespace, values=values)
    chart.node.add_dependency(association)
    return PodIdentityRelease(policy=policy, role=role, association=association, chart=chart)
