"""The checks platform teams already trust: cdk-nag, cfn-lint and checkov, each shown to fail
on a broken input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks
from support import P5_CLASS, ROOT, broken_template, cfn_lint, new_app, synth_assembly

from eks_pd_serving.config import DeploymentConfig
from stacks.pd_serving_stack import PdServingStack

CHECKOV = Path(os.environ.get("EKS_PD_CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
# cfn-lint warnings accepted, with the reason (README, Security).
ACCEPTED_WARNINGS = {
    # aws-cdk-lib adds DependsOn entries that a Ref or GetAtt already implies (VPC subnets of the
    # cluster, provider Lambda roles); redundant, harmless, and not ours to remove.
    "W3005",
}


@pytest.fixture(scope="module")
def options_template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app with every option that adds AWS resources: the internal endpoint (controller, its
    policy, the NLB Service), autoscaling (Cluster Autoscaler, its policy, node group bounds) and
    the alarms' SNS topic and its key (alarm_email)."""
    return synth_assembly(
        tmp_path_factory.mktemp("cdk.out"),
        endpoint_exposure="internal",
        autoscaling=True,
        alarm_email="ops@example.com",
    )


@pytest.fixture(scope="module")
def p5_template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Multi-card EFA launch templates: prefill on p5.48xlarge (32 EFA), decode on p5en.48xlarge
    (16), autoscaled (the node-template tags advertise them)."""
    return synth_assembly(tmp_path_factory.mktemp("cdk.out"), **P5_CLASS, autoscaling=True)


@pytest.fixture(scope="module")
def block_template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A decode group on a Capacity Block: its end's function, schedules, failed-events queue, alarms."""
    block: dict[str, Any] = {"gpu_layout": "per_phase", "decode_capacity": "capacity-block:cr-0123456789abcdef0",
             "availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1a",
             "alarm_email": "ops@example.com"}  # fmt: skip
    return synth_assembly(tmp_path_factory.mktemp("cdk.out"), **block)


@pytest.fixture(params=["default", "internal+autoscaling+alarm_email", "p5-class"])
def gated(request: pytest.FixtureRequest, template_file: Path) -> Path:
    """Each gate's clean run covers the default, every option at once, and the multi-EFA types."""
    if request.param == "default":
        return template_file
    if request.param == "p5-class":
        return Path(request.getfixturevalue("p5_template_file"))
    return Path(request.getfixturevalue("options_template_file"))


# --- cdk-nag ------------------------------------------------------------------------------
def test_cdk_nag_has_no_unacknowledged_findings(gated: Path) -> None:
    report = json.loads((gated.parent / "validation-report.json").read_text())
    plugins = {plugin["pluginName"]: plugin for plugin in report["pluginReports"]}
    nag = plugins.pop("AwsSolutions")
    assert (nag["conclusion"], nag["violations"]) == ("success", [])
    # With cdk.json's feature flags, construct warnings are reported here too: only our own.
    annotations = plugins.pop("Construct Annotations")
    assert {v["ruleName"] for v in annotations["violations"]} == {"Annotation::eks-pd-serving:config"}
    assert plugins == {}


