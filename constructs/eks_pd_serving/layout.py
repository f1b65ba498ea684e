"""The one home of the GPU layout: which GPU node groups exist, and for each its construct ids,
node labels, Ray worker group and placement resource. Everything that needs them asks here;
node-label literals live only here.

``shared`` (the walkthrough): one group runs both phases. ``per_phase``: a group per phase, each
pinned by its own labels and a Ray resource only its workers offer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .capacity.checks import GroupNeed
from .catalog import INSTANCE_TYPES, InstanceFacts, gpu_slug
from .phase import PHASES, Phase

__all__ = ["PHASES", "Phase"]  # re-exported: the settings' layer asks here
# Nodes of the system group: the KubeRay operator and the Ray head run there.
SYSTEM_NODE_LABELS = {"role": "system"}
# The Ray head's CPU (requests = limits), on a system node: GCS, the dashboard, Serve's controller
# and proxy.
RAY_HEAD_CPU_M = 2000
# Nodes of a per_phase group when its count is not set.
DEFAULT_PHASE_NODE_COUNT = 1
# Every GPU node group carries these; the device plugins select them.
GPU_NODE_LABELS = {"role": "gpu-worker"}
# per_phase groups add this label with the phase as value.
PHASE_LABEL = "phase"
# The Cluster Autoscaler's GPU label on AWS: a node carrying it is not counted ready until its
# GPUs are advertised, so the device plugin's start does not look like missing capacity.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
# Node group tags the Cluster Autoscaler reads (eks:DescribeNodegroup) for what a node of an empty
# group would offer: without them it cannot know a zero-node group has EFA, and never scales it.
NODE_TEMPLATE_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


@dataclass(frozen=True)
class GpuGroup:
    """One GPU managed node group and the Ray worker group pinned to it."""

    name: str  # "gpu" (shared), "prefill" or "decode"
    phases: tuple[Phase, ...]
    instance_type: str
    node_count: int
    # With autoscaling: the node group's bounds (node_count is then the minimum, what the
    # deploy starts). None: fixed at node_count.
    node_bounds: tuple[int, int] | None = None

    @property
    def instance(self) -> InstanceFacts:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def shared(self) -> bool:
        return len(self.phases) > 1

    @property
    def autoscaled(self) -> bool:
        return self.node_bounds is not None

    @property
    def min_node_count(self) -> int:
        return self.node_bounds[0] if self.node_bounds else self.node_count

    @property
    def max_node_count(self) -> int:
        return self.node_bounds[1] if self.node_bounds else self.node_count

    @property
    def need(self) -> GroupNeed:
        """What the capacity check asks of this group: its most nodes, so that scaling up later
        does not fail on quota or on an AZ without the type."""
        return GroupNeed(self.name, self.instance_type, self.max_node_count)

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
        labels = dict(GPU_NODE_LABELS) if self.shared else {**GPU_NODE_LABELS, PHASE_LABEL: self.name}
        if self.autoscaled:
            # A label value: EC2's GPU name ("RTX PRO Server 6000") with its spaces as hyphens.
            labels[ACCELERATOR_LABEL] = "nvidia-" + gpu_slug(self.instance.gpu_name)
        return labels

    @property
    def node_template_tags(self) -> dict[str, str]:
        """The extended resources one node offers, as Cluster Autoscaler node-template tags."""
        if not self.autoscaled:
            return {}
        offered = {GPU_RESOURCE: self.instance.gpus, EFA_RESOURCE: self.instance.efa_interfaces}
        return {f"{NODE_TEMPLATE_RESOURCE_TAG}{name}": str(amount) for name, amount in offered.items()}

    @property
    def worker_node_selector(self) -> dict[str, str]:
        """The labels the Ray worker pods select: the group's own, not the autoscaler's."""
        return {k: v for k, v in self.node_labels.items() if k != ACCELERATOR_LABEL}

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
    per_phase: Mapping[Phase, tuple[str | None, int | None]],
    node_bounds: Mapping[str, tuple[int, int]] | None = None,
) -> list[GpuGroup]:
    """The groups of a layout: ``gpu`` is the shared (type, count), ``per_phase`` each phase's
    own (type or None for the shared type, count or None for one node); ``node_bounds`` maps a
    group name ("gpu", "prefill", "decode") to its (min, max) nodes when it autoscales."""
    bounds = node_bounds or {}
    if gpu_layout == "shared":
        count = bounds["gpu"][0] if "gpu" in bounds else gpu[1]
        return [GpuGroup("gpu", PHASES, gpu[0], count, bounds.get("gpu"))]
    groups = []
    for phase in PHASES:
        instance_type, node_count = per_phase[phase]
        groups.append(
            GpuGroup(
                phase,
                (phase,),
                instance_type or gpu[0],
                bounds[phase][0] if phase in bounds else node_count or DEFAULT_PHASE_NODE_COUNT,
                bounds.get(phase),
            )
        )
    return groups


# --- how a GPU group buys its capacity ----------------------------------------------------------
# ``gpu_capacity``, ``prefill_capacity``, ``decode_capacity``: ``on-demand``; ``spot`` (prefill
# only: decode holds the streams); ``odcr:<cr-id>`` or ``odcr-group:<resource group ARN>``, an
# On-Demand Capacity Reservation the launch template targets; ``capacity-block:<cr-id>``, an EC2
# Capacity Block for ML (node group capacity type CAPACITY_BLOCK, launch template market type
# ``capacity-block``), per AWS's EC2 and EKS guides. A reservation brings its own placement, so the
# stack's placement group is left out for the three reservation kinds; preflight checks its AZ,
# instance type, count and window.
CapacityKind = Literal["on-demand", "spot", "odcr", "odcr-group", "capacity-block"]
RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
GROUP_ARN = re.compile(r"^arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:\d{12}:group/[\w.-]{1,128}$")
CAPACITY_FORMS = "on-demand, spot, odcr:<cr-id>, odcr-group:<resource group ARN> or capacity-block:<cr-id>"


@dataclass(frozen=True)
class GpuCapacity:
    kind: CapacityKind = "on-demand"
    #: The reservation's id (odcr, capacity-block) or its resource group's ARN (odcr-group).
    target: str | None = None

    @property
    def reserved(self) -> bool:
        return self.kind in ("odcr", "odcr-group", "capacity-block")

    @property
    def reservation_id(self) -> str | None:
        return self.target if self.kind in ("odcr", "capacity-block") else None

    def __str__(self) -> str:
        return self.kind if self.target is None else f"{self.kind}:{self.target}"


ON_DEMAND = GpuCapacity()


def parse_capacity(text: str) -> GpuCapacity:
    """One of ``CAPACITY_FORMS``; ValueError naming them otherwise."""
    kind, _, target = text.strip().partition(":")
    if kind in ("on-demand", "spot") and not target:
        return GpuCapacity(kind)  # type: ignore[arg-type]
    if kind in ("odcr", "capacity-block") and RESERVATION_ID.match(target):
        return GpuCapacity(kind, target)  # type: ignore[arg-type]
    if kind == "odcr-group" and GROUP_ARN.match(target):
        return GpuCapacity("odcr-group", target)
    raise ValueError(f"not a capacity option: one of {CAPACITY_FORMS}")
