"""Configuration values of the CloudWatch Observability add-on: its agents (the node agent, the
Ray scraper with its EMF declarations and OpenTelemetry pipeline) and its operator. Pure data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..layout import SYSTEM_NODE_LABELS
from .catalogue import (
    CLUSTER_SCRAPER_AGENT,
    METRIC_NAMESPACE,
    OTEL_SUFFIX,
    OTLP_METRICS,
    OTLP_SCRAPE_JOB,
    RAY_METRICS_PORT_NAME,
    RAY_SCRAPE_JOB,
    RAY_SCRAPER_AGENT,
    SCRAPE_INTERVAL_S,
    SCRAPE_METADATA,
    SCRAPED_METRICS,
    SERVICE_ACCOUNT,
    log_group_names,
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
    """Prometheus scrape configuration of the classic (EMF) path: the families in SCRAPED_METRICS."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": "10s"},
        "scrape_configs": [
            _ray_scrape_job(RAY_SCRAPE_JOB, cluster_name, namespace, [metric.name for metric in SCRAPED_METRICS])
        ],
    }


def emf_declarations() -> list[dict[str, Any]]:
    """The agent's metric declarations: which scraped samples become CloudWatch metrics, with
    which dimensions (everything else stays in the log events only)."""
    declarations = []
    for dimensions in sorted({metric.dimensions for metric in SCRAPED_METRICS}):
        names = [m.name for m in SCRAPED_METRICS if m.dimensions == dimensions]
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
                                    "metric_namespace": METRIC_NAMESPACE,
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
