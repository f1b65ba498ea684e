"""EKS Pod Identity for one service account: a role the agent add-on may assume for it, with one
managed policy (a customer managed one, or AWS's), and the association. Children keep the ids
Role, PolicyArn, PodIdentity."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

POD_IDENTITY_SERVICE = "pods.eks.amazonaws.com"


def pod_identity_service_role(
    scope: Construct,
    *,
    policy_arn: str | None,
    description: str,
    session: tuple[str, str, str] | None = None,
) -> iam.Role:
    """The role, trusted by the Pod Identity service with AssumeRole and TagSession, carrying the
    one managed policy (None: only what is granted to it later); an EKS add-on may own the
    association itself (CfnAddon). ``session``: (cluster name, namespace, service account), the
    session tags Pod Identity sets, which the trust then requires (EKS user guide, "Create IAM role
    with trust policy required by EKS Pod Identity", Setting Conditions): without them any
    association in the account, on any cluster, could name this role."""
    principal: iam.IPrincipal = iam.ServicePrincipal(POD_IDENTITY_SERVICE)
    if session is not None:
        cluster_name, namespace, service_account = session
        principal = iam.PrincipalWithConditions(
            principal,
            {
                "StringEquals": {
                    "aws:RequestTag/eks-cluster-name": cluster_name,
                    "aws:RequestTag/kubernetes-namespace": namespace,
                    "aws:RequestTag/kubernetes-service-account": service_account,
                }
            },
        )
    role = iam.Role(
        scope,
        "Role",
        assumed_by=principal,
        description=description,
        managed_policies=[iam.ManagedPolicy.from_managed_policy_arn(scope, "PolicyArn", policy_arn)]
        if policy_arn
        else None,
    )
    role.assume_role_policy.add_statements(  # type: ignore[union-attr]
        iam.PolicyStatement(actions=["sts:TagSession"], principals=[principal])
    )
    return role


def pod_identity_role(
    scope: Construct,
    *,
    cluster: eks.ICluster,
    namespace: str,
    service_account: str,
    policy_arn: str | None = None,
    description: str,
) -> tuple[iam.Role, eks.CfnPodIdentityAssociation]:
    """The role and the association of ``namespace``/``service_account`` with it; pods get
    credentials only if the association exists when they start, so charts depend on it."""
    role = pod_identity_service_role(
        scope,
        policy_arn=policy_arn,
        description=description,
        session=(cluster.cluster_name, namespace, service_account),
    )
    association = eks.CfnPodIdentityAssociation(
        scope,
        "PodIdentity",
        cluster_name=cluster.cluster_name,
        namespace=namespace,
        service_account=service_account,
        role_arn=role.role_arn,
    )
    return role, association
