"""The one place that maps the settings (``DeploymentConfig``) to what the constructs take: the
region and image resolved once, the cluster's props, and the RayService chart's typed props (pod
sizes, worker groups, engines, KV transfer). The constructs and the chart know nothing of the
settings; ``PdServing`` only composes and orders what this returns."""

from __future__ import annotations

import dataclasses
from typing import Any

from aws_cdk import Aws

from . import versions
from .catalog import HYBRID, InstanceFacts, ModelFacts
from .cluster import EksClusterProps
from .config import DeploymentConfig
from .fault_tolerance import kv_guard
from .k8s import (
    ApiKeysSpec,
    EngineSpec,
    GcsFaultToleranceSpec,
    KvGuardSpec,
    KvTransferSpec,
    ModelSpec,
    PodProgram,
    PodResources,
    RayAutoscalerSpec,
    RayServiceProps,
    ReplicaAutoscaling,
    WorkerGroupSpec,
)
from .layout import RAY_HEAD_CPU_M, SYSTEM_NODE_LABELS, GpuGroup
from .sizing import MAX_NUM_BATCHED_TOKENS


def region(config: DeploymentConfig) -> str:
    """The region setting, or the stack's region token (an environment-agnostic stack)."""
    return config.region or Aws.REGION


def image(config: DeploymentConfig) -> str:
    """The Ray image of head and workers: the setting, or the Ray LLM DLC in the stack's region."""
    return config.image or versions.ray_image_uri(region(config))


def cluster_props(config: DeploymentConfig) -> EksClusterProps:
    """The cluster's props take the same-named settings: the mapping cannot drop or misroute one."""
    return EksClusterProps(**{f.name: getattr(config, f.name) for f in dataclasses.fields(EksClusterProps)})


