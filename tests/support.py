"""Helpers the tests share: paths, a credential-free environment, synthesizing the app as the
CDK CLI does, reading templates. Fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import boto3
import cdk8s
import yaml
from botocore.stub import Stubber

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from eks_pd_serving.config import DeploymentConfig
from eks_pd_serving.k8s import GcsFaultToleranceSpec, RayNamespaceChart, RayServiceChart
from eks_pd_serving.k8s import serve_config as layout
from eks_pd_serving.mapping import ray_service_props
from eks_pd_serving.phase import PHASES
from eks_pd_serving.weights.model_weights import weights_prefix
from stacks.pd_serving_stack import PdServingStack

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SNAPSHOTS = ROOT / "tests" / "__snapshots__"
# A dense model outside the catalogue, described by its config.json (model_config_json).
DENSE = {"model_source": "my-org/dense", "model_config_json": str(FIXTURES / "models" / "dense-config.json")}


# A process environment with no AWS credentials or config at all: synth and the CLI's offline
# paths must work in it.
NO_AWS_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
}


SHARED = ROOT.parent / "shared"


# The feature flags cdk.json sets (as `cdk init` writes them for aws-cdk-lib 2.275): tests build
# the template `cdk synth` builds.
FEATURE_FLAGS = {k: v for k, v in json.loads((ROOT / "cdk.json").read_text())["context"].items() if k.startswith("@")}


CFN_LINT = str(Path(sys.executable).parent / "cfn-lint")


# Multi-card EFA: Llama-3.1-70B at TP 8 per phase, prefill on a p5.48xlarge, decode on a p5en.48xlarge.
P5_CLASS: dict[str, Any] = {
    "gpu_layout": "per_phase",
    "prefill_gpu_instance_type": "p5.48xlarge",
    "decode_gpu_instance_type": "p5en.48xlarge",
    "model_source": "meta-llama/Llama-3.1-70B-Instruct",
    "model_id": "llama-70b",
    "max_model_len": 32768,
    "prefill_tensor_parallel_size": 8,
    "decode_tensor_parallel_size": 8,
    # Room for two 131 GiB checkpoints (a revision change) beside the image; a gated model's token.
    "gpu_root_volume_gib": 350,
    "hf_token_secret": "hf/token",
}


def cfn_lint(*templates: Path) -> list[dict[str, Any]]:
    """cfn-lint's findings for one or many templates in one run (its start-up dominates)."""
    out = subprocess.run(
        [CFN_LINT, "--format", "json", *map(str, templates)], capture_output=True, text=True, check=False
    )
    # Exit codes are a bit mask of error (2), warning (4), info (8); 1 is a crash.
    assert out.returncode in (0, 2, 4, 6, 8, 10, 12, 14), out.stderr
    return list(json.loads(out.stdout))


def broken_template(template_file: Path, folder: Path) -> Path:
    """A copy of the template with a NAT gateway's ConnectivityKind no schema allows."""
    template = json.loads(template_file.read_text())
    (nat_id,) = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::EC2::NatGateway"]
    template["Resources"][nat_id]["Properties"]["ConnectivityKind"] = "sideways"
    broken = folder / "broken.template.json"
    broken.write_text(json.dumps(template))
    return broken


def leaves(tree: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a JSON-like tree by its path (lists of dicts by index): for diffing configs."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in leaves(sub, f"{path}/{key}").items()}
    if isinstance(tree, list) and tree and isinstance(tree[0], dict):
        return {k: v for i, sub in enumerate(tree) for k, v in leaves(sub, f"{path}/{i}").items()}
    return {path: tree}


@contextlib.contextmanager
def moto_aws(monkeypatch: Any) -> Iterator[None]:
    """moto's AWS with dummy credentials in us-east-1. moto never evaluates IAM:
    tests/iam_rung.py judges what a role may do."""
    from moto import mock_aws

    for key, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


@contextlib.contextmanager
def moto_s3(monkeypatch: Any, bucket: str) -> Iterator[Any]:
    """``moto_aws`` with one bucket; an S3 client of it."""
    with moto_aws(monkeypatch):
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield client


def new_app(**kwargs: Any) -> cdk.App:
    return cdk.App(context=FEATURE_FLAGS, **kwargs)


def build_stack(**settings: Any) -> PdServingStack:
    app = new_app()
    return PdServingStack(app, "Test", config=DeploymentConfig.create(**settings))


def run_app(context: dict[str, Any], outdir: Path) -> subprocess.CompletedProcess[str]:
    """app.py exactly as the CDK CLI runs it: context in CDK_CONTEXT_JSON, output in CDK_OUTDIR."""
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(outdir)}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def synth_assembly(outdir: Path, nag: bool = True, **settings: Any) -> Path:
    """Synthesize the app as `cdk synth` would, with cdk-nag's AwsSolutions pack when ``nag``;
    returns the template file. A finding raises (cdk-nag 3 interrupts synthesis)."""
    from cdk_nag import AwsSolutionsChecks

    app = new_app(outdir=str(outdir))
    PdServingStack(app, "RayLlmPdServing", config=DeploymentConfig.create(**settings))
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    app.synth()
    return outdir / "RayLlmPdServing.template.json"


