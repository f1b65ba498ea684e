"""Log groups the stack owns, so that `cdk destroy` removes them: EKS and Lambda otherwise
create theirs on first write, outside CloudFormation, with no retention, and they outlive the
stack."""

from __future__ import annotations

from aws_cdk import Aws, CfnResource, CustomResourceProviderBase, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from ._private.kms import rotating_key
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
        self.retention_days = retention_days
        self.key = rotating_key(self, "Key", "Encryption of the deployment's CloudWatch log groups")
        self.key.grant_encrypt_decrypt(iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com"))

    def group(self, scope: Construct, id: str, *, log_group_name: str | None = None) -> logs.LogGroup:
        """A KMS-encrypted group with this construct's retention, deleted with the stack."""
        return logs.LogGroup(
            scope,
            id,
            log_group_name=log_group_name,
            encryption_key=self.key,
            retention=retention(self.retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )

    def adopt_lambda_logs(self, scope: IConstruct) -> None:
        """Every Lambda function under ``scope``, and aws-cdk-lib's stack-level custom-resource
        providers, logs to a group of ours: the group aws-cdk-lib made for it (feature flag
        ``@aws-cdk/aws-lambda:useCdkManagedLogGroup``, retained by default) is taken over and named
        in the function's LoggingConfig,
        otherwise one is created beside the function and named in its LoggingConfig."""
        stack = Stack.of(scope)
        providers = [c for c in stack.node.children if isinstance(c, CustomResourceProviderBase)]
        for root in (scope, *providers):
            for node in root.node.find_all():
                # A generated L1 class says its type in Python; only a plain CfnResource (a
                # provider's function) is asked across jsii.
                if isinstance(node, lambda_.CfnFunction) or (
                    type(node) is CfnResource and node.cfn_resource_type == _LAMBDA_TYPE
                ):
                    self._adopt(node)

    def _adopt(self, function: CfnResource) -> None:
        parent = function.node.scope
        assert parent is not None
        if isinstance(function, lambda_.CfnFunction):
            if (Stack.of(function).resolve(function.logging_config) or {}).get("logGroup"):
                return  # created with a log group of its own (ours pass one in)
            managed = parent.node.try_find_child("LogGroup")
            if managed is not None:
                cfn = managed.node.default_child
                assert isinstance(cfn, logs.CfnLogGroup)
                cfn.retention_in_days = self.retention_days
                cfn.kms_key_id = self.key.key_arn
                cfn.apply_removal_policy(RemovalPolicy.DESTROY)
                # Named `/aws/lambda/<function>`, the group would depend on the function and go
                # first on destroy, and the function's own delete-time runs would create it again
                # outside the stack. Unnamed and named in the function's LoggingConfig, it is
                # deleted after the function instead.
                cfn.add_property_deletion_override("LogGroupName")
                function.add_property_override("LoggingConfig.LogGroup", cfn.ref)
                return
        group_id = f"{function.node.id}LogGroup"
        if parent.node.try_find_child(group_id) is None:  # a shared provider is adopted once
            group = self.group(parent, group_id)  # type: ignore[arg-type]
            function.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
