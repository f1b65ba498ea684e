"""Field-level rules: what makes one setting's value wrong, whatever the others say. Each
rule raises ValueError with what is wrong; model.py turns it into the one-line ConfigError."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from typing import Any

from pydantic import BaseModel, field_validator

from .. import layout, versions
from ..catalog import INSTANCE_TYPES, LOG_RETENTION_DAYS, InstanceFacts, efa_plugin_instance_types
from .served_models import ModelChoice

EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
AZ = re.compile(r"^([a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d)[a-z]$")
# A Hugging Face revision: a commit hash, branch or tag (refs/pr/N included).
HF_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")
# A Secrets Manager secret name or ARN (names: letters, digits and /_+=.@-).
SECRET = re.compile(r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?[\w/+=.@-]{1,512}$")
# Hugging Face user access tokens start with hf_ (then 34 letters).
HF_TOKEN = re.compile(r"^hf_[A-Za-z0-9]{20,}$")
# A secret's complete ARN ends in '-' and the six characters Secrets Manager adds to its name.
SECRET_COMPLETE_ARN = re.compile(
    r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[\w/+=.@-]{1,512}-[A-Za-z0-9]{6}$"
)
CERTIFICATE_ARN = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")
# S3's general purpose bucket naming rules (no "..", no IP-address form, no reserved prefix or suffix).
BUCKET_NAME = re.compile(
    r"^(?!xn--|sthree-|amzn-s3-demo-)(?!.*\.\.)(?!\d+\.\d+\.\d+\.\d+$)(?!.*(-s3alias|--ol-s3|--x-s3|\.mrap)$)"
    r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
)
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
NIXL_NETWORK_BACKENDS = ("LIBFABRIC", "UCX")


def _ipv4_networks(cidrs: tuple[str, ...], why_ipv4: str) -> None:
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise ValueError(f"{cidr!r} is not an IPv4 network in CIDR form") from None
        if network.version != 4:
            raise ValueError(f"{cidr!r} is IPv6; {why_ipv4}")


class FieldRules(BaseModel):
    """The validators, one per kind of value; DeploymentConfig inherits them with the fields."""

    @field_validator(
        "availability_zones",
        "endpoint_allowed_cidrs",
        "endpoint_client_cidrs",
        "served_models",
        mode="before",
        check_fields=False,
    )
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        """Context strings arrive as 'a,b' or a JSON list."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator(
        "region",
        "gpu_availability_zone",
        "admin_role_arn",
        "hf_token_secret",
        "api_keys",
        "api_keys_secret_arn",
        "tls_certificate_arn",
        "access_logs_bucket",
        "prefill_capacity",
        "decode_capacity",
        "image",
        "prefill_gpu_instance_type",
        "prefill_gpu_node_count",
        "decode_gpu_instance_type",
        "decode_gpu_node_count",
        "prefill_min_replicas",
        "prefill_max_replicas",
        "decode_min_replicas",
        "decode_max_replicas",
        "prefill_target_ongoing_requests",
        "decode_target_ongoing_requests",
        "gpu_min_node_count",
        "gpu_max_node_count",
        "prefill_gpu_min_node_count",
        "prefill_gpu_max_node_count",
        "decode_gpu_min_node_count",
        "decode_gpu_max_node_count",
        mode="before",
        check_fields=False,
    )
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("served_models", check_fields=False)
    @classmethod
    def _served_models(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Each entry parses (``ModelChoice``); kept as written, so the settings round-trip."""
        for entry in value:
            ModelChoice.parse(entry)
        return value

    @field_validator("cluster_name", check_fields=False)
    @classmethod
    def _eks_name(cls, value: str) -> str:
        if not EKS_NAME.match(value):
            raise ValueError("EKS rejects this cluster name")
        return value

    @field_validator("kubernetes_version", check_fields=False)
    @classmethod
    def _kubernetes_version(cls, value: str) -> str:
        if value in versions.KUBERNETES_RELEASES:
            return value
        if value in versions.RETIRED_KUBERNETES_VERSIONS:
            ended = versions.RETIRED_KUBERNETES_VERSIONS[value]
            raise ValueError(f"EKS no longer creates {value} clusters (extended support ended {ended})")
        raise ValueError(
            f"aws-cdk-lib {versions.AWS_CDK_LIB_VERSION} with this project supports "
            f"{min(versions.KUBERNETES_RELEASES)} to {max(versions.KUBERNETES_RELEASES)}"
        )

    @field_validator("region", check_fields=False)
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not REGION.match(value):
            raise ValueError("not a region name")
        return value

    @field_validator("availability_zones", check_fields=False)
    @classmethod
    def _azs(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        bad = [az for az in value if not AZ.match(az)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an AZ name")
        if len(value) < 2:
            raise ValueError("EKS needs subnets in at least two AZs")
        if len(set(value)) != len(value):
            raise ValueError("an AZ is listed twice")
        regions = {az_region(az) for az in value}
        if len(regions) > 1:
            raise ValueError(f"AZs from more than one region ({', '.join(sorted(regions))})")
        return value

    @field_validator("gpu_availability_zone", check_fields=False)
    @classmethod
    def _gpu_az(cls, value: str | None) -> str | None:
        if value is not None and not AZ.match(value):
            raise ValueError("not an AZ name")
        return value

    @field_validator("endpoint_allowed_cidrs", check_fields=False)
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _ipv4_networks(value, "the EKS public endpoint allow-list is IPv4")
        if len(value) > 40:
            raise ValueError("EKS accepts at most 40 public access CIDRs")
        return value

    @field_validator("endpoint_client_cidrs", check_fields=False)
    @classmethod
    def _client_cidrs(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        _ipv4_networks(value or (), "the internal endpoint is IPv4")
        return value

    @field_validator("model_revision", check_fields=False)
    @classmethod
    def _revision(cls, value: str) -> str:
        if not HF_REVISION.match(value):
            raise ValueError("not a Hugging Face revision (a commit hash, branch or tag)")
        return value

    @field_validator("hf_token_secret", check_fields=False)
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and HF_TOKEN.match(value):
            # Refused without echoing it: the value would otherwise land in the template.
            raise ValueError("this looks like a Hugging Face token itself, not the name of the secret holding it")
        if value is not None and not SECRET.match(value):
            raise ValueError("not a Secrets Manager secret name or ARN")
        return value

    @field_validator("api_keys_secret_arn", check_fields=False)
    @classmethod
    def _keys_secret(cls, value: str | None) -> str | None:
        if value is not None and not SECRET_COMPLETE_ARN.match(value):
            # A name or partial ARN would widen the pods' access to every secret it prefixes.
            raise ValueError("not a secret's complete ARN (with the 6-character suffix)")
        return value

    @field_validator("tls_certificate_arn", check_fields=False)
    @classmethod
    def _certificate(cls, value: str | None) -> str | None:
        if value is not None and not CERTIFICATE_ARN.match(value):
            raise ValueError("not an ACM certificate ARN")
        return value

    @field_validator("gpu_capacity", "prefill_capacity", "decode_capacity", check_fields=False)
    @classmethod
    def _capacity(cls, value: str | None) -> str | None:
        return None if value is None else str(layout.parse_capacity(value))

    @field_validator("ray_upgrade_strategy", mode="before", check_fields=False)
    @classmethod
    def _former_strategy_name(cls, value: Any) -> Any:
        """``None`` (KubeRay's name) was this setting's default before ``recreate``: it means manual."""
        return "manual" if value == "None" else value

    @field_validator("access_logs_bucket", check_fields=False)
    @classmethod
    def _bucket_name(cls, value: str | None) -> str | None:
        if value is not None and not BUCKET_NAME.match(value):
            raise ValueError("not an S3 bucket name (a name, not an ARN or s3:// URL)")
        return value

    @field_validator("admin_role_arn", check_fields=False)
    @classmethod
    def _role_arn(cls, value: str | None) -> str | None:
        if value is not None and not ROLE_ARN.match(value):
            raise ValueError("not an IAM role ARN")
        return value

    @field_validator("log_retention_days", check_fields=False)
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError("CloudWatch Logs does not offer this retention period")
        return value

    @field_validator("system_instance_type", check_fields=False)
    @classmethod
    def _system_type(cls, value: str) -> str:
        facts = known_instance(value)
        if facts.vcpus < 4 or facts.memory_gib < 16:
            raise ValueError(
                f"{facts.vcpus} vCPUs and {facts.memory_gib} GiB leave no room for the Ray head "
                "(2 vCPUs, 8 GiB) beside the operator"
            )
        return value

    @field_validator("gpu_instance_type", "prefill_gpu_instance_type", "decode_gpu_instance_type", check_fields=False)
    @classmethod
    def _gpu_type(cls, value: str | None) -> str | None:
        if value is None:
            return None
        facts = known_instance(value)
        if facts.gpus == 0:
            raise ValueError("this instance type has no GPU")
        if not facts.efa_supported:
            raise ValueError("this instance type does not support EFA, which carries the KV cache")
        if value not in efa_plugin_instance_types():
            raise ValueError(
                f"the EFA device plugin (chart {versions.EFA_DEVICE_PLUGIN_CHART.version}) does not run on this type "
                "(its supportedInstanceLabels), so no EFA would be advertised and the Ray workers would stay Pending"
            )
        return value

    @field_validator("namespace", check_fields=False)
    @classmethod
    def _namespace(cls, value: str) -> str:
        if len(value) > 63 or not DNS1123_LABEL.match(value):
            raise ValueError("Kubernetes rejects this namespace name")
        return value

    @field_validator("ray_service_name", check_fields=False)
    @classmethod
    def _service_name(cls, value: str) -> str:
        # KubeRay derives Service names (<name>-serve-svc, <name>-head-svc) and a RayCluster
        # name with a suffix from it; Services must be DNS-1035 labels of at most 63 characters.
        if len(value) > 40 or not DNS1035_LABEL.match(value):
            raise ValueError("Kubernetes would reject the Services KubeRay derives from this name")
        return value

    @field_validator("image", "model_id", "model_source", check_fields=False)
    @classmethod
    def _no_spaces(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError("must be non-empty and without spaces")
        return value

    @field_validator("prefill_tensor_parallel_size", "decode_tensor_parallel_size", check_fields=False)
    @classmethod
    def _tensor_parallel(cls, value: int) -> int:
        if value not in (1, 2, 4, 8):
            raise ValueError("vLLM splits attention heads evenly: 1, 2, 4 or 8 GPUs")
        return value

    @field_validator("kv_backend", mode="before", check_fields=False)
    @classmethod
    def _kv_backend(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() in NIXL_NETWORK_BACKENDS:
            return value.upper()
        raise ValueError("NIXL has no such network backend")


def az_region(az: str) -> str:
    match = AZ.match(az)
    return match.group(1) if match else az[:-1]


def known_instance(value: str) -> InstanceFacts:
    if value not in INSTANCE_TYPES:
        close = difflib.get_close_matches(value, INSTANCE_TYPES, n=1)
        near = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"not in the instance catalog{near}; add it to catalog/instances.py with its EC2 facts")
    return INSTANCE_TYPES[value]
