"""The one place that maps the settings (``DeploymentConfig``) to what the constructs take: the
region and image resolved once, the cluster's props, the endpoint's network (the serve port's
CIDRs, the NLB's props), and the RayService chart's typed props (pod sizes, worker groups,
engines, KV transfer), and every other construct's settings as one frozen ``DeploymentPlan``.
The constructs and the chart know nothing of the settings; ``PdServing`` composes and orders
what this returns and reads no setting itself (a packaging test holds that)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Aws, Token
from aws_cdk import aws_ec2 as ec2

from . import k8s, rollout, versions
from .capacity.checks import GroupNeed, ReservedGroup
from .catalog import HYBRID, InstanceFacts, ModelFacts
from .cluster import EksClusterProps
from .config import ConfigError, DeploymentConfig, derived
from .config.served_models import FIRST_APP_PREFIX, ModelChoice, app_prefixes
from .endpoint import proxy
from .fault_tolerance import auth, failover, kv_guard
from .fault_tolerance.failover import upstream as failover_upstream
from .layout import RAY_HEAD_CPU_M, SYSTEM_NODE_LABELS, GpuCapacity, GpuGroup
from .phase import Phase
from .sizing import IMAGE_DISK_GIB, MAX_NUM_BATCHED_TOKENS, largest_checkpoint_bytes
from .weights import node_cache
from .weights.model_weights import Removal


@dataclasses.dataclass(frozen=True)
class NetworkPlan:
    """``Network``'s settings (a brought VPC is passed beside them)."""

    availability_zones: tuple[str, ...] | None
    nat_gateways: int
    gpu_availability_zone: str | None


@dataclasses.dataclass(frozen=True)
class GpuNodeGroupPlan:
    """One ``EfaGpuNodeGroup``: its group, root volume, how its nodes are bought and what nodeadm
    sets up (parallel image pull, the instance store as the node cache's disk)."""

    group: GpuGroup
    root_volume_gib: int
    capacity: GpuCapacity
    fast_image_pull: bool
    local_storage: bool


@dataclasses.dataclass(frozen=True)
class WeightsPlan:
    """``ModelWeights``' settings; ``access_logs``: (bucket name, prefix) or None; ``more``: the
    other served models' (model id, repository, revision), staged beside the first."""

    model_source: str
    revision: str
    hf_token_secret: str | None
    removal: Removal
    access_logs: tuple[str, str] | None
    more: tuple[tuple[str, str, str], ...] = ()
    #: The GPU workers share their compile caches under the bucket's ``compile/`` (``shares_compile_caches``).
    share_compile_caches: bool = False


@dataclasses.dataclass(frozen=True)
class GcsStorePlan:
    """``GcsStore``'s sizing."""

    node_type: str
    replicas: int


@dataclasses.dataclass(frozen=True)
class ObservabilityPlan:
    """``CloudWatchObservability`` and ``ServingDashboard``'s settings."""

    addon_version: str
    alarm_email: str | None
    api_keys: bool


@dataclasses.dataclass(frozen=True)
class PodIdentityPlan:
    """The Ray pods' namespace and service accounts, which EKS Pod Identity associates."""

    namespace: str
    worker_service_account: str
    head_service_account: str


@dataclasses.dataclass(frozen=True)
class DeploymentPlan:
    """Every construct's settings, read once from ``DeploymentConfig``. None: the feature is off."""

    cluster_name: str
    region: str
    stack_region_setting: str | None
    warnings: tuple[str, ...]
    log_retention_days: int
    network: NetworkPlan
    capacity_needs: tuple[GroupNeed, ...]
    #: The groups bought from a reservation (the deploy-time check reads each).
    reservations: tuple[ReservedGroup, ...]
    cluster: EksClusterProps
    gpu_node_groups: tuple[GpuNodeGroupPlan, ...]
    autoscaler_kubernetes_version: str | None
    weights: WeightsPlan | None
    api_keys: bool
    api_keys_secret_arn: str | None
    gcs_store: GcsStorePlan | None
    identities: PodIdentityPlan
    observability: ObservabilityPlan | None
    image: str
    converge: bool
    #: How long the rollout Job waits for a rebuilt cluster (``rollout_deadline_s``).
    rollout_deadline_s: int
    #: How long the serve rollout waits for one Serve application to serve again (``rollout.step_s``).
    serve_step_s: int

    @property
    def capacity_blocks(self) -> tuple[ReservedGroup, ...]:
        """The Capacity Block groups: each is scaled to zero before its block ends."""
        return tuple(group for group in self.reservations if group.block)


