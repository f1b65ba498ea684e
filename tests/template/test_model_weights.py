"""Weights staged in the stack's bucket (weights_source=s3, the default): the bucket, the S3 gateway
endpoint, the staging the RayService waits for, the workers' read-only access, the token's path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import build_stack, ray_service, resources_of_type, serve_args, synth_assembly

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.weights.model_weights import JOB_PACKAGES

PREFIX = "models/Qwen/Qwen3.5-9B/main"


@pytest.fixture(scope="module")
def default() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack()).to_json())


def _ray_service(template: dict[str, Any]) -> dict[str, Any]:
    """The RayService as the stack applies it (the bucket's name shown as <LogicalId>)."""
    (service,) = [o for o in kubernetes_objects(template, "us-east-1") if o["kind"] == "RayService"]
    return service


def _one(template: dict[str, Any], type_: str) -> tuple[str, dict[str, Any]]:
    (item,) = resources_of_type(template, type_).items()
    return item


def test_the_bucket_is_private_encrypted_tls_only_and_emptied_on_destroy(default: dict[str, Any]) -> None:
    (_, bucket) = _one(default, "AWS::S3::Bucket")
    props = bucket["Properties"]
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms" and rule["BucketKeyEnabled"]
    assert set(props["PublicAccessBlockConfiguration"].values()) == {True}
    assert bucket["DeletionPolicy"] == "Delete"
    (_, policy) = _one(default, "AWS::S3::BucketPolicy")
    denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert denies[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert resources_of_type(default, "Custom::S3AutoDeleteObjects")


def test_retain_keeps_the_bucket_and_its_key() -> None:
    template = dict(Template.from_stack(build_stack(model_bucket_removal="retain")).to_json())
    (_, bucket) = _one(template, "AWS::S3::Bucket")
    keys = [k for k_id, k in resources_of_type(template, "AWS::KMS::Key").items() if "ModelWeights" in k_id]
    assert bucket["DeletionPolicy"] == keys[0]["DeletionPolicy"] == "Retain"
    assert not resources_of_type(template, "Custom::S3AutoDeleteObjects")


def test_s3_from_the_private_subnets_takes_the_gateway_endpoint(default: dict[str, Any]) -> None:
    (_, endpoint) = _one(default, "AWS::EC2::VPCEndpoint")
    props = endpoint["Properties"]
    assert props["VpcEndpointType"] == "Gateway" and "s3" in json.dumps(props["ServiceName"])
    private_tables = {k for k in resources_of_type(default, "AWS::EC2::RouteTable") if "PrivateSubnet" in k}
    assert {t["Ref"] for t in props["RouteTableIds"]} == private_tables and len(private_tables) == 2


def test_both_engines_load_the_staged_revision_through_the_node_cache(default: dict[str, Any]) -> None:
    """The node cache fills each node's folder from the staged prefix (tests/template/test_node_cache.py);
    the engines read the folder with vLLM's default loader."""
    args = serve_args(_ray_service(default))
    sides = ("prefill_config", "decode_config")
    sources = {side: args[side]["callback_config"]["callback_kwargs"]["source"] for side in sides}
    (bucket_id, _) = _one(default, "AWS::S3::Bucket")
    assert set(sources.values()) == {f"s3://<{bucket_id}>/{PREFIX}"}
    assert all("load_format" not in args[side]["engine_kwargs"] for side in sources)  # vLLM's default loader


def test_without_the_node_cache_both_engines_read_the_staged_revision_through_rays_s3_mirror() -> None:
    template = dict(Template.from_stack(build_stack(node_cache=False)).to_json())
    args = serve_args(_ray_service(template))
    sources = {side: args[side]["model_loading_config"]["model_source"] for side in ("prefill_config", "decode_config")}
    (bucket_id, _) = _one(template, "AWS::S3::Bucket")
    assert set(sources.values()) == {f"s3://<{bucket_id}>/{PREFIX}"}


def test_the_workers_read_the_staged_revisions_only_through_pod_identity(default: dict[str, Any]) -> None:
    service = _ray_service(default)
    for group in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        assert spec["serviceAccountName"] == "ray-llm-workers"
        assert {"name": "AWS_REGION", "value": "us-east-1"} in spec["containers"][0]["env"]
    # The head has its own account (it reads the GCS store's token, not the weights).
    assert (
        service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "ray-llm-head"
    )
    (association,) = [a["Properties"] for a in resources_of_type(default, "AWS::EKS::PodIdentityAssociation").values()
                      if a["Properties"]["ServiceAccount"] == "ray-llm-workers"]  # fmt: skip
    assert association["Namespace"] == "inference"
    role_id = association["RoleArn"]["Fn::GetAtt"][0]
    (policy,) = [p for p in resources_of_type(default, "AWS::IAM::Policy").values()
                 if {"Ref": role_id} in p["Properties"]["Roles"]]  # fmt: skip
    every = policy["Properties"]["PolicyDocument"]["Statement"]
    # The compile archives (shared_compile_cache, on by default): read and written under compile/,
    # the bucket listed (a missing archive is 404), encrypted through S3; tests/template/test_node_cache.py.
    shares = [s for s in every if "s3:PutObject" in s["Action"] or "kms:GenerateDataKey" in s["Action"]
              or (s["Action"] == "s3:ListBucket" and "Condition" not in s)]  # fmt: skip
    assert len(shares) == 3
    statements = {json.dumps(s["Action"]): s for s in every if s not in shares}
    assert set(statements) == {'"s3:GetObject"', '"s3:ListBucket"'}
    # Every revision under models/, not the current one alone (G4: the old one serves until the new
    # one is staged; tests/template/test_iam_rung.py runs Ray's mirror against both).
    assert json.dumps(statements['"s3:GetObject"']["Resource"]).endswith('"/models/*"]]}')
    assert statements['"s3:ListBucket"']["Condition"] == {"StringLike": {"s3:prefix": ["models/*", "models"]}}
    assert next(s for s in every if "s3:PutObject" in s["Action"])["Resource"]["Fn::Join"][1][-1] == "/compile/*"


def test_the_ray_service_waits_for_the_staging_and_the_association(default: dict[str, Any]) -> None:
    (staging_id, staging) = _one(default, "Custom::ModelWeights")
    assert staging["Properties"]["Prefix"] == PREFIX and staging["Properties"]["Revision"] == "main"
    (association_id,) = [rid for rid, a in resources_of_type(default, "AWS::EKS::PodIdentityAssociation").items()
                         if a["Properties"]["ServiceAccount"] == "ray-llm-workers"]  # fmt: skip
    (manifest,) = [r for r in resources_of_type(default, "Custom::AWSCDK-EKS-KubernetesResource").values()
                   if '"kind\\":\\"RayService\\"' in json.dumps(r["Properties"]["Manifest"])]  # fmt: skip
    assert {staging_id, association_id} <= set(manifest["DependsOn"])


def test_a_pinned_revision_gets_its_own_prefix() -> None:
    args = serve_args(_ray_service(dict(Template.from_stack(build_stack(model_revision="c0ffee0123")).to_json())))
    assert args["decode_config"]["callback_config"]["callback_kwargs"]["source"].endswith(
        "/models/Qwen/Qwen3.5-9B/c0ffee0123"
    )
    # Each revision its own folder on the node: the old one serves until the new one is filled.
    assert args["decode_config"]["model_loading_config"]["model_source"].endswith("/Qwen--Qwen3.5-9B/c0ffee0123")


def test_huggingface_keeps_the_old_path_and_adds_nothing() -> None:
    template = dict(Template.from_stack(build_stack(weights_source="huggingface")).to_json())
    assert not resources_of_type(template, "AWS::S3::Bucket") and not resources_of_type(
        template, "Custom::ModelWeights"
    )
    args = serve_args(ray_service(weights_source="huggingface"))
    assert args["prefill_config"]["model_loading_config"]["model_source"] == "Qwen/Qwen3.5-9B"


def test_the_token_is_read_by_the_job_only_and_never_written_anywhere(tmp_path: Path) -> None:
    """The secret's name goes to the staging job's environment as a Secrets Manager reference; no
    value shaped like a token is in any template or asset, and nothing else may read the secret."""
    assembly = synth_assembly(tmp_path, hf_token_secret="hf/token").parent
    template = json.loads((assembly / "RayLlmPdServing.template.json").read_text())
    (_, job) = _one(template, "AWS::CodeBuild::Project")
    env = {v["Name"]: v for v in job["Properties"]["Environment"]["EnvironmentVariables"]}
    assert (env["HF_TOKEN"]["Type"], env["HF_TOKEN"]["Value"]) == ("SECRETS_MANAGER", "hf/token")
    readers = [k for k, p in resources_of_type(template, "AWS::IAM::Policy").items() if "hf/token" in json.dumps(p)]
    assert len(readers) == 1 and "ModelWeightsJob" in readers[0]
    token_shape = re.compile(r"hf_[A-Za-z0-9]{20,}")
    texts = [
        p.read_text(errors="ignore")
        for p in assembly.rglob("*")
        if p.is_file() and p.suffix in {".json", ".py", ".yaml"}
    ]
    assert texts and not any(token_shape.search(text) for text in texts)


def test_a_token_given_in_place_of_the_secret_is_refused_without_echoing_it() -> None:
    canary = "hf_CanaryTokenThatMustNeverBePrinted0123"
    with pytest.raises(ConfigError) as refused:
        DeploymentConfig.create(hf_token_secret=canary)
    assert canary not in str(refused.value) and str(refused.value).startswith("hf_token_secret=<hidden>: ")


def test_the_job_installs_the_tested_hugging_face_client() -> None:
    from support import ROOT

    pinned = [
        line
        for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("huggingface_hub==")
    ]
    assert pinned and pinned[0] in JOB_PACKAGES
