"""GPU accounting over every served model: the GPUs each phase's replicas ask (replicas, or the most
an autoscaled phase may run, times its tensor-parallel size) against what the worker groups they are
placed on hold (their pods, or the most an autoscaled group may run, times each pod's GPUs). The
settings' rules count the settings' models (``model_source`` and ``served_models``) and name the
setting to change; this checks the typed props, so a model added as a value is counted too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..phase import PHASES, Phase
from .specs import RayServiceProps, ServedModel, WorkerGroupSpec


@dataclass(frozen=True)
class PhaseDemand:
    model: str
    phase: Phase
    replicas: int
    tensor_parallel_size: int
    #: The Ray resource that pins it to a group; None: any GPU group.
    placement_resource: str | None

    @property
    def gpus(self) -> int:
        return self.replicas * self.tensor_parallel_size

    def line(self) -> str:
        return f"{self.model} {self.phase} {self.replicas} x tp {self.tensor_parallel_size}"


def demands(models: Sequence[ServedModel]) -> list[PhaseDemand]:
    found = []
    for served in models:
        for phase in PHASES:
            engine = served.engine(phase)
            found.append(
                PhaseDemand(
                    served.model.model_id,
                    phase,
                    engine.most_replicas,
                    engine.tensor_parallel_size,
                    engine.placement_resource,
                )
            )
    return found


def group_gpus(group: WorkerGroupSpec) -> int:
    pods = group.replica_bounds[1] if group.replica_bounds else group.replicas
    return pods * group.resources.gpus


def shortfall(props: RayServiceProps) -> str | None:
    """One line naming the models' phases, the GPUs they need and the groups that hold fewer, with
    the fix; None when every pool fits (each pinned resource's groups, then all GPU groups together)."""
    wanted = demands(props.models)
    gpu_groups = [g for g in props.workers if g.resources.gpus]
    pools: list[tuple[str, list[PhaseDemand], list[WorkerGroupSpec]]] = []
    for resource in sorted({d.placement_resource for d in wanted if d.placement_resource}):
        held = [g for g in gpu_groups if resource in g.ray_resources]
        pools.append((f"Ray resource {resource}", [d for d in wanted if d.placement_resource == resource], held))
    pools.append(("the GPU worker groups", wanted, gpu_groups))
    for where, asked, held in pools:
        need, have = sum(d.gpus for d in asked), sum(group_gpus(g) for g in held)
        if need > have:
            groups = ", ".join(f"{g.name} {group_gpus(g)}" for g in held) or "none"
            return (
                f"RayServiceProps.models: {' + '.join(d.line() for d in asked)} needs {need} GPUs on {where}, "
                f"which hold {have} ({groups}). Fix: give the groups more nodes (gpu_node_count, or the phase's "
                f"own node count) or serve fewer replicas"
            )
    return None
