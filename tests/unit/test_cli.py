"""`python -m eks_pd_serving`: preflight (moto + Stubber), sizing, cost, verify (the real
kubernetes client against served API responses), k8s-diff."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from botocore.stub import Stubber
from support import NO_AWS_ENV, P5_CLASS, ROOT, moto_aws, synth_assembly

from eks_pd_serving.assembly import field_diff
from eks_pd_serving.catalog import MODELS
from eks_pd_serving.cli import cost, preflight, verify
from eks_pd_serving.config import DeploymentConfig
from eks_pd_serving.lifecycle.needs import named_log_groups
from eks_pd_serving.phase import Phase

FIXTURES = ROOT / "tests" / "fixtures" / "verify"
CLEAN_ENV = {**NO_AWS_ENV, "COLUMNS": "200"}


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eks_pd_serving", *args],
        cwd=cwd, env=env or CLEAN_ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["preflight", "sizing", "cost", "verify", "k8s-diff"])
def test_every_subcommand_has_help(command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0 and "usage: python -m eks_pd_serving " + command in result.stdout


def test_the_top_level_help_speaks_to_its_users_not_of_modules() -> None:
    result = cli("--help")
    assert result.returncode == 0
    head = result.stdout.split("positional arguments")[0]
    assert "before:  preflight" in head and "after:   verify" in head
    # The package's module names are the developers' (the module docstring), not the users'.
    assert not any(name in head for name in ("sizing_cmd", "k8s_diff", "_common", "``"))


# Run as `python -m eks_pd_serving`, with an import of jsii refused: aws_cdk, cdk8s and constructs
# all load it, and loading it starts Node (on Node 20, with its end-of-life banner).
_NO_JSII = """
import runpy, sys
class NoJsii:
    def find_spec(self, name, path=None, target=None):
        if name == "jsii" or name.startswith("jsii."):
            raise ImportError("this command imported jsii")
sys.meta_path.insert(0, NoJsii())
sys.argv = ["eks_pd_serving", *sys.argv[1:]]
runpy.run_module("eks_pd_serving", run_name="__main__")
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["preflight", "--help"], ["verify", "--help"], ["impact", "--help"], ["sizing"],
     ["cost", "--template", "{template}"], ["impact", "{template}", "{template}"],
     ["k8s-diff", "{template}", "{template}"]],
    ids=lambda args: " ".join(args),
)  # fmt: skip
def test_commands_that_read_no_construct_start_no_node(args: list[str], template_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _NO_JSII, *(arg.format(template=template_file) for arg in args)],
        cwd=ROOT, env=CLEAN_ENV, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "imported jsii" not in result.stderr
    assert result.returncode == 0, result.stderr[-2000:]


# --- sizing --------------------------------------------------------------------------------
def test_sizing_prints_the_default_deployment() -> None:
    result = cli("sizing")
    assert result.returncode == 0
    assert (
        "168 blocks: capacity 62557 tokens; concurrency 15.27 sequences of 4096 tokens; max_num_seqs 15"
        in result.stdout
    )
    assert "60.9 ms over EFA at 25 Gbps vs 304.5 ms over one TCP flow at 5 Gbps" in result.stdout


def test_sizing_prints_each_served_models_engines() -> None:
    result = cli("sizing", "-c", "served_models=qwen3-8b=Qwen/Qwen3-8B", "-c", "gpu_node_count=4")
    assert result.returncode == 0, result.stderr
    assert "decode: qwen3-8b (Qwen/Qwen3-8B), per GPU" in result.stdout
    assert "max_num_seqs 7 (eager)" in result.stdout  # its own checkpoint's, not the 9B's 15


def test_sizing_prints_what_each_engine_choice_gives() -> None:
    result = cli("sizing", env={**CLEAN_ENV, "COLUMNS": "250"})
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.stdout.splitlines() if line.startswith("│")}  # fmt: skip
    assert list(rows) == ["* bf16, eager", "bf16, CUDA graphs", "fp8, eager", "fp8, CUDA graphs"]
    # weights GiB, KV GiB, KV tokens, max_num_seqs, full-length sequences, then the estimates.
    assert rows["* bf16, eager"][:5] == ["16.80", "2.71", "62,557", "15", "15.27"]
    assert rows["fp8, eager"][:5] == ["10.36", "9.20", "212,247", "51", "51.82"]
    assert "an estimate" in result.stdout


@pytest.mark.parametrize(
    "settings", [{}, {"decode_max_num_seqs": 8}, {"quantization": "fp8", "decode_enforce_eager": False}]
)
def test_the_configured_engine_choice_is_the_synth_gates_figures(settings: dict[str, Any]) -> None:
    """The what-if row marked configured must be what the gate sized (it once left out
    decode_max_num_seqs: 15 sequences shown where 8 were configured)."""
    from eks_pd_serving.engine_choices import engine_choices

    config = DeploymentConfig.from_context(settings)
    facts = MODELS[config.model_source]
    (chosen,) = [sizing for _, configured, sizing in engine_choices(config, facts) if configured]
    assert chosen == config.sizing(Phase.DECODE, facts)


def test_sizing_from_a_config_json_that_does_not_fit(tmp_path: Path) -> None:
    big = {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
           "intermediate_size": 28672, "vocab_size": 128256, "max_position_embeddings": 131072}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(big))
    result = cli("sizing", "--config-json", str(tmp_path / "config.json"))
    assert result.returncode == 1
    assert "does not fit: the weights and activations need" in result.stdout


def test_bad_setting_is_one_line_and_exit_2() -> None:
    result = cli("sizing", "-c", "gpu_instance_type=g6.xlarge")
    assert result.returncode == 2
    assert (
        result.stderr.strip().startswith("error: gpu_instance_type='g6.xlarge': ") and "Traceback" not in result.stderr
    )


