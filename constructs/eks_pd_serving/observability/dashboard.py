"""One CloudWatch dashboard for the deployment, with the three alarms that watch the KV path
(``alarms``).

- Per Serve deployment (prefill, decode, the OpenAI ingress): requests running, waiting and served
  a minute; for the engines: generated tokens a second, finished requests and prompt tokens by
  source (decode's ``external_kv_transfer`` tokens are the KV cache that came over NIXL).
- Per GPU node: GPU and GPU-memory utilisation, EFA bytes received and sent; the NAT gateways'
  bytes (the model download and image pulls).
- ``UcxFallback``: the worker logs said NIXL chose UCX (TCP), i.e. no EFA, which NIXL does not
  treat as an error.
- ``KvNotOverEfa``: requests finished while the GPU nodes' EFA byte counters stood still.
- ``KvPullFailed``: a decode engine counted a failed KV pull (the KV guard refused what it
  affected; Serve replaces that replica).

The alarms notify an SNS topic when ``alarm_email`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_logs as logs
from constructs import Construct

from . import catalogue as om
from . import promql
from .alarms import cluster_total, kv_path_alarms

WIDTH = 8
HEIGHT = 6
PERIOD = Duration.seconds(om.PERIOD_S)


def _search(namespace: str, dimensions: Sequence[str], metric: str, cluster_name: str, statistic: str) -> str:
    schema = ",".join((namespace, *dimensions))  # the dimensions include ClusterName
    return (
        f"SEARCH('{{{schema}}} MetricName=\"{metric}\" ClusterName=\"{cluster_name}\"', '{statistic}', {om.PERIOD_S})"
    )


def _ray(metric: om.RayMetric, cluster_name: str) -> cw.MathExpression:
    """One line per value of the metric's own dimensions (per deployment, per source)."""
    statistic = "Sum"  # a counter's deltas, or a gauge scraped once a period: summed over replicas
    return cw.MathExpression(
        expression=_search(
            om.METRIC_NAMESPACE, ("ClusterName", *metric.dimensions), metric.name, cluster_name, statistic
        ),
        using_metrics={},
        period=PERIOD,
    )


def _per_node(metric: str, cluster_name: str, statistic: str = "Average") -> cw.MathExpression:
    return cw.MathExpression(
        expression=_search(om.CONTAINER_INSIGHTS, om.NODE_DIMENSIONS, metric, cluster_name, statistic),
        using_metrics={},
        period=PERIOD,
    )


# Rows of the PromQL widget: every panel's title and queries, each query on its own lines.
PROMQL_HEIGHT = 12


def promql_markdown(cluster_name: str) -> str:
    """The PromQL queries per deployment, to paste into Query Studio (PromQL). A dashboard body
    has no documented PromQL widget, so the queries are text here, not charts."""
    lines = [
        "### Latency, throughput and KV transfer per phase (PromQL)",
        "CloudWatch console, Query Studio, language PromQL; paste a query, Run. Each line is one "
        "replica, labelled with its `deployment`.",
    ]
    for panel in promql.promql_panels(cluster_name):
        lines.append(f"**{panel.title}**")
        lines += [f"- {legend}: `{query}`" for legend, query in panel.queries]
    return "\n\n".join(lines)


