"""The IAM rung: the staging job's and its custom resource's calls, recorded while their code runs
(against moto's S3 and botocore's Stubber), judged against their roles' policies as synthesized,
with S3's rule for missing keys (403, not 404, without s3:ListBucket) that moto does not apply."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from aws_cdk.assertions import Template
from botocore.stub import Stubber
from iam_rung import (
    REGION,
    STACK_ID,
    Call,
    Recorder,
    allowed,
    authorizations,
    denied,
    principal_policies,
    record,
    resolve,
)
from support import (
    FIXTURES,
    ROOT,
    capacity_properties,
    moto_aws,
    moto_s3,
    ray_service,
    serve_args,
    stubbed_quotas,
    synth_assembly,
)

from eks_pd_serving.capacity import handler as capacity_handler
from eks_pd_serving.endpoint.proxy import eks_pd_api_keys as api_keys_proxy
from eks_pd_serving.fault_tolerance import auth
from eks_pd_serving.fault_tolerance.auth import eks_pd_gcs_auth as gcs_reader
from eks_pd_serving.weights.handler import handler
from eks_pd_serving.weights.job import stage
from eks_pd_serving.weights.node_cache import eks_pd_node_cache as node_cache_fill

BUCKET_NAME = "weights-test"
RAY_PYTHON = Path(os.environ.get("EKS_PD_RAY_PYTHON", ROOT / ".venv-ray" / "bin" / "python"))
MIRROR_TOOL = ROOT / "tools" / "ray_s3_mirror_calls.py"
# What the staging job leaves under a revision's prefix (stage.py: the files, the hash, the marker).
STAGED_FILES = ("config.json", "model.safetensors", "hash", ".staged")


@pytest.fixture(scope="module")
def synthesized(template: Template) -> dict[str, Any]:
    return dict(template.to_json())


def _weights(t: dict[str, Any]) -> dict[str, Any]:
    (props,) = [r["Properties"] for r in t["Resources"].values() if r["Type"] == "Custom::ModelWeights"]
    return dict(props)


def _names(t: dict[str, Any]) -> dict[str, str]:
    return {_weights(t)["Bucket"]["Ref"]: BUCKET_NAME}


def _job_role(t: dict[str, Any]) -> str:
    (project,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    return str(project["Properties"]["ServiceRole"]["Fn::GetAtt"][0])


def _handler_role(t: dict[str, Any], description: str) -> str:
    """The role of the weights custom resource's handler with this description."""
    functions = [r["Properties"] for r in t["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    (role,) = [f["Role"]["Fn::GetAtt"][0] for f in functions if f.get("Description") == description]
    return str(role)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_s3(monkeypatch, BUCKET_NAME) as client:
        yield client


class _Hub:
    def model_info(self, model: str, revision: str, token: str | None, files_metadata: bool) -> Any:
        files = ["config.json", "model.safetensors"]
        return SimpleNamespace(sha="ab" * 20, siblings=[SimpleNamespace(rfilename=f) for f in files])

    def download(self, model: str, name: str, revision: str, token: str | None, local_dir: str) -> str:
        path = Path(local_dir) / name
        path.write_bytes(b"x")
        return str(path)


def _first_staging(t: dict[str, Any], s3: Any, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """The job as a first deploy runs it: no marker yet, stage, write the hash and the marker."""
    props = _weights(t)
    for key, value in {"BUCKET": BUCKET_NAME, "PREFIX": props["Prefix"], "MODEL": props["Model"],
                       "REVISION": props["Revision"]}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    recorder = Recorder()
    hub = _Hub()
    assert stage.main(record(s3, recorder), hub, hub.download) == 0
    return recorder.calls


def test_the_first_staging_records_the_missing_marker_probe(
    synthesized: dict[str, Any], s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _first_staging(synthesized, s3, monkeypatch)
    prefix = _weights(synthesized)["Prefix"]
    assert (
        Call("s3:ListBucket", f"arn:aws:s3:::{BUCKET_NAME}", why=f"{prefix}/.staged is missing: 404 not 403") in calls
    )
    assert Call("s3:PutObject", f"arn:aws:s3:::{BUCKET_NAME}/{prefix}/.staged") in calls
    # The manifest the node cache checks its copies against: a call of the job's own, in the rung.
    assert Call("s3:PutObject", f"arn:aws:s3:::{BUCKET_NAME}/{prefix}/{stage.MANIFEST}") in calls


def test_the_staging_jobs_role_allows_every_call_of_a_first_deploy(
    synthesized: dict[str, Any], s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _first_staging(synthesized, s3, monkeypatch)
    policies = principal_policies(synthesized, _job_role(synthesized), _names(synthesized))
    assert denied(policies, calls) == []


def test_the_rung_fails_on_the_job_role_without_list_bucket(
    synthesized: dict[str, Any], s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """G1's template (59da05f): objects under models/ granted, the bucket not listable. S3 answers
    the first deploy's marker probe 403, the job exits 1, the stack rolls back."""
    broken = copy.deepcopy(synthesized)
    role = _job_role(broken)
    for resource in broken["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role} in resource["Properties"]["Roles"]:
            statements = resource["Properties"]["PolicyDocument"]["Statement"]
            statements[:] = [s for s in statements if s["Action"] != "s3:ListBucket"]
    calls = _first_staging(broken, s3, monkeypatch)
    missing = denied(principal_policies(broken, role, _names(broken)), calls)
    assert missing == [
        f"s3:ListBucket on arn:aws:s3:::{BUCKET_NAME} ({_weights(broken)['Prefix']}/.staged is missing: 404 not 403)"
    ]


def test_a_prefix_conditioned_list_grant_does_not_count_for_a_missing_key() -> None:
    """A GetObject request carries no s3:prefix, so ListBucket granted only for a prefix leaves S3's 403."""
    conditioned = [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
                    "Condition": {"StringLike": {"s3:prefix": ["models/*"]}}}]  # fmt: skip
    probe = Call("s3:ListBucket", "arn:aws:s3:::b", why="models/x/.staged is missing")
    listing = Call("s3:ListBucket", "arn:aws:s3:::b", (("s3:prefix", "models/x/"),))
    assert not allowed(conditioned, probe) and allowed(conditioned, listing)


def test_is_complete_may_read_a_missing_reason_as_404(synthesized: dict[str, Any], s3: Any) -> None:
    """A job that died before writing its reason: is_complete's read of it is a missing key."""
    props = _weights(synthesized)
    recorder = Recorder()
    codebuild = boto3.client("codebuild", region_name="us-east-1")
    stub = Stubber(codebuild)
    stub.add_response("batch_get_builds", {"builds": [{"id": "j:1", "buildStatus": "FAILED"}]}, {"ids": ["j:1"]})
    event = {
        "RequestType": "Create",
        "ResourceProperties": {**props, "Bucket": BUCKET_NAME},
        "Data": {"BuildId": "j:1"},
    }
    with stub, pytest.raises(handler.StagingFailed, match="without a reason"):
        handler.is_complete(event, codebuild=codebuild, s3=record(s3, recorder))
    role = _handler_role(synthesized, "Polls the weights-staging job")
    assert recorder.calls and denied(principal_policies(synthesized, role, _names(synthesized)), recorder.calls) == []


def test_on_events_delete_may_stop_the_build(synthesized: dict[str, Any]) -> None:
    """Delete lists, reads and stops the project's builds: the function's role allows all three."""
    project_arn = "arn:aws:codebuild:us-east-1:111122223333:project/codebuildproject-physical"
    (project_id,) = [k for k, r in synthesized["Resources"].items() if r["Type"] == "AWS::CodeBuild::Project"]
    names = {**_names(synthesized), project_id: "project/codebuildproject-physical"}
    policies = principal_policies(
        synthesized, _handler_role(synthesized, "Starts the weights-staging job and waits for it"), names
    )
    calls = [
        Call(f"codebuild:{op}", project_arn)
        for op in ("StartBuild", "ListBuildsForProject", "BatchGetBuilds", "StopBuild")
    ]
    assert denied(policies, calls) == []


# --- the Ray workers: Ray 2.58's own S3 mirror, run in .venv-ray -----------------------------------


def needs_ray(test: Any) -> Any:
    skip = pytest.mark.skipif(not RAY_PYTHON.exists(), reason=f"{RAY_PYTHON} missing: `make rayenv` creates it")
    return pytest.mark.ray(skip(test))


def _mirror_calls(prefix: str) -> list[Call]:
    """The calls Ray's CloudFileSystem.download_model makes for a staged prefix (an engine start)."""
    out = subprocess.run(
        [str(RAY_PYTHON), str(MIRROR_TOOL), BUCKET_NAME, prefix, *STAGED_FILES],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    calls = []
    for line in out.stdout.splitlines():
        call = json.loads(line)
        answer = {"ResponseMetadata": {"HTTPStatusCode": call["status"]}, "Error": {"Code": call["error"]}}
        calls += authorizations("s3", call["operation"], call["params"], answer)
    return calls


def _workers_role(t: dict[str, Any]) -> str:
    (association,) = [
        r["Properties"] for r in t["Resources"].values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation" and r["Properties"]["ServiceAccount"] == "ray-llm-workers"
    ]  # fmt: skip
    return str(association["RoleArn"]["Fn::GetAtt"][0])


def _other_revision(prefix: str) -> str:
    """The prefix of the revision a running serve config still names after a model_revision change."""
    return prefix.rsplit("/", 1)[0] + "/" + "0123456789abcdef" * 2 + "01234567"


@needs_ray
def test_rays_mirror_lists_the_prefix_and_reads_every_staged_file(synthesized: dict[str, Any]) -> None:
    prefix = _weights(synthesized)["Prefix"]
    calls = _mirror_calls(prefix)
    assert Call("s3:ListBucket", f"arn:aws:s3:::{BUCKET_NAME}", (("s3:prefix", f"{prefix}/"),)) in calls
    assert {c.resource.rsplit("/", 1)[1] for c in calls if c.action == "s3:GetObject"} == set(STAGED_FILES)


@needs_ray
def test_the_workers_role_allows_an_engine_start_on_the_staged_revision_and_on_the_one_before(
    synthesized: dict[str, Any],
) -> None:
    """G4: the serve config keeps the old prefix until the new revision is staged; every engine
    start in between reads it."""
    prefix = _weights(synthesized)["Prefix"]
    policies = principal_policies(synthesized, _workers_role(synthesized), _names(synthesized))
    assert denied(policies, _mirror_calls(prefix)) == []
    assert denied(policies, _mirror_calls(_other_revision(prefix))) == []


@needs_ray
def test_the_rung_fails_on_the_revision_narrowed_grant() -> None:
    """G4's template (1952631): the workers could read only the newest revision's prefix."""
    before = json.loads(
        gzip.decompress((FIXTURES / "lifecycle" / "before-runtime-fixes" / "default.template.json.gz").read_bytes())
    )
    prefix = _weights(before)["Prefix"]
    policies = principal_policies(before, _workers_role(before), _names(before))
    assert denied(policies, _mirror_calls(prefix)) == []
    old = _other_revision(prefix)
    missing = denied(policies, _mirror_calls(old))
    assert f"s3:ListBucket on arn:aws:s3:::{BUCKET_NAME}" in missing
    assert sorted(m for m in missing if m.startswith("s3:GetObject")) == [
        f"s3:GetObject on arn:aws:s3:::{BUCKET_NAME}/{old}/{name}" for name in sorted(STAGED_FILES)
    ]


def _record_default_session(recorded: list[Call]) -> None:
    """Every S3 call of the default session's clients (the pod code's ``boto3.client``), as AWS
    authorizes it, into ``recorded``."""
    boto3.setup_default_session(region_name="us-east-1")
    assert boto3.DEFAULT_SESSION is not None

    def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["eks_pd_params"] = {k: params[k] for k in ("Bucket", "Key", "Prefix") if k in params}

    def after(parsed: dict[str, Any], model: Any, context: Any = None, **_: Any) -> None:
        recorded.extend(authorizations("s3", model.name, (context or {}).get("eks_pd_params", {}), parsed))

    boto3.DEFAULT_SESSION.events.register("provide-client-params.s3.*", keep)
    boto3.DEFAULT_SESSION.events.register("after-call.s3.*", after)


def _node_cache_calls(prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Call]:
    """The calls the node cache's fill makes on a node without a copy, then on one with it (a
    restart), each as AWS authorizes it (moto answers; the rung applies S3's 403 rule)."""
    recorded: list[Call] = []
    with moto_aws(monkeypatch):
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET_NAME)
        for name in STAGED_FILES:
            s3.put_object(Bucket=BUCKET_NAME, Key=f"{prefix}/{name}", Body=b"x")
        # The staging job's manifest (each file's size and SHA-256), which the fill reads as it reads hash.
        weights = [n for n in STAGED_FILES if n not in node_cache_fill.SKIPPED]
        entries = {n: {"bytes": 1, "sha256": hashlib.sha256(b"x").hexdigest()} for n in weights}
        body = json.dumps({"files": entries})
        s3.put_object(Bucket=BUCKET_NAME, Key=f"{prefix}/{node_cache_fill.MANIFEST}", Body=body)
        _record_default_session(recorded)
        for _ in range(2):
            node_cache_fill.fill(f"s3://{BUCKET_NAME}/{prefix}", tmp_path / "main")
    return recorded


def _compile_share_calls(key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Call]:
    """The calls of the compile caches' sharing as two nodes make them: the first finds no archive
    (GET, 404), shares (HEAD, 404; PUT), a second node fills from it (GET) and shares nothing."""
    recorded: list[Call] = []
    with moto_aws(monkeypatch):
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET_NAME)
        _record_default_session(recorded)
        for name, kernels in (("first", True), ("second", False)):
            env = {v: str(tmp_path / name / v.lower()) for v in node_cache_fill.COMPILE_ENV}
            if kernels:
                (Path(env["TRITON_CACHE_DIR"]) / "k").mkdir(parents=True)
                (Path(env["TRITON_CACHE_DIR"]) / "k" / "kernel.cubin").write_bytes(b"x")
            node_cache_fill.fill_compiled(BUCKET_NAME, key, env)
            node_cache_fill.share_compiled(BUCKET_NAME, key, env)
    return recorded


def _compiled_key() -> str:
    """The default decode engine's archive key (the pods derive the bucket from its weights)."""
    return str(serve_args(ray_service())["decode_config"]["callback_config"]["callback_kwargs"]["compiled"])


def test_the_workers_role_allows_sharing_the_compile_caches(
    synthesized: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = _compiled_key()
    calls = _compile_share_calls(key, monkeypatch, tmp_path)
    assert Call("s3:PutObject", f"arn:aws:s3:::{BUCKET_NAME}/{key}") in calls
    assert Call("s3:ListBucket", f"arn:aws:s3:::{BUCKET_NAME}", why=f"{key} is missing: 404 not 403") in calls
    assert denied(principal_policies(synthesized, _workers_role(synthesized), _names(synthesized)), calls) == []


def test_the_rung_fails_on_a_prefix_conditioned_list_for_the_compile_caches(
    synthesized: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The grant as first drafted (list only under ``compile/``): S3 answers a missing archive 403,
    which the pods would take for a refusal and never share."""
    policies = principal_policies(synthesized, _workers_role(synthesized), _names(synthesized))
    narrowed = [
        {**s, "Condition": {"StringLike": {"s3:prefix": ["compile/*"]}}}
        if s.get("Action") == "s3:ListBucket" and "Condition" not in s else s
        for s in policies
    ]  # fmt: skip
    missing = denied(narrowed, _compile_share_calls(_compiled_key(), monkeypatch, tmp_path))
    assert missing and all(m.startswith(f"s3:ListBucket on arn:aws:s3:::{BUCKET_NAME}") for m in missing)


def test_the_rung_fails_on_the_workers_role_without_the_compile_grant(
    synthesized: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The role as shared_compile_cache=false leaves it (its reads of models/ only): the share's
    upload and the fill's read of compile/ are refused."""
    policies = principal_policies(synthesized, _workers_role(synthesized), _names(synthesized))
    without = [s for s in policies if "s3:PutObject" not in s["Action"]]
    key = _compiled_key()
    missing = denied(without, _compile_share_calls(key, monkeypatch, tmp_path))
    assert f"s3:PutObject on arn:aws:s3:::{BUCKET_NAME}/{key}" in missing
    assert f"s3:GetObject on arn:aws:s3:::{BUCKET_NAME}/{key}" in missing


def test_the_workers_role_allows_the_node_cache_fill_on_the_staged_revision_and_the_one_before(
    synthesized: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefix = _weights(synthesized)["Prefix"]
    policies = principal_policies(synthesized, _workers_role(synthesized), _names(synthesized))
    calls = _node_cache_calls(prefix, monkeypatch, tmp_path / "now")
    assert Call("s3:ListBucket", f"arn:aws:s3:::{BUCKET_NAME}", (("s3:prefix", f"{prefix}/"),)) in calls
    assert denied(policies, calls) == []
    assert denied(policies, _node_cache_calls(_other_revision(prefix), monkeypatch, tmp_path / "old")) == []


def test_the_rung_fails_on_the_node_cache_fill_under_the_revision_narrowed_grant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = json.loads(
        gzip.decompress((FIXTURES / "lifecycle" / "before-runtime-fixes" / "default.template.json.gz").read_bytes())
    )
    old = _other_revision(_weights(before)["Prefix"])
    missing = denied(principal_policies(before, _workers_role(before), _names(before)),
                     _node_cache_calls(old, monkeypatch, tmp_path))  # fmt: skip
    assert f"s3:ListBucket on arn:aws:s3:::{BUCKET_NAME}" in missing
    assert f"s3:GetObject on arn:aws:s3:::{BUCKET_NAME}/{old}/hash" in missing


# --- the Ray pods' secret reads and the capacity check --------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The template with API keys on (the default has them off), GCS fault tolerance on."""
    path = synth_assembly(tmp_path_factory.mktemp("keyed"), nag=False, api_keys=True)
    return dict(json.loads(path.read_text()))


def _role_of(t: dict[str, Any], service_account: str) -> str:
    (association,) = [
        r["Properties"] for r in t["Resources"].values()
        if r["Type"] == "AWS::EKS::PodIdentityAssociation" and r["Properties"]["ServiceAccount"] == service_account
    ]  # fmt: skip
    return str(association["RoleArn"]["Fn::GetAtt"][0])


def _secret(t: dict[str, Any], prefix: str) -> str:
    (secret,) = [
        k for k, r in t["Resources"].items() if r["Type"] == "AWS::SecretsManager::Secret" and k.startswith(prefix)
    ]
    return str(secret)


def _recording_boto3(monkeypatch: pytest.MonkeyPatch, recorder: Recorder) -> None:
    """Every client the code under test builds through boto3.client is recorded."""
    real = boto3.client
    monkeypatch.setattr(boto3, "client", lambda *a, **kw: record(real(*a, **kw), recorder))


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_aws(monkeypatch):
        yield boto3.client("secretsmanager", region_name="us-east-1")


def _head_reads_the_gcs_token(t: dict[str, Any], secrets: Any, monkeypatch: pytest.MonkeyPatch, tmp: Path) -> list[str]:
    """The head's init container (fault_tolerance/auth) as the pod runs it; the calls it was denied."""
    arn = secrets.create_secret(Name="gcs-token", SecretString=json.dumps({auth.FIELD: "Tk" * 32}))["ARN"]
    monkeypatch.setenv(auth.SECRET_ENV, arn)
    monkeypatch.setenv(auth.FILE_ENV, str(tmp / auth.ENV_FILE))
    recorder = Recorder()
    _recording_boto3(monkeypatch, recorder)
    assert gcs_reader.main() == 0
    assert [c.action for c in recorder.calls] == ["secretsmanager:GetSecretValue"]
    names = {_secret(t, "PdServingGcsStore"): arn}
    return denied(principal_policies(t, _role_of(t, "ray-llm-head"), names), recorder.calls)


def test_the_heads_role_allows_its_init_containers_token_read(
    synthesized: dict[str, Any], secrets: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _head_reads_the_gcs_token(synthesized, secrets, monkeypatch, tmp_path) == []


def test_the_rung_fails_on_a_head_role_without_the_token_grant(
    synthesized: dict[str, Any], secrets: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = copy.deepcopy(synthesized)
    role = _role_of(broken, "ray-llm-head")
    for resource in broken["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role} in resource["Properties"]["Roles"]:
            statements = resource["Properties"]["PolicyDocument"]["Statement"]
            statements[:] = [s for s in statements if "secretsmanager:GetSecretValue" not in s["Action"]]
    (line,) = _head_reads_the_gcs_token(broken, secrets, monkeypatch, tmp_path)
    assert line.startswith("secretsmanager:GetSecretValue on arn:aws:secretsmanager:us-east-1:")


@pytest.mark.parametrize("account", ["ray-llm-head", "ray-llm-workers"])
def test_every_ray_pods_role_allows_its_proxys_key_read(
    keyed: dict[str, Any], secrets: Any, monkeypatch: pytest.MonkeyPatch, account: str
) -> None:
    """Every Ray pod runs a Serve proxy, and each proxy reads the key secret itself."""
    arn = secrets.create_secret(Name="api-keys", SecretString=json.dumps({"initial": "k" * 48}))["ARN"]
    recorder = Recorder()
    _recording_boto3(monkeypatch, recorder)
    store = api_keys_proxy.KeyStore(api_keys_proxy.secrets_manager_fetch(arn))
    assert store.refresh()
    assert [c.action for c in recorder.calls] == ["secretsmanager:GetSecretValue"]
    names = {_secret(keyed, "PdServingApiKeys"): arn}
    assert denied(principal_policies(keyed, _role_of(keyed, account), names), recorder.calls) == []


def test_the_capacity_checks_role_allows_every_call_of_its_create(
    synthesized: dict[str, Any], secrets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy-time capacity check's Create, against moto's EC2 and Stubber's Service Quotas."""
    recorder = Recorder()
    stubbed = record(stubbed_quotas(64), recorder)
    real = boto3.client
    monkeypatch.setattr(
        boto3, "client", lambda name, **kw: stubbed if name == "service-quotas" else record(real(name), recorder)
    )
    capacity_handler.on_event({"RequestType": "Create", "ResourceProperties": capacity_properties()})
    # An Update reads the stack's status first (a rollback is reported, not refused).
    stack = {"StackName": "RayLlmPdServing", "StackId": STACK_ID, "StackStatus": "UPDATE_ROLLBACK_IN_PROGRESS",
             "CreationTime": "2026-12-01T00:00:00Z"}  # fmt: skip
    monkeypatch.setattr(boto3, "client", real)  # new clients for the Update's stubs
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    stub = Stubber(cloudformation)
    stub.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": STACK_ID})
    stub.activate()
    stubbed_again = record(stubbed_quotas(64), recorder)
    clients = {"service-quotas": stubbed_again, "cloudformation": record(cloudformation, recorder)}
    monkeypatch.setattr(boto3, "client", lambda name, **kw: clients.get(name) or record(real(name), recorder))
    update = {"RequestType": "Update", "StackId": STACK_ID, "ResourceProperties": capacity_properties(),
              "OldResourceProperties": capacity_properties()}  # fmt: skip
    capacity_handler.on_event(update)
    actions = {c.action for c in recorder.calls}
    assert {"ec2:DescribeInstanceTypes", "servicequotas:GetServiceQuota", "cloudformation:DescribeStacks"} <= actions
    (role,) = [k for k in synthesized["Resources"] if k.startswith("PdServingGpuCapacityCheckFunctionServiceRole")
               and synthesized["Resources"][k]["Type"] == "AWS::IAM::Role"]  # fmt: skip
    assert denied(principal_policies(synthesized, role, {}), recorder.calls) == []


# --- a Capacity Block's end --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Capacity Block deployment with the alarm topic (the function publishes to it)."""
    path = synth_assembly(
        tmp_path_factory.mktemp("block"), nag=False, gpu_capacity="capacity-block:cr-0123456789abcdef0",
        availability_zones="us-east-1a,us-east-1b", gpu_availability_zone="us-east-1a", alarm_email="ops@example.com",
    )  # fmt: skip
    return dict(json.loads(path.read_text()))


def _block_end_calls(t: dict[str, Any], extended: bool) -> tuple[list[Call], str, dict[str, str]]:
    """The scheduled scale-down's calls (or, ``extended``, its move of the schedule), recorded on
    stubbed clients with the template's own names; and the function's role."""
    import datetime

    from botocore.stub import ANY, Stubber

    from eks_pd_serving.capacity import block_end

    resources = t["Resources"]
    (schedule,) = [
        r["Properties"] for r in resources.values()
        if r["Type"] == "AWS::Scheduler::Schedule" and "scale-down" in json.dumps(r["Properties"])
    ]  # fmt: skip
    topic = next(k for k, r in resources.items() if r["Type"] == "AWS::SNS::Topic")
    cluster = next(k for k, r in resources.items() if r["Type"] == "AWS::EKS::Cluster")
    nodegroup = next(k for k, r in resources.items() if r["Type"] == "AWS::EKS::Nodegroup"
                     and r["Properties"].get("CapacityType") == "CAPACITY_BLOCK")  # fmt: skip
    names = {
        topic: "arn:aws:sns:us-east-1:111122223333:alarms",
        cluster: "ray-llm-multinode",
        nodegroup: "GpuNodeGroup-a",
    }
    event = json.loads(resolve(schedule["Target"]["Input"], t, names))
    role_arn = resolve(schedule["Target"]["RoleArn"], t, names)
    end = datetime.datetime(2026, 12, 6, 11, 30, tzinfo=datetime.UTC)
    recorder = Recorder()
    made = {n: boto3.client(n, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
            for n in ("ec2", "eks", "sns", "scheduler")}  # fmt: skip
    stubs = {n: Stubber(record(c, recorder)) for n, c in made.items()}
    block = {"CapacityReservationId": event["reservation"], "InstanceType": "g6.8xlarge",
             "EndDate": end + datetime.timedelta(days=7 if extended else 0)}  # fmt: skip
    stubs["ec2"].add_response("describe_capacity_reservations", {"CapacityReservations": [block]})
    if extended:
        target = {"Arn": "arn:aws:lambda:us-east-1:111122223333:function:f", "RoleArn": role_arn}
        current = {"Name": event["schedule"], "FlexibleTimeWindow": {"Mode": "OFF"}, "Target": target}
        stubs["scheduler"].add_response("get_schedule", current)
        stubs["scheduler"].add_response("update_schedule", {"ScheduleArn": "arn:x"})
    else:
        scaling = {"nodegroup": {"scalingConfig": {"minSize": 2, "maxSize": 2, "desiredSize": 2}}}
        stubs["eks"].add_response("describe_nodegroup", scaling)
        stubs["eks"].add_response("update_nodegroup_config", {})
        stubs["sns"].add_response("publish", {"MessageId": "m"}, {"TopicArn": ANY, "Subject": ANY, "Message": ANY})
    for stub in stubs.values():
        stub.activate()
    block_end.on_schedule(event, clients=made, now=end - datetime.timedelta(hours=1))
    (function,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Function"
                   and r["Properties"].get("Handler") == "block_end.on_schedule"]  # fmt: skip
    return recorder.calls, str(function["Role"]["Fn::GetAtt"][0]), names


@pytest.mark.parametrize("extended", [False, True], ids=["scale-down", "moved-by-an-extension"])
def test_the_block_end_functions_role_allows_every_call(blocked: dict[str, Any], extended: bool) -> None:
    calls, role, names = _block_end_calls(blocked, extended)
    actions = {c.action for c in calls}
    expected = (
        {"scheduler:UpdateSchedule", "iam:PassRole"} if extended else {"eks:UpdateNodegroupConfig", "sns:Publish"}
    )
    assert expected <= actions
    assert denied(principal_policies(blocked, role, names), calls) == []


def test_the_rung_fails_on_the_block_end_role_without_the_node_group_grant(blocked: dict[str, Any]) -> None:
    calls, role, names = _block_end_calls(blocked, extended=False)
    broken = copy.deepcopy(blocked)
    for resource in broken["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role} in resource["Properties"]["Roles"]:
            statements = resource["Properties"]["PolicyDocument"]["Statement"]
            statements[:] = [s for s in statements if "eks:UpdateNodegroupConfig" not in json.dumps(s)]
    assert [str(c).split(" on ")[0] for c in denied(principal_policies(broken, role, names), calls)] == [
        "eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"
    ]  # fmt: skip


def _reservation_calls(t: dict[str, Any]) -> tuple[list[Call], str]:
    """The deploy-time check's reservation reads (DescribeCapacityReservations, then the cluster's own
    nodes in it), recorded on a stubbed EC2 client; and the check's role in ``t``."""
    import datetime

    from botocore.stub import Stubber

    from eks_pd_serving.capacity import checks

    recorder = Recorder()
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(record(ec2, recorder))
    end = datetime.datetime(2026, 12, 6, 11, 30, tzinfo=datetime.UTC)
    block = {"CapacityReservationId": "cr-0123456789abcdef0", "InstanceType": "g6.8xlarge", "State": "active",
             "AvailabilityZone": "us-east-1a", "AvailableInstanceCount": 2, "EndDate": end}  # fmt: skip
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [block]})
    stub.add_response("describe_instances", {"Reservations": []})
    group = checks.ReservedGroup("gpu", "g6.8xlarge", 2, "capacity-block", "cr-0123456789abcdef0", "gpu_capacity")
    with stub:
        found, _ = checks.check_reservations(
            ec2, [group], "us-east-1a", cluster_name="ray-llm-multinode", now=end - datetime.timedelta(days=2)
        )
    assert [c.passed for c in found] == [True]
    (role,) = [k for k, r in t["Resources"].items() if k.startswith("PdServingGpuCapacityCheckFunctionServiceRole")
               and r["Type"] == "AWS::IAM::Role"]  # fmt: skip
    return recorder.calls, role


def test_the_capacity_checks_role_allows_its_reservation_reads(blocked: dict[str, Any]) -> None:
    calls, role = _reservation_calls(blocked)
    assert {c.action for c in calls} == {"ec2:DescribeCapacityReservations", "ec2:DescribeInstances"}
    assert denied(principal_policies(blocked, role, {}), calls) == []


def test_the_rung_fails_on_the_check_without_the_reservation_grant(
    blocked: dict[str, Any], synthesized: dict[str, Any]
) -> None:
    """The default template's check has no DescribeCapacityReservations (none is reserved): the same
    reads are denied there, so the grant the block's template adds is what allows them."""
    calls, role = _reservation_calls(synthesized)
    assert [str(c).split(" on ")[0] for c in denied(principal_policies(synthesized, role, {}), calls)] == [
        "ec2:DescribeCapacityReservations"
    ]
