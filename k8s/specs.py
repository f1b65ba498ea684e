"""The RayService chart's typed props: plain frozen dataclasses, no cdk8s, no CloudFormation.
Both the chart (ray_service.py) and the serve config (serve_config.py) read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SERVE_PORT = 8000
DASHBOARD_PORT = 8265


@dataclass(frozen=True)
class ModelSpec:
    """What both engines serve."""

    model_id: str
    model_source: str
    max_model_len: int
    dtype: str
    gpu_memory_utilization: float
    # Text only: vLLM skips the vision tower (and its memory profiling) of a multimodal model.
    language_model_only: bool = False


@dataclass(frozen=True)
class EngineSpec:
    """One phase (prefill or decode)."""

    replicas: int
    tensor_parallel_size: int
    enforce_eager: bool
    # A Ray resource only this phase's worker group offers; pins its replicas there.
    placement_resource: str | None = None


@dataclass(frozen=True)
class KvTransferSpec:
    """How NIXL moves KV blocks from prefill to decode."""

    backend: str
    buffer_device: str


@dataclass(frozen=True)
class PodResources:
    """Requests equal limits, so pods are Guaranteed and never evicted for memory first."""

    cpu: int
    memory_gib: int
    gpus: int = 0
    efa_interfaces: int = 0
    # Memory-backed /dev/shm; Ray's object store is set to fit inside it (object_store_bytes).
    shm_gib: int = 0

    @property
    def object_store_bytes(self) -> int:
        """Ray's object store, set inside /dev/shm. Left to itself Ray 2.58 takes 30% of the pod's
        memory, capped by what /dev/shm holds at start but never below 10 GB, so a head with a
        container's 64 MiB /dev/shm puts its store in /tmp and warns. A tenth of /dev/shm stays
        free for NCCL and vLLM's shared-memory queues."""
        return self.shm_gib * 2**30 * 9 // 10

    def as_k8s(self) -> dict[str, dict[str, Any]]:
        amounts: dict[str, Any] = {"cpu": str(self.cpu), "memory": f"{self.memory_gib}Gi"}
        limits = dict(amounts)
        if self.gpus:
            limits["nvidia.com/gpu"] = self.gpus
        if self.efa_interfaces:
            limits["vpc.amazonaws.com/efa"] = self.efa_interfaces
        return {"requests": amounts, "limits": limits}


@dataclass(frozen=True)
class WorkerGroupSpec:
    """One Ray worker group: a pod per GPU node, pinned to its node group by labels."""

    name: str
    replicas: int
    resources: PodResources
    node_selector: dict[str, str]
    # Ray logical resources the group's pods advertise (KubeRay `resources`).
    ray_resources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RayServiceProps:
    name: str
    namespace: str
    image: str
    ray_version: str
    model: ModelSpec
    prefill: EngineSpec
    decode: EngineSpec
    kv: KvTransferSpec
    head: PodResources
    workers: tuple[WorkerGroupSpec, ...]
    hybrid_model: bool
    # Labels of the nodes the Ray head runs on (CPU only, beside the operator).
    system_node_selector: dict[str, str]
    # KubeRay upgradeStrategy.type: None (serve config in place) or NewCluster (blue/green).
    upgrade_strategy: str = "None"

    @property
    def serve_service_name(self) -> str:
        """The ClusterIP Service KubeRay creates in front of the serve app."""
        return f"{self.name}-serve-svc"