def plan(config: DeploymentConfig, *, brought_vpc: bool = False) -> DeploymentPlan:
    """The settings of every construct ``PdServing`` builds, the region resolved once.
    ``brought_vpc``: the VPC is the caller's (its routes decide how S3 is reached)."""
    resolved_region = region(config)
    return DeploymentPlan(
        cluster_name=config.cluster_name,
        region=resolved_region,
        stack_region_setting=config.region,
        warnings=tuple(warnings(config, brought_vpc=brought_vpc)),
        log_retention_days=config.log_retention_days,
        network=NetworkPlan(
            availability_zones=config.availability_zones,
            nat_gateways=config.nat_gateways,
            gpu_availability_zone=config.gpu_availability_zone,
        ),
        capacity_needs=tuple(group.need for group in config.gpu_groups),
        reservations=tuple(derived.reserved_groups(config)),
        cluster=cluster_props(config),
        gpu_node_groups=tuple(
            GpuNodeGroupPlan(
                group=group,
                root_volume_gib=config.gpu_root_volume_gib,
                capacity=config.capacity_of(group),
                fast_image_pull=config.fast_image_pull,
                local_storage=config.node_cache,
            )
            for group in config.gpu_groups
        ),
        autoscaler_kubernetes_version=config.kubernetes_version if config.autoscaling else None,
        weights=WeightsPlan(
            model_source=config.model_source,
            revision=config.model_revision,
            hf_token_secret=config.hf_token_secret,
            removal=config.model_bucket_removal,
            access_logs=(config.access_logs_bucket, access_logs_prefix(config, "s3"))
            if config.access_logs_bucket
            else None,
            more=tuple((m.model_id, m.repository, m.revision) for m in config.models[1:]),
            share_compile_caches=shares_compile_caches(config),
        )
        if config.weights_source == "s3"
        else None,
        api_keys=config.api_keys_on,
        api_keys_secret_arn=config.api_keys_secret_arn,
        gcs_store=GcsStorePlan(node_type=config.gcs_store_node_type, replicas=config.gcs_store_replicas)
        if config.gcs_fault_tolerance
        else None,
        identities=PodIdentityPlan(
            namespace=config.namespace,
            worker_service_account=worker_service_account(config),
            head_service_account=head_service_account(config),
        ),
        observability=ObservabilityPlan(
            addon_version=config.cloudwatch_addon_version,
            alarm_email=config.alarm_email,
            api_keys=config.api_keys_on,
        )
        if config.observability
        else None,
        image=config.image or versions.ray_image_uri(resolved_region),
        converge=converges(config),
        rollout_deadline_s=rollout_deadline_s(config),
        serve_step_s=rollout.step_s(largest_checkpoint_bytes([config.facts_of(m) for m in config.models])),
    )


def warnings(config: DeploymentConfig, *, brought_vpc: bool) -> list[str]:
    """The settings' synth warnings, and those of the settings with a brought VPC."""
    found = config.warnings()
    if brought_vpc and config.weights_source == "s3":
        found.append(
            "weights_source=s3 with a brought VPC: the engines read the weights from S3 over the VPC's own routes; "
            "without an S3 gateway endpoint on its private route tables every engine start crosses its NAT. "
            "Add one (aws ec2 create-vpc-endpoint --vpc-endpoint-type Gateway "
            "--service-name com.amazonaws.<region>.s3)."
        )
    return found


@dataclasses.dataclass(frozen=True)
class EndpointPlan:
    """What the exposure makes of the network: the CIDRs the serve port's NetworkPolicy admits
    besides the cluster's pods (the NLB's subnets; none with port-forward), and the internal NLB
    Service's props (None with port-forward)."""

    policy_cidrs: tuple[str, ...]
    service: k8s.EndpointServiceProps | None


