"""Every metric and log name the observability constructs use, and the agent configuration that
produces them. Pure data: the dashboard, the alarms, `cost` and the tests all read it from here.

Three sources:

- **Ray's Prometheus endpoint** (port ``metrics``, 8080, on every Ray pod; KubeRay v1.7 adds it),
  scraped by one CloudWatch agent of the CloudWatch Observability add-on and sent as embedded
  metric format (EMF) logs. The names are those the CPU rehearsal's endpoint exports
  (``tests/fixtures/ray-metrics-catalogue.json``; the rehearsal test compares it with every run). The agent
  drops Prometheus histograms on this path (AWS, "Prometheus metric type conversion by the
  CloudWatch agent"), so only counters and gauges are listed here.
- **The same endpoint, as OpenTelemetry metrics**: vLLM's time to first token, inter-token latency
  and NIXL transfers are histograms. The same agent scrapes them a second time in an
  OpenTelemetry pipeline (the chart's per-agent ``otelConfig``) and sends them to CloudWatch's OTLP
  endpoint (AWS, "Send metrics using OpenTelemetry"), where they keep buckets and labels and are
  queried with PromQL: p50/p99 per Serve deployment, the query shapes of Ray's own Serve LLM
  dashboard (``PROMQL_PANELS``).
- **Container Insights with enhanced observability** (namespace ``ContainerInsights``): the GPU
  (DCGM) and EFA metrics per node, names and dimensions from AWS's "Amazon EKS and Kubernetes
  Container Insights with enhanced observability metrics".
- **Container logs** (Fluent Bit of the same add-on) in ``/aws/containerinsights/<cluster>/application``,
  where the UCX fallback's log line is counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .layout import SYSTEM_NODE_LABELS

ADDON_NAME: Final = "amazon-cloudwatch-observability"
# The namespace of the metrics this stack's agent publishes from Ray's endpoint.
NAMESPACE: Final = "EksPdServing"
CONTAINER_INSIGHTS: Final = "ContainerInsights"
# KubeRay v1.7 (ray-operator/controllers/ray/utils/constant.go): MetricsPortName, DefaultMetricsPort.
RAY_METRICS_PORT_NAME: Final = "metrics"
RAY_METRICS_PORT: Final = 8080
# One scrape a minute: CloudWatch's standard resolution, and one datapoint per series per period,
# so a gauge's Sum over 60 s is the sum across replicas.
SCRAPE_INTERVAL_S: Final = 60
PERIOD_S: Final = 60
# The scraping agent (a Deployment of the add-on's operator, in the add-on's namespace).
ADDON_NAMESPACE: Final = "amazon-cloudwatch"
SERVICE_ACCOUNT: Final = "cloudwatch-agent"
RAY_SCRAPER_AGENT: Final = "cloudwatch-agent-ray"
# The chart's second default agent; it renders it only with otelContainerInsights.enabled (6.4.0
# templates/linux/cloudwatch-agent-custom-resource.yaml), which this configuration leaves off.
CLUSTER_SCRAPER_AGENT: Final = "cloudwatch-agent-cluster-scraper"
RAY_SCRAPE_JOB: Final = "ray"

# The line NIXL logs when it falls back to UCX (TCP) instead of LIBFABRIC (EFA); the same line the
# README and `verify` name. A filter pattern term in double quotes matches it as one phrase.
UCX_LINE: Final = "Backend UCX was instantiated"
UCX_FILTER_PATTERN: Final = f'"{UCX_LINE}"'
UCX_METRIC: Final = "NixlUcxBackendLines"


@dataclass(frozen=True)
class RayMetric:
    """One Ray/vLLM series family as Ray's endpoint exports it, and the dimensions it is
    published with (beside ClusterName)."""

    name: str
    kind: str  # "counter" (published as per-scrape deltas) or "gauge"
    dimensions: tuple[str, ...]
    # CloudWatch metrics it becomes in the PD app: one per value of its dimension, as the
    # rehearsal's endpoint showed them (deployments Prefill:<model>, Decode:<model>, OpenAiIngress;
    # sources local_compute, external_kv_transfer). What `cost` counts.
    series: int = 1


# Each family is one Ray exported in every rehearsal run: some (Serve's replica-health gauge, the
# node and component families) were there in one run and missing from the next, and are left out.
# Serve's own metrics carry the deployment ("Prefill:<model>", "Decode:<model>", "OpenAiIngress"):
# the per-phase view. vLLM's carry only a replica id; its prompt tokens split by source say the
# phase (prefill computes, decode loads "external_kv_transfer" over NIXL).
RAY_METRICS: Final = (
    RayMetric("ray_serve_replica_processing_queries", "gauge", ("deployment",), 3),
    RayMetric("ray_serve_deployment_queued_queries", "gauge", ("deployment",), 3),
    RayMetric("ray_serve_deployment_request_counter_total", "counter", ("deployment",), 3),
    RayMetric("ray_vllm_generation_tokens_total", "counter", ()),
    RayMetric("ray_vllm_request_success_total", "counter", ()),
    RayMetric("ray_vllm_prompt_tokens_by_source_total", "counter", ("source",), 2),
)
# Decode's prompt tokens loaded from prefill (the KV cache that crossed the network).
KV_TRANSFER_SOURCE: Final = "external_kv_transfer"
# Finished requests: the alarm's "requests were served".
REQUESTS_SERVED: Final = "ray_vllm_request_success_total"

# Container Insights with enhanced observability (AWS documentation cited above): every one is
# published per node with dimensions ClusterName, InstanceId, NodeName, and per cluster with
# ClusterName alone.
NODE_DIMENSIONS: Final = ("ClusterName", "InstanceId", "NodeName")
GPU_UTILIZATION: Final = "node_gpu_utilization"
GPU_MEMORY_UTILIZATION: Final = "node_gpu_memory_utilization"
EFA_RX_BYTES: Final = "node_efa_rx_bytes"
EFA_TX_BYTES: Final = "node_efa_tx_bytes"
CONTAINER_INSIGHTS_METRICS: Final = (GPU_UTILIZATION, GPU_MEMORY_UTILIZATION, EFA_RX_BYTES, EFA_TX_BYTES)
# NAT gateway bytes (AWS/NATGateway, per NatGatewayId): the model download and image pulls.
NAT_METRICS: Final = ("BytesInFromDestination", "BytesOutToDestination")


# --- OpenTelemetry path: histograms, queried with PromQL -------------------------------------
# The families sent to CloudWatch's OTLP endpoint, with their Prometheus types as Ray's endpoint
# exports them (the rehearsal's catalogue holds each, with these types). The request counter is
# there for its labels: vLLM's series carry only a WorkerId, and Serve's counter maps each
# WorkerId to its deployment, the join Ray's own dashboard makes.
OTLP_METRICS: Final = (
    ("ray_vllm_time_to_first_token_seconds", "histogram"),
    ("ray_vllm_inter_token_latency_seconds", "histogram"),
    ("ray_vllm_nixl_xfer_time_seconds", "histogram"),
    ("ray_vllm_nixl_bytes_transferred", "histogram"),
    ("ray_vllm_generation_tokens_total", "counter"),
    ("ray_serve_deployment_request_counter_total", "counter"),
)
OTLP_SCRAPE_JOB: Final = "ray-otlp"
# AWS's advice for an appended collector configuration: a suffix on every component and pipeline
# name, so none collides with what the agent (or the chart) generates.
OTEL_SUFFIX: Final = "eks_pd_serving"
# The series a Prometheus receiver adds to every scrape, dropped as the chart's pipeline drops them.
SCRAPE_METADATA: Final = (
    "^(up|scrape_duration_seconds|scrape_samples_scraped|scrape_samples_post_metric_relabeling|scrape_series_added)$"
)
# The window every rate in the queries below takes: five scrapes.
PROMQL_WINDOW: Final = "5m"
# The join Ray's Serve LLM dashboard uses (ray/dashboard/modules/metrics/dashboards/
# serve_llm_dashboard_panels.py, Ray 2.58: _WORKER_JOIN): a constant-1 table keyed by WorkerId
# that lends each vLLM series its deployment and replica.
JOIN_METRIC: Final = "ray_serve_deployment_request_counter_total"


def _selector(name: str, cluster_name: str) -> str:
    return f'{name}{{ClusterName="{cluster_name}"}}'


def _worker_join(cluster_name: str) -> str:
    return (
        " * on(WorkerId) group_left(deployment, replica) "
        f"max by(WorkerId, deployment, replica) ({_selector(JOIN_METRIC, cluster_name)} * 0 + 1)"
    )


def _rate(name: str, cluster_name: str) -> str:
    return f"sum by(WorkerId) (rate({_selector(name, cluster_name)}[{PROMQL_WINDOW}]))"


def percentile_query(histogram: str, quantile: float, cluster_name: str) -> str:
    """Ray's ``_percentile_with_join`` in native-histogram form: CloudWatch stores an OpenTelemetry
    explicit-bucket histogram as an exponential one (AWS, "How CloudWatch stores histogram
    metrics"), which PromQL reads without the classic ``_bucket``/``_count`` series or ``le``."""
    return (
        f"(histogram_quantile({quantile}, {_rate(histogram, cluster_name)})"
        f" and on(WorkerId) (histogram_count({_rate(histogram, cluster_name)}) > 0))" + _worker_join(cluster_name)
    )


def rate_query(name: str, cluster_name: str, of: str = "") -> str:
    """Ray's ``_rate_with_join``: a counter's rate per replica, or, with ``of`` ("count" or
    "sum"), the rate of a histogram's observations or of their sum."""
    rate = _rate(name, cluster_name)
    return (f"histogram_{of}({rate})" if of else rate) + _worker_join(cluster_name)


@dataclass(frozen=True)
class PromqlPanel:
    """One chart's worth of PromQL: what it shows, and the query per line."""

    title: str
    queries: tuple[tuple[str, str], ...]  # (legend, PromQL)


def promql_panels(cluster_name: str) -> tuple[PromqlPanel, ...]:
    """Latency, throughput and KV transfer per Serve deployment (one line per replica, labelled
    with its deployment: Prefill:<model> or Decode:<model>)."""
    ttft, itl = "ray_vllm_time_to_first_token_seconds", "ray_vllm_inter_token_latency_seconds"
    xfer, xfer_bytes = "ray_vllm_nixl_xfer_time_seconds", "ray_vllm_nixl_bytes_transferred"
    return (
        PromqlPanel(
            "Time to first token (s), p50 and p99",
            (("p50", percentile_query(ttft, 0.5, cluster_name)), ("p99", percentile_query(ttft, 0.99, cluster_name))),
        ),
        PromqlPanel(
            "Inter-token latency (s), p50 and p99",
            (("p50", percentile_query(itl, 0.5, cluster_name)), ("p99", percentile_query(itl, 0.99, cluster_name))),
        ),
        PromqlPanel(
            "Generated tokens a second", (("tokens/s", rate_query("ray_vllm_generation_tokens_total", cluster_name)),)
        ),
        PromqlPanel(
            "KV transfers (NIXL): transfers a second, bytes a second, transfer time p99 (s)",
            (
                ("transfers/s", rate_query(xfer, cluster_name, of="count")),
                ("bytes/s", rate_query(xfer_bytes, cluster_name, of="sum")),
                ("p99 s", percentile_query(xfer, 0.99, cluster_name)),
            ),
        ),
    )


def otel_config(cluster_name: str, region: str, namespace: str) -> dict[str, Any]:
    """The Ray scraper's OpenTelemetry pipeline: a Prometheus receiver on the same pods (only
    OTLP_METRICS), the scrape's own series filtered out, start times set, batched (the chart's
    processors and settings), exported over OTLP/HTTP to CloudWatch's metrics endpoint with SigV4
    (service ``monitoring``), as the chart's own OpenTelemetry Container Insights pipeline does
    (templates/linux/_otel-container-insights-config.tpl, 6.4.0). The add-on's role already has
    CloudWatchAgentServerPolicy, the policy AWS names for this endpoint."""
    name = f"/{OTEL_SUFFIX}"
    job = _ray_scrape_job(OTLP_SCRAPE_JOB, cluster_name, namespace, [family for family, _ in OTLP_METRICS])
    job |= {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "10s"}
    return {
        "extensions": {f"sigv4auth{name}": {"region": region, "service": "monitoring"}},
        "receivers": {f"prometheus{name}": {"config": {"scrape_configs": [job]}}},
        "processors": {
            # The receiver's own scrape series (up, scrape_duration_seconds, ...) are not wanted.
            f"filter{name}": {"error_mode": "ignore", "metrics": {"metric": [f'IsMatch(name, "{SCRAPE_METADATA}")']}},
            # Start times for the cumulative series (counters, histograms), as the chart's pipeline.
            f"metricstarttime{name}": {},
            f"batch{name}": {"send_batch_size": 500, "send_batch_max_size": 500, "timeout": "10s"},
        },
        "exporters": {
            f"otlphttp{name}": {
                "endpoint": f"https://monitoring.{region}.amazonaws.com:443",
                "tls": {"insecure": False},
                "auth": {"authenticator": f"sigv4auth{name}"},
            }
        },
        "service": {
            "extensions": [f"sigv4auth{name}"],
            "pipelines": {
                f"metrics{name}": {
                    "receivers": [f"prometheus{name}"],
                    "processors": [f"filter{name}", f"metricstarttime{name}", f"batch{name}"],
                    "exporters": [f"otlphttp{name}"],
                }
            },
        },
    }


def custom_metric_count() -> int:
    """CloudWatch metrics the stack publishes: each Ray metric's series (more replicas add none),
    and the UCX line count."""
    return 1 + sum(metric.series for metric in RAY_METRICS)


def log_group_names(cluster_name: str) -> dict[str, str]:
    """The groups the add-on writes to (Fluent Bit: application, dataplane, host; the agent:
    performance for Container Insights, prometheus for our scrape). Created by the stack first,
    or they would be created on first write, outside CloudFormation, and outlive it."""
    return {
        kind: f"/aws/containerinsights/{cluster_name}/{kind}"
        for kind in ("application", "dataplane", "host", "performance", "prometheus")
    }


def _ray_scrape_job(job_name: str, cluster_name: str, namespace: str, families: Sequence[str]) -> dict[str, Any]:
    """One scrape job: the Ray pods of ``namespace`` on their metrics port, only ``families``
    kept, each sample labelled with the cluster's name."""
    keep = "|".join(families)
    return {
        "job_name": job_name,
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [namespace]}}],
        "relabel_configs": [
            # KubeRay labels every Ray pod ray.io/is-ray-node=yes and names the port.
            {
                "source_labels": ["__meta_kubernetes_pod_label_ray_io_is_ray_node"],
                "regex": "yes",
                "action": "keep",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": RAY_METRICS_PORT_NAME,
                "action": "keep",
            },
            {"target_label": "ClusterName", "replacement": cluster_name},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "PodName"},
        ],
        "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": f"({keep})", "action": "keep"}],
    }


