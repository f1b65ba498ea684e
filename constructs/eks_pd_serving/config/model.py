"""DeploymentConfig: the settings (settings.py) with their field rules (fields.py), checked
across settings (rules.py) once, when the model is built; the facts derived from them
(derived.py) as methods; the parsing of CDK context.

``DeploymentConfig.from_context`` reads the flat keys of ``cdk.json`` context (values from
``cdk synth -c key=value`` arrive as strings); an account-vending pipeline builds the same model
directly with typed values. Either way a bad value raises ``ConfigError`` whose message is one
line naming the setting, the value and the fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError, model_validator

from .. import layout, versions
from ..catalog import ModelFacts
from ..layout import GpuGroup
from ..phase import Phase
from ..sizing import Sizing, root_volume_needed_gib
from . import derived, rules
from .errors import ConfigError
from .fields import FieldRules
from .phases import PhaseSettings, phase_settings
from .served_models import ModelChoice
from .settings import Settings

# Our context keys are snake_case; CDK's own (feature flags, aws:cdk:*) never are.
_OUR_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


class DeploymentConfig(Settings, FieldRules):
    """Every setting of the deployment. Defaults reproduce the AWS reference walkthrough."""

    @model_validator(mode="after")
    def _combinations(self) -> DeploymentConfig:
        rules.check_all(self)
        return self

    # --- derived facts (config/derived.py) -------------------------------------------------
    @property
    def model_facts(self) -> ModelFacts | None:
        return derived.model_facts(self)

    @property
    def models(self) -> tuple[ModelChoice, ...]:
        """Every served model: the settings' own first, then ``served_models``' entries."""
        return derived.served_models(self)

    def facts_of(self, choice: ModelChoice) -> ModelFacts | None:
        return derived.facts_of(self, choice)

    def phase(self, phase: Phase) -> PhaseSettings:
        """The settings of one phase, typed."""
        return phase_settings(self, phase)

    def sizing(
        self,
        phase: Phase,
        facts: ModelFacts | None = None,
        *,
        quantization: str | None = None,
        enforce_eager: bool | None = None,
    ) -> Sizing | None:
        return derived.sizing(self, phase, facts, quantization=quantization, enforce_eager=enforce_eager)

    def replica_bounds(self, phase: Phase) -> tuple[int, int]:
        return derived.replica_bounds(self, phase)

    def target_ongoing_requests(self, phase: Phase) -> float:
        return derived.target_ongoing_requests(self, phase)

    def gpus_for(self, phase: Phase, bound: int = 0) -> int:
        return derived.gpus_for(self, phase, bound)

    @property
    def internal_endpoint(self) -> bool:
        """Whether the stack builds the internal NLB (``endpoint_exposure=internal``)."""
        return derived.internal_endpoint(self)

    @property
    def api_keys_on(self) -> bool:
        """Whether the endpoint checks API keys (``api_keys``, defaulted by the exposure)."""
        return derived.api_keys_on(self)

    @property
    def gpus_wanted(self) -> int:
        return sum(self.gpus_for(phase) for phase in layout.PHASES)

    @property
    def gpu_groups(self) -> list[GpuGroup]:
        return derived.gpu_groups(self)

    def gpu_group(self, phase: Phase) -> GpuGroup:
        return derived.gpu_group(self, phase)

    def capacity_of(self, group: GpuGroup) -> layout.GpuCapacity:
        """How ``group``'s nodes are bought (``gpu_capacity`` or its phase's setting)."""
        return derived.gpu_capacity(self, group)

    @property
    def kubernetes_release(self) -> versions.KubernetesRelease:
        return derived.kubernetes_release(self)

    def warnings(self) -> list[str]:
        """Settings that work but that a reviewer should see."""
        found = []
        for phase in layout.PHASES:
            sizing = self.sizing(phase)
            found += [f"{phase}: {warning}" for warning in (sizing.warnings() if sizing else [])]
        if "0.0.0.0/0" in self.endpoint_allowed_cidrs:
            found.append(
                "endpoint_allowed_cidrs includes 0.0.0.0/0: the Kubernetes API endpoint is open "
                "to the internet (authentication still applies). Set your own CIDRs."
            )
        if self.ray_upgrade_strategy == "NewCluster" and not self.autoscaling:
            found.append(
                "ray_upgrade_strategy=NewCluster: every cluster-config change builds a second Ray "
                "cluster, which needs as many spare GPU nodes as the first; with fixed GPU node counts "
                "its workers stay Pending and the update never completes."
            )
        for phase in layout.PHASES:
            if self.autoscaling and self.replica_bounds(phase)[0] == 0:
                found.append(
                    f"{phase}_min_replicas=0: after a quiet period the first request waits for a GPU node, the "
                    "image pull and the model load (minutes); clients with shorter timeouts fail."
                )
        if self.multimodal:
            found.append(
                "multimodal=true: vLLM 0.26's NIXL compatibility matrix lists multimodal models under PD as "
                "not yet verified upstream. Rehearse it (make rehearse-gpu) before serving."
            )
        facts = self.model_facts
        if facts is not None and self.gpu_root_volume_gib < (room := root_volume_needed_gib(facts, copies=2)):
            found.append(
                f"gpu_root_volume_gib={self.gpu_root_volume_gib} holds one checkpoint of {self.model_source}, not "
                "two: a model_revision change restarts the engines in their pods, which download the new revision "
                f"beside the old one, and kubelet evicts them (they then start afresh). Set gpu_root_volume_gib={room} "
                "to avoid it."
            )
        if self.kv_backend == "UCX":
            found.append(
                "kv_backend=UCX: NIXL moves the KV cache at TCP speed even on EFA. "
                "Use LIBFABRIC unless you are debugging."
            )
        if self.internal_endpoint and self.api_keys_on and not self.tls_certificate_arn:
            found.append(
                "endpoint_exposure=internal without tls_certificate_arn: API keys and prompts cross the VPC in plain "
                "text to the NLB's TCP listener. Set tls_certificate_arn (an ACM certificate in this region) to "
                "terminate TLS at the NLB."
            )
        if self.access_logs_bucket and self.internal_endpoint and not self.tls_certificate_arn:
            found.append(
                f"access_logs_bucket={self.access_logs_bucket!r} gets the weights bucket's logs only: an NLB writes "
                "access logs for TLS listeners alone, and without tls_certificate_arn it has a TCP one. Set "
                "tls_certificate_arn to log the endpoint's connections too."
            )
        for group in self.gpu_groups:
            capacity = self.capacity_of(group)
            if capacity.kind == "spot":
                found.append(
                    f"{derived.capacity_setting(self, group)}=spot has no on-demand floor: one spot interruption (two "
                    f"minutes' notice) can take every {group.name} node at once, and until EC2 has spot capacity again "
                    + (
                        "the other engine serves every request whole, at its capacity (pd_failover)."
                        if self.pd_failover
                        else f"requests wait in Serve's queue for a {group.name} replica (decode, on-demand, keeps its "
                        "streams)."
                    )
                )
            if capacity.kind == "capacity-block" and not self.alarm_email:
                found.append(
                    f"{derived.capacity_setting(self, group)} is a Capacity Block without alarm_email: the warning a "
                    "day before its end, and the scale-down an hour before it, reach only the function's log. Set "
                    "alarm_email=<address>."
                )
        if self.observability and not self.alarm_email:
            found.append(
                "no alarm_email: the alarms (KvPullFailed among them) change state in CloudWatch and notify nobody. "
                "Set alarm_email=<address> for an encrypted SNS topic with an email subscription."
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
            fix = (
                f"did you mean {close[0]}?" if close else "remove it; settings are listed in docs/reference/settings.md"
            )
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
        fix = ". Fix: remove it; settings are listed in docs/reference/settings.md"
    if key in _SECRET_SETTINGS:  # never echo what may be a credential into a terminal or CI log
        return f"{key}=<hidden>: {message}{fix}"
    return f"{key}={value!r}: {message}{fix}"


# Settings whose values are echoed as <hidden> in errors.
_SECRET_SETTINGS = frozenset({"hf_token_secret", "api_keys_secret_arn"})
