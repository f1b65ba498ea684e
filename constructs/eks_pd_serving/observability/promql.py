"""The PromQL behind the dashboard's latency and KV-transfer panels: Ray's own Serve LLM dashboard
queries in native-histogram form, over the OpenTelemetry series (``catalogue.OTLP_METRICS``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

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
