"""``access_logs_bucket``: the weights bucket's server access logs and the internal NLB's (TLS
listeners only), in a bucket of the user's that outlives the stack; preflight checks its region
and policy. What S3 and ELB do with the setting at run time (deliver, or refuse for want of a
policy statement) is on paper here: preflight reads what they would read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_cdk.assertions import Template
from botocore.stub import Stubber
from support import build_stack, resources_of_type, synth_assembly

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.cli import preflight
from eks_pd_serving.config import ConfigError, DeploymentConfig

CERTIFICATE = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
LOGS = "acme-access-logs"
ATTRIBUTES = "service.beta.kubernetes.io/aws-load-balancer-attributes"


def endpoint_service(template: dict[str, Any]) -> dict[str, Any]:
    (service,) = [
        o for o in kubernetes_objects(template) if o["kind"] == "Service" and o["spec"].get("type") == "LoadBalancer"
    ]
    return service


def test_the_weights_bucket_and_the_tls_endpoint_log_into_the_users_bucket_one_folder_each() -> None:
    template = dict(
        Template.from_stack(
            build_stack(endpoint_exposure="internal", tls_certificate_arn=CERTIFICATE, access_logs_bucket=LOGS)
        ).to_json()
    )
    (bucket,) = resources_of_type(template, "AWS::S3::Bucket").values()
    assert bucket["Properties"]["LoggingConfiguration"] == {
        "DestinationBucketName": LOGS,
        "LogFilePrefix": "ray-llm-multinode/s3/",
    }
    # Logged, so not acknowledged: cdk-nag's S1 judges the bucket itself.
    assert "AwsSolutions-S1" not in json.dumps(bucket.get("Metadata", {}))
    assert endpoint_service(template)["metadata"]["annotations"][ATTRIBUTES] == (
        f"access_logs.s3.enabled=true,access_logs.s3.bucket={LOGS},access_logs.s3.prefix=ray-llm-multinode/nlb"
    )
    # The stack does not own the bucket: nothing of it is in the template, nothing to delete.
    assert LOGS not in json.dumps(resources_of_type(template, "AWS::S3::BucketPolicy"))


def test_without_the_setting_nothing_logs_and_the_acknowledgment_says_why() -> None:
    template = dict(
        Template.from_stack(build_stack(endpoint_exposure="internal", tls_certificate_arn=CERTIFICATE)).to_json()
    )
    (bucket,) = resources_of_type(template, "AWS::S3::Bucket").values()
    assert "LoggingConfiguration" not in bucket["Properties"]
    assert "gated model" in json.dumps(bucket["Metadata"])
    assert ATTRIBUTES not in endpoint_service(template)["metadata"]["annotations"]


def test_a_logged_bucket_passes_cdk_nag_s1_by_the_rule_itself(tmp_path: Path) -> None:
    """The acknowledgment is gone, so a missing LoggingConfiguration would fail synth here."""
    template = json.loads(synth_assembly(tmp_path, access_logs_bucket=LOGS).read_text())
    (bucket,) = resources_of_type(template, "AWS::S3::Bucket").values()
    assert "LoggingConfiguration" in bucket["Properties"]


def test_without_tls_the_nlb_logs_nothing_and_synth_says_so() -> None:
    config = DeploymentConfig.create(endpoint_exposure="internal", access_logs_bucket=LOGS)
    (found,) = [w for w in config.warnings() if w.startswith("access_logs_bucket=")]
    assert "TLS listeners alone" in found
    template = dict(Template.from_stack(build_stack(endpoint_exposure="internal", access_logs_bucket=LOGS)).to_json())
    assert ATTRIBUTES not in endpoint_service(template)["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"access_logs_bucket": "arn:aws:s3:::acme-logs"}, "not an S3 bucket name"),
        ({"access_logs_bucket": "s3://acme-logs"}, "not an S3 bucket name"),
        ({"access_logs_bucket": "Acme_Logs"}, "not an S3 bucket name"),
        ({"access_logs_bucket": LOGS, "weights_source": "huggingface"}, "has nothing to log"),
    ],
)
def test_an_access_logs_bucket_that_cannot_work_is_refused_in_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        DeploymentConfig.create(**settings)
    assert "\n" not in str(raised.value)


# --- preflight ----------------------------------------------------------------------------------
def policy(*services: str) -> str:
    statements = [
        {"Effect": "Allow", "Principal": {"Service": s}, "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{LOGS}/*"}
        for s in services
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def s3_client(
    location: str | None, bucket_policy: str | None = None, missing: str | None = None
) -> tuple[Any, Stubber]:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if missing:
        stub.add_client_error("get_bucket_location", missing, expected_params={"Bucket": LOGS})
    else:
        stub.add_response("get_bucket_location", {"LocationConstraint": location} if location else {}, {"Bucket": LOGS})
        if location not in (None, "us-east-1"):
            pass  # refused on the region: the policy is not read
        elif bucket_policy is None:
            stub.add_client_error("get_bucket_policy", "NoSuchBucketPolicy", expected_params={"Bucket": LOGS})
        else:
            stub.add_response("get_bucket_policy", {"Policy": bucket_policy}, {"Bucket": LOGS})
    stub.activate()
    return client, stub


TLS_CONFIG = {"endpoint_exposure": "internal", "tls_certificate_arn": CERTIFICATE, "access_logs_bucket": LOGS}


def test_preflight_passes_a_bucket_in_the_region_that_admits_both_writers() -> None:
    client, stub = s3_client(None, policy("logging.s3.amazonaws.com", "delivery.logs.amazonaws.com"))  # us-east-1
    name, passed, detail = preflight.check_access_logs_bucket(
        client, DeploymentConfig.create(**TLS_CONFIG), "us-east-1"
    )
    assert (name, passed) == ("Access logs bucket", True)
    assert "logging.s3.amazonaws.com, delivery.logs.amazonaws.com" in detail
    stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("client_args", "message"),
    [
        ((None, None, "NoSuchBucket"), "NoSuchBucket. Fix: create it in us-east-1"),
        (("eu-west-1", policy("logging.s3.amazonaws.com", "delivery.logs.amazonaws.com")), "is in eu-west-1"),
        (("EU", None), "is in eu-west-1"),
        ((None, None), "does not allow logging.s3.amazonaws.com or delivery.logs.amazonaws.com"),
        ((None, policy("logging.s3.amazonaws.com")), "does not allow delivery.logs.amazonaws.com s3:PutObject"),
    ],
)
def test_preflight_refuses_a_bucket_s3_or_elb_could_not_write_to(client_args: tuple[Any, ...], message: str) -> None:
    client, stub = s3_client(*client_args)
    _, passed, detail = preflight.check_access_logs_bucket(client, DeploymentConfig.create(**TLS_CONFIG), "us-east-1")
    assert passed is False and message in detail and "Fix:" in detail
    stub.assert_no_pending_responses()


def test_preflight_asks_only_for_the_writers_the_settings_use() -> None:
    # No TLS: only S3 writes there, so its statement alone is enough.
    client, stub = s3_client(None, policy("logging.s3.amazonaws.com"))
    config = DeploymentConfig.create(access_logs_bucket=LOGS)
    assert preflight.check_access_logs_bucket(client, config, "us-east-1")[1] is True
    stub.assert_no_pending_responses()
