"""The weights staging: the job's script against moto's S3 with huggingface_hub's own error
classes, and the custom resource's handlers against botocore's Stubber for CodeBuild."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import httpx2  # huggingface_hub 2's HTTP client: its errors carry httpx2 responses
import pytest
from botocore.stub import Stubber
from huggingface_hub import errors
from support import moto_s3

from eks_pd_serving.weights.handler import handler
from eks_pd_serving.weights.job import stage

BUCKET, PREFIX, MODEL = "weights", "models/org/model/main", "org/model"
FILES = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         "tokenizer.json", "original/consolidated.00.pth", "README.md"]  # fmt: skip
CANARY = "hf_CanaryTokenThatMustNeverBePrinted0123"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_s3(monkeypatch, BUCKET) as client:
        yield client


class Hub:
    """A Hugging Face repository: files written on download, or the error its API raises."""

    def __init__(self, files: list[str], error: Exception | None = None) -> None:
        self.files, self.error = files, error
        self.downloads: list[str] = []

    def model_info(self, model: str, revision: str, token: str | None, files_metadata: bool) -> Any:
        if self.error:
            raise self.error
        return SimpleNamespace(sha="0123abcd" * 5, siblings=[SimpleNamespace(rfilename=f) for f in self.files])

    def download(self, model: str, name: str, revision: str, token: str | None, local_dir: str) -> str:
        path = Path(local_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{name}@{revision}".encode())
        self.downloads.append(name)
        return str(path)


def _http_error(kind: type[errors.HfHubHTTPError], status: int) -> errors.HfHubHTTPError:
    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/org/model"))
    return kind("refused", response=response)


def _run(s3: Any, hub: Hub, token: str | None = None) -> str:
    return stage.stage(s3, model=MODEL, revision="main", bucket=BUCKET, prefix=PREFIX, token=token, api=hub,
                       download=hub.download, log=lambda line: None)  # fmt: skip


def _keys(s3: Any) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_stages_what_an_engine_loads_then_the_hash_ray_reads_and_the_marker(s3: Any) -> None:
    hub = Hub(FILES)
    assert _run(s3, hub) == "staged"
    staged = [f"{PREFIX}/{f}" for f in ("config.json", "hash", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "tokenizer.json", ".staged",
                                        stage.MANIFEST)]  # fmt: skip
    assert _keys(s3) == sorted(staged)  # not original/ nor the README
    # Each staged file's size and SHA-256, which the node cache checks its copy against.
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{stage.MANIFEST}")["Body"].read())["files"]
    assert sorted(manifest) == sorted(f.removeprefix(f"{PREFIX}/") for f in staged if "." in f and "/." not in f
                                      and not f.endswith("/hash"))  # fmt: skip
    for name, entry in manifest.items():
        body = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}")["Body"].read()
        assert entry == {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    assert s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/hash")["Body"].read() == b"0123abcd" * 5
    # Downloaded at the resolved commit, one file at a time.
    body = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/config.json")["Body"].read()
    assert body == b"config.json@" + b"0123abcd" * 5


def test_a_staged_revision_is_skipped(s3: Any) -> None:
    _run(s3, Hub(FILES))
    again = Hub(FILES)
    assert _run(s3, again) == "skipped" and again.downloads == []


@pytest.mark.parametrize(
    ("error", "token", "expected"),
    [
        (_http_error(errors.GatedRepoError, 401), None, "org/model at revision main is gated: Hugging Face answered "
         "HTTP 401. Fix: set hf_token_secret to a Secrets Manager secret holding a token with access"),
        (_http_error(errors.GatedRepoError, 403), CANARY, "is gated: Hugging Face answered HTTP 403. Fix: accept the "
         "model's licence"),
        (_http_error(errors.RevisionNotFoundError, 404), None, "no such revision (Hugging Face answered HTTP 404). "
         "Fix: set model_revision"),
        (_http_error(errors.RepositoryNotFoundError, 404), None, "no such repository, or it is private"),
        (_http_error(errors.HfHubHTTPError, 503), None, "Hugging Face answered HTTP 503. Fix: retry the deploy"),
    ],
)  # fmt: skip
def test_a_refusal_is_one_line_with_the_status_and_the_fix(
    s3: Any, error: Exception, token: str | None, expected: str
) -> None:
    with pytest.raises(stage.StagingFailed) as failed:
        _run(s3, Hub(FILES, error), token)
    assert expected in str(failed.value) and "\n" not in str(failed.value)
    assert CANARY not in str(failed.value)


def test_a_repository_without_safetensors_is_refused(s3: Any) -> None:
    with pytest.raises(stage.StagingFailed, match=r"has no .safetensors weights"):
        _run(s3, Hub(["config.json", "pytorch_model.bin"]))


def test_the_job_writes_its_reason_for_the_deploy_and_never_prints_the_token(
    s3: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() as the job runs it: the gated refusal's line goes to <prefix>/.staging-error (what the
    custom resource reports), the exit is 1, and the token is in neither the log nor the object."""
    hub = Hub(FILES, _http_error(errors.GatedRepoError, 403))
    env = {"MODEL": MODEL, "REVISION": "main", "BUCKET": BUCKET, "PREFIX": PREFIX, "HF_TOKEN": CANARY}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert stage.main(s3, hub, hub.download) == 1
    reason = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{stage.ERROR}")["Body"].read().decode()
    printed = capsys.readouterr().out
    assert "is gated" in reason and f"STAGING FAILED: {reason}" in printed
    assert CANARY not in reason and CANARY not in printed


