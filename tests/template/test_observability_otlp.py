"""Latency, throughput and KV transfer per phase: the OpenTelemetry pipeline that carries vLLM's
histograms to CloudWatch's OTLP endpoint, and the PromQL that reads them.

What runs here: the add-on configuration the stack synthesizes, every family and label the
queries name against the CPU rehearsal's catalogue, and the queries against Ray's own Serve LLM
dashboard generator (Ray of the image, in .venv-ray). What only runs on AWS: the agent running this
pipeline, and CloudWatch answering the queries (README, Observability).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from aws_cdk.assertions import Template
from support import cloudwatch_agent, resources_of_type

from eks_pd_serving import observability as om
from eks_pd_serving.assembly import resolve

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = json.loads((ROOT / "tests" / "fixtures" / "ray-metrics-catalogue.json").read_text())["families"]
# The image's stack (Ray 2.58, vLLM 0.26) on one H200, NIXL over UCX with CUDA KV buffers: what the
# GPU rehearsal's endpoint exported, and the WorkerId joins it saw (docs/gpu-runs/2026-12-01).
IMAGE_GPU = json.loads((ROOT / "tests" / "fixtures" / "ray-metrics-catalogue-image-gpu.json").read_text())
CATALOGUES = {"cpu-stack": CATALOGUE, "image-gpu": IMAGE_GPU["families"]}
RAY_PYTHON = Path(os.environ.get("EKS_PD_RAY_PYTHON", ROOT / ".venv-ray" / "bin" / "python"))
REGION = "us-east-1"
CLUSTER = "ray-llm-multinode"
SUFFIX = f"/{om.OTEL_SUFFIX}"


@pytest.fixture(scope="module")
def synthesized(template: Template) -> dict[str, Any]:
    """The session's default template (conftest), as JSON."""
    return dict(template.to_json())


def _ray_agent(template: dict[str, Any]) -> dict[str, Any]:
    return cloudwatch_agent(template, om.RAY_SCRAPER_AGENT, REGION)


def undefined_components(config: dict[str, Any]) -> list[str]:
    """What an OpenTelemetry collector refuses at start: a pipeline naming a receiver, processor
    or exporter the configuration does not define, an authenticator or service extension that is
    not an extension. Empty when the pipelines are whole."""
    problems = []
    for pipeline_name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            problems += [
                f"{pipeline_name}: {kind} {c}" for c in pipeline.get(kind, []) if c not in config.get(kind, {})
            ]
    problems += [
        f"service extension {e}" for e in config["service"].get("extensions", []) if e not in config["extensions"]
    ]
    for name, exporter in config.get("exporters", {}).items():
        authenticator = exporter.get("auth", {}).get("authenticator")
        if authenticator and authenticator not in config["service"].get("extensions", []):
            problems.append(f"{name}: authenticator {authenticator} not started")
    return problems


