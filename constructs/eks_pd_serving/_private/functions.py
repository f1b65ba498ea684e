"""The one way this package makes a Lambda that calls only AWS APIs: Python 3.14, its code a folder
of the package (standard library and boto3 only), its own log group of the stack, outside the VPC
(checkov's CKV_AWS_117 skipped with the reason: no ENI to release on destroy)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from . import checkov


def api_function(
    scope: Construct,
    id: str,
    *,
    description: str,
    handler: str,
    code_dir: Path,
    timeout: Duration,
    log_group: logs.ILogGroup,
    outside_vpc_reason: str,
) -> lambda_.Function:
    function = lambda_.Function(
        scope,
        id,
        description=description,
        runtime=lambda_.Runtime.PYTHON_3_14,
        handler=handler,
        code=lambda_.Code.from_asset(str(code_dir), exclude=["__pycache__", "*.pyc", "__init__.py"]),
        timeout=timeout,
        log_group=log_group,
    )
    cfn = function.node.default_child
    assert isinstance(cfn, lambda_.CfnFunction)
    checkov.skip(cfn, checkov.LAMBDA_OUTSIDE_VPC, outside_vpc_reason)
    return function