class ServingDashboard(Construct):
    """:param cluster_name: the cluster's name (every metric's ClusterName).
    :param application_logs: the add-on's container log group (where the UCX line is counted).
    :param nat_gateway_ids: the VPC's NAT gateways, when the stack made them. Default: () (the
        NAT widget then shows every NAT gateway of the account and region, by search).
    :param alarm_email: an address the alarms notify (SNS, KMS-encrypted). Default: none.
    :param api_keys: the Serve proxies check API keys: alarm on failed reads of the key secret.
        Default: False.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        cluster_name: str,
        application_logs: logs.ILogGroup,
        nat_gateway_ids: Sequence[str] = (),
        alarm_email: str | None = None,
        api_keys: bool = False,
    ) -> None:
        super().__init__(scope, id)
        kv = kv_path_alarms(
            self,
            cluster_name=cluster_name,
            application_logs=application_logs,
            alarm_email=alarm_email,
            api_keys=api_keys,
        )
        self.ucx_filter = kv.ucx_filter
        self.ucx_alarm, self.efa_alarm, self.pull_failed_alarm = kv.alarms[:3]
        self.alarms = kv.alarms
        self.topic = kv.topic

        self.dashboard = self._dashboard(cluster_name, nat_gateway_ids)

    def _dashboard(self, cluster_name: str, nat_gateway_ids: Sequence[str]) -> cw.Dashboard:
        """The serving dashboard: requests per deployment and by path, tokens, GPU, EFA, NAT, the
        alarms, and the PromQL queries for the histograms."""
        by_name = {metric.name: metric for metric in om.RAY_METRICS}

        def graph(title: str, metrics: list[cw.IMetric], unit: str = "") -> cw.GraphWidget:
            return cw.GraphWidget(
                title=title,
                left=metrics,
                width=WIDTH,
                height=HEIGHT,
                left_y_axis=cw.YAxisProps(label=unit, show_units=False, min=0),
            )

        tokens = cluster_total(om.METRIC_NAMESPACE, "ray_vllm_generation_tokens_total", cluster_name, PERIOD)
        nat: list[cw.IMetric] = []
        for name in om.NAT_METRICS:
            if nat_gateway_ids:
                nat += [
                    cw.Metric(
                        namespace="AWS/NATGateway",
                        metric_name=name,
                        dimensions_map={"NatGatewayId": gateway},
                        statistic="Sum",
                        period=PERIOD,
                    )
                    for gateway in nat_gateway_ids
                ]
            else:
                search = f"SEARCH('{{AWS/NATGateway,NatGatewayId}} MetricName=\"{name}\"', 'Sum', {om.PERIOD_S})"
                nat.append(cw.MathExpression(expression=search, using_metrics={}, period=PERIOD))

        def ray(name: str) -> list[cw.IMetric]:
            return [_ray(by_name[name], cluster_name)]

        tokens_per_s = cw.MathExpression(
            expression=f"tokens / {om.PERIOD_S}", using_metrics={"tokens": tokens}, label="tokens/s", period=PERIOD
        )
        intro = (
            f"## {cluster_name}: prefill/decode serving\n"
            "Serve deployments `Prefill:<model>` and `Decode:<model>` are the two phases. Latency and KV "
            "transfers per phase are OpenTelemetry histograms, queried with PromQL: the queries at the "
            "bottom run in CloudWatch Query Studio (README, Observability)."
        )
        return cw.Dashboard(
            self,
            "Resource",
            dashboard_name=f"{cluster_name}-pd-serving",
            default_interval=Duration.hours(3),
            widgets=[
                [cw.TextWidget(markdown=intro, width=3 * WIDTH, height=2)],
                [
                    graph("Requests running, per deployment", ray("ray_serve_replica_processing_queries")),
                    graph("Requests waiting, per deployment", ray("ray_serve_deployment_queued_queries")),
                    graph("Requests a minute, per deployment", ray("ray_serve_deployment_request_counter_total")),
                ],
                [
                    cw.GraphWidget(
                        title=(
                            "Requests a minute, by the path that served them (failover: local_prefill = prefill "
                            "down, prefill_whole = decode down, refused = both)"
                        ),
                        left=ray(om.REQUESTS_BY_PATH),
                        width=3 * WIDTH,
                        height=HEIGHT,
                        left_y_axis=cw.YAxisProps(show_units=False, min=0),
                    )
                ],
                [
                    graph("Generated tokens a second", [tokens_per_s]),
                    graph("Finished requests a minute (every engine)", ray("ray_vllm_request_success_total")),
                    graph(
                        "Prompt tokens a minute, by source (external_kv_transfer: KV over NIXL)",
                        ray("ray_vllm_prompt_tokens_by_source_total"),
                    ),
                ],
                [
                    graph("GPU utilisation per node", [_per_node(om.GPU_UTILIZATION, cluster_name)], "%"),
                    graph("GPU memory utilisation per node", [_per_node(om.GPU_MEMORY_UTILIZATION, cluster_name)], "%"),
                    cw.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms), width=WIDTH, height=HEIGHT),
                ],
                [
                    graph("EFA bytes received per node", [_per_node(om.EFA_RX_BYTES, cluster_name, "Sum")], "bytes"),
                    graph("EFA bytes sent per node", [_per_node(om.EFA_TX_BYTES, cluster_name, "Sum")], "bytes"),
                    graph("NAT gateway bytes (model download, image pulls)", nat, "bytes"),
                ],
                [cw.TextWidget(markdown=promql_markdown(cluster_name), width=3 * WIDTH, height=PROMQL_HEIGHT)],
            ],
        )
