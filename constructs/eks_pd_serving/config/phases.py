"""One typed view of a phase's settings: the settings are flat (``prefill_replicas``,
``decode_replicas``, ...) because CDK context is; code asks ``phase_settings(config, "decode")``
instead of building attribute names from strings."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import Settings


@dataclass(frozen=True)
class PhaseSettings:
    phase: str
    replicas: int
    min_replicas: int | None
    max_replicas: int | None
    target_ongoing_requests: float | None
    tensor_parallel_size: int
    enforce_eager: bool
    max_num_seqs: int | None
    #: per_phase layout only (None: the shared group's).
    gpu_instance_type: str | None
    gpu_node_count: int | None
    gpu_min_node_count: int | None
    gpu_max_node_count: int | None


def phase_settings(settings: Settings, phase: str) -> PhaseSettings:
    """The settings of ``phase`` (``prefill`` or ``decode``)."""
    s = settings
    if phase == "prefill":
        return PhaseSettings(
            phase, s.prefill_replicas, s.prefill_min_replicas, s.prefill_max_replicas,
            s.prefill_target_ongoing_requests, s.prefill_tensor_parallel_size, s.prefill_enforce_eager,
            s.prefill_max_num_seqs,
            s.prefill_gpu_instance_type, s.prefill_gpu_node_count, s.prefill_gpu_min_node_count,
            s.prefill_gpu_max_node_count,
        )  # fmt: skip
    if phase == "decode":
        return PhaseSettings(
            phase, s.decode_replicas, s.decode_min_replicas, s.decode_max_replicas,
            s.decode_target_ongoing_requests, s.decode_tensor_parallel_size, s.decode_enforce_eager,
            s.decode_max_num_seqs,
            s.decode_gpu_instance_type, s.decode_gpu_node_count, s.decode_gpu_min_node_count,
            s.decode_gpu_max_node_count,
        )  # fmt: skip
    raise ValueError(f"unknown phase {phase!r}")
