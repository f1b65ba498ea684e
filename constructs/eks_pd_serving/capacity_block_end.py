"""A Capacity Block's end: each block group scaled to zero an hour before its block ends, warned a
day ahead, by one-time EventBridge Scheduler schedules whose times the deploy-time capacity check
read from the block (``capacity/block_end.py`` runs them).

Scheduler invokes the function asynchronously: a failed run is retried twice by Lambda and then
dropped, and the block's end would take the engines without warning. So a failed event goes to a
queue (the function's on-failure destination, and each schedule's dead-letter queue for an
invocation Scheduler itself cannot make), and two alarms say so: the function's Errors, the
queue's depth."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Aws, Duration, Stack, Token
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from ._private import nag
from ._private.functions import api_function
from .capacity.block_end import SCALE_DOWN, WARN
from .capacity_check import GpuCapacityCheck
from .config import ConstructError
from .log_groups import LogGroups

CODE_DIR = Path(__file__).parent / "capacity"
SCHEDULE_GROUP = "default"
_OUTSIDE_VPC = "Calls only the EC2, EKS, SNS and Scheduler APIs; no ENI to release on destroy"
# Lambda's own retries of a failed asynchronous run (its default, written down), and how long an
# event may wait: the scale-down runs EC2's 30 minutes plus the drain budget before the end.
RETRY_ATTEMPTS = 2
MAX_EVENT_AGE = Duration.minutes(30)


@dataclass(frozen=True)
class CapacityBlockGroup:
    """A GPU node group bought as a Capacity Block: its group name, the block and the managed node
    group's name (a token is fine)."""

    name: str
    reservation_id: str
    nodegroup_name: str


def schedule_name(cluster_name: str, group: str, action: str) -> str:
    """A schedule's name (64 characters at most): the cluster's name cut to fit, with a digest of
    the whole name so two long names never share one."""
    digest = hashlib.sha256(cluster_name.encode()).hexdigest()[:8]
    return f"{cluster_name[:32]}-{digest}-{group}-{'end' if action == SCALE_DOWN else 'warn'}"