def endpoint_plan(
    config: DeploymentConfig,
    *,
    service_name: str,
    namespace: str,
    private_subnets: Sequence[ec2.ISubnet],
    vpc_cidr: str | None,
) -> EndpointPlan:
    """The endpoint's network from the settings and the VPC's private subnets. The NLB's IP targets
    see the NLB's own addresses (client IP preservation is off for IP targets), which lie in the
    subnets it is placed in: the serve port admits those subnets; the NLB's security group admits
    the client CIDRs (``endpoint_client_cidrs``, else the VPC's)."""
    if not config.internal_endpoint:
        return EndpointPlan(policy_cidrs=(), service=None)
    policy_cidrs = tuple(dict.fromkeys(_subnet_cidr(subnet) for subnet in private_subnets))
    if not config.endpoint_client_cidrs and vpc_cidr is None:
        raise ConfigError(
            "endpoint_exposure='internal' without endpoint_client_cidrs needs the brought VPC's IPv4 CIDR "
            "at synth (the NLB admits the VPC by default). Fix: set endpoint_client_cidrs, or import the "
            "VPC with ec2.Vpc.from_lookup, or give vpc_cidr_block to ec2.Vpc.from_vpc_attributes"
        )
    return EndpointPlan(
        policy_cidrs=policy_cidrs,
        service=k8s.EndpointServiceProps(
            name=service_name,
            namespace=namespace,
            subnet_ids=tuple(subnet.subnet_id for subnet in private_subnets),
            client_cidrs=config.endpoint_client_cidrs or (str(vpc_cidr),),
            tls_certificate_arn=config.tls_certificate_arn,
            access_logs=(
                (config.access_logs_bucket, access_logs_prefix(config, "nlb"))
                if config.access_logs_bucket and config.tls_certificate_arn
                else None
            ),
        ),
    )


def _subnet_cidr(subnet: ec2.ISubnet) -> str:
    """A private subnet's IPv4 CIDR as a literal (the serve port's NetworkPolicy names it)."""
    try:
        cidr = subnet.ipv4_cidr_block
    except RuntimeError:  # imported by attributes without CIDRs
        cidr = None
    if cidr is None or Token.is_unresolved(cidr):
        raise ConfigError(
            f"endpoint_exposure='internal' needs the IPv4 CIDR of private subnet {subnet.subnet_id} at synth (the "
            "serve port's NetworkPolicy admits the NLB's subnets). Fix: import the VPC with ec2.Vpc.from_lookup, "
            "or give private_subnet_ipv4_cidr_blocks to ec2.Vpc.from_vpc_attributes"
        )
    return cidr


def access_logs_prefix(config: DeploymentConfig, source: str) -> str:
    """Where ``source`` (``s3``: the weights bucket, ``nlb``: the endpoint) logs in
    ``access_logs_bucket``: one folder per cluster (its name is unique in the account and region).
    S3 appends the object key to the prefix (so it ends with "/"); an NLB appends "/AWSLogs/..."."""
    return f"{config.cluster_name}/{source}/" if source == "s3" else f"{config.cluster_name}/{source}"


def converges(config: DeploymentConfig) -> bool:
    """Whether the deploy brings the running Ray cluster onto each new cluster config itself."""
    return config.ray_upgrade_strategy == "recreate"


def rollout_deadline_s(config: DeploymentConfig) -> int:
    """The rollout Job's deadline: the engines' start, an image pull and the largest served model's
    read (``rollout.deadline_s``; the catalogue's checkpoint size, else an unknown model's): every
    model's engines start at once on their own GPUs, so the slowest read bounds the wait."""
    largest = largest_checkpoint_bytes([config.facts_of(m) for m in config.models])
    return rollout.deadline_s(largest, IMAGE_DISK_GIB)


def region(config: DeploymentConfig) -> str:
    """The region setting, or the stack's region token (an environment-agnostic stack)."""
    return config.region or Aws.REGION


def cluster_props(config: DeploymentConfig) -> EksClusterProps:
    """The cluster's props take the same-named settings: the mapping cannot drop or misroute one."""
    return EksClusterProps(**{f.name: getattr(config, f.name) for f in dataclasses.fields(EksClusterProps)})


