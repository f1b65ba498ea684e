"""cdk-nag (3.x, the `Validations` API) acknowledgments, each at the narrowest scope."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

PACK = "AwsSolutions"


def managed_policy(name: str) -> str:
    """The rule id of one AWS managed policy attached to a role (AwsSolutions-IAM4)."""
    return f"{PACK}-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def acknowledge(scope: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge ``{rule id: reason}`` on ``scope`` and nothing above it."""
    Validations.of(scope).acknowledge(
        *(Acknowledgment(id=f"{PACK}::{rule}", reason=reason) for rule, reason in findings.items())
    )


NODE_ROLE = {
    managed_policy("AmazonEKSWorkerNodePolicy"): (
        "EKS managed node groups require this AWS managed policy on the node role; it is "
        "maintained by AWS as EKS changes and grants only node-to-control-plane actions."
    ),
    managed_policy("AmazonEKS_CNI_Policy"): (
        "The VPC CNI add-on runs on the nodes and needs ENI/IP management; EKS documents this "
        "managed policy for it (pod identity for aws-node is a possible later narrowing)."
    ),
    managed_policy("AmazonEC2ContainerRegistryReadOnly"): (
        "Nodes pull the Ray LLM image from ECR (AWS DLC account 763104351884); read-only, no write or delete actions."
    ),
}

CLUSTER_ROLE = {
    managed_policy("AmazonEKSClusterPolicy"): (
        "The EKS service role must carry this AWS managed policy; EKS does not accept an "
        "equivalent customer policy in its place."
    ),
}


def logical_id(element: IConstruct | None) -> str:
    """The logical id of a CloudFormation element, as cdk-nag prints it inside a finding's id."""
    assert element is not None, "no CloudFormation element to name"
    stack = Stack.of(element)
    return str(stack.resolve(stack.get_logical_id(element)))  # type: ignore[arg-type]


def kubectl_provider(provider: IConstruct) -> dict[str, str]:
    """Findings on aws-cdk-lib's kubectl/Helm provider; two rule ids embed its logical ids."""
    handler = provider.node.find_child("Handler")
    handler_id = logical_id(handler.node.find_child("Resource"))
    condition_id = logical_id(handler.node.find_child("HasEcrPublic"))
    ecr_public = json.dumps(
        {
            "Fn::If": [
                condition_id,
                {
                    "Fn::Join": [
                        "",
                        [
                            "arn:",
                            {"Ref": "AWS::Partition"},
                            ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly",
                        ],
                    ]
                },
                {"Ref": "AWS::NoValue"},
            ]
        },
        separators=(",", ":"),
    )
    lambda_roles = (
        "aws-cdk-lib creates and scopes the kubectl/Helm provider's Lambda roles; this AWS managed "
        "policy is what a Lambda needs for "
    )
    return {
        managed_policy("service-role/AWSLambdaBasicExecutionRole"): lambda_roles + "its CloudWatch logs.",
        managed_policy("service-role/AWSLambdaVPCAccessExecutionRole"): lambda_roles
        + "its ENIs: it runs in the VPC to reach the private API endpoint.",
        managed_policy("AmazonEC2ContainerRegistryReadOnly"): lambda_roles
        + "pulling Helm charts from ECR (read-only).",
        f"{PACK}-IAM4[Policy::{ecr_public}]": lambda_roles
        + "pulling public ECR charts (read-only), attached only in regions that have ECR Public.",
        f"{PACK}-IAM5[Resource::<{handler_id}.Arn>:*]": (
            "The provider framework may invoke any version of its own handler function "
            "(<handler arn>:*); the wildcard covers versions of that one function only."
        ),
        f"{PACK}-L1": (
            "aws-cdk-lib chooses the kubectl handler's runtime together with the kubectl layer it "
            "ships; it moves with aws-cdk-lib upgrades."
        ),
    }


_LAMBDA_LOGS = managed_policy("service-role/AWSLambdaBasicExecutionRole")

CAPACITY_CHECK_FUNCTION = {
    _LAMBDA_LOGS: (
        "The capacity-check Lambda writes only its own CloudWatch logs; this AWS managed policy is "
        "the documented minimum for that."
    ),
    f"{PACK}-IAM5[Resource::*]": (
        "ec2:DescribeInstanceTypes, DescribeInstanceTypeOfferings, DescribeInstances and "
        "servicequotas:GetAWSDefaultServiceQuota support no resource-level permissions (Service "
        "Authorization Reference); all are read-only. GetServiceQuota is scoped to the G/VT and P "
        "quotas the node groups use."
    ),
}


def provider_framework(provider: IConstruct, handler: IConstruct) -> dict[str, str]:
    """aws-cdk-lib's custom-resource Provider framework Lambda, which invokes ``handler``."""
    handler_id = logical_id(handler.node.default_child)
    return {
        _LAMBDA_LOGS: "aws-cdk-lib's Provider framework Lambda writes only its own CloudWatch logs.",
        f"{PACK}-IAM5[Resource::<{handler_id}.Arn>:*]": (
            "The Provider framework may invoke any version of its own handler function "
            "(<handler arn>:*); the wildcard covers versions of that one function only."
        ),
    }


def published_policy_wildcards(document: dict[str, Any], source: str) -> dict[str, str]:
    """IAM5 for every wildcard resource of a policy taken unchanged from an upstream release."""
    reason = (
        f"{source}, unchanged: Describe* and Get* have no resource-level permissions; mutating actions "
        "are conditioned on the elbv2.k8s.aws/cluster resource tag the controller sets."
    )
    found = {}
    for statement in document["Statement"]:
        resources = statement["Resource"]
        for resource in [resources] if isinstance(resources, str) else resources:
            if "*" in resource:
                found[f"{PACK}-IAM5[Resource::{resource}]"] = reason
    return found