class CapacityBlockEnd(Construct):
    """Two one-time schedules per Capacity Block group (the warning, the scale-down) and the
    function they run. The times come from ``capacity_check`` (its ``warn_at``/``scale_down_at``,
    read from the block at deploy); the function reads the block again when it runs and moves its
    schedule when an extension moved the end.

    :param cluster_name: the EKS cluster's name, as a literal (the schedules' names hold it).
    :param groups: the Capacity Block groups.
    :param capacity_check: the deploy-time check that read each block.
    :param log_groups: where the function logs.
    :param topic: the alarms' SNS topic, which the warning, the scale-down and the failure alarms
        notify. Default: None (the function logs them; the alarms change state in CloudWatch only).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        cluster_name: str,
        groups: Sequence[CapacityBlockGroup],
        capacity_check: GpuCapacityCheck,
        log_groups: LogGroups,
        topic: sns.ITopic | None = None,
    ) -> None:
        super().__init__(scope, id)
        if Token.is_unresolved(cluster_name):
            raise ConstructError(
                self,
                "CapacityBlockEndClusterNameToken",
                "cluster_name is a token; the schedules are named after the cluster at synth. "
                "Fix: pass the cluster's name as a string",
            )
        self.function = api_function(
            self,
            "Function",
            description="Scales a Capacity Block's GPU node group to zero before the block ends, and warns ahead",
            handler="block_end.on_schedule",
            code_dir=CODE_DIR,
            timeout=Duration.minutes(1),
            log_group=log_groups.group(self, "FunctionLogGroup"),
            outside_vpc_reason=_OUTSIDE_VPC,
        )
        self.invoker = iam.Role(
            self,
            "SchedulerRole",
            description="EventBridge Scheduler: runs the Capacity Block end function",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
        )
        self.function.grant_invoke(self.invoker)
        self._failure_path(cluster_name, topic)
        names, nodegroup_arns = self._permissions(cluster_name, groups, topic)
        self._schedules(cluster_name, groups, names, capacity_check, topic)
        acknowledgments = nag.capacity_block_end(
            self.function,
            self.invoker,
            [nag.token_names(self, arn) for arn in nodegroup_arns],
            encrypted_topic=topic is not None,
            failed=self.failed,
        )
        for construct, findings in acknowledgments.items():
            nag.acknowledge(construct, findings)

    def _failure_path(self, cluster_name: str, topic: sns.ITopic | None) -> None:
        """Where a failed run goes (a queue: the function's on-failure destination and each
        schedule's dead-letter queue) and the two alarms that say so."""
        # Failed events, kept 14 days (SQS's longest) for a look and a redrive. Encrypted with SQS's
        # AWS managed KMS key: the senders are IAM roles of this account (the function's, the
        # Scheduler role), which that key's policy admits; no key of the stack to manage.
        self.failed = sqs.Queue(
            self,
            "FailedEvents",
            encryption=sqs.QueueEncryption.KMS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.function.configure_async_invoke(
            on_failure=destinations.SqsDestination(self.failed),
            retry_attempts=RETRY_ATTEMPTS,
            max_event_age=MAX_EVENT_AGE,
        )
        self.failed.grant_send_messages(self.invoker)
        self.alarms = [
            cw.Alarm(
                self,
                "FunctionErrors",
                alarm_description=f"The Capacity Block end function of {cluster_name} failed a run: a warning "
                "or a scale-down may not have happened. Its log group says why; failed events are in the queue.",
                metric=self.function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            ),
            cw.Alarm(
                self,
                "FailedEventsQueued",
                alarm_description=f"A Capacity Block end event of {cluster_name} failed for good (retries spent, "
                "or Scheduler could not invoke the function): scale the block's node group down by hand before "
                "the block ends.",
                metric=self.failed.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(5), statistic="Maximum"
                ),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            ),
        ]
        if topic is not None:
            for alarm in self.alarms:
                alarm.add_alarm_action(cw_actions.SnsAction(topic))

    def _permissions(
        self, cluster_name: str, groups: Sequence[CapacityBlockGroup], topic: sns.ITopic | None
    ) -> tuple[dict[tuple[str, str], str], list[str]]:
        """The function's calls (the block, the node groups, its own schedules, the topic);
        returns the schedules' names and the node groups' ARNs."""
        # DescribeCapacityReservations has no resource-level permissions.
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=["ec2:DescribeCapacityReservations"], resources=["*"])
        )
        stack = Stack.of(self)
        nodegroup_arns = [
            stack.format_arn(service="eks", resource="nodegroup", resource_name=f"{cluster_name}/{g.nodegroup_name}/*")
            for g in groups
        ]
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"], resources=nodegroup_arns
            )
        )
        names = {
            (g.name, action): schedule_name(cluster_name, g.name, action)
            for g in groups
            for action in (WARN, SCALE_DOWN)
        }
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["scheduler:GetSchedule", "scheduler:UpdateSchedule"],
                resources=[
                    stack.format_arn(service="scheduler", resource="schedule", resource_name=f"{SCHEDULE_GROUP}/{n}")
                    for n in names.values()
                ],
            )
        )
        # UpdateSchedule hands the schedule's role to Scheduler again.
        assert self.function.role is not None
        self.invoker.grant_pass_role(self.function.role)
        if topic is not None:
            topic.grant_publish(self.function)
        return names, nodegroup_arns

    def _schedules(
        self,
        cluster_name: str,
        groups: Sequence[CapacityBlockGroup],
        names: dict[tuple[str, str], str],
        capacity_check: GpuCapacityCheck,
        topic: sns.ITopic | None,
    ) -> None:
        """Each group's warning and scale-down, one-time schedules at the times the check read."""
        stack = Stack.of(self)
        self.schedules: dict[tuple[str, str], scheduler.CfnSchedule] = {}
        for group in groups:
            for action, at in (
                (WARN, capacity_check.warn_at(group.name)),
                (SCALE_DOWN, capacity_check.scale_down_at(group.name)),
            ):
                name = names[(group.name, action)]
                event = {
                    "action": action,
                    "group": group.name,
                    "reservation": group.reservation_id,
                    "cluster": cluster_name,
                    "nodegroup": group.nodegroup_name,
                    "topic": topic.topic_arn if topic is not None else "",
                    "schedule": name,
                    "schedule_group": SCHEDULE_GROUP,
                }
                self.schedules[(group.name, action)] = scheduler.CfnSchedule(
                    self,
                    f"{group.name.capitalize()}{'ScaleDown' if action == SCALE_DOWN else 'Warning'}",
                    name=name,
                    group_name=SCHEDULE_GROUP,
                    description=f"Capacity Block {group.reservation_id}: {action} of the {group.name} GPU node group",
                    schedule_expression=at,
                    schedule_expression_timezone="UTC",
                    flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
                    target=scheduler.CfnSchedule.TargetProperty(
                        arn=self.function.function_arn,
                        role_arn=self.invoker.role_arn,
                        input=stack.to_json_string(event),
                        dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(arn=self.failed.queue_arn),
                        retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                            maximum_event_age_in_seconds=1800, maximum_retry_attempts=5
                        ),
                    ),
                )
