"""What AWS decides at run time, held on the template: the defects of issue 36 (G2, G6, G8, the nag
regression for an explicit environment, a region setting the stack does not deploy to)."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import cdk8s
import pytest
from aws_cdk.assertions import Match, Template
from support import FEATURE_FLAGS, build_stack

from eks_pd_serving.config import ConstructError, DeploymentConfig
from eks_pd_serving.k8s import RayServiceChart
from eks_pd_serving.mapping import ray_service_props
from eks_pd_serving.weights.model_weights import CLOUDFORMATION_WAIT, STAGING_TIMEOUT
from stacks.pd_serving_stack import PdServingStack

EXPLICIT = cdk.Environment(account="111122223333", region="eu-west-1")
EU_AZS = "eu-west-1a,eu-west-1b"


def test_the_staging_wait_and_the_job_end_inside_cloudformations_hour(template: Template) -> None:
    """CloudFormation waits for a custom resource at most an hour; the waiter and the job give up
    first, so a failed wait fails the deploy with a reason and leaves no build running."""
    assert STAGING_TIMEOUT.to_seconds() < CLOUDFORMATION_WAIT.to_seconds() == 3600
    template.has_resource_properties("Custom::ModelWeights", {"ServiceTimeout": "3600"})
    template.has_resource_properties(
        "AWS::CodeBuild::Project",
        {"TimeoutInMinutes": STAGING_TIMEOUT.to_minutes(), "Description": Match.string_like_regexp("^Stages")},
    )


def test_the_pods_name_the_region_botocore_reads() -> None:
    """botocore 1.44 reads AWS_DEFAULT_REGION only; Ray's S3 mirror builds its client without one."""
    config = DeploymentConfig.create(region="eu-west-1", availability_zones=EU_AZS)
    props = ray_service_props(config, "image:1", weights_uri="s3://weights/models/m/main")
    (service,) = [
        d for d in cdk8s.Testing.synth(RayServiceChart(cdk8s.App(), "R", props=props)) if d["kind"] == "RayService"
    ]
    spec = service["spec"]["rayClusterConfig"]
    for group in spec["workerGroupSpecs"]:
        env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["AWS_DEFAULT_REGION"] == env["AWS_REGION"] == "eu-west-1", group["groupName"]


def test_a_retained_bucket_keeps_its_tls_only_policy() -> None:
    template = Template.from_stack(build_stack(model_bucket_removal="retain"))
    template.has_resource("AWS::S3::BucketPolicy", {"DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"})
    template.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Retain"})


def test_the_destroyed_bucket_policy_goes_with_its_bucket(template: Template) -> None:
    template.has_resource("AWS::S3::BucketPolicy", {"DeletionPolicy": Match.absent()})


def test_a_region_setting_other_than_the_stacks_is_refused() -> None:
    app = cdk.App(context=FEATURE_FLAGS)
    with pytest.raises(
        ConstructError, match=r"^Other/\w+: region='us-east-1' differs from the stack's own region 'eu-west-1'"
    ) as raised:
        PdServingStack(app, "Other", config=DeploymentConfig.create(region="us-east-1"), env=EXPLICIT)
    assert raised.value.code == "PdServingOtherRegion" and raised.value.setting == "region"


def test_a_stack_with_an_explicit_account_and_region_passes_cdk_nag(tmp_path: Path) -> None:
    """An account-vending pipeline's stack: explicit env, nag's acknowledgments must still match."""
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(context=FEATURE_FLAGS, outdir=str(tmp_path))
    PdServingStack(
        app, "Vended", config=DeploymentConfig.create(region="eu-west-1", availability_zones=EU_AZS), env=EXPLICIT
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    app.synth()  # cdk-nag 3 raises on a finding
    assert (tmp_path / "Vended.template.json").exists()
