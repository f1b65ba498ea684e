"""The configuration model: defaults, context parsing, and one test per rejection rule."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from support import DENSE, P5_CLASS

from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.config.phases import PhaseSettings, phase_settings
from eks_pd_serving.config.settings import Settings
from eks_pd_serving.layout import PHASES
from eks_pd_serving.phase import Phase


def test_defaults_reproduce_the_reference_walkthrough() -> None:
    config = DeploymentConfig()
    assert (config.cluster_name, config.kubernetes_version) == ("ray-llm-multinode", "1.35")
    assert (config.system_instance_type, config.system_node_count) == ("m7i.xlarge", 1)
    assert (config.gpu_instance_type, config.gpu_node_count) == ("g6.8xlarge", 2)
    assert (config.model_id, config.model_source, config.max_model_len) == (
        "qwen3.5-9b",
        "Qwen/Qwen3.5-9B",
        4096,
    )
    assert config.kv_backend == "LIBFABRIC"
    assert config.gpu_root_volume_gib == 200


def test_context_strings_are_parsed_like_typed_values() -> None:
    config = DeploymentConfig.from_context(
        {
            "gpu_node_count": "3",
            "gpu_memory_utilization": "0.85",
            "prefill_enforce_eager": "false",
            "endpoint_allowed_cidrs": "203.0.113.0/24, 198.51.100.7/32",
            "availability_zones": '["us-east-1a", "us-east-1b"]',
            "gpu_availability_zone": "us-east-1b",
            "admin_role_arn": "",
            "kv_backend": "libfabric",
            "gpu_instance_type": "g6.12xlarge",
            "prefill_tensor_parallel_size": "2",
            "decode_tensor_parallel_size": "2",
            "@aws-cdk/core:someFlag": True,
            "aws:cdk:enable-path-metadata": True,
        }
    )
    assert config.gpu_node_count == 3
    assert config.gpu_memory_utilization == 0.85
    assert config.prefill_enforce_eager is False
    assert config.endpoint_allowed_cidrs == ("203.0.113.0/24", "198.51.100.7/32")
    assert config.availability_zones == ("us-east-1a", "us-east-1b")
    assert config.admin_role_arn is None
    assert config.kv_backend == "LIBFABRIC"
    assert (config.prefill_tensor_parallel_size, config.decode_tensor_parallel_size) == (2, 2)


def test_config_is_frozen() -> None:
    config = DeploymentConfig()
    with pytest.raises(Exception, match="frozen"):
        config.gpu_node_count = 5  # type: ignore[misc]


def test_open_endpoint_warns_and_a_narrow_one_does_not() -> None:
    assert any("0.0.0.0/0" in w for w in DeploymentConfig().warnings())
    narrow = DeploymentConfig.create(endpoint_allowed_cidrs="203.0.113.0/24", alarm_email="ops@example.com")
    assert narrow.warnings() == []


def test_alarms_that_notify_nobody_and_keys_in_plain_text_warn() -> None:
    assert any(w.startswith("no alarm_email: ") for w in DeploymentConfig().warnings())
    quiet = DeploymentConfig.create(observability=False)
    assert not any(w.startswith("no alarm_email") for w in quiet.warnings())  # no alarms at all
    plain = DeploymentConfig.create(endpoint_exposure="internal")  # keys on by default with internal
    assert any(w.startswith("endpoint_exposure=internal without tls_certificate_arn") for w in plain.warnings())
    tls = DeploymentConfig.create(
        endpoint_exposure="internal",
        tls_certificate_arn="arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012",
    )
    assert not any("without tls_certificate_arn" in w for w in tls.warnings())


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("wrong type", {"gpu_node_count": "two"}, r"^gpu_node_count='two': .*Fix: set gpu_node_count to"),
    ("count too low", {"gpu_node_count": "0"}, r"^gpu_node_count='0': .*greater than or equal to 1"),
    ("count too high", {"system_node_count": 11}, r"^system_node_count=11: .*Fix"),
    (
        "no GPU",
        {"gpu_instance_type": "m7i.xlarge"},
        r"gpu_instance_type='m7i.xlarge': this instance type has no GPU",
    ),
    ("no EFA", {"gpu_instance_type": "g6.xlarge"}, r"gpu_instance_type='g6.xlarge': .*does not support EFA"),
    (
        "unknown type",
        {"gpu_instance_type": "g6.9xlarge"},
        r"gpu_instance_type='g6.9xlarge': not in the instance catalog",
    ),
    ("small system", {"system_instance_type": "m7i.large"}, r"system_instance_type='m7i.large': .*no room"),
    ("retired k8s", {"kubernetes_version": "1.30"}, r"kubernetes_version='1.30': EKS no longer creates"),
    ("recently retired k8s", {"kubernetes_version": "1.31"}, r"extended support ended 2026-11-26"),
    (
        "unknown k8s",
        {"kubernetes_version": "1.37"},
        r"kubernetes_version='1.37': aws-cdk-lib 2.275.0 .* 1.32 to 1.36",
    ),
    ("eks name", {"cluster_name": "-bad name"}, r"cluster_name='-bad name': EKS rejects"),
    ("namespace", {"namespace": "Inference"}, r"namespace='Inference': Kubernetes rejects"),
    ("service name", {"ray_service_name": "1llm"}, r"ray_service_name='1llm': Kubernetes would reject"),
    ("long service name", {"ray_service_name": "a" * 41}, r"ray_service_name="),
    (
        "cidr",
        {"endpoint_allowed_cidrs": "10.0.0.1/8"},
        r"endpoint_allowed_cidrs='10.0.0.1/8': .*not an IPv4 network",
    ),
    ("ipv6 cidr", {"endpoint_allowed_cidrs": "2001:db8::/32"}, r"is IPv6"),
    ("bad AZ", {"gpu_availability_zone": "us-east-1"}, r"gpu_availability_zone='us-east-1': not an AZ name"),
    (
        "gpu AZ alone",
        {"gpu_availability_zone": "us-east-1c"},
        r"gpu_availability_zone='us-east-1c' needs availability_zones too",
    ),
    (
        "gpu AZ outside VPC AZs",
        {"availability_zones": "us-east-1a,us-east-1b", "gpu_availability_zone": "us-east-1c"},
        r"gpu_availability_zone='us-east-1c' is not one of availability_zones",
    ),
    (
        "AZ outside region",
        {"region": "eu-west-1", "availability_zones": "us-east-1a,us-east-1b"},
        r"availability_zones='us-east-1a,us-east-1b' are not in region='eu-west-1'",
    ),
    (
        "gpu AZ outside region",
        {"region": "eu-west-1", "gpu_availability_zone": "us-east-1a"},
        r"gpu_availability_zone='us-east-1a' is not in region='eu-west-1'",
    ),
    ("one AZ", {"availability_zones": "us-east-1a"}, r"at least two AZs"),
    ("AZs of two regions", {"availability_zones": "us-east-1a,us-west-2a"}, r"more than one region"),
    ("nat per AZ", {"nat_gateways": 3}, r"nat_gateways=3 exceeds the 2 AZs"),
    ("region", {"region": "mars-1"}, r"region='mars-1': not a region name"),
    ("role arn", {"admin_role_arn": "admin"}, r"admin_role_arn='admin': not an IAM role ARN"),
    (
        "kv backend",
        {"kv_backend": "TCP"},
        r"kv_backend='TCP': NIXL has no such network backend. Fix: .*LIBFABRIC, UCX",
    ),
    ("buffer device", {"kv_buffer_device": "disk"}, r"kv_buffer_device='disk'"),
    ("dtype", {"dtype": "int4"}, r"dtype='int4'"),
    ("memory fraction", {"gpu_memory_utilization": "1.5"}, r"gpu_memory_utilization='1.5'"),
    ("tp value", {"prefill_tensor_parallel_size": 3}, r"prefill_tensor_parallel_size=3: vLLM splits attention heads"),
    (
        "tp beyond node",
        {"decode_tensor_parallel_size": 2},
        r"decode_tensor_parallel_size=2 exceeds the 1 GPU",
    ),
    (
        "too many GPUs",
        {"decode_replicas": 2},
        r"needs 3 GPUs, but gpu_node_count=2 x g6.8xlarge has 2. Fix: raise gpu_node_count to 3",
    ),
    (
        "hybrid tp mismatch",
        {"gpu_instance_type": "g6.12xlarge", "prefill_tensor_parallel_size": 2},
        r"prefill_tensor_parallel_size=2 and decode_tensor_parallel_size=1 differ.*hybrid",
    ),
    (
        "replicated prefill KV into fewer decode ranks",
        {
            "gpu_layout": "per_phase",
            "prefill_gpu_instance_type": "p5.48xlarge",
            "decode_gpu_instance_type": "p5.48xlarge",
            "model_source": "Qwen/Qwen3-30B-A3B",
            "max_model_len": 32768,
            "prefill_tensor_parallel_size": 8,
            "decode_tensor_parallel_size": 4,
        },
        r"prefill_tensor_parallel_size=8 exceeds decode_tensor_parallel_size=4 and the 4 KV heads of "
        r"Qwen/Qwen3-30B-A3B.*Fix: set decode_tensor_parallel_size to 8, or prefill_tensor_parallel_size to at most 4",
    ),
    (
        "sliding-window model config",
        {"model_source": "my-org/swa", "model_config_json": "tests/fixtures/models/sliding-window-config.json"},
        r"model_config_json=.*sliding-window attention\) are not sized yet",
    ),
    (
        "model max length",
        {"max_model_len": 300000},
        r"max_model_len=300000 exceeds Qwen/Qwen3.5-9B's own maximum",
    ),
    (
        "a body bound below max_model_len's need",
        {"max_request_body_mib": 4},
        r"max_request_body_mib=4 cannot hold a prompt of max_model_len=4096 tokens as JSON \(7.0 MiB\). Fix: set "
        r"max_request_body_mib to 7 or more, or lower max_model_len",
    ),
    (
        "spaces in model id",
        {"model_id": "qwen 9b"},
        r"model_id='qwen 9b': must be non-empty and without spaces",
    ),
]


@pytest.mark.parametrize(("settings", "message"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_bad_setting_is_rejected_with_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        DeploymentConfig.from_context(settings)
    assert "\n" not in str(caught.value)


def test_unknown_context_key_is_rejected_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting gpu_node_cont='3'. Fix: did you mean gpu_node_count\?"):
        DeploymentConfig.from_context({"gpu_node_cont": "3"})


def test_a_model_outside_the_catalogue_is_refused_without_its_config() -> None:
    with pytest.raises(ConfigError, match=r"^model_source='my-org/dense' is not in the model catalogue .*"
                                          r"Fix: set model_config_json"):  # fmt: skip
        DeploymentConfig.create(model_source="my-org/dense")


def test_a_model_config_json_sizes_the_model_and_caps_max_model_len(tmp_path: Path) -> None:
    sizing = DeploymentConfig.create(**DENSE).sizing(Phase.DECODE)
    assert sizing is not None and sizing.block_tokens == 16 and sizing.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    with pytest.raises(ConfigError, match=r"max_model_len=65536 exceeds my-org/dense's own maximum of 32768"):
        DeploymentConfig.create(**DENSE, max_model_len=65536)
    with pytest.raises(ConfigError, match=r"^model_config_json='.*nowhere.json' cannot be read .*Fix:"):
        DeploymentConfig.create(model_source="my-org/dense", model_config_json=str(tmp_path / "nowhere.json"))
    (tmp_path / "bad.json").write_text('{"hidden_size": 4096}')
    with pytest.raises(ConfigError, match=r"is not a model config.json sizing can read \(KeyError"):
        DeploymentConfig.create(model_source="my-org/dense", model_config_json=str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("model", "prefill_tp", "decode_tp"),
    [("meta-llama/Llama-3.1-70B-Instruct", 4, 8), ("meta-llama/Llama-3.1-70B-Instruct", 8, 4),
     ("Qwen/Qwen3-30B-A3B", 4, 8), ("Qwen/Qwen3-30B-A3B", 4, 2)],
)  # fmt: skip
def test_dense_and_moe_models_may_differ_in_tensor_parallel_size(model: str, prefill_tp: int, decode_tp: int) -> None:
    """The matrix allows heterogeneous TP for dense and MoE models; prefill TP above decode's only
    while prefill does not replicate KV heads (Llama-70B has 8, Qwen3-30B-A3B 4)."""
    config = DeploymentConfig.create(
        gpu_layout="per_phase", prefill_gpu_instance_type="p5.48xlarge", decode_gpu_instance_type="p5.48xlarge",
        model_source=model, max_model_len=32768, prefill_tensor_parallel_size=prefill_tp,
        decode_tensor_parallel_size=decode_tp, gpu_root_volume_gib=350, hf_token_secret="hf/token",
    )  # fmt: skip
    assert (config.prefill_tensor_parallel_size, config.decode_tensor_parallel_size) == (prefill_tp, decode_tp)


def test_a_gpu_type_the_efa_plugin_does_not_run_on_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GPU type of the catalogue with EFA is in the pinned plugin chart's list; one that is not
    would never get EFA advertised, so its workers would stay Pending."""
    from eks_pd_serving.catalog import INSTANCE_TYPES, efa_plugin_instance_types
    from eks_pd_serving.config import fields

    assert {n for n, f in INSTANCE_TYPES.items() if f.efa_supported} <= efa_plugin_instance_types()
    monkeypatch.setattr(fields, "efa_plugin_instance_types", lambda: frozenset({"g6e.8xlarge"}))
    with pytest.raises(ConfigError, match=r"gpu_instance_type='g6.8xlarge': the EFA device plugin \(chart v0.5.30\)"):
        DeploymentConfig.create(gpu_instance_type="g6.8xlarge")


