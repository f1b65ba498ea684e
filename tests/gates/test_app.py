"""The app as users run it: `cdk synth` offline, bad input as one line, deterministic output."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import aws_cdk as cdk
import pytest
import support
from support import NO_AWS_ENV, ROOT

from eks_pd_serving.config import DeploymentConfig
from stacks.pd_serving_stack import PdServingStack

CDK = ROOT / "node_modules" / ".bin" / "cdk"
ENV = NO_AWS_ENV


def run_app(tmp_path: Path, context: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "out").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        return support.run_app(context, tmp_path / "out")


def test_bad_setting_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    result = run_app(tmp_path, {"gpu_instance_type": "g6.xlarge"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: gpu_instance_type='g6.xlarge': this instance type does not support EFA, which carries "
        "the KV cache. Fix: set gpu_instance_type to a GPU type with EFA, such as g6.8xlarge"
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert list((tmp_path / "out").iterdir()) == []


def test_app_synthesizes_from_context_strings(tmp_path: Path) -> None:
    result = run_app(tmp_path, {"gpu_node_count": "3", "decode_replicas": "2"})
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_path / "out" / "RayLlmPdServing.template.json").read_text())
    node_groups = [r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    assert {ng["Properties"]["ScalingConfig"]["DesiredSize"] for ng in node_groups} == {1, 3}
    # The sizing, then the engine choices in one line (the configured one starred).
    (choices,) = [line for line in result.stderr.splitlines() if line.startswith("engine choices")]
    assert "*bf16, eager 62,557 (15 seqs)" in choices and "fp8, eager 212,247 (51 seqs)" in choices


@pytest.mark.skipif(not CDK.exists(), reason="CDK CLI not installed (npm ci)")
def test_cdk_cli_reports_a_bad_setting_and_fails(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(CDK), "synth", "--quiet", "-o", str(tmp_path / "cdk.out"), "-c", "kubernetes_version=1.30"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "error: kubernetes_version='1.30': EKS no longer creates 1.30 clusters" in result.stderr
    assert "Traceback" not in result.stderr


def _template_text(**settings: object) -> str:
    app = cdk.App()
    PdServingStack(app, "Same", config=DeploymentConfig.create(**settings))
    assembly = app.synth()
    return Path(assembly.get_stack_artifact("Same").template_full_path).read_text()


def test_two_synths_are_byte_identical() -> None:
    assert _template_text() == _template_text()


def test_region_given_pins_the_image_and_commands() -> None:
    text = _template_text(region="eu-west-1")
    assert "763104351884.dkr.ecr.eu-west-1.amazonaws.com/ray:serve-llm-cuda-v1.0" in text
    assert "--region eu-west-1" in text