# --- cost ----------------------------------------------------------------------------------
def test_cost_of_the_default_deployment_by_hand(template_file: Path) -> None:
    lines, label = cost.estimate(json.loads(template_file.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    hourly = sum(line.hourly for line in lines)
    # EKS 0.10 + NAT 0.045 + m7i.xlarge 0.2016 + 2 x g6.8xlarge 2.0144
    # + gp3 (100 + 2 x 200 GiB) x 0.08 / 720 h
    # + 5 KMS keys (secrets, flow logs, logs, weights, GCS store) x 1.00 / 720 h
    # + Qwen3.5-9B's bf16 checkpoint in S3: 2 x 9.02e9 bytes = 18.0 GB x 0.023 / 720 h
    # + the GCS store: 2 x cache.t4g.small (Valkey) x 0.0256, its token's secret 0.40 / 720 h
    # + observability a month: 1 dashboard x 3.00, 4 alarm metrics (UCX 1, KV-over-EFA 2, failed
    #   pulls 1) x 0.10, 20 custom metrics (3 Serve metrics x 3 deployments, prompt tokens x 2
    #   sources, 2 vLLM totals, the failover's 5 paths, the UCX and failed-pull line counts) x 0.30
    observability = (3.00 + 4 * 0.10 + 20 * 0.30) / 720
    weights = 18.0 * 0.023 / 720
    gcs_store = 2 * 0.0256 + 0.40 / 720
    assert hourly == pytest.approx(
        0.10 + 0.045 + 0.2016 + 2 * 2.0144 + 500 * 0.08 / 720 + 5 / 720 + weights + gcs_store + observability
    )
    assert hourly * cost.HOURS_30_DAYS == pytest.approx(3242.37, abs=0.01)
    assert {line.item for line in lines} >= {
        "CloudWatch dashboard",
        "CloudWatch alarm metrics",
        "CloudWatch custom metrics",
    }
    assert "us-east-1" in label


def test_cost_counts_the_root_volumes_provisioned_throughput(template_file: Path, tmp_path: Path) -> None:
    """The default pulls onto the instance store (no throughput provisioned, no line); without the
    node cache the pull writes to the root volume at 600 MiB/s, 475 above gp3's included 125."""
    default, _ = cost.estimate(json.loads(template_file.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    assert not [line for line in default if line.item.startswith("gp3 throughput")]
    template = synth_assembly(tmp_path, nag=False, node_cache=False)
    lines, _ = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    (throughput,) = [line for line in lines if line.item.startswith("gp3 throughput")]
    assert throughput.item == "gp3 throughput (600 MiB/s each, 475 above the included 125)"
    assert throughput.hourly * cost.HOURS_30_DAYS == pytest.approx(2 * 475 * 0.04)  # $38 a month, two nodes


def test_cost_without_observability_has_no_cloudwatch_lines(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, observability=False)
    lines, _ = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    assert not [line for line in lines if line.item.startswith("CloudWatch")]


def test_cost_uses_the_extended_support_price_past_standard_support(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, kubernetes_version="1.33", gcs_fault_tolerance=False)
    lines, _ = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    (eks,) = [line for line in lines if line.item == "EKS control plane"]
    assert (eks.unit_price, eks.note) == (0.60, "1.33, extended support")


def test_cost_prices_every_gpu_type_of_the_catalogue() -> None:
    from eks_pd_serving.catalog import INSTANCE_TYPES

    unpriced = {name for name in INSTANCE_TYPES if name not in cost.PRICES["us-east-1"]}
    # p5e: no on-demand price in the recorded table; g7e and p6: no price recorded here yet.
    newest = {"g7e.8xlarge", "g7e.12xlarge", "g7e.24xlarge", "g7e.48xlarge", "p6-b200.48xlarge", "p6-b300.48xlarge"}
    assert unpriced == {"p5e.48xlarge"} | newest


def test_cost_of_a_p5_class_deployment(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, **P5_CLASS)
    lines, _ = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    nodes = {line.item: (line.quantity, line.unit_price) for line in lines if line.item.startswith("p5")}
    assert nodes == {"p5.48xlarge nodes": (1, 55.04), "p5en.48xlarge nodes": (1, 63.296)}


def test_cost_labels_a_region_without_a_table(template_file: Path) -> None:
    _, label = cost.estimate(json.loads(template_file.read_text()), "eu-west-1", datetime.date(2026, 11, 29))
    assert "no table for eu-west-1" in label


def test_cost_command_prints_a_labelled_estimate(template_file: Path) -> None:
    result = cli("cost", "--template", str(template_file), "--on", "2026-11-29")
    assert result.returncode == 0
    assert "total (estimate)" in result.stdout and "$3,242.37" in result.stdout


# --- k8s-diff --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def longer_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_assembly(tmp_path_factory.mktemp("longer"), nag=False, max_model_len=8192, gpu_node_count=3).parent


def test_k8s_diff_shows_fields_not_strings(template_file: Path, longer_context: Path) -> None:
    result = cli("k8s-diff", str(template_file.parent), str(longer_context))
    assert result.returncode == 1
    out = result.stdout
    assert (
        "RayLlmPdServing/RayService/inference/ray-llm.spec.serveConfigV2.applications[pd-decode].args."
        "llm_config.engine_kwargs.max_model_len: 4096 -> 8192"
    ) in out
    assert "rayClusterConfig.workerGroupSpecs[gpu-workers].replicas: 2 -> 3" in out
    assert "4 change(s)" not in out or out.count("max_model_len") == 2


def test_k8s_diff_is_quiet_and_exit_0_when_nothing_changed(template_file: Path) -> None:
    result = cli("k8s-diff", str(template_file.parent), str(template_file.parent))
    assert (result.returncode, result.stdout.strip()) == (0, "no change on the Kubernetes side")


def test_k8s_diff_sees_helm_values() -> None:
    old = {"stack/helm/kuberay-operator": {"version": "1.7.0", "values": {"nodeSelector": {"role": "system"}}}}
    new = {"stack/helm/kuberay-operator": {"version": "1.7.1", "values": {"nodeSelector": {"role": "infra"}}}}
    assert field_diff(old, new) == [
        ("stack/helm/kuberay-operator.version", "1.7.0", "1.7.1"),
        ("stack/helm/kuberay-operator.values.nodeSelector.role", "system", "infra"),
    ]


# --- preflight -------------------------------------------------------------------------------
def quotas_client(value: float) -> tuple[Any, Stubber]:
    """moto does not know the G/VT quota; botocore's Stubber answers for service-quotas."""
    client = boto3.client("service-quotas", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_response(
        "get_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": value}},
        {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"},
    )
    stub.activate()
    return client, stub


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with moto_aws(monkeypatch):
        yield


def bootstrap(region: str) -> None:
    cfn = boto3.client("cloudformation", region_name=region)
    cfn.create_stack(StackName="CDKToolkit", TemplateBody=json.dumps({"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}}))


def run_check(region: str, quota: float, **settings: Any) -> preflight.Result:
    quotas, _ = quotas_client(quota)
    return preflight.check(
        boto3.client("ec2", region_name=region), quotas, boto3.client("cloudformation", region_name=region),
        DeploymentConfig.create(**settings), region,
    )  # fmt: skip


def test_preflight_resolves_the_gpu_az_and_passes(aws: None, tmp_path: Path) -> None:
    bootstrap("us-east-1")
    result = run_check("us-east-1", quota=64)
    assert result.ok
    assert (result.gpu_az, result.availability_zones) == ("us-east-1a", ["us-east-1a", "us-east-1b"])
    assert ("G/VT vCPU quota", True, "64 free (64 quota - 0 running), 64 needed (2 x 32 vCPUs)") in result.checks
    path = preflight.write_context(tmp_path, result)
    context = json.loads(path.read_text())
    assert DeploymentConfig.from_context(context).gpu_availability_zone == "us-east-1a"


def test_preflight_fails_on_a_low_quota_with_the_fix(aws: None) -> None:
    bootstrap("us-east-1")
    result = run_check("us-east-1", quota=32)
    assert not result.ok
    (quota,) = [c for c in result.checks if c[0] == "G/VT vCPU quota"]
    assert quota[1] is False and "Fix: request a G/VT quota of at least 64 vCPUs (L-DB2E81BA" in quota[2]


def test_preflight_checks_each_group_of_the_per_phase_layout(aws: None) -> None:
    bootstrap("us-east-1")
    result = run_check(
        "us-east-1", quota=96, gpu_layout="per_phase", prefill_gpu_node_count=2, decode_gpu_instance_type="g6e.8xlarge"
    )
    checks = {name: (passed, detail) for name, passed, detail in result.checks}
    assert checks["EFA support (g6e.8xlarge)"][0] and checks["GPU AZ (g6.8xlarge)"][0]
    # 2 prefill g6.8xlarge + 1 decode g6e.8xlarge, 32 vCPUs each
    assert checks["G/VT vCPU quota"] == (True, "96 free (96 quota - 0 running), 96 needed (2 x 32 + 1 x 32 vCPUs)")


def test_preflight_compares_the_catalogue_with_ec2(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto carries EC2's DescribeInstanceTypes data: every catalogue row agrees with it, and a
    wrong row (an L4 with 24 GiB) is reported with the fix."""
    from eks_pd_serving.catalog import INSTANCE_TYPES, instances, mismatches

    ec2 = boto3.client("ec2", region_name="us-east-1")
    pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=sorted(INSTANCE_TYPES))
    live = {info["InstanceType"]: info for page in pages for info in page["InstanceTypes"]}
    assert {name: mismatches(facts, live[name]) for name, facts in INSTANCE_TYPES.items()} == {
        name: [] for name in INSTANCE_TYPES
    }
    bootstrap("us-east-1")
    checks = {name: (passed, detail) for name, passed, detail in run_check("us-east-1", quota=64).checks}
    assert checks["Instance facts (g6.8xlarge)"][0]
    monkeypatch.setitem(instances.GPUS, "L4", instances.GpuFacts(24576, 300.0))
    checks = {name: (passed, detail) for name, passed, detail in run_check("us-east-1", quota=64).checks}
    assert checks["Instance facts (g6.8xlarge)"] == (
        False,
        "GPU memory MiB 24576 here, 22888 in EC2. Fix: correct its row in catalog/instances.py and synth again",
    )


def logs_client(existing: list[str]) -> tuple[Any, Stubber]:
    """CloudWatch Logs answering DescribeLogGroups by prefix, with ``existing`` groups."""
    client = boto3.client("logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    config = DeploymentConfig.create()
    for name in named_log_groups(config.cluster_name, observability=config.observability):
        groups = [{"logGroupName": g, "arn": f"arn:aws:logs:us-east-1:1:log-group:{g}"} for g in existing
                  if g.startswith(name)]  # fmt: skip
        stub.add_response("describe_log_groups", {"logGroups": groups}, {"logGroupNamePrefix": name})
    stub.activate()
    return client, stub


def test_preflight_fails_when_a_log_group_the_stack_creates_exists_and_names_it() -> None:
    # An earlier Container Insights setup of a cluster with this name left its group behind;
    # a group whose name only starts like one of ours is not in the way.
    client, stub = logs_client(
        ["/aws/containerinsights/ray-llm-multinode/performance", "/aws/eks/ray-llm-multinode/cluster-old"]
    )
    name, passed, detail = preflight.check_log_groups(client, DeploymentConfig.create())
    assert (name, passed) == ("Log groups", False)
    assert detail.startswith("/aws/containerinsights/ray-llm-multinode/performance already exists")
    assert "cluster-old" not in detail and "Fix: delete it" in detail
    stub.assert_no_pending_responses()


def test_preflight_passes_when_none_of_the_named_log_groups_exists() -> None:
    client, stub = logs_client([])
    assert preflight.check_log_groups(client, DeploymentConfig.create())[1] is True
    stub.assert_no_pending_responses()


def test_preflight_fails_without_the_bootstrap_stack(aws: None) -> None:
    result = run_check("us-east-1", quota=64)
    (check,) = [c for c in result.checks if c[0] == "CDK bootstrap"]
    assert check[1] is False and "cdk bootstrap aws://<account>/us-east-1" in check[2]


def test_preflight_in_a_region_without_the_gpu_type(aws: None) -> None:
    with pytest.raises(preflight.PreflightFailed, match=r"no AZ of af-south-1 offers g6.8xlarge"):
        run_check("af-south-1", quota=64)


def test_preflight_rejects_a_gpu_az_that_lacks_the_type(aws: None) -> None:
    with pytest.raises(
        preflight.PreflightFailed, match=r"gpu_availability_zone='us-east-1e' does not offer g6.8xlarge"
    ):
        run_check("us-east-1", 64, availability_zones="us-east-1e,us-east-1a", gpu_availability_zone="us-east-1e")


def test_preflight_without_credentials_is_one_line(tmp_path: Path) -> None:
    result = cli("preflight", "--region", "us-east-1", "--project", str(ROOT))
    assert result.returncode == 1
    assert "preflight failed: Unable to locate credentials. Fix: run `aws configure`" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


# --- verify ------------------------------------------------------------------------------------
class Replay(BaseHTTPRequestHandler):
    """Serves the recorded-shape responses to the real kubernetes client."""

    routes: ClassVar[dict[tuple[str, str], tuple[str, str]]] = {}

    def do_GET(self) -> None:
        url = urlparse(self.path)
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        body, kind = self.routes.get((url.path, selector), ("", ""))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", kind or "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[Any]:
    from kubernetes import client

    logs = getattr(request, "param", {"q8w2n": "worker-libfabric.log", "z4m9t": "worker-libfabric.log"})
    base = "/api/v1/namespaces/inference/pods"
    Replay.routes = {
        ("/api/v1/nodes", "role=gpu-worker"): ((FIXTURES / "nodes-gpu.json").read_text(), ""),
        ("/api/v1/nodes", "role=system"): ((FIXTURES / "nodes-system.json").read_text(), ""),
        (base, ""): ((FIXTURES / "pods.json").read_text(), ""),
    }
    for suffix, log in logs.items():
        path = f"{base}/ray-llm-x7k2p-gpu-workers-worker-{suffix}/log"
        Replay.routes[(path, "")] = ((FIXTURES / log).read_text(), "text/plain")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    yield client.CoreV1Api(client.ApiClient(configuration))
    server.shutdown()


def test_verify_passes_on_the_designed_layout(api: Any) -> None:
    checks, system = verify.check_nodes(api)
    assert system == {"ip-10-0-96-5.ec2.internal"} and all(c.passed for c in checks) and len(checks) == 2
    pod_checks, pod_nodes, heads, _ = verify.check_pods(api, "inference", "ray-llm-", system)
    assert all(c.passed for c in pod_checks), pod_checks
    (head,) = [c for c in pod_checks if c.name.startswith("head")]
    assert head.detail == "on node ip-10-0-96-5.ec2.internal; 0 restarts of ray-head"
    assert [f"head {pod.metadata.name}" for pod in heads] == [head.name]  # what the GCS check asks
    assert [c.detail for c in pod_checks if c.name.startswith("NIXL")] == [verify.LIBFABRIC] * 2
    apps = json.loads((FIXTURES / "serve-applications.json").read_text())
    assert verify.check_replica_placement(apps, pod_nodes).passed
    # Ray's one application (no failover) names no model's applications: the placement check alone.
    assert [c.name for c in verify.check_served_models(apps, pod_nodes)] == ["replica placement"]


def test_verify_reads_each_workers_log_once_for_nixl_and_the_cold_start(api: Any) -> None:
    _, system = verify.check_nodes(api)
    _, _, _, worker_logs = verify.check_pods(api, "inference", "ray-llm-", system)
    assert [log for _, log in worker_logs] == [(FIXTURES / "worker-libfabric.log").read_text()] * 2

    class EventsOnly:  # no pod log to read: the cold start's split takes the logs already read
        def list_namespaced_event(self, namespace: str, field_selector: str) -> Any:
            return types.SimpleNamespace(items=[])

    checks = verify.check_cold_start(EventsOnly(), "inference", worker_logs)
    assert [c.name for c in checks] == [f"cold start {pod.metadata.name}" for pod, _ in worker_logs]


@pytest.mark.parametrize("api", [{"q8w2n": "worker-libfabric.log", "z4m9t": "worker-ucx.log"}], indirect=True)
def test_verify_fails_on_ucx_with_the_fix(api: Any) -> None:
    pod_checks, _, _, _ = verify.check_pods(api, "inference", "ray-llm-", {"ip-10-0-96-5.ec2.internal"})
    failed = [c for c in pod_checks if not c.passed]
    assert [c.name for c in failed] == ["NIXL ray-llm-x7k2p-gpu-workers-worker-z4m9t"]
    assert "TCP speed" in failed[0].detail and "Fix: keep kv_backend=LIBFABRIC" in failed[0].detail


def test_verify_fails_when_a_node_lacks_efa(api: Any) -> None:
    nodes = json.loads((FIXTURES / "nodes-gpu.json").read_text())
    del nodes["items"][1]["status"]["allocatable"]["vpc.amazonaws.com/efa"]
    Replay.routes[("/api/v1/nodes", "role=gpu-worker")] = (json.dumps(nodes), "")
    checks, _ = verify.check_nodes(api)
    assert [c.passed for c in checks] == [True, False]
    assert "does not advertise vpc.amazonaws.com/efa" in checks[1].detail


def test_verify_fails_when_prefill_and_decode_share_a_node() -> None:
    apps = json.loads((FIXTURES / "serve-applications.json").read_text())
    same_node = {"10.0.64.30": "node-a", "10.0.64.31": "node-a"}
    check = verify.check_replica_placement(apps, same_node)
    assert not check.passed and "both on ['node-a']" in check.detail


def test_verify_head_on_a_gpu_node_fails(api: Any) -> None:
    pod_checks, _, _, _ = verify.check_pods(api, "inference", "ray-llm-", system_nodes=set())
    (head,) = [c for c in pod_checks if c.name.startswith("head")]
    assert not head.passed


class Refuse(BaseHTTPRequestHandler):
    """An API server that knows nobody: what a person without an access entry meets."""

    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind":"Status","status":"Failure","message":"Unauthorized","code":401}')

    def log_message(self, *args: Any) -> None:
        pass


def test_verify_without_cluster_access_names_the_admin_role(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
                "users": [{"name": "u", "user": {"token": "not-mapped"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    try:
        result = cli("verify", "--kubeconfig", str(kubeconfig), "--skip-http")
    finally:
        server.shutdown()
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert "the cluster refused your credentials (401 Unauthorized)" in result.stdout
    assert "authenticates as ClusterAdminRoleArn" in result.stdout


def _serve(routes: dict[tuple[str, str], tuple[str, str]]) -> tuple[Any, Any]:
    from kubernetes import client

    Replay.routes = routes
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}"))


def test_verify_sees_the_network_policies_the_stack_applies(template_file: Path) -> None:
    from kubernetes import client

    from eks_pd_serving.assembly import kubernetes_objects

    policies = [o for o in kubernetes_objects(json.loads(template_file.read_text())) if o["kind"] == "NetworkPolicy"]
    path = "/apis/networking.k8s.io/v1/namespaces/inference/networkpolicies"
    body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList", "metadata": {}, "items": policies}
    server, api = _serve({(path, ""): (json.dumps(body), "")})
    try:
        assert verify.check_network_policies(client.NetworkingV1Api(api), "inference").passed
        body["items"] = policies[1:]  # the default deny is gone
        Replay.routes = {(path, ""): (json.dumps(body), "")}
        check = verify.check_network_policies(client.NetworkingV1Api(api), "inference")
        assert not check.passed and "missing ['default-deny-ingress']" in check.detail
        body["items"] = [p for p in policies if p["metadata"]["name"] != "ray-egress"]  # egress unlimited
        Replay.routes = {(path, ""): (json.dumps(body), "")}
        check = verify.check_network_policies(client.NetworkingV1Api(api), "inference")
        assert not check.passed and "missing ['ray-egress']" in check.detail
    finally:
        server.shutdown()


def test_verify_prints_the_internal_nlbs_name_once_it_exists() -> None:
    from kubernetes import client

    path = "/api/v1/namespaces/inference/services/ray-llm-endpoint"
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ray-llm-endpoint"}, "spec": {},
               "status": {"loadBalancer": {}}}  # fmt: skip
    server, api = _serve({(path, ""): (json.dumps(service), "")})
    try:
        pending = verify.check_internal_endpoint(client.CoreV1Api(api), "inference", "ray-llm-endpoint")
        assert not pending.passed and pending.detail.startswith("no NLB address yet")
        name = "k8s-inferenc-rayllmen-0123456789-abcdef.elb.us-east-1.amazonaws.com"
        service["status"] = {"loadBalancer": {"ingress": [{"hostname": name}]}}
        Replay.routes = {(path, ""): (json.dumps(service), "")}
        ready = verify.check_internal_endpoint(client.CoreV1Api(api), "inference", "ray-llm-endpoint")
        assert ready.passed and ready.detail.startswith(f"http://{name} ")
    finally:
        server.shutdown()


# --- verify: the KV crossed EFA (Container Insights' EFA counters, read from CloudWatch) --------
SENT = datetime.datetime(2026, 12, 1, 10, 30, 20, tzinfo=datetime.UTC)


def efa_client(*answers: list[float]) -> tuple[Any, Stubber]:
    """CloudWatch answering GetMetricData with ``answers`` in turn (one-minute sums from the
    request's minute on), and checking verify asks for the documented metric and dimension."""
    client = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    expected_query = {
        "Id": "efa",
        "MetricStat": {
            "Metric": {
                "Namespace": "ContainerInsights",
                "MetricName": "node_efa_rx_bytes",
                "Dimensions": [{"Name": "ClusterName", "Value": "ray-llm-multinode"}],
            },
            "Period": 60,
            "Stat": "Sum",
        },
    }
    start = SENT.replace(second=0)
    for values in answers:
        stub.add_response(
            "get_metric_data",
            {"MetricDataResults": [{"Id": "efa", "Label": "efa", "Values": values, "StatusCode": "Complete"}]},
            {
                "MetricDataQueries": [expected_query],
                "StartTime": start,
                "EndTime": start + datetime.timedelta(minutes=5),
            },
        )
    stub.activate()
    return client, stub


def test_verify_efa_passes_once_the_requests_minute_shows_bytes() -> None:
    client, stub = efa_client([], [1_310_720.0])
    waits: list[float] = []
    check = verify.check_efa_traffic(verify.MetricWindow(client, "ray-llm-multinode", SENT, 240, sleep=waits.append))
    assert check.passed and "1,310,720 bytes" in check.detail
    assert waits == [15.0]
    stub.assert_no_pending_responses()


def test_verify_efa_fails_when_requests_were_served_and_efa_stood_still() -> None:
    client, _ = efa_client([0.0, 0.0])
    check = verify.check_efa_traffic(verify.MetricWindow(client, "ray-llm-multinode", SENT, 240, sleep=lambda _s: None))
    assert not check.passed and "did not cross EFA" in check.detail and "Fix:" in check.detail


def test_verify_efa_fails_with_the_addon_to_check_when_no_metric_arrives() -> None:
    client, _ = efa_client([], [], [])
    check = verify.check_efa_traffic(verify.MetricWindow(client, "ray-llm-multinode", SENT, 30, sleep=lambda _s: None))
    assert not check.passed and "amazon-cloudwatch" in check.detail


# --- verify: the pair served the test request (the failover's path counter, from CloudWatch) ----
def paths_client(*answers: dict[str, list[float]]) -> tuple[Any, Stubber]:
    """CloudWatch answering GetMetricData with ``answers`` in turn (each path's one-minute sums),
    and checking verify asks for every path of the failover's counter on the cluster."""
    from eks_pd_serving.fault_tolerance import failover

    client = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    paths = failover.paths()
    queries = [
        {
            "Id": f"p{index}",
            "Label": path,
            "MetricStat": {
                "Metric": {
                    "Namespace": "EksPdServing",
                    "MetricName": "ray_eks_pd_requests_by_path_total",
                    "Dimensions": [
                        {"Name": "ClusterName", "Value": "ray-llm-multinode"},
                        {"Name": "path", "Value": path},
                    ],
                },
                "Period": 60,
                "Stat": "Sum",
            },
        }
        for index, path in enumerate(paths)
    ]
    start = SENT.replace(second=0)
    for values in answers:
        results = [
            {"Id": f"p{i}", "Label": p, "Values": values.get(p, []), "StatusCode": "Complete"}
            for i, p in enumerate(paths)
        ]
        stub.add_response(
            "get_metric_data",
            {"MetricDataResults": results},
            {"MetricDataQueries": queries, "StartTime": start, "EndTime": start + datetime.timedelta(minutes=5)},
        )
    stub.activate()
    return client, stub


def test_verify_paths_ask_for_every_path_the_failover_counts() -> None:
    from eks_pd_serving.fault_tolerance import failover

    assert (*verify.PAIR_PATHS, *verify.FALLBACK_PATHS) == failover.paths()


def test_verify_paths_pass_once_the_pair_served_and_nothing_fell_back() -> None:
    client, stub = paths_client({}, {"disaggregated": [1.0]})
    waits: list[float] = []
    check = verify.check_served_paths(verify.MetricWindow(client, "ray-llm-multinode", SENT, 240, sleep=waits.append))
    assert check.passed and "disaggregated 1" in check.detail and waits == [15.0]
    stub.assert_no_pending_responses()


def test_verify_paths_fail_on_a_request_one_engine_served_alone() -> None:
    client, _ = paths_client({"disaggregated": [3.0], "prefill_whole": [1.0]})
    check = verify.check_served_paths(
        verify.MetricWindow(client, "ray-llm-multinode", SENT, 240, sleep=lambda _s: None)
    )
    assert not check.passed and "prefill_whole 1" in check.detail and "Fix:" in check.detail


def test_verify_paths_fail_with_the_addon_to_check_when_no_count_arrives() -> None:
    client, _ = paths_client({}, {}, {})
    check = verify.check_served_paths(verify.MetricWindow(client, "ray-llm-multinode", SENT, 30, sleep=lambda _s: None))
    assert not check.passed and "amazon-cloudwatch" in check.detail


# --- preflight: the CloudWatch add-on's version and values, as EKS answers for them -----------
# A schema written for these tests in the shape EKS returns (DescribeAddonConfiguration's
# configurationSchema, JSON Schema draft 7), not EKS's own: none can be fetched from here.
AGENT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "mode": {"enum": ["daemonset", "deployment", "statefulset"]},
        "replicas": {"type": "integer", "minimum": 1},
        "hostNetwork": {"type": "boolean"},
        "resources": {"type": "object"},
        "config": {"type": ["object", "string"]},
        "prometheus": {"type": "object", "properties": {"config": {"type": "object"}}},
        # The chart's values.yaml (6.4.0): "optional YAML config ... combined with the
        # build-default-otel-config output", a map or a YAML string.
        "otelConfig": {"type": ["object", "string"]},
        # values.yaml 6.4.0: `agent.nodeSelector`, which every agent entry may override.
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}
ADDON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "agents": {"type": "array", "items": AGENT_SCHEMA},
        # values.yaml 6.4.0: `manager.nodeSelector` (the operator's Deployment).
        "manager": {
            "type": "object",
            "properties": {"nodeSelector": {"type": "object"}},
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}


def addon_client(offered: list[str], schema: dict[str, Any] | None = None) -> tuple[Any, Stubber]:
    client = boto3.client("eks", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response(
        "describe_addon_versions",
        {"addons": [{"addonName": "amazon-cloudwatch-observability", "addonVersions": [
            {"addonVersion": v} for v in offered
        ]}]},
        {"addonName": "amazon-cloudwatch-observability", "kubernetesVersion": "1.35"},
    )  # fmt: skip
    if schema is not None:
        stub.add_response(
            "describe_addon_configuration",
            {"addonName": "amazon-cloudwatch-observability", "addonVersion": offered[0],
             "configurationSchema": json.dumps(schema)},
            {"addonName": "amazon-cloudwatch-observability", "addonVersion": "v6.4.0-eksbuild.1"},
        )  # fmt: skip
    stub.activate()
    return client, stub


def test_preflight_passes_an_offered_addon_version_whose_schema_takes_the_values() -> None:
    client, stub = addon_client(["v6.4.0-eksbuild.1", "v6.3.0-eksbuild.1"], ADDON_SCHEMA)
    _, passed, detail = preflight.check_cloudwatch_addon(client, DeploymentConfig.create(), "us-east-1")
    assert passed and "accepts the stack's values" in detail
    stub.assert_no_pending_responses()


def test_preflight_fails_an_addon_version_eks_does_not_offer_and_names_those_it_does() -> None:
    client, _ = addon_client(["v6.5.0-eksbuild.1", "v6.3.0-eksbuild.2"])
    _, passed, detail = preflight.check_cloudwatch_addon(client, DeploymentConfig.create(), "us-east-1")
    assert not passed
    assert "v6.4.0-eksbuild.1 is not offered for Kubernetes 1.35" in detail and "v6.5.0-eksbuild.1" in detail
    assert "Fix: set cloudwatch_addon_version" in detail


def test_preflight_fails_values_the_addons_schema_refuses_and_names_where() -> None:
    strict = json.loads(json.dumps(ADDON_SCHEMA))
    del strict["properties"]["agents"]["items"]["properties"]["prometheus"]  # a version without it
    client, _ = addon_client(["v6.4.0-eksbuild.1"], strict)
    _, passed, detail = preflight.check_cloudwatch_addon(client, DeploymentConfig.create(), "us-east-1")
    assert not passed and "at agents/2" in detail and "'prometheus' was unexpected" in detail


def test_sizing_prints_the_cold_start_with_and_without_staging() -> None:
    """Qwen3.5-9B's 18.0 GB text checkpoint at $0.045/GB of NAT processing: $0.81 an engine start
    from Hugging Face, nothing through the S3 gateway endpoint."""
    from eks_pd_serving.cli.sizing_cmd import cold_start

    staged = cold_start(DeploymentConfig.create(), MODELS["Qwen/Qwen3.5-9B"])
    direct = cold_start(DeploymentConfig.create(weights_source="huggingface"), MODELS["Qwen/Qwen3.5-9B"])
    assert "no NAT bytes (was 18.0 GB, $0.81, through the NAT from Hugging Face)" in staged[0]
    assert "from Hugging Face through the NAT: 18.0 GB, $0.81 of NAT processing per start" in direct[0]
    assert "about 13 s" in staged[1]


class _Endpoint(BaseHTTPRequestHandler):
    """An endpoint that answers /v1/models with ``status`` when no key is sent."""

    status: ClassVar[int] = 401

    def do_GET(self) -> None:
        code = 200 if self.headers.get("Authorization") else self.status
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint_answering() -> Iterator[Any]:
    servers = []

    def start(status: int) -> str:
        handler = type("Handler", (_Endpoint,), {"status": status})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def test_verify_passes_api_keys_when_a_request_without_a_key_gets_401(endpoint_answering: Any) -> None:
    check = verify.check_api_keys(endpoint_answering(401), on=True, key="k" * 40)
    assert check.passed and "401 without a key" in check.detail


def test_verify_fails_api_keys_when_the_running_cluster_does_not_check_them(endpoint_answering: Any) -> None:
    check = verify.check_api_keys(endpoint_answering(200), on=True, key="k" * 40)
    assert not check.passed
    assert "got HTTP 200, not 401" in check.detail and "kubectl delete raycluster" in check.detail


def test_verify_asks_for_a_key_to_test_with(endpoint_answering: Any) -> None:
    check = verify.check_api_keys(endpoint_answering(401), on=True, key=None)
    assert not check.passed and "EKS_PD_API_KEY" in check.detail


def test_verify_reports_an_open_endpoint_when_api_keys_are_off(endpoint_answering: Any) -> None:
    check = verify.check_api_keys(endpoint_answering(200), on=False, key=None)
    assert check.passed and check.detail.startswith("off")


def test_cost_of_api_keys_is_the_secret_and_every_proxys_reads(tmp_path: Path) -> None:
    template = json.loads(synth_assembly(tmp_path, nag=False, endpoint_exposure="internal").read_text())
    lines = {line.item: line for line in cost.estimate(template, "us-east-1", datetime.date(2026, 11, 29))[0]}
    # Keys: the cluster's secrets, flow logs, logs, weights, GCS store and API keys.
    assert (lines["Secrets Manager secret (API keys)"].quantity, lines["KMS keys"].quantity) == (1, 6)
    reads = lines["Secrets Manager reads (API keys)"]
    # The head and two workers, each reading every 30 s: 360 reads an hour, $0.05 per 10,000.
    assert (reads.quantity, reads.unit_price) == (360, 0.05 / 10_000)
    assert reads.note == "3 Serve proxies, one read each every 30 s"


def test_cost_without_api_keys_has_no_api_key_lines(template_file: Path) -> None:
    lines, _ = cost.estimate(json.loads(template_file.read_text()), "us-east-1", datetime.date(2026, 11, 29))
    assert not [line for line in lines if "API keys" in line.item]


def test_cost_of_the_gcs_store_is_its_nodes_and_its_token(template_file: Path) -> None:
    lines = {line.item: line for line in cost.estimate(json.loads(template_file.read_text()), "us-east-1",
                                                       datetime.date(2026, 11, 29))[0]}  # fmt: skip
    nodes = lines["ElastiCache valkey cache.t4g.small nodes"]
    # The primary and one replica in another AZ.
    assert (nodes.quantity, nodes.unit_price, nodes.note) == (2, 0.0256, "the Ray GCS store")
    assert lines["Secrets Manager secret (GCS store token)"].quantity == 1


def test_cost_of_a_gcs_store_without_a_price_says_so(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, gcs_store_node_type="cache.x9.huge", gcs_store_replicas=0)
    lines = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))[0]
    (nodes,) = [line for line in lines if line.item.startswith("ElastiCache")]
    assert (nodes.quantity, nodes.hourly, nodes.note) == (1, 0.0, "the Ray GCS store; no price in table")


def test_cost_without_gcs_fault_tolerance_has_no_store(tmp_path: Path) -> None:
    template = synth_assembly(tmp_path, nag=False, gcs_fault_tolerance=False)
    lines = cost.estimate(json.loads(template.read_text()), "us-east-1", datetime.date(2026, 11, 29))[0]
    assert not [line for line in lines if "ElastiCache" in line.item or "GCS" in line.item]


def test_verify_counts_the_heads_restarts() -> None:
    from kubernetes.client import V1ContainerStatus, V1Pod, V1PodStatus

    def status(name: str, count: int) -> V1ContainerStatus:
        return V1ContainerStatus(name=name, restart_count=count, ready=True, image="", image_id="")

    pod = V1Pod(status=V1PodStatus(container_statuses=[status("ray-head", 3), status("autoscaler", 5)]))
    assert verify.head_restarts(pod) == "3 restarts of ray-head"
    assert verify.head_restarts(V1Pod(status=V1PodStatus(container_statuses=[status("ray-head", 1)]))) == (
        "1 restart of ray-head"
    )


# --- verify: GCS fault tolerance ------------------------------------------------------------------
STORE_HOST = "master.ray-gcs.abc123.use1.cache.amazonaws.com"


def ft_head(annotated: bool = True, address: str | None = f"rediss://{STORE_HOST}:6379") -> Any:
    from kubernetes.client import V1Container, V1EnvVar, V1ObjectMeta, V1Pod, V1PodSpec

    env = [V1EnvVar(name="RAY_REDIS_ADDRESS", value=address)] if address else []
    annotations = {"ray.io/ft-enabled": "true" if annotated else "false"}
    return V1Pod(
        metadata=V1ObjectMeta(name="ray-llm-x7k2p-head-abcde", annotations=annotations),
        spec=V1PodSpec(containers=[V1Container(name="ray-head", env=env)]),
    )


def elasticache_answering(*groups: dict[str, Any], error: str | None = None) -> Callable[[], Any]:
    client = boto3.client("elasticache", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if error:
        stub.add_client_error("describe_replication_groups", service_error_code=error, http_status_code=403)
    else:
        stub.add_response("describe_replication_groups", {"ReplicationGroups": list(groups)})
    stub.activate()
    return lambda: client


def store_group(status: str = "available", host: str = STORE_HOST) -> dict[str, Any]:
    members = [
        {"CacheClusterId": "g-001", "CurrentRole": "primary", "PreferredAvailabilityZone": "us-east-1a"},
        {"CacheClusterId": "g-002", "CurrentRole": "replica", "PreferredAvailabilityZone": "us-east-1b"},
    ]
    return {
        "ReplicationGroupId": "pdservinggcsstore-1a2b3c",
        "Status": status,
        "AutomaticFailover": "enabled",
        "NodeGroups": [{"NodeGroupId": "0001", "PrimaryEndpoint": {"Address": host, "Port": 6379},
                        "NodeGroupMembers": members}],
    }  # fmt: skip


def test_verify_reports_the_heads_store_available_with_its_nodes_and_failover() -> None:
    other = store_group(host="master.someone-else.cache.amazonaws.com")
    check = verify.check_gcs_fault_tolerance([ft_head()], True, elasticache_answering(other, store_group()))
    assert check.passed
    assert check.detail == (
        "store pdservinggcsstore-1a2b3c available; 2 node(s), primary in us-east-1a; automatic failover enabled"
    )


@pytest.mark.parametrize(
    ("head", "answer", "detail"),
    [
        (ft_head(annotated=False), elasticache_answering(store_group()), "runs without it (ray.io/ft-enabled is not"),
        (ft_head(address=None), elasticache_answering(store_group()), "has no RAY_REDIS_ADDRESS"),
        (ft_head(), elasticache_answering(store_group(status="modifying")), "store pdservinggcsstore-1a2b3c modifying"),
        (ft_head(), elasticache_answering(store_group(host="master.gone.cache.amazonaws.com")),
         f"no ElastiCache replication group has the head's store address {STORE_HOST}"),
        (ft_head(), elasticache_answering(error="AccessDenied"), "Fix: credentials with elasticache:Describe"),
    ],
)  # fmt: skip
def test_verify_fails_on_a_head_or_store_that_cannot_resume_the_cluster(
    head: Any, answer: Callable[[], Any], detail: str
) -> None:
    check = verify.check_gcs_fault_tolerance([head], True, answer)
    assert not check.passed and detail in check.detail


def test_verify_says_a_head_without_fault_tolerance_rebuilds_the_cluster_and_asks_no_aws() -> None:
    def never() -> Any:
        raise AssertionError("ElastiCache asked with gcs_fault_tolerance=false")

    check = verify.check_gcs_fault_tolerance([ft_head(annotated=False)], False, never)
    assert check.passed and check.detail.startswith("off (gcs_fault_tolerance=false)")


def test_cost_of_a_brought_key_secret_is_its_reads_only(tmp_path: Path) -> None:
    from support import API_KEYS_SECRET_ARN

    template = json.loads(
        synth_assembly(
            tmp_path,
            nag=False,
            endpoint_exposure="internal",
            region="us-east-1",
            api_keys_secret_arn=API_KEYS_SECRET_ARN,
        ).read_text()
    )
    lines = {line.item: line for line in cost.estimate(template, "us-east-1", datetime.date(2026, 11, 29))[0]}
    assert lines["Secrets Manager secret (API keys)"].quantity == 0  # billed to whoever owns it
    assert lines["Secrets Manager reads (API keys)"].quantity == 360


def test_verify_splits_a_workers_cold_start_into_its_parts() -> None:
    from kubernetes import client

    at = datetime.datetime(2026, 12, 6, 10, 0, tzinfo=datetime.UTC)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="ray-llm-x7k2p-gpu-workers-worker-q8w2n"),
        status=client.V1PodStatus(
            conditions=[
                client.V1PodCondition(type="PodScheduled", status="True", last_transition_time=at),
                client.V1PodCondition(
                    type="Ready", status="True", last_transition_time=at + datetime.timedelta(seconds=431)
                ),
            ],
            container_statuses=[
                client.V1ContainerStatus(
                    name="ray-worker", image="ray", image_id="", ready=True, restart_count=0,
                    state=client.V1ContainerState(
                        running=client.V1ContainerStateRunning(started_at=at + datetime.timedelta(seconds=74))
                    ),
                )
            ],
        ),
    )  # fmt: skip
    pulled = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e"), involved_object=client.V1ObjectReference(), reason="Pulled",
        message='Successfully pulled image "763104351884.dkr.ecr.us-east-1.amazonaws.com/ray:serve-llm-cuda-v1.0" '
        "in 1m2.481s (1m2.481s including waiting). Image size: 21474836480 bytes.",
    )  # fmt: skip
    log = (FIXTURES / "worker-cold-start.log").read_text()
    first_start = log.split("(initialize_remote_node pid=20388)")[0]
    check = verify.cold_start_split(pod, [pulled], first_start)
    assert check.passed and check.detail == (
        "scheduled to started 74 s; image pulled in 1m2.481s; weights from S3 to the node: 17.70 GiB in 84.2 s; "
        "vLLM loaded them in 12.70 s; engine init 126.46 s; started to ready 357 s"
    )
    # A later start in the same pod: the node's copy, and the last lines' figures.
    again = verify.cold_start_split(pod, [], log).detail
    assert "weights: the node's copy, none from S3; vLLM loaded them in 11.92 s; engine init 31.08 s" in again
    assert "from S3 to the node" not in again