def promql_problems(query: str, catalogue: dict[str, Any]) -> list[str]:
    """Families a query names that Ray's endpoint does not export with the type the query reads
    them as, and grouping labels no family in the query carries. Empty when every name is real."""
    problems = []
    families = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query)
    as_histogram = set(re.findall(r"histogram_\w+\([^{]*?rate\(([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query))
    as_histogram |= set(re.findall(r"histogram_quantile\([^,]+, sum by\([^)]*\) \(rate\(([a-zA-Z0-9_:]+)\{", query))
    for family in families:
        if family not in catalogue:
            problems.append(f"{family}: not exported by Ray's endpoint")
        elif family in as_histogram and catalogue[family]["type"] != "histogram":
            problems.append(f"{family}: read as a histogram, exported as a {catalogue[family]['type']}")
        elif family not in as_histogram and catalogue[family]["type"] == "histogram":
            problems.append(f"{family}: a histogram, read as a plain series")
    labels = {label for family in families if family in catalogue for label in catalogue[family]["labels"]}
    for group in re.findall(r"(?:by|on|group_left)\(([^)]*)\)", query):
        problems += [f"label {label}" for label in (g.strip() for g in group.split(",")) if label not in labels]
    return problems


# --- collection -----------------------------------------------------------------------------
def test_the_histograms_go_to_cloudwatchs_otlp_endpoint_signed_for_monitoring(synthesized: dict[str, Any]) -> None:
    otel = _ray_agent(synthesized)["otelConfig"]
    assert undefined_components(otel) == []
    exporter = otel["exporters"][f"otlphttp{SUFFIX}"]
    assert exporter["endpoint"] == f"https://monitoring.{REGION}.amazonaws.com:443"
    assert exporter["tls"] == {"insecure": False}
    assert otel["extensions"][f"sigv4auth{SUFFIX}"] == {"region": REGION, "service": "monitoring"}
    # The chart's own pipeline's processors: the receiver's scrape series dropped (OTTL IsMatch is
    # an unanchored RE2 search; the pattern anchors itself), start times set, batched.
    pipeline = otel["service"]["pipelines"][f"metrics{SUFFIX}"]
    assert pipeline["processors"] == [f"filter{SUFFIX}", f"metricstarttime{SUFFIX}", f"batch{SUFFIX}"]
    (condition,) = otel["processors"][f"filter{SUFFIX}"]["metrics"]["metric"]
    match = re.fullmatch(r'IsMatch\(name, "(.*)"\)', condition)
    assert match is not None
    for scrape_series in ("up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"):
        assert re.search(match[1], scrape_series)
    assert not any(re.search(match[1], family) for family, _ in om.OTLP_METRICS)
    # Every component carries the suffix, so none collides with the agent's or the chart's own.
    names = [n for section in ("extensions", "receivers", "processors", "exporters") for n in otel[section]]
    assert all(name.endswith(SUFFIX) for name in [*names, *otel["service"]["pipelines"]])


def test_the_otlp_scrape_reads_the_same_ray_pods_and_keeps_exactly_the_queried_families(
    synthesized: dict[str, Any],
) -> None:
    agent = _ray_agent(synthesized)
    (classic,) = agent["prometheus"]["config"]["scrape_configs"]
    (job,) = agent["otelConfig"]["receivers"][f"prometheus{SUFFIX}"]["config"]["scrape_configs"]
    assert job["job_name"] == om.OTLP_SCRAPE_JOB != classic["job_name"]
    assert job["kubernetes_sd_configs"] == classic["kubernetes_sd_configs"]
    assert job["relabel_configs"] == classic["relabel_configs"]
    (keep,) = job["metric_relabel_configs"]
    kept = {name for name in CATALOGUE if re.fullmatch(keep["regex"], name)}
    assert kept == {family for family, _ in om.OTLP_METRICS}
    queried = {f for panel in om.promql_panels(CLUSTER) for _, q in panel.queries for f in re.findall(r"(\w+)\{", q)}
    assert kept == queried
    for family, kind in om.OTLP_METRICS:
        assert CATALOGUE[family]["type"] == kind, family


def test_the_pipeline_check_fails_on_a_missing_component_or_an_unstarted_authenticator(
    synthesized: dict[str, Any],
) -> None:
    otel = json.loads(json.dumps(_ray_agent(synthesized)["otelConfig"]))
    del otel["processors"][f"batch{SUFFIX}"]
    otel["service"]["extensions"] = []
    assert undefined_components(otel) == [
        f"metrics{SUFFIX}: processors batch{SUFFIX}",
        f"otlphttp{SUFFIX}: authenticator sigv4auth{SUFFIX} not started",
    ]


# --- queries --------------------------------------------------------------------------------
def test_every_query_parses_as_promql_and_a_broken_one_does_not() -> None:
    for panel in om.promql_panels(CLUSTER):
        for _, query in panel.queries:
            promql_parser.parse(query)  # raises ValueError on a syntax error or an unknown function
    ttft = om.percentile_query("ray_vllm_time_to_first_token_seconds", 0.99, CLUSTER)
    for broken in (ttft[:-1], ttft.replace("histogram_count", "histogram_cnt")):
        with pytest.raises(ValueError):
            promql_parser.parse(broken)


@pytest.mark.parametrize("stack", CATALOGUES)
def test_every_family_and_label_the_queries_name_is_exported_by_ray(stack: str) -> None:
    for panel in om.promql_panels(CLUSTER):
        for legend, query in panel.queries:
            assert promql_problems(query, CATALOGUES[stack]) == [], (panel.title, legend)
            assert f'{{ClusterName="{CLUSTER}"}}' in query  # scoped to this cluster's series


def test_the_query_check_fails_on_a_wrong_name_type_or_label() -> None:
    ttft = om.percentile_query("ray_vllm_time_to_first_token_seconds", 0.99, CLUSTER)
    assert promql_problems(ttft.replace("time_to_first_token", "time_to_first_tokens"), CATALOGUE)[0] == (
        "ray_vllm_time_to_first_tokens_seconds: not exported by Ray's endpoint"
    )
    assert promql_problems(om.rate_query("ray_vllm_time_to_first_token_seconds", CLUSTER), CATALOGUE) == [
        "ray_vllm_time_to_first_token_seconds: a histogram, read as a plain series"
    ]
    assert promql_problems(ttft.replace("group_left(deployment", "group_left(phase"), CATALOGUE) == ["label phase"]


# Ray's generator, with the dashboard's Grafana variables set to "every model, worker and
# deployment" and its global filter to this cluster.
RAY_QUERIES = """
import json
from ray.dashboard.modules.metrics.dashboards import serve_llm_dashboard_panels as p

def fill(query):
    for variable in ('model_name=~"$vllm_model_name", ', 'WorkerId=~"$workerid", ', 'deployment=~"$deployment", '):
        query = query.replace(variable, "")
    return query.replace("$interval", "5m").format(global_filters='ClusterName="%s"')

print(json.dumps({
    "ttft_p50": fill(p._percentile_with_join("ray_vllm_time_to_first_token_seconds", 0.5)),
    "ttft_p99": fill(p._percentile_with_join("ray_vllm_time_to_first_token_seconds", 0.99)),
    "itl_p50": fill(p._percentile_with_join("ray_vllm_inter_token_latency_seconds", 0.5)),
    "itl_p99": fill(p._percentile_with_join("ray_vllm_inter_token_latency_seconds", 0.99)),
    "tokens": fill(p._rate_with_join("ray_vllm_generation_tokens_total")),
    "transfers": fill(p._rate_with_join("ray_vllm_nixl_xfer_time_seconds_count")),
    "bytes": fill(p._rate_with_join("ray_vllm_nixl_bytes_transferred_sum")),
    "xfer_p99": fill(p._percentile_with_join("ray_vllm_nixl_xfer_time_seconds", 0.99)),
}))
"""


def native(classic: str) -> str:
    """A classic-histogram PromQL query as it reads native histograms (Prometheus, "Native
    histograms": no ``_bucket``/``_count``/``_sum`` series, no ``le``; histogram_count and
    histogram_sum instead), whitespace normalised."""
    query = re.sub(r"sum by \(le, WorkerId\)", "sum by(WorkerId)", classic)
    query = re.sub(r"(\w+)_bucket\{", r"\1{", query)
    query = re.sub(
        r"sum by\(WorkerId\) \(rate\((\w+)_(count|sum)(\{[^}]*\})\[5m\]\)\)",
        r"histogram_\2(sum by(WorkerId) (rate(\1\3[5m])))",
        query,
    )
    return normal(query)


def normal(query: str) -> str:
    return re.sub(r"\s*\)", ")", re.sub(r"\(\s*", "(", re.sub(r"\s+", " ", query))).strip()


@pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it")
def test_the_queries_are_rays_own_serve_llm_dashboard_queries_in_native_histogram_form() -> None:
    out = subprocess.run(
        [str(RAY_PYTHON), "-c", RAY_QUERIES % CLUSTER], capture_output=True, text=True, timeout=120, check=True
    )
    ray = {name: native(query) for name, query in json.loads(out.stdout).items()}
    ours = {legend: normal(query) for panel in om.promql_panels(CLUSTER) for legend, query in panel.queries}
    ttft, itl, _, kv = om.promql_panels(CLUSTER)
    assert [normal(q) for _, q in ttft.queries] == [ray["ttft_p50"], ray["ttft_p99"]]
    assert [normal(q) for _, q in itl.queries] == [ray["itl_p50"], ray["itl_p99"]]
    assert ours["tokens/s"] == ray["tokens"]
    assert [normal(q) for _, q in kv.queries] == [ray["transfers"], ray["bytes"], ray["xfer_p99"]]
    # The translation is not the identity: Ray's own queries read classic series.
    assert "_bucket{" in out.stdout and "_bucket{" not in " ".join(ours.values())


def test_the_dashboard_shows_every_query(synthesized: dict[str, Any]) -> None:
    (dashboard,) = resources_of_type(synthesized, "AWS::CloudWatch::Dashboard").values()
    widgets = json.loads(str(resolve(dashboard["Properties"]["DashboardBody"], REGION)))["widgets"]
    text = "\n".join(w["properties"]["markdown"] for w in widgets if w["type"] == "text")
    for panel in om.promql_panels(CLUSTER):
        assert panel.title in text
        for _, query in panel.queries:
            assert f"`{query}`" in text


# Ray's metrics API types, as its Prometheus endpoint exports them (a Counter gains "_total").
RAY_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}


@pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it")
def test_the_serve_families_are_defined_with_the_same_types_in_the_images_ray() -> None:
    """The catalogue comes from the CPU stack's Ray; the image runs RAY_VERSION (.venv-ray). Every
    Serve family the dashboard or the queries name is defined there, with the type read."""
    out = subprocess.run(
        [str(RAY_PYTHON), "-c", "import pathlib, ray; print(pathlib.Path(ray.__file__).parent / 'serve')"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    source = "\n".join(path.read_text() for path in Path(out.stdout.strip()).rglob("*.py") if "test" not in path.name)
    defined = {
        f"ray_{name}" + ("_total" if kind == "Counter" else ""): RAY_TYPES[kind]
        for kind, name in re.findall(r"metrics\.(Counter|Gauge|Histogram)\(\s*\"(serve_\w+)\"", source)
    }
    used = {m.name: m.kind for m in om.RAY_METRICS} | dict(om.OTLP_METRICS)
    serve = {name: kind for name, kind in used.items() if name.startswith("ray_serve_")}
    assert serve and {name: defined.get(name) for name in serve} == serve


def test_the_images_stack_on_a_gpu_exports_every_family_with_its_type_and_joins_each_to_a_phase() -> None:
    families = IMAGE_GPU["families"]
    # Recorded on a GPU before the failover builder existed (Ray's build_pd_openai_app): its path
    # counter is held by the CPU catalogue only until a GPU run records it again.
    assert om.REQUESTS_BY_PATH not in families
    for metric in (m for m in om.RAY_METRICS if m.name != om.REQUESTS_BY_PATH):
        assert families[metric.name]["type"] == metric.kind, metric.name
        assert set(metric.dimensions) <= set(families[metric.name]["labels"]), metric.name
    for family, kind in om.OTLP_METRICS:
        assert families[family]["type"] == kind and "WorkerId" in families[family]["labels"], family
    joins = IMAGE_GPU["joins"]
    assert all(joined["unjoined"] == [] for joined in joins.values())
    assert joins["ray_vllm_time_to_first_token_seconds"]["deployments"] == ["Decode", "Prefill"]
    for family in ("ray_vllm_inter_token_latency_seconds", "ray_vllm_nixl_xfer_time_seconds"):
        assert joins[family]["deployments"] == ["Decode"], family