def logical_id(construct: Any) -> str:
    """Logical id of a construct's CloudFormation resource (descending default children)."""
    node = construct
    while not isinstance(node, cdk.CfnElement):
        node = node.node.default_child
    return cdk.Stack.of(node).get_logical_id(node)


def resources_of_type(template: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    """A synthesized template's resources of one CloudFormation type, by logical id."""
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def cloudwatch_agent(template: dict[str, Any], name: str, region: str) -> dict[str, Any]:
    """One agent of the CloudWatch Observability add-on's configuration values, resolved in ``region``."""
    from eks_pd_serving.assembly import resolve
    from eks_pd_serving.observability import ADDON_NAME

    (addon,) = [
        v for v in resources_of_type(template, "AWS::EKS::Addon").values() if v["Properties"]["AddonName"] == ADDON_NAME
    ]
    (agent,) = [a for a in json.loads(resolve(addon["Properties"]["ConfigurationValues"], region))["agents"]
                if a["name"] == name]  # fmt: skip
    return dict(agent)


def log_filter_matches(pattern: str, lines: list[str]) -> list[str]:
    """The container log lines a CloudWatch Logs filter pattern selects, by moto's implementation
    of filter patterns (quoted terms), on events as the CloudWatch add-on's Fluent Bit writes them
    to the application log group (one JSON record per line)."""
    import boto3
    from moto import mock_aws

    now = int(time.time() * 1000)
    with mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName="application")
        logs.create_log_stream(logGroupName="application", logStreamName="node")
        records = [json.dumps({"log": line + "\n", "stream": "stderr"}) for line in lines]
        events = [{"timestamp": now + i, "message": record} for i, record in enumerate(records)]
        logs.put_log_events(logGroupName="application", logStreamName="node", logEvents=events)
        found = logs.filter_log_events(logGroupName="application", filterPattern=pattern)["events"]
    return [json.loads(event["message"])["log"].rstrip("\n") for event in found]


# --- the RayService as the chart renders it ---------------------------------------------------------
RAY_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/ray:serve-llm-cuda-v1.0"


# Stands in for the key secret's ARN (a CloudFormation token in the stack) when a chart is rendered alone.
# What the GCS store's address and token secret resolve to on a deploy (GcsStore.address's form).
GCS_STORE_ADDRESS = "rediss://master.ray-gcs-store.abc123.use1.cache.amazonaws.com:6379"
GCS_TOKEN_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:gcs-store-token-AbCdEf"
API_KEYS_SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:api-keys-AbCdEf"


#: A staged revision's URI as synth renders it in a test (deployed: the weights bucket's token).
STAGED_URI = "s3://weights-bucket/weights/Qwen/Qwen3.5-9B/main"


def staged_uris(config: DeploymentConfig) -> dict[str, str]:
    """The further served models' staged URIs by model id, as ``ModelWeights.more`` gives them."""
    if config.weights_source != "s3":
        return {}
    return {m.model_id: f"s3://weights-bucket/{weights_prefix(m.repository, m.revision)}" for m in config.models[1:]}


def render(**settings: Any) -> list[dict[str, Any]]:
    """The RayService's two charts (namespace and what the pods mount, then the RayService) as the
    stack builds them, with stand-ins for what CloudFormation resolves (the staged weights' URI
    under weights_source=s3, the key secret, the GCS store)."""
    config = DeploymentConfig.create(**settings)
    secret = API_KEYS_SECRET_ARN if config.api_keys_on else None
    gcs = GcsFaultToleranceSpec(GCS_STORE_ADDRESS, GCS_TOKEN_ARN) if config.gcs_fault_tolerance else None
    staged = STAGED_URI if config.weights_source == "s3" else None
    props = ray_service_props(
        config, RAY_IMAGE, staged, api_keys_secret_arn=secret, gcs_fault_tolerance=gcs, staged_uris=staged_uris(config)
    )
    app = cdk8s.App()
    charts = (RayNamespaceChart(app, "RayNamespace", props=props), RayServiceChart(app, "RayService", props=props))
    return [document for chart in charts for document in cdk8s.Testing.synth(chart)]


