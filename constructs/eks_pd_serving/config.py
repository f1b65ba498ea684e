"""The one configuration model: parsed once, validated before any construct is built.

``DeploymentConfig.from_context`` reads the flat keys of ``cdk.json`` context (values from
``cdk synth -c key=value`` arrive as strings); an account-vending pipeline builds the same model
directly with typed values. Either way a bad value raises ``ConfigError`` whose message is one
line naming the setting, the value and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import versions
from .catalog import INSTANCE_TYPES, LOG_RETENTION_DAYS, MODELS, InstanceFacts, ModelFacts
from .layout import PHASES, GpuGroup
from .sizing import Sizing, size


class ConfigError(ValueError):
    """A setting (or a combination of settings) that cannot work; the message is one line.
    ``setting`` names the one setting at fault when a single value is wrong (None when the
    fault is a combination of settings)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


_EKS_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_AZ = re.compile(r"^([a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d)[a-z]$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_NIXL_NETWORK_BACKENDS = ("LIBFABRIC", "UCX")
_DEFAULT_AZ_COUNT = 2
# Our context keys are snake_case; CDK's own (feature flags, aws:cdk:*) never are.
_OUR_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _hint(text: str) -> dict[str, Any]:
    return {"hint": text}


class DeploymentConfig(BaseModel):
    """Every setting of the deployment. Defaults reproduce the AWS reference walkthrough."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- cluster and network -------------------------------------------------------------
    cluster_name: str = Field(
        "ray-llm-multinode",
        description="EKS cluster name. Default: ray-llm-multinode.",
        json_schema_extra=_hint("1-100 letters, digits, '-' or '_', starting with a letter or digit"),
    )
    kubernetes_version: str = Field(
        versions.DEFAULT_KUBERNETES_VERSION,
        description="EKS Kubernetes version; the matching kubectl layer is chosen with it. Default: 1.35.",
        json_schema_extra=_hint(f"one of {', '.join(versions.KUBERNETES_RELEASES)}"),
    )
    region: str | None = Field(
        None,
        description="AWS region, when known at synth. Default: none (environment-agnostic stack).",
        json_schema_extra=_hint("a region name such as us-east-1"),
    )
    availability_zones: tuple[str, ...] | None = Field(
        None,
        description="AZs of the VPC (two or more). Default: the region's first two AZs.",
        json_schema_extra=_hint("two or more AZ names of one region, comma-separated"),
    )
    gpu_availability_zone: str | None = Field(
        None,
        description=(
            "AZ of the GPU node group (EFA does not cross AZs); must be one of availability_zones. "
            "Default: the VPC's first AZ."
        ),
        json_schema_extra=_hint("an AZ name listed in availability_zones, such as us-east-1a"),
    )
    nat_gateways: int = Field(
        1,
        ge=1,
        description="NAT gateways; one per AZ removes the single point of failure. Default: 1.",
        json_schema_extra=_hint("a whole number from 1 to the number of AZs"),
    )
    endpoint_allowed_cidrs: tuple[str, ...] = Field(
        ("0.0.0.0/0",),
        min_length=1,
        description="IPv4 CIDRs allowed to reach the public API endpoint. Default: 0.0.0.0/0 (warns).",
        json_schema_extra=_hint("IPv4 CIDRs such as 203.0.113.0/24, comma-separated"),
    )
    admin_role_arn: str | None = Field(
        None,
        description=(
            "IAM role granted cluster admin through an access entry. Default: the stack creates a "
            "cluster-admin role that principals of this account may assume (IAM decides who)."
        ),
        json_schema_extra=_hint("an IAM role ARN such as arn:aws:iam::123456789012:role/Admin"),
    )
    system_instance_type: str = Field(
        "m7i.xlarge",
        description="Instance type of the system node group (operator, Ray head). Default: m7i.xlarge.",
        json_schema_extra=_hint("a type with at least 4 vCPUs and 16 GiB, such as m7i.xlarge"),
    )
    system_node_count: int = Field(
        1,
        ge=1,
        le=10,
        description="Nodes in the system node group. Default: 1.",
        json_schema_extra=_hint("a whole number from 1 to 10"),
    )
    system_root_volume_gib: int = Field(
        100,
        ge=80,
        le=16384,
        description=(
            "gp3 root volume of each system node, GiB: the Ray head pulls the Ray LLM CUDA image "
            "(tens of GB, held packed and unpacked during the pull). Default: 100."
        ),
        json_schema_extra=_hint("a whole number of GiB from 80 to 16384"),
    )
    log_retention_days: int = Field(
        30,
        description=(
            "Retention of the log groups the stack owns (EKS control plane, Lambdas), days; "
            "they are deleted with the stack. Default: 30."
        ),
        json_schema_extra=_hint(f"one of CloudWatch's retention periods: {', '.join(map(str, LOG_RETENTION_DAYS))}"),
    )
    gpu_instance_type: str = Field(
        "g6.8xlarge",
        description="Instance type of the GPU node group; needs a GPU and EFA. Default: g6.8xlarge.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6.8xlarge"),
    )
    gpu_node_count: int = Field(
        2,
        ge=1,
        le=16,
        description="Nodes in the GPU node group (one Ray worker pod each). Default: 2.",
        json_schema_extra=_hint("a whole number from 1 to 16"),
    )
    gpu_root_volume_gib: int = Field(
        200,
        ge=100,
        le=16384,
        description="gp3 root volume of each GPU node, GiB (images and model cache). Default: 200.",
        json_schema_extra=_hint("a whole number of GiB from 100 to 16384"),
    )

    gpu_layout: Literal["shared", "per_phase"] = Field(
        "shared",
        description=(
            "shared: one GPU node group runs both phases (the walkthrough). per_phase: prefill and "
            "decode each get their own GPU node group and Ray worker group. Default: shared."
        ),
        json_schema_extra=_hint("shared or per_phase"),
    )
    prefill_gpu_instance_type: str | None = Field(
        None,
        description="per_phase only: instance type of the prefill node group. Default: gpu_instance_type.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6e.8xlarge"),
    )
    prefill_gpu_node_count: int | None = Field(
        None,
        ge=1,
        le=16,
        description="per_phase only: nodes in the prefill node group. Default: 1.",
        json_schema_extra=_hint("a whole number from 1 to 16"),
    )
    decode_gpu_instance_type: str | None = Field(
        None,
        description="per_phase only: instance type of the decode node group. Default: gpu_instance_type.",
        json_schema_extra=_hint("a GPU type with EFA, such as g6.8xlarge"),
    )
    decode_gpu_node_count: int | None = Field(
        None,
        ge=1,
        le=16,
        description="per_phase only: nodes in the decode node group. Default: 1.",
        json_schema_extra=_hint("a whole number from 1 to 16"),
    )

    # --- serving -------------------------------------------------------------------------
    namespace: str = Field(
        "inference",
        description="Kubernetes namespace of the RayService. Default: inference.",
        json_schema_extra=_hint("a DNS-1123 label: lowercase letters, digits and '-', at most 63"),
    )
    ray_service_name: str = Field(
        "ray-llm",
        description="Name of the RayService; the serve service is <name>-serve-svc. Default: ray-llm.",
        json_schema_extra=_hint("lowercase letters, digits and '-', starting with a letter, at most 40"),
    )
    image: str | None = Field(
        None,
        description="Ray image of head and workers. Default: the Ray LLM DLC in the stack's region.",
        json_schema_extra=_hint("an image reference without spaces"),
    )
    model_id: str = Field(
        "qwen3.5-9b",
        description="Model name clients send in requests. Default: qwen3.5-9b.",
        json_schema_extra=_hint("a name without spaces"),
    )
    model_source: str = Field(
        "Qwen/Qwen3.5-9B",
        description="Hugging Face repository (or path) of the weights. Default: Qwen/Qwen3.5-9B.",
        json_schema_extra=_hint("a Hugging Face repository such as Qwen/Qwen3.5-9B"),
    )
    max_model_len: int = Field(
        4096,
        ge=16,
        description="Longest prompt plus completion, tokens. Default: 4096.",
        json_schema_extra=_hint("a whole number of tokens, at least 16"),
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="Weight and activation dtype. Default: bfloat16.",
        json_schema_extra=_hint("one of auto, bfloat16, float16, float32"),
    )
    gpu_memory_utilization: float = Field(
        0.90,
        gt=0.0,
        le=0.98,
        description="Fraction of GPU memory vLLM may use. Default: 0.90.",
        json_schema_extra=_hint("a number above 0 and at most 0.98"),
    )
    prefill_enforce_eager: bool = Field(
        True,
        description="Disable CUDA graphs on prefill. Default: true.",
        json_schema_extra=_hint("true or false"),
    )
    decode_enforce_eager: bool = Field(
        True,
        description="Disable CUDA graphs on decode. Default: true.",
        json_schema_extra=_hint("true or false"),
    )
    prefill_replicas: int = Field(
        1,
        ge=1,
        description="Prefill engine replicas. Default: 1.",
        json_schema_extra=_hint("a whole number, at least 1"),
    )
    decode_replicas: int = Field(
        1,
        ge=1,
        description="Decode engine replicas. Default: 1.",
        json_schema_extra=_hint("a whole number, at least 1"),
    )
    prefill_tensor_parallel_size: int = Field(
        1,
        description="GPUs per prefill replica. Default: 1.",
        json_schema_extra=_hint("1, 2, 4 or 8"),
    )
    decode_tensor_parallel_size: int = Field(
        1,
        description="GPUs per decode replica. Default: 1.",
        json_schema_extra=_hint("1, 2, 4 or 8"),
    )
    kv_backend: str = Field(
        "LIBFABRIC",
        description="NIXL backend that moves the KV cache; LIBFABRIC uses EFA. Default: LIBFABRIC.",
        json_schema_extra=_hint(f"one of {', '.join(_NIXL_NETWORK_BACKENDS)}"),
    )
    ray_upgrade_strategy: Literal["None", "NewCluster"] = Field(
        "None",
        description=(
            "KubeRay upgradeStrategy. None: serve-config changes are applied to the running Ray "
            "cluster; cluster-config changes wait until the RayCluster is recreated (README, Updates). "
            "NewCluster: a second Ray cluster is built beside the first (needs spare GPU nodes). "
            "Default: None."
        ),
        json_schema_extra=_hint("None or NewCluster"),
    )
    kv_buffer_device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="Where NIXL stages KV blocks; cpu where GPUDirect RDMA is missing. Default: cuda.",
        json_schema_extra=_hint("cuda or cpu"),
    )

    # --- field rules -----------------------------------------------------------------------
    @field_validator("availability_zones", "endpoint_allowed_cidrs", mode="before")
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
        "image",
        "prefill_gpu_instance_type",
        "prefill_gpu_node_count",
        "decode_gpu_instance_type",
        "decode_gpu_node_count",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("cluster_name")
    @classmethod
    def _eks_name(cls, value: str) -> str:
        if not _EKS_NAME.match(value):
            raise ValueError("EKS rejects this cluster name")
        return value

    @field_validator("kubernetes_version")
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

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.match(value):
            raise ValueError("not a region name")
        return value

    @field_validator("availability_zones")
    @classmethod
    def _azs(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        bad = [az for az in value if not _AZ.match(az)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an AZ name")
        if len(value) < 2:
            raise ValueError("EKS needs subnets in at least two AZs")
        if len(set(value)) != len(value):
            raise ValueError("an AZ is listed twice")
        regions = {_az_region(az) for az in value}
        if len(regions) > 1:
            raise ValueError(f"AZs from more than one region ({', '.join(sorted(regions))})")
        return value

    @field_validator("gpu_availability_zone")
    @classmethod
    def _gpu_az(cls, value: str | None) -> str | None:
        if value is not None and not _AZ.match(value):
            raise ValueError("not an AZ name")
        return value

    @field_validator("endpoint_allowed_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                network = ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"{cidr!r} is not an IPv4 network in CIDR form") from None
            if network.version != 4:
                raise ValueError(f"{cidr!r} is IPv6; the EKS public endpoint allow-list is IPv4")
        if len(value) > 40:
            raise ValueError("EKS accepts at most 40 public access CIDRs")
        return value

    @field_validator("admin_role_arn")
    @classmethod
    def _role_arn(cls, value: str | None) -> str | None:
        if value is not None and not _ROLE_ARN.match(value):
            raise ValueError("not an IAM role ARN")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError("CloudWatch Logs does not offer this retention period")
        return value

    @field_validator("system_instance_type")
    @classmethod
    def _system_type(cls, value: str) -> str:
        facts = _known_instance(value)
        if facts.vcpus < 4 or facts.memory_gib < 16:
            raise ValueError(
                f"{facts.vcpus} vCPUs and {facts.memory_gib} GiB leave no room for the Ray head "
                "(2 vCPUs, 8 GiB) beside the operator"
            )
        return value

    @field_validator("gpu_instance_type", "prefill_gpu_instance_type", "decode_gpu_instance_type")
    @classmethod
    def _gpu_type(cls, value: str | None) -> str | None:
        if value is None:
            return None
        facts = _known_instance(value)
        if facts.gpus == 0:
            raise ValueError("this instance type has no GPU")
        if not facts.efa_supported:
            raise ValueError("this instance type does not support EFA, which carries the KV cache")
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if len(value) > 63 or not _DNS1123_LABEL.match(value):
            raise ValueError("Kubernetes rejects this namespace name")
        return value

    @field_validator("ray_service_name")
    @classmethod
    def _service_name(cls, value: str) -> str:
        # KubeRay derives Service names (<name>-serve-svc, <name>-head-svc) and a RayCluster
        # name with a suffix from it; Services must be DNS-1035 labels of at most 63 characters.
        if len(value) > 40 or not _DNS1035_LABEL.match(value):
            raise ValueError("Kubernetes would reject the Services KubeRay derives from this name")
        return value

    @field_validator("image", "model_id", "model_source")
    @classmethod
    def _no_spaces(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError("must be non-empty and without spaces")
        return value

    @field_validator("prefill_tensor_parallel_size", "decode_tensor_parallel_size")
    @classmethod
    def _tensor_parallel(cls, value: int) -> int:
        if value not in (1, 2, 4, 8):
            raise ValueError("vLLM splits attention heads evenly: 1, 2, 4 or 8 GPUs")
        return value

    @field_validator("kv_backend", mode="before")
    @classmethod
    def _kv_backend(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() in _NIXL_NETWORK_BACKENDS:
            return value.upper()
        raise ValueError("NIXL has no such network backend")

    # --- rules across settings (each names every setting involved) --------------------------
    @model_validator(mode="after")
    def _combinations(self) -> DeploymentConfig:
        azs = self.availability_zones
        if self.region and azs and _az_region(azs[0]) != self.region:
            raise ValueError(
                f"availability_zones={','.join(azs)!r} are not in region={self.region!r}. "
                f"Fix: list AZs of {self.region}"
            )
        if self.gpu_availability_zone:
            gpu_az = self.gpu_availability_zone
            if self.region and _az_region(gpu_az) != self.region:
                raise ValueError(
                    f"gpu_availability_zone={gpu_az!r} is not in region={self.region!r}. "
                    f"Fix: choose an AZ of {self.region}"
                )
            if not azs:
                raise ValueError(
                    f"gpu_availability_zone={gpu_az!r} needs availability_zones too. Fix: also set "
                    f"availability_zones to two or more AZs of {_az_region(gpu_az)} including {gpu_az}"
                )
            if gpu_az not in azs:
                raise ValueError(
                    f"gpu_availability_zone={gpu_az!r} is not one of availability_zones="
                    f"{','.join(azs)!r}. Fix: add it to availability_zones or pick one of them"
                )
        az_count = len(azs) if azs else _DEFAULT_AZ_COUNT
        if self.nat_gateways > az_count:
            raise ValueError(
                f"nat_gateways={self.nat_gateways} exceeds the {az_count} AZs of the VPC. "
                f"Fix: set nat_gateways from 1 to {az_count}"
            )
        self._check_gpus()
        self._check_model()
        return self

    def _check_gpus(self) -> None:
        per_phase_keys = ("prefill_gpu_instance_type", "prefill_gpu_node_count", "decode_gpu_instance_type",
                          "decode_gpu_node_count")  # fmt: skip
        if self.gpu_layout == "shared":
            for key in per_phase_keys:
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key}={getattr(self, key)!r} is only used with gpu_layout='per_phase'. "
                        f"Fix: set gpu_layout=per_phase, or remove {key}"
                    )
        for phase in ("prefill", "decode"):
            tp = getattr(self, f"{phase}_tensor_parallel_size")
            group = self.gpu_group(phase)
            per_node = group.instance.gpus
            if tp > per_node:
                raise ValueError(
                    f"{phase}_tensor_parallel_size={tp} exceeds the {per_node} GPU(s) of one "
                    f"{group.instance_type} (tensor parallelism stays inside a node). Fix: lower "
                    f"it to {per_node} or choose an instance type with more GPUs"
                )
        for group in self.gpu_groups:
            per_node = group.instance.gpus
            wanted = sum(self.gpus_for(phase) for phase in group.phases)
            have = per_node * group.node_count
            if wanted > have:
                asked = " + ".join(
                    f"{p}_replicas={getattr(self, f'{p}_replicas')} x {p}_tensor_parallel_size="
                    f"{getattr(self, f'{p}_tensor_parallel_size')}"
                    for p in group.phases
                )
                raise ValueError(
                    f"{asked} needs {wanted} GPUs, but {group.count_setting}={group.node_count} x "
                    f"{group.instance_type} has {have}. Fix: raise {group.count_setting} to "
                    f"{-(-wanted // per_node)} or lower replicas"
                )

    def _check_model(self) -> None:
        facts = self.model_facts
        if facts is None:
            return
        if facts.hybrid and self.prefill_tensor_parallel_size != self.decode_tensor_parallel_size:
            raise ValueError(
                f"prefill_tensor_parallel_size={self.prefill_tensor_parallel_size} and "
                f"decode_tensor_parallel_size={self.decode_tensor_parallel_size} differ, but "
                f"{self.model_source} is a hybrid model and NIXL needs the same size on both. "
                "Fix: set them equal"
            )
        if self.max_model_len > facts.max_model_len:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds {self.model_source}'s own maximum "
                f"of {facts.max_model_len}. Fix: set max_model_len to at most {facts.max_model_len}"
            )
        for phase in ("prefill", "decode"):
            sizing = self.sizing(phase)
            assert sizing is not None
            for problem in sizing.problems():
                raise ValueError(
                    f"max_model_len={self.max_model_len} with dtype={self.dtype}, gpu_memory_utilization="
                    f"{self.gpu_memory_utilization} and {phase}_tensor_parallel_size="
                    f"{getattr(self, f'{phase}_tensor_parallel_size')} on {self.gpu_group(phase).type_setting}="
                    f"{self.gpu_group(phase).instance_type}: {problem}. Fix: lower max_model_len, raise the "
                    "tensor-parallel size, or choose a GPU with more memory"
                )

    # --- derived facts -----------------------------------------------------------------------
    @property
    def model_facts(self) -> ModelFacts | None:
        return MODELS.get(self.model_source)

    def sizing(self, phase: str, facts: ModelFacts | None = None) -> Sizing | None:
        """Per-GPU memory estimate of one engine of ``phase``, for ``facts`` or the catalog's
        entry of the model; None for a model in neither."""
        facts = facts or self.model_facts
        if facts is None:
            return None
        return size(
            facts,
            self.gpu_group(phase).instance,
            dtype=self.dtype,
            tensor_parallel_size=getattr(self, f"{phase}_tensor_parallel_size"),
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len,
        )

    def gpus_for(self, phase: str) -> int:
        return int(getattr(self, f"{phase}_replicas")) * int(getattr(self, f"{phase}_tensor_parallel_size"))

    @property
    def gpus_wanted(self) -> int:
        return self.gpus_for("prefill") + self.gpus_for("decode")

    @property
    def gpu_groups(self) -> list[GpuGroup]:
        """The GPU node groups, each with its Ray worker group: one shared, or one per phase."""
        if self.gpu_layout == "shared":
            return [
                GpuGroup(
                    "gpu",
                    ("prefill", "decode"),
                    self.gpu_instance_type,
                    self.gpu_node_count,
                    "gpu_instance_type",
                    "gpu_node_count",
                )
            ]
        return [
            GpuGroup(
                phase,
                (phase,),
                getattr(self, f"{phase}_gpu_instance_type") or self.gpu_instance_type,
                getattr(self, f"{phase}_gpu_node_count") or 1,
                f"{phase}_gpu_instance_type" if getattr(self, f"{phase}_gpu_instance_type") else "gpu_instance_type",
                f"{phase}_gpu_node_count",
            )
            for phase in PHASES
        ]

    def gpu_group(self, phase: str) -> GpuGroup:
        return next(group for group in self.gpu_groups if phase in group.phases)

    @property
    def kubernetes_release(self) -> versions.KubernetesRelease:
        return versions.KUBERNETES_RELEASES[self.kubernetes_version]

    def warnings(self) -> list[str]:
        """Settings that work but that a reviewer should see."""
        found = []
        if "0.0.0.0/0" in self.endpoint_allowed_cidrs:
            found.append(
                "endpoint_allowed_cidrs includes 0.0.0.0/0: the Kubernetes API endpoint is open "
                "to the internet (authentication still applies). Set your own CIDRs."
            )
        if self.ray_upgrade_strategy == "NewCluster":
            found.append(
                "ray_upgrade_strategy=NewCluster: every cluster-config change builds a second Ray "
                "cluster, which needs as many spare GPU nodes as the first; with fixed node counts its "
                "workers stay Pending."
            )
        if self.kv_backend == "UCX":
            found.append(
                "kv_backend=UCX: NIXL moves the KV cache at TCP speed even on EFA. "
                "Use LIBFABRIC unless you are debugging."
            )
        return found

    # --- parsing ---------------------------------------------------------------------------
    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> DeploymentConfig:
        """Build from CDK context; every snake_case key must be a setting."""
        fields = cls.model_fields
        unknown = sorted(k for k in context if _OUR_KEY.match(k) and k not in fields)
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, fields, n=1)
            fix = f"did you mean {close[0]}?" if close else "remove it; settings are listed in the README"
            raise ConfigError(f"unknown setting {key}={context[key]!r}. Fix: {fix}")
        return cls.create(**{k: v for k, v in context.items() if k in fields})

    @classmethod
    def create(cls, **settings: Any) -> DeploymentConfig:
        """Validate ``settings``; raise ConfigError with one line on bad input."""
        try:
            return cls(**settings)
        except ValidationError as error:
            location = error.errors(include_url=False)[0]["loc"]
            raise ConfigError(_one_line(error, settings), str(location[0]) if location else None) from None


def _az_region(az: str) -> str:
    match = _AZ.match(az)
    return match.group(1) if match else az[:-1]


def _known_instance(value: str) -> InstanceFacts:
    if value not in INSTANCE_TYPES:
        close = difflib.get_close_matches(value, INSTANCE_TYPES, n=1)
        near = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"not in the instance catalog{near}; add it to catalog.py with its EC2 facts")
    return INSTANCE_TYPES[value]


def _one_line(error: ValidationError, settings: Mapping[str, Any]) -> str:
    """The first problem, as 'setting=value: what is wrong. Fix: ...'."""
    first = error.errors(include_url=False)[0]
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:  # a rule across settings: the message names them and the fix
        return message
    key = str(first["loc"][0])
    value = settings.get(key, first.get("input"))
    field = DeploymentConfig.model_fields.get(key)
    extra = field.json_schema_extra if field else None
    hint = extra.get("hint") if isinstance(extra, dict) else None
    fix = f". Fix: set {key} to {hint}" if hint else ""
    if key not in DeploymentConfig.model_fields:
        fix = ". Fix: remove it; settings are listed in the README"
    return f"{key}={value!r}: {message}{fix}"
