"""The two alarms that watch the KV path, and the topic they notify.

- ``UcxFallback``: the worker logs said NIXL chose UCX (TCP), i.e. no EFA, which NIXL does not
  treat as an error.
- ``KvNotOverEfa``: requests finished while the GPU nodes' EFA byte counters stood still.

Their resources are added under the scope given (the dashboard's), so their construct paths, and
the logical ids CloudFormation knows them by, are those they always had.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from .._private.kms import rotating_key
from . import catalogue as om

ALARM_PERIOD = Duration.minutes(5)


def cluster_total(namespace: str, metric: str, cluster_name: str, period: Duration) -> cw.Metric:
    """The Sum of a metric over the whole cluster (its ClusterName-only dimension)."""
    return cw.Metric(
        namespace=namespace,
        metric_name=metric,
        dimensions_map={"ClusterName": cluster_name},
        statistic="Sum",
        period=period,
    )


@dataclass(frozen=True)
class KvPathAlarms:
    ucx_filter: logs.MetricFilter
    alarms: tuple[cw.Alarm, cw.Alarm]
    #: The SNS topic the alarms notify, with ``alarm_email``.
    topic: sns.Topic | None


def kv_path_alarms(
    scope: Construct, *, cluster_name: str, application_logs: logs.ILogGroup, alarm_email: str | None = None
) -> KvPathAlarms:
    """:param scope: where the alarms' resources go.
    :param cluster_name: the cluster's name (every metric's ClusterName).
    :param application_logs: the add-on's container log group (where the UCX line is counted).
    :param alarm_email: an address the alarms notify (SNS, KMS-encrypted). Default: none.
    """
    ucx_namespace = f"{om.NAMESPACE}/{cluster_name}"
    ucx_filter = logs.MetricFilter(
        scope,
        "UcxLines",
        log_group=application_logs,
        filter_pattern=logs.FilterPattern.literal(om.UCX_FILTER_PATTERN),
        metric_namespace=ucx_namespace,
        metric_name=om.UCX_METRIC,
        metric_value="1",
    )
    ucx_alarm = cw.Alarm(
        scope,
        "UcxFallback",
        alarm_description=(
            f"{cluster_name}: a vLLM engine logged '{om.UCX_LINE}': NIXL moves the KV cache over "
            "UCX (TCP), not LIBFABRIC (EFA). Check the EFA device plugin and the pods' "
            "vpc.amazonaws.com/efa resources (README, Troubleshooting)."
        ),
        metric=ucx_filter.metric(statistic="Sum", period=ALARM_PERIOD),
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
    served = cluster_total(om.NAMESPACE, om.REQUESTS_SERVED, cluster_name, ALARM_PERIOD)
    efa_bytes = cluster_total(om.CONTAINER_INSIGHTS, om.EFA_RX_BYTES, cluster_name, ALARM_PERIOD)
    efa_alarm = cw.Alarm(
        scope,
        "KvNotOverEfa",
        alarm_description=(
            f"{cluster_name}: requests finished while the GPU nodes' EFA byte counters did not move: "
            "the KV cache is not crossing EFA (or Container Insights' EFA metrics are missing)."
        ),
        metric=cw.MathExpression(
            expression="IF(served > 0 AND FILL(efa, 0) == 0, 1, 0)",
            using_metrics={"served": served, "efa": efa_bytes},
            period=ALARM_PERIOD,
            label="requests served without EFA traffic",
        ),
        threshold=1,
        evaluation_periods=2,
        datapoints_to_alarm=2,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
    alarms = (ucx_alarm, efa_alarm)
    topic: sns.Topic | None = None
    if alarm_email:
        key = rotating_key(scope, "TopicKey", f"Encryption of {cluster_name}'s alarm topic")
        # CloudWatch alarms publish to an encrypted topic with the key's data keys.
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        topic = sns.Topic(scope, "AlarmTopic", master_key=key, enforce_ssl=True)
        topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        for alarm in alarms:
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
            alarm.add_ok_action(cw_actions.SnsAction(topic))
    return KvPathAlarms(ucx_filter=ucx_filter, alarms=alarms, topic=topic)