# --- the custom resource ---------------------------------------------------------------------
PROPS = {"ProjectName": "job", "Bucket": BUCKET, "Prefix": PREFIX, "Model": MODEL, "Revision": "main"}


def _codebuild() -> tuple[Any, Stubber]:
    client = boto3.client("codebuild", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def test_create_starts_the_job_for_the_revision() -> None:
    client, stub = _codebuild()
    overrides = [{"name": n, "value": v, "type": "PLAINTEXT"} for n, v in
                 (("MODEL", MODEL), ("REVISION", "main"), ("PREFIX", PREFIX))]  # fmt: skip
    stub.add_response(
        "start_build", {"build": {"id": "job:1"}}, {"projectName": "job", "environmentVariablesOverride": overrides}
    )
    with stub:
        answer = handler.on_event({"RequestType": "Create", "ResourceProperties": PROPS}, codebuild=client)
    assert answer == {"PhysicalResourceId": f"s3://{BUCKET}/{PREFIX}/", "Data": {"BuildId": "job:1"}}


def test_delete_stops_a_build_still_running_and_leaves_the_weights_to_the_bucket() -> None:
    """A rollback after the wait gave up: the build still staging is stopped, the finished one
    is left alone; the objects are the bucket's removal policy's to decide."""
    client, stub = _codebuild()
    stub.add_response("list_builds_for_project", {"ids": ["job:2", "job:1"]},
                      {"projectName": "job", "sortOrder": "DESCENDING"})  # fmt: skip
    builds = [{"id": "job:2", "buildStatus": "IN_PROGRESS"}, {"id": "job:1", "buildStatus": "SUCCEEDED"}]
    stub.add_response("batch_get_builds", {"builds": builds}, {"ids": ["job:2", "job:1"]})
    stub.add_response("stop_build", {"build": {"id": "job:2"}}, {"id": "job:2"})
    event = {"RequestType": "Delete", "ResourceProperties": PROPS, "PhysicalResourceId": "p"}
    with stub:
        assert handler.on_event(event, codebuild=client) == {"PhysicalResourceId": "p"}
    stub.assert_no_pending_responses()
    assert handler.is_complete(event) == {"IsComplete": True}


def test_delete_stops_only_the_build_of_its_own_revision() -> None:
    """Several served models share the job: removing one model's staging stops its build, not a
    build staging another model's revision."""
    client, stub = _codebuild()
    stub.add_response("list_builds_for_project", {"ids": ["job:3", "job:2"]},
                      {"projectName": "job", "sortOrder": "DESCENDING"})  # fmt: skip

    def staging(build_id: str, prefix: str) -> dict[str, Any]:
        variables = [{"name": "PREFIX", "value": prefix, "type": "PLAINTEXT"}]
        return {"id": build_id, "buildStatus": "IN_PROGRESS", "environment": {
            "type": "LINUX_CONTAINER", "image": "i", "computeType": "BUILD_GENERAL1_LARGE",
            "environmentVariables": variables}}  # fmt: skip

    builds = [staging("job:3", "models/Qwen/Qwen3-8B/main"), staging("job:2", PREFIX)]
    stub.add_response("batch_get_builds", {"builds": builds}, {"ids": ["job:3", "job:2"]})
    stub.add_response("stop_build", {"build": {"id": "job:2"}}, {"id": "job:2"})
    event = {"RequestType": "Delete", "ResourceProperties": PROPS, "PhysicalResourceId": "p"}
    with stub:
        assert handler.on_event(event, codebuild=client) == {"PhysicalResourceId": "p"}
    stub.assert_no_pending_responses()


def test_delete_with_no_build_stops_nothing() -> None:
    client, stub = _codebuild()
    # A project that never built: the answer has no ids at all (the model's list has a minimum of one).
    stub.add_response("list_builds_for_project", {}, {"projectName": "job", "sortOrder": "DESCENDING"})
    event = {"RequestType": "Delete", "ResourceProperties": PROPS, "PhysicalResourceId": "p"}
    with stub:
        assert handler.on_event(event, codebuild=client) == {"PhysicalResourceId": "p"}


@pytest.mark.parametrize(("status", "done"), [("IN_PROGRESS", False), ("SUCCEEDED", True)])
def test_the_deploy_waits_for_the_job(status: str, done: bool) -> None:
    client, stub = _codebuild()
    stub.add_response("batch_get_builds", {"builds": [{"id": "job:1", "buildStatus": status}]}, {"ids": ["job:1"]})
    event = {"RequestType": "Create", "ResourceProperties": PROPS, "Data": {"BuildId": "job:1"}}
    with stub:
        assert handler.is_complete(event, codebuild=client, s3=object()) == {"IsComplete": done}


def test_a_failed_job_fails_the_deploy_with_its_reason(s3: Any) -> None:
    client, stub = _codebuild()
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{handler.ERROR}", Body=io.BytesIO(b"org/model is gated: ...").read())
    stub.add_response("batch_get_builds", {"builds": [{"id": "job:1", "buildStatus": "FAILED"}]}, {"ids": ["job:1"]})
    event = {"RequestType": "Create", "ResourceProperties": PROPS, "Data": {"BuildId": "job:1"}}
    with stub, pytest.raises(handler.StagingFailed, match=r"^weights staging failed: org/model is gated: \.\.\.$"):
        handler.is_complete(event, codebuild=client, s3=s3)


def test_a_job_that_died_without_a_reason_points_at_its_log(s3: Any) -> None:
    client, stub = _codebuild()
    build = {"id": "job:1", "buildStatus": "TIMED_OUT", "logs": {"groupName": "/stack/job"}}
    stub.add_response("batch_get_builds", {"builds": [build]}, {"ids": ["job:1"]})
    event = {"RequestType": "Update", "ResourceProperties": PROPS, "Data": {"BuildId": "job:1"}}
    with (
        stub,
        pytest.raises(
            handler.StagingFailed, match=r"job:1 ended TIMED_OUT without a reason; see its log in /stack/job"
        ),
    ):
        handler.is_complete(event, codebuild=client, s3=s3)


def test_the_job_and_the_handler_agree_on_the_error_object() -> None:
    assert stage.ERROR == handler.ERROR
