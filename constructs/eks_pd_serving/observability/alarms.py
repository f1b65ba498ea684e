"""The three alarms that watch the KV path, the one that watches the API key reads, and the topic
they notify.

- ``UcxFallback``: the worker logs said NIXL chose UCX (TCP), i.e. no EFA, which NIXL does not
  treat as an error.
- ``KvNotOverEfa``: requests finished while the GPU nodes' EFA byte counters stood still.
- ``KvPullFailed``: a decode engine counted a failed KV pull (its own counter, which no request can
  forge). The KV guard refuses the affected requests and Serve replaces the replica; the alarm says
  it happened (docs/features/failures.md).

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


def _log_line_alarm(
    scope: Construct,
    ids: tuple[str, str],
    log_group: logs.ILogGroup,
    namespace: str,
    counted: tuple[str, str],
    description: str,
    threshold: int = 1,
) -> tuple[logs.MetricFilter, cw.Alarm]:
    """A metric filter counting a log line (``counted``: its filter pattern and metric name) and
    an alarm on ``threshold`` such lines in ``ALARM_PERIOD``; ``ids``: the filter's and the alarm's."""
    pattern, metric_name = counted
    metric_filter = logs.MetricFilter(
        scope,
        ids[0],
        log_group=log_group,
        filter_pattern=logs.FilterPattern.literal(pattern),
        metric_namespace=namespace,
        metric_name=metric_name,
        metric_value="1",
    )
    alarm = cw.Alarm(
        scope,
        ids[1],
        alarm_description=description,
        metric=metric_filter.metric(statistic="Sum", period=ALARM_PERIOD),
        threshold=threshold,
        evaluation_periods=1,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
    return metric_filter, alarm


@dataclass(frozen=True)
class KvPathAlarms:
    ucx_filter: logs.MetricFilter
    # UcxFallback, KvNotOverEfa, KvPullFailed, then ApiKeysUnread with API keys.
    alarms: tuple[cw.Alarm, ...]
    #: The SNS topic the alarms notify, with ``alarm_email``.
    topic: sns.Topic | None


def kv_path_alarms(
    scope: Construct,
    *,
    cluster_name: str,
    application_logs: logs.ILogGroup,
    alarm_email: str | None = None,
    api_keys: bool = False,
) -> KvPathAlarms:
    """:param scope: where the alarms' resources go.
    :param cluster_name: the cluster's name (every metric's ClusterName).
    :param application_logs: the add-on's container log group (where the UCX line is counted).
    :param alarm_email: an address the alarms notify (SNS, KMS-encrypted). Default: none.
    :param api_keys: the proxies check API keys: also alarm when they fail to read the key secret
        (``ApiKeysUnread``). Default: off.
    """
    namespace = f"{om.METRIC_NAMESPACE}/{cluster_name}"
    ucx_filter, ucx_alarm = _log_line_alarm(
        scope,
        ("UcxLines", "UcxFallback"),
        application_logs,
        namespace,
        (om.UCX_FILTER_PATTERN, om.UCX_METRIC),
        f"{cluster_name}: a vLLM engine logged '{om.UCX_LINE}': NIXL moves the KV cache over "
        "UCX (TCP), not LIBFABRIC (EFA). Check the EFA device plugin and the pods' "
        "vpc.amazonaws.com/efa resources (README, Troubleshooting).",
    )
    served = cluster_total(om.METRIC_NAMESPACE, om.REQUESTS_SERVED, cluster_name, ALARM_PERIOD)
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
    pull_failed_alarm = cw.Alarm(
        scope,
        "KvPullFailed",
        alarm_description=(
            f"{cluster_name}: a decode engine counted a failed KV pull from prefill (vLLM's "
            "nixl_num_failed_transfers). With the KV guard (kv_pull_guard, on for vLLM older than 0.30) the "
            "requests without a first token were refused with HTTP 503 and Serve replaces that decode replica; "
            "without it, vLLM 0.26 answers them from KV that was never written (HTTP 200, wrong text). "
            "What to do: docs/features/failures.md."
        ),
        metric=cluster_total(om.METRIC_NAMESPACE, om.KV_FAILED_PULLS.name, cluster_name, ALARM_PERIOD),
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
    )
    alarms: tuple[cw.Alarm, ...] = (ucx_alarm, efa_alarm, pull_failed_alarm)
    if api_keys:
        _, unread_alarm = _log_line_alarm(
            scope,
            ("ApiKeysUnreadLines", "ApiKeysUnread"),
            application_logs,
            namespace,
            (om.API_KEYS_UNREAD_FILTER_PATTERN, om.API_KEYS_UNREAD_METRIC),
            f"{cluster_name}: Serve proxies could not read the API key secret ('{om.API_KEYS_UNREAD_LINE}'). They "
            "serve the keys last read until api_keys_max_stale_s after the last good read, then answer 503 to "
            "every request. Check the secret, its KMS key and the pods' Pod Identity (docs/features/api-keys.md).",
            threshold=om.API_KEYS_UNREAD_ALARM_READS,
        )
        alarms = (*alarms, unread_alarm)
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