def test_other_models_skip_the_hybrid_rule() -> None:
    config = DeploymentConfig.create(
        **DENSE,
        gpu_instance_type="g6.12xlarge",
        prefill_tensor_parallel_size=2,
    )
    assert config.gpus_wanted == 3


def test_multimodal_pd_is_warned_about_as_unverified_upstream() -> None:
    """vLLM 0.26's NIXL compatibility matrix marks multimodal models under PD as not yet verified."""
    assert not [w for w in DeploymentConfig.create().warnings() if w.startswith("multimodal=true")]
    warned = [w for w in DeploymentConfig.create(multimodal=True).warnings() if w.startswith("multimodal=true")]
    assert len(warned) == 1 and "not yet verified upstream" in warned[0]


# --- the GPU nodes' disk and gated models (G7) ----------------------------------------------------

LLAMA_70B = {**P5_CLASS, "gpu_root_volume_gib": 200}


def test_the_root_volume_needed_is_the_image_the_checkpoint_and_kubelets_margin_by_hand() -> None:
    from eks_pd_serving import sizing
    from eks_pd_serving.catalog import MODELS

    llama = MODELS["meta-llama/Llama-3.1-70B-Instruct"]
    # 70.55e9 bf16 weights: 141.1 GB, 131.4 GiB; (40 + 10 + 131.4) / 0.9 = 201.6.
    assert sizing.checkpoint_bytes(llama) == int(llama.params * 2)
    assert (sizing.root_volume_needed_gib(llama), sizing.root_volume_needed_gib(llama, copies=2)) == (202, 348)
    # The FP8 checkpoint stores its Linear and expert weights in one byte each.
    fp8, bf16 = MODELS["Qwen/Qwen3-30B-A3B-FP8"], MODELS["Qwen/Qwen3-30B-A3B"]
    assert sizing.checkpoint_bytes(fp8) < 0.55 * sizing.checkpoint_bytes(bf16)


