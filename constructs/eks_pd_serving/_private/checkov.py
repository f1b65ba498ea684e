"""checkov skips, each on the one resource it concerns (CloudFormation resource metadata), so a
global skip in .checkov.yaml cannot hide a later resource."""

from __future__ import annotations

from aws_cdk import CfnResource

LAMBDA_OUTSIDE_VPC = "CKV_AWS_117"
IAM_WRITE_WITHOUT_CONSTRAINTS = "CKV_AWS_111"


def skip(resource: CfnResource, check_id: str, reason: str) -> None:
    resource.add_metadata("checkov", {"skip": [{"id": check_id, "comment": reason}]})
