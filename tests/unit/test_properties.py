"""Property-based bad input: every generated configuration either synthesizes a template that
passes the structural checks, or fails with the project's one-line error naming a setting;
never another exception, never a partial cdk.out. Derandomized: CI sees the same cases every
run, so a failure reproduces; widen max_examples locally to explore further."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import broken_template, cfn_lint, run_app

from eks_pd_serving.config import ConfigError, DeploymentConfig

_MESSAGE = re.compile(r"^(unknown setting )?(?P<key>[a-z_]+)=")


# Each setting: (values a user might reasonably give, values that are wrong).
_ok_count = st.integers(min_value=1, max_value=4)
_bad_count = st.integers(min_value=-2, max_value=0) | st.integers(min_value=17, max_value=50)
SETTINGS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "cluster_name": (st.sampled_from(["ray-llm", "team_a-1"]), st.sampled_from(["", "-x", "a b", "x" * 101])),
    "kubernetes_version": (
        st.sampled_from(["1.32", "1.33", "1.34", "1.35", "1.36"]),
        st.sampled_from(["1.29", "1.30", "1.31", "1.37", "1.3x", ""]),
    ),
    "region": (st.sampled_from([None, "us-east-1"]), st.sampled_from(["mars", "eu-west-1"])),
    "availability_zones": (
        st.sampled_from([None, "us-east-1a,us-east-1b", '["us-east-1a","us-east-1c"]']),
        st.sampled_from(["us-east-1a", "us-east-1a,eu-west-1b", "x,y", "[1"]),
    ),
    "gpu_availability_zone": (
        st.sampled_from([None, "us-east-1a"]),
        st.sampled_from(["us-east-1d", "eu-west-1a", "us-east-1"]),
    ),
    "nat_gateways": (st.sampled_from([1, 2]), _bad_count),
    "endpoint_allowed_cidrs": (
        st.sampled_from(["0.0.0.0/0", "203.0.113.0/24", "203.0.113.0/24,198.51.100.7/32"]),
        st.sampled_from(["10.0.0.1/8", "::/0", "nope", ""]),
    ),
    "admin_role_arn": (
        st.sampled_from([None, "arn:aws:iam::123456789012:role/Admin"]),
        st.sampled_from(["admin"]),
    ),
    "system_instance_type": (
        st.sampled_from(["m7i.xlarge", "m6i.2xlarge"]),
        st.sampled_from(["m7i.large", "g6.xlarge", "t3.nano", ""]),
    ),
    "system_node_count": (_ok_count, _bad_count),
    "system_root_volume_gib": (st.sampled_from([80, 100, "250"]), st.sampled_from([0, 20, 79, "big", 20000])),
    "log_retention_days": (st.sampled_from([1, 30, "365", 3653]), st.sampled_from([0, 2, 10, "month", 4000])),
    "ray_upgrade_strategy": (st.sampled_from(["None", "NewCluster"]), st.sampled_from(["none", "Recreate", ""])),
    "endpoint_exposure": (st.sampled_from(["port-forward", "internal"]), st.sampled_from(["public", "Internal", ""])),
    # Valid CIDRs clash with the default exposure (a cross-setting rule): tests/template/test_endpoint.py has them.
    "endpoint_client_cidrs": (st.just(None), st.sampled_from(["10.0.0.0/33", "fd00::/8", "vpc"])),
    "gpu_instance_type": (
        st.sampled_from(["g6.8xlarge", "g6.12xlarge", "g6e.24xlarge"]),
        st.sampled_from(["g6.xlarge", "m7i.xlarge", "p9.mega"]),
    ),
    "gpu_node_count": (_ok_count, _bad_count),
    "gpu_root_volume_gib": (
        st.integers(min_value=100, max_value=2000),
        st.integers(min_value=-5, max_value=99),
    ),
    "namespace": (st.sampled_from(["inference", "llm-2"]), st.sampled_from(["Inference", "a" * 64, ""])),
    "ray_service_name": (st.sampled_from(["ray-llm", "qwen"]), st.sampled_from(["1llm", "a" * 41, "a_b"])),
    "image": (st.sampled_from([None, "registry.example:5000/ray:2.58.0"]), st.sampled_from(["a b", ""])),
    "model_id": (st.sampled_from(["qwen3.5-9b", "m"]), st.sampled_from(["with space"])),
    "model_source": (st.sampled_from(["Qwen/Qwen3.5-9B", "org/dense"]), st.sampled_from(["bad source"])),
    "max_model_len": (
        st.integers(min_value=16, max_value=32768),
        st.integers(min_value=-1, max_value=15) | st.integers(min_value=262145, max_value=10**6),
    ),
    "dtype": (st.sampled_from(["bfloat16", "float16", "auto"]), st.sampled_from(["int4", ""])),
    "gpu_memory_utilization": (
        st.floats(min_value=0.05, max_value=0.98),
        st.floats(min_value=0.99, max_value=3) | st.floats(max_value=0),
    ),
    "prefill_enforce_eager": (st.sampled_from([True, False, "true", "false"]), st.sampled_from(["maybe"])),
    "decode_enforce_eager": (st.sampled_from([True, False, "yes", "0"]), st.sampled_from(["sometimes"])),
    "prefill_replicas": (st.sampled_from([1, 2]), st.integers(min_value=-3, max_value=0)),
    "decode_replicas": (st.sampled_from([1, 2]), st.integers(min_value=-3, max_value=0)),
    "prefill_tensor_parallel_size": (st.sampled_from([1, 2, 4]), st.sampled_from([3, 16])),
    "decode_tensor_parallel_size": (st.sampled_from([1, 2, 4]), st.sampled_from([0, 5])),
    "kv_backend": (st.sampled_from(["LIBFABRIC", "UCX", "ucx"]), st.sampled_from(["TCP", ""])),
    "kv_buffer_device": (st.sampled_from(["cuda", "cpu"]), st.sampled_from(["disk"])),
    "gpu_node_cont": (st.nothing(), st.just("3")),  # a typo of a real key
}


@st.composite
def configurations(draw: st.DrawFn, plausible_percent: int = 50) -> dict[str, Any]:
    """Some settings, typed as props would be or stringified as `-c key=value` delivers them.
    ``plausible_percent`` of the cases draw only plausible values (which may still clash with
    each other); the others mix in wrong ones."""
    plausible = draw(st.integers(min_value=0, max_value=99)) < plausible_percent
    options = {
        k: valid if plausible else (valid | invalid)
        for k, (valid, invalid) in SETTINGS.items()
        if not (plausible and valid.is_empty)
    }
    chosen = draw(st.fixed_dictionaries({}, optional=options))
    as_context = draw(st.booleans())
    context = {k: (str(v) if as_context and v is not None and not isinstance(v, str) else v) for k, v in chosen.items()}
    return {**context, "_plausible": plausible}


def outcome(context: dict[str, Any]) -> tuple[DeploymentConfig | None, str | None]:
    """The config model's verdict; any exception but ConfigError propagates and fails the test.
    A value drawn from a setting's plausible values must never be rejected on its own (only in
    combination with others)."""
    try:
        return DeploymentConfig.from_context(context), None
    except ConfigError as error:
        if error.setting in context and context.get("_plausible"):
            raise AssertionError(f"plausible {error.setting}={context[error.setting]!r} rejected: {error}") from None
        return None, str(error)


def assert_good_error(message: str) -> None:
    assert "\n" not in message
    match = _MESSAGE.match(message)
    assert match, message
    assert match["key"] in DeploymentConfig.model_fields or message.startswith("unknown setting"), message
    assert "Fix: " in message, message


COUNTS = {"model": 0, "model_valid": 0, "synth": 0, "synth_valid": 0}


def test_config_model_on_a_thousand_generated_cases() -> None:
    @settings(
        max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
    )
    @given(configurations())
    def check(context: dict[str, Any]) -> None:
        config, message = outcome(context)
        COUNTS["model"] += 1
        if config is None:
            assert message is not None
            assert_good_error(message)
        else:
            COUNTS["model_valid"] += 1
            for group in config.gpu_groups:
                assert sum(config.gpus_for(p) for p in group.phases) <= group.instance.gpus * group.node_count

    check()
    print(f"\nconfig model: {COUNTS['model']} generated cases, {COUNTS['model_valid']} valid")
    assert COUNTS["model"] >= 1000
    assert 0 < COUNTS["model_valid"] < COUNTS["model"]


def check_template(template_file: Path, config: DeploymentConfig) -> None:
    template = json.loads(template_file.read_text())
    assert template_file.stat().st_size < 800_000 and len(template["Resources"]) < 400
    text = json.dumps(template)
    assert ("LoadBalancer" in text) is (config.endpoint_exposure == "internal")
    node_groups = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    assert sorted(ng["ScalingConfig"]["DesiredSize"] for ng in node_groups) == sorted(
        [config.system_node_count, config.gpu_node_count]
    )
    (cluster,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Cluster"]
    assert cluster["Version"] == config.kubernetes_version


def test_app_end_to_end_on_a_sample_of_generated_cases(tmp_path: Path) -> None:
    synthesized: list[Path] = []

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
    @given(configurations(plausible_percent=80))
    def check(context: dict[str, Any]) -> None:
        config, message = outcome(context)
        with tempfile.TemporaryDirectory() as tmp:
            outdir = Path(tmp)
            result = run_app({k: v for k, v in context.items() if k != "_plausible"}, outdir)
            COUNTS["synth"] += 1
            assert "Traceback" not in result.stderr
            if config is None:
                assert result.returncode == 2
                assert result.stderr.strip().splitlines() == [f"error: {message}"]
                assert list(outdir.iterdir()) == [], "a rejected config left files in cdk.out"
            else:
                COUNTS["synth_valid"] += 1
                assert result.returncode == 0, result.stderr[-2000:]
                template_file = outdir / "RayLlmPdServing.template.json"
                check_template(template_file, config)
                kept = tmp_path / f"case{COUNTS['synth']}.template.json"
                kept.write_bytes(template_file.read_bytes())
                synthesized.append(kept)

    check()
    print(f"\nend to end: {COUNTS['synth']} generated cases through app.py, {COUNTS['synth_valid']} synthesized")
    assert COUNTS["synth"] >= 8 and synthesized
    assert [f for f in cfn_lint(*synthesized) if f["Level"] == "Error"] == []


def test_the_batched_lint_reports_a_broken_template_among_good_ones(template_file: Path, tmp_path: Path) -> None:
    broken = broken_template(template_file, tmp_path)
    assert [f for f in cfn_lint(template_file) if f["Level"] == "Error"] == []
    assert [f["Filename"] for f in cfn_lint(template_file, broken) if f["Level"] == "Error"] == [str(broken)]
