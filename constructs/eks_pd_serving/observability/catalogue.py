"""Every metric and log name the observability constructs use. Pure data: the agent
configuration (``agent``), the PromQL (``promql``), the dashboard, the alarms, `cost` and the
tests all read it from here.

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

from dataclasses import dataclass
from typing import Final

ADDON_NAME: Final = "amazon-cloudwatch-observability"
# The namespace of the metrics this stack's agent publishes from Ray's endpoint.
METRIC_NAMESPACE: Final = "EksPdServing"
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
NIXL_BACKEND_LINE: Final = "Backend {} was instantiated"
UCX_LINE: Final = NIXL_BACKEND_LINE.format("UCX")
LIBFABRIC_LINE: Final = NIXL_BACKEND_LINE.format("LIBFABRIC")
UCX_FILTER_PATTERN: Final = f'"{UCX_LINE}"'
UCX_METRIC: Final = "NixlUcxBackendLines"
# The line a decode engine's NIXL connector (vLLM 0.26) logs once for each request whose KV it
# could not pull: what the fault rehearsal counts beside the engine's counter (KV_FAILED_PULLS).
KV_PULL_FAILED_LINE: Final = "Skipping KV post-processing for failed request"
# The warning a Serve proxy's API key check logs for each failed read of the key secret
# (endpoint/proxy's UNREAD_LINE; request paths are escaped there, so no request can write it).
API_KEYS_UNREAD_LINE: Final = "API keys not read"
API_KEYS_UNREAD_FILTER_PATTERN: Final = f'"{API_KEYS_UNREAD_LINE}"'
API_KEYS_UNREAD_METRIC: Final = "ApiKeyReadFailures"
# Failed reads in ALARM_PERIOD that alarm: every proxy reads every api_keys_refresh_s, so three is
# about a minute of failures on one pod (or less on several), well inside api_keys_max_stale_s.
API_KEYS_UNREAD_ALARM_READS: Final = 3


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


REQUESTS_BY_PATH: Final = "ray_eks_pd_requests_by_path_total"
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
    # The PD pair's failover (fault_tolerance/failover, METRIC): requests by the path that served
    # them, one series a path (disaggregated, short_prompt, local_prefill, prefill_whole, refused).
    RayMetric(REQUESTS_BY_PATH, "counter", ("path",), 5),
)
# Failed NIXL pulls as the decode engine counts them (vLLM's ``vllm:nixl_num_failed_transfers``,
# one a failed transfer): what the KvPullFailed alarm watches. Both recorded catalogues (runs with
# no failed pull) lack it; the GPU KV-cut run of 2026-12-01 read it from Ray's endpoint, at 0 before
# the cut, then 53 and 189 (docs/gpu-runs/2026-12-01/kv-link-cut/faults-gpu.events.jsonl).
KV_FAILED_PULLS: Final = RayMetric("ray_vllm_nixl_num_failed_transfers_total", "counter", ())
# What the agent scrapes and publishes: the charted families and the failed-pull counter.
SCRAPED_METRICS: Final = (*RAY_METRICS, KV_FAILED_PULLS)
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


def custom_metric_count(metric_filters: int) -> int:
    """CloudWatch metrics the stack publishes: each scraped Ray metric's series (more replicas add
    none), and one for each of the template's log metric filters (the UCX line count)."""
    return metric_filters + sum(metric.series for metric in SCRAPED_METRICS)


def log_group_names(cluster_name: str) -> dict[str, str]:
    """The groups the add-on writes to (Fluent Bit: application, dataplane, host; the agent:
    performance for Container Insights, prometheus for our scrape). Created by the stack first,
    or they would be created on first write, outside CloudFormation, and outlive it."""
    return {
        kind: f"/aws/containerinsights/{cluster_name}/{kind}"
        for kind in ("application", "dataplane", "host", "performance", "prometheus")
    }
