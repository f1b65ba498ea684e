"""One typed view of a phase's settings: the settings are flat (``prefill_replicas``,
``decode_replicas``, ...) because CDK context is; code asks ``phase_settings(config, Phase.DECODE)``
instead of building attribute names from strings: that happens once, here."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..phase import Phase
from .settings import Settings


@dataclass(frozen=True)
class PhaseSettings:
    phase: Phase
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


def phase_settings(settings: Settings, phase: Phase) -> PhaseSettings:
    """The settings of ``phase``: each field is the setting ``<phase>_<field>``, the one place such
    a name is built (a test holds the names and types). ``Phase(text)`` refuses any other text."""
    phase = Phase(phase)
    names = [field.name for field in fields(PhaseSettings) if field.name != "phase"]
    return PhaseSettings(phase, **{name: getattr(settings, f"{phase}_{name}") for name in names})
