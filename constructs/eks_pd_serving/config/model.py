"""DeploymentConfig: the settings (settings.py) with their field rules (fields.py), checked
across settings (rules.py) once, when the model is built; then the facts derived from them and
the parsing of CDK context.

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
from ..catalog import MODELS, ModelFacts
from ..layout import GpuGroup
from ..sizing import Sizing, size
from . import rules
from .errors import ConfigError
from .fields import FieldRules
from .settings import Settings

# Autoscaling defaults (settings.py documents them): one replica of each phase always warm, a
# second when load asks for it.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 2
# Prefill requests last one forward pass of the prompt; decode streams last the whole answer and
# a replica holds many (the default L4 engine fits 11.7 full-length sequences).
DEFAULT_TARGET_ONGOING_REQUESTS = {"prefill": 4, "decode": 8}

# Our context keys are snake_case; CDK's own (feature flags, aws:cdk:*) never are.
_OUR_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


class DeploymentConfig(Settings, FieldRules):
    """Every setting of the deployment. Defaults reproduce the AWS reference walkthrough."""

    @model_validator(mode="after")
    def _combinations(self) -> DeploymentConfig:
        rules.check_all(self)
        return self

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
            multimodal=self.multimodal,
        )

    def replica_bounds(self, phase: str) -> tuple[int, int]:
        """(fewest, most) replicas of ``phase``: the min/max settings with autoscaling (defaults
        1 and 2), else the fixed count twice."""
        if not self.autoscaling:
            fixed = int(getattr(self, f"{phase}_replicas"))
            return fixed, fixed
        low = getattr(self, f"{phase}_min_replicas")
        high = getattr(self, f"{phase}_max_replicas")
        return (DEFAULT_MIN_REPLICAS if low is None else low), (DEFAULT_MAX_REPLICAS if high is None else high)

    def target_ongoing_requests(self, phase: str) -> float:
        chosen = getattr(self, f"{phase}_target_ongoing_requests")
        return float(DEFAULT_TARGET_ONGOING_REQUESTS[phase] if chosen is None else chosen)

    def gpus_for(self, phase: str, bound: int = 0) -> int:
        """GPUs ``phase`` takes at its fewest (``bound=0``) or most (``bound=1``) replicas; the
        same without autoscaling."""
        return self.replica_bounds(phase)[bound] * int(getattr(self, f"{phase}_tensor_parallel_size"))

    @property
    def gpus_wanted(self) -> int:
        return self.gpus_for("prefill") + self.gpus_for("decode")

    @property
    def gpu_groups(self) -> list[GpuGroup]:
        """The GPU node groups, each with its Ray worker group: one shared, or one per phase."""
        return layout.gpu_groups(
            self.gpu_layout,
            gpu=(self.gpu_instance_type, self.gpu_node_count),
            per_phase={
                phase: (getattr(self, f"{phase}_gpu_instance_type"), getattr(self, f"{phase}_gpu_node_count"))
                for phase in layout.PHASES
            },
            node_bounds=self._node_bounds() if self.autoscaling else None,
        )

    def _node_bounds(self) -> dict[str, tuple[int, int]]:
        """Each group's (min, max) nodes: the settings, or what the phases' replicas need."""
        fixed = layout.gpu_groups(
            self.gpu_layout,
            gpu=(self.gpu_instance_type, self.gpu_node_count),
            per_phase={phase: (getattr(self, f"{phase}_gpu_instance_type"), None) for phase in layout.PHASES},
        )
        bounds = {}
        for group in fixed:
            per_node = group.instance.gpus
            needed = [-(-sum(self.gpus_for(p, bound) for p in group.phases) // per_node) for bound in (0, 1)]
            low_setting, high_setting = group.bound_settings
            low, high = getattr(self, low_setting), getattr(self, high_setting)
            bounds[group.name] = (needed[0] if low is None else low, max(needed[1], 1) if high is None else high)
        return bounds

    def gpu_group(self, phase: str) -> GpuGroup:
        return next(group for group in self.gpu_groups if phase in group.phases)

    @property
    def kubernetes_release(self) -> versions.KubernetesRelease:
        return versions.KUBERNETES_RELEASES[self.kubernetes_version]

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