def test_a_root_volume_the_checkpoint_does_not_fit_is_refused_with_the_size_that_does() -> None:
    line = r"^gpu_root_volume_gib=200 cannot hold meta-llama/Llama-3.1-70B-Instruct's checkpoint \(131 GiB"
    with pytest.raises(ConfigError, match=line + r".*Fix: set gpu_root_volume_gib to at least 202 \(348 also"):
        DeploymentConfig.create(**LLAMA_70B)
    # The default model fits the default volume twice over, so nothing is said.
    assert not [w for w in DeploymentConfig.create().warnings() if "gpu_root_volume_gib" in w]


def test_a_root_volume_with_room_for_one_checkpoint_warns_about_a_revision_change() -> None:
    (warning,) = [w for w in DeploymentConfig.create(**{**LLAMA_70B, "gpu_root_volume_gib": 202}).warnings()
                  if "gpu_root_volume_gib" in w]  # fmt: skip
    assert "download the new revision beside the old one" in warning and "gpu_root_volume_gib=348" in warning
    assert not [w for w in DeploymentConfig.create(**P5_CLASS).warnings() if "gpu_root_volume_gib" in w]


@pytest.mark.parametrize(
    ("settings", "fix"),
    [({}, "Fix: set hf_token_secret"), ({"weights_source": "huggingface"}, "Fix: set weights_source=s3 and hf_token")],
)
def test_a_gated_model_without_a_token_is_refused(settings: dict[str, str], fix: str) -> None:
    without = {k: v for k, v in P5_CLASS.items() if k != "hf_token_secret"}
    with pytest.raises(ConfigError, match=rf"model_source='meta-llama/Llama-3.1-70B-Instruct' is gated.*{fix}"):
        DeploymentConfig.create(**without, **settings)
    with pytest.raises(ConfigError, match="is gated"):
        DeploymentConfig.create(**P5_CLASS, weights_source="huggingface")