# Left on each node for the kubelet, the system reserve and the daemon sets (CNI, kube-proxy,
# device plugins, pod identity agent).
_NODE_RESERVED_VCPUS = 4
_NODE_MEMORY_FRACTION = 0.8
_MAX_SHM_GIB = 32
HEAD = PodResources(cpu=RAY_HEAD_CPU_M // 1000, memory_gib=8, shm_gib=2)


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


def worker_group(group: GpuGroup) -> WorkerGroupSpec:
    resource = group.placement_resource
    return WorkerGroupSpec(
        name=group.worker_group_name,
        replicas=group.node_count,
        resources=worker_resources(group.instance),
        node_selector=group.worker_node_selector,
        ray_resources={resource: str(group.instance.gpus)} if resource else {},
        replica_bounds=group.node_bounds,
    )


def _engine(config: DeploymentConfig, phase: str) -> EngineSpec:
    low, high = config.replica_bounds(phase)
    settings = config.phase(phase)
    sizing = config.sizing(phase)
    return EngineSpec(
        replicas=settings.replicas,
        tensor_parallel_size=settings.tensor_parallel_size,
        enforce_eager=settings.enforce_eager,
        # A model outside the catalogue has no sizing: only what was set.
        max_num_seqs=sizing.max_num_seqs if sizing else settings.max_num_seqs,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        quantization=None if config.quantization == "none" else config.quantization,
        placement_resource=config.gpu_group(phase).placement_resource,
        autoscaling=ReplicaAutoscaling(low, high, config.target_ongoing_requests(phase))
        if config.autoscaling
        else None,
    )


def kv_load_failure_policy(facts: ModelFacts | None) -> str:
    """What decode does with KV it could not pull from prefill (a prefill replica scaled down,
    killed or unreachable mid-transfer). ``recompute`` finishes the request, slower, but vLLM
    0.26.0's rollback of a failed load is wrong on its V2 model runner (vllm-project/vllm#49250,
    open: the request continues from stale state), and 0.26.0 runs V2 for every dense model
    (``VllmConfig._is_default_v2_model_runner_model``: not hybrid, not attention-free, and not MoE
    outside a short allowlist). Hybrid models always run V1, where recompute is the old default.
    So: ``recompute`` for hybrid models, ``fail`` otherwise (the request ends with HTTP 500 or an
    error chunk, which a client retries, instead of a wrong answer)."""
    return "recompute" if facts is not None and facts.architecture == HYBRID else "fail"


def kv_guard_spec(config: DeploymentConfig) -> KvGuardSpec | None:
    if config.kv_pull_guard == "off":
        return None
    return KvGuardSpec(
        mode=config.kv_pull_guard,
        engine_cls=kv_guard.engine_cls(),
        engine_cls_env=kv_guard.ENGINE_CLS_ENV,
        mode_env=kv_guard.mode_env(),
    )


def kv_guard_program(config: DeploymentConfig) -> PodProgram:
    """The guard's code, shipped in every configuration (``RayServiceProps.kv_guard_program``)."""
    return PodProgram(
        config_map=f"{config.ray_service_name}-kv-guard-code",
        file_name=kv_guard.FILE_NAME,
        source=kv_guard.source(),
        digest=kv_guard.source_digest(),
        mount_path=kv_guard.MOUNT_PATH,
        annotation="eks-pd-serving/kv-guard-code",
    )


def worker_service_account(config: DeploymentConfig) -> str:
    """The Ray workers' service account, which EKS Pod Identity lets read the staged weights
    (weights_source=s3) and the API key secret (api_keys). In every configuration, so a setting
    that flips never removes it from the manifest (kubectl's prune keeps ServiceAccounts)."""
    return f"{config.ray_service_name}-workers"


def head_service_account(config: DeploymentConfig) -> str:
    """The Ray head's service account, which EKS Pod Identity lets read the API key secret (its
    Serve proxy checks keys too) and the GCS store's token (its init container); in every
    configuration, as the workers'."""
    return f"{config.ray_service_name}-head"


def api_keys_spec(config: DeploymentConfig, secret_arn: str | None) -> ApiKeysSpec | None:
    if secret_arn is None:
        return None
    return ApiKeysSpec(
        secret_arn=secret_arn, refresh_s=config.api_keys_refresh_s, max_stale_s=config.api_keys_max_stale_s
    )


def gcs_store_props(config: DeploymentConfig) -> dict[str, Any]:
    """The GCS store's sizing (fault_tolerance.GcsStore takes the same-named keywords)."""
    return {"node_type": config.gcs_store_node_type, "replicas": config.gcs_store_replicas}


def ray_service_props(
    config: DeploymentConfig,
    image: str,
    weights_uri: str | None = None,
    api_keys_secret_arn: str | None = None,
    gcs_fault_tolerance: GcsFaultToleranceSpec | None = None,
) -> RayServiceProps:
    """``weights_uri``: the staged revision (``s3://bucket/prefix``), which both engines load
    through Ray Serve LLM's S3 mirror; None: the Hugging Face repository itself.
    ``api_keys_secret_arn``: the key secret every Serve proxy reads; None: no key check.
    ``gcs_fault_tolerance``: the GCS store's address and token secret; None: no head fault tolerance."""
    facts = config.model_facts
    api_keys = api_keys_spec(config, api_keys_secret_arn)
    aws_calls = bool(weights_uri or api_keys)
    return RayServiceProps(
        name=config.ray_service_name,
        namespace=config.namespace,
        image=image,
        ray_version=versions.RAY_VERSION,
        model=ModelSpec(
            model_id=config.model_id,
            model_source=weights_uri or config.model_source,
            max_model_len=config.max_model_len,
            dtype=config.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            language_model_only=not config.multimodal,
        ),
        prefill=_engine(config, "prefill"),
        decode=_engine(config, "decode"),
        kv=KvTransferSpec(
            backend=config.kv_backend,
            buffer_device=config.kv_buffer_device,
            load_failure_policy=kv_load_failure_policy(facts),
        ),
        head=HEAD,
        workers=tuple(worker_group(group) for group in config.gpu_groups),
        hybrid_model=bool(facts and facts.hybrid),
        system_node_selector=dict(SYSTEM_NODE_LABELS),
        upgrade_strategy=config.ray_upgrade_strategy,
        autoscaler=RayAutoscalerSpec() if config.autoscaling else None,
        head_service_account=head_service_account(config),
        worker_service_account=worker_service_account(config),
        aws_region=region(config) if aws_calls else None,
        api_keys=api_keys,
        kv_guard_program=kv_guard_program(config),
        kv_guard=kv_guard_spec(config),
        gcs_fault_tolerance=gcs_fault_tolerance,
    )
