"""Turns the deployment config into the RayService chart's props (pod sizes included)."""

from __future__ import annotations

from ..catalog import InstanceFacts
from ..config import DeploymentConfig
from ..k8s import EngineSpec, KvTransferSpec, ModelSpec, PodResources, RayServiceProps
from ..versions import RAY_VERSION

# Left on each node for the kubelet, the system reserve and the daemon sets (CNI, kube-proxy,
# device plugins, pod identity agent).
_NODE_RESERVED_VCPUS = 4
_NODE_MEMORY_FRACTION = 0.8
_MAX_SHM_GIB = 32
HEAD = PodResources(cpu=2, memory_gib=8)


def worker_resources(instance: InstanceFacts) -> PodResources:
    """One Ray worker pod takes a whole GPU node: every GPU and EFA interface, most CPU and
    memory. The large memory limit lets the page cache keep the checkpoint across restarts."""
    memory_gib = int(instance.memory_gib * _NODE_MEMORY_FRACTION)
    return PodResources(
        cpu=instance.vcpus - _NODE_RESERVED_VCPUS,
        memory_gib=memory_gib,
        gpus=instance.gpus,
        efa_interfaces=instance.efa_interfaces,
        shm_gib=min(_MAX_SHM_GIB, memory_gib // 4),
    )


def ray_service_props(config: DeploymentConfig, image: str) -> RayServiceProps:
    facts = config.model_facts
    return RayServiceProps(
        name=config.ray_service_name,
        namespace=config.namespace,
        image=image,
        ray_version=RAY_VERSION,
        model=ModelSpec(
            model_id=config.model_id,
            model_source=config.model_source,
            max_model_len=config.max_model_len,
            dtype=config.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
        ),
        prefill=EngineSpec(
            replicas=config.prefill_replicas,
            tensor_parallel_size=config.prefill_tensor_parallel_size,
            enforce_eager=config.prefill_enforce_eager,
        ),
        decode=EngineSpec(
            replicas=config.decode_replicas,
            tensor_parallel_size=config.decode_tensor_parallel_size,
            enforce_eager=config.decode_enforce_eager,
        ),
        kv=KvTransferSpec(backend=config.kv_backend, buffer_device=config.kv_buffer_device),
        head=HEAD,
        worker=worker_resources(config.gpu_instance),
        worker_replicas=config.gpu_node_count,
        hybrid_model=bool(facts and facts.hybrid),
    )
