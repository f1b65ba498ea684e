"""The one home of the GPU layout: which GPU node groups exist, and for each its construct ids,
node labels, Ray worker group and placement resource. Everything that needs them asks here;
node-label literals live only here.

``shared`` (the walkthrough): one group runs both phases. ``per_phase``: a group per phase, each
pinned by its own labels and a Ray resource only its workers offer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .capacity.checks import GroupNeed
from .catalog import INSTANCE_TYPES, InstanceFacts

PHASES = ("prefill", "decode")
# Nodes of the system group: the KubeRay operator and the Ray head run there.
SYSTEM_NODE_LABELS = {"role": "system"}
# Every GPU node group carries these; the device plugins select them.
GPU_NODE_LABELS = {"role": "gpu-worker"}
# per_phase groups add this label with the phase as value.
PHASE_LABEL = "phase"


@dataclass(frozen=True)
class GpuGroup:
    """One GPU managed node group and the Ray worker group pinned to it."""

    name: str  # "gpu" (shared), "prefill" or "decode"
    phases: tuple[str, ...]
    instance_type: str
    node_count: int
    type_setting: str  # the setting that chose the instance type, for error messages
    count_setting: str

    @property
    def instance(self) -> InstanceFacts:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def shared(self) -> bool:
        return len(self.phases) > 1

    @property
    def need(self) -> GroupNeed:
        """What the capacity check asks of this group."""
        return GroupNeed(self.name, self.instance_type, self.node_count)

    @property
    def _prefix(self) -> str:
        # Ids are part of the contract: the shared group keeps the walkthrough's plain names.
        return "" if self.shared else self.name.capitalize()

    @property
    def construct_id(self) -> str:
        """Id of the EfaGpuNodeGroup construct: GpuNodes, PrefillGpuNodes, DecodeGpuNodes."""
        return f"{self._prefix}GpuNodes"

    @property
    def nodegroup_id(self) -> str:
        """Id of the managed node group inside the cluster: GpuNodeGroup, PrefillGpuNodeGroup, ..."""
        return f"{self._prefix}GpuNodeGroup"

    @property
    def node_labels(self) -> dict[str, str]:
        return dict(GPU_NODE_LABELS) if self.shared else {**GPU_NODE_LABELS, PHASE_LABEL: self.name}

    @property
    def worker_group_name(self) -> str:
        return "gpu-workers" if self.shared else f"{self.name}-workers"

    @property
    def placement_resource(self) -> str | None:
        """The Ray resource that pins a phase to its own worker group (per_phase only)."""
        return None if self.shared else f"{self.name}_gpu"


def gpu_groups(
    gpu_layout: str,
    *,
    gpu: tuple[str, int],
    per_phase: Mapping[str, tuple[str | None, int | None]],
) -> list[GpuGroup]:
    """The groups of a layout: ``gpu`` is the shared (type, count), ``per_phase`` each phase's
    own (type or None for the shared type, count or None for one node)."""
    if gpu_layout == "shared":
        return [GpuGroup("gpu", PHASES, gpu[0], gpu[1], "gpu_instance_type", "gpu_node_count")]
    groups = []
    for phase in PHASES:
        instance_type, node_count = per_phase[phase]
        groups.append(
            GpuGroup(
                phase,
                (phase,),
                instance_type or gpu[0],
                node_count or 1,
                f"{phase}_gpu_instance_type" if instance_type else "gpu_instance_type",
                f"{phase}_gpu_node_count",
            )
        )
    return groups