def test_each_phase_field_is_the_setting_of_that_name_and_type() -> None:
    """``phase_settings`` builds ``<phase>_<field>`` names: each must be a setting of the field's type."""
    settings_types = typing.get_type_hints(Settings)
    phase_types = typing.get_type_hints(PhaseSettings)
    config = DeploymentConfig()
    for phase in PHASES:
        for field in dataclasses.fields(PhaseSettings):
            if field.name == "phase":
                continue
            name = f"{phase}_{field.name}"
            assert settings_types.get(name) == phase_types[field.name], name
            assert getattr(phase_settings(config, phase), field.name) == getattr(config, name)
    with pytest.raises(ValueError, match="'both' is not a valid Phase"):
        phase_settings(config, "both")  # type: ignore[arg-type]  # text read back: Phase() refuses it


def test_the_proxies_body_bound_follows_max_model_len_by_powers_of_two() -> None:
    """Most max_model_len changes leave the bound (and so every pod) as it is; a set value is kept."""
    from eks_pd_serving.config import derived

    bounds = {n: derived.request_body_mib(DeploymentConfig.create(max_model_len=n)) for n in (512, 4096, 10240, 10241)}
    assert bounds == {512: 16, 4096: 16, 10240: 16, 10241: 32}
    assert derived.request_body_mib(DeploymentConfig.create(max_request_body_mib=9)) == 9