def test_cdk_nag_fails_synth_on_an_unacknowledged_finding(tmp_path: Path) -> None:
    app = new_app(outdir=str(tmp_path))
    stack = PdServingStack(app, "RayLlmPdServing", config=DeploymentConfig())
    iam.Role(
        stack,
        "Careless",
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AdministratorAccess")],
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    rules = {v["ruleName"] for v in report["pluginReports"][0]["violations"]}
    assert rules == {"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AdministratorAccess]"}


# --- cfn-lint -----------------------------------------------------------------------------
def test_cfn_lint_finds_no_errors_and_only_accepted_warnings(gated: Path) -> None:
    findings = cfn_lint(gated)
    assert [f for f in findings if f["Level"] == "Error"] == []
    assert {f["Rule"]["Id"] for f in findings} <= ACCEPTED_WARNINGS


def test_cfn_lint_catches_a_broken_template(template_file: Path, tmp_path: Path) -> None:
    assert any(f["Level"] == "Error" for f in cfn_lint(broken_template(template_file, tmp_path)))


# --- checkov ------------------------------------------------------------------------------
needs_checkov = pytest.mark.skipif(not CHECKOV.exists(), reason=f"{CHECKOV} missing: make test installs it")


def checkov(template: Path, config: bool = True) -> dict[str, Any]:
    args = [str(CHECKOV), "-f", str(template), "--framework", "cloudformation", "-o", "json", "--quiet"]
    if config:
        args += ["--config-file", str(ROOT / ".checkov.yaml")]
    # Run outside the repository, or checkov picks up .checkov.yaml by itself.
    out = subprocess.run(args, capture_output=True, text=True, check=False, cwd=template.parent)
    result = json.loads(out.stdout)
    return dict(result[0] if isinstance(result, list) else result)


@needs_checkov
def test_checkov_passes_with_the_reviewed_skips(gated: Path) -> None:
    result = checkov(gated)
    failed = [(c["check_id"], c["resource"]) for c in result["results"]["failed_checks"]]
    assert failed == []
    assert result["summary"]["passed"] >= 90
    print(f"checkov: {result['summary']['passed']} passed, {result['summary']['skipped']} skipped")


@needs_checkov
def test_checkov_passes_on_a_capacity_block_template(block_template_file: Path) -> None:
    """The block's end: its function, schedules, failed-events queue (encrypted with SQS's AWS
    managed KMS key: checkov's CKV_AWS_27 refuses SQS-managed SSE) and alarms. (cdk-nag ran in its
    synthesis; cfn-lint on it is tests/template/test_capacity_options.py's.)"""
    result = checkov(block_template_file)
    assert [(c["check_id"], c["resource"]) for c in result["results"]["failed_checks"]] == []


@needs_checkov
def test_checkov_skips_apply_only_to_the_provider_lambdas(template_file: Path) -> None:
    result = checkov(template_file, config=False)
    skipped = {"CKV_AWS_116", "CKV_AWS_115", "CKV_AWS_173"}
    hit = {c["resource"] for c in result["results"]["failed_checks"] if c["check_id"] in skipped}
    # Lambdas of ours and aws-cdk-lib's (kubectl, the capacity check, the default-SG restriction, the
    # weights staging, the model bucket's emptier): none handles data beyond the stack's own calls.
    providers = ("PdServingClusterKubectlProvider", "PdServingGpuCapacityCheck", "CustomVpcRestrictDefaultSG",
                 "PdServingModelWeights", "CustomS3AutoDeleteObjects")  # fmt: skip
    assert hit and all(r.removeprefix("AWS::Lambda::Function.").startswith(providers) for r in hit)
    others = {c["check_id"] for c in result["results"]["failed_checks"]} - skipped
    assert others == set()


@needs_checkov
def test_checkov_catches_an_unencrypted_log_group(template_file: Path, tmp_path: Path) -> None:
    template = json.loads(template_file.read_text())
    group = next(r for r in template["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup")
    del group["Properties"]["KmsKeyId"]
    broken = tmp_path / "broken.template.json"
    broken.write_text(json.dumps(template))
    failed = {c["check_id"] for c in checkov(broken)["results"]["failed_checks"]}
    assert "CKV_AWS_158" in failed


@needs_checkov
def test_checkov_catches_a_gcs_store_without_tls_or_token_or_encryption_at_rest(
    template_file: Path, tmp_path: Path
) -> None:
    """The store is under the gate: checkov's ElastiCache checks (cdk-nag 3.0.2's encryption, AUTH
    and Multi-AZ rules apply to any replication group and pass; its port and backup rules look at
    engine redis only, so a Valkey group's 6379 and absent backups pass by). Its three protections
    removed, checkov fails."""
    template = json.loads(template_file.read_text())
    (store,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::ElastiCache::ReplicationGroup"]
    for key in ("TransitEncryptionEnabled", "TransitEncryptionMode", "AuthToken", "AtRestEncryptionEnabled"):
        del store["Properties"][key]
    broken = tmp_path / "broken.template.json"
    broken.write_text(json.dumps(template))
    failed = {c["check_id"] for c in checkov(broken)["results"]["failed_checks"]}
    assert {"CKV_AWS_29", "CKV_AWS_30", "CKV_AWS_31"} <= failed


# --- a second served model ------------------------------------------------------------------------
@needs_checkov
def test_the_checks_pass_with_a_second_served_model(tmp_path: Path) -> None:
    """served_models adds a staging resource and two applications: cdk-nag (a finding interrupts the
    synth), cfn-lint and checkov hold for that template too."""
    template = synth_assembly(tmp_path, nag=True, served_models=("qwen3-8b=Qwen/Qwen3-8B@main",), gpu_node_count=4)
    findings = cfn_lint(template)
    assert [f for f in findings if f["Level"] == "Error"] == []
    assert {f["Rule"]["Id"] for f in findings} <= ACCEPTED_WARNINGS
    assert [(c["check_id"], c["resource"]) for c in checkov(template)["results"]["failed_checks"]] == []
