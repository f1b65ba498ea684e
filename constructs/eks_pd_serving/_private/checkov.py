"""checkov skips, each on the one resource it concerns (CloudFormation resource metadata), so a
global skip in .checkov.yaml cannot hide a later resource."""

from __future__ import annotations

from aws_cdk import CfnResource, CustomResourceProviderBase, Stack
from constructs import IConstruct

LAMBDA_OUTSIDE_VPC = "CKV_AWS_117"
IAM_WRITE_WITHOUT_CONSTRAINTS = "CKV_AWS_111"
S3_ACCESS_LOGGING = "CKV_AWS_18"
S3_VERSIONING = "CKV_AWS_21"


def skip(resource: CfnResource, check_id: str, reason: str) -> None:
    """Add a skip to the resource's own list (a second skip keeps the first)."""
    earlier = (resource.get_metadata("checkov") or {}).get("skip", [])
    resource.add_metadata("checkov", {"skip": [*earlier, {"id": check_id, "comment": reason}]})


def skip_stack_provider(scope: IConstruct, provider_id: str, check_id: str, reason: str) -> None:
    """Skip on the handler of an aws-cdk-lib stack-level custom-resource provider (a singleton
    such as the VPC's default-SG restriction or a bucket's emptier)."""
    for provider in Stack.of(scope).node.children:
        if isinstance(provider, CustomResourceProviderBase) and provider.node.id.startswith(provider_id):
            handler = provider.node.find_child("Handler")
            assert isinstance(handler, CfnResource)
            skip(handler, check_id, reason)
