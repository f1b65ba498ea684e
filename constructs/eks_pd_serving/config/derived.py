"""Facts derived from the settings: the model's catalogue entry, per-phase sizing, replica and
node bounds, the GPU groups. Functions of ``Settings`` (not methods of the validated model), so
the cross-setting rules can use them while the model is being validated, without an import cycle;
``DeploymentConfig`` offers each as a method."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .. import layout, versions
from ..capacity.checks import ReservedGroup
from ..catalog import MODELS, ModelFacts, facts_from_config
from ..layout import GpuGroup
from ..phase import Phase
from ..sizing import Sizing, size
from .phases import phase_settings
from .served_models import ModelChoice
from .settings import DEFAULT_MAX_REPLICAS, DEFAULT_MIN_REPLICAS, DEFAULT_TARGET_ONGOING_REQUESTS, Settings


def model_facts(s: Settings) -> ModelFacts | None:
    """The catalogue's entry for the model, else what its config.json (``model_config_json``)
    says; None when neither exists (the rules refuse that)."""
    if s.model_config_json:
        return _facts_from_file(s.model_config_json)
    return MODELS.get(s.model_source)


def served_models(s: Settings) -> tuple[ModelChoice, ...]:
    """Every served model, the settings' own first (``model_id``, ``model_source``,
    ``model_revision``), then ``served_models``' entries in their order."""
    first = ModelChoice(s.model_id, s.model_source, s.model_revision)
    return (first, *(ModelChoice.parse(entry) for entry in s.served_models))


def facts_of(s: Settings, choice: ModelChoice) -> ModelFacts | None:
    """A served model's facts: the first model's as ``model_facts`` finds them (``model_config_json``
    may describe it), any other's from the catalogue; None outside it (the rules refuse that)."""
    if choice == served_models(s)[0]:
        return model_facts(s)
    return MODELS.get(choice.repository)


@functools.lru_cache(maxsize=16)
def _facts_from_file(path: str) -> ModelFacts:
    try:
        return facts_from_config(json.loads(Path(path).read_text()))
    except OSError as error:
        raise ValueError(
            f"model_config_json={path!r} cannot be read ({error.strerror}). Fix: give the path of the model's "
            "config.json, relative to where synth runs"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"model_config_json={path!r} is not a model config.json sizing can read ({type(error).__name__}: "
            f"{error}). Fix: use the config.json of the model's Hugging Face repository"
        ) from None


def internal_endpoint(s: Settings) -> bool:
    """Whether the stack builds the internal NLB (``endpoint_exposure=internal``): the one place
    that compares the exposure's name."""
    return s.endpoint_exposure == "internal"


def api_keys_on(s: Settings) -> bool:
    """``api_keys``, or its default: on with the internal NLB, off with port-forward only."""
    return internal_endpoint(s) if s.api_keys is None else s.api_keys


def replica_bounds(s: Settings, phase: Phase) -> tuple[int, int]:
    """(fewest, most) replicas of ``phase``: the min/max settings with autoscaling (defaults
    1 and 2), else the fixed count twice."""
    p = phase_settings(s, phase)
    if not s.autoscaling:
        return p.replicas, p.replicas
    low = DEFAULT_MIN_REPLICAS if p.min_replicas is None else p.min_replicas
    return low, DEFAULT_MAX_REPLICAS if p.max_replicas is None else p.max_replicas


def target_ongoing_requests(s: Settings, phase: Phase) -> float:
    chosen = phase_settings(s, phase).target_ongoing_requests
    return float(DEFAULT_TARGET_ONGOING_REQUESTS[phase] if chosen is None else chosen)


def gpus_for(s: Settings, phase: Phase, bound: int = 0) -> int:
    """GPUs the ``phase`` engines of every served model take at their fewest (``bound=0``) or most
    (``bound=1``) replicas; the same without autoscaling. Each model has the phase's replicas and
    tensor-parallel size."""
    each = replica_bounds(s, phase)[bound] * phase_settings(s, phase).tensor_parallel_size
    return each * len(served_models(s))


def _groups(s: Settings, with_counts: bool) -> list[GpuGroup]:
    phases = {p: phase_settings(s, p) for p in layout.PHASES}
    return layout.gpu_groups(
        s.gpu_layout,
        gpu=(s.gpu_instance_type, s.gpu_node_count),
        per_phase={p: (v.gpu_instance_type, v.gpu_node_count if with_counts else None) for p, v in phases.items()},
        node_bounds=_node_bounds(s) if with_counts and s.autoscaling else None,
    )