def scrape_config(cluster_name: str, namespace: str) -> dict[str, Any]:
    """Prometheus scrape configuration of the classic (EMF) path: the families in RAY_METRICS."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "10s"},
        "scrape_configs": [
            _ray_scrape_job(RAY_SCRAPE_JOB, cluster_name, namespace, [metric.name for metric in RAY_METRICS])
        ],
    }


def emf_declarations() -> list[dict[str, Any]]:
    """The agent's metric declarations: which scraped samples become CloudWatch metrics, with
    which dimensions (everything else stays in the log events only)."""
    declarations = []
    for dimensions in sorted({metric.dimensions for metric in RAY_METRICS}):
        names = [m.name for m in RAY_METRICS if m.dimensions == dimensions]
        declarations.append(
            {
                "source_labels": ["job"],
                "label_matcher": f"^{RAY_SCRAPE_JOB}$",
                "dimensions": [["ClusterName", *dimensions]],
                "metric_selectors": [f"^{name}$" for name in names],
            }
        )
    return declarations


def addon_configuration(*, cluster_name: str, region: str, namespace: str) -> dict[str, Any]:
    """Configuration values of the CloudWatch Observability add-on (its chart's values.yaml,
    6.4.0): the chart's two default agents, the node agent with an explicit Container Insights
    config (enhanced, with GPU and EFA metrics; Application Signals left out, so the operator
    injects no instrumentation into the Ray pods), and a third agent, a one-replica Deployment
    off the host network, that scrapes the Ray pods.

    The operator and every Deployment agent run on the system nodes: their pods mount hostPath
    volumes, and the Cluster Autoscaler never removes a node running such a pod, so one on a GPU
    node would keep it from scaling down. The chart merges each agent over its ``agent`` defaults
    (``kubernetes.io/os: linux``), which is repeated here so the selector reads whole."""
    on_system_nodes = {"kubernetes.io/os": "linux", **SYSTEM_NODE_LABELS}
    return {
        "manager": {"nodeSelector": dict(on_system_nodes)},
        "agents": [
            {
                "name": SERVICE_ACCOUNT,
                "config": {
                    "logs": {
                        "metrics_collected": {
                            "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True}
                        }
                    }
                },
            },
            {
                "name": CLUSTER_SCRAPER_AGENT,
                "mode": "deployment",
                "config": "default",
                "nodeSelector": dict(on_system_nodes),
            },
            {
                "name": RAY_SCRAPER_AGENT,
                "mode": "deployment",
                "replicas": 1,
                "nodeSelector": dict(on_system_nodes),
                # Off the host network: the serving namespace's NetworkPolicy admits this pod by
                # its namespace to the metrics port, and nothing else.
                "hostNetwork": False,
                "resources": {
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                    "limits": {"cpu": "500m", "memory": "512Mi"},
                },
                "config": {
                    "agent": {"region": region},
                    "logs": {
                        "metrics_collected": {
                            "prometheus": {
                                "cluster_name": cluster_name,
                                "log_group_name": log_group_names(cluster_name)["prometheus"],
                                "emf_processor": {
                                    "metric_namespace": NAMESPACE,
                                    "metric_declaration": emf_declarations(),
                                },
                            }
                        }
                    },
                },
                "prometheus": {"config": scrape_config(cluster_name, namespace)},
                "otelConfig": otel_config(cluster_name, region, namespace),
            },
        ],
    }
