"""Observability: the CloudWatch Observability add-on and its Ray scrape, the log groups it
writes to, the dashboard, the two alarms and their topic. Metric names are checked against what the
components emit: Ray/vLLM's against the CPU rehearsal's own Prometheus endpoint (the fixture, which
tests/rehearsal/test_rehearsal.py compares with a live run), Container Insights' against AWS's documentation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import FIXTURES, ROOT, build_stack, cloudwatch_agent, log_filter_matches, resources_of_type

from eks_pd_serving import observability as om
from eks_pd_serving import versions
from eks_pd_serving.assembly import kubernetes_objects, resolve
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.fault_tolerance import failover
from rehearsal.probes import NIXL_FAILED

CATALOGUE = json.loads((FIXTURES / "ray-metrics-catalogue.json").read_text())["families"]
# "Amazon EKS and Kubernetes Container Insights with enhanced observability metrics" (CloudWatch
# user guide): the GPU table (node_gpu_utilization, node_gpu_memory_utilization) and the EFA table
# (node_efa_rx_bytes, node_efa_tx_bytes), each per ClusterName, InstanceId, NodeName.
DOCUMENTED_CONTAINER_INSIGHTS = {
    "node_gpu_utilization", "node_gpu_memory_utilization", "node_gpu_memory_used", "node_gpu_memory_total",
    "node_gpu_power_draw", "node_gpu_temperature", "node_efa_rx_bytes", "node_efa_tx_bytes", "node_efa_rx_dropped",
    "node_efa_rdma_read_bytes", "node_efa_rdma_write_bytes", "node_efa_rdma_write_recv_bytes",
}  # fmt: skip
# The agent imports counters, gauges and summaries; it drops histograms (AWS, "Prometheus metric
# type conversion by the CloudWatch agent").
IMPORTED_TYPES = {"counter", "gauge", "summary"}
REGION = "us-east-1"


@pytest.fixture(scope="module")
def observed() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(alarm_email="ops@example.com")).to_json())


@pytest.fixture(scope="module")
def unobserved() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(observability=False)).to_json())


def _addon(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (found,) = [
        (k, v) for k, v in resources_of_type(template, "AWS::EKS::Addon").items()
        if v["Properties"]["AddonName"] == "amazon-cloudwatch-observability"
    ]  # fmt: skip
    return found


def _configuration(template: dict[str, Any]) -> dict[str, Any]:
    _, addon = _addon(template)
    return dict(json.loads(resolve(addon["Properties"]["ConfigurationValues"], REGION)))


def _ray_agent(template: dict[str, Any]) -> dict[str, Any]:
    return cloudwatch_agent(template, om.RAY_SCRAPER_AGENT, REGION)


def dashboard_metrics(body: str) -> set[tuple[str, str]]:
    """(namespace, metric name) of every metric a dashboard body names, in a widget's metric
    arrays or in a SEARCH expression."""
    found: set[tuple[str, str]] = set()
    for widget in json.loads(body)["widgets"]:
        for row in widget.get("properties", {}).get("metrics", []):
            strings = [item for item in row if isinstance(item, str)]
            if len(strings) >= 2:
                found.add((strings[0], strings[1]))
            for item in row:
                if isinstance(item, dict) and "expression" in item:
                    for namespace, name in re.findall(r"\{([^,}]+)[^}]*\} MetricName=\"([^\"]+)\"", item["expression"]):
                        found.add((namespace, name))
    return found


def unexported(names: set[tuple[str, str]], catalogue: dict[str, Any]) -> list[str]:
    """Problems with the Ray metrics named: not exported by Ray's endpoint, or of a type the
    CloudWatch agent drops. Empty when every one would reach CloudWatch."""
    problems = []
    for namespace, name in sorted(names):
        if namespace != om.METRIC_NAMESPACE:
            continue
        family = catalogue.get(name)
        if family is None:
            problems.append(f"{name}: not exported by Ray's endpoint")
        elif family["type"] not in IMPORTED_TYPES:
            problems.append(f"{name}: a {family['type']}, which the CloudWatch agent drops")
    return problems


def _dashboard_body(template: dict[str, Any]) -> str:
    (dashboard,) = resources_of_type(template, "AWS::CloudWatch::Dashboard").values()
    return str(resolve(dashboard["Properties"]["DashboardBody"], REGION))


# --- collection -----------------------------------------------------------------------------
def test_the_addon_is_pinned_with_pod_identity_for_the_agents_service_account(observed: dict[str, Any]) -> None:
    _, addon = _addon(observed)
    props = addon["Properties"]
    assert props["AddonVersion"] == versions.CLOUDWATCH_OBSERVABILITY_ADDON_VERSION == "v6.4.0-eksbuild.1"
    (association,) = props["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "cloudwatch-agent"
    role = observed["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    trusted = {s["Principal"]["Service"] for s in role["AssumeRolePolicyDocument"]["Statement"]}
    assert trusted == {"pods.eks.amazonaws.com"}
    actions = [s["Action"] for s in role["AssumeRolePolicyDocument"]["Statement"]]
    assert {a for action in actions for a in ([action] if isinstance(action, str) else action)} >= {
        "sts:AssumeRole", "sts:TagSession",
    }  # fmt: skip
    assert "CloudWatchAgentServerPolicy" in json.dumps(role["ManagedPolicyArns"])


def test_the_node_agent_collects_enhanced_container_insights_and_no_application_signals(
    observed: dict[str, Any],
) -> None:
    agents = {a["name"]: a for a in _configuration(observed)["agents"]}
    assert set(agents) == {"cloudwatch-agent", "cloudwatch-agent-cluster-scraper", om.RAY_SCRAPER_AGENT}
    collected = agents["cloudwatch-agent"]["config"]["logs"]["metrics_collected"]
    assert collected == {"kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True}}
    # No application_signals anywhere: the chart then turns auto-monitoring (SDK injection) off.
    assert "application_signals" not in json.dumps(_configuration(observed))


def test_the_ray_scraper_targets_the_ray_pods_metrics_port_and_keeps_only_charted_families(
    observed: dict[str, Any],
) -> None:
    agent = _ray_agent(observed)
    assert agent["mode"] == "deployment" and agent["replicas"] == 1 and agent["hostNetwork"] is False
    (job,) = agent["prometheus"]["config"]["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["inference"]}}]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {
        ("__meta_kubernetes_pod_label_ray_io_is_ray_node",): "yes",
        ("__meta_kubernetes_pod_container_port_name",): "metrics",
    }
    assert {"target_label": "ClusterName", "replacement": "ray-llm-multinode"} in job["relabel_configs"]
    # Prometheus anchors relabel regexes: emulated with fullmatch.
    (keep,) = job["metric_relabel_configs"]
    charted = {m.name for m in om.RAY_METRICS}
    exported = set(CATALOGUE)
    assert {name for name in exported if re.fullmatch(keep["regex"], name)} == charted
    assert re.fullmatch(keep["regex"], om.KV_FAILED_PULLS.name)  # exported only by a run with a failed pull
    assert not re.fullmatch(keep["regex"], "ray_vllm_time_to_first_token_seconds_bucket")
    prometheus = agent["config"]["logs"]["metrics_collected"]["prometheus"]
    assert prometheus["log_group_name"] == "/aws/containerinsights/ray-llm-multinode/prometheus"
    declared = {s.strip("^$") for d in prometheus["emf_processor"]["metric_declaration"] for s in d["metric_selectors"]}
    assert declared == charted | {om.KV_FAILED_PULLS.name}


def test_every_log_group_the_addon_writes_is_the_stacks_and_exists_before_it(observed: dict[str, Any]) -> None:
    groups = {
        v["Properties"]["LogGroupName"]: (k, v) for k, v in resources_of_type(observed, "AWS::Logs::LogGroup").items()
        if str(v["Properties"].get("LogGroupName", "")).startswith("/aws/containerinsights/")
    }  # fmt: skip
    assert set(groups) == set(om.log_group_names("ray-llm-multinode").values())
    _, addon = _addon(observed)
    for logical_id, group in groups.values():
        assert group["DeletionPolicy"] == "Delete" and group["Properties"]["RetentionInDays"] == 30
        assert "KmsKeyId" in group["Properties"]
        assert logical_id in addon["DependsOn"]


def test_the_addon_waits_for_nodes_and_pod_identity_and_the_ray_service_waits_for_it(
    observed: dict[str, Any],
) -> None:
    addon_id, addon = _addon(observed)
    nodegroups = resources_of_type(observed, "AWS::EKS::Nodegroup")
    system = [k for k, v in nodegroups.items() if v["Properties"]["Labels"].get("role") == "system"]
    pod_identity_agent = [
        k for k, v in resources_of_type(observed, "AWS::EKS::Addon").items()
        if v["Properties"]["AddonName"] == "eks-pod-identity-agent"
    ]  # fmt: skip
    assert set(system + pod_identity_agent) <= set(addon["DependsOn"])
    (ray_service,) = [
        k for k, v in observed["Resources"].items()
        if v["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and any(o["kind"] == "RayService" for o in json.loads(resolve(v["Properties"]["Manifest"], REGION)))
    ]  # fmt: skip
    assert addon_id in observed["Resources"][ray_service]["DependsOn"]


def test_only_the_agents_namespace_reaches_the_ray_metrics_port(observed: dict[str, Any]) -> None:
    policies = {o["metadata"]["name"]: o for o in kubernetes_objects(observed) if o["kind"] == "NetworkPolicy"}
    (rule,) = policies["ray-metrics-from-scraper"]["spec"]["ingress"]
    assert rule["ports"] == [{"port": om.RAY_METRICS_PORT, "protocol": "TCP"}]
    (source,) = rule["from"]
    assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "amazon-cloudwatch"}
    others = [p for name, p in policies.items() if name != "ray-metrics-from-scraper"]
    opened = [port["port"] for p in others for rule in p["spec"].get("ingress", []) for port in rule.get("ports", [])]
    assert om.RAY_METRICS_PORT not in opened


# --- dashboard ------------------------------------------------------------------------------
def test_every_ray_metric_on_the_dashboard_is_exported_by_ray_and_imported_by_the_agent(
    observed: dict[str, Any],
) -> None:
    named = dashboard_metrics(_dashboard_body(observed))
    ray_names = {name for namespace, name in named if namespace == om.METRIC_NAMESPACE}
    assert ray_names == {m.name for m in om.RAY_METRICS}  # every charted family has a widget
    assert unexported(named, CATALOGUE) == []
    for metric in om.RAY_METRICS:
        assert CATALOGUE[metric.name]["type"] == metric.kind
        # The dimensions it is published with are labels Ray really puts on it, with as many
        # values as `cost` counts series.
        labels = CATALOGUE[metric.name]["labels"]
        assert set(metric.dimensions) <= set(labels)
        if metric.name == om.REQUESTS_BY_PATH:
            # A healthy run serves every request one way; the failover's code names every path.
            assert set(labels["path"]) <= set(failover.paths()) and metric.series == len(failover.paths())
            continue
        assert metric.series == max([len(labels[d]) for d in metric.dimensions], default=1), metric.name


def test_the_path_counter_is_the_failovers_own_as_ray_exports_it() -> None:
    assert f"ray_{failover.metric()}_total" == om.REQUESTS_BY_PATH


def test_the_check_fails_on_a_histogram_or_a_name_ray_does_not_export() -> None:
    problems = unexported(
        {
            (om.METRIC_NAMESPACE, "ray_vllm_time_to_first_token_seconds"),
            (om.METRIC_NAMESPACE, "ray_vllm_num_requests_running"),
        },
        CATALOGUE,
    )
    assert problems == [
        "ray_vllm_num_requests_running: not exported by Ray's endpoint",
        "ray_vllm_time_to_first_token_seconds: a histogram, which the CloudWatch agent drops",
    ]


def test_container_insights_widgets_name_documented_metrics_per_node(observed: dict[str, Any]) -> None:
    named = dashboard_metrics(_dashboard_body(observed))
    insights = {name for namespace, name in named if namespace == om.CONTAINER_INSIGHTS}
    assert insights == set(om.CONTAINER_INSIGHTS_METRICS)
    assert insights <= DOCUMENTED_CONTAINER_INSIGHTS
    body = _dashboard_body(observed)
    assert "{ContainerInsights,ClusterName,InstanceId,NodeName}" in body
    assert {name for namespace, name in named if namespace == "AWS/NATGateway"} == set(om.NAT_METRICS)


def test_the_dashboard_url_is_an_output(observed: dict[str, Any]) -> None:
    url = resolve(observed["Outputs"]["DashboardUrl"]["Value"], REGION)
    assert url.startswith("https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1#dashboards")


# --- alarms ---------------------------------------------------------------------------------
def test_the_ucx_filter_matches_the_rehearsals_ucx_line_and_not_a_libfabric_one(observed: dict[str, Any]) -> None:
    filters = resources_of_type(observed, "AWS::Logs::MetricFilter").values()
    (pattern,) = [f["Properties"]["FilterPattern"] for f in filters if "UCX" in f["Properties"]["FilterPattern"]]
    assert pattern == om.UCX_FILTER_PATTERN
    # Lines the CPU rehearsal's engines logged (UCX) and the LIBFABRIC line of a GPU node.
    ucx = (FIXTURES / "verify" / "worker-ucx.log").read_text().splitlines()
    libfabric = (FIXTURES / "verify" / "worker-libfabric.log").read_text().splitlines()
    ucx_lines = [line for line in ucx if "Backend" in line]
    libfabric_lines = [line for line in libfabric if "Backend" in line]
    assert ucx_lines and libfabric_lines
    assert log_filter_matches(pattern, ucx_lines + libfabric_lines) == ucx_lines
    # A pattern that is not the logged phrase matches nothing: the check can fail.
    assert log_filter_matches('"Backend UCX was selected"', ucx_lines) == []


def test_the_failed_pull_alarm_watches_the_engines_counter_which_the_agent_publishes(
    observed: dict[str, Any],
) -> None:
    """No log line counts a failed pull any more (an unauthenticated path could spell it): the
    alarm reads the decode engine's own counter, under the name Ray's endpoint gave it on the GPU."""
    filters = resources_of_type(observed, "AWS::Logs::MetricFilter").values()
    assert [f["Properties"]["FilterPattern"] for f in filters] == [om.UCX_FILTER_PATTERN]
    agent = _ray_agent(observed)
    declarations = agent["config"]["logs"]["metrics_collected"]["prometheus"]["emf_processor"]["metric_declaration"]
    (declared,) = [d for d in declarations if d["dimensions"] == [["ClusterName"]]]
    assert f"^{om.KV_FAILED_PULLS.name}$" in declared["metric_selectors"]
    # The name the fault rehearsal read the count by, and what it read in the GPU KV-cut run.
    assert (om.KV_FAILED_PULLS.name, None) == NIXL_FAILED
    events = (ROOT / "docs/gpu-runs/2026-12-01/kv-link-cut/faults-gpu.events.jsonl").read_text().splitlines()
    readings = [e["counters"]["nixl_failed_transfers"] for e in map(json.loads, events) if "counters" in e]
    assert readings[0] == 0 and max(readings) > 0


def test_the_alarms_watch_the_ucx_line_and_requests_served_without_efa_bytes(observed: dict[str, Any]) -> None:
    alarms = {k: v["Properties"] for k, v in resources_of_type(observed, "AWS::CloudWatch::Alarm").items()}
    (ucx,) = [a for k, a in alarms.items() if "UcxFallback" in k]
    assert (ucx["MetricName"], ucx["Namespace"]) == (om.UCX_METRIC, "EksPdServing/ray-llm-multinode")
    assert ucx["Threshold"] == 1 and ucx["TreatMissingData"] == "notBreaching"
    (efa,) = [a for k, a in alarms.items() if "KvNotOverEfa" in k]
    metrics = {m["Id"]: m for m in efa["Metrics"]}
    assert metrics["served"]["MetricStat"]["Metric"]["MetricName"] == om.REQUESTS_SERVED
    assert metrics["efa"]["MetricStat"]["Metric"]["MetricName"] == om.EFA_RX_BYTES
    assert metrics["efa"]["MetricStat"]["Metric"]["Dimensions"] == [
        {"Name": "ClusterName", "Value": "ray-llm-multinode"}
    ]
    (expression,) = [m for m in efa["Metrics"] if "Expression" in m]
    assert expression["Expression"] == "IF(served > 0 AND FILL(efa, 0) == 0, 1, 0)"
    (pulls,) = [a for k, a in alarms.items() if "KvPullFailed" in k]
    assert (pulls["MetricName"], pulls["Namespace"]) == (om.KV_FAILED_PULLS.name, om.METRIC_NAMESPACE)
    assert pulls["Dimensions"] == [{"Name": "ClusterName", "Value": "ray-llm-multinode"}]
    assert (pulls["Threshold"], pulls["EvaluationPeriods"], pulls["TreatMissingData"]) == (1, 1, "notBreaching")
    assert pulls["Statistic"] == "Sum" and "kv_pull_guard" in pulls["AlarmDescription"]


def test_alarm_email_adds_an_encrypted_topic_that_both_alarms_notify(observed: dict[str, Any]) -> None:
    ((topic_id, topic),) = resources_of_type(observed, "AWS::SNS::Topic").items()
    assert "KmsMasterKeyId" in topic["Properties"]
    (subscription,) = resources_of_type(observed, "AWS::SNS::Subscription").values()
    assert (
        subscription["Properties"]["Protocol"] == "email"
        and subscription["Properties"]["Endpoint"] == "ops@example.com"
    )
    for alarm in resources_of_type(observed, "AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]


def test_observability_false_adds_none_of_it(unobserved: dict[str, Any]) -> None:
    types = {v["Type"] for v in unobserved["Resources"].values()}
    assert not types & {
        "AWS::CloudWatch::Dashboard",
        "AWS::CloudWatch::Alarm",
        "AWS::Logs::MetricFilter",
        "AWS::SNS::Topic",
    }
    assert "amazon-cloudwatch-observability" not in json.dumps(unobserved)
    policies = [o["metadata"]["name"] for o in kubernetes_objects(unobserved) if o["kind"] == "NetworkPolicy"]
    assert "ray-metrics-from-scraper" not in policies
    assert "DashboardUrl" not in unobserved["Outputs"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"observability": False, "alarm_email": "ops@example.com"}, "alarm_email='ops@example.com' has no alarms"),
        ({"alarm_email": "not-an-address"}, "alarm_email"),
        ({"observability": False, "cloudwatch_addon_version": "v6.4.0-eksbuild.1"}, "cloudwatch_addon_version="),
        ({"cloudwatch_addon_version": "6.4.0"}, "cloudwatch_addon_version"),
    ],
)
def test_observability_settings_that_cannot_work_are_refused_in_one_line(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        DeploymentConfig.create(**settings)
    assert message in str(error.value) and "Fix:" in str(error.value) and "\n" not in str(error.value)