def _node_bounds(s: Settings) -> dict[str, tuple[int, int]]:
    """Each group's (min, max) nodes: the settings, or what the phases' replicas need."""
    bounds = {}
    for group in _groups(s, with_counts=False):
        per_node = group.instance.gpus
        needed = [-(-sum(gpus_for(s, p, bound) for p in group.phases) // per_node) for bound in (0, 1)]
        if group.shared:
            low, high = s.gpu_min_node_count, s.gpu_max_node_count
        else:
            p = phase_settings(s, group.phases[0])
            low, high = p.gpu_min_node_count, p.gpu_max_node_count
        bounds[group.name] = (needed[0] if low is None else low, max(needed[1], 1) if high is None else high)
    return bounds


def gpu_groups(s: Settings) -> list[GpuGroup]:
    """The GPU node groups, each with its Ray worker group: one shared, or one per phase."""
    return _groups(s, with_counts=True)


def gpu_group(s: Settings, phase: Phase) -> GpuGroup:
    return next(group for group in gpu_groups(s) if phase in group.phases)


def _phase_capacity(s: Settings, group: GpuGroup) -> str | None:
    """A per_phase group's own capacity setting, None where it defaults to ``gpu_capacity``."""
    if group.shared:
        return None
    return s.prefill_capacity if group.phases == (Phase.PREFILL,) else s.decode_capacity


def capacity_setting(s: Settings, group: GpuGroup) -> str:
    """The setting that chose a group's capacity (error messages name it)."""
    return "gpu_capacity" if _phase_capacity(s, group) is None else f"{group.name}_capacity"


def gpu_capacity(s: Settings, group: GpuGroup) -> layout.GpuCapacity:
    """How a group's nodes are bought: its phase's setting (per_phase), else ``gpu_capacity``."""
    return layout.parse_capacity(_phase_capacity(s, group) or s.gpu_capacity)


def reserved_groups(s: Settings) -> list[ReservedGroup]:
    """The GPU groups bought from a reservation, as the capacity checks read them (preflight, and
    the deploy-time check's properties)."""
    found = []
    for group in gpu_groups(s):
        capacity = gpu_capacity(s, group)
        if capacity.reserved and capacity.target is not None:
            found.append(
                ReservedGroup(
                    name=group.name,
                    instance_type=group.instance_type,
                    max_nodes=group.max_node_count,
                    kind=capacity.kind,
                    target=capacity.target,
                    setting=capacity_setting(s, group),
                )
            )
    return found


def type_setting(s: Settings, group: GpuGroup) -> str:
    """The setting that chose a group's instance type (error messages name it)."""
    if group.shared or phase_settings(s, group.phases[0]).gpu_instance_type is None:
        return "gpu_instance_type"
    return f"{group.name}_gpu_instance_type"


def count_setting(group: GpuGroup) -> str:
    """The setting of a group's fixed node count."""
    return "gpu_node_count" if group.shared else f"{group.name}_gpu_node_count"


def bound_settings(group: GpuGroup) -> tuple[str, str]:
    """The settings of a group's min and max node counts."""
    prefix = "gpu" if group.shared else f"{group.name}_gpu"
    return f"{prefix}_min_node_count", f"{prefix}_max_node_count"


def sizing(
    s: Settings,
    phase: Phase,
    facts: ModelFacts | None = None,
    *,
    quantization: str | None = None,
    enforce_eager: bool | None = None,
) -> Sizing | None:
    """Per-GPU memory estimate of one engine of ``phase``, for ``facts`` or the catalog's entry of
    the model; None for a model in neither. ``quantization`` and ``enforce_eager`` replace the
    configured ones (``sizing --what-if``'s other rows). Each engine is sized once a synth: the
    validation, the mapping and the summary ask the same question and get the same answer."""
    facts = facts or model_facts(s)
    if facts is None:
        return None
    p = phase_settings(s, phase)
    return _sized(
        s,
        facts,
        phase,
        s.quantization if quantization is None else quantization,
        p.enforce_eager if enforce_eager is None else enforce_eager,
    )


@functools.lru_cache(maxsize=64)
def _sized(s: Settings, facts: ModelFacts, phase: Phase, quantization: str, enforce_eager: bool) -> Sizing:
    p = phase_settings(s, phase)
    return size(
        facts,
        gpu_group(s, phase).instance,
        dtype=s.dtype,
        tensor_parallel_size=p.tensor_parallel_size,
        gpu_memory_utilization=s.gpu_memory_utilization,
        max_model_len=s.max_model_len,
        multimodal=s.multimodal,
        quantization=quantization,
        enforce_eager=enforce_eager,
        max_num_seqs=p.max_num_seqs,
    )


def kubernetes_release(s: Settings) -> versions.KubernetesRelease:
    return versions.KUBERNETES_RELEASES[s.kubernetes_version]


# What a request body of max_model_len tokens can be as JSON: each token of at most this many
# characters (a bound, not read from the tokenizer: the ingress's character bound, which is, refuses
# long prompts far below it), each character at most 6 bytes (a "\uXXXX" escape), plus 1 MiB for
# the request's other fields.
BODY_TOKEN_CHARS = 256
JSON_BYTES_PER_CHAR = 6
BODY_ALLOWANCE_BYTES = 2**20


def body_bytes_needed(max_model_len: int) -> int:
    return max_model_len * BODY_TOKEN_CHARS * JSON_BYTES_PER_CHAR + BODY_ALLOWANCE_BYTES


def request_body_mib(config: Settings) -> int:
    """``max_request_body_mib``, or what max_model_len needs rounded up to a power of two (at least
    16): a max_model_len change within a power of two leaves every proxy's bound, and the pods, alone."""
    if config.max_request_body_mib is not None:
        return config.max_request_body_mib
    needed = -(-body_bytes_needed(config.max_model_len) // 2**20)
    return max(16, 1 << (needed - 1).bit_length())
