"""Deploy-time GPU capacity check: a custom resource that the EKS cluster depends on, so a GPU
AZ without the instance type, a type without EFA, or a short G/VT or P quota fails the deploy in a
minute or two instead of rolling back a half-built cluster half an hour later."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aws_cdk import CustomResource, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import custom_resources as cr
from constructs import Construct

from ._private import checkov, nag
from ._private.functions import api_function
from .capacity.checks import QUOTA_FAMILIES, QUOTA_SERVICE, GroupNeed, ReservedGroup, block_attributes, quota_family
from .log_groups import LogGroups

CODE_DIR = Path(__file__).parent / "capacity"
RESOURCE_TYPE = "Custom::GpuCapacityCheck"
_OUTSIDE_VPC = "Calls only EC2 and Service Quotas APIs, before the VPC is needed; no ENI to release on destroy"


class GpuCapacityCheck(Construct):
    """Runs ``capacity.checks.check_capacity`` in a Lambda (outside the VPC: it only calls EC2,
    Service Quotas and, for its own stack's status, CloudFormation) on create and on every change
    of its inputs; during a rollback it reports and does not fail.

    :param cluster_name: the EKS cluster; its own nodes are not counted as other usage of a quota.
    :param gpu_availability_zone: the AZ of the GPU subnet (a token is fine).
    :param groups: each GPU node group's name, instance type and node count.
    :param log_groups: where the Lambdas log.
    :param reservations: the groups bought from a reservation: each reservation is read and held to
        its group as ``preflight`` does (type, AZ, tenancy, platform, state, free instances, end),
        and a Capacity Block's end gives ``scale_down_at``/``warn_at``. Default: () (none).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        cluster_name: str,
        gpu_availability_zone: str,
        groups: Sequence[GroupNeed],
        log_groups: LogGroups,
        reservations: Sequence[ReservedGroup] = (),
    ) -> None:
        super().__init__(scope, id)
        self.function = api_function(
            self,
            "Function",
            description="Fails the deploy early when the GPU node groups could not launch",
            handler="handler.on_event",
            code_dir=CODE_DIR,
            timeout=Duration.minutes(2),
            log_group=log_groups.group(self, "FunctionLogGroup"),
            outside_vpc_reason=_OUTSIDE_VPC,
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ec2:DescribeInstanceTypes", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstances"],
                resources=["*"],
            )
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["servicequotas:GetServiceQuota"],
                # The quotas of the groups' instance families only (G/VT, P).
                resources=[
                    Stack.of(self).format_arn(service="servicequotas", resource=QUOTA_SERVICE, resource_name=f.code)
                    for f in QUOTA_FAMILIES
                    if any(quota_family(g.instance_type) == f for g in groups)
                ],
            )
        )
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["servicequotas:GetAWSDefaultServiceQuota"], resources=["*"])
        )
        # On an Update, whether CloudFormation is rolling back (the check then reports, never fails).
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=[Stack.of(self).stack_id])
        )
        if reservations:
            # DescribeCapacityReservations has no resource-level permissions.
            self.function.add_to_role_policy(
                iam.PolicyStatement(actions=["ec2:DescribeCapacityReservations"], resources=["*"])
            )
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=self.function,
            log_group=log_groups.group(self, "ProviderLogGroup"),
        )
        self.resource = CustomResource(
            self,
            "Resource",
            service_token=provider.service_token,
            resource_type=RESOURCE_TYPE,
            properties={
                "ClusterName": cluster_name,
                "GpuAvailabilityZone": gpu_availability_zone,
                "Groups": [
                    {"Name": g.name, "InstanceType": g.instance_type, "NodeCount": str(g.node_count)} for g in groups
                ],
                **({"Reservations": [_reservation_properties(r) for r in reservations]} if reservations else {}),
            },
        )
        nag.acknowledge(self.function, nag.CAPACITY_CHECK_FUNCTION)
        # Outside the VPC on purpose: it calls only public AWS APIs, runs before anything in the
        # VPC is needed, and leaves no ENI behind to hold up deleting the VPC.
        framework = provider.node.find_child("framework-onEvent").node.default_child
        assert isinstance(framework, lambda_.CfnFunction)
        checkov.skip(framework, checkov.LAMBDA_OUTSIDE_VPC, _OUTSIDE_VPC)
        nag.acknowledge(provider, nag.provider_framework(provider, self.function))

    def scale_down_at(self, group: str) -> str:
        """The one-time schedule expression (``at(...)``, UTC) at which a Capacity Block group
        scales to zero: its block's end less ``SCALE_DOWN_BEFORE_END``, read at deploy."""
        return self.resource.get_att_string(block_attributes(group)[0])

    def warn_at(self, group: str) -> str:
        """The one-time schedule expression of the warning ahead of a Capacity Block's end."""
        return self.resource.get_att_string(block_attributes(group)[1])


def _reservation_properties(group: ReservedGroup) -> dict[str, str]:
    return {
        "Name": group.name,
        "InstanceType": group.instance_type,
        "MaxNodes": str(group.max_nodes),
        "Kind": group.kind,
        "Target": group.target,
        "Setting": group.setting,
    }