def ray_service(**settings: Any) -> dict[str, Any]:
    (service,) = [d for d in render(**settings) if d["kind"] == "RayService"]
    return service


def render_props(change: Any, **settings: Any) -> dict[str, Any]:
    """The RayService of the settings' props as ``change`` (props -> props) makes them: what an
    account-vending pipeline passes as typed props. The settings' model is staged (``STAGED_URI``)
    under weights_source=s3, as ``PdServing`` stages it."""
    config = DeploymentConfig.create(**settings)
    staged = STAGED_URI if config.weights_source == "s3" else None
    props = change(ray_service_props(config, RAY_IMAGE, staged, staged_uris=staged_uris(config)))
    documents = cdk8s.Testing.synth(RayServiceChart(cdk8s.App(), "RayService", props=props))
    (service,) = [d for d in documents if d["kind"] == "RayService"]
    return dict(service)


def serve_args(service: dict[str, Any]) -> dict[str, Any]:
    """The first model's serve settings in one view, either layout: each phase's LLMConfig
    (``<phase>_config``), its replica and timing options (``<phase>_deployment``: the application's
    override, or the LLMConfig's ``deployment_config`` in Ray's one application) and the failover's
    settings (``failover``, absent without it)."""
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    view: dict[str, Any] = {}
    for phase in PHASES:
        view[f"{phase}_config"] = layout.llm_config(config, phase)
        view[f"{phase}_deployment"] = layout.replica_options(config, phase)
    settings = layout.failover_settings(config)
    if settings:
        view["failover"] = settings[0]
    return view


# --- the capacity check's inputs (tests/unit/test_capacity_check.py, the IAM rung) ---------------
CAPACITY_REGION = "us-east-1"


def stubbed_quotas(value: float | None, applied: bool = True, p_value: float | None = None) -> Any:
    """The G/VT quota at ``value`` (None: not asked) and, asked next when ``p_value`` is given, the P quota."""
    client = boto3.client("service-quotas", region_name=CAPACITY_REGION)
    stub = Stubber(client)
    for code, quota in (("L-DB2E81BA", value), ("L-417A185B", p_value)):
        if quota is None:
            continue
        params = {"ServiceCode": "ec2", "QuotaCode": code}
        answer = {"Quota": {**params, "Value": quota}}
        if applied:
            stub.add_response("get_service_quota", answer, params)
        else:
            stub.add_client_error("get_service_quota", "NoSuchResourceException", expected_params=params)
            stub.add_response("get_aws_default_service_quota", answer, params)
    stub.activate()
    return client


def capacity_properties(az: str = "us-east-1a", **groups: tuple[str, int]) -> dict[str, Any]:
    """As CloudFormation sends them: every scalar a string."""
    groups = groups or {"gpu": ("g6.8xlarge", 2)}
    return {
        "ClusterName": "ray-llm-multinode",
        "GpuAvailabilityZone": az,
        "Groups": [{"Name": n, "InstanceType": t, "NodeCount": str(c)} for n, (t, c) in groups.items()],
    }


# --- a JSON API for the rollout programs' tests (the Kubernetes API's shape, no cluster) ----------
class FakeApiHandler(BaseHTTPRequestHandler):
    """Reads each request's JSON body and hands it to ``handle_request``, which answers with
    ``answer``; the rollout Jobs' tests say what their API does there."""

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, body: Any, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_request(self, method: str, body: Any) -> None:
        raise NotImplementedError

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.handle_request(method, json.loads(self.rfile.read(length)) if length else None)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


def run_rollout_program(base: str, entry: str, arguments: str) -> subprocess.CompletedProcess[str]:
    """The rollout Jobs' program as a Job runs it, with a test's API at ``base`` in place of the
    in-cluster one (its first retry at once): its ``entry`` called with ``arguments`` (Python
    source, ``api`` bound)."""
    from eks_pd_serving import rollout

    program = Path(rollout.__file__).parent / rollout.FILE_NAME
    driver = (
        f"import runpy, sys; ns = runpy.run_path({str(program)!r}); api = ns['Api']({base!r}, 'test-token'); "
        f"api.retry_first_s = 0.01; sys.exit(ns[{entry!r}]({arguments}))"
    )
    return subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60, check=False)


@contextlib.contextmanager
def fake_api(handler: type[FakeApiHandler]) -> Iterator[str]:
    """``handler`` served on a free local port for the block; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