# Left on each node for the kubelet, the system reserve and the daemon sets (CNI, kube-proxy,
# device plugins, pod identity agent).
_NODE_RESERVED_VCPUS = 4
_NODE_MEMORY_FRACTION = 0.8
_MAX_SHM_GIB = 32
HEAD = k8s.PodResources(cpu=RAY_HEAD_CPU_M // 1000, memory_gib=8, shm_gib=2)


def worker_resources(instance: InstanceFacts) -> k8s.PodResources:
    """One Ray worker pod takes a whole GPU node: every GPU and EFA interface, most CPU and
    memory. The large memory limit lets the page cache keep the checkpoint across restarts."""
    memory_gib = int(instance.memory_gib * _NODE_MEMORY_FRACTION)
    return k8s.PodResources(
        cpu=instance.vcpus - _NODE_RESERVED_VCPUS,
        memory_gib=memory_gib,
        gpus=instance.gpus,
        efa_interfaces=instance.efa_interfaces,
        shm_gib=min(_MAX_SHM_GIB, memory_gib // 4),
    )


def worker_group(group: GpuGroup) -> k8s.WorkerGroupSpec:
    resource = group.placement_resource
    return k8s.WorkerGroupSpec(
        name=group.worker_group_name,
        replicas=group.node_count,
        resources=worker_resources(group.instance),
        node_selector=group.worker_node_selector,
        ray_resources={resource: str(group.instance.gpus)} if resource else {},
        replica_bounds=group.node_bounds,
    )


def _engine(config: DeploymentConfig, phase: Phase, facts: ModelFacts | None) -> k8s.EngineSpec:
    """``phase``'s engine of the model of ``facts``, sized for it (its own max_num_seqs)."""
    low, high = config.replica_bounds(phase)
    settings = config.phase(phase)
    sizing = config.sizing(phase, facts)
    return k8s.EngineSpec(
        replicas=settings.replicas,
        tensor_parallel_size=settings.tensor_parallel_size,
        enforce_eager=settings.enforce_eager,
        # A model outside the catalogue has no sizing: only what was set.
        max_num_seqs=sizing.max_num_seqs if sizing else settings.max_num_seqs,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        quantization=None if config.quantization == "none" else config.quantization,
        placement_resource=config.gpu_group(phase).placement_resource,
        autoscaling=k8s.ReplicaAutoscaling(low, high, config.target_ongoing_requests(phase))
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


def kv_guard_spec(config: DeploymentConfig) -> k8s.KvGuardSpec | None:
    if config.kv_pull_guard == "off":
        return None
    return k8s.KvGuardSpec(
        mode=config.kv_pull_guard,
        engine_cls=kv_guard.engine_cls(),
        engine_cls_env=kv_guard.ENGINE_CLS_ENV,
        mode_env=kv_guard.mode_env(),
    )


def failover_spec(config: DeploymentConfig) -> k8s.FailoverSpec | None:
    if not config.pd_failover:
        return None
    return k8s.FailoverSpec(
        import_paths=failover.import_paths(),
        covered=failover_upstream.COVERED,
        wait_s=config.failover_wait_s,
        prefill_timeout_s=config.failover_prefill_timeout_s,
        short_prompt_tokens=config.short_prompt_tokens,
    )


# Pod annotations holding the digests of the code the pods run: new code is a RayCluster change
# on purpose (the proxies and the init container read it once, at start).
API_KEYS_CODE = "eks-pd-serving/api-keys-code"
GCS_AUTH_CODE = "eks-pd-serving/gcs-auth-code"
KV_GUARD_CODE = "eks-pd-serving/kv-guard-code"
FAILOVER_CODE = "eks-pd-serving/failover-code"
NODE_CACHE_CODE = "eks-pd-serving/node-cache-code"
GCS_AUTH_CONTAINER = "gcs-auth"


def max_body_bytes(config: DeploymentConfig) -> int:
    """Every Serve proxy's bound on a request body (``k8s.RayServiceProps.max_body_bytes``): the
    setting, or max_model_len's need rounded up to a power of two (``derived.request_body_mib``), so most
    max_model_len changes restart no pod (the proxies read the bound from their env, in the pod template)."""
    return derived.request_body_mib(config) * 2**20


def api_keys_hook(config: DeploymentConfig) -> k8s.ProxyHook:
    """The proxy checks' code and names, shipped in every configuration: the body's bound is always
    on, the keys when ``api_keys`` (the ConfigMap stays when keys go off)."""
    return k8s.ProxyHook(
        program=_pod_program(f"{config.ray_service_name}-api-keys-code", proxy, API_KEYS_CODE),
        callback_env=proxy.CALLBACK_ENV,
        callback=proxy.CALLBACK,
        secret_env=proxy.SECRET_ENV,
        refresh_env=proxy.REFRESH_ENV,
        max_stale_env=proxy.MAX_STALE_ENV,
        max_body_env=proxy.MAX_BODY_ENV,
    )


def gcs_auth() -> k8s.InitProgram:
    return k8s.InitProgram(
        container=GCS_AUTH_CONTAINER,
        source=auth.source(),
        digest=auth.source_digest(),
        annotation=GCS_AUTH_CODE,
        volume=auth.VOLUME,
        mount_path=auth.MOUNT_PATH,
        env_file=auth.ENV_FILE,
        key=auth.KEY,
        secret_env=auth.SECRET_ENV,
        file_env=auth.FILE_ENV,
    )


def kv_guard_program(config: DeploymentConfig) -> k8s.PodProgram:
    """The guard's code, shipped in every configuration (``k8s.RayServiceProps.kv_guard_program``)."""
    return _pod_program(f"{config.ray_service_name}-kv-guard-code", kv_guard, KV_GUARD_CODE)


def node_cache_program(config: DeploymentConfig) -> k8s.PodProgram:
    """The node cache's code, shipped in every configuration (``k8s.RayServiceProps.node_cache_program``)."""
    return _pod_program(f"{config.ray_service_name}-node-cache-code", node_cache, NODE_CACHE_CODE)


def node_cache_spec(config: DeploymentConfig, image: str) -> k8s.NodeCacheSpec | None:
    """The node cache on the GPU workers (``node_cache``)."""
    if not config.node_cache:
        return None
    return k8s.NodeCacheSpec(
        host_path=node_cache.HOST_PATH,
        mount_path=node_cache.CACHE_PATH,
        compile_key=node_cache.compile_key(image),
        fill_callback=node_cache.callback_class(),
        compile_prefix=f"{node_cache.COMPILE_PREFIX}/{node_cache.compile_key(image)}"
        if shares_compile_caches(config)
        else None,
    )


def shares_compile_caches(config: DeploymentConfig) -> bool:
    """The GPU nodes share their compile caches through the weights bucket (``shared_compile_cache``,
    which needs the node cache and the bucket)."""
    return config.shared_compile_cache and config.node_cache and config.weights_source == "s3"


def failover_program(config: DeploymentConfig) -> k8s.PodProgram:
    """The failover's code, shipped in every configuration (``k8s.RayServiceProps.failover_program``):
    turning failover on or off is then a serve-config change alone."""
    return _pod_program(f"{config.ray_service_name}-failover-code", failover, FAILOVER_CODE)


def _pod_program(config_map: str, code: Any, annotation: str) -> k8s.PodProgram:
    """``code``: a pod program's package (``endpoint.proxy``, ``fault_tolerance.kv_guard``): its
    ``FILE_NAME``, ``MOUNT_PATH``, ``source()`` and ``source_digest()``."""
    return k8s.PodProgram(
        config_map=config_map,
        file_name=code.FILE_NAME,
        source=code.source(),
        digest=code.source_digest(),
        mount_path=code.MOUNT_PATH,
        annotation=annotation,
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


def api_keys_spec(config: DeploymentConfig, secret_arn: str | None) -> k8s.ApiKeysSpec | None:
    if secret_arn is None:
        return None
    return k8s.ApiKeysSpec(
        secret_arn=secret_arn, refresh_s=config.api_keys_refresh_s, max_stale_s=config.api_keys_max_stale_s
    )


def served_model(config: DeploymentConfig, weights_uri: str | None = None) -> k8s.ServedModel:
    """The settings' first served model (``model_id``, ``model_source``): what both engines load
    (``weights_uri``: the staged revision, ``s3://bucket/prefix``, else the Hugging Face repository
    at ``model_revision``), each phase's engine and replicas, the KV transfer and the failover. Where
    the engines read the weights (the node cache's folder, the staged copy, the Hub) is derived from
    ``k8s.Weights`` when rendered."""
    return _served(config, config.models[0], weights_uri, FIRST_APP_PREFIX)


def served_models(
    config: DeploymentConfig, staged_uris: Mapping[str, str] | None = None
) -> tuple[k8s.ServedModel, ...]:
    """Every served model (``config.models``: the settings' own, then ``served_models``), each from
    its staged copy where ``staged_uris`` (model id to ``s3://bucket/prefix``) names one, else from
    the Hub at its revision. The first keeps the applications' prefix ``pd``; each other model's
    is its id (``ModelChoice.app_prefix``)."""
    uris = staged_uris or {}
    return tuple(
        _served(config, choice, uris.get(choice.model_id), prefix)
        for choice, prefix in zip(config.models, app_prefixes(config.models), strict=True)
    )


def _served(config: DeploymentConfig, choice: ModelChoice, weights_uri: str | None, prefix: str) -> k8s.ServedModel:
    facts = config.facts_of(choice)
    return k8s.ServedModel(
        name=prefix,
        model=k8s.ModelSpec(
            model_id=choice.model_id,
            weights=k8s.Weights(choice.repository, choice.revision, staged_uri=weights_uri or ""),
            max_model_len=config.max_model_len,
            dtype=config.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            language_model_only=not config.multimodal,
            trust_request_chat_template=config.trust_request_chat_template,
        ),
        prefill=_engine(config, Phase.PREFILL, facts),
        decode=_engine(config, Phase.DECODE, facts),
        kv=k8s.KvTransferSpec(
            backend=config.kv_backend,
            buffer_device=config.kv_buffer_device,
            load_failure_policy=kv_load_failure_policy(facts),
        ),
        failover=failover_spec(config),
    )


def with_staged_weights(
    models: Sequence[k8s.ServedModel], staged: Sequence[k8s.Weights]
) -> tuple[k8s.ServedModel, ...]:
    """``models`` with the stack's staged copies (``staged``: the settings' models as staged) given
    to each model whose weights are one's repository and revision and name no copy of their own."""
    copies = {weights.words: weights for weights in staged if weights.staged_uri}
    return tuple(
        dataclasses.replace(served, model=dataclasses.replace(served.model, weights=copies[served.model.weights.words]))
        if served.model.weights.words in copies and not served.model.weights.staged_uri
        else served
        for served in models
    )


def ray_service_props(
    config: DeploymentConfig,
    image: str,
    weights_uri: str | None = None,
    api_keys_secret_arn: str | None = None,
    gcs_fault_tolerance: k8s.GcsFaultToleranceSpec | None = None,
    staged_uris: Mapping[str, str] | None = None,
) -> k8s.RayServiceProps:
    """``weights_uri``: the first model's staged revision (``s3://bucket/prefix``), which both
    engines load from the node cache's copy of it (through Ray Serve LLM's S3 mirror without the
    node cache); None: the Hugging Face repository itself. ``staged_uris``: the other served
    models' staged revisions by model id (``served_models``).
    ``api_keys_secret_arn``: the key secret every Serve proxy reads; None: no key check.
    ``gcs_fault_tolerance``: the GCS store's address and token secret; None: no head fault tolerance."""
    facts = config.model_facts
    api_keys = api_keys_spec(config, api_keys_secret_arn)
    aws_calls = bool(weights_uri or api_keys)
    return k8s.RayServiceProps(
        name=config.ray_service_name,
        namespace=config.namespace,
        image=image,
        ray_version=versions.RAY_VERSION,
        models=served_models(
            config, {**(staged_uris or {}), **({config.model_id: weights_uri} if weights_uri else {})}
        ),
        head=HEAD,
        workers=tuple(worker_group(group) for group in config.gpu_groups),
        hybrid_model=bool(facts and facts.hybrid),
        system_node_selector=dict(SYSTEM_NODE_LABELS),
        # KubeRay's None under recreate too: the rollout Job rebuilds the cluster (ray_service.py).
        upgrade_strategy="NewCluster" if config.ray_upgrade_strategy == "NewCluster" else "None",
        autoscaler=k8s.RayAutoscalerSpec() if config.autoscaling else None,
        head_service_account=head_service_account(config),
        worker_service_account=worker_service_account(config),
        aws_region=region(config) if aws_calls else None,
        api_keys=api_keys,
        max_body_bytes=max_body_bytes(config),
        worker_privileged=config.gpu_worker_privileged,
        kv_guard_program=kv_guard_program(config),
        kv_guard=kv_guard_spec(config),
        failover_program=failover_program(config),
        node_cache=node_cache_spec(config, image),
        node_cache_program=node_cache_program(config),
        api_keys_hook=api_keys_hook(config),
        gcs_auth=gcs_auth() if gcs_fault_tolerance else None,
        gcs_fault_tolerance=gcs_fault_tolerance,
    )
