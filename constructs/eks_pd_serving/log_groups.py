"""Log groups the stack owns, so that `cdk destroy` removes them: EKS and Lambda otherwise
create theirs on first write, outside CloudFormation, with no retention, and they outlive the
stack."""

from __future__ import annotations

from aws_cdk import Aws, CfnResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from .catalog import LOG_RETENTION_DAYS

_LAMBDA_TYPE = "AWS::Lambda::Function"


def retention(days: int) -> logs.RetentionDays:
    """The RetentionDays member for ``days`` (one of LOG_RETENTION_DAYS); the enum lists its
    finite members in the same ascending order."""
    members = [member for member in logs.RetentionDays if member is not logs.RetentionDays.INFINITE]
    return dict(zip(LOG_RETENTION_DAYS, members, strict=True))[days]


class LogGroups(Construct):
    """A KMS key for the stack's log groups and a way to create them.

    :param retention_days: retention of every group created here. Default: 30.
    """

    def __init__(self, scope: Construct, id: str, *, retention_days: int = 30) -> None:
        super().__init__(scope, id)
        self.retention = retention(retention_days)
        self.key = kms.Key(
            self,
            "Key",
            description="Encryption of the deployment's CloudWatch log groups",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(30),
        )
        self.key.grant_encrypt_decrypt(iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com"))

    def group(self, scope: Construct, id: str, *, log_group_name: str | None = None) -> logs.LogGroup:
        """A KMS-encrypted group with this construct's retention, deleted with the stack."""
        return logs.LogGroup(
            scope,
            id,
            log_group_name=log_group_name,
            encryption_key=self.key,
            retention=self.retention,
            removal_policy=RemovalPolicy.DESTROY,
        )

    def adopt_lambda_logs(self, scope: IConstruct) -> list[logs.LogGroup]:
        """Give every Lambda function under ``scope`` (aws-cdk-lib's own providers included)
        that has no log group of its own one of ours, through its LoggingConfig."""
        created = []
        for node in scope.node.find_all():
            if not _is_lambda_without_log_group(node):
                continue
            assert isinstance(node, CfnResource)
            group = self.group(node.node.scope, f"{node.node.id}LogGroup")  # type: ignore[arg-type]
            node.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
            created.append(group)
        return created


def _is_lambda_without_log_group(node: IConstruct) -> bool:
    if isinstance(node, lambda_.CfnFunction):
        config = Stack.of(node).resolve(node.logging_config) or {}
        return not config.get("logGroup")
    # aws-cdk-lib writes CustomResourceProvider functions as plain CfnResource, never with a group.
    return isinstance(node, CfnResource) and node.cfn_resource_type == _LAMBDA_TYPE
